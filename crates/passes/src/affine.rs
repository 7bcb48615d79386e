//! A normalization's affine step moved into the products that read it:
//! `(n·γ + β)·W = n·(γ⊙W) + β·W` for a `γ` and `β` that vary along the
//! contracted axis alone and a constant `W`. The layer norm before a
//! pre-norm transformer's projections (GPT-2's `ln_1` and `ln_2`, a Llama's
//! RMSNorm weights) then ends in the normalization itself, which a GPU
//! product can compute from its input's rows (the normalizing GEMV) instead
//! of reading a normalized copy; `β·W` joins the product's bias.

use std::sync::Arc;

use ir::{BinaryOp, ConstData, Graph, Op, ValueId};

use crate::canonical::along_axis;
use crate::pattern::{constant, Producers};
use crate::{Pass, PassError};

/// Folds `γ` and `β` of `v = n·γ + β` (either alone too) into the constant
/// weights of the products that read `v` as their A, where every reader of
/// `v` is such a product (directly, or through a reshape that keeps the last
/// axis and that only such products read). Not exact: `γ⊙W` and `β·W` are
/// rounded once to f32 where the model rounded `n·γ + β`.
pub struct FoldAffineIntoMatMul;

/// `v = n·γ + β`: `n` and the values of `γ` and `β` along `v`'s last axis.
struct Affine {
    n: ValueId,
    gamma: Option<Vec<f64>>,
    beta: Option<Vec<f64>>,
}

/// One product's rewrite: its node, the reshape it reads A through, the
/// norm's output it reads instead, its new weight, `β·W`, and the bias add
/// that takes `β·W` in (its value, the bias's operand, the bias's values).
struct Edit {
    node: usize,
    reshape: Option<usize>,
    n: ValueId,
    w: Arc<ConstData>,
    bias: Option<Vec<f64>>,
    joins: Option<(ValueId, usize, Vec<f64>)>,
}

/// A product reading the affine value as A: its node, and the reshape it
/// reads through (a node index), if any.
struct Reader {
    node: usize,
    reshape: Option<usize>,
}

impl FoldAffineIntoMatMul {
    fn affine(g: &Graph, p: &Producers, v: ValueId, uses: &[usize]) -> Option<Affine> {
        let last = g.ty(v).rank().checked_sub(1)?;
        let same = |u: ValueId| {
            let (a, t) = (g.ty(u), g.ty(v));
            a.dtype == t.dtype
                && a.rank() == t.rank()
                && a.shape.iter().zip(&t.shape).all(|(a, b)| g.env.equal(a, b))
        };
        // `x op c` or `c op x` with `c` along the last axis: (x, c's values).
        let split = |u: ValueId, op: BinaryOp| -> Option<(ValueId, Vec<f64>)> {
            let node = p.node(g, u)?;
            if node.op != Op::Binary(op) {
                return None;
            }
            let (x, y) = (node.inputs[0], node.inputs[1]);
            if same(x) {
                if let Some(c) = along_axis(g, p, y, u, last) {
                    return Some((x, c));
                }
            }
            if same(y) {
                return along_axis(g, p, x, u, last).map(|c| (y, c));
            }
            None
        };
        let (inner, beta) = match split(v, BinaryOp::Add) {
            Some((x, b)) => (x, Some(b)),
            None => (v, None),
        };
        // `γ` folds only where `n·γ` is read by the add alone (or is `v`).
        let (n, gamma) = match split(inner, BinaryOp::Mul) {
            Some((x, c)) if inner == v || uses[inner.index()] == 1 => (x, Some(c)),
            _ => (inner, None),
        };
        (gamma.is_some() || beta.is_some()).then_some(Affine { n, gamma, beta })
    }

    /// Every reader of `v`, when each is a product by a constant rank-2 `W`
    /// that reads `v` (or a reshape of it keeping the last axis) as its A.
    fn readers(g: &Graph, p: &Producers, v: ValueId, uses: &[usize]) -> Option<Vec<Reader>> {
        if g.outputs.contains(&v) {
            return None;
        }
        let k = g.ty(v).shape.last()?.clone();
        let product = |j: usize, a: ValueId| -> bool {
            let node = &g.nodes[j];
            matches!(node.op, Op::MatMul { transpose_a: false, .. })
                && node.inputs.len() == 2
                && node.inputs[0] == a
                && node.inputs[1] != a
                && g.ty(node.inputs[1]).rank() == 2
                && g.ty(a).rank() >= 2
                && constant(g, p, node.inputs[1]).is_some()
        };
        let mut readers = Vec::new();
        let mut seen = 0;
        for (j, node) in g.nodes.iter().enumerate() {
            let reads = node.inputs.iter().filter(|&&x| x == v).count();
            if reads == 0 {
                continue;
            }
            seen += reads;
            if reads == 1 && product(j, v) {
                readers.push(Reader { node: j, reshape: None });
                continue;
            }
            let r = node.output;
            let keeps = node.op == Op::Reshape
                && g.ty(r).shape.last().is_some_and(|d| g.env.equal(d, &k))
                && !g.outputs.contains(&r);
            if !keeps {
                return None;
            }
            let mut found = 0;
            for (m, mm) in g.nodes.iter().enumerate() {
                if mm.inputs.contains(&r) {
                    if !product(m, r) {
                        return None;
                    }
                    readers.push(Reader { node: m, reshape: Some(j) });
                    found += 1;
                }
            }
            if found != uses[r.index()] || found == 0 {
                return None;
            }
        }
        (seen == uses[v.index()] && !readers.is_empty()).then_some(readers)
    }
}

impl Pass for FoldAffineIntoMatMul {
    fn name(&self) -> &'static str {
        "fold-affine-into-matmul"
    }

    fn run(&self, g: &mut Graph) -> Result<usize, PassError> {
        let p = Producers::of(g);
        let uses = g.use_counts();
        let mut found = Vec::new();
        for node in &g.nodes {
            let v = node.output;
            if g.ty(v).dtype != ir::DType::F32
                || !matches!(node.op, Op::Binary(BinaryOp::Add | BinaryOp::Mul))
            {
                continue;
            }
            let Some(affine) = Self::affine(g, &p, v, &uses) else { continue };
            let Some(readers) = Self::readers(g, &p, v, &uses) else { continue };
            found.push((affine, readers));
        }
        let fail = |msg: String| PassError::Failed { pass: "fold-affine-into-matmul", msg };
        // Each product's new weight, and `β·W` where there is a `β`, computed
        // before any node moves; applied last to first.
        let mut edits = Vec::new();
        for (affine, readers) in &found {
            for r in readers {
                let node = &g.nodes[r.node];
                let Op::MatMul { transpose_b, .. } = node.op else { unreachable!("readers are products") };
                let w =
                    constant(g, &p, node.inputs[1]).ok_or_else(|| fail("a weight is not constant".into()))?;
                let t = w.to_tensor();
                let (rows, cols) = (t.shape()[0], t.shape()[1]);
                let (kk, nn) = if transpose_b { (cols, rows) } else { (rows, cols) };
                let at = |k: usize, n: usize| if transpose_b { n * cols + k } else { k * cols + n };
                let vals = t.to_f64_vec();
                let mut scaled = vals.clone();
                if let Some(gamma) = &affine.gamma {
                    if gamma.len() != kk {
                        return Err(fail(format!("γ has {} values for K = {kk}", gamma.len())));
                    }
                    for (k, gk) in gamma.iter().enumerate() {
                        for n in 0..nn {
                            scaled[at(k, n)] = vals[at(k, n)] * gk;
                        }
                    }
                }
                let bias = match &affine.beta {
                    Some(beta) if beta.len() == kk => Some(
                        (0..nn)
                            .map(|n| (0..kk).map(|k| beta[k] * vals[at(k, n)]).sum::<f64>())
                            .collect::<Vec<f64>>(),
                    ),
                    Some(beta) => return Err(fail(format!("β has {} values for K = {kk}", beta.len()))),
                    None => None,
                };
                // A product whose one reader adds a bias along its columns
                // takes `β·W` into that bias.
                let o = node.output;
                let joins = bias.as_ref().and_then(|_| {
                    if uses[o.index()] != 1 || g.outputs.contains(&o) {
                        return None;
                    }
                    let add = g.nodes.iter().find(|x| x.inputs.contains(&o))?;
                    if add.op != Op::Binary(BinaryOp::Add) || g.ty(add.output).shape != g.ty(o).shape {
                        return None;
                    }
                    let at = usize::from(add.inputs[0] == o);
                    let last = g.ty(o).rank() - 1;
                    let values = along_axis(g, &p, add.inputs[at], add.output, last)?;
                    (values.len() == nn).then_some((add.output, at, values))
                });
                let w = ir::Tensor::new(
                    t.shape().to_vec(),
                    ir::Elems::F32(scaled.iter().map(|x| *x as f32).collect()),
                )
                .map_err(|e| fail(e.to_string()))?;
                edits.push(Edit {
                    node: r.node,
                    reshape: r.reshape,
                    n: affine.n,
                    w: Arc::new(ConstData::from_tensor(&w)),
                    bias,
                    joins,
                });
            }
        }
        edits.sort_by_key(|e| std::cmp::Reverse(e.node));
        let count = edits.len();
        for Edit { node: i, reshape, n, w, bias, joins } in edits {
            if let Some(j) = reshape {
                g.nodes[j].inputs[0] = n;
            }
            let node = g.nodes[i].clone();
            let hint = g.name(node.output).to_string();
            let wv = g.insert_node(i, Op::Constant(w.clone()), vec![], &format!("{hint}.weight"), w.ty());
            let a = if reshape.is_some() { node.inputs[0] } else { n };
            g.nodes[i + 1].inputs = vec![a, wv];
            let Some(bias) = bias else { continue };
            // `β·W` (plus the bias it joins) along the output's last axis.
            let out = g.ty(node.output).clone();
            let b: Vec<f32> = match &joins {
                Some((_, _, values)) => bias.iter().zip(values).map(|(x, v)| (x + v) as f32).collect(),
                None => bias.iter().map(|x| *x as f32).collect(),
            };
            let mut dims = vec![1usize; out.rank()];
            dims[out.rank() - 1] = b.len();
            let t = ir::Tensor::new(dims, ir::Elems::F32(b)).map_err(|e| fail(e.to_string()))?;
            let data = Arc::new(ConstData::from_tensor(&t));
            let c =
                g.insert_node(i + 1, Op::Constant(data.clone()), vec![], &format!("{hint}.bias"), data.ty());
            let cb = g.insert_node(i + 2, Op::Broadcast, vec![c], &format!("{hint}.bias"), out.clone());
            if let Some((add, at, _)) = joins {
                // The add, found by its value (the nodes after `i` moved).
                let add = g
                    .nodes
                    .iter_mut()
                    .find(|x| x.output == add)
                    .ok_or_else(|| fail("the bias's add left".into()))?;
                add.inputs[at] = cb;
                continue;
            }
            let mm = g.insert_node(i + 3, node.op.clone(), vec![a, wv], &format!("{hint}.product"), out);
            let old = &mut g.nodes[i + 4];
            old.op = Op::Binary(BinaryOp::Add);
            old.inputs = vec![mm, cb];
        }
        Ok(count)
    }
}
