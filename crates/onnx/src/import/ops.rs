//! One converter per ONNX operator: attributes read (opset differences handled),
//! compound ops split into primitives (TSCompiler's compound-op splitting).

use ir::{
    BinaryOp as B, ConvAttrs, DType, Op, PadMode, PoolAttrs, PoolKind, ReduceOp, SliceAxis, TensorType,
    UnaryOp as U, ValueId,
};
use sym::{Range, SymExpr};

use super::{
    attr_tensor, einsum, indexing, node_name, norm_axis, quantize, resize, scalar_data, shaping, transformer,
    Importer, Node, DIM_MAX, R,
};

/// Convert one node; `Ok(None)` when the operator is not supported.
pub(crate) fn convert(imp: &mut Importer, op: &str, n: &Node) -> R<Option<Vec<ValueId>>> {
    let one = |v: R<ValueId>| v.map(|v| Some(vec![v]));
    let since = match op {
        "Slice" => 10,
        "Pad" | "Clip" => 11,
        _ => 0,
    };
    if imp.opset < since {
        return Err(format!(
            "{op} before opset {since} (attribute form) is not supported; the model has opset {}",
            imp.opset
        ));
    }
    match op {
        // ---- element-wise unary
        "Relu" => one(imp.unary(U::Relu, n.input(0)?)),
        "Neg" => one(imp.unary(U::Neg, n.input(0)?)),
        "Abs" => one(imp.unary(U::Abs, n.input(0)?)),
        "Exp" => one(imp.unary(U::Exp, n.input(0)?)),
        "Log" => one(imp.unary(U::Log, n.input(0)?)),
        "Sqrt" => one(imp.unary(U::Sqrt, n.input(0)?)),
        "Reciprocal" => one(imp.unary(U::Reciprocal, n.input(0)?)),
        "Erf" => one(imp.unary(U::Erf, n.input(0)?)),
        "Tanh" => one(imp.unary(U::Tanh, n.input(0)?)),
        "Sigmoid" => one(imp.unary(U::Sigmoid, n.input(0)?)),
        "Floor" => one(imp.unary(U::Floor, n.input(0)?)),
        "Ceil" => one(imp.unary(U::Ceil, n.input(0)?)),
        "Round" => one(imp.unary(U::Round, n.input(0)?)),
        "Sin" => one(imp.unary(U::Sin, n.input(0)?)),
        "Cos" => one(imp.unary(U::Cos, n.input(0)?)),
        "Sign" => one(imp.unary(U::Sign, n.input(0)?)),
        "Not" => one(imp.unary(U::Not, n.input(0)?)),
        "IsNaN" => one(imp.unary(U::IsNaN, n.input(0)?)),
        "IsInf" => one(is_inf(imp, n)),
        "Identity" => one(n.input(0)),
        "Dropout" => {
            // Inference only: the output is the input and the mask is all true.
            if let Some(t) = n.opt_input(2) {
                if imp.const_f64(t).is_none_or(|v| v.iter().any(|x| *x != 0.0)) {
                    return Err(
                        "training_mode is (or may be) true; only inference-mode Dropout is supported".into(),
                    );
                }
            }
            let x = n.input(0)?;
            let mut outs = vec![x];
            if n.n_outputs() > 1 && !n.proto.output[1].is_empty() {
                let t = imp.scalar(DType::Bool, 1.0)?;
                let shape = imp.shape(x);
                outs.push(imp.expand_to(t, &shape)?);
            }
            Ok(Some(outs))
        }
        "LeakyRelu" => {
            let x = n.input(0)?;
            let alpha = n.float("alpha", 0.01) as f64;
            let neg = imp.binary_scalar(B::Less, x, 0.0)?;
            let scaled = imp.binary_scalar(B::Mul, x, alpha)?;
            one(imp.emit(Op::Select, vec![neg, scaled, x], None))
        }
        "HardSigmoid" => {
            let x = n.input(0)?;
            let y = imp.binary_scalar(B::Mul, x, n.float("alpha", 0.2) as f64)?;
            let y = imp.binary_scalar(B::Add, y, n.float("beta", 0.5) as f64)?;
            let y = imp.binary_scalar(B::Min, y, 1.0)?;
            one(imp.binary_scalar(B::Max, y, 0.0))
        }
        "Clip" => {
            let mut y = n.input(0)?;
            if let Some(lo) = n.opt_input(1) {
                y = imp.binary(B::Max, y, lo)?;
            }
            if let Some(hi) = n.opt_input(2) {
                y = imp.binary(B::Min, y, hi)?;
            }
            one(Ok(y))
        }
        "Gelu" => one(gelu(imp, n)),
        "Elu" | "Selu" | "Celu" | "Softplus" | "Softsign" | "HardSwish" | "ThresholdedRelu" | "Shrink"
        | "Mish" => one(activation(imp, n, op)),
        "PRelu" => {
            let (x, slope) = (n.input(0)?, n.input(1)?);
            let neg = imp.binary_scalar(B::Less, x, 0.0)?;
            let scaled = imp.binary(B::Mul, x, slope)?;
            let shape = imp.shape(scaled);
            let neg = imp.expand_to(neg, &shape)?;
            let x = imp.expand_to(x, &shape)?;
            one(imp.emit(Op::Select, vec![neg, scaled, x], None))
        }
        // ---- element-wise binary and variadic
        "Add" => one(imp.binary(B::Add, n.input(0)?, n.input(1)?)),
        "Sub" => one(imp.binary(B::Sub, n.input(0)?, n.input(1)?)),
        "Mul" => one(imp.binary(B::Mul, n.input(0)?, n.input(1)?)),
        "Div" => one(imp.binary(B::Div, n.input(0)?, n.input(1)?)),
        "Pow" => {
            let (x, y) = (n.input(0)?, n.input(1)?);
            let y = imp.cast(y, imp.ty(x).dtype)?;
            one(imp.binary(B::Pow, x, y))
        }
        "Mod" => {
            let (a, b) = (n.input(0)?, n.input(1)?);
            if imp.ty(a).dtype.is_float() && n.int("fmod", 0) == 0 {
                // The sign of the divisor (opset 28 allows it on floats): the truncated
                // remainder, plus the divisor where it is non-zero of the other sign.
                let r = imp.binary(B::Mod, a, b)?;
                let nonzero = imp.binary_scalar(B::Equal, r, 0.0)?;
                let nonzero = imp.unary(U::Not, nonzero)?;
                let rneg = imp.binary_scalar(B::Less, r, 0.0)?;
                let bneg = imp.binary_scalar(B::Less, b, 0.0)?;
                let differ = imp.binary(B::Xor, rneg, bneg)?;
                let fix = imp.binary(B::And, nonzero, differ)?;
                let shifted = imp.binary(B::Add, r, b)?;
                return one(imp.select(fix, shifted, r));
            }
            if imp.ty(a).dtype.is_int() && n.int("fmod", 0) == 1 {
                // Truncated remainder (sign of the dividend): a - trunc(a / b) * b.
                let q = imp.binary(B::Div, a, b)?;
                let qb = imp.binary(B::Mul, q, b)?;
                return one(imp.binary(B::Sub, a, qb));
            }
            one(imp.binary(B::Mod, a, b))
        }
        "Equal" => one(imp.binary(B::Equal, n.input(0)?, n.input(1)?)),
        "Less" => one(imp.binary(B::Less, n.input(0)?, n.input(1)?)),
        "Greater" => one(imp.binary(B::Greater, n.input(0)?, n.input(1)?)),
        "LessOrEqual" => one(imp.binary(B::LessEq, n.input(0)?, n.input(1)?)),
        "GreaterOrEqual" => one(imp.binary(B::GreaterEq, n.input(0)?, n.input(1)?)),
        "And" => one(imp.binary(B::And, n.input(0)?, n.input(1)?)),
        "Or" => one(imp.binary(B::Or, n.input(0)?, n.input(1)?)),
        "Xor" => one(imp.binary(B::Xor, n.input(0)?, n.input(1)?)),
        // The logical ops are bitwise on integers.
        "BitwiseAnd" => one(bitwise(imp, n, Some(B::And))),
        "BitwiseOr" => one(bitwise(imp, n, Some(B::Or))),
        "BitwiseXor" => one(bitwise(imp, n, Some(B::Xor))),
        "BitwiseNot" => one(bitwise(imp, n, None)),
        "BitShift" => one(bit_shift(imp, n)),
        "Max" => one(variadic(imp, n, B::Max)),
        "Min" => one(variadic(imp, n, B::Min)),
        "Sum" => one(variadic(imp, n, B::Add)),
        "Mean" => {
            let s = variadic(imp, n, B::Add)?;
            let k = n.inputs.iter().flatten().count() as f64;
            one(imp.binary_scalar(B::Div, s, k))
        }
        "Where" => one(imp.select(n.input(0)?, n.input(1)?, n.input(2)?)),
        "Cast" => {
            let to = n.int("to", 0) as i32;
            let dt = crate::load::dtype_of(to)
                .ok_or_else(|| format!("Cast to {} is not supported", crate::load::dtype_name(to)))?;
            one(imp.cast(n.input(0)?, dt))
        }
        "CastLike" => {
            let dt = imp.ty(n.input(1)?).dtype;
            one(imp.cast(n.input(0)?, dt))
        }
        // ---- compound ops split into primitives
        "Softmax" | "LogSoftmax" => one(softmax(imp, n, op == "LogSoftmax")),
        "LayerNormalization" => layer_norm(imp, n).map(Some),
        "BatchNormalization" => one(batch_norm(imp, n)),
        "LRN" => one(lrn(imp, n)),
        "Gemm" => one(gemm(imp, n)),
        "MatMul" => one(matmul(imp, n.input(0)?, n.input(1)?)),
        "Einsum" => {
            let eq = n.string("equation").ok_or("Einsum needs an equation")?;
            let ins: Vec<ValueId> = n.inputs.iter().flatten().copied().collect();
            one(einsum::einsum(imp, &eq, &ins))
        }
        "Conv" => one(conv(imp, n)),
        "ConvTranspose" => one(conv_transpose(imp, n)),
        "MaxPool" | "AveragePool" => {
            if op == "MaxPool" && n.n_outputs() > 1 && !n.proto.output[1].is_empty() {
                return Err("the Indices output of MaxPool is not supported".into());
            }
            one(pool(imp, n, op == "MaxPool"))
        }
        "GlobalAveragePool" | "GlobalMaxPool" => {
            let x = n.input(0)?;
            let axes: Vec<usize> = (2..imp.rank(x)).collect();
            let rop = if op == "GlobalAveragePool" { ReduceOp::Mean } else { ReduceOp::Max };
            one(imp.reduce(rop, x, axes, true))
        }
        "ReduceMean" => one(reduce(imp, n, ReduceOp::Mean, 18)),
        "ReduceSum" => one(reduce(imp, n, ReduceOp::Sum, 13)),
        "ReduceMax" => one(reduce(imp, n, ReduceOp::Max, 18)),
        "ReduceMin" => one(reduce(imp, n, ReduceOp::Min, 18)),
        "ReduceProd" => one(reduce(imp, n, ReduceOp::Prod, 18)),
        "ReduceL1" | "ReduceL2" | "ReduceSumSquare" | "ReduceLogSum" | "ReduceLogSumExp" => {
            one(reduce_composite(imp, n, op))
        }
        "CumSum" => {
            let x = n.input(0)?;
            let a = imp.const_ints(n.input(1)?, "CumSum's axis")?;
            let axis = norm_axis(*a.first().ok_or("CumSum's axis is empty")?, imp.rank(x))?;
            let (exclusive, reverse) = (n.int("exclusive", 0) != 0, n.int("reverse", 0) != 0);
            one(imp.emit(Op::CumSum { axis, exclusive, reverse }, vec![x], None))
        }
        "Trilu" => one(trilu(imp, n)),
        // ---- shapes and data movement
        "Shape" => {
            let s = imp.shape(n.input(0)?);
            let r = s.len() as i64;
            let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
            let (start, end) = (clamp(n.int("start", 0)), clamp(n.int("end", r)));
            let dims: Vec<SymExpr> = s.get(start..end.max(start)).unwrap_or_default().to_vec();
            let ty = TensorType::new(DType::I64, vec![SymExpr::constant(dims.len() as i64)]);
            one(imp.emit(Op::SymConst(dims), vec![], Some(ty)))
        }
        "Size" => {
            let numel = imp.ty(n.input(0)?).numel().map_err(|e| e.to_string())?;
            one(imp.emit(Op::SymConst(vec![numel]), vec![], Some(TensorType::new(DType::I64, vec![]))))
        }
        "Constant" => one(constant(imp, n)),
        "ConstantOfShape" => {
            let shape = imp.known_ints(n.input(0)?, "ConstantOfShape's shape")?;
            let (dtype, value) = match n.tensor("value") {
                Some(t) => {
                    let c = attr_tensor(imp, t)?;
                    let v = c.to_tensor().to_f64_vec();
                    (c.dtype, *v.first().ok_or("ConstantOfShape's value is empty")?)
                }
                None => (DType::F32, 0.0),
            };
            let s = imp.scalar(dtype, value)?;
            one(imp.expand_to(s, &shape))
        }
        "Reshape" => one(reshape(imp, n)),
        "Flatten" => {
            let x = n.input(0)?;
            let s = imp.shape(x);
            let axis = n.int("axis", 1);
            let axis = if axis < 0 { axis + s.len() as i64 } else { axis };
            if axis < 0 || axis > s.len() as i64 {
                return Err(format!("axis {axis} is out of range for rank {}", s.len()));
            }
            let (a, b) = s.split_at(axis as usize);
            one(imp.reshape(x, vec![product(a)?, product(b)?]))
        }
        "Squeeze" => one(squeeze(imp, n)),
        "Unsqueeze" => one(unsqueeze(imp, n)),
        "Transpose" => {
            let x = n.input(0)?;
            let r = imp.rank(x);
            let perm = match n.ints("perm") {
                Some(p) => p.iter().map(|a| norm_axis(*a, r)).collect::<R<Vec<_>>>()?,
                None => (0..r).rev().collect(),
            };
            one(imp.transpose(x, perm))
        }
        "Concat" => {
            let ins: Vec<ValueId> = n.inputs.iter().flatten().copied().collect();
            let first = *ins.first().ok_or("Concat needs inputs")?;
            let axis = norm_axis(n.int("axis", 0), imp.rank(first))?;
            // Sibling constraint: the dims off the axis are equal.
            for v in &ins[1..] {
                let (a, b) = (imp.shape(first), imp.shape(*v));
                if a.len() != b.len() {
                    return Err(format!("inputs have ranks {} and {}", a.len(), b.len()));
                }
                for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                    if i != axis && !imp.env().equal(x, y) {
                        imp.env().equate(x, y).map_err(|e| e.to_string())?;
                    }
                }
            }
            one(imp.emit(Op::Concat { axis }, ins, None))
        }
        "Split" => split(imp, n).map(Some),
        "Slice" => one(slice(imp, n)),
        "InstanceNormalization" => one(shaping::instance_norm(imp, n)),
        "GroupNormalization" => one(shaping::group_norm(imp, n)),
        "QuantizeLinear" => one(quantize::quantize_linear(imp, n)),
        "DequantizeLinear" => one(quantize::dequantize_linear(imp, n)),
        "DynamicQuantizeLinear" => quantize::dynamic_quantize_linear(imp, n).map(Some),
        "MatMulInteger" => one(quantize::matmul_integer(imp, n)),
        "MatMulNBits" => one(quantize::matmul_nbits(imp, n)),
        "ConvInteger" => one(quantize::conv_integer(imp, n)),
        "QLinearMatMul" => one(quantize::qlinear_matmul(imp, n)),
        "QLinearConv" => one(quantize::qlinear_conv(imp, n)),
        "RMSNormalization" => one(transformer::rms_norm(imp, n)),
        "RotaryEmbedding" => one(transformer::rotary_embedding(imp, n)),
        "Attention" => transformer::attention(imp, n).map(Some),
        "MeanVarianceNormalization" => one(shaping::mean_variance_norm(imp, n)),
        "DepthToSpace" | "SpaceToDepth" => one(shaping::depth_space(imp, n, op == "DepthToSpace")),
        "Tan" | "Sinh" | "Cosh" | "Asinh" | "Acosh" | "Atanh" | "Asin" | "Acos" | "Atan" => {
            one(shaping::trig(imp, n, op))
        }
        "LpPool" => one(lp_pool(imp, n)),
        "Resize" => one(resize::resize(imp, n)),
        "GatherElements" => one(indexing::gather_elements(imp, n)),
        "GatherND" => one(indexing::gather_nd(imp, n)),
        "ArgMax" | "ArgMin" => one(indexing::arg_extreme(imp, n, op == "ArgMax")),
        "Hardmax" => one(indexing::hardmax(imp, n)),
        "OneHot" => one(indexing::one_hot(imp, n)),
        "TopK" => indexing::top_k(imp, n).map(Some),
        "ScatterElements" | "Scatter" => one(indexing::scatter_elements(imp, n)),
        "ScatterND" => one(indexing::scatter_nd(imp, n)),
        "TensorScatter" => one(indexing::tensor_scatter(imp, n)),
        "EyeLike" => one(indexing::eye_like(imp, n)),
        "Gather" => {
            let (x, i) = (n.input(0)?, n.input(1)?);
            let axis = norm_axis(n.int("axis", 0), imp.rank(x))?;
            one(imp.emit(Op::Gather { axis }, vec![x, i], None))
        }
        "Expand" => {
            let x = n.input(0)?;
            let target = imp.known_ints(n.input(1)?, "Expand's shape")?;
            let shape = imp.broadcast_shapes(&[imp.shape(x), target])?;
            one(imp.expand_to(x, &shape))
        }
        "Tile" => one(tile(imp, n)),
        "Pad" => one(pad(imp, n)),
        "Range" => one(range(imp, n)),
        _ => Ok(None),
    }
}

fn product(dims: &[SymExpr]) -> R<SymExpr> {
    dims.iter().try_fold(SymExpr::constant(1), |a, d| a.try_mul(d)).map_err(|e| e.to_string())
}

fn variadic(imp: &mut Importer, n: &Node, op: B) -> R<ValueId> {
    let ins: Vec<ValueId> = n.inputs.iter().flatten().copied().collect();
    let mut acc = *ins.first().ok_or("needs at least one input")?;
    for v in &ins[1..] {
        acc = imp.binary(op, acc, *v)?;
    }
    Ok(acc)
}

fn is_inf(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let x = n.input(0)?;
    let inf = imp.unary(U::IsInf, x)?;
    match (n.int("detect_positive", 1) != 0, n.int("detect_negative", 1) != 0) {
        (true, true) => Ok(inf),
        (pos, neg) if pos || neg => {
            let side = imp.binary_scalar(if pos { B::Greater } else { B::Less }, x, 0.0)?;
            imp.binary(B::And, inf, side)
        }
        _ => {
            let f = imp.binary(B::And, inf, inf)?;
            let nf = imp.unary(U::Not, f)?;
            imp.binary(B::And, f, nf)
        }
    }
}

/// Element-wise activations written with primitives (formulas of the ONNX spec).
fn activation(imp: &mut Importer, n: &Node, op: &str) -> R<ValueId> {
    let x = n.input(0)?;
    let select =
        |imp: &mut Importer, c: ValueId, a: ValueId, b: ValueId| imp.emit(Op::Select, vec![c, a, b], None);
    // softplus(x) = log(1 + exp(x))
    let softplus = |imp: &mut Importer, x: ValueId| -> R<ValueId> {
        let e = imp.unary(U::Exp, x)?;
        let e1 = imp.binary_scalar(B::Add, e, 1.0)?;
        imp.unary(U::Log, e1)
    };
    match op {
        // alpha·(exp(x) - 1) for x < 0, else x; Selu scales both sides by gamma.
        "Elu" | "Selu" | "Celu" => {
            let (alpha, gamma) = match op {
                "Elu" => (n.float("alpha", 1.0) as f64, 1.0),
                "Selu" => (n.float("alpha", 1.673_263_2) as f64, n.float("gamma", 1.050_701) as f64),
                _ => (n.float("alpha", 1.0) as f64, 1.0),
            };
            // Celu: max(0, x) + min(0, alpha·(exp(x/alpha) - 1))
            let arg = if op == "Celu" { imp.binary_scalar(B::Div, x, alpha)? } else { x };
            let e = imp.unary(U::Exp, arg)?;
            let em1 = imp.binary_scalar(B::Sub, e, 1.0)?;
            let neg = imp.binary_scalar(B::Mul, em1, alpha * gamma)?;
            let pos = imp.binary_scalar(B::Mul, x, gamma)?;
            let c = imp.binary_scalar(B::Less, x, 0.0)?;
            select(imp, c, neg, pos)
        }
        "Softplus" => softplus(imp, x),
        "Softsign" => {
            let a = imp.unary(U::Abs, x)?;
            let d = imp.binary_scalar(B::Add, a, 1.0)?;
            imp.binary(B::Div, x, d)
        }
        // x · max(0, min(1, x/6 + 1/2))
        "HardSwish" => {
            let h = imp.binary_scalar(B::Mul, x, 1.0 / 6.0)?;
            let h = imp.binary_scalar(B::Add, h, 0.5)?;
            let h = imp.binary_scalar(B::Min, h, 1.0)?;
            let h = imp.binary_scalar(B::Max, h, 0.0)?;
            imp.binary(B::Mul, x, h)
        }
        "ThresholdedRelu" => {
            let c = imp.binary_scalar(B::Greater, x, n.float("alpha", 1.0) as f64)?;
            let z = imp.fill_like(x, 0.0)?;
            select(imp, c, x, z)
        }
        // x < -lambd: x + bias; x > lambd: x - bias; else 0
        "Shrink" => {
            let (l, b) = (n.float("lambd", 0.5) as f64, n.float("bias", 0.0) as f64);
            let lo = imp.binary_scalar(B::Less, x, -l)?;
            let hi = imp.binary_scalar(B::Greater, x, l)?;
            let xp = imp.binary_scalar(B::Add, x, b)?;
            let xm = imp.binary_scalar(B::Sub, x, b)?;
            let z = imp.fill_like(x, 0.0)?;
            let y = select(imp, hi, xm, z)?;
            select(imp, lo, xp, y)
        }
        // x · tanh(softplus(x))
        _ => {
            let sp = softplus(imp, x)?;
            let t = imp.unary(U::Tanh, sp)?;
            imp.binary(B::Mul, x, t)
        }
    }
}

/// `0.5·x·(1 + erf(x/√2))`, or the tanh approximation.
fn gelu(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let x = n.input(0)?;
    let inner = match n.string("approximate").as_deref().unwrap_or("none") {
        "none" => {
            let t = imp.binary_scalar(B::Mul, x, std::f64::consts::FRAC_1_SQRT_2)?;
            imp.unary(U::Erf, t)?
        }
        "tanh" => {
            let x3 = imp.binary(B::Mul, x, x)?;
            let x3 = imp.binary(B::Mul, x3, x)?;
            let t = imp.binary_scalar(B::Mul, x3, 0.044715)?;
            let t = imp.binary(B::Add, x, t)?;
            let t = imp.binary_scalar(B::Mul, t, (2.0 / std::f64::consts::PI).sqrt())?;
            imp.unary(U::Tanh, t)?
        }
        other => return Err(format!("unknown approximate='{other}'")),
    };
    let one_plus = imp.binary_scalar(B::Add, inner, 1.0)?;
    let half_x = imp.binary_scalar(B::Mul, x, 0.5)?;
    imp.binary(B::Mul, half_x, one_plus)
}

/// Softmax over `axes`: `exp(x - max) / sum(exp(x - max))`; log-softmax is
/// `x - max - log(sum)`. Before opset 13 the op works on the flattened trailing
/// dims from `axis` on.
fn softmax(imp: &mut Importer, n: &Node, log: bool) -> R<ValueId> {
    let x = n.input(0)?;
    let r = imp.rank(x);
    let axes: Vec<usize> = if imp.opset < 13 {
        (norm_axis(n.int("axis", 1), r)?..r).collect()
    } else {
        vec![norm_axis(n.int("axis", -1), r)?]
    };
    let shape = imp.shape(x);
    let m = imp.reduce(ReduceOp::Max, x, axes.clone(), true)?;
    let m = imp.expand_to(m, &shape)?;
    let d = imp.binary(B::Sub, x, m)?;
    let e = imp.unary(U::Exp, d)?;
    let s = imp.reduce(ReduceOp::Sum, e, axes, true)?;
    let s = imp.expand_to(s, &shape)?;
    if log {
        let ls = imp.unary(U::Log, s)?;
        imp.binary(B::Sub, d, ls)
    } else {
        imp.binary(B::Div, e, s)
    }
}

/// `(x - mean) / sqrt(var + eps) * scale + bias` over the trailing dims from `axis`.
fn layer_norm(imp: &mut Importer, n: &Node) -> R<Vec<ValueId>> {
    let x = n.input(0)?;
    let r = imp.rank(x);
    let axes: Vec<usize> = (norm_axis(n.int("axis", -1), r)?..r).collect();
    let eps = n.float("epsilon", 1e-5) as f64;
    let shape = imp.shape(x);
    let mean = imp.reduce(ReduceOp::Mean, x, axes.clone(), true)?;
    let mean_b = imp.expand_to(mean, &shape)?;
    let d = imp.binary(B::Sub, x, mean_b)?;
    let sq = imp.binary(B::Mul, d, d)?;
    let var = imp.reduce(ReduceOp::Mean, sq, axes, true)?;
    let var = imp.binary_scalar(B::Add, var, eps)?;
    let std = imp.unary(U::Sqrt, var)?;
    let inv = imp.unary(U::Reciprocal, std)?;
    let inv_b = imp.expand_to(inv, &shape)?;
    let mut y = imp.binary(B::Mul, d, inv_b)?;
    y = imp.binary(B::Mul, y, n.input(1)?)?;
    if let Some(b) = n.opt_input(2) {
        y = imp.binary(B::Add, y, b)?;
    }
    Ok(vec![y, mean, inv])
}

/// Inference-mode batch norm: `(x - mean) / sqrt(var + eps) * scale + bias`,
/// parameters broadcast over dim 1.
fn batch_norm(imp: &mut Importer, n: &Node) -> R<ValueId> {
    if n.n_outputs() > 1 && n.proto.output[1..].iter().any(|o| !o.is_empty()) {
        return Err("training-mode outputs of BatchNormalization are not supported".into());
    }
    let x = n.input(0)?;
    let r = imp.rank(x);
    if r < 2 {
        return Err("input needs rank >= 2".into());
    }
    let eps = n.float("epsilon", 1e-5) as f64;
    let c = imp.shape(x)[1].clone();
    let mut pshape = vec![c];
    pshape.extend(std::iter::repeat_n(SymExpr::constant(1), r - 2));
    let mut p = Vec::new();
    for i in 1..5 {
        let v = n.input(i)?;
        p.push(imp.reshape(v, pshape.clone())?);
    }
    let var = imp.binary_scalar(B::Add, p[3], eps)?;
    let std = imp.unary(U::Sqrt, var)?;
    let a = imp.binary(B::Div, p[0], std)?;
    let d = imp.binary(B::Sub, x, p[2])?;
    let y = imp.binary(B::Mul, d, a)?;
    imp.binary(B::Add, y, p[1])
}

/// Local response normalization across channels:
/// `y = x / (bias + alpha/size · Σ_{window} x²)^beta`, the window sum taken by an
/// average pool (all taps counted) over the channel axis, scaled by `size`.
fn lrn(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let x = n.input(0)?;
    let s = imp.shape(x);
    if s.len() < 3 {
        return Err("LRN needs rank >= 3".into());
    }
    let size = n.int("size", 0);
    if size < 1 {
        return Err("LRN needs size >= 1".into());
    }
    let (alpha, beta, bias) =
        (n.float("alpha", 1e-4) as f64, n.float("beta", 0.75) as f64, n.float("bias", 1.0) as f64);
    let sq = imp.binary(B::Mul, x, x)?;
    let rest = product(&s[2..])?;
    let as_image = imp.reshape(sq, vec![s[0].clone(), SymExpr::constant(1), s[1].clone(), rest.clone()])?;
    let (before, after) = ((size - 1) / 2, size - 1 - (size - 1) / 2);
    let attrs = PoolAttrs {
        kind: PoolKind::Avg { count_include_pad: true },
        kernel: vec![size, 1],
        strides: vec![1, 1],
        dilations: vec![1, 1],
        pads_begin: vec![before, 0],
        pads_end: vec![after, 0],
        channels_last: false,
    };
    let ty = TensorType::new(imp.ty(x).dtype, imp.shape(as_image));
    let mean = imp.emit(Op::Pool(attrs), vec![as_image], Some(ty))?;
    let mean = imp.reshape(mean, s)?;
    // alpha/size · Σ = alpha · mean
    let scale = imp.binary_scalar(B::Mul, mean, alpha)?;
    let scale = imp.binary_scalar(B::Add, scale, bias)?;
    let scale = imp.binary_scalar(B::Pow, scale, -beta)?;
    imp.binary(B::Mul, x, scale)
}

/// `alpha·op(A)·op(B) + beta·C`.
fn gemm(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let (mut a, mut b) = (n.input(0)?, n.input(1)?);
    if imp.rank(a) != 2 || imp.rank(b) != 2 {
        return Err("Gemm needs rank-2 A and B".into());
    }
    if n.int("transA", 0) != 0 {
        a = imp.transpose(a, vec![1, 0])?;
    }
    if n.int("transB", 0) != 0 {
        b = imp.transpose(b, vec![1, 0])?;
    }
    let mut y = matmul(imp, a, b)?;
    let alpha = n.float("alpha", 1.0) as f64;
    if alpha != 1.0 {
        y = imp.binary_scalar(B::Mul, y, alpha)?;
    }
    if let Some(c) = n.opt_input(2) {
        let beta = n.float("beta", 1.0) as f64;
        let c = if beta != 1.0 { imp.binary_scalar(B::Mul, c, beta)? } else { c };
        let shape = imp.shape(y);
        let c = imp.expand_to(c, &shape)?;
        y = imp.binary(B::Add, y, c)?;
    }
    Ok(y)
}

/// Numpy matmul: 1-D operands promoted and squeezed back, batch dims broadcast,
/// and the contraction dims recorded equal (a sibling constraint).
pub(crate) fn matmul(imp: &mut Importer, a: ValueId, b: ValueId) -> R<ValueId> {
    let (ra, rb) = (imp.rank(a), imp.rank(b));
    if ra == 0 || rb == 0 {
        return Err("MatMul operands must have rank >= 1".into());
    }
    let mut sa = imp.shape(a);
    let mut sb = imp.shape(b);
    if ra == 1 {
        sa.insert(0, SymExpr::constant(1));
    }
    if rb == 1 {
        sb.push(SymExpr::constant(1));
    }
    let (ka, kb) = (sa[sa.len() - 1].clone(), sb[sb.len() - 2].clone());
    if !imp.env().equal(&ka, &kb) {
        imp.env().equate(&ka, &kb).map_err(|e| format!("contraction dims differ ({ka} vs {kb}): {e}"))?;
    }
    // A batched activation times a weight matrix is one 2-D matmul over the
    // flattened rows: `[b.., m, k]·[k, n] = ([b..·m, k]·[k, n])` reshaped, not a
    // copy of the weight per batch entry.
    if sb.len() == 2 && sa.len() > 2 {
        let rows = product(&sa[..sa.len() - 1])?;
        let a2 = imp.reshape(a, vec![rows, ka])?;
        let b2 = imp.reshape(b, sb.clone())?;
        let y = imp.emit(Op::MATMUL, vec![a2, b2], None)?;
        let mut out = sa[..sa.len() - 1].to_vec();
        if rb != 1 {
            out.push(sb[1].clone());
        }
        return imp.reshape(y, out);
    }
    let batch = imp.broadcast_shapes(&[sa[..sa.len() - 2].to_vec(), sb[..sb.len() - 2].to_vec()])?;
    let mut ta = batch.clone();
    ta.extend_from_slice(&sa[sa.len() - 2..]);
    let mut tb = batch.clone();
    tb.extend_from_slice(&sb[sb.len() - 2..]);
    // A vector operand becomes a matrix first ([k] → [1, k] as A, [k, 1] as B).
    let a = imp.reshape(a, sa.clone())?;
    let b = imp.reshape(b, sb.clone())?;
    let a = imp.expand_to(a, &ta)?;
    let b = imp.expand_to(b, &tb)?;
    let y = imp.emit(Op::MATMUL, vec![a, b], None)?;
    let mut out = batch;
    if ra != 1 {
        out.push(sa[sa.len() - 2].clone());
    }
    if rb != 1 {
        out.push(sb[sb.len() - 1].clone());
    }
    imp.reshape(y, out)
}

/// Padding for each spatial dim from `auto_pad` / `pads`: `(begin, end)`.
fn spatial_pads(
    n: &Node,
    input: &[SymExpr],
    kernel: &[i64],
    strides: &[i64],
    dilations: &[i64],
) -> R<(Vec<i64>, Vec<i64>)> {
    let s = kernel.len();
    match n.string("auto_pad").as_deref().unwrap_or("NOTSET") {
        "NOTSET" => {
            let pads = n.ints("pads").unwrap_or_else(|| vec![0; 2 * s]);
            if pads.len() != 2 * s {
                return Err(format!("pads has {} values, expected {}", pads.len(), 2 * s));
            }
            if pads.iter().any(|p| *p < 0) {
                return Err("negative pads are not supported".into());
            }
            Ok((pads[..s].to_vec(), pads[s..].to_vec()))
        }
        "VALID" => Ok((vec![0; s], vec![0; s])),
        mode @ ("SAME_UPPER" | "SAME_LOWER") => {
            let (mut b, mut e) = (vec![0; s], vec![0; s]);
            for i in 0..s {
                let d = input[i].as_const().ok_or_else(|| {
                    format!("auto_pad={mode} with a symbolic spatial dim ({}) is not supported: the padding would depend on the shape", input[i])
                })?;
                let out = (d + strides[i] - 1) / strides[i];
                let eff = dilations[i] * (kernel[i] - 1) + 1;
                let total = ((out - 1) * strides[i] + eff - d).max(0);
                let (lo, hi) = (total / 2, total - total / 2);
                (b[i], e[i]) = if mode == "SAME_UPPER" { (lo, hi) } else { (hi, lo) };
            }
            Ok((b, e))
        }
        other => Err(format!("unknown auto_pad '{other}'")),
    }
}

fn geometry(n: &Node, kernel: &[i64]) -> R<(Vec<i64>, Vec<i64>)> {
    let s = kernel.len();
    let strides = n.ints("strides").unwrap_or_else(|| vec![1; s]);
    let dilations = n.ints("dilations").unwrap_or_else(|| vec![1; s]);
    if strides.len() != s || dilations.len() != s {
        return Err(format!("strides/dilations must have {s} values"));
    }
    if strides.iter().chain(&dilations).any(|v| *v < 1) {
        return Err("strides and dilations must be >= 1".into());
    }
    Ok((strides, dilations))
}

fn kernel_of(imp: &Importer, n: &Node, w: ValueId) -> R<Vec<i64>> {
    let ws = imp.ty(w).shape.clone();
    let from_w: Option<Vec<i64>> = ws[2..].iter().map(|d| d.as_const()).collect();
    let k = match (n.ints("kernel_shape"), from_w) {
        (Some(k), _) => k,
        (None, Some(k)) => k,
        (None, None) => return Err("the kernel's spatial extents must be constants".into()),
    };
    Ok(k)
}

/// Bias of shape `[m]` added over dim 1.
pub(crate) fn add_channel_bias(imp: &mut Importer, y: ValueId, b: ValueId) -> R<ValueId> {
    let r = imp.rank(y);
    let m = imp.shape(y)[1].clone();
    let mut bs = vec![SymExpr::constant(1), m];
    bs.extend(std::iter::repeat_n(SymExpr::constant(1), r - 2));
    let b = imp.reshape(b, bs)?;
    imp.binary(B::Add, y, b)
}

fn conv(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let y = conv_of(imp, n, n.input(0)?, n.input(1)?)?;
    match n.opt_input(2) {
        Some(b) => add_channel_bias(imp, y, b),
        None => Ok(y),
    }
}

/// The convolution of `x` by `w` with the node's geometry attributes, no bias
/// (also the quantized convolutions', on their zero-point-shifted operands).
pub(crate) fn conv_of(imp: &mut Importer, n: &Node, x: ValueId, w: ValueId) -> R<ValueId> {
    if imp.rank(x) < 3 || imp.rank(w) != imp.rank(x) {
        return Err(format!(
            "Conv needs input and weight of equal rank >= 3, got {} and {}",
            imp.ty(x),
            imp.ty(w)
        ));
    }
    let kernel = kernel_of(imp, n, w)?;
    let (strides, dilations) = geometry(n, &kernel)?;
    let xs = imp.shape(x);
    let (pads_begin, pads_end) = spatial_pads(n, &xs[2..], &kernel, &strides, &dilations)?;
    let group = n.int("group", 1);
    let cin = imp.shape(w)[1].try_mul(&SymExpr::constant(group)).map_err(|e| e.to_string())?;
    if !imp.env().equal(&xs[1], &cin) {
        imp.env()
            .equate(&xs[1], &cin)
            .map_err(|e| format!("input channels {} != group {group} x {}: {e}", xs[1], imp.shape(w)[1]))?;
    }
    let attrs = ConvAttrs { strides, dilations, pads_begin, pads_end, group };
    imp.emit(Op::Conv(attrs), vec![x, w], None)
}

fn conv_transpose(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let (x, w) = (n.input(0)?, n.input(1)?);
    if imp.rank(x) < 3 || imp.rank(w) != imp.rank(x) {
        return Err("ConvTranspose needs input and weight of equal rank >= 3".into());
    }
    let kernel = kernel_of(imp, n, w)?;
    let s = kernel.len();
    let (strides, dilations) = geometry(n, &kernel)?;
    let group = n.int("group", 1);
    let out_pad = n.ints("output_padding").unwrap_or_else(|| vec![0; s]);
    let xs = imp.shape(x);
    let w0 = imp.shape(w)[0].clone();
    if !imp.env().equal(&xs[1], &w0) {
        imp.env().equate(&xs[1], &w0).map_err(|e| e.to_string())?;
    }
    let auto_pad = n.string("auto_pad").unwrap_or_else(|| "NOTSET".into());
    let (mut pb, mut pe) = (vec![0; s], vec![0; s]);
    let output_shape = n.ints("output_shape");
    if output_shape.is_some() || auto_pad.starts_with("SAME") {
        for i in 0..s {
            let d = xs[2 + i]
                .as_const()
                .ok_or("output_shape/auto_pad SAME with a symbolic spatial dim is not supported")?;
            let eff = dilations[i] * (kernel[i] - 1) + 1;
            let full = strides[i] * (d - 1) + out_pad[i] + eff;
            let target = match &output_shape {
                Some(o) => *o.get(o.len().wrapping_sub(s) + i).ok_or("output_shape has too few values")?,
                None => d * strides[i],
            };
            let total = full - target;
            let (lo, hi) = (total / 2, total - total / 2);
            (pb[i], pe[i]) = if auto_pad == "SAME_LOWER" { (hi, lo) } else { (lo, hi) };
        }
    } else if auto_pad == "NOTSET" {
        let pads = n.ints("pads").unwrap_or_else(|| vec![0; 2 * s]);
        if pads.len() != 2 * s {
            return Err("pads has the wrong length".into());
        }
        pb = pads[..s].to_vec();
        pe = pads[s..].to_vec();
    }
    let mut shape =
        vec![xs[0].clone(), imp.shape(w)[1].try_mul(&SymExpr::constant(group)).map_err(|e| e.to_string())?];
    for i in 0..s {
        let eff = dilations[i] * (kernel[i] - 1) + 1;
        let d = xs[2 + i]
            .try_sub(&SymExpr::constant(1))
            .and_then(|v| v.try_scale(strides[i]))
            .map_err(|e| e.to_string())?;
        shape.push(
            d.try_add(&SymExpr::constant(out_pad[i] + eff - pb[i] - pe[i])).map_err(|e| e.to_string())?,
        );
    }
    let attrs = ConvAttrs { strides, dilations, pads_begin: pb, pads_end: pe, group };
    let ty = TensorType::new(imp.ty(x).dtype, shape);
    let y = imp.emit(Op::ConvTranspose(attrs), vec![x, w], Some(ty))?;
    match n.opt_input(2) {
        Some(b) => add_channel_bias(imp, y, b),
        None => Ok(y),
    }
}

fn pool(imp: &mut Importer, n: &Node, is_max: bool) -> R<ValueId> {
    let kind = if is_max {
        PoolKind::Max
    } else {
        PoolKind::Avg { count_include_pad: n.int("count_include_pad", 0) != 0 }
    };
    pool_of(imp, n, n.input(0)?, kind)
}

/// `LpPool`: `(Σ |x|^p)^(1/p)` over each window (zeros in the padding), the sum
/// an average that counts the padding times the window's size.
fn lp_pool(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let x = n.input(0)?;
    let p = n.int("p", 2);
    if p < 1 {
        return Err(format!("LpPool's p must be a positive integer, got {p}"));
    }
    let a = imp.unary(U::Abs, x)?;
    let ap = if p == 1 { a } else { imp.binary_scalar(B::Pow, a, p as f64)? };
    let avg = pool_of(imp, n, ap, PoolKind::Avg { count_include_pad: true })?;
    let size: i64 = n.ints("kernel_shape").unwrap_or_default().iter().product();
    let sum = imp.binary_scalar(B::Mul, avg, size as f64)?;
    match p {
        1 => Ok(sum),
        2 => imp.unary(U::Sqrt, sum),
        _ => imp.binary_scalar(B::Pow, sum, 1.0 / p as f64),
    }
}

fn pool_of(imp: &mut Importer, n: &Node, x: ValueId, kind: PoolKind) -> R<ValueId> {
    let r = imp.rank(x);
    if r < 3 {
        return Err("pooling needs rank >= 3".into());
    }
    let kernel = n.ints("kernel_shape").ok_or("kernel_shape is required")?;
    if kernel.len() != r - 2 || kernel.iter().any(|k| *k < 1) {
        return Err("kernel_shape must have one positive extent per spatial dim".into());
    }
    let (strides, dilations) = geometry(n, &kernel)?;
    let xs = imp.shape(x);
    let (pads_begin, pads_end) = spatial_pads(n, &xs[2..], &kernel, &strides, &dilations)?;
    let ceil = n.int("ceil_mode", 0) != 0;
    let mut shape = xs[..2].to_vec();
    for i in 0..kernel.len() {
        let eff = dilations[i] * (kernel[i] - 1) + 1;
        let span = xs[2 + i]
            .try_add(&SymExpr::constant(pads_begin[i] + pads_end[i] - eff))
            .map_err(|e| e.to_string())?;
        let mut o = if ceil { span.try_ceil_div(strides[i]) } else { span.try_floor_div(strides[i]) }
            .map_err(|e| e.to_string())?;
        o = o.try_add(&SymExpr::constant(1)).map_err(|e| e.to_string())?;
        // Ceil mode: a last window starting past the input and its left padding is dropped.
        if let (true, Some(ov), Some(d)) = (ceil, o.as_const(), xs[2 + i].as_const()) {
            if (ov - 1) * strides[i] >= d + pads_begin[i] {
                o = SymExpr::constant(ov - 1);
            }
        }
        shape.push(o);
    }
    let attrs = PoolAttrs { kind, kernel, strides, dilations, pads_begin, pads_end, channels_last: false };
    let ty = TensorType::new(imp.ty(x).dtype, shape);
    imp.emit(Op::Pool(attrs), vec![x], Some(ty))
}

/// Reductions built from a sum: L1 = Σ|x|, L2 = √Σx², SumSquare = Σx²,
/// LogSum = log Σx, LogSumExp = m + log Σexp(x - m) with m the max (stable).
fn reduce_composite(imp: &mut Importer, n: &Node, op: &str) -> R<ValueId> {
    let x = n.input(0)?;
    let (axes, keep) = match reduce_axes(imp, n, 18)? {
        Some(a) => a,
        None => return Ok(x),
    };
    let sum = |imp: &mut Importer, v: ValueId, keep: bool| imp.reduce(ReduceOp::Sum, v, axes.clone(), keep);
    match op {
        "ReduceL1" => {
            let a = imp.unary(U::Abs, x)?;
            sum(imp, a, keep)
        }
        "ReduceL2" | "ReduceSumSquare" => {
            let sq = imp.binary(B::Mul, x, x)?;
            let s = sum(imp, sq, keep)?;
            if op == "ReduceL2" {
                imp.unary(U::Sqrt, s)
            } else {
                Ok(s)
            }
        }
        "ReduceLogSum" => {
            let s = sum(imp, x, keep)?;
            imp.unary(U::Log, s)
        }
        _ => {
            let shape = imp.shape(x);
            let m = imp.reduce(ReduceOp::Max, x, axes.clone(), true)?;
            // An all -inf slice would give -inf - -inf = NaN: shift by 0 there.
            let finite = imp.unary(U::IsInf, m)?;
            let zero = imp.fill_like(m, 0.0)?;
            let m = imp.emit(Op::Select, vec![finite, zero, m], None)?;
            let mb = imp.expand_to(m, &shape)?;
            let d = imp.binary(B::Sub, x, mb)?;
            let e = imp.unary(U::Exp, d)?;
            let s = sum(imp, e, true)?;
            let l = imp.unary(U::Log, s)?;
            let y = imp.binary(B::Add, l, m)?;
            if keep {
                Ok(y)
            } else {
                let out: Vec<SymExpr> = shape
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !axes.contains(i))
                    .map(|(_, d)| d.clone())
                    .collect();
                imp.reshape(y, out)
            }
        }
    }
}

/// Reduction axes from the attribute (older opsets) or the second input, and
/// `keepdims`; `None` when the op is a no-op (`noop_with_empty_axes`).
fn reduce_axes(imp: &Importer, n: &Node, input_axes_since: i64) -> R<Option<(Vec<usize>, bool)>> {
    let x = n.input(0)?;
    let r = imp.rank(x);
    let axes = if imp.opset >= input_axes_since {
        match n.opt_input(1) {
            Some(a) => Some(imp.const_ints(a, "the reduction axes")?),
            None => None,
        }
    } else {
        n.ints("axes")
    };
    let keep = n.int("keepdims", 1) != 0;
    let axes: Vec<usize> = match axes {
        Some(a) if !a.is_empty() => a.iter().map(|a| norm_axis(*a, r)).collect::<R<_>>()?,
        _ if n.int("noop_with_empty_axes", 0) != 0 => return Ok(None),
        _ => (0..r).collect(),
    };
    Ok(Some((axes, keep)))
}

/// Reduction axes from the attribute (older opsets) or the second input.
fn reduce(imp: &mut Importer, n: &Node, op: ReduceOp, input_axes_since: i64) -> R<ValueId> {
    let x = n.input(0)?;
    match reduce_axes(imp, n, input_axes_since)? {
        Some((axes, keep)) => imp.reduce(op, x, axes, keep),
        None => Ok(x),
    }
}

fn trilu(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let x = n.input(0)?;
    let r = imp.rank(x);
    if r < 2 {
        return Err("Trilu needs rank >= 2".into());
    }
    let k = match n.opt_input(1) {
        Some(k) => *imp.const_ints(k, "Trilu's k")?.first().ok_or("k is empty")?,
        None => 0,
    };
    let s = imp.shape(x);
    let plane = TensorType::new(DType::I64, s[r - 2..].to_vec());
    let rows = imp.emit(Op::Iota { axis: 0 }, vec![], Some(plane.clone()))?;
    let cols = imp.emit(Op::Iota { axis: 1 }, vec![], Some(plane))?;
    let diff = imp.binary(B::Sub, cols, rows)?;
    let cmp = if n.int("upper", 1) != 0 { B::GreaterEq } else { B::LessEq };
    let keep = imp.binary_scalar(cmp, diff, k as f64)?;
    let keep = imp.expand_to(keep, &s)?;
    let zero = imp.fill_like(x, 0.0)?;
    imp.emit(Op::Select, vec![keep, x, zero], None)
}

fn constant(imp: &mut Importer, n: &Node) -> R<ValueId> {
    if let Some(t) = n.tensor("value") {
        let c = attr_tensor(imp, t)?;
        return Ok(imp.constant(c));
    }
    let data = if let Some(f) =
        n.proto.attribute.iter().find(|a| a.name.as_deref() == Some("value_float")).and_then(|a| a.f)
    {
        scalar_data(DType::F32, f as f64)?
    } else if let Some(i) =
        n.proto.attribute.iter().find(|a| a.name.as_deref() == Some("value_int")).and_then(|a| a.i)
    {
        super::int_const(DType::I64, &[], &[i])?
    } else if let Some(v) = n.floats("value_floats") {
        let t = ir::Tensor::new(vec![v.len()], ir::Elems::F32(v)).map_err(|e| e.to_string())?;
        ir::ConstData::from_tensor(&t)
    } else if let Some(v) = n.ints("value_ints") {
        super::int_const(DType::I64, &[v.len() as i64], &v)?
    } else {
        return Err("Constant needs a value, value_float(s) or value_int(s) attribute (sparse and string values are not supported)".into());
    };
    Ok(imp.constant(data))
}

/// ONNX Reshape: `0` copies the input dim (unless `allowzero`), `-1` is inferred.
fn reshape(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let x = n.input(0)?;
    let target = imp.known_ints(n.input(1)?, "Reshape's shape")?;
    let xs = imp.shape(x);
    let allow_zero = n.int("allowzero", 0) != 0;
    let mut out = Vec::with_capacity(target.len());
    let mut infer_at = None;
    for (i, d) in target.iter().enumerate() {
        match d.as_const() {
            Some(0) if !allow_zero => {
                out.push(xs.get(i).cloned().ok_or("a 0 in the shape has no input dim to copy")?)
            }
            Some(-1) => {
                if infer_at.replace(i).is_some() {
                    return Err("the shape has more than one -1".into());
                }
                out.push(SymExpr::constant(1));
            }
            Some(v) if v < -1 => return Err(format!("invalid dim {v} in the shape")),
            _ => out.push(d.clone()),
        }
    }
    if let Some(i) = infer_at {
        let total = product(&xs)?;
        let known = product(&out)?;
        out[i] = div_exact(imp, &total, &known).ok_or_else(|| {
            format!("cannot infer the -1 dim: {total} is not provably divisible by {known}")
        })?;
    }
    imp.reshape(x, out)
}

/// `a / b` when it is exact: a constant `b` dividing every coefficient, or a
/// single-term `b` whose factors appear in every term of `a`.
pub(crate) fn div_exact(imp: &mut Importer, a: &SymExpr, b: &SymExpr) -> Option<SymExpr> {
    let env = imp.env();
    let (a, b) = (env.normalize(a), env.normalize(b));
    if env.equal(&a, &b) {
        return Some(SymExpr::constant(1));
    }
    a.try_div_exact(&b)
}

fn squeeze(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let x = n.input(0)?;
    let s = imp.shape(x);
    let axes = if imp.opset >= 13 {
        match n.opt_input(1) {
            Some(a) => Some(imp.const_ints(a, "Squeeze's axes")?),
            None => None,
        }
    } else {
        n.ints("axes")
    };
    let axes: Vec<usize> = match axes {
        Some(a) => a.iter().map(|a| norm_axis(*a, s.len())).collect::<R<_>>()?,
        None => (0..s.len()).filter(|i| s[*i].as_const() == Some(1)).collect(),
    };
    let mut out = Vec::new();
    for (i, d) in s.iter().enumerate() {
        if axes.contains(&i) {
            if !imp.env().equal(d, &SymExpr::constant(1)) {
                imp.env()
                    .equate(d, &SymExpr::constant(1))
                    .map_err(|_| format!("cannot squeeze dim {i} of size {d}"))?;
            }
        } else {
            out.push(d.clone());
        }
    }
    imp.reshape(x, out)
}

fn unsqueeze(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let x = n.input(0)?;
    let s = imp.shape(x);
    let axes = if imp.opset >= 13 {
        imp.const_ints(n.input(1)?, "Unsqueeze's axes")?
    } else {
        n.ints("axes").ok_or("axes is required")?
    };
    let r = s.len() + axes.len();
    let mut axes: Vec<usize> = axes.iter().map(|a| norm_axis(*a, r)).collect::<R<_>>()?;
    axes.sort_unstable();
    let mut out = Vec::with_capacity(r);
    let mut it = s.into_iter();
    for i in 0..r {
        if axes.contains(&i) {
            out.push(SymExpr::constant(1));
        } else {
            out.push(it.next().ok_or("duplicate axes")?);
        }
    }
    imp.reshape(x, out)
}

fn split(imp: &mut Importer, n: &Node) -> R<Vec<ValueId>> {
    let x = n.input(0)?;
    let s = imp.shape(x);
    let axis = norm_axis(n.int("axis", 0), s.len())?;
    let d = s[axis].clone();
    let k = n.n_outputs();
    let sizes: Vec<SymExpr> = if let Some(v) = if imp.opset >= 13 { n.opt_input(1) } else { None } {
        imp.known_ints(v, "Split's sizes")?
    } else if let Some(v) = n.ints("split") {
        v.into_iter().map(SymExpr::constant).collect()
    } else {
        // Equal parts (the last one smaller when `num_outputs` does not divide).
        let part = d.try_ceil_div(k as i64).map_err(|e| e.to_string())?;
        let mut v = vec![part.clone(); k - 1];
        let used = part.try_scale(k as i64 - 1).map_err(|e| e.to_string())?;
        v.push(d.try_sub(&used).map_err(|e| e.to_string())?);
        v
    };
    if sizes.len() != k {
        return Err(format!("{} split sizes for {k} outputs", sizes.len()));
    }
    let total =
        sizes.iter().try_fold(SymExpr::constant(0), |a, s| a.try_add(s)).map_err(|e| e.to_string())?;
    if !imp.env().equal(&total, &d) {
        imp.env().equate(&total, &d).map_err(|e| format!("split sizes add up to {total}, not {d}: {e}"))?;
    }
    let mut start = SymExpr::constant(0);
    let mut outs = Vec::with_capacity(k);
    for (i, size) in sizes.iter().enumerate() {
        imp.hint = n.proto.output.get(i).cloned().unwrap_or_default();
        let mut shape = s.clone();
        shape[axis] = size.clone();
        let ty = TensorType::new(imp.ty(x).dtype, shape);
        outs.push(imp.emit(
            Op::Slice { axes: vec![SliceAxis { axis, start: start.clone(), step: 1 }] },
            vec![x],
            Some(ty),
        )?);
        start = start.try_add(size).map_err(|e| e.to_string())?;
    }
    Ok(outs)
}

/// ONNX Slice with clamping done symbolically; the `ShapeEnv` removes the
/// `min`/`max` whenever it can prove the bound is inside the dim.
fn slice(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let x = n.input(0)?;
    let s = imp.shape(x);
    let starts = imp.known_ints(n.input(1)?, "Slice's starts")?;
    let ends = imp.known_ints(n.input(2)?, "Slice's ends")?;
    let axes = match n.opt_input(3) {
        Some(a) => imp.const_ints(a, "Slice's axes")?,
        None => (0..starts.len() as i64).collect(),
    };
    let steps = match n.opt_input(4) {
        Some(a) => imp.const_ints(a, "Slice's steps")?,
        None => vec![1; starts.len()],
    };
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err("starts, ends, axes and steps must have the same length".into());
    }
    let mut shape = s.clone();
    let mut sl = Vec::new();
    for i in 0..starts.len() {
        let axis = norm_axis(axes[i], s.len())?;
        let step = steps[i];
        if step == 0 {
            return Err("slice step 0".into());
        }
        let dim = s[axis].clone();
        let shift = if step > 0 { 0 } else { -1 };
        let (start, end) =
            (clamp_bound(imp, n, &starts[i], &dim, shift)?, clamp_bound(imp, n, &ends[i], &dim, shift)?);
        // len = max(0, ceil((end - start) / step))
        let span =
            if step > 0 { end.try_sub(&start) } else { start.try_sub(&end) }.map_err(|e| e.to_string())?;
        let len = span.try_ceil_div(step.abs()).map_err(|e| e.to_string())?;
        let len = simplify_max0(imp, len);
        shape[axis] = len;
        if step == 1 && imp.env().equal(&start, &SymExpr::constant(0)) && imp.env().equal(&shape[axis], &dim)
        {
            continue;
        }
        sl.push(SliceAxis { axis, start, step });
    }
    if sl.is_empty() {
        return Ok(x);
    }
    sl.sort_by_key(|a| a.axis);
    let ty = TensorType::new(imp.ty(x).dtype, shape);
    imp.emit(Op::Slice { axes: sl }, vec![x], Some(ty))
}

/// `max(0, e)`, dropped when `e >= 0` is provable.
fn simplify_max0(imp: &mut Importer, e: SymExpr) -> SymExpr {
    if imp.env().range(&e).lo >= 0 {
        e
    } else {
        e.max(&SymExpr::constant(0))
    }
}

/// A slice bound resolved against `dim`: negative values count from the end, then
/// clamped to `[0, dim]` (`lo_shift = 0`, positive steps) or `[-1, dim-1]`
/// (`lo_shift = -1`, negative steps).
fn clamp_bound(imp: &mut Importer, n: &Node, b: &SymExpr, dim: &SymExpr, lo_shift: i64) -> R<SymExpr> {
    let e = |r: Result<SymExpr, sym::SymError>| r.map_err(|e| e.to_string());
    let lo = SymExpr::constant(lo_shift);
    let hi = e(dim.try_add(&lo))?;
    let v = match b.as_const() {
        // Bounds at or beyond the largest dim mean "to the end".
        Some(c) if c >= DIM_MAX => return Ok(hi),
        Some(c) if c <= -DIM_MAX => return Ok(lo),
        Some(c) if c < 0 => e(dim.try_add(b))?,
        _ => {
            let r = imp.env().range(b);
            if r.hi < 0 {
                // Provably negative (`-seq`): counts from the end.
                e(dim.try_add(b))?
            } else if r.lo >= 0 {
                b.clone()
            } else {
                // Either sign is possible by the ranges alone: the bound is read
                // as counting from the start (a difference of dims such as
                // `total - seq`, the model's intent), and binding refuses a
                // call where it is negative.
                let why =
                    format!("node '{}' (Slice): its bound {b} is taken as not negative", node_name(n.proto));
                imp.env().assume(b, Range::at_least(0), &why).map_err(|e| e.to_string())?;
                b.clone()
            }
        }
    };
    let env = imp.env();
    let v = if env.known_le(&v, &hi) { v } else { v.min(&hi) };
    let v = if env.known_le(&lo, &v) { v } else { v.max(&lo) };
    Ok(env.normalize(&v))
}

fn tile(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let x = n.input(0)?;
    let reps = imp.known_ints(n.input(1)?, "Tile's repeats")?;
    let s = imp.shape(x);
    if reps.len() != s.len() {
        return Err(format!("{} repeats for rank {}", reps.len(), s.len()));
    }
    // x[d0, d1] → [1, d0, 1, d1] → broadcast [r0, d0, r1, d1] → [r0*d0, r1*d1]
    let mut inter = Vec::new();
    let mut wide = Vec::new();
    let mut out = Vec::new();
    for (d, r) in s.iter().zip(&reps) {
        inter.extend([SymExpr::constant(1), d.clone()]);
        wide.extend([r.clone(), d.clone()]);
        out.push(r.try_mul(d).map_err(|e| e.to_string())?);
    }
    let y = imp.reshape(x, inter)?;
    let y = imp.expand_to(y, &wide)?;
    imp.reshape(y, out)
}

fn pad(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let x = n.input(0)?;
    let r = imp.rank(x);
    let raw = imp.known_ints(n.input(1)?, "Pad's pads")?;
    let axes: Vec<usize> = match n.opt_input(3) {
        Some(a) => imp.const_ints(a, "Pad's axes")?.iter().map(|a| norm_axis(*a, r)).collect::<R<_>>()?,
        None => (0..r).collect(),
    };
    if raw.len() != 2 * axes.len() {
        return Err(format!("{} pads for {} axes", raw.len(), axes.len()));
    }
    let mut pads = vec![(SymExpr::constant(0), SymExpr::constant(0)); r];
    for (i, a) in axes.iter().enumerate() {
        pads[*a] = (raw[i].clone(), raw[i + axes.len()].clone());
    }
    let mode = match n.string("mode").as_deref().unwrap_or("constant") {
        "constant" => {
            let v = match n.opt_input(2) {
                Some(c) => match imp.const_f64(c) {
                    Some(v) => *v.first().ok_or("constant_value is empty")?,
                    // A value computed from data: the padding is selected where a
                    // padded mask of the input is false.
                    None => return pad_with_value(imp, x, pads, c),
                },
                None => 0.0,
            };
            PadMode::Constant(v)
        }
        "reflect" => PadMode::Reflect,
        "edge" => PadMode::Edge,
        "wrap" => PadMode::Wrap,
        other => return Err(format!("Pad mode '{other}' is not supported")),
    };
    imp.emit(Op::Pad { pads, mode }, vec![x], None)
}

/// A bitwise op on integers (`None`: not).
fn bitwise(imp: &mut Importer, n: &Node, op: Option<B>) -> R<ValueId> {
    let x = n.input(0)?;
    if !imp.ty(x).dtype.is_int() {
        return Err(format!("bitwise operands must be integers, got {}", imp.ty(x).dtype));
    }
    match op {
        Some(op) => imp.binary(op, x, n.input(1)?),
        None => imp.unary(U::Not, x),
    }
}

/// `BitShift` (opset 28 semantics, signed types too): in i64, a left shift is
/// a wrapping product with `2^y` (read from a table: exact for every `y` below
/// the width), a right shift a floor division (arithmetic for signed types);
/// a shift below 0 or at least the width gives 0 (or -1, shifting a negative
/// value right).
fn bit_shift(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let (x, y) = (n.input(0)?, n.input(1)?);
    let dt = imp.ty(x).dtype;
    let (bits, signed) = match dt {
        DType::U8 => (8, false),
        DType::I8 => (8, true),
        DType::I32 => (32, true),
        DType::I64 => (64, true),
        other => return Err(format!("BitShift of {other}")),
    };
    let left = match n.string("direction").as_deref() {
        Some("LEFT") => true,
        Some("RIGHT") => false,
        d => return Err(format!("BitShift direction {d:?} (LEFT or RIGHT)")),
    };
    let (xw, yw) = (imp.cast(x, DType::I64)?, imp.cast(y, DType::I64)?);
    let (zero, width) = (imp.scalar(DType::I64, 0.0)?, imp.scalar(DType::I64, bits as f64)?);
    let (ge0, below) = (imp.binary(B::GreaterEq, yw, zero)?, imp.binary(B::Less, yw, width)?);
    let valid = imp.binary(B::And, ge0, below)?;
    let ys = imp.select(valid, yw, zero)?;
    // 2^k for k < bits (2^63 wraps to i64::MIN: its low 64 bits).
    let powers: Vec<i64> = (0..bits).map(|k| 1i64.wrapping_shl(k)).collect();
    let table = imp.constant(super::int_const(DType::I64, &[bits as i64], &powers)?);
    let p = imp.emit(Op::Gather { axis: 0 }, vec![table, ys], None)?;
    let negative = imp.binary(B::Less, xw, zero)?;
    let minus_one = imp.scalar(DType::I64, -1.0)?;
    let (shifted, outside) = if left {
        (imp.binary(B::Mul, xw, p)?, zero)
    } else {
        // Floor division, x - (x mod p) being a multiple of p (p > 0 below the
        // top bit; a signed value shifted by width - 1 is its sign).
        let m = imp.binary(B::Mod, xw, p)?;
        let d = imp.binary(B::Sub, xw, m)?;
        let q = imp.binary(B::Div, d, p)?;
        let sign = imp.select(negative, minus_one, zero)?;
        let top = imp.scalar(DType::I64, (bits - 1) as f64)?;
        let at_top = imp.binary(B::Equal, ys, top)?;
        let q = if signed && bits == 64 { imp.select(at_top, sign, q)? } else { q };
        (q, if signed { sign } else { zero })
    };
    let r = imp.select(valid, shifted, outside)?;
    imp.cast(r, dt)
}

/// A constant pad whose value `c` (one element) is computed at run time:
/// `select(pad(true), pad(x, 0), c)`.
pub(crate) fn pad_with_value(
    imp: &mut Importer,
    x: ValueId,
    pads: Vec<(SymExpr, SymExpr)>,
    c: ValueId,
) -> R<ValueId> {
    let zero = PadMode::Constant(0.0);
    let padded = imp.emit(Op::Pad { pads: pads.clone(), mode: zero }, vec![x], None)?;
    let ones = imp.fill_like(x, 1.0)?;
    let inside = imp.cast(ones, DType::Bool)?;
    let inside = imp.emit(Op::Pad { pads, mode: zero }, vec![inside], None)?;
    let c = imp.reshape(c, vec![])?;
    let c = imp.cast(c, imp.ty(x).dtype)?;
    imp.select(inside, padded, c)
}

/// `Range(start, limit, delta)`: constants fold; a symbolic length becomes
/// `iota * delta + start`.
fn range(imp: &mut Importer, n: &Node) -> R<ValueId> {
    let (s, l, d) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let dtype = imp.ty(s).dtype;
    if dtype.is_float() {
        let (Some(a), Some(b), Some(c)) = (imp.const_f64(s), imp.const_f64(l), imp.const_f64(d)) else {
            return Err("a float Range needs constant start, limit and delta".into());
        };
        let (a, b, c) = (a[0], b[0], c[0]);
        if c == 0.0 {
            return Err("Range with delta 0".into());
        }
        let len = ((b - a) / c).ceil().max(0.0) as usize;
        let ty = TensorType::fixed(dtype, &[len as i64]);
        let i = imp.emit(Op::Iota { axis: 0 }, vec![], Some(ty))?;
        let i = imp.binary_scalar(B::Mul, i, c)?;
        return imp.binary_scalar(B::Add, i, a);
    }
    let one = |imp: &Importer, v: ValueId, what: &str| -> R<SymExpr> {
        imp.known_ints(v, what)?.first().cloned().ok_or_else(|| format!("{what} is empty"))
    };
    let (a, b, c) =
        (one(imp, s, "Range's start")?, one(imp, l, "Range's limit")?, one(imp, d, "Range's delta")?);
    let c = c.as_const().ok_or("Range's delta must be a constant")?;
    if c == 0 {
        return Err("Range with delta 0".into());
    }
    let span = if c > 0 { b.try_sub(&a) } else { a.try_sub(&b) }.map_err(|e| e.to_string())?;
    let len = span.try_ceil_div(c.abs()).map_err(|e| e.to_string())?;
    let len = simplify_max0(imp, len);
    let ty = TensorType::new(dtype, vec![len]);
    let mut i = imp.emit(Op::Iota { axis: 0 }, vec![], Some(ty))?;
    if c != 1 {
        i = imp.binary_scalar(B::Mul, i, c as f64)?;
    }
    if a.as_const() == Some(0) {
        return Ok(i);
    }
    let start = imp.emit(Op::SymConst(vec![a]), vec![], Some(TensorType::new(DType::I64, vec![])))?;
    let start = imp.cast(start, dtype)?;
    imp.binary(B::Add, i, start)
}
