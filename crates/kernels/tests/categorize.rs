//! DietCode's categorization over the analytical model: the trade-off curve runs
//! from the whole family down, never loses a sample, and the family picked within
//! a tolerance computes every sample right.

use anyshape_kernels::categorize::{categorize, kernel_ids, pick, restrict, Sample};
use anyshape_kernels::{
    calibrate, ALayout, BLayout, BOperand, CostModel, DirectKernel, DirectVariant, Dispatcher, EpilogueArgs,
    KernelFamily, KernelVariant, MatMut, MatRef, MicroKernel, Problem, Target, ThreadPool,
};

#[macro_use]
mod common;

rust_kernel!(k1x4, 1, 4);
rust_kernel!(k2x4, 2, 4);
rust_kernel!(k5x4, 5, 4);
rust_kernel!(k1x8, 1, 8);
rust_kernel!(k3x8, 3, 8);
rust_direct_kernel!(d1x4, 1, 4);
rust_direct_kernel!(d3x4, 3, 4);
rust_direct_kernel!(d1x8, 1, 8);
rust_direct_kernel!(d4x8, 4, 8);

fn family() -> KernelFamily {
    let v = |mr, nr, func, gflops| KernelVariant {
        kernel: MicroKernel { mr, nr, func, epilogue: Default::default() },
        gflops,
    };
    let d = |mr, nr, func, gflops| DirectVariant {
        kernel: DirectKernel { mr, nr, func, epilogue: Default::default() },
        gflops,
    };
    KernelFamily::new(vec![
        v(1, 4, k1x4 as anyshape_kernels::MicroKernelFn, 10.0),
        v(2, 4, k2x4, 20.0),
        v(5, 4, k5x4, 40.0),
        v(1, 8, k1x8, 15.0),
        v(3, 8, k3x8, 45.0),
    ])
    .and_then(|f| {
        f.with_direct(vec![
            d(1, 4, d1x4 as anyshape_kernels::DirectKernelFn, 9.0),
            d(3, 4, d3x4, 30.0),
            d(1, 8, d1x8, 14.0),
            d(4, 8, d4x8, 44.0),
        ])
    })
    .expect("family")
}

fn setup() -> (Target, anyshape_kernels::MachineModel, ThreadPool) {
    let t = Target { l1d: 2 << 10, l2: 8 << 10, l3: 64 << 10, ..Target::detect() };
    let pool = ThreadPool::new(2);
    let machine = calibrate::measure(&t, &pool);
    (t, machine, pool)
}

fn samples() -> Vec<Sample> {
    let p = |batch, m, n, k, b| Problem { batch, m, n, k, a: ALayout::RowMajor, b };
    vec![
        Sample { problem: p(1, 37, 24, 50, BLayout::Packed { nr: 8, kc: 16 }), weight: 3.0 },
        Sample { problem: p(1, 5, 24, 50, BLayout::Packed { nr: 8, kc: 16 }), weight: 1.0 },
        Sample { problem: p(3, 7, 9, 13, BLayout::RowMajor), weight: 2.0 },
        Sample { problem: p(2, 16, 16, 8, BLayout::Strided), weight: 1.0 },
    ]
}

#[test]
fn the_curve_runs_from_the_whole_family_down_and_serves_every_sample() {
    let (t, machine, pool) = setup();
    let fam = family();
    let samples = samples();
    let curve = categorize(&t, &machine, CostModel::Hierarchical, &fam, &samples).expect("curve");
    assert_eq!(curve[0].kernels, kernel_ids(&fam));
    assert!((curve[0].mean_slowdown - 1.0).abs() < 1e-12);
    for w in curve.windows(2) {
        assert_eq!(w[1].kernels.len() + 1, w[0].kernels.len());
        assert!(w[1].kernels.iter().all(|k| w[0].kernels.contains(k)));
    }
    // The packed weight fixes width 8: that width's kernels can never all go.
    let last = curve.last().expect("a point");
    assert!(last.kernels.iter().any(|k| !k.direct && k.nr == 8), "{:?}", last.kernels);
    // Every point serves every sample, and the chosen one computes them right.
    let chosen = pick(&curve, 0.05).expect("a pick");
    assert!(chosen.mean_slowdown <= 1.05);
    assert!(chosen.kernels.len() <= curve[0].kernels.len());
    for point in &curve {
        let d = Dispatcher::new(
            t.clone(),
            restrict(&fam, &point.kernels).expect("restrict"),
            machine,
            CostModel::Hierarchical,
        );
        for s in &samples {
            d.choose(&s.problem).expect("a schedule for every sample");
        }
    }
    let d = Dispatcher::new(
        t.clone(),
        restrict(&fam, &chosen.kernels).unwrap(),
        machine,
        CostModel::Hierarchical,
    );
    for s in &samples {
        let Problem { batch, m, n, k, b, .. } = s.problem;
        let a: Vec<f32> = (0..batch * m * k).map(|i| (i % 7) as f32 - 3.0).collect();
        let bd: Vec<f32> = (0..batch * k * n).map(|i| (i % 5) as f32 - 2.0).collect();
        let mut c = vec![f32::NAN; batch * m * n];
        let packed: Vec<_> = match b {
            BLayout::Packed { nr, kc } => (0..batch)
                .map(|e| {
                    anyshape_kernels::PackedB::new(MatRef::row_major(&bd[e * k * n..], k, n).unwrap(), nr, kc)
                })
                .collect(),
            _ => Vec::new(),
        };
        let bv: Vec<BOperand> = (0..batch)
            .map(|e| match b {
                BLayout::Packed { .. } => BOperand::Packed(&packed[e]),
                BLayout::RowMajor => BOperand::Plain(MatRef::row_major(&bd[e * k * n..], k, n).unwrap()),
                BLayout::Strided => BOperand::Plain(MatRef::row_major(&bd[e * k * n..], n, k).unwrap().t()),
            })
            .collect();
        let av: Vec<MatRef> = (0..batch).map(|e| MatRef::row_major(&a[e * m * k..], m, k).unwrap()).collect();
        let cv: Vec<MatMut> = c.chunks_mut(m * n).map(|ch| MatMut::new(ch, m, n, n).unwrap()).collect();
        d.batched(&pool, &av, &bv, cv, &EpilogueArgs::default()).expect("run");
        for e in 0..batch {
            for i in 0..m {
                for j in 0..n {
                    let bat = |q: usize| match b {
                        BLayout::Strided => bd[e * k * n + j * k + q],
                        _ => bd[e * k * n + q * n + j],
                    };
                    let want: f32 = (0..k).map(|q| a[e * m * k + i * k + q] * bat(q)).sum();
                    assert_eq!(c[e * m * n + i * n + j], want, "{:?} [{e}][{i},{j}]", s.problem);
                }
            }
        }
    }
}

#[test]
fn bad_samples_are_errors() {
    let (t, machine, _) = setup();
    let fam = family();
    assert!(categorize(&t, &machine, CostModel::Hierarchical, &fam, &[]).is_err());
    let mut s = samples();
    s[0].weight = 0.0;
    assert!(categorize(&t, &machine, CostModel::Hierarchical, &fam, &s).is_err());
    // A weight packed for a width the family lacks has no schedule.
    let mut s = samples();
    s[0].problem.b = BLayout::Packed { nr: 16, kc: 16 };
    assert!(categorize(&t, &machine, CostModel::Hierarchical, &fam, &s).is_err());
}
