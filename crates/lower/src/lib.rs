//! Tensor programs (DESIGN.md §4, §7): every fusion group becomes code-generator
//! input, and the model an execution plan and a buffer plan, all symbolic.
//!
//! - [`LoopProgram`]: a loop nest over a symbolic space storing one or more
//!   tensors, each an expression DAG ([`Exprs`]) over loop variables, run-time
//!   dims, loads from buffers (with the index maps of broadcasts, reshapes,
//!   transposes, slices, concats, pads and gathers), the element-wise ops, and
//!   reductions as nodes. A reduction that does not depend on the innermost
//!   loop variable is computed once per row by the code generator: that is the
//!   stitch schedule (BladeDISC §4.2), a row staying in cache across passes.
//! - [`MatMulStep`]: an f32 matmul on the contraction engine, its operands read
//!   as strided views where the group's layout prologue is a view.
//! - [`ModelPlan`]: buffers with symbolic sizes and lifetimes, the steps of
//!   every group in order, the distinct programs (groups of one signature share
//!   one), and the table of symbolic dims the runtime evaluates once per shape.
//!
//! No LLVM here: `codegen` turns programs into machine code, `runtime` runs plans.

pub mod attention;
mod build;
pub mod expr;
mod group;
pub mod plan;
pub mod program;
mod text;
pub mod versions;

pub use attention::fuse_attention;
pub use expr::{Combine, Exprs, Node, E};
pub use plan::{
    Activation, AttentionStep, BufId, Buffer, BufferKind, DimTable, GroupSteps, MatEpilogue, MatMulStep,
    ModelPlan, OnlineSoftmax, PointwiseOp, Step, StepKind, View, MAX_EPILOGUE_OPS,
};
pub use program::{LoopProgram, Param, Schedules, SplitReduction, Store};
pub use text::{print_plan, print_program};

/// The calling convention of a generated loop program: `bufs[i]` is parameter
/// `i`'s data, `dims` the model's dim table evaluated for the call, and the
/// program runs rows `begin..end` of its nest (a row: one value of all loop
/// variables but the innermost). Buffers are addressed with wrapping
/// arithmetic from their pointers (no in-bounds assumption), so a caller that
/// runs a few rows may pass a tile holding only those rows, its pointer shifted
/// back by the rows before them (fused attention does). Returns 0, or the first error code a `Check`
/// recorded (its message is the program's `checks[code - 1]`).
pub type LoopFn = unsafe extern "C" fn(bufs: *const *mut u8, dims: *const i64, begin: i64, end: i64) -> i64;

/// The partial entry of a program with a [`SplitReduction`]: for point `point`
/// of its nest, its reduction over `lo..hi` of the split variable only, stored
/// at `out` (its dtype, in an 8-byte slot). Returns 0 or an error code.
pub type PartFn = unsafe extern "C" fn(
    bufs: *const *mut u8,
    dims: *const i64,
    point: i64,
    lo: i64,
    hi: i64,
    out: *mut u64,
) -> i64;

/// The finishing entry of a program with a [`SplitReduction`]: the stores of
/// point `point`, the reduction being the combination of the `n` partials at
/// `parts` ([`PartFn`]'s slots). Returns 0 or an error code.
pub type FinishFn = unsafe extern "C" fn(
    bufs: *const *mut u8,
    dims: *const i64,
    point: i64,
    parts: *const u64,
    n: i64,
) -> i64;

/// Why a model cannot be lowered.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LowerError {
    #[error("no lowering for {op} computing '{node}': {why}")]
    Unsupported { op: String, node: String, why: String },
    #[error("internal error in lowering: {0}")]
    Internal(String),
}

/// How to lower a model.
#[derive(Clone, Copy, Debug)]
pub struct LowerOptions {
    /// Fuse attention's `matmul, softmax, matmul` into one step ([`fuse_attention`]).
    pub fuse_attention: bool,
}

impl Default for LowerOptions {
    fn default() -> Self {
        LowerOptions { fuse_attention: true }
    }
}

/// Lower a rewritten graph cut into fusion groups.
pub fn lower(g: &ir::Graph, fusion: &passes::FusionPlan) -> Result<ModelPlan, LowerError> {
    lower_with(g, fusion, &LowerOptions::default())
}

/// [`lower`] with options.
pub fn lower_with(
    g: &ir::Graph,
    fusion: &passes::FusionPlan,
    opts: &LowerOptions,
) -> Result<ModelPlan, LowerError> {
    let mut plan = group::Lowering::new(g).run(fusion)?;
    if opts.fuse_attention {
        fuse_attention(&mut plan);
    }
    Ok(plan)
}
