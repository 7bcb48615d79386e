//! Trust-region Bayesian optimization over a discrete space: the local GP
//! interpolates and survives degenerate data; ask/tell never proposes an
//! invalid, duplicate or measured point and exhausts a small space exactly; the
//! regions expand, shrink and restart as TuRBO prescribes; and on a multimodal
//! synthetic cost it finds the brute-force optimum far more reliably than random
//! search on the same budget.

use std::collections::HashSet;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tune::bayes::{
    minimize, Axis, GaussianProcess, MinimizeError, SearchError, SearchSpace, TrustRegionOptions,
    TrustRegionSearch,
};

fn pseudo(i: usize) -> f64 {
    ((i as f64 * 12.9898).sin() * 43758.5453).fract().abs()
}

#[test]
fn gp_interpolates_with_tiny_noise() {
    let x: Vec<Vec<f64>> = (0..10).map(|i| vec![0.5 * pseudo(2 * i), 0.5 * pseudo(2 * i + 1)]).collect();
    let y: Vec<f64> = x.iter().map(|p| 100.0 + 20.0 * (5.0 * p[0]).sin() - 30.0 * p[1] * p[1]).collect();
    let gp = GaussianProcess::fit_with(&x, &y, 0.4, 1e-6);
    let scale2 = {
        let m = y.iter().sum::<f64>() / y.len() as f64;
        y.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / y.len() as f64
    };
    for (p, &v) in x.iter().zip(&y) {
        let (mean, var) = gp.predict(p);
        assert!((mean - v).abs() < 1e-3, "mean {mean} vs observed {v}");
        assert!(var < 1e-4 * scale2, "variance {var} at a training point");
    }
    // Far from every training point (all lie in [0, 0.5]^2) the GP is unsure.
    let (_, far) = gp.predict(&[1.0, 1.0]);
    assert!(far > 0.3 * scale2, "variance {far} far away, prior {scale2}");
    // The grid fit picks something sensible and still tracks the data.
    let fitted = GaussianProcess::fit(&x, &y);
    assert!(fitted.log_marginal_likelihood().is_finite());
    for (p, &v) in x.iter().zip(&y) {
        assert!((fitted.predict(p).0 - v).abs() < 0.1 * scale2.sqrt());
    }
}

#[test]
fn gp_survives_duplicates_and_constant_costs() {
    let x = vec![vec![0.2, 0.3], vec![0.2, 0.3], vec![0.2, 0.3], vec![0.7, 0.1]];
    let y = [1.0, 1.5, 0.5, 3.0];
    for noise in [0.0, 1e-6] {
        let gp = GaussianProcess::fit_with(&x, &y, 0.4, noise);
        let (mean, var) = gp.predict(&[0.2, 0.3]);
        assert!(mean.is_finite() && var.is_finite() && (mean - 1.0).abs() < 0.1, "{mean} {var}");
    }
    let gp = GaussianProcess::fit(&x, &[2.0; 4]);
    let (mean, var) = gp.predict(&[0.5, 0.5]);
    assert!((mean - 2.0).abs() < 1e-9 && var.is_finite());
    let mut post = gp.posterior(&[vec![0.2, 0.3], vec![0.2, 0.31], vec![0.9, 0.9]]);
    let draw = post.sample(&mut StdRng::seed_from_u64(1));
    assert!(draw.iter().all(|v| v.is_finite()));
}

/// 4 x 5 grid minus 8 points: 12 valid points.
fn small_space() -> SearchSpace {
    let axes = vec![Axis::new("a", vec![1, 2, 3, 4]), Axis::new("b", vec![10, 20, 30, 40, 50])];
    SearchSpace::new(axes, |p| p[0] * p[1] <= 60 || p[1] <= 20).unwrap()
}

#[test]
fn small_space_is_measured_exactly_once_then_exhausted() {
    let space = small_space();
    assert_eq!(space.valid_count(), Some(12));
    let opts = TrustRegionOptions { batch: 3, candidates: 16, ..Default::default() };
    let mut search = TrustRegionSearch::new(space.clone(), vec![vec![4, 10]], opts.clone()).unwrap();
    let mut told = HashSet::new();
    for round in 0.. {
        let batch = search.ask();
        if batch.is_empty() {
            break;
        }
        assert!(batch.len() <= 3 && round < 12);
        for p in &batch {
            assert!(space.is_valid(p), "invalid {p:?}");
            assert!(told.insert(p.clone()), "{p:?} proposed twice");
        }
        let costs: Vec<f64> = batch.iter().map(|p| (p[0] - 2) as f64 * (p[1] - 30) as f64).collect();
        search.tell(&batch, &costs).unwrap();
    }
    assert_eq!(told.len(), 12);
    assert_eq!(search.history()[0].point, vec![4, 10], "the first region starts on the initial point");
    assert!(search.ask().is_empty() && search.ask().is_empty());

    let out = minimize(space, vec![], opts, 100, |p| Ok::<_, ()>((p[0] * p[1]) as f64)).unwrap();
    assert!(out.exhausted);
    assert_eq!(out.history.len(), 12);
    let distinct: HashSet<_> = out.history.iter().map(|e| e.point.clone()).collect();
    assert_eq!(distinct.len(), 12);
    assert_eq!(out.best, Some((vec![1, 10], 10.0)));
}

fn wide_space() -> SearchSpace {
    let axes = (0..3).map(|d| Axis::new(format!("x{d}"), (0..24).collect())).collect();
    SearchSpace::new(axes, |_| true).unwrap()
}

/// Drives one region with costs that always improve (or always worsen) and
/// returns its side after each round.
fn drive(opts: TrustRegionOptions, improving: bool, rounds: usize) -> (Vec<f64>, TrustRegionSearch) {
    let mut search = TrustRegionSearch::new(wide_space(), vec![vec![12, 12, 12]], opts).unwrap();
    let mut lengths = Vec::new();
    for _ in 0..rounds {
        let batch = search.ask();
        let n = search.evaluations() as f64;
        let costs: Vec<f64> =
            (0..batch.len()).map(|i| if improving { 1e3 - n - i as f64 } else { n }).collect();
        search.tell(&batch, &costs).unwrap();
        lengths.push(search.lengths()[0]);
    }
    (lengths, search)
}

#[test]
fn regions_expand_after_successes() {
    let opts = TrustRegionOptions { regions: 1, batch: 2, base_length: 0.4, ..Default::default() };
    let (lengths, _) = drive(opts, true, 10);
    // Round 1 measures the centre; then every 3 successes double the side, up to 1.6.
    assert_eq!(lengths, [0.4, 0.4, 0.4, 0.8, 0.8, 0.8, 1.6, 1.6, 1.6, 1.6]);
}

#[test]
fn regions_shrink_after_failures_and_restart() {
    let opts = TrustRegionOptions {
        regions: 1,
        batch: 2,
        base_length: 0.4,
        failure_tolerance: Some(2),
        seed: 7,
        ..Default::default()
    };
    let (lengths, search) = drive(opts, false, 9);
    // Every 2 failures halve the side; 0.05 < min_length 0.0625 restarts at 0.4.
    assert_eq!(lengths, [0.4, 0.4, 0.2, 0.2, 0.1, 0.1, 0.4, 0.4, 0.4]);
    assert_eq!(search.restarts(), 1);
    // The restarted region measured a fresh start point alone, away from the first.
    let h = search.history();
    assert_eq!(h.iter().filter(|e| e.point == [12, 12, 12]).count(), 1);
    assert!(h.iter().all(|e| e.region == Some(0)));
    // TuRBO's default failure tolerance, with the batch shared by the regions:
    // ceil(max(4, d) * regions / batch).
    let default = TrustRegionSearch::new(wide_space(), vec![], TrustRegionOptions::default()).unwrap();
    assert_eq!(default.failure_tolerance(), 3);
}

const OPT: [f64; 3] = [0.68, 0.27, 0.55];

/// A bowl with a ripple: several basins, the global one at `OPT` (unit cube).
fn ripple(p: &[i64]) -> f64 {
    let u = [(p[0] / 32 - 1) as f64 / 19.0, (p[1] / 16 - 1) as f64 / 17.0, (p[2] / 8 - 1) as f64 / 15.0];
    let d: Vec<f64> = u.iter().zip(OPT).map(|(a, b)| a - b).collect();
    let bowl: f64 = d.iter().map(|x| x * x).sum();
    let wave: f64 = d.iter().map(|x| 1.0 - (2.0 * std::f64::consts::PI * 2.0 * x).cos()).sum();
    2.0 + bowl + 0.1 * wave
}

/// Cache-block-like axes; the predicate drops about a third of the grid.
fn tiling_space() -> SearchSpace {
    let axes = vec![
        Axis::new("kc", (1..=20).map(|i| 32 * i).collect()),
        Axis::new("mc", (1..=18).map(|i| 16 * i).collect()),
        Axis::new("nc", (1..=16).map(|i| 8 * i).collect()),
    ];
    SearchSpace::new(axes, |p| p[0] * p[1] <= 48_000 && (p[0] + p[1] + p[2]) % 3 != 0).unwrap()
}

#[test]
fn beats_random_search_on_a_multimodal_cost() {
    let space = tiling_space();
    let listed: Vec<Vec<i64>> = {
        let axes = space.axes();
        let mut all = Vec::new();
        for &a in &axes[0].values {
            for &b in &axes[1].values {
                for &c in &axes[2].values {
                    if space.is_valid(&[a, b, c]) {
                        all.push(vec![a, b, c]);
                    }
                }
            }
        }
        all
    };
    let optimum = listed.iter().map(|p| ripple(p)).fold(f64::INFINITY, f64::min);
    let near = listed.iter().filter(|p| ripple(p) <= 1.02 * optimum).count();
    eprintln!("{} valid points, optimum {optimum:.4}, {near} within 2%", listed.len());
    // The premise: a narrow global basin (random search's 60 draws hit it ~15% of the time).
    assert!(listed.len() > 2000 && near <= 10);
    let budget = 60;
    let (mut hits, mut tr_sum, mut rs_sum) = (0, 0.0, 0.0);
    for seed in 0..5u64 {
        let opts = TrustRegionOptions { seed, ..Default::default() };
        let out = minimize(space.clone(), vec![], opts, budget, |p| Ok::<_, ()>(ripple(p))).unwrap();
        assert_eq!(out.history.len(), budget);
        let distinct: HashSet<_> = out.history.iter().map(|e| e.point.clone()).collect();
        assert_eq!(distinct.len(), budget);
        assert!(out.history.iter().all(|e| space.is_valid(&e.point)));
        let tr = out.best.unwrap().1;
        let mut rng = StdRng::seed_from_u64(seed);
        let mut drawn = HashSet::new();
        while drawn.len() < budget {
            drawn.insert(rng.random_range(0..listed.len()));
        }
        let rs = drawn.iter().map(|&i| ripple(&listed[i])).fold(f64::INFINITY, f64::min);
        eprintln!("seed {seed}: trust regions {tr:.4}, random {rs:.4}");
        hits += usize::from(tr <= 1.02 * optimum);
        (tr_sum, rs_sum) = (tr_sum + tr, rs_sum + rs);
    }
    assert!(hits >= 4, "only {hits} of 5 seeds within 2% of {optimum}");
    assert!(tr_sum < rs_sum, "mean best {} vs random {}", tr_sum / 5.0, rs_sum / 5.0);
    // Sharper than the above: picking at random inside the trust regions instead
    // of by Thompson sampling gets 3 of 5 seeds, with a mean 3% above the optimum.
    assert!(tr_sum / 5.0 <= 1.01 * optimum, "mean best {} vs optimum {optimum}", tr_sum / 5.0);
}

#[test]
fn same_seed_same_run() {
    let run = |seed| {
        let opts = TrustRegionOptions { seed, ..Default::default() };
        minimize(tiling_space(), vec![vec![320, 96, 72]], opts, 24, |p| Ok::<_, ()>(ripple(p)))
            .unwrap()
            .history
    };
    assert_eq!(run(3), run(3));
    assert_ne!(run(3), run(4));
    assert_eq!(run(3)[0].point, [320, 96, 72]);
}

#[test]
fn non_finite_costs_are_failures() {
    let opts = TrustRegionOptions { regions: 1, batch: 2, failure_tolerance: Some(1), ..Default::default() };
    let mut search = TrustRegionSearch::new(wide_space(), vec![vec![3, 3, 3]], opts).unwrap();
    let first = search.ask();
    search.tell(&first, &[5.0]).unwrap();
    let batch = search.ask();
    search.tell(&batch, &vec![f64::NAN; batch.len()]).unwrap();
    assert_eq!(search.lengths(), [0.4]);
    assert_eq!(search.best(), Some((vec![3, 3, 3], 5.0)));
    // A start point that fails to run restarts the region elsewhere.
    let opts = TrustRegionOptions { regions: 1, ..Default::default() };
    let mut search = TrustRegionSearch::new(wide_space(), vec![vec![3, 3, 3]], opts).unwrap();
    let first = search.ask();
    search.tell(&first, &[f64::INFINITY]).unwrap();
    assert_eq!(search.restarts(), 1);
    assert_eq!(search.best(), None);
    let next = search.ask();
    assert_eq!(next.len(), 1);
    assert_ne!(next[0], [3, 3, 3]);
}

#[test]
fn errors_are_reported_not_panicked() {
    let ok = |_: &[i64]| true;
    assert_eq!(SearchSpace::new(vec![], ok).unwrap_err(), SearchError::NoAxes);
    let empty = vec![Axis::new("kc", vec![])];
    assert_eq!(SearchSpace::new(empty, ok).unwrap_err(), SearchError::EmptyAxis("kc".into()));
    for bad in [vec![64, 32], vec![32, 32]] {
        let axes = vec![Axis::new("mc", bad)];
        assert_eq!(SearchSpace::new(axes, ok).unwrap_err(), SearchError::UnsortedAxis("mc".into()));
    }
    let none = SearchSpace::new(vec![Axis::new("nc", vec![8, 16])], |_| false);
    assert_eq!(none.unwrap_err(), SearchError::NoValidPoint);
    // Too large to list, nothing valid: found out by sampling.
    let big = (0..5).map(|d| Axis::new(format!("x{d}"), (0..20).collect())).collect();
    let big = SearchSpace::new(big, |_| false).unwrap();
    let err = TrustRegionSearch::new(big, vec![], TrustRegionOptions::default()).unwrap_err();
    assert_eq!(err, SearchError::NoValidPoint);

    let space = small_space();
    let opts = TrustRegionOptions::default();
    // Off-grid initial points snap to the nearest value; invalid ones are errors.
    let snapped = TrustRegionSearch::new(space.clone(), vec![vec![1, 14]], opts.clone()).unwrap().ask();
    assert_eq!(snapped[0], [1, 10]);
    let err = TrustRegionSearch::new(space.clone(), vec![vec![4, 50]], opts.clone()).unwrap_err();
    assert_eq!(err, SearchError::InvalidPoint(vec![4, 50]));
    assert!(TrustRegionSearch::new(space.clone(), vec![vec![1]], opts.clone()).is_err());
    let bad = TrustRegionOptions { batch: 0, ..Default::default() };
    assert!(matches!(TrustRegionSearch::new(space.clone(), vec![], bad), Err(SearchError::Options(_))));

    let mut search = TrustRegionSearch::new(space.clone(), vec![], opts.clone()).unwrap();
    let batch = search.ask();
    assert_eq!(search.tell(&batch, &[]), Err(SearchError::CostCount { points: batch.len(), costs: 0 }));
    assert_eq!(search.tell(&[vec![1, 15]], &[1.0]), Err(SearchError::InvalidPoint(vec![1, 15])));
    search.tell(&batch[..1], &[1.0]).unwrap();
    assert_eq!(search.tell(&batch[..1], &[1.0]), Err(SearchError::AlreadyMeasured(batch[0].clone())));
    assert_eq!(search.evaluations(), 1);

    let failing = minimize(space, vec![], opts, 10, |_| Err::<f64, _>("timer broke"));
    assert!(matches!(failing, Err(MinimizeError::Cost("timer broke"))));
}
