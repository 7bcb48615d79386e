//! Reductions, contractions, convolutions, pooling and cumulative sums, each a
//! direct loop over its definition, generic over the wide scalar type.

use ir::{BinaryOp, ConvAttrs, DType, PoolAttrs, PoolKind, ReduceOp, Tensor};

use crate::data::{for_each_index, guard, index_map, narrow, offset, strides, tensor, wide, Scalar};
use crate::{Fail, R};

/// Bool has no arithmetic (only max/min reductions, which are or/and).
fn numeric(t: &Tensor) -> R<DType> {
    match t.dtype() {
        DType::Bool => Err(Fail::Unsupported(DType::Bool)),
        dt => Ok(dt),
    }
}

fn same_dtype(a: &Tensor, b: &Tensor) -> R<DType> {
    if a.dtype() != b.dtype() {
        bail!("operand dtypes differ: {} and {}", a.dtype(), b.dtype());
    }
    numeric(a)
}

pub(crate) fn reduce(x: &Tensor, op: ReduceOp, axes: &[usize], keep_dims: bool) -> R<Tensor> {
    let (s, dt) = (x.shape(), x.dtype());
    if axes.iter().enumerate().any(|(i, a)| *a >= s.len() || axes[..i].contains(a)) {
        bail!("axes {axes:?} are out of range for rank {} or repeated", s.len());
    }
    if dt == DType::Bool && !matches!(op, ReduceOp::Max | ReduceOp::Min) {
        return Err(Fail::Unsupported(dt));
    }
    let reduced = |d: usize| axes.contains(&d);
    // The output in keep-dims form, and how many inputs fold into each output.
    let kept: Vec<usize> = (0..s.len()).map(|d| if reduced(d) { 1 } else { s[d] }).collect();
    let count: usize = (0..s.len()).filter(|d| reduced(*d)).map(|d| s[d]).product();
    let kst = strides(&kept);

    let w = wide!(dt, S, [v = x], {
        let init = match op {
            ReduceOp::Sum | ReduceOp::Mean => S::ZERO,
            ReduceOp::Prod => S::ONE,
            // Empty reductions give the identity: -inf / +inf for floats, the
            // dtype's bounds for integers (ONNX).
            ReduceOp::Max => S::lowest(dt),
            ReduceOp::Min => S::highest(dt),
        };
        let mut acc = vec![init; guard(&kept)?];
        let mut flat = 0;
        for_each_index(s, |i| {
            let o: usize = (0..s.len()).filter(|d| !reduced(*d)).map(|d| i[d] * kst[d]).sum();
            let (a, e) = (acc[o], v[flat]);
            acc[o] = match op {
                ReduceOp::Sum | ReduceOp::Mean => a.add(e),
                ReduceOp::Prod => a.mul(e),
                ReduceOp::Max => a.max_nan(e),
                ReduceOp::Min => a.min_nan(e),
            };
            flat += 1;
            Ok(())
        })?;
        if op == ReduceOp::Mean {
            // Floats: 0/0 = NaN for an empty mean; integers: truncating division.
            for a in &mut acc {
                *a = S::binary(BinaryOp::Div, *a, S::from_count(count)).map_err(Fail::Msg)?;
            }
        }
        acc
    });
    let out = if keep_dims { kept } else { (0..s.len()).filter(|d| !reduced(*d)).map(|d| s[d]).collect() };
    tensor(out, narrow(w, dt))
}

/// `c[b, i, j] = Σ_p a[b, i, p] · b[b, p, j]` over flattened batch dims.
pub(crate) fn matmul(a: &Tensor, b: &Tensor) -> R<Tensor> {
    let dt = same_dtype(a, b)?;
    let (sa, sb) = (a.shape(), b.shape());
    let r = sa.len();
    if r < 2 || sb.len() != r || sa[..r - 2] != sb[..r - 2] || sa[r - 1] != sb[r - 2] {
        bail!(
            "cannot multiply {sa:?} by {sb:?} (equal ranks >= 2, equal batch dims, [.., m, k] x [.., k, n])"
        );
    }
    let (m, k, n) = (sa[r - 2], sa[r - 1], sb[r - 1]);
    let batch = guard(&sa[..r - 2])?;
    let mut out = sa[..r - 1].to_vec();
    out.push(n);
    guard(&out)?;
    guard(&sa[..r - 1])?;
    fn go<S: Scalar>(a: &[S], b: &[S], batch: usize, m: usize, k: usize, n: usize) -> Vec<S> {
        let mut c = Vec::with_capacity(batch * m * n);
        for t in 0..batch {
            for i in 0..m {
                for j in 0..n {
                    let terms = (0..k).map(|p| a[(t * m + i) * k + p].mul(b[(t * k + p) * n + j]));
                    c.push(terms.fold(S::ZERO, S::add));
                }
            }
        }
        c
    }
    let w = wide!(dt, S, [x = a, y = b], go::<S>(&x, &y, batch, m, k, n));
    tensor(out, narrow(w, dt))
}

/// Checks the per-spatial-dim attributes of `x[n, c, *s]`; returns the spatial rank.
fn spatial_rank(x: &[usize], lens: &[&[i64]], positive: &[&[i64]]) -> R<usize> {
    let sp = x.len().saturating_sub(2);
    if sp == 0 {
        bail!("input {x:?} needs rank >= 3");
    }
    if lens.iter().any(|v| v.len() != sp) {
        bail!("geometry attributes {lens:?} do not all have {sp} entries");
    }
    if positive.iter().any(|v| v.iter().any(|e| *e < 1)) {
        bail!("strides, dilations and kernel extents must be >= 1");
    }
    Ok(sp)
}

/// The input coordinate that output position `o`, kernel tap `k` reads along one
/// spatial dim: `o·stride + k·dilation − pad_begin` (may lie in the padding).
/// In i128, so that no attribute value can overflow it.
fn tap(o: usize, k: usize, stride: i64, dilation: i64, pad: i64) -> i128 {
    o as i128 * stride as i128 + k as i128 * dilation as i128 - pad as i128
}

/// `y[n, m, o] = Σ_{c, k} x[n, g·C/G + c, o·s + k·d − pb] · w[m, c, k]` with
/// `g = m / (M/G)`; reads in the padding are zero.
pub(crate) fn conv(x: &Tensor, w: &Tensor, a: &ConvAttrs) -> R<Tensor> {
    let dt = same_dtype(x, w)?;
    let (xs, ws) = (x.shape(), w.shape());
    let lens = [&a.strides[..], &a.dilations, &a.pads_begin, &a.pads_end];
    let sp = spatial_rank(xs, &lens, &[&a.strides, &a.dilations, &[a.group]])?;
    let g = a.group as usize;
    if ws.len() != xs.len() || ws[1].checked_mul(g) != Some(xs[1]) || ws[0] % g != 0 {
        bail!("weight {ws:?} does not fit input {xs:?} with group {g}");
    }
    let mut out = vec![xs[0], ws[0]];
    for d in 0..sp {
        // (padded extent − dilated kernel extent) / stride + 1, as `ir::infer` has it.
        let padded = xs[2 + d] as i128 + a.pads_begin[d] as i128 + a.pads_end[d] as i128;
        let dilated = a.dilations[d] as i128 * (ws[2 + d] as i128 - 1) + 1;
        let ext = (padded - dilated).div_euclid(a.strides[d] as i128) + 1;
        let Ok(ext) = usize::try_from(ext) else {
            bail!("spatial dim {d}: the padded input is smaller than the dilated kernel");
        };
        out.push(ext);
    }
    let (xst, wst) = (strides(xs), strides(ws));
    let (cg, mg) = (ws[1], ws[0] / g);
    let w = wide!(dt, S, [x = x, w = w], {
        index_map(&out, |o| {
            let (n, m) = (o[0], o[1]);
            let mut acc = S::ZERO;
            for c in 0..cg {
                for_each_index(&ws[2..], |k| {
                    let mut xoff = n * xst[0] + ((m / mg) * cg + c) * xst[1];
                    for d in 0..sp {
                        let p = tap(o[2 + d], k[d], a.strides[d], a.dilations[d], a.pads_begin[d]);
                        if p < 0 || p >= xs[2 + d] as i128 {
                            return Ok(());
                        }
                        xoff += p as usize * xst[2 + d];
                    }
                    let woff = m * wst[0] + c * wst[1] + offset(k, &wst[2..]);
                    acc = acc.add(x[xoff].mul(w[woff]));
                    Ok(())
                })?;
            }
            Ok(acc)
        })?
    });
    tensor(out, narrow(w, dt))
}

/// The adjoint of [`conv`] (ONNX ConvTranspose): every input element scatters
/// `y[n, g·M/G + m, i·s + k·d − pb] += x[n, c, i] · w[c, m, k]` with
/// `g = c / (C/G)`; the output extent comes from the node's type.
pub(crate) fn conv_transpose(x: &Tensor, w: &Tensor, a: &ConvAttrs, out: &[usize]) -> R<Tensor> {
    let dt = same_dtype(x, w)?;
    let (xs, ws) = (x.shape(), w.shape());
    let lens = [&a.strides[..], &a.dilations, &a.pads_begin, &a.pads_end];
    let sp = spatial_rank(xs, &lens, &[&a.strides, &a.dilations, &[a.group]])?;
    let g = a.group as usize;
    if ws.len() != xs.len() || ws[0] != xs[1] || xs[1] % g != 0 {
        bail!("weight {ws:?} does not fit input {xs:?} with group {g}");
    }
    if out.len() != xs.len() || out[0] != xs[0] || Some(out[1]) != ws[1].checked_mul(g) {
        bail!("output {out:?} does not fit input {xs:?} and weight {ws:?} with group {g}");
    }
    let (xst, wst, ost) = (strides(xs), strides(ws), strides(out));
    let (cg, mg) = (xs[1] / g, ws[1]);
    let w = wide!(dt, S, [x = x, w = w], {
        let mut y = vec![S::ZERO; guard(out)?];
        for_each_index(xs, |i| {
            let (n, c) = (i[0], i[1]);
            let xv = x[offset(i, &xst)];
            for m in 0..mg {
                for_each_index(&ws[2..], |k| {
                    let mut yoff = n * ost[0] + ((c / cg) * mg + m) * ost[1];
                    for d in 0..sp {
                        let p = tap(i[2 + d], k[d], a.strides[d], a.dilations[d], a.pads_begin[d]);
                        if p < 0 || p >= out[2 + d] as i128 {
                            return Ok(());
                        }
                        yoff += p as usize * ost[2 + d];
                    }
                    let woff = c * wst[0] + m * wst[1] + offset(k, &wst[2..]);
                    y[yoff] = y[yoff].add(xv.mul(w[woff]));
                    Ok(())
                })?;
            }
            Ok(())
        })?;
        y
    });
    tensor(out.to_vec(), narrow(w, dt))
}

/// Max or average pooling; the output extent comes from the node's type.
///
/// Padding never contributes a value. An average divides by the number of window
/// positions inside the input, or with `count_include_pad` by those inside the
/// input and its explicit padding: not the positions past the end that ceil mode
/// adds (ONNX's reference since onnx 1.18, and ONNX Runtime 1.31; onnx 1.17's
/// test data divided by the whole kernel). A window that reads no input element
/// is an error.
pub(crate) fn pool(x: &Tensor, p: &PoolAttrs, out: &[usize]) -> R<Tensor> {
    let (xs, dt) = (x.shape(), numeric(x)?);
    let lens = [&p.kernel[..], &p.strides, &p.dilations, &p.pads_begin, &p.pads_end];
    let sp = spatial_rank(xs, &lens, &[&p.kernel, &p.strides, &p.dilations])?;
    if out.len() != xs.len() || out[..2] != xs[..2] {
        bail!("output {out:?} does not fit input {xs:?}");
    }
    let include_pad = match p.kind {
        PoolKind::Max => false,
        PoolKind::Avg { .. } if !dt.is_float() => return Err(Fail::Unsupported(dt)),
        PoolKind::Avg { count_include_pad } => count_include_pad,
    };
    let kernel: Vec<usize> = p.kernel.iter().map(|k| *k as usize).collect();
    let xst = strides(xs);
    let w = wide!(dt, S, [x = x], {
        index_map(out, |o| {
            let mut acc = if p.kind == PoolKind::Max { S::lowest(dt) } else { S::ZERO };
            let (mut real, mut taps) = (0usize, 0usize);
            for_each_index(&kernel, |k| {
                let (mut off, mut in_input, mut in_padded) = (o[0] * xst[0] + o[1] * xst[1], true, true);
                for d in 0..sp {
                    let q = tap(o[2 + d], k[d], p.strides[d], p.dilations[d], p.pads_begin[d]);
                    let n = xs[2 + d] as i128;
                    in_input &= 0 <= q && q < n;
                    in_padded &= -(p.pads_begin[d] as i128) <= q && q < n + p.pads_end[d] as i128;
                    off += if in_input { q as usize * xst[2 + d] } else { 0 };
                }
                taps += usize::from(in_padded);
                if in_input {
                    real += 1;
                    acc = if p.kind == PoolKind::Max { acc.max_nan(x[off]) } else { acc.add(x[off]) };
                }
                Ok(())
            })?;
            if real == 0 {
                bail!("the pooling window of output {o:?} reads no input element");
            }
            match p.kind {
                PoolKind::Max => Ok(acc),
                PoolKind::Avg { .. } => {
                    let count = S::from_count(if include_pad { taps } else { real });
                    S::binary(BinaryOp::Div, acc, count).map_err(Fail::Msg)
                }
            }
        })?
    });
    tensor(out.to_vec(), narrow(w, dt))
}

/// Running sums along `axis`; `exclusive` leaves out the current element,
/// `reverse` sums from the end.
pub(crate) fn cumsum(x: &Tensor, axis: usize, exclusive: bool, reverse: bool) -> R<Tensor> {
    let (s, dt) = (x.shape(), numeric(x)?);
    if axis >= s.len() {
        bail!("axis {axis} is out of range for rank {}", s.len());
    }
    let (st, n) = (strides(s), s[axis]);
    let mut lines = s.to_vec();
    lines[axis] = 1;
    let w = wide!(dt, S, [v = x], {
        let mut y = vec![S::ZERO; v.len()];
        for_each_index(&lines, |i| {
            let mut acc = S::ZERO;
            for t in 0..n {
                let off = offset(i, &st) + if reverse { n - 1 - t } else { t } * st[axis];
                let next = acc.add(v[off]);
                y[off] = if exclusive { acc } else { next };
                acc = next;
            }
            Ok(())
        })?;
        y
    });
    tensor(s.to_vec(), narrow(w, dt))
}
