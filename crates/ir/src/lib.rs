//! The graph IR: an SSA graph of primitive ops over values typed by dtype and
//! symbolic shape, with a verifier and a readable text form (printer + parser that
//! round-trip exactly), which is how passes are tested and what `inspect` shows.

mod bind;
mod graph;
mod infer;
mod op;
mod tensor;
mod text;
mod verify;

pub use bind::{bind_inputs, InputError};
pub use graph::{Graph, Node, Value, ValueId};
pub use infer::infer;
pub use op::{BinaryOp, ConvAttrs, Op, PadMode, PoolAttrs, PoolKind, ReduceOp, SliceAxis, UnaryOp};
pub use tensor::{
    bf16_to_f32, checked_numel, f16_to_f32, f32_to_bf16, f64_to_f16, ConstData, DType, Elems, MappedFile,
    Tensor, TensorData, TensorType, TensorView, ViewElement, WeightCodes,
};
pub use text::{parse_graph, print_graph, weight_table, INLINE_MAX};
pub use verify::verify;

/// Errors about IR structure, types and data.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IrError {
    #[error("{op}: {msg}")]
    Type { op: String, msg: String },
    #[error("invalid graph: {0}")]
    Invalid(String),
    #[error("bad tensor data: {0}")]
    Data(String),
    #[error("text form, line {line}: {msg}")]
    Parse { line: usize, msg: String },
    #[error(transparent)]
    Sym(#[from] sym::SymError),
}
