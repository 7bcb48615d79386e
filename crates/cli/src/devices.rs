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
}

/// `model` compiled for GPU `device` (not the CPU).
pub fn compile_gpu(model: &anyshape::Model, device: DeviceArg) -> Result<Box<dyn GpuRun>> {
    Ok(match device {
        DeviceArg::Cuda => Box::new(model.compile_gpu(0)?),
        DeviceArg::GpuEmulator => Box::new(model.compile_host_gpu()?),
        DeviceArg::Cpu => bail!("the CPU is not a GPU device"),
    })
}
