//! The quantization operators on import: their arithmetic on the interpreter
//! (rounding half to even, saturation, per-axis and blocked parameters, the
//! zero point of an all-zero input) against values worked out here, and the
//! errors for parameters that break the standard's rules, each naming the node.

mod common;

use anyshape_onnx::proto::data_type::{FLOAT, INT8, UINT8};
use anyshape_onnx::{import_bytes, ImportOptions};
use common::*;
use ir::{Elems, Tensor};

fn import(m: &anyshape_onnx::proto::ModelProto) -> Result<ir::Graph, String> {
    let g = import_bytes(&encode(m), &ImportOptions::new()).map_err(|e| e.to_string())?;
    ir::verify(&g).unwrap_or_else(|e| panic!("{e}\n{g}"));
    Ok(g)
}

fn run(g: &ir::Graph, inputs: &[(&str, Tensor)]) -> Vec<Tensor> {
    reference::run(g, inputs).unwrap_or_else(|e| panic!("{e}")).into_iter().map(|(_, t)| t).collect()
}

fn f32s(shape: &[usize], v: &[f32]) -> Tensor {
    Tensor::new(shape.to_vec(), Elems::F32(v.to_vec())).expect("tensor")
}

/// Per axis, at a symbolic length: `x / scale` rounded half to even (2.5 → 2,
/// 3.5 → 4, -2.5 → -2), the zero point added, saturated at the int8 range;
/// dequantized back by the same parameters.
#[test]
fn per_axis_int8_rounds_half_to_even_and_saturates() {
    let m = model(
        vec![
            node("QuantizeLinear", &["x", "s", "z"], &["q"], vec![attr_int("axis", 1)]),
            node("DequantizeLinear", &["q", "s", "z"], &["y"], vec![attr_int("axis", 1)]),
        ],
        vec![value_info("x", FLOAT, &[Dim::P("n"), Dim::V(2)])],
        &["q", "y"],
        vec![f32_tensor("s", &[2], &[1.0, 0.5]), byte_tensor("z", INT8, &[2], &[0, (-3i8) as u8])],
        13,
    );
    let g = import(&m).expect("import");
    let x = f32s(&[4, 2], &[2.5, 1.25, 3.5, -1.25, -2.5, 100.0, 1000.0, -1000.0]);
    let out = run(&g, &[("x", x)]);
    // Column 1: x / 0.5 = 2.5 → 2, -2.5 → -2, 200 → 200 - 3 saturates, -2000 too.
    let want_q: Vec<i8> = vec![2, -1, 4, -5, -2, 127, 127, -128];
    assert_eq!(out[0].elems(), &Elems::I8(want_q.clone()));
    let want_y: Vec<f32> = want_q
        .iter()
        .enumerate()
        .map(|(i, q)| (*q as f32 - [0.0, -3.0][i % 2]) * [1.0, 0.5][i % 2])
        .collect();
    assert_eq!(out[1].elems(), &Elems::F32(want_y));
}

/// Blocks of 3 along an axis of 7 (the last block short): each element takes
/// its block's scale.
#[test]
fn blocked_scales_cover_a_short_last_block() {
    let m = model(
        vec![node(
            "DequantizeLinear",
            &["q", "s"],
            &["y"],
            vec![attr_int("axis", 1), attr_int("block_size", 3)],
        )],
        vec![value_info("q", UINT8, &[Dim::V(2), Dim::V(7)])],
        &["y"],
        vec![f32_tensor("s", &[2, 3], &[1.0, 2.0, 4.0, 10.0, 20.0, 40.0])],
        21,
    );
    let g = import(&m).expect("import");
    let q = Tensor::new(vec![2, 7], Elems::U8(vec![1; 14])).expect("q");
    let out = run(&g, &[("q", q)]);
    let want = [1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 4.0, 10.0, 10.0, 10.0, 20.0, 20.0, 20.0, 40.0];
    assert_eq!(out[0].elems(), &Elems::F32(want.to_vec()));
}

/// `DynamicQuantizeLinear` then `MatMulInteger` against a weight with a zero
/// point per column, as `quantize_dynamic` writes them, at 1 and 5 rows; and
/// an all-zero input (scale 1/255, zero point 0).
#[test]
fn dynamic_quantization_feeds_an_integer_matmul() {
    let w: Vec<i8> = vec![1, -2, 3, 4, -5, 6];
    let m = model(
        vec![
            node("DynamicQuantizeLinear", &["x"], &["xq", "xs", "xz"], vec![]),
            node("MatMulInteger", &["xq", "w", "xz", "wz"], &["acc"], vec![]),
        ],
        vec![value_info("x", FLOAT, &[Dim::P("n"), Dim::V(2)])],
        &["xq", "xs", "xz", "acc"],
        vec![
            byte_tensor("w", INT8, &[2, 3], &w.iter().map(|v| *v as u8).collect::<Vec<_>>()),
            byte_tensor("wz", INT8, &[3], &[0, 1, (-1i8) as u8]),
        ],
        17,
    );
    let g = import(&m).expect("import");
    for rows in [1usize, 5] {
        let xs: Vec<f32> =
            (0..2 * rows).map(|i| (i as f32 * 0.7 - 1.1) * if i % 3 == 0 { -1.0 } else { 1.0 }).collect();
        let out = run(&g, &[("x", f32s(&[rows, 2], &xs))]);
        let (lo, hi) = (xs.iter().fold(0f32, |a, b| a.min(*b)), xs.iter().fold(0f32, |a, b| a.max(*b)));
        let scale = (hi - lo) / 255.0;
        let zp = (0.0 - lo / scale).clamp(0.0, 255.0).round_ties_even();
        let q: Vec<u8> =
            xs.iter().map(|x| ((x / scale).round_ties_even() + zp).clamp(0.0, 255.0) as u8).collect();
        assert_eq!(out[0].elems(), &Elems::U8(q.clone()), "rows {rows}");
        assert_eq!(out[1].elems(), &Elems::F32(vec![scale]));
        assert_eq!(out[2].elems(), &Elems::U8(vec![zp as u8]));
        let wz = [0, 1, -1];
        let acc: Vec<i32> = (0..rows * 3)
            .map(|i| {
                let (r, c) = (i / 3, i % 3);
                (0..2).map(|k| (q[r * 2 + k] as i32 - zp as i32) * (w[k * 3 + c] as i32 - wz[c])).sum()
            })
            .collect();
        assert_eq!(out[3].elems(), &Elems::I32(acc), "rows {rows}");
    }
    let out = run(&g, &[("x", f32s(&[3, 2], &[0.0; 6]))]);
    assert_eq!(out[1].elems(), &Elems::F32(vec![1.0 / 255.0]));
    assert_eq!(out[2].elems(), &Elems::U8(vec![0]));
}

/// Parameters that break the standard's rules: errors naming the node and why.
#[test]
fn bad_quantization_parameters_are_errors_naming_the_node() {
    let x = || vec![value_info("x", FLOAT, &[Dim::P("n"), Dim::V(4)])];
    // A zero scale would divide by zero.
    let m = model(
        vec![node("QuantizeLinear", &["x", "s"], &["q"], vec![])],
        x(),
        &["q"],
        vec![f32_tensor("s", &[], &[0.0])],
        13,
    );
    let err = import(&m).unwrap_err();
    assert!(err.contains("QuantizeLinear_q") && err.contains("y_scale") && err.contains("nonzero"), "{err}");
    // Three scales for an axis of four.
    let m = model(
        vec![node("QuantizeLinear", &["x", "s"], &["q"], vec![attr_int("axis", 1)])],
        x(),
        &["q"],
        vec![f32_tensor("s", &[3], &[1.0; 3])],
        13,
    );
    let err = import(&m).unwrap_err();
    assert!(err.contains("QuantizeLinear_q") && err.contains("3 elements") && err.contains("4"), "{err}");
    // A zero point of another type than the quantized values.
    let m = model(
        vec![node("DequantizeLinear", &["q", "s", "z"], &["y"], vec![])],
        vec![value_info("q", INT8, &[Dim::P("n")])],
        &["y"],
        vec![f32_tensor("s", &[], &[1.0]), byte_tensor("z", UINT8, &[], &[3])],
        13,
    );
    let err = import(&m).unwrap_err();
    assert!(err.contains("DequantizeLinear_y") && err.contains("u8") && err.contains("i8"), "{err}");
    // A type anyshape lacks is named as such.
    let m = model(
        vec![node("QuantizeLinear", &["x", "s"], &["q"], vec![attr_int("output_dtype", 5)])],
        x(),
        &["q"],
        vec![f32_tensor("s", &[], &[1.0])],
        21,
    );
    let err = import(&m).unwrap_err();
    assert!(err.contains("QuantizeLinear_q") && err.contains("INT16"), "{err}");
}
