//! Symbolic shape propagation on small hand-built models: shape sub-graphs are
//! evaluated at compile time, and the constraints ops imply land in the
//! `ShapeEnv`. Each test checks the IR text (golden) and runs the graph.

mod common;

use anyshape_onnx::proto::data_type::{FLOAT, INT64};
use anyshape_onnx::{import_bytes, ImportOptions};
use common::*;
use ir::{Elems, Op, Tensor};

fn import(m: &anyshape_onnx::proto::ModelProto) -> ir::Graph {
    let g = import_bytes(&encode(m), &ImportOptions::new()).unwrap_or_else(|e| panic!("{e}"));
    ir::verify(&g).unwrap_or_else(|e| panic!("{e}\n{g}"));
    g
}

fn f32s(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::new(shape.to_vec(), Elems::F32((0..n).map(|i| (i % 7) as f32 - 3.0).collect())).expect("tensor")
}

/// BERT's head split: `Reshape(x, Concat(Gather(Shape(x), 0), Gather(Shape(x), 1), [2, 4]))`.
#[test]
fn shape_chain_becomes_a_symbolic_reshape() {
    let m = model(
        vec![
            node("Shape", &["x"], &["s"], vec![]),
            node("Gather", &["s", "i0"], &["b"], vec![attr_int("axis", 0)]),
            node("Gather", &["s", "i1"], &["t"], vec![attr_int("axis", 0)]),
            node("Unsqueeze", &["b", "ax0"], &["b1"], vec![]),
            node("Unsqueeze", &["t", "ax0"], &["t1"], vec![]),
            node("Concat", &["b1", "t1", "heads"], &["shape"], vec![attr_int("axis", 0)]),
            node("Reshape", &["x", "shape"], &["y"], vec![]),
        ],
        vec![value_info("x", FLOAT, &[Dim::P("batch"), Dim::P("seq"), Dim::V(8)])],
        &["y"],
        vec![
            i64_tensor("i0", &[], &[0]),
            i64_tensor("i1", &[], &[1]),
            i64_tensor("ax0", &[1], &[0]),
            i64_tensor("heads", &[2], &[2, 4]),
        ],
        17,
    );
    let g = import(&m);
    assert_eq!(
        g.to_string(),
        "graph {
  sym batch param 1..2147483647
  sym seq param 1..2147483647
  input %x: f32[batch, seq, 8]
  %y: f32[batch, seq, 2, 4] = reshape %x
  output %y
}
"
    );
    let out = reference::run(&g, &[("x", f32s(&[3, 5, 8]))]).expect("run");
    assert_eq!(out[0].1.shape(), &[3, 5, 2, 4]);
}
