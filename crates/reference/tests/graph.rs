//! Binding checks (the user-facing errors), multi-node graphs with symbolic
//! shapes, the per-node type check, and the size guard.

mod common;

use common::reference::{self, RefError};
use common::*;
use ir::{BinaryOp, DType, Graph, Op, ReduceOp, TensorType, UnaryOp};
use sym::{lit, Range, ShapeEnv, SymOrigin};

/// `a: f32[batch, seq]`, `m: f32[seq]` with `seq` in 1..=512;
/// `y = a + broadcast(m)`, `s = reduce_sum(y, axis 1)`; outputs `s`, `y`, `a`.
fn model() -> Graph {
    let mut env = ShapeEnv::new();
    let batch = env.declare("batch", Range::at_least(1), SymOrigin::User).unwrap();
    let seq = env.declare("seq", Range::new(1, 512), SymOrigin::User).unwrap();
    let mut g = Graph::new(env);
    let a = g.add_input("a", TensorType::new(DType::F32, vec![batch.clone(), seq.clone()]));
    let m = g.add_input("m", TensorType::new(DType::F32, vec![seq.clone()]));
    let bs = TensorType::new(DType::F32, vec![batch.clone(), seq.clone()]);
    let m2 = g.add_node(Op::Reshape, vec![m], "m2", TensorType::new(DType::F32, vec![lit(1), seq.clone()]));
    let mb = g.add_node(Op::Broadcast, vec![m2], "mb", bs.clone());
    let y = g.add_node(Op::Binary(BinaryOp::Add), vec![a, mb], "y", bs);
    let reduce = Op::Reduce { op: ReduceOp::Sum, axes: vec![1], keep_dims: false };
    let s = g.add_node(reduce, vec![y], "s", TensorType::new(DType::F32, vec![batch]));
    g.outputs.extend([s, y, a]);
    g
}

#[test]
fn runs_at_several_shapes() {
    let g = model();
    for (batch, seq) in [(1, 1), (2, 3), (3, 17)] {
        let a: Vec<f32> = (0..batch * seq).map(|v| v as f32).collect();
        let m: Vec<f32> = (0..seq).map(|v| 100.0 * v as f32).collect();
        let out = reference::run(&g, &[("m", f32t(&[seq], &m)), ("a", f32t(&[batch, seq], &a))]).unwrap();
        let names: Vec<&str> = out.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["s", "y", "a"]);
        let want_y: Vec<f32> = (0..batch * seq).map(|i| a[i] + m[i % seq]).collect();
        assert_eq!(f32s(&out[1].1), want_y);
        let want_s: Vec<f32> = (0..batch).map(|b| want_y[b * seq..(b + 1) * seq].iter().sum()).collect();
        assert_eq!((out[0].1.shape(), f32s(&out[0].1)), (&[batch][..], want_s));
        assert_eq!(out[2].1, f32t(&[batch, seq], &a));
    }
}

#[test]
fn binding_returns_symbol_values() {
    let g = model();
    let b =
        reference::bind_inputs(&g, &[("a", f32t(&[2, 3], &[0.0; 6])), ("m", f32t(&[3], &[0.0; 3]))]).unwrap();
    assert_eq!((b.get("batch"), b.get("seq")), (Some(2), Some(3)));
}

#[test]
fn missing_input_names_it_and_lists_the_inputs() {
    let err = reference::run(&model(), &[("a", f32t(&[1, 1], &[0.0]))]).unwrap_err();
    assert_eq!(err, RefError::MissingInput { name: "m".into(), expected: "a, m".into() });
    assert_eq!(err.to_string(), "missing input 'm' (the graph's inputs are: a, m)");
}

#[test]
fn unknown_and_duplicate_inputs() {
    let (a, m) = (f32t(&[1, 1], &[0.0]), f32t(&[1], &[0.0]));
    let err =
        reference::run(&model(), &[("a", a.clone()), ("m", m.clone()), ("mask", m.clone())]).unwrap_err();
    assert_eq!(err.to_string(), "unknown input 'mask' (the graph's inputs are: a, m)");
    let err = reference::run(&model(), &[("a", a.clone()), ("m", m.clone()), ("a", a)]).unwrap_err();
    assert_eq!(err, RefError::DuplicateInput("a".into()));
}

#[test]
fn wrong_dtype_names_input_expected_and_got() {
    let err = reference::run(&model(), &[("a", i64t(&[1, 1], &[0])), ("m", f32t(&[1], &[0.0]))]).unwrap_err();
    assert_eq!(err.to_string(), "input 'a' must be f32 (f32[batch, seq]), got i64");
}

#[test]
fn wrong_rank() {
    let err =
        reference::run(&model(), &[("a", f32t(&[2], &[0.0; 2])), ("m", f32t(&[2], &[0.0; 2]))]).unwrap_err();
    assert_eq!(err.to_string(), "input 'a' must have rank 2 (f32[batch, seq]), got shape [2]");
}

#[test]
fn shared_symbol_with_different_lengths() {
    let err = reference::run(&model(), &[("a", f32t(&[2, 5], &[0.0; 10])), ("m", f32t(&[4], &[0.0; 4]))])
        .unwrap_err();
    assert!(matches!(err, RefError::Binding(_)), "{err:?}");
    let msg = err.to_string();
    // The input, the dim, and the rule it breaks.
    assert!(msg.contains("input 'm' dim 0 is 4"), "{msg}");
    assert!(msg.contains("must be seq = 5"), "{msg}");
}

#[test]
fn symbol_range_violation() {
    let err =
        reference::run(&model(), &[("a", f32t(&[1, 600], &[0.0; 600])), ("m", f32t(&[600], &[0.0; 600]))])
            .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("input 'a' dim 1") && msg.contains("seq = 600") && msg.contains("1..512"), "{msg}");
}

#[test]
fn wrong_node_type_is_an_internal_error_naming_value_and_op() {
    // The importer claims y: f32[seq + 1] for an element-wise add of two f32[seq].
    let mut env = ShapeEnv::new();
    let seq = env.declare("seq", Range::at_least(1), SymOrigin::User).unwrap();
    let mut g = Graph::new(env);
    let x = g.add_input("x", TensorType::new(DType::F32, vec![seq.clone()]));
    let wrong = TensorType::new(DType::F32, vec![seq.try_add(&lit(1)).unwrap()]);
    let y = g.add_node(Op::Binary(BinaryOp::Mul), vec![x, x], "y", wrong);
    g.outputs.push(y);
    let err = reference::run(&g, &[("x", f32t(&[3], &[1.0, 2.0, 3.0]))]).unwrap_err();
    assert!(matches!(&err, RefError::TypeMismatch { op: "mul", value, .. } if value == "y"), "{err:?}");
    assert_eq!(
        err.to_string(),
        "internal error: mul computed 'y' as f32[3], but its type f32[seq+1] evaluates to f32[4]"
    );
    // A wrong dtype is caught too.
    let mut g2 = Graph::new(ShapeEnv::new());
    let x = g2.add_input("x", TensorType::fixed(DType::F32, &[1]));
    let y = g2.add_node(Op::Binary(BinaryOp::Less), vec![x, x], "lt", TensorType::fixed(DType::F32, &[1]));
    g2.outputs.push(y);
    let err = reference::run(&g2, &[("x", f32t(&[1], &[1.0]))]).unwrap_err();
    assert!(err.to_string().contains("as bool[1], but its type f32[1]"), "{err}");
}

#[test]
fn absurd_sizes_are_refused_without_allocating() {
    let err = try_eval(Op::Iota { axis: 0 }, NO_INPUTS, Some(TensorType::fixed(DType::F32, &[1 << 40])))
        .unwrap_err();
    assert!(matches!(err, RefError::TooLarge { op: "iota", .. }), "{err:?}");
    let ty = Some(TensorType::fixed(DType::F32, &[1 << 20, 1 << 20]));
    let err = try_eval(Op::Broadcast, &[f32t(&[1, 1], &[0.0])], ty).unwrap_err();
    assert!(err.to_string().contains("more than 17179869184 elements"), "{err}");
    let ty = Some(TensorType::fixed(DType::F32, &[2, -1]));
    let err = try_eval(Op::Broadcast, &[f32t(&[1, 1], &[0.0])], ty).unwrap_err();
    assert!(err.to_string().contains("-1 < 0"), "{err}");
}

#[test]
fn graph_errors_are_reported_not_panics() {
    // An output that nothing computes, and a node with the wrong arity.
    let mut g = Graph::new(ShapeEnv::new());
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[1]));
    let dangling = g.add_value("dangling", TensorType::fixed(DType::F32, &[1]));
    g.outputs.push(dangling);
    let err = reference::run(&g, &[("x", f32t(&[1], &[1.0]))]).unwrap_err();
    assert!(err.to_string().contains("no node computes this graph output"), "{err}");
    g.outputs.clear();
    let y = g.add_node(Op::Binary(BinaryOp::Add), vec![x], "y", TensorType::fixed(DType::F32, &[1]));
    g.outputs.push(y);
    let err = reference::run(&g, &[("x", f32t(&[1], &[1.0]))]).unwrap_err();
    assert_eq!(err.to_string(), "add computing 'y': takes 2 inputs, got 1");
    // Nodes out of topological order.
    let mut g = Graph::new(ShapeEnv::new());
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[1]));
    let ty = TensorType::fixed(DType::F32, &[1]);
    let a = g.add_node(Op::Unary(UnaryOp::Neg), vec![x], "a", ty.clone());
    let b = g.add_node(Op::Unary(UnaryOp::Exp), vec![a], "b", ty);
    g.outputs.push(b);
    g.nodes.swap(0, 1);
    let err = reference::run(&g, &[("x", f32t(&[1], &[1.0]))]).unwrap_err();
    assert_eq!(err.to_string(), "exp computing 'b': its input 'a' is used before it is computed");
}
