//! Any element-wise function of one value, as a contraction's epilogue: what a
//! fusion group applies to `scale·acc + bias + residual` beyond the named
//! activations (ReLU6's clip, SiLU's `x·σ(x)`, hard-swish, a leaky ReLU's
//! select). It is a short straight-line program, small and `Copy` so that it
//! is part of an [`Epilogue`](crate::Epilogue)'s value (kernels are compiled,
//! cached and shared per epilogue); `codegen` emits it on the tile's vectors
//! in the micro-kernel's store, and [`Pointwise::eval`] is its scalar meaning,
//! with the formulas the generated code uses.
//!
//! Its operations are the f32 subset of `ir`'s element-wise ops that tile
//! epilogues compute, as closed enums that every backend matches exhaustively;
//! `lower` maps the graph's ops to them once ([`PwUnary::of`], [`PwBinary::of`],
//! [`PwCmp::of`]) when it fuses an epilogue, and keeps the rest in loop programs.

use std::fmt;

use ir::{BinaryOp, UnaryOp};

use crate::epilogue::{erf, tanh};

/// The most operations in one program.
pub const MAX_POINTWISE_OPS: usize = 24;

/// The most parameters one program reads.
pub const MAX_POINTWISE_PARAMS: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum PwUnary {
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Reciprocal,
    Tanh,
    Erf,
    Sigmoid,
    Relu,
    Floor,
    Ceil,
    /// To the nearest integer, halves to even (ONNX's `Round`).
    Round,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum PwBinary {
    Add,
    Sub,
    Mul,
    Div,
    /// NaN if either is NaN (ONNX's Max), `+0` over `-0`.
    Max,
    /// NaN if either is NaN, `-0` under `+0`.
    Min,
}

/// An ordered comparison (false when either side is NaN).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum PwCmp {
    Less,
    LessEq,
    Greater,
    GreaterEq,
    Equal,
}

impl PwUnary {
    /// The epilogue's form of `op`, if it has one.
    pub fn of(op: UnaryOp) -> Option<PwUnary> {
        Some(match op {
            UnaryOp::Neg => PwUnary::Neg,
            UnaryOp::Abs => PwUnary::Abs,
            UnaryOp::Exp => PwUnary::Exp,
            UnaryOp::Log => PwUnary::Log,
            UnaryOp::Sqrt => PwUnary::Sqrt,
            UnaryOp::Reciprocal => PwUnary::Reciprocal,
            UnaryOp::Tanh => PwUnary::Tanh,
            UnaryOp::Erf => PwUnary::Erf,
            UnaryOp::Sigmoid => PwUnary::Sigmoid,
            UnaryOp::Relu => PwUnary::Relu,
            UnaryOp::Floor => PwUnary::Floor,
            UnaryOp::Ceil => PwUnary::Ceil,
            UnaryOp::Round => PwUnary::Round,
            _ => return None,
        })
    }
}

impl PwBinary {
    /// The epilogue's form of `op`, if it has one.
    pub fn of(op: BinaryOp) -> Option<PwBinary> {
        Some(match op {
            BinaryOp::Add => PwBinary::Add,
            BinaryOp::Sub => PwBinary::Sub,
            BinaryOp::Mul => PwBinary::Mul,
            BinaryOp::Div => PwBinary::Div,
            BinaryOp::Max => PwBinary::Max,
            BinaryOp::Min => PwBinary::Min,
            _ => return None,
        })
    }
}

impl PwCmp {
    /// The epilogue's form of the comparison `op`, if it is one.
    pub fn of(op: BinaryOp) -> Option<PwCmp> {
        Some(match op {
            BinaryOp::Less => PwCmp::Less,
            BinaryOp::LessEq => PwCmp::LessEq,
            BinaryOp::Greater => PwCmp::Greater,
            BinaryOp::GreaterEq => PwCmp::GreaterEq,
            BinaryOp::Equal => PwCmp::Equal,
            _ => return None,
        })
    }
}

/// One operation; operands are indices of earlier operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum PwOp {
    /// The program's input.
    Input,
    /// The contraction's residual at this point (as f32; a code's byte as its
    /// value): a program that reads it is given the residual as an operand of
    /// its own instead of the residual being added to its input (a quantized
    /// residual block's sum, `q(dq(q(acc)) + dq(shortcut))`).
    Residual,
    /// An f32 constant, by its bits.
    Const(u32),
    /// Parameter `i`: a constant given when the program runs, so that
    /// programs that differ only in their constants (a model's quantized
    /// layers, each with its scales) share one compiled kernel.
    Param(u8),
    Unary(PwUnary, u8),
    Binary(PwBinary, u8, u8),
    /// `cmp(a, b) ? then : else`.
    Select(PwCmp, u8, u8, u8, u8),
    /// `a·b + c` rounded once (a fused multiply-add).
    MulAdd(u8, u8, u8),
    /// A value made an integer and back, as a quantization stores it:
    /// `f32(clamp(i32(x) + offset, lo, hi))`, `x` truncated to an i32
    /// (saturating, NaN to 0), the offset (a zero point) added in wrapping i32
    /// arithmetic, then clamped to `lo..=hi` (the stored type's range).
    Integer {
        x: u8,
        offset: i32,
        lo: i32,
        hi: i32,
    },
}

/// [`PwOp::Integer`] of one value.
pub fn integer(x: f32, offset: i32, lo: i32, hi: i32) -> f32 {
    // `as` saturates and takes NaN to 0.
    (x as i32).wrapping_add(offset).max(lo).min(hi) as f32
}

/// A program of up to [`MAX_POINTWISE_OPS`] operations; its value is the last.
#[derive(Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Pointwise {
    ops: [PwOp; MAX_POINTWISE_OPS],
    len: u8,
}

impl Default for Pointwise {
    /// The identity: the input alone.
    fn default() -> Self {
        Pointwise { ops: [PwOp::Input; MAX_POINTWISE_OPS], len: 1 }
    }
}

impl Pointwise {
    /// An empty program, to [`push`](Self::push) onto.
    pub fn empty() -> Self {
        Pointwise { ops: [PwOp::Input; MAX_POINTWISE_OPS], len: 0 }
    }

    /// Append `op`, returning its index; `None` when the program is full or an
    /// operand is not an earlier operation.
    pub fn push(&mut self, op: PwOp) -> Option<u8> {
        let n = self.len;
        let earlier = |i: u8| i < n;
        let ok = match op {
            PwOp::Input | PwOp::Residual | PwOp::Const(_) => true,
            PwOp::Param(i) => (i as usize) < MAX_POINTWISE_PARAMS,
            PwOp::Unary(_, a) => earlier(a),
            PwOp::Binary(_, a, b) => earlier(a) && earlier(b),
            PwOp::Select(_, a, b, t, f) => [a, b, t, f].into_iter().all(earlier),
            PwOp::MulAdd(a, b, c) => [a, b, c].into_iter().all(earlier),
            PwOp::Integer { x, lo, hi, .. } => earlier(x) && lo <= hi,
        };
        if !ok || n as usize >= MAX_POINTWISE_OPS {
            return None;
        }
        self.ops[n as usize] = op;
        self.len += 1;
        Some(n)
    }

    /// The operations, in order (a valid program's operands are earlier ones).
    pub fn ops(&self) -> &[PwOp] {
        &self.ops[..self.len as usize]
    }

    /// The bounds of the program's value where its last operation is an
    /// [`PwOp::Integer`] (`lo..=hi`, every value an integer: NaN and overflow
    /// included), else `None`.
    pub fn integer_bounds(&self) -> Option<(i32, i32)> {
        match self.ops().last() {
            Some(&PwOp::Integer { lo, hi, .. }) => Some((lo, hi)),
            _ => None,
        }
    }

    /// The program of its first `len` operations (its value the last of those).
    pub fn prefix(&self, len: u8) -> Pointwise {
        let len = len.min(self.len);
        let mut p = Pointwise { len, ..*self };
        p.ops[len as usize..].fill(PwOp::Input);
        p
    }

    /// A quantization's store, taken apart: where the program ends in
    /// `integer(round(y), offset, lo, hi)`, the program of `y` (its operations
    /// up to `y`) and `(offset, lo, hi)`.
    pub fn quantization(&self) -> Option<(Pointwise, i32, i32, i32)> {
        let &PwOp::Integer { x, offset, lo, hi } = self.ops().last()? else { return None };
        let PwOp::Unary(PwUnary::Round, y) = self.ops()[x as usize] else { return None };
        Some((self.prefix(y + 1), offset, lo, hi))
    }

    /// A stable 64-bit key of the function the program computes (FNV-1a of
    /// its text form, which prints just what its value depends on): kernels
    /// compiled per program are named by it.
    pub fn fingerprint(&self) -> u64 {
        self.to_string()
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
    }

    /// Whether it reads [`PwOp::Residual`].
    pub fn reads_residual(&self) -> bool {
        self.ops().contains(&PwOp::Residual)
    }

    /// The parameters it reads: one past the highest index (0: none).
    pub fn params(&self) -> usize {
        self.ops()
            .iter()
            .filter_map(|op| if let PwOp::Param(i) = op { Some(*i as usize + 1) } else { None })
            .max()
            .unwrap_or(0)
    }

    /// The program with its constants made parameters (in order of
    /// appearance), `x` first multiplied by parameter `scale` where given, and
    /// the values of those parameters; `None` when they are too many.
    pub fn parameterized(&self, scale: Option<f32>) -> Option<(Pointwise, Vec<f32>)> {
        let (mut out, mut values) = (Pointwise::empty(), Vec::new());
        let mut at = [0u8; MAX_POINTWISE_OPS];
        let mut param = |out: &mut Pointwise, v: f32| {
            values.push(v);
            out.push(PwOp::Param(u8::try_from(values.len() - 1).ok()?))
        };
        for (i, op) in self.ops().iter().enumerate() {
            let m = |j: u8| at[j as usize];
            at[i] = match *op {
                PwOp::Input => {
                    let x = out.push(PwOp::Input)?;
                    match scale {
                        Some(s) => {
                            let p = param(&mut out, s)?;
                            out.push(PwOp::Binary(PwBinary::Mul, x, p))?
                        }
                        None => x,
                    }
                }
                PwOp::Residual => out.push(PwOp::Residual)?,
                PwOp::Const(bits) => param(&mut out, f32::from_bits(bits))?,
                PwOp::Param(_) => return None,
                PwOp::Unary(u, a) => out.push(PwOp::Unary(u, m(a)))?,
                PwOp::Binary(b, p, q) => out.push(PwOp::Binary(b, m(p), m(q)))?,
                PwOp::Select(c, a, b, t, f) => out.push(PwOp::Select(c, m(a), m(b), m(t), m(f)))?,
                PwOp::MulAdd(a, b, c) => out.push(PwOp::MulAdd(m(a), m(b), m(c)))?,
                PwOp::Integer { x, offset, lo, hi } => out.push(PwOp::Integer { x: m(x), offset, lo, hi })?,
            };
        }
        (values.len() <= MAX_POINTWISE_PARAMS).then_some((out, values))
    }

    /// The program applied to one value (its parameters, if any, NaN).
    pub fn eval(&self, x: f32) -> f32 {
        self.eval_with(x, &[])
    }

    /// The program applied to one value with the parameters `params` (a
    /// residual it reads, NaN).
    pub fn eval_with(&self, x: f32, params: &[f32]) -> f32 {
        self.eval_at(x, f32::NAN, params)
    }

    /// The program applied to one value, its residual `residual`, with the
    /// parameters `params`.
    pub fn eval_at(&self, x: f32, residual: f32, params: &[f32]) -> f32 {
        self.eval_fixing(x, residual, params, &[])
    }

    /// [`Self::eval_at`] with the operations at the indices in `fixed` taken
    /// to have the values given there (what is computed from them follows).
    pub fn eval_fixing(&self, x: f32, residual: f32, params: &[f32], fixed: &[(u8, f32)]) -> f32 {
        let mut v = [0.0f32; MAX_POINTWISE_OPS];
        for (i, op) in self.ops().iter().enumerate() {
            let g = |j: u8| v[j as usize];
            if let Some(&(_, value)) = fixed.iter().find(|(at, _)| *at as usize == i) {
                v[i] = value;
                continue;
            }
            v[i] = match *op {
                PwOp::Input => x,
                PwOp::Residual => residual,
                PwOp::Const(bits) => f32::from_bits(bits),
                PwOp::Param(i) => params.get(i as usize).copied().unwrap_or(f32::NAN),
                PwOp::Unary(u, a) => unary(u, g(a)),
                PwOp::Binary(b, p, q) => binary(b, g(p), g(q)),
                PwOp::Integer { x, offset, lo, hi } => integer(g(x), offset, lo, hi),
                PwOp::MulAdd(a, b, c) => g(a).mul_add(g(b), g(c)),
                PwOp::Select(c, p, q, t, f) => {
                    let (a, b) = (g(p), g(q));
                    let holds = match c {
                        PwCmp::Less => a < b,
                        PwCmp::LessEq => a <= b,
                        PwCmp::Greater => a > b,
                        PwCmp::GreaterEq => a >= b,
                        PwCmp::Equal => a == b,
                    };
                    if holds {
                        g(t)
                    } else {
                        g(f)
                    }
                }
            };
        }
        self.len.checked_sub(1).map_or(x, |last| v[last as usize])
    }
}

fn unary(u: PwUnary, a: f32) -> f32 {
    match u {
        PwUnary::Neg => -a,
        PwUnary::Abs => a.abs(),
        PwUnary::Exp => a.exp(),
        PwUnary::Log => a.ln(),
        PwUnary::Sqrt => a.sqrt(),
        PwUnary::Reciprocal => 1.0 / a,
        PwUnary::Tanh => tanh(a),
        PwUnary::Erf => erf(a),
        PwUnary::Sigmoid => 1.0 / (1.0 + (-a).exp()),
        PwUnary::Relu => {
            if a < 0.0 {
                0.0
            } else {
                a
            }
        }
        PwUnary::Floor => a.floor(),
        PwUnary::Ceil => a.ceil(),
        PwUnary::Round => a.round_ties_even(),
    }
}

fn binary(b: PwBinary, x: f32, y: f32) -> f32 {
    match b {
        PwBinary::Add => x + y,
        PwBinary::Sub => x - y,
        PwBinary::Mul => x * y,
        PwBinary::Div => x / y,
        PwBinary::Max | PwBinary::Min if x.is_nan() || y.is_nan() => f32::NAN,
        // Equal values differ only in the sign of a zero.
        PwBinary::Max if x == y => f32::from_bits(x.to_bits() & y.to_bits()),
        PwBinary::Min if x == y => f32::from_bits(x.to_bits() | y.to_bits()),
        PwBinary::Max => x.max(y),
        PwBinary::Min => x.min(y),
    }
}

impl fmt::Debug for Pointwise {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl fmt::Display for Pointwise {
    /// The program as one expression of `x`: `min(max(x, 0.0), 6.0)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn expr(p: &Pointwise, i: u8) -> String {
            let name = |d: &dyn fmt::Debug| format!("{d:?}").to_lowercase();
            match p.ops[i as usize] {
                PwOp::Input => "x".into(),
                PwOp::Residual => "residual".into(),
                PwOp::Const(bits) => format!("{:?}", f32::from_bits(bits)),
                PwOp::Param(i) => format!("p{i}"),
                PwOp::Unary(u, a) => format!("{}({})", name(&u), expr(p, a)),
                PwOp::Binary(b, x, y) => format!("{}({}, {})", name(&b), expr(p, x), expr(p, y)),
                PwOp::Integer { x, offset, lo, hi } => {
                    format!("integer({}, {offset}, {lo}..={hi})", expr(p, x))
                }
                PwOp::MulAdd(a, b, c) => format!("mul_add({}, {}, {})", expr(p, a), expr(p, b), expr(p, c)),
                PwOp::Select(c, a, b, t, e) => {
                    format!(
                        "select({}({}, {}), {}, {})",
                        name(&c),
                        expr(p, a),
                        expr(p, b),
                        expr(p, t),
                        expr(p, e)
                    )
                }
            }
        }
        match self.len.checked_sub(1) {
            Some(last) => f.write_str(&expr(self, last)),
            None => f.write_str("x"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn relu6() -> Pointwise {
        let mut p = Pointwise::empty();
        let x = p.push(PwOp::Input).unwrap();
        let z = p.push(PwOp::Const(0f32.to_bits())).unwrap();
        let six = p.push(PwOp::Const(6f32.to_bits())).unwrap();
        let m = p.push(PwOp::Binary(PwBinary::Max, x, z)).unwrap();
        p.push(PwOp::Binary(PwBinary::Min, m, six)).unwrap();
        p
    }

    #[test]
    fn programs_evaluate_and_print() {
        let p = relu6();
        assert_eq!(p.to_string(), "min(max(x, 0.0), 6.0)");
        assert_eq!([-1.0, 3.5, 7.0].map(|x| p.eval(x)), [0.0, 3.5, 6.0]);
        assert!(p.eval(f32::NAN).is_nan());
        let mut s = Pointwise::empty();
        let x = s.push(PwOp::Input).unwrap();
        let sg = s.push(PwOp::Unary(PwUnary::Sigmoid, x)).unwrap();
        s.push(PwOp::Binary(PwBinary::Mul, x, sg)).unwrap();
        assert_eq!(s.to_string(), "mul(x, sigmoid(x))");
        assert!((s.eval(1.0) - 0.731_058_6).abs() < 1e-6);
        assert_eq!(Pointwise::default().eval(2.5), 2.5);
    }

    /// A quantization's store: round half to even, to an integer with its zero
    /// point, clamped to u8; truncation, saturation and NaN as Rust's `as`,
    /// the zero point's add wrapping as the interpreter's i32 does.
    #[test]
    fn integers_as_a_quantization_stores_them() {
        let mut p = Pointwise::empty();
        let x = p.push(PwOp::Input).unwrap();
        let r = p.push(PwOp::Unary(PwUnary::Round, x)).unwrap();
        p.push(PwOp::Integer { x: r, offset: 134, lo: 0, hi: 255 }).unwrap();
        assert_eq!(p.to_string(), "integer(round(x), 134, 0..=255)");
        let cases =
            [(0.5, 134.0), (1.5, 136.0), (-2.5, 132.0), (-134.6, 0.0), (200.0, 255.0), (f32::NAN, 134.0)];
        for (v, want) in cases {
            assert_eq!(p.eval(v), want, "{v}");
        }
        assert_eq!(integer(f32::INFINITY, 0, i32::MIN, i32::MAX), 2_147_483_648.0);
        assert_eq!(integer(-7.9, 0, -100, 100), -7.0, "truncates");
        assert_eq!(integer(3e9, 1, 0, 255), 0.0, "i32::MAX + 1 wraps");
        assert_eq!(p.integer_bounds(), Some((0, 255)));
        let mut after = p;
        after.push(PwOp::Unary(PwUnary::Neg, 2)).unwrap();
        assert_eq!(after.integer_bounds(), None, "the value is the last operation's");
        let (y, offset, lo, hi) = p.quantization().unwrap();
        assert_eq!((y.to_string().as_str(), offset, lo, hi), ("x", 134, 0, 255));
        assert_eq!(after.quantization(), None);
        let mut bad = Pointwise::empty();
        let x = bad.push(PwOp::Input).unwrap();
        assert_eq!(bad.push(PwOp::Integer { x, offset: 0, lo: 1, hi: 0 }), None, "an empty range");
    }

    #[test]
    fn fingerprints_follow_the_function() {
        let mut dead = Pointwise::empty();
        let x = dead.push(PwOp::Input).unwrap();
        dead.push(PwOp::Const(3f32.to_bits())).unwrap();
        let z = dead.push(PwOp::Const(0f32.to_bits())).unwrap();
        let six = dead.push(PwOp::Const(6f32.to_bits())).unwrap();
        let m = dead.push(PwOp::Binary(PwBinary::Max, x, z)).unwrap();
        dead.push(PwOp::Binary(PwBinary::Min, m, six)).unwrap();
        assert_eq!(dead.fingerprint(), relu6().fingerprint(), "an unused constant changes nothing");
        assert_ne!(relu6().fingerprint(), Pointwise::default().fingerprint());
        let mut neg = Pointwise::empty();
        let x = neg.push(PwOp::Input).unwrap();
        let z = neg.push(PwOp::Const((-0f32).to_bits())).unwrap();
        neg.push(PwOp::Binary(PwBinary::Max, x, z)).unwrap();
        let mut pos = Pointwise::empty();
        let x = pos.push(PwOp::Input).unwrap();
        let z = pos.push(PwOp::Const(0f32.to_bits())).unwrap();
        pos.push(PwOp::Binary(PwBinary::Max, x, z)).unwrap();
        assert_ne!(neg.fingerprint(), pos.fingerprint(), "max with -0 and with +0 differ at zero");
    }

    #[test]
    fn malformed_programs_are_refused() {
        let mut p = Pointwise::empty();
        assert_eq!(p.push(PwOp::Unary(PwUnary::Neg, 0)), None, "an operand that does not exist yet");
        for _ in 0..MAX_POINTWISE_OPS {
            assert!(p.push(PwOp::Input).is_some());
        }
        assert_eq!(p.push(PwOp::Input), None, "a full program");
    }

    #[test]
    fn max_and_min_follow_onnx_on_nan_and_zeros() {
        assert!(binary(PwBinary::Max, f32::NAN, 1.0).is_nan());
        assert!(binary(PwBinary::Min, 1.0, f32::NAN).is_nan());
        assert!(binary(PwBinary::Max, -0.0, 0.0).is_sign_positive());
        assert!(binary(PwBinary::Min, 0.0, -0.0).is_sign_negative());
    }
}
