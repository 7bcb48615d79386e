//! Implicit GEMM: a compiled contraction whose A is a convolution's taps read
//! from a channels-last image (`MatRef::taps`), against a plain convolution, at
//! random geometries (1 and primes, padding, strides, dilations, channel counts
//! that do and do not fill a vector), on both ISA paths, with the generated
//! packing and the portable loops, packed and read in place by direct kernels,
//! with and without an epilogue (bias, residual, ReLU), and canaries around the
//! image and the output.

use anyshape_codegen::Contraction;
use kernels::{BOperand, ConvTaps, EpilogueArgs, MatMut, MatRef, Operands, Plan, Target, ThreadPool};
use plan::{Activation, Epilogue};
use proptest::prelude::*;

fn targets() -> Vec<Target> {
    let host = Target::detect();
    if !kernels::testing::require("ANYSHAPE_REQUIRE_AVX2", host.supported(), "AVX2 + FMA") {
        return Vec::new();
    }
    let mut v = vec![host.clone()];
    if host.isa.avx512f {
        v.extend(host.avx2_only());
    }
    v
}

const CANARY: f32 = -7777.0;
const MARGIN: usize = 37;

/// The epilogue the tests compile in besides none: everything a convolution's
/// group puts there in ResNet (bias, the residual, ReLU).
const EPILOGUE: Epilogue = Epilogue {
    scale: None,
    column_scale: false,
    bias: true,
    residual: true,
    activation: Activation::Relu,
    codes: false,
    residual_codes: false,
};

/// One convolution: `t`'s geometry with `k` output channels, with the
/// dispatcher's schedule and every direct candidate (taps read in place, when a
/// kernel row's taps are adjacent), or with every candidate schedule when `all`
/// (every tile, cache block and thread grid, packed and direct).
fn check(c: &Contraction, pool: &ThreadPool, t: ConvTaps, k: usize, all: bool) -> Result<(), TestCaseError> {
    let [sn, sy, sx] = t.strides;
    let len = (t.batch - 1) * sn + (t.height - 1) * sy + (t.width - 1) * sx + t.channels;
    // The image inside canaries; the gaps between pixels (a pixel stride above C)
    // hold canaries too, which a wrong read would carry into the result.
    let mut img = vec![CANARY; len + 2 * MARGIN];
    let at = |b: usize, y: usize, x: usize, ch: usize| MARGIN + b * sn + y * sy + x * sx + ch;
    for b in 0..t.batch {
        for y in 0..t.height {
            for x in 0..t.width {
                for ch in 0..t.channels {
                    img[at(b, y, x, ch)] = ((b * 31 + y * 7 + x * 3 + ch * 5) % 17) as f32 / 8.0 - 1.0;
                }
            }
        }
    }
    let (rows, depth) = t.dims().unwrap();
    let w: Vec<f32> = (0..depth * k).map(|i| ((i * 13 % 19) as f32 - 9.0) / 16.0).collect();
    let a = MatRef::taps(&img[MARGIN..MARGIN + len], t).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let bm = MatRef::row_major(&w, depth, k).unwrap();
    let fail = |e: kernels::KernelError| TestCaseError::fail(e.to_string());
    // Overlapping taps get their weight in K blocks of whole kernel rows, as a
    // compiled model packs it; with `all`, also in blocks of one kernel row.
    let overlapping = t.kernel[0] * t.kernel[1] > t.stride[0] * t.stride[1] && t.dilation[1] == 1;
    let row = t.kernel[1] * t.channels;
    let mut weights = vec![match overlapping {
        true => c.pack_conv_weight(bm, &[rows], row).map_err(fail)?,
        false => c.pack_weight(bm, &[rows]).map_err(fail)?,
    }];
    if overlapping {
        let (nr, kc) = (weights[0].nr, weights[0].kc);
        let too_deep = row > c.target().l2 / 8 / (nr * 4);
        prop_assert!(kc % row == 0 || kc == depth || too_deep, "KC {kc} for rows of {row}");
        if all && depth > row {
            weights.push(kernels::PackedB::new(bm, weights[0].nr, row));
        }
    }
    for packed in &weights {
        check_with(c, pool, t, k, all, (&img, a, &w), packed)?;
    }
    Ok(())
}

/// [`check`] with the weight packed as `packed`.
fn check_with(
    c: &Contraction,
    pool: &ThreadPool,
    t: ConvTaps,
    k: usize,
    all: bool,
    (img, a, w): (&[f32], MatRef, &[f32]),
    packed: &kernels::PackedB,
) -> Result<(), TestCaseError> {
    let (rows, _) = t.dims().unwrap();
    let fail = |e: kernels::KernelError| TestCaseError::fail(e.to_string());
    let b = [BOperand::Packed(packed)];
    let problem = c.problem(&[a], &b).map_err(fail)?;
    let candidates = c.candidates(&problem);
    prop_assert_eq!(
        candidates.iter().any(|s| s.operands == Operands::Direct),
        t.adjacent() && !c.family().direct_variants().is_empty(),
        "direct schedules for taps {:?}",
        problem.a
    );
    let mut schedules = vec![c.schedule(&problem).map_err(fail)?];
    schedules.extend(candidates.into_iter().filter(|s| all || s.operands == Operands::Direct));
    let epilogue = c.family().variants()[0].kernel.epilogue;
    let bias: Vec<f32> = (0..k).map(|o| (o % 5) as f32 * 0.25 - 0.5).collect();
    let res: Vec<f32> = (0..rows * k).map(|i| (i % 7) as f32 * 0.125 - 0.375).collect();
    let args = match epilogue.is_identity() {
        true => EpilogueArgs::default(),
        false => EpilogueArgs {
            bias: Some(&bias),
            residual: Some(MatRef::row_major(&res, rows, k).unwrap()),
            ..EpilogueArgs::default()
        },
    };
    for s in schedules {
        let plan = c.plan(&s).map_err(fail)?;
        // A direct plan also with blocks of one output row and of a few (at least
        // one row: `mc` below the width rounds up to it), so that the blocks'
        // bounds cut the pixels at rows and mid-thread.
        let mut plans = vec![(plan, format!("{s}"))];
        if let Plan::Direct(d) = plan {
            let mr = d.kernels[0].kernel.mr;
            for mc in [mr, t.out[1] * 2 + mr] {
                plans.push((
                    Plan::Direct(kernels::DirectPlan { mc, ..d }),
                    format!("{s}, blocks of {mc} pixels"),
                ));
            }
        }
        for (plan, what) in plans {
            let mut out = vec![CANARY; rows * k + 2 * MARGIN];
            {
                let cm = MatMut::new(&mut out[MARGIN..MARGIN + rows * k], rows, k, k).unwrap();
                kernels::execute(pool, &plan, &[a], &b, &mut [cm], &args).map_err(fail)?;
            }
            let ep = (!epilogue.is_identity()).then_some((&bias[..], &res[..]));
            compare(&t, k, img, w, ep, &out, &format!("{what}, B packed {}x{}", packed.nr, packed.kc))?;
        }
    }
    Ok(())
}

/// `out` (between canaries) against the convolution of `img` by `w`.
fn compare(
    t: &ConvTaps,
    k: usize,
    img: &[f32],
    w: &[f32],
    epilogue: Option<(&[f32], &[f32])>,
    out: &[f32],
    what: &str,
) -> Result<(), TestCaseError> {
    let (rows, _) = t.dims().unwrap();
    let [sn, sy, sx] = t.strides;
    let at = |b: usize, y: usize, x: usize, ch: usize| MARGIN + b * sn + y * sy + x * sx + ch;
    prop_assert!(out[..MARGIN].iter().chain(&out[MARGIN + rows * k..]).all(|&x| x == CANARY), "canary hit");
    for r in 0..rows {
        let (b, y, x) = (r / (t.out[0] * t.out[1]), r / t.out[1] % t.out[0], r % t.out[1]);
        for o in 0..k {
            let mut want = 0.0f64;
            for i in 0..t.kernel[0] {
                for j in 0..t.kernel[1] {
                    let iy = (y * t.stride[0] + i * t.dilation[0]) as i64 - t.pad[0] as i64;
                    let ix = (x * t.stride[1] + j * t.dilation[1]) as i64 - t.pad[1] as i64;
                    if iy < 0 || ix < 0 || iy >= t.height as i64 || ix >= t.width as i64 {
                        continue;
                    }
                    for ch in 0..t.channels {
                        let v = img[at(b, iy as usize, ix as usize, ch)] as f64;
                        want += v * w[((i * t.kernel[1] + j) * t.channels + ch) * k + o] as f64;
                    }
                }
            }
            if let Some((bias, res)) = epilogue {
                want = (want + bias[o] as f64 + res[r * k + o] as f64).max(0.0);
            }
            let got = out[MARGIN + r * k + o] as f64;
            prop_assert!(
                (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                "{what}: {t:?} k {k}: [{r}, {o}] {got} vs {want}"
            );
        }
    }
    Ok(())
}

/// A geometry from the drawn values: the output extent is what the padding
/// (begin and end) allows, at least 1.
fn geometry(
    (batch, height, width, channels): (usize, usize, usize, usize),
    (kh, kw, stride, dilation, pad, end): (usize, usize, usize, usize, usize, usize),
    gap: usize,
) -> ConvTaps {
    let out = |n: usize, kk: usize| {
        let span = (kk - 1) * dilation + 1;
        ((n + pad + end).saturating_sub(span) / stride + 1).max(1)
    };
    let sx = channels + gap;
    ConvTaps {
        batch,
        height,
        width,
        channels,
        strides: [height * width * sx + gap, width * sx, sx],
        out: [out(height, kh), out(width, kw)],
        kernel: [kh, kw],
        stride: [stride; 2],
        dilation: [dilation; 2],
        pad: [pad.min(kh - 1), pad.min(kw - 1)],
    }
}

/// The shapes of ResNet's layers, scaled down, and the edges: `(batch,
/// height, width, channels), (kh, kw, stride, dilation, pad, end pad), gap
/// between pixels, outputs`.
type Shape = ((usize, usize, usize, usize), (usize, usize, usize, usize, usize, usize), usize, usize);
const SHAPES: [Shape; 10] = [
    ((1, 7, 7, 16), (3, 3, 1, 1, 1, 1), 0, 8),
    ((2, 5, 6, 17), (3, 3, 2, 1, 1, 0), 3, 5),
    ((1, 9, 9, 32), (1, 1, 2, 1, 0, 0), 0, 33),
    ((1, 1, 1, 3), (3, 3, 1, 1, 1, 1), 1, 1),
    ((1, 11, 4, 1), (2, 3, 1, 2, 2, 1), 0, 7),
    // Taps read in place: every pixel an edge (a 7x7 kernel on a 3-wide
    // image), a stride across an odd width, and ResNet's stem scaled down.
    ((1, 3, 3, 4), (7, 7, 1, 1, 3, 3), 0, 17),
    ((1, 6, 11, 8), (3, 3, 2, 1, 1, 1), 0, 40),
    ((2, 13, 13, 3), (7, 7, 2, 1, 3, 2), 0, 16),
    ((1, 20, 23, 16), (3, 3, 1, 1, 1, 1), 0, 33),
    // Kernel rows 3 x 160 deep: blocks of whole rows cut K in several.
    ((1, 5, 6, 160), (3, 3, 1, 1, 1, 1), 0, 35),
];

/// [`check`] at each of `fixed` (every candidate schedule when `all`), then
/// at `random` drawn geometries with the dispatcher's schedule.
fn check_convolutions(
    c: &Contraction,
    pool: &ThreadPool,
    fixed: &[Shape],
    all: bool,
    random: u32,
    what: &str,
) {
    for &(img, conv, gap, k) in fixed {
        check(c, pool, geometry(img, conv, gap), k, all).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(random));
    runner
        .run(&drawn(13, 3), |(img, conv, gap, k)| check(c, pool, geometry(img, conv, gap), k, false))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
}

/// Drawn geometries as [`SHAPES`] gives them: images of up to `side` pixels a
/// side, gaps between pixels of up to `gap`.
fn drawn(side: usize, gap: usize) -> impl Strategy<Value = Shape> {
    (
        (1usize..=2, 1usize..=side, 1usize..=side, 1usize..=40),
        (1usize..=3, 1usize..=3, 1usize..=2, 1usize..=2, 0usize..=2, 0usize..=2),
        0usize..=gap,
        1usize..=70,
    )
}

#[test]
fn implicit_gemm_matches_the_convolution() {
    let dir = std::env::temp_dir().join(format!("anyshape-implicit-{}", std::process::id()));
    let pool = ThreadPool::new(2);
    for t in targets() {
        for (generated, epilogue) in
            [(true, Epilogue::default()), (false, Epilogue::default()), (true, EPILOGUE)]
        {
            let c = Contraction::builder(&t, &pool)
                .cache(Some(&dir))
                .generated_packing(generated)
                .epilogue(epilogue)
                .build()
                .expect("compile");
            check_convolutions(&c, &pool, &SHAPES, true, 48, &format!("generated packing {generated}"));
        }
    }
}

/// The bf16 family's AMX tiles alone on the same convolutions (their A, an
/// f32 image's taps, packed a row at a time into bf16 pairs): the images'
/// eighths and the weights' sixteenths are exact in bf16, so the products
/// are the f32 convolution's within its tolerance.
#[test]
fn amx_bf16_implicit_gemm_matches_the_convolution() {
    if !kernels::testing::amx() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("anyshape-implicit-amx-{}", std::process::id()));
    let pool = ThreadPool::new(2);
    let amx: Vec<tune::categorize::KernelId> = kernels::AMX_TILES
        .iter()
        .map(|&(mr, nr)| tune::categorize::KernelId { direct: false, mr, nr })
        .collect();
    for t in targets().into_iter().filter(|t| t.isa.amx_bf16) {
        for (generated, epilogue) in [(true, EPILOGUE), (false, Epilogue::default())] {
            let c = Contraction::builder(&t, &pool)
                .cache(Some(&dir))
                .elem(kernels::ElemType::Bf16)
                .keep(Some(&amx))
                .generated_packing(generated)
                .epilogue(epilogue)
                .build()
                .expect("compile");
            assert!(c.kernels().iter().all(|k| k.kernel().amx), "AMX kernels only");
            let what = format!("bf16 AMX, generated packing {generated}");
            check_convolutions(&c, &pool, &SHAPES, false, 16, &what);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A convolution's taps over an image of 8-bit codes (`MatRef::taps_of_codes`,
/// a quantized model's stored activation) by int8 weights, exactly: through
/// the u8s8 family (words copied as they lie where the image starts a word
/// and channels and pixel strides are multiples of 4, byte by byte
/// otherwise) and the i16 family (byte by byte), with the generated packing
/// and the portable loops, at ResNet's shapes scaled down (its stem over an
/// image stored padded: every panel's taps inside) and random geometries
/// (gaps between pixels, padding, strides, dilations, K blocks starting
/// inside a kernel row), between canaries; the fixed shapes also over the
/// same integers as an f32 image.
#[test]
fn taps_of_codes_match_the_integer_convolution() {
    let dir = std::env::temp_dir().join(format!("anyshape-code-taps-{}", std::process::id()));
    let pool = ThreadPool::new(2);
    // The u8s8 family's AMX tiles alone too (their A panels packed row by row).
    let amx: Vec<tune::categorize::KernelId> = kernels::AMX_TILES
        .iter()
        .map(|&(mr, nr)| tune::categorize::KernelId { direct: false, mr, nr })
        .collect();
    let mut elems = vec![(kernels::ElemType::I16, None)];
    if kernels::testing::vnni() {
        elems.push((kernels::ElemType::U8S8, None));
    }
    if kernels::testing::amx() {
        elems.push((kernels::ElemType::U8S8, Some(&amx[..])));
    }
    for t in targets() {
        for &(elem, keep) in elems.iter().filter(|e| t.check_elem(e.0).is_ok()) {
            if keep.is_some() && !t.isa.amx_int8 {
                continue;
            }
            for generated in [true, false] {
                let c = Contraction::builder(&t, &pool)
                    .cache(Some(&dir))
                    .elem(elem)
                    .keep(keep)
                    .generated_packing(generated)
                    .build()
                    .expect("compile");
                if keep.is_some() {
                    assert!(c.kernels().iter().all(|k| k.kernel().amx), "AMX kernels only");
                }
                let fixed = [
                    ((1, 7, 7, 16), (3, 3, 1, 1, 1, 1), 0, 8),
                    ((2, 5, 6, 16), (3, 3, 2, 1, 1, 0), 4, 5),
                    ((1, 9, 9, 32), (1, 1, 2, 1, 0, 0), 0, 33),
                    ((1, 6, 11, 8), (3, 3, 2, 1, 1, 1), 0, 40),
                    ((1, 5, 6, 12), (3, 3, 1, 1, 1, 1), 3, 35),
                    ((2, 13, 13, 3), (7, 7, 2, 1, 3, 2), 0, 16),
                    // A quantized RGB stem over its image stored padded (channels
                    // taken up to a word): every panel's taps inside the image.
                    ((2, 21, 23, 4), (7, 7, 2, 1, 0, 0), 0, 64),
                    // Kernel rows deeper than a K block: blocks start inside a row.
                    ((1, 4, 5, 1024), (3, 3, 1, 1, 0, 0), 0, 8),
                ];
                for (img, conv, gap, k) in fixed {
                    // The same integers as an f32 image (packed through the
                    // family's conversion), then as codes.
                    check_codes(&c, &pool, geometry(img, conv, gap), k, Image::Floats).unwrap_or_else(|e| {
                        panic!("{elem} (AMX alone: {}) generated {generated} f32 image: {e}", keep.is_some())
                    });
                    for aligned in [Image::Aligned, Image::Unaligned] {
                        check_codes(&c, &pool, geometry(img, conv, gap), k, aligned).unwrap_or_else(|e| {
                            panic!(
                                "{elem} (AMX alone: {}) generated {generated} {aligned:?}: {e}",
                                keep.is_some()
                            )
                        });
                    }
                }
                let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(24));
                runner
                    .run(&drawn(11, 4), |(img, conv, gap, k)| {
                        let image = [Image::Unaligned, Image::Aligned][k % 2];
                        check_codes(&c, &pool, geometry(img, conv, gap), k, image)
                    })
                    .unwrap_or_else(|e| {
                        panic!("{elem} (AMX alone: {}) generated {generated}: {e}", keep.is_some())
                    });
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// How [`check_codes`] stores its image of 8-bit integers.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Image {
    /// Codes starting on a 4-byte boundary (the u8s8 family copies words).
    Aligned,
    /// Codes one past it (byte by byte).
    Unaligned,
    /// The same integers as f32 values.
    Floats,
}

/// One convolution over 8-bit integers at `t` with `k` outputs, weights
/// packed and not, against the exact integer convolution; the image stored
/// as `image` says.
fn check_codes(
    c: &Contraction,
    pool: &ThreadPool,
    t: ConvTaps,
    k: usize,
    image: Image,
) -> Result<(), TestCaseError> {
    let aligned = image == Image::Aligned;
    let [sn, sy, sx] = t.strides;
    let len = (t.batch - 1) * sn + (t.height - 1) * sy + (t.width - 1) * sx + t.channels;
    // Canary bytes around the image and in the gaps between pixels.
    let mut img = vec![0xc3u8; len + 2 * MARGIN + 4];
    let base = (MARGIN..MARGIN + 4).find(|b| (img.as_ptr() as usize + b).is_multiple_of(4)).unwrap_or(MARGIN)
        + usize::from(!aligned);
    let at = |b: usize, y: usize, x: usize, ch: usize| base + b * sn + y * sy + x * sx + ch;
    for b in 0..t.batch {
        for y in 0..t.height {
            for x in 0..t.width {
                for ch in 0..t.channels {
                    img[at(b, y, x, ch)] = ((b * 131 + y * 37 + x * 73 + ch * 51) % 256) as u8;
                }
            }
        }
    }
    let (rows, depth) = t.dims().unwrap();
    let w: Vec<f32> = (0..depth * k).map(|i| ((i * 113 % 256) as f32) - 128.0).collect();
    let fail = |e: kernels::KernelError| TestCaseError::fail(e.to_string());
    let floats: Vec<f32> = img[base..base + len].iter().map(|&v| f32::from(v)).collect();
    let a = match image {
        Image::Floats => MatRef::taps(&floats, t).map_err(fail)?,
        _ => MatRef::taps_of_codes(&img[base..base + len], t).map_err(fail)?,
    };
    let bm = MatRef::row_major(&w, depth, k).unwrap();
    let packed = c.pack_weight(bm, &[rows]).map_err(fail)?;
    for b in [BOperand::Plain(bm), BOperand::Packed(&packed)] {
        let mut out = vec![CANARY; rows * k + 2 * MARGIN];
        let cv = MatMut::new(&mut out[MARGIN..MARGIN + rows * k], rows, k, k).unwrap();
        let s = c.matmul(pool, a, b, cv, &EpilogueArgs::default()).map_err(fail)?;
        prop_assert!(
            out[..MARGIN].iter().chain(&out[MARGIN + rows * k..]).all(|&x| x == CANARY),
            "canary hit"
        );
        for r in 0..rows {
            let (bi, y, x) = (r / (t.out[0] * t.out[1]), r / t.out[1] % t.out[0], r % t.out[1]);
            for o in 0..k {
                let (mut want, mut size) = (0i64, 0i64);
                for i in 0..t.kernel[0] {
                    for j in 0..t.kernel[1] {
                        let iy = (y * t.stride[0] + i * t.dilation[0]) as i64 - t.pad[0] as i64;
                        let ix = (x * t.stride[1] + j * t.dilation[1]) as i64 - t.pad[1] as i64;
                        if iy < 0 || ix < 0 || iy >= t.height as i64 || ix >= t.width as i64 {
                            continue;
                        }
                        for ch in 0..t.channels {
                            let v = i64::from(img[at(bi, iy as usize, ix as usize, ch)]);
                            let term = v * w[((i * t.kernel[1] + j) * t.channels + ch) * k + o] as i64;
                            want += term;
                            size += term.abs();
                        }
                    }
                }
                // Exact while every partial sum is (K blocks meet in f32).
                let tol = if size < 1 << 24 { 0.0 } else { size as f64 * 2f64.powi(-23) };
                let got = out[MARGIN + r * k + o] as f64;
                prop_assert!(
                    (got - want as f64).abs() <= tol,
                    "{s}: {t:?} k {k}: [{r}, {o}] {got} vs {want}"
                );
            }
        }
    }
    Ok(())
}

/// A view whose image does not fit its buffer, and a transposed one, are refused.
#[test]
fn bad_taps_are_errors() {
    let t = geometry((1, 4, 4, 8), (3, 3, 1, 1, 1, 1), 0);
    let img = vec![0.0f32; 4 * 4 * 8 - 1];
    let e = MatRef::taps(&img, t).expect_err("an error");
    assert!(e.to_string().contains("needs 128 elements"), "{e}");
    let zero = ConvTaps { stride: [0, 1], ..t };
    assert!(MatRef::taps(&[0.0; 128], zero).is_err());
    let Some(target) = targets().into_iter().next() else { return };
    let pool = ThreadPool::new(1);
    let c = Contraction::builder(&target, &pool).build().expect("compile");
    let img = vec![1.0f32; 128];
    let a = MatRef::taps(&img, t).unwrap();
    let w = vec![1.0f32; 72 * 16];
    let mut out = vec![0.0f32; 72 * 72];
    let b = MatRef::row_major(&w, 16, 72).unwrap();
    let cm = MatMut::new(&mut out, 72, 72, 72).unwrap();
    let e = c.batched(&pool, &[a.t()], &[BOperand::Plain(b)], &mut [cm], &EpilogueArgs::default());
    assert!(e.is_err_and(|e| e.to_string().contains("untransposed A")));
}
