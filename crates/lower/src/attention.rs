//! Fusing attention (RUNTIME.md §2): an attention group lowers to three steps,
//! `S = Q·Kᵀ`, the softmax program `P = softmax(f(S))` and `O = P·V`. When the
//! softmax reads each row of `S` only in that row and writes `P` at the nest's
//! own positions, a block of query rows can run all three on tiles in a
//! thread's cache: the three steps become one [`AttentionStep`] and the `T × T`
//! buffers `S` and `P` are never allocated.

use std::collections::HashMap;

use ir::{BinaryOp, UnaryOp};

use plan::{
    AttentionStep, BufferKind, Combine, Exprs, LoopProgram, ModelPlan, Node, OnlineSoftmax, Param, Step,
    StepKind, Store, E, MAX_SOFTMAX_ARGS,
};

/// Replace every fusible `matmul, softmax, matmul` triple of an attention group
/// by one fused step; returns how many were fused.
pub fn fuse_attention(plan: &mut ModelPlan) -> usize {
    let mut steps: Vec<Step> = Vec::with_capacity(plan.steps.len());
    let mut remap = vec![0usize; plan.steps.len() + 1];
    let mut fused = 0;
    let mut i = 0;
    // One online program per softmax program (the layers of a model share one),
    // and one pair of scratch slots for all of them.
    let mut online: HashMap<usize, Option<usize>> = HashMap::new();
    let mut slots: Option<(u32, u32)> = None;
    while i < plan.steps.len() {
        remap[i] = steps.len();
        if let Some(mut a) = fusible(plan, i) {
            let (offset_slot, len_slot) =
                *slots.get_or_insert_with(|| (plan.dims.scratch(), plan.dims.scratch()));
            let program = *online.entry(a.softmax).or_insert_with(|| {
                let p = online_program(&plan.programs[a.softmax], a.scores_param, offset_slot, len_slot)?;
                plan.programs.push(p);
                Some(plan.programs.len() - 1)
            });
            let params = plan.programs[a.softmax].params.len();
            let nan_to_zero = nan_guarded(&plan.programs[a.softmax]).is_some();
            a.online = program.map(|program| OnlineSoftmax {
                program,
                max_param: params,
                logits_param: params + 1,
                offset_slot,
                len_slot,
                nan_to_zero,
            });
            remap[i + 1] = steps.len();
            remap[i + 2] = steps.len();
            steps.push(Step { group: plan.steps[i].group, kind: StepKind::Attention(Box::new(a)) });
            fused += 1;
            i += 3;
        } else {
            steps.push(plan.steps[i].clone());
            i += 1;
        }
    }
    remap[plan.steps.len()] = steps.len();
    if fused > 0 {
        replace_steps(plan, steps, &remap);
    }
    fused
}

/// `plan`'s steps replaced by `steps`, old step `i` now at `remap[i]` (the
/// groups' ranges moved with them), the buffers' lifetimes recomputed.
fn replace_steps(plan: &mut ModelPlan, steps: Vec<Step>, remap: &[usize]) {
    for g in &mut plan.groups {
        g.steps = remap[g.steps.start]..remap[g.steps.end];
    }
    plan.steps = steps;
    plan.compute_lifetimes();
}

/// The fused step for steps `i..i+3`, when they are an attention triple that fuses.
fn fusible(plan: &ModelPlan, i: usize) -> Option<AttentionStep> {
    let group = plan.steps.get(i)?.group;
    if plan.groups.get(group)?.kind != passes::GroupKind::Attention {
        return None;
    }
    let (StepKind::MatMul(s1), StepKind::Loop { program, args }, StepKind::MatMul(s2)) =
        (&plan.steps[i].kind, &plan.steps.get(i + 1)?.kind, &plan.steps.get(i + 2)?.kind)
    else {
        return None;
    };
    if plan.steps[i + 1].group != group || plan.steps[i + 2].group != group {
        return None;
    }
    let konst = |slot: u32, v: i64| plan.dims.exprs()[slot as usize].as_const() == Some(v);
    // The products: activations only, no epilogue, Q read in place, S and P dense.
    if s1.weight || s2.weight || !s1.epilogue.is_identity() || !s2.epilogue.is_identity() {
        return None;
    }
    if !konst(s1.a.cs, 1) || !konst(s1.c.cs, 1) || !konst(s1.c.offset, 0) || s1.c.rs != s1.n {
        return None;
    }
    let (s, p) = (s1.c.buf, s2.a.buf);
    let temp_between = |b: usize, first: usize| {
        let buf = &plan.buffers[b];
        matches!(buf.kind, BufferKind::Temp) && buf.first == first && buf.last == first + 1
    };
    if s == p || !temp_between(s, i) || !temp_between(p, i + 1) {
        return None;
    }
    // P is read as S was written: the same dense layout, entries and extents.
    let same_view =
        s2.a.offset == s1.c.offset && s2.a.batch == s1.c.batch && s2.a.rs == s1.c.rs && s2.a.cs == s1.c.cs;
    if !same_view || s2.batch != s1.batch || s2.m != s1.m || s2.k != s1.n {
        return None;
    }
    let prog = &plan.programs[*program];
    let sp = args.iter().position(|b| *b == s)?;
    let pp = args.iter().position(|b| *b == p)?;
    if args.len() > MAX_SOFTMAX_ARGS || args.iter().filter(|b| **b == s || **b == p).count() != 2 {
        return None;
    }
    // P is the only store (at the nest's positions: S's row-major order, see
    // `reads_rows`), and S is read row by row.
    // (S's batch may be refined into more dims than the program's: a grouped
    // query's heads; both count the entries in one row-major order.)
    if prog.params[sp].shape.len() < 2
        || prog.stores.len() != 1
        || prog.stores[0].param as usize != pp
        || prog.params.iter().enumerate().any(|(k, q)| q.written && k != pp)
    {
        return None;
    }
    if !reads_rows(prog, sp as u32) {
        return None;
    }
    Some(AttentionStep {
        scores: (**s1).clone(),
        softmax: *program,
        args: args.clone(),
        scores_param: sp,
        probs_param: pp,
        output: (**s2).clone(),
        online: None,
    })
}

/// `p` where program `prog`'s one store is `select(is_nan(p), 0, p)`.
fn nan_guarded(prog: &LoopProgram) -> Option<E> {
    let x = &prog.exprs;
    let [store] = &prog.stores[..] else { return None };
    let Node::Select(c, zero, p) = *x.node(store.value) else { return None };
    let guarded = *x.node(c) == Node::Unary(UnaryOp::IsNaN, p)
        && matches!(*x.node(zero), Node::Const(bits) if f64::from_bits(bits) == 0.0);
    guarded.then_some(p)
}

/// The online-softmax program of softmax program `prog` (see [`OnlineSoftmax`])
/// whose parameter `sp` is the scores, when its one store is
/// `exp(l - max l) / sum exp(l - max l)` for logits `l` of the nest's point
/// (the form the importer gives ONNX's Softmax), or that with its NaNs made
/// 0 (`OnlineSoftmax::nan_to_zero`: the fused kernels give an empty row 0);
/// `None` otherwise.
///
/// The logits are rebuilt over a chunk of keys: the key variable `k` becomes
/// `j` below the chunk's length (slot `len`); the scores, which the fused step
/// holds a chunk wide, are read at `j`, and every other buffer (a mask, a
/// position) at `offset + j`, the key's place in the whole row.
pub fn online_program(prog: &LoopProgram, sp: usize, offset: u32, len: u32) -> Option<LoopProgram> {
    let x = &prog.exprs;
    let [store] = &prog.stores[..] else { return None };
    let k = prog.inner_var()?;
    let rank = prog.vars.len();
    // A softmax whose NaNs the model makes 0 (`OnlineSoftmax::nan_to_zero`).
    let value = nan_guarded(prog).unwrap_or(store.value);
    let Node::Binary(BinaryOp::Div, num, sum) = x.node(value) else { return None };
    let Node::Unary(UnaryOp::Exp, shifted) = x.node(*num) else { return None };
    let Node::Binary(BinaryOp::Sub, logits, max) = x.node(*shifted) else { return None };
    let Node::Reduce { combine: Combine::Max, vars: mv, body: lmax } = x.node(*max) else { return None };
    let Node::Reduce { combine: Combine::Sum, vars: sv, body: lsum } = x.node(*sum) else { return None };
    let ([a], [b]) = (&mv[..], &sv[..]) else { return None };
    // The reductions run over the keys: the max over the logits at every key, the
    // sum over `exp(logits - max)` at every key.
    // (Rebuilt in a copy of the DAG: the same expression is the same node.)
    let mut same = prog.exprs.clone();
    let at_a = Rebuild::new(x, &mut same).var(k, *a).expr(*logits)?;
    let at_b = Rebuild::new(x, &mut same).var(k, *b).expr(*logits)?;
    let sb = same.binary(BinaryOp::Sub, at_b, *max, x.dtype(*shifted));
    let eb = same.unary(UnaryOp::Exp, sb, x.dtype(*shifted));
    if at_a != *lmax || eb != *lsum || x.len() != same.len() {
        return None;
    }
    if x.extents[*a as usize] != x.extents[k as usize] || x.extents[*b as usize] != x.extents[k as usize] {
        return None;
    }
    let dtype = x.dtype(store.value);
    let mut y = Exprs::default();
    let mut outer = Vec::with_capacity(rank);
    let mut vars = HashMap::new();
    for &v in &prog.vars[..rank - 1] {
        let nv = match x.node(v) {
            Node::Var(id) => {
                let ext = Rebuild::new(x, &mut y).expr(x.extents[*id as usize])?;
                let nv = y.var(ext)?;
                vars.insert(*id, nv);
                nv
            }
            _ => Rebuild::new(x, &mut y).expr(v)?,
        };
        outer.push(nv);
    }
    let chunk = y.dim(len);
    let first = y.dim(offset);
    let j = y.var(chunk)?;
    let kk = y.var(chunk)?;
    let mut space: Vec<E> =
        prog.space[..rank - 1].iter().map(|e| Rebuild::new(x, &mut y).expr(*e)).collect::<Option<_>>()?;
    space.push(chunk);
    // The logits at chunk position `at` (j for the store, kk for the max).
    let chunk_logits = |y: &mut Exprs, at: E| -> Option<E> {
        let key = y.add(first, at);
        let mut r = Rebuild::new(x, y);
        r.vars = vars.clone();
        r.vars.insert(k, key);
        r.scores = Some((sp as u32, k, at));
        r.expr(*logits)
    };
    let lj = chunk_logits(&mut y, j)?;
    let lk = chunk_logits(&mut y, kk)?;
    let n = prog.params.len() as u32;
    let running = y.load(n, dtype, outer.clone(), None);
    let chunk_max = y.reduce(Combine::Max, vec![kk], lk);
    let m = y.binary(BinaryOp::Max, running, chunk_max, dtype);
    let d = y.binary(BinaryOp::Sub, lj, m, dtype);
    let p = y.unary(UnaryOp::Exp, d, dtype);
    let mut params: Vec<Param> = prog.params.clone();
    // The scores a chunk wide; the probabilities and logits over the nest's points.
    let mut shape: Vec<E> =
        prog.params[sp].shape.iter().map(|e| Rebuild::new(x, &mut y).expr(*e)).collect::<Option<_>>()?;
    *shape.last_mut()? = chunk;
    params[sp].shape = shape;
    for (i, q) in params.iter_mut().enumerate() {
        if i != sp {
            q.shape = q.shape.iter().map(|e| Rebuild::new(x, &mut y).expr(*e)).collect::<Option<_>>()?;
        }
    }
    params[store.param as usize].shape = space.clone();
    params.push(Param {
        name: "running max".into(),
        dtype,
        shape: space[..rank - 1].to_vec(),
        written: false,
    });
    params.push(Param { name: "logits".into(), dtype, shape: space.clone(), written: true });
    let mut out = LoopProgram {
        name: format!("{}_online", prog.name),
        exprs: y,
        params,
        space,
        vars: outer.into_iter().chain([j]).collect(),
        stores: vec![Store { param: n + 1, value: lj }, Store { param: store.param, value: p }],
        checks: prog.checks.clone(),
        schedules: Default::default(),
    };
    crate::schedules::analyze(&mut out);
    Some(out)
}

/// Copies expressions of one program into another's DAG, replacing variables
/// (`vars`: old id to new expression; a variable not in it is an error, or kept
/// as itself with `keep`) and, with `scores`, the last index of every load of
/// that parameter by the given expression.
struct Rebuild<'a> {
    from: &'a Exprs,
    to: &'a mut Exprs,
    vars: HashMap<u32, E>,
    keep: bool,
    /// (parameter, key variable, new last index).
    scores: Option<(u32, u32, E)>,
    done: HashMap<E, E>,
}

impl<'a> Rebuild<'a> {
    fn new(from: &'a Exprs, to: &'a mut Exprs) -> Rebuild<'a> {
        Rebuild { from, to, vars: HashMap::new(), keep: false, scores: None, done: HashMap::new() }
    }

    /// Within the same DAG: variable `v` becomes variable `by` (every other stays).
    fn var(mut self, v: u32, by: u32) -> Rebuild<'a> {
        self.keep = true;
        let e = self.to.var_node(by);
        self.vars.insert(v, e);
        self
    }

    fn expr(&mut self, e: E) -> Option<E> {
        if let Some(d) = self.done.get(&e) {
            return Some(*d);
        }
        let (x, dt) = (self.from, self.from.dtype(e));
        let out = match x.node(e).clone() {
            Node::Var(v) => match self.vars.get(&v) {
                Some(n) => *n,
                None if self.keep => self.to.var_node(v),
                None => return None,
            },
            Node::Dim(s) => self.to.dim(s),
            Node::Const(bits) => {
                if dt.is_float() {
                    self.to.float(dt, f64::from_bits(bits))
                } else {
                    self.to.constant(dt, bits as i64 as f64, bits as i64)
                }
            }
            Node::Load { buf, index, guard } => {
                let mut idx: Vec<E> = index.iter().map(|i| self.expr(*i)).collect::<Option<_>>()?;
                if let Some((_, k, at)) = self.scores.filter(|(p, ..)| *p == buf) {
                    // The scores' last index is the key itself, nothing else.
                    if x.node(*index.last()?) != &Node::Var(k) || guard.is_some() {
                        return None;
                    }
                    *idx.last_mut()? = at;
                }
                let guard = match guard {
                    Some(g) => Some(self.expr(g)?),
                    None => None,
                };
                self.to.load(buf, dt, idx, guard)
            }
            Node::Unary(op, a) => {
                let a = self.expr(a)?;
                self.to.unary(op, a, dt)
            }
            Node::Binary(op, a, b) => {
                let (a, b) = (self.expr(a)?, self.expr(b)?);
                self.to.binary(op, a, b, dt)
            }
            Node::Select(c, a, b) => {
                let (c, a, b) = (self.expr(c)?, self.expr(a)?, self.expr(b)?);
                self.to.select(c, a, b)
            }
            Node::Cast(a) => {
                let a = self.expr(a)?;
                self.to.cast(a, dt)
            }
            Node::Check { ok, code, value } => {
                let (ok, value) = (self.expr(ok)?, self.expr(value)?);
                self.to.check(ok, code, value)
            }
            // Logits computed by a reduction of their own are not rebuilt.
            Node::Reduce { .. } => return None,
        };
        self.done.insert(e, out);
        Some(out)
    }
}

/// Whether every load of parameter `param` (a dense buffer) reads the nest's
/// current row, any position along it: the nest's last axis is the buffer's
/// last, and its other variables, in order, index the buffer's other dims, the
/// first of them possibly merging several (a `[b·h, t, t]` batched product read
/// in a `[b, h, t, t]` nest). The buffer's row `r` is then the nest's row `r`.
fn reads_rows(prog: &LoopProgram, param: u32) -> bool {
    let x = &prog.exprs;
    let shape = &prog.params[param as usize].shape;
    let (rank, srank) = (prog.vars.len(), shape.len());
    if rank == 0 || srank == 0 || prog.inner() != Some(rank - 1) || shape[srank - 1] != prog.space[rank - 1] {
        return false;
    }
    let real = |v: &E| matches!(x.node(*v), Node::Var(_));
    let rows: Vec<E> = prog.vars[..rank - 1].iter().copied().filter(real).collect();
    (0..x.len()).all(|n| match x.node(E(n as u32)) {
        Node::Load { buf, index, .. } if *buf == param => {
            if index.len() != srank {
                return false;
            }
            let mut got = Vec::new();
            if srank > 1 && !digits(prog, index[0], &mut got) {
                return false;
            }
            for d in 1..srank.saturating_sub(1) {
                let i = index[d];
                let ok = match x.node(i) {
                    Node::Var(v) => x.extents[*v as usize] == shape[d],
                    _ => x.as_int(i) == Some(0) && x.as_int(shape[d]) == Some(1),
                };
                if !ok {
                    return false;
                }
                got.push(i);
            }
            got.retain(real);
            got == rows
        }
        _ => true,
    })
}

/// The variables of `e` as a mixed-radix number (`(a·n + b)` with `b` a
/// variable of extent `n`), most significant first; false for anything else.
fn digits(prog: &LoopProgram, e: E, out: &mut Vec<E>) -> bool {
    let x = &prog.exprs;
    match x.node(e) {
        Node::Var(_) => {
            out.push(e);
            true
        }
        _ if x.as_int(e) == Some(0) => true,
        Node::Binary(ir::BinaryOp::Add, a, b) => {
            let (hi, lo) = match (x.node(*a), x.node(*b)) {
                (Node::Binary(ir::BinaryOp::Mul, p, k), Node::Var(v)) => ((*p, *k), (*b, *v)),
                (Node::Var(v), Node::Binary(ir::BinaryOp::Mul, p, k)) => ((*p, *k), (*a, *v)),
                _ => return false,
            };
            let ((p, k), (b, v)) = (hi, lo);
            if x.extents[v as usize] != k || !digits(prog, p, out) {
                return false;
            }
            out.push(b);
            true
        }
        _ => false,
    }
}

/// Split back into its three steps every fused attention that `keep` refuses
/// (a backend that fuses only some: the GPU's kernel needs an online softmax
/// whose logits it can compute per element and a head dimension it is built
/// for); returns how many were split. The scores and probabilities buffers,
/// which the fused step never touched, are live again.
pub fn unfuse_attention(plan: &mut ModelPlan, keep: impl Fn(&ModelPlan, &AttentionStep) -> bool) -> usize {
    let mut steps: Vec<Step> = Vec::with_capacity(plan.steps.len());
    let mut remap = vec![0usize; plan.steps.len() + 1];
    let mut split = 0;
    for (i, st) in plan.steps.iter().enumerate() {
        remap[i] = steps.len();
        match &st.kind {
            StepKind::Attention(a) if !keep(plan, a) => {
                let group = st.group;
                steps.push(Step { group, kind: StepKind::MatMul(Box::new(a.scores.clone())) });
                steps.push(Step { group, kind: StepKind::Loop { program: a.softmax, args: a.args.clone() } });
                steps.push(Step { group, kind: StepKind::MatMul(Box::new(a.output.clone())) });
                split += 1;
            }
            _ => steps.push(st.clone()),
        }
    }
    remap[plan.steps.len()] = steps.len();
    if split > 0 {
        replace_steps(plan, steps, &remap);
    }
    split
}

/// Folds each head merge into the attention before it: an attention step
/// whose output only a permuting copy reads (`[b, h, s, d] → [b, s, h·d]`
/// before the output projection; grouped-query heads `[b, kv, g, s, d]`
/// too, whose `kv·g` the copy reads as one) writes the copy's layout itself, its
/// output view strided into the copy's buffer, and the copy is dropped.
/// For a backend whose attention writes through any strides (the GPU's
/// kernel: a launch and a pass over the output fewer a layer); the CPU's
/// attention writes each entry's rows as one block, so its plan keeps the
/// copy. Returns how many copies were dropped.
pub fn fold_head_merges(plan: &mut ModelPlan) -> usize {
    let mut dropped = vec![false; plan.steps.len()];
    for i in 0..plan.steps.len() {
        let Some((j, y, strides)) = head_merge(plan, i) else { continue };
        let slots: Vec<u32> = strides.iter().map(|s| plan.dims.slot(s)).collect();
        let StepKind::Attention(a) = &mut plan.steps[i].kind else { continue };
        let c = &mut a.output.c;
        let n = slots.len();
        (c.buf, c.batch, c.rs, c.cs) = (y, slots[..n - 2].to_vec(), slots[n - 2], slots[n - 1]);
        dropped[j] = true;
    }
    let count = dropped.iter().filter(|d| **d).count();
    if count == 0 {
        return 0;
    }
    let mut steps = Vec::with_capacity(plan.steps.len() - count);
    let mut remap = vec![0usize; plan.steps.len() + 1];
    for (i, st) in plan.steps.iter().enumerate() {
        remap[i] = steps.len();
        if !dropped[i] {
            steps.push(st.clone());
        }
    }
    remap[plan.steps.len()] = steps.len();
    replace_steps(plan, steps, &remap);
    count
}

/// For attention step `i`, the copy step that alone reads its output, the
/// copy's buffer and the strides (batch…, rows, columns) at which the
/// output lies there, when the copy only permutes: one store of a load of
/// the output at the nest's variables in another order, into a temporary
/// first written there.
fn head_merge(plan: &ModelPlan, i: usize) -> Option<(usize, usize, Vec<sym::SymExpr>)> {
    let StepKind::Attention(a) = &plan.steps[i].kind else { return None };
    let x = a.output.c.buf;
    if !matches!(plan.buffers[x].kind, BufferKind::Temp) {
        return None;
    }
    let readers: Vec<usize> =
        (0..plan.steps.len()).filter(|&j| j != i && plan.steps[j].kind.touched().contains(&x)).collect();
    let [j] = readers[..] else { return None };
    let StepKind::Loop { program, args } = &plan.steps[j].kind else { return None };
    let prog = &plan.programs[*program];
    if j < i || args.len() != 2 || prog.stores.len() != 1 || args[0] == args[1] {
        return None;
    }
    let out = prog.stores[0].param as usize;
    let (y, inp) = (args[out], 1 - out);
    if args[inp] != x || prog.params[inp].written || !matches!(plan.buffers[y].kind, BufferKind::Temp) {
        return None;
    }
    // The copy's output is first written by the copy, touched by nothing before it.
    if (0..j).any(|k| plan.steps[k].kind.touched().contains(&y)) {
        return None;
    }
    let Node::Load { buf, index, guard: None } = prog.exprs.node(prog.stores[0].value) else { return None };
    if *buf as usize != inp || prog.params[inp].dtype != prog.params[out].dtype {
        return None;
    }
    let sym = |e: E, plan: &ModelPlan| -> Option<sym::SymExpr> {
        match prog.exprs.node(e) {
            Node::Dim(s) => Some(plan.dims.exprs()[*s as usize].clone()),
            Node::Const(c) => Some(sym::SymExpr::constant(*c as i64)),
            _ => None,
        }
    };
    // The output's dims (`[batch…, m, n]`) are the copy's input's, or split
    // them (grouped-query heads: the attention's `[kv heads, group]` the
    // copy's heads), in order; its view is their dense row-major layout.
    let c = &a.output.c;
    let dims: Vec<u32> = a.output.batch.iter().copied().chain([a.output.m, a.output.n]).collect();
    let shape = &prog.params[inp].shape;
    if index.len() != shape.len() {
        return None;
    }
    let ext: Vec<sym::SymExpr> = dims.iter().map(|s| plan.dims.exprs()[*s as usize].clone()).collect();
    let input: Vec<sym::SymExpr> = shape.iter().map(|e| sym(*e, plan)).collect::<Option<_>>()?;
    // `groups[k]`: the output dims that make input dim `k`.
    let mut groups: Vec<std::ops::Range<usize>> = Vec::with_capacity(input.len());
    let mut at = 0;
    for want in &input {
        let start = at;
        let mut product = sym::SymExpr::constant(1);
        while at < ext.len() && product != *want {
            product = product.try_mul(&ext[at]).ok()?;
            at += 1;
        }
        if product != *want || at == start {
            return None;
        }
        groups.push(start..at);
    }
    if at != ext.len() {
        return None;
    }
    let slot = |s: u32| &plan.dims.exprs()[s as usize];
    let mut dense = sym::SymExpr::constant(1);
    let strides: Vec<u32> = c.batch.iter().copied().chain([c.rs, c.cs]).collect();
    for (k, st) in strides.iter().enumerate().rev() {
        if *slot(*st) != dense && ext[k].as_const() != Some(1) {
            return None;
        }
        dense = dense.try_mul(&ext[k]).ok()?;
    }
    if slot(c.offset).as_const() != Some(0) {
        return None;
    }
    // The copy's nest: each input dim read at one nest variable (or at 0,
    // an extent of 1), each variable at most once; the store at the nest's
    // row-major position.
    let nest: Vec<Option<sym::SymExpr>> = prog.space.iter().map(|e| sym(*e, plan)).collect();
    if nest.iter().any(Option::is_none) {
        return None;
    }
    let nest: Vec<sym::SymExpr> = nest.into_iter().flatten().collect();
    let mut used = vec![false; nest.len()];
    let mut new_strides = Vec::with_capacity(dims.len());
    for (k, e) in index.iter().enumerate() {
        let stride = match prog.exprs.node(*e) {
            Node::Const(0) if input[k].as_const() == Some(1) => sym::SymExpr::constant(0),
            node @ Node::Var(_) => {
                let pos = prog.vars.iter().position(|v| prog.exprs.node(*v) == node)?;
                if used[pos] || nest[pos] != input[k] {
                    return None;
                }
                used[pos] = true;
                let mut s = sym::SymExpr::constant(1);
                for later in &nest[pos + 1..] {
                    s = s.try_mul(later).ok()?;
                }
                s
            }
            _ => return None,
        };
        // The output dims that split input dim `k`: strides of the inner ones'
        // extents times `stride`, outer first.
        for d in groups[k].clone() {
            let mut s = stride.clone();
            for inner in &ext[d + 1..groups[k].end] {
                s = s.try_mul(inner).ok()?;
            }
            new_strides.push(s);
        }
    }
    // Every point of the nest is stored once: the unread variables are 1 wide.
    if used.iter().zip(&nest).any(|(u, e)| !u && e.as_const() != Some(1)) {
        return None;
    }
    if new_strides.last()?.as_const() != Some(1) {
        return None;
    }
    Some((j, y, new_strides))
}
