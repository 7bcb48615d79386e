//! A compiled contraction (generated kernel family + dispatcher) against a plain
//! reference, on both ISA paths, at random shapes, with every cost model's choice
//! and with a pre-packed weight and an epilogue.

use anyshape_codegen::Contraction;
use kernels::{Activation, BOperand, CostModel, Epilogue, EpilogueArgs, MatMut, MatRef, Target, ThreadPool};

fn targets() -> Vec<Target> {
    let host = Target::detect();
    if !host.supported() {
        eprintln!("skipped: this machine has no AVX2 + FMA");
        return Vec::new();
    }
    let mut v = vec![host.clone()];
    if host.isa.avx512f {
        v.extend(host.avx2_only());
    }
    v
}

fn gelu(x: f64) -> f64 {
    // erf by its series, to 1e-12 on the range used here
    let erf = |z: f64| {
        let (mut term, mut sum, mut n) = (z, z, 0.0);
        while term.abs() > 1e-15 {
            n += 1.0;
            term *= -z * z / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    };
    0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2))
}

#[test]
fn compiled_contractions_match_the_reference() {
    let dir = std::env::temp_dir().join(format!("anyshape-contraction-{}", std::process::id()));
    let pool = ThreadPool::new(2);
    let shapes =
        [(1, 1, 1), (1, 97, 33), (7, 50, 64), (13, 129, 17), (17, 31, 300), (64, 48, 64), (33, 65, 31)];
    for t in targets() {
        for model in CostModel::ALL {
            let plain =
                Contraction::compile(&t, &pool, Epilogue::default(), model, Some(&dir)).expect("compile");
            let ep = Epilogue { bias: true, activation: Activation::Gelu, ..Default::default() };
            let fused = Contraction::compile(&t, &pool, ep, model, Some(&dir)).expect("compile");
            for &(m, n, k) in &shapes {
                let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0).collect();
                let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 6.0).collect();
                let bias: Vec<f32> = (0..n).map(|j| (j % 7) as f32 * 0.1 - 0.3).collect();
                let am = MatRef::row_major(&a, m, k).unwrap();
                let bm = MatRef::row_major(&b, k, n).unwrap();
                let want = |i: usize, j: usize| {
                    (0..k).map(|p| a[i * k + p] as f64 * b[p * n + j] as f64).sum::<f64>()
                };
                // An activation B, and a batch of two equal entries of it.
                let mut c = vec![0.0f32; 2 * m * n];
                let (c0, c1) = c.split_at_mut(m * n);
                let cv = vec![MatMut::new(c0, m, n, n).unwrap(), MatMut::new(c1, m, n, n).unwrap()];
                let s = plain
                    .batched(
                        &pool,
                        &[am, am],
                        &[BOperand::Plain(bm), BOperand::Plain(bm)],
                        cv,
                        &EpilogueArgs::default(),
                    )
                    .expect("run");
                for i in 0..m {
                    for j in 0..n {
                        for e in 0..2 {
                            let got = c[e * m * n + i * n + j] as f64;
                            assert!(
                                (got - want(i, j)).abs() < 1e-3 * (1.0 + want(i, j).abs()),
                                "{model:?} {s} {m}x{n}x{k} [{i},{j}]"
                            );
                        }
                    }
                }
                // B stored transposed (attention's Kᵀ): packed by the generated routine.
                let bt: Vec<f32> = (0..n * k).map(|x| b[(x % k) * n + x / k]).collect();
                let btm = MatRef::row_major(&bt, n, k).unwrap().t();
                let mut c = vec![0.0f32; m * n];
                let s = plain
                    .matmul(
                        &pool,
                        am,
                        BOperand::Plain(btm),
                        MatMut::new(&mut c, m, n, n).unwrap(),
                        &EpilogueArgs::default(),
                    )
                    .expect("run");
                for i in 0..m {
                    for j in 0..n {
                        let got = c[i * n + j] as f64;
                        assert!(
                            (got - want(i, j)).abs() < 1e-3 * (1.0 + want(i, j).abs()),
                            "{model:?} Bt {s} {m}x{n}x{k} [{i},{j}]"
                        );
                    }
                }
                // A pre-packed weight with bias and GELU applied in the kernels.
                let packed = fused.pack_weight(bm, &[1, 16, 128]).expect("pack");
                let mut c = vec![0.0f32; m * n];
                let args = EpilogueArgs { bias: Some(&bias), residual: None };
                let s = fused
                    .matmul(
                        &pool,
                        am,
                        BOperand::Packed(&packed),
                        MatMut::new(&mut c, m, n, n).unwrap(),
                        &args,
                    )
                    .expect("run");
                for i in 0..m {
                    for j in 0..n {
                        let w = gelu(want(i, j) + bias[j] as f64);
                        assert!(
                            (c[i * n + j] as f64 - w).abs() < 1e-3 * (1.0 + w.abs()),
                            "{model:?} {s} {m}x{n}x{k} [{i},{j}]"
                        );
                    }
                }
            }
            assert!(plain.memoized() == 2 * shapes.len() && fused.memoized() == shapes.len());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
