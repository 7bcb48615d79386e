//! One GEMM kernel of the GPU family: what the code generator builds and the runner
//! launches. A kernel is shape-generic: M, N, K, the leading dimensions and the
//! batch strides are launch arguments, and ragged edges are padded locally (zero
//! fill in shared memory, predicated stores), never by copying operands. Part of
//! the plan: the GPU backend of the runtime reads a kernel's geometry (tile,
//! threads, shared memory) and its shape rules to launch it.

pub use crate::{ALayout, Activation, BLayout, ElemType, Epilogue, Problem};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The `mma.sync` kernels stage K through shared memory 32 elements (64 bytes) at a
/// time: four 16-byte chunks a row, the unit of `cp.async` and of an `ldmatrix` row.
pub const BK: usize = 32;

/// The `wgmma` kernels stage 64 (128 bytes a row: one row of a 128-byte swizzle atom).
pub const BK_WGMMA: usize = 64;

/// A SIMT kernel's threads: a 16 × 16 grid, each computing `bm/16 × bn/16` values of
/// C at rows 16 apart and columns 16 apart (neighbouring threads read neighbouring
/// columns of an N-major B and store neighbouring columns of C).
pub const SIMT_GRID: usize = 16;

/// Tile rows a raster group spans: blocks (and a persistent kernel's tiles) are
/// numbered row-fastest within groups of this many tile rows, so that consecutive
/// blocks share B's column panels and a few of A's row panels in L2.
pub const RASTER_ROWS: usize = 8;

/// The K elements of a SIMT kernel's step for the wave model (it has no stages: its
/// loop takes one K element at a time).
pub const SIMT_STEP: usize = 16;

/// The K elements of a GEMV kernel's step: a warp's 32 lanes, 8 elements (16 bytes)
/// each.
pub const GEMV_STEP: usize = 256;

/// The machine a kernel is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Arch {
    /// Ampere and later: `mma.sync` m16n8k16, `ldmatrix`, `cp.async`. Runs on Hopper too.
    Sm80,
    /// Hopper's warpgroup MMA (`wgmma.mma_async`, operands read from shared memory
    /// through descriptors): ptxas target `sm_90a`.
    Sm90a,
    /// The CUDA cores (f32 FMAs; ptxas target `sm_80`, runs on any later GPU): each
    /// thread of a 16 × 16 grid reads its rows of A and columns of B element by
    /// element, so no shape rule binds it (any K, any leading dimension). The
    /// family's cover for products the tensor-core kernels refuse (K not a multiple of
    /// 8, an N-major B with N not a multiple of 8); the model offers it only there.
    Simt,
    /// Decode-sized rows against a pre-packed (K-major) weight, on the CUDA cores: a
    /// warp a column of C, its lanes splitting K in 16-byte chunks of A's rows and
    /// B's column (coalesced: B is read once, at the memory's rate), f32 FMAs, the
    /// lanes' sums added by warp shuffles. `bm` rows a block (up to 16), `bn` warps.
    /// No second launch and no f32 round trip, where split-K pays both.
    Gemv,
}

impl Arch {
    /// The name ptxas and LLVM use (`-arch`, `-mcpu`).
    pub const fn sm(self) -> &'static str {
        match self {
            Arch::Sm80 | Arch::Simt | Arch::Gemv => "sm_80",
            Arch::Sm90a => "sm_90a",
        }
    }
}

/// The kernel name's suffix for epilogue `e` (empty for none): `_s<bits>` for
/// a scale, `_cs` for column scales, `_bias`, `_res`, then the activation (`_relu`, `_gelue`,
/// `_gelut`, `_tanh`; `_pw<fingerprint>` for an element-wise program).
pub fn epilogue_suffix(e: &Epilogue) -> String {
    let mut s = String::new();
    if let Some(k) = e.scale {
        s.push_str(&format!("_s{:08x}", k.to_bits()));
    }
    if e.column_scale {
        s.push_str("_cs");
    }
    if e.bias {
        s.push_str("_bias");
    }
    if e.residual {
        s.push_str("_res");
    }
    match e.activation {
        Activation::None => {}
        Activation::Relu => s.push_str("_relu"),
        Activation::Gelu => s.push_str("_gelue"),
        Activation::GeluTanh => s.push_str("_gelut"),
        Activation::Tanh => s.push_str("_tanh"),
        Activation::Pointwise(p) => s.push_str(&format!("_pw{:016x}", p.fingerprint())),
    }
    s
}

/// Whether `e` computes with `tanh.approx` (relative error about 2⁻¹¹): the
/// outputs' tolerance then allows for it. The named GELU and tanh activations
/// do; an element-wise program computes with the CPU's formulas, its `exp` and
/// `log` by `ex2.approx`/`lg2.approx` (relative error about 2⁻²²), which the
/// 16-bit output's rounding covers.
pub fn epilogue_approximate(e: &Epilogue) -> bool {
    matches!(e.activation, Activation::Gelu | Activation::GeluTanh | Activation::Tanh)
}

/// A GEMM kernel: a block of `warps_m × warps_n` warps computes a `bm × bn` tile of
/// C, each warp a `(bm/warps_m) × (bn/warps_n)` tile of m16n8k16 products, with K
/// staged through `stages` shared-memory buffers filled by `cp.async`. For `Sm90a`
/// (wgmma) the warps form `bm/64` warpgroups of 4, each computing `64 × bn` with
/// `m64n{bn}k16` instructions: `warps_m = bm/16`, `warps_n = 1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GemmKernel {
    pub arch: Arch,
    pub elem: ElemType,
    pub b: BLayout,
    pub bm: usize,
    pub bn: usize,
    pub warps_m: usize,
    pub warps_n: usize,
    pub stages: usize,
    pub epilogue: Epilogue,
    /// wgmma only: one group of products left in flight while the next step's are
    /// issued (the copies then run `stages - 2` steps ahead, one buffer being read by
    /// the group in flight); without it each step's products are waited for.
    #[serde(default)]
    pub overlap: bool,
    /// Split-K: the launch's `z` blocks each take a share of K's steps and write f32
    /// partial products to a workspace (`C` is then `[splits, M, N]` f32, no epilogue);
    /// a [`ReduceKernel`] sums the shares and applies the epilogue. For a few rows
    /// against a long K, where the tiles alone would not fill the SMs. Batch 1.
    #[serde(default)]
    pub split_k: bool,
    /// Split-K only: the kernel folds its shares itself, with no second launch.
    /// Each block writes its share of its tile to the workspace (`W`, in its
    /// threads' fragment order: `[tiles, splits, bm·bn]` f32) and counts itself
    /// done on its tile's counter; the last of a tile's blocks to count sums the
    /// tile's shares in split order (as a [`ReduceKernel`] does, so the sums are
    /// the same bits), sets the counter back to zero and stores C through the
    /// epilogue, C of `c_type()` as an unsplit kernel's. Two more arguments,
    /// after `kper`: the workspace and the tiles' counters (i64, zero at the
    /// launch, zero again after it). Not a TMA kernel's (but a Stream-K one's).
    #[serde(default)]
    pub fold: bool,
    /// Folding split-K only: Stream-K (Osama et al., PPoPP 2023). The launch's
    /// `x` blocks (`G`, one a resident slot at most, and no more than the
    /// product's steps) take even shares of the K steps of all the tiles
    /// together, in tile order: block `b` the steps `⌊b·I/G⌋` to
    /// `⌊(b+1)·I/G⌋` of `I` = tiles × K steps, a tile at a time. A tile whole
    /// in one block's share is stored as an unsplit kernel stores it; one
    /// shared between blocks is folded as [`GemmKernel::fold`] folds, its
    /// shares summed in block (so K) order. So no wave is partial, whatever
    /// the tile count. `kper` is then the workspace's shares a tile
    /// ([`GemmKernel::stream_slots`]). Also the persistent TMA kernels' (not
    /// ping-pong): the producer walks the same units, and the consumers fold.
    #[serde(default)]
    pub stream_k: bool,
    /// wgmma only, warp-specialized: a producer warpgroup streams each stage's A and
    /// B tiles with TMA (`cp.async.bulk.tensor`, the hardware zero-filling whatever
    /// lies past M, N or K) into `stages` buffers, each guarded by a pair of
    /// mbarriers (full: the copy's bytes have landed; empty: every consumer warp is
    /// done with it); the `bm/64` consumer warpgroups keep one group of products in
    /// flight and release a buffer as soon as the products that read it complete.
    /// With two consumers the producer gives its registers to them (`setmaxnreg`).
    /// Two more arguments: A's and B's tensor maps, by value.
    #[serde(default)]
    pub tma: bool,
    /// TMA only: a block per SM (at most) walks the tiles `blockIdx.x`,
    /// `+ gridDim.x`, …, its producer running on into the next tile's stages while the
    /// consumers store the last one through a shared-memory region of their own. One
    /// more argument (i32, before the tensor maps): the batch.
    #[serde(default)]
    pub persistent: bool,
    /// Persistent only, a 64-row tile (one warpgroup's): two consumer
    /// warpgroups take the block's tiles in turns (CUTLASS's ping-pong), each a
    /// whole tile of its own, so that one's epilogue overlaps the other's
    /// products. The producer fills the stages in tile order; a pair of
    /// mbarriers passes the turn (a consumer starts a tile's products once the
    /// other has waited for its last stage), which also keeps each consumer's
    /// waits on the stages' barriers within one round of their phases.
    #[serde(default)]
    pub pingpong: bool,
    /// mma.sync only: each stage's tiles loaded element by element (a 16-bit load an
    /// element, guarded against M, N and K, zeros past them) and stored to shared
    /// memory 16 bytes at a time, in place of `cp.async`'s 16-byte copies; so no
    /// alignment rule binds the operands (K not a multiple of 8, any leading
    /// dimension, an N-major B with any N). The tensor cores' cover for what the
    /// aligned kernels refuse; the model offers it only there.
    #[serde(default)]
    pub unaligned: bool,
    /// C, the bias and the residual are f32 (a model's activations, the plan's
    /// buffers) and the accumulators are stored unrounded; otherwise they are of
    /// the operands' 16-bit type. A TMA kernel then stores from its fragments,
    /// not through shared memory.
    #[serde(default)]
    pub c_f32: bool,
    /// A is f32 (a model's activation read in place, any row stride `lda`),
    /// rounded to the operands' 16-bit type as a stage is staged (a GEMV or
    /// SIMT kernel multiplies its f32 values as they are): no copy kernel
    /// writes a bf16 A first. A stage's A chunks are then loaded into
    /// registers and stored to shared memory by each thread, where `cp.async`
    /// copies 16-bit chunks; the aligned kernels' 16-byte loads need A's
    /// start, `lda` and batch stride multiples of 4 (the runner's checks).
    /// Not a TMA kernel's (its copies cannot convert).
    #[serde(default)]
    pub a_f32: bool,
    /// B is f32 (a model's activation read in place: attention's keys or
    /// values at a decode step, whose copy as bf16 would rewrite the whole
    /// cache every token): a GEMV kernel's (K-major) or a SIMT kernel's
    /// (either layout) only, which multiply its f32 values as they are; the
    /// GEMV's 16-byte loads need B's start, `ldb` and batch stride multiples
    /// of 4 (the runner's checks).
    #[serde(default)]
    pub b_f32: bool,
    /// A is a convolution's taps over a bf16 channels-last image (implicit
    /// GEMM): row `(b, y, x)` an output pixel, column `(i, j, c)` channel `c`
    /// of tap `(i, j)`, as [`crate::gpu::OperandCopy::Taps`] lays them out.
    /// Each 16-byte chunk of a stage's A (8 channels of one tap) is copied
    /// by `cp.async` from the image where the tap lies inside it and
    /// zero-filled where it lies in the padding, so no column matrix is
    /// written. The geometry is the taps' operand-copy descriptor
    /// ([`crate::gpu::OperandCopy::descriptor`]), a pointer argument after
    /// the others; the image's channels, strides and start are multiples of
    /// 8 (the runner's checks). An mma.sync or cp.async-fed wgmma kernel's,
    /// over 16-bit operands (not TMA, not element by element, not f32 A).
    #[serde(default)]
    pub a_taps: bool,
    /// C (f32, `c_f32`) is also stored rounded to the operands' 16-bit type
    /// into a second buffer laid out as C (`%C16`, a pointer argument after
    /// the others): a product whose output other products read as their A,
    /// while the rest of the model reads the f32 values (a residual sum that
    /// the next residual block's convolutions take). Not a TMA kernel's, nor
    /// an unfolded split-K kernel's (its C is the partial sums).
    #[serde(default)]
    pub c16_copy: bool,
    /// GEMV only, over an f32 A: A's rows are normalized as they are
    /// multiplied, `C = norm(A)·Bᵀ` where `norm(x) = (x - mean(x)) /
    /// sqrt(var(x) + ε)` over K (a layer norm, its affine step already in B
    /// and the bias: `passes::FoldAffineIntoMatMul`) or `x / sqrt(mean(x²) +
    /// ε)` (an RMS norm). The lanes add each row's values and squares, less
    /// its first value (so that a large mean does not cancel), beside its
    /// products, and B's column sums beside those; after the butterflies,
    /// `C = rstd·(Σ(x - x₀)·b - (mean - x₀)·Σb)`. So a decode step's norm
    /// needs no launch of its own: the product reads the norm's input. K ≥ 1.
    #[serde(default)]
    pub norm: Option<RowNorm>,
}

/// How a normalizing GEMV normalizes A's rows ([`GemmKernel::norm`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RowNorm {
    /// The mean is subtracted (a layer norm); else an RMS norm.
    pub centered: bool,
    /// ε, as its f32 bits.
    pub eps: u32,
}

impl RowNorm {
    /// The kernel name's part: `_ln` or `_rms`, then ε's bits in hex.
    pub fn tag(&self) -> String {
        format!("_{}{:08x}", if self.centered { "ln" } else { "rms" }, self.eps)
    }
}

/// The second launch of a split-K product: `C[m, n] = epilogue(Σ_s W[s, m, n])`,
/// one thread an element. Arguments: `W` (f32), `C`, `bias`, `residual` (pointers),
/// `M, N, ldc, splits` (i32), the workspace's split stride (i64).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ReduceKernel {
    pub elem: ElemType,
    pub epilogue: Epilogue,
    /// C, the bias and the residual are f32 (a model's step, as
    /// `GemmKernel::c_f32`); otherwise of the operands' 16-bit type.
    #[serde(default)]
    pub c_f32: bool,
}

impl ReduceKernel {
    pub const THREADS: usize = 256;

    pub fn name(&self) -> String {
        format!(
            "splitk_reduce_{}{}{}",
            self.elem.name(),
            if self.c_f32 { "_c32" } else { "" },
            epilogue_suffix(&self.epilogue)
        )
    }

    /// The type of C, the bias and the residual.
    pub fn c_type(&self) -> ElemType {
        if self.c_f32 {
            ElemType::F32
        } else {
            self.elem
        }
    }

    /// What the generator assumes of a reduction: a 16-bit family's shares.
    pub fn check(&self) -> Result<(), KernelError> {
        let bad = |why: String| KernelError::Invalid { name: self.name(), why };
        if !matches!(self.elem, ElemType::Bf16 | ElemType::F16) {
            return Err(bad(format!(
                "the reduction stores bf16 or f16 (the family's outputs), not {}",
                self.elem
            )));
        }
        Ok(())
    }
}

impl fmt::Display for ReduceKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// Why a kernel description cannot be built.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KernelError {
    #[error("kernel {name}: {why}")]
    Invalid { name: String, why: String },
}

/// The kernel's arguments, in order (the ABI the code generator and the runner share):
/// `A, B, C, bias, residual` (global pointers; bias and residual may be null when the
/// epilogue does not read them), `M, N, K, lda, ldb, ldc` (i32), then the batch strides
/// of A, B and C in elements (i64; the residual shares C's). Grid: `x` over N tiles,
/// `y` over M tiles (blocks rasterized in groups of [`RASTER_ROWS`] tile rows), `z` over the batch.
/// Dynamic shared memory: `smem_bytes()`. A split-K kernel takes one more argument,
/// `kper` (i32, K steps a split), `z` runs over the splits, and C is the f32 workspace
/// with the split stride in C's batch stride; a folding one ([`GemmKernel::fold`])
/// keeps C as the unsplit kernels' and takes the workspace and the tiles' counters
/// (pointers) after `kper`; a Stream-K one ([`GemmKernel::stream_k`]) the same, `kper`
/// its workspace's shares a tile and its grid `x` alone. A TMA kernel ([`GemmKernel::tma`])
/// takes two more, last: A's and B's tensor maps, by value (128 bytes each,
/// 64-byte aligned; `[batch, rows, K]` in boxes of a stage's tile); a persistent
/// one the batch (i32) before them, and its grid is `x` alone, at most one block
/// an SM, over the tiles.
pub const ABI: &str =
    "A, B, C, bias, residual: ptr; M, N, K, lda, ldb, ldc: i32; batch strides of A, B, C: i64";

impl GemmKernel {
    /// The symbol in the PTX and the cubin's file stem.
    pub fn name(&self) -> String {
        format!(
            "gemm_{}{}_{}_{}x{}_w{}x{}_s{}{}{}{}{}{}{}{}",
            match (self.arch, self.overlap, self.tma, self.persistent) {
                (Arch::Sm80, ..) if self.unaligned => "ua_",
                (Arch::Sm80, ..) => "",
                (Arch::Simt, ..) => "simt_",
                (Arch::Gemv, ..) => "gemv_",
                (Arch::Sm90a, _, true, true) if self.pingpong => "wgpp_",
                (Arch::Sm90a, _, true, true) => "wgp_",
                (Arch::Sm90a, _, true, false) => "wgt_",
                (Arch::Sm90a, false, false, _) => "wg_",
                (Arch::Sm90a, true, false, _) => "wgo_",
            },
            self.elem.name(),
            self.b.tag(),
            self.bm,
            self.bn,
            self.warps_m,
            self.warps_n,
            self.stages,
            match (self.split_k, self.fold) {
                (true, true) if self.stream_k => "_sks",
                (true, true) => "_skf",
                (true, false) => "_sk",
                _ => "",
            },
            if self.a_f32 {
                "_a32"
            } else if self.a_taps {
                "_taps"
            } else {
                ""
            },
            self.norm.map(|n| n.tag()).unwrap_or_default(),
            if self.b_f32 { "_b32" } else { "" },
            if self.c_f32 { "_c32" } else { "" },
            if self.c16_copy { "_c16" } else { "" },
            epilogue_suffix(&self.epilogue)
        )
    }

    /// The kernel's name run in `splits` shares of K: `xS` appended for more
    /// than one (how covers, choices and step lists print a split-K choice).
    pub fn name_split(&self, splits: usize) -> String {
        match splits {
            0 | 1 => self.name(),
            s => format!("{}x{s}", self.name()),
        }
    }

    /// The type of C, the bias and the residual (an unfolded split-K kernel's C is
    /// its f32 workspace whatever this says).
    pub fn c_type(&self) -> ElemType {
        if self.c_f32 {
            ElemType::F32
        } else {
            self.elem
        }
    }

    /// Warps that multiply: a ping-pong kernel's two consumers each run
    /// `warps_m × warps_n` over a tile of its own.
    pub fn warps(&self) -> usize {
        self.warps_m * self.warps_n * if self.pingpong { 2 } else { 1 }
    }

    /// Threads a block runs: its warps, and a TMA kernel's producer warpgroup.
    pub fn threads(&self) -> usize {
        32 * self.warps() + if self.tma { TMA_PRODUCER_THREADS } else { 0 }
    }

    /// Registers a thread of a TMA kernel's producer and consumer warpgroups keep
    /// after `setmaxnreg` (none: the kernel does not reallocate). With two consumers
    /// the block starts at 168 (384 threads share the SM's 64K); the producer, which
    /// only issues copies, drops to 40 and the consumers rise to 232, which a
    /// 64×256 accumulator tile (128 a thread) needs.
    pub fn register_split(&self) -> Option<(usize, usize)> {
        (self.tma && self.warpgroups() == 2).then_some((40, 232))
    }

    /// Bytes of a TMA kernel's mbarriers (full and empty, 8 bytes each a stage,
    /// and a ping-pong kernel's two turns), placed after the tiles; a
    /// Stream-K kernel's word after them (which of a tile's blocks folds it:
    /// its consumers read it while the producer fills the stages).
    pub fn barrier_bytes(&self) -> usize {
        match (self.tma, self.pingpong || self.stream_k) {
            (true, true) => 16 * self.stages + 16,
            (true, false) => 16 * self.stages,
            _ => 0,
        }
    }

    /// Consumer warpgroups that read each stage (and arrive on its `empty`
    /// barrier): all of them, or a ping-pong kernel's one whose tile it is.
    pub fn stage_readers(&self) -> usize {
        if self.pingpong {
            1
        } else {
            self.warpgroups()
        }
    }

    /// Row pitch (bytes) of a TMA kernel's epilogue tile in shared memory: `bn`
    /// 16-bit values and 16 bytes, so that a warp's fragment writes fall in 32 banks.
    pub fn epilogue_pitch(&self) -> usize {
        self.bn * 2 + 16
    }

    /// Where a persistent kernel's epilogue tiles start (after the barriers, 128-byte
    /// aligned) and their bytes (a 64-row tile per consumer); a non-persistent TMA
    /// kernel stages its epilogue in the idle stage buffers instead.
    pub fn epilogue_region(&self) -> (usize, usize) {
        let (a, b) = self.stage_bytes();
        let at = (self.stages * (a + b) + self.barrier_bytes()).div_ceil(128) * 128;
        let bytes = if self.persistent { self.warpgroups() * 64 * self.epilogue_pitch() } else { 0 };
        (at, bytes)
    }

    /// The warp tile's rows and columns.
    pub fn warp_tile(&self) -> (usize, usize) {
        (self.bm / self.warps_m, self.bn / self.warps_n)
    }

    /// K elements a pipeline stage holds.
    pub fn bk(&self) -> usize {
        match self.arch {
            Arch::Sm80 => BK,
            Arch::Sm90a => BK_WGMMA,
            Arch::Simt => SIMT_STEP,
            Arch::Gemv => GEMV_STEP * self.gemv_unroll(),
        }
    }

    /// A GEMV kernel's chunks a lane loads before its first product (a step of its
    /// loop): four for up to 4 rows, two for more (each chunk of every row is 4
    /// registers).
    pub fn gemv_unroll(&self) -> usize {
        if self.bm <= 4 {
            4
        } else {
            2
        }
    }

    /// A kernel that takes any operand (a SIMT kernel, or an mma.sync kernel that
    /// loads element by element): the family's cover for what the others refuse.
    pub fn is_cover(&self) -> bool {
        self.arch == Arch::Simt || self.unaligned
    }

    /// Warpgroups (4 warps each) of a wgmma kernel.
    pub fn warpgroups(&self) -> usize {
        self.warps() / 4
    }

    /// Bytes of one stage's A tile (`bm × bk`) and B tile (`bn × bk`); none for a
    /// SIMT kernel, which reads its operands from global memory.
    pub fn stage_bytes(&self) -> (usize, usize) {
        if matches!(self.arch, Arch::Simt | Arch::Gemv) {
            return (0, 0);
        }
        (self.bm * self.bk() * 2, self.bn * self.bk() * 2)
    }

    /// Dynamic shared memory a block asks for.
    pub fn smem_bytes(&self) -> usize {
        let (a, b) = self.stage_bytes();
        match self.epilogue_region() {
            (at, bytes) if bytes > 0 => at + bytes,
            _ => self.stages * (a + b) + self.barrier_bytes(),
        }
    }

    /// f32 accumulators a thread holds: 4 per m16n8 product of its warp tile.
    pub fn accumulators(&self) -> usize {
        match self.arch {
            Arch::Sm80 => {
                let (wm, wn) = self.warp_tile();
                (wm / 16) * (wn / 8) * 4
            }
            // m64nN: 64·N values over a warpgroup's 128 threads.
            Arch::Sm90a => self.bn / 2,
            Arch::Simt => (self.bm / SIMT_GRID) * (self.bn / SIMT_GRID),
            // A lane's 8 partial sums of each of its block's rows.
            Arch::Gemv => 8 * self.bm,
        }
    }

    /// A register estimate for the filter (ptxas reports the real count): the
    /// accumulators, one k16 step's A and B fragments, and about 40 for addresses,
    /// indices and the epilogue.
    pub fn register_estimate(&self) -> usize {
        match self.arch {
            Arch::Sm80 => {
                let (wm, wn) = self.warp_tile();
                self.accumulators() + (wm / 16) * 4 + (wn / 8) * 2 + 40
            }
            // No fragments in registers: the operands stay in shared memory.
            Arch::Sm90a => self.accumulators() + 60,
            // A step's values of A and B, and a pointer a row of A.
            Arch::Simt => self.accumulators() + 3 * (self.bm / SIMT_GRID) + self.bn / SIMT_GRID + 30,
            // The step's chunks of B and of each row of A (4 registers each), addresses.
            Arch::Gemv => self.accumulators() + 4 * self.gemv_unroll() * (self.bm + 1) + 30,
        }
    }

    /// 16-byte chunks a stage's A and B tiles hold; thread `t` copies chunks `t`,
    /// `t + threads`, … (the last round guarded where the count does not divide).
    pub fn chunks(&self) -> (usize, usize) {
        (self.bm * self.bk() / 8, self.bn * self.bk() / 8)
    }

    /// What the generator and the runner assume of a kernel; a description that
    /// fails it is never built.
    pub fn check(&self) -> Result<(), KernelError> {
        let bad = |why: String| Err(KernelError::Invalid { name: self.name(), why });
        if self.overlap && self.arch != Arch::Sm90a {
            return bad("only wgmma kernels keep a group of products in flight".into());
        }
        if self.tma && (self.arch != Arch::Sm90a || self.overlap) {
            return bad("TMA kernels are wgmma kernels with their own pipeline (not `overlap`)".into());
        }
        if self.b_f32 && !(self.arch == Arch::Simt || (self.arch == Arch::Gemv && self.b == BLayout::KMajor))
        {
            return bad("an f32 B is read by SIMT kernels and K-major GEMV kernels".into());
        }
        if self.unaligned && (self.arch != Arch::Sm80 || self.split_k) {
            return bad("element-by-element loads are an mma.sync kernel's, without split-K".into());
        }
        if self.a_taps
            && (self.tma || self.unaligned || self.a_f32 || !matches!(self.arch, Arch::Sm80 | Arch::Sm90a))
        {
            return bad("taps are read by the mma.sync and cp.async-fed wgmma kernels' 16-byte copies".into());
        }
        if self.c16_copy && (!self.c_f32 || self.tma || (self.split_k && !self.fold)) {
            return bad(
                "a 16-bit copy of C is stored beside an f32 C, not by a TMA kernel or unfolded split-K"
                    .into(),
            );
        }
        if self.norm.is_some() && (self.arch != Arch::Gemv || !self.a_f32 || self.bm > 4) {
            // Three sums a row: eight rows would spill.
            return bad("rows are normalized by a GEMV kernel of at most 4 rows over an f32 A".into());
        }
        if self.a_f32 && self.tma {
            return bad("a TMA kernel's copies move 16-bit tiles: its A cannot be f32".into());
        }
        if self.persistent && self.c_f32 {
            return bad("a persistent kernel stages 16-bit tiles of C, not f32".into());
        }
        if self.persistent && (!self.tma || (self.split_k && !self.stream_k)) {
            return bad("persistent kernels are TMA kernels over whole products (or Stream-K)".into());
        }
        if self.pingpong && (!self.persistent || self.bm != 64) {
            return bad("ping-pong consumers are a persistent kernel's, each over a 64-row tile".into());
        }
        if !matches!(self.elem, ElemType::Bf16 | ElemType::F16) {
            return bad(format!(
                "GPU kernels multiply bf16 or f16 operands (f32 accumulation), not {}",
                self.elem
            ));
        }
        if !matches!(self.b, BLayout::KMajor | BLayout::NMajor) {
            return bad(format!("GPU kernels read a contiguous B (nt or nn), not {:?}", self.b));
        }
        if self.fold && (!self.split_k || (self.tma && !self.stream_k)) {
            return bad(
                "a kernel that folds its shares is a split-K kernel, not a TMA one (but Stream-K)".into()
            );
        }
        if self.stream_k && (!self.fold || self.a_taps || (self.tma && (!self.persistent || self.pingpong))) {
            return bad(
                "Stream-K kernels are folding split-K kernels over a row-major A (TMA: persistent, not ping-pong)"
                    .into(),
            );
        }
        if self.split_k && !self.fold && (self.epilogue != Epilogue::NONE || self.c_f32) {
            return bad(
                "a split-K kernel writes f32 partial sums: its epilogue and C's type are the reduction's"
                    .into(),
            );
        }
        if self.arch == Arch::Simt {
            return self.check_simt();
        }
        if self.arch == Arch::Gemv {
            return self.check_gemv();
        }
        if self.arch == Arch::Sm90a {
            if self.b != BLayout::KMajor && self.pingpong {
                return bad("ping-pong kernels read B K-major".into());
            }
            if !matches!(self.bm, 64 | 128) || !matches!(self.bn, 64 | 128 | 256) {
                return bad(format!("wgmma tile {}x{}: bm 64 or 128, bn 64, 128 or 256", self.bm, self.bn));
            }
            if self.warps_m != self.bm / 16 || self.warps_n != 1 {
                // (A ping-pong kernel's consumers: 4x1 warps each.)
                return bad(format!("wgmma tile {}x{} takes {}x1 warps", self.bm, self.bn, self.bm / 16));
            }
        } else {
            self.check_mma_tiles()?;
        }
        if !(2..=6).contains(&self.stages) || ((self.overlap || self.tma) && self.stages < 3) {
            return bad(format!("{} stages: 2 to 6 (3 or more with a group in flight)", self.stages));
        }
        let max_smem = match self.arch {
            Arch::Sm80 | Arch::Simt | Arch::Gemv => MAX_SMEM_PER_BLOCK,
            Arch::Sm90a => MAX_SMEM_PER_BLOCK_SM90,
        };
        if self.smem_bytes() > max_smem {
            return bad(format!("{} bytes of shared memory (at most {max_smem})", self.smem_bytes()));
        }
        if self.register_estimate() > 255 {
            return bad(format!("about {} registers a thread (at most 255)", self.register_estimate()));
        }
        Ok(())
    }

    /// A SIMT kernel's rules: none of the pipeline's options, one "stage", a 16 × 16
    /// grid of threads (8 warps) over a tile of whole thread tiles up to 8 × 8.
    fn check_simt(&self) -> Result<(), KernelError> {
        let bad = |why: String| Err(KernelError::Invalid { name: self.name(), why });
        if self.overlap || self.tma || self.persistent || self.split_k {
            return bad("a SIMT kernel has no pipeline options and no split-K".into());
        }
        if self.stages != 1 || (self.warps_m, self.warps_n) != (SIMT_GRID * SIMT_GRID / 32, 1) {
            return bad("a SIMT kernel runs 8x1 warps and one stage".into());
        }
        let thread_tile = |x: usize| x.is_multiple_of(SIMT_GRID) && (1..=8).contains(&(x / SIMT_GRID));
        if !thread_tile(self.bm) || !thread_tile(self.bn) {
            return bad(format!("SIMT tile {}x{}: multiples of 16, at most 128", self.bm, self.bn));
        }
        Ok(())
    }

    /// A GEMV kernel's rules: a K-major B, none of the pipeline's options, one
    /// "stage", a warp a column (`bn` = `warps_n`, 1-8) and 1-16 rows a block.
    fn check_gemv(&self) -> Result<(), KernelError> {
        let bad = |why: String| Err(KernelError::Invalid { name: self.name(), why });
        if self.overlap || self.tma || self.persistent || self.split_k || self.b != BLayout::KMajor {
            return bad("a GEMV kernel reads a K-major B and has no pipeline options and no split-K".into());
        }
        if self.stages != 1
            || self.warps_m != 1
            || !(1..=8).contains(&self.warps_n)
            || self.bn != self.warps_n
        {
            return bad("a GEMV kernel runs one stage and 1-8 warps, a column each".into());
        }
        if !(1..=16).contains(&self.bm) {
            return bad(format!("a GEMV kernel takes 1-16 rows a block, not {}", self.bm));
        }
        Ok(())
    }

    /// The mma.sync family's tile rules: whole m16 × (2 × n8) warp tiles, 1-8 warps,
    /// and an N-major B's rows at least one 128-byte swizzle wide.
    fn check_mma_tiles(&self) -> Result<(), KernelError> {
        let bad = |why: String| Err(KernelError::Invalid { name: self.name(), why });
        if self.warps_m == 0
            || self.warps_n == 0
            || !self.bm.is_multiple_of(self.warps_m)
            || !self.bn.is_multiple_of(self.warps_n)
        {
            return bad(format!(
                "{}x{} does not split over {}x{} warps",
                self.bm, self.bn, self.warps_m, self.warps_n
            ));
        }
        let (wm, wn) = self.warp_tile();
        if wm % 16 != 0 || wn % 16 != 0 {
            return bad(format!("warp tile {wm}x{wn}: rows and columns must be multiples of 16"));
        }
        if !(1..=8).contains(&self.warps()) {
            return bad(format!("{} warps: 1 to 8 a block", self.warps()));
        }
        // An N-major B tile's rows are `bn` wide; the XOR swizzle of its 16-byte chunks
        // spans 8 chunks (128 bytes), so rows must hold at least that.
        if self.b == BLayout::NMajor && !self.bn.is_multiple_of(64) {
            return bad(format!("an N-major B needs bn a multiple of 64, not {}", self.bn));
        }
        Ok(())
    }

    /// The shape rules every launch must meet: the problem's layouts are the
    /// kernel's (A row-major, B as built), and for the 16-byte `cp.async` copies
    /// K, lda and ldb multiples of 8, and N a multiple of 8 for an N-major B.
    pub fn accepts(&self, p: &Problem) -> Result<(), String> {
        if p.m == 0 || p.n == 0 || p.k == 0 || p.batch == 0 {
            return Err(format!("empty product {p}"));
        }
        match (p.a, self.a_taps) {
            (ALayout::RowMajor, false) | (ALayout::Taps { .. }, true) => {}
            (a, false) => return Err(format!("{p}: this kernel reads A row-major, not {a:?}")),
            (a, true) => return Err(format!("{p}: this kernel reads a convolution's taps, not {a:?}")),
        }
        if p.b != self.b {
            return Err(format!("{p}: B is {}, this kernel reads it {}", p.b.tag(), self.b.tag()));
        }
        if self.is_cover() {
            return self.fits_grid(p);
        }
        if !p.k.is_multiple_of(8) {
            return Err(format!("K = {} is not a multiple of 8 (16-byte copies)", p.k));
        }
        if self.b == BLayout::NMajor && !p.n.is_multiple_of(8) {
            return Err(format!("N = {} is not a multiple of 8 (16-byte copies of an N-major B)", p.n));
        }
        self.fits_grid(p)?;
        if self.split_k && p.batch != 1 {
            return Err(format!("a split-K kernel takes one product, not a batch of {}", p.batch));
        }
        Ok(())
    }

    /// The launch's grid: tile rows in `y` and the batch in `z` (at most 65535 each),
    /// 32-bit extents.
    fn fits_grid(&self, p: &Problem) -> Result<(), String> {
        if p.m > (u16::MAX as usize) * self.bm
            || p.n > (i32::MAX as usize)
            || p.k > (i32::MAX as usize)
            || p.batch > u16::MAX as usize
        {
            return Err(format!("{p} exceeds the grid"));
        }
        Ok(())
    }

    /// K's steps a split takes and the splits that then have work, for `splits` asked
    /// over `k`: every split gets `per` steps but the last, which gets the rest (≥ 1).
    pub fn split_plan(&self, k: usize, splits: usize) -> (usize, usize) {
        let steps = k.div_ceil(self.bk()).max(1);
        let per = steps.div_ceil(splits.clamp(1, steps));
        (per, steps.div_ceil(per))
    }

    /// Thread blocks a launch runs (per split for a split-K kernel).
    pub fn blocks(&self, p: &Problem) -> usize {
        p.m.div_ceil(self.bm) * p.n.div_ceil(self.bn) * p.batch
    }

    /// Bytes of A and B that `tiles` consecutive tiles of `p` read, in the raster
    /// order of [`RASTER_ROWS`] (the first batch entry's, from its first tile): the
    /// row panels of A and the column panels of B they span, each over all of K. A
    /// wave's operands: what its blocks share through L2.
    pub fn raster_bytes(&self, p: &Problem, tiles: usize) -> f64 {
        let (rows, cols) = (p.m.div_ceil(self.bm), p.n.div_ceil(self.bn));
        let tiles = tiles.clamp(1, rows * cols);
        let group = RASTER_ROWS.min(rows);
        let (rows, cols) = if tiles < group * cols {
            (group.min(tiles), tiles.div_ceil(group))
        } else {
            ((tiles.div_ceil(group * cols) * group).min(rows), cols)
        };
        let (m, n) = ((rows * self.bm).min(p.m), (cols * self.bn).min(p.n));
        ((m + n) * p.k * self.elem.bytes()) as f64
    }

    /// Shares a folding split-K kernel's last block of a tile loads at once
    /// (each share's fragments: [`GemmKernel::accumulators`] floats a thread):
    /// as many as keep 128 more floats a thread live (the accumulators are
    /// stored by then), at most 8 (as the reduction kernel's chunk), at least
    /// one.
    pub fn fold_chunk(&self) -> usize {
        (128 / self.accumulators().max(1)).clamp(1, 8)
    }

    /// A Stream-K kernel's shares a tile in `blocks` blocks: a tile's `s` K
    /// steps meet at most `1 + ⌈(s−1)/q⌉` blocks' shares when every share has
    /// `q = ⌊I/G⌋` steps or more (`I` steps in all). Zero where the launch
    /// cannot run: no steps, or more blocks than steps.
    pub fn stream_slots(&self, p: &Problem, blocks: usize) -> usize {
        let steps = p.k.div_ceil(self.bk()).max(1);
        let iters = self.stream_steps(p);
        if blocks == 0 || blocks > iters {
            return 0;
        }
        (1 + (steps - 1).div_ceil(iters / blocks)).min(blocks)
    }

    /// The K steps of all of `p`'s tiles: the most blocks a Stream-K launch
    /// on `p` may run.
    pub fn stream_steps(&self, p: &Problem) -> usize {
        self.blocks(p) * p.k.div_ceil(self.bk()).max(1)
    }

    /// The same tile unsplit: a split-K or Stream-K kernel's own tile.
    pub fn unsplit(&self) -> GemmKernel {
        GemmKernel { split_k: false, fold: false, stream_k: false, ..*self }
    }

    /// A folding split-K kernel's workspace on `p` in `splits` shares (f32
    /// elements: every tile's shares, whole tiles) and its counters (one a
    /// tile).
    pub fn fold_space(&self, p: &Problem, splits: usize) -> (usize, usize) {
        let tiles = self.blocks(p);
        (tiles * splits * self.bm * self.bn, tiles)
    }
}

/// A TMA kernel's producer: one warpgroup (`setmaxnreg` works on whole warpgroups),
/// one thread of which issues the copies.
pub const TMA_PRODUCER_THREADS: usize = 128;

/// Shared memory one block may ask for on sm_80 and sm_90 (227 KB on Hopper, 163 KB on
/// A100; the family stays under the smaller).
pub const MAX_SMEM_PER_BLOCK: usize = 163 * 1024;

/// Shared memory one block may ask for on Hopper (227 KB), for the sm_90a kernels.
pub const MAX_SMEM_PER_BLOCK_SM90: usize = 227 * 1024;

impl fmt::Display for GemmKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}
