//! u8s8 direct kernels (A's 8-bit codes read in place a word of four depths
//! at a time, B a weight packed as u8s8) through the direct driver, against
//! the exact integer product at random shapes: M ∈ {1, primes, MR±1}, N ∈
//! {1, primes, NR±1}, K in whole words from 4 (one word) to past a K block,
//! rows of A whole words apart with gaps, K blocks cutting a convolution's
//! kernel rows, thread grids over rows and columns, floats stored (every
//! epilogue) or codes stored (a static quantization's requantizing store),
//! convolutions' taps (padding, strides, edges in columns), both ISA paths,
//! canaries around every output.

mod programs;

use anyshape_codegen::{compile_direct_kernel_cached, JitDirectKernel, ObjectCache};
use kernels::{
    execute, BOperand, ConvTaps, DirectPlan, DirectVariant, ElemType, EpilogueArgs, MatMut, MatRef, PackedB,
    Plan, Target, ThreadGrid, ThreadPool,
};
use plan::{Activation, Epilogue, Pointwise, PwOp, PwUnary};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// The targets whose u8s8 kernels this machine runs: AVX-512 VNNI, and
/// AVX-VNNI's 256-bit form where the CPU has it.
fn targets() -> Vec<(&'static str, Target)> {
    let host = Target::detect();
    if !kernels::testing::vnni() {
        return Vec::new();
    }
    let mut v = Vec::new();
    if host.isa.avx512f {
        v.push(("avx512", host.clone()));
    }
    v.extend(host.avx2_only().filter(|t| t.check_elem(ElemType::U8S8).is_ok()).map(|t| ("avx2", t)));
    v
}

/// A static quantization's store: `clamp(round(x), 0, 255)` of the scaled
/// sum, as a byte.
fn requantize() -> Pointwise {
    let mut p = Pointwise::empty();
    let x = p.push(PwOp::Input).expect("room");
    let r = p.push(PwOp::Unary(PwUnary::Round, x)).expect("room");
    p.push(PwOp::Integer { x: r, offset: 3, lo: 0, hi: 255 }).expect("room");
    p
}

fn epilogues() -> Vec<Epilogue> {
    vec![
        Epilogue::default(),
        Epilogue {
            column_scale: true,
            bias: true,
            residual: true,
            activation: Activation::Relu,
            ..Default::default()
        },
        Epilogue {
            column_scale: true,
            bias: true,
            activation: Activation::Pointwise(requantize()),
            codes: true,
            ..Default::default()
        },
        Epilogue {
            column_scale: true,
            residual: true,
            residual_codes: true,
            activation: Activation::Pointwise(programs::residual_block().0),
            codes: true,
            ..Default::default()
        },
        Epilogue {
            column_scale: true,
            residual: true,
            residual_codes: true,
            activation: Activation::Pointwise(programs::residual_block_in_one_rounding()),
            codes: true,
            ..Default::default()
        },
    ]
}

/// Heights 5, 2, 1 of width `nr`, u8s8, compiled for `ep`.
fn kernels(t: &Target, nr: usize, ep: Epilogue) -> (Vec<JitDirectKernel>, Vec<DirectVariant>) {
    let none = ObjectCache::none();
    let jit: Vec<JitDirectKernel> = [5, 2, 1]
        .iter()
        .map(|&mr| compile_direct_kernel_cached(t, ElemType::U8S8, mr, nr, ep, &none).expect("compile"))
        .collect();
    let variants = jit.iter().map(|j| DirectVariant { kernel: j.kernel(), gflops: 1.0 }).collect();
    (jit, variants)
}

/// The stored value of `acc` at column `j`, row `i` under `ep`, in f32 in
/// the kernel's order (the sums are exact: below 2^24).
fn reference(ep: &Epilogue, acc: i64, j: usize, i: usize, n: usize, data: &Data) -> f64 {
    let mut y = acc as f32;
    if ep.column_scale {
        y *= data.cscale[j];
    }
    if ep.bias {
        y += data.bias[j];
    }
    let residual = match ep.residual_codes {
        true => f32::from(data.res_codes[i * (n + 5) + j]),
        false => data.res[i * n + j],
    };
    if ep.residual && !ep.residual_in_program() {
        y += residual;
    }
    ep.activation.apply_at(y, residual, &programs::residual_block().1) as f64
}

/// The epilogue's operands (made for the largest shapes drawn).
struct Data {
    cscale: Vec<f32>,
    bias: Vec<f32>,
    res: Vec<f32>,
    /// A residual of codes, `n + 5` bytes a row (no row on a word).
    res_codes: Vec<u8>,
}

impl Data {
    fn new(m: usize, n: usize) -> Data {
        Data {
            cscale: (0..n).map(|j| 0.001 + (j % 5) as f32 * 0.0007).collect(),
            bias: (0..n).map(|j| (j % 7) as f32 * 3.1 - 9.0).collect(),
            res: (0..m * n).map(|i| (i % 5) as f32 * 2.2 - 4.0).collect(),
            res_codes: (0..m * (n + 5)).map(|i| ((i * 89 + 5) % 256) as u8).collect(),
        }
    }
}

/// One product of `rows` output rows by a weight `depth × n`: A as `a`, the
/// exact sums from `exact(i, j)`; C floats or codes between canaries.
#[allow(clippy::too_many_arguments)]
fn check(
    pool: &ThreadPool,
    variants: &[DirectVariant],
    ep: &Epilogue,
    a: MatRef,
    (rows, depth, n): (usize, usize, usize),
    (kc, mc, grid): (usize, usize, ThreadGrid),
    exact: &dyn Fn(usize, usize) -> i64,
    what: &str,
) -> Result<(), TestCaseError> {
    let nr = variants[0].kernel.nr;
    let w: Vec<f32> = (0..depth * n).map(|i| ((i * 113 + 7) % 256) as f32 - 128.0).collect();
    let bm = MatRef::row_major(&w, depth, n).unwrap();
    let packed = PackedB::of_elem(bm, nr, kc, ElemType::U8S8);
    let data = Data::new(rows, n);
    let params = programs::residual_block().1;
    let args = EpilogueArgs {
        column_scale: ep.column_scale.then_some(&data.cscale[..]),
        bias: ep.bias.then_some(&data.bias[..]),
        params: &params,
        residual: ep.residual.then(|| match ep.residual_codes {
            true => MatRef::of_codes(&data.res_codes, rows, n, n + 5, 1).expect("res"),
            false => MatRef::row_major(&data.res, rows, n).expect("res"),
        }),
        ..EpilogueArgs::default()
    };
    let plan = Plan::Direct(DirectPlan { kernels: variants, kc, mc, grid });
    let ldc = n + 3;
    let fail = |e: kernels::KernelError| TestCaseError::fail(format!("{what}: {e}"));
    // C as codes or floats between canaries, read back as f64 (the canary too).
    let run = |out: MatMut| execute(pool, &plan, &[a], &[BOperand::Packed(&packed)], &mut [out], &args);
    let (got, canary, outside) = if ep.codes {
        let mut out = vec![0xa5u8; rows * ldc + 8];
        run(MatMut::of_codes(&mut out[4..], rows, n, ldc).unwrap()).map_err(fail)?;
        let outside = out[..4].iter().chain(&out[4 + rows * ldc..]).all(|&x| x == 0xa5);
        (out[4..4 + rows * ldc].iter().map(|&x| f64::from(x)).collect::<Vec<_>>(), 165.0, outside)
    } else {
        let mut out = vec![1234.5f32; rows * ldc + 8];
        run(MatMut::new(&mut out[4..], rows, n, ldc).unwrap()).map_err(fail)?;
        let outside = out[..4].iter().chain(&out[4 + rows * ldc..]).all(|&x| x == 1234.5);
        (out[4..4 + rows * ldc].iter().map(|&x| f64::from(x)).collect(), 1234.5, outside)
    };
    prop_assert!(outside, "{}: wrote outside C", what);
    for i in 0..rows {
        for j in 0..ldc {
            let got = got[i * ldc + j];
            if j >= n {
                prop_assert_eq!(got, canary, "{}: wrote past column {} at [{},{}]", what, n, i, j);
                continue;
            }
            let want = reference(ep, exact(i, j), j, i, n, &data);
            // Codes: a value within an ulp of a rounding's half may round either way.
            let tol = if ep.codes { 1.0 } else { 1e-5 * (1.0 + want.abs()) };
            prop_assert!(
                (got - want).abs() <= tol,
                "{}: [{},{}] of {}x{}x{}: {} vs {}",
                what,
                i,
                j,
                rows,
                n,
                depth,
                got,
                want
            );
        }
    }
    Ok(())
}

/// The weight `check` multiplies by: element `(p, j)` of `depth × n`.
fn weight(p: usize, j: usize, n: usize) -> i64 {
    (((p * n + j) * 113 + 7) % 256) as i64 - 128
}

/// Bytes aligned to a word from `base` in a buffer with canaries before it.
fn aligned(len: usize) -> (Vec<u8>, usize) {
    let buf = vec![0xc3u8; len + 16];
    let base = (4..8).find(|b| (buf.as_ptr() as usize + b).is_multiple_of(4)).unwrap_or(4);
    (buf, base)
}

const GRIDS: [ThreadGrid; 3] = [
    ThreadGrid::SINGLE,
    ThreadGrid { batch: 1, rows: 2, cols: 1 },
    ThreadGrid { batch: 1, rows: 1, cols: 2 },
];

#[test]
fn u8s8_direct_kernels_over_rows_of_codes_are_exact() {
    let pool = ThreadPool::new(2);
    for (isa, t) in targets() {
        let w = t.f32_lanes;
        for ep in epilogues() {
            for nr in [w, 2 * w] {
                let (_jit, variants) = kernels(&t, nr, ep);
                let dim = |x: usize| {
                    prop_oneof![
                        Just(1usize),
                        Just(2),
                        Just(7),
                        Just(13),
                        Just(x - 1),
                        Just(x + 1),
                        1usize..3 * x
                    ]
                };
                let mut runner = TestRunner::new(Config { cases: 24, ..Config::default() });
                runner
                    .run(
                        &(dim(6), dim(nr), 1usize..40, 1usize..12, 0usize..3, 0usize..3, 1usize..5),
                        |(m, n, words, kc_words, gap, g, blocks)| {
                            let k = 4 * words;
                            // Codes keep no partial sums: one K block.
                            let kc = if ep.codes { k } else { 4 * kc_words };
                            let lda = k + 4 * gap;
                            let (mut buf, base) = aligned(m * lda);
                            for i in 0..m {
                                for p in 0..k {
                                    buf[base + i * lda + p] = ((i * 37 + p * 73 + 11) % 256) as u8;
                                }
                            }
                            let a = MatRef::of_codes(&buf[base..base + m * lda], m, k, lda, 1).unwrap();
                            let exact = |i: usize, j: usize| -> i64 {
                                (0..k).map(|p| i64::from(buf[base + i * lda + p]) * weight(p, j, n)).sum()
                            };
                            let mc = if blocks < 4 { blocks * 5 } else { 1 << 20 };
                            let what =
                                format!("{isa} {nr} {ep:?} {m}x{n}x{k} kc {kc} lda {lda} {:?}", GRIDS[g]);
                            check(&pool, &variants, &ep, a, (m, k, n), (kc, mc, GRIDS[g]), &exact, &what)
                        },
                    )
                    .unwrap_or_else(|e| panic!("{e}"));
            }
        }
    }
}

#[test]
fn u8s8_direct_kernels_over_taps_of_codes_are_exact() {
    let pool = ThreadPool::new(2);
    for (isa, t) in targets() {
        let w = t.f32_lanes;
        for ep in epilogues() {
            let nr = 2 * w;
            let (_jit, variants) = kernels(&t, nr, ep);
            let mut runner = TestRunner::new(Config { cases: 24, ..Config::default() });
            runner
                .run(
                    &(
                        1usize..3,
                        1usize..9,
                        1usize..11,
                        1usize..5,
                        1usize..4,
                        1usize..3,
                        0usize..2,
                        1usize..40,
                        0usize..3,
                        1usize..30,
                    ),
                    |(batch, h, wd, c4, kernel, stride, pad, n, g, kc_words)| {
                        let channels = 4 * c4;
                        let pad = pad.min(kernel - 1);
                        let out = |x: usize| (x + 2 * pad).checked_sub(kernel).map(|v| v / stride + 1);
                        let (Some(ho), Some(wo)) = (out(h), out(wd)) else { return Ok(()) };
                        let taps = ConvTaps {
                            batch,
                            height: h,
                            width: wd,
                            channels,
                            strides: [h * wd * channels, wd * channels, channels],
                            out: [ho, wo],
                            kernel: [kernel, kernel],
                            stride: [stride, stride],
                            dilation: [1, 1],
                            pad: [pad, pad],
                        };
                        let len = batch * h * wd * channels;
                        let (mut buf, base) = aligned(len);
                        for (i, v) in buf[base..base + len].iter_mut().enumerate() {
                            *v = ((i * 131 + 17) % 256) as u8;
                        }
                        let (rows, depth) = taps.dims().unwrap();
                        let a = MatRef::taps_of_codes(&buf[base..base + len], taps).unwrap();
                        let img = &buf[base..base + len];
                        let exact = |r: usize, o: usize| -> i64 {
                            let (bi, y, x) = (r / (ho * wo), r / wo % ho, r % wo);
                            let mut sum = 0;
                            for i in 0..kernel {
                                for j in 0..kernel {
                                    let iy = (y * stride + i) as i64 - pad as i64;
                                    let ix = (x * stride + j) as i64 - pad as i64;
                                    if iy < 0 || ix < 0 || iy >= h as i64 || ix >= wd as i64 {
                                        continue;
                                    }
                                    let at = ((bi * h + iy as usize) * wd + ix as usize) * channels;
                                    for ch in 0..channels {
                                        let p = (i * kernel + j) * channels + ch;
                                        sum += i64::from(img[at + ch]) * weight(p, o, n);
                                    }
                                }
                            }
                            sum
                        };
                        // K blocks that cut kernel rows and taps (floats), or one.
                        let kc = if ep.codes { depth } else { 4 * kc_words };
                        let what = format!("{isa} {ep:?} {taps:?} by {n}, kc {kc} {:?}", GRIDS[g]);
                        check(
                            &pool,
                            &variants,
                            &ep,
                            a,
                            (rows, depth, n),
                            (kc, 1 << 20, GRIDS[g]),
                            &exact,
                            &what,
                        )
                    },
                )
                .unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

/// What a u8s8 direct plan refuses: A as floats, codes that do not start on
/// a word or whose K is not whole words, a B not packed, K blocks of partial
/// words, codes stored from several K blocks.
#[test]
fn u8s8_direct_plans_are_checked() {
    let Some((_, t)) = targets().into_iter().next() else { return };
    let nr = t.f32_lanes;
    let (_jit, variants) = kernels(&t, nr, Epilogue::default());
    let pool = ThreadPool::new(1);
    let (m, k, n) = (3, 8, 5);
    let (buf, base) = aligned(m * k + 4);
    let w = vec![1.0f32; k * n];
    let bm = MatRef::row_major(&w, k, n).unwrap();
    let packed = PackedB::of_elem(bm, nr, k, ElemType::U8S8);
    let floats = vec![1.0f32; m * k];
    let mut c = vec![0.0f32; m * n];
    let plan = |kc| Plan::Direct(DirectPlan { kernels: &variants, kc, mc: 8, grid: ThreadGrid::SINGLE });
    let mut run = |plan: &Plan, a: MatRef, b: BOperand| {
        execute(&pool, plan, &[a], &[b], &mut [MatMut::new(&mut c, m, n, n).unwrap()], &Default::default())
    };
    let codes = MatRef::of_codes(&buf[base..], m, k, k, 1).unwrap();
    let packed_b = BOperand::Packed(&packed);
    run(&plan(8), codes, packed_b).expect("a valid plan runs");
    let err = |r: Result<(), kernels::KernelError>| r.expect_err("refused").to_string();
    assert!(err(run(&plan(8), MatRef::row_major(&floats, m, k).unwrap(), packed_b)).contains("codes"));
    let odd = MatRef::of_codes(&buf[base + 1..], m, k, k, 1).unwrap();
    assert!(err(run(&plan(8), odd, packed_b)).contains("word"));
    assert!(err(run(&plan(8), codes, BOperand::Plain(bm))).contains("packed"));
    assert!(err(run(&plan(6), codes, packed_b)).contains("whole words"));
}

/// A u8s8 K block whose panel is larger than half of L1 streams from L2 for
/// every tile: over rows that make several tiles, no direct schedule has a
/// main height below 4 there; over a panel that fits, or three rows, the low
/// heights stay candidates. Nor does the model pick a packed tile under 4
/// rows over a panel larger than L1, unless no direct kernel reads A.
#[test]
fn low_direct_tiles_do_not_stream_deep_u8s8_panels() {
    let Some((_, t)) = targets().into_iter().next() else { return };
    let dir = std::env::temp_dir().join(format!("anyshape-u8s8-direct-{}", std::process::id()));
    let pool = ThreadPool::new(2);
    let c = anyshape_codegen::Contraction::builder(&t, &pool)
        .elem(ElemType::U8S8)
        .cache(Some(&dir))
        .build()
        .expect("compile");
    let nr = 2 * t.f32_lanes;
    let taps = kernels::ALayout::Taps { width: 14, interior: 12, reads: 9 };
    let problem = |m: usize, kc: usize| kernels::Problem {
        batch: 1,
        m,
        n: 256,
        k: 2304,
        a: taps,
        b: kernels::BLayout::Packed { nr, kc },
    };
    let direct_heights = |p: &kernels::Problem| -> Vec<usize> {
        c.candidates(p).iter().filter(|s| s.operands == kernels::Operands::Direct).map(|s| s.mr).collect()
    };
    let deep = direct_heights(&problem(1568, 2304));
    assert!(!deep.is_empty() && deep.iter().all(|&h| h >= 4), "{deep:?}");
    let shallow = direct_heights(&problem(1568, 256));
    assert!(shallow.contains(&2) && shallow.contains(&1), "{shallow:?}");
    let few = direct_heights(&problem(3, 2304));
    assert!(few.contains(&2), "{few:?}");
    // Packed tiles under 4 rows over a panel larger than L1: no pick where a
    // direct one reads A, the pick where none does (A in floats); over a
    // panel within L1 they stay candidates of the model.
    let d = c.dispatcher();
    // ResNet-50's 3×3 products at 7×7 of 8 images, one block deep (its
    // weight's panel 147 KB), where the model ranked packed 2x32 first.
    let seven = kernels::Problem {
        m: 392,
        n: 512,
        k: 4608,
        a: kernels::ALayout::Taps { width: 7, interior: 5, reads: 9 },
        b: kernels::BLayout::Packed { nr, kc: 4608 },
        ..problem(392, 4608)
    };
    assert!(nr * 2304 > t.l1d, "the panels outgrow L1");
    for p in [problem(1568, 2304), seven] {
        let waits = |s: &kernels::Schedule| s.operands == kernels::Operands::Packed && s.mr < 4;
        let pick = d.choose(&p).expect("a pick");
        assert!(!waits(&pick), "{pick:?}");
        let floats = d.schedule_of(&p, false, false).expect("a packed pick");
        assert_eq!(floats.operands, kernels::Operands::Packed, "{floats:?}");
    }
    let fits = problem(1568, 256);
    let low = |s: &&kernels::Schedule| s.operands == kernels::Operands::Packed && s.mr < 4;
    assert!(c.candidates(&fits).iter().any(|s| low(&s)), "packed low tiles over a panel in L1");
    let _ = std::fs::remove_dir_all(&dir);
}
