//! The operand copy kernel (`plan::gpu::OperandCopy`): a contraction's f32
//! operand, a strided view or a convolution's taps, made the bf16 dense
//! matrix the GEMM family reads. A thread an element of the destination,
//! taken grid-stride (adjacent threads write adjacent elements); the
//! descriptor says the form, so one kernel serves every step and shape.

use super::Ir;
use plan::gpu::{OperandCopy, LOOP_THREADS, OPERAND_COPY_HEADER, OPERAND_COPY_KERNEL};

/// The kernel's LLVM IR (NVPTX). Parameters: the source (f32), the
/// destination (bf16), the descriptor (i64 words).
pub fn operand_copy_ir() -> String {
    let mut g = Ir::default();
    let threads = LOOP_THREADS;
    let word = |g: &mut Ir, i: usize| word_at(g, &i.to_string());
    let tid = g.v("call i32 @llvm.nvvm.read.ptx.sreg.tid.x()");
    let bx = g.v("call i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()");
    let nbx = g.v("call i32 @llvm.nvvm.read.ptx.sreg.nctaid.x()");
    let (tid, bx, nbx) = (
        g.v(format!("zext i32 {tid} to i64")),
        g.v(format!("zext i32 {bx} to i64")),
        g.v(format!("zext i32 {nbx} to i64")),
    );
    let first = g.v(format!("mul i64 {bx}, {threads}"));
    let first = g.v(format!("add i64 {first}, {tid}"));
    let stride = g.v(format!("mul i64 {nbx}, {threads}"));
    let form = word(&mut g, 0);
    let entries = word(&mut g, 1);
    let rows = word(&mut g, 2);
    let cols = word(&mut g, 3);
    let per = g.v(format!("mul i64 {rows}, {cols}"));
    let total = g.v(format!("mul i64 {per}, {entries}"));
    let taps = g.v(format!("icmp eq i64 {form}, 2"));
    let transposed = g.v(format!("icmp eq i64 {form}, 1"));
    // A view's strides, or the taps' geometry (read once, before the loop).
    let w: Vec<String> = (4..OPERAND_COPY_HEADER).map(|i| word(&mut g, i)).collect();
    let rows4 = g.v(format!("icmp eq i64 {form}, {}", OperandCopy::ROWS4));
    g.emit(format!("br i1 {rows4}, label %rows4_setup, label %pick"));
    g.block("pick");
    let taps4 = g.v(format!("icmp eq i64 {form}, {}", OperandCopy::TAPS4));
    g.emit(format!("br i1 {taps4}, label %taps4_setup, label %pick32"));
    g.block("pick32");
    let taps1 = g.v(format!("icmp eq i64 {form}, {}", OperandCopy::TAPS32));
    g.emit(format!("br i1 {taps1}, label %taps1_setup, label %pickv"));
    g.block("pickv");
    let view1 = g.v(format!("icmp eq i64 {form}, {}", OperandCopy::VIEW32));
    g.emit(format!("br i1 {view1}, label %view32_setup, label %head"));
    // The 32-bit forms (see `loop32`).
    rows_of_four(&mut g, &w, &total, [&rows, &cols], [&first, &stride]);
    for lanes in [4, 1] {
        narrow_taps(&mut g, lanes, &w, &total, [&rows, &cols], [&first, &stride]);
    }
    narrow_view(&mut g, &w, &total, [&rows, &cols], [&first, &stride]);

    g.block("head");
    let head = g.body.len();
    let more = g.v(format!("icmp slt i64 %i, {total}"));
    g.emit(format!("br i1 {more}, label %body, label %done"));

    g.block("body");
    let e = g.v(format!("udiv i64 %i, {per}"));
    let rem = g.v(format!("urem i64 %i, {per}"));
    let at = g.v(format!("add i64 {e}, {OPERAND_COPY_HEADER}"));
    let base = word_at(&mut g, &at);
    g.emit(format!("br i1 {taps}, label %taps, label %view"));

    // A view: the destination's order is `[rows, cols]`, or `[cols, rows]`.
    g.block("view");
    let inner = g.v(format!("select i1 {transposed}, i64 {rows}, i64 {cols}"));
    let q = g.v(format!("udiv i64 {rem}, {inner}"));
    let r = g.v(format!("urem i64 {rem}, {inner}"));
    let (row, col) = (
        g.v(format!("select i1 {transposed}, i64 {r}, i64 {q}")),
        g.v(format!("select i1 {transposed}, i64 {q}, i64 {r}")),
    );
    let off = g.v(format!("mul i64 {row}, {}", w[0]));
    let off2 = g.v(format!("mul i64 {col}, {}", w[1]));
    let off = g.v(format!("add i64 {off}, {off2}"));
    let off = g.v(format!("add i64 {off}, {base}"));
    let p = g.v(format!("getelementptr inbounds float, ptr addrspace(1) %src, i64 {off}"));
    let xv = g.v(format!("load float, ptr addrspace(1) {p}, align 4"));
    g.emit("br label %store");

    // Taps: row (b, y, x), column (i, j, c).
    g.block("taps");
    let [oh, ow, hh, ww, cc, kw, sh, sw, dh, dw, ph, pw, s_img, s_row, s_pix] =
        std::array::from_fn(|i| w[i].clone());
    let r = g.v(format!("udiv i64 {rem}, {cols}"));
    let d = g.v(format!("urem i64 {rem}, {cols}"));
    let x = g.v(format!("urem i64 {r}, {ow}"));
    let t = g.v(format!("udiv i64 {r}, {ow}"));
    let y = g.v(format!("urem i64 {t}, {oh}"));
    let b = g.v(format!("udiv i64 {t}, {oh}"));
    let c = g.v(format!("urem i64 {d}, {cc}"));
    let t2 = g.v(format!("udiv i64 {d}, {cc}"));
    let j = g.v(format!("urem i64 {t2}, {kw}"));
    let i = g.v(format!("udiv i64 {t2}, {kw}"));
    let coord = |g: &mut Ir, o: &str, s: &str, k: &str, dl: &str, pd: &str| {
        let a = g.v(format!("mul i64 {o}, {s}"));
        let bb = g.v(format!("mul i64 {k}, {dl}"));
        let a = g.v(format!("add i64 {a}, {bb}"));
        g.v(format!("sub i64 {a}, {pd}"))
    };
    let iy = coord(&mut g, &y, &sh, &i, &dh, &ph);
    let ix = coord(&mut g, &x, &sw, &j, &dw, &pw);
    // Unsigned comparisons: a coordinate before the image wraps past its extent.
    let in_y = g.v(format!("icmp ult i64 {iy}, {hh}"));
    let in_x = g.v(format!("icmp ult i64 {ix}, {ww}"));
    let inside = g.v(format!("and i1 {in_y}, {in_x}"));
    let o1 = g.v(format!("mul i64 {b}, {s_img}"));
    let o2 = g.v(format!("mul i64 {iy}, {s_row}"));
    let o3 = g.v(format!("mul i64 {ix}, {s_pix}"));
    let o = g.v(format!("add i64 {o1}, {o2}"));
    let o = g.v(format!("add i64 {o}, {o3}"));
    let o = g.v(format!("add i64 {o}, {c}"));
    let o = g.v(format!("add i64 {o}, {base}"));
    // Outside the image the load reads the entry's first element (in bounds).
    let o = g.v(format!("select i1 {inside}, i64 {o}, i64 {base}"));
    let p = g.v(format!("getelementptr inbounds float, ptr addrspace(1) %src, i64 {o}"));
    let tv = g.v(format!("load float, ptr addrspace(1) {p}, align 4"));
    let tv = g.v(format!("select i1 {inside}, float {tv}, float 0.0"));
    g.emit("br label %store");

    g.block("store");
    let val = g.v(format!("phi float [ {xv}, %view ], [ {tv}, %taps ]"));
    let h = g.v(format!("fptrunc float {val} to bfloat"));
    let dp = g.v("getelementptr inbounds i16, ptr addrspace(1) %dst, i64 %i");
    g.emit(format!("store bfloat {h}, ptr addrspace(1) {dp}, align 2"));
    let next = g.v(format!("add i64 %i, {stride}"));
    g.emit("br label %head");
    g.body.insert_str(head, &format!("  %i = phi i64 [ {first}, %pickv ], [ {next}, %store ]\n"));

    g.block("done");
    g.emit("ret void");
    g.module(
        OPERAND_COPY_KERNEL,
        threads as usize,
        "an element of the destination a thread, grid-stride",
        false,
        "ptr addrspace(1) readonly %src, ptr addrspace(1) %dst, ptr addrspace(1) readonly %desc",
        &[],
    )
}

/// A 32-bit loop's unit ([`loop32`]): its index `q` (i32), its entry's
/// offset into the source (i64), its row and first column in the
/// destination's order (i32).
struct Unit {
    q: String,
    base: String,
    row: String,
    col: String,
}

/// A grid-stride loop in 32-bit index arithmetic (a 64-bit division is a
/// long software routine; the source's offsets stay 64-bit) over the
/// destination's units of `1 << shift` adjacent columns, its `[rows, cols]`
/// (i64) given by `dims` in the loop's setup block. The units are compared
/// unsigned: past the last, `q` plus the grid's stride may pass 2³¹. Blocks
/// `{name}_setup`, `{name}_head` and `{name}_body` (which `body` fills with
/// a unit's copy), then `done`.
fn loop32(
    g: &mut Ir,
    name: &str,
    shift: u32,
    total: &str,
    [first, stride]: [&str; 2],
    dims: impl FnOnce(&mut Ir) -> [String; 2],
    body: impl FnOnce(&mut Ir, &Unit),
) {
    let (setup, head_bb, body_bb, q) =
        (format!("{name}_setup"), format!("{name}_head"), format!("{name}_body"), format!("%q_{name}"));
    g.block(&setup);
    let [rows, cols] = dims(g);
    let t32 = g.v(format!("trunc i64 {total} to i32"));
    let units = g.v(format!("lshr i32 {t32}, {shift}"));
    let c32 = g.v(format!("trunc i64 {cols} to i32"));
    let per_row = g.v(format!("lshr i32 {c32}, {shift}"));
    let r32 = g.v(format!("trunc i64 {rows} to i32"));
    let per_entry = g.v(format!("mul i32 {r32}, {per_row}"));
    let first32 = g.v(format!("trunc i64 {first} to i32"));
    let stride32 = g.v(format!("trunc i64 {stride} to i32"));
    g.emit(format!("br label %{head_bb}"));

    g.block(&head_bb);
    let head = g.body.len();
    let more = g.v(format!("icmp ult i32 {q}, {units}"));
    g.emit(format!("br i1 {more}, label %{body_bb}, label %done"));

    g.block(&body_bb);
    let e = g.v(format!("udiv i32 {q}, {per_entry}"));
    let in_e = g.v(format!("mul i32 {e}, {per_entry}"));
    let rem = g.v(format!("sub i32 {q}, {in_e}"));
    let row = g.v(format!("udiv i32 {rem}, {per_row}"));
    let in_row = g.v(format!("mul i32 {row}, {per_row}"));
    let unit = g.v(format!("sub i32 {rem}, {in_row}"));
    let col = g.v(format!("shl i32 {unit}, {shift}"));
    let e64 = g.v(format!("zext i32 {e} to i64"));
    let at = g.v(format!("add i64 {e64}, {OPERAND_COPY_HEADER}"));
    let base = word_at(g, &at);
    body(g, &Unit { q: q.clone(), base, row, col });
    let next = g.v(format!("add i32 {q}, {stride32}"));
    g.emit(format!("br label %{head_bb}"));
    g.body.insert_str(head, &format!("  {q} = phi i32 [ {first32}, %{setup} ], [ {next}, %{body_bb} ]\n"));
}

/// Rows of four ([`OperandCopy::ROWS4`]): a row-major view whose columns,
/// row stride and offsets are multiples of four, under 2³¹ elements in all:
/// a thread four adjacent elements a turn (one 16-byte load, one 8-byte
/// store). Blocks `rows4_*`.
fn rows_of_four(g: &mut Ir, w: &[String], total: &str, [rows, cols]: [&str; 2], starts: [&str; 2]) {
    let dims = |_: &mut Ir| [rows.to_string(), cols.to_string()];
    loop32(g, "rows4", 2, total, starts, dims, |g, u| {
        let row64 = g.v(format!("zext i32 {} to i64", u.row));
        let col64 = g.v(format!("zext i32 {} to i64", u.col));
        let roff = g.v(format!("mul i64 {row64}, {}", w[0]));
        let off = g.v(format!("add i64 {roff}, {col64}"));
        let off = g.v(format!("add i64 {off}, {}", u.base));
        let p = g.v(format!("getelementptr inbounds float, ptr addrspace(1) %src, i64 {off}"));
        let x4 = g.v(format!("load <4 x float>, ptr addrspace(1) {p}, align 16"));
        store_quad(g, &x4, &u.q);
    });
}

/// The taps' 32-bit forms: `lanes` 4, the taps-of-four form
/// ([`OperandCopy::TAPS4`]: a thread four adjacent columns of a row,
/// channels `c..c + 4` of one tap, one 16-byte load or zeros, one 8-byte
/// store a turn), or 1 ([`OperandCopy::TAPS32`]: an element a thread).
/// Blocks `taps{lanes}_*`.
fn narrow_taps(
    g: &mut Ir,
    lanes: u32,
    w: &[String],
    total: &str,
    [rows, cols]: [&str; 2],
    starts: [&str; 2],
) {
    let dims = |_: &mut Ir| [rows.to_string(), cols.to_string()];
    loop32(g, &format!("taps{lanes}"), lanes.trailing_zeros(), total, starts, dims, |g, u| {
        taps_unit(g, lanes, w, u)
    });
}

/// A unit of [`narrow_taps`]: its row `(b, y, x)` and columns `(i, j, c..c + lanes)`.
fn taps_unit(g: &mut Ir, lanes: u32, w: &[String], u: &Unit) {
    // The geometry (the taps' words: `oh, ow, H, W, C, kw, sh, sw, dh, dw, ph,
    // pw`) in 32 bits; the image's strides stay 64-bit.
    let geo: Vec<String> = w[..12].iter().map(|x| g.v(format!("trunc i64 {x} to i32"))).collect();
    let [oh, ow, hh, ww, cc, kw, sh, sw, dh, dw, ph, pw] = std::array::from_fn(|i| geo[i].clone());
    let (s_img, s_row, s_pix) = (&w[12], &w[13], &w[14]);
    let (r, d, base, q) = (&u.row, &u.col, &u.base, &u.q);
    // Row (b, y, x), column (i, j, c).
    let t = g.v(format!("udiv i32 {r}, {ow}"));
    let tw = g.v(format!("mul i32 {t}, {ow}"));
    let x = g.v(format!("sub i32 {r}, {tw}"));
    let b = g.v(format!("udiv i32 {t}, {oh}"));
    let bh = g.v(format!("mul i32 {b}, {oh}"));
    let y = g.v(format!("sub i32 {t}, {bh}"));
    let tap = g.v(format!("udiv i32 {d}, {cc}"));
    let tc = g.v(format!("mul i32 {tap}, {cc}"));
    let c = g.v(format!("sub i32 {d}, {tc}"));
    let i = g.v(format!("udiv i32 {tap}, {kw}"));
    let ik = g.v(format!("mul i32 {i}, {kw}"));
    let j = g.v(format!("sub i32 {tap}, {ik}"));
    let coord = |g: &mut Ir, o: &str, s: &str, k: &str, dl: &str, pd: &str| {
        let a = g.v(format!("mul i32 {o}, {s}"));
        let bb = g.v(format!("mul i32 {k}, {dl}"));
        let a = g.v(format!("add i32 {a}, {bb}"));
        g.v(format!("sub i32 {a}, {pd}"))
    };
    let iy = coord(g, &y, &sh, &i, &dh, &ph);
    let ix = coord(g, &x, &sw, &j, &dw, &pw);
    // Unsigned comparisons: a coordinate before the image wraps past its extent.
    let in_y = g.v(format!("icmp ult i32 {iy}, {hh}"));
    let in_x = g.v(format!("icmp ult i32 {ix}, {ww}"));
    let inside = g.v(format!("and i1 {in_y}, {in_x}"));
    let wide = |g: &mut Ir, v: &str| g.v(format!("zext i32 {v} to i64"));
    let (b64, iy64, ix64, c64) = (wide(g, &b), wide(g, &iy), wide(g, &ix), wide(g, &c));
    let o1 = g.v(format!("mul i64 {b64}, {s_img}"));
    let o2 = g.v(format!("mul i64 {iy64}, {s_row}"));
    let o3 = g.v(format!("mul i64 {ix64}, {s_pix}"));
    let o = g.v(format!("add i64 {o1}, {o2}"));
    let o = g.v(format!("add i64 {o}, {o3}"));
    let o = g.v(format!("add i64 {o}, {c64}"));
    let o = g.v(format!("add i64 {o}, {base}"));
    // Outside the image the load reads the entry's first values (in bounds).
    let o = g.v(format!("select i1 {inside}, i64 {o}, i64 {base}"));
    let p = g.v(format!("getelementptr inbounds float, ptr addrspace(1) %src, i64 {o}"));
    if lanes == 4 {
        let x4 = g.v(format!("load <4 x float>, ptr addrspace(1) {p}, align 16"));
        let x4 = g.v(format!("select i1 {inside}, <4 x float> {x4}, <4 x float> zeroinitializer"));
        store_quad(g, &x4, q);
    } else {
        let x = g.v(format!("load float, ptr addrspace(1) {p}, align 4"));
        let x = g.v(format!("select i1 {inside}, float {x}, float 0.0"));
        let h = g.v(format!("fptrunc float {x} to bfloat"));
        let q64 = g.v(format!("zext i32 {q} to i64"));
        let dp = g.v(format!("getelementptr inbounds i16, ptr addrspace(1) %dst, i64 {q64}"));
        g.emit(format!("store bfloat {h}, ptr addrspace(1) {dp}, align 2"));
    }
}

/// A view an element a thread in 32-bit index arithmetic
/// ([`OperandCopy::VIEW32`]): the destination's order `[rows, cols]`, or
/// `[cols, rows]` where word 6 says transposed. Blocks `view32_*`.
fn narrow_view(g: &mut Ir, w: &[String], total: &str, [rows, cols]: [&str; 2], starts: [&str; 2]) {
    let transposed = "%view32_transposed";
    let dims = |g: &mut Ir| {
        g.emit(format!("{transposed} = icmp ne i64 {}, 0", w[2]));
        let out_rows = g.v(format!("select i1 {transposed}, i64 {cols}, i64 {rows}"));
        let out_cols = g.v(format!("select i1 {transposed}, i64 {rows}, i64 {cols}"));
        [out_rows, out_cols]
    };
    loop32(g, "view32", 0, total, starts, dims, |g, u| {
        let row = g.v(format!("select i1 {transposed}, i32 {}, i32 {}", u.col, u.row));
        let col = g.v(format!("select i1 {transposed}, i32 {}, i32 {}", u.row, u.col));
        let row64 = g.v(format!("zext i32 {row} to i64"));
        let col64 = g.v(format!("zext i32 {col} to i64"));
        let o1 = g.v(format!("mul i64 {row64}, {}", w[0]));
        let o2 = g.v(format!("mul i64 {col64}, {}", w[1]));
        let o = g.v(format!("add i64 {o1}, {o2}"));
        let o = g.v(format!("add i64 {o}, {}", u.base));
        let p = g.v(format!("getelementptr inbounds float, ptr addrspace(1) %src, i64 {o}"));
        let x = g.v(format!("load float, ptr addrspace(1) {p}, align 4"));
        let h = g.v(format!("fptrunc float {x} to bfloat"));
        let q64 = g.v(format!("zext i32 {} to i64", u.q));
        let dp = g.v(format!("getelementptr inbounds i16, ptr addrspace(1) %dst, i64 {q64}"));
        g.emit(format!("store bfloat {h}, ptr addrspace(1) {dp}, align 2"));
    });
}

/// Four f32 values `x4` stored as bf16 at quad `q` (an i32) of the
/// destination: converted element by element (a vector conversion is a
/// library call on the host emulator; NVPTX pairs them into
/// `cvt.rn.bf16x2.f32` either way), one 8-byte store.
fn store_quad(g: &mut Ir, x4: &str, q: &str) {
    let mut h4 = "poison".to_string();
    for j in 0..4 {
        let x = g.v(format!("extractelement <4 x float> {x4}, i32 {j}"));
        let h = g.v(format!("fptrunc float {x} to bfloat"));
        h4 = g.v(format!("insertelement <4 x bfloat> {h4}, bfloat {h}, i32 {j}"));
    }
    let q64 = g.v(format!("zext i32 {q} to i64"));
    let dp = g.v(format!("getelementptr inbounds <4 x i16>, ptr addrspace(1) %dst, i64 {q64}"));
    g.emit(format!("store <4 x bfloat> {h4}, ptr addrspace(1) {dp}, align 8"));
}

/// Descriptor word `at` (an i64 value).
fn word_at(g: &mut Ir, at: &str) -> String {
    let p = g.v(format!("getelementptr inbounds i64, ptr addrspace(1) %desc, i64 {at}"));
    g.v(format!("load i64, ptr addrspace(1) {p}, align 8"))
}
