//! A statically quantized model's int8 activations held as bytes.
//!
//! `quantize_static`'s default activations are int8: `q = cast<i8>(clamp(a,
//! lo, hi))` (`a` the rounded, offset i32 value), read back by `cast<f32>(q)
//! - z`. Where every reader of `q` is such a cast, `q` becomes its bytes
//! `q + 128`:
//!
//! ```text
//! cast<i8>(clamp(a, lo, hi))      →  cast<u8>(clamp(a, lo, hi) + 128)
//! cast<f32>(q) - z                →  cast<f32>(q') - (z + 128)
//! cast<f32>(q), read otherwise    →  cast<f32>(q') - 128
//! ```
//!
//! exact in i32 and f32 (integers below 2^8, the shift after the clamps),
//! so every value the model computes is unchanged. The codes are then what
//! a uint8 model's are: the operands of u8·s8 products, stored as bytes by
//! the epilogue of the product they quantize, read as bytes by the residual
//! sum after it (where the int8 codes were stored as the product's f32
//! output and quantized by the sum's program); the lowering reads the
//! shifted clamps as one quantization (`plan::Exprs::stored_integer`).

use std::collections::HashMap;

use ir::{BinaryOp, DType, Elems, Graph, Op, TensorType, ValueId};

use crate::integer::Inserter;
use crate::pattern::{uniform, Producers};
use crate::{Pass, PassError};

pub struct SignedCodesAsBytes;

impl Pass for SignedCodesAsBytes {
    fn name(&self) -> &'static str {
        "signed-codes-as-bytes"
    }
    fn run(&self, g: &mut Graph) -> Result<usize, PassError> {
        // Every quantization found at once (a rewrite makes none, and keeps
        // the others' values), each rewritten where it is now: a rewrite
        // inserts nodes and shifts indices.
        let found = quantizations(g);
        for (q, casts) in &found {
            let at =
                g.nodes.iter().position(|n| n.output == *q).ok_or_else(|| failed("a lost quantization"))?;
            rewrite(g, at, casts)?;
        }
        Ok(found.len())
    }
}

/// The int8 quantizations to rewrite and the casts to f32 that read each
/// (all of its readers).
fn quantizations(g: &Graph) -> Vec<(ValueId, Vec<ValueId>)> {
    let p = Producers::of(g);
    let mut readers: HashMap<ValueId, Vec<usize>> = HashMap::new();
    for (i, n) in g.nodes.iter().enumerate() {
        for u in &n.inputs {
            readers.entry(*u).or_default().push(i);
        }
    }
    let found = g.nodes.iter().filter_map(|n| {
        let q = n.output;
        if !matches!(n.op, Op::Cast) || g.ty(q).dtype != DType::I8 || g.outputs.contains(&q) {
            return None;
        }
        if g.ty(n.inputs[0]).dtype != DType::I32 {
            return None;
        }
        let (lo, hi) = clamped(g, &p, n.inputs[0])?;
        if lo < i64::from(i8::MIN) || hi > i64::from(i8::MAX) {
            return None;
        }
        let casts: Vec<ValueId> = readers.get(&q)?.iter().map(|r| g.nodes[*r].output).collect();
        let dequantized = |f: &ValueId| {
            let node = p.node(g, *f);
            node.is_some_and(|m| matches!(m.op, Op::Cast)) && g.ty(*f).dtype == DType::F32
        };
        casts.iter().all(dequantized).then_some((q, casts))
    });
    found.collect()
}

/// The bounds the clamps of `v` (`min` and `max` by constants, outermost
/// first) hold it to; `None` where `v` is no clamp on both sides.
fn clamped(g: &Graph, p: &Producers, v: ValueId) -> Option<(i64, i64)> {
    let mut clamps = Vec::new();
    let mut v = v;
    while let Some((op, k, rest)) = clamp(g, p, v) {
        clamps.push((op, k));
        v = rest;
    }
    let (mut lo, mut hi) = (i64::MIN, i64::MAX);
    for (op, k) in clamps.into_iter().rev() {
        (lo, hi) = match op {
            BinaryOp::Max => (lo.max(k), hi.max(k)),
            _ => (lo.min(k), hi.min(k)),
        };
    }
    (lo > i64::MIN && hi < i64::MAX).then_some((lo, hi))
}

/// `v` as `max(rest, k)` or `min(rest, k)` (either side) by an integral
/// constant `k`.
fn clamp(g: &Graph, p: &Producers, v: ValueId) -> Option<(BinaryOp, i64, ValueId)> {
    let n = p.node(g, v)?;
    let op = match n.op {
        Op::Binary(op @ (BinaryOp::Max | BinaryOp::Min)) => op,
        _ => return None,
    };
    match (integer(g, p, n.inputs[0]), integer(g, p, n.inputs[1])) {
        (_, Some(k)) => Some((op, k, n.inputs[0])),
        (Some(k), None) => Some((op, k, n.inputs[1])),
        _ => None,
    }
}

/// The one integral value the constant `v` holds (through broadcasts).
fn integer(g: &Graph, p: &Producers, v: ValueId) -> Option<i64> {
    let x = uniform(g, p, v)?;
    (x.fract() == 0.0 && x.abs() < 1e9).then_some(x as i64)
}

/// Quantization `at` as its bytes, and each of `casts` reading them.
fn rewrite(g: &mut Graph, at: usize, casts: &[ValueId]) -> Result<(), PassError> {
    let node = g.nodes[at].clone();
    let mut ins = Inserter { at, hint: g.name(node.output).to_string() };
    let m = node.inputs[0];
    let k = ins.splat(g, Elems::I32(vec![128]), &g.ty(m).clone(), "shift")?;
    let shifted = ins.add(g, Op::Binary(BinaryOp::Add), vec![m, k], "u8", g.ty(m).clone());
    let bytes_ty = TensorType { dtype: DType::U8, ..g.ty(node.output).clone() };
    let name = format!("{}.u8", g.name(node.output));
    let bytes = ins.add_named(g, Op::Cast, vec![shifted], &name, bytes_ty);
    for &f in casts {
        let p = Producers::of(g);
        let at = p.index(g, f).ok_or_else(|| failed("a cast without its producer"))?;
        let mut ins = Inserter { at, hint: g.name(f).to_string() };
        let ty = g.ty(f).clone();
        let name = format!("{}.u8", g.name(f));
        let codes = ins.add_named(g, Op::Cast, vec![bytes], &name, ty.clone());
        // The dequantizations `f - z`: `codes - (z + 128)`.
        let subs: Vec<ValueId> = g
            .nodes
            .iter()
            .filter(|n| matches!(n.op, Op::Binary(BinaryOp::Sub)) && n.inputs[0] == f && n.inputs[1] != f)
            .map(|n| n.output)
            .collect();
        for s in subs {
            let p = Producers::of(g);
            let r = p.index(g, s).ok_or_else(|| failed("a subtraction without its producer"))?;
            let z = g.nodes[r].inputs[1];
            let Some(zv) = uniform(g, &p, z).filter(|z| z.fract() == 0.0 && z.abs() < 256.0) else {
                continue;
            };
            let zty = g.ty(z).clone();
            let moved = ins.splat(g, Elems::F32(vec![(zv + 128.0) as f32]), &zty, "zp.u8")?;
            let r =
                Producers::of(g).index(g, s).ok_or_else(|| failed("a subtraction without its producer"))?;
            g.nodes[r].inputs = vec![codes, moved];
        }
        // Any other reader: `codes - 128`, where the cast was.
        let k = ins.splat(g, Elems::F32(vec![128.0]), &ty, "shift")?;
        let old = &mut g.nodes[ins.at];
        old.op = Op::Binary(BinaryOp::Sub);
        old.inputs = vec![codes, k];
    }
    Ok(())
}

fn failed(msg: &str) -> PassError {
    PassError::Failed { pass: "signed-codes-as-bytes", msg: msg.into() }
}

/// A quantization of a dequantization with the same scale and zero point is
/// the codes themselves: `quantize_static` puts a quantize-dequantize pair
/// after each of attention's reshapes and transposes, so a head's codes are
/// dequantized and quantized again three times over. Where `q` (bytes) is
/// dequantized, `(cast<f32>(q) - z)·s`, viewed (reshapes, transposes) and
/// quantized by the same `s` and `z`, the quantization is the same views of
/// `q`: exact, as `n = q - z` is within ±255 and `(n·s)/s` in f32 is within
/// 255·2^-23 of `n` (a normal `s`), so it rounds to `n`, and `n + z` is `q`,
/// inside the clamps.
pub struct QuantizedRoundTrip;

impl Pass for QuantizedRoundTrip {
    fn name(&self) -> &'static str {
        "quantized-round-trip"
    }
    fn run(&self, g: &mut Graph) -> Result<usize, PassError> {
        let mut done = 0;
        while let Some((at, q, views)) = round_trip(g) {
            let out = g.nodes[at].output;
            let mut ins = Inserter { at, hint: g.name(out).to_string() };
            let mut v = q;
            for view in views.iter().rev() {
                let n = g.nodes[*view].clone();
                let ty = TensorType { dtype: DType::U8, ..g.ty(n.output).clone() };
                v = ins.add(g, n.op.clone(), vec![v], "codes", ty);
            }
            g.replace_uses(out, v);
            done += 1;
        }
        Ok(done)
    }
}

/// The first byte quantization of a dequantization by the same scale and
/// zero point: its node, the codes, and the view nodes between (nearest the
/// quantization first).
fn round_trip(g: &Graph) -> Option<(usize, ValueId, Vec<usize>)> {
    let p = Producers::of(g);
    let uses = g.use_counts();
    g.nodes.iter().enumerate().find_map(|(i, n)| {
        if !matches!(n.op, Op::Cast) || g.ty(n.output).dtype != DType::U8 || uses[n.output.index()] == 0 {
            return None;
        }
        let (y, scale, zero) = byte_quantization(g, &p, n.inputs[0])?;
        // Through the views to the dequantization.
        let (mut v, mut views) = (y, Vec::new());
        while let Some(m) = p.node(g, v).filter(|m| matches!(m.op, Op::Reshape | Op::Transpose { .. })) {
            views.push(p.index(g, v)?);
            v = m.inputs[0];
        }
        let (q, s, z) = dequantization(g, &p, v)?;
        let normal = scale.is_normal() && scale > 0.0 && (scale * 255.0).is_finite();
        (normal && s.to_bits() == scale.to_bits() && z == zero && q != n.output).then_some((i, q, views))
    })
}

/// `t` (i32) as a quantization to bytes, `clamp(cast<i32>(round(y / s)) + z0,
/// lo, hi) + shift` with `lo + shift = 0` and `hi + shift = 255`: `y`, `s`
/// and the byte's zero point `z0 + shift`.
fn byte_quantization(g: &Graph, p: &Producers, t: ValueId) -> Option<(ValueId, f32, i64)> {
    let (clamps, shift) = plus_constant(g, p, t).unwrap_or((t, 0));
    let (lo, hi) = clamped(g, p, clamps)?;
    if (lo + shift, hi + shift) != (0, 255) {
        return None;
    }
    let mut v = clamps;
    while let Some((_, _, rest)) = clamp(g, p, v) {
        v = rest;
    }
    let (rounded, z0) = match p.node(g, v)?.op {
        Op::Binary(BinaryOp::Add) => plus_constant(g, p, v)?,
        _ => (v, 0),
    };
    let cast =
        p.node(g, rounded).filter(|c| matches!(c.op, Op::Cast) && g.ty(rounded).dtype == DType::I32)?;
    let round = p.node(g, cast.inputs[0]).filter(|r| matches!(r.op, Op::Unary(ir::UnaryOp::Round)))?;
    let div = p.node(g, round.inputs[0]).filter(|d| matches!(d.op, Op::Binary(BinaryOp::Div)))?;
    let s = uniform(g, p, div.inputs[1])?;
    (g.ty(div.inputs[0]).dtype == DType::F32).then_some((div.inputs[0], s as f32, z0 + shift))
}

/// `v` as `x + k` (either side) with `k` an integral constant: `x` and `k`.
fn plus_constant(g: &Graph, p: &Producers, v: ValueId) -> Option<(ValueId, i64)> {
    let n = p.node(g, v).filter(|n| matches!(n.op, Op::Binary(BinaryOp::Add)))?;
    match (integer(g, p, n.inputs[0]), integer(g, p, n.inputs[1])) {
        (None, Some(k)) => Some((n.inputs[0], k)),
        (Some(k), None) => Some((n.inputs[1], k)),
        _ => None,
    }
}

/// `v` as a dequantization of bytes, `(cast<f32>(q) - z)·s` (or `cast<f32>(q)·s`):
/// `q`, `s` and `z`.
fn dequantization(g: &Graph, p: &Producers, v: ValueId) -> Option<(ValueId, f32, i64)> {
    let n = p.node(g, v).filter(|n| matches!(n.op, Op::Binary(BinaryOp::Mul)))?;
    let (x, s) = match (uniform(g, p, n.inputs[0]), uniform(g, p, n.inputs[1])) {
        (None, Some(s)) => (n.inputs[0], s),
        (Some(s), None) => (n.inputs[1], s),
        _ => return None,
    };
    let m = p.node(g, x)?;
    let (f, z) = match m.op {
        Op::Binary(BinaryOp::Sub) => {
            let z = uniform(g, p, m.inputs[1]).filter(|z| z.fract() == 0.0 && z.abs() <= 255.0)?;
            (m.inputs[0], z as i64)
        }
        _ => (x, 0),
    };
    let cast = p.node(g, f).filter(|c| matches!(c.op, Op::Cast))?;
    let q = cast.inputs[0];
    (g.ty(q).dtype == DType::U8 && g.ty(f).dtype == DType::F32).then_some((q, s as f32, z))
}
