//! Integer contractions on the f32 contraction engine, exactly.
//!
//! A quantized model's matmuls and convolutions multiply i32 values that
//! come from 8-bit ones (`cast(u8) - zero_point`, an int8 weight): each
//! operand's range is known from the graph. An f32 sum of integer products
//! is exact while every partial sum stays below 2^24 in magnitude, whatever
//! the order of the additions (each is then an integer f32 holds exactly):
//! that holds when `K · max|a| · max|b| < 2^24`, or, for a constant weight,
//! when `max|a|` times each column's sum of magnitudes is. Where it does, the
//! contraction runs in f32 and is cast back. A deeper matmul runs as f32
//! products of chunks of K short enough to be exact, summed in i32 (as many
//! multiplies as before, the weight's chunks each read once); a deeper
//! convolution splits `a` into its base-16 digits (`a = 16·hi + lo`, `lo` in
//! 0..16), stacked along the batch for one f32 convolution, `16·hi + lo`
//! summed in i32. Otherwise (a symbolic depth, unbounded operands) it is left
//! as it is.
//!
//! A matmul of `x - z` (x 8-bit unsigned, `z` one zero point for the whole
//! tensor: dynamic quantization's activation) by an int8 weight first moves
//! the zero point out, `(x - z)·B = x·B - z·colsum(B)`, the column sums a
//! constant: the contraction's operands are then 8-bit integers on both
//! sides (u8 by s8), which the u8s8 kernel family multiplies exactly, and
//! the f32 engine as exactly as before.

use std::sync::Arc;

use ir::{BinaryOp, ConstData, DType, Graph, Op, TensorType, UnaryOp, ValueId};

use crate::pattern::Producers;
use crate::{Pass, PassError};

/// The largest magnitude every partial sum of an exact f32 contraction stays
/// below: 2^24, past which f32 no longer holds every integer.
pub(crate) const EXACT: i64 = 1 << 24;

pub struct IntegerMatMulAsFloat;

/// How a contraction runs on floats.
enum Plan {
    /// One f32 contraction of the operands.
    Whole,
    /// `a` split into base-16 digits: two f32 contractions.
    Digits,
    /// A matmul's K in chunks (first depth, depths), an f32 product each.
    Chunks(Vec<(i64, i64)>),
}

/// A contraction that runs on floats: how, and the zero point moved out of
/// its A first.
struct Rewrite {
    plan: Plan,
    offset: Option<Offset>,
}

/// At most this many chunks of K: deeper products stay as they are.
const MAX_CHUNKS: i64 = 16;

/// A matmul's A as `views(x - z)`: `x` holds 8-bit unsigned integers, `z`
/// is one value (`single`) broadcast, and `views` the view nodes from A down
/// to the subtraction (outermost first).
struct Offset {
    views: Vec<usize>,
    x: ValueId,
    single: ValueId,
}

impl Offset {
    /// The offset form of `node`'s A, when `node` multiplies it by a constant
    /// (its range, `b_range`, checked by the caller) that holds int8 values.
    fn of(g: &Graph, p: &Producers, node: &ir::Node, (lo, hi): (i64, i64)) -> Option<Offset> {
        let Op::MatMul { transpose_b: false, .. } = node.op else { return None };
        if lo < -128 || hi > 127 || constant_under_casts(g, p, node.inputs[1]).is_none() {
            return None;
        }
        let (mut v, mut views) = (node.inputs[0], Vec::new());
        loop {
            let i = p.index(g, v)?;
            let n = &g.nodes[i];
            match n.op {
                Op::Reshape | Op::Transpose { .. } | Op::Slice { .. } if n.inputs.len() == 1 => {
                    views.push(i);
                    v = n.inputs[0];
                }
                Op::Binary(BinaryOp::Sub) => {
                    let (x, z) = (n.inputs[0], n.inputs[1]);
                    let unsigned = range(g, p, x, 0).is_some_and(|(lo, hi)| lo >= 0 && hi <= 255);
                    let single = single_value(g, p, z)?;
                    return (unsigned && g.ty(single).dtype == DType::I32).then_some(Offset {
                        views,
                        x,
                        single,
                    });
                }
                _ => return None,
            }
        }
    }
}

/// The data of the constant `v` is, or is a cast (or casts) of.
pub(crate) fn constant_under_casts(g: &Graph, p: &Producers, v: ValueId) -> Option<Arc<ConstData>> {
    let n = p.node(g, v)?;
    match &n.op {
        Op::Constant(c) => Some(c.clone()),
        Op::Cast => constant_under_casts(g, p, n.inputs[0]),
        _ => None,
    }
}

/// The one-element value `v` broadcasts (through reshapes), if it is one.
fn single_value(g: &Graph, p: &Producers, v: ValueId) -> Option<ValueId> {
    let mut v = v;
    loop {
        if g.ty(v).is_one_element() {
            return Some(v);
        }
        let n = p.node(g, v)?;
        match n.op {
            Op::Broadcast | Op::Reshape if n.inputs.len() == 1 => v = n.inputs[0],
            _ => return None,
        }
    }
}

impl IntegerMatMulAsFloat {
    fn plan(g: &Graph, p: &Producers, node: &ir::Node) -> Option<Rewrite> {
        if !matches!(node.op, Op::MatMul { .. } | Op::Conv(_)) {
            return None;
        }
        let (a, b) = (node.inputs[0], node.inputs[1]);
        if g.ty(node.output).dtype != DType::I32 || g.ty(a).dtype != DType::I32 || g.ty(b).dtype != DType::I32
        {
            return None;
        }
        let depth = match &node.op {
            Op::MatMul { transpose_a, .. } => {
                let s = &g.ty(a).shape;
                s[s.len() - if *transpose_a { 2 } else { 1 }].as_const()?
            }
            // A convolution's depth: input channels of a group times the taps.
            Op::Conv(_) => g.ty(b).shape[1..].iter().map(|d| d.as_const()).product::<Option<i64>>()?,
            _ => return None,
        };
        let b_range = range(g, p, b, 0)?;
        let offset = Offset::of(g, p, node, b_range);
        let ma = match offset {
            Some(_) => 255,
            None => magnitude(g, p, a, 0)?,
        };
        let mb = b_range.0.abs().max(b_range.1.abs());
        let fits = |ma: i64| depth.checked_mul(ma).and_then(|x| x.checked_mul(mb)).is_some_and(|x| x < EXACT);
        let plan = if fits(ma) {
            Plan::Whole
        } else if let Op::MatMul { transpose_b, .. } = node.op {
            // A constant weight bounds each column's sums by its own magnitudes;
            // otherwise the longest exact chunk, rounded down to whole vectors of 16.
            let chunks = match weight_chunks(g, p, b, transpose_b, depth, ma) {
                Some(chunks) => chunks,
                None => {
                    let chunk = (EXACT - 1) / ma.checked_mul(mb)?.max(1) / 16 * 16;
                    if chunk < 16 {
                        return None;
                    }
                    (0..depth).step_by(chunk as usize).map(|s| (s, chunk.min(depth - s))).collect()
                }
            };
            match chunks.len() as i64 {
                1 => Plan::Whole,
                n if n <= MAX_CHUNKS => Plan::Chunks(chunks),
                _ => return None,
            }
        } else if fits(15.max((ma + 15) / 16)) {
            Plan::Digits
        } else {
            return None;
        };
        Some(Rewrite { plan, offset })
    }
}

/// The integers `v` holds, `(lowest, highest)`, where the graph bounds them:
/// 8-bit values widened (to a wider integer or to f32), integral constants,
/// sums and differences of such, concatenations, views and constant padding
/// of them. The lowering asks it of a matmul's f32 operands: 8-bit integers
/// in both are what the u8s8 contraction family multiplies exactly, 16-bit
/// ones what the i16 family multiplies.
pub fn value_range(g: &Graph, v: ValueId) -> Option<(i64, i64)> {
    range(g, &Producers::of(g), v, 0)
}

/// Whether the graph bounds `v` to integers (as [`value_range`] does).
pub(crate) fn integral(g: &Graph, p: &Producers, v: ValueId) -> bool {
    range(g, p, v, 0).is_some()
}

/// The chunks of K (first depth, depths) over which a matmul by the constant
/// weight `b` sums exactly in f32, its other operand at most `ma` in
/// magnitude: every partial sum of a column stays below `ma` times the sum of
/// that column's magnitudes over the chunk, kept under 2^24. Chunks end on
/// multiples of 16 where they can. `None` when `b` is not a constant of 8- or
/// 32-bit integers, or one depth alone is too much.
fn weight_chunks(
    g: &Graph,
    p: &Producers,
    b: ValueId,
    transpose_b: bool,
    depth: i64,
    ma: i64,
) -> Option<Vec<(i64, i64)>> {
    // The weight's integers read in place (an LM head's are tens of millions).
    let data = constant_under_casts(g, p, b)?;
    let (bytes, value, len) = (data.bytes(), integers(&data)?, data.numel());
    let shape = &g.ty(b).shape;
    let r = shape.len();
    let dims: Vec<usize> = shape.iter().map(|d| d.as_const().map(|x| x as usize)).collect::<Option<_>>()?;
    let (k, n) = if transpose_b { (dims[r - 1], dims[r - 2]) } else { (dims[r - 2], dims[r - 1]) };
    let batch = len / (k * n).max(1);
    if k as i64 != depth || batch * k * n != len {
        return None;
    }
    // |b| at depth `d` of column `c` of batch entry `e`.
    let at = |e: usize, d: usize, c: usize| {
        let i = if transpose_b { c * k + d } else { d * n + c };
        value(bytes, e * k * n + i).abs()
    };
    let limit = (EXACT - 1) / ma.max(1);
    let (mut chunks, mut start, mut sums) = (Vec::new(), 0usize, vec![0i64; batch * n]);
    let mut d = 0;
    while d < k {
        let over = (0..batch * n).any(|j| sums[j] + at(j / n, d, j % n) > limit);
        if over {
            if d == start {
                return None;
            }
            // End on a multiple of 16 where the chunk is longer than that.
            let end = if d / 16 * 16 > start { d / 16 * 16 } else { d };
            chunks.push((start as i64, (end - start) as i64));
            (start, d) = (end, end);
            sums.iter_mut().for_each(|s| *s = 0);
            continue;
        }
        for (j, s) in sums.iter_mut().enumerate() {
            *s += at(j / n, d, j % n);
        }
        d += 1;
    }
    chunks.push((start as i64, (k - start) as i64));
    Some(chunks)
}

/// Element `i` of an integer constant, read from its little-endian bytes in
/// place (a weight's are tens of millions): 8-, 32- and 64-bit integers, bools.
fn integers(c: &ConstData) -> Option<fn(&[u8], usize) -> i64> {
    Some(match c.ty().dtype {
        DType::I8 => |b, i| b[i] as i8 as i64,
        DType::U8 | DType::Bool => |b, i| b[i] as i64,
        DType::I32 => |b, i| i32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]) as i64,
        DType::I64 => |b, i| {
            let w: [u8; 8] = [
                b[8 * i],
                b[8 * i + 1],
                b[8 * i + 2],
                b[8 * i + 3],
                b[8 * i + 4],
                b[8 * i + 5],
                b[8 * i + 6],
                b[8 * i + 7],
            ];
            i64::from_le_bytes(w)
        },
        _ => return None,
    })
}

/// The largest `|x|` of an integer value `v`, where the graph bounds it: an
/// 8-bit value widened, a constant, sums and differences of such, and views
/// of them.
fn magnitude(g: &Graph, p: &Producers, v: ValueId, depth: usize) -> Option<i64> {
    let (lo, hi) = range(g, p, v, depth)?;
    Some(lo.abs().max(hi.abs()))
}

fn range(g: &Graph, p: &Producers, v: ValueId, depth: usize) -> Option<(i64, i64)> {
    if depth > 16 {
        return None;
    }
    let node = p.node(g, v)?;
    let of = |i: usize| range(g, p, node.inputs[i], depth + 1);
    // f32 sums of integers stay exact below 2^24.
    let exact = |(lo, hi): (i64, i64)| {
        (g.ty(v).dtype != DType::F32 || (lo.abs() < EXACT && hi.abs() < EXACT)).then_some((lo, hi))
    };
    match &node.op {
        Op::Cast => match g.ty(node.inputs[0]).dtype {
            DType::I8 => Some((i8::MIN as i64, i8::MAX as i64)),
            DType::U8 => Some((0, u8::MAX as i64)),
            DType::Bool => Some((0, 1)),
            DType::I32 | DType::I64 => of(0),
            _ => None,
        },
        Op::Broadcast | Op::Reshape | Op::Transpose { .. } | Op::Slice { .. } => of(0),
        Op::Binary(BinaryOp::Add) => {
            let ((la, ha), (lb, hb)) = (of(0)?, of(1)?);
            exact((la.checked_add(lb)?, ha.checked_add(hb)?))
        }
        Op::Binary(BinaryOp::Sub) => {
            let ((la, ha), (lb, hb)) = (of(0)?, of(1)?);
            exact((la.checked_sub(hb)?, ha.checked_sub(lb)?))
        }
        Op::Concat { .. } => {
            let parts = (0..node.inputs.len()).map(of).collect::<Option<Vec<_>>>()?;
            Some((parts.iter().map(|r| r.0).min()?, parts.iter().map(|r| r.1).max()?))
        }
        // A convolution's zero padding of its image.
        Op::Pad { mode: ir::PadMode::Constant(z), .. } if z.fract() == 0.0 && z.abs() < EXACT as f64 => {
            let (lo, hi) = of(0)?;
            Some((lo.min(*z as i64), hi.max(*z as i64)))
        }
        // Integral floats, as integers (a folded cast of an integer weight), read
        // in place: the first fraction ends the scan of a float weight.
        Op::Constant(c) if c.numel() > 0 && c.ty().dtype == DType::F32 => {
            let mut r = (i64::MAX, i64::MIN);
            for w in c.bytes().chunks_exact(4) {
                let x = f32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                if x.fract() != 0.0 || x.abs() >= EXACT as f32 {
                    return None;
                }
                r = (r.0.min(x as i64), r.1.max(x as i64));
            }
            Some(r)
        }
        Op::Constant(c) if c.numel() > 0 => {
            let ints = integers(c)?;
            let mut r = (i64::MAX, i64::MIN);
            for i in 0..c.numel() {
                let x = ints(c.bytes(), i);
                r = (r.0.min(x), r.1.max(x));
            }
            Some(r)
        }
        _ => None,
    }
}

impl Pass for IntegerMatMulAsFloat {
    fn name(&self) -> &'static str {
        "integer-matmul-as-float"
    }
    fn run(&self, g: &mut Graph) -> Result<usize, PassError> {
        let p = Producers::of(g);
        let found: Vec<(usize, Rewrite)> =
            g.nodes.iter().enumerate().filter_map(|(i, n)| Some((i, Self::plan(g, &p, n)?))).collect();
        let count = found.len();
        // Last to first: the nodes inserted before one leave the positions of
        // the ones before it (an offset's views among them) as they were.
        for (i, Rewrite { plan, offset }) in found.into_iter().rev() {
            let node = g.nodes[i].clone();
            let (a, b) = (node.inputs[0], node.inputs[1]);
            let out = g.ty(node.output).clone();
            let mut ins = Inserter { at: i, hint: g.name(node.output).to_string() };
            // With the zero point moved out, A is the unsigned values under the same views.
            let a = match &offset {
                Some(o) => {
                    let mut a = o.x;
                    for &v in o.views.iter().rev() {
                        let (op, ty) = (g.nodes[v].op.clone(), g.ty(g.nodes[v].output).clone());
                        a = ins.add(g, op, vec![a], "u8", ty);
                    }
                    a
                }
                None => a,
            };
            let float = |t: &TensorType| TensorType::new(DType::F32, t.shape.clone());
            let (ta, tb, tout) = (float(g.ty(a)), float(g.ty(b)), float(&out));
            let af = ins.add(g, Op::Cast, vec![a], "a", ta.clone());
            let bf = ins.add(g, Op::Cast, vec![b], "b", tb);
            let (op, inputs) = match plan {
                Plan::Whole => {
                    let c = ins.add(g, node.op.clone(), vec![af, bf], "f32", tout);
                    (Op::Cast, vec![c])
                }
                Plan::Chunks(chunks) => {
                    let Op::MatMul { transpose_a, transpose_b } = node.op else {
                        return Err(PassError::Failed {
                            pass: self.name(),
                            msg: "chunks of a convolution".into(),
                        });
                    };
                    let (ra, rb) = (g.ty(a).rank(), g.ty(b).rank());
                    let ka = if transpose_a { ra - 2 } else { ra - 1 };
                    let kb = if transpose_b { rb - 1 } else { rb - 2 };
                    let mut parts = Vec::new();
                    for (n, &(start, len)) in chunks.iter().enumerate() {
                        let mut piece = |g: &mut Graph, v: ValueId, axis: usize, name: &str| {
                            let mut ty = g.ty(v).clone();
                            ty.shape[axis] = sym::SymExpr::constant(len);
                            let axes =
                                vec![ir::SliceAxis { axis, start: sym::SymExpr::constant(start), step: 1 }];
                            ins.add(g, Op::Slice { axes }, vec![v], name, ty)
                        };
                        let pa = piece(g, af, ka, &format!("a.k{n}"));
                        let pb = piece(g, bf, kb, &format!("b.k{n}"));
                        let c = ins.add(g, node.op.clone(), vec![pa, pb], &format!("k{n}"), tout.clone());
                        parts.push(ins.add(g, Op::Cast, vec![c], &format!("k{n}.i32"), out.clone()));
                    }
                    // The partial products summed in i32, the last sum the node itself.
                    // (two chunks at least: one would have been exact whole)
                    let (Some((&last, rest)), Some(&first)) = (parts.split_last(), parts.first()) else {
                        return Err(PassError::Failed {
                            pass: self.name(),
                            msg: "a contraction of no depth".into(),
                        });
                    };
                    if rest.is_empty() {
                        return Err(PassError::Failed {
                            pass: self.name(),
                            msg: "one chunk of depth".into(),
                        });
                    }
                    let mut sum = first;
                    for (n, &p) in rest.iter().enumerate().skip(1) {
                        let add = Op::Binary(BinaryOp::Add);
                        sum = ins.add(g, add, vec![sum, p], &format!("k{n}.sum"), out.clone());
                    }
                    (Op::Binary(BinaryOp::Add), vec![sum, last])
                }
                Plan::Digits => {
                    let mul = Op::Binary(BinaryOp::Mul);
                    let sixteenth = ins.splat(g, ir::Elems::F32(vec![1.0 / 16.0]), &ta, "sixteenth")?;
                    let q = ins.add(g, mul.clone(), vec![af, sixteenth], "a.q", ta.clone());
                    let hi = ins.add(g, Op::Unary(UnaryOp::Floor), vec![q], "a.hi", ta.clone());
                    let sixteen = ins.splat(g, ir::Elems::F32(vec![16.0]), &ta, "sixteen")?;
                    let hi16 = ins.add(g, mul.clone(), vec![hi, sixteen], "a.hi16", ta.clone());
                    let lo = ins.add(g, Op::Binary(BinaryOp::Sub), vec![af, hi16], "a.lo", ta);
                    let (chi, clo) = both_digits(g, &mut ins, &node.op, [hi, lo], bf, &tout)?;
                    let ihi = ins.add(g, Op::Cast, vec![chi], "hi.i32", out.clone());
                    let ilo = ins.add(g, Op::Cast, vec![clo], "lo.i32", out.clone());
                    let k16 = ins.splat(g, ir::Elems::I32(vec![16]), &out, "sixteen.i32")?;
                    let ihi16 = ins.add(g, mul, vec![ihi, k16], "hi16", out.clone());
                    (Op::Binary(BinaryOp::Add), vec![ihi16, ilo])
                }
            };
            let (op, inputs) = match &offset {
                Some(o) => {
                    let product = ins.add(g, op, inputs, "u8s8", out.clone());
                    let moved = zero_point_times_column_sums(g, &mut ins, o.single, b, &out)?;
                    (Op::Binary(BinaryOp::Sub), vec![product, moved])
                }
                None => (op, inputs),
            };
            let at = ins.at;
            let old = &mut g.nodes[at];
            old.op = op;
            old.inputs = inputs;
        }
        Ok(count)
    }
}

/// `z · colsum(b)` broadcast to `out` (of `out`'s type, as `z` and `b`): the
/// zero point's share of `(x - z)·b`, `b` a `[.., K, N]` constant (its sums
/// fold), `z` one value.
pub(crate) fn zero_point_times_column_sums(
    g: &mut Graph,
    ins: &mut Inserter,
    z: ValueId,
    b: ValueId,
    out: &TensorType,
) -> Result<ValueId, PassError> {
    let tb = g.ty(b).clone();
    let r = tb.rank();
    let mut sums_shape = tb.shape.clone();
    sums_shape[r - 2] = sym::SymExpr::constant(1);
    let sums_ty = TensorType::new(out.dtype, sums_shape);
    let sums = ins.add(
        g,
        Op::Reduce { op: ir::ReduceOp::Sum, axes: vec![r - 2], keep_dims: true },
        vec![b],
        "colsum",
        sums_ty.clone(),
    );
    let one = TensorType::new(out.dtype, vec![sym::SymExpr::constant(1); r]);
    let z = ins.add(g, Op::Reshape, vec![z], "zp", one);
    let z = ins.add(g, Op::Broadcast, vec![z], "zp", sums_ty.clone());
    let moved = ins.add(g, Op::Binary(BinaryOp::Mul), vec![z, sums], "zp.colsum", sums_ty);
    // Rank up to the output's (a weight of lower rank broadcasts over its batch).
    let lead = out.rank().checked_sub(r).ok_or_else(|| PassError::Failed {
        pass: "integer-matmul-as-float",
        msg: "a weight of higher rank than the product".into(),
    })?;
    let mut shape = vec![sym::SymExpr::constant(1); lead];
    shape.extend(g.ty(moved).shape.iter().cloned());
    let moved = ins.add(g, Op::Reshape, vec![moved], "zp.colsum", TensorType::new(out.dtype, shape));
    Ok(ins.add(g, Op::Broadcast, vec![moved], "zp.colsum", out.clone()))
}

/// The contractions of both digits of `a` with `b`: one contraction of the
/// digits stacked along the rows (a matmul's M, a convolution's batch), so
/// that `b` (a weight) is read once, then its two halves; two contractions
/// where the rows are not `a`'s own axis (a transposed `a`).
fn both_digits(
    g: &mut Graph,
    ins: &mut Inserter,
    op: &Op,
    [hi, lo]: [ValueId; 2],
    b: ValueId,
    out: &TensorType,
) -> Result<(ValueId, ValueId), PassError> {
    let (ta, r) = (g.ty(hi).clone(), g.ty(hi).rank());
    let axis = match op {
        Op::MatMul { transpose_a: false, .. } => r - 2,
        Op::Conv(_) => 0,
        _ => {
            let chi = ins.add(g, op.clone(), vec![hi, b], "hi", out.clone());
            return Ok((chi, ins.add(g, op.clone(), vec![lo, b], "lo", out.clone())));
        }
    };
    let twice = |t: &TensorType, axis: usize| -> Result<TensorType, PassError> {
        let mut shape = t.shape.clone();
        shape[axis] = shape[axis]
            .try_mul(&sym::SymExpr::constant(2))
            .map_err(|e| PassError::Failed { pass: "integer-matmul-as-float", msg: e.to_string() })?;
        Ok(TensorType::new(t.dtype, shape))
    };
    let stacked = ins.add(g, Op::Concat { axis }, vec![hi, lo], "digits", twice(&ta, axis)?);
    let out_axis = if matches!(op, Op::Conv(_)) { 0 } else { out.rank() - 2 };
    let both = ins.add(g, op.clone(), vec![stacked, b], "digits.f32", twice(out, out_axis)?);
    let rows = out.shape[out_axis].clone();
    let half =
        |start: sym::SymExpr| Op::Slice { axes: vec![ir::SliceAxis { axis: out_axis, start, step: 1 }] };
    let chi = ins.add(g, half(sym::SymExpr::constant(0)), vec![both], "hi", out.clone());
    let clo = ins.add(g, half(rows), vec![both], "lo", out.clone());
    Ok((chi, clo))
}

/// Nodes inserted one after another before a node, named after its output.
pub(crate) struct Inserter {
    pub(crate) at: usize,
    pub(crate) hint: String,
}

impl Inserter {
    pub(crate) fn add(
        &mut self,
        g: &mut Graph,
        op: Op,
        inputs: Vec<ValueId>,
        name: &str,
        ty: TensorType,
    ) -> ValueId {
        let hint = format!("{}.{name}", self.hint);
        self.add_named(g, op, inputs, &hint, ty)
    }

    /// A node whose output is named `name` itself.
    pub(crate) fn add_named(
        &mut self,
        g: &mut Graph,
        op: Op,
        inputs: Vec<ValueId>,
        name: &str,
        ty: TensorType,
    ) -> ValueId {
        let v = g.insert_node(self.at, op, inputs, name, ty);
        self.at += 1;
        v
    }

    /// The one value of `x` broadcast to `ty`.
    pub(crate) fn splat(
        &mut self,
        g: &mut Graph,
        x: ir::Elems,
        ty: &TensorType,
        name: &str,
    ) -> Result<ValueId, PassError> {
        let t = ir::Tensor::new(vec![1; ty.rank()], x)
            .map_err(|e| PassError::Failed { pass: "integer-matmul-as-float", msg: e.to_string() })?;
        let data = Arc::new(ConstData::from_tensor(&t));
        let c = self.add(g, Op::Constant(data.clone()), vec![], name, data.ty());
        Ok(self.add(g, Op::Broadcast, vec![c], name, ty.clone()))
    }
}
