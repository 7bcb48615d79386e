//! The GPU backend's run path: a plan's steps as kernel launches on a
//! [`Device`] (the driver, or the emulator that runs the same kernels on the
//! host in CI). The model's half that is the same on every device (binding
//! the inputs, the per-shape plan with its dims, sizes and temporaries'
//! offsets) is the CPU's ([`ShapePlan`]); what differs is where memory lives
//! and what runs a step.
//!
//! A call: the shape planned (memoized per input-shape signature); a stream
//! of its own (concurrent calls each take one, kept for later calls) and one
//! device allocation for the call's temporaries, inputs, outputs, each loop
//! step's buffer table, the dim table and a status word per step, kept and
//! reused, grown (by half at least) only when a larger shape comes; the inputs and the tables
//! uploaded in two copies; each loop step launched over the blocks
//! `plan::gpu::loop_blocks` gives at this shape; the status words and the
//! outputs downloaded. Weights are uploaded once, when the model is made.
//!
//! Contraction steps run on the GEMM family ([`matmul`]): weights packed to
//! bf16 once, operands copied to bf16 per call, f32 results with the step's
//! epilogue. Fused attention steps run the attention kernel ([`attention`]).

pub mod artifact;
pub mod attention;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod matmul;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ir::{DType, Tensor, TensorData, TensorType};
use plan::gpu::{loop_blocks, schedule_at, GpuLoopSchedule, LOOP_THREADS};
use plan::{BufId, BufferKind, ModelPlan, StepKind};
use sym::{Bindings, ShapeEnv};

use crate::shape::{extent, AttentionTasks, MatMulShape, ShapePlan, StepShape};
use crate::RunError;
pub use attention::AttentionChoice;
use attention::AttentionLaunch;
pub use matmul::GemmChoice;
use matmul::{At, MatMulLaunches};

/// An address in a device's memory.
pub type DevicePtr = u64;

/// A device's queue of copies and launches, each ordered after those before
/// it on the same stream ([`Device::new_stream`]); stream 0 is the device's
/// own, which the weights are uploaded on.
pub type StreamId = usize;

/// A tensor in device memory that the caller owns (a framework's GPU
/// tensor): its address on the model's device, its element type and its
/// row-major shape. [`GpuModel::run_device`] reads inputs and writes outputs
/// given so, without a copy through the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceTensor {
    pub ptr: DevicePtr,
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl DeviceTensor {
    /// Its bytes, `None` past the address space.
    pub fn bytes(&self) -> Option<usize> {
        self.shape.iter().try_fold(self.dtype.size(), |acc, &d| acc.checked_mul(d))
    }
}

/// A device tensor's type and shape for binding the model's symbols (which
/// reads nothing else: its elements are on the device).
struct Described<'a>(&'a DeviceTensor);

impl TensorData for Described<'_> {
    fn dtype(&self) -> DType {
        self.0.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.0.shape
    }
    fn as_ptr(&self) -> *const u8 {
        // Never read: binding takes only the type and the shape.
        std::ptr::null()
    }
}

/// Where device allocations start (the widest vector access and more).
pub const DEVICE_ALIGN: usize = 256;

/// A kernel's argument, typed as its ABI says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelArg {
    Ptr(DevicePtr),
    I32(i32),
    I64(i64),
}

impl KernelArg {
    /// The argument in a 64-bit word (an i32 in the low half), as the driver
    /// and the host emulator read a kernel's parameters.
    pub fn word(&self) -> u64 {
        match *self {
            KernelArg::Ptr(p) => p,
            KernelArg::I32(x) => x as u32 as u64,
            KernelArg::I64(x) => x as u64,
        }
    }
}

/// A launch's geometry: blocks in x, y and z, threads a block, and the bytes
/// of dynamic shared memory a block gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchDims {
    pub grid: [u32; 3],
    pub threads: u32,
    pub smem: u32,
}

/// A kernel's code as the device loads it: its symbol, its text (PTX for a
/// GPU), the dynamic shared memory its launches ask for, and where ptxas
/// assembled it, the cubin (which the driver loads without assembling the
/// PTX; the device that opens it checks that it is for its architecture).
#[derive(Clone, Debug)]
pub struct KernelCode {
    pub name: String,
    pub text: String,
    pub smem: usize,
    pub cubin: Option<Vec<u8>>,
    /// How the device launches it (a dependent launch's kernel waits for
    /// the one before it itself: `codegen::nvptx::dependent_ptx`).
    pub launch: plan::gpu::KernelLaunch,
}

/// A weight as the GEMMs read it: bf16 `[N, K]` (little-endian words),
/// made once from the constant that contraction step `step` (the first to
/// read it) multiplies by.
#[derive(Clone)]
pub struct GpuWeight {
    pub step: usize,
    pub bytes: bytes::Bytes,
}

impl std::fmt::Debug for GpuWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GpuWeight {{ step: {}, {} bytes }}", self.step, self.bytes.len())
    }
}

/// Which packed weight a contraction step reads: its constant, the view of
/// it and its extents (steps with the same key share one).
type PackKey = (BufId, u32, u32, u32, u32, u32);

fn pack_key(mm: &plan::MatMulStep) -> PackKey {
    (mm.b.buf, mm.b.offset, mm.b.rs, mm.b.cs, mm.n, mm.k)
}

/// `plan`'s weights as the GEMMs read them, one per distinct weight view,
/// in the order of the steps that first read them.
pub fn pack_weights(plan: &ModelPlan) -> Result<Vec<GpuWeight>, RunError> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for (i, st) in plan.steps.iter().enumerate() {
        let StepKind::MatMul(mm) = &st.kind else { continue };
        if !mm.weight || !seen.insert(pack_key(mm)) {
            continue;
        }
        let words = matmul::pack_weight(plan, i, mm)?;
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        out.push(GpuWeight { step: i, bytes: bytes.into() });
    }
    Ok(out)
}

/// Which of `plan`'s buffers a GPU reads other than as a packed weight (a
/// constant that only contractions multiply by needs only its packed form).
pub fn read_unpacked(plan: &ModelPlan) -> Vec<bool> {
    let mut read = vec![false; plan.buffers.len()];
    for st in &plan.steps {
        match &st.kind {
            StepKind::Loop { args, .. } => args.iter().for_each(|b| read[*b] = true),
            StepKind::MatMul(mm) => {
                read[mm.a.buf] = true;
                read[mm.b.buf] |= !mm.weight;
                for b in mm.epilogue.buffers() {
                    read[b] = true;
                }
            }
            StepKind::Attention(a) => {
                for b in a.touched() {
                    read[b] = true;
                }
            }
        }
    }
    read
}

/// Which of the device's kernels run a plan's steps: each loop program's,
/// the operand copy kernel, each step's GEMM choices (empty for a step that
/// is no contraction), in the order they are tried, and each fused
/// attention step's kernel.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct GpuKernels {
    pub loops: Vec<usize>,
    pub operand_copy: usize,
    pub matmuls: Vec<Vec<GemmChoice>>,
    pub attentions: Vec<Option<AttentionChoice>>,
}

/// A GPU as the runtime drives it.
pub trait Device: Send + Sync {
    /// What it is, for messages (`"NVIDIA H200 (sm_90)"`, `"host emulator"`).
    fn name(&self) -> String;

    /// `bytes` (at least one) of device memory, aligned to [`DEVICE_ALIGN`].
    /// Out of memory is an error naming the bytes asked for.
    fn alloc(&self, bytes: usize) -> Result<DevicePtr, RunError>;

    /// Free memory from [`Device::alloc`].
    ///
    /// # Safety
    /// `p` came from this device's `alloc` and is not freed already, and no
    /// launch still reads or writes it.
    unsafe fn free(&self, p: DevicePtr);

    /// A stream of its own for a caller: its copies and launches run in
    /// order, beside other streams'.
    fn new_stream(&self) -> Result<StreamId, RunError>;

    /// Copy `src` to device memory at `dst` on `stream`, complete when this
    /// returns.
    ///
    /// # Safety
    /// `dst .. dst + src.len()` lies inside one live allocation of this device
    /// that no other stream uses meanwhile.
    unsafe fn upload(&self, stream: StreamId, dst: DevicePtr, src: &[u8]) -> Result<(), RunError>;

    /// Copy `bytes` of device memory from `src` to `dst` on `stream`, after
    /// every launch and copy before it there, complete when this returns.
    ///
    /// # Safety
    /// Both ranges lie inside live allocations of this device (or memory the
    /// device may address) and do not overlap.
    unsafe fn copy(
        &self,
        stream: StreamId,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<(), RunError>;

    /// Whether `bytes` at `ptr`, memory a caller hands in (a framework's
    /// tensor), are memory of this device; else an error naming `what`.
    fn check_foreign(&self, what: &str, ptr: DevicePtr, bytes: usize) -> Result<(), RunError>;

    /// Wait until the work queued on `stream`, a stream of the caller's
    /// (a driver handle, or 1 and 2: the legacy and the per-thread default
    /// stream), is done: what wrote a foreign tensor before it is read.
    ///
    /// # Safety
    /// `stream` is 1, 2 or a live stream of this device's context.
    unsafe fn wait_foreign(&self, stream: u64) -> Result<(), RunError>;

    /// Copy device memory at `src` into `dst` after every launch before it on
    /// `stream`, complete when this returns.
    ///
    /// # Safety
    /// `src .. src + dst.len()` lies inside one live allocation of this device.
    unsafe fn download(&self, stream: StreamId, src: DevicePtr, dst: &mut [u8]) -> Result<(), RunError>;

    /// Kernel `kernel` (its index in the code the device was given) over
    /// `dims`, its parameters `args` (in the kernel's order), on `stream`
    /// after every launch and copy before it there.
    ///
    /// # Safety
    /// `args` are what the kernel's ABI asks for: device pointers into live
    /// allocations large enough for what the kernel touches at this shape
    /// (what it writes used by no other stream meanwhile), and integers of
    /// the types it declares.
    unsafe fn launch(
        &self,
        stream: StreamId,
        kernel: usize,
        dims: LaunchDims,
        args: &[KernelArg],
    ) -> Result<(), RunError>;

    /// What [`Device::capture`] makes: launches the device replays as one
    /// (a CUDA graph: one submission instead of one per kernel).
    type Graph: Send;

    /// `launches` captured on `stream` as one graph, not run; `None` where
    /// the device has no graphs (its calls replay the launches one by one).
    ///
    /// # Safety
    /// As [`Device::launch`] for each launch, whenever the graph runs.
    unsafe fn capture(&self, stream: StreamId, launches: &[Launch]) -> Result<Option<Self::Graph>, RunError>;

    /// `graph` run on `stream` (the stream it was captured on), after every
    /// launch and copy before it there.
    ///
    /// # Safety
    /// As [`Device::capture`]: the memory its launches use is live and holds
    /// what they read.
    unsafe fn launch_graph(&self, stream: StreamId, graph: &Self::Graph) -> Result<(), RunError>;

    /// `graph` (captured on `stream`) made to run `launches` instead, in
    /// place: the same kernels in the same order, their grids and arguments
    /// new (a CUDA graph's exec update, much cheaper than a new graph).
    /// `Ok(false)` where the device cannot (another sequence of kernels); the
    /// graph is then not to be run again.
    ///
    /// # Safety
    /// As [`Device::capture`] for `launches`.
    unsafe fn update_graph(
        &self,
        stream: StreamId,
        graph: &mut Self::Graph,
        launches: &[Launch],
    ) -> Result<bool, RunError>;

    /// `launches` run on `stream` one at a time, each timed alone: the
    /// seconds each took on the device, complete when this returns. What a
    /// profile reads; nothing overlaps, so the sum exceeds a graph's time.
    ///
    /// # Safety
    /// As [`Device::launch`] for each launch.
    unsafe fn time_launches(&self, stream: StreamId, launches: &[Launch]) -> Result<Vec<f64>, RunError>;

    /// `graph` launched on `stream` and timed on the device (between marks
    /// recorded before and after it): its seconds, complete when this
    /// returns. A call's device time, without the host's part.
    ///
    /// # Safety
    /// As [`Device::launch_graph`].
    unsafe fn time_graph(&self, stream: StreamId, graph: &Self::Graph) -> Result<f64, RunError>;

    /// Kernel `kernel`'s name, for profiles and messages.
    fn kernel_name(&self, kernel: usize) -> String;
}

/// A kernel launch of a call: what [`Device::launch`] is given, and the
/// plan step it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    pub step: usize,
    pub kernel: usize,
    pub dims: LaunchDims,
    pub args: Vec<KernelArg>,
}

/// Whether `a` and `b` launch the same kernels in the same order (what a
/// graph updated in place from one to the other keeps).
pub fn same_kernels(a: &[Launch], b: &[Launch]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.kernel == y.kernel)
}

/// Whether the GPU backend runs every step of `plan` (an error naming the
/// first it does not): a fused attention needs an online softmax program.
pub fn check_plan(plan: &ModelPlan) -> Result<(), RunError> {
    for (i, st) in plan.steps.iter().enumerate() {
        if let StepKind::Attention(a) = &st.kind {
            if a.online.is_none() {
                return Err(RunError::Device(format!(
                    "step {i} (group {}) is a fused attention without an online softmax: not on the GPU",
                    st.group
                )));
            }
        }
    }
    Ok(())
}

/// Where a call's memory lies in its allocation (byte offsets).
#[derive(Clone, Debug)]
struct CallLayout {
    /// Each buffer's offset (temporaries, inputs, outputs), `None` for constants.
    buffers: Vec<Option<usize>>,
    /// Each step's buffer table, then the dim table, then a status word per
    /// step, then the operand copies' descriptors.
    tables: usize,
    dims: usize,
    status: usize,
    /// The contractions' bf16 operands (each step reuses it).
    scratch: usize,
    bytes: usize,
}

/// A caller's stream, the device memory its calls use (address, bytes),
/// the work of its calls at the last shapes it ran (most recent last), and
/// whether its last call was the first at its shape.
struct CallSlot<G> {
    stream: StreamId,
    memory: Option<(DevicePtr, usize)>,
    recorded: Vec<Recorded<G>>,
    last_new: bool,
    /// The device tensors the last call could have bound ([`Bound`]).
    last_bound: Bound,
    /// The record whose tables lie in the memory as uploaded (its status
    /// words zero), if any; and the next record's id.
    tables: Option<u64>,
    next_id: u64,
}

/// Buffers a call reads or writes in the caller's device memory (inputs and
/// outputs given as device tensors), with their addresses.
type Bound = Vec<(BufId, DevicePtr)>;

/// The shapes whose calls a slot keeps recorded.
const RECORDED_SHAPES: usize = 8;

/// A call's work at one shape in one slot's memory, made on its first call
/// and replayed by later ones (nothing of it depends on the inputs' values):
/// the words of the tables (uploaded unless the slot's previous call left
/// them in place: the same record, every status word still zero, and the
/// attention's split counters set back to zero by their last splits) and
/// the launches, which the second call captures as one graph where the
/// device has graphs.
struct Recorded<G> {
    /// Which record of its slot this is (its tables' identity).
    id: u64,
    shape: Arc<GpuShape>,
    /// The buffers bound to the caller's device memory in these launches.
    bound: Bound,
    words: Vec<u64>,
    launches: Vec<Launch>,
    graph: Option<G>,
    calls: usize,
}

/// A shape's plan, the call's memory layout, each loop step's blocks and each
/// matmul step's launches at it.
struct GpuShape {
    sp: ShapePlan,
    layout: CallLayout,
    blocks: Vec<u32>,
    /// The loop steps not launched at this shape: a row norm whose product
    /// runs a normalizing GEMV, which reads the norm's input.
    skipped: Vec<bool>,
    matmuls: Vec<MatMulLaunches>,
    attentions: Vec<Option<AttentionLaunch>>,
    bindings: Bindings,
}

/// A model whose loop programs run on a GPU.
pub struct GpuModel<D: Device> {
    plan: ModelPlan,
    env: ShapeEnv,
    inputs: Vec<(String, TensorType)>,
    outputs: Vec<(String, TensorType)>,
    /// The device's kernels for each step.
    kernels: GpuKernels,
    /// Each constant buffer's device copy (not of those read only as packed weights).
    constants: Vec<Option<DevicePtr>>,
    /// Each matmul step's packed weight (an index into `packed`).
    packed_of: Vec<Option<usize>>,
    /// Weights as bf16 `[N, K]` on the device.
    packed: Vec<DevicePtr>,
    shapes: crate::memo::ShapeMemo<GpuShape>,
    /// Each loop program's schedule rule, read once here rather than from
    /// its expressions at every new shape.
    schedules: Vec<LoopScheduleRule>,
    /// What calls run on: a stream each and its device memory (address,
    /// bytes), kept for the next call; concurrent calls each take their own.
    slots: Mutex<Vec<CallSlot<D::Graph>>>,
    /// What went wrong on the device in an earlier call (a copy or a launch:
    /// a fault leaves the device's context unusable), refusing later calls.
    failed: Mutex<Option<String>>,
    /// Outputs handed back ([`GpuModel::recycle`]), which later calls'
    /// outputs are downloaded into.
    recycled: Arc<crate::recycle::Pool>,
    /// Device memory held: the uploaded weights and constants, every call
    /// slot's memory, and the most both have held at once.
    weight_bytes: usize,
    call_bytes: AtomicUsize,
    peak_bytes: AtomicUsize,
    device: D,
}

/// A call profiled by [`GpuModel::run_profiled`]: each launch's device
/// time, and the whole call's on the host (inputs in, outputs out).
#[derive(Clone, Debug)]
pub struct GpuProfile {
    pub launches: Vec<LaunchTime>,
    pub total: std::time::Duration,
}

/// One launch of a profiled call: the plan step it runs, its kernel, and
/// the seconds it took on the device.
#[derive(Clone, Debug)]
pub struct LaunchTime {
    pub step: usize,
    pub kernel: String,
    pub seconds: f64,
}

/// The device memory a [`GpuModel`] holds (bytes of its own allocations; the
/// driver's context and a CUDA graph's own memory aside).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceMemory {
    /// The weights (bf16 for the GEMMs) and other constants, uploaded once.
    pub weights: usize,
    /// The calls' memory now (activations, inputs, outputs, scratch): one
    /// block a concurrent caller, sized by the largest shape it ran.
    pub calls: usize,
    /// The most the two have added up to.
    pub peak: usize,
}

/// What picks a loop kernel's schedule at a shape: the warp schedule it
/// takes where the row named is long enough, and whether each schedule
/// takes quads ([`plan::gpu::QUAD`]).
#[derive(Clone, Copy, Debug)]
struct LoopScheduleRule {
    warp: Option<(GpuLoopSchedule, plan::E)>,
    quads_points: bool,
    quads_warp: bool,
}

impl LoopScheduleRule {
    fn of(p: &plan::LoopProgram) -> LoopScheduleRule {
        let warp = p.gpu_warp_schedule();
        LoopScheduleRule {
            warp,
            quads_points: p.gpu_quads(GpuLoopSchedule::Points).is_some(),
            quads_warp: warp.is_some_and(|(s, _)| p.gpu_quads(s).is_some()),
        }
    }
}

fn round_up(x: usize) -> usize {
    x.div_ceil(DEVICE_ALIGN) * DEVICE_ALIGN
}

impl<D: Device> GpuModel<D> {
    /// A model of `plan` on `device`, running its steps with `kernels`; the
    /// weights are uploaded here (those read only by contractions as bf16
    /// `[N, K]`, the others as they are).
    pub fn new(
        plan: ModelPlan,
        env: ShapeEnv,
        inputs: Vec<(String, TensorType)>,
        outputs: Vec<(String, TensorType)>,
        kernels: GpuKernels,
        device: D,
    ) -> Result<GpuModel<D>, RunError> {
        if let Some(b) = plan.buffers.iter().find(|b| matches!(b.kind, BufferKind::Packed)) {
            return Err(RunError::Device(format!(
                "weight '{}' is kept only packed for the CPU: an artifact's model runs on the CPU",
                b.name
            )));
        }
        let weights = pack_weights(&plan)?;
        GpuModel::with_weights(plan, env, inputs, outputs, kernels, weights, device)
    }

    /// As [`GpuModel::new`], with the weights already packed ([`pack_weights`]'s,
    /// as a GPU artifact keeps them): a constant that only contractions read
    /// may be absent from the plan (`BufferKind::Packed`).
    pub fn with_weights(
        plan: ModelPlan,
        env: ShapeEnv,
        inputs: Vec<(String, TensorType)>,
        outputs: Vec<(String, TensorType)>,
        kernels: GpuKernels,
        weights: Vec<GpuWeight>,
        device: D,
    ) -> Result<GpuModel<D>, RunError> {
        if kernels.loops.len() != plan.programs.len()
            || kernels.matmuls.len() != plan.steps.len()
            || kernels.attentions.len() != plan.steps.len()
        {
            return Err(RunError::Internal(format!(
                "{} loop kernels for {} loop programs, GEMM choices for {} and attention kernels for {} of {} steps",
                kernels.loops.len(),
                plan.programs.len(),
                kernels.matmuls.len(),
                kernels.attentions.len(),
                plan.steps.len()
            )));
        }
        check_plan(&plan)?;
        let outputs_len = outputs.len();
        for (i, st) in plan.steps.iter().enumerate() {
            let empty = match &st.kind {
                StepKind::MatMul(_) => kernels.matmuls[i].is_empty(),
                StepKind::Attention(_) => kernels.attentions[i].is_none(),
                StepKind::Loop { .. } => false,
            };
            if empty {
                return Err(RunError::Internal(format!("step {i}: no kernel runs it")));
            }
        }
        let read = read_unpacked(&plan);
        let schedules = plan.programs.iter().map(LoopScheduleRule::of).collect();
        let mut m = GpuModel {
            constants: vec![None; plan.buffers.len()],
            packed_of: vec![None; plan.steps.len()],
            packed: Vec::new(),
            plan,
            env,
            inputs,
            outputs,
            kernels,
            shapes: crate::memo::ShapeMemo::new(crate::memo::SHAPES_KEPT),
            schedules,
            slots: Mutex::new(Vec::new()),
            failed: Mutex::new(None),
            recycled: crate::recycle::Pool::new(outputs_len),
            weight_bytes: 0,
            call_bytes: AtomicUsize::new(0),
            peak_bytes: AtomicUsize::new(0),
            device,
        };
        // Each distinct weight view is the next of `weights`, made from the
        // step that reads it first.
        let mut weights = weights.into_iter();
        let mut packs: HashMap<PackKey, usize> = HashMap::new();
        for i in 0..m.plan.steps.len() {
            let StepKind::MatMul(mm) = &m.plan.steps[i].kind else { continue };
            if !mm.weight {
                continue;
            }
            let key = pack_key(mm);
            if let Some(&w) = packs.get(&key) {
                m.packed_of[i] = Some(w);
                continue;
            }
            let w = weights.next().filter(|w| w.step == i).ok_or_else(|| {
                RunError::Internal(format!("step {i}: its packed weight is not the next one given"))
            })?;
            let want = matmul::packed_len(&m.plan, i, mm)?;
            if w.bytes.len() != want {
                return Err(RunError::Internal(format!(
                    "step {i}: a packed weight of {} bytes, {want} expected",
                    w.bytes.len()
                )));
            }
            let p = m.device.alloc(w.bytes.len().max(1))?;
            m.weight_bytes += w.bytes.len().max(1);
            m.packed.push(p);
            // SAFETY: `p` is a fresh allocation of at least `w.bytes.len()` bytes.
            unsafe { m.device.upload(0, p, &w.bytes)? };
            packs.insert(key, m.packed.len() - 1);
            m.packed_of[i] = Some(m.packed.len() - 1);
        }
        if weights.next().is_some() {
            return Err(RunError::Internal("more packed weights than the plan's steps read".into()));
        }
        for (i, b) in m.plan.buffers.iter().enumerate() {
            match &b.kind {
                BufferKind::Constant(_) | BufferKind::Packed if !read[i] => {}
                BufferKind::Constant(c) => {
                    let bytes = c.bytes();
                    let p = m.device.alloc(bytes.len().max(1))?;
                    m.weight_bytes += bytes.len().max(1);
                    m.constants[i] = Some(p);
                    // SAFETY: `p` is a fresh allocation of at least `bytes.len()` bytes.
                    unsafe { m.device.upload(0, p, bytes)? };
                }
                BufferKind::Packed => {
                    return Err(RunError::Device(format!(
                        "weight '{}' is kept only packed, but a GPU kernel reads it as it is",
                        b.name
                    )))
                }
                _ => {}
            }
        }
        Ok(m)
    }

    pub fn inputs(&self) -> &[(String, TensorType)] {
        &self.inputs
    }

    /// Hand a call's outputs back once they are no longer needed: a later
    /// call's outputs of the same dtype are downloaded into their memory (as
    /// [`crate::CompiledModel::recycle`]: a decoder's KV cache is large).
    pub fn recycle(&self, outputs: impl IntoIterator<Item = (String, Tensor)>) {
        let r = self.recycled.recycler();
        outputs.into_iter().for_each(|(_, t)| r.give(t));
    }

    /// A handle that hands outputs back to this model ([`GpuModel::recycle`])
    /// from wherever they end up (the Python package's arrays, when freed).
    pub fn recycler(&self) -> crate::Recycler {
        self.recycled.recycler()
    }

    pub fn outputs(&self) -> &[(String, TensorType)] {
        &self.outputs
    }

    pub fn plan(&self) -> &ModelPlan {
        &self.plan
    }

    /// The device memory it holds ([`DeviceMemory`]).
    pub fn device_memory(&self) -> DeviceMemory {
        let calls = self.call_bytes.load(Ordering::Relaxed);
        DeviceMemory {
            weights: self.weight_bytes,
            calls,
            peak: self.peak_bytes.load(Ordering::Relaxed).max(self.weight_bytes + calls),
        }
    }

    pub fn device(&self) -> &D {
        &self.device
    }

    /// Input-shape signatures planned so far.
    pub fn shapes_planned(&self) -> usize {
        self.shapes.len()
    }

    /// Plan the shape of `inputs` without running (kept as a call's plan
    /// is): what a call at a new shape does before its first launch.
    pub fn plan_shape<T: TensorData>(&self, inputs: &[(&str, T)]) -> Result<(), RunError> {
        self.shape(inputs).map(|_| ())
    }

    fn shape<T: TensorData>(&self, inputs: &[(&str, T)]) -> Result<Arc<GpuShape>, RunError> {
        let expected: Vec<(&str, &TensorType)> = self.inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let (b, key) = ir::bind_inputs(&self.env, &expected, inputs)?;
        if let Some(s) = self.shapes.get(&key) {
            return Ok(s);
        }
        // The attention kernel's geometry is its own: no CPU tasks.
        let no_tasks = |_: &MatMulShape,
                        _: &MatMulShape,
                        _: bool|
         -> Result<Option<AttentionTasks>, RunError> { Ok(None) };
        let sp = ShapePlan::build(&self.plan, &self.env, &b, false, &no_tasks, 1)?;
        let blocks = self.blocks(&sp)?;
        let mut matmuls = Vec::with_capacity(self.plan.steps.len());
        for (i, (st, step)) in self.plan.steps.iter().zip(&sp.steps).enumerate() {
            matmuls.push(match (&st.kind, step) {
                (StepKind::MatMul(mm), StepShape::MatMul(s)) => {
                    matmul::launches(&self.plan, i, mm, s, &self.kernels.matmuls[i], self.packed_of[i])?
                }
                _ => MatMulLaunches::default(),
            });
        }
        let mut attentions = Vec::with_capacity(self.plan.steps.len());
        for (i, (st, step)) in self.plan.steps.iter().zip(&sp.steps).enumerate() {
            attentions.push(match (&st.kind, step, self.kernels.attentions[i]) {
                (StepKind::Attention(a), StepShape::Attention(s), Some(choice)) => {
                    Some(attention::launch(i, a, s, sp.dims.len(), choice)?)
                }
                _ => None,
            });
        }
        let skipped = self.skipped(&matmuls)?;
        let layout = self.layout(&sp, &matmuls, &attentions)?;
        let s = Arc::new(GpuShape { sp, layout, blocks, skipped, matmuls, attentions, bindings: b });
        self.shapes.insert(key, s.clone());
        Ok(s)
    }

    /// Which loop steps a shape whose products launch `matmuls` skips: the
    /// row norm of each product whose launches all normalize (none may
    /// read the norm's output then).
    fn skipped(&self, matmuls: &[MatMulLaunches]) -> Result<Vec<bool>, RunError> {
        let mut skipped = vec![false; self.plan.steps.len()];
        for (i, (st, m)) in self.plan.steps.iter().zip(matmuls).enumerate() {
            let StepKind::MatMul(mm) = &st.kind else { continue };
            let Some(n) = &mm.a_norm else { continue };
            let choices = &self.kernels.matmuls[i];
            let normalizing = m.gemms.iter().filter(|g| choices[g.choice].kernel.norm.is_some()).count();
            if normalizing == 0 {
                continue;
            }
            if normalizing != m.gemms.len() || m.copies.iter().any(|c| c.src == At::Buffer(mm.a.buf, 0)) {
                return Err(RunError::Internal(format!(
                    "step {i}: some of its launches normalize A's rows and others read the norm's"
                )));
            }
            skipped[n.step] = true;
        }
        Ok(skipped)
    }

    /// Each loop step's blocks at shape `sp` (its schedule picked by its row's
    /// length there).
    fn blocks(&self, sp: &ShapePlan) -> Result<Vec<u32>, RunError> {
        let mut out = Vec::with_capacity(self.plan.steps.len());
        for (st, step) in self.plan.steps.iter().zip(&sp.steps) {
            let (StepKind::Loop { program, .. }, StepShape::Loop { rows, inner, .. }) = (&st.kind, step)
            else {
                out.push(0);
                continue;
            };
            let rule = &self.schedules[*program];
            let row_len = match rule.warp {
                Some((_, e)) => extent(&self.plan.programs[*program], e, &sp.dims)? as i64,
                None => 1,
            };
            let schedule = schedule_at(rule.warp, row_len);
            let quads = if schedule == GpuLoopSchedule::Points { rule.quads_points } else { rule.quads_warp };
            out.push(loop_blocks(schedule, *rows, *inner, quads) as u32);
        }
        Ok(out)
    }

    /// The call's memory at shape `sp`: the temporaries as the CPU's arena
    /// places them, then the inputs and outputs, the tables, the status words.
    fn layout(
        &self,
        sp: &ShapePlan,
        matmuls: &[MatMulLaunches],
        attentions: &[Option<AttentionLaunch>],
    ) -> Result<CallLayout, RunError> {
        let too_big = || RunError::Shape("a call's device memory would overflow the address space".into());
        let mut at = round_up(sp.arena_bytes);
        let mut buffers = vec![None; self.plan.buffers.len()];
        for (i, b) in self.plan.buffers.iter().enumerate() {
            match b.kind {
                BufferKind::Temp => buffers[i] = Some(sp.offset[i]),
                BufferKind::Input(_) | BufferKind::Output(_) => {
                    buffers[i] = Some(at);
                    let bytes = sp.numel[i].checked_mul(b.dtype.size()).ok_or_else(too_big)?;
                    at = at.checked_add(round_up(bytes)).ok_or_else(too_big)?;
                }
                _ => {}
            }
        }
        let tables = at;
        let entries: usize = self
            .plan
            .steps
            .iter()
            .map(|s| match &s.kind {
                StepKind::Loop { args, .. } => args.len(),
                _ => 0,
            })
            .sum();
        let dims = tables + 8 * entries;
        let status = dims + 8 * sp.dims.len();
        let descs = status + 8 * self.plan.steps.len();
        let words: usize = matmuls.iter().flat_map(|m| &m.copies).map(|c| c.words.len()).sum::<usize>()
            + matmuls.iter().flat_map(|m| &m.gemms).filter_map(|g| g.fold).map(|f| f.tiles).sum::<usize>()
            + matmuls
                .iter()
                .flat_map(|m| &m.gemms)
                .filter_map(|g| g.taps.as_ref())
                .map(Vec::len)
                .sum::<usize>()
            + attentions
                .iter()
                .flatten()
                .map(|a| a.table.len() + a.descriptor_len() + a.row_blocks)
                .sum::<usize>()
            + attention::dim_tables(attentions.iter().flatten()).len() * sp.dims.len();
        let scratch = round_up(descs + 8 * words);
        // The contractions' operands and the split attentions' partials take
        // turns in one scratch region (the steps run one after another).
        let most = matmuls
            .iter()
            .map(|m| m.scratch)
            .chain(attentions.iter().flatten().map(|a| a.partials))
            .max()
            .unwrap_or(0);
        let bytes = scratch.checked_add(most).map(round_up).ok_or_else(too_big)?;
        Ok(CallLayout { buffers, tables, dims, status, scratch, bytes })
    }

    /// The GEMM kernels each contraction step launches for `inputs`' shape
    /// (step index, kernel names), planning the shape if it is new.
    pub fn gemms_at<T: TensorData>(
        &self,
        inputs: &[(&str, T)],
    ) -> Result<Vec<(usize, Vec<String>)>, RunError> {
        self.contractions_at(inputs, |i, m| {
            m.gemms.iter().map(|g| self.kernels.matmuls[i][g.choice].name()).collect()
        })
    }

    /// The operand copies each contraction step launches for `inputs`' shape
    /// (step index, copies: an A or activation B written as bf16 first),
    /// planning the shape if it is new.
    pub fn copies_at<T: TensorData>(&self, inputs: &[(&str, T)]) -> Result<Vec<(usize, usize)>, RunError> {
        self.contractions_at(inputs, |_, m| m.copies.len())
    }

    /// The loop steps `inputs`' shape skips (a row norm whose product runs a
    /// normalizing GEMV), planning the shape if it is new.
    pub fn skipped_at<T: TensorData>(&self, inputs: &[(&str, T)]) -> Result<Vec<usize>, RunError> {
        let shape = self.shape(inputs)?;
        Ok(shape.skipped.iter().enumerate().filter(|(_, s)| **s).map(|(i, _)| i).collect())
    }

    /// `f` of each contraction step (its index) and its launches at
    /// `inputs`' shape that launches a GEMM (step index, what `f` says).
    fn contractions_at<T: TensorData, R>(
        &self,
        inputs: &[(&str, T)],
        f: impl Fn(usize, &MatMulLaunches) -> R,
    ) -> Result<Vec<(usize, R)>, RunError> {
        let shape = self.shape(inputs)?;
        Ok(shape
            .matmuls
            .iter()
            .enumerate()
            .filter(|(_, m)| !m.gemms.is_empty())
            .map(|(i, m)| (i, f(i, m)))
            .collect())
    }

    /// How each fused attention step runs at `inputs`' shape (step index,
    /// blocks launched, the ways its keys are split), planning the shape if
    /// it is new.
    pub fn attentions_at<T: TensorData>(
        &self,
        inputs: &[(&str, T)],
    ) -> Result<Vec<(usize, u32, usize)>, RunError> {
        let shape = self.shape(inputs)?;
        Ok(shape
            .attentions
            .iter()
            .enumerate()
            .filter_map(|(i, a)| a.as_ref().map(|a| (i, a.blocks, a.splits)))
            .collect())
    }

    /// Run on named inputs of any shape the symbols allow; outputs in model order.
    ///
    /// Out of device memory is an error naming the inputs' shapes and the
    /// bytes (the model stays usable at smaller shapes); a copy or launch the
    /// device fails (a kernel fault) is reported, and every later call is
    /// refused with it: the device's context is lost, the process is not.
    pub fn run<T: TensorData>(&self, inputs: &[(&str, T)]) -> Result<Vec<(String, Tensor)>, RunError> {
        self.usable()?;
        let shape = self.shape(inputs)?;
        self.on_slot(|slot| self.call(Io::Host(inputs), &shape, slot, Timing::Off))
    }

    /// As [`GpuModel::run`], with every launch run alone and timed on the
    /// device ([`Device::time_launches`]): where a call's time goes. The
    /// launches' sum exceeds a plain call's device time (nothing overlaps,
    /// no graph); the host's time is the whole call's.
    pub fn run_profiled<T: TensorData>(
        &self,
        inputs: &[(&str, T)],
    ) -> Result<(Vec<(String, Tensor)>, GpuProfile), RunError> {
        self.usable()?;
        let start = std::time::Instant::now();
        let shape = self.shape(inputs)?;
        let mut timed = Vec::new();
        let outs =
            self.on_slot(|slot| self.call(Io::Host(inputs), &shape, slot, Timing::EachLaunch(&mut timed)))?;
        let total = start.elapsed();
        Ok((outs, GpuProfile { launches: timed, total }))
    }

    /// An error once a call has failed on the device (the model is unusable).
    fn usable(&self) -> Result<(), RunError> {
        match self.failed.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            Some(why) => Err(RunError::Device(format!(
                "the GPU failed in an earlier call ({why}); this model is unusable: load it again"
            ))),
            None => Ok(()),
        }
    }

    /// `f` on a call slot of its own (a stream and memory), taken from those
    /// kept for later calls or made, and kept again after.
    fn on_slot<R>(
        &self,
        f: impl FnOnce(&mut CallSlot<D::Graph>) -> Result<R, RunError>,
    ) -> Result<R, RunError> {
        let taken = self.slots.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut slot = match taken {
            Some(s) => s,
            None => CallSlot {
                stream: self.device.new_stream()?,
                memory: None,
                recorded: Vec::new(),
                last_new: false,
                last_bound: Bound::new(),
                tables: None,
                next_id: 0,
            },
        };
        let out = f(&mut slot);
        self.slots.lock().unwrap_or_else(|e| e.into_inner()).push(slot);
        out
    }

    /// The outputs' names, element types and shapes for inputs in device
    /// memory of these types and shapes (what [`GpuModel::run_device`] is
    /// to be given), planning the shape if it is new.
    pub fn output_shapes(
        &self,
        inputs: &[(&str, DeviceTensor)],
    ) -> Result<Vec<(String, DType, Vec<usize>)>, RunError> {
        let described: Vec<(&str, Described)> = inputs.iter().map(|(n, t)| (*n, Described(t))).collect();
        let shape = self.shape(&described)?;
        self.plan
            .outputs
            .iter()
            .enumerate()
            .map(|(k, &b)| {
                Ok((self.outputs[k].0.clone(), self.plan.buffers[b].dtype, self.output_shape(&shape, b)?))
            })
            .collect()
    }

    /// A call whose inputs and outputs are in device memory the caller owns
    /// (a framework's GPU tensors): the inputs are copied on the device into
    /// the call's memory, the model runs, and each output is copied on the
    /// device to the tensor given for it, of the type and shape
    /// [`GpuModel::output_shapes`] says (anything else is an error naming
    /// it, before anything runs). Complete when it returns; no copy goes
    /// through the host. The outputs are written only after the call ran
    /// without error.
    ///
    /// # Safety
    /// Every tensor's `ptr` addresses the bytes its type and shape say in
    /// memory this model's device may read (inputs) and write (outputs),
    /// live for the call; no output overlaps another tensor given, and no
    /// other work uses the outputs meanwhile.
    pub unsafe fn run_device(
        &self,
        inputs: &[(&str, DeviceTensor)],
        outputs: &[(&str, DeviceTensor)],
    ) -> Result<(), RunError> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.run_device_with(inputs, outputs, Timing::Off) }
    }

    /// [`GpuModel::run_device`], measuring what `timing` asks.
    ///
    /// # Safety
    /// As [`GpuModel::run_device`].
    unsafe fn run_device_with(
        &self,
        inputs: &[(&str, DeviceTensor)],
        outputs: &[(&str, DeviceTensor)],
        timing: Timing<'_>,
    ) -> Result<(), RunError> {
        self.usable()?;
        let described: Vec<(&str, Described)> = inputs.iter().map(|(n, t)| (*n, Described(t))).collect();
        let shape = self.shape(&described)?;
        for (n, t) in inputs {
            if t.bytes().is_none() {
                return Err(RunError::Shape(format!(
                    "input '{n}' of shape {:?} overflows the address space",
                    t.shape
                )));
            }
        }
        // Each output given once, of the type and shape this call makes.
        let mut to = Vec::with_capacity(self.plan.outputs.len());
        for (k, &b) in self.plan.outputs.iter().enumerate() {
            let name = &self.outputs[k].0;
            let mut given = outputs.iter().filter(|(n, _)| n == name);
            let (Some((_, t)), None) = (given.next(), given.next()) else {
                return Err(RunError::Shape(format!(
                    "output '{name}' must be given once (a device tensor to write)"
                )));
            };
            let (dtype, want) = (self.plan.buffers[b].dtype, self.output_shape(&shape, b)?);
            if t.dtype != dtype || t.shape != want {
                return Err(RunError::Shape(format!(
                    "output '{name}' is {dtype} {want:?} for these inputs; the tensor given is {} {:?}",
                    t.dtype, t.shape
                )));
            }
            to.push((b, t.ptr));
        }
        if let Some((n, _)) = outputs.iter().find(|(n, _)| !self.outputs.iter().any(|(o, _)| o == n)) {
            return Err(RunError::Shape(format!("the model has no output '{n}'")));
        }
        let io: Io<'_, Tensor> = Io::OnDevice { inputs, outputs: &to };
        self.on_slot(|slot| self.call(io, &shape, slot, timing)).map(|_| ())
    }

    /// As [`GpuModel::run_device`], also returning the seconds the call's
    /// graph took on the device ([`Device::time_graph`]); `None` for a call
    /// that ran its launches one by one (a shape's first calls).
    ///
    /// # Safety
    /// As [`GpuModel::run_device`].
    pub unsafe fn run_device_timed(
        &self,
        inputs: &[(&str, DeviceTensor)],
        outputs: &[(&str, DeviceTensor)],
    ) -> Result<Option<f64>, RunError> {
        let mut secs = None;
        // SAFETY: the caller's contract, passed on.
        unsafe { self.run_device_with(inputs, outputs, Timing::Graph(&mut secs))? };
        Ok(secs)
    }

    /// Output buffer `b`'s shape at `shape`.
    fn output_shape(&self, shape: &GpuShape, b: usize) -> Result<Vec<usize>, RunError> {
        let buf = &self.plan.buffers[b];
        buf.shape
            .iter()
            .map(|e| self.env.eval(e, &shape.bindings).map(|v| v as usize))
            .collect::<Result<_, _>>()
            .map_err(|e| RunError::Internal(format!("output '{}': {e}", buf.name)))
    }

    /// A call on `slot`'s stream, in its memory (grown for this shape), its
    /// inputs and outputs where `io` says.
    fn call<T: TensorData>(
        &self,
        io: Io<'_, T>,
        shape: &Arc<GpuShape>,
        slot: &mut CallSlot<D::Graph>,
        timed: Timing<'_>,
    ) -> Result<Vec<(String, Tensor)>, RunError> {
        let memory = &mut slot.memory;
        if memory.is_none_or(|(_, bytes)| bytes < shape.layout.bytes) {
            // What was recorded in the old memory goes with it.
            slot.recorded.clear();
            // Grown by half at least, so that shapes growing one step a call (a
            // decoder's cache) move the memory (and drop the recordings) a
            // logarithmic number of times; exactly what this shape needs where
            // the device has no more.
            let bytes = shape.layout.bytes;
            let grown = memory.map_or(bytes, |(_, old)| bytes.max(old.saturating_add(old / 2)));
            if let Some((p, old)) = memory.take() {
                // SAFETY: every launch that used it completed (the last call on
                // this slot downloaded its outputs after them).
                unsafe { self.device.free(p) };
                self.call_bytes.fetch_sub(old, Ordering::Relaxed);
            }
            let got = match self.device.alloc(grown) {
                Err(_) if grown > bytes => self.device.alloc(bytes).map(|p| (p, bytes)),
                r => r.map(|p| (p, grown)),
            };
            let got = got.map_err(|e| match e {
                RunError::Device(why) => {
                    RunError::Device(format!("{why} (a call's memory for inputs {})", io.shapes().join(", ")))
                }
                e => e,
            })?;
            let held = self.call_bytes.fetch_add(got.1, Ordering::Relaxed) + got.1;
            self.peak_bytes.fetch_max(self.weight_bytes + held, Ordering::Relaxed);
            *memory = Some(got);
        }
        let base = memory.map(|(p, _)| p).ok_or_else(|| RunError::Internal("no device memory".into()))?;
        let out = self.run_in(io, shape, base, slot, timed);
        if let Err(RunError::Device(why)) = &out {
            *self.failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(why.clone());
        }
        out
    }

    /// The inputs and outputs of a call on device tensors that its kernels
    /// can read and write where the caller holds them, with no copies: each
    /// aligned as the call's own memory is ([`DEVICE_ALIGN`]), not empty, an
    /// output given for one output buffer alone; none where any two of the
    /// tensors overlap (an output written over an input the kernels still
    /// read: they are copied then, as before).
    fn bindable(
        &self,
        sp: &ShapePlan,
        inputs: &[(&str, DeviceTensor)],
        outputs: &[(BufId, DevicePtr)],
    ) -> Bound {
        let mut bound = Bound::new();
        let bytes = |b: BufId| sp.numel[b] * self.plan.buffers[b].dtype.size();
        for (i, b) in self.plan.buffers.iter().enumerate() {
            if let BufferKind::Input(k) = b.kind {
                let name = &self.inputs[k].0;
                if let Some((_, t)) = inputs.iter().find(|(n, _)| n == name) {
                    bound.push((i, t.ptr));
                }
            }
        }
        for &(b, to) in outputs {
            let once = outputs.iter().filter(|(x, _)| *x == b).count() == 1;
            if once && matches!(self.plan.buffers[b].kind, BufferKind::Output(_)) {
                bound.push((b, to));
            }
        }
        bound.retain(|&(b, p)| bytes(b) > 0 && p % DEVICE_ALIGN as u64 == 0);
        let ranges: Vec<(u64, u64)> = bound.iter().map(|&(b, p)| (p, p + bytes(b) as u64)).collect();
        let overlap =
            ranges.iter().enumerate().any(|(i, a)| ranges[..i].iter().any(|b| a.0 < b.1 && b.0 < a.1));
        if overlap {
            bound.clear();
        }
        bound
    }

    /// Where buffer `i` lies in a call at `layout` in the memory at `base`
    /// (a constant where the model uploaded it).
    fn buffer_at(&self, layout: &CallLayout, base: DevicePtr, i: usize) -> Result<DevicePtr, RunError> {
        match (self.constants[i], layout.buffers[i]) {
            (Some(p), _) => Ok(p),
            (None, Some(off)) => Ok(base + off as u64),
            _ => Err(RunError::Internal(format!("buffer {i} has no device memory"))),
        }
    }

    /// The words of a call's tables at `shape` in the memory at `base` (each
    /// loop step's buffer table, the dims, the cleared status words, the
    /// operand copies' descriptors, each attention's tables) and its launches;
    /// the buffers in `bound` at the caller's addresses.
    fn record(
        &self,
        shape: &GpuShape,
        base: DevicePtr,
        bound: &Bound,
    ) -> Result<(Vec<u64>, Vec<Launch>), RunError> {
        let (sp, layout) = (&shape.sp, &shape.layout);
        let ptr = |i: usize| match bound.iter().find(|(b, _)| *b == i) {
            Some(&(_, p)) => Ok(p),
            None => self.buffer_at(layout, base, i),
        };
        // The buffer tables, the dims and the (cleared) status words, at once.
        let mut words: Vec<u64> = Vec::with_capacity((layout.bytes - layout.tables) / 8);
        let mut table_at = Vec::with_capacity(self.plan.steps.len());
        for st in &self.plan.steps {
            table_at.push(layout.tables + 8 * words.len());
            if let StepKind::Loop { args, .. } = &st.kind {
                for b in args {
                    words.push(ptr(*b)?);
                }
            }
        }
        words.extend(sp.dims.iter().map(|d| *d as u64));
        words.extend(std::iter::repeat_n(0, self.plan.steps.len()));
        // Each operand copy's descriptor, in step order.
        let mut desc_at = Vec::new();
        for c in shape.matmuls.iter().flat_map(|m| &m.copies) {
            desc_at.push(layout.tables + 8 * words.len());
            words.extend(c.words.iter().map(|w| *w as u64));
        }
        // Each folding split-K launch's tile counters, zero at the launch.
        let mut counters_at = Vec::new();
        for f in shape.matmuls.iter().flat_map(|m| &m.gemms).filter_map(|g| g.fold) {
            counters_at.push(layout.tables + 8 * words.len());
            words.extend(std::iter::repeat_n(0, f.tiles));
        }
        // Each taps kernel's descriptor (implicit GEMM).
        let mut taps_at = Vec::new();
        for t in shape.matmuls.iter().flat_map(|m| &m.gemms).filter_map(|g| g.taps.as_ref()) {
            taps_at.push(layout.tables + 8 * words.len());
            words.extend(t.iter().map(|w| *w as u64));
        }
        // Each fused attention's buffer table, dim table and descriptor.
        let mut attention_at = vec![[0usize; 3]; self.plan.steps.len()];
        // Each distinct attention dim table once (the steps share their slots).
        let mut dim_tables: Vec<([(usize, i64); 2], usize)> = Vec::new();
        for (i, a) in shape.attentions.iter().enumerate() {
            let Some(a) = a else { continue };
            attention_at[i][0] = layout.tables + 8 * words.len();
            for b in &a.table {
                words.push(match b {
                    Some(b) => ptr(*b)?,
                    None => 0,
                });
            }
            attention_at[i][1] = match dim_tables.iter().find(|(d, _)| *d == a.dims) {
                Some(&(_, at)) => at,
                None => {
                    let at = layout.tables + 8 * words.len();
                    let start = words.len();
                    words.extend(sp.dims.iter().map(|d| *d as u64));
                    for (slot, v) in a.dims {
                        words[start + slot] = v as u64;
                    }
                    dim_tables.push((a.dims, at));
                    at
                }
            };
            // The split counters, zero at the launch.
            let counters = base + (layout.tables + 8 * words.len()) as u64;
            words.extend(std::iter::repeat_n(0, a.row_blocks));
            attention_at[i][2] = layout.tables + 8 * words.len();
            words.push(base + (layout.status + 8 * i) as u64);
            for b in a.operands {
                words.push(ptr(b)?);
            }
            words.push(base + layout.scratch as u64);
            words.push(counters);
            words.extend(a.words.iter().map(|w| *w as u64));
        }
        let resolve = |at: At| -> Result<KernelArg, RunError> {
            Ok(KernelArg::Ptr(match at {
                At::Buffer(b, off) => ptr(b)? + off as u64,
                At::Scratch(off) => base + (layout.scratch + off) as u64,
                At::Packed(w) => self.packed[w],
                At::Null => 0,
            }))
        };
        let (mut copy, mut fold, mut taps) = (0, 0, 0);
        let mut launches = Vec::new();
        for (i, st) in self.plan.steps.iter().enumerate() {
            match &st.kind {
                StepKind::Loop { .. } if shape.skipped[i] => {}
                StepKind::Loop { program, .. } => {
                    let args = [
                        base + table_at[i] as u64,
                        base + layout.dims as u64,
                        base + (layout.status + 8 * i) as u64,
                    ]
                    .map(KernelArg::Ptr);
                    let dims = LaunchDims { grid: [shape.blocks[i], 1, 1], threads: LOOP_THREADS, smem: 0 };
                    // Sound to launch: the table holds every buffer of the program, each sized for
                    // this shape; the dims are the plan's at this shape; the status word
                    // is the step's own.
                    launches.push(Launch {
                        step: i,
                        kernel: self.kernels.loops[*program],
                        dims,
                        args: args.to_vec(),
                    });
                }
                StepKind::MatMul(_) => {
                    let mm = &shape.matmuls[i];
                    for c in &mm.copies {
                        let desc = KernelArg::Ptr(base + desc_at[copy] as u64);
                        let args = [resolve(c.src)?, resolve(c.dst)?, desc];
                        copy += 1;
                        let dims = LaunchDims { grid: [c.blocks, 1, 1], threads: LOOP_THREADS, smem: 0 };
                        // Sound to launch: the descriptor's entries, rows, columns and strides
                        // stay inside the source buffer at this shape (the plan's view
                        // of it), and the destination is the scratch the layout sized
                        // for this step's operands.
                        launches.push(Launch {
                            step: i,
                            kernel: self.kernels.operand_copy,
                            dims,
                            args: args.to_vec(),
                        });
                    }
                    for g in &mm.gemms {
                        let mut args = Vec::with_capacity(14);
                        for p in g.ptrs {
                            args.push(resolve(p)?);
                        }
                        args.extend(g.ints.map(KernelArg::I32));
                        args.extend(g.strides.map(KernelArg::I64));
                        if let Some(f) = g.fold {
                            args.push(KernelArg::I32(f.kper));
                            args.push(resolve(f.workspace)?);
                            args.push(KernelArg::Ptr(base + counters_at[fold] as u64));
                            fold += 1;
                        }
                        if g.taps.is_some() {
                            args.push(KernelArg::Ptr(base + taps_at[taps] as u64));
                            taps += 1;
                        }
                        if let Some(c16) = g.c16 {
                            args.push(resolve(c16)?);
                        }
                        let dims = LaunchDims { grid: g.grid, threads: g.threads, smem: g.smem };
                        // Sound to launch: `gpu::kernel::ABI`'s arguments: bf16 A and B laid out
                        // as M, N, K, the leading dimensions and batch strides say
                        // (the copies' output or a packed weight), C's view and the
                        // epilogue's f32 buffers sized for this shape; the kernel
                        // accepted the problem. A split-K kernel's `kper` is its
                        // steps a share, its workspace the scratch the layout sized
                        // by `GemmKernel::fold_space`, its counters a word a tile in
                        // the tables, zero (each tile's last block sets it back). A
                        // taps kernel's descriptor, in the tables, holds the taps'
                        // geometry at this shape, inside A's image. A 16-bit copy of C
                        // goes to the step's bf16 buffer laid out as C's.
                        launches.push(Launch { step: i, kernel: g.kernel, dims, args });
                    }
                }
                StepKind::Attention(_) => {
                    let a = shape.attentions[i]
                        .as_ref()
                        .ok_or_else(|| RunError::Internal(format!("step {i}: no attention launch")))?;
                    let args = attention_at[i].map(|at| KernelArg::Ptr(base + at as u64));
                    let dims = LaunchDims {
                        grid: [a.blocks, 1, 1],
                        threads: plan::gpu::ATTENTION_THREADS,
                        smem: a.smem,
                    };
                    // Sound to launch: the buffer table holds the online program's buffers at
                    // this shape (null for the tiles it never touches), the dim table
                    // is this shape's with its chunk the whole row, the descriptor's
                    // views and offsets stay inside Q, K, V and O (the plan's views of
                    // them at this shape), and the status word is the step's own.
                    launches.push(Launch { step: i, kernel: a.kernel, dims, args: args.to_vec() });
                }
            }
        }
        Ok((words, launches))
    }

    /// A graph for a new shape's `launches` in this slot's memory, from the
    /// graph of a shape whose recording goes: `evicted` (the slot keeps no
    /// more shapes) or, where `previous` is given (the call before was at a
    /// new shape too: a decoder's steps), that shape's (met once, not likely
    /// met again), updated in place where it runs the same kernels in the
    /// same order; else, after a new shape, a new capture. `None`: the
    /// launches run one by one (no donor and no run of new shapes, a device
    /// without graphs, or a capture that failed: the log says why).
    fn graph_for_new_shape(
        &self,
        evicted: Option<&mut Recorded<D::Graph>>,
        previous: Option<&mut Recorded<D::Graph>>,
        launches: &[Launch],
        stream: StreamId,
    ) -> Result<Option<D::Graph>, RunError> {
        let after_new = previous.is_some();
        for donor in [evicted, previous].into_iter().flatten() {
            if !same_kernels(&donor.launches, launches) {
                continue;
            }
            let Some(mut g) = donor.graph.take() else { continue };
            // SAFETY: the launches were recorded for this shape in this slot's
            // memory (see `record`), which stays the slot's while the record is
            // kept (the graph goes with it).
            match unsafe { self.device.update_graph(stream, &mut g, launches) } {
                Ok(true) => return Ok(Some(g)),
                // The graph is dropped; the launches still run (the log says why).
                Ok(false) => {}
                Err(e) => tracing::warn!("a graph could not be updated to a new shape's launches ({e})"),
            }
        }
        if !after_new {
            return Ok(None);
        }
        // SAFETY: as above.
        match unsafe { self.device.capture(stream, launches) } {
            Ok(g) => Ok(g),
            Err(e) => {
                tracing::warn!("a call's launches could not be captured as a graph ({e})");
                Ok(None)
            }
        }
    }

    /// `rec`'s tables uploaded (unless `tables_kept`: the memory holds them
    /// as uploaded) and its launches run on `stream`: one by one
    /// on its first call, captured as a graph on its second (where the
    /// device has graphs), the graph run from then on; a new shape right
    /// after another, or in the place of a shape whose graph goes, runs as a
    /// graph from its first call ([`GpuModel::graph_for_new_shape`]).
    /// With `timed`, the launches run one at a time instead, each timed
    /// ([`GpuModel::run_profiled`]), and the graph is left as it was.
    fn replay(
        &self,
        rec: &mut Recorded<D::Graph>,
        base: DevicePtr,
        stream: StreamId,
        timed: Timing<'_>,
        tables_kept: bool,
    ) -> Result<(), RunError> {
        if !tables_kept {
            let tables = base + rec.shape.layout.tables as u64;
            // SAFETY: the words are plain integers; their bytes are read once.
            let bytes =
                unsafe { std::slice::from_raw_parts(rec.words.as_ptr() as *const u8, 8 * rec.words.len()) };
            // SAFETY: the layout reserved the tables, dims and status words from `tables`.
            unsafe { self.device.upload(stream, tables, bytes)? };
        }
        if let Timing::EachLaunch(timed) = timed {
            // SAFETY: as for the launches one by one, below.
            let secs = unsafe { self.device.time_launches(stream, &rec.launches)? };
            timed.extend(rec.launches.iter().zip(secs).map(|(l, seconds)| LaunchTime {
                step: l.step,
                kernel: self.device.kernel_name(l.kernel),
                seconds,
            }));
            return Ok(());
        }
        rec.calls += 1;
        if rec.graph.is_none() && rec.calls == 2 {
            // SAFETY: the launches were recorded for this shape in this memory
            // (see `record`), which stays the slot's while the record is kept.
            match unsafe { self.device.capture(stream, &rec.launches) } {
                Ok(g) => rec.graph = g,
                // The launches still run, one by one; the log says why.
                Err(e) => tracing::warn!("a call's launches could not be captured as a graph ({e})"),
            }
        }
        match (&rec.graph, timed) {
            (Some(g), Timing::Graph(secs)) => {
                // SAFETY: as for its launches, below.
                *secs = Some(unsafe { self.device.time_graph(stream, g)? });
                Ok(())
            }
            // SAFETY: as for its launches, below.
            (Some(g), _) => unsafe { self.device.launch_graph(stream, g) },
            (None, _) => {
                for l in &rec.launches {
                    // SAFETY: each launch's arguments were made by `record` for
                    // this shape in this memory: the tables it uploaded above,
                    // buffers and scratch the layout sized, packed weights (each
                    // comment there says what its kernel's ABI asks).
                    unsafe { self.device.launch(stream, l.kernel, l.dims, &l.args)? };
                }
                Ok(())
            }
        }
    }

    /// A call at `shape` in the device memory at `base`, on `slot`'s stream:
    /// the inputs uploaded, the shape's recorded work (made now if this slot
    /// has none for it) replayed, the status words and outputs downloaded.
    fn run_in<T: TensorData>(
        &self,
        io: Io<'_, T>,
        shape: &Arc<GpuShape>,
        base: DevicePtr,
        slot: &mut CallSlot<D::Graph>,
        timed: Timing<'_>,
    ) -> Result<Vec<(String, Tensor)>, RunError> {
        let (sp, layout, stream) = (&shape.sp, &shape.layout, slot.stream);
        let ptr = |i: usize| self.buffer_at(layout, base, i);
        // Tensors the previous call on this slot also gave are bound (a
        // caller that keeps its tensors replays one recording); new ones are
        // copied, so that fresh tensors each call do not record each call.
        let bindable = match io {
            Io::OnDevice { inputs, outputs } => self.bindable(sp, inputs, outputs),
            Io::Host(_) => Bound::new(),
        };
        let bound = if bindable == slot.last_bound { bindable.clone() } else { Bound::new() };
        slot.last_bound = bindable;
        let in_place: Vec<BufId> = bound.iter().map(|(b, _)| *b).collect();
        for (i, b) in self.plan.buffers.iter().enumerate() {
            if in_place.contains(&i) {
                // Read where the caller holds it.
                continue;
            }
            if let BufferKind::Input(k) = b.kind {
                let name = &self.inputs[k].0;
                let missing = || RunError::Internal(format!("input '{name}' is missing"));
                let bytes = sp.numel[i] * b.dtype.size();
                if bytes == 0 {
                    // An empty tensor (a KV cache's first step): nothing to copy.
                    continue;
                }
                match io {
                    Io::Host(inputs) => {
                        let t = &inputs.iter().find(|(n, _)| n == name).ok_or_else(missing)?.1;
                        // SAFETY: a bound input holds `numel` elements of its dtype.
                        let src = unsafe { std::slice::from_raw_parts(TensorData::as_ptr(t), bytes) };
                        // SAFETY: the layout gave the input `bytes` bytes at its offset.
                        unsafe { self.device.upload(stream, ptr(i)?, src)? };
                    }
                    Io::OnDevice { inputs, .. } => {
                        let t = &inputs.iter().find(|(n, _)| n == name).ok_or_else(missing)?.1;
                        // SAFETY: the caller's contract (`run_device`): the bound input's
                        // `bytes` lie at its address; the layout gave the copy's
                        // destination these bytes at its offset.
                        unsafe { self.device.copy(stream, ptr(i)?, t.ptr, bytes)? };
                    }
                }
            }
        }
        let at = match slot.recorded.iter().position(|r| Arc::ptr_eq(&r.shape, shape) && r.bound == bound) {
            Some(at) => {
                slot.last_new = false;
                at
            }
            None => {
                let (words, launches) = self.record(shape, base, &bound)?;
                slot.next_id += 1;
                let id = slot.next_id;
                let mut rec =
                    Recorded { id, shape: shape.clone(), bound, words, launches, graph: None, calls: 0 };
                let mut evicted = (slot.recorded.len() == RECORDED_SHAPES).then(|| slot.recorded.remove(0));
                // After a new shape (a decoder's steps, each at a longer
                // cache), or in the place of a shape whose graph goes: run as
                // a graph from the first call.
                let previous = match std::mem::replace(&mut slot.last_new, true) {
                    true => slot.recorded.last_mut(),
                    false => None,
                };
                rec.graph = self.graph_for_new_shape(evicted.as_mut(), previous, &rec.launches, stream)?;
                slot.recorded.push(rec);
                slot.recorded.len() - 1
            }
        };
        // The most recently used last.
        let mut rec = slot.recorded.remove(at);
        let tables_kept = slot.tables.take() == Some(rec.id);
        let id = rec.id;
        let ran = self.replay(&mut rec, base, stream, timed, tables_kept);
        slot.recorded.push(rec);
        ran?;
        let mut status = vec![0u8; 8 * self.plan.steps.len()];
        // SAFETY: the status words lie in the call's memory.
        unsafe { self.device.download(stream, base + layout.status as u64, &mut status)? };
        for (i, w) in status.chunks_exact(8).enumerate() {
            let code = i64::from_le_bytes(w.try_into().unwrap_or_default());
            if code != 0 {
                let program = match &self.plan.steps[i].kind {
                    StepKind::Loop { program, .. } => Some(*program),
                    StepKind::Attention(a) => a.online.as_ref().map(|o| o.program),
                    StepKind::MatMul(_) => None,
                };
                if let Some(program) = program {
                    let p = &self.plan.programs[program];
                    let msg =
                        p.checks.get(code as usize - 1).cloned().unwrap_or_else(|| format!("check {code}"));
                    return Err(RunError::Kernel(msg));
                }
            }
        }
        if status.iter().all(|&b| b == 0) {
            // The next call of this record finds its tables as uploaded.
            slot.tables = Some(id);
        }
        if let Io::OnDevice { outputs, .. } = io {
            for &(b, to) in outputs {
                let bytes = sp.numel[b] * self.plan.buffers[b].dtype.size();
                if bytes > 0 && !in_place.contains(&b) {
                    // SAFETY: the layout gave the output these bytes at its offset; the
                    // caller's contract (`run_device`) gives `to` as many, its own.
                    unsafe { self.device.copy(stream, to, ptr(b)?, bytes)? };
                }
            }
            return Ok(Vec::new());
        }
        let mut out = Vec::with_capacity(self.plan.outputs.len());
        for (k, &b) in self.plan.outputs.iter().enumerate() {
            let buf = &self.plan.buffers[b];
            let shape = self.output_shape(shape, b)?;
            let n = sp.numel[b];
            // A large output reuses a buffer handed back, or is made with room
            // to grow (see `crate::recycle`).
            let (mut elems, _) = self.recycled.output(buf.dtype, n, true).ok_or_else(|| {
                RunError::Shape(format!("output '{}' of {n} elements could not be allocated", buf.name))
            })?;
            if n > 0 {
                // SAFETY: `elems` holds `n` elements of the buffer's dtype.
                let dst = unsafe { std::slice::from_raw_parts_mut(elems.as_mut_ptr(), n * buf.dtype.size()) };
                // SAFETY: the layout gave the output these bytes at its offset.
                unsafe { self.device.download(stream, ptr(b)?, dst)? };
            }
            let t = Tensor::new(shape, elems).map_err(|e| RunError::Internal(e.to_string()))?;
            out.push((self.outputs[k].0.clone(), t));
        }
        Ok(out)
    }
}

/// Where a call's inputs come from and its outputs go: host tensors (the
/// outputs made as new ones), or device memory the caller owns (each output
/// buffer with the address it is copied to).
enum Io<'a, T> {
    Host(&'a [(&'a str, T)]),
    OnDevice { inputs: &'a [(&'a str, DeviceTensor)], outputs: &'a [(BufId, DevicePtr)] },
}

impl<T> Clone for Io<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Io<'_, T> {}

impl<T: TensorData> Io<'_, T> {
    /// The inputs' names and shapes, for messages.
    fn shapes(&self) -> Vec<String> {
        match self {
            Io::Host(inputs) => {
                inputs.iter().map(|(n, t)| format!("{n} {:?}", TensorData::shape(t))).collect()
            }
            Io::OnDevice { inputs, .. } => inputs.iter().map(|(n, t)| format!("{n} {:?}", t.shape)).collect(),
        }
    }
}

impl<D: Device> Drop for GpuModel<D> {
    fn drop(&mut self) {
        let slots = std::mem::take(self.slots.get_mut().unwrap_or_else(|e| e.into_inner()));
        let owned = self.constants.iter().flatten().chain(&self.packed).copied();
        for p in owned.chain(slots.iter().filter_map(|s| s.memory.map(|(p, _)| p))) {
            // SAFETY: the model owns these allocations; no call is running (it is
            // being dropped) and every call's launches completed before it returned.
            unsafe { self.device.free(p) };
        }
    }
}

/// What a call measures on the device besides running.
enum Timing<'a> {
    /// Nothing: a plain call.
    Off,
    /// Every launch alone ([`Device::time_launches`]), in place of the graph.
    EachLaunch(&'a mut Vec<LaunchTime>),
    /// The call's graph between two marks ([`Device::time_graph`]); left
    /// `None` by a call that runs no graph.
    Graph(&'a mut Option<f64>),
}

/// Inputs and outputs of calls at one shape, held in device memory of their
/// own ([`GpuModel::device_io`]): how a server that keeps its tensors on the
/// GPU (a decoder's KV cache) calls the model, with nothing copied through
/// the host. Freed when dropped.
pub struct DeviceIo<'m, D: Device> {
    model: &'m GpuModel<D>,
    inputs: Vec<(String, DeviceTensor)>,
    outputs: Vec<(String, DeviceTensor)>,
}

impl<D: Device> GpuModel<D> {
    /// `inputs` uploaded once into device memory allocated for them, and
    /// device memory for the outputs at their shape: [`DeviceIo::run`]
    /// then calls the model on them (what `bench --on-device` times).
    pub fn device_io<T: TensorData>(&self, inputs: &[(&str, T)]) -> Result<DeviceIo<'_, D>, RunError> {
        let mut io = DeviceIo { model: self, inputs: Vec::new(), outputs: Vec::new() };
        for (name, t) in inputs {
            let dt = DeviceTensor { ptr: 0, dtype: t.dtype(), shape: t.shape().to_vec() };
            let bytes = dt.bytes().ok_or_else(|| {
                RunError::Shape(format!("input '{name}' of shape {:?} overflows the address space", dt.shape))
            })?;
            let ptr = self.device.alloc(bytes)?;
            io.inputs.push((name.to_string(), DeviceTensor { ptr, ..dt }));
            // SAFETY: a tensor's `bytes` bytes from its start; the allocation has
            // as many and is this call's alone.
            let src = unsafe { std::slice::from_raw_parts(TensorData::as_ptr(t), bytes) };
            // SAFETY: `ptr` was allocated above with `bytes` bytes; stream 0 is the
            // device's own, and the copy completes before this returns.
            unsafe { self.device.upload(0, ptr, src)? };
        }
        let named: Vec<(&str, DeviceTensor)> =
            io.inputs.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        for (name, dtype, shape) in self.output_shapes(&named)? {
            let dt = DeviceTensor { ptr: 0, dtype, shape };
            let ptr = self.device.alloc(dt.bytes().unwrap_or(0))?;
            io.outputs.push((name, DeviceTensor { ptr, ..dt }));
        }
        Ok(io)
    }
}

impl<D: Device> DeviceIo<'_, D> {
    /// One call on the inputs in device memory, its outputs written to theirs.
    pub fn run(&mut self) -> Result<(), RunError> {
        // SAFETY: every tensor is an allocation of the model's device of the
        // bytes its type and shape say (made by `device_io`), owned here and
        // live until this is dropped; no two overlap, and `&mut self` keeps
        // any other call off the outputs meanwhile.
        unsafe { self.model.run_device(&named(&self.inputs), &named(&self.outputs)) }
    }

    /// As [`DeviceIo::run`], also returning the seconds the call's graph
    /// took on the device (`None` for a shape's first calls, run launch by
    /// launch).
    pub fn run_timed(&mut self) -> Result<Option<f64>, RunError> {
        // SAFETY: as for `run`.
        unsafe { self.model.run_device_timed(&named(&self.inputs), &named(&self.outputs)) }
    }

    /// The outputs of the last call, copied to the host.
    pub fn outputs(&self) -> Result<Vec<(String, Tensor)>, RunError> {
        let mut out = Vec::with_capacity(self.outputs.len());
        for (name, t) in &self.outputs {
            let n: usize = t.shape.iter().product();
            let (mut elems, _) = self.model.recycled.output(t.dtype, n, false).ok_or_else(|| {
                RunError::Shape(format!("output '{name}' of {n} elements could not be allocated"))
            })?;
            let bytes = n * t.dtype.size();
            if bytes > 0 {
                // SAFETY: `elems` holds `n` elements of the output's dtype.
                let dst = unsafe { std::slice::from_raw_parts_mut(elems.as_mut_ptr(), bytes) };
                // SAFETY: the output's allocation holds these bytes (`device_io`).
                unsafe { self.model.device.download(0, t.ptr, dst)? };
            }
            out.push((
                name.clone(),
                Tensor::new(t.shape.clone(), elems).map_err(|e| RunError::Internal(e.to_string()))?,
            ));
        }
        Ok(out)
    }
}

/// Device tensors by name, as the model's calls take them.
fn named(v: &[(String, DeviceTensor)]) -> Vec<(&str, DeviceTensor)> {
    v.iter().map(|(n, t)| (n.as_str(), t.clone())).collect()
}

impl<D: Device> Drop for DeviceIo<'_, D> {
    fn drop(&mut self) {
        for (_, t) in self.inputs.iter().chain(&self.outputs) {
            // SAFETY: allocated by `device_io` on this device, freed once; `free`
            // waits for the device's work first.
            unsafe { self.model.device.free(t.ptr) };
        }
    }
}
