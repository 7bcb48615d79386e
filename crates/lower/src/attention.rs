//! Fusing attention (RUNTIME.md §2): an attention group lowers to three steps,
//! `S = Q·Kᵀ`, the softmax program `P = softmax(f(S))` and `O = P·V`. When the
//! softmax reads each row of `S` only in that row and writes `P` at the nest's
//! own positions, a block of query rows can run all three on tiles in a
//! thread's cache: the three steps become one [`AttentionStep`] and the `T × T`
//! buffers `S` and `P` are never allocated.

use crate::expr::{Node, E};
use crate::plan::{AttentionStep, BufferKind, ModelPlan, Step, StepKind};
use crate::program::LoopProgram;

/// The most buffers a fused softmax program may take (the runtime gives each
/// task a table of them on its stack).
pub const MAX_ARGS: usize = 16;

/// Replace every fusible `matmul, softmax, matmul` triple of an attention group
/// by one fused step; returns how many were fused.
pub fn fuse_attention(plan: &mut ModelPlan) -> usize {
    let mut steps: Vec<Step> = Vec::with_capacity(plan.steps.len());
    let mut remap = vec![0usize; plan.steps.len() + 1];
    let mut fused = 0;
    let mut i = 0;
    while i < plan.steps.len() {
        remap[i] = steps.len();
        if let Some(a) = fusible(plan, i) {
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
        for g in &mut plan.groups {
            g.steps = remap[g.steps.start]..remap[g.steps.end];
        }
        plan.steps = steps;
        plan.compute_lifetimes();
    }
    fused
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
    if args.len() > MAX_ARGS || args.iter().filter(|b| **b == s || **b == p).count() != 2 {
        return None;
    }
    // P is the only store (at the nest's positions: S's row-major order, see
    // `reads_rows`), and S is read row by row.
    if prog.params[sp].shape.len() != s1.batch.len() + 2
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
    })
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
