//! The standard pipeline keeps every fixture model's meaning: the reference
//! interpreter gives the same outputs before and after, on random inputs at
//! random shapes drawn from the symbols' ranges (including 1 and primes).

use std::path::PathBuf;

use anyshape_passes::Pipeline;
use ir::{DType, Elems, Graph, Tensor};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

fn fixture(name: &str) -> Graph {
    let p =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(name).join("model.onnx");
    onnx::import_file(&p, &onnx::ImportOptions::new()).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Deterministic pseudo-random inputs for a binding of the symbols.
fn inputs(g: &Graph, dims: &dyn Fn(&str) -> i64, seed: u64) -> Vec<(String, Tensor)> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut next = move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) as u32
    };
    g.inputs
        .iter()
        .map(|v| {
            let (name, ty) = (g.name(*v).to_string(), g.ty(*v));
            let shape: Vec<usize> = ty
                .shape
                .iter()
                .map(|d| g.env.normalize(d).eval(&|s| Some(dims(s))).expect("dim") as usize)
                .collect();
            let n: usize = shape.iter().product();
            let elems = match ty.dtype {
                DType::I64 if name.contains("mask") => Elems::I64(
                    (0..n).map(|i| if i % shape[1] == 0 { 1 } else { (next() % 2) as i64 }).collect(),
                ),
                DType::I64 if name.contains("type") => {
                    Elems::I64((0..n).map(|_| (next() % 2) as i64).collect())
                }
                DType::I64 => Elems::I64((0..n).map(|_| (next() % 90) as i64).collect()),
                DType::F32 => {
                    Elems::F32((0..n).map(|_| next() as f32 / u32::MAX as f32 * 4.0 - 2.0).collect())
                }
                other => panic!("no generator for {other}"),
            };
            (name, Tensor::new(shape, elems).expect("tensor"))
        })
        .collect()
}

fn run(g: &Graph, ins: &[(String, Tensor)]) -> Vec<(String, Tensor)> {
    let named: Vec<(&str, Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    reference::run(g, &named).unwrap_or_else(|e| panic!("{e}"))
}

fn run_grouped(
    g: &Graph,
    plan: &anyshape_passes::FusionPlan,
    ins: &[(String, Tensor)],
) -> Vec<(String, Tensor)> {
    let named: Vec<(&str, Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    reference::run_units(g, &plan.units(g), &named).unwrap_or_else(|e| panic!("group by group: {e}"))
}

/// The pipeline keeps the meaning, and so does running the fusion plan group by
/// group (each group's intermediates invisible outside it).
fn check(name: &str, dims: impl Strategy<Value = Vec<(&'static str, i64)>>) {
    let before = fixture(name);
    let mut after = before.clone();
    let report = Pipeline::standard().verify(true).run(&mut after).expect("pipeline");
    // Only convolutions grow the graph (each into its im2col taps and a matmul).
    let grows = report.rewrites("conv-as-matmul") > 0;
    assert!(report.nodes_after <= report.nodes_before || grows, "{name}: {report:?}");
    let plan = anyshape_passes::fuse(&after);
    let mut runner = TestRunner::new(Config { cases: 6, ..Config::default() });
    runner
        .run(&(dims, any::<u64>()), |(dims, seed)| {
            let lookup = |s: &str| dims.iter().find(|(n, _)| *n == s).map(|(_, v)| *v).unwrap_or(1);
            let ins = inputs(&before, &lookup, seed);
            let want = run(&before, &ins);
            for got in [run(&after, &ins), run_grouped(&after, &plan, &ins)] {
                prop_assert_eq!(want.len(), got.len());
                for ((wn, w), (gn, gt)) in want.iter().zip(&got) {
                    prop_assert_eq!(wn, gn);
                    prop_assert_eq!(w.shape(), gt.shape());
                    let (a, b) = (w.to_f64_vec(), gt.to_f64_vec());
                    let max = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
                    prop_assert!(max <= 1e-6, "{} {}: differs by {} at {:?}", name, wn, max, dims);
                }
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
}

fn seq() -> impl Strategy<Value = i64> {
    prop_oneof![Just(1i64), Just(2), Just(13), Just(31), Just(64), 1i64..=64]
}

#[test]
fn bert_keeps_its_meaning() {
    check("bert", (1i64..=3, seq()).prop_map(|(b, s)| vec![("batch", b), ("seq", s)]));
}

#[test]
fn gpt2_keeps_its_meaning() {
    check("gpt2", (1i64..=3, seq()).prop_map(|(b, s)| vec![("batch", b), ("seq", s)]));
}

#[test]
fn albert_keeps_its_meaning() {
    check("albert", (1i64..=3, seq()).prop_map(|(b, s)| vec![("batch", b), ("seq", s)]));
}

#[test]
fn bert_dynamo_keeps_its_meaning() {
    check(
        "bert_dynamo",
        (1i64..=3, prop_oneof![Just(1i64), Just(2), Just(13), Just(63), 1i64..=63])
            .prop_map(|(b, s)| vec![("s0", b), ("s1", s)]),
    );
}

#[test]
fn vit_keeps_its_meaning() {
    check("vit", (1i64..=3).prop_map(|b| vec![("batch", b)]));
}

#[test]
fn resnet_keeps_its_meaning() {
    let side = prop_oneof![Just(17i64), Just(29), Just(32), 16i64..=40];
    check(
        "resnet",
        (1i64..=2, side.clone(), side).prop_map(|(b, h, w)| vec![("batch", b), ("height", h), ("width", w)]),
    );
}

/// Each pass on its own (to its fixpoint) keeps every fixture's meaning, at a
/// shape with 1s and one with primes.
#[test]
fn each_pass_alone_keeps_the_meaning() {
    use anyshape_passes::*;
    let passes: Vec<Box<dyn Pass>> = vec![
        Box::new(SimplifyShapes),
        Box::new(FoldConstants::default()),
        Box::new(SimplifyAlgebra),
        Box::new(HoistMatMulScale),
        Box::new(IntegerMatMulAsFloat),
        Box::new(Cse),
        Box::new(Dce),
        Box::new(EliminateBroadcasts),
        Box::new(MergeSharedOperand),
        Box::new(BatchEqualShapes),
    ];
    let shapes: [(&str, [(&str, i64); 3]); 6] = [
        ("bert", [("batch", 1), ("seq", 1), ("", 0)]),
        ("gpt2", [("batch", 2), ("seq", 13), ("", 0)]),
        ("albert", [("batch", 3), ("seq", 31), ("", 0)]),
        ("bert_dynamo", [("s0", 2), ("s1", 7), ("", 0)]),
        ("vit", [("batch", 2), ("", 0), ("", 0)]),
        ("resnet", [("batch", 1), ("height", 17), ("width", 29)]),
    ];
    for (name, dims) in shapes {
        let before = fixture(name);
        let lookup = |s: &str| dims.iter().find(|(n, _)| *n == s).map(|(_, v)| *v).unwrap_or(1);
        let ins = inputs(&before, &lookup, 7);
        let want = run(&before, &ins);
        for pass in &passes {
            let mut g = before.clone();
            for _ in 0..10 {
                let n = pass.run(&mut g).unwrap_or_else(|e| panic!("{name}: {e}"));
                ir::verify(&g)
                    .unwrap_or_else(|e| panic!("{name}: {} left an invalid graph: {e}", pass.name()));
                if n == 0 {
                    break;
                }
            }
            let got = run(&g, &ins);
            for ((wn, w), (_, gt)) in want.iter().zip(&got) {
                let max = w
                    .to_f64_vec()
                    .iter()
                    .zip(gt.to_f64_vec())
                    .map(|(x, y)| (x - y).abs())
                    .fold(0.0, f64::max);
                assert!(max <= 1e-6, "{name}: {} changed {wn} by {max}", pass.name());
            }
        }
    }
}

/// The zero point of a quantized image moved out of its padded convolution
/// (`MoveZeroPointOut`: the image padded by the zero point, the product less
/// `z·colsum(W)`; an int8 image shifted to bytes first, `x + 128`, padded by
/// `z + 128`) keeps every value exactly, at image sizes with 1, primes and a
/// stride's remainder; the product's A is then the codes. An int8 image whose
/// values less the zero point are bytes already (a zero point of -128) is
/// left alone.
#[test]
fn a_zero_point_moved_out_keeps_the_values() {
    let w: Vec<f32> = (0..8 * 27).map(|i: i32| (i * 73 % 256 - 128) as f32).collect();
    let wdata = std::sync::Arc::new(ir::ConstData::from_tensor(
        &Tensor::new(vec![8, 3, 3, 3], Elems::F32(w)).unwrap(),
    ));
    for (codes, z, fill, moved) in
        [("u8", "109.0", Some("109.0"), 1), ("i8", "-7.0", Some("121.0"), 1), ("i8", "-128.0", None, 0)]
    {
        let text = format!(
            "graph {{
  sym h param 1..
  sym w param 1..
  input %x: {codes}[1, 3, h, w]
  %wf: f32[8, 3, 3, 3] = constant @w
  %xf: f32[1, 3, h, w] = cast %x
  %z: f32[1, 1, 1, 1] = constant [{z}]
  %zb: f32[1, 3, h, w] = broadcast %z
  %xs: f32[1, 3, h, w] = sub %xf, %zb
  %y: f32[1, 8, (h-1)/2+1, (w-1)/2+1] = conv[strides=[2, 2], dilations=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], group=1] %xs, %wf
  output %y
}}
"
        );
        let before =
            ir::parse_graph(&text, &|n| (n == "w").then(|| wdata.clone())).unwrap_or_else(|e| panic!("{e}"));
        let mut after = before.clone();
        let report = Pipeline::standard().verify(true).run(&mut after).expect("pipeline");
        assert_eq!(report.rewrites("move-zero-point-out"), moved, "{codes} {z}: {report:?}");
        let text = ir::print_graph(&after);
        if let Some(fill) = fill {
            assert!(text.contains(&format!("mode=constant({fill})")), "not padded by {fill}:\n{text}");
        }
        let mut state = 7u32;
        for (h, w) in [(1usize, 1usize), (2, 7), (5, 5), (13, 8)] {
            let mut byte = || {
                state = state.wrapping_mul(1_103_515_245).wrapping_add(12345);
                (state >> 16) as u8
            };
            let x = match codes {
                "u8" => Elems::U8((0..3 * h * w).map(|_| byte()).collect()),
                _ => Elems::I8((0..3 * h * w).map(|_| byte() as i8).collect()),
            };
            let ins = vec![("x".to_string(), Tensor::new(vec![1, 3, h, w], x).unwrap())];
            assert_eq!(run(&before, &ins), run(&after, &ins), "{codes} {h}x{w}");
        }
    }
}

/// An int8 quantization read only by its dequantizations holds bytes
/// (`SignedCodesAsBytes`: `cast<u8>(clamp(a, -128, 127) + 128)`, each
/// `cast<f32>(q) - z` reading `cast<f32>(q') - (z + 128)`, a cast read
/// otherwise `- 128`): every value stays bit for bit, at the rounding's
/// halves, the clamps' edges, values past i32, infinities and NaN. An int8
/// quantization the graph outputs, or one whose clamps leave i8's range, is
/// left alone.
#[test]
fn int8_codes_held_as_bytes_keep_the_values() {
    for (zp, lo, hi, output_q, moved) in [
        (10, -128, 127, false, 1),
        (-18, -128, 127, false, 1),
        (0, -100, 50, false, 1),
        (10, -128, 127, true, 0),
    ] {
        let extra = if output_q { ", %q" } else { "" };
        let text = format!(
            "graph {{
  sym n param 1..
  input %x: f32[n, 4]
  %s: f32[1, 1] = constant [0.05]
  %sb: f32[n, 4] = broadcast %s
  %d: f32[n, 4] = div %x, %sb
  %r: f32[n, 4] = round %d
  %i: i32[n, 4] = cast %r
  %zp: i32[1, 1] = constant [{zp}]
  %zpb: i32[n, 4] = broadcast %zp
  %a: i32[n, 4] = add %i, %zpb
  %lo: i32[1, 1] = constant [{lo}]
  %lob: i32[n, 4] = broadcast %lo
  %m1: i32[n, 4] = max %a, %lob
  %hi: i32[1, 1] = constant [{hi}]
  %hib: i32[n, 4] = broadcast %hi
  %m2: i32[n, 4] = min %m1, %hib
  %q: i8[n, 4] = cast %m2
  %f: f32[n, 4] = cast %q
  %zf: f32[1, 1] = constant [{zp}.0]
  %zfb: f32[n, 4] = broadcast %zf
  %dq: f32[n, 4] = sub %f, %zfb
  %y: f32[n, 4] = mul %dq, %sb
  %h: f32[n, 4] = mul %f, %sb
  output %y, %h{extra}
}}
"
        );
        let before = ir::parse_graph(&text, &|_| None).unwrap_or_else(|e| panic!("{e}"));
        let mut after = before.clone();
        let report = Pipeline::standard().verify(true).run(&mut after).expect("pipeline");
        let case = format!("zero point {zp}, clamps {lo}..={hi}, q an output: {output_q}");
        assert_eq!(report.rewrites("signed-codes-as-bytes"), moved, "{case}: {report:?}");
        let printed = ir::print_graph(&after);
        if moved == 1 {
            assert!(
                printed.contains(": u8[n, 4] = cast") && !printed.contains(": i8["),
                "{case}:\n{printed}"
            );
        }
        let mut state = 5u32;
        let special =
            [0.025, -0.025, 0.075, 6.375, -6.425, 3e9, -3e9, f32::INFINITY, f32::NEG_INFINITY, f32::NAN];
        for n in [1usize, 2, 7, 33] {
            let x: Vec<f32> = (0..n * 4)
                .map(|i| {
                    state = state.wrapping_mul(1_103_515_245).wrapping_add(12345);
                    match (state >> 16) % 5 {
                        0 => special[i % special.len()],
                        _ => ((state >> 4) % 4000) as f32 * 0.005 - 10.0,
                    }
                })
                .collect();
            let ins = vec![("x".to_string(), Tensor::new(vec![n, 4], Elems::F32(x)).unwrap())];
            let (b, a) = (run(&before, &ins), run(&after, &ins));
            for ((name, want), (_, got)) in b.iter().zip(&a) {
                let bits = |t: &Tensor| -> Vec<u64> {
                    t.to_f64_vec().iter().map(|x| if x.is_nan() { u64::MAX } else { x.to_bits() }).collect()
                };
                assert_eq!(bits(want), bits(got), "{case}: {name} at n = {n}");
            }
        }
    }
}

/// A quantization of a dequantization by the same scale and zero point,
/// through a reshape and a transpose (`quantize_static`'s pairs around
/// attention's views), is the codes themselves, viewed (`QuantizedRoundTrip`):
/// every one of the 256 codes gives the same value, bytes to bytes and bytes
/// to int8 codes (held as bytes first, `SignedCodesAsBytes`); another scale
/// keeps the pair.
#[test]
fn a_quantized_round_trip_is_the_codes() {
    for (s2, zq, signed, folded) in
        [("0.0196588", 133, false, 1), ("0.0196589", 133, false, 0), ("0.0196588", 5, true, 1)]
    {
        let (lo, hi, ty) = if signed { (-128, 127, "i8") } else { (0, 255, "u8") };
        let text = format!(
            "graph {{
  sym n param 1..
  input %q: u8[n, 8]
  %qf: f32[n, 8] = cast %q
  %z: f32[1, 1] = constant [133.0]
  %zb: f32[n, 8] = broadcast %z
  %x: f32[n, 8] = sub %qf, %zb
  %s: f32[1, 1] = constant [0.0196588]
  %sb: f32[n, 8] = broadcast %s
  %d: f32[n, 8] = mul %x, %sb
  %r: f32[n, 2, 4] = reshape %d
  %t: f32[n, 4, 2] = transpose[perm=[0, 2, 1]] %r
  %s2: f32[1, 1, 1] = constant [{s2}]
  %s2b: f32[n, 4, 2] = broadcast %s2
  %y: f32[n, 4, 2] = div %t, %s2b
  %yr: f32[n, 4, 2] = round %y
  %yi: i32[n, 4, 2] = cast %yr
  %zq: i32[1, 1, 1] = constant [{zq}]
  %zqb: i32[n, 4, 2] = broadcast %zq
  %ya: i32[n, 4, 2] = add %yi, %zqb
  %lo: i32[1, 1, 1] = constant [{lo}]
  %lob: i32[n, 4, 2] = broadcast %lo
  %hi: i32[1, 1, 1] = constant [{hi}]
  %hib: i32[n, 4, 2] = broadcast %hi
  %c0: i32[n, 4, 2] = max %ya, %lob
  %c1: i32[n, 4, 2] = min %c0, %hib
  %o: {ty}[n, 4, 2] = cast %c1
  %of: f32[n, 4, 2] = cast %o
  %zf: f32[1, 1, 1] = constant [{zq}.0]
  %zfb: f32[n, 4, 2] = broadcast %zf
  %od: f32[n, 4, 2] = sub %of, %zfb
  %s2f: f32[n, 4, 2] = broadcast %s2
  %out: f32[n, 4, 2] = mul %od, %s2f
  output %out
}}
"
        );
        let before = ir::parse_graph(&text, &|_| None).unwrap_or_else(|e| panic!("{e}"));
        let mut after = before.clone();
        let report = Pipeline::standard().verify(true).run(&mut after).expect("pipeline");
        let case = format!("scale {s2}, zero point {zq}, {ty}");
        assert_eq!(report.rewrites("quantized-round-trip"), folded, "{case}: {report:?}");
        // Every code once, in 32 rows of 8.
        let codes: Vec<u8> = (0..=255u8).collect();
        let ins = vec![("q".to_string(), Tensor::new(vec![32, 8], Elems::U8(codes)).unwrap())];
        let bits = |t: &[(String, Tensor)]| -> Vec<u64> {
            t[0].1.to_f64_vec().iter().map(|x| x.to_bits()).collect()
        };
        assert_eq!(bits(&run(&before, &ins)), bits(&run(&after, &ins)), "{case}");
    }
}

/// A max pool of a positive scaling (a dequantized activation's scale) takes
/// the scaling after it, and the values stay bit for bit (negative values,
/// zeros of both signs, infinities, NaN and the padding included); a negative
/// scale is left alone.
#[test]
fn a_scale_moved_out_of_a_max_pool_keeps_the_values() {
    for (scale, moved) in [("0.0006204194", 1), ("3.5", 1), ("-0.5", 0)] {
        let text = format!(
            "graph {{
  sym h param 1..
  sym w param 1..
  input %x: f32[1, h, w, 4]
  %s: f32[1, 1, 1, 1] = constant [{scale}]
  %sb: f32[1, h, w, 4] = broadcast %s
  %d: f32[1, h, w, 4] = mul %x, %sb
  %y: f32[1, (h-1)/2+1, (w-1)/2+1, 4] = max_pool[kernel=[3, 3], strides=[2, 2], dilations=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], channels_last=true] %d
  output %y
}}
"
        );
        let before = ir::parse_graph(&text, &|_| None).unwrap_or_else(|e| panic!("{e}"));
        let mut after = before.clone();
        let report = Pipeline::standard().verify(true).run(&mut after).expect("pipeline");
        assert_eq!(report.rewrites("scale-out-of-max-pool"), moved, "scale {scale}: {report:?}");
        let mut state = 11u32;
        let special = [0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-40, -3e38];
        for (h, w) in [(1usize, 1usize), (2, 7), (5, 5), (13, 8)] {
            let x: Vec<f32> = (0..h * w * 4)
                .map(|i| {
                    state = state.wrapping_mul(1_103_515_245).wrapping_add(12345);
                    match (state >> 16) % 9 {
                        0 => special[i % special.len()],
                        r => ((state >> 8) % 512) as f32 - 256.0 + r as f32 * 0.125,
                    }
                })
                .collect();
            let ins = vec![("x".to_string(), Tensor::new(vec![1, h, w, 4], Elems::F32(x)).unwrap())];
            let (b, a) = (run(&before, &ins), run(&after, &ins));
            let bits = |t: &[(String, Tensor)]| match t[0].1.elems() {
                Elems::F32(v) => {
                    v.iter().map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() }).collect::<Vec<_>>()
                }
                _ => panic!("f32 output"),
            };
            assert_eq!(bits(&b), bits(&a), "scale {scale}, {h}x{w}");
        }
    }
}
