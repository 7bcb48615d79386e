//! The verifier: the invariants every pass may assume and must preserve.
//!
//! Structure: SSA (each value defined once, by a graph input or one node), nodes
//! in topological order, names non-empty and unique, outputs defined. Types: each
//! node's stored output type agrees with [`infer`] where the inputs determine it
//! (dims compared with `ShapeEnv::equal`, so `batch*seq` and a symbol the env
//! equates with it are the same dim), and with the op's own rules where the output
//! type is part of the node (reshape, broadcast, slice, cast, iota, sym_const,
//! pool, conv_transpose). A dim the env proves negative is always an error.
//!
//! Errors name the offending value (and op): structural ones are
//! [`IrError::Invalid`], type ones [`IrError::Type`].

use std::collections::HashSet;

use sym::{ShapeEnv, SymExpr};

use crate::text::Name;
use crate::{infer, ConvAttrs, Graph, IrError, Node, Op, PoolAttrs, TensorType, ValueId};

/// Check `g`'s structure and types; the first violation found is returned.
pub fn verify(g: &Graph) -> Result<(), IrError> {
    check_names(g)?;
    let def = definitions(g)?;
    for (i, n) in g.nodes.iter().enumerate() {
        for &x in &n.inputs {
            match def[x.index()] {
                Some(Def::Input) => {}
                Some(Def::Node(j)) if j < i => {}
                Some(Def::Node(j)) => {
                    return Err(invalid(format!(
                        "{} ({}) uses {} before its definition (node {j}, {})",
                        Name(g.name(n.output)),
                        n.op.name(),
                        Name(g.name(x)),
                        g.nodes[j].op.name()
                    )))
                }
                None => {
                    return Err(invalid(format!(
                        "{} ({}) uses {}, which is neither a graph input nor a node output",
                        Name(g.name(n.output)),
                        n.op.name(),
                        Name(g.name(x))
                    )))
                }
            }
        }
    }
    for &v in &g.outputs {
        if def[v.index()].is_none() {
            return Err(invalid(format!(
                "graph output {} is neither a graph input nor a node output",
                Name(g.name(v))
            )));
        }
    }
    for &v in &g.inputs {
        let ty = g.ty(v);
        if let Some(d) = negative_dim(&g.env, ty) {
            return Err(invalid(format!("graph input {}: {ty} has a negative dim {d}", Name(g.name(v)))));
        }
    }
    g.nodes.iter().try_for_each(|n| check_node(g, n))
}

#[derive(Clone, Copy)]
enum Def {
    Input,
    Node(usize),
}

fn invalid(msg: String) -> IrError {
    IrError::Invalid(msg)
}

fn check_names(g: &Graph) -> Result<(), IrError> {
    let mut seen = HashSet::new();
    for (i, v) in g.values().iter().enumerate() {
        if v.name.is_empty() {
            return Err(invalid(format!("value {} has an empty name", ValueId(i as u32))));
        }
        if !seen.insert(v.name.as_str()) {
            return Err(invalid(format!("two values are named {}", Name(&v.name))));
        }
    }
    Ok(())
}

/// Who defines each value; checks ids are in range and each value is defined once.
fn definitions(g: &Graph) -> Result<Vec<Option<Def>>, IrError> {
    let n = g.num_values();
    let in_range = |v: ValueId, what: &dyn Fn() -> String| {
        if v.index() < n {
            Ok(())
        } else {
            Err(invalid(format!("{} refers to {v}, but the graph has {n} values", what())))
        }
    };
    let mut def: Vec<Option<Def>> = vec![None; n];
    for (k, &v) in g.inputs.iter().enumerate() {
        in_range(v, &|| format!("graph input {k}"))?;
        if def[v.index()].replace(Def::Input).is_some() {
            return Err(invalid(format!("graph input {} is listed twice", Name(g.name(v)))));
        }
    }
    for (i, node) in g.nodes.iter().enumerate() {
        let what = || format!("node {i} ({})", node.op.name());
        in_range(node.output, &what)?;
        for &x in &node.inputs {
            in_range(x, &what)?;
        }
        let out = Name(g.name(node.output));
        match def[node.output.index()].replace(Def::Node(i)) {
            None => {}
            Some(Def::Input) => {
                return Err(invalid(format!(
                    "graph input {out} is also the output of node {i} ({})",
                    node.op.name()
                )))
            }
            Some(Def::Node(j)) => {
                return Err(invalid(format!(
                    "{out} is defined twice: by node {j} ({}) and node {i} ({})",
                    g.nodes[j].op.name(),
                    node.op.name()
                )))
            }
        }
    }
    for (k, &v) in g.outputs.iter().enumerate() {
        in_range(v, &|| format!("graph output {k}"))?;
    }
    Ok(def)
}

/// A dim the env proves negative.
fn negative_dim<'a>(env: &ShapeEnv, ty: &'a TensorType) -> Option<&'a SymExpr> {
    ty.shape.iter().find(|d| env.known_lt(d, &SymExpr::constant(0)))
}

fn check_node(g: &Graph, n: &Node) -> Result<(), IrError> {
    let op = &n.op;
    let out = g.ty(n.output);
    let fail = |msg: String| IrError::Type {
        op: op.name().to_string(),
        msg: format!("{}: {msg}", Name(g.name(n.output))),
    };
    match op.arity() {
        Some(k) if n.inputs.len() != k => {
            return Err(fail(format!("takes {k} inputs, got {}", n.inputs.len())))
        }
        None if n.inputs.is_empty() => return Err(fail("needs at least one input".into())),
        _ => {}
    }
    if let Some(d) = negative_dim(&g.env, out) {
        return Err(fail(format!("{out} has a negative dim {d}")));
    }
    if let Some(dt) = op.fixed_dtype() {
        if out.dtype != dt {
            return Err(fail(format!("output dtype must be {dt}, got {}", out.dtype)));
        }
    }
    let ins: Vec<&TensorType> = n.inputs.iter().map(|v| g.ty(*v)).collect();
    match infer(op, &ins, &g.env) {
        Err(IrError::Type { msg, .. }) => Err(fail(msg)),
        Err(e) => Err(fail(e.to_string())),
        Ok(Some(want)) => {
            if out.dtype != want.dtype || !same_shape(&g.env, out, &want) {
                return Err(fail(format!("stored type {out}, but the inputs give {want}")));
            }
            Ok(())
        }
        Ok(None) => check_open(op, &ins, out, &g.env).map_err(fail),
    }
}

fn same_shape(env: &ShapeEnv, a: &TensorType, b: &TensorType) -> bool {
    a.rank() == b.rank() && a.shape.iter().zip(&b.shape).all(|(x, y)| env.equal(x, y))
}

fn same_dtype(x: &TensorType, out: &TensorType) -> Result<(), String> {
    if x.dtype != out.dtype {
        return Err(format!("output dtype {} differs from the input's {}", out.dtype, x.dtype));
    }
    Ok(())
}

/// Rules for the ops whose output type is part of the node (`infer` gives `None`).
fn check_open(op: &Op, ins: &[&TensorType], out: &TensorType, env: &ShapeEnv) -> Result<(), String> {
    match op {
        Op::Broadcast => {
            let x = ins[0];
            same_dtype(x, out)?;
            let ok = x.rank() == out.rank()
                && x.shape.iter().zip(&out.shape).all(|(d, o)| env.broadcastable(d, o));
            if !ok {
                return Err(format!("cannot broadcast {x} to {out}: each dim must be equal, 1, or declared to broadcast (`assert D broadcasts to E`)"));
            }
        }
        Op::Reshape => {
            let x = ins[0];
            same_dtype(x, out)?;
            let (a, b) = (x.numel().map_err(|e| e.to_string())?, out.numel().map_err(|e| e.to_string())?);
            if !env.equal(&a, &b) {
                return Err(format!("cannot reshape {x} ({a} elements) to {out} ({b} elements)"));
            }
        }
        Op::Cast => {
            let x = ins[0];
            if !same_shape(env, x, out) {
                return Err(format!("cast changes the shape: {x} to {out}"));
            }
        }
        Op::Slice { axes } => {
            let x = ins[0];
            same_dtype(x, out)?;
            if x.rank() != out.rank() {
                return Err(format!("slice changes the rank: {x} to {out}"));
            }
            let mut seen = vec![false; x.rank()];
            for a in axes {
                if a.axis >= x.rank() {
                    return Err(format!("axis {} out of range for {x}", a.axis));
                }
                if std::mem::replace(&mut seen[a.axis], true) {
                    return Err(format!("axis {} sliced twice", a.axis));
                }
                if a.step == 0 {
                    return Err(format!("axis {} has step 0", a.axis));
                }
            }
            for (i, (d, o)) in x.shape.iter().zip(&out.shape).enumerate() {
                if !seen[i] && !env.equal(d, o) {
                    return Err(format!("dim {i} is not sliced but changes: {x} to {out}"));
                }
            }
        }
        Op::Iota { axis } => {
            if *axis >= out.rank() {
                return Err(format!("axis {axis} out of range for {out}"));
            }
            if !out.dtype.is_int() && !out.dtype.is_float() {
                return Err(format!("iota needs an integer or float output, got {}", out.dtype));
            }
        }
        Op::SymConst(es) => {
            let ok = match out.rank() {
                0 => es.len() == 1,
                1 => env.equal(&out.shape[0], &SymExpr::constant(es.len() as i64)),
                _ => false,
            };
            if !ok {
                return Err(format!(
                    "{} expressions do not fit {out} (rank 1 of that length, or a scalar)",
                    es.len()
                ));
            }
        }
        Op::Pool(p) => check_pool(p, ins[0], out, env)?,
        Op::ConvTranspose(c) => check_conv_transpose(c, ins[0], ins[1], out, env)?,
        _ => {}
    }
    Ok(())
}

/// Spatial rank of `x[n, c, *s]`, and the batch/channel-first shape checks shared
/// by pool and conv-transpose.
fn spatial(x: &TensorType, out: &TensorType, lens: &[(&str, usize)]) -> Result<usize, String> {
    let s =
        x.rank().checked_sub(2).filter(|s| *s >= 1).ok_or_else(|| format!("input {x} needs rank >= 3"))?;
    if out.rank() != x.rank() {
        return Err(format!("output {out} must have the input's rank {}", x.rank()));
    }
    for (what, len) in lens {
        if *len != s {
            return Err(format!("{what} has {len} entries for {s} spatial dims"));
        }
    }
    Ok(s)
}

fn all_at_least(what: &str, v: &[i64], min: i64) -> Result<(), String> {
    match v.iter().find(|x| **x < min) {
        Some(x) => Err(format!("{what} must be >= {min}, got {x}")),
        None => Ok(()),
    }
}

fn check_pool(p: &PoolAttrs, x: &TensorType, out: &TensorType, env: &ShapeEnv) -> Result<(), String> {
    same_dtype(x, out)?;
    spatial(
        x,
        out,
        &[
            ("kernel", p.kernel.len()),
            ("strides", p.strides.len()),
            ("dilations", p.dilations.len()),
            ("pads_begin", p.pads_begin.len()),
            ("pads_end", p.pads_end.len()),
        ],
    )?;
    all_at_least("kernel", &p.kernel, 1)?;
    all_at_least("strides", &p.strides, 1)?;
    all_at_least("dilations", &p.dilations, 1)?;
    all_at_least("pads_begin", &p.pads_begin, 0)?;
    all_at_least("pads_end", &p.pads_end, 0)?;
    let (c, _) = p.axes(x.rank());
    if !env.equal(&x.shape[0], &out.shape[0]) || !env.equal(&x.shape[c], &out.shape[c]) {
        return Err(format!("batch and channel dims of {x} and {out} differ"));
    }
    Ok(())
}

fn check_conv_transpose(
    c: &ConvAttrs,
    x: &TensorType,
    w: &TensorType,
    out: &TensorType,
    env: &ShapeEnv,
) -> Result<(), String> {
    same_dtype(x, out)?;
    same_dtype(w, out)?;
    spatial(
        x,
        out,
        &[
            ("strides", c.strides.len()),
            ("dilations", c.dilations.len()),
            ("pads_begin", c.pads_begin.len()),
            ("pads_end", c.pads_end.len()),
        ],
    )?;
    if w.rank() != x.rank() {
        return Err(format!("weight {w} must have the input's rank {}", x.rank()));
    }
    all_at_least("group", &[c.group], 1)?;
    all_at_least("strides", &c.strides, 1)?;
    all_at_least("dilations", &c.dilations, 1)?;
    if !env.equal(&x.shape[0], &out.shape[0]) {
        return Err(format!("batch dims of {x} and {out} differ"));
    }
    if !env.equal(&x.shape[1], &w.shape[0]) {
        return Err(format!("input channels of {x} differ from the weight's {w}"));
    }
    let m = w.shape[1].try_mul(&SymExpr::constant(c.group)).map_err(|e| e.to_string())?;
    if !env.equal(&out.shape[1], &m) {
        return Err(format!("output channels of {out} != group {} x weight dim 1 of {w}", c.group));
    }
    Ok(())
}
