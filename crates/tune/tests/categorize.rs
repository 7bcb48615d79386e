//! DietCode's categorization over the analytical model: the trade-off curve runs
//! from the whole family down, never loses a sample, and the family picked within
//! a tolerance computes every sample right.

use kernels::{
    ALayout, BLayout, BOperand, CostModel, Dispatcher, EpilogueArgs, MatMut, MatRef, Problem, Target,
    ThreadPool,
};
use tune::categorize::{categorize, kernel_ids, pick, restrict, Sample};

// The kernels crate's test family (Rust micro-kernels), under the name its
// helpers use.
extern crate kernels as anyshape_kernels;

#[macro_use]
#[path = "../../kernels/tests/common/mod.rs"]
mod common;

/// The target, a fixed machine model (a measured one moves with the phases of a
/// shared machine, and the curve with it) and a pool.
fn setup() -> (Target, kernels::MachineModel, ThreadPool) {
    (common::small_target(), common::fixed_machine(2), ThreadPool::new(2))
}

fn samples() -> Vec<Sample> {
    let p = |batch, m, n, k, b| Problem { batch, m, n, k, a: ALayout::RowMajor, b };
    vec![
        Sample { problem: p(1, 37, 24, 50, BLayout::Packed { nr: 8, kc: 16 }), weight: 3.0 },
        Sample { problem: p(1, 5, 24, 50, BLayout::Packed { nr: 8, kc: 16 }), weight: 1.0 },
        Sample { problem: p(3, 7, 9, 13, BLayout::NMajor), weight: 2.0 },
        Sample { problem: p(2, 16, 16, 8, BLayout::Strided), weight: 1.0 },
    ]
}

#[test]
fn the_curve_runs_from_the_whole_family_down_and_serves_every_sample() {
    let (t, machine, pool) = setup();
    let fam = common::test_family();
    let samples = samples();
    let curve = categorize(&t, &machine, CostModel::Hierarchical, &fam, &samples).expect("curve");
    assert_eq!(curve[0].kernels, kernel_ids(&fam));
    assert!((curve[0].mean_slowdown - 1.0).abs() < 1e-12);
    for w in curve.windows(2) {
        assert_eq!(w[1].kernels.len() + 1, w[0].kernels.len());
        assert!(w[1].kernels.iter().all(|k| w[0].kernels.contains(k)));
    }
    // The packed weight fixes width 8: that width's kernels (packed, or direct ones
    // reading its panels) can never all go.
    let last = curve.last().expect("a point");
    assert!(last.kernels.iter().any(|k| k.nr == 8), "{:?}", last.kernels);
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
                .map(|e| kernels::PackedB::new(MatRef::row_major(&bd[e * k * n..], k, n).unwrap(), nr, kc))
                .collect(),
            _ => Vec::new(),
        };
        let bv: Vec<BOperand> = (0..batch)
            .map(|e| match b {
                BLayout::Packed { .. } => BOperand::Packed(&packed[e]),
                BLayout::NMajor => BOperand::Plain(MatRef::row_major(&bd[e * k * n..], k, n).unwrap()),
                BLayout::Strided | BLayout::KMajor => {
                    BOperand::Plain(MatRef::row_major(&bd[e * k * n..], n, k).unwrap().t())
                }
            })
            .collect();
        let av: Vec<MatRef> = (0..batch).map(|e| MatRef::row_major(&a[e * m * k..], m, k).unwrap()).collect();
        let mut cv: Vec<MatMut> = c.chunks_mut(m * n).map(|ch| MatMut::new(ch, m, n, n).unwrap()).collect();
        d.batched(&pool, &av, &bv, &mut cv, &EpilogueArgs::default()).expect("run");
        for e in 0..batch {
            for i in 0..m {
                for j in 0..n {
                    let bat = |q: usize| match b {
                        BLayout::Strided | BLayout::KMajor => bd[e * k * n + j * k + q],
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
    let fam = common::test_family();
    assert!(categorize(&t, &machine, CostModel::Hierarchical, &fam, &[]).is_err());
    let mut s = samples();
    s[0].weight = 0.0;
    assert!(categorize(&t, &machine, CostModel::Hierarchical, &fam, &s).is_err());
    // A weight packed for a width the family lacks has no schedule.
    let mut s = samples();
    s[0].problem.b = BLayout::Packed { nr: 16, kc: 16 };
    assert!(categorize(&t, &machine, CostModel::Hierarchical, &fam, &s).is_err());
}
