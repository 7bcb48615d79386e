//! A plan's contraction steps on the GEMM family. Weights (a matmul's
//! constant B) are converted to bf16 and laid out K-major (`[N, K]`) once,
//! when the model is made, and stay on the device. Per shape, each step
//! becomes: the first of its kernel choices that takes the product, storing
//! f32 C with the step's epilogue (`GemmKernel::c_f32`) into C's view,
//! after the copies its operands need: none for an A that the kernels read
//! in place (`GemmKernel::a_f32`: an f32 view with adjacent columns, at any
//! row stride; the aligned kernels need it 16-byte aligned, the covers
//! not; `GemmKernel::a_taps`: a convolution's taps over a bf16 image whose
//! channels, strides and start are multiples of 8), else its bf16 copy that
//! A's producer writes beside it
//! (`MatMulStep::a_bf16`) where there is one and its rows are aligned, else
//! A copied to a bf16 dense operand by the operand copy kernel
//! (`plan::gpu::OperandCopy`: a strided view, or a convolution's taps
//! written as the column matrix); an activation B is copied K-major. A
//! split-K choice's blocks write their shares of K as f32 partial sums into
//! the call's scratch, and the last block of each tile sums the tile's
//! shares into C through the step's epilogue (`GemmKernel::fold`: one
//! launch, its tiles' counters in the call's tables).

use ir::DType;
use plan::gemm::{Arch, GemmKernel};
use plan::gpu::{OperandCopy, LOOP_MAX_BLOCKS, LOOP_THREADS};
use plan::{bf16_bits, ALayout, BufId, BufferKind, MatMulStep, ModelPlan, Problem};

use crate::shape::MatMulShape;
use crate::RunError;

/// A kernel that may run a matmul step: its description, its index among
/// the device's kernels, the most rows (M) it is chosen for, and the shares
/// of K a split-K kernel runs in (fewer where the last would have none; 1
/// for a whole-product kernel).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GemmChoice {
    pub kernel: GemmKernel,
    pub index: usize,
    pub max_m: usize,
    pub splits: usize,
}

impl GemmChoice {
    /// Its name: the kernel's, with `xS` for S shares of K.
    pub fn name(&self) -> String {
        self.kernel.name_split(self.splits)
    }
}

/// Where a launch's pointer argument points, resolved per call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum At {
    /// Bytes into a buffer of the plan.
    Buffer(BufId, usize),
    /// Bytes into the call's operand scratch.
    Scratch(usize),
    /// A packed weight (its index).
    Packed(usize),
    Null,
}

/// One launch of the operand copy kernel.
#[derive(Clone, Debug)]
pub(super) struct CopyLaunch {
    pub src: At,
    pub dst: At,
    pub words: Vec<i64>,
    pub blocks: u32,
}

/// One GEMM launch: `gpu::kernel::ABI`'s arguments.
#[derive(Clone, Debug)]
pub(super) struct GemmLaunch {
    pub kernel: usize,
    pub grid: [u32; 3],
    pub threads: u32,
    pub smem: u32,
    /// A, B, C, bias, residual.
    pub ptrs: [At; 5],
    /// M, N, K, lda, ldb, ldc.
    pub ints: [i32; 6],
    /// The batch strides of A, B and C (elements).
    pub strides: [i64; 3],
    /// Which of the step's choices runs (named only where asked: messages
    /// and tests).
    pub choice: usize,
    /// A split-K kernel's last arguments.
    pub fold: Option<FoldArgs>,
    /// A taps kernel's descriptor (`OperandCopy::descriptor` of its taps),
    /// which the call's tables hold; its pointer is an argument after the
    /// others.
    pub taps: Option<Vec<i64>>,
    /// Where a kernel storing a 16-bit copy of C stores it (C's entry in
    /// the step's `c_bf16`): the last argument.
    pub c16: Option<At>,
}

/// A folding split-K launch's arguments past the ABI's: its steps of K a
/// share, its workspace, and its tiles (a counter each, which the call's
/// tables hold, zero).
#[derive(Clone, Copy, Debug)]
pub(super) struct FoldArgs {
    pub kper: i32,
    pub workspace: At,
    pub tiles: usize,
}

/// A matmul step at one shape: its copies, then its GEMMs.
#[derive(Clone, Debug, Default)]
pub(super) struct MatMulLaunches {
    pub copies: Vec<CopyLaunch>,
    pub gemms: Vec<GemmLaunch>,
    /// Bytes of operand scratch the copies write.
    pub scratch: usize,
}

fn round_up(x: usize) -> usize {
    x.div_ceil(super::DEVICE_ALIGN) * super::DEVICE_ALIGN
}

fn i32_of(x: usize, what: &str) -> Result<i32, RunError> {
    i32::try_from(x)
        .map_err(|_| RunError::Shape(format!("{what} {x} exceeds the GPU kernels' 32-bit extents")))
}

impl CopyLaunch {
    /// `copy` of the entries at `offsets` from `src` to `dst`: its
    /// descriptor, and a thread a unit of its work (grid-stride past the
    /// cap on blocks).
    fn new(copy: &OperandCopy, offsets: &[usize], src: At, dst: At) -> CopyLaunch {
        let words = copy.descriptor(offsets);
        let units = OperandCopy::work_items(&words);
        let blocks = units.div_ceil(LOOP_THREADS as usize).clamp(1, LOOP_MAX_BLOCKS) as u32;
        CopyLaunch { src, dst, words, blocks }
    }
}

/// The launches of matmul step `mm` at shape `s`, its B packed as weight
/// `packed` when it is one.
pub(super) fn launches(
    plan: &ModelPlan,
    step: usize,
    mm: &MatMulStep,
    s: &MatMulShape,
    choices: &[GemmChoice],
    packed: Option<usize>,
) -> Result<MatMulLaunches, RunError> {
    let (m, n, k) = (s.m, s.n, s.k);
    let entries = s.entries.len();
    if m == 0 || n == 0 || entries == 0 {
        return Ok(MatMulLaunches::default());
    }
    if k == 0 {
        return Err(RunError::Device(format!(
            "step {step}: a product of depth 0 ({m}x{n}) is not on the GPU yet"
        )));
    }
    if s.cs[2] != 1 {
        return Err(RunError::Internal(format!("step {step}: C's columns are {} apart", s.cs[2])));
    }
    let over = || RunError::Shape(format!("step {step}: the operands of {entries}x({m}x{n}x{k}) overflow"));
    let a_elems = entries.checked_mul(m).and_then(|x| x.checked_mul(k)).ok_or_else(over)?;
    let b_elems = entries.checked_mul(n).and_then(|x| x.checked_mul(k)).ok_or_else(over)?;
    let mut out = MatMulLaunches::default();
    // Kernels with an f32 A read it in place: a view with unit column stride,
    // its rows `lda` apart, its entries evenly apart (else one launch an
    // entry); the aligned ones' 16-byte loads need its start, `lda` and
    // batch stride multiples of 4.
    let in_place = s.taps.is_none() && s.cs[0] == 1 && choices.iter().any(|c| c.kernel.a_f32);
    let (sa, a_even) = entry_stride(s, 0);
    // A in bf16, read in place by the kernels that read bf16 A: A's own
    // buffer where it is bf16 (a product's output that only products read,
    // `lower::bf16_products`; the aligned kernels where its rows and entries
    // start 16 bytes apart, which the plan makes so, the covers anywhere),
    // else the copy its producer writes beside it (`MatMulStep::a_bf16`)
    // where they start so and its entries are evenly apart (one launch).
    let a16_aligned = s.taps.is_none()
        && s.cs[0] == 1
        && s.rs[0].is_multiple_of(8)
        && s.entries.iter().all(|x| x[0].is_multiple_of(8));
    let a_is_bf16 = plan.buffers[mm.a.buf].dtype == DType::BF16;
    let a16 = if s.taps.is_some() {
        None
    } else if a_is_bf16 {
        Some(mm.a.buf)
    } else {
        mm.a_bf16.filter(|_| a16_aligned && a_even)
    };
    // A convolution's taps over a bf16 image (the buffer itself, or the copy
    // its producer writes beside it), read in place by the taps kernels
    // (implicit GEMM) where the image's channels, strides and start are
    // multiples of 8 (each 16-byte chunk 8 channels of one tap) and its
    // entries evenly apart. An image only in bf16 is read by them alone
    // (the operand copy reads f32).
    let taps_image = s.taps.as_ref().and_then(|t| {
        let image = if a_is_bf16 { mm.a.buf } else { mm.a_bf16? };
        let aligned = t.channels.is_multiple_of(8)
            && t.strides.iter().all(|x| x.is_multiple_of(8))
            && s.entries.iter().all(|x| x[0].is_multiple_of(8));
        (aligned && a_even).then_some(image)
    });
    if s.taps.is_some() && a_is_bf16 && taps_image.is_none() {
        return Err(RunError::Internal(format!(
            "step {step}: a convolution over a bf16 image whose channels, strides or start are not multiples of 8"
        )));
    }
    // The GPU's taps kernels take any taps (a dilated row too), so the
    // layout is taps whatever the CPU's direct kernels would make of it.
    let taps_layout =
        s.taps.as_ref().map(|t| ALayout::Taps { width: t.out[1], interior: 0, reads: t.reads() });
    let c_bytes = plan.buffers[mm.c.buf].dtype.size();
    let a_aligned = in_place && s.rs[0].is_multiple_of(4) && s.entries.iter().all(|x| x[0].is_multiple_of(4));
    // Kernels with an f32 B (an activation, K-major: its K adjacent) read it
    // in place at the rows they take; the GEMV's 16-byte loads need its
    // start, `ldb` and batch stride multiples of 4.
    let b_in_place =
        packed.is_none() && s.rs[1] == 1 && choices.iter().any(|c| c.kernel.b_f32 && m <= c.max_m);
    let (sb_entry, b_even) = entry_stride(s, 1);
    let b_aligned =
        b_in_place && s.cs[1].is_multiple_of(4) && s.entries.iter().all(|x| x[1].is_multiple_of(4));
    let takes = |c: &GemmChoice, m: usize, p: &Problem, c_even: bool| {
        let taps = match (c.kernel.a_taps, taps_layout) {
            (true, Some(a)) if taps_image.is_some() => Some(Problem { a, ..*p }),
            (true, _) => return false,
            // The column matrix is copied from an f32 image only.
            (false, Some(_)) if a_is_bf16 => return false,
            (false, _) => None,
        };
        m <= c.max_m
            && c.kernel.accepts(taps.as_ref().unwrap_or(p)).is_ok()
            && (!c.kernel.split_k || (p.batch == 1 && entries == 1))
            && (c_even || matches!(c.kernel.arch, Arch::Simt | Arch::Gemv))
            && (!c.kernel.a_f32 || (in_place && (a_aligned || c.kernel.is_cover())))
            && (!a_is_bf16 || a16_aligned || c.kernel.is_cover() || c.kernel.a_taps)
            && (!c.kernel.b_f32 || (b_in_place && (b_aligned || c.kernel.arch == Arch::Simt)))
    };
    // C's entries (and an in-place A's and B's): one launch over an even
    // stride, else one an entry.
    let (sc, c_even) = entry_stride(s, 2);
    // (B's evenness matters only where an f32-B kernel can take it.)
    let b_taken = b_in_place
        && (b_aligned
            || choices.iter().any(|c| c.kernel.b_f32 && c.kernel.arch == Arch::Simt && m <= c.max_m));
    let even =
        c_even && (!(in_place || a16.is_some() || taps_image.is_some()) || a_even) && (!b_taken || b_even);
    let runs: Vec<(usize, usize)> =
        if even { vec![(0, entries)] } else { (0..entries).map(|e| (e, 1)).collect() };
    let mut picked = Vec::with_capacity(runs.len());
    for &(first, count) in &runs {
        let p = Problem::nt(count, m, n, k);
        // Paired f32 stores need an even start (the kernels check the strides).
        let c_even = s.entries[first][2].is_multiple_of(2);
        let choice = choices
            .iter()
            .position(|c| takes(c, m, &p, c_even))
            .ok_or_else(|| RunError::Device(format!("step {step}: no GPU kernel of this model takes {p}")))?;
        picked.push(choice);
    }
    // A: a view, or a convolution's taps, as bf16 `[entries, m, k]`, unless
    // every launch reads it in place (f32, or its producer's bf16 copy).
    if a16.is_none() && picked.iter().any(|&c| !choices[c].kernel.a_f32 && !choices[c].kernel.a_taps) {
        let a_copy = match a_taps_copy(s, m, k) {
            Some(t) => t,
            None => OperandCopy::View { rows: m, cols: k, rs: s.rs[0], cs: s.cs[0], transposed: false },
        };
        let offsets: Vec<usize> = s.entries.iter().map(|e| e[0]).collect();
        out.copies.push(CopyLaunch::new(&a_copy, &offsets, At::Buffer(mm.a.buf, 0), At::Scratch(0)));
        out.scratch = round_up(2 * a_elems);
    }
    // B: the packed weight, the activation made K-major `[entries, n, k]`,
    // or (kernels with an f32 B, only) the activation in place.
    let (b_at, sb) = match packed {
        Some(w) => (At::Packed(w), 0),
        None if picked.iter().all(|&c| choices[c].kernel.b_f32) => (At::Null, 0),
        None => {
            let at = out.scratch;
            let offsets: Vec<usize> = s.entries.iter().map(|e| e[1]).collect();
            let copy = OperandCopy::View { rows: k, cols: n, rs: s.rs[1], cs: s.cs[1], transposed: true };
            out.copies.push(CopyLaunch::new(&copy, &offsets, At::Buffer(mm.b.buf, 0), At::Scratch(at)));
            out.scratch += round_up(2 * b_elems);
            (At::Scratch(at), n * k)
        }
    };
    let ldc = s.rs[2];
    if mm.epilogue.codes {
        return Err(RunError::Device(format!(
            "step {step}: a product storing its output as u8 codes is not on the GPU (its plans keep f32)"
        )));
    }
    if mm.epilogue.residual_codes {
        return Err(RunError::Device(format!(
            "step {step}: a residual of u8 codes is not on the GPU (its plans keep f32)"
        )));
    }
    let residual = mm.epilogue.residual;
    if residual.is_some() && (ldc != n || (entries > 1 && (!c_even || sc != m * n))) {
        return Err(RunError::Device(format!(
            "step {step}: a residual added to a strided output (row stride {ldc} for {n} columns) is not on the GPU yet"
        )));
    }
    for (&(first, count), &choice) in runs.iter().zip(&picked) {
        let c_off = s.entries[first][2];
        let kk = &choices[choice].kernel;
        // A: in place (f32, or in bf16: the entry's offset, its row and
        // batch strides), or the copy's bf16 `[entries, m, k]`.
        let (a_at, lda, sa) = match (a16, taps_image) {
            // A normalizing GEMV reads the norm's input, laid out as A.
            _ if kk.norm.is_some() => {
                let x = mm.a_norm.as_ref().map(|n| n.x).ok_or_else(|| {
                    RunError::Internal(format!("step {step}: kernel {kk} normalizes an A that is no norm's"))
                })?;
                (At::Buffer(x, 4 * s.entries[first][0]), s.rs[0], sa)
            }
            _ if kk.a_f32 => (At::Buffer(mm.a.buf, 4 * s.entries[first][0]), s.rs[0], sa),
            // The image (its geometry in the descriptor; `lda` unused).
            (_, Some(image)) if kk.a_taps => (At::Buffer(image, 2 * s.entries[first][0]), 0, sa),
            (Some(b), _) => (At::Buffer(b, 2 * s.entries[first][0]), s.rs[0], sa),
            (None, _) => (At::Scratch(2 * first * m * k), k, m * k),
        };
        // B: in place (f32, the entry's offset, its columns `ldb` apart), or
        // the packed weight or copy (bf16, `ldb` = K).
        let (b_at, ldb, sb) = if kk.b_f32 {
            (At::Buffer(mm.b.buf, 4 * s.entries[first][1]), s.cs[1], sb_entry)
        } else {
            let at = match b_at {
                At::Scratch(o) => At::Scratch(o + 2 * first * n * k),
                x => x,
            };
            (at, k, sb)
        };
        let bytes = |elems: usize| elems * 4;
        let c_at = At::Buffer(mm.c.buf, c_bytes * c_off);
        let bias = mm.epilogue.bias.map_or(At::Null, |b| At::Buffer(b, 0));
        let res = residual.map_or(At::Null, |r| At::Buffer(r, bytes(first * m * n)));
        let ints = |ldc: usize| -> Result<[i32; 6], RunError> {
            Ok([
                i32_of(m, "M")?,
                i32_of(n, "N")?,
                i32_of(k, "K")?,
                i32_of(lda, "A's row stride")?,
                i32_of(ldb, "B's row stride")?,
                i32_of(ldc, "C's row stride")?,
            ])
        };
        let mut launch = GemmLaunch {
            kernel: choices[choice].index,
            grid: grid_of([n.div_ceil(kk.bn), m.div_ceil(kk.bm), count]),
            threads: kk.threads() as u32,
            smem: kk.smem_bytes() as u32,
            ptrs: [a_at, b_at, c_at, bias, res],
            ints: ints(ldc)?,
            strides: [sa as i64, sb as i64, sc as i64],
            choice,
            fold: None,
            taps: None,
            c16: None,
        };
        if kk.c16_copy {
            let copy = mm.c_bf16.ok_or_else(|| {
                RunError::Internal(format!(
                    "step {step}: kernel {kk} stores a copy of C the plan has no buffer for"
                ))
            })?;
            launch.c16 = Some(At::Buffer(copy, 2 * c_off));
        }
        if kk.a_taps {
            launch.taps = a_taps_copy(s, m, k).map(|t| t.descriptor(&[]));
        }
        // Split-K: the grid's `z` runs over the shares, whose partial sums
        // go to a workspace in the scratch after the copies' operands; one
        // product (its batch strides unused).
        if kk.split_k {
            if !kk.fold {
                return Err(RunError::Internal(format!("step {step}: split-K kernel {kk} does not fold")));
            }
            let (per, shares) = kk.split_plan(k, choices[choice].splits);
            let (floats, tiles) = kk.fold_space(&Problem::nt(1, m, n, k), shares);
            let workspace = At::Scratch(out.scratch);
            out.scratch += round_up(floats.checked_mul(4).ok_or_else(over)?);
            launch.grid[2] = grid_of([shares, 1, 1])[0];
            launch.strides = [0, 0, 0];
            launch.fold = Some(FoldArgs { kper: i32_of(per, "K steps a share")?, workspace, tiles });
        }
        out.gemms.push(launch);
    }
    Ok(out)
}

/// A convolution's taps as A (`m × k`), if A is taps.
fn a_taps_copy(s: &MatMulShape, m: usize, k: usize) -> Option<OperandCopy> {
    s.taps.as_ref().map(|t| OperandCopy::Taps {
        rows: m,
        cols: k,
        out: t.out,
        image: [t.height, t.width, t.channels],
        kernel_width: t.kernel[1],
        stride: t.stride,
        dilation: t.dilation,
        pad: t.pad,
        strides: t.strides,
    })
}

/// A grid's extents as the driver takes them.
fn grid_of(g: [usize; 3]) -> [u32; 3] {
    g.map(|g| u32::try_from(g).unwrap_or(u32::MAX))
}

/// Operand `x`'s (0: A, 2: C) distance between batch entries (elements;
/// one entry: its rows' extent) and whether every entry lies that far on
/// from the one before.
fn entry_stride(s: &MatMulShape, x: usize) -> (usize, bool) {
    let e = &s.entries;
    let first = e[0][x];
    let stride = if e.len() > 1 { e[1][x].wrapping_sub(first) } else { s.m * s.rs[x] };
    let even = e.iter().enumerate().all(|(i, y)| y[x] == first.wrapping_add(i.wrapping_mul(stride)));
    (stride, even)
}

/// Dim slot `slot` of `plan`, a constant as a weight's extents and view are.
fn weight_const(plan: &ModelPlan, step: usize, slot: u32, what: &str) -> Result<usize, RunError> {
    plan.dims
        .exprs()
        .get(slot as usize)
        .and_then(|e| e.as_const())
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| RunError::Device(format!("step {step}: the weight's {what} is not a constant")))
}

/// The bytes of weight `mm.b` packed ([`pack_weight`]).
pub(super) fn packed_len(plan: &ModelPlan, step: usize, mm: &MatMulStep) -> Result<usize, RunError> {
    let (n, k) = (weight_const(plan, step, mm.n, "columns")?, weight_const(plan, step, mm.k, "depth")?);
    n.checked_mul(k)
        .and_then(|x| x.checked_mul(2))
        .ok_or_else(|| RunError::Internal(format!("step {step}: a weight of {n} x {k}")))
}

/// Weight `mm.b` (a constant) as bf16 `[N, K]`: what every shape's GEMMs read.
pub(super) fn pack_weight(plan: &ModelPlan, step: usize, mm: &MatMulStep) -> Result<Vec<u16>, RunError> {
    let konst = |slot: u32, what: &str| weight_const(plan, step, slot, what);
    let (n, k) = (konst(mm.n, "columns")?, konst(mm.k, "depth")?);
    let (off, rs, cs) =
        (konst(mm.b.offset, "offset")?, konst(mm.b.rs, "row stride")?, konst(mm.b.cs, "column stride")?);
    let buf = &plan.buffers[mm.b.buf];
    let BufferKind::Constant(c) = &buf.kind else {
        return Err(RunError::Internal(format!("step {step}: weight '{}' is not a constant", buf.name)));
    };
    let bytes = c.bytes();
    let len = bytes.len() / 4;
    let mut out = vec![0u16; n * k];
    for j in 0..n {
        for i in 0..k {
            let at = off + i * rs + j * cs;
            if at >= len {
                return Err(RunError::Internal(format!(
                    "step {step}: weight '{}' read past its end",
                    buf.name
                )));
            }
            let x =
                f32::from_le_bytes([bytes[4 * at], bytes[4 * at + 1], bytes[4 * at + 2], bytes[4 * at + 3]]);
            out[j * k + i] = bf16_bits(x);
        }
    }
    Ok(out)
}
