//! Helpers shared by the IR's integration tests.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Arc;

use ir::{
    infer, parse_graph, print_graph, weight_table, BinaryOp, ConstData, ConvAttrs, DType, Elems, Graph, Op,
    PadMode, PoolAttrs, PoolKind, ReduceOp, SliceAxis, Tensor, TensorType, UnaryOp, ValueId,
};
use sym::{lit, sym, Range, ShapeEnv, SymExpr, SymOrigin};

pub use anyshape_ir as ir;

/// A lookup for `parse_graph` over a weight table.
pub fn lookup(table: &HashMap<String, Arc<ConstData>>) -> impl Fn(&str) -> Option<Arc<ConstData>> + '_ {
    move |n| table.get(n).cloned()
}

/// Print, parse back with `g`'s own weights, print again: the texts must agree.
pub fn roundtrip(g: &Graph) -> Graph {
    let text = print_graph(g);
    let table = weight_table(g);
    let g2 = parse_graph(&text, &lookup(&table)).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(print_graph(&g2), text, "round trip changed the text");
    g2
}

pub fn ty(dtype: DType, dims: &[SymExpr]) -> TensorType {
    TensorType::new(dtype, dims.to_vec())
}

pub fn f32s(shape: &[usize], v: &[f32]) -> Arc<ConstData> {
    Arc::new(ConstData::from_tensor(&Tensor::new(shape.to_vec(), Elems::F32(v.to_vec())).unwrap()))
}

/// Add a node whose output type `infer` determines.
pub fn node(g: &mut Graph, op: Op, ins: &[ValueId], name: &str) -> ValueId {
    let tys: Vec<&TensorType> = ins.iter().map(|v| g.ty(*v)).collect();
    let t = infer(&op, &tys, &g.env).unwrap().expect("an op infer determines");
    g.add_node(op, ins.to_vec(), name, t)
}

/// The shape env of the golden tests.
pub fn env() -> ShapeEnv {
    let mut env = ShapeEnv::new();
    env.declare("batch", Range::at_least(1), SymOrigin::Param).unwrap();
    env.declare("seq", Range::new(8, 512), SymOrigin::Param).unwrap();
    env.set_divisor("seq", 8).unwrap();
    env.declare("h", Range::new(1, 1024), SymOrigin::User).unwrap();
    let unk = env.fresh("unk");
    env.equate(&unk, &(sym("batch") * sym("seq"))).unwrap();
    env
}

/// A graph using every op kind, dtype and attribute form.
pub fn kitchen_sink() -> Graph {
    let (batch, seq, h) = (sym("batch"), sym("seq"), sym("h"));
    let mut g = Graph::new(env());
    let x = g.add_input("x", ty(DType::F32, &[batch.clone(), seq.clone(), lit(4)]));
    let wq = g.add_input("onnx::MatMul_12", ty(DType::F32, &[batch.clone(), lit(4), lit(4)]));
    let img = g.add_input("img", ty(DType::F32, &[batch.clone(), lit(3), h.clone(), h.clone()]));
    let ids = g.add_input("/bert/ids", TensorType::new(DType::I64, vec![seq.clone()]));

    let w16: Vec<f32> = (0..16).map(|i| i as f32 * 0.25 - 1.0).collect();
    let w = node(&mut g, Op::Constant(f32s(&[4, 4], &w16)), &[], "w");
    let big: Vec<f32> = (0..25).map(|i| i as f32).collect();
    node(&mut g, Op::Constant(f32s(&[5, 5], &big)), &[], "big");
    let specials = node(
        &mut g,
        Op::Constant(f32s(&[4], &[f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0])),
        &[],
        "specials",
    );
    let half = node(&mut g, Op::Constant(f32s(&[], &[0.5])), &[], "half");
    let tensor = |shape: &[usize], e: Elems| {
        Arc::new(ConstData::from_tensor(&Tensor::new(shape.to_vec(), e).unwrap()))
    };
    let flags = node(&mut g, Op::Constant(tensor(&[2], Elems::Bool(vec![true, false]))), &[], "flags");
    let one16 = node(&mut g, Op::Constant(tensor(&[], Elems::F16(vec![0x3c00]))), &[], "one16");
    let small = node(&mut g, Op::Constant(tensor(&[2, 1], Elems::I8(vec![-128, 127]))), &[], "small");
    let s = g.add_node(
        Op::SymConst(vec![batch.clone(), seq.clone() * 2]),
        vec![],
        "s",
        ty(DType::I64, &[lit(2)]),
    );
    let pos = g.add_node(Op::Iota { axis: 0 }, vec![], "pos", TensorType::new(DType::I64, vec![seq.clone()]));

    let mm = node(&mut g, Op::MATMUL, &[x, wq], "mm");
    let t = node(&mut g, Op::Transpose { perm: vec![0, 2, 1] }, &[mm], "t");
    let e = node(&mut g, Op::Unary(UnaryOp::Exp), &[t], "e");
    let sum = node(&mut g, Op::Binary(BinaryOp::Add), &[e, t], "sum");
    let lt = node(&mut g, Op::Binary(BinaryOp::Less), &[e, sum], "lt");
    let sel = node(&mut g, Op::Select, &[lt, e, sum], "sel");
    let r = node(&mut g, Op::Reduce { op: ReduceOp::Sum, axes: vec![2], keep_dims: true }, &[sel], "r");
    let b = g.add_node(Op::Broadcast, vec![r], "b", ty(DType::F32, &[batch.clone(), lit(4), seq.clone()]));
    let rs = g.add_node(Op::Reshape, vec![b], "rs", ty(DType::F32, &[batch.clone(), seq.clone() * 4]));
    let sl = g.add_node(
        Op::Slice { axes: vec![SliceAxis { axis: 1, start: lit(1), step: 2 }] },
        vec![rs],
        "sl",
        ty(DType::F32, &[batch.clone(), seq.clone() * 2]),
    );
    let pads = vec![(lit(0), lit(0)), (lit(1), seq.clone() - 1)];
    let p = node(&mut g, Op::Pad { pads, mode: PadMode::Constant(-0.0) }, &[sl], "p");
    let p2 = node(
        &mut g,
        Op::Pad { pads: vec![(lit(0), lit(0)), (lit(2), lit(0))], mode: PadMode::Reflect },
        &[p],
        "p",
    );
    let p3 = node(
        &mut g,
        Op::Pad { pads: vec![(lit(0), lit(0)), (lit(0), lit(-2))], mode: PadMode::Edge },
        &[p2],
        "p",
    );
    let cat = node(&mut g, Op::Concat { axis: 1 }, &[p3, p], "cat");
    let ga = node(&mut g, Op::Gather { axis: 0 }, &[w, ids], "gathered");
    let cs = node(&mut g, Op::CumSum { axis: 0, exclusive: false, reverse: true }, &[ga], "cs");
    let cast = g.add_node(Op::Cast, vec![cs], "cast", ty(DType::F16, &[seq.clone(), lit(4)]));
    let k: Vec<f32> = (0..54).map(|i| (i as f32).sin()).collect();
    let k = node(&mut g, Op::Constant(f32s(&[2, 3, 3, 3], &k)), &[], "conv.weight");
    let geom = ConvAttrs {
        strides: vec![1, 1],
        dilations: vec![1, 1],
        pads_begin: vec![1, 1],
        pads_end: vec![1, 1],
        group: 1,
    };
    let conv = node(&mut g, Op::Conv(geom), &[img, k], "conv");
    let half_h = h.try_floor_div(2).unwrap();
    let pool_ty = ty(DType::F32, &[batch.clone(), lit(2), half_h.clone(), half_h.clone()]);
    let pool = |kind, kernel: i64, stride: i64, pad: i64| {
        Op::Pool(PoolAttrs {
            kind,
            kernel: vec![kernel; 2],
            strides: vec![stride; 2],
            dilations: vec![1, 1],
            pads_begin: vec![pad; 2],
            pads_end: vec![pad; 2],
            channels_last: false,
        })
    };
    let mp = g.add_node(pool(PoolKind::Max, 2, 2, 0), vec![conv], "mp", pool_ty.clone());
    let ap = g.add_node(pool(PoolKind::Avg { count_include_pad: false }, 3, 1, 1), vec![mp], "ap", pool_ty);
    let kt: Vec<f32> = (0..24).map(|i| i as f32 / 8.0).collect();
    let kt = node(&mut g, Op::Constant(f32s(&[2, 3, 2, 2], &kt)), &[], "kt");
    let up_dim = half_h * 2;
    let geom = ConvAttrs {
        strides: vec![2, 2],
        dilations: vec![1, 1],
        pads_begin: vec![0, 0],
        pads_end: vec![0, 0],
        group: 1,
    };
    let up = g.add_node(
        Op::ConvTranspose(geom),
        vec![ap, kt],
        "up",
        ty(DType::F32, &[batch.clone(), lit(3), up_dim.clone(), up_dim]),
    );
    let first = g.add_node(
        Op::Slice { axes: vec![SliceAxis { axis: 0, start: lit(0), step: 1 }] },
        vec![ids],
        "first",
        ty(DType::I64, &[seq.min(&lit(16))]),
    );
    let rev = g.add_node(
        Op::Slice { axes: vec![SliceAxis { axis: 0, start: sym("seq") - 1, step: -1 }] },
        vec![pos],
        "rev",
        ty(DType::I64, &[sym("seq")]),
    );
    let nan = node(&mut g, Op::Unary(UnaryOp::IsNaN), &[specials], "is_nan");
    let both = node(&mut g, Op::Binary(BinaryOp::And), &[flags, flags], "both");
    let y = node(&mut g, Op::Binary(BinaryOp::Mul), &[half, half], "y");
    g.outputs = vec![cat, up, cast, s, first, rev, nan, both, one16, small, y];
    g
}
