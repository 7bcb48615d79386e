//! A contraction's epilogue whose scale and bias are computed, not read: a
//! quantized product's `(acc − z·colsum[col])·s` (the zero point and scale of
//! the activation's dynamic quantization, known only per call), a scale per
//! output channel. As an affine function of the accumulator it is
//! `coef[col]·acc + Σ terms[col] + residual`, where the coefficient and the
//! terms vary along the columns only: they are moved into a program of their
//! own over the columns, run before the product, and the kernel reads its
//! outputs as column scales and a bias, applying the epilogue while the tile
//! is in registers instead of a loop program reading and writing the whole
//! output again.

use std::collections::HashMap;

use ir::{BinaryOp, DType, Graph, UnaryOp, ValueId};
use plan::{BufId, Exprs, Node, E};
use sym::SymExpr;

use crate::build::Builder;

/// Where the accumulator is read in the epilogue's expression.
pub(crate) struct Site<'a> {
    pub c_buf: BufId,
    pub c_idx: &'a [E],
    pub vars: &'a [E],
    /// The output's shape (its last dim is the columns).
    pub vs: &'a [SymExpr],
    /// The free-variable set of the column index.
    pub col_mask: u64,
    /// Whether the product's operands hold integers (so `cast<i32>(acc)` is
    /// `acc`).
    pub integral: bool,
}

/// `coef·acc + Σ cols + residual`.
#[derive(Clone, Default)]
pub(crate) struct Affine {
    pub acc: bool,
    /// The accumulator's coefficient (none: 1).
    pub coef: Option<E>,
    pub cols: Vec<E>,
    pub residual: Option<BufId>,
}

impl Affine {
    fn col(e: E) -> Affine {
        Affine { cols: vec![e], ..Affine::default() }
    }

    fn acc() -> Affine {
        Affine { acc: true, ..Affine::default() }
    }

    fn plus(mut self, o: Affine) -> Option<Affine> {
        if (self.acc && o.acc) || (self.residual.is_some() && o.residual.is_some()) {
            return None;
        }
        if o.acc {
            self.acc = true;
            self.coef = o.coef;
        }
        self.cols.extend(o.cols);
        self.residual = self.residual.or(o.residual);
        Some(self)
    }

    /// Each term through `f` (a scaling: the residual, read as it is, has none).
    fn scaled(mut self, b: &mut Builder, f: &dyn Fn(&mut Exprs, E) -> E) -> Option<Affine> {
        if self.residual.is_some() {
            return None;
        }
        if self.acc {
            let one = b.x.float(DType::F32, 1.0);
            self.coef = Some(f(&mut b.x, self.coef.unwrap_or(one)));
        }
        self.cols = self.cols.into_iter().map(|c| f(&mut b.x, c)).collect();
        Some(self)
    }
}

/// Whether `e` varies along the columns only and never reads the accumulator.
pub(crate) fn column_only(b: &Builder, e: E, s: &Site) -> bool {
    b.x.free(e) & !s.col_mask == 0 && !reads(b, e, s.c_buf)
}

/// Whether `e` reads the accumulator.
pub(crate) fn reads_accumulator(b: &Builder, e: E, s: &Site) -> bool {
    reads(b, e, s.c_buf)
}

fn reads(b: &Builder, e: E, buf: BufId) -> bool {
    if let Node::Load { buf: p, .. } = b.x.node(e) {
        if b.arg(*p).0 == buf {
            return true;
        }
    }
    b.x.node(e).children().into_iter().any(|c| reads(b, c, buf))
}

/// `e` (f32) as an affine function of the accumulator, or `None`.
pub(crate) fn affine(b: &mut Builder, g: &Graph, e: E, s: &Site) -> Option<Affine> {
    if b.x.dtype(e) != DType::F32 {
        return None;
    }
    if column_only(b, e, s) {
        return Some(Affine::col(e));
    }
    let f32t = DType::F32;
    match b.x.node(e).clone() {
        Node::Load { buf, index, guard: None } => {
            let (arg, holds) = b.arg(buf);
            if arg == s.c_buf && index == s.c_idx {
                return Some(Affine::acc());
            }
            crate::group::output_shaped(b, g, &index, holds, (s.vs, s.vars))
                .then(|| Affine { residual: Some(arg), ..Affine::default() })
        }
        Node::Binary(BinaryOp::Add, p, q) => affine(b, g, p, s)?.plus(affine(b, g, q, s)?),
        Node::Binary(BinaryOp::Sub, p, q) => {
            let neg = affine(b, g, q, s)?.scaled(b, &|x, t| x.unary(UnaryOp::Neg, t, f32t))?;
            affine(b, g, p, s)?.plus(neg)
        }
        Node::Binary(BinaryOp::Mul, p, q) => {
            let (k, rest) = match (column_only(b, p, s), column_only(b, q, s)) {
                (_, true) => (q, p),
                (true, false) => (p, q),
                _ => return None,
            };
            affine(b, g, rest, s)?.scaled(b, &|x, t| x.binary(BinaryOp::Mul, t, k, f32t))
        }
        Node::Binary(BinaryOp::Div, p, q) if column_only(b, q, s) => {
            affine(b, g, p, s)?.scaled(b, &|x, t| x.binary(BinaryOp::Div, t, q, f32t))
        }
        Node::Cast(a) if b.x.dtype(a) == DType::I32 => integer(b, a, s),
        _ => None,
    }
}

/// `cast<f32>(e)`, `e` an i32 sum of `cast<i32>(acc)` and column terms (a
/// quantized product less its zero point's share), as an affine function.
fn integer(b: &mut Builder, e: E, s: &Site) -> Option<Affine> {
    if column_only(b, e, s) {
        return Some(Affine::col(b.x.cast(e, DType::F32)));
    }
    match b.x.node(e).clone() {
        Node::Cast(a) if s.integral && b.x.dtype(a) == DType::F32 => match b.x.node(a).clone() {
            Node::Load { buf, index, guard: None } if b.arg(buf).0 == s.c_buf && index == s.c_idx => {
                Some(Affine::acc())
            }
            _ => None,
        },
        Node::Binary(BinaryOp::Add, p, q) => integer(b, p, s)?.plus(integer(b, q, s)?),
        Node::Binary(BinaryOp::Sub, p, q) => {
            let neg = integer(b, q, s)?.scaled(b, &|x, t| x.unary(UnaryOp::Neg, t, DType::F32))?;
            integer(b, p, s)?.plus(neg)
        }
        _ => None,
    }
}

/// Copy `e` from `from` (whose parameters are `args`) into `to`, the column
/// variable `col` (a variable of `from`, or none) becoming `to_col`.
pub(crate) fn copy(
    from: &Exprs,
    args: &[(BufId, ValueId)],
    to: &mut Builder,
    e: E,
    (col, to_col): (Option<u32>, E),
    memo: &mut HashMap<E, E>,
) -> Option<E> {
    if let Some(c) = memo.get(&e) {
        return Some(*c);
    }
    let dt = from.dtype(e);
    let mut cp = |c: E, to: &mut Builder| copy(from, args, to, c, (col, to_col), memo);
    let out = match from.node(e).clone() {
        Node::Var(v) if Some(v) == col => to_col,
        Node::Var(_) | Node::Check { .. } | Node::Reduce { .. } => return None,
        Node::Dim(slot) => to.x.dim(slot),
        Node::Const(_) => to.x.constant(dt, from.as_float(e).unwrap_or(0.0), from.as_int(e).unwrap_or(0)),
        Node::Load { buf, index, guard } => {
            let (bb, v) = args[buf as usize];
            let index = index.into_iter().map(|i| cp(i, to)).collect::<Option<Vec<_>>>()?;
            let guard = match guard {
                Some(gd) => Some(cp(gd, to)?),
                None => None,
            };
            let p = to.param(v, bb, false);
            to.x.load(p, dt, index, guard)
        }
        Node::Unary(op, a) => {
            let a = cp(a, to)?;
            to.x.unary(op, a, dt)
        }
        Node::Binary(op, a, c) => {
            let (a, c) = (cp(a, to)?, cp(c, to)?);
            to.x.binary(op, a, c, dt)
        }
        Node::Select(c, a, f) => {
            let (c, a, f) = (cp(c, to)?, cp(a, to)?, cp(f, to)?);
            to.x.select(c, a, f)
        }
        Node::Cast(a) => {
            let a = cp(a, to)?;
            to.x.cast(a, dt)
        }
    };
    memo.insert(e, out);
    Some(out)
}

/// The column terms `e` at each of `n` columns (the variable `col`), where
/// they are known at compile time: every load reads a constant, and every
/// operation is one whose result the generated program gives bit for bit (f32
/// arithmetic rounded at each operation, integer arithmetic, comparisons,
/// selects, conversions). A statically quantized product's scales and zero
/// point terms, computed once here instead of by a program at every call;
/// `None` where anything is known only per call (a dynamic quantization's
/// scale) or the evaluation does not cover an operation.
pub(crate) fn known_columns(
    b: &Builder,
    buffers: &[plan::Buffer],
    e: E,
    col: u32,
    n: usize,
) -> Option<Vec<f32>> {
    let mut eval = Known { b, buffers, col, data: HashMap::new() };
    (0..n)
        .map(|c| match eval.value(e, i64::try_from(c).ok()?)? {
            Val::F(v) => Some(v),
            _ => None,
        })
        .collect()
}

/// Comparison `op` of `p` and `q` (ordered: false with a NaN), else `None`.
fn compare<T: PartialOrd>(op: BinaryOp, p: T, q: T) -> Option<Val> {
    Some(Val::B(match op {
        BinaryOp::Equal => p == q,
        BinaryOp::Less => p < q,
        BinaryOp::Greater => p > q,
        BinaryOp::LessEq => p <= q,
        BinaryOp::GreaterEq => p >= q,
        _ => return None,
    }))
}

/// A value of [`known_columns`]' evaluation.
#[derive(Clone, Copy)]
enum Val {
    F(f32),
    I(i64),
    B(bool),
}

/// The largest constant [`known_columns`] reads (elements): column terms read
/// vectors of scales and sums, never a weight.
const KNOWN_READS_AT_MOST: usize = 1 << 20;

struct Known<'a, 'b> {
    b: &'a Builder<'b>,
    buffers: &'a [plan::Buffer],
    col: u32,
    /// Each constant read so far, as f64s (exact for f32 and the integers).
    data: HashMap<BufId, Vec<f64>>,
}

impl Known<'_, '_> {
    fn value(&mut self, e: E, c: i64) -> Option<Val> {
        let x = &self.b.x;
        let dtype = x.dtype(e);
        // An integer result of `dtype`'s width.
        let int = |v: i64| match dtype {
            DType::I64 => Some(Val::I(v)),
            DType::I32 => Some(Val::I(v as i32 as i64)),
            _ => None,
        };
        match x.node(e).clone() {
            Node::Var(v) => (v == self.col).then_some(Val::I(c)),
            Node::Dim(slot) => self.b.dim_value(slot).map(Val::I),
            Node::Const(bits) => match dtype {
                DType::F32 => Some(Val::F(f64::from_bits(bits) as f32)),
                DType::Bool => Some(Val::B(bits != 0)),
                _ => int(bits as i64),
            },
            Node::Load { buf, index, guard } => {
                if let Some(g) = guard {
                    if let Val::B(false) = self.value(g, c)? {
                        return match dtype {
                            DType::F32 => Some(Val::F(0.0)),
                            _ => int(0),
                        };
                    }
                }
                let (arg, _) = self.b.arg(buf);
                let plan::BufferKind::Constant(data) = &self.buffers[arg].kind else { return None };
                if self.b.is_narrowed(arg)
                    || data.dtype != dtype
                    || !(dtype == DType::F32 || dtype.is_int())
                    || data.shape.len() != index.len()
                    || data.numel() > KNOWN_READS_AT_MOST
                {
                    return None;
                }
                let mut at = 0usize;
                for (i, &d) in index.iter().zip(&data.shape) {
                    let Val::I(i) = self.value(*i, c)? else { return None };
                    let i = usize::try_from(i).ok().filter(|i| *i < d)?;
                    at = at * d + i;
                }
                let values = self.data.entry(arg).or_insert_with(|| data.to_tensor().to_f64_vec());
                let v = values[at];
                match dtype {
                    DType::F32 => Some(Val::F(v as f32)),
                    _ => int(v as i64),
                }
            }
            Node::Unary(op, a) => match (op, self.value(a, c)?) {
                (UnaryOp::Neg, Val::F(v)) => Some(Val::F(-v)),
                (UnaryOp::Abs, Val::F(v)) => Some(Val::F(v.abs())),
                (UnaryOp::Sqrt, Val::F(v)) => Some(Val::F(v.sqrt())),
                (UnaryOp::Floor, Val::F(v)) => Some(Val::F(v.floor())),
                (UnaryOp::Ceil, Val::F(v)) => Some(Val::F(v.ceil())),
                (UnaryOp::Round, Val::F(v)) => Some(Val::F(v.round_ties_even())),
                (UnaryOp::Neg, Val::I(v)) => int(v.wrapping_neg()),
                (UnaryOp::Not, Val::B(v)) => Some(Val::B(!v)),
                _ => None,
            },
            Node::Binary(op, p, q) => {
                let (p, q) = (self.value(p, c)?, self.value(q, c)?);
                match (p, q) {
                    (Val::F(p), Val::F(q)) => match op {
                        BinaryOp::Add => Some(Val::F(p + q)),
                        BinaryOp::Sub => Some(Val::F(p - q)),
                        BinaryOp::Mul => Some(Val::F(p * q)),
                        BinaryOp::Div => Some(Val::F(p / q)),
                        _ => compare(op, p, q),
                    },
                    (Val::I(p), Val::I(q)) => match op {
                        BinaryOp::Add => int(p.wrapping_add(q)),
                        BinaryOp::Sub => int(p.wrapping_sub(q)),
                        BinaryOp::Mul => int(p.wrapping_mul(q)),
                        BinaryOp::Div if q != 0 => int(p.wrapping_div(q)),
                        BinaryOp::Max => int(p.max(q)),
                        BinaryOp::Min => int(p.min(q)),
                        _ => compare(op, p, q),
                    },
                    (Val::B(p), Val::B(q)) => match op {
                        BinaryOp::And => Some(Val::B(p && q)),
                        BinaryOp::Or => Some(Val::B(p || q)),
                        BinaryOp::Xor => Some(Val::B(p != q)),
                        _ => None,
                    },
                    _ => None,
                }
            }
            Node::Select(k, p, q) => match self.value(k, c)? {
                Val::B(true) => self.value(p, c),
                Val::B(false) => self.value(q, c),
                _ => None,
            },
            // Conversions: to f32 rounded to nearest, to an integer truncated
            // toward zero and saturated (NaN to 0), as the program converts.
            Node::Cast(a) => match (self.value(a, c)?, dtype) {
                (Val::F(v), DType::F32) => Some(Val::F(v)),
                (Val::I(v), DType::F32) => Some(Val::F(v as f32)),
                (Val::B(v), DType::F32) => Some(Val::F(if v { 1.0 } else { 0.0 })),
                (Val::F(v), DType::I64) => Some(Val::I(v as i64)),
                (Val::F(v), DType::I32) => Some(Val::I(v as i32 as i64)),
                (Val::I(v), _) => int(v),
                (Val::B(v), _) => int(v as i64),
                _ => None,
            },
            Node::Check { .. } | Node::Reduce { .. } => None,
        }
    }
}
