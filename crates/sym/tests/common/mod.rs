//! A naive expression tree, independent of `SymExpr`, for property tests.
#![allow(dead_code)]

use anyshape_sym::{parse_expr, sym, SymError, SymExpr};
use proptest::prelude::*;

pub const NAMES: [&str; 3] = ["a", "b", "c"];

/// A random expression, evaluated directly (no canonical form).
#[derive(Clone, Debug)]
pub enum T {
    C(i64),
    S(usize),
    Neg(Box<T>),
    Add(Box<T>, Box<T>),
    Sub(Box<T>, Box<T>),
    Mul(Box<T>, Box<T>),
    Div(Box<T>, i64),
    Mod(Box<T>, i64),
    CeilDiv(Box<T>, i64),
    Min(Vec<T>),
    Max(Vec<T>),
}

impl T {
    /// Naive evaluation with Euclidean floor-div and mod; `None` on overflow.
    pub fn eval(&self, v: &[i64; 3]) -> Option<i64> {
        Some(match self {
            T::C(c) => *c,
            T::S(i) => v[*i],
            T::Neg(a) => a.eval(v)?.checked_neg()?,
            T::Add(a, b) => a.eval(v)?.checked_add(b.eval(v)?)?,
            T::Sub(a, b) => a.eval(v)?.checked_sub(b.eval(v)?)?,
            T::Mul(a, b) => a.eval(v)?.checked_mul(b.eval(v)?)?,
            T::Div(a, c) => floor_div(a.eval(v)?, *c),
            T::Mod(a, c) => {
                let x = a.eval(v)?;
                x - c * floor_div(x, *c)
            }
            T::CeilDiv(a, c) => -floor_div(-a.eval(v)?, *c),
            T::Min(xs) => xs.iter().map(|x| x.eval(v)).collect::<Option<Vec<_>>>()?.into_iter().min()?,
            T::Max(xs) => xs.iter().map(|x| x.eval(v)).collect::<Option<Vec<_>>>()?.into_iter().max()?,
        })
    }

    /// Build through the `try_` operations.
    pub fn build(&self) -> Result<SymExpr, SymError> {
        Ok(match self {
            T::C(c) => SymExpr::constant(*c),
            T::S(i) => sym(NAMES[*i]),
            T::Neg(a) => a.build()?.try_scale(-1)?,
            T::Add(a, b) => a.build()?.try_add(&b.build()?)?,
            T::Sub(a, b) => a.build()?.try_sub(&b.build()?)?,
            T::Mul(a, b) => a.build()?.try_mul(&b.build()?)?,
            T::Div(a, c) => a.build()?.try_floor_div(*c)?,
            T::Mod(a, c) => a.build()?.try_rem(*c)?,
            T::CeilDiv(a, c) => a.build()?.try_ceil_div(*c)?,
            T::Min(xs) => SymExpr::minmax(xs.iter().map(T::build).collect::<Result<_, _>>()?, false),
            T::Max(xs) => SymExpr::minmax(xs.iter().map(T::build).collect::<Result<_, _>>()?, true),
        })
    }

    /// A fully parenthesized text for the parser (independent of the printer).
    pub fn text(&self) -> String {
        match self {
            T::C(c) if *c < 0 => format!("(0-{})", c.unsigned_abs()),
            T::C(c) => c.to_string(),
            T::S(i) => NAMES[*i].to_string(),
            T::Neg(a) => format!("(-{})", a.text()),
            T::Add(a, b) => format!("({} + {})", a.text(), b.text()),
            T::Sub(a, b) => format!("({}-{})", a.text(), b.text()),
            T::Mul(a, b) => format!("({}*{})", a.text(), b.text()),
            T::Div(a, c) => format!("({}/{c})", a.text()),
            T::Mod(a, c) => format!("({} % {c})", a.text()),
            T::CeilDiv(a, c) => format!("(({} + {})/{c})", a.text(), c - 1),
            T::Min(xs) => format!("min({})", xs.iter().map(T::text).collect::<Vec<_>>().join(", ")),
            T::Max(xs) => format!("max({})", xs.iter().map(T::text).collect::<Vec<_>>().join(",")),
        }
    }

    pub fn parse(&self) -> Result<SymExpr, SymError> {
        parse_expr(&self.text())
    }
}

pub fn floor_div(x: i64, c: i64) -> i64 {
    let q = x / c;
    if (x % c != 0) && ((x < 0) != (c < 0)) {
        q - 1
    } else {
        q
    }
}

/// Proptest cases per property: `SYM_PROPTEST_CASES` or `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var("SYM_PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// Random trees over `a`, `b`, `c` with small constants.
pub fn tree() -> impl Strategy<Value = T> {
    tree_sized(6, 48)
}

/// Larger trees.
pub fn big_tree() -> impl Strategy<Value = T> {
    tree_sized(9, 160)
}

pub fn tree_sized(depth: u32, size: u32) -> impl Strategy<Value = T> {
    let leaf = prop_oneof![1 => (-6i64..=6).prop_map(T::C), 2 => (0usize..3).prop_map(T::S)];
    leaf.prop_recursive(depth, size, 3, |inner| {
        let div = prop_oneof![1i64..=6, Just(8i64), Just(12i64)];
        prop_oneof![
            inner.clone().prop_map(|a| T::Neg(Box::new(a))),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| T::Add(Box::new(a), Box::new(b))),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| T::Sub(Box::new(a), Box::new(b))),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| T::Mul(Box::new(a), Box::new(b))),
            (inner.clone(), div.clone()).prop_map(|(a, c)| T::Div(Box::new(a), c)),
            (inner.clone(), div.clone()).prop_map(|(a, c)| T::Mod(Box::new(a), c)),
            (inner.clone(), div).prop_map(|(a, c)| T::CeilDiv(Box::new(a), c)),
            prop::collection::vec(inner.clone(), 1..4).prop_map(T::Min),
            prop::collection::vec(inner, 1..4).prop_map(T::Max),
        ]
    })
}

pub fn eval_sym(e: &SymExpr, v: &[i64; 3]) -> Result<i64, SymError> {
    e.eval(&|s| NAMES.iter().position(|n| *n == s).map(|i| v[i]))
}
