//! The runtime (DESIGN.md §7, BladeDISC §6): a [`CompiledModel`] holds the
//! execution plan and the buffer plan, and runs any input shape the model's
//! symbols allow; its [`Backend`] holds the generated code for one device and
//! runs the plan's steps there ([`Cpu`]: the loop programs, the contraction
//! engine's kernel families and packed weights, the thread pool).
//!
//! `run` binds the symbols from the inputs and checks every shape fact, then
//! looks up (or builds, once per input-shape signature) the [`shape`] plan: the
//! dim table evaluated, buffer sizes, arena offsets by lifetime, rows per loop
//! and batch entries per matmul. A call then does pointer arithmetic and
//! launches: no compilation, tuning or search. Concurrent calls each take an
//! arena of their own from a pool. No LLVM here.

mod arena;
mod artifact;
mod backend;
mod cpu;
mod explain;
pub mod gpu;
mod memo;
pub mod npy;
mod recycle;
mod shape;

pub use backend::Backend;
pub use cpu::Cpu;
use cpu::CpuCode;
pub use recycle::Recycler;

pub use artifact::{
    is_artifact, reseal as reseal_artifact, ArtifactError, ArtifactOptions, CodeTarget, FORMAT_VERSION,
};

use arena::Arena;
use std::sync::{Arc, Mutex};

use ir::{DType, Elems, Tensor, TensorData, TensorType, TensorView};
use kernels::{CodeImage, Dispatcher, PackedB, ThreadPool};
use plan::{BufferKind, Epilogue, FinishFn, LoopFn, ModelPlan, PartFn};
use sym::ShapeEnv;

pub use memo::SHAPES_KEPT;
use shape::ShapePlan;
pub use shape::MAX_ELEMS;

/// What can go wrong in a call, each naming what and where.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Input(#[from] ir::InputError),
    #[error("{0}")]
    Shape(String),
    /// A kernel found bad data (a gather index out of range, an integer division by zero).
    #[error("{0}")]
    Kernel(String),
    #[error("internal error: {0}")]
    Internal(String),
    /// The GPU: no driver or device, out of device memory, a kernel fault, or
    /// a step the GPU backend does not run.
    #[error("gpu: {0}")]
    Device(String),
    #[error("artifact: {0}")]
    Artifact(ArtifactError),
}

impl RunError {
    /// Whether the inputs are at fault rather than anyshape.
    pub fn is_user_error(&self) -> bool {
        !matches!(self, RunError::Internal(_))
    }
}

/// The time of one call: every step of the plan, in order, and the whole call
/// (binding, planning, allocation and the steps).
#[derive(Clone, Debug, Default)]
pub struct Profile {
    pub steps: Vec<std::time::Duration>,
    pub total: std::time::Duration,
}

/// What the compiler hands the runtime.
pub struct ModelParts {
    pub plan: ModelPlan,
    pub env: ShapeEnv,
    pub inputs: Vec<(String, TensorType)>,
    pub outputs: Vec<(String, TensorType)>,
    /// The entry of each of the plan's loop programs.
    pub loops: Vec<LoopFn>,
    /// The split-reduction entries of each loop program that has a
    /// `plan::SplitReduction` (one long row shared by the threads).
    pub splits: Vec<Option<(PartFn, FinishFn)>>,
    /// The contraction engine for each epilogue the plan's matmuls fuse
    /// ([`plan::MatEpilogue::function`]): a kernel family compiled with it.
    pub dispatchers: Vec<(Epilogue, Dispatcher)>,
    /// The model's own pool, or one it shares with other models.
    pub pool: std::sync::Arc<ThreadPool>,
    /// The machine code the function pointers point into (what an artifact
    /// stores of it: each image's object).
    pub code: Vec<CodeImage>,
    /// Test mode: every temporary and output is placed with a canary margin on
    /// each side, filled before the call and checked after every step (a step
    /// that writes outside its buffers is an error naming the step and buffer).
    pub canaries: bool,
    /// Where the machine code came from.
    pub code_stats: CodeStats,
    /// The CPU the code was generated for (an artifact checks the machine
    /// that loads it has its features).
    pub code_target: CodeTarget,
}

/// How fused attention takes its keys (see `kernels::attention`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KeyChunks {
    /// Online softmax over chunks of keys where a block's whole rows of scores
    /// would not stay in L2; whole rows where they do (the default).
    #[default]
    Auto,
    /// Whole rows of scores at every key length.
    Never,
    /// Chunks at every key length, of the size the cache gives.
    Always,
    /// Chunks of this many keys at every key length (where the model's softmax
    /// has the form online softmax needs): tests drive chunk edges with it.
    Every(usize),
}

/// How the machine code of a compiled model was obtained: modules whose
/// object came from the on-disk cache, and modules compiled by LLVM.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CodeStats {
    pub modules_from_cache: usize,
    pub modules_compiled: usize,
}

/// A compiled model: `Send + Sync`, any number of threads may call
/// [`CompiledModel::run`]. What the plan needs at any shape is here; what runs
/// its steps is the backend's (see [`Backend`]).
pub struct CompiledModel<B: Backend = Cpu> {
    plan: ModelPlan,
    env: ShapeEnv,
    inputs: Vec<(String, TensorType)>,
    outputs: Vec<(String, TensorType)>,
    /// Each output's dims: a constant, or a slot of the dim table.
    out_dims: Vec<Vec<Result<usize, u32>>>,
    canaries: bool,
    shapes: memo::ShapeMemo<ShapePlan>,
    arenas: Mutex<Vec<Arena>>,
    /// Output buffers handed back, for later calls' outputs.
    recycled: Arc<recycle::Pool>,
    backend: B,
}

/// The byte canary margins are filled with.
const CANARY: u8 = 0xA5;

/// Row counts a weight is packed for (a geometric sweep of M).
pub const PACK_ROWS: [usize; 5] = [1, 8, 64, 512, 4096];

impl CompiledModel<Cpu> {
    /// Assemble a compiled model; packs every weight for the contraction engine.
    pub fn new(parts: ModelParts) -> Result<CompiledModel, RunError> {
        CompiledModel::assemble(parts, None)
    }

    /// Assemble a compiled model with its weights packed already (`packed`: one
    /// entry per step), or packed here.
    fn assemble(parts: ModelParts, packed: Option<Vec<Option<PackedB>>>) -> Result<CompiledModel, RunError> {
        let ModelParts {
            plan,
            env,
            inputs,
            outputs,
            loops,
            splits,
            dispatchers,
            pool,
            code,
            canaries,
            code_stats,
            code_target,
        } = parts;
        let code = CpuCode { loops, splits, dispatchers, pool, code, code_stats, code_target };
        let backend = Cpu::new(&plan, code, packed)?;
        // A constant read only as a packed weight is not kept: its packed form
        // is what runs (a folded one, such as a quantized weight's dequantized
        // values, would otherwise stay resident beside it).
        let reads = cpu::reads(&plan);
        let mut plan = plan;
        for (b, r) in plan.buffers.iter_mut().zip(reads) {
            if r.packed_only() && matches!(b.kind, BufferKind::Constant(_)) {
                b.kind = BufferKind::Packed;
            }
        }
        CompiledModel::with_backend(plan, env, inputs, outputs, canaries, backend)
    }

    /// How fused attention takes its keys from now on (shapes planned before
    /// are planned again).
    pub fn with_key_chunks(mut self, k: KeyChunks) -> CompiledModel {
        self.backend.key_chunks = k;
        self.shapes.clear();
        self
    }

    /// The CPU the model's code was generated for.
    pub fn code_target(&self) -> &CodeTarget {
        &self.backend.code_target
    }

    /// Where the machine code came from (the object cache, or LLVM).
    pub fn code_stats(&self) -> CodeStats {
        self.backend.code_stats
    }
}

impl<B: Backend> CompiledModel<B> {
    /// A model of `plan` whose steps `backend` runs.
    fn with_backend(
        plan: ModelPlan,
        env: ShapeEnv,
        inputs: Vec<(String, TensorType)>,
        outputs: Vec<(String, TensorType)>,
        canaries: bool,
        backend: B,
    ) -> Result<CompiledModel<B>, RunError> {
        let outputs_len = outputs.len();
        let mut m = CompiledModel {
            plan,
            env,
            inputs,
            outputs,
            out_dims: Vec::new(),
            canaries,
            shapes: memo::ShapeMemo::new(memo::SHAPES_KEPT),
            arenas: Mutex::new(Vec::new()),
            recycled: recycle::Pool::new(outputs_len),
            backend,
        };
        m.out_dims = m.output_dims()?;
        Ok(m)
    }

    pub fn inputs(&self) -> &[(String, TensorType)] {
        &self.inputs
    }
    pub fn outputs(&self) -> &[(String, TensorType)] {
        &self.outputs
    }
    pub fn plan(&self) -> &ModelPlan {
        &self.plan
    }
    /// Input-shape signatures planned and kept (at most [`SHAPES_KEPT`]).
    pub fn shapes_planned(&self) -> usize {
        self.shapes.len()
    }
    pub fn threads(&self) -> usize {
        self.backend.pool().threads()
    }

    /// Plan the shape of `inputs` without running (kept as a call's plan
    /// is): a server warms the shapes it expects before traffic comes, and
    /// a benchmark times planning apart from the call.
    pub fn plan_shape<T: TensorData>(&self, inputs: &[(&str, T)]) -> Result<(), RunError> {
        self.shape_plan(inputs).map(|_| ())
    }

    fn shape_plan<T: TensorData>(&self, inputs: &[(&str, T)]) -> Result<Arc<ShapePlan>, RunError> {
        let expected: Vec<(&str, &TensorType)> = self.inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let (b, key) = ir::bind_inputs(&self.env, &expected, inputs)?;
        if let Some(p) = self.shapes.get(&key) {
            return Ok(p);
        }
        let choose = |ss: &shape::MatMulShape, os: &shape::MatMulShape, on: bool| {
            self.backend.attention_tasks(ss, os, on).map(Some)
        };
        let start = std::time::Instant::now();
        let p = Arc::new(ShapePlan::build(
            &self.plan,
            &self.env,
            &b,
            self.canaries,
            &choose,
            self.backend.pool().threads(),
        )?);
        tracing::debug!("planned a shape in {:.3} ms", start.elapsed().as_secs_f64() * 1e3);
        self.shapes.insert(key, p.clone());
        Ok(p)
    }

    /// Run on named inputs of any shape the symbols allow; outputs in model order.
    pub fn run(&self, inputs: &[(&str, Tensor)]) -> Result<Vec<(String, Tensor)>, RunError> {
        self.run_timed(inputs, None)
    }

    /// Hand a call's outputs back once they are no longer needed: a later call's
    /// outputs of the same dtype reuse their memory (a decoder's step returns its
    /// whole KV cache; fresh memory every call costs a page fault a page).
    pub fn recycle(&self, outputs: impl IntoIterator<Item = (String, Tensor)>) {
        let r = self.recycled.recycler();
        outputs.into_iter().for_each(|(_, t)| r.give(t));
    }

    /// A handle that hands outputs back to this model ([`CompiledModel::recycle`])
    /// from wherever they end up (the Python package's arrays, when freed).
    pub fn recycler(&self) -> Recycler {
        self.recycled.recycler()
    }

    /// [`CompiledModel::run`] on inputs read in place where they lie (another
    /// owner's arrays: the Python package's numpy feeds).
    pub fn run_views(&self, inputs: &[(&str, TensorView)]) -> Result<Vec<(String, Tensor)>, RunError> {
        self.run_timed(inputs, None)
    }

    /// [`CompiledModel::run`], timing every step (each step of the plan, in
    /// order) and the whole call.
    pub fn run_profiled(
        &self,
        inputs: &[(&str, Tensor)],
    ) -> Result<(Vec<(String, Tensor)>, Profile), RunError> {
        let start = std::time::Instant::now();
        let mut steps = Vec::with_capacity(self.plan.steps.len());
        let out = self.run_timed(inputs, Some(&mut steps))?;
        Ok((out, Profile { steps, total: start.elapsed() }))
    }

    fn run_timed<T: TensorData>(
        &self,
        inputs: &[(&str, T)],
        times: Option<&mut Vec<std::time::Duration>>,
    ) -> Result<Vec<(String, Tensor)>, RunError> {
        let sp = self.shape_plan(inputs)?;
        let mut arena = self.arenas.lock().unwrap_or_else(|e| e.into_inner()).pop().unwrap_or_default();
        if arena.len() < sp.arena_bytes {
            drop(arena);
            arena = Arena::new(sp.arena_bytes).ok_or_else(|| {
                RunError::Shape(format!(
                    "this shape's {} bytes of temporaries could not be allocated",
                    sp.arena_bytes
                ))
            })?;
            let fresh = &arena;
            let pool = self.backend.pool();
            pool.run(&|i| fresh.populate_slice(i, pool.threads()));
            if self.canaries {
                // A temporary read before it is written reads NaN (all-ones bytes),
                // not whatever the allocator left there.
                // SAFETY: the arena's own `sp.arena_bytes` bytes.
                unsafe { std::ptr::write_bytes(arena.as_mut_ptr(), 0xFF, sp.arena_bytes) };
            }
        }
        let mut outs: Vec<Elems> = Vec::with_capacity(self.plan.outputs.len());
        let mut fresh = Vec::with_capacity(self.plan.outputs.len());
        for b in &self.plan.outputs {
            let (buf, n) = (&self.plan.buffers[*b], sp.numel[*b]);
            // A large output reuses a buffer handed back, or is made with room to
            // grow (see `recycle`).
            let (e, new) = self.recycled.output(buf.dtype, n, !self.canaries).ok_or_else(|| {
                RunError::Shape(format!(
                    "output '{}' at this shape has {} elements of {}: more than can be allocated",
                    buf.name, n, buf.dtype
                ))
            })?;
            outs.push(e);
            fresh.push(new);
        }
        // Large new outputs are fresh zero pages: faulted in at once, a slice per
        // thread, rather than a trap per page inside the kernels that write them
        // (a decoder's step returns its whole KV cache).
        let out_bytes: usize = outs.iter().zip(&fresh).filter(|(_, f)| **f).map(|(e, _)| e.byte_len()).sum();
        if out_bytes >= POPULATE_OUTPUTS && !self.canaries {
            let regions: Vec<(usize, usize)> = outs
                .iter_mut()
                .zip(&fresh)
                .filter(|(_, f)| **f)
                .map(|(e, _)| (e.as_mut_ptr() as usize, e.byte_len()))
                .collect();
            let pool = self.backend.pool();
            pool.run(&|i| {
                for &(p, n) in &regions {
                    // SAFETY: each region is one output's allocation, made above and
                    // owned by this call until it returns.
                    unsafe { arena::populate(p as *mut u8, n, i, pool.threads()) }
                }
            });
        }
        let mut ptrs: Vec<*mut u8> = vec![std::ptr::null_mut(); self.plan.buffers.len()];
        for (i, buf) in self.plan.buffers.iter().enumerate() {
            ptrs[i] = match &buf.kind {
                BufferKind::Input(k) => {
                    let name = &self.inputs[*k].0;
                    let t = inputs.iter().find(|(n, _)| n == name).map(|(_, t)| t);
                    t.map_or(std::ptr::null_mut(), |t| t.as_ptr() as *mut u8)
                }
                // SAFETY: as for a temporary: with canaries the shape plan placed the
                // outputs in the arena.
                BufferKind::Output(_) if self.canaries => unsafe { arena.as_mut_ptr().add(sp.offset[i]) },
                BufferKind::Output(k) => outs[*k].as_mut_ptr(),
                BufferKind::Constant(_) => {
                    self.backend.constant(&self.plan, i).unwrap_or(std::ptr::null()) as *mut u8
                }
                // Read through its packed form only.
                BufferKind::Packed => std::ptr::null_mut(),
                // SAFETY: the offset plus the buffer's bytes is within the arena (the
                // shape plan sized it so).
                BufferKind::Temp => unsafe { arena.as_mut_ptr().add(sp.offset[i]) },
            };
        }
        let result = self.execute(&sp, &ptrs, times);
        if self.canaries && result.is_ok() {
            for (k, b) in self.plan.outputs.iter().enumerate() {
                let n = sp.numel[*b] * self.plan.buffers[*b].dtype.size();
                // SAFETY: the output's `n` bytes at its arena offset (the shape plan
                // placed it there), copied into its own, distinct, allocation.
                unsafe { std::ptr::copy_nonoverlapping(ptrs[*b] as *const u8, outs[k].as_mut_ptr(), n) };
            }
        }
        self.arenas.lock().unwrap_or_else(|e| e.into_inner()).push(arena);
        result?;
        outs.into_iter()
            .enumerate()
            .map(|(k, e)| {
                let shape: Vec<usize> = self.out_dims[k]
                    .iter()
                    .map(|d| match d {
                        Ok(c) => Ok(*c),
                        Err(s) => usize::try_from(sp.dims[*s as usize]).map_err(|_| {
                            RunError::Internal(format!("output dim {} is negative", sp.dims[*s as usize]))
                        }),
                    })
                    .collect::<Result<_, _>>()?;
                let t = Tensor::new(shape, e).map_err(|e| RunError::Internal(e.to_string()))?;
                Ok((self.outputs[k].0.clone(), t))
            })
            .collect()
    }

    /// Canaries around step `step`: before it (`check` false), fill the margins
    /// of the buffers it is the first to write (their blocks may have held
    /// another buffer before); after it, check the margins of every buffer live
    /// then, and name the step, the buffer and the byte at fault.
    fn canaries_at(
        &self,
        step: usize,
        sp: &ShapePlan,
        ptrs: &[*mut u8],
        check: bool,
    ) -> Result<(), RunError> {
        for m in &sp.margins {
            let live = if check { m.first <= step && step <= m.last } else { m.first == step };
            if !live {
                continue;
            }
            let at = sp.offset[m.buf] - shape::MARGIN;
            // SAFETY: the margin lies in this call's arena: the shape plan placed it
            // around buffer `m.buf`, whose data starts at `ptrs[m.buf]`, `MARGIN` bytes
            // past its block's start `at`; no kernel runs between the steps, and no
            // buffer live now overlaps it.
            let bytes = unsafe {
                std::slice::from_raw_parts_mut(
                    ptrs[m.buf].sub(shape::MARGIN).add(m.range.start - at),
                    m.range.len(),
                )
            };
            if !check {
                bytes.fill(CANARY);
            } else if let Some(k) = bytes.iter().position(|x| *x != CANARY) {
                let where_ = if m.range.start == at {
                    format!("{} bytes before it", shape::MARGIN - k)
                } else {
                    format!("{k} bytes past its end")
                };
                return Err(RunError::Internal(format!(
                    "step {step} (group {}, {}) wrote outside '{}': {where_}",
                    self.plan.steps[step].group,
                    self.plan.steps[step].kind.name(),
                    self.plan.buffers[m.buf].name
                )));
            }
        }
        Ok(())
    }

    /// Where each output dim comes from, found once.
    fn output_dims(&self) -> Result<Vec<Vec<Result<usize, u32>>>, RunError> {
        let table = self.plan.dims.exprs();
        let dim = |d: &sym::SymExpr| match d.as_const().and_then(|c| usize::try_from(c).ok()) {
            Some(c) => Ok(Ok(c)),
            None => {
                let e = self.env.normalize(d);
                let slot = table.iter().position(|x| *x == e);
                slot.map(|s| Err(s as u32))
                    .ok_or_else(|| RunError::Internal(format!("output dim {d} is not in the dim table")))
            }
        };
        self.plan.outputs.iter().map(|b| self.plan.buffers[*b].shape.iter().map(dim).collect()).collect()
    }

    fn execute(
        &self,
        sp: &ShapePlan,
        ptrs: &[*mut u8],
        mut times: Option<&mut Vec<std::time::Duration>>,
    ) -> Result<(), RunError> {
        for i in 0..self.plan.steps.len() {
            if self.canaries {
                self.canaries_at(i, sp, ptrs, false)?;
            }
            let start = times.is_some().then(std::time::Instant::now);
            // SAFETY: `ptrs` is `run_timed`'s table for this call: every buffer of
            // the plan at its size for `sp` (inputs, outputs, the backend's
            // constants, the arena's temporaries), held for the whole call.
            unsafe { self.backend.run_step(&self.plan, i, sp, ptrs)? };
            if self.canaries {
                self.canaries_at(i, sp, ptrs, true)?;
            }
            if let (Some(t), Some(s)) = (times.as_deref_mut(), start) {
                t.push(s.elapsed());
            }
        }
        Ok(())
    }
}

/// `n` zeros of `dt` (a zeroed allocation: the system's fresh zero pages, no
/// pass over them), or `None` when they cannot be allocated (an absurd shape
/// is an error, not an abort).
fn zeros(dt: DType, n: usize) -> Option<Elems> {
    use bytemuck::allocation::try_zeroed_vec as z;
    Some(match dt {
        DType::F32 => Elems::F32(z(n).ok()?),
        DType::F64 => Elems::F64(z(n).ok()?),
        DType::F16 => Elems::F16(z(n).ok()?),
        DType::BF16 => Elems::BF16(z(n).ok()?),
        DType::I8 => Elems::I8(z(n).ok()?),
        DType::U8 => Elems::U8(z(n).ok()?),
        DType::I32 => Elems::I32(z(n).ok()?),
        DType::I64 => Elems::I64(z(n).ok()?),
        DType::Bool => Elems::Bool(z(n).ok()?),
    })
}

/// `e`'s first `n` elements (its capacity kept).
/// Outputs of at least this many bytes in all are faulted in before the steps run.
const POPULATE_OUTPUTS: usize = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_too_big_to_allocate_are_none_not_an_abort() {
        assert!(zeros(DType::F32, usize::MAX / 2).is_none());
        assert!(zeros(DType::Bool, usize::MAX).is_none());
        assert!(matches!(zeros(DType::I64, 3), Some(Elems::I64(v)) if v == vec![0; 3]));
        assert!(matches!(zeros(DType::F32, 0), Some(Elems::F32(v)) if v.is_empty()));
    }
}
