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
//! A grouped convolution is one such product per group, batched: the image
//! is read as `[G, n, h, w, C/G]` (a view of the channels-last image), its taps
//! and `col` have the group in front, and the weight is `[G, kh·kw·C/G, K/G]`;
//! the products sit side by side along the output channels. Groups narrower
//! than [`MIN_GROUP_OUTPUTS`] outputs are joined first (a block-diagonal
//! weight), so that each product fills the micro-kernel's vectors.
//!
//! A depthwise convolution (one input channel per group) of at most
//! [`MAX_GROUPED_TERMS`] taps becomes instead, channels-last, the sum of its
//! products written out:
//!
//! ```text
//! y'[n, oh, ow, k] = Σ_{i, j} tap_ij[n, oh, ow, k / (K/group)] · W[k, 0, i, j]
//! ```
//!
//! one element-wise group whose vectors run along the output channels: every
//! tap is a contiguous load of the channels-last image and every weight a
//! contiguous vector of a constant, with no reduction loop (a 3×3 is nine
//! loads and nine FMAs per vector of channels), where a product per group
//! would have `N = 1`. Other dtypes and ranks stay as they are (a generated
//! loop nest).

use ir::{Graph, Op, SliceAxis, TensorType, ValueId};
use sym::SymExpr;

use crate::pattern::{constant, Producers};
use crate::{Pass, PassError};

/// The most taps for which a depthwise convolution is written out as an
/// element-wise sum (a 7×7 one has 49).
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
        while let Some((i, depthwise)) = next_conv(g) {
            let r = if depthwise { rewrite_depthwise(g, i) } else { rewrite(g, i) };
            r.map_err(|msg| PassError::Failed { pass: "conv-as-matmul", msg })?;
            done += 1;
        }
        Ok(done)
    }
}

/// The first live f32 2-D convolution with a constant weight of known shape,
/// and whether it becomes a sum of products (a depthwise one, one input
/// channel per group, of at most [`MAX_GROUPED_TERMS`] taps) rather than
/// matmuls.
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
        let sums = c.group > 1 && ws.len() == 4 && ws[1] == 1 && ws[2] * ws[3] <= MAX_GROUPED_TERMS;
        ok.then_some((i, sums))
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

/// A convolution's image and output dims (`[n, C, h, w]` in, `out` = `[n, K,
/// oh, ow]`) and its dtype.
struct ConvDims {
    n: SymExpr,
    h: SymExpr,
    w: SymExpr,
    oh: SymExpr,
    ow: SymExpr,
    dt: ir::DType,
    out: Vec<SymExpr>,
}

fn conv_dims(g: &Graph, x: ValueId, y: ValueId) -> ConvDims {
    let (xs, out) = (&g.ty(x).shape, g.ty(y).shape.clone());
    ConvDims {
        n: xs[0].clone(),
        h: xs[2].clone(),
        w: xs[3].clone(),
        oh: out[2].clone(),
        ow: out[3].clone(),
        dt: g.ty(x).dtype,
        out,
    }
}

fn rewrite(g: &mut Graph, at: usize) -> Result<(), String> {
    let node = g.nodes[at].clone();
    let Op::Conv(c) = &node.op else { return Err("not a convolution".into()) };
    let (x, y) = (node.inputs[0], node.output);
    let ws = g.ty(node.inputs[1]).const_shape().ok_or("a weight of unknown shape")?;
    let (k, kh, kw) = (ws[0], ws[2], ws[3]);
    if c.group <= 0 || k % c.group != 0 {
        return Err(format!("{k} output channels in {} groups", c.group));
    }
    // Per group: `ch` channels in, `mg` out (groups joined when they are narrow).
    let (w, groups, ch0) = widen_groups(g, at)?;
    let mg = k / groups;
    // A product of integers whose taps' channels would not fill the integer
    // kernels' words (an RGB image's three) takes a zero channel or more.
    let ch = match groups == 1 && ch0 % CHANNEL_WORD != 0 && integer_operands(g, x, w) {
        true => (ch0 + CHANNEL_WORD - 1) / CHANNEL_WORD * CHANNEL_WORD,
        false => ch0,
    };
    // After the joined weight, when one was made.
    let at = if w == node.inputs[1] { at } else { at + 1 };
    let ConvDims { n, h, w: wd, oh, ow, dt, out: ys } = conv_dims(g, x, y);
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
    // Dims before a value's own: the group, when there are several.
    let lead = |rest: Vec<SymExpr>| {
        let mut d = if groups > 1 { vec![konst(groups)] } else { vec![] };
        d.extend(rest);
        ty(d)
    };
    let b = usize::from(groups > 1);
    let xt = insert(
        g,
        Op::Transpose { perm: vec![0, 2, 3, 1] },
        vec![x],
        "nhwc",
        ty(vec![n.clone(), h.clone(), wd.clone(), konst(groups * ch0)]),
    );
    let zero = || (konst(0), konst(0));
    let (xt, w) = if ch == ch0 {
        (xt, w)
    } else {
        let more = (konst(0), konst(ch - ch0));
        let pad = |pads| Op::Pad { pads, mode: ir::PadMode::Constant(0.0) };
        let t = ty(vec![n.clone(), h.clone(), wd.clone(), konst(ch)]);
        let xt = insert(g, pad(vec![zero(), zero(), zero(), more.clone()]), vec![xt], "channels", t);
        let t = ty(vec![konst(k), konst(ch), konst(kh), konst(kw)]);
        (xt, insert(g, pad(vec![zero(), more, zero(), zero()]), vec![w], "weight.channels", t))
    };
    // Several groups: the image as `[G, n, h, w, C/G]`, one matmul per group.
    let image = if groups > 1 {
        let split = vec![n.clone(), h.clone(), wd.clone(), konst(groups), konst(ch)];
        let x5 = insert(g, Op::Reshape, vec![xt], "groups", ty(split));
        let perm = vec![3, 0, 1, 2, 4];
        insert(g, Op::Transpose { perm }, vec![x5], "group_major", lead(vec![n.clone(), h, wd, konst(ch)]))
    } else {
        xt
    };
    let taps = taps(g, &mut insert, image, c, (kh, kw), 1 + b, (&oh, &ow), &mut |_, _, tap, _, _| tap)?;
    let col = if taps.len() == 1 {
        insert(g, Op::Reshape, vec![taps[0]], "col", ty(vec![konst(groups), rows.clone(), konst(ch)]))
    } else {
        // [n, oh, ow, 1, c] each, concatenated along the new axis: the loop writing
        // them runs over (oh, ow) with no division per element.
        let flat_ty = lead(vec![n.clone(), oh.clone(), ow.clone(), konst(1), konst(ch)]);
        let mut flats = Vec::with_capacity(taps.len());
        for (i, t) in taps.iter().enumerate() {
            flats.push(insert(g, Op::Reshape, vec![*t], &format!("tap{i}.flat"), flat_ty.clone()));
        }
        let t = lead(vec![n.clone(), oh.clone(), ow.clone(), konst(kk), konst(ch)]);
        let cat = insert(g, Op::Concat { axis: 3 + b }, flats, "taps", t);
        insert(g, Op::Reshape, vec![cat], "col", ty(vec![konst(groups), rows.clone(), konst(kk * ch)]))
    };
    // W'[g, (i·kw + j)·C + c, k] = W[g·mg + k, C, i, j]: a transpose of the
    // constant, folded.
    let wt = if groups > 1 {
        let w5 = insert(
            g,
            Op::Reshape,
            vec![w],
            "weight.groups",
            ty(vec![konst(groups), konst(mg), konst(ch), konst(kh), konst(kw)]),
        );
        let t = lead(vec![konst(kh), konst(kw), konst(ch), konst(mg)]);
        insert(g, Op::Transpose { perm: vec![0, 3, 4, 2, 1] }, vec![w5], "weight.hwck", t)
    } else {
        let t = ty(vec![konst(kh), konst(kw), konst(ch), konst(k)]);
        insert(g, Op::Transpose { perm: vec![2, 3, 1, 0] }, vec![w], "weight.hwck", t)
    };
    let w3 = insert(g, Op::Reshape, vec![wt], "weight", ty(vec![konst(groups), konst(kk * ch), konst(mg)]));
    let prod =
        insert(g, Op::MATMUL, vec![col, w3], "matmul", ty(vec![konst(groups), rows.clone(), konst(mg)]));
    // The groups' products side by side along the channels.
    let prod = if groups > 1 {
        let t = ty(vec![rows, konst(groups), konst(mg)]);
        insert(g, Op::Transpose { perm: vec![1, 0, 2] }, vec![prod], "channels", t)
    } else {
        prod
    };
    let nhwc = insert(g, Op::Reshape, vec![prod], "out.nhwc", ty(vec![n, oh, ow, konst(k)]));
    let out = insert(g, Op::Transpose { perm: vec![0, 3, 1, 2] }, vec![nhwc], "out", ty(ys));
    g.replace_uses(y, out);
    Ok(())
}

/// The channels a tap of a product of integers is padded to a multiple of:
/// the depths of the integer kernels' widest word (u8·s8: four bytes).
const CHANNEL_WORD: i64 = 4;

/// Whether the graph bounds image `x` and weight `w` to 16-bit integers (a
/// statically quantized convolution's operands, their scales moved out):
/// the integer kernel families' operands.
fn integer_operands(g: &Graph, x: ValueId, w: ValueId) -> bool {
    let i16 = |v| {
        crate::integer::value_range(g, v)
            .is_some_and(|(lo, hi)| lo >= i16::MIN as i64 && hi <= i16::MAX as i64)
    };
    i16(w) && i16(x)
}

/// Output channels per group below which groups are joined (AVX-512's f32
/// lanes): a product per group narrower than the micro-kernel's vectors
/// would leave most lanes idle.
const MIN_GROUP_OUTPUTS: i64 = 16;

/// The convolution at `at` with its groups joined `q` at a time until each
/// has [`MIN_GROUP_OUTPUTS`] outputs: its weight (block-diagonal within a
/// joined group: zero between an input and an output of different original
/// groups, so the result is the same), group count and input channels per
/// group. ResNeXt's 32 groups of 4 become 8 of 16, at 4x the multiplies but
/// on full vectors, with each group's taps 16 contiguous channels.
fn widen_groups(g: &mut Graph, at: usize) -> Result<(ValueId, i64, i64), String> {
    let node = g.nodes[at].clone();
    let Op::Conv(c) = &node.op else { return Err("not a convolution".into()) };
    let w = node.inputs[1];
    let ws = g.ty(w).const_shape().ok_or("a weight of unknown shape")?;
    let (k, cg) = (ws[0], ws[1]);
    let (groups, mg) = (c.group, k / c.group);
    let q = (1..=groups).find(|q| groups % q == 0 && q * mg >= MIN_GROUP_OUTPUTS).unwrap_or(groups);
    if q == 1 {
        return Ok((w, groups, cg));
    }
    let data = constant(g, &Producers::of(g), w).ok_or("a weight that is not a constant")?;
    let ir::Elems::F32(old) = data.to_tensor().elems().clone() else {
        return Err("a weight not of f32".into());
    };
    let taps = (ws[2] * ws[3]) as usize;
    let (k, cg, mg, q) = (k as usize, cg as usize, mg as usize, q as usize);
    let wide = q * cg;
    let mut new = vec![0.0f32; k * wide * taps];
    for o in 0..k {
        // Output o's original group sits at position (o / mg) % q of its joined group.
        let at_in = (o / mg) % q * cg;
        for c in 0..cg {
            let from = (o * cg + c) * taps;
            let to = (o * wide + at_in + c) * taps;
            new[to..to + taps].copy_from_slice(&old[from..from + taps]);
        }
    }
    let shape = vec![k, wide, ws[2] as usize, ws[3] as usize];
    let t = ir::Tensor::new(shape, ir::Elems::F32(new)).map_err(|e| e.to_string())?;
    let ty =
        TensorType::new(ir::DType::F32, t.shape().iter().map(|d| SymExpr::constant(*d as i64)).collect());
    let name = format!("{}.weight.joined", g.name(node.output));
    let data = std::sync::Arc::new(ir::ConstData::from_tensor(&t));
    let v = g.insert_node(at, Op::Constant(data), vec![], &name, ty);
    Ok((v, groups / q as i64, wide as i64))
}

/// A depthwise convolution as the element-wise sum of its products,
/// channels-last (see the module's doc).
fn rewrite_depthwise(g: &mut Graph, at: usize) -> Result<(), String> {
    let node = g.nodes[at].clone();
    let Op::Conv(c) = &node.op else { return Err("not a convolution".into()) };
    let (x, w, y) = (node.inputs[0], node.inputs[1], node.output);
    let ws = g.ty(w).const_shape().ok_or("a weight of unknown shape")?;
    let (k, kh, kw) = (ws[0], ws[2], ws[3]);
    let groups = c.group;
    if ws[1] != 1 || groups <= 0 || k % groups != 0 {
        return Err(format!("{k} outputs of {} channels each in {groups} groups", ws[1]));
    }
    // Outputs per input channel (the depth multiplier).
    let mg = k / groups;
    let ConvDims { n, h, w: wd, oh, ow, dt, out: ys } = conv_dims(g, x, y);
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
        ty(vec![n.clone(), h, wd, konst(groups)]),
    );
    // W'[i, j, 0, k] = W[k, 0, i, j]: a transpose of the constant, folded; each
    // product's weight is one of its rows, a vector along the output channels.
    let wt = insert(
        g,
        Op::Transpose { perm: vec![2, 3, 1, 0] },
        vec![w],
        "weight.hwck",
        ty(vec![konst(kh), konst(kw), konst(1), konst(k)]),
    );
    let out_shape = vec![n.clone(), oh.clone(), ow.clone(), konst(k)];
    let (xp, _) = pad(g, &mut insert, xt, c, 1)?;
    let mut sum: Option<ValueId> = None;
    for i in 0..kh {
        for j in 0..kw {
            // The image's channel k / mg for output channel k: a slice of its own
            // per product, so that no intermediate has two readers.
            let axes = vec![
                SliceAxis { axis: 1, start: konst(i * c.dilations[0]), step: c.strides[0] },
                SliceAxis { axis: 2, start: konst(j * c.dilations[1]), step: c.strides[1] },
            ];
            let tap_ty = ty(vec![n.clone(), oh.clone(), ow.clone(), konst(groups)]);
            let mut xk = insert(g, Op::Slice { axes }, vec![xp], &format!("tap{i}_{j}"), tap_ty);
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
            ];
            let w1 = ty(vec![konst(1), konst(1), konst(1), konst(k)]);
            let wv = insert(g, Op::Slice { axes }, vec![wt], &format!("w{i}_{j}"), w1);
            let wb = insert(g, Op::Broadcast, vec![wv], "w.wide", ty(out_shape.clone()));
            let term = insert(g, Op::Binary(ir::BinaryOp::Mul), vec![xk, wb], "term", ty(out_shape.clone()));
            sum = Some(match sum {
                None => term,
                Some(s) => {
                    insert(g, Op::Binary(ir::BinaryOp::Add), vec![s, term], "sum", ty(out_shape.clone()))
                }
            });
        }
    }
    let sum = sum.ok_or("a convolution with no taps")?;
    let out = insert(g, Op::Transpose { perm: vec![0, 3, 1, 2] }, vec![sum], "out", ty(ys));
    g.replace_uses(y, out);
    Ok(())
}
