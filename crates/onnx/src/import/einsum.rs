//! Einsum lowered to primitives: per operand pair, labels are classed as batch
//! (both operands and the result), contracted (both, not the result) or free
//! (one operand and the result); operands are transposed and reshaped to
//! `[B, M, K]·[B, K, N]`, multiplied by one batched matmul, and reshaped and
//! transposed to the result's labels. Labels only one operand uses and the result
//! drops are summed first. More than two operands are contracted left to right.

use ir::{ReduceOp, ValueId};
use sym::SymExpr;

use super::{Importer, R};

/// An operand with one label per dim.
struct Labeled {
    v: ValueId,
    labels: Vec<char>,
}

pub(crate) fn einsum(imp: &mut Importer, equation: &str, inputs: &[ValueId]) -> R<ValueId> {
    let eq: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l.to_string(), Some(r.to_string())),
        None => (eq.clone(), None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() != inputs.len() {
        return Err(format!("equation has {} operands, node has {} inputs", terms.len(), inputs.len()));
    }
    // Ellipsis dims get labels from a reserved range, the same for every operand
    // (aligned from the right, as broadcasting does).
    let ell_rank = terms
        .iter()
        .zip(inputs)
        .filter(|(t, _)| t.contains("..."))
        .map(|(t, v)| imp.rank(*v) + 3 - t.len())
        .max()
        .unwrap_or(0);
    let ell: Vec<char> = (0..ell_rank).map(|i| char::from_u32(0x100 + i as u32).unwrap_or('?')).collect();
    let mut ops = Vec::new();
    for (t, v) in terms.iter().zip(inputs) {
        let labels = expand(t, &ell, imp.rank(*v))?;
        if labels.len() != imp.rank(*v) {
            return Err(format!("operand '{t}' has {} labels for rank {}", labels.len(), imp.rank(*v)));
        }
        ops.push(diagonals(imp, Labeled { v: *v, labels })?);
    }
    let out: Vec<char> = match rhs {
        Some(r) => expand(&r, &ell, usize::MAX)?,
        None => {
            // Implicit form: ellipsis dims, then labels used exactly once, sorted.
            let all: Vec<char> = ops.iter().flat_map(|o| o.labels.iter().copied()).collect();
            let mut once: Vec<char> = all
                .iter()
                .copied()
                .filter(|c| !ell.contains(c) && all.iter().filter(|d| *d == c).count() == 1)
                .collect();
            once.sort_unstable();
            ell.iter().copied().filter(|c| all.contains(c)).chain(once).collect()
        }
    };
    let mut acc = ops.remove(0);
    while !ops.is_empty() {
        let next = ops.remove(0);
        // Keep the labels the result or a later operand still needs.
        let needed: Vec<char> = out.iter().chain(ops.iter().flat_map(|o| o.labels.iter())).copied().collect();
        acc = contract(imp, acc, next, &needed)?;
    }
    let acc = sum_unused(imp, acc, &out, &[])?;
    let perm: Vec<usize> = out
        .iter()
        .map(|c| {
            acc.labels
                .iter()
                .position(|d| d == c)
                .ok_or_else(|| format!("output label '{c}' is not in any operand"))
        })
        .collect::<R<_>>()?;
    imp.transpose(acc.v, perm)
}

/// A label repeated in one operand takes the diagonal: the two dims moved last,
/// flattened, and sliced with step `n + 1` (`x[..., i, i]`). Needs a constant `n`.
fn diagonals(imp: &mut Importer, mut x: Labeled) -> R<Labeled> {
    while let Some((p, q)) = (0..x.labels.len())
        .find_map(|p| (p + 1..x.labels.len()).find(|q| x.labels[*q] == x.labels[p]).map(|q| (p, q)))
    {
        let c = x.labels[p];
        let s = imp.shape(x.v);
        if !imp.env().equal(&s[p], &s[q]) {
            imp.env()
                .equate(&s[p], &s[q])
                .map_err(|e| format!("label '{c}' has extents {} and {}: {e}", s[p], s[q]))?;
        }
        let n =
            imp.env().simplify(&s[p]).as_const().ok_or_else(|| {
                format!("the diagonal of label '{c}' needs a constant extent, got {}", s[p])
            })?;
        let mut perm: Vec<usize> = (0..s.len()).filter(|i| *i != p && *i != q).collect();
        perm.extend([p, q]);
        let t = imp.transpose(x.v, perm.clone())?;
        let mut flat: Vec<SymExpr> = perm[..perm.len() - 2].iter().map(|i| s[*i].clone()).collect();
        flat.push(SymExpr::constant(n * n));
        let axis = flat.len() - 1;
        let t = imp.reshape(t, flat.clone())?;
        flat[axis] = SymExpr::constant(n);
        let ty = ir::TensorType::new(imp.ty(t).dtype, flat);
        let axes = vec![ir::SliceAxis { axis, start: SymExpr::constant(0), step: n + 1 }];
        let v = imp.emit(ir::Op::Slice { axes }, vec![t], Some(ty))?;
        let mut labels: Vec<char> = perm[..perm.len() - 2].iter().map(|i| x.labels[*i]).collect();
        labels.push(c);
        x = Labeled { v, labels };
    }
    Ok(x)
}

fn expand(term: &str, ell: &[char], rank: usize) -> R<Vec<char>> {
    match term.split_once("...") {
        Some((a, b)) => {
            let n = if rank == usize::MAX {
                ell.len()
            } else {
                rank.checked_sub(a.len() + b.len()).ok_or("too many labels")?
            };
            Ok(a.chars().chain(ell[ell.len() - n..].iter().copied()).chain(b.chars()).collect())
        }
        None => {
            if let Some(c) = term.chars().find(|c| !c.is_ascii_alphabetic()) {
                return Err(format!("invalid label '{c}' in einsum term '{term}'"));
            }
            Ok(term.chars().collect())
        }
    }
}

/// Sum the labels of `x` that neither `keep` nor `other` mention.
fn sum_unused(imp: &mut Importer, x: Labeled, keep: &[char], other: &[char]) -> R<Labeled> {
    let axes: Vec<usize> = (0..x.labels.len())
        .filter(|i| !keep.contains(&x.labels[*i]) && !other.contains(&x.labels[*i]))
        .collect();
    if axes.is_empty() {
        return Ok(x);
    }
    let v = imp.reduce(ReduceOp::Sum, x.v, axes.clone(), false)?;
    let labels = x.labels.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, c)| *c).collect();
    Ok(Labeled { v, labels })
}

fn contract(imp: &mut Importer, a: Labeled, b: Labeled, needed: &[char]) -> R<Labeled> {
    let a = sum_unused(imp, a, needed, &b.labels)?;
    let b = sum_unused(imp, b, needed, &a.labels)?;
    let in_b = |c: &char| b.labels.contains(c);
    let batch: Vec<char> = a.labels.iter().copied().filter(|c| in_b(c) && needed.contains(c)).collect();
    let contracted: Vec<char> = a.labels.iter().copied().filter(|c| in_b(c) && !needed.contains(c)).collect();
    let a_free: Vec<char> = a.labels.iter().copied().filter(|c| !in_b(c)).collect();
    let b_free: Vec<char> = b.labels.iter().copied().filter(|c| !a.labels.contains(c)).collect();
    let dims = |x: &Labeled, imp: &Importer, ls: &[char]| -> Vec<SymExpr> {
        ls.iter().map(|c| imp.shape(x.v)[x.labels.iter().position(|d| d == c).unwrap_or(0)].clone()).collect()
    };
    for c in batch.iter().chain(&contracted) {
        let (da, db) = (dims(&a, imp, &[*c])[0].clone(), dims(&b, imp, &[*c])[0].clone());
        if !imp.env().equal(&da, &db) {
            imp.env().equate(&da, &db).map_err(|e| format!("label '{c}' has extents {da} and {db}: {e}"))?;
        }
    }
    let prod = |v: &[SymExpr]| {
        v.iter().try_fold(SymExpr::constant(1), |x, d| x.try_mul(d)).map_err(|e| e.to_string())
    };
    let order = |x: &Labeled, groups: &[&[char]]| -> Vec<usize> {
        groups
            .iter()
            .flat_map(|g| g.iter())
            .map(|c| x.labels.iter().position(|d| d == c).unwrap_or(0))
            .collect()
    };
    let (bd, md, kd, nd) =
        (dims(&a, imp, &batch), dims(&a, imp, &a_free), dims(&a, imp, &contracted), dims(&b, imp, &b_free));
    let at = imp.transpose(a.v, order(&a, &[&batch, &a_free, &contracted]))?;
    let at = imp.reshape(at, vec![prod(&bd)?, prod(&md)?, prod(&kd)?])?;
    let bt = imp.transpose(b.v, order(&b, &[&batch, &contracted, &b_free]))?;
    let bt = imp.reshape(bt, vec![prod(&bd)?, prod(&kd)?, prod(&nd)?])?;
    let y = imp.emit(ir::Op::MATMUL, vec![at, bt], None)?;
    let shape: Vec<SymExpr> = bd.into_iter().chain(md).chain(nd).collect();
    let y = imp.reshape(y, shape)?;
    Ok(Labeled { v: y, labels: batch.into_iter().chain(a_free).chain(b_free).collect() })
}
