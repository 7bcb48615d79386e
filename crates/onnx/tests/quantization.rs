//! The quantization operators on import: their arithmetic on the interpreter
//! (rounding half to even, saturation, per-axis and blocked parameters, the
//! zero point of an all-zero input) against values worked out here, and the
//! errors for parameters that break the standard's rules, each naming the node.

mod common;

use anyshape_onnx::proto::data_type::{FLOAT, INT16, INT4, INT8, UINT4, UINT8};
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
        vec![node("QuantizeLinear", &["x", "s"], &["q"], vec![attr_int("output_dtype", 17)])],
        x(),
        &["q"],
        vec![f32_tensor("s", &[], &[1.0])],
        21,
    );
    let err = import(&m).unwrap_err();
    assert!(err.contains("QuantizeLinear_q") && err.contains("FLOAT8E4M3FN"), "{err}");
}

/// int16 and int4 (ONNX's narrow integer types, held in i32 and i8): a
/// quantization saturates to the narrow range (int16's ±32767 not i32's;
/// int4's -8..=7 not int8's, uint4's 0..=15 through `output_dtype`), zero
/// points decoded from `int32_data` (a 16-bit value an entry) and from raw
/// bytes (two 4-bit values a byte, the first in the low bits); an int4
/// weight of odd length with blocked scales dequantizes element by element.
#[test]
fn narrow_integer_types_are_held_wider_and_saturate_to_their_range() {
    let int16_zp = anyshape_onnx::proto::TensorProto {
        name: Some("z16".into()),
        data_type: Some(INT16),
        int32_data: vec![-3],
        ..Default::default()
    };
    // z4 = [1, -2]: 1 in the low bits, -2 (0xE) in the high ones.
    let m = model(
        vec![
            node("QuantizeLinear", &["x", "s", "z16"], &["q16"], vec![]),
            node("DequantizeLinear", &["q16", "s", "z16"], &["y16"], vec![]),
            node("QuantizeLinear", &["x2", "s2", "z4"], &["q4"], vec![attr_int("axis", 1)]),
            node("DequantizeLinear", &["q4", "s2", "z4"], &["y4"], vec![attr_int("axis", 1)]),
            node("QuantizeLinear", &["x", "s"], &["u4"], vec![attr_int("output_dtype", UINT4 as i64)]),
            node(
                "DequantizeLinear",
                &["w4", "sw"],
                &["w"],
                vec![attr_int("axis", 0), attr_int("block_size", 2)],
            ),
        ],
        vec![value_info("x", FLOAT, &[Dim::P("n")]), value_info("x2", FLOAT, &[Dim::P("m"), Dim::V(2)])],
        &["q16", "y16", "q4", "y4", "u4", "w"],
        vec![
            f32_tensor("s", &[], &[0.5]),
            int16_zp,
            f32_tensor("s2", &[2], &[1.0, 2.0]),
            byte_tensor("z4", INT4, &[2], &[0xE1]),
            // w4 = [7, -8, 3, -1, 5]: bytes 0x87, 0xF3, 0x05.
            byte_tensor("w4", INT4, &[5], &[0x87, 0xF3, 0x05]),
            f32_tensor("sw", &[3], &[1.0, 10.0, 100.0]),
        ],
        21,
    );
    let g = import(&m).expect("import");
    let x = f32s(&[4], &[1.25, -1.25, 20000.0, -20000.0]);
    let x2 = f32s(&[3, 2], &[3.0, 3.0, 100.0, -100.0, -5.0, 5.0]);
    let out = run(&g, &[("x", x), ("x2", x2)]);
    // x / 0.5 - 3: 2.5 → 2, -2.5 → -2; ±40000 saturates at int16's range.
    let q16 = vec![-1, -5, 32767, -32768];
    assert_eq!(out[0].elems(), &Elems::I32(q16.clone()));
    let y16: Vec<f32> = q16.iter().map(|q| (*q as f32 + 3.0) * 0.5).collect();
    assert_eq!(out[1].elems(), &Elems::F32(y16));
    // Column 0: x + 1 in -8..=7; column 1: x / 2 - 2 (1.5 → 2) in -8..=7.
    let q4: Vec<i8> = vec![4, 0, 7, -8, -4, 0];
    assert_eq!(out[2].elems(), &Elems::I8(q4.clone()));
    let y4: Vec<f32> =
        q4.iter().enumerate().map(|(i, q)| (*q as f32 - [1.0, -2.0][i % 2]) * [1.0, 2.0][i % 2]).collect();
    assert_eq!(out[3].elems(), &Elems::F32(y4));
    // x / 0.5 into uint4: 2.5 → 2, -2.5 → 0 (saturated), then 15 and 0.
    assert_eq!(out[4].elems(), &Elems::U8(vec![2, 0, 15, 0]));
    assert_eq!(out[5].elems(), &Elems::F32(vec![7.0, -8.0, 30.0, -10.0, 500.0]));
}

/// Arithmetic on a narrow type's values, whose result could leave its range
/// (and would not wrap as the narrow type does), is refused naming the node
/// and the type; a packed tensor of the wrong length is malformed.
#[test]
fn arithmetic_on_narrow_types_is_refused_by_name() {
    let m = model(
        vec![node("Add", &["a", "b"], &["c"], vec![])],
        vec![value_info("a", INT16, &[Dim::V(2)]), value_info("b", INT16, &[Dim::V(2)])],
        &["c"],
        vec![],
        13,
    );
    let err = import(&m).unwrap_err();
    assert!(err.contains("Add") && err.contains("INT16") && err.contains("'a'"), "{err}");
    // Max keeps the range: imported, held as i32.
    let m = model(
        vec![node("Max", &["a", "b"], &["c"], vec![])],
        vec![value_info("a", INT16, &[Dim::V(2)]), value_info("b", INT16, &[Dim::V(2)])],
        &["c"],
        vec![],
        13,
    );
    let g = import(&m).expect("Max of int16");
    let t = |v: Vec<i32>| Tensor::new(vec![2], Elems::I32(v)).expect("tensor");
    let out = run(&g, &[("a", t(vec![-32768, 5])), ("b", t(vec![3, 32767]))]);
    assert_eq!(out[0].elems(), &Elems::I32(vec![3, 32767]));
    let m = model(
        vec![node("DequantizeLinear", &["w4", "s"], &["w"], vec![])],
        vec![],
        &["w"],
        vec![byte_tensor("w4", INT4, &[5], &[0x87, 0xF3]), f32_tensor("s", &[], &[1.0])],
        21,
    );
    let err = import(&m).unwrap_err();
    assert!(err.contains("w4") && err.contains("INT4") && err.contains("3 bytes"), "{err}");
}

/// A constant 2-D weight of int4 codes dequantized in blocks of 2 rows
/// (the last one short), with zero points: imported as its f32 values, as the
/// standard's arithmetic gives them, carrying its codes, scales and zero
/// points for the backends that multiply the codes; a weight of uint8
/// codes in blocks too; an 8-bit weight with a scale per column, and a
/// weight given as an input (not a constant), keep the decomposition.
#[test]
fn constant_quantized_weights_carry_their_codes() {
    // int4 [3, 2] = [[1, -2], [7, -8], [0, 3]], two nibbles a byte, low first.
    let codes4: [i8; 6] = [1, -2, 7, -8, 0, 3];
    let pack = |v: &[i8]| -> Vec<u8> {
        v.chunks(2).map(|p| (p[0] as u8 & 15) | ((p.get(1).copied().unwrap_or(0) as u8 & 15) << 4)).collect()
    };
    let m = model(
        vec![node(
            "DequantizeLinear",
            &["w", "s", "z"],
            &["y"],
            vec![attr_int("axis", 0), attr_int("block_size", 2)],
        )],
        vec![],
        &["y"],
        vec![
            byte_tensor("w", INT4, &[3, 2], &pack(&codes4)),
            f32_tensor("s", &[2, 2], &[0.5, 0.25, 2.0, 1.0]),
            byte_tensor("z", INT4, &[2, 2], &pack(&[1, -1, 0, 2])),
        ],
        21,
    );
    let g = import(&m).expect("import");
    let want: Vec<f32> = vec![0.0, -0.25, 3.0, -1.75, 0.0, 1.0];
    assert_eq!(run(&g, &[])[0].elems(), &Elems::F32(want));
    let consts: Vec<&ir::ConstData> = g
        .nodes
        .iter()
        .filter_map(|n| match &n.op {
            ir::Op::Constant(c) => Some(c.as_ref()),
            _ => None,
        })
        .collect();
    let w = consts.iter().find_map(|c| c.weight_codes()).expect("a constant with its codes");
    assert_eq!((w.bits, w.group, w.scales.clone()), (4, 2, vec![0.5, 0.25, 2.0, 1.0]));
    assert_eq!(w.codes.to_tensor().elems(), &Elems::I8(codes4.to_vec()));
    assert_eq!(
        w.zero_points.as_ref().map(|z| z.to_tensor().elems().clone()),
        Some(Elems::I8(vec![1, -1, 0, 2]))
    );

    // uint8 codes in blocks of one row.
    let m = model(
        vec![node(
            "DequantizeLinear",
            &["w", "s"],
            &["y"],
            vec![attr_int("axis", 0), attr_int("block_size", 1)],
        )],
        vec![],
        &["y"],
        vec![
            byte_tensor("w", UINT8, &[2, 2], &[10, 20, 30, 40]),
            f32_tensor("s", &[2, 2], &[0.5, 0.25, 1.0, 2.0]),
        ],
        21,
    );
    let g = import(&m).expect("import");
    assert_eq!(run(&g, &[])[0].elems(), &Elems::F32(vec![5.0, 5.0, 30.0, 80.0]));
    let w = g
        .nodes
        .iter()
        .find_map(|n| match &n.op {
            ir::Op::Constant(c) => c.weight_codes().cloned(),
            _ => None,
        })
        .expect("codes");
    assert_eq!((w.bits, w.group, w.zero_points.is_none()), (8, 1, true));

    // int8 codes with one scale per column keep the decomposition (the
    // integer products take them where the activation is quantized too).
    let m = model(
        vec![node("DequantizeLinear", &["w", "s"], &["y"], vec![attr_int("axis", 1)])],
        vec![],
        &["y"],
        vec![byte_tensor("w", UINT8, &[2, 2], &[10, 20, 30, 40]), f32_tensor("s", &[2], &[0.5, 0.25])],
        21,
    );
    let g = import(&m).expect("import");
    assert_eq!(run(&g, &[])[0].elems(), &Elems::F32(vec![5.0, 5.0, 15.0, 10.0]));
    assert!(g.nodes.iter().all(|n| !matches!(&n.op, ir::Op::Constant(c) if c.weight_codes().is_some())));

    // Codes given as an input: the decomposition, no constant with codes.
    let m = model(
        vec![node("DequantizeLinear", &["w", "s"], &["y"], vec![attr_int("axis", 1)])],
        vec![value_info("w", UINT8, &[Dim::V(2), Dim::V(2)])],
        &["y"],
        vec![f32_tensor("s", &[2], &[0.5, 0.25])],
        21,
    );
    let g = import(&m).expect("import");
    assert!(g.nodes.iter().all(|n| !matches!(&n.op, ir::Op::Constant(c) if c.weight_codes().is_some())));
}

/// ONNX Runtime's `MatMulNBits` (com.microsoft): a 4-bit weight `[N = 2, K =
/// 16]` in one block, codes packed low half first along K, with packed zero
/// points and a bias: `A · dequant(B)ᵀ + bias` on the interpreter, the weight
/// a constant carrying its codes. Two-bit codes, a `g_idx`, and the operator
/// outside its domain are errors naming the node.
#[test]
fn matmul_nbits_imports_as_a_coded_weight() {
    let contrib = |mut n: anyshape_onnx::proto::NodeProto| {
        n.domain = Some("com.microsoft".into());
        n
    };
    // Column 0: codes 0..15 along K, zero point 8, scale 0.5; column 1: all 3, zero point 1, scale 2.
    let col0: Vec<u8> = (0..8).map(|p| (2 * p) as u8 | ((2 * p + 1) as u8) << 4).collect();
    let col1 = vec![0x33u8; 8];
    let b: Vec<u8> = col0.iter().chain(&col1).copied().collect();
    let attrs = |bits: i64| {
        vec![attr_int("K", 16), attr_int("N", 2), attr_int("bits", bits), attr_int("block_size", 16)]
    };
    let m = model(
        vec![contrib(node("MatMulNBits", &["a", "b", "s", "z", "", "bias"], &["y"], attrs(4)))],
        vec![value_info("a", FLOAT, &[Dim::V(1), Dim::V(16)])],
        &["y"],
        vec![
            byte_tensor("b", UINT8, &[2, 1, 8], &b),
            f32_tensor("s", &[2], &[0.5, 2.0]),
            byte_tensor("z", UINT8, &[2], &[8, 1]),
            f32_tensor("bias", &[2], &[0.25, -1.0]),
        ],
        21,
    );
    let g = import(&m).expect("import");
    let a: Vec<f32> = (0..16).map(|i| (i % 3) as f32 - 1.0).collect();
    let w0: f32 = (0..16).map(|i| a[i] * (i as f32 - 8.0) * 0.5).sum();
    let w1: f32 = a.iter().map(|x| x * (3.0 - 1.0) * 2.0).sum();
    assert_eq!(run(&g, &[("a", f32s(&[1, 16], &a))])[0].elems(), &Elems::F32(vec![w0 + 0.25, w1 - 1.0]));
    let codes = g
        .nodes
        .iter()
        .find_map(|n| match &n.op {
            ir::Op::Constant(c) => c.weight_codes().cloned(),
            _ => None,
        })
        .expect("a weight with its codes");
    assert_eq!((codes.bits, codes.group, codes.codes.shape.clone()), (4, 16, vec![16, 2]));

    let err = import(&model(
        vec![contrib(node("MatMulNBits", &["a", "b", "s"], &["y"], attrs(2)))],
        vec![value_info("a", FLOAT, &[Dim::V(1), Dim::V(16)])],
        &["y"],
        vec![byte_tensor("b", UINT8, &[2, 1, 4], &[0; 8]), f32_tensor("s", &[2], &[1.0, 1.0])],
        21,
    ))
    .unwrap_err();
    assert!(err.contains("MatMulNBits_y") && err.contains("2-bit codes"), "{err}");
    let err = import(&model(
        vec![node("MatMulNBits", &["a", "b", "s"], &["y"], attrs(4))],
        vec![value_info("a", FLOAT, &[Dim::V(1), Dim::V(16)])],
        &["y"],
        vec![byte_tensor("b", UINT8, &[2, 1, 8], &b), f32_tensor("s", &[2], &[1.0, 1.0])],
        21,
    ))
    .unwrap_err();
    assert!(err.contains("unsupported operator ::MatMulNBits (node 'MatMulNBits_y'"), "{err}");
}
