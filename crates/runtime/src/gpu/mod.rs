//! The GPU backend's run path: a plan's steps as kernel launches on a
//! [`Device`] (the driver, or the emulator that runs the same kernels on the
//! host in CI). The model's half that is the same on every device (binding
//! the inputs, the per-shape plan with its dims, sizes and temporaries'
//! offsets) is the CPU's ([`ShapePlan`]); what differs is where memory lives
//! and what runs a step.
//!
//! A call: the shape planned (memoized per input-shape signature); one
//! device allocation for the call's temporaries, inputs, outputs, each loop
//! step's buffer table, the dim table and a status word per step, kept and
//! reused, grown only when a larger shape comes; the inputs and the tables
//! uploaded in two copies; each loop step launched over the blocks
//! `plan::gpu::loop_blocks` gives at this shape; the status words and the
//! outputs downloaded. Weights are uploaded once, when the model is made.
//!
//! Not yet on the GPU (errors naming the step): contractions and fused
//! attention (issue 37, items 3-4).

#[cfg(feature = "cuda")]
pub mod cuda;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use ir::{Tensor, TensorData, TensorType};
use plan::gpu::{loop_blocks, LOOP_THREADS};
use plan::{BufferKind, ModelPlan, StepKind};
use sym::{Bindings, ShapeEnv};

use crate::shape::{extent, AttentionTasks, MatMulShape, ShapePlan, StepShape};
use crate::{elems_mut_ptr, zeros, RunError};

/// An address in a device's memory.
pub type DevicePtr = u64;

/// Where device allocations start (the widest vector access and more).
pub const DEVICE_ALIGN: usize = 256;

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

    /// Copy `src` to device memory at `dst`.
    ///
    /// # Safety
    /// `dst .. dst + src.len()` lies inside one live allocation of this device.
    unsafe fn upload(&self, dst: DevicePtr, src: &[u8]) -> Result<(), RunError>;

    /// Copy device memory at `src` into `dst`, after every launch before it.
    ///
    /// # Safety
    /// `src .. src + dst.len()` lies inside one live allocation of this device.
    unsafe fn download(&self, src: DevicePtr, dst: &mut [u8]) -> Result<(), RunError>;

    /// Kernel `kernel` (its index in the code the device was given) over
    /// `blocks` blocks of `threads` threads, its parameters `args` (in the
    /// kernel's order), ordered after every launch and copy before it.
    ///
    /// # Safety
    /// `args` are what the kernel's ABI asks for: device pointers into live
    /// allocations large enough for what the kernel touches at this shape.
    unsafe fn launch(
        &self,
        kernel: usize,
        blocks: u32,
        threads: u32,
        args: &[DevicePtr],
    ) -> Result<(), RunError>;
}

/// Whether the GPU backend runs every step of `plan` (an error naming the
/// first it does not).
pub fn check_plan(plan: &ModelPlan) -> Result<(), RunError> {
    for (i, st) in plan.steps.iter().enumerate() {
        if !matches!(st.kind, StepKind::Loop { .. }) {
            return Err(RunError::Device(format!(
                "step {i} (group {}) is a {}: the GPU backend runs loop programs only so far",
                st.group,
                st.kind.name()
            )));
        }
    }
    Ok(())
}

/// Where a call's memory lies in its allocation (byte offsets).
#[derive(Clone, Debug)]
struct CallLayout {
    /// Each buffer's offset (temporaries, inputs, outputs), `None` for constants.
    buffers: Vec<Option<usize>>,
    /// Each step's buffer table, then the dim table, then a status word per step.
    tables: usize,
    dims: usize,
    status: usize,
    bytes: usize,
}

/// A shape's plan, the call's memory layout and each step's blocks at it.
struct GpuShape {
    sp: ShapePlan,
    layout: CallLayout,
    blocks: Vec<u32>,
    bindings: Bindings,
}

/// A model whose loop programs run on a GPU.
pub struct GpuModel<D: Device> {
    plan: ModelPlan,
    env: ShapeEnv,
    inputs: Vec<(String, TensorType)>,
    outputs: Vec<(String, TensorType)>,
    /// Each loop program's kernel on the device.
    kernels: Vec<usize>,
    /// Each constant buffer's device copy.
    constants: Vec<Option<DevicePtr>>,
    shapes: RwLock<HashMap<Vec<i64>, Arc<GpuShape>>>,
    /// The calls' device memory (address, bytes): one call at a time uses it.
    memory: Mutex<Option<(DevicePtr, usize)>>,
    device: D,
}

fn round_up(x: usize) -> usize {
    x.div_ceil(DEVICE_ALIGN) * DEVICE_ALIGN
}

impl<D: Device> GpuModel<D> {
    /// A model of `plan` on `device`, whose kernel `kernels[i]` is loop
    /// program `i`'s; the weights are uploaded here.
    pub fn new(
        plan: ModelPlan,
        env: ShapeEnv,
        inputs: Vec<(String, TensorType)>,
        outputs: Vec<(String, TensorType)>,
        kernels: Vec<usize>,
        device: D,
    ) -> Result<GpuModel<D>, RunError> {
        if kernels.len() != plan.programs.len() {
            return Err(RunError::Internal(format!(
                "{} kernels for {} loop programs",
                kernels.len(),
                plan.programs.len()
            )));
        }
        check_plan(&plan)?;
        let mut m = GpuModel {
            constants: vec![None; plan.buffers.len()],
            plan,
            env,
            inputs,
            outputs,
            kernels,
            shapes: RwLock::new(HashMap::new()),
            memory: Mutex::new(None),
            device,
        };
        for (i, b) in m.plan.buffers.iter().enumerate() {
            match &b.kind {
                BufferKind::Constant(c) => {
                    let bytes = c.bytes();
                    let p = m.device.alloc(bytes.len().max(1))?;
                    m.constants[i] = Some(p);
                    // SAFETY: `p` is a fresh allocation of at least `bytes.len()` bytes.
                    unsafe { m.device.upload(p, bytes)? };
                }
                BufferKind::Packed => {
                    return Err(RunError::Device(format!(
                        "weight '{}' is kept only packed for the CPU: an artifact's model runs on the CPU",
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

    pub fn outputs(&self) -> &[(String, TensorType)] {
        &self.outputs
    }

    pub fn plan(&self) -> &ModelPlan {
        &self.plan
    }

    pub fn device(&self) -> &D {
        &self.device
    }

    /// Input-shape signatures planned so far.
    pub fn shapes_planned(&self) -> usize {
        self.shapes.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    fn shape<T: TensorData>(&self, inputs: &[(&str, T)]) -> Result<Arc<GpuShape>, RunError> {
        let expected: Vec<(&str, &TensorType)> = self.inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let (b, key) = ir::bind_inputs(&self.env, &expected, inputs)?;
        if let Some(s) = self.shapes.read().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(s.clone());
        }
        let no_attention = |_: &MatMulShape, _: &MatMulShape, _: bool| -> Result<AttentionTasks, RunError> {
            Err(RunError::Device("fused attention is not on the GPU yet".into()))
        };
        let sp = ShapePlan::build(&self.plan, &self.env, &b, false, &no_attention, 1)?;
        let layout = self.layout(&sp)?;
        let blocks = self.blocks(&sp)?;
        let s = Arc::new(GpuShape { sp, layout, blocks, bindings: b });
        self.shapes.write().unwrap_or_else(|e| e.into_inner()).insert(key, s.clone());
        Ok(s)
    }

    /// Each loop step's blocks at shape `sp` (its schedule picked by its row's
    /// length there).
    fn blocks(&self, sp: &ShapePlan) -> Result<Vec<u32>, RunError> {
        let mut out = Vec::with_capacity(self.plan.steps.len());
        for (i, (st, step)) in self.plan.steps.iter().zip(&sp.steps).enumerate() {
            let (StepKind::Loop { program, .. }, StepShape::Loop { rows, inner, .. }) = (&st.kind, step)
            else {
                return Err(RunError::Internal(format!("step {i} is not a loop")));
            };
            let p = &self.plan.programs[*program];
            let row_len = match p.gpu_warp_schedule() {
                Some((_, e)) => extent(p, e, &sp.dims)? as i64,
                None => 1,
            };
            out.push(loop_blocks(p.gpu_schedule(row_len), *rows, *inner) as u32);
        }
        Ok(out)
    }

    /// The call's memory at shape `sp`: the temporaries as the CPU's arena
    /// places them, then the inputs and outputs, the tables, the status words.
    fn layout(&self, sp: &ShapePlan) -> Result<CallLayout, RunError> {
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
        let bytes = round_up(status + 8 * self.plan.steps.len());
        Ok(CallLayout { buffers, tables, dims, status, bytes })
    }

    /// Run on named inputs of any shape the symbols allow; outputs in model order.
    pub fn run<T: TensorData>(&self, inputs: &[(&str, T)]) -> Result<Vec<(String, Tensor)>, RunError> {
        let shape = self.shape(inputs)?;
        let (sp, layout) = (&shape.sp, &shape.layout);
        let mut memory = self.memory.lock().unwrap_or_else(|e| e.into_inner());
        if memory.is_none_or(|(_, bytes)| bytes < layout.bytes) {
            if let Some((p, _)) = memory.take() {
                // SAFETY: every launch that used it completed (the last call
                // downloaded its outputs after them).
                unsafe { self.device.free(p) };
            }
            *memory = Some((self.device.alloc(layout.bytes)?, layout.bytes));
        }
        let base = memory.map(|(p, _)| p).ok_or_else(|| RunError::Internal("no device memory".into()))?;
        let ptr = |i: usize| -> Result<DevicePtr, RunError> {
            match (self.constants[i], layout.buffers[i]) {
                (Some(p), _) => Ok(p),
                (None, Some(off)) => Ok(base + off as u64),
                _ => Err(RunError::Internal(format!("buffer {i} has no device memory"))),
            }
        };
        for (i, b) in self.plan.buffers.iter().enumerate() {
            if let BufferKind::Input(k) = b.kind {
                let t = &inputs
                    .iter()
                    .find(|(n, _)| *n == self.inputs[k].0)
                    .ok_or_else(|| RunError::Internal(format!("input '{}' is missing", self.inputs[k].0)))?
                    .1;
                let bytes = sp.numel[i] * b.dtype.size();
                if bytes == 0 {
                    // An empty tensor (a KV cache's first step): nothing to copy.
                    continue;
                }
                // SAFETY: a bound input holds `numel` elements of its dtype.
                let src = unsafe { std::slice::from_raw_parts(TensorData::as_ptr(t), bytes) };
                // SAFETY: the layout gave the input `bytes` bytes at its offset.
                unsafe { self.device.upload(ptr(i)?, src)? };
            }
        }
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
        // SAFETY: the words are plain integers; their bytes are read once.
        let bytes = unsafe { std::slice::from_raw_parts(words.as_ptr() as *const u8, 8 * words.len()) };
        // SAFETY: the layout reserved the tables, dims and status words from `tables`.
        unsafe { self.device.upload(base + layout.tables as u64, bytes)? };
        for (i, st) in self.plan.steps.iter().enumerate() {
            let StepKind::Loop { program, .. } = &st.kind else {
                return Err(RunError::Internal(format!("step {i} is not a loop")));
            };
            let args =
                [base + table_at[i] as u64, base + layout.dims as u64, base + (layout.status + 8 * i) as u64];
            // SAFETY: the table holds every buffer of the program, each sized for
            // this shape; the dims are the plan's at this shape; the status word
            // is the step's own.
            unsafe { self.device.launch(self.kernels[*program], shape.blocks[i], LOOP_THREADS, &args)? };
        }
        let mut status = vec![0u8; 8 * self.plan.steps.len()];
        // SAFETY: the status words lie in the call's memory.
        unsafe { self.device.download(base + layout.status as u64, &mut status)? };
        for (i, w) in status.chunks_exact(8).enumerate() {
            let code = i64::from_le_bytes(w.try_into().unwrap_or_default());
            if code != 0 {
                if let StepKind::Loop { program, .. } = &self.plan.steps[i].kind {
                    let p = &self.plan.programs[*program];
                    let msg =
                        p.checks.get(code as usize - 1).cloned().unwrap_or_else(|| format!("check {code}"));
                    return Err(RunError::Kernel(msg));
                }
            }
        }
        let mut out = Vec::with_capacity(self.plan.outputs.len());
        for (k, &b) in self.plan.outputs.iter().enumerate() {
            let buf = &self.plan.buffers[b];
            let shape: Vec<usize> = buf
                .shape
                .iter()
                .map(|e| self.env.eval(e, &shape.bindings).map(|v| v as usize))
                .collect::<Result<_, _>>()
                .map_err(|e| RunError::Internal(format!("output '{}': {e}", buf.name)))?;
            let n = sp.numel[b];
            let mut elems = zeros(buf.dtype, n).ok_or_else(|| {
                RunError::Shape(format!("output '{}' of {n} elements could not be allocated", buf.name))
            })?;
            if n > 0 {
                // SAFETY: `elems` holds `n` elements of the buffer's dtype.
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(elems_mut_ptr(&mut elems), n * buf.dtype.size())
                };
                // SAFETY: the layout gave the output these bytes at its offset.
                unsafe { self.device.download(ptr(b)?, dst)? };
            }
            let t = Tensor::new(shape, elems).map_err(|e| RunError::Internal(e.to_string()))?;
            out.push((self.outputs[k].0.clone(), t));
        }
        Ok(out)
    }
}

impl<D: Device> Drop for GpuModel<D> {
    fn drop(&mut self) {
        let memory = self.memory.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        for p in self.constants.iter().flatten().copied().chain(memory.map(|(p, _)| p)) {
            // SAFETY: the model owns these allocations; no call is running (it is
            // being dropped) and every call's launches completed before it returned.
            unsafe { self.device.free(p) };
        }
    }
}
