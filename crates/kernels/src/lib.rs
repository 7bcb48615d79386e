//! Kernels: the hardware `Target`, the contraction schedule (register tile,
//! cache blocks) and the driver that runs generated micro-kernels over any
//! shape (Vortex §4-5, DietCode §4, FTuner §III). No LLVM here: `codegen`
//! produces the micro-kernels for the ABI defined in [`gemm`], so a compiled
//! model can run where LLVM is absent.

mod activation;
pub mod gemm;
mod pool;
mod target;

pub use activation::{Activation, ERF_A, ERF_P, GELU_C};
pub use gemm::{
    gemm, gemm_batched, gemm_packed, gemm_parallel, Blocking, Epilogue, EpilogueArgs, MatMut, MatRef,
    MicroKernel, MicroKernelFn, PackedB, ACCUMULATE, APPLY_EPILOGUE,
};
pub use pool::ThreadPool;
pub use target::{Isa, Target};

/// Errors from kernels: shapes that do not fit, and so on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    #[error("{0}")]
    Shape(String),
}
