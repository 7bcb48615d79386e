//! The expressions of a tensor program: a hash-consed DAG over loop variables,
//! run-time dims, constants, loads and the primitive ops, with reductions as
//! nodes. Equal expressions are one node, so common subexpressions are computed
//! once and "does this depend on the innermost loop?" is a bit test.
//!
//! Index arithmetic is `i64` and is simplified as it is built, with the facts a
//! loop nest gives (a variable is below its extent): `(a·d + i) / d → a` and
//! `(a·d + i) % d → i` when `i < d`, which turns the div/mod of reshapes back
//! into the plain indices the code generator vectorizes.

use std::collections::HashMap;
use std::fmt;

use ir::{BinaryOp, DType, ReduceOp, UnaryOp};

/// An expression: an index into its program's [`Exprs`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct E(pub u32);

impl E {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// How a reduction combines its terms. `Mean` is lowered to a sum and a division.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Combine {
    Sum,
    Prod,
    Max,
    Min,
}

impl Combine {
    pub fn name(self) -> &'static str {
        match self {
            Combine::Sum => "sum",
            Combine::Prod => "prod",
            Combine::Max => "max",
            Combine::Min => "min",
        }
    }
    pub fn of(op: ReduceOp) -> Combine {
        match op {
            ReduceOp::Sum | ReduceOp::Mean => Combine::Sum,
            ReduceOp::Prod => Combine::Prod,
            ReduceOp::Max => Combine::Max,
            ReduceOp::Min => Combine::Min,
        }
    }
}

/// One node of the DAG.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Node {
    /// A loop or reduction variable (`i64`), below its extent.
    Var(u32),
    /// Slot of the model's dim table: a symbolic dim evaluated once per shape (`i64`).
    Dim(u32),
    /// A constant of the node's dtype: an `f64`'s bits for floats, the `i64`
    /// value for integers and bools.
    Const(u64),
    /// `buf[index]` (a dense row-major buffer of the program). With a `guard`,
    /// lanes where it is false read nothing and give zero.
    Load {
        buf: u32,
        index: Vec<E>,
        guard: Option<E>,
    },
    Unary(UnaryOp, E),
    Binary(BinaryOp, E, E),
    Select(E, E, E),
    /// Conversion to the node's dtype (float → int saturates toward zero).
    Cast(E),
    /// `value`, after recording error `code` of the program when `ok` is false
    /// (a gather index out of range, an integer division by zero).
    Check {
        ok: E,
        code: u32,
        value: E,
    },
    /// `combine` of `body` over `vars` (each below its extent, the last varying fastest).
    Reduce {
        combine: Combine,
        vars: Vec<u32>,
        body: E,
    },
}

impl Node {
    /// The expressions this node reads (a reduction's variables' extents aside).
    pub fn children(&self) -> Vec<E> {
        match self {
            Node::Var(_) | Node::Dim(_) | Node::Const(_) => vec![],
            Node::Load { index, guard, .. } => index.iter().chain(guard).copied().collect(),
            Node::Unary(_, a) | Node::Cast(a) => vec![*a],
            Node::Binary(_, a, b) => vec![*a, *b],
            Node::Select(a, b, c) => vec![*a, *b, *c],
            Node::Check { ok, value, .. } => vec![*ok, *value],
            Node::Reduce { body, .. } => vec![*body],
        }
    }
}

/// The DAG of one program: nodes, their dtypes, the free variables of each (a
/// bit set) and every variable's extent.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "RawExprs", into = "RawExprs")]
pub struct Exprs {
    nodes: Vec<Node>,
    dtypes: Vec<DType>,
    free: Vec<u64>,
    interned: HashMap<(Node, DType), E>,
    /// The extent of each variable (an `i64` expression of dims and constants).
    pub extents: Vec<E>,
}

/// What a compiled artifact keeps of an [`Exprs`]: the nodes in order, their
/// dtypes and the variables' extents. The rest (free variables, the interning
/// table) is derived again, and every reference checked, when it is read.
#[derive(serde::Serialize, serde::Deserialize)]
struct RawExprs {
    nodes: Vec<Node>,
    dtypes: Vec<DType>,
    extents: Vec<E>,
}

impl From<Exprs> for RawExprs {
    fn from(x: Exprs) -> RawExprs {
        RawExprs { nodes: x.nodes, dtypes: x.dtypes, extents: x.extents }
    }
}

impl TryFrom<RawExprs> for Exprs {
    type Error = String;
    fn try_from(raw: RawExprs) -> Result<Exprs, String> {
        let RawExprs { nodes, dtypes, extents } = raw;
        if nodes.len() != dtypes.len() || extents.len() > MAX_VARS || nodes.len() > u32::MAX as usize {
            return Err(format!(
                "{} nodes, {} dtypes, {} variables",
                nodes.len(),
                dtypes.len(),
                extents.len()
            ));
        }
        let mut x = Exprs { extents: Vec::with_capacity(extents.len()), ..Exprs::default() };
        for (i, (node, dtype)) in nodes.into_iter().zip(dtypes).enumerate() {
            // Every operand comes before its user; every variable and extent exists.
            let var_ok = |v: u32| (v as usize) < extents.len() && extents[v as usize].index() < i;
            let ok = node.children().iter().all(|c| c.index() < i)
                && match &node {
                    Node::Var(v) => var_ok(*v),
                    Node::Reduce { vars, .. } => vars.iter().all(|v| var_ok(*v)),
                    _ => true,
                };
            if !ok {
                return Err(format!("node {i} refers to a later node or an unknown variable"));
            }
            if let Node::Var(v) = node {
                while x.extents.len() <= v as usize {
                    x.extents.push(extents[x.extents.len()]);
                }
            }
            if let Node::Reduce { vars, .. } = &node {
                for v in vars {
                    while x.extents.len() <= *v as usize {
                        x.extents.push(extents[x.extents.len()]);
                    }
                }
            }
            if x.intern(node, dtype).index() != i {
                return Err(format!("node {i} repeats an earlier node"));
            }
        }
        if extents.iter().any(|e| e.index() >= x.nodes.len()) {
            return Err("a variable's extent is not a node".into());
        }
        x.extents = extents;
        Ok(x)
    }
}

/// The most variables one program may use (the free-variable sets are 64-bit).
pub const MAX_VARS: usize = 64;

impl Exprs {
    pub fn node(&self, e: E) -> &Node {
        &self.nodes[e.index()]
    }
    pub fn dtype(&self, e: E) -> DType {
        self.dtypes[e.index()]
    }
    /// The variables `e` depends on, as a bit set.
    pub fn free(&self, e: E) -> u64 {
        self.free[e.index()]
    }
    pub fn len(&self) -> usize {
        self.nodes.len()
    }
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Whether `e` holds a reduction that depends on variable `v` (its copies
    /// would be summed in another order per lane than at a point: see
    /// `OnePointWhy::NestedReduction`).
    pub fn reduction_on(&self, e: E, v: u32) -> bool {
        self.holds_reduction(e, Some(v))
    }

    /// Whether `e` holds a reduction (one that depends on variable `on`, when
    /// given).
    pub fn holds_reduction(&self, e: E, on: Option<u32>) -> bool {
        let mut seen = vec![false; self.len()];
        let mut stack = vec![e];
        while let Some(e) = stack.pop() {
            let off = on.is_some_and(|v| self.free(e) & (1u64 << v) == 0);
            if off || std::mem::replace(&mut seen[e.index()], true) {
                continue;
            }
            match self.node(e) {
                Node::Reduce { .. } => return true,
                n => stack.extend(n.children()),
            }
        }
        false
    }

    fn intern(&mut self, node: Node, dtype: DType) -> E {
        if let Some(e) = self.interned.get(&(node.clone(), dtype)) {
            return *e;
        }
        let free = match &node {
            Node::Var(v) => 1u64 << v,
            Node::Dim(_) | Node::Const(_) => 0,
            Node::Load { index, guard, .. } => index.iter().chain(guard).fold(0, |a, e| a | self.free(*e)),
            Node::Unary(_, a) | Node::Cast(a) => self.free(*a),
            Node::Binary(_, a, b) => self.free(*a) | self.free(*b),
            Node::Select(a, b, c) => self.free(*a) | self.free(*b) | self.free(*c),
            Node::Check { ok, value, .. } => self.free(*ok) | self.free(*value),
            Node::Reduce { vars, body, .. } => {
                let own = vars.iter().fold(0u64, |m, v| m | 1 << v);
                let ext = vars.iter().fold(0u64, |m, v| m | self.free(self.extents[*v as usize]));
                (self.free(*body) & !own) | ext
            }
        };
        let e = E(self.nodes.len() as u32);
        self.nodes.push(node.clone());
        self.dtypes.push(dtype);
        self.free.push(free);
        self.interned.insert((node, dtype), e);
        e
    }

    /// A new variable below `extent`; `None` when the program has used all 64.
    /// A variable of extent 1 is the constant 0.
    pub fn var(&mut self, extent: E) -> Option<E> {
        if self.as_int(extent) == Some(1) {
            return Some(self.int(0));
        }
        if self.extents.len() >= MAX_VARS {
            return None;
        }
        self.extents.push(extent);
        Some(self.intern(Node::Var(self.extents.len() as u32 - 1), DType::I64))
    }

    /// The node of existing variable `v`.
    pub fn var_node(&mut self, v: u32) -> E {
        self.intern(Node::Var(v), DType::I64)
    }

    pub fn dim(&mut self, slot: u32) -> E {
        self.intern(Node::Dim(slot), DType::I64)
    }
    pub fn int(&mut self, v: i64) -> E {
        self.constant(DType::I64, v as f64, v)
    }
    /// A constant of `dtype`: `f` for floats, `i` for integers and bools.
    pub fn constant(&mut self, dtype: DType, f: f64, i: i64) -> E {
        let bits = if dtype.is_float() { f.to_bits() } else { i as u64 };
        self.intern(Node::Const(bits), dtype)
    }
    pub fn float(&mut self, dtype: DType, f: f64) -> E {
        self.constant(dtype, f, f as i64)
    }
    /// `e`, an f32 made of an integer, as `f32(clamp(i32(f) + offset, lo, hi))`
    /// of an f32 `f` (`PwOp::Integer`): a quantization's store,
    /// `cast<f32>(cast<u8>(min(max(cast<i32>(f) + zero_point, 0), 255)))` (and
    /// that shifted after its clamps), or `f` cast straight to an 8-bit type
    /// (saturating to its range). The clamps compose in any order; a
    /// narrowing cast needs them inside its type (it would wrap past them).
    /// (For an `e` of another type, its value is that integer only where
    /// the type holds `lo..=hi`: the caller checks.)
    pub fn stored_integer(&self, e: E) -> Option<(E, i32, i32, i32)> {
        let Node::Cast(a) = *self.node(e) else { return None };
        let range = |dt: DType| match dt {
            DType::U8 => Some((0, 255)),
            DType::I8 => Some((-128, 127)),
            DType::I32 => Some((i32::MIN, i32::MAX)),
            _ => None,
        };
        let (tlo, thi) = range(self.dtype(a))?;
        let mut v = a;
        if let Node::Cast(inner) = *self.node(v) {
            match self.dtype(inner) {
                // Saturating to an 8-bit type's range is saturating to i32, then
                // clamping (a bare `cast<i32>` is left to `hoist`, below).
                DType::F32 if tlo != i32::MIN => return Some((inner, 0, tlo, thi)),
                DType::F32 => return None,
                DType::I32 => v = inner,
                _ => return None,
            }
        }
        let constant = |c: E| self.as_int(c).and_then(|k| i32::try_from(k).ok());
        // A shift after the clamps (an int8 code moved to its byte,
        // `passes::SignedCodesAsBytes`): `clamp(a, lo, hi) + s` is
        // `clamp(a + s, lo + s, hi + s)`.
        let mut shift = 0;
        if let Node::Binary(BinaryOp::Add, p, q) = *self.node(v) {
            let clamp = |x: E| matches!(self.node(x), Node::Binary(BinaryOp::Max | BinaryOp::Min, ..));
            match (constant(p), constant(q)) {
                (_, Some(k)) if clamp(p) && self.dtype(v) == DType::I32 => (shift, v) = (k, p),
                (Some(k), None) if clamp(q) && self.dtype(v) == DType::I32 => (shift, v) = (k, q),
                _ => {}
            }
        }
        // The clamps, outermost first, applied innermost first.
        let mut clamps = Vec::new();
        loop {
            match *self.node(v) {
                Node::Binary(op @ (BinaryOp::Max | BinaryOp::Min), p, q) if self.dtype(v) == DType::I32 => {
                    let (k, rest) = match (constant(p), constant(q)) {
                        (_, Some(k)) => (k, p),
                        (Some(k), None) => (k, q),
                        _ => return None,
                    };
                    clamps.push((op, k));
                    v = rest;
                }
                _ => break,
            }
        }
        let (mut lo, mut hi) = (i32::MIN, i32::MAX);
        for (op, k) in clamps.into_iter().rev() {
            (lo, hi) = if op == BinaryOp::Max { (lo.max(k), hi.max(k)) } else { (lo.min(k), hi.min(k)) };
        }
        if shift != 0 {
            if lo == i32::MIN || hi == i32::MAX {
                return None;
            }
            (lo, hi) = (lo.checked_add(shift)?, hi.checked_add(shift)?);
        }
        if lo < tlo || hi > thi {
            return None;
        }
        // `cast<i32>(f) + offset`, the offset on either side, or subtracted.
        let (f, offset) = match *self.node(v) {
            Node::Binary(BinaryOp::Add, p, q) if constant(q).is_some() => (p, constant(q)?),
            Node::Binary(BinaryOp::Add, p, q) if constant(p).is_some() => (q, constant(p)?),
            Node::Binary(BinaryOp::Sub, p, q) => (p, constant(q)?.checked_neg()?),
            _ => (v, 0),
        };
        let offset = offset.checked_add(shift)?;
        // (A bare `cast<f32>(cast<i32>(acc))` is left to `hoist`, which knows
        // when the accumulator already holds an integer.)
        let bare = (offset, lo, hi) == (0, i32::MIN, i32::MAX);
        match *self.node(f) {
            Node::Cast(f) if self.dtype(f) == DType::F32 && self.dtype(v) == DType::I32 && !bare => {
                Some((f, offset, lo, hi))
            }
            _ => None,
        }
    }

    /// The value of an integer constant.
    pub fn as_int(&self, e: E) -> Option<i64> {
        match self.node(e) {
            Node::Const(b) if !self.dtype(e).is_float() => Some(*b as i64),
            _ => None,
        }
    }
    /// The value of a float constant.
    pub fn as_float(&self, e: E) -> Option<f64> {
        match self.node(e) {
            Node::Const(b) if self.dtype(e).is_float() => Some(f64::from_bits(*b)),
            _ => None,
        }
    }

    pub fn load(&mut self, buf: u32, dtype: DType, index: Vec<E>, guard: Option<E>) -> E {
        let guard = guard.filter(|g| self.as_int(*g) != Some(1));
        self.intern(Node::Load { buf, index, guard }, dtype)
    }
    pub fn unary(&mut self, op: UnaryOp, a: E, dtype: DType) -> E {
        self.intern(Node::Unary(op, a), dtype)
    }
    pub fn binary(&mut self, op: BinaryOp, a: E, b: E, dtype: DType) -> E {
        if dtype == DType::I64 && self.dtype(a) == DType::I64 && self.dtype(b) == DType::I64 {
            if let Some(e) = self.simplify_int(op, a, b) {
                return e;
            }
        }
        self.intern(Node::Binary(op, a, b), dtype)
    }
    pub fn select(&mut self, c: E, a: E, b: E) -> E {
        match self.as_int(c) {
            Some(0) => b,
            Some(_) => a,
            None if a == b => a,
            None => {
                let dt = self.dtype(a);
                self.intern(Node::Select(c, a, b), dt)
            }
        }
    }
    pub fn cast(&mut self, a: E, dtype: DType) -> E {
        if self.dtype(a) == dtype {
            return a;
        }
        self.intern(Node::Cast(a), dtype)
    }
    pub fn check(&mut self, ok: E, code: u32, value: E) -> E {
        if self.as_int(ok) == Some(1) {
            return value;
        }
        let dt = self.dtype(value);
        self.intern(Node::Check { ok, code, value }, dt)
    }
    pub fn reduce(&mut self, combine: Combine, vars: Vec<E>, body: E) -> E {
        // Variables of extent 1 are constants already: only real ones loop.
        let vars: Vec<u32> = vars
            .iter()
            .filter_map(|v| match self.node(*v) {
                Node::Var(i) => Some(*i),
                _ => None,
            })
            .collect();
        if vars.is_empty() {
            return body;
        }
        let dt = self.dtype(body);
        // An f16 sum or product accumulates in f32 and rounds once at the end (an
        // f16 accumulator would round at every term; the interpreter's arithmetic
        // is wide).
        if dt == DType::F16 && matches!(combine, Combine::Sum | Combine::Prod) {
            let body = self.cast(body, DType::F32);
            let r = self.intern(Node::Reduce { combine, vars, body }, DType::F32);
            return self.cast(r, DType::F16);
        }
        self.intern(Node::Reduce { combine, vars, body }, dt)
    }

    // Index arithmetic (all `i64`).
    pub fn add(&mut self, a: E, b: E) -> E {
        self.binary(BinaryOp::Add, a, b, DType::I64)
    }
    pub fn sub(&mut self, a: E, b: E) -> E {
        self.binary(BinaryOp::Sub, a, b, DType::I64)
    }
    pub fn mul(&mut self, a: E, b: E) -> E {
        self.binary(BinaryOp::Mul, a, b, DType::I64)
    }
    /// Floor division of a non-negative index by a positive extent.
    pub fn div(&mut self, a: E, b: E) -> E {
        self.binary(BinaryOp::Div, a, b, DType::I64)
    }
    pub fn rem(&mut self, a: E, b: E) -> E {
        self.binary(BinaryOp::Mod, a, b, DType::I64)
    }
    pub fn min(&mut self, a: E, b: E) -> E {
        self.binary(BinaryOp::Min, a, b, DType::I64)
    }
    pub fn max(&mut self, a: E, b: E) -> E {
        self.binary(BinaryOp::Max, a, b, DType::I64)
    }
    pub fn lt(&mut self, a: E, b: E) -> E {
        if self.known_lt(a, b) {
            return self.constant(DType::Bool, 1.0, 1);
        }
        self.binary(BinaryOp::Less, a, b, DType::Bool)
    }
    pub fn le(&mut self, a: E, b: E) -> E {
        if self.known_nonneg(a) && self.as_int(b) == Some(0) {
            // a ≤ 0 with a ≥ 0 is a == 0: leave it to the comparison.
        } else if self.as_int(a) == Some(0) && self.known_nonneg(b) {
            return self.constant(DType::Bool, 1.0, 1);
        }
        self.binary(BinaryOp::LessEq, a, b, DType::Bool)
    }
    pub fn and(&mut self, a: E, b: E) -> E {
        match (self.as_int(a), self.as_int(b)) {
            (Some(0), _) | (_, Some(0)) => self.constant(DType::Bool, 0.0, 0),
            (Some(_), _) => b,
            (_, Some(_)) => a,
            _ if a == b => a,
            _ => self.binary(BinaryOp::And, a, b, DType::Bool),
        }
    }

    fn simplify_int(&mut self, op: BinaryOp, a: E, b: E) -> Option<E> {
        let (ca, cb) = (self.as_int(a), self.as_int(b));
        if let (Some(x), Some(y)) = (ca, cb) {
            let v = match op {
                BinaryOp::Add => x.checked_add(y),
                BinaryOp::Sub => x.checked_sub(y),
                BinaryOp::Mul => x.checked_mul(y),
                BinaryOp::Div if y > 0 && x >= 0 => Some(x / y),
                BinaryOp::Mod if y > 0 && x >= 0 => Some(x % y),
                BinaryOp::Min => Some(x.min(y)),
                BinaryOp::Max => Some(x.max(y)),
                _ => None,
            };
            return v.map(|v| self.int(v));
        }
        match op {
            BinaryOp::Add if ca == Some(0) => Some(b),
            // (x / d)·d + x % d = x: a reshape undone by the inverse reshape.
            BinaryOp::Add if self.undoes_split(a, b) || self.undoes_split(b, a) => {
                let Node::Binary(BinaryOp::Mod, x, _) =
                    *self.node(if self.undoes_split(a, b) { b } else { a })
                else {
                    return None;
                };
                Some(x)
            }
            BinaryOp::Add | BinaryOp::Sub if cb == Some(0) => Some(a),
            BinaryOp::Sub if a == b => Some(self.int(0)),
            BinaryOp::Mul if ca == Some(0) || cb == Some(0) => Some(self.int(0)),
            BinaryOp::Mul if ca == Some(1) => Some(b),
            BinaryOp::Mul if cb == Some(1) => Some(a),
            BinaryOp::Div if cb == Some(1) => Some(a),
            BinaryOp::Mod if cb == Some(1) => Some(self.int(0)),
            BinaryOp::Div | BinaryOp::Mod if self.known_nonneg(a) && self.known_lt(a, b) => {
                Some(if op == BinaryOp::Div { self.int(0) } else { a })
            }
            BinaryOp::Div | BinaryOp::Mod => {
                // (x·b + y) / b = x + y / b and (x·b + y) % b = y % b, for x, y ≥ 0.
                let Node::Binary(BinaryOp::Add, p, y) = *self.node(a) else { return None };
                let (p, y) = if self.factor(p, b).is_some() { (p, y) } else { (y, p) };
                let x = self.factor(p, b)?;
                if !(self.known_nonneg(x) && self.known_nonneg(y)) {
                    return None;
                }
                Some(if op == BinaryOp::Div {
                    let q = self.div(y, b);
                    self.add(x, q)
                } else {
                    self.rem(y, b)
                })
            }
            _ => None,
        }
    }

    /// Whether `q = (x / d)·d` and `r = x % d` for the same `x` and `d`.
    fn undoes_split(&self, q: E, r: E) -> bool {
        let Node::Binary(BinaryOp::Mod, x, d) = *self.node(r) else { return false };
        self.factor(q, d).is_some_and(|f| *self.node(f) == Node::Binary(BinaryOp::Div, x, d))
    }

    /// `x` when `p = x·b` (or `b·x`).
    fn factor(&self, p: E, b: E) -> Option<E> {
        match *self.node(p) {
            Node::Binary(BinaryOp::Mul, x, y) if y == b => Some(x),
            Node::Binary(BinaryOp::Mul, x, y) if x == b => Some(y),
            _ => None,
        }
    }

    /// Whether an index expression is provably ≥ 0.
    pub fn known_nonneg(&self, e: E) -> bool {
        match self.node(e) {
            Node::Var(_) | Node::Dim(_) => true,
            Node::Const(_) => self.as_int(e).is_some_and(|v| v >= 0),
            Node::Binary(BinaryOp::Add | BinaryOp::Mul | BinaryOp::Div | BinaryOp::Mod, a, b) => {
                self.known_nonneg(*a) && self.known_nonneg(*b)
            }
            Node::Binary(BinaryOp::Min, a, b) => self.known_nonneg(*a) && self.known_nonneg(*b),
            Node::Binary(BinaryOp::Max, a, b) => self.known_nonneg(*a) || self.known_nonneg(*b),
            _ => false,
        }
    }

    /// Whether `a < b` is provable from the variables' extents (`a` an index).
    pub fn known_lt(&self, a: E, b: E) -> bool {
        match (self.node(a), self.as_int(a), self.as_int(b)) {
            (_, Some(x), Some(y)) => x < y,
            // A dim that bounds a running loop is at least 1.
            (_, Some(0), None) => matches!(self.node(b), Node::Dim(_)),
            (Node::Var(v), _, _) => {
                let ext = self.extents[*v as usize];
                ext == b || matches!((self.as_int(ext), self.as_int(b)), (Some(x), Some(y)) if x <= y)
            }
            (Node::Binary(BinaryOp::Mod, _, m), _, _) => *m == b,
            _ => false,
        }
    }
}

impl fmt::Display for Combine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cast<to>(clamps(cast<i32>(f) + offset)) + shift` over an f32 load `f`,
    /// the clamps `(op, bound)` innermost first.
    fn quantization(x: &mut Exprs, offset: i64, clamps: &[(BinaryOp, i64)], shift: i64, to: DType) -> (E, E) {
        let f = x.load(0, DType::F32, vec![], None);
        let i = x.cast(f, DType::I32);
        let k = x.constant(DType::I32, offset as f64, offset);
        let mut v = x.binary(BinaryOp::Add, i, k, DType::I32);
        for &(op, b) in clamps {
            let b = x.constant(DType::I32, b as f64, b);
            v = x.binary(op, v, b, DType::I32);
        }
        if shift != 0 {
            let s = x.constant(DType::I32, shift as f64, shift);
            v = x.binary(BinaryOp::Add, v, s, DType::I32);
        }
        let q = x.cast(v, to);
        (f, x.cast(q, DType::F32))
    }

    /// A quantization shifted after its clamps (an int8 code as its byte) is
    /// the quantization with the shift in its offset and bounds; a shift that
    /// leaves the stored type's range, or over a clamp on one side only, is
    /// no quantization.
    #[test]
    fn a_shift_after_the_clamps_moves_the_offset_and_bounds() {
        let (max, min) = (BinaryOp::Max, BinaryOp::Min);
        let cases = [
            (vec![(max, 0), (min, 255)], 0, Some((10, 0, 255))),
            (vec![(max, -128), (min, 127)], 128, Some((138, 0, 255))),
            (vec![(min, 50), (max, -100)], 128, Some((138, 28, 178))),
            (vec![(max, -128), (min, 127)], 200, None),
            (vec![(max, -128)], 128, None),
        ];
        for (clamps, shift, want) in cases {
            let mut x = Exprs::default();
            let (f, e) = quantization(&mut x, 10, &clamps, shift, DType::U8);
            let got = x.stored_integer(e);
            assert_eq!(got, want.map(|(o, lo, hi)| (f, o, lo, hi)), "{clamps:?} + {shift}");
        }
    }
}
