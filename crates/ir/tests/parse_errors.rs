//! Parser error tests: bad text is an `IrError::Parse` naming the right line.

mod common;

use common::*;
use ir::*;

/// Parse `text` (no weights) and return the error's line and message.
fn err(text: &str) -> (usize, String) {
    match parse_graph(text, &|_| None) {
        Err(IrError::Parse { line, msg }) => (line, msg),
        other => panic!("expected a parse error, got {other:?}"),
    }
}

/// A valid graph with `line` as its second line.
fn with_line(line: &str) -> String {
    format!("graph {{\n{line}\n  output\n}}\n")
}

/// The error for a graph whose line 2 is `line`; asserts it is on line 2.
fn line2(line: &str) -> String {
    let (l, msg) = err(&with_line(line));
    assert_eq!(l, 2, "{msg}");
    msg
}

#[test]
fn header_and_footer() {
    assert_eq!(err(""), (1, "unexpected end of text: missing `}`".into()));
    assert_eq!(err("grap {\n}"), (1, "expected `graph {`".into()));
    assert_eq!(err("graph {\n  input %x: f32[2]\n"), (2, "unexpected end of text: missing `}`".into()));
    assert_eq!(err("graph {\n}\n"), (2, "missing `output` line".into()));
    assert_eq!(err("graph {\n  output\n}\n}\n"), (4, "text after the closing `}`".into()));
    assert_eq!(err("graph {\n  output\n  output\n}\n"), (3, "a second `output` line".into()));
}

#[test]
fn unknown_lines_and_ops() {
    assert!(line2("  frobnicate %x").starts_with("expected `%name: type = op`, `input`"));
    assert_eq!(line2("  %y: f32[2] = frob %x"), "unknown op `frob`");
    assert_eq!(line2("  %y: f32[2] = "), "expected an op name, found ``");
    assert_eq!(line2("  %y: f32[2] = neg[axis=0] %x"), "`neg` takes no attributes");
    assert_eq!(line2("  %y: f32[2] = transpose %x"), "`transpose` needs attributes `[...]`");
}

#[test]
fn types_and_dims() {
    assert_eq!(line2("  input %x: f33[2]"), "unknown dtype `f33`");
    assert_eq!(line2("  input %x f32[2]"), "expected `:`, found `f32[2]`");
    assert_eq!(line2("  input %x: f32[2"), "unclosed `[`");
    assert_eq!(line2("  input %x: f32(2]"), "expected `[`, found `(2]`");
    assert!(line2("  input %x: f32[2, (n]").starts_with("unclosed"));
    assert!(line2("  input %x: f32[n/0]").contains("positive integer divisor"));
    assert!(line2("  input %x: f32[n +* 2]").starts_with("cannot parse `n +* 2`"));
    assert!(line2("  input %x: f32[99999999999999999999]").contains("integer out of range"));
    assert_eq!(line2("  input %x: f32[2] extra"), "unexpected `extra`");
}

#[test]
fn names() {
    assert_eq!(line2("  input x: f32[2]"), "expected a value `%name`, found `x: f32[2]`");
    assert_eq!(line2("  input %: f32[2]"), "expected a name, found `: f32[2]`");
    assert_eq!(line2(r#"  input %"abc: f32[2]"#), "unterminated quoted name");
    assert_eq!(line2(r#"  input %"a\qb": f32[2]"#), "bad escape in a quoted name");
    assert_eq!(line2(r#"  input %"a\u{110000}": f32[2]"#), "bad `\\u{...}` escape in a quoted name");
    assert_eq!(line2(r#"  input %"a\u{41": f32[2]"#), "bad `\\u{...}` escape in a quoted name");
    assert_eq!(line2(r#"  input %"": f32[2]"#), "empty value name");
    let (l, msg) = err("graph {\n  input %x: f32[2]\n  %x: f32[2] = neg %x\n  output\n}");
    assert_eq!((l, msg.as_str()), (3, "%x is defined twice"));
    let (l, msg) = err("graph {\n  input %x: f32[2]\n  %y: f32[2] = add %x, %\"nope\"\n  output %y\n}");
    assert_eq!((l, msg.as_str()), (3, "%nope is not defined"));
    let (l, msg) = err("graph {\n  input %x: f32[2]\n  output %x, %z\n}");
    assert_eq!((l, msg.as_str()), (3, "%z is not defined"));
    assert_eq!(line2("  %y: f32[2] = add %x %x"), "unexpected `%x`");
    assert_eq!(line2("  %y: f32[2] = add %x,"), "expected a value `%name`, found ``");
}

#[test]
fn attributes() {
    assert_eq!(line2("  %y: f32[2] = iota[]"), "missing attribute `axis`");
    assert_eq!(line2("  %y: f32[2] = iota[axis=0, axis=0]"), "attribute `axis` given twice");
    assert_eq!(line2("  %y: f32[2] = iota[axis=0, ax=1]"), "unknown attribute `ax`");
    assert_eq!(line2("  %y: f32[2] = iota[axis=-1]"), "bad number `-1`");
    assert_eq!(line2("  %y: f32[2] = iota[axis]"), "expected `key=value`, found `axis`");
    assert_eq!(line2("  %y: f32[2] = transpose[perm=0] %x"), "expected a list `[...]`, found `0`");
    assert_eq!(line2("  %y: f32[2] = transpose[perm=[0)] %x"), "expected a list `[...]`, found `[0)`");
    assert_eq!(line2("  %y: f32[2] = transpose[perm=0) %x"), "`[` closed by `)`");
    assert_eq!(
        line2("  %y: f32[2] = cumsum[axis=0, exclusive=no, reverse=false] %x"),
        "expected `true` or `false`, found `no`"
    );
    assert_eq!(
        line2("  %y: f32[2] = slice[0 step 1] %x"),
        "expected `AXIS: START step STEP`, found `0 step 1`"
    );
    assert_eq!(
        line2("  %y: f32[2] = slice[0: 1 step] %x"),
        "expected `AXIS: START step STEP`, found `0: 1 step`"
    );
    assert_eq!(
        line2("  %y: f32[2] = pad[pads=[(1, 2, 3)], mode=edge] %x"),
        "expected `(BEFORE, AFTER)`, found `(1, 2, 3)`"
    );
    assert_eq!(
        line2("  %y: f32[2] = pad[pads=[(1, 2)], mode=zero] %x"),
        "expected `constant(VALUE)`, `reflect` or `edge`, found `zero`"
    );
    assert_eq!(line2("  %y: f32[2] = pad[pads=[(1, 2)], mode=constant(x)] %x"), "bad number `x`");
    assert_eq!(
        line2("  %y: f32[1, 1, 2] = avg_pool[kernel=[1], strides=[1], dilations=[1], pads_begin=[0], pads_end=[0]] %x"),
        "missing attribute `count_include_pad`"
    );
    assert_eq!(
        line2("  %y: f32[1, 1, 2] = max_pool[kernel=[1], strides=[1], dilations=[1], pads_begin=[0], pads_end=[0], count_include_pad=true] %x"),
        "unknown attribute `count_include_pad`"
    );
}

#[test]
fn constants() {
    assert_eq!(line2("  %c: f32[2] = constant [1.0]"), "f32[2] has 2 elements, 1 given");
    assert_eq!(line2("  %c: f32[2] = constant [1.0, x]"), "bad number `x`");
    assert_eq!(line2("  %c: f32[] = constant [1.0]"), "a scalar constant is written without brackets");
    assert_eq!(
        line2("  %c: f32[1] = constant 1.0"),
        "a constant of type f32[1] is written as a list `[...]`"
    );
    assert_eq!(line2("  %c: f32[] = constant"), "bad number ``");
    assert_eq!(line2("  %c: f32[] = constant 1.0 2.0"), "unexpected `2.0`");
    assert_eq!(
        line2("  %c: f32[n] = constant []"),
        "a constant's type needs non-negative constant dims, got f32[n]"
    );
    assert_eq!(
        line2("  %c: f32[-1] = constant []"),
        "a constant's type needs non-negative constant dims, got f32[-1]"
    );
    assert_eq!(line2("  %c: i8[] = constant 128"), "bad number `128`");
    assert_eq!(line2("  %c: bool[] = constant 1"), "expected `true` or `false`, found `1`");
    assert_eq!(line2("  %c: f16[] = constant 1.0"), "f16 elements are raw bits like `0x3c00`, found `1.0`");
    assert!(line2("  %c: f32[4294967296, 4294967296] = constant []").contains("too many elements"));
    assert_eq!(line2("  %c: f32[3, 3] = constant @w"), "no weight named `w`");
    assert_eq!(line2("  %c: f32[] = constant %x"), "bad number `%x`");
}

#[test]
fn weights_must_match_the_stated_type() {
    let w = f32s(&[2, 3], &[0.0; 6]);
    let look = |n: &str| (n == "w").then(|| w.clone());
    let text = with_line("  %c: f32[3, 2] = constant @w");
    match parse_graph(&text, &look) {
        Err(IrError::Parse { line: 2, msg }) => {
            assert_eq!(msg, "weight `w` is f32[2, 3], but the line says f32[3, 2]")
        }
        other => panic!("{other:?}"),
    }
    let text = with_line("  %c: f64[2, 3] = constant @w");
    assert!(matches!(parse_graph(&text, &look), Err(IrError::Parse { line: 2, .. })));
    let text = with_line("  %c: f32[2, 3] = constant @w");
    assert!(parse_graph(&text, &look).is_ok());
}

#[test]
fn shape_facts() {
    assert!(line2("  sym 9x param 1..").contains("not a valid symbol name"));
    assert!(line2("  sym n parm 1..").contains("origin must be user, param or fresh"));
    assert!(line2("  sym n param 5..1").contains("empty range"));
    assert!(line2("  let = n").contains("not a valid symbol name"));
    assert!(line2("  assert n").contains("expected `assert A == B`"));
    assert!(line2("  sym n param 1.. divisible by 0").contains("division by 0"));
}

#[test]
fn error_display_names_the_line() {
    let e = parse_graph("graph {\n  output %x\n}", &|_| None).unwrap_err();
    assert_eq!(e.to_string(), "text form, line 2: %x is not defined");
}
