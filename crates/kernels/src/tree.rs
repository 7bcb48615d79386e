//! Dispatch by a decision tree distilled from the analytical model (BladeDISC
//! §5.2.2): the model ranks the candidates of a training sweep of shapes once,
//! offline; a small tree over the shape's extents then answers for any shape in
//! nanoseconds (no candidate generation, no ranking, no allocation), and is a
//! compact artefact that can be read, diffed and stored with a compiled model.
//!
//! Splits are `feature <= threshold` on `m`, `n`, `k`, `batch` and the work
//! `batch·m·n·k` (whether threads pay for their fork-join, which no one extent
//! tells), at the training samples' values: on a geometric sweep ([`sweep`]:
//! powers of two and one past each) these are log2-scale thresholds, and a cut
//! between `2^j` and `2^j + 1` separates whole tiles from a remainder, so an
//! unseen extent goes the way of the next training value above it.
//!
//! The tree is grown greedily (CART) to minimize the summed *relative* predicted
//! cost `cost(p, s) / best(p)` of the samples, so that a 1×1×1 product weighs as
//! much as a 4096³ one, then pruned. A leaf takes one of the training samples'
//! model choices: the one that loses least over the leaf's samples. Any sample's
//! choice may serve (not only those of the leaf's own samples), so that splitting
//! a set never costs more than leaving it whole.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::cost::{rule_grid, CostModel};
use crate::dispatch::Dispatcher;
use crate::gemm::LoopOrder;
use crate::schedule::{ALayout, BLayout, Operands, Problem, Schedule};
use crate::{Blocking, KernelError, ThreadGrid};

/// A shape extent a split tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Feature {
    M,
    N,
    K,
    Batch,
    /// `batch · m · n · k`: whether threads pay for their fork-join, which no one
    /// extent tells.
    Work,
}

impl Feature {
    pub const ALL: [Feature; 5] = [Feature::M, Feature::N, Feature::K, Feature::Batch, Feature::Work];

    pub fn of(&self, p: &Problem) -> usize {
        match self {
            Feature::M => p.m,
            Feature::N => p.n,
            Feature::K => p.k,
            Feature::Batch => p.batch,
            Feature::Work => p.batch.saturating_mul(p.m).saturating_mul(p.n).saturating_mul(p.k),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Feature::M => "m",
            Feature::N => "n",
            Feature::K => "k",
            Feature::Batch => "batch",
            Feature::Work => "work",
        }
    }
}

/// A node of the tree, stored in pre-order: a split's `<=` child follows it, and
/// its `>` child is at `gt` (always further on, so a walk only moves forward).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Node {
    Leaf(Schedule),
    Split { feature: Feature, threshold: usize, gt: usize },
}

/// How a tree is grown.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TreeOptions {
    /// Splits on the way from the root to a leaf, at most (and at most
    /// [`MAX_DEPTH`]).
    pub max_depth: usize,
    /// Training samples in each leaf, at least.
    pub min_samples: usize,
    /// The subtree under a split must lower the summed relative cost by at least
    /// this (0.01: a 1% slowdown of one sample), else it is pruned to a leaf. With
    /// 0 the tree grows until every leaf is the model's choice on all of its
    /// samples (or the depth or leaf size runs out).
    pub min_gain: f64,
}

/// The deepest tree [`DecisionTree::distill`] grows: far more than a dispatch
/// table needs, and a bound on its recursion.
pub const MAX_DEPTH: usize = 64;

impl Default for TreeOptions {
    fn default() -> TreeOptions {
        TreeOptions { max_depth: 8, min_samples: 2, min_gain: 0.01 }
    }
}

/// Maps a contraction's shape to one schedule, for one pair of operand layouts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawTree")]
pub struct DecisionTree {
    a: ALayout,
    b: BLayout,
    /// The model it was distilled from: a tile-only model's leaves get the rule of
    /// thumb's grid for the bound shape, as the model's own choice would.
    model: CostModel,
    /// The pool size the schedules are for.
    threads: usize,
    nodes: Vec<Node>,
}

/// A tree as stored, checked before it becomes a [`DecisionTree`] so that a walk
/// can neither leave the node list nor loop, and every leaf is a well-formed
/// schedule.
#[derive(Deserialize)]
struct RawTree {
    a: ALayout,
    b: BLayout,
    model: CostModel,
    threads: usize,
    nodes: Vec<Node>,
}

impl TryFrom<RawTree> for DecisionTree {
    type Error = KernelError;
    fn try_from(r: RawTree) -> Result<DecisionTree, KernelError> {
        let bad = |why: String| Err(KernelError::Shape(format!("a malformed decision tree: {why}")));
        if r.nodes.is_empty() || r.threads == 0 {
            return bad("no nodes or no threads".into());
        }
        for (i, node) in r.nodes.iter().enumerate() {
            match *node {
                Node::Split { gt, .. } if gt <= i + 1 || gt >= r.nodes.len() => {
                    return bad(format!("node {i} points to node {gt}"));
                }
                Node::Leaf(s) if !well_formed(&s) => return bad(format!("leaf {i} holds {s:?}")),
                _ => {}
            }
        }
        Ok(DecisionTree { a: r.a, b: r.b, model: r.model, threads: r.threads, nodes: r.nodes })
    }
}

/// A leaf's schedule as it runs `p`, as the candidate generator would have made
/// it for `p`: a block no deeper than K (all of K in one block, which the leaf's
/// deeper block from a deeper sample means too, and smaller panels), unless B is
/// packed for its depth; and for a model that ranks tiles only, the rule of
/// thumb's grid for `p`.
fn fit(mut s: Schedule, p: &Problem, model: CostModel, threads: usize) -> Schedule {
    if p.b.is_activation() {
        s.blocking.kc = s.blocking.kc.min(p.k.max(1));
    }
    if !model.ranks_grids() {
        s.grid = rule_grid(threads, p, s.mr, s.nr);
    }
    s
}

/// No zero tile, block or grid extent: what `choose` divides by, and what no
/// driver can run.
fn well_formed(s: &Schedule) -> bool {
    let (b, g) = (s.blocking, s.grid);
    s.mr > 0
        && s.nr > 0
        && s.cover_mr.is_none_or(|h| h > 0 && h < s.mr)
        && b.kc > 0
        && b.mc > 0
        && b.nc > 0
        && g.batch > 0
        && g.rows > 0
        && g.cols > 0
}

/// The model-predicted slowdown of a tree's choices against the model's own.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RegretStats {
    /// Mean of `cost(tree's choice) / cost(model's choice)` over the problems, each
    /// at least 1: a choice the model predicts cheaper than its own (one the
    /// generator would not offer) counts as a tie.
    pub mean: f64,
    pub max: f64,
    /// The fraction of problems within 5% of the model's choice.
    pub within_5pct: f64,
    pub problems: usize,
}

/// How much worse a cost is than the best, as a ratio `≥ 1` when it is worse.
/// Costs are seconds (positive) or, for SIA, negated positive scores: a ratio of
/// scores then. Never below 1: a schedule that is not a candidate of the sample
/// (another sample's `KC`, say) may look cheaper to the model, which does not see
/// what the generator's filters encode, and must not win on that.
fn relative(cost: f64, best: f64) -> f64 {
    let r = if best > 0.0 {
        cost / best
    } else if best < 0.0 && cost < 0.0 {
        best / cost
    } else {
        f64::INFINITY
    };
    if r.is_nan() {
        f64::INFINITY
    } else {
        r.max(1.0)
    }
}

/// What distillation needs of the samples: each one's choice (an index into the
/// pool of distinct choices) and every pooled schedule's relative cost on it.
struct Table {
    samples: Vec<Problem>,
    pool: Vec<Schedule>,
    choice: Vec<usize>,
    /// `rel[i * pool.len() + j]`: schedule `j` on sample `i`.
    rel: Vec<f64>,
}

impl Table {
    fn row(&self, i: usize) -> &[f64] {
        let u = self.pool.len();
        &self.rel[i * u..(i + 1) * u]
    }
}

impl DecisionTree {
    /// Distil `dispatcher`'s model over `samples` (one operand layout, nonzero
    /// extents) into a tree.
    pub fn distill(
        dispatcher: &Dispatcher,
        samples: &[Problem],
        options: TreeOptions,
    ) -> Result<DecisionTree, KernelError> {
        let Some(first) = samples.first() else {
            return Err(KernelError::Shape("a decision tree needs training samples".into()));
        };
        let (a, b) = (first.a, first.b);
        if let Some(p) = samples.iter().find(|p| (p.a, p.b) != (a, b)) {
            return Err(KernelError::Shape(format!(
                "the samples of a decision tree share one layout: A {:?}, B {:?} and A {a:?}, B {b:?}",
                p.a, p.b
            )));
        }
        if let Some(p) = samples.iter().find(|p| p.m == 0 || p.n == 0 || p.k == 0 || p.batch == 0) {
            return Err(KernelError::Shape(format!("a training sample with an empty extent: {p:?}")));
        }
        let table = Self::tabulate(dispatcher, samples)?;
        let mut nodes = Vec::new();
        let mut idx: Vec<usize> = (0..samples.len()).collect();
        let options = TreeOptions {
            min_samples: options.min_samples.max(1),
            max_depth: options.max_depth.min(MAX_DEPTH),
            ..options
        };
        grow(&table, &mut idx, 0, &options, &mut nodes);
        Ok(DecisionTree { a, b, model: dispatcher.model(), threads: dispatcher.machine().threads, nodes })
    }

    /// The model's choice for every sample, the distinct choices, and the relative
    /// cost of each of those on every sample.
    fn tabulate(d: &Dispatcher, samples: &[Problem]) -> Result<Table, KernelError> {
        let cost = |p: &Problem, s: &Schedule| d.model().cost(d.machine(), d.family(), p, s);
        let mut pool = Vec::new();
        let mut index = HashMap::new();
        let mut choice = Vec::with_capacity(samples.len());
        let mut best = Vec::with_capacity(samples.len());
        for p in samples {
            let s = d.choose(p)?;
            best.push(cost(p, &s));
            let j = *index.entry(s).or_insert_with(|| {
                pool.push(s);
                pool.len() - 1
            });
            choice.push(j);
        }
        let (model, threads) = (d.model(), d.machine().threads);
        let mut rel = Vec::with_capacity(samples.len() * pool.len());
        for (p, &b) in samples.iter().zip(&best) {
            rel.extend(pool.iter().map(|s| relative(cost(p, &fit(*s, p, model, threads)), b)));
        }
        Ok(Table { samples: samples.to_vec(), pool, choice, rel })
    }

    /// The schedule for `p`: a walk from the root (`p`'s layouts are assumed to be
    /// the tree's; see [`DecisionTree::layout`]).
    pub fn choose(&self, p: &Problem) -> Schedule {
        let mut i = 0;
        loop {
            match self.nodes.get(i) {
                Some(Node::Split { feature, threshold, gt }) => {
                    i = if feature.of(p) <= *threshold { i + 1 } else { *gt };
                }
                Some(Node::Leaf(s)) => return fit(*s, p, self.model, self.threads),
                // Unreachable for a tree built here or checked on deserialization.
                None => return self.first_leaf(),
            }
        }
    }

    fn first_leaf(&self) -> Schedule {
        self.leaf_schedules().next().unwrap_or(Schedule {
            mr: 1,
            nr: 1,
            cover_mr: None,
            blocking: Blocking { mc: 1, nc: 1, kc: 1 },
            order: LoopOrder::KOuter,
            grid: ThreadGrid::SINGLE,
            operands: Operands::Packed,
        })
    }

    /// The operand layouts the tree was distilled for.
    pub fn layout(&self) -> (ALayout, BLayout) {
        (self.a, self.b)
    }
    pub fn model(&self) -> CostModel {
        self.model
    }
    /// The pool size its schedules are for.
    pub fn threads(&self) -> usize {
        self.threads
    }
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The schedules of the leaves, in order from `<=` to `>`.
    pub fn leaf_schedules(&self) -> impl Iterator<Item = Schedule> + '_ {
        self.nodes.iter().filter_map(|n| match n {
            Node::Leaf(s) => Some(*s),
            Node::Split { .. } => None,
        })
    }

    pub fn leaves(&self) -> usize {
        self.leaf_schedules().count()
    }

    /// Splits on the longest way from the root to a leaf.
    pub fn depth(&self) -> usize {
        // Children lie after their parent: one pass from the end.
        let mut depth = vec![0; self.nodes.len()];
        for i in (0..self.nodes.len()).rev() {
            if let Node::Split { gt, .. } = self.nodes[i] {
                let at = |j: usize| depth.get(j).copied().unwrap_or(0);
                depth[i] = 1 + at(i + 1).max(at(gt));
            }
        }
        depth.first().copied().unwrap_or(0)
    }

    /// The model-predicted slowdown of the tree's choices against the model's own
    /// on `problems` (of the tree's layouts): held-out shapes tell how well the
    /// tree generalizes.
    pub fn predicted_regret(
        &self,
        dispatcher: &Dispatcher,
        problems: &[Problem],
    ) -> Result<RegretStats, KernelError> {
        if problems.is_empty() {
            return Err(KernelError::Shape("no problems to measure the regret on".into()));
        }
        let cost = |p: &Problem, s: &Schedule| {
            dispatcher.model().cost(dispatcher.machine(), dispatcher.family(), p, s)
        };
        let (mut sum, mut max, mut within) = (0.0, 0.0f64, 0);
        for p in problems {
            if (p.a, p.b) != (self.a, self.b) {
                return Err(KernelError::Shape(format!(
                    "a tree for {:?} and {:?} cannot choose for {p:?}",
                    self.a, self.b
                )));
            }
            let best = cost(p, &dispatcher.choose(p)?);
            let r = relative(cost(p, &self.choose(p)), best);
            sum += r;
            max = max.max(r);
            within += usize::from(r <= 1.05);
        }
        let n = problems.len();
        Ok(RegretStats { mean: sum / n as f64, max, within_5pct: within as f64 / n as f64, problems: n })
    }
}

/// What a set of samples adds up to, per pooled schedule: the summed relative
/// cost, how many samples chose it, and on how many it is as good as their
/// choice (a schedule with another `KC` that also takes K in one block, say).
struct Sums {
    cost: Vec<f64>,
    chosen: Vec<usize>,
    served: Vec<usize>,
    samples: usize,
}

/// A set of samples' best leaf: the pooled schedule, its summed relative cost,
/// and on how many samples of the set it is worse than their choice.
struct Leaf {
    index: usize,
    cost: f64,
    misses: usize,
}

impl Sums {
    fn new(u: usize) -> Sums {
        Sums { cost: vec![0.0; u], chosen: vec![0; u], served: vec![0; u], samples: 0 }
    }

    fn add(&mut self, t: &Table, i: usize) {
        for ((c, s), &r) in self.cost.iter_mut().zip(&mut self.served).zip(t.row(i)) {
            *c += r;
            *s += usize::from(r <= 1.0 + TIE);
        }
        self.chosen[t.choice[i]] += 1;
        self.samples += 1;
    }

    fn clear(&mut self) {
        self.cost.iter_mut().for_each(|x| *x = 0.0);
        self.chosen.iter_mut().for_each(|x| *x = 0);
        self.served.iter_mut().for_each(|x| *x = 0);
        self.samples = 0;
    }

    fn copy_from(&mut self, other: &Sums) {
        self.cost.copy_from_slice(&other.cost);
        self.chosen.copy_from_slice(&other.chosen);
        self.served.copy_from_slice(&other.served);
        self.samples = other.samples;
    }

    /// `self - part` into `out`.
    fn minus(&self, part: &Sums, out: &mut Sums) {
        for j in 0..self.cost.len() {
            out.cost[j] = self.cost[j] - part.cost[j];
            out.chosen[j] = self.chosen[j] - part.chosen[j];
            out.served[j] = self.served[j] - part.served[j];
        }
        out.samples = self.samples - part.samples;
    }

    /// The best leaf. Ties (schedules no worse than the model's on all the set) go
    /// to the schedule most of the set chose, so that a set of one takes its own
    /// choice.
    fn leaf(&self) -> Leaf {
        let (mut index, mut cost, mut chosen) = (0, f64::INFINITY, 0);
        for (j, (&s, &c)) in self.cost.iter().zip(&self.chosen).enumerate() {
            if s < cost || (s == cost && c > chosen) {
                (index, cost, chosen) = (j, s, c);
            }
        }
        let misses = self.samples - self.served.get(index).copied().unwrap_or(0);
        Leaf { index, cost, misses }
    }
}

/// Relative costs this close to 1 are ties with the model's choice.
const TIE: f64 = 1e-9;

/// A split of a set of samples, ranked by (in order): the gain in summed relative
/// cost of it or of the best pair of cuts on the same feature it is one end of
/// (an interval: a row count whose samples want their own tile inside a range
/// that wants another, where neither cut gains alone); its own gain; how many
/// more samples its leaves serve as well as their choice; and how evenly it
/// halves the set (a bisection, for interactions of two features that no cut
/// reveals alone).
struct Split {
    feature: Feature,
    threshold: usize,
    key: (f64, f64, isize, isize),
}

/// Grow the subtree of the samples `idx` at `depth`, appending its nodes in
/// pre-order; return its summed relative cost.
///
/// Greedy growth stalls where no single cut gains; so a set with samples that
/// its leaf serves worse than their choice is cut by the best of [`Split`]'s
/// ranking while depth and leaf size allow, and a subtree is pruned back to a
/// leaf afterwards when it does not lower the cost by `min_gain` after all
/// (CART's grow, then prune).
fn grow(t: &Table, idx: &mut [usize], depth: usize, o: &TreeOptions, nodes: &mut Vec<Node>) -> f64 {
    let mut all = Sums::new(t.pool.len());
    idx.iter().for_each(|&i| all.add(t, i));
    let leaf = all.leaf();
    let split = if leaf.misses > 0 && depth < o.max_depth && idx.len() >= 2 * o.min_samples {
        best_split(t, idx, &all, &leaf, o)
    } else {
        None
    };
    let Some(split) = split else {
        nodes.push(Node::Leaf(t.pool[leaf.index]));
        return leaf.cost;
    };
    let (f, th) = (split.feature, split.threshold);
    idx.sort_by_key(|&i| f.of(&t.samples[i]) > th);
    let at = idx.partition_point(|&i| f.of(&t.samples[i]) <= th);
    let me = nodes.len();
    nodes.push(Node::Split { feature: f, threshold: th, gt: 0 });
    let (le, gt) = idx.split_at_mut(at);
    let mut cost = grow(t, le, depth + 1, o, nodes);
    let right = nodes.len();
    if let Some(Node::Split { gt, .. }) = nodes.get_mut(me) {
        *gt = right;
    }
    cost += grow(t, gt, depth + 1, o, nodes);
    if leaf.cost - cost < o.min_gain {
        nodes.truncate(me);
        nodes.push(Node::Leaf(t.pool[leaf.index]));
        return leaf.cost;
    }
    cost
}

/// How many distinct values an interval of [`Split`]'s ranking spans at most:
/// islands are narrow, and a feature such as the work has thousands of values.
const SPAN: usize = 8;

/// A cut while the cuts of one feature are ranked: its value, its prefix sums
/// (kept for the last [`SPAN`] cuts only), its two leaves, and the best gain of
/// an interval it ends.
struct Cut {
    value: usize,
    left: Leaf,
    right: Leaf,
    samples: usize,
    interval: f64,
}

/// The best cut of `idx` (summed up in `all`, best served by `parent`) with at
/// least `min_samples` on each side, by [`Split`]'s ranking.
fn best_split(t: &Table, idx: &mut [usize], all: &Sums, parent: &Leaf, o: &TreeOptions) -> Option<Split> {
    let u = t.pool.len();
    let tol = TIE * idx.len() as f64;
    let gain = |g: f64| if g > tol { g } else { 0.0 };
    let fits = |n: usize| n >= o.min_samples && all.samples - n >= o.min_samples;
    let mut best: Option<Split> = None;
    let (mut acc, mut rest, mut mid) = (Sums::new(u), Sums::new(u), Sums::new(u));
    // The prefix sums of the last SPAN cuts, by cut number modulo SPAN.
    let mut ring: Vec<Sums> = (0..SPAN).map(|_| Sums::new(u)).collect();
    let mut cuts: Vec<Cut> = Vec::new();
    for f in Feature::ALL {
        idx.sort_by_key(|&i| f.of(&t.samples[i]));
        acc.clear();
        cuts.clear();
        for (at, &i) in idx.iter().enumerate() {
            acc.add(t, i);
            let value = f.of(&t.samples[i]);
            if idx.get(at + 1).is_none_or(|&next| f.of(&t.samples[next]) == value) {
                continue;
            }
            all.minus(&acc, &mut rest);
            let c = cuts.len();
            let (left, right) = (acc.leaf(), rest.leaf());
            // Intervals from each of the last SPAN cuts up to this one.
            let mut interval: f64 = 0.0;
            for a in c.saturating_sub(SPAN - 1)..c {
                let lo = &ring[a % SPAN];
                if !fits(lo.samples) || !fits(acc.samples) || acc.samples - lo.samples < o.min_samples {
                    continue;
                }
                acc.minus(lo, &mut mid);
                let g = gain(parent.cost - cuts[a].left.cost - mid.leaf().cost - right.cost);
                interval = interval.max(g);
                cuts[a].interval = cuts[a].interval.max(g);
            }
            ring[c % SPAN].copy_from(&acc);
            cuts.push(Cut { value, left, right, samples: acc.samples, interval });
        }
        for cut in &cuts {
            if !fits(cut.samples) {
                continue;
            }
            let own = gain(parent.cost - cut.left.cost - cut.right.cost);
            let key = (
                own.max(cut.interval),
                own,
                parent.misses as isize - (cut.left.misses + cut.right.misses) as isize,
                -(2 * cut.samples as isize - all.samples as isize).abs(),
            );
            if best.as_ref().is_none_or(|b| key > b.key) {
                best = Some(Split { feature: f, threshold: cut.value, key });
            }
        }
    }
    best
}

impl std::fmt::Display for DecisionTree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "# A {:?}, B {:?}, {} model, {} threads: {} leaves, depth {}",
            self.a,
            self.b,
            self.model.name(),
            self.threads,
            self.leaves(),
            self.depth()
        )?;
        if let Some(Node::Leaf(s)) = self.nodes.first() {
            return writeln!(f, "{s}");
        }
        // An explicit stack (a stored tree may be deep): each entry writes one side's
        // line of a split, then that side's subtree, `<=` before `>`.
        let mut stack = vec![(0usize, false, 0usize), (0, true, 0)];
        while let Some((i, le, indent)) = stack.pop() {
            let Some(&Node::Split { feature, threshold, gt }) = self.nodes.get(i) else { continue };
            let (child, op) = if le { (i + 1, "<=") } else { (gt, ">") };
            write!(f, "{:w$}{} {op} {threshold}:", "", feature.name(), w = 2 * indent)?;
            match self.nodes.get(child) {
                Some(Node::Leaf(s)) => writeln!(f, " {s}")?,
                _ => {
                    writeln!(f)?;
                    stack.push((child, false, indent + 1));
                    stack.push((child, true, indent + 1));
                }
            }
        }
        Ok(())
    }
}

/// Training extents in `range`: 1, 2, 3 and the small primes (odd edges), the
/// powers of two and one past each (a full tile and one row more), and three
/// halves of each power (the log2 midpoints), and the range's own ends, sorted.
pub fn extents(range: std::ops::RangeInclusive<usize>) -> Vec<usize> {
    let (lo, hi) = (*range.start(), *range.end());
    let mut v = vec![1, 2, 3, 5, 7, 11, 13, lo, hi];
    let mut p = 4usize;
    while p <= hi {
        v.extend([p, p + 1, p + p / 2]);
        p = match p.checked_mul(2) {
            Some(q) => q,
            None => break,
        };
    }
    v.retain(|x| (lo..=hi).contains(x));
    v.sort_unstable();
    v.dedup();
    v
}

/// A geometric training grid: every combination of the [`extents`] of each range
/// with the given batch sizes, for one pair of operand layouts.
pub fn sweep(
    m: std::ops::RangeInclusive<usize>,
    n: std::ops::RangeInclusive<usize>,
    k: std::ops::RangeInclusive<usize>,
    batches: &[usize],
    a: ALayout,
    b: BLayout,
) -> Vec<Problem> {
    let (ms, ns, ks) = (extents(m), extents(n), extents(k));
    let mut out = Vec::with_capacity(batches.len() * ms.len() * ns.len() * ks.len());
    for &batch in batches {
        for &m in &ms {
            for &n in &ns {
                for &k in &ks {
                    out.push(Problem { batch, m, n, k, a, b });
                }
            }
        }
    }
    out
}
