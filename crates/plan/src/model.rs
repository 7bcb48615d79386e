//! The model's execution plan and buffer plan: launches whose arguments are slots
//! of a table of symbolic dims, and buffers with symbolic sizes and lifetimes.
//! The runtime evaluates the dim table once per input-shape signature and
//! builds everything else (arena offsets, thread splits) from it.

use std::collections::HashMap;
use std::sync::Arc;

use crate::group::GroupKind;
use ir::{ConstData, DType};
use sym::SymExpr;

use crate::epilogue::MatEpilogue;
use crate::program::LoopProgram;

/// Index of a buffer in [`ModelPlan::buffers`].
pub type BufId = usize;

/// Every symbolic dim the plan needs, each once; kernels read them by slot.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(from = "Vec<SymExpr>", into = "Vec<SymExpr>")]
pub struct DimTable {
    exprs: Vec<SymExpr>,
    index: HashMap<SymExpr, u32>,
}

impl DimTable {
    /// The slot of `e` (added when new).
    pub fn slot(&mut self, e: &SymExpr) -> u32 {
        if let Some(s) = self.index.get(e) {
            return *s;
        }
        self.exprs.push(e.clone());
        self.index.insert(e.clone(), self.exprs.len() as u32 - 1);
        self.exprs.len() as u32 - 1
    }
    /// A slot no expression owns (its value per shape is 0): a kernel argument
    /// the runtime sets while it runs, such as a fused attention's key chunk.
    /// The slot is never handed out by [`DimTable::slot`].
    pub fn scratch(&mut self) -> u32 {
        self.exprs.push(SymExpr::constant(0));
        self.exprs.len() as u32 - 1
    }
    pub fn exprs(&self) -> &[SymExpr] {
        &self.exprs
    }
    pub fn len(&self) -> usize {
        self.exprs.len()
    }
    pub fn is_empty(&self) -> bool {
        self.exprs.is_empty()
    }
}

impl From<Vec<SymExpr>> for DimTable {
    fn from(exprs: Vec<SymExpr>) -> DimTable {
        let mut t = DimTable::default();
        for e in &exprs {
            t.slot(e);
        }
        // Repeated expressions keep their slots (the table read is the table written).
        t.exprs = exprs;
        t
    }
}

impl From<DimTable> for Vec<SymExpr> {
    fn from(t: DimTable) -> Vec<SymExpr> {
        t.exprs
    }
}

/// Where a buffer's memory comes from.
#[derive(Clone, Debug)]
pub enum BufferKind {
    /// The user's input tensor `i`, read in place.
    Input(usize),
    /// Model output `i`, allocated per call and handed to the caller.
    Output(usize),
    /// Constant data (weights), kept by the compiled model.
    Constant(Arc<ConstData>),
    /// A constant read only as a matmul's pre-packed weight, whose bytes are
    /// not kept: what a loaded artifact has of such a weight (its packed form).
    Packed,
    /// An intermediate in the call's arena, live from step `first` to `last`.
    Temp,
}

/// A dense row-major tensor the plan reads or writes.
#[derive(Clone, Debug)]
pub struct Buffer {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<SymExpr>,
    /// Slot of the element count.
    pub numel: u32,
    pub kind: BufferKind,
    /// The first step that writes it and the last that reads it (temps).
    pub first: usize,
    pub last: usize,
}

/// A strided view of a buffer as a batch of matrices: element `(b…, i, j)` is at
/// `offset + Σ b_d·batch_d + i·rs + j·cs` (every term a dim-table slot).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct View {
    pub buf: BufId,
    pub offset: u32,
    pub batch: Vec<u32>,
    pub rs: u32,
    pub cs: u32,
}

/// A convolution's taps over a channels-last image, read as a matmul's A
/// (implicit GEMM, `kernels::ConvTaps`): row `(b, y, x)` of A is an output
/// pixel, depth `(i, j, c)` channel `c` of tap `(i, j)`, read from the image at
/// `(b, y·sh + i·dh − ph, x·sw + j·dw − pw, c)`, zero outside it. The column
/// matrix the graph describes is never written: packing reads the image.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Taps {
    /// Slots: the image's batch, height, width and channels.
    pub image: [u32; 4],
    /// Slots: elements between images, image rows and pixels (channels contiguous).
    pub strides: [u32; 3],
    /// Slots: the output's height and width.
    pub out: [u32; 2],
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub dilation: [usize; 2],
    /// Zeros before the image's first row and column.
    pub pad: [usize; 2],
}

impl Taps {
    /// The depth of one kernel row (`kw · C` of the `k` = `kh · kw · C`) when the
    /// taps overlap (`kh · kw > sh · sw`: each image value is read by several taps)
    /// and a kernel row's taps are adjacent pixels (no dilation across the width):
    /// the convolutions whose tiles direct kernels read in place, a kernel row a run.
    pub fn overlapping_row(&self, k: usize) -> Option<usize> {
        let taps = self.kernel[0] * self.kernel[1];
        (taps > self.stride[0] * self.stride[1] && self.dilation[1] == 1).then(|| k / self.kernel[0])
    }
}

/// A batch of f32 contractions `C[b] = A[b] · B[b]` for the contraction engine.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct MatMulStep {
    /// Batch extents (slots); empty for one product.
    pub batch: Vec<u32>,
    pub m: u32,
    pub n: u32,
    pub k: u32,
    /// With `taps`, A is those taps over the image starting at `a`'s buffer and
    /// offset (its strides unused).
    pub a: View,
    pub taps: Option<Taps>,
    pub b: View,
    /// Row-major output (column stride 1).
    pub c: View,
    /// `B` is a constant read the same by every batch entry: packed once at compile time.
    pub weight: bool,
    /// A holds integers in 0..=255 and B in -128..=127 (a quantized model's
    /// operands, bounded by the graph): the u8s8 family multiplies them exactly.
    #[serde(default)]
    pub u8s8: bool,
    /// A and B hold integers of at most 16 bits whose products' sums over all
    /// of K stay within i32 (a statically quantized model's signed activations
    /// by its weights; implied by `u8s8`): the i16 family multiplies them.
    #[serde(default)]
    pub i16: bool,
    /// `i16`, and B holds integers in -128..=127 (an int8 weight; implied by
    /// `u8s8`): the i16s8 family multiplies them from B's bytes.
    #[serde(default)]
    pub i16s8: bool,
    /// The group's epilogue, when the engine's tile epilogue computes it.
    pub epilogue: MatEpilogue,
    /// A bf16 buffer that A's producer writes beside A, value for value
    /// (`lower::bf16_operands`, GPU plans only): kernels reading bf16 A read
    /// A's view there (two bytes an element) instead of a copy of it made
    /// before the product.
    #[serde(default)]
    pub a_bf16: Option<BufId>,
    /// A bf16 buffer laid out as C's that the product also stores, value for
    /// value (`lower::bf16_operands`, GPU plans only): the `a_bf16` of the
    /// products reading C as their A, while the rest of the model reads C.
    #[serde(default)]
    pub c_bf16: Option<BufId>,
    /// A is a row norm of another buffer (`lower::normalized_operands`, GPU
    /// plans only): see [`NormalizedA`].
    #[serde(default)]
    pub a_norm: Option<NormalizedA>,
}

/// A product's A as the rows of buffer `x` normalized over K by loop step
/// `step`, whose outputs (A, and its bf16 copy) only this product reads. A
/// normalizing GEMV (`GemmKernel::norm`) reads `x` at A's view instead, and
/// the step is skipped at the shapes where one runs the product: a decode
/// step's norm costs no launch.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NormalizedA {
    /// The norm's input, laid out as A's buffer.
    pub x: BufId,
    pub norm: crate::gemm::RowNorm,
    /// The loop step that writes A.
    pub step: usize,
}

impl MatMulStep {
    /// The integer types that multiply this product, best first (none: floats
    /// only). The compile builds the first its options allow; the runtime takes
    /// the first the model has.
    pub fn integer_types(&self) -> &'static [crate::ElemType] {
        use crate::ElemType::{I16, I16S8, U8S8};
        match (self.u8s8, self.i16s8, self.i16) {
            (true, _, _) => &[U8S8, I16S8, I16],
            (false, true, _) => &[I16S8, I16],
            (false, false, true) => &[I16],
            (false, false, false) => &[],
        }
    }
}

/// The most buffers a fused attention's softmax program may take (the runtime
/// gives each task a table of them on its stack).
pub const MAX_SOFTMAX_ARGS: usize = 16;

/// Attention as one fused launch (RUNTIME.md §2): for every batch entry and
/// block of query rows, `scores` (`S = Q·Kᵀ`) into a tile, the `softmax`
/// program over the tile's rows (its scale and mask included), and `output`
/// (`O = P·V`) from the probability tile. The scores and probabilities buffers
/// of the unfused steps are never allocated: the program's parameters
/// `scores_param` and `probs_param` are the tiles, passed shifted back by the
/// block's first row (the program addresses its buffers with wrapping
/// arithmetic, so only the block's rows are touched).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct AttentionStep {
    pub scores: MatMulStep,
    pub softmax: usize,
    pub args: Vec<BufId>,
    pub scores_param: usize,
    pub probs_param: usize,
    pub output: MatMulStep,
    /// The softmax over chunks of keys, when the model's softmax has the form
    /// online softmax needs (`exp(x - max x) / sum`).
    pub online: Option<OnlineSoftmax>,
}

/// Online softmax (RUNTIME.md §2, the flash-attention recurrence): the keys are
/// taken a chunk at a time, so that a block's tiles stay in cache at any key
/// length. `program` has the softmax program's parameters (its scores and
/// probabilities now a chunk wide) and two more: the rows' running maxima
/// (`max_param`, read) and the chunk's logits (`logits_param`, written: the
/// model's scale and mask applied to the scores). Per chunk it stores the
/// logits and `probs = exp(logits - max(running max, the chunk's max))`; the
/// driver keeps the running maxima and sums and rescales the output.
/// `offset_slot` and `len_slot` are scratch slots of the dim table for the
/// chunk's first key and its length, set per chunk in a copy of the table.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct OnlineSoftmax {
    pub program: usize,
    pub max_param: usize,
    pub logits_param: usize,
    pub offset_slot: u32,
    pub len_slot: u32,
    /// The model makes the softmax's NaN probabilities 0
    /// (`select(is_nan(p), 0, p)`, PyTorch's scaled-dot-product attention
    /// exported): a row whose every logit is -inf (fully masked) is 0
    /// where a plain softmax gives NaN.
    #[serde(default)]
    pub nan_to_zero: bool,
}

impl AttentionStep {
    /// The head dimension (the scores' depth, the output's width), when the
    /// plan makes it one constant.
    pub fn head(&self, dims: &DimTable) -> Option<usize> {
        let k = dims.exprs().get(self.scores.k as usize)?.as_const()?;
        let n = dims.exprs().get(self.output.n as usize)?.as_const()?;
        (k == n && k > 0).then_some(k as usize)
    }

    /// The buffers the fused step really reads and writes (not the tiles).
    pub fn touched(&self) -> Vec<BufId> {
        let (s, o) = (&self.scores, &self.output);
        let mut v = vec![s.a.buf, s.b.buf, o.b.buf, o.c.buf];
        for (i, b) in self.args.iter().enumerate() {
            if i != self.scores_param && i != self.probs_param {
                v.push(*b);
            }
        }
        v
    }
}

/// One launch.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub enum StepKind {
    /// A generated loop program over its arguments.
    Loop {
        program: usize,
        args: Vec<BufId>,
    },
    MatMul(Box<MatMulStep>),
    Attention(Box<AttentionStep>),
}

impl StepKind {
    /// The buffers the step reads or writes.
    pub fn touched(&self) -> Vec<BufId> {
        match self {
            StepKind::Loop { args, .. } => args.clone(),
            StepKind::MatMul(m) => {
                let mut v = vec![m.a.buf, m.b.buf, m.c.buf];
                v.extend(m.a_bf16);
                v.extend(m.c_bf16);
                v.extend(m.a_norm.as_ref().map(|n| n.x));
                v.extend(m.epilogue.buffers());
                v
            }
            StepKind::Attention(a) => a.touched(),
        }
    }

    /// A short name of the kind (profiles group time by it).
    pub fn name(&self) -> &'static str {
        match self {
            StepKind::Loop { .. } => "loop",
            StepKind::MatMul(_) => "matmul",
            StepKind::Attention(_) => "attention",
        }
    }
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Step {
    /// The fusion group the step belongs to.
    pub group: usize,
    pub kind: StepKind,
}

/// A fusion group as the plan runs it: its kind and its steps.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct GroupSteps {
    pub kind: GroupKind,
    pub steps: std::ops::Range<usize>,
}

/// The lowered model.
#[derive(Clone, Debug, Default)]
pub struct ModelPlan {
    pub dims: DimTable,
    pub buffers: Vec<Buffer>,
    /// Distinct loop programs (groups of the same signature share one).
    pub programs: Vec<LoopProgram>,
    pub steps: Vec<Step>,
    pub groups: Vec<GroupSteps>,
    pub inputs: Vec<BufId>,
    pub outputs: Vec<BufId>,
}

impl ModelPlan {
    /// Buffers and the steps that touch them: set `first` and `last`.
    pub fn compute_lifetimes(&mut self) {
        let n = self.steps.len();
        for b in &mut self.buffers {
            b.first = n;
            b.last = 0;
        }
        for (i, s) in self.steps.iter().enumerate() {
            for b in s.kind.touched() {
                let buf = &mut self.buffers[b];
                buf.first = buf.first.min(i);
                buf.last = buf.last.max(i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Taps;

    fn taps(kernel: [usize; 2], stride: [usize; 2], dilation: [usize; 2]) -> Taps {
        Taps { image: [0; 4], strides: [0; 3], out: [0; 2], kernel, stride, dilation, pad: [0; 2] }
    }

    /// Only taps that read image values more than once, along adjacent pixels,
    /// have kernel rows worth keeping whole; a row is `kw · C` of `kh · kw · C`.
    #[test]
    fn overlapping_taps_have_kernel_rows() {
        assert_eq!(taps([3, 3], [1, 1], [1, 1]).overlapping_row(9 * 64), Some(3 * 64));
        assert_eq!(taps([3, 3], [2, 2], [1, 1]).overlapping_row(9 * 64), Some(3 * 64));
        assert_eq!(taps([7, 7], [2, 2], [1, 1]).overlapping_row(147), Some(21));
        assert_eq!(taps([1, 1], [1, 1], [1, 1]).overlapping_row(64), None);
        assert_eq!(taps([1, 1], [2, 2], [1, 1]).overlapping_row(64), None);
        // A patch embedding (kernel = stride) reads each pixel once.
        assert_eq!(taps([16, 16], [16, 16], [1, 1]).overlapping_row(768), None);
        assert_eq!(taps([3, 3], [1, 1], [1, 2]).overlapping_row(9 * 8), None);
    }
}
