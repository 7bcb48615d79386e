//! Run-time dispatch (Vortex §5.3, BladeDISC §5.2.2, DietCode's dispatcher): for
//! the bound shape, generate the schedule candidates, rank them with the
//! analytical model and run the best, remembering the choice per shape so that
//! the next call with that shape pays one hash lookup.
//!
//! With a [`DecisionTree`] distilled from the model for an operand layout, the
//! first call for a new shape of that layout walks the tree (nanoseconds) instead
//! of generating and ranking candidates (microseconds).
//!
//! A [`Dispatcher`] owns one contraction's kernel family and is `Send + Sync`:
//! several threads may run through it at once (the memo is behind a `RwLock`,
//! and every call's packing buffers are its threads' own).

use std::collections::HashMap;
use std::sync::RwLock;

use crate::cost::{rule_grid, CostModel, MachineModel};
use crate::direct::{b_in_place, DirectPlan};
use crate::gemm::{execute, BOperand, EpilogueArgs, LoopOrder, MatMut, MatRef, PackedB, PackedPlan, Plan};
use crate::schedule::{candidates, ALayout, BLayout, KernelFamily, Operands, Problem, Schedule};
use crate::tree::{DecisionTree, Node, TreeOptions};
use crate::tuned::TunedSchedules;
use crate::{ElemType, KernelError, Target, ThreadPool};

/// How much cheaper, by the model, a weight packed whole must be at one of the
/// row counts it is packed for than in its L1 blocks to be packed whole. The
/// model prices the passes over C its one block saves, not the B panel's
/// overflow of L1: GPT-2's 50,257-word LM head (priced 4-5% cheaper whole from
/// 512 rows, measured 20% faster at 308) passes; BERT's layers (priced 1-2%
/// cheaper, measured level or slower inside the model) do not.
pub const WHOLE_GAIN: f64 = 0.03;

/// Chooses and runs the schedule of one contraction, for any shape.
pub struct Dispatcher {
    target: Target,
    family: KernelFamily,
    machine: MachineModel,
    model: CostModel,
    memo: RwLock<HashMap<Problem, Schedule>>,
    /// Single-thread direct schedules of fused attention's tasks, per problem.
    task_memo: RwLock<HashMap<Problem, Schedule>>,
    /// The packed schedules of problems whose A is 8-bit codes and whose
    /// schedule reads A in place (which direct kernels cannot: they read f32).
    codes_memo: RwLock<HashMap<Problem, Schedule>>,
    /// At most one tree per operand layout (a handful: a linear scan).
    trees: Vec<DecisionTree>,
    /// Macro-kernels measured by the Bayesian search, per class of problems.
    tuned: Option<TunedSchedules>,
}

impl Dispatcher {
    pub fn new(target: Target, family: KernelFamily, machine: MachineModel, model: CostModel) -> Dispatcher {
        Dispatcher {
            target,
            family,
            machine,
            model,
            memo: RwLock::new(HashMap::new()),
            task_memo: RwLock::new(HashMap::new()),
            codes_memo: RwLock::new(HashMap::new()),
            trees: Vec::new(),
            tuned: None,
        }
    }

    pub fn target(&self) -> &Target {
        &self.target
    }
    pub fn family(&self) -> &KernelFamily {
        &self.family
    }
    pub fn machine(&self) -> &MachineModel {
        &self.machine
    }
    pub fn model(&self) -> CostModel {
        self.model
    }

    /// Every candidate for `p` (what an exhaustive search would measure).
    pub fn candidates(&self, p: &Problem) -> Vec<Schedule> {
        candidates(&self.target, self.machine.threads, &self.family, p)
    }

    /// The model's choice for `p`, computed now (no memo).
    pub fn choose(&self, p: &Problem) -> Result<Schedule, KernelError> {
        self.choose_with(self.model, p)
    }

    /// `model`'s choice for `p`, computed now. Models that rank tiles only get the
    /// rule of thumb's thread grid for each tile.
    pub fn choose_with(&self, model: CostModel, p: &Problem) -> Result<Schedule, KernelError> {
        self.choose_where(model, p, |_| true)
    }

    /// `model`'s choice for `p` among the candidates `allowed` keeps.
    pub fn choose_where(
        &self,
        model: CostModel,
        p: &Problem,
        allowed: impl Fn(&Schedule) -> bool,
    ) -> Result<Schedule, KernelError> {
        let threads = self.machine.threads;
        let mut fits: Vec<Schedule> = self
            .candidates(p)
            .into_iter()
            .filter(|s| allowed(s) && (model.ranks_grids() || s.grid == rule_grid(threads, p, s.mr, s.nr)))
            .collect();
        let waits = |s: &Schedule| crate::schedule::waits_on_panel(&self.target, &self.family, p, s);
        if fits.iter().any(|s| !waits(s)) {
            fits.retain(|s| !waits(s));
        }
        fits.into_iter()
            .map(|s| (model.cost(&self.machine, &self.family, p, &s), s))
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, s)| s)
            .ok_or_else(|| KernelError::Shape(format!("no schedule fits {p:?} with this kernel family")))
    }

    /// The fixed rule used before any cost model (the baseline of the regret
    /// report): the fastest measured tile of at least 4 rows (ties within 3% to the
    /// smaller), blocks sized to the caches, the rule-of-thumb grid, and the 1-row
    /// cover when the remainder is at most half a tile.
    pub fn rule_of_thumb(&self, p: &Problem) -> Result<Schedule, KernelError> {
        let fits = |v: &&crate::KernelVariant| match p.b {
            BLayout::Packed { nr, .. } => v.kernel.nr == nr,
            _ => true,
        };
        let vs: Vec<_> = self.family.variants().iter().filter(fits).collect();
        let min_mr = if vs.iter().any(|v| v.kernel.mr >= 4) { 4 } else { 1 };
        let top = vs.iter().filter(|v| v.kernel.mr >= min_mr).map(|v| v.gflops).fold(0.0, f64::max);
        let v = vs
            .iter()
            .filter(|v| v.kernel.mr >= min_mr && v.gflops >= 0.97 * top)
            .min_by_key(|v| (v.kernel.mr * v.kernel.nr, v.kernel.mr))
            .ok_or_else(|| KernelError::Shape(format!("no kernel of the family fits {p:?}")))?;
        let (mr, nr) = (v.kernel.mr, v.kernel.nr);
        let mut blocking = crate::Blocking::for_target(&self.target, self.family.elem(), mr, nr);
        if let BLayout::Packed { kc, .. } = p.b {
            blocking.kc = kc;
        }
        let rem = p.m % mr;
        let cover_mr = (rem > 0 && 2 * rem <= mr && self.family.get(1, nr).is_some()).then_some(1);
        Ok(Schedule {
            mr,
            nr,
            cover_mr,
            blocking,
            order: LoopOrder::KOuter,
            grid: rule_grid(self.machine.threads, p, mr, nr),
            operands: Operands::Packed,
        })
    }

    /// The schedule for `p`: memoized per shape; the tuned macro-kernel of `p`'s
    /// class when the search measured one fastest near this M, else from the tree
    /// for `p`'s layouts when there is one, else the model's choice.
    pub fn schedule(&self, p: &Problem) -> Result<Schedule, KernelError> {
        if let Some(s) = self.memo.read().unwrap_or_else(|e| e.into_inner()).get(p) {
            return Ok(*s);
        }
        let tuned = self.tuned.as_ref().and_then(|t| t.class(p)).and_then(|c| c.pick(p.m));
        let s = match (tuned.and_then(|mk| mk.instantiate(self, p)), self.tree(p.a, p.b)) {
            (Some(s), _) => s,
            (None, Some(t)) => t.choose(p),
            (None, None) => self.choose(p)?,
        };
        self.memo.write().unwrap_or_else(|e| e.into_inner()).insert(*p, s);
        Ok(s)
    }

    /// The schedule of `p` when its A is 8-bit codes (`a_codes`; `a_words`:
    /// readable in place a word of four depths at a time,
    /// [`crate::direct::code_words_in_place`]), or its C (the family stores
    /// codes): the problem's schedule, unless that reads A in place and the
    /// family's direct kernels cannot (f32 ones read floats, u8s8 ones codes
    /// in words), then the best packed one (memoized too). The problem's
    /// layouts are its floats' (what the measured dispatch was measured for).
    pub fn schedule_of(&self, p: &Problem, a_codes: bool, a_words: bool) -> Result<Schedule, KernelError> {
        let s = self.schedule(p)?;
        if s.operands != Operands::Direct {
            return Ok(s);
        }
        let readable = match self.family.direct_elem() {
            ElemType::U8S8 => a_codes && a_words,
            _ => !(a_codes || self.family.stores_codes()),
        };
        if readable {
            return Ok(s);
        }
        if let Some(s) = self.codes_memo.read().unwrap_or_else(|e| e.into_inner()).get(p) {
            return Ok(*s);
        }
        let s = self.choose_where(self.model, p, |s| s.operands == Operands::Packed)?;
        self.codes_memo.write().unwrap_or_else(|e| e.into_inner()).insert(*p, s);
        Ok(s)
    }

    /// The schedule of one task of a fused kernel (a block of fused attention's
    /// rows): the model's best among the direct schedules on one thread (the
    /// fused kernel's threads split the tasks), memoized per problem.
    pub fn task_schedule(&self, p: &Problem) -> Result<Schedule, KernelError> {
        if let Some(s) = self.task_memo.read().unwrap_or_else(|e| e.into_inner()).get(p) {
            return Ok(*s);
        }
        let s = self
            .candidates(p)
            .into_iter()
            .filter(|s| s.operands == Operands::Direct && s.grid == crate::ThreadGrid::SINGLE)
            .map(|s| (self.model.cost(&self.machine, &self.family, p, &s), s))
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, s)| s)
            .ok_or_else(|| KernelError::Shape(format!("no single-thread direct schedule fits {p:?}")))?;
        self.task_memo.write().unwrap_or_else(|e| e.into_inner()).insert(*p, s);
        Ok(s)
    }

    /// The direct kernels of a schedule from [`Dispatcher::task_schedule`].
    pub fn direct_plan(&self, s: &Schedule) -> Result<DirectPlan<'_>, KernelError> {
        match self.plan(s)? {
            Plan::Direct(d) => Ok(d),
            Plan::Packed(_) => Err(KernelError::Shape(format!("schedule {s} is not direct"))),
        }
    }

    /// Distil this dispatcher's model over `samples` into a decision tree (see
    /// [`DecisionTree::distill`]).
    pub fn distill(&self, samples: &[Problem], options: TreeOptions) -> Result<DecisionTree, KernelError> {
        DecisionTree::distill(self, samples, options)
    }

    /// This dispatcher with `tree` choosing for its operand layouts (see
    /// [`Dispatcher::set_tree`]).
    pub fn with_tree(mut self, tree: DecisionTree) -> Result<Dispatcher, KernelError> {
        self.set_tree(tree)?;
        Ok(self)
    }

    /// Let `tree` choose for its operand layouts, replacing any tree for them and
    /// forgetting the shapes of those layouts memoized so far. A tree may come from
    /// a file: every leaf must be a schedule this family runs on this machine's
    /// threads for those layouts.
    pub fn set_tree(&mut self, tree: DecisionTree) -> Result<(), KernelError> {
        let (a, b) = tree.layout();
        if tree.threads() != self.machine.threads {
            return Err(KernelError::Shape(format!(
                "the tree is for {} threads, this dispatcher for {}",
                tree.threads(),
                self.machine.threads
            )));
        }
        for node in tree.nodes() {
            let Node::Leaf(s) = node else { continue };
            self.runnable(s, a, b)?;
        }
        self.trees.retain(|t| t.layout() != (a, b));
        self.trees.push(tree);
        self.memo.get_mut().unwrap_or_else(|e| e.into_inner()).retain(|p, _| (p.a, p.b) != (a, b));
        Ok(())
    }

    /// This dispatcher with the macro-kernels a search tuned (see
    /// [`crate::tuned`]): they choose for the problems of their classes, and a
    /// weight of a tuned class is packed in its tuned layout.
    pub fn with_tuned(mut self, tuned: TunedSchedules) -> Result<Dispatcher, KernelError> {
        tuned.check(&self)?;
        self.tuned = Some(tuned);
        self.memo.get_mut().unwrap_or_else(|e| e.into_inner()).clear();
        self.codes_memo.get_mut().unwrap_or_else(|e| e.into_inner()).clear();
        Ok(self)
    }

    pub fn tuned(&self) -> Option<&TunedSchedules> {
        self.tuned.as_ref()
    }

    /// Every tree it dispatches by.
    pub fn trees(&self) -> &[DecisionTree] {
        &self.trees
    }

    /// The tree that chooses for these operand layouts, if any.
    pub fn tree(&self, a: ALayout, b: BLayout) -> Option<&DecisionTree> {
        self.trees.iter().find(|t| t.layout() == (a, b))
    }

    /// Whether `s` runs with this family, on this machine's threads, for operands
    /// of layouts `a` and `b`.
    fn runnable(&self, s: &Schedule, a: ALayout, b: BLayout) -> Result<(), KernelError> {
        let bad = |why: &str| Err(KernelError::Shape(format!("schedule {s} {why}")));
        if s.grid.threads() == 0 || s.grid.threads() > self.machine.threads {
            return bad(&format!("does not fit {} threads", self.machine.threads));
        }
        if s.operands == Operands::Direct && !matches!(a, ALayout::RowMajor | ALayout::Taps { .. }) {
            return bad("reads A in place, which is not row-major");
        }
        // A tree's leaves serve every K of the layout: a packed layout is taken
        // as whole (its depth K's) here, and `execute` checks each call's K.
        if let BLayout::Packed { nr, kc } = b {
            if !b.serves(s.nr, s.blocking.kc, kc) {
                return bad(&format!("does not fit B packed for NR {nr} and KC {kc}"));
            }
        }
        match self.plan(s)? {
            Plan::Direct(d) => d.check().map(|_| ()),
            Plan::Packed(p) => crate::gemm::check_packed(&p).map(|_| ()),
        }
    }

    /// The kernels and blocks of `s`, ready for the driver.
    pub fn plan(&self, s: &Schedule) -> Result<Plan<'_>, KernelError> {
        if s.operands == Operands::Direct {
            let kernels = self.family.direct_from(s.mr, s.nr);
            if kernels.is_empty() {
                return Err(KernelError::Shape(format!("the family has no direct {}x{} kernel", s.mr, s.nr)));
            }
            // A's rows in f32 words: u8s8's hold four depths each.
            let words = match kernels[0].kernel.elem {
                ElemType::U8S8 => s.blocking.kc.div_ceil(4),
                _ => s.blocking.kc,
            };
            let mc = crate::direct::direct_rows(self.target.l2, words, s.mr);
            return Ok(Plan::Direct(DirectPlan { kernels, kc: s.blocking.kc, mc, grid: s.grid }));
        }
        let get = |mr: usize| {
            self.family
                .get(mr, s.nr)
                .map(|v| &v.kernel)
                .ok_or_else(|| KernelError::Shape(format!("the family has no {mr}x{} kernel", s.nr)))
        };
        Ok(Plan::Packed(PackedPlan {
            kernel: get(s.mr)?,
            cover: s.cover_mr.map(get).transpose()?,
            blocking: s.blocking,
            order: s.order,
            grid: s.grid,
        }))
    }

    /// Pack a weight once, for the tile width and depth that the model predicts
    /// best over `rows` (the row counts the weight will meet, e.g. a geometric
    /// sweep of the symbol's range).
    pub fn pack_weight(&self, b: MatRef, rows: &[usize]) -> Result<PackedB, KernelError> {
        self.pack_in(b, self.weight_layout(b.rows, b.cols, rows)?)
    }

    /// Pack a weight-only quantized weight ([`crate::QuantizedWeight`]) once, in
    /// the layout [`Dispatcher::pack_weight`] would give its f32 values; f32
    /// families only (its panels are dequantized to f32).
    pub fn pack_quantized_weight(
        &self,
        w: &crate::QuantizedWeight,
        rows: &[usize],
    ) -> Result<PackedB, KernelError> {
        if self.family.elem() != crate::ElemType::F32 {
            return Err(KernelError::Shape(format!(
                "a quantized weight is multiplied by f32 kernels, not {}",
                self.family.elem()
            )));
        }
        // Codes are read in their own blocks only (`PackedB::serves`): never
        // packed whole.
        match self.cache_layout(w.k, w.n, rows, false)? {
            BLayout::Packed { nr, kc } => PackedB::quantized(w, nr, kc),
            _ => Err(KernelError::Shape("an empty kernel family".into())),
        }
    }

    /// `b` packed in `layout` (a [`BLayout::Packed`] from this dispatcher).
    fn pack_in(&self, b: MatRef, layout: BLayout) -> Result<PackedB, KernelError> {
        match layout {
            BLayout::Packed { nr, kc } => Ok(PackedB::of_elem(b, nr, kc, self.family.elem())),
            _ => Err(KernelError::Shape("an empty kernel family".into())),
        }
    }

    /// Pack the weight of a convolution whose taps overlap (each image value read by
    /// several taps), `row` deep per kernel row: the width [`Dispatcher::weight_layout`]
    /// picks, in K blocks of whole kernel rows ([`crate::schedule::taps_kc`]) where a
    /// row is not too deep for them, else in that layout's own blocks.
    pub fn pack_conv_weight(&self, b: MatRef, rows: &[usize], row: usize) -> Result<PackedB, KernelError> {
        self.pack_in(b, self.conv_weight_layout(b.rows, b.cols, rows, row)?)
    }

    /// The layout [`Dispatcher::pack_conv_weight`] packs a `k × n` weight in.
    pub fn conv_weight_layout(
        &self,
        k: usize,
        n: usize,
        rows: &[usize],
        row: usize,
    ) -> Result<BLayout, KernelError> {
        match self.weight_layout(k, n, rows)? {
            l if self.family.stores_codes() => Ok(l),
            BLayout::Packed { nr, kc } => Ok(BLayout::Packed {
                nr,
                kc: crate::schedule::taps_kc(&self.target, self.family.elem(), nr, row, k).unwrap_or(kc),
            }),
            other => Ok(other),
        }
    }

    /// The packed layout ([`BLayout::Packed`]) a `k × n` weight gets for `rows`: the
    /// tuned one when a search tuned this weight, else the tile width and depth the
    /// model predicts best over them.
    pub fn weight_layout(&self, k: usize, n: usize, rows: &[usize]) -> Result<BLayout, KernelError> {
        let layout = self.cache_layout(k, n, rows, true)?;
        match layout {
            // A family storing codes keeps no partial sums: one K block.
            BLayout::Packed { nr, .. } if self.family.stores_codes() => {
                Ok(BLayout::Packed { nr, kc: k.max(1) })
            }
            l => Ok(l),
        }
    }

    /// [`Dispatcher::weight_layout`] by the caches alone.
    /// `whole`: whether it may be packed whole (a quantized weight's codes may
    /// not, `PackedB::serves`).
    fn cache_layout(&self, k: usize, n: usize, rows: &[usize], whole: bool) -> Result<BLayout, KernelError> {
        let deeper_than_l1 = |l: &BLayout| match *l {
            BLayout::Packed { nr, kc } => kc >= k && self.l1_depth(nr).is_some_and(|l1| k > l1),
            _ => false,
        };
        let tuned = self.tuned.as_ref().and_then(|t| t.weight_layout(k, n));
        if let Some(l) = tuned.filter(|l| whole || !deeper_than_l1(l)) {
            return Ok(l);
        }
        // Each width's model costs per row count (relative: per flop) in its best depth.
        let mut widths: Vec<(usize, usize, Vec<f64>)> = Vec::new();
        let elem = self.family.elem();
        for nr in self.family.widths() {
            let Some(kc) = self.l1_depth(nr) else { continue };
            let costs = |depth: usize| -> Result<Vec<f64>, KernelError> {
                let layout = BLayout::Packed { nr, kc: depth };
                rows.iter()
                    .map(|&m| {
                        let p = Problem { batch: 1, m: m.max(1), n, k, a: ALayout::RowMajor, b: layout };
                        let s = self.choose(&p)?;
                        Ok(self.model.cost(&self.machine, &self.family, &p, &s) / p.flops().max(1.0))
                    })
                    .collect()
            };
            let l1 = costs(kc)?;
            let mut pick = (l1.clone(), kc);
            // Packed whole, where its panels are shallow enough
            // ([`crate::schedule::whole_depth`]), a call may run in either
            // depth: taken where its one block gains at some row count
            // ([`WHOLE_GAIN`]), the passes over a C that outgrows the caches.
            let whole_depth =
                crate::schedule::whole_depth(&self.target, elem, nr, k).filter(|_| whole && k > kc);
            if let Some(depth) = whole_depth {
                let whole = costs(depth)?;
                if whole.iter().zip(&l1).any(|(w, b)| *w <= (1.0 - WHOLE_GAIN) * b) {
                    pick = (whole, depth);
                }
            }
            widths.push((nr, pick.1, pick.0));
        }
        // The width whose costs are closest to each row count's best: the sum of
        // the ratios, so that every row count weighs the same. (A sum of costs per
        // flop would let the few-row counts, the dearest per flop, decide alone: a
        // wide vector tile that wins by 1.7x at one row would beat a matrix-unit
        // tile 2.4x faster at every count from 64 rows.)
        let least = |i: usize| widths.iter().map(|w| w.2[i]).fold(f64::INFINITY, f64::min);
        let regret = |costs: &[f64]| -> f64 {
            costs.iter().enumerate().map(|(i, c)| c / least(i).max(f64::MIN_POSITIVE)).sum()
        };
        let mut best: Option<(f64, usize, usize)> = None;
        for (nr, kc, costs) in &widths {
            let r = regret(costs);
            if best.is_none_or(|(t, _, _)| r < t) {
                best = Some((r, *nr, *kc));
            }
        }
        let (_, nr, kc) = best.ok_or_else(|| KernelError::Shape("an empty kernel family".into()))?;
        Ok(BLayout::Packed { nr, kc })
    }

    /// The L1-deep K blocks of width `nr`'s main tile, where the family has one.
    fn l1_depth(&self, nr: usize) -> Option<usize> {
        let mr = self.family.best_height(nr)?;
        Some(crate::schedule::kc_for(&self.target, self.family.elem(), mr, nr))
    }

    /// `C = epilogue(A · B)`, on `pool`, with the memoized schedule for this shape.
    pub fn matmul(
        &self,
        pool: &ThreadPool,
        a: MatRef,
        b: BOperand,
        c: MatMut,
        ep: &EpilogueArgs,
    ) -> Result<Schedule, KernelError> {
        self.batched(pool, &[a], &[b], &mut [c], ep)
    }

    /// A batch of contractions of one shape (attention's per-head products).
    pub fn batched(
        &self,
        pool: &ThreadPool,
        a: &[MatRef],
        b: &[BOperand],
        c: &mut [MatMut],
        ep: &EpilogueArgs,
    ) -> Result<Schedule, KernelError> {
        let p = self.problem(a, b)?;
        if pool.threads() < self.machine.threads {
            return Err(KernelError::Shape(format!(
                "the schedules are for {} threads, the pool has {}",
                self.machine.threads,
                pool.threads()
            )));
        }
        let codes = a.iter().any(MatRef::is_codes);
        let s = self.schedule_of(&p, codes, a.iter().all(crate::direct::code_words_in_place))?;
        execute(pool, &self.plan(&s)?, a, b, c, ep)?;
        Ok(s)
    }

    /// The problem of a batch, which must be of one shape, with every B packed
    /// alike or none packed. The batch's layouts are the least any entry allows
    /// (one strided entry makes the batch strided).
    pub fn problem(&self, a: &[MatRef], b: &[BOperand]) -> Result<Problem, KernelError> {
        let (Some(a0), Some(b0)) = (a.first(), b.first()) else {
            return Err(KernelError::Shape("an empty batch".into()));
        };
        let layout = |b: &BOperand| match b {
            BOperand::Packed(p) => BLayout::Packed { nr: p.nr, kc: p.kc },
            BOperand::Plain(_) => BLayout::NMajor,
        };
        let dims = |b: &BOperand| match b {
            BOperand::Packed(p) => (p.k, p.n),
            BOperand::Plain(m) => (m.rows, m.cols),
        };
        let (k, n) = dims(b0);
        for (ai, bi) in a.iter().zip(b) {
            if (ai.rows, ai.cols) != (a0.rows, a0.cols) || dims(bi) != (k, n) || layout(bi) != layout(b0) {
                return Err(KernelError::Shape("the entries of a batch differ in shape or layout".into()));
            }
        }
        // Codes have their floats' layouts (`schedule_of` keeps them packed).
        let a_layout = if a.iter().all(crate::direct::row_major) {
            ALayout::RowMajor
        } else {
            match a0.taps {
                Some((t, false)) if a.iter().all(crate::direct::adjacent_taps) => t.layout(),
                _ => ALayout::Strided,
            }
        };
        let b_layout = match layout(b0) {
            BLayout::NMajor if !b.iter().all(b_in_place) => BLayout::Strided,
            l => l,
        };
        Ok(Problem { batch: a.len(), m: a0.rows, n, k, a: a_layout, b: b_layout })
    }

    /// Shapes remembered so far.
    pub fn memoized(&self) -> usize {
        self.memo.read().unwrap_or_else(|e| e.into_inner()).len()
    }
}
