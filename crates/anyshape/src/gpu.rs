//! The GPU backend from the public API. A model's loop programs compile to
//! NVPTX kernels (`codegen::nvptx`), its contraction steps to kernels of the
//! GEMM family (`anyshape-gpu`'s `steps`: for a weight, the wave model's pick
//! per M from a device profile), and they run through
//! the runtime's [`GpuModel`] on a [`CudaDevice`] (the driver) or a
//! [`HostDevice`] (the GPU emulated on this machine: what CI runs every GPU
//! kernel on).

use std::alloc::Layout;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

use codegen::emulator::{HostKernelKind, HostKernels};
pub use gpu_family::steps::StepTarget as GpuTarget;
use plan::gemm::{Arch, GemmKernel};
pub use plan::gpu::KernelLaunch;
pub use runtime::gpu::artifact::{is_gpu_artifact, GpuArtifact, GpuCode, KernelRole};
pub use runtime::gpu::cuda::CudaDevice;
pub use runtime::gpu::{check_plan, Device, DevicePtr, DeviceTensor, GemmChoice, GpuKernels, GpuModel};
use runtime::gpu::{KernelArg, KernelCode, Launch, LaunchDims, StreamId, DEVICE_ALIGN};
use runtime::RunError;

use crate::{Error, Model};

/// Blocks the emulator runs of a launch: the loop kernels take their units
/// grid-stride, so a few blocks compute everything (and the stride loop is
/// exercised); each block's threads are coroutines of one host thread.
pub const EMULATED_BLOCKS: u32 = 4;

/// A GPU emulated on the host: device memory is host memory, a loop (or
/// operand copy, or attention) launch runs at most [`EMULATED_BLOCKS`] of the
/// kernel's blocks with the emulator's threads, a GEMM every block.
pub struct HostDevice {
    kernels: HostKernels,
    /// Live allocations: address → layout.
    allocs: Mutex<HashMap<DevicePtr, Layout>>,
    /// The most bytes live at once (a device's memory), if limited.
    limit: std::sync::atomic::AtomicUsize,
    /// Streams handed out.
    streams: std::sync::atomic::AtomicUsize,
    /// Graphs run ([`Device::launch_graph`]).
    graph_launches: std::sync::atomic::AtomicUsize,
    /// Graphs updated in place ([`Device::update_graph`]).
    graph_updates: std::sync::atomic::AtomicUsize,
    /// Allocations made ([`Device::alloc`]).
    allocations: std::sync::atomic::AtomicUsize,
    /// Copies within device memory ([`Device::copy`]).
    copies: std::sync::atomic::AtomicUsize,
    /// Copies from the host ([`Device::upload`]).
    uploads: std::sync::atomic::AtomicUsize,
}

impl HostDevice {
    pub fn new(kernels: HostKernels) -> HostDevice {
        HostDevice {
            kernels,
            allocs: Mutex::new(HashMap::new()),
            limit: usize::MAX.into(),
            streams: 0.into(),
            graph_launches: 0.into(),
            graph_updates: 0.into(),
            allocations: 0.into(),
            copies: 0.into(),
            uploads: 0.into(),
        }
    }

    /// Copies from the host so far (inputs, and a call's tables where the
    /// memory does not hold them already).
    pub fn uploads(&self) -> usize {
        self.uploads.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Copies made within device memory so far (device tensors' inputs
    /// and outputs a call did not read or write in place).
    pub fn copies(&self) -> usize {
        self.copies.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Allocations made so far (the weights', then each caller's memory as
    /// it grows).
    pub fn allocations(&self) -> usize {
        self.allocations.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Captured graphs run so far (calls that replayed a shape's recorded
    /// launches as one).
    pub fn graph_launches(&self) -> usize {
        self.graph_launches.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Graphs updated in place to run a new shape's launches.
    pub fn graph_updates(&self) -> usize {
        self.graph_updates.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Streams handed out to callers (one per caller that ran at once with
    /// another).
    pub fn streams(&self) -> usize {
        self.streams.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Emulate a device of `bytes` of memory: an allocation past it fails as
    /// a GPU's does (out of device memory).
    pub fn set_memory(&self, bytes: usize) {
        self.limit.store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// Bytes allocated and not freed.
    pub fn bytes_live(&self) -> usize {
        self.allocs.lock().unwrap_or_else(|e| e.into_inner()).values().map(|l| l.size()).sum()
    }
}

impl Device for HostDevice {
    /// The launches themselves: a replay runs them in order, as a GPU runs a
    /// captured graph.
    type Graph = Vec<Launch>;

    unsafe fn capture(&self, _: StreamId, launches: &[Launch]) -> Result<Option<Vec<Launch>>, RunError> {
        Ok(Some(launches.to_vec()))
    }

    unsafe fn update_graph(
        &self,
        _: StreamId,
        graph: &mut Vec<Launch>,
        launches: &[Launch],
    ) -> Result<bool, RunError> {
        if !runtime::gpu::same_kernels(graph, launches) {
            return Ok(false);
        }
        graph.clone_from_slice(launches);
        self.graph_updates.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(true)
    }

    unsafe fn launch_graph(&self, stream: StreamId, graph: &Vec<Launch>) -> Result<(), RunError> {
        self.graph_launches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        for l in graph {
            // SAFETY: the caller's contract for the graph is each launch's.
            unsafe { self.launch(stream, l.kernel, l.dims, &l.args)? };
        }
        Ok(())
    }

    /// Host time: the graph's launches complete before it returns.
    unsafe fn time_graph(&self, stream: StreamId, graph: &Vec<Launch>) -> Result<f64, RunError> {
        let start = std::time::Instant::now();
        // SAFETY: the caller's contract, passed on.
        unsafe { self.launch_graph(stream, graph)? };
        Ok(start.elapsed().as_secs_f64())
    }

    fn name(&self) -> String {
        "host emulator".into()
    }

    fn kernel_name(&self, kernel: usize) -> String {
        self.kernels.name(kernel).map_or_else(|| format!("#{kernel}"), str::to_string)
    }

    /// Host time: each launch completes before it returns.
    unsafe fn time_launches(&self, stream: StreamId, launches: &[Launch]) -> Result<Vec<f64>, RunError> {
        let mut secs = Vec::with_capacity(launches.len());
        for l in launches {
            let start = std::time::Instant::now();
            // SAFETY: the caller's contract, passed on.
            unsafe { self.launch(stream, l.kernel, l.dims, &l.args)? };
            secs.push(start.elapsed().as_secs_f64());
        }
        Ok(secs)
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr, RunError> {
        let oom = || RunError::Device(format!("out of device memory: {bytes} bytes asked for"));
        let limit = self.limit.load(std::sync::atomic::Ordering::Relaxed);
        if self.bytes_live().checked_add(bytes).is_none_or(|b| b > limit) {
            return Err(oom());
        }
        let layout = Layout::from_size_align(bytes.max(1), DEVICE_ALIGN).map_err(|_| oom())?;
        // SAFETY: the layout's size is at least 1.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(RunError::Device(format!("out of device memory: {bytes} bytes asked for")));
        }
        self.allocs.lock().unwrap_or_else(|e| e.into_inner()).insert(p as DevicePtr, layout);
        self.allocations.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(p as DevicePtr)
    }

    unsafe fn free(&self, p: DevicePtr) {
        if let Some(layout) = self.allocs.lock().unwrap_or_else(|e| e.into_inner()).remove(&p) {
            // SAFETY: `p` was allocated with this layout and is freed once (it is
            // removed from the live set here).
            unsafe { std::alloc::dealloc(p as *mut u8, layout) };
        }
    }

    fn new_stream(&self) -> Result<StreamId, RunError> {
        // Every copy and launch completes before it returns: one order serves all.
        Ok(self.streams.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1)
    }

    unsafe fn upload(&self, _: StreamId, dst: DevicePtr, src: &[u8]) -> Result<(), RunError> {
        self.uploads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the caller's contract: `dst` has `src.len()` bytes of one allocation.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }

    /// The emulator's device memory is this process's: any non-null address
    /// (the caller vouches for its bytes, as for a host array).
    fn check_foreign(&self, what: &str, ptr: DevicePtr, bytes: usize) -> Result<(), RunError> {
        if ptr == 0 && bytes > 0 {
            return Err(RunError::Shape(format!("{what} has a null address")));
        }
        Ok(())
    }

    /// Every copy and launch here completes before it returns.
    unsafe fn wait_foreign(&self, _: u64) -> Result<(), RunError> {
        Ok(())
    }

    unsafe fn copy(&self, _: StreamId, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<(), RunError> {
        self.copies.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the caller's contract: both ranges of `bytes` lie in memory of
        // this process (the emulator's device memory is the host's), apart.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, bytes) };
        Ok(())
    }

    unsafe fn download(&self, _: StreamId, src: DevicePtr, dst: &mut [u8]) -> Result<(), RunError> {
        // SAFETY: the caller's contract: `src` has `dst.len()` bytes of one allocation.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    unsafe fn launch(
        &self,
        _: StreamId,
        kernel: usize,
        dims: LaunchDims,
        all: &[KernelArg],
    ) -> Result<(), RunError> {
        let bad = || RunError::Internal(format!("kernel {kernel}: arguments {all:?}"));
        let ptr = |a: &KernelArg| match a {
            KernelArg::Ptr(p) => Ok(*p),
            _ => Err(bad()),
        };
        let kind =
            self.kernels.kind(kernel).ok_or_else(|| RunError::Internal(format!("no kernel {kernel}")))?;
        match (kind, all) {
            (HostKernelKind::Pointers, [a, b, c]) => {
                let args = [ptr(a)?, ptr(b)?, ptr(c)?];
                let blocks = dims.grid[0].min(EMULATED_BLOCKS) as usize;
                let shape = (blocks, dims.threads as usize, dims.smem as usize);
                // SAFETY: the caller's contract (three pointers as the kernel's ABI
                // asks, live host memory).
                unsafe { self.kernels.launch_loop(kernel, shape, args) }.map_err(RunError::Device)
            }
            (HostKernelKind::Args { .. }, _) => {
                // A word an argument, in the kernel's parameters' order.
                let words: Vec<u64> = all.iter().map(KernelArg::word).collect();
                let grid = dims.grid.map(|g| g as usize);
                let block = (dims.threads as usize, dims.smem as usize);
                // SAFETY: the caller's contract (`gpu::kernel::ABI`, a folding
                // split-K kernel's `kper`, workspace and zeroed counters, a taps
                // kernel's descriptor, live host memory).
                unsafe { self.kernels.launch_args(kernel, (grid[0], grid[1], grid[2]), block, &words) }
                    .map_err(RunError::Device)
            }
            _ => Err(bad()),
        }
    }
}

impl Model {
    /// Compile for NVIDIA GPU `ordinal` (PTX the driver assembles for it;
    /// the plan is [`Model::lower_gpu`]'s; on a Hopper, sm_90, the weights'
    /// products may take wgmma kernels). No driver, no such device or one
    /// older than sm_80 is an error saying which.
    pub fn compile_gpu(&self, ordinal: usize) -> Result<GpuModel<CudaDevice>, Error> {
        let plan = self.lower_gpu()?;
        // A model the GPU cannot run says so before any driver is asked for.
        check_plan(&plan)?;
        let target = target_of(ordinal)?;
        let text = Text::Ptx(kernel_launch(target, false));
        let (code, kernels) = gpu_kernels(&plan, text, target, &HashMap::new())?;
        let code: Vec<KernelCode> = code.into_iter().map(|(c, _)| c).collect();
        let device = CudaDevice::open(ordinal, &code)?;
        self.gpu_model(plan, kernels, device)
    }

    /// The plan the GPU runs: loop programs, contraction steps that the
    /// GEMM family runs, and fused attention where the attention kernel
    /// takes it ([`gpu_attention_unsupported`]; the others unfused), each
    /// writing its heads merged where a copy merged them
    /// ([`lower::fold_head_merges`]); the products whose output only other
    /// products read storing it in bf16 ([`lower::bf16_products`]), and the
    /// loop programs whose output a product reads as its A storing it in
    /// bf16 too ([`lower::bf16_operands`]); the row norms whose output one
    /// product alone reads named in it ([`lower::normalized_operands`]), so
    /// that its normalizing GEMVs read the norm's input.
    pub fn lower_gpu(&self) -> Result<plan::ModelPlan, Error> {
        let mut plan = lower::lower_with(&self.graph, &self.fusion_plan(), &lower::LowerOptions::gpu())?;
        lower::unfuse_attention(&mut plan, |p, a| gpu_attention_unsupported(p, a).is_none());
        lower::fold_head_merges(&mut plan);
        lower::bf16_products(&mut plan);
        lower::bf16_operands(&mut plan);
        lower::normalized_operands(&mut plan);
        Ok(plan)
    }

    fn gpu_model<D: Device>(
        &self,
        plan: plan::ModelPlan,
        kernels: GpuKernels,
        device: D,
    ) -> Result<GpuModel<D>, Error> {
        let io = |v: Vec<crate::IoInfo>| v.into_iter().map(|i| (i.name, i.ty)).collect();
        Ok(GpuModel::new(
            plan,
            self.graph.env.clone(),
            io(self.inputs()),
            io(self.outputs()),
            kernels,
            device,
        )?)
    }

    /// Compile for the GPU emulated on this machine: every kernel of
    /// [`Model::lower_gpu`]'s plan as the NVPTX kernel a GPU would run, here
    /// on the host emulator.
    pub fn compile_host_gpu(&self) -> Result<GpuModel<HostDevice>, Error> {
        self.compile_host_gpu_for(GpuTarget::Sm80)
    }

    /// As [`Model::compile_host_gpu`], with the kernels `target` is given
    /// (`Sm90a`: the wgmma kernels, which the emulator runs too).
    pub fn compile_host_gpu_for(&self, target: GpuTarget) -> Result<GpuModel<HostDevice>, Error> {
        let plan = self.lower_gpu()?;
        check_plan(&plan)?;
        let (code, kernels) = gpu_kernels(&plan, Text::LlvmIr, target, &HashMap::new())?;
        let code: Vec<_> = code.into_iter().map(|(c, role)| (c.name, c.text, host_kind(role))).collect();
        let host = HostKernels::new(&code).map_err(codegen::CodegenError::Llvm)?;
        self.gpu_model(plan, kernels, HostDevice::new(host))
    }

    /// The model compiled for NVIDIA GPUs as an artifact: for each of
    /// `opts`' targets its kernels' PTX (and cubins, where `opts` names
    /// ptxas) and steps, the plan, the weights as the GPU reads them (the
    /// GEMMs' in bf16): what `anyshape compile --device cuda` saves and
    /// `anyshape-rt` runs where there is only the NVIDIA driver.
    pub fn gpu_artifact(&self, opts: &GpuArtifactOptions) -> Result<GpuArtifact, Error> {
        let plan = self.lower_gpu()?;
        check_plan(&plan)?;
        let weights = runtime::gpu::pack_weights(&plan)?;
        let mut code = Vec::with_capacity(opts.targets.len());
        // All but the GEMMs are the same PTX for every target launching its
        // kernels alike: made once.
        let mut known: HashMap<KernelLaunch, HashMap<String, String>> = HashMap::new();
        for &target in &opts.targets {
            let launch = kernel_launch(target, opts.ordered);
            let known = known.entry(launch).or_default();
            let (kernels, steps) = gpu_kernels(&plan, Text::Ptx(launch), target, known)?;
            for (k, role) in &kernels {
                if !matches!(role, KernelRole::Gemm(_)) {
                    known.entry(k.name.clone()).or_insert_with(|| k.text.clone());
                }
            }
            let arch = arch_name(target);
            let (mut texts, roles): (Vec<KernelCode>, Vec<KernelRole>) = kernels.into_iter().unzip();
            if let Some(ptxas) = &opts.ptxas {
                crate::ptxas::assemble_all(ptxas, arch, &mut texts)?;
            }
            let kernels = texts.into_iter().zip(roles).collect();
            code.push(GpuCode { arch: arch.into(), kernels, steps });
        }
        let io = |v: Vec<crate::IoInfo>| v.into_iter().map(|i| (i.name, i.ty)).collect();
        Ok(GpuArtifact {
            plan,
            env: self.graph.env.clone(),
            inputs: io(self.inputs()),
            outputs: io(self.outputs()),
            weights,
            code,
        })
    }
}

/// What a GPU artifact holds code for, and what assembles its cubins.
/// By default: Hopper's kernels (sm_90a) and every supported GPU's (sm_80),
/// PTX only.
#[derive(Clone, Debug)]
pub struct GpuArtifactOptions {
    targets: Vec<GpuTarget>,
    ptxas: Option<PathBuf>,
    ordered: bool,
}

impl Default for GpuArtifactOptions {
    fn default() -> Self {
        GpuArtifactOptions { targets: vec![GpuTarget::Sm90a, GpuTarget::Sm80], ptxas: None, ordered: false }
    }
}

impl GpuArtifactOptions {
    pub fn new() -> Self {
        Self::default()
    }

    /// The GPUs to hold code for (kept most specific first: a Hopper takes
    /// sm_90a's code where there is some). An empty list keeps the default.
    pub fn targets(mut self, targets: &[GpuTarget]) -> Self {
        if !targets.is_empty() {
            self.targets =
                [GpuTarget::Sm90a, GpuTarget::Sm80].into_iter().filter(|t| targets.contains(t)).collect();
        }
        self
    }

    /// Launch Hopper's kernels each after the one before (`true`) instead of
    /// as programmatic dependents (the default; [`kernel_launch`]): to
    /// measure what dependent launches save.
    pub fn ordered_launches(mut self, ordered: bool) -> Self {
        self.ordered = ordered;
        self
    }

    /// Assemble each kernel with this ptxas into cubins for its target
    /// ([`crate::ptxas::find_ptxas`] finds the user's).
    pub fn ptxas(mut self, path: impl Into<PathBuf>) -> Self {
        self.ptxas = Some(path.into());
        self
    }
}

/// The name ptxas and the artifact give `target`'s code.
pub fn arch_name(target: GpuTarget) -> &'static str {
    match target {
        GpuTarget::Sm80 => Arch::Sm80.sm(),
        GpuTarget::Sm90a => Arch::Sm90a.sm(),
    }
}

/// Why the GPU's attention kernel does not take fused attention `a` of
/// `plan`, if it does not: no online softmax, a product of convolution taps,
/// a head dimension that is no constant multiple of 16 up to 128, or logits
/// it cannot compute per element.
pub fn gpu_attention_unsupported(plan: &plan::ModelPlan, a: &plan::AttentionStep) -> Option<String> {
    let Some(online) = &a.online else { return Some("no online softmax".into()) };
    if a.scores.taps.is_some() || a.output.taps.is_some() {
        return Some("a product of convolution taps".into());
    }
    if !a.head(&plan.dims).is_some_and(codegen::nvptx::attention_head_ok) {
        return Some("a head dimension that is no constant multiple of 16 up to 128".into());
    }
    codegen::nvptx::logits_unsupported(
        &plan.programs[online.program],
        a.scores_param as u32,
        online.logits_param as u32,
    )
}

/// How `target`'s attention kernel of head dimension `head` multiplies:
/// Hopper's `wgmma` where its tiles take the head, else `mma.sync`.
pub fn attention_mma(target: GpuTarget, head: usize) -> plan::gpu::AttentionMma {
    match target {
        GpuTarget::Sm90a if plan::gpu::attention_wgmma_ok(head) => plan::gpu::AttentionMma::Wgmma,
        _ => plan::gpu::AttentionMma::Sync,
    }
}

/// What a kernel is given to a device as.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Text {
    /// PTX (the driver assembles it), for kernels launched so.
    Ptx(KernelLaunch),
    /// The NVPTX module's LLVM IR (the emulator runs it).
    LlvmIr,
}

impl Text {
    /// How the device launches the kernels given so.
    fn launch(self) -> KernelLaunch {
        match self {
            Text::Ptx(l) => l,
            Text::LlvmIr => KernelLaunch::Ordered,
        }
    }

    /// Kernel `name`'s text: its IR (`ir`), its PTX for an ordered launch
    /// (`ptx`), or its IR compiled for a dependent one.
    fn of(
        self,
        name: &str,
        ir: impl FnOnce() -> Result<String, codegen::CodegenError>,
        ptx: impl FnOnce() -> Result<String, codegen::CodegenError>,
    ) -> Result<String, Error> {
        Ok(match self {
            Text::LlvmIr => ir()?,
            Text::Ptx(KernelLaunch::Ordered) => ptx()?,
            Text::Ptx(KernelLaunch::Dependent) => codegen::nvptx::dependent_ptx(&ir()?, name)?,
        })
    }
}

/// How `target`'s kernels are launched: dependent launches on a Hopper
/// (unless `ordered`), else each after the one before.
pub fn kernel_launch(target: GpuTarget, ordered: bool) -> KernelLaunch {
    match target {
        GpuTarget::Sm90a if !ordered => KernelLaunch::Dependent,
        _ => KernelLaunch::Ordered,
    }
}

/// The kernels NVIDIA GPU `ordinal` takes: a Hopper's (sm_90: wgmma too), or
/// every supported GPU's. No driver or no such device is an error saying so.
pub fn target_of(ordinal: usize) -> Result<GpuTarget, Error> {
    Ok(match CudaDevice::compute_capability(ordinal)? {
        (9, 0) => GpuTarget::Sm90a,
        _ => GpuTarget::Sm80,
    })
}

/// How the emulator calls a kernel of `role`.
fn host_kind(role: KernelRole) -> HostKernelKind {
    match role {
        KernelRole::Loop(_) | KernelRole::OperandCopy | KernelRole::Attention { .. } => {
            HostKernelKind::Pointers
        }
        KernelRole::Gemm(k) => HostKernelKind::Args { threads_apart: k.arch == Arch::Simt },
    }
}

/// A GPU artifact's model on the host emulator: the code for `arch` (the
/// first, most specific, where `None`), each kernel rebuilt from what the
/// artifact says it is (the emulator runs LLVM IR, not PTX), run with the
/// artifact's plan, weights and steps.
pub fn host_model_of(mut a: GpuArtifact, arch: Option<&str>) -> Result<GpuModel<HostDevice>, Error> {
    let at = match arch {
        None => 0,
        Some(arch) => a.code.iter().position(|c| c.arch == arch).ok_or_else(|| {
            RunError::Device(format!("the artifact has no code for {arch}: it has {}", a.archs().join(", ")))
        })?,
    };
    let c = a.code.swap_remove(at);
    let mut code = Vec::with_capacity(c.kernels.len());
    for (k, role) in &c.kernels {
        let ir = match role {
            KernelRole::Loop(i) => codegen::nvptx::program_ir(&a.plan.programs[*i], &k.name)?,
            KernelRole::OperandCopy => codegen::nvptx::operand_copy_ir(),
            KernelRole::Gemm(g) => codegen::nvptx::llvm_ir(g)?,
            KernelRole::Attention { program, scores, logits, head, mma, out_bf16 } => {
                codegen::nvptx::attention_ir(
                    &a.plan.programs[*program],
                    (*scores, *logits),
                    (*head, *mma, *out_bf16),
                    &k.name,
                )?
            }
        };
        code.push((k.name.clone(), ir, host_kind(*role)));
    }
    let host = HostKernels::new(&code).map_err(codegen::CodegenError::Llvm)?;
    Ok(GpuModel::with_weights(a.plan, a.env, a.inputs, a.outputs, c.steps, a.weights, HostDevice::new(host))?)
}

/// Every kernel of `plan` for the GPU, in the device's index order (the loop
/// programs, the operand copy, each distinct GEMM), with what it is, and
/// which runs each step. `known`: texts, by kernel name, of kernels that
/// are the same for every target (all but the GEMMs), made for another.
fn gpu_kernels(
    plan: &plan::ModelPlan,
    text: Text,
    target: GpuTarget,
    known: &HashMap<String, String>,
) -> Result<(Vec<(KernelCode, KernelRole)>, GpuKernels), Error> {
    let mut code = Vec::new();
    let mut kernels = GpuKernels::default();
    let launch = text.launch();
    let kernel =
        |name: String, text: String, smem: usize| KernelCode { name, text, smem, cubin: None, launch };
    for (i, p) in plan.programs.iter().enumerate() {
        let name = format!("{}_gpu{i}", p.name);
        let t = match known.get(&name) {
            Some(t) => t.clone(),
            None => text.of(
                &name,
                || codegen::nvptx::program_ir(p, &name),
                || codegen::nvptx::program_ptx(p, &name),
            )?,
        };
        kernels.loops.push(code.len());
        code.push((kernel(name, t, 0), KernelRole::Loop(i)));
    }
    let name = plan::gpu::OPERAND_COPY_KERNEL.to_string();
    let copy = match known.get(&name) {
        Some(t) => t.clone(),
        None => text.of(&name, || Ok(codegen::nvptx::operand_copy_ir()), codegen::nvptx::operand_copy_ptx)?,
    };
    kernels.operand_copy = code.len();
    code.push((kernel(name, copy, 0), KernelRole::OperandCopy));
    let mut index: HashMap<GemmKernel, usize> = HashMap::new();
    for list in step_lists(plan, target)? {
        let mut choices = Vec::new();
        for e in list {
            let k = e.kernel;
            let at = match index.get(&k) {
                Some(&i) => i,
                None => {
                    let t = text.of(&k.name(), || codegen::nvptx::llvm_ir(&k), || codegen::nvptx::ptx(&k))?;
                    code.push((kernel(k.name(), t, k.smem_bytes()), KernelRole::Gemm(k)));
                    index.insert(k, code.len() - 1);
                    code.len() - 1
                }
            };
            choices.push(GemmChoice { kernel: k, index: at, max_m: e.most, splits: e.splits });
        }
        kernels.matmuls.push(choices);
    }
    // Each fused attention's kernel (one per online program and head dimension).
    let mut attention: HashMap<(usize, usize, bool), usize> = HashMap::new();
    for st in &plan.steps {
        let plan::StepKind::Attention(a) = &st.kind else {
            kernels.attentions.push(None);
            continue;
        };
        let (Some(online), Some(head)) = (&a.online, a.head(&plan.dims)) else {
            return Err(RunError::Internal("a fused attention the GPU does not take".into()).into());
        };
        // Stored in bf16 where only products read it (`lower::bf16_products`).
        let out_bf16 = plan.buffers[a.output.c.buf].dtype == ir::DType::BF16;
        let at = match attention.get(&(online.program, head, out_bf16)) {
            Some(&i) => i,
            None => {
                let mma = attention_mma(target, head);
                let name = plan::gpu::attention_kernel_name(online.program, head, mma, out_bf16);
                let p = &plan.programs[online.program];
                let (s, l) = (a.scores_param as u32, online.logits_param as u32);
                let t = match known.get(&name) {
                    Some(t) => t.clone(),
                    None => text.of(
                        &name,
                        || codegen::nvptx::attention_ir(p, (s, l), (head, mma, out_bf16), &name),
                        || codegen::nvptx::attention_ptx(p, (s, l), (head, mma, out_bf16), &name),
                    )?,
                };
                let role = KernelRole::Attention {
                    program: online.program,
                    scores: s,
                    logits: l,
                    head,
                    mma,
                    out_bf16,
                };
                code.push((kernel(name, t, plan::gpu::attention_smem(head)), role));
                attention.insert((online.program, head, out_bf16), code.len() - 1);
                code.len() - 1
            }
        };
        kernels.attentions.push(Some(runtime::gpu::AttentionChoice { index: at, head }));
    }
    Ok((code, kernels))
}

/// Each step's GEMM kernels, in the order they are tried, each with the
/// most rows it takes (empty for a step that is no contraction): a weight
/// with fixed N and K gets the wave model's pick per M (from the H200
/// profile), a product of activations fixed bounds.
fn step_lists(
    plan: &plan::ModelPlan,
    target: GpuTarget,
) -> Result<Vec<Vec<gpu_family::steps::StepKernel>>, Error> {
    use gpu_family::steps;
    let bad = |e: gpu_family::replay::ReplayError| RunError::Internal(format!("the GPU profile: {e}"));
    let profile = steps::profile(steps::H200_PROFILE).map_err(bad)?;
    let model = steps::step_model(&profile, target).map_err(bad)?;
    let konst = |slot: u32| plan.dims.exprs().get(slot as usize).and_then(|e| e.as_const());
    let mut memo = HashMap::new();
    let mut out = Vec::with_capacity(plan.steps.len());
    for (i, st) in plan.steps.iter().enumerate() {
        let plan::StepKind::MatMul(mm) = &st.kind else {
            out.push(Vec::new());
            continue;
        };
        let e = mm.epilogue.function();
        if e.column_scale {
            return Err(Error::from(RunError::Device(format!(
                "step {i}: a contraction whose epilogue scales each column (a quantized \
                 product's dequantization) is not built for the GPU"
            ))));
        }
        if e.residual_in_program() || e.residual_codes {
            return Err(Error::from(RunError::Device(format!(
                "step {i}: a contraction whose epilogue program reads its residual (a quantized \
                 residual block's sum) is not built for the GPU"
            ))));
        }
        if !mm.epilogue.params.values().is_empty() {
            return Err(Error::from(RunError::Device(format!(
                "step {i}: a contraction whose epilogue takes parameters is not built for the GPU"
            ))));
        }
        let fixed = match (konst(mm.n), konst(mm.k)) {
            (Some(n), Some(k)) if mm.weight && mm.batch.is_empty() => Some((n as usize, k as usize)),
            _ => None,
        };
        let list = match fixed {
            Some((n, k)) => memo
                .entry((e, n, k))
                .or_insert_with(|| steps::weight_step_kernels(&model, e, (1, n, k)))
                .clone(),
            None => steps::fixed_step_kernels(e),
        };
        // An f32 view whose columns are adjacent is read in place by every
        // kernel of the list (its rows at any stride): no copy launch.
        let f32_view =
            mm.taps.is_none() && konst(mm.a.cs) == Some(1) && plan.buffers[mm.a.buf].dtype == ir::DType::F32;
        let list = if f32_view { steps::reading_f32_a(list) } else { list };
        // A convolution over a bf16 image (`lower::bf16_products`, or the copy
        // its producer writes beside it: `lower::bf16_operands`): its tiles'
        // taps twins read the taps in place (implicit GEMM).
        let bf16_image = plan.buffers[mm.a.buf].dtype == ir::DType::BF16 || mm.a_bf16.is_some();
        let list = if mm.taps.is_some() && bf16_image { steps::reading_taps(list) } else { list };
        // A bf16 C (`lower::bf16_products`: only products read it, as their
        // A) is stored as such, its f32 accumulators rounded in the epilogue.
        let list =
            if plan.buffers[mm.c.buf].dtype == ir::DType::BF16 { steps::storing_bf16_c(list) } else { list };
        // A bf16 copy of an f32 C beside it, which its reading products take
        // as their A (`lower::bf16_operands`).
        let list = if mm.c_bf16.is_some() { steps::storing_c16_copy(list) } else { list };
        // A row norm's product (`lower::normalized_operands`): its GEMVs of
        // few rows normalize the norm's input themselves.
        let list = match &mm.a_norm {
            Some(n) if f32_view => steps::normalizing(list, n.norm),
            _ => list,
        };
        // An activation B with its K adjacent: read in place at few rows.
        let f32_b = !mm.weight && konst(mm.b.rs) == Some(1) && plan.buffers[mm.b.buf].dtype == ir::DType::F32;
        out.push(if f32_b { steps::reading_f32_b(list) } else { list });
    }
    Ok(out)
}

/// The GEMM kernels each contraction step of `plan` is given, a line a step:
/// the kernels in the order they are tried, each with the rows it takes
/// (`M <= r`); the first that accepts the product at a shape runs it.
pub fn gemm_choices_text(plan: &plan::ModelPlan, target: GpuTarget) -> Result<String, Error> {
    let mut s = String::new();
    for (i, (st, list)) in plan.steps.iter().zip(step_lists(plan, target)?).enumerate() {
        if list.is_empty() {
            continue;
        }
        let choices: Vec<String> = list
            .into_iter()
            .map(|e| {
                let name = e.kernel.name_split(e.splits);
                if e.most == usize::MAX {
                    name
                } else {
                    format!("{name} (M <= {})", e.most)
                }
            })
            .collect();
        s.push_str(&format!("step {i} (group {}): {}\n", st.group, choices.join(", ")));
    }
    Ok(s)
}

/// The attention kernel each fused attention step of `plan` runs on
/// `target`, a line a step: its kernel, head dimension and logits program,
/// its geometry, how it multiplies.
pub fn attention_text(plan: &plan::ModelPlan, target: GpuTarget) -> String {
    use plan::gpu::{AttentionMma, ATTENTION_KEYS, ATTENTION_ROWS, ATTENTION_THREADS};
    let mut s = String::new();
    for (i, st) in plan.steps.iter().enumerate() {
        let plan::StepKind::Attention(a) = &st.kind else { continue };
        let (Some(online), Some(head)) = (&a.online, a.head(&plan.dims)) else { continue };
        let mma = attention_mma(target, head);
        let out_bf16 = plan.buffers[a.output.c.buf].dtype == ir::DType::BF16;
        s.push_str(&format!(
            "step {i} (group {}): {}: {ATTENTION_ROWS} query rows a block of {ATTENTION_THREADS} threads, \
             keys {ATTENTION_KEYS} at a time, logits of p{} per score, {} in bf16, output {}\n",
            st.group,
            plan::gpu::attention_kernel_name(online.program, head, mma, out_bf16),
            online.program,
            match mma {
                AttentionMma::Sync => "mma.sync",
                AttentionMma::Wgmma => "wgmma (S = Q·Kᵀ from shared memory, O += P·V with P in registers)",
            },
            if out_bf16 { "bf16" } else { "f32" }
        ));
    }
    s
}

/// The distinct GEMM kernels `plan`'s contraction steps are given for
/// `target`, in the order the device gets them.
pub fn gemm_kernels(plan: &plan::ModelPlan, target: GpuTarget) -> Result<Vec<GemmKernel>, Error> {
    let mut out: Vec<GemmKernel> = Vec::new();
    for e in step_lists(plan, target)?.into_iter().flatten() {
        if !out.contains(&e.kernel) {
            out.push(e.kernel);
        }
    }
    Ok(out)
}

/// Every kernel of `plan` for a GPU as PTX, `(name, PTX)`, in the device's
/// order: the loop programs, the operand copy, each distinct GEMM.
pub fn plan_ptx(plan: &plan::ModelPlan, target: GpuTarget) -> Result<Vec<(String, String)>, Error> {
    let (code, _) = gpu_kernels(plan, Text::Ptx(kernel_launch(target, false)), target, &HashMap::new())?;
    Ok(code.into_iter().map(|(c, _)| (c.name, c.text)).collect())
}
