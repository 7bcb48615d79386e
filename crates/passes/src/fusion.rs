//! The fusion pipeline (BladeDISC §4, TSCompiler §4.2): groups are formed pass
//! by pass, each pass merging the groups of the previous one, and every decision
//! is made from `ShapeEnv` facts, never example shapes. A group is one future
//! kernel.
//!
//! 1. element-wise / injective: a producer joins its consumer's group, stopping
//!    at reductions and contractions; a value a reduction reads ends the fusion
//!    of its producer (it is where a dense epilogue ends and a stitch begins);
//!    a pad takes no computation before it, and joins its readers' group when
//!    they all ended in one (a convolution's taps: the padded image is never
//!    written); a constant's scaling of a value a contraction reads is left to
//!    its readers to compute (a quantized activation's dequantized copy is
//!    never written beside its codes);
//! 2. compute-intensive: a contraction (or pooling window) takes its layout-only
//!    prologue (transpose, reshape, cast, broadcast, pad, and a convolution's
//!    taps, slices joined by a concat: folded into operand
//!    packing) and its element-wise epilogue, when the epilogue works on the
//!    contraction's output space (no extra memory traffic);
//! 3. stitch: reductions over trailing axes join the element-wise groups around
//!    them when their row spaces agree (`rows = product of kept dims`, proved by
//!    the `ShapeEnv`, BladeDISC §4.2's group-dims), with the index-coverage check
//!    (no group output is a partial view such as a slice);
//! 4. attention: `softmax(Q·Kᵀ ⊕ scale/mask)·V` — a contraction whose epilogue
//!    feeds a softmax stitch that feeds a second contraction — becomes one group;
//! 5. horizontal: independent element-wise groups reading the same value over
//!    equal symbolic extents become one.
//!
//! Merges never create cycles between groups: two groups merge only when no path
//! leads from one to the other through a third.

use std::collections::{BTreeSet, HashMap, VecDeque};

use ir::{Graph, Op, ValueId};
pub use plan::GroupKind;
use sym::SymExpr;

/// One future kernel.
#[derive(Clone, Debug)]
pub struct FusionGroup {
    pub kind: GroupKind,
    /// Node indices, in graph (topological) order.
    pub nodes: Vec<usize>,
    /// Values read from outside the group (graph inputs, constants, other groups).
    pub inputs: Vec<ValueId>,
    /// Values the rest of the graph reads (or graph outputs).
    pub outputs: Vec<ValueId>,
    /// The iteration space: the shape of the group's last node's output (for a
    /// stitch, the input of its first reduction).
    pub space: Vec<SymExpr>,
    /// Formed by horizontal fusion of independent groups.
    pub horizontal: bool,
}

/// A graph cut into groups, in an order that respects their dependences.
#[derive(Clone, Debug)]
pub struct FusionPlan {
    pub groups: Vec<FusionGroup>,
    /// Constant nodes: data, not kernels.
    pub constants: Vec<usize>,
}

impl FusionPlan {
    /// The groups as units for `reference::run_units`, constants first.
    pub fn units(&self, g: &Graph) -> Vec<reference::Unit> {
        let outputs = self.constants.iter().map(|n| g.nodes[*n].output).collect();
        let mut units = vec![reference::Unit { nodes: self.constants.clone(), outputs }];
        units.extend(
            self.groups
                .iter()
                .map(|g| reference::Unit { nodes: g.nodes.clone(), outputs: g.outputs.clone() }),
        );
        units
    }

    pub fn count(&self, kind: GroupKind) -> usize {
        self.groups.iter().filter(|g| g.kind == kind).count()
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Class {
    Constant,
    Elementwise,
    /// Data movement: reshape, transpose, broadcast, slice, pad, concat, gather.
    Injective,
    Reduce,
    Contraction,
    Window,
    Opaque,
}

fn class(op: &Op) -> Class {
    match op {
        Op::Constant(_) => Class::Constant,
        Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast | Op::Iota { .. } | Op::SymConst(_) => {
            Class::Elementwise
        }
        Op::Broadcast
        | Op::Reshape
        | Op::Transpose { .. }
        | Op::Slice { .. }
        | Op::Pad { .. }
        | Op::Concat { .. }
        | Op::Gather { .. } => Class::Injective,
        Op::Reduce { .. } => Class::Reduce,
        Op::MatMul { .. } | Op::Conv(_) | Op::ConvTranspose(_) => Class::Contraction,
        Op::Pool(_) => Class::Window,
        Op::CumSum { .. } => Class::Opaque,
    }
}

/// Layout-only ops a contraction folds into reading its operands.
fn is_prologue(op: &Op) -> bool {
    matches!(op, Op::Transpose { .. } | Op::Reshape | Op::Cast | Op::Broadcast | Op::Pad { .. })
}

/// What a contraction's operand may be made of to join its group: layout-only
/// ops, and the slices and concatenations of a convolution's taps (which the
/// engine reads from the image: implicit GEMM).
fn is_operand_layout(op: &Op) -> bool {
    is_prologue(op) || matches!(op, Op::Slice { .. } | Op::Concat { .. })
}

/// Union-find over nodes, with each group's kind and members.
struct Partition<'g> {
    g: &'g Graph,
    parent: Vec<usize>,
    kind: Vec<GroupKind>,
    members: Vec<Vec<usize>>,
    horizontal: Vec<bool>,
    producer: Vec<Option<usize>>,
    consumers: Vec<Vec<usize>>,
}

impl<'g> Partition<'g> {
    fn new(g: &'g Graph) -> Partition<'g> {
        let n = g.nodes.len();
        let mut consumers = vec![Vec::new(); g.num_values()];
        for (i, node) in g.nodes.iter().enumerate() {
            for v in &node.inputs {
                consumers[v.index()].push(i);
            }
        }
        let kind = g
            .nodes
            .iter()
            .map(|node| match class(&node.op) {
                Class::Contraction => GroupKind::Contraction,
                Class::Window => GroupKind::Window,
                Class::Reduce => GroupKind::Stitch,
                Class::Opaque => GroupKind::Opaque,
                _ => GroupKind::Elementwise,
            })
            .collect();
        Partition {
            g,
            parent: (0..n).collect(),
            kind,
            members: (0..n).map(|i| vec![i]).collect(),
            horizontal: vec![false; n],
            producer: g.producers(),
            consumers,
        }
    }

    fn find(&mut self, i: usize) -> usize {
        let mut r = i;
        while self.parent[r] != r {
            r = self.parent[r];
        }
        let mut j = i;
        while self.parent[j] != r {
            let next = self.parent[j];
            self.parent[j] = r;
            j = next;
        }
        r
    }

    fn is_constant(&self, i: usize) -> bool {
        class(&self.g.nodes[i].op) == Class::Constant
    }

    /// The producing node of `v` unless it is a graph input or a constant.
    fn producer_node(&self, v: ValueId) -> Option<usize> {
        self.producer[v.index()].filter(|p| !self.is_constant(*p))
    }

    /// Groups reading values group `a` computes.
    fn successors(&mut self, a: usize) -> BTreeSet<usize> {
        let mut out = BTreeSet::new();
        for m in self.members[a].clone() {
            let v = self.g.nodes[m].output;
            for c in self.consumers[v.index()].clone() {
                let r = self.find(c);
                if r != a {
                    out.insert(r);
                }
            }
        }
        out
    }

    /// Whether merging `a` and `b` would put a cycle between groups: a path from
    /// one to the other through a third group.
    fn creates_cycle(&mut self, a: usize, b: usize) -> bool {
        self.reaches_indirectly(a, b) || self.reaches_indirectly(b, a)
    }

    fn reaches_indirectly(&mut self, from: usize, to: usize) -> bool {
        let mut queue: VecDeque<usize> = self.successors(from).into_iter().filter(|s| *s != to).collect();
        let mut seen: BTreeSet<usize> = queue.iter().copied().collect();
        while let Some(x) = queue.pop_front() {
            for s in self.successors(x) {
                if s == to {
                    return true;
                }
                if seen.insert(s) {
                    queue.push_back(s);
                }
            }
        }
        false
    }

    /// Merge the groups of `a` and `b` into one of `kind`, unless that makes a cycle.
    fn merge(&mut self, a: usize, b: usize, kind: GroupKind) -> bool {
        let (ra, rb) = (self.find(a), self.find(b));
        if ra == rb {
            return false;
        }
        if self.creates_cycle(ra, rb) {
            return false;
        }
        self.parent[rb] = ra;
        let moved = std::mem::take(&mut self.members[rb]);
        self.members[ra].extend(moved);
        self.kind[ra] = kind;
        self.horizontal[ra] |= self.horizontal[rb];
        true
    }

    fn numel(&self, v: ValueId) -> SymExpr {
        self.g.ty(v).numel().unwrap_or_else(|_| SymExpr::constant(-1))
    }

    fn same_numel(&self, a: &SymExpr, b: &SymExpr) -> bool {
        self.g.env.equal(a, b)
    }

    /// Values of group `r` read outside it (or graph outputs).
    fn outputs(&mut self, r: usize) -> Vec<ValueId> {
        let mut out = Vec::new();
        for m in self.members[r].clone() {
            let v = self.g.nodes[m].output;
            let outside = self.consumers[v.index()].clone().into_iter().any(|c| self.find(c) != r);
            if outside || self.g.outputs.contains(&v) {
                out.push(v);
            }
        }
        out
    }

    /// Whether every reader of `v` is a window or a contraction (and `v` is not
    /// a model output).
    fn read_only_by_contractions_and_windows(&self, v: ValueId) -> bool {
        let readers = &self.consumers[v.index()];
        !self.g.outputs.contains(&v)
            && !readers.is_empty()
            && readers
                .iter()
                .all(|c| matches!(class(&self.g.nodes[*c].op), Class::Window | Class::Contraction))
    }

    /// Whether node `n` is better computed by its reader than beside its input
    /// `v`: an element-wise `v ⊕ constant` (the constant broadcast or not), no
    /// model output, read by one element-wise node (whose group it then joins),
    /// of a `v` a contraction reads (through layout ops: so `v` is written
    /// whatever `n`'s group).
    fn recomputed_by_readers(&self, n: usize, v: ValueId) -> bool {
        let g = self.g;
        let node = &g.nodes[n];
        let constant = |u: ValueId| match self.producer[u.index()] {
            Some(q) if self.is_constant(q) => true,
            Some(q) => {
                matches!(g.nodes[q].op, Op::Broadcast)
                    && self.producer[g.nodes[q].inputs[0].index()].is_some_and(|c| self.is_constant(c))
            }
            None => false,
        };
        let scaling = matches!(node.op, Op::Binary(_))
            && node.inputs.iter().filter(|u| **u == v).count() == 1
            && node.inputs.iter().all(|u| *u == v || constant(*u));
        let readers = &self.consumers[node.output.index()];
        scaling
            && !g.outputs.contains(&node.output)
            && matches!(readers[..], [r] if class(&g.nodes[r].op) == Class::Elementwise)
            && self.consumers[v.index()].iter().any(|c| {
                let op = &g.nodes[*c].op;
                class(op) == Class::Contraction
                    || (is_operand_layout(op) && self.feeds_only_contractions(g.nodes[*c].output))
            })
    }

    /// Whether `v` reaches only contractions and windows, through layout ops
    /// (reshapes, transposes, pads, slices, concatenations: a grouped
    /// convolution's image as `[G, n, h, w, C/G]` and its taps), and no model
    /// output.
    fn feeds_only_contractions(&self, v: ValueId) -> bool {
        let mut todo = vec![v];
        let mut seen = BTreeSet::new();
        while let Some(u) = todo.pop() {
            if !seen.insert(u) {
                continue;
            }
            let readers = &self.consumers[u.index()];
            if self.g.outputs.contains(&u) || readers.is_empty() {
                return false;
            }
            for c in readers {
                let op = &self.g.nodes[*c].op;
                match class(op) {
                    Class::Window | Class::Contraction => {}
                    _ if is_operand_layout(op) => todo.push(self.g.nodes[*c].output),
                    _ => return false,
                }
            }
        }
        true
    }

    fn read_by_reduce(&self, v: ValueId) -> bool {
        self.consumers[v.index()].iter().any(|c| class(&self.g.nodes[*c].op) == Class::Reduce)
    }
}

/// Form the fusion groups of `g`.
pub fn fuse(g: &Graph) -> FusionPlan {
    let mut p = Partition::new(g);
    fuse_elementwise(&mut p);
    fuse_pads(&mut p);
    fuse_contractions(&mut p);
    fuse_stitch(&mut p);
    fuse_attention(&mut p);
    fuse_horizontal(&mut p);
    plan(&mut p)
}

fn loopish(c: Class) -> bool {
    matches!(c, Class::Elementwise | Class::Injective)
}

/// 1. Producer into consumer, for element-wise and data-movement ops.
///
/// A node's inputs are taken twice: a merge that a cycle refuses (an input
/// whose group another input's group reads: `x·cos + rotate(x)·sin` with
/// `x·cos` first) may go through once the other inputs have joined.
fn fuse_elementwise(p: &mut Partition) {
    let g = p.g;
    for (n, node) in g.nodes.iter().enumerate() {
        if !loopish(class(&node.op)) {
            continue;
        }
        for &v in node.inputs.iter().chain(&node.inputs) {
            let Some(q) = p.producer_node(v) else { continue };
            let rq = p.find(q);
            if !loopish(class(&g.nodes[q].op)) || p.kind[rq] != GroupKind::Elementwise {
                continue;
            }
            // A value a reduction reads ends its producer's fusion here.
            if p.read_by_reduce(v) {
                continue;
            }
            // A pad grows the space: computation before it stays where it is (a
            // contraction's epilogue) and the pad joins its readers (below).
            let computes = p.members[rq].iter().any(|m| !is_operand_layout(&g.nodes[*m].op));
            if matches!(node.op, Op::Pad { .. }) && computes {
                continue;
            }
            // Layout ops on the way to contractions only (a grouped convolution's
            // image split by group) are read as views by them: they leave the
            // computation before them a contraction's epilogue, and a value read
            // elsewhere too stays a buffer they view.
            let rn = p.find(n);
            let exclusive = !g.outputs.contains(&v)
                && p.consumers[v.index()].clone().into_iter().all(|c| p.find(c) == rn);
            if matches!(node.op, Op::Transpose { .. } | Op::Reshape)
                && (computes || !exclusive)
                && p.feeds_only_contractions(node.output)
            {
                continue;
            }
            // A transpose read only by windows and contractions joins them as their
            // prologue (read through an index map), not its producer's group: the
            // producer writes its own layout, and stays a contraction's epilogue
            // (a convolution's ReLU in front of a max pool, channels-last).
            if matches!(node.op, Op::Transpose { .. })
                && !is_prologue(&g.nodes[q].op)
                && p.read_only_by_contractions_and_windows(node.output)
            {
                continue;
            }
            // A broadcast that expands joins a group other readers share only as its
            // last reader: a mask that every layer expands to its heads is stored
            // small, and each layer's group expands it as it reads it, instead of the
            // shared group storing every layer's expanded copy.
            if matches!(node.op, Op::Broadcast)
                && !p.same_numel(&p.numel(v), &p.numel(node.output))
                && p.outputs(rq).into_iter().any(|o| o != v)
            {
                continue;
            }
            // A constant's scaling of a value a contraction reads (written for it
            // anyway) stays out of that value's group, for its readers to join and
            // compute where they read: a quantized activation's dequantized copy
            // (`codes·scale`, which a residual add reads) is not written beside
            // the codes, and the group left writes one tensor, which the
            // contraction before it can take as its epilogue.
            if !exclusive && p.recomputed_by_readers(n, v) {
                continue;
            }
            // Only into the single consumer group, or over the same space (then the
            // other consumers read the written value; nothing is recomputed).
            if exclusive || p.same_numel(&p.numel(v), &p.numel(node.output)) {
                p.merge(n, q, GroupKind::Elementwise);
            }
        }
    }
}

/// 1b. A pad whose readers all ended in one element-wise group joins it (a
/// convolution's taps read the image with the padding as an index map: the
/// padded image is never written).
fn fuse_pads(p: &mut Partition) {
    let g = p.g;
    for (q, node) in g.nodes.iter().enumerate() {
        if !matches!(node.op, Op::Pad { .. }) || g.outputs.contains(&node.output) {
            continue;
        }
        let readers: BTreeSet<usize> =
            p.consumers[node.output.index()].clone().into_iter().map(|c| p.find(c)).collect();
        let rq = p.find(q);
        if let [r] = readers.into_iter().collect::<Vec<_>>()[..] {
            if r != rq && p.kind[r] == GroupKind::Elementwise && p.kind[rq] == GroupKind::Elementwise {
                let reader = p.members[r][0];
                p.merge(reader, q, GroupKind::Elementwise);
            }
        }
    }
}

/// 2. Contractions (and pooling) take their layout prologue and element-wise epilogue.
fn fuse_contractions(p: &mut Partition) {
    let g = p.g;
    for (k, node) in g.nodes.iter().enumerate() {
        let kind = match class(&node.op) {
            Class::Contraction => GroupKind::Contraction,
            Class::Window => GroupKind::Window,
            _ => continue,
        };
        // Prologue: operands produced by layout-only groups used by this node alone.
        for &v in &node.inputs {
            let Some(q) = p.producer_node(v) else { continue };
            let rq = p.find(q);
            let layout_only = p.kind[rq] == GroupKind::Elementwise
                && p.members[rq].iter().all(|m| is_operand_layout(&g.nodes[*m].op));
            let outs = p.outputs(rq);
            let only_here = outs.iter().all(|o| p.consumers[o.index()].iter().all(|c| *c == k))
                && !outs.iter().any(|o| g.outputs.contains(o));
            if layout_only && only_here {
                p.merge(k, q, kind);
            }
        }
        // Epilogue: the element-wise groups reading the output, when together they
        // write exactly the output's size (one group over its space, or slices that
        // split it, as after GEMM merging): no extra memory traffic.
        let out = node.output;
        if g.outputs.contains(&out) {
            continue;
        }
        let groups: BTreeSet<usize> =
            p.consumers[out.index()].clone().into_iter().map(|c| p.find(c)).collect();
        if groups.is_empty() || groups.iter().any(|e| p.kind[*e] != GroupKind::Elementwise) {
            continue;
        }
        let mut written = SymExpr::constant(0);
        for e in &groups {
            let outs = p.outputs(*e);
            for &o in &outs {
                // A reshape of another output is a view of it (lowering writes it once).
                let view = p
                    .producer_node(o)
                    .is_some_and(|n| g.nodes[n].op == Op::Reshape && outs.contains(&g.nodes[n].inputs[0]));
                if !view {
                    written = written.try_add(&p.numel(o)).unwrap_or_else(|_| SymExpr::constant(-1));
                }
            }
        }
        if p.same_numel(&written, &p.numel(out)) {
            for e in groups {
                p.merge(k, e, kind);
            }
        }
    }
}

/// Rows and columns of a reduction over trailing axes; `None` otherwise.
fn row_split(g: &Graph, node: &ir::Node) -> Option<(SymExpr, SymExpr)> {
    let Op::Reduce { axes, .. } = &node.op else { return None };
    let x = g.ty(node.inputs[0]);
    let r = x.rank();
    let k = axes.len();
    if k == 0 || !axes.iter().enumerate().all(|(i, a)| *a == r - k + i) {
        return None;
    }
    let prod = |d: &[SymExpr]| d.iter().try_fold(SymExpr::constant(1), |a, b| a.try_mul(b)).ok();
    Some((prod(&x.shape[..r - k])?, prod(&x.shape[r - k..])?))
}

/// 3. Stitch reductions with the element-wise groups around them.
fn fuse_stitch(p: &mut Partition) {
    let g = p.g;
    let one = SymExpr::constant(1);
    loop {
        let mut changed = false;
        for (i, node) in g.nodes.iter().enumerate() {
            let Some((rows, cols)) = row_split(g, node) else { continue };
            let full = rows.try_mul(&cols).unwrap_or_else(|_| one.clone());
            let r = p.find(i);
            // Neighbor groups: producers of this group's inputs and consumers of its outputs.
            let mut neighbors = BTreeSet::new();
            for m in p.members[r].clone() {
                let n = &g.nodes[m];
                for v in &n.inputs {
                    if let Some(q) = p.producer_node(*v) {
                        neighbors.insert(p.find(q));
                    }
                }
                for c in p.consumers[n.output.index()].clone() {
                    neighbors.insert(p.find(c));
                }
            }
            neighbors.remove(&r);
            for e in neighbors {
                if !matches!(p.kind[e], GroupKind::Elementwise | GroupKind::Stitch) {
                    continue;
                }
                // Every value of the neighbor is a row vector or a full tile of this reduction.
                let fits = p.members[e].clone().iter().all(|m| {
                    let ne = p.numel(g.nodes[*m].output);
                    let n_in = g.nodes[*m].inputs.iter().map(|v| p.numel(*v)).collect::<Vec<_>>();
                    let ok = |x: &SymExpr| {
                        p.same_numel(x, &rows) || p.same_numel(x, &full) || p.same_numel(x, &one)
                    };
                    ok(&ne) && (class(&g.nodes[*m].op) != Class::Reduce || n_in.iter().all(ok))
                });
                // Index coverage: no output of the stitched group may be a partial view.
                let partial = p.outputs(e).iter().any(|o| {
                    p.producer[o.index()]
                        .is_some_and(|q| matches!(g.nodes[q].op, Op::Slice { .. } | Op::Gather { .. }))
                });
                if fits && !partial && p.merge(r, e, GroupKind::Stitch) {
                    changed = true;
                    break;
                }
            }
        }
        if !changed {
            break;
        }
    }
}

/// 4. `contraction → softmax stitch → contraction` becomes one attention group.
fn fuse_attention(p: &mut Partition) {
    let g = p.g;
    for (k2, node) in g.nodes.iter().enumerate() {
        if !matches!(node.op, Op::MatMul { .. }) {
            continue;
        }
        let Some(q) = p.producer_node(node.inputs[0]) else { continue };
        let s = p.find(q);
        let reduces = p.members[s].iter().filter(|m| class(&g.nodes[**m].op) == Class::Reduce).count();
        if p.kind[s] != GroupKind::Stitch || reduces < 2 {
            continue;
        }
        // The softmax feeds this matmul alone.
        let r2 = p.find(k2);
        let outs = p.outputs(s);
        if outs.len() != 1 || p.consumers[outs[0].index()].clone().into_iter().any(|c| p.find(c) != r2) {
            continue;
        }
        // Its scores come from a contraction group that feeds the softmax alone.
        let mut k1 = None;
        for m in p.members[s].clone() {
            for v in &g.nodes[m].inputs {
                if let Some(x) = p.producer_node(*v) {
                    let rx = p.find(x);
                    if p.kind[rx] == GroupKind::Contraction {
                        k1 = Some(rx);
                    }
                }
            }
        }
        let Some(k1) = k1 else { continue };
        let k1_outs = p.outputs(k1);
        if k1_outs.iter().any(|o| p.consumers[o.index()].clone().into_iter().any(|c| p.find(c) != s)) {
            continue;
        }
        if p.merge(k1, s, GroupKind::Attention) {
            p.merge(k1, k2, GroupKind::Attention);
        }
    }
}

/// 5. Independent element-wise groups reading one value over equal extents.
fn fuse_horizontal(p: &mut Partition) {
    let g = p.g;
    for v in 0..g.num_values() {
        let v = ValueId(v as u32);
        let mut groups: Vec<usize> = Vec::new();
        for c in p.consumers[v.index()].clone() {
            let r = p.find(c);
            if p.kind[r] == GroupKind::Elementwise && !groups.contains(&r) {
                groups.push(r);
            }
        }
        // Each group with the first before it of its space (a decoder's key
        // and value appends, over the cache, beside its queries' rotation).
        for i in 1..groups.len() {
            for j in 0..i {
                let (a, b) = (p.find(groups[j]), p.find(groups[i]));
                let (sa, sb) = (last_numel(p, a), last_numel(p, b));
                if a != b && p.same_numel(&sa, &sb) && p.merge(a, b, GroupKind::Elementwise) {
                    let r = p.find(a);
                    p.horizontal[r] = true;
                    break;
                }
            }
        }
    }
}

fn last_numel(p: &mut Partition, r: usize) -> SymExpr {
    let last = *p.members[r].iter().max().unwrap_or(&r);
    p.numel(p.g.nodes[last].output)
}

/// The groups in dependence order, with their inputs, outputs and spaces.
fn plan(p: &mut Partition) -> FusionPlan {
    let g = p.g;
    let mut constants = Vec::new();
    let mut roots: Vec<usize> = Vec::new();
    for i in 0..g.nodes.len() {
        if p.is_constant(i) {
            constants.push(i);
        } else {
            let r = p.find(i);
            if !roots.contains(&r) {
                roots.push(r);
            }
        }
    }
    // Kahn's order over the group graph; ties by first node.
    let index: HashMap<usize, usize> = roots.iter().enumerate().map(|(i, r)| (*r, i)).collect();
    let mut indeg = vec![0usize; roots.len()];
    let mut succ: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); roots.len()];
    for (i, r) in roots.clone().into_iter().enumerate() {
        for s in p.successors(r) {
            if let Some(&j) = index.get(&s) {
                if succ[i].insert(j) {
                    indeg[j] += 1;
                }
            }
        }
    }
    let mut ready: BTreeSet<(usize, usize)> =
        (0..roots.len()).filter(|i| indeg[*i] == 0).map(|i| (min_node(p, roots[i]), i)).collect();
    let mut order = Vec::with_capacity(roots.len());
    while let Some(first) = ready.pop_first() {
        let i = first.1;
        order.push(i);
        for &j in &succ[i].clone() {
            indeg[j] -= 1;
            if indeg[j] == 0 {
                ready.insert((min_node(p, roots[j]), j));
            }
        }
    }
    let groups = order
        .into_iter()
        .map(|i| {
            let r = roots[i];
            let mut nodes = p.members[r].clone();
            nodes.sort_unstable();
            let inside: BTreeSet<ValueId> = nodes.iter().map(|n| g.nodes[*n].output).collect();
            let mut inputs: Vec<ValueId> = Vec::new();
            for n in &nodes {
                for v in &g.nodes[*n].inputs {
                    if !inside.contains(v) && !inputs.contains(v) {
                        inputs.push(*v);
                    }
                }
            }
            let kind = p.kind[r];
            let first_reduce = nodes.iter().find(|n| class(&g.nodes[**n].op) == Class::Reduce);
            let space = match (kind, first_reduce) {
                (GroupKind::Stitch, Some(n)) => g.ty(g.nodes[*n].inputs[0]).shape.clone(),
                _ => g.ty(g.nodes[*nodes.last().unwrap_or(&r)].output).shape.clone(),
            };
            let mut outputs = p.outputs(r);
            outputs.sort();
            FusionGroup { kind, nodes, inputs, outputs, space, horizontal: p.horizontal[r] }
        })
        .collect();
    FusionPlan { groups, constants }
}

fn min_node(p: &Partition, r: usize) -> usize {
    *p.members[r].iter().min().unwrap_or(&r)
}

/// A readable listing: one group a paragraph.
pub fn print_plan(g: &Graph, plan: &FusionPlan) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let name = |v: &ValueId| format!("%{}", g.name(*v));
    for (i, gr) in plan.groups.iter().enumerate() {
        let ops: Vec<&str> = gr.nodes.iter().map(|n| g.nodes[*n].op.name()).collect();
        let space: Vec<String> = gr.space.iter().map(|d| d.to_string()).collect();
        let _ = writeln!(
            s,
            "group {i}: {}{} over [{}]",
            gr.kind,
            if gr.horizontal { " (horizontal)" } else { "" },
            space.join(", ")
        );
        let _ = writeln!(s, "  ops: {}", ops.join(" "));
        let _ = writeln!(s, "  inputs: {}", gr.inputs.iter().map(name).collect::<Vec<_>>().join(", "));
        let _ = writeln!(s, "  outputs: {}", gr.outputs.iter().map(name).collect::<Vec<_>>().join(", "));
    }
    s
}
