//! Symbolic dimensions for dynamic-shape compilation.
//!
//! [`SymExpr`] is a dimension written over symbols (`batch*seq`, `(h+1)/2`) in a
//! canonical form; [`ShapeEnv`] holds what is known about the symbols and answers
//! every "can we prove this about a shape" question the later stages ask
//! (BladeDISC §3.1; TSCompiler §4.1). At run time [`ShapeEnv::bind`] turns observed
//! dims into [`Bindings`] and checks every recorded fact.

mod divide;
mod env;
mod expr;
mod parse;

pub use env::{parse_range, Bindings, Constraint, DimFact, Range, ShapeEnv, SymInfo, SymOrigin};
pub use expr::SymExpr;
pub use parse::{is_ident_char, is_valid_symbol_name, parse_expr};

/// Errors from symbolic arithmetic, facts and binding.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SymError {
    #[error("integer overflow in a symbolic dimension")]
    Overflow,
    #[error("division by {0}: divisors of symbolic dims must be positive constants")]
    NonPositiveDivisor(i64),
    #[error("symbol `{0}` has no value")]
    Unbound(String),
    #[error("`{0}` is not a valid symbol name (letters, digits, `_`; not starting with a digit)")]
    BadName(String),
    #[error("contradictory shape facts: {0}")]
    Contradiction(String),
    #[error("{0}")]
    Violation(String),
    #[error("cannot parse `{text}` at {pos}: {what}")]
    Parse { text: String, pos: usize, what: String },
}

/// Shorthand for `SymExpr::symbol`.
pub fn sym(name: &str) -> SymExpr {
    SymExpr::symbol(name)
}

/// Shorthand for `SymExpr::constant`.
pub fn lit(v: i64) -> SymExpr {
    SymExpr::constant(v)
}
