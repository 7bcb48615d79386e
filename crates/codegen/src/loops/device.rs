//! Loop programs as GPU kernels: the same `plan::LoopProgram`s and the same
//! expression code as the CPU's (`Gen`, scalar), in a kernel for LLVM's NVPTX
//! target. ABI (`plan::gpu`): `kernel(bufs, dims, status)`, device pointers
//! to the buffers' table, the dim table and an `i64` error word that the
//! first failing check sets (compare-and-swap from 0).
//!
//! The kernel takes its units grid-stride, so the runtime picks any grid per
//! shape (`plan::gpu::loop_blocks`), and follows `plan::gpu::GpuLoopSchedule`:
//! - a thread per point: the point's index split into the loop variables,
//!   adjacent threads at adjacent innermost positions (contiguous accesses
//!   across a warp), a point's reductions in its thread;
//! - a warp per row (or per point) where the program's row reduction is at
//!   least a warp long at this call: the row's reductions shared by the lanes
//!   (every 32nd term each, then butterfly shuffles), then the row's points.
//!
//! Where a call's rows are a whole number of quads (`plan::gpu::QUAD`
//! adjacent points; `LoopProgram::gpu_quads`), a thread (or a warp's lane)
//! takes a quad at once: the expression code in vectors of four along the
//! innermost variable, so a contiguous load is one 16-byte load of f32 where
//! its address is aligned (a slice's may not be: then element by element),
//! a store one 16-byte store, and what does not depend on the innermost
//! variable is computed once for the four. A warp's shared reductions take
//! quads of terms at any length (the terms past the last whole quad one a
//! lane).
//!
//! Each version of a multi-versioned program (`plan::Schedules::guards`) is a
//! nest of its own, picked at the kernel's start by the guards' values.

use std::collections::HashMap;

use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::targets::{TargetData, TargetTriple};
use inkwell::values::{IntValue, PointerValue};
use inkwell::{AddressSpace, AtomicOrdering, IntPredicate};
use plan::gpu::{GpuLoopSchedule, LOOP_THREADS, QUAD, WARP, WARP_ROW_MIN};
use plan::{LoopProgram, Node, E};

use super::{Gen, R};
use crate::{llvm, CodegenError};

const TRIPLE: &str = "nvptx64-nvidia-cuda";
const DATA_LAYOUT: &str = "e-i64:64-i128:128-v16:16-v32:32-n16:32:64";

/// The LLVM IR of program `p`'s kernel `name`, as text (before optimization:
/// what the host emulator runs and what [`program_ptx`] compiles).
pub fn program_ir(p: &LoopProgram, name: &str) -> R<String> {
    let ctx = Context::create();
    // SAFETY: `Gen` types its values with the context's lifetime as `'static`;
    // the context outlives the module and every value (declared after it,
    // dropped before it), and nothing made here escapes but the printed text.
    let ctx_ref: &'static Context = unsafe { &*(&ctx as *const Context) };
    let module = ctx_ref.create_module(name);
    module.set_triple(&TargetTriple::create(TRIPLE));
    module.set_data_layout(&TargetData::create(DATA_LAYOUT).get_data_layout());
    build(ctx_ref, &module, name, p)?;
    module.verify().map_err(|e| llvm(format!("{name}: {e}")))?;
    Ok(module.print_to_string().to_string())
}

/// PTX (`.target sm_80`, which ptxas also assembles for sm_90a) of program
/// `p`'s kernel `name`, at O3.
pub fn program_ptx(p: &LoopProgram, name: &str) -> R<String> {
    crate::nvptx::compile(&program_ir(p, name)?, name, gpu::Arch::Sm80)
}

/// The thread's place in the grid.
struct Grid {
    /// The thread's index in the grid, and the grid's thread count.
    thread: IntValue<'static>,
    threads: IntValue<'static>,
    /// The thread's warp in the grid, the grid's warps, the lane (`i32`).
    warp: IntValue<'static>,
    warps: IntValue<'static>,
    lane: IntValue<'static>,
}

fn sreg(
    ctx: &'static Context,
    module: &Module<'static>,
    b: &Builder<'static>,
    r: &str,
) -> R<IntValue<'static>> {
    let name = format!("llvm.nvvm.read.ptx.sreg.{r}");
    let i32t = ctx.i32_type();
    let f = module
        .get_function(&name)
        .unwrap_or_else(|| module.add_function(&name, i32t.fn_type(&[], false), None));
    Ok(super::basic(b.build_call(f, &[], r).map_err(llvm)?)?.into_int_value())
}

fn build(ctx: &'static Context, module: &Module<'static>, name: &str, p: &LoopProgram) -> R<()> {
    let (i32t, i64t) = (ctx.i32_type(), ctx.i64_type());
    let ptr = ctx.ptr_type(AddressSpace::default());
    let f = module.add_function(
        name,
        ctx.void_type().fn_type(&[ptr.into(), ptr.into(), ptr.into()], false),
        None,
    );
    for (i, n) in ["bufs", "dims", "status"].iter().enumerate() {
        if let Some(a) = f.get_nth_param(i as u32) {
            a.set_name(n);
        }
    }
    let param = |i: u32| -> R<PointerValue<'static>> {
        Ok(f.get_nth_param(i).ok_or_else(|| llvm("param"))?.into_pointer_value())
    };
    let md = ctx.metadata_node(&[
        f.as_global_value().as_pointer_value().into(),
        ctx.metadata_string("kernel").into(),
        i32t.const_int(1, false).into(),
    ]);
    module.add_global_metadata("nvvm.annotations", &md).map_err(llvm)?;
    let md = ctx.metadata_node(&[
        f.as_global_value().as_pointer_value().into(),
        ctx.metadata_string("maxntidx").into(),
        i32t.const_int(LOOP_THREADS as u64, false).into(),
    ]);
    module.add_global_metadata("nvvm.annotations", &md).map_err(llvm)?;

    let bld = ctx.create_builder();
    bld.position_at_end(ctx.append_basic_block(f, "entry"));
    let status_out = param(2)?;
    let mut g = Gen::new(ctx, module, &bld, p, (param(0)?, param(1)?), QUAD as usize, "", true)?;

    let b = &bld;
    let tid = sreg(ctx, module, b, "tid.x")?;
    let block = sreg(ctx, module, b, "ctaid.x")?;
    let blocks = sreg(ctx, module, b, "nctaid.x")?;
    let wide = |v: IntValue<'static>| b.build_int_z_extend(v, i64t, "w").map_err(llvm);
    let per = i64t.const_int(LOOP_THREADS as u64, false);
    let first = b.build_int_mul(wide(block)?, per, "first").map_err(llvm)?;
    let thread = b.build_int_add(first, wide(tid)?, "thread").map_err(llvm)?;
    let threads = b.build_int_mul(wide(blocks)?, per, "threads").map_err(llvm)?;
    let w = i64t.const_int(WARP as u64, false);
    let grid = Grid {
        thread,
        threads,
        warp: b.build_int_unsigned_div(thread, w, "warp").map_err(llvm)?,
        warps: b.build_int_unsigned_div(threads, w, "warps").map_err(llvm)?,
        lane: b.build_and(tid, i32t.const_int(WARP as u64 - 1, false), "lane").map_err(llvm)?,
    };

    let nest = |g: &mut Gen| -> R<()> {
        let shape = Shape::of(g, p)?;
        let Some((warp, len)) = p.gpu_warp_schedule() else {
            return any_points(g, p, &grid, &shape);
        };
        let len = g.emit(len, false)?.into_int_value();
        let long = g
            .bld
            .build_int_compare(IntPredicate::SGE, len, i64t.const_int(WARP_ROW_MIN as u64, false), "long")
            .map_err(llvm)?;
        g.if_else(long, &mut |g| warps(g, p, &grid, &shape, warp), &mut |g| any_points(g, p, &grid, &shape))
    };
    // One nest per version, as on the CPU: the guards' values pick it.
    super::in_versions(&mut g, f, &p.schedules.guards, &mut |g| nest(g))?;
    report_status(&g, f, status_out)?;
    b.build_return(None).map_err(llvm)?;
    Ok(())
}

/// The thread's first error, if any, stored at `status_out` unless another
/// thread's came first (compare-and-swap from 0); the builder then at the end.
fn report_status(
    g: &Gen,
    f: inkwell::values::FunctionValue<'static>,
    status_out: PointerValue<'static>,
) -> R<()> {
    let (b, i64t) = (g.bld, g.ctx.i64_type());
    let st = b.build_load(i64t, g.status, "st").map_err(llvm)?.into_int_value();
    let bad = b.build_int_compare(IntPredicate::NE, st, i64t.const_zero(), "bad").map_err(llvm)?;
    let (report, end) = (g.ctx.append_basic_block(f, "report"), g.ctx.append_basic_block(f, "end"));
    b.build_conditional_branch(bad, report, end).map_err(llvm)?;
    b.position_at_end(report);
    b.build_cmpxchg(status_out, i64t.const_zero(), st, AtomicOrdering::Monotonic, AtomicOrdering::Monotonic)
        .map_err(llvm)?;
    b.build_unconditional_branch(end).map_err(llvm)?;
    b.position_at_end(end);
    Ok(())
}

/// The nest's extents at this call: the innermost looping variable and its
/// extent, the outer ones (outermost first), the rows and the points.
struct Shape {
    inner: Option<u32>,
    inner_ext: IntValue<'static>,
    outer: Vec<(u32, IntValue<'static>)>,
    rows: IntValue<'static>,
    points: IntValue<'static>,
}

impl Shape {
    fn of(g: &mut Gen, p: &LoopProgram) -> R<Shape> {
        let i64t = g.ctx.i64_type();
        let inner_at = p.inner();
        let inner_ext = match inner_at {
            Some(i) => g.emit(p.space[i], false)?.into_int_value(),
            None => i64t.const_int(1, false),
        };
        let mut outer = Vec::new();
        let mut rows = i64t.const_int(1, false);
        for (v, ext) in p.vars[..inner_at.unwrap_or(p.vars.len())].iter().zip(&p.space) {
            if let Node::Var(i) = p.exprs.node(*v) {
                let e = g.emit(*ext, false)?.into_int_value();
                rows = g.bld.build_int_mul(rows, e, "rows").map_err(llvm)?;
                outer.push((*i, e));
            }
        }
        let points = g.bld.build_int_mul(rows, inner_ext, "points").map_err(llvm)?;
        Ok(Shape { inner: p.inner_var(), inner_ext, outer, rows, points })
    }

    /// Bind the outer variables to row `r`'s (the last varies fastest).
    fn bind_row(&self, g: &mut Gen, r: IntValue<'static>) -> R<()> {
        let mut rest = r;
        for (k, (v, ext)) in self.outer.iter().enumerate().rev() {
            if k == 0 {
                g.vars.insert(*v, rest);
            } else {
                let i = g.bld.build_int_signed_rem(rest, *ext, "o").map_err(llvm)?;
                g.vars.insert(*v, i);
                rest = g.bld.build_int_signed_div(rest, *ext, "r").map_err(llvm)?;
            }
        }
        Ok(())
    }

    /// Bind every variable to point `i`'s.
    fn bind_point(&self, g: &mut Gen, i: IntValue<'static>) -> R<()> {
        let Some(v) = self.inner else { return self.bind_row(g, i) };
        let iv = g.bld.build_int_signed_rem(i, self.inner_ext, "in").map_err(llvm)?;
        let r = g.bld.build_int_signed_div(i, self.inner_ext, "row").map_err(llvm)?;
        g.vars.insert(v, iv);
        self.bind_row(g, r)
    }
}

/// `for iv = lo; iv < hi; iv += step` with a run-time step; the body runs in a
/// scope of its own.
fn stride_loop(
    g: &mut Gen,
    lo: IntValue<'static>,
    hi: IntValue<'static>,
    step: IntValue<'static>,
    body: &mut dyn FnMut(&mut Gen, IntValue<'static>) -> R<()>,
) -> R<()> {
    let b = g.bld;
    let f = b.get_insert_block().and_then(|bb| bb.get_parent()).ok_or_else(|| llvm("no function"))?;
    let pre = b.get_insert_block().ok_or_else(|| llvm("no block"))?;
    let (header, body_bb, exit) = (
        g.ctx.append_basic_block(f, "units"),
        g.ctx.append_basic_block(f, "unit"),
        g.ctx.append_basic_block(f, "units_done"),
    );
    b.build_unconditional_branch(header).map_err(llvm)?;
    b.position_at_end(header);
    let iv = b.build_phi(g.ctx.i64_type(), "u").map_err(llvm)?;
    let ivv = iv.as_basic_value().into_int_value();
    let more = b.build_int_compare(IntPredicate::SLT, ivv, hi, "more").map_err(llvm)?;
    b.build_conditional_branch(more, body_bb, exit).map_err(llvm)?;
    b.position_at_end(body_bb);
    g.scopes.push(HashMap::new());
    let r = body(g, ivv);
    g.scopes.pop();
    r?;
    let next = g.bld.build_int_add(ivv, step, "next").map_err(llvm)?;
    let latch = g.bld.get_insert_block().ok_or_else(|| llvm("no block"))?;
    g.bld.build_unconditional_branch(header).map_err(llvm)?;
    iv.add_incoming(&[(&lo, pre), (&next, latch)]);
    g.bld.position_at_end(exit);
    Ok(())
}

/// Whether this call's rows are a whole number of quads ([`QUAD`] adjacent
/// points), where `s` takes them at all (`LoopProgram::gpu_quads`).
fn quad_rows(g: &Gen, p: &LoopProgram, shape: &Shape, s: GpuLoopSchedule) -> R<Option<IntValue<'static>>> {
    if p.gpu_quads(s).is_none() {
        return Ok(None);
    }
    let i64t = g.ctx.i64_type();
    let rest =
        g.bld.build_and(shape.inner_ext, i64t.const_int(QUAD as u64 - 1, false), "qrest").map_err(llvm)?;
    Ok(Some(g.bld.build_int_compare(IntPredicate::EQ, rest, i64t.const_zero(), "quads").map_err(llvm)?))
}

/// A thread per quad where the rows are made of them, else per point.
fn any_points(g: &mut Gen, p: &LoopProgram, grid: &Grid, shape: &Shape) -> R<()> {
    match quad_rows(g, p, shape, GpuLoopSchedule::Points)? {
        Some(whole) => {
            g.if_else(whole, &mut |g| quads(g, p, grid, shape), &mut |g| points(g, p, grid, shape))
        }
        None => points(g, p, grid, shape),
    }
}

/// A thread per quad: the quad's points as vectors along the innermost
/// variable (the rows are a whole number of quads).
fn quads(g: &mut Gen, p: &LoopProgram, grid: &Grid, shape: &Shape) -> R<()> {
    let v = shape.inner.ok_or_else(|| llvm("quads without an innermost variable"))?;
    let i64t = g.ctx.i64_type();
    let q = i64t.const_int(QUAD as u64, false);
    let units = g.bld.build_int_unsigned_div(shape.points, q, "quads").map_err(llvm)?;
    stride_loop(g, grid.thread, units, grid.threads, &mut |g, u| {
        let i = g.bld.build_int_mul(u, q, "first").map_err(llvm)?;
        shape.bind_point(g, i)?;
        g.lane = Some(v);
        let r = g.stores(p, i, true);
        g.lane = None;
        r
    })
}

/// A thread per point.
fn points(g: &mut Gen, p: &LoopProgram, grid: &Grid, shape: &Shape) -> R<()> {
    stride_loop(g, grid.thread, shape.points, grid.threads, &mut |g, i| {
        shape.bind_point(g, i)?;
        g.stores(p, i, false)
    })
}

/// A warp per row or per point: the unit's reductions shared by the lanes,
/// then its stores.
fn warps(g: &mut Gen, p: &LoopProgram, grid: &Grid, shape: &Shape, schedule: GpuLoopSchedule) -> R<()> {
    let i64t = g.ctx.i64_type();
    let values: Vec<E> = p.stores.iter().map(|s| s.value).collect();
    let lane = grid.lane;
    let lane64 = g.bld.build_int_z_extend(lane, i64t, "lane64").map_err(llvm)?;
    match schedule {
        GpuLoopSchedule::WarpRows => {
            // Whether the rows are made of quads: the same for the whole call.
            let whole = quad_rows(g, p, shape, GpuLoopSchedule::WarpRows)?;
            stride_loop(g, grid.warp, shape.rows, grid.warps, &mut |g, r| {
                shape.bind_row(g, r)?;
                let mask = shape.inner.map_or(0, |v| 1u64 << v);
                g.warp_lane = Some(lane);
                let hoisted = g.hoist(&values, mask, false);
                g.warp_lane = None;
                hoisted?;
                let base = g.bld.build_int_mul(r, shape.inner_ext, "base").map_err(llvm)?;
                // The row's points: a quad a lane where the row is made of them.
                let by = |g: &mut Gen, per: u32| -> R<()> {
                    let step = i64t.const_int(WARP as u64 * per as u64, false);
                    let first =
                        g.bld.build_int_mul(lane64, i64t.const_int(per as u64, false), "l0").map_err(llvm)?;
                    let lane = if per > 1 { shape.inner } else { None };
                    stride_loop(g, first, shape.inner_ext, step, &mut |g, iv| {
                        if let Some(v) = shape.inner {
                            g.vars.insert(v, iv);
                        }
                        let at = g.bld.build_int_add(base, iv, "at").map_err(llvm)?;
                        g.lane = lane;
                        let r = g.stores(p, at, lane.is_some());
                        g.lane = None;
                        r
                    })
                };
                match whole {
                    Some(whole) => g.if_else(whole, &mut |g| by(g, QUAD), &mut |g| by(g, 1)),
                    None => by(g, 1),
                }
            })
        }
        GpuLoopSchedule::WarpPoints => stride_loop(g, grid.warp, shape.points, grid.warps, &mut |g, i| {
            shape.bind_point(g, i)?;
            g.warp_lane = Some(lane);
            let hoisted = g.hoist(&values, 0, false);
            g.warp_lane = None;
            hoisted?;
            let first = g
                .bld
                .build_int_compare(IntPredicate::EQ, lane, g.ctx.i32_type().const_zero(), "lane0")
                .map_err(llvm)?;
            g.if_else(first, &mut |g| g.stores(p, i, false), &mut |_| Ok(()))
        }),
        GpuLoopSchedule::Points => {
            Err(CodegenError::Unsupported("a thread per point is not a warp schedule".into()))
        }
    }
}

/// The LLVM IR (NVPTX module, as text) of `float @name(bufs, dims, status,
/// i64 entry, i64 row, i64 key, float score)`: the logits that the online
/// softmax program `p` stores in parameter `logits` at batch entry `entry`
/// (the nest's outer variables but the row, flattened, the last fastest),
/// query row `row` and key `key`, where its scores (parameter `scores`) hold
/// `score` at that point. The fused attention kernel calls it per element of
/// its score tile (`codegen::nvptx::attention_ir`), with the program's chunk
/// offset 0 and its chunk the whole row of keys in `dims`. A failing check
/// sets `*status` (compare-and-swap from 0).
pub fn logits_ir(p: &LoopProgram, scores: u32, logits: u32, name: &str) -> R<String> {
    let ctx = Context::create();
    // SAFETY: as in `program_ir`: the context outlives the module and every value.
    let ctx_ref: &'static Context = unsafe { &*(&ctx as *const Context) };
    let module = ctx_ref.create_module(name);
    module.set_triple(&TargetTriple::create(TRIPLE));
    module.set_data_layout(&TargetData::create(DATA_LAYOUT).get_data_layout());
    build_logits(ctx_ref, &module, name, p, (scores, logits))?;
    module.verify().map_err(|e| llvm(format!("{name}: {e}")))?;
    Ok(module.print_to_string().to_string())
}

/// Why the fused attention kernel cannot compute program `p`'s logits per
/// element, if it cannot: its logits are no store of the program, need a
/// reduction, or read the scores elsewhere than at their own point.
pub fn logits_unsupported(p: &LoopProgram, scores: u32, logits: u32) -> Option<String> {
    let Some(store) = p.stores.iter().find(|s| s.param == logits) else {
        return Some("the program stores no logits".into());
    };
    if p.vars.len() < 2 {
        return Some("the program's nest has no rows of keys".into());
    }
    if !matches!(p.exprs.node(p.vars[p.vars.len() - 1]), Node::Var(_)) {
        return Some("the keys are no loop of the program".into());
    }
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![store.value];
    while let Some(e) = stack.pop() {
        if !seen.insert(e) {
            continue;
        }
        match p.exprs.node(e) {
            Node::Reduce { .. } => return Some("the logits need a reduction".into()),
            Node::Load { buf, index, guard } if *buf == scores => {
                if *index != p.vars || guard.is_some() {
                    return Some("the logits read the scores away from their point".into());
                }
            }
            n => stack.extend(n.children()),
        }
    }
    None
}

fn build_logits(
    ctx: &'static Context,
    module: &Module<'static>,
    name: &str,
    p: &LoopProgram,
    (scores, logits): (u32, u32),
) -> R<()> {
    if let Some(why) = logits_unsupported(p, scores, logits) {
        return Err(CodegenError::Unsupported(format!("attention's logits: {why}")));
    }
    let (i64t, f32t) = (ctx.i64_type(), ctx.f32_type());
    let ptr = ctx.ptr_type(AddressSpace::default());
    let f = module.add_function(
        name,
        f32t.fn_type(
            &[ptr.into(), ptr.into(), ptr.into(), i64t.into(), i64t.into(), i64t.into(), f32t.into()],
            false,
        ),
        None,
    );
    let names = ["bufs", "dims", "status", "entry", "row", "key", "score"];
    for (i, n) in names.iter().enumerate() {
        if let Some(a) = f.get_nth_param(i as u32) {
            a.set_name(n);
        }
    }
    let param = |i: u32| f.get_nth_param(i).ok_or_else(|| llvm("param"));
    let bld = ctx.create_builder();
    bld.position_at_end(ctx.append_basic_block(f, "entry"));
    let status_out = param(2)?.into_pointer_value();
    let mut g = Gen::new(
        ctx,
        module,
        &bld,
        p,
        (param(0)?.into_pointer_value(), param(1)?.into_pointer_value()),
        1,
        "",
        true,
    )?;
    let rank = p.vars.len();
    // The key, the row, then the batch entry's variables (the last fastest).
    if let Node::Var(v) = p.exprs.node(p.vars[rank - 1]) {
        g.vars.insert(*v, param(5)?.into_int_value());
    }
    if let Node::Var(v) = p.exprs.node(p.vars[rank - 2]) {
        g.vars.insert(*v, param(4)?.into_int_value());
    }
    let mut rest = param(3)?.into_int_value();
    let outer = super::looping_vars(p, rank - 2);
    for (k, (v, ext)) in outer.iter().enumerate().rev() {
        if k == 0 {
            g.vars.insert(*v, rest);
        } else {
            let e = g.emit(*ext, false)?.into_int_value();
            let i = bld.build_int_signed_rem(rest, e, "o").map_err(llvm)?;
            g.vars.insert(*v, i);
            rest = bld.build_int_signed_div(rest, e, "r").map_err(llvm)?;
        }
    }
    // The scores at the point are the caller's value.
    let score = param(6)?;
    for n in 0..p.exprs.len() {
        if matches!(p.exprs.node(E(n as u32)), Node::Load { buf, .. } if *buf == scores) {
            if let Some(s) = g.scopes.first_mut() {
                s.insert((E(n as u32), None), score);
            }
        }
    }
    let store = p.stores.iter().find(|s| s.param == logits).ok_or_else(|| llvm("no logits store"))?;
    let value = g.emit(store.value, false)?;
    report_status(&g, f, status_out)?;
    bld.build_return(Some(&value)).map_err(llvm)?;
    Ok(())
}
