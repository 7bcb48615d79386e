//! Fused attention as one kernel (`plan::gpu`'s attention contract,
//! FlashAttention-2's schedule): a block takes `ATTENTION_ROWS` query rows of
//! one batch entry, a warp 16 of them, against the entry's keys a chunk of
//! `ATTENTION_KEYS` at a time. Per chunk: K and V rounded to bf16 into shared
//! memory; `S = Q·Kᵀ` by `mma.sync` (Q's fragments loaded once); the model's
//! logits of each score by the online softmax program's expression
//! (`loops::device::logits_ir`, linked in and inlined); each row's running
//! maximum and sum (the four lanes that share a row meet by shuffles); the
//! output accumulators rescaled and `O += P·V`, P's bf16 fragments packed
//! from the score accumulators' registers (an m16n8 accumulator pair is an
//! m16k16 A fragment). The score tile never leaves registers. Keys past the
//! last and rows past the last are masked; the output is divided by the
//! row's sum at the end (zero for a row of no keys).
//!
//! On a Hopper (`AttentionMma::Wgmma`, heads a multiple of 64) the block is
//! one warpgroup and the two products are `wgmma`s: Q and K lie in shared
//! memory as its 128-byte swizzled K-major operands and `S = Q·Kᵀ` reads
//! both through descriptors; V is stored transposed (Vᵀ, K-major along the
//! keys) and `O += P·V` takes P's bf16 fragments from the score registers
//! (a warp's m16k16 A fragment is `mma.sync`'s). Both accumulators come back
//! in the m16n8 fragments' order, so the softmax between them is shared.
//! Each product is waited for before the softmax reads it.

use std::fmt::Write as _;

use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::context::Context;
use inkwell::memory_buffer::MemoryBuffer;
use inkwell::module::Linkage;
use plan::gpu::{
    attention_pitch, attention_wgmma_ok, AttentionMma, ATTENTION_KEYS, ATTENTION_MAX_HEAD, ATTENTION_ROWS,
    ATTENTION_THREADS,
};
use plan::LoopProgram;

use super::{Arch, Ir};
use crate::{llvm, CodegenError};

type R<T> = Result<T, CodegenError>;

/// A `wgmma` product's A: per K step its descriptor (beside B's), or its
/// four registers of an m16k16 fragment a warp (beside B's descriptor).
enum WgmmaA<'a> {
    Shared(&'a [(String, String)]),
    Registers(&'a [([String; 4], String)]),
}

/// Chunks of four columns a thread of [`Kernel::load_chunks`] loads before
/// storing them (registers: four each).
const CHUNKS_IN_FLIGHT: usize = 4;

/// The first metadata number of the loops' identifiers (above the kernel's
/// annotations).
const LOOP_METADATA: usize = 100;

/// Minus infinity as LLVM IR writes a float.
const NEG_INF: &str = "0xFFF0000000000000";

/// Whether head dimension `d` is one the attention kernel is built for.
pub fn attention_head_ok(d: usize) -> bool {
    d > 0 && d.is_multiple_of(16) && d <= ATTENTION_MAX_HEAD
}

/// The LLVM IR (an NVPTX module, as text) of attention kernel `name` for
/// head dimension `d`, multiplying by `mma`, whose logits are those online
/// softmax program `p` stores in its parameter `logits` from its scores
/// (parameter `scores`). Parameters: the program's buffer table, a dim
/// table (the program's chunk offset 0, its chunk the whole row of keys),
/// the descriptor (`plan::gpu::ATTENTION_HEADER`). `out_bf16`: the output
/// is stored in bf16 (else f32).
pub fn attention_ir(
    p: &LoopProgram,
    (scores, logits): (u32, u32),
    (d, mma, out_bf16): (usize, AttentionMma, bool),
    name: &str,
) -> R<String> {
    if !attention_head_ok(d) {
        return Err(CodegenError::Unsupported(format!(
            "attention with head dimension {d} (the kernel takes multiples of 16 up to {ATTENTION_MAX_HEAD})"
        )));
    }
    if mma == AttentionMma::Wgmma && !attention_wgmma_ok(d) {
        return Err(CodegenError::Unsupported(format!(
            "wgmma attention with head dimension {d} (it takes multiples of 64 up to {ATTENTION_MAX_HEAD})"
        )));
    }
    let fname = format!("{name}_logits");
    let logits_text = crate::loops::device::logits_ir(p, scores, logits, &fname)?;
    // The tables' bytes the program reads (its buffers' pointers, the dim
    // slots it names): dereferenceable, so that their invariant loads
    // (`loops::Gen::invariant`) are hoisted out of the chunks of keys.
    let slots = (0..p.exprs.len())
        .filter_map(|n| match p.exprs.node(plan::E(n as u32)) {
            plan::Node::Dim(slot) => Some(*slot as usize + 1),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let kernel_text = kernel_ir((d, mma, out_bf16), name, &fname, (8 * p.params.len(), 8 * slots));
    let ctx = Context::create();
    let parse = |text: &str, what: &str| {
        let buf = MemoryBuffer::create_from_memory_range_copy(text.as_bytes(), what);
        ctx.create_module_from_ir(buf).map_err(|e| llvm(format!("{what}: {e}")))
    };
    let module = parse(&kernel_text, name)?;
    module.link_in_module(parse(&logits_text, &fname)?).map_err(|e| llvm(format!("{name}: {e}")))?;
    let f = module.get_function(&fname).ok_or_else(|| llvm(format!("{name}: no {fname} after linking")))?;
    f.set_linkage(Linkage::Internal);
    f.add_attribute(
        AttributeLoc::Function,
        ctx.create_enum_attribute(Attribute::get_named_enum_kind_id("alwaysinline"), 0),
    );
    module.verify().map_err(|e| llvm(format!("{name}: {e}")))?;
    Ok(module.print_to_string().to_string())
}

/// PTX of [`attention_ir`]'s kernel, at O3: `.target sm_80` (which ptxas
/// also assembles for sm_90a) for `mma.sync`, `sm_90a` for `wgmma`.
pub fn attention_ptx(
    p: &LoopProgram,
    (scores, logits): (u32, u32),
    (d, mma, out_bf16): (usize, AttentionMma, bool),
    name: &str,
) -> R<String> {
    let arch = match mma {
        AttentionMma::Sync => Arch::Sm80,
        AttentionMma::Wgmma => Arch::Sm90a,
    };
    super::compile(&attention_ir(p, (scores, logits), (d, mma, out_bf16), name)?, name, arch)
}

/// The descriptor's words the kernel reads by name (see `ATTENTION_HEADER`).
struct Desc {
    status: String,
    q: String,
    k: String,
    v: String,
    o: String,
    partials: String,
    counters: String,
    lq: String,
    lk: String,
    qblocks: String,
    entries: String,
    splits: String,
    strides: [String; 8],
}

/// A tile of shared memory: its first byte and how its elements lie there.
struct Tile {
    base: usize,
    layout: Layout,
}

/// Where element (row, column) of a 64-row tile lies in shared memory.
#[derive(Clone, Copy, PartialEq)]
enum Layout {
    /// Rows of `attention_pitch(d)` bytes (`ldmatrix` reads them without
    /// bank conflicts).
    Padded,
    /// `wgmma`'s K-major operand: the columns in slabs of 64 (128 bytes a
    /// row, 64 rows a slab), 16-byte chunks swizzled in 1024-byte atoms.
    Swizzled,
    /// The same, transposed: element (row, column) at (column, row) of a
    /// swizzled tile of `d` rows and 64 columns (Vᵀ, K-major for `P·V`).
    SwizzledT,
}

struct Kernel {
    ir: Ir,
    d: usize,
    pitch: usize,
    mma: AttentionMma,
    logits: String,
    /// The output is stored in bf16 (only contractions read it, as their A:
    /// `lower::bf16_products`); else f32.
    out_bf16: bool,
    /// Metadata of the loops LLVM may not unroll.
    loops: Vec<String>,
}

impl std::ops::Deref for Kernel {
    type Target = Ir;
    fn deref(&self) -> &Ir {
        &self.ir
    }
}

impl std::ops::DerefMut for Kernel {
    fn deref_mut(&mut self) -> &mut Ir {
        &mut self.ir
    }
}

fn kernel_ir(
    (d, mma, out_bf16): (usize, AttentionMma, bool),
    name: &str,
    logits: &str,
    (bufs, dims): (usize, usize),
) -> String {
    let mut k = Kernel {
        ir: Ir::default(),
        d,
        pitch: attention_pitch(d),
        mma,
        logits: logits.to_string(),
        out_bf16,
        loops: Vec::new(),
    };
    k.generate();
    let about = match mma {
        AttentionMma::Sync => format!("fused attention, head dimension {d}"),
        AttentionMma::Wgmma => format!("fused attention by wgmma, head dimension {d}"),
    };
    // Narrow heads: one block an SM at least, so that ptxas does not aim at
    // more and cap the registers at 128 (spilling the tiles); wide heads need
    // ptxas's own choice (which is then 255 registers, where telling it one
    // block makes it schedule for more and spill).
    let extra: Vec<String> = if d <= 64 { vec!["!\"minctasm\", i32 1".into()] } else { Vec::new() };
    let loops = std::mem::take(&mut k.loops);
    let mut text = k.ir.module(
        name,
        ATTENTION_THREADS as usize,
        &about,
        true,
        &format!(
            "ptr align 8 dereferenceable({}) %bufs, ptr align 8 dereferenceable({}) %dims, ptr %desc",
            bufs.max(8),
            dims.max(8)
        ),
        &extra,
    );
    let _ = writeln!(text, "declare float @{logits}(ptr, ptr, ptr, i64, i64, i64, float)");
    for l in loops {
        let _ = writeln!(text, "{l}");
    }
    text
}

impl Kernel {
    /// An output value `y` (f32) stored at element `off` past `base`, in the
    /// output's type.
    fn store_output(&mut self, y: &str, base: &str, off: &str) {
        if self.out_bf16 {
            let h = self.v(format!("fptrunc float {y} to bfloat"));
            let p = self.v(format!("getelementptr i16, ptr {base}, i64 {off}"));
            self.emit(format!("store bfloat {h}, ptr {p}, align 2"));
        } else {
            let p = self.v(format!("getelementptr float, ptr {base}, i64 {off}"));
            self.emit(format!("store float {y}, ptr {p}, align 4"));
        }
    }

    fn word(&mut self, i: usize) -> String {
        let p = self.v(format!("getelementptr inbounds i64, ptr %desc, i64 {i}"));
        self.v(format!("load i64, ptr {p}, align 8"))
    }

    fn pointer(&mut self, i: usize) -> String {
        let w = self.word(i);
        self.v(format!("inttoptr i64 {w} to ptr"))
    }

    fn smem(&mut self, off: &str) -> String {
        self.v(format!("getelementptr inbounds i8, ptr addrspace(3) @smem, i32 {off}"))
    }

    fn max(&mut self, a: &str, b: &str) -> String {
        let gt = self.v(format!("fcmp ogt float {a}, {b}"));
        self.v(format!("select i1 {gt}, float {a}, float {b}"))
    }

    /// `x` combined by `op` (a method of two values) with the three other
    /// lanes of its quad (the lanes that hold one row of an m16n8 fragment).
    fn quad(&mut self, x: &str, op: fn(&mut Self, &str, &str) -> String) -> String {
        let mut x = x.to_string();
        for sh in [1, 2] {
            let o = self
                .v(format!("call float @llvm.nvvm.shfl.sync.bfly.f32(i32 -1, float {x}, i32 {sh}, i32 31)"));
            x = op(self, &x, &o);
        }
        x
    }

    fn add(&mut self, a: &str, b: &str) -> String {
        self.v(format!("fadd float {a}, {b}"))
    }

    /// What online softmax subtracts for a running maximum `m`: `m`, or 0
    /// while every logit seen is -inf (so that no `-inf - -inf` makes a NaN).
    fn exp_base(&mut self, m: &str) -> String {
        let none = self.v(format!("fcmp oeq float {m}, {NEG_INF}"));
        self.v(format!("select i1 {none}, float 0.0, float {m}"))
    }

    /// `num / sum`, or 0 for a row that weighed nothing (`sum` 0).
    fn over_sum(&mut self, num: &str, sum: &str) -> String {
        let zero = self.v(format!("fcmp oeq float {sum}, 0.0"));
        let y = self.v(format!("fdiv float {num}, {sum}"));
        self.v(format!("select i1 {zero}, float 0.0, float {y}"))
    }

    /// Two f32 values as one register of two bf16 (`lo` in the low half).
    fn pack(&mut self, lo: &str, hi: &str) -> String {
        let a = self.v(format!("fptrunc float {lo} to bfloat"));
        let b = self.v(format!("fptrunc float {hi} to bfloat"));
        let v0 = self.v(format!("insertelement <2 x bfloat> poison, bfloat {a}, i32 0"));
        let v1 = self.v(format!("insertelement <2 x bfloat> {v0}, bfloat {b}, i32 1"));
        self.v(format!("bitcast <2 x bfloat> {v1} to i32"))
    }

    /// Makes the block's stores to shared memory visible to `wgmma` (the
    /// async proxy reads its operands); nothing for `mma.sync`.
    fn async_proxy_fence(&mut self) {
        if self.mma == AttentionMma::Wgmma {
            self.emit("call void asm sideeffect \"fence.proxy.async.shared::cta;\", \"~{memory}\"()");
        }
    }

    /// A `wgmma` descriptor of the 128-byte swizzled K-major operand at byte
    /// `at` of the tiles (`smem0`: the shared window's address of `@smem`).
    fn descriptor(&mut self, smem0: &str, at: usize) -> String {
        let a = self.v(format!("add i32 {smem0}, {at}"));
        self.sw128_descriptor(&a, super::DESC_SW128_KMAJOR)
    }

    /// `acc + A·B` by `wgmma.mma_async` m64n{n}k16 steps (bf16, f32
    /// accumulators in the m16n8 fragments' order), waited for: B from shared
    /// memory, A too or from registers (see [`WgmmaA`]).
    fn wgmma(&mut self, n: usize, a: WgmmaA, acc: &[String]) -> Vec<String> {
        let nacc = acc.len();
        let d_list = (0..nacc).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ");
        let mut operands: Vec<String> = Vec::new();
        let mut constraints: Vec<&str> = Vec::new();
        let mut text = String::from("{\\0A.reg .pred p;\\0A");
        let mut steps = Vec::new();
        match a {
            WgmmaA::Shared(descs) => {
                for (da, db) in descs {
                    let at = nacc + operands.len();
                    steps.push(format!("${at}, ${}, p, 1, 1, 0, 0", at + 1));
                    operands.extend([format!("i64 {da}"), format!("i64 {db}")]);
                    constraints.extend(["l", "l"]);
                }
            }
            WgmmaA::Registers(regs) => {
                for (ra, db) in regs {
                    let at = nacc + operands.len();
                    steps.push(format!(
                        "{{${at}, ${}, ${}, ${}}}, ${}, p, 1, 1, 0",
                        at + 1,
                        at + 2,
                        at + 3,
                        at + 4
                    ));
                    operands.extend(ra.iter().map(|r| format!("i32 {r}")));
                    operands.push(format!("i64 {db}"));
                    constraints.extend(["r", "r", "r", "r", "l"]);
                }
            }
        }
        let scale_at = nacc + operands.len();
        text.push_str(&format!("setp.ne.b32 p, ${scale_at}, 0;\\0Awgmma.fence.sync.aligned;\\0A"));
        for step in &steps {
            text.push_str(&format!(
                "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 {{{d_list}}}, {step};\\0A"
            ));
        }
        text.push_str("wgmma.commit_group.sync.aligned;\\0Awgmma.wait_group.sync.aligned 0;\\0A}");
        self.wgmma_call(&text, operands, &constraints.join(","), acc)
    }

    fn ldmatrix(&mut self, off: &str, trans: bool) -> [String; 4] {
        let p = self.smem(off);
        let t = if trans { "trans." } else { "" };
        let r = self.v(format!(
            "call {{i32, i32, i32, i32}} @llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.{t}b16(ptr addrspace(3) {p})"
        ));
        [0, 1, 2, 3].map(|x| self.v(format!("extractvalue {{i32, i32, i32, i32}} {r}, {x}")))
    }

    /// `acc += a·b` for one m16n8k16 product.
    fn mma(&mut self, a: &[String; 4], b: &[String; 2], acc: &mut [String; 4]) {
        let args: Vec<String> = a.iter().chain(b.iter()).map(|x| format!("i32 {x}")).collect();
        let c: Vec<String> = acc.iter().map(|x| format!("float {x}")).collect();
        let r = self.v(format!(
            "call {{float, float, float, float}} @llvm.nvvm.mma.m16n8k16.row.col.bf16({}, {})",
            args.join(", "),
            c.join(", ")
        ));
        for (x, v) in acc.iter_mut().enumerate() {
            *v = self.v(format!("extractvalue {{float, float, float, float}} {r}, {x}"));
        }
    }

    /// Byte offset of element (`row`, `col`) (i32 values) of `tile`.
    fn element_at(&mut self, tile: &Tile, row: &str, col: &str) -> String {
        let o = match tile.layout {
            Layout::Padded => {
                let pitch = self.pitch;
                let rb = self.v(format!("mul i32 {row}, {pitch}"));
                let cb = self.v(format!("shl i32 {col}, 1"));
                self.v(format!("add i32 {rb}, {cb}"))
            }
            Layout::Swizzled | Layout::SwizzledT => {
                let (r, c) = if tile.layout == Layout::Swizzled { (row, col) } else { (col, row) };
                // Slab c / 64 of 64 rows, row r's 128 bytes, the 16-byte chunk
                // XOR the row's place in its 8-row atom.
                let slab = self.v(format!("lshr i32 {c}, 6"));
                let so = self.v(format!("shl i32 {slab}, 13"));
                let ro = self.v(format!("shl i32 {r}, 7"));
                let c64 = self.v(format!("and i32 {c}, 63"));
                let co = self.v(format!("shl i32 {c64}, 1"));
                let o = self.v(format!("add i32 {so}, {ro}"));
                let o = self.v(format!("add i32 {o}, {co}"));
                let r8 = self.v(format!("and i32 {r}, 7"));
                let x = self.v(format!("shl i32 {r8}, 4"));
                self.v(format!("xor i32 {o}, {x}"))
            }
        };
        self.v(format!("add i32 {o}, {}", tile.base))
    }

    /// Byte offset of 16-byte chunk `chunk` of row `row` (i32 values) in `tile`.
    fn at(&mut self, tile: &Tile, row: &str, chunk: &str) -> String {
        let pitch = self.pitch;
        let rb = self.v(format!("mul i32 {row}, {pitch}"));
        let cb = self.v(format!("shl i32 {chunk}, 4"));
        let o = self.v(format!("add i32 {rb}, {cb}"));
        self.v(format!("add i32 {o}, {}", tile.base))
    }

    /// Whether row `first + row` (`row` i32) is below `limit`, and the row
    /// read: it, or `first` past the limit (whose values are then dropped).
    fn clamped_row(&mut self, first: &str, limit: &str, row: &str) -> (String, String) {
        let r64 = self.v(format!("zext i32 {row} to i64"));
        let grow = self.v(format!("add i64 {first}, {r64}"));
        let ok = self.v(format!("icmp slt i64 {grow}, {limit}"));
        let safe = self.v(format!("select i1 {ok}, i64 {grow}, i64 {first}"));
        (ok, safe)
    }

    /// Rows `first..first + 64` (those below `limit`; zeros past it) of an f32
    /// matrix at `base` with strides `rs`, `cs` (i64 elements), rounded to bf16
    /// into `tile`. Where the columns are adjacent and the start and rows
    /// 16-byte aligned, by [`Kernel::load_chunks`]; else the block's threads
    /// take its elements in turn, a row's adjacent columns by adjacent
    /// threads. `first < limit`.
    fn load_tile(
        &mut self,
        label: &str,
        tile: &Tile,
        base: &str,
        (first, limit): (&str, &str),
        (rs, cs): (&str, &str),
    ) {
        let d = self.d;
        let total = ATTENTION_ROWS.max(ATTENTION_KEYS) * d;
        let pre = self.fresh(&format!("{label}.pre"));
        let (head, exit) = (self.fresh(&format!("{label}.el")), self.fresh(&format!("{label}.done")));
        let chunks = self.fresh(&format!("{label}.chunks"));
        let adjacent = self.v(format!("icmp eq i64 {cs}, 1"));
        let rs_low = self.v(format!("and i64 {rs}, 3"));
        let rows_even = self.v(format!("icmp eq i64 {rs_low}, 0"));
        let at = self.v(format!("ptrtoint ptr {base} to i64"));
        let at_low = self.v(format!("and i64 {at}, 15"));
        let start_even = self.v(format!("icmp eq i64 {at_low}, 0"));
        let ok = self.v(format!("and i1 {adjacent}, {rows_even}"));
        let ok = self.v(format!("and i1 {ok}, {start_even}"));
        self.emit(format!("br i1 {ok}, label %{chunks}, label %{pre}"));
        self.block(&chunks);
        self.load_chunks(tile, base, (first, limit), rs);
        self.emit(format!("br label %{exit}"));
        self.block(&pre);
        self.emit(format!("br label %{head}"));
        self.block(&head);
        let e = self.fresh("%e");
        let at = self.body.len();
        let row = self.v(format!("udiv i32 {e}, {d}"));
        let col = self.v(format!("urem i32 {e}, {d}"));
        let (ok, safe) = self.clamped_row(first, limit, &row);
        let c64 = self.v(format!("zext i32 {col} to i64"));
        let ro = self.v(format!("mul i64 {safe}, {rs}"));
        let co = self.v(format!("mul i64 {c64}, {cs}"));
        let off = self.v(format!("add i64 {ro}, {co}"));
        let p = self.v(format!("getelementptr float, ptr {base}, i64 {off}"));
        let x = self.v(format!("load float, ptr {p}, align 4"));
        let x = self.v(format!("select i1 {ok}, float {x}, float 0.0"));
        let h = self.v(format!("fptrunc float {x} to bfloat"));
        let o = self.element_at(tile, &row, &col);
        let sp = self.smem(&o);
        self.emit(format!("store bfloat {h}, ptr addrspace(3) {sp}, align 2"));
        let next = self.v(format!("add i32 {e}, {ATTENTION_THREADS}"));
        let more = self.v(format!("icmp ult i32 {next}, {total}"));
        self.emit(format!("br i1 {more}, label %{head}, label %{exit}"));
        self.body.insert_str(at, &format!("  {e} = phi i32 [ %tid, %{pre} ], [ {next}, %{head} ]\n"));
        self.block(&exit);
    }

    /// [`Kernel::load_tile`] of a matrix whose columns are adjacent, its
    /// start and rows 16-byte aligned: each thread takes `d / 8` chunks of
    /// four columns (`ld.global.v4.f32`), a few loaded before any is stored,
    /// so that their latencies overlap. A loop whose rounds LLVM may not
    /// unroll: unrolled, each chunk's loop-invariant offsets would be hoisted
    /// out of the chunks of keys and held in registers the output
    /// accumulators need (spilling at a head of 128).
    fn load_chunks(&mut self, tile: &Tile, base: &str, (first, limit): (&str, &str), rs: &str) {
        let d = self.d;
        let per_row = d / 4;
        let each = ATTENTION_ROWS.max(ATTENTION_KEYS) * per_row / ATTENTION_THREADS as usize;
        let batch = if each.is_multiple_of(CHUNKS_IN_FLIGHT) { CHUNKS_IN_FLIGHT } else { 2 };
        let (pre, round, done) =
            (self.fresh("chunks.pre"), self.fresh("chunks.round"), self.fresh("chunks.done"));
        self.emit(format!("br label %{pre}"));
        self.block(&pre);
        self.emit(format!("br label %{round}"));
        self.block(&round);
        let it = self.fresh("%it");
        let at = self.body.len();
        let first_chunk = self.v(format!("mul i32 {it}, {}", batch * ATTENTION_THREADS as usize));
        let first_chunk = self.v(format!("add i32 {first_chunk}, %tid"));
        let mut loaded = Vec::with_capacity(batch);
        for j in 0..batch {
            let c = self.v(format!("add i32 {first_chunk}, {}", j * ATTENTION_THREADS as usize));
            let row = self.v(format!("udiv i32 {c}, {per_row}"));
            let ch = self.v(format!("urem i32 {c}, {per_row}"));
            let (ok, safe) = self.clamped_row(first, limit, &row);
            let ro = self.v(format!("mul i64 {safe}, {rs}"));
            let c4 = self.v(format!("shl i32 {ch}, 2"));
            let c64 = self.v(format!("zext i32 {c4} to i64"));
            let off = self.v(format!("add i64 {ro}, {c64}"));
            let p = self.v(format!("getelementptr float, ptr {base}, i64 {off}"));
            let x = self.v(format!("load <4 x float>, ptr {p}, align 16"));
            let x = self.v(format!("select i1 {ok}, <4 x float> {x}, <4 x float> zeroinitializer"));
            loaded.push((row, c4, x));
        }
        for (row, col, x) in loaded {
            let xs: [String; 4] =
                std::array::from_fn(|j| self.v(format!("extractelement <4 x float> {x}, i32 {j}")));
            if tile.layout == Layout::SwizzledT {
                // Four rows of Vᵀ: an element each.
                for (j, xj) in xs.iter().enumerate() {
                    let cj = self.v(format!("add i32 {col}, {j}"));
                    let o = self.element_at(tile, &row, &cj);
                    let sp = self.smem(&o);
                    let h = self.v(format!("fptrunc float {xj} to bfloat"));
                    self.emit(format!("store bfloat {h}, ptr addrspace(3) {sp}, align 2"));
                }
            } else {
                // Four adjacent columns: 8 bytes of one 16-byte chunk.
                let lo = self.pack(&xs[0], &xs[1]);
                let hi = self.pack(&xs[2], &xs[3]);
                let v0 = self.v(format!("insertelement <2 x i32> poison, i32 {lo}, i32 0"));
                let v1 = self.v(format!("insertelement <2 x i32> {v0}, i32 {hi}, i32 1"));
                let o = self.element_at(tile, &row, &col);
                let sp = self.smem(&o);
                self.emit(format!("store <2 x i32> {v1}, ptr addrspace(3) {sp}, align 8"));
            }
        }
        let next = self.v(format!("add i32 {it}, 1"));
        let more = self.v(format!("icmp ult i32 {next}, {}", each / batch));
        let id = self.no_unroll();
        self.emit(format!("br i1 {more}, label %{round}, label %{done}, !llvm.loop {id}"));
        self.body.insert_str(at, &format!("  {it} = phi i32 [ 0, %{pre} ], [ {next}, %{round} ]\n"));
        self.block(&done);
    }

    /// A fresh loop identifier (metadata, defined at the module's end) that
    /// tells LLVM not to unroll the loop.
    fn no_unroll(&mut self) -> String {
        let id = LOOP_METADATA + 2 * self.loops.len();
        self.loops.push(format!(
            "!{id} = distinct !{{!{id}, !{}}}\n!{} = !{{!\"llvm.loop.unroll.disable\"}}",
            id + 1,
            id + 1
        ));
        format!("!{id}")
    }

    /// A split's partial results: each row's maximum and sum (written by the
    /// first lane of its four) and unnormalized outputs, at row `r` of split
    /// `s` of block of rows `b`: `partials[((b·splits + s)·64 + r)·(d + 2)]`.
    /// Then the block counts itself done on the block of rows' counter; the
    /// last of its splits goes on to `combine`, the others to the next unit.
    fn partial(
        &mut self,
        desc: &Desc,
        (rest, split): (&str, &str),
        (w16, g, q2): (&str, &str, &str),
        (maxima, sums, outs): (&[String; 2], &[String; 2], &[[String; 4]]),
    ) {
        let d = self.d;
        self.block("partial");
        let rs = self.v(format!("mul i64 {rest}, {}", desc.splits));
        let rs = self.v(format!("add i64 {rs}, {split}"));
        let first_row = self.v(format!("mul i64 {rs}, {ATTENTION_ROWS}"));
        let lead = self.v(format!("icmp eq i64 {q2}, 0"));
        for h in 0..2 {
            let r = self.v(format!("add i32 {w16}, {g}"));
            let r = self.v(format!("add i32 {r}, {}", 8 * h));
            let r64 = self.v(format!("zext i32 {r} to i64"));
            let row = self.v(format!("add i64 {first_row}, {r64}"));
            let at = self.v(format!("mul i64 {row}, {}", d + 2));
            let rec = self.v(format!("getelementptr float, ptr {}, i64 {at}", desc.partials));
            let (yes, next) = (self.fresh("partial.head"), self.fresh("partial.outs"));
            self.emit(format!("br i1 {lead}, label %{yes}, label %{next}"));
            self.block(&yes);
            self.emit(format!("store float {}, ptr {rec}, align 4", maxima[h]));
            let lp = self.v(format!("getelementptr float, ptr {rec}, i64 1"));
            self.emit(format!("store float {}, ptr {lp}, align 4", sums[h]));
            self.emit(format!("br label %{next}"));
            self.block(&next);
            for (t, ot) in outs.iter().enumerate() {
                for e in [2 * h, 2 * h + 1] {
                    let col = self.v(format!("add i64 {q2}, {}", 2 + t * 8 + (e & 1)));
                    let p = self.v(format!("getelementptr float, ptr {rec}, i64 {col}"));
                    self.emit(format!("store float {}, ptr {p}, align 4", ot[e]));
                }
            }
        }
        // Every thread's partials are visible device-wide before the count.
        self.emit("call void @llvm.nvvm.membar.gl()");
        self.emit("call void @llvm.nvvm.barrier0()");
        let flag = self.smem(&plan::gpu::attention_tiles(d).to_string());
        let t0 = self.v("icmp eq i32 %tid, 0");
        self.emit(format!("br i1 {t0}, label %partial.count, label %partial.counted"));
        self.block("partial.count");
        let cp = self.v(format!("getelementptr i64, ptr {}, i64 {rest}", desc.counters));
        let old = self.v(format!("atomicrmw add ptr {cp}, i64 1 monotonic"));
        let last_split = self.v(format!("sub i64 {}, 1", desc.splits));
        let last = self.v(format!("icmp eq i64 {old}, {last_split}"));
        let word = self.v(format!("zext i1 {last} to i32"));
        self.emit(format!("store i32 {word}, ptr addrspace(3) {flag}, align 4"));
        // The last split sets the counter back to zero (every split has
        // counted): the next launch finds it as the runtime first wrote it.
        self.emit(format!("br i1 {last}, label %partial.reset, label %partial.counted"));
        self.block("partial.reset");
        self.emit(format!("store atomic i64 0, ptr {cp} monotonic, align 8"));
        self.emit("br label %partial.counted");
        self.block("partial.counted");
        self.emit("call void @llvm.nvvm.barrier0()");
        let flag = self.smem(&plan::gpu::attention_tiles(d).to_string());
        let word = self.v(format!("load i32, ptr addrspace(3) {flag}, align 4"));
        let last = self.v(format!("icmp ne i32 {word}, 0"));
        self.emit(format!("br i1 {last}, label %combine, label %unit.latch"));
    }

    /// The last split of a block of rows combines the splits' partials: for
    /// each of its rows and columns, the splits' maxima, sums and outputs
    /// merged as online softmax merges chunks, divided by the sum, stored.
    fn combine(&mut self, desc: &Desc, (rest, q0): (&str, &str), obase: &str, (os_r, os_c): (&str, &str)) {
        let d = self.d;
        let total = ATTENTION_ROWS * d;
        self.block("combine");
        // The other splits' partials, now that their counts are seen.
        self.emit("call void @llvm.nvvm.membar.gl()");
        let rs0 = self.v(format!("mul i64 {rest}, {}", desc.splits));
        self.emit("br label %comb.head");
        self.block("comb.head");
        self.emit("%ce = phi i32 [ %tid, %combine ], [ %ce.next, %comb.latch ]");
        let more = self.v(format!("icmp ult i32 %ce, {total}"));
        self.emit(format!("br i1 {more}, label %comb.body, label %unit.latch"));
        self.block("comb.body");
        let r = self.v(format!("udiv i32 %ce, {d}"));
        let c = self.v(format!("urem i32 %ce, {d}"));
        let r64 = self.v(format!("zext i32 {r} to i64"));
        let c64 = self.v(format!("zext i32 {c} to i64"));
        let grow = self.v(format!("add i64 {q0}, {r64}"));
        let ok = self.v(format!("icmp slt i64 {grow}, {}", desc.lq));
        self.emit(format!("br i1 {ok}, label %comb.s, label %comb.latch"));
        self.block("comb.s");
        let at = self.body.len();
        let sp = self.v(format!("add i64 {rs0}, %cs"));
        let row = self.v(format!("mul i64 {sp}, {ATTENTION_ROWS}"));
        let row = self.v(format!("add i64 {row}, {r64}"));
        let off = self.v(format!("mul i64 {row}, {}", d + 2));
        let rec = self.v(format!("getelementptr float, ptr {}, i64 {off}", desc.partials));
        // Volatile: read from L2, not from a line this SM's L1 may hold from
        // before another block wrote it (records of neighbouring blocks of
        // rows share lines).
        let ms = self.v(format!("load volatile float, ptr {rec}, align 4"));
        let lp = self.v(format!("getelementptr float, ptr {rec}, i64 1"));
        let ls = self.v(format!("load volatile float, ptr {lp}, align 4"));
        let c2 = self.v(format!("add i64 {c64}, 2"));
        let op = self.v(format!("getelementptr float, ptr {rec}, i64 {c2}"));
        let os = self.v(format!("load volatile float, ptr {op}, align 4"));
        let mn = self.max("%cm", &ms);
        let base = self.exp_base(&mn);
        let da = self.v(format!("fsub float %cm, {base}"));
        let a = self.exp(&da);
        let db = self.v(format!("fsub float {ms}, {base}"));
        let b = self.exp(&db);
        let la = self.v(format!("fmul float %cl, {a}"));
        let lb = self.v(format!("fmul float {ls}, {b}"));
        let ln = self.v(format!("fadd float {la}, {lb}"));
        let oa = self.v(format!("fmul float %co, {a}"));
        let ob = self.v(format!("fmul float {os}, {b}"));
        let on = self.v(format!("fadd float {oa}, {ob}"));
        let sn = self.v("add i64 %cs, 1");
        let again = self.v(format!("icmp ult i64 {sn}, {}", desc.splits));
        self.emit(format!("br i1 {again}, label %comb.s, label %comb.store"));
        let phis = format!(
            "  %cs = phi i64 [ 0, %comb.body ], [ {sn}, %comb.s ]\n  %cm = phi float [ {NEG_INF}, %comb.body ], [ {mn}, %comb.s ]\n  %cl = phi float [ 0.0, %comb.body ], [ {ln}, %comb.s ]\n  %co = phi float [ 0.0, %comb.body ], [ {on}, %comb.s ]\n"
        );
        self.body.insert_str(at, &phis);
        self.block("comb.store");
        let y = self.over_sum(&on, &ln);
        let ro = self.v(format!("mul i64 {grow}, {os_r}"));
        let co = self.v(format!("mul i64 {c64}, {os_c}"));
        let o = self.v(format!("add i64 {ro}, {co}"));
        self.store_output(&y, obase, &o);
        self.emit("br label %comb.latch");
        self.block("comb.latch");
        self.emit(format!("%ce.next = add i32 %ce, {ATTENTION_THREADS}"));
        self.emit("br label %comb.head");
    }

    fn generate(&mut self) {
        let d = self.d;
        let wgmma = self.mma == AttentionMma::Wgmma;
        let (tq, tk, tv) = if wgmma {
            // 1024-byte aligned (a swizzle atom's): `d` is a multiple of 64.
            let tile = ATTENTION_ROWS.max(ATTENTION_KEYS) * 2 * d;
            let sw = Layout::Swizzled;
            (
                Tile { base: 0, layout: sw },
                Tile { base: tile, layout: sw },
                Tile { base: 2 * tile, layout: Layout::SwizzledT },
            )
        } else {
            let tile = ATTENTION_ROWS.max(ATTENTION_KEYS) * self.pitch;
            let pad = Layout::Padded;
            (
                Tile { base: 0, layout: pad },
                Tile { base: tile, layout: pad },
                Tile { base: 2 * tile, layout: pad },
            )
        };
        let smem0 = self.v("ptrtoint ptr addrspace(3) @smem to i32");
        self.emit("%tid = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()");
        let bid = self.v("call i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()");
        let warp = self.v("lshr i32 %tid, 5");
        let lane = self.v("and i32 %tid, 31");
        let g = self.v(format!("lshr i32 {lane}, 2"));
        let q = self.v(format!("and i32 {lane}, 3"));
        let desc = Desc {
            status: self.pointer(0),
            q: self.pointer(1),
            k: self.pointer(2),
            v: self.pointer(3),
            o: self.pointer(4),
            partials: self.pointer(5),
            counters: self.pointer(6),
            lq: self.word(7),
            lk: self.word(8),
            qblocks: self.word(9),
            entries: self.word(10),
            splits: self.word(11),
            strides: std::array::from_fn(|i| self.word(12 + i)),
        };
        // The block's units (a split of the keys of an entry's block of query
        // rows) taken grid-stride, so that any grid is correct.
        let b64 = self.v(format!("zext i32 {bid} to i64"));
        let nb = self.v("call i32 @llvm.nvvm.read.ptx.sreg.nctaid.x()");
        let nb64 = self.v(format!("zext i32 {nb} to i64"));
        let row_blocks = self.v(format!("mul i64 {}, {}", desc.entries, desc.qblocks));
        let units = self.v(format!("mul i64 {row_blocks}, {}", desc.splits));
        let some = self.v(format!("icmp ult i64 {b64}, {units}"));
        self.emit("br label %units.pre");
        self.block("units.pre");
        self.emit(format!("br i1 {some}, label %unit, label %exit"));
        self.block("unit");
        self.emit(format!("%u = phi i64 [ {b64}, %units.pre ], [ %u.next, %unit.latch ]"));
        // Every warp is done with the last unit's tiles.
        self.emit("call void @llvm.nvvm.barrier0()");
        let split = self.v(format!("urem i64 %u, {}", desc.splits));
        let rest = self.v(format!("udiv i64 %u, {}", desc.splits));
        let ent = self.v(format!("udiv i64 {rest}, {}", desc.qblocks));
        let qb = self.v(format!("urem i64 {rest}, {}", desc.qblocks));
        let q0 = self.v(format!("mul i64 {qb}, {ATTENTION_ROWS}"));
        let e4 = self.v(format!("mul i64 {ent}, 4"));
        let first = self.v(format!("add i64 {e4}, {}", plan::gpu::ATTENTION_HEADER));
        let mut bases = Vec::new();
        for (i, p) in [&desc.q, &desc.k, &desc.v, &desc.o].into_iter().enumerate() {
            let w = self.v(format!("add i64 {first}, {i}"));
            let wp = self.v(format!("getelementptr inbounds i64, ptr %desc, i64 {w}"));
            let off = self.v(format!("load i64, ptr {wp}, align 8"));
            // (The output's elements are bf16's where it is stored so.)
            let elem = if i == 3 && self.out_bf16 { "i16" } else { "float" };
            bases.push(self.v(format!("getelementptr {elem}, ptr {p}, i64 {off}")));
        }
        let [qs_r, qs_c, ks_k, ks_c, vs_k, vs_c, os_r, os_c] = desc.strides.clone();

        // The block's Q tile (each warp reads the fragments of its 16 rows).
        let qbase = bases[0].clone();
        self.load_tile("q", &tq, &qbase, (&q0, &desc.lq), (&qs_r, &qs_c));
        self.async_proxy_fence();
        self.emit("call void @llvm.nvvm.barrier0()");
        let l16 = self.v(format!("and i32 {lane}, 15"));
        let hi = self.v(format!("lshr i32 {lane}, 4"));
        let w16 = self.v(format!("shl i32 {warp}, 4"));
        let arow = self.v(format!("add i32 {w16}, {l16}"));
        // Lane offsets of the K (non-transposed) and V (transposed) fragments.
        let l8 = self.v(format!("and i32 {lane}, 7"));
        let mid = self.v(format!("lshr i32 {lane}, 3"));
        let mid1 = self.v(format!("and i32 {mid}, 1"));
        let mid8 = self.v(format!("shl i32 {mid1}, 3"));
        let hi8 = self.v(format!("shl i32 {hi}, 3"));
        let krow = self.v(format!("add i32 {l8}, {hi8}"));
        let vrow = self.v(format!("add i32 {l8}, {mid8}"));
        // The lane's rows (g and g + 8 of its warp's 16), as i64 positions.
        let g64 = self.v(format!("zext i32 {g} to i64"));
        let w64 = self.v(format!("zext i32 {w16} to i64"));
        let r0a = self.v(format!("add i64 {q0}, {w64}"));
        let r0 = self.v(format!("add i64 {r0a}, {g64}"));
        let r1 = self.v(format!("add i64 {r0}, 8"));
        let last_q = self.v(format!("sub i64 {}, 1", desc.lq));
        let last_k = self.v(format!("sub i64 {}, 1", desc.lk));
        let rows: Vec<(String, String)> = [r0, r1]
            .into_iter()
            .map(|r| {
                let ok = self.v(format!("icmp slt i64 {r}, {}", desc.lq));
                let rc = self.v(format!("select i1 {ok}, i64 {r}, i64 {last_q}"));
                (ok, rc)
            })
            .collect();
        let q2 = self.v(format!("shl i32 {q}, 1"));
        let q2_64 = self.v(format!("zext i32 {q2} to i64"));
        // The split's chunks of keys: `[lo, hi)`, a share of them all.
        let nchunks_up = self.v(format!("add i64 {}, {}", desc.lk, ATTENTION_KEYS - 1));
        let nchunks = self.v(format!("udiv i64 {nchunks_up}, {ATTENTION_KEYS}"));
        let share_up = self.v(format!("add i64 {nchunks}, {}", desc.splits));
        let share_up = self.v(format!("sub i64 {share_up}, 1"));
        let share = self.v(format!("udiv i64 {share_up}, {}", desc.splits));
        let c_lo = self.v(format!("mul i64 {split}, {share}"));
        let c_end = self.v(format!("add i64 {c_lo}, {share}"));
        let over = self.v(format!("icmp ugt i64 {c_end}, {nchunks}"));
        let c_hi = self.v(format!("select i1 {over}, i64 {nchunks}, i64 {c_end}"));
        let any = self.v(format!("icmp ult i64 {c_lo}, {c_hi}"));
        self.emit("br label %chunks.pre");
        self.block("chunks.pre");
        self.emit(format!("br i1 {any}, label %chunk, label %chunks.done"));

        // One chunk of keys: its loop-carried values are the two rows' maxima and
        // sums and the output accumulators (phis placed once the latch is known).
        self.block("chunk");
        let head = self.body.len();
        let dt = d / 8;
        let m_in = ["%m0", "%m1"].map(String::from);
        let l_in = ["%l0", "%l1"].map(String::from);
        let o_in: Vec<[String; 4]> = (0..dt).map(|t| [0, 1, 2, 3].map(|x| format!("%o{t}.{x}"))).collect();
        let k0 = self.v(format!("mul i64 %kc, {ATTENTION_KEYS}"));
        self.emit("call void @llvm.nvvm.barrier0()");
        let (kbase, vbase) = (bases[1].clone(), bases[2].clone());
        self.load_tile("k", &tk, &kbase, (&k0, &desc.lk), (&ks_k, &ks_c));
        self.load_tile("v", &tv, &vbase, (&k0, &desc.lk), (&vs_k, &vs_c));
        self.async_proxy_fence();
        self.emit("call void @llvm.nvvm.barrier0()");
        let nt = ATTENTION_KEYS / 8;
        let mut s: Vec<[String; 4]> =
            (0..nt).map(|_| ["0.0", "0.0", "0.0", "0.0"].map(String::from)).collect();
        if wgmma {
            // S = Q·Kᵀ: m64n64k16 steps along the head, both from their tiles.
            let descs: Vec<(String, String)> = (0..d / 16)
                .map(|ks| {
                    let at = (ks / 4) * ATTENTION_ROWS * 128 + (ks % 4) * 32;
                    (self.descriptor(&smem0, tq.base + at), self.descriptor(&smem0, tk.base + at))
                })
                .collect();
            let acc: Vec<String> = s.iter().flatten().cloned().collect();
            let out = self.wgmma(ATTENTION_KEYS, WgmmaA::Shared(&descs), &acc);
            s = out.chunks(4).map(|c| std::array::from_fn(|e| c[e].clone())).collect();
        } else {
            // S = Q·Kᵀ, eight m16n8 tiles of keys; Q's fragments read from the
            // tile each chunk (registers held across the chunks would spill at
            // the widest heads).
            let mut qf = Vec::new();
            for ks in 0..d / 16 {
                let c = self.v(format!("add i32 {hi}, {}", 2 * ks));
                let off = self.at(&tq, &arow, &c);
                qf.push(self.ldmatrix(&off, false));
            }
            for (ks, a) in qf.iter().enumerate() {
                for np in 0..nt / 2 {
                    let row = self.v(format!("add i32 {krow}, {}", np * 16));
                    let c = self.v(format!("add i32 {mid1}, {}", 2 * ks));
                    let off = self.at(&tk, &row, &c);
                    let x = self.ldmatrix(&off, false);
                    let (b0, b1) = ([x[0].clone(), x[1].clone()], [x[2].clone(), x[3].clone()]);
                    self.mma(a, &b0, &mut s[2 * np]);
                    self.mma(a, &b1, &mut s[2 * np + 1]);
                }
            }
        }
        // The logits (minus infinity past the keys and rows). A whole chunk
        // reads its keys unclamped (their addresses a constant apart, the
        // model's buffers read at offsets of one base); the last, partial one
        // clamps each key into range and masks it.
        let full_end = self.v(format!("add i64 {k0}, {ATTENTION_KEYS}"));
        let full = self.v(format!("icmp sle i64 {full_end}, {}", desc.lk));
        let (lf, le, lj) = (self.fresh("logits.full"), self.fresh("logits.edge"), self.fresh("logits.join"));
        self.emit(format!("br i1 {full}, label %{lf}, label %{le}"));
        let mut paths: Vec<Vec<[String; 4]>> = Vec::new();
        for (path, label) in [(true, &lf), (false, &le)] {
            self.block(label);
            let mut xs = Vec::with_capacity(nt);
            for (t, st) in s.iter().enumerate() {
                let mut vals: [String; 4] = Default::default();
                for e in 0..4 {
                    let c = self.v(format!("add i64 {k0}, {}", t * 8 + (e & 1)));
                    let key = self.v(format!("add i64 {c}, {q2_64}"));
                    let (rok, rc) = rows[e >> 1].clone();
                    let (kc, ok) = if path {
                        (key, rok)
                    } else {
                        let kok = self.v(format!("icmp slt i64 {key}, {}", desc.lk));
                        let kc = self.v(format!("select i1 {kok}, i64 {key}, i64 {last_k}"));
                        (kc, self.v(format!("and i1 {kok}, {rok}")))
                    };
                    let f = self.logits.clone();
                    let y = self.v(format!(
                        "call float @{f}(ptr %bufs, ptr %dims, ptr {}, i64 {ent}, i64 {rc}, i64 {kc}, float {})",
                        desc.status, st[e]
                    ));
                    vals[e] = self.v(format!("select i1 {ok}, float {y}, float {NEG_INF}"));
                }
                xs.push(vals);
            }
            self.emit(format!("br label %{lj}"));
            paths.push(xs);
        }
        self.block(&lj);
        let mut x: Vec<[String; 4]> = Vec::with_capacity(nt);
        for (full, edge) in paths[0].iter().zip(&paths[1]) {
            x.push(std::array::from_fn(|e| {
                self.v(format!("phi float [ {}, %{lf} ], [ {}, %{le} ]", full[e], edge[e]))
            }));
        }
        let mut m_next: [String; 2] = Default::default();
        let mut base: [String; 2] = Default::default();
        let mut alpha: [String; 2] = Default::default();
        for h in 0..2 {
            let mut mx = NEG_INF.to_string();
            for xt in &x {
                for e in [2 * h, 2 * h + 1] {
                    mx = self.max(&mx, &xt[e]);
                }
            }
            let mx = self.quad(&mx, Self::max);
            m_next[h] = self.max(&m_in[h], &mx);
            base[h] = self.exp_base(&m_next[h].clone());
            let shifted = self.v(format!("fsub float {}, {}", m_in[h], base[h]));
            alpha[h] = self.exp(&shifted);
        }
        // P = exp(logits - max), the rows' partial sums, P's bf16 fragments.
        let mut p: Vec<[String; 4]> = Vec::with_capacity(nt);
        let mut sums = ["0.0".to_string(), "0.0".to_string()];
        for xt in &x {
            let mut vals: [String; 4] = Default::default();
            for e in 0..4 {
                let sh = self.v(format!("fsub float {}, {}", xt[e], base[e >> 1]));
                vals[e] = self.exp(&sh);
                sums[e >> 1] = self.v(format!("fadd float {}, {}", sums[e >> 1], vals[e]));
            }
            p.push(vals);
        }
        let mut l_next: [String; 2] = Default::default();
        for h in 0..2 {
            let scaled = self.v(format!("fmul float {}, {}", l_in[h], alpha[h]));
            l_next[h] = self.v(format!("fadd float {scaled}, {}", sums[h]));
        }
        let mut o: Vec<[String; 4]> = Vec::with_capacity(dt);
        for ot in &o_in {
            o.push(std::array::from_fn(|e| self.v(format!("fmul float {}, {}", ot[e], alpha[e >> 1]))));
        }
        let mut frags = Vec::with_capacity(nt / 2);
        for ks in 0..nt / 2 {
            let (pa, pb) = (&p[2 * ks], &p[2 * ks + 1]);
            frags.push([
                self.pack(&pa[0], &pa[1]),
                self.pack(&pa[2], &pa[3]),
                self.pack(&pb[0], &pb[1]),
                self.pack(&pb[2], &pb[3]),
            ]);
        }
        if wgmma {
            // O += P·V: m64n{d}k16 steps along the keys, P's fragments (an
            // m16k16 A fragment a warp) from registers, Vᵀ from its tile.
            let steps: Vec<([String; 4], String)> = frags
                .iter()
                .enumerate()
                .map(|(ks, a)| (a.clone(), self.descriptor(&smem0, tv.base + ks * 32)))
                .collect();
            let acc: Vec<String> = o.iter().flatten().cloned().collect();
            let out = self.wgmma(d, WgmmaA::Registers(&steps), &acc);
            o = out.chunks(4).map(|c| std::array::from_fn(|e| c[e].clone())).collect();
        }
        for (ks, a) in frags.iter().enumerate().filter(|_| !wgmma) {
            for dp in 0..d / 16 {
                let row = self.v(format!("add i32 {vrow}, {}", ks * 16));
                let c = self.v(format!("add i32 {hi}, {}", 2 * dp));
                let off = self.at(&tv, &row, &c);
                let xv = self.ldmatrix(&off, true);
                let (b0, b1) = ([xv[0].clone(), xv[1].clone()], [xv[2].clone(), xv[3].clone()]);
                self.mma(a, &b0, &mut o[2 * dp]);
                self.mma(a, &b1, &mut o[2 * dp + 1]);
            }
        }
        self.emit("br label %chunk.latch");
        self.block("chunk.latch");
        let kc1 = self.v("add i64 %kc, 1");
        let again = self.v(format!("icmp ult i64 {kc1}, {c_hi}"));
        self.emit(format!("br i1 {again}, label %chunk, label %chunks.done"));
        let mut phis = format!("  %kc = phi i64 [ {c_lo}, %chunks.pre ], [ {kc1}, %chunk.latch ]\n");
        let mut carried: Vec<(String, &str, String)> = Vec::new();
        for h in 0..2 {
            carried.push((m_in[h].clone(), NEG_INF, m_next[h].clone()));
            carried.push((l_in[h].clone(), "0.0", l_next[h].clone()));
        }
        for (ot, on) in o_in.iter().zip(&o) {
            for e in 0..4 {
                carried.push((ot[e].clone(), "0.0", on[e].clone()));
            }
        }
        for (name, init, next) in &carried {
            let _ = writeln!(phis, "  {name} = phi float [ {init}, %chunks.pre ], [ {next}, %chunk.latch ]");
        }
        self.body.insert_str(head, &phis);

        // The rows' sums across their four lanes, then O / sum stored.
        self.block("chunks.done");
        let mut fin = std::collections::HashMap::new();
        for (name, init, next) in &carried {
            let v = self.v(format!("phi float [ {init}, %chunks.pre ], [ {next}, %chunk.latch ]"));
            fin.insert(name.clone(), v);
        }
        let mut inv: [String; 2] = Default::default();
        let mut sums: [String; 2] = Default::default();
        for h in 0..2 {
            sums[h] = self.quad(&fin[&l_in[h]], Self::add);
            inv[h] = self.over_sum("1.0", &sums[h].clone());
        }
        let whole = self.v(format!("icmp eq i64 {}, 1", desc.splits));
        self.emit(format!("br i1 {whole}, label %direct, label %partial"));
        self.block("direct");
        let obase = bases[3].clone();
        for (t, ot) in o_in.iter().enumerate() {
            for e in 0..4 {
                let (rok, rc) = rows[e >> 1].clone();
                let y = self.v(format!("fmul float {}, {}", fin[&ot[e]], inv[e >> 1]));
                let col = self.v(format!("add i64 {q2_64}, {}", t * 8 + (e & 1)));
                let ro = self.v(format!("mul i64 {rc}, {os_r}"));
                let co = self.v(format!("mul i64 {col}, {os_c}"));
                let off = self.v(format!("add i64 {ro}, {co}"));
                let (yes, next) = (self.fresh("store"), self.fresh("stored"));
                self.emit(format!("br i1 {rok}, label %{yes}, label %{next}"));
                self.block(&yes);
                self.store_output(&y, &obase, &off);
                self.emit(format!("br label %{next}"));
                self.block(&next);
            }
        }
        self.emit("br label %unit.latch");
        let outs: Vec<[String; 4]> = o_in.iter().map(|ot| ot.clone().map(|n| fin[&n].clone())).collect();
        let maxima = [fin[&m_in[0]].clone(), fin[&m_in[1]].clone()];
        self.partial(&desc, (&rest, &split), (&w16, &g, &q2_64), (&maxima, &sums, &outs));
        self.combine(&desc, (&rest, &q0), &bases[3], (&os_r, &os_c));
        self.block("unit.latch");
        self.emit(format!("%u.next = add i64 %u, {nb64}"));
        self.emit(format!("%u.more = icmp ult i64 %u.next, {units}"));
        self.emit("br i1 %u.more, label %unit, label %exit");
        self.block("exit");
        self.emit("ret void");
    }
}
