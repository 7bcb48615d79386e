//! The contract between the compiler and the runtime (DESIGN.md §7): what
//! `lower` writes and every backend reads, and nothing that computes it.
//!
//! - [`ModelPlan`]: buffers with symbolic sizes and lifetimes, the steps of
//!   every fusion group in order, the distinct loop programs, and the table of
//!   symbolic dims the runtime evaluates once per shape.
//! - [`LoopProgram`]: one generated function, a loop nest over a symbolic space
//!   storing tensors, each an expression DAG ([`Exprs`]) over loop variables,
//!   run-time dims and loads; its [`Schedules`] say what its code depends on.
//! - [`MatMulStep`] and [`AttentionStep`]: contractions, and attention fused
//!   into one launch, on strided views of buffers, with their epilogues.
//! - One vocabulary of epilogues for every backend: [`Epilogue`] (what a
//!   kernel is built for), its [`Activation`] and [`Pointwise`] programs.
//! - One vocabulary of contractions for every backend: the [`Problem`], its
//!   operands' [`ALayout`] and [`BLayout`], the [`ElemType`] of its products.
//! - [`gemm`]: the GPU GEMM family's kernel descriptions (tile, pipeline,
//!   epilogue; launch geometry and shape rules).
//! - [`abi`]: the C signatures of the generated functions; [`gpu`]: how a
//!   loop program's kernel runs on a GPU (its schedules, its launch per shape).
//! - The readable text form of all of it ([`print_plan`], [`print_program`]).
//!
//! A leaf of the pipeline: it depends only on the data crates (`sym` for
//! symbolic dims, `ir` for element types, constants and the element-wise op
//! set), so the runtime depends on no compiler crate.

pub mod abi;
mod contraction;
mod epilogue;
pub mod expr;
pub mod gemm;
pub mod gpu;
mod group;
pub mod model;
mod pointwise;
pub mod program;
mod text;

pub use abi::{DirectKernelFn, EntryFn, FinishFn, LoopFn, MicroKernelFn, PackFn, PartFn, RowsPackFn};
pub use contraction::{bf16_bits, ALayout, BLayout, ElemType, Problem};
pub use epilogue::{
    erf, tanh, Activation, Epilogue, EpilogueParams, MatEpilogue, ERF_A, ERF_P, ERF_SERIES, GELU_C,
    TANH_SERIES,
};
pub use expr::{Combine, Exprs, Node, E};
pub use group::GroupKind;
pub use model::{
    AttentionStep, BufId, Buffer, BufferKind, DimTable, GroupSteps, MatMulStep, ModelPlan, NormalizedA,
    OnlineSoftmax, Step, StepKind, Taps, View, MAX_SOFTMAX_ARGS,
};
pub use pointwise::{
    integer, Pointwise, PwBinary, PwCmp, PwOp, PwUnary, MAX_POINTWISE_OPS, MAX_POINTWISE_PARAMS,
};
pub use program::{
    BorderGuard, Interleave, LoopProgram, OnePointWhy, Param, RowScratch, Scatter, Schedules, SplitReduction,
    Store, INTERLEAVE_MAX, UNSWITCH_DEPTH,
};
pub use text::{print_plan, print_program};
