//! anyshape's NVIDIA GPU contraction engine, the part that needs no LLVM: the GEMM
//! kernel family's descriptions ([`GemmKernel`]), the hardware-aligned candidate
//! space ([`candidates`]), TSCompiler's wave/occupancy model ([`wave`]) and the
//! decision tree distilled from it ([`tree`]), FTuner's two-size covers of M
//! ([`cover`]), the model replayed on a device run's record without the device
//! ([`replay`]), the family's manifest, the host oracle ([`reference`]), and behind
//! the feature `cuda` the runner that loads the cubins with cudarc (dynamic
//! loading: nothing from CUDA at build time). PTX comes from `codegen::nvptx`; the
//! runner never links LLVM.

pub mod candidates;
pub mod cover;
pub mod kernel;
pub mod manifest;
pub mod reference;
pub mod replay;
pub mod steps;
pub mod tree;
pub mod wave;

#[cfg(feature = "cuda")]
pub mod runner;

pub use cover::{Cover, Piece, Split};
pub use kernel::{
    epilogue_approximate, epilogue_suffix, ALayout, Activation, Arch, BLayout, ElemType, Epilogue,
    GemmKernel, KernelError, Problem, ReduceKernel, RowNorm, BK,
};
pub use manifest::{Manifest, ManifestEntry, ReducerEntry};
pub use tree::MTree;
pub use wave::{Choice, DeviceLimits, KernelRate, ReduceRate, WaveModel};
