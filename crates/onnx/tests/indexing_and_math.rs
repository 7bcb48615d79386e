//! Operators written with primitives on import: the inverse trigonometric and
//! hyperbolic functions against `f64` over their whole domains, and the gathers
//! with symbolic dims, negative indices and out-of-range indices.

mod common;

use anyshape_onnx::proto::data_type::{FLOAT, INT64};
use anyshape_onnx::{import_bytes, ImportOptions};
use common::*;
use ir::{Elems, Tensor};

fn import(m: &anyshape_onnx::proto::ModelProto) -> ir::Graph {
    let g = import_bytes(&encode(m), &ImportOptions::new()).unwrap_or_else(|e| panic!("{e}"));
    ir::verify(&g).unwrap_or_else(|e| panic!("{e}\n{g}"));
    g
}

fn f32s(v: &Tensor) -> Vec<f32> {
    match v.elems() {
        Elems::F32(x) => x.clone(),
        other => panic!("f32 expected, got {other:?}"),
    }
}

/// Each function over points spread across its domain (magnitudes from 1e-6
/// to 1e6 where the domain allows), within 2e-6 of `f64`'s, relative to
/// `1 + |y|`.
#[test]
fn inverse_trigonometric_and_hyperbolic_functions_are_accurate() {
    type F = fn(f64) -> f64;
    let cases: [(&str, F, f64, f64); 9] = [
        ("Atan", f64::atan, -1e6, 1e6),
        ("Asin", f64::asin, -1.0, 1.0),
        ("Acos", f64::acos, -1.0, 1.0),
        ("Asinh", f64::asinh, -1e6, 1e6),
        ("Acosh", f64::acosh, 1.0, 1e6),
        ("Atanh", f64::atanh, -0.999, 0.999),
        ("Sinh", f64::sinh, -20.0, 20.0),
        ("Cosh", f64::cosh, -20.0, 20.0),
        ("Tan", f64::tan, -1.5, 1.5),
    ];
    for (op, f, lo, hi) in cases {
        // Uniform points, and geometric ones near 0 and the ends.
        let mut xs: Vec<f64> = (0..=4000).map(|i| lo + (hi - lo) * i as f64 / 4000.0).collect();
        for e in -60..=60 {
            let m = 10f64.powf(e as f64 / 10.0);
            xs.extend([m, -m, lo + m * (hi - lo) * 1e-6, hi - m * (hi - lo) * 1e-6]);
        }
        xs.retain(|x| (lo..=hi).contains(x));
        let xs: Vec<f32> = xs.into_iter().map(|x| x as f32).collect();
        let n = xs.len();
        let m = model(
            vec![node(op, &["x"], &["y"], vec![])],
            vec![value_info("x", FLOAT, &[Dim::P("n")])],
            &["y"],
            vec![],
            17,
        );
        let g = import(&m);
        let x = Tensor::new(vec![n], Elems::F32(xs.clone())).expect("x");
        let out = reference::run(&g, &[("x", x)]).unwrap_or_else(|e| panic!("{op}: {e}"));
        let ys = f32s(&out[0].1);
        let mut worst = (0.0, 0.0f32);
        for (x, y) in xs.iter().zip(&ys) {
            let want = f(*x as f64);
            // Sinh, Cosh and Tan grow fast: judge them relative to |y| alone.
            let scale =
                if matches!(op, "Sinh" | "Cosh" | "Tan") { want.abs().max(1e-30) } else { 1.0 + want.abs() };
            let err = (*y as f64 - want).abs() / scale;
            if err > worst.0 {
                worst = (err, *x);
            }
        }
        assert!(worst.0 < 2e-6, "{op}: error {:e} at x = {}", worst.0, worst.1);
    }
}

/// `GatherElements` along a symbolic axis with negative indices; an index
/// outside the axis is an error, not a read elsewhere.
#[test]
fn gather_elements_wraps_negative_indices_and_rejects_others() {
    let m = model(
        vec![node("GatherElements", &["x", "i"], &["y"], vec![attr_int("axis", 1)])],
        vec![
            value_info("x", FLOAT, &[Dim::V(2), Dim::P("n")]),
            value_info("i", INT64, &[Dim::V(2), Dim::V(3)]),
        ],
        &["y"],
        vec![],
        17,
    );
    let g = import(&m);
    let x = Tensor::new(vec![2, 4], Elems::F32((0..8).map(|v| v as f32).collect())).expect("x");
    let i = Tensor::new(vec![2, 3], Elems::I64(vec![0, -1, 2, 3, 1, -4])).expect("i");
    let out = reference::run(&g, &[("x", x.clone()), ("i", i)]).expect("run");
    assert_eq!(f32s(&out[0].1), vec![0.0, 3.0, 2.0, 7.0, 5.0, 4.0]);
    // 4 is past the axis (extent 4): in a flat read it would land on row 1.
    let bad = Tensor::new(vec![2, 3], Elems::I64(vec![0, 4, 0, 0, 0, 0])).expect("i");
    let e = reference::run(&g, &[("x", x), ("i", bad)]).expect_err("out of range");
    assert!(e.to_string().contains("out of range"), "{e}");
}

/// `GatherND` with a batch axis of symbolic extent: each batch entry's index
/// pairs pick rows of its own matrix.
#[test]
fn gather_nd_with_a_batch_axis() {
    let m = model(
        vec![node("GatherND", &["x", "i"], &["y"], vec![attr_int("batch_dims", 1)])],
        vec![
            value_info("x", FLOAT, &[Dim::P("b"), Dim::V(3), Dim::V(2), Dim::V(2)]),
            value_info("i", INT64, &[Dim::P("b"), Dim::V(1), Dim::V(2)]),
        ],
        &["y"],
        vec![],
        17,
    );
    let g = import(&m);
    let x = Tensor::new(vec![2, 3, 2, 2], Elems::F32((0..24).map(|v| v as f32).collect())).expect("x");
    let i = Tensor::new(vec![2, 1, 2], Elems::I64(vec![2, 1, -3, 0])).expect("i");
    let out = reference::run(&g, &[("x", x), ("i", i)]).expect("run");
    assert_eq!(out[0].1.shape(), &[2, 1, 2]);
    // Entry 0: x[0, 2, 1, :] = [10, 11]; entry 1: x[1, 0, 0, :] = [12, 13].
    assert_eq!(f32s(&out[0].1), vec![10.0, 11.0, 12.0, 13.0]);
}

/// `Resize` of an image whose height and width are symbols: the output extents
/// are symbolic (twice and half the input's), and the values equal those of the
/// same resize imported with the extents known.
#[test]
fn resize_with_symbolic_extents_matches_the_static_import() {
    let cases = [
        ("nearest", "asymmetric", 2.0f32),
        ("linear", "half_pixel", 2.0),
        ("cubic", "align_corners", 2.0),
        ("linear", "pytorch_half_pixel", 0.5),
    ];
    for (mode, ctm, scale) in cases {
        let build = |dims: &[Dim]| {
            let attrs = vec![attr_string("mode", mode), attr_string("coordinate_transformation_mode", ctm)];
            model(
                vec![node("Resize", &["x", "", "scales"], &["y"], attrs)],
                vec![value_info("x", FLOAT, dims)],
                &["y"],
                vec![f32_tensor("scales", &[4], &[1.0, 1.0, scale, scale])],
                19,
            )
        };
        let sym = import(&build(&[Dim::V(1), Dim::V(2), Dim::P("h"), Dim::P("w")]));
        let out = sym.ty(sym.outputs[0]).shape.iter().map(|d| d.to_string()).collect::<Vec<_>>();
        let want = if scale > 1.0 { ["1", "2", "2*h", "2*w"] } else { ["1", "2", "h/2", "w/2"] };
        assert_eq!(out, want, "{mode} {ctm}");
        for (h, w) in [(4usize, 6usize), (7, 3), (2, 2)] {
            let stat = import(&build(&[Dim::V(1), Dim::V(2), Dim::V(h as i64), Dim::V(w as i64)]));
            let n = 2 * h * w;
            let x = Tensor::new(
                vec![1, 2, h, w],
                Elems::F32((0..n).map(|i| ((i * 7) % 11) as f32 - 5.0).collect()),
            )
            .expect("x");
            let a = reference::run(&sym, &[("x", x.clone())]).unwrap_or_else(|e| panic!("{mode} {ctm}: {e}"));
            let b = reference::run(&stat, &[("x", x)]).unwrap_or_else(|e| panic!("{mode} {ctm}: {e}"));
            assert_eq!(a[0].1.shape(), b[0].1.shape(), "{mode} {ctm} {h}x{w}");
            let (a, b) = (f32s(&a[0].1), f32s(&b[0].1));
            assert!(
                a.iter().zip(&b).all(|(p, q)| (p - q).abs() <= 1e-5),
                "{mode} {ctm} {h}x{w}: {a:?} vs {b:?}"
            );
        }
    }
}

/// `TopK` takes each position once, ties in index order, even among values
/// equal to what a taken position is hidden behind (-inf for the largest).
#[test]
fn top_k_takes_each_position_once() {
    for (largest, k, want_v, want_i) in [
        (1, 4, vec![3.0, 3.0, 1.0, f32::NEG_INFINITY], vec![1i64, 2, 4, 0]),
        (0, 3, vec![f32::NEG_INFINITY, f32::NEG_INFINITY, 1.0], vec![0, 3, 4]),
    ] {
        let m = model(
            vec![node("TopK", &["x", "k"], &["v", "i"], vec![attr_int("largest", largest)])],
            vec![value_info("x", FLOAT, &[Dim::V(1), Dim::P("n")])],
            &["v", "i"],
            vec![i64_tensor("k", &[1], &[k])],
            17,
        );
        let g = import(&m);
        let x =
            Tensor::new(vec![1, 5], Elems::F32(vec![f32::NEG_INFINITY, 3.0, 3.0, f32::NEG_INFINITY, 1.0]))
                .expect("x");
        let out = reference::run(&g, &[("x", x)]).expect("run");
        assert_eq!(f32s(&out[0].1), want_v, "largest {largest}");
        let Elems::I64(i) = out[1].1.elems() else { panic!("i64 indices") };
        assert_eq!(i, &want_i, "largest {largest}");
    }
}

/// A constant `Pad` whose value is an input (computed at run time), on a
/// symbolic extent, with a crop on the other side.
#[test]
fn pad_with_a_value_from_data() {
    let m = model(
        vec![node("Pad", &["x", "pads", "v"], &["y"], vec![])],
        vec![value_info("x", FLOAT, &[Dim::V(1), Dim::P("n")]), value_info("v", FLOAT, &[])],
        &["y"],
        vec![i64_tensor("pads", &[4], &[0, 2, 0, -1])],
        17,
    );
    let g = import(&m);
    let x = Tensor::new(vec![1, 3], Elems::F32(vec![1.0, 2.0, 3.0])).expect("x");
    let v = Tensor::new(vec![], Elems::F32(vec![-7.5])).expect("v");
    let out = reference::run(&g, &[("x", x), ("v", v)]).expect("run");
    assert_eq!(out[0].1.shape(), &[1, 4]);
    assert_eq!(f32s(&out[0].1), vec![-7.5, -7.5, 1.0, 2.0]);
}

fn bool_scalar(name: &str, v: bool) -> anyshape_onnx::proto::TensorProto {
    anyshape_onnx::proto::TensorProto {
        name: Some(name.into()),
        data_type: Some(anyshape_onnx::proto::data_type::BOOL),
        int32_data: vec![i32::from(v)],
        ..Default::default()
    }
}

fn graph_attr(name: &str, g: anyshape_onnx::proto::GraphProto) -> anyshape_onnx::proto::AttributeProto {
    anyshape_onnx::proto::AttributeProto {
        name: Some(name.into()),
        r#type: Some(5),
        g: Some(g),
        ..Default::default()
    }
}

fn branch(
    nodes: Vec<anyshape_onnx::proto::NodeProto>,
    inits: Vec<anyshape_onnx::proto::TensorProto>,
    out: &str,
) -> anyshape_onnx::proto::GraphProto {
    anyshape_onnx::proto::GraphProto {
        node: nodes,
        initializer: inits,
        output: vec![anyshape_onnx::proto::ValueInfoProto { name: Some(out.into()), r#type: None }],
        ..Default::default()
    }
}

/// An `If` whose condition is a constant inlines the branch it takes: that
/// branch's own initializers and values, the enclosing graph's by name, and a
/// nested `If` reading the outer branch's values. A condition computed at run
/// time is an error naming the node.
#[test]
fn if_with_a_known_condition_inlines_its_branch() {
    // then: t = x·2; (nested, taken) u = t + 1. else: u = -x.
    let nested = node(
        "If",
        &["yes"],
        &["u"],
        vec![
            graph_attr(
                "then_branch",
                branch(
                    vec![node("Add", &["t", "one"], &["v"], vec![])],
                    vec![f32_tensor("one", &[], &[1.0])],
                    "v",
                ),
            ),
            graph_attr("else_branch", branch(vec![node("Neg", &["t"], &["w"], vec![])], vec![], "w")),
        ],
    );
    let then = branch(
        vec![node("Mul", &["x", "two"], &["t"], vec![]), nested],
        vec![f32_tensor("two", &[], &[2.0]), bool_scalar("yes", true)],
        "u",
    );
    let other = branch(vec![node("Neg", &["x"], &["z"], vec![])], vec![], "z");
    for (cond, want) in [(true, [3.0f32, 5.0, -1.0]), (false, [-1.0, -2.0, 1.0])] {
        let m = model(
            vec![node(
                "If",
                &["c"],
                &["y"],
                vec![graph_attr("then_branch", then.clone()), graph_attr("else_branch", other.clone())],
            )],
            vec![value_info("x", FLOAT, &[Dim::P("n")])],
            &["y"],
            vec![bool_scalar("c", cond)],
            17,
        );
        let g = import(&m);
        let x = Tensor::new(vec![3], Elems::F32(vec![1.0, 2.0, -1.0])).expect("x");
        let out = reference::run(&g, &[("x", x)]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(f32s(&out[0].1), want, "condition {cond}");
    }
    // The condition is an input: known only at run time.
    let m = model(
        vec![node(
            "If",
            &["c"],
            &["y"],
            vec![graph_attr("then_branch", then), graph_attr("else_branch", other)],
        )],
        vec![
            value_info("x", FLOAT, &[Dim::P("n")]),
            value_info("c", anyshape_onnx::proto::data_type::BOOL, &[]),
        ],
        &["y"],
        vec![],
        17,
    );
    let e = import_bytes(&encode(&m), &ImportOptions::new()).expect_err("a run-time condition").to_string();
    assert!(e.contains("If_y") && e.contains("condition is computed at run time"), "{e}");
}

/// `ScatterElements` along a symbolic axis (negative indices wrap; with
/// `add`, two updates to one place both count) and `ScatterND` of rows (the
/// last of two writes to one row wins); an index outside its axis is an
/// error at run time, not a write elsewhere.
#[test]
fn scatters_combine_updates_and_reject_indices_out_of_range() {
    let m = model(
        vec![node(
            "ScatterElements",
            &["x", "i", "u"],
            &["y"],
            vec![attr_int("axis", 1), attr_string("reduction", "add")],
        )],
        vec![
            value_info("x", FLOAT, &[Dim::V(2), Dim::P("n")]),
            value_info("i", INT64, &[Dim::V(2), Dim::V(2)]),
            value_info("u", FLOAT, &[Dim::V(2), Dim::V(2)]),
        ],
        &["y"],
        vec![],
        18,
    );
    let g = import(&m);
    let x = Tensor::new(vec![2, 3], Elems::F32(vec![0.0; 6])).expect("x");
    let u = Tensor::new(vec![2, 2], Elems::F32(vec![1.0, 2.0, 3.0, 4.0])).expect("u");
    let i = Tensor::new(vec![2, 2], Elems::I64(vec![-1, 2, 0, 1])).expect("i");
    let out = reference::run(&g, &[("x", x.clone()), ("i", i), ("u", u.clone())]).expect("run");
    assert_eq!(f32s(&out[0].1), vec![0.0, 0.0, 3.0, 3.0, 4.0, 0.0]);
    let bad = Tensor::new(vec![2, 2], Elems::I64(vec![0, 3, 0, 0])).expect("i");
    let e = reference::run(&g, &[("x", x), ("i", bad), ("u", u)]).expect_err("out of range");
    assert!(e.to_string().contains("out of range"), "{e}");

    let m = model(
        vec![node("ScatterND", &["x", "i", "u"], &["y"], vec![])],
        vec![
            value_info("x", FLOAT, &[Dim::P("n"), Dim::V(2)]),
            value_info("i", INT64, &[Dim::V(3), Dim::V(1)]),
            value_info("u", FLOAT, &[Dim::V(3), Dim::V(2)]),
        ],
        &["y"],
        vec![],
        18,
    );
    let g = import(&m);
    let x = Tensor::new(vec![3, 2], Elems::F32(vec![9.0; 6])).expect("x");
    let i = Tensor::new(vec![3, 1], Elems::I64(vec![2, 0, 2])).expect("i");
    let u = Tensor::new(vec![3, 2], Elems::F32(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0])).expect("u");
    let out = reference::run(&g, &[("x", x), ("i", i), ("u", u)]).expect("run");
    assert_eq!(f32s(&out[0].1), vec![3.0, 4.0, 9.0, 9.0, 5.0, 6.0]);
}

/// `TensorScatter` writes each batch entry's update into its cache from its
/// own position (wrapping in `circular` mode); in `linear` mode a write past
/// the cache's end is an error at run time.
#[test]
fn tensor_scatter_writes_each_entry_from_its_position() {
    let graph = |mode: &str| {
        import(&model(
            vec![node("TensorScatter", &["c", "u", "w"], &["y"], vec![attr_string("mode", mode)])],
            vec![
                value_info("c", FLOAT, &[Dim::V(2), Dim::P("max"), Dim::V(1)]),
                value_info("u", FLOAT, &[Dim::V(2), Dim::P("s"), Dim::V(1)]),
                value_info("w", INT64, &[Dim::V(2)]),
            ],
            &["y"],
            vec![],
            24,
        ))
    };
    let cache = Tensor::new(vec![2, 4, 1], Elems::F32(vec![0.0; 8])).expect("c");
    let upd = Tensor::new(vec![2, 2, 1], Elems::F32(vec![1.0, 2.0, 3.0, 4.0])).expect("u");
    let at = |a: i64, b: i64| Tensor::new(vec![2], Elems::I64(vec![a, b])).expect("w");
    let run =
        |g: &ir::Graph, w: Tensor| reference::run(g, &[("c", cache.clone()), ("u", upd.clone()), ("w", w)]);
    let linear = graph("linear");
    let out = run(&linear, at(1, 2)).expect("run");
    assert_eq!(f32s(&out[0].1), vec![0.0, 1.0, 2.0, 0.0, 0.0, 0.0, 3.0, 4.0]);
    let e = run(&linear, at(0, 3)).expect_err("past the cache");
    assert!(e.to_string().contains("out of range"), "{e}");
    let circular = graph("circular");
    let out = run(&circular, at(0, 3)).expect("run");
    assert_eq!(f32s(&out[0].1), vec![1.0, 2.0, 0.0, 0.0, 4.0, 0.0, 0.0, 3.0]);
}
