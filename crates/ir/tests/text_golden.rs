//! Golden tests of the text form: graphs built in code print exactly as
//! expected, and the printed text parses back to a graph that prints the same.

mod common;

use std::sync::Arc;

use common::*;
use ir::*;
use sym::{lit, sym, Range, ShapeEnv, SymOrigin};

const KITCHEN_SINK: &str = r#"graph {
  sym batch param 1..
  sym seq param 8..512 divisible by 8
  sym h user 1..1024
  let unk0 = batch*seq
  input %x: f32[batch, seq, 4]
  input %"onnx::MatMul_12": f32[batch, 4, 4]
  input %img: f32[batch, 3, h, h]
  input %"/bert/ids": i64[seq]
  %w: f32[4, 4] = constant [-1.0, -0.75, -0.5, -0.25, 0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75]
  %big: f32[5, 5] = constant @big
  %specials: f32[4] = constant [NaN, inf, -inf, -0.0]
  %half: f32[] = constant 0.5
  %flags: bool[2] = constant [true, false]
  %one16: f16[] = constant 0x3c00
  %small: i8[2, 1] = constant [-128, 127]
  %s: i64[2] = sym_const [batch, 2*seq]
  %pos: i64[seq] = iota[axis=0]
  %mm: f32[batch, seq, 4] = matmul %x, %"onnx::MatMul_12"
  %t: f32[batch, 4, seq] = transpose[perm=[0, 2, 1]] %mm
  %e: f32[batch, 4, seq] = exp %t
  %sum: f32[batch, 4, seq] = add %e, %t
  %lt: bool[batch, 4, seq] = less %e, %sum
  %sel: f32[batch, 4, seq] = select %lt, %e, %sum
  %r: f32[batch, 4, 1] = reduce_sum[axes=[2], keep_dims=true] %sel
  %b: f32[batch, 4, seq] = broadcast %r
  %rs: f32[batch, 4*seq] = reshape %b
  %sl: f32[batch, 2*seq] = slice[1: 1 step 2] %rs
  %p: f32[batch, 3*seq] = pad[pads=[(0, 0), (1, seq-1)], mode=constant(-0.0)] %sl
  %p_1: f32[batch, 3*seq+2] = pad[pads=[(0, 0), (2, 0)], mode=reflect] %p
  %p_2: f32[batch, 3*seq] = pad[pads=[(0, 0), (0, -2)], mode=edge] %p_1
  %cat: f32[batch, 6*seq] = concat[axis=1] %p_2, %p
  %gathered: f32[seq, 4] = gather[axis=0] %w, %"/bert/ids"
  %cs: f32[seq, 4] = cumsum[axis=0, exclusive=false, reverse=true] %gathered
  %cast: f16[seq, 4] = cast %cs
  %conv.weight: f32[2, 3, 3, 3] = constant @conv.weight
  %conv: f32[batch, 2, h, h] = conv[strides=[1, 1], dilations=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], group=1] %img, %conv.weight
  %mp: f32[batch, 2, h/2, h/2] = max_pool[kernel=[2, 2], strides=[2, 2], dilations=[1, 1], pads_begin=[0, 0], pads_end=[0, 0]] %conv
  %ap: f32[batch, 2, h/2, h/2] = avg_pool[kernel=[3, 3], strides=[1, 1], dilations=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], count_include_pad=false] %mp
  %kt: f32[2, 3, 2, 2] = constant @kt
  %up: f32[batch, 3, 2*(h/2), 2*(h/2)] = conv_transpose[strides=[2, 2], dilations=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], group=1] %ap, %kt
  %first: i64[min(16, seq)] = slice[0: 0 step 1] %"/bert/ids"
  %rev: i64[seq] = slice[0: seq-1 step -1] %pos
  %is_nan: bool[4] = is_nan %specials
  %both: bool[2] = and %flags, %flags
  %y: f32[] = mul %half, %half
  output %cat, %up, %cast, %s, %first, %rev, %is_nan, %both, %one16, %small, %y
}
"#;

#[test]
fn kitchen_sink_golden() {
    let g = kitchen_sink();
    verify(&g).unwrap();
    assert_eq!(print_graph(&g), KITCHEN_SINK);
    assert_eq!(g.to_string(), KITCHEN_SINK, "Display is print_graph");
    let g2 = roundtrip(&g);
    verify(&g2).unwrap();
    assert_eq!(g2.nodes.len(), g.nodes.len());
    // Same ops (the data of every constant included; no NaN payloads here).
    for (a, b) in g.nodes.iter().zip(&g2.nodes) {
        assert_eq!(a.op, b.op);
        assert_eq!(g.name(a.output), g2.name(b.output));
        assert_eq!(g.ty(a.output), g2.ty(b.output));
    }
    let names = |g: &Graph, v: &[ValueId]| v.iter().map(|v| g.name(*v).to_string()).collect::<Vec<_>>();
    assert_eq!(names(&g, &g.inputs), names(&g2, &g2.inputs));
    assert_eq!(names(&g, &g.outputs), names(&g2, &g2.outputs));
}

#[test]
fn weight_table_has_every_constant() {
    let g = kitchen_sink();
    let t = weight_table(&g);
    let mut keys: Vec<&str> = t.keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(keys, ["big", "conv.weight", "flags", "half", "kt", "one16", "small", "specials", "w"]);
    assert_eq!(t["big"].shape, vec![5, 5]);
    assert_eq!(t["conv.weight"].dtype, DType::F32);
}

/// The spec's example, written by hand: parse, print, identical.
#[test]
fn handwritten_text_is_canonical() {
    let text = r#"graph {
  sym batch param 1..
  sym seq param 8..512 divisible by 8
  sym a fresh 0..
  sym b user 1..8
  sym c user 1..
  let unk0 = batch*seq
  assert 2*a == b*c
  assert batch*seq in 1..4096
  input %input_ids: i64[batch, seq]
  input %a: f32[batch, seq, 768]
  input %bmat: f32[batch, 768, 768]
  %w: f32[768, 768] = constant @w
  %c: f32[2] = constant [1.0, 2.5]
  %half: f32[] = constant 0.5
  %s: i64[2] = sym_const [batch, 2*seq]
  %pos: i64[seq] = iota[axis=0]
  %x: f32[batch, seq, 768] = matmul %a, %bmat
  %t: f32[batch, 768, seq] = transpose[perm=[0, 2, 1]] %x
  %n: i64[unk0] = reshape %input_ids
  output %x, %t
}
"#;
    let w = f32s(&[768, 768], &vec![0.0; 768 * 768]);
    let g = parse_graph(text, &|n| (n == "w").then(|| w.clone())).unwrap();
    assert_eq!(print_graph(&g), text);
    verify(&g).unwrap();
    assert!(Arc::ptr_eq(&weight_table(&g)["w"], &w), "weights are shared, not copied");
    roundtrip(&g);
}

#[test]
fn quoted_names_roundtrip() {
    let mut g = Graph::new(ShapeEnv::new());
    let t = TensorType::fixed(DType::F32, &[2]);
    let names =
        ["a b", "quo\"te", "back\\slash", "tab\there", "nl\nx", "bell\u{7}", "ünï", "1.5", "%pct", ""];
    let ins: Vec<ValueId> = names.iter().map(|n| g.add_input(n, t.clone())).collect();
    let y = node(&mut g, Op::Binary(BinaryOp::Add), &[ins[0], ins[1]], "/bert/Add_output_0");
    g.outputs = ins.iter().copied().chain([y]).collect();
    let expected = r#"graph {
  input %"a b": f32[2]
  input %"quo\"te": f32[2]
  input %"back\\slash": f32[2]
  input %"tab\there": f32[2]
  input %"nl\nx": f32[2]
  input %"bell\u{7}": f32[2]
  input %"ünï": f32[2]
  input %1.5: f32[2]
  input %"%pct": f32[2]
  input %t: f32[2]
  %"/bert/Add_output_0": f32[2] = add %"a b", %"quo\"te"
  output %"a b", %"quo\"te", %"back\\slash", %"tab\there", %"nl\nx", %"bell\u{7}", %"ünï", %1.5, %"%pct", %t, %"/bert/Add_output_0"
}
"#;
    assert_eq!(print_graph(&g), expected);
    let g2 = roundtrip(&g);
    for (i, n) in names.iter().enumerate().take(names.len() - 1) {
        assert_eq!(g2.name(g2.inputs[i]), *n);
    }
}

#[test]
fn empty_graph() {
    let g = Graph::new(ShapeEnv::new());
    assert_eq!(print_graph(&g), "graph {\n  output\n}\n");
    verify(&g).unwrap();
    roundtrip(&g);
}

#[test]
fn every_unary_and_binary_op_roundtrips() {
    let mut env = ShapeEnv::new();
    env.declare("n", Range::at_least(0), SymOrigin::User).unwrap();
    let mut g = Graph::new(env);
    let shape = [sym("n"), lit(3)];
    let x = g.add_input("x", ty(DType::F32, &shape));
    let m = g.add_input("m", ty(DType::Bool, &shape));
    for u in Op::UNARY {
        let arg = if u == UnaryOp::Not { m } else { x };
        node(&mut g, Op::Unary(u), &[arg], Op::Unary(u).name());
    }
    for b in Op::BINARY {
        let arg = if b.is_logical() { m } else { x };
        node(&mut g, Op::Binary(b), &[arg, arg], Op::Binary(b).name());
    }
    for (k, op) in
        [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod].into_iter().enumerate()
    {
        node(&mut g, Op::Reduce { op, axes: vec![k % 2], keep_dims: k % 2 == 0 }, &[x], "red");
    }
    let text = print_graph(&g);
    assert!(text.contains("  %is_inf: bool[n, 3] = is_inf %x\n"), "{text}");
    assert!(text.contains("  %greater_eq: bool[n, 3] = greater_eq %x, %x\n"), "{text}");
    assert!(text.contains("  %red_4: f32[1, 3] = reduce_prod[axes=[0], keep_dims=true] %x\n"), "{text}");
    verify(&g).unwrap();
    let g2 = roundtrip(&g);
    for (a, b) in g.nodes.iter().zip(&g2.nodes) {
        assert_eq!(a.op, b.op);
    }
}

#[test]
fn inline_constants_of_every_dtype() {
    let mut g = Graph::new(ShapeEnv::new());
    let mk = |shape: &[usize], e: Elems| {
        Op::Constant(Arc::new(ConstData::from_tensor(&Tensor::new(shape.to_vec(), e).unwrap())))
    };
    let ops = [
        mk(&[2], Elems::F64(vec![0.1, -1e300])),
        mk(&[3], Elems::F32(vec![1e-45, 3.4028235e38, f32::MIN_POSITIVE])),
        mk(&[2], Elems::F16(vec![0x7c00, 0xfe00])),
        mk(&[2], Elems::U8(vec![0, 255])),
        mk(&[2], Elems::I32(vec![i32::MIN, i32::MAX])),
        mk(&[1, 2], Elems::I64(vec![i64::MIN, i64::MAX])),
        mk(&[0], Elems::F32(vec![])),
        mk(&[], Elems::Bool(vec![true])),
    ];
    for (i, op) in ops.into_iter().enumerate() {
        node(&mut g, op, &[], &format!("c{i}"));
    }
    let expected = "graph {
  %c0: f64[2] = constant [0.1, -1e300]
  %c1: f32[3] = constant [1e-45, 3.4028235e38, 1.1754944e-38]
  %c2: f16[2] = constant [0x7c00, 0xfe00]
  %c3: u8[2] = constant [0, 255]
  %c4: i32[2] = constant [-2147483648, 2147483647]
  %c5: i64[1, 2] = constant [-9223372036854775808, 9223372036854775807]
  %c6: f32[0] = constant []
  %c7: bool[] = constant true
  output
}
";
    assert_eq!(print_graph(&g), expected);
    let g2 = roundtrip(&g);
    for (a, b) in g.nodes.iter().zip(&g2.nodes) {
        assert_eq!(a.op, b.op, "constants are bit-exact");
    }
}

#[test]
fn pad_constant_values_are_exact() {
    for v in [0.1f64, -0.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 5e-324, 1.0 / 3.0] {
        let mut g = Graph::new(ShapeEnv::new());
        let x = g.add_input("x", TensorType::fixed(DType::F64, &[2]));
        let y = node(&mut g, Op::Pad { pads: vec![(lit(1), lit(1))], mode: PadMode::Constant(v) }, &[x], "y");
        g.outputs = vec![y];
        let g2 = roundtrip(&g);
        let Op::Pad { mode: PadMode::Constant(w), .. } = g2.nodes[0].op else { panic!() };
        assert!(w.to_bits() == v.to_bits() || (v.is_nan() && w.is_nan()), "{v} became {w}");
    }
}

#[test]
fn slice_start_may_mention_a_symbol_named_step() {
    let mut env = ShapeEnv::new();
    env.declare("step", Range::at_least(2), SymOrigin::User).unwrap();
    let mut g = Graph::new(env);
    let x = g.add_input("x", ty(DType::F32, &[sym("step")]));
    let s = sym("step");
    let y = g.add_node(
        Op::Slice { axes: vec![SliceAxis { axis: 0, start: s.min(&lit(3)) - 1, step: 2 }] },
        vec![x],
        "y",
        ty(DType::F32, &[lit(1)]),
    );
    g.outputs = vec![y];
    let text = print_graph(&g);
    assert!(text.contains("slice[0: min(3, step)-1 step 2] %x"), "{text}");
    verify(&g).unwrap();
    roundtrip(&g);
}

#[test]
fn parser_accepts_blank_lines_comments_and_any_attribute_order() {
    let text = "
# a comment before the header
graph {

    input %x: f32[2, 3]
  # inside
  %y: f32[2, 3] = cumsum[reverse=true, axis=1, exclusive=false] %x
  output %y
}
";
    let g = parse_graph(text, &|_| None).unwrap();
    verify(&g).unwrap();
    assert_eq!(
        print_graph(&g),
        "graph {\n  input %x: f32[2, 3]\n  %y: f32[2, 3] = cumsum[axis=1, exclusive=false, reverse=true] %x\n  output %y\n}\n"
    );
}

#[test]
fn parser_keeps_forward_references_for_the_verifier() {
    let text = "graph {
  input %x: f32[2]
  %y: f32[2] = neg %z
  %z: f32[2] = neg %x
  output %y
}
";
    let g = parse_graph(text, &|_| None).unwrap();
    assert_eq!(print_graph(&g), text);
    let e = verify(&g).unwrap_err();
    assert_eq!(e, IrError::Invalid("%y (neg) uses %z before its definition (node 1, neg)".into()));
}
