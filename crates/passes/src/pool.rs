//! A max pool of a positive scaling takes the scaling after it:
//!
//! ```text
//! max_pool(x · s)  →  max_pool(x) · s        (s a scalar, 0 < s < ∞)
//! ```
//!
//! Multiplying by a positive float is monotone (rounding included), so the
//! largest product is the product of the largest value, exactly; the pool's
//! padding (not a value: `-∞`) and NaNs come out the same. A statically
//! quantized model's pool of a dequantized activation (`cast<f32>(q) · s`,
//! after a ReLU) then reads the codes themselves, which the lowering stores a
//! byte each, and its product above may store codes too.

use ir::{BinaryOp, DType, Graph, Op, PoolKind, ValueId};

use crate::integer::Inserter;
use crate::pattern::{uniform, Producers};
use crate::{Pass, PassError};

pub struct ScaleOutOfMaxPool;

impl Pass for ScaleOutOfMaxPool {
    fn name(&self) -> &'static str {
        "scale-out-of-max-pool"
    }
    fn run(&self, g: &mut Graph) -> Result<usize, PassError> {
        let mut done = 0;
        // One pool at a time: a rewrite inserts nodes and shifts indices.
        while let Some((at, x, s)) = next(g) {
            let node = g.nodes[at].clone();
            let ty = g.ty(node.output).clone();
            let mut ins = Inserter { at, hint: g.name(node.output).to_string() };
            let pooled = ins.add(g, node.op.clone(), vec![x], "unscaled", ty.clone());
            let scale = ins.splat(g, ir::Elems::F32(vec![s]), &ty, "scale")?;
            let pool = &mut g.nodes[ins.at];
            pool.op = Op::Binary(BinaryOp::Mul);
            pool.inputs = vec![pooled, scale];
            done += 1;
        }
        Ok(done)
    }
}

/// The first max pool of f32 `x · s` (either operand order), with `x` and `s`.
fn next(g: &Graph) -> Option<(usize, ValueId, f32)> {
    let p = Producers::of(g);
    g.nodes.iter().enumerate().find_map(|(i, n)| {
        let Op::Pool(a) = &n.op else { return None };
        if !matches!(a.kind, PoolKind::Max) || g.ty(n.output).dtype != DType::F32 {
            return None;
        }
        let m = p.node(g, n.inputs[0])?;
        let Op::Binary(BinaryOp::Mul) = m.op else { return None };
        let positive = |v: ValueId| {
            let s = uniform(g, &p, v)? as f32;
            (s > 0.0 && s.is_finite()).then_some(s)
        };
        let (a, b) = (m.inputs[0], m.inputs[1]);
        let (x, s) = match (positive(b), positive(a)) {
            (Some(s), _) => (a, s),
            (None, Some(s)) => (b, s),
            _ => return None,
        };
        (g.ty(x).dtype == DType::F32 && g.ty(x).shape == g.ty(n.inputs[0]).shape).then_some((i, x, s))
    })
}
