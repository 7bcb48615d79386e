//! The analysis of a built program: what its schedules depend on (which
//! reductions are per point, per row or split across threads; the guards it is
//! versioned on), recorded in its [`Schedules`] for the code generator and the
//! runtime's per-shape plan.

use std::collections::HashMap;

use ir::DType;
use plan::{
    BorderGuard, Combine, Exprs, Interleave, LoopProgram, Node, OnePointWhy, RowScratch, Scatter, Schedules,
    SplitReduction, E, INTERLEAVE_MAX, UNSWITCH_DEPTH,
};

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
    } else if !per_point.is_empty()
        && reductions
            .iter()
            .any(|r| matches!(x.node(*r), Node::Reduce { body, .. } if x.holds_reduction(*body, None)))
    {
        Some(OnePointWhy::NestedReduction)
    } else {
        None
    };
    let guards = crate::versions::guards(x, &p.stores, inner);
    let row_scratch = row_scratch(p);
    let unswitched = match (&p.stores[..], inner) {
        ([st], inner) => {
            let n = row_choices(x, st.value, inner.map_or(0, |v| 1u64 << v), 0);
            (n > 1).then_some(n)
        }
        _ => None,
    };
    let plain = reductions.is_empty() && guards.is_empty() && row_scratch.is_none() && unswitched.is_none();
    // Whether a stored value reads memory contiguously along variable `v`.
    let values: Vec<E> = p.stores.iter().map(|s| s.value).collect();
    let along = |v: u32| values.iter().any(|e| crate::versions::loads_along(x, *e, v));
    let interleaved = if plain { interleave(p, &along) } else { None };
    let scattered = if plain && interleaved.is_none() { scatter(p, &values, &along) } else { None };
    let lanes = interleaved.map(|il| il.lanes).or(scattered.map(|sc| sc.lanes));
    let border_guards = border_guards(p, &guards, lanes);
    p.schedules = Schedules {
        guards,
        row_reduction,
        splits_inner,
        split,
        points_one_at_a_time,
        row_scratch,
        unswitched,
        border_guards,
        interleaved,
        scattered,
    };
}

/// The [`Scatter`] schedule of a nest with no reductions, versions or choices
/// per row: where no load runs along its last variable, the innermost
/// variable before it along which one does is where the lanes go, if more
/// loads vary along the last variable (a gather each, across its lanes) than
/// the nest has stores (a scatter each, across the other's).
fn scatter(p: &LoopProgram, values: &[E], along: &dyn Fn(u32) -> bool) -> Option<Scatter> {
    let x = &p.exprs;
    let inner = p.inner()?;
    let Node::Var(last) = *x.node(p.vars[inner]) else { return None };
    if along(last) {
        return None;
    }
    let (at, lanes) = (0..inner).rev().find_map(|i| match *x.node(p.vars[i]) {
        Node::Var(v) if along(v) => Some((i, v)),
        _ => None,
    })?;
    let gathers = loads_varying(x, values, last);
    (gathers > p.stores.len()).then_some(Scatter { lanes, at: at as u32 })
}

/// How many distinct loads of `values` vary along variable `v`.
fn loads_varying(x: &Exprs, values: &[E], v: u32) -> usize {
    let mut seen = vec![false; x.len()];
    let mut stack = values.to_vec();
    let mut n = 0;
    while let Some(e) = stack.pop() {
        if std::mem::replace(&mut seen[e.index()], true) || x.free(e) & (1u64 << v) == 0 {
            continue;
        }
        if matches!(x.node(e), Node::Load { .. }) {
            n += 1;
        }
        stack.extend(x.node(e).children());
    }
    n
}

/// The [`Interleave`] schedule of a nest with no reductions, versions or
/// choices per row: where its last variable has a constant extent of 2 to
/// [`INTERLEAVE_MAX`], the variable before it loops, and the stored values
/// read memory contiguously along that one but nowhere along the last (a
/// channels-first image's few channels written channels-last: across the last
/// variable's lanes each load would be a gather).
fn interleave(p: &LoopProgram, along: &dyn Fn(u32) -> bool) -> Option<Interleave> {
    let x = &p.exprs;
    let inner = p.inner()?;
    let (Node::Var(last), Node::Var(lanes)) =
        (x.node(p.vars[inner]), x.node(*p.vars.get(inner.checked_sub(1)?)?))
    else {
        return None;
    };
    let unrolled =
        u32::try_from(x.as_int(p.space[inner])?).ok().filter(|c| (2..=INTERLEAVE_MAX).contains(c))?;
    (along(*lanes) && !along(*last)).then_some(Interleave { lanes: *lanes, unrolled })
}

/// The guards of the loads the stored values read (reductions' bodies
/// included) that are range checks along a variable the code generator may
/// run along a vector's lanes (the nest's innermost, a reduction's last)
/// ([`BorderGuard`]), in node order.
fn border_guards(p: &LoopProgram, versions: &[E], outer_lanes: Option<u32>) -> Vec<BorderGuard> {
    let x = &p.exprs;
    let mut seen = vec![false; x.len()];
    let mut stack: Vec<E> = p.stores.iter().map(|s| s.value).collect();
    let mut lanes = p.inner_var().map_or(0u64, |v| 1 << v) | outer_lanes.map_or(0, |v| 1 << v);
    let mut guarded = Vec::new();
    while let Some(e) = stack.pop() {
        if std::mem::replace(&mut seen[e.index()], true) {
            continue;
        }
        match x.node(e) {
            Node::Load { guard: Some(g), .. } => guarded.push(*g),
            Node::Reduce { vars, .. } => lanes |= vars.last().map_or(0, |v| 1 << v),
            _ => {}
        }
        stack.extend(x.node(e).children());
    }
    guarded.sort();
    guarded.dedup();
    guarded
        .into_iter()
        .filter_map(|g| {
            let along = (0..64u32)
                .filter(|&v| (lanes & x.free(g)) >> v & 1 == 1 && range_checks(x, g, v, versions))
                .fold(0u64, |m, v| m | 1 << v);
            (along != 0).then_some(BorderGuard { guard: g, along })
        })
        .collect()
}

/// Whether each conjunct of `g` is a comparison of integer sides affine in
/// `var` in every version of the program (each value of its `versions`
/// guards), or does not depend on `var`.
fn range_checks(x: &Exprs, g: E, var: u32, versions: &[E]) -> bool {
    use ir::BinaryOp::{And, Greater, GreaterEq, Less, LessEq};
    match x.node(g) {
        Node::Binary(And, a, b) => range_checks(x, *a, var, versions) && range_checks(x, *b, var, versions),
        _ if x.free(g) >> var & 1 == 0 => true,
        Node::Binary(Less | LessEq | Greater | GreaterEq, a, b) if !x.dtype(*a).is_float() => {
            (0..1u32 << versions.len()).all(|bits| {
                let fixed = |c: E| versions.iter().position(|v| *v == c).map(|i| bits >> i & 1 == 1);
                [*a, *b].iter().all(|side| crate::versions::coef_with(x, *side, var, &fixed).is_some())
            })
        }
        _ => false,
    }
}

/// The row scratch of `p`, when it has one: one store of floats, and a
/// one-variable sum along the whole inner extent whose body, with its variable
/// renamed to the inner one, is a computed subexpression of the stored value.
fn row_scratch(p: &LoopProgram) -> Option<RowScratch> {
    let x = &p.exprs;
    let [st] = p.stores.as_slice() else { return None };
    let inner = p.inner()?;
    let Node::Var(iv) = x.node(p.vars[inner]) else { return None };
    let dt = p.params[st.param as usize].dtype;
    if !matches!(dt, DType::F32 | DType::F64) {
        return None;
    }
    // Every node the stored value reads, reductions' bodies included.
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![st.value];
    while let Some(e) = stack.pop() {
        if seen.insert(e) {
            stack.extend(x.node(e).children());
        }
    }
    let mut nodes: Vec<E> = seen.into_iter().collect();
    nodes.sort();
    for &r in &nodes {
        let Node::Reduce { combine: Combine::Sum, vars, body } = x.node(r) else { continue };
        let [rv] = vars.as_slice() else { continue };
        // (Not a sum that `reduce_level` keeps a scalar loop.)
        if x.extents[*rv as usize] != p.space[inner] || x.dtype(*body) != dt || x.reduction_on(*body, *rv) {
            continue;
        }
        let mut memo = HashMap::new();
        let twin = nodes.iter().copied().find(|&t| {
            t != *body
                && x.free(t) & (1u64 << iv) != 0
                && !matches!(x.node(t), Node::Load { .. } | Node::Var(_))
                && renamed(x, *body, t, *rv, *iv, &mut memo)
        });
        if let Some(twin) = twin {
            return Some(RowScratch { body: *body, twin, param: st.param });
        }
    }
    None
}

/// Whether `b` is `a` with the variable `from` renamed `to`.
fn renamed(x: &Exprs, a: E, b: E, from: u32, to: u32, memo: &mut HashMap<(E, E), bool>) -> bool {
    let mask = (1u64 << from) | (1u64 << to);
    if a == b {
        return x.free(a) & mask == 0;
    }
    if let Some(r) = memo.get(&(a, b)) {
        return *r;
    }
    let same = x.dtype(a) == x.dtype(b)
        && match (x.node(a), x.node(b)) {
            (Node::Var(va), Node::Var(vb)) => *va == from && *vb == to,
            (Node::Load { buf: ba, index: ia, guard: ga }, Node::Load { buf: bb, index: ib, guard: gb }) => {
                ba == bb
                    && ia.len() == ib.len()
                    && ia.iter().zip(ib).all(|(p, q)| renamed(x, *p, *q, from, to, memo))
                    && match (ga, gb) {
                        (None, None) => true,
                        (Some(p), Some(q)) => renamed(x, *p, *q, from, to, memo),
                        _ => false,
                    }
            }
            (Node::Unary(oa, p), Node::Unary(ob, q)) => oa == ob && renamed(x, *p, *q, from, to, memo),
            (Node::Cast(p), Node::Cast(q)) => renamed(x, *p, *q, from, to, memo),
            (Node::Binary(oa, p1, p2), Node::Binary(ob, q1, q2)) => {
                oa == ob && renamed(x, *p1, *q1, from, to, memo) && renamed(x, *p2, *q2, from, to, memo)
            }
            (Node::Select(p1, p2, p3), Node::Select(q1, q2, q3)) => {
                renamed(x, *p1, *q1, from, to, memo)
                    && renamed(x, *p2, *q2, from, to, memo)
                    && renamed(x, *p3, *q3, from, to, memo)
            }
            (Node::Check { ok: p1, code: ca, value: p2 }, Node::Check { ok: q1, code: cb, value: q2 }) => {
                ca == cb && renamed(x, *p1, *q1, from, to, memo) && renamed(x, *p2, *q2, from, to, memo)
            }
            _ => false,
        };
    memo.insert((a, b), same);
    same
}

/// The alternatives `value` chooses among by selects whose conditions do not
/// depend on the variables in `mask` (the innermost), at most
/// [`UNSWITCH_DEPTH`] deep: 1 when it chooses none.
fn row_choices(x: &Exprs, value: E, mask: u64, depth: usize) -> usize {
    match x.node(value) {
        Node::Select(c, a, d) if depth < UNSWITCH_DEPTH && x.free(*c) & mask == 0 => {
            row_choices(x, *a, mask, depth + 1) + row_choices(x, *d, mask, depth + 1)
        }
        _ => 1,
    }
}
