//! Output types of the ops whose output is determined by their inputs.
//!
//! The importer calls [`infer`] after recording the constraints an op implies
//! (matmul's K, equal operand shapes) in the `ShapeEnv`; the verifier calls it to
//! check a node's stored type. Ops whose output shape is part of the node
//! (reshape, broadcast, slice, iota, cast, pool, conv-transpose, sym-const) have
//! no inferred type: [`infer`] returns `Ok(None)` and the verifier checks them
//! against their own rules.

use sym::{ShapeEnv, SymExpr};

use crate::{BinaryOp, DType, IrError, Op, TensorType, UnaryOp};

fn err(op: &Op, msg: impl Into<String>) -> IrError {
    IrError::Type { op: op.name().to_string(), msg: msg.into() }
}

fn same_shape(op: &Op, env: &ShapeEnv, a: &TensorType, b: &TensorType) -> Result<(), IrError> {
    if a.rank() != b.rank() || a.shape.iter().zip(&b.shape).any(|(x, y)| !env.equal(x, y)) {
        return Err(err(op, format!("operands must have the same shape, got {a} and {b}")));
    }
    Ok(())
}

/// The output type of `op` on inputs `ins`, when the inputs determine it.
pub fn infer(op: &Op, ins: &[&TensorType], env: &ShapeEnv) -> Result<Option<TensorType>, IrError> {
    if let Some(n) = op.arity() {
        if ins.len() != n {
            return Err(err(op, format!("takes {n} inputs, got {}", ins.len())));
        }
    }
    let ty = match op {
        Op::Constant(c) => c.ty(),
        Op::Unary(u) => {
            let x = ins[0];
            let dtype = match u {
                // Logical on bools, bitwise on integers.
                UnaryOp::Not => {
                    if x.dtype != DType::Bool && !x.dtype.is_int() {
                        return Err(err(op, format!("needs bool or integers, got {}", x.dtype)));
                    }
                    x.dtype
                }
                UnaryOp::IsNaN | UnaryOp::IsInf => DType::Bool,
                _ => x.dtype,
            };
            TensorType::new(dtype, x.shape.clone())
        }
        Op::Binary(b) => {
            let (x, y) = (ins[0], ins[1]);
            same_shape(op, env, x, y)?;
            if x.dtype != y.dtype && *b != BinaryOp::Pow {
                return Err(err(op, format!("operand dtypes differ: {} and {}", x.dtype, y.dtype)));
            }
            // Logical on bools, bitwise on integers.
            if b.is_logical() && x.dtype != DType::Bool && !x.dtype.is_int() {
                return Err(err(op, format!("needs bool or integer operands, got {}", x.dtype)));
            }
            let dtype = if b.is_comparison() { DType::Bool } else { x.dtype };
            TensorType::new(dtype, x.shape.clone())
        }
        Op::Select => {
            let (c, a, b) = (ins[0], ins[1], ins[2]);
            if c.dtype != DType::Bool {
                return Err(err(op, format!("condition must be bool, got {}", c.dtype)));
            }
            same_shape(op, env, c, a)?;
            same_shape(op, env, a, b)?;
            if a.dtype != b.dtype {
                return Err(err(op, format!("branch dtypes differ: {} and {}", a.dtype, b.dtype)));
            }
            a.clone()
        }
        Op::Transpose { perm } => {
            let x = ins[0];
            let mut seen = vec![false; x.rank()];
            if perm.len() != x.rank()
                || perm.iter().any(|p| *p >= x.rank() || std::mem::replace(&mut seen[*p], true))
            {
                return Err(err(op, format!("{perm:?} is not a permutation of rank {}", x.rank())));
            }
            TensorType::new(x.dtype, perm.iter().map(|p| x.shape[*p].clone()).collect())
        }
        Op::Concat { axis } => {
            let first = ins.first().ok_or_else(|| err(op, "needs at least one input"))?;
            if *axis >= first.rank() {
                return Err(err(op, format!("axis {axis} out of range for rank {}", first.rank())));
            }
            let mut shape = first.shape.clone();
            for t in &ins[1..] {
                if t.rank() != first.rank() || t.dtype != first.dtype {
                    return Err(err(op, format!("inputs {first} and {t} do not match")));
                }
                for (i, (a, b)) in first.shape.iter().zip(&t.shape).enumerate() {
                    if i != *axis && !env.equal(a, b) {
                        return Err(err(op, format!("inputs {first} and {t} differ off the concat axis")));
                    }
                }
                shape[*axis] = shape[*axis].try_add(&t.shape[*axis])?;
            }
            TensorType::new(first.dtype, shape)
        }
        Op::Gather { axis } => {
            let (d, i) = (ins[0], ins[1]);
            if *axis >= d.rank() {
                return Err(err(op, format!("axis {axis} out of range for rank {}", d.rank())));
            }
            if !matches!(i.dtype, DType::I64 | DType::I32) {
                return Err(err(op, format!("indices must be i64 or i32, got {}", i.dtype)));
            }
            let mut shape = d.shape[..*axis].to_vec();
            shape.extend(i.shape.iter().cloned());
            shape.extend(d.shape[axis + 1..].iter().cloned());
            TensorType::new(d.dtype, shape)
        }
        Op::Pad { pads, .. } => {
            let x = ins[0];
            if pads.len() != x.rank() {
                return Err(err(op, format!("{} pads for rank {}", pads.len(), x.rank())));
            }
            let shape = x
                .shape
                .iter()
                .zip(pads)
                .map(|(d, (b, e))| d.try_add(b)?.try_add(e))
                .collect::<Result<Vec<_>, _>>()?;
            TensorType::new(x.dtype, shape)
        }
        Op::Reduce { axes, keep_dims, .. } => {
            let x = ins[0];
            if axes.iter().any(|a| *a >= x.rank()) {
                return Err(err(op, format!("axes {axes:?} out of range for rank {}", x.rank())));
            }
            let mut shape = Vec::new();
            for (i, d) in x.shape.iter().enumerate() {
                if axes.contains(&i) {
                    if *keep_dims {
                        shape.push(SymExpr::constant(1));
                    }
                } else {
                    shape.push(d.clone());
                }
            }
            TensorType::new(x.dtype, shape)
        }
        Op::MatMul { transpose_a, transpose_b } => {
            // The operands as the contraction sees them (last two axes swapped when transposed).
            let view = |t: &TensorType, swap: bool| {
                let mut t = t.clone();
                let r = t.rank();
                if swap && r >= 2 {
                    t.shape.swap(r - 2, r - 1);
                }
                t
            };
            let (a, b) = (&view(ins[0], *transpose_a), &view(ins[1], *transpose_b));
            let r = a.rank();
            if r < 2 || b.rank() != r {
                return Err(err(op, format!("needs equal ranks >= 2, got {a} and {b}")));
            }
            if a.dtype != b.dtype {
                return Err(err(op, format!("operand dtypes differ: {} and {}", a.dtype, b.dtype)));
            }
            for i in 0..r - 2 {
                if !env.equal(&a.shape[i], &b.shape[i]) {
                    return Err(err(op, format!("batch dims differ: {a} and {b}")));
                }
            }
            if !env.equal(&a.shape[r - 1], &b.shape[r - 2]) {
                return Err(err(op, format!("contraction dims differ: {a} and {b}")));
            }
            let mut shape = a.shape[..r - 1].to_vec();
            shape.push(b.shape[r - 1].clone());
            TensorType::new(a.dtype, shape)
        }
        Op::Conv(c) => {
            let (x, w) = (ins[0], ins[1]);
            let s = x
                .rank()
                .checked_sub(2)
                .filter(|s| *s >= 1)
                .ok_or_else(|| err(op, "input needs rank >= 3"))?;
            if w.rank() != x.rank()
                || [&c.strides, &c.dilations, &c.pads_begin, &c.pads_end].iter().any(|v| v.len() != s)
            {
                return Err(err(op, format!("geometry does not match input {x} and weight {w}")));
            }
            if c.group < 1 || c.strides.iter().chain(&c.dilations).any(|v| *v < 1) {
                return Err(err(op, "group, strides and dilations must be >= 1"));
            }
            let cin = w.shape[1].try_mul(&SymExpr::constant(c.group))?;
            if !env.equal(&x.shape[1], &cin) {
                return Err(err(
                    op,
                    format!(
                        "input channels {} != group {} x weight channels {}",
                        x.shape[1], c.group, w.shape[1]
                    ),
                ));
            }
            let mut shape = vec![x.shape[0].clone(), w.shape[0].clone()];
            for i in 0..s {
                let k =
                    w.shape[2 + i].as_const().ok_or_else(|| err(op, "kernel extents must be constants"))?;
                // Checked: the attributes may come from untrusted text or models.
                let pad = k
                    .checked_sub(1)
                    .and_then(|k1| c.dilations[i].checked_mul(k1))
                    .and_then(|e| e.checked_add(1))
                    .and_then(|eff| c.pads_begin[i].checked_add(c.pads_end[i])?.checked_sub(eff))
                    .ok_or_else(|| err(op, "convolution geometry overflows"))?;
                let num = x.shape[2 + i].try_add(&SymExpr::constant(pad))?;
                shape.push(num.try_floor_div(c.strides[i])?.try_add(&SymExpr::constant(1))?);
            }
            TensorType::new(x.dtype, shape)
        }
        Op::CumSum { axis, .. } => {
            let x = ins[0];
            if *axis >= x.rank() {
                return Err(err(op, format!("axis {axis} out of range for rank {}", x.rank())));
            }
            x.clone()
        }
        Op::SymConst(_)
        | Op::Iota { .. }
        | Op::Cast
        | Op::Broadcast
        | Op::Reshape
        | Op::Slice { .. }
        | Op::ConvTranspose(_)
        | Op::Pool(_) => return Ok(None),
    };
    Ok(Some(ty))
}
