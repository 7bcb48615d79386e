//! Golden before → after tests, one or more per pass, through the IR text form.

use anyshape_passes::{
    Cse, Dce, EliminateBroadcasts, FoldConstants, Pass, Pipeline, SimplifyAlgebra, SimplifyShapes,
};

fn parse(text: &str) -> ir::Graph {
    let g = ir::parse_graph(text, &|_| None).unwrap_or_else(|e| panic!("{e}\n{text}"));
    ir::verify(&g).unwrap_or_else(|e| panic!("{e}\n{text}"));
    g
}

/// Run `pass` until it changes nothing (as the pipeline does), check every
/// intermediate graph verifies and the result prints as `after`.
fn check(pass: &dyn Pass, before: &str, after: &str) {
    let mut g = parse(before);
    for round in 0.. {
        assert!(round < 10, "{} does not reach a fixpoint", pass.name());
        let n = pass.run(&mut g).unwrap_or_else(|e| panic!("{e}"));
        ir::verify(&g).unwrap_or_else(|e| panic!("{} left an invalid graph: {e}\n{g}", pass.name()));
        if n == 0 {
            break;
        }
    }
    assert_eq!(g.to_string(), after, "{}", pass.name());
    // The result reads back as itself.
    assert_eq!(parse(after).to_string(), after);
}

#[test]
fn dce_drops_unused_nodes() {
    check(
        &Dce,
        "graph {
  sym n param 1..
  input %x: f32[n]
  %unused: f32[n] = exp %x
  %y: f32[n] = neg %x
  output %y
}
",
        "graph {
  sym n param 1..
  input %x: f32[n]
  %y: f32[n] = neg %x
  output %y
}
",
    );
}

#[test]
fn fold_constants_evaluates_constant_subgraphs() {
    check(
        &FoldConstants::default(),
        "graph {
  input %x: f32[2]
  %a: f32[2] = constant [1.0, 2.0]
  %b: f32[2] = constant [0.5, 0.25]
  %c: f32[2] = mul %a, %b
  %y: f32[2] = add %x, %c
  output %y
}
",
        "graph {
  input %x: f32[2]
  %a: f32[2] = constant [1.0, 2.0]
  %b: f32[2] = constant [0.5, 0.25]
  %c: f32[2] = constant [0.5, 0.5]
  %y: f32[2] = add %x, %c
  output %y
}
",
    );
}

#[test]
fn algebra_removes_identities() {
    check(
        &SimplifyAlgebra,
        "graph {
  sym n param 1..
  input %x: f32[n, 4]
  %one: f32[] = constant 1.0
  %one2: f32[1, 1] = reshape %one
  %ones: f32[n, 4] = broadcast %one2
  %a: f32[n, 4] = mul %x, %ones
  %t1: f32[4, n] = transpose[perm=[1, 0]] %a
  %t2: f32[n, 4] = transpose[perm=[1, 0]] %t1
  %r1: f32[4, n] = reshape %t2
  %r2: f32[n, 2, 2] = reshape %r1
  %y: f32[n, 2, 2] = exp %r2
  output %y
}
",
        "graph {
  sym n param 1..
  input %x: f32[n, 4]
  %one: f32[] = constant 1.0
  %one2: f32[1, 1] = reshape %one
  %ones: f32[n, 4] = broadcast %one2
  %a: f32[n, 4] = mul %x, %ones
  %t1: f32[4, n] = transpose[perm=[1, 0]] %x
  %t2: f32[n, 4] = transpose[perm=[0, 1]] %x
  %r1: f32[4, n] = reshape %x
  %r2: f32[n, 2, 2] = reshape %x
  %y: f32[n, 2, 2] = exp %r2
  output %y
}
",
    );
}

#[test]
fn cse_merges_equal_nodes_and_constants() {
    check(
        &Cse,
        "graph {
  sym n param 1..
  input %x: f32[n]
  %a: f32[n] = exp %x
  %b: f32[n] = exp %x
  %c1: f32[] = constant 2.0
  %c2: f32[] = constant 2.0
  %s: f32[n] = add %a, %b
  %p: f32[1] = reshape %c1
  %q: f32[1] = reshape %c2
  %pq: f32[1] = add %p, %q
  %pb: f32[n] = broadcast %pq
  %y: f32[n] = mul %s, %pb
  output %y
}
",
        "graph {
  sym n param 1..
  input %x: f32[n]
  %a: f32[n] = exp %x
  %b: f32[n] = exp %x
  %c1: f32[] = constant 2.0
  %c2: f32[] = constant 2.0
  %s: f32[n] = add %a, %a
  %p: f32[1] = reshape %c1
  %q: f32[1] = reshape %c1
  %pq: f32[1] = add %p, %p
  %pb: f32[n] = broadcast %pq
  %y: f32[n] = mul %s, %pb
  output %y
}
",
    );
}

#[test]
fn shapes_use_the_facts_learned() {
    check(
        &SimplifyShapes,
        "graph {
  sym seq param 1..64
  input %x: f32[seq, 8]
  %pos: f32[64, 8] = constant @pos
  %p: f32[min(64, seq), 8] = slice[0: 0 step 1] %pos
  %y: f32[seq, 8] = add %x, %p
  output %y
}
"
        .replace("constant @pos", "iota[axis=0]")
        .as_str(),
        "graph {
  sym seq param 1..64
  input %x: f32[seq, 8]
  %pos: f32[64, 8] = iota[axis=0]
  %p: f32[seq, 8] = slice[0: 0 step 1] %pos
  %y: f32[seq, 8] = add %x, %p
  output %y
}
",
    );
}

#[test]
fn broadcasts_proven_no_ops_go_and_others_keep_a_guard() {
    let before = "graph {
  sym batch param 1..
  sym seq param 1..
  let k = seq
  input %x: f32[batch, seq]
  input %m: f32[1, k]
  input %b: f32[k]
  %b2: f32[1, seq] = reshape %b
  %same: f32[1, seq] = broadcast %m
  %wide: f32[batch, seq] = broadcast %same
  %y: f32[batch, seq] = add %x, %wide
  output %y, %b2
}
";
    check(
        &EliminateBroadcasts,
        before,
        "graph {
  sym batch param 1..
  sym seq param 1..
  let k = seq
  input %x: f32[batch, seq]
  input %m: f32[1, k]
  input %b: f32[k]
  %b2: f32[1, seq] = reshape %b
  %same: f32[1, seq] = broadcast %m
  %wide: f32[batch, seq] = broadcast %m
  %y: f32[batch, seq] = add %x, %wide
  output %y, %b2
}
",
    );
    // In the pipeline: the no-op broadcast feeding a real op is eliminated, the
    // stretching one stays with its guard.
    let mut g = parse(
        "graph {
  sym batch param 1..
  sym seq param 1..
  let k = seq
  input %x: f32[batch, seq]
  input %m: f32[1, k]
  %same: f32[1, seq] = broadcast %m
  %e: f32[1, seq] = exp %same
  %wide: f32[batch, seq] = broadcast %e
  %y: f32[batch, seq] = add %x, %wide
  output %y
}
",
    );
    let report = Pipeline::standard().verify(true).run(&mut g).expect("pipeline");
    assert_eq!(report.rewrites("eliminate-broadcasts"), 1);
    assert_eq!(report.guarded_broadcasts.len(), 1);
    assert_eq!(report.guarded_broadcasts[0].value, "wide");
    assert_eq!(report.guarded_broadcasts[0].dims, vec![sym::sym("batch")]);
}
