//! Element plumbing shared by the ops: the wide working form of numbers, dtype
//! narrowing, the f16 encoder, gathering elements by index, and row-major
//! index iteration.

use ir::{f64_to_f16, BinaryOp, DType, Elems, Tensor, UnaryOp};

use crate::{Fail, MAX_ELEMS, R};

// ---------------------------------------------------------------- wide form

/// Elements in the type the interpreter computes with: f64 for every float dtype
/// (f16/f32 widen exactly, and one rounding at the end gives the correctly rounded
/// result of `+ - * / sqrt`), i64 for every integer dtype and bool (0/1).
#[derive(Debug)]
pub(crate) enum Wide {
    F(Vec<f64>),
    I(Vec<i64>),
}

pub(crate) fn widen(t: &Tensor) -> Wide {
    match t.to_i64_vec() {
        Some(v) => Wide::I(v),
        None => Wide::F(t.to_f64_vec()),
    }
}

/// Runs `$body` in the wide type `$S` of `$dtype` (f64 for floats, i64 otherwise),
/// with each `$v: Vec<$S>` the widened elements of tensor `$t`. The body is
/// expanded once per wide type, so it is written once and type-checked twice.
macro_rules! wide {
    ($dtype:expr, $S:ident, [$($v:ident = $t:expr),+], $body:expr) => {
        if $dtype.is_float() {
            type $S = f64;
            $(let $v: Vec<$S> = $t.to_f64_vec();)+
            $crate::data::Wide::F($body)
        } else {
            type $S = i64;
            $(let $v: Vec<$S> = $t.to_i64_vec().unwrap_or_default();)+
            $crate::data::Wide::I($body)
        }
    };
}
pub(crate) use wide;

/// Convert wide values to `dtype`: floats round to nearest even; float → int
/// truncates toward zero and saturates at the type's bounds, NaN → 0 (Rust `as`);
/// int → narrower int wraps (two's complement); anything → bool is `x != 0`.
pub(crate) fn narrow(w: Wide, dtype: DType) -> Elems {
    macro_rules! each {
        ($v:expr) => {
            match dtype {
                DType::F32 => Elems::F32($v.into_iter().map(|x| x as f32).collect()),
                DType::F64 => Elems::F64($v.into_iter().map(|x| x as f64).collect()),
                DType::F16 => Elems::F16($v.into_iter().map(|x| f64_to_f16(x as f64)).collect()),
                DType::BF16 => Elems::BF16($v.into_iter().map(|x| ir::f32_to_bf16(x as f32)).collect()),
                DType::I8 => Elems::I8($v.into_iter().map(|x| x as i8).collect()),
                DType::U8 => Elems::U8($v.into_iter().map(|x| x as u8).collect()),
                DType::I32 => Elems::I32($v.into_iter().map(|x| x as i32).collect()),
                DType::I64 => Elems::I64($v.into_iter().map(|x| x as i64).collect()),
                DType::Bool => Elems::Bool($v.into_iter().map(|x| x != 0 as _).collect()),
            }
        };
    }
    match w {
        Wide::F(v) => each!(v),
        Wide::I(v) => each!(v),
    }
}

pub(crate) fn tensor(shape: Vec<usize>, elems: Elems) -> R<Tensor> {
    Tensor::new(shape, elems).map_err(|e| Fail::Msg(format!("internal error: {e}")))
}

// ---------------------------------------------------------------- scalars

/// Arithmetic of the wide types, so that reductions, contractions and
/// element-wise ops are written once.
pub(crate) trait Scalar: Copy + PartialOrd {
    const ZERO: Self;
    const ONE: Self;
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn from_count(n: usize) -> Self;
    /// The smallest / largest value of `dtype` (identities of max and min).
    fn lowest(dtype: DType) -> Self;
    fn highest(dtype: DType) -> Self;
    /// An element-wise arithmetic op (not comparisons or logic).
    fn binary(op: BinaryOp, a: Self, b: Self) -> Result<Self, String>;
    /// An element-wise unary op; `None` when this class of dtype lacks it.
    fn unary(op: UnaryOp, x: Self) -> Option<Self>;

    /// Max that propagates NaN (for ints, plain max).
    fn max_nan(self, o: Self) -> Self {
        if is_nan(self) || o <= self {
            self
        } else {
            o
        }
    }
    fn min_nan(self, o: Self) -> Self {
        if is_nan(self) || o >= self {
            self
        } else {
            o
        }
    }
}

fn is_nan<S: PartialOrd>(x: S) -> bool {
    x.partial_cmp(&x).is_none()
}

impl Scalar for f64 {
    const ZERO: f64 = 0.0;
    const ONE: f64 = 1.0;
    fn add(self, o: f64) -> f64 {
        self + o
    }
    fn mul(self, o: f64) -> f64 {
        self * o
    }
    fn from_count(n: usize) -> f64 {
        n as f64
    }
    fn lowest(_: DType) -> f64 {
        f64::NEG_INFINITY
    }
    fn highest(_: DType) -> f64 {
        f64::INFINITY
    }
    fn binary(op: BinaryOp, a: f64, b: f64) -> Result<f64, String> {
        Ok(match op {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
            BinaryOp::Pow => a.powf(b),
            BinaryOp::Max => a.max_nan(b),
            BinaryOp::Min => a.min_nan(b),
            // fmod: the sign of the dividend.
            BinaryOp::Mod => a % b,
            _ => return Err(format!("{op:?} is not arithmetic")),
        })
    }
    fn unary(op: UnaryOp, x: f64) -> Option<f64> {
        Some(match op {
            UnaryOp::Neg => -x,
            UnaryOp::Abs => x.abs(),
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Reciprocal => 1.0 / x,
            UnaryOp::Erf => crate::ops::erf(x),
            UnaryOp::Tanh => x.tanh(),
            UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            // Written so that NaN stays NaN.
            UnaryOp::Relu => {
                if x < 0.0 {
                    0.0
                } else {
                    x
                }
            }
            UnaryOp::Floor => x.floor(),
            UnaryOp::Ceil => x.ceil(),
            UnaryOp::Round => x.round_ties_even(),
            UnaryOp::Sin => x.sin(),
            UnaryOp::Cos => x.cos(),
            // sign(±0) = 0 and sign(NaN) = NaN, unlike `f64::signum`.
            UnaryOp::Sign => {
                if x == 0.0 || x.is_nan() {
                    x
                } else {
                    x.signum()
                }
            }
            UnaryOp::Not | UnaryOp::IsNaN | UnaryOp::IsInf => return None,
        })
    }
}

/// Integers compute in wrapping i64; narrowing then wraps to the dtype, which is
/// exactly two's-complement arithmetic in the narrow type.
impl Scalar for i64 {
    const ZERO: i64 = 0;
    const ONE: i64 = 1;
    fn add(self, o: i64) -> i64 {
        self.wrapping_add(o)
    }
    fn mul(self, o: i64) -> i64 {
        self.wrapping_mul(o)
    }
    fn from_count(n: usize) -> i64 {
        n as i64
    }
    fn lowest(dtype: DType) -> i64 {
        int_bounds(dtype).0
    }
    fn highest(dtype: DType) -> i64 {
        int_bounds(dtype).1
    }
    fn binary(op: BinaryOp, a: i64, b: i64) -> Result<i64, String> {
        let nonzero = || if b == 0 { Err(format!("integer division by zero ({a} / 0)")) } else { Ok(b) };
        Ok(match op {
            BinaryOp::Add => a.wrapping_add(b),
            BinaryOp::Sub => a.wrapping_sub(b),
            BinaryOp::Mul => a.wrapping_mul(b),
            // Truncates toward zero.
            BinaryOp::Div => a.wrapping_div(nonzero()?),
            BinaryOp::Pow => int_pow(a, b)?,
            BinaryOp::Max => a.max(b),
            BinaryOp::Min => a.min(b),
            // Bitwise: in two's complement, narrowing keeps the low bits.
            BinaryOp::And => a & b,
            BinaryOp::Or => a | b,
            BinaryOp::Xor => a ^ b,
            // The sign of the divisor, like Python's `%`.
            BinaryOp::Mod => {
                let r = a.wrapping_rem(nonzero()?);
                if r != 0 && (r < 0) != (b < 0) {
                    r + b
                } else {
                    r
                }
            }
            _ => return Err(format!("{op:?} is not arithmetic")),
        })
    }
    fn unary(op: UnaryOp, x: i64) -> Option<i64> {
        Some(match op {
            UnaryOp::Neg => x.wrapping_neg(),
            UnaryOp::Abs => x.wrapping_abs(),
            UnaryOp::Sign => x.signum(),
            UnaryOp::Relu => x.max(0),
            UnaryOp::Not => !x,
            _ => return None,
        })
    }
}

/// Integer power by squaring (wrapping); a negative exponent gives the truncated
/// quotient `1 / a^-e`, so 0 for |a| > 1.
fn int_pow(a: i64, e: i64) -> Result<i64, String> {
    if e < 0 {
        return match a {
            0 => Err(format!("0 raised to the negative power {e}")),
            1 => Ok(1),
            -1 => Ok(if e % 2 == 0 { 1 } else { -1 }),
            _ => Ok(0),
        };
    }
    let (mut acc, mut base, mut e) = (1i64, a, e as u64);
    while e > 0 {
        if e & 1 == 1 {
            acc = acc.wrapping_mul(base);
        }
        base = base.wrapping_mul(base);
        e >>= 1;
    }
    Ok(acc)
}

/// Value range of an integer dtype (bool is 0..=1).
fn int_bounds(dtype: DType) -> (i64, i64) {
    match dtype {
        DType::I8 => (i8::MIN.into(), i8::MAX.into()),
        DType::U8 => (0, u8::MAX.into()),
        DType::I32 => (i32::MIN.into(), i32::MAX.into()),
        DType::Bool => (0, 1),
        _ => (i64::MIN, i64::MAX),
    }
}

// ---------------------------------------------------------------- gathering

/// A storage element type of [`Elems`].
trait Elem: Copy {
    fn slice(e: &Elems) -> Option<&[Self]>;
    fn wrap(v: Vec<Self>) -> Elems;
}

macro_rules! elem {
    ($($t:ty => $var:ident),*) => {$(
        impl Elem for $t {
            fn slice(e: &Elems) -> Option<&[$t]> {
                match e {
                    Elems::$var(v) => Some(v),
                    _ => None,
                }
            }
            fn wrap(v: Vec<$t>) -> Elems {
                Elems::$var(v)
            }
        }
    )*};
}
elem!(f32 => F32, f64 => F64, u16 => F16, i8 => I8, u8 => U8, i32 => I32, i64 => I64, bool => Bool);

/// `out[i] = all[map[i]]`, where `all` is the concatenation of `srcs` (which must
/// share a dtype). Every data-movement op is this with its own index map.
pub(crate) fn take(srcs: &[&Elems], map: &[usize]) -> R<Elems> {
    fn go<T: Elem>(srcs: &[&Elems], map: &[usize]) -> R<Elems> {
        let mut all: Vec<T> = Vec::new();
        for s in srcs {
            let Some(v) = T::slice(s) else { bail!("operand dtypes differ ({:?})", dtypes(srcs)) };
            all.extend_from_slice(v);
        }
        let out = map.iter().map(|&i| all.get(i).copied());
        let out = out
            .collect::<Option<Vec<T>>>()
            .ok_or_else(|| Fail::Msg("internal: index out of range".into()))?;
        Ok(T::wrap(out))
    }
    let Some(first) = srcs.first() else { bail!("no operands") };
    match first.dtype() {
        DType::F32 => go::<f32>(srcs, map),
        DType::F64 => go::<f64>(srcs, map),
        DType::F16 => go::<u16>(srcs, map),
        DType::BF16 => bail!("bf16 tensors are not interpreted (no model's tensor has that type)"),
        DType::I8 => go::<i8>(srcs, map),
        DType::U8 => go::<u8>(srcs, map),
        DType::I32 => go::<i32>(srcs, map),
        DType::I64 => go::<i64>(srcs, map),
        DType::Bool => go::<bool>(srcs, map),
    }
}

fn dtypes(srcs: &[&Elems]) -> Vec<DType> {
    srcs.iter().map(|e| e.dtype()).collect()
}

// ---------------------------------------------------------------- indexing

/// The element count of `shape`, refusing more than [`MAX_ELEMS`].
pub(crate) fn guard(shape: &[usize]) -> R<usize> {
    shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|n| *n <= MAX_ELEMS)
        .ok_or_else(|| Fail::TooLarge(shape.to_vec()))
}

/// Row-major strides (saturating: only shapes with a zero dim can overflow, and
/// those are never indexed).
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (1..shape.len()).rev() {
        s[i - 1] = s[i].saturating_mul(shape[i]);
    }
    s
}

/// The flat offset of multi-index `idx`.
pub(crate) fn offset(idx: &[usize], strides: &[usize]) -> usize {
    idx.iter().zip(strides).map(|(i, s)| i * s).sum()
}

/// Calls `f` with every multi-index of `shape` in row-major order (once with `[]`
/// for a scalar, never for a shape with a zero dim).
pub(crate) fn for_each_index(shape: &[usize], mut f: impl FnMut(&[usize]) -> R<()>) -> R<()> {
    if guard(shape)? == 0 {
        return Ok(());
    }
    let mut idx = vec![0usize; shape.len()];
    loop {
        f(&idx)?;
        let mut d = shape.len();
        loop {
            if d == 0 {
                return Ok(());
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// `f` applied to every multi-index of `shape`, in row-major order.
pub(crate) fn index_map<T>(shape: &[usize], mut f: impl FnMut(&[usize]) -> R<T>) -> R<Vec<T>> {
    let mut out = Vec::with_capacity(guard(shape)?);
    for_each_index(shape, |idx| {
        out.push(f(idx)?);
        Ok(())
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_encoding_rounds_to_nearest_even() {
        assert_eq!(f64_to_f16(1.0), 0x3c00);
        assert_eq!(f64_to_f16(-2.0), 0xc000);
        assert_eq!(f64_to_f16(0.0), 0);
        assert_eq!(f64_to_f16(-0.0), 0x8000);
        assert_eq!(f64_to_f16(65504.0), 0x7bff);
        assert_eq!(f64_to_f16(65519.99), 0x7bff);
        assert_eq!(f64_to_f16(65520.0), 0x7c00);
        assert_eq!(f64_to_f16(f64::NEG_INFINITY), 0xfc00);
        assert!(ir::f16_to_f32(f64_to_f16(f64::NAN)).is_nan());
        let p = |e: i32| f64::powi(2.0, e);
        assert_eq!(f64_to_f16(p(-24)), 0x0001); // smallest subnormal
        assert_eq!(f64_to_f16(p(-25)), 0); // tie → even (0)
        assert_eq!(f64_to_f16(3.0 * p(-25)), 0x0002); // 1.5 ulp → 2
        assert_eq!(f64_to_f16(p(-14) - p(-25)), 0x0400); // rounds up into the normals
        assert_eq!(f64_to_f16(1.0 + p(-11)), 0x3c00); // tie → even
        assert_eq!(f64_to_f16(1.0 + 3.0 * p(-11)), 0x3c02); // tie → even (up)
        assert_eq!(f64_to_f16(1.0 + p(-11) + p(-30)), 0x3c01); // just above the tie
        assert_eq!(f64_to_f16(2.0 - p(-12)), 0x4000); // carry into the exponent
    }

    #[test]
    fn f16_round_trips_every_value() {
        for h in 0..=u16::MAX {
            let x = ir::f16_to_f32(h);
            if x.is_nan() {
                assert!(ir::f16_to_f32(f64_to_f16(x as f64)).is_nan());
            } else {
                assert_eq!(f64_to_f16(x as f64), h, "{h:#06x} = {x}");
            }
        }
    }

    #[test]
    fn index_iteration() {
        let mut seen = vec![];
        for_each_index(&[2, 3], |i| {
            seen.push(i.to_vec());
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, vec![vec![0, 0], vec![0, 1], vec![0, 2], vec![1, 0], vec![1, 1], vec![1, 2]]);
        assert_eq!(index_map(&[], |i| Ok(i.len())).unwrap(), vec![0]);
        assert!(index_map(&[3, 0, 2], |_| Ok(())).unwrap().is_empty());
        assert_eq!(strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert!(matches!(guard(&[1 << 20, 1 << 20]), Err(Fail::TooLarge(_))));
        assert!(matches!(guard(&[usize::MAX, 2]), Err(Fail::TooLarge(_))));
    }

    #[test]
    fn integer_semantics() {
        let m = |a, b| i64::binary(BinaryOp::Mod, a, b).unwrap();
        assert_eq!((m(7, 3), m(-7, 3), m(7, -3), m(-7, -3)), (1, 2, -2, -1));
        let d = |a, b| i64::binary(BinaryOp::Div, a, b).unwrap();
        assert_eq!((d(7, 2), d(-7, 2), d(7, -2), d(-7, -2)), (3, -3, -3, 3));
        assert!(i64::binary(BinaryOp::Div, 1, 0).unwrap_err().contains("division by zero"));
        assert!(i64::binary(BinaryOp::Mod, 1, 0).is_err());
        assert_eq!(int_pow(3, 4), Ok(81));
        assert_eq!((int_pow(2, -1), int_pow(-1, -3), int_pow(1, -5)), (Ok(0), Ok(-1), Ok(1)));
        assert!(int_pow(0, -1).is_err());
    }
}
