//! Hand-checked tests of reductions, matmul, convolutions, pooling and cumsum.

mod common;

use common::*;
use ir::{ConvAttrs, DType, Op, PoolAttrs, PoolKind, ReduceOp as Red, TensorType};

fn reduce(op: Red, axes: &[usize], keep_dims: bool) -> Op {
    Op::Reduce { op, axes: axes.to_vec(), keep_dims }
}

#[test]
fn reductions() {
    // [[1, 2, 3], [4, 5, 6]]
    let x = f32t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let r = |op, axes: &[usize], keep| eval(reduce(op, axes, keep), &[&x]);
    assert_eq!(f32s(&r(Red::Sum, &[1], false)), [6.0, 15.0]);
    assert_eq!(f32s(&r(Red::Sum, &[0], false)), [5.0, 7.0, 9.0]);
    assert_eq!(f32s(&r(Red::Mean, &[1], false)), [2.0, 5.0]);
    assert_eq!(f32s(&r(Red::Max, &[0], false)), [4.0, 5.0, 6.0]);
    assert_eq!(f32s(&r(Red::Min, &[1], false)), [1.0, 4.0]);
    assert_eq!(f32s(&r(Red::Prod, &[1], false)), [6.0, 120.0]);
    let kept = r(Red::Sum, &[1], true);
    assert_eq!((kept.shape(), f32s(&kept)), (&[2, 1][..], vec![6.0, 15.0]));
    // All axes: a scalar (or [1, 1] with keep_dims).
    let all = r(Red::Sum, &[0, 1], false);
    assert_eq!((all.shape(), f32s(&all)), (&[][..], vec![21.0]));
    assert_eq!(r(Red::Max, &[1, 0], true).shape(), [1, 1]);
    // No axes: the identity.
    assert_eq!(r(Red::Sum, &[], false), x);
}

#[test]
fn reductions_over_empty_axes_give_identities() {
    let x = f32t(&[2, 0], &[]);
    let r = |op| f32s(&eval(reduce(op, &[1], false), &[&x]));
    assert_eq!(r(Red::Sum), [0.0, 0.0]);
    assert_eq!(r(Red::Prod), [1.0, 1.0]);
    assert_eq!(r(Red::Max), [f32::NEG_INFINITY; 2]);
    assert_eq!(r(Red::Min), [f32::INFINITY; 2]);
    assert!(r(Red::Mean).iter().all(|v| v.is_nan()));
    let xi = i32t(&[0, 2], &[]);
    assert_eq!(eval(reduce(Red::Max, &[0], false), &[&xi]), i32t(&[2], &[i32::MIN; 2]));
    assert_eq!(eval(reduce(Red::Min, &[0], false), &[xi]), i32t(&[2], &[i32::MAX; 2]));
    // Reducing a non-empty axis of an empty tensor gives an empty tensor.
    assert_eq!(eval(reduce(Red::Sum, &[0], false), &[x]).shape(), [0]);
}

#[test]
fn reductions_integers_nan_and_bool() {
    let x = i64t(&[2, 2], &[-7, 2, 4, 5]);
    assert_eq!(i64s(&eval(reduce(Red::Mean, &[1], false), &[&x])), [-2, 4]);
    assert_eq!(i64s(&eval(reduce(Red::Prod, &[0], false), &[x])), [-28, 10]);
    let x = f32t(&[2, 2], &[1.0, f32::NAN, 3.0, 2.0]);
    let m = f32s(&eval(reduce(Red::Max, &[1], false), &[&x]));
    assert!(m[0].is_nan() && m[1] == 3.0);
    let m = f32s(&eval(reduce(Red::Min, &[1], false), &[x]));
    assert!(m[0].is_nan() && m[1] == 2.0);
    let b = boolt(&[2, 2], &[false, true, false, false]);
    assert_eq!(bools(&eval(reduce(Red::Max, &[1], false), &[&b])), [true, false]);
    assert_eq!(bools(&eval(reduce(Red::Min, &[0], false), &[&b])), [false, false]);
    let ty = Some(TensorType::fixed(DType::Bool, &[2]));
    assert!(try_eval(reduce(Red::Sum, &[1], false), &[b], ty).is_err());
}

#[test]
fn matmul_small_cases() {
    // [[1, 2, 3], [4, 5, 6]] x [[1, 0], [0, 1], [1, 1]]
    let a = f32t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = f32t(&[3, 2], &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
    assert_eq!(f32s(&eval(Op::MATMUL, &[a, b])), [4.0, 5.0, 10.0, 11.0]);
    // Batched: [2, 1, 2] x [2, 2, 1].
    let a = i64t(&[2, 1, 2], &[1, 2, 3, 4]);
    let b = i64t(&[2, 2, 1], &[5, 6, 7, 8]);
    let got = eval(Op::MATMUL, &[a, b]);
    assert_eq!((got.shape(), i64s(&got)), (&[2, 1, 1][..], vec![17, 53]));
    // k = 0: zeros.
    let got = eval(Op::MATMUL, &[f32t(&[2, 0], &[]), f32t(&[0, 3], &[])]);
    assert_eq!(f32s(&got), [0.0; 6]);
    let ty = Some(TensorType::fixed(DType::F32, &[2, 2]));
    let err = try_eval(Op::MATMUL, &[f32t(&[2, 3], &[0.0; 6]), f32t(&[2, 2], &[0.0; 4])], ty).unwrap_err();
    assert!(err.to_string().contains("cannot multiply [2, 3] by [2, 2]"), "{err}");
}

#[test]
fn matmul_reads_transposed_layouts() {
    // a = [[1, 2, 3], [4, 5, 6]] stored transposed; b = [[1, 0], [0, 1], [1, 1]] stored transposed.
    let at = f32t(&[3, 2], &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    let bt = f32t(&[2, 3], &[1.0, 0.0, 1.0, 0.0, 1.0, 1.0]);
    let a = f32t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = f32t(&[3, 2], &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
    let mm = |ta, tb| Op::MatMul { transpose_a: ta, transpose_b: tb };
    assert_eq!(f32s(&eval(mm(true, false), &[&at, &b])), [4.0, 5.0, 10.0, 11.0]);
    assert_eq!(f32s(&eval(mm(false, true), &[&a, &bt])), [4.0, 5.0, 10.0, 11.0]);
    assert_eq!(f32s(&eval(mm(true, true), &[&at, &bt])), [4.0, 5.0, 10.0, 11.0]);
}

fn conv_attrs(strides: &[i64], dilations: &[i64], pb: &[i64], pe: &[i64], group: i64) -> ConvAttrs {
    ConvAttrs {
        strides: strides.to_vec(),
        dilations: dilations.to_vec(),
        pads_begin: pb.to_vec(),
        pads_end: pe.to_vec(),
        group,
    }
}

#[test]
fn conv_1d_with_padding() {
    // w = [1, 0, -1] with one zero on each side: y[o] = x[o-1] - x[o+1].
    let x = f32t(&[1, 1, 5], &[1.0, 2.0, 3.0, 4.0, 5.0]);
    let w = f32t(&[1, 1, 3], &[1.0, 0.0, -1.0]);
    let got = eval(Op::Conv(conv_attrs(&[1], &[1], &[1], &[1], 1)), &[x.clone(), w.clone()]);
    assert_eq!(f32s(&got), [-2.0, -2.0, -2.0, -2.0, 4.0]);
    // Stride 2, dilation 2, no padding: y[o] = x[2o] - x[2o + 4].
    let got = eval(Op::Conv(conv_attrs(&[2], &[2], &[0], &[0], 1)), &[x, w]);
    assert_eq!(f32s(&got), [-4.0]);
}

#[test]
fn grouped_conv() {
    // Two groups of one input channel, two output channels each: y[m] = w[m] * x[m / 2].
    let x = f32t(&[1, 2, 3], &[1.0, 2.0, 3.0, 10.0, 20.0, 30.0]);
    let w = f32t(&[4, 1, 1], &[1.0, -1.0, 2.0, 0.5]);
    let got = eval(Op::Conv(conv_attrs(&[1], &[1], &[0], &[0], 2)), &[x, w]);
    assert_eq!(got.shape(), [1, 4, 3]);
    assert_eq!(f32s(&got), [1.0, 2.0, 3.0, -1.0, -2.0, -3.0, 20.0, 40.0, 60.0, 5.0, 10.0, 15.0]);
    // Depthwise 2-D: each channel with its own 2x2 kernel of ones.
    let x = i64t(&[1, 2, 2, 2], &[1, 2, 3, 4, 5, 6, 7, 8]);
    let w = i64t(&[2, 1, 2, 2], &[1; 8]);
    let got = eval(Op::Conv(conv_attrs(&[1, 1], &[1, 1], &[0, 0], &[0, 0], 2)), &[x, w]);
    assert_eq!((got.shape(), i64s(&got)), (&[1, 2, 1, 1][..], vec![10, 26]));
}

#[test]
fn conv_2d_strided_dilated_against_hand_sums() {
    // x: 1x1x4x4 = 0..16; w: 1x1x2x2 = [[1, 2], [3, 4]]; stride 2, dilation 2, pad 1 each side.
    // Output 2x2: y[oy, ox] = Σ w[ky, kx] · x[2oy + 2ky - 1, 2ox + 2kx - 1] (zero outside).
    let x = f32t(&[1, 1, 4, 4], &(0..16).map(|v| v as f32).collect::<Vec<_>>());
    let w = f32t(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let got = eval(Op::Conv(conv_attrs(&[2, 2], &[2, 2], &[1, 1], &[1, 1], 1)), &[x, w]);
    // (0,0): taps (-1,-1) (-1,1) (1,-1) (1,1) -> only x[1,1] = 5 with w 4 -> 20
    // (0,1): taps (-1,1) (-1,3) (1,1) (1,3) -> 3·5 + 4·7 = 43
    // (1,0): taps (1,-1) (1,1) (3,-1) (3,1) -> 2·5 + 4·13 = 62
    // (1,1): taps (1,1) (1,3) (3,1) (3,3) -> 5 + 2·7 + 3·13 + 4·15 = 118
    assert_eq!((got.shape(), f32s(&got)), (&[1, 1, 2, 2][..], vec![20.0, 43.0, 62.0, 118.0]));
}

#[test]
fn conv_transpose_1d() {
    let x = f32t(&[1, 1, 3], &[1.0, 2.0, 3.0]);
    let w = f32t(&[1, 1, 2], &[1.0, 10.0]);
    // Stride 2, no pads: y[2i + k] += x[i] w[k].
    let op = Op::ConvTranspose(conv_attrs(&[2], &[1], &[0], &[0], 1));
    let got = eval_to(op, &[x.clone(), w.clone()], DType::F32, &[1, 1, 6]);
    assert_eq!(f32s(&got), [1.0, 10.0, 2.0, 20.0, 3.0, 30.0]);
    // Pad 1 on each side crops the first and last positions.
    let op = Op::ConvTranspose(conv_attrs(&[2], &[1], &[1], &[1], 1));
    assert_eq!(f32s(&eval_to(op, &[x.clone(), w.clone()], DType::F32, &[1, 1, 4])), [10.0, 2.0, 20.0, 3.0]);
    // Output padding (a longer output type) leaves uncovered positions at zero.
    let op = Op::ConvTranspose(conv_attrs(&[2], &[1], &[0], &[0], 1));
    assert_eq!(f32s(&eval_to(op, &[x, w], DType::F32, &[1, 1, 7]))[6], 0.0);
    // Stride 1, dilation 2, overlapping: y[i + 2k] += x[i] w[k] -> [1, 2, 3+10, 20, 30].
    let op = Op::ConvTranspose(conv_attrs(&[1], &[2], &[0], &[0], 1));
    let got = eval_to(
        op,
        &[f32t(&[1, 1, 3], &[1.0, 2.0, 3.0]), f32t(&[1, 1, 2], &[1.0, 10.0])],
        DType::F32,
        &[1, 1, 5],
    );
    assert_eq!(f32s(&got), [1.0, 2.0, 13.0, 20.0, 30.0]);
}

#[test]
fn grouped_conv_transpose() {
    // C = 2, group 2, M/G = 2: y[2g + m] = x[g] · w[g, m] with 1-wide kernels.
    let x = i64t(&[1, 2, 2], &[1, 2, 3, 4]);
    let w = i64t(&[2, 2, 1], &[1, 10, 100, 1000]);
    let op = Op::ConvTranspose(conv_attrs(&[1], &[1], &[0], &[0], 2));
    let got = eval_to(op, &[x, w], DType::I64, &[1, 4, 2]);
    assert_eq!(i64s(&got), [1, 2, 10, 20, 300, 400, 3000, 4000]);
    let op = Op::ConvTranspose(conv_attrs(&[1], &[1], &[0], &[0], 2));
    let ty = Some(TensorType::fixed(DType::F32, &[1, 3, 2]));
    let err = try_eval(op, &[f32t(&[1, 2, 2], &[0.0; 4]), f32t(&[2, 2, 1], &[0.0; 4])], ty).unwrap_err();
    assert!(err.to_string().contains("does not fit"), "{err}");
}

fn pool(kind: PoolKind, k: i64, s: i64, pb: i64, pe: i64) -> Op {
    Op::Pool(PoolAttrs {
        kind,
        kernel: vec![k],
        strides: vec![s],
        dilations: vec![1],
        pads_begin: vec![pb],
        pads_end: vec![pe],
        channels_last: false,
    })
}

#[test]
fn max_pool() {
    let x = f32t(&[1, 1, 5], &[1.0, 3.0, 2.0, 5.0, 4.0]);
    let got = eval_to(pool(PoolKind::Max, 2, 2, 0, 0), &[&x], DType::F32, &[1, 1, 2]);
    assert_eq!(f32s(&got), [3.0, 5.0]);
    // Ceil mode: a third window [4, 5) sees only x[4]; padding never wins a max.
    let got = eval_to(pool(PoolKind::Max, 2, 2, 1, 0), &[&x], DType::F32, &[1, 1, 3]);
    assert_eq!(f32s(&got), [1.0, 3.0, 5.0]);
    let xn = f32t(&[1, 1, 4], &[-1.0, f32::NAN, -3.0, -2.0]);
    let got = f32s(&eval_to(pool(PoolKind::Max, 2, 2, 0, 0), &[xn], DType::F32, &[1, 1, 2]));
    assert!(got[0].is_nan() && got[1] == -2.0);
    // A window entirely past the input is an importer bug.
    let ty = Some(TensorType::fixed(DType::F32, &[1, 1, 4]));
    let err = try_eval(pool(PoolKind::Max, 2, 2, 0, 0), &[x], ty).unwrap_err();
    assert!(err.to_string().contains("reads no input element"), "{err}");
}

#[test]
fn avg_pool_count_include_pad() {
    let x = f32t(&[1, 1, 4], &[1.0, 2.0, 3.0, 4.0]);
    let avg = |cip| PoolKind::Avg { count_include_pad: cip };
    // Kernel 3, stride 1, pad 1 each side: windows {-1,0,1} {0,1,2} {1,2,3} {2,3,4}.
    let got = eval_to(pool(avg(false), 3, 1, 1, 1), &[&x], DType::F32, &[1, 1, 4]);
    assert_eq!(f32s(&got), [1.5, 2.0, 3.0, 3.5]);
    let got = eval_to(pool(avg(true), 3, 1, 1, 1), &[&x], DType::F32, &[1, 1, 4]);
    assert_eq!(f32s(&got), [1.0, 2.0, 3.0, 7.0 / 3.0]);
    // Ceil mode with pad_end 1, kernel 3, stride 2 on 5 elements: the last window
    // {4, 5, 6} has x[4], one position in pad_end, and one past it. With
    // count_include_pad the input and its pads count, not the position past them,
    // as in onnx 1.23's reference and ONNX Runtime 1.31 (node test
    // averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_True;
    // onnx 1.17's data divided by the whole kernel).
    let x = f32t(&[1, 1, 5], &[1.0, 2.0, 3.0, 4.0, 5.0]);
    let got = eval_to(pool(avg(true), 3, 2, 0, 1), &[&x], DType::F32, &[1, 1, 3]);
    assert_eq!(f32s(&got), [2.0, 4.0, 5.0 / 2.0]);
    let got = eval_to(pool(avg(false), 3, 2, 0, 1), &[x], DType::F32, &[1, 1, 3]);
    assert_eq!(f32s(&got), [2.0, 4.0, 5.0]);
}

#[test]
fn avg_pool_2d() {
    // 3x3 input, 2x2 kernel, stride 1, pads (1, 1) before only, count_include_pad.
    let x = f32t(&[1, 1, 3, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]);
    let op = Op::Pool(PoolAttrs {
        kind: PoolKind::Avg { count_include_pad: true },
        kernel: vec![2, 2],
        strides: vec![2, 2],
        dilations: vec![1, 1],
        pads_begin: vec![1, 1],
        pads_end: vec![0, 0],
        channels_last: false,
    });
    // Windows: rows {-1,0} / {1,2}, cols {-1,0} / {1,2}; each counts 4 positions.
    let got = eval_to(op, &[x], DType::F32, &[1, 1, 2, 2]);
    assert_eq!(f32s(&got), [1.0 / 4.0, 5.0 / 4.0, 11.0 / 4.0, 28.0 / 4.0]);
}

/// A channels-last pool is the channels-first pool of the transposed input,
/// transposed back.
#[test]
fn channels_last_pools() {
    // [1, 2 (h), 3 (w), 2 (c)]: channel 0 holds 0..6, channel 1 its negatives.
    let v: Vec<f32> = (0..6).flat_map(|i| [i as f32, -(i as f32)]).collect();
    let x = f32t(&[1, 2, 3, 2], &v);
    let op = |kind| {
        Op::Pool(PoolAttrs {
            kind,
            kernel: vec![2, 2],
            strides: vec![1, 1],
            dilations: vec![1, 1],
            pads_begin: vec![0, 0],
            pads_end: vec![0, 1],
            channels_last: true,
        })
    };
    // Windows over w: {0, 1}, {1, 2}, {2} and the pad.
    let got = eval_to(op(PoolKind::Max), &[&x], DType::F32, &[1, 1, 3, 2]);
    assert_eq!(f32s(&got), [4.0, 0.0, 5.0, -1.0, 5.0, -2.0]);
    let got = eval_to(op(PoolKind::Avg { count_include_pad: false }), &[&x], DType::F32, &[1, 1, 3, 2]);
    assert_eq!(f32s(&got), [2.0, -2.0, 3.0, -3.0, 3.5, -3.5]);
}

#[test]
fn cumsum_variants() {
    let x = f32t(&[4], &[1.0, 2.0, 3.0, 4.0]);
    let c = |exclusive, reverse| f32s(&eval(Op::CumSum { axis: 0, exclusive, reverse }, &[&x]));
    assert_eq!(c(false, false), [1.0, 3.0, 6.0, 10.0]);
    assert_eq!(c(true, false), [0.0, 1.0, 3.0, 6.0]);
    assert_eq!(c(false, true), [10.0, 9.0, 7.0, 4.0]);
    assert_eq!(c(true, true), [9.0, 7.0, 4.0, 0.0]);
    let x = i32t(&[2, 3], &[1, 2, 3, 4, 5, 6]);
    let got = eval(Op::CumSum { axis: 0, exclusive: false, reverse: false }, &[&x]);
    assert_eq!(got, i32t(&[2, 3], &[1, 2, 3, 5, 7, 9]));
    let got = eval(Op::CumSum { axis: 1, exclusive: true, reverse: true }, &[x]);
    assert_eq!(got, i32t(&[2, 3], &[5, 3, 0, 11, 6, 0]));
    assert_eq!(
        eval(Op::CumSum { axis: 1, exclusive: false, reverse: false }, &[f32t(&[2, 0], &[])]).shape(),
        [2, 0]
    );
}
