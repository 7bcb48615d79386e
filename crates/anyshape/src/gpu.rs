//! The GPU backend from the public API. A model's loop programs compile to
//! NVPTX kernels (`codegen::nvptx`) and run through the runtime's
//! [`GpuModel`] on a [`CudaDevice`] (the driver) or a [`HostDevice`] (the
//! GPU emulated on this machine: what CI runs every GPU kernel on).

use std::alloc::Layout;
use std::collections::HashMap;
use std::sync::Mutex;

use codegen::emulator::HostKernels;
pub use runtime::gpu::cuda::CudaDevice;
use runtime::gpu::DEVICE_ALIGN;
pub use runtime::gpu::{check_plan, Device, DevicePtr, GpuModel};
use runtime::RunError;

use crate::{Error, Model};

/// Blocks the emulator runs of a launch: the loop kernels take their units
/// grid-stride, so a few blocks compute everything (and the stride loop is
/// exercised); each block's threads are host threads.
pub const EMULATED_BLOCKS: u32 = 4;

/// A GPU emulated on the host: device memory is host memory, a launch runs
/// at most [`EMULATED_BLOCKS`] of the kernel's blocks with the emulator's
/// threads.
pub struct HostDevice {
    kernels: HostKernels,
    /// Live allocations: address → layout.
    allocs: Mutex<HashMap<DevicePtr, Layout>>,
}

impl HostDevice {
    pub fn new(kernels: HostKernels) -> HostDevice {
        HostDevice { kernels, allocs: Mutex::new(HashMap::new()) }
    }

    /// Bytes allocated and not freed.
    pub fn bytes_live(&self) -> usize {
        self.allocs.lock().unwrap_or_else(|e| e.into_inner()).values().map(|l| l.size()).sum()
    }
}

impl Device for HostDevice {
    fn name(&self) -> String {
        "host emulator".into()
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr, RunError> {
        let layout = Layout::from_size_align(bytes.max(1), DEVICE_ALIGN)
            .map_err(|_| RunError::Device(format!("out of device memory: {bytes} bytes asked for")))?;
        // SAFETY: the layout's size is at least 1.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(RunError::Device(format!("out of device memory: {bytes} bytes asked for")));
        }
        self.allocs.lock().unwrap_or_else(|e| e.into_inner()).insert(p as DevicePtr, layout);
        Ok(p as DevicePtr)
    }

    unsafe fn free(&self, p: DevicePtr) {
        if let Some(layout) = self.allocs.lock().unwrap_or_else(|e| e.into_inner()).remove(&p) {
            // SAFETY: `p` was allocated with this layout and is freed once (it is
            // removed from the live set here).
            unsafe { std::alloc::dealloc(p as *mut u8, layout) };
        }
    }

    unsafe fn upload(&self, dst: DevicePtr, src: &[u8]) -> Result<(), RunError> {
        // SAFETY: the caller's contract: `dst` has `src.len()` bytes of one allocation.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }

    unsafe fn download(&self, src: DevicePtr, dst: &mut [u8]) -> Result<(), RunError> {
        // SAFETY: the caller's contract: `src` has `dst.len()` bytes of one allocation.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    unsafe fn launch(
        &self,
        kernel: usize,
        blocks: u32,
        threads: u32,
        args: &[DevicePtr],
    ) -> Result<(), RunError> {
        let args: [u64; 3] = args.try_into().map_err(|_| {
            RunError::Internal(format!("a loop kernel takes 3 arguments, not {}", args.len()))
        })?;
        // SAFETY: the caller's contract (the loop kernel ABI, live host memory).
        let blocks = blocks.min(EMULATED_BLOCKS) as usize;
        unsafe { self.kernels.launch_loop(kernel, blocks, threads as usize, args) }.map_err(RunError::Device)
    }
}

impl Model {
    /// Compile for NVIDIA GPU `ordinal` (PTX the driver assembles for it;
    /// the plan is [`Model::lower_gpu`]'s). No driver, no such device or one
    /// older than sm_80 is an error saying which.
    pub fn compile_gpu(&self, ordinal: usize) -> Result<GpuModel<CudaDevice>, Error> {
        let plan = self.lower_gpu()?;
        // A model the GPU cannot run says so before any driver is asked for.
        check_plan(&plan)?;
        let kernels = kernel_texts(&plan, codegen::nvptx::program_ptx)?;
        let device = CudaDevice::open(ordinal, &kernels)?;
        self.gpu_model(plan, kernels.len(), device)
    }

    /// The plan the GPU runs: every step a loop program. Matmuls are sums of
    /// products in their groups' programs (a thread, or a warp, per output
    /// element: correct at any shape, far from the tensor cores) until the
    /// GEMM family runs a plan's contraction steps (issue 37, item 3).
    pub fn lower_gpu(&self) -> Result<plan::ModelPlan, Error> {
        let lo = lower::LowerOptions { fuse_attention: false, matmul_steps: false };
        Ok(lower::lower_with(&self.graph, &self.fusion_plan(), &lo)?)
    }

    fn gpu_model<D: Device>(&self, plan: plan::ModelPlan, n: usize, device: D) -> Result<GpuModel<D>, Error> {
        let io = |v: Vec<crate::IoInfo>| v.into_iter().map(|i| (i.name, i.ty)).collect();
        Ok(GpuModel::new(
            plan,
            self.graph.env.clone(),
            io(self.inputs()),
            io(self.outputs()),
            (0..n).collect(),
            device,
        )?)
    }

    /// Compile for the GPU emulated on this machine: every loop program of
    /// [`Model::lower_gpu`]'s plan as the NVPTX kernel a GPU would run, here
    /// on the host emulator.
    pub fn compile_host_gpu(&self) -> Result<GpuModel<HostDevice>, Error> {
        let plan = self.lower_gpu()?;
        check_plan(&plan)?;
        let kernels = kernel_texts(&plan, codegen::nvptx::program_ir)?;
        let host = HostKernels::loops(&kernels).map_err(codegen::CodegenError::Llvm)?;
        self.gpu_model(plan, kernels.len(), HostDevice::new(host))
    }
}

/// Each loop program's kernel, `(name, text)`: the text `make` writes (PTX,
/// or the LLVM IR the emulator runs) under the name the device looks up.
fn kernel_texts(
    plan: &plan::ModelPlan,
    make: fn(&plan::LoopProgram, &str) -> Result<String, codegen::CodegenError>,
) -> Result<Vec<(String, String)>, Error> {
    let mut kernels = Vec::with_capacity(plan.programs.len());
    for (i, p) in plan.programs.iter().enumerate() {
        let name = format!("{}_gpu{i}", p.name);
        let text = make(p, &name)?;
        kernels.push((name, text));
    }
    Ok(kernels)
}
