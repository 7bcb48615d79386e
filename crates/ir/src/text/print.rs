//! The printer. It never panics, even on invalid graphs (which the verifier's
//! messages want to show): a dangling `ValueId` prints as `%?v7`, which no
//! parser accepts.

use std::fmt::{self, Write};

use sym::SymExpr;

use super::{is_bare_name, INLINE_MAX};
use crate::{ConstData, Elems, Graph, Node, Op, PadMode, PoolKind, ValueId};

/// The text form of `g` (see the module docs for the grammar).
pub fn print_graph(g: &Graph) -> String {
    g.to_string()
}

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "graph {{")?;
        for line in self.env.to_string().lines() {
            writeln!(f, "  {line}")?;
        }
        for &v in &self.inputs {
            writeln!(f, "  input {}: {}", ValueRef(self, v), TypeRef(self, v))?;
        }
        for n in &self.nodes {
            write!(f, "  {}: {} = ", ValueRef(self, n.output), TypeRef(self, n.output))?;
            write_op(f, self, n)?;
            writeln!(f)?;
        }
        write!(f, "  output")?;
        for (i, &v) in self.outputs.iter().enumerate() {
            write!(f, "{} {}", if i > 0 { "," } else { "" }, ValueRef(self, v))?;
        }
        writeln!(f, "\n}}")
    }
}

/// `%name`, quoted when the name is not bare.
pub(crate) struct Name<'a>(pub &'a str);

impl fmt::Display for Name<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_char('%')?;
        write_name(f, self.0)
    }
}

/// A name without the `%`: bare, or quoted with escapes.
fn write_name(f: &mut impl Write, name: &str) -> fmt::Result {
    if is_bare_name(name) {
        return f.write_str(name);
    }
    f.write_char('"')?;
    for c in name.chars() {
        match c {
            '"' => f.write_str("\\\"")?,
            '\\' => f.write_str("\\\\")?,
            '\n' => f.write_str("\\n")?,
            '\r' => f.write_str("\\r")?,
            '\t' => f.write_str("\\t")?,
            c if c.is_control() => write!(f, "\\u{{{:x}}}", c as u32)?,
            c => f.write_char(c)?,
        }
    }
    f.write_char('"')
}

struct ValueRef<'a>(&'a Graph, ValueId);

impl fmt::Display for ValueRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.values().get(self.1.index()) {
            Some(v) => Name(&v.name).fmt(f),
            None => write!(f, "%?{}", self.1),
        }
    }
}

struct TypeRef<'a>(&'a Graph, ValueId);

impl fmt::Display for TypeRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.values().get(self.1.index()) {
            Some(v) => v.ty.fmt(f),
            None => f.write_str("?"),
        }
    }
}

fn write_op(f: &mut fmt::Formatter<'_>, g: &Graph, n: &Node) -> fmt::Result {
    f.write_str(n.op.name())?;
    match &n.op {
        Op::Constant(c) => write_const(f, g, n.output, c)?,
        Op::SymConst(es) => {
            f.write_str(" ")?;
            write_list(f, es, |f, e| write!(f, "{e}"))?;
        }
        Op::Iota { axis } | Op::Concat { axis } | Op::Gather { axis } => write!(f, "[axis={axis}]")?,
        Op::Transpose { perm } => {
            f.write_str("[perm=")?;
            write_list(f, perm, |f, p| write!(f, "{p}"))?;
            f.write_str("]")?;
        }
        Op::Slice { axes } => {
            f.write_str("[")?;
            for (i, a) in axes.iter().enumerate() {
                let sep = if i > 0 { ", " } else { "" };
                write!(f, "{sep}{}: {} step {}", a.axis, a.start, a.step)?;
            }
            f.write_str("]")?;
        }
        Op::Pad { pads, mode } => {
            f.write_str("[pads=")?;
            write_list(f, pads, |f, (b, e): &(SymExpr, SymExpr)| write!(f, "({b}, {e})"))?;
            match mode {
                PadMode::Constant(v) => write!(f, ", mode=constant({v:?})]")?,
                PadMode::Reflect => f.write_str(", mode=reflect]")?,
                PadMode::Edge => f.write_str(", mode=edge]")?,
                PadMode::Wrap => f.write_str(", mode=wrap]")?,
            }
        }
        Op::Reduce { axes, keep_dims, .. } => {
            f.write_str("[axes=")?;
            write_list(f, axes, |f, a| write!(f, "{a}"))?;
            write!(f, ", keep_dims={keep_dims}]")?;
        }
        Op::Conv(c) | Op::ConvTranspose(c) => {
            write_ints(f, "[strides=", &c.strides)?;
            write_ints(f, ", dilations=", &c.dilations)?;
            write_ints(f, ", pads_begin=", &c.pads_begin)?;
            write_ints(f, ", pads_end=", &c.pads_end)?;
            write!(f, ", group={}]", c.group)?;
        }
        Op::Pool(p) => {
            write_ints(f, "[kernel=", &p.kernel)?;
            write_ints(f, ", strides=", &p.strides)?;
            write_ints(f, ", dilations=", &p.dilations)?;
            write_ints(f, ", pads_begin=", &p.pads_begin)?;
            write_ints(f, ", pads_end=", &p.pads_end)?;
            if let PoolKind::Avg { count_include_pad } = p.kind {
                write!(f, ", count_include_pad={count_include_pad}")?;
            }
            if p.channels_last {
                f.write_str(", channels_last=true")?;
            }
            f.write_str("]")?;
        }
        Op::CumSum { axis, exclusive, reverse } => {
            write!(f, "[axis={axis}, exclusive={exclusive}, reverse={reverse}]")?
        }
        Op::MatMul { transpose_a, transpose_b } => match (transpose_a, transpose_b) {
            (false, false) => {}
            (true, false) => f.write_str("[transpose_a]")?,
            (false, true) => f.write_str("[transpose_b]")?,
            (true, true) => f.write_str("[transpose_a, transpose_b]")?,
        },
        Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast | Op::Broadcast | Op::Reshape => {}
    }
    for (i, &v) in n.inputs.iter().enumerate() {
        write!(f, "{} {}", if i > 0 { "," } else { "" }, ValueRef(g, v))?;
    }
    Ok(())
}

fn write_list<T>(
    f: &mut fmt::Formatter<'_>,
    items: &[T],
    mut each: impl FnMut(&mut fmt::Formatter<'_>, &T) -> fmt::Result,
) -> fmt::Result {
    f.write_str("[")?;
    for (i, x) in items.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        each(f, x)?;
    }
    f.write_str("]")
}

fn write_ints(f: &mut fmt::Formatter<'_>, key: &str, v: &[i64]) -> fmt::Result {
    f.write_str(key)?;
    write_list(f, v, |f, x| write!(f, "{x}"))
}

/// ` 0.5`, ` [1.0, 2.5]` or ` @name`.
fn write_const(f: &mut fmt::Formatter<'_>, g: &Graph, out: ValueId, c: &ConstData) -> fmt::Result {
    if c.numel() > INLINE_MAX {
        f.write_str(" @")?;
        return match g.values().get(out.index()) {
            Some(v) => write_name(f, &v.name),
            None => write!(f, "?{out}"),
        };
    }
    let t = c.to_tensor();
    let e = t.elems();
    let item = |f: &mut fmt::Formatter<'_>, i: usize| match e {
        Elems::F32(v) => write!(f, "{:?}", v[i]),
        Elems::F64(v) => write!(f, "{:?}", v[i]),
        Elems::F16(v) | Elems::BF16(v) => write!(f, "{:#06x}", v[i]),
        Elems::I8(v) => write!(f, "{}", v[i]),
        Elems::U8(v) => write!(f, "{}", v[i]),
        Elems::I32(v) => write!(f, "{}", v[i]),
        Elems::I64(v) => write!(f, "{}", v[i]),
        Elems::Bool(v) => write!(f, "{}", v[i]),
    };
    f.write_str(" ")?;
    if c.shape.is_empty() && e.len() == 1 {
        return item(f, 0);
    }
    let idx: Vec<usize> = (0..e.len()).collect();
    write_list(f, &idx, |f, i| item(f, *i))
}
