//! Model-local functions and sequences, both resolved at compile time.
//!
//! - A call of a local function (the dynamo exporter writes `aten_getitem` and the
//!   like) is inlined: its body's values get a per-call prefix, its formal inputs
//!   and outputs are bound to the caller's, attribute references take the
//!   caller's attributes (or the function's defaults), and the body is imported
//!   under the function's own opset.
//! - A sequence value is a list of IR values known at compile time:
//!   `SplitToSequence` becomes slices, `SequenceAt` with a constant position
//!   picks one, `ConcatFromSequence` concatenates. Sequences whose length or
//!   positions depend on data are not supported.

use ir::{Op, SliceAxis, TensorType, ValueId};
use sym::SymExpr;

use super::{node_name, norm_axis, Importer, Node, R};
use crate::proto::{AttributeProto, FunctionProto, NodeProto};
use crate::OnnxError;

/// Deepest chain of function calls inlined (a recursive function is an error).
const MAX_INLINE_DEPTH: usize = 16;

impl Importer {
    /// Inline a call of the local function `f`.
    pub(crate) fn inline_call(&mut self, call: &NodeProto, f: &FunctionProto) -> Result<(), OnnxError> {
        let name = node_name(call);
        let fname = f.name.clone().unwrap_or_default();
        if self.inline_depth >= MAX_INLINE_DEPTH {
            return Err(OnnxError::Node {
                node: name,
                op: fname,
                msg: format!("local functions nest deeper than {MAX_INLINE_DEPTH} (recursion?)"),
            });
        }
        self.inline_calls += 1;
        let prefix = format!("{name}#{}/", self.inline_calls);
        // Formal name → actual name in the caller's scope.
        let mut rename: std::collections::HashMap<&str, String> = std::collections::HashMap::new();
        for (i, formal) in f.input.iter().enumerate() {
            rename.insert(formal, call.input.get(i).cloned().unwrap_or_default());
        }
        for (i, formal) in f.output.iter().enumerate() {
            rename.insert(formal, call.output.get(i).cloned().unwrap_or_default());
        }
        let map = |v: &String| -> String {
            if v.is_empty() {
                return String::new();
            }
            rename.get(v.as_str()).cloned().unwrap_or_else(|| format!("{prefix}{v}"))
        };
        let saved_opset = self.opset;
        if let Some(v) = f
            .opset_import
            .iter()
            .find(|o| matches!(o.domain.as_deref(), None | Some("") | Some("ai.onnx")))
            .and_then(|o| o.version)
        {
            self.opset = v;
        }
        let bind = |n: &NodeProto| {
            bind_attributes(&n.attribute, call, f).map_err(|msg| OnnxError::Node {
                node: name.clone(),
                op: fname.clone(),
                msg,
            })
        };
        let result = self.import_body(&f.node, &map, &prefix, &bind);
        self.opset = saved_opset;
        result
    }

    /// `If` whose condition is known at compile time (a constant, or arithmetic
    /// on shapes): the taken branch's nodes, inlined. Names the branch defines get
    /// a prefix of their own; the others are the enclosing graph's.
    pub(crate) fn inline_if(&mut self, node: &NodeProto) -> Result<(), OnnxError> {
        let name = node_name(node);
        let err = |msg: String| OnnxError::Node { node: name.clone(), op: "If".into(), msg };
        let cond = node.input.first().and_then(|c| self.vals.get(c)).copied();
        let known = cond.and_then(|c| self.const_f64(c)).filter(|c| c.len() == 1).map(|c| c[0] != 0.0);
        let Some(taken) = known else {
            return Err(err("its condition is computed at run time; only an If whose condition is known \
                 when the model is compiled (a constant, or arithmetic on shapes) is supported"
                .into()));
        };
        let which = if taken { "then_branch" } else { "else_branch" };
        let g = node
            .attribute
            .iter()
            .find(|a| a.name.as_deref() == Some(which))
            .and_then(|a| a.g.as_ref())
            .ok_or_else(|| err(format!("no {which} graph")))?;
        if g.output.len() != node.output.len() {
            return Err(err(format!(
                "{which} has {} outputs for {} of the node",
                g.output.len(),
                node.output.len()
            )));
        }
        if self.inline_depth >= MAX_INLINE_DEPTH {
            return Err(err(format!("branches nest deeper than {MAX_INLINE_DEPTH}")));
        }
        self.inline_calls += 1;
        let prefix = format!("{name}#{}/", self.inline_calls);
        let local: std::collections::HashSet<&str> = g
            .initializer
            .iter()
            .filter_map(|t| t.name.as_deref())
            .chain(g.node.iter().flat_map(|n| n.output.iter().map(|o| o.as_str())))
            .filter(|n| !n.is_empty())
            .collect();
        let map = |v: &String| if local.contains(v.as_str()) { format!("{prefix}{v}") } else { v.clone() };
        for t in &g.initializer {
            let data = crate::load::tensor_data(t, &mut self.ext)?;
            let v = self.constant(data);
            self.mark_narrow(v, t.data_type.unwrap_or(0));
            self.vals.insert(map(&t.name.clone().unwrap_or_default()), v);
        }
        // A nested branch reads this one's values by their new names too.
        let renamed = |n: &NodeProto| {
            let mut attrs = n.attribute.clone();
            for a in &mut attrs {
                if let Some(sub) = a.g.as_mut() {
                    rename_graph(sub, &map);
                }
            }
            Ok(attrs)
        };
        self.import_body(&g.node, &map, &prefix, &renamed)?;
        for (out, o) in node.output.iter().zip(&g.output) {
            let src = map(&o.name.clone().unwrap_or_default());
            let v = *self.vals.get(&src).ok_or_else(|| err(format!("{which} never computes '{src}'")))?;
            if !out.is_empty() {
                self.vals.insert(out.clone(), v);
            }
        }
        Ok(())
    }

    /// Import `nodes` (a function's body, a branch) one level deeper: their
    /// values renamed by `map`, their names under `prefix`, their attributes made
    /// by `attrs`.
    fn import_body(
        &mut self,
        nodes: &[NodeProto],
        map: &dyn Fn(&String) -> String,
        prefix: &str,
        attrs: &dyn Fn(&NodeProto) -> Result<Vec<AttributeProto>, OnnxError>,
    ) -> Result<(), OnnxError> {
        self.inline_depth += 1;
        let mut result = Ok(());
        for n in nodes {
            let mut body = n.clone();
            body.input = n.input.iter().map(map).collect();
            body.output = n.output.iter().map(map).collect();
            body.name = Some(format!("{prefix}{}", node_name(n)));
            result = attrs(n).and_then(|a| {
                body.attribute = a;
                self.import_node(&body)
            });
            if result.is_err() {
                break;
            }
        }
        self.inline_depth -= 1;
        result
    }

    /// Sequence ops; `None` when `op` is not one.
    pub(crate) fn sequence_op(&mut self, op: &str, n: &Node) -> Option<R<SeqResult>> {
        let r = match op {
            "SplitToSequence" => self.split_to_sequence(n).map(SeqResult::Seq),
            "SequenceConstruct" => Ok(SeqResult::Seq(n.inputs.iter().flatten().copied().collect())),
            "SequenceEmpty" => Ok(SeqResult::Seq(Vec::new())),
            "SequenceAt" => self.seq_position(n, false).map(|(s, i)| SeqResult::Value(s[i])),
            "SequenceErase" => self.seq_position(n, false).map(|(mut s, i)| {
                s.remove(i);
                SeqResult::Seq(s)
            }),
            "SequenceInsert" => self.seq_insert(n).map(SeqResult::Seq),
            "SequenceLength" => self.seq(n, 0).and_then(|s| {
                let ty = TensorType::new(ir::DType::I64, vec![]);
                self.emit(Op::SymConst(vec![SymExpr::constant(s.len() as i64)]), vec![], Some(ty))
                    .map(SeqResult::Value)
            }),
            "ConcatFromSequence" => self.concat_from_sequence(n).map(SeqResult::Value),
            _ => return None,
        };
        Some(r)
    }

    fn seq(&self, n: &Node, i: usize) -> R<Vec<ValueId>> {
        let name = n.proto.input.get(i).ok_or_else(|| format!("input {i} is required"))?;
        self.seqs.get(name).cloned().ok_or_else(|| format!("input '{name}' is not a sequence"))
    }

    /// The sequence and a resolved constant position. At and Erase take
    /// `[-n, n-1]` (default: the last element); Insert takes `[-n, n]` (default: the end).
    fn seq_position(&self, n: &Node, insert: bool) -> R<(Vec<ValueId>, usize)> {
        let s = self.seq(n, 0)?;
        let len = s.len() as i64;
        let pos = match n.opt_input(if insert { 2 } else { 1 }) {
            Some(p) => {
                *self.const_ints(p, "the sequence position")?.first().ok_or("the position is empty")?
            }
            None if insert => len,
            None => len - 1,
        };
        let p = if pos < 0 { pos + len } else { pos };
        let hi = if insert { len } else { len - 1 };
        if p < 0 || p > hi {
            return Err(format!("position {pos} is out of range for a sequence of {len}"));
        }
        Ok((s, p as usize))
    }

    fn seq_insert(&mut self, n: &Node) -> R<Vec<ValueId>> {
        let (mut s, p) = self.seq_position(n, true)?;
        s.insert(p, n.input(1)?);
        Ok(s)
    }

    fn split_to_sequence(&mut self, n: &Node) -> R<Vec<ValueId>> {
        let x = n.input(0)?;
        let shape = self.shape(x);
        let axis = norm_axis(n.int("axis", 0), shape.len())?;
        let d = shape[axis].clone();
        let keep = n.int("keepdims", 1) != 0;
        let sizes: Vec<SymExpr> = match n.opt_input(1) {
            None => {
                let k = d.as_const().ok_or("SplitToSequence without split needs a constant extent")?;
                vec![SymExpr::constant(1); k as usize]
            }
            Some(v) => {
                let vals = self.known_ints(v, "SplitToSequence's split")?;
                if self.rank(v) == 0 {
                    // Chunks of this size, the last one smaller.
                    let c = vals[0]
                        .as_const()
                        .filter(|c| *c > 0)
                        .ok_or("a scalar split must be a positive constant")?;
                    let k = d.as_const().ok_or("a scalar split needs a constant extent")?;
                    let mut v: Vec<SymExpr> = (0..k / c).map(|_| SymExpr::constant(c)).collect();
                    if k % c != 0 {
                        v.push(SymExpr::constant(k % c));
                    }
                    v
                } else {
                    vals
                }
            }
        };
        let squeeze = !keep && n.opt_input(1).is_none();
        let mut start = SymExpr::constant(0);
        let mut out = Vec::with_capacity(sizes.len());
        for size in &sizes {
            let mut s = shape.clone();
            s[axis] = size.clone();
            let ty = TensorType::new(self.ty(x).dtype, s.clone());
            let axes = vec![SliceAxis { axis, start: start.clone(), step: 1 }];
            let mut v = self.emit(Op::Slice { axes }, vec![x], Some(ty))?;
            if squeeze {
                s.remove(axis);
                v = self.reshape(v, s)?;
            }
            out.push(v);
            start = start.try_add(size).map_err(|e| e.to_string())?;
        }
        let total = start;
        if !self.env().equal(&total, &d) {
            self.env()
                .equate(&total, &d)
                .map_err(|e| format!("split sizes add up to {total}, not {d}: {e}"))?;
        }
        Ok(out)
    }

    fn concat_from_sequence(&mut self, n: &Node) -> R<ValueId> {
        let s = self.seq(n, 0)?;
        let first = *s.first().ok_or("ConcatFromSequence of an empty sequence")?;
        let new_axis = n.int("new_axis", 0) != 0;
        let rank = self.rank(first) + new_axis as usize;
        let axis = norm_axis(n.int("axis", 0), rank)?;
        let mut parts = Vec::with_capacity(s.len());
        for v in s {
            let mut shape = self.shape(v);
            if new_axis {
                shape.insert(axis, SymExpr::constant(1));
            }
            parts.push(self.reshape(v, shape)?);
        }
        self.emit(Op::Concat { axis }, parts, None)
    }
}

/// What a sequence op produced.
pub(crate) enum SeqResult {
    Seq(Vec<ValueId>),
    Value(ValueId),
}

/// Resolve `ref_attr_name` references of a body node against the call.
fn bind_attributes(attrs: &[AttributeProto], call: &NodeProto, f: &FunctionProto) -> R<Vec<AttributeProto>> {
    let mut out = Vec::with_capacity(attrs.len());
    for a in attrs {
        let Some(r) = a.ref_attr_name.as_deref().filter(|r| !r.is_empty()) else {
            out.push(a.clone());
            continue;
        };
        let found = call
            .attribute
            .iter()
            .find(|c| c.name.as_deref() == Some(r))
            .or_else(|| f.attribute_proto.iter().find(|d| d.name.as_deref() == Some(r)));
        match found {
            Some(v) => {
                let mut v = v.clone();
                v.name = a.name.clone();
                out.push(v);
            }
            // An unset optional attribute: the body node gets its own default.
            None if f.attribute.iter().any(|x| x == r) => {}
            None => return Err(format!("attribute reference '{r}' is not an attribute of the function")),
        }
    }
    Ok(out)
}

/// Every value name `g` (and the graphs nested in it) uses, passed through
/// `map` (which renames only an enclosing branch's own values: names are
/// unique across a model's graphs).
fn rename_graph(g: &mut crate::proto::GraphProto, map: &dyn Fn(&String) -> String) {
    for n in &mut g.node {
        n.input = n.input.iter().map(map).collect();
        n.output = n.output.iter().map(map).collect();
        for a in &mut n.attribute {
            if let Some(sub) = a.g.as_mut() {
                rename_graph(sub, map);
            }
        }
    }
    for o in &mut g.output {
        o.name = o.name.as_ref().map(map);
    }
    for t in &mut g.initializer {
        t.name = t.name.as_ref().map(map);
    }
}
