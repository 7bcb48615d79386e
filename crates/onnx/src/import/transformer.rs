//! The transformer operators of opset 23 (`RMSNormalization`,
//! `RotaryEmbedding`, `Attention`), split into primitives as the compound ops
//! before them are (TSCompiler's compound-op splitting): fusion puts them back
//! together as kernels. The formulas follow the ONNX reference implementation
//! (`onnx.reference.ops`), including its edge cases: a fully masked attention
//! row gives zeros, not NaN.

use ir::{BinaryOp as B, DType, Op, ReduceOp, SliceAxis, TensorType, UnaryOp as U, ValueId};
use sym::SymExpr;

use super::indexing::{dim_scalar, iota};
use super::ops::{div_exact, matmul, pad_with_value};
use super::{norm_axis, Importer, Node, R};

/// `x` sliced along `axis` from `start` with `step`, `len` elements.
fn slice(imp: &mut Importer, x: ValueId, axis: usize, start: i64, step: i64, len: SymExpr) -> R<ValueId> {
    let mut shape = imp.shape(x);
    shape[axis] = len;
    let ty = TensorType::new(imp.ty(x).dtype, shape);
    let axes = vec![SliceAxis { axis, start: SymExpr::constant(start), step }];
    imp.emit(Op::Slice { axes }, vec![x], Some(ty))
}

/// `xs` joined along `axis` (the output type is inferred).
fn concat(imp: &mut Importer, xs: Vec<ValueId>, axis: usize) -> R<ValueId> {
    imp.emit(Op::Concat { axis }, xs, None)
}

/// A constant dim of `x`, for the operators that need one (head sizes).
fn const_dim(imp: &Importer, x: ValueId, axis: usize, what: &str) -> R<i64> {
    imp.shape(x)[axis]
        .as_const()
        .ok_or_else(|| format!("{what} must be a constant, got {}", imp.shape(x)[axis]))
}

/// `RMSNormalization`: `x / sqrt(mean(x², axes from axis) + ε) · scale`,
/// computed in f32 (`stash_type` 1, the only one ONNX defines) and returned in
/// `x`'s dtype.
pub(crate) fn rms_norm(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let (x, scale) = (n.input(0)?, n.input(1)?);
    let r = imp.rank(x);
    let axes: Vec<usize> = (norm_axis(n.int("axis", -1), r)?..r).collect();
    let eps = n.float("epsilon", 1e-5) as f64;
    if n.int("stash_type", 1) != 1 {
        return Err(format!("stash_type {} is not supported (only 1, float)", n.int("stash_type", 1)));
    }
    let dt = imp.ty(x).dtype;
    if !dt.is_float() {
        return Err(format!("RMSNormalization of {dt}"));
    }
    let xs = imp.cast(x, DType::F32)?;
    let sq = imp.binary(B::Mul, xs, xs)?;
    let ms = imp.reduce(ReduceOp::Mean, sq, axes, true)?;
    let ms = imp.binary_scalar(B::Add, ms, eps)?;
    let rms = imp.unary(U::Sqrt, ms)?;
    let inv = imp.unary(U::Reciprocal, rms)?;
    let y = imp.binary(B::Mul, xs, inv)?;
    let w = imp.cast(scale, DType::F32)?;
    let y = imp.binary(B::Mul, y, w)?;
    imp.cast(y, dt)
}

/// `RotaryEmbedding`: the first `rotary_embedding_dim` values of every head
/// rotated in pairs (halves, or adjacent values when `interleaved`) by the
/// angles whose cosines and sines the caches hold, at `position_ids` when given.
pub(crate) fn rotary_embedding(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let (x, mut cos, mut sin) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let interleaved = n.int("interleaved", 0) != 0;
    let rank = imp.rank(x);
    let orig = imp.shape(x);
    // [batch, seq, heads, head_size]
    let x4 = match rank {
        4 => imp.transpose(x, vec![0, 2, 1, 3])?,
        3 => {
            let heads = n.int("num_heads", 0);
            if heads <= 0 {
                return Err("a 3-D input needs num_heads".into());
            }
            let h = SymExpr::constant(heads);
            let size = div_exact(imp, &orig[2], &h)
                .ok_or_else(|| format!("hidden size {} is not a multiple of {heads} heads", orig[2]))?;
            imp.reshape(x, vec![orig[0].clone(), orig[1].clone(), h, size])?
        }
        r => return Err(format!("input of rank {r} (3 or 4 expected)")),
    };
    let s = imp.shape(x4);
    let head = const_dim(imp, x4, 3, "the head size")?;
    let rd = match n.int("rotary_embedding_dim", 0) {
        0 => head,
        d if d > 0 && d <= head && d % 2 == 0 => d,
        d => return Err(format!("rotary_embedding_dim {d} for heads of {head}")),
    };
    let half = rd / 2;
    let k = SymExpr::constant;
    if let Some(pos) = n.opt_input(3) {
        // The caches are [max_position, rd/2], read at the positions ([batch, seq]).
        for c in [&mut cos, &mut sin] {
            let cs = imp.shape(*c);
            if cs.len() != 2 {
                return Err(format!("a cache of rank {} with position_ids (2 expected)", cs.len()));
            }
            let mut shape = imp.shape(pos);
            shape.push(cs[1].clone());
            let ty = TensorType::new(imp.ty(*c).dtype, shape);
            *c = imp.emit(Op::Gather { axis: 0 }, vec![*c, pos], Some(ty))?;
        }
    }
    for c in [&mut cos, &mut sin] {
        let cs = imp.shape(*c);
        if cs.len() != 3 || cs[2].as_const() != Some(half) {
            return Err(format!(
                "a cos/sin cache of shape [{}] for rotary_embedding_dim {rd}",
                sym_list(&cs)
            ));
        }
        *c = imp.reshape(*c, vec![cs[0].clone(), cs[1].clone(), k(1), k(half)])?;
    }
    let xr = if rd < head { slice(imp, x4, 3, 0, 1, k(rd))? } else { x4 };
    let (x1, x2) = if interleaved {
        (slice(imp, xr, 3, 0, 2, k(half))?, slice(imp, xr, 3, 1, 2, k(half))?)
    } else {
        (slice(imp, xr, 3, 0, 1, k(half))?, slice(imp, xr, 3, half, 1, k(half))?)
    };
    let (c1, s2) = (imp.binary(B::Mul, cos, x1)?, imp.binary(B::Mul, sin, x2)?);
    let real = imp.binary(B::Sub, c1, s2)?;
    let (s1, c2) = (imp.binary(B::Mul, sin, x1)?, imp.binary(B::Mul, cos, x2)?);
    let imag = imp.binary(B::Add, s1, c2)?;
    let rotated = if interleaved {
        let pair = |imp: &mut Importer, v: ValueId| {
            let mut shape = imp.shape(v);
            shape.push(k(1));
            imp.reshape(v, shape)
        };
        let (re, im) = (pair(imp, real)?, pair(imp, imag)?);
        let both = concat(imp, vec![re, im], 4)?;
        imp.reshape(both, vec![s[0].clone(), s[1].clone(), s[2].clone(), k(rd)])?
    } else {
        concat(imp, vec![real, imag], 3)?
    };
    let out = if rd < head {
        let rest = slice(imp, x4, 3, rd, 1, k(head - rd))?;
        concat(imp, vec![rotated, rest], 3)?
    } else {
        rotated
    };
    match rank {
        3 => imp.reshape(out, orig),
        _ => imp.transpose(out, vec![0, 2, 1, 3]),
    }
}

fn sym_list(s: &[SymExpr]) -> String {
    s.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
}

/// `[batch, seq, heads·size]` as `[batch, heads, seq, size]`.
fn split_heads(imp: &mut Importer, x: ValueId, heads: i64) -> R<ValueId> {
    let s = imp.shape(x);
    let h = SymExpr::constant(heads);
    let size = div_exact(imp, &s[2], &h)
        .ok_or_else(|| format!("hidden size {} is not a multiple of {heads} heads", s[2]))?;
    let x = imp.reshape(x, vec![s[0].clone(), s[1].clone(), h, size])?;
    imp.transpose(x, vec![0, 2, 1, 3])
}

/// Each of `x`'s heads (`[batch, heads, seq, size]`) `r` times in a row.
fn repeat_heads(imp: &mut Importer, x: ValueId, r: i64) -> R<ValueId> {
    let s = imp.shape(x);
    let k = SymExpr::constant;
    let one = imp.reshape(x, vec![s[0].clone(), s[1].clone(), k(1), s[2].clone(), s[3].clone()])?;
    let wide = imp.expand_to(one, &[s[0].clone(), s[1].clone(), k(r), s[2].clone(), s[3].clone()])?;
    let heads = s[1].try_scale(r).map_err(|e| e.to_string())?;
    imp.reshape(wide, vec![s[0].clone(), heads, s[2].clone(), s[3].clone()])
}

/// `0` where `allowed`, `-inf` elsewhere, in `dt`.
fn bias_of(imp: &mut Importer, allowed: ValueId, dt: DType) -> R<ValueId> {
    let (zero, ninf) = (imp.scalar(dt, 0.0)?, imp.scalar(dt, f64::NEG_INFINITY)?);
    imp.select(allowed, zero, ninf)
}

/// `Attention` (opsets 23-25): scaled dot-product attention over 3-D
/// (`[batch, seq, heads·size]`, with `q_num_heads`/`kv_num_heads`) or 4-D
/// (`[batch, heads, seq, size]`) inputs, with an additive or boolean mask, a
/// causal mask aligned to the end of the keys, a sliding window, a KV cache
/// (`past_key`/`past_value`, joined with the new keys: the `present` outputs;
/// or an external one whose valid keys per batch entry `nonpad_kv_seqlen` gives),
/// grouped-query heads, a softcap and the four `qk_matmul_output` modes.
pub(crate) fn attention(imp: &mut Importer, n: &Node) -> R<Vec<ValueId>> {
    let (q, k, v) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let (mask, past_k, past_v) = (n.opt_input(3), n.opt_input(4), n.opt_input(5));
    // An external (static) cache: the keys valid per batch entry.
    let nonpad = n.opt_input(6);
    if past_k.is_some() != past_v.is_some() {
        return Err("past_key and past_value must be given together".into());
    }
    if nonpad.is_some() && past_k.is_some() {
        return Err("nonpad_kv_seqlen cannot be combined with past_key and past_value".into());
    }
    let rank = imp.rank(q);
    if imp.rank(k) != rank || imp.rank(v) != rank || !(rank == 3 || rank == 4) {
        return Err(format!(
            "Q, K and V of ranks {}, {}, {} (all 3 or all 4 expected)",
            rank,
            imp.rank(k),
            imp.rank(v)
        ));
    }
    let dt = imp.ty(q).dtype;
    if !dt.is_float() {
        return Err(format!("Attention of {dt}"));
    }
    let (q, k, v) = if rank == 3 {
        let (qh, kh) = (n.int("q_num_heads", 0), n.int("kv_num_heads", 0));
        if qh <= 0 || kh <= 0 {
            return Err("3-D inputs need q_num_heads and kv_num_heads".into());
        }
        (split_heads(imp, q, qh)?, split_heads(imp, k, kh)?, split_heads(imp, v, kh)?)
    } else {
        (q, k, v)
    };
    // The cache grows by the new keys and values: the present outputs.
    let (k, v) = match (past_k, past_v) {
        (Some(pk), Some(pv)) => (concat(imp, vec![pk, k], 2)?, concat(imp, vec![pv, v], 2)?),
        _ => (k, v),
    };
    let (present_k, present_v) = (k, v);
    let (qs, ks) = (imp.shape(q), imp.shape(k));
    let (sq, skv) = (qs[2].clone(), ks[2].clone());
    let head = const_dim(imp, q, 3, "the head size")?;
    let scale = match n.float("scale", f32::NAN) {
        s if s.is_nan() => 1.0 / (head as f64).sqrt(),
        s => s as f64,
    };
    // Q and K each scaled by √scale (as the reference does).
    let root = scale.sqrt() as f32 as f64;
    // Where keys may be attended: the mask (padded with "no" past its end) and
    // the causal and window limits, as one additive bias.
    let mut bias = None;
    if let Some(m) = mask {
        let ms = imp.shape(m);
        let last = ms.last().cloned().ok_or("a mask of rank 0")?;
        let m = if imp.env().equal(&last, &skv) {
            m
        } else {
            let more = skv.try_sub(&last).map_err(|e| e.to_string())?;
            let mut pads = vec![(SymExpr::constant(0), SymExpr::constant(0)); ms.len()];
            pads[ms.len() - 1].1 = more;
            let fill = if imp.ty(m).dtype == DType::Bool { 0.0 } else { f64::NEG_INFINITY };
            let c = imp.scalar(imp.ty(m).dtype, fill)?;
            pad_with_value(imp, m, pads, c)?
        };
        bias = Some(match imp.ty(m).dtype {
            DType::Bool => bias_of(imp, m, dt)?,
            t if t == dt => m,
            t => return Err(format!("a mask of {t} for inputs of {dt}")),
        });
    }
    let (left, right) = (n.int("left_window_size", -1), n.int("right_window_size", -1));
    let causal = n.int("is_causal", 0) != 0;
    // Per batch entry `[batch, 1, 1, 1]`, the valid keys of an external cache.
    let valid = match nonpad {
        Some(np) => {
            let np = imp.cast(np, DType::I64)?;
            let b = imp.shape(np).first().cloned().ok_or("a nonpad_kv_seqlen of rank 0")?;
            let one = SymExpr::constant(1);
            Some(imp.reshape(np, vec![b, one.clone(), one.clone(), one])?)
        }
        None => None,
    };
    if causal || left >= 0 || right >= 0 {
        // Query i (at position i + offset) against key j: the offset is the past's
        // length, or per batch entry the valid keys before the queries.
        let grid = [sq.clone(), skv.clone()];
        let (i, j) = (iota(imp, &grid, 0)?, iota(imp, &grid, 1)?);
        let offset = match (past_k, valid) {
            (Some(pk), _) => {
                let past = imp.shape(pk)[2].clone();
                dim_scalar(imp, &past)?
            }
            (None, Some(vk)) => {
                let q = dim_scalar(imp, &sq)?;
                imp.binary(B::Sub, vk, q)?
            }
            (None, None) => dim_scalar(imp, &SymExpr::constant(0))?,
        };
        let at = imp.binary(B::Add, i, offset)?;
        let diff = imp.binary(B::Sub, at, j)?;
        let mut allowed = None;
        let mut limit = |imp: &mut Importer, c: ValueId| -> R<()> {
            allowed = Some(match allowed {
                Some(a) => imp.binary(B::And, a, c)?,
                None => c,
            });
            Ok(())
        };
        if causal {
            let c = imp.binary(B::LessEq, j, at)?;
            limit(imp, c)?;
        }
        if left >= 0 {
            let l = imp.scalar(DType::I64, left as f64)?;
            let c = imp.binary(B::LessEq, diff, l)?;
            limit(imp, c)?;
        }
        if right >= 0 {
            let r = imp.scalar(DType::I64, -right as f64)?;
            let c = imp.binary(B::GreaterEq, diff, r)?;
            limit(imp, c)?;
        }
        let allowed = allowed.ok_or("no limit")?;
        let b = bias_of(imp, allowed, dt)?;
        bias = Some(match bias {
            Some(m) => imp.binary(B::Add, m, b)?,
            None => b,
        });
    }
    if let Some(vk) = valid {
        // Keys past an entry's valid ones are padding.
        let j = iota(imp, std::slice::from_ref(&skv), 0)?;
        let inside = imp.binary(B::Less, j, vk)?;
        let b = bias_of(imp, inside, dt)?;
        bias = Some(match bias {
            Some(m) => imp.binary(B::Add, m, b)?,
            None => b,
        });
    }
    // Grouped-query attention: each key/value head serves `q_heads / kv_heads`
    // query heads in a row.
    let (qh, kh) = (const_dim(imp, q, 1, "the query heads")?, const_dim(imp, k, 1, "the key heads")?);
    let (k, v) = if qh != kh {
        if kh <= 0 || qh % kh != 0 {
            return Err(format!("{qh} query heads cannot share {kh} key/value heads"));
        }
        (repeat_heads(imp, k, qh / kh)?, repeat_heads(imp, v, qh / kh)?)
    } else {
        (k, v)
    };
    let qsc = imp.binary_scalar(B::Mul, q, root)?;
    let ksc = imp.binary_scalar(B::Mul, k, root)?;
    let kt = imp.transpose(ksc, vec![0, 1, 3, 2])?;
    let mut scores = matmul(imp, qsc, kt)?;
    let softcap = n.float("softcap", 0.0) as f64;
    if softcap > 0.0 {
        let t = imp.binary_scalar(B::Div, scores, softcap)?;
        let t = imp.unary(U::Tanh, t)?;
        scores = imp.binary_scalar(B::Mul, t, softcap)?;
    }
    let mode = n.int("qk_matmul_output_mode", 0);
    if !(0..=3).contains(&mode) {
        return Err(format!("qk_matmul_output_mode {mode}"));
    }
    let mut qk_out = scores;
    let with_bias = match bias {
        Some(b) => imp.binary(B::Add, scores, b)?,
        None => scores,
    };
    if mode == 2 {
        qk_out = with_bias;
    }
    let x = match n.int("softmax_precision", 0) {
        0 => with_bias,
        1 => imp.cast(with_bias, DType::F32)?,
        10 => imp.cast(with_bias, DType::F16)?,
        11 => imp.cast(with_bias, DType::F64)?,
        p => return Err(format!("softmax_precision {p} is not supported")),
    };
    let last = imp.rank(x) - 1;
    let p = safe_softmax(imp, x, last)?;
    // A row whose every key is masked gives zeros (decided on the bias, not on
    // the scores, which may be NaN there).
    let p = match bias {
        Some(b) => {
            let bmax = imp.reduce(ReduceOp::Max, b, vec![imp.rank(b) - 1], true)?;
            let ninf = imp.scalar(imp.ty(b).dtype, f64::NEG_INFINITY)?;
            let none = imp.binary(B::Equal, bmax, ninf)?;
            let zero = imp.scalar(imp.ty(p).dtype, 0.0)?;
            imp.select(none, zero, p)?
        }
        None => p,
    };
    if mode == 3 {
        qk_out = p;
    }
    let p = imp.cast(p, dt)?;
    let mut y = matmul(imp, p, v)?;
    if rank == 3 {
        let t = imp.transpose(y, vec![0, 2, 1, 3])?;
        let s = imp.shape(t);
        let width = s[2].try_mul(&s[3]).map_err(|e| e.to_string())?;
        y = imp.reshape(t, vec![s[0].clone(), s[1].clone(), width])?;
    }
    let qk_out = imp.cast(qk_out, dt)?;
    let all = [y, present_k, present_v, qk_out];
    Ok(all[..n.n_outputs().clamp(1, 4)].to_vec())
}

/// Softmax along `axis` that gives zeros, not NaN, for a row of `-inf`.
fn safe_softmax(imp: &mut Importer, x: ValueId, axis: usize) -> R<ValueId> {
    let dt = imp.ty(x).dtype;
    let m = imp.reduce(ReduceOp::Max, x, vec![axis], true)?;
    let ninf = imp.scalar(dt, f64::NEG_INFINITY)?;
    let none = imp.binary(B::Equal, m, ninf)?;
    let zero = imp.scalar(dt, 0.0)?;
    let m = imp.select(none, zero, m)?;
    let d = imp.binary(B::Sub, x, m)?;
    let e = imp.unary(U::Exp, d)?;
    let s = imp.reduce(ReduceOp::Sum, e, vec![axis], true)?;
    let is_zero = imp.binary(B::Equal, s, zero)?;
    let one = imp.scalar(dt, 1.0)?;
    let s = imp.select(is_zero, one, s)?;
    imp.binary(B::Div, e, s)
}
