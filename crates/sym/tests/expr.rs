//! `SymExpr`: canonical form, printing, parsing, overflow, and property tests
//! against a naive evaluator.

mod common;

use anyshape_sym::{lit, parse_expr, sym, SymError, SymExpr};
use common::{big_tree, cases, eval_sym, tree, T};
use proptest::prelude::*;

fn p(s: &str) -> SymExpr {
    parse_expr(s).unwrap_or_else(|e| panic!("parse `{s}`: {e}"))
}

fn roundtrip(e: &SymExpr) {
    let text = e.to_string();
    let back = parse_expr(&text).unwrap_or_else(|err| panic!("`{text}` does not parse back: {err}"));
    assert_eq!(&back, e, "`{text}` parses back to `{back}`");
}

// ------------------------------------------------------------ canonical form

#[test]
fn canonical_examples() {
    let (batch, seq, h, x) = (sym("batch"), sym("seq"), sym("h"), sym("x"));
    assert_eq!((batch.clone() * seq.clone() * 12).try_floor_div(12).unwrap(), seq.clone() * batch.clone());
    assert_eq!(p("batch*seq*12/12"), p("seq*batch"));
    assert_eq!((h.clone() * 2 + 1).try_floor_div(2).unwrap(), h);
    assert_eq!(p("(2*h+1)/2"), p("h"));
    assert_eq!(p("(h+3)/2"), p("(h+1)/2 + 1"));
    assert_eq!((h.clone() + 3).try_floor_div(2).unwrap(), (h.clone() + 1).try_floor_div(2).unwrap() + 1);
    assert_eq!(x.try_floor_div(4).unwrap().try_floor_div(2).unwrap(), x.try_floor_div(8).unwrap());
    assert_eq!(p("(x/4)/2"), p("x/8"));
    assert_eq!(p("(4*x+2)%4"), p("((2*x+1)%2)*2"));
    assert_eq!(p("(4*x+2)%4"), lit(2));
    assert_eq!(p("(4*x+6)%8"), p("((2*x+3)%4)*2"));
    assert_eq!(p("(6*x)/4"), p("(3*x)/2"));
    assert_eq!(p("(6*x+2)/4"), p("(3*x+1)/2"));
    assert_eq!(p("(x%8)%4"), p("x%4"));
    assert_eq!(p("(x%4)%8"), p("x%4"));
    assert_eq!(p("(x%4)/4"), lit(0));
    assert_eq!(p("x%1"), lit(0));
    assert_eq!(p("x/1"), x);
    assert_eq!(p("(-7)/2"), lit(-4));
    assert_eq!(p("(-7)%2"), lit(1));
    assert_eq!(p("(0-7)%3"), lit(2));
    // Euclidean: floor((-x-1)/2) = -x-1 + floor((x+1)/2).
    assert_eq!(p("(-x-1)/2"), p("(x+1)/2 - x - 1"));
    assert_eq!(p("(-x-1)/2").eval(&|_| Some(0)), Ok(-1));
    assert_eq!(p("(-x-1)%2"), p("(x+1)%2"));
    assert_eq!(p("(2*x-1)/2"), p("x-1"));
    assert_eq!(p("(2*x-1)%2"), lit(1));
    assert_eq!(p("a*(b+c)"), p("a*b+c*a"));
    assert_eq!(p("(a+b)*(a-b)"), p("a*a-b*b"));
    assert_eq!(p("x - x"), lit(0));
    assert_eq!(x.try_ceil_div(4).unwrap(), p("(x+3)/4"));
    assert_eq!(p("(x+3)/4*4 + (x+3)%4").eval(&|_| Some(-6)), Ok(-3));
    assert_eq!(p("(h + w/2)/4"), p("(2*h + w)/8"));
    assert_eq!(p("((a+1)/4+2)/3"), p("(a+9)/12"));
    assert_eq!(p("(a + 3*(b%8))%4"), p("(a+3*b)%4"));
    assert_eq!(p("(x/2)%3").to_string(), "x/2%3");
}

#[test]
fn min_max_folding() {
    assert_eq!(p("min(3, 5)"), lit(3));
    assert_eq!(p("max(3, 5, -2)"), lit(5));
    assert_eq!(p("min(x, x+1)"), p("x"));
    assert_eq!(p("max(x, x+1)"), p("x+1"));
    assert_eq!(p("min(x, x)"), p("x"));
    assert_eq!(p("min(a, min(b, c))"), p("min(min(c, a), b)"));
    assert_eq!(p("max(a, max(b, 4), 3)"), p("max(4, b, a)"));
    assert_eq!(p("min(a, b)"), p("min(b, a)"));
    assert_eq!(p("min(a+2, b, a)"), p("min(b, a)"));
    assert_eq!(p("min(a)"), p("a"));
    // min inside max is not flattened; printing sorts the arguments.
    assert_eq!(p("max(min(a, b), c)").to_string(), "max(c, min(a, b))");
    assert_eq!(p("max(a+2, b+1)"), p("max(a+1, b)+1"));
    assert_eq!(p("max(a+2, b+1)").to_string(), "max(a+1, b)+1");
    assert_eq!(p("max(max(a, b)-1, c)"), p("max(a-1, b-1, c)"));
    assert_eq!(p("min(seq, 512)").to_string(), "min(512, seq)");
    assert_ne!(p("max(min(a, b), c)"), p("max(a, b, c)"));
    let (a, b) = (sym("a"), sym("b"));
    assert_eq!(a.min(&b), p("min(a, b)"));
    assert_eq!(a.max(&b), p("max(b, a)"));
    assert_eq!(lit(4).max(&lit(9)), lit(9));
    // On owned values too: `SymExpr` has no `Ord`, whose `max` would compare
    // structure instead.
    assert_eq!(sym("b").max(&sym("a")), p("max(a, b)"));
    assert_eq!(lit(9).min(&lit(4)), lit(4));
    assert_eq!(sym("a").canonical_cmp(&sym("b")), std::cmp::Ordering::Less);
}

#[test]
fn accessors() {
    assert_eq!(lit(0).as_const(), Some(0));
    assert_eq!(lit(-3).as_const(), Some(-3));
    assert_eq!(sym("a").as_const(), None);
    assert_eq!(sym("a").as_symbol(), Some("a"));
    assert_eq!(p("2*a").as_symbol(), None);
    assert_eq!(p("a+1").as_symbol(), None);
    assert_eq!(p("a*b+7").constant_term(), 7);
    assert_eq!(p("a*b").constant_term(), 0);
    let s: Vec<String> = p("min(a, b/2)*c + d%3").symbols().iter().map(|s| s.to_string()).collect();
    assert_eq!(s, ["a", "b", "c", "d"]);
    let (k, rest) = p("3*a+b*c+1").linear_in("a").unwrap();
    assert_eq!((k, rest), (3, p("b*c+1")));
    assert!(p("a*a+a").linear_in("a").is_none());
    assert!(p("a+a/2").linear_in("a").is_none());
    assert!(p("b").linear_in("a").is_none());
    assert_eq!(SymExpr::default(), lit(0));
    assert_eq!(SymExpr::from(5), lit(5));
}

#[test]
fn substitute_and_eval() {
    let e = p("(a+1)/2 + min(a, b)*c");
    let s = e.substitute(&|n| (n == "a").then(|| p("2*b+1"))).unwrap();
    assert_eq!(s, p("b+1 + min(2*b+1, b)*c"));
    let v = s.eval(&|n| match n {
        "b" => Some(3),
        "c" => Some(-2),
        _ => None,
    });
    assert_eq!(v, Ok(4 - 6));
    assert_eq!(p("a+b").eval(&|n| (n == "a").then_some(1)), Err(SymError::Unbound("b".into())));
    assert_eq!(p("(0-7)/2").eval(&|_| None), Ok(-4));
    assert_eq!(p("x/2").eval(&|_| Some(-7)), Ok(-4));
    assert_eq!(p("x%3").eval(&|_| Some(-7)), Ok(2));
    assert_eq!(p("x*x*x").eval(&|_| Some(-3)), Ok(-27));
}

// ------------------------------------------------------------ printing

#[test]
fn printing() {
    let cases = [
        ("batch*seq", "batch*seq"),
        ("(h+1)/2", "(h+1)/2"),
        ("2*(h/2)", "2*(h/2)"),
        ("-(h/2)", "-h/2"),
        ("h-1", "h-1"),
        ("2*n-1", "2*n-1"),
        ("1-n", "-n+1"),
        ("0", "0"),
        ("-5", "-5"),
        ("min(a, 4)", "min(4, a)"),
        ("a*(h/2)", "a*(h/2)"),
        ("(h/2)*a", "a*(h/2)"),
    ];
    for (src, want) in cases {
        let e = p(src);
        let text = e.to_string();
        // The exact text may order factors differently, but must re-parse to `e`.
        roundtrip(&e);
        if want != text {
            // Only the orderings may differ; compare after parsing.
            assert_eq!(p(want), e, "`{src}` printed `{text}`, expected like `{want}`");
        }
    }
    assert_eq!(p("batch*seq").to_string(), "batch*seq");
    assert_eq!(p("(h+1)/2").to_string(), "(h+1)/2");
    assert_eq!(p("2*(h/2)").to_string(), "2*(h/2)");
    assert_eq!(format!("{:?}", p("a+1")), "SymExpr(a+1)");
}

#[test]
fn printing_tricky_roundtrips() {
    let tricky = [
        "-(h/2)",
        "-(h%3)",
        "-2*(h/2)",
        "a-h/2",
        "a-(h/2)*b",
        "-(h/2)*b",
        "-(h/2)*(h/2)",
        "(h/2)*(h/2)",
        "-(a*b)/3",
        "-((a*b)/3)",
        "(0-a)/3",
        "((a/3)*b)/5",
        "(3*(x/4))/5",
        "(x/2)%3",
        "(x%3)/2",
        "((x%3)*y)/4",
        "min(-a, -b)/2",
        "-min(a, b)",
        "-max(a, -b)*c",
        "min(a, b)%3 - max(a/2, b%2)",
        "-a-b-1",
        "-a*b*c+a*a*a-7",
        "9223372036854775807*a",
        "-9223372036854775807*a - a",
        "-9223372036854775807 - 1",
        "b - 9223372036854775807*a - a",
        "b - 9223372036854775807 - 1",
        "(0-9223372036854775807-1)*(a/2)",
        "x/4611686018427387904/4",
        "min(0-9223372036854775807-1, a)",
    ];
    for s in tricky {
        roundtrip(&p(s));
    }
    // i64::MIN as a constant and as coefficients.
    let m = lit(i64::MIN);
    roundtrip(&m);
    roundtrip(&sym("a").try_scale(i64::MIN).unwrap());
    roundtrip(&sym("a").try_scale(i64::MIN).unwrap().try_add(&lit(i64::MIN)).unwrap());
    roundtrip(
        &sym("a").try_scale(i64::MIN).unwrap().try_add(&sym("b").try_scale(i64::MIN).unwrap()).unwrap(),
    );
    roundtrip(&lit(i64::MAX));
}

#[test]
fn parse_errors_never_panic() {
    let bad = [
        "",
        " ",
        "+",
        "-",
        "--a",
        "a+",
        "a*",
        "a/",
        "a%",
        "a/0",
        "a%0",
        "a/b",
        "a%b",
        "a/(b-b)",
        "a/-2",
        "a/(0-2)",
        "(a",
        "a)",
        "((a)",
        "(a))",
        ")(",
        "min(",
        "min()",
        "min(a,",
        "min(a b)",
        "max(a,)",
        "a b",
        "2a",
        "@",
        "a+@",
        "é",
        "aé",
        "a..b",
        "1e5",
        "0x10",
        "99999999999999999999",
        "9223372036854775808",
        "a*9223372036854775808",
        "min",
        "max",
        "min+1",
        "2*max",
        "a,b",
        "min(a)(b)",
        "a/2/0",
        "(",
        ")",
        "a^2",
        "a==b",
    ];
    for s in bad {
        let r = std::panic::catch_unwind(|| parse_expr(s));
        match r {
            Ok(Err(_)) => {}
            Ok(Ok(e)) => panic!("`{s}` parsed as `{e}`"),
            Err(_) => panic!("`{s}` panicked"),
        }
    }
    assert!(matches!(parse_expr("a/0"), Err(SymError::Parse { .. })));
    assert!(matches!(parse_expr("a/b"), Err(SymError::Parse { .. })));
    assert!(matches!(parse_expr("(a"), Err(SymError::Parse { .. })));
    // Deep nesting is an error, not a stack overflow.
    let deep = format!("{}a{}", "(".repeat(100_000), ")".repeat(100_000));
    assert!(parse_expr(&deep).is_err());
    let deep_min = format!("{}a{}", "min(".repeat(50_000), ")".repeat(50_000));
    assert!(parse_expr(&deep_min).is_err());
    // Moderate nesting is fine.
    let ok = format!("{}a{}", "(".repeat(100), ")".repeat(100));
    assert_eq!(parse_expr(&ok).unwrap(), sym("a"));
    // Overflow while parsing is reported as overflow.
    assert_eq!(parse_expr("9223372036854775807 + 1"), Err(SymError::Overflow));
    assert_eq!(parse_expr("9223372036854775807"), Ok(lit(i64::MAX)));
    assert_eq!(parse_expr("  a  *  b  "), Ok(sym("a") * sym("b")));
}

// ------------------------------------------------------------ overflow

#[test]
fn overflow_is_an_error_never_a_panic() {
    let a = sym("a");
    let big = lit(i64::MAX);
    assert_eq!(big.try_add(&lit(1)), Err(SymError::Overflow));
    assert_eq!(lit(i64::MIN).try_sub(&lit(1)), Err(SymError::Overflow));
    assert_eq!(lit(i64::MIN).try_scale(-1), Err(SymError::Overflow));
    assert_eq!(a.try_scale(i64::MAX).unwrap().try_scale(2), Err(SymError::Overflow));
    assert_eq!(a.try_scale(i64::MAX).unwrap().try_mul(&a.try_scale(2).unwrap()), Err(SymError::Overflow));
    assert_eq!(a.try_scale(i64::MAX).unwrap().try_add(&a), Err(SymError::Overflow));
    assert_eq!(a.try_scale(i64::MIN).unwrap().try_sub(&a), Err(SymError::Overflow));
    assert!(a.try_scale(i64::MIN).unwrap().try_scale(-1).is_err());
    assert_eq!(a.try_add(&lit(i64::MIN)).unwrap().try_ceil_div(2), Err(SymError::Overflow));
    assert_eq!(a.try_add(&big).unwrap().try_ceil_div(2), Ok(p("a/2").try_add(&lit(1 << 62)).unwrap()));
    // Divisors.
    assert_eq!(a.try_floor_div(0), Err(SymError::NonPositiveDivisor(0)));
    assert_eq!(a.try_floor_div(-3), Err(SymError::NonPositiveDivisor(-3)));
    assert_eq!(a.try_rem(0), Err(SymError::NonPositiveDivisor(0)));
    assert_eq!(a.try_rem(i64::MIN), Err(SymError::NonPositiveDivisor(i64::MIN)));
    assert_eq!(a.try_ceil_div(0), Err(SymError::NonPositiveDivisor(0)));
    assert_eq!(a.try_ceil_div(i64::MIN), Err(SymError::NonPositiveDivisor(i64::MIN)));
    // Huge divisors work.
    assert_eq!(a.try_floor_div(i64::MAX).unwrap().to_string(), format!("a/{}", i64::MAX));
    assert_eq!(lit(i64::MIN).try_floor_div(i64::MAX), Ok(lit(-2)));
    assert_eq!(lit(i64::MIN).try_rem(i64::MAX), Ok(lit(i64::MAX - 1)));
    assert_eq!(lit(i64::MAX).try_ceil_div(i64::MAX), Ok(lit(1)));
    assert_eq!(
        a.try_scale(i64::MIN).unwrap().try_floor_div(i64::MAX),
        a.try_scale(-2)
            .unwrap()
            .try_add(&a.try_scale(i64::MAX - 1).unwrap().try_floor_div(i64::MAX).unwrap())
    );
    // Nested division whose combined divisor overflows: still exact.
    let e = a.try_floor_div(1 << 62).unwrap().try_floor_div(4).unwrap();
    assert_eq!(e.eval(&|_| Some(i64::MIN)), Ok(-1));
    assert_eq!(e.eval(&|_| Some(i64::MAX)), Ok(0));
    roundtrip(&e);
    // Powers: no panic, no endless loop.
    let mut sq = a.clone();
    for _ in 0..40 {
        sq = match sq.try_mul(&sq) {
            Ok(s) => s,
            Err(e) => {
                assert_eq!(e, SymError::Overflow);
                break;
            }
        };
    }
    assert!(sq.eval(&|_| Some(1)).is_ok());
    assert_eq!(sq.eval(&|_| Some(2)), Err(SymError::Overflow));
    // eval.
    let e = a.try_scale(i64::MAX).unwrap();
    assert_eq!(e.eval(&|_| Some(2)), Err(SymError::Overflow));
    assert_eq!(e.eval(&|_| Some(-1)), Ok(-i64::MAX));
    assert_eq!(p("a*a").eval(&|_| Some(1 << 32)), Err(SymError::Overflow));
    assert_eq!(p("a+b").eval(&|n| Some(if n == "a" { i64::MAX } else { 1 })), Err(SymError::Overflow));
    assert_eq!(p("a/2").eval(&|_| Some(i64::MIN)), Ok(i64::MIN / 2));
    assert_eq!(p("a%7").eval(&|_| Some(i64::MIN)), Ok(i64::MIN.rem_euclid(7)));
    assert_eq!(p("min(a, 0-a)").eval(&|_| Some(i64::MIN)), Err(SymError::Overflow));
}

// ------------------------------------------------------------ properties

fn bindings(neg: bool) -> impl Strategy<Value = [i64; 3]> {
    let r = if neg { -20i64..20 } else { 0i64..20 };
    [r.clone(), r.clone(), r]
}

fn check_eval(t: &T, e: &SymExpr, v: &[i64; 3]) -> Result<(), TestCaseError> {
    if let (Some(want), Ok(got)) = (t.eval(v), eval_sym(e, v)) {
        prop_assert_eq!(got, want, "{:?} canonical `{}` at {:?}", t, e, v);
    }
    Ok(())
}

// A case whose tree overflows i64 while it is built checks nothing: it is
// rejected, not passed, so each test runs its number of cases that do check,
// and fails after too many rejections.
proptest! {
    #![proptest_config(ProptestConfig { cases: cases(1500), ..ProptestConfig::default() })]

    #[test]
    fn canonical_agrees_with_naive_eval(t in tree(), vs in prop::collection::vec(bindings(true), 8)) {
        let Ok(e) = t.build() else { return Err(TestCaseError::reject("the tree overflows i64")) };
        for v in &vs {
            check_eval(&t, &e, v)?;
        }
    }

    #[test]
    fn canonical_agrees_with_naive_eval_nonneg(t in tree(), vs in prop::collection::vec(bindings(false), 8)) {
        let Ok(e) = t.build() else { return Err(TestCaseError::reject("the tree overflows i64")) };
        for v in &vs {
            check_eval(&t, &e, v)?;
        }
    }

    #[test]
    fn big_trees(t in big_tree(), vs in prop::collection::vec(bindings(true), 4)) {
        let Ok(e) = t.build() else { return Err(TestCaseError::reject("the tree overflows i64")) };
        for v in &vs {
            check_eval(&t, &e, v)?;
        }
        if let Ok(b) = t.parse() {
            prop_assert_eq!(&b, &e);
        }
        let text = e.to_string();
        prop_assert_eq!(parse_expr(&text), Ok(e.clone()), "printed `{}`", text);
    }

    #[test]
    fn ops_and_parser_agree(t in tree()) {
        if let (Ok(a), Ok(b)) = (t.build(), t.parse()) {
            prop_assert_eq!(&a, &b, "text `{}`", t.text());
        }
        prop_assert!(t.parse().is_ok() || t.build().is_err(), "`{}` does not parse", t.text());
    }

    #[test]
    fn print_parse_roundtrip(t in tree()) {
        let Ok(e) = t.build() else { return Err(TestCaseError::reject("the tree overflows i64")) };
        let text = e.to_string();
        let back = parse_expr(&text);
        prop_assert_eq!(back, Ok(e.clone()), "printed `{}`", text);
    }

    #[test]
    fn print_parse_roundtrip_big_constants(t in tree(), k in prop_oneof![
        Just(i64::MIN), Just(i64::MIN + 1), Just(i64::MAX), Just(i64::MAX - 1), Just(1i64 << 62), Just(-(1i64 << 62))
    ]) {
        let es = [t.build().and_then(|e| e.try_scale(k)), t.build().and_then(|e| e.try_add(&lit(k)))];
        for e in es.into_iter().flatten() {
            let text = e.to_string();
            prop_assert_eq!(parse_expr(&text), Ok(e.clone()), "printed `{}`", text);
        }
    }
}

/// Identities of the symbolic algebra on random trees. A case whose terms
/// overflow i64 while being built or combined is an error by design and
/// checks nothing, so the test counts the cases that ran to the end and fails
/// below a floor (half of them).
#[test]
fn algebraic_identities() {
    use proptest::test_runner::{Config, TestRunner};
    let (done, overflowed) = (std::cell::Cell::new(0u32), std::cell::Cell::new(0u32));
    let total = cases(1500);
    let mut runner = TestRunner::new(Config { cases: total, ..Config::default() });
    runner
        .run(&(tree(), tree(), tree(), 1i64..13), |(x, y, z, k)| {
            let (Ok(x), Ok(y), Ok(z)) = (x.build(), y.build(), z.build()) else {
                overflowed.set(overflowed.get() + 1);
                return Ok(());
            };
            let r = (|| -> Result<(), SymError> {
                assert_eq!(x.try_add(&y)?, y.try_add(&x)?);
                assert_eq!(x.try_mul(&y)?, y.try_mul(&x)?);
                assert_eq!(x.try_add(&y)?.try_add(&z)?, x.try_add(&y.try_add(&z)?)?);
                assert_eq!(x.try_mul(&y)?.try_mul(&z)?, x.try_mul(&y.try_mul(&z)?)?);
                assert_eq!(x.try_mul(&y.try_add(&z)?)?, x.try_mul(&y)?.try_add(&x.try_mul(&z)?)?);
                assert_eq!(x.try_scale(k)?.try_floor_div(k)?, x.clone());
                assert_eq!(x.try_scale(k)?.try_rem(k)?, lit(0));
                assert_eq!(x.try_sub(&x)?, lit(0));
                assert_eq!(x.try_add(&y)?.try_sub(&y)?, x.clone());
                assert_eq!(x.try_scale(-1)?.try_scale(-1)?, x.clone());
                assert_eq!(x.min(&y), y.min(&x));
                assert_eq!(x.max(&y), y.max(&x));
                assert_eq!(x.min(&y).min(&z), x.min(&y.min(&z)));
                assert_eq!(x.max(&y).max(&z), x.max(&y.max(&z)));
                assert_eq!(x.min(&x), x.clone());
                assert_eq!(x.min(&x.try_add(&lit(k))?), x.clone());
                assert_eq!(x.max(&x.try_sub(&lit(k))?), x.clone());
                // floor(floor(x/a)/b) = floor(x/(a*b)); x % (a*b) % a = x % a.
                // Structural only when `x` holds no division or remainder
                // (`(-(a/2))/2/3` and `(-(a/2))/6` are equal, but have different forms,
                // as do `2*(a%3)/3` and `5*(a%3)/7`); always by value.
                let (l, r) = (x.try_floor_div(k)?.try_floor_div(3)?, x.try_floor_div(3 * k)?);
                if !x.to_string().contains(['/', '%']) {
                    assert_eq!(l, r);
                }
                for v in [[-7, 3, 11], [0, -1, 5], [13, 2, -9]] {
                    if let (Ok(lv), Ok(rv)) = (eval_sym(&l, &v), eval_sym(&r, &v)) {
                        assert_eq!(lv, rv, "{} vs {} at {:?}", l, r, v);
                    }
                }
                assert_eq!(x.try_rem(3 * k)?.try_rem(k)?, x.try_rem(k)?);
                assert_eq!(x.try_add(&lit(k))?.max(&y.try_add(&lit(k))?), x.max(&y).try_add(&lit(k))?);
                assert_eq!(x.try_sub(&lit(k))?.min(&y.try_sub(&lit(k))?), x.min(&y).try_sub(&lit(k))?);
                assert_eq!(
                    x.max(&y).try_sub(&lit(k))?.max(&z),
                    SymExpr::minmax(vec![x.try_sub(&lit(k))?, y.try_sub(&lit(k))?, z.clone()], true)
                );
                // Parsing the printed form of a sum of printed parts.
                let s = parse_expr(&format!("({x}) + ({y})*({z})")).unwrap();
                assert_eq!(s, x.try_add(&y.try_mul(&z)?)?);
                Ok(())
            })();
            match r {
                Ok(()) => done.set(done.get() + 1),
                Err(_) => overflowed.set(overflowed.get() + 1),
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
    println!("algebraic identities: {} cases checked, {} overflowed", done.get(), overflowed.get());
    assert!(
        done.get() * 2 >= total,
        "only {} of {total} cases checked ({} overflowed)",
        done.get(),
        overflowed.get()
    );
}
