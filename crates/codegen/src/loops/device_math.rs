//! A GPU's forms of the math the CPU gets from the C library (NVPTX has no
//! library to call, and LLVM's NVPTX backend aborts on `llvm.pow` and the
//! transcendental intrinsics): f16 computed in f32; f32 `log` and `pow`
//! through `lg2.approx`/`ex2.approx` (as the GEMM epilogues compute them);
//! `sin` and `cos` by a reduction modulo π/2 in f64 and the polynomials on
//! [-π/4, π/4]; `fmod` exactly in f64. What has no form here is an error
//! naming it, never code that cannot be assembled.

use inkwell::values::{FloatValue, IntValue};
use inkwell::FloatPredicate;
use ir::{DType, UnaryOp};

use super::{basic, Gen, R, V};
use crate::{llvm, CodegenError};

/// sin on [-π/4, π/4]: `r + r³·(S0 + r²·(S1 + r²·S2))` (minimax, f32).
const SIN: [f64; 3] = [-1.666_665_461_1e-1, 8.332_160_873_6e-3, -1.951_529_589_1e-4];
/// cos on [-π/4, π/4]: `1 − r²/2 + r⁴·(C0 + r²·(C1 + r²·C2))` (minimax, f32).
const COS: [f64; 3] = [4.166_664_568_298_827e-2, -1.388_731_625_493_765e-3, 2.443_315_711_809_948e-5];
/// π/2 as the sum of two doubles, the first with its low 27 mantissa bits
/// zero so that `k·PIO2_HI` is exact for quadrant counts below 2^26 (every
/// |x| < 10^7); the reduced argument is then good to about 10^-16·|x|.
const PIO2_HI: f64 = 1.570_796_310_901_641_8;
const PIO2_LO: f64 = 1.589_325_477_352_819_6e-8;

impl Gen<'_> {
    /// The GPU's form of `op` where it is not the CPU's code (`None`).
    pub(super) fn device_unary(&mut self, op: UnaryOp, a: V, dt: DType) -> R<Option<V>> {
        use UnaryOp::*;
        if !matches!(op, Exp | Log | Tanh | Erf | Sigmoid | Sin | Cos) {
            return Ok(None);
        }
        match dt {
            DType::F16 => {
                let x = self.to_f32(a)?;
                let r = self.unary(op, x.into(), DType::F32)?;
                Ok(Some(self.to_f16(r.into_float_value())?))
            }
            DType::F32 if op == Log => {
                let l2 = self.approx("lg2", a.into_float_value())?;
                let ln2 = self.ctx.f32_type().const_float(std::f64::consts::LN_2);
                Ok(Some(self.bld.build_float_mul(l2, ln2, "ln").map_err(llvm)?.into()))
            }
            DType::F32 if matches!(op, Sin | Cos) => {
                Ok(Some(self.sin_cos(a.into_float_value(), op == Cos)?.into()))
            }
            DType::F32 => Ok(None),
            _ => Err(CodegenError::Unsupported(format!("{op:?} of {dt:?} has no GPU form yet"))),
        }
    }

    /// `a^c` in f32 (f16 through f32): `2^(c·log2|a|)`, negative where `a`
    /// is negative and `c` an odd integer, NaN where `a` is negative and `c`
    /// not an integer; `a^0 = 1`, `0^c` is 0 or +inf by `c`'s sign.
    pub(super) fn device_pow(&mut self, a: V, c: V, dt: DType) -> R<V> {
        match dt {
            DType::F16 => {
                let (x, y) = (self.to_f32(a)?, self.to_f32(c)?);
                let r = self.device_pow(x.into(), y.into(), DType::F32)?;
                self.to_f16(r.into_float_value())
            }
            DType::F32 => {
                let b = self.bld;
                let f32t = self.ctx.f32_type();
                let (a, c) = (a.into_float_value(), c.into_float_value());
                let abs = self.float_call("llvm.fabs", &[a])?;
                let l2 = self.approx("lg2", abs)?;
                let e = b.build_float_mul(c, l2, "e").map_err(llvm)?;
                let mag = self.approx("ex2", e)?;
                // c an integer, and odd (c/2 not one).
                let fc = self.float_call("llvm.floor", &[c])?;
                let int = b.build_float_compare(FloatPredicate::OEQ, fc, c, "int").map_err(llvm)?;
                let half = b.build_float_mul(c, f32t.const_float(0.5), "half").map_err(llvm)?;
                let fh = self.float_call("llvm.floor", &[half])?;
                let even = b.build_float_compare(FloatPredicate::OEQ, fh, half, "even").map_err(llvm)?;
                let odd =
                    b.build_and(int, b.build_not(even, "noteven").map_err(llvm)?, "odd").map_err(llvm)?;
                let neg =
                    b.build_float_compare(FloatPredicate::OLT, a, f32t.const_zero(), "neg").map_err(llvm)?;
                let flip = b.build_and(neg, odd, "flip").map_err(llvm)?;
                let negm = b.build_float_neg(mag, "negm").map_err(llvm)?;
                let r = b.build_select(flip, negm, mag, "signed").map_err(llvm)?.into_float_value();
                let nan_case =
                    b.build_and(neg, b.build_not(int, "frac").map_err(llvm)?, "nanc").map_err(llvm)?;
                let r = b.build_select(nan_case, f32t.const_float(f64::NAN), r, "r").map_err(llvm)?;
                let zero_exp =
                    b.build_float_compare(FloatPredicate::OEQ, c, f32t.const_zero(), "c0").map_err(llvm)?;
                Ok(b.build_select(zero_exp, f32t.const_float(1.0), r.into_float_value(), "pow")
                    .map_err(llvm)?)
            }
            _ => Err(CodegenError::Unsupported(format!("Pow of {dt:?} has no GPU form yet"))),
        }
    }

    /// `fmod(a, c)` (the sign of `a`), exact in f64 where `|a/c| < 2^29`: the
    /// quotient truncated, the remainder by one fused multiply-add, a
    /// quotient one off (the division's rounding) corrected by `c`.
    pub(super) fn device_fmod(&mut self, a: V, c: V, dt: DType) -> R<V> {
        if !matches!(dt, DType::F32 | DType::F16) {
            return Err(CodegenError::Unsupported(format!("Mod of {dt:?} has no GPU form yet")));
        }
        let b = self.bld;
        let f64t = self.ctx.f64_type();
        let wide = |v: V| b.build_float_ext(v.into_float_value(), f64t, "wide").map_err(llvm);
        let (x, y) = (wide(a)?, wide(c)?);
        let q = b.build_float_div(x, y, "q").map_err(llvm)?;
        let q = self.float_call("llvm.trunc", &[q])?;
        let nq = b.build_float_neg(q, "nq").map_err(llvm)?;
        let r = self.float_call("llvm.fma", &[nq, y, x])?;
        // `r` must have `a`'s sign (or be 0) and be below `|c|`.
        let zero = f64t.const_zero();
        let ay = self.float_call("llvm.fabs", &[y])?;
        let x_neg = b.build_float_compare(FloatPredicate::OLT, x, zero, "xn").map_err(llvm)?;
        let r_neg = b.build_float_compare(FloatPredicate::OLT, r, zero, "rn").map_err(llvm)?;
        let r_pos = b.build_float_compare(FloatPredicate::OGT, r, zero, "rp").map_err(llvm)?;
        let under = b.build_and(b.build_not(x_neg, "xp").map_err(llvm)?, r_neg, "under").map_err(llvm)?;
        let over = b.build_and(x_neg, r_pos, "over").map_err(llvm)?;
        let up = b.build_float_add(r, ay, "up").map_err(llvm)?;
        let down = b.build_float_sub(r, ay, "down").map_err(llvm)?;
        let r = b.build_select(under, up, r, "r1").map_err(llvm)?.into_float_value();
        let r = b.build_select(over, down, r, "r2").map_err(llvm)?.into_float_value();
        // Then below |c|: one more step toward zero where it is not.
        let ar = self.float_call("llvm.fabs", &[r])?;
        let big = b.build_float_compare(FloatPredicate::OGE, ar, ay, "big").map_err(llvm)?;
        let toward = b.build_select(
            x_neg,
            b.build_float_add(r, ay, "u2").map_err(llvm)?,
            b.build_float_sub(r, ay, "d2").map_err(llvm)?,
            "toward",
        );
        let r = b.build_select(big, toward.map_err(llvm)?.into_float_value(), r, "r3").map_err(llvm)?;
        let r = r.into_float_value();
        let t = if dt == DType::F16 { self.ctx.f16_type() } else { self.ctx.f32_type() };
        Ok(b.build_float_trunc(r, t, "fmod").map_err(llvm)?.into())
    }

    /// `sin x` (or `cos x`) in f32: `x = k·π/2 + r` in f64, `r` within π/4,
    /// then the quadrant `k mod 4` picks ±sin r or ±cos r.
    fn sin_cos(&mut self, x: FloatValue<'static>, cos: bool) -> R<FloatValue<'static>> {
        let b = self.bld;
        let (f32t, f64t, i64t) = (self.ctx.f32_type(), self.ctx.f64_type(), self.ctx.i64_type());
        let xd = b.build_float_ext(x, f64t, "xd").map_err(llvm)?;
        let k = b.build_float_mul(xd, f64t.const_float(std::f64::consts::FRAC_2_PI), "kx").map_err(llvm)?;
        let k = self.float_call("llvm.rint", &[k])?;
        let nk = b.build_float_neg(k, "nk").map_err(llvm)?;
        let r = self.float_call("llvm.fma", &[nk, f64t.const_float(PIO2_HI), xd])?;
        let r = self.float_call("llvm.fma", &[nk, f64t.const_float(PIO2_LO), r])?;
        let r = b.build_float_trunc(r, f32t, "r").map_err(llvm)?;
        let r2 = b.build_float_mul(r, r, "r2").map_err(llvm)?;
        let poly = |g: &Self, c: &[f64; 3]| -> R<FloatValue<'static>> {
            let mut p = f32t.const_float(c[2]);
            for ci in [c[1], c[0]] {
                p = g.float_call("llvm.fma", &[p, r2, f32t.const_float(ci)])?;
            }
            Ok(p)
        };
        let ps = poly(self, &SIN)?;
        let r3 = b.build_float_mul(r2, r, "r3").map_err(llvm)?;
        let sin_r = self.float_call("llvm.fma", &[r3, ps, r])?;
        let pc = poly(self, &COS)?;
        let r4 = b.build_float_mul(r2, r2, "r4").map_err(llvm)?;
        let hr2 = b.build_float_mul(r2, f32t.const_float(0.5), "hr2").map_err(llvm)?;
        let one_h = b.build_float_sub(f32t.const_float(1.0), hr2, "1h").map_err(llvm)?;
        let cos_r = self.float_call("llvm.fma", &[r4, pc, one_h])?;
        // Quadrant q = k mod 4 (k's low bits, negative k included); cos x is
        // sin(x + π/2), the quadrant one on.
        let ki = b.build_float_to_signed_int(k, i64t, "ki").map_err(llvm)?;
        let q = if cos { b.build_int_add(ki, i64t.const_int(1, false), "q1").map_err(llvm)? } else { ki };
        let bit = |n: u64| -> R<IntValue<'static>> {
            let v = b.build_and(q, i64t.const_int(n, false), "qb").map_err(llvm)?;
            b.build_int_compare(inkwell::IntPredicate::NE, v, i64t.const_zero(), "qn").map_err(llvm)
        };
        let (odd, neg) = (bit(1)?, bit(2)?);
        let v = b.build_select(odd, cos_r, sin_r, "v").map_err(llvm)?.into_float_value();
        let nv = b.build_float_neg(v, "nv").map_err(llvm)?;
        Ok(b.build_select(neg, nv, v, "sc").map_err(llvm)?.into_float_value())
    }

    /// `lg2.approx.f32` or `ex2.approx.f32` of `x`.
    fn approx(&self, f: &str, x: FloatValue<'static>) -> R<FloatValue<'static>> {
        let f32t = self.ctx.f32_type();
        let ty = f32t.fn_type(&[f32t.into()], false);
        let asm = self.ctx.create_inline_asm(
            ty,
            format!("{f}.approx.f32 $0, $1;"),
            "=f,f".into(),
            false,
            false,
            None,
            false,
        );
        let v = basic(self.bld.build_indirect_call(ty, asm, &[x.into()], f).map_err(llvm)?)?;
        Ok(v.into_float_value())
    }

    /// An LLVM float intrinsic of the arguments' type.
    fn float_call(&self, name: &str, args: &[FloatValue<'static>]) -> R<FloatValue<'static>> {
        let ty = args[0].get_type().into();
        let f = self.intrinsic(name, &[ty])?;
        let args: Vec<_> = args.iter().map(|a| (*a).into()).collect();
        Ok(self.call(f, &args)?.into_float_value())
    }

    fn to_f32(&self, a: V) -> R<FloatValue<'static>> {
        self.bld.build_float_ext(a.into_float_value(), self.ctx.f32_type(), "x32").map_err(llvm)
    }

    fn to_f16(&self, a: FloatValue<'static>) -> R<V> {
        Ok(self.bld.build_float_trunc(a, self.ctx.f16_type(), "h").map_err(llvm)?.into())
    }
}
