//! Products whose A is a row norm (GPU plans): a loop program that
//! normalizes its input's rows over the innermost axis, `(x - mean(x)) /
//! sqrt(var(x) + ε)` (a layer norm whose affine step the products took:
//! `passes::FoldAffineIntoMatMul`) or `x / sqrt(mean(x²) + ε)` (an RMS
//! norm), read by one product alone. A normalizing GEMV reads the input and
//! normalizes as it multiplies, so at a decode step's few rows the norm's
//! launch is skipped ([`plan::NormalizedA`]).

use ir::{BinaryOp, DType, UnaryOp};
use plan::gemm::RowNorm;
use plan::{Combine, LoopProgram, ModelPlan, Node, NormalizedA, StepKind, E};

use crate::operands::{loop_writer, slot_const};

/// Names, in each product step whose A a row norm writes, the norm's input
/// and step ([`plan::MatMulStep::a_norm`]): where A's view is its buffer's
/// rows whole (offset 0, rows K apart, one product), one loop step alone
/// writes A (and its bf16 copy, if any) and the product alone reads them.
/// Returns the products named.
pub fn normalized_operands(plan: &mut ModelPlan) -> usize {
    let konst = |plan: &ModelPlan, slot: u32| slot_const(&plan.dims, slot);
    let mut found = Vec::new();
    for (j, st) in plan.steps.iter().enumerate() {
        let StepKind::MatMul(m) = &st.kind else { continue };
        let k = konst(plan, m.k);
        let whole_rows = m.taps.is_none()
            && m.batch.is_empty()
            && konst(plan, m.a.offset) == Some(0)
            && konst(plan, m.a.cs) == Some(1)
            && k.is_some()
            && konst(plan, m.a.rs) == k;
        if !whole_rows || m.a_norm.is_some() {
            continue;
        }
        let (a, copy) = (m.a.buf, m.a_bf16);
        // The one loop step writing A (an f32 temporary), in one store.
        let Some((w, out)) = loop_writer(plan, a) else { continue };
        let StepKind::Loop { program, args } = &plan.steps[w].kind else { continue };
        let p = &plan.programs[*program];
        let Some((input, norm)) = recognize(p, out, k.unwrap_or(0)) else { continue };
        // What the norm's step writes: A, and A's bf16 copy.
        let writes_only_a =
            args.iter().enumerate().all(|(i, &b)| !p.params[i].written || b == a || copy == Some(b));
        let x = args[input];
        let others_read =
            plan.steps.iter().enumerate().any(|(i, s)| {
                i != j && i != w && s.kind.touched().iter().any(|&b| b == a || copy == Some(b))
            });
        if writes_only_a && !others_read && plan.buffers[x].dtype == DType::F32 {
            found.push((j, NormalizedA { x, norm, step: w }));
        }
    }
    let count = found.len();
    for (j, n) in found {
        if let StepKind::MatMul(m) = &mut plan.steps[j].kind {
            m.a_norm = Some(n);
        }
    }
    if count > 0 {
        plan.compute_lifetimes();
    }
    count
}

/// Whether program `p` stores into parameter `out` a row norm of one input
/// parameter over its innermost axis of extent `k`: that parameter and the
/// norm. Its other stores may only be `cast<bf16>` of the same value.
pub fn recognize(p: &LoopProgram, out: usize, k: i64) -> Option<(usize, RowNorm)> {
    let value = match p.stores.iter().filter(|s| s.param as usize == out).collect::<Vec<_>>()[..] {
        [s] => s.value,
        _ => return None,
    };
    let x = &p.exprs;
    for s in &p.stores {
        if s.param as usize != out && *x.node(s.value) != Node::Cast(value) {
            return None;
        }
    }
    if p.params[out].shape != p.space || k <= 0 {
        return None;
    }
    let m = Matcher { p, k };
    let inner = m.p.inner_var()?;
    if *x.node(*x.extents.get(inner as usize)?) != Node::Const(k as u64) {
        return None;
    }
    // `d·rstd`, `rstd·d` or `d / sqrt(ms + ε)`.
    let (d, root) = match *x.node(value) {
        Node::Binary(BinaryOp::Mul, a, b) => match (m.reciprocal(a), m.reciprocal(b)) {
            (_, Some(r)) => (a, r),
            (Some(r), _) => (b, r),
            _ => return None,
        },
        Node::Binary(BinaryOp::Div, a, b) => (a, b),
        _ => return None,
    };
    let Node::Unary(UnaryOp::Sqrt, sum) = *x.node(root) else { return None };
    let (ms, eps) = match *x.node(sum) {
        Node::Binary(BinaryOp::Add, a, b) => match (m.float(a), m.float(b)) {
            (_, Some(e)) => (a, e),
            (Some(e), _) => (b, e),
            _ => return None,
        },
        _ => return None,
    };
    let eps = eps as f32;
    if !(eps.is_finite() && eps > 0.0) {
        return None;
    }
    // Centered: `d = x - mean`, `ms = mean((x - mean)²)`; else `d = x`,
    // `ms = mean(x²)`.
    let (input, centered) = match *x.node(d) {
        Node::Binary(BinaryOp::Sub, xv, mean) => {
            let input = m.load(xv, inner)?;
            if m.mean(mean, &|body, r| m.load(body, r))? != input {
                return None;
            }
            let sq = m.mean(ms, &|body, r| match *x.node(body) {
                Node::Binary(BinaryOp::Mul, a, b) if a == b => match *x.node(a) {
                    Node::Binary(BinaryOp::Sub, l, mu) if mu == mean => m.load(l, r),
                    _ => None,
                },
                _ => None,
            })?;
            (sq == input).then_some((input, true))?
        }
        _ => {
            let input = m.load(d, inner)?;
            let sq = m.mean(ms, &|body, r| match *x.node(body) {
                Node::Binary(BinaryOp::Mul, a, b) if a == b => m.load(a, r),
                _ => None,
            })?;
            (sq == input).then_some((input, false))?
        }
    };
    let param = &p.params[input];
    (param.dtype == DType::F32 && !param.written && param.shape == p.space)
        .then_some((input, RowNorm { centered, eps: eps.to_bits() }))
}

struct Matcher<'a> {
    p: &'a LoopProgram,
    k: i64,
}

impl Matcher<'_> {
    /// A float constant's value.
    fn float(&self, e: E) -> Option<f64> {
        match *self.p.exprs.node(e) {
            Node::Const(bits) if self.p.exprs.dtype(e) == DType::F32 => Some(f64::from_bits(bits)),
            _ => None,
        }
    }

    /// `r` of `reciprocal(r)` or `1 / r`.
    fn reciprocal(&self, e: E) -> Option<E> {
        match *self.p.exprs.node(e) {
            Node::Unary(UnaryOp::Reciprocal, r) => Some(r),
            Node::Binary(BinaryOp::Div, one, r) if self.float(one) == Some(1.0) => Some(r),
            _ => None,
        }
    }

    /// K as an f32: a constant, or an integer constant cast.
    fn is_k(&self, e: E) -> bool {
        let x = &self.p.exprs;
        match *x.node(e) {
            Node::Cast(c) => *x.node(c) == Node::Const(self.k as u64) && x.dtype(c) == DType::I64,
            _ => self.float(e) == Some(self.k as f64),
        }
    }

    /// The parameter `e` loads at the nest's point with its innermost index
    /// replaced by variable `var`.
    fn load(&self, e: E, var: u32) -> Option<usize> {
        let x = &self.p.exprs;
        let Node::Load { buf, index, guard: None } = x.node(e) else { return None };
        let n = self.p.vars.len();
        let inner = self.p.inner()?;
        if index.len() != n || *x.node(index[inner]) != Node::Var(var) {
            return None;
        }
        let same = (0..n).all(|i| i == inner || index[i] == self.p.vars[i]);
        same.then_some(*buf as usize)
    }

    /// `sum(r < K: body) / K`, `body` matched by `each` against the
    /// reduction's variable: what `each` finds.
    fn mean(&self, e: E, each: &dyn Fn(E, u32) -> Option<usize>) -> Option<usize> {
        let x = &self.p.exprs;
        let Node::Binary(BinaryOp::Div, s, kk) = *x.node(e) else { return None };
        if !self.is_k(kk) {
            return None;
        }
        let Node::Reduce { combine: Combine::Sum, vars, body } = x.node(s) else { return None };
        let [r] = vars[..] else { return None };
        if *x.node(*x.extents.get(r as usize)?) != Node::Const(self.k as u64) {
            return None;
        }
        each(*body, r)
    }
}
