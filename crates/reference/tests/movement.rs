//! Hand-checked tests of the data-movement ops: broadcast, reshape, transpose,
//! slice, concat, gather, pad.

mod common;

use common::reference;
use common::*;
use ir::{DType, Elems, Graph, Op, PadMode, SliceAxis, Tensor, TensorType};
use sym::{lit, sym, Range, ShapeEnv, SymExpr, SymOrigin};

fn seq(n: usize) -> Vec<f32> {
    (0..n).map(|v| v as f32).collect()
}

#[test]
fn broadcast_repeats_unit_dims() {
    let x = f32t(&[3, 1], &[1.0, 2.0, 3.0]);
    let got = eval_to(Op::Broadcast, &[x], DType::F32, &[3, 2]);
    assert_eq!(f32s(&got), [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]);
    let x = i64t(&[1, 2], &[7, 8]);
    assert_eq!(i64s(&eval_to(Op::Broadcast, &[x], DType::I64, &[2, 2])), [7, 8, 7, 8]);
    assert_eq!(eval_to(Op::Broadcast, &[f32t(&[], &[5.0])], DType::F32, &[]), f32t(&[], &[5.0]));
    assert_eq!(eval_to(Op::Broadcast, &[f32t(&[1], &[5.0])], DType::F32, &[0]), f32t(&[0], &[]));
    let ty = Some(TensorType::fixed(DType::F32, &[4]));
    let err = try_eval(Op::Broadcast, &[f32t(&[2], &[1.0, 2.0])], ty).unwrap_err();
    assert!(err.to_string().contains("cannot broadcast [2] to [4]"), "{err}");
}

#[test]
fn reshape_keeps_row_major_order() {
    let x = f32t(&[2, 3], &seq(6));
    let got = eval_to(Op::Reshape, &[&x], DType::F32, &[3, 1, 2]);
    assert_eq!((got.shape(), f32s(&got)), (&[3, 1, 2][..], seq(6)));
    let ty = Some(TensorType::fixed(DType::F32, &[4]));
    let err = try_eval(Op::Reshape, &[x], ty).unwrap_err();
    assert!(err.to_string().contains("cannot reshape [2, 3] (6 elements) to [4]"), "{err}");
}

#[test]
fn transpose_permutes_axes() {
    let x = f32t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let got = eval(Op::Transpose { perm: vec![1, 0] }, &[x]);
    assert_eq!((got.shape(), f32s(&got)), (&[3, 2][..], vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]));
    // out[i, j, 0] = x[j, 0, i]
    let x = i64t(&[2, 1, 2], &[1, 2, 3, 4]);
    let got = eval(Op::Transpose { perm: vec![2, 0, 1] }, &[x]);
    assert_eq!((got.shape(), i64s(&got)), (&[2, 2, 1][..], vec![1, 3, 2, 4]));
    let got = eval(Op::Transpose { perm: vec![1, 0] }, &[u8t(&[0, 2], &[])]);
    assert_eq!(got.shape(), [2, 0]);
}

fn slice_axis(axis: usize, start: i64, step: i64) -> SliceAxis {
    SliceAxis { axis, start: lit(start), step }
}

#[test]
fn slice_reads_start_plus_i_times_step() {
    let x = f32t(&[10], &seq(10));
    let s = |start, step, n| {
        eval_to(Op::Slice { axes: vec![slice_axis(0, start, step)] }, &[&x], DType::F32, &[n])
    };
    assert_eq!(f32s(&s(1, 3, 3)), [1.0, 4.0, 7.0]);
    assert_eq!(f32s(&s(9, -2, 5)), [9.0, 7.0, 5.0, 3.0, 1.0]);
    assert_eq!(f32s(&s(0, 1, 10)), seq(10));
    // An empty slice reads nothing, so any start is fine.
    assert_eq!(f32s(&s(50, 1, 0)), []);
    // Only the listed axes are sliced.
    let x = i64t(&[2, 3], &[0, 1, 2, 10, 11, 12]);
    let got = eval_to(Op::Slice { axes: vec![slice_axis(1, 2, -1)] }, &[x], DType::I64, &[2, 2]);
    assert_eq!(i64s(&got), [2, 1, 12, 11]);
}

#[test]
fn slice_bounds_are_checked() {
    let x = f32t(&[10], &seq(10));
    for (start, step, n) in [(8, 1, 3), (-1, 1, 2), (1, -1, 3)] {
        let op = Op::Slice { axes: vec![slice_axis(0, start, step)] };
        let err = try_eval(op, &[&x], Some(TensorType::fixed(DType::F32, &[n]))).unwrap_err();
        assert!(err.to_string().contains("outside the input extent 10"), "{err}");
    }
    let op = Op::Slice { axes: vec![slice_axis(0, 0, 1)] };
    let err =
        try_eval(op, &[f32t(&[2, 2], &seq(4))], Some(TensorType::fixed(DType::F32, &[1, 1]))).unwrap_err();
    assert!(err.to_string().contains("axis 1 is not sliced"), "{err}");
}

#[test]
fn slice_start_is_symbolic() {
    // y = x[seq-2 ..], the last two elements, whatever seq is.
    let mut env = ShapeEnv::new();
    let s = env.declare("seq", Range::at_least(2), SymOrigin::User).unwrap();
    let mut g = Graph::new(env);
    let x = g.add_input("x", TensorType::new(DType::F32, vec![s.clone()]));
    let start = s.try_sub(&lit(2)).unwrap();
    let op = Op::Slice { axes: vec![SliceAxis { axis: 0, start, step: 1 }] };
    let y = g.add_node(op, vec![x], "y", TensorType::fixed(DType::F32, &[2]));
    g.outputs.push(y);
    for n in [2, 5] {
        let out = reference::run(&g, &[("x", f32t(&[n], &seq(n)))]).unwrap();
        assert_eq!(f32s(&out[0].1), [n as f32 - 2.0, n as f32 - 1.0]);
    }
}

#[test]
fn concat_joins_along_axis() {
    let a = f32t(&[2, 1], &[1.0, 2.0]);
    let b = f32t(&[2, 2], &[3.0, 4.0, 5.0, 6.0]);
    let empty = f32t(&[2, 0], &[]);
    let got = eval(Op::Concat { axis: 1 }, &[a.clone(), empty, b]);
    assert_eq!((got.shape(), f32s(&got)), (&[2, 3][..], vec![1.0, 3.0, 4.0, 2.0, 5.0, 6.0]));
    let got = eval(Op::Concat { axis: 0 }, &[a.clone(), a]);
    assert_eq!(f32s(&got), [1.0, 2.0, 1.0, 2.0]);
    let got = eval(Op::Concat { axis: 0 }, &[u8t(&[1], &[1]), u8t(&[2], &[2, 3])]);
    assert_eq!(got, u8t(&[3], &[1, 2, 3]));
    let ty = Some(TensorType::fixed(DType::F32, &[3, 1]));
    let err =
        try_eval(Op::Concat { axis: 0 }, &[f32t(&[1, 1], &[1.0]), f32t(&[2, 2], &seq(4))], ty).unwrap_err();
    assert!(err.to_string().contains("differ off axis 0"), "{err}");
}

#[test]
fn gather_with_negative_indices() {
    let data = f32t(&[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let got = eval(Op::Gather { axis: 0 }, &[data.clone(), i64t(&[2], &[-1, 0])]);
    assert_eq!((got.shape(), f32s(&got)), (&[2, 2][..], vec![5.0, 6.0, 1.0, 2.0]));
    // Indices of rank 2 along axis 1: out[i, j, k] = data[i, idx[j, k]].
    let got = eval(Op::Gather { axis: 1 }, &[data.clone(), i32t(&[2, 2], &[1, 0, -2, 1])]);
    assert_eq!(got.shape(), [3, 2, 2]);
    assert_eq!(f32s(&got), [2.0, 1.0, 1.0, 2.0, 4.0, 3.0, 3.0, 4.0, 6.0, 5.0, 5.0, 6.0]);
    // A scalar index drops the axis.
    let got = eval(Op::Gather { axis: 0 }, &[data.clone(), i64t(&[], &[1])]);
    assert_eq!((got.shape(), f32s(&got)), (&[2][..], vec![3.0, 4.0]));
    for bad in [3, -4] {
        let err = try_eval(Op::Gather { axis: 0 }, &[data.clone(), i64t(&[1], &[bad])], None).unwrap_err();
        assert!(
            err.to_string().contains(&format!("index {bad} is out of range for axis 0 of extent 3")),
            "{err}"
        );
    }
}

fn pad_op(pads: &[(i64, i64)], mode: PadMode) -> Op {
    Op::Pad { pads: pads.iter().map(|(b, e)| (lit(*b), lit(*e))).collect(), mode }
}

#[test]
fn pad_modes() {
    let x = f32t(&[3], &[1.0, 2.0, 3.0]);
    let p = |pads, mode| f32s(&eval(pad_op(pads, mode), &[&x]));
    assert_eq!(p(&[(2, 1)], PadMode::Constant(9.0)), [9.0, 9.0, 1.0, 2.0, 3.0, 9.0]);
    assert_eq!(p(&[(2, 2)], PadMode::Reflect), [3.0, 2.0, 1.0, 2.0, 3.0, 2.0, 1.0]);
    assert_eq!(p(&[(2, 1)], PadMode::Edge), [1.0, 1.0, 1.0, 2.0, 3.0, 3.0]);
    // Wrap continues periodically, also past one period.
    assert_eq!(p(&[(2, 4)], PadMode::Wrap), [2.0, 3.0, 1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 1.0]);
    // Reflecting further than the extent keeps mirroring (as numpy).
    assert_eq!(p(&[(0, 5)], PadMode::Reflect), [1.0, 2.0, 3.0, 2.0, 1.0, 2.0, 3.0, 2.0]);
    // Negative pads crop.
    assert_eq!(p(&[(-1, 1)], PadMode::Constant(0.0)), [2.0, 3.0, 0.0]);
    assert_eq!(p(&[(-2, -1)], PadMode::Edge), Vec::<f32>::new());
    let err = try_eval(pad_op(&[(-2, -2)], PadMode::Edge), &[x], Some(TensorType::fixed(DType::F32, &[0])));
    assert!(err.unwrap_err().to_string().contains("crop more than the extent 3"));
    // An empty axis has nothing to repeat: an error in every non-constant mode.
    for mode in [PadMode::Edge, PadMode::Reflect, PadMode::Wrap] {
        let empty = f32t(&[0], &[]);
        let err = try_eval(pad_op(&[(1, 1)], mode), &[empty], Some(TensorType::fixed(DType::F32, &[2])));
        assert!(err.unwrap_err().to_string().contains("empty axis"));
    }
}

#[test]
fn pad_2d_and_integer_fill() {
    let x = u8t(&[2, 2], &[1, 2, 3, 4]);
    let got = eval(pad_op(&[(1, 0), (0, 1)], PadMode::Constant(7.0)), &[&x]);
    assert_eq!((got.shape(), i64s(&got)), (&[3, 3][..], vec![7, 7, 7, 1, 2, 7, 3, 4, 7]));
    let got = eval(pad_op(&[(1, 1), (1, 0)], PadMode::Edge), &[x]);
    assert_eq!(i64s(&got), [1, 1, 2, 1, 1, 2, 3, 3, 4, 3, 3, 4]);
    let got = eval(pad_op(&[(1, 1)], PadMode::Constant(0.0)), &[f32t(&[0], &[])]);
    assert_eq!(f32s(&got), [0.0, 0.0]);
    let err = try_eval(pad_op(&[(1, 0)], PadMode::Reflect), &[f32t(&[0], &[])], None).unwrap_err();
    assert!(err.to_string().contains("empty axis 0"), "{err}");
}

#[test]
fn pad_amounts_are_symbolic() {
    // Pad x[n] on the right up to 8: pads (0, 8 - n).
    let mut env = ShapeEnv::new();
    let n = env.declare("n", Range::new(1, 8), SymOrigin::User).unwrap();
    let mut g = Graph::new(env);
    let x = g.add_input("x", TensorType::new(DType::I64, vec![n.clone()]));
    let right = lit(8).try_sub(&sym("n")).unwrap();
    let op = Op::Pad { pads: vec![(SymExpr::constant(0), right)], mode: PadMode::Constant(-1.0) };
    let y = g.add_node(op, vec![x], "y", TensorType::fixed(DType::I64, &[8]));
    g.outputs.push(y);
    let out = reference::run(&g, &[("x", i64t(&[3], &[5, 6, 7]))]).unwrap();
    assert_eq!(i64s(&out[0].1), [5, 6, 7, -1, -1, -1, -1, -1]);
}

#[test]
fn movement_works_on_every_dtype() {
    let inputs = [
        Tensor::new(vec![2], Elems::F16(vec![0x3c00, 0x4000])).unwrap(),
        Tensor::new(vec![2], Elems::I8(vec![-1, 2])).unwrap(),
        u8t(&[2], &[1, 2]),
        boolt(&[2], &[true, false]),
        f64t(&[2], &[0.5, 1.5]),
    ];
    for x in inputs {
        let dt = x.dtype();
        let r = eval(Op::Gather { axis: 0 }, &[x.clone(), i64t(&[2], &[1, 0])]);
        let back = eval(Op::Gather { axis: 0 }, &[r, i64t(&[2], &[-1, -2])]);
        assert_eq!(back, x, "{dt}");
        let c = eval(Op::Concat { axis: 0 }, &[x.clone(), x.clone()]);
        let s = eval_to(Op::Slice { axes: vec![slice_axis(0, 2, 1)] }, &[c], dt, &[2]);
        assert_eq!(s, x, "{dt}");
    }
}
