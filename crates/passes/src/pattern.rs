//! Questions rewrites ask about the graph's structure.

use std::sync::Arc;

use ir::{ConstData, Graph, Op, ValueId};

/// Producer node index of every value (`None` for graph inputs).
pub(crate) struct Producers(Vec<Option<usize>>);

impl Producers {
    pub fn of(g: &Graph) -> Producers {
        Producers(g.producers())
    }
    pub fn op<'g>(&self, g: &'g Graph, v: ValueId) -> Option<&'g Op> {
        self.0.get(v.index()).copied().flatten().map(|i| &g.nodes[i].op)
    }
    /// The index of `v`'s producer in `g.nodes`.
    pub fn index(&self, _g: &Graph, v: ValueId) -> Option<usize> {
        self.0.get(v.index()).copied().flatten()
    }
    pub fn node<'g>(&self, g: &'g Graph, v: ValueId) -> Option<&'g ir::Node> {
        self.0.get(v.index()).copied().flatten().map(|i| &g.nodes[i])
    }
}

/// The data of `v` when it is produced by a constant node.
pub(crate) fn constant(g: &Graph, p: &Producers, v: ValueId) -> Option<Arc<ConstData>> {
    match p.op(g, v)? {
        Op::Constant(c) => Some(c.clone()),
        _ => None,
    }
}

/// `Some(c)` when every element of `v` is `c`: a constant whose elements are all
/// equal, possibly seen through broadcasts and reshapes (how scalars are written).
pub(crate) fn uniform(g: &Graph, p: &Producers, v: ValueId) -> Option<f64> {
    let mut v = v;
    loop {
        let node = p.node(g, v)?;
        match &node.op {
            Op::Broadcast | Op::Reshape => v = node.inputs[0],
            Op::Constant(c) => {
                // Large tensors are weights, not written scalars: don't scan them.
                if c.numel() == 0 || c.numel() > 4096 {
                    return None;
                }
                let vals = c.to_tensor().to_f64_vec();
                let first = vals[0];
                return vals.iter().all(|x| x.to_bits() == first.to_bits()).then_some(first);
            }
            _ => return None,
        }
    }
}

/// Whether uses of `old` can move to `new` without a copy node: a graph output
/// replaced by an input or another output would need one (and a later pass
/// would remove it again).
pub(crate) fn can_replace(g: &Graph, old: ValueId, new: ValueId) -> bool {
    old != new && !(g.outputs.contains(&old) && (g.inputs.contains(&new) || g.outputs.contains(&new)))
}
