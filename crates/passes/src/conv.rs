//! Convolutions as matmuls, channels-last (DESIGN.md §2: "convolution as
//! implicit GEMM"; this is its explicit form): an f32 2-D convolution with a
//! constant weight `W[K, C, kh, kw]` and one group becomes
//!
//! ```text
//! xt  = transpose(x) to [n, h, w, c]                      (NHWC)
//! col[n·oh·ow, (i·kw + j)·C + c] = pad(xt)[n, i·dh + oh·sh, j·dw + ow·sw, c]
//! y'  = col · W'[(i·kw + j)·C + c, K]                     (one GEMM, M = n·oh·ow)
//! y   = transpose(y' as [n, oh, ow, K]) to [n, K, oh, ow]
//! ```
//!
//! `col` is `kh·kw` strided slices of the padded image, concatenated along a
//! new axis before the channels (`[n, oh, ow, kh·kw, c]`): each row of it is
//! `kh·kw` contiguous runs of `C` channels, the contraction group's prologue,
//! which is never written: the engine's packing reads the runs from the image
//! (`lower` recognizes this form; implicit GEMM). The same holds for an RGB
//! image's 3 channels: a row of taps then reads `kw · 3` contiguous values.
//! A 1×1 convolution without padding needs no taps: its `col` is the image
//! itself (strided when the stride is not 1). The weight is the matmul's
//! constant B, so the engine packs it once at compile time (a weight as A
//! would be packed on every call), and M spans the batch and the image.
//!
//! The transposes at both ends are data movement between layouts: the
//! [`SinkTransposes`] rewrite moves the output's transpose down through the
//! element-wise ops that follow (bias, activation, residual adds), where it
//! meets the next convolution's input transpose and cancels, so a chain of
//! convolutions runs channels-last from end to end.
//!
//! A grouped convolution (depthwise ones included) with few products per output
//! (`kh·kw·C/group`, at most [`MAX_GROUPED_TERMS`]) becomes, channels-last, the
//! sum of those products written out:
//!
//! ```text
//! y'[n, oh, ow, k] = Σ_{i, j, c} tap_ij[n, oh, ow, (k / (K/group))·(C/group) + c] · W[k, c, i, j]
//! ```
//!
//! one element-wise group whose vectors run along the output channels: every
//! tap is a contiguous load of the channels-last image and every weight a
//! contiguous vector of a constant, with no reduction loop (a depthwise 3×3 is
//! nine loads and nine FMAs per vector of channels). A GEMM would waste most of
//! its micro-kernel here: each group's `N = K/group` is 1 in a depthwise
//! convolution. Larger grouped convolutions, other dtypes and ranks stay as
//! they are (a generated loop nest).

use ir::{Graph, Op, SliceAxis, TensorType, ValueId};
use sym::SymExpr;

use crate::pattern::{constant, Producers};
use crate::{Pass, PassError};

/// The most products per output for which a grouped convolution is written
/// out as an element-wise sum (a 7×7 depthwise convolution has 49; a 3×3 one
/// with 4 channels per group, 36).
pub const MAX_GROUPED_TERMS: i64 = 64;

#[derive(Default)]
/// The rewrite (a pass with no options).
pub struct ConvAsMatMul;

impl Pass for ConvAsMatMul {
    fn name(&self) -> &'static str {
        "conv-as-matmul"
    }
    fn run(&self, g: &mut Graph) -> Result<usize, PassError> {
        let mut done = 0;
        // One convolution at a time: a rewrite shifts node indices.
        while let Some((i, grouped)) = next_conv(g) {
            let r = if grouped { rewrite_grouped(g, i) } else { rewrite(g, i) };
            r.map_err(|msg| PassError::Failed { pass: "conv-as-matmul", msg })?;
            done += 1;
        }
        Ok(done)
    }
}

/// The first live f32 2-D convolution with a constant weight of known shape
/// that is rewritten: one of a single group (`false`), or a grouped one with
/// at most [`MAX_GROUPED_TERMS`] products per output (`true`).
fn next_conv(g: &Graph) -> Option<(usize, bool)> {
    let p = Producers::of(g);
    let uses = g.use_counts();
    g.nodes.iter().enumerate().find_map(|(i, n)| {
        let Op::Conv(c) = &n.op else { return None };
        let (x, w) = (n.inputs[0], n.inputs[1]);
        let ws = g.ty(w).const_shape()?;
        let ok = uses[n.output.index()] > 0
            && n.inputs.len() == 2
            && g.ty(x).dtype == ir::DType::F32
            && g.ty(x).rank() == 4
            && constant(g, &p, w).is_some();
        let grouped = c.group > 1 && ws.len() == 4 && ws[1] * ws[2] * ws[3] <= MAX_GROUPED_TERMS;
        (ok && (c.group == 1 || grouped)).then_some((i, grouped))
    })
}

type Insert<'a> = dyn FnMut(&mut Graph, Op, Vec<ValueId>, &str, TensorType) -> ValueId + 'a;

/// `x` padded on its spatial axes `sp` and `sp + 1` by the convolution's pads
/// (`x` itself when they are 0), and whether it was.
fn pad(
    g: &mut Graph,
    insert: &mut Insert,
    x: ValueId,
    c: &ir::ConvAttrs,
    sp: usize,
) -> Result<(ValueId, bool), String> {
    let konst = SymExpr::constant;
    let xt = g.ty(x).clone();
    let padded = c.pads_begin.iter().chain(&c.pads_end).any(|p| *p != 0);
    if !padded {
        return Ok((x, false));
    }
    let mut pads = vec![(konst(0), konst(0)); xt.rank()];
    let mut shape = xt.shape.clone();
    for d in 0..2 {
        pads[sp + d] = (konst(c.pads_begin[d]), konst(c.pads_end[d]));
        shape[sp + d] =
            xt.shape[sp + d].try_add(&konst(c.pads_begin[d] + c.pads_end[d])).map_err(|e| e.to_string())?;
    }
    let t = TensorType::new(xt.dtype, shape);
    Ok((insert(g, Op::Pad { pads, mode: ir::PadMode::Constant(0.0) }, vec![x], "padded", t), true))
}

/// The `kh·kw` taps of `x`, whose spatial axes are `sp` and `sp + 1`: strided
/// slices of `x` padded by the convolution's pads, with the output's extents
/// `(oh, ow)` on those axes, each passed through `each` as it is made. A single
/// tap with stride 1 and no padding is `x` itself.
#[allow(clippy::too_many_arguments)]
fn taps(
    g: &mut Graph,
    insert: &mut Insert,
    x: ValueId,
    c: &ir::ConvAttrs,
    (kh, kw): (i64, i64),
    sp: usize,
    (oh, ow): (&SymExpr, &SymExpr),
    each: &mut dyn FnMut(&mut Graph, &mut Insert, ValueId, i64, i64) -> ValueId,
) -> Result<Vec<ValueId>, String> {
    let konst = SymExpr::constant;
    let xt = g.ty(x).clone();
    let (xp, padded) = pad(g, insert, x, c, sp)?;
    let whole = kh * kw == 1 && !padded && c.strides.iter().all(|s| *s == 1);
    let mut shape = xt.shape.clone();
    shape[sp] = oh.clone();
    shape[sp + 1] = ow.clone();
    let mut out = Vec::with_capacity((kh * kw) as usize);
    for i in 0..kh {
        for j in 0..kw {
            let axes = vec![
                SliceAxis { axis: sp, start: konst(i * c.dilations[0]), step: c.strides[0] },
                SliceAxis { axis: sp + 1, start: konst(j * c.dilations[1]), step: c.strides[1] },
            ];
            let t = TensorType::new(xt.dtype, shape.clone());
            let tap =
                if whole { xp } else { insert(g, Op::Slice { axes }, vec![xp], &format!("tap{i}_{j}"), t) };
            out.push(each(g, insert, tap, i, j));
        }
    }
    Ok(out)
}

fn rewrite(g: &mut Graph, at: usize) -> Result<(), String> {
    let node = g.nodes[at].clone();
    let Op::Conv(c) = &node.op else { return Err("not a convolution".into()) };
    let (x, w, y) = (node.inputs[0], node.inputs[1], node.output);
    let ws = g.ty(w).const_shape().ok_or("a weight of unknown shape")?;
    let (k, ch, kh, kw) = (ws[0], ws[1], ws[2], ws[3]);
    let xs = g.ty(x).shape.clone();
    let ys = g.ty(y).shape.clone();
    let (n, h, wd, oh, ow) = (xs[0].clone(), xs[2].clone(), xs[3].clone(), ys[2].clone(), ys[3].clone());
    let dt = g.ty(x).dtype;
    let ty = |shape: Vec<SymExpr>| TensorType::new(dt, shape);
    let konst = SymExpr::constant;
    let name = g.name(y).to_string();
    let mul = |a: &SymExpr, b: &SymExpr| a.try_mul(b).map_err(|e| e.to_string());
    let rows = mul(&mul(&n, &oh)?, &ow)?;
    let kk = kh * kw;
    let mut pos = at;
    let mut insert = |g: &mut Graph, op: Op, inputs: Vec<ValueId>, hint: &str, t: TensorType| {
        let v = g.insert_node(pos, op, inputs, &format!("{name}.{hint}"), t);
        pos += 1;
        v
    };
    let xt = insert(
        g,
        Op::Transpose { perm: vec![0, 2, 3, 1] },
        vec![x],
        "nhwc",
        ty(vec![n.clone(), h.clone(), wd.clone(), konst(ch)]),
    );
    let taps = taps(g, &mut insert, xt, c, (kh, kw), 1, (&oh, &ow), &mut |_, _, tap, _, _| tap)?;
    let col = if taps.len() == 1 {
        insert(g, Op::Reshape, vec![taps[0]], "col", ty(vec![konst(1), rows.clone(), konst(ch)]))
    } else {
        // [n, oh, ow, 1, c] each, concatenated along the new axis: the loop writing
        // them runs over (oh, ow) with no division per element.
        let flat_ty = ty(vec![n.clone(), oh.clone(), ow.clone(), konst(1), konst(ch)]);
        let mut flats = Vec::with_capacity(taps.len());
        for (i, t) in taps.iter().enumerate() {
            flats.push(insert(g, Op::Reshape, vec![*t], &format!("tap{i}.flat"), flat_ty.clone()));
        }
        let t = ty(vec![n.clone(), oh.clone(), ow.clone(), konst(kk), konst(ch)]);
        let cat = insert(g, Op::Concat { axis: 3 }, flats, "taps", t);
        insert(g, Op::Reshape, vec![cat], "col", ty(vec![konst(1), rows.clone(), konst(kk * ch)]))
    };
    // W'[(i·kw + j)·C + c, K] = W[K, C, i, j]: a transpose of the constant, folded.
    let wt = insert(
        g,
        Op::Transpose { perm: vec![2, 3, 1, 0] },
        vec![w],
        "weight.hwck",
        ty(vec![konst(kh), konst(kw), konst(ch), konst(k)]),
    );
    let w3 = insert(g, Op::Reshape, vec![wt], "weight", ty(vec![konst(1), konst(kk * ch), konst(k)]));
    let prod = insert(g, Op::MATMUL, vec![col, w3], "matmul", ty(vec![konst(1), rows, konst(k)]));
    let nhwc = insert(g, Op::Reshape, vec![prod], "out.nhwc", ty(vec![n, oh, ow, konst(k)]));
    let out = insert(g, Op::Transpose { perm: vec![0, 3, 1, 2] }, vec![nhwc], "out", ty(ys));
    g.replace_uses(y, out);
    Ok(())
}

/// A grouped convolution as the element-wise sum of its products, channels-last
/// (see the module's doc).
fn rewrite_grouped(g: &mut Graph, at: usize) -> Result<(), String> {
    let node = g.nodes[at].clone();
    let Op::Conv(c) = &node.op else { return Err("not a convolution".into()) };
    let (x, w, y) = (node.inputs[0], node.inputs[1], node.output);
    let ws = g.ty(w).const_shape().ok_or("a weight of unknown shape")?;
    let (k, cg, kh, kw) = (ws[0], ws[1], ws[2], ws[3]);
    let groups = c.group;
    if groups <= 0 || k % groups != 0 {
        return Err(format!("{k} output channels in {groups} groups"));
    }
    let mg = k / groups;
    let xs = g.ty(x).shape.clone();
    let ys = g.ty(y).shape.clone();
    let (n, h, wd, oh, ow) = (xs[0].clone(), xs[2].clone(), xs[3].clone(), ys[2].clone(), ys[3].clone());
    let dt = g.ty(x).dtype;
    let ty = |shape: Vec<SymExpr>| TensorType::new(dt, shape);
    let konst = SymExpr::constant;
    let name = g.name(y).to_string();
    let mut pos = at;
    let mut insert = |g: &mut Graph, op: Op, inputs: Vec<ValueId>, hint: &str, t: TensorType| {
        let v = g.insert_node(pos, op, inputs, &format!("{name}.{hint}"), t);
        pos += 1;
        v
    };
    let xt = insert(
        g,
        Op::Transpose { perm: vec![0, 2, 3, 1] },
        vec![x],
        "nhwc",
        ty(vec![n.clone(), h, wd, konst(groups * cg)]),
    );
    // W'[i, j, c, k] = W[k, c, i, j]: a transpose of the constant, folded; each
    // product's weight is one of its rows, a vector along the output channels.
    let wt = insert(
        g,
        Op::Transpose { perm: vec![2, 3, 1, 0] },
        vec![w],
        "weight.hwck",
        ty(vec![konst(kh), konst(kw), konst(cg), konst(k)]),
    );
    let out_shape = vec![n.clone(), oh.clone(), ow.clone(), konst(k)];
    let (xp, _) = pad(g, &mut insert, xt, c, 1)?;
    let mut sum: Option<ValueId> = None;
    for i in 0..kh {
        for j in 0..kw {
            for cc in 0..cg {
                // The image's channel (k / mg)·cg + cc for output channel k: a
                // slice of its own per product (strided along the channels),
                // so that no intermediate has two readers.
                let mut axes = vec![
                    SliceAxis { axis: 1, start: konst(i * c.dilations[0]), step: c.strides[0] },
                    SliceAxis { axis: 2, start: konst(j * c.dilations[1]), step: c.strides[1] },
                ];
                if cg > 1 {
                    axes.push(SliceAxis { axis: 3, start: konst(cc), step: cg });
                }
                let per_group = ty(vec![n.clone(), oh.clone(), ow.clone(), konst(groups)]);
                let mut xk = insert(g, Op::Slice { axes }, vec![xp], &format!("tap{i}_{j}_{cc}"), per_group);
                if mg > 1 {
                    let one = vec![n.clone(), oh.clone(), ow.clone(), konst(groups), konst(1)];
                    let wide = vec![n.clone(), oh.clone(), ow.clone(), konst(groups), konst(mg)];
                    xk = insert(g, Op::Reshape, vec![xk], "groups", ty(one));
                    xk = insert(g, Op::Broadcast, vec![xk], "per_output", ty(wide));
                    xk = insert(g, Op::Reshape, vec![xk], "channels", ty(out_shape.clone()));
                }
                let axes = vec![
                    SliceAxis { axis: 0, start: konst(i), step: 1 },
                    SliceAxis { axis: 1, start: konst(j), step: 1 },
                    SliceAxis { axis: 2, start: konst(cc), step: 1 },
                ];
                let w1 = ty(vec![konst(1), konst(1), konst(1), konst(k)]);
                let wv = insert(g, Op::Slice { axes }, vec![wt], &format!("w{i}_{j}_{cc}"), w1);
                let wb = insert(g, Op::Broadcast, vec![wv], "w.wide", ty(out_shape.clone()));
                let term =
                    insert(g, Op::Binary(ir::BinaryOp::Mul), vec![xk, wb], "term", ty(out_shape.clone()));
                sum = Some(match sum {
                    None => term,
                    Some(s) => {
                        insert(g, Op::Binary(ir::BinaryOp::Add), vec![s, term], "sum", ty(out_shape.clone()))
                    }
                });
            }
        }
    }
    let sum = sum.ok_or("a convolution with no products")?;
    let out = insert(g, Op::Transpose { perm: vec![0, 3, 1, 2] }, vec![sum], "out", ty(ys));
    g.replace_uses(y, out);
    Ok(())
}
