//! How a loop program runs on a GPU: the schedules of its kernel, and the
//! launch geometry the runtime picks per shape. A loop kernel takes its units
//! (points or rows) grid-stride, so every grid is correct and the geometry
//! decides only the speed: the runtime sizes it from the shape, never by a
//! recompile (BladeDISC §5: one kernel, launch dimensions per call).

use crate::expr::{Node, E};
use crate::program::LoopProgram;
use serde::{Deserialize, Serialize};

/// Threads of a loop kernel's block.
pub const LOOP_THREADS: u32 = 256;

/// Lanes of a warp.
pub const WARP: u32 = 32;

/// The shortest row reduction whose row a warp shares; shorter ones are
/// computed by each point's thread.
pub const WARP_ROW_MIN: i64 = WARP as i64;

/// Adjacent points of a row that a loop kernel's thread (a warp's lane, in a
/// warp's schedules) takes at once where the row's length is a multiple of
/// it: 16-byte loads and stores of f32.
pub const QUAD: u32 = 4;

/// The most blocks a loop kernel is launched with (each then takes several
/// units in turn).
pub const LOOP_MAX_BLOCKS: usize = 1 << 16;

/// A loop kernel's schedule, picked per call by the row reduction's length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuLoopSchedule {
    /// A thread per point of the nest, adjacent threads at adjacent points (the
    /// innermost variable), so a warp's loads and stores are contiguous; a
    /// point's reductions run in its thread.
    Points,
    /// A warp per row (every variable but the innermost): its lanes share the
    /// row's reductions, each taking every 32nd term (contiguous across the
    /// warp), combined by butterfly shuffles so that every lane holds the
    /// whole; then the lanes take the row's points (BladeDISC's stitch: the
    /// row's passes meet in registers and L1).
    WarpRows,
    /// A warp per point, whose reductions depend on the innermost variable (a
    /// sum along the last axis that removes it): the lanes share each
    /// reduction as in [`GpuLoopSchedule::WarpRows`], lane 0 stores.
    WarpPoints,
}

impl GpuLoopSchedule {
    pub fn name(self) -> &'static str {
        match self {
            GpuLoopSchedule::Points => "a thread per point",
            GpuLoopSchedule::WarpRows => "a warp per row",
            GpuLoopSchedule::WarpPoints => "a warp per point",
        }
    }
}

impl LoopProgram {
    /// The warp schedule of this program and the length that picks it per
    /// call (taken where at least [`WARP_ROW_MIN`]): a program whose
    /// reductions are the same for a whole row (Softmax's, LayerNorm's: the
    /// CPU hoists them) shares each row's among a warp's lanes, the length
    /// the first one's last variable's extent; one with a row reduction per
    /// point ([`crate::Schedules::row_reduction`]) shares each point's.
    /// `None`: every shape runs [`GpuLoopSchedule::Points`] (no reductions,
    /// or reductions along an outer axis, which a thread per point reads
    /// contiguously across the warp).
    pub fn gpu_warp_schedule(&self) -> Option<(GpuLoopSchedule, E)> {
        let tops = self.top_reductions();
        let inner = self.inner_var().map_or(0, |v| 1u64 << v);
        let per_row = !tops.is_empty() && tops.iter().all(|r| self.exprs.free(*r) & inner == 0);
        if let Some(len) = self.schedules.row_reduction {
            if per_row {
                return Some((GpuLoopSchedule::WarpRows, len));
            }
            // Adjacent points reading adjacent elements in their reductions (a
            // matmul's B along its columns) are read together by a warp of
            // threads, a point each: no warp per point then.
            if tops.iter().any(|r| self.reads_along_inner(*r)) {
                return None;
            }
            return Some((GpuLoopSchedule::WarpPoints, len));
        }
        if !per_row {
            return None;
        }
        match self.exprs.node(tops[0]) {
            Node::Reduce { vars, .. } => {
                let last = *vars.last()?;
                Some((GpuLoopSchedule::WarpRows, *self.exprs.extents.get(last as usize)?))
            }
            _ => None,
        }
    }

    /// The schedule at a shape where the length [`LoopProgram::gpu_warp_schedule`]
    /// names is `row_len`.
    pub fn gpu_schedule(&self, row_len: i64) -> GpuLoopSchedule {
        schedule_at(self.gpu_warp_schedule(), row_len)
    }

    /// The row length (the innermost variable's extent) whose multiples of
    /// [`QUAD`] let schedule `s` take [`QUAD`] adjacent points at once (vector
    /// loads where a load's address is aligned to the vector, aligned vector
    /// stores, a point's values that do not depend on the innermost variable
    /// once for all four); at other lengths each thread (or lane) takes one.
    /// `None`: never (a warp per point, a reduction whose extent varies
    /// along the row or is nested in another's body, a constant length that
    /// is no multiple of [`QUAD`]). The kernel picks per call; the runtime
    /// sizes the grid by the same rule ([`loop_blocks`]).
    pub fn gpu_quads(&self, s: GpuLoopSchedule) -> Option<E> {
        self.inner_var()?;
        let ext = self.space[self.inner()?];
        if s == GpuLoopSchedule::WarpPoints
            || self.schedules.points_one_at_a_time.is_some()
            || self.exprs.as_int(ext).is_some_and(|c| c % QUAD as i64 != 0)
        {
            return None;
        }
        Some(ext)
    }

    /// Whether a load inside `e` reads consecutive elements at consecutive
    /// values of the innermost variable (its last index is that variable,
    /// plus terms that do not depend on it).
    fn reads_along_inner(&self, e: E) -> bool {
        let Some(v) = self.inner_var() else { return false };
        let x = &self.exprs;
        let unit = |i: E| match x.node(i) {
            Node::Var(w) => *w == v,
            Node::Binary(ir::BinaryOp::Add, a, b) => {
                let (fa, fb) = (x.free(*a) >> v & 1 == 1, x.free(*b) >> v & 1 == 1);
                (matches!(x.node(*a), Node::Var(w) if *w == v) && !fb)
                    || (matches!(x.node(*b), Node::Var(w) if *w == v) && !fa)
            }
            _ => false,
        };
        let mut seen = std::collections::HashSet::new();
        let mut stack = vec![e];
        while let Some(n) = stack.pop() {
            if !seen.insert(n) {
                continue;
            }
            if let Node::Load { index, .. } = x.node(n) {
                if index.last().is_some_and(|i| unit(*i)) {
                    return true;
                }
            }
            stack.extend(x.node(n).children());
        }
        false
    }

    /// The reductions the stores compute directly (not inside another
    /// reduction's body), in node order.
    pub fn top_reductions(&self) -> Vec<E> {
        let mut seen = std::collections::HashSet::new();
        let mut stack: Vec<E> = self.stores.iter().map(|s| s.value).collect();
        let mut out = Vec::new();
        while let Some(e) = stack.pop() {
            if !seen.insert(e) {
                continue;
            }
            match self.exprs.node(e) {
                Node::Reduce { .. } => out.push(e),
                n => stack.extend(n.children()),
            }
        }
        out.sort();
        out
    }
}

/// The schedule of a program whose warp schedule is `warp`
/// ([`LoopProgram::gpu_warp_schedule`], which a runtime reads once) where the
/// length it names is `row_len`.
pub fn schedule_at(warp: Option<(GpuLoopSchedule, E)>, row_len: i64) -> GpuLoopSchedule {
    match warp {
        Some((s, _)) if row_len >= WARP_ROW_MIN => s,
        _ => GpuLoopSchedule::Points,
    }
}

/// Blocks of [`LOOP_THREADS`] threads for a loop kernel over `rows × inner`
/// points under `schedule`: one thread a point, or one warp a row or point,
/// at most [`LOOP_MAX_BLOCKS`] (at least one, so that an empty nest still
/// launches validly).
pub fn loop_blocks(schedule: GpuLoopSchedule, rows: usize, inner: usize, quads: bool) -> usize {
    let per_thread = if quads && inner.is_multiple_of(QUAD as usize) { QUAD as usize } else { 1 };
    let threads = match schedule {
        GpuLoopSchedule::Points => rows.saturating_mul(inner) / per_thread,
        GpuLoopSchedule::WarpRows => rows.saturating_mul(WARP as usize),
        GpuLoopSchedule::WarpPoints => rows.saturating_mul(inner).saturating_mul(WARP as usize),
    };
    threads.div_ceil(LOOP_THREADS as usize).clamp(1, LOOP_MAX_BLOCKS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_the_units_and_stay_bounded() {
        assert_eq!(loop_blocks(GpuLoopSchedule::Points, 3, 100, false), 2);
        assert_eq!(loop_blocks(GpuLoopSchedule::WarpRows, 9, 768, true), 2);
        assert_eq!(loop_blocks(GpuLoopSchedule::WarpPoints, 8, 1, false), 1);
        assert_eq!(loop_blocks(GpuLoopSchedule::Points, 0, 7, true), 1);
        // Four points a thread where the row is a multiple of four, else one.
        assert_eq!(loop_blocks(GpuLoopSchedule::Points, 10, 1024, true), 10);
        assert_eq!(loop_blocks(GpuLoopSchedule::Points, 10, 1024, false), 40);
        assert_eq!(loop_blocks(GpuLoopSchedule::Points, 10, 1023, true), 40);
        assert_eq!(loop_blocks(GpuLoopSchedule::Points, usize::MAX, 2, false), LOOP_MAX_BLOCKS);
    }

    #[test]
    fn attention_splits_only_few_row_blocks_over_many_keys() {
        // Enough blocks of rows, or too few keys: no split.
        assert_eq!(attention_splits(256, 100_000), 1);
        assert_eq!(attention_splits(12, 7 * ATTENTION_KEYS), 1);
        assert_eq!(attention_splits(0, 5000), 1);
        // A decode step: splits of at least four chunks, up to the target.
        assert_eq!(attention_splits(12, 2000), 8);
        assert_eq!(attention_splits(96, 32_768), 3);
        assert_eq!(attention_splits(1, 1 << 20), ATTENTION_TARGET_BLOCKS);
        assert_eq!(attention_partials(3, 1, 64), 0);
        assert_eq!(attention_partials(3, 2, 64), 3 * 2 * ATTENTION_ROWS * 4 * 66);
    }
}

/// How a contraction's operand is made what the GEMM family reads: bf16,
/// dense, row-major `[entries, rows, cols]` (or `[entries, cols, rows]`),
/// from an f32 strided view or a convolution's taps over an image (the
/// column matrix written once, in bf16). One kernel does every form
/// ([`OPERAND_COPY_KERNEL`]); what it copies is a descriptor of i64 words
/// ([`OperandCopy::descriptor`]) the runtime writes per shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperandCopy {
    /// Element `(r, c)` of each entry at `r·rs + c·cs` past the entry's
    /// offset; `transposed` writes `[cols, rows]` (a B made K-major).
    View { rows: usize, cols: usize, rs: usize, cs: usize, transposed: bool },
    /// A convolution's taps: row `(b, y, x)` an output pixel, column
    /// `(i, j, c)` channel `c` of tap `(i, j)`, read from the image at
    /// `(b, y·sh + i·dh − ph, x·sw + j·dw − pw, c)` (`strides`: elements
    /// between images, rows and pixels; channels contiguous), zero outside.
    Taps {
        rows: usize,
        cols: usize,
        out: [usize; 2],
        /// The image's height, width and channels.
        image: [usize; 3],
        kernel_width: usize,
        stride: [usize; 2],
        dilation: [usize; 2],
        pad: [usize; 2],
        strides: [usize; 3],
    },
}

/// The operand copy kernel's symbol; its parameters are the f32 source, the
/// bf16 destination and the descriptor (device pointers), its block
/// [`LOOP_THREADS`] threads, its elements taken grid-stride.
pub const OPERAND_COPY_KERNEL: &str = "operand_copy_bf16";

/// Words of the descriptor before the entries' offsets: the form (0 a view,
/// 1 a transposed view, 2 taps, [`OperandCopy::ROWS4`] a view four elements
/// a thread, [`OperandCopy::TAPS4`] taps four channels a thread,
/// [`OperandCopy::TAPS32`] taps an element a thread in 32-bit indices,
/// [`OperandCopy::VIEW32`] a view likewise), the
/// entries, rows, columns, then the form's own words
/// ([`OperandCopy::descriptor`]).
pub const OPERAND_COPY_HEADER: usize = 19;

impl OperandCopy {
    /// The descriptor's form of a view copied four elements a thread
    /// ([`OperandCopy::descriptor`] picks it where it applies).
    pub const ROWS4: i64 = 3;

    /// The descriptor's form of taps copied four channels a thread (one
    /// tap's, adjacent in the image), with 32-bit index arithmetic
    /// ([`OperandCopy::descriptor`] picks it where it applies).
    pub const TAPS4: i64 = 4;

    /// The descriptor's form of taps copied an element a thread with 32-bit
    /// index arithmetic (under 2³¹ elements; [`OperandCopy::descriptor`]
    /// picks it where the taps-of-four form does not apply); form 2 does
    /// the same in 64 bits.
    pub const TAPS32: i64 = 5;

    /// The descriptor's form of a view (word 6: transposed or not) copied an
    /// element a thread with 32-bit index arithmetic (under 2³¹ elements,
    /// where the rows-of-four form does not apply); forms 0 and 1 do the
    /// same in 64 bits.
    pub const VIEW32: i64 = 6;

    /// Rows and columns of one entry as the source lays it out.
    pub fn extent(&self) -> (usize, usize) {
        match *self {
            OperandCopy::View { rows, cols, .. } | OperandCopy::Taps { rows, cols, .. } => (rows, cols),
        }
    }

    /// The kernel's descriptor for entries at `offsets` (elements into the
    /// source): `[form, entries, rows, cols]`, then a view's `rs, cs` or the
    /// taps' `oh, ow, H, W, C, kw, sh, sw, dh, dw, ph, pw` and strides, padded to
    /// [`OPERAND_COPY_HEADER`] words, then the offsets.
    pub fn descriptor(&self, offsets: &[usize]) -> Vec<i64> {
        let (rows, cols) = self.extent();
        let mut w = vec![0i64; OPERAND_COPY_HEADER];
        w[1] = offsets.len() as i64;
        w[2] = rows as i64;
        w[3] = cols as i64;
        match *self {
            OperandCopy::View { rs, cs, transposed, .. } => {
                // Rows of four adjacent elements, each 16-byte aligned (the
                // source's start is), under 2³¹ elements: read four at a time.
                // Else an element a thread, in 32-bit indices under 2³¹.
                let narrow = offsets.len().checked_mul(rows * cols).is_some_and(|n| n <= i32::MAX as usize);
                let rows4 = !transposed
                    && cs == 1
                    && cols.is_multiple_of(4)
                    && rs.is_multiple_of(4)
                    && offsets.iter().all(|o| o.is_multiple_of(4));
                w[0] = match (narrow, rows4) {
                    (true, true) => Self::ROWS4,
                    (true, false) => Self::VIEW32,
                    (false, _) => transposed as i64,
                };
                w[4] = rs as i64;
                w[5] = cs as i64;
                w[6] = transposed as i64;
            }
            OperandCopy::Taps { out, image, kernel_width, stride, dilation, pad, strides, .. } => {
                // Under 2³¹ elements in all, the indices' arithmetic in 32 bits
                // (the source's offsets stay 64-bit); with the channels, the
                // image's strides and the offsets in fours (each group of four
                // 16-byte aligned, as the source's start is), a tap's four
                // adjacent channels at a time.
                let narrow = offsets.len().checked_mul(rows * cols).is_some_and(|n| n <= i32::MAX as usize);
                let fours = image[2].is_multiple_of(4)
                    && strides.iter().all(|s| s.is_multiple_of(4))
                    && offsets.iter().all(|o| o.is_multiple_of(4));
                w[0] = match (narrow, fours) {
                    (true, true) => Self::TAPS4,
                    (true, false) => Self::TAPS32,
                    (false, _) => 2,
                };
                let taps = [
                    out[0],
                    out[1],
                    image[0],
                    image[1],
                    image[2],
                    kernel_width,
                    stride[0],
                    stride[1],
                    dilation[0],
                    dilation[1],
                    pad[0],
                    pad[1],
                    strides[0],
                    strides[1],
                    strides[2],
                ];
                for (i, t) in taps.into_iter().enumerate() {
                    w[4 + i] = t as i64;
                }
            }
        }
        w.extend(offsets.iter().map(|&o| o as i64));
        w
    }

    /// The threads' units of work descriptor `words` asks for: its
    /// elements, or groups of four in [`OperandCopy::ROWS4`] and
    /// [`OperandCopy::TAPS4`] forms.
    pub fn work_items(words: &[i64]) -> usize {
        let n = words.get(1..4).map_or(0, |w| w.iter().map(|&x| x.max(0) as usize).product());
        if matches!(words.first(), Some(&Self::ROWS4 | &Self::TAPS4)) {
            n / 4
        } else {
            n
        }
    }
}

/// Fused attention on a GPU (FlashAttention-2's schedule): a block of
/// [`ATTENTION_THREADS`] threads takes [`ATTENTION_ROWS`] query rows of one
/// batch entry (a warp 16 of them) against every key, a chunk of
/// [`ATTENTION_KEYS`] keys at a time: `S = Q·Kᵀ` by `mma.sync` (or Hopper's
/// `wgmma`, [`AttentionMma`]) into registers,
/// the model's logits of `S` (its scale and masks: the step's online softmax
/// program, evaluated per element), the online softmax's running maxima and
/// sums, `O += P·V` with `P` in bf16 from the same registers. Q, K and V are
/// read as f32 from their strided views and rounded to bf16 in shared
/// memory; the head dimension is the kernel's constant.
pub const ATTENTION_THREADS: u32 = 128;

/// Query rows a block of the attention kernel takes.
pub const ATTENTION_ROWS: usize = 64;

/// Keys the attention kernel takes at a time.
pub const ATTENTION_KEYS: usize = 64;

/// The head dimensions the attention kernel is built for: multiples of 16
/// (the `mma` depth) up to this.
pub const ATTENTION_MAX_HEAD: usize = 128;

/// Words of the attention kernel's descriptor before the entries' offsets:
/// the device pointers of the status word, Q, K, V, O, the split keys'
/// partial results and their counters (one word a block of rows, zero at the
/// launch), then the query rows, the keys, the blocks of rows an entry, the
/// entries, the splits of the keys, then the strides (elements): Q's rows
/// and columns, K's keys and columns, V's keys and columns, O's rows and
/// columns. Four offsets an entry follow (Q, K, V, O, elements).
pub const ATTENTION_HEADER: usize = 20;

/// Pointers at the start of the attention kernel's descriptor.
pub const ATTENTION_POINTERS: usize = 7;

/// Blocks the attention kernel aims at when an entry's rows are few (a
/// decode step: one query row against a long cache): the keys of a block of
/// rows are then split among several blocks (flash-decoding), each storing
/// its rows' partial maxima, sums and outputs; the last to finish combines
/// them.
pub const ATTENTION_TARGET_BLOCKS: usize = 256;

/// The fewest chunks of keys a split takes.
pub const ATTENTION_SPLIT_CHUNKS: usize = 4;

/// How many ways the keys of each block of rows are split: one where the
/// blocks of rows already fill [`ATTENTION_TARGET_BLOCKS`], else as many as
/// reach it with at least [`ATTENTION_SPLIT_CHUNKS`] chunks a split.
pub fn attention_splits(row_blocks: usize, keys: usize) -> usize {
    let chunks = keys.div_ceil(ATTENTION_KEYS);
    if row_blocks == 0 || row_blocks >= ATTENTION_TARGET_BLOCKS {
        return 1;
    }
    ATTENTION_TARGET_BLOCKS.div_ceil(row_blocks).min(chunks / ATTENTION_SPLIT_CHUNKS).max(1)
}

/// Bytes of the split keys' partial results: for each block of rows, split
/// and row, its maximum, sum and `d` unnormalized outputs (f32).
pub fn attention_partials(row_blocks: usize, splits: usize, d: usize) -> usize {
    if splits <= 1 {
        return 0;
    }
    row_blocks.saturating_mul(splits).saturating_mul(ATTENTION_ROWS).saturating_mul(4 * (d + 2))
}

/// Bytes of shared memory the attention kernel of head dimension `d` asks
/// for: the Q tile and a chunk of K and of V in bf16, each row padded by 16
/// bytes (so that `ldmatrix`'s eight rows fall in distinct banks), and a
/// word saying whether the block combines the splits.
pub fn attention_smem(d: usize) -> usize {
    attention_tiles(d) + 16
}

/// Bytes of the attention kernel's three tiles.
pub fn attention_tiles(d: usize) -> usize {
    3 * ATTENTION_ROWS.max(ATTENTION_KEYS) * attention_pitch(d)
}

/// Bytes between rows of the attention kernel's tiles.
pub fn attention_pitch(d: usize) -> usize {
    2 * d + 16
}

/// How a kernel follows the one before it on its stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum KernelLaunch {
    /// After the kernel before it has finished (any GPU).
    #[default]
    Ordered,
    /// Hopper's programmatic dependent launch: launched while the kernel
    /// before it runs, the kernel first waits for it (`griddepcontrol.wait`)
    /// and then lets the kernel after it launch; so the launches overlap the
    /// kernels while each kernel's work still follows its predecessor's.
    Dependent,
}

/// How an attention kernel multiplies its tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AttentionMma {
    /// `mma.sync` m16n8k16 (sm_80 on), operands from registers by `ldmatrix`.
    Sync,
    /// Hopper's warpgroup MMA (sm_90a): `S = Q·Kᵀ` with both from shared
    /// memory, `O += P·V` with P from the score registers and Vᵀ from shared
    /// memory; heads in whole 128-byte swizzle atoms ([`attention_wgmma_ok`]).
    Wgmma,
}

/// Whether Hopper's attention kernel takes head dimension `d`: Q, K and Vᵀ
/// lie in shared memory in 128-byte swizzle atoms (64 bf16 along the head).
pub fn attention_wgmma_ok(d: usize) -> bool {
    d > 0 && d.is_multiple_of(64) && d <= ATTENTION_MAX_HEAD
}

/// The attention kernel's symbol for head dimension `d`, the step's online
/// program `program`, the kernel's multiplication and its output's type
/// (`_o16`: bf16).
pub fn attention_kernel_name(program: usize, d: usize, mma: AttentionMma, out_bf16: bool) -> String {
    let o = if out_bf16 { "_o16" } else { "" };
    match mma {
        AttentionMma::Sync => format!("attention_p{program}_d{d}{o}"),
        AttentionMma::Wgmma => format!("attention_p{program}_d{d}_wgmma{o}"),
    }
}
