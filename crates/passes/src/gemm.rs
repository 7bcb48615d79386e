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
        if n.op != Op::MatMul || uses[n.output.index()] == 0 {
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
        Op::MatMul,
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
