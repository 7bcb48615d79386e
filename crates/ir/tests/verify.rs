//! Verifier tests: each broken graph is rejected with the specific error.

mod common;

use common::*;
use ir::*;
use sym::{lit, sym, Range, ShapeEnv, SymExpr, SymOrigin};

fn env(names: &[&str]) -> ShapeEnv {
    let mut env = ShapeEnv::new();
    for n in names {
        env.declare(n, Range::at_least(1), SymOrigin::User).unwrap();
    }
    env
}

fn f32t(dims: &[SymExpr]) -> TensorType {
    ty(DType::F32, dims)
}

/// The message of a type error from `op`, panicking on anything else.
fn type_err(g: &Graph, op: &str) -> String {
    match verify(g) {
        Err(IrError::Type { op: o, msg }) if o == op => msg,
        other => panic!("expected a {op} type error, got {other:?}\n{g}"),
    }
}

fn invalid(g: &Graph) -> String {
    match verify(g) {
        Err(IrError::Invalid(msg)) => msg,
        other => panic!("expected an invalid-graph error, got {other:?}\n{g}"),
    }
}

/// A graph with input `%x: f32[dims]` and one node `op(%x)` of type `out`.
fn unary_graph(env: ShapeEnv, dims: &[SymExpr], op: Op, out: TensorType) -> Graph {
    let mut g = Graph::new(env);
    let x = g.add_input("x", f32t(dims));
    let y = g.add_node(op, vec![x], "y", out);
    g.outputs = vec![y];
    g
}

#[test]
fn accepts_the_kitchen_sink() {
    verify(&kitchen_sink()).unwrap();
}

#[test]
fn use_before_definition() {
    let mut g = Graph::new(ShapeEnv::new());
    let t = TensorType::fixed(DType::F32, &[2]);
    let x = g.add_input("x", t.clone());
    let y = g.add_value("y", t.clone());
    let z = g.add_value("z", t);
    g.nodes.push(Node { op: Op::Unary(UnaryOp::Neg), inputs: vec![y], output: z });
    g.nodes.push(Node { op: Op::Unary(UnaryOp::Neg), inputs: vec![x], output: y });
    g.outputs = vec![z];
    assert_eq!(invalid(&g), "%z (neg) uses %y before its definition (node 1, neg)");
}

#[test]
fn self_reference_is_use_before_definition() {
    let mut g = Graph::new(ShapeEnv::new());
    let y = g.add_value("y", TensorType::fixed(DType::F32, &[2]));
    g.nodes.push(Node { op: Op::Unary(UnaryOp::Neg), inputs: vec![y], output: y });
    assert_eq!(invalid(&g), "%y (neg) uses %y before its definition (node 0, neg)");
}

#[test]
fn use_of_an_undefined_value() {
    let mut g = Graph::new(ShapeEnv::new());
    let t = TensorType::fixed(DType::F32, &[2]);
    let orphan = g.add_value("orphan", t.clone());
    let y = g.add_node(Op::Unary(UnaryOp::Neg), vec![orphan], "y", t);
    g.outputs = vec![y];
    assert_eq!(invalid(&g), "%y (neg) uses %orphan, which is neither a graph input nor a node output");
}

#[test]
fn value_defined_twice() {
    let mut g = Graph::new(ShapeEnv::new());
    let t = TensorType::fixed(DType::F32, &[2]);
    let x = g.add_input("x", t.clone());
    let y = g.add_node(Op::Unary(UnaryOp::Neg), vec![x], "y", t);
    g.nodes.push(Node { op: Op::Unary(UnaryOp::Exp), inputs: vec![x], output: y });
    assert_eq!(invalid(&g), "%y is defined twice: by node 0 (neg) and node 1 (exp)");
}

#[test]
fn graph_input_redefined_by_a_node() {
    let mut g = Graph::new(ShapeEnv::new());
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[2]));
    g.nodes.push(Node { op: Op::Unary(UnaryOp::Neg), inputs: vec![x], output: x });
    assert_eq!(invalid(&g), "graph input %x is also the output of node 0 (neg)");
}

#[test]
fn graph_input_listed_twice() {
    let mut g = Graph::new(ShapeEnv::new());
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[2]));
    g.inputs.push(x);
    assert_eq!(invalid(&g), "graph input %x is listed twice");
}

#[test]
fn undefined_output() {
    let mut g = Graph::new(ShapeEnv::new());
    let v = g.add_value("/out", TensorType::fixed(DType::F32, &[2]));
    g.outputs = vec![v];
    assert_eq!(invalid(&g), r#"graph output %"/out" is neither a graph input nor a node output"#);
}

#[test]
fn dangling_value_id() {
    let mut g = Graph::new(ShapeEnv::new());
    g.outputs = vec![ValueId(7)];
    assert_eq!(invalid(&g), "graph output 0 refers to v7, but the graph has 0 values");
    // The printer copes with it too.
    assert!(print_graph(&g).contains("output %?v7"));
}

#[test]
fn empty_name() {
    let mut g = Graph::new(ShapeEnv::new());
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[2]));
    g.rename(x, "");
    assert_eq!(invalid(&g), "value v0 has an empty name");
}

#[test]
fn wrong_arity() {
    let mut g = Graph::new(ShapeEnv::new());
    let t = TensorType::fixed(DType::F32, &[2]);
    let x = g.add_input("x", t.clone());
    g.add_node(Op::Binary(BinaryOp::Add), vec![x], "y", t.clone());
    assert_eq!(type_err(&g, "add"), "%y: takes 2 inputs, got 1");
    let mut g = Graph::new(ShapeEnv::new());
    g.add_node(Op::Concat { axis: 0 }, vec![], "c", t);
    assert_eq!(type_err(&g, "concat"), "%c: needs at least one input");
}

#[test]
fn matmul_contraction_mismatch() {
    let (m, k, j, n) = (sym("m"), sym("k"), sym("j"), sym("n"));
    let mut g = Graph::new(env(&["m", "k", "j", "n"]));
    let a = g.add_input("a", f32t(&[m.clone(), k]));
    let b = g.add_input("b", f32t(&[j, n.clone()]));
    g.add_node(Op::MATMUL, vec![a, b], "y", f32t(&[m, n]));
    assert_eq!(type_err(&g, "matmul"), "%y: contraction dims differ: f32[m, k] and f32[j, n]");
}

#[test]
fn matmul_contraction_equal_through_the_env() {
    let mut e = env(&["m", "k", "j", "n"]);
    e.equate(&sym("k"), &sym("j")).unwrap();
    let mut g = Graph::new(e);
    let a = g.add_input("a", f32t(&[sym("m"), sym("k")]));
    let b = g.add_input("b", f32t(&[sym("j"), sym("n")]));
    let y = g.add_node(Op::MATMUL, vec![a, b], "y", f32t(&[sym("m"), sym("n")]));
    g.outputs = vec![y];
    verify(&g).unwrap();
}

#[test]
fn stored_type_disagrees_with_inference() {
    let mut g = Graph::new(env(&["m", "k", "n"]));
    let a = g.add_input("a", f32t(&[sym("m"), sym("k")]));
    let b = g.add_input("b", f32t(&[sym("k"), sym("n")]));
    g.add_node(Op::MATMUL, vec![a, b], "y", f32t(&[sym("m"), sym("m")]));
    assert_eq!(type_err(&g, "matmul"), "%y: stored type f32[m, m], but the inputs give f32[m, n]");

    let mut g = Graph::new(env(&["n"]));
    let x = g.add_input("x", f32t(&[sym("n")]));
    g.add_node(Op::Unary(UnaryOp::Exp), vec![x], "e", ty(DType::F64, &[sym("n")]));
    assert_eq!(type_err(&g, "exp"), "%e: stored type f64[n], but the inputs give f32[n]");
}

#[test]
fn collapsed_dims_are_equal_through_the_env() {
    // `unk0` is known to be batch*seq: a reshape and an add across them verify.
    let mut g = Graph::new(common::env());
    let x = g.add_input("x", f32t(&[sym("batch"), sym("seq")]));
    let flat = g.add_node(Op::Reshape, vec![x], "flat", f32t(&[sym("unk0")]));
    let y = g.add_input("y", f32t(&[sym("batch") * sym("seq")]));
    let s = g.add_node(Op::Binary(BinaryOp::Add), vec![flat, y], "s", f32t(&[sym("batch") * sym("seq")]));
    g.outputs = vec![s];
    verify(&g).unwrap();
}

#[test]
fn bad_broadcast() {
    let g = unary_graph(ShapeEnv::new(), &[lit(3)], Op::Broadcast, f32t(&[lit(4)]));
    assert_eq!(
        type_err(&g, "broadcast"),
        "%y: cannot broadcast f32[3] to f32[4]: each dim must be equal, 1, or declared to broadcast (`assert D broadcasts to E`)"
    );
    let g = unary_graph(env(&["m", "n"]), &[sym("m")], Op::Broadcast, f32t(&[sym("n")]));
    assert_eq!(
        type_err(&g, "broadcast"),
        "%y: cannot broadcast f32[m] to f32[n]: each dim must be equal, 1, or declared to broadcast (`assert D broadcasts to E`)"
    );
    let g = unary_graph(env(&["n"]), &[lit(1)], Op::Broadcast, f32t(&[lit(2), sym("n")]));
    assert!(type_err(&g, "broadcast").contains("cannot broadcast f32[1] to f32[2, n]"));
    let g = unary_graph(env(&["n"]), &[lit(1), sym("n")], Op::Broadcast, f32t(&[sym("n") * 3, sym("n")]));
    verify(&g).unwrap();
}

#[test]
fn reshape_count_mismatch() {
    let g = unary_graph(ShapeEnv::new(), &[lit(2), lit(3)], Op::Reshape, f32t(&[lit(5)]));
    assert_eq!(type_err(&g, "reshape"), "%y: cannot reshape f32[2, 3] (6 elements) to f32[5] (5 elements)");
    let g = unary_graph(env(&["n"]), &[sym("n"), lit(4)], Op::Reshape, f32t(&[lit(2), sym("n") * 2]));
    verify(&g).unwrap();
    let g = unary_graph(ShapeEnv::new(), &[lit(6)], Op::Reshape, ty(DType::I64, &[lit(6)]));
    assert_eq!(type_err(&g, "reshape"), "%y: output dtype i64 differs from the input's f32");
}

#[test]
fn slice_rules() {
    let n = sym("n");
    let sl = |axis, step| Op::Slice { axes: vec![SliceAxis { axis, start: lit(0), step }] };
    let g = unary_graph(env(&["n"]), &[n.clone(), lit(4)], sl(2, 1), f32t(&[n.clone(), lit(4)]));
    assert_eq!(type_err(&g, "slice"), "%y: axis 2 out of range for f32[n, 4]");
    let g = unary_graph(env(&["n"]), &[n.clone(), lit(4)], sl(1, 0), f32t(&[n.clone(), lit(4)]));
    assert_eq!(type_err(&g, "slice"), "%y: axis 1 has step 0");
    let twice = Op::Slice {
        axes: vec![
            SliceAxis { axis: 1, start: lit(0), step: 1 },
            SliceAxis { axis: 1, start: lit(1), step: 1 },
        ],
    };
    let g = unary_graph(env(&["n"]), &[n.clone(), lit(4)], twice, f32t(&[n.clone(), lit(3)]));
    assert_eq!(type_err(&g, "slice"), "%y: axis 1 sliced twice");
    let g = unary_graph(env(&["n"]), &[n.clone(), lit(4)], sl(1, 1), f32t(&[n.clone() - 1, lit(2)]));
    assert_eq!(type_err(&g, "slice"), "%y: dim 0 is not sliced but changes: f32[n, 4] to f32[n-1, 2]");
    let g = unary_graph(
        env(&["n"]),
        &[n.clone(), lit(4)],
        sl(1, 1),
        TensorType::new(DType::F32, vec![n.clone()]),
    );
    assert_eq!(type_err(&g, "slice"), "%y: slice changes the rank: f32[n, 4] to f32[n]");
    let g = unary_graph(env(&["n"]), &[n.clone(), lit(4)], sl(1, -1), f32t(&[n, lit(2)]));
    verify(&g).unwrap();
}

#[test]
fn cast_keeps_the_shape() {
    let g = unary_graph(ShapeEnv::new(), &[lit(2)], Op::Cast, ty(DType::I32, &[lit(3)]));
    assert_eq!(type_err(&g, "cast"), "%y: cast changes the shape: f32[2] to i32[3]");
    let g = unary_graph(ShapeEnv::new(), &[lit(2)], Op::Cast, ty(DType::Bool, &[lit(2)]));
    verify(&g).unwrap();
}

#[test]
fn iota_rules() {
    let mut g = Graph::new(ShapeEnv::new());
    g.add_node(Op::Iota { axis: 1 }, vec![], "i", ty(DType::I64, &[lit(4)]));
    assert_eq!(type_err(&g, "iota"), "%i: axis 1 out of range for i64[4]");
    let mut g = Graph::new(ShapeEnv::new());
    g.add_node(Op::Iota { axis: 0 }, vec![], "i", ty(DType::Bool, &[lit(4)]));
    assert_eq!(type_err(&g, "iota"), "%i: iota needs an integer or float output, got bool");
}

#[test]
fn sym_const_rules() {
    let mut g = Graph::new(env(&["n"]));
    g.add_node(Op::SymConst(vec![sym("n"), lit(2)]), vec![], "s", ty(DType::I64, &[lit(3)]));
    assert_eq!(
        type_err(&g, "sym_const"),
        "%s: 2 expressions do not fit i64[3] (rank 1 of that length, or a scalar)"
    );
    let mut g = Graph::new(env(&["n"]));
    g.add_node(Op::SymConst(vec![sym("n")]), vec![], "s", ty(DType::I32, &[lit(1)]));
    assert_eq!(type_err(&g, "sym_const"), "%s: output dtype must be i64, got i32");
    let mut g = Graph::new(env(&["n"]));
    g.add_node(Op::SymConst(vec![sym("n") * 2]), vec![], "s", ty(DType::I64, &[]));
    verify(&g).unwrap();
}

#[test]
fn fixed_dtype_of_comparisons() {
    let mut g = Graph::new(ShapeEnv::new());
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[2]));
    g.add_node(Op::Binary(BinaryOp::Less), vec![x, x], "lt", TensorType::fixed(DType::F32, &[2]));
    assert_eq!(type_err(&g, "less"), "%lt: output dtype must be bool, got f32");
}

#[test]
fn pool_rules() {
    let pool = |kernel: Vec<i64>| {
        Op::Pool(PoolAttrs {
            kind: PoolKind::Avg { count_include_pad: true },
            kernel,
            strides: vec![1, 1],
            dilations: vec![1, 1],
            pads_begin: vec![0, 0],
            pads_end: vec![0, 0],
            channels_last: false,
        })
    };
    let (n, h) = (sym("n"), sym("h"));
    let x = [n.clone(), lit(3), h.clone(), h.clone()];
    let g = unary_graph(env(&["n", "h"]), &x, pool(vec![2]), f32t(&x));
    assert_eq!(type_err(&g, "avg_pool"), "%y: kernel has 1 entries for 2 spatial dims");
    let g = unary_graph(env(&["n", "h"]), &x, pool(vec![2, 0]), f32t(&x));
    assert_eq!(type_err(&g, "avg_pool"), "%y: kernel must be >= 1, got 0");
    let g =
        unary_graph(env(&["n", "h"]), &x, pool(vec![2, 2]), f32t(&[n.clone(), lit(4), h.clone(), h.clone()]));
    assert_eq!(
        type_err(&g, "avg_pool"),
        "%y: batch and channel dims of f32[n, 3, h, h] and f32[n, 4, h, h] differ"
    );
    let g = unary_graph(env(&["n", "h"]), &[n.clone(), lit(3)], pool(vec![2, 2]), f32t(&[n.clone(), lit(3)]));
    assert_eq!(type_err(&g, "avg_pool"), "%y: input f32[n, 3] needs rank >= 3");
    let g = unary_graph(env(&["n", "h"]), &x, pool(vec![2, 2]), f32t(&[n, lit(3), h.clone() - 1, h - 1]));
    verify(&g).unwrap();
}

#[test]
fn conv_transpose_rules() {
    let geom = |group| ConvAttrs {
        strides: vec![2],
        dilations: vec![1],
        pads_begin: vec![0],
        pads_end: vec![0],
        group,
    };
    let n = sym("n");
    let build = |w: &[i64], out_c: i64, group: i64| {
        let mut g = Graph::new(env(&["n"]));
        let x = g.add_input("x", f32t(&[n.clone(), lit(4), lit(5)]));
        let wv = g.add_input("w", TensorType::fixed(DType::F32, w));
        g.add_node(Op::ConvTranspose(geom(group)), vec![x, wv], "y", f32t(&[n.clone(), lit(out_c), lit(11)]));
        g
    };
    verify(&build(&[4, 3, 2], 3, 1)).unwrap();
    verify(&build(&[4, 3, 2], 6, 2)).unwrap();
    assert_eq!(
        type_err(&build(&[5, 3, 2], 3, 1), "conv_transpose"),
        "%y: input channels of f32[n, 4, 5] differ from the weight's f32[5, 3, 2]"
    );
    assert_eq!(
        type_err(&build(&[4, 3, 2], 3, 2), "conv_transpose"),
        "%y: output channels of f32[n, 3, 11] != group 2 x weight dim 1 of f32[4, 3, 2]"
    );
    assert_eq!(
        type_err(&build(&[4, 3, 2, 2], 3, 1), "conv_transpose"),
        "%y: weight f32[4, 3, 2, 2] must have the input's rank 3"
    );
    assert_eq!(type_err(&build(&[4, 3, 2], 3, 0), "conv_transpose"), "%y: group must be >= 1, got 0");
}

#[test]
fn conv_errors_come_from_infer() {
    let mut g = Graph::new(ShapeEnv::new());
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[1, 4, 8]));
    let w = g.add_input("w", TensorType::fixed(DType::F32, &[2, 3, 3]));
    let geom =
        ConvAttrs { strides: vec![1], dilations: vec![1], pads_begin: vec![0], pads_end: vec![0], group: 1 };
    g.add_node(Op::Conv(geom), vec![x, w], "y", TensorType::fixed(DType::F32, &[1, 2, 6]));
    assert_eq!(type_err(&g, "conv"), "%y: input channels 4 != group 1 x weight channels 3");
    // Absurd geometry is an error, not an overflow panic.
    let mut g = Graph::new(ShapeEnv::new());
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[1, 3, 8]));
    let w = g.add_input("w", TensorType::fixed(DType::F32, &[2, 3, 3]));
    let geom = ConvAttrs {
        strides: vec![1],
        dilations: vec![i64::MAX],
        pads_begin: vec![0],
        pads_end: vec![0],
        group: 1,
    };
    g.add_node(Op::Conv(geom), vec![x, w], "y", TensorType::fixed(DType::F32, &[1, 2, 6]));
    assert_eq!(type_err(&g, "conv"), "%y: convolution geometry overflows");
}

#[test]
fn constant_type_must_match_its_data() {
    let mut g = Graph::new(ShapeEnv::new());
    g.add_node(Op::Constant(f32s(&[2], &[1.0, 2.0])), vec![], "c", TensorType::fixed(DType::F32, &[3]));
    assert_eq!(type_err(&g, "constant"), "%c: stored type f32[3], but the inputs give f32[2]");
}

#[test]
fn negative_dims() {
    let mut g = Graph::new(ShapeEnv::new());
    g.add_input("x", TensorType::fixed(DType::F32, &[2, -1]));
    assert_eq!(invalid(&g), "graph input %x: f32[2, -1] has a negative dim -1");
    let g = unary_graph(env(&["n"]), &[sym("n")], Op::Reshape, f32t(&[lit(0) - sym("n"), lit(-1)]));
    assert_eq!(type_err(&g, "reshape"), "%y: f32[-n, -1] has a negative dim -n");
}

#[test]
fn infer_errors_name_the_value() {
    let mut g = Graph::new(ShapeEnv::new());
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[2, 3]));
    g.add_node(
        Op::Transpose { perm: vec![0, 0] },
        vec![x],
        "onnx::T_1",
        TensorType::fixed(DType::F32, &[2, 2]),
    );
    assert_eq!(type_err(&g, "transpose"), r#"%"onnx::T_1": [0, 0] is not a permutation of rank 2"#);
    assert_eq!(
        verify(&g).unwrap_err().to_string(),
        r#"transpose: %"onnx::T_1": [0, 0] is not a permutation of rank 2"#
    );
}
