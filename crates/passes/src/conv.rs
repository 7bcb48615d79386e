//! Convolutions as matmuls (DESIGN.md §2: "convolution as implicit GEMM"; this
//! is its explicit first form): an f32 2-D convolution with a constant weight
//! `W[K, C, kh, kw]` and one group becomes
//!
//! ```text
//! col[n, c·kh·kw + i·kw + j, oh·OW + ow] = pad(x)[n, c, i·dh + oh·sh, j·dw + ow·sw]
//! y[n] = W[K, C·kh·kw] · col[n]            (a batched matmul, W broadcast over n)
//! ```
//!
//! `col` is `kh·kw` strided slices of the padded input, concatenated along a
//! new axis (`[n, c, kh·kw, oh, ow]`, viewed as `[n, c·kh·kw, oh·ow]`): the
//! contraction group's prologue, one loop program that the engine's packing then
//! reads. A 1×1 convolution with stride 1 and no padding needs none of it: its
//! `col` is the input itself, reshaped (a view), and the convolution is a plain
//! GEMM on the contraction engine. The weight is reshaped, never copied.
//! Grouped and depthwise convolutions, other dtypes and ranks stay as they are
//! (a generated loop nest).

use ir::{Graph, Op, SliceAxis, TensorType, ValueId};
use sym::SymExpr;

use crate::pattern::{constant, Producers};
use crate::{Pass, PassError};

pub struct ConvAsMatMul;

impl Pass for ConvAsMatMul {
    fn name(&self) -> &'static str {
        "conv-as-matmul"
    }
    fn run(&self, g: &mut Graph) -> Result<usize, PassError> {
        let mut done = 0;
        // One convolution at a time: a rewrite shifts node indices.
        while let Some(i) = next_conv(g) {
            rewrite(g, i).map_err(|msg| PassError::Failed { pass: "conv-as-matmul", msg })?;
            done += 1;
        }
        Ok(done)
    }
}

/// The first live f32 2-D convolution of one group with a constant weight of
/// known shape.
fn next_conv(g: &Graph) -> Option<usize> {
    let p = Producers::of(g);
    let uses = g.use_counts();
    g.nodes.iter().position(|n| {
        let Op::Conv(c) = &n.op else { return false };
        let (x, w) = (n.inputs[0], n.inputs[1]);
        uses[n.output.index()] > 0
            && n.inputs.len() == 2
            && c.group == 1
            && g.ty(x).dtype == ir::DType::F32
            && g.ty(x).rank() == 4
            && g.ty(w).const_shape().is_some()
            && constant(g, &p, w).is_some()
    })
}

fn rewrite(g: &mut Graph, at: usize) -> Result<(), String> {
    let node = g.nodes[at].clone();
    let Op::Conv(c) = &node.op else { return Err("not a convolution".into()) };
    let (x, w, y) = (node.inputs[0], node.inputs[1], node.output);
    let ws = g.ty(w).const_shape().ok_or("a weight of unknown shape")?;
    let (k, ch, kh, kw) = (ws[0], ws[1], ws[2], ws[3]);
    let xs = g.ty(x).shape.clone();
    let ys = g.ty(y).shape.clone();
    let (n, oh, ow) = (xs[0].clone(), ys[2].clone(), ys[3].clone());
    let dt = g.ty(x).dtype;
    let ty = |shape: Vec<SymExpr>| TensorType::new(dt, shape);
    let konst = SymExpr::constant;
    let name = g.name(y).to_string();
    let mul = |a: &SymExpr, b: &SymExpr| a.try_mul(b).map_err(|e| e.to_string());
    let ohw = mul(&oh, &ow)?;
    let ckk = ch * kh * kw;
    let mut pos = at;
    let mut insert = |g: &mut Graph, op: Op, inputs: Vec<ValueId>, hint: &str, t: TensorType| {
        let v = g.insert_node(pos, op, inputs, &format!("{name}.{hint}"), t);
        pos += 1;
        v
    };
    let pointwise = kh == 1
        && kw == 1
        && c.strides.iter().all(|s| *s == 1)
        && c.pads_begin.iter().chain(&c.pads_end).all(|p| *p == 0);
    let col = if pointwise {
        insert(g, Op::Reshape, vec![x], "col", ty(vec![n.clone(), konst(ch), ohw.clone()]))
    } else {
        let padded = c.pads_begin.iter().chain(&c.pads_end).any(|p| *p != 0);
        let xp = if padded {
            let pads = vec![
                (konst(0), konst(0)),
                (konst(0), konst(0)),
                (konst(c.pads_begin[0]), konst(c.pads_end[0])),
                (konst(c.pads_begin[1]), konst(c.pads_end[1])),
            ];
            let h = xs[2].try_add(&konst(c.pads_begin[0] + c.pads_end[0])).map_err(|e| e.to_string())?;
            let wd = xs[3].try_add(&konst(c.pads_begin[1] + c.pads_end[1])).map_err(|e| e.to_string())?;
            let t = ty(vec![n.clone(), konst(ch), h, wd]);
            insert(g, Op::Pad { pads, mode: ir::PadMode::Constant(0.0) }, vec![x], "padded", t)
        } else {
            x
        };
        let mut taps = Vec::with_capacity((kh * kw) as usize);
        for i in 0..kh {
            for j in 0..kw {
                let axes = vec![
                    SliceAxis { axis: 2, start: konst(i * c.dilations[0]), step: c.strides[0] },
                    SliceAxis { axis: 3, start: konst(j * c.dilations[1]), step: c.strides[1] },
                ];
                let t = ty(vec![n.clone(), konst(ch), oh.clone(), ow.clone()]);
                let s = insert(g, Op::Slice { axes }, vec![xp], &format!("tap{i}_{j}"), t);
                // [n, c, 1, oh, ow]: the taps concatenate along a new axis, so that
                // the loop writing them runs over (oh, ow) with no division per element.
                let t = ty(vec![n.clone(), konst(ch), konst(1), oh.clone(), ow.clone()]);
                taps.push(insert(g, Op::Reshape, vec![s], &format!("tap{i}_{j}.flat"), t));
            }
        }
        let t = ty(vec![n.clone(), konst(ch), konst(kh * kw), oh.clone(), ow.clone()]);
        let cat = if taps.len() == 1 { taps[0] } else { insert(g, Op::Concat { axis: 2 }, taps, "taps", t) };
        insert(g, Op::Reshape, vec![cat], "col", ty(vec![n.clone(), konst(ckk), ohw.clone()]))
    };
    let w3 = insert(g, Op::Reshape, vec![w], "weight", ty(vec![konst(1), konst(k), konst(ckk)]));
    let wb = insert(g, Op::Broadcast, vec![w3], "weight.batch", ty(vec![n.clone(), konst(k), konst(ckk)]));
    let prod = insert(g, Op::MATMUL, vec![wb, col], "matmul", ty(vec![n.clone(), konst(k), ohw]));
    let out = insert(g, Op::Reshape, vec![prod], "out", ty(ys));
    g.replace_uses(y, out);
    Ok(())
}
