//! Kernels, the CPU backend's run-time pieces: the hardware `Target`, the
//! contraction's schedule space (register tile, operand access, cache blocks,
//! thread grid), its analytical cost models, run-time dispatch (by the model,
//! by a decision tree distilled from it, or by the table of a search's results,
//! [`tuned`]), and the drivers that run generated micro-kernels over any shape:
//! through packed panels ([`mod@gemm`], packing in [`pack`]) or on the operands
//! where they lie ([`direct`]) (Vortex §4-5, DietCode §4-5, FTuner §III-V,
//! TSCompiler §5.1, BladeDISC §5.2.2). No LLVM here: `codegen` produces the
//! micro-kernels and packing routines for the ABIs of `plan::abi`, so a
//! compiled model can run where LLVM is absent; no tuning either (measuring,
//! categorizing and searching are the `tune` crate's, at compile time).

pub mod attention;
pub mod codes;
pub mod cost;
pub mod direct;
pub mod dispatch;
mod elem;
pub mod gemm;
pub mod image;
pub mod lines;
pub mod pack;
mod pool;
mod prefetch;
pub mod schedule;
pub mod taps;
mod target;
pub mod testing;
pub mod tree;
pub mod tuned;

pub use attention::{
    attention, attention_block, online_blocks, online_pays, AttentionPlan, ChunkStep, Softmax, SoftmaxStep,
};
pub use codes::{CodeLayout, Codes, QuantizedWeight};
pub use cost::{CostModel, MachineModel};
pub use direct::{direct_rows, DirectKernel, DirectKernelFn, DirectPlan};
pub use dispatch::Dispatcher;
pub use elem::{bf16_bits, ElemType, CPU_ELEM_TYPES};
pub use gemm::{
    execute, gemm, gemm_batched, gemm_packed, gemm_parallel, BOperand, Blocking, EpilogueArgs, LoopOrder,
    MatMut, MatRef, MicroKernel, MicroKernelFn, PackedB, PackedPlan, Plan, SharedBytes, ThreadGrid,
    ACCUMULATE, APPLY_EPILOGUE,
};
pub use image::{CodeImage, ImageError};
pub use lines::Lines;
pub use pack::{CodeDot, CodeDotFn, DequantFn, Dequantizer, PackFn, Packer, Packers};
pub use pool::{Parts, ThreadPool};
pub use schedule::{
    ALayout, BLayout, DirectVariant, KernelFamily, KernelVariant, Operands, Problem, Schedule, DIRECT_TIE,
    PACKED_TIE,
};
pub use taps::{ConvTaps, RowsPackFn, RowsPacker};
pub use target::{amx_usable, Isa, Target, AMX_ROWS, AMX_TILES, AMX_TILE_REGISTERS};
pub use tree::{DecisionTree, RegretStats, TreeOptions};
pub use tuned::{MacroKernel, TunedClass, TunedRow, TunedSchedules};

/// Errors from kernels: shapes that do not fit, and so on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    #[error("{0}")]
    Shape(String),
    /// A step the caller supplied (fused attention's softmax) found bad data.
    #[error("{0}")]
    Step(String),
}
