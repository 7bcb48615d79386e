//! Trust-region Bayesian optimization (TuRBO-m, Eriksson et al. 2019) over a
//! discrete, hardware-aligned configuration space, as TSCompiler §5.1 uses it to
//! tune tile sizes by measuring real runs. The module knows nothing about what
//! it tunes: it minimizes a cost over integer-valued axes.
//!
//! Why trust regions: tuning costs are only *locally* smooth (a good tiling has
//! good neighbours, the landscape as a whole is multimodal), so each region fits
//! a small Gaussian process to its neighbourhood, where the GP is accurate, and
//! Thompson sampling across the regions plays a multi-armed bandit between them.
//! Every axis maps to [0, 1] by index position, so the GP works on the unit cube
//! whatever the values (64..512, a thread count, a loop-order tag).

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::Arc;

use nalgebra::{Cholesky, DMatrix, DVector, Dyn};
use rand::rngs::StdRng;
use rand::{Rng, RngExt, SeedableRng};
use rand_distr::StandardNormal;

/// Errors from building a search space or feeding measurements back.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SearchError {
    #[error("the search space has no axes")]
    NoAxes,
    #[error("axis `{0}` has no values")]
    EmptyAxis(String),
    #[error("the values of axis `{0}` are not sorted and distinct")]
    UnsortedAxis(String),
    #[error("no point of the search space passes the validity predicate")]
    NoValidPoint,
    #[error("invalid options: {0}")]
    Options(&'static str),
    #[error("point {0:?} has the wrong number of coordinates, is off the grid, or is invalid")]
    InvalidPoint(Vec<i64>),
    #[error("{points} points but {costs} costs")]
    CostCount { points: usize, costs: usize },
    #[error("point {0:?} was already measured")]
    AlreadyMeasured(Vec<i64>),
}

/// A tuning parameter and its allowed values, sorted and distinct.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Axis {
    pub name: String,
    pub values: Vec<i64>,
}

impl Axis {
    pub fn new(name: impl Into<String>, values: Vec<i64>) -> Self {
        Axis { name: name.into(), values }
    }
}

/// Grids up to this many points are listed once, so that sampling a fresh point
/// and noticing exhaustion are exact; larger ones are sampled by rejection.
const LIST_LIMIT: usize = 1 << 18;

type Predicate = Arc<dyn Fn(&[i64]) -> bool + Send + Sync>;

/// The grid of all axis values, pruned by a validity predicate (the
/// hardware-aware pruning: alignment, cache or register capacity).
#[derive(Clone)]
pub struct SearchSpace {
    axes: Vec<Axis>,
    valid: Predicate,
    /// Every valid point as axis indices, when the grid is at most `LIST_LIMIT`.
    listed: Option<Arc<Vec<Vec<usize>>>>,
}

impl fmt::Debug for SearchSpace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let listed = self.listed.as_ref().map(|l| l.len());
        f.debug_struct("SearchSpace").field("axes", &self.axes).field("listed", &listed).finish()
    }
}

impl SearchSpace {
    /// Fails on no axes, an empty or unsorted axis, or (for a listable grid) no
    /// valid point at all.
    pub fn new(
        axes: Vec<Axis>,
        valid: impl Fn(&[i64]) -> bool + Send + Sync + 'static,
    ) -> Result<Self, SearchError> {
        if axes.is_empty() {
            return Err(SearchError::NoAxes);
        }
        for axis in &axes {
            if axis.values.is_empty() {
                return Err(SearchError::EmptyAxis(axis.name.clone()));
            }
            if axis.values.windows(2).any(|w| w[0] >= w[1]) {
                return Err(SearchError::UnsortedAxis(axis.name.clone()));
            }
        }
        let mut space = SearchSpace { axes, valid: Arc::new(valid), listed: None };
        if space.size() <= LIST_LIMIT {
            let mut all = Vec::new();
            let mut idx = vec![0; space.dims()];
            'grid: loop {
                if space.valid_index(&idx) {
                    all.push(idx.clone());
                }
                for (d, i) in idx.iter_mut().enumerate() {
                    *i += 1;
                    if *i < space.axes[d].values.len() {
                        continue 'grid;
                    }
                    *i = 0;
                }
                break;
            }
            if all.is_empty() {
                return Err(SearchError::NoValidPoint);
            }
            space.listed = Some(Arc::new(all));
        }
        Ok(space)
    }

    pub fn axes(&self) -> &[Axis] {
        &self.axes
    }

    pub fn dims(&self) -> usize {
        self.axes.len()
    }

    /// Grid points before pruning (saturating).
    pub fn size(&self) -> usize {
        self.axes.iter().fold(1usize, |n, a| n.saturating_mul(a.values.len()))
    }

    /// Valid points, when the grid is small enough to list them.
    pub fn valid_count(&self) -> Option<usize> {
        self.listed.as_ref().map(|l| l.len())
    }

    pub fn is_valid(&self, point: &[i64]) -> bool {
        self.index_of(point).is_some_and(|idx| self.valid_index(&idx))
    }

    fn valid_index(&self, idx: &[usize]) -> bool {
        (self.valid)(&self.values(idx))
    }

    fn values(&self, idx: &[usize]) -> Vec<i64> {
        idx.iter().zip(&self.axes).map(|(&i, a)| a.values[i]).collect()
    }

    /// Axis indices of a point exactly on the grid.
    fn index_of(&self, point: &[i64]) -> Option<Vec<usize>> {
        if point.len() != self.dims() {
            return None;
        }
        point.iter().zip(&self.axes).map(|(v, a)| a.values.binary_search(v).ok()).collect()
    }

    /// Nearest grid value per axis (ties to the smaller one).
    fn snap(&self, point: &[i64]) -> Vec<usize> {
        let near = |a: &Axis, v: i64| match a.values.binary_search(&v) {
            Ok(i) => i,
            Err(0) => 0,
            Err(i) if i == a.values.len() => i - 1,
            Err(i) => i - usize::from(v - a.values[i - 1] <= a.values[i] - v),
        };
        point.iter().zip(&self.axes).map(|(&v, a)| near(a, v)).collect()
    }

    fn unit(&self, idx: &[usize]) -> Vec<f64> {
        let pos = |i: usize, a: &Axis| {
            if a.values.len() > 1 {
                i as f64 / (a.values.len() - 1) as f64
            } else {
                0.0
            }
        };
        idx.iter().zip(&self.axes).map(|(&i, a)| pos(i, a)).collect()
    }

    fn snap_unit(&self, u: &[f64]) -> Vec<usize> {
        let near = |x: f64, a: &Axis| {
            ((x * (a.values.len() - 1) as f64).round().max(0.0) as usize).min(a.values.len() - 1)
        };
        u.iter().zip(&self.axes).map(|(&x, a)| near(x, a)).collect()
    }
}

/// Matérn-5/2 correlation at distance `r` for length scale `l` (signal variance 1).
fn matern52(r: f64, l: f64) -> f64 {
    let s = 5f64.sqrt() * r / l;
    (1.0 + s + s * s / 3.0) * (-s).exp()
}

fn dist(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum::<f64>().sqrt()
}

/// Cholesky factor of a symmetric matrix, adding growing jitter to the diagonal
/// when rounding makes a near-singular one (duplicate points, exact
/// interpolation) fail, rather than crashing.
fn cholesky(m: &DMatrix<f64>) -> Cholesky<f64, Dyn> {
    let n = m.nrows();
    let scale = (m.diagonal().abs().sum() / n.max(1) as f64).max(1e-12);
    for jitter in [0.0, 1e-10, 1e-8, 1e-6, 1e-4, 1e-2, 1.0] {
        let mut a = m.clone();
        for i in 0..n {
            a[(i, i)] += jitter * scale;
        }
        if let Some(c) = Cholesky::new(a) {
            return c;
        }
    }
    // Only non-finite entries get here; an uninformative factor keeps going.
    Cholesky::new(DMatrix::identity(n, n) * scale).expect("a positive multiple of the identity")
}

/// Length scales tried when fitting (unit-cube units).
pub const LENGTH_GRID: [f64; 6] = [0.05, 0.1, 0.2, 0.4, 0.8, 1.6];
/// Noise variances tried when fitting (standardized-cost units).
pub const NOISE_GRID: [f64; 4] = [1e-6, 1e-4, 1e-2, 1e-1];

/// A Gaussian process with an isotropic Matérn-5/2 kernel over unit-cube
/// points, on costs standardized to mean 0 and variance 1 (signal variance is
/// then fixed at 1). Means and variances are reported in cost units.
#[derive(Debug, Clone)]
pub struct GaussianProcess {
    x: Vec<Vec<f64>>,
    chol: Cholesky<f64, Dyn>,
    alpha: DVector<f64>,
    mean: f64,
    scale: f64,
    length: f64,
    noise: f64,
    lml: f64,
}

impl GaussianProcess {
    /// Fits with the length scale and noise of `LENGTH_GRID` × `NOISE_GRID` that
    /// maximize the log marginal likelihood: a grid is robust on the handful of
    /// points a region holds, where gradient ascent is not.
    ///
    /// # Panics
    /// If `x` is empty, `x` and `y` differ in length, or a cost is not finite.
    pub fn fit(x: &[Vec<f64>], y: &[f64]) -> Self {
        let fits = LENGTH_GRID.iter().flat_map(|&l| NOISE_GRID.iter().map(move |&n| (l, n)));
        fits.map(|(l, n)| Self::fit_with(x, y, l, n))
            .reduce(|a, b| if b.lml > a.lml { b } else { a })
            .expect("non-empty grid")
    }

    /// Fits with a given length scale and noise variance. Panics as [`Self::fit`].
    pub fn fit_with(x: &[Vec<f64>], y: &[f64], length: f64, noise: f64) -> Self {
        assert!(!x.is_empty() && x.len() == y.len(), "GP needs as many costs as points, at least one");
        assert!(y.iter().all(|v| v.is_finite()), "GP costs must be finite");
        let n = y.len();
        let mean = y.iter().sum::<f64>() / n as f64;
        let std = (y.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64).sqrt();
        // Constant costs: keep them at 0 rather than dividing by zero.
        let scale = if std > 1e-12 * mean.abs().max(1.0) { std } else { 1.0 };
        let z = DVector::from_iterator(n, y.iter().map(|v| (v - mean) / scale));
        let k = DMatrix::from_fn(n, n, |i, j| {
            matern52(dist(&x[i], &x[j]), length) + if i == j { noise } else { 0.0 }
        });
        let chol = cholesky(&k);
        let alpha = chol.solve(&z);
        let log_det: f64 = chol.l_dirty().diagonal().iter().map(|d| d.ln()).sum();
        let lml = -0.5 * z.dot(&alpha) - log_det - 0.5 * n as f64 * (2.0 * std::f64::consts::PI).ln();
        GaussianProcess { x: x.to_vec(), chol, alpha, mean, scale, length, noise, lml }
    }

    pub fn length_scale(&self) -> f64 {
        self.length
    }

    pub fn noise(&self) -> f64 {
        self.noise
    }

    pub fn log_marginal_likelihood(&self) -> f64 {
        self.lml
    }

    /// Posterior mean and variance (of the latent cost, without noise) at `x`.
    pub fn predict(&self, x: &[f64]) -> (f64, f64) {
        let p = self.posterior(&[x.to_vec()]);
        (p.mean[0], p.var[0])
    }

    /// The joint posterior over `xs`, for Thompson sampling.
    pub fn posterior(&self, xs: &[Vec<f64>]) -> Posterior {
        let (n, c) = (self.x.len(), xs.len());
        let ks = DMatrix::from_fn(n, c, |i, j| matern52(dist(&self.x[i], &xs[j]), self.length));
        let mean = ks.tr_mul(&self.alpha);
        let v = self.chol.l_dirty().solve_lower_triangular(&ks).unwrap_or_else(|| DMatrix::zeros(n, c));
        let cov = DMatrix::from_fn(c, c, |i, j| matern52(dist(&xs[i], &xs[j]), self.length)) - v.tr_mul(&v);
        let var = cov.diagonal().map(|s| s.max(0.0) * self.scale * self.scale);
        let mean = mean.map(|m| self.mean + self.scale * m);
        Posterior { mean, var, cov, factor: None, scale: self.scale }
    }
}

/// A joint Gaussian posterior over a set of points, in cost units.
#[derive(Debug, Clone)]
pub struct Posterior {
    mean: DVector<f64>,
    var: DVector<f64>,
    cov: DMatrix<f64>,
    factor: Option<DMatrix<f64>>,
    scale: f64,
}

impl Posterior {
    pub fn mean(&self) -> &[f64] {
        self.mean.as_slice()
    }

    pub fn variance(&self) -> &[f64] {
        self.var.as_slice()
    }

    /// One joint draw `mean + L·z` (L the Cholesky factor of the covariance
    /// plus jitter, factored on first use): correlated values, so that the
    /// minimizer of the draw is a sample of where the minimum lies.
    pub fn sample<R: Rng + ?Sized>(&mut self, rng: &mut R) -> Vec<f64> {
        let c = self.mean.len();
        let l = self.factor.get_or_insert_with(|| {
            let jittered = &self.cov + DMatrix::identity(c, c) * 1e-8;
            cholesky(&jittered).unpack() * self.scale
        });
        let z = DVector::from_iterator(c, (0..c).map(|_| rng.sample::<f64, _>(StandardNormal)));
        (&self.mean + &*l * z).iter().copied().collect()
    }
}

/// Trust-region settings. `Default` follows TuRBO where it applies.
#[derive(Debug, Clone, PartialEq)]
pub struct TrustRegionOptions {
    /// Concurrent trust regions (TuRBO-m's m).
    pub regions: usize,
    /// Points returned per `ask`.
    pub batch: usize,
    /// Side of a fresh region, in unit-cube units: TuRBO's 0.8 (±0.4 around
    /// the centre) by default.
    pub base_length: f64,
    /// A region shrunk below this restarts elsewhere.
    pub min_length: f64,
    pub max_length: f64,
    /// Consecutive improving rounds of a region before its side doubles.
    pub success_tolerance: usize,
    /// Consecutive failing rounds (of those the region got points in) before
    /// its side halves. `None` is TuRBO's rule, about max(4, d) evaluations
    /// without progress, with the batch shared between the regions:
    /// `ceil(max(4, d) * regions / batch)` (TuRBO's `ceil(max(4, d) / batch)`
    /// halves a region that got one point in each of its last rounds too soon).
    pub failure_tolerance: Option<usize>,
    /// Points sampled in a region's box for each Thompson draw.
    pub candidates: usize,
    pub seed: u64,
}

impl Default for TrustRegionOptions {
    fn default() -> Self {
        TrustRegionOptions {
            regions: 3,
            batch: 4,
            base_length: 0.8,
            min_length: 0.0625,
            max_length: 1.6,
            success_tolerance: 3,
            failure_tolerance: None,
            candidates: 256,
            seed: 0,
        }
    }
}

/// One measurement, with the region that proposed it (`None`: told unasked).
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    pub point: Vec<i64>,
    pub cost: f64,
    pub region: Option<usize>,
}

#[derive(Debug, Clone)]
struct Region {
    /// The incumbent, or the start point while `best` is `None`.
    center: Vec<usize>,
    best: Option<f64>,
    length: f64,
    successes: usize,
    failures: usize,
    /// Bumped on restart, so that late results of an old run are not credited.
    generation: usize,
}

/// Ask/tell trust-region Bayesian optimization (TuRBO-m) over a [`SearchSpace`].
///
/// Non-finite costs (a run that crashed or timed out) are accepted: they stay in
/// the history as given, never become the best, count as a failure for their
/// region, and enter the surrogate as the worst cost of its neighbourhood.
#[derive(Debug)]
pub struct TrustRegionSearch {
    space: SearchSpace,
    opts: TrustRegionOptions,
    failure_tolerance: usize,
    rng: StdRng,
    regions: Vec<Region>,
    /// Unused caller-supplied start points, in the caller's order, for restarts.
    spare: VecDeque<Vec<usize>>,
    history: Vec<Evaluation>,
    measured: HashMap<Vec<usize>, usize>,
    /// Asked but not yet told: proposing region and its generation.
    pending: HashMap<Vec<usize>, (usize, usize)>,
    restarts: usize,
}

/// Training points kept per local GP (the nearest to the centre).
const MAX_TRAIN: usize = 128;

impl TrustRegionSearch {
    /// Regions start on the `initial` points in order (the caller's
    /// hardware-aligned picks, best first); extra ones are used for restarts
    /// before random points, and missing ones are random valid points. An
    /// off-grid coordinate is snapped to the nearest axis value; a point that is
    /// then invalid is an error, as it signals a caller bug.
    pub fn new(
        space: SearchSpace,
        initial: Vec<Vec<i64>>,
        opts: TrustRegionOptions,
    ) -> Result<Self, SearchError> {
        if opts.regions == 0 || opts.batch == 0 || opts.candidates == 0 {
            return Err(SearchError::Options("regions, batch and candidates must be positive"));
        }
        if !(0.0 < opts.min_length
            && opts.min_length <= opts.base_length
            && opts.base_length <= opts.max_length)
        {
            return Err(SearchError::Options("need 0 < min_length <= base_length <= max_length"));
        }
        let mut spare = VecDeque::new();
        for p in &initial {
            let idx = (p.len() == space.dims()).then(|| space.snap(p));
            match idx {
                Some(idx) if space.valid_index(&idx) => {
                    if !spare.contains(&idx) {
                        spare.push_back(idx)
                    }
                }
                _ => return Err(SearchError::InvalidPoint(p.clone())),
            }
        }
        let d = space.dims();
        let default_tolerance = (4.max(d) * opts.regions).div_ceil(opts.batch);
        let failure_tolerance = opts.failure_tolerance.unwrap_or(default_tolerance).max(1);
        let mut search = TrustRegionSearch {
            rng: StdRng::seed_from_u64(opts.seed),
            space,
            failure_tolerance,
            regions: Vec::new(),
            spare,
            history: Vec::new(),
            measured: HashMap::new(),
            pending: HashMap::new(),
            restarts: 0,
            opts,
        };
        for _ in 0..search.opts.regions {
            let Some(center) = search.fresh_point() else { break };
            let length = search.opts.base_length;
            let region = Region { center, best: None, length, successes: 0, failures: 0, generation: 0 };
            search.regions.push(region);
        }
        if search.regions.is_empty() {
            return Err(SearchError::NoValidPoint);
        }
        Ok(search)
    }

    pub fn space(&self) -> &SearchSpace {
        &self.space
    }

    pub fn evaluations(&self) -> usize {
        self.history.len()
    }

    /// Every measurement told, in order.
    pub fn history(&self) -> &[Evaluation] {
        &self.history
    }

    /// The failure tolerance in use (resolved from the options).
    pub fn failure_tolerance(&self) -> usize {
        self.failure_tolerance
    }

    /// Current side of each region (unit-cube units).
    pub fn lengths(&self) -> Vec<f64> {
        self.regions.iter().map(|r| r.length).collect()
    }

    /// Restarts so far, over all regions.
    pub fn restarts(&self) -> usize {
        self.restarts
    }

    /// The cheapest finite measurement.
    pub fn best(&self) -> Option<(Vec<i64>, f64)> {
        let finite = self.history.iter().filter(|e| e.cost.is_finite());
        finite.min_by(|a, b| a.cost.total_cmp(&b.cost)).map(|e| (e.point.clone(), e.cost))
    }

    /// Measured, asked, or the pending start point of a region.
    fn claimed(&self, idx: &[usize]) -> bool {
        self.measured.contains_key(idx)
            || self.pending.contains_key(idx)
            || self.regions.iter().any(|r| r.best.is_none() && r.center == idx)
    }

    /// A valid, unclaimed start point: a spare initial point, else a random one.
    fn fresh_point(&mut self) -> Option<Vec<usize>> {
        while let Some(idx) = self.spare.pop_front() {
            if !self.claimed(&idx) {
                return Some(idx);
            }
        }
        if let Some(listed) = self.space.listed.clone() {
            let free: Vec<&Vec<usize>> = listed.iter().filter(|i| !self.claimed(i)).collect();
            return (!free.is_empty()).then(|| free[self.rng.random_range(0..free.len())].clone());
        }
        for _ in 0..10_000 {
            let idx: Vec<usize> =
                self.space.axes.iter().map(|a| self.rng.random_range(0..a.values.len())).collect();
            if !self.claimed(&idx) && self.space.valid_index(&idx) {
                return Some(idx);
            }
        }
        None
    }

    /// Start region `r` afresh (TuRBO discards its local run; the history keeps
    /// it). With no fresh point left it restarts in place, at its incumbent.
    fn restart(&mut self, r: usize) {
        self.restarts += 1;
        let fresh = self.fresh_point();
        let region = &mut self.regions[r];
        region.generation += 1;
        (region.length, region.successes, region.failures) = (self.opts.base_length, 0, 0);
        match fresh {
            Some(center) => (region.center, region.best) = (center, None),
            // A failed start point and nothing else left: an incumbent none can lose to.
            None => region.best = Some(region.best.unwrap_or(f64::INFINITY)),
        }
    }

    /// Distinct valid unclaimed points in the region's box, snapped to the grid.
    /// A box with none is doubled (for sampling only) up to the whole cube, and
    /// a listed space finally falls back on its unmeasured points.
    fn candidates(&mut self, center: &[f64], length: f64, chosen: &HashSet<Vec<usize>>) -> Vec<Vec<usize>> {
        let mut half = length / 2.0;
        let mut seen = HashSet::new();
        loop {
            for _ in 0..self.opts.candidates {
                let u: Vec<f64> = center
                    .iter()
                    .map(|&c| {
                        let (lo, hi) = ((c - half).max(0.0), (c + half).min(1.0));
                        lo + (hi - lo) * self.rng.random::<f64>()
                    })
                    .collect();
                let idx = self.space.snap_unit(&u);
                if !seen.contains(&idx)
                    && !chosen.contains(&idx)
                    && !self.claimed(&idx)
                    && self.space.valid_index(&idx)
                {
                    seen.insert(idx);
                }
            }
            if !seen.is_empty() || half >= 1.0 {
                break;
            }
            half *= 2.0;
        }
        let mut out: Vec<Vec<usize>> = seen.into_iter().collect();
        if out.is_empty() {
            if let Some(listed) = self.space.listed.clone() {
                out = listed.iter().filter(|i| !chosen.contains(*i) && !self.claimed(i)).cloned().collect();
            }
        }
        // HashSet order is not seeded: sort, then thin at random, to stay deterministic.
        out.sort();
        while out.len() > self.opts.candidates {
            let k = self.rng.random_range(0..out.len());
            out.swap_remove(k);
        }
        out
    }

    /// The local GP of a region: measurements inside its box (any region's:
    /// none is wasted), at most `MAX_TRAIN` nearest the centre, which is always
    /// among them. Non-finite costs enter as the worst finite one.
    fn local_gp(&self, center: &[f64], length: f64) -> GaussianProcess {
        let mut near: Vec<(f64, Vec<f64>, f64)> = self
            .history
            .iter()
            .filter_map(|e| {
                let u = self.space.unit(&self.space.index_of(&e.point)?);
                let inf_dist = u.iter().zip(center).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
                (inf_dist <= length / 2.0 + 1e-9).then(|| (dist(&u, center), u, e.cost))
            })
            .collect();
        near.sort_by(|a, b| a.0.total_cmp(&b.0));
        near.truncate(MAX_TRAIN);
        let worst = near.iter().map(|n| n.2).filter(|c| c.is_finite()).fold(f64::NEG_INFINITY, f64::max);
        let worst = if worst.is_finite() { worst } else { 0.0 };
        let y: Vec<f64> = near.iter().map(|n| if n.2.is_finite() { n.2 } else { worst }).collect();
        let x: Vec<Vec<f64>> = near.into_iter().map(|n| n.1).collect();
        GaussianProcess::fit(&x, &y)
    }

    /// Next batch: regions awaiting their start point propose it; then each slot
    /// goes to the minimizer, over all regions, of a fresh joint Thompson draw of
    /// each region's GP over its candidates. Fewer (or no) points when the space
    /// runs out, or while every region waits for its start point to be told.
    pub fn ask(&mut self) -> Vec<Vec<i64>> {
        let mut batch: Vec<(Vec<usize>, usize)> = Vec::new();
        let mut chosen = HashSet::new();
        for r in 0..self.regions.len() {
            // A start point measured meanwhile (told unasked) is adopted.
            while self.regions[r].best.is_none() && self.measured.contains_key(&self.regions[r].center) {
                let cost = self.history[self.measured[&self.regions[r].center]].cost;
                if cost.is_finite() {
                    self.regions[r].best = Some(cost);
                } else {
                    self.restart(r);
                }
            }
            let region = &self.regions[r];
            if region.best.is_none()
                && !self.pending.contains_key(&region.center)
                && batch.len() < self.opts.batch
            {
                chosen.insert(region.center.clone());
                batch.push((region.center.clone(), r));
            }
        }
        let mut arms = Vec::new();
        for r in 0..self.regions.len() {
            if self.regions[r].best.is_none() || batch.len() >= self.opts.batch {
                continue;
            }
            let (center, length) = (self.space.unit(&self.regions[r].center), self.regions[r].length);
            let cands = self.candidates(&center, length, &chosen);
            if !cands.is_empty() {
                let units: Vec<Vec<f64>> = cands.iter().map(|c| self.space.unit(c)).collect();
                arms.push((r, self.local_gp(&center, length).posterior(&units), cands));
            }
        }
        while batch.len() < self.opts.batch {
            let mut pick: Option<(f64, usize, usize)> = None;
            for (a, (_, post, cands)) in arms.iter_mut().enumerate() {
                let draw = post.sample(&mut self.rng);
                let open = (0..cands.len()).filter(|&i| !chosen.contains(&cands[i]));
                if let Some(i) = open.min_by(|&i, &j| draw[i].total_cmp(&draw[j])) {
                    if pick.is_none_or(|(v, _, _)| draw[i] < v) {
                        pick = Some((draw[i], a, i));
                    }
                }
            }
            let Some((_, a, i)) = pick else { break };
            chosen.insert(arms[a].2[i].clone());
            batch.push((arms[a].2[i].clone(), arms[a].0));
        }
        for (idx, r) in &batch {
            self.pending.insert(idx.clone(), (*r, self.regions[*r].generation));
        }
        batch.into_iter().map(|(idx, _)| self.space.values(&idx)).collect()
    }

    /// Records measurements (asked or not) and updates the proposing regions:
    /// a round that beats the region's best by more than 0.1% is a success,
    /// otherwise a failure; `success_tolerance` successes in a row double the
    /// side, `failure_tolerance` failures halve it, below `min_length` the
    /// region restarts. Nothing is recorded if any point is rejected.
    pub fn tell(&mut self, points: &[Vec<i64>], costs: &[f64]) -> Result<(), SearchError> {
        if points.len() != costs.len() {
            return Err(SearchError::CostCount { points: points.len(), costs: costs.len() });
        }
        let mut idxs: Vec<Vec<usize>> = Vec::with_capacity(points.len());
        for p in points {
            let idx = self.space.index_of(p).filter(|i| self.space.valid_index(i));
            let idx = idx.ok_or_else(|| SearchError::InvalidPoint(p.clone()))?;
            if self.measured.contains_key(&idx) || idxs.contains(&idx) {
                return Err(SearchError::AlreadyMeasured(p.clone()));
            }
            idxs.push(idx);
        }
        let mut rounds: Vec<Vec<(Vec<usize>, f64)>> = vec![Vec::new(); self.regions.len()];
        for ((idx, p), &cost) in idxs.into_iter().zip(points).zip(costs) {
            let from = self.pending.remove(&idx);
            if let Some((r, generation)) = from {
                if generation == self.regions[r].generation {
                    rounds[r].push((idx.clone(), cost));
                }
            }
            self.measured.insert(idx, self.history.len());
            self.history.push(Evaluation { point: p.clone(), cost, region: from.map(|f| f.0) });
        }
        for (r, round) in rounds.into_iter().enumerate() {
            let finite = round.into_iter().filter(|(_, c)| c.is_finite());
            let Some((idx, cost)) = finite.min_by(|a, b| a.1.total_cmp(&b.1)) else {
                match self.regions[r].best {
                    // Its start point failed to run: start elsewhere.
                    None if self.measured.contains_key(&self.regions[r].center) => self.restart(r),
                    Some(_) => self.fail(r),
                    None => {}
                }
                continue;
            };
            let region = &mut self.regions[r];
            let Some(best) = region.best else {
                (region.center, region.best) = (idx, Some(cost));
                continue;
            };
            if cost < best {
                (region.center, region.best) = (idx, Some(cost));
            }
            if cost < best - 1e-3 * best.abs() {
                (region.successes, region.failures) = (region.successes + 1, 0);
                if region.successes >= self.opts.success_tolerance {
                    region.length = (2.0 * region.length).min(self.opts.max_length);
                    region.successes = 0;
                }
            } else {
                self.fail(r);
            }
        }
        Ok(())
    }

    fn fail(&mut self, r: usize) {
        let region = &mut self.regions[r];
        (region.successes, region.failures) = (0, region.failures + 1);
        if region.failures >= self.failure_tolerance {
            (region.length, region.failures) = (region.length / 2.0, 0);
            if region.length < self.opts.min_length {
                self.restart(r);
            }
        }
    }
}

/// What [`minimize`] found.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchOutcome {
    /// The cheapest finite measurement.
    pub best: Option<(Vec<i64>, f64)>,
    pub history: Vec<Evaluation>,
    /// The space ran out before the budget did.
    pub exhausted: bool,
}

/// Failure of [`minimize`]: a bad space or start, or the cost function's error.
#[derive(Debug, thiserror::Error)]
pub enum MinimizeError<E> {
    #[error(transparent)]
    Search(#[from] SearchError),
    #[error("cost function failed: {0}")]
    Cost(E),
}

/// Asks and tells until `budget` measurements or the space runs out. The first
/// round measures the regions' start points, i.e. the leading `initial` points.
pub fn minimize<E>(
    space: SearchSpace,
    initial: Vec<Vec<i64>>,
    options: TrustRegionOptions,
    budget: usize,
    mut f: impl FnMut(&[i64]) -> Result<f64, E>,
) -> Result<SearchOutcome, MinimizeError<E>> {
    let mut search = TrustRegionSearch::new(space, initial, options)?;
    let mut exhausted = false;
    while search.evaluations() < budget {
        let mut batch = search.ask();
        if batch.is_empty() {
            exhausted = true;
            break;
        }
        batch.truncate(budget - search.evaluations());
        let costs = batch.iter().map(|p| f(p)).collect::<Result<Vec<_>, E>>().map_err(MinimizeError::Cost)?;
        search.tell(&batch, &costs)?;
    }
    Ok(SearchOutcome { best: search.best(), history: search.history, exhausted })
}
