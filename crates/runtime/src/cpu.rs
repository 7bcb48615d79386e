//! The CPU backend: the generated loop programs, the contraction engine's
//! kernel families (one per fused epilogue) with the pre-packed weights, and
//! the thread pool that runs them. Its steps run on the calling thread and
//! the pool's; every pointer a step gets is host memory.

use std::sync::atomic::{AtomicI64, Ordering};

use ir::DType;
use kernels::{
    ALayout, BLayout, BOperand, CodeImage, Dispatcher, EpilogueArgs, MatMut, MatRef, PackedB, Problem,
    ThreadPool,
};
use plan::{BufId, BufferKind, Epilogue, FinishFn, LoopFn, ModelPlan, PartFn, StepKind};

use crate::backend::Backend;
use crate::shape::{self, LoopLaunch, ShapePlan, StepShape};
use crate::{CodeStats, CodeTarget, KeyChunks, RunError, PACK_ROWS};

/// Parts a thread's share of a parallel loop program is split into (rows,
/// or vectors of points, taken dynamically by whichever thread runs).
const LOOP_SUBS: usize = 4;

/// What the CPU runs of a compiled model.
pub struct Cpu {
    pub(crate) loops: Vec<LoopFn>,
    pub(crate) splits: Vec<Option<(PartFn, FinishFn)>>,
    pub(crate) dispatchers: Vec<(Epilogue, Dispatcher)>,
    /// The packed weight of each matmul step that has one.
    pub(crate) packed: Vec<Option<PackedB>>,
    /// Aligned copies of constants whose bytes are not aligned to their type.
    aligned: Vec<Option<Vec<u64>>>,
    pub(crate) pool: std::sync::Arc<ThreadPool>,
    pub(crate) key_chunks: KeyChunks,
    pub(crate) code_stats: CodeStats,
    pub(crate) code_target: CodeTarget,
    // Declared last: dropped after everything that points into it.
    pub(crate) code: Vec<CodeImage>,
}

/// The generated code of a model for the CPU, as the compiler (or an
/// artifact) hands it over.
pub(crate) struct CpuCode {
    pub loops: Vec<LoopFn>,
    pub splits: Vec<Option<(PartFn, FinishFn)>>,
    pub dispatchers: Vec<(Epilogue, Dispatcher)>,
    pub pool: std::sync::Arc<ThreadPool>,
    pub code: Vec<CodeImage>,
    pub code_stats: CodeStats,
    pub code_target: CodeTarget,
}

impl Cpu {
    /// The CPU half of `plan`, its weights packed here or (`packed`: one entry
    /// per step) packed already.
    pub(crate) fn new(
        plan: &ModelPlan,
        code: CpuCode,
        packed: Option<Vec<Option<PackedB>>>,
    ) -> Result<Cpu, RunError> {
        let CpuCode { loops, splits, dispatchers, pool, code, code_stats, code_target } = code;
        let without_split = plan
            .programs
            .iter()
            .zip(splits.iter().chain(std::iter::repeat(&None)))
            .position(|(p, s)| p.schedules.split.is_some() && s.is_none());
        if splits.len() != plan.programs.len() || without_split.is_some() {
            return Err(RunError::Internal(format!(
                "{} loop programs, {} with split-reduction entries (program {without_split:?} lacks them)",
                plan.programs.len(),
                splits.len()
            )));
        }
        if loops.len() != plan.programs.len() {
            return Err(RunError::Internal(format!(
                "{} loop programs, {} compiled",
                plan.programs.len(),
                loops.len()
            )));
        }
        // Only what the contraction engine reads needs aligned copies (loop programs
        // load unaligned); weights are packed below straight from their bytes,
        // through a temporary aligned copy if need be.
        let reads = reads(plan);
        let aligned = plan
            .buffers
            .iter()
            .zip(&reads)
            .map(|(b, r)| match &b.kind {
                BufferKind::Constant(c) if r.engine => aligned_copy(c.bytes(), b.dtype.size()),
                _ => None,
            })
            .collect();
        let mut cpu = Cpu {
            loops,
            splits,
            dispatchers,
            packed: Vec::new(),
            aligned,
            pool,
            key_chunks: KeyChunks::Auto,
            code_stats,
            code_target,
            code,
        };
        cpu.packed = match packed {
            Some(p) => {
                cpu.check_packed(plan, &p)?;
                p
            }
            None => cpu.pack_weights(plan, &reads)?,
        };
        Ok(cpu)
    }

    fn constant_ptr(&self, plan: &ModelPlan, b: usize) -> Option<*const u8> {
        match (&plan.buffers[b].kind, &self.aligned[b]) {
            (_, Some(v)) => Some(v.as_ptr() as *const u8),
            (BufferKind::Constant(c), None) => Some(c.bytes().as_ptr()),
            _ => None,
        }
    }

    /// Pack every weight for the contraction engine. A weight nothing else reads
    /// then gives its file-mapped pages back (see [`ir::MappedFile`]): the packed
    /// copy is what runs, and the model's weights are not resident twice.
    fn pack_weights(&self, plan: &ModelPlan, reads: &[Reads]) -> Result<Vec<Option<PackedB>>, RunError> {
        let mut out = Vec::with_capacity(plan.steps.len());
        let fixed = |s: u32| -> Result<usize, RunError> {
            plan.dims.exprs()[s as usize]
                .as_const()
                .and_then(|v| usize::try_from(v).ok())
                .ok_or_else(|| RunError::Internal("a weight of symbolic shape".into()))
        };
        for st in &plan.steps {
            let StepKind::MatMul(mm) = &st.kind else {
                out.push(None);
                continue;
            };
            if !mm.weight {
                out.push(None);
                continue;
            }
            let d = self.dispatcher(mm)?;
            let buf = &plan.buffers[mm.b.buf];
            let BufferKind::Constant(c) = &buf.kind else {
                return Err(RunError::Internal("weight is not constant".into()));
            };
            let copy = match &self.aligned[mm.b.buf] {
                Some(_) => None,
                None => aligned_copy(c.bytes(), 4),
            };
            let ptr = match (&copy, self.constant_ptr(plan, mm.b.buf)) {
                (Some(v), _) => v.as_ptr() as *const u8,
                (None, Some(p)) => p,
                (None, None) => return Err(RunError::Internal("weight is not constant".into())),
            };
            let len = buf.shape.iter().map(|e| e.as_const().unwrap_or(0) as usize).product::<usize>();
            if buf.dtype != DType::F32 || len.checked_mul(4).is_none_or(|b| b > c.bytes().len()) {
                return Err(RunError::Internal(format!("weight {} is not f32 of its shape", buf.name)));
            }
            // SAFETY: the constant (or its aligned copy) holds `len` f32 values (its
            // type, checked above), aligned, and outlives the packing below.
            let data = unsafe { std::slice::from_raw_parts(ptr as *const f32, len) };
            let (k, n) = (fixed(mm.k)?, fixed(mm.n)?);
            let off = fixed(mm.b.offset)?;
            let view = MatRef::new(&data[off.min(len)..], k, n, fixed(mm.b.rs)?, fixed(mm.b.cs)?)
                .map_err(|e| RunError::Internal(e.to_string()))?;
            // A weight-only quantized weight read whole, row-major: its codes, for
            // an f32 family (which dequantizes them panel by panel).
            let codes = c.weight_codes().filter(|_| {
                mm.taps.is_none()
                    && off == 0
                    && c.shape == [k, n]
                    && fixed(mm.b.rs).ok() == Some(n)
                    && fixed(mm.b.cs).ok() == Some(1)
                    && d.family().elem() == kernels::ElemType::F32
            });
            let packed = match (codes, mm.taps.as_ref().and_then(|t| t.overlapping_row(k))) {
                (Some(wc), _) => d.pack_quantized_weight(&quantized_weight(wc, k, n), &PACK_ROWS),
                (None, Some(row)) => d.pack_conv_weight(view, &PACK_ROWS, row),
                (None, None) => d.pack_weight(view, &PACK_ROWS),
            };
            out.push(Some(packed.map_err(|e| RunError::Internal(e.to_string()))?));
            if reads[mm.b.buf].packed_only() {
                c.release_pages();
            }
        }
        Ok(out)
    }

    /// Weights packed elsewhere (an artifact's): one per weight matmul, of its
    /// shape, packed for a width its family has kernels for.
    fn check_packed(&self, plan: &ModelPlan, packed: &[Option<PackedB>]) -> Result<(), RunError> {
        let bad = |why: String| RunError::Internal(format!("pre-packed weights: {why}"));
        if packed.len() != plan.steps.len() {
            return Err(bad(format!("{} for {} steps", packed.len(), plan.steps.len())));
        }
        let dims = plan.dims.exprs();
        for (i, (st, p)) in plan.steps.iter().zip(packed).enumerate() {
            let mm = match &st.kind {
                StepKind::MatMul(mm) if mm.weight => mm,
                _ if p.is_none() => continue,
                _ => return Err(bad(format!("step {i} has a packed weight but multiplies none"))),
            };
            let Some(p) = p else { return Err(bad(format!("step {i} lacks its packed weight"))) };
            let fixed = |s: u32| dims[s as usize].as_const().and_then(|v| usize::try_from(v).ok());
            if fixed(mm.k) != Some(p.k) || fixed(mm.n) != Some(p.n) {
                return Err(bad(format!(
                    "step {i}: a {}x{} weight for a {}x{} product",
                    p.k, p.n, dims[mm.k as usize], dims[mm.n as usize]
                )));
            }
            // Any layout the family has kernels for runs (the layout the compiler
            // chose for its thread count, whatever count the model is loaded with).
            let d = self.dispatcher(mm)?;
            if !d.family().widths().contains(&p.nr) || p.elem != d.family().elem() {
                return Err(bad(format!(
                    "step {i}: packed {} for NR {}, which its contraction family has no kernels for",
                    p.elem, p.nr
                )));
            }
        }
        Ok(())
    }

    /// The family of a matmul: of its epilogue, and of the first of its integer
    /// types the model has a family of, the model's other family otherwise.
    pub(crate) fn dispatcher(&self, mm: &plan::MatMulStep) -> Result<&Dispatcher, RunError> {
        let e = mm.epilogue.function();
        let of = |elem: &kernels::ElemType| {
            self.dispatchers.iter().find(|(k, d)| *k == e && d.family().elem() == *elem).map(|(_, d)| d)
        };
        match mm.integer_types().iter().find_map(of) {
            Some(d) => Ok(d),
            None => self.dispatcher_for(e),
        }
    }

    /// The family of epilogue `e` in the model's float type.
    fn dispatcher_for(&self, e: Epilogue) -> Result<&Dispatcher, RunError> {
        self.dispatchers
            .iter()
            .find(|(k, d)| *k == e && !d.family().elem().is_integer())
            .map(|(_, d)| d)
            .ok_or_else(|| RunError::Internal(format!("no contraction engine for the epilogue {e:?}")))
    }

    /// Run a program with a split reduction: per point, each of `ways` threads
    /// reduces a range of the split variable into a partial, then the point's
    /// stores combine them.
    #[allow(clippy::too_many_arguments)]
    fn run_split(
        &self,
        plan: &ModelPlan,
        program: usize,
        args: &[*mut u8],
        dims: &[i64],
        points: usize,
        len: usize,
        ways: usize,
    ) -> Result<(), RunError> {
        let Some((part, finish)) = self.splits.get(program).copied().flatten() else {
            return Err(RunError::Internal("a split run of a program without split entries".into()));
        };
        let shared = Shared { args: args.as_ptr(), dims: dims.as_ptr() };
        let first = AtomicI64::new(0);
        let chunk = len.div_ceil(ways).next_multiple_of(64);
        let mut parts = [0u64; shape::MAX_SPLIT];
        for point in 0..points {
            let slots = Slots(parts.as_mut_ptr());
            let taken = kernels::Parts::new(ways, self.pool.threads());
            self.pool.run_parts(&taken, &|t| {
                let (lo, hi) = ((t * chunk).min(len), ((t + 1) * chunk).min(len));
                // SAFETY: `shared` is as for `call`; `t < ways <= MAX_SPLIT`, the
                // slots of `parts`. An empty range gives the reduction's identity.
                let s = unsafe { call_part(part, shared, point, lo, hi, slots, t) };
                if s != 0 {
                    let _ = first.compare_exchange(0, s, Ordering::SeqCst, Ordering::SeqCst);
                }
            });
            // SAFETY: as for `call`; `parts` holds the `ways` partials just written,
            // the pool having joined.
            let s = unsafe { finish(shared.args, shared.dims, point as i64, parts.as_ptr(), ways as i64) };
            if s != 0 {
                let _ = first.compare_exchange(0, s, Ordering::SeqCst, Ordering::SeqCst);
            }
        }
        self.check_status(plan, program, first.load(Ordering::SeqCst))
    }

    /// Run loop program `program` over `units` (rows, or the points of a
    /// one-loop nest), split between the threads when `parallel`.
    #[allow(clippy::too_many_arguments)]
    fn run_loop(
        &self,
        plan: &ModelPlan,
        program: usize,
        args: &[*mut u8],
        dims: &[i64],
        units: usize,
        points: bool,
        parallel: bool,
    ) -> Result<(), RunError> {
        if units == 0 {
            return Ok(());
        }
        let f = self.loops[program];
        let threads = self.pool.threads();
        let status = if parallel {
            let shared = Shared { args: args.as_ptr(), dims: dims.as_ptr() };
            let first = AtomicI64::new(0);
            // Parts of whole vectors of points (16 lanes cover every ISA's f32
            // width), `LOOP_SUBS` a thread where there are enough of them, taken
            // dynamically (a descheduled thread's parts go to the running ones).
            let lanes = if points { 16 } else { 1 };
            let n = units.div_ceil(lanes).clamp(1, threads * LOOP_SUBS);
            let chunk = units.div_ceil(n).next_multiple_of(lanes);
            let taken = kernels::Parts::new(units.div_ceil(chunk), threads);
            self.pool.run_parts(&taken, &|t| {
                let (b, e) = (t * chunk, ((t + 1) * chunk).min(units));
                if b < e {
                    // SAFETY: see `call`; threads run disjoint row (or point) ranges,
                    // so no element is written by two of them.
                    let s = unsafe { call(f, shared, b, e) };
                    if s != 0 {
                        let _ = first.compare_exchange(0, s, Ordering::SeqCst, Ordering::SeqCst);
                    }
                }
            });
            first.load(Ordering::SeqCst)
        } else {
            // SAFETY: see `call`.
            unsafe { call(f, Shared { args: args.as_ptr(), dims: dims.as_ptr() }, 0, units) }
        };
        self.check_status(plan, program, status)
    }

    /// A program's status as a result: an error code names its check.
    fn check_status(&self, plan: &ModelPlan, program: usize, status: i64) -> Result<(), RunError> {
        if status != 0 {
            let checks = &plan.programs[program].checks;
            let msg =
                checks.get(status as usize - 1).cloned().unwrap_or_else(|| format!("kernel error {status}"));
            return Err(RunError::Kernel(msg));
        }
        Ok(())
    }

    fn run_matmul(
        &self,
        plan: &ModelPlan,
        step: usize,
        mm: &plan::MatMulStep,
        ms: &shape::MatMulShape,
        sp: &ShapePlan,
        ptrs: &[*mut u8],
    ) -> Result<(), RunError> {
        if ms.m == 0 || ms.n == 0 || ms.entries.is_empty() {
            return Ok(());
        }
        let d = self.dispatcher(mm)?;
        let shape_err = |e: kernels::KernelError| RunError::Internal(e.to_string());
        let whole = |b: usize| f32s(ptrs, sp, b);
        // A quantized model's activations may be stored a byte a code (`lower`'s
        // narrowed buffers): A then reads them as they lie.
        let codes = match plan.buffers[mm.a.buf].dtype {
            DType::U8 => Some(bytes(ptrs, sp, mm.a.buf)),
            DType::F32 => None,
            other => return Err(RunError::Internal(format!("a matmul's A of {other:?}"))),
        };
        let a_all = if codes.is_some() { &[][..] } else { whole(mm.a.buf) };
        // A packed weight's own bytes are not read (nor aligned: see `reads`).
        let b_all = match &self.packed[step] {
            Some(_) => &[][..],
            None => whole(mm.b.buf),
        };
        let mut a = Vec::with_capacity(ms.entries.len());
        let mut b = Vec::with_capacity(ms.entries.len());
        for e in &ms.entries {
            a.push(match (ms.taps, codes) {
                (Some(t), None) => MatRef::taps(a_all.get(e[0]..).unwrap_or(&[]), t).map_err(shape_err)?,
                (None, None) => view(a_all, e[0], ms.m, ms.k, ms.rs[0], ms.cs[0])?,
                (Some(t), Some(c)) => {
                    MatRef::taps_of_codes(c.get(e[0]..).unwrap_or(&[]), t).map_err(shape_err)?
                }
                (None, Some(c)) => {
                    MatRef::of_codes(c.get(e[0]..).unwrap_or(&[]), ms.m, ms.k, ms.rs[0], ms.cs[0])
                        .map_err(shape_err)?
                }
            });
            b.push(match &self.packed[step] {
                Some(p) => BOperand::Packed(p),
                None => BOperand::Plain(view(b_all, e[1], ms.k, ms.n, ms.rs[1], ms.cs[1])?),
            });
        }
        let mut c = output_views(ptrs, sp, mm.c.buf, ms, plan.buffers[mm.c.buf].dtype == DType::U8)?;
        // The bias and the column scales: `n` values each.
        let vector = |b: Option<BufId>, what: &str| match b {
            Some(b) => {
                whole(b).get(..ms.n).map(Some).ok_or_else(|| RunError::Internal(format!("a short {what}")))
            }
            None => Ok(None),
        };
        let bias = vector(mm.epilogue.bias, "bias")?;
        let column_scale = vector(mm.epilogue.column_scale, "column scale vector")?;
        let params = mm.epilogue.params.values();
        // The residual has the output's layout: one view per entry, at C's offsets.
        let mut residuals = Vec::new();
        if let Some(rb) = mm.epilogue.residual {
            // A quantized shortcut's codes are read as they lie, a byte each.
            let codes = match plan.buffers[rb].dtype {
                DType::U8 if mm.epilogue.residual_codes => Some(bytes(ptrs, sp, rb)),
                DType::F32 if !mm.epilogue.residual_codes => None,
                other => return Err(RunError::Internal(format!("step {step}: a residual of {other:?}"))),
            };
            for e in &ms.entries {
                residuals.push(match codes {
                    Some(c) => MatRef::of_codes(c.get(e[2]..).unwrap_or(&[]), ms.m, ms.n, ms.rs[2], 1)
                        .map_err(shape_err)?,
                    None => view(whole(rb), e[2], ms.m, ms.n, ms.rs[2], 1)?,
                });
            }
        }
        let ep = match residuals.as_slice() {
            [one] => EpilogueArgs { column_scale, bias, residual: Some(*one), residuals: &[], params },
            many => EpilogueArgs { column_scale, bias, residual: None, residuals: many, params },
        };
        d.batched(&self.pool, &a, &b, &mut c, &ep).map_err(shape_err)?;
        Ok(())
    }

    /// Whether attention of `rows` query rows over `keys` keys takes them in chunks: `None` for whole
    /// rows, `Some(None)` for chunks of the size the cache gives, `Some(Some(n))`
    /// for chunks of `n` keys (asked for); by default where `kernels::online_pays`.
    fn plan_online(&self, keys: usize, rows: usize, l2: usize) -> Option<Option<usize>> {
        match self.key_chunks {
            KeyChunks::Never => None,
            KeyChunks::Always => Some(None),
            KeyChunks::Every(n) => Some(Some(n.max(1))),
            KeyChunks::Auto => kernels::online_pays(l2, keys, rows).then_some(None),
        }
    }

    /// Fused attention: per batch entry and block of query rows, scores into a
    /// tile, the softmax program over the tile's rows, and the product with V.
    fn run_attention(
        &self,
        model: &ModelPlan,
        a: &plan::AttentionStep,
        at: &shape::AttentionShape,
        sp: &ShapePlan,
        ptrs: &[*mut u8],
    ) -> Result<(), RunError> {
        let (ss, os) = (&at.scores, &at.output);
        let tasks = at
            .tasks
            .as_ref()
            .ok_or_else(|| RunError::Internal("fused attention planned without tasks".into()))?;
        if ss.m == 0 || os.n == 0 || ss.entries.is_empty() {
            return Ok(());
        }
        let d = self.dispatcher_for(Epilogue::default())?;
        let internal = |e: kernels::KernelError| RunError::Internal(e.to_string());
        let whole = |b: usize| f32s(ptrs, sp, b);
        let (q_all, k_all, v_all) = (whole(a.scores.a.buf), whole(a.scores.b.buf), whole(a.output.b.buf));
        let entries = ss.entries.len();
        let (mut q, mut kt, mut v) =
            (Vec::with_capacity(entries), Vec::with_capacity(entries), Vec::with_capacity(entries));
        for (se, oe) in ss.entries.iter().zip(&os.entries) {
            q.push(view(q_all, se[0], ss.m, ss.k, ss.rs[0], ss.cs[0])?);
            kt.push(BOperand::Plain(view(k_all, se[1], ss.k, ss.n, ss.rs[1], ss.cs[1])?));
            v.push(BOperand::Plain(view(v_all, oe[1], os.k, os.n, os.rs[1], os.cs[1])?));
        }
        let mut o = output_views(ptrs, sp, a.output.c.buf, os, false)?;
        let tasks_plan = kernels::AttentionPlan {
            block: tasks.block,
            chunk: tasks.chunk,
            scores: d.direct_plan(&tasks.scores).map_err(internal)?,
            output: d.direct_plan(&tasks.output).map_err(internal)?,
            zero_empty_rows: a.online.as_ref().is_some_and(|o| o.nan_to_zero),
        };
        // The step's buffers, copied into each task's own table (on its stack).
        let nargs = a.args.len();
        if nargs + 2 > plan::MAX_SOFTMAX_ARGS {
            return Err(RunError::Internal(format!("a fused softmax of {nargs} buffers")));
        }
        let mut base = [std::ptr::null_mut::<u8>(); plan::MAX_SOFTMAX_ARGS];
        for (slot, b) in base.iter_mut().zip(&a.args) {
            *slot = ptrs[*b];
        }
        let shared = Shared { args: base.as_ptr(), dims: sp.dims.as_ptr() };
        let (sp_, pp_, keys, rows) = (a.scores_param, a.probs_param, ss.n, ss.m);
        // The kernels take a step's failure as its message.
        let status = |program: usize, c: i64| self.check_status(model, program, c).map_err(|e| e.to_string());
        let table = move || {
            let shared = shared;
            let mut args = [std::ptr::null_mut::<u8>(); plan::MAX_SOFTMAX_ARGS];
            // SAFETY: `shared.args` is the table `base` above, `MAX_ARGS` pointers,
            // alive until `kernels::attention` returns.
            args.copy_from_slice(unsafe { std::slice::from_raw_parts(shared.args, plan::MAX_SOFTMAX_ARGS) });
            args
        };
        let f = self.loops[a.softmax];
        let softmax =
            move |e: usize, first: usize, n: usize, s: &[f32], p: &mut [f32]| -> Result<(), String> {
                let shared = shared;
                let row = e * rows + first;
                let mut args = table();
                // The tiles stand for rows row..row+n of S and P: shifted back by the rows
                // before them, the program's addresses for those rows land in the tiles.
                args[sp_] = s.as_ptr().wrapping_sub(row * keys) as *mut u8;
                args[pp_] = p.as_mut_ptr().wrapping_sub(row * keys) as *mut u8;
                // SAFETY: the program reads S and writes P only in rows row..row+n (checked
                // when the step was fused: it reads each row of S in that row alone and
                // stores only P, at the nest's positions), which the tiles hold (`n·keys`
                // elements each); its other buffers are the plan's, as for any loop.
                status(a.softmax, unsafe { f(args.as_ptr(), shared.dims, row as i64, (row + n) as i64) })
            };
        let chunks;
        let step = match (&a.online, tasks.chunk) {
            (_, None) => kernels::Softmax::Rows(&softmax),
            (None, Some(_)) => {
                return Err(RunError::Internal("a key chunk for attention without online softmax".into()))
            }
            (Some(on), Some(_)) => {
                chunks = |e: usize,
                          first: usize,
                          n: usize,
                          at: usize,
                          len: usize,
                          s: &[f32],
                          m: &[f32],
                          l: &mut [f32],
                          p: &mut [f32]|
                 -> Result<(), String> {
                    let row = e * rows + first;
                    let mut args = table();
                    // As above, the tiles shifted back by the rows before them (rows
                    // `len` long in the chunk's program), the running maxima by the rows.
                    args[sp_] = s.as_ptr().wrapping_sub(row * len) as *mut u8;
                    args[pp_] = p.as_mut_ptr().wrapping_sub(row * len) as *mut u8;
                    args[on.max_param] = m.as_ptr().wrapping_sub(row) as *mut u8;
                    args[on.logits_param] = l.as_mut_ptr().wrapping_sub(row * len) as *mut u8;
                    // The chunk's first key and length, in this task's copy of the dim table.
                    let mut dims = DimCopy::of(&sp.dims);
                    dims.set(on.offset_slot, at as i64);
                    dims.set(on.len_slot, len as i64);
                    let g = self.loops[on.program];
                    // SAFETY: as above; the chunk's program reads S (a chunk wide) and the
                    // running maxima and writes the logits and P only in rows row..row+n,
                    // which the tiles hold (`n·len` values, `n` maxima); its other buffers
                    // are the plan's, read at keys at..at+len of `keys` (the dims say so).
                    status(on.program, unsafe {
                        g(args.as_ptr(), dims.as_ptr(), row as i64, (row + n) as i64)
                    })
                };
                kernels::Softmax::Chunks(&chunks)
            }
        };
        kernels::attention(&self.pool, &tasks_plan, &q, &kt, &v, &mut o, step).map_err(|e| match e {
            kernels::KernelError::Step(msg) => RunError::Kernel(msg),
            e => RunError::Internal(e.to_string()),
        })
    }
}

impl Backend for Cpu {
    fn pool(&self) -> &ThreadPool {
        &self.pool
    }

    fn constant(&self, plan: &ModelPlan, b: usize) -> Option<*const u8> {
        self.constant_ptr(plan, b)
    }

    /// Fused attention's query block and the single-thread direct schedules of
    /// its two products at a shape (chosen once per shape, in its plan).
    fn attention_tasks(
        &self,
        ss: &shape::MatMulShape,
        os: &shape::MatMulShape,
        online: bool,
    ) -> Result<shape::AttentionTasks, RunError> {
        let d = self.dispatcher_for(Epilogue::default())?;
        let internal = |e: kernels::KernelError| RunError::Internal(e.to_string());
        let problem = |m: usize, n: usize, k: usize, b: BLayout| Problem {
            batch: 1,
            m: m.max(1),
            n: n.max(1),
            k: k.max(1),
            a: ALayout::RowMajor,
            b,
        };
        let (kl, vl) = (BLayout::of(ss.cs[1], ss.n), BLayout::of(os.cs[1], os.n));
        // The block is a multiple of the kernels' main height.
        let probe = d.task_schedule(&problem(ss.m.min(64), ss.n, ss.k, kl)).map_err(internal)?;
        let height = d.family().direct_of_width(probe.nr).first().map_or(probe.mr, |v| v.kernel.mr);
        let entries = ss.entries.len();
        let (l2, threads) = (d.target().l2, self.pool.threads());
        // Online softmax where the model's softmax has its form and the keys are
        // many (or where the caller asks for chunks).
        let online = if online { self.plan_online(ss.n, ss.m, l2) } else { None };
        let (block, chunk) = match online {
            Some(every) => {
                let (block, chunk) =
                    kernels::online_blocks(l2, threads, entries, ss.m, ss.n, height, probe.nr);
                // A chunk asked for is no longer than the keys (its tiles are allocated).
                (block, Some(every.map_or(chunk, |n| n.min(ss.n.max(1)))))
            }
            None => (kernels::attention_block(l2, threads, entries, ss.m, ss.n, height), None),
        };
        // Each task's products read B from L2, not L1: the width's main (tallest)
        // direct height loads B least per FMA (measured: 8-16 rows run the products
        // 10-20% faster than the 4 the model picks from L1-resident rates).
        let main = |s: kernels::Schedule| kernels::Schedule {
            mr: d.family().direct_of_width(s.nr).first().map_or(s.mr, |v| v.kernel.mr),
            ..s
        };
        let keys = chunk.unwrap_or(ss.n);
        let scores = main(d.task_schedule(&problem(block, keys, ss.k, kl)).map_err(internal)?);
        let output = main(d.task_schedule(&problem(block, os.n, keys, vl)).map_err(internal)?);
        Ok(shape::AttentionTasks { block, chunk, scores, output })
    }

    unsafe fn run_step(
        &self,
        plan: &ModelPlan,
        step: usize,
        sp: &ShapePlan,
        ptrs: &[*mut u8],
    ) -> Result<(), RunError> {
        match (&plan.steps[step].kind, &sp.steps[step]) {
            (StepKind::Loop { program, args: bufs }, StepShape::Loop { launch, .. }) => {
                // The program's arguments: on the stack (no allocation per step)
                // for up to 64 parameters, on the heap past that.
                let mut stack = [std::ptr::null_mut::<u8>(); 64];
                let mut heap = Vec::new();
                let args: &mut [*mut u8] = if bufs.len() <= stack.len() {
                    &mut stack[..bufs.len()]
                } else {
                    heap.resize(bufs.len(), std::ptr::null_mut());
                    &mut heap
                };
                for (slot, b) in args.iter_mut().zip(bufs) {
                    *slot = ptrs[*b];
                }
                match *launch {
                    LoopLaunch::Loop { units, points, parallel } => {
                        self.run_loop(plan, *program, args, &sp.dims, units, points, parallel)
                    }
                    LoopLaunch::Split { points, len, ways } => {
                        self.run_split(plan, *program, args, &sp.dims, points, len, ways)
                    }
                }
            }
            (StepKind::MatMul(mm), StepShape::MatMul(ms)) => self.run_matmul(plan, step, mm, ms, sp, ptrs),
            (StepKind::Attention(a), StepShape::Attention(at)) => self.run_attention(plan, a, at, sp, ptrs),
            _ => Err(RunError::Internal("a step and its shape disagree".into())),
        }
    }
}

/// A copy of `bytes` aligned to `align` bytes, when they are not.
fn aligned_copy(bytes: &[u8], align: usize) -> Option<Vec<u64>> {
    if (bytes.as_ptr() as usize).is_multiple_of(align.max(1)) {
        return None;
    }
    let mut v = vec![0u64; bytes.len().div_ceil(8)];
    // SAFETY: `v` holds at least `bytes.len()` bytes, and the two allocations are distinct.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), v.as_mut_ptr() as *mut u8, bytes.len()) };
    Some(v)
}

/// How the plan reads a buffer.
#[derive(Clone, Copy, Default)]
pub(crate) struct Reads {
    /// As the pre-packed B operand of a matmul.
    packed: bool,
    /// Through the contraction engine otherwise (operands, bias, residual):
    /// these reads need the element type's alignment.
    engine: bool,
    /// By loop programs (unaligned loads) or as a model output.
    other: bool,
}

impl Reads {
    /// A constant read only as a packed weight: once packed, nothing reads its bytes.
    pub(crate) fn packed_only(&self) -> bool {
        self.packed && !self.engine && !self.other
    }
}

pub(crate) fn reads(plan: &ModelPlan) -> Vec<Reads> {
    let mut r = vec![Reads::default(); plan.buffers.len()];
    let matmul = |mm: &plan::MatMulStep, r: &mut Vec<Reads>| {
        if mm.weight {
            r[mm.b.buf].packed = true;
        } else {
            r[mm.b.buf].engine = true;
        }
        for b in [mm.a.buf, mm.c.buf].into_iter().chain(mm.epilogue.buffers()) {
            r[b].engine = true;
        }
    };
    for st in &plan.steps {
        match &st.kind {
            StepKind::Loop { args, .. } => args.iter().for_each(|b| r[*b].other = true),
            StepKind::MatMul(mm) => matmul(mm, &mut r),
            StepKind::Attention(at) => {
                matmul(&at.scores, &mut r);
                matmul(&at.output, &mut r);
                at.args.iter().for_each(|b| r[*b].other = true);
            }
        }
    }
    plan.outputs.iter().for_each(|b| r[*b].other = true);
    r
}

/// Buffer `b` of a call as f32 values, to be read.
fn f32s<'a>(ptrs: &[*mut u8], sp: &'a ShapePlan, b: usize) -> &'a [f32] {
    // SAFETY: buffer `b` holds `numel` f32 values at `ptrs[b]` (an input, output,
    // constant or arena block of this call, aligned), alive for the call; a step
    // only reads its operands this way, and no operand of a step is its output.
    unsafe { std::slice::from_raw_parts(ptrs[b] as *const f32, sp.numel[b]) }
}

/// Buffer `b` as bytes (a buffer of u8 codes).
fn bytes<'a>(ptrs: &[*mut u8], sp: &'a ShapePlan, b: usize) -> &'a [u8] {
    // SAFETY: buffer `b` holds `numel` u8 values at `ptrs[b]` (an input, output,
    // constant or arena block of this call), alive for the call; a step only reads
    // its operands this way, and no operand of a step is its output.
    unsafe { std::slice::from_raw_parts(ptrs[b] as *const u8, sp.numel[b]) }
}

/// Each batch entry's output block of buffer `c` (row-major, at the entries'
/// C offsets), checked to lie inside the buffer: of 8-bit codes (`codes`, a
/// buffer of u8) or f32 values.
fn output_views<'a>(
    ptrs: &[*mut u8],
    sp: &'a ShapePlan,
    c: usize,
    ms: &shape::MatMulShape,
    codes: bool,
) -> Result<Vec<MatMut<'a>>, RunError> {
    let len = (ms.m - 1) * ms.rs[2] + ms.n;
    let mut out = Vec::with_capacity(ms.entries.len());
    for e in &ms.entries {
        if e[2] + len > sp.numel[c] || ms.cs[2] != 1 {
            return Err(RunError::Internal("a matmul output outside its buffer".into()));
        }
        let internal = |e: kernels::KernelError| RunError::Internal(e.to_string());
        // SAFETY: the entries' blocks are disjoint row-major blocks of buffer `c`
        // (checked in bounds above) of `numel` values of its type (bytes for
        // codes), alive for the call, which no operand of the step reads.
        out.push(match codes {
            true => {
                let block = unsafe { std::slice::from_raw_parts_mut(ptrs[c].add(e[2]), len) };
                MatMut::of_codes(block, ms.m, ms.n, ms.rs[2]).map_err(internal)?
            }
            false => {
                let block = unsafe { std::slice::from_raw_parts_mut((ptrs[c] as *mut f32).add(e[2]), len) };
                MatMut::new(block, ms.m, ms.n, ms.rs[2]).map_err(internal)?
            }
        });
    }
    Ok(out)
}

/// The `rows × cols` view at `off` of a buffer, with strides `rs` and `cs`.
fn view(
    all: &[f32],
    off: usize,
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
) -> Result<MatRef<'_>, RunError> {
    MatRef::new(all.get(off..).unwrap_or(&[]), rows, cols, rs, cs)
        .map_err(|e| RunError::Internal(e.to_string()))
}

/// A loop's arguments, shared by the threads of one launch.
#[derive(Clone, Copy)]
struct Shared {
    args: *const *mut u8,
    dims: *const i64,
}

/// A task's copy of the dim table with some slots changed (online softmax's
/// chunk): on the stack for tables of up to 256 slots (the point of the
/// large variant: no allocation per chunk).
#[allow(clippy::large_enum_variant)]
enum DimCopy {
    Stack([i64; 256]),
    Heap(Vec<i64>),
}

impl DimCopy {
    fn of(dims: &[i64]) -> DimCopy {
        if dims.len() <= 256 {
            let mut a = [0i64; 256];
            a[..dims.len()].copy_from_slice(dims);
            DimCopy::Stack(a)
        } else {
            DimCopy::Heap(dims.to_vec())
        }
    }
    fn set(&mut self, slot: u32, v: i64) {
        match self {
            DimCopy::Stack(a) => a[slot as usize] = v,
            DimCopy::Heap(a) => a[slot as usize] = v,
        }
    }
    fn as_ptr(&self) -> *const i64 {
        match self {
            DimCopy::Stack(a) => a.as_ptr(),
            DimCopy::Heap(a) => a.as_ptr(),
        }
    }
}
// SAFETY: the pointers are read-only tables valid for the launch, which returns
// only after every thread is done; the buffers they point to are written at
// disjoint rows by the threads.
unsafe impl Send for Shared {}
// SAFETY: as for `Send`.
unsafe impl Sync for Shared {}

/// The partials' slots of a split reduction, written by the pool's threads.
#[derive(Clone, Copy)]
struct Slots(*mut u64);
// SAFETY: each thread writes only its own slot, and the slots are read after the
// pool has joined (see `run_split`).
unsafe impl Send for Slots {}
// SAFETY: as for `Send`.
unsafe impl Sync for Slots {}

/// The partial of thread `t` for `point` over `lo..hi`, into slot `t`.
///
/// # Safety
/// As for [`call`], for the program `part` was generated from; `slots` has a
/// slot `t` that no other thread writes until the pool joins.
unsafe fn call_part(
    part: PartFn,
    s: Shared,
    point: usize,
    lo: usize,
    hi: usize,
    slots: Slots,
    t: usize,
) -> i64 {
    part(s.args, s.dims, point as i64, lo as i64, hi as i64, slots.0.add(t))
}

/// Run rows `b..e` of a generated loop program.
///
/// # Safety
/// `s.args` holds one pointer per parameter of the program `f` was generated
/// from, each to a live buffer of the size the shape plan gives it, and
/// `s.dims` the model's whole dim table evaluated for the call: what the code
/// generator assumed.
unsafe fn call(f: LoopFn, s: Shared, b: usize, e: usize) -> i64 {
    f(s.args, s.dims, b as i64, e as i64)
}

/// The kernels' view of a constant's weight codes (`[k, n]`, checked by
/// [`ir::ConstData::with_codes`]).
fn quantized_weight(wc: &ir::WeightCodes, k: usize, n: usize) -> kernels::QuantizedWeight<'_> {
    fn codes(c: &ir::ConstData) -> kernels::Codes<'_> {
        match c.dtype {
            DType::I8 => kernels::Codes::I8(bytemuck::cast_slice(&c.bytes()[..])),
            _ => kernels::Codes::U8(&c.bytes()[..]),
        }
    }
    kernels::QuantizedWeight {
        k,
        n,
        bits: wc.bits,
        codes: codes(&wc.codes),
        group: wc.group,
        scales: &wc.scales,
        zero_points: wc.zero_points.as_ref().map(codes),
    }
}
