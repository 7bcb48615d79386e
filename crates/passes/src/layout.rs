//! Layout propagation: the channels-first view of a channels-last value
//! (`transpose[0, 3, 1, 2]`, what [`ConvAsMatMul`](crate::ConvAsMatMul) puts
//! after every convolution) is moved below the ops that read it:
//!
//! ```text
//! op(T(a), T(b), c)  →  T(op(a, b, T⁻¹(c)))      T = transpose[0, 3, 1, 2]
//! pool(T(a))         →  T(pool_channels_last(a))
//! ```
//!
//! for element-wise ops whose every input is such a transpose or cheap to
//! transpose (a constant, folded, or a broadcast of one: a bias), and for
//! pools. The op then runs channels-last, and the transpose reaches
//! the next convolution, whose channels-last input `transpose[0, 2, 3, 1]`
//! cancels it (`SimplifyAlgebra` merges the two into an identity and drops
//! it). A ResNet's bias, ReLU and residual adds all run on the matmuls' own
//! layout, where the contraction's epilogue absorbs them; its max pool reads
//! that layout with the channels innermost (read channels-first, each vector
//! of a window gathers one value a pixel).
//!
//! Reductions stay where they are: a global mean reduced channels-last puts
//! the channels across the vector lanes, where a row's last channels (past a
//! multiple of the lanes) are summed in another order than the rest, and a
//! softmax over the means (SqueezeNet's head) turns that one-ulp difference
//! between equal means into a different output.

use ir::{Graph, Op, TensorType, ValueId};

use crate::pattern::Producers;
use crate::{Pass, PassError};

/// The channels-first view of a channels-last value.
const TO_NCHW: [usize; 4] = [0, 3, 1, 2];
/// Its inverse.
const TO_NHWC: [usize; 4] = [0, 2, 3, 1];

pub struct SinkTransposes;

impl Pass for SinkTransposes {
    fn name(&self) -> &'static str {
        "sink-transposes"
    }
    fn run(&self, g: &mut Graph) -> Result<usize, PassError> {
        let mut done = 0;
        // One node at a time: a rewrite inserts nodes and shifts indices.
        while let Some((i, plan)) = next(g) {
            rewrite(g, i, &plan);
            done += 1;
        }
        Ok(done)
    }
}

/// How an input of the op is reached channels-last.
enum Source {
    /// The input of its transpose.
    Untransposed(ValueId),
    /// A constant: transposed (and folded).
    Constant(ValueId),
    /// A broadcast of a constant: the constant transposed, then broadcast.
    Broadcast { constant: ValueId },
    /// A value some other node already reads channels-last (a residual that
    /// also feeds a convolution): that same transpose (CSE merges the two).
    Shared(ValueId),
}

/// What a node becomes channels-last.
enum Plan {
    /// An element-wise op: how each input is reached channels-last.
    Elementwise(Vec<Source>),
    /// A pool of a channels-first view: the pool channels-last, of the
    /// view's input.
    Pool(ir::PoolAttrs, ValueId),
}

/// The first live node that can run channels-last.
fn next(g: &Graph) -> Option<(usize, Plan)> {
    let p = Producers::of(g);
    let uses = g.use_counts();
    let is_view = |v: ValueId| matches!(p.op(g, v), Some(Op::Transpose { perm }) if perm[..] == TO_NCHW);
    let read_nhwc = |v: ValueId| {
        g.nodes.iter().any(|n| {
            n.inputs == [v]
                && matches!(&n.op, Op::Transpose { perm } if perm[..] == TO_NHWC)
                && uses[n.output.index()] > 0
        })
    };
    g.nodes.iter().enumerate().find_map(|(i, n)| {
        if uses[n.output.index()] == 0 || g.ty(n.output).rank() > 4 || !n.inputs.iter().any(|v| is_view(*v)) {
            return None;
        }
        match &n.op {
            Op::Pool(a) if !a.channels_last => {
                let input = p.node(g, n.inputs[0])?.inputs[0];
                return Some((i, Plan::Pool(ir::PoolAttrs { channels_last: true, ..a.clone() }, input)));
            }
            Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast if g.ty(n.output).rank() == 4 => {}
            _ => return None,
        }
        let plan: Option<Vec<Source>> = n
            .inputs
            .iter()
            .map(|&v| {
                let node = p.node(g, v);
                match node.map(|n| &n.op) {
                    _ if is_view(v) => node.map(|n| Source::Untransposed(n.inputs[0])),
                    Some(Op::Constant(_)) => Some(Source::Constant(v)),
                    Some(Op::Broadcast) => {
                        let c = node?.inputs[0];
                        let konst = matches!(p.op(g, c), Some(Op::Constant(_)));
                        (konst && g.ty(c).rank() == 4).then_some(Source::Broadcast { constant: c })
                    }
                    _ if read_nhwc(v) => Some(Source::Shared(v)),
                    _ => None,
                }
            })
            .collect();
        plan.map(|plan| (i, Plan::Elementwise(plan)))
    })
}

/// `ty` channels-last: dim `j` of the result is dim `TO_NHWC[j]` of `ty`.
fn nhwc(ty: &TensorType) -> TensorType {
    TensorType::new(ty.dtype, TO_NHWC.iter().map(|&d| ty.shape[d].clone()).collect())
}

fn rewrite(g: &mut Graph, at: usize, plan: &Plan) {
    let node = g.nodes[at].clone();
    let name = g.name(node.output).to_string();
    let mut pos = at;
    let mut insert = |g: &mut Graph, op: Op, inputs: Vec<ValueId>, hint: &str, t: TensorType| {
        let v = g.insert_node(pos, op, inputs, &format!("{name}.{hint}"), t);
        pos += 1;
        v
    };
    let to_nhwc = || Op::Transpose { perm: TO_NHWC.to_vec() };
    let to_nchw = || Op::Transpose { perm: TO_NCHW.to_vec() };
    let out_ty = g.ty(node.output).clone();
    let out = match plan {
        Plan::Elementwise(sources) => {
            let mut inputs = Vec::with_capacity(sources.len());
            for (k, (s, &v)) in sources.iter().zip(&node.inputs).enumerate() {
                inputs.push(match *s {
                    Source::Untransposed(a) => a,
                    Source::Constant(c) | Source::Shared(c) => {
                        let t = nhwc(g.ty(c));
                        insert(g, to_nhwc(), vec![c], &format!("in{k}.nhwc"), t)
                    }
                    Source::Broadcast { constant } => {
                        let t = nhwc(g.ty(constant));
                        let c = insert(g, to_nhwc(), vec![constant], &format!("in{k}.nhwc"), t);
                        let t = nhwc(g.ty(v));
                        insert(g, Op::Broadcast, vec![c], &format!("in{k}.nhwc.broadcast"), t)
                    }
                });
            }
            let inner = insert(g, node.op.clone(), inputs, "nhwc", nhwc(&out_ty));
            insert(g, to_nchw(), vec![inner], "nchw", out_ty)
        }
        Plan::Pool(attrs, a) => {
            let inner = insert(g, Op::Pool(attrs.clone()), vec![*a], "nhwc", nhwc(&out_ty));
            insert(g, to_nchw(), vec![inner], "nchw", out_ty)
        }
    };
    g.replace_uses(node.output, out);
}
