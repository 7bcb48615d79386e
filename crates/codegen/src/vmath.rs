//! Vectorized `exp`, `tanh`, `erf` and the activations, emitted inline as
//! polynomial code (no calls into libm), with the formulas of
//! `plan::Activation` so the scalar and vector paths agree.

use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::intrinsics::Intrinsic;
use inkwell::module::Module;
use inkwell::types::VectorType;
use inkwell::values::{FastMathFlags, IntValue, PointerValue, VectorValue};
use inkwell::FloatPredicate;
use plan::{
    Activation, Pointwise, PwBinary, PwCmp, PwOp, PwUnary, ERF_A, ERF_P, ERF_SERIES, GELU_C, TANH_SERIES,
};

use crate::{llvm, CodegenError};

type V = VectorValue<'static>;
type R = Result<V, CodegenError>;

/// How a kernel form loads an epilogue operand's vector at `(base, index)`:
/// W f32 lanes, or (`bytes`) W bytes of codes, indexed in bytes.
pub type EpilogueLoad<'a> = dyn Fn(PointerValue<'static>, IntValue<'static>, bool) -> R + 'a;

/// Emits vector math for one vector type.
pub(crate) struct VMath<'b> {
    pub ctx: &'static Context,
    pub module: &'b Module<'static>,
    pub bld: &'b Builder<'static>,
    pub vt: VectorType<'static>,
    pub lanes: usize,
    /// Whether the target scales by powers of two in one instruction at this
    /// width (AVX-512's `vscalefps`), which `exp` then uses.
    scalef: bool,
    /// Whether the target has AVX-512F (16-lane conversions with their own
    /// rounding).
    avx512: bool,
    /// Whether results that would be subnormal are made 0 (`exp`, `sigmoid`):
    /// on the CPU, whose cores (Intel's) take a microcode assist for each
    /// subnormal an instruction makes or reads. A GPU takes them at full speed,
    /// and the extra select costs registers there (spills at 64 a thread).
    flush: bool,
}

impl<'b> VMath<'b> {
    /// Vector math on `vt` (`lanes` f32) for a target with LLVM `features`.
    pub fn new(
        ctx: &'static Context,
        module: &'b Module<'static>,
        bld: &'b Builder<'static>,
        vt: VectorType<'static>,
        lanes: usize,
        features: &str,
    ) -> VMath<'b> {
        let avx512 = features.split(',').any(|t| t.trim() == "+avx512f");
        VMath { ctx, module, bld, vt, lanes, scalef: has_scalef(features, lanes), avx512, flush: true }
    }

    /// The same for a GPU kernel (`device`): subnormals kept.
    pub fn on_device(self, device: bool) -> VMath<'b> {
        VMath { flush: !device, ..self }
    }
}

/// Whether LLVM target `features` (`+avx512f,-avx512vl,...`) give `vscalefps`
/// at `lanes` f32 lanes: 16 with AVX-512F, 8 and 4 with AVX-512VL too.
fn has_scalef(features: &str, lanes: usize) -> bool {
    let has = |f: &str| features.split(',').any(|t| t.trim() == f);
    match lanes {
        16 => has("+avx512f"),
        8 | 4 => has("+avx512f") && has("+avx512vl"),
        _ => false,
    }
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
        self.intrinsic("llvm.floor", &[x])
    }
    /// The LLVM intrinsic `name` over this vector type, applied to `args`.
    fn intrinsic(&self, name: &str, args: &[V]) -> R {
        let f = Intrinsic::find(name)
            .and_then(|i| i.get_declaration(self.module, &[self.vt.into()]))
            .ok_or_else(|| llvm(format!("no {name} for the vector type")))?;
        let args: Vec<_> = args.iter().map(|a| (*a).into()).collect();
        self.call_vector(f, &args, name)
    }
    /// A call of `f` (named `name`) that returns a vector.
    fn call_vector(
        &self,
        f: inkwell::values::FunctionValue<'static>,
        args: &[inkwell::values::BasicMetadataValueEnum<'static>],
        name: &str,
    ) -> R {
        match self.bld.build_call(f, args, "").map_err(llvm)?.try_as_basic_value() {
            inkwell::values::ValueKind::Basic(v) => Ok(v.into_vector_value()),
            inkwell::values::ValueKind::Instruction(_) => Err(llvm(format!("{name} returned nothing"))),
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

    /// `base[i]` in every lane.
    fn broadcast_load(&self, base: PointerValue<'static>, i: u64) -> R {
        let (f32t, i64t) = (self.ctx.f32_type(), self.ctx.i64_type());
        // SAFETY (of the generated code): the caller passes `params` with every
        // parameter the program reads.
        let at = unsafe { self.bld.build_in_bounds_gep(f32t, base, &[i64t.const_int(i, false)], "") }
            .map_err(llvm)?;
        let v = self.bld.build_load(f32t, at, "").map_err(llvm)?;
        let one =
            self.bld.build_insert_element(self.vt.get_poison(), v, i64t.const_zero(), "").map_err(llvm)?;
        let zeros = VectorType::const_vector(&vec![self.ctx.i32_type().const_zero(); self.lanes]);
        self.bld.build_shuffle_vector(one, self.vt.get_poison(), zeros, "").map_err(llvm)
    }

    /// The bytes a store of codes writes for epilogue `e` of `y` (its values
    /// integers in 0..=255, by the compiler's bounds). Where the epilogue ends
    /// in a quantization (`integer(round(v), offset, lo, hi)`, a byte's
    /// bounds) and the target converts 16 lanes with their own rounding
    /// (AVX-512F), `v` is rounded and converted in one instruction and the
    /// rest is done on integers ([`Self::quantized_bytes`]); otherwise the
    /// epilogue's f32 values are narrowed ([`crate::code_bytes`]).
    pub fn epilogue_codes(
        &self,
        e: &plan::Epilogue,
        y: V,
        ptrs: (
            PointerValue<'static>,
            PointerValue<'static>,
            PointerValue<'static>,
            IntValue<'static>,
            PointerValue<'static>,
        ),
        at: (usize, usize),
        load: &EpilogueLoad,
    ) -> R {
        let fused = match e.activation {
            Activation::Pointwise(p) if e.makes_codes() => {
                p.quantization().filter(|&(_, offset, lo, hi)| self.rounds_in_conversion(offset, lo, hi))
            }
            _ => None,
        };
        match fused {
            Some((v, offset, lo, hi)) => {
                let e = plan::Epilogue { activation: Activation::Pointwise(v), ..*e };
                let v = self.epilogue(&e, y, ptrs, at, load)?;
                self.quantized_bytes(v, offset, lo, hi)
            }
            None => {
                let y = self.epilogue(e, y, ptrs, at, load)?;
                crate::code_bytes(self.ctx, self.bld, y, e.makes_codes())
            }
        }
    }

    /// Whether [`Self::quantized_ints`] applies at this width to `offset` and
    /// `lo..=hi`: 16 lanes with AVX-512F, the three within ±2^24 (so that a
    /// value past i32 lands on the bound the saturated one does).
    pub fn rounds_in_conversion(&self, offset: i32, lo: i32, hi: i32) -> bool {
        const NEAR: u32 = 1 << 24;
        self.lanes == 16 && self.avx512 && [offset, lo, hi].iter().all(|v| v.unsigned_abs() <= NEAR)
    }

    /// The i32 values of `integer(round(v), offset, lo, hi)` (where
    /// [`Self::rounds_in_conversion`]): `vcvtps2dq` with its own
    /// round-to-nearest-even (`{rn-sae}`, whatever MXCSR says) makes
    /// `round(v)` an i32 where it is one; a NaN lane is masked to 0 (as the
    /// saturating conversion takes it); past i32 the instruction gives
    /// `i32::MIN`, which after the wrapping add and the clamp is what the
    /// saturated value gives (below i32 it is the saturated value; above,
    /// `i32::MAX` plus a positive offset wraps below `lo` as `i32::MIN` plus
    /// it does), except for a positive `v` with `offset <= 0`, which is first
    /// clamped at `hi - offset` (every value from there on gives `hi`; NaN
    /// passes) or, where that is not an exact f32, below 2^31. Then the offset
    /// is added (wrapping, as `integer` does) and the sum clamped in i32.
    /// Where `offset == lo >= 0` no NaN mask is needed: `i32::MIN` plus the
    /// offset lands below `lo`, and the clamp gives `lo`, which a NaN's 0
    /// plus the offset is.
    pub fn quantized_ints(&self, v: V, offset: i32, lo: i32, hi: i32) -> R {
        self.quantized_ints_to(v, offset, lo, hi, true)
    }

    /// [`Self::quantized_ints`] as 16 bytes, where `0 <= lo` and `hi <= 255`:
    /// the upper bound of a byte is the narrowing's own unsigned saturation
    /// (`vpmovusdb`), so only a lower one is applied first.
    pub fn quantized_bytes(&self, v: V, offset: i32, lo: i32, hi: i32) -> R {
        debug_assert!(lo >= 0 && hi <= 255);
        let i = self.quantized_ints_to(v, offset, lo, hi, hi < 255)?;
        let (it, i8t, i16t) = (self.ctx.i32_type(), self.ctx.i8_type(), self.ctx.i16_type());
        let name = "llvm.x86.avx512.mask.pmovus.db.512";
        let narrow = self.module.get_function(name).unwrap_or_else(|| {
            let ft = i8t
                .vec_type(16)
                .fn_type(&[it.vec_type(16).into(), i8t.vec_type(16).into(), i16t.into()], false);
            self.module.add_function(name, ft, None)
        });
        let args = [i.into(), i8t.vec_type(16).get_undef().into(), i16t.const_all_ones().into()];
        self.call_vector(narrow, &args, name)
    }

    fn quantized_ints_to(&self, v: V, offset: i32, lo: i32, hi: i32, clamp_hi: bool) -> R {
        const EXACT: i64 = 1 << 24;
        let b = self.bld;
        let (it, i16t) = (self.ctx.i32_type(), self.ctx.i16_type());
        let iv = it.vec_type(16);
        let ints = |x: i32| VectorType::const_vector(&[it.const_int(x as i64 as u64, true); 16]);
        let v = match offset <= 0 {
            true => {
                let last = i64::from(hi) - i64::from(offset);
                // The largest f32 below 2^31, where `hi - offset` is not exact.
                let top = self.splat(if last <= EXACT { last as f64 } else { 2_147_483_520.0 });
                self.select_lt(top, v, top, v)?
            }
            false => v,
        };
        let mask = match offset == lo && offset >= 0 {
            true => i16t.const_all_ones(),
            false => {
                let ordered = b.build_float_compare(FloatPredicate::ORD, v, v, "").map_err(llvm)?;
                b.build_bit_cast(ordered, i16t, "").map_err(llvm)?.into_int_value()
            }
        };
        let name = "llvm.x86.avx512.mask.cvtps2dq.512";
        let cvt = self.module.get_function(name).unwrap_or_else(|| {
            let ft = iv.fn_type(&[self.vt.into(), iv.into(), i16t.into(), it.into()], false);
            self.module.add_function(name, ft, None)
        });
        // Rounding 8: to nearest even, exceptions suppressed.
        let args = [v.into(), ints(0).into(), mask.into(), it.const_int(8, false).into()];
        let r = self.call_vector(cvt, &args, name)?;
        let r = b.build_int_add(r, ints(offset), "").map_err(llvm)?;
        let int_op = |name: &str, a: V, c: V| -> R {
            let f = Intrinsic::find(name)
                .and_then(|i| i.get_declaration(self.module, &[iv.into()]))
                .ok_or_else(|| llvm(format!("no {name} for i32 vectors")))?;
            self.call_vector(f, &[a.into(), c.into()], name)
        };
        let r = int_op("llvm.smax", r, ints(lo))?;
        match clamp_hi {
            true => int_op("llvm.smin", r, ints(hi)),
            false => Ok(r),
        }
    }

    /// [`PwOp::Integer`]: `f32(clamp(i32(x) + offset, lo, hi))`, the
    /// conversion saturating (NaN to 0), the add wrapping. Where the offset
    /// and the bounds are within ±2^24, computed in f32, exactly:
    /// `clamp(trunc(x) + offset, lo, hi)` (a sum past 2^24 may round, but
    /// monotonically, and only where the clamp then takes a bound), with the
    /// two cases that differ selected apart: a NaN (`clamp(offset, lo, hi)`),
    /// and a sum that wraps past i32 (`lo` above, `hi` below). The common
    /// quantization (offset 0, `lo` 0) is two instructions after the `trunc`.
    pub fn integer(&self, x: V, offset: i32, lo: i32, hi: i32) -> R {
        const EXACT: i64 = 1 << 24;
        if [offset, lo, hi].iter().any(|v| i64::from(*v).abs() > EXACT) {
            return self.integer_in_i32(x, offset, lo, hi);
        }
        let b = self.bld;
        let (flo, fhi) = (self.splat(lo.into()), self.splat(hi.into()));
        let t = self.intrinsic("llvm.trunc", &[x])?;
        // A -0.0 is +0.0 after adding +0.0; a clamp at a `lo` of 0 or more
        // turns it into `lo` anyway.
        let s = if offset == 0 && lo >= 0 { t } else { self.add(t, self.splat(offset.into()))? };
        // `s > lo ? s : lo` (a NaN takes `lo`), then `c < hi ? c : hi`.
        let above = b.build_float_compare(FloatPredicate::OGT, s, flo, "").map_err(llvm)?;
        let c = b.build_select(above, s, flo, "").map_err(llvm)?.into_vector_value();
        let mut c = self.select_lt(c, fhi, c, fhi)?;
        // The saturated integer plus the offset wraps past i32 where
        // `trunc(x) >= 2^31 - offset` (to negative: `lo`) or
        // `trunc(x) < -2^31 - offset` (to positive: `hi`).
        match offset.signum() {
            1 => {
                let at = least_f32_from(2_147_483_648.0 - f64::from(offset));
                let past = b.build_float_compare(FloatPredicate::OGE, t, self.splat(at), "").map_err(llvm)?;
                c = b.build_select(past, flo, c, "").map_err(llvm)?.into_vector_value();
            }
            -1 => {
                let at = least_f32_from(-2_147_483_648.0 - f64::from(offset));
                let past = b.build_float_compare(FloatPredicate::OLT, t, self.splat(at), "").map_err(llvm)?;
                c = b.build_select(past, fhi, c, "").map_err(llvm)?.into_vector_value();
            }
            _ => {}
        }
        let nan_value = offset.clamp(lo, hi);
        if nan_value != lo {
            let nan = b.build_float_compare(FloatPredicate::UNO, x, x, "").map_err(llvm)?;
            c = b.build_select(nan, self.splat(nan_value.into()), c, "").map_err(llvm)?.into_vector_value();
        }
        Ok(c)
    }

    /// [`Self::integer`] in i32 arithmetic: the conversion saturating by a
    /// clamp in f32 and selects (LLVM 19 would take `llvm.fptosi.sat` apart
    /// into a conversion per lane).
    fn integer_in_i32(&self, x: V, offset: i32, lo: i32, hi: i32) -> R {
        let b = self.bld;
        let it = self.ctx.i32_type();
        let iv = it.vec_type(self.lanes as u32);
        let ints = |v: i32| VectorType::const_vector(&vec![it.const_int(v as i64 as u64, true); self.lanes]);
        // The largest f32 under 2^31; past it the conversion saturates.
        let top = 2_147_483_520.0;
        let low = self.splat(-2_147_483_648.0);
        let clamped = self.select_lt(x, low, low, x)?;
        let clamped = self.select_lt(self.splat(top), clamped, self.splat(top), clamped)?;
        let mut i = b.build_float_to_signed_int(clamped, iv, "").map_err(llvm)?;
        let past = b.build_float_compare(FloatPredicate::OGT, x, self.splat(top), "").map_err(llvm)?;
        i = b.build_select(past, ints(i32::MAX), i, "").map_err(llvm)?.into_vector_value();
        let nan = b.build_float_compare(FloatPredicate::UNO, x, x, "").map_err(llvm)?;
        i = b.build_select(nan, ints(0), i, "").map_err(llvm)?.into_vector_value();
        i = b.build_int_add(i, ints(offset), "").map_err(llvm)?;
        let int_op = |name: &str, a: V, c: V| -> R {
            let f = Intrinsic::find(name)
                .and_then(|f| f.get_declaration(self.module, &[iv.into()]))
                .ok_or_else(|| llvm(format!("no {name} for the vector type")))?;
            self.call_vector(f, &[a.into(), c.into()], name)
        };
        i = int_op("llvm.smax", i, ints(lo))?;
        i = int_op("llvm.smin", i, ints(hi))?;
        b.build_signed_int_to_float(i, self.vt, "").map_err(llvm)
    }

    /// Below this `e^x` is 0 where subnormals are flushed: the least f32 whose
    /// `e^x` is a normal float (the f32 below it is under ln(FLT_MIN)), and
    /// the polynomial's value here is above 1, so that a lane clamped here
    /// computes a normal float too.
    const EXP_LEAST: f64 = -87.336_540_222_167_97;

    /// Where subnormals are kept, `e^x` below this underflows to 0 anyway.
    const EXP_UNDERFLOW: f64 = -104.0;

    /// `e^x`: `x = n·ln2 + r` with `n = ⌊x·log2(e) + ½⌋` (so `|r| ≤ ln2/2`, `r`
    /// by two FMAs with ln2 split in a high and a low part), `e^r` by its
    /// degree-6 Taylor polynomial in Horner form on FMAs (relative error ≈ 1e-7
    /// there), and `2^n` applied as two powers of two `2^⌊n/2⌋·2^⌈n/2⌉`, each a
    /// normal float (with AVX-512, one `vscalefps`), so that results overflow to
    /// +inf past ln(FLT_MAX). On the CPU, results that would be subnormal are 0
    /// (an error under 1.2e-38) and no lane makes a subnormal on the way: Intel
    /// cores take a microcode assist for each subnormal an instruction makes or
    /// reads, which a masked softmax (every masked logit's `e^x`) paid on every
    /// call. On a GPU they underflow gradually. NaN stays NaN.
    pub fn exp(&self, x: V) -> R {
        let least = if self.flush { Self::EXP_LEAST } else { Self::EXP_UNDERFLOW };
        let y = self.exp_from(x, least)?;
        self.flushed(x, y)
    }

    /// `y`, or 0 where `x < EXP_LEAST` when subnormals are flushed (`y` is
    /// `e^x` or a function of it that would be subnormal there). The
    /// comparison is false for NaN, which keeps `y`'s NaN.
    fn flushed(&self, x: V, y: V) -> R {
        if !self.flush {
            return Ok(y);
        }
        self.select_lt(x, self.splat(Self::EXP_LEAST), self.splat(0.0), y)
    }

    /// `e^x` for `x ≥ least` (below it, `e^least`).
    fn exp_from(&self, x: V, least: f64) -> R {
        let xc = self.clamp(x, least, 89.0)?;
        let n = self.floor(self.fma(xc, self.splat(std::f64::consts::LOG2_E), self.splat(0.5))?)?;
        let r = self.fma(n, self.splat(-0.693_145_751_953_125), xc)?;
        let r = self.fma(n, self.splat(-1.428_606_765_330_187e-6), r)?;
        let mut p = self.splat(1.0 / 720.0);
        for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
            p = self.fma(p, r, self.splat(c))?;
        }
        if self.scalef {
            // `p·2^n` in one instruction, overflowing to +inf and underflowing
            // gradually as the two-step scaling below does; a NaN input is NaN
            // throughout (the clamp keeps it, and so does every step after it).
            let name = format!("llvm.x86.avx512.mask.scalef.ps.{}", self.lanes * 32);
            let f = Intrinsic::find(&name)
                .and_then(|i| i.get_declaration(self.module, &[]))
                .ok_or_else(|| llvm(format!("no {name}")))?;
            let mut args: Vec<inkwell::values::BasicMetadataValueEnum> =
                vec![p.into(), n.into(), self.vt.get_poison().into()];
            if self.lanes == 16 {
                args.push(self.ctx.i16_type().const_all_ones().into());
                // The current rounding direction (`_MM_FROUND_CUR_DIRECTION`).
                args.push(self.ctx.i32_type().const_int(4, false).into());
            } else {
                args.push(self.ctx.i8_type().const_all_ones().into());
            }
            return self.call_vector(f, &args, &name);
        }
        let int =
            |v: u64| VectorType::const_vector(&vec![self.ctx.i32_type().const_int(v, false); self.lanes]);
        let ni = self
            .bld
            .build_float_to_signed_int(n, self.ctx.i32_type().vec_type(self.lanes as u32), "")
            .map_err(llvm)?;
        let n1 = self.bld.build_right_shift(ni, int(1), true, "").map_err(llvm)?;
        let n2 = self.bld.build_int_sub(ni, n1, "").map_err(llvm)?;
        let two = |k| -> R {
            let biased = self.bld.build_int_add(k, int(127), "").map_err(llvm)?;
            let bits = self.bld.build_left_shift(biased, int(23), "").map_err(llvm)?;
            Ok(self.bld.build_bit_cast(bits, self.vt, "").map_err(llvm)?.into_vector_value())
        };
        let y = self.mul(self.mul(p, two(n1)?)?, two(n2)?)?;
        // A NaN input: its own value (the integer path above made nothing of it).
        let nan = self.bld.build_float_compare(FloatPredicate::UNO, x, x, "").map_err(llvm)?;
        Ok(self.bld.build_select(nan, x, y, "").map_err(llvm)?.into_vector_value())
    }

    /// `tanh(x)`: `1 - 2/(e^{2x} + 1)` (the input clamped to ±9), and for
    /// `|x| < ½`, where that form cancels, the odd Taylor polynomial to `x¹⁵`
    /// (its first omitted term is below 1e-8 relative there).
    pub fn tanh(&self, x: V) -> R {
        let xc = self.clamp(x, -9.0, 9.0)?;
        let e = self.exp(self.mul(xc, self.splat(2.0))?)?;
        let far = self.sub(self.splat(1.0), self.div(self.splat(2.0), self.add(e, self.splat(1.0))?)?)?;
        let x2 = self.mul(x, x)?;
        let mut p = self.splat(TANH_SERIES[0]);
        for c in &TANH_SERIES[1..] {
            p = self.fma(p, x2, self.splat(*c))?;
        }
        let near = self.fma(self.mul(p, x2)?, x, x)?;
        let small =
            self.bld.build_float_compare(FloatPredicate::OLT, x2, self.splat(0.25), "").map_err(llvm)?;
        Ok(self.bld.build_select(small, near, far, "").map_err(llvm)?.into_vector_value())
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
        let far = self.select_lt(x, self.splat(0.0), ny, y)?;
        // |x| < ½: 2/√π·(x - x³/3 + x⁵/10 - x⁷/42 + x⁹/216 - x¹¹/1320 + x¹³/9360),
        // accurate to the last bits where the formula above has an absolute error
        // of 1.5e-7 on a small value.
        let x2 = self.mul(x, x)?;
        let mut p = self.splat(ERF_SERIES[0]);
        for c in &ERF_SERIES[1..] {
            p = self.fma(p, x2, self.splat(*c))?;
        }
        let near = self.mul(self.mul(p, x)?, self.splat(std::f64::consts::FRAC_2_SQRT_PI))?;
        let small =
            self.bld.build_float_compare(FloatPredicate::OLT, x2, self.splat(0.25), "").map_err(llvm)?;
        Ok(self.bld.build_select(small, near, far, "").map_err(llvm)?.into_vector_value())
    }

    /// `1 / (1 + e^{-x})`.
    pub fn sigmoid(&self, x: V) -> R {
        let e = self.exp(self.mul(x, self.splat(-1.0))?)?;
        let s = self.div(self.splat(1.0), self.add(self.splat(1.0), e)?)?;
        self.flushed(x, s)
    }

    /// A kernel's epilogue on the vector `y` of row `i`, columns `col..col + W`:
    /// `act(scale · column_scale[col] · y + bias[col] + residual[i, col])`,
    /// reading the column scales from `cscale`, the bias from `bias` and the
    /// residual from `res` (row stride `ldr`; in bytes for codes) with
    /// `load(base, index, bytes)`, which each kernel form does its own way
    /// (plain, or masked at N's edge). A program reading the residual
    /// ([`plan::PwOp::Residual`]) takes it as its operand instead of the sum.
    #[allow(clippy::too_many_arguments)]
    pub fn epilogue(
        &self,
        e: &plan::Epilogue,
        mut y: V,
        (cscale, bias, res, ldr, params): (
            PointerValue<'static>,
            PointerValue<'static>,
            PointerValue<'static>,
            IntValue<'static>,
            PointerValue<'static>,
        ),
        (i, col): (usize, usize),
        load: &EpilogueLoad,
    ) -> R {
        let i64t = self.ctx.i64_type();
        let c = |x: usize| i64t.const_int(x as u64, false);
        if let Some(sc) = e.scale {
            y = self.mul(y, self.splat(sc as f64))?;
        }
        if e.column_scale {
            y = self.mul(y, load(cscale, c(col), false)?)?;
        }
        if e.bias {
            y = self.add(y, load(bias, c(col), false)?)?;
        }
        let mut residual = None;
        if e.residual {
            let row = self.bld.build_int_mul(c(i), ldr, "rrow").map_err(llvm)?;
            let idx = self.bld.build_int_add(row, c(col), "ri").map_err(llvm)?;
            let r = match e.residual_codes {
                // A code's value is its byte's: widened, then converted exactly.
                true => {
                    let bytes = load(res, idx, true)?;
                    let ints = self
                        .bld
                        .build_int_z_extend(bytes, self.ctx.i32_type().vec_type(self.lanes as u32), "r.i32")
                        .map_err(llvm)?;
                    self.bld.build_unsigned_int_to_float(ints, self.vt, "r.f32").map_err(llvm)?
                }
                false => load(res, idx, false)?,
            };
            match e.residual_in_program() {
                true => residual = Some(r),
                false => y = self.add(y, r)?,
            }
        }
        match e.activation {
            Activation::Pointwise(p) => self.pointwise_at(&p, y, residual, Some(params)),
            act => self.activation(act, y),
        }
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
            Activation::Pointwise(p) => self.pointwise(&p, x, None),
        }
    }

    /// A [`Pointwise`] program on `x`, one instruction (or inline polynomial)
    /// per operation, with the semantics of [`Pointwise::eval_with`]: its
    /// parameters read from `params` (each broadcast to the lanes).
    pub fn pointwise(&self, p: &Pointwise, x: V, params: Option<PointerValue<'static>>) -> R {
        self.pointwise_at(p, x, None, params)
    }

    /// [`Self::pointwise`] with the residual it reads, if it reads one.
    pub fn pointwise_at(
        &self,
        p: &Pointwise,
        x: V,
        residual: Option<V>,
        params: Option<PointerValue<'static>>,
    ) -> R {
        let mut v: Vec<V> = Vec::with_capacity(p.ops().len());
        for op in p.ops() {
            let g = |i: u8| v[i as usize];
            let r = match *op {
                PwOp::Input => x,
                PwOp::Residual => {
                    residual.ok_or_else(|| llvm("a program reading a residual with none given"))?
                }
                PwOp::Const(bits) => self.splat(f32::from_bits(bits) as f64),
                PwOp::Param(i) => {
                    let params =
                        params.ok_or_else(|| llvm("a program's parameter with no parameters given"))?;
                    self.broadcast_load(params, i as u64)?
                }
                PwOp::Unary(u, a) => {
                    let a = g(a);
                    match u {
                        PwUnary::Neg => self.bld.build_float_neg(a, "").map_err(llvm)?,
                        PwUnary::Abs => self.intrinsic("llvm.fabs", &[a])?,
                        PwUnary::Exp => self.exp(a)?,
                        PwUnary::Log => self.intrinsic("llvm.log", &[a])?,
                        PwUnary::Sqrt => self.intrinsic("llvm.sqrt", &[a])?,
                        PwUnary::Reciprocal => self.div(self.splat(1.0), a)?,
                        PwUnary::Tanh => self.tanh(a)?,
                        PwUnary::Erf => self.erf(a)?,
                        PwUnary::Sigmoid => self.sigmoid(a)?,
                        PwUnary::Relu => self.activation(Activation::Relu, a)?,
                        PwUnary::Floor => self.floor(a)?,
                        PwUnary::Ceil => self.intrinsic("llvm.ceil", &[a])?,
                        PwUnary::Round => self.intrinsic("llvm.roundeven", &[a])?,
                    }
                }
                PwOp::Binary(b, p, q) => {
                    let (a, c) = (g(p), g(q));
                    match b {
                        PwBinary::Add => self.add(a, c)?,
                        PwBinary::Sub => self.sub(a, c)?,
                        PwBinary::Mul => self.mul(a, c)?,
                        PwBinary::Div => self.div(a, c)?,
                        PwBinary::Max => self.intrinsic("llvm.maximum", &[a, c])?,
                        PwBinary::Min => self.intrinsic("llvm.minimum", &[a, c])?,
                    }
                }
                // A quantization's store inside the program (a residual block's
                // product, dequantized again): rounded and converted in one
                // instruction where it can be, the rest on integers, as the
                // epilogue's last quantization (`epilogue_codes`).
                PwOp::Integer { x, offset, lo, hi } => match p.ops()[x as usize] {
                    PwOp::Unary(PwUnary::Round, y) if self.rounds_in_conversion(offset, lo, hi) => {
                        let i = self.quantized_ints(g(y), offset, lo, hi)?;
                        self.bld.build_signed_int_to_float(i, self.vt, "q.f32").map_err(llvm)?
                    }
                    _ => self.integer(g(x), offset, lo, hi)?,
                },
                PwOp::MulAdd(a, b, c) => self.intrinsic("llvm.fma", &[g(a), g(b), g(c)])?,
                PwOp::Select(cmp, a, b, t, f) => {
                    let pred = match cmp {
                        PwCmp::Less => FloatPredicate::OLT,
                        PwCmp::LessEq => FloatPredicate::OLE,
                        PwCmp::Greater => FloatPredicate::OGT,
                        PwCmp::GreaterEq => FloatPredicate::OGE,
                        PwCmp::Equal => FloatPredicate::OEQ,
                    };
                    let c = self.bld.build_float_compare(pred, g(a), g(b), "").map_err(llvm)?;
                    self.bld.build_select(c, g(t), g(f), "").map_err(llvm)?.into_vector_value()
                }
            };
            v.push(r);
        }
        Ok(v.last().copied().unwrap_or(x))
    }
}

/// The least f32 at or above `a` (so that `t >= a` is `t >= least_f32_from(a)`
/// for every f32 `t`, and `t < a` is `t < least_f32_from(a)`).
fn least_f32_from(a: f64) -> f64 {
    let f = a as f32;
    let f = if f64::from(f) < a { f.next_up() } else { f };
    f64::from(f)
}
