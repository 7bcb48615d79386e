//! Building a loop program's expressions from the graph: the value of a tensor at
//! an index, found by following its producers back to buffers (inlining), with
//! every primitive op's index map (broadcast, reshape, transpose, slice, concat,
//! pad, gather) and its computation (element-wise ops, reductions, windows,
//! convolutions, scans).

use std::collections::HashMap;

use ir::{BinaryOp, ConvAttrs, DType, Graph, Op, PadMode, PoolAttrs, PoolKind, UnaryOp, ValueId};
use sym::SymExpr;

use crate::LowerError;
use plan::{BufId, DimTable};
use plan::{Combine, Exprs, E};
use plan::{LoopProgram, Param, Store};

/// Builds one [`LoopProgram`].
pub(crate) struct Builder<'a> {
    g: &'a Graph,
    dims: &'a mut DimTable,
    /// Values held in buffers (readable by loads), and their buffers.
    avail: &'a HashMap<ValueId, BufId>,
    /// Buffers stored in a narrower type than the values they hold (a
    /// quantized activation's u8 codes of its f32 value): loaded and widened,
    /// stored narrow.
    narrowed: &'a HashMap<BufId, DType>,
    pub x: Exprs,
    params: Vec<Param>,
    /// The model buffer of each parameter.
    args: Vec<BufId>,
    /// The value each parameter holds.
    values: Vec<ValueId>,
    param_of: HashMap<BufId, u32>,
    memo: HashMap<(ValueId, Vec<E>, Option<E>), E>,
    checks: Vec<String>,
}

type R<T> = Result<T, LowerError>;

impl<'a> Builder<'a> {
    pub fn new(
        g: &'a Graph,
        dims: &'a mut DimTable,
        avail: &'a HashMap<ValueId, BufId>,
        narrowed: &'a HashMap<BufId, DType>,
    ) -> Builder<'a> {
        Builder {
            g,
            dims,
            avail,
            narrowed,
            x: Exprs::default(),
            params: Vec::new(),
            args: Vec::new(),
            values: Vec::new(),
            param_of: HashMap::new(),
            memo: HashMap::new(),
            checks: Vec::new(),
        }
    }

    /// A symbolic dim as an index expression.
    pub fn sym(&mut self, e: &SymExpr) -> E {
        let e = self.g.env.normalize(e);
        match e.as_const() {
            Some(c) => self.x.int(c),
            None => {
                let slot = self.dims.slot(&e);
                self.x.dim(slot)
            }
        }
    }

    fn syms(&mut self, es: &[SymExpr]) -> Vec<E> {
        es.iter().map(|e| self.sym(e)).collect()
    }

    fn shape(&self, v: ValueId) -> &'a [SymExpr] {
        &self.g.ty(v).shape
    }

    fn dtype(&self, v: ValueId) -> DType {
        self.g.ty(v).dtype
    }

    /// The parameter for model buffer `buf` holding `v` (added when new).
    pub fn param(&mut self, v: ValueId, buf: BufId, written: bool) -> u32 {
        if let Some(p) = self.param_of.get(&buf) {
            self.params[*p as usize].written |= written;
            return *p;
        }
        let shape = self.syms(&self.g.ty(v).shape.clone());
        let dtype = self.narrowed.get(&buf).copied().unwrap_or_else(|| self.dtype(v));
        self.params.push(Param { name: self.g.name(v).to_string(), dtype, shape, written });
        self.args.push(buf);
        self.values.push(v);
        self.param_of.insert(buf, self.params.len() as u32 - 1);
        self.params.len() as u32 - 1
    }

    /// The program storing `outs` (values of equal element count, each with its
    /// buffer) over the space `space`.
    /// The program and the model buffer of each of its parameters.
    pub fn program(
        mut self,
        name: String,
        space: &[SymExpr],
        outs: &[(ValueId, BufId)],
    ) -> R<(LoopProgram, Vec<BufId>)> {
        let ext = self.syms(space);
        let mut vars = Vec::with_capacity(ext.len());
        for e in &ext {
            vars.push(self.x.var(*e).ok_or_else(|| too_many(self.g, outs[0].0))?);
        }
        let mut stores = Vec::new();
        for &(v, buf) in outs {
            let idx = self.reshape_index(space, self.shape(v), &vars);
            // A narrowed buffer stores the narrow value `v` widens, or `v` cast
            // to its type (integers in its range: exact).
            let value = match self.narrowed.get(&buf) {
                Some(&dt) => match self.narrow_source(v, dt) {
                    Some(u) => self.value_at(u, &idx, None)?,
                    None => {
                        let wide = self.value_at(v, &idx, None)?;
                        self.x.cast(wide, dt)
                    }
                },
                None => self.value_at(v, &idx, None)?,
            };
            let param = self.param(v, buf, true);
            stores.push(Store { param, value });
        }
        Ok(self.finish(name, ext, vars, stores))
    }

    /// The program of what was built, its schedules analyzed, and the model
    /// buffer of each of its parameters.
    fn finish(
        self,
        name: String,
        space: Vec<E>,
        vars: Vec<E>,
        stores: Vec<Store>,
    ) -> (LoopProgram, Vec<BufId>) {
        let mut program = LoopProgram {
            name,
            exprs: self.x,
            params: self.params,
            space,
            vars,
            stores,
            checks: self.checks,
            schedules: Default::default(),
        };
        crate::schedules::analyze(&mut program);
        (program, self.args)
    }

    /// The model buffer and the value of parameter `p`.
    pub fn arg(&self, p: u32) -> (BufId, ValueId) {
        (self.args[p as usize], self.values[p as usize])
    }

    /// Dim slot `slot`'s value where it is a constant.
    pub fn dim_value(&self, slot: u32) -> Option<i64> {
        crate::operands::slot_const(self.dims, slot)
    }

    /// Whether buffer `buf` is stored narrower than the values it holds (a
    /// load widens it).
    pub fn is_narrowed(&self, buf: BufId) -> bool {
        self.narrowed.contains_key(&buf)
    }

    /// Every parameter's model buffer and value, in order.
    pub fn args(&self) -> Vec<(BufId, ValueId)> {
        self.args.iter().copied().zip(self.values.iter().copied()).collect()
    }

    /// The program over `space` (its variables `vars`, from [`Builder::vars`])
    /// storing each of `stores` (f32 `value`, into new buffer `buf` of the
    /// space's shape, named `name`, computed for the graph's `for_value`): terms
    /// of another program moved into one of their own, not values of the graph.
    pub fn program_storing(
        mut self,
        name: String,
        space: &[SymExpr],
        vars: Vec<E>,
        stores: Vec<(String, BufId, ValueId, E)>,
    ) -> (LoopProgram, Vec<BufId>) {
        let ext = self.syms(space);
        let mut out = Vec::with_capacity(stores.len());
        for (pname, buf, for_value, value) in stores {
            let shape = ext.clone();
            self.params.push(Param { name: pname, dtype: DType::F32, shape, written: true });
            self.args.push(buf);
            self.values.push(for_value);
            out.push(Store { param: self.params.len() as u32 - 1, value });
        }
        self.finish(name, ext, vars, out)
    }

    /// The value of type `dt` that `v` is a widening cast of, if it is one.
    fn narrow_source(&self, v: ValueId, dt: DType) -> Option<ValueId> {
        let g = self.g;
        match g.producers()[v.index()].map(|p| &g.nodes[p]) {
            Some(n) if matches!(n.op, Op::Cast) && self.dtype(n.inputs[0]) == dt => Some(n.inputs[0]),
            _ => None,
        }
    }

    /// The program's variables over `space`.
    pub fn vars(&mut self, space: &[SymExpr], v: ValueId) -> R<Vec<E>> {
        let ext = self.syms(space);
        ext.iter().map(|e| self.x.var(*e).ok_or_else(|| too_many(self.g, v))).collect()
    }

    pub fn shape_of(&self, v: ValueId) -> &'a [SymExpr] {
        self.shape(v)
    }

    /// The index into `to` of the element at row-major position `idx` of `from`
    /// (equal element counts): dims are matched in groups of equal products, so
    /// a split or a merge of dims costs no division where none is needed.
    pub fn reshape_index(&mut self, from: &[SymExpr], to: &[SymExpr], idx: &[E]) -> Vec<E> {
        let env = &self.g.env;
        if from.len() == to.len() && from.iter().zip(to).all(|(a, b)| env.equal(a, b)) {
            return idx.to_vec();
        }
        let groups = match_groups(env, from, to).unwrap_or_else(|| vec![(0..from.len(), 0..to.len())]);
        let mut out = vec![self.x.int(0); to.len()];
        for (fr, tr) in groups {
            let mut lin = self.x.int(0);
            for d in fr {
                let ext = self.sym(&from[d]);
                let l = self.x.mul(lin, ext);
                lin = self.x.add(l, idx[d]);
            }
            // An axis of extent 1 is at 0; the outermost other one takes the
            // quotient whole (an in-bounds position is below the group's size),
            // so that no division is left where none is needed: a [n, h, w]
            // position read as [1, n·h·w] is the linear position itself, not a
            // division and a remainder per element (ResNet's NCHW output from its
            // channels-last products: one per lane of its innermost loop).
            let unit = |d: usize| env.equal(&to[d], &SymExpr::constant(1));
            let first = tr.clone().find(|&d| !unit(d)).unwrap_or(tr.start);
            for d in tr.rev() {
                if d == first {
                    out[d] = lin;
                } else if unit(d) {
                    out[d] = self.x.int(0);
                } else {
                    let ext = self.sym(&to[d]);
                    out[d] = self.x.rem(lin, ext);
                    lin = self.x.div(lin, ext);
                }
            }
        }
        out
    }

    fn error(&mut self, v: ValueId, op: &Op, what: &str) -> u32 {
        self.checks.push(format!("{} computing '{}': {what}", op.name(), self.g.name(v)));
        self.checks.len() as u32
    }

    fn bool_const(&mut self, b: bool) -> E {
        self.x.constant(DType::Bool, b as i64 as f64, b as i64)
    }

    /// The value of `v` at `idx`; loads beneath are masked by `guard`.
    pub fn value_at(&mut self, v: ValueId, idx: &[E], guard: Option<E>) -> R<E> {
        let key = (v, idx.to_vec(), guard);
        if let Some(e) = self.memo.get(&key) {
            return Ok(*e);
        }
        let e = self.compute(v, idx, guard)?;
        self.memo.insert(key, e);
        Ok(e)
    }

    fn compute(&mut self, v: ValueId, idx: &[E], guard: Option<E>) -> R<E> {
        let g = self.g;
        let dt = self.dtype(v);
        let producer = g.producers()[v.index()];
        // A one-element constant is a literal, wherever it lives.
        if let Some(p) = producer {
            if let Op::Constant(c) = &g.nodes[p].op {
                if c.numel() == 1 {
                    return Ok(self.literal(c));
                }
            }
        }
        if let Some(&buf) = self.avail.get(&v) {
            let p = self.param(v, buf, false);
            if let Some(&narrow) = self.narrowed.get(&buf) {
                let l = self.x.load(p, narrow, idx.to_vec(), guard);
                return Ok(self.x.cast(l, dt));
            }
            return Ok(self.x.load(p, dt, idx.to_vec(), guard));
        }
        let Some(p) = producer else {
            return Err(LowerError::Internal(format!("'{}' is neither computed nor in a buffer", g.name(v))));
        };
        let node = &g.nodes[p];
        let ins = &node.inputs;
        let at = |b: &mut Self, i: usize, idx: &[E]| b.value_at(ins[i], idx, guard);
        Ok(match &node.op {
            Op::Constant(_) => {
                return Err(LowerError::Internal(format!("constant '{}' has no buffer", g.name(v))));
            }
            Op::SymConst(vals) => {
                if idx.is_empty() {
                    self.sym(&vals[0])
                } else {
                    let mut e = self.sym(&vals[vals.len() - 1]);
                    for (k, s) in vals.iter().enumerate().rev().skip(1) {
                        let s = self.sym(s);
                        let kk = self.x.int(k as i64);
                        let c = self.x.binary(BinaryOp::Equal, idx[0], kk, DType::Bool);
                        e = self.x.select(c, s, e);
                    }
                    e
                }
            }
            Op::Iota { axis } => self.x.cast(idx[*axis], dt),
            Op::Unary(u) => {
                let a = at(self, 0, idx)?;
                self.x.unary(*u, a, dt)
            }
            Op::Binary(b) => {
                let (a, c) = (at(self, 0, idx)?, at(self, 1, idx)?);
                self.binary(v, &node.op, *b, a, c, dt, guard)
            }
            Op::Select => {
                let (c, a, b) = (at(self, 0, idx)?, at(self, 1, idx)?, at(self, 2, idx)?);
                self.x.select(c, a, b)
            }
            Op::Cast => {
                let a = at(self, 0, idx)?;
                self.x.cast(a, dt)
            }
            Op::Broadcast => {
                let (is, os) = (self.shape(ins[0]), self.shape(v));
                let mut j = Vec::with_capacity(idx.len());
                for d in 0..idx.len() {
                    if is[d].as_const() == Some(1) {
                        j.push(self.x.int(0));
                    } else if g.env.equal(&is[d], &os[d]) {
                        j.push(idx[d]);
                    } else {
                        // A dim that may be 1 at run time: index 0 then.
                        let (e, one, zero) = (self.sym(&is[d]), self.x.int(1), self.x.int(0));
                        let c = self.x.binary(BinaryOp::Equal, e, one, DType::Bool);
                        j.push(self.x.select(c, zero, idx[d]));
                    }
                }
                at(self, 0, &j)?
            }
            Op::Reshape => {
                let j = self.reshape_index(self.shape(v), self.shape(ins[0]), idx);
                at(self, 0, &j)?
            }
            Op::Transpose { perm } => {
                let mut j = vec![self.x.int(0); idx.len()];
                for (i, p) in perm.iter().enumerate() {
                    j[*p] = idx[i];
                }
                at(self, 0, &j)?
            }
            Op::Slice { axes } => {
                let mut j = idx.to_vec();
                for a in axes {
                    let (s, st) = (self.sym(&a.start), self.x.int(a.step));
                    let off = self.x.mul(idx[a.axis], st);
                    j[a.axis] = self.x.add(s, off);
                }
                at(self, 0, &j)?
            }
            Op::Concat { axis } => {
                let mut off = SymExpr::constant(0);
                let mut parts = Vec::new();
                for (k, inp) in ins.iter().enumerate() {
                    let ext = &self.shape(*inp)[*axis];
                    let end = off.try_add(ext).map_err(|e| LowerError::Internal(e.to_string()))?;
                    let (lo, hi) = (self.sym(&off), self.sym(&end));
                    let mut j = idx.to_vec();
                    j[*axis] = self.x.sub(idx[*axis], lo);
                    let (c1, c2) = (self.x.le(lo, idx[*axis]), self.x.lt(idx[*axis], hi));
                    let inside = self.x.and(c1, c2);
                    let gd = self.and_guard(guard, inside);
                    let val = self.value_at(ins[k], &j, Some(gd))?;
                    parts.push((c2, val));
                    off = end;
                }
                let (_, mut e) = parts.pop().ok_or_else(|| LowerError::Internal("empty concat".into()))?;
                for (c, val) in parts.into_iter().rev() {
                    e = self.x.select(c, val, e);
                }
                e
            }
            Op::Gather { axis } => {
                let (data, ind) = (ins[0], ins[1]);
                let q = self.shape(ind).len();
                let j = self.value_at(ind, &idx[*axis..*axis + q], guard)?;
                let j = self.x.cast(j, DType::I64);
                let n = self.sym(&self.shape(data)[*axis]);
                let zero = self.x.int(0);
                let neg = self.x.lt(j, zero);
                let wrapped = self.x.add(j, n);
                let j = self.x.select(neg, wrapped, j);
                let (c1, c2) = (self.x.le(zero, j), self.x.lt(j, n));
                let ok = self.x.and(c1, c2);
                let jc = self.x.select(ok, j, zero);
                let mut k: Vec<E> = idx[..*axis].to_vec();
                k.push(jc);
                k.extend_from_slice(&idx[*axis + q..]);
                let val = self.value_at(data, &k, guard)?;
                let code = self.error(v, &node.op, "an index is out of range");
                let ok = match guard {
                    Some(gd) => {
                        let t = self.bool_const(true);
                        self.x.select(gd, ok, t)
                    }
                    None => ok,
                };
                self.x.check(ok, code, val)
            }
            Op::Pad { pads, mode } => self.pad(ins[0], pads, *mode, idx, guard, dt)?,
            Op::Reduce { op, axes, keep_dims } => {
                let xs = self.shape(ins[0]);
                let mut j = Vec::with_capacity(xs.len());
                let mut vars = Vec::new();
                let mut count = self.x.int(1);
                let mut o = 0;
                for (d, ext) in xs.iter().enumerate() {
                    if axes.contains(&d) {
                        let e = self.sym(ext);
                        count = self.x.mul(count, e);
                        let var = self.x.var(e).ok_or_else(|| too_many(g, v))?;
                        vars.push(var);
                        j.push(var);
                        if *keep_dims {
                            o += 1;
                        }
                    } else {
                        j.push(idx[o]);
                        o += 1;
                    }
                }
                let body = at(self, 0, &j)?;
                // f16 sums accumulate in f32 (as every f16 sum does), and a mean
                // divides there too, rounded once at the end.
                let acc = if dt == DType::F16 && *op != ir::ReduceOp::Max && *op != ir::ReduceOp::Min {
                    DType::F32
                } else {
                    dt
                };
                let body = self.x.cast(body, acc);
                let r = self.x.reduce(Combine::of(*op), vars, body);
                let r = if *op == ir::ReduceOp::Mean {
                    let c = self.x.cast(count, acc);
                    self.x.binary(BinaryOp::Div, r, c, acc)
                } else {
                    r
                };
                self.x.cast(r, dt)
            }
            Op::MatMul { transpose_a, transpose_b } => {
                let r = idx.len();
                let a_shape = self.shape(ins[0]);
                let kdim = if *transpose_a { &a_shape[r - 2] } else { &a_shape[r - 1] };
                let ke = self.sym(kdim);
                let k = self.x.var(ke).ok_or_else(|| too_many(g, v))?;
                let mut ia = idx[..r - 2].to_vec();
                let mut ib = ia.clone();
                ia.extend(if *transpose_a { [k, idx[r - 2]] } else { [idx[r - 2], k] });
                ib.extend(if *transpose_b { [idx[r - 1], k] } else { [k, idx[r - 1]] });
                let (a, b) = (at(self, 0, &ia)?, at(self, 1, &ib)?);
                self.sum_of_products(a, b, vec![k], dt)
            }
            Op::Conv(c) => self.conv(v, ins[0], ins[1], c, idx, guard, dt)?,
            Op::ConvTranspose(c) => self.conv_transpose(v, ins[0], ins[1], c, idx, guard, dt)?,
            Op::Pool(p) => self.pool(v, ins[0], p, idx, guard, dt)?,
            Op::CumSum { axis, exclusive, reverse } => {
                let i = idx[*axis];
                let n = self.sym(&self.shape(ins[0])[*axis]);
                let one = self.x.int(1);
                let (ext, start) = match (*exclusive, *reverse) {
                    (false, false) => (self.x.add(i, one), self.x.int(0)),
                    (true, false) => (i, self.x.int(0)),
                    (false, true) => (self.x.sub(n, i), i),
                    (true, true) => {
                        let r = self.x.sub(n, i);
                        (self.x.sub(r, one), self.x.add(i, one))
                    }
                };
                let t = self.x.var(ext).ok_or_else(|| too_many(g, v))?;
                let mut j = idx.to_vec();
                j[*axis] = self.x.add(start, t);
                let body = at(self, 0, &j)?;
                self.x.reduce(Combine::Sum, vec![t], body)
            }
        })
    }

    fn literal(&mut self, c: &ir::ConstData) -> E {
        let t = c.to_tensor();
        let f = t.to_f64_vec()[0];
        let i = t.to_i64_vec().map_or(f as i64, |v| v[0]);
        self.x.constant(c.dtype, f, i)
    }

    fn and_guard(&mut self, guard: Option<E>, c: E) -> E {
        match guard {
            Some(gd) => self.x.and(gd, c),
            None => c,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn binary(&mut self, v: ValueId, op: &Op, b: BinaryOp, x: E, y: E, dt: DType, guard: Option<E>) -> E {
        if b == BinaryOp::Pow && dt.is_float() {
            // x^2, x^3, x^0.5 and x^1 without a call to pow.
            match self.x.as_float(y) {
                Some(1.0) => return x,
                Some(2.0) => return self.x.binary(BinaryOp::Mul, x, x, dt),
                Some(3.0) => {
                    let sq = self.x.binary(BinaryOp::Mul, x, x, dt);
                    return self.x.binary(BinaryOp::Mul, sq, x, dt);
                }
                Some(0.5) => return self.x.unary(UnaryOp::Sqrt, x, dt),
                _ => {}
            }
        }
        let e = self.x.binary(b, x, y, dt);
        let in_dt = self.x.dtype(x);
        if matches!(b, BinaryOp::Div | BinaryOp::Mod) && !in_dt.is_float() && in_dt != DType::Bool {
            let zero = self.x.constant(in_dt, 0.0, 0);
            let nz = self.x.binary(BinaryOp::Equal, y, zero, DType::Bool);
            let ok = self.x.unary(UnaryOp::Not, nz, DType::Bool);
            let ok = match guard {
                Some(gd) => {
                    let t = self.bool_const(true);
                    self.x.select(gd, ok, t)
                }
                None => ok,
            };
            let code = self.error(v, op, "integer division by zero");
            return self.x.check(ok, code, e);
        }
        e
    }

    fn pad(
        &mut self,
        x: ValueId,
        pads: &[(SymExpr, SymExpr)],
        mode: PadMode,
        idx: &[E],
        guard: Option<E>,
        dt: DType,
    ) -> R<E> {
        let xs = self.shape(x);
        let zero = self.x.int(0);
        let mut j = Vec::with_capacity(idx.len());
        let mut inside = self.bool_const(true);
        for d in 0..idx.len() {
            let (before, n) = (self.sym(&pads[d].0), self.sym(&xs[d]));
            let r = self.x.sub(idx[d], before);
            let one = self.x.int(1);
            let last = self.x.sub(n, one);
            j.push(match mode {
                PadMode::Constant(_) => {
                    let (c1, c2) = (self.x.le(zero, r), self.x.lt(r, n));
                    let c = self.x.and(c1, c2);
                    inside = self.x.and(inside, c);
                    r
                }
                PadMode::Edge => {
                    let r = self.x.max(r, zero);
                    self.x.min(r, last)
                }
                PadMode::Reflect => {
                    let neg = self.x.lt(r, zero);
                    let mr = self.x.sub(zero, r);
                    let r1 = self.x.select(neg, mr, r);
                    let over = self.x.lt(last, r1);
                    let twice = self.x.add(last, last);
                    let back = self.x.sub(twice, r1);
                    self.x.select(over, back, r1)
                }
                PadMode::Wrap => {
                    // Python-style modulo: non-negative for a positive extent.
                    self.x.binary(BinaryOp::Mod, r, n, DType::I64)
                }
            });
        }
        match mode {
            PadMode::Constant(c) => {
                let gd = self.and_guard(guard, inside);
                let val = self.value_at(x, &j, Some(gd))?;
                let c = self.x.constant(dt, c, c as i64);
                Ok(self.x.select(inside, val, c))
            }
            _ => self.value_at(x, &j, guard),
        }
    }

    /// Input position `o·stride + k·dilation − pad` of a window tap, and whether
    /// it lies inside the input.
    fn tap(&mut self, o: E, k: E, stride: i64, dil: i64, pad: i64, n: E) -> (E, E) {
        let (s, d, p) = (self.x.int(stride), self.x.int(dil), self.x.int(pad));
        let a = self.x.mul(o, s);
        let b = self.x.mul(k, d);
        let q = self.x.add(a, b);
        let q = self.x.sub(q, p);
        let zero = self.x.int(0);
        let (c1, c2) = (self.x.le(zero, q), self.x.lt(q, n));
        (q, self.x.and(c1, c2))
    }

    /// `Σ_vars a·b` in `dt`; f16 products are taken in f32 (and summed there, as
    /// every f16 sum is: [`plan::Exprs::reduce`]), rounded once.
    fn sum_of_products(&mut self, a: E, b: E, vars: Vec<E>, dt: DType) -> E {
        let acc = if dt == DType::F16 { DType::F32 } else { dt };
        let (a, b) = (self.x.cast(a, acc), self.x.cast(b, acc));
        let p = self.x.binary(BinaryOp::Mul, a, b, acc);
        let sum = self.x.reduce(Combine::Sum, vars, p);
        self.x.cast(sum, dt)
    }

    #[allow(clippy::too_many_arguments)]
    fn conv(
        &mut self,
        v: ValueId,
        xv: ValueId,
        wv: ValueId,
        a: &ConvAttrs,
        idx: &[E],
        guard: Option<E>,
        dt: DType,
    ) -> R<E> {
        let (xs, ws) = (self.shape(xv), self.shape(wv));
        let sp = xs.len() - 2;
        let cg = self.sym(&ws[1]);
        let c = self.x.var(cg).ok_or_else(|| too_many(self.g, v))?;
        let ch = if a.group == 1 {
            c
        } else {
            let m = self.sym(&ws[0]);
            let gs = self.x.int(a.group);
            let mg = self.x.div(m, gs);
            let grp = self.x.div(idx[1], mg);
            let base = self.x.mul(grp, cg);
            self.x.add(base, c)
        };
        let mut vars = vec![c];
        let mut xi = vec![idx[0], ch];
        let mut wi = vec![idx[1], c];
        let mut inside = self.bool_const(true);
        for d in 0..sp {
            let ke = self.sym(&ws[2 + d]);
            let k = self.x.var(ke).ok_or_else(|| too_many(self.g, v))?;
            let n = self.sym(&xs[2 + d]);
            let (q, ok) = self.tap(idx[2 + d], k, a.strides[d], a.dilations[d], a.pads_begin[d], n);
            inside = self.x.and(inside, ok);
            xi.push(q);
            wi.push(k);
            vars.push(k);
        }
        let gd = self.and_guard(guard, inside);
        let xval = self.value_at(xv, &xi, Some(gd))?;
        let wval = self.value_at(wv, &wi, guard)?;
        Ok(self.sum_of_products(xval, wval, vars, dt))
    }

    #[allow(clippy::too_many_arguments)]
    fn conv_transpose(
        &mut self,
        v: ValueId,
        xv: ValueId,
        wv: ValueId,
        a: &ConvAttrs,
        idx: &[E],
        guard: Option<E>,
        dt: DType,
    ) -> R<E> {
        let (xs, ws) = (self.shape(xv), self.shape(wv));
        let sp = xs.len() - 2;
        let mg = self.sym(&ws[1]);
        let cin = self.sym(&xs[1]);
        let gs = self.x.int(a.group);
        let cg = self.x.div(cin, gs);
        let c = self.x.var(cg).ok_or_else(|| too_many(self.g, v))?;
        let grp = self.x.div(idx[1], mg);
        let base = self.x.mul(grp, cg);
        let ch = self.x.add(base, c);
        let m_in = self.x.rem(idx[1], mg);
        let mut vars = vec![c];
        let mut xi = vec![idx[0], ch];
        let mut wi = vec![ch, m_in];
        let mut inside = self.bool_const(true);
        let zero = self.x.int(0);
        for d in 0..sp {
            let ke = self.sym(&ws[2 + d]);
            let k = self.x.var(ke).ok_or_else(|| too_many(self.g, v))?;
            let n = self.sym(&xs[2 + d]);
            let (s, dl, p) =
                (self.x.int(a.strides[d]), self.x.int(a.dilations[d]), self.x.int(a.pads_begin[d]));
            // i·s = o + pad − k·d must hold for an integer i inside the input.
            let op = self.x.add(idx[2 + d], p);
            let kd = self.x.mul(k, dl);
            let num = self.x.binary(BinaryOp::Sub, op, kd, DType::I64);
            let nonneg = self.x.le(zero, num);
            let nn = self.x.max(num, zero);
            let r = self.x.rem(nn, s);
            let exact = self.x.binary(BinaryOp::Equal, r, zero, DType::Bool);
            let i = self.x.div(nn, s);
            let below = self.x.lt(i, n);
            let ok = self.x.and(nonneg, exact);
            let ok = self.x.and(ok, below);
            inside = self.x.and(inside, ok);
            xi.push(i);
            wi.push(k);
            vars.push(k);
        }
        let gd = self.and_guard(guard, inside);
        let xval = self.value_at(xv, &xi, Some(gd))?;
        let wval = self.value_at(wv, &wi, guard)?;
        Ok(self.sum_of_products(xval, wval, vars, dt))
    }

    fn pool(
        &mut self,
        v: ValueId,
        xv: ValueId,
        p: &PoolAttrs,
        idx: &[E],
        guard: Option<E>,
        dt: DType,
    ) -> R<E> {
        let xs = self.shape(xv);
        let sp = xs.len() - 2;
        // The input's index: the output's batch and channel, the taps' positions.
        let (_, first) = p.axes(xs.len());
        let mut xi = idx.to_vec();
        let mut vars = Vec::new();
        let mut inside = self.bool_const(true);
        // Inside the input or its explicit padding (not past it, where ceil mode
        // may put a window): what `count_include_pad` counts.
        let mut padded = self.bool_const(true);
        for d in 0..sp {
            let ke = self.x.int(p.kernel[d]);
            let k = self.x.var(ke).ok_or_else(|| too_many(self.g, v))?;
            let n = self.sym(&xs[first + d]);
            let (q, ok) = self.tap(idx[first + d], k, p.strides[d], p.dilations[d], p.pads_begin[d], n);
            inside = self.x.and(inside, ok);
            let (lo, hi) = (self.x.int(-p.pads_begin[d]), self.x.int(p.pads_end[d]));
            let end = self.x.add(n, hi);
            let (c1, c2) = (self.x.le(lo, q), self.x.lt(q, end));
            let within = self.x.and(c1, c2);
            padded = self.x.and(padded, within);
            xi[first + d] = q;
            vars.push(k);
        }
        let gd = self.and_guard(guard, inside);
        let val = self.value_at(xv, &xi, Some(gd))?;
        Ok(match p.kind {
            PoolKind::Max => {
                let low = if dt.is_float() {
                    self.x.float(dt, f64::NEG_INFINITY)
                } else {
                    self.x.constant(dt, 0.0, int_min(dt))
                };
                let body = self.x.select(inside, val, low);
                self.x.reduce(Combine::Max, vars, body)
            }
            PoolKind::Avg { count_include_pad } => {
                let sum = self.x.reduce(Combine::Sum, vars.clone(), val);
                let counted = if count_include_pad { padded } else { inside };
                let one = self.x.cast(counted, dt);
                let count = self.x.reduce(Combine::Sum, vars, one);
                self.x.binary(BinaryOp::Div, sum, count, dt)
            }
        })
    }
}

fn int_min(dt: DType) -> i64 {
    match dt {
        DType::I8 => i8::MIN as i64,
        DType::I32 => i32::MIN as i64,
        DType::U8 | DType::Bool => 0,
        _ => i64::MIN,
    }
}

fn too_many(g: &Graph, v: ValueId) -> LowerError {
    LowerError::Unsupported {
        op: "loop nest".into(),
        node: g.name(v).to_string(),
        why: format!("needs more than {} loop variables", plan::expr::MAX_VARS),
    }
}

/// Consecutive groups of dims of `a` and `b` with equal products (proved by the
/// `ShapeEnv`), or `None` when no such matching is found.
pub(crate) fn match_groups(
    env: &sym::ShapeEnv,
    a: &[SymExpr],
    b: &[SymExpr],
) -> Option<Vec<(std::ops::Range<usize>, std::ops::Range<usize>)>> {
    let one = SymExpr::constant(1);
    let mul = |x: &SymExpr, y: &SymExpr| x.try_mul(y).ok();
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    while i < a.len() || j < b.len() {
        let (si, sj) = (i, j);
        let mut pa = if i < a.len() {
            i += 1;
            a[i - 1].clone()
        } else {
            one.clone()
        };
        let mut pb = if j < b.len() {
            j += 1;
            b[j - 1].clone()
        } else {
            one.clone()
        };
        while !env.equal(&pa, &pb) {
            // Grow the smaller side, compared with every symbol at one large value
            // (`b` against `b·s`): a guess the equality test above then checks.
            let generic = |e: &SymExpr| e.eval(&|_| Some(1009)).unwrap_or(i64::MAX);
            let grow_a = i < a.len() && (j >= b.len() || generic(&pa) <= generic(&pb));
            if grow_a {
                pa = mul(&pa, &a[i])?;
                i += 1;
            } else if j < b.len() {
                pb = mul(&pb, &b[j])?;
                j += 1;
            } else {
                return None;
            }
        }
        // Trailing ones join the group they follow.
        while i < a.len() && a[i].as_const() == Some(1) && !(j < b.len() && b[j].as_const() == Some(1)) {
            i += 1;
        }
        while j < b.len() && b[j].as_const() == Some(1) && !(i < a.len() && a[i].as_const() == Some(1)) {
            j += 1;
        }
        out.push((si..i, sj..j));
    }
    Some(out)
}
