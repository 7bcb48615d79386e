//! The quantization operators of the ONNX standard, split into primitives with
//! the standard's arithmetic: a quantized operand is widened to i32 and its zero
//! point subtracted, contractions accumulate in i32 (exact), and a result is
//! quantized by dividing by its scale, rounding half to even, adding the zero
//! point and saturating to the type's range. Scales and zero points are per
//! tensor, per axis or per block of an axis (gathered along it).
//!
//! Element types: int8 and uint8 quantized values (int32 for a dequantized
//! bias), and the narrow integer types held in wider ones (`load::Narrow`:
//! int16 and uint16 in i32, int4, uint4, int2 and uint2 in i8 and u8; a
//! quantization saturates to the narrow type's range); float and float16
//! scales. The loader rejects the others by name.

use ir::{BinaryOp as B, ConstData, DType, Op, ReduceOp, UnaryOp as U, ValueId};
use sym::SymExpr;

use super::indexing::iota;
use super::ops::{add_channel_bias, conv_of, matmul};
use super::{norm_axis, Importer, Node, R};
use crate::load::Narrow;

/// `x` dequantized: `(x - zero_point) · scale` in f32, in the scale's type (or
/// `output_dtype`, opset 23).
pub(crate) fn dequantize_linear(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let (x, scale) = (n.input(0)?, n.input(1)?);
    let xt = imp.ty(x).dtype;
    if !matches!(xt, DType::I8 | DType::U8 | DType::I32) {
        return Err(format!("DequantizeLinear of {xt} is not supported (int8, uint8 and int32 are)"));
    }
    let out = match n.int("output_dtype", 0) {
        0 => imp.ty(scale).dtype,
        code => output_type(code)?,
    };
    let (axis, block) = (n.int("axis", 1), n.int("block_size", 0));
    if out == DType::F32 {
        if let Some(w) = dequantized_weight(imp, n, axis, block)? {
            return Ok(imp.constant(w));
        }
    }
    let mut y = imp.cast(x, DType::F32)?;
    if let Some(zp) = n.opt_input(2) {
        same_type(imp, zp, x, "x_zero_point", "x")?;
        if imp.narrow_of(zp) != imp.narrow_of(x) {
            let name = |v| imp.narrow_of(v).map_or(imp.ty(v).dtype.to_string(), |k| k.name().to_string());
            return Err(format!(
                "x_zero_point is {} but x is {}: they must have one type",
                name(zp),
                name(x)
            ));
        }
        let zp = imp.cast(zp, DType::F32)?;
        let zp = along(imp, zp, x, axis, block, "x_zero_point")?;
        y = imp.binary(B::Sub, y, zp)?;
    }
    let s = imp.cast(scale, DType::F32)?;
    let s = along(imp, s, x, axis, block, "x_scale")?;
    let y = imp.binary(B::Mul, y, s)?;
    imp.cast(y, out)
}

/// A constant 2-D weight of int4 or uint4 codes dequantized along its rows
/// (blocks of `block` rows, `axis` 0), per column (`axis` 1) or per tensor,
/// or of int8 or uint8 codes in blocks of rows, with constant scales and zero
/// points: its f32 values,
/// computed here as the decomposition would, carrying its codes
/// ([`ir::WeightCodes`]) for the backends that multiply them. `None` for
/// every other `DequantizeLinear`.
fn dequantized_weight(imp: &mut Importer, n: &Node, axis: i64, block: i64) -> R<Option<ConstData>> {
    let (x, scale, zp) = (n.input(0)?, n.input(1)?, n.opt_input(2));
    let bits = match imp.narrow_of(x) {
        None => 8,
        Some(Narrow::I4 | Narrow::U4) => 4,
        Some(_) => return Ok(None),
    };
    // An 8-bit weight with one scale per column or per tensor keeps the
    // decomposition: the scale moves past the product, whose operands are then
    // integers (passes::integer) where the activation is quantized too.
    if bits == 8 && block == 0 {
        return Ok(None);
    }
    let Some(codes) = imp.const_data(x) else { return Ok(None) };
    let (Some(s), true) = (imp.const_data(scale), zp.is_none_or(|z| imp.const_data(z).is_some())) else {
        return Ok(None);
    };
    // A zero point of another (narrow) type is the decomposition's error to give.
    if zp.is_some_and(|z| imp.narrow_of(z) != imp.narrow_of(x)) {
        return Ok(None);
    }
    let zps = zp.and_then(|z| imp.const_data(z));
    let (&[k, cols], DType::F32) = (&codes.shape[..], s.dtype) else { return Ok(None) };
    if !matches!(codes.dtype, DType::I8 | DType::U8) || zps.as_ref().is_some_and(|z| z.dtype != codes.dtype) {
        return Ok(None);
    }
    let one = s.numel() == 1 && zps.as_ref().is_none_or(|z| z.numel() == 1);
    let group = match (norm_axis(axis, 2), block) {
        _ if one => k,
        (Ok(1), 0) if s.shape == [cols] && zps.as_ref().is_none_or(|z| z.shape == [cols]) => k,
        (Ok(0), b) if b > 0 => {
            let groups = k.div_ceil(b as usize);
            if s.shape != [groups, cols] || zps.as_ref().is_some_and(|z| z.shape != [groups, cols]) {
                return Ok(None);
            }
            b as usize
        }
        _ => return Ok(None),
    };
    let groups = k.div_ceil(group);
    // Straight from the bytes: an LM head's codes are tens of millions.
    let widen = |c: &ConstData| -> Vec<f32> {
        match c.dtype {
            DType::I8 => c.bytes().iter().map(|&b| f32::from(b as i8)).collect(),
            DType::U8 => c.bytes().iter().map(|&b| f32::from(b)).collect(),
            _ => c.bytes().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        }
    };
    let per_group = |v: Vec<f32>| -> Vec<f32> {
        if v.len() == 1 {
            vec![v[0]; groups * cols]
        } else {
            v
        }
    };
    let scales = per_group(widen(&s));
    let zero = zps.as_ref().map(|z| per_group(widen(z)));
    let q = widen(&codes);
    let mut vals = Vec::with_capacity(k * cols);
    for r in 0..k {
        for c in 0..cols {
            let g = r / group * cols + c;
            vals.push((q[r * cols + c] - zero.as_ref().map_or(0.0, |z| z[g])) * scales[g]);
        }
    }
    let t = ir::Tensor::new(vec![k, cols], ir::Elems::F32(vals)).map_err(|e| e.to_string())?;
    let zero_points = match (&zps, zero) {
        (Some(z), Some(_)) if z.numel() == 1 => {
            let v = z.to_tensor().to_f64_vec()[0];
            Some(ConstData::from_tensor(
                &match z.dtype {
                    DType::I8 => {
                        ir::Tensor::new(vec![groups, cols], ir::Elems::I8(vec![v as i8; groups * cols]))
                    }
                    _ => ir::Tensor::new(vec![groups, cols], ir::Elems::U8(vec![v as u8; groups * cols])),
                }
                .map_err(|e| e.to_string())?,
            ))
        }
        (Some(z), Some(_)) => Some(z.reshaped(vec![groups, cols]).map_err(|e| e.to_string())?),
        _ => None,
    };
    let w = ir::WeightCodes { codes: codes.as_ref().clone(), bits, group, scales, zero_points };
    Ok(Some(ConstData::from_tensor(&t).with_codes(w).map_err(|e| e.to_string())?))
}

/// ONNX Runtime's `MatMulNBits` (com.microsoft): `A · dequant(B)ᵀ (+ bias)`,
/// B `[N, K / block_size, block_size · bits / 8]` bytes of codes packed low
/// bits first along K, a scale per block and column, zero points packed the
/// same way (default `2^(bits − 1)`) or floats. A constant weight of 4- or
/// 8-bit codes becomes the f32 `[K, N]` weight carrying its codes (as a
/// blocked `DequantizeLinear`'s does), then a MatMul.
pub(crate) fn matmul_nbits(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let (k, cols, bits, block) = (n.int("K", 0), n.int("N", 0), n.int("bits", 4), n.int("block_size", 0));
    if k <= 0 || cols <= 0 {
        return Err(format!("K {k} and N {cols} must be positive"));
    }
    if bits != 4 && bits != 8 {
        return Err(format!("{bits}-bit codes are not supported (4 and 8 are)"));
    }
    if block < 16 || block & (block - 1) != 0 {
        return Err(format!("block_size {block} must be a power of two of at least 16"));
    }
    if n.opt_input(4).is_some_and(|g| imp.shape(g).iter().any(|d| d.as_const() != Some(0))) {
        return Err("g_idx (a permutation of K's blocks) is not supported".into());
    }
    let (k, cols, bits, block) = (k as usize, cols as usize, bits as u32, block as usize);
    let (a, b, s) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let (Some(codes), Some(scales)) = (imp.const_data(b), imp.const_data(s)) else {
        return Err("B and its scales must be constants (initializers)".into());
    };
    let blocks = k.div_ceil(block);
    let blob = block * bits as usize / 8;
    if codes.dtype != DType::U8 || codes.shape != [cols, blocks, blob] {
        return Err(format!("B must be uint8 [{cols}, {blocks}, {blob}], got {}", codes.ty()));
    }
    if scales.dtype != DType::F32 || scales.numel() != cols * blocks {
        return Err(format!(
            "scales must be {} f32 values (N × K's blocks), got {}",
            cols * blocks,
            scales.ty()
        ));
    }
    if imp.shape(a).last().and_then(|d| d.as_const()) != Some(k as i64) {
        return Err(format!("A's last dimension must be K = {k}, A is {}", imp.ty(a)));
    }
    let bytes = codes.bytes();
    let code = |c: usize, r: usize| -> u8 {
        let at = (c * blocks + r / block) * blob * 8 + (r % block) * bits as usize;
        (bytes[at / 8] >> (at % 8)) & ((1u16 << bits) - 1) as u8
    };
    let scale = scales.to_tensor().to_f64_vec();
    // Zero points: packed codes (uint8), floats, or the middle of the range.
    let zp = match n.opt_input(3) {
        None => None,
        Some(z) => Some(imp.const_data(z).ok_or("zero_points must be a constant (an initializer)")?),
    };
    let per_row = (blocks * bits as usize).div_ceil(8);
    let zero: Vec<f64> = match &zp {
        None => vec![f64::from(1u32 << (bits - 1)); cols * blocks],
        Some(z) if z.dtype == DType::U8 && z.numel() == cols * per_row => (0..cols * blocks)
            .map(|i| {
                let (c, j) = (i / blocks, i % blocks);
                let at = c * per_row * 8 + j * bits as usize;
                f64::from((z.bytes()[at / 8] >> (at % 8)) & ((1u16 << bits) - 1) as u8)
            })
            .collect(),
        Some(z) if z.dtype == DType::F32 && z.numel() == cols * blocks => z.to_tensor().to_f64_vec(),
        Some(z) => {
            return Err(format!(
                "zero_points must be {} packed uint8 or {} f32, got {}",
                cols * per_row,
                cols * blocks,
                z.ty()
            ))
        }
    };
    let mut w = Vec::with_capacity(k * cols);
    let mut u = Vec::with_capacity(k * cols);
    for r in 0..k {
        for c in 0..cols {
            let g = c * blocks + r / block;
            let q = code(c, r);
            u.push(q);
            w.push(((f64::from(q) - zero[g]) as f32) * scale[g] as f32);
        }
    }
    let values = ConstData::from_tensor(
        &ir::Tensor::new(vec![k, cols], ir::Elems::F32(w)).map_err(|e| e.to_string())?,
    );
    // Integer zero points carry the codes; float ones (not codes) keep f32 values only.
    let integral = zero.iter().all(|z| z.fract() == 0.0 && (0.0..f64::from(1u32 << bits)).contains(z));
    let weight = if integral {
        let by_block = |v: &dyn Fn(usize, usize) -> f64| -> Vec<f64> {
            (0..blocks).flat_map(|j| (0..cols).map(move |c| (j, c))).map(|(j, c)| v(j, c)).collect()
        };
        let zps = by_block(&|j, c| zero[c * blocks + j]).into_iter().map(|z| z as u8).collect();
        let u8s = |shape: Vec<usize>, v: Vec<u8>| -> R<ConstData> {
            Ok(ConstData::from_tensor(&ir::Tensor::new(shape, ir::Elems::U8(v)).map_err(|e| e.to_string())?))
        };
        let codes = ir::WeightCodes {
            codes: u8s(vec![k, cols], u)?,
            bits,
            group: block,
            scales: by_block(&|j, c| scale[c * blocks + j]).into_iter().map(|x| x as f32).collect(),
            zero_points: Some(u8s(vec![blocks, cols], zps)?),
        };
        values.with_codes(codes).map_err(|e| e.to_string())?
    } else {
        values
    };
    let w = imp.constant(weight);
    let y = matmul(imp, a, w)?;
    match n.opt_input(5) {
        Some(bias) => imp.binary(B::Add, y, bias),
        None => Ok(y),
    }
}

/// `x` quantized: `saturate(round(x / scale) + zero_point)`, in the zero
/// point's type (else `output_dtype`, else uint8).
pub(crate) fn quantize_linear(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let (x, scale, zp) = (n.input(0)?, n.input(1)?, n.opt_input(2));
    let (out, narrow) = match (zp, n.int("output_dtype", 0)) {
        (Some(zp), 0) => (imp.ty(zp).dtype, imp.narrow_of(zp)),
        (Some(zp), code) => {
            let (dt, narrow) = quantized_type(code)?;
            if imp.ty(zp).dtype != dt || imp.narrow_of(zp) != narrow {
                return Err(format!(
                    "output_dtype is {} but y_zero_point is {}",
                    crate::load::dtype_name(code as i32),
                    imp.narrow_of(zp).map_or(imp.ty(zp).dtype.to_string(), |k| k.name().to_string())
                ));
            }
            (dt, narrow)
        }
        (None, 0) => (DType::U8, None),
        (None, code) => quantized_type(code)?,
    };
    if narrow.is_none() && !matches!(out, DType::I8 | DType::U8) {
        return Err(format!(
            "QuantizeLinear to {out} is not supported (int8, uint8, int16, uint16, int4, uint4, int2 and uint2 are)"
        ));
    }
    nonzero_scale(imp, scale, "y_scale")?;
    // The division is in the common type of `x` and the scale (numpy's), or in
    // `precision` where the node names one (opset 23).
    let common = match n.int("precision", 0) {
        0 if imp.ty(x).dtype == imp.ty(scale).dtype => imp.ty(x).dtype,
        0 => DType::F32,
        code => output_type(code)?,
    };
    let (axis, block) = (n.int("axis", 1), n.int("block_size", 0));
    let xv = imp.cast(x, common)?;
    let s = imp.cast(scale, common)?;
    let s = along(imp, s, x, axis, block, "y_scale")?;
    let q = imp.binary(B::Div, xv, s)?;
    let q = imp.unary(U::Round, q)?;
    let mut q = imp.cast(q, DType::I32)?;
    if let Some(zp) = zp {
        let zp = imp.cast(zp, DType::I32)?;
        let zp = along(imp, zp, x, axis, block, "y_zero_point")?;
        q = imp.binary(B::Add, q, zp)?;
    }
    saturate_to(imp, q, out, narrow.map_or(range_of(out), Narrow::range))
}

/// The narrow integer type a `QuantizeLinear` node's output holds: its zero
/// point's, else its `output_dtype`'s.
pub(crate) fn narrow_output(imp: &Importer, n: &Node) -> Option<Narrow> {
    match n.opt_input(2) {
        Some(zp) => imp.narrow_of(zp),
        None => Narrow::of(n.int("output_dtype", 0) as i32),
    }
}

/// The type a quantization to ONNX element type `code` holds its values in,
/// and the narrow type it is, if it is one.
fn quantized_type(code: i64) -> R<(DType, Option<Narrow>)> {
    match Narrow::of(code as i32) {
        Some(k) => Ok((k.held(), Some(k))),
        None => Ok((output_type(code)?, None)),
    }
}

/// ONNX `DynamicQuantizeLinear`: uint8 `y`, its scale and zero point from the
/// range of `x` widened to include 0.
pub(crate) fn dynamic_quantize_linear(imp: &mut Importer, n: &Node) -> R<Vec<ValueId>> {
    let x = n.input(0)?;
    if imp.ty(x).dtype != DType::F32 {
        return Err(format!("DynamicQuantizeLinear of {} is not supported (float is)", imp.ty(x).dtype));
    }
    let axes: Vec<usize> = (0..imp.rank(x)).collect();
    let (hi, lo) = if axes.is_empty() {
        (x, x)
    } else {
        (imp.reduce(ReduceOp::Max, x, axes.clone(), false)?, imp.reduce(ReduceOp::Min, x, axes, false)?)
    };
    let hi = imp.binary_scalar(B::Max, hi, 0.0)?;
    let lo = imp.binary_scalar(B::Min, lo, 0.0)?;
    // An all-zero `x` has scale 1/255 (the standard's), not 0.
    let range = imp.binary(B::Sub, hi, lo)?;
    let empty = imp.binary(B::Equal, hi, lo)?;
    let one = imp.scalar(DType::F32, 1.0)?;
    let range = imp.select(empty, one, range)?;
    let scale = imp.binary_scalar(B::Div, range, 255.0)?;
    let zero = imp.scalar(DType::F32, 0.0)?;
    let lo_q = imp.binary(B::Div, lo, scale)?;
    let zp = imp.binary(B::Sub, zero, lo_q)?;
    let zp = clamp(imp, zp, 0.0, 255.0)?;
    let zp = imp.unary(U::Round, zp)?;
    let q = imp.binary(B::Div, x, scale)?;
    let q = imp.unary(U::Round, q)?;
    let q = imp.binary(B::Add, q, zp)?;
    let y = saturate(imp, q, DType::U8)?;
    let zp = imp.cast(zp, DType::U8)?;
    Ok(vec![y, scale, zp])
}

/// ONNX `MatMulInteger`: `(a - a_zero_point) · (b - b_zero_point)` in i32; the
/// zero points per tensor, per row of `a`, per column of `b`.
pub(crate) fn matmul_integer(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let a = shifted(imp, n.input(0)?, n.opt_input(2), "a", Along::Rows)?;
    let b = shifted(imp, n.input(1)?, n.opt_input(3), "b", Along::Last)?;
    matmul(imp, a, b)
}

/// ONNX `ConvInteger`: the convolution of `x - x_zero_point` by `w -
/// w_zero_point` (per output channel or per tensor) in i32: the padding reads 0
/// after the shift, i.e. the zero point before it, as the standard has it.
pub(crate) fn conv_integer(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let x = shifted(imp, n.input(0)?, n.opt_input(2), "x", Along::None)?;
    let w = shifted(imp, n.input(1)?, n.opt_input(3), "w", Along::First)?;
    conv_of(imp, n, x, w)
}

/// ONNX `QLinearMatMul`: the i32 product of the shifted operands requantized by
/// `a_scale · b_scale / y_scale` (f32) to `y`'s zero point and type.
pub(crate) fn qlinear_matmul(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let a = shifted(imp, n.input(0)?, n.opt_input(2), "a", Along::Rows)?;
    let b = shifted(imp, n.input(3)?, n.opt_input(5), "b", Along::Last)?;
    let acc = matmul(imp, a, b)?;
    let sa = per_rows(imp, n.input(1)?)?;
    let scale = scale_product(imp, sa, n.input(4)?, n.input(6)?)?;
    requantize(imp, acc, scale, n.opt_input(7), imp.ty(n.input(0)?).dtype)
}

/// ONNX `QLinearConv`: the i32 convolution of the shifted operands plus the
/// i32 bias, requantized by `x_scale · w_scale / y_scale` (per output channel
/// where `w_scale` is).
pub(crate) fn qlinear_conv(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let x = shifted(imp, n.input(0)?, n.opt_input(2), "x", Along::None)?;
    let w = shifted(imp, n.input(3)?, n.opt_input(5), "w", Along::First)?;
    let mut acc = conv_of(imp, n, x, w)?;
    if let Some(bias) = n.opt_input(8) {
        if imp.ty(bias).dtype != DType::I32 {
            return Err(format!("the bias B is {}, QLinearConv's must be int32", imp.ty(bias).dtype));
        }
        acc = add_channel_bias(imp, acc, bias)?;
    }
    // A per-channel weight scale runs along the output's channels.
    let ws = n.input(4)?;
    let ws = if per_tensor(imp, ws) {
        ws
    } else {
        let (channels, rank) = (imp.shape(acc)[1].clone(), imp.rank(acc));
        laid_along(imp, ws, &channels, 1, rank, "w_scale", "the output channels")?
    };
    let scale = scale_product(imp, n.input(1)?, ws, n.input(6)?)?;
    requantize(imp, acc, scale, n.opt_input(7), imp.ty(n.input(0)?).dtype)
}

// ------------------------------------------------------------------ helpers

/// `acc` (i32) times `scale` (f32, broadcasting), plus the zero point, rounded
/// half to even and saturated to the zero point's type (else `fallback`).
fn requantize(
    imp: &mut Importer,
    acc: ValueId,
    scale: ValueId,
    zp: Option<ValueId>,
    fallback: DType,
) -> R<ValueId> {
    let out = zp.map(|z| imp.ty(z).dtype).unwrap_or(fallback);
    if !matches!(out, DType::I8 | DType::U8) {
        return Err(format!("a quantized result of {out} is not supported (int8 and uint8 are)"));
    }
    let acc = imp.cast(acc, DType::F32)?;
    let mut y = imp.binary(B::Mul, acc, scale)?;
    if let Some(zp) = zp {
        if !per_tensor(imp, zp) {
            return Err("y_zero_point must have one element".into());
        }
        let zp = scalar_of(imp, zp)?;
        let zp = imp.cast(zp, DType::F32)?;
        y = imp.binary(B::Add, y, zp)?;
    }
    let y = imp.unary(U::Round, y)?;
    saturate(imp, y, out)
}

/// `sa · sb / sy` in the scales' type, then f32; `sy` must not be zero.
fn scale_product(imp: &mut Importer, sa: ValueId, sb: ValueId, sy: ValueId) -> R<ValueId> {
    nonzero_scale(imp, sy, "y_scale")?;
    if !per_tensor(imp, sy) {
        return Err("y_scale must have one element".into());
    }
    let sy = scalar_of(imp, sy)?;
    let p = imp.binary(B::Mul, sa, sb)?;
    let p = imp.binary(B::Div, p, sy)?;
    imp.cast(p, DType::F32)
}

/// Where a zero point that is not one element runs along its operand.
#[derive(Clone, Copy)]
enum Along {
    /// Per tensor only.
    None,
    /// The rows of a matmul's `a` (its second-last axis).
    Rows,
    /// The last axis (the columns of a matmul's `b`).
    Last,
    /// The first axis (a convolution weight's output channels).
    First,
}

/// `x` widened to i32 with its zero point subtracted.
fn shifted(imp: &mut Importer, x: ValueId, zp: Option<ValueId>, name: &str, along: Along) -> R<ValueId> {
    if !matches!(imp.ty(x).dtype, DType::I8 | DType::U8) {
        return Err(format!("{name} is {}; int8 and uint8 are supported", imp.ty(x).dtype));
    }
    let xi = imp.cast(x, DType::I32)?;
    let Some(zp) = zp else { return Ok(xi) };
    let what = format!("{name}_zero_point");
    same_type(imp, zp, x, &what, name)?;
    let zp = imp.cast(zp, DType::I32)?;
    let zp = if per_tensor(imp, zp) {
        scalar_of(imp, zp)?
    } else {
        let (r, xs) = (imp.rank(x), imp.shape(x));
        let axis = match along {
            Along::None => return Err(format!("{what} must have one element")),
            Along::Rows if r >= 2 => r - 2,
            Along::Rows => return Err(format!("{what} per row needs {name} of rank 2 or more")),
            Along::Last => r - 1,
            Along::First => 0,
        };
        laid_along(imp, zp, &xs[axis], axis, r, &what, &format!("axis {axis} of {name}"))?
    };
    imp.binary(B::Sub, xi, zp)
}

/// A matmul `a`'s scale, per row where it has more than one element.
fn per_rows(imp: &mut Importer, s: ValueId) -> R<ValueId> {
    if per_tensor(imp, s) {
        return scalar_of(imp, s);
    }
    let m = imp.shape(s)[0].clone();
    laid_along(imp, s, &m, 0, 2, "a_scale", "the rows of a")
}

/// `p` (a scale or a zero point of `x`) broadcast to `x`'s shape: one element
/// for the tensor, a 1-D run along `axis`, or blocks of `block` along it.
fn along(imp: &mut Importer, p: ValueId, x: ValueId, axis: i64, block: i64, what: &str) -> R<ValueId> {
    let xs = imp.shape(x);
    if per_tensor(imp, p) {
        let p = scalar_of(imp, p)?;
        return imp.expand_to(p, &xs);
    }
    let a = norm_axis(axis, xs.len()).map_err(|e| format!("{what}: {e}"))?;
    if block < 0 {
        return Err(format!("block_size must not be negative, got {block}"));
    }
    if block == 0 {
        if imp.rank(p) != 1 {
            return Err(format!("{what} must be one element or 1-D along axis {a}, got {}", imp.ty(p)));
        }
        let p = laid_along(imp, p, &xs[a], a, xs.len(), what, &format!("axis {a} of the input"))?;
        return imp.expand_to(p, &xs);
    }
    // Blocked (opset 21): `p` has `x`'s shape but ceil(d / block) along `axis`.
    let ps = imp.shape(p);
    if ps.len() != xs.len() {
        return Err(format!(
            "{what} {} must have the input's rank {} for blocked quantization",
            imp.ty(p),
            xs.len()
        ));
    }
    if let (Some(d), Some(nb)) = (xs[a].as_const(), ps[a].as_const()) {
        if (d + block - 1) / block != nb {
            return Err(format!(
                "{what} has {nb} blocks along axis {a}, but {d} elements in blocks of {block} make {}",
                (d + block - 1) / block
            ));
        }
    }
    let idx = iota(imp, std::slice::from_ref(&xs[a]), 0)?;
    let idx = imp.binary_scalar(B::Div, idx, block as f64)?;
    let p = imp.emit(Op::Gather { axis: a }, vec![p, idx], None)?;
    let ps = imp.shape(p);
    let shape = imp.broadcast_shapes(&[ps, xs.clone()]).map_err(|e| format!("{what}: {e}"))?;
    let p = imp.expand_to(p, &shape)?;
    imp.reshape(p, xs)
}

/// Whether `p` has exactly one element (a scalar or a 1-element tensor).
fn per_tensor(imp: &Importer, p: ValueId) -> bool {
    imp.ty(p).is_one_element()
}

/// A one-element `p` as a rank-0 value.
fn scalar_of(imp: &mut Importer, p: ValueId) -> R<ValueId> {
    imp.reshape(p, vec![])
}

/// A 1-D `p` of `len` elements reshaped to lie along `axis` of a rank-`rank`
/// value (1 along every other axis), ready to broadcast.
fn laid_along(
    imp: &mut Importer,
    p: ValueId,
    len: &SymExpr,
    axis: usize,
    rank: usize,
    what: &str,
    of: &str,
) -> R<ValueId> {
    checked_len(imp, p, len, what, of)?;
    let mut dims = vec![SymExpr::constant(1); rank];
    dims[axis] = len.clone();
    imp.reshape(p, dims)
}

/// A 1-D `p` must have `len` elements.
fn checked_len(imp: &mut Importer, p: ValueId, len: &SymExpr, what: &str, of: &str) -> R<()> {
    let ps = imp.shape(p);
    if ps.len() != 1 {
        return Err(format!("{what} must be one element or 1-D, got {}", imp.ty(p)));
    }
    if let (Some(have), Some(want)) = (ps[0].as_const(), len.as_const()) {
        if have != want {
            return Err(format!("{what} has {have} elements but {of} has {want}"));
        }
    }
    imp.env().equate(&ps[0], len).map_err(|e| format!("{what} does not run along {of}: {e}"))
}

/// A zero point's type must be its operand's.
fn same_type(imp: &Importer, zp: ValueId, x: ValueId, what: &str, of: &str) -> R<()> {
    let (zt, xt) = (imp.ty(zp).dtype, imp.ty(x).dtype);
    if zt != xt {
        return Err(format!("{what} is {zt} but {of} is {xt}: they must have one type"));
    }
    Ok(())
}

/// A constant scale with a zero element would divide by zero.
fn nonzero_scale(imp: &Importer, s: ValueId, what: &str) -> R<()> {
    if let Some(vals) = imp.const_f64(s) {
        if let Some(i) = vals.iter().position(|v| *v == 0.0 || !v.is_finite()) {
            return Err(format!("{what} element {i} is {}: a scale must be finite and nonzero", vals[i]));
        }
    }
    Ok(())
}

/// An `output_dtype` or `precision` attribute's type.
fn output_type(code: i64) -> R<DType> {
    crate::load::dtype_of(code as i32)
        .ok_or_else(|| format!("element type {} is not supported", crate::load::dtype_name(code as i32)))
}

fn range_of(dt: DType) -> (i64, i64) {
    match dt {
        DType::I8 => (i8::MIN as i64, i8::MAX as i64),
        _ => (0, 255),
    }
}

/// `x` (i32 or f32) saturated to `out`'s range, then narrowed to it.
fn saturate(imp: &mut Importer, x: ValueId, out: DType) -> R<ValueId> {
    saturate_to(imp, x, out, range_of(out))
}

/// `x` (i32 or f32) saturated to `lo..=hi`, then cast to `out` (which holds it).
fn saturate_to(imp: &mut Importer, x: ValueId, out: DType, (lo, hi): (i64, i64)) -> R<ValueId> {
    let x = clamp(imp, x, lo as f64, hi as f64)?;
    imp.cast(x, out)
}

/// `x` clamped to `lo..=hi` (in its own type).
fn clamp(imp: &mut Importer, x: ValueId, lo: f64, hi: f64) -> R<ValueId> {
    let x = imp.binary_scalar(B::Max, x, lo)?;
    imp.binary_scalar(B::Min, x, hi)
}
