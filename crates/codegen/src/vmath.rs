//! Vectorized `exp`, `tanh`, `erf` and the activations, emitted inline as
//! polynomial code (no calls into libm), with the formulas of
//! `kernels::Activation` so the scalar and vector paths agree.

use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::intrinsics::Intrinsic;
use inkwell::module::Module;
use inkwell::types::VectorType;
use inkwell::values::{FastMathFlags, IntValue, PointerValue, VectorValue};
use inkwell::FloatPredicate;
use kernels::{Activation, ERF_A, ERF_P, GELU_C};

use crate::{llvm, CodegenError};

type V = VectorValue<'static>;
type R = Result<V, CodegenError>;

/// Emits vector math for one vector type.
pub(crate) struct VMath<'b> {
    pub ctx: &'static Context,
    pub module: &'b Module<'static>,
    pub bld: &'b Builder<'static>,
    pub vt: VectorType<'static>,
    pub lanes: usize,
}

impl VMath<'_> {
    fn splat(&self, x: f64) -> V {
        VectorType::const_vector(&vec![self.ctx.f32_type().const_float(x); self.lanes])
    }
    fn add(&self, a: V, b: V) -> R {
        self.bld.build_float_add(a, b, "").map_err(llvm)
    }
    fn sub(&self, a: V, b: V) -> R {
        self.bld.build_float_sub(a, b, "").map_err(llvm)
    }
    fn mul(&self, a: V, b: V) -> R {
        self.bld.build_float_mul(a, b, "").map_err(llvm)
    }
    fn div(&self, a: V, b: V) -> R {
        self.bld.build_float_div(a, b, "").map_err(llvm)
    }
    /// `a·b + c`, marked contractible so that LLVM emits one FMA (one rounding).
    fn fma(&self, a: V, b: V, c: V) -> R {
        let m = self.mul(a, b)?;
        let s = self.add(m, c)?;
        for v in [m, s] {
            if let Some(i) = v.as_instruction() {
                i.set_fast_math_flags(FastMathFlags::AllowContract)
                    .map_err(|e| llvm(format!("contract flag: {e:?}")))?;
            }
        }
        Ok(s)
    }
    /// `⌊x⌋` per lane (one rounding instruction).
    fn floor(&self, x: V) -> R {
        let f = Intrinsic::find("llvm.floor")
            .and_then(|i| i.get_declaration(self.module, &[self.vt.into()]))
            .ok_or_else(|| llvm("no llvm.floor for the vector type"))?;
        match self.bld.build_call(f, &[x.into()], "").map_err(llvm)?.try_as_basic_value() {
            inkwell::values::ValueKind::Basic(v) => Ok(v.into_vector_value()),
            inkwell::values::ValueKind::Instruction(_) => Err(llvm("llvm.floor returned nothing")),
        }
    }
    fn select_lt(&self, x: V, y: V, then: V, otherwise: V) -> R {
        let c = self.bld.build_float_compare(FloatPredicate::OLT, x, y, "").map_err(llvm)?;
        Ok(self.bld.build_select(c, then, otherwise, "").map_err(llvm)?.into_vector_value())
    }
    fn clamp(&self, x: V, lo: f64, hi: f64) -> R {
        let x = self.select_lt(x, self.splat(lo), self.splat(lo), x)?;
        self.select_lt(self.splat(hi), x, self.splat(hi), x)
    }

    /// `e^x`: `x = n·ln2 + r` with `n = ⌊x·log2(e) + ½⌋` (so `|r| ≤ ln2/2`, `r`
    /// by two FMAs with ln2 split in a high and a low part), `e^r` by its
    /// degree-6 Taylor polynomial in Horner form on FMAs (relative error ≈ 1e-7
    /// there), `2^n` from exponent bits.
    pub fn exp(&self, x: V) -> R {
        let x = self.clamp(x, -87.0, 88.0)?;
        let n = self.floor(self.fma(x, self.splat(std::f64::consts::LOG2_E), self.splat(0.5))?)?;
        let i32v = self.ctx.i32_type().vec_type(self.lanes as u32);
        let ni = self.bld.build_float_to_signed_int(n, i32v, "").map_err(llvm)?;
        let r = self.fma(n, self.splat(-0.693_145_751_953_125), x)?;
        let r = self.fma(n, self.splat(-1.428_606_765_330_187e-6), r)?;
        let mut p = self.splat(1.0 / 720.0);
        for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
            p = self.fma(p, r, self.splat(c))?;
        }
        let bias = VectorType::const_vector(&vec![self.ctx.i32_type().const_int(127, false); self.lanes]);
        let sh = VectorType::const_vector(&vec![self.ctx.i32_type().const_int(23, false); self.lanes]);
        let bits = self
            .bld
            .build_left_shift(self.bld.build_int_add(ni, bias, "").map_err(llvm)?, sh, "")
            .map_err(llvm)?;
        let two_n = self.bld.build_bit_cast(bits, self.vt, "").map_err(llvm)?.into_vector_value();
        self.mul(p, two_n)
    }

    /// `tanh(x) = 1 - 2/(e^{2x} + 1)`, the input clamped to ±9.
    pub fn tanh(&self, x: V) -> R {
        let x = self.clamp(x, -9.0, 9.0)?;
        let e = self.exp(self.mul(x, self.splat(2.0))?)?;
        self.sub(self.splat(1.0), self.div(self.splat(2.0), self.add(e, self.splat(1.0))?)?)
    }

    /// `erf(x)` by Abramowitz & Stegun 7.1.26.
    pub fn erf(&self, x: V) -> R {
        let neg = self.mul(x, self.splat(-1.0))?;
        let ax = self.select_lt(x, self.splat(0.0), neg, x)?;
        let t =
            self.div(self.splat(1.0), self.add(self.splat(1.0), self.mul(ax, self.splat(ERF_P as f64))?)?)?;
        let mut poly = self.splat(0.0);
        for a in ERF_A.iter().rev() {
            poly = self.fma(poly, t, self.splat(*a as f64))?;
        }
        poly = self.mul(poly, t)?;
        let e = self.exp(self.mul(self.mul(ax, ax)?, self.splat(-1.0))?)?;
        let y = self.sub(self.splat(1.0), self.mul(poly, e)?)?;
        let ny = self.mul(y, self.splat(-1.0))?;
        self.select_lt(x, self.splat(0.0), ny, y)
    }

    /// `1 / (1 + e^{-x})`.
    pub fn sigmoid(&self, x: V) -> R {
        let e = self.exp(self.mul(x, self.splat(-1.0))?)?;
        self.div(self.splat(1.0), self.add(self.splat(1.0), e)?)
    }

    /// The activation of `x`.
    /// A kernel's epilogue on the vector `y` of row `i`, columns `col..col + W`:
    /// `act(scale · y + bias[col] + residual[i, col])`, reading the bias from `bias`
    /// and the residual from `res` (row stride `ldr`) with `load(base, index)`,
    /// which each kernel form does its own way (plain, or masked at N's edge).
    #[allow(clippy::too_many_arguments)]
    pub fn epilogue(
        &self,
        e: &kernels::Epilogue,
        mut y: V,
        (bias, res, ldr): (PointerValue<'static>, PointerValue<'static>, IntValue<'static>),
        (i, col): (usize, usize),
        load: &dyn Fn(PointerValue<'static>, IntValue<'static>) -> R,
    ) -> R {
        let i64t = self.ctx.i64_type();
        let c = |x: usize| i64t.const_int(x as u64, false);
        if let Some(sc) = e.scale {
            y = self.mul(y, self.splat(sc as f64))?;
        }
        if e.bias {
            y = self.add(y, load(bias, c(col))?)?;
        }
        if e.residual {
            let row = self.bld.build_int_mul(c(i), ldr, "rrow").map_err(llvm)?;
            let idx = self.bld.build_int_add(row, c(col), "ri").map_err(llvm)?;
            y = self.add(y, load(res, idx)?)?;
        }
        self.activation(e.activation, y)
    }

    pub fn activation(&self, act: Activation, x: V) -> R {
        let half_x = |m: &Self| m.mul(x, m.splat(0.5));
        match act {
            Activation::None => Ok(x),
            // x < 0 ? 0 : x (a NaN stays NaN, as in the reference).
            Activation::Relu => self.select_lt(x, self.splat(0.0), self.splat(0.0), x),
            Activation::Gelu => {
                let e = self.erf(self.mul(x, self.splat(std::f64::consts::FRAC_1_SQRT_2))?)?;
                self.mul(half_x(self)?, self.add(self.splat(1.0), e)?)
            }
            Activation::GeluTanh => {
                let x3 = self.mul(self.mul(x, x)?, x)?;
                let inner =
                    self.mul(self.add(x, self.mul(x3, self.splat(0.044715))?)?, self.splat(GELU_C as f64))?;
                let t = self.tanh(inner)?;
                self.mul(half_x(self)?, self.add(self.splat(1.0), t)?)
            }
            Activation::Tanh => self.tanh(x),
        }
    }
}
