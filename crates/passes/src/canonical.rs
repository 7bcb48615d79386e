//! Canonicalization: dead code, shapes rewritten with the `ShapeEnv`, constant
//! folding, algebraic identities, common subexpressions. Run together to a
//! fixpoint (`Pipeline::standard`), each pass exposing work for the others.

use std::collections::HashMap;
use std::sync::Arc;

use ir::{BinaryOp, ConstData, DType, Graph, Op, TensorType, ValueId};
use sym::Bindings;

use crate::pattern::{can_replace, constant, uniform, Producers};
use crate::{Pass, PassError};

/// Dead-code elimination: nodes no output depends on.
pub struct Dce;

impl Pass for Dce {
    fn name(&self) -> &'static str {
        "dce"
    }
    fn run(&self, g: &mut Graph) -> Result<usize, PassError> {
        Ok(g.remove_dead_nodes())
    }
}

/// Every dim and symbolic attribute rewritten with the current `ShapeEnv` facts.
pub struct SimplifyShapes;

impl Pass for SimplifyShapes {
    fn name(&self) -> &'static str {
        "simplify-shapes"
    }
    fn run(&self, g: &mut Graph) -> Result<usize, PassError> {
        let before: Vec<TensorType> = g.values().iter().map(|v| v.ty.clone()).collect();
        g.simplify_shapes();
        Ok(g.values().iter().zip(&before).filter(|(v, b)| v.ty != **b).count())
    }
}

/// Constant folding: a node whose inputs are all constants, and whose output has a
/// constant shape, is evaluated once by the reference interpreter (so folding
/// computes exactly what the oracle computes) and becomes a constant.
pub struct FoldConstants {
    /// Results larger than this many elements are left to run time.
    pub max_elements: usize,
}

/// The largest cast of a constant [`FoldConstants`] folds (a 50,257 × 768
/// vocabulary is 38.6M elements).
const MAX_CAST_ELEMENTS: usize = 1 << 27;

impl Default for FoldConstants {
    fn default() -> Self {
        // Large enough for pre-transposed or pre-scaled weights (BERT's FFN: 2.4M).
        FoldConstants { max_elements: 1 << 24 }
    }
}

impl Pass for FoldConstants {
    fn name(&self) -> &'static str {
        "fold-constants"
    }
    fn run(&self, g: &mut Graph) -> Result<usize, PassError> {
        let mut folded = 0;
        let bindings = Bindings::default();
        // Folding rewrites nodes in place: the producers stay where they are.
        let p = Producers::of(g);
        // A constant a fold leaves unread gives its data up at once (a model's
        // weights are folded one after another: each intermediate copy goes
        // before the next is made), its node removed when the sweep ends.
        let mut uses = g.use_counts();
        let mut dropped = false;
        for i in 0..g.nodes.len() {
            let node = &g.nodes[i];
            if matches!(node.op, Op::Constant(_)) {
                continue;
            }
            let ty = g.ty(node.output).clone();
            let Some(shape) = ty.const_shape() else { continue };
            // A cast of a constant is the weight itself in another type (an int8
            // LM head widened for its product): folded whatever its size, within reason.
            let max = match node.op {
                Op::Cast => self.max_elements.max(MAX_CAST_ELEMENTS),
                _ => self.max_elements,
            };
            if shape.iter().map(|d| *d as usize).product::<usize>() > max {
                continue;
            }
            let Some(datas) = node.inputs.iter().map(|v| constant(g, &p, *v)).collect::<Option<Vec<_>>>()
            else {
                continue;
            };
            let data = match (&node.op, datas.as_slice()) {
                (op, [c, ..]) if keeps(op, &datas, ty.dtype) => {
                    c.reshaped(shape.iter().map(|d| *d as usize).collect()).ok()
                }
                (Op::Cast, [c]) => widened(c, ty.dtype),
                _ => None,
            };
            let data = match data {
                Some(d) => d,
                None => {
                    let ins: Vec<ir::Tensor> = datas.iter().map(|c| c.to_tensor()).collect();
                    let refs: Vec<&ir::Tensor> = ins.iter().collect();
                    // An op the interpreter cannot evaluate (or that fails on this data,
                    // like an out-of-range gather) stays as it is: the error belongs to run time.
                    let Ok(t) = reference::eval_op(&node.op, &refs, &ty, &g.env, &bindings) else { continue };
                    ConstData::from_tensor(&t)
                }
            };
            let node = &mut g.nodes[i];
            node.op = Op::Constant(Arc::new(data));
            let inputs = std::mem::take(&mut node.inputs);
            drop(datas);
            for v in inputs {
                uses[v.index()] -= 1;
                let Some(j) = p.index(g, v) else { continue };
                if uses[v.index()] == 0 && !g.outputs.contains(&v) {
                    if let Op::Constant(c) = &g.nodes[j].op {
                        // Nothing reads it: its data may go (the node is dead).
                        let empty = ConstData::from_bytes(c.dtype, vec![0], bytes::Bytes::new());
                        if let Ok(empty) = empty {
                            g.nodes[j].op = Op::Constant(Arc::new(empty));
                            dropped = true;
                        }
                    }
                }
            }
            folded += 1;
        }
        if dropped {
            g.remove_dead_nodes();
        }
        Ok(folded)
    }
}

/// Whether `op` of constants `datas` (to `dtype`) gives the first one's
/// values as they are, so that its fold shares that data instead of copying
/// it: a reshape, a cast to its own type, an integer `x ± 0` or `x · 1` (a
/// weight's zero point of 0) of an operand the result's size.
fn keeps(op: &Op, datas: &[Arc<ConstData>], dtype: DType) -> bool {
    let integer = matches!(dtype, DType::I8 | DType::U8 | DType::I32 | DType::I64);
    let all = |c: &ConstData, v: u8| {
        let size = c.dtype.size();
        c.bytes().chunks_exact(size).all(|w| w[0] == v && w[1..].iter().all(|b| *b == 0))
    };
    match (op, datas) {
        (Op::Reshape, [_]) => true,
        (Op::Cast, [c]) => c.dtype == dtype,
        (Op::Binary(b), [x, y]) if integer && x.dtype == dtype && x.numel() >= y.numel() => match b {
            BinaryOp::Add | BinaryOp::Sub => all(y, 0),
            BinaryOp::Mul => all(y, 1),
            _ => false,
        },
        _ => false,
    }
}

/// `c` cast to `to` where that widens integers (i8, u8 or i32 to i32, i64 or
/// f32; an i32 beyond 2^24 rounds to nearest even, as the interpreter's cast
/// rounds): a weight's cast computed from its bytes, without the interpreter's
/// 64-bit copies of it.
fn widened(c: &ConstData, to: DType) -> Option<ConstData> {
    fn each(c: &ConstData, f: &mut dyn FnMut(i32)) -> Option<()> {
        let bytes = c.bytes();
        match c.dtype {
            DType::I8 => bytes.iter().for_each(|b| f(i32::from(*b as i8))),
            DType::U8 => bytes.iter().for_each(|b| f(i32::from(*b))),
            DType::I32 => bytes.chunks_exact(4).for_each(|w| f(i32::from_le_bytes([w[0], w[1], w[2], w[3]]))),
            _ => return None,
        }
        Some(())
    }
    let mut out: Vec<u8> = Vec::with_capacity(c.numel() * to.size());
    match to {
        DType::I32 => each(c, &mut |x| out.extend_from_slice(&x.to_le_bytes()))?,
        DType::I64 => each(c, &mut |x| out.extend_from_slice(&i64::from(x).to_le_bytes()))?,
        DType::F32 => each(c, &mut |x| out.extend_from_slice(&(x as f32).to_le_bytes()))?,
        _ => return None,
    }
    ConstData::from_bytes(to, c.shape.clone(), out.into()).ok()
}

/// Algebraic identities, each one line with the algebra it applies:
/// - `x + 0 = x - 0 = x * 1 = x / 1 = x` (the constant seen through broadcasts);
/// - `transpose(transpose(x, p), q) = transpose(x, p∘q)`, identity perm = `x`;
/// - `reshape(reshape(x)) = reshape(x)`; a reshape to the same shape is `x`;
/// - `broadcast(broadcast(x)) = broadcast(x)`; a broadcast to the same shape is `x`;
/// - `cast(x)` to `x`'s own dtype is `x`;
/// - a slice taking every element is `x`;
/// - `matmul(transpose(a, swap last two), b) = matmul[transpose_a](a, b)` (and for
///   `b`): a transposed operand is a layout the contraction reads directly.
pub struct SimplifyAlgebra;

impl Pass for SimplifyAlgebra {
    fn name(&self) -> &'static str {
        "simplify-algebra"
    }
    fn run(&self, g: &mut Graph) -> Result<usize, PassError> {
        let mut n = 0;
        // Rewrites change ops and inputs in place, never which node makes a value,
        // so the producers hold for the whole sweep; use counts are kept current.
        let p = Producers::of(g);
        let mut uses = g.use_counts();
        for i in 0..g.nodes.len() {
            let node = g.nodes[i].clone();
            // A node nothing reads is Dce's: rewriting it would change nothing.
            if uses[node.output.index()] == 0 {
                continue;
            }
            let out_ty = g.ty(node.output).clone();
            let same_as = |g: &Graph, v: ValueId| {
                let t = g.ty(v);
                t.dtype == out_ty.dtype
                    && t.rank() == out_ty.rank()
                    && t.shape.iter().zip(&out_ty.shape).all(|(a, b)| g.env.equal(a, b))
            };
            // `Some(v)`: the node computes `v` itself.
            let identity: Option<ValueId> = match &node.op {
                Op::Binary(b) => {
                    let (x, y) = (node.inputs[0], node.inputs[1]);
                    let (ux, uy) = (uniform(g, &p, x), uniform(g, &p, y));
                    match b {
                        BinaryOp::Add if uy == Some(0.0) => Some(x),
                        BinaryOp::Add if ux == Some(0.0) => Some(y),
                        BinaryOp::Sub if uy == Some(0.0) => Some(x),
                        BinaryOp::Mul if uy == Some(1.0) => Some(x),
                        BinaryOp::Mul if ux == Some(1.0) => Some(y),
                        BinaryOp::Div if uy == Some(1.0) => Some(x),
                        _ => None,
                    }
                }
                Op::Transpose { perm } if perm.iter().enumerate().all(|(i, p)| i == *p) => {
                    Some(node.inputs[0])
                }
                // (A broadcast to its own shape is EliminateBroadcasts' job.)
                Op::Reshape | Op::Cast if same_as(g, node.inputs[0]) => Some(node.inputs[0]),
                Op::Slice { axes }
                    if axes
                        .iter()
                        .all(|a| a.step == 1 && g.env.equal(&a.start, &sym::SymExpr::constant(0)))
                        && same_as(g, node.inputs[0]) =>
                {
                    Some(node.inputs[0])
                }
                _ => None,
            };
            if let Some(v) = identity.filter(|v| same_as(g, *v) && can_replace(g, node.output, *v)) {
                g.replace_uses(node.output, v);
                uses[v.index()] += std::mem::take(&mut uses[node.output.index()]);
                n += 1;
                continue;
            }
            // A last-two-axes transpose feeding a matmul becomes its layout flag.
            if let Op::MatMul { transpose_a, transpose_b } = node.op {
                let swapped = |v: ValueId| match p.op(g, v) {
                    Some(Op::Transpose { perm }) => {
                        let r = perm.len();
                        let swap = r >= 2
                            && perm[r - 2] == r - 1
                            && perm[r - 1] == r - 2
                            && perm[..r - 2].iter().enumerate().all(|(i, q)| i == *q);
                        swap.then(|| p.node(g, v).map(|n| n.inputs[0])).flatten()
                    }
                    _ => None,
                };
                let (a, b) = (node.inputs[0], node.inputs[1]);
                let (sa, sb) = (swapped(a), swapped(b));
                if sa.is_some() || sb.is_some() {
                    for (old, new) in [(a, sa), (b, sb)] {
                        if let Some(new) = new {
                            uses[old.index()] -= 1;
                            uses[new.index()] += 1;
                        }
                    }
                    let node = &mut g.nodes[i];
                    node.op = Op::MatMul {
                        transpose_a: transpose_a ^ sa.is_some(),
                        transpose_b: transpose_b ^ sb.is_some(),
                    };
                    node.inputs = vec![sa.unwrap_or(a), sb.unwrap_or(b)];
                    n += 1;
                    continue;
                }
            }
            // Chains of the same data movement collapse into one node.
            let Some(inner) = node.inputs.first().and_then(|v| p.node(g, *v)).cloned() else { continue };
            let merged: Option<Op> = match (&node.op, &inner.op) {
                (Op::Transpose { perm: q }, Op::Transpose { perm: p1 }) => {
                    Some(Op::Transpose { perm: q.iter().map(|i| p1[*i]).collect() })
                }
                (Op::Reshape, Op::Reshape) => Some(Op::Reshape),
                (Op::Broadcast, Op::Broadcast) => Some(Op::Broadcast),
                _ => None,
            };
            if let Some(op) = merged {
                uses[inner.output.index()] -= 1;
                uses[inner.inputs[0].index()] += 1;
                let node = &mut g.nodes[i];
                node.op = op;
                node.inputs = vec![inner.inputs[0]];
                n += 1;
            }
        }
        Ok(n)
    }
}

/// A CSE bucket: op name, inputs, and the data of a small constant.
type CseKey = (&'static str, Vec<ValueId>, Vec<u8>);

/// Common-subexpression elimination: nodes with equal ops on equal inputs compute
/// the same value; small constants with equal data are one constant. Broadcasts
/// are left alone: each consumer fuses its own (an index map, free in its loop),
/// while a shared one would be written out in full for all of them.
pub struct Cse;

impl Pass for Cse {
    fn name(&self) -> &'static str {
        "cse"
    }
    fn run(&self, g: &mut Graph) -> Result<usize, PassError> {
        // Bucket by op name, inputs and (for small constants) data; compare ops in a bucket.
        let mut seen: HashMap<CseKey, Vec<usize>> = HashMap::new();
        let mut replace: Vec<(ValueId, ValueId)> = Vec::new();
        let uses = g.use_counts();
        for (i, node) in g.nodes.iter().enumerate() {
            if uses[node.output.index()] == 0 || node.op == Op::Broadcast {
                continue;
            }
            let data = match &node.op {
                Op::Constant(c) if c.numel() <= 64 => c.bytes().to_vec(),
                Op::Constant(c) => format!("{:p}", c.bytes().as_ptr()).into_bytes(),
                _ => Vec::new(),
            };
            let key = (node.op.name(), node.inputs.clone(), data);
            let bucket = seen.entry(key).or_default();
            let same = bucket.iter().find(|j| {
                let other = &g.nodes[**j];
                let (a, b) = (g.ty(other.output), g.ty(node.output));
                let same_op = match (&other.op, &node.op) {
                    (Op::Constant(x), Op::Constant(y)) => {
                        x.dtype == y.dtype && x.shape == y.shape && x.bytes() == y.bytes()
                    }
                    (x, y) => x == y,
                };
                same_op
                    && a.dtype == b.dtype
                    && a.rank() == b.rank()
                    && a.shape.iter().zip(&b.shape).all(|(x, y)| g.env.equal(x, y))
            });
            match same {
                Some(j) if can_replace(g, node.output, g.nodes[*j].output) => {
                    replace.push((node.output, g.nodes[*j].output))
                }
                Some(_) => {}
                None => bucket.push(i),
            }
        }
        for (old, new) in &replace {
            g.replace_uses(*old, *new);
        }
        Ok(replace.len())
    }
}

/// A uniform scale on a matmul operand moves to its output: `(x·a)·(y·b) =
/// (x·y)·(a·b)`. Exporters scale attention's queries and keys each by
/// `sqrt(1/sqrt(d))` (PyTorch's decomposed scaled-dot-product attention); the
/// product of the two then lands on the scores, where the softmax program
/// applies it, and the keys stay a view the contraction reads (a grouped
/// query's shared head, a cache) instead of a scaled copy. Convolutions' scales
/// move the same way. An operand's scale moves only when the product is its
/// one reader, or when what it scales holds integers: a statically quantized
/// model's dequantized activations and weights (this runs before constant
/// folding, while a weight's scale is still a factor), whose products then
/// multiply integers (the integer kernel families' operands) and scale the
/// result once. A weight's scale may also be one per output column (a
/// per-channel quantized weight: along a matmul's columns, a convolution's
/// output channels), which moves to the output's columns the same way.
pub struct HoistMatMulScale;

/// What scales an operand: one factor, or one per output column.
#[derive(Clone, Debug)]
enum Scale {
    Uniform(f64),
    Columns(Vec<f64>),
}

/// A matmul operand's scale: the operand is `x·s` (or `x/s`), or a view of it
/// (a dequantized activation flattened, or sliced, for the product).
struct Scaled {
    x: ValueId,
    s: Scale,
    /// The view the operand takes of `x·s`: the product then reads it of `x`.
    view: Option<Op>,
}

impl HoistMatMulScale {
    /// `v`'s scale, when `v` (and what it reshapes) is read once, or when `x`
    /// holds integers (a dequantized activation, which other readers may keep
    /// reading scaled: the product then multiplies integers). `columns` is the
    /// axis of `v` along the product's output columns, where a scale may vary.
    fn scaled(
        g: &Graph,
        p: &Producers,
        uses: &[usize],
        v: ValueId,
        columns: Option<usize>,
    ) -> Option<Scaled> {
        let once = |v: ValueId| uses[v.index()] == 1 && !g.outputs.contains(&v);
        let node = p.node(g, v)?;
        let (inner, view) = match node.op {
            Op::Reshape | Op::Slice { .. } | Op::Transpose { .. } if node.inputs.len() == 1 => {
                (node.inputs[0], Some(node.op.clone()))
            }
            _ => (v, None),
        };
        // The column axis of what the view reads (a transpose moves it; other
        // views keep only a uniform scale).
        let columns = match &view {
            None => columns,
            Some(Op::Transpose { perm }) => columns.and_then(|a| perm.get(a).copied()),
            Some(_) => None,
        };
        let (x, s) = Self::factor(g, p, inner, columns)?;
        let alone = once(v) && once(inner);
        (alone || crate::integer::integral(g, p, x)).then_some(Scaled { x, s, view })
    }

    /// `(x, s)` when `v` is `x·s` or `x/s` for a uniform `s`, or `x·s` for an
    /// `s` that varies along `columns` alone.
    fn factor(g: &Graph, p: &Producers, v: ValueId, columns: Option<usize>) -> Option<(ValueId, Scale)> {
        let node = p.node(g, v)?;
        let Op::Binary(b) = node.op else { return None };
        let (x, y) = (node.inputs[0], node.inputs[1]);
        let same = |u: ValueId| {
            let (a, t) = (g.ty(u), g.ty(v));
            a.dtype == t.dtype
                && a.rank() == t.rank()
                && a.shape.iter().zip(&t.shape).all(|(a, b)| g.env.equal(a, b))
        };
        let along = |u: ValueId| columns.and_then(|a| along_axis(g, p, u, v, a)).map(Scale::Columns);
        match b {
            BinaryOp::Mul => match (uniform(g, p, x), uniform(g, p, y)) {
                (_, Some(s)) if same(x) => Some((x, Scale::Uniform(s))),
                (Some(s), _) if same(y) => Some((y, Scale::Uniform(s))),
                (None, None) => match (same(x).then(|| along(y)).flatten(), same(y)) {
                    (Some(s), _) => Some((x, s)),
                    (None, true) => along(x).map(|s| (y, s)),
                    (None, false) => None,
                },
                _ => None,
            },
            BinaryOp::Div if same(x) => Some((x, Scale::Uniform(1.0 / uniform(g, p, y)?))),
            _ => None,
        }
    }
}

/// The values of `s`, a constant broadcast to `v`'s shape that varies along
/// `axis` of `v` alone (1 along every other axis before the broadcast), in
/// order along it.
pub(crate) fn along_axis(g: &Graph, p: &Producers, s: ValueId, v: ValueId, axis: usize) -> Option<Vec<f64>> {
    let (vt, mut u) = (g.ty(v), s);
    while let Op::Broadcast = p.node(g, u)?.op {
        u = p.node(g, u)?.inputs[0];
    }
    // `u`'s shape, aligned to `v`'s last axes as a broadcast aligns it.
    let shape = &g.ty(u).shape;
    let lead = vt.rank().checked_sub(shape.len())?;
    let n = vt.shape.get(axis)?.as_const()?;
    for (i, d) in shape.iter().enumerate() {
        let want = if i + lead == axis { n } else { 1 };
        if d.as_const() != Some(want) {
            return None;
        }
    }
    // A reshape keeps the order of the values.
    let mut c = u;
    loop {
        let node = p.node(g, c)?;
        match &node.op {
            Op::Reshape => c = node.inputs[0],
            Op::Constant(data) if data.numel() as i64 == n && n <= 1 << 20 => {
                return Some(data.to_tensor().to_f64_vec());
            }
            _ => return None,
        }
    }
}

impl Pass for HoistMatMulScale {
    fn name(&self) -> &'static str {
        "hoist-matmul-scale"
    }
    fn run(&self, g: &mut Graph) -> Result<usize, PassError> {
        // Every product's operands are found on one analysis of the graph: an
        // operand read once belongs to one product, so the rewrites are
        // independent. They are applied last to first, so that the nodes each
        // inserts leave the positions of the ones before it as they were.
        let p = Producers::of(g);
        let uses = g.use_counts();
        let mut found = Vec::new();
        for (i, node) in g.nodes.iter().enumerate() {
            // A convolution is linear in each operand too (its zero padding
            // scales to zero), and has no bias here (the import adds it after).
            let product = matches!(node.op, Op::MatMul { .. } | Op::Conv(_)) && node.inputs.len() == 2;
            if !product || g.ty(node.output).dtype != ir::DType::F32 {
                continue;
            }
            let (a, b) = (node.inputs[0], node.inputs[1]);
            // Where B's output columns lie: a matmul's last axis (its second last
            // when transposed), a convolution weight's first; the output's
            // columns: its last axis, a convolution's channels.
            let rb = g.ty(b).rank();
            let (b_columns, out_columns) = match node.op {
                Op::MatMul { transpose_b, .. } if rb >= 2 => {
                    (Some(if transpose_b { rb - 2 } else { rb - 1 }), g.ty(node.output).rank() - 1)
                }
                Op::Conv(_) => (Some(0), 1),
                _ => (None, 0),
            };
            let (sa, sb) = (Self::scaled(g, &p, &uses, a, None), Self::scaled(g, &p, &uses, b, b_columns));
            // A's scale is uniform (it has no column axis).
            let Some(ua) = (match sa.as_ref().map(|s| &s.s) {
                None => Some(1.0),
                Some(Scale::Uniform(u)) => Some(*u),
                Some(Scale::Columns(_)) => None,
            }) else {
                continue;
            };
            let scale: Vec<f64> = match sb.as_ref().map(|s| &s.s) {
                None => vec![ua],
                Some(Scale::Uniform(u)) => vec![ua * u],
                Some(Scale::Columns(cs)) => cs.iter().map(|c| c * ua).collect(),
            };
            if (sa.is_some() || sb.is_some()) && scale.iter().all(|s| s.is_finite()) {
                found.push((i, [(a, sa), (b, sb)], scale, out_columns));
            }
        }
        let count = found.len();
        for (i, operands, scale, out_columns) in found.into_iter().rev() {
            let node = g.nodes[i].clone();
            let out = g.ty(node.output).clone();
            let hint = g.name(node.output).to_string();
            // The unscaled operands (the operand's view of `x·s` taken of `x`).
            let mut at = i;
            let mut inputs = Vec::with_capacity(2);
            for (v, scaled) in operands {
                inputs.push(match scaled {
                    None => v,
                    Some(Scaled { x, view: None, .. }) => x,
                    Some(Scaled { x, view: Some(op), .. }) => {
                        at += 1;
                        g.insert_node(at - 1, op, vec![x], &format!("{hint}.unscaled"), g.ty(v).clone())
                    }
                });
            }
            // The `[1, …, 1]` scale (`[1, …, n, …, 1]` with one per column),
            // broadcast to the output, times the unscaled product.
            let mut dims = vec![1usize; out.rank()];
            if scale.len() > 1 {
                dims[out_columns] = scale.len();
            }
            let t = ir::Tensor::new(dims, ir::Elems::F32(scale.iter().map(|s| *s as f32).collect()))
                .map_err(|e| PassError::Failed { pass: self.name(), msg: e.to_string() })?;
            let data = Arc::new(ConstData::from_tensor(&t));
            let c =
                g.insert_node(at, Op::Constant(data.clone()), vec![], &format!("{hint}.scale"), data.ty());
            let cb = g.insert_node(at + 1, Op::Broadcast, vec![c], &format!("{hint}.scale"), out.clone());
            let mm = g.insert_node(at + 2, node.op.clone(), inputs, &format!("{hint}.unscaled"), out);
            let old = &mut g.nodes[at + 3];
            old.op = Op::Binary(BinaryOp::Mul);
            old.inputs = vec![mm, cb];
        }
        Ok(count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A weight's cast folded from its bytes gives the interpreter's bytes:
    /// i8 and u8 at their bounds, and i32 past 2^24, where f32 rounds to even.
    #[test]
    fn widened_casts_are_the_interpreters() {
        let env = sym::ShapeEnv::default();
        let cases = [
            ir::Tensor::new(vec![4], ir::Elems::I8(vec![-128, -1, 0, 127])),
            ir::Tensor::new(vec![3], ir::Elems::U8(vec![0, 128, 255])),
            ir::Tensor::new(vec![4], ir::Elems::I32(vec![i32::MIN, -16_777_217, 16_777_219, i32::MAX])),
        ];
        for t in cases {
            let t = t.expect("tensor");
            let c = ConstData::from_tensor(&t);
            for to in [DType::I32, DType::I64, DType::F32] {
                let ty = TensorType::fixed(to, &[t.numel() as i64]);
                let want =
                    reference::eval_op(&Op::Cast, &[&t], &ty, &env, &Bindings::default()).expect("cast");
                let got = widened(&c, to).expect("widens");
                assert!(got == ConstData::from_tensor(&want), "{:?} to {to}", t.dtype());
            }
        }
        let f = ConstData::from_tensor(&ir::Tensor::new(vec![1], ir::Elems::F32(vec![1.5])).expect("f"));
        assert!(widened(&f, DType::I32).is_none(), "floats go to the interpreter");
    }

    /// A fold that keeps its operand's values (a reshape, an integer zero
    /// point of 0 subtracted, a product by 1) shares the operand's bytes; one
    /// that changes them (a zero point of 2, a float `x - 0`) computes anew,
    /// and both give the interpreter's values; the constants the folds leave
    /// unread are removed.
    #[test]
    fn folds_that_keep_the_values_share_the_bytes() {
        let text = r#"graph {
  %w: i32[2, 3] = constant [1, -2, 3, 4, -5, 6]
  %z: i32[2, 3] = constant [0, 0, 0, 0, 0, 0]
  %t: i32[2, 3] = constant [2, 2, 2, 2, 2, 2]
  %o: i32[2, 3] = constant [1, 1, 1, 1, 1, 1]
  %f: f32[2, 3] = constant [1, 2, 3, 4, 5, 6]
  %fz: f32[2, 3] = constant [0, 0, 0, 0, 0, 0]
  %a: i32[2, 3] = sub %w, %z
  %b: i32[3, 2] = reshape %a
  %c: i32[2, 3] = mul %w, %o
  %d: i32[2, 3] = sub %w, %t
  %e: f32[2, 3] = sub %f, %fz
  output %b, %c, %d, %e
}
"#;
        let mut g = ir::parse_graph(text, &|_| None).expect("parses");
        let want = reference::run(&g, &[]).expect("runs");
        let data = |g: &Graph, name: &str| {
            let n = g.nodes.iter().find(|n| g.name(n.output) == name).expect(name);
            match &n.op {
                Op::Constant(c) => c.clone(),
                op => panic!("{name}: {op:?}"),
            }
        };
        let w = data(&g, "w");
        FoldConstants::default().run(&mut g).expect("folds");
        for (name, shared) in [("b", true), ("c", true), ("d", false), ("e", false)] {
            let same = data(&g, name).bytes().as_ptr() == w.bytes().as_ptr();
            assert_eq!(same, shared, "{name}");
        }
        assert_eq!(data(&g, "b").shape, [3, 2]);
        // What the folds left unread is gone: only the outputs' constants remain.
        assert_eq!(g.nodes.len(), 4, "{g}");
        let got = reference::run(&g, &[]).expect("runs");
        assert_eq!(got, want);
    }
}
