//! Generated direct kernels (operands read in place, masked edges, several
//! accumulator sets for low tiles) through the direct driver, against a plain
//! reference at random shapes: M, N, K ∈ {1, primes, MR±1, NR±1, KC±1}, strided
//! rows of A, B in place, transposed (packed per thread) or pre-packed, every
//! epilogue, thread grids over batch, rows and columns, both ISA paths, and
//! canaries around every output.

use anyshape_codegen::{compile_direct_kernel, JitDirectKernel};
use kernels::{
    execute, BOperand, DirectPlan, DirectVariant, EpilogueArgs, MatMut, MatRef, PackedB, Plan, Target,
    ThreadGrid, ThreadPool,
};
use plan::{Activation, Epilogue};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

fn targets() -> Vec<(&'static str, Target)> {
    let host = Target::detect();
    let mut v = Vec::new();
    if !kernels::testing::require("ANYSHAPE_REQUIRE_AVX2", host.supported(), "AVX2 + FMA") {
        return v;
    }
    if host.isa.avx512f {
        v.push(("avx512", host.clone()));
    }
    v.extend(host.avx2_only().map(|t| ("avx2", t)));
    v
}

fn epilogues() -> Vec<Epilogue> {
    vec![
        Epilogue::default(),
        Epilogue { bias: true, activation: Activation::Gelu, ..Default::default() },
        Epilogue { residual: true, activation: Activation::Relu, ..Default::default() },
        Epilogue { scale: Some(0.125), activation: Activation::Tanh, ..Default::default() },
        Epilogue { bias: true, activation: Activation::Pointwise(silu()), ..Default::default() },
        Epilogue { column_scale: true, bias: true, residual: true, ..Default::default() },
        Epilogue { bias: true, activation: Activation::Pointwise(with_params()), ..Default::default() },
        Epilogue {
            residual: true,
            activation: Activation::Pointwise(reads_residual()),
            ..Default::default()
        },
    ]
}

/// `x·σ(x) + p0·r`: a program reading the residual as its own operand.
fn reads_residual() -> plan::Pointwise {
    use plan::{PwBinary, PwOp, PwUnary};
    let mut p = plan::Pointwise::empty();
    let x = p.push(PwOp::Input).expect("room");
    let s = p.push(PwOp::Unary(PwUnary::Sigmoid, x)).expect("room");
    let xs = p.push(PwOp::Binary(PwBinary::Mul, x, s)).expect("room");
    let r = p.push(PwOp::Residual).expect("room");
    let p0 = p.push(PwOp::Param(0)).expect("room");
    let pr = p.push(PwOp::Binary(PwBinary::Mul, r, p0)).expect("room");
    p.push(PwOp::Binary(PwBinary::Add, xs, pr)).expect("room");
    p
}

/// The values of [`with_params`]'s parameters.
const PARAMS: [f32; 2] = [0.75, -0.5];

/// `p0·x·σ(x) + p1`: a program whose constants are given when it runs.
fn with_params() -> plan::Pointwise {
    use plan::{PwBinary, PwOp, PwUnary};
    let mut p = plan::Pointwise::empty();
    let x = p.push(PwOp::Input).expect("room");
    let p0 = p.push(PwOp::Param(0)).expect("room");
    let s = p.push(PwOp::Unary(PwUnary::Sigmoid, x)).expect("room");
    let xs = p.push(PwOp::Binary(PwBinary::Mul, x, s)).expect("room");
    let scaled = p.push(PwOp::Binary(PwBinary::Mul, p0, xs)).expect("room");
    let p1 = p.push(PwOp::Param(1)).expect("room");
    p.push(PwOp::Binary(PwBinary::Add, scaled, p1)).expect("room");
    p
}

/// `x·σ(x)`: an epilogue program rather than a named activation.
fn silu() -> plan::Pointwise {
    use plan::{PwBinary, PwOp, PwUnary};
    let mut p = plan::Pointwise::empty();
    let x = p.push(PwOp::Input).expect("room");
    let s = p.push(PwOp::Unary(PwUnary::Sigmoid, x)).expect("room");
    p.push(PwOp::Binary(PwBinary::Mul, x, s)).expect("room");
    p
}

/// Heights 5, 2, 1 of one width (5 needs one accumulator set on AVX-512 at
/// width 2W, the others several), compiled for `ep`.
fn kernels(t: &Target, nr: usize, ep: Epilogue) -> (Vec<JitDirectKernel>, Vec<DirectVariant>) {
    let jit: Vec<JitDirectKernel> =
        [5, 2, 1].iter().map(|&mr| compile_direct_kernel(t, mr, nr, ep).expect("compile")).collect();
    let variants = jit.iter().map(|j| DirectVariant { kernel: j.kernel(), gflops: 1.0 }).collect();
    (jit, variants)
}

#[derive(Clone, Copy, Debug)]
enum BForm {
    InPlace,
    Transposed,
    Prepacked,
}

fn reference(e: &Epilogue, acc: f64, (cscale, bias, res): (f64, f64, f64)) -> f64 {
    let summed = if e.residual_in_program() { 0.0 } else { res };
    let y = acc * e.scale.unwrap_or(1.0) as f64 * cscale + bias + summed;
    e.activation.apply_at(y as f32, res as f32, &PARAMS) as f64
}

#[test]
fn direct_kernels_match_the_reference() {
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
                let grids = [
                    ThreadGrid::SINGLE,
                    ThreadGrid { batch: 2, rows: 1, cols: 1 },
                    ThreadGrid { batch: 1, rows: 2, cols: 1 },
                    ThreadGrid { batch: 1, rows: 1, cols: 2 },
                ];
                let forms =
                    prop_oneof![Just(BForm::InPlace), Just(BForm::Transposed), Just(BForm::Prepacked)];
                let mut runner = TestRunner::new(Config { cases: 24, ..Config::default() });
                runner
                    .run(
                        &(
                            dim(7),
                            dim(nr),
                            dim(17),
                            1usize..40,
                            0usize..4,
                            forms,
                            0usize..3,
                            1usize..3,
                            1usize..5,
                        ),
                        |(m, n, k, kc, g, form, pad, batch, blocks)| {
                            let grid = grids[g];
                            // Row blocks of one to three main heights (edges inside and
                            // across blocks), or one block for every row.
                            let mc = if blocks < 4 { blocks * variants[0].kernel.mr } else { 1 << 20 };
                            let batch = if ep.residual { 1 } else { batch.max(grid.batch) };
                            let (lda, ldc) = (k + pad, n + pad);
                            let a: Vec<f32> =
                                (0..batch * m * lda).map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0).collect();
                            let b: Vec<f32> =
                                (0..batch * k * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 6.0).collect();
                            let bias: Vec<f32> = (0..n).map(|j| (j % 7) as f32 * 0.1 - 0.3).collect();
                            let cscale: Vec<f32> = (0..n).map(|j| 0.5 + (j % 5) as f32 * 0.25).collect();
                            let res: Vec<f32> = (0..m * n).map(|i| (i % 5) as f32 * 0.2 - 0.4).collect();
                            let canary = 1234.5f32;
                            let stride = m * ldc + 8;
                            let mut c = vec![canary; batch * stride + 8];
                            let bat = |e: usize, i: usize, j: usize| match form {
                                BForm::Transposed => b[e * k * n + j * k + i],
                                _ => b[e * k * n + i * n + j],
                            };
                            let av: Vec<MatRef> = (0..batch)
                                .map(|e| MatRef::new(&a[e * m * lda..], m, k, lda, 1).expect("a"))
                                .collect();
                            let packed: Vec<PackedB>;
                            let bv: Vec<BOperand> = match form {
                                BForm::InPlace => (0..batch)
                                    .map(|e| {
                                        BOperand::Plain(MatRef::row_major(&b[e * k * n..], k, n).expect("b"))
                                    })
                                    .collect(),
                                BForm::Transposed => (0..batch)
                                    .map(|e| {
                                        BOperand::Plain(
                                            MatRef::row_major(&b[e * k * n..], n, k).expect("b").t(),
                                        )
                                    })
                                    .collect(),
                                BForm::Prepacked => {
                                    packed = (0..batch)
                                        .map(|e| {
                                            PackedB::new(
                                                MatRef::row_major(&b[e * k * n..], k, n).expect("b"),
                                                nr,
                                                kc,
                                            )
                                        })
                                        .collect();
                                    packed.iter().map(BOperand::Packed).collect()
                                }
                            };
                            let mut cv = Vec::new();
                            let mut rest = &mut c[..];
                            for _ in 0..batch {
                                let (head, tail) = std::mem::take(&mut rest).split_at_mut(stride);
                                cv.push(MatMut::new(&mut head[4..], m, n, ldc).expect("c"));
                                rest = tail;
                            }
                            let args = EpilogueArgs {
                                column_scale: ep.column_scale.then_some(&cscale[..]),
                                bias: ep.bias.then_some(&bias[..]),
                                residual: ep.residual.then(|| MatRef::row_major(&res, m, n).expect("res")),
                                params: &PARAMS,
                                ..EpilogueArgs::default()
                            };
                            let plan = Plan::Direct(DirectPlan { kernels: &variants, kc, mc, grid });
                            execute(&pool, &plan, &av, &bv, &mut cv, &args).expect("run");
                            for e in 0..batch {
                                let ce = &c[e * stride..(e + 1) * stride];
                                for i in 0..m {
                                    for j in 0..ldc {
                                        let got = ce[4 + i * ldc + j];
                                        if j >= n {
                                            prop_assert_eq!(
                                                got,
                                                canary,
                                                "wrote past column {} at [{},{}]",
                                                n,
                                                i,
                                                j
                                            );
                                            continue;
                                        }
                                        let acc: f64 = (0..k)
                                            .map(|p| {
                                                a[e * m * lda + i * lda + p] as f64 * bat(e, p, j) as f64
                                            })
                                            .sum();
                                        let want = reference(
                                            &ep,
                                            acc,
                                            (
                                                if ep.column_scale { cscale[j] as f64 } else { 1.0 },
                                                if ep.bias { bias[j] as f64 } else { 0.0 },
                                                if ep.residual { res[i * n + j] as f64 } else { 0.0 },
                                            ),
                                        );
                                        prop_assert!(
                                            (got as f64 - want).abs() < 1e-3 * (1.0 + want.abs()),
                                            "{} {:?} {}x{}x{} kc {} {:?} {:?} [{},{}]: {} vs {}",
                                            isa,
                                            ep,
                                            m,
                                            n,
                                            k,
                                            kc,
                                            grid,
                                            form,
                                            i,
                                            j,
                                            got,
                                            want
                                        );
                                    }
                                }
                                prop_assert!(ce[..4].iter().all(|&x| x == canary), "wrote before C");
                                prop_assert!(ce[4 + m * ldc..].iter().all(|&x| x == canary), "wrote past C");
                            }
                            Ok(())
                        },
                    )
                    .unwrap_or_else(|e| panic!("{isa} {nr} {ep:?}: {e}"));
            }
        }
    }
}

#[test]
fn direct_plans_are_checked() {
    let Some((_, t)) = targets().into_iter().next() else { return };
    let w = t.f32_lanes;
    let (_jit, variants) = kernels(&t, w, Epilogue::default());
    let pool = ThreadPool::new(1);
    let a = vec![1.0f32; 4 * 3];
    let b = vec![1.0f32; 3 * 5];
    let mut c = vec![0.0f32; 4 * 5];
    let run = |plan: &Plan, a: MatRef, c: &mut [f32]| {
        let bm = MatRef::row_major(&b, 3, 5).unwrap();
        execute(
            &pool,
            plan,
            &[a],
            &[BOperand::Plain(bm)],
            &mut [MatMut::new(c, 4, 5, 5).unwrap()],
            &Default::default(),
        )
    };
    let am = MatRef::row_major(&a, 4, 3).unwrap();
    // Kernels that do not go down to height 1, or are not highest first.
    let no_one = Plan::Direct(DirectPlan { kernels: &variants[..2], kc: 8, mc: 8, grid: ThreadGrid::SINGLE });
    assert!(run(&no_one, am, &mut c).is_err());
    let mut reversed = variants.clone();
    reversed.reverse();
    let unsorted = Plan::Direct(DirectPlan { kernels: &reversed, kc: 8, mc: 8, grid: ThreadGrid::SINGLE });
    assert!(run(&unsorted, am, &mut c).is_err());
    // A transposed A cannot be read in place.
    let at = MatRef::row_major(&a, 3, 4).unwrap().t();
    let ok = Plan::Direct(DirectPlan { kernels: &variants, kc: 8, mc: 8, grid: ThreadGrid::SINGLE });
    assert!(run(&ok, at, &mut c).is_err());
    run(&ok, am, &mut c).expect("a valid plan runs");
    assert!(c.iter().all(|&x| x == 3.0));
}

/// The kernel ABI's runs: K as `runs` runs of `kc` steps, run `r` reading A at
/// `a + r·a_run` and B at `b + r·b_run`, summed in registers and written once (added
/// to C with `ACCUMULATE`, the epilogue applied with `APPLY_EPILOGUE`), for random
/// run counts, lengths (0, 1, primes, past the accumulator sets), column counts and
/// strides, with canaries between C's rows and past its last.
#[test]
fn runs_are_summed_in_registers() {
    for (isa, t) in targets() {
        let w = t.f32_lanes;
        for ep in [
            Epilogue::default(),
            Epilogue { bias: true, residual: true, ..Default::default() },
            Epilogue { column_scale: true, residual: true, ..Default::default() },
            Epilogue {
                residual: true,
                activation: Activation::Pointwise(with_params()),
                ..Default::default()
            },
        ] {
            let (jit, _) = kernels(&t, 2 * w, ep);
            let mut runner = TestRunner::new(Config { cases: 32, ..Config::default() });
            runner
                .run(
                    &(
                        0usize..3,
                        1usize..5,
                        0usize..23,
                        1usize..=2 * w,
                        0usize..9,
                        0usize..5,
                        any::<bool>(),
                        0usize..700,
                    ),
                    |(which, runs, kc, ncols, a_gap, b_gap, accumulate, lines)| {
                        let k = &jit[which].kernel();
                        let (mr, nr) = (k.mr, k.nr);
                        let (lda, ldb, ldc) = (kc + 3, nr + 1, nr + 2);
                        // A run's rows after the last row of the one before, plus a gap.
                        let a_run = mr * lda + a_gap;
                        let b_run = kc * ldb + b_gap * ldb;
                        let a: Vec<f32> =
                            (0..runs * a_run + mr * lda).map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0).collect();
                        let b: Vec<f32> =
                            (0..runs * b_run + kc * ldb).map(|i| ((i * 5 % 11) as f32 - 5.0) / 6.0).collect();
                        let bias: Vec<f32> = (0..nr).map(|j| j as f32 * 0.1 - 0.4).collect();
                        let cscale: Vec<f32> = (0..nr).map(|j| 0.5 + (j % 5) as f32 * 0.25).collect();
                        let res: Vec<f32> = (0..mr * ldc).map(|i| (i % 5) as f32 * 0.2 - 0.4).collect();
                        let canary = 1234.5f32;
                        let start = 0.5f32;
                        let mut c = vec![canary; mr * ldc + 8];
                        for i in 0..mr {
                            c[i * ldc..i * ldc + ncols].fill(start);
                        }
                        let mut flags = if accumulate { kernels::ACCUMULATE } else { 0 };
                        if !ep.is_identity() {
                            flags |= kernels::APPLY_EPILOGUE;
                        }
                        // SAFETY: A holds `runs` runs of MR rows of `kc` (lda apart), the
                        // last starting at (runs − 1)·a_run; B `runs` runs of `kc` rows of
                        // NR (ldb apart); C, the bias and the residual MR rows of
                        // `ncols ≤ NR` columns; what the ABI lets the kernel touch.
                        unsafe {
                            (k.func)(
                                kc as i64,
                                a.as_ptr(),
                                lda as i64,
                                b.as_ptr(),
                                ldb as i64,
                                c.as_mut_ptr(),
                                ldc as i64,
                                ncols as i64,
                                flags,
                                bias.as_ptr(),
                                res.as_ptr(),
                                ldc as i64,
                                runs as i64,
                                a_run as i64,
                                b_run as i64,
                                // Lines asked into L2 (from B's start, up to far past
                                // its end: a hint, never read) change nothing.
                                b.as_ptr(),
                                lines as i64,
                                cscale.as_ptr(),
                                PARAMS.as_ptr(),
                            )
                        };
                        for i in 0..mr {
                            for j in 0..ldc {
                                let got = c[i * ldc + j];
                                if j >= ncols {
                                    prop_assert_eq!(got, canary, "{} row {} col {}", isa, i, j);
                                    continue;
                                }
                                let mut acc = 0.0f64;
                                for r in 0..runs {
                                    for q in 0..kc {
                                        acc += a[r * a_run + i * lda + q] as f64
                                            * b[r * b_run + q * ldb + j] as f64;
                                    }
                                }
                                if accumulate {
                                    acc += start as f64;
                                }
                                let want = if ep.is_identity() {
                                    acc
                                } else {
                                    let s = if ep.column_scale { cscale[j] as f64 } else { 1.0 };
                                    let bias = if ep.bias { bias[j] as f64 } else { 0.0 };
                                    reference(&ep, acc, (s, bias, res[i * ldc + j] as f64))
                                };
                                prop_assert!(
                                    (got as f64 - want).abs() <= 1e-4 * (1.0 + want.abs()),
                                    "{} {}x{} runs {} kc {} row {} col {}: {} against {}",
                                    isa,
                                    mr,
                                    nr,
                                    runs,
                                    kc,
                                    i,
                                    j,
                                    got,
                                    want
                                );
                            }
                        }
                        prop_assert!(c[mr * ldc..].iter().all(|&x| x == canary));
                        Ok(())
                    },
                )
                .unwrap_or_else(|e| panic!("{isa} {ep:?}: {e}"));
        }
    }
}
