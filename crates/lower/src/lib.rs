//! Tensor programs (DESIGN.md §4, §7): every fusion group becomes a
//! [`plan::LoopProgram`] (code-generator input) or a contraction step, and the
//! model a [`plan::ModelPlan`], all symbolic.
//!
//! - Loop programs: a loop nest over the group's symbolic space whose
//!   expressions hold the index maps of broadcasts, reshapes, transposes,
//!   slices, concats, pads and gathers, the element-wise ops, and reductions as
//!   nodes. A reduction that does not depend on the innermost loop variable is
//!   computed once per row by the code generator: that is the stitch schedule
//!   (BladeDISC §4.2), a row staying in cache across passes.
//! - [`schedules::analyze`] finds what a program's schedules depend on, and
//!   [`versions`] the guards it is compiled in versions for (BladeDISC §5.2.1).
//! - Contractions: f32 matmuls on the contraction engine, their operands read
//!   as strided views where the group's layout prologue is a view; attention
//!   groups fused into one step ([`fuse_attention`]).
//!
//! The plan's types are the `plan` crate's (the compile/run contract). No LLVM
//! here: `codegen` turns programs into machine code, `runtime` runs plans.

pub mod attention;
mod build;
mod group;
mod hoist;
mod norm;
mod operands;
mod requantize;
pub mod schedules;
pub mod versions;

pub use attention::{fold_head_merges, fuse_attention, unfuse_attention};
pub use norm::normalized_operands;
pub use operands::{bf16_operands, bf16_products};
pub use schedules::analyze;

use plan::ModelPlan;

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
    /// f32 matmuls as contraction steps ([`plan::MatMulStep`], the CPU's
    /// engine); else as sums of products inside loop programs, with their
    /// groups' element-wise operations (the GPU's until its GEMM family runs
    /// a model's contractions).
    pub matmul_steps: bool,
    /// A contraction's epilogue may scale its columns by values computed per
    /// call, and add a bias computed per call, by a program over the columns
    /// run first (a quantized product's dequantization); the CPU's
    /// kernels read column scales, the GPU family's do not.
    pub column_scales: bool,
    /// A contraction's epilogue program takes its constants as parameters
    /// (`plan::PwOp::Param`), so that layers that differ only in their
    /// constants (a quantized model's scales) share their kernels; the CPU's
    /// kernels read parameters, the GPU family's do not.
    pub epilogue_params: bool,
    /// A contraction's epilogue program may read a residual as an operand of
    /// its own (`plan::PwOp::Residual`; of u8 codes where so stored) instead of
    /// adding it to the sum: a quantized residual block's
    /// `q(dq(q(acc)) + dq(shortcut))` in the product's store. The CPU's kernels
    /// take it; the GPU's plans keep the sum in a loop program.
    pub residual_programs: bool,
    /// A quantized activation that a loop program or a weight's product
    /// writes (`cast<f32>` of a `u8` value, an epilogue ending in a
    /// quantization) is stored a byte a code, and read as such: widened by the
    /// loop programs that load it, read as it lies by the contractions whose A
    /// it is (the CPU's u8s8 kernels pack its 4-byte words). Only where every
    /// reader takes codes (see `group::narrowable`); the GPU's plans keep f32.
    pub u8_codes: bool,
    /// The deepest K a weight's product may have to store its C as codes
    /// (0: none does): such a product runs in one K block (a byte keeps no
    /// partial sum), so only where one block of the kernels' takes all of K.
    pub codes_depth: usize,
    /// Loop programs may take the CPU's [`plan::Interleave`] and
    /// [`plan::Scatter`] schedules (lanes along another variable than the
    /// last); the GPU's nests keep one point a lane.
    pub interleave: bool,
}

impl Default for LowerOptions {
    fn default() -> Self {
        LowerOptions {
            fuse_attention: true,
            matmul_steps: true,
            column_scales: true,
            epilogue_params: true,
            residual_programs: true,
            u8_codes: true,
            codes_depth: 0,
            interleave: true,
        }
    }
}

impl LowerOptions {
    /// What the GPU's plans take: fused attention and contraction steps, their
    /// epilogues' constants in the program, f32 activations (the GEMM family
    /// reads no column scales, parameters or codes).
    pub fn gpu() -> Self {
        LowerOptions {
            fuse_attention: true,
            matmul_steps: true,
            column_scales: false,
            epilogue_params: false,
            residual_programs: false,
            u8_codes: false,
            codes_depth: 0,
            interleave: false,
        }
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
    let mut plan = group::Lowering::new(g, opts).run(fusion)?;
    if opts.fuse_attention {
        fuse_attention(&mut plan);
    }
    if !opts.interleave {
        for p in &mut plan.programs {
            p.schedules.interleaved = None;
            p.schedules.scattered = None;
        }
    }
    Ok(plan)
}
