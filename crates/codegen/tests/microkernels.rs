//! Generated micro-kernels, through the blocked driver, against a plain
//! reference at random shapes: 1, primes, MR±1, NR±1, KC±1, transposed A,
//! canaries around C; on the host's ISA and restricted to AVX2.

use anyshape_codegen::{compile_microkernel, register_tiles, JitMicroKernel};
use kernels::{gemm, Blocking, ElemType, MatMut, MatRef, Target};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

mod programs;
use programs::{pointwise_programs, rounds};

fn targets() -> Vec<(&'static str, Target)> {
    let host = Target::detect();
    let mut v = Vec::new();
    if host.supported() {
        if host.isa.avx512f {
            v.push(("avx512", host.clone()));
        }
        if let Some(t) = host.avx2_only() {
            v.push(("avx2", t));
        }
    }
    v
}

fn naive(a: &[f32], b: &[f32], m: usize, k: usize, n: usize, ta: bool) -> Vec<f64> {
    let at = |i: usize, p: usize| if ta { a[p * m + i] } else { a[i * k + p] };
    (0..m * n).map(|x| (0..k).map(|p| at(x / n, p) as f64 * b[p * n + x % n] as f64).sum()).collect()
}

fn check(jit: &JitMicroKernel, what: &str, cases: u32) {
    let uk = jit.kernel();
    let (mr, nr) = (uk.mr, uk.nr);
    let dim = |t: usize| {
        prop_oneof![
            Just(1usize),
            Just(2),
            Just(7),
            Just(13),
            Just((t - 1).max(1)),
            Just(t),
            Just(t + 1),
            Just(2 * t + 1),
            1usize..3 * t
        ]
    };
    let mut runner = TestRunner::new(Config { cases, ..Config::default() });
    runner
        .run(&(dim(mr), 1usize..70, dim(nr), 2usize..33, any::<bool>()), |(m, k, n, kc, ta)| {
            let blk = Blocking { kc, mc: mr * 2, nc: nr * 2 };
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 4.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 3.0).collect();
            let ldc = n + 3;
            let mut c = vec![f32::NAN; m * ldc + 16];
            let av = if ta {
                MatRef::row_major(&a, k, m).expect("a").t()
            } else {
                MatRef::row_major(&a, m, k).expect("a")
            };
            let bv = MatRef::row_major(&b, k, n).expect("b");
            gemm(&uk, &blk, av, bv, &mut MatMut::new(&mut c[..], m, n, ldc).expect("c")).expect("gemm");
            let want = naive(&a, &b, m, k, n, ta);
            for i in 0..m {
                for j in 0..n {
                    let (got, w) = (c[i * ldc + j] as f64, want[i * n + j]);
                    prop_assert!(
                        (got - w).abs() <= 1e-4 * (1.0 + w.abs() * k as f64),
                        "{what} {mr}x{nr} m{m} k{k} n{n} kc{kc}: ({i},{j}) {got} vs {w}"
                    );
                }
                for j in n..ldc {
                    if i * ldc + j < c.len() {
                        prop_assert!(c[i * ldc + j].is_nan(), "{what}: wrote outside C at ({i},{j})");
                    }
                }
            }
            prop_assert!(c[m * ldc..].iter().all(|x| x.is_nan()), "{what}: wrote past C");
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn every_register_tile_kind_computes_correctly() {
    for (name, t) in targets() {
        let tiles = register_tiles(&t);
        assert!(!tiles.is_empty());
        // The largest tile of each vector count, and a few small ones.
        let mut pick: Vec<(usize, usize)> = Vec::new();
        for nv in 1..=4 {
            if let Some(best) =
                tiles.iter().filter(|(_, nr)| *nr == nv * t.f32_lanes).max_by_key(|(mr, _)| *mr)
            {
                pick.push(*best);
            }
        }
        pick.extend([(1, t.f32_lanes), (3, 2 * t.f32_lanes)]);
        for (mr, nr) in pick {
            let jit = compile_microkernel(&t, mr, nr).unwrap_or_else(|e| panic!("{name} {mr}x{nr}: {e}"));
            check(&jit, name, 24);
        }
    }
}

#[test]
fn isa_paths_use_their_registers() {
    for (name, t) in targets() {
        let (mr, nr) = (4, 2 * t.f32_lanes);
        let jit = compile_microkernel(&t, mr, nr).expect("compile");
        let asm = jit.asm();
        assert!(asm.contains("vfmadd"), "{name}: no FMA in\n{asm}");
        if name == "avx512" {
            assert!(asm.contains("zmm"), "{name}: no zmm registers");
        } else {
            assert!(!asm.contains("zmm") && asm.contains("ymm"), "{name}: expected ymm only");
        }
        assert!(jit.ir().contains("llvm.fma.v"));
    }
}

#[test]
fn bad_tiles_are_errors() {
    let t = Target::detect();
    if !t.supported() {
        return;
    }
    assert!(compile_microkernel(&t, 4, t.f32_lanes + 1).is_err());
    assert!(compile_microkernel(&t, 0, t.f32_lanes).is_err());
}

#[test]
fn kernels_can_be_shared_across_threads() {
    let Some((_, t)) = targets().into_iter().next() else { return };
    let jit = std::sync::Arc::new(compile_microkernel(&t, 4, t.f32_lanes).expect("compile"));
    let handles: Vec<_> = (0..4)
        .map(|s| {
            let jit = jit.clone();
            std::thread::spawn(move || {
                let uk = jit.kernel();
                let (m, k, n) = (5 + s, 9, 11);
                let a = vec![1.0f32; m * k];
                let b = vec![2.0f32; k * n];
                let mut c = vec![0.0f32; m * n];
                let blk = Blocking { kc: 4, mc: uk.mr, nc: uk.nr };
                gemm(
                    &uk,
                    &blk,
                    MatRef::row_major(&a, m, k).unwrap(),
                    MatRef::row_major(&b, k, n).unwrap(),
                    &mut MatMut::new(&mut c, m, n, n).unwrap(),
                )
                .unwrap();
                c.iter().all(|x| *x == 18.0)
            })
        })
        .collect();
    assert!(handles.into_iter().all(|h| h.join().expect("thread")));
}

#[test]
fn peak_is_measured_and_plausible() {
    let Some((_, t)) = targets().into_iter().next() else { return };
    let pool = kernels::ThreadPool::new(1);
    let peak = anyshape_codegen::peak::measure_peak_gflops(&t, &pool, 20).expect("peak");
    // Between 1 GFLOP/s and 2 flops × 2 FMA ports × 16 lanes × 6 GHz per core.
    assert!(peak > 1.0 && peak < 2.0 * 2.0 * 16.0 * 6.0, "{peak}");
}

/// Where the u8s8 and bf16 families multiply in AMX tiles, their peak is the
/// tile products' loop: plausible for it (under 1024 multiply-adds of bytes,
/// or 512 of bf16 pairs, a cycle at 6 GHz).
#[test]
fn amx_peaks_are_measured_and_plausible() {
    if !kernels::testing::amx() {
        return;
    }
    let t = Target::detect();
    let pool = kernels::ThreadPool::new(1);
    for (elem, per_cycle) in [(ElemType::U8S8, 2048.0), (ElemType::Bf16, 1024.0)] {
        let peak = anyshape_codegen::peak::measure_peak_gflops_of(&t, elem, &pool, 20).expect("peak");
        assert!(peak > 1.0 && peak < per_cycle * 6.0, "{elem}: {peak}");
    }
}

/// On an AMX machine the u8s8 tuning record holds, for each AMX tile and no
/// other, a rate storing codes (`time_codes_sweep`, plausible as the peak's
/// bound above); a kernel that stores floats has none to measure.
#[test]
fn amx_tiles_are_measured_storing_codes() {
    use anyshape_codegen::{compile_microkernel_with, time_codes_sweep, tuning, CODES_DEPTH};
    if !kernels::testing::amx() {
        return;
    }
    let t = Target::detect();
    let record = tuning::measure(None, &t, ElemType::U8S8, &|_, _| {}).expect("measure");
    for tile in &record.tiles {
        let amx = t.amx_tile(ElemType::U8S8, tile.mr, tile.nr);
        let g = tile.codes_gflops;
        assert!(!amx || (g > 1.0 && g < 2048.0 * 6.0), "{}x{}: {g}", tile.mr, tile.nr);
        assert!(amx || g == 0.0, "{}x{} is no AMX tile: {g}", tile.mr, tile.nr);
    }
    assert!(record.tiles.iter().any(|m| (m.mr, m.nr) == (16, 64)), "no 16x64 tile measured");
    let floats =
        compile_microkernel_with(&t, ElemType::U8S8, 16, 64, plan::Epilogue::default()).expect("compile");
    assert_eq!(time_codes_sweep(&floats.kernel(), CODES_DEPTH), 0.0);
}

/// The epilogue compiled into the kernel (`y = relu(scale·acc + bias + residual)`
/// and its parts), applied once on the last K block, at edge-heavy shapes.
#[test]
fn epilogues_compute_correctly() {
    use kernels::{gemm_packed, EpilogueArgs, PackedB, ThreadPool};
    use plan::{Activation, Epilogue};
    let pool = ThreadPool::new(2);
    for (name, t) in targets() {
        let variants = [
            Epilogue { bias: true, ..Default::default() },
            Epilogue {
                scale: Some(0.5),
                bias: true,
                residual: true,
                activation: Activation::Relu,
                ..Default::default()
            },
            Epilogue { scale: Some(-2.0), residual: true, ..Default::default() },
            Epilogue { activation: Activation::Relu, ..Default::default() },
            Epilogue { bias: true, activation: Activation::Gelu, ..Default::default() },
            Epilogue {
                scale: Some(0.25),
                bias: true,
                activation: Activation::GeluTanh,
                ..Default::default()
            },
            Epilogue { residual: true, activation: Activation::Tanh, ..Default::default() },
            // A quantized product's dequantization: scales per column, then the rest.
            Epilogue {
                column_scale: true,
                bias: true,
                residual: true,
                activation: Activation::Gelu,
                ..Default::default()
            },
            Epilogue { scale: Some(0.5), column_scale: true, ..Default::default() },
        ];
        let programs = pointwise_programs().map(|p| Epilogue {
            bias: true,
            residual: true,
            activation: Activation::Pointwise(p),
            ..Default::default()
        });
        // A program reading the residual as its own operand: `relu(x) + 0.5·r`
        // (the residual not added to its input).
        let reads_residual = {
            use plan::{PwBinary, PwOp, PwUnary};
            let mut p = plan::Pointwise::empty();
            let x = p.push(PwOp::Input).expect("room");
            let relu = p.push(PwOp::Unary(PwUnary::Relu, x)).expect("room");
            let r = p.push(PwOp::Residual).expect("room");
            let half = p.push(PwOp::Const(0.5f32.to_bits())).expect("room");
            let hr = p.push(PwOp::Binary(PwBinary::Mul, r, half)).expect("room");
            p.push(PwOp::Binary(PwBinary::Add, relu, hr)).expect("room");
            Epilogue {
                bias: true,
                residual: true,
                activation: Activation::Pointwise(p),
                ..Default::default()
            }
        };
        for ep in variants.into_iter().chain(programs).chain([reads_residual]) {
            let jit = anyshape_codegen::compile_microkernel_with(&t, ElemType::F32, 4, 2 * t.f32_lanes, ep)
                .expect("compile");
            let uk = jit.kernel();
            // Rows past the last full band are covered by a 1-row kernel (FTuner's two heights).
            let small = anyshape_codegen::compile_microkernel_with(&t, ElemType::F32, 1, 2 * t.f32_lanes, ep)
                .expect("compile");
            for (m, k, n, kc) in [
                (1, 1, 1, 4),
                (5, 13, 37, 4),
                (9, 40, 2 * t.f32_lanes + 3, 16),
                (7, 0, 5, 4),
                (12, 33, 16, 8),
            ] {
                if rounds(&ep) && k > 0 {
                    // With K = 0 the value is bias + residual, exact in f32 and f64.
                    continue;
                }
                let blk = Blocking { kc, mc: 8, nc: uk.nr * 2 };
                let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 4.0).collect();
                let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 3.0).collect();
                let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.25 - 1.0).collect();
                let cscale: Vec<f32> = (0..n).map(|j| 0.5 + (j % 7) as f32 * 0.125).collect();
                let res: Vec<f32> = (0..m * n).map(|i| (i % 5) as f32 - 2.0).collect();
                let packed = PackedB::new(MatRef::row_major(&b, k, n).unwrap(), uk.nr, kc);
                let mut c = vec![f32::NAN; m * n];
                let args = EpilogueArgs {
                    column_scale: ep.column_scale.then_some(&cscale[..]),
                    bias: ep.bias.then_some(&bias[..]),
                    residual: ep.residual.then(|| MatRef::row_major(&res, m, n).unwrap()),
                    ..EpilogueArgs::default()
                };
                gemm_packed(
                    &pool,
                    &uk,
                    Some(&small.kernel()),
                    &blk,
                    MatRef::row_major(&a, m, k).unwrap(),
                    &packed,
                    MatMut::new(&mut c, m, n, n).unwrap(),
                    &args,
                )
                .expect("gemm");
                let want = naive(&a, &b, m, k, n, false);
                for i in 0..m {
                    for j in 0..n {
                        let mut y = want[i * n + j] * ep.scale.unwrap_or(1.0) as f64;
                        if ep.column_scale {
                            y *= cscale[j] as f64;
                        }
                        if ep.bias {
                            y += bias[j] as f64;
                        }
                        let r = res[i * n + j];
                        if ep.residual && !ep.residual_in_program() {
                            y += r as f64;
                        }
                        // The exact activation (f64), not the kernels' own formula.
                        y = match ep.activation {
                            Activation::None => y,
                            Activation::Relu => y.max(0.0),
                            Activation::Gelu => 0.5 * y * (1.0 + erf64(y / std::f64::consts::SQRT_2)),
                            Activation::GeluTanh => {
                                0.5 * y
                                    * (1.0
                                        + ((2.0 / std::f64::consts::PI).sqrt() * (y + 0.044715 * y * y * y))
                                            .tanh())
                            }
                            Activation::Tanh => y.tanh(),
                            // The program's scalar meaning (its own formulas for
                            // erf, tanh and sigmoid, checked in `kernels`).
                            Activation::Pointwise(p) => p.eval_at(y as f32, r, &[]) as f64,
                        };
                        let got = c[i * n + j] as f64;
                        assert!(
                            (got - y).abs() <= 1e-4 * (1.0 + y.abs() * (k + 1) as f64),
                            "{name} {ep:?} m{m} k{k} n{n}: ({i},{j}) {got} vs {y}"
                        );
                    }
                }
            }
        }
        // A kernel with an epilogue refuses arguments that do not match it.
        let jit = anyshape_codegen::compile_microkernel_with(
            &t,
            ElemType::F32,
            4,
            t.f32_lanes,
            Epilogue { bias: true, ..Default::default() },
        )
        .expect("compile");
        let packed = PackedB::new(MatRef::row_major(&[1.0; 4], 2, 2).unwrap(), t.f32_lanes, 4);
        let mut c = vec![0.0; 4];
        let err = gemm_packed(
            &pool,
            &jit.kernel(),
            None,
            &Blocking { kc: 4, mc: 4, nc: t.f32_lanes },
            MatRef::row_major(&[1.0; 4], 2, 2).unwrap(),
            &packed,
            MatMut::new(&mut c, 2, 2, 2).unwrap(),
            &EpilogueArgs::default(),
        );
        assert!(err.is_err());
    }
}

/// A quantization's integer in the epilogue (`PwOp::Integer`, computed in
/// f32 where its offset and bounds allow): `plan::integer`'s value bit for
/// bit at NaN, the infinities, signed zeros, halves, f32's last exact
/// integers, and where the saturated integer plus the offset wraps past i32,
/// for offsets of either sign or none and bounds of u8, i8 and past 2^24 (i32
/// arithmetic). A zero product (K = 1, A zero) plus the residual is the
/// residual, exactly (at K = 0 the driver applies the epilogue in Rust). The
/// bounds of a byte also as a store of codes after rounding (a quantization's,
/// converted on integers where the ISA allows).
#[test]
fn integer_epilogues_are_the_contracts_integers() {
    use kernels::{gemm_packed, EpilogueArgs, PackedB, ThreadPool};
    use plan::{Activation, Epilogue, Pointwise, PwOp};
    let pool = ThreadPool::new(2);
    let forms = [
        (0, 0, 255),
        (134, 0, 255),
        (-7, 0, 255),
        (-7, -128, 127),
        (9, -128, 127),
        (0, -100, 100),
        (-3, 20_000_000, 30_000_000),
        // A zero point that is also the lower bound (a ReLU folded into the
        // clamp: no NaN mask), and a bound below a byte's.
        (17, 17, 255),
        (0, 0, 100),
    ];
    let mut special = vec![
        0.0f32,
        -0.0,
        0.4,
        -0.4,
        0.5,
        -1.9,
        127.9,
        -128.9,
        255.9,
        16_777_217.0,
        -16_777_217.0,
        25_000_000.0,
        2_147_483_520.0,
        2_147_483_648.0,
        -2_147_483_904.0,
        3e10,
        -3e10,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ];
    for (z, ..) in forms {
        for edge in [2_147_483_648.0f64 - f64::from(z), -2_147_483_648.0 - f64::from(z)] {
            let e = edge as f32;
            special.extend([e, e.next_up(), e.next_down()]);
        }
    }
    for (name, t) in targets() {
        for (offset, lo, hi) in forms {
            let mut p = Pointwise::empty();
            let x = p.push(PwOp::Input).expect("input");
            p.push(PwOp::Integer { x, offset, lo, hi }).expect("integer");
            let ep = Epilogue { residual: true, activation: Activation::Pointwise(p), ..Default::default() };
            let jit = anyshape_codegen::compile_microkernel_with(&t, ElemType::F32, 4, 2 * t.f32_lanes, ep)
                .expect("compile");
            let (m, n) = (3, 2 * t.f32_lanes + 3);
            let res: Vec<f32> = (0..m * n).map(|i| special[i % special.len()]).collect();
            let ones = vec![1.0f32; n];
            let packed = PackedB::new(MatRef::row_major(&ones, 1, n).unwrap(), jit.kernel().nr, 4);
            let args = EpilogueArgs {
                residual: Some(MatRef::row_major(&res, m, n).unwrap()),
                ..EpilogueArgs::default()
            };
            // A zero product (K = 1, A zero) through `jit`'s epilogue into `c`.
            let run = |jit: &anyshape_codegen::JitMicroKernel, c: MatMut| {
                gemm_packed(
                    &pool,
                    &jit.kernel(),
                    None,
                    &Blocking { kc: 4, mc: 4, nc: 2 * jit.kernel().nr },
                    MatRef::row_major(&[0.0; 3], m, 1).unwrap(),
                    &packed,
                    c,
                    &args,
                )
                .expect("gemm")
            };
            let mut c = vec![f32::NAN; m * n];
            run(&jit, MatMut::new(&mut c, m, n, n).unwrap());
            for (r, got) in res.iter().zip(&c) {
                let want = plan::integer(*r, offset, lo, hi);
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{name} integer(x, {offset}, {lo}..={hi}) of {r}: {got}"
                );
            }
            // Rounded first, inside a program (a residual block's product,
            // dequantized again): rounded and converted in one instruction
            // where the target can, then on integers, then back to floats.
            let mut inner = Pointwise::empty();
            let x = inner.push(PwOp::Input).expect("input");
            let r = inner.push(PwOp::Unary(plan::PwUnary::Round, x)).expect("round");
            let q = inner.push(PwOp::Integer { x: r, offset, lo, hi }).expect("integer");
            let one = inner.push(PwOp::Const(1f32.to_bits())).expect("one");
            inner.push(PwOp::Binary(plan::PwBinary::Mul, q, one)).expect("mul");
            let ep_inner = Epilogue { activation: Activation::Pointwise(inner), ..ep };
            let jit_inner =
                anyshape_codegen::compile_microkernel_with(&t, ElemType::F32, 4, 2 * t.f32_lanes, ep_inner)
                    .expect("compile");
            let mut c = vec![f32::NAN; m * n];
            run(&jit_inner, MatMut::new(&mut c, m, n, n).unwrap());
            for (r, got) in res.iter().zip(&c) {
                let want = inner.eval(*r);
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{name} integer(round(x), {offset}, {lo}..={hi}) of {r}: {got}"
                );
            }
            // Stored as codes, after rounding (a quantization's store: AVX-512
            // rounds and converts in one instruction, then works on integers).
            if lo < 0 || hi > 255 {
                continue;
            }
            let mut p = Pointwise::empty();
            let x = p.push(PwOp::Input).expect("input");
            let r = p.push(PwOp::Unary(plan::PwUnary::Round, x)).expect("round");
            p.push(PwOp::Integer { x: r, offset, lo, hi }).expect("integer");
            let ep = Epilogue { residual: true, activation: Activation::Pointwise(p), codes: true, ..ep };
            let jit = anyshape_codegen::compile_microkernel_with(&t, ElemType::F32, 4, 2 * t.f32_lanes, ep)
                .expect("compile");
            let mut bytes = vec![0xa5u8; m * n];
            run(&jit, MatMut::of_codes(&mut bytes, m, n, n).unwrap());
            for (r, got) in res.iter().zip(&bytes) {
                let want = p.eval(*r);
                assert_eq!(
                    f32::from(*got),
                    want,
                    "{name} code of integer(round(x), {offset}, {lo}..={hi}) of {r}"
                );
            }
        }
    }
}

/// erf in f64 by its Taylor series (|x| < 3) or its asymptote beyond.
fn erf64(x: f64) -> f64 {
    if x.abs() > 3.0 {
        // erfc by its continued fraction, evaluated backwards (accurate for x > 2).
        let a = x.abs();
        let mut k = 0.0;
        for n in (1..=80).rev() {
            k = (n as f64 / 2.0) / (a + k);
        }
        let erfc = (-a * a).exp() / std::f64::consts::PI.sqrt() / (a + k);
        return x.signum() * (1.0 - erfc);
    }
    let (mut term, mut sum) = (x, x);
    for n in 1..200 {
        term *= -x * x / n as f64;
        sum += term / (2 * n + 1) as f64;
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

/// The vector math over a wide input range matches f64 within f32 accuracy.
#[test]
fn vector_activations_match_f64() {
    use kernels::{gemm_packed, EpilogueArgs, PackedB, ThreadPool};
    use plan::{Activation, Epilogue};
    let Some((_, t)) = targets().into_iter().next() else { return };
    let pool = ThreadPool::new(1);
    for act in [Activation::Gelu, Activation::GeluTanh, Activation::Tanh] {
        let ep = Epilogue { activation: act, ..Default::default() };
        let jit = anyshape_codegen::compile_microkernel_with(&t, ElemType::F32, 1, t.f32_lanes, ep)
            .expect("compile");
        // C = A·1 with k = 1: the epilogue sees A's values, -12..12 and the extremes.
        let xs: Vec<f32> =
            (-1200..=1200).map(|i| i as f32 / 100.0).chain([-88.0, 88.0, -1e-30, 1e-30, 0.0]).collect();
        let packed = PackedB::new(MatRef::row_major(&[1.0], 1, 1).unwrap(), t.f32_lanes, 4);
        let mut c = vec![0.0; xs.len()];
        gemm_packed(
            &pool,
            &jit.kernel(),
            None,
            &Blocking { kc: 4, mc: 8, nc: t.f32_lanes },
            MatRef::row_major(&xs, xs.len(), 1).unwrap(),
            &packed,
            MatMut::new(&mut c, xs.len(), 1, 1).unwrap(),
            &EpilogueArgs::default(),
        )
        .expect("gemm");
        for (x, y) in xs.iter().zip(&c) {
            let x = *x as f64;
            let want = match act {
                Activation::Gelu => 0.5 * x * (1.0 + erf64(x / std::f64::consts::SQRT_2)),
                Activation::GeluTanh => {
                    0.5 * x
                        * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
                }
                _ => x.tanh(),
            };
            assert!((*y as f64 - want).abs() <= 2e-6 * (1.0 + want.abs()), "{act:?}({x}) = {y}, want {want}");
        }
    }
}

/// The tuning cache: measured once, then read back; a corrupt record or one of
/// another machine is measured again.
#[test]
fn tuning_cache_round_trip() {
    use anyshape_codegen::tuning;
    let Some((_, t)) = targets().into_iter().next() else { return };
    let dir = std::env::temp_dir().join(format!("anyshape-tuning-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (first, cached) = tuning::select_cached(Some(&dir), &t, 4).expect("measure");
    assert!(!cached);
    let record = tuning::load(&dir, &t, ElemType::F32).expect("stored");
    assert_eq!(record.machine, tuning::machine_key(&t));
    assert_eq!(record.tiles.len(), anyshape_codegen::register_tiles(&t).len());
    let (second, cached) = tuning::select_cached(Some(&dir), &t, 4).expect("cached");
    assert!(cached);
    assert_eq!((first.kernel().mr, first.kernel().nr), (second.kernel().mr, second.kernel().nr));
    // A corrupt file, or another machine's record: measured again.
    let file = std::fs::read_dir(&dir).expect("dir").next().expect("file").expect("entry").path();
    std::fs::write(&file, "{ not json").expect("corrupt");
    assert!(!tuning::select_cached(Some(&dir), &t, 4).expect("re-measure").1);
    let mut other = tuning::load(&dir, &t, ElemType::F32).expect("stored again");
    other.machine = "another machine".into();
    std::fs::write(&file, serde_json::to_string(&other).expect("json")).expect("write");
    assert!(tuning::load(&dir, &t, ElemType::F32).is_none());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A record this machine outruns (a slow phase's, or another machine's of the same
/// CPU) is measured again, its measured dispatch forgotten, and its tiles keep the
/// best of old and new; a record it does not outrun is kept.
#[test]
fn a_record_the_machine_outruns_is_measured_again() {
    use anyshape_codegen::tuning;
    let t = Target::detect();
    if !kernels::testing::require("ANYSHAPE_REQUIRE_AVX2", t.supported(), "AVX2 + FMA") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("anyshape-outrun-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (measured, cached) = tuning::fresh_record(Some(&dir), &t, ElemType::F32).expect("measure");
    assert!(!cached, "an empty folder is measured");
    // Rates far above what any tile runs at: kept, whatever the machine's phase.
    let mut fast = measured.clone();
    for m in fast.tiles.iter_mut().chain(fast.direct.iter_mut()) {
        m.gflops *= 4.0;
    }
    let file = std::fs::read_dir(&dir).expect("dir").next().expect("file").expect("entry").path();
    std::fs::write(&file, serde_json::to_string(&fast).expect("json")).expect("write");
    let (kept, cached) = tuning::fresh_record(Some(&dir), &t, ElemType::F32).expect("read");
    assert!(cached, "a record above the machine is kept");
    // (JSON keeps a rate to its last bit or so.)
    let same = |a: &[anyshape_codegen::TileMeasurement], b: &[anyshape_codegen::TileMeasurement]| {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| (x.mr, x.nr) == (y.mr, y.nr) && (x.gflops - y.gflops).abs() <= 1e-9 * y.gflops)
    };
    assert!(same(&kept.tiles, &fast.tiles), "the record kept as it was");
    // A tenth of the rates (and a measured dispatch beside them): measured again.
    let mut slow = measured.clone();
    for m in slow.tiles.iter_mut().chain(slow.direct.iter_mut()) {
        m.gflops /= 10.0;
    }
    std::fs::write(&file, serde_json::to_string(&slow).expect("json")).expect("write");
    let refined = anyshape_codegen::refine::path(&dir, ElemType::F32, 2);
    let other_type = anyshape_codegen::refine::path(&dir, ElemType::Bf16, 2);
    for f in [&refined, &other_type] {
        std::fs::write(f, "{}").expect("write");
    }
    let (again, cached) = tuning::fresh_record(Some(&dir), &t, ElemType::F32).expect("measure again");
    assert!(!cached, "a record the machine outruns is measured again");
    assert!(!refined.exists(), "its measured dispatch is forgotten");
    assert!(other_type.exists(), "another element type's is not");
    let stored = tuning::load(&dir, &t, ElemType::F32).expect("stored");
    assert!(same(&stored.tiles, &again.tiles), "the new record stored");
    for (new, old) in again.tiles.iter().zip(&slow.tiles) {
        assert_eq!((new.mr, new.nr), (old.mr, old.nr));
        assert!(
            new.gflops >= old.gflops,
            "{}x{}: {} under the old {}",
            new.mr,
            new.nr,
            new.gflops,
            old.gflops
        );
    }
    assert!(stored.models.is_empty(), "the machine models are calibrated again");
    let _ = std::fs::remove_dir_all(&dir);
}
