//! The primitive op set (DESIGN.md §2).
//!
//! Every op has exactly one output. Element-wise ops take operands of the output's
//! shape: broadcasting is always an explicit [`Op::Broadcast`], so that broadcast
//! elimination can remove it when the `ShapeEnv` proves it a no-op. Compound ONNX
//! ops (Softmax, LayerNormalization, Gelu, Gemm, …) are split into these on import.

use std::sync::Arc;

use sym::SymExpr;

use crate::{ConstData, DType};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum UnaryOp {
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Reciprocal,
    Erf,
    Tanh,
    Sigmoid,
    Relu,
    Floor,
    Ceil,
    /// Round half to even (ONNX `Round`).
    Round,
    Sin,
    Cos,
    Sign,
    /// Logical not (bool).
    Not,
    /// Float → bool.
    IsNaN,
    /// Float → bool, either infinity.
    IsInf,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    /// Float division; integer division truncates toward zero (ONNX `Div`).
    Div,
    Pow,
    Max,
    Min,
    /// Integer remainder with the sign of the divisor (ONNX `Mod`, fmod = 0);
    /// floats use `fmod` semantics (sign of the dividend).
    Mod,
    /// Comparisons produce bool.
    Equal,
    Less,
    Greater,
    LessEq,
    GreaterEq,
    /// Logical ops on bool.
    And,
    Or,
    Xor,
}

impl BinaryOp {
    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            BinaryOp::Equal | BinaryOp::Less | BinaryOp::Greater | BinaryOp::LessEq | BinaryOp::GreaterEq
        )
    }
    pub fn is_logical(self) -> bool {
        matches!(self, BinaryOp::And | BinaryOp::Or | BinaryOp::Xor)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
}

/// One sliced axis: output index `i` reads input index `start + i*step`; the
/// output extent is the output type's dim (computed on import).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SliceAxis {
    pub axis: usize,
    pub start: SymExpr,
    pub step: i64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PadMode {
    /// Fill with this value.
    Constant(f64),
    Reflect,
    Edge,
    /// Periodic: the padding repeats the tensor (ONNX `wrap`, opset 19).
    Wrap,
}

/// Convolution geometry over the spatial dims (N-D; 2-D in practice).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConvAttrs {
    pub strides: Vec<i64>,
    pub dilations: Vec<i64>,
    /// Padding before each spatial dim.
    pub pads_begin: Vec<i64>,
    /// Padding after each spatial dim.
    pub pads_end: Vec<i64>,
    pub group: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolKind {
    Max,
    /// Average; `count_include_pad` counts padded positions inside the explicit pads.
    Avg {
        count_include_pad: bool,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PoolAttrs {
    pub kind: PoolKind,
    pub kernel: Vec<i64>,
    pub strides: Vec<i64>,
    pub dilations: Vec<i64>,
    pub pads_begin: Vec<i64>,
    pub pads_end: Vec<i64>,
    /// The channels are the last dim (`[n, spatial…, c]`), not the second
    /// (ONNX's `[n, c, spatial…]`): a pool between channels-last convolutions
    /// then reads and writes their layout (`SinkTransposes`).
    pub channels_last: bool,
}

impl PoolAttrs {
    /// The axis of the channels and the first spatial axis in a tensor of `rank`.
    pub fn axes(&self, rank: usize) -> (usize, usize) {
        if self.channels_last {
            (rank - 1, 1)
        } else {
            (1, 2)
        }
    }
}

/// A primitive operation. Inputs are listed per variant.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// No inputs. Constant data (weights, folded values).
    Constant(Arc<ConstData>),
    /// No inputs. A 1-D i64 tensor (or a scalar when the output type has rank 0)
    /// whose elements are symbolic dims, evaluated once the symbols are bound:
    /// what is left of a `Shape` sub-graph whose values feed real computation.
    SymConst(Vec<SymExpr>),
    /// No inputs. `out[idx] = idx[axis]`, in the output dtype.
    Iota { axis: usize },
    /// `(x)`.
    Unary(UnaryOp),
    /// `(a, b)`, both of the output shape.
    Binary(BinaryOp),
    /// `(cond, a, b)`, all of the output shape; `cond ? a : b`.
    Select,
    /// `(x)` converted to the output dtype (float → int truncates toward zero).
    Cast,
    /// `(x)` of the output's rank; each dim equals the output's or is 1.
    Broadcast,
    /// `(x)` with the same element count as the output, row-major order kept.
    Reshape,
    /// `(x)`; output dim `i` is input dim `perm[i]`.
    Transpose { perm: Vec<usize> },
    /// `(x)`; see [`SliceAxis`]; axes not listed are taken whole.
    Slice { axes: Vec<SliceAxis> },
    /// `(x0, x1, …)` joined along `axis`.
    Concat { axis: usize },
    /// `(data, indices)`: ONNX `Gather` (negative indices count from the end).
    Gather { axis: usize },
    /// `(x)`; `pads[i] = (before, after)` per dim; negative pads crop.
    Pad { pads: Vec<(SymExpr, SymExpr)>, mode: PadMode },
    /// `(x)` reduced over `axes`.
    Reduce { op: ReduceOp, axes: Vec<usize>, keep_dims: bool },
    /// `(a[..., m, k], b[..., k, n])` → `[..., m, n]`; equal ranks ≥ 2, equal batch
    /// dims. `transpose_a`/`transpose_b`: the operand is stored with its last two
    /// axes swapped (`a[..., k, m]`), a layout the contraction reads directly.
    MatMul { transpose_a: bool, transpose_b: bool },
    /// `(x[n, c, *s], w[m, c/group, *k])` → `[n, m, *o]`; no bias (added after).
    Conv(ConvAttrs),
    /// `(x[n, c, *s], w[c, m/group, *k])` → `[n, m, *o]`; `output_padding` is
    /// implied by the output type.
    ConvTranspose(ConvAttrs),
    /// `(x[n, c, *s])` → `[n, c, *o]`; output extents from the output type (ceil
    /// mode is resolved on import).
    Pool(PoolAttrs),
    /// `(x)` cumulative sum along `axis`.
    CumSum { axis: usize, exclusive: bool, reverse: bool },
}

impl Op {
    /// A matmul of operands in their plain layout.
    pub const MATMUL: Op = Op::MatMul { transpose_a: false, transpose_b: false };

    /// The op's name in the text form.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Constant(_) => "constant",
            Op::SymConst(_) => "sym_const",
            Op::Iota { .. } => "iota",
            Op::Unary(u) => match u {
                UnaryOp::Neg => "neg",
                UnaryOp::Abs => "abs",
                UnaryOp::Exp => "exp",
                UnaryOp::Log => "log",
                UnaryOp::Sqrt => "sqrt",
                UnaryOp::Reciprocal => "reciprocal",
                UnaryOp::Erf => "erf",
                UnaryOp::Tanh => "tanh",
                UnaryOp::Sigmoid => "sigmoid",
                UnaryOp::Relu => "relu",
                UnaryOp::Floor => "floor",
                UnaryOp::Ceil => "ceil",
                UnaryOp::Round => "round",
                UnaryOp::Sin => "sin",
                UnaryOp::Cos => "cos",
                UnaryOp::Sign => "sign",
                UnaryOp::Not => "not",
                UnaryOp::IsNaN => "is_nan",
                UnaryOp::IsInf => "is_inf",
            },
            Op::Binary(b) => match b {
                BinaryOp::Add => "add",
                BinaryOp::Sub => "sub",
                BinaryOp::Mul => "mul",
                BinaryOp::Div => "div",
                BinaryOp::Pow => "pow",
                BinaryOp::Max => "max",
                BinaryOp::Min => "min",
                BinaryOp::Mod => "mod",
                BinaryOp::Equal => "equal",
                BinaryOp::Less => "less",
                BinaryOp::Greater => "greater",
                BinaryOp::LessEq => "less_eq",
                BinaryOp::GreaterEq => "greater_eq",
                BinaryOp::And => "and",
                BinaryOp::Or => "or",
                BinaryOp::Xor => "xor",
            },
            Op::Select => "select",
            Op::Cast => "cast",
            Op::Broadcast => "broadcast",
            Op::Reshape => "reshape",
            Op::Transpose { .. } => "transpose",
            Op::Slice { .. } => "slice",
            Op::Concat { .. } => "concat",
            Op::Gather { .. } => "gather",
            Op::Pad { .. } => "pad",
            Op::Reduce { op, .. } => match op {
                ReduceOp::Sum => "reduce_sum",
                ReduceOp::Mean => "reduce_mean",
                ReduceOp::Max => "reduce_max",
                ReduceOp::Min => "reduce_min",
                ReduceOp::Prod => "reduce_prod",
            },
            Op::MatMul { .. } => "matmul",
            Op::Conv(_) => "conv",
            Op::ConvTranspose(_) => "conv_transpose",
            Op::Pool(p) => match p.kind {
                PoolKind::Max => "max_pool",
                PoolKind::Avg { .. } => "avg_pool",
            },
            Op::CumSum { .. } => "cumsum",
        }
    }

    /// Every unary op, for the parser and tests.
    pub const UNARY: [UnaryOp; 19] = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Reciprocal,
        UnaryOp::Erf,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Relu,
        UnaryOp::Floor,
        UnaryOp::Ceil,
        UnaryOp::Round,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Sign,
        UnaryOp::Not,
        UnaryOp::IsNaN,
        UnaryOp::IsInf,
    ];

    /// Every binary op, for the parser and tests.
    pub const BINARY: [BinaryOp; 16] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::Mod,
        BinaryOp::Equal,
        BinaryOp::Less,
        BinaryOp::Greater,
        BinaryOp::LessEq,
        BinaryOp::GreaterEq,
        BinaryOp::And,
        BinaryOp::Or,
        BinaryOp::Xor,
    ];

    /// How many inputs the op takes (`None`: variadic).
    pub fn arity(&self) -> Option<usize> {
        Some(match self {
            Op::Constant(_) | Op::SymConst(_) | Op::Iota { .. } => 0,
            Op::Binary(_) | Op::Gather { .. } | Op::MatMul { .. } | Op::Conv(_) | Op::ConvTranspose(_) => 2,
            Op::Select => 3,
            Op::Concat { .. } => return None,
            _ => 1,
        })
    }

    /// Whether the output dtype is fixed by the op regardless of inputs.
    pub fn fixed_dtype(&self) -> Option<DType> {
        match self {
            Op::SymConst(_) => Some(DType::I64),
            Op::Binary(b) if b.is_comparison() => Some(DType::Bool),
            Op::Unary(UnaryOp::IsNaN | UnaryOp::IsInf) => Some(DType::Bool),
            _ => None,
        }
    }
}
