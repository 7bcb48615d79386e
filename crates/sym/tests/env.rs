//! `ShapeEnv`: equalities, contradictions, queries, binding and the text form, plus
//! property tests against a satisfying assignment.

mod common;

use std::collections::BTreeMap;

use anyshape_sym::{lit, parse_expr, sym, DimFact, Range, ShapeEnv, SymError, SymExpr, SymOrigin};
use common::{cases, T};
use proptest::prelude::*;

fn p(s: &str) -> SymExpr {
    parse_expr(s).unwrap_or_else(|e| panic!("parse `{s}`: {e}"))
}

fn env_with(decls: &[(&str, i64, i64, SymOrigin)]) -> ShapeEnv {
    let mut env = ShapeEnv::new();
    for (n, lo, hi, o) in decls {
        env.declare(n, Range::new(*lo, *hi), *o).unwrap();
    }
    env
}

fn fact(what: &str, e: &str, v: i64) -> DimFact {
    DimFact { expr: p(e), value: v, what: what.to_string() }
}

fn violation(r: Result<impl std::fmt::Debug, SymError>) -> String {
    match r {
        Err(SymError::Violation(m)) => m,
        other => panic!("expected a violation, got {other:?}"),
    }
}

/// Print, parse back line by line, print again.
fn roundtrip(env: &ShapeEnv) -> ShapeEnv {
    let text = env.to_string();
    let mut back = ShapeEnv::new();
    for line in text.lines() {
        back.parse_fact(line).unwrap_or_else(|e| panic!("`{line}`: {e}\n{text}"));
    }
    assert_eq!(back.to_string(), text);
    back
}

use SymOrigin::{Fresh, Param, User};

// ------------------------------------------------------------ equalities

#[test]
fn union_find_chains() {
    let mut env =
        env_with(&[("a", 1, 100, Param), ("b", 1, 100, Param), ("c", 1, 100, Param), ("d", 1, 100, Param)]);
    env.equate(&sym("a"), &sym("b")).unwrap();
    env.equate(&sym("b"), &sym("c")).unwrap();
    assert!(env.equal(&sym("a"), &sym("c")));
    assert!(env.equal(&p("a*c+1"), &p("b*b+1")));
    assert!(!env.equal(&sym("a"), &sym("d")));
    env.equate(&sym("d"), &sym("c")).unwrap();
    assert!(env.equal(&sym("a"), &sym("d")));
    assert_eq!(env.symbols().len(), 1);
    // Re-equating is a no-op.
    let before = env.to_string();
    env.equate(&sym("d"), &sym("a")).unwrap();
    assert_eq!(env.to_string(), before);
    roundtrip(&env);
}

#[test]
fn undeclared_symbols_are_unified_too() {
    let mut env = ShapeEnv::new();
    env.equate(&sym("x"), &sym("y")).unwrap();
    env.equate(&sym("y"), &sym("z")).unwrap();
    assert!(env.equal(&sym("x"), &sym("z")));
    assert!(env.equal(&p("x+1"), &p("z+1")));
    let b = env.bind(&[fact("input 0", "x", 4)]).unwrap();
    assert_eq!(b.eval(&sym("y")), Ok(4));
    assert_eq!(b.eval(&sym("z")), Ok(4));
    roundtrip(&env);
}

#[test]
fn collapse_equality() {
    let mut env = env_with(&[("batch", 1, 64, User), ("seq", 1, 512, User)]);
    let s3 = env.fresh("s");
    env.equate(&s3, &(sym("batch") * sym("seq"))).unwrap();
    assert!(env.equal(&(s3.clone() * 2), &p("2*batch*seq")));
    assert!(env.equal(&s3, &p("seq*batch")));
    assert_eq!(env.normalize(&s3), p("batch*seq"));
    assert_eq!(env.range(&s3), Range::new(1, 64 * 512));
    // The other way round, and with a declared (named) collapsed dim.
    let mut env = env_with(&[("batch", 1, 64, User), ("seq", 1, 512, User), ("bs", 1, 1000, Param)]);
    env.equate(&p("batch*seq"), &sym("bs")).unwrap();
    assert!(env.equal(&p("bs*2"), &p("2*batch*seq")));
    // bs's range now constrains batch*seq.
    let e = violation(env.bind(&[fact("x dim 0", "batch", 64), fact("x dim 1", "seq", 512)]));
    assert!(e.contains("1..1000"), "{e}");
    assert!(e.contains("batch = 64 from x dim 0"), "{e}");
    let b = env.bind(&[fact("x dim 0", "batch", 2), fact("x dim 1", "seq", 3)]).unwrap();
    assert_eq!(b.get("bs"), Some(6));
    assert_eq!(b.eval(&p("bs+1")), Ok(7));
    roundtrip(&env);
}

#[test]
fn linear_equalities_narrow_ranges() {
    let mut env = env_with(&[("n", 0, 100, User), ("m", 0, 100, Fresh)]);
    env.equate(&sym("m"), &p("n+1")).unwrap();
    assert_eq!(env.symbol("n").unwrap().range, Range::new(0, 99));
    assert!(env.constraints().is_empty(), "{env}");
    let mut env = env_with(&[("n", 0, 100, User), ("m", 0, 10, Fresh)]);
    env.equate(&sym("m"), &p("20-n")).unwrap();
    assert_eq!(env.symbol("n").unwrap().range, Range::new(10, 20));
    // `2*a == 2*b` is `a == b`.
    let mut env = env_with(&[("a", 0, 100, User), ("b", 0, 100, User)]);
    env.equate(&p("2*a"), &p("2*b")).unwrap();
    assert!(env.equal(&sym("a"), &sym("b")));
    assert!(env.constraints().is_empty());
    assert!(matches!(env.equate(&p("2*a"), &p("2*a+1")), Err(SymError::Contradiction(_))));
}

#[test]
fn unsolvable_relations_are_constraints() {
    let mut env = env_with(&[("a", 1, 100, User), ("b", 1, 100, User), ("c", 1, 100, User)]);
    env.equate(&p("2*a"), &p("b*c")).unwrap();
    assert_eq!(env.constraints().len(), 1);
    assert!(env.equal(&p("b*c"), &p("2*a")));
    assert!(env.equal(&p("4*a"), &p("2*b*c")));
    assert!(env.equal(&p("2*a+1"), &p("b*c+1")));
    assert!(!env.equal(&p("2*a"), &p("b*c+1")));
    // The same fact again is not recorded twice.
    env.equate(&p("b*c"), &p("2*a")).unwrap();
    assert_eq!(env.constraints().len(), 1);
    let e = violation(env.bind(&[fact("in0", "a", 3), fact("in1", "b", 2), fact("in2", "c", 2)]));
    assert!(e.contains("2*a == b*c") && e.contains("a = 3 from in0") && e.contains("c = 2 from in2"), "{e}");
    env.bind(&[fact("in0", "a", 3), fact("in1", "b", 2), fact("in2", "c", 3)]).unwrap();
    // Once c is known, the relation is solved.
    env.equate(&sym("c"), &lit(2)).unwrap();
    assert!(env.equal(&sym("a"), &sym("b")), "{env}");
    assert!(env.constraints().is_empty(), "{env}");
    roundtrip(&env);
}

#[test]
fn contradictions_are_errors_and_leave_the_env_unchanged() {
    let mut env = env_with(&[("seq", 1, 512, User), ("a", 1, 10, User), ("b", 20, 30, User)]);
    let before = env.to_string();
    assert!(matches!(env.equate(&sym("seq"), &lit(600)), Err(SymError::Contradiction(_))));
    assert!(matches!(env.equate(&lit(0), &sym("seq")), Err(SymError::Contradiction(_))));
    assert!(matches!(env.equate(&sym("a"), &sym("b")), Err(SymError::Contradiction(_))));
    assert!(matches!(env.equate(&p("a+b"), &lit(5)), Err(SymError::Contradiction(_))));
    assert!(matches!(env.equate(&lit(3), &lit(4)), Err(SymError::Contradiction(_))));
    assert!(matches!(env.declare("seq", Range::new(600, 700), User), Err(SymError::Contradiction(_))));
    assert!(matches!(env.declare("x", Range::new(5, 4), User), Err(SymError::Contradiction(_))));
    assert_eq!(env.to_string(), before);
    // A contradiction found only after a substitution: nothing is recorded.
    let mut env = env_with(&[("n", 1, 10, User), ("m", 1, 10, Fresh), ("k", 1, 100, Fresh)]);
    env.equate(&sym("k"), &p("n*m")).unwrap();
    let before = env.to_string();
    assert!(env.equate(&sym("m"), &p("n+20")).is_err());
    assert_eq!(env.to_string(), before);
    assert!(matches!(env.equate(&sym("k"), &lit(200)), Err(SymError::Contradiction(_))));
    assert_eq!(env.to_string(), before);
    // Narrowing is fine.
    env.declare("n", Range::new(2, 50), User).unwrap();
    assert_eq!(env.symbol("n").unwrap().range, Range::new(2, 10));
    env.equate(&sym("seq"), &sym("seq")).unwrap();
}

#[test]
fn divisors() {
    let mut env = env_with(&[("seq", 1, 512, User), ("n", 1, 7, User), ("h", 0, 100, User)]);
    env.set_divisor("seq", 8).unwrap();
    assert_eq!(env.symbol("seq").unwrap().range, Range::new(8, 512));
    assert!(env.divides(8, &sym("seq")));
    assert!(env.divides(4, &sym("seq")));
    assert!(env.divides(16, &p("2*seq")));
    assert!(env.divides(-8, &p("seq*h+8")));
    assert!(!env.divides(16, &sym("seq")));
    assert!(!env.divides(3, &sym("seq")));
    assert!(env.divides(1, &sym("h")));
    assert!(env.divides(0, &lit(0)));
    assert!(!env.divides(0, &sym("h")));
    assert!(env.divides(i64::MIN, &lit(0)));
    assert!(!env.divides(i64::MIN, &sym("seq")));
    env.set_divisor("seq", 12).unwrap();
    assert_eq!(env.symbol("seq").unwrap().divisor, 24);
    assert!(matches!(env.set_divisor("n", 8), Err(SymError::Contradiction(_))));
    assert!(matches!(env.set_divisor("n", 0), Err(SymError::NonPositiveDivisor(0))));
    assert!(matches!(env.set_divisor("nope", 2), Err(SymError::Unbound(_))));
    let e = violation(env.bind(&[fact("x dim 1", "seq", 36)]));
    assert!(e.contains("x dim 1") && e.contains("not a multiple of 24"), "{e}");
    let e = violation(env.bind(&[fact("x dim 1", "seq", 20)]));
    assert!(e.contains("x dim 1") && e.contains("outside its range 24..504"), "{e}");
    // The divisor of an eliminated symbol is kept.
    let mut env = env_with(&[("a", 0, 100, User), ("b", 0, 100, User), ("s", 0, 1000, Fresh)]);
    env.set_divisor("s", 4).unwrap();
    env.equate(&sym("s"), &p("a+b")).unwrap();
    assert!(env.divides(4, &p("a+b")));
    assert!(env.divides(4, &sym("s")));
    let e = violation(env.bind(&[fact("in a", "a", 1), fact("in b", "b", 2)]));
    assert!(e.contains("divisible by 4"), "{e}");
    env.bind(&[fact("in a", "a", 1), fact("in b", "b", 3)]).unwrap();
    // ... and moves to the surviving symbol when the other is one.
    let mut env = env_with(&[("a", 0, 100, User), ("s", 0, 1000, Fresh)]);
    env.set_divisor("s", 4).unwrap();
    env.equate(&sym("s"), &sym("a")).unwrap();
    assert_eq!(env.symbol("a").unwrap().divisor, 4);
    assert_eq!(env.symbol("a").unwrap().range, Range::new(0, 100));
    // set_divisor on an eliminated symbol.
    env.set_divisor("s", 8).unwrap();
    assert_eq!(env.symbol("a").unwrap().divisor, 8);
    roundtrip(&env);
}

#[test]
fn named_symbols_survive_fresh_ones() {
    for flip in [false, true] {
        let mut env = ShapeEnv::new();
        let s0 = env.fresh("s");
        env.declare("batch", Range::new(1, 64), Param).unwrap();
        let s1 = env.fresh("s");
        let (x, y) = if flip { (sym("batch"), s0.clone()) } else { (s0.clone(), sym("batch")) };
        env.equate(&x, &y).unwrap();
        env.equate(&s1, &s0).unwrap();
        let names: Vec<&str> = env.symbols().iter().map(|i| &*i.name).collect();
        assert_eq!(names, ["batch"]);
        assert_eq!(env.normalize(&s1), sym("batch"));
        assert_eq!(env.symbol("batch").unwrap().range, Range::new(1, 64));
        assert_eq!(env.symbol("batch").unwrap().origin, Param);
    }
    // User over Param, either way round.
    for flip in [false, true] {
        let mut env = env_with(&[("n", 1, 64, User), ("N", 0, 32, Param)]);
        let (x, y) = if flip { (sym("N"), sym("n")) } else { (sym("n"), sym("N")) };
        env.equate(&x, &y).unwrap();
        let names: Vec<&str> = env.symbols().iter().map(|i| &*i.name).collect();
        assert_eq!(names, ["n"]);
        assert_eq!(env.symbol("n").unwrap().range, Range::new(1, 32));
    }
    // A fresh name never collides.
    let mut env = ShapeEnv::new();
    env.declare("s0", Range::ALL, User).unwrap();
    assert_eq!(env.fresh("s"), sym("s1"));
    assert!(matches!(env.declare("min", Range::ALL, User), Err(SymError::BadName(_))));
    assert!(matches!(env.declare("2x", Range::ALL, User), Err(SymError::BadName(_))));
}

#[test]
fn queries() {
    let env = env_with(&[("seq", 1, 512, User), ("h", 0, 100, User), ("w", -5, 5, User)]);
    assert!(env.known_le(&lit(1), &sym("seq")));
    assert!(env.known_le(&sym("seq"), &lit(512)));
    assert!(!env.known_le(&sym("seq"), &lit(511)));
    assert!(env.known_le(&p("seq/2"), &sym("seq")));
    assert!(env.known_lt(&p("(seq-1)/2"), &sym("seq")));
    assert!(env.known_ne(&sym("seq"), &lit(0)));
    assert!(!env.known_ne(&sym("h"), &lit(0)));
    assert_eq!(env.range(&p("seq%8")), Range::new(0, 7));
    assert_eq!(env.range(&p("h%128")), Range::new(0, 100));
    assert_eq!(env.range(&p("w*w")), Range::new(0, 25));
    assert_eq!(env.range(&p("w*w*w")), Range::new(-125, 125));
    assert_eq!(env.range(&p("min(seq, h)")), Range::new(0, 100));
    assert_eq!(env.range(&p("max(seq, h) - 1")), Range::new(0, 511));
    assert_eq!(env.range(&p("(h+1)/2")), Range::new(0, 50));
    assert_eq!(env.range(&p("(w-1)/2")), Range::new(-3, 2));
    assert_eq!(env.range(&p("undeclared + 1")), Range::ALL);
    assert_eq!(env.range(&p("seq - seq/2")), Range::new(1, 256));
    assert_eq!(env.range(&p("seq - seq%8")), Range::new(0, 512));
    assert!(env.equal(&p("seq%1"), &lit(0)));
    assert!(env.equal(&p("h%128"), &sym("h")) || env.range(&p("h%128 - h")) != Range::point(0));
}

#[test]
fn overflow_never_panics() {
    let mut env = env_with(&[("a", 0, i64::MAX, User), ("b", i64::MIN, i64::MAX, User), ("c", 1, 2, User)]);
    let huge = p("9223372036854775807*a*b + 9223372036854775807*b*b*b*b*b*b*b*b");
    let r = env.range(&huge);
    assert!(r.lo == i64::MIN && r.hi == i64::MAX);
    assert_eq!(env.range(&p("a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a")), Range::new(0, i64::MAX));
    let big = sym("a").try_scale(i64::MAX).unwrap();
    assert_eq!(env.range(&big), Range::new(0, i64::MAX));
    assert!(env.known_le(&lit(0), &big));
    assert!(!env.known_le(&big, &lit(0)));
    let _ = env.known_le(&lit(i64::MIN), &lit(i64::MAX));
    let _ = env.equal(&lit(i64::MIN), &lit(i64::MAX));
    let _ = env.equate(&lit(i64::MIN), &sym("b"));
    let _ = env.equate(&big, &p("b*c"));
    let _ = env.equate(&sym("c").try_scale(i64::MIN).unwrap(), &sym("a").try_scale(i64::MIN).unwrap());
    let _ = env.set_divisor("a", i64::MAX);
    let _ = env.set_divisor("a", i64::MAX - 1);
    // bind with values near the limits.
    let env = env_with(&[("n", i64::MIN, i64::MAX, User), ("m", i64::MIN, i64::MAX, User)]);
    let r = env.bind(&[fact("in0", "0-n", i64::MIN)]);
    assert!(matches!(r, Err(SymError::Overflow)), "{r:?}");
    let r = env.bind(&[fact("in0", "n+1", i64::MIN)]);
    assert!(matches!(r, Err(SymError::Overflow)), "{r:?}");
    let r = env.bind(&[fact("in0", "n", i64::MAX), fact("in1", "n+m", 0), fact("in2", "n*m", 0)]);
    assert!(r.is_err(), "{r:?}");
    let r = env.bind(&[fact("in0", "n", i64::MAX), fact("in1", "2*n", 0)]);
    assert!(matches!(r, Err(SymError::Overflow)), "{r:?}");
    let r = env.bind(&[fact("in0", "n", i64::MIN), fact("in1", "m", -1), fact("in1", "n*m", 0)]);
    assert!(matches!(r, Err(SymError::Overflow)), "{r:?}");
    let b = env.bind(&[fact("in0", "n", i64::MIN), fact("in1", "m*n", 0)]).unwrap();
    assert_eq!(b.get("m"), Some(0));
    let b = env.bind(&[fact("in0", "0-n", i64::MAX)]).unwrap();
    assert_eq!(b.get("n"), Some(-i64::MAX));
}

// ------------------------------------------------------------ binding

#[test]
fn bind_solves_and_reports() {
    let mut env = env_with(&[("batch", 1, 64, User), ("seq", 1, 512, User)]);
    let s = env.fresh("s");
    env.equate(&s, &p("seq+1")).unwrap();
    // Linear dims are solved.
    let b = env.bind(&[fact("ids dim 0", "batch", 2), fact("ids dim 1", "s0", 10)]).unwrap();
    assert_eq!(b.get("seq"), Some(9));
    assert_eq!(b.get("s0"), Some(10));
    assert_eq!(env.eval(&p("s0*batch"), &b), Ok(20));
    let b = env.bind(&[fact("x", "2*seq+1", 9), fact("y", "batch*seq", 8)]).unwrap();
    assert_eq!((b.get("seq"), b.get("batch")), (Some(4), Some(2)));

    // Mismatch of a shared symbol: names both dims.
    let e = violation(env.bind(&[fact("input 'a' dim 1", "seq", 5), fact("input 'b' dim 0", "seq", 7)]));
    assert!(e.contains("input 'b' dim 0 is 7") && e.contains("seq = 5 from input 'a' dim 1"), "{e}");
    // Not a multiple.
    let e = violation(env.bind(&[fact("input 'a' dim 1", "2*seq", 7)]));
    assert!(e.contains("input 'a' dim 1 is 7") && e.contains("2*seq"), "{e}");
    // Out of range.
    let e = violation(env.bind(&[fact("input 'ids' dim 1", "seq", 600)]));
    assert!(e.contains("input 'ids' dim 1") && e.contains("seq = 600") && e.contains("1..512"), "{e}");
    let e = violation(env.bind(&[fact("input 'ids' dim 1", "s0", 1)]));
    assert!(e.contains("input 'ids' dim 1") && e.contains("seq = 0") && e.contains("1..512"), "{e}");
    // Unsolvable.
    let e = violation(env.bind(&[fact("input 'm' dim 0", "batch*seq", 6)]));
    assert!(e.contains("input 'm' dim 0 is 6") && e.contains("no input dim determines"), "{e}");
    // A static dim.
    let e = violation(env.bind(&[fact("input 'm' dim 2", "768", 512)]));
    assert!(e.contains("input 'm' dim 2 is 512 but must be 768"), "{e}");
    // check() alone.
    let mut b = anyshape_sym::Bindings::default();
    b.insert("seq", 0);
    let e = violation(env.check(&b));
    assert!(e.contains("seq = 0") && e.contains("1..512"), "{e}");
    // check() verifies the values of eliminated symbols too.
    let mut b = anyshape_sym::Bindings::default();
    b.insert("seq", 3);
    b.insert("s0", 3);
    let e = violation(env.check(&b));
    assert!(e.contains("s0 == seq+1"), "{e}");
}

// ------------------------------------------------------------ text form

#[test]
fn parse_fact_roundtrip() {
    let mut env = ShapeEnv::new();
    env.declare("batch", Range::at_least(1), Param).unwrap();
    env.declare("seq", Range::new(1, 512), User).unwrap();
    env.set_divisor("seq", 8).unwrap();
    env.declare("w", Range::new(-5, 5), User).unwrap();
    env.declare("u", Range::ALL, User).unwrap();
    env.declare("v", Range::new(i64::MIN, 3), User).unwrap();
    let s = env.fresh("s");
    env.equate(&s, &p("batch*seq")).unwrap();
    let t = env.fresh("s");
    env.declare("t_lim", Range::new(0, 1000), Param).unwrap();
    env.equate(&t, &p("min(seq, 64)/2 + batch")).unwrap();
    env.equate(&sym("t_lim"), &p("u*u + (w-1)/2")).unwrap();
    env.equate(&p("2*u"), &p("batch*w")).unwrap();
    env.declare("s0", Range::new(0, 4096), Fresh).unwrap();
    env.equate(&p("-v"), &p("(w+7)%3 + 9")).unwrap();
    let text = env.to_string();
    assert!(text.contains("sym seq user 8..512 divisible by 8"), "{text}");
    assert!(text.contains("let s0 = batch*seq"), "{text}");
    assert!(text.contains("assert"), "{text}");
    let back = roundtrip(&env);
    for (a, b) in [("s0", "seq*batch"), ("s1", "batch+min(seq,64)/2"), ("2*u", "w*batch")] {
        assert!(back.equal(&p(a), &p(b)) && env.equal(&p(a), &p(b)), "{a} == {b}\n{text}");
    }
    assert_eq!(back.range(&p("s0")), env.range(&p("s0")));
    // Bad lines.
    let mut e = ShapeEnv::new();
    for bad in [
        "",
        "sym",
        "sym a",
        "sym a user",
        "sym a boss 1..2",
        "sym a user 1-2",
        "sym a user 5..1",
        "sym a user 1..2 divisible",
        "sym a user 1..2 divisible by x",
        "sym a user 1..2 divisible by 0",
        "sym 2a user 1..2",
        "let",
        "let a",
        "let = b",
        "let a = ",
        "let a = a+1",
        "let max = 1",
        "assert",
        "assert a",
        "assert a == ",
        "assert a in 1-2",
        "bogus",
    ] {
        assert!(e.parse_fact(bad).is_err(), "`{bad}` was accepted");
    }
    e.parse_fact("sym a user 1..2").unwrap();
    assert!(e.parse_fact("let a = 3").is_err());
    e.parse_fact("let b = a+1").unwrap();
    assert!(e.parse_fact("let b = 3").is_err());
    // A hand-written chain of lets keeps substitutions in surviving symbols.
    let mut e = ShapeEnv::new();
    e.parse_fact("let x = y+1").unwrap();
    e.parse_fact("let y = 2*z").unwrap();
    assert_eq!(e.normalize(&sym("x")), p("2*z+1"));
}

// ------------------------------------------------------------ properties

const BASE: [&str; 3] = common::NAMES;

/// A random env that an assignment `sigma` satisfies, with the equalities it was
/// told.
#[derive(Clone, Debug)]
struct Scenario {
    /// Values of a, b, c.
    base: [i64; 3],
    /// (lo, hi) offsets of each base symbol's declared range around its value, and
    /// its divisor (a divisor of its value).
    base_ranges: Vec<(i64, i64, i64, SymOrigin)>,
    /// Derived symbols `t{i}`: a defining expression over a, b, c (and earlier
    /// `t`s through `shift`), range slack, origin, and how to equate.
    derived: Vec<(T, (i64, i64), SymOrigin, u8)>,
    /// Extra equalities between derived symbols with equal values, by index.
    extra: Vec<(usize, usize)>,
}

fn origin() -> impl Strategy<Value = SymOrigin> {
    prop_oneof![Just(User), Just(Param), Just(Fresh)]
}

fn small_tree() -> impl Strategy<Value = T> {
    common::tree_sized(3, 8)
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (
        [-8i64..24, -8i64..24, 0i64..24],
        prop::collection::vec(
            (0i64..6, 0i64..6, prop_oneof![Just(1i64), Just(2), Just(3), Just(4)], origin()),
            3,
        ),
        prop::collection::vec((small_tree(), (0i64..4, 0i64..4), origin(), 0u8..6), 0..6),
        prop::collection::vec((0usize..6, 0usize..6), 0..4),
    )
        .prop_map(|(base, base_ranges, derived, extra)| Scenario { base, base_ranges, derived, extra })
}

struct Built {
    env: ShapeEnv,
    /// Every symbol's value.
    sigma: BTreeMap<String, i64>,
    /// Every equality told to the env.
    pairs: Vec<(SymExpr, SymExpr)>,
    /// Declared ranges and divisors.
    decls: Vec<(String, Range, i64)>,
}

fn lookup(m: &BTreeMap<String, i64>) -> impl Fn(&str) -> Option<i64> + '_ {
    move |s| m.get(s).copied()
}

fn build(sc: &Scenario) -> Result<Built, TestCaseError> {
    let mut env = ShapeEnv::new();
    let mut sigma = BTreeMap::new();
    let mut pairs = Vec::new();
    let mut decls = Vec::new();
    for (i, name) in BASE.iter().enumerate() {
        let v = sc.base[i];
        let (lo, hi, d, o) = sc.base_ranges[i];
        let d = if v % d == 0 { d } else { 1 };
        let r = Range::new(v - lo, v + hi);
        env.declare(name, r, o).map_err(|e| TestCaseError::fail(format!("declare: {e}")))?;
        env.set_divisor(name, d)
            .map_err(|e| TestCaseError::fail(format!("set_divisor({name}, {d}) in {r}: {e}")))?;
        sigma.insert(name.to_string(), v);
        decls.push((name.to_string(), r, d));
    }
    let mut derived_vals = Vec::new();
    for (i, (t, (lo, hi), o, how)) in sc.derived.iter().enumerate() {
        let e = t.build().map_err(|e| TestCaseError::reject(format!("{e}")))?;
        let Ok(v) = e.eval(&lookup(&sigma)) else { return Err(TestCaseError::reject("overflow")) };
        let name = format!("t{i}");
        let r = Range::new(v - lo, v + hi);
        env.declare(&name, r, *o).map_err(|e| TestCaseError::fail(format!("declare: {e}")))?;
        let s = sym(&name);
        // Different shapes of the same fact.
        let (x, y) = match how {
            0 => (s.clone(), e.clone()),
            1 => (e.clone(), s.clone()),
            2 => (s.try_scale(3).unwrap(), e.try_scale(3).unwrap()),
            3 => (s.try_add(&lit(5)).unwrap(), e.try_add(&lit(5)).unwrap()),
            4 => (e.try_sub(&s).unwrap(), lit(0)),
            _ => (s.try_mul(&sym("a")).unwrap(), e.try_mul(&sym("a")).unwrap()),
        };
        env.equate(&x, &y).map_err(|err| {
            TestCaseError::fail(format!("equate({x}, {y}) failed though satisfiable: {err}\n{env}"))
        })?;
        sigma.insert(name.clone(), v);
        decls.push((name, r, 1));
        pairs.push((x, y));
        derived_vals.push(v);
    }
    for (i, j) in &sc.extra {
        let (Some(vi), Some(vj)) = (derived_vals.get(*i), derived_vals.get(*j)) else { continue };
        let (x, y) = (sym(&format!("t{i}")), sym(&format!("t{j}")));
        let (x, y) =
            if vi == vj { (x, y) } else { (x.try_sub(&lit(*vi)).unwrap(), y.try_sub(&lit(*vj)).unwrap()) };
        env.equate(&x, &y).map_err(|err| TestCaseError::fail(format!("equate({x}, {y}): {err}\n{env}")))?;
        pairs.push((x, y));
    }
    Ok(Built { env, sigma, pairs, decls })
}

fn facts_of(sigma: &BTreeMap<String, i64>) -> Vec<DimFact> {
    sigma.iter().map(|(k, v)| DimFact { expr: sym(k), value: *v, what: format!("dim {k}") }).collect()
}

fn query_exprs(ts: &[T], built: &Built) -> Vec<SymExpr> {
    let n = built.sigma.len();
    ts.iter()
        .enumerate()
        .filter_map(|(i, t)| {
            let e = t.build().ok()?;
            // Mix in a derived symbol now and then.
            let extra = format!("t{}", i % n.max(1));
            if built.sigma.contains_key(&extra) && i % 2 == 0 {
                e.try_add(&sym(&extra)).ok()
            } else {
                Some(e)
            }
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(600), ..ProptestConfig::default() })]

    /// Everything told is satisfiable, so nothing may be a contradiction; the
    /// satisfying assignment binds; queries agree with it.
    #[test]
    fn env_is_sound_and_complete(sc in scenario(), qs in prop::collection::vec(common::tree_sized(4, 16), 1..8),
                                 k in 1i64..9) {
        let built = build(&sc)?;
        let (env, sigma) = (&built.env, &built.sigma);
        // The satisfying assignment is accepted, by check and by bind.
        let mut full = anyshape_sym::Bindings::default();
        for (k, v) in sigma {
            full.insert(k, *v);
        }
        prop_assert!(env.check(&full).is_ok(), "check rejects a satisfying assignment: {:?}\n{}", env.check(&full), env);
        let b = env.bind(&facts_of(sigma));
        prop_assert!(b.is_ok(), "bind rejects a satisfying assignment {:?}: {:?}\n{}", sigma, b, env);
        let b = b.unwrap();
        for (k, v) in sigma {
            prop_assert_eq!(b.get(k), Some(*v));
        }
        // Binding only the surviving symbols determines every other one.
        let surv: Vec<DimFact> = env.symbols().iter().map(|i| {
            DimFact { expr: sym(&i.name), value: sigma[&*i.name], what: i.name.to_string() }
        }).collect();
        let b = env.bind(&surv);
        prop_assert!(b.is_ok(), "{:?}", b);
        let b = b.unwrap();
        for (k, v) in sigma {
            prop_assert_eq!(b.get(k), Some(*v), "{}\n{}", k, env);
        }
        // Queries.
        let exprs = query_exprs(&qs, &built);
        for e in &exprs {
            let Ok(v) = e.eval(&lookup(sigma)) else { continue };
            let r = env.range(e);
            prop_assert!(r.contains(v), "range({}) = {} misses {}\n{}", e, r, v, env);
            if env.divides(k, e) {
                prop_assert!(v % k == 0, "divides({}, {}) but it is {}\n{}", k, e, v, env);
            }
            prop_assert_eq!(env.eval(e, &b), Ok(v));
            for f in &exprs {
                let Ok(w) = f.eval(&lookup(sigma)) else { continue };
                if env.known_le(e, f) {
                    prop_assert!(v <= w, "known_le({}, {}) but {} > {}\n{}", e, f, v, w, env);
                }
                if env.known_lt(e, f) {
                    prop_assert!(v < w);
                }
                if env.known_ne(e, f) {
                    prop_assert!(v != w);
                }
                if env.equal(e, f) {
                    prop_assert_eq!(v, w, "equal({}, {})\n{}", e, f, env);
                }
            }
        }
        // Every told equality is provable, unless substitution built nested
        // divisions, whose canonical form is not unique (see `SymExpr`'s docs).
        for (x, y) in &built.pairs {
            let nested = |e: &SymExpr| env.normalize(e).to_string().matches(['/', '%']).count() > 1;
            if !nested(x) && !nested(y) {
                prop_assert!(env.equal(x, y), "told {} == {} but not equal\n{}", x, y, env);
            }
        }
        // The text form round-trips and means the same.
        let text = env.to_string();
        let mut back = ShapeEnv::new();
        for line in text.lines() {
            let r = back.parse_fact(line);
            prop_assert!(r.is_ok(), "`{}`: {:?}\n{}", line, r, text);
        }
        prop_assert_eq!(back.to_string(), text.clone());
        prop_assert!(back.bind(&facts_of(sigma)).is_ok());
        for (x, y) in &built.pairs {
            prop_assert_eq!(back.equal(x, y), env.equal(x, y));
        }
    }

    /// Any binding accepted satisfies every told fact.
    #[test]
    fn accepted_bindings_satisfy_every_fact(sc in scenario(), which in 0usize..12, delta in -3i64..4,
                                            which2 in 0usize..12, delta2 in -2i64..3) {
        let built = build(&sc)?;
        let mut sigma = built.sigma.clone();
        let names: Vec<String> = sigma.keys().cloned().collect();
        *sigma.get_mut(&names[which % names.len()]).unwrap() += delta;
        *sigma.get_mut(&names[which2 % names.len()]).unwrap() += delta2;
        let accepted = |ok: bool, how: &str| -> Result<(), TestCaseError> {
            if !ok {
                return Ok(());
            }
            for (x, y) in &built.pairs {
                let (xv, yv) = (x.eval(&lookup(&sigma)), y.eval(&lookup(&sigma)));
                prop_assert_eq!(xv, yv, "{} accepted {:?} but {} != {}\n{}", how, sigma, x, y, built.env);
            }
            for (n, r, d) in &built.decls {
                let v = sigma[n];
                prop_assert!(r.contains(v) && v % d == 0, "{} accepted {} = {} (range {}, divisor {})\n{}",
                    how, n, v, r, d, built.env);
            }
            Ok(())
        };
        accepted(built.env.bind(&facts_of(&sigma)).is_ok(), "bind")?;
        let mut full = anyshape_sym::Bindings::default();
        for (k, v) in &sigma {
            full.insert(k, *v);
        }
        accepted(built.env.check(&full).is_ok(), "check")?;
    }
}

#[test]
fn equating_a_symbol_with_its_min_bounds_its_range() {
    let mut env = ShapeEnv::new();
    let seq = env.declare("seq", Range::new(1, 1 << 31), SymOrigin::Param).expect("declare");
    let m = parse_expr("min(64, seq)").expect("parse");
    assert!(!env.equal(&m, &seq));
    env.equate(&seq, &m).expect("equate");
    assert_eq!(env.symbol("seq").expect("seq").range, Range::new(1, 64));
    assert!(env.equal(&m, &seq));
    assert_eq!(
        env.simplify(&parse_expr("2*min(64, seq)+max(0, seq-1)").expect("parse")),
        parse_expr("2*seq+seq-1").expect("p")
    );
    // max gives a lower bound; a bound outside the range is a contradiction.
    env.equate(&seq, &parse_expr("max(8, seq)").expect("parse")).expect("equate max");
    assert_eq!(env.symbol("seq").expect("seq").range, Range::new(8, 64));
    assert!(env.equate(&seq, &parse_expr("min(4, seq)").expect("parse")).is_err());
}

// ------------------------------------------------------------ broadcasts

/// A dim declared to broadcast is `to` or 1 at run time: both bind, anything
/// else is a violation naming the rule; the declaration survives printing, and
/// a later equality of the two makes it a plain equality.
#[test]
fn a_broadcast_dim_is_equal_or_one() {
    let mut env = env_with(&[("n", 1, 100, Param), ("k", 1, 100, Param)]);
    assert!(!env.broadcastable(&sym("k"), &sym("n")));
    env.allow_broadcast(&sym("k"), &sym("n"), "k broadcasts to n");
    assert!(env.broadcastable(&sym("k"), &sym("n")));
    assert!(!env.broadcastable(&sym("n"), &sym("k")), "the declaration has a direction");
    assert!(!env.equal(&sym("k"), &sym("n")), "a broadcast is not an equality");
    let back = roundtrip(&env);
    assert!(back.broadcastable(&sym("k"), &sym("n")));
    for (n, k) in [(5, 5), (5, 1), (1, 1)] {
        env.bind(&[fact("input x dim 0", "n", n), fact("input y dim 0", "k", k)]).expect("binds");
    }
    let m = violation(env.bind(&[fact("input x dim 0", "n", 5), fact("input y dim 0", "k", 2)]));
    assert!(m.contains("k broadcasts to n") && m.contains("k = 2") && m.contains("n = 5"), "{m}");
    env.equate(&sym("k"), &sym("n")).unwrap();
    assert!(env.broadcastable(&sym("k"), &sym("n")));
}
