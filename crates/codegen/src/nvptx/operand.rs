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
    for lanes in [4, 1] {
        narrow_taps(&mut g, lanes, &w, [&total, &rows, &cols], [&first, &stride]);
    }
    narrow_view(&mut g, &w, [&total, &rows, &cols], [&first, &stride]);

    // Rows of four: a row-major view whose columns, row stride and offsets
    // are multiples of four, under 2³¹ elements in all: a thread four
    // adjacent elements a turn (one 16-byte load, one 8-byte store), its
    // indices in 32 bits (a 64-bit division is a long software routine).
    g.block("rows4_setup");
    let t32 = g.v(format!("trunc i64 {total} to i32"));
    let chunks = g.v(format!("lshr i32 {t32}, 2"));
    let c32 = g.v(format!("trunc i64 {cols} to i32"));
    let quads = g.v(format!("lshr i32 {c32}, 2"));
    let r32 = g.v(format!("trunc i64 {rows} to i32"));
    let per4 = g.v(format!("mul i32 {r32}, {quads}"));
    let first32 = g.v(format!("trunc i64 {first} to i32"));
    let stride32 = g.v(format!("trunc i64 {stride} to i32"));
    g.emit("br label %rows4_head");
    g.block("rows4_head");
    let head4 = g.body.len();
    let more4 = g.v(format!("icmp slt i32 %q, {chunks}"));
    g.emit(format!("br i1 {more4}, label %rows4_body, label %done"));
    g.block("rows4_body");
    let e4 = g.v(format!("udiv i32 %q, {per4}"));
    let in_e = g.v(format!("mul i32 {e4}, {per4}"));
    let rem4 = g.v(format!("sub i32 %q, {in_e}"));
    let row4 = g.v(format!("udiv i32 {rem4}, {quads}"));
    let in_row = g.v(format!("mul i32 {row4}, {quads}"));
    let quad = g.v(format!("sub i32 {rem4}, {in_row}"));
    let e64 = g.v(format!("zext i32 {e4} to i64"));
    let at4 = g.v(format!("add i64 {e64}, {OPERAND_COPY_HEADER}"));
    let base4 = word_at(&mut g, &at4);
    let row64 = g.v(format!("zext i32 {row4} to i64"));
    let quad64 = g.v(format!("zext i32 {quad} to i64"));
    let roff = g.v(format!("mul i64 {row64}, {}", w[0]));
    let coff = g.v(format!("shl i64 {quad64}, 2"));
    let off4 = g.v(format!("add i64 {roff}, {coff}"));
    let off4 = g.v(format!("add i64 {off4}, {base4}"));
    let sp4 = g.v(format!("getelementptr inbounds float, ptr addrspace(1) %src, i64 {off4}"));
    let x4 = g.v(format!("load <4 x float>, ptr addrspace(1) {sp4}, align 16"));
    store_quad(&mut g, &x4, "%q");
    let next4 = g.v(format!("add i32 %q, {stride32}"));
    g.emit("br label %rows4_head");
    g.body.insert_str(
        head4,
        &format!("  %q = phi i32 [ {first32}, %rows4_setup ], [ {next4}, %rows4_body ]\n"),
    );

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

/// The taps' forms in 32-bit index arithmetic (a 64-bit division is a long
/// software routine; the source's offset stays 64-bit): `lanes` 4, the
/// taps-of-four form ([`OperandCopy::TAPS4`]: a thread four adjacent
/// columns of a row, channels `c..c + 4` of one tap, one 16-byte load or
/// zeros, one 8-byte store a turn), or 1 ([`OperandCopy::TAPS32`]: an element
/// a thread). Blocks `taps{lanes}_setup` to `done`.
fn narrow_taps(
    g: &mut Ir,
    lanes: u32,
    w: &[String],
    [total, rows, cols]: [&str; 3],
    [first, stride]: [&str; 2],
) {
    let (setup, head_bb, body, q) = (
        format!("taps{lanes}_setup"),
        format!("taps{lanes}_head"),
        format!("taps{lanes}_body"),
        format!("%qt{lanes}"),
    );
    let shift = lanes.trailing_zeros();
    g.block(&setup);
    let t32 = g.v(format!("trunc i64 {total} to i32"));
    let chunks = g.v(format!("lshr i32 {t32}, {shift}"));
    let c32 = g.v(format!("trunc i64 {cols} to i32"));
    let quads = g.v(format!("lshr i32 {c32}, {shift}"));
    let r32 = g.v(format!("trunc i64 {rows} to i32"));
    let per4 = g.v(format!("mul i32 {r32}, {quads}"));
    let first32 = g.v(format!("trunc i64 {first} to i32"));
    let stride32 = g.v(format!("trunc i64 {stride} to i32"));
    // The geometry (the taps' words: `oh, ow, H, W, C, kw, sh, sw, dh, dw, ph,
    // pw`) in 32 bits; the image's strides stay 64-bit.
    let geo: Vec<String> = w[..12].iter().map(|x| g.v(format!("trunc i64 {x} to i32"))).collect();
    let [oh, ow, hh, ww, cc, kw, sh, sw, dh, dw, ph, pw] = std::array::from_fn(|i| geo[i].clone());
    let (s_img, s_row, s_pix) = (&w[12], &w[13], &w[14]);
    g.emit(format!("br label %{head_bb}"));

    g.block(&head_bb);
    let head = g.body.len();
    // Unsigned: past the last unit, `q` plus the grid's stride may pass 2³¹.
    let more = g.v(format!("icmp ult i32 {q}, {chunks}"));
    g.emit(format!("br i1 {more}, label %{body}, label %done"));

    g.block(&body);
    let e = g.v(format!("udiv i32 {q}, {per4}"));
    let in_e = g.v(format!("mul i32 {e}, {per4}"));
    let rem = g.v(format!("sub i32 {q}, {in_e}"));
    let r = g.v(format!("udiv i32 {rem}, {quads}"));
    let in_row = g.v(format!("mul i32 {r}, {quads}"));
    let d4 = g.v(format!("sub i32 {rem}, {in_row}"));
    let d = g.v(format!("shl i32 {d4}, {shift}"));
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
    let e64 = g.v(format!("zext i32 {e} to i64"));
    let at = g.v(format!("add i64 {e64}, {OPERAND_COPY_HEADER}"));
    let base = word_at(g, &at);
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
        store_quad(g, &x4, &q);
    } else {
        let x = g.v(format!("load float, ptr addrspace(1) {p}, align 4"));
        let x = g.v(format!("select i1 {inside}, float {x}, float 0.0"));
        let h = g.v(format!("fptrunc float {x} to bfloat"));
        let q64 = g.v(format!("zext i32 {q} to i64"));
        let dp = g.v(format!("getelementptr inbounds i16, ptr addrspace(1) %dst, i64 {q64}"));
        g.emit(format!("store bfloat {h}, ptr addrspace(1) {dp}, align 2"));
    }
    let next = g.v(format!("add i32 {q}, {stride32}"));
    g.emit(format!("br label %{head_bb}"));
    g.body.insert_str(head, &format!("  {q} = phi i32 [ {first32}, %{setup} ], [ {next}, %{body} ]\n"));
}

/// A view an element a thread in 32-bit index arithmetic
/// ([`OperandCopy::VIEW32`]; the source's offset stays 64-bit): the
/// destination's order `[rows, cols]`, or `[cols, rows]` where word 6 says
/// transposed. Blocks `view32_setup` to `done`.
fn narrow_view(g: &mut Ir, w: &[String], [total, rows, cols]: [&str; 3], [first, stride]: [&str; 2]) {
    g.block("view32_setup");
    let t32 = g.v(format!("trunc i64 {total} to i32"));
    let c32 = g.v(format!("trunc i64 {cols} to i32"));
    let r32 = g.v(format!("trunc i64 {rows} to i32"));
    let per = g.v(format!("mul i32 {r32}, {c32}"));
    let transposed = g.v(format!("icmp ne i64 {}, 0", w[2]));
    let inner = g.v(format!("select i1 {transposed}, i32 {r32}, i32 {c32}"));
    let first32 = g.v(format!("trunc i64 {first} to i32"));
    let stride32 = g.v(format!("trunc i64 {stride} to i32"));
    g.emit("br label %view32_head");

    g.block("view32_head");
    let head = g.body.len();
    // Unsigned, as in the taps' forms.
    let more = g.v(format!("icmp ult i32 %qv, {t32}"));
    g.emit(format!("br i1 {more}, label %view32_body, label %done"));

    g.block("view32_body");
    let e = g.v(format!("udiv i32 %qv, {per}"));
    let in_e = g.v(format!("mul i32 {e}, {per}"));
    let rem = g.v(format!("sub i32 %qv, {in_e}"));
    let q = g.v(format!("udiv i32 {rem}, {inner}"));
    let qi = g.v(format!("mul i32 {q}, {inner}"));
    let r = g.v(format!("sub i32 {rem}, {qi}"));
    let row = g.v(format!("select i1 {transposed}, i32 {r}, i32 {q}"));
    let col = g.v(format!("select i1 {transposed}, i32 {q}, i32 {r}"));
    let e64 = g.v(format!("zext i32 {e} to i64"));
    let at = g.v(format!("add i64 {e64}, {OPERAND_COPY_HEADER}"));
    let base = word_at(g, &at);
    let row64 = g.v(format!("zext i32 {row} to i64"));
    let col64 = g.v(format!("zext i32 {col} to i64"));
    let o1 = g.v(format!("mul i64 {row64}, {}", w[0]));
    let o2 = g.v(format!("mul i64 {col64}, {}", w[1]));
    let o = g.v(format!("add i64 {o1}, {o2}"));
    let o = g.v(format!("add i64 {o}, {base}"));
    let p = g.v(format!("getelementptr inbounds float, ptr addrspace(1) %src, i64 {o}"));
    let x = g.v(format!("load float, ptr addrspace(1) {p}, align 4"));
    let h = g.v(format!("fptrunc float {x} to bfloat"));
    let q64 = g.v("zext i32 %qv to i64");
    let dp = g.v(format!("getelementptr inbounds i16, ptr addrspace(1) %dst, i64 {q64}"));
    g.emit(format!("store bfloat {h}, ptr addrspace(1) {dp}, align 2"));
    let next = g.v(format!("add i32 %qv, {stride32}"));
    g.emit("br label %view32_head");
    g.body.insert_str(
        head,
        &format!("  %qv = phi i32 [ {first32}, %view32_setup ], [ {next}, %view32_body ]\n"),
    );
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
