//! ONNX `Resize` written with the primitives, one resized axis at a time (the
//! interpolation is separable): every output position's source coordinate is
//! computed from an `Iota` (in f64, as ONNX's reference computes it), then the
//! taps are `Gather`s along the axis at edge-clamped indices, weighted and
//! summed. Nearest takes one tap, linear two, cubic four. Works for symbolic
//! extents as well as static ones.

use ir::{BinaryOp as B, DType, Op, UnaryOp as U, ValueId};
use sym::SymExpr;

use super::indexing::{dim_scalar, iota};
use super::{Importer, Node, R};

/// A rank-0 f64 value of the symbolic dim `e`.
fn dim_f64(imp: &mut Importer, e: &SymExpr) -> R<ValueId> {
    let i = dim_scalar(imp, e)?;
    imp.cast(i, DType::F64)
}

/// How an axis is resized.
struct Axis {
    axis: usize,
    out: SymExpr,
    /// The scale (rank-0 f64), and its value when known at compile time.
    scale: ValueId,
    known: Option<f64>,
    /// tf_crop_and_resize's region on this axis.
    roi: (f64, f64),
}

pub(crate) fn resize(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let x = n.input(0)?;
    let shape = imp.shape(x);
    let r = shape.len();
    let mode = n.string("mode").unwrap_or_else(|| "nearest".into());
    let ctm = n.string("coordinate_transformation_mode").unwrap_or_else(|| "half_pixel".into());
    let nearest = n.string("nearest_mode").unwrap_or_else(|| "round_prefer_floor".into());
    let antialias = n.int("antialias", 0) != 0;
    if antialias && mode == "nearest" {
        return Err("Resize with antialias in nearest mode is not defined".into());
    }
    if !["nearest", "linear", "cubic"].contains(&mode.as_str()) {
        return Err(format!("Resize mode '{mode}' is not supported"));
    }
    let modes = [
        "half_pixel",
        "half_pixel_symmetric",
        "pytorch_half_pixel",
        "align_corners",
        "asymmetric",
        "tf_crop_and_resize",
    ];
    if !modes.contains(&ctm.as_str()) {
        return Err(format!("coordinate_transformation_mode '{ctm}' is not supported"));
    }
    if !["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"].contains(&nearest.as_str()) {
        return Err(format!("nearest_mode '{nearest}' is not supported"));
    }
    let axes: Vec<usize> = match n.ints("axes") {
        Some(a) => a.iter().map(|&a| super::norm_axis(a, r)).collect::<R<_>>()?,
        None => (0..r).collect(),
    };
    // Inputs 1-3 (roi, scales, sizes) are optional; an empty tensor counts as absent.
    let present =
        |i: usize| n.opt_input(i).filter(|v| imp.ty(*v).numel().ok().and_then(|e| e.as_const()) != Some(0));
    let roi = match present(1).filter(|_| ctm == "tf_crop_and_resize") {
        Some(v) => imp.const_f64(v).ok_or("Resize's roi must be a constant")?,
        None => [vec![0.0; axes.len()], vec![1.0; axes.len()]].concat(),
    };
    if roi.len() != 2 * axes.len() {
        return Err(format!("roi of {} values for {} axes", roi.len(), axes.len()));
    }
    let mut plan = Vec::with_capacity(axes.len());
    if let Some(s) = present(2) {
        let scales = imp.const_f64(s).ok_or("Resize's scales must be a constant")?;
        if scales.len() != axes.len() {
            return Err(format!("{} scales for {} axes", scales.len(), axes.len()));
        }
        for (i, (&a, &s)) in axes.iter().zip(&scales).enumerate() {
            if !(s > 0.0 && s.is_finite()) {
                return Err(format!("scale {s} on axis {a}"));
            }
            let out = scaled_extent(&shape[a], s, a)?;
            let scale = imp.scalar(DType::F64, s)?;
            plan.push(Axis { axis: a, out, scale, known: Some(s), roi: (roi[i], roi[axes.len() + i]) });
        }
    } else if let Some(sz) = present(3) {
        let sizes = imp.known_ints(sz, "Resize's sizes")?;
        if sizes.len() != axes.len() {
            return Err(format!("{} sizes for {} axes", sizes.len(), axes.len()));
        }
        let policy = n.string("keep_aspect_ratio_policy").unwrap_or_else(|| "stretch".into());
        let sizes = match policy.as_str() {
            "stretch" => sizes,
            "not_larger" | "not_smaller" => {
                // One scale for every axis, the extents rounded half up (static extents).
                let ratios: Vec<f64> = axes
                    .iter()
                    .zip(&sizes)
                    .map(|(&a, s)| match (s.as_const(), shape[a].as_const()) {
                        (Some(o), Some(i)) => Ok(o as f64 / i as f64),
                        _ => Err(format!("keep_aspect_ratio_policy '{policy}' needs static extents")),
                    })
                    .collect::<R<_>>()?;
                let pick = if policy == "not_larger" { f64::min } else { f64::max };
                let s = ratios.iter().copied().reduce(pick).unwrap_or(1.0);
                axes.iter()
                    .map(|&a| SymExpr::constant((s * shape[a].as_const().unwrap_or(0) as f64 + 0.5) as i64))
                    .collect()
            }
            other => return Err(format!("keep_aspect_ratio_policy '{other}' is not supported")),
        };
        for (i, (&a, out)) in axes.iter().zip(&sizes).enumerate() {
            let (o, l) = (dim_f64(imp, out)?, dim_f64(imp, &shape[a])?);
            let scale = imp.binary(B::Div, o, l)?;
            let known = match (out.as_const(), shape[a].as_const()) {
                (Some(o), Some(l)) if l > 0 => Some(o as f64 / l as f64),
                _ => None,
            };
            plan.push(Axis { axis: a, out: out.clone(), scale, known, roi: (roi[i], roi[axes.len() + i]) });
        }
    } else {
        return Err("Resize needs scales or sizes".into());
    }
    let float = imp.ty(x).dtype.is_float();
    let mut y = if float { x } else { imp.cast(x, DType::F32)? };
    // Innermost axis first: an outer axis interpolates what the inner ones made
    // (their extrapolation values too, as ONNX's reference does).
    for ax in plan.iter().rev() {
        let identity = ctm != "tf_crop_and_resize"
            && imp.same_shape(std::slice::from_ref(&ax.out), std::slice::from_ref(&shape[ax.axis]))
            && ax.known == Some(1.0);
        if !identity {
            y = resize_axis(imp, y, ax, (&mode, &ctm, &nearest, antialias), n)?;
        }
    }
    if float {
        Ok(y)
    } else {
        let rounded = imp.unary(U::Round, y)?;
        imp.cast(rounded, imp.ty(x).dtype)
    }
}

/// `floor(extent · s)` for a symbolic extent: exact only for integer scales and
/// powers of two's reciprocals (any scale for a static extent).
fn scaled_extent(e: &SymExpr, s: f64, axis: usize) -> R<SymExpr> {
    if let Some(v) = e.as_const() {
        return Ok(SymExpr::constant((v as f64 * s).floor() as i64));
    }
    if s.fract() == 0.0 {
        return e.try_scale(s as i64).map_err(|e| e.to_string());
    }
    let k = 1.0 / s;
    if k.fract() == 0.0 && (k as i64).count_ones() == 1 {
        return e.try_floor_div(k as i64).map_err(|e| e.to_string());
    }
    Err(format!("scale {s} on axis {axis} of symbolic extent {e}: only integer scales and 1/2^k resize a symbolic extent"))
}

/// One axis: the taps, weighted and summed (tf_crop_and_resize: the
/// extrapolation value where the source falls outside the input).
fn resize_axis(
    imp: &mut Importer,
    x: ValueId,
    ax: &Axis,
    (mode, ctm, nearest, antialias): (&str, &str, &str, bool),
    n: &Node,
) -> R<ValueId> {
    let shape = imp.shape(x);
    let a = ax.axis;
    let len = shape[a].clone();
    let pos = iota(imp, std::slice::from_ref(&ax.out), 0)?;
    let xo = imp.cast(pos, DType::F64)?;
    let l_in = dim_f64(imp, &len)?;
    let s = ax.scale;
    // The output's extent as ONNX's reference sees it: scale · input extent.
    let ow = imp.binary(B::Mul, s, l_in)?;
    let half = |imp: &mut Importer| -> R<ValueId> {
        let h = imp.binary_scalar(B::Add, xo, 0.5)?;
        let h = imp.binary(B::Div, h, s)?;
        imp.binary_scalar(B::Sub, h, 0.5)
    };
    let one_out = imp.binary_scalar(B::Equal, ow, 1.0)?;
    let l1 = imp.binary_scalar(B::Sub, l_in, 1.0)?;
    let ow1 = imp.binary_scalar(B::Sub, ow, 1.0)?;
    let src = match ctm {
        "asymmetric" => imp.binary(B::Div, xo, s)?,
        "half_pixel" => half(imp)?,
        "pytorch_half_pixel" => {
            let h = half(imp)?;
            let m = imp.scalar(DType::F64, -0.5)?;
            imp.select(one_out, m, h)?
        }
        "align_corners" => {
            let t = imp.binary(B::Mul, xo, l1)?;
            let t = imp.binary(B::Div, t, ow1)?;
            let z = imp.scalar(DType::F64, 0.0)?;
            imp.select(one_out, z, t)?
        }
        "half_pixel_symmetric" => {
            let out_int = dim_f64(imp, &ax.out)?;
            let adjust = imp.binary(B::Div, out_int, ow)?;
            let center = imp.binary_scalar(B::Mul, l_in, 0.5)?;
            let one = imp.scalar(DType::F64, 1.0)?;
            let k = imp.binary(B::Sub, one, adjust)?;
            let offset = imp.binary(B::Mul, center, k)?;
            let h = half(imp)?;
            imp.binary(B::Add, offset, h)?
        }
        _ => {
            // tf_crop_and_resize over the roi [start, end] (fractions of the extent).
            let (r0, r1) = ax.roi;
            let span = imp.binary_scalar(B::Mul, l1, r1 - r0)?;
            let mid = imp.binary_scalar(B::Mul, span, 0.5)?;
            let t = imp.binary(B::Mul, xo, span)?;
            let t = imp.binary(B::Div, t, ow1)?;
            let t = imp.select(one_out, mid, t)?;
            let start = imp.binary_scalar(B::Mul, l1, r0)?;
            imp.binary(B::Add, t, start)?
        }
    };
    let floor = imp.unary(U::Floor, src)?;
    let ratio = imp.binary(B::Sub, src, floor)?;
    let base = imp.cast(floor, DType::I64)?;
    let last = {
        let l = dim_scalar(imp, &len)?;
        imp.binary_scalar(B::Sub, l, 1.0)?
    };
    let clamp = |imp: &mut Importer, i: ValueId| clamp(imp, i, last);
    // The taps: offsets from floor(src) and their weights (f64, per output position).
    let mut taps: Vec<(ValueId, Option<ValueId>)> = Vec::new();
    match mode {
        "nearest" => {
            let r = match nearest {
                "round_prefer_floor" => {
                    let t = imp.binary_scalar(B::Sub, src, 0.5)?;
                    imp.unary(U::Ceil, t)?
                }
                "round_prefer_ceil" => {
                    let t = imp.binary_scalar(B::Add, src, 0.5)?;
                    imp.unary(U::Floor, t)?
                }
                "floor" => floor,
                _ => imp.unary(U::Ceil, src)?,
            };
            let i = imp.cast(r, DType::I64)?;
            taps.push((clamp(imp, i)?, None));
        }
        "linear" | "cubic" if antialias => {
            // Downsampling: the filter stretched by 1/scale (its weights normalized),
            // over as many taps as it then covers.
            let s = ax.known.ok_or("Resize with antialias needs a scale known at compile time")?.min(1.0);
            let reach = if mode == "linear" { 1.0 } else { 2.0 };
            let start = (-reach / s).floor() as i64 + 1;
            let a = n.float("cubic_coeff_a", -0.75) as f64;
            let mut raw = Vec::new();
            for k in start..2 - start {
                let i = imp.binary_scalar(B::Add, base, k as f64)?;
                // |(k − ratio) · s|
                let d = imp.binary_scalar(B::Sub, ratio, k as f64)?;
                let d = imp.binary_scalar(B::Mul, d, s)?;
                let d = imp.unary(U::Abs, d)?;
                let w = if mode == "linear" {
                    let t = imp.binary_scalar(B::Mul, d, -1.0)?;
                    let t = imp.binary_scalar(B::Add, t, 1.0)?;
                    imp.binary_scalar(B::Max, t, 0.0)?
                } else {
                    let d2 = imp.binary(B::Mul, d, d)?;
                    let d3 = imp.binary(B::Mul, d2, d)?;
                    // |d| ≤ 1: (a+2)d³ − (a+3)d² + 1; 1 < |d| < 2: a·d³ − 5a·d² + 8a·d − 4a; else 0.
                    let n3 = imp.binary_scalar(B::Mul, d3, a + 2.0)?;
                    let n2 = imp.binary_scalar(B::Mul, d2, a + 3.0)?;
                    let inner = imp.binary(B::Sub, n3, n2)?;
                    let inner = imp.binary_scalar(B::Add, inner, 1.0)?;
                    let f3 = imp.binary_scalar(B::Mul, d3, a)?;
                    let f2 = imp.binary_scalar(B::Mul, d2, 5.0 * a)?;
                    let f1 = imp.binary_scalar(B::Mul, d, 8.0 * a)?;
                    let outer = imp.binary(B::Sub, f3, f2)?;
                    let outer = imp.binary(B::Add, outer, f1)?;
                    let outer = imp.binary_scalar(B::Sub, outer, 4.0 * a)?;
                    let zero = imp.scalar(DType::F64, 0.0)?;
                    let far = imp.binary_scalar(B::Less, d, 2.0)?;
                    let outer = imp.select(far, outer, zero)?;
                    let close = imp.binary_scalar(B::LessEq, d, 1.0)?;
                    imp.select(close, inner, outer)?
                };
                raw.push((i, w));
            }
            taps = normalized(imp, raw, n.int("exclude_outside", 0) != 0, last, true)?;
        }
        "linear" => {
            let next = imp.binary_scalar(B::Add, base, 1.0)?;
            let one = imp.scalar(DType::F64, 1.0)?;
            let w0 = imp.binary(B::Sub, one, ratio)?;
            taps.push((clamp(imp, base)?, Some(w0)));
            taps.push((clamp(imp, next)?, Some(ratio)));
        }
        _ => {
            let a = n.float("cubic_coeff_a", -0.75) as f64;
            let exclude = n.int("exclude_outside", 0) != 0;
            // Keys' cubic convolution: the weights of floor−1 .. floor+2.
            let one = imp.scalar(DType::F64, 1.0)?;
            let inv = imp.binary(B::Sub, one, ratio)?;
            let far = |imp: &mut Importer, d: ValueId| -> R<ValueId> {
                // ((a·d − 5a)·d + 8a)·d − 4a, for d in [1, 2]
                let t = imp.binary_scalar(B::Mul, d, a)?;
                let t = imp.binary_scalar(B::Sub, t, 5.0 * a)?;
                let t = imp.binary(B::Mul, t, d)?;
                let t = imp.binary_scalar(B::Add, t, 8.0 * a)?;
                let t = imp.binary(B::Mul, t, d)?;
                imp.binary_scalar(B::Sub, t, 4.0 * a)
            };
            let near = |imp: &mut Importer, d: ValueId| -> R<ValueId> {
                // ((a + 2)·d − (a + 3))·d² + 1, for d in [0, 1]
                let t = imp.binary_scalar(B::Mul, d, a + 2.0)?;
                let t = imp.binary_scalar(B::Sub, t, a + 3.0)?;
                let t = imp.binary(B::Mul, t, d)?;
                let t = imp.binary(B::Mul, t, d)?;
                imp.binary_scalar(B::Add, t, 1.0)
            };
            let r1 = imp.binary_scalar(B::Add, ratio, 1.0)?;
            let i1 = imp.binary_scalar(B::Add, inv, 1.0)?;
            let weights = [far(imp, r1)?, near(imp, ratio)?, near(imp, inv)?, far(imp, i1)?];
            let raw: Vec<(ValueId, ValueId)> = weights
                .into_iter()
                .enumerate()
                .map(|(k, w)| Ok((imp.binary_scalar(B::Add, base, k as f64 - 1.0)?, w)))
                .collect::<R<_>>()?;
            taps = normalized(imp, raw, exclude, last, false)?;
        }
    }
    // Each tap gathered along the axis, weighted (its weight along the axis).
    let dt = imp.ty(x).dtype;
    let mut wshape = vec![SymExpr::constant(1); shape.len()];
    wshape[a] = ax.out.clone();
    let mut acc: Option<ValueId> = None;
    for (i, w) in taps {
        let g = imp.emit(Op::Gather { axis: a }, vec![x, i], None)?;
        let term = match w {
            Some(w) => {
                let w = imp.cast(w, dt)?;
                let w = imp.reshape(w, wshape.clone())?;
                imp.binary(B::Mul, g, w)?
            }
            None => g,
        };
        acc = Some(match acc {
            Some(s) => imp.binary(B::Add, s, term)?,
            None => term,
        });
    }
    let y = acc.ok_or("internal: Resize without taps")?;
    if ctm == "tf_crop_and_resize" {
        // Outside the input: the extrapolation value.
        let lo = imp.binary_scalar(B::Less, src, 0.0)?;
        let hi = imp.binary(B::Greater, src, l1)?;
        let out = imp.binary(B::Or, lo, hi)?;
        let out = imp.reshape(out, wshape)?;
        let value = imp.scalar(dt, n.float("extrapolation_value", 0.0) as f64)?;
        return imp.select(out, value, y);
    }
    Ok(y)
}

/// `i` clamped to `[0, last]` (the edge repeated past the input).
fn clamp(imp: &mut Importer, i: ValueId, last: ValueId) -> R<ValueId> {
    let zero = imp.scalar(DType::I64, 0.0)?;
    let i = imp.binary(B::Min, i, last)?;
    imp.binary(B::Max, i, zero)
}

/// Taps `(index, weight)` with edge-clamped indices: the weights of indices
/// outside the input zeroed when `exclude` (ONNX `exclude_outside`), then
/// divided by their sum when `exclude` or `always`.
fn normalized(
    imp: &mut Importer,
    raw: Vec<(ValueId, ValueId)>,
    exclude: bool,
    last: ValueId,
    always: bool,
) -> R<Vec<(ValueId, Option<ValueId>)>> {
    let mut kept = Vec::with_capacity(raw.len());
    for (i, w) in raw {
        let w = if exclude {
            let lo = imp.binary_scalar(B::GreaterEq, i, 0.0)?;
            let hi = imp.binary(B::LessEq, i, last)?;
            let inside = imp.binary(B::And, lo, hi)?;
            let z = imp.scalar(DType::F64, 0.0)?;
            imp.select(inside, w, z)?
        } else {
            w
        };
        kept.push((i, w));
    }
    let total = if exclude || always {
        let mut t = kept[0].1;
        for (_, w) in &kept[1..] {
            t = imp.binary(B::Add, t, *w)?;
        }
        Some(t)
    } else {
        None
    };
    let mut out = Vec::with_capacity(kept.len());
    for (i, w) in kept {
        let w = match total {
            Some(t) => imp.binary(B::Div, w, t)?,
            None => w,
        };
        out.push((clamp(imp, i, last)?, Some(w)));
    }
    Ok(out)
}
