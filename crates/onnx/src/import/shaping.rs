//! Normalizations over groups of axes and block rearrangements, written with
//! the primitives: a normalization is the mean and variance reductions that
//! LayerNormalization uses, over the axes the op names (fusion makes them one
//! stitch kernel again); depth-to-space and space-to-depth are a reshape, a
//! transpose and a reshape.

use ir::{BinaryOp as B, ReduceOp, UnaryOp as U, ValueId};
use sym::SymExpr;

use super::{Importer, Node, R};

/// `(x − mean) / sqrt(var + eps)` over `axes` (biased variance, as ONNX).
fn standardize(imp: &mut Importer, x: ValueId, axes: Vec<usize>, eps: f64) -> R<ValueId> {
    let shape = imp.shape(x);
    let mean = imp.reduce(ReduceOp::Mean, x, axes.clone(), true)?;
    let mean = imp.expand_to(mean, &shape)?;
    let d = imp.binary(B::Sub, x, mean)?;
    let sq = imp.binary(B::Mul, d, d)?;
    let var = imp.reduce(ReduceOp::Mean, sq, axes, true)?;
    let var = imp.binary_scalar(B::Add, var, eps)?;
    let std = imp.unary(U::Sqrt, var)?;
    let std = imp.expand_to(std, &shape)?;
    imp.binary(B::Div, d, std)
}

/// A per-channel parameter `[C]` shaped to broadcast over `[N, C, …]` of `rank`.
fn per_channel(imp: &mut Importer, p: ValueId, rank: usize) -> R<ValueId> {
    let mut shape = imp.shape(p);
    shape.extend(std::iter::repeat_n(SymExpr::constant(1), rank.saturating_sub(2)));
    imp.reshape(p, shape)
}

/// ONNX `InstanceNormalization`: per sample and channel over the spatial axes.
pub(crate) fn instance_norm(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let x = n.input(0)?;
    let r = imp.rank(x);
    if r < 3 {
        return Err("InstanceNormalization needs an input of rank >= 3".into());
    }
    let y = standardize(imp, x, (2..r).collect(), n.float("epsilon", 1e-5) as f64)?;
    scale_and_shift(imp, n, y, r)
}

/// `y · scale[c] + bias[c]` with the node's inputs 1 and 2, per channel.
fn scale_and_shift(imp: &mut Importer, n: &Node, y: ValueId, rank: usize) -> R<ValueId> {
    let scale = per_channel(imp, n.input(1)?, rank)?;
    let bias = per_channel(imp, n.input(2)?, rank)?;
    let y = imp.binary(B::Mul, y, scale)?;
    imp.binary(B::Add, y, bias)
}

/// ONNX `GroupNormalization` (opset 21: scale and bias per channel): the
/// channels split in `num_groups` groups, each normalized over its channels and
/// the spatial axes.
pub(crate) fn group_norm(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let x = n.input(0)?;
    let s = imp.shape(x);
    let r = s.len();
    let groups = n.int("num_groups", 0);
    let c = s.get(1).and_then(|c| c.as_const()).ok_or("GroupNormalization needs a constant channel count")?;
    if r < 3 || groups <= 0 || c % groups != 0 {
        return Err(format!("GroupNormalization of {c} channels in {groups} groups (rank {r})"));
    }
    let scale = n.input(1)?;
    if imp.shape(scale).first().and_then(|d| d.as_const()) != Some(c) {
        return Err(format!(
            "scale of shape {:?}: opset 21's per-channel form ({c} values) is supported, opset 18's per-group one is not",
            imp.shape(scale).iter().map(|d| d.to_string()).collect::<Vec<_>>()
        ));
    }
    let mut grouped = vec![s[0].clone(), SymExpr::constant(groups), SymExpr::constant(c / groups)];
    grouped.extend(s[2..].iter().cloned());
    let xg = imp.reshape(x, grouped)?;
    let y = standardize(imp, xg, (2..r + 1).collect(), n.float("epsilon", 1e-5) as f64)?;
    let y = imp.reshape(y, s)?;
    scale_and_shift(imp, n, y, r)
}

/// ONNX `MeanVarianceNormalization`: over `axes` (default batch and spatial).
pub(crate) fn mean_variance_norm(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let x = n.input(0)?;
    let r = imp.rank(x);
    let axes = match n.ints("axes") {
        Some(a) => a.iter().map(|&a| super::norm_axis(a, r)).collect::<R<Vec<_>>>()?,
        None => [0, 2, 3].into_iter().filter(|&a| a < r).collect(),
    };
    standardize(imp, x, axes, 1e-9)
}

/// ONNX `DepthToSpace` (`DCR` or `CRD`) and `SpaceToDepth` on `[N, C, H, W]`.
pub(crate) fn depth_space(imp: &mut Importer, n: &Node, to_space: bool) -> R<ValueId> {
    let x = n.input(0)?;
    let s = imp.shape(x);
    let b = n.int("blocksize", 0);
    if s.len() != 4 || b <= 0 {
        return Err(format!("needs a 4-D input and a positive blocksize, got rank {} and {b}", s.len()));
    }
    let (nn, c, h, w) = (s[0].clone(), s[1].clone(), s[2].clone(), s[3].clone());
    let k = SymExpr::constant(b);
    let mul = |a: &SymExpr, b: &SymExpr| a.try_mul(b).map_err(|e| e.to_string());
    let div = |a: &SymExpr| -> R<SymExpr> {
        let q = a
            .as_const()
            .map(|v| v / b)
            .ok_or("DepthToSpace and SpaceToDepth need constant extents to divide")?;
        if q * b != a.as_const().unwrap_or(0) {
            return Err(format!("{a} is not a multiple of the blocksize {b}"));
        }
        Ok(SymExpr::constant(q))
    };
    if to_space {
        let cb = div(&div(&c)?)?;
        let crd = n.string("mode").as_deref() == Some("CRD");
        let (split, perm) = if crd {
            (vec![nn.clone(), cb.clone(), k.clone(), k.clone(), h.clone(), w.clone()], vec![0, 1, 4, 2, 5, 3])
        } else {
            (vec![nn.clone(), k.clone(), k.clone(), cb.clone(), h.clone(), w.clone()], vec![0, 3, 4, 1, 5, 2])
        };
        let y = imp.reshape(x, split)?;
        let y = imp.transpose(y, perm)?;
        imp.reshape(y, vec![nn, cb, mul(&h, &k)?, mul(&w, &k)?])
    } else {
        let (hb, wb) = (div(&h)?, div(&w)?);
        let y = imp.reshape(x, vec![nn.clone(), c.clone(), hb.clone(), k.clone(), wb.clone(), k.clone()])?;
        // DCR (the default) puts the block offsets before the channels; CRD (opset 28) after.
        let crd = n.string("mode").as_deref() == Some("CRD");
        let y = imp.transpose(y, if crd { vec![0, 1, 3, 5, 2, 4] } else { vec![0, 3, 5, 1, 2, 4] })?;
        imp.reshape(y, vec![nn, mul(&mul(&c, &k)?, &k)?, hb, wb])
    }
}

/// Hyperbolic and inverse trigonometric functions and the tangent from `exp`,
/// `log`, `sqrt`, `sin`, `cos` and a polynomial.
pub(crate) fn trig(imp: &mut Importer, n: &Node, op: &str) -> R<ValueId> {
    let x = n.input(0)?;
    match op {
        "Tan" => {
            let s = imp.unary(U::Sin, x)?;
            let c = imp.unary(U::Cos, x)?;
            imp.binary(B::Div, s, c)
        }
        "Sinh" | "Cosh" => {
            let e = imp.unary(U::Exp, x)?;
            let nx = imp.unary(U::Neg, x)?;
            let en = imp.unary(U::Exp, nx)?;
            let t = imp.binary(if op == "Sinh" { B::Sub } else { B::Add }, e, en)?;
            let y = imp.binary_scalar(B::Mul, t, 0.5)?;
            if op == "Cosh" {
                return Ok(y);
            }
            // Near 0 the difference cancels: x + x³/3! + x⁵/5! + x⁷/7! there
            // (below 1/4 the next term is under 1e-10 of the sum).
            let x2 = imp.binary(B::Mul, x, x)?;
            let mut p = imp.fill_like(x, 1.0 / 5040.0)?;
            for c in [1.0 / 120.0, 1.0 / 6.0, 1.0] {
                p = imp.binary(B::Mul, p, x2)?;
                p = imp.binary_scalar(B::Add, p, c)?;
            }
            let series = imp.binary(B::Mul, p, x)?;
            let a = imp.unary(U::Abs, x)?;
            let small = imp.binary_scalar(B::Less, a, 0.25)?;
            imp.select(small, series, y)
        }
        // asinh(x) = sign(x)·log(|x| + sqrt(x² + 1)) (exact for negative x too);
        // acosh(x) = log(x + sqrt(x² − 1)); atanh(x) = ½·log((1 + x)/(1 − x)).
        "Asinh" => {
            let a = imp.unary(U::Abs, x)?;
            let sq = imp.binary(B::Mul, a, a)?;
            let sq = imp.binary_scalar(B::Add, sq, 1.0)?;
            let r = imp.unary(U::Sqrt, sq)?;
            let t = imp.binary(B::Add, a, r)?;
            let l = imp.unary(U::Log, t)?;
            let sign = imp.unary(U::Sign, x)?;
            imp.binary(B::Mul, sign, l)
        }
        "Acosh" => {
            let sq = imp.binary(B::Mul, x, x)?;
            let sq = imp.binary_scalar(B::Sub, sq, 1.0)?;
            let r = imp.unary(U::Sqrt, sq)?;
            let t = imp.binary(B::Add, x, r)?;
            imp.unary(U::Log, t)
        }
        "Atanh" => {
            let one = imp.fill_like(x, 1.0)?;
            let p = imp.binary(B::Add, one, x)?;
            let m = imp.binary(B::Sub, one, x)?;
            let q = imp.binary(B::Div, p, m)?;
            let l = imp.unary(U::Log, q)?;
            imp.binary_scalar(B::Mul, l, 0.5)
        }
        "Atan" => atan(imp, x),
        // asin(x) = atan(x / sqrt(1 − x²)) (±1 divides to ±inf: atan gives ±π/2);
        // acos(x) = π/2 − asin(x).
        "Asin" | "Acos" => {
            let sq = imp.binary(B::Mul, x, x)?;
            let one = imp.fill_like(x, 1.0)?;
            let c = imp.binary(B::Sub, one, sq)?;
            let c = imp.unary(U::Sqrt, c)?;
            let q = imp.binary(B::Div, x, c)?;
            let asin = atan(imp, q)?;
            if op == "Asin" {
                return Ok(asin);
            }
            let half_pi = imp.fill_like(x, std::f64::consts::FRAC_PI_2)?;
            imp.binary(B::Sub, half_pi, asin)
        }
        _ => Err(format!("internal: {op} is not a trigonometric op here")),
    }
}

/// `atan(x)`: |x| reduced to [0, 1] (`atan(a) = π/2 − atan(1/a)`), then to
/// [0, tan(π/8)] (`atan(b) = π/4 + atan((b − 1)/(b + 1))`), where the odd Taylor
/// series to degree 11 is within 1e-7; the sign restored last.
fn atan(imp: &mut Importer, x: ValueId) -> R<ValueId> {
    let a = imp.unary(U::Abs, x)?;
    let inv = imp.binary_scalar(B::Greater, a, 1.0)?;
    let ra = imp.unary(U::Reciprocal, a)?;
    let b = imp.select(inv, ra, a)?;
    let big = imp.binary_scalar(B::Greater, b, std::f64::consts::SQRT_2 - 1.0)?;
    let num = imp.binary_scalar(B::Sub, b, 1.0)?;
    let den = imp.binary_scalar(B::Add, b, 1.0)?;
    let shifted = imp.binary(B::Div, num, den)?;
    let t = imp.select(big, shifted, b)?;
    let t2 = imp.binary(B::Mul, t, t)?;
    // Horner in t²: 1 − t²/3 + t⁴/5 − t⁶/7 + t⁸/9 − t¹⁰/11.
    let mut p = imp.fill_like(t, -1.0 / 11.0)?;
    for c in [1.0 / 9.0, -1.0 / 7.0, 1.0 / 5.0, -1.0 / 3.0, 1.0] {
        p = imp.binary(B::Mul, p, t2)?;
        p = imp.binary_scalar(B::Add, p, c)?;
    }
    let p = imp.binary(B::Mul, p, t)?;
    let quarter = imp.binary_scalar(B::Add, p, std::f64::consts::FRAC_PI_4)?;
    let r = imp.select(big, quarter, p)?;
    let half_pi = imp.fill_like(r, std::f64::consts::FRAC_PI_2)?;
    let flipped = imp.binary(B::Sub, half_pi, r)?;
    let r = imp.select(inv, flipped, r)?;
    let sign = imp.unary(U::Sign, x)?;
    imp.binary(B::Mul, sign, r)
}
