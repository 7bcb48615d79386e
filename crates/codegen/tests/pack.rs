//! Generated packing routines against the plain definition of a panel, on both
//! ISA paths: every width a family uses (and a few more), rows from 1 to the
//! width, depths around the vector width, strided sources, and canaries on both
//! sides of the panel and around the source rows' ends.

use anyshape_codegen::compile_packers;
use kernels::Target;
use proptest::prelude::*;

fn targets() -> Vec<(&'static str, Target)> {
    let host = Target::detect();
    if !host.supported() {
        eprintln!("skipped: this machine has no AVX2 + FMA");
        return Vec::new();
    }
    let mut v = vec![("host", host.clone())];
    if host.isa.avx512f {
        v.extend(host.avx2_only().map(|t| ("avx2", t)));
    }
    v
}

const CANARY: f32 = -7777.0;
const WIDTHS: [usize; 14] = [1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 16, 32, 48, 64];

/// Pack with `w`'s routine and compare with `dst[k·w + i] = src[i·ld + k]` (zero
/// past `rows`), with canaries around the panel.
fn check(
    packers: &anyshape_codegen::JitPackers,
    w: usize,
    rows: usize,
    kc: usize,
    ld: usize,
) -> Result<(), TestCaseError> {
    let p = packers.get(w).expect("compiled width");
    // The source: `rows` rows of `ld`, the last one ending exactly `kc` elements in
    // (a routine reading past it would read the trailing canaries into the panel).
    let len = (rows - 1) * ld + kc;
    let mut src: Vec<f32> =
        (0..len + 32).map(|x| if x < len { (x % 251) as f32 + 0.5 } else { CANARY }).collect();
    for i in 0..rows {
        for x in &mut src[i * ld + kc..((i + 1) * ld).min(len)] {
            *x = CANARY;
        }
    }
    let margin = 40;
    let mut dst = vec![CANARY; kc * w + 2 * margin];
    // SAFETY: `src` holds `rows` rows of stride `ld` with `kc` elements each, and the
    // panel between the margins holds `kc · w` elements, as the routine's ABI needs.
    unsafe {
        (p.func)(src.as_ptr(), ld as i64, rows as i64, kc as i64, dst[margin..].as_mut_ptr());
    }
    prop_assert!(dst[..margin].iter().chain(&dst[margin + kc * w..]).all(|&x| x == CANARY), "canary hit");
    for k in 0..kc {
        for i in 0..w {
            let want = if i < rows { src[i * ld + k] } else { 0.0 };
            let got = dst[margin + k * w + i];
            prop_assert_eq!(got, want, "w {} rows {} kc {} ld {}: [{}, {}]", w, rows, kc, ld, k, i);
        }
    }
    Ok(())
}

#[test]
fn generated_packs_match_the_definition() {
    for (isa, t) in targets() {
        let packers = compile_packers(&t, &WIDTHS).expect("compile");
        let l = t.f32_lanes;
        // Every width, full and partial rows, at depths around the vector width.
        for &w in &WIDTHS {
            for rows in [1, w.div_ceil(2), w] {
                for kc in [1, l - 1, l, l + 1, 2 * l + 3] {
                    check(&packers, w, rows, kc, kc + 3).unwrap_or_else(|e| panic!("{isa}: {e}"));
                }
            }
        }
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(64));
        let cases = (0..WIDTHS.len(), 1usize..=64, 1usize..300, 0usize..40);
        runner
            .run(&cases, |(wi, rows, kc, gap)| {
                let w = WIDTHS[wi];
                check(&packers, w, rows.min(w), kc, kc + gap)
            })
            .unwrap_or_else(|e| panic!("{isa}: {e}"));
    }
}

#[test]
fn bad_widths_are_errors() {
    let Some((_, t)) = targets().into_iter().next() else { return };
    for w in [0, 129] {
        let e = compile_packers(&t, &[4, w]).err().expect("an error");
        assert!(e.to_string().contains(&format!("{w} wide")), "{e}");
    }
}
