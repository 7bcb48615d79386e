//! Helpers shared by the integration tests: tensor builders and a one-op graph runner.
#![allow(dead_code)]

pub use anyshape_reference as reference;
use std::borrow::Borrow;

use ir::{DType, Elems, Graph, Op, Tensor, TensorType};
use reference::RefError;
use sym::ShapeEnv;

/// The inputs of an op that takes none.
pub const NO_INPUTS: &[Tensor] = &[];

pub fn f32t(shape: &[usize], v: &[f32]) -> Tensor {
    Tensor::new(shape.to_vec(), Elems::F32(v.to_vec())).unwrap()
}
pub fn f64t(shape: &[usize], v: &[f64]) -> Tensor {
    Tensor::new(shape.to_vec(), Elems::F64(v.to_vec())).unwrap()
}
pub fn i64t(shape: &[usize], v: &[i64]) -> Tensor {
    Tensor::new(shape.to_vec(), Elems::I64(v.to_vec())).unwrap()
}
pub fn i32t(shape: &[usize], v: &[i32]) -> Tensor {
    Tensor::new(shape.to_vec(), Elems::I32(v.to_vec())).unwrap()
}
pub fn u8t(shape: &[usize], v: &[u8]) -> Tensor {
    Tensor::new(shape.to_vec(), Elems::U8(v.to_vec())).unwrap()
}
pub fn boolt(shape: &[usize], v: &[bool]) -> Tensor {
    Tensor::new(shape.to_vec(), Elems::Bool(v.to_vec())).unwrap()
}

/// The f32 elements of `t` (panics on another dtype).
pub fn f32s(t: &Tensor) -> Vec<f32> {
    match t.elems() {
        Elems::F32(v) => v.clone(),
        e => panic!("expected f32, got {:?}", e.dtype()),
    }
}
pub fn i64s(t: &Tensor) -> Vec<i64> {
    t.to_i64_vec().expect("an integer tensor")
}
pub fn bools(t: &Tensor) -> Vec<bool> {
    match t.elems() {
        Elems::Bool(v) => v.clone(),
        e => panic!("expected bool, got {:?}", e.dtype()),
    }
}

pub fn fixed(t: &Tensor) -> TensorType {
    TensorType::fixed(t.dtype(), &t.shape().iter().map(|d| *d as i64).collect::<Vec<_>>())
}

/// Runs `op` on `ins` (graph inputs `x0`, `x1`, … with fixed shapes). The output
/// type is `out` when given, else `ir::infer`'s.
pub fn try_eval<T: Borrow<Tensor>>(op: Op, ins: &[T], out: Option<TensorType>) -> Result<Tensor, RefError> {
    let ins: Vec<&Tensor> = ins.iter().map(Borrow::borrow).collect();
    let mut g = Graph::new(ShapeEnv::new());
    let ids = ins.iter().enumerate().map(|(i, t)| g.add_input(&format!("x{i}"), fixed(t))).collect();
    let ty = out.unwrap_or_else(|| {
        let tys: Vec<TensorType> = ins.iter().map(|t| fixed(t)).collect();
        let refs: Vec<&TensorType> = tys.iter().collect();
        ir::infer(&op, &refs, &g.env).expect("inferable").expect("op has an inferred type")
    });
    let y = g.add_node(op, ids, "y", ty);
    g.outputs.push(y);
    let names: Vec<String> = (0..ins.len()).map(|i| format!("x{i}")).collect();
    let named: Vec<(&str, Tensor)> =
        names.iter().map(|n| n.as_str()).zip(ins.iter().map(|t| (*t).clone())).collect();
    let mut outs = reference::run(&g, &named)?;
    assert_eq!(outs.len(), 1);
    assert_eq!(outs[0].0, "y");
    Ok(outs.remove(0).1)
}

/// [`try_eval`] with an inferred output type, unwrapped.
pub fn eval<T: Borrow<Tensor>>(op: Op, ins: &[T]) -> Tensor {
    try_eval(op, ins, None).unwrap_or_else(|e| panic!("{e}"))
}

/// [`try_eval`] with output type `dtype[dims]`, unwrapped.
pub fn eval_to<T: Borrow<Tensor>>(op: Op, ins: &[T], dtype: DType, dims: &[i64]) -> Tensor {
    try_eval(op, ins, Some(TensorType::fixed(dtype, dims))).unwrap_or_else(|e| panic!("{e}"))
}

/// Asserts element-wise closeness (NaNs must match NaNs).
pub fn assert_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "lengths differ: {got:?} vs {want:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= tol * w.abs().max(1.0);
        assert!(ok, "element {i}: got {g}, want {w}\n got: {got:?}\nwant: {want:?}");
    }
}
