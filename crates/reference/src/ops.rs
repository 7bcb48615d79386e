//! Element-wise and data-movement ops, and the dispatch over every op.
//!
//! Data movement is written as an index map (`out[i] = in[map[i]]`) followed by
//! [`take`], so it works on every dtype; arithmetic goes through the wide form
//! ([`wide!`]) so that it is written once for floats and once for integers.

use std::f64::consts::FRAC_2_SQRT_PI;

use ir::{BinaryOp, DType, Elems, Op, PadMode, SliceAxis, Tensor, UnaryOp};
use sym::SymExpr;

use crate::compute;
use crate::data::{guard, index_map, narrow, offset, strides, take, tensor, wide, widen, Scalar, Wide};
use crate::{Cx, Fail, R};

/// Evaluate `op` on `ins`. `dtype` and `out` are the node's output dtype and
/// evaluated shape: ops whose result they define (cast, iota, broadcast, reshape,
/// slice, conv-transpose, pool) use them; the others compute their own shape, and
/// the caller compares.
pub(crate) fn eval(op: &Op, ins: &[&Tensor], dtype: DType, out: &[usize], cx: &Cx) -> R<Tensor> {
    match op {
        Op::Constant(c) => Ok(c.to_tensor()),
        Op::SymConst(exprs) => sym_const(exprs, out, cx),
        Op::Iota { axis } => {
            if *axis >= out.len() {
                bail!("axis {axis} is out of range for rank {}", out.len());
            }
            let idx = index_map(out, |i| Ok(i[*axis] as i64))?;
            tensor(out.to_vec(), narrow(Wide::I(idx), dtype))
        }
        Op::Unary(u) => unary(*u, ins[0]),
        Op::Binary(b) => binary(*b, ins[0], ins[1]),
        Op::Select => select(ins[0], ins[1], ins[2]),
        Op::Cast => tensor(ins[0].shape().to_vec(), narrow(widen(ins[0]), dtype)),
        Op::Broadcast => broadcast(ins[0], out),
        Op::Reshape => {
            let x = ins[0];
            if guard(out)? != x.numel() {
                bail!("cannot reshape {:?} ({} elements) to {out:?}", x.shape(), x.numel());
            }
            tensor(out.to_vec(), x.elems().clone())
        }
        Op::Transpose { perm } => transpose(ins[0], perm),
        Op::Slice { axes } => slice(ins[0], axes, out, cx),
        Op::Concat { axis } => concat(ins, *axis),
        Op::Gather { axis } => gather(ins[0], ins[1], *axis),
        Op::Pad { pads, mode } => pad(ins[0], pads, *mode, cx),
        Op::Reduce { op, axes, keep_dims } => compute::reduce(ins[0], *op, axes, *keep_dims),
        Op::MatMul { transpose_a, transpose_b } => {
            // A transposed operand is read through an explicit transposed copy: clear, not fast.
            let view = |x: &Tensor, swap: bool| -> R<Option<Tensor>> {
                let r = x.shape().len();
                if !swap || r < 2 {
                    return Ok(None);
                }
                let mut perm: Vec<usize> = (0..r).collect();
                perm.swap(r - 2, r - 1);
                transpose(x, &perm).map(Some)
            };
            let (a, b) = (view(ins[0], *transpose_a)?, view(ins[1], *transpose_b)?);
            compute::matmul(a.as_ref().unwrap_or(ins[0]), b.as_ref().unwrap_or(ins[1]))
        }
        Op::Conv(a) => compute::conv(ins[0], ins[1], a),
        Op::ConvTranspose(a) => compute::conv_transpose(ins[0], ins[1], a, out),
        Op::Pool(p) if p.channels_last => channels_last_pool(ins[0], p, out),
        Op::Pool(p) => compute::pool(ins[0], p, out),
        Op::CumSum { axis, exclusive, reverse } => compute::cumsum(ins[0], *axis, *exclusive, *reverse),
    }
}

/// Symbolic dims as an i64 vector, or a scalar when the output has rank 0.
fn sym_const(exprs: &[SymExpr], out: &[usize], cx: &Cx) -> R<Tensor> {
    let vals = exprs.iter().map(|e| cx.eval(e)).collect::<R<Vec<i64>>>()?;
    let shape = if out.is_empty() {
        if vals.len() != 1 {
            bail!("a scalar output needs exactly one expression, got {}", vals.len());
        }
        vec![]
    } else {
        vec![vals.len()]
    };
    tensor(shape, Elems::I64(vals))
}

// ---------------------------------------------------------------- element-wise

fn unary(op: UnaryOp, x: &Tensor) -> R<Tensor> {
    let dt = x.dtype();
    let elems = match (op, x.elems()) {
        (UnaryOp::Not, Elems::Bool(v)) => Elems::Bool(v.iter().map(|b| !b).collect()),
        (UnaryOp::IsNaN | UnaryOp::IsInf, _) if dt.is_float() => {
            let test = if op == UnaryOp::IsNaN { f64::is_nan } else { f64::is_infinite };
            Elems::Bool(x.to_f64_vec().into_iter().map(test).collect())
        }
        (UnaryOp::Not, _) if dt.is_float() => return Err(Fail::Unsupported(dt)),
        (UnaryOp::IsNaN | UnaryOp::IsInf, _) | (_, Elems::Bool(_)) => return Err(Fail::Unsupported(dt)),
        _ => {
            let unsupported = || Fail::Unsupported(dt);
            let w = wide!(dt, S, [v = x], {
                v.into_iter().map(|e| S::unary(op, e).ok_or_else(unsupported)).collect::<R<_>>()?
            });
            narrow(w, dt)
        }
    };
    tensor(x.shape().to_vec(), elems)
}

fn binary(op: BinaryOp, a: &Tensor, b: &Tensor) -> R<Tensor> {
    if a.shape() != b.shape() {
        bail!("operand shapes differ: {:?} and {:?} (broadcasts must be explicit)", a.shape(), b.shape());
    }
    let dt = a.dtype();
    // Pow's exponent may have another dtype: cast it to the base's first.
    let cast;
    let b = if op == BinaryOp::Pow && b.dtype() != dt {
        cast = tensor(b.shape().to_vec(), narrow(widen(b), dt))?;
        &cast
    } else {
        b
    };
    if b.dtype() != dt {
        bail!("operand dtypes differ: {dt} and {}", b.dtype());
    }
    let elems = if op.is_logical() && dt == DType::Bool {
        let (Elems::Bool(x), Elems::Bool(y)) = (a.elems(), b.elems()) else {
            return Err(Fail::Unsupported(dt));
        };
        let f: fn(bool, bool) -> bool = match op {
            BinaryOp::And => |p, q| p && q,
            BinaryOp::Or => |p, q| p || q,
            _ => |p, q| p != q,
        };
        Elems::Bool(x.iter().zip(y).map(|(p, q)| f(*p, *q)).collect())
    } else if op.is_comparison() {
        Elems::Bool(match (widen(a), widen(b)) {
            (Wide::F(x), Wide::F(y)) => compare(op, x, y),
            (Wide::I(x), Wide::I(y)) => compare(op, x, y),
            _ => bail!("operand dtypes differ"),
        })
    } else if dt == DType::Bool {
        return Err(Fail::Unsupported(dt));
    } else {
        let w = wide!(dt, S, [x = a, y = b], {
            x.into_iter().zip(y).map(|(p, q)| S::binary(op, p, q).map_err(Fail::Msg)).collect::<R<_>>()?
        });
        narrow(w, dt)
    };
    tensor(a.shape().to_vec(), elems)
}

/// Comparisons; any comparison with NaN is false.
fn compare<S: PartialOrd>(op: BinaryOp, x: Vec<S>, y: Vec<S>) -> Vec<bool> {
    let f: fn(&S, &S) -> bool = match op {
        BinaryOp::Equal => |p, q| p == q,
        BinaryOp::Less => |p, q| p < q,
        BinaryOp::Greater => |p, q| p > q,
        BinaryOp::LessEq => |p, q| p <= q,
        _ => |p, q| p >= q,
    };
    x.iter().zip(&y).map(|(p, q)| f(p, q)).collect()
}

fn select(c: &Tensor, a: &Tensor, b: &Tensor) -> R<Tensor> {
    let Elems::Bool(cond) = c.elems() else { bail!("the condition must be bool, got {}", c.dtype()) };
    if c.shape() != a.shape() || a.shape() != b.shape() {
        bail!("operand shapes differ: {:?}, {:?} and {:?}", c.shape(), a.shape(), b.shape());
    }
    // Index into the concatenation [a, b].
    let n = a.numel();
    let map: Vec<usize> = cond.iter().enumerate().map(|(i, &c)| if c { i } else { n + i }).collect();
    tensor(a.shape().to_vec(), take(&[a.elems(), b.elems()], &map)?)
}

/// erf from the series `erf(x) = 2/√π · e^(-x²) · Σ 2ⁿ x^(2n+1) / (1·3·…·(2n+1))`:
/// all its terms have the sign of `x`, so nothing cancels and the sum is accurate
/// to a few ulps for every `|x| < 6`; beyond that, erf is ±1 in f64.
pub(crate) fn erf(x: f64) -> f64 {
    if x.is_nan() || x.abs() >= 6.0 {
        return if x.is_nan() { x } else { x.signum() };
    }
    let x2 = x * x;
    let (mut term, mut sum, mut n) = (x, x, 0.0);
    while term.abs() > sum.abs() * 1e-17 {
        term *= 2.0 * x2 / (2.0 * n + 3.0);
        sum += term;
        n += 1.0;
    }
    (FRAC_2_SQRT_PI * (-x2).exp() * sum).clamp(-1.0, 1.0)
}

// ---------------------------------------------------------------- data movement

fn broadcast(x: &Tensor, out: &[usize]) -> R<Tensor> {
    let s = x.shape();
    if s.len() != out.len() || s.iter().zip(out).any(|(d, o)| *d != 1 && d != o) {
        bail!("cannot broadcast {s:?} to {out:?} (each dim must be 1 or equal)");
    }
    let st = strides(s);
    let map = index_map(out, |i| Ok((0..s.len()).map(|d| if s[d] == 1 { 0 } else { i[d] * st[d] }).sum()))?;
    tensor(out.to_vec(), take(&[x.elems()], &map)?)
}

/// A channels-last pool as the standard's: its input moved channels-first,
/// pooled, and the result moved back.
fn channels_last_pool(x: &Tensor, p: &ir::PoolAttrs, out: &[usize]) -> R<Tensor> {
    let r = x.shape().len();
    if r < 3 || out.len() != r {
        bail!("a channels-last pool of {:?} to {out:?} needs rank >= 3 on both", x.shape());
    }
    // [n, c, spatial…] from [n, spatial…, c], and back.
    let to_first: Vec<usize> = [0, r - 1].into_iter().chain(1..r - 1).collect();
    let to_last: Vec<usize> = [0].into_iter().chain(2..r).chain([1]).collect();
    let out_first: Vec<usize> = to_first.iter().map(|&d| out[d]).collect();
    let first = ir::PoolAttrs { channels_last: false, ..p.clone() };
    transpose(&compute::pool(&transpose(x, &to_first)?, &first, &out_first)?, &to_last)
}

fn transpose(x: &Tensor, perm: &[usize]) -> R<Tensor> {
    let s = x.shape();
    let mut sorted = perm.to_vec();
    sorted.sort_unstable();
    if sorted != (0..s.len()).collect::<Vec<_>>() {
        bail!("{perm:?} is not a permutation of rank {}", s.len());
    }
    let st = strides(s);
    let out: Vec<usize> = perm.iter().map(|p| s[*p]).collect();
    let map = index_map(&out, |i| Ok(perm.iter().zip(i).map(|(p, i)| i * st[*p]).sum()))?;
    tensor(out, take(&[x.elems()], &map)?)
}

fn slice(x: &Tensor, axes: &[SliceAxis], out: &[usize], cx: &Cx) -> R<Tensor> {
    let s = x.shape();
    if out.len() != s.len() {
        bail!("output rank {} differs from input rank {}", out.len(), s.len());
    }
    // (start, step) per axis; axes not listed are taken whole.
    let mut geo: Vec<Option<(i64, i64)>> = vec![None; s.len()];
    for a in axes {
        if a.axis >= s.len() || geo[a.axis].is_some() {
            bail!("axis {} is out of range for rank {} or listed twice", a.axis, s.len());
        }
        if a.step == 0 {
            bail!("step 0 on axis {}", a.axis);
        }
        geo[a.axis] = Some((cx.eval(&a.start)?, a.step));
    }
    for (d, g) in geo.iter().enumerate() {
        if g.is_none() && out[d] != s[d] {
            bail!("axis {d} is not sliced, but its extent changes from {} to {}", s[d], out[d]);
        }
    }
    let st = strides(s);
    let map = index_map(out, |i| {
        let mut off = 0;
        for (d, g) in geo.iter().enumerate() {
            let (start, step) = g.unwrap_or((0, 1));
            let p = (i[d] as i64).checked_mul(step).and_then(|v| v.checked_add(start));
            match p {
                Some(p) if p >= 0 && (p as usize) < s[d] => off += p as usize * st[d],
                _ => bail!(
                    "output index {} of axis {d} reads {start} + {}*{step}, outside the input extent {}",
                    i[d],
                    i[d],
                    s[d]
                ),
            }
        }
        Ok(off)
    })?;
    tensor(out.to_vec(), take(&[x.elems()], &map)?)
}

fn concat(ins: &[&Tensor], axis: usize) -> R<Tensor> {
    let Some(first) = ins.first() else { bail!("needs at least one input") };
    let s0 = first.shape();
    if axis >= s0.len() {
        bail!("axis {axis} is out of range for rank {}", s0.len());
    }
    let mut out = s0.to_vec();
    out[axis] = 0;
    for t in ins {
        let s = t.shape();
        if s.len() != s0.len() || (0..s.len()).any(|d| d != axis && s[d] != s0[d]) {
            bail!("inputs {s0:?} and {s:?} differ off axis {axis}");
        }
        out[axis] += s[axis];
    }
    // Offsets into the concatenation of all inputs.
    let bases: Vec<usize> =
        ins.iter().scan(0, |acc, t| Some(std::mem::replace(acc, *acc + t.numel()))).collect();
    let all_strides: Vec<Vec<usize>> = ins.iter().map(|t| strides(t.shape())).collect();
    let map = index_map(&out, |i| {
        let mut p = i[axis];
        for (k, t) in ins.iter().enumerate() {
            let n = t.shape()[axis];
            if p < n {
                let mut j = i.to_vec();
                j[axis] = p;
                return Ok(bases[k] + offset(&j, &all_strides[k]));
            }
            p -= n;
        }
        bail!("internal: concat index out of range")
    })?;
    let srcs: Vec<&Elems> = ins.iter().map(|t| t.elems()).collect();
    tensor(out, take(&srcs, &map)?)
}

fn gather(data: &Tensor, indices: &Tensor, axis: usize) -> R<Tensor> {
    let (ds, is) = (data.shape(), indices.shape());
    if axis >= ds.len() {
        bail!("axis {axis} is out of range for rank {}", ds.len());
    }
    let ind = match indices.dtype() {
        DType::I32 | DType::I64 => indices.to_i64_vec().unwrap_or_default(),
        other => bail!("indices must be i32 or i64, got {other}"),
    };
    let out: Vec<usize> = ds[..axis].iter().chain(is).chain(&ds[axis + 1..]).copied().collect();
    let (dst, ist, q, n) = (strides(ds), strides(is), is.len(), ds[axis] as i64);
    let map = index_map(&out, |i| {
        let k = ind[offset(&i[axis..axis + q], &ist)];
        let j = if k < 0 { k + n } else { k };
        if !(0..n).contains(&j) {
            bail!("index {k} is out of range for axis {axis} of extent {n}");
        }
        let src: Vec<usize> = i[..axis].iter().chain(&[j as usize]).chain(&i[axis + q..]).copied().collect();
        Ok(offset(&src, &dst))
    })?;
    tensor(out, take(&[data.elems()], &map)?)
}

fn pad(x: &Tensor, pads: &[(SymExpr, SymExpr)], mode: PadMode, cx: &Cx) -> R<Tensor> {
    let s = x.shape();
    if pads.len() != s.len() {
        bail!("{} pads for rank {}", pads.len(), s.len());
    }
    let pads = pads.iter().map(|(b, e)| Ok((cx.eval(b)?, cx.eval(e)?))).collect::<R<Vec<_>>>()?;
    let mut out = Vec::with_capacity(s.len());
    for (d, &(b, e)) in pads.iter().enumerate() {
        match (s[d] as i64).checked_add(b).and_then(|v| v.checked_add(e)) {
            Some(n) if n >= 0 => out.push(n as usize),
            _ => bail!("pads ({b}, {e}) crop more than the extent {} of axis {d}", s[d]),
        }
        if s[d] == 0 && out[d] > 0 && !matches!(mode, PadMode::Constant(_)) {
            bail!("cannot {mode:?}-pad the empty axis {d}");
        }
    }
    // The input coordinate read for output coordinate `o` on axis `d` (None: fill).
    // In i128, so that no pad value can overflow it.
    let source = |d: usize, o: usize| -> Option<usize> {
        let (i, n) = (o as i128 - pads[d].0 as i128, s[d] as i128);
        if (0..n).contains(&i) {
            return Some(i as usize);
        }
        match mode {
            PadMode::Constant(_) => None,
            PadMode::Edge => Some(i.clamp(0, n - 1) as usize),
            // Periodic continuation (ONNX "wrap").
            PadMode::Wrap => Some(i.rem_euclid(n) as usize),
            // Mirror without repeating the edge, periodically (as numpy's "reflect").
            PadMode::Reflect if n == 1 => Some(0),
            PadMode::Reflect => {
                let period = 2 * (n - 1);
                let m = i.rem_euclid(period);
                Some(if m >= n { period - m } else { m } as usize)
            }
        }
    };
    let (st, fill_index) = (strides(s), x.numel());
    let map = index_map(&out, |i| {
        let mut off = 0;
        for d in 0..s.len() {
            match source(d, i[d]) {
                Some(j) => off += j * st[d],
                None => return Ok(fill_index),
            }
        }
        Ok(off)
    })?;
    let fill = narrow(Wide::F(if let PadMode::Constant(v) = mode { vec![v] } else { vec![] }), x.dtype());
    tensor(out, take(&[x.elems(), &fill], &map)?)
}

#[cfg(test)]
mod tests {
    use super::erf;

    #[test]
    fn erf_matches_reference_values() {
        // Values from Python's `math.erf`.
        let cases = [
            (0.01, 0.011283415555849616),
            (0.3, 0.3286267594591274),
            (0.9, 0.7969082124228322),
            (1.5, 0.9661051464753108),
            (2.5, 0.999593047982555),
            (3.5, 0.9999992569016276),
            (4.0, 0.9999999845827421),
            (5.5, 0.9999999999999927),
            (5.9, 0.9999999999999999),
            (5.99, 1.0),
            (1e-10, 1.1283791670955126e-10),
            (0.1, 0.1124629160182849),
            (0.5, 0.5204998778130465),
            (1.0, 0.8427007929497149),
            (2.0, 0.9953222650189527),
            (3.0, 0.9999779095030014),
            (4.5, 0.9999999998033839),
            (5.0, 0.9999999999984626),
            (7.0, 1.0),
        ];
        for (x, want) in cases {
            for (x, want) in [(x, want), (-x, -want)] {
                let got = erf(x);
                assert!(((got - want) / want).abs() < 1e-14, "erf({x}) = {got}, want {want}");
            }
        }
        assert_eq!(erf(0.0), 0.0);
        assert!(erf(f64::NAN).is_nan());
        assert_eq!(erf(f64::INFINITY), 1.0);
    }
}
