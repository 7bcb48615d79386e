//! GEMM merging (BladeDISC §4.3), shared operand: contractions `x·W₁, x·W₂, …`
//! with constant weights become one contraction `x·[W₁ W₂ …]` on the
//! concatenated weights (BERT's Q, K, V projections → one), followed by slices
//! that the contraction's epilogue absorbs. The merged node goes where the first
//! of the originals was, so every consumer still follows it: no cycle can appear.

use std::collections::BTreeMap;
use std::sync::Arc;

use ir::{ConstData, Graph, Op, SliceAxis, TensorType, ValueId};
use sym::SymExpr;

use crate::pattern::{can_replace, constant, Producers};
use crate::{Pass, PassError};

pub struct MergeSharedOperand;

impl Pass for MergeSharedOperand {
    fn name(&self) -> &'static str {
        "merge-gemms"
    }
    fn run(&self, g: &mut Graph) -> Result<usize, PassError> {
        let mut merged = 0;
        // One family at a time: a merge shifts node indices.
        while let Some(family) = next_family(g) {
            merged += family.len() - 1;
            merge(g, &family).map_err(|msg| PassError::Failed { pass: "merge-gemms", msg })?;
        }
        Ok(merged)
    }
}

/// Matmuls (node indices, in order) sharing a rank-2 operand `x` with constant
/// rank-2 weights of one dtype and one contraction extent.
fn next_family(g: &Graph) -> Option<Vec<usize>> {
    let p = Producers::of(g);
    let uses = g.use_counts();
    let mut by_x: BTreeMap<ValueId, Vec<usize>> = BTreeMap::new();
    for (i, n) in g.nodes.iter().enumerate() {
        if n.op != Op::MATMUL || uses[n.output.index()] == 0 {
            continue;
        }
        let (x, w) = (n.inputs[0], n.inputs[1]);
        if g.ty(x).rank() != 2 || g.ty(w).rank() != 2 || constant(g, &p, w).is_none() {
            continue;
        }
        by_x.entry(x).or_default().push(i);
    }
    by_x.into_values().find_map(|nodes| {
        let w0 = g.ty(g.nodes[nodes[0]].inputs[1]);
        let same: Vec<usize> = nodes
            .into_iter()
            .filter(|i| {
                let w = g.ty(g.nodes[*i].inputs[1]);
                w.dtype == w0.dtype && w.shape[0] == w0.shape[0] && w.const_shape().is_some()
            })
            .collect();
        (same.len() >= 2).then_some(same)
    })
}

fn merge(g: &mut Graph, family: &[usize]) -> Result<(), String> {
    let p = Producers::of(g);
    let x = g.nodes[family[0]].inputs[0];
    let weights: Vec<Arc<ConstData>> = family
        .iter()
        .map(|i| constant(g, &p, g.nodes[*i].inputs[1]).ok_or("weight is not a constant"))
        .collect::<Result<_, _>>()?;
    let cat = Arc::new(bytes_concat::concat_columns(&weights)?);
    let outs: Vec<ValueId> = family.iter().map(|i| g.nodes[*i].output).collect();
    let hint = format!("{}.merged", g.name(outs[0]));
    let at = family[0];
    let wv = g.insert_node(at, Op::Constant(cat.clone()), vec![], &format!("{hint}.weight"), cat.ty());
    let rows = g.ty(x).shape[0].clone();
    let n_total = SymExpr::constant(cat.shape[1] as i64);
    let dtype = g.ty(x).dtype;
    let y = g.insert_node(
        at + 1,
        Op::MATMUL,
        vec![x, wv],
        &hint,
        TensorType::new(dtype, vec![rows.clone(), n_total]),
    );
    let mut offset = 0i64;
    for (j, (out, w)) in outs.iter().zip(&weights).enumerate() {
        let n = w.shape[1] as i64;
        let ty = TensorType::new(dtype, vec![rows.clone(), SymExpr::constant(n)]);
        let axes = vec![SliceAxis { axis: 1, start: SymExpr::constant(offset), step: 1 }];
        let name = format!("{}.part", g.name(*out));
        let part = g.insert_node(at + 2 + j, Op::Slice { axes }, vec![y], &name, ty);
        if !can_replace(g, *out, part) {
            return Err(format!("cannot redirect the uses of '{}'", g.name(*out)));
        }
        g.replace_uses(*out, part);
        offset += n;
    }
    Ok(())
}

/// Concatenation of constant matrices along their columns.
mod bytes_concat {
    use std::sync::Arc;

    use ir::ConstData;

    pub(super) fn concat_columns(ws: &[Arc<ConstData>]) -> Result<ConstData, String> {
        let merged = concat_plain(ws)?;
        // Weights quantized alike keep their codes, concatenated the same way.
        match merged_codes(ws) {
            Some(codes) => merged.with_codes(codes).map_err(|e| e.to_string()),
            None => Ok(merged),
        }
    }

    /// The weight codes of `ws` side by side, when every one has codes of the
    /// same width, groups and types.
    fn merged_codes(ws: &[Arc<ConstData>]) -> Option<ir::WeightCodes> {
        let codes: Vec<&ir::WeightCodes> = ws.iter().map(|w| w.weight_codes()).collect::<Option<_>>()?;
        let first = codes.first()?;
        let alike = |c: &&ir::WeightCodes| {
            (c.bits, c.group, c.codes.dtype, c.zero_points.is_some())
                == (first.bits, first.group, first.codes.dtype, first.zero_points.is_some())
        };
        if !codes.iter().all(alike) {
            return None;
        }
        let side = |parts: Vec<Arc<ConstData>>| concat_plain(&parts).ok();
        let all_codes = side(codes.iter().map(|c| Arc::new(c.codes.clone())).collect())?;
        let zero_points = match first.zero_points {
            Some(_) => {
                Some(side(codes.iter().filter_map(|c| c.zero_points.clone().map(Arc::new)).collect())?)
            }
            None => None,
        };
        let groups = first.scales.len() / codes[0].codes.shape[1].max(1);
        let mut scales = Vec::with_capacity(codes.iter().map(|c| c.scales.len()).sum());
        for g in 0..groups {
            for c in &codes {
                let n = c.codes.shape[1];
                scales.extend_from_slice(c.scales.get(g * n..(g + 1) * n)?);
            }
        }
        Some(ir::WeightCodes { codes: all_codes, bits: first.bits, group: first.group, scales, zero_points })
    }

    /// Rows of 2-D constants side by side, bytes only.
    fn concat_plain(ws: &[Arc<ConstData>]) -> Result<ConstData, String> {
        let first = ws.first().ok_or("no weights")?;
        let (rows, size) = (first.shape[0], first.dtype.size());
        let cols: usize = ws.iter().map(|w| w.shape[1]).sum();
        let mut out = Vec::with_capacity(rows * cols * size);
        for r in 0..rows {
            for w in ws {
                let row = w.shape[1] * size;
                out.extend_from_slice(&w.bytes()[r * row..(r + 1) * row]);
            }
        }
        ConstData::from_bytes(first.dtype, vec![rows, cols], out.into()).map_err(|e| e.to_string())
    }
}

/// GEMM batching (BladeDISC §4.3): independent 2-D contractions `xᵢ·Wᵢ` whose
/// shapes the `ShapeEnv` proves equal, with constant weights, become one batched
/// contraction `stack(xᵢ)·stack(Wᵢ)` and slices. Not in the standard pipeline:
/// stacking the activations is a copy, worth it where launches cost more than
/// that (GPUs), not on a CPU.
pub struct BatchEqualShapes;

impl Pass for BatchEqualShapes {
    fn name(&self) -> &'static str {
        "batch-gemms"
    }
    fn run(&self, g: &mut Graph) -> Result<usize, PassError> {
        let mut merged = 0;
        while let Some((a, b)) = next_pair(g) {
            batch_pair(g, a, b).map_err(|msg| PassError::Failed { pass: "batch-gemms", msg })?;
            merged += 1;
        }
        Ok(merged)
    }
}

/// Two live matmuls (a < b) with rank-2 operands of equal shapes, constant
/// weights, and no path from `a` to `b` (independent).
fn next_pair(g: &Graph) -> Option<(usize, usize)> {
    let p = Producers::of(g);
    let uses = g.use_counts();
    let cands: Vec<usize> = (0..g.nodes.len())
        .filter(|i| {
            let n = &g.nodes[*i];
            n.op == Op::MATMUL
                && uses[n.output.index()] > 0
                && g.ty(n.inputs[0]).rank() == 2
                && g.ty(n.inputs[1]).const_shape().is_some_and(|s| s.len() == 2)
                && constant(g, &p, n.inputs[1]).is_some()
        })
        .collect();
    let same = |x: ValueId, y: ValueId| {
        let (a, b) = (g.ty(x), g.ty(y));
        a.dtype == b.dtype
            && a.rank() == b.rank()
            && a.shape.iter().zip(&b.shape).all(|(p, q)| g.env.equal(p, q))
    };
    let producers = g.producers();
    for (k, &a) in cands.iter().enumerate() {
        for &b in &cands[k + 1..] {
            let (na, nb) = (&g.nodes[a], &g.nodes[b]);
            if na.inputs[0] != nb.inputs[0]
                && same(na.inputs[0], nb.inputs[0])
                && same(na.inputs[1], nb.inputs[1])
                && !depends_on(g, &producers, b, na.output)
                && insertion_point(g, a, b).is_some()
            {
                return Some((a, b));
            }
        }
    }
    None
}

/// Where the batched contraction can go: after both activations are computed
/// and before any consumer of either output (`None` when no such place exists).
fn insertion_point(g: &Graph, a: usize, b: usize) -> Option<usize> {
    let p = g.producers();
    let after = [a, b].iter().filter_map(|i| p[g.nodes[*i].inputs[0].index()]).max().map_or(0, |i| i + 1);
    let outs = [g.nodes[a].output, g.nodes[b].output];
    let first_use =
        g.nodes.iter().position(|n| n.inputs.iter().any(|v| outs.contains(v))).unwrap_or(g.nodes.len());
    (after <= first_use).then_some(after)
}

/// Whether node `n` reads `v`, directly or through other nodes.
fn depends_on(g: &Graph, p: &[Option<usize>], n: usize, v: ValueId) -> bool {
    let mut stack = vec![n];
    let mut seen = vec![false; g.nodes.len()];
    while let Some(i) = stack.pop() {
        for x in &g.nodes[i].inputs {
            if *x == v {
                return true;
            }
            if let Some(j) = p[x.index()] {
                if !std::mem::replace(&mut seen[j], true) {
                    stack.push(j);
                }
            }
        }
    }
    false
}

fn batch_pair(g: &mut Graph, a: usize, b: usize) -> Result<(), String> {
    let p = Producers::of(g);
    let (na, nb) = (g.nodes[a].clone(), g.nodes[b].clone());
    let (wa, wb) =
        (constant(g, &p, na.inputs[1]).ok_or("weight")?, constant(g, &p, nb.inputs[1]).ok_or("weight")?);
    let mut bytes = wa.bytes().to_vec();
    bytes.extend_from_slice(wb.bytes());
    let mut wshape = vec![2];
    wshape.extend_from_slice(&wa.shape);
    let w = Arc::new(ConstData::from_bytes(wa.dtype, wshape, bytes.into()).map_err(|e| e.to_string())?);
    let (xs, dtype) = (g.ty(na.inputs[0]).shape.clone(), g.ty(na.inputs[0]).dtype);
    let n = SymExpr::constant(wa.shape[1] as i64);
    let hint = format!("{}.batched", g.name(na.output));
    let at = insertion_point(g, a, b).ok_or("no place for the batched contraction")?;
    let mut one = vec![SymExpr::constant(1)];
    one.extend(xs.iter().cloned());
    let xa = g.insert_node(
        at,
        Op::Reshape,
        vec![na.inputs[0]],
        &format!("{hint}.a"),
        TensorType::new(dtype, one.clone()),
    );
    let xb = g.insert_node(
        at + 1,
        Op::Reshape,
        vec![nb.inputs[0]],
        &format!("{hint}.b"),
        TensorType::new(dtype, one),
    );
    let mut stacked = vec![SymExpr::constant(2)];
    stacked.extend(xs.iter().cloned());
    let x = g.insert_node(
        at + 2,
        Op::Concat { axis: 0 },
        vec![xa, xb],
        &format!("{hint}.x"),
        TensorType::new(dtype, stacked),
    );
    let wv = g.insert_node(at + 3, Op::Constant(w.clone()), vec![], &format!("{hint}.weight"), w.ty());
    let y_ty = TensorType::new(dtype, vec![SymExpr::constant(2), xs[0].clone(), n.clone()]);
    let y = g.insert_node(at + 4, Op::MATMUL, vec![x, wv], &hint, y_ty);
    for (k, out) in [na.output, nb.output].into_iter().enumerate() {
        let axes = vec![SliceAxis { axis: 0, start: SymExpr::constant(k as i64), step: 1 }];
        let part_ty = TensorType::new(dtype, vec![SymExpr::constant(1), xs[0].clone(), n.clone()]);
        let part = g.insert_node(
            at + 5 + 2 * k,
            Op::Slice { axes },
            vec![y],
            &format!("{}.part", g.name(out)),
            part_ty,
        );
        let flat = g.insert_node(
            at + 6 + 2 * k,
            Op::Reshape,
            vec![part],
            &format!("{}.flat", g.name(out)),
            g.ty(out).clone(),
        );
        if !can_replace(g, out, flat) {
            return Err(format!("cannot redirect the uses of '{}'", g.name(out)));
        }
        g.replace_uses(out, flat);
    }
    Ok(())
}
