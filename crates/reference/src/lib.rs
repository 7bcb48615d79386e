//! The reference interpreter: a plain, obviously correct executor of the graph IR.
//!
//! It is the oracle every pass and kernel is tested against (DESIGN.md "How we know
//! it works"), so it favours clarity over speed: every op is written from its
//! definition, with index arithmetic in `usize`/`i64`, float math in f64 (rounded
//! once to the output dtype) and integer math in wrapping i64 (narrowed with
//! two's-complement wrap-around). Nothing here panics on bad data: out-of-range
//! indices, integer division by zero, unsupported dtypes and absurd sizes are
//! [`RefError`]s.
//!
//! After each node the computed shape and dtype are compared with the node's
//! symbolic type evaluated under the bindings, which catches shape-inference bugs
//! in the importer and in passes where they happen.

use ir::{DType, Graph, InputError, Node, Tensor, TensorType};
use sym::{Bindings, ShapeEnv, SymError, SymExpr};

/// A failure inside one op, before the node it happened in is known.
#[derive(Debug)]
enum Fail {
    Msg(String),
    Unsupported(DType),
    TooLarge(Vec<usize>),
}

type R<T> = Result<T, Fail>;

macro_rules! bail {
    ($($arg:tt)*) => { return Err(crate::Fail::Msg(format!($($arg)*))) };
}

mod compute;
mod data;
mod ops;

pub use ir::f64_to_f16;

/// The largest tensor the interpreter will build (2^34 elements): larger shapes
/// are an error rather than an allocation attempt.
pub const MAX_ELEMS: usize = 1 << 34;

/// Errors from binding inputs and executing a graph.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RefError {
    #[error("missing input '{name}' (the graph's inputs are: {expected})")]
    MissingInput { name: String, expected: String },
    #[error("unknown input '{name}' (the graph's inputs are: {expected})")]
    UnknownInput { name: String, expected: String },
    #[error("input '{0}' is given more than once")]
    DuplicateInput(String),
    #[error("input '{name}' must be {expected} ({ty}), got {got}")]
    InputDType { name: String, expected: DType, ty: String, got: DType },
    #[error("input '{name}' must have rank {rank} ({ty}), got shape {got:?}")]
    InputRank { name: String, rank: usize, ty: String, got: Vec<usize> },
    /// An input shape breaks a fact of the `ShapeEnv` (message from `ShapeEnv::bind`:
    /// it names the input, the dim and the rule).
    #[error("input shapes do not fit the model: {0}")]
    Binding(SymError),
    #[error("{op} computing '{value}': {msg}")]
    Op { op: &'static str, value: String, msg: String },
    #[error("{op} computing '{value}' does not support {dtype}")]
    Unsupported { op: &'static str, value: String, dtype: DType },
    #[error("{op} computing '{value}': shape {shape:?} has more than {MAX_ELEMS} elements")]
    TooLarge { op: &'static str, value: String, shape: Vec<usize> },
    /// The computed tensor disagrees with the node's type: a shape-inference bug.
    #[error("internal error: {op} computed '{value}' as {got}, but its type {ty} evaluates to {expected}")]
    TypeMismatch { op: &'static str, value: String, ty: String, expected: String, got: String },
}

impl RefError {
    /// A defect in anyshape (a shape-inference bug), not a problem with the inputs.
    pub fn is_internal(&self) -> bool {
        matches!(self, RefError::TypeMismatch { .. })
    }
}

/// Check the inputs against the graph's inputs and bind the symbols.
///
/// Every graph input must be given exactly once, with its dtype and rank; the
/// dims then go to [`ShapeEnv::bind`], which checks every recorded shape fact.
pub fn bind_inputs(g: &Graph, inputs: &[(&str, Tensor)]) -> Result<Bindings, RefError> {
    let expected: Vec<(&str, &TensorType)> = g.inputs.iter().map(|v| (g.name(*v), g.ty(*v))).collect();
    ir::bind_inputs(&g.env, &expected, inputs).map(|(b, _)| b).map_err(|e| match e {
        InputError::Missing { name, expected } => RefError::MissingInput { name, expected },
        InputError::Unknown { name, expected } => RefError::UnknownInput { name, expected },
        InputError::Duplicate(name) => RefError::DuplicateInput(name),
        InputError::DType { name, expected, ty, got } => RefError::InputDType { name, expected, ty, got },
        InputError::Rank { name, rank, ty, got } => RefError::InputRank { name, rank, ty, got },
        InputError::Binding(e) => RefError::Binding(e),
    })
}

/// Run the graph on named inputs; returns the graph's outputs in order, each
/// named by its value's name.
pub fn run(g: &Graph, inputs: &[(&str, Tensor)]) -> Result<Vec<(String, Tensor)>, RefError> {
    let bindings = bind_inputs(g, inputs)?;
    let cx = Cx { env: &g.env, bindings: &bindings };
    let mut values: Vec<Option<Tensor>> = vec![None; g.num_values()];
    for &v in &g.inputs {
        values[v.index()] = inputs.iter().find(|(n, _)| *n == g.name(v)).map(|(_, t)| t.clone());
    }
    // Drop each intermediate after its last use, so that whole models fit in memory.
    let mut last_use = vec![usize::MAX; g.num_values()];
    for (i, node) in g.nodes.iter().enumerate() {
        node.inputs.iter().for_each(|v| last_use[v.index()] = i);
    }
    g.outputs.iter().chain(&g.inputs).for_each(|v| last_use[v.index()] = usize::MAX);
    for (i, node) in g.nodes.iter().enumerate() {
        let out = eval_node(g, &cx, node, &values)?;
        values[node.output.index()] = Some(out);
        for v in &node.inputs {
            if last_use[v.index()] == i {
                values[v.index()] = None;
            }
        }
    }
    g.outputs
        .iter()
        .map(|&v| match &values[v.index()] {
            Some(t) => Ok((g.name(v).to_string(), t.clone())),
            None => Err(RefError::Op {
                op: "output",
                value: g.name(v).to_string(),
                msg: "no node computes this graph output".into(),
            }),
        })
        .collect()
}

/// A unit of execution for [`run_units`]: nodes (indices into `g.nodes`) run
/// together, and the only values the rest of the graph may read from it.
#[derive(Clone, Debug, Default)]
pub struct Unit {
    pub nodes: Vec<usize>,
    pub outputs: Vec<ir::ValueId>,
}

/// Run the graph unit by unit (a fusion plan's groups, in order): a unit reads
/// graph inputs and earlier units' outputs, its other values are dropped when it
/// ends. A unit that reads what no earlier unit exported, a node in no unit or in
/// two, or a graph output nobody exports is an error: the partition is checked by
/// running it.
pub fn run_units(
    g: &Graph,
    units: &[Unit],
    inputs: &[(&str, Tensor)],
) -> Result<Vec<(String, Tensor)>, RefError> {
    let bad = |msg: String| RefError::Op { op: "unit", value: String::new(), msg };
    let mut owner = vec![usize::MAX; g.nodes.len()];
    for (u, unit) in units.iter().enumerate() {
        for &i in &unit.nodes {
            match owner.get(i) {
                Some(&usize::MAX) => owner[i] = u,
                Some(&other) => return Err(bad(format!("node {i} is in units {other} and {u}"))),
                None => return Err(bad(format!("unit {u} names node {i}, which does not exist"))),
            }
        }
    }
    if let Some(i) = owner.iter().position(|o| *o == usize::MAX) {
        return Err(bad(format!("node {i} ('{}') is in no unit", g.name(g.nodes[i].output))));
    }
    let bindings = bind_inputs(g, inputs)?;
    let cx = Cx { env: &g.env, bindings: &bindings };
    // One table: when a unit ends its other values are cleared, so a later unit
    // reading one finds nothing, exactly as if the unit had kept it to itself.
    let mut values: Vec<Option<Tensor>> = vec![None; g.num_values()];
    for &v in &g.inputs {
        values[v.index()] = inputs.iter().find(|(n, _)| *n == g.name(v)).map(|(_, t)| t.clone());
    }
    for (u, unit) in units.iter().enumerate() {
        let mut order = unit.nodes.clone();
        order.sort_unstable();
        for &i in &order {
            let node = &g.nodes[i];
            if let Some(v) = node.inputs.iter().find(|v| values[v.index()].is_none()) {
                return Err(bad(format!(
                    "unit {u} reads '{}', which neither it computes before nor an earlier unit exports",
                    g.name(*v)
                )));
            }
            let out = eval_node(g, &cx, node, &values)?;
            values[node.output.index()] = Some(out);
        }
        if let Some(v) = unit.outputs.iter().find(|v| !order.iter().any(|i| g.nodes[*i].output == **v)) {
            return Err(bad(format!("unit {u} exports '{}', which it does not compute", g.name(*v))));
        }
        for &i in &order {
            let v = g.nodes[i].output;
            if !unit.outputs.contains(&v) {
                values[v.index()] = None;
            }
        }
    }
    g.outputs
        .iter()
        .map(|&v| {
            values[v.index()]
                .clone()
                .map(|t| (g.name(v).to_string(), t))
                .ok_or_else(|| bad(format!("graph output '{}' is exported by no unit", g.name(v))))
        })
        .collect()
}

/// Evaluate one op on concrete inputs, its output type's dims evaluated under
/// `bindings`. Passes use it to fold constants (empty bindings, constant types),
/// so that folding computes exactly what the oracle computes.
pub fn eval_op(
    op: &ir::Op,
    ins: &[&Tensor],
    out: &ir::TensorType,
    env: &ShapeEnv,
    bindings: &Bindings,
) -> Result<Tensor, RefError> {
    let cx = Cx { env, bindings };
    let name = op.name();
    let fail = |f: Fail| match f {
        Fail::Msg(msg) => RefError::Op { op: name, value: "(folded)".into(), msg },
        Fail::Unsupported(dtype) => RefError::Unsupported { op: name, value: "(folded)".into(), dtype },
        Fail::TooLarge(shape) => RefError::TooLarge { op: name, value: "(folded)".into(), shape },
    };
    if let Some(n) = op.arity().filter(|n| *n != ins.len()) {
        return Err(fail(Fail::Msg(format!("takes {n} inputs, got {}", ins.len()))));
    }
    let shape = cx.shape(out).map_err(fail)?;
    let t = ops::eval(op, ins, out.dtype, &shape, &cx).map_err(fail)?;
    if t.shape() != shape.as_slice() || t.dtype() != out.dtype {
        return Err(fail(Fail::Msg(format!("computed {}{:?}, expected {out}", t.dtype(), t.shape()))));
    }
    Ok(t)
}

/// Evaluate one node and check the result against the node's type.
fn eval_node(g: &Graph, cx: &Cx, node: &Node, values: &[Option<Tensor>]) -> Result<Tensor, RefError> {
    let (op, value, ty) = (node.op.name(), g.name(node.output), g.ty(node.output));
    let shape_and_result = || -> R<(Vec<usize>, Tensor)> {
        let mut ins = Vec::with_capacity(node.inputs.len());
        for &v in &node.inputs {
            match &values[v.index()] {
                Some(t) => ins.push(t),
                None => bail!("its input '{}' is used before it is computed", g.name(v)),
            }
        }
        if let Some(n) = node.op.arity().filter(|n| *n != ins.len()) {
            bail!("takes {n} inputs, got {}", ins.len());
        }
        let shape = cx.shape(ty)?;
        let out = ops::eval(&node.op, &ins, ty.dtype, &shape, cx)?;
        Ok((shape, out))
    };
    let value = value.to_string();
    let (shape, out) = shape_and_result().map_err(|f| match f {
        Fail::Msg(msg) => RefError::Op { op, value: value.clone(), msg },
        Fail::Unsupported(dtype) => RefError::Unsupported { op, value: value.clone(), dtype },
        Fail::TooLarge(shape) => RefError::TooLarge { op, value: value.clone(), shape },
    })?;
    if out.shape() != shape.as_slice() || out.dtype() != ty.dtype {
        let show = |dt: DType, d: &[usize]| {
            format!("{dt}[{}]", d.iter().map(usize::to_string).collect::<Vec<_>>().join(", "))
        };
        return Err(RefError::TypeMismatch {
            op,
            value,
            ty: ty.to_string(),
            expected: show(ty.dtype, &shape),
            got: show(out.dtype(), out.shape()),
        });
    }
    Ok(out)
}

/// What ops need besides their inputs: the symbols' values.
struct Cx<'a> {
    env: &'a ShapeEnv,
    bindings: &'a Bindings,
}

impl Cx<'_> {
    fn eval(&self, e: &SymExpr) -> R<i64> {
        self.env.eval(e, self.bindings).map_err(|err| Fail::Msg(format!("cannot evaluate {e}: {err}")))
    }

    /// A type's concrete shape; negative or absurd sizes are errors.
    fn shape(&self, ty: &TensorType) -> R<Vec<usize>> {
        let dims = ty
            .shape
            .iter()
            .map(|d| {
                let v = self.eval(d)?;
                usize::try_from(v).map_err(|_| Fail::Msg(format!("its type {ty} has dim {d} = {v} < 0")))
            })
            .collect::<R<Vec<usize>>>()?;
        data::guard(&dims)?;
        Ok(dims)
    }
}
