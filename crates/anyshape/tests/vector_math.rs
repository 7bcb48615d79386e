//! The generated vector math (`exp`, `tanh`, `erf`, `sigmoid`: inline
//! polynomials) over the whole float range against the reference interpreter
//! (f64 math rounded to f32): every 4099th bit pattern of each sign, from the
//! smallest subnormal to +inf, plus ±0, ±inf and NaN, through both the vector
//! body and the scalar tail (the count is not a multiple of the lanes). Prints
//! the largest error in ulps, with where it occurs (run with `--nocapture`), and
//! fails past the bounds below. Errors are measured where the true result is a
//! normal float; in the subnormal range (results below 1.2e-38) the absolute
//! error is checked instead, and no function may give a subnormal for a
//! normal input (0 instead). Compiled for the host and, on an AVX-512 host, for
//! AVX2 too: `exp` scales by `2^n` with `vscalefps` on AVX-512 and in two
//! integer-built steps on AVX2, and both must meet the bounds.

use anyshape::{CompileOptions, Elems, Isa, LoadOptions, Model, Tensor};

const GRAPH: &str = r#"graph {
  sym n param 1..4000000
  input %x: f32[n]
  %e: f32[n] = exp %x
  %t: f32[n] = tanh %x
  %r: f32[n] = erf %x
  %s: f32[n] = sigmoid %x
  output %e, %t, %r, %s
}
"#;

/// Largest error allowed, in ulps, per function (output order).
const BOUNDS: [(&str, u64); 4] = [("exp", 4), ("tanh", 8), ("erf", 16), ("sigmoid", 8)];

/// Position of `x` on the line of floats (adjacent floats differ by 1).
fn ordered(x: f32) -> i64 {
    let b = x.to_bits() as i32;
    i64::from(if b < 0 { i32::MIN - b } else { b })
}

fn ulps(got: f32, want: f32) -> u64 {
    if got.is_nan() || want.is_nan() {
        return if got.is_nan() && want.is_nan() { 0 } else { u64::MAX };
    }
    (ordered(got) - ordered(want)).unsigned_abs()
}

#[test]
fn vector_math_over_the_whole_float_range() {
    let mut xs: Vec<f32> =
        vec![0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-3, -1e-3, 0.5, -0.5];
    let mut bits = 1u32;
    while bits < 0x7f80_0000 {
        let x = f32::from_bits(bits);
        xs.push(x);
        xs.push(-x);
        bits += 4099;
    }
    // Densely where `exp` and `sigmoid` leave the normal floats (e^-87.3365).
    xs.extend((0..12_000).map(|i| -88.0 + i as f32 * 1e-4));
    let edge = (-87.336_54f32).to_bits(); // ln(FLT_MIN), give or take an ulp
    xs.extend((0..64).map(|d| f32::from_bits(edge - 32 + d)));
    xs.push(1.0); // an odd count: the last values run in the scalar tail
    let g = ir::parse_graph(GRAPH, &|_| None).expect("graph");
    let model = Model::from_ir(g, &LoadOptions::new()).expect("model");
    let input = Tensor::new(vec![xs.len()], Elems::F32(xs.clone())).expect("tensor");
    let want = model.interpret(&[("x", input.clone())]).expect("interpreter");
    let host = kernels::Target::detect();
    let mut isas = vec![("host", Isa::Host)];
    if host.isa.avx512f && host.avx2_only().is_some() {
        isas.push(("avx2", Isa::Avx2));
    }
    let mut failures = Vec::new();
    for (isa, which) in isas {
        let cm = model.compile(&CompileOptions::new().threads(1).isa(which)).expect("compile");
        let got = cm.run(&[("x", input.clone())]).expect("compiled");
        check(isa, &xs, &got, &want, &mut failures);
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// Each function's largest error over `xs` (outputs in `BOUNDS`' order) against
/// the interpreter's, printed, and a failure where it passes the bound.
fn check(
    isa: &str,
    xs: &[f32],
    got: &[(String, Tensor)],
    want: &[(String, Tensor)],
    failures: &mut Vec<String>,
) {
    for (k, (name, bound)) in BOUNDS.iter().enumerate() {
        let (Elems::F32(g), Elems::F32(w)) = (got[k].1.elems(), want[k].1.elems()) else {
            panic!("{name}: not f32")
        };
        let (mut worst, mut at) = (0u64, 0.0f32);
        for ((x, a), b) in xs.iter().zip(g).zip(w) {
            let err = if b.abs() < f32::MIN_POSITIVE && !b.is_nan() {
                // Subnormal (or zero) true results: within a few smallest normals.
                if (a - b).abs() <= 4.0 * f32::MIN_POSITIVE {
                    0
                } else {
                    u64::MAX
                }
            } else {
                ulps(*a, *b)
            };
            if err > worst {
                (worst, at) = (err, *x);
            }
        }
        println!("{isa:<4} {name:<8} max error {worst} ulp (at x = {at:e}) over {} inputs", xs.len());
        // No subnormal from a normal input: Intel cores take a microcode assist
        // for every subnormal an instruction makes or reads, which made a causal
        // softmax (half its logits masked) several times slower.
        let subnormal = |v: f32| v != 0.0 && v.abs() < f32::MIN_POSITIVE;
        if let Some((x, a)) = xs.iter().zip(g).find(|(x, a)| !subnormal(**x) && subnormal(**a)) {
            failures.push(format!("{isa} {name}: a subnormal {a:e} at x = {x:e}"));
        }
        if worst > *bound {
            failures.push(format!("{isa} {name}: {worst} ulp at x = {at:e} (bound {bound})"));
        }
    }
}
