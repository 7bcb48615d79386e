//! Generated packing routines (the ABI of `kernels::pack`): `rows ≤ width` source
//! rows, contiguous along K, interleaved into a `width`-wide panel of words. Per
//! block of `W` words (`W` f32 lanes; `W · k_group` depths): one vector load per
//! row (two for bf16, converted to `2W` bf16 with `vcvtneps2bf16` and seen as `W`
//! pair words), an in-register transpose of the words, `width` vector stores; the
//! last partial block uses masked loads and stores, so nothing past a row's `kc`
//! elements is read and nothing past the panel written (a depth missing from the
//! last bf16 pair loads as zero). Rows at or past `rows` read a constant zero
//! vector instead (local padding with no branch per row).
//!
//! The transpose: when `width` is a multiple of `W`, each `W × W` block by a
//! butterfly (`log₂ W` stages of two-source shuffles swapping sub-blocks, a
//! quarter of a shuffle per element on AVX-512); otherwise each output vector is
//! gathered from the rows it holds by a chain of two-source shuffles
//! (`width − 1` per vector for `width < W`).

use inkwell::context::Context;
use inkwell::intrinsics::Intrinsic;
use inkwell::module::Module;
use inkwell::types::VectorType;
use inkwell::values::{BasicMetadataValueEnum, BasicValueEnum, IntValue, PointerValue, VectorValue};
use inkwell::{AddressSpace, IntPredicate};
use kernels::{
    CodeDot, CodeDotFn, DequantFn, Dequantizer, ElemType, PackFn, Packer, RowsPackFn, RowsPacker, Target,
};

use crate::{jit_module, llvm, set_align, target_attributes, CodegenError};

/// The packing routines of a family, one per panel width, compiled together,
/// all converting to the family's element type.
pub struct JitPackers {
    packers: Vec<Packer>,
    rows: Vec<RowsPacker>,
    dequantizers: Vec<Dequantizer>,
    dots: Vec<CodeDot>,
    ir: crate::OptimizedIr,
    // Owns the machine code the packers point into; only dropped.
    _image: kernels::CodeImage,
}

impl JitPackers {
    /// The machine code the packers point into (valid while the image lives).
    pub fn into_image(self) -> kernels::CodeImage {
        self._image
    }

    /// The routine writing panels `width` wide, if compiled.
    pub fn get(&self, width: usize) -> Option<Packer> {
        self.packers.iter().copied().find(|p| p.width == width)
    }
    pub fn packers(&self) -> &[Packer] {
        &self.packers
    }
    /// The routine over rows given by address writing panels `width` wide, if compiled.
    pub fn get_rows(&self, width: usize) -> Option<RowsPacker> {
        self.rows.iter().copied().find(|p| p.width == width)
    }
    /// The dequantizer of `bits`-bit codes in rows `width` wide, if compiled.
    pub fn get_dequantizer(&self, width: usize, bits: u32) -> Option<Dequantizer> {
        self.dequantizers.iter().copied().find(|d| d.width == width && d.bits == bits)
    }
    /// The product of a row with `bits`-bit codes `width` wide, if compiled.
    pub fn get_code_dot(&self, width: usize, bits: u32) -> Option<CodeDot> {
        self.dots.iter().copied().find(|d| d.width == width && d.bits == bits)
    }
    /// The optimized LLVM IR.
    pub fn ir(&self) -> &str {
        self.ir.text()
    }
    /// The generated assembly (emitted again from the IR, on demand).
    pub fn asm(&self) -> String {
        self.ir.asm()
    }
}

/// The widest panel a routine is generated for (a register tile's width is at
/// most 4 vectors, its height at most 16).
const MAX_WIDTH: usize = 128;

/// Compile one packing routine per distinct width in `widths` for `t`, writing
/// `elem` panels, and one over rows given by address ([`RowsPackFn`]: a
/// convolution's taps) per width in `rows_widths`.
pub fn compile_packers(
    t: &Target,
    elem: ElemType,
    widths: &[usize],
    rows_widths: &[usize],
) -> Result<JitPackers, CodegenError> {
    compile_packers_cached(t, elem, widths, rows_widths, &crate::ObjectCache::none())
}

/// [`compile_packers`] through `cache`.
pub fn compile_packers_cached(
    t: &Target,
    elem: ElemType,
    widths: &[usize],
    rows_widths: &[usize],
    cache: &crate::ObjectCache,
) -> Result<JitPackers, CodegenError> {
    let l = t.f32_lanes;
    if !t.supported() {
        return Err(CodegenError::Unsupported("packing routines need x86-64 with AVX2 and FMA".into()));
    }
    t.check_elem(elem).map_err(|e| CodegenError::Unsupported(e.to_string()))?;
    let sorted = |w: &[usize]| {
        let mut w = w.to_vec();
        w.sort_unstable();
        w.dedup();
        w
    };
    let (widths, rows_widths) = (sorted(widths), sorted(rows_widths));
    if let Some(&w) = widths.iter().chain(&rows_widths).find(|&&w| w == 0 || w > MAX_WIDTH) {
        return Err(CodegenError::Unsupported(format!("a packing routine {w} wide (1 to {MAX_WIDTH})")));
    }
    let name = |w: usize| format!("pack_{elem}_w{w}");
    let rows_name = |w: usize| format!("pack_{elem}_w{w}_rows");
    // f32 families dequantize weight codes for each panel width of 8 columns or more.
    let dequant: Vec<(usize, u32)> = match elem {
        ElemType::F32 => {
            widths.iter().filter(|&&w| w.is_multiple_of(8)).flat_map(|&w| [(w, 4), (w, 8)]).collect()
        }
        _ => Vec::new(),
    };
    let dequant_name = |(w, bits): (usize, u32)| format!("dequant_u{bits}_w{w}");
    let dot_name = |(w, bits): (usize, u32)| format!("code_dot_u{bits}_w{w}");
    let (image, ir) = jit_module(t, "packers", cache, |ctx, module, cpu, features| {
        for &w in &widths {
            build_packer(ctx, module, &name(w), (w, elem), l, Rows::Strided, cpu, features)?;
        }
        for &w in &rows_widths {
            build_packer(ctx, module, &rows_name(w), (w, elem), l, Rows::ByAddress, cpu, features)?;
        }
        for &(w, bits) in &dequant {
            build_dequantizer(ctx, module, &dequant_name((w, bits)), (w, bits), (cpu, features, l))?;
            build_code_dot(ctx, module, &dot_name((w, bits)), (w, bits), (cpu, features, l))?;
        }
        Ok(())
    })?;
    // SAFETY (for the entries below): each name was just generated with exactly the
    // `PackFn`, `RowsPackFn`, `DequantFn` or `CodeDotFn` signature and the C calling convention; the image that
    // holds them lives in the returned value.
    let entry_err = |e: kernels::ImageError| llvm(e.to_string());
    let mut packers = Vec::with_capacity(widths.len());
    for &w in &widths {
        let func: PackFn = unsafe { image.entry(&name(w)) }.map_err(entry_err)?;
        packers.push(Packer { width: w, elem, func });
    }
    let mut rows = Vec::with_capacity(rows_widths.len());
    for &w in &rows_widths {
        let func: RowsPackFn = unsafe { image.entry(&rows_name(w)) }.map_err(entry_err)?;
        rows.push(RowsPacker { width: w, elem, func });
    }
    let mut dequantizers = Vec::with_capacity(dequant.len());
    let mut dots = Vec::with_capacity(dequant.len());
    for &(w, bits) in &dequant {
        let func: DequantFn = unsafe { image.entry(&dequant_name((w, bits))) }.map_err(entry_err)?;
        dequantizers.push(Dequantizer { width: w, bits, func });
        let func: CodeDotFn = unsafe { image.entry(&dot_name((w, bits))) }.map_err(entry_err)?;
        dots.push(CodeDot { width: w, bits, func });
    }
    Ok(JitPackers { packers, rows, dequantizers, dots, ir, _image: image })
}

/// A function of one of the code routines' signatures ([`DequantFn`], or
/// with `dot` [`CodeDotFn`]), for this target.
fn declare_code_routine(
    ctx: &'static Context,
    module: &Module<'static>,
    name: &str,
    dot: bool,
    (cpu, features, lanes): (&str, &str, usize),
) -> inkwell::values::FunctionValue<'static> {
    let ptr = ctx.ptr_type(AddressSpace::default());
    let i64t = ctx.i64_type();
    let params: Vec<inkwell::types::BasicMetadataTypeEnum> = if dot {
        vec![ptr.into(), ptr.into(), i64t.into(), ptr.into()]
    } else {
        vec![ptr.into(), ptr.into(), ptr.into(), i64t.into(), ptr.into()]
    };
    let f = module.add_function(name, ctx.void_type().fn_type(&params, false), None);
    target_attributes(ctx, f, cpu, features, lanes);
    f
}

/// A dequantizing routine ([`DequantFn`]) for rows `width` wide of `bits`-bit
/// codes: per row one load of its codes (4 bits: the low halves, then the
/// high halves, joined into one vector of `width` bytes), widened to f32 and
/// one FMA with the group's scales and offsets, kept in registers across the
/// rows, and one store.
fn build_dequantizer(
    ctx: &'static Context,
    module: &Module<'static>,
    name: &str,
    (width, bits): (usize, u32),
    target: (&str, &str, usize),
) -> Result<(), CodegenError> {
    let (f32t, i64t, i8t) = (ctx.f32_type(), ctx.i64_type(), ctx.i8_type());
    let fv = f32t.vec_type(width as u32);
    let f = declare_code_routine(ctx, module, name, false, target);
    let p = |i: u32| f.get_nth_param(i).ok_or_else(|| llvm("param"));
    let (codes, scale, offset) =
        (p(0)?.into_pointer_value(), p(1)?.into_pointer_value(), p(2)?.into_pointer_value());
    let (rows, out) = (p(3)?.into_int_value(), p(4)?.into_pointer_value());
    let fma = Intrinsic::find("llvm.fma")
        .and_then(|i| i.get_declaration(module, &[fv.into()]))
        .ok_or_else(|| llvm("no llvm.fma for the vector type"))?;
    let bld = ctx.create_builder();
    let entry = ctx.append_basic_block(f, "entry");
    let body = ctx.append_basic_block(f, "row");
    let exit = ctx.append_basic_block(f, "exit");
    bld.position_at_end(entry);
    let s = bld.build_load(fv, scale, "scale").map_err(llvm)?;
    set_align(&s, 4);
    let o = bld.build_load(fv, offset, "offset").map_err(llvm)?;
    set_align(&o, 4);
    let any = bld.build_int_compare(IntPredicate::SGT, rows, i64t.const_zero(), "any").map_err(llvm)?;
    bld.build_conditional_branch(any, body, exit).map_err(llvm)?;
    bld.position_at_end(body);
    let r = bld.build_phi(i64t, "r").map_err(llvm)?;
    r.add_incoming(&[(&i64t.const_zero(), entry)]);
    let ri = r.as_basic_value().into_int_value();
    let row_bytes = i64t.const_int(width as u64 * bits as u64 / 8, false);
    let at = bld.build_int_mul(ri, row_bytes, "at").map_err(llvm)?;
    // SAFETY (of the IR, not of Rust): row `r < rows` of the codes, as the ABI promises.
    let src = unsafe { bld.build_in_bounds_gep(i8t, codes, &[at], "src") }.map_err(llvm)?;
    let vals = widened_codes(ctx, &bld, src, (width, bits))?;
    let args: [BasicMetadataValueEnum; 3] = [vals.into(), s.into(), o.into()];
    let y = bld.build_call(fma, &args, "y").map_err(llvm)?;
    let y = match y.try_as_basic_value() {
        inkwell::values::ValueKind::Basic(v) => v,
        inkwell::values::ValueKind::Instruction(_) => return Err(llvm("llvm.fma returned nothing")),
    };
    let at = bld.build_int_mul(ri, i64t.const_int(width as u64, false), "out.at").map_err(llvm)?;
    // SAFETY (of the IR, not of Rust): row `r < rows` of the `rows × width` output.
    let dst = unsafe { bld.build_in_bounds_gep(f32t, out, &[at], "dst") }.map_err(llvm)?;
    let st = bld.build_store(dst, y).map_err(llvm)?;
    st.set_alignment(4).map_err(llvm)?;
    let next = bld.build_int_add(ri, i64t.const_int(1, false), "next").map_err(llvm)?;
    r.add_incoming(&[(&next, body)]);
    let more = bld.build_int_compare(IntPredicate::SLT, next, rows, "more").map_err(llvm)?;
    bld.build_conditional_branch(more, body, exit).map_err(llvm)?;
    bld.position_at_end(exit);
    bld.build_return(None).map_err(llvm)?;
    Ok(())
}

/// A routine multiplying a row by codes ([`CodeDotFn`]), rows `width` wide
/// of `bits`-bit codes read as [`build_dequantizer`]'s: per row one FMA of
/// the widened codes by the row's value into accumulators kept in registers,
/// added to `acc` at the end.
fn build_code_dot(
    ctx: &'static Context,
    module: &Module<'static>,
    name: &str,
    (width, bits): (usize, u32),
    target: (&str, &str, usize),
) -> Result<(), CodegenError> {
    let (f32t, i64t, i8t, i32t) = (ctx.f32_type(), ctx.i64_type(), ctx.i8_type(), ctx.i32_type());
    let w = width as u32;
    let fv = f32t.vec_type(w);
    let f = declare_code_routine(ctx, module, name, true, target);
    let p = |i: u32| f.get_nth_param(i).ok_or_else(|| llvm("param"));
    let (codes, a) = (p(0)?.into_pointer_value(), p(1)?.into_pointer_value());
    let (rows, acc) = (p(2)?.into_int_value(), p(3)?.into_pointer_value());
    let fma = Intrinsic::find("llvm.fma")
        .and_then(|i| i.get_declaration(module, &[fv.into()]))
        .ok_or_else(|| llvm("no llvm.fma for the vector type"))?;
    let bld = ctx.create_builder();
    let entry = ctx.append_basic_block(f, "entry");
    let body = ctx.append_basic_block(f, "row");
    let done = ctx.append_basic_block(f, "done");
    let exit = ctx.append_basic_block(f, "exit");
    bld.position_at_end(entry);
    let any = bld.build_int_compare(IntPredicate::SGT, rows, i64t.const_zero(), "any").map_err(llvm)?;
    bld.build_conditional_branch(any, body, exit).map_err(llvm)?;
    bld.position_at_end(body);
    let r = bld.build_phi(i64t, "r").map_err(llvm)?;
    r.add_incoming(&[(&i64t.const_zero(), entry)]);
    let sum = bld.build_phi(fv, "sum").map_err(llvm)?;
    sum.add_incoming(&[(&fv.const_zero(), entry)]);
    let ri = r.as_basic_value().into_int_value();
    let at =
        bld.build_int_mul(ri, i64t.const_int(width as u64 * bits as u64 / 8, false), "at").map_err(llvm)?;
    // SAFETY (of the IR, not of Rust): row `r < rows` of the codes and value `r` of
    // the row, as the ABI promises.
    let src = unsafe { bld.build_in_bounds_gep(i8t, codes, &[at], "src") }.map_err(llvm)?;
    let ap = unsafe { bld.build_in_bounds_gep(f32t, a, &[ri], "ap") }.map_err(llvm)?;
    let vals = widened_codes(ctx, &bld, src, (width, bits))?;
    let x = bld.build_load(f32t, ap, "x").map_err(llvm)?.into_float_value();
    let one = bld.build_insert_element(fv.get_poison(), x, i32t.const_zero(), "x1").map_err(llvm)?;
    let xs =
        bld.build_shuffle_vector(one, fv.get_poison(), i32t.vec_type(w).const_zero(), "xs").map_err(llvm)?;
    let args: [BasicMetadataValueEnum; 3] = [vals.into(), xs.into(), sum.as_basic_value().into()];
    let y = match bld.build_call(fma, &args, "y").map_err(llvm)?.try_as_basic_value() {
        inkwell::values::ValueKind::Basic(v) => v,
        inkwell::values::ValueKind::Instruction(_) => return Err(llvm("llvm.fma returned nothing")),
    };
    let next = bld.build_int_add(ri, i64t.const_int(1, false), "next").map_err(llvm)?;
    r.add_incoming(&[(&next, body)]);
    sum.add_incoming(&[(&y, body)]);
    let more = bld.build_int_compare(IntPredicate::SLT, next, rows, "more").map_err(llvm)?;
    bld.build_conditional_branch(more, body, done).map_err(llvm)?;
    bld.position_at_end(done);
    let old = bld.build_load(fv, acc, "acc").map_err(llvm)?;
    set_align(&old, 4);
    let total = bld.build_float_add(old.into_vector_value(), y.into_vector_value(), "total").map_err(llvm)?;
    let st = bld.build_store(acc, total).map_err(llvm)?;
    st.set_alignment(4).map_err(llvm)?;
    bld.build_unconditional_branch(exit).map_err(llvm)?;
    bld.position_at_end(exit);
    bld.build_return(None).map_err(llvm)?;
    Ok(())
}

/// One row of `width` unsigned `bits`-bit codes at `src` (laid out as
/// [`DequantFn`] reads them) as a vector of f32: one load (4 bits: the low
/// halves, then the high halves, joined), widened and converted.
fn widened_codes(
    ctx: &'static Context,
    bld: &inkwell::builder::Builder<'static>,
    src: PointerValue<'static>,
    (width, bits): (usize, u32),
) -> Result<VectorValue<'static>, CodegenError> {
    let (f32t, i8t, i32t) = (ctx.f32_type(), ctx.i8_type(), ctx.i32_type());
    let w = width as u32;
    let bytes = if bits == 8 {
        let v = bld.build_load(i8t.vec_type(w), src, "codes").map_err(llvm)?;
        set_align(&v, 1);
        v.into_vector_value()
    } else {
        let v = bld.build_load(i8t.vec_type(w / 2), src, "pairs").map_err(llvm)?;
        set_align(&v, 1);
        let v = v.into_vector_value();
        let splat = |x: u64| VectorType::const_vector(&vec![i8t.const_int(x, false); width / 2]);
        let lo = bld.build_and(v, splat(15), "lo").map_err(llvm)?;
        let hi = bld.build_right_shift(v, splat(4), false, "hi").map_err(llvm)?;
        let order: Vec<_> = (0..width).map(|j| i32t.const_int(j as u64, false)).collect();
        bld.build_shuffle_vector(lo, hi, VectorType::const_vector(&order), "codes").map_err(llvm)?
    };
    let wide = bld.build_int_z_extend(bytes, i32t.vec_type(w), "wide").map_err(llvm)?;
    bld.build_unsigned_int_to_float(wide, f32t.vec_type(w), "vals").map_err(llvm)
}

/// How a packing routine finds its source rows.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rows {
    /// `rows ≤ width` rows `ld` apart from `src` ([`PackFn`]).
    Strided,
    /// `width` addresses, null for a row of zeros ([`RowsPackFn`]).
    ByAddress,
}

#[allow(clippy::too_many_arguments)]
fn build_packer(
    ctx: &'static Context,
    module: &Module<'static>,
    name: &str,
    (width, elem): (usize, ElemType),
    l: usize,
    how: Rows,
    cpu: &str,
    features: &str,
) -> Result<(), CodegenError> {
    let (f32t, i64t, i32t) = (ctx.f32_type(), ctx.i64_type(), ctx.i32_type());
    // Depths per word, and per block of `l` words.
    let g = elem.k_group();
    let depths = l * g;
    let ptr = ctx.ptr_type(AddressSpace::default());
    let vt = f32t.vec_type(l as u32);
    let params: Vec<inkwell::types::BasicMetadataTypeEnum> = match how {
        Rows::Strided => vec![ptr.into(), i64t.into(), i64t.into(), i64t.into(), ptr.into()],
        Rows::ByAddress => vec![ptr.into(), i64t.into(), ptr.into()],
    };
    let f = module.add_function(name, ctx.void_type().fn_type(&params, false), None);
    target_attributes(ctx, f, cpu, &crate::features_for(elem, features), l);
    let noalias =
        ctx.create_enum_attribute(inkwell::attributes::Attribute::get_named_enum_kind_id("noalias"), 0);
    let last = params.len() as u32 - 1;
    for i in [0, last] {
        f.add_attribute(inkwell::attributes::AttributeLoc::Param(i), noalias);
    }
    let p = |i: u32| f.get_nth_param(i).ok_or_else(|| llvm("param"));
    let src = p(0)?.into_pointer_value();
    let (kc, dst) = (p(last - 1)?.into_int_value(), p(last)?.into_pointer_value());

    // The rows past `rows` read this (one vector of zeros, never advanced).
    let zeros = module.add_global(f32t.array_type(depths as u32), None, &format!("{name}_zeros"));
    zeros.set_initializer(&f32t.array_type(depths as u32).const_zero());
    zeros.set_constant(true);
    zeros.set_alignment(64);

    let intr = |n: &str| {
        Intrinsic::find(n)
            .and_then(|i| i.get_declaration(module, &[vt.into(), ptr.into()]))
            .ok_or_else(|| llvm(format!("no {n} for the vector type")))
    };
    let (mload, mstore) = (intr("llvm.masked.load")?, intr("llvm.masked.store")?);

    let bld = ctx.create_builder();
    let entry = ctx.append_basic_block(f, "entry");
    let header = ctx.append_basic_block(f, "k.header");
    let body = ctx.append_basic_block(f, "k.body");
    let tail = ctx.append_basic_block(f, "k.tail");
    let tail_body = ctx.append_basic_block(f, "k.tail.body");
    let exit = ctx.append_basic_block(f, "exit");
    let c_i64 = |v: usize| i64t.const_int(v as u64, false);
    let gep = |base: PointerValue<'static>, idx: IntValue<'static>, n: &str| {
        // SAFETY (of the IR, not of Rust): every address is inside a live source row's
        // `kc` elements, the zero vector, or the `kc · width` panel, as the ABI promises.
        unsafe { bld.build_in_bounds_gep(f32t, base, &[idx], n) }.map_err(llvm)
    };
    let splat = |x: IntValue<'static>| -> Result<VectorValue<'static>, CodegenError> {
        let lanes_t = i32t.vec_type(l as u32);
        let x32 = bld.build_int_truncate(x, i32t, "x32").map_err(llvm)?;
        let one =
            bld.build_insert_element(lanes_t.get_poison(), x32, i32t.const_zero(), "x1").map_err(llvm)?;
        bld.build_shuffle_vector(one, lanes_t.get_poison(), lanes_t.const_zero(), "xs").map_err(llvm)
    };
    let iota = |from: usize| {
        let v: Vec<_> = (0..l).map(|j| i32t.const_int((from + j) as u64, false)).collect();
        VectorType::const_vector(&v)
    };
    let align = i32t.const_int(4, false);
    let call = |fv, args: &[BasicMetadataValueEnum<'static>]| {
        bld.build_call(fv, args, "").map_err(llvm).map(|r| match r.try_as_basic_value() {
            inkwell::values::ValueKind::Basic(v) => Some(v),
            inkwell::values::ValueKind::Instruction(_) => None,
        })
    };

    // entry: each row's base and step (a row past `rows`, or a null address,
    // reads the zeros, step 0).
    bld.position_at_end(entry);
    let mut bases = Vec::with_capacity(width);
    for i in 0..width {
        let (live, row) = match how {
            Rows::Strided => {
                let (ld, rows) = (p(1)?.into_int_value(), p(2)?.into_int_value());
                let live = bld.build_int_compare(IntPredicate::ULT, c_i64(i), rows, "live").map_err(llvm)?;
                let off = bld.build_int_mul(c_i64(i), ld, "off").map_err(llvm)?;
                (live, gep(src, off, "row")?)
            }
            Rows::ByAddress => {
                // SAFETY (of the IR): the ABI passes `width` addresses.
                let at = unsafe { bld.build_in_bounds_gep(ptr, src, &[c_i64(i)], "at") }.map_err(llvm)?;
                let row = bld.build_load(ptr, at, "row").map_err(llvm)?.into_pointer_value();
                let live = bld.build_is_not_null(row, "live").map_err(llvm)?;
                (live, row)
            }
        };
        let base = bld.build_select(live, row, zeros.as_pointer_value(), "base").map_err(llvm)?;
        let step = bld.build_select(live, c_i64(1), c_i64(0), "step").map_err(llvm)?;
        bases.push((base.into_pointer_value(), step.into_int_value()));
    }
    let shift = c_i64(depths.trailing_zeros() as usize);
    let nfull = bld.build_right_shift(kc, shift, false, "nfull").map_err(llvm)?;
    // One block of a row's depths as `l` words: the f32 values themselves,
    // `2l` values rounded to bf16 (or as i16) and paired up (a bit cast: the
    // pairs are adjacent), or `4l` values as bytes in fours.
    let bt = ctx.bf16_type().vec_type(depths as u32);
    let first = |n: usize| {
        let m: Vec<_> = (0..n).map(|j| i32t.const_int(j as u64, false)).collect();
        VectorType::const_vector(&m)
    };
    // Two blocks of `l` depths side by side, and two such pairs.
    let (wide_mask, quad_mask) = (first(2 * l), first(4 * l));
    // Integral values as their low bits of `t` (one conversion, then a
    // truncation), the vector read back as words.
    let low_bits = |vals: VectorValue<'static>, t: inkwell::types::IntType<'static>| {
        let n = vals.get_type().get_size();
        let ints = bld.build_float_to_signed_int(vals, i32t.vec_type(n), "ints").map_err(llvm)?;
        let narrow = bld.build_int_truncate(ints, t.vec_type(n), "narrow").map_err(llvm)?;
        Ok::<_, CodegenError>(bld.build_bit_cast(narrow, vt, "words").map_err(llvm)?.into_vector_value())
    };
    let to_words = |parts: &[VectorValue<'static>]| -> Result<VectorValue<'static>, CodegenError> {
        match elem {
            ElemType::F32 => Ok(parts[0]),
            ElemType::Bf16 => {
                let wide = bld.build_shuffle_vector(parts[0], parts[1], wide_mask, "wide").map_err(llvm)?;
                let half = bld.build_float_trunc(wide, bt, "bf16").map_err(llvm)?;
                Ok(bld.build_bit_cast(half, vt, "words").map_err(llvm)?.into_vector_value())
            }
            ElemType::U8S8 => {
                // Four blocks of depths in order, each value's low byte (u8 or s8
                // alike: the values are integers in either byte's range).
                let lo = bld.build_shuffle_vector(parts[0], parts[1], wide_mask, "lo").map_err(llvm)?;
                let hi = bld.build_shuffle_vector(parts[2], parts[3], wide_mask, "hi").map_err(llvm)?;
                let all = bld.build_shuffle_vector(lo, hi, quad_mask, "all").map_err(llvm)?;
                low_bits(all, ctx.i8_type())
            }
            // i16s8's A words are i16's (its B, a weight, is packed by the
            // portable loop: no generated routine writes its byte pairs).
            ElemType::I16 | ElemType::I16S8 => {
                // Each integral value's low 16 bits, paired up as bf16's are.
                let wide = bld.build_shuffle_vector(parts[0], parts[1], wide_mask, "wide").map_err(llvm)?;
                low_bits(wide, ctx.i16_type())
            }
            ElemType::F16 => Err(crate::f16_on_cpu()),
        }
    };
    // Part `part` of a block's depths (`l` values) of a row: `part · l` further on,
    // unless the row is the zero vector (step 0).
    let part_ptr = |base, off: IntValue<'static>, part: usize, step: IntValue<'static>| {
        let po = bld.build_int_mul(c_i64(part * l), step, "po").map_err(llvm)?;
        gep(base, bld.build_int_add(off, po, "o").map_err(llvm)?, "ap")
    };
    // Where a block's words start in the panel: `k0 / g` words into every line.
    let panel_start = |k0: IntValue<'static>| -> Result<IntValue<'static>, CodegenError> {
        let w0 = bld.build_right_shift(k0, c_i64(g.trailing_zeros() as usize), false, "w0").map_err(llvm)?;
        bld.build_int_mul(w0, c_i64(width), "out0").map_err(llvm)
    };
    bld.build_unconditional_branch(header).map_err(llvm)?;

    // The full blocks of `W` depths.
    bld.position_at_end(header);
    let kb = bld.build_phi(i64t, "kb").map_err(llvm)?;
    let kbv = kb.as_basic_value().into_int_value();
    let more = bld.build_int_compare(IntPredicate::ULT, kbv, nfull, "more").map_err(llvm)?;
    bld.build_conditional_branch(more, body, tail).map_err(llvm)?;

    bld.position_at_end(body);
    let k0 = bld.build_left_shift(kbv, shift, "k0").map_err(llvm)?;
    let mut v = Vec::with_capacity(width);
    for (i, &(base, step)) in bases.iter().enumerate() {
        let off = bld.build_int_mul(k0, step, "koff").map_err(llvm)?;
        let mut parts = Vec::with_capacity(g);
        for part in 0..g {
            let load =
                bld.build_load(vt, part_ptr(base, off, part, step)?, &format!("r{i}")).map_err(llvm)?;
            set_align(&load, 4);
            parts.push(load.into_vector_value());
        }
        v.push(to_words(&parts)?);
    }
    let outs = transpose(ctx, &bld, &v, width, l)?;
    let out0 = panel_start(k0)?;
    for (o, vec) in outs.iter().enumerate() {
        let at = bld.build_int_add(out0, c_i64(o * l), "at").map_err(llvm)?;
        let st = bld.build_store(gep(dst, at, "dp")?, *vec).map_err(llvm)?;
        st.set_alignment(4).map_err(llvm)?;
    }
    let next = bld.build_int_add(kbv, c_i64(1), "kb.next").map_err(llvm)?;
    bld.build_unconditional_branch(header).map_err(llvm)?;
    kb.add_incoming(&[(&c_i64(0), entry), (&next, body)]);

    // The last, partial block: `kr < W` depths, loads and stores masked.
    bld.position_at_end(tail);
    let k0 = bld.build_left_shift(nfull, shift, "k0").map_err(llvm)?;
    let kr = bld.build_int_sub(kc, k0, "kr").map_err(llvm)?;
    let none = bld.build_int_compare(IntPredicate::EQ, kr, c_i64(0), "none").map_err(llvm)?;
    bld.build_conditional_branch(none, exit, tail_body).map_err(llvm)?;

    bld.position_at_end(tail_body);
    let mut in_masks = Vec::with_capacity(g);
    for part in 0..g {
        let m =
            bld.build_int_compare(IntPredicate::SLT, iota(part * l), splat(kr)?, "inmask").map_err(llvm)?;
        in_masks.push(m);
    }
    let mut v = Vec::with_capacity(width);
    for &(base, step) in &bases {
        let off = bld.build_int_mul(k0, step, "koff").map_err(llvm)?;
        let mut parts = Vec::with_capacity(g);
        for (part, mask) in in_masks.iter().enumerate() {
            let p = part_ptr(base, off, part, step)?;
            let args = [p.into(), align.into(), (*mask).into(), vt.const_zero().into()];
            let r = call(mload, &args)?.map(BasicValueEnum::into_vector_value);
            parts.push(r.ok_or_else(|| llvm("masked.load returned nothing"))?);
        }
        v.push(to_words(&parts)?);
    }
    let outs = transpose(ctx, &bld, &v, width, l)?;
    let out0 = panel_start(k0)?;
    // The words written: `⌈kr / g⌉` per line.
    let kw = bld.build_int_add(kr, c_i64(g - 1), "kr.up").map_err(llvm)?;
    let kw = bld.build_right_shift(kw, c_i64(g.trailing_zeros() as usize), false, "kw").map_err(llvm)?;
    let live = splat(bld.build_int_mul(kw, c_i64(width), "live").map_err(llvm)?)?;
    for (o, vec) in outs.iter().enumerate() {
        let at = bld.build_int_add(out0, c_i64(o * l), "at").map_err(llvm)?;
        let mask = bld.build_int_compare(IntPredicate::SLT, iota(o * l), live, "outmask").map_err(llvm)?;
        call(mstore, &[(*vec).into(), gep(dst, at, "dp")?.into(), align.into(), mask.into()])?;
    }
    bld.build_unconditional_branch(exit).map_err(llvm)?;

    bld.position_at_end(exit);
    bld.build_return(None).map_err(llvm)?;
    Ok(())
}

/// `v[i]` holds depths `0..W` of row `i`; the result's vector `o` holds panel
/// elements `o·W..(o+1)·W` of the `W × width` block (element `k·width + i`).
fn transpose(
    ctx: &'static Context,
    bld: &inkwell::builder::Builder<'static>,
    v: &[VectorValue<'static>],
    width: usize,
    l: usize,
) -> Result<Vec<VectorValue<'static>>, CodegenError> {
    let i32t = ctx.i32_type();
    let mask = |m: &[Option<usize>]| {
        let m: Vec<_> = m
            .iter()
            .map(|x| match x {
                Some(x) => i32t.const_int(*x as u64, false),
                None => i32t.get_poison(),
            })
            .collect();
        VectorType::const_vector(&m)
    };
    let shuffle = |a, b, m: &[Option<usize>]| bld.build_shuffle_vector(a, b, mask(m), "t").map_err(llvm);
    if width.is_multiple_of(l) {
        // W × W blocks by a butterfly: stage `d` swaps the off-diagonal `d × d`
        // sub-blocks of each pair of rows `r`, `r + d` (bit `d` of the row index
        // trades places with bit `d` of the column index).
        let groups = width / l;
        let mut outs = vec![v[0]; width];
        for g in 0..groups {
            let mut blk = v[g * l..(g + 1) * l].to_vec();
            let mut d = 1;
            while d < l {
                let lo: Vec<_> = (0..l).map(|c| Some(if c & d == 0 { c } else { l + c - d })).collect();
                let hi: Vec<_> = (0..l).map(|c| Some(if c & d == 0 { c + d } else { l + c })).collect();
                for r in (0..l).filter(|r| r & d == 0) {
                    let (a, b) = (blk[r], blk[r + d]);
                    blk[r] = shuffle(a, b, &lo)?;
                    blk[r + d] = shuffle(a, b, &hi)?;
                }
                d *= 2;
            }
            for (k, row) in blk.into_iter().enumerate() {
                outs[k * groups + g] = row;
            }
        }
        return Ok(outs);
    }
    // Otherwise gather each output vector from its rows, two sources at a time.
    let mut outs = Vec::with_capacity(width);
    for o in 0..width {
        let src: Vec<(usize, usize)> = (0..l).map(|j| ((o * l + j) % width, (o * l + j) / width)).collect();
        let mut rows: Vec<usize> = src.iter().map(|&(i, _)| i).collect();
        rows.dedup();
        rows.sort_unstable();
        rows.dedup();
        let pick = |row: usize, base: usize, keep: &dyn Fn(usize) -> bool| -> Vec<Option<usize>> {
            src.iter()
                .enumerate()
                .map(|(j, &(i, k))| {
                    if i == row {
                        Some(base + k)
                    } else if keep(j) {
                        Some(j)
                    } else {
                        None
                    }
                })
                .collect()
        };
        let first = rows[0];
        let mut acc = shuffle(v[first], v[first], &pick(first, 0, &|_| false))?;
        let mut done = vec![first];
        for &r in &rows[1..] {
            let m = pick(r, l, &|j| done.contains(&src[j].0));
            acc = shuffle(acc, v[r], &m)?;
            done.push(r);
        }
        outs.push(acc);
    }
    Ok(outs)
}
