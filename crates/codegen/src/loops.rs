//! Loop programs (`plan::LoopProgram`) to machine code: the memory-bound
//! kernels (element-wise, injective, stitch, window, gather, scan).
//!
//! Each program becomes one function of the `plan::LoopFn` ABI over a range
//! of rows (every loop variable but the innermost). Per row:
//! - everything that does not depend on the innermost variable is computed
//!   once, before the inner loop: a row reduction (LayerNorm's mean and
//!   variance, Softmax's max and sum) is a loop of its own there, vectorized
//!   along its last reduced axis with a horizontal step and a scalar tail, so
//!   a row is read from L1 by each pass (BladeDISC's stitch on a CPU);
//! - the innermost variable runs in vectors of the target's width: loads whose
//!   index is the variable plus a row-invariant offset are vector loads, loads
//!   that do not depend on it are scalar loads broadcast, anything else is a
//!   gather; guarded loads are masked (those `lower` found a border's range
//!   checks only in the vectors at the border); stores are contiguous; a scalar loop
//!   finishes the row's tail.
//!
//! `exp`, `tanh`, `erf` and `sigmoid` in f32 are the inline polynomials of
//! `vmath`; other transcendental functions call the C library per lane.

use std::collections::HashMap;

use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::intrinsics::Intrinsic;
use inkwell::module::Module;
use inkwell::types::{BasicTypeEnum, VectorType};
use inkwell::values::{
    BasicMetadataValueEnum, BasicValue, BasicValueEnum, FunctionValue, IntValue, PointerValue, VectorValue,
};
use inkwell::{AddressSpace, FloatPredicate, IntPredicate};
use ir::{BinaryOp, DType, UnaryOp};
use kernels::Target;
use plan::{Combine, Exprs, LoopFn, LoopProgram, Node, E};

use crate::{jit_module, llvm, target_attributes, vmath::VMath, CodegenError};

#[cfg(feature = "nvptx")]
pub(crate) mod device;
mod device_math;

type V = BasicValueEnum<'static>;

/// Vectors a vectorized reduction takes per step, each into its own accumulator.
const UNROLL: u64 = 4;
type R<T> = Result<T, CodegenError>;

/// Loop programs compiled together into one module: their entry points, and
/// their optimized IR and assembly (`--dump-llvm`).
pub struct CompiledPrograms {
    fns: Vec<LoopFn>,
    /// The split-reduction entries of the programs that have them.
    splits: Vec<Option<(plan::PartFn, plan::FinishFn)>>,
    /// Each module's optimized IR.
    ir: Vec<crate::OptimizedIr>,
    // Own the machine code the entries point into; only dropped.
    _images: Vec<kernels::CodeImage>,
}

impl CompiledPrograms {
    /// The entry of program `i` (in the order given to [`compile_programs`]).
    pub fn get(&self, i: usize) -> Option<LoopFn> {
        self.fns.get(i).copied()
    }
    /// The split-reduction entries of program `i`, when it has a
    /// `plan::SplitReduction`.
    pub fn split(&self, i: usize) -> Option<(plan::PartFn, plan::FinishFn)> {
        self.splits.get(i).copied().flatten()
    }
    pub fn len(&self) -> usize {
        self.fns.len()
    }
    /// The machine code the entries point into (valid while the images live).
    pub fn into_images(self) -> Vec<kernels::CodeImage> {
        self._images
    }
    pub fn is_empty(&self) -> bool {
        self.fns.is_empty()
    }
    /// The optimized IR of every module, one after the other.
    pub fn ir(&self) -> String {
        self.ir.iter().map(|m| m.text()).collect()
    }
    /// The assembly of every module (emitted again from the IR, on demand).
    pub fn asm(&self) -> String {
        self.ir.iter().map(|m| m.asm()).collect()
    }
}

/// Compile `programs` for `t`: split into modules compiled on `threads` threads
/// at once (LLVM's optimization and instruction selection dominate, and each
/// module has a context of its own).
pub fn compile_programs(
    t: &Target,
    programs: &[LoopProgram],
    module_name: &str,
    threads: usize,
) -> R<CompiledPrograms> {
    compile_programs_with(t, programs, module_name, threads, &crate::ObjectCache::none(), &|_| {})
}

/// [`compile_programs`] through `cache`, reporting each module compiled to
/// `progress`.
pub fn compile_programs_with(
    t: &Target,
    programs: &[LoopProgram],
    module_name: &str,
    threads: usize,
    cache: &crate::ObjectCache,
    progress: crate::ProgressFn,
) -> R<CompiledPrograms> {
    if !t.supported() {
        return Err(CodegenError::Unsupported("kernels need x86-64 with AVX2 and FMA".into()));
    }
    inkwell::targets::Target::initialize_native(&inkwell::targets::InitializationConfig::default())
        .map_err(CodegenError::Llvm)?;
    let parts = threads.clamp(1, programs.len().max(1));
    let per = programs.len().div_ceil(parts).max(1);
    let chunks: Vec<(usize, &[LoopProgram])> =
        programs.chunks(per).enumerate().map(|(i, c)| (i * per, c)).collect();
    progress(crate::Progress::Add(chunks.len()));
    let results: Vec<R<Chunk>> = std::thread::scope(|s| {
        let handles: Vec<_> = chunks
            .iter()
            .map(|(first, chunk)| {
                s.spawn(move || {
                    let r = compile_chunk(t, chunk, module_name, *first, cache);
                    progress(crate::Progress::Done);
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(llvm("a compiling thread panicked"))))
            .collect()
    });
    let mut out =
        CompiledPrograms { fns: Vec::new(), splits: Vec::new(), ir: Vec::new(), _images: Vec::new() };
    for r in results {
        let (fns, splits, ir, image) = r?;
        out.fns.extend(fns);
        out.splits.extend(splits);
        out.ir.push(ir);
        out._images.push(image);
    }
    Ok(out)
}

/// A compiled module: its programs' entries, IR and code.
type Chunk =
    (Vec<LoopFn>, Vec<Option<(plan::PartFn, plan::FinishFn)>>, crate::OptimizedIr, kernels::CodeImage);

/// One module of programs `first..first + programs.len()`.
fn compile_chunk(
    t: &Target,
    programs: &[LoopProgram],
    module_name: &str,
    first: usize,
    cache: &crate::ObjectCache,
) -> R<Chunk> {
    let names: Vec<String> = (0..programs.len()).map(|i| format!("{module_name}_p{}", first + i)).collect();
    let lanes = t.f32_lanes;
    let (image, ir) =
        jit_module(t, &format!("{module_name}_{first}"), cache, |ctx, module, cpu, features| {
            for (p, name) in programs.iter().zip(&names) {
                build_program(ctx, module, name, p, lanes, cpu, features)?;
            }
            Ok(())
        })?;
    // SAFETY (for the entries below): `build_program` generated each `name` with
    // the `LoopFn` signature, and `build_split` its `_part` and `_finish` with the
    // `PartFn` and `FinishFn` signatures; the image that holds them is returned
    // with them.
    let mut fns = Vec::with_capacity(programs.len());
    for name in &names {
        fns.push(unsafe { image.entry::<LoopFn>(name) }.map_err(|e| llvm(e.to_string()))?);
    }
    let mut splits = Vec::with_capacity(programs.len());
    for (p, name) in programs.iter().zip(&names) {
        splits.push(match p.schedules.split {
            Some(_) => {
                let part = unsafe { image.entry::<plan::PartFn>(&format!("{name}_part")) };
                let finish = unsafe { image.entry::<plan::FinishFn>(&format!("{name}_finish")) };
                Some((part.map_err(|e| llvm(e.to_string()))?, finish.map_err(|e| llvm(e.to_string()))?))
            }
            None => None,
        });
    }
    Ok((fns, splits, ir, image))
}

/// Begin function `name` of program `p`: `(bufs, dims, extra...) -> i64`,
/// positioned in its entry block with the buffers, the dims the program reads
/// and every buffer's strides loaded, and the error status cleared.
#[allow(clippy::too_many_arguments)]
fn start<'a>(
    ctx: &'static Context,
    module: &'a Module<'static>,
    bld: &'a Builder<'static>,
    name: &str,
    p: &'a LoopProgram,
    extra: &[inkwell::types::BasicMetadataTypeEnum<'static>],
    lanes: usize,
    cpu: &str,
    features: &'a str,
) -> R<(FunctionValue<'static>, Gen<'a>)> {
    let (i64t, ptr) = (ctx.i64_type(), ctx.ptr_type(AddressSpace::default()));
    let mut params: Vec<inkwell::types::BasicMetadataTypeEnum> = vec![ptr.into(), ptr.into()];
    params.extend_from_slice(extra);
    let f = module.add_function(name, i64t.fn_type(&params, false), None);
    target_attributes(ctx, f, cpu, features, lanes);
    let entry = ctx.append_basic_block(f, "entry");
    bld.position_at_end(entry);
    let param = |i: u32| f.get_nth_param(i).ok_or_else(|| llvm("param"));
    let (bufs, dims) = (param(0)?.into_pointer_value(), param(1)?.into_pointer_value());
    let g = Gen::new(ctx, module, bld, p, (bufs, dims), lanes, features, false)?;
    Ok((f, g))
}

/// The entries of a program with a split reduction (`plan::PartFn`,
/// `plan::FinishFn`): one point's partial over a range of the split variable,
/// and the point's stores from the combined partials.
#[allow(clippy::too_many_arguments)]
fn build_split(
    ctx: &'static Context,
    module: &Module<'static>,
    name: &str,
    p: &LoopProgram,
    sr: plan::SplitReduction,
    lanes: usize,
    cpu: &str,
    features: &str,
) -> R<()> {
    let (i64t, ptr) = (ctx.i64_type(), ctx.ptr_type(AddressSpace::default()));
    let inner_var = p.inner_var();
    let dt = p.exprs.dtype(sr.reduce);
    // The partial: the reduction with its last variable over `lo..hi`.
    {
        let bld = ctx.create_builder();
        let extra = [i64t.into(), i64t.into(), i64t.into(), ptr.into()];
        let (f, mut g) = start(ctx, module, &bld, &format!("{name}_part"), p, &extra, lanes, cpu, features)?;
        let param = |i: u32| f.get_nth_param(i).ok_or_else(|| llvm("param"));
        let (point, lo, hi) =
            (param(2)?.into_int_value(), param(3)?.into_int_value(), param(4)?.into_int_value());
        let out = param(5)?.into_pointer_value();
        if let Some(v) = inner_var {
            g.vars.insert(v, point);
        }
        g.reduce_range = Some((sr.var, lo, hi));
        let v = g.emit(sr.reduce, false)?;
        bld.build_store(out, v).map_err(llvm)?;
        let st = bld.build_load(i64t, g.status, "st").map_err(llvm)?;
        bld.build_return(Some(&st)).map_err(llvm)?;
    }
    // The finish: the partials combined, then the point's stores.
    let bld = ctx.create_builder();
    let extra = [i64t.into(), ptr.into(), i64t.into()];
    let (f, mut g) = start(ctx, module, &bld, &format!("{name}_finish"), p, &extra, lanes, cpu, features)?;
    let param = |i: u32| f.get_nth_param(i).ok_or_else(|| llvm("param"));
    let (point, parts, n) =
        (param(2)?.into_int_value(), param(3)?.into_pointer_value(), param(4)?.into_int_value());
    let Node::Reduce { combine, .. } = p.exprs.node(sr.reduce).clone() else {
        return Err(llvm("a split reduction that is not a reduction"));
    };
    let init = g.identity(combine, dt)?;
    let ty = g.lty(dt, false);
    let (_, acc) = g.for_loop(i64t.const_zero(), n, 1, vec![init], &mut |g, i, acc| {
        // SAFETY (of the IR): `parts` holds `n` 8-byte slots (the ABI).
        let at = unsafe { g.bld.build_in_bounds_gep(i64t, parts, &[i], "part") }.map_err(llvm)?;
        let x = g.bld.build_load(ty, at, "partial").map_err(llvm)?;
        Ok(vec![g.combine(combine, acc[0], x, dt)?])
    })?;
    if let Some(v) = inner_var {
        g.vars.insert(v, point);
    }
    g.bind(sr.reduce, None, acc[0]);
    g.stores(p, point, false)?;
    let st = bld.build_load(i64t, g.status, "st").map_err(llvm)?;
    bld.build_return(Some(&st)).map_err(llvm)?;
    Ok(())
}

/// The quantization that cast `e` completes ([`plan::Exprs::stored_integer`]:
/// `f32(clamp(i32(f) + offset, lo, hi))` of an f32 `f`), where `e`'s type
/// holds every integer of `lo..=hi`.
fn quantized(x: &plan::Exprs, e: E) -> Option<(E, i32, i32, i32)> {
    let (f, offset, lo, hi) = x.stored_integer(e)?;
    let holds = match x.dtype(e) {
        DType::F32 | DType::I32 => true,
        DType::U8 => 0 <= lo && hi <= 255,
        DType::I8 => -128 <= lo && hi <= 127,
        _ => false,
    };
    holds.then_some((f, offset, lo, hi))
}

/// Whether `p` rounds floats to integers (a quantization: `round`, or a cast
/// from a float to an integer type), where a quotient one ulp off the
/// division's moves a value across a rounding boundary: its divisions stay
/// divisions in every lane (the interpreter's values, exactly).
fn rounds_to_integers(p: &LoopProgram) -> bool {
    let x = &p.exprs;
    (0..x.len()).any(|i| match *x.node(E(i as u32)) {
        Node::Unary(UnaryOp::Round, _) => true,
        Node::Cast(a) => x.dtype(a).is_float() && !x.dtype(E(i as u32)).is_float(),
        _ => false,
    })
}

/// The fewest points of a row's tail that run as one masked vector (fewer go
/// a point at a time: a vector's gathers and reductions cost every lane).
const MASKED_TAIL_MIN: u64 = 4;

/// Whether a row's tail may run as one vector with its lanes past the row
/// masked off (rather than a point at a time): every lane computes then, so no
/// integer division may take a divisor that a masked-off lane could make zero
/// (one that depends on a loop variable or on a load).
fn masked_tail(p: &LoopProgram) -> bool {
    let x = &p.exprs;
    let invariant = |e: E| {
        let mut todo = vec![e];
        while let Some(e) = todo.pop() {
            match x.node(e) {
                Node::Var(_) | Node::Load { .. } | Node::Reduce { .. } => return false,
                n => todo.extend(n.children()),
            }
        }
        true
    };
    (0..x.len()).all(|i| match x.node(E(i as u32)) {
        Node::Binary(BinaryOp::Div | BinaryOp::Mod, _, c) if !x.dtype(*c).is_float() => invariant(*c),
        _ => true,
    })
}

fn build_program(
    ctx: &'static Context,
    module: &Module<'static>,
    name: &str,
    p: &LoopProgram,
    lanes: usize,
    cpu: &str,
    features: &str,
) -> R<()> {
    if let Some(sr) = p.schedules.split {
        build_split(ctx, module, name, p, sr, lanes, cpu, features)?;
    }
    let i64t = ctx.i64_type();
    let bld = ctx.create_builder();
    let extra = [i64t.into(), i64t.into()];
    let (f, mut g) = start(ctx, module, &bld, name, p, &extra, lanes, cpu, features)?;
    let param = |i: u32| f.get_nth_param(i).ok_or_else(|| llvm("param"));
    let (begin, end) = (param(2)?.into_int_value(), param(3)?.into_int_value());
    let status = g.status;
    // With an interleave, the lanes' variable is the row's first (the unrolled
    // last one's few values are computed per vector): see `interleaved_row`.
    let interleave = p.schedules.interleaved.zip(p.inner_var());
    let scatter = p.schedules.scattered;
    let inner = match scatter {
        Some(sc) => Some(sc.at as usize),
        None => p.row_from(),
    };
    let inner_ext = match inner {
        Some(i) => g.emit(p.space[i], false)?.into_int_value(),
        None => i64t.const_int(1, false),
    };
    // A row's points: its first variable's extent times those after it (with
    // an interleave, the unrolled variable's values).
    let mut row_len = inner_ext;
    if let (Some(at), Some(_)) = (inner, interleave) {
        for e in &p.space[at + 1..] {
            let e = g.emit(*e, false)?.into_int_value();
            row_len = bld.build_int_mul(row_len, e, "row.len").map_err(llvm)?;
        }
    }
    // With a scatter the rows are every variable but the lanes', and a row's
    // first point is where its variables put it (`scatter_strides`).
    let outer = match scatter {
        Some(sc) => looping_vars_from(p, 0).into_iter().filter(|(v, _)| *v != sc.lanes).collect(),
        None => looping_vars(p, inner.unwrap_or(p.vars.len())),
    };
    let scatter_strides = match scatter {
        Some(sc) => Some(scatter_strides(&mut g, p, sc, &outer)?),
        None => None,
    };
    let inner_var = p.inner_var();
    // The variables a row runs through.
    let row_vars = match (scatter, inner) {
        (Some(sc), _) => 1u64 << sc.lanes,
        (None, Some(at)) => p.vars[at..].iter().fold(0u64, |m, v| match p.exprs.node(*v) {
            Node::Var(v) => m | 1u64 << v,
            _ => m,
        }),
        (None, None) => 0,
    };
    let values: Vec<E> = p.stores.iter().map(|s| s.value).collect();
    let scratch = if lanes > 1 { p.schedules.row_scratch } else { None };
    // The nest, once per version (see `lower::versions`): each version's guards
    // are constants there, so its loads' addresses fold to plain indices.
    // Threads split rows, or, for a one-loop nest, the loop's range.
    let (zero, one) = (i64t.const_zero(), i64t.const_int(1, false));
    let ((row_lo, row_hi), (in_lo, in_hi)) = if p.schedules.splits_inner {
        ((zero, one), (begin, end))
    } else {
        ((begin, end), (zero, inner_ext))
    };
    let row_reduction = if lanes > 1 { p.schedules.row_reduction } else { None };
    let nest = |g: &mut Gen| -> R<()> {
        // The outer variables of the first row, from its index (divisions once per
        // call); each row then steps them like an odometer (an add and a compare per
        // variable), so a short row does not pay a division per outer variable.
        let mut first = vec![i64t.const_zero(); outer.len()];
        let mut rest = row_lo;
        for (k, (_, ext)) in outer.iter().enumerate().rev() {
            if k == 0 {
                first[k] = rest;
            } else {
                let e = g.emit(*ext, false)?.into_int_value();
                let e = g.safe_divisor(e)?;
                first[k] = g.bld.build_int_signed_rem(rest, e, "o").map_err(llvm)?;
                rest = g.bld.build_int_signed_div(rest, e, "r").map_err(llvm)?;
            }
        }
        let exts: Vec<IntValue<'static>> =
            outer.iter().map(|(_, ext)| Ok(g.emit(*ext, false)?.into_int_value())).collect::<R<_>>()?;
        let first: Vec<V> = first.into_iter().map(V::from).collect();
        // What depends on no loop variable at all (a reduction of the whole
        // input: a dynamic quantization's range) once per call, before the
        // rows, rather than once per row. The call has a row (checked below),
        // so this computes nothing the rows would not have. Not with a row
        // scratch: a row's reductions fill it as they are computed.
        if scratch.is_none() {
            let loop_vars = outer.iter().fold(row_vars, |m, (v, _)| m | 1u64 << v);
            g.hoist(&values, loop_vars, false)?;
        }
        // The rows with the lanes `lane_range` of a scattered nest (else its
        // inner range, unused).
        let rows = |g: &mut Gen, lane_range: (IntValue<'static>, IntValue<'static>)| -> R<()> {
            g.for_loop(row_lo, row_hi, 1, first.clone(), &mut |g, r, at_row| {
                for ((v, _), val) in outer.iter().zip(&at_row) {
                    g.vars.insert(*v, val.into_int_value());
                }
                let mask = row_vars;
                let base = match &scatter_strides {
                    Some((strides, _)) => {
                        at_row.iter().zip(strides).try_fold(i64t.const_zero(), |b, (v, s)| {
                            let t = g.bld.build_int_mul(v.into_int_value(), *s, "sc.row").map_err(llvm)?;
                            g.bld.build_int_add(b, t, "sc.base").map_err(llvm)
                        })?
                    }
                    None => g.bld.build_int_mul(r, row_len, "row").map_err(llvm)?,
                };
                g.scratch = scratch.map(|s| (s.body, s.param, base));
                let hoisted = g.hoist(&values, mask, false);
                g.scratch = None;
                hoisted?;
                let row = |g: &mut Gen| -> R<()> {
                    if let Some((il, last)) = interleave {
                        return interleaved_row(g, p, (il, last), base, inner_ext);
                    }
                    if let (Some(sc), Some((_, block))) = (scatter, &scatter_strides) {
                        return scattered_row(g, p, sc, base, (lane_range.0, lane_range.1, *block));
                    }
                    match inner_var {
                        Some(v) => {
                            // One point at a time (a point's reductions along the lanes).
                            let points = |g: &mut Gen, from: IntValue<'static>| -> R<()> {
                                g.for_loop(from, in_hi, 1, vec![], &mut |g, iv, _| {
                                    g.vars.insert(v, iv);
                                    let at = g.bld.build_int_add(base, iv, "at").map_err(llvm)?;
                                    if let Some(s) = scratch {
                                        let term = g.load_at(s.param, at, false)?;
                                        g.bind(s.twin, None, term);
                                    }
                                    g.stores(p, at, false).map(|_| vec![])
                                })
                                .map(|_| ())
                            };
                            // Points across the lanes, then the row's tail: one vector
                            // with the lanes past the row masked off, or a scalar loop.
                            let lanes = |g: &mut Gen| -> R<()> {
                                let (done, _) =
                                    g.for_loop(in_lo, in_hi, g.w as u64, vec![], &mut |g, iv, _| {
                                        g.vars.insert(v, iv);
                                        g.lane = Some(v);
                                        let at = g.bld.build_int_add(base, iv, "at").map_err(llvm)?;
                                        if let Some(s) = scratch {
                                            let term = g.load_at(s.param, at, true)?;
                                            g.bind(s.twin, Some(v), term);
                                        }
                                        let r = g.stores(p, at, true);
                                        g.lane = None;
                                        r.map(|_| vec![])
                                    })?;
                                let one = p.inner().is_some_and(|i| p.exprs.as_int(p.space[i]) == Some(1));
                                if scratch.is_some() || g.w == 1 || g.device || one || !masked_tail(p) {
                                    return points(g, done);
                                }
                                // A tail of a few points goes a point at a time.
                                let left = g.bld.build_int_sub(in_hi, done, "left").map_err(llvm)?;
                                let few = i64t.const_int(MASKED_TAIL_MIN, false);
                                let masked = g
                                    .bld
                                    .build_int_compare(IntPredicate::SGE, left, few, "masked")
                                    .map_err(llvm)?;
                                g.if_else(
                                    masked,
                                    &mut |g| {
                                        g.vars.insert(v, done);
                                        g.lane = Some(v);
                                        let iota: Vec<IntValue> =
                                            (0..g.w).map(|i| i64t.const_int(i as u64, false)).collect();
                                        let first = g.splat(done.into())?.into_vector_value();
                                        let lanes = g
                                            .bld
                                            .build_int_add(first, VectorType::const_vector(&iota), "lane")
                                            .map_err(llvm)?;
                                        let hi = g.splat(in_hi.into())?.into_vector_value();
                                        let inside = g
                                            .bld
                                            .build_int_compare(IntPredicate::SLT, lanes, hi, "inside")
                                            .map_err(llvm)?;
                                        g.tail = Some(inside);
                                        let at = g.bld.build_int_add(base, done, "at").map_err(llvm)?;
                                        let r = g.stores(p, at, true);
                                        g.tail = None;
                                        g.lane = None;
                                        r
                                    },
                                    &mut |g| points(g, done),
                                )
                            };
                            match row_reduction {
                                _ if p.schedules.points_one_at_a_time.is_some() => points(g, in_lo)?,
                                // The schedule by the reduction's length: long rows one
                                // point at a time, short ones across the lanes.
                                Some(ext) => {
                                    let len = g.emit(ext, false)?.into_int_value();
                                    let w = i64t.const_int(g.w as u64, false);
                                    let long = g
                                        .bld
                                        .build_int_compare(IntPredicate::SGE, len, w, "long")
                                        .map_err(llvm)?;
                                    g.if_else(long, &mut |g| points(g, in_lo), &mut |g| lanes(g))?;
                                }
                                None => lanes(g)?,
                            }
                        }
                        None => g.stores(p, base, false)?,
                    }
                    Ok(())
                };
                // A stored value chosen by conditions the same for the whole row (a
                // concat along an outer axis: a conv's taps) is chosen once per row.
                if scratch.is_none() && p.schedules.unswitched.is_some() {
                    unswitch(g, p, mask, 0, &row)?;
                } else {
                    row(g)?;
                }
                // The next row's variables: the innermost steps, a wrap carries outward.
                let (one, zero) = (i64t.const_int(1, false), i64t.const_zero());
                let mut next: Vec<V> = at_row.clone();
                let mut carry = one;
                for k in (0..outer.len()).rev() {
                    let b = g.bld;
                    let v = b.build_int_add(at_row[k].into_int_value(), carry, "step").map_err(llvm)?;
                    if k == 0 {
                        next[k] = v.into();
                    } else {
                        let wrap =
                            b.build_int_compare(IntPredicate::SGE, v, exts[k], "wrap").map_err(llvm)?;
                        next[k] = b.build_select(wrap, zero, v, "odo").map_err(llvm)?;
                        carry = b.build_int_z_extend(wrap, i64t, "carry").map_err(llvm)?;
                    }
                }
                Ok(next)
            })?;
            Ok(())
        };
        match scatter {
            // A few vectors of lanes at a time over all of the thread's rows:
            // the rows in turn store next to what the one before stored in each
            // of the chunk's planes, whose lines stay in L1 meanwhile (a row
            // with all of its lanes touches a line of every plane).
            Some(_) if g.w > 1 => {
                let chunk = i64t.const_int(SCATTER_CHUNK * g.w as u64, false);
                let b = g.bld;
                let last = b
                    .build_int_add(inner_ext, i64t.const_int(SCATTER_CHUNK * g.w as u64 - 1, false), "")
                    .map_err(llvm)?;
                let chunks = b.build_int_signed_div(last, chunk, "chunks").map_err(llvm)?;
                g.for_loop(zero, chunks, 1, vec![], &mut |g, c, _| {
                    let b = g.bld;
                    let lo = b.build_int_mul(c, chunk, "chunk.lo").map_err(llvm)?;
                    let hi = b.build_int_add(lo, chunk, "chunk.hi").map_err(llvm)?;
                    let short = b.build_int_compare(IntPredicate::SLT, inner_ext, hi, "").map_err(llvm)?;
                    let hi = b.build_select(short, inner_ext, hi, "").map_err(llvm)?.into_int_value();
                    rows(g, (lo, hi)).map(|_| vec![])
                })?;
                Ok(())
            }
            _ => rows(g, (zero, inner_ext)),
        }
    };
    // A call without rows returns at once: the nest computes what no row
    // depends on before its rows.
    let (work, empty) = (ctx.append_basic_block(f, "rows"), ctx.append_basic_block(f, "no.rows"));
    let any = bld.build_int_compare(IntPredicate::SLT, row_lo, row_hi, "any.rows").map_err(llvm)?;
    bld.build_conditional_branch(any, work, empty).map_err(llvm)?;
    bld.position_at_end(empty);
    let st = bld.build_load(i64t, status, "st").map_err(llvm)?;
    bld.build_return(Some(&st)).map_err(llvm)?;
    bld.position_at_end(work);
    in_versions(&mut g, f, &p.schedules.guards, &mut |g| nest(g))?;
    let st = bld.build_load(i64t, status, "st").map_err(llvm)?;
    bld.build_return(Some(&st)).map_err(llvm)?;
    Ok(())
}

/// One row of an interleaved nest ([`plan::Interleave`]) from position
/// `base`: the lanes along `il.lanes` (`ext` points), and at each vector the
/// unrolled last variable's values in turn (a scope each), stored as one
/// contiguous vector of `unrolled` lanes a point; the row's tail as one masked
/// vector where the program allows it, else a point at a time.
fn interleaved_row(
    g: &mut Gen,
    p: &LoopProgram,
    (il, last): (plan::Interleave, u32),
    base: IntValue<'static>,
    ext: IntValue<'static>,
) -> R<()> {
    let i64t = g.ctx.i64_type();
    let c = il.unrolled as u64;
    // One point: its `c` values stored one after the other.
    let points = |g: &mut Gen, from: IntValue<'static>| -> R<()> {
        g.for_loop(from, ext, 1, vec![], &mut |g, iv, _| {
            g.vars.insert(il.lanes, iv);
            let at = g.bld.build_int_mul(iv, i64t.const_int(c, false), "il.pt").map_err(llvm)?;
            let at = g.bld.build_int_add(base, at, "il.at").map_err(llvm)?;
            for k in 0..c {
                g.scopes.push(HashMap::new());
                g.vars.insert(last, i64t.const_int(k, false));
                let at = g.bld.build_int_add(at, i64t.const_int(k, false), "il.k").map_err(llvm)?;
                let r = g.stores(p, at, false);
                g.scopes.pop();
                r?;
            }
            Ok(vec![])
        })
        .map(|_| ())
    };
    let vectors = |g: &mut Gen, iv: IntValue<'static>| -> R<()> {
        g.vars.insert(il.lanes, iv);
        g.lane = Some(il.lanes);
        let r = interleaved_store(g, p, (c, last), base, iv);
        g.lane = None;
        r
    };
    lanes_then_tail(g, p, (i64t.const_zero(), ext), &vectors, &points)
}

/// The vectors of lanes a scattered nest takes over all of its rows at a time.
const SCATTER_CHUNK: u64 = 4;

/// The points `from..ext` of a row along an outer variable: `vectors` from
/// `from` on, a vector at a time, then the tail as one masked vector where
/// the program allows it and at least [`MASKED_TAIL_MIN`] points are left,
/// else `points` one at a time (all of them with one lane); `points(g, i)`
/// goes from `i` to `ext`.
fn lanes_then_tail(
    g: &mut Gen,
    p: &LoopProgram,
    (from, ext): (IntValue<'static>, IntValue<'static>),
    vectors: &dyn Fn(&mut Gen, IntValue<'static>) -> R<()>,
    points: &dyn Fn(&mut Gen, IntValue<'static>) -> R<()>,
) -> R<()> {
    let i64t = g.ctx.i64_type();
    if g.w == 1 {
        return points(g, from);
    }
    let (done, _) =
        g.for_loop(from, ext, g.w as u64, vec![], &mut |g, iv, _| vectors(g, iv).map(|_| vec![]))?;
    if !masked_tail(p) {
        return points(g, done);
    }
    let left = g.bld.build_int_sub(ext, done, "left").map_err(llvm)?;
    let few = i64t.const_int(MASKED_TAIL_MIN, false);
    let masked = g.bld.build_int_compare(IntPredicate::SGE, left, few, "masked").map_err(llvm)?;
    g.if_else(
        masked,
        &mut |g| {
            let iota: Vec<IntValue> = (0..g.w).map(|i| i64t.const_int(i as u64, false)).collect();
            let first = g.splat(done.into())?.into_vector_value();
            let lanes = g.bld.build_int_add(first, VectorType::const_vector(&iota), "lane").map_err(llvm)?;
            let hi = g.splat(ext.into())?.into_vector_value();
            let inside = g.bld.build_int_compare(IntPredicate::SLT, lanes, hi, "inside").map_err(llvm)?;
            g.tail = Some(inside);
            let r = vectors(g, done);
            g.tail = None;
            r
        },
        &mut |g| points(g, done),
    )
}

/// The stores of the vector of points from `iv` (lanes along the interleave's
/// variable): each stored value computed for the last variable's `c` values in
/// turn, interleaved (point by point, its `c` values together) and stored at
/// `base + iv·c`, masked by the row's tail where there is one.
fn interleaved_store(
    g: &mut Gen,
    p: &LoopProgram,
    (c, last): (u64, u32),
    base: IntValue<'static>,
    iv: IntValue<'static>,
) -> R<()> {
    let (i64t, i32t) = (g.ctx.i64_type(), g.ctx.i32_type());
    let w = g.w as u64;
    let mut values: Vec<Vec<VectorValue<'static>>> = vec![Vec::new(); p.stores.len()];
    for k in 0..c {
        g.scopes.push(HashMap::new());
        g.vars.insert(last, i64t.const_int(k, false));
        let r = p.stores.iter().zip(&mut values).try_for_each(|(st, vs)| -> R<()> {
            let dt = p.params[st.param as usize].dtype;
            let v = g.emit_as(st.value, true)?;
            let v = if dt == DType::Bool { g.zext(v, g.mty(dt, true))? } else { v };
            vs.push(v.into_vector_value());
            Ok(())
        });
        g.scopes.pop();
        r?;
    }
    // Lane `j` of the stored vector is point `j / c`'s value `j % c`: lane `j / c`
    // of vector `j % c` among the `c` vectors side by side (padded with poison to
    // a power of two, as a shuffle takes two vectors of one type).
    let order: Vec<IntValue> = (0..c * w).map(|j| i32t.const_int((j % c) * w + j / c, false)).collect();
    let order = VectorType::const_vector(&order);
    let at = g.bld.build_int_mul(iv, i64t.const_int(c, false), "il.v").map_err(llvm)?;
    let at = g.bld.build_int_add(base, at, "il.at").map_err(llvm)?;
    for (st, mut vs) in p.stores.iter().zip(values) {
        let dt = p.params[st.param as usize].dtype;
        while vs.len() > 1 {
            if vs.len() % 2 == 1 {
                vs.push(poison(vs[0].get_type().into()));
            }
            vs = vs
                .chunks(2)
                .map(|pair| {
                    let n = pair[0].get_type().get_size() as u64;
                    let both: Vec<IntValue> = (0..2 * n).map(|j| i32t.const_int(j, false)).collect();
                    g.bld.build_shuffle_vector(pair[0], pair[1], VectorType::const_vector(&both), "il.cat")
                })
                .collect::<Result<_, _>>()
                .map_err(llvm)?;
        }
        let all = vs[0];
        let stored = g
            .bld
            .build_shuffle_vector(all, poison(all.get_type().into()), order, "il.lanes")
            .map_err(llvm)?;
        let mt = g.mty(dt, false);
        // SAFETY (of the IR): the row's points from `iv` (those below its end,
        // the tail masked) hold positions `base + iv·c ..` inside the buffer.
        let ptr = unsafe { g.bld.build_gep(mt, g.bufs[st.param as usize], &[at], "il.st") }.map_err(llvm)?;
        match g.tail {
            Some(inside) => {
                let spread: Vec<IntValue> = (0..c * w).map(|j| i32t.const_int(j / c, false)).collect();
                let mask = g
                    .bld
                    .build_shuffle_vector(
                        inside,
                        poison(inside.get_type().into()),
                        VectorType::const_vector(&spread),
                        "il.mask",
                    )
                    .map_err(llvm)?;
                let f = g.intrinsic("llvm.masked.store", &[stored.get_type().into(), g.ptr_type()])?;
                let align = i32t.const_int(dt_bytes(dt), false);
                g.call_void(f, &[stored.into(), ptr.into(), align.into(), mask.into()])?;
            }
            None => {
                let s = g.bld.build_store(ptr, stored).map_err(llvm)?;
                s.set_alignment(dt.size() as u32).map_err(llvm)?;
            }
        }
    }
    Ok(())
}

/// Where each of a scattered nest's row variables (`outer`, every looping
/// variable but the lanes') moves a row's first point, and the lanes' own
/// step (the block of points after it): each variable steps by the extents
/// after it in the nest.
fn scatter_strides(
    g: &mut Gen,
    p: &LoopProgram,
    sc: plan::Scatter,
    outer: &[(u32, E)],
) -> R<(Vec<IntValue<'static>>, IntValue<'static>)> {
    let i64t = g.ctx.i64_type();
    // The points after each position of the nest, innermost first.
    let mut after = vec![i64t.const_int(1, false); p.vars.len() + 1];
    for i in (0..p.vars.len()).rev() {
        let e = g.emit(p.space[i], false)?.into_int_value();
        after[i] = g.bld.build_int_mul(after[i + 1], e, "sc.after").map_err(llvm)?;
    }
    let position = |v: u32| p.vars.iter().position(|e| matches!(p.exprs.node(*e), Node::Var(w) if *w == v));
    let strides = outer
        .iter()
        .map(|(v, _)| {
            position(*v).map(|i| after[i + 1]).ok_or_else(|| llvm(format!("i{v} is not in the nest")))
        })
        .collect::<R<Vec<_>>>()?;
    Ok((strides, after[sc.at as usize + 1]))
}

/// One row of a scattered nest ([`plan::Scatter`]) from position `base`: the
/// lanes along `sc.lanes` from `lo` to `ext`, each vector's values stored
/// `block` apart; the tail masked where the program allows it, else a point
/// at a time.
fn scattered_row(
    g: &mut Gen,
    p: &LoopProgram,
    sc: plan::Scatter,
    base: IntValue<'static>,
    (lo, ext, block): (IntValue<'static>, IntValue<'static>, IntValue<'static>),
) -> R<()> {
    let first = |g: &mut Gen, iv: IntValue<'static>| -> R<IntValue<'static>> {
        let off = g.bld.build_int_mul(iv, block, "sc.lane0").map_err(llvm)?;
        g.bld.build_int_add(base, off, "sc.first").map_err(llvm)
    };
    let points = |g: &mut Gen, from: IntValue<'static>| -> R<()> {
        g.for_loop(from, ext, 1, vec![], &mut |g, iv, _| {
            g.vars.insert(sc.lanes, iv);
            let at = first(g, iv)?;
            g.stores(p, at, false).map(|_| vec![])
        })
        .map(|_| ())
    };
    let vectors = |g: &mut Gen, iv: IntValue<'static>| -> R<()> {
        g.vars.insert(sc.lanes, iv);
        g.lane = Some(sc.lanes);
        let r = first(g, iv).and_then(|at| g.scattered_stores(p, at, block));
        g.lane = None;
        r
    };
    lanes_then_tail(g, p, (lo, ext), &vectors, &points)
}

/// The looping variables of the nest from position `from` on, with their
/// extents, outermost first.
fn looping_vars_from(p: &LoopProgram, from: usize) -> Vec<(u32, E)> {
    (from..p.vars.len())
        .filter_map(|i| match p.exprs.node(p.vars[i]) {
            Node::Var(v) => Some((*v, p.space[i])),
            _ => None,
        })
        .collect()
}

/// The variables among the nest's first `upto` that loop (not constants of
/// extent 1), with their extents, outermost first.
pub(crate) fn looping_vars(p: &LoopProgram, upto: usize) -> Vec<(u32, E)> {
    p.vars[..upto]
        .iter()
        .zip(&p.space)
        .filter_map(|(v, ext)| match p.exprs.node(*v) {
            Node::Var(i) => Some((*i, *ext)),
            _ => None,
        })
        .collect()
}

/// Run `nest` once per version of a program (`plan::Schedules::guards`, see
/// `lower::versions`): the guards' values pick a version at run time, and in
/// each the guards are constants, so its loads' addresses fold to plain
/// indices. Without guards, `nest` once.
pub(crate) fn in_versions(
    g: &mut Gen,
    f: FunctionValue<'static>,
    guards: &[E],
    nest: &mut dyn FnMut(&mut Gen) -> R<()>,
) -> R<()> {
    if guards.is_empty() {
        return nest(g);
    }
    let (ctx, bld) = (g.ctx, g.bld);
    let i64t = ctx.i64_type();
    let mut which = i64t.const_zero();
    for (i, e) in guards.iter().enumerate() {
        let c = g.emit(*e, false)?.into_int_value();
        let c = bld.build_int_z_extend(c, i64t, "guard").map_err(llvm)?;
        let c = bld.build_left_shift(c, i64t.const_int(i as u64, false), "bit").map_err(llvm)?;
        which = bld.build_or(which, c, "which").map_err(llvm)?;
    }
    let blocks: Vec<_> =
        (0..1u64 << guards.len()).map(|v| ctx.append_basic_block(f, &format!("version{v}"))).collect();
    let done = ctx.append_basic_block(f, "versions_done");
    let cases: Vec<_> =
        blocks.iter().enumerate().skip(1).map(|(v, bb)| (i64t.const_int(v as u64, false), *bb)).collect();
    bld.build_switch(which, blocks[0], &cases).map_err(llvm)?;
    for (v, bb) in blocks.iter().enumerate() {
        bld.position_at_end(*bb);
        let mut fixed = HashMap::new();
        let mut scope = HashMap::new();
        for (i, e) in guards.iter().enumerate() {
            let on = (v >> i) & 1 == 1;
            fixed.insert(*e, on);
            scope.insert((*e, None), ctx.bool_type().const_int(on as u64, false).into());
        }
        g.scopes.push(scope);
        g.fixed = fixed;
        let r = nest(g);
        g.scopes.pop();
        g.fixed.clear();
        r?;
        bld.build_unconditional_branch(done).map_err(llvm)?;
    }
    bld.position_at_end(done);
    Ok(())
}

/// Run `row` for the value a one-store program stores in this row
/// (`plan::Schedules::unswitched`): while that value is `select(c, a, d)` with
/// `c` the same for the whole row (`mask`: the innermost variable), branch on
/// `c` once and go on with the side taken, so the inner loops see only the
/// chosen expression (a concat of 49 taps is one branch tree per row, not 49
/// compares per vector).
fn unswitch(g: &mut Gen, p: &LoopProgram, mask: u64, depth: usize, row: &dyn Fn(&mut Gen) -> R<()>) -> R<()> {
    if let [st] = p.stores.as_slice() {
        let value = g.overrides.first().copied().unwrap_or(st.value);
        if let Node::Select(c, a, d) = g.x.node(value).clone() {
            if depth < plan::UNSWITCH_DEPTH && g.x.free(c) & mask == 0 {
                let cv = g.emit(c, false)?.into_int_value();
                let saved = std::mem::take(&mut g.overrides);
                let r = g.if_else(
                    cv,
                    &mut |g| {
                        g.overrides = vec![a];
                        unswitch(g, p, mask, depth + 1, row)
                    },
                    &mut |g| {
                        g.overrides = vec![d];
                        unswitch(g, p, mask, depth + 1, row)
                    },
                );
                g.overrides = saved;
                return r;
            }
        }
    }
    row(g)
}

/// The state of one function being generated.
pub(crate) struct Gen<'a> {
    ctx: &'static Context,
    module: &'a Module<'static>,
    bld: &'a Builder<'static>,
    x: &'a Exprs,
    /// The program's border guards (`lower`'s decision).
    borders: &'a [plan::BorderGuard],
    /// Vector width (f32 lanes of the target).
    w: u32,
    /// The target's LLVM features (which vector math instructions it has).
    features: &'a str,
    bufs: Vec<PointerValue<'static>>,
    strides: Vec<Vec<IntValue<'static>>>,
    dims: HashMap<u32, IntValue<'static>>,
    status: PointerValue<'static>,
    /// The scalar value of every bound variable (the vector lane's base for the lane variable).
    vars: HashMap<u32, IntValue<'static>>,
    /// Values computed so far, innermost scope last: `(expr, lane variable when a vector)`.
    scopes: Vec<HashMap<(E, Option<u32>), V>>,
    /// The variable that runs along the vector lanes, in vector mode.
    lane: Option<u32>,
    /// The row's output as scratch ([`plan::RowScratch`]): the reduction body whose
    /// values the row's sum stores there, and the row's first position.
    scratch: Option<(E, u32, IntValue<'static>)>,
    /// Each parameter's element type.
    param_dtypes: Vec<DType>,
    /// The guards' values in the version being generated.
    fixed: HashMap<E, bool>,
    /// A reduction variable's range in a split reduction's partial: `(var, lo, hi)`.
    reduce_range: Option<(u32, IntValue<'static>, IntValue<'static>)>,
    /// The stored values where a row-level branch chose them (see `unswitch`).
    overrides: Vec<E>,
    /// Code for a GPU (NVPTX): vectors only for quads, accesses aligned to
    /// their element or to the whole vector.
    device: bool,
    /// On a GPU, while a warp shares the reductions computed now: the calling
    /// lane (0-31); each reduction's last variable is split among the lanes.
    warp_lane: Option<IntValue<'static>>,
    /// In a warp-shared reduction: its last variable, and the lane (`i32`).
    reduce_lanes: Option<(u32, IntValue<'static>)>,
    /// In a row's last, partial vector: the lanes inside the row. Every vector
    /// load is masked by it, and the stores and checks too.
    tail: Option<VectorValue<'static>>,
    /// A division by a divisor the same for the whole row stays a division
    /// (see [`rounds_to_integers`]); else one reciprocal a row, a multiply a vector.
    exact_division: bool,
}

impl<'a> Gen<'a> {
    /// The generator of `p`'s code at the builder's position: the buffers'
    /// pointers loaded from the table at `bufs`, the dims the program reads
    /// from `dims`, every buffer's strides computed, the error status cleared.
    /// On a `device` (NVPTX) vectors are a quad's (`lanes` = 4): a vector
    /// access is one wide access where its address is aligned to it, else
    /// element by element; math with a GPU form of its own goes lane by lane,
    /// and math without one is an error.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        ctx: &'static Context,
        module: &'a Module<'static>,
        bld: &'a Builder<'static>,
        p: &'a LoopProgram,
        (bufs_ptr, dims_ptr): (PointerValue<'static>, PointerValue<'static>),
        lanes: usize,
        features: &'a str,
        device: bool,
    ) -> R<Gen<'a>> {
        let (i64t, ptr) = (ctx.i64_type(), ctx.ptr_type(AddressSpace::default()));
        let status = bld.build_alloca(i64t, "status").map_err(llvm)?;
        bld.build_store(status, i64t.const_zero()).map_err(llvm)?;
        let mut g = Gen {
            ctx,
            module,
            bld,
            x: &p.exprs,
            borders: &p.schedules.border_guards,
            w: lanes as u32,
            features,
            bufs: Vec::new(),
            strides: Vec::new(),
            dims: HashMap::new(),
            status,
            vars: HashMap::new(),
            scopes: vec![HashMap::new()],
            lane: None,
            scratch: None,
            param_dtypes: p.params.iter().map(|q| q.dtype).collect(),
            fixed: HashMap::new(),
            reduce_range: None,
            overrides: Vec::new(),
            device,
            warp_lane: None,
            reduce_lanes: None,
            tail: None,
            exact_division: rounds_to_integers(p),
        };
        // The buffers, the dims the program reads, and each buffer's strides.
        for i in 0..p.params.len() {
            // SAFETY (of the IR): `bufs` holds one pointer per parameter (the ABI).
            let at =
                unsafe { bld.build_in_bounds_gep(ptr, bufs_ptr, &[i64t.const_int(i as u64, false)], "bufp") }
                    .map_err(llvm)?;
            let b = bld.build_load(ptr, at, "buf").map_err(llvm)?;
            crate::set_align(&b, 8);
            g.invariant(&b);
            g.bufs.push(b.into_pointer_value());
        }
        for n in 0..p.exprs.len() {
            if let Node::Dim(slot) = p.exprs.node(E(n as u32)) {
                // SAFETY (of the IR): `dims` holds the whole dim table (the ABI).
                let at = unsafe {
                    bld.build_in_bounds_gep(i64t, dims_ptr, &[i64t.const_int(*slot as u64, false)], "dimp")
                }
                .map_err(llvm)?;
                let v = bld.build_load(i64t, at, "dim").map_err(llvm)?;
                crate::set_align(&v, 8);
                g.invariant(&v);
                g.dims.insert(*slot, v.into_int_value());
            }
        }
        for q in &p.params {
            let mut strides = vec![i64t.const_int(1, false); q.shape.len()];
            for d in (0..q.shape.len().saturating_sub(1)).rev() {
                let ext = g.emit(q.shape[d + 1], false)?.into_int_value();
                strides[d] = bld.build_int_mul(strides[d + 1], ext, "stride").map_err(llvm)?;
            }
            g.strides.push(strides);
        }
        Ok(g)
    }

    /// On a device, load `v` (a buffer table's pointer or a dim) marked
    /// invariant: the runtime writes the tables before a launch and no
    /// kernel writes them, so where the program is inlined into a loop
    /// with barriers (attention's chunks of keys) the load is hoisted out
    /// of the loop instead of repeated after each barrier.
    fn invariant(&self, v: &BasicValueEnum<'static>) {
        if !self.device {
            return;
        }
        if let Some(i) = v.as_instruction_value() {
            let kind = self.ctx.get_kind_id("invariant.load");
            let _ = i.set_metadata(self.ctx.metadata_node(&[]), kind);
        }
    }
}

impl Gen<'_> {
    fn is_vec(&self, e: E, vec: bool) -> bool {
        vec && self.lane.is_some_and(|l| self.x.free(e) & (1u64 << l) != 0)
    }

    /// The register type of `dt` (bool: i1), a vector of the width when `vec`.
    fn lty(&self, dt: DType, vec: bool) -> BasicTypeEnum<'static> {
        let s: BasicTypeEnum<'static> = match dt {
            DType::F32 => self.ctx.f32_type().into(),
            DType::F64 => self.ctx.f64_type().into(),
            DType::F16 => self.ctx.f16_type().into(),
            // Its bits: converted by integer arithmetic ([`Gen::f32_to_bf16`]).
            DType::BF16 => self.ctx.i16_type().into(),
            DType::I8 | DType::U8 => self.ctx.i8_type().into(),
            DType::I32 => self.ctx.i32_type().into(),
            DType::I64 => self.ctx.i64_type().into(),
            DType::Bool => self.ctx.bool_type().into(),
        };
        if vec {
            vec_of(s, self.w)
        } else {
            s
        }
    }

    /// The memory type of `dt` (bool: one byte).
    fn mty(&self, dt: DType, vec: bool) -> BasicTypeEnum<'static> {
        if dt == DType::Bool {
            self.lty(DType::U8, vec)
        } else {
            self.lty(dt, vec)
        }
    }

    fn lookup(&self, key: &(E, Option<u32>)) -> Option<V> {
        self.scopes.iter().rev().find_map(|s| s.get(key).copied())
    }

    /// The value of `e`: a vector along the lane variable when `vec` and `e`
    /// depends on it, else a scalar.
    fn emit(&mut self, e: E, vec: bool) -> R<V> {
        let v = self.is_vec(e, vec);
        let key = (e, if v { self.lane } else { None });
        if let Some(val) = self.lookup(&key) {
            return Ok(val);
        }
        let val = self.compute(e, v)?;
        if let Some(s) = self.scopes.last_mut() {
            s.insert(key, val);
        }
        Ok(val)
    }

    /// `e` as a vector when `vec` (splatting a scalar).
    fn emit_as(&mut self, e: E, vec: bool) -> R<V> {
        let v = self.emit(e, vec)?;
        if vec && !v.is_vector_value() {
            return self.splat(v);
        }
        Ok(v)
    }

    fn splat(&self, s: V) -> R<V> {
        let vt = vec_of(s.get_type(), self.w);
        let i32t = self.ctx.i32_type();
        let undef = poison(vt);
        let one = self.bld.build_insert_element(undef, s, i32t.const_zero(), "s1").map_err(llvm)?;
        let mask = VectorType::const_vector(&vec![i32t.const_zero(); self.w as usize]);
        Ok(self.bld.build_shuffle_vector(one, undef, mask, "splat").map_err(llvm)?.into())
    }

    /// Compute every maximal subexpression of `roots` that depends on none of the
    /// variables in `mask` now, in the current scope (loop-invariant code motion
    /// done by construction: a row reduction is computed once per row).
    fn hoist(&mut self, roots: &[E], mask: u64, vec: bool) -> R<()> {
        let mut seen = std::collections::HashSet::new();
        let mut stack: Vec<E> = roots.to_vec();
        let mut todo = Vec::new();
        while let Some(e) = stack.pop() {
            if !seen.insert(e) {
                continue;
            }
            let trivial = matches!(self.x.node(e), Node::Var(_) | Node::Dim(_) | Node::Const(_));
            if self.x.free(e) & mask == 0 {
                if !trivial {
                    todo.push(e);
                }
                continue;
            }
            match self.x.node(e) {
                // A reduction's body is hoisted when the reduction is emitted.
                Node::Reduce { .. } => {}
                n => stack.extend(n.children()),
            }
        }
        // Children before parents: lower node ids first (the DAG is built bottom-up).
        todo.sort();
        for e in todo {
            self.emit(e, vec)?;
        }
        Ok(())
    }

    fn compute(&mut self, e: E, vec: bool) -> R<V> {
        let x = self.x;
        let dt = x.dtype(e);
        let b = self.bld;
        Ok(match x.node(e).clone() {
            Node::Var(v) => {
                let base = *self.vars.get(&v).ok_or_else(|| llvm(format!("variable i{v} is not bound")))?;
                if vec {
                    let s = self.splat(base.into())?.into_vector_value();
                    let iota: Vec<IntValue> =
                        (0..self.w).map(|i| self.ctx.i64_type().const_int(i as u64, false)).collect();
                    b.build_int_add(s, VectorType::const_vector(&iota), "lane").map_err(llvm)?.into()
                } else {
                    base.into()
                }
            }
            Node::Dim(slot) => (*self.dims.get(&slot).ok_or_else(|| llvm("dim not loaded"))?).into(),
            Node::Const(bits) => self.constant(dt, bits)?,
            Node::Load { buf, index, guard } => self.load(buf, &index, guard, dt, vec)?,
            Node::Unary(op, a) => {
                let a = self.emit_as(a, vec)?;
                self.unary(op, a, dt)?
            }
            Node::Binary(op, a, c) => {
                let in_dt = x.dtype(a);
                let nonneg = x.known_nonneg(a) && x.known_nonneg(c);
                if op == BinaryOp::Div
                    && !self.exact_division
                    && matches!(in_dt, DType::F32 | DType::F64)
                    && self.is_vec(a, vec)
                    && !self.is_vec(c, vec)
                {
                    // A divisor the same for the whole row (Softmax's sum): one
                    // division per row (LLVM hoists the scalar one), a multiply per vector.
                    let (a, c) = (self.emit_as(a, vec)?, self.emit(c, false)?);
                    let one = self.constant(in_dt, 1f64.to_bits())?;
                    let r = self.binary(BinaryOp::Div, one, c, in_dt, false)?;
                    let r = self.splat(r)?;
                    self.binary(BinaryOp::Mul, a, r, in_dt, false)?
                } else {
                    let (a, c) = (self.emit_as(a, vec)?, self.emit_as(c, vec)?);
                    self.binary(op, a, c, in_dt, nonneg)?
                }
            }
            Node::Select(c, a, d)
                if vec && !self.is_vec(c, vec) && (self.is_vec(a, vec) || self.is_vec(d, vec)) =>
            {
                // A condition the same for the whole row (a concat along an outer
                // axis): branch once per vector instead of computing both sides.
                let cv = self.emit(c, false)?.into_int_value();
                self.branch(cv, a, d)?
            }
            Node::Select(c, a, d) => {
                let cv = self.emit(c, vec)?;
                let (a, d) = (self.emit_as(a, vec)?, self.emit_as(d, vec)?);
                select(b, cv, a, d)?
            }
            // A quantization's integer of `round(g)` where AVX-512 rounds and
            // converts in one instruction (`VMath::quantized_ints`, the same
            // values), then narrowed (bytes saturating: `quantized_bytes`).
            Node::Cast(_)
                if vec
                    && dt != DType::F32
                    && let Some((f, offset, lo, hi)) = quantized(x, e)
                    && let Node::Unary(UnaryOp::Round, g) = *x.node(f)
                    && self.rounds_in_conversion(offset, lo, hi) =>
            {
                let v = self.emit_as(g, vec)?.into_vector_value();
                let m = self.vmath(v.get_type());
                match dt == DType::U8 && lo >= 0 && hi <= 255 {
                    true => m.quantized_bytes(v, offset, lo, hi)?.into(),
                    false => self.cast(m.quantized_ints(v, offset, lo, hi)?.into(), DType::I32, dt)?,
                }
            }
            // A quantization's integer, computed in f32 (see `VMath::integer`)
            // and converted once, exactly: it lies inside the cast's type.
            Node::Cast(_) if let Some((f, offset, lo, hi)) = quantized(x, e) => {
                let v = self.emit_as(f, vec)?;
                let r = self.integer_f32(v, offset, lo, hi)?;
                match dt {
                    DType::F32 => r,
                    _ => {
                        let i = if vec {
                            let iv = self.lty(DType::I32, true).into_vector_type();
                            b.build_float_to_signed_int(r.into_vector_value(), iv, "q").map_err(llvm)?.into()
                        } else {
                            let i =
                                b.build_float_to_signed_int(r.into_float_value(), self.ctx.i32_type(), "q");
                            V::from(i.map_err(llvm)?)
                        };
                        self.cast(i, DType::I32, dt)?
                    }
                }
            }
            Node::Cast(a) => {
                let from = x.dtype(a);
                let a = self.emit_as(a, vec)?;
                self.cast(a, from, dt)?
            }
            Node::Check { ok, code, value } => {
                let okv = self.emit(ok, vec)?;
                self.record(okv, code)?;
                self.emit_as(value, vec)?
            }
            Node::Reduce { combine, vars, body } => self.reduce(combine, &vars, body, dt, vec)?,
        })
    }

    fn constant(&self, dt: DType, bits: u64) -> R<V> {
        let f = f64::from_bits(bits);
        let i = bits as i64;
        Ok(match dt {
            DType::F32 => self.ctx.f32_type().const_float(f).into(),
            DType::F64 => self.ctx.f64_type().const_float(f).into(),
            DType::F16 => self.ctx.f16_type().const_float(f).into(),
            DType::BF16 => self.ctx.i16_type().const_int(ir::f32_to_bf16(f as f32) as u64, false).into(),
            DType::I8 | DType::U8 => self.ctx.i8_type().const_int(i as u64, true).into(),
            DType::I32 => self.ctx.i32_type().const_int(i as u64, true).into(),
            DType::I64 => self.ctx.i64_type().const_int(i as u64, true).into(),
            DType::Bool => self.ctx.bool_type().const_int((i != 0) as u64, false).into(),
        })
    }

    /// Record error `code` (the first one only) when `ok` is false in some lane.
    fn record(&mut self, ok: V, code: u32) -> R<()> {
        let b = self.bld;
        let bad = if ok.is_vector_value() {
            let v = ok.into_vector_value();
            let n = b.build_not(v, "bad").map_err(llvm)?;
            // Lanes past a row's end check nothing.
            let n = match self.tail {
                Some(t) => b.build_and(n, t, "bad").map_err(llvm)?,
                None => n,
            };
            let bits = b
                .build_bit_cast(
                    n,
                    self.ctx
                        .custom_width_int_type(
                            std::num::NonZeroU32::new(self.w).ok_or_else(|| llvm("width 0"))?,
                        )
                        .map_err(llvm)?,
                    "bits",
                )
                .map_err(llvm)?;
            b.build_int_compare(
                IntPredicate::NE,
                bits.into_int_value(),
                bits.get_type().into_int_type().const_zero(),
                "any",
            )
            .map_err(llvm)?
        } else {
            b.build_not(ok.into_int_value(), "bad").map_err(llvm)?
        };
        let i64t = self.ctx.i64_type();
        let old = b.build_load(i64t, self.status, "old").map_err(llvm)?.into_int_value();
        let first = b.build_int_compare(IntPredicate::EQ, old, i64t.const_zero(), "first").map_err(llvm)?;
        let set = b.build_and(bad, first, "set").map_err(llvm)?;
        let new = b.build_select(set, i64t.const_int(code as u64, false), old, "new").map_err(llvm)?;
        b.build_store(self.status, new).map_err(llvm)?;
        Ok(())
    }

    /// The coefficient of the lane variable in an index expression, when affine
    /// (in the version being generated: its guards' selects take their side).
    fn coef(&self, e: E, lane: u32) -> Option<i64> {
        lower::versions::coef_with(self.x, e, lane, &|c| self.fixed.get(&c).copied())
    }

    /// How an index moves along the lanes: `Some(s)` when only its last
    /// position does, by `s` per lane (0: the same element for every lane, 1:
    /// contiguous, 2: every other element).
    fn lane_step(&self, index: &[E]) -> Option<i64> {
        let l = self.lane?;
        let (last, rest) = index.split_last()?;
        rest.iter().all(|i| self.coef(*i, l) == Some(0)).then(|| self.coef(*last, l)).flatten()
    }

    fn offset(&mut self, buf: u32, index: &[E], vec: bool) -> R<V> {
        let mut off: V = self.ctx.i64_type().const_zero().into();
        let strides = self.strides[buf as usize].clone();
        for (i, s) in index.iter().zip(strides) {
            let iv = self.emit(*i, vec)?;
            let term: V = if iv.is_vector_value() {
                let sv = self.splat(s.into())?;
                self.bld
                    .build_int_mul(iv.into_vector_value(), sv.into_vector_value(), "t")
                    .map_err(llvm)?
                    .into()
            } else {
                self.bld.build_int_mul(iv.into_int_value(), s, "t").map_err(llvm)?.into()
            };
            off = self.add_any(off, term)?;
        }
        Ok(off)
    }

    fn add_any(&self, a: V, b: V) -> R<V> {
        let (a, b) = match (a.is_vector_value(), b.is_vector_value()) {
            (true, false) => (a, self.splat(b)?),
            (false, true) => (self.splat(a)?, b),
            _ => (a, b),
        };
        Ok(if a.is_vector_value() {
            self.bld.build_int_add(a.into_vector_value(), b.into_vector_value(), "o").map_err(llvm)?.into()
        } else {
            self.bld.build_int_add(a.into_int_value(), b.into_int_value(), "o").map_err(llvm)?.into()
        })
    }

    fn intrinsic(&self, name: &str, tys: &[BasicTypeEnum<'static>]) -> R<FunctionValue<'static>> {
        Intrinsic::find(name)
            .and_then(|i| i.get_declaration(self.module, tys))
            .ok_or_else(|| llvm(format!("no {name} for {tys:?}")))
    }

    fn call(&self, f: FunctionValue<'static>, args: &[BasicMetadataValueEnum<'static>]) -> R<V> {
        basic(self.bld.build_call(f, args, "").map_err(llvm)?)
    }

    /// A call of a function that returns nothing.
    fn call_void(&self, f: FunctionValue<'static>, args: &[BasicMetadataValueEnum<'static>]) -> R<()> {
        self.bld.build_call(f, args, "").map_err(llvm)?;
        Ok(())
    }

    fn load(&mut self, buf: u32, index: &[E], guard: Option<E>, dt: DType, vec: bool) -> R<V> {
        let tail = vec && self.tail.is_some();
        if let Some(g) = guard.filter(|g| !tail && vec && self.is_vec(*g, vec) && self.border_guard(*g)) {
            // `lower` found the guard a border's range checks along the lanes
            // (`plan::BorderGuard`): the interior takes a plain load and only the
            // border vectors a masked one.
            let mut terms = Vec::new();
            self.conjuncts(g, &mut terms);
            let all = self.holds_on_every_lane(&terms)?;
            return self.choose(all, &mut |g| g.load_unswitched(buf, index, None, dt, vec), &mut |g| {
                g.load_unswitched(buf, index, guard, dt, vec)
            });
        }
        self.load_unswitched(buf, index, guard, dt, vec)
    }

    /// Whether `g` is a border guard along the lane variable.
    fn border_guard(&self, g: E) -> bool {
        let Some(lane) = self.lane else { return false };
        self.borders.iter().any(|b| b.guard == g && b.along >> lane & 1 == 1)
    }

    /// The conjuncts of a guard.
    fn conjuncts(&self, g: E, out: &mut Vec<E>) {
        match self.x.node(g) {
            Node::Binary(BinaryOp::And, a, b) => {
                self.conjuncts(*a, out);
                self.conjuncts(*b, out);
            }
            _ => out.push(g),
        }
    }

    /// Whether every conjunct holds at the vector's first and at its last lane
    /// (for affine comparisons: on every lane), as a scalar `i1`. The sides of a
    /// comparison are computed at the first lane (the lane variable's value in
    /// this vector's scope) and moved to the last by their coefficients.
    fn holds_on_every_lane(&mut self, terms: &[E]) -> R<IntValue<'static>> {
        let lane = self.lane.ok_or_else(|| llvm("no lane"))?;
        let i64t = self.ctx.i64_type();
        let mut all = self.ctx.bool_type().const_int(1, false);
        let saved = self.lane.take();
        let r = (|| -> R<()> {
            for t in terms {
                let v = match self.x.node(*t).clone() {
                    Node::Binary(op, a, b) if self.x.free(*t) & (1u64 << lane) != 0 => {
                        let pred = match op {
                            BinaryOp::Less => IntPredicate::SLT,
                            BinaryOp::LessEq => IntPredicate::SLE,
                            BinaryOp::Greater => IntPredicate::SGT,
                            _ => IntPredicate::SGE,
                        };
                        let span = self.w as i64 - 1;
                        let mut ends = Vec::with_capacity(2);
                        for e in [a, b] {
                            let first = self.emit(e, false)?.into_int_value();
                            let step =
                                self.coef(e, lane).ok_or_else(|| llvm("a guard side is not affine"))?;
                            let last = self
                                .bld
                                .build_int_add(first, i64t.const_int((step * span) as u64, true), "last")
                                .map_err(llvm)?;
                            ends.push((first, last));
                        }
                        let b = self.bld;
                        let at_first = b.build_int_compare(pred, ends[0].0, ends[1].0, "g0").map_err(llvm)?;
                        let at_last = b.build_int_compare(pred, ends[0].1, ends[1].1, "g1").map_err(llvm)?;
                        b.build_and(at_first, at_last, "both").map_err(llvm)?
                    }
                    _ => self.emit(*t, false)?.into_int_value(),
                };
                all = self.bld.build_and(all, v, "all").map_err(llvm)?;
            }
            Ok(())
        })();
        self.lane = saved;
        r?;
        Ok(all)
    }

    /// `cond ? then() : other()`: [`Gen::if_else`] with the two sides' values
    /// joined by a phi.
    fn choose(
        &mut self,
        cond: IntValue<'static>,
        then: &mut dyn FnMut(&mut Self) -> R<V>,
        other: &mut dyn FnMut(&mut Self) -> R<V>,
    ) -> R<V> {
        // Each side's value and the block it ends in.
        let side = |g: &mut Self, f: &mut dyn FnMut(&mut Self) -> R<V>, out: &mut Option<(V, _)>| -> R<()> {
            let v = f(g)?;
            *out = Some((v, g.bld.get_insert_block().ok_or_else(|| llvm("no block"))?));
            Ok(())
        };
        let (mut a, mut d) = (None, None);
        self.if_else(cond, &mut |g| side(g, then, &mut a), &mut |g| side(g, other, &mut d))?;
        let (Some((va, ba)), Some((vd, bd))) = (a, d) else {
            return Err(llvm("a side of a choice is missing"));
        };
        let phi = self.bld.build_phi(va.get_type(), "sel").map_err(llvm)?;
        phi.add_incoming(&[(&va as &dyn BasicValue, ba), (&vd as &dyn BasicValue, bd)]);
        Ok(phi.as_basic_value())
    }

    fn load_unswitched(&mut self, buf: u32, index: &[E], guard: Option<E>, dt: DType, vec: bool) -> R<V> {
        let step = if vec { self.lane_step(index) } else { None };
        if step == Some(0) && guard.is_none_or(|g| !self.is_vec(g, vec)) {
            // The same element for every lane (a broadcast, in the version where
            // its dim is 1): one scalar load, splat.
            let v = self.load(buf, index, guard, dt, false)?;
            return self.splat(v);
        }
        let b = self.bld;
        let mt = self.mty(dt, false);
        let base = self.bufs[buf as usize];
        let i32t = self.ctx.i32_type();
        // Unaligned on the CPU (any lane may start a vector); a GPU loads whole
        // elements, which its allocations align.
        let elem_align = if self.device { dt_bytes(dt) as u32 } else { 1 };
        let align = i32t.const_int(elem_align as u64, false);
        // (A GPU gathers a stride-2 load: its two overlapping vectors are not aligned.)
        let (contiguous, stride2) = (step == Some(1), step == Some(2) && !self.device);
        // A contiguous or stride-2 load needs only lane 0's offset: computed as a
        // scalar, it folds into the load's address (as a vector whose first lane
        // is extracted, LLVM kept vector adds and moves for every load).
        let first_only = vec && (contiguous || (stride2 && guard.is_none() && self.tail.is_none()));
        let off = self.offset(buf, index, vec && !first_only)?;
        let first_of = |off: V| -> R<IntValue<'static>> {
            Ok(if off.is_vector_value() {
                b.build_extract_element(off.into_vector_value(), i32t.const_zero(), "first")
                    .map_err(llvm)?
                    .into_int_value()
            } else {
                off.into_int_value()
            })
        };
        let mask = match guard {
            Some(gd) => Some(self.emit_as(gd, vec)?),
            None => None,
        };
        // A row's partial last vector reads its lanes inside the row only.
        let mask = match (self.tail.filter(|_| vec), mask) {
            (Some(t), Some(m)) => {
                Some(self.bld.build_and(t, m.into_vector_value(), "in").map_err(llvm)?.into())
            }
            (Some(t), None) => Some(t.into()),
            (None, m) => m,
        };
        let raw: V = if !vec {
            let off = off.into_int_value();
            // SAFETY (of the IR): the index is in bounds by construction, or masked.
            let at = unsafe { b.build_gep(mt, base, &[off], "at") }.map_err(llvm)?;
            match mask {
                None => {
                    let v = b.build_load(mt, at, "ld").map_err(llvm)?;
                    crate::set_align(&v, elem_align);
                    v
                }
                Some(m) => {
                    // A one-lane masked load: nothing is read when the guard is false.
                    let vt1 = vec_of(mt, 1);
                    let f = self.intrinsic("llvm.masked.load", &[vt1, self.ptr_type()])?;
                    let m1 = self
                        .bld
                        .build_insert_element(
                            self.ctx.bool_type().vec_type(1).get_poison(),
                            m.into_int_value(),
                            i32t.const_zero(),
                            "m1",
                        )
                        .map_err(llvm)?;
                    let v = self.call(f, &[at.into(), align.into(), m1.into(), const_zero(vt1).into()])?;
                    b.build_extract_element(v.into_vector_value(), i32t.const_zero(), "ld").map_err(llvm)?
                }
            }
        } else if stride2 && mask.is_none() {
            // Every other element (a stride-2 window or slice along the lanes): two
            // contiguous loads and one shuffle instead of a gather. The second load
            // starts a lane early so that it ends at the last lane's element.
            let w = self.w as u64;
            let first = first_of(off)?;
            let i64t = self.ctx.i64_type();
            let second = b.build_int_add(first, i64t.const_int(w - 1, false), "second").map_err(llvm)?;
            let vt = vec_of(mt, self.w);
            let mut halves = Vec::with_capacity(2);
            for start in [first, second] {
                // SAFETY (of the IR): lane 0's element and the last lane's (2·(W−1)
                // past it) are in bounds, so is everything between.
                let at = unsafe { b.build_gep(mt, base, &[start], "at") }.map_err(llvm)?;
                let v = b.build_load(vt, at, "vld").map_err(llvm)?;
                crate::set_align(&v, 1);
                halves.push(v.into_vector_value());
            }
            let pick: Vec<IntValue> = (0..w)
                .map(|j| i32t.const_int(if j < w / 2 { 2 * j } else { w + 2 * j + 1 - w }, false))
                .collect();
            b.build_shuffle_vector(halves[0], halves[1], VectorType::const_vector(&pick), "even")
                .map_err(llvm)?
                .into()
        } else if contiguous {
            let first = first_of(off)?;
            // SAFETY (of the IR): the lanes' indices are in bounds, or masked.
            let at = unsafe { b.build_gep(mt, base, &[first], "at") }.map_err(llvm)?;
            let vt = vec_of(mt, self.w);
            match mask {
                None if self.device => {
                    let (aligned, wide) = self.alignment_test(at, dt)?;
                    let mut whole = |g: &mut Self| -> R<V> {
                        let v = g.bld.build_load(vt, at, "vld").map_err(llvm)?;
                        crate::set_align(&v, wide);
                        Ok(v)
                    };
                    // Element by element (not one vector load aligned to its
                    // element, which LLVM would merge with the other side's).
                    let mut each = |g: &mut Self| -> R<V> {
                        let mut v = poison(vt);
                        for l in 0..g.w {
                            let i = i32t.const_int(l as u64, false);
                            let off = g.ctx.i64_type().const_int(l as u64, false);
                            // SAFETY (of the IR): the lanes' indices are in bounds.
                            let p = unsafe { g.bld.build_gep(mt, at, &[off], "el") }.map_err(llvm)?;
                            let x = g.bld.build_load(mt, p, "ld").map_err(llvm)?;
                            crate::set_align(&x, dt_bytes(dt) as u32);
                            v = g.bld.build_insert_element(v, x, i, "lv").map_err(llvm)?;
                        }
                        Ok(v.into())
                    };
                    self.choose(aligned, &mut whole, &mut each)?
                }
                None => {
                    let v = b.build_load(vt, at, "vld").map_err(llvm)?;
                    crate::set_align(&v, 1);
                    v
                }
                Some(m) => {
                    let f = self.intrinsic("llvm.masked.load", &[vt, self.ptr_type()])?;
                    self.call(f, &[at.into(), align.into(), m.into(), const_zero(vt).into()])?
                }
            }
        } else {
            // Every lane's address (in bounds, or masked): base + offset · size. An
            // offset the same for every lane (with a guard that is not) is splat.
            let off = if off.is_vector_value() { off } else { self.splat(off)? };
            let i64t = self.ctx.i64_type();
            let basei = b.build_ptr_to_int(base, i64t, "base").map_err(llvm)?;
            let size = self.splat(i64t.const_int(dt_bytes(dt), false).into())?;
            let bytes =
                b.build_int_mul(off.into_vector_value(), size.into_vector_value(), "bytes").map_err(llvm)?;
            let basev = self.splat(basei.into())?.into_vector_value();
            let addrs = b.build_int_add(basev, bytes, "addrs").map_err(llvm)?;
            let m: V = match mask {
                Some(m) => m,
                None => {
                    let t = self.ctx.bool_type().const_int(1, false);
                    VectorType::const_vector(&vec![t; self.w as usize]).into()
                }
            };
            let pvt = vec_of(self.ptr_type(), self.w);
            if dt_bytes(dt) == 1 && !self.device {
                self.gather_bytes(addrs, m, mt)?
            } else {
                let vt = vec_of(mt, self.w);
                let ptrs = b.build_int_to_ptr(addrs, pvt.into_vector_type(), "ptrs").map_err(llvm)?;
                let f = self.intrinsic("llvm.masked.gather", &[vt, pvt])?;
                self.call(f, &[ptrs.into(), align.into(), m.into(), const_zero(vt).into()])?
            }
        };
        if dt == DType::Bool {
            return self.to_bool(raw);
        }
        Ok(raw)
    }

    /// Gather bytes at `addrs` (one i64 address a lane, `mask`'s lanes only)
    /// as the aligned 4-byte words that hold them, each shifted down to its
    /// byte: x86 gathers no bytes (LLVM loads them one lane at a time), and
    /// it gathers words. A word never crosses a page, so it is readable
    /// wherever its byte is.
    fn gather_bytes(&self, addrs: VectorValue<'static>, mask: V, byte: BasicTypeEnum<'static>) -> R<V> {
        let b = self.bld;
        let i64t = self.ctx.i64_type();
        let i32t = self.ctx.i32_type();
        let down = self.splat(i64t.const_int(!3u64, false).into())?.into_vector_value();
        let three = self.splat(i64t.const_int(3, false).into())?.into_vector_value();
        let words = b.build_and(addrs, down, "words").map_err(llvm)?;
        let within = b.build_and(addrs, three, "within").map_err(llvm)?;
        let pvt = vec_of(self.ptr_type(), self.w);
        let ptrs = b.build_int_to_ptr(words, pvt.into_vector_type(), "ptrs").map_err(llvm)?;
        let wt = vec_of(i32t.into(), self.w);
        let f = self.intrinsic("llvm.masked.gather", &[wt, pvt])?;
        let align = i32t.const_int(4, false);
        let got = self.call(f, &[ptrs.into(), align.into(), mask.into(), const_zero(wt).into()])?;
        let wvt = wt.into_vector_type();
        let within = b.build_int_truncate(within, wvt, "within32").map_err(llvm)?;
        let eight = self.splat(i32t.const_int(8, false).into())?.into_vector_value();
        let shift = b.build_int_mul(within, eight, "shift").map_err(llvm)?;
        let v = b.build_right_shift(got.into_vector_value(), shift, false, "byte").map_err(llvm)?;
        let bt = vec_of(byte, self.w).into_vector_type();
        Ok(b.build_int_truncate(v, bt, "bytes").map_err(llvm)?.into())
    }

    fn ptr_type(&self) -> BasicTypeEnum<'static> {
        self.ctx.ptr_type(AddressSpace::default()).into()
    }

    fn to_bool(&self, raw: V) -> R<V> {
        Ok(if raw.is_vector_value() {
            let v = raw.into_vector_value();
            let z = v.get_type().const_zero();
            self.bld.build_int_compare(IntPredicate::NE, v, z, "b").map_err(llvm)?.into()
        } else {
            let v = raw.into_int_value();
            self.bld
                .build_int_compare(IntPredicate::NE, v, v.get_type().const_zero(), "b")
                .map_err(llvm)?
                .into()
        })
    }

    fn stores(&mut self, p: &LoopProgram, at: IntValue<'static>, vec: bool) -> R<()> {
        for (i, st) in p.stores.iter().enumerate() {
            let dt = p.params[st.param as usize].dtype;
            let value = self.overrides.get(i).copied().unwrap_or(st.value);
            let v = self.emit_as(value, vec)?;
            let v = if dt == DType::Bool { self.zext(v, self.mty(dt, vec))? } else { v };
            let mt = self.mty(dt, false);
            // SAFETY (of the IR): `at` is a position of the nest, inside the buffer.
            let ptr =
                unsafe { self.bld.build_gep(mt, self.bufs[st.param as usize], &[at], "st") }.map_err(llvm)?;
            match self.tail.filter(|_| vec) {
                // A row's partial last vector: its lanes inside the row only.
                Some(inside) => {
                    let vt = v.get_type();
                    let f = self.intrinsic("llvm.masked.store", &[vt, self.ptr_type()])?;
                    let align = self.ctx.i32_type().const_int(dt_bytes(dt), false);
                    self.call_void(f, &[v.into(), ptr.into(), align.into(), inside.into()])?;
                }
                None if self.device && vec => {
                    let (aligned, wide) = self.alignment_test(ptr, dt)?;
                    let mut whole = |g: &mut Self| -> R<()> {
                        let s = g.bld.build_store(ptr, v).map_err(llvm)?;
                        s.set_alignment(wide).map_err(llvm)
                    };
                    let mut each = |g: &mut Self| -> R<()> {
                        let i64t = g.ctx.i64_type();
                        for l in 0..g.w {
                            let i = g.ctx.i32_type().const_int(l as u64, false);
                            let x =
                                g.bld.build_extract_element(v.into_vector_value(), i, "sl").map_err(llvm)?;
                            // SAFETY (of the IR): the lanes' positions are inside the buffer.
                            let p =
                                unsafe { g.bld.build_gep(mt, ptr, &[i64t.const_int(l as u64, false)], "el") }
                                    .map_err(llvm)?;
                            let s = g.bld.build_store(p, x).map_err(llvm)?;
                            s.set_alignment(dt_bytes(dt) as u32).map_err(llvm)?;
                        }
                        Ok(())
                    };
                    self.if_else(aligned, &mut whole, &mut each)?;
                }
                None => {
                    let s = self.bld.build_store(ptr, v).map_err(llvm)?;
                    s.set_alignment(dt.size() as u32).map_err(llvm)?;
                }
            }
        }
        Ok(())
    }

    /// The stores of one vector along an outer variable: lane `l` of each stored
    /// value at `at + l·block`, each lane a store of its own (AVX-512's scatter
    /// is microcoded on some cores, far slower than its lanes' stores); a
    /// row's tail as a scatter masked by it.
    fn scattered_stores(
        &mut self,
        p: &LoopProgram,
        at: IntValue<'static>,
        block: IntValue<'static>,
    ) -> R<()> {
        let (i64t, i32t) = (self.ctx.i64_type(), self.ctx.i32_type());
        let values = p
            .stores
            .iter()
            .map(|st| {
                let dt = p.params[st.param as usize].dtype;
                let v = self.emit_as(st.value, true)?;
                if dt == DType::Bool {
                    self.zext(v, self.mty(dt, true))
                } else {
                    Ok(v)
                }
            })
            .collect::<R<Vec<V>>>()?;
        let Some(mask) = self.tail else {
            for (st, v) in p.stores.iter().zip(&values) {
                let dt = p.params[st.param as usize].dtype;
                let et = self.mty(dt, false);
                let mut at_lane = at;
                for l in 0..self.w {
                    let lane = i32t.const_int(l as u64, false);
                    let x =
                        self.bld.build_extract_element(v.into_vector_value(), lane, "sc.x").map_err(llvm)?;
                    // SAFETY (of the IR): a point of the nest, inside the buffer.
                    let ptr = unsafe {
                        self.bld.build_in_bounds_gep(et, self.bufs[st.param as usize], &[at_lane], "sc.p")
                    }
                    .map_err(llvm)?;
                    let s = self.bld.build_store(ptr, x).map_err(llvm)?;
                    s.set_alignment(dt_bytes(dt) as u32).map_err(llvm)?;
                    at_lane = self.bld.build_int_add(at_lane, block, "sc.next").map_err(llvm)?;
                }
            }
            return Ok(());
        };
        let iota: Vec<IntValue> = (0..self.w).map(|i| i64t.const_int(i as u64, false)).collect();
        let lanes = self.splat(block.into())?.into_vector_value();
        let offs =
            self.bld.build_int_mul(lanes, VectorType::const_vector(&iota), "sc.lanes").map_err(llvm)?;
        let start = self.splat(at.into())?.into_vector_value();
        let offs = self.bld.build_int_add(start, offs, "sc.offs").map_err(llvm)?;
        for (st, v) in p.stores.iter().zip(&values) {
            let dt = p.params[st.param as usize].dtype;
            // Each lane's address: base + position · size (a point of the nest inside
            // the buffer; the lanes past the row's end masked off).
            let basei =
                self.bld.build_ptr_to_int(self.bufs[st.param as usize], i64t, "sc.base").map_err(llvm)?;
            let size = self.splat(i64t.const_int(dt_bytes(dt), false).into())?.into_vector_value();
            let bytes = self.bld.build_int_mul(offs, size, "sc.bytes").map_err(llvm)?;
            let basev = self.splat(basei.into())?.into_vector_value();
            let addrs = self.bld.build_int_add(basev, bytes, "sc.addrs").map_err(llvm)?;
            let pvt = vec_of(self.ptr_type(), self.w);
            let ptrs = self.bld.build_int_to_ptr(addrs, pvt.into_vector_type(), "sc.ptrs").map_err(llvm)?;
            let f = self.intrinsic("llvm.masked.scatter", &[v.get_type(), pvt])?;
            let align = i32t.const_int(dt_bytes(dt), false);
            self.call_void(f, &[(*v).into(), ptrs.into(), align.into(), mask.into()])?;
        }
        Ok(())
    }

    /// On a GPU, whether a vector access of `dt`s at `ptr` may be one wide
    /// access: its address aligned to the whole vector (16 bytes at most;
    /// that alignment is the second value). Else each element goes alone.
    /// The branch goes the same way for a warp's threads where their rows
    /// are aligned alike.
    fn alignment_test(&self, ptr: PointerValue<'static>, dt: DType) -> R<(IntValue<'static>, u32)> {
        let i64t = self.ctx.i64_type();
        let wide = (self.w as u64 * dt_bytes(dt)).min(16);
        let addr = self.bld.build_ptr_to_int(ptr, i64t, "addr").map_err(llvm)?;
        let low = self.bld.build_and(addr, i64t.const_int(wide - 1, false), "low").map_err(llvm)?;
        let aligned =
            self.bld.build_int_compare(IntPredicate::EQ, low, i64t.const_zero(), "aligned").map_err(llvm)?;
        Ok((aligned, wide as u32))
    }

    /// `cond ? a : d` as vectors, computing only the side taken.
    fn branch(&mut self, cond: IntValue<'static>, a: E, d: E) -> R<V> {
        self.choose(cond, &mut |g| g.emit_as(a, true), &mut |g| g.emit_as(d, true))
    }

    /// Where nest position `at` of parameter `param` lies, and its element type.
    fn param_ptr(&self, param: u32, at: IntValue<'static>) -> R<(PointerValue<'static>, DType)> {
        let dt = self.param_dtypes[param as usize];
        // SAFETY (of the IR): `at` is a position of the nest, inside the buffer.
        let ptr = unsafe { self.bld.build_gep(self.mty(dt, false), self.bufs[param as usize], &[at], "at") }
            .map_err(llvm)?;
        Ok((ptr, dt))
    }

    /// The output `param` at nest position `at` (a vector of the width from
    /// there when `vec`), as [`Gen::stores`] wrote it.
    fn load_at(&self, param: u32, at: IntValue<'static>, vec: bool) -> R<V> {
        let (ptr, dt) = self.param_ptr(param, at)?;
        let ty = self.mty(dt, vec);
        let v = self.bld.build_load(ty, ptr, "scr").map_err(llvm)?;
        crate::set_align(&v, dt.size() as u32);
        Ok(v)
    }

    /// Store `v` (a vector or a scalar) at nest position `at` of the output `param`.
    fn store_at(&self, param: u32, at: IntValue<'static>, v: V) -> R<()> {
        let (ptr, dt) = self.param_ptr(param, at)?;
        let s = self.bld.build_store(ptr, v).map_err(llvm)?;
        s.set_alignment(dt.size() as u32).map_err(llvm)?;
        Ok(())
    }

    /// Make `e` (a vector along `lane`, or a scalar) be `v` in the current scope.
    fn bind(&mut self, e: E, lane: Option<u32>, v: V) {
        if let Some(s) = self.scopes.last_mut() {
            s.insert((e, lane), v);
        }
    }

    fn zext(&self, v: V, to: BasicTypeEnum<'static>) -> R<V> {
        Ok(if v.is_vector_value() {
            self.bld
                .build_int_z_extend(v.into_vector_value(), to.into_vector_type(), "z")
                .map_err(llvm)?
                .into()
        } else {
            self.bld.build_int_z_extend(v.into_int_value(), to.into_int_type(), "z").map_err(llvm)?.into()
        })
    }

    /// `e` itself, or 1 where it is 0 (no division traps; a `Check` reports it).
    fn safe_divisor(&self, e: IntValue<'static>) -> R<IntValue<'static>> {
        let t = e.get_type();
        let z = self.bld.build_int_compare(IntPredicate::EQ, e, t.const_zero(), "z").map_err(llvm)?;
        Ok(self.bld.build_select(z, t.const_int(1, false), e, "d").map_err(llvm)?.into_int_value())
    }

    fn safe_divisor_any(&self, e: V) -> R<V> {
        if !e.is_vector_value() {
            return Ok(self.safe_divisor(e.into_int_value())?.into());
        }
        let v = e.into_vector_value();
        let t = v.get_type();
        let z = self.bld.build_int_compare(IntPredicate::EQ, v, t.const_zero(), "z").map_err(llvm)?;
        let ones = self.splat(t.get_element_type().into_int_type().const_int(1, false).into())?;
        self.bld.build_select(z, ones, v.into(), "d").map_err(llvm)
    }

    fn unary(&mut self, op: UnaryOp, a: V, dt: DType) -> R<V> {
        if self.device {
            if let Some(v) = self.lanewise(a, None, |g: &mut Self, x, _| g.device_unary(op, x, dt))? {
                return Ok(v);
            }
        }
        let b = self.bld;
        let ty = a.get_type();
        let float = dt.is_float();
        let fconst = |x: f64| -> R<V> { self.float_like(a, x) };
        Ok(match op {
            UnaryOp::Neg if float => fneg(b, a)?,
            UnaryOp::Neg => int_op(b, BinaryOp::Sub, self.zero_like(a)?, a, false)?,
            UnaryOp::Abs if float => self.call(self.intrinsic("llvm.fabs", &[ty])?, &[a.into()])?,
            UnaryOp::Abs => {
                let f = self.intrinsic("llvm.abs", &[ty])?;
                self.call(f, &[a.into(), self.ctx.bool_type().const_zero().into()])?
            }
            UnaryOp::Exp | UnaryOp::Tanh | UnaryOp::Erf | UnaryOp::Sigmoid if dt == DType::F32 => {
                self.vmath_f32(op, a)?
            }
            UnaryOp::Exp => self.call(self.intrinsic("llvm.exp", &[ty])?, &[a.into()])?,
            UnaryOp::Log => self.call(self.intrinsic("llvm.log", &[ty])?, &[a.into()])?,
            UnaryOp::Sqrt => self.call(self.intrinsic("llvm.sqrt", &[ty])?, &[a.into()])?,
            UnaryOp::Sin => self.call(self.intrinsic("llvm.sin", &[ty])?, &[a.into()])?,
            UnaryOp::Cos => self.call(self.intrinsic("llvm.cos", &[ty])?, &[a.into()])?,
            UnaryOp::Floor => self.call(self.intrinsic("llvm.floor", &[ty])?, &[a.into()])?,
            UnaryOp::Ceil => self.call(self.intrinsic("llvm.ceil", &[ty])?, &[a.into()])?,
            UnaryOp::Round => self.call(self.intrinsic("llvm.roundeven", &[ty])?, &[a.into()])?,
            UnaryOp::Reciprocal => float_op(b, BinaryOp::Div, fconst(1.0)?, a)?,
            UnaryOp::Tanh | UnaryOp::Erf | UnaryOp::Sigmoid => {
                // f64 and f16: through f32's polynomials would lose f64's precision; call libm.
                match op {
                    UnaryOp::Sigmoid => {
                        let e = self.call(self.intrinsic("llvm.exp", &[ty])?, &[fneg(b, a)?.into()])?;
                        let d = float_op(b, BinaryOp::Add, fconst(1.0)?, e)?;
                        float_op(b, BinaryOp::Div, fconst(1.0)?, d)?
                    }
                    _ => self.libm(if op == UnaryOp::Tanh { "tanh" } else { "erf" }, a, dt)?,
                }
            }
            UnaryOp::Relu if float => {
                let z = fconst(0.0)?;
                let lt = fcmp(b, FloatPredicate::OLT, a, z)?;
                select(b, lt, z, a)?
            }
            UnaryOp::Relu => {
                let f = self.intrinsic("llvm.smax", &[ty])?;
                self.call(f, &[a.into(), self.zero_like(a)?.into()])?
            }
            UnaryOp::Sign => {
                let (z, one) = (self.zero_like(a)?, if float { fconst(1.0)? } else { self.int_like(a, 1)? });
                let mone = if float { fconst(-1.0)? } else { self.int_like(a, -1)? };
                let (gt, lt) = if float {
                    (fcmp(b, FloatPredicate::OGT, a, z)?, fcmp(b, FloatPredicate::OLT, a, z)?)
                } else {
                    (icmp(b, IntPredicate::SGT, a, z)?, icmp(b, IntPredicate::SLT, a, z)?)
                };
                let s = select(b, lt, mone, a)?;
                let s = if float { s } else { select(b, lt, mone, z)? };
                select(b, gt, one, s)?
            }
            // Logical on bools (i1), bitwise on integers: both flip every bit.
            UnaryOp::Not => {
                let t = self.int_like(a, -1)?;
                int_op(b, BinaryOp::Xor, a, t, false)?
            }
            UnaryOp::IsNaN => fcmp(b, FloatPredicate::UNO, a, a)?,
            UnaryOp::IsInf => {
                let abs = self.call(self.intrinsic("llvm.fabs", &[ty])?, &[a.into()])?;
                fcmp(b, FloatPredicate::OEQ, abs, fconst(f64::INFINITY)?)?
            }
        })
    }

    /// [`plan::PwOp::Integer`]'s value of f32 `a` (a vector or one value).
    fn integer_f32(&self, a: V, offset: i32, lo: i32, hi: i32) -> R<V> {
        self.with_vmath(a, |m, v| m.integer(v, offset, lo, hi))
    }

    /// Whether f32 vectors here round to integers in one instruction
    /// ([`VMath::rounds_in_conversion`]).
    fn rounds_in_conversion(&self, offset: i32, lo: i32, hi: i32) -> bool {
        self.vmath(self.lty(DType::F32, true).into_vector_type()).rounds_in_conversion(offset, lo, hi)
    }

    /// Vector math on `vt` for this kernel's target (a GPU kernel keeps subnormals).
    fn vmath(&self, vt: inkwell::types::VectorType<'static>) -> VMath<'_> {
        let lanes = vt.get_size() as usize;
        VMath::new(self.ctx, self.module, self.bld, vt, lanes, self.features).on_device(self.device)
    }

    /// f32 `exp`, `tanh`, `erf` and `sigmoid` by the inline polynomials.
    fn vmath_f32(&self, op: UnaryOp, a: V) -> R<V> {
        self.with_vmath(a, |m, v| match op {
            UnaryOp::Exp => m.exp(v),
            UnaryOp::Tanh => m.tanh(v),
            UnaryOp::Erf => m.erf(v),
            _ => m.sigmoid(v),
        })
    }

    /// `f` of f32 `a` by [`VMath`] at `a`'s width (one value as a vector of one).
    fn with_vmath(
        &self,
        a: V,
        f: impl FnOnce(&VMath, VectorValue<'static>) -> Result<VectorValue<'static>, CodegenError>,
    ) -> R<V> {
        let scalar = !a.is_vector_value();
        let i32t = self.ctx.i32_type();
        let v = if scalar {
            let vt1 = self.ctx.f32_type().vec_type(1);
            self.bld.build_insert_element(vt1.get_poison(), a, i32t.const_zero(), "v1").map_err(llvm)?
        } else {
            a.into_vector_value()
        };
        let r = f(&self.vmath(v.get_type()), v)?;
        Ok(if scalar {
            self.bld.build_extract_element(r, i32t.const_zero(), "s").map_err(llvm)?
        } else {
            r.into()
        })
    }

    /// A C library function of one `double` (or `float`), applied lane by lane.
    fn libm(&mut self, name: &str, a: V, dt: DType) -> R<V> {
        let f64t = self.ctx.f64_type();
        let f = self
            .module
            .get_function(name)
            .unwrap_or_else(|| self.module.add_function(name, f64t.fn_type(&[f64t.into()], false), None));
        let one = |g: &mut Self, s: V, _: Option<V>| -> R<Option<V>> {
            let d = g.cast(s, dt, DType::F64)?;
            let r = g.call(f, &[d.into()])?;
            g.cast(r, DType::F64, dt).map(Some)
        };
        self.lanewise(a, None, one)?.ok_or_else(|| llvm(format!("no {name} of {dt:?}")))
    }

    /// `f` of `a` (and `c`), lane by lane where they are vectors (a C
    /// library call; a GPU's math forms, which are scalar code); `None`
    /// where `f` has no form for them.
    fn lanewise<F>(&mut self, a: V, c: Option<V>, mut f: F) -> R<Option<V>>
    where
        F: FnMut(&mut Self, V, Option<V>) -> R<Option<V>>,
    {
        if !a.is_vector_value() {
            return f(self, a, c);
        }
        let v = a.into_vector_value();
        let mut out: Option<VectorValue<'static>> = None;
        for i in 0..v.get_type().get_size() {
            let at = self.ctx.i32_type().const_int(i as u64, false);
            let x = self.bld.build_extract_element(v, at, "lx").map_err(llvm)?;
            let y = match c {
                Some(c) if c.is_vector_value() => {
                    Some(self.bld.build_extract_element(c.into_vector_value(), at, "ly").map_err(llvm)?)
                }
                other => other,
            };
            let Some(r) = f(self, x, y)? else { return Ok(None) };
            let acc = match out {
                Some(acc) => acc,
                None => vector_of(r, v.get_type().get_size())?,
            };
            out = Some(self.bld.build_insert_element(acc, r, at, "lr").map_err(llvm)?);
        }
        Ok(out.map(V::from))
    }

    fn zero_like(&self, a: V) -> R<V> {
        Ok(const_zero(a.get_type()))
    }

    fn scalar_type(&self, a: V) -> BasicTypeEnum<'static> {
        if a.is_vector_value() {
            a.into_vector_value().get_type().get_element_type()
        } else {
            a.get_type()
        }
    }

    /// `llvm.fpto[su]i.sat`'s result (out-of-range values saturate, NaN is
    /// zero) from operations that stay vectors: LLVM 19 takes the intrinsic
    /// apart into one scalar conversion per lane on x86. The value is clamped
    /// in its float type to the largest float the integer type holds, converted,
    /// and the two cases a clamp cannot say (past that float, NaN) selected.
    fn float_to_int_sat(&self, a: V, from: DType, to: DType) -> R<V> {
        let b = self.bld;
        let nb = int_bits(to) as u32;
        let (lo, hi): (i128, i128) = match to != DType::U8 {
            true => (-(1i128 << (nb - 1)), (1i128 << (nb - 1)) - 1),
            false => (0, (1i128 << nb) - 1),
        };
        // The largest float of `from` at most `hi`: `hi` itself where its bits fit
        // the significand, else the float just below `hi + 1` (a power of two).
        let significand = if from == DType::F32 { 24 } else { 53 };
        let hi_f = match 128 - hi.leading_zeros() <= significand {
            true => hi as f64,
            false => (hi + 1) as f64 * (1.0 - 2f64.powi(-(significand as i32))),
        };
        let lo = lo as f64;
        let (lo_v, hi_v) = (self.float_like(a, lo)?, self.float_like(a, hi_f)?);
        let clamped = {
            let x = select(b, fcmp(b, FloatPredicate::OLT, a, lo_v)?, lo_v, a)?;
            select(b, fcmp(b, FloatPredicate::OGT, x, hi_v)?, hi_v, x)?
        };
        // Narrow types convert through i32 (exact: the value is already in range).
        let wide = if nb < 32 { DType::I32 } else { to };
        let wt = self.lty(wide, true).into_vector_type();
        let mut r: V =
            b.build_float_to_signed_int(clamped.into_vector_value(), wt, "cvt").map_err(llvm)?.into();
        if nb < 32 {
            let tt = self.lty(to, true).into_vector_type();
            r = b.build_int_truncate(r.into_vector_value(), tt, "narrow").map_err(llvm)?.into();
        }
        if (hi_f as i128) < hi {
            let past = fcmp(b, FloatPredicate::OGT, a, hi_v)?;
            r = select(b, past, self.int_like(r, hi as i64)?, r)?;
        }
        let nan = fcmp(b, FloatPredicate::UNO, a, a)?;
        select(b, nan, self.zero_like(r)?, r)
    }

    fn float_like(&self, a: V, x: f64) -> R<V> {
        let s: V = self.scalar_type(a).into_float_type().const_float(x).into();
        if a.is_vector_value() {
            self.splat(s)
        } else {
            Ok(s)
        }
    }

    fn int_like(&self, a: V, x: i64) -> R<V> {
        let s: V = self.scalar_type(a).into_int_type().const_int(x as u64, true).into();
        if a.is_vector_value() {
            self.splat(s)
        } else {
            Ok(s)
        }
    }

    fn binary(&mut self, op: BinaryOp, a: V, c: V, dt: DType, nonneg: bool) -> R<V> {
        let b = self.bld;
        let ty = a.get_type();
        let unsigned = matches!(dt, DType::U8 | DType::Bool);
        if dt.is_float() {
            return Ok(match op {
                BinaryOp::Pow | BinaryOp::Mod if self.device => {
                    let f = |g: &mut Self, x: V, y: Option<V>| -> R<Option<V>> {
                        let y = y.ok_or_else(|| llvm("a binary operation without its operand"))?;
                        match op {
                            BinaryOp::Pow => g.device_pow(x, y, dt).map(Some),
                            _ => g.device_fmod(x, y, dt).map(Some),
                        }
                    };
                    self.lanewise(a, Some(c), f)?.ok_or_else(|| llvm("no device form"))?
                }
                BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div | BinaryOp::Mod => {
                    float_op(b, op, a, c)?
                }
                BinaryOp::Pow => self.call(self.intrinsic("llvm.pow", &[ty])?, &[a.into(), c.into()])?,
                BinaryOp::Max => nan_extreme(b, FloatPredicate::OGT, a, c)?,
                BinaryOp::Min => nan_extreme(b, FloatPredicate::OLT, a, c)?,
                BinaryOp::Equal => fcmp(b, FloatPredicate::OEQ, a, c)?,
                BinaryOp::Less => fcmp(b, FloatPredicate::OLT, a, c)?,
                BinaryOp::Greater => fcmp(b, FloatPredicate::OGT, a, c)?,
                BinaryOp::LessEq => fcmp(b, FloatPredicate::OLE, a, c)?,
                BinaryOp::GreaterEq => fcmp(b, FloatPredicate::OGE, a, c)?,
                BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => {
                    return Err(CodegenError::Unsupported(format!("{op:?} of floats")));
                }
            });
        }
        let p = |s: IntPredicate, u: IntPredicate| if unsigned { u } else { s };
        Ok(match op {
            BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => {
                int_op(b, op, a, c, unsigned)?
            }
            BinaryOp::Div => {
                let d = self.safe_divisor_any(c)?;
                int_op(b, BinaryOp::Div, a, d, unsigned || nonneg)?
            }
            BinaryOp::Mod => {
                let d = self.safe_divisor_any(c)?;
                let r = int_op(b, BinaryOp::Mod, a, d, unsigned || nonneg)?;
                if unsigned || nonneg {
                    r
                } else {
                    // The sign of the divisor (Python's %): add it back when the signs differ.
                    let z = self.zero_like(a)?;
                    let rnz = icmp(b, IntPredicate::NE, r, z)?;
                    let rneg = icmp(b, IntPredicate::SLT, r, z)?;
                    let dneg = icmp(b, IntPredicate::SLT, d, z)?;
                    let differ = int_op(b, BinaryOp::Xor, rneg, dneg, false)?;
                    let fix = int_op(b, BinaryOp::And, rnz, differ, false)?;
                    let sum = int_op(b, BinaryOp::Add, r, d, false)?;
                    select(b, fix, sum, r)?
                }
            }
            BinaryOp::Pow if self.device => {
                return Err(CodegenError::Unsupported(format!("Pow of {dt:?} has no GPU form yet")));
            }
            BinaryOp::Pow => {
                let fa = self.cast(a, dt, DType::F64)?;
                let fc = self.cast(c, dt, DType::F64)?;
                let r = self.call(self.intrinsic("llvm.pow", &[fa.get_type()])?, &[fa.into(), fc.into()])?;
                self.cast(r, DType::F64, dt)?
            }
            BinaryOp::Max => {
                let f = self.intrinsic(if unsigned { "llvm.umax" } else { "llvm.smax" }, &[ty])?;
                self.call(f, &[a.into(), c.into()])?
            }
            BinaryOp::Min => {
                let f = self.intrinsic(if unsigned { "llvm.umin" } else { "llvm.smin" }, &[ty])?;
                self.call(f, &[a.into(), c.into()])?
            }
            BinaryOp::Equal => icmp(b, IntPredicate::EQ, a, c)?,
            BinaryOp::Less => icmp(b, p(IntPredicate::SLT, IntPredicate::ULT), a, c)?,
            BinaryOp::Greater => icmp(b, p(IntPredicate::SGT, IntPredicate::UGT), a, c)?,
            BinaryOp::LessEq => icmp(b, p(IntPredicate::SLE, IntPredicate::ULE), a, c)?,
            BinaryOp::GreaterEq => icmp(b, p(IntPredicate::SGE, IntPredicate::UGE), a, c)?,
        })
    }

    /// f64 → f16 rounded once, through f32: the f32 step rounds to odd (toward
    /// zero, its last bit set when inexact), after which rounding to f16's 11
    /// bits gives the f64 value's own rounding (x86 converts f32 to f16 in one
    /// instruction, f64 to f16 only through compiler-rt's `__truncdfhf2`, which
    /// generated code cannot call).
    fn f64_to_f16(&self, a: V) -> R<V> {
        let b = self.bld;
        let vec = a.is_vector_value();
        let (f32t, i32t) = (self.lty(DType::F32, vec), self.lty(DType::I32, vec));
        let (f64t, f16t) = (self.lty(DType::F64, vec), self.lty(DType::F16, vec));
        let t = self.cast_float(a, f32t, false)?;
        let back = self.cast_float(t, f64t, true)?;
        let fabs = self.intrinsic("llvm.fabs", &[f64t])?;
        let (abs_a, abs_back) = (self.call(fabs, &[a.into()])?, self.call(fabs, &[back.into()])?);
        let bits = b.build_bit_cast(t, i32t, "bits").map_err(llvm)?;
        let one = V::from(self.ctx.i32_type().const_int(1, false));
        let one = if vec { self.splat(one)? } else { one };
        // Toward zero: one step down in magnitude where round-to-nearest went up.
        let up = fcmp(b, FloatPredicate::OGT, abs_back, abs_a)?;
        let down = int_op(b, BinaryOp::Sub, bits, one, false)?;
        let toward_zero = select(b, up, down, bits)?;
        // Odd when inexact (NaN compares unordered: left as it is).
        let inexact = fcmp(b, FloatPredicate::ONE, back, a)?;
        let odd = int_op(b, BinaryOp::Or, toward_zero, one, false)?;
        let r = select(b, inexact, odd, toward_zero)?;
        let r = b.build_bit_cast(r, f32t, "odd").map_err(llvm)?;
        self.cast_float(r, f16t, false)
    }

    /// An i32 constant, a vector of it when `vec`.
    fn i32_const(&self, c: u32, vec: bool) -> R<V> {
        let v = V::from(self.ctx.i32_type().const_int(c as u64, false));
        if vec {
            self.splat(v)
        } else {
            Ok(v)
        }
    }

    /// f32 → bf16 (its bits, an i16), rounded to nearest even, a NaN kept a
    /// quiet NaN (`ir::f32_to_bf16`): integer arithmetic, alike on every
    /// target (x86 rounds to bf16 only through a library call that generated
    /// code cannot make, and the host emulator runs the GPU's code on x86).
    fn f32_to_bf16(&self, a: V) -> R<V> {
        let b = self.bld;
        let vec = a.is_vector_value();
        let (i32t, i16t) = (self.lty(DType::I32, vec), self.lty(DType::BF16, vec));
        let bits = b.build_bit_cast(a, i32t, "bits").map_err(llvm)?;
        let high = self.shift(bits, 16, false)?;
        let lsb = int_op(b, BinaryOp::And, high, self.i32_const(1, vec)?, true)?;
        let r = int_op(b, BinaryOp::Add, bits, self.i32_const(0x7fff, vec)?, true)?;
        let r = int_op(b, BinaryOp::Add, r, lsb, true)?;
        let rounded = self.shift(r, 16, false)?;
        let quiet = int_op(b, BinaryOp::Or, high, self.i32_const(0x40, vec)?, true)?;
        let nan = fcmp(b, FloatPredicate::UNO, a, a)?;
        let h = select(b, nan, quiet, rounded)?;
        Ok(if vec {
            b.build_int_truncate(h.into_vector_value(), i16t.into_vector_type(), "bf").map_err(llvm)?.into()
        } else {
            b.build_int_truncate(h.into_int_value(), i16t.into_int_type(), "bf").map_err(llvm)?.into()
        })
    }

    /// bf16 bits (an i16) → f32.
    fn bf16_to_f32(&self, a: V) -> R<V> {
        let b = self.bld;
        let vec = a.is_vector_value();
        let (i32t, f32t) = (self.lty(DType::I32, vec), self.lty(DType::F32, vec));
        let wide = self.zext(a, i32t)?;
        let bits = self.shift(wide, 16, true)?;
        b.build_bit_cast(bits, f32t, "f").map_err(llvm)
    }

    /// `x << n` (`left`) or `x >> n` (logical) of an i32, or a vector of them.
    fn shift(&self, x: V, n: u32, left: bool) -> R<V> {
        let b = self.bld;
        let n = self.i32_const(n, x.is_vector_value())?;
        macro_rules! go {
            ($x:expr, $n:expr) => {
                if left { b.build_left_shift($x, $n, "sl") } else { b.build_right_shift($x, $n, false, "sr") }
                    .map_err(llvm)?
                    .into()
            };
        }
        Ok(if x.is_vector_value() {
            go!(x.into_vector_value(), n.into_vector_value())
        } else {
            go!(x.into_int_value(), n.into_int_value())
        })
    }

    /// A float conversion, scalar or vector (`ext`: widening).
    fn cast_float(&self, a: V, t: BasicTypeEnum<'static>, ext: bool) -> R<V> {
        let b = self.bld;
        Ok(if a.is_vector_value() {
            let (v, t) = (a.into_vector_value(), t.into_vector_type());
            if ext { b.build_float_ext(v, t, "fx") } else { b.build_float_trunc(v, t, "ft") }
                .map_err(llvm)?
                .into()
        } else {
            let (v, t) = (a.into_float_value(), t.into_float_type());
            if ext { b.build_float_ext(v, t, "fx") } else { b.build_float_trunc(v, t, "ft") }
                .map_err(llvm)?
                .into()
        })
    }

    fn cast(&self, a: V, from: DType, to: DType) -> R<V> {
        let b = self.bld;
        let vec = a.is_vector_value();
        let tt = self.lty(to, vec);
        if from == to {
            return Ok(a);
        }
        if to == DType::BF16 {
            let f = self.cast(a, from, DType::F32)?;
            return self.f32_to_bf16(f);
        }
        if from == DType::BF16 {
            let f = self.bf16_to_f32(a)?;
            return self.cast(f, DType::F32, to);
        }
        let ff = from.is_float();
        let tf = to.is_float();
        let from_unsigned = matches!(from, DType::U8 | DType::Bool);
        if (from, to) == (DType::F64, DType::F16) {
            return self.f64_to_f16(a);
        }
        Ok(match (ff, tf) {
            (true, true) => self.cast_float(a, tt, from.size() < to.size())?,
            (true, false) if to == DType::Bool => {
                let z = self.zero_like(a)?;
                fcmp(b, FloatPredicate::UNE, a, z)?
            }
            (true, false) if vec && matches!(from, DType::F32 | DType::F64) => {
                self.float_to_int_sat(a, from, to)?
            }
            (true, false) => {
                let name = if to == DType::U8 { "llvm.fptoui.sat" } else { "llvm.fptosi.sat" };
                let f = self.intrinsic(name, &[tt, a.get_type()])?;
                self.call(f, &[a.into()])?
            }
            (false, true) => {
                if vec {
                    let (v, t) = (a.into_vector_value(), tt.into_vector_type());
                    if from_unsigned {
                        b.build_unsigned_int_to_float(v, t, "cv")
                    } else {
                        b.build_signed_int_to_float(v, t, "cv")
                    }
                    .map_err(llvm)?
                    .into()
                } else {
                    let (v, t) = (a.into_int_value(), tt.into_float_type());
                    if from_unsigned {
                        b.build_unsigned_int_to_float(v, t, "cv")
                    } else {
                        b.build_signed_int_to_float(v, t, "cv")
                    }
                    .map_err(llvm)?
                    .into()
                }
            }
            (false, false) if to == DType::Bool => {
                let z = self.zero_like(a)?;
                icmp(b, IntPredicate::NE, a, z)?
            }
            (false, false) => {
                let (fs, ts) = (int_bits(from), int_bits(to));
                macro_rules! ext {
                    ($v:expr, $t:expr) => {
                        if fs > ts {
                            b.build_int_truncate($v, $t, "it")
                        } else if fs == ts {
                            return Ok(a);
                        } else if from_unsigned {
                            b.build_int_z_extend($v, $t, "iz")
                        } else {
                            b.build_int_s_extend($v, $t, "is")
                        }
                        .map_err(llvm)?
                        .into()
                    };
                }
                if vec {
                    ext!(a.into_vector_value(), tt.into_vector_type())
                } else {
                    ext!(a.into_int_value(), tt.into_int_type())
                }
            }
        })
    }

    fn identity(&self, c: Combine, dt: DType) -> R<V> {
        let big = match dt {
            DType::I8 => (i8::MIN as i64, i8::MAX as i64),
            DType::U8 | DType::Bool => (0, 255),
            DType::I32 => (i32::MIN as i64, i32::MAX as i64),
            _ => (i64::MIN, i64::MAX),
        };
        let (f, i) = match c {
            Combine::Sum => (0.0, 0),
            Combine::Prod => (1.0, 1),
            Combine::Max => (f64::NEG_INFINITY, big.0),
            Combine::Min => (f64::INFINITY, big.1),
        };
        self.constant(dt, if dt.is_float() { f.to_bits() } else { i as u64 })
    }

    /// x86's `maxps`/`minps` of `ty` (f32 vectors of 8 or 16 lanes on a CPU):
    /// `x > a ? x : a` in one instruction that LLVM does not fold with the NaN
    /// rule's select, so a window's chain of maxima is two instructions a step.
    fn x86_extreme(&self, ty: BasicTypeEnum<'static>) -> Option<(&'static str, &'static str)> {
        let v = ty.is_vector_type().then(|| ty.into_vector_type())?;
        if self.device
            || !v.get_element_type().is_float_type()
            || v.get_element_type().into_float_type() != self.ctx.f32_type()
        {
            return None;
        }
        // A CPU's loop programs need AVX2 (8 lanes) or AVX-512 (16).
        match v.get_size() {
            16 => Some(("llvm.x86.avx512.max.ps.512", "llvm.x86.avx512.min.ps.512")),
            8 => Some(("llvm.x86.avx.max.ps.256", "llvm.x86.avx.min.ps.256")),
            _ => None,
        }
    }

    fn x86_fn(&self, name: &str, ty: BasicTypeEnum<'static>) -> R<FunctionValue<'static>> {
        if let Some(f) = self.module.get_function(name) {
            return Ok(f);
        }
        let v = ty.into_vector_type();
        let mut params: Vec<inkwell::types::BasicMetadataTypeEnum> = vec![v.into(), v.into()];
        if v.get_size() == 16 {
            params.push(self.ctx.i32_type().into());
        }
        Ok(self.module.add_function(name, v.fn_type(&params, false), None))
    }

    fn combine(&self, c: Combine, a: V, x: V, dt: DType) -> R<V> {
        let b = self.bld;
        let ty = a.get_type();
        let unsigned = matches!(dt, DType::U8 | DType::Bool);
        Ok(match (c, dt.is_float()) {
            (Combine::Sum, true) => float_op(b, BinaryOp::Add, a, x)?,
            (Combine::Prod, true) => float_op(b, BinaryOp::Mul, a, x)?,
            (Combine::Max | Combine::Min, true) if self.x86_extreme(ty).is_some() => {
                let name = self.x86_extreme(ty).map(|(max, min)| if c == Combine::Max { max } else { min });
                let f = self.x86_fn(name.unwrap_or_default(), ty)?;
                let mut args: Vec<BasicMetadataValueEnum> = vec![x.into(), a.into()];
                if ty.into_vector_type().get_size() == 16 {
                    args.push(self.ctx.i32_type().const_int(4, false).into());
                }
                let kept = self.call(f, &args)?;
                let nan = fcmp(b, FloatPredicate::UNO, x, x)?;
                select(b, nan, x, kept)?
            }
            (Combine::Max, true) => nan_extreme(b, FloatPredicate::OGT, a, x)?,
            (Combine::Min, true) => nan_extreme(b, FloatPredicate::OLT, a, x)?,
            (Combine::Sum, false) => int_op(b, BinaryOp::Add, a, x, unsigned)?,
            (Combine::Prod, false) => int_op(b, BinaryOp::Mul, a, x, unsigned)?,
            (Combine::Max, false) => {
                let f = self.intrinsic(if unsigned { "llvm.umax" } else { "llvm.smax" }, &[ty])?;
                self.call(f, &[a.into(), x.into()])?
            }
            (Combine::Min, false) => {
                let f = self.intrinsic(if unsigned { "llvm.umin" } else { "llvm.smin" }, &[ty])?;
                self.call(f, &[a.into(), x.into()])?
            }
        })
    }

    /// Combine a vector's lanes by halving it. A float maximum or minimum
    /// halves with the plain comparison (one `maxps` a step) and asks once,
    /// beside the halving, whether any lane is NaN (then the result is NaN): the
    /// NaN rule at every step made the row's last reduction a chain of four
    /// dependent instructions a step, 17% of a softmax over rows of 256.
    fn horizontal(&self, c: Combine, v: V, dt: DType) -> R<V> {
        let i32t = self.ctx.i32_type();
        let extreme = dt.is_float() && matches!(c, Combine::Max | Combine::Min);
        let nan = if extreme {
            let uno = fcmp(self.bld, FloatPredicate::UNO, v, v)?;
            let any = self.intrinsic("llvm.vector.reduce.or", &[uno.get_type()])?;
            Some(self.call(any, &[uno.into()])?)
        } else {
            None
        };
        let mut v = v.into_vector_value();
        let mut w = v.get_type().get_size();
        while w > 1 {
            let h = w / 2;
            let lo: Vec<IntValue> = (0..h).map(|i| i32t.const_int(i as u64, false)).collect();
            let hi: Vec<IntValue> = (h..w).map(|i| i32t.const_int(i as u64, false)).collect();
            let a = self.bld.build_shuffle_vector(v, v, VectorType::const_vector(&lo), "lo").map_err(llvm)?;
            let b = self.bld.build_shuffle_vector(v, v, VectorType::const_vector(&hi), "hi").map_err(llvm)?;
            v = if extreme {
                // `b` where it beats `a`, else `a` (NaNs are settled below).
                let beats = if c == Combine::Max { FloatPredicate::OGT } else { FloatPredicate::OLT };
                let better = fcmp(self.bld, beats, b.into(), a.into())?;
                select(self.bld, better, b.into(), a.into())?.into_vector_value()
            } else {
                self.combine(c, a.into(), b.into(), dt)?.into_vector_value()
            };
            w = h;
        }
        let h = self.bld.build_extract_element(v, i32t.const_zero(), "h").map_err(llvm)?;
        match nan {
            Some(nan) => select(self.bld, nan, self.constant(dt, f64::NAN.to_bits())?, h),
            None => Ok(h),
        }
    }

    /// A reduction: nested loops over its variables. In vector mode (a column
    /// reduction, one result per lane) every variable is a scalar loop; in
    /// scalar mode the last variable runs in vectors when the body depends on
    /// it, with a horizontal step and a scalar tail.
    fn reduce(&mut self, c: Combine, vars: &[u32], body: E, dt: DType, vec: bool) -> R<V> {
        // A warp shares this reduction, not the ones inside its body (each lane
        // computes those whole: a shuffle needs every lane, in step).
        let lane = self.warp_lane.take();
        let r = (|| {
            // What the body needs that does not depend on this reduction is
            // computed before its loop, where the lanes are still in step: a
            // reduction there is shared too (LayerNorm's mean in its variance).
            let all = vars.iter().fold(0u64, |m, v| m | 1 << v);
            self.warp_lane = lane;
            let hoisted = self.hoist(&[body], all, vec);
            self.warp_lane = None;
            hoisted?;
            let init = self.identity(c, dt)?;
            let init = if vec { self.splat(init)? } else { init };
            // The lane's share: every 32nd term of the last variable from its
            // own, so that the warp reads consecutive elements together.
            let outer = self.reduce_lanes;
            if let (Some(l), Some(last)) = (lane, vars.last()) {
                self.reduce_lanes = Some((*last, l));
            }
            let acc = self.reduce_level(c, vars, body, dt, vec, init);
            self.reduce_lanes = outer;
            let acc = acc?;
            match lane {
                Some(_) => self.warp_combine(c, acc, dt),
                None => Ok(acc),
            }
        })();
        self.warp_lane = lane;
        r
    }

    /// The lanes' partials combined by butterfly shuffles (xor 16, 8, 4, 2,
    /// 1): each step combines two lanes' values in both (commutatively), so
    /// every lane ends with the same bits.
    fn warp_combine(&self, c: Combine, acc: V, dt: DType) -> R<V> {
        let mut v = acc;
        let mut off = plan::gpu::WARP / 2;
        while off > 0 {
            let other = self.shuffle_xor(v, off, dt)?;
            v = self.combine(c, v, other, dt)?;
            off /= 2;
        }
        Ok(v)
    }

    /// The value (of type `dt`) lane `lane ^ off` of the warp holds
    /// (`shfl.sync.bfly` over 32-bit words: wider values in two, narrower
    /// widened).
    fn shuffle_xor(&self, v: V, off: u32, dt: DType) -> R<V> {
        let (b, i32t) = (self.bld, self.ctx.i32_type());
        let f = self.shfl_i32()?;
        let word = |x: IntValue<'static>| -> R<IntValue<'static>> {
            let args = [
                i32t.const_all_ones().into(),
                x.into(),
                i32t.const_int(off as u64, false).into(),
                i32t.const_int(31, false).into(),
            ];
            Ok(self.call(f, &args)?.into_int_value())
        };
        let ty = v.get_type();
        let bits = if dt == DType::Bool { 1 } else { 8 * dt.size() as u32 };
        let int_ty = self
            .ctx
            .custom_width_int_type(std::num::NonZeroU32::new(bits).ok_or_else(|| llvm("a 0-bit value"))?)
            .map_err(llvm)?;
        let as_int = if ty.is_int_type() {
            v.into_int_value()
        } else {
            b.build_bit_cast(v, int_ty, "bits").map_err(llvm)?.into_int_value()
        };
        let out = match bits {
            64 => {
                let i64t = self.ctx.i64_type();
                let lo = b.build_int_truncate(as_int, i32t, "lo").map_err(llvm)?;
                let hi = b.build_right_shift(as_int, i64t.const_int(32, false), false, "hi").map_err(llvm)?;
                let hi = b.build_int_truncate(hi, i32t, "hi32").map_err(llvm)?;
                let (lo, hi) = (word(lo)?, word(hi)?);
                let lo = b.build_int_z_extend(lo, i64t, "lo64").map_err(llvm)?;
                let hi = b.build_int_z_extend(hi, i64t, "hi64").map_err(llvm)?;
                let hi = b.build_left_shift(hi, i64t.const_int(32, false), "hish").map_err(llvm)?;
                b.build_or(lo, hi, "w").map_err(llvm)?
            }
            32 => word(as_int)?,
            _ => {
                let wide = b.build_int_z_extend(as_int, i32t, "wide").map_err(llvm)?;
                b.build_int_truncate(word(wide)?, int_ty, "narrow").map_err(llvm)?
            }
        };
        Ok(if ty.is_int_type() { out.into() } else { b.build_bit_cast(out, ty, "val").map_err(llvm)? })
    }

    fn shfl_i32(&self) -> R<FunctionValue<'static>> {
        let name = "llvm.nvvm.shfl.sync.bfly.i32";
        if let Some(f) = self.module.get_function(name) {
            return Ok(f);
        }
        let i32t = self.ctx.i32_type();
        let ty = i32t.fn_type(&[i32t.into(), i32t.into(), i32t.into(), i32t.into()], false);
        Ok(self.module.add_function(name, ty, None))
    }

    /// A warp lane's share of a reduction along `v` up to `hi`, in vectors of
    /// the width (a GPU's 16-byte loads of f32): the lane takes the `w` terms
    /// from `w·lane`, then every `32·w`th on, as long as a whole vector fits;
    /// its lanes combined, then the last `hi mod w` terms one a lane.
    #[allow(clippy::too_many_arguments)]
    fn warp_quads(
        &mut self,
        c: Combine,
        v: u32,
        body: E,
        dt: DType,
        lane: IntValue<'static>,
        hi: IntValue<'static>,
        acc: V,
    ) -> R<V> {
        let (w, warp) = (self.w as u64, plan::gpu::WARP as u64);
        let (b, i64t) = (self.bld, self.ctx.i64_type());
        let lane64 = b.build_int_z_extend(lane, i64t, "lane64").map_err(llvm)?;
        let lo = b.build_int_mul(lane64, i64t.const_int(w, false), "quad").map_err(llvm)?;
        // `iv + 32·w <= hi - w + 32·w` is `iv + w <= hi`.
        let bound = b.build_int_add(hi, i64t.const_int(warp * w - w, false), "qbound").map_err(llvm)?;
        let saved = self.lane.replace(v);
        let vinit = self.splat(self.identity(c, dt)?)?;
        let res = self.for_loop(lo, bound, warp * w, vec![vinit], &mut |g, iv, accs| {
            g.vars.insert(v, iv);
            let x = g.emit_as(body, true)?;
            Ok(vec![g.combine(c, accs[0], x, dt)?])
        });
        self.lane = saved;
        let h = self.horizontal(c, res?.1[0], dt)?;
        let acc = self.combine(c, acc, h, dt)?;
        // The terms past the last whole vector: one a lane.
        let b = self.bld;
        let whole = b.build_and(hi, i64t.const_int(!(w - 1), true), "whole").map_err(llvm)?;
        let first = b.build_int_add(whole, lane64, "rest").map_err(llvm)?;
        let bound = b.build_int_add(hi, i64t.const_int(warp - 1, false), "rbound").map_err(llvm)?;
        let out = self.for_loop(first, bound, warp, vec![acc], &mut |g, iv, accs| {
            g.vars.insert(v, iv);
            let x = g.emit_as(body, false)?;
            Ok(vec![g.combine(c, accs[0], x, dt)?])
        })?;
        Ok(out.1[0])
    }

    fn reduce_level(&mut self, c: Combine, vars: &[u32], body: E, dt: DType, vec: bool, acc: V) -> R<V> {
        let (v, rest) = (vars[0], &vars[1..]);
        let (zero, hi) = match self.reduce_range {
            // A split reduction's partial: this variable's share only.
            Some((rv, lo, hi)) if rv == v => (lo, hi),
            _ => {
                let ext = self.x.extents[v as usize];
                (self.ctx.i64_type().const_zero(), self.emit(ext, false)?.into_int_value())
            }
        };
        if let Some((_, lane)) = self.reduce_lanes.filter(|(lv, _)| *lv == v && rest.is_empty()) {
            if !vec && self.w > 1 && self.x.free(body) & (1u64 << v) != 0 && !self.x.reduction_on(body, v) {
                return self.warp_quads(c, v, body, dt, lane, hi, acc);
            }
            // A warp's lane: terms `lane, lane + 32, …` (`iv + 32 <= hi + 31`
            // is `iv < hi`).
            let w = plan::gpu::WARP as u64;
            let i64t = self.ctx.i64_type();
            let lo = self.bld.build_int_z_extend(lane, i64t, "lane64").map_err(llvm)?;
            let bound = self.bld.build_int_add(hi, i64t.const_int(w - 1, false), "bound").map_err(llvm)?;
            let out = self.for_loop(lo, bound, w, vec![acc], &mut |g, iv, accs| {
                g.vars.insert(v, iv);
                let x = g.emit_as(body, vec)?;
                Ok(vec![g.combine(c, accs[0], x, dt)?])
            })?;
            return Ok(out.1[0]);
        }
        let inner_mask = rest.iter().fold(0u64, |m, r| m | 1 << r);
        if !rest.is_empty() {
            let out = self.for_loop(zero, hi, 1, vec![acc], &mut |g, iv, accs| {
                g.vars.insert(v, iv);
                g.hoist(&[body], inner_mask, vec)?;
                Ok(vec![g.reduce_level(c, rest, body, dt, vec, accs[0])?])
            })?;
            return Ok(out.1[0]);
        }
        // A reduction inside the body that depends on `v` would be summed in
        // order per lane, unlike its copy computed at a point (along its own
        // last axis, see `plan::OnePointWhy::NestedReduction`): `v` loops.
        let vectorize = !vec
            && !self.device
            && self.x.free(body) & (1u64 << v) != 0
            && self.w > 1
            && !self.x.reduction_on(body, v);
        if !vectorize && self.scratch.is_some_and(|s| s.0 == body) {
            // The scratch needs every term stored: not on this path.
            return Err(llvm("a row scratch on a reduction that is not vectorized"));
        }
        if !vectorize {
            let out = self.for_loop(zero, hi, 1, vec![acc], &mut |g, iv, accs| {
                g.vars.insert(v, iv);
                let x = g.emit_as(body, vec)?;
                Ok(vec![g.combine(c, accs[0], x, dt)?])
            })?;
            return Ok(out.1[0]);
        }
        // Along the last variable: vectors, their lanes combined, then the tail.
        // The row scratch: this sum's terms are stored where the row's output goes.
        let scratch = self.scratch.filter(|s| s.0 == body && c == Combine::Sum);
        let keep = |g: &Self, iv: IntValue<'static>, x: V| -> R<()> {
            match scratch {
                Some((_, param, base)) => {
                    let at = g.bld.build_int_add(base, iv, "at").map_err(llvm)?;
                    g.store_at(param, at, x)
                }
                None => Ok(()),
            }
        };
        // `UNROLL` vectors per step, each into an accumulator of its own (one
        // chain would wait on the add's latency at every vector; BladeDISC §5.1),
        // then single vectors, then the lanes.
        let saved = self.lane.replace(v);
        let vinit = self.splat(self.identity(c, dt)?)?;
        let w = self.w as u64;
        let i64t = self.ctx.i64_type();
        let res = self.for_loop(zero, hi, UNROLL * w, vec![vinit; UNROLL as usize], &mut |g, iv, accs| {
            let mut out = Vec::with_capacity(accs.len());
            for (u, acc) in accs.into_iter().enumerate() {
                let at =
                    g.bld.build_int_add(iv, i64t.const_int(u as u64 * w, false), "iv.u").map_err(llvm)?;
                // A scope per copy: the values it computes depend on its own index.
                g.scopes.push(HashMap::new());
                g.vars.insert(v, at);
                let x = g.emit_as(body, true);
                g.scopes.pop();
                let x = x?;
                keep(g, at, x)?;
                out.push(g.combine(c, acc, x, dt)?);
            }
            Ok(out)
        });
        let res = res.and_then(|(done, mut accs)| {
            // The accumulators pairwise (a tree, not a chain of dependent steps).
            while accs.len() > 1 {
                let mut next = Vec::with_capacity(accs.len().div_ceil(2));
                for pair in accs.chunks(2) {
                    next.push(match *pair {
                        [a, b] => self.combine(c, a, b, dt)?,
                        _ => pair[0],
                    });
                }
                accs = next;
            }
            let acc = accs[0];
            self.for_loop(done, hi, w, vec![acc], &mut |g, iv, accs| {
                g.vars.insert(v, iv);
                let x = g.emit_as(body, true)?;
                keep(g, iv, x)?;
                Ok(vec![g.combine(c, accs[0], x, dt)?])
            })
        });
        self.lane = saved;
        let (done, vacc) = res?;
        let h = self.horizontal(c, vacc[0], dt)?;
        let acc = self.combine(c, acc, h, dt)?;
        let out = self.for_loop(done, hi, 1, vec![acc], &mut |g, iv, accs| {
            g.vars.insert(v, iv);
            let x = g.emit_as(body, false)?;
            keep(g, iv, x)?;
            Ok(vec![g.combine(c, accs[0], x, dt)?])
        })?;
        Ok(out.1[0])
    }

    /// `if cond { then } else { other }`, each side in a block and a scope of its own.
    fn if_else(
        &mut self,
        cond: IntValue<'static>,
        then: &mut dyn FnMut(&mut Self) -> R<()>,
        other: &mut dyn FnMut(&mut Self) -> R<()>,
    ) -> R<()> {
        let b = self.bld;
        let f = b.get_insert_block().and_then(|bb| bb.get_parent()).ok_or_else(|| llvm("no function"))?;
        let (t, e, join) = (
            self.ctx.append_basic_block(f, "then"),
            self.ctx.append_basic_block(f, "else"),
            self.ctx.append_basic_block(f, "join"),
        );
        b.build_conditional_branch(cond, t, e).map_err(llvm)?;
        for (bb, first) in [(t, true), (e, false)] {
            b.position_at_end(bb);
            self.scopes.push(HashMap::new());
            let r = if first { then(self) } else { other(self) };
            self.scopes.pop();
            r?;
            b.build_unconditional_branch(join).map_err(llvm)?;
        }
        b.position_at_end(join);
        Ok(())
    }

    /// `for iv = lo; iv + step <= hi; iv += step` with loop-carried values; the
    /// body runs in a scope of its own. Returns the final `iv` and carried values.
    #[allow(clippy::type_complexity)]
    fn for_loop(
        &mut self,
        lo: IntValue<'static>,
        hi: IntValue<'static>,
        step: u64,
        carried: Vec<V>,
        body: &mut dyn FnMut(&mut Self, IntValue<'static>, Vec<V>) -> R<Vec<V>>,
    ) -> R<(IntValue<'static>, Vec<V>)> {
        let b = self.bld;
        let f = b.get_insert_block().and_then(|bb| bb.get_parent()).ok_or_else(|| llvm("no function"))?;
        let pre = b.get_insert_block().ok_or_else(|| llvm("no block"))?;
        let header = self.ctx.append_basic_block(f, "loop");
        let body_bb = self.ctx.append_basic_block(f, "body");
        let exit = self.ctx.append_basic_block(f, "exit");
        b.build_unconditional_branch(header).map_err(llvm)?;
        b.position_at_end(header);
        let i64t = self.ctx.i64_type();
        let iv = b.build_phi(i64t, "iv").map_err(llvm)?;
        let mut phis = Vec::with_capacity(carried.len());
        for c in &carried {
            phis.push(b.build_phi(c.get_type(), "acc").map_err(llvm)?);
        }
        let ivv = iv.as_basic_value().into_int_value();
        let next = b.build_int_add(ivv, i64t.const_int(step, false), "next").map_err(llvm)?;
        let more = b.build_int_compare(IntPredicate::SLE, next, hi, "more").map_err(llvm)?;
        b.build_conditional_branch(more, body_bb, exit).map_err(llvm)?;
        b.position_at_end(body_bb);
        self.scopes.push(HashMap::new());
        let accs: Vec<V> = phis.iter().map(|p| p.as_basic_value()).collect();
        let out = body(self, ivv, accs);
        self.scopes.pop();
        let out = out?;
        let latch = b.get_insert_block().ok_or_else(|| llvm("no block"))?;
        b.build_unconditional_branch(header).map_err(llvm)?;
        iv.add_incoming(&[(&lo, pre), (&next, latch)]);
        for (p, (c, o)) in phis.iter().zip(carried.iter().zip(&out)) {
            p.add_incoming(&[(c as &dyn BasicValue, pre), (o as &dyn BasicValue, latch)]);
        }
        b.position_at_end(exit);
        Ok((ivv, phis.iter().map(|p| p.as_basic_value()).collect()))
    }
}

/// A call's value (an error for a call that returns nothing).
pub(crate) fn basic(c: inkwell::values::CallSiteValue<'static>) -> R<V> {
    match c.try_as_basic_value() {
        inkwell::values::ValueKind::Basic(v) => Ok(v),
        inkwell::values::ValueKind::Instruction(_) => Err(llvm("a call returned nothing")),
    }
}

fn vec_of(s: BasicTypeEnum<'static>, w: u32) -> BasicTypeEnum<'static> {
    match s {
        BasicTypeEnum::FloatType(f) => f.vec_type(w).into(),
        BasicTypeEnum::IntType(i) => i.vec_type(w).into(),
        BasicTypeEnum::PointerType(p) => p.vec_type(w).into(),
        other => other,
    }
}

fn poison(t: BasicTypeEnum<'static>) -> VectorValue<'static> {
    t.into_vector_type().get_poison()
}

fn const_zero(t: BasicTypeEnum<'static>) -> V {
    match t {
        BasicTypeEnum::FloatType(f) => f.const_zero().into(),
        BasicTypeEnum::IntType(i) => i.const_zero().into(),
        BasicTypeEnum::VectorType(v) => v.const_zero().into(),
        BasicTypeEnum::PointerType(p) => p.const_null().into(),
        BasicTypeEnum::ArrayType(a) => a.const_zero().into(),
        BasicTypeEnum::StructType(s) => s.const_zero().into(),
        BasicTypeEnum::ScalableVectorType(s) => s.const_zero().into(),
    }
}

/// The larger (`OGT`) or smaller (`OLT`) of `a` and `x` with the reference's
/// NaN rule: a NaN on either side is the result, and `a` where they compare
/// equal (`-0` against `+0` too). `x` if NaN, else `x` if it beats `a` (never
/// when `a` is NaN): on x86 one `maxps`/`minps` (which returns its second
/// operand when unordered) and a NaN test of `x`, where `llvm.maximum` also
/// orders the zeros by sign (twice as many instructions in a row reduction).
fn nan_extreme(b: &Builder<'static>, beats: FloatPredicate, a: V, x: V) -> R<V> {
    let better = fcmp(b, beats, x, a)?;
    let kept = select(b, better, x, a)?;
    let nan = fcmp(b, FloatPredicate::UNO, x, x)?;
    select(b, nan, x, kept)
}

/// `c ? a : d`, `c` an `i1` or a vector of them (lane by lane).
fn select(b: &Builder<'static>, c: V, a: V, d: V) -> R<V> {
    if c.is_vector_value() {
        b.build_select(c.into_vector_value(), a, d, "sel").map_err(llvm)
    } else {
        b.build_select(c.into_int_value(), a, d, "sel").map_err(llvm)
    }
}

fn dt_bytes(d: DType) -> u64 {
    if d == DType::Bool {
        1
    } else {
        d.size() as u64
    }
}

fn int_bits(d: DType) -> usize {
    if d == DType::Bool {
        1
    } else {
        d.size() * 8
    }
}

fn fneg(b: &Builder<'static>, a: V) -> R<V> {
    Ok(if a.is_vector_value() {
        b.build_float_neg(a.into_vector_value(), "neg").map_err(llvm)?.into()
    } else {
        b.build_float_neg(a.into_float_value(), "neg").map_err(llvm)?.into()
    })
}

fn float_op(b: &Builder<'static>, op: BinaryOp, x: V, y: V) -> R<V> {
    macro_rules! go {
        ($x:expr, $y:expr) => {
            match op {
                BinaryOp::Add => b.build_float_add($x, $y, "f").map(Into::into),
                BinaryOp::Sub => b.build_float_sub($x, $y, "f").map(Into::into),
                BinaryOp::Mul => b.build_float_mul($x, $y, "f").map(Into::into),
                BinaryOp::Div => b.build_float_div($x, $y, "f").map(Into::into),
                _ => b.build_float_rem($x, $y, "f").map(Into::into),
            }
        };
    }
    if x.is_vector_value() {
        go!(x.into_vector_value(), y.into_vector_value()).map_err(llvm)
    } else {
        go!(x.into_float_value(), y.into_float_value()).map_err(llvm)
    }
}

fn int_op(b: &Builder<'static>, op: BinaryOp, x: V, y: V, unsigned: bool) -> R<V> {
    macro_rules! go {
        ($x:expr, $y:expr) => {
            match op {
                BinaryOp::Add => b.build_int_add($x, $y, "i").map(Into::into),
                BinaryOp::Sub => b.build_int_sub($x, $y, "i").map(Into::into),
                BinaryOp::Mul => b.build_int_mul($x, $y, "i").map(Into::into),
                BinaryOp::Div if unsigned => b.build_int_unsigned_div($x, $y, "i").map(Into::into),
                BinaryOp::Div => b.build_int_signed_div($x, $y, "i").map(Into::into),
                BinaryOp::Mod if unsigned => b.build_int_unsigned_rem($x, $y, "i").map(Into::into),
                BinaryOp::Mod => b.build_int_signed_rem($x, $y, "i").map(Into::into),
                BinaryOp::And => b.build_and($x, $y, "i").map(Into::into),
                BinaryOp::Or => b.build_or($x, $y, "i").map(Into::into),
                _ => b.build_xor($x, $y, "i").map(Into::into),
            }
        };
    }
    if x.is_vector_value() {
        go!(x.into_vector_value(), y.into_vector_value()).map_err(llvm)
    } else {
        go!(x.into_int_value(), y.into_int_value()).map_err(llvm)
    }
}

fn fcmp(b: &Builder<'static>, p: FloatPredicate, x: V, y: V) -> R<V> {
    Ok(if x.is_vector_value() {
        b.build_float_compare(p, x.into_vector_value(), y.into_vector_value(), "c").map_err(llvm)?.into()
    } else {
        b.build_float_compare(p, x.into_float_value(), y.into_float_value(), "c").map_err(llvm)?.into()
    })
}

fn icmp(b: &Builder<'static>, p: IntPredicate, x: V, y: V) -> R<V> {
    Ok(if x.is_vector_value() {
        b.build_int_compare(p, x.into_vector_value(), y.into_vector_value(), "c").map_err(llvm)?.into()
    } else {
        b.build_int_compare(p, x.into_int_value(), y.into_int_value(), "c").map_err(llvm)?.into()
    })
}

/// A poison vector of `n` values of `r`'s type.
fn vector_of(r: V, n: u32) -> R<VectorValue<'static>> {
    match r.get_type() {
        BasicTypeEnum::FloatType(t) => Ok(t.vec_type(n).get_poison()),
        BasicTypeEnum::IntType(t) => Ok(t.vec_type(n).get_poison()),
        t => Err(llvm(format!("no vector of {t:?}"))),
    }
}
