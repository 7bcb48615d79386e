//! Generated packing routines against the plain definition of a panel, on both
//! ISA paths: every width a family uses (and a few more), rows from 1 to the
//! width, depths around the vector width, strided sources, and canaries on both
//! sides of the panel and around the source rows' ends; for every element type
//! the target has (bf16 words checked bit for bit against round-to-nearest-even,
//! with depths missing from the last pair zero; u8s8 words as the low bytes of
//! integral values, four depths to a word; i16 words as their low 16 bits, two
//! to a word); the same over rows given by
//! address (a convolution's taps), null rows read as zeros.

use anyshape_codegen::compile_packers;
use kernels::{ElemType, Target};
use proptest::prelude::*;

fn targets() -> Vec<(&'static str, Target)> {
    let host = Target::detect();
    if !kernels::testing::require("ANYSHAPE_REQUIRE_AVX2", host.supported(), "AVX2 + FMA") {
        return Vec::new();
    }
    let mut v = vec![("host", host.clone())];
    if host.isa.avx512f {
        v.extend(host.avx2_only().map(|t| ("avx2", t)));
    }
    v
}

const CANARY: f32 = -7777.0;
const CANARY_WORD: u32 = 0xdead_beef;
const WIDTHS: [usize; 14] = [1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 16, 32, 48, 64];

/// The panel word of row `i`'s depths `k..k + g` (zero past `kc`), by definition.
fn word(elem: ElemType, src: &[f32], at: usize, left: usize) -> u32 {
    match elem {
        ElemType::F32 => src[at].to_bits(),
        ElemType::Bf16 | ElemType::F16 | ElemType::I16 | ElemType::I16S8 => {
            let hi = if left > 1 { u32::from(elem.half_bits(src[at + 1])) } else { 0 };
            u32::from(elem.half_bits(src[at])) | hi << 16
        }
        // The low byte of each integral value, depths low first.
        ElemType::U8S8 => {
            (0..left.min(4)).map(|j| (src[at + j] as i32 as u32 & 0xff) << (8 * j)).fold(0, |a, b| a | b)
        }
    }
}

/// A source value: varied magnitudes and signs, most not representable in bf16
/// (so rounding is exercised, ties included), and now and then a denormal; for
/// the integer types an integer of either byte's range (-128..=255), the only
/// values they pack.
fn value(elem: ElemType, x: usize) -> f32 {
    if elem.is_integer() {
        return ((x * 7919) % 384) as f32 - 128.0;
    }
    if x % 97 == 13 {
        return f32::from_bits(1 + x as u32);
    }
    let v = ((x * 7919) % 2001) as f32 - 1000.0;
    if x.is_multiple_of(3) {
        v + 0.5
    } else {
        v * 0.001_234_5
    }
}

/// Pack with `w`'s routine and compare with the word of `src[i·ld + g·k ..]` at
/// `dst[k·w + i]` (zero past `rows`), with canaries around the panel.
fn check(
    packers: &anyshape_codegen::JitPackers,
    elem: ElemType,
    w: usize,
    rows: usize,
    kc: usize,
    ld: usize,
) -> Result<(), TestCaseError> {
    let p = packers.get(w).expect("compiled width");
    let (g, kw) = (elem.k_group(), elem.words(kc));
    // The source: `rows` rows of `ld`, the last one ending exactly `kc` elements in
    // (a routine reading past it would read the trailing canaries into the panel).
    let len = (rows - 1) * ld + kc;
    let mut src: Vec<f32> = (0..len + 32).map(|x| if x < len { value(elem, x) } else { CANARY }).collect();
    for i in 0..rows {
        for x in &mut src[i * ld + kc..((i + 1) * ld).min(len)] {
            *x = CANARY;
        }
    }
    let margin = 40;
    let mut dst = vec![CANARY_WORD; kw * w + 2 * margin];
    // SAFETY: `src` holds `rows` rows of stride `ld` with `kc` elements each, and the
    // panel between the margins holds `words(kc) · w` words, as the routine's ABI needs.
    unsafe {
        (p.func)(src.as_ptr(), ld as i64, rows as i64, kc as i64, dst[margin..].as_mut_ptr());
    }
    let canaries = dst[..margin].iter().chain(&dst[margin + kw * w..]);
    prop_assert!(canaries.into_iter().all(|&x| x == CANARY_WORD), "canary hit");
    for k in 0..kw {
        for i in 0..w {
            let want = if i < rows { word(elem, &src, i * ld + k * g, kc - k * g) } else { 0 };
            let got = dst[margin + k * w + i];
            prop_assert_eq!(
                got,
                want,
                "{} w {} rows {} kc {} ld {}: [{}, {}] {:#x} vs {:#x}",
                elem,
                w,
                rows,
                kc,
                ld,
                k,
                i,
                got,
                want
            );
        }
    }
    Ok(())
}

/// Pack with `w`'s routine over rows given by address: row `i` of the panel is
/// source row `(i·5 + 3) mod rows` (out of order, some twice), or zeros where
/// `i` is a multiple of `nulls` (a tap in the padding); canaries as in `check`.
fn check_rows(
    packers: &anyshape_codegen::JitPackers,
    elem: ElemType,
    w: usize,
    rows: usize,
    kc: usize,
    nulls: usize,
) -> Result<(), TestCaseError> {
    let p = packers.get_rows(w).expect("compiled width");
    let (g, kw, ld) = (elem.k_group(), elem.words(kc), kc + 5);
    let len = (rows - 1) * ld + kc;
    let mut src: Vec<f32> = (0..len + 32).map(|x| if x < len { value(elem, x) } else { CANARY }).collect();
    for i in 0..rows {
        for x in &mut src[i * ld + kc..((i + 1) * ld).min(len)] {
            *x = CANARY;
        }
    }
    let row_of = |i: usize| (!i.is_multiple_of(nulls)).then_some((i * 5 + 3) % rows);
    let ptrs: Vec<*const f32> =
        (0..w).map(|i| row_of(i).map_or(std::ptr::null(), |r| src[r * ld..].as_ptr())).collect();
    let margin = 40;
    let mut dst = vec![CANARY_WORD; kw * w + 2 * margin];
    // SAFETY: `ptrs` holds `w` addresses, each null or the start of a source row of
    // `kc` elements inside `src`; the panel between the margins holds `words(kc) · w` words.
    unsafe { (p.func)(ptrs.as_ptr(), kc as i64, dst[margin..].as_mut_ptr()) };
    let canaries = dst[..margin].iter().chain(&dst[margin + kw * w..]);
    prop_assert!(canaries.into_iter().all(|&x| x == CANARY_WORD), "canary hit");
    for k in 0..kw {
        for i in 0..w {
            let want = row_of(i).map_or(0, |r| word(elem, &src, r * ld + k * g, kc - k * g));
            let got = dst[margin + k * w + i];
            prop_assert_eq!(got, want, "{} w {} kc {} by address: [{}, {}]", elem, w, kc, k, i);
        }
    }
    Ok(())
}

#[test]
fn generated_packs_match_the_definition() {
    for (isa, t) in targets() {
        for elem in kernels::CPU_ELEM_TYPES.into_iter().filter(|e| t.check_elem(*e).is_ok()) {
            let packers = compile_packers(&t, elem, &WIDTHS, &WIDTHS).expect("compile");
            let l = t.f32_lanes;
            // Every width, full and partial rows, at depths around a block (W words).
            let d = l * elem.k_group();
            for &w in &WIDTHS {
                for rows in [1, w.div_ceil(2), w] {
                    for kc in [1, 2, 3, l - 1, l, l + 1, d - 1, d, d + 1, 2 * d + 3] {
                        check(&packers, elem, w, rows, kc, kc + 3).unwrap_or_else(|e| panic!("{isa}: {e}"));
                    }
                }
            }
            let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(64));
            let cases = (0..WIDTHS.len(), 1usize..=64, 1usize..300, 0usize..40);
            runner
                .run(&cases, |(wi, rows, kc, gap)| {
                    let w = WIDTHS[wi];
                    check(&packers, elem, w, rows.min(w), kc, kc + gap)?;
                    check_rows(&packers, elem, w, rows, kc, 2 + gap % 5)
                })
                .unwrap_or_else(|e| panic!("{isa} {elem}: {e}"));
            for &w in &WIDTHS {
                for kc in [1, l - 1, l, d + 1, 2 * d + 3] {
                    check_rows(&packers, elem, w, 3, kc, 4).unwrap_or_else(|e| panic!("{isa}: {e}"));
                }
            }
        }
    }
}

/// bf16 is AVX-512 BF16's: a target without it is refused with a reason.
#[test]
fn bf16_needs_avx512_bf16() {
    let Some(t) = Target::detect().avx2_only() else { return };
    let e = compile_packers(&t, ElemType::Bf16, &[8], &[]).err().expect("an error");
    assert!(e.to_string().contains("AVX-512 BF16"), "{e}");
    let e = anyshape_codegen::compile_microkernel_with(&t, ElemType::Bf16, 4, 16, Default::default())
        .err()
        .expect("an error");
    assert!(e.to_string().contains("AVX-512 BF16"), "{e}");
}

#[test]
fn bad_widths_are_errors() {
    let Some((_, t)) = targets().into_iter().next() else { return };
    for w in [0, 129] {
        let e = compile_packers(&t, ElemType::F32, &[4, w], &[]).err().expect("an error");
        assert!(e.to_string().contains(&format!("{w} wide")), "{e}");
    }
}
