//! NVPTX code generation of the GPU GEMM family (`gpu::GemmKernel`): LLVM IR for one
//! kernel, compiled to PTX by the NVPTX target of the same LLVM 19 that builds the
//! CPU kernels.
//!
//! The `mma.sync` kernel (sm_80, runs on sm_90): a block computes a `bm × bn` tile
//! of C. K goes through `stages` shared-memory buffers, 32 elements a step, filled
//! by 16-byte `cp.async` copies; a copy outside the operand (rows past M or N,
//! columns past K) reads 0 bytes and zero-fills (DietCode's local padding: nothing
//! is padded in memory). Rows of 16-byte chunks are XOR-swizzled so that each
//! `ldmatrix` reads 8 rows from 8 distinct bank groups. Each warp loads its A and B
//! fragments with `ldmatrix` (`.trans` for an N-major B) and issues m16n8k16
//! products into f32 accumulators. The epilogue (`plan::Epilogue`, the CPU's:
//! `act(scale·acc + bias + residual)`, `act` a named activation or any
//! element-wise program, `plan::Pointwise`) runs on the accumulators in
//! registers; stores are predicated per element, two at a time where the row
//! stride allows.
//!
//! The `wgmma` kernel (sm_90a): the same copies, 64 elements of K a step, into
//! 128-byte-swizzled tiles that `wgmma.mma_async` reads through shared-memory
//! descriptors; each warpgroup issues four `m64n{bn}k16` products a step in one asm
//! statement, and with `overlap` leaves one group in flight while the next step's
//! copies and products are issued. The warp-specialized TMA kernel (sm_90a) splits
//! the block: a producer warpgroup, one thread of which streams each stage's tiles
//! with `cp.async.bulk.tensor` (the tensor maps, kernel parameters, zero-fill past
//! the operands) and mbarriers that count the bytes landed and the consumers done;
//! one or two consumer warpgroups that wait on those barriers, keep a group of
//! products in flight, and store C through shared memory in 16-byte chunks; with
//! two consumers `setmaxnreg` moves the producer's registers to them. A persistent
//! kernel's two consumers may instead take its tiles in turns (ping-pong: each a
//! 64-row tile of its own, one storing while the other multiplies). Split-K
//! kernels (any family) run a share of K's steps per `z` block and store f32
//! partial sums; a reduction kernel sums the shares and applies the epilogue.
//! Blocks are rasterized in groups of tile rows for L2 reuse.
//!
//! A kernel with an f32 A (`a_f32`: a model's activation, read in place where a
//! copy kernel would first write it as bf16) loads each of its A chunks as two
//! 16-byte loads before the current step's products and rounds (`cvt.rn`) and
//! stores them to shared memory after them, into the buffer the step's barrier
//! has seen every warp finish: the loads' latency overlaps the products, as
//! `cp.async`'s does; the element-by-element cover loads and rounds each value;
//! GEMV and SIMT kernels multiply the f32 values as they are.
//!
//! A taps kernel (`a_taps`: implicit GEMM, the mma.sync and cp.async-fed wgmma
//! kernels) reads a convolution's taps from a bf16 channels-last image: each
//! A chunk's row is an output pixel, found once (its image and its first image
//! row and column, from the descriptor's geometry); per step the chunk's column
//! names a tap and 8 of its channels, and `cp.async` copies them from the image,
//! zero-filling where the tap lies in the padding, as past M or K. So the
//! column matrix is never written.

mod attention;
mod operand;

pub use crate::loops::device::{logits_unsupported, program_ir, program_ptx};
use crate::{llvm, CodegenError};
pub use attention::{attention_head_ok, attention_ir, attention_ptx};
use gpu::kernel::SIMT_GRID;
use gpu::kernel::{RASTER_ROWS, TMA_PRODUCER_THREADS};
use gpu::wave::REDUCE_CHUNK;
use gpu::{Activation, Arch, BLayout, ElemType, Epilogue, GemmKernel, ReduceKernel};
use inkwell::context::Context;
use inkwell::memory_buffer::MemoryBuffer;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{CodeModel, FileType, InitializationConfig, RelocMode, Target, TargetTriple};
use inkwell::OptimizationLevel;
pub use operand::operand_copy_ir;
use plan::{Pointwise, PwBinary, PwCmp, PwOp, PwUnary, ERF_A, ERF_P, ERF_SERIES, TANH_SERIES};
use std::fmt::Write;

const TRIPLE: &str = "nvptx64-nvidia-cuda";

/// PTX for `k`: `.target sm_80` for the mma.sync family (ptxas assembles it for
/// sm_80 or sm_90a), `sm_90a` for wgmma.
pub fn ptx(k: &GemmKernel) -> Result<String, CodegenError> {
    let ir = llvm_ir(k)?;
    compile(&ir, &k.name(), k.arch)
}

/// The LLVM IR module of `k`, as text (what `--dump-llvm` writes).
pub fn llvm_ir(k: &GemmKernel) -> Result<String, CodegenError> {
    k.check().map_err(|e| CodegenError::Unsupported(e.to_string()))?;
    match k.arch {
        Arch::Simt => Ok(simt_ir(k)),
        Arch::Gemv => Ok(gemv_ir(k)),
        Arch::Sm80 | Arch::Sm90a => Ok(Gen::new(*k).generate()),
    }
}

/// Compiles an NVPTX module's IR text to PTX, at O3, for `arch` (`.target sm_80`
/// or `sm_90a`).
pub fn compile(ir: &str, name: &str, arch: Arch) -> Result<String, CodegenError> {
    compile_module(ir, name, arch, false)
}

/// Compiles kernel `name`'s module (IR text, any of the family's or the
/// loop programs') to PTX for sm_90a, launched as a programmatic dependent
/// (`plan::gpu::KernelLaunch::Dependent`): its first instructions wait for
/// the grid before it on the stream (`griddepcontrol.wait`: complete, its
/// memory visible) and then let the grid after it launch
/// (`griddepcontrol.launch_dependents`, which takes effect once every block
/// has issued it: all of this grid's blocks are then running). Every kernel
/// of a call waits before touching memory, so the call computes what an
/// ordered stream does; the next kernel's launch overlaps this one's run.
pub fn dependent_ptx(ir: &str, name: &str) -> Result<String, CodegenError> {
    compile_module(ir, name, Arch::Sm90a, true)
}

/// The instructions a dependent launch's kernel starts with (see [`dependent_ptx`]).
pub const DEPENDENT_PROLOGUE: &str = "griddepcontrol.wait; griddepcontrol.launch_dependents;";

fn compile_module(ir: &str, name: &str, arch: Arch, dependent: bool) -> Result<String, CodegenError> {
    Target::initialize_nvptx(&InitializationConfig::default());
    let triple = TargetTriple::create(TRIPLE);
    let target = Target::from_triple(&triple).map_err(llvm)?;
    let tm = target
        .create_target_machine(
            &triple,
            arch.sm(),
            "+ptx80",
            OptimizationLevel::Aggressive,
            RelocMode::Default,
            CodeModel::Default,
        )
        .ok_or_else(|| CodegenError::Llvm(format!("no NVPTX target machine for {}", arch.sm())))?;
    let ctx = Context::create();
    let buf = MemoryBuffer::create_from_memory_range_copy(ir.as_bytes(), name);
    let module = ctx.create_module_from_ir(buf).map_err(|e| CodegenError::Llvm(format!("{name}: {e}")))?;
    module.verify().map_err(|e| CodegenError::Llvm(format!("{name}: {e}")))?;
    if dependent {
        let f = module
            .get_function(name)
            .ok_or_else(|| CodegenError::Llvm(format!("{name}: no kernel of that name in its module")))?;
        let first = f
            .get_first_basic_block()
            .and_then(|b| b.get_first_instruction())
            .ok_or_else(|| CodegenError::Llvm(format!("{name}: an empty kernel")))?;
        let builder = ctx.create_builder();
        builder.position_before(&first);
        let ty = ctx.void_type().fn_type(&[], false);
        let asm = ctx.create_inline_asm(
            ty,
            DEPENDENT_PROLOGUE.into(),
            "~{memory}".into(),
            true,
            false,
            None,
            false,
        );
        builder.build_indirect_call(ty, asm, &[], "").map_err(llvm)?;
    }
    module.run_passes("default<O3>", &tm, PassBuilderOptions::create()).map_err(llvm)?;
    let out = tm.write_to_memory_buffer(&module, FileType::Assembly).map_err(llvm)?;
    String::from_utf8(out.as_slice().to_vec()).map_err(llvm)
}

/// A wgmma shared-memory descriptor's fixed fields for a K-major operand in
/// 128-byte swizzle atoms: leading byte offset 1 (unused by swizzled K-major
/// layouts), stride byte offset 1024 >> 4 (8 rows of 128 bytes to the next 8), swizzle
/// mode 1 (128 bytes) in bits 62-63; the start address >> 4 fills bits 0-13.
const DESC_SW128_KMAJOR: u64 = (1 << 16) | (64 << 32) | (1 << 62);

/// The same for an N-major B (`imm-trans-b`): the tile's 64-column blocks of
/// 64 K rows, each row 128 bytes of N (the 128-byte swizzle's atom, K rows
/// its rows), 8192 bytes apart (the leading byte offset, between blocks
/// along N), 8-row groups along K 1024 bytes apart (the stride byte offset).
const DESC_SW128_NMAJOR: u64 = (512 << 16) | (64 << 32) | (1 << 62);

/// What every thread knows of its block (see `Gen::indices`).
#[derive(Clone)]
struct Ix {
    tid: String,
    warp: String,
    lane: String,
    m0: String,
    n0: String,
    a_base: String,
    b_base: String,
    c_base: String,
    /// Where a kernel storing a 16-bit copy of C (`GemmKernel::c16_copy`)
    /// stores it: C's batch entry in `%C16`.
    c16_base: Option<String>,
    r_base: Option<String>,
    /// The block's K steps (a split-K block's share), from step `k_first`.
    kt_n: String,
    k_first: String,
    /// The batch entry (TMA's third coordinate; 0 for a split-K block).
    batch: String,
    /// Where a folding split-K block's share of its tile goes.
    fold: Option<FoldAt>,
}

/// A folding block's share of a tile (`GemmKernel::fold`): the tile (its
/// counter), the share's index, and the tile's shares and the workspace's
/// shares a tile (i32; a split-K block's both `⌈steps/kper⌉`, from its
/// product's K steps, counted once the main loop is done so as not to keep
/// them live through it); for a Stream-K block, whether it holds the whole
/// tile (i1), which it then stores as an unsplit kernel does.
#[derive(Clone)]
struct FoldAt {
    tile: String,
    share: String,
    shares: Shares,
    whole: Option<String>,
}

/// A Stream-K block's steps (`Gen::stream_range`): a tile's K steps (i32
/// and i64), the steps of all the tiles, the block and the blocks (i64),
/// and the block's first step and the step past its last.
#[derive(Clone)]
struct StreamRange {
    steps: String,
    steps64: String,
    iters: String,
    b64: String,
    g64: String,
    start: String,
    end: String,
}

/// A unit of a Stream-K block (`Gen::stream_unit`): its tile, the tile's
/// first step of all (i64), the unit's first step in the tile and its steps.
#[derive(Clone)]
struct StreamUnit {
    tile: String,
    base: String,
    kb: String,
    span: String,
    range: StreamRange,
}

#[derive(Clone)]
enum Shares {
    /// A split-K tile's: its splits, of the K steps given.
    Split { steps: String },
    /// A Stream-K tile's: its shares and the workspace's a tile.
    Stream { shares: String, slots: String },
}

/// One thread's 16-byte copy of a stage: the global pointer at K step 0, the
/// advance a step (elements), the row or column inside the operand, the K index at
/// step 0 (checked `< K` with the step added), the offset inside the stage's tile,
/// and, in a last partial round, whether the chunk exists (a copy past the tile would
/// zero-fill another tile's bytes, so it is skipped, not emptied).
struct Copy {
    g: String,
    step: String,
    ok: String,
    k0: String,
    soff: String,
    guard: Option<String>,
    /// An N-major B's chunk: its first column (an unaligned kernel guards each
    /// element by N there; a K-major chunk's elements are guarded by K).
    n_first: Option<String>,
    /// A taps kernel's chunk of A (`GemmKernel::a_taps`): its output pixel's
    /// first image row and column (`y·sh − ph`, `x·sw − pw`); `g` is then the
    /// pixel's origin in the image and `step` unused (see `Gen::chunk_at`).
    taps: Option<(String, String)>,
}

/// A taps kernel's geometry (`GemmKernel::a_taps`), loaded from its
/// descriptor once: the output's width and pixels an image, the image's
/// height, width and channels, the kernel's width, the strides, dilations
/// and padding (i32), and the image's strides between images, rows and
/// pixels (i64, elements).
struct TapsGeometry {
    ow: String,
    ohw: String,
    h: String,
    w: String,
    c: String,
    kw: String,
    sh: String,
    sw: String,
    dh: String,
    dw: String,
    ph: String,
    pw: String,
    s_img: String,
    s_row: String,
    s_pix: String,
    /// Division by the channels and by the kernel's width as a multiplication
    /// ([`Gen::divisor`]): every chunk divides its column by both each step.
    by_c: (String, String),
    by_kw: (String, String),
}

/// An f32 A's chunk in registers across a step's products: its two 16-byte
/// loads, whether it holds the operand's values (else zeros are stored), and
/// its byte offset in shared memory. Every thread has one (a partial round's
/// extra threads repeat a chunk: see `Gen::copies`).
struct Staged {
    lo: String,
    hi: String,
    ok: String,
    off: String,
}

/// Where two adjacent values of a fragment land in C (see `Gen::spot`).
struct Spot {
    col: String,
    col1: String,
    ok0: String,
    ok1: String,
    in0: String,
    in1: String,
    idx: String,
}

/// Where lane `4g + q` holds an m16n8 fragment's values: its row `g` (and `g + 8`)
/// and column `2q` (and `2q + 1`) inside the fragment, and the tile's C origin
/// plus them (`r1 = m0 + g`, `c1 = n0 + 2q`).
struct LaneOrigin {
    g: String,
    q2: String,
    r1: String,
    c1: String,
}

/// An m16n8 accumulator fragment: its row and column inside the block tile (the
/// lane's own offsets are added by the epilogue) and its four values.
struct Frag {
    row: String,
    col: String,
    vals: [String; 4],
}

/// PTX of the operand copy kernel (`plan::gpu::OperandCopy`), `.target sm_80`.
pub fn operand_copy_ptx() -> Result<String, CodegenError> {
    compile(&operand_copy_ir(), plan::gpu::OPERAND_COPY_KERNEL, Arch::Sm80)
}

/// PTX of a split-K reduction (`gpu::ReduceKernel`), `.target sm_80`.
pub fn reduce_ptx(r: &ReduceKernel) -> Result<String, CodegenError> {
    compile(&reduce_ir(r)?, &r.name(), Arch::Sm80)
}

/// The LLVM IR of a split-K reduction: thread `i` of the grid sums element `i` of
/// the `splits` partial products (`W[s·sw + i]`, `[M, N]` each), applies the
/// epilogue and stores `C[m·ldc + n]`. The shares are read [`REDUCE_CHUNK`] (8) at a
/// time, every load of a chunk issued before the first add: a load a share, each
/// waiting for the last, paid one memory latency a split (a loop LLVM unrolls by 8
/// runs its remainder that way, and on an H100 6 or 12 splits took about a
/// microsecond longer than 8). Past `splits` a chunk reloads the last share (in
/// bounds, already cached) and adds zero in its place.
pub fn reduce_ir(r: &ReduceKernel) -> Result<String, CodegenError> {
    r.check().map_err(|e| CodegenError::Unsupported(e.to_string()))?;
    let mut g = Ir::default();
    let threads = ReduceKernel::THREADS;
    let tid = g.v("call i32 @llvm.nvvm.read.ptx.sreg.tid.x()");
    let bx = g.v("call i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()");
    let bx64 = g.v(format!("zext i32 {bx} to i64"));
    let tid64 = g.v(format!("zext i32 {tid} to i64"));
    let base = g.v(format!("mul i64 {bx64}, {threads}"));
    let i = g.v(format!("add i64 {base}, {tid64}"));
    let m64 = g.v("sext i32 %M to i64");
    let n64 = g.v("sext i32 %N to i64");
    let total = g.v(format!("mul i64 {m64}, {n64}"));
    let inside = g.v(format!("icmp slt i64 {i}, {total}"));
    g.emit(format!("br i1 {inside}, label %sum, label %done"));
    g.block("sum");
    let p = g.v(format!("getelementptr inbounds float, ptr addrspace(1) %W, i64 {i}"));
    // The last share, clamped to 0 so that no split count reads before W.
    let some = g.v("icmp sgt i32 %splits, 0");
    let less = g.v("add i32 %splits, -1");
    let last = g.v(format!("select i1 {some}, i32 {less}, i32 0"));
    g.emit("br label %chunk");
    g.block("chunk");
    let head = g.body.len();
    let mut shares = Vec::new();
    for j in 0..REDUCE_CHUNK {
        let s = g.v(format!("add i32 %s0, {j}"));
        let live = g.v(format!("icmp slt i32 {s}, %splits"));
        let at_s = g.v(format!("select i1 {live}, i32 {s}, i32 {last}"));
        let s64 = g.v(format!("zext i32 {at_s} to i64"));
        let off = g.v(format!("mul i64 {s64}, %sw"));
        let at = g.v(format!("getelementptr inbounds float, ptr addrspace(1) {p}, i64 {off}"));
        let x = g.v(format!("load float, ptr addrspace(1) {at}, align 4"));
        shares.push((live, x));
    }
    let mut acc = "%acc".to_string();
    for (live, x) in shares {
        let x = g.v(format!("select i1 {live}, float {x}, float 0.0"));
        acc = g.v(format!("fadd float {acc}, {x}"));
    }
    let next = g.v(format!("add i32 %s0, {REDUCE_CHUNK}"));
    let more = g.v(format!("icmp slt i32 {next}, %splits"));
    g.emit(format!("br i1 {more}, label %chunk, label %store"));
    g.body.insert_str(
        head,
        &format!(
            "  %s0 = phi i32 [ 0, %sum ], [ {next}, %chunk ]\n  %acc = phi float [ 0.0, %sum ], [ {acc}, %chunk ]\n"
        ),
    );
    g.block("store");
    let m = g.v(format!("sdiv i64 {i}, {n64}"));
    let n = g.v(format!("srem i64 {i}, {n64}"));
    let n32 = g.v(format!("trunc i64 {n} to i32"));
    let ldc64 = g.v("sext i32 %ldc to i64");
    let row = g.v(format!("mul i64 {m}, {ldc64}"));
    let ci = g.v(format!("add i64 {row}, {n}"));
    g.store_c(r.c_type(), r.epilogue, &acc, &n32, &ci);
    g.emit("br label %done");
    g.block("done");
    g.emit("ret void");

    Ok(g.module(
        &r.name(),
        threads,
        "one element each",
        false,
        "ptr addrspace(1) readonly %W, ptr addrspace(1) %C, ptr addrspace(1) readonly %bias, \
         ptr addrspace(1) readonly %res, i32 %M, i32 %N, i32 %ldc, i32 %splits, i64 %sw",
        &[],
    ))
}

/// The LLVM IR of a SIMT kernel (`Arch::Simt`, ABI `gpu::kernel::ABI`): block
/// `(x, y, z)` computes C's tile at columns `x·bn`, rows `y·bm` of batch entry `z`;
/// thread `(tx, ty)` of its 16 × 16 grid the values at rows `ty + 16i` and columns
/// `tx + 16j`, one K element a step: each of its rows of A and columns of B loaded
/// as a 16-bit element and widened, multiplied and added in f32 (LLVM fuses the
/// pair). A row or column past M or N reads the last one (in bounds) and is not
/// stored, so the loop has no branch but its own; nothing is aligned, so any K and
/// leading dimension work.
fn simt_ir(k: &GemmKernel) -> String {
    let mut g = Ir::default();
    let grid = SIMT_GRID;
    let (tm, tn) = (k.bm / grid, k.bn / grid);
    let tid = g.v("call i32 @llvm.nvvm.read.ptx.sreg.tid.x()");
    let bx = g.v("call i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()");
    let by = g.v("call i32 @llvm.nvvm.read.ptx.sreg.ctaid.y()");
    let bz = g.v("call i32 @llvm.nvvm.read.ptx.sreg.ctaid.z()");
    let tx = g.v(format!("urem i32 {tid}, {grid}"));
    let ty = g.v(format!("udiv i32 {tid}, {grid}"));
    let row0 = g.v(format!("mul i32 {by}, {}", k.bm));
    let row0 = g.v(format!("add i32 {row0}, {ty}"));
    let col0 = g.v(format!("mul i32 {bx}, {}", k.bn));
    let col0 = g.v(format!("add i32 {col0}, {tx}"));
    let (a_base, b_base, oc) = g.batch_entry(k, &bz);
    let last_m = g.v("add i32 %M, -1");
    let last_n = g.v("add i32 %N, -1");
    let lda = g.v("sext i32 %lda to i64");
    let ldb = g.v("sext i32 %ldb to i64");
    // The rows and columns this thread computes, and the ones it reads (clamped).
    let mut rows = Vec::new();
    for i in 0..tm {
        let r = g.v(format!("add i32 {row0}, {}", grid * i));
        let inside = g.v(format!("icmp slt i32 {r}, %M"));
        let read = g.v(format!("select i1 {inside}, i32 {r}, i32 {last_m}"));
        let read64 = g.v(format!("zext i32 {read} to i64"));
        let off = g.v(format!("mul i64 {read64}, {lda}"));
        let at = g.v(format!("getelementptr inbounds {}, ptr addrspace(1) {a_base}, i64 {off}", a_step(k)));
        rows.push((r, inside, at));
    }
    let mut cols = Vec::new();
    for j in 0..tn {
        let c = g.v(format!("add i32 {col0}, {}", grid * j));
        let inside = g.v(format!("icmp slt i32 {c}, %N"));
        let read = g.v(format!("select i1 {inside}, i32 {c}, i32 {last_n}"));
        let read64 = g.v(format!("zext i32 {read} to i64"));
        // K-major: column n of B is row n of `[N, K]`; N-major: element n of each row.
        let at = match major(k.b) {
            Major::K => {
                let off = g.v(format!("mul i64 {read64}, {ldb}"));
                g.v(format!("getelementptr inbounds {}, ptr addrspace(1) {b_base}, i64 {off}", b_step(k)))
            }
            Major::N => {
                g.v(format!("getelementptr inbounds {}, ptr addrspace(1) {b_base}, i64 {read64}", b_step(k)))
            }
        };
        cols.push((c, inside, at));
    }
    g.emit("br label %kloop");
    g.block("kloop");
    let head = g.body.len();
    let kk = g.v("add i64 %kk, 0");
    let a_elem = if k.a_f32 { ElemType::F32 } else { k.elem };
    let avals: Vec<String> = rows.iter().map(|(_, _, at)| g.load_f32(a_elem, at, &kk)).collect();
    let brow = match major(k.b) {
        Major::K => kk.clone(),
        Major::N => g.v(format!("mul i64 {kk}, {ldb}")),
    };
    let b_elem = if k.b_f32 { ElemType::F32 } else { k.elem };
    let bvals: Vec<String> = cols.iter().map(|(_, _, at)| g.load_f32(b_elem, at, &brow)).collect();
    let mut phis = String::new();
    let mut accs = Vec::new();
    for (i, a) in avals.iter().enumerate() {
        for (j, b) in bvals.iter().enumerate() {
            let prod = g.v(format!("fmul contract float {a}, {b}"));
            let next = g.v(format!("fadd contract float %acc.{i}.{j}, {prod}"));
            phis.push_str(&format!("  %acc.{i}.{j} = phi float [ 0.0, %entry ], [ {next}, %kloop ]\n"));
            accs.push(((i, j), next));
        }
    }
    let k1 = g.v(format!("add i64 {kk}, 1"));
    let kn = g.v("sext i32 %K to i64");
    let more = g.v(format!("icmp slt i64 {k1}, {kn}"));
    g.emit(format!("br i1 {more}, label %kloop, label %store"));
    g.body.insert_str(head, &format!("  %kk = phi i64 [ 0, %entry ], [ {k1}, %kloop ]\n{phis}"));
    g.block("store");
    let ldc = g.v("sext i32 %ldc to i64");
    for ((i, j), acc) in accs {
        let (r, r_in, _) = &rows[i];
        let (c, c_in, _) = &cols[j];
        let both = g.v(format!("and i1 {r_in}, {c_in}"));
        let (st, next) = (format!("st.{i}.{j}"), format!("st.{i}.{j}.next"));
        g.emit(format!("br i1 {both}, label %{st}, label %{next}"));
        g.block(&st);
        let r64 = g.v(format!("zext i32 {r} to i64"));
        let c64 = g.v(format!("zext i32 {c} to i64"));
        let row = g.v(format!("mul i64 {r64}, {ldc}"));
        let at = g.v(format!("add i64 {row}, {c64}"));
        let at = g.v(format!("add i64 {at}, {oc}"));
        let y = g.store_c(k.c_type(), k.epilogue, &acc, c, &at);
        if k.c16_copy {
            g.store_copy16(k.elem, &y, &at);
        }
        g.emit(format!("br label %{next}"));
        g.block(&next);
    }
    g.emit("ret void");
    g.module(
        &k.name(),
        k.threads(),
        &format!("a {tm}x{tn} tile of C a thread, f32 FMAs"),
        false,
        &plain_params(k),
        &[],
    )
}

/// A SIMT or GEMV kernel's parameters: `gpu::kernel::ABI`, then a 16-bit
/// copy's C (`GemmKernel::c16_copy`).
fn plain_params(k: &GemmKernel) -> String {
    let copy = if k.c16_copy { ", ptr addrspace(1) %C16" } else { "" };
    format!(
        "ptr addrspace(1) readonly %A, ptr addrspace(1) readonly %B, ptr addrspace(1) %C, \
         ptr addrspace(1) readonly %bias, ptr addrspace(1) readonly %res, i32 %M, i32 %N, i32 %K, \
         i32 %lda, i32 %ldb, i32 %ldc, i64 %sa, i64 %sb, i64 %sc{copy}"
    )
}

/// The LLVM IR of a GEMV kernel (`Arch::Gemv`, ABI `gpu::kernel::ABI`, a K-major
/// B): block `(x, y, z)` computes rows `y·bm ..` of C's columns `x·bn ..` in batch
/// entry `z`, warp `w` column `x·bn + w`. Lane `l` takes K's 16-byte chunks `l`,
/// `l + 32`, …: each chunk of B's column (a row of `[N, K]`: the warp reads 512
/// contiguous bytes a step) is loaded once and multiplied into the same chunk of
/// each of the block's rows of A, 8 f32 partial sums a row. After the loop a lane
/// adds its 8, a butterfly of warp shuffles adds the 32 lanes' (every lane then
/// holds every row's sum), and lane `i` stores row `i`. Rows and columns past M and
/// N read the last one and are not stored. K, lda and the batch strides are
/// multiples of 8 (`GemmKernel::accepts`, the runner's checks): each chunk is one
/// aligned 16-byte load inside K. A normalizing kernel (`GemmKernel::norm`) also
/// sums each row's chunks less the row's first value, their squares, and B's
/// chunks, through the same butterflies, and scales each row's sum by its norm.
fn gemv_ir(k: &GemmKernel) -> String {
    let mut g = Ir::default();
    let e = elem_ty(k.elem);
    let v8 = format!("<8 x {e}>");
    let tid = g.v("call i32 @llvm.nvvm.read.ptx.sreg.tid.x()");
    let bx = g.v("call i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()");
    let by = g.v("call i32 @llvm.nvvm.read.ptx.sreg.ctaid.y()");
    let bz = g.v("call i32 @llvm.nvvm.read.ptx.sreg.ctaid.z()");
    let lane = g.v(format!("and i32 {tid}, 31"));
    let warp = g.v(format!("lshr i32 {tid}, 5"));
    let n0 = g.v(format!("mul i32 {bx}, {}", k.bn));
    let n = g.v(format!("add i32 {n0}, {warp}"));
    let n_in = g.v(format!("icmp slt i32 {n}, %N"));
    let last_n = g.v("add i32 %N, -1");
    let n_read = g.v(format!("select i1 {n_in}, i32 {n}, i32 {last_n}"));
    let m0 = g.v(format!("mul i32 {by}, {}", k.bm));
    let (a_base, b_base, oc) = g.batch_entry(k, &bz);
    let lda = g.v("sext i32 %lda to i64");
    let ldb = g.v("sext i32 %ldb to i64");
    let n64 = g.v(format!("zext i32 {n_read} to i64"));
    let b_off = g.v(format!("mul i64 {n64}, {ldb}"));
    let b_col = g.v(format!("getelementptr inbounds {}, ptr addrspace(1) {b_base}, i64 {b_off}", b_step(k)));
    let last_m = g.v("add i32 %M, -1");
    let mut rows = Vec::new();
    for i in 0..k.bm {
        let r = g.v(format!("add i32 {m0}, {i}"));
        let inside = g.v(format!("icmp slt i32 {r}, %M"));
        let read = g.v(format!("select i1 {inside}, i32 {r}, i32 {last_m}"));
        let read64 = g.v(format!("zext i32 {read} to i64"));
        let off = g.v(format!("mul i64 {read64}, {lda}"));
        rows.push(g.v(format!("getelementptr inbounds {}, ptr addrspace(1) {a_base}, i64 {off}", a_step(k))));
    }
    // A normalizing kernel's shift of each row (its first value, K >= 1;
    // zero for an RMS norm), as 8 lanes.
    let centered = k.norm.is_some_and(|n| n.centered);
    let shifts: Vec<Option<String>> = rows
        .iter()
        .map(|row| {
            centered.then(|| {
                let x0 = g.v(format!("load float, ptr addrspace(1) {row}, align 4"));
                let v = g.v(format!("insertelement <8 x float> poison, float {x0}, i32 0"));
                g.v(format!("shufflevector <8 x float> {v}, <8 x float> poison, <8 x i32> zeroinitializer"))
            })
        })
        .collect();
    let lane64 = g.v(format!("zext i32 {lane} to i64"));
    let k0 = g.v(format!("mul i64 {lane64}, 8"));
    let kn = g.v("sext i32 %K to i64");
    let any = g.v(format!("icmp slt i64 {k0}, {kn}"));
    g.emit(format!("br i1 {any}, label %kloop, label %sum"));
    g.block("kloop");
    let head = g.body.len();
    // `unroll` chunks a lane a step, every load issued before the first product: a
    // chunk past K reloads the lane's first (in bounds) and its B is taken as zero.
    let unroll = k.gemv_unroll();
    let at = |g: &mut Ir, base: &str, kj: &str| -> String {
        let p = g.v(format!("getelementptr inbounds i16, ptr addrspace(1) {base}, i64 {kj}"));
        let x = g.v(format!("load {v8}, ptr addrspace(1) {p}, align 16"));
        g.v(format!("fpext {v8} {x} to <8 x float>"))
    };
    // An f32 operand's chunk: 8 values, two 16-byte loads.
    let at_f32 = |g: &mut Ir, base: &str, kj: &str, f32: bool| -> String {
        if !f32 {
            return at(g, base, kj);
        }
        let p = g.v(format!("getelementptr inbounds float, ptr addrspace(1) {base}, i64 {kj}"));
        g.v(format!("load <8 x float>, ptr addrspace(1) {p}, align 16"))
    };
    let mut chunks = Vec::new();
    for j in 0..unroll {
        let kj = g.v(format!("add i64 %kk, {}", j * gpu::kernel::GEMV_STEP));
        let live = g.v(format!("icmp slt i64 {kj}, {kn}"));
        let kj = g.v(format!("select i1 {live}, i64 {kj}, i64 {k0}"));
        let b = at_f32(&mut g, &b_col, &kj, k.b_f32);
        let a: Vec<String> = rows.iter().map(|row| at_f32(&mut g, row, &kj, k.a_f32)).collect();
        chunks.push((live, b, a));
    }
    // The accumulators: each row's products; with a norm, each row's sum of
    // (shifted) values and of their squares, and B's column sum.
    let rows_n = rows.len();
    let mut names: Vec<String> = (0..rows_n).map(|i| format!("%acc.{i}")).collect();
    if k.norm.is_some() {
        names.extend((0..rows_n).map(|i| format!("%sx.{i}")));
        names.extend((0..rows_n).map(|i| format!("%sxx.{i}")));
        names.push("%colsum".to_string());
    }
    let mut accs = names.clone();
    for (live, b, a) in &chunks {
        let b = g.v(format!("select i1 {live}, <8 x float> {b}, <8 x float> zeroinitializer"));
        if k.norm.is_some() {
            accs[3 * rows_n] = g.v(format!("fadd contract <8 x float> {}, {b}", accs[3 * rows_n]));
        }
        for (i, a) in a.iter().enumerate() {
            let x = match &shifts[i] {
                Some(shift) => g.v(format!("fsub <8 x float> {a}, {shift}")),
                None => a.clone(),
            };
            if k.norm.is_some() {
                // A chunk past K reloaded the first: it adds nothing.
                let xz = g.v(format!("select i1 {live}, <8 x float> {x}, <8 x float> zeroinitializer"));
                accs[rows_n + i] = g.v(format!("fadd contract <8 x float> {}, {xz}", accs[rows_n + i]));
                let sq = g.v(format!("fmul contract <8 x float> {xz}, {xz}"));
                accs[2 * rows_n + i] =
                    g.v(format!("fadd contract <8 x float> {}, {sq}", accs[2 * rows_n + i]));
            }
            let prod = g.v(format!("fmul contract <8 x float> {x}, {b}"));
            accs[i] = g.v(format!("fadd contract <8 x float> {}, {prod}", accs[i]));
        }
    }
    let mut phis = String::new();
    for (name, acc) in names.iter().zip(&accs) {
        phis.push_str(&format!(
            "  {name} = phi <8 x float> [ zeroinitializer, %entry ], [ {acc}, %kloop ]\n"
        ));
    }
    let next = accs;
    let k1 = g.v(format!("add i64 %kk, {}", unroll * gpu::kernel::GEMV_STEP));
    let more = g.v(format!("icmp slt i64 {k1}, {kn}"));
    g.emit(format!("br i1 {more}, label %kloop, label %sum"));
    g.body.insert_str(head, &format!("  %kk = phi i64 [ {k0}, %entry ], [ {k1}, %kloop ]\n{phis}"));
    g.block("sum");
    // The lane's 8 sums of each row, then the warp's 32 lanes by a butterfly.
    let phis: Vec<String> = next
        .iter()
        .map(|acc| g.v(format!("phi <8 x float> [ zeroinitializer, %entry ], [ {acc}, %kloop ]")))
        .collect();
    let mut sums = Vec::new();
    for v in phis {
        let mut x =
            g.v(format!("call reassoc float @llvm.vector.reduce.fadd.v8f32(float -0.0, <8 x float> {v})"));
        for off in [16, 8, 4, 2, 1] {
            let y = g
                .v(format!("call float @llvm.nvvm.shfl.sync.bfly.f32(i32 -1, float {x}, i32 {off}, i32 31)"));
            x = g.v(format!("fadd float {x}, {y}"));
        }
        sums.push(x);
    }
    if let Some(norm) = k.norm {
        // rstd·(Σ(x - x₀)·b - (mean - x₀)·Σb), mean - x₀ = Σ(x - x₀)/K (an RMS
        // norm: rstd·Σx·b).
        let kf = g.v("sitofp i32 %K to float");
        let eps = f32::from_bits(norm.eps);
        let sb = sums[3 * rows_n].clone();
        for i in 0..rows_n {
            let ms = g.v(format!("fdiv float {}, {kf}", sums[2 * rows_n + i]));
            let (var, dot) = if norm.centered {
                let mean = g.v(format!("fdiv float {}, {kf}", sums[rows_n + i]));
                let m2 = g.v(format!("fmul float {mean}, {mean}"));
                let var = g.v(format!("fsub float {ms}, {m2}"));
                let var = g.v(format!("call float @llvm.maxnum.f32(float {var}, float 0.0)"));
                let shift = g.v(format!("fmul float {mean}, {sb}"));
                (var, g.v(format!("fsub float {}, {shift}", sums[i])))
            } else {
                (ms, sums[i].clone())
            };
            let ve = g.v(format!("fadd float {var}, {}", float_lit(eps)));
            let sq = g.v(format!("call float @llvm.sqrt.f32(float {ve})"));
            let rstd = g.v(format!("fdiv float 1.0, {sq}"));
            sums[i] = g.v(format!("fmul float {rstd}, {dot}"));
        }
        sums.truncate(rows_n);
    }
    // Lane i stores row i.
    let mut y = sums[0].clone();
    for (i, x) in sums.iter().enumerate().skip(1) {
        let is = g.v(format!("icmp eq i32 {lane}, {i}"));
        y = g.v(format!("select i1 {is}, float {x}, float {y}"));
    }
    let r = g.v(format!("add i32 {m0}, {lane}"));
    let lane_row = g.v(format!("icmp ult i32 {lane}, {}", k.bm));
    let r_in = g.v(format!("icmp slt i32 {r}, %M"));
    let store = g.v(format!("and i1 {lane_row}, {r_in}"));
    let store = g.v(format!("and i1 {store}, {n_in}"));
    g.emit(format!("br i1 {store}, label %store, label %done"));
    g.block("store");
    let r64 = g.v(format!("zext i32 {r} to i64"));
    let ldc = g.v("sext i32 %ldc to i64");
    let row = g.v(format!("mul i64 {r64}, {ldc}"));
    let nn = g.v(format!("zext i32 {n} to i64"));
    let ci = g.v(format!("add i64 {row}, {nn}"));
    let ci = g.v(format!("add i64 {ci}, {oc}"));
    let stored = g.store_c(k.c_type(), k.epilogue, &y, &n, &ci);
    if k.c16_copy {
        g.store_copy16(k.elem, &stored, &ci);
    }
    g.emit("br label %done");
    g.block("done");
    g.emit("ret void");
    g.module(
        &k.name(),
        k.threads(),
        &format!(
            "a warp a column, {} rows, warp shuffles{}",
            k.bm,
            if k.norm.is_some() { ", the rows normalized" } else { "" }
        ),
        false,
        &plain_params(k),
        &[],
    )
}

/// The IR writer: numbered SSA values, one instruction a line, fresh labels; and
/// the pieces every kernel of the module shares (the epilogue of a value, GELU,
/// the module's text around a body).
#[derive(Default)]
struct Ir {
    body: String,
    n: usize,
    label: usize,
}

/// A GEMM kernel's generator: the kernel and the IR written so far (its writer's
/// methods are called through it).
struct Gen {
    k: GemmKernel,
    ir: Ir,
    /// A taps kernel's geometry, once [`Gen::copies`] has loaded it.
    taps: Option<TapsGeometry>,
    /// A persistent Stream-K kernel's consumers' unit, for their epilogue.
    unit: Option<StreamUnit>,
}

impl std::ops::Deref for Gen {
    type Target = Ir;
    fn deref(&self) -> &Ir {
        &self.ir
    }
}

impl std::ops::DerefMut for Gen {
    fn deref_mut(&mut self) -> &mut Ir {
        &mut self.ir
    }
}

/// The two B layouts the family reads: `GemmKernel::check`, which every
/// emitter's entry runs first, refuses the others.
enum Major {
    K,
    N,
}

fn major(b: BLayout) -> Major {
    match b {
        BLayout::KMajor => Major::K,
        BLayout::NMajor => Major::N,
        BLayout::Strided | BLayout::Packed { .. } => unreachable!("GemmKernel::check refuses a B {b:?}"),
    }
}

/// The two element types the family multiplies in: `GemmKernel::check` refuses f32.
enum Half {
    Bf16,
    F16,
}

fn half(e: ElemType) -> Half {
    match e {
        ElemType::Bf16 => Half::Bf16,
        ElemType::F16 => Half::F16,
        ElemType::F32 | ElemType::U8S8 | ElemType::I16 | ElemType::I16S8 => {
            unreachable!("GemmKernel::check refuses other operands than 16-bit")
        }
    }
}

/// The element's IR type, its `<2 x ..>` form, and the mma intrinsic.
fn elem_ty(e: ElemType) -> &'static str {
    match half(e) {
        Half::Bf16 => "bfloat",
        Half::F16 => "half",
    }
}

/// The IR type of a value of C (and of the bias and residual): `float`, or
/// the 16-bit type.
fn c_ty(c: ElemType) -> &'static str {
    match c {
        ElemType::F32 => "float",
        e => elem_ty(e),
    }
}

/// The type C's addresses step by: `float`, or `i16` for either 16-bit type.
/// The type A's pointers step by: f32 for an f32 A, else 16-bit.
fn a_step(k: &GemmKernel) -> &'static str {
    if k.a_f32 {
        "float"
    } else {
        "i16"
    }
}

/// The type B's pointers step by: f32 for an f32 B, else 16-bit.
fn b_step(k: &GemmKernel) -> &'static str {
    if k.b_f32 {
        "float"
    } else {
        "i16"
    }
}

fn c_step(c: ElemType) -> &'static str {
    match c {
        ElemType::F32 => "float",
        _ => "i16",
    }
}

impl Ir {
    /// Emits `%vN = <expr>` and returns `%vN`.
    fn v(&mut self, expr: impl AsRef<str>) -> String {
        self.n += 1;
        let name = format!("%v{}", self.n);
        let _ = writeln!(self.body, "  {name} = {}", expr.as_ref());
        name
    }

    fn emit(&mut self, line: impl AsRef<str>) {
        let _ = writeln!(self.body, "  {}", line.as_ref());
    }

    fn block(&mut self, name: &str) {
        let _ = writeln!(self.body, "{name}:");
    }

    fn fresh(&mut self, stem: &str) -> String {
        self.label += 1;
        format!("{stem}{}", self.label)
    }

    /// The module around the body of kernel `name`: the target, the dynamic shared
    /// memory (with `shared`), the signature `params`, the declarations and the
    /// annotations: `threads` a block at most, and `extra` ones (`!"name", value`).
    fn module(
        self,
        name: &str,
        threads: usize,
        about: &str,
        shared: bool,
        params: &str,
        extra: &[String],
    ) -> String {
        let mut m = String::new();
        let _ = writeln!(m, "; {name}: {threads} threads, {about}");
        let _ = writeln!(m, "target datalayout = \"e-i64:64-i128:128-v16:16-v32:32-n16:32:64\"");
        let _ = writeln!(m, "target triple = \"{TRIPLE}\"\n");
        if shared {
            // 1024-byte aligned: a 128-byte swizzle atom's pattern is read off address bits.
            let _ = writeln!(m, "@smem = external addrspace(3) global [0 x i8], align 1024\n");
        }
        let _ = writeln!(m, "define void @{name}({params}) {{");
        m.push_str("entry:\n");
        m.push_str(&self.body);
        m.push_str("}\n\n");
        m.push_str(DECLS);
        let nodes: Vec<String> = (0..2 + extra.len()).map(|i| format!("!{i}")).collect();
        let _ = writeln!(m, "\n!nvvm.annotations = !{{{}}}", nodes.join(", "));
        let _ = writeln!(m, "!0 = !{{ptr @{name}, !\"kernel\", i32 1}}");
        let _ = writeln!(m, "!1 = !{{ptr @{name}, !\"maxntidx\", i32 {threads}}}");
        for (i, a) in extra.iter().enumerate() {
            let _ = writeln!(m, "!{} = !{{ptr @{name}, {a}}}", i + 2);
        }
        m
    }

    /// One f32 value `y` through `epi` (the bias at column `n`, the residual at C's
    /// index `ci`), rounded to C's type `c` and stored at `C[ci]`.
    /// Returns the value stored.
    fn store_c(&mut self, c: ElemType, epi: Epilogue, y: &str, n: &str, ci: &str) -> String {
        let res = epi.residual.then(|| ("%res".to_string(), ci.to_string()));
        let y = self.epilogue_value(c, epi, y, n, res.as_ref());
        let h = self.round_c(c, &y);
        let (t, st) = (c_ty(c), c_step(c));
        let cp = self.v(format!("getelementptr inbounds {st}, ptr addrspace(1) %C, i64 {ci}"));
        self.emit(format!("store {t} {h}, ptr addrspace(1) {cp}, align {}", c.bytes()));
        h
    }

    /// An f32 value `y` rounded to `elem` (16-bit) and stored at `C16[ci]`
    /// (`GemmKernel::c16_copy`).
    fn store_copy16(&mut self, elem: ElemType, y: &str, ci: &str) {
        let h = elem_ty(elem);
        let r = self.v(format!("fptrunc float {y} to {h}"));
        let cp = self.v(format!("getelementptr inbounds i16, ptr addrspace(1) %C16, i64 {ci}"));
        self.emit(format!("store {h} {r}, ptr addrspace(1) {cp}, align 2"));
    }

    /// An f32 value as C's type `c` (rounded to a 16-bit type, or as it is).
    fn round_c(&mut self, c: ElemType, y: &str) -> String {
        match c {
            ElemType::F32 => y.to_string(),
            e => self.v(format!("fptrunc float {y} to {}", elem_ty(e))),
        }
    }

    /// C's type `c`'s value at `off` (i64) past `base`, as f32.
    fn load_c(&mut self, c: ElemType, base: &str, off: &str) -> String {
        let (t, st) = (c_ty(c), c_step(c));
        let p = self.v(format!("getelementptr inbounds {st}, ptr addrspace(1) {base}, i64 {off}"));
        let x = self.v(format!("load {t}, ptr addrspace(1) {p}, align {}", c.bytes()));
        match c {
            ElemType::F32 => x,
            _ => self.v(format!("fpext {t} {x} to float")),
        }
    }

    /// Batch entry `bz`'s A and B (pointers at their batch strides) and C's offset
    /// (elements, C's batch stride).
    fn batch_entry(&mut self, k: &GemmKernel, bz: &str) -> (String, String, String) {
        let bz64 = self.v(format!("zext i32 {bz} to i64"));
        let oa = self.v(format!("mul i64 {bz64}, %sa"));
        let ob = self.v(format!("mul i64 {bz64}, %sb"));
        let oc = self.v(format!("mul i64 {bz64}, %sc"));
        let a = self.v(format!("getelementptr inbounds {}, ptr addrspace(1) %A, i64 {oa}", a_step(k)));
        let b = self.v(format!("getelementptr inbounds {}, ptr addrspace(1) %B, i64 {ob}", b_step(k)));
        (a, b, oc)
    }

    /// The 16-bit element `off` (i64) past `base`, widened to f32.
    fn load_f32(&mut self, elem: ElemType, base: &str, off: &str) -> String {
        if elem == ElemType::F32 {
            let p = self.v(format!("getelementptr inbounds float, ptr addrspace(1) {base}, i64 {off}"));
            return self.v(format!("load float, ptr addrspace(1) {p}, align 4"));
        }
        let e = elem_ty(elem);
        let p = self.v(format!("getelementptr inbounds i16, ptr addrspace(1) {base}, i64 {off}"));
        let x = self.v(format!("load {e}, ptr addrspace(1) {p}, align 2"));
        self.v(format!("fpext {e} {x} to float"))
    }

    /// The epilogue of one f32 value `y`: `act(scale·y + bias[bias_idx] +
    /// residual)` (the residual at `(base, index)`), each part as `epi` asks,
    /// the bias and residual of C's type `c`.
    fn epilogue_value(
        &mut self,
        c: ElemType,
        epi: Epilogue,
        y: &str,
        bias_idx: &str,
        residual: Option<&(String, String)>,
    ) -> String {
        let mut y = y.to_string();
        if let Some(k) = epi.scale {
            y = self.v(format!("fmul float {y}, {}", float_lit(k)));
        }
        if epi.bias {
            let bi = self.v(format!("sext i32 {bias_idx} to i64"));
            let bf = self.load_c(c, "%bias", &bi);
            y = self.v(format!("fadd float {y}, {bf}"));
        }
        if let Some((rb, ri)) = residual {
            let rf = self.load_c(c, rb, ri);
            y = self.v(format!("fadd float {y}, {rf}"));
        }
        self.activation(epi.activation, &y)
    }

    /// An epilogue's activation of an f32 value, in registers.
    fn activation(&mut self, act: Activation, x: &str) -> String {
        match act {
            Activation::None => x.to_string(),
            Activation::Pointwise(p) => self.pointwise(&p, x),
            // `x < 0 ? 0 : x`: NaN stays NaN, as on the CPU.
            Activation::Relu => {
                let neg = self.v(format!("fcmp olt float {x}, 0.0"));
                self.v(format!("select i1 {neg}, float 0.0, float {x}"))
            }
            Activation::Tanh => {
                self.v(format!("call float asm \"tanh.approx.f32 $0, $1;\", \"=f,f\"(float {x})"))
            }
            Activation::Gelu | Activation::GeluTanh => self.gelu(act, x),
        }
    }

    /// An element-wise program on an f32 value, in registers, an instruction
    /// (or a short inline formula) per operation, with the semantics of
    /// `Pointwise::eval` and the CPU's formulas (`vmath`): `exp` and `log`
    /// through `ex2.approx`/`lg2.approx`, whose relative error (about 2⁻²²)
    /// the 16-bit output's rounding covers; max and min by comparisons, so that
    /// NaNs and signed zeros come out as on the CPU whatever the PTX
    /// instructions' own rules.
    fn pointwise(&mut self, p: &Pointwise, x: &str) -> String {
        let mut v: Vec<String> = Vec::with_capacity(p.ops().len());
        for op in p.ops() {
            let r = match *op {
                PwOp::Input => x.to_string(),
                PwOp::Const(bits) => float_lit(f32::from_bits(bits)),
                // GPU plans keep an epilogue's constants in its program
                // (`LowerOptions::epilogue_params`), and a GPU build refuses a
                // plan with parameters before any kernel is made.
                PwOp::Param(_) => unreachable!("a GPU epilogue with parameters"),
                // Likewise a program reading its residual (`LowerOptions::residual_programs`).
                PwOp::Residual => unreachable!("a GPU epilogue program reading its residual"),
                PwOp::Unary(u, a) => {
                    let a = v[a as usize].clone();
                    self.pw_unary(u, &a)
                }
                PwOp::Binary(b, p, q) => {
                    let (a, c) = (v[p as usize].clone(), v[q as usize].clone());
                    self.pw_binary(b, &a, &c)
                }
                PwOp::Integer { x, offset, lo, hi } => {
                    // `fptosi.sat` saturates and takes NaN to 0, as PTX's `cvt.rzi.sat` does.
                    let x = v[x as usize].clone();
                    let i = self.v(format!("call i32 @llvm.fptosi.sat.i32.f32(float {x})"));
                    let i = self.v(format!("add i32 {i}, {offset}"));
                    let i = self.v(format!("call i32 @llvm.smax.i32(i32 {i}, i32 {lo})"));
                    let i = self.v(format!("call i32 @llvm.smin.i32(i32 {i}, i32 {hi})"));
                    self.v(format!("sitofp i32 {i} to float"))
                }
                PwOp::MulAdd(a, b, c) => {
                    let [a, b, c] = [a, b, c].map(|i| v[i as usize].clone());
                    self.v(format!("call float @llvm.fma.f32(float {a}, float {b}, float {c})"))
                }
                PwOp::Select(cmp, a, b, t, f) => {
                    let pred = match cmp {
                        PwCmp::Less => "olt",
                        PwCmp::LessEq => "ole",
                        PwCmp::Greater => "ogt",
                        PwCmp::GreaterEq => "oge",
                        PwCmp::Equal => "oeq",
                    };
                    let [a, b, t, f] = [a, b, t, f].map(|i| v[i as usize].clone());
                    let c = self.v(format!("fcmp {pred} float {a}, {b}"));
                    self.v(format!("select i1 {c}, float {t}, float {f}"))
                }
            };
            v.push(r);
        }
        v.pop().unwrap_or_else(|| x.to_string())
    }

    fn pw_unary(&mut self, u: PwUnary, a: &str) -> String {
        match u {
            PwUnary::Neg => self.v(format!("fneg float {a}")),
            PwUnary::Abs => self.v(format!("call float @llvm.fabs.f32(float {a})")),
            PwUnary::Exp => self.exp(a),
            PwUnary::Log => {
                let l2 = self.v(format!("call float asm \"lg2.approx.f32 $0, $1;\", \"=f,f\"(float {a})"));
                self.v(format!("fmul float {l2}, {}", float_lit(std::f32::consts::LN_2)))
            }
            PwUnary::Sqrt => self.v(format!("call float @llvm.sqrt.f32(float {a})")),
            PwUnary::Reciprocal => self.v(format!("fdiv float 1.0, {a}")),
            PwUnary::Tanh => self.tanh(a),
            PwUnary::Erf => self.erf(a),
            PwUnary::Sigmoid => {
                let n = self.v(format!("fneg float {a}"));
                let e = self.exp(&n);
                let d = self.v(format!("fadd float {e}, 1.0"));
                self.v(format!("fdiv float 1.0, {d}"))
            }
            PwUnary::Relu => self.activation(Activation::Relu, a),
            PwUnary::Floor => self.v(format!("call float @llvm.floor.f32(float {a})")),
            PwUnary::Ceil => self.v(format!("call float @llvm.ceil.f32(float {a})")),
            PwUnary::Round => self.v(format!("call float @llvm.roundeven.f32(float {a})")),
        }
    }

    fn pw_binary(&mut self, b: PwBinary, x: &str, y: &str) -> String {
        let (op, zero_bits) = match b {
            PwBinary::Add => return self.v(format!("fadd float {x}, {y}")),
            PwBinary::Sub => return self.v(format!("fsub float {x}, {y}")),
            PwBinary::Mul => return self.v(format!("fmul float {x}, {y}")),
            PwBinary::Div => return self.v(format!("fdiv float {x}, {y}")),
            // Equal values differ at most in a zero's sign: +0 wins max, -0 min.
            PwBinary::Max => ("ogt", "and"),
            PwBinary::Min => ("olt", "or"),
        };
        let wins = self.v(format!("fcmp {op} float {x}, {y}"));
        let pick = self.v(format!("select i1 {wins}, float {x}, float {y}"));
        let (xi, yi) =
            (self.v(format!("bitcast float {x} to i32")), self.v(format!("bitcast float {y} to i32")));
        let zi = self.v(format!("{zero_bits} i32 {xi}, {yi}"));
        let z = self.v(format!("bitcast i32 {zi} to float"));
        let eq = self.v(format!("fcmp oeq float {x}, {y}"));
        let r = self.v(format!("select i1 {eq}, float {z}, float {pick}"));
        let nan = self.v(format!("fcmp uno float {x}, {y}"));
        self.v(format!("select i1 {nan}, float 0x7FF8000000000000, float {r}"))
    }

    /// `e^x` as `2^(x·log2 e)` by `ex2.approx` (+inf past the range, 0 below it,
    /// NaN for NaN).
    /// A `wgmma` descriptor of the 128-byte swizzled operand at shared
    /// address `addr` (i32): its bits 4-17 and `layout` ([`DESC_SW128_KMAJOR`]
    /// or, an N-major B's, [`DESC_SW128_NMAJOR`]).
    fn sw128_descriptor(&mut self, addr: &str, layout: u64) -> String {
        let field = self.v(format!("lshr i32 {addr}, 4"));
        let low = self.v(format!("and i32 {field}, 16383"));
        let low64 = self.v(format!("zext i32 {low} to i64"));
        self.v(format!("or i64 {low64}, {layout}"))
    }

    /// The inline-asm call of `wgmma` PTX `text` (whose `$i` are the
    /// accumulators, then `operands` with `constraints`, then the scale, 1):
    /// the accumulators `acc` updated, in order.
    fn wgmma_call(
        &mut self,
        text: &str,
        operands: Vec<String>,
        constraints: &str,
        acc: &[String],
    ) -> Vec<String> {
        let nacc = acc.len();
        let outs = vec!["=f"; nacc].join(",");
        let tied = (0..nacc).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
        let sty = format!("{{{}}}", vec!["float"; nacc].join(", "));
        let args: Vec<String> = operands
            .into_iter()
            .chain(std::iter::once("i32 1".to_string()))
            .chain(acc.iter().map(|a| format!("float {a}")))
            .collect();
        let r = self.v(format!(
            "call {sty} asm sideeffect \"{text}\", \"{outs},{constraints},r,{tied},~{{memory}}\"({})",
            args.join(", ")
        ));
        (0..nacc).map(|i| self.v(format!("extractvalue {sty} {r}, {i}"))).collect()
    }

    fn exp(&mut self, x: &str) -> String {
        let l = self.v(format!("fmul float {x}, {}", float_lit(std::f32::consts::LOG2_E)));
        self.v(format!("call float asm \"ex2.approx.f32 $0, $1;\", \"=f,f\"(float {l})"))
    }

    /// `p(x²)` by Horner's rule for a series' coefficients, highest first.
    fn series(&mut self, coef: &[f64], x2: &str) -> String {
        let mut p = float_lit(coef[0] as f32);
        for &c in &coef[1..] {
            p = self
                .v(format!("call float @llvm.fma.f32(float {p}, float {x2}, float {})", float_lit(c as f32)));
        }
        p
    }

    /// `tanh(x)` as the CPU computes it: `1 - 2/(e^{2x} + 1)` on the input
    /// clamped to ±9, its odd series below `|x| < ½`.
    fn tanh(&mut self, x: &str) -> String {
        let lo = self.v(format!("fcmp olt float {x}, -9.0"));
        let c1 = self.v(format!("select i1 {lo}, float -9.0, float {x}"));
        let hi = self.v(format!("fcmp ogt float {c1}, 9.0"));
        let xc = self.v(format!("select i1 {hi}, float 9.0, float {c1}"));
        let x2c = self.v(format!("fmul float {xc}, 2.0"));
        let e = self.exp(&x2c);
        let d = self.v(format!("fadd float {e}, 1.0"));
        let q = self.v(format!("fdiv float 2.0, {d}"));
        let far = self.v(format!("fsub float 1.0, {q}"));
        let x2 = self.v(format!("fmul float {x}, {x}"));
        let p = self.series(&TANH_SERIES, &x2);
        let px2 = self.v(format!("fmul float {p}, {x2}"));
        let near = self.v(format!("call float @llvm.fma.f32(float {px2}, float {x}, float {x})"));
        let small = self.v(format!("fcmp olt float {x2}, 0.25"));
        self.v(format!("select i1 {small}, float {near}, float {far}"))
    }

    /// `erf(x)` as the CPU computes it: Abramowitz & Stegun 7.1.26, its
    /// series below `|x| < ½`.
    fn erf(&mut self, x: &str) -> String {
        let ax = self.v(format!("call float @llvm.fabs.f32(float {x})"));
        let d =
            self.v(format!("call float @llvm.fma.f32(float {ax}, float {}, float 1.0)", float_lit(ERF_P)));
        let t = self.v(format!("fdiv float 1.0, {d}"));
        let mut poly = "0.0".to_string();
        for a in ERF_A.iter().rev() {
            poly =
                self.v(format!("call float @llvm.fma.f32(float {poly}, float {t}, float {})", float_lit(*a)));
        }
        let poly = self.v(format!("fmul float {poly}, {t}"));
        let sq = self.v(format!("fmul float {ax}, {ax}"));
        let nsq = self.v(format!("fneg float {sq}"));
        let e = self.exp(&nsq);
        let pe = self.v(format!("fmul float {poly}, {e}"));
        let y = self.v(format!("fsub float 1.0, {pe}"));
        let ny = self.v(format!("fneg float {y}"));
        let neg = self.v(format!("fcmp olt float {x}, 0.0"));
        let far = self.v(format!("select i1 {neg}, float {ny}, float {y}"));
        let x2 = self.v(format!("fmul float {x}, {x}"));
        let p = self.series(&ERF_SERIES, &x2);
        let px = self.v(format!("fmul float {p}, {x}"));
        let near = self.v(format!("fmul float {px}, {}", float_lit(std::f32::consts::FRAC_2_SQRT_PI)));
        let small = self.v(format!("fcmp olt float {x2}, 0.25"));
        self.v(format!("select i1 {small}, float {near}, float {far}"))
    }

    /// GELU of an f32 value, in registers: the tanh form through `tanh.approx.f32`;
    /// the erf form through erfc's Chebyshev fit (|error| < 1.2e-7) with `ex2.approx`.
    fn gelu(&mut self, form: Activation, x: &str) -> String {
        match form {
            Activation::GeluTanh => {
                let x2 = self.v(format!("fmul float {x}, {x}"));
                let x3 = self.v(format!("fmul float {x2}, {x}"));
                let inner = self
                    .v(format!("call float @llvm.fma.f32(float {x3}, float 0x3FA6E4E260000000, float {x})"));
                let u = self.v(format!("fmul float {inner}, 0x3FE9884540000000"));
                let t = self.v(format!("call float asm \"tanh.approx.f32 $0, $1;\", \"=f,f\"(float {u})"));
                let one = self.v(format!("fadd float {t}, 1.0"));
                let hx = self.v(format!("fmul float {x}, 0.5"));
                self.v(format!("fmul float {hx}, {one}"))
            }
            _ => {
                // erf(x/√2) for z = |x|/√2: t = 1/(1 + z/2), erfc = t·exp(-z² + P(t)).
                let ax = self.v(format!("call float @llvm.fabs.f32(float {x})"));
                let z = self.v(format!("fmul float {ax}, 0x3FE6A09E60000000"));
                let hz = self.v(format!("call float @llvm.fma.f32(float {z}, float 0.5, float 1.0)"));
                let t = self.v(format!("fdiv float 1.0, {hz}"));
                let coef = [
                    0.170_872_77f32,
                    -0.822_152_23,
                    1.488_515_9,
                    -1.135_204,
                    0.278_868_07,
                    -0.186_288_06,
                    0.096_784_18,
                    0.374_091_96,
                    1.000_023_7,
                    -1.265_512_2,
                ];
                let mut p = float_lit(coef[0]);
                for &c in &coef[1..] {
                    p = self
                        .v(format!("call float @llvm.fma.f32(float {p}, float {t}, float {})", float_lit(c)));
                }
                let z2 = self.v(format!("fmul float {z}, {z}"));
                let ex = self.v(format!("fsub float {p}, {z2}"));
                let l2 = self.v(format!("fmul float {ex}, 0x3FF7154760000000"));
                let e2 = self.v(format!("call float asm \"ex2.approx.f32 $0, $1;\", \"=f,f\"(float {l2})"));
                let erfc = self.v(format!("fmul float {t}, {e2}"));
                let erf_abs = self.v(format!("fsub float 1.0, {erfc}"));
                let neg = self.v(format!("fcmp olt float {x}, 0.0"));
                let nerf = self.v(format!("fneg float {erf_abs}"));
                let erf = self.v(format!("select i1 {neg}, float {nerf}, float {erf_abs}"));
                let one = self.v(format!("fadd float {erf}, 1.0"));
                let hx = self.v(format!("fmul float {x}, 0.5"));
                self.v(format!("fmul float {hx}, {one}"))
            }
        }
    }
}

impl Gen {
    fn new(k: GemmKernel) -> Gen {
        Gen { k, ir: Ir::default(), taps: None, unit: None }
    }

    /// `x % stages · stage_bytes` as an i32 byte offset.
    fn slot_base(&mut self, x: &str) -> String {
        let s = self.k.stages;
        let slot = if s.is_power_of_two() {
            self.v(format!("and i32 {x}, {}", s - 1))
        } else {
            self.v(format!("urem i32 {x}, {s}"))
        };
        let (a, b) = self.k.stage_bytes();
        self.v(format!("mul i32 {slot}, {}", a + b))
    }

    fn smem_ptr(&mut self, off: &str) -> String {
        self.v(format!("getelementptr inbounds i8, ptr addrspace(3) @smem, i32 {off}"))
    }

    /// Tiles along N and M: `⌈N/bn⌉`, `⌈M/bm⌉`.
    fn tile_grid(&mut self) -> (String, String) {
        let k = self.k;
        let nr = self.v(format!("add i32 %N, {}", k.bn - 1));
        let gx = self.v(format!("udiv i32 {nr}, {}", k.bn));
        let mr = self.v(format!("add i32 %M, {}", k.bm - 1));
        let gy = self.v(format!("udiv i32 {mr}, {}", k.bm));
        (gx, gy)
    }

    /// Block and thread indices, the operands' bases for this block's batch entry,
    /// and the K steps. Blocks are rasterized in groups of `RASTER_ROWS` tile rows:
    /// consecutive blocks share B's column panels and a few of A's row panels, so
    /// that a wave's operands stay in L2 when a whole row of tiles would not. A
    /// persistent kernel's block asks for each `tile` it takes: the same order, the
    /// batch outermost.
    fn indices(&mut self, tile: Option<(&str, &(String, String))>) -> Ix {
        let k = self.k;
        let raw = self.v("call i32 @llvm.nvvm.read.ptx.sreg.tid.x()");
        // A TMA kernel's consumers count from 0 after the producer warpgroup (whose
        // threads get negative indices).
        let tid = if k.tma { self.v(format!("sub i32 {raw}, {TMA_PRODUCER_THREADS}")) } else { raw };
        let (pid, bz, gx, gy) = match tile {
            Some((t, (gx, gy))) => {
                let (gx, gy) = (gx.clone(), gy.clone());
                let per = self.v(format!("mul i32 {gx}, {gy}"));
                let bz = self.v(format!("udiv i32 {t}, {per}"));
                let pid = self.v(format!("urem i32 {t}, {per}"));
                (pid, bz, gx, gy)
            }
            None => {
                let bx = self.v("call i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()");
                let by = self.v("call i32 @llvm.nvvm.read.ptx.sreg.ctaid.y()");
                let bz = self.v("call i32 @llvm.nvvm.read.ptx.sreg.ctaid.z()");
                let gx = self.v("call i32 @llvm.nvvm.read.ptx.sreg.nctaid.x()");
                let gy = self.v("call i32 @llvm.nvvm.read.ptx.sreg.nctaid.y()");
                let row_start = self.v(format!("mul i32 {by}, {gx}"));
                (self.v(format!("add i32 {row_start}, {bx}")), bz, gx, gy)
            }
        };
        // pid = by·gx + bx; group g = pid / (G·gx) covers tile rows [g·G, g·G + size).
        let per_group = self.v(format!("mul i32 {gx}, {RASTER_ROWS}"));
        let group = self.v(format!("udiv i32 {pid}, {per_group}"));
        let first = self.v(format!("mul i32 {group}, {RASTER_ROWS}"));
        let left = self.v(format!("sub i32 {gy}, {first}"));
        let small = self.v(format!("icmp ult i32 {left}, {RASTER_ROWS}"));
        let size = self.v(format!("select i1 {small}, i32 {left}, i32 {RASTER_ROWS}"));
        let in_group = self.v(format!("urem i32 {pid}, {per_group}"));
        let tm_off = self.v(format!("urem i32 {in_group}, {size}"));
        let tm = self.v(format!("add i32 {first}, {tm_off}"));
        let tn = self.v(format!("udiv i32 {in_group}, {size}"));
        let warp = self.v(format!("lshr i32 {tid}, 5"));
        let lane = self.v(format!("and i32 {tid}, 31"));
        let m0 = self.v(format!("mul i32 {tm}, {}", k.bm));
        let n0 = self.v(format!("mul i32 {tn}, {}", k.bn));
        let bz64 = self.v(format!("zext i32 {bz} to i64"));
        let bk = k.bk();
        let kr = self.v(format!("add i32 %K, {}", bk - 1));
        let steps = self.v(format!("udiv i32 {kr}, {bk}"));
        if k.split_k {
            // `z` is the split: steps [z·kper, min(steps, (z+1)·kper)) into its f32
            // slice of the workspace (the runner leaves no split without work); a
            // folding kernel's C and residual are the product's own.
            let (c_base, r_base, fold) = if k.fold {
                let r_base = k.epilogue.residual.then(|| "%res".to_string());
                let at = FoldAt {
                    tile: pid.clone(),
                    share: bz.clone(),
                    shares: Shares::Split { steps: steps.clone() },
                    whole: None,
                };
                (String::from("%C"), r_base, Some(at))
            } else {
                let oc = self.v(format!("mul i64 {bz64}, %sc"));
                let c_base = self.v(format!("getelementptr inbounds float, ptr addrspace(1) %C, i64 {oc}"));
                (c_base, None, None)
            };
            let c16_base = k.c16_copy.then(|| "%C16".to_string());
            let k_first = self.v(format!("mul i32 {bz}, %kper"));
            let left = self.v(format!("sub i32 {steps}, {k_first}"));
            let fewer = self.v(format!("icmp ult i32 {left}, %kper"));
            let kt_n = self.v(format!("select i1 {fewer}, i32 {left}, i32 %kper"));
            return Ix {
                tid,
                warp,
                lane,
                m0,
                n0,
                a_base: "%A".into(),
                b_base: "%B".into(),
                c_base,
                c16_base,
                r_base,
                kt_n,
                k_first,
                batch: "0".into(),
                fold,
            };
        }
        let oa = self.v(format!("mul i64 {bz64}, %sa"));
        let ob = self.v(format!("mul i64 {bz64}, %sb"));
        let oc = self.v(format!("mul i64 {bz64}, %sc"));
        let a_base = self.v(format!("getelementptr inbounds {}, ptr addrspace(1) %A, i64 {oa}", a_step(&k)));
        let b_base = self.v(format!("getelementptr inbounds i16, ptr addrspace(1) %B, i64 {ob}"));
        let st = c_step(k.c_type());
        let c_base = self.v(format!("getelementptr inbounds {st}, ptr addrspace(1) %C, i64 {oc}"));
        let r_base = k
            .epilogue
            .residual
            .then(|| self.v(format!("getelementptr inbounds {st}, ptr addrspace(1) %res, i64 {oc}")));
        let c16_base = k
            .c16_copy
            .then(|| self.v(format!("getelementptr inbounds i16, ptr addrspace(1) %C16, i64 {oc}")));
        Ix {
            tid,
            warp,
            lane,
            m0,
            n0,
            a_base,
            b_base,
            c_base,
            c16_base,
            r_base,
            kt_n: steps,
            k_first: "0".into(),
            batch: bz,
            fold: None,
        }
    }

    /// Each thread's share of a stage's 16-byte copies: A's `bm × bk` tile and B's
    /// tile, chunk `i = tid + j·threads`. Rows of `bk` elements hold `bk/8` chunks;
    /// an N-major B's rows are `bn` wide.
    fn copies(&mut self, ix: &Ix) -> (Vec<Copy>, Vec<Copy>) {
        let k = self.k;
        let threads = k.threads();
        let (ca, cb) = k.chunks();
        if k.a_taps {
            self.taps = Some(self.taps_geometry());
        }
        let mut a = Vec::new();
        for j in 0..ca.div_ceil(threads) {
            let i = self.v(format!("add i32 {}, {}", ix.tid, j * threads));
            let ty = a_step(&self.k);
            if k.a_taps {
                let guard = (ca % threads != 0).then(|| self.v(format!("icmp ult i32 {i}, {ca}")));
                a.push(self.taps_copy(&i, guard, ix));
                continue;
            }
            if self.stages_a() && ca % threads != 0 {
                // A partial round's threads past the tile take chunk `i mod ca`
                // again: the same loads, and the same values stored, as the
                // chunk's own thread (no branch, so that the loads stay ahead
                // of the products: see `Gen::staged_loads`).
                let i = self.v(format!("urem i32 {i}, {ca}"));
                a.push(self.kmajor_copy(&i, None, (&ix.m0, "%M"), (&ix.a_base, "%lda", ty)));
                continue;
            }
            let guard = (ca % threads != 0).then(|| self.v(format!("icmp ult i32 {i}, {ca}")));
            a.push(self.kmajor_copy(&i, guard, (&ix.m0, "%M"), (&ix.a_base, "%lda", ty)));
        }
        let mut b = Vec::new();
        for j in 0..cb.div_ceil(threads) {
            let i = self.v(format!("add i32 {}, {}", ix.tid, j * threads));
            let guard = (cb % threads != 0).then(|| self.v(format!("icmp ult i32 {i}, {cb}")));
            match major(k.b) {
                Major::K => b.push(self.kmajor_copy(&i, guard, (&ix.n0, "%N"), (&ix.b_base, "%ldb", "i16"))),
                Major::N => {
                    let chunks = k.bn / 8;
                    let krow = self.v(format!("udiv i32 {i}, {chunks}"));
                    let c = self.v(format!("urem i32 {i}, {chunks}"));
                    let c8 = self.v(format!("shl i32 {c}, 3"));
                    let gn = self.v(format!("add i32 {}, {c8}", ix.n0));
                    let nok = self.v(format!("icmp slt i32 {gn}, %N"));
                    let ok = self.and_guard(&nok, &guard);
                    let g = self.row_ptr(&ix.b_base, &krow, "%ldb", &gn, "i16");
                    let ldb64 = self.v("sext i32 %ldb to i64");
                    let step = self.v(format!("mul i64 {ldb64}, {}", k.bk()));
                    let soff = if k.arch == Arch::Sm90a {
                        // wgmma's N-major atoms: 64-column blocks of the
                        // tile's K rows, 128 bytes a row (DESC_SW128_NMAJOR).
                        let block = self.v(format!("lshr i32 {c}, 3"));
                        let at = self.v(format!("mul i32 {block}, {}", 128 * k.bk()));
                        let cc = self.v(format!("and i32 {c}, 7"));
                        let sw = self.swizzled(&krow, &cc, 128, 7, 0);
                        self.v(format!("add i32 {at}, {sw}"))
                    } else {
                        self.swizzled(&krow, &c, k.bn * 2, 7, 0)
                    };
                    b.push(Copy { g, step, ok, k0: krow, soff, guard, n_first: Some(gn), taps: None });
                }
            }
        }
        (a, b)
    }

    /// Chunk `i` of a K-major tile (A, or a K-major B): row `i / (bk/8)` of the
    /// operand from `origin` (inside while below `extent`), 8 elements of K at chunk
    /// `i mod (bk/8)`, read from `base` (elements of type `ty`) with row stride `ld`.
    fn kmajor_copy(
        &mut self,
        i: &str,
        guard: Option<String>,
        (origin, extent): (&str, &str),
        (base, ld, ty): (&str, &str, &str),
    ) -> Copy {
        let per_row = self.k.bk() / 8;
        let row = self.v(format!("udiv i32 {i}, {per_row}"));
        let c = self.v(format!("urem i32 {i}, {per_row}"));
        let grow = self.v(format!("add i32 {origin}, {row}"));
        let rok = self.v(format!("icmp slt i32 {grow}, {extent}"));
        let ok = self.and_guard(&rok, &guard);
        let k0 = self.v(format!("shl i32 {c}, 3"));
        let g = self.row_ptr(base, &grow, ld, &k0, ty);
        let soff = self.kmajor_offset(&row, &c);
        Copy { g, step: format!("{}", self.k.bk()), ok, k0, soff, guard, n_first: None, taps: None }
    }

    /// A taps kernel's geometry from its descriptor (`%taps`: the words of
    /// `plan::gpu::OperandCopy::descriptor` for the taps, from word 4 on:
    /// `oh, ow, H, W, C, kw, sh, sw, dh, dw, ph, pw`, then the image's
    /// strides).
    fn taps_geometry(&mut self) -> TapsGeometry {
        let word = |g: &mut Gen, i: usize, wide: bool| {
            let p = g.v(format!("getelementptr i64, ptr addrspace(1) %taps, i64 {}", 4 + i));
            let x = g.v(format!("load i64, ptr addrspace(1) {p}, align 8"));
            if wide {
                x
            } else {
                g.v(format!("trunc i64 {x} to i32"))
            }
        };
        let oh = word(self, 0, false);
        let ow = word(self, 1, false);
        let ohw = self.v(format!("mul i32 {oh}, {ow}"));
        let [h, w, c, kw, sh, sw, dh, dw, ph, pw] = std::array::from_fn(|i| word(self, 2 + i, false));
        let [s_img, s_row, s_pix] = std::array::from_fn(|i| word(self, 12 + i, true));
        let by_c = self.divisor(&c);
        let by_kw = self.divisor(&kw);
        TapsGeometry { ow, ohw, h, w, c, kw, sh, sw, dh, dw, ph, pw, s_img, s_row, s_pix, by_c, by_kw }
    }

    /// The multiplier and shift that divide by `d` (1 ≤ d < 2³¹) any `x` below
    /// 2³¹ (Granlund and Montgomery): `p = 31 + ⌈log₂ d⌉`, `m = ⌈2^p / d⌉`
    /// (below 2³², so `x·m` fits 64 bits), `x / d = (x·m) >> p`. Found once
    /// a thread, so that a step's divisions are a wide multiplication and a
    /// shift each, where a 32-bit division is a routine of about twenty
    /// instructions on the GPU.
    fn divisor(&mut self, d: &str) -> (String, String) {
        let less = self.v(format!("sub i32 {d}, 1"));
        let lz = self.v(format!("call i32 @llvm.ctlz.i32(i32 {less}, i1 false)"));
        let log = self.v(format!("sub i32 32, {lz}"));
        let p = self.v(format!("add i32 {log}, 31"));
        let p64 = self.v(format!("zext i32 {p} to i64"));
        let pow = self.v(format!("shl i64 1, {p64}"));
        let d64 = self.v(format!("zext i32 {d} to i64"));
        let up = self.v(format!("add i64 {pow}, {d64}"));
        let up = self.v(format!("sub i64 {up}, 1"));
        let m = self.v(format!("udiv i64 {up}, {d64}"));
        // Below 2³²: said so, so that the product is one 32 × 32 → 64-bit
        // multiplication (`mul.wide.u32`).
        let m32 = self.v(format!("trunc i64 {m} to i32"));
        let m = self.v(format!("zext i32 {m32} to i64"));
        (m, p64)
    }

    /// `x / d` (x below 2³¹) by `d`'s [`Gen::divisor`].
    fn divide(&mut self, x: &str, (m, p): &(String, String)) -> String {
        let x64 = self.v(format!("zext i32 {x} to i64"));
        let wide = self.v(format!("mul i64 {x64}, {m}"));
        let q = self.v(format!("lshr i64 {wide}, {p}"));
        self.v(format!("trunc i64 {q} to i32"))
    }

    /// Chunk `i` of a taps kernel's A tile: row `i / (bk/8)` an output pixel
    /// (`b, y, x` of `m0` plus the row; inside while below M), 8 channels of
    /// one tap at chunk `i mod (bk/8)` of each step (`Gen::chunk_at` finds the
    /// tap), from the pixel's origin in the image at `ix.a_base`.
    fn taps_copy(&mut self, i: &str, guard: Option<String>, ix: &Ix) -> Copy {
        let per_row = self.k.bk() / 8;
        let row = self.v(format!("udiv i32 {i}, {per_row}"));
        let c = self.v(format!("urem i32 {i}, {per_row}"));
        let grow = self.v(format!("add i32 {}, {row}", ix.m0));
        let rok = self.v(format!("icmp slt i32 {grow}, %M"));
        let ok = self.and_guard(&rok, &guard);
        let k0 = self.v(format!("shl i32 {c}, 3"));
        let t = self.taps.as_ref().expect("the taps' geometry is loaded first");
        let (ohw, ow, sh, sw, ph, pw) =
            (t.ohw.clone(), t.ow.clone(), t.sh.clone(), t.sw.clone(), t.ph.clone(), t.pw.clone());
        let (s_img, s_row, s_pix) = (t.s_img.clone(), t.s_row.clone(), t.s_pix.clone());
        let img = self.v(format!("udiv i32 {grow}, {ohw}"));
        let pix = self.v(format!("urem i32 {grow}, {ohw}"));
        let y = self.v(format!("udiv i32 {pix}, {ow}"));
        let x = self.v(format!("urem i32 {pix}, {ow}"));
        let ys = self.v(format!("mul i32 {y}, {sh}"));
        let y0 = self.v(format!("sub i32 {ys}, {ph}"));
        let xs = self.v(format!("mul i32 {x}, {sw}"));
        let x0 = self.v(format!("sub i32 {xs}, {pw}"));
        let img64 = self.v(format!("zext i32 {img} to i64"));
        let y64 = self.v(format!("sext i32 {y0} to i64"));
        let x64 = self.v(format!("sext i32 {x0} to i64"));
        let oi = self.v(format!("mul i64 {img64}, {s_img}"));
        let oy = self.v(format!("mul i64 {y64}, {s_row}"));
        let ox = self.v(format!("mul i64 {x64}, {s_pix}"));
        let oiy = self.v(format!("add i64 {oi}, {oy}"));
        let off = self.v(format!("add i64 {oiy}, {ox}"));
        let g = self.v(format!("getelementptr i16, ptr addrspace(1) {}, i64 {off}", ix.a_base));
        let soff = self.kmajor_offset(&row, &c);
        Copy { g, step: "0".into(), ok, k0, soff, guard, n_first: None, taps: Some((y0, x0)) }
    }

    fn and_guard(&mut self, ok: &str, guard: &Option<String>) -> String {
        match guard {
            Some(g) => self.v(format!("and i1 {ok}, {g}")),
            None => ok.to_string(),
        }
    }

    /// Where chunk `c` of a K-major tile's row `row` lies: 64-byte rows (mma.sync)
    /// XOR the chunk with bits 1-2 of the row, so that an `ldmatrix` of 8 rows reads
    /// 8 distinct bank groups; 128-byte rows (wgmma) use the 128-byte swizzle the
    /// instruction's descriptors name (chunk XOR row mod 8, in 1024-byte atoms).
    fn kmajor_offset(&mut self, row: &str, c: &str) -> String {
        match self.k.arch {
            Arch::Sm80 | Arch::Simt | Arch::Gemv => self.swizzled(row, c, 64, 3, 1),
            Arch::Sm90a => self.swizzled(row, c, 128, 7, 0),
        }
    }

    /// One K step's copies into the slot of step `kt`: a copy outside the operand
    /// reads 0 bytes and zero-fills; a chunk past a partial round's tile is skipped.
    /// With `staged`, an f32 A's aligned chunks are left to [`Gen::staged_loads`]
    /// and [`Gen::staged_stores`].
    fn load_tile(&mut self, copies: &(Vec<Copy>, Vec<Copy>), kt: &str, k_first: &str, staged: bool) {
        let (a_bytes, _) = self.k.stage_bytes();
        let base = self.slot_base(kt);
        let terms = self.step_terms(kt, k_first);
        for (which, list) in [(0usize, &copies.0), (1, &copies.1)] {
            if which == 0 && staged && self.stages_a() {
                continue;
            }
            for cp in list.iter() {
                let skip = cp.guard.as_ref().map(|in_tile| {
                    let (go, next) = (self.fresh("cp.go"), self.fresh("cp.next"));
                    self.emit(format!("br i1 {in_tile}, label %{go}, label %{next}"));
                    self.block(&go);
                    next
                });
                let f32_chunk = which == 0 && self.k.a_f32;
                let ty = if f32_chunk { "float" } else { "i16" };
                let (kk, ok, raw) = self.chunk_at(cp, &terms, ty, None);
                let fallback = if which == 0 { "%A" } else { "%B" };
                let src =
                    self.v(format!("select i1 {ok}, ptr addrspace(1) {raw}, ptr addrspace(1) {fallback}"));
                let size = self.v(format!("select i1 {ok}, i32 16, i32 0"));
                let tile = if which == 0 {
                    cp.soff.clone()
                } else {
                    self.v(format!("add i32 {}, {a_bytes}", cp.soff))
                };
                let off = self.v(format!("add i32 {base}, {tile}"));
                let dst = self.smem_ptr(&off);
                if self.k.unaligned {
                    self.element_copy(cp, (&raw, &ok, &kk), fallback, &dst, f32_chunk);
                } else if f32_chunk {
                    self.rounded_chunk(&src, &ok, &dst);
                } else {
                    self.emit(format!(
                        "call void @llvm.nvvm.cp.async.cg.shared.global.16.s(ptr addrspace(3) {dst}, ptr addrspace(1) {src}, i32 {size})"
                    ));
                }
                if let Some(next) = skip {
                    self.emit(format!("br label %{next}"));
                    self.block(&next);
                }
            }
        }
    }

    /// Step `kt`'s terms for its chunks' addresses (the step counted from
    /// `k_first`): its first K index and the step as i64.
    fn step_terms(&mut self, kt: &str, k_first: &str) -> (String, String) {
        let bk = self.k.bk();
        let step = self.v(format!("add i32 {kt}, {k_first}"));
        let ktk = self.v(format!("mul i32 {step}, {bk}"));
        let kt64 = self.v(format!("zext i32 {step} to i64"));
        (ktk, kt64)
    }

    /// Chunk `cp` at a step (its [`Gen::step_terms`]): its first K index,
    /// whether it lies inside the operand (and `also`, where given), and its
    /// address, elements of type `ty`.
    fn chunk_at(
        &mut self,
        cp: &Copy,
        (ktk, kt64): &(String, String),
        ty: &str,
        also: Option<&str>,
    ) -> (String, String, String) {
        let kk = self.v(format!("add i32 {}, {ktk}", cp.k0));
        let kok = self.v(format!("icmp slt i32 {kk}, %K"));
        let mut ok = self.v(format!("and i1 {kok}, {}", cp.ok));
        if let Some(also) = also {
            ok = self.v(format!("and i1 {ok}, {also}"));
        }
        if let Some((y0, x0)) = &cp.taps {
            // Column `kk` is channel `kk mod C` of tap `(i, j)`, `kk / C = i·kw + j`,
            // at image row `y0 + i·dh` and column `x0 + j·dw`: zeros outside the image.
            let t = self.taps.as_ref().expect("the taps' geometry is loaded first");
            let (c, kw, dh, dw, h, w) =
                (t.c.clone(), t.kw.clone(), t.dh.clone(), t.dw.clone(), t.h.clone(), t.w.clone());
            let (s_row, s_pix) = (t.s_row.clone(), t.s_pix.clone());
            let (by_c, by_kw) = (t.by_c.clone(), t.by_kw.clone());
            let tap = self.divide(&kk, &by_c);
            let tc = self.v(format!("mul i32 {tap}, {c}"));
            let ch = self.v(format!("sub i32 {kk}, {tc}"));
            let i = self.divide(&tap, &by_kw);
            let ikw = self.v(format!("mul i32 {i}, {kw}"));
            let j = self.v(format!("sub i32 {tap}, {ikw}"));
            let di = self.v(format!("mul i32 {i}, {dh}"));
            let dj = self.v(format!("mul i32 {j}, {dw}"));
            let yi = self.v(format!("add i32 {y0}, {di}"));
            let xj = self.v(format!("add i32 {x0}, {dj}"));
            // Unsigned: a row or column above the image (negative) is past it too.
            let yin = self.v(format!("icmp ult i32 {yi}, {h}"));
            let xin = self.v(format!("icmp ult i32 {xj}, {w}"));
            let inside = self.v(format!("and i1 {yin}, {xin}"));
            ok = self.v(format!("and i1 {ok}, {inside}"));
            let di64 = self.v(format!("zext i32 {di} to i64"));
            let dj64 = self.v(format!("zext i32 {dj} to i64"));
            let ch64 = self.v(format!("zext i32 {ch} to i64"));
            let oy = self.v(format!("mul i64 {di64}, {s_row}"));
            let ox = self.v(format!("mul i64 {dj64}, {s_pix}"));
            let oyx = self.v(format!("add i64 {oy}, {ox}"));
            let off = self.v(format!("add i64 {oyx}, {ch64}"));
            let raw = self.v(format!("getelementptr {ty}, ptr addrspace(1) {}, i64 {off}", cp.g));
            return (kk, ok, raw);
        }
        let adv = self.v(format!("mul i64 {kt64}, {}", cp.step));
        let raw = self.v(format!("getelementptr {ty}, ptr addrspace(1) {}, i64 {adv}", cp.g));
        (kk, ok, raw)
    }

    /// The two 16-byte loads of an f32 chunk at `src`.
    fn f32_chunk_loads(&mut self, src: &str) -> (String, String) {
        let lo = self.v(format!("load <4 x float>, ptr addrspace(1) {src}, align 16"));
        let p = self.v(format!("getelementptr float, ptr addrspace(1) {src}, i64 4"));
        let hi = self.v(format!("load <4 x float>, ptr addrspace(1) {p}, align 16"));
        (lo, hi)
    }

    /// An unaligned kernel's chunk: its 8 elements loaded one by one (a 16-bit load
    /// each, guarded by the chunk's `ok` and the element's index along the chunk's
    /// contiguous dimension; zeros past them, the load then reading the operand's
    /// first element) and stored to `dst` 16 bytes at once. `raw` is the chunk's
    /// address this step and `kk` its first K index (a K-major chunk's index there).
    /// With `f32`, the chunk's elements are f32 (an f32 A's), each rounded to
    /// the operands' type.
    fn element_copy(
        &mut self,
        cp: &Copy,
        (raw, ok, kk): (&str, &str, &str),
        fallback: &str,
        dst: &str,
        f32: bool,
    ) {
        let (first, extent) = match &cp.n_first {
            Some(n) => (n.as_str(), "%N"),
            None => (kk, "%K"),
        };
        let mut v = "zeroinitializer".to_string();
        for e in 0..8 {
            let at = self.v(format!("add i32 {first}, {e}"));
            let inside = self.v(format!("icmp slt i32 {at}, {extent}"));
            let live = self.v(format!("and i1 {ok}, {inside}"));
            let ty = if f32 { "float" } else { "i16" };
            let p = self.v(format!("getelementptr {ty}, ptr addrspace(1) {raw}, i64 {e}"));
            let p = self.v(format!("select i1 {live}, ptr addrspace(1) {p}, ptr addrspace(1) {fallback}"));
            let x = if f32 {
                let x = self.v(format!("load float, ptr addrspace(1) {p}, align 4"));
                let h = elem_ty(self.k.elem);
                let x = self.v(format!("fptrunc float {x} to {h}"));
                self.v(format!("bitcast {h} {x} to i16"))
            } else {
                self.v(format!("load i16, ptr addrspace(1) {p}, align 2"))
            };
            let x = self.v(format!("select i1 {live}, i16 {x}, i16 0"));
            v = self.v(format!("insertelement <8 x i16> {v}, i16 {x}, i32 {e}"));
        }
        self.emit(format!("store <8 x i16> {v}, ptr addrspace(3) {dst}, align 16"));
    }

    /// An f32 A's aligned chunk: 8 values at `src` (two 16-byte loads; `ok`
    /// false: zeros, `src` then the operand's start) rounded to the operands'
    /// type and stored to `dst` 16 bytes at once, where the other chunks are
    /// `cp.async` copies.
    fn rounded_chunk(&mut self, src: &str, ok: &str, dst: &str) {
        let (lo, hi) = self.f32_chunk_loads(src);
        let x = self.v(format!(
            "shufflevector <4 x float> {lo}, <4 x float> {hi}, <8 x i32> <i32 0, i32 1, i32 2, i32 3, i32 4, i32 5, i32 6, i32 7>"
        ));
        self.round_and_store(&x, ok, dst);
    }

    /// 8 f32 values `x` rounded to the operands' type and stored to `dst` (zeros
    /// where `ok` is false).
    fn round_and_store(&mut self, x: &str, ok: &str, dst: &str) {
        let h = elem_ty(self.k.elem);
        // Rounded a value at a time (`cvt.rn`), as the emulator rewrites them.
        let mut b = "zeroinitializer".to_string();
        for e in 0..8 {
            let f = self.v(format!("extractelement <8 x float> {x}, i32 {e}"));
            let r = self.v(format!("fptrunc float {f} to {h}"));
            let i = self.v(format!("bitcast {h} {r} to i16"));
            b = self.v(format!("insertelement <8 x i16> {b}, i16 {i}, i32 {e}"));
        }
        let z = self.v(format!("select i1 {ok}, <8 x i16> {b}, <8 x i16> zeroinitializer"));
        self.emit(format!("store <8 x i16> {z}, ptr addrspace(3) {dst}, align 16"));
    }

    /// The first `ahead` steps in flight, a group committed for each (empty past
    /// the last step, so that the wait counts hold); returns the block that enters
    /// the loop.
    fn prologue(&mut self, ix: &Ix, copies: &(Vec<Copy>, Vec<Copy>), ahead: usize) -> String {
        for s in 0..ahead {
            let has = self.v(format!("icmp slt i32 {s}, {}", ix.kt_n));
            let (go, next) = (self.fresh("pro.load"), self.fresh("pro.next"));
            self.emit(format!("br i1 {has}, label %{go}, label %{next}"));
            self.block(&go);
            self.load_tile(copies, &s.to_string(), &ix.k_first, false);
            self.emit(format!("br label %{next}"));
            self.block(&next);
            self.emit("call void @llvm.nvvm.cp.async.commit.group()");
        }
        let pre = self.fresh("pre");
        self.emit(format!("br label %{pre}"));
        self.block(&pre);
        self.emit("br label %loop");
        pre
    }

    /// The main loop's head: wait until step `%kt`'s copies have landed (`ahead - 1`
    /// later groups may stay in flight), make them visible (to wgmma's async proxy
    /// too, with `async_proxy`) and wait for every thread; then issue the copies of
    /// step `%kt + ahead` (into the buffer every thread has finished reading) and
    /// commit them, and an f32 A's loads for that step ([`Gen::staged_loads`]).
    /// Returns the byte offset of step `%kt`'s buffer and those loads.
    fn loop_head(
        &mut self,
        ix: &Ix,
        copies: &(Vec<Copy>, Vec<Copy>),
        ahead: usize,
        async_proxy: bool,
    ) -> (String, Vec<Staged>) {
        self.emit(format!("call void @llvm.nvvm.cp.async.wait.group(i32 {})", ahead - 1));
        if async_proxy {
            self.emit("call void asm sideeffect \"fence.proxy.async.shared::cta;\", \"~{memory}\"()");
        }
        self.emit("call void @llvm.nvvm.barrier0()");
        let pf = self.v(format!("add i32 %kt, {ahead}"));
        let has = self.v(format!("icmp slt i32 {pf}, {}", ix.kt_n));
        self.emit(format!("br i1 {has}, label %loop.load, label %loop.mma"));
        self.block("loop.load");
        self.load_tile(copies, &pf, &ix.k_first, true);
        self.emit("br label %loop.mma");
        self.block("loop.mma");
        self.emit("call void @llvm.nvvm.cp.async.commit.group()");
        let staged =
            if self.stages_a() { self.staged_loads(copies, &pf, &has, &ix.k_first) } else { Vec::new() };
        (self.slot_base("%kt"), staged)
    }

    /// The staged stores after a step's products, then the block the loop's
    /// back edge leaves from (`loop.mma` when nothing is staged).
    fn staged_latch(&mut self, staged: &[Staged]) -> String {
        if staged.is_empty() {
            return "loop.mma".into();
        }
        self.staged_stores(staged);
        self.emit("br label %loop.latch");
        self.block("loop.latch");
        "loop.latch".into()
    }

    /// Whether an f32 A's chunks go through registers across a step's products
    /// (the aligned kernels; an element-by-element cover loads them in place).
    fn stages_a(&self) -> bool {
        self.k.a_f32 && !self.k.unaligned
    }

    /// An f32 A's loads of step `kt`'s chunks (`has`: the step exists), issued
    /// before the current step's products so that their latency overlaps them,
    /// where `cp.async` would copy 16-bit chunks asynchronously; a load outside
    /// the operand reads its start and is stored as zeros.
    fn staged_loads(
        &mut self,
        copies: &(Vec<Copy>, Vec<Copy>),
        kt: &str,
        has: &str,
        k_first: &str,
    ) -> Vec<Staged> {
        let base = self.slot_base(kt);
        let terms = self.step_terms(kt, k_first);
        let mut out = Vec::new();
        for cp in &copies.0 {
            let (_, ok, raw) = self.chunk_at(cp, &terms, "float", Some(has));
            let src = self.v(format!("select i1 {ok}, ptr addrspace(1) {raw}, ptr addrspace(1) %A"));
            let (lo, hi) = self.f32_chunk_loads(&src);
            let off = self.v(format!("add i32 {base}, {}", cp.soff));
            out.push(Staged { lo, hi, ok, off });
        }
        out
    }

    /// The staged loads rounded and stored to their step's buffer after the
    /// current step's products: that buffer is the one read a step before the
    /// barrier at this step's top (or two with a wgmma group in flight), so
    /// every thread is done with it, and the next step's barrier publishes the
    /// stores. A step past the last stores zeros that nothing reads.
    fn staged_stores(&mut self, staged: &[Staged]) {
        for st in staged {
            let x = self.v(format!(
                "shufflevector <4 x float> {}, <4 x float> {}, <8 x i32> <i32 0, i32 1, i32 2, i32 3, i32 4, i32 5, i32 6, i32 7>",
                st.lo, st.hi
            ));
            let dst = self.smem_ptr(&st.off);
            self.round_and_store(&x, &st.ok, &dst);
        }
    }

    /// Closes the loop: its phis (k step and accumulators) placed at its head, now
    /// that the latch's values are known.
    fn close_loop(
        &mut self,
        head: usize,
        pre: &str,
        kt1: &str,
        latch: &str,
        acc: &[String],
        next: &[String],
    ) {
        let mut phis = format!("  %kt = phi i32 [ 0, %{pre} ], [ {kt1}, %{latch} ]\n");
        for (a, n) in acc.iter().zip(next) {
            let _ = writeln!(phis, "  {a} = phi float [ 0.0, %{pre} ], [ {n}, %{latch} ]");
        }
        self.body.insert_str(head, &phis);
    }

    fn generate(mut self) -> String {
        let k = self.k;
        if k.stream_k && !k.tma {
            return self.stream_k();
        }
        let ix = self.indices(None);
        if k.tma {
            self.tma_kernel(&ix);
            return self.finish();
        }
        let copies = self.copies(&ix);
        let frags = match k.arch {
            Arch::Sm80 => self.mma_loop(&ix, &copies),
            Arch::Sm90a => self.wgmma_loop(&ix, &copies),
            Arch::Simt => return simt_ir(&k),
            Arch::Gemv => return gemv_ir(&k),
        };
        self.epilogue(&ix, &frags);
        self.finish()
    }

    /// A Stream-K kernel (`GemmKernel::stream_k`): block `b` of `G` walks the
    /// steps `⌊b·I/G⌋ .. ⌊(b+1)·I/G⌋` of all the tiles' `I` K steps, a unit (a
    /// tile's run of steps) at a time: the unsplit kernel's copies, main loop
    /// and epilogue over the unit's steps, folding where the unit is not the
    /// whole tile (`Gen::stream_fold_at`). Every thread is past the unit's
    /// stores and reads before the next unit's copies start.
    fn stream_k(mut self) -> String {
        let k = self.k;
        let grid = self.tile_grid();
        let range = self.stream_range(&grid);
        self.emit("br label %unit.head");
        self.block("unit.head");
        let phi_at = self.body.len();
        let more = self.v(format!("icmp ult i64 %unit.x, {}", range.end));
        self.emit(format!("br i1 {more}, label %unit.body, label %unit.exit"));
        self.block("unit.body");
        let unit = self.stream_unit("%unit.x", range.clone());
        let mut ix = self.indices(Some((&unit.tile, &grid)));
        ix.k_first = unit.kb.clone();
        ix.kt_n = unit.span.clone();
        let copies = self.copies(&ix);
        let frags = match k.arch {
            Arch::Sm80 => self.mma_loop(&ix, &copies),
            _ => self.wgmma_loop(&ix, &copies),
        };
        ix.fold = Some(self.stream_fold_at(&unit));
        self.epilogue(&ix, &frags);
        self.block("unit.next");
        self.emit("call void @llvm.nvvm.barrier0()");
        let spanx = self.v(format!("zext i32 {} to i64", unit.span));
        let next = self.v(format!("add i64 %unit.x, {spanx}"));
        self.emit("br label %unit.head");
        let phi = format!("  %unit.x = phi i64 [ {}, %entry ], [ {next}, %unit.next ]\n", range.start);
        self.body.insert_str(phi_at, &phi);
        self.block("unit.exit");
        self.emit("ret void");
        self.finish()
    }

    /// A Stream-K block's steps of the `grid` of tiles: `⌊b·I/G⌋` to
    /// `⌊(b+1)·I/G⌋` of `I` = tiles × K steps, `G` blocks.
    fn stream_range(&mut self, grid: &(String, String)) -> StreamRange {
        let tiles = self.v(format!("mul i32 {}, {}", grid.0, grid.1));
        let bk = self.k.bk();
        let kr = self.v(format!("add i32 %K, {}", bk - 1));
        let steps = self.v(format!("udiv i32 {kr}, {bk}"));
        let tiles64 = self.v(format!("zext i32 {tiles} to i64"));
        let steps64 = self.v(format!("zext i32 {steps} to i64"));
        let iters = self.v(format!("mul i64 {tiles64}, {steps64}"));
        let b = self.v("call i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()");
        let g = self.v("call i32 @llvm.nvvm.read.ptx.sreg.nctaid.x()");
        let b64 = self.v(format!("zext i32 {b} to i64"));
        let g64 = self.v(format!("zext i32 {g} to i64"));
        let s0 = self.v(format!("mul i64 {b64}, {iters}"));
        let start = self.v(format!("udiv i64 {s0}, {g64}"));
        let b1 = self.v(format!("add i64 {b64}, 1"));
        let e0 = self.v(format!("mul i64 {b1}, {iters}"));
        let end = self.v(format!("udiv i64 {e0}, {g64}"));
        StreamRange { steps, steps64, iters, b64, g64, start, end }
    }

    /// The unit at step `x` (i64) of a Stream-K block's `range`: its tile, its
    /// first step in the tile and its steps (to the tile's end or the range's).
    fn stream_unit(&mut self, x: &str, range: StreamRange) -> StreamUnit {
        let StreamRange { ref steps, ref steps64, ref end, .. } = range;
        let t64 = self.v(format!("udiv i64 {x}, {steps64}"));
        let tile = self.v(format!("trunc i64 {t64} to i32"));
        let base = self.v(format!("mul i64 {t64}, {steps64}"));
        let kb64 = self.v(format!("sub i64 {x}, {base}"));
        let kb = self.v(format!("trunc i64 {kb64} to i32"));
        let room = self.v(format!("sub i32 {steps}, {kb}"));
        let room64 = self.v(format!("zext i32 {room} to i64"));
        let left = self.v(format!("sub i64 {end}, {x}"));
        let short = self.v(format!("icmp ult i64 {left}, {room64}"));
        let span64 = self.v(format!("select i1 {short}, i64 {left}, i64 {room64}"));
        let span = self.v(format!("trunc i64 {span64} to i32"));
        StreamUnit { tile, base, kb, span, range }
    }

    /// A Stream-K unit's share of its tile (counted once the main loop is done,
    /// so as not to keep it live through it): its index, the block less the
    /// tile's first block (the block of step `x` is `⌊((x+1)·G − 1)/I⌋`); the
    /// tile's shares; whether the unit is the whole tile.
    fn stream_fold_at(&mut self, unit: &StreamUnit) -> FoldAt {
        let StreamUnit { tile, base, kb, span, range } = unit;
        let StreamRange { steps, steps64, iters, b64, g64, .. } = range;
        let from0 = self.v(format!("icmp eq i32 {kb}, 0"));
        let all = self.v(format!("icmp eq i32 {span}, {steps}"));
        let whole = self.v(format!("and i1 {from0}, {all}"));
        let block_of = |gen: &mut Gen, x: &str| {
            let x1 = gen.v(format!("add i64 {x}, 1"));
            let xg = gen.v(format!("mul i64 {x1}, {g64}"));
            let xg1 = gen.v(format!("add i64 {xg}, -1"));
            gen.v(format!("udiv i64 {xg1}, {iters}"))
        };
        let first = block_of(self, base);
        let last_step = self.v(format!("add i64 {base}, {steps64}"));
        let last_step = self.v(format!("add i64 {last_step}, -1"));
        let last = block_of(self, &last_step);
        let own = self.v(format!("sub i64 {b64}, {first}"));
        let share = self.v(format!("trunc i64 {own} to i32"));
        let span_b = self.v(format!("sub i64 {last}, {first}"));
        let span_b = self.v(format!("trunc i64 {span_b} to i32"));
        let shares = self.v(format!("add i32 {span_b}, 1"));
        let shares = Shares::Stream { shares, slots: "%kper".into() };
        FoldAt { tile: tile.clone(), share, shares, whole: Some(whole) }
    }

    /// Where a unit's threads go once its C is stored (or its share counted): the
    /// next unit of a Stream-K kernel (a TMA one's consumers: their next
    /// tile's head), the end of another.
    fn leave(&mut self) {
        match (self.k.stream_k, self.k.tma) {
            (true, true) => self.emit("br label %tile.c.next"),
            (true, false) => self.emit("br label %unit.next"),
            _ => self.emit("ret void"),
        }
    }

    /// Where a folding block's threads meet: all of them, or a TMA kernel's
    /// consumers alone (the producer runs on into the next unit's stages).
    fn fold_barrier(&mut self) {
        if self.k.tma {
            let threads = 32 * self.k.warps();
            self.emit(format!("call void asm sideeffect \"bar.sync 1, {threads};\", \"~{{memory}}\"()"));
        } else {
            self.emit("call void @llvm.nvvm.barrier0()");
        }
    }

    /// The shared word that tells a folding block whether it is its tile's
    /// last: the stage buffers' first (idle by then), or past a TMA kernel's
    /// barriers (`GemmKernel::barrier_bytes`: its stages may be filling).
    fn fold_word(&mut self) -> String {
        if self.k.tma {
            let (a, b) = self.k.stage_bytes();
            let at = self.k.stages * (a + b) + 16 * self.k.stages;
            self.smem_ptr(&at.to_string())
        } else {
            "@smem".to_string()
        }
    }

    /// The mma.sync main loop; returns the accumulators as m16n8 fragments.
    fn mma_loop(&mut self, ix: &Ix, copies: &(Vec<Copy>, Vec<Copy>)) -> Vec<Frag> {
        let k = self.k;
        let (wm, wn) = k.warp_tile();
        let (a_bytes, _) = k.stage_bytes();
        let lane = ix.lane.clone();
        let wmi = self.v(format!("udiv i32 {}, {}", ix.warp, k.warps_n));
        let wni = self.v(format!("urem i32 {}, {}", ix.warp, k.warps_n));
        // ldmatrix offsets within a stage (lane-dependent, loop-invariant), per k16
        // half `kk` of the 32-wide step.
        let mut a_frag_off = vec![vec![String::new(); 2]; wm / 16];
        for (mi, offs) in a_frag_off.iter_mut().enumerate() {
            for (kk, off) in offs.iter_mut().enumerate() {
                let l16 = self.v(format!("and i32 {lane}, 15"));
                let wrow = self.v(format!("mul i32 {wmi}, {wm}"));
                let r0 = self.v(format!("add i32 {wrow}, {}", mi * 16));
                let row = self.v(format!("add i32 {r0}, {l16}"));
                let hi = self.v(format!("lshr i32 {lane}, 4"));
                let c = self.v(format!("add i32 {hi}, {}", kk * 2));
                *off = self.kmajor_offset(&row, &c);
            }
        }
        let mut b_frag_off = vec![vec![String::new(); 2]; wn / 16];
        for (ni2, offs) in b_frag_off.iter_mut().enumerate() {
            for (kk, off) in offs.iter_mut().enumerate() {
                let wcol = self.v(format!("mul i32 {wni}, {wn}"));
                let s = match major(k.b) {
                    Major::K => {
                        // Rows n: lanes 0-7 and 8-15 the first 8 columns (k halves 0, 1),
                        // lanes 16-31 the next 8.
                        let l8 = self.v(format!("and i32 {lane}, 7"));
                        let hi = self.v(format!("lshr i32 {lane}, 4"));
                        let hi8 = self.v(format!("shl i32 {hi}, 3"));
                        let r0 = self.v(format!("add i32 {wcol}, {}", ni2 * 16));
                        let r1 = self.v(format!("add i32 {r0}, {l8}"));
                        let row = self.v(format!("add i32 {r1}, {hi8}"));
                        let mid = self.v(format!("lshr i32 {lane}, 3"));
                        let mid1 = self.v(format!("and i32 {mid}, 1"));
                        let c = self.v(format!("add i32 {mid1}, {}", kk * 2));
                        self.kmajor_offset(&row, &c)
                    }
                    Major::N => {
                        // Rows k: lanes 0-7 k 0-7, 8-15 k 8-15 (the first 8 columns),
                        // lanes 16-31 the same k for the next 8 columns.
                        let l8 = self.v(format!("and i32 {lane}, 7"));
                        let mid = self.v(format!("lshr i32 {lane}, 3"));
                        let mid1 = self.v(format!("and i32 {mid}, 1"));
                        let mid8 = self.v(format!("shl i32 {mid1}, 3"));
                        let r1 = self.v(format!("add i32 {l8}, {mid8}"));
                        let krow = self.v(format!("add i32 {r1}, {}", kk * 16));
                        let hi = self.v(format!("lshr i32 {lane}, 4"));
                        let col = self.v(format!("add i32 {wcol}, {}", ni2 * 16));
                        let c0 = self.v(format!("lshr i32 {col}, 3"));
                        let c = self.v(format!("add i32 {c0}, {hi}"));
                        self.swizzled(&krow, &c, k.bn * 2, 7, 0)
                    }
                };
                *off = self.v(format!("add i32 {s}, {a_bytes}"));
            }
        }

        let pre = self.prologue(ix, copies, k.stages - 1);
        self.block("loop");
        let head = self.body.len();
        let accs = k.accumulators();
        let acc_names: Vec<String> = (0..accs).map(|i| format!("%acc{i}")).collect();
        let (base, staged) = self.loop_head(ix, copies, k.stages - 1, false);
        let mut cur: Vec<String> = acc_names.clone();
        let ntiles = wn / 8;
        for kk in 0..2 {
            let mut afr = Vec::new();
            for offs in &a_frag_off {
                let off = self.v(format!("add i32 {base}, {}", offs[kk]));
                let p = self.smem_ptr(&off);
                let r = self.v(format!("call {{i32, i32, i32, i32}} @llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.b16(ptr addrspace(3) {p})"));
                afr.push(
                    (0..4)
                        .map(|x| self.v(format!("extractvalue {{i32, i32, i32, i32}} {r}, {x}")))
                        .collect::<Vec<_>>(),
                );
            }
            let mut bfr = Vec::new();
            let ld = match major(k.b) {
                Major::K => "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.b16",
                Major::N => "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.trans.b16",
            };
            for offs in &b_frag_off {
                let off = self.v(format!("add i32 {base}, {}", offs[kk]));
                let p = self.smem_ptr(&off);
                let r = self.v(format!("call {{i32, i32, i32, i32}} @{ld}(ptr addrspace(3) {p})"));
                let x: Vec<String> =
                    (0..4).map(|x| self.v(format!("extractvalue {{i32, i32, i32, i32}} {r}, {x}"))).collect();
                bfr.push(vec![x[0].clone(), x[1].clone()]);
                bfr.push(vec![x[2].clone(), x[3].clone()]);
            }
            for (mi, a) in afr.iter().enumerate() {
                for (ni, b) in bfr.iter().enumerate() {
                    let at = (mi * ntiles + ni) * 4;
                    let args: Vec<String> = a.iter().chain(b.iter()).map(|x| self.operand(x)).collect();
                    let c: Vec<String> = (0..4).map(|x| format!("float {}", cur[at + x])).collect();
                    let intrinsic = match half(k.elem) {
                        Half::Bf16 => "llvm.nvvm.mma.m16n8k16.row.col.bf16",
                        Half::F16 => "llvm.nvvm.mma.m16n8k16.row.col.f32.f32",
                    };
                    let r = self.v(format!(
                        "call {{float, float, float, float}} @{intrinsic}({}, {})",
                        args.join(", "),
                        c.join(", ")
                    ));
                    for x in 0..4 {
                        cur[at + x] = self.v(format!("extractvalue {{float, float, float, float}} {r}, {x}"));
                    }
                }
            }
        }
        let latch = self.staged_latch(&staged);
        let kt1 = self.v("add i32 %kt, 1");
        let again = self.v(format!("icmp slt i32 {kt1}, {}", ix.kt_n));
        self.emit(format!("br i1 {again}, label %loop, label %epilogue"));
        self.close_loop(head, &pre, &kt1, &latch, &acc_names, &cur);

        // The accumulators leave the loop from its latch (the only way out).
        self.block("epilogue");
        let wrow = self.v(format!("mul i32 {wmi}, {wm}"));
        let wcol = self.v(format!("mul i32 {wni}, {wn}"));
        let mut frags = Vec::new();
        for mi in 0..wm / 16 {
            for ni in 0..ntiles {
                let at = (mi * ntiles + ni) * 4;
                let row = self.v(format!("add i32 {wrow}, {}", mi * 16));
                let col = self.v(format!("add i32 {wcol}, {}", ni * 8));
                frags.push(Frag { row, col, vals: [0, 1, 2, 3].map(|x| cur[at + x].clone()) });
            }
        }
        frags
    }

    /// The wgmma main loop: each warpgroup multiplies its 64 rows of the A tile by
    /// the whole B tile, four `m64n{bn}k16` instructions a 64-wide K step, issued in
    /// one asm statement (nothing may touch the accumulators between them), reading
    /// both operands from shared memory through descriptors. The copies for a later
    /// step are issued before the step's products, so that they overlap. Without
    /// `overlap` each step's group is waited for at its end and the copies run
    /// `stages - 1` steps ahead; with it one group stays in flight (waited for when
    /// the next is issued), so the buffer it reads is not refilled: the copies run
    /// `stages - 2` ahead, into the buffer of the step two back, which the barrier
    /// at the step's top has seen every warpgroup finish.
    fn wgmma_loop(&mut self, ix: &Ix, copies: &(Vec<Copy>, Vec<Copy>)) -> Vec<Frag> {
        let k = self.k;
        let wg = self.v(format!("lshr i32 {}, 7", ix.tid));
        let wg_a = self.v(format!("mul i32 {wg}, {}", 64 * 128));
        let smem0 = self.v("ptrtoint ptr addrspace(3) @smem to i32");
        let ahead = if k.overlap { k.stages - 2 } else { k.stages - 1 };

        let pre = self.prologue(ix, copies, ahead);
        self.block("loop");
        let head = self.body.len();
        let accs = k.accumulators();
        let acc_names: Vec<String> = (0..accs).map(|i| format!("%acc{i}")).collect();
        let (base, staged) = self.loop_head(ix, copies, ahead, true);
        let at = self.v(format!("add i32 {smem0}, {base}"));
        let cur = self.wgmma_products(&at, &wg_a, &acc_names, usize::from(k.overlap));
        let latch = self.staged_latch(&staged);
        let kt1 = self.v("add i32 %kt, 1");
        let again = self.v(format!("icmp slt i32 {kt1}, {}", ix.kt_n));
        self.emit(format!("br i1 {again}, label %loop, label %epilogue"));
        self.close_loop(head, &pre, &kt1, &latch, &acc_names, &cur);
        self.block("epilogue");
        self.wgmma_frags(ix, cur, k.overlap)
    }

    /// The warp-specialized TMA kernel, epilogue included. Thread 0 sets up the
    /// barriers: per stage a `full` one (one arrival, the producer's, plus the stage's
    /// bytes) and an `empty` one (one arrival per consumer warp). The producer
    /// warpgroup (threads 0-127; with two consumers it first gives back registers)
    /// has one thread issue, per K step, a wait for the stage's `empty` phase, the
    /// byte count, and A's and B's tiles as two TMA copies that complete on `full`.
    /// The consumers (the rest, counted from 0 in `ix`) wait for `full`, issue the
    /// step's products, keep one group in flight and release the previous step's
    /// stage (the last one once its products are waited for). Phases alternate per
    /// round of the stages: round r waits for parity r mod 2 on `full` and, on
    /// `empty`, for the opposite (the first round's wait passes at once). A
    /// persistent kernel runs this over its tiles, the steps counted across them, so
    /// that the producer fills the next tile's stages during the epilogue. A
    /// ping-pong kernel's consumers take every other tile each (`take_turn`): a
    /// stage is one consumer's, released by its 4 warps; a consumer gives the
    /// other its turn once it has waited for its tile's last stage, and stores
    /// while the other multiplies.
    fn tma_kernel(&mut self, ix: &Ix) {
        let k = self.k;
        let s = k.stages;
        let (a_bytes, b_bytes) = k.stage_bytes();
        let smem0 = self.v("ptrtoint ptr addrspace(3) @smem to i32");
        let bars = self.v(format!("add i32 {smem0}, {}", s * (a_bytes + b_bytes)));
        let first = self.v(format!("icmp eq i32 {}, -{TMA_PRODUCER_THREADS}", ix.tid));
        self.emit(format!("br i1 {first}, label %init, label %role"));
        self.block("init");
        for i in 0..s {
            let full = self.v(format!("add i32 {bars}, {}", 8 * i));
            let empty = self.v(format!("add i32 {bars}, {}", 8 * (s + i)));
            for (bar, count) in [(full, 1), (empty, 4 * k.stage_readers())] {
                self.emit(format!(
                    "call void asm sideeffect \"mbarrier.init.shared::cta.b64 [$0], $1;\", \"r,r,~{{memory}}\"(i32 {bar}, i32 {count})"
                ));
            }
        }
        if k.pingpong {
            // Each consumer's turn: every thread of the other arrives once a phase.
            for w in 0..2 {
                let turn = self.v(format!("add i32 {bars}, {}", 8 * (2 * s + w)));
                self.emit(format!(
                    "call void asm sideeffect \"mbarrier.init.shared::cta.b64 [$0], $1;\", \"r,r,~{{memory}}\"(i32 {turn}, i32 128)"
                ));
            }
        }
        // The barriers' initial state made visible to the copies' completions.
        self.emit("call void asm sideeffect \"fence.mbarrier_init.release.cluster;\", \"~{memory}\"()");
        self.emit("br label %role");
        self.block("role");
        self.emit("call void @llvm.nvvm.barrier0()");
        let producer = self.v(format!("icmp slt i32 {}, 0", ix.tid));
        self.emit(format!("br i1 {producer}, label %producer, label %consumer"));

        self.block("producer");
        if let Some((regs, _)) = k.register_split() {
            self.emit(format!(
                "call void asm sideeffect \"setmaxnreg.dec.sync.aligned.u32 {regs};\", \"~{{memory}}\"()"
            ));
        }
        self.emit(format!("br i1 {first}, label %produce.pre, label %done"));
        self.block("produce.pre");
        for tm in ["%tmA", "%tmB"] {
            self.emit(format!(
                "call void asm sideeffect \"prefetch.tensormap [$0];\", \"l,~{{memory}}\"(ptr {tm})"
            ));
        }
        let (pix, pg, into, tiles) = self.tile_loop_head("p", ix, ("produce.pre", "produce"), None);
        self.block("produce");
        let head = self.body.len();
        let g = self.v(format!("add i32 {pg}, %pk"));
        let (slot, round) = self.stage_of(&g);
        let odd = self.v(format!("and i32 {round}, 1"));
        let parity = self.v(format!("xor i32 {odd}, 1"));
        let empty = self.barrier(&bars, &slot, s);
        self.wait_barrier(&empty, &parity);
        let full = self.barrier(&bars, &slot, 0);
        self.emit(format!(
            "call void asm sideeffect \"mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;\", \"r,r,~{{memory}}\"(i32 {full}, i32 {})",
            a_bytes + b_bytes
        ));
        let step = self.v(format!("add i32 %pk, {}", pix.k_first));
        let kc = self.v(format!("mul i32 {step}, {}", k.bk()));
        let off = self.v(format!("mul i32 {slot}, {}", a_bytes + b_bytes));
        let dst_a = self.v(format!("add i32 {smem0}, {off}"));
        let dst_b = self.v(format!("add i32 {dst_a}, {a_bytes}"));
        // A's box (and a K-major B's): `bk` columns of K by the tile's rows. An
        // N-major B's: a box of 64 columns of N by the step's K rows for each
        // 64-column block of the tile (wgmma's N-major atoms, 128 bytes a K row).
        let mut boxes = vec![(dst_a.clone(), "%tmA", kc.clone(), pix.m0.clone())];
        match major(k.b) {
            Major::K => boxes.push((dst_b.clone(), "%tmB", kc.clone(), pix.n0.clone())),
            Major::N => {
                for j in 0..k.bn / 64 {
                    let dst = self.v(format!("add i32 {dst_b}, {}", j * 128 * k.bk()));
                    let col = self.v(format!("add i32 {}, {}", pix.n0, 64 * j));
                    boxes.push((dst, "%tmB", col, kc.clone()));
                }
            }
        }
        for (dst, tm, col, row) in boxes {
            self.emit(format!(
                "call void asm sideeffect \"cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [$0], [$1, {{$2, $3, $4}}], [$5];\", \"r,l,r,r,r,r,~{{memory}}\"(i32 {dst}, ptr {tm}, i32 {col}, i32 {row}, i32 {}, i32 {full})",
                pix.batch
            ));
        }
        let pk1 = self.v("add i32 %pk, 1");
        let more = self.v(format!("icmp slt i32 {pk1}, {}", pix.kt_n));
        let after = if k.persistent { "tile.p.next" } else { "done" };
        self.emit(format!("br i1 {more}, label %produce, label %{after}"));
        self.body.insert_str(head, &format!("  %pk = phi i32 [ 0, %{into} ], [ {pk1}, %produce ]\n"));
        self.tile_loop_tail("p", &pix, &tiles);
        self.block("done");
        self.emit("ret void");

        self.block("consumer");
        if let Some((_, regs)) = k.register_split() {
            self.emit(format!(
                "call void asm sideeffect \"setmaxnreg.inc.sync.aligned.u32 {regs};\", \"~{{memory}}\"()"
            ));
        }
        let wg = self.v(format!("lshr i32 {}, 7", ix.tid));
        // A ping-pong consumer's tile is its own: its A rows start the stage's.
        let wg_a = if k.pingpong { "0".to_string() } else { self.v(format!("mul i32 {wg}, {}", 64 * 128)) };
        let lane0 = self.v(format!("icmp eq i32 {}, 0", ix.lane));
        let body = if k.pingpong { "turn" } else { "loop" };
        let turn = k.pingpong.then_some(wg.as_str());
        let (cix, cg, mut into, tiles) = self.tile_loop_head("c", ix, ("consumer", body), turn);
        if k.pingpong {
            self.take_turn(&bars, &wg, &cix, &cg);
            into = "turn".into();
        }
        self.block("loop");
        let head = self.body.len();
        let acc_names: Vec<String> = (0..k.accumulators()).map(|i| format!("%acc{i}")).collect();
        let g = self.v(format!("add i32 {cg}, %kt"));
        let (slot, round) = self.stage_of(&g);
        let parity = self.v(format!("and i32 {round}, 1"));
        let full = self.barrier(&bars, &slot, 0);
        self.wait_barrier(&full, &parity);
        let off = self.v(format!("mul i32 {slot}, {}", a_bytes + b_bytes));
        let at = self.v(format!("add i32 {smem0}, {off}"));
        let cur = self.wgmma_products(&at, &wg_a, &acc_names, 1);
        // The previous step's products are complete: its stage goes back to the
        // producer (step g - 1, as g + stages - 1: the same stage, never negative).
        let prev = self.v(format!("add i32 {g}, {}", s - 1));
        let later = self.v("icmp ne i32 %kt, 0");
        let arrive = self.v(format!("and i1 {later}, {lane0}"));
        self.release(&bars, &prev, &arrive);
        let kt1 = self.v("add i32 %kt, 1");
        let again = self.v(format!("icmp slt i32 {kt1}, {}", cix.kt_n));
        self.emit(format!("br i1 {again}, label %loop, label %epilogue"));
        self.close_loop(head, &into, &kt1, "loop", &acc_names, &cur);
        self.block("epilogue");
        if k.pingpong {
            // Every stage of the tile has been waited for: the other consumer's turn.
            let other = self.v(format!("xor i32 {wg}, 1"));
            let turn = self.barrier(&bars, &other, 2 * s);
            self.arrive_if("1", &turn);
        }
        let frags = self.wgmma_frags(&cix, cur, true);
        // The last step's products are complete too: a persistent kernel's producer
        // may fill its stage with the next tile's while this one is stored.
        // (As g + stages: the stage of step g, written as the code checked on the device.)
        let last = self.v(format!("add i32 {g}, {s}"));
        self.release(&bars, &last, &lane0);
        if k.persistent {
            let frags = match self.unit.take() {
                Some(unit) => {
                    let at = self.stream_fold_at(&unit);
                    self.fold_shares(&cix.tid, &at, &frags)
                }
                None => frags,
            };
            self.staged_epilogue(&cix, &frags);
            self.emit("br label %tile.c.next");
            self.tile_loop_tail("c", &cix, &tiles);
            self.block("finished");
            self.emit("ret void");
        } else if k.split_k || k.epilogue.residual || k.c_f32 {
            // Split-K shares and f32 outputs (whose tiles would take twice the
            // staging) and residual epilogues (whose per-element loads beside 128
            // live accumulators spill) store straight from the fragments.
            self.epilogue(&cix, &frags);
        } else {
            self.staged_epilogue(&cix, &frags);
            self.emit("ret void");
        }
    }

    /// Where a role's loop over tiles begins (`role` "p" for the producer, "c" for
    /// the consumers), entered from block `from`: in a persistent kernel a block
    /// `tile.{role}` with the tile (from `blockIdx.x`, `gridDim.x` apart) and the K
    /// steps done before it as phis, and that tile's indices; otherwise `ix` and no
    /// steps before. Branches to `body`; returns the indices, the steps before, the
    /// block that enters `body`, and the tiles along N and M (`tile_grid`, computed
    /// once before the loop; "0" when there is no loop). `turn`: a ping-pong
    /// consumer's warpgroup (0 or 1), which takes every other tile from its own.
    fn tile_loop_head(
        &mut self,
        role: &str,
        ix: &Ix,
        (from, body): (&str, &str),
        turn: Option<&str>,
    ) -> (Ix, String, String, (String, String)) {
        if !self.k.persistent {
            self.emit(format!("br label %{body}"));
            return (ix.clone(), "0".into(), from.to_string(), ("0".into(), "0".into()));
        }
        if self.k.stream_k {
            return self.stream_loop_head(role, (from, body));
        }
        let t0 = self.v("call i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()");
        let grid = self.tile_grid();
        let (t0, g0) = if let Some(w) = turn {
            // Consumer w takes the block's tiles w, w + 2, …: its first is w
            // tiles on, its steps counted from w tiles' steps, if there is one.
            let blocks = self.v("call i32 @llvm.nvvm.read.ptx.sreg.nctaid.x()");
            let on = self.v(format!("mul i32 {w}, {blocks}"));
            let t0 = self.v(format!("add i32 {t0}, {on}"));
            let bk = self.k.bk();
            let kr = self.v(format!("add i32 %K, {}", bk - 1));
            let steps = self.v(format!("udiv i32 {kr}, {bk}"));
            let g0 = self.v(format!("mul i32 {w}, {steps}"));
            let per = self.v(format!("mul i32 {}, {}", grid.0, grid.1));
            let total = self.v(format!("mul i32 {per}, %batch"));
            let any = self.v(format!("icmp slt i32 {t0}, {total}"));
            self.emit(format!("br i1 {any}, label %tile.{role}, label %finished"));
            (t0, g0)
        } else {
            self.emit(format!("br label %tile.{role}"));
            (t0, "0".to_string())
        };
        self.block(&format!("tile.{role}"));
        let (t, g) = (format!("%tile.{role}.t"), format!("%tile.{role}.g"));
        self.emit(format!("{t} = phi i32 [ {t0}, %{from} ], [ %tile.{role}.t1, %tile.{role}.next ]"));
        self.emit(format!("{g} = phi i32 [ {g0}, %{from} ], [ %tile.{role}.g1, %tile.{role}.next ]"));
        let tix = self.indices(Some((&t, &grid)));
        self.emit(format!("br label %{body}"));
        (tix, g, format!("tile.{role}"), grid)
    }

    /// Closes a persistent kernel's loop over tiles (see `tile_loop_head`): the block
    /// `tile.{role}.next` counts the tile's K steps and takes the tile `gridDim.x` on,
    /// while there is one (of `grid`'s tiles times the batch); the loop's exit is
    /// `done` (producer) or `finished`.
    fn tile_loop_tail(&mut self, role: &str, ix: &Ix, (gx, gy): &(String, String)) {
        if !self.k.persistent {
            return;
        }
        if self.k.stream_k {
            self.block(&format!("tile.{role}.next"));
            let span = self.v(format!("zext i32 {} to i64", ix.kt_n));
            self.emit(format!("%tile.{role}.x1 = add i64 %tile.{role}.x, {span}"));
            self.emit(format!("br label %tile.{role}"));
            return;
        }
        self.block(&format!("tile.{role}.next"));
        let grid = self.v("call i32 @llvm.nvvm.read.ptx.sreg.nctaid.x()");
        let (steps, on) = if self.k.pingpong && role == "c" {
            // Every other tile of the block's: the other consumer's between.
            (self.v(format!("shl i32 {}, 1", ix.kt_n)), self.v(format!("shl i32 {grid}, 1")))
        } else {
            (ix.kt_n.clone(), grid)
        };
        self.emit(format!("%tile.{role}.g1 = add i32 %tile.{role}.g, {steps}"));
        self.emit(format!("%tile.{role}.t1 = add i32 %tile.{role}.t, {on}"));
        let per = self.v(format!("mul i32 {gx}, {gy}"));
        let total = self.v(format!("mul i32 {per}, %batch"));
        let more = self.v(format!("icmp slt i32 %tile.{role}.t1, {total}"));
        let exit = if role == "p" { "done" } else { "finished" };
        self.emit(format!("br i1 {more}, label %tile.{role}, label %{exit}"));
    }

    /// A persistent Stream-K kernel's loop over its block's units (see
    /// `tile_loop_head`): the block `tile.{role}` with the unit's first step
    /// of all as a phi, left for `done` or `finished` past the block's last;
    /// the steps before the unit (for the stages' phases) are the block's
    /// since its first. The consumers keep the unit for their fold.
    fn stream_loop_head(
        &mut self,
        role: &str,
        (from, body): (&str, &str),
    ) -> (Ix, String, String, (String, String)) {
        let grid = self.tile_grid();
        let range = self.stream_range(&grid);
        self.emit(format!("br label %tile.{role}"));
        self.block(&format!("tile.{role}"));
        let x = format!("%tile.{role}.x");
        self.emit(format!(
            "{x} = phi i64 [ {}, %{from} ], [ %tile.{role}.x1, %tile.{role}.next ]",
            range.start
        ));
        let more = self.v(format!("icmp ult i64 {x}, {}", range.end));
        let go = format!("tile.{role}.go");
        let exit = if role == "p" { "done" } else { "finished" };
        self.emit(format!("br i1 {more}, label %{go}, label %{exit}"));
        self.block(&go);
        let before = self.v(format!("sub i64 {x}, {}", range.start));
        let g = self.v(format!("trunc i64 {before} to i32"));
        let unit = self.stream_unit(&x, range);
        let mut ix = self.indices(Some((&unit.tile, &grid)));
        ix.k_first = unit.kb.clone();
        ix.kt_n = unit.span.clone();
        if role == "c" {
            self.unit = Some(unit);
        }
        self.emit(format!("br label %{body}"));
        (ix, g, go, grid)
    }

    /// Lane 0 of each consumer warp (where `arrive`) releases the stage that global
    /// step `step` used (stage `step mod stages`).
    fn release(&mut self, bars: &str, step: &str, arrive: &str) {
        let (slot, _) = self.stage_of(step);
        let empty = self.barrier(bars, &slot, self.k.stages);
        let arrive32 = self.v(format!("zext i1 {arrive} to i32"));
        self.arrive_if(&arrive32, &empty);
    }

    /// An arrival on the mbarrier at shared address `bar` where `p` (i32) is not 0.
    fn arrive_if(&mut self, p: &str, bar: &str) {
        self.emit(format!(
            "call void asm sideeffect \"{{\\0A.reg .pred p;\\0Asetp.ne.b32 p, $0, 0;\\0A@p mbarrier.arrive.shared::cta.b64 _, [$1];\\0A}}\", \"r,r,~{{memory}}\"(i32 {p}, i32 {bar})"
        ));
    }

    /// A ping-pong consumer (`wg`, 0 or 1) at the head of a tile (block `turn`,
    /// then the loop): waits for its turn, which the other consumer gives once it
    /// has waited for every stage of the tile before. Its `i`-th tile is the
    /// block's `j = 2i + wg`-th (`j` = the steps before it, `g`, over a tile's);
    /// consumer 1 waits for phase `i` of its barrier, consumer 0 for phase `i - 1`
    /// (its first wait, for the phase of parity 1 while phase 0 is in progress,
    /// passes at once).
    fn take_turn(&mut self, bars: &str, wg: &str, ix: &Ix, g: &str) {
        self.block("turn");
        let j = self.v(format!("udiv i32 {g}, {}", ix.kt_n));
        let i = self.v(format!("lshr i32 {j}, 1"));
        let w1 = self.v(format!("xor i32 {wg}, 1"));
        let sum = self.v(format!("add i32 {i}, {w1}"));
        let parity = self.v(format!("and i32 {sum}, 1"));
        let turn = self.barrier(bars, wg, 2 * self.k.stages);
        self.wait_barrier(&turn, &parity);
        self.emit("br label %loop");
    }

    /// Step `kt`'s stage (`kt mod stages`) and round (`kt / stages`).
    fn stage_of(&mut self, kt: &str) -> (String, String) {
        let s = self.k.stages;
        if s.is_power_of_two() {
            let slot = self.v(format!("and i32 {kt}, {}", s - 1));
            let round = self.v(format!("lshr i32 {kt}, {}", s.trailing_zeros()));
            (slot, round)
        } else {
            let slot = self.v(format!("urem i32 {kt}, {s}"));
            let round = self.v(format!("udiv i32 {kt}, {s}"));
            (slot, round)
        }
    }

    /// The shared address of barrier `first + slot` (full ones from 0, empty ones
    /// from `stages`).
    fn barrier(&mut self, bars: &str, slot: &str, first: usize) -> String {
        let at = self.v(format!("add i32 {slot}, {first}"));
        let off = self.v(format!("shl i32 {at}, 3"));
        self.v(format!("add i32 {bars}, {off}"))
    }

    /// Spins until the barrier at `bar` has completed the phase of parity `parity`.
    fn wait_barrier(&mut self, bar: &str, parity: &str) {
        self.emit(format!(
            "call void asm sideeffect \"{{\\0A.reg .pred done;\\0Await${{:uid}}:\\0Ambarrier.try_wait.parity.shared::cta.b64 done, [$0], $1;\\0A@!done bra wait${{:uid}};\\0A}}\", \"r,r,~{{memory}}\"(i32 {bar}, i32 {parity})"
        ));
    }

    /// One 64-wide K step of a warpgroup's products: four `m64n{bn}k16` wgmma
    /// instructions on the stage at shared address `at` (the warpgroup's A rows at
    /// `wg_a` bytes in), issued in one asm statement (nothing may touch the
    /// accumulators between them), committed as a group, then waited for until
    /// `in_flight` groups remain. Returns the accumulators' new values.
    fn wgmma_products(&mut self, at: &str, wg_a: &str, acc: &[String], in_flight: usize) -> Vec<String> {
        let k = self.k;
        let (a_bytes, _) = k.stage_bytes();
        let a_at = self.v(format!("add i32 {at}, {wg_a}"));
        let b_at = self.v(format!("add i32 {at}, {a_bytes}"));
        let desc = |g: &mut Gen, addr: &str, step: usize| -> String {
            let off = g.v(format!("add i32 {addr}, {}", step * 32));
            g.sw128_descriptor(&off, DESC_SW128_KMAJOR)
        };
        // An N-major B's 16 K rows a step: 2048 bytes on.
        let n_major = k.b == BLayout::NMajor;
        let desc_b = |g: &mut Gen, addr: &str, step: usize| -> String {
            if n_major {
                let off = g.v(format!("add i32 {addr}, {}", step * 16 * 128));
                g.sw128_descriptor(&off, DESC_SW128_NMAJOR)
            } else {
                desc(g, addr, step)
            }
        };
        let mut descs = Vec::new();
        for step in 0..k.bk() / 16 {
            let da = desc(self, &a_at, step);
            let db = desc_b(self, &b_at, step);
            descs.push(format!("i64 {da}"));
            descs.push(format!("i64 {db}"));
        }
        let nacc = acc.len();
        let d_list = (0..nacc).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ");
        let ty = match half(k.elem) {
            Half::Bf16 => "bf16",
            Half::F16 => "f16",
        };
        let mut text = String::from("{\\0A.reg .pred p;\\0Asetp.ne.b32 p, $");
        let scale_at = nacc + descs.len();
        text.push_str(&format!("{scale_at}, 0;\\0Awgmma.fence.sync.aligned;\\0A"));
        for step in 0..k.bk() / 16 {
            text.push_str(&format!(
                "wgmma.mma_async.sync.aligned.m64n{}k16.f32.{ty}.{ty} {{{d_list}}}, ${}, ${}, p, 1, 1, 0, {};\\0A",
                k.bn,
                nacc + 2 * step,
                nacc + 2 * step + 1,
                u8::from(n_major)
            ));
        }
        text.push_str(&format!(
            "wgmma.commit_group.sync.aligned;\\0Awgmma.wait_group.sync.aligned {in_flight};\\0A}}"
        ));
        let ins = vec!["l"; descs.len()].join(",");
        self.wgmma_call(&text, descs, &ins, acc)
    }

    /// A warpgroup's accumulators after its loop (a group still in flight with
    /// `in_flight`, waited for here) as m16n8 fragments: warp w of the group holds
    /// rows 16w..16w+15 of its 64, one fragment per 8 columns (the mma.sync layout).
    fn wgmma_frags(&mut self, ix: &Ix, cur: Vec<String>, in_flight: bool) -> Vec<Frag> {
        let k = self.k;
        let nacc = cur.len();
        let sty = format!("{{{}}}", vec!["float"; nacc].join(", "));
        let cur = if in_flight {
            // The group in flight, waited for: the accumulators pass through the
            // wait as tied operands, so that nothing reads them before it.
            let outs = vec!["=f"; nacc].join(",");
            let tied = (0..nacc).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
            let args = cur.iter().map(|a| format!("float {a}")).collect::<Vec<_>>().join(", ");
            let w = self.v(format!("call {sty} asm sideeffect \"wgmma.wait_group.sync.aligned 0;\", \"{outs},{tied},~{{memory}}\"({args})"));
            (0..nacc).map(|i| self.v(format!("extractvalue {sty} {w}, {i}"))).collect()
        } else {
            cur
        };
        // (A ping-pong consumer's warps hold its own tile's rows.)
        let warp = if k.pingpong { self.v(format!("and i32 {}, 3", ix.warp)) } else { ix.warp.clone() };
        let wrow0 = self.v(format!("mul i32 {warp}, 16"));
        let mut frags = Vec::new();
        for ni in 0..k.bn / 8 {
            let col = format!("{}", ni * 8);
            frags.push(Frag { row: wrow0.clone(), col, vals: [0, 1, 2, 3].map(|x| cur[ni * 4 + x].clone()) });
        }
        frags
    }

    /// Applies the epilogue to every m16n8 fragment (rows `row + g` and `row + g + 8`
    /// of the block tile, columns `col + 2q`, `+1`, for lane `4g + q`) and stores it;
    /// a split-K block stores its f32 partial sums as they are.
    fn epilogue(&mut self, ix: &Ix, frags: &[Frag]) {
        let k = self.k;
        let c = k.c_type();
        self.emit("call void @llvm.nvvm.cp.async.wait.group(i32 0)");
        let LaneOrigin { r1, c1, .. } = self.lane_origin(ix);
        // Paired stores stay aligned while the row and batch (or split) strides are even.
        let sc_lo = self.v("trunc i64 %sc to i32");
        let strides = self.v(format!("or i32 %ldc, {sc_lo}"));
        let parity = self.v(format!("and i32 {strides}, 1"));
        let even = self.v(format!("icmp eq i32 {parity}, 0"));
        let ldc64 = self.v("sext i32 %ldc to i64");
        let folded;
        let frags = match &ix.fold {
            Some(fold) => {
                folded = self.fold_shares(&ix.tid, fold, frags);
                &folded
            }
            None => frags,
        };
        for f in frags {
            for half in 0..2 {
                let s = self.spot(f, half, &r1, &c1, &ldc64);
                let vals = [f.vals[half * 2].clone(), f.vals[half * 2 + 1].clone()];
                if k.split_k && !k.fold {
                    self.store_two("float", 4, &ix.c_base, &s, &vals, &even);
                    continue;
                }
                let out = self.rounded_pair(ix, &s, &vals);
                self.store_two(c_ty(c), c.bytes(), &ix.c_base, &s, &out, &even);
                if let Some(base) = &ix.c16_base {
                    let h = elem_ty(k.elem);
                    let copy = out.clone().map(|y| {
                        let r = self.v(format!("fptrunc float {y} to {h}"));
                        self.v(format!("bitcast {h} {r} to i16"))
                    });
                    self.store_two("i16", 2, base, &s, &copy, &even);
                }
            }
        }
        self.leave();
    }

    /// A folding split-K block's shares (`GemmKernel::fold`): its fragments
    /// written to its share of the workspace (fragment `j` of thread `t` at
    /// `(j·threads + t)·4`, 16 bytes, so a warp writes whole lines), made
    /// visible device-wide, then counted done on its tile's counter by thread
    /// 0. Every block but the tile's last returns; the last sets the counter
    /// back to zero and sums the tile's shares in split order from zero, as
    /// the reduction kernel does (the same bits): `GemmKernel::fold_chunk`
    /// shares at a time, every fragment of the chunk loaded before the first
    /// add (one memory latency a chunk), a share past the last reloading the
    /// last (in bounds) and adding zero. Returns the sums as the fragments
    /// the epilogue stores. A Stream-K block that holds the whole tile skips
    /// all of this and stores its own fragments.
    fn fold_shares(&mut self, tid: &str, at: &FoldAt, frags: &[Frag]) -> Vec<Frag> {
        let FoldAt { tile, share: split, shares, whole } = at;
        let skip_from = whole.as_ref().map(|whole| {
            let (skip, write) = (self.fresh("fold.skip"), self.fresh("fold.write"));
            self.emit(format!("br i1 {whole}, label %{skip}, label %{write}"));
            self.block(&write);
            skip
        });
        let (splits, slots) = match shares {
            Shares::Split { steps } => {
                let kp = self.v("add i32 %kper, -1");
                let st = self.v(format!("add i32 {steps}, {kp}"));
                let splits = self.v(format!("udiv i32 {st}, %kper"));
                (splits.clone(), splits)
            }
            Shares::Stream { shares, slots } => (shares.clone(), slots.clone()),
        };
        // (The threads that hold fragments: a TMA kernel's consumers.)
        let threads = 32 * self.k.warps();
        let share = 4 * threads * frags.len();
        let tid64 = self.v(format!("zext i32 {tid} to i64"));
        let lane_at = self.v(format!("mul i64 {tid64}, 4"));
        let tile64 = self.v(format!("zext i32 {tile} to i64"));
        let splits64 = self.v(format!("zext i32 {splits} to i64"));
        let slots64 = self.v(format!("zext i32 {slots} to i64"));
        let first = self.v(format!("mul i64 {tile64}, {slots64}"));
        // This thread's first fragment in share `s` of this tile; fragment `j`
        // lies `4·threads·j` floats on.
        let share_at = |g: &mut Gen, s64: &str| {
            let sh = g.v(format!("add i64 {first}, {s64}"));
            let base = g.v(format!("mul i64 {sh}, {share}"));
            let o = g.v(format!("add i64 {base}, {lane_at}"));
            g.v(format!("getelementptr inbounds float, ptr addrspace(1) %W, i64 {o}"))
        };
        let at = |g: &mut Gen, base: &str, j: usize| {
            g.v(format!("getelementptr inbounds float, ptr addrspace(1) {base}, i64 {}", 4 * threads * j))
        };
        let own = self.v(format!("zext i32 {split} to i64"));
        let own = share_at(self, &own);
        for (j, f) in frags.iter().enumerate() {
            let p = at(self, &own, j);
            let mut v = "poison".to_string();
            for (e, x) in f.vals.iter().enumerate() {
                v = self.v(format!("insertelement <4 x float> {v}, float {x}, i32 {e}"));
            }
            self.emit(format!("store <4 x float> {v}, ptr addrspace(1) {p}, align 16"));
        }
        // The share is visible device-wide before it is counted; the stage
        // buffers are idle once every thread is here, and the first word
        // tells the block whether it is the tile's last.
        self.emit("call void @llvm.nvvm.membar.gl()");
        self.fold_barrier();
        let (count, counted, reset) =
            (self.fresh("fold.count"), self.fresh("fold.counted"), self.fresh("fold.reset"));
        let t0 = self.v(format!("icmp eq i32 {tid}, 0"));
        self.emit(format!("br i1 {t0}, label %{count}, label %{counted}"));
        self.block(&count);
        let cp = self.v(format!("getelementptr inbounds i64, ptr addrspace(1) %cnt, i64 {tile64}"));
        let old = self.v(format!("atomicrmw add ptr addrspace(1) {cp}, i64 1 monotonic"));
        let last_split = self.v(format!("add i64 {splits64}, -1"));
        let last = self.v(format!("icmp eq i64 {old}, {last_split}"));
        let word = self.v(format!("zext i1 {last} to i32"));
        let word_at = self.fold_word();
        self.emit(format!("store i32 {word}, ptr addrspace(3) {word_at}, align 4"));
        // Every split has counted: the next launch finds the counter zero.
        self.emit(format!("br i1 {last}, label %{reset}, label %{counted}"));
        self.block(&reset);
        self.emit(format!("store atomic i64 0, ptr addrspace(1) {cp} monotonic, align 8"));
        self.emit(format!("br label %{counted}"));
        self.block(&counted);
        self.fold_barrier();
        let word_at = self.fold_word();
        let word = self.v(format!("load i32, ptr addrspace(3) {word_at}, align 4"));
        let last = self.v(format!("icmp ne i32 {word}, 0"));
        let (sum, done) = (self.fresh("fold.sum"), self.fresh("fold.done"));
        self.emit(format!("br i1 {last}, label %{sum}, label %{done}"));
        self.block(&done);
        self.leave();
        self.block(&sum);
        // The other blocks' shares, now that their counts are seen.
        self.emit("call void @llvm.nvvm.membar.gl()");
        let (head, body, out) = (self.fresh("fold.head"), self.fresh("fold.body"), self.fresh("fold.out"));
        self.emit(format!("br label %{head}"));
        self.block(&head);
        let s = self.fresh("%fold.s");
        let accs: Vec<String> = (0..frags.len()).map(|j| format!("{s}.acc{j}")).collect();
        let phis_at = self.body.len();
        let more = self.v(format!("icmp ult i32 {s}, {splits}"));
        self.emit(format!("br i1 {more}, label %{body}, label %{out}"));
        self.block(&body);
        let last_share = self.v(format!("add i32 {splits}, -1"));
        let chunk = self.k.fold_chunk();
        let mut loaded = Vec::with_capacity(chunk);
        for c in 0..chunk {
            let sc = self.v(format!("add i32 {s}, {c}"));
            let live = self.v(format!("icmp ult i32 {sc}, {splits}"));
            let at_s = self.v(format!("select i1 {live}, i32 {sc}, i32 {last_share}"));
            let s64 = self.v(format!("zext i32 {at_s} to i64"));
            let base = share_at(self, &s64);
            // Volatile: from L2, not from lines this SM's L1 may hold from
            // before another block wrote them (the workspace is every step's).
            let xs: Vec<String> = (0..frags.len())
                .map(|j| {
                    let p = at(self, &base, j);
                    self.v(format!("load volatile <4 x float>, ptr addrspace(1) {p}, align 16"))
                })
                .collect();
            loaded.push((live, xs));
        }
        let mut sums = accs.clone();
        for (live, xs) in &loaded {
            for (a, x) in sums.iter_mut().zip(xs) {
                let x = self.v(format!("select i1 {live}, <4 x float> {x}, <4 x float> zeroinitializer"));
                *a = self.v(format!("fadd <4 x float> {a}, {x}"));
            }
        }
        let next = self.v(format!("add i32 {s}, {chunk}"));
        self.emit(format!("br label %{head}"));
        let mut phis = format!("  {s} = phi i32 [ 0, %{sum} ], [ {next}, %{body} ]\n");
        for (a, x) in accs.iter().zip(&sums) {
            phis.push_str(&format!(
                "  {a} = phi <4 x float> [ zeroinitializer, %{sum} ], [ {x}, %{body} ]\n"
            ));
        }
        self.body.insert_str(phis_at, &phis);
        self.block(&out);
        let summed: Vec<Frag> = frags
            .iter()
            .zip(&accs)
            .map(|(f, a)| Frag {
                row: f.row.clone(),
                col: f.col.clone(),
                vals: std::array::from_fn(|e| self.v(format!("extractelement <4 x float> {a}, i32 {e}"))),
            })
            .collect();
        let Some(skip) = skip_from else {
            return summed;
        };
        // The whole tile's own fragments, or the shares' sums.
        let join = self.fresh("fold.join");
        self.emit(format!("br label %{join}"));
        self.block(&skip);
        self.emit(format!("br label %{join}"));
        self.block(&join);
        frags
            .iter()
            .zip(&summed)
            .map(|(f, s)| Frag {
                row: f.row.clone(),
                col: f.col.clone(),
                vals: std::array::from_fn(|e| {
                    self.v(format!("phi float [ {}, %{skip} ], [ {}, %{out} ]", f.vals[e], s.vals[e]))
                }),
            })
            .collect()
    }

    /// A TMA kernel's epilogue through shared memory: each thread applies the
    /// epilogue to its fragments in registers and writes them, rounded, into its
    /// warpgroup's 64 × bn tile in the (now idle) stage buffers, rows padded by 16
    /// bytes so that the writes of a warp fall in 32 distinct banks; then every
    /// thread stores whole 16-byte chunks of rows, coalesced, where a chunk lies
    /// inside C and C's rows and batch stride keep it aligned, else element by
    /// element inside C. Direct 4-byte stores from the fragments leave half of
    /// each 32-byte sector unwritten per instruction and issue 8 times as many stores.
    fn staged_epilogue(&mut self, ix: &Ix, frags: &[Frag]) {
        let k = self.k;
        let e = elem_ty(k.elem);
        let consumers = k.warpgroups();
        let pitch = k.epilogue_pitch();
        let wg = self.v(format!("lshr i32 {}, 7", ix.tid));
        let own = self.v(format!("add i32 {wg}, 2"));
        let region = if k.persistent {
            // A region of its own, which the warpgroup's previous tile read from.
            self.emit(format!(
                "call void asm sideeffect \"bar.sync $0, 128;\", \"r,~{{memory}}\"(i32 {own})"
            ));
            k.epilogue_region().0
        } else {
            // The stage buffers: every consumer's products complete before any write.
            self.emit(format!(
                "call void asm sideeffect \"bar.sync 1, {};\", \"~{{memory}}\"()",
                128 * consumers
            ));
            0
        };
        let smem0 = self.v("ptrtoint ptr addrspace(3) @smem to i32");
        let wg_off = self.v(format!("mul i32 {wg}, {}", 64 * pitch));
        let at0 = self.v(format!("add i32 {smem0}, {region}"));
        let tile = self.v(format!("add i32 {at0}, {wg_off}"));
        let LaneOrigin { g, q2, r1, c1 } = self.lane_origin(ix);
        let ldc64 = self.v("sext i32 %ldc to i64");
        // The warp's rows inside its warpgroup's 64.
        let wq = self.v(format!("and i32 {}, 3", ix.warp));
        let wrow = self.v(format!("mul i32 {wq}, 16"));
        for f in frags {
            for half in 0..2 {
                let s = self.spot(f, half, &r1, &c1, &ldc64);
                let out =
                    self.rounded_pair(ix, &s, &[f.vals[half * 2].clone(), f.vals[half * 2 + 1].clone()]);
                // Row wrow + g + 8·half, columns f.col + 2q and + 1 of the staging tile.
                let r0 = self.v(format!("add i32 {wrow}, {g}"));
                let row = self.v(format!("add i32 {r0}, {}", half * 8));
                let col = self.v(format!("add i32 {q2}, {}", f.col));
                let p = self.staging_ptr(&tile, &row, pitch, &col, 1);
                let v2a = self.v(format!("insertelement <2 x {e}> poison, {e} {}, i32 0", out[0]));
                let v2 = self.v(format!("insertelement <2 x {e}> {v2a}, {e} {}, i32 1", out[1]));
                self.emit(format!("store <2 x {e}> {v2}, ptr addrspace(3) {p}, align 4"));
            }
            // One fragment at a time: the bias and residual loads of later fragments
            // are not hoisted above this one's (with 128 accumulators live, they spill).
            self.emit("call void asm sideeffect \"\", \"~{memory}\"()");
        }
        // The warpgroup's tile is written before any of its threads reads it.
        self.emit(format!("call void asm sideeffect \"bar.sync $0, 128;\", \"r,~{{memory}}\"(i32 {own})"));
        let t = self.v(format!("and i32 {}, 127", ix.tid));
        let row0 = if k.pingpong {
            ix.m0.clone()
        } else {
            let wg_rows = self.v(format!("mul i32 {wg}, 64"));
            self.v(format!("add i32 {}, {wg_rows}", ix.m0))
        };
        // 16-byte stores stay aligned while C's start, rows and batch stride do.
        let cbase = self.v(format!("ptrtoint ptr addrspace(1) {} to i64", ix.c_base));
        let cb32 = self.v(format!("trunc i64 {cbase} to i32"));
        let sc_lo = self.v("trunc i64 %sc to i32");
        let lo = self.v(format!("or i32 %ldc, {sc_lo}"));
        let lo8 = self.v(format!("and i32 {lo}, 7"));
        let cb15 = self.v(format!("and i32 {cb32}, 15"));
        let mis = self.v(format!("or i32 {lo8}, {cb15}"));
        let aligned = self.v(format!("icmp eq i32 {mis}, 0"));
        let per_row = k.bn / 8;
        for j in 0..(64 * per_row).div_ceil(128) {
            let i = self.v(format!("add i32 {t}, {}", j * 128));
            let r = self.v(format!("udiv i32 {i}, {per_row}"));
            let c = self.v(format!("urem i32 {i}, {per_row}"));
            let grow = self.v(format!("add i32 {row0}, {r}"));
            let c8 = self.v(format!("shl i32 {c}, 3"));
            let gcol = self.v(format!("add i32 {}, {c8}", ix.n0));
            let rok = self.v(format!("icmp slt i32 {grow}, %M"));
            let cok = self.v(format!("icmp slt i32 {gcol}, %N"));
            let any = self.v(format!("and i1 {rok}, {cok}"));
            let (go, next) = (self.fresh("out.go"), self.fresh("out.next"));
            self.emit(format!("br i1 {any}, label %{go}, label %{next}"));
            self.block(&go);
            let sp = self.staging_ptr(&tile, &r, pitch, &c, 4);
            let chunk = self.v(format!("load <8 x i16>, ptr addrspace(3) {sp}, align 16"));
            let row64 = self.v(format!("sext i32 {grow} to i64"));
            let col64 = self.v(format!("sext i32 {gcol} to i64"));
            let rowoff = self.v(format!("mul i64 {row64}, {ldc64}"));
            let idx = self.v(format!("add i64 {rowoff}, {col64}"));
            let gp = self.v(format!("getelementptr inbounds i16, ptr addrspace(1) {}, i64 {idx}", ix.c_base));
            let end = self.v(format!("add i32 {gcol}, 8"));
            let whole = self.v(format!("icmp sle i32 {end}, %N"));
            let fast = self.v(format!("and i1 {whole}, {aligned}"));
            let (vec, each) = (self.fresh("out.vec"), self.fresh("out.each"));
            self.emit(format!("br i1 {fast}, label %{vec}, label %{each}"));
            self.block(&vec);
            self.emit(format!("store <8 x i16> {chunk}, ptr addrspace(1) {gp}, align 16"));
            self.emit(format!("br label %{next}"));
            self.block(&each);
            for x in 0..8 {
                let cx = self.v(format!("add i32 {gcol}, {x}"));
                let ok = self.v(format!("icmp slt i32 {cx}, %N"));
                let (st, skip) = (self.fresh("out.el"), self.fresh("out.skip"));
                self.emit(format!("br i1 {ok}, label %{st}, label %{skip}"));
                self.block(&st);
                let h = self.v(format!("extractelement <8 x i16> {chunk}, i32 {x}"));
                let ep = self.v(format!("getelementptr inbounds i16, ptr addrspace(1) {gp}, i64 {x}"));
                self.emit(format!("store i16 {h}, ptr addrspace(1) {ep}, align 2"));
                self.emit(format!("br label %{skip}"));
                self.block(&skip);
            }
            self.emit(format!("br label %{next}"));
            self.block(&next);
        }
    }

    /// The shared-memory pointer to unit `col` (of `1 << shift` bytes) of row `row`
    /// in a staging tile at shared address `tile` with rows `pitch` bytes apart.
    fn staging_ptr(&mut self, tile: &str, row: &str, pitch: usize, col: &str, shift: u32) -> String {
        let rb = self.v(format!("mul i32 {row}, {pitch}"));
        let cb = self.v(format!("shl i32 {col}, {shift}"));
        let off = self.v(format!("add i32 {rb}, {cb}"));
        let at = self.v(format!("add i32 {tile}, {off}"));
        self.v(format!("inttoptr i32 {at} to ptr addrspace(3)"))
    }

    /// Where a lane's fragment values land (see [`LaneOrigin`]).
    fn lane_origin(&mut self, ix: &Ix) -> LaneOrigin {
        let lane = &ix.lane;
        let g = self.v(format!("lshr i32 {lane}, 2"));
        let q = self.v(format!("and i32 {lane}, 3"));
        let q2 = self.v(format!("shl i32 {q}, 1"));
        let r1 = self.v(format!("add i32 {}, {g}", ix.m0));
        let c1 = self.v(format!("add i32 {}, {q2}", ix.n0));
        LaneOrigin { g, q2, r1, c1 }
    }

    /// The epilogue of two adjacent accumulators at `s`, rounded to the element type.
    /// Bias and residual loads of values outside C read element 0 instead (their
    /// result is not stored): no load leaves the operands.
    fn rounded_pair(&mut self, ix: &Ix, s: &Spot, vals: &[String; 2]) -> [String; 2] {
        let k = self.k;
        let c = k.c_type();
        let mut out = [String::new(), String::new()];
        for (x, v) in vals.iter().enumerate() {
            let (cc, okc, inx) = if x == 0 { (&s.col, &s.ok0, &s.in0) } else { (&s.col1, &s.ok1, &s.in1) };
            let bi = self.v(format!("select i1 {okc}, i32 {cc}, i32 0"));
            let ri = match &ix.r_base {
                Some(rb) => {
                    let ixx = self.v(format!("add i64 {}, {x}", s.idx));
                    Some((rb.clone(), self.v(format!("select i1 {inx}, i64 {ixx}, i64 0"))))
                }
                None => None,
            };
            let y = self.ir.epilogue_value(c, k.epilogue, v, &bi, ri.as_ref());
            out[x] = self.ir.round_c(c, &y);
        }
        out
    }

    /// Where half `half` of fragment `f` lands in C: its two columns, C's index of the
    /// first, and which of the two lie inside C.
    fn spot(&mut self, f: &Frag, half: usize, r1: &str, c1: &str, ldc64: &str) -> Spot {
        let r0 = self.v(format!("add i32 {r1}, {}", f.row));
        let row = self.v(format!("add i32 {r0}, {}", half * 8));
        let col = self.v(format!("add i32 {c1}, {}", f.col));
        let col1 = self.v(format!("add i32 {col}, 1"));
        let rok = self.v(format!("icmp slt i32 {row}, %M"));
        let ok0 = self.v(format!("icmp slt i32 {col}, %N"));
        let ok1 = self.v(format!("icmp slt i32 {col1}, %N"));
        let row64 = self.v(format!("sext i32 {row} to i64"));
        let col64 = self.v(format!("sext i32 {col} to i64"));
        let rowoff = self.v(format!("mul i64 {row64}, {ldc64}"));
        let idx = self.v(format!("add i64 {rowoff}, {col64}"));
        let in0 = self.v(format!("and i1 {rok}, {ok0}"));
        let in1 = self.v(format!("and i1 {rok}, {ok1}"));
        Spot { col, col1, ok0, ok1, in0, in1, idx }
    }

    /// Stores two adjacent values of type `ty` (`size` bytes each) at `s`: in one
    /// store of twice the size where both are inside C and the strides keep it
    /// aligned, else one at a time, each predicated.
    fn store_two(&mut self, ty: &str, size: usize, base: &str, s: &Spot, v: &[String; 2], even: &str) {
        let elem = if ty == "float" { "float" } else { "i16" };
        let pair_ok = self.v(format!("and i1 {}, {even}", s.in1));
        let (pair, single, st0, chk1, st1, next) = (
            self.fresh("st.pair"),
            self.fresh("st.single"),
            self.fresh("st.0"),
            self.fresh("st.chk"),
            self.fresh("st.1"),
            self.fresh("st.next"),
        );
        let p0 = self.v(format!("getelementptr inbounds {elem}, ptr addrspace(1) {base}, i64 {}", s.idx));
        self.emit(format!("br i1 {pair_ok}, label %{pair}, label %{single}"));
        self.block(&pair);
        let v2a = self.v(format!("insertelement <2 x {ty}> poison, {ty} {}, i32 0", v[0]));
        let v2 = self.v(format!("insertelement <2 x {ty}> {v2a}, {ty} {}, i32 1", v[1]));
        self.emit(format!("store <2 x {ty}> {v2}, ptr addrspace(1) {p0}, align {}", 2 * size));
        self.emit(format!("br label %{next}"));
        self.block(&single);
        self.emit(format!("br i1 {}, label %{st0}, label %{chk1}", s.in0));
        self.block(&st0);
        self.emit(format!("store {ty} {}, ptr addrspace(1) {p0}, align {size}", v[0]));
        self.emit(format!("br label %{chk1}"));
        self.block(&chk1);
        self.emit(format!("br i1 {}, label %{st1}, label %{next}", s.in1));
        self.block(&st1);
        let p1 = self.v(format!("getelementptr inbounds {elem}, ptr addrspace(1) {p0}, i64 1"));
        self.emit(format!("store {ty} {}, ptr addrspace(1) {p1}, align {size}", v[1]));
        self.emit(format!("br label %{next}"));
        self.block(&next);
    }

    /// The module's text around the body, with the kernel's signature
    /// (`gpu::kernel::ABI`).
    fn finish(self) -> String {
        let k = self.k;
        // A and B are read in 16-byte copies (aligned: the runner checks their rows and
        // batch strides) but by an unaligned kernel; C is stored at any row (a piece of
        // a two-size cover starts at any row).
        let align = if k.unaligned { "" } else { "align 16 " };
        let params = format!(
            "ptr addrspace(1) readonly {align}%A, ptr addrspace(1) readonly {align}%B, \
             ptr addrspace(1) %C, ptr addrspace(1) readonly %bias, ptr addrspace(1) readonly %res, \
             i32 %M, i32 %N, i32 %K, i32 %lda, i32 %ldb, i32 %ldc, i64 %sa, i64 %sb, i64 %sc{}{}{}",
            match (k.split_k, k.fold) {
                (true, true) => ", i32 %kper, ptr addrspace(1) align 16 %W, ptr addrspace(1) %cnt",
                (true, false) => ", i32 %kper",
                _ => "",
            },
            if k.persistent { ", i32 %batch" } else { "" },
            if k.tma {
                ", ptr byval([16 x i64]) align 64 %tmA, ptr byval([16 x i64]) align 64 %tmB"
            } else if k.a_taps {
                ", ptr addrspace(1) readonly align 8 %taps"
            } else {
                ""
            }
        ) + if k.c16_copy { ", ptr addrspace(1) %C16" } else { "" };
        // A TMA kernel's tensor maps are kernel parameters read in place (`grid_constant`:
        // their generic address is taken with `cvta.param`, not a local copy's); one
        // block an SM at least fixes the register count a block starts with, which
        // `setmaxnreg` redistributes.
        let mut extra = Vec::new();
        if k.tma {
            // grid_constant counts parameters from 1.
            let first = params.split(", ").position(|p| p.ends_with("%tmA")).map_or(0, |i| i + 1);
            extra.push(format!("!\"grid_constant\", !{{i32 {first}, i32 {}}}", first + 1));
            extra.push("!\"minctasm\", i32 1".to_string());
        }
        let about = format!("{} bytes of dynamic shared memory", k.smem_bytes());
        self.ir.module(&k.name(), k.threads(), &about, true, &params, &extra)
    }

    /// A fragment register as the mma's operand type (`i32` holds two bf16; the f16
    /// intrinsic takes `<2 x half>`).
    fn operand(&mut self, x: &str) -> String {
        match half(self.k.elem) {
            Half::Bf16 => format!("i32 {x}"),
            Half::F16 => {
                let h = self.v(format!("bitcast i32 {x} to <2 x half>"));
                format!("<2 x half> {h}")
            }
        }
    }

    /// A pointer to `base[row · ld + col]` (i64 arithmetic), elements of type `ty`.
    fn row_ptr(&mut self, base: &str, row: &str, ld: &str, col: &str, ty: &str) -> String {
        let r = self.v(format!("sext i32 {row} to i64"));
        let l = self.v(format!("sext i32 {ld} to i64"));
        let rl = self.v(format!("mul i64 {r}, {l}"));
        let c = self.v(format!("sext i32 {col} to i64"));
        let off = self.v(format!("add i64 {rl}, {c}"));
        self.v(format!("getelementptr {ty}, ptr addrspace(1) {base}, i64 {off}"))
    }

    /// Byte offset of 16-byte chunk `c` of row `row` in a tile of `row_bytes`-byte
    /// rows, the chunk index XORed with `(row >> shift) & mask`: 64-byte rows (A, a
    /// K-major B) use bits 1-2 of the row, so rows 0, 2, 4, 6 and 1, 3, 5, 7 fall in
    /// distinct 16-byte bank groups; rows of 128 bytes or more (an N-major B) use
    /// bits 0-2.
    fn swizzled(&mut self, row: &str, c: &str, row_bytes: usize, mask: usize, shift: usize) -> String {
        let r = if shift > 0 { self.v(format!("lshr i32 {row}, {shift}")) } else { row.to_string() };
        let bits = self.v(format!("and i32 {r}, {mask}"));
        let sw = self.v(format!("xor i32 {c}, {bits}"));
        let cb = self.v(format!("shl i32 {sw}, 4"));
        let rb = self.v(format!("mul i32 {row}, {row_bytes}"));
        self.v(format!("add i32 {rb}, {cb}"))
    }
}

/// An f32 constant as LLVM IR writes it: the double whose value it is, in hex.
fn float_lit(x: f32) -> String {
    format!("0x{:016X}", (x as f64).to_bits())
}

const DECLS: &str = "declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.ctaid.y()
declare i32 @llvm.nvvm.read.ptx.sreg.ctaid.z()
declare i32 @llvm.nvvm.read.ptx.sreg.nctaid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.nctaid.y()
declare void @llvm.nvvm.barrier0()
declare void @llvm.nvvm.membar.gl()
declare void @llvm.nvvm.cp.async.cg.shared.global.16.s(ptr addrspace(3), ptr addrspace(1), i32)
declare void @llvm.nvvm.cp.async.commit.group()
declare void @llvm.nvvm.cp.async.wait.group(i32 immarg)
declare { i32, i32, i32, i32 } @llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.b16(ptr addrspace(3))
declare { i32, i32, i32, i32 } @llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.trans.b16(ptr addrspace(3))
declare { float, float, float, float } @llvm.nvvm.mma.m16n8k16.row.col.bf16(i32, i32, i32, i32, i32, i32, float, float, float, float)
declare { float, float, float, float } @llvm.nvvm.mma.m16n8k16.row.col.f32.f32(<2 x half>, <2 x half>, <2 x half>, <2 x half>, <2 x half>, <2 x half>, float, float, float, float)
declare float @llvm.fma.f32(float, float, float)
declare i32 @llvm.ctlz.i32(i32, i1 immarg)
declare float @llvm.nvvm.shfl.sync.bfly.f32(i32, float, i32, i32)
declare float @llvm.vector.reduce.fadd.v8f32(float, <8 x float>)
declare float @llvm.fabs.f32(float)
declare float @llvm.sqrt.f32(float)
declare float @llvm.maxnum.f32(float, float)
declare float @llvm.floor.f32(float)
declare float @llvm.ceil.f32(float)
declare float @llvm.roundeven.f32(float)
declare i32 @llvm.fptosi.sat.i32.f32(float)
declare i32 @llvm.smax.i32(i32, i32)
declare i32 @llvm.smin.i32(i32, i32)
";
