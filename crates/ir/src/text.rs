//! The IR's text form: a printer and a parser that round-trip exactly, so that
//! passes are tested with golden before/after text and `inspect` shows the graph.
//!
//! ```text
//! graph {
//!   sym batch param 1..
//!   sym seq param 8..512 divisible by 8
//!   let unk0 = batch*seq
//!   input %input_ids: i64[batch, seq]
//!   %w: f32[768, 768] = constant @w
//!   %c: f32[2] = constant [1.0, 2.5]
//!   %s: i64[2] = sym_const [batch, seq*2]
//!   %t: f32[batch, 768, seq] = transpose[perm=[0, 2, 1]] %x
//!   output %x, %t
//! }
//! ```
//!
//! Grammar (one item a line; leading/trailing blanks, blank lines and lines
//! starting with `#` are ignored):
//! ```text
//! graph  := 'graph' '{' line* '}'
//! line   := fact | input | node | output          -- `output` exactly once
//! fact   := ('sym' | 'let' | 'assert') ...       -- a `ShapeEnv` Display line,
//!                                                   read by `ShapeEnv::parse_fact`
//! input  := 'input' value ':' type
//! node   := value ':' type '=' op
//! output := 'output' (value (',' value)*)?
//! value  := '%' NAME | '%' quoted                 -- NAME = [A-Za-z0-9_.]+
//! quoted := '"' (CHAR | '\"' | '\\' | '\n' | '\r' | '\t' | '\u{' HEX '}')* '"'
//! type   := DTYPE '[' (dim (',' dim)*)? ']'       -- DTYPE: f32 f64 f16 i8 u8 i32 i64 bool
//! dim    := a `SymExpr` (`sym::parse_expr`); commas only inside its parentheses
//! op     := 'constant' (scalar | '[' (scalar (',' scalar)*)? ']' | '@' (NAME | quoted))
//!         | 'sym_const' '[' (dim (',' dim)*)? ']'
//!         | OPNAME ('[' attrs ']')? (value (',' value)*)?
//! scalar := f32/f64: Rust `{:?}` (`1.0`, `-0.0`, `1e-7`, `NaN`, `inf`, `-inf`);
//!           f16: raw IEEE bits `0x3c00`; integers: decimal; bool: `true` | `false`
//! attrs, by op (`key=value` pairs, printed in this order, parsed in any order):
//!   iota, concat, gather        axis=INT
//!   transpose                   perm=[INT, ...]
//!   slice                       (INT ':' dim 'step' INT (',' INT ':' dim 'step' INT)*)?
//!   pad                         pads=[(dim, dim), ...], mode=constant(FLOAT) | reflect | edge
//!   reduce_sum/mean/max/min/prod axes=[INT, ...], keep_dims=BOOL
//!   conv, conv_transpose        strides=[..], dilations=[..], pads_begin=[..], pads_end=[..], group=INT
//!   max_pool                    kernel=[..], strides=[..], dilations=[..], pads_begin=[..], pads_end=[..]
//!   avg_pool                    as max_pool, then count_include_pad=BOOL
//!   cumsum                      axis=INT, exclusive=BOOL, reverse=BOOL
//!   unary/binary ops (`Op::name`), select, cast, broadcast, reshape, matmul: none
//! ```
//! A constant is printed inline (a bare scalar for rank 0, else a flat row-major
//! list; the type gives the shape) when it has at most [`INLINE_MAX`] elements,
//! and as `@NAME` (its output's name) otherwise: the parser resolves it through a
//! caller-given lookup, such as one built from [`weight_table`]. NaN payloads are
//! not kept: every NaN prints as `NaN`.
//!
//! Names in the text are the values' names; `ValueId`s are not part of the form.
//! The parser checks syntax, names and constants only; [`crate::verify`] checks
//! the rest, so invalid graphs can be written down for verifier tests.

mod parse;
mod print;

use std::collections::HashMap;
use std::sync::Arc;

use crate::{ConstData, Graph, Op};

pub use parse::parse_graph;
pub use print::print_graph;
pub(crate) use print::Name;

/// Constants with at most this many elements are printed inline.
pub const INLINE_MAX: usize = 16;

/// Each constant node's output name → its data: the lookup that lets
/// `parse_graph` resolve the `@NAME` references `print_graph` writes.
pub fn weight_table(g: &Graph) -> HashMap<String, Arc<ConstData>> {
    g.nodes
        .iter()
        .filter_map(|n| match &n.op {
            Op::Constant(c) => Some((g.values().get(n.output.index())?.name.clone(), c.clone())),
            _ => None,
        })
        .collect()
}

/// A name printed without quotes: `[A-Za-z0-9_.]+`.
fn is_bare_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
}
