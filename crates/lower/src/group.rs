//! Lowering a model: every fusion group becomes a sequence of steps. An f32
//! matmul is the group's backbone and runs on the contraction engine, reading
//! its operands as strided views when their layout prologue (reshape,
//! transpose, broadcast, slice) is a view; everything else in the group (the
//! prologue that is not a view, the epilogue after the backbone, the softmax
//! between attention's two products, a whole element-wise or stitch group) is
//! a loop program over the values it must store, each computed by inlining
//! its producers back to buffers.

use std::collections::{HashMap, HashSet};

use ir::{BinaryOp, DType, Graph, Op, UnaryOp, ValueId};
use passes::{FusionGroup, FusionPlan, GroupKind};
use sym::SymExpr;

use crate::build::{match_groups, Builder};
use crate::hoist;
use crate::requantize;
use crate::LowerError;
use plan::{
    Activation, BufId, Buffer, BufferKind, GroupSteps, MatEpilogue, MatMulStep, ModelPlan, Node, Pointwise,
    PwBinary, PwCmp, PwOp, PwUnary, Step, StepKind, Taps, View, E,
};

type R<T> = Result<T, LowerError>;

/// A strided layout: per dim `(extent, stride)`, and an element offset.
///
/// A dim merged from dims that are not contiguous (a grouped query's heads:
/// `[kv, g]` with strides `[s, 0]` read as one dim of `kv·g` heads) has no one
/// stride: its factors, outer to inner, are in `factors` (empty for a plain
/// dim, whose stride is in `dims`). Only a matmul's batch dims may be
/// factored: the product's batch is then refined into the factors.
#[derive(Clone, Debug)]
struct Layout {
    buf: BufId,
    offset: SymExpr,
    dims: Vec<(SymExpr, SymExpr)>,
    factors: Vec<Vec<(SymExpr, SymExpr)>>,
}

impl Layout {
    fn plain(&self, d: usize) -> bool {
        self.factors.get(d).is_none_or(|f| f.is_empty())
    }

    /// Whether the last two dims (a matmul's rows and columns) have one stride each.
    fn matrix(&self) -> bool {
        let r = self.dims.len();
        r >= 2 && self.plain(r - 2) && self.plain(r - 1)
    }
}

/// A matmul's batch refined so that every operand has one stride per batch
/// dim: the extents, and per layout its strides.
struct RefinedBatch {
    extents: Vec<SymExpr>,
    strides: Vec<Vec<SymExpr>>,
}

/// The batch dims `out` of `layouts` (a matmul's operands and output) refined
/// into the factors of the factored ones; `None` when two layouts factor a dim
/// differently.
fn refine_batch(env: &sym::ShapeEnv, out: &[SymExpr], layouts: &[&Layout]) -> Option<RefinedBatch> {
    let mut r = RefinedBatch { extents: Vec::new(), strides: vec![Vec::new(); layouts.len()] };
    for (d, extent) in out.iter().enumerate() {
        let factored: Vec<&Vec<(SymExpr, SymExpr)>> =
            layouts.iter().filter(|l| !l.plain(d)).map(|l| &l.factors[d]).collect();
        let Some(first) = factored.first() else {
            r.extents.push(extent.clone());
            for (i, l) in layouts.iter().enumerate() {
                r.strides[i].push(l.dims[d].1.clone());
            }
            continue;
        };
        let same = |f: &&Vec<(SymExpr, SymExpr)>| {
            f.len() == first.len() && f.iter().zip(first.iter()).all(|(a, b)| env.equal(&a.0, &b.0))
        };
        if !factored.iter().all(same) {
            return None;
        }
        r.extents.extend(first.iter().map(|f| f.0.clone()));
        for (i, l) in layouts.iter().enumerate() {
            if !l.plain(d) {
                r.strides[i].extend(l.factors[d].iter().map(|f| f.1.clone()));
                continue;
            }
            // A plain dim splits like a row-major index (one entry: stride 0).
            let (e, s) = &l.dims[d];
            let mut split = Vec::with_capacity(first.len());
            let mut stride = if e.as_const() == Some(1) { SymExpr::constant(0) } else { s.clone() };
            for f in first.iter().rev() {
                split.push(stride.clone());
                stride = stride.try_mul(&f.0).ok()?;
            }
            split.reverse();
            r.strides[i].extend(split);
        }
    }
    Some(r)
}

pub(crate) struct Lowering<'g> {
    g: &'g Graph,
    pub plan: ModelPlan,
    /// The model buffer of every value held in one.
    buffer_of: HashMap<ValueId, BufId>,
    /// Loop programs by their text without names: groups of one signature share code.
    programs: HashMap<String, usize>,
    producers: Vec<Option<usize>>,
    /// Group outputs that are a reshape of another stored value: never
    /// materialized; their readers read the value they reshape (a view).
    views: HashMap<ValueId, ValueId>,
    /// Values stored only because other values are strided views of them (a
    /// merged QKV product whose head splits are read as views): written by
    /// their group like its outputs.
    view_sources: std::collections::HashSet<ValueId>,
    /// Matmuls as contraction steps (else as sums of products in loop programs).
    matmul_steps: bool,
    /// Epilogues may scale columns by computed values (see [`crate::hoist`]).
    column_scales: bool,
    /// Epilogue programs take their constants as parameters.
    epilogue_params: bool,
    /// Epilogue programs may read a residual ([`crate::LowerOptions::residual_programs`]).
    residual_programs: bool,
    /// Quantized activations may be stored as u8 codes ([`crate::LowerOptions::u8_codes`]).
    u8_codes: bool,
    codes_depth: usize,
    /// Buffers stored narrower than their values (u8 codes of f32 values):
    /// programs load them widened and store the narrow value.
    narrowed: HashMap<BufId, DType>,
    /// The group of every node.
    group_of: Vec<usize>,
    /// The nodes reading each value.
    readers: Vec<Vec<usize>>,
    /// Values of a later group that a product's epilogue stores (the codes
    /// its output quantizes to), which that group then reads.
    stored_early: HashMap<ValueId, BufId>,
}

impl<'g> Lowering<'g> {
    /// Whether `node` is a contraction step's backbone.
    fn backbone(&self, node: &ir::Node) -> bool {
        self.matmul_steps && is_backbone(self.g, node)
    }

    pub fn new(g: &'g Graph, opts: &crate::LowerOptions) -> Lowering<'g> {
        Lowering {
            matmul_steps: opts.matmul_steps,
            column_scales: opts.column_scales,
            epilogue_params: opts.epilogue_params,
            residual_programs: opts.residual_programs,
            u8_codes: opts.u8_codes,
            codes_depth: opts.codes_depth,
            narrowed: HashMap::new(),
            group_of: vec![usize::MAX; g.nodes.len()],
            readers: {
                let mut r = vec![Vec::new(); g.num_values()];
                for (i, n) in g.nodes.iter().enumerate() {
                    for v in &n.inputs {
                        if r[v.index()].last() != Some(&i) {
                            r[v.index()].push(i);
                        }
                    }
                }
                r
            },
            stored_early: HashMap::new(),
            g,
            plan: ModelPlan::default(),
            buffer_of: HashMap::new(),
            programs: HashMap::new(),
            producers: g.producers(),
            views: HashMap::new(),
            view_sources: Default::default(),
        }
    }

    fn add_buffer(&mut self, v: ValueId, kind: BufferKind) -> R<BufId> {
        let ty = self.g.ty(v);
        let numel = ty.numel().map_err(|e| LowerError::Internal(format!("'{}': {e}", self.g.name(v))))?;
        let numel = self.g.env.normalize(&numel);
        let numel = self.plan.dims.slot(&numel);
        self.plan.buffers.push(Buffer {
            name: self.g.name(v).to_string(),
            dtype: ty.dtype,
            shape: ty.shape.clone(),
            numel,
            kind,
            first: 0,
            last: 0,
        });
        Ok(self.plan.buffers.len() - 1)
    }

    fn temp(&mut self, v: ValueId) -> R<BufId> {
        self.add_buffer(v, BufferKind::Temp)
    }

    /// Lower every group of `fusion`.
    pub fn run(mut self, fusion: &FusionPlan) -> R<ModelPlan> {
        let g = self.g;
        for (gi, group) in fusion.groups.iter().enumerate() {
            for &n in &group.nodes {
                self.group_of[n] = gi;
            }
        }
        for (i, &v) in g.inputs.iter().enumerate() {
            let b = self.add_buffer(v, BufferKind::Input(i))?;
            self.buffer_of.insert(v, b);
            self.plan.inputs.push(b);
        }
        for &n in &fusion.constants {
            let node = &g.nodes[n];
            if let Op::Constant(c) = &node.op {
                let b = self.add_buffer(node.output, BufferKind::Constant(c.clone()))?;
                self.buffer_of.insert(node.output, b);
            }
        }
        // Model outputs computed by a group are written in place; the rest (an
        // input, a constant, a value listed twice) are copied at the end.
        let mut copies = Vec::new();
        let mut out_bufs = vec![None; g.outputs.len()];
        for (i, &v) in g.outputs.iter().enumerate() {
            let computed =
                self.producers[v.index()].is_some_and(|p| !matches!(g.nodes[p].op, Op::Constant(_)));
            if computed && !self.buffer_of.contains_key(&v) {
                let b = self.add_buffer(v, BufferKind::Output(i))?;
                self.buffer_of.insert(v, b);
                out_bufs[i] = Some(b);
            } else {
                copies.push(i);
            }
        }
        // A group output that only reshapes another value stored by the same group
        // (a LayerNorm written for the next matmul as [b·s, n], a convolution's
        // input as [n, c, h·w]) is not stored again: its readers take the view.
        for group in &fusion.groups {
            for &v in &group.outputs {
                if self.buffer_of.contains_key(&v) {
                    continue;
                }
                let src = self.producers[v.index()]
                    .filter(|p| matches!(g.nodes[*p].op, Op::Reshape))
                    .map(|p| g.nodes[p].inputs[0]);
                match src {
                    Some(u) if group.outputs.contains(&u) && !self.views.contains_key(&u) => {
                        self.views.insert(v, u);
                    }
                    _ => {
                        if let Some(u) = self.strided_source(group, v) {
                            self.views.insert(v, u);
                            self.view_sources.insert(u);
                        }
                    }
                }
            }
            let sources: Vec<ValueId> = group
                .nodes
                .iter()
                .map(|n| g.nodes[*n].output)
                .filter(|u| self.view_sources.contains(u))
                .collect();
            for u in sources {
                if !self.buffer_of.contains_key(&u) {
                    let b = self.temp(u)?;
                    self.buffer_of.insert(u, b);
                }
            }
            for &v in &group.outputs {
                if !self.buffer_of.contains_key(&v) && !self.views.contains_key(&v) {
                    let b = self.temp(v)?;
                    self.buffer_of.insert(v, b);
                }
            }
        }
        for (gi, group) in fusion.groups.iter().enumerate() {
            let first = self.plan.steps.len();
            self.group(gi, group)?;
            self.plan.groups.push(GroupSteps { kind: group.kind, steps: first..self.plan.steps.len() });
        }
        if !copies.is_empty() {
            let first = self.plan.steps.len();
            let gi = self.plan.groups.len();
            for i in copies {
                let v = g.outputs[i];
                let b = self.add_buffer(v, BufferKind::Output(i))?;
                out_bufs[i] = Some(b);
                let avail = self.buffer_of.clone();
                let name = format!("copy_{}", i);
                self.loop_step(gi, &avail, name, &[(v, b)])?;
            }
            let steps = first..self.plan.steps.len();
            self.plan.groups.push(GroupSteps { kind: GroupKind::Elementwise, steps });
        }
        self.plan.outputs = out_bufs
            .into_iter()
            .map(|b| b.ok_or_else(|| LowerError::Internal("an output without a buffer".into())))
            .collect::<R<_>>()?;
        self.plan.compute_lifetimes();
        Ok(self.plan)
    }

    fn group(&mut self, gi: usize, group: &FusionGroup) -> R<()> {
        let g = self.g;
        let mut avail: HashMap<ValueId, BufId> = HashMap::new();
        for v in &group.inputs {
            // A view is read through the value it reshapes.
            let held = self.views.get(v).copied().unwrap_or(*v);
            let b = *self
                .buffer_of
                .get(&held)
                .ok_or_else(|| LowerError::Internal(format!("group input '{}' has no buffer", g.name(*v))))?;
            avail.insert(held, b);
        }
        for &n in &group.nodes {
            let v = g.nodes[n].output;
            if let Some(&b) = self.stored_early.get(&v) {
                avail.insert(v, b);
            }
        }
        let mut part = 0;
        for &n in &group.nodes {
            let node = &g.nodes[n];
            if !self.backbone(node) {
                continue;
            }
            // Operands that are not views of a buffer are computed first, and B
            // when its batch is factored other than A's (see `operand_views`).
            let views = [self.a_layout(node, &avail), self.layout(node.inputs[1], &avail)];
            let fits = match &views[..] {
                [Some(la), Some(lb)] if la.matrix() && lb.matrix() => {
                    let lc = self.layout(node.output, &HashMap::from([(node.output, 0)]));
                    lc.is_some_and(|lc| Self::operand_views(g, node, [la, lb, &lc]).is_some())
                }
                _ => true,
            };
            let mut pending = Vec::new();
            for (i, &v) in node.inputs.iter().enumerate() {
                let matrix = views[i].as_ref().is_some_and(Layout::matrix);
                if matrix && (fits || i == 0) {
                    continue;
                }
                // A convolution's taps are read from the image: it is stored (channels
                // last) when no buffer holds it so.
                if let Some(t) = (i == 0).then(|| self.taps(node, &avail)).flatten() {
                    if self.taps_image(&t, &avail).is_none() && !pending.iter().any(|(p, _)| *p == t.image) {
                        pending.push((t.image, self.temp(t.image)?));
                    }
                    continue;
                }
                if !pending.iter().any(|(p, _)| *p == v) {
                    let b = match self.buffer_of.get(&v) {
                        Some(b) if group.outputs.contains(&v) => *b,
                        _ => self.temp(v)?,
                    };
                    pending.push((v, b));
                }
            }
            self.flush(gi, group, &mut part, &mut avail, pending)?;
            let out = node.output;
            let c = match self.buffer_of.get(&out) {
                Some(b) if group.outputs.contains(&out) || self.view_sources.contains(&out) => *b,
                _ => self.temp(out)?,
            };
            let mut step = self.matmul(node, c, &avail)?;
            avail.insert(out, c);
            // The group's one remaining output, when it is the engine's epilogue of
            // this (last) backbone, is written by the matmul itself.
            let rest: Vec<ValueId> = self
                .stored(group)
                .into_iter()
                .filter(|v| !avail.contains_key(v) && !self.views.contains_key(v))
                .collect();
            let last = !group.nodes.iter().any(|m| *m > n && self.backbone(&g.nodes[*m]));
            // A batch of products (a convolution over images) shares its bias and
            // activation; its residual is read per entry, at the output's offsets.
            let integral = node.inputs.iter().all(|x| integers_within(g, *x, (i64::MIN, i64::MAX)));
            // The most an integer product's sum can be (its depth times its
            // operands' largest values), for `requantize::requantized`.
            let most = || -> Option<f64> {
                let big = |v: ValueId| {
                    passes::value_range(g, v).map(|(lo, hi)| lo.unsigned_abs().max(hi.unsigned_abs()))
                };
                let depth = g.ty(node.inputs[0]).shape.last()?.as_const()?;
                Some(depth as f64 * big(node.inputs[0])? as f64 * big(node.inputs[1])? as f64)
            };
            let sums_within = if integral { most() } else { None };
            let private = !group.outputs.contains(&out) && !self.view_sources.contains(&out);
            let mut folded = false;
            if last && rest.len() == 1 && private {
                let v = rest[0];
                if let Some(e) = self.fold_epilogue(gi, out, v, &avail, integral)? {
                    let c = self.buffer_of[&v];
                    step.c.buf = c;
                    let e = requantize::requantized(e, sums_within);
                    step.epilogue = if self.epilogue_params { parameterized(e) } else { e };
                    if matches!(self.plan.buffers[c].kind, BufferKind::Temp) && self.codes_fit(&step, v) {
                        self.plan.buffers[c].dtype = DType::U8;
                        self.narrowed.insert(c, DType::U8);
                        step.epilogue.codes = true;
                    }
                    avail.insert(v, c);
                    folded = true;
                }
            }
            // Else the quantization of the product's output that the rest of the
            // group, or the one later group reading it, computes first (a
            // residual block's sum of two dequantized products): the product
            // stores those codes, and the program reads them instead.
            let later = !private && !self.view_sources.contains(&out) && !g.outputs.contains(&out);
            let codes = match (folded, private) {
                (false, true) => self.codes_of(out, gi),
                (false, false) if later => self.reader_group(out).and_then(|r| self.codes_of(out, r)),
                _ => None,
            };
            if let Some(u) = codes.filter(|u| self.codes_fit(&step, *u)) {
                // A later group's quantization reads that group's constants
                // (a per-channel scale), held in buffers of their own.
                let reach = match private {
                    true => None,
                    false => {
                        let mut reach = avail.clone();
                        self.add_constants_read(u, &mut reach);
                        Some(reach)
                    }
                };
                if let Some(e) = self.fold_epilogue(gi, out, u, reach.as_ref().unwrap_or(&avail), integral)? {
                    let c = self.temp(u)?;
                    self.plan.buffers[c].dtype = DType::U8;
                    self.narrowed.insert(c, DType::U8);
                    step.c.buf = c;
                    let e = requantize::requantized(e, sums_within);
                    step.epilogue = if self.epilogue_params { parameterized(e) } else { e };
                    step.epilogue.codes = true;
                    // (A later group's product output stays listed: nothing reads
                    // it now, and nothing is to compute it.)
                    if private {
                        avail.remove(&out);
                        avail.insert(u, c);
                    } else {
                        self.stored_early.insert(u, c);
                    }
                }
            }
            self.plan.steps.push(Step { group: gi, kind: StepKind::MatMul(Box::new(step)) });
        }
        let pending: Vec<(ValueId, BufId)> = self
            .stored(group)
            .into_iter()
            .filter(|v| !avail.contains_key(v) && !self.views.contains_key(v))
            .map(|v| (v, self.buffer_of[&v]))
            .collect();
        let stored: Vec<ValueId> = pending.iter().map(|p| p.0).collect();
        let (singles, first) = self.whole_reductions(group, &stored);
        // The stored values the single values' reductions read (and the values
        // they read that the group would not store otherwise), then those, then
        // the rest.
        let (mut early, rest): (Vec<_>, Vec<_>) = pending.into_iter().partition(|p| first.contains(&p.0));
        for v in first {
            if !avail.contains_key(&v) && !early.iter().any(|p| p.0 == v) {
                early.push((v, self.temp(v)?));
            }
        }
        self.flush(gi, group, &mut part, &mut avail, early)?;
        // With them, the group's other single values: one program of them all.
        let (mut once, rest): (Vec<_>, Vec<_>) = match singles.is_empty() {
            true => (Vec::new(), rest),
            false => rest.into_iter().partition(|p| self.g.ty(p.0).is_one_element()),
        };
        for v in singles {
            if !avail.contains_key(&v) && !once.iter().any(|p| p.0 == v) {
                once.push((v, self.temp(v)?));
            }
        }
        self.flush(gi, group, &mut part, &mut avail, once)?;
        self.flush(gi, group, &mut part, &mut avail, rest)
    }

    /// Whether `step`, a product whose epilogue computes `v`, may store `v` as
    /// u8 codes: a weight's product that one K block computes (a byte keeps
    /// no partial sum) of a value that only programs and products by
    /// constants read ([`narrowable`]).
    fn codes_fit(&self, step: &MatMulStep, v: ValueId) -> bool {
        let k = self.plan.dims.exprs()[step.k as usize].as_const();
        self.u8_codes
            && step.weight
            && k.is_some_and(|k| k <= self.codes_depth as i64)
            && narrowable(self.g, v)
    }

    /// The one group (another than the producer's) that reads value `v`.
    /// Add to `avail` the constants that `v`'s expression reads, with their
    /// buffers: the nodes computing `v` walked back to values in `avail`.
    fn add_constants_read(&self, v: ValueId, avail: &mut HashMap<ValueId, BufId>) {
        let mut stack = vec![v];
        let mut seen = std::collections::HashSet::new();
        while let Some(u) = stack.pop() {
            if avail.contains_key(&u) || !seen.insert(u) {
                continue;
            }
            if let Some(&b) = self.constant_buffer(u) {
                avail.insert(u, b);
            } else if let Some(p) = self.producers[u.index()] {
                stack.extend(self.g.nodes[p].inputs.iter().copied());
            }
        }
    }

    fn reader_group(&self, v: ValueId) -> Option<usize> {
        let producer = self.producers[v.index()].map(|p| self.group_of[p]);
        let mut groups = self.readers[v.index()].iter().map(|r| self.group_of[*r]);
        let first = groups.next()?;
        (groups.all(|r| r == first) && Some(first) != producer).then_some(first)
    }

    /// The last value of the chain of element-wise operations (and views)
    /// from product output `c` inside group `gi`, each the one reader of the
    /// one before and reading nothing else but constants, that holds codes
    /// (integers in 0..=255 by the graph's bounds): a quantization of `c`
    /// alone, which the product's epilogue can compute.
    fn codes_of(&self, c: ValueId, gi: usize) -> Option<ValueId> {
        let g = self.g;
        let constant = |u: ValueId| {
            let mut u = u;
            loop {
                match self.producers[u.index()].map(|p| &g.nodes[p]) {
                    Some(n) if matches!(n.op, Op::Constant(_)) => return true,
                    Some(n) if matches!(n.op, Op::Cast | Op::Reshape | Op::Broadcast) => u = n.inputs[0],
                    _ => return false,
                }
            }
        };
        let (mut at, mut found) = (c, None);
        while let [r] = self.readers[at.index()][..] {
            let node = &g.nodes[r];
            let pointwise = matches!(
                node.op,
                Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast | Op::Reshape | Op::Broadcast
            );
            if !pointwise || self.group_of[r] != gi || !node.inputs.iter().all(|i| *i == at || constant(*i)) {
                break;
            }
            at = node.output;
            if g.outputs.contains(&at) || self.buffer_of.contains_key(&at) || self.view_sources.contains(&at)
            {
                break;
            }
            if integers_within(g, at, (0, 255)) {
                found = Some(at);
            }
        }
        found
    }

    /// The single values of `group` computed from reductions of whole tensors
    /// that larger values of the group read (a dynamic quantization's scale and
    /// zero point, read by the quantized tensor): stored once by the group's
    /// program of single values, so that the larger program loads them instead
    /// of reducing the whole input again in each of its parts. With them, the
    /// values that their reductions read when those come from reductions
    /// themselves (a layer norm's output that is then quantized, whether the
    /// group stores it or not): those are stored first, by a program of their
    /// own, and the reductions read them back instead of computing the layer
    /// norm again.
    fn whole_reductions(&self, group: &FusionGroup, stored: &[ValueId]) -> (Vec<ValueId>, Vec<ValueId>) {
        let g = self.g;
        let single = |v: ValueId| g.ty(v).is_one_element();
        let inside: HashSet<usize> = group.nodes.iter().copied().collect();
        // `derived`: values that depend on a reduction in the group; `reduced`:
        // single values from reductions of values that do not, or that the group
        // stores (`first`, per value: those it reads); a reduction of recomputed
        // reductions (a softmax over pooled means) stays in the program that
        // recomputes them, in one order.
        let mut derived: HashSet<ValueId> = HashSet::new();
        let mut reduced: HashMap<ValueId, Vec<ValueId>> = HashMap::new();
        for &n in &group.nodes {
            let node = &g.nodes[n];
            let is_derived = |v: &ValueId| derived.contains(v);
            let from_derived = node.inputs.iter().any(is_derived);
            let first: Option<Vec<ValueId>> = match node.op {
                Op::Reduce { .. } => match node.inputs[0] {
                    v if !is_derived(&v) => Some(Vec::new()),
                    v if stored.contains(&v) || !single(v) => Some(vec![v]),
                    _ => None,
                },
                _ if from_derived => node
                    .inputs
                    .iter()
                    .filter(|v| is_derived(v))
                    .map(|v| reduced.get(v).cloned())
                    .collect::<Option<Vec<_>>>()
                    .map(|f| f.concat()),
                _ => None,
            };
            if let Some(first) = first.filter(|_| single(node.output)) {
                reduced.insert(node.output, first);
            }
            if from_derived || matches!(node.op, Op::Reduce { .. }) {
                derived.insert(node.output);
            }
        }
        let (mut out, mut first) = (Vec::new(), Vec::new());
        for &n in &group.nodes {
            let node = &g.nodes[n];
            if single(node.output) {
                continue;
            }
            for &v in &node.inputs {
                // Under its reshapes (read through them as views of it).
                let mut v = v;
                while let Some(p) = self.producers[v.index()].filter(|p| inside.contains(p)) {
                    match g.nodes[p].op {
                        Op::Reshape if reduced.contains_key(&g.nodes[p].inputs[0]) => {
                            v = g.nodes[p].inputs[0]
                        }
                        _ => break,
                    }
                }
                let made_here = self.producers[v.index()].is_some_and(|p| inside.contains(&p));
                if let Some(f) = reduced.get(&v).filter(|_| made_here && !out.contains(&v)) {
                    out.push(v);
                    for u in f {
                        if !first.contains(u) {
                            first.push(*u);
                        }
                    }
                }
            }
        }
        (out, first)
    }

    /// What `group` writes: its outputs and the values its outputs are views of.
    fn stored(&self, group: &FusionGroup) -> Vec<ValueId> {
        let g = self.g;
        let mut out = group.outputs.clone();
        for n in &group.nodes {
            let u = g.nodes[*n].output;
            if self.view_sources.contains(&u) && !out.contains(&u) {
                out.push(u);
            }
        }
        out
    }

    /// The value that `v` (a group output) is a strided view of, when every
    /// reader of `v` is a matmul (which takes any strided operand) and `v` is
    /// slices, reshapes, transposes and broadcasts inside the group of a value
    /// the group computes or of a buffer (an input, another group's output): a
    /// head split of a merged QKV product, or a cache's heads expanded for
    /// grouped queries, is then never copied.
    fn strided_source(&self, group: &FusionGroup, v: ValueId) -> Option<ValueId> {
        let g = self.g;
        if !self.matmul_steps {
            return None;
        }
        if g.outputs.contains(&v) {
            return None;
        }
        let readers = g.nodes.iter().filter(|n| n.inputs.contains(&v));
        let mut any = false;
        for r in readers {
            any = true;
            if !matches!(r.op, Op::MatMul { .. }) {
                return None;
            }
        }
        if !any {
            return None;
        }
        let mut cur = v;
        while let Some(p) = self.producers[cur.index()].filter(|p| group.nodes.contains(p)) {
            match g.nodes[p].op {
                Op::Reshape | Op::Transpose { .. } | Op::Slice { .. } | Op::Broadcast => {
                    cur = g.nodes[p].inputs[0]
                }
                _ => break,
            }
        }
        if cur == v {
            return None;
        }
        match self.producers[cur.index()] {
            Some(p) if group.nodes.contains(&p) => {
                if matches!(g.nodes[p].op, Op::Constant(_)) {
                    return None;
                }
            }
            // A buffer already: a model input or another group's output (a weight
            // stays the constant the engine packs).
            _ => {
                if !self.buffer_of.contains_key(&cur) || self.constant_buffer(cur).is_some() {
                    return None;
                }
            }
        }
        // The chain must be one strided layout of `cur` (any buffer id will do here).
        self.layout(v, &HashMap::from([(cur, 0)])).map(|_| cur)
    }

    /// Loop programs storing `pending`: one per class of equal element counts.
    fn flush(
        &mut self,
        gi: usize,
        group: &FusionGroup,
        part: &mut usize,
        avail: &mut HashMap<ValueId, BufId>,
        pending: Vec<(ValueId, BufId)>,
    ) -> R<()> {
        let env = &self.g.env;
        let mut classes: Vec<Vec<(ValueId, BufId)>> = Vec::new();
        for (v, b) in pending {
            // One nest stores values whose shapes are splits and merges of each
            // other (the row-major order kept): a layer norm and its reshape. A
            // reordered layout (a head split's Kᵀ) gets a nest of its own, so that
            // no store needs a division by a symbolic dim per element.
            let shape = &self.g.ty(v).shape;
            let same = |c: &Vec<(ValueId, BufId)>| same_order(env, shape, &self.g.ty(c[0].0).shape);
            match classes.iter_mut().find(|c| same(c)) {
                Some(c) => c.push((v, b)),
                None => classes.push(vec![(v, b)]),
            }
        }
        // Single values first: a larger program then reads those it needs.
        classes.sort_by_key(|c| !self.g.ty(c[0].0).is_one_element());
        for class in classes {
            let name =
                format!("g{gi}_{}{}", group.kind, if *part > 0 { format!("_{part}") } else { String::new() });
            *part += 1;
            self.loop_step(gi, avail, name, &class)?;
            for (v, b) in class {
                avail.insert(v, b);
            }
        }
        Ok(())
    }

    /// One loop program over the finest shape among the stored values and the
    /// reshapes they come from (a head merge loops over `[b, s, h, d]`, not
    /// `[b·s, h·d]`), added as a step (its code shared with an identical one).
    fn loop_step(
        &mut self,
        gi: usize,
        avail: &HashMap<ValueId, BufId>,
        name: String,
        outs: &[(ValueId, BufId)],
    ) -> R<()> {
        let g = self.g;
        let mut space: Vec<SymExpr> = g.ty(outs[0].0).shape.clone();
        for (v, _) in outs {
            let mut cur = *v;
            loop {
                let shape = &g.ty(cur).shape;
                if shape.len() > space.len() {
                    space = shape.clone();
                }
                match self.producers[cur.index()] {
                    Some(p) if matches!(g.nodes[p].op, Op::Reshape) && !avail.contains_key(&cur) => {
                        cur = g.nodes[p].inputs[0];
                    }
                    _ => break,
                }
            }
        }
        if self.u8_codes {
            for &(v, b) in outs {
                if matches!(self.plan.buffers[b].kind, BufferKind::Temp) && narrowable(g, v) {
                    self.plan.buffers[b].dtype = DType::U8;
                    self.narrowed.insert(b, DType::U8);
                }
            }
        }
        let b = Builder::new(g, &mut self.plan.dims, avail, &self.narrowed);
        let (program, args) = b.program(name, &space, outs)?;
        self.add_program_step(gi, program, args);
        Ok(())
    }

    /// A step running `program` on `args` (its code shared with an identical one).
    fn add_program_step(&mut self, gi: usize, program: plan::LoopProgram, args: Vec<BufId>) {
        let key = plan::print_program(&program, false);
        let index = match self.programs.get(&key) {
            Some(i) => *i,
            None => {
                self.plan.programs.push(program);
                self.programs.insert(key, self.plan.programs.len() - 1);
                self.plan.programs.len() - 1
            }
        };
        self.plan.steps.push(Step { group: gi, kind: StepKind::Loop { program: index, args } });
    }

    /// The strided layout of `v` when it is a view of a buffer in `avail`.
    fn layout(&self, v: ValueId, avail: &HashMap<ValueId, BufId>) -> Option<Layout> {
        self.layout_in(v, avail, false)
    }

    /// The layout of `node`'s A: with a weight as B (whose kernels read codes
    /// as A), a widening of u8 codes to f32 (a buffer of u8 values, or of
    /// integer codes stored narrowed: a dynamic quantization's) is a view of
    /// the codes, not a copy.
    fn a_layout(&self, node: &ir::Node, avail: &HashMap<ValueId, BufId>) -> Option<Layout> {
        let weight = self
            .layout(node.inputs[1], avail)
            .is_some_and(|l| matches!(self.plan.buffers[l.buf].kind, BufferKind::Constant(_)));
        self.layout_in(node.inputs[0], avail, weight && self.u8_codes)
    }

    /// [`Self::layout`], through widenings of codes where `codes`.
    fn layout_in(&self, v: ValueId, avail: &HashMap<ValueId, BufId>, codes: bool) -> Option<Layout> {
        let g = self.g;
        let ty = g.ty(v);
        if let Some(&buf) = avail.get(&v).or_else(|| self.constant_buffer(v)) {
            let mut dims = vec![(SymExpr::constant(1), SymExpr::constant(1)); ty.rank()];
            let mut stride = SymExpr::constant(1);
            for d in (0..ty.rank()).rev() {
                dims[d] = (ty.shape[d].clone(), stride.clone());
                stride = stride.try_mul(&ty.shape[d]).ok()?;
            }
            let factors = vec![Vec::new(); dims.len()];
            return Some(Layout { buf, offset: SymExpr::constant(0), dims, factors });
        }
        let node = &g.nodes[self.producers[v.index()]?];
        let mut l = match &node.op {
            Op::Reshape | Op::Transpose { .. } | Op::Broadcast | Op::Slice { .. } => {
                self.layout_in(node.inputs[0], avail, codes)?
            }
            Op::Cast if codes && ty.dtype == DType::F32 => {
                let from = g.ty(node.inputs[0]).dtype;
                let l = self.layout_in(node.inputs[0], avail, codes)?;
                let bytes = self.plan.buffers[l.buf].dtype == DType::U8;
                return (bytes && matches!(from, DType::U8 | DType::I32)).then_some(l);
            }
            _ => return None,
        };
        let out = &ty.shape;
        match &node.op {
            Op::Transpose { perm } => {
                l.dims = perm.iter().map(|p| l.dims[*p].clone()).collect();
                l.factors = perm.iter().map(|p| l.factors[*p].clone()).collect();
            }
            Op::Broadcast => {
                for (d, o) in l.dims.iter_mut().zip(out) {
                    if !g.env.equal(&d.0, o) {
                        if d.0.as_const() != Some(1) {
                            return None;
                        }
                        *d = (o.clone(), SymExpr::constant(0));
                    }
                }
            }
            Op::Slice { axes } => {
                for a in axes {
                    if a.step <= 0 || !l.plain(a.axis) {
                        return None;
                    }
                    let (_, s) = l.dims[a.axis].clone();
                    l.offset = l.offset.try_add(&a.start.try_mul(&s).ok()?).ok()?;
                    l.dims[a.axis] = (out[a.axis].clone(), s.try_scale(a.step).ok()?);
                }
            }
            Op::Reshape => {
                let from: Vec<SymExpr> = l.dims.iter().map(|d| d.0.clone()).collect();
                let mut dims = vec![(SymExpr::constant(1), SymExpr::constant(0)); out.len()];
                let mut factors = vec![Vec::new(); out.len()];
                for (fr, tr) in match_groups(&g.env, &from, out)? {
                    // The group's dims (ignoring extents of 1) as factors, outer to
                    // inner, contiguous neighbours merged.
                    let mut parts: Vec<(SymExpr, SymExpr)> = Vec::new();
                    for d in fr {
                        let fs =
                            if l.plain(d) { std::slice::from_ref(&l.dims[d]) } else { &l.factors[d][..] };
                        for f in fs.iter().filter(|f| f.0.as_const() != Some(1)) {
                            match parts.last_mut() {
                                Some(last) if g.env.equal(&last.1, &f.1.try_mul(&f.0).ok()?) => {
                                    *last = (last.0.try_mul(&f.0).ok()?, f.1.clone());
                                }
                                _ => parts.push(f.clone()),
                            }
                        }
                    }
                    if parts.len() <= 1 {
                        let mut stride = parts.last().map_or(SymExpr::constant(1), |d| d.1.clone());
                        for d in tr.rev() {
                            dims[d] = (out[d].clone(), stride.clone());
                            stride = stride.try_mul(&out[d]).ok()?;
                        }
                        continue;
                    }
                    // Not contiguous: one dim made of all the factors, or one dim a factor.
                    let real: Vec<usize> = tr.filter(|d| out[*d].as_const() != Some(1)).collect();
                    if let [d] = real[..] {
                        dims[d] = (out[d].clone(), SymExpr::constant(0));
                        factors[d] = parts;
                    } else if real.len() == parts.len()
                        && real.iter().zip(&parts).all(|(d, p)| g.env.equal(&out[*d], &p.0))
                    {
                        for (d, p) in real.into_iter().zip(parts) {
                            dims[d] = (out[d].clone(), p.1);
                        }
                    } else {
                        return None;
                    }
                }
                l.dims = dims;
                l.factors = factors;
            }
            _ => return None,
        }
        Some(l)
    }

    /// The A operand of `mm` as a convolution's taps over a channels-last image
    /// (the column matrix `passes::conv` builds: `kh·kw` strided slices of the
    /// image, zero-padded or not, each `[n, oh, ow, C]`, joined along a new axis
    /// and read as `[…, n·oh·ow, kh·kw·C]`; for a grouped convolution, images,
    /// taps and matrix have the group in front: `[G, n, h, w, C/G]` taps and a
    /// `[G, n·oh·ow, kh·kw·C/G]` matrix, one product per group): the image and
    /// the convolution's geometry. None when A is anything else.
    fn taps(&self, mm: &ir::Node, avail: &HashMap<ValueId, BufId>) -> Option<TapGeometry> {
        let g = self.g;
        if !matches!(mm.op, Op::MatMul { transpose_a: false, .. }) || g.ty(mm.inputs[0]).dtype != DType::F32 {
            return None;
        }
        // A value computed here, not read from a buffer, and its producer.
        let made =
            |v: ValueId| self.producers[v.index()].filter(|_| !avail.contains_key(&v)).map(|p| &g.nodes[p]);
        let env = &g.env;
        let col = mm.inputs[0];
        let matrix = made(col).filter(|n| n.op == Op::Reshape)?;
        let joined = matrix.inputs[0];
        // The taps, each `[n, oh, ow, C]`: the concatenation's parts (each a reshape
        // to `[n, oh, ow, 1, C]`), or one tap.
        // Dims before the image's own: the group's, or none.
        let lead = g.ty(col).rank().checked_sub(2)?;
        let lead = if lead == 1 && g.ty(col).shape[0].as_const() == Some(1) { 0 } else { lead };
        let taps: Vec<ValueId> = match made(joined) {
            Some(n) if n.op == (Op::Concat { axis: 3 + lead }) && g.ty(joined).rank() == 5 + lead => n
                .inputs
                .iter()
                .map(|&t| made(t).filter(|r| r.op == Op::Reshape).map(|r| r.inputs[0]))
                .collect::<Option<_>>()?,
            _ => vec![joined],
        };
        let tap_ty = g.ty(taps[0]);
        if tap_ty.rank() != 4 + lead {
            return None;
        }
        let (n, oh, ow) = (&tap_ty.shape[lead], &tap_ty.shape[lead + 1], &tap_ty.shape[lead + 2]);
        let c = tap_ty.shape[lead + 3].as_const()?;
        // Each tap: one image sliced along its rows and columns, with one step.
        let mut image = None;
        let mut steps = None;
        let mut starts = Vec::with_capacity(taps.len());
        for &t in &taps {
            let slice = made(t)?;
            let Op::Slice { axes } = &slice.op else { return None };
            let same = g.ty(t).shape.iter().zip(&tap_ty.shape).all(|(a, b)| env.equal(a, b));
            if g.ty(t).rank() != 4 + lead || !same || *image.get_or_insert(slice.inputs[0]) != slice.inputs[0]
            {
                return None;
            }
            let (mut start, mut step) = ([0i64; 2], [1i64; 2]);
            for a in axes {
                let d = a.axis.checked_sub(1 + lead).filter(|d| *d < 2)?;
                start[d] = a.start.as_const()?;
                step[d] = a.step;
            }
            if step.iter().any(|s| *s <= 0) || start.iter().any(|s| *s < 0) {
                return None;
            }
            if *steps.get_or_insert(step) != step {
                return None;
            }
            starts.push(start);
        }
        // The taps in row-major order over a `kh × kw` grid from (0, 0).
        let kk = taps.len();
        let kw = starts.iter().take_while(|s| s[0] == starts[0][0]).count();
        let kh = kk / kw;
        let dh = if kh > 1 { starts[kw][0] } else { 1 };
        let dw = if kw > 1 { starts[1][1] } else { 1 };
        let grid = (0..kk).all(|t| starts[t] == [(t / kw) as i64 * dh, (t % kw) as i64 * dw]);
        if kh * kw != kk || dh <= 0 || dw <= 0 || !grid {
            return None;
        }
        // The matrix is `[1, …, n·oh·ow, kh·kw·C]`, or `[G, n·oh·ow, kh·kw·C]`.
        let ms = &g.ty(col).shape;
        let rows = n.try_mul(oh).and_then(|r| r.try_mul(ow)).ok()?;
        let r = ms.len();
        let batch_ok = if lead == 0 {
            ms[..r - 2].iter().all(|d| d.as_const() == Some(1))
        } else {
            ms[..r - 2].iter().zip(&tap_ty.shape[..lead]).all(|(a, b)| env.equal(a, b))
        };
        if !batch_ok || ms[r - 1].as_const() != Some(kk as i64 * c) || !env.equal(&ms[r - 2], &rows) {
            return None;
        }
        // Zero padding before the image's rows and columns (after them, the output's
        // extent decides what is read, all of it zero). Padding by another value
        // (a zero point moved out of the product, `passes::MoveZeroPointOut`) is
        // part of the image, which is stored padded.
        let mut img = image?;
        let mut pad = [0i64; 2];
        if let Some(p) = made(img) {
            if let Op::Pad { pads, mode: ir::PadMode::Constant(0.0) } = &p.op {
                let konst = |e: &SymExpr| e.as_const().filter(|v| *v >= 0);
                let spatial = |d: usize| d == lead + 1 || d == lead + 2;
                let ok = pads.len() == 4 + lead
                    && (0..pads.len()).all(|d| match spatial(d) {
                        true => konst(&pads[d].0).is_some() && konst(&pads[d].1).is_some(),
                        false => konst(&pads[d].0) == Some(0) && konst(&pads[d].1) == Some(0),
                    });
                if !ok {
                    return None;
                }
                pad = [konst(&pads[lead + 1].0)?, konst(&pads[lead + 2].0)?];
                img = p.inputs[0];
            }
        }
        let us = |v: i64| usize::try_from(v).ok();
        Some(TapGeometry {
            image: img,
            lead,
            channels: c,
            out: [oh.clone(), ow.clone()],
            kernel: [kh, kw],
            stride: [us(steps?[0])?, us(steps?[1])?],
            dilation: [us(dh)?, us(dw)?],
            pad: [us(pad[0])?, us(pad[1])?],
        })
    }

    /// The layout of the taps' image when a buffer holds it with its channels
    /// contiguous (as the engine reads it).
    fn taps_image(&self, t: &TapGeometry, avail: &HashMap<ValueId, BufId>) -> Option<Layout> {
        let lay = self.layout(t.image, avail)?;
        let channels = lay.dims.get(t.lead + 3)?;
        (lay.dims.len() == 4 + t.lead
            && (0..lay.dims.len()).all(|d| lay.plain(d))
            && channels.1.as_const() == Some(1)
            && channels.0.as_const() == Some(t.channels))
        .then_some(lay)
    }

    fn constant_buffer(&self, v: ValueId) -> Option<&BufId> {
        self.buffer_of.get(&v).filter(|b| matches!(self.plan.buffers[**b].kind, BufferKind::Constant(_)))
    }

    /// The batch of matmul `node` over its operands' and output's layouts:
    /// `None` when a layout's rows or columns are factored, or two layouts
    /// factor a batch dim differently (then an operand is stored first).
    fn operand_views(g: &Graph, node: &ir::Node, layouts: [&Layout; 3]) -> Option<RefinedBatch> {
        let out = &g.ty(node.output).shape;
        let r = out.len();
        if layouts.iter().any(|l| l.dims.len() != r || !l.matrix()) {
            return None;
        }
        refine_batch(&g.env, &out[..r - 2], &layouts)
    }

    fn matmul(&mut self, node: &ir::Node, c: BufId, avail: &HashMap<ValueId, BufId>) -> R<MatMulStep> {
        let g = self.g;
        let Op::MatMul { transpose_a, transpose_b } = node.op else {
            return Err(LowerError::Internal("not a matmul".into()));
        };
        let missing =
            || LowerError::Internal(format!("an operand of '{}' is not a view", g.name(node.output)));
        let (la, taps) = match self.a_layout(node, avail).filter(|l| l.matrix()) {
            Some(l) => (l, None),
            None => {
                let t = self.taps(node, avail).ok_or_else(missing)?;
                let image = self.taps_image(&t, avail).ok_or_else(missing)?;
                // A's view is where the image starts (each group's, from the image's
                // leading dims); the taps say how it is read.
                let zero = (SymExpr::constant(1), SymExpr::constant(0));
                let mut dims = vec![zero; g.ty(node.output).rank()];
                if t.lead > 0 {
                    dims[..t.lead].clone_from_slice(&image.dims[..t.lead]);
                }
                let factors = vec![Vec::new(); dims.len()];
                let a = Layout { buf: image.buf, offset: image.offset.clone(), dims, factors };
                (a, Some((t, image)))
            }
        };
        let lb = self.layout(node.inputs[1], avail).ok_or_else(missing)?;
        let lc = self.layout(node.output, &HashMap::from([(node.output, c)])).ok_or_else(missing)?;
        let out = &g.ty(node.output).shape;
        let r = out.len();
        let refined = Self::operand_views(g, node, [&la, &lb, &lc]).ok_or_else(missing)?;
        let slot = |l: &mut Self, e: &SymExpr| {
            let e = g.env.normalize(e);
            l.plan.dims.slot(&e)
        };
        let view = |l: &mut Self, lay: &Layout, batch: &[SymExpr], swap: bool| {
            let (rs, cs) = (&lay.dims[r - 2].1, &lay.dims[r - 1].1);
            let (rs, cs) = if swap { (cs, rs) } else { (rs, cs) };
            View {
                buf: lay.buf,
                offset: slot(l, &lay.offset),
                batch: batch.iter().map(|s| slot(l, s)).collect(),
                rs: slot(l, rs),
                cs: slot(l, cs),
            }
        };
        let a = view(self, &la, &refined.strides[0], transpose_a);
        let b = view(self, &lb, &refined.strides[1], transpose_b);
        let cv = view(self, &lc, &refined.strides[2], false);
        let a_shape = &g.ty(node.inputs[0]).shape;
        let k = if transpose_a { &a_shape[r - 2] } else { &a_shape[r - 1] };
        let weight = matches!(self.plan.buffers[lb.buf].kind, BufferKind::Constant(_))
            && (0..r - 2).all(|d| lb.plain(d))
            && lb.dims[..r - 2].iter().all(|d| d.1.as_const() == Some(0) || d.0.as_const() == Some(1));
        let taps_channels = taps.as_ref().map(|(t, _)| t.channels);
        let taps = taps.map(|(t, lay)| {
            let d = &lay.dims[t.lead..];
            (
                d[0].0.clone(),
                d[1].0.clone(),
                d[2].0.clone(),
                [d[0].1.clone(), d[1].1.clone(), d[2].1.clone()],
                t,
            )
        });
        let taps = taps.map(|(n, h, w, strides, t)| Taps {
            image: [&n, &h, &w, &SymExpr::constant(t.channels)].map(|e| slot(self, e)),
            strides: strides.each_ref().map(|e| slot(self, e)),
            out: t.out.each_ref().map(|e| slot(self, e)),
            kernel: t.kernel,
            stride: t.stride,
            dilation: t.dilation,
            pad: t.pad,
        });
        // Taps are packed a tap's channels at a time, which for a type of several
        // depths a word is only fast when every tap's channels start a word (an
        // RGB image's three do not: that product stays in floats).
        let words_of_channels = |e: plan::ElemType| taps_channels.is_none_or(|c| c % e.k_group() as i64 == 0);
        let s8_weight = weight && integers_within(g, node.inputs[1], (-128, 127));
        let i16 = weight
            && words_of_channels(plan::ElemType::I16)
            && sixteen_bit_products(g, node.inputs[0], node.inputs[1], k);
        Ok(MatMulStep {
            batch: refined.extents.iter().map(|e| slot(self, e)).collect(),
            m: slot(self, &out[r - 2]),
            n: slot(self, &out[r - 1]),
            k: slot(self, k),
            a,
            taps,
            b,
            c: cv,
            weight,
            u8s8: weight
                && words_of_channels(plan::ElemType::U8S8)
                && integers_within(g, node.inputs[0], (0, 255))
                && s8_weight,
            i16,
            i16s8: i16 && s8_weight,
            epilogue: MatEpilogue::default(),
            a_bf16: None,
            c_bf16: None,
            a_norm: None,
        })
    }

    /// The epilogue computing `v` from the matmul output `c`, when it is
    /// `act(scale·c + bias[col] + residual)` over `c`'s row-major positions, or
    /// (with column scales) an affine function of `c` whose coefficient and
    /// terms vary along the columns only: those are then computed first, by a
    /// program over the columns (see [`crate::hoist`]). `integral`: the
    /// product's operands hold integers.
    fn fold_epilogue(
        &mut self,
        gi: usize,
        c: ValueId,
        v: ValueId,
        avail: &HashMap<ValueId, BufId>,
        integral: bool,
    ) -> R<Option<MatEpilogue>> {
        let g = self.g;
        let (cs, vs) = (&g.ty(c).shape, &g.ty(v).shape);
        if g.ty(v).dtype != DType::F32 || !same_order(&g.env, cs, vs) {
            return Ok(None);
        }
        let mut b = Builder::new(g, &mut self.plan.dims, avail, &self.narrowed);
        let vars = b.vars(vs, v)?;
        let value = b.value_at(v, &vars, None)?;
        let c_idx = b.reshape_index(vs, cs, &vars);
        let Some(c_buf) = avail.get(&c) else { return Ok(None) };
        let (act, inner) = match b.x.node(value) {
            Node::Unary(UnaryOp::Tanh, a) => (Activation::Tanh, *a),
            Node::Unary(UnaryOp::Relu, a) => (Activation::Relu, *a),
            _ => match (as_gelu(&b.x, value), as_gelu_tanh(&b.x, value)) {
                (Some(a), _) => (Activation::Gelu, a),
                (None, Some(a)) => (Activation::GeluTanh, a),
                (None, None) => (Activation::None, value),
            },
        };
        let sum = |b: &mut Builder, e: E| sum_of_loads(b, g, e, *c_buf, &c_idx, &vars, vs);
        if let Some(e) = sum(&mut b, inner) {
            return Ok(Some(MatEpilogue { activation: act, ..e }));
        }
        // A residual that a program may read as its own operand, where the sum
        // has none (a quantized residual block adds the dequantized shortcut to
        // the dequantized codes of the product).
        let shortcut =
            self.residual_programs.then(|| residual_read(&mut b, g, value, *c_buf, (vs, &vars))).flatten();
        // Any other element-wise function of such a sum: the topmost sum
        // becomes the program's input.
        if let Some((core, e)) = find_sum(&mut b, value, &mut |b, e| sum(b, e)) {
            let mut program = Pointwise::empty();
            let mut seen = HashMap::new();
            let reads = shortcut.filter(|_| e.residual.is_none());
            if pointwise(&b.x, value, (core, reads.map(|r| r.0)), &mut program, &mut seen).is_some() {
                let e = with_residual(e, &program, reads);
                return Ok(Some(MatEpilogue { activation: Activation::Pointwise(program), ..e }));
            }
        }
        // An affine function of the accumulator with computed column terms.
        if !self.column_scales {
            return Ok(None);
        }
        let Some(&col) = vars.last() else { return Ok(None) };
        if c_idx.last() != Some(&col) {
            return Ok(None);
        }
        let site =
            hoist::Site { c_buf: *c_buf, c_idx: &c_idx, vars: &vars, vs, col_mask: b.x.free(col), integral };
        // The column variable and the number of columns, where known (terms
        // computed when lowering).
        let col_var = match b.x.node(col) {
            Node::Var(i) => Some(*i),
            _ => None,
        };
        let n = vs[vs.len() - 1].clone();
        let columns = g.env.normalize(&n).as_const().and_then(|n| usize::try_from(n).ok());
        let (act, aff) = match hoist::affine(&mut b, g, inner, &site) {
            Some(a) => (act, a),
            None => {
                // The topmost such function that the rest is a program of (GELU's
                // `0.5·x` is affine, but its `tanh` reads `x` itself).
                let mut found = Vec::new();
                let mut is_affine = |b: &mut Builder, e: E| hoist::affine(b, g, e, &site);
                all_sums(&mut b, value, &mut is_affine, &mut found, &mut HashSet::new());
                let mut fits = found.into_iter().filter_map(|(core, a)| {
                    let mut program = Pointwise::empty();
                    let reads = shortcut.filter(|_| a.residual.is_none()).map(|r| r.0);
                    pointwise(&b.x, value, (core, reads), &mut program, &mut HashMap::new())
                        .map(|_| (program, a))
                });
                let Some((program, a)) = fits.next() else { return Ok(None) };
                // Where the product's integers less integral column terms (a
                // zero point's share, moved out of it) are scaled after, the
                // sum alone: the program then scales it as the graph does, in
                // the same f32 operations, where scaling each term first
                // would round differently.
                let exact = match (integral, col_var, columns) {
                    (true, Some(cv), Some(n)) => {
                        integer_sum(&mut b, g, &site, value, (cv, n), &self.plan.buffers).and_then(
                            |(core, a)| {
                                let mut program = Pointwise::empty();
                                let reads = shortcut.filter(|_| a.residual.is_none()).map(|r| r.0);
                                pointwise(&b.x, value, (core, reads), &mut program, &mut HashMap::new())
                                    .map(|_| (program, a))
                            },
                        )
                    }
                    _ => None,
                };
                let (program, a) = exact.unwrap_or((program, a));
                (Activation::Pointwise(program), a)
            }
        };
        if !aff.acc {
            return Ok(None);
        }
        let mut ep = MatEpilogue { activation: act, residual: aff.residual, ..MatEpilogue::default() };
        if let Activation::Pointwise(p) = act {
            ep = with_residual(ep, &p, shortcut.filter(|_| aff.residual.is_none()));
        }
        // What the kernel reads as it is, and what a program computes first:
        // the column scales, then the bias (either may be absent).
        let (mut scales, mut bias): (Option<E>, Option<E>) = (None, None);
        match aff.coef {
            None => {}
            Some(k) => match b.x.as_float(k) {
                Some(k) => ep.scale = Some(k as f32),
                None => scales = Some(k),
            },
        }
        let bias_load = |b: &Builder, e: E| -> Option<BufId> {
            let Node::Load { buf, index, guard: None } = b.x.node(e) else { return None };
            let (arg, holds) = b.arg(*buf);
            column_vector(b, index, holds, col).then_some(arg)
        };
        match aff.cols[..] {
            [] => {}
            [one] if let Some(arg) = bias_load(&b, one) => ep.bias = Some(arg),
            ref many => bias = Some(many[1..].iter().fold(many[0], |t, x| b.x.add(t, *x))),
        }
        if scales.is_none() && bias.is_none() {
            return Ok(Some(ep));
        }
        // The column terms' program, over the output's last dim.
        let (x, args) = (b.x.clone(), b.args());
        // Terms known at compile time (a static quantization's scales and
        // zero point sums) become constants, where all of them are; else a
        // program computes them at each call.
        let known = |e: Option<E>| match e {
            None => Some(None),
            Some(e) => hoist::known_columns(&b, &self.plan.buffers, e, col_var?, columns?).map(Some),
        };
        let known = known(scales).zip(known(bias));
        drop(b);
        let numel = self.plan.dims.slot(&g.env.normalize(&n));
        // A buffer of the output's columns holding a term, named after it, as
        // the epilogue's column scales or bias.
        let column_buffer = |buffers: &mut Vec<Buffer>, ep: &mut MatEpilogue, what: &str, is_scale, kind| {
            let name = format!("{}.{what}", g.name(v));
            let shape = vec![n.clone()];
            buffers.push(Buffer {
                name: name.clone(),
                dtype: DType::F32,
                shape,
                numel,
                kind,
                first: 0,
                last: 0,
            });
            *(if is_scale { &mut ep.column_scale } else { &mut ep.bias }) = Some(buffers.len() - 1);
            (name, buffers.len() - 1)
        };
        if let Some((known_scales, known_bias)) = known {
            let folded = [("column scales", known_scales, true), ("column bias", known_bias, false)];
            for (what, values, is_scale) in folded {
                let Some(values) = values else { continue };
                let data = ir::Tensor::new(vec![values.len()], ir::Elems::F32(values))
                    .map_err(|e| LowerError::Internal(format!("{what} of {}: {e}", g.name(v))))?;
                let kind = BufferKind::Constant(std::sync::Arc::new(ir::ConstData::from_tensor(&data)));
                column_buffer(&mut self.plan.buffers, &mut ep, what, is_scale, kind);
            }
            return Ok(Some(ep));
        }
        let mut hb = Builder::new(g, &mut self.plan.dims, avail, &self.narrowed);
        let hv = hb.vars(std::slice::from_ref(&n), v)?;
        let mut memo = HashMap::new();
        let mut copied = Vec::new();
        for (what, e, is_scale) in [("column scales", scales, true), ("column bias", bias, false)] {
            let Some(e) = e else { continue };
            let Some(e) = hoist::copy(&x, &args, &mut hb, e, (col_var, hv[0]), &mut memo) else {
                return Ok(None);
            };
            copied.push((what, e, is_scale));
        }
        let mut buffered = Vec::new();
        for (what, e, is_scale) in copied {
            let (name, buf) =
                column_buffer(&mut self.plan.buffers, &mut ep, what, is_scale, BufferKind::Temp);
            buffered.push((name, buf, v, e));
        }
        let (program, args) =
            hb.program_storing(format!("g{gi}_columns"), std::slice::from_ref(&n), hv, buffered);
        self.add_program_step(gi, program, args);
        Ok(Some(ep))
    }
}

/// `e` as `scale·c + bias[col] + residual` (each but `c` optional) over the
/// matmul output `c` read at `c_idx`: the epilogue the engine applies before
/// its activation, or `None`.
fn sum_of_loads(
    b: &mut Builder,
    g: &ir::Graph,
    e: E,
    c_buf: BufId,
    c_idx: &[E],
    vars: &[E],
    vs: &[SymExpr],
) -> Option<MatEpilogue> {
    if b.x.dtype(e) != DType::F32 {
        return None;
    }
    let mut terms = Vec::new();
    sum_terms(&b.x, e, &mut terms);
    let mut ep = MatEpilogue::default();
    let mut have_c = false;
    for t in terms {
        let (load, scale) = match b.x.node(t).clone() {
            Node::Binary(BinaryOp::Mul, p, q) => match (b.x.as_float(p), b.x.as_float(q)) {
                (Some(k), None) => (q, Some(k)),
                (None, Some(k)) => (p, Some(k)),
                _ => return None,
            },
            Node::Binary(BinaryOp::Div, p, q) => match b.x.as_float(q) {
                Some(k) if k != 0.0 => (p, Some(1.0 / k)),
                _ => return None,
            },
            _ => (t, None),
        };
        let Node::Load { buf, index, guard: None } = b.x.node(load).clone() else { return None };
        let (arg, holds) = b.arg(buf);
        if arg == c_buf && index == c_idx && !have_c {
            have_c = true;
            ep.scale = scale.map(|k| k as f32);
        } else if scale.is_some() {
            return None;
        } else if ep.bias.is_none() && c_idx.last().is_some_and(|col| column_vector(b, &index, holds, *col)) {
            ep.bias = Some(arg);
        } else if ep.residual.is_none() && output_shaped(b, g, &index, holds, (vs, vars)) {
            ep.residual = Some(arg);
        } else {
            return None;
        }
    }
    have_c.then_some(ep)
}

/// The one value of `e` (through the operations a [`Pointwise`] program has)
/// that loads another buffer than `c_buf` in the output's order (shape `vs`,
/// variables `vars`), which a program may read as its residual
/// ([`PwOp::Residual`]): the node (the load, or the widening of a narrowed
/// buffer's codes), the buffer, and whether it holds u8 codes. `None` where
/// there is none, or several.
fn residual_read(
    b: &mut Builder,
    g: &Graph,
    e: E,
    c_buf: BufId,
    (vs, vars): (&[SymExpr], &[E]),
) -> Option<(E, BufId, bool)> {
    let (mut stack, mut seen, mut found) = (vec![e], HashSet::new(), Vec::new());
    while let Some(e) = stack.pop() {
        if !seen.insert(e) {
            continue;
        }
        let is_load = |a: E| matches!(b.x.node(a), Node::Load { .. });
        let (load, codes) = match b.x.node(e) {
            Node::Cast(a) if b.x.dtype(e) == DType::F32 && b.x.dtype(*a) == DType::U8 && is_load(*a) => {
                (*a, true)
            }
            Node::Load { .. } if b.x.dtype(e) == DType::F32 => (e, false),
            _ => {
                stack.extend(program_operands(&b.x, e));
                continue;
            }
        };
        let Node::Load { buf, index, guard: None } = b.x.node(load).clone() else { continue };
        let (arg, holds) = b.arg(buf);
        if arg != c_buf && output_shaped(b, g, &index, holds, (vs, vars)) {
            found.push((e, arg, codes));
        }
    }
    match found[..] {
        [one] => Some(one),
        _ => None,
    }
}

/// `e` reading `read`'s buffer as its residual where `program` reads one.
fn with_residual(e: MatEpilogue, program: &Pointwise, read: Option<(E, BufId, bool)>) -> MatEpilogue {
    match read {
        Some((_, buf, codes)) if program.reads_residual() => {
            MatEpilogue { residual: Some(buf), residual_codes: codes, ..e }
        }
        _ => e,
    }
}

/// Whether a load of `holds` at `index` reads a vector along the columns: `[n]`,
/// or `[1, …, 1, n]` read at `[0, …, 0, col]`.
pub(crate) fn column_vector(b: &Builder, index: &[E], holds: ValueId, col: E) -> bool {
    let shape = b.shape_of(holds);
    let lead = shape.len().saturating_sub(1);
    index.last() == Some(&col)
        && index[..lead].iter().all(|i| b.x.as_int(*i) == Some(0))
        && shape[..lead].iter().all(|d| d.as_const() == Some(1))
}

/// Whether a load of `holds` at `index` reads it in the order of the output
/// (shape `vs`, variables `vars`): a residual.
pub(crate) fn output_shaped(
    b: &mut Builder,
    g: &Graph,
    index: &[E],
    holds: ValueId,
    (vs, vars): (&[SymExpr], &[E]),
) -> bool {
    let shape = b.shape_of(holds);
    same_order(&g.env, shape, vs) && index == b.reshape_index(vs, shape, vars)
}

/// The first node of `e`, root first, through the element-wise operations a
/// [`Pointwise`] program has, for which `is_sum` gives something, and that.
fn find_sum<T>(
    b: &mut Builder,
    e: E,
    is_sum: &mut dyn FnMut(&mut Builder, E) -> Option<T>,
) -> Option<(E, T)> {
    if b.x.dtype(e) == DType::F32 {
        if let Some(t) = is_sum(b, e) {
            return Some((e, t));
        }
    }
    let children = program_operands(&b.x, e);
    children.into_iter().find_map(|c| find_sum(b, c, is_sum))
}

/// Below the scalings of `e` (products and quotients by column terms,
/// negations, through the operations a program has), the first value that is
/// the accumulator plus column terms known to be integers (`|v| < 2^24`):
/// with it, its affine form (no coefficient). `None` where there is none.
fn integer_sum(
    b: &mut Builder,
    g: &Graph,
    site: &hoist::Site,
    e: E,
    (col, n): (u32, usize),
    buffers: &[plan::Buffer],
) -> Option<(E, hoist::Affine)> {
    let mut e = e;
    for _ in 0..64 {
        if let Some(a) =
            hoist::affine(b, g, e, site).filter(|a| a.acc && a.coef.is_none() && !a.cols.is_empty())
        {
            let integral = |c: &E| {
                hoist::known_columns(b, buffers, *c, col, n)
                    .is_some_and(|v| v.iter().all(|x| x.fract() == 0.0 && x.abs() < (1 << 24) as f32))
            };
            return a.cols.iter().all(integral).then_some((e, a));
        }
        e = match b.x.node(e).clone() {
            Node::Binary(BinaryOp::Mul | BinaryOp::Div, p, q) if hoist::column_only(b, q, site) => p,
            Node::Binary(BinaryOp::Mul, p, q) if hoist::column_only(b, p, site) => q,
            Node::Unary(_, a) | Node::Cast(a) => a,
            // Else the one operand reading the accumulator (a residual is added
            // after the scaling).
            Node::Binary(_, p, q) => {
                match (hoist::reads_accumulator(b, p, site), hoist::reads_accumulator(b, q, site)) {
                    (true, false) => p,
                    (false, true) => q,
                    _ => return None,
                }
            }
            _ => return None,
        };
    }
    None
}

/// The operands of `e` where it is an element-wise operation (or a cast) an
/// epilogue's search for its core looks through.
fn program_operands(x: &plan::Exprs, e: E) -> Vec<E> {
    match x.node(e) {
        Node::Unary(_, a) | Node::Cast(a) => vec![*a],
        Node::Binary(_, a, b) => vec![*a, *b],
        Node::Select(c, a, b) => vec![*c, *a, *b],
        _ => vec![],
    }
}

/// Every node of `e`, root first, through the element-wise operations a
/// [`Pointwise`] program has, for which `is_sum` gives something (not below
/// one that does), with that.
fn all_sums<T>(
    b: &mut Builder,
    e: E,
    is_sum: &mut dyn FnMut(&mut Builder, E) -> Option<T>,
    out: &mut Vec<(E, T)>,
    seen: &mut HashSet<E>,
) {
    if !seen.insert(e) {
        return;
    }
    if b.x.dtype(e) == DType::F32 {
        if let Some(t) = is_sum(b, e) {
            out.push((e, t));
            return;
        }
    }
    let children = program_operands(&b.x, e);
    for c in children {
        all_sums(b, c, is_sum, out, seen);
    }
}

/// Append the program computing `e` from `input` (and from `residual`, where
/// given: [`PwOp::Residual`]) to `program` (each node once: `seen` maps nodes
/// to their operations); `None` when `e` reads anything but those and
/// constants, uses an operation the programs do not have, or does not fit in
/// one.
fn pointwise(
    x: &plan::Exprs,
    e: E,
    (input, residual): (E, Option<E>),
    program: &mut Pointwise,
    seen: &mut HashMap<E, u8>,
) -> Option<u8> {
    if let Some(i) = seen.get(&e) {
        return Some(*i);
    }
    let ins = (input, residual);
    let op = if e == input {
        PwOp::Input
    } else if Some(e) == residual {
        PwOp::Residual
    } else if x.dtype(e) != DType::F32 {
        return None;
    } else if let Some((f, offset, lo, hi)) = x.stored_integer(e) {
        PwOp::Integer { x: pointwise(x, f, ins, program, seen)?, offset, lo, hi }
    } else if let Some(k) = x.as_float(e) {
        PwOp::Const((k as f32).to_bits())
    } else {
        match x.node(e).clone() {
            Node::Unary(u, a) => {
                let u = PwUnary::of(u)?;
                PwOp::Unary(u, pointwise(x, a, ins, program, seen)?)
            }
            Node::Binary(op, a, b) => {
                let op = PwBinary::of(op)?;
                let a = pointwise(x, a, ins, program, seen)?;
                PwOp::Binary(op, a, pointwise(x, b, ins, program, seen)?)
            }
            Node::Select(c, t, f) => {
                let Node::Binary(cmp, p, q) = x.node(c).clone() else { return None };
                let cmp = PwCmp::of(cmp)?;
                let p = pointwise(x, p, ins, program, seen)?;
                let q = pointwise(x, q, ins, program, seen)?;
                let t = pointwise(x, t, ins, program, seen)?;
                PwOp::Select(cmp, p, q, t, pointwise(x, f, ins, program, seen)?)
            }
            _ => return None,
        }
    };
    let i = program.push(op)?;
    seen.insert(e, i);
    Some(i)
}

/// `e` with its program's constants (and its scale, where nothing is added
/// after it) as parameters: the kernels of epilogues that differ only in
/// those are then one (a quantized model's layers, each with its scales).
fn parameterized(e: MatEpilogue) -> MatEpilogue {
    let Activation::Pointwise(p) = e.activation else { return e };
    let plain = e.column_scale.is_none() && e.bias.is_none() && e.residual.is_none();
    let scale = e.scale.filter(|_| plain);
    let Some((program, values)) = p.parameterized(scale) else { return e };
    let Some(params) = plan::EpilogueParams::new(&values) else { return e };
    MatEpilogue {
        scale: if scale.is_some() { None } else { e.scale },
        activation: Activation::Pointwise(program),
        params,
        ..e
    }
}

/// A convolution's taps: the image they read (`[n, h, w, C]`), and the rest of
/// what [`Taps`] says, before the dims become slots.
struct TapGeometry {
    image: ValueId,
    /// Dims in front of the image's `[n, h, w, C]`: a grouped convolution's group.
    lead: usize,
    channels: i64,
    out: [SymExpr; 2],
    kernel: [usize; 2],
    stride: [usize; 2],
    dilation: [usize; 2],
    pad: [usize; 2],
}

/// Whether `a` and `b` hold as many elements in the same row-major order with
/// dims only split or merged: every group of dims with equal products has a
/// single dim on one side.
fn same_order(env: &sym::ShapeEnv, a: &[SymExpr], b: &[SymExpr]) -> bool {
    match match_groups(env, a, b) {
        Some(groups) => groups.iter().all(|(x, y)| {
            let real = |r: &std::ops::Range<usize>, s: &[SymExpr]| {
                s[r.clone()].iter().filter(|d| d.as_const() != Some(1)).count()
            };
            real(x, a) <= 1 || real(y, b) <= 1
        }),
        None => false,
    }
}

/// The terms of a sum of f32 values.
fn sum_terms(x: &plan::Exprs, e: E, out: &mut Vec<E>) {
    match x.node(e) {
        Node::Binary(BinaryOp::Add, a, b) if x.dtype(e) == DType::F32 => {
            sum_terms(x, *a, out);
            sum_terms(x, *b, out);
        }
        _ => out.push(e),
    }
}

/// The non-constant factors of a product, and the product of its constants.
fn factors(x: &plan::Exprs, e: E, out: &mut Vec<E>, k: &mut f64) {
    match x.node(e) {
        Node::Binary(BinaryOp::Mul, a, b) if x.dtype(e) == DType::F32 => {
            factors(x, *a, out, k);
            factors(x, *b, out, k);
        }
        Node::Binary(BinaryOp::Div, a, b) if x.as_float(*b).is_some_and(|c| c != 0.0) => {
            factors(x, *a, out, k);
            *k /= x.as_float(*b).unwrap_or(1.0);
        }
        _ => match x.as_float(e) {
            Some(c) => *k *= c,
            None => out.push(e),
        },
    }
}

/// `x` when `e` is `0.5·x·(1 + erf(x/√2))`, the factors in any order.
fn as_gelu(x: &plan::Exprs, e: E) -> Option<E> {
    let (mut fs, mut k) = (Vec::new(), 1.0);
    factors(x, e, &mut fs, &mut k);
    if fs.len() != 2 || (k - 0.5).abs() > 1e-6 {
        return None;
    }
    for (a, s) in [(fs[0], fs[1]), (fs[1], fs[0])] {
        let Node::Binary(BinaryOp::Add, p, q) = x.node(s) else { continue };
        let (one, erf) = if x.as_float(*p) == Some(1.0) { (*p, *q) } else { (*q, *p) };
        if x.as_float(one) != Some(1.0) {
            continue;
        }
        let Node::Unary(UnaryOp::Erf, u) = x.node(erf) else { continue };
        let (mut us, mut ku) = (Vec::new(), 1.0);
        factors(x, *u, &mut us, &mut ku);
        if us == [a] && (ku - std::f64::consts::FRAC_1_SQRT_2).abs() < 1e-6 {
            return Some(a);
        }
    }
    None
}

/// `x` when `e` is `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, the factors
/// in any order, the cube as a product or a `pow(x, 3)`.
fn as_gelu_tanh(x: &plan::Exprs, e: E) -> Option<E> {
    let (mut fs, mut k) = (Vec::new(), 1.0);
    factors(x, e, &mut fs, &mut k);
    if fs.len() != 2 || (k - 0.5).abs() > 1e-6 {
        return None;
    }
    let near = |v: f64, want: f64| (v - want).abs() <= 1e-6 * want.abs().max(1.0);
    for (a, s) in [(fs[0], fs[1]), (fs[1], fs[0])] {
        let Node::Binary(BinaryOp::Add, p, q) = x.node(s) else { continue };
        let th = if x.as_float(*p) == Some(1.0) { *q } else { *p };
        if x.as_float(if th == *p { *q } else { *p }) != Some(1.0) {
            continue;
        }
        let Node::Unary(UnaryOp::Tanh, u) = x.node(th) else { continue };
        let (mut us, mut ku) = (Vec::new(), 1.0);
        factors(x, *u, &mut us, &mut ku);
        if us.len() != 1 || !near(ku, (2.0 / std::f64::consts::PI).sqrt()) {
            continue;
        }
        let Node::Binary(BinaryOp::Add, l, r) = x.node(us[0]) else { continue };
        for (lin, cub) in [(*l, *r), (*r, *l)] {
            if lin != a {
                continue;
            }
            let (mut cs, mut kc) = (Vec::new(), 1.0);
            factors(x, cub, &mut cs, &mut kc);
            let cube = match cs.as_slice() {
                [p, q, r] => *p == a && *q == a && *r == a,
                [p] => {
                    matches!(x.node(*p), Node::Binary(BinaryOp::Pow, b, n) if *b == a && x.as_float(*n) == Some(3.0))
                }
                _ => false,
            };
            if cube && near(kc, 0.044715) {
                return Some(a);
            }
        }
    }
    None
}

/// Whether `v` may be stored as u8 codes ([`crate::LowerOptions::u8_codes`]):
/// f32 or i32 values that the graph bounds to integers in 0..=255 (a widening
/// `cast<f32>` of a u8 value, or views and constant padding of one; a dynamic
/// quantization's codes widened to i32 for `MatMulInteger`), no model
/// output, and every reader, through layout ops and widenings to f32, either
/// computes in a loop program (which loads it widened) or is the A of a
/// product by a constant (which the u8s8 kernels read as codes). A product's B, or the A of a
/// product by another value (attention's), is read as f32 values as they lie.
pub(crate) fn narrowable(g: &Graph, v: ValueId) -> bool {
    let producers = g.producers();
    let codes = match g.ty(v).dtype {
        DType::F32 => integers_within(g, v, (0, 255)),
        DType::I32 => passes::value_range(g, v).is_some_and(|(lo, hi)| 0 <= lo && hi <= 255),
        _ => false,
    };
    if !codes {
        return false;
    }
    let mut readers: HashMap<ValueId, Vec<(usize, usize)>> = HashMap::new();
    for (i, n) in g.nodes.iter().enumerate() {
        for (k, u) in n.inputs.iter().enumerate() {
            readers.entry(*u).or_default().push((i, k));
        }
    }
    let constant = |u: ValueId| {
        let mut u = u;
        loop {
            match producers[u.index()].map(|p| &g.nodes[p]) {
                Some(n) if matches!(n.op, Op::Constant(_)) => return true,
                Some(n) if matches!(n.op, Op::Cast | Op::Reshape | Op::Transpose { .. }) => u = n.inputs[0],
                _ => return false,
            }
        }
    };
    let mut todo = vec![v];
    let mut seen = HashSet::new();
    while let Some(u) = todo.pop() {
        if !seen.insert(u) {
            continue;
        }
        if g.outputs.contains(&u) {
            return false;
        }
        for &(r, k) in readers.get(&u).map_or(&[][..], |r| &r[..]) {
            let n = &g.nodes[r];
            match &n.op {
                Op::Reshape
                | Op::Transpose { .. }
                | Op::Slice { .. }
                | Op::Pad { .. }
                | Op::Concat { .. } => todo.push(n.output),
                // A widening to f32 may be read as the codes it widens.
                Op::Cast if g.ty(n.output).dtype == DType::F32 => todo.push(n.output),
                Op::MatMul { .. } if k != 0 || !constant(n.inputs[1]) => return false,
                Op::Conv(_) | Op::ConvTranspose(_) => return false,
                _ => {}
            }
        }
    }
    true
}

/// An f32 matmul: the contraction engine's work.
fn is_backbone(g: &Graph, node: &ir::Node) -> bool {
    matches!(node.op, Op::MatMul { .. })
        && node.inputs.iter().chain([&node.output]).all(|v| g.ty(*v).dtype == DType::F32)
}

/// Whether f32 value `v` holds integers within `lo..=hi` by the graph's bounds
/// (`passes::value_range`).
fn integers_within(g: &Graph, v: ValueId, (lo, hi): (i64, i64)) -> bool {
    g.ty(v).dtype == ir::DType::F32 && passes::value_range(g, v).is_some_and(|(a, b)| lo <= a && b <= hi)
}

/// Whether f32 operands `a` and `b` hold integers within i16 (`vpmaddwd`'s
/// one overflow, two products of -32768 by -32768, excluded) whose products
/// summed over all of the constant depth `k` stay within i32.
fn sixteen_bit_products(g: &Graph, a: ValueId, b: ValueId, k: &SymExpr) -> bool {
    let i16_range = (-i64::from(i16::MAX), i64::from(i16::MAX));
    let magnitude = |v| passes::value_range(g, v).map(|(lo, hi): (i64, i64)| lo.abs().max(hi.abs()));
    let (Some(k), Some(ma), Some(mb)) = (k.as_const(), magnitude(a), magnitude(b)) else { return false };
    integers_within(g, a, i16_range)
        && integers_within(g, b, i16_range)
        && ma.checked_mul(mb).and_then(|p| p.checked_mul(k)).is_some_and(|s| s <= i64::from(i32::MAX))
}
