//! Multi-versioning of loop programs (BladeDISC §5.2.1): a program whose load
//! addresses depend on a condition of run-time dims alone (a broadcast whose
//! dim may or may not be 1: index `select(d == 1, 0, i)`) is compiled once per
//! value of those conditions. The function checks them once per call and runs
//! the version made for them: there the index is plain `i` (a contiguous vector
//! load) or `0` (one scalar load, splat), never a per-lane gather.

use plan::Store;
use plan::{Exprs, Node, E};

/// The most guards a program is versioned on (2^n versions of its nest).
pub const MAX_GUARDS: usize = 3;

/// The guards of a program: boolean conditions of dims and constants only
/// that choose between index expressions along `inner`, the vectorized
/// variable, in the addresses of its loads. In order of first appearance, at
/// most [`MAX_GUARDS`].
pub fn guards(x: &Exprs, stores: &[Store], inner: Option<u32>) -> Vec<E> {
    let Some(inner) = inner else { return Vec::new() };
    let lane = 1u64 << inner;
    let mut found = Vec::new();
    // Each node once as a value and once inside an address.
    let mut seen = vec![[false; 2]; x.len()];
    let mut stack: Vec<(E, bool)> = stores.iter().rev().map(|s| (s.value, false)).collect();
    while let Some((e, in_index)) = stack.pop() {
        if std::mem::replace(&mut seen[e.index()][in_index as usize], true) {
            continue;
        }
        if x.free(e) & lane == 0 && !in_index {
            // Nothing below varies along the lanes: loads there are uniform.
            continue;
        }
        match x.node(e) {
            Node::Load { index, guard, .. } => {
                stack.extend(index.iter().rev().map(|i| (*i, true)));
                stack.extend(guard.iter().map(|g| (*g, false)));
            }
            Node::Select(c, a, b) if in_index => {
                let uniform = x.free(*c) == 0 && !matches!(x.node(*c), Node::Const(_));
                if uniform && (x.free(*a) | x.free(*b)) & lane != 0 && !found.contains(c) {
                    found.push(*c);
                }
                stack.extend([(*c, false), (*a, true), (*b, true)]);
            }
            n => stack.extend(n.children().into_iter().rev().map(|c| (c, in_index))),
        }
    }
    found.truncate(MAX_GUARDS);
    found
}

/// Whether `body` reads memory contiguously along variable `var`: a load whose
/// last index steps by one with it.
pub fn loads_along(x: &Exprs, body: E, var: u32) -> bool {
    let mut seen = vec![false; x.len()];
    let mut stack = vec![body];
    while let Some(e) = stack.pop() {
        if std::mem::replace(&mut seen[e.index()], true) || x.free(e) & (1u64 << var) == 0 {
            continue;
        }
        if let Node::Load { index, .. } = x.node(e) {
            if index.last().is_some_and(|i| coef(x, *i, var) == Some(1)) {
                return true;
            }
        }
        stack.extend(x.node(e).children());
    }
    false
}

/// The coefficient of `var` in an index expression, when affine in it.
pub fn coef(x: &Exprs, e: E, var: u32) -> Option<i64> {
    coef_with(x, e, var, &|_| None)
}

/// [`coef`] in one version of a program: `fixed(c)` is the value of guard `c`
/// there (a `select` on it is its side), `None` for a condition left open.
pub fn coef_with(x: &Exprs, e: E, var: u32, fixed: &dyn Fn(E) -> Option<bool>) -> Option<i64> {
    use ir::BinaryOp;
    if x.free(e) & (1u64 << var) == 0 {
        return Some(0);
    }
    let c = |e: E| coef_with(x, e, var, fixed);
    match x.node(e) {
        Node::Var(v) if *v == var => Some(1),
        Node::Select(g, a, b) => c(if fixed(*g)? { *a } else { *b }),
        Node::Binary(BinaryOp::Add, a, b) => Some(c(*a)? + c(*b)?),
        Node::Binary(BinaryOp::Sub, a, b) => Some(c(*a)? - c(*b)?),
        Node::Binary(BinaryOp::Mul, a, b) => match (x.as_int(*a), x.as_int(*b)) {
            (Some(k), _) => Some(k * c(*b)?),
            (_, Some(k)) => Some(k * c(*a)?),
            _ => None,
        },
        _ => None,
    }
}
