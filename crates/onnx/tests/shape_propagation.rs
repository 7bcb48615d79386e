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

fn text(g: &ir::Graph) -> String {
    g.to_string()
}

/// MatMul's contraction dims are a sibling constraint: `k2` is eliminated for `k1`.
#[test]
fn matmul_records_equal_contraction_dims() {
    let m = model(
        vec![node("MatMul", &["x", "w"], &["y"], vec![])],
        vec![
            value_info("x", FLOAT, &[Dim::P("b"), Dim::P("k1")]),
            value_info("w", FLOAT, &[Dim::P("k2"), Dim::V(4)]),
        ],
        &["y"],
        vec![],
        17,
    );
    let g = import(&m);
    assert_eq!(
        text(&g),
        "graph {
  sym b param 1..2147483647
  sym k1 param 1..2147483647
  let k2 = k1
  input %x: f32[b, k1]
  input %w: f32[k1, 4]
  %y: f32[b, 4] = matmul %x, %w
  output %y
}
"
    );
    assert!(g.env.equal(&sym::sym("k1"), &sym::sym("k2")));
}

/// `Reshape(x, [-1, 8])` collapses `batch*seq`; reshaping back through the shape
/// of `x` restores `[batch, seq, 8]`.
#[test]
fn reshape_collapse_and_restore() {
    let m = model(
        vec![
            node("Reshape", &["x", "flat"], &["f"], vec![]),
            node("Relu", &["f"], &["r"], vec![]),
            node("Shape", &["x"], &["s"], vec![]),
            node("Slice", &["s", "z", "two", "z"], &["s2"], vec![]),
            node("Concat", &["s2", "eight"], &["back"], vec![attr_int("axis", 0)]),
            node("Reshape", &["r", "back"], &["y"], vec![]),
        ],
        vec![value_info("x", FLOAT, &[Dim::P("batch"), Dim::P("seq"), Dim::V(8)])],
        &["y"],
        vec![
            i64_tensor("flat", &[2], &[-1, 8]),
            i64_tensor("z", &[1], &[0]),
            i64_tensor("two", &[1], &[2]),
            i64_tensor("eight", &[1], &[8]),
        ],
        17,
    );
    let g = import(&m);
    assert_eq!(
        text(&g),
        "graph {
  sym batch param 1..2147483647
  sym seq param 1..2147483647
  input %x: f32[batch, seq, 8]
  %f: f32[batch*seq, 8] = reshape %x
  %r: f32[batch*seq, 8] = relu %f
  %y: f32[batch, seq, 8] = reshape %r
  output %y
}
"
    );
    let out = reference::run(&g, &[("x", f32s(&[2, 3, 8]))]).expect("run");
    assert_eq!(out[0].1.shape(), &[2, 3, 8]);
}

/// `Range(0, seq, 1)` with `seq` from `Shape`: an iota of symbolic length; position
/// ids that are real data stay a run-time tensor.
#[test]
fn range_of_a_symbolic_length() {
    let m = model(
        vec![
            node("Shape", &["x"], &["s"], vec![]),
            node("Gather", &["s", "one"], &["n"], vec![attr_int("axis", 0)]),
            node("Range", &["zero", "n", "one"], &["y"], vec![]),
        ],
        vec![value_info("x", FLOAT, &[Dim::P("batch"), Dim::P("seq")])],
        &["y"],
        vec![i64_tensor("zero", &[], &[0]), i64_tensor("one", &[], &[1])],
        17,
    );
    let g = import(&m);
    assert_eq!(
        text(&g),
        "graph {
  sym batch param 1..2147483647
  sym seq param 1..2147483647
  input %x: f32[batch, seq]
  %y: i64[seq] = iota[axis=0]
  output %y
}
"
    );
    let out = reference::run(&g, &[("x", f32s(&[2, 5]))]).expect("run");
    assert_eq!(out[0].1.to_i64_vec(), Some(vec![0, 1, 2, 3, 4]));
}

/// ViT's expand of the class token: `Where(Equal(shape, -1), 1, shape)` on shape
/// values, then `Expand`, then `ConstantOfShape` of a computed shape.
#[test]
fn where_on_shape_values_and_constant_of_shape() {
    let m = model(
        vec![
            node("Shape", &["x"], &["s"], vec![]),
            node("Gather", &["s", "zero1"], &["b"], vec![attr_int("axis", 0)]),
            node("Concat", &["b", "m1", "m1"], &["target"], vec![attr_int("axis", 0)]),
            node("Equal", &["target", "m1"], &["isneg"], vec![]),
            node("Where", &["isneg", "ones", "target"], &["fixed"], vec![]),
            node("Expand", &["tok", "fixed"], &["y"], vec![]),
            node("ConstantOfShape", &["s"], &["z"], vec![]),
        ],
        vec![value_info("x", FLOAT, &[Dim::P("batch"), Dim::V(4)])],
        &["y", "z"],
        vec![
            i64_tensor("zero1", &[1], &[0]),
            i64_tensor("m1", &[1], &[-1]),
            i64_tensor("ones", &[3], &[1, 1, 1]),
            f32_tensor("tok", &[1, 1, 6], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
        ],
        17,
    );
    let g = import(&m);
    assert_eq!(
        text(&g),
        "graph {
  sym batch param 1..2147483647
  input %x: f32[batch, 4]
  %tok: f32[1, 1, 6] = constant [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
  %y: f32[batch, 1, 6] = broadcast %tok
  %z_3: f32[] = constant 0.0
  %z_1: f32[1, 1] = reshape %z_3
  %z: f32[batch, 4] = broadcast %z_1
  output %y, %z
}
"
    );
    assert!(!g.nodes.iter().any(|n| matches!(n.op, Op::SymConst(_))), "shape arithmetic left:\n{g}");
    let out = reference::run(&g, &[("x", f32s(&[3, 4]))]).expect("run");
    assert_eq!(out[0].1.shape(), &[3, 1, 6]);
    assert_eq!(out[1].1.shape(), &[3, 4]);
}

/// A slice of a position table bounded by the sequence length, added to the
/// embeddings: the env learns `seq <= 64` and the clamp `min(64, seq)` disappears.
#[test]
fn slice_with_computed_bound_learns_a_range() {
    let table: Vec<f32> = (0..64 * 2).map(|i| i as f32).collect();
    let m = model(
        vec![
            node("Shape", &["x"], &["s"], vec![]),
            node("Gather", &["s", "one"], &["n"], vec![attr_int("axis", 0)]),
            node("Unsqueeze", &["n", "zero1"], &["n1"], vec![]),
            node("Slice", &["pos", "zero1", "n1", "zero1"], &["p"], vec![]),
            node("Add", &["x", "p"], &["y"], vec![]),
        ],
        vec![value_info("x", FLOAT, &[Dim::P("batch"), Dim::P("seq"), Dim::V(2)])],
        &["y"],
        vec![
            i64_tensor("one", &[], &[1]),
            i64_tensor("zero1", &[1], &[0]),
            f32_tensor("pos", &[64, 2], &table),
        ],
        17,
    );
    let g = import(&m);
    assert_eq!(
        text(&g),
        "graph {
  sym batch param 1..2147483647
  sym seq param 1..64
  input %x: f32[batch, seq, 2]
  %pos: f32[64, 2] = constant @pos
  %p: f32[seq, 2] = slice[0: 0 step 1] %pos
  %y_3: f32[1, seq, 2] = reshape %p
  %y_1: f32[batch, seq, 2] = broadcast %y_3
  %y: f32[batch, seq, 2] = add %x, %y_1
  output %y
}
"
    );
    assert_eq!(g.env.symbol("seq").expect("seq").range, sym::Range::new(1, 64));
    let err = reference::run(&g, &[("x", f32s(&[1, 65, 2]))]).expect_err("seq 65 is too long");
    assert!(err.to_string().contains("seq = 65") && err.to_string().contains("1..64"), "{err}");
}

/// A slice from `total - seq` to the end (a causal mask's rows for the new
/// tokens, as GPT-2's TorchScript export takes them): the bound's sign is not
/// known from the ranges, so it is taken as not negative, which binding then
/// checks, naming the node.
#[test]
fn slice_bound_of_unknown_sign_is_assumed_and_checked() {
    let m = model(
        vec![
            node("Shape", &["mask"], &["ms"], vec![]),
            node("Gather", &["ms", "zero"], &["total"], vec![attr_int("axis", 0)]),
            node("Shape", &["x"], &["xs"], vec![]),
            node("Gather", &["xs", "zero"], &["seq"], vec![attr_int("axis", 0)]),
            node("Sub", &["total", "seq"], &["start"], vec![]),
            node("Unsqueeze", &["start", "zero1"], &["start1"], vec![]),
            node("Unsqueeze", &["total", "zero1"], &["end1"], vec![]),
            node("Slice", &["mask", "start1", "end1", "zero1"], &["rows"], vec![]),
            node("Add", &["x", "rows"], &["y"], vec![]),
        ],
        vec![
            value_info("mask", FLOAT, &[Dim::P("total"), Dim::V(2)]),
            value_info("x", FLOAT, &[Dim::P("seq"), Dim::V(2)]),
        ],
        &["y"],
        vec![i64_tensor("zero", &[], &[0]), i64_tensor("zero1", &[1], &[0])],
        17,
    );
    let g = import(&m);
    let t = text(&g);
    assert!(t.contains("assert -seq+total in 0.."), "{t}");
    assert!(t.contains("%rows: f32[seq, 2] = slice[0: -seq+total step 1] %mask"), "{t}");
    let mask = Tensor::new(vec![5, 2], Elems::F32((0..10).map(|i| i as f32).collect())).expect("mask");
    let out = reference::run(&g, &[("mask", mask), ("x", f32s(&[3, 2]))]).expect("run");
    let Elems::F32(y) = out[0].1.elems() else { panic!("f32 output") };
    let x = f32s(&[3, 2]);
    let Elems::F32(x) = x.elems() else { panic!("f32 input") };
    let want: Vec<f32> = x.iter().zip(4..).map(|(a, b)| a + b as f32).collect();
    assert_eq!(y, &want);
    let err = reference::run(&g, &[("mask", f32s(&[2, 2])), ("x", f32s(&[3, 2]))])
        .expect_err("a bound of -1 would read from the end");
    let msg = err.to_string();
    assert!(msg.contains("node 'Slice_rows'") && msg.contains("taken as not negative"), "{msg}");
}

/// Numpy broadcasting: `[n, 1] + [m]` is `[n, m]`; `[n] + [m]` records `m == n`.
#[test]
fn broadcasting_records_sibling_constraints() {
    let m = model(
        vec![node("Add", &["a", "b"], &["y"], vec![]), node("Mul", &["c", "b"], &["z"], vec![])],
        vec![
            value_info("a", FLOAT, &[Dim::P("n"), Dim::V(1)]),
            value_info("b", FLOAT, &[Dim::P("m")]),
            value_info("c", FLOAT, &[Dim::P("k")]),
        ],
        &["y", "z"],
        vec![],
        17,
    );
    let g = import(&m);
    assert_eq!(
        text(&g),
        "graph {
  sym n param 1..2147483647
  sym m param 1..2147483647
  let k = m
  input %a: f32[n, 1]
  input %b: f32[m]
  input %c: f32[m]
  %y_4: f32[n, m] = broadcast %a
  %y_1: f32[1, m] = reshape %b
  %y_2: f32[n, m] = broadcast %y_1
  %y: f32[n, m] = add %y_4, %y_2
  %z: f32[m] = mul %c, %b
  output %y, %z
}
"
    );
    assert!(g.env.equal(&sym::sym("k"), &sym::sym("m")));
    assert!(!g.env.equal(&sym::sym("n"), &sym::sym("m")));
}

/// Unnamed dynamic dims get fresh symbols; a shape that depends on tensor data is
/// a clear error naming the node.
#[test]
fn unnamed_dims_and_data_dependent_shapes() {
    let m = model(
        vec![node("Reshape", &["x", "shape"], &["y"], vec![])],
        vec![value_info("x", FLOAT, &[Dim::V(-1), Dim::V(4)]), value_info("shape", INT64, &[Dim::V(2)])],
        &["y"],
        vec![],
        17,
    );
    let e = import_bytes(&encode(&m), &ImportOptions::new()).expect_err("data-dependent").to_string();
    assert!(e.contains("Reshape_y") && e.contains("depends on tensor data"), "{e}");
    let m = model(
        vec![node("Relu", &["x"], &["y"], vec![])],
        vec![value_info("x", FLOAT, &[Dim::V(-1), Dim::V(4)])],
        &["y"],
        vec![],
        17,
    );
    let g = import(&m);
    assert!(g.to_string().contains("input %x: f32[unk0, 4]"));
}

/// The dynamo exporter's `SplitToSequence` + local function `aten_getitem`
/// (`SequenceAt`): the function is inlined and the sequence resolved at compile
/// time into slices.
#[test]
fn local_functions_and_sequences_resolve_at_compile_time() {
    use anyshape_onnx::proto::{FunctionProto, OperatorSetIdProto};
    let mut getitem = node("aten_getitem", &["parts", "one"], &["y"], vec![]);
    getitem.domain = Some("pkg.test".into());
    let mut m = model(
        vec![node("SplitToSequence", &["x", "sizes"], &["parts"], vec![attr_int("axis", 1)]), getitem],
        vec![value_info("x", FLOAT, &[Dim::P("batch"), Dim::V(6)])],
        &["y"],
        vec![i64_tensor("sizes", &[2], &[2, 4]), i64_tensor("one", &[], &[1])],
        18,
    );
    m.opset_import.push(OperatorSetIdProto { domain: Some("pkg.test".into()), version: Some(1) });
    m.functions.push(FunctionProto {
        name: Some("aten_getitem".into()),
        domain: Some("pkg.test".into()),
        input: vec!["self".into(), "i".into()],
        output: vec!["return_val".into()],
        node: vec![node("SequenceAt", &["self", "i"], &["return_val"], vec![])],
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(18) }],
        ..Default::default()
    });
    let g = import(&m);
    assert_eq!(
        text(&g),
        "graph {
  sym batch param 1..2147483647
  input %x: f32[batch, 6]
  %y: f32[batch, 4] = slice[1: 2 step 1] %x
  output %y
}
"
    );
    let out = reference::run(&g, &[("x", f32s(&[2, 6]))]).expect("run");
    assert_eq!(out[0].1.to_f64_vec(), vec![-1.0, 0.0, 1.0, 2.0, -2.0, -1.0, 0.0, 1.0]);
}

/// A decoder step as optimum exports it: the KV cache's past length may be 0
/// (the first step passes an empty cache; the cache is only concatenated with
/// the new keys), and the mask's `past_sequence_length + sequence_length` is
/// that expression of the two, not a symbol of its own, so a mask of the
/// wrong length is an error that names it.
#[test]
fn a_kv_cache_may_be_empty_and_the_masks_length_is_past_plus_new() {
    let m = model(
        vec![
            node("Relu", &["new"], &["key"], vec![]),
            node("Concat", &["past_key", "key"], &["present"], vec![attr_int("axis", -2)]),
            node("Shape", &["past_key"], &["past_shape"], vec![]),
            node("Cast", &["attention_mask"], &["m"], vec![attr_int("to", FLOAT as i64)]),
            node("ReduceSum", &["m"], &["mask_sum"], vec![attr_int("keepdims", 0)]),
        ],
        vec![
            value_info("new", FLOAT, &[Dim::P("batch_size"), Dim::P("sequence_length"), Dim::V(4)]),
            value_info("past_key", FLOAT, &[Dim::P("batch_size"), Dim::P("past_sequence_length"), Dim::V(4)]),
            value_info(
                "attention_mask",
                INT64,
                &[Dim::P("batch_size"), Dim::P("past_sequence_length + sequence_length")],
            ),
        ],
        &["present", "past_shape", "mask_sum"],
        vec![],
        17,
    );
    let g = import(&m);
    let text = g.to_string();
    assert!(text.contains("  sym past_sequence_length param 0..2147483647\n"), "{text}");
    assert!(text.contains("  sym sequence_length param 1..2147483647\n"), "{text}");
    assert!(
        text.contains("input %attention_mask: i64[batch_size, past_sequence_length+sequence_length]"),
        "{text}"
    );
    let mask = |n: usize| Tensor::new(vec![2, n], Elems::I64(vec![1; 2 * n])).expect("mask");
    let empty = Tensor::new(vec![2, 0, 4], Elems::F32(vec![])).expect("empty cache");
    let out = reference::run(
        &g,
        &[("new", f32s(&[2, 3, 4])), ("past_key", empty.clone()), ("attention_mask", mask(3))],
    )
    .expect("an empty cache runs");
    let relu = |t: Tensor| match t.elems() {
        Elems::F32(v) => {
            Tensor::new(t.shape().to_vec(), Elems::F32(v.iter().map(|x| x.max(0.0)).collect())).unwrap()
        }
        _ => unreachable!(),
    };
    assert_eq!(out[0].1, relu(f32s(&[2, 3, 4])), "the present cache is the new keys");
    let err =
        reference::run(&g, &[("new", f32s(&[2, 3, 4])), ("past_key", empty), ("attention_mask", mask(4))])
            .expect_err("a mask one too long")
            .to_string();
    assert!(err.contains("attention_mask") && err.contains("past_sequence_length+sequence_length"), "{err}");
    // The same names where the cache is read by more than a concatenation: 1..
    let m2 = model(
        vec![node("Relu", &["past_key"], &["r"], vec![])],
        vec![value_info(
            "past_key",
            FLOAT,
            &[Dim::P("batch_size"), Dim::P("past_sequence_length"), Dim::V(4)],
        )],
        &["r"],
        vec![],
        17,
    );
    assert!(import(&m2).to_string().contains("  sym past_sequence_length param 1..2147483647\n"));
    // Two inputs concatenated: either might be the empty one, so neither may.
    let m3 = model(
        vec![node("Concat", &["a", "b"], &["c"], vec![attr_int("axis", 1)])],
        vec![
            value_info("a", FLOAT, &[Dim::V(2), Dim::P("n")]),
            value_info("b", FLOAT, &[Dim::V(2), Dim::P("k")]),
        ],
        &["c"],
        vec![],
        17,
    );
    let text = import(&m3).to_string();
    assert!(text.contains("  sym n param 1..") && text.contains("  sym k param 1.."), "{text}");
}
