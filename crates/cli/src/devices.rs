//! `--device`: running a model on a GPU (the driver, or the host emulator)
//! from `run` and `bench`. Only the `anyshape` binary has it: `anyshape-rt`
//! runs CPU artifacts and links no compiler.

use anyhow::{bail, Result};
use ir::{Tensor, TensorType};

/// `--device`: where a model runs.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DeviceArg {
    /// This machine's CPU (compiled code, every core by default).
    #[default]
    Cpu,
    /// NVIDIA GPU 0, through the driver (loop programs as NVPTX kernels,
    /// contractions on the tensor-core GEMM family in bf16 with f32 results).
    Cuda,
    /// The same GPU kernels on the host emulator (what CI checks them on; slow).
    GpuEmulator,
}

/// A model compiled for a GPU device: its outputs for named inputs.
pub trait GpuRun {
    fn inputs(&self) -> &[(String, TensorType)];
    fn run(&self, inputs: &[(&str, Tensor)])
        -> std::result::Result<Vec<(String, Tensor)>, runtime::RunError>;
    fn device_name(&self) -> String;
    fn plan_shape(&self, inputs: &[(&str, Tensor)]) -> std::result::Result<(), runtime::RunError>;
    fn device_memory(&self) -> runtime::gpu::DeviceMemory;
    #[allow(clippy::type_complexity)]
    fn run_profiled(
        &self,
        inputs: &[(&str, Tensor)],
    ) -> std::result::Result<(Vec<(String, Tensor)>, runtime::gpu::GpuProfile), runtime::RunError>;
    fn plan(&self) -> &plan::ModelPlan;
    fn time_on_device(
        &self,
        inputs: &[(&str, Tensor)],
        runs: usize,
    ) -> Result<(crate::common::Timing, Option<f64>)>;
}

impl<D: anyshape::gpu::Device> GpuRun for anyshape::gpu::GpuModel<D> {
    fn inputs(&self) -> &[(String, TensorType)] {
        anyshape::gpu::GpuModel::inputs(self)
    }
    fn run(
        &self,
        inputs: &[(&str, Tensor)],
    ) -> std::result::Result<Vec<(String, Tensor)>, runtime::RunError> {
        anyshape::gpu::GpuModel::run(self, inputs)
    }
    fn device_name(&self) -> String {
        self.device().name()
    }
    fn plan_shape(&self, inputs: &[(&str, Tensor)]) -> std::result::Result<(), runtime::RunError> {
        anyshape::gpu::GpuModel::plan_shape(self, inputs)
    }
    fn device_memory(&self) -> runtime::gpu::DeviceMemory {
        anyshape::gpu::GpuModel::device_memory(self)
    }
    fn run_profiled(
        &self,
        inputs: &[(&str, Tensor)],
    ) -> std::result::Result<(Vec<(String, Tensor)>, runtime::gpu::GpuProfile), runtime::RunError> {
        anyshape::gpu::GpuModel::run_profiled(self, inputs)
    }
    fn plan(&self) -> &plan::ModelPlan {
        anyshape::gpu::GpuModel::plan(self)
    }
    fn time_on_device(
        &self,
        inputs: &[(&str, Tensor)],
        runs: usize,
    ) -> Result<(crate::common::Timing, Option<f64>)> {
        crate::common::time_on_device(self, inputs, runs)
    }
}

/// A GPU artifact (`compile --device cuda`) opened on `device`: GPU 0
/// through the driver (`cuda`, or `cpu`: the artifact holds GPU code), or the
/// emulator with its kernels rebuilt from what the artifact says each is
/// (its first architecture's).
pub fn open_gpu_artifact(path: &std::path::Path, device: DeviceArg) -> Result<Box<dyn GpuRun>> {
    let a = anyshape::gpu::GpuArtifact::load(path).map_err(runtime::RunError::from)?;
    Ok(match device {
        DeviceArg::Cuda | DeviceArg::Cpu => Box::new(a.open(0)?),
        DeviceArg::GpuEmulator => Box::new(anyshape::gpu::host_model_of(a, None)?),
    })
}

/// `--gpu-arch`: the GPUs a GPU artifact's kernels are for.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum GpuArchArg {
    /// Every supported NVIDIA GPU (sm_80 and later): mma.sync and GEMV kernels.
    #[default]
    #[value(name = "sm_80", alias = "sm80")]
    Sm80,
    /// Hopper only (H100, H200): the weights' products may take wgmma kernels.
    #[value(name = "sm_90a", alias = "sm90a")]
    Sm90a,
}

impl GpuArchArg {
    pub fn target(self) -> anyshape::gpu::GpuTarget {
        match self {
            GpuArchArg::Sm80 => anyshape::gpu::GpuTarget::Sm80,
            GpuArchArg::Sm90a => anyshape::gpu::GpuTarget::Sm90a,
        }
    }
}

/// `model` compiled for GPU `device` (not the CPU).
pub fn compile_gpu(model: &anyshape::Model, device: DeviceArg) -> Result<Box<dyn GpuRun>> {
    Ok(match device {
        DeviceArg::Cuda => Box::new(model.compile_gpu(0)?),
        DeviceArg::GpuEmulator => Box::new(model.compile_host_gpu()?),
        DeviceArg::Cpu => bail!("the CPU is not a GPU device"),
    })
}
