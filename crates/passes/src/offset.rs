//! A dequantized activation's zero point moved out of its product: a matmul
//! by a constant weight whose A is layout ops (views, padding, the taps of a
//! convolution) over `x - z`, with `x` holding 8-bit unsigned integers and
//! `z` one integral value (a statically quantized model's activation with a
//! zero point: its RGB stem, read through the convolution's zero padding),
//! becomes
//!
//! ```text
//! A(x - z)·W  →  A'(x)·W - z·colsum(W)
//! ```
//!
//! where `A'` is the same layout ops over `x`, each constant padding `c` now
//! padding with `c + z` (the padded value `c` of `A` is `(c + z) - z`). Its
//! operands are then 8-bit unsigned integers by an int8 weight: the u8s8
//! kernels' product, where the signed values `x - z` took the i16 family's.
//! Where `x` holds 8-bit signed integers instead (an int8 input: a
//! quantization's int8 codes are bytes by then, `SignedCodesAsBytes`),
//! `x - z` is `(x + 128) - (z + 128)`: `A'` is the layout ops over
//! `x + 128`, padding with `c + z + 128`, and `z + 128` is the zero point
//! moved out. Only where both products sum exactly in f32 (every partial sum
//! below 2^24, by the depth or by the weight's own columns), so that the
//! rewrite changes no value.

use std::collections::HashMap;

use ir::{BinaryOp, DType, Graph, Op, PadMode, ValueId};

use crate::integer::{constant_under_casts, value_range, zero_point_times_column_sums, Inserter, EXACT};
use crate::pattern::Producers;
use crate::{Pass, PassError};

pub struct MoveZeroPointOut;

impl Pass for MoveZeroPointOut {
    fn name(&self) -> &'static str {
        "move-zero-point-out"
    }
    fn run(&self, g: &mut Graph) -> Result<usize, PassError> {
        let mut done = 0;
        // What each operand became, for the products after it that read it too
        // (a layer's queries, keys and values, merged later).
        let mut stripped = HashMap::new();
        // One product at a time: a rewrite inserts nodes and shifts indices.
        // Each weight's range and column reach, scanned once (a weight's
        // millions of values) for all the products' rounds.
        let mut weights = HashMap::new();
        while let Some((at, z, shift)) = next(g, &mut weights) {
            rewrite(g, at, z, shift, &mut stripped)?;
            done += 1;
        }
        Ok(done)
    }
}

/// The first matmul to rewrite, its zero point (a one-element constant), and
/// what its values are shifted by to be unsigned (0, or 128 for signed ones).
fn next(g: &Graph, weights: &mut Weights) -> Option<(usize, ValueId, i64)> {
    let p = Producers::of(g);
    g.nodes.iter().enumerate().find_map(|(i, n)| {
        let Op::MatMul { transpose_a: false, transpose_b: false } = n.op else { return None };
        let (a, b) = (n.inputs[0], n.inputs[1]);
        if g.ty(n.output).dtype != DType::F32 || constant_under_casts(g, &p, b).is_none() {
            return None;
        }
        let mut z = None;
        let (lo, hi) = stripped_range(g, &p, a, &mut z, 0)?;
        let z = z?;
        let (wlo, whi) = weights.entry(b).or_insert_with(|| (value_range(g, b), None)).0?;
        let depth = g.ty(a).shape.last()?.as_const()?;
        let mw = wlo.abs().max(whi.abs());
        let ma = lo.abs().max(hi.abs());
        let exact = depth.checked_mul(ma.max(255)).and_then(|x| x.checked_mul(mw)).is_some_and(|x| x < EXACT);
        // Values `x - z` that are bytes already (int8 codes less a zero point of
        // -128) take the u8s8 family as they are.
        let zval = constant_value(g, &p, z)?;
        if lo - zval >= 0 && hi - zval <= 255 {
            return None;
        }
        let shift = match (lo, hi) {
            (0..=255, 0..=255) => 0,
            (-128..=127, -128..=127) => 128,
            _ => return None,
        };
        // Or by the weight's own columns: `x + shift` and `z + shift` are bytes.
        let bytes = (0..=255).contains(&(zval + shift));
        let exact = exact
            || bytes
                && weight_reach(g, &p, b, weights).is_some_and(|reach| reach.saturating_mul(255) < EXACT);
        exact.then_some((i, z, shift))
    })
}

/// A weight's range and its column reach (`None`: not yet scanned), by value.
type Weights = HashMap<ValueId, (Option<(i64, i64)>, Option<Option<i64>>)>;

/// [`column_reach`] of `w`, scanned once.
fn weight_reach(g: &Graph, p: &Producers, w: ValueId, weights: &mut Weights) -> Option<i64> {
    let entry = weights.entry(w).or_insert_with(|| (value_range(g, w), None));
    *entry.1.get_or_insert_with(|| column_reach(g, p, w))
}

/// The most a column of the constant weight `w` (`[.., K, N]`, integral)
/// can sum to, by magnitude, times operands in `0..=1`: the larger of its
/// positive and its negative weights' sums, the largest over the columns.
/// Times the operand's largest value (`x` and the zero point are bytes,
/// from 0), it bounds every partial sum of `x·W` and `z·colsum(W)` in any
/// order: a weight whose depth times its largest magnitude reaches past
/// 2^24 (BERT's 3072-deep products) mostly sums far below it.
fn column_reach(g: &Graph, p: &Producers, w: ValueId) -> Option<i64> {
    let data = constant_under_casts(g, p, w)?;
    let shape = &g.ty(w).shape;
    let n = shape.last()?.as_const()? as usize;
    let len = data.numel();
    if n == 0 || len % n != 0 {
        return None;
    }
    let bytes = data.bytes();
    let k = shape.get(shape.len().checked_sub(2)?)?.as_const()? as usize;
    if k == 0 || len % (k * n) != 0 {
        return None;
    }
    // Each column of each batch entry (`k` rows of `n`): positive and negative
    // sums, row by row; a value that is no integer (of a float weight) ends
    // the scan.
    let mut sums = vec![(0i64, 0i64); n];
    let mut reach = 0i64;
    let width = match data.ty().dtype {
        DType::F32 => 4,
        DType::I8 => 1,
        _ => return None,
    };
    for (r, row) in bytes.chunks_exact(width * n).enumerate() {
        for (s, w) in sums.iter_mut().zip(row.chunks_exact(width)) {
            let v = match width {
                4 => {
                    let x = f32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                    let v = x as i64;
                    if v as f32 != x || v.abs() > 255 {
                        return None;
                    }
                    v
                }
                _ => w[0] as i8 as i64,
            };
            if v > 0 {
                s.0 += v
            } else {
                s.1 -= v
            }
        }
        if (r + 1) % k == 0 {
            for s in sums.iter_mut() {
                reach = reach.max(s.0).max(s.1);
                *s = (0, 0);
            }
        }
    }
    Some(reach)
}

/// The range of the values `v` holds with the zero point added back (its
/// layout ops over `x - z`, `x`'s range and each padding's value plus `z`),
/// recording `z` (every `x - z` must subtract the same one); `None` when `v`
/// is anything else.
fn stripped_range(
    g: &Graph,
    p: &Producers,
    v: ValueId,
    z: &mut Option<ValueId>,
    depth: usize,
) -> Option<(i64, i64)> {
    if depth > 64 {
        return None;
    }
    let n = p.node(g, v)?;
    match &n.op {
        Op::Binary(BinaryOp::Sub) => {
            let zv = zero_point(g, p, n.inputs[1])?;
            let want = *z.get_or_insert(zv);
            if constant_value(g, p, want)? != constant_value(g, p, zv)? {
                return None;
            }
            value_range(g, n.inputs[0])
        }
        Op::Reshape | Op::Transpose { .. } | Op::Slice { .. } if n.inputs.len() == 1 => {
            stripped_range(g, p, n.inputs[0], z, depth + 1)
        }
        Op::Concat { .. } => {
            let mut r = (i64::MAX, i64::MIN);
            for &u in &n.inputs {
                let (lo, hi) = stripped_range(g, p, u, z, depth + 1)?;
                r = (r.0.min(lo), r.1.max(hi));
            }
            Some(r)
        }
        Op::Pad { mode: PadMode::Constant(c), .. } if c.fract() == 0.0 => {
            let (lo, hi) = stripped_range(g, p, n.inputs[0], z, depth + 1)?;
            let filled = *c as i64 + constant_value(g, p, (*z)?)?;
            Some((lo.min(filled), hi.max(filled)))
        }
        _ => None,
    }
}

/// The one-element integral f32 constant `v` broadcasts (through reshapes).
fn zero_point(g: &Graph, p: &Producers, v: ValueId) -> Option<ValueId> {
    let mut v = v;
    loop {
        let n = p.node(g, v)?;
        match n.op {
            Op::Constant(_) if g.ty(v).is_one_element() && g.ty(v).dtype == DType::F32 => {
                return constant_value(g, p, v).map(|_| v);
            }
            Op::Broadcast | Op::Reshape => v = n.inputs[0],
            _ => return None,
        }
    }
}

/// The integral value of the one-element f32 constant `v`.
fn constant_value(g: &Graph, p: &Producers, v: ValueId) -> Option<i64> {
    let Op::Constant(c) = &p.node(g, v)?.op else { return None };
    if c.ty().dtype != DType::F32 || c.numel() != 1 {
        return None;
    }
    let w = c.bytes().get(..4)?;
    let x = f32::from_le_bytes([w[0], w[1], w[2], w[3]]);
    (x.fract() == 0.0 && x.abs() < 256.0).then_some(x as i64)
}

/// Matmul `at` as `A'(x + shift)·W - (z + shift)·colsum(W)`.
fn rewrite(
    g: &mut Graph,
    at: usize,
    z: ValueId,
    shift: i64,
    stripped: &mut HashMap<ValueId, ValueId>,
) -> Result<(), PassError> {
    let node = g.nodes[at].clone();
    let (a, w) = (node.inputs[0], node.inputs[1]);
    let zval = {
        let p = Producers::of(g);
        constant_value(g, &p, z).ok_or_else(|| failed("a zero point that is no integer"))?
    };
    let mut ins = Inserter { at, hint: g.name(node.output).to_string() };
    let x = strip(g, &mut ins, a, (zval, shift), stripped, 0)?;
    let out = g.ty(node.output).clone();
    let product = ins.add(g, node.op.clone(), vec![x, w], "u8", out.clone());
    let z = match shift {
        0 => z,
        _ => {
            let one = g.ty(z).clone();
            ins.splat(g, ir::Elems::F32(vec![(zval + shift) as f32]), &one, "zp.u8")?
        }
    };
    let moved = zero_point_times_column_sums(g, &mut ins, z, w, &out)?;
    let old = &mut g.nodes[ins.at];
    old.op = Op::Binary(BinaryOp::Sub);
    old.inputs = vec![product, moved];
    Ok(())
}

/// `v` (layout ops over `x - z`) rebuilt over `x + shift`, each padding by
/// `c + z + shift`; each value once (`done`: a convolution's taps slice one
/// padded image many times).
fn strip(
    g: &mut Graph,
    ins: &mut Inserter,
    v: ValueId,
    (z, shift): (i64, i64),
    done: &mut HashMap<ValueId, ValueId>,
    depth: usize,
) -> Result<ValueId, PassError> {
    if let Some(&u) = done.get(&v) {
        return Ok(u);
    }
    let p = Producers::of(g);
    let n = p.node(g, v).ok_or_else(|| failed("an operand without its producer"))?.clone();
    if depth > 64 {
        return Err(failed("layout ops nested too deep"));
    }
    let ty = g.ty(v).clone();
    let name = format!("{}.u8", g.name(v));
    let u = match &n.op {
        Op::Binary(BinaryOp::Sub) if shift == 0 => Ok(n.inputs[0]),
        Op::Binary(BinaryOp::Sub) => {
            let k = ins.splat(g, ir::Elems::F32(vec![shift as f32]), &ty, "shift")?;
            Ok(ins.add_named(g, Op::Binary(BinaryOp::Add), vec![n.inputs[0], k], &name, ty))
        }
        Op::Pad { pads, mode: PadMode::Constant(c) } => {
            let x = strip(g, ins, n.inputs[0], (z, shift), done, depth + 1)?;
            let op = Op::Pad { pads: pads.clone(), mode: PadMode::Constant(c + (z + shift) as f64) };
            Ok(ins.add_named(g, op, vec![x], &name, ty))
        }
        op @ (Op::Reshape | Op::Transpose { .. } | Op::Slice { .. } | Op::Concat { .. }) => {
            let mut inputs = Vec::with_capacity(n.inputs.len());
            for &u in &n.inputs {
                inputs.push(strip(g, ins, u, (z, shift), done, depth + 1)?);
            }
            Ok(ins.add_named(g, op.clone(), inputs, &name, ty))
        }
        _ => Err(failed("an operand that is no layout of x - z")),
    }?;
    done.insert(v, u);
    Ok(u)
}

fn failed(msg: &str) -> PassError {
    PassError::Failed { pass: "move-zero-point-out", msg: msg.into() }
}
