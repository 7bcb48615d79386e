//! ONNX graph → IR, with symbolic shape propagation (TSCompiler §4.1, Alg. 1;
//! BladeDISC §3.1.2).
//!
//! Nodes are taken from a worklist as soon as their inputs are defined, each
//! converted into primitives (compound ops are split here). Every primitive is
//! typed on emission: its output shape is inferred from its inputs, and the
//! constraints the op implies (matmul's K, broadcast operands, concat's other dims,
//! reshape products) go into the `ShapeEnv`.
//!
//! Small integer tensors carry their *symbolic values* (`known`): the result of
//! `Shape` is `[batch, seq, 768]`, and every primitive whose inputs all have known
//! values is evaluated at compile time instead of emitted. So a
//! `Shape → Gather → Unsqueeze → Concat → Reshape` chain becomes a reshape with a
//! symbolic target shape, and no shape arithmetic is left for run time; dead
//! nodes are removed at the end.

mod einsum;
mod fold;
mod functions;
mod indexing;
mod ops;
mod quantize;
mod resize;
mod shaping;
mod transformer;

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;

use ir::{ConstData, DType, Graph, Op, TensorType, ValueId};
use sym::{Range, ShapeEnv, SymExpr, SymOrigin};

use crate::load::{dtype_name, dtype_of, held_dtype_of, tensor_data, ExternalData, Narrow};
use crate::proto::{self, type_proto, AttributeProto, ModelProto, NodeProto};
use crate::OnnxError;

/// The opsets of the default domain that import accepts. Below 11, the few ops
/// whose inputs were attributes then (Slice, Pad, Clip) are rejected by name.
/// Opsets 23-28 (onnx 1.23) changed the ops imported here only by element types
/// imported as unsupported anyway, `round_mode` of Cast (float8 targets only),
/// `stash_type` of Range (half-precision accumulation) and SpaceToDepth's
/// `mode` (read); their new ops (Attention, RMSNormalization, ...) are
/// unsupported operators by name.
pub const OPSETS: std::ops::RangeInclusive<i64> = 7..=28;

/// Largest value a symbolic dim may take: larger dims are absurd for a tensor, and
/// the bound lets the prover simplify `min(seq, 2147483647)` to `seq`.
pub const DIM_MAX: i64 = i32::MAX as i64;

/// Options for import: user declarations of symbols, frozen inputs.
#[derive(Clone, Debug, Default)]
pub struct ImportOptions {
    /// `(name, range)`: the symbol `name` (an ONNX `dim_param`) takes values in `range`.
    pub dims: Vec<(String, Range)>,
    /// `(input name, value)`: the graph input becomes this constant, so that values
    /// computed from it (shapes, axes, pads) are known at compile time.
    pub frozen: Vec<(String, ConstData)>,
}

impl ImportOptions {
    pub fn new() -> ImportOptions {
        ImportOptions::default()
    }
    /// Declare `name` in `lo..=hi`.
    pub fn dim(mut self, name: &str, lo: i64, hi: i64) -> ImportOptions {
        self.dims.push((name.to_string(), Range::new(lo, hi)));
        self
    }
    /// Replace the graph input `name` by the constant `value`.
    pub fn freeze(mut self, name: &str, value: ConstData) -> ImportOptions {
        self.frozen.push((name.to_string(), value));
        self
    }
}

/// Turn an ONNX `dim_param` into a valid symbol name (`batch size` → `batch_size`).
pub fn symbol_name(param: &str) -> String {
    let mut s: String = param.chars().map(|c| if sym::is_ident_char(c) { c } else { '_' }).collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) || s == "min" || s == "max" {
        s.insert(0, '_');
    }
    s
}

type R<T> = Result<T, String>;

pub(crate) struct Importer {
    pub(crate) g: Graph,
    /// ONNX value name → IR value.
    vals: HashMap<String, ValueId>,
    /// Symbolic element values of small integer tensors, row-major.
    known: HashMap<ValueId, Vec<SymExpr>>,
    /// Data of constant values (initializers, `Constant` nodes).
    consts: HashMap<ValueId, Arc<ConstData>>,
    pub(crate) opset: i64,
    ext: ExternalData,
    /// Name hint for the values the current node emits.
    hint: String,
    /// Model-local functions by (domain, name), inlined at their calls.
    functions: HashMap<(String, String), crate::proto::FunctionProto>,
    /// Sequence values: lists of IR values known at compile time.
    seqs: HashMap<String, Vec<ValueId>>,
    inline_depth: usize,
    inline_calls: usize,
    /// What the graph's inputs say of their `dim_param`s ([`DimParams`]).
    dim_params: DimParams,
    /// Values of an ONNX integer type narrower than the one holding them.
    narrow: HashMap<ValueId, Narrow>,
}

/// The graph inputs' `dim_param`s, read before any is declared: the plain
/// names (symbols), and those of them a tensor may have 0 of.
#[derive(Default)]
struct DimParams {
    plain: HashSet<String>,
    may_be_zero: HashSet<String>,
}

impl DimParams {
    /// A name may be 0 when every input dim it names is the concatenation axis
    /// of every node that reads the input (through identities and
    /// one-operand concatenations), or read only for its shape: a KV cache's
    /// past length, whose empty cache the first generation step passes,
    /// concatenated with the new tokens' keys. Not when every other operand of
    /// such a concatenation is an input that might be empty along the axis
    /// too (operands the graph computes, and constants, are taken as
    /// non-empty), nor when a subgraph (If, Loop, Scan) might read the input
    /// unseen.
    fn scan(graph: &proto::GraphProto) -> DimParams {
        use proto::tensor_shape_proto::dimension::Value;
        let mut out = DimParams::default();
        let initializers: HashSet<&str> =
            graph.initializer.iter().filter_map(|t| t.name.as_deref()).collect();
        let subgraphs =
            graph.node.iter().any(|n| n.attribute.iter().any(|a| a.g.is_some() || !a.graphs.is_empty()));
        // Each graph input's dims (initializers listed as inputs aside).
        let inputs: HashMap<&str, &[proto::tensor_shape_proto::Dimension]> = graph
            .input
            .iter()
            .filter_map(|vi| {
                let name = vi.name.as_deref()?;
                let Some(type_proto::Value::TensorType(t)) =
                    vi.r#type.as_ref().and_then(|t| t.value.as_ref())
                else {
                    return None;
                };
                (!initializers.contains(name)).then_some((name, t.shape.as_ref()?.dim.as_slice()))
            })
            .collect();
        let mut not_zero: HashSet<String> = HashSet::new();
        for vi in &graph.input {
            let name = vi.name.as_deref().unwrap_or_default();
            let Some(dims) = inputs.get(name) else { continue };
            for (axis, d) in dims.iter().enumerate() {
                let Some(Value::DimParam(p)) = &d.value else { continue };
                if !sym::is_valid_symbol_name(p) {
                    continue;
                }
                out.plain.insert(p.clone());
                if !subgraphs
                    && reads_empty(graph, &inputs, name, axis as i64, dims.len() as i64, 0) == Some(true)
                {
                    out.may_be_zero.insert(p.clone());
                } else {
                    not_zero.insert(p.clone());
                }
            }
        }
        out.may_be_zero.retain(|p| !not_zero.contains(p));
        out
    }
}

/// Whether value `name` (rank `rank`) may be empty along `axis` as far as the
/// nodes that read it go ([`DimParams::scan`]): `None` when a reader needs it
/// non-empty there, else whether one of them concatenates it with a
/// non-empty value (an input read only for its shape keeps its dims' ranges).
fn reads_empty(
    graph: &proto::GraphProto,
    inputs: &HashMap<&str, &[proto::tensor_shape_proto::Dimension]>,
    name: &str,
    axis: i64,
    rank: i64,
    depth: usize,
) -> Option<bool> {
    use proto::tensor_shape_proto::dimension::Value;
    let readers: Vec<&NodeProto> = graph.node.iter().filter(|n| n.input.iter().any(|i| i == name)).collect();
    if readers.is_empty() || depth > 8 {
        return None;
    }
    let out = |n: &NodeProto| n.output.first().map(String::as_str).unwrap_or_default().to_string();
    let mut joined = false;
    for n in readers {
        let here = match n.op_type.as_deref() {
            Some("Shape") => false,
            Some("Identity") => reads_empty(graph, inputs, &out(n), axis, rank, depth + 1)?,
            Some("Concat") => {
                let a = n.attribute.iter().find(|a| a.name.as_deref() == Some("axis")).and_then(|a| a.i);
                if a.map(|a| if a < 0 { a + rank } else { a }) != Some(axis) {
                    return None;
                }
                let others: Vec<&String> = n.input.iter().filter(|i| *i != name).collect();
                if others.is_empty() {
                    reads_empty(graph, inputs, &out(n), axis, rank, depth + 1)?
                } else {
                    // Another operand taken as non-empty there: a value the graph
                    // computes (the new tokens' keys) or a constant, or an input with
                    // a fixed positive dim.
                    let nonempty = others.iter().any(|o| match inputs.get(o.as_str()) {
                        None => true,
                        Some(dims) => matches!(
                            dims.get(axis as usize).and_then(|d| d.value.as_ref()),
                            Some(Value::DimValue(v)) if *v > 0
                        ),
                    });
                    if !nonempty {
                        return None;
                    }
                    true
                }
            }
            _ => return None,
        };
        joined |= here;
    }
    Some(joined)
}

/// Integer tensors up to this many elements carry symbolic values.
const KNOWN_MAX: usize = 64;

/// Import a decoded model (external data is resolved in `model_dir`).
pub fn import_model(
    model: &ModelProto,
    model_dir: Option<PathBuf>,
    opts: &ImportOptions,
) -> Result<Graph, OnnxError> {
    import_model_with(model, ExternalData::new(model_dir), opts)
}

/// Import a decoded model whose tensor data `ext` resolves.
pub fn import_model_with(
    model: &ModelProto,
    ext: ExternalData,
    opts: &ImportOptions,
) -> Result<Graph, OnnxError> {
    let graph = model.graph.as_ref().ok_or_else(|| OnnxError::Malformed("the model has no graph".into()))?;
    let mut opset = None;
    for o in &model.opset_import {
        let domain = o.domain.clone().unwrap_or_default();
        if domain.is_empty() || domain == "ai.onnx" {
            opset = o.version;
        }
    }
    let Some(opset) = opset else {
        // A model of another domain only (ai.onnx.ml, training): name its first op.
        if let Some(n) =
            graph.node.iter().find(|n| !matches!(n.domain.as_deref(), None | Some("") | Some("ai.onnx")))
        {
            let (op, domain) = (n.op_type.clone().unwrap_or_default(), n.domain.clone().unwrap_or_default());
            return Err(OnnxError::UnsupportedOp { op, domain, node: node_name(n), opset: 0 });
        }
        return Err(OnnxError::Malformed("the model imports no opset of the default ONNX domain".into()));
    };
    if !OPSETS.contains(&opset) {
        return Err(OnnxError::UnsupportedOpset { version: opset });
    }
    let mut env = ShapeEnv::new();
    for (name, range) in &opts.dims {
        env.declare(name, *range, SymOrigin::User)
            .map_err(|e| OnnxError::BadDim { name: name.clone(), msg: e.to_string() })?;
    }
    let mut imp = Importer {
        g: Graph::new(env),
        vals: HashMap::new(),
        known: HashMap::new(),
        consts: HashMap::new(),
        opset,
        ext,
        hint: String::new(),
        functions: model
            .functions
            .iter()
            .map(|f| ((f.domain.clone().unwrap_or_default(), f.name.clone().unwrap_or_default()), f.clone()))
            .collect(),
        seqs: HashMap::new(),
        inline_depth: 0,
        inline_calls: 0,
        dim_params: DimParams::scan(graph),
        narrow: HashMap::new(),
    };
    imp.import_graph(graph, &opts.frozen)?;
    ir::verify(&imp.g)
        .map_err(|e| OnnxError::Internal(format!("the imported graph does not verify: {e}")))?;
    // A user declaration must name a symbol of the model.
    let used: HashSet<String> = imp
        .g
        .inputs
        .iter()
        .flat_map(|v| imp.g.ty(*v).shape.iter().flat_map(|d| d.symbols()))
        .map(|s| s.to_string())
        .collect();
    for (name, _) in &opts.dims {
        let eliminated = imp.g.env.substitutions().any(|(k, _)| k == name);
        if !used.contains(name) && !eliminated {
            let mut names: Vec<String> = used.into_iter().collect();
            names.sort();
            return Err(OnnxError::BadDim {
                name: name.clone(),
                msg: format!(
                    "the model's inputs have no dim named `{name}` (they have: {})",
                    if names.is_empty() { "none".to_string() } else { names.join(", ") }
                ),
            });
        }
    }
    Ok(imp.g)
}

impl Importer {
    fn import_graph(
        &mut self,
        graph: &proto::GraphProto,
        frozen: &[(String, ConstData)],
    ) -> Result<(), OnnxError> {
        for t in &graph.initializer {
            let name = t.name.clone().unwrap_or_default();
            let data = tensor_data(t, &mut self.ext)?;
            self.hint = name.clone();
            let v = self.constant(data);
            self.mark_narrow(v, t.data_type.unwrap_or(0));
            self.g.rename(v, &name);
            self.vals.insert(name, v);
        }
        for vi in &graph.input {
            let name = vi.name.clone().unwrap_or_default();
            if self.vals.contains_key(&name) {
                continue; // an initializer listed as input (older exporters)
            }
            let ty = self.input_type(vi)?;
            let v = match frozen.iter().find(|(n, _)| *n == name) {
                Some((_, data)) => {
                    let fits = data.dtype == ty.dtype
                        && data.shape.len() == ty.rank()
                        && data
                            .shape
                            .iter()
                            .zip(&ty.shape)
                            .all(|(d, e)| self.g.env.equate(e, &SymExpr::constant(*d as i64)).is_ok());
                    if !fits {
                        return Err(OnnxError::Node {
                            node: name.clone(),
                            op: "input".into(),
                            msg: format!(
                                "the frozen value {}{:?} does not fit the input's type {ty}",
                                data.dtype, data.shape
                            ),
                        });
                    }
                    self.hint = name.clone();
                    let v = self.constant(data.clone());
                    self.g.rename(v, &name);
                    v
                }
                None => self.g.add_input(&name, ty),
            };
            if let Some(type_proto::Value::TensorType(t)) = vi.r#type.as_ref().and_then(|t| t.value.as_ref())
            {
                self.mark_narrow(v, t.elem_type.unwrap_or(0));
            }
            self.vals.insert(name, v);
        }
        // Worklist: a node is converted once all its inputs are defined.
        let mut pending: VecDeque<&NodeProto> = graph.node.iter().collect();
        let mut stalled = 0;
        while let Some(node) = pending.pop_front() {
            let ready = node.input.iter().all(|i| self.is_defined(i));
            if !ready {
                pending.push_back(node);
                stalled += 1;
                if stalled > pending.len() {
                    let missing = node
                        .input
                        .iter()
                        .find(|i| !i.is_empty() && !self.vals.contains_key(*i))
                        .cloned()
                        .unwrap_or_default();
                    return Err(OnnxError::Malformed(format!(
                        "node '{}' ({}) reads '{missing}', which no node or input defines (or the graph has a cycle)",
                        node_name(node),
                        node.op_type.clone().unwrap_or_default()
                    )));
                }
                continue;
            }
            stalled = 0;
            self.import_node(node)?;
        }
        for vi in &graph.output {
            let name = vi.name.clone().unwrap_or_default();
            if self.seqs.contains_key(&name) {
                return Err(OnnxError::UnsupportedType {
                    what: format!("graph output '{name}'"),
                    kind: "a sequence".into(),
                });
            }
            let v = *self
                .vals
                .get(&name)
                .ok_or_else(|| OnnxError::Malformed(format!("graph output '{name}' is never computed")))?;
            // An output that is an input or already an output gets its own node.
            let v = if self.g.inputs.contains(&v) || self.g.outputs.contains(&v) {
                let ty = self.g.ty(v).clone();
                self.g.add_node(Op::Reshape, vec![v], &name, ty)
            } else {
                if self.g.name(v) != name {
                    self.g.rename(v, &name);
                }
                v
            };
            self.g.outputs.push(v);
        }
        self.g.remove_dead_nodes();
        self.g.simplify_shapes();
        Ok(())
    }

    /// Declare the symbol of a `dim_param` (kept as it is when the user or an
    /// earlier input declared it): in `0..` where a tensor may have none of it
    /// ([`DimParams::scan`]), `1..` otherwise.
    fn declare_dim_param(&mut self, s: &str) -> Result<(), OnnxError> {
        let lo = if self.dim_params.may_be_zero.contains(s) { 0 } else { 1 };
        let range = self.g.env.symbol(s).map(|i| i.range).unwrap_or(Range::new(lo, DIM_MAX));
        self.g
            .env
            .declare(s, range, SymOrigin::Param)
            .map(|_| ())
            .map_err(|e| OnnxError::BadDim { name: s.to_string(), msg: e.to_string() })
    }

    /// A `dim_param` that is an expression of other inputs' plain ones (an
    /// attention mask's `past_sequence_length + sequence_length`): that
    /// expression, so that the run checks the relation and nobody is asked for
    /// a symbol the model does not have.
    fn dim_expression(&mut self, p: &str) -> Result<Option<SymExpr>, OnnxError> {
        if sym::is_valid_symbol_name(p) {
            return Ok(None);
        }
        let Ok(e) = sym::parse_expr(p) else { return Ok(None) };
        let names = e.symbols();
        if names.is_empty() || !names.iter().all(|n| self.dim_params.plain.contains(&**n)) {
            return Ok(None);
        }
        for n in &names {
            self.declare_dim_param(n)?;
        }
        Ok(Some(self.g.env.normalize(&e)))
    }

    fn input_type(&mut self, vi: &proto::ValueInfoProto) -> Result<TensorType, OnnxError> {
        let name = vi.name.clone().unwrap_or_default();
        let t = match vi.r#type.as_ref().and_then(|t| t.value.as_ref()) {
            Some(type_proto::Value::TensorType(t)) => t,
            other => {
                let kind = match other {
                    Some(type_proto::Value::SequenceType(_)) => "a sequence",
                    Some(type_proto::Value::MapType(_)) => "a map",
                    Some(type_proto::Value::OptionalType(_)) => "an optional",
                    Some(type_proto::Value::SparseTensorType(_)) => "a sparse tensor",
                    _ => "untyped",
                };
                return Err(OnnxError::UnsupportedType {
                    what: format!("input '{name}'"),
                    kind: kind.into(),
                });
            }
        };
        let code = t.elem_type.unwrap_or(0);
        let dtype = held_dtype_of(code).ok_or_else(|| OnnxError::UnsupportedDType {
            what: format!("input '{name}'"),
            dtype: dtype_name(code),
        })?;
        let shape = t.shape.as_ref().ok_or_else(|| {
            OnnxError::Malformed(format!("input '{name}' has no shape (its rank must be known)"))
        })?;
        let mut dims = Vec::new();
        for d in &shape.dim {
            use proto::tensor_shape_proto::dimension::Value;
            let e = match &d.value {
                Some(Value::DimValue(v)) if *v >= 0 => SymExpr::constant(*v),
                Some(Value::DimParam(p)) if !p.is_empty() => match self.dim_expression(p)? {
                    Some(e) => e,
                    None => {
                        let s = symbol_name(p);
                        self.declare_dim_param(&s)?;
                        self.g.env.normalize(&SymExpr::symbol(&s))
                    }
                },
                _ => {
                    let e = self.g.env.fresh("unk");
                    if let Some(s) = e.as_symbol() {
                        let s = s.to_string();
                        let _ = self.g.env.declare(&s, Range::new(0, DIM_MAX), SymOrigin::Fresh);
                    }
                    e
                }
            };
            dims.push(e);
        }
        Ok(TensorType::new(dtype, dims))
    }

    fn import_node(&mut self, node: &NodeProto) -> Result<(), OnnxError> {
        let op_type = node.op_type.clone().unwrap_or_default();
        let name = node_name(node);
        let domain = node.domain.clone().unwrap_or_default();
        if let Some(f) = self.functions.get(&(domain.clone(), op_type.clone())).cloned() {
            return self.inline_call(node, &f);
        }
        // ONNX Runtime's contrib operators that anyshape imports.
        let contrib = op_type == "MatMulNBits";
        let standard = domain.is_empty() || domain == "ai.onnx";
        if contrib != (domain == "com.microsoft") || !(standard || contrib) {
            return Err(OnnxError::UnsupportedOp { op: op_type, domain, node: name, opset: self.opset });
        }
        if op_type == "If" {
            return self.inline_if(node);
        }
        // Attributes naming an element type: one anyshape lacks is that type's error.
        let typed: &[&str] = match op_type.as_str() {
            "Cast" => &["to"],
            "QuantizeLinear" => &["output_dtype", "precision"],
            "DequantizeLinear" => &["output_dtype"],
            _ => &[],
        };
        for attr in typed {
            let code = node.attribute.iter().find(|a| a.name.as_deref() == Some(*attr)).and_then(|a| a.i);
            let code = match (code, *attr) {
                (Some(c), _) => c as i32,
                (None, "to") => 0,
                (None, _) => continue,
            };
            // 0 (unset) is the default for all but Cast's `to`; a quantization
            // may be to a narrow integer type.
            let quantized = op_type == "QuantizeLinear" && *attr == "output_dtype";
            if (code != 0 || *attr == "to")
                && dtype_of(code).is_none()
                && !(quantized && Narrow::of(code).is_some())
            {
                return Err(OnnxError::UnsupportedDType {
                    what: format!("node '{name}' ({op_type}, attribute {attr})"),
                    dtype: dtype_name(code),
                });
            }
        }
        self.hint = node.output.first().cloned().unwrap_or_else(|| name.clone());
        let inputs: Vec<Option<ValueId>> =
            node.input.iter().map(|i| if i.is_empty() { None } else { self.vals.get(i).copied() }).collect();
        let node_ctx = Node { proto: node, inputs };
        if let Some(r) = self.sequence_op(&op_type, &node_ctx) {
            let out = node.output.first().cloned().unwrap_or_default();
            match r {
                Ok(functions::SeqResult::Seq(s)) => {
                    self.seqs.insert(out, s);
                }
                Ok(functions::SeqResult::Value(v)) => {
                    self.vals.insert(out, v);
                }
                Err(msg) => return Err(OnnxError::Node { node: name, op: op_type, msg }),
            }
            return Ok(());
        }
        let narrow_in = self.narrow_inputs(&op_type, &node_ctx)?;
        let outs = match ops::convert(self, &op_type, &node_ctx) {
            Ok(Some(outs)) => outs,
            Ok(None) => {
                return Err(OnnxError::UnsupportedOp {
                    op: op_type,
                    domain: "ai.onnx".into(),
                    node: name,
                    opset: self.opset,
                })
            }
            Err(msg) => return Err(OnnxError::Node { node: name, op: op_type, msg }),
        };
        let narrow_out = match op_type.as_str() {
            "QuantizeLinear" => quantize::narrow_output(self, &node_ctx),
            "Constant" | "ConstantOfShape" => {
                node_ctx.tensor("value").and_then(|t| Narrow::of(t.data_type.unwrap_or(0)))
            }
            "Shape" | "Size" => None,
            _ => narrow_in,
        };
        for (i, out_name) in node.output.iter().enumerate() {
            if out_name.is_empty() {
                continue;
            }
            match outs.get(i) {
                Some(v) => {
                    if let Some(k) = narrow_out {
                        self.narrow.insert(*v, k);
                    }
                    self.vals.insert(out_name.clone(), *v);
                }
                None => {
                    return Err(OnnxError::Node {
                        node: name,
                        op: op_type,
                        msg: format!("output {i} ('{out_name}') is not supported (inference mode only computes the first {})", outs.len()),
                    })
                }
            }
        }
        Ok(())
    }

    /// Record that `v` holds values of ONNX element type `code`, if it is a
    /// narrow integer type ([`Narrow`]).
    pub(crate) fn mark_narrow(&mut self, v: ValueId, code: i32) {
        if let Some(k) = Narrow::of(code) {
            self.narrow.insert(v, k);
        }
    }

    /// The narrow integer type `v` holds, if any.
    pub(crate) fn narrow_of(&self, v: ValueId) -> Option<Narrow> {
        self.narrow.get(&v).copied()
    }

    /// The narrow integer type the outputs of a node of `op` hold, from its
    /// inputs' (data movement and range-keeping operations: the maximum, a
    /// remainder, a select); `None` for a node whose outputs are no narrow
    /// type (a quantization's are found from its zero point, a cast's and a
    /// comparison's are wider types). Operations whose results could leave
    /// a narrow type's range, and so would not wrap as it does, are refused
    /// as that type being unsupported.
    fn narrow_inputs(&self, op: &str, n: &Node) -> Result<Option<Narrow>, OnnxError> {
        let mut narrow = None;
        for (i, v) in n.inputs.iter().enumerate() {
            let Some(k) = v.and_then(|v| self.narrow_of(v)) else { continue };
            let keeps = matches!(
                op,
                "Identity"
                    | "Reshape"
                    | "Flatten"
                    | "Squeeze"
                    | "Unsqueeze"
                    | "Transpose"
                    | "Concat"
                    | "Split"
                    | "Slice"
                    | "Gather"
                    | "GatherElements"
                    | "GatherND"
                    | "Expand"
                    | "Tile"
                    | "Max"
                    | "Min"
                    | "Mod"
                    | "Where"
            );
            let widens = matches!(
                op,
                "QuantizeLinear"
                    | "DequantizeLinear"
                    | "Shape"
                    | "Size"
                    | "Cast"
                    | "Equal"
                    | "Less"
                    | "Greater"
                    | "LessOrEqual"
                    | "GreaterOrEqual"
            ) || (op == "CastLike" && i == 0);
            if !(keeps || widens) {
                return Err(OnnxError::UnsupportedDType {
                    what: format!(
                        "node '{}' ({op}) input '{}' (held as {}: only data movement, quantization, casts, \
                         comparisons, Max, Min, Mod and Where take it)",
                        node_name(n.proto),
                        self.g.name(v.expect("a narrow input")),
                        k.held()
                    ),
                    dtype: k.name().into(),
                });
            }
            if keeps {
                narrow = Some(k);
            }
        }
        Ok(narrow)
    }

    fn is_defined(&self, name: &str) -> bool {
        name.is_empty() || self.vals.contains_key(name) || self.seqs.contains_key(name)
    }

    // ------------------------------------------------------------ emission

    pub(crate) fn ty(&self, v: ValueId) -> &TensorType {
        self.g.ty(v)
    }
    pub(crate) fn shape(&self, v: ValueId) -> Vec<SymExpr> {
        self.g.ty(v).shape.clone()
    }
    pub(crate) fn rank(&self, v: ValueId) -> usize {
        self.g.ty(v).rank()
    }
    pub(crate) fn env(&mut self) -> &mut ShapeEnv {
        &mut self.g.env
    }

    /// Emit a primitive. `ty` is required for ops whose output the inputs do not
    /// determine; otherwise it is inferred. Folded when all inputs are known.
    pub(crate) fn emit(&mut self, op: Op, inputs: Vec<ValueId>, ty: Option<TensorType>) -> R<ValueId> {
        let ins: Vec<&TensorType> = inputs.iter().map(|v| self.g.ty(*v)).collect();
        let inferred = ir::infer(&op, &ins, &self.g.env).map_err(|e| e.to_string())?;
        let ty = match (inferred, ty) {
            (Some(t), _) => t,
            (None, Some(t)) => t,
            (None, None) => return Err(format!("internal: no output type for {}", op.name())),
        };
        let ty = TensorType::new(ty.dtype, ty.shape.iter().map(|d| self.g.env.simplify(d)).collect());
        if let Some(vals) = fold::fold(self, &op, &inputs, &ty)? {
            return self.materialize(vals, ty);
        }
        let hint = self.hint.clone();
        let v = self.g.add_node(op.clone(), inputs, &hint, ty);
        if let Op::Constant(c) = &op {
            self.consts.insert(v, c.clone());
        }
        Ok(v)
    }

    /// A value holding `vals` (symbolic elements) of type `ty`.
    fn materialize(&mut self, vals: Vec<SymExpr>, ty: TensorType) -> R<ValueId> {
        let consts: Option<Vec<i64>> = vals.iter().map(|v| v.as_const()).collect();
        let hint = self.hint.clone();
        let v = if let Some(c) = consts {
            let data = int_const(ty.dtype, &ty.const_shape().unwrap_or_default(), &c)?;
            let data = Arc::new(data);
            let v = self.g.add_node(Op::Constant(data.clone()), vec![], &hint, ty);
            self.consts.insert(v, data);
            v
        } else {
            let flat = TensorType::new(
                DType::I64,
                if ty.rank() == 0 { vec![] } else { vec![SymExpr::constant(vals.len() as i64)] },
            );
            let mut v = self.g.add_node(Op::SymConst(vals.clone()), vec![], &hint, flat.clone());
            if ty.rank() > 1 {
                v = self.g.add_node(
                    Op::Reshape,
                    vec![v],
                    &hint,
                    TensorType::new(DType::I64, ty.shape.clone()),
                );
            }
            if ty.dtype != DType::I64 {
                v = self.g.add_node(Op::Cast, vec![v], &hint, ty.clone());
            }
            v
        };
        self.known.insert(v, vals);
        Ok(v)
    }

    /// A constant value.
    pub(crate) fn constant(&mut self, data: ConstData) -> ValueId {
        let data = Arc::new(data);
        let ty = data.ty();
        let hint = self.hint.clone();
        let v = self.g.add_node(Op::Constant(data.clone()), vec![], &hint, ty);
        if let Some(vals) = fold::const_values(&data) {
            self.known.insert(v, vals);
        }
        self.consts.insert(v, data);
        v
    }

    /// A rank-0 constant of `dtype` holding `x`.
    pub(crate) fn scalar(&mut self, dtype: DType, x: f64) -> R<ValueId> {
        Ok(self.constant(scalar_data(dtype, x)?))
    }

    /// `x` broadcast to the shape of `like` (same dtype as `like`).
    pub(crate) fn fill_like(&mut self, like: ValueId, x: f64) -> R<ValueId> {
        let s = self.scalar(self.ty(like).dtype, x)?;
        let shape = self.shape(like);
        self.expand_to(s, &shape)
    }

    pub(crate) fn known(&self, v: ValueId) -> Option<&Vec<SymExpr>> {
        self.known.get(&v)
    }

    /// The symbolic values of a shape-like input, or an error saying why not.
    pub(crate) fn known_ints(&self, v: ValueId, what: &str) -> R<Vec<SymExpr>> {
        self.known.get(&v).cloned().ok_or_else(|| {
            format!("{what} ('{}') depends on tensor data, not only on input shapes; anyshape needs it to be computable from shapes at compile time", self.g.name(v))
        })
    }

    /// Constant integer values of an input (`None` when not constant).
    pub(crate) fn const_ints(&self, v: ValueId, what: &str) -> R<Vec<i64>> {
        let k = self.known_ints(v, what)?;
        k.iter().map(|e| e.as_const().ok_or_else(|| format!("{what} must be a constant, got {e}"))).collect()
    }

    /// An input's constant data, when it is a constant.
    pub(crate) fn const_data(&self, v: ValueId) -> Option<Arc<ConstData>> {
        self.consts.get(&v).cloned()
    }

    /// Constant data of an input as f64 (`None` when not a constant).
    pub(crate) fn const_f64(&self, v: ValueId) -> Option<Vec<f64>> {
        if let Some(c) = self.consts.get(&v) {
            return Some(c.to_tensor().to_f64_vec());
        }
        self.known.get(&v).and_then(|k| k.iter().map(|e| e.as_const().map(|c| c as f64)).collect())
    }

    /// Reshape `v` to `shape` (no node when the shape is already equal).
    pub(crate) fn reshape(&mut self, v: ValueId, shape: Vec<SymExpr>) -> R<ValueId> {
        if self.same_shape(&self.shape(v), &shape) {
            return Ok(v);
        }
        let have = self.ty(v).numel().map_err(|e| e.to_string())?;
        let want = TensorType::new(self.ty(v).dtype, shape.clone()).numel().map_err(|e| e.to_string())?;
        if !self.g.env.equal(&have, &want) {
            self.g.env.equate(&have, &want).map_err(|e| {
                format!(
                    "cannot reshape {} to {:?}: {e}",
                    self.ty(v),
                    shape.iter().map(|d| d.to_string()).collect::<Vec<_>>()
                )
            })?;
        }
        let ty = TensorType::new(self.ty(v).dtype, shape);
        self.emit(Op::Reshape, vec![v], Some(ty))
    }

    pub(crate) fn same_shape(&self, a: &[SymExpr], b: &[SymExpr]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| self.g.env.equal(x, y))
    }

    /// Numpy broadcasting of several shapes; records that non-1 dims are equal.
    pub(crate) fn broadcast_shapes(&mut self, shapes: &[Vec<SymExpr>]) -> R<Vec<SymExpr>> {
        let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
        let mut out = Vec::with_capacity(rank);
        for i in 0..rank {
            let dims: Vec<&SymExpr> =
                shapes.iter().filter_map(|s| (i + s.len()).checked_sub(rank).map(|j| &s[j])).collect();
            let non_one: Vec<&SymExpr> = dims.iter().copied().filter(|d| d.as_const() != Some(1)).collect();
            let Some(first) = non_one.first() else {
                out.push(SymExpr::constant(1));
                continue;
            };
            let first = (*first).clone();
            for d in &non_one[1..] {
                if !self.g.env.equal(&first, d) {
                    self.g.env.equate(&first, d).map_err(|e| {
                        format!("operands cannot be broadcast together ({first} vs {d}): {e}")
                    })?;
                }
            }
            out.push(self.g.env.simplify(&first));
        }
        Ok(out)
    }

    /// Broadcast `v` to `shape` (numpy rules: leading dims added, 1s stretched).
    pub(crate) fn expand_to(&mut self, v: ValueId, shape: &[SymExpr]) -> R<ValueId> {
        let s = self.shape(v);
        if s.len() > shape.len() {
            return Err(format!("cannot broadcast rank {} to rank {}", s.len(), shape.len()));
        }
        let mut padded = vec![SymExpr::constant(1); shape.len() - s.len()];
        padded.extend(s);
        let v = self.reshape(v, padded.clone())?;
        if self.same_shape(&padded, shape) {
            return Ok(v);
        }
        let ty = TensorType::new(self.ty(v).dtype, shape.to_vec());
        self.emit(Op::Broadcast, vec![v], Some(ty))
    }

    /// Element-wise binary op with numpy broadcasting.
    pub(crate) fn binary(&mut self, op: ir::BinaryOp, a: ValueId, b: ValueId) -> R<ValueId> {
        let shape = self.broadcast_shapes(&[self.shape(a), self.shape(b)])?;
        let a = self.expand_to(a, &shape)?;
        let b = self.expand_to(b, &shape)?;
        self.emit(Op::Binary(op), vec![a, b], None)
    }

    /// `cond ? a : b` element-wise, with numpy broadcasting (ONNX `Where`).
    pub(crate) fn select(&mut self, cond: ValueId, a: ValueId, b: ValueId) -> R<ValueId> {
        let shape = self.broadcast_shapes(&[self.shape(cond), self.shape(a), self.shape(b)])?;
        let cond = self.expand_to(cond, &shape)?;
        let a = self.expand_to(a, &shape)?;
        let b = self.expand_to(b, &shape)?;
        self.emit(Op::Select, vec![cond, a, b], None)
    }

    /// `op(x, scalar)` with the scalar in `x`'s dtype.
    pub(crate) fn binary_scalar(&mut self, op: ir::BinaryOp, x: ValueId, c: f64) -> R<ValueId> {
        let s = self.scalar(self.ty(x).dtype, c)?;
        self.binary(op, x, s)
    }

    pub(crate) fn unary(&mut self, op: ir::UnaryOp, x: ValueId) -> R<ValueId> {
        self.emit(Op::Unary(op), vec![x], None)
    }

    pub(crate) fn cast(&mut self, x: ValueId, to: DType) -> R<ValueId> {
        if self.ty(x).dtype == to {
            return Ok(x);
        }
        let ty = TensorType::new(to, self.shape(x));
        self.emit(Op::Cast, vec![x], Some(ty))
    }

    pub(crate) fn transpose(&mut self, x: ValueId, perm: Vec<usize>) -> R<ValueId> {
        if perm.iter().enumerate().all(|(i, p)| i == *p) {
            return Ok(x);
        }
        self.emit(Op::Transpose { perm }, vec![x], None)
    }

    pub(crate) fn reduce(
        &mut self,
        op: ir::ReduceOp,
        x: ValueId,
        mut axes: Vec<usize>,
        keep_dims: bool,
    ) -> R<ValueId> {
        axes.sort_unstable();
        axes.dedup();
        self.emit(Op::Reduce { op, axes, keep_dims }, vec![x], None)
    }
}

/// Resolve a possibly negative axis against `rank`.
pub(crate) fn norm_axis(axis: i64, rank: usize) -> R<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r {
        return Err(format!("axis {axis} is out of range for rank {rank}"));
    }
    Ok(a as usize)
}

/// Constant integer tensor data in `dtype`.
pub(crate) fn int_const(dtype: DType, shape: &[i64], vals: &[i64]) -> R<ConstData> {
    let t = match dtype {
        DType::I64 => ir::Elems::I64(vals.to_vec()),
        DType::I32 => ir::Elems::I32(vals.iter().map(|v| *v as i32).collect()),
        DType::I8 => ir::Elems::I8(vals.iter().map(|v| *v as i8).collect()),
        DType::U8 => ir::Elems::U8(vals.iter().map(|v| *v as u8).collect()),
        DType::Bool => ir::Elems::Bool(vals.iter().map(|v| *v != 0).collect()),
        DType::F32 => ir::Elems::F32(vals.iter().map(|v| *v as f32).collect()),
        DType::F64 => ir::Elems::F64(vals.iter().map(|v| *v as f64).collect()),
        DType::F16 => ir::Elems::F16(vals.iter().map(|v| ir::f64_to_f16(*v as f64)).collect()),
        DType::BF16 => ir::Elems::BF16(vals.iter().map(|v| ir::f32_to_bf16(*v as f32)).collect()),
    };
    let shape: Vec<usize> = shape.iter().map(|d| *d as usize).collect();
    Ok(ConstData::from_tensor(&ir::Tensor::new(shape, t).map_err(|e| e.to_string())?))
}

/// A rank-0 constant.
pub(crate) fn scalar_data(dtype: DType, x: f64) -> R<ConstData> {
    let e = match dtype {
        DType::F32 => ir::Elems::F32(vec![x as f32]),
        DType::F64 => ir::Elems::F64(vec![x]),
        DType::I64 => ir::Elems::I64(vec![x as i64]),
        DType::I32 => ir::Elems::I32(vec![x as i32]),
        DType::I8 => ir::Elems::I8(vec![x as i8]),
        DType::U8 => ir::Elems::U8(vec![x as u8]),
        DType::Bool => ir::Elems::Bool(vec![x != 0.0]),
        DType::F16 => ir::Elems::F16(vec![ir::f64_to_f16(x)]),
        DType::BF16 => ir::Elems::BF16(vec![ir::f32_to_bf16(x as f32)]),
    };
    Ok(ConstData::from_tensor(&ir::Tensor::new(vec![], e).map_err(|e| e.to_string())?))
}

pub(crate) fn node_name(n: &NodeProto) -> String {
    match &n.name {
        Some(s) if !s.is_empty() => s.clone(),
        _ => format!(
            "{}({})",
            n.op_type.clone().unwrap_or_default(),
            n.output.first().cloned().unwrap_or_default()
        ),
    }
}

/// A node being converted: its proto and resolved inputs.
pub(crate) struct Node<'a> {
    pub proto: &'a NodeProto,
    pub inputs: Vec<Option<ValueId>>,
}

impl Node<'_> {
    pub fn input(&self, i: usize) -> R<ValueId> {
        self.inputs.get(i).copied().flatten().ok_or_else(|| format!("input {i} is required"))
    }
    pub fn opt_input(&self, i: usize) -> Option<ValueId> {
        self.inputs.get(i).copied().flatten()
    }
    fn attr(&self, name: &str) -> Option<&AttributeProto> {
        self.proto.attribute.iter().find(|a| a.name.as_deref() == Some(name))
    }
    pub fn int(&self, name: &str, default: i64) -> i64 {
        self.attr(name).and_then(|a| a.i).unwrap_or(default)
    }
    pub fn float(&self, name: &str, default: f32) -> f32 {
        self.attr(name).and_then(|a| a.f).unwrap_or(default)
    }
    pub fn ints(&self, name: &str) -> Option<Vec<i64>> {
        self.attr(name).map(|a| a.ints.clone())
    }
    pub fn floats(&self, name: &str) -> Option<Vec<f32>> {
        self.attr(name).map(|a| a.floats.clone())
    }
    pub fn string(&self, name: &str) -> Option<String> {
        self.attr(name).and_then(|a| a.s.as_ref()).map(|s| String::from_utf8_lossy(s).into_owned())
    }
    pub fn tensor(&self, name: &str) -> Option<&proto::TensorProto> {
        self.attr(name).and_then(|a| a.t.as_ref())
    }
    pub fn n_outputs(&self) -> usize {
        self.proto.output.len()
    }
}

/// Decode a tensor attribute (inline data only).
pub(crate) fn attr_tensor(imp: &mut Importer, t: &proto::TensorProto) -> R<ConstData> {
    tensor_data(t, &mut imp.ext).map_err(|e| e.to_string())
}
