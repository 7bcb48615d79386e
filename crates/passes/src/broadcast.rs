//! Broadcast elimination (BladeDISC §3.2): a broadcast whose input and output
//! shapes the `ShapeEnv` proves equal is a no-op and goes away. One it cannot
//! prove stays, with the condition under which it is a no-op recorded (every
//! stretched dim equal to 1), for guarded kernel versions (BladeDISC §5.2.1).

use ir::{Graph, Op};
use sym::SymExpr;

use crate::pattern::can_replace;
use crate::{Pass, PassError};

pub struct EliminateBroadcasts;

impl Pass for EliminateBroadcasts {
    fn name(&self) -> &'static str {
        "eliminate-broadcasts"
    }
    fn run(&self, g: &mut Graph) -> Result<usize, PassError> {
        let mut n = 0;
        let mut uses = g.use_counts();
        for i in 0..g.nodes.len() {
            let node = &g.nodes[i];
            if node.op != Op::Broadcast || uses[node.output.index()] == 0 {
                continue;
            }
            let (x, out) = (node.inputs[0], node.output);
            let (a, b) = (g.ty(x), g.ty(out));
            let equal = a.rank() == b.rank() && a.shape.iter().zip(&b.shape).all(|(p, q)| g.env.equal(p, q));
            if equal && can_replace(g, out, x) {
                g.replace_uses(out, x);
                uses[x.index()] += std::mem::take(&mut uses[out.index()]);
                n += 1;
            }
        }
        Ok(n)
    }
}

/// A broadcast that stays: it is a no-op exactly when every `dims` entry is 1.
#[derive(Clone, Debug, PartialEq)]
pub struct BroadcastGuard {
    /// The broadcast's output value.
    pub value: String,
    /// Output dims stretched from an input dim of 1 that the env cannot prove > 1.
    pub dims: Vec<SymExpr>,
}

/// The no-op conditions of the broadcasts in `g` that could be no-ops at run
/// time (broadcasts that always stretch a dim > 1 are real and not listed).
pub(crate) fn guards(g: &Graph) -> Vec<BroadcastGuard> {
    let one = SymExpr::constant(1);
    let mut out = Vec::new();
    for node in &g.nodes {
        if node.op != Op::Broadcast {
            continue;
        }
        let (a, b) = (g.ty(node.inputs[0]), g.ty(node.output));
        let stretched: Vec<&SymExpr> =
            a.shape.iter().zip(&b.shape).filter(|(p, q)| !g.env.equal(p, q)).map(|(_, q)| q).collect();
        if stretched.iter().all(|q| !g.env.known_lt(&one, q)) && !stretched.is_empty() {
            out.push(BroadcastGuard {
                value: g.name(node.output).to_string(),
                dims: stretched.into_iter().cloned().collect(),
            });
        }
    }
    out
}
