//! The analysis of a built program: what its schedules depend on (which
//! reductions are per point, per row or split across threads; the guards it is
//! versioned on), recorded in its [`Schedules`] for the code generator and the
//! runtime's per-shape plan.

use plan::{Exprs, LoopProgram, Node, OnePointWhy, Schedules, SplitReduction, E};

/// Every reduction the stored values use (not those inside other reductions).
fn reductions(p: &LoopProgram) -> Vec<E> {
    let x = &p.exprs;
    let mut seen = vec![false; x.len()];
    let mut stack: Vec<E> = p.stores.iter().map(|s| s.value).collect();
    let mut out = Vec::new();
    while let Some(e) = stack.pop() {
        if std::mem::replace(&mut seen[e.index()], true) {
            continue;
        }
        match x.node(e) {
            Node::Reduce { .. } => out.push(e),
            n => stack.extend(n.children()),
        }
    }
    out
}

/// Find the program's [`Schedules`] (once, when it is built).
pub fn analyze(p: &mut LoopProgram) {
    let x = &p.exprs;
    let inner = p.inner_var();
    let reductions = reductions(p);
    // Those that depend on the innermost variable are computed per point of
    // the nest; the others once per row (the stitch schedule).
    let per_point: Vec<E> = match inner {
        Some(v) => reductions.iter().copied().filter(|r| x.free(*r) & (1u64 << v) != 0).collect(),
        None => Vec::new(),
    };
    // A reduction whose extent depends on the point (a cumulative sum's
    // prefix) is reduced point by point, never by the schedules that take its
    // extent once per row or split it across threads.
    let fixed = |r: &E| match x.node(*r) {
        Node::Reduce { vars, .. } => vars.iter().all(|v| x.free(x.extents[*v as usize]) == 0),
        _ => true,
    };
    let row_reduction = per_point.iter().filter(|r| fixed(r)).find_map(|r| {
        let Node::Reduce { vars, body, .. } = x.node(*r) else { return None };
        let last = *vars.last()?;
        crate::versions::loads_along(x, *body, last).then(|| x.extents[last as usize])
    });
    let one_loop = p.vars.iter().filter(|v| matches!(x.node(**v), Node::Var(_))).count() <= 1;
    let splits_inner = inner.is_some() && one_loop && per_point.len() == reductions.len();
    let split = match (&reductions[..], inner.is_none() || splits_inner) {
        ([r], true) if fixed(r) => match x.node(*r) {
            Node::Reduce { vars, .. } => {
                vars.last().map(|&var| SplitReduction { reduce: *r, var, extent: x.extents[var as usize] })
            }
            _ => None,
        },
        _ => None,
    };
    let varies = |r: &E| match (x.node(*r), inner) {
        (Node::Reduce { vars, .. }, Some(v)) => {
            vars.iter().any(|w| x.free(x.extents[*w as usize]) & (1u64 << v) != 0)
        }
        _ => false,
    };
    // A reduction recomputed inside another's body (a softmax over a global
    // pool's means) must sum in the order the point's own copy does, or the
    // softmax's max is not the max of its terms; one point at a time, both
    // are summed along their last axis in the same vector-then-lanes order.
    let points_one_at_a_time = if per_point.iter().any(varies) {
        Some(OnePointWhy::ExtentVaries)
    } else if !per_point.is_empty() && reductions.iter().any(|r| nested_reduction(x, *r)) {
        Some(OnePointWhy::NestedReduction)
    } else {
        None
    };
    let guards = crate::versions::guards(x, &p.stores, inner);
    p.schedules = Schedules { guards, row_reduction, splits_inner, split, points_one_at_a_time };
}

/// Whether reduction `r`'s body holds another reduction.
fn nested_reduction(x: &Exprs, r: E) -> bool {
    let Node::Reduce { body, .. } = x.node(r) else { return false };
    let mut seen = vec![false; x.len()];
    let mut stack = vec![*body];
    while let Some(e) = stack.pop() {
        if std::mem::replace(&mut seen[e.index()], true) {
            continue;
        }
        match x.node(e) {
            Node::Reduce { .. } => return true,
            n => stack.extend(n.children()),
        }
    }
    false
}
