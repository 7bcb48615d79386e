//! The parser. Hand-written and line-oriented: every error names its 1-based line,
//! and no input makes it panic (it slices text only at ASCII delimiters and never
//! indexes by a number it read).

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;

use sym::{ShapeEnv, SymExpr};

use super::print::Name;
use crate::{
    checked_numel, ConstData, ConvAttrs, DType, Elems, Graph, IrError, Op, PadMode, PoolAttrs, PoolKind,
    ReduceOp, SliceAxis, Tensor, TensorType, ValueId,
};

/// Where `@NAME` constants come from.
type Weights<'a> = &'a dyn Fn(&str) -> Option<Arc<ConstData>>;

/// Parse the text form (see the module docs for the grammar). `weights` resolves
/// `constant @NAME`; its data must have the dtype and shape the line states.
///
/// Only syntax, names and constants are checked here; run [`crate::verify`] on
/// the result to check types and structure.
pub fn parse_graph(text: &str, weights: Weights<'_>) -> Result<Graph, IrError> {
    let mut env = ShapeEnv::new();
    let mut defs: Vec<(usize, Def)> = Vec::new();
    let mut outputs: Option<(usize, Vec<String>)> = None;
    let mut state = State::Header;
    let mut last = 1;
    for (i, raw) in text.lines().enumerate() {
        let ln = i + 1;
        last = ln;
        let at = |msg: String| IrError::Parse { line: ln, msg };
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match state {
            State::Header => {
                let mut c = Cur::new(line);
                if !(c.word() == "graph" && c.eat("{") && c.at_end()) {
                    return Err(at("expected `graph {`".into()));
                }
                state = State::Body;
            }
            State::Body if line == "}" => state = State::Done,
            State::Body => match parse_line(line, &mut env, weights).map_err(at)? {
                Line::Fact => {}
                Line::Def(d) => defs.push((ln, d)),
                Line::Output(v) if outputs.is_none() => outputs = Some((ln, v)),
                Line::Output(_) => return Err(at("a second `output` line".into())),
            },
            State::Done => return Err(at("text after the closing `}`".into())),
        }
    }
    if state != State::Done {
        return Err(IrError::Parse { line: last, msg: "unexpected end of text: missing `}`".into() });
    }
    let (out_line, outputs) =
        outputs.ok_or_else(|| IrError::Parse { line: last, msg: "missing `output` line".into() })?;

    // Values are created first, so that a node may name a value defined further
    // down: the verifier, not the parser, reports use-before-definition.
    let mut g = Graph::new(env);
    let mut ids: HashMap<String, ValueId> = HashMap::new();
    let mut defined = Vec::with_capacity(defs.len());
    for (ln, d) in &defs {
        let (name, ty) = match d {
            Def::Input { name, ty } | Def::Node { name, ty, .. } => (name, ty),
        };
        let at = |msg: String| IrError::Parse { line: *ln, msg };
        if name.is_empty() {
            return Err(at("empty value name".into()));
        }
        if ids.contains_key(name) {
            return Err(at(format!("{} is defined twice", Name(name))));
        }
        // Unique and non-empty, so `add_value` keeps the name as it is.
        let id = g.add_value(name, ty.clone());
        ids.insert(name.clone(), id);
        defined.push(id);
        if matches!(d, Def::Input { .. }) {
            g.inputs.push(id);
        }
    }
    let resolve = |ln: usize, names: &[String]| {
        names
            .iter()
            .map(|n| {
                ids.get(n)
                    .copied()
                    .ok_or_else(|| IrError::Parse { line: ln, msg: format!("{} is not defined", Name(n)) })
            })
            .collect::<Result<Vec<_>, _>>()
    };
    for ((ln, d), output) in defs.into_iter().zip(defined) {
        if let Def::Node { op, args, .. } = d {
            let inputs = resolve(ln, &args)?;
            g.nodes.push(crate::Node { op, inputs, output });
        }
    }
    g.outputs = resolve(out_line, &outputs)?;
    Ok(g)
}

#[derive(PartialEq)]
enum State {
    Header,
    Body,
    Done,
}

enum Def {
    Input { name: String, ty: TensorType },
    Node { name: String, ty: TensorType, op: Op, args: Vec<String> },
}

enum Line {
    Fact,
    Def(Def),
    Output(Vec<String>),
}

fn parse_line(line: &str, env: &mut ShapeEnv, weights: Weights<'_>) -> Result<Line, String> {
    let mut c = Cur::new(line);
    if line.starts_with('%') {
        let name = c.value()?;
        c.expect(":")?;
        let ty = c.ty()?;
        c.expect("=")?;
        let (op, args) = parse_op(&mut c, &ty, weights)?;
        c.end()?;
        return Ok(Line::Def(Def::Node { name, ty, op, args }));
    }
    match c.word() {
        "sym" | "let" | "assert" => {
            env.parse_fact(line).map_err(|e| e.to_string())?;
            Ok(Line::Fact)
        }
        "input" => {
            let name = c.value()?;
            c.expect(":")?;
            let ty = c.ty()?;
            c.end()?;
            Ok(Line::Def(Def::Input { name, ty }))
        }
        "output" => {
            let v = c.values()?;
            c.end()?;
            Ok(Line::Output(v))
        }
        _ => Err(format!(
            "expected `%name: type = op`, `input`, `output`, `sym`, `let`, `assert` or `}}`, found `{}`",
            snippet(line)
        )),
    }
}

/// `OPNAME[attrs] %a, %b`, `constant ...` or `sym_const [...]`.
fn parse_op(c: &mut Cur<'_>, ty: &TensorType, weights: Weights<'_>) -> Result<(Op, Vec<String>), String> {
    c.ws();
    let name = c.word();
    match name {
        "constant" => return Ok((Op::Constant(parse_const(c, ty, weights)?), vec![])),
        "sym_const" => {
            c.ws();
            let es = split_top(c.group(b'[', b']')?).into_iter().map(expr).collect::<Result<_, _>>()?;
            return Ok((Op::SymConst(es), vec![]));
        }
        "" => return Err(format!("expected an op name, found `{}`", snippet(c.rest()))),
        _ => {}
    }
    let attrs = if c.rest().starts_with('[') { Some(c.group(b'[', b']')?) } else { None };
    let op = make_op(name, attrs)?;
    Ok((op, c.values()?))
}

fn make_op(name: &str, attrs: Option<&str>) -> Result<Op, String> {
    let simple = Op::UNARY
        .iter()
        .map(|u| Op::Unary(*u))
        .chain(Op::BINARY.iter().map(|b| Op::Binary(*b)))
        .chain([Op::Select, Op::Cast, Op::Broadcast, Op::Reshape])
        .find(|op| op.name() == name);
    if name == "matmul" {
        let flags: Vec<&str> = attrs.map(|a| a.split(',').map(str::trim).collect()).unwrap_or_default();
        if let Some(bad) = flags.iter().find(|f| !matches!(**f, "transpose_a" | "transpose_b")) {
            return Err(format!("`matmul` takes `transpose_a` and `transpose_b`, not `{bad}`"));
        }
        return Ok(Op::MatMul {
            transpose_a: flags.contains(&"transpose_a"),
            transpose_b: flags.contains(&"transpose_b"),
        });
    }
    if let Some(op) = simple {
        return match attrs {
            None => Ok(op),
            Some(_) => Err(format!("`{name}` takes no attributes")),
        };
    }
    let known = [
        "iota",
        "concat",
        "gather",
        "transpose",
        "slice",
        "pad",
        "reduce_sum",
        "reduce_mean",
        "reduce_max",
        "reduce_min",
        "reduce_prod",
        "conv",
        "conv_transpose",
        "max_pool",
        "avg_pool",
        "cumsum",
    ];
    if !known.contains(&name) {
        return Err(format!("unknown op `{name}`"));
    }
    let text = attrs.ok_or_else(|| format!("`{name}` needs attributes `[...]`"))?;
    if name == "slice" {
        return Ok(Op::Slice {
            axes: split_top(text).into_iter().map(slice_axis).collect::<Result<_, _>>()?,
        });
    }
    let mut a = Attrs::new(text)?;
    let op = match name {
        "iota" => Op::Iota { axis: a.num("axis")? },
        "concat" => Op::Concat { axis: a.num("axis")? },
        "gather" => Op::Gather { axis: a.num("axis")? },
        "transpose" => Op::Transpose { perm: list(a.take("perm")?, num)? },
        "pad" => Op::Pad { pads: list(a.take("pads")?, pad_pair)?, mode: pad_mode(a.take("mode")?)? },
        "conv" => Op::Conv(conv_attrs(&mut a)?),
        "conv_transpose" => Op::ConvTranspose(conv_attrs(&mut a)?),
        "max_pool" | "avg_pool" => {
            let kernel = list(a.take("kernel")?, num)?;
            let (strides, dilations) = (list(a.take("strides")?, num)?, list(a.take("dilations")?, num)?);
            let pads_begin = list(a.take("pads_begin")?, num)?;
            let pads_end = list(a.take("pads_end")?, num)?;
            let kind = if name == "max_pool" {
                PoolKind::Max
            } else {
                PoolKind::Avg { count_include_pad: boolean(a.take("count_include_pad")?)? }
            };
            let channels_last = a.take_opt("channels_last").map(boolean).transpose()?.unwrap_or(false);
            Op::Pool(PoolAttrs { kind, kernel, strides, dilations, pads_begin, pads_end, channels_last })
        }
        "cumsum" => Op::CumSum {
            axis: a.num("axis")?,
            exclusive: boolean(a.take("exclusive")?)?,
            reverse: boolean(a.take("reverse")?)?,
        },
        _ => {
            let op = match name {
                "reduce_sum" => ReduceOp::Sum,
                "reduce_mean" => ReduceOp::Mean,
                "reduce_max" => ReduceOp::Max,
                "reduce_min" => ReduceOp::Min,
                _ => ReduceOp::Prod,
            };
            Op::Reduce { op, axes: list(a.take("axes")?, num)?, keep_dims: boolean(a.take("keep_dims")?)? }
        }
    };
    a.finish()?;
    Ok(op)
}

fn conv_attrs(a: &mut Attrs<'_>) -> Result<ConvAttrs, String> {
    Ok(ConvAttrs {
        strides: list(a.take("strides")?, num)?,
        dilations: list(a.take("dilations")?, num)?,
        pads_begin: list(a.take("pads_begin")?, num)?,
        pads_end: list(a.take("pads_end")?, num)?,
        group: num(a.take("group")?)?,
    })
}

/// `AXIS: START step STEP`; the last ` step ` splits, so a symbol named `step`
/// inside START is fine.
fn slice_axis(s: &str) -> Result<SliceAxis, String> {
    let bad = || format!("expected `AXIS: START step STEP`, found `{}`", snippet(s));
    let (axis, rest) = s.split_once(':').ok_or_else(bad)?;
    let (start, step) = rest.trim().rsplit_once(" step ").ok_or_else(bad)?;
    Ok(SliceAxis { axis: num(axis.trim())?, start: expr(start)?, step: num(step.trim())? })
}

/// `(BEFORE, AFTER)`.
fn pad_pair(s: &str) -> Result<(SymExpr, SymExpr), String> {
    let inner = s.strip_prefix('(').and_then(|s| s.strip_suffix(')'));
    match inner.map(split_top).as_deref() {
        Some([b, e]) => Ok((expr(b)?, expr(e)?)),
        _ => Err(format!("expected `(BEFORE, AFTER)`, found `{}`", snippet(s))),
    }
}

fn pad_mode(s: &str) -> Result<PadMode, String> {
    match s {
        "reflect" => Ok(PadMode::Reflect),
        "edge" => Ok(PadMode::Edge),
        "wrap" => Ok(PadMode::Wrap),
        _ => match s.strip_prefix("constant(").and_then(|v| v.strip_suffix(')')) {
            Some(v) => Ok(PadMode::Constant(num(v.trim())?)),
            None => Err(format!("expected `constant(VALUE)`, `reflect` or `edge`, found `{}`", snippet(s))),
        },
    }
}

/// The data of `constant ...`, checked against the line's type `ty`.
fn parse_const(c: &mut Cur<'_>, ty: &TensorType, weights: Weights<'_>) -> Result<Arc<ConstData>, String> {
    let dims: Vec<usize> = ty
        .shape
        .iter()
        .map(|d| d.as_const().and_then(|v| usize::try_from(v).ok()))
        .collect::<Option<_>>()
        .ok_or_else(|| format!("a constant's type needs non-negative constant dims, got {ty}"))?;
    if c.eat("@") {
        let name = c.name()?;
        let data = weights(&name).ok_or_else(|| format!("no weight named `{name}`"))?;
        if data.dtype != ty.dtype || data.shape != dims {
            return Err(format!("weight `{name}` is {}{:?}, but the line says {ty}", data.dtype, data.shape));
        }
        return Ok(data);
    }
    let n = checked_numel(&dims).map_err(|e| e.to_string())?;
    c.ws();
    let toks = if c.rest().starts_with('[') {
        if dims.is_empty() {
            return Err("a scalar constant is written without brackets".into());
        }
        split_top(c.group(b'[', b']')?)
    } else {
        if !dims.is_empty() {
            return Err(format!("a constant of type {ty} is written as a list `[...]`"));
        }
        let r = c.rest();
        let k = r.find(char::is_whitespace).unwrap_or(r.len());
        c.i += k;
        vec![&r[..k]]
    };
    if toks.len() != n {
        return Err(format!("{ty} has {n} elements, {} given", toks.len()));
    }
    let elems = match ty.dtype {
        DType::F32 => Elems::F32(all(&toks, num)?),
        DType::F64 => Elems::F64(all(&toks, num)?),
        DType::F16 => Elems::F16(all(&toks, |s| {
            s.strip_prefix("0x")
                .and_then(|h| u16::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("f16 elements are raw bits like `0x3c00`, found `{}`", snippet(s)))
        })?),
        DType::BF16 => return Err("bf16 constants are not written in the text form".into()),
        DType::I8 => Elems::I8(all(&toks, num)?),
        DType::U8 => Elems::U8(all(&toks, num)?),
        DType::I32 => Elems::I32(all(&toks, num)?),
        DType::I64 => Elems::I64(all(&toks, num)?),
        DType::Bool => Elems::Bool(all(&toks, boolean)?),
    };
    let t = Tensor::new(dims, elems).map_err(|e| e.to_string())?;
    Ok(Arc::new(ConstData::from_tensor(&t)))
}

fn all<T>(toks: &[&str], f: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, String> {
    toks.iter().map(|t| f(t)).collect()
}

fn num<T: FromStr>(s: &str) -> Result<T, String> {
    s.parse().map_err(|_| format!("bad number `{}`", snippet(s)))
}

fn boolean(s: &str) -> Result<bool, String> {
    match s {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("expected `true` or `false`, found `{}`", snippet(s))),
    }
}

fn expr(s: &str) -> Result<SymExpr, String> {
    sym::parse_expr(s).map_err(|e| e.to_string())
}

/// `[a, b, ...]` with each item read by `f`.
fn list<T>(s: &str, f: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, String> {
    let inner = s
        .strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .ok_or_else(|| format!("expected a list `[...]`, found `{}`", snippet(s)))?;
    split_top(inner).into_iter().map(f).collect()
}

/// Split at commas outside parentheses and brackets (`min(a, b), 3` is two items);
/// items are trimmed; blank text has no items.
fn split_top(s: &str) -> Vec<&str> {
    if s.trim().is_empty() {
        return vec![];
    }
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (k, b) in s.bytes().enumerate() {
        match b {
            b'(' | b'[' => depth += 1,
            b')' | b']' => depth -= 1,
            b',' if depth == 0 => {
                out.push(s[start..k].trim());
                start = k + 1;
            }
            _ => {}
        }
    }
    out.push(s[start..].trim());
    out
}

/// The start of `s`, for error messages.
fn snippet(s: &str) -> String {
    let mut it = s.chars();
    let head: String = it.by_ref().take(40).collect();
    if it.next().is_some() {
        format!("{head}…")
    } else {
        head
    }
}

/// `key=value, ...` attributes; each key once, every key consumed.
struct Attrs<'a> {
    items: Vec<(&'a str, &'a str)>,
}

impl<'a> Attrs<'a> {
    fn new(text: &'a str) -> Result<Attrs<'a>, String> {
        let mut items: Vec<(&str, &str)> = Vec::new();
        for it in split_top(text) {
            let (k, v) =
                it.split_once('=').ok_or_else(|| format!("expected `key=value`, found `{}`", snippet(it)))?;
            let k = k.trim();
            if items.iter().any(|(x, _)| *x == k) {
                return Err(format!("attribute `{k}` given twice"));
            }
            items.push((k, v.trim()));
        }
        Ok(Attrs { items })
    }

    fn take(&mut self, key: &str) -> Result<&'a str, String> {
        let i = self
            .items
            .iter()
            .position(|(k, _)| *k == key)
            .ok_or_else(|| format!("missing attribute `{key}`"))?;
        Ok(self.items.remove(i).1)
    }

    /// An attribute that may be left out.
    fn take_opt(&mut self, key: &str) -> Option<&'a str> {
        let i = self.items.iter().position(|(k, _)| *k == key)?;
        Some(self.items.remove(i).1)
    }

    fn num<T: FromStr>(&mut self, key: &str) -> Result<T, String> {
        num(self.take(key)?)
    }

    fn finish(self) -> Result<(), String> {
        match self.items.first() {
            Some((k, _)) => Err(format!("unknown attribute `{k}`")),
            None => Ok(()),
        }
    }
}

/// A cursor over one line. `i` only ever advances past ASCII bytes or whole
/// chars, so every slice it takes is on a char boundary.
struct Cur<'a> {
    s: &'a str,
    i: usize,
}

impl<'a> Cur<'a> {
    fn new(s: &'a str) -> Cur<'a> {
        Cur { s, i: 0 }
    }

    fn rest(&self) -> &'a str {
        &self.s[self.i..]
    }

    fn ws(&mut self) {
        let r = self.rest();
        self.i += r.len() - r.trim_start().len();
    }

    fn eat(&mut self, tok: &str) -> bool {
        self.ws();
        let hit = self.rest().starts_with(tok);
        if hit {
            self.i += tok.len();
        }
        hit
    }

    fn expect(&mut self, tok: &str) -> Result<(), String> {
        if self.eat(tok) {
            Ok(())
        } else {
            Err(format!("expected `{tok}`, found `{}`", snippet(self.rest())))
        }
    }

    fn at_end(&mut self) -> bool {
        self.ws();
        self.i == self.s.len()
    }

    fn end(&mut self) -> Result<(), String> {
        if self.at_end() {
            Ok(())
        } else {
            Err(format!("unexpected `{}`", snippet(self.rest())))
        }
    }

    /// `[A-Za-z0-9_]*` after blanks.
    fn word(&mut self) -> &'a str {
        self.ws();
        let r = self.rest();
        let n = r.bytes().take_while(|b| b.is_ascii_alphanumeric() || *b == b'_').count();
        self.i += n;
        &r[..n]
    }

    /// The text inside the `open ... close` group at the cursor, nesting respected.
    fn group(&mut self, open: u8, close: u8) -> Result<&'a str, String> {
        let r = self.rest();
        if r.as_bytes().first() != Some(&open) {
            return Err(format!("expected `{}`, found `{}`", open as char, snippet(r)));
        }
        let mut depth = 0i32;
        for (k, b) in r.bytes().enumerate() {
            match b {
                b'(' | b'[' => depth += 1,
                b')' | b']' => {
                    depth -= 1;
                    if depth == 0 {
                        if b != close {
                            return Err(format!("`{}` closed by `{}`", open as char, b as char));
                        }
                        self.i += k + 1;
                        return Ok(&r[1..k]);
                    }
                }
                _ => {}
            }
        }
        Err(format!("unclosed `{}`", open as char))
    }

    /// `%name` after blanks.
    fn value(&mut self) -> Result<String, String> {
        if !self.eat("%") {
            return Err(format!("expected a value `%name`, found `{}`", snippet(self.rest())));
        }
        self.name()
    }

    /// `%a, %b, ...`, possibly none.
    fn values(&mut self) -> Result<Vec<String>, String> {
        let mut v = Vec::new();
        if self.at_end() {
            return Ok(v);
        }
        loop {
            v.push(self.value()?);
            if !self.eat(",") {
                return Ok(v);
            }
        }
    }

    /// A bare name `[A-Za-z0-9_.]+` or a quoted one, right at the cursor.
    fn name(&mut self) -> Result<String, String> {
        let r = self.rest();
        let Some(q) = r.strip_prefix('"') else {
            let n = r.bytes().take_while(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'.').count();
            if n == 0 {
                return Err(format!("expected a name, found `{}`", snippet(r)));
            }
            self.i += n;
            return Ok(r[..n].to_string());
        };
        let mut out = String::new();
        let mut chars = q.char_indices();
        while let Some((k, ch)) = chars.next() {
            match ch {
                '"' => {
                    self.i += 1 + k + 1;
                    return Ok(out);
                }
                '\\' => out.push(match chars.next().map(|(_, e)| e) {
                    Some('"') => '"',
                    Some('\\') => '\\',
                    Some('n') => '\n',
                    Some('r') => '\r',
                    Some('t') => '\t',
                    Some('u') => {
                        let rest = chars.as_str();
                        let hex = rest
                            .strip_prefix('{')
                            .and_then(|h| h.split_once('}'))
                            .map(|(h, _)| h)
                            .filter(|h| h.len() <= 6);
                        let c = hex
                            .and_then(|h| u32::from_str_radix(h, 16).ok())
                            .and_then(char::from_u32)
                            .ok_or("bad `\\u{...}` escape in a quoted name")?;
                        // Skip `{HEX}`: all ASCII, so one char per byte.
                        for _ in 0..hex.map_or(0, |h| h.len() + 2) {
                            chars.next();
                        }
                        c
                    }
                    _ => return Err("bad escape in a quoted name".into()),
                }),
                c => out.push(c),
            }
        }
        Err("unterminated quoted name".into())
    }

    /// `DTYPE[dim, ...]` after blanks.
    fn ty(&mut self) -> Result<TensorType, String> {
        let w = self.word();
        let dtype = DType::from_name(w).ok_or_else(|| format!("unknown dtype `{w}`"))?;
        let shape = split_top(self.group(b'[', b']')?).into_iter().map(expr).collect::<Result<_, _>>()?;
        Ok(TensorType::new(dtype, shape))
    }
}
