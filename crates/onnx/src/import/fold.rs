//! Compile-time evaluation of primitives on symbolic values (shape arithmetic).
//!
//! Applies when every input carries known values, the output is an integer or
//! bool tensor of constant shape and at most `KNOWN_MAX` elements, and the result
//! is provable from `ShapeEnv` facts (a comparison that cannot be decided, or an
//! integer division of a possibly negative dim, is left to run time).

use ir::{BinaryOp, ConstData, DType, Op, ReduceOp, TensorType, UnaryOp, ValueId};
use sym::SymExpr;

use super::{Importer, KNOWN_MAX, R};

fn is_intlike(d: DType) -> bool {
    d.is_int() || d == DType::Bool
}

/// The values of an integer constant small enough to track.
/// Small float constants holding integers count too: exporters write shape
/// arithmetic as `CastLike(1.0, size)`.
pub(crate) fn const_values(c: &ConstData) -> Option<Vec<SymExpr>> {
    if c.numel() > KNOWN_MAX {
        return None;
    }
    let t = c.to_tensor();
    let v = if is_intlike(c.dtype) {
        t.to_i64_vec()?
    } else {
        let f = t.to_f64_vec();
        if !f.iter().all(|x| x.fract() == 0.0 && x.abs() < 9.0e15) {
            return None;
        }
        f.iter().map(|x| *x as i64).collect()
    };
    Some(v.into_iter().map(SymExpr::constant).collect())
}

fn const_shape(t: &TensorType) -> Option<Vec<usize>> {
    t.const_shape().map(|s| s.iter().map(|d| *d as usize).collect())
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        if shape[d] > 0 {
            idx[d] = i % shape[d];
            i /= shape[d];
        }
    }
    idx
}

fn ravel(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(strides(shape)).map(|(i, s)| i * s).sum()
}

/// `Some(values)` when `op` on `inputs` can be evaluated now.
pub(crate) fn fold(imp: &Importer, op: &Op, inputs: &[ValueId], ty: &TensorType) -> R<Option<Vec<SymExpr>>> {
    // Integer results, and integer constants cast to float (exact values).
    let int_to_float = matches!(op, Op::Cast) && ty.dtype.is_float() && ty.dtype != DType::F16;
    if !is_intlike(ty.dtype) && !int_to_float {
        return Ok(None);
    }
    let Some(out_shape) = const_shape(ty) else { return Ok(None) };
    let n: usize = out_shape.iter().product();
    if n > KNOWN_MAX {
        return Ok(None);
    }
    let mut ins = Vec::with_capacity(inputs.len());
    for v in inputs {
        match (imp.known(*v), const_shape(imp.ty(*v))) {
            (Some(k), Some(s)) => ins.push((k.clone(), s)),
            _ => return Ok(None),
        }
    }
    let env = &imp.g.env;
    let r = |e: Result<SymExpr, sym::SymError>| e.map_err(|e| e.to_string());
    let out: Option<Vec<SymExpr>> = match op {
        Op::SymConst(v) => Some(v.clone()),
        Op::Iota { axis } => {
            Some((0..n).map(|i| SymExpr::constant(unravel(i, &out_shape)[*axis] as i64)).collect())
        }
        Op::Unary(u) => {
            let x = &ins[0].0;
            match u {
                UnaryOp::Neg => Some(x.iter().map(|e| r(e.try_scale(-1))).collect::<R<_>>()?),
                UnaryOp::Relu => Some(x.iter().map(|e| e.max(&SymExpr::constant(0))).collect()),
                UnaryOp::Abs => x.iter().map(|e| e.as_const().map(|c| SymExpr::constant(c.abs()))).collect(),
                UnaryOp::Not => {
                    x.iter().map(|e| e.as_const().map(|c| SymExpr::constant((c == 0) as i64))).collect()
                }
                _ => None,
            }
        }
        Op::Binary(b) => {
            let (x, y) = (&ins[0].0, &ins[1].0);
            let mut out = Vec::with_capacity(n);
            for (a, c) in x.iter().zip(y) {
                match binary(env, *b, a, c)? {
                    Some(v) => out.push(v),
                    None => return Ok(None),
                }
            }
            Some(out)
        }
        Op::Select => {
            let (c, a, b) = (&ins[0].0, &ins[1].0, &ins[2].0);
            c.iter()
                .zip(a.iter().zip(b))
                .map(|(c, (a, b))| c.as_const().map(|c| if c != 0 { a.clone() } else { b.clone() }))
                .collect()
        }
        Op::Cast => {
            let x = &ins[0].0;
            if int_to_float && x.iter().any(|e| e.as_const().is_none()) {
                return Ok(None);
            }
            if ty.dtype == DType::Bool {
                x.iter()
                    .map(|e| {
                        if env.equal(e, &SymExpr::constant(0)) {
                            Some(SymExpr::constant(0))
                        } else if env.known_ne(e, &SymExpr::constant(0)) {
                            Some(SymExpr::constant(1))
                        } else {
                            None
                        }
                    })
                    .collect()
            } else {
                Some(x.clone())
            }
        }
        Op::Reshape => Some(ins[0].0.clone()),
        Op::Broadcast => {
            let (x, s) = (&ins[0].0, &ins[0].1);
            Some(
                (0..n)
                    .map(|i| {
                        let idx: Vec<usize> = unravel(i, &out_shape)
                            .iter()
                            .zip(s)
                            .map(|(o, d)| if *d == 1 { 0 } else { *o })
                            .collect();
                        x[ravel(&idx, s)].clone()
                    })
                    .collect(),
            )
        }
        Op::Transpose { perm } => {
            let (x, s) = (&ins[0].0, &ins[0].1);
            Some(
                (0..n)
                    .map(|i| {
                        let o = unravel(i, &out_shape);
                        let mut idx = vec![0; s.len()];
                        for (k, p) in perm.iter().enumerate() {
                            idx[*p] = o[k];
                        }
                        x[ravel(&idx, s)].clone()
                    })
                    .collect(),
            )
        }
        Op::Slice { axes } => {
            let (x, s) = (&ins[0].0, &ins[0].1);
            let mut starts = vec![0i64; s.len()];
            let mut steps = vec![1i64; s.len()];
            for a in axes {
                let Some(st) = a.start.as_const() else { return Ok(None) };
                starts[a.axis] = st;
                steps[a.axis] = a.step;
            }
            let mut out = Vec::with_capacity(n);
            for i in 0..n {
                let o = unravel(i, &out_shape);
                let idx: Option<Vec<usize>> = (0..s.len())
                    .map(|d| usize::try_from(starts[d] + o[d] as i64 * steps[d]).ok().filter(|v| *v < s[d]))
                    .collect();
                let Some(idx) = idx else { return Err("slice reads outside its input".into()) };
                out.push(x[ravel(&idx, s)].clone());
            }
            Some(out)
        }
        Op::Concat { axis } => {
            let mut out = Vec::with_capacity(n);
            for i in 0..n {
                let mut o = unravel(i, &out_shape);
                let mut k = 0;
                while o[*axis] >= ins[k].1[*axis] {
                    o[*axis] -= ins[k].1[*axis];
                    k += 1;
                }
                out.push(ins[k].0[ravel(&o, &ins[k].1)].clone());
            }
            Some(out)
        }
        Op::Gather { axis } => {
            let ((x, s), (idx, is)) = (&ins[0], &ins[1]);
            let mut out = Vec::with_capacity(n);
            for i in 0..n {
                let o = unravel(i, &out_shape);
                let ii = ravel(&o[*axis..*axis + is.len()], is);
                let Some(mut j) = idx[ii].as_const() else { return Ok(None) };
                if j < 0 {
                    j += s[*axis] as i64;
                }
                let j =
                    usize::try_from(j).ok().filter(|j| *j < s[*axis]).ok_or("gather index out of range")?;
                let mut src: Vec<usize> = o[..*axis].to_vec();
                src.push(j);
                src.extend_from_slice(&o[*axis + is.len()..]);
                out.push(x[ravel(&src, s)].clone());
            }
            Some(out)
        }
        Op::Reduce { op: rop, axes, .. } => {
            let (x, s) = (&ins[0].0, &ins[0].1);
            let mut acc: Vec<Option<SymExpr>> = vec![None; n];
            let kept: Vec<usize> = (0..s.len()).filter(|d| !axes.contains(d)).collect();
            let kept_shape: Vec<usize> = kept.iter().map(|d| s[*d]).collect();
            for (i, e) in x.iter().enumerate() {
                let idx = unravel(i, s);
                let k: Vec<usize> = kept.iter().map(|d| idx[*d]).collect();
                let slot = &mut acc[ravel(&k, &kept_shape)];
                *slot = Some(match (slot.take(), rop) {
                    (None, _) => e.clone(),
                    (Some(a), ReduceOp::Sum) => r(a.try_add(e))?,
                    (Some(a), ReduceOp::Prod) => r(a.try_mul(e))?,
                    (Some(a), ReduceOp::Max) => a.max(e),
                    (Some(a), ReduceOp::Min) => a.min(e),
                    (Some(_), ReduceOp::Mean) => return Ok(None),
                });
            }
            if *rop == ReduceOp::Mean {
                return Ok(None);
            }
            let empty = match rop {
                ReduceOp::Sum => Some(SymExpr::constant(0)),
                ReduceOp::Prod => Some(SymExpr::constant(1)),
                _ => None,
            };
            acc.into_iter().map(|a| a.or_else(|| empty.clone())).collect()
        }
        _ => None,
    };
    Ok(out.map(|v| v.iter().map(|e| env.normalize(e)).collect()))
}

/// One element of a binary op, when provable.
fn binary(env: &sym::ShapeEnv, op: BinaryOp, a: &SymExpr, b: &SymExpr) -> R<Option<SymExpr>> {
    let r = |e: Result<SymExpr, sym::SymError>| e.map(Some).map_err(|e| e.to_string());
    let bool_of = |p: Option<bool>| p.map(|t| SymExpr::constant(t as i64));
    let (ca, cb) = (a.as_const(), b.as_const());
    let nonneg = |e: &SymExpr| env.range(e).lo >= 0;
    Ok(match op {
        BinaryOp::Add => return r(a.try_add(b)),
        BinaryOp::Sub => return r(a.try_sub(b)),
        BinaryOp::Mul => return r(a.try_mul(b)),
        BinaryOp::Div => match (ca, cb) {
            (_, Some(0)) => return Err("integer division by zero in a shape computation".into()),
            (Some(x), Some(y)) => Some(SymExpr::constant(x / y)), // truncates like ONNX
            (_, Some(y)) if y > 0 && nonneg(a) => return r(a.try_floor_div(y)),
            (_, Some(y)) if y < 0 && nonneg(a) => {
                return r(a.try_floor_div(-y).and_then(|q| q.try_scale(-1)))
            }
            _ => None,
        },
        BinaryOp::Mod => match (ca, cb) {
            (_, Some(0)) => return Err("integer modulo by zero in a shape computation".into()),
            (Some(x), Some(y)) => Some(SymExpr::constant(((x % y) + y) % y)),
            (_, Some(y)) if y > 0 => return r(a.try_rem(y)),
            _ => None,
        },
        BinaryOp::Max => Some(a.max(b)),
        BinaryOp::Min => Some(a.min(b)),
        BinaryOp::Pow => match (ca, cb) {
            (Some(x), Some(y)) if (0..63).contains(&y) => x.checked_pow(y as u32).map(SymExpr::constant),
            _ => None,
        },
        BinaryOp::Equal => bool_of(if env.equal(a, b) {
            Some(true)
        } else if env.known_ne(a, b) {
            Some(false)
        } else {
            None
        }),
        BinaryOp::Less => bool_of(decide(env.known_lt(a, b), env.known_le(b, a))),
        BinaryOp::Greater => bool_of(decide(env.known_lt(b, a), env.known_le(a, b))),
        BinaryOp::LessEq => bool_of(decide(env.known_le(a, b), env.known_lt(b, a))),
        BinaryOp::GreaterEq => bool_of(decide(env.known_le(b, a), env.known_lt(a, b))),
        BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => match (ca, cb) {
            (Some(x), Some(y)) => {
                let (x, y) = (x != 0, y != 0);
                let v = match op {
                    BinaryOp::And => x && y,
                    BinaryOp::Or => x || y,
                    _ => x ^ y,
                };
                Some(SymExpr::constant(v as i64))
            }
            _ => None,
        },
    })
}

/// `Some(true)` if `yes` is proven, `Some(false)` if `no` is, else undecided.
fn decide(yes: bool, no: bool) -> Option<bool> {
    if yes {
        Some(true)
    } else if no {
        Some(false)
    } else {
        None
    }
}
