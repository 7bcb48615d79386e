//! Golden before → after tests, one or more per pass, through the IR text form.

use anyshape_passes::{
    ConvAsMatMul, Cse, Dce, EliminateBroadcasts, FoldAffineIntoMatMul, FoldConstants, HoistMatMulScale,
    IntegerMatMulAsFloat, Pass, Pipeline, SimplifyAlgebra, SimplifyShapes, SinkTransposes,
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
  %c: f32[2] = constant [0.5, 0.5]
  %y: f32[2] = add %x, %c
  output %y
}
",
    );
}

/// A statically quantized product: its dequantized activation (flattened for
/// the product, and read by another node too) and its dequantized weight each
/// leave their scale to the product, which then multiplies the integers
/// (`x - zero point` and the int8 weight, which folding makes an integral
/// constant). The other reader keeps the scaled activation.
#[test]
fn dequantized_operands_leave_their_scales_to_the_product() {
    check(
        &HoistMatMulScale,
        "graph {
  sym m param 1..
  input %q: i8[m, 2, 3]
  %w: i8[6, 2] = constant [1, -2, 3, -4, 5, -6, 7, -8, 9, -10, 11, -12]
  %zp: f32[1, 1, 1] = constant [3.0]
  %sa: f32[1, 1, 1] = constant [0.5]
  %sw: f32[1, 1] = constant [0.25]
  %qf: f32[m, 2, 3] = cast %q
  %zb: f32[m, 2, 3] = broadcast %zp
  %x: f32[m, 2, 3] = sub %qf, %zb
  %sab: f32[m, 2, 3] = broadcast %sa
  %a: f32[m, 2, 3] = mul %x, %sab
  %a2: f32[m, 6] = reshape %a
  %wf: f32[6, 2] = cast %w
  %swb: f32[6, 2] = broadcast %sw
  %b: f32[6, 2] = mul %wf, %swb
  %y: f32[m, 2] = matmul %a2, %b
  %r: f32[m, 2, 3] = exp %a
  output %y, %r
}
",
        "graph {
  sym m param 1..
  input %q: i8[m, 2, 3]
  %w: i8[6, 2] = constant [1, -2, 3, -4, 5, -6, 7, -8, 9, -10, 11, -12]
  %zp: f32[1, 1, 1] = constant [3.0]
  %sa: f32[1, 1, 1] = constant [0.5]
  %sw: f32[1, 1] = constant [0.25]
  %qf: f32[m, 2, 3] = cast %q
  %zb: f32[m, 2, 3] = broadcast %zp
  %x: f32[m, 2, 3] = sub %qf, %zb
  %sab: f32[m, 2, 3] = broadcast %sa
  %a: f32[m, 2, 3] = mul %x, %sab
  %a2: f32[m, 6] = reshape %a
  %wf: f32[6, 2] = cast %w
  %swb: f32[6, 2] = broadcast %sw
  %b: f32[6, 2] = mul %wf, %swb
  %y.unscaled: f32[m, 6] = reshape %x
  %y.scale: f32[1, 1] = constant [0.125]
  %y.scale_1: f32[m, 2] = broadcast %y.scale
  %y.unscaled_1: f32[m, 2] = matmul %y.unscaled, %wf
  %y: f32[m, 2] = mul %y.unscaled_1, %y.scale_1
  %r: f32[m, 2, 3] = exp %a
  output %y, %r
}
",
    );
}

/// A per-channel quantized weight's scales (one per output column: along a
/// matmul weight's columns, through the transpose a `Gemm` with `transB` puts
/// between, and along a convolution weight's output channels) move to the
/// product's columns, times the activation's uniform scale; a scale that
/// varies along the contracted axis stays.
#[test]
fn per_channel_weight_scales_move_to_the_columns() {
    check(
        &HoistMatMulScale,
        "graph {
  sym m param 1..
  input %q: i8[m, 3]
  input %img: i8[1, 3, m, m]
  %w: i8[3, 2] = constant [1, -2, 3, -4, 5, -6]
  %wt: i8[2, 3] = constant [1, -2, 3, -4, 5, -6]
  %wc: i8[2, 3, 1, 1] = constant [1, -2, 3, -4, 5, -6]
  %sa: f32[1, 1] = constant [0.5]
  %sw: f32[2] = constant [0.25, 4.0]
  %sk: f32[3, 1] = constant [1.0, 2.0, 3.0]
  %qf: f32[m, 3] = cast %q
  %sab: f32[m, 3] = broadcast %sa
  %a: f32[m, 3] = mul %qf, %sab
  %wf: f32[3, 2] = cast %w
  %sw2: f32[1, 2] = reshape %sw
  %swb: f32[3, 2] = broadcast %sw2
  %b: f32[3, 2] = mul %wf, %swb
  %y: f32[m, 2] = matmul %a, %b
  %wtf: f32[2, 3] = cast %wt
  %swt: f32[2, 1] = reshape %sw
  %swtb: f32[2, 3] = broadcast %swt
  %bt: f32[2, 3] = mul %swtb, %wtf
  %btt: f32[3, 2] = transpose[perm=[1, 0]] %bt
  %yt: f32[m, 2] = matmul %a, %btt
  %skb: f32[3, 2] = broadcast %sk
  %bk: f32[3, 2] = mul %wf, %skb
  %yk: f32[m, 2] = matmul %a, %bk
  %imf: f32[1, 3, m, m] = cast %img
  %wcf: f32[2, 3, 1, 1] = cast %wc
  %swc: f32[2, 1, 1, 1] = reshape %sw
  %swcb: f32[2, 3, 1, 1] = broadcast %swc
  %bc: f32[2, 3, 1, 1] = mul %wcf, %swcb
  %c: f32[1, 2, m, m] = conv[strides=[1, 1], dilations=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], group=1] %imf, %bc
  output %y, %yt, %yk, %c
}
",
        "graph {
  sym m param 1..
  input %q: i8[m, 3]
  input %img: i8[1, 3, m, m]
  %w: i8[3, 2] = constant [1, -2, 3, -4, 5, -6]
  %wt: i8[2, 3] = constant [1, -2, 3, -4, 5, -6]
  %wc: i8[2, 3, 1, 1] = constant [1, -2, 3, -4, 5, -6]
  %sa: f32[1, 1] = constant [0.5]
  %sw: f32[2] = constant [0.25, 4.0]
  %sk: f32[3, 1] = constant [1.0, 2.0, 3.0]
  %qf: f32[m, 3] = cast %q
  %sab: f32[m, 3] = broadcast %sa
  %a: f32[m, 3] = mul %qf, %sab
  %wf: f32[3, 2] = cast %w
  %sw2: f32[1, 2] = reshape %sw
  %swb: f32[3, 2] = broadcast %sw2
  %b: f32[3, 2] = mul %wf, %swb
  %y.scale: f32[1, 2] = constant [0.125, 2.0]
  %y.scale_1: f32[m, 2] = broadcast %y.scale
  %y.unscaled: f32[m, 2] = matmul %qf, %wf
  %y: f32[m, 2] = mul %y.unscaled, %y.scale_1
  %wtf: f32[2, 3] = cast %wt
  %swt: f32[2, 1] = reshape %sw
  %swtb: f32[2, 3] = broadcast %swt
  %bt: f32[2, 3] = mul %swtb, %wtf
  %btt: f32[3, 2] = transpose[perm=[1, 0]] %bt
  %yt.unscaled: f32[3, 2] = transpose[perm=[1, 0]] %wtf
  %yt.scale: f32[1, 2] = constant [0.125, 2.0]
  %yt.scale_1: f32[m, 2] = broadcast %yt.scale
  %yt.unscaled_1: f32[m, 2] = matmul %qf, %yt.unscaled
  %yt: f32[m, 2] = mul %yt.unscaled_1, %yt.scale_1
  %skb: f32[3, 2] = broadcast %sk
  %bk: f32[3, 2] = mul %wf, %skb
  %yk.scale: f32[1, 1] = constant [0.5]
  %yk.scale_1: f32[m, 2] = broadcast %yk.scale
  %yk.unscaled: f32[m, 2] = matmul %qf, %bk
  %yk: f32[m, 2] = mul %yk.unscaled, %yk.scale_1
  %imf: f32[1, 3, m, m] = cast %img
  %wcf: f32[2, 3, 1, 1] = cast %wc
  %swc: f32[2, 1, 1, 1] = reshape %sw
  %swcb: f32[2, 3, 1, 1] = broadcast %swc
  %bc: f32[2, 3, 1, 1] = mul %wcf, %swcb
  %c.scale: f32[1, 2, 1, 1] = constant [0.25, 4.0]
  %c.scale_1: f32[1, 2, m, m] = broadcast %c.scale
  %c.unscaled: f32[1, 2, m, m] = conv[strides=[1, 1], dilations=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], group=1] %imf, %wcf
  %c: f32[1, 2, m, m] = mul %c.unscaled, %c.scale_1
  output %y, %yt, %yk, %c
}
",
    );
}

/// Decomposed scaled-dot-product attention scales Q and K by `sqrt(1/sqrt(d))`
/// each: the two scales land on the scores, and the (repeated, transposed) keys
/// stay a view. A scale read elsewhere too stays where it is.
#[test]
fn matmul_scales_move_to_the_product() {
    check(
        &HoistMatMulScale,
        "graph {
  sym t param 1..
  input %q: f32[2, t, 4]
  input %k: f32[2, 4, t]
  input %v: f32[2, t, 4]
  %s: f32[] = constant 0.5
  %s1: f32[1, 1, 1] = reshape %s
  %two: f32[1, 1, 1] = constant [2.0]
  %sq: f32[2, t, 4] = broadcast %s1
  %sk: f32[2, 4, t] = broadcast %two
  %q2: f32[2, t, 4] = mul %q, %sq
  %k2: f32[2, 4, t] = div %k, %sk
  %scores: f32[2, t, t] = matmul %q2, %k2
  %p: f32[2, t, t] = exp %scores
  %sv: f32[2, t, 4] = broadcast %s1
  %v2: f32[2, t, 4] = mul %sv, %v
  %out: f32[2, t, 4] = matmul %p, %v2
  %y: f32[2, t, 4] = add %out, %v2
  output %y
}
",
        "graph {
  sym t param 1..
  input %q: f32[2, t, 4]
  input %k: f32[2, 4, t]
  input %v: f32[2, t, 4]
  %s: f32[] = constant 0.5
  %s1: f32[1, 1, 1] = reshape %s
  %two: f32[1, 1, 1] = constant [2.0]
  %sq: f32[2, t, 4] = broadcast %s1
  %sk: f32[2, 4, t] = broadcast %two
  %q2: f32[2, t, 4] = mul %q, %sq
  %k2: f32[2, 4, t] = div %k, %sk
  %scores.scale: f32[1, 1, 1] = constant [0.25]
  %scores.scale_1: f32[2, t, t] = broadcast %scores.scale
  %scores.unscaled: f32[2, t, t] = matmul %q, %k
  %scores: f32[2, t, t] = mul %scores.unscaled, %scores.scale_1
  %p: f32[2, t, t] = exp %scores
  %sv: f32[2, t, 4] = broadcast %s1
  %v2: f32[2, t, 4] = mul %sv, %v
  %out: f32[2, t, 4] = matmul %p, %v2
  %y: f32[2, t, 4] = add %out, %v2
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

#[test]
fn gemms_sharing_an_operand_merge() {
    check(
        &anyshape_passes::MergeSharedOperand,
        "graph {
  sym n param 1..
  input %x: f32[n, 2]
  %w1: f32[2, 1] = constant [1.0, 2.0]
  %w2: f32[2, 2] = constant [3.0, 4.0, 5.0, 6.0]
  %a: f32[n, 1] = matmul %x, %w1
  %b: f32[n, 2] = matmul %x, %w2
  %y: f32[n, 1] = exp %a
  output %y, %b
}
",
        "graph {
  sym n param 1..
  input %x: f32[n, 2]
  %w1: f32[2, 1] = constant [1.0, 2.0]
  %w2: f32[2, 2] = constant [3.0, 4.0, 5.0, 6.0]
  %a.merged.weight: f32[2, 3] = constant [1.0, 3.0, 4.0, 2.0, 5.0, 6.0]
  %a.merged: f32[n, 3] = matmul %x, %a.merged.weight
  %a.part: f32[n, 1] = slice[1: 0 step 1] %a.merged
  %b: f32[n, 2] = slice[1: 1 step 1] %a.merged
  %a: f32[n, 1] = matmul %x, %w1
  %b.replaced: f32[n, 2] = matmul %x, %w2
  %y: f32[n, 1] = exp %a.part
  output %y, %b
}
",
    );
}

/// A dense layer with bias and GELU epilogue, then LayerNorm: one contraction
/// group (prologue transpose folded in), one stitch group.
#[test]
fn fusion_groups_of_a_dense_layer_and_layernorm() {
    let g = parse(
        "graph {
  sym rows param 1..
  input %x: f32[rows, 4]
  input %w: f32[8, 4]
  %wt: f32[4, 8] = transpose[perm=[1, 0]] %w
  %h: f32[rows, 8] = matmul %x, %wt
  %b: f32[1, 8] = iota[axis=1]
  %bb: f32[rows, 8] = broadcast %b
  %hb: f32[rows, 8] = add %h, %bb
  %act: f32[rows, 8] = tanh %hb
  %m: f32[rows, 1] = reduce_mean[axes=[1], keep_dims=true] %act
  %mb: f32[rows, 8] = broadcast %m
  %d: f32[rows, 8] = sub %act, %mb
  %sq: f32[rows, 8] = mul %d, %d
  %v: f32[rows, 1] = reduce_mean[axes=[1], keep_dims=true] %sq
  %s: f32[rows, 1] = sqrt %v
  %sb: f32[rows, 8] = broadcast %s
  %y: f32[rows, 8] = div %d, %sb
  output %y
}
",
    );
    let plan = anyshape_passes::fuse(&g);
    assert_eq!(
        anyshape_passes::print_plan(&g, &plan),
        "group 0: contraction over [rows, 8]
  ops: transpose matmul iota broadcast add tanh
  inputs: %w, %x
  outputs: %act
group 1: stitch over [rows, 8]
  ops: reduce_mean broadcast sub mul reduce_mean sqrt broadcast div
  inputs: %act
  outputs: %y
"
    );
}

/// Independent contractions of provably equal shapes batch into one (opt-in).
#[test]
fn independent_equal_gemms_batch() {
    let text = "graph {
  sym n param 1..
  let m = n
  input %x: f32[n, 2]
  input %z: f32[m, 2]
  %w1: f32[2, 1] = constant [1.0, 2.0]
  %w2: f32[2, 1] = constant [3.0, 4.0]
  %a: f32[n, 1] = matmul %x, %w1
  %b: f32[m, 1] = matmul %z, %w2
  %y: f32[n, 1] = add %a, %b
  output %y
}
";
    let mut g = parse(text);
    let n = anyshape_passes::BatchEqualShapes.run(&mut g).expect("batch");
    assert_eq!(n, 1);
    ir::verify(&g).expect("valid");
    anyshape_passes::Dce.run(&mut g).expect("dce");
    let t = g.to_string();
    assert!(t.contains("%a.batched: f32[2, n, 1] = matmul %a.batched.x, %a.batched.weight"), "{t}");
    assert!(t.contains("%a.batched.weight: f32[2, 2, 1] = constant [1.0, 2.0, 3.0, 4.0]"), "{t}");
    // Same outputs as before at a few shapes.
    let before = parse(text);
    for rows in [1usize, 2, 7] {
        let x = ir::Tensor::new(vec![rows, 2], ir::Elems::F32((0..2 * rows).map(|i| i as f32).collect()))
            .expect("x");
        let z =
            ir::Tensor::new(vec![rows, 2], ir::Elems::F32((0..2 * rows).map(|i| 1.0 - i as f32).collect()))
                .expect("z");
        let ins = [("x", x), ("z", z)];
        assert_eq!(reference::run(&before, &ins).expect("before"), reference::run(&g, &ins).expect("after"));
    }
}

#[test]
fn transposes_fold_into_matmul_layouts() {
    check(
        &SimplifyAlgebra,
        "graph {
  sym b param 1..
  sym s param 1..
  input %q: f32[b, s, 8]
  input %k: f32[b, s, 8]
  %kt: f32[b, 8, s] = transpose[perm=[0, 2, 1]] %k
  %y: f32[b, s, s] = matmul %q, %kt
  output %y
}
",
        "graph {
  sym b param 1..
  sym s param 1..
  input %q: f32[b, s, 8]
  input %k: f32[b, s, 8]
  %kt: f32[b, 8, s] = transpose[perm=[0, 2, 1]] %k
  %y: f32[b, s, s] = matmul[transpose_b] %q, %k
  output %y
}
",
    );
}

#[test]
fn pointwise_convolutions_are_a_gemm_on_the_image() {
    // A 1×1 convolution needs no taps: a GEMM on the channels-last image, its
    // product channels-last, seen channels-first.
    check(
        &ConvAsMatMul,
        "graph {
  sym n param 1..8
  sym h param 2..64
  input %x: f32[n, 2, h, h]
  %p: f32[4, 2, 1, 1] = constant [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
  %z: f32[n, 4, h, h] = conv[strides=[1, 1], dilations=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], group=1] %x, %p
  output %z
}
",
        // The convolution stays, unused (DCE drops it in the pipeline).
        "graph {
  sym n param 1..8
  sym h param 2..64
  input %x: f32[n, 2, h, h]
  %p: f32[4, 2, 1, 1] = constant [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
  %z.nhwc: f32[n, h, h, 2] = transpose[perm=[0, 2, 3, 1]] %x
  %z.col: f32[1, h*h*n, 2] = reshape %z.nhwc
  %z.weight.hwck: f32[1, 1, 2, 4] = transpose[perm=[2, 3, 1, 0]] %p
  %z.weight: f32[1, 2, 4] = reshape %z.weight.hwck
  %z.matmul: f32[1, h*h*n, 4] = matmul %z.col, %z.weight
  %z.out.nhwc: f32[n, h, h, 4] = reshape %z.matmul
  %z: f32[n, 4, h, h] = transpose[perm=[0, 3, 1, 2]] %z.out.nhwc
  %z.replaced: f32[n, 4, h, h] = conv[strides=[1, 1], dilations=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], group=1] %x, %p
  output %z
}
",
    );
}

#[test]
fn channels_last_convolutions_take_contiguous_taps() {
    // Taps channels-last for every channel count (two here): each tap row is a
    // run of channels of the padded NHWC image, and the weight is transposed to
    // match.
    check(
        &ConvAsMatMul,
        "graph {
  sym n param 1..8
  sym h param 2..64
  input %x: f32[n, 2, h, h]
  %k: f32[3, 2, 2, 1] = constant [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0]
  %y: f32[n, 3, h/2+1, (h+1)/2] = conv[strides=[2, 2], dilations=[1, 1], pads_begin=[1, 0], pads_end=[1, 0], group=1] %x, %k
  output %y
}
",
        "graph {
  sym n param 1..8
  sym h param 2..64
  input %x: f32[n, 2, h, h]
  %k: f32[3, 2, 2, 1] = constant [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0]
  %y.nhwc: f32[n, h, h, 2] = transpose[perm=[0, 2, 3, 1]] %x
  %y.padded: f32[n, h+2, h, 2] = pad[pads=[(0, 0), (1, 1), (0, 0), (0, 0)], mode=constant(0.0)] %y.nhwc
  %y.tap0_0: f32[n, h/2+1, (h+1)/2, 2] = slice[1: 0 step 2, 2: 0 step 2] %y.padded
  %y.tap1_0: f32[n, h/2+1, (h+1)/2, 2] = slice[1: 1 step 2, 2: 0 step 2] %y.padded
  %y.tap0.flat: f32[n, h/2+1, (h+1)/2, 1, 2] = reshape %y.tap0_0
  %y.tap1.flat: f32[n, h/2+1, (h+1)/2, 1, 2] = reshape %y.tap1_0
  %y.taps: f32[n, h/2+1, (h+1)/2, 2, 2] = concat[axis=3] %y.tap0.flat, %y.tap1.flat
  %y.col: f32[1, n*((h+1)/2)+n*((h+1)/2)*(h/2), 4] = reshape %y.taps
  %y.weight.hwck: f32[2, 1, 2, 3] = transpose[perm=[2, 3, 1, 0]] %k
  %y.weight: f32[1, 4, 3] = reshape %y.weight.hwck
  %y.matmul: f32[1, n*((h+1)/2)+n*((h+1)/2)*(h/2), 3] = matmul %y.col, %y.weight
  %y.out.nhwc: f32[n, h/2+1, (h+1)/2, 3] = reshape %y.matmul
  %y: f32[n, 3, h/2+1, (h+1)/2] = transpose[perm=[0, 3, 1, 2]] %y.out.nhwc
  %y.replaced: f32[n, 3, h/2+1, (h+1)/2] = conv[strides=[2, 2], dilations=[1, 1], pads_begin=[1, 0], pads_end=[1, 0], group=1] %x, %k
  output %y
}
",
    );
}

#[test]
fn depthwise_convolutions_are_sums_of_products_channels_last() {
    // Two channels, each giving two outputs (a depthwise convolution with
    // multiplier 2), a 2×1 kernel: per tap, the image's channel k/2 of each
    // output channel k (a strided slice, widened over the pair), times a row of
    // the transposed weight, summed.
    check(
        &ConvAsMatMul,
        "graph {
  sym n param 1..8
  sym h param 2..64
  input %x: f32[n, 2, h, h]
  %k: f32[4, 1, 2, 1] = constant [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
  %y: f32[n, 4, h+1, h] = conv[strides=[1, 1], dilations=[1, 1], pads_begin=[1, 0], pads_end=[1, 0], group=2] %x, %k
  output %y
}
",
        "graph {
  sym n param 1..8
  sym h param 2..64
  input %x: f32[n, 2, h, h]
  %k: f32[4, 1, 2, 1] = constant [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
  %y.nhwc: f32[n, h, h, 2] = transpose[perm=[0, 2, 3, 1]] %x
  %y.weight.hwck: f32[2, 1, 1, 4] = transpose[perm=[2, 3, 1, 0]] %k
  %y.padded: f32[n, h+2, h, 2] = pad[pads=[(0, 0), (1, 1), (0, 0), (0, 0)], mode=constant(0.0)] %y.nhwc
  %y.tap0_0: f32[n, h+1, h, 2] = slice[1: 0 step 1, 2: 0 step 1] %y.padded
  %y.groups: f32[n, h+1, h, 2, 1] = reshape %y.tap0_0
  %y.per_output: f32[n, h+1, h, 2, 2] = broadcast %y.groups
  %y.channels: f32[n, h+1, h, 4] = reshape %y.per_output
  %y.w0_0: f32[1, 1, 1, 4] = slice[0: 0 step 1, 1: 0 step 1] %y.weight.hwck
  %y.w.wide: f32[n, h+1, h, 4] = broadcast %y.w0_0
  %y.term: f32[n, h+1, h, 4] = mul %y.channels, %y.w.wide
  %y.tap1_0: f32[n, h+1, h, 2] = slice[1: 1 step 1, 2: 0 step 1] %y.padded
  %y.groups_1: f32[n, h+1, h, 2, 1] = reshape %y.tap1_0
  %y.per_output_1: f32[n, h+1, h, 2, 2] = broadcast %y.groups_1
  %y.channels_1: f32[n, h+1, h, 4] = reshape %y.per_output_1
  %y.w1_0: f32[1, 1, 1, 4] = slice[0: 1 step 1, 1: 0 step 1] %y.weight.hwck
  %y.w.wide_1: f32[n, h+1, h, 4] = broadcast %y.w1_0
  %y.term_1: f32[n, h+1, h, 4] = mul %y.channels_1, %y.w.wide_1
  %y.sum: f32[n, h+1, h, 4] = add %y.term, %y.term_1
  %y: f32[n, 4, h+1, h] = transpose[perm=[0, 3, 1, 2]] %y.sum
  %y.replaced: f32[n, 4, h+1, h] = conv[strides=[1, 1], dilations=[1, 1], pads_begin=[1, 0], pads_end=[1, 0], group=2] %x, %k
  output %y
}
",
    );
}

#[test]
fn transposes_sink_through_bias_activation_and_residual() {
    // Two channels-last products seen channels-first, a bias, a ReLU and a
    // residual add: all of it runs channels-last, one transpose at the end.
    check(
        &SinkTransposes,
        "graph {
  sym n param 1..8
  sym h param 1..64
  input %a: f32[n, h, h, 2]
  input %b: f32[n, h, h, 2]
  %at: f32[n, 2, h, h] = transpose[perm=[0, 3, 1, 2]] %a
  %bt: f32[n, 2, h, h] = transpose[perm=[0, 3, 1, 2]] %b
  %bias: f32[1, 2, 1, 1] = constant [0.5, -0.5]
  %bias.b: f32[n, 2, h, h] = broadcast %bias
  %y: f32[n, 2, h, h] = add %at, %bias.b
  %r: f32[n, 2, h, h] = relu %y
  %s: f32[n, 2, h, h] = add %r, %bt
  output %s
}
",
        "graph {
  sym n param 1..8
  sym h param 1..64
  input %a: f32[n, h, h, 2]
  input %b: f32[n, h, h, 2]
  %at: f32[n, 2, h, h] = transpose[perm=[0, 3, 1, 2]] %a
  %bt: f32[n, 2, h, h] = transpose[perm=[0, 3, 1, 2]] %b
  %bias: f32[1, 2, 1, 1] = constant [0.5, -0.5]
  %bias.b: f32[n, 2, h, h] = broadcast %bias
  %y.in1.nhwc: f32[1, 1, 1, 2] = transpose[perm=[0, 2, 3, 1]] %bias
  %y.in1.nhwc.broadcast: f32[n, h, h, 2] = broadcast %y.in1.nhwc
  %y.nhwc: f32[n, h, h, 2] = add %a, %y.in1.nhwc.broadcast
  %y.nchw: f32[n, 2, h, h] = transpose[perm=[0, 3, 1, 2]] %y.nhwc
  %y: f32[n, 2, h, h] = add %at, %bias.b
  %r.nhwc: f32[n, h, h, 2] = relu %y.nhwc
  %r.nchw: f32[n, 2, h, h] = transpose[perm=[0, 3, 1, 2]] %r.nhwc
  %r: f32[n, 2, h, h] = relu %y.nchw
  %s.nhwc: f32[n, h, h, 2] = add %r.nhwc, %b
  %s: f32[n, 2, h, h] = transpose[perm=[0, 3, 1, 2]] %s.nhwc
  %s.replaced: f32[n, 2, h, h] = add %r.nchw, %bt
  output %s
}
",
    );
}

#[test]
fn transposes_sink_through_pools() {
    // A max pool of a channels-last value seen channels-first runs
    // channels-last; a global mean stays a reduction of the view (see the
    // pass's doc: its points would sum in two orders).
    check(
        &SinkTransposes,
        "graph {
  sym n param 1..8
  sym h param 2..64
  input %a: f32[n, h, h, 3]
  %at: f32[n, 3, h, h] = transpose[perm=[0, 3, 1, 2]] %a
  %mp: f32[n, 3, h/2, h/2] = max_pool[kernel=[2, 2], strides=[2, 2], dilations=[1, 1], pads_begin=[0, 0], pads_end=[0, 0]] %at
  %gap: f32[n, 3, 1, 1] = reduce_mean[axes=[2, 3], keep_dims=true] %at
  output %mp, %gap
}
",
        "graph {
  sym n param 1..8
  sym h param 2..64
  input %a: f32[n, h, h, 3]
  %at: f32[n, 3, h, h] = transpose[perm=[0, 3, 1, 2]] %a
  %mp.nhwc: f32[n, h/2, h/2, 3] = max_pool[kernel=[2, 2], strides=[2, 2], dilations=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], channels_last=true] %a
  %mp: f32[n, 3, h/2, h/2] = transpose[perm=[0, 3, 1, 2]] %mp.nhwc
  %mp.replaced: f32[n, 3, h/2, h/2] = max_pool[kernel=[2, 2], strides=[2, 2], dilations=[1, 1], pads_begin=[0, 0], pads_end=[0, 0]] %at
  %gap: f32[n, 3, 1, 1] = reduce_mean[axes=[2, 3], keep_dims=true] %at
  output %mp, %gap
}
",
    );
}

/// Integer contractions of 8-bit values on floats: a matmul 40 deep, one f32
/// product cast back (40 · 255 · 128 < 2^24); 600 deep, chunks of 512 and 88
/// depths, their products summed in i32; a convolution 576 deep (64 channels
/// × 3 × 3), the activation's base-16 digits stacked along the batch for one
/// f32 convolution, `16·hi + lo` summed in i32.
#[test]
fn integer_matmuls_run_on_floats() {
    check(
        &IntegerMatMulAsFloat,
        "graph {
  sym m param 1..
  input %a: u8[m, 40]
  input %w: i8[40, 3]
  input %b: u8[m, 600]
  input %v: i8[600, 3]
  input %x: u8[m, 64, 3, 3]
  input %k: i8[2, 64, 3, 3]
  %ai: i32[m, 40] = cast %a
  %wi: i32[40, 3] = cast %w
  %small: i32[m, 3] = matmul %ai, %wi
  %bi: i32[m, 600] = cast %b
  %vi: i32[600, 3] = cast %v
  %deep: i32[m, 3] = matmul %bi, %vi
  %xi: i32[m, 64, 3, 3] = cast %x
  %ki: i32[2, 64, 3, 3] = cast %k
  %conv: i32[m, 2, 1, 1] = conv[strides=[1, 1], dilations=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], group=1] %xi, %ki
  output %small, %deep, %conv
}
",
        "graph {
  sym m param 1..
  input %a: u8[m, 40]
  input %w: i8[40, 3]
  input %b: u8[m, 600]
  input %v: i8[600, 3]
  input %x: u8[m, 64, 3, 3]
  input %k: i8[2, 64, 3, 3]
  %ai: i32[m, 40] = cast %a
  %wi: i32[40, 3] = cast %w
  %small.a: f32[m, 40] = cast %ai
  %small.b: f32[40, 3] = cast %wi
  %small.f32: f32[m, 3] = matmul %small.a, %small.b
  %small: i32[m, 3] = cast %small.f32
  %bi: i32[m, 600] = cast %b
  %vi: i32[600, 3] = cast %v
  %deep.a: f32[m, 600] = cast %bi
  %deep.b: f32[600, 3] = cast %vi
  %deep.a.k0: f32[m, 512] = slice[1: 0 step 1] %deep.a
  %deep.b.k0: f32[512, 3] = slice[0: 0 step 1] %deep.b
  %deep.k0: f32[m, 3] = matmul %deep.a.k0, %deep.b.k0
  %deep.k0.i32: i32[m, 3] = cast %deep.k0
  %deep.a.k1: f32[m, 88] = slice[1: 512 step 1] %deep.a
  %deep.b.k1: f32[88, 3] = slice[0: 512 step 1] %deep.b
  %deep.k1: f32[m, 3] = matmul %deep.a.k1, %deep.b.k1
  %deep.k1.i32: i32[m, 3] = cast %deep.k1
  %deep: i32[m, 3] = add %deep.k0.i32, %deep.k1.i32
  %xi: i32[m, 64, 3, 3] = cast %x
  %ki: i32[2, 64, 3, 3] = cast %k
  %conv.a: f32[m, 64, 3, 3] = cast %xi
  %conv.b: f32[2, 64, 3, 3] = cast %ki
  %conv.sixteenth: f32[1, 1, 1, 1] = constant [0.0625]
  %conv.sixteenth_1: f32[m, 64, 3, 3] = broadcast %conv.sixteenth
  %conv.a.q: f32[m, 64, 3, 3] = mul %conv.a, %conv.sixteenth_1
  %conv.a.hi: f32[m, 64, 3, 3] = floor %conv.a.q
  %conv.sixteen: f32[1, 1, 1, 1] = constant [16.0]
  %conv.sixteen_1: f32[m, 64, 3, 3] = broadcast %conv.sixteen
  %conv.a.hi16: f32[m, 64, 3, 3] = mul %conv.a.hi, %conv.sixteen_1
  %conv.a.lo: f32[m, 64, 3, 3] = sub %conv.a, %conv.a.hi16
  %conv.digits: f32[2*m, 64, 3, 3] = concat[axis=0] %conv.a.hi, %conv.a.lo
  %conv.digits.f32: f32[2*m, 2, 1, 1] = conv[strides=[1, 1], dilations=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], group=1] %conv.digits, %conv.b
  %conv.hi: f32[m, 2, 1, 1] = slice[0: 0 step 1] %conv.digits.f32
  %conv.lo: f32[m, 2, 1, 1] = slice[0: m step 1] %conv.digits.f32
  %conv.hi.i32: i32[m, 2, 1, 1] = cast %conv.hi
  %conv.lo.i32: i32[m, 2, 1, 1] = cast %conv.lo
  %conv.sixteen.i32: i32[1, 1, 1, 1] = constant [16]
  %conv.sixteen.i32_1: i32[m, 2, 1, 1] = broadcast %conv.sixteen.i32
  %conv.hi16: i32[m, 2, 1, 1] = mul %conv.hi.i32, %conv.sixteen.i32_1
  %conv: i32[m, 2, 1, 1] = add %conv.hi16, %conv.lo.i32
  output %small, %deep, %conv
}
",
    );
}

/// A dynamically quantized activation (`u8 - z`, one zero point) by an int8
/// weight: the zero point moves out, `x·W - z·colsum(W)`, the column sums a
/// reduction of the constant (folded later), so that the product's operands
/// are 8-bit integers on both sides.
#[test]
fn a_zero_point_moves_out_of_an_int8_product() {
    check(
        &IntegerMatMulAsFloat,
        "graph {
  sym m param 1..
  input %a: u8[m, 4]
  input %z: u8[]
  %w: i8[4, 2] = constant [1, -2, 3, -4, 127, -128, 0, 5]
  %ai: i32[m, 4] = cast %a
  %zi: i32[] = cast %z
  %z1: i32[1, 1] = reshape %zi
  %zb: i32[m, 4] = broadcast %z1
  %as: i32[m, 4] = sub %ai, %zb
  %wi: i32[4, 2] = cast %w
  %y: i32[m, 2] = matmul %as, %wi
  output %y
}
",
        "graph {
  sym m param 1..
  input %a: u8[m, 4]
  input %z: u8[]
  %w: i8[4, 2] = constant [1, -2, 3, -4, 127, -128, 0, 5]
  %ai: i32[m, 4] = cast %a
  %zi: i32[] = cast %z
  %z1: i32[1, 1] = reshape %zi
  %zb: i32[m, 4] = broadcast %z1
  %as: i32[m, 4] = sub %ai, %zb
  %wi: i32[4, 2] = cast %w
  %y.a: f32[m, 4] = cast %ai
  %y.b: f32[4, 2] = cast %wi
  %y.f32: f32[m, 2] = matmul %y.a, %y.b
  %y.u8s8: i32[m, 2] = cast %y.f32
  %y.colsum: i32[1, 2] = reduce_sum[axes=[0], keep_dims=true] %wi
  %y.zp: i32[1, 1] = reshape %z1
  %y.zp_1: i32[1, 2] = broadcast %y.zp
  %y.zp.colsum: i32[1, 2] = mul %y.zp_1, %y.colsum
  %y.zp.colsum_1: i32[1, 2] = reshape %y.zp.colsum
  %y.zp.colsum_2: i32[m, 2] = broadcast %y.zp.colsum_1
  %y: i32[m, 2] = sub %y.u8s8, %y.zp.colsum_2
  output %y
}
",
    );
}

/// A constant int8 weight bounds each column's sums by its own magnitudes:
/// 600 depths of magnitudes up to 2 against u8 stay one product whatever the
/// type's extremes say (600 · 255 · 2 < 2^24); a weight of 127s is cut where
/// a column's sums would pass the limit (after 518 depths), on a multiple of 16.
#[test]
fn a_constant_weight_sets_its_own_chunks() {
    let rewrite = |vals: &[i64]| {
        let text = format!(
            "graph {{
  sym m param 1..
  input %a: u8[m, 600]
  %w: i8[600, 2] = constant [{}]
  %ai: i32[m, 600] = cast %a
  %wi: i32[600, 2] = cast %w
  %y: i32[m, 2] = matmul %ai, %wi
  output %y
}}
",
            vals.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", ")
        );
        let mut g = ir::parse_graph(&text, &|_| None).expect("parses");
        IntegerMatMulAsFloat.run(&mut g).expect("runs");
        ir::print_graph(&g)
    };
    let small: Vec<i64> = (0..1200).map(|i| i % 5 - 2).collect();
    let out = rewrite(&small);
    assert!(out.contains("%y.f32: f32[m, 2] = matmul %y.a, %y.b") && !out.contains("slice"), "{out}");
    let mut big = vec![127i64; 1200];
    big[2] = -2;
    let out = rewrite(&big);
    assert!(out.contains("%y.a.k0: f32[m, 512] = slice[1: 0 step 1] %y.a"), "{out}");
    assert!(out.contains("%y.a.k1: f32[m, 88] = slice[1: 512 step 1] %y.a"), "{out}");
    assert!(!out.contains("y.a.k2"), "{out}");
}

/// A cast of a constant folds past the size other folds stop at: it is the
/// weight itself in another type (an int8 LM head widened for its product).
#[test]
fn casts_of_large_constants_fold() {
    let mut g = ir::parse_graph(
        "graph {
  input %x: f32[8]
  %w: i8[8] = constant [1, -2, 3, -4, 5, -6, 7, -8]
  %wi: i32[8] = cast %w
  %wf: f32[8] = cast %wi
  %two: f32[8] = add %wf, %wf
  %y: f32[8] = mul %x, %two
  output %y
}
",
        &|_| None,
    )
    .expect("parses");
    FoldConstants { max_elements: 4 }.run(&mut g).expect("runs");
    let out = ir::print_graph(&g);
    assert!(out.contains("%wf: f32[8] = constant [1.0, -2.0, 3.0"), "{out}");
    assert!(out.contains("%two: f32[8] = add %wf, %wf"), "an add of 8 folded past the limit of 4:\n{out}");
}

#[test]
fn an_integer_images_three_channels_are_padded_to_a_word() {
    // An image of integers (a quantized model's, its scale moved out) by an
    // integer weight: its three channels take a zero fourth, and the weight a
    // zero input channel, so that a tap's channels fill the integer kernels'
    // four-byte words; the product is the same.
    let before = "graph {
  sym n param 1..8
  sym h param 2..64
  input %q: u8[n, 3, h, h]
  %x: f32[n, 3, h, h] = cast %q
  %p: f32[2, 3, 1, 1] = constant [1.0, -2.0, 3.0, 4.0, 5.0, -6.0]
  %z: f32[n, 2, h, h] = conv[strides=[1, 1], dilations=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], group=1] %x, %p
  output %z
}
";
    check(
        &ConvAsMatMul,
        before,
        "graph {
  sym n param 1..8
  sym h param 2..64
  input %q: u8[n, 3, h, h]
  %x: f32[n, 3, h, h] = cast %q
  %p: f32[2, 3, 1, 1] = constant [1.0, -2.0, 3.0, 4.0, 5.0, -6.0]
  %z.nhwc: f32[n, h, h, 3] = transpose[perm=[0, 2, 3, 1]] %x
  %z.channels: f32[n, h, h, 4] = pad[pads=[(0, 0), (0, 0), (0, 0), (0, 1)], mode=constant(0.0)] %z.nhwc
  %z.weight.channels: f32[2, 4, 1, 1] = pad[pads=[(0, 0), (0, 1), (0, 0), (0, 0)], mode=constant(0.0)] %p
  %z.col: f32[1, h*h*n, 4] = reshape %z.channels
  %z.weight.hwck: f32[1, 1, 4, 2] = transpose[perm=[2, 3, 1, 0]] %z.weight.channels
  %z.weight: f32[1, 4, 2] = reshape %z.weight.hwck
  %z.matmul: f32[1, h*h*n, 2] = matmul %z.col, %z.weight
  %z.out.nhwc: f32[n, h, h, 2] = reshape %z.matmul
  %z: f32[n, 2, h, h] = transpose[perm=[0, 3, 1, 2]] %z.out.nhwc
  %z.replaced: f32[n, 2, h, h] = conv[strides=[1, 1], dilations=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], group=1] %x, %p
  output %z
}
",
    );
    // The interpreter's values before and after, at 2 images of 5 x 5.
    let mut g = parse(before);
    let q: Vec<u8> = (0..2 * 3 * 25).map(|i| (i * 37 % 256) as u8).collect();
    let q = ir::Tensor::new(vec![2, 3, 5, 5], ir::Elems::U8(q)).expect("an image");
    let want = reference::run(&g, &[("q", q.clone())]).expect("runs");
    ConvAsMatMul.run(&mut g).expect("rewrites");
    assert_eq!(reference::run(&g, &[("q", q)]).expect("runs"), want);
}

/// A quantized residual block's shape: codes (`round`) that the next product
/// reads, and their dequantized copy (`codes·scale`) that a later add reads.
/// The copy is computed where the add reads it, from the codes, not written
/// beside them: the first group writes one tensor and is the first product's
/// epilogue, the add joins the second product's.
#[test]
fn a_scaled_copy_of_a_products_operand_is_computed_by_its_reader() {
    let g = parse(
        "graph {
  sym rows param 1..
  input %x: f32[rows, 4]
  input %w1: f32[4, 4]
  input %w2: f32[4, 4]
  %h: f32[rows, 4] = matmul %x, %w1
  %codes: f32[rows, 4] = round %h
  %s: f32[1, 1] = constant [0.5]
  %sb: f32[rows, 4] = broadcast %s
  %copy: f32[rows, 4] = mul %codes, %sb
  %h2: f32[rows, 4] = matmul %codes, %w2
  %sum: f32[rows, 4] = add %h2, %copy
  output %sum
}
",
    );
    let plan = anyshape_passes::fuse(&g);
    assert_eq!(
        anyshape_passes::print_plan(&g, &plan),
        "group 0: contraction over [rows, 4]
  ops: matmul round
  inputs: %x, %w1
  outputs: %codes
group 1: contraction over [rows, 4]
  ops: broadcast mul matmul add
  inputs: %s, %codes, %w2
  outputs: %sum
"
    );
}

/// A layer norm's affine step (`γ`, `β` along the features) moves into the
/// one product that reads it through a flattening reshape: the rows of `W`
/// scaled by `γ`, `β·W` added to the product; the other product, whose A is
/// also read by a non-product, keeps its operand. The values stay the
/// interpreter's, to f32 rounding.
#[test]
fn a_norms_affine_step_moves_into_its_product() {
    const BEFORE: &str = "graph {
  sym n param 1..
  input %x: f32[n, 3, 4]
  %g: f32[1, 1, 4] = constant [0.5, 2.0, -1.0, 1.5]
  %gb: f32[n, 3, 4] = broadcast %g
  %b: f32[1, 1, 4] = constant [0.25, 0.0, -0.5, 1.0]
  %bb: f32[n, 3, 4] = broadcast %b
  %s: f32[n, 3, 4] = mul %x, %gb
  %a: f32[n, 3, 4] = add %s, %bb
  %r: f32[3*n, 4] = reshape %a
  %w: f32[4, 2] = constant [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
  %y: f32[3*n, 2] = matmul %r, %w
  %t: f32[n, 3, 4] = add %x, %bb
  %rt: f32[3*n, 4] = reshape %t
  %u: f32[3*n, 2] = matmul %rt, %w
  %v: f32[n, 3, 4] = neg %t
  output %y, %u, %v
}
";
    const AFTER: &str = "graph {
  sym n param 1..
  input %x: f32[n, 3, 4]
  %g: f32[1, 1, 4] = constant [0.5, 2.0, -1.0, 1.5]
  %gb: f32[n, 3, 4] = broadcast %g
  %b: f32[1, 1, 4] = constant [0.25, 0.0, -0.5, 1.0]
  %bb: f32[n, 3, 4] = broadcast %b
  %s: f32[n, 3, 4] = mul %x, %gb
  %a: f32[n, 3, 4] = add %s, %bb
  %r: f32[3*n, 4] = reshape %x
  %w: f32[4, 2] = constant [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
  %y.weight: f32[4, 2] = constant [0.5, 1.0, 6.0, 8.0, -5.0, -6.0, 10.5, 12.0]
  %y.bias: f32[1, 2] = constant [4.75, 5.5]
  %y.bias_1: f32[3*n, 2] = broadcast %y.bias
  %y.product: f32[3*n, 2] = matmul %r, %y.weight
  %y: f32[3*n, 2] = add %y.product, %y.bias_1
  %t: f32[n, 3, 4] = add %x, %bb
  %rt: f32[3*n, 4] = reshape %t
  %u: f32[3*n, 2] = matmul %rt, %w
  %v: f32[n, 3, 4] = neg %t
  output %y, %u, %v
}
";
    check(&FoldAffineIntoMatMul, BEFORE, AFTER);
    let x = ir::Tensor::new(
        vec![2, 3, 4],
        ir::Elems::F32((0..24).map(|i| (i % 7) as f32 * 0.75 - 2.0).collect()),
    )
    .expect("x");
    let before = reference::run(&parse(BEFORE), &[("x", x.clone())]).expect("before");
    let after = reference::run(&parse(AFTER), &[("x", x)]).expect("after");
    for ((name, b), (_, a)) in before.iter().zip(&after) {
        let (b, a) = (b.to_f64_vec(), a.to_f64_vec());
        assert!(
            b.iter().zip(&a).all(|(b, a)| (b - a).abs() <= 1e-5 * b.abs().max(1.0)),
            "{name}: {b:?} {a:?}"
        );
    }
}

/// `β·W` joins the bias the product's one reader already adds (GPT-2's
/// projections have one): one add, of the bias plus `β·W`.
#[test]
fn a_norms_shift_joins_the_products_bias() {
    const BEFORE: &str = "graph {
  sym n param 1..
  input %x: f32[n, 2]
  %b: f32[1, 2] = constant [1.0, -1.0]
  %bb: f32[n, 2] = broadcast %b
  %a: f32[n, 2] = add %x, %bb
  %w: f32[2, 3] = constant [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
  %y: f32[n, 3] = matmul %a, %w
  %c: f32[1, 3] = constant [0.5, 0.25, 0.125]
  %cb: f32[n, 3] = broadcast %c
  %z: f32[n, 3] = add %cb, %y
  output %z
}
";
    const AFTER: &str = "graph {
  sym n param 1..
  input %x: f32[n, 2]
  %b: f32[1, 2] = constant [1.0, -1.0]
  %bb: f32[n, 2] = broadcast %b
  %a: f32[n, 2] = add %x, %bb
  %w: f32[2, 3] = constant [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
  %y.weight: f32[2, 3] = constant [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
  %y.bias: f32[1, 3] = constant [-2.5, -2.75, -2.875]
  %y.bias_1: f32[n, 3] = broadcast %y.bias
  %y: f32[n, 3] = matmul %x, %y.weight
  %c: f32[1, 3] = constant [0.5, 0.25, 0.125]
  %cb: f32[n, 3] = broadcast %c
  %z: f32[n, 3] = add %y.bias_1, %y
  output %z
}
";
    check(&FoldAffineIntoMatMul, BEFORE, AFTER);
    let x = ir::Tensor::new(vec![3, 2], ir::Elems::F32(vec![0.5, -1.0, 2.0, 0.0, -3.0, 1.5])).expect("x");
    let before = reference::run(&parse(BEFORE), &[("x", x.clone())]).expect("before");
    let after = reference::run(&parse(AFTER), &[("x", x)]).expect("after");
    assert_eq!(before[0].1.to_f64_vec(), after[0].1.to_f64_vec());
}
