//! Whole models through the GPU backend on the host emulator (and through
//! the driver where this machine has a GPU)
//! (`Model::compile_host_gpu`: every loop program as the NVPTX kernel a GPU
//! runs, the runtime's `GpuModel` planning each shape, uploading, launching
//! and downloading) against the interpreter, with the rewrites on, at shapes
//! of 1, primes and one past a warp, call after call; and the errors: a
//! step the GPU does not run yet, a bad index found by a kernel, a shape
//! that breaks the model's rule.

#![cfg(feature = "gpu")]

mod common;

use anyshape::{Elems, LoadOptions, Model, Tensor};
use common::{shape_at, Lcg};

fn model(text: &str) -> Model {
    let g = ir::parse_graph(text, &|_| None).unwrap_or_else(|e| panic!("{e}"));
    Model::from_ir(g, &LoadOptions::new()).unwrap_or_else(|e| panic!("{e}"))
}

fn inputs(m: &Model, dims: &[(&str, usize)], seed: u64) -> Vec<(String, Tensor)> {
    let mut rng = Lcg::new(seed);
    m.inputs()
        .into_iter()
        .map(|info| {
            let shape = shape_at(&info.ty, dims);
            let n: usize = shape.iter().product();
            let elems = match info.ty.dtype {
                anyshape::DType::I64 => Elems::I64((0..n).map(|_| (rng.next() % 10) as i64 - 5).collect()),
                _ => Elems::F32((0..n).map(|_| rng.unit()).collect()),
            };
            (info.name, Tensor::new(shape, elems).expect("tensor"))
        })
        .collect()
}

fn compare<D: anyshape::gpu::Device>(
    m: &Model,
    gm: &anyshape::gpu::GpuModel<D>,
    dims: &[(&str, usize)],
    seed: u64,
) {
    compare_within(m, gm, dims, seed, None)
}

/// Whether a GEMM kernel reads an f32 A in place (GEMV, SIMT and the
/// covers); the tensor-core tiles take a bf16 copy.
fn reads_a_in_place(kernel: &str) -> bool {
    ["gemm_gemv_", "gemm_simt_", "gemm_ua_"].iter().any(|p| kernel.starts_with(p))
}

/// The copies of A each step of `used` (`gemms_at`'s) launches: one where a
/// kernel of it takes a bf16 copy.
fn a_copies(used: &[(usize, Vec<String>)]) -> Vec<usize> {
    used.iter().map(|(_, ks)| usize::from(ks.iter().any(|k| !reads_a_in_place(k)))).collect()
}

/// Relative L2 error of `got` against `want`.
fn rel_l2(got: &[f64], want: &[f64]) -> f64 {
    let num: f64 = got.iter().zip(want).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f64 = want.iter().map(|y| y * y).sum();
    (num / den.max(1e-30)).sqrt()
}

/// As `compare`, each output within relative L2 error `l2` when given (bf16
/// contractions), else element by element within f32's sums in another order.
fn compare_within<D: anyshape::gpu::Device>(
    m: &Model,
    gm: &anyshape::gpu::GpuModel<D>,
    dims: &[(&str, usize)],
    seed: u64,
    l2: Option<f64>,
) {
    let ins = inputs(m, dims, seed);
    let named: Vec<(&str, Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let want = m.interpret(&named).unwrap_or_else(|e| panic!("{dims:?}: interpreter: {e}"));
    let got = gm.run(&named).unwrap_or_else(|e| panic!("{dims:?}: gpu: {e}"));
    assert_eq!(got.len(), want.len());
    for ((name, g), (wname, w)) in got.iter().zip(&want) {
        assert_eq!(name, wname);
        assert_eq!(g.shape(), w.shape(), "{dims:?}: {name}");
        if let Some(bound) = l2 {
            let err = rel_l2(&g.to_f64_vec(), &w.to_f64_vec());
            assert!(err < bound, "{dims:?}: {name}: relative L2 error {err:e} (bound {bound:e})");
            continue;
        }
        for (i, (a, b)) in g.to_f64_vec().iter().zip(w.to_f64_vec()).enumerate() {
            let ok = (a - b).abs() <= 1e-4 * (1.0 + b.abs()) || (a.is_nan() && b.is_nan());
            assert!(ok, "{dims:?}: {name}[{i}] = {a}, the interpreter says {b}");
        }
    }
}

/// A transformer block's memory-bound half: embedding gather plus positions,
/// layer norm, GELU (erf), a masked softmax over the last axis, a residual.
const BLOCK: &str = r#"graph {
  sym b param 1..
  sym s param 1..
  input %ids: i64[b, s]
  input %x: f32[b, s, 16]
  input %mask: f32[b, s]
  %table: f32[5, 16] = constant [0.1, -0.2, 0.3, 0.4, -0.5, 0.6, 0.7, -0.8, 0.9, 1.0, -1.1, 1.2, 1.3, -1.4, 1.5, 1.6, 0.2, 0.1, -0.3, 0.5, 0.2, -0.6, 0.1, 0.9, -0.2, 0.3, 0.3, -0.4, 0.8, 0.1, 0.0, 0.4, -1.0, 0.5, 0.2, 0.3, -0.6, 0.7, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, -0.9, 0.8, 0.7, -0.6, 0.5, 0.4, 0.3, -0.2, 0.1, 0.0, -0.1, 0.2, 0.3, 0.4, -0.5, 0.6, 0.7, 0.8, -0.9, 1.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3]
  %emb: f32[b, s, 16] = gather[axis=0] %table, %ids
  %h: f32[b, s, 16] = add %emb, %x
  %mean: f32[b, s, 1] = reduce_mean[axes=[2], keep_dims=true] %h
  %meanb: f32[b, s, 16] = broadcast %mean
  %dev: f32[b, s, 16] = sub %h, %meanb
  %sq: f32[b, s, 16] = mul %dev, %dev
  %var: f32[b, s, 1] = reduce_mean[axes=[2], keep_dims=true] %sq
  %eps: f32[] = constant 0.00001
  %eps3: f32[1, 1, 1] = reshape %eps
  %epsb: f32[b, s, 1] = broadcast %eps3
  %ve: f32[b, s, 1] = add %var, %epsb
  %rs: f32[b, s, 1] = sqrt %ve
  %rsb: f32[b, s, 16] = broadcast %rs
  %ln: f32[b, s, 16] = div %dev, %rsb
  %g: f32[b, s, 16] = erf %ln
  %res: f32[b, s, 16] = add %g, %h
  %m3: f32[b, 1, s] = reshape %mask
  %scores: f32[b, s, s] = broadcast %m3
  %mx: f32[b, s, 1] = reduce_max[axes=[2], keep_dims=true] %scores
  %mxb: f32[b, s, s] = broadcast %mx
  %sh: f32[b, s, s] = sub %scores, %mxb
  %ex: f32[b, s, s] = exp %sh
  %sm: f32[b, s, 1] = reduce_sum[axes=[2], keep_dims=true] %ex
  %smb: f32[b, s, s] = broadcast %sm
  %p: f32[b, s, s] = div %ex, %smb
  output %res, %p
}
"#;

#[test]
fn a_memory_bound_block_runs_through_the_gpu_backend() {
    let m = model(BLOCK);
    let gm = m.compile_host_gpu().expect("compiles for the GPU");
    // Call after call at new and repeated shapes: a smaller shape reuses the
    // device memory a larger one grew, and each signature is planned once.
    let shapes = [(1, 1), (2, 7), (1, 33), (3, 32), (2, 7), (1, 65), (1, 1)];
    for (i, (b, s)) in shapes.into_iter().enumerate() {
        compare(&m, &gm, &[("b", b), ("s", s)], i as u64);
    }
    assert_eq!(gm.shapes_planned(), 5);
    let live = gm.device().bytes_live();
    compare(&m, &gm, &[("b", 2), ("s", 7)], 99);
    assert_eq!(gm.device().bytes_live(), live, "a call at a planned shape allocated device memory");
}

/// Callers at once: each call takes a stream and device memory of its own
/// (kept for later calls), so concurrent calls at different shapes each get
/// their own outputs.
#[test]
fn concurrent_calls_each_take_their_own_stream() {
    let m = model(BLOCK);
    let gm = m.compile_host_gpu().expect("compiles");
    let start = std::sync::Barrier::new(3);
    std::thread::scope(|s| {
        for t in 0..3usize {
            let (m, gm, start) = (&m, &gm, &start);
            s.spawn(move || {
                start.wait();
                for i in 0..4 {
                    compare(m, gm, &[("b", 1 + t), ("s", 5 + 7 * i + t)], (10 * t + i) as u64);
                }
            });
        }
    });
    let streams = gm.device().streams();
    eprintln!("{streams} streams for 3 callers");
    assert!((1..=3).contains(&streams), "{streams} streams");
}

/// A gather index out of range is found by the kernel and reported with the
/// model's message; the model stays usable (the next call at the shape
/// clears the status word the bad one left).
#[test]
fn a_bad_index_is_an_error_and_the_model_stays_usable() {
    let m = model(BLOCK);
    let gm = m.compile_host_gpu().expect("compiles");
    compare(&m, &gm, &[("b", 1), ("s", 3)], 3);
    let mut ins = inputs(&m, &[("b", 1), ("s", 3)], 1);
    ins[0].1 = Tensor::new(vec![1, 3], Elems::I64(vec![0, 7, 1])).expect("ids");
    let named: Vec<(&str, Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let e = gm.run(&named).expect_err("index 7 of 5 rows").to_string();
    assert!(e.contains("index") || e.contains("range"), "{e}");
    compare(&m, &gm, &[("b", 1), ("s", 3)], 2);
    compare(&m, &gm, &[("b", 1), ("s", 3)], 4);
}

/// Out of device memory (the emulator given a device's size): the error names
/// the bytes and the inputs' shapes, and the model stays usable at a shape
/// that fits.
#[test]
fn out_of_device_memory_names_the_shape_and_the_model_stays_usable() {
    let m = model(BLOCK);
    let gm = m.compile_host_gpu().expect("compiles");
    compare(&m, &gm, &[("b", 1), ("s", 8)], 1);
    gm.device().set_memory(gm.device().bytes_live() + (64 << 10));
    let ins = inputs(&m, &[("b", 8), ("s", 300)], 2);
    let named: Vec<(&str, Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let e = gm.run(&named).expect_err("past the device's memory").to_string();
    assert!(e.contains("out of device memory") && e.contains("bytes") && e.contains("[8, 300]"), "{e}");
    compare(&m, &gm, &[("b", 1), ("s", 8)], 3);
}

/// A shape that breaks the model's rules is the binding's error, as on the CPU.
#[test]
fn a_shape_that_breaks_a_rule_is_an_error() {
    let m = model(BLOCK);
    let gm = m.compile_host_gpu().expect("compiles");
    let mut ins = inputs(&m, &[("b", 1), ("s", 3)], 1);
    ins[2].1 = Tensor::new(vec![1, 4], Elems::F32(vec![0.0; 4])).expect("mask");
    let named: Vec<(&str, Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let e = gm.run(&named).expect_err("mask of 4 for s = 3").to_string();
    assert!(e.contains("mask"), "{e}");
}

/// bf16 operands with f32 accumulation: each product rounds both factors by
/// at most 2⁻⁸ relative, so a sum of K terms of random sign is off by about
/// 2⁻⁷·|term|·√K against a result about |term|·√K large: relative L2 near
/// 0.4%; 1% leaves room for the epilogue and a second product.
const BF16_L2: f64 = 1e-2;

/// Contraction steps run on the GEMM family (`Model::lower_gpu`), with their
/// epilogues: a bias, tanh, a residual, a batched product of two activations
/// (attention's scores, B copied K-major).
#[test]
fn contraction_steps_run_on_the_gemm_family() {
    let m = model(
        r#"graph {
  sym n param 1..
  sym s param 1..
  input %a: f32[n, 40]
  input %w: f32[40, 33]
  input %bias: f32[33]
  input %q: f32[2, s, 8]
  input %k: f32[2, 8, s]
  %c: f32[n, 33] = matmul %a, %w
  %b2: f32[1, 33] = reshape %bias
  %bb: f32[n, 33] = broadcast %b2
  %cb: f32[n, 33] = add %c, %bb
  %t: f32[n, 33] = tanh %cb
  %r: f32[n, 33] = add %t, %c
  %sc: f32[2, s, s] = matmul %q, %k
  output %r, %sc
}
"#,
    );
    let gm = m.compile_host_gpu().expect("compiles for the GPU");
    for (i, (n, s)) in [(1usize, 1usize), (7, 5), (33, 32), (2, 65), (65, 3)].into_iter().enumerate() {
        compare_within(&m, &gm, &[("n", n), ("s", s)], i as u64, Some(BF16_L2));
    }
    // One row takes a GEMV kernel, the weight's 65 rows an mma.sync tile (the
    // wave model's pick; the scores' 5 rows a GEMV by fixed bounds); K = 8 of
    // the scores is aligned, so no cover.
    let ins = inputs(&m, &[("n", 1), ("s", 5)], 9);
    let named: Vec<(&str, Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let used = gm.gemms_at(&named).expect("plans");
    assert!(used.iter().any(|(_, k)| k[0].starts_with("gemm_gemv_bf16_nt_1x")), "{used:?}");
    let ins = inputs(&m, &[("n", 65), ("s", 5)], 9);
    let named: Vec<(&str, Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let used = gm.gemms_at(&named).expect("plans");
    assert!(used.iter().any(|(_, k)| k[0].starts_with("gemm_bf16_nt_")), "{used:?}");
    assert!(used.iter().all(|(_, k)| k.iter().all(|k| k.contains("_c32"))), "{used:?}");
}

/// A contraction's f32 A is read in place (no copy launch) by the GEMV and
/// SIMT kernels and the covers, whatever its row stride: a dense input by
/// GEMV, a slice of one starting a column in (rows 41 apart) by the covers;
/// the tensor-core tiles take a bf16 copy. An activation B (every B here)
/// is still copied K-major. Against the interpreter at one row, primes, one past a tile.
#[test]
fn f32_a_is_read_in_place_by_gemv_and_copied_for_tiles() {
    let m = model(
        r#"graph {
  sym n param 1..
  input %a: f32[n, 40]
  input %x: f32[n, 41]
  input %w: f32[40, 33]
  input %v: f32[40, n]
  %c: f32[n, 33] = matmul %a, %w
  %xs: f32[n, 40] = slice[1: 1 step 1] %x
  %d: f32[n, 33] = matmul %xs, %w
  %e: f32[n, n] = matmul %a, %v
  output %c, %d, %e
}
"#,
    );
    let gm = m.compile_host_gpu().expect("compiles for the GPU");
    for (i, n) in [1usize, 7, 17, 65].into_iter().enumerate() {
        compare_within(&m, &gm, &[("n", n)], i as u64, Some(BF16_L2));
        let ins = inputs(&m, &[("n", n)], 9);
        let named: Vec<(&str, Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let used = gm.gemms_at(&named).expect("plans");
        assert_eq!(used.len(), 3, "{used:?}");
        for (_, ks) in &used {
            assert!(
                ks.iter().all(|k| k.contains("_c32") && k.contains("_a32") == reads_a_in_place(k)),
                "{used:?}"
            );
        }
        let copies = gm.copies_at(&named).expect("plans");
        // One copy a step, its activation B's, and A's where a tile takes it.
        let want: Vec<usize> = a_copies(&used).iter().map(|a| 1 + a).collect();
        assert_eq!(copies.iter().map(|(_, c)| *c).collect::<Vec<_>>(), want, "n = {n}: {used:?}");
        // The slice's rows (41 apart, starting a column in) are copied for a
        // tile, or read in place by a cover where GEMV (which needs aligned
        // rows) would run.
        let sliced = &used[1].1[0];
        assert!(
            sliced.starts_with("gemm_ua_") || sliced.starts_with("gemm_simt_") || !reads_a_in_place(sliced),
            "n = {n}: {used:?}"
        );
    }
}

/// A loop program whose output a contraction reads as A also stores it in
/// bf16 (`lower::bf16_operands`), and the tensor-core tiles read that copy
/// in place: no copy launch of A. Its f32 output stays for its other reader
/// (here a product with itself). A slice of such an output four columns in
/// (rows 68 apart: not 16-byte aligned in bf16) is copied for a tile as
/// before. Against the interpreter at one row, primes, one past a tile.
#[test]
fn a_producers_bf16_copy_is_read_by_the_tiles() {
    let m = model(
        r#"graph {
  sym n param 1..
  input %x: f32[n, 64]
  input %w: f32[64, 48]
  input %x2: f32[n, 68]
  %t: f32[n, 64] = tanh %x
  %c: f32[n, 48] = matmul %t, %w
  %sq: f32[n, 64] = mul %t, %t
  %t2: f32[n, 68] = tanh %x2
  %ts: f32[n, 64] = slice[1: 4 step 1] %t2
  %d: f32[n, 48] = matmul %ts, %w
  output %c, %sq, %d
}
"#,
    );
    let gm = m.compile_host_gpu().expect("compiles for the GPU");
    let text = plan::print_plan(gm.plan());
    assert_eq!(text.matches("(as bf16 in b").count(), 2, "{text}");
    assert!(text.contains("bf16["), "{text}");
    for (i, n) in [1usize, 7, 17, 65, 129].into_iter().enumerate() {
        compare_within(&m, &gm, &[("n", n)], i as u64, Some(BF16_L2));
        let ins = inputs(&m, &[("n", n)], 9);
        let named: Vec<(&str, Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let used = gm.gemms_at(&named).expect("plans");
        let copies = gm.copies_at(&named).expect("plans");
        assert_eq!(used.len(), 2, "{used:?}");
        let a = a_copies(&used);
        // B (an input) is copied K-major; A only for the misaligned slice's tile.
        assert_eq!(copies[0].1, 1, "n = {n}: {used:?} {copies:?}");
        assert_eq!(copies[1].1, 1 + a[1], "n = {n}: {used:?} {copies:?}");
        if n >= 65 {
            assert_eq!((a[0], a[1]), (1, 1), "n = {n}: tiles take both: {used:?}");
        }
    }
}

/// An activation B whose K is adjacent (attention's keys, `q · kᵀ`) is read
/// in place as f32 by the GEMV kernels at up to 8 rows (a decode step: no
/// copy of the whole cache); a misaligned one (a slice a column in, rows 66
/// apart), more rows and an N-major B (its values, `p · v`) go through the
/// bf16 copy. Against the interpreter at one row, a prime, the GEMV's last
/// and one past it, keys 1, 7 and 67.
#[test]
fn an_f32_b_is_read_in_place_at_few_rows() {
    let m = model(
        r#"graph {
  sym m param 1..
  sym t param 1..
  input %q: f32[3, m, 64]
  input %kc: f32[3, t, 64]
  input %kw: f32[3, t, 66]
  %kt: f32[3, 64, t] = transpose[perm=[0, 2, 1]] %kc
  %s: f32[3, m, t] = matmul %q, %kt
  %ks: f32[3, t, 64] = slice[2: 1 step 1] %kw
  %kst: f32[3, 64, t] = transpose[perm=[0, 2, 1]] %ks
  %s2: f32[3, m, t] = matmul %q, %kst
  input %p: f32[3, m, t]
  input %v: f32[3, t, 64]
  %o: f32[3, m, 64] = matmul %p, %v
  output %s, %s2, %o
}
"#,
    );
    let gm = m.compile_host_gpu().expect("compiles for the GPU");
    for (i, (rows, keys)) in [(1usize, 7usize), (3, 67), (8, 1), (9, 7)].into_iter().enumerate() {
        compare_within(&m, &gm, &[("m", rows), ("t", keys)], i as u64, Some(BF16_L2));
        let ins = inputs(&m, &[("m", rows), ("t", keys)], 9);
        let named: Vec<(&str, Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let used = gm.gemms_at(&named).expect("plans");
        let copies = gm.copies_at(&named).expect("plans");
        assert_eq!((used.len(), copies.len()), (3, 3), "{used:?} {copies:?}");
        let in_place = rows <= 8;
        assert_eq!(used[0].1[0].contains("_b32"), in_place, "{rows} rows: {used:?}");
        // B's copies, and A's where a tile takes it.
        let a = a_copies(&used);
        assert_eq!(copies[0].1, usize::from(!in_place) + a[0], "{rows} rows: {copies:?}");
        assert!(!used[1].1[0].contains("_b32"), "{rows} rows, misaligned: {used:?}");
        assert_eq!(copies[1].1, 1 + a[1], "{rows} rows, misaligned: {copies:?}");
        assert_eq!(copies[2].1, 1 + a[2], "{rows} rows, values: {copies:?}");
    }
}

/// A model of graph `text` whose `constant @name` values are `consts`'
/// (name, shape, values).
fn with_constants(text: &str, consts: &[(&str, Vec<usize>, Vec<f32>)]) -> Model {
    let weights = |name: &str| {
        let (_, shape, v) = consts.iter().find(|(n, _, _)| *n == name)?;
        Some(std::sync::Arc::new(ir::ConstData::from_tensor(
            &Tensor::new(shape.clone(), Elems::F32(v.clone())).ok()?,
        )))
    };
    let g = ir::parse_graph(text, &weights).unwrap_or_else(|e| panic!("{e}"));
    Model::from_ir(g, &LoadOptions::new()).unwrap_or_else(|e| panic!("{e}"))
}

/// A weight of `rows`×`cols` values in [-0.5, 0.5) scaled by `scale`, and a
/// bias of `cols` values in [-1, 1).
fn weight_and_bias(rows: usize, cols: usize, scale: f32) -> (Vec<f32>, Vec<f32>) {
    let w = (0..rows * cols).map(|i| ((i * 7919 % 1013) as f32 - 506.0) / scale).collect();
    let b = (0..cols).map(|i| (i as f32 - (cols / 2) as f32) / cols as f32).collect();
    (w, b)
}

/// `tanh(x · W + b)` with a 256×256 weight and a bias (constants).
fn weight_model() -> Model {
    let (w, b) = weight_and_bias(256, 256, 4096.0);
    with_constants(
        r#"graph {
  sym n param 1..
  input %x: f32[n, 256]
  %w: f32[256, 256] = constant @w
  %b: f32[256] = constant @b
  %y: f32[n, 256] = matmul %x, %w
  %b2: f32[1, 256] = reshape %b
  %bb: f32[n, 256] = broadcast %b2
  %z: f32[n, 256] = add %y, %bb
  %g: f32[n, 256] = tanh %z
  output %g
}
"#,
        &[("w", vec![256, 256], w), ("b", vec![256], b)],
    )
}

/// A Hopper's kernels (`GpuTarget::Sm90a`) on the emulator: at 1600 rows a
/// 256×256 weight with a bias and tanh takes a wgmma tile (the wave model's
/// pick from the H200 profile) over a bf16 copy of the input, one row GEMV
/// reading it in place (no copy launch), and both match the interpreter.
#[test]
fn hopper_kernels_run_a_weights_product() {
    let m = weight_model();
    let gm = m.compile_host_gpu_for(anyshape::gpu::GpuTarget::Sm90a).expect("compiles for a Hopper");
    for (n, kernel) in [(1600usize, "gemm_wg"), (1, "gemm_gemv_")] {
        let ins = inputs(&m, &[("n", n)], n as u64);
        let named: Vec<(&str, Tensor)> = ins.iter().map(|(a, t)| (a.as_str(), t.clone())).collect();
        let used = gm.gemms_at(&named).expect("plans");
        assert!(used.iter().all(|(_, k)| k[0].starts_with(kernel)), "{n} rows: {used:?}");
        // The weight packed at load; the input copied for the tile only.
        let copies = gm.copies_at(&named).expect("plans");
        let want = usize::from(n > 1);
        assert!(copies.iter().all(|(_, c)| *c == want), "{n} rows: {copies:?}");
        compare_within(&m, &gm, &[("n", n)], n as u64, Some(BF16_L2));
    }
}

/// Tensors in device memory the caller owns (a framework's GPU tensors):
/// `run_device` reads the inputs and writes each output where it is given,
/// on the device, bit for bit what `run` returns through the host; an output
/// of the wrong shape or type, one missing, one the model lacks, or an input
/// of the wrong type is an error naming it, its tensor left untouched, and
/// the model goes on. Calls again on the same tensors (read and written in
/// place) and an output given over an input's memory give the same bytes.
#[test]
fn device_tensors_are_read_and_written_in_place() {
    use anyshape::gpu::{Device, DeviceTensor};
    let m = weight_model();
    let gm = m.compile_host_gpu().expect("compiles");
    let dev = gm.device();
    let bytes_of = |t: &Tensor| {
        // SAFETY: a tensor's elements are `numel · size` bytes at its pointer.
        unsafe { std::slice::from_raw_parts(ir::TensorData::as_ptr(t), t.numel() * t.dtype().size()) }
            .to_vec()
    };
    for n in [1usize, 7, 65] {
        let ins = inputs(&m, &[("n", n)], n as u64);
        let named: Vec<(&str, Tensor)> = ins.iter().map(|(a, t)| (a.as_str(), t.clone())).collect();
        let want = gm.run(&named).expect("runs");
        let mut dins = Vec::new();
        for (name, t) in &ins {
            let b = bytes_of(t);
            let p = dev.alloc(b.len()).expect("device memory");
            // SAFETY: `p` holds `b.len()` bytes of a live allocation.
            unsafe { dev.upload(0, p, &b).expect("uploads") };
            dins.push((name.as_str(), DeviceTensor { ptr: p, dtype: t.dtype(), shape: t.shape().to_vec() }));
        }
        let shapes = gm.output_shapes(&dins).expect("plans");
        assert_eq!(shapes.len(), want.len());
        let mut douts = Vec::new();
        for (name, dtype, shape) in &shapes {
            let t = DeviceTensor { ptr: 0, dtype: *dtype, shape: shape.clone() };
            let p = dev.alloc(t.bytes().unwrap()).expect("device memory");
            douts.push((name.as_str(), DeviceTensor { ptr: p, ..t }));
        }
        // SAFETY: every tensor was allocated on this device with its bytes; the
        // outputs are apart from each other and from the inputs.
        unsafe { gm.run_device(&dins, &douts) }.expect("runs on device tensors");
        for ((name, t), (wname, w)) in douts.iter().zip(&want) {
            assert_eq!(name, wname);
            let mut got = vec![0u8; t.bytes().unwrap()];
            // SAFETY: the output's bytes lie in its allocation.
            unsafe { dev.download(0, t.ptr, &mut got).expect("downloads") };
            assert_eq!(got, bytes_of(w), "{name} at n = {n}");
        }
        // Again on the same tensors: read and written in place from the
        // second call, the same bytes.
        for _ in 0..2 {
            // SAFETY: as above.
            unsafe { gm.run_device(&dins, &douts) }.expect("runs on device tensors");
        }
        for ((name, t), (_, w)) in douts.iter().zip(&want) {
            let mut got = vec![0u8; t.bytes().unwrap()];
            // SAFETY: the output's bytes lie in its allocation.
            unsafe { dev.download(0, t.ptr, &mut got).expect("downloads") };
            assert_eq!(got, bytes_of(w), "{name} at n = {n}, in place");
        }
        // An output given over an input's memory (an in-place update): the
        // input is read before the output is written, call after call.
        let (_, first_in) = ins.iter().find(|(_, t)| t.dtype() == ir::DType::F32).expect("an f32 input");
        let over =
            dev.alloc(bytes_of(first_in).len().max(douts[0].1.bytes().unwrap())).expect("device memory");
        let mut dins_over = dins.clone();
        let at =
            dins.iter().position(|(_, t)| t.shape == first_in.shape() && t.dtype == ir::DType::F32).unwrap();
        dins_over[at].1.ptr = over;
        let mut douts_over = douts.clone();
        douts_over[0].1.ptr = over;
        for _ in 0..2 {
            // SAFETY: `over` holds the input's bytes and the output's; the
            // input is uploaded again before each call.
            unsafe { dev.upload(0, over, &bytes_of(first_in)).expect("uploads") };
            unsafe { gm.run_device(&dins_over, &douts_over) }.expect("runs on device tensors");
            let mut got = vec![0u8; douts[0].1.bytes().unwrap()];
            // SAFETY: as above.
            unsafe { dev.download(0, over, &mut got).expect("downloads") };
            assert_eq!(got, bytes_of(&want[0].1), "{} over an input at n = {n}", douts[0].0);
        }
        // SAFETY: allocated above, freed once, no launch uses it now.
        unsafe { dev.free(over) };
        // Bad tensors: errors naming them, the outputs untouched.
        let poison = |t: &DeviceTensor| {
            let b = vec![0xA5u8; t.bytes().unwrap()];
            // SAFETY: as above.
            unsafe { dev.upload(0, t.ptr, &b).expect("uploads") };
            b
        };
        let kept = poison(&douts[0].1);
        let mut wrong = douts.clone();
        wrong[0].1.shape[0] += 1;
        // SAFETY: as above (the call refuses before writing).
        let e = unsafe { gm.run_device(&dins, &wrong) }.unwrap_err().to_string();
        assert!(e.contains(douts[0].0) && e.contains("is f32"), "{e}");
        let e = unsafe { gm.run_device(&dins, &douts[1..]) }.unwrap_err().to_string();
        assert!(e.contains(douts[0].0) && e.contains("given once"), "{e}");
        let mut extra = douts.clone();
        extra.push(("nonesuch", douts[0].1.clone()));
        let e = unsafe { gm.run_device(&dins, &extra) }.unwrap_err().to_string();
        assert!(e.contains("no output 'nonesuch'"), "{e}");
        let mut bad_in = dins.clone();
        bad_in[0].1.dtype = ir::DType::I64;
        let e = unsafe { gm.run_device(&bad_in, &douts) }.unwrap_err().to_string();
        assert!(e.contains(dins[0].0), "{e}");
        let mut got = vec![0u8; kept.len()];
        // SAFETY: as above.
        unsafe { dev.download(0, douts[0].1.ptr, &mut got).expect("downloads") };
        assert_eq!(got, kept, "a refused call wrote an output");
        assert_eq!(gm.run(&named).expect("still runs")[0].1, want[0].1);
        for (_, t) in dins.iter().chain(&douts) {
            // SAFETY: allocated above, freed once, no launch uses it now.
            unsafe { dev.free(t.ptr) };
        }
    }
}

/// A call's work at a shape is recorded once per caller's memory and
/// replayed: its first call launches the kernels one by one, its second
/// captures them as a graph, later ones run the graph; new input values
/// (the same shape) give the interpreter's outputs each time, a new shape
/// records anew (its first call no graph), and shapes alternate without
/// mixing their recordings.
#[test]
fn a_shapes_launches_are_recorded_and_replayed_as_a_graph() {
    let m = weight_model();
    let gm = m.compile_host_gpu().expect("compiles");
    let graphs = || gm.device().graph_launches();
    for (call, n) in [66usize, 66, 66].into_iter().enumerate() {
        compare_within(&m, &gm, &[("n", n)], call as u64, Some(BF16_L2));
    }
    assert_eq!(graphs(), 2, "calls 2 and 3 at 66 rows run the graph");
    compare_within(&m, &gm, &[("n", 1)], 7, Some(BF16_L2));
    assert_eq!(graphs(), 2, "a new shape's first call launches one by one");
    for (call, n) in [66usize, 1, 66, 1].into_iter().enumerate() {
        compare_within(&m, &gm, &[("n", n)], 10 + call as u64, Some(BF16_L2));
    }
    assert_eq!(graphs(), 6);
    // The memory grows for a much larger shape: what was recorded in the old
    // is dropped.
    compare_within(&m, &gm, &[("n", 400)], 20, Some(BF16_L2));
    assert_eq!(graphs(), 6, "a new shape after a repeated one launches one by one");
    compare_within(&m, &gm, &[("n", 66)], 21, Some(BF16_L2));
    assert_eq!(graphs(), 7, "66 rows recorded anew in the new memory, a graph at once after a new shape");
}

/// Whether the GEMM kernels `gm` launches are the same at every `n` of `rows`.
fn one_gemm_kernel(
    m: &Model,
    gm: &anyshape::gpu::GpuModel<anyshape::gpu::HostDevice>,
    rows: &[usize],
) -> bool {
    let kernels = |n: usize| {
        let ins = inputs(m, &[("n", n)], 0);
        let named: Vec<(&str, Tensor)> = ins.iter().map(|(a, t)| (a.as_str(), t.clone())).collect();
        gm.gemms_at(&named).expect("plans")
    };
    rows.iter().all(|&n| kernels(n) == kernels(rows[0]))
}

/// A new shape right after another (a decoder's steps, each at a longer
/// cache) runs as a graph from its first call: the second such shape
/// captures one, each later one updates it in place (the same kernels in
/// the same order, new grids and arguments), every call the interpreter's
/// outputs; a shape met before still replays its own recording.
#[test]
fn new_shapes_in_a_row_update_one_graph_in_place() {
    let m = weight_model();
    let gm = m.compile_host_gpu().expect("compiles");
    let dev = gm.device();
    // Memory for the largest shape first, so that none of the rest moves it.
    compare_within(&m, &gm, &[("n", 64)], 0, Some(BF16_L2));
    compare_within(&m, &gm, &[("n", 64)], 1, Some(BF16_L2));
    // Seven, so that 64 rows' recording stays (a slot keeps eight shapes').
    let rows: Vec<usize> = (9..=15).collect();
    assert!(one_gemm_kernel(&m, &gm, &rows), "one GEMM kernel for these rows");
    let (graphs, updates) = (dev.graph_launches(), dev.graph_updates());
    for (i, &n) in rows.iter().enumerate() {
        compare_within(&m, &gm, &[("n", n)], 10 + i as u64, Some(BF16_L2));
        // The first new shape after a repeated one launches one by one.
        assert_eq!(dev.graph_launches() - graphs, i, "{n} rows");
        assert_eq!(dev.graph_updates() - updates, i.saturating_sub(1), "{n} rows");
    }
    // 64 rows again: its own recording and graph, nothing updated.
    let (graphs, updates) = (dev.graph_launches(), dev.graph_updates());
    compare_within(&m, &gm, &[("n", 64)], 50, Some(BF16_L2));
    assert_eq!((dev.graph_launches(), dev.graph_updates()), (graphs + 1, updates));
    // A shape whose graph went to the next one (12 rows) is captured anew
    // on its second call, correct.
    compare_within(&m, &gm, &[("n", 12)], 51, Some(BF16_L2));
    compare_within(&m, &gm, &[("n", 12)], 52, Some(BF16_L2));
    assert_eq!((dev.graph_launches(), dev.graph_updates()), (graphs + 3, updates));
}

/// A caller keeps the recordings of eight shapes: a new shape after a
/// repeated one, where the oldest recording goes, takes that shape's graph
/// (updated in place) and runs it from its first call.
#[test]
fn a_new_shape_takes_the_graph_of_the_recording_it_replaces() {
    let m = weight_model();
    let gm = m.compile_host_gpu().expect("compiles");
    let dev = gm.device();
    let rows: Vec<usize> = (9..=18).collect();
    assert!(one_gemm_kernel(&m, &gm, &rows), "one GEMM kernel for these rows");
    // Memory for the largest first (and its graph), then seven more shapes,
    // the last called twice (the call before the ninth shape is no new one).
    compare_within(&m, &gm, &[("n", 18)], 0, Some(BF16_L2));
    compare_within(&m, &gm, &[("n", 18)], 1, Some(BF16_L2));
    for &n in &rows[..7] {
        compare_within(&m, &gm, &[("n", n)], n as u64, Some(BF16_L2));
    }
    compare_within(&m, &gm, &[("n", 15)], 99, Some(BF16_L2));
    let (graphs, updates) = (dev.graph_launches(), dev.graph_updates());
    // The ninth shape replaces 18 rows' recording and takes its graph.
    compare_within(&m, &gm, &[("n", 16)], 200, Some(BF16_L2));
    assert_eq!((dev.graph_launches(), dev.graph_updates()), (graphs + 1, updates + 1));
    // 18 rows again: recorded anew, after a new shape, whose graph it takes.
    compare_within(&m, &gm, &[("n", 18)], 201, Some(BF16_L2));
    assert_eq!((dev.graph_launches(), dev.graph_updates()), (graphs + 2, updates + 2));
}

/// Shapes that grow a step a call (a decoder's cache) move the call's memory
/// a logarithmic number of times (it grows by half at least), each call
/// correct; the recordings of the shapes before survive where it did not
/// move.
#[test]
fn growing_shapes_move_the_memory_rarely() {
    let m = weight_model();
    let gm = m.compile_host_gpu().expect("compiles");
    compare_within(&m, &gm, &[("n", 8)], 0, Some(BF16_L2));
    let before = gm.device().allocations();
    for n in 9..=16 {
        compare_within(&m, &gm, &[("n", n)], n as u64, Some(BF16_L2));
    }
    let moves = gm.device().allocations() - before;
    assert!((1..=3).contains(&moves), "8 growing shapes moved the memory {moves} times");
    // The memory it holds: the weight in bf16 and the bias (f32, read by the
    // epilogue), one call's memory for at least 16 rows in and out.
    let held = gm.device_memory();
    assert!(held.weights >= 2 * 256 * 256 && held.weights <= 2 * 256 * 256 + 4 * 256 + 64, "{held:?}");
    assert!(held.calls >= 2 * 16 * 256 * 4, "{held:?}");
    assert!(held.peak >= held.weights + held.calls, "{held:?}");
    // 15 rows was recorded in the memory 16 runs in (it did not move since):
    // its second and third calls run its graph.
    let graphs = gm.device().graph_launches();
    compare_within(&m, &gm, &[("n", 15)], 100, Some(BF16_L2));
    compare_within(&m, &gm, &[("n", 15)], 101, Some(BF16_L2));
    assert_eq!(gm.device().graph_launches(), graphs + 2, "calls 2 and 3 at 15 rows run its graph");
}

/// Outputs handed back (`GpuModel::recycle`) are what a later call's
/// outputs are downloaded into: the same memory, the interpreter's values.
#[test]
fn recycled_outputs_take_later_calls_outputs() {
    let m = weight_model();
    let gm = m.compile_host_gpu().expect("compiles");
    let call = |n: usize, seed: u64| {
        let ins = inputs(&m, &[("n", n)], seed);
        let named: Vec<(&str, Tensor)> = ins.iter().map(|(a, t)| (a.as_str(), t.clone())).collect();
        let got = gm.run(&named).expect("runs");
        let want = m.interpret(&named).expect("interprets");
        let err = rel_l2(&got[0].1.to_f64_vec(), &want[0].1.to_f64_vec());
        assert!(err < BF16_L2, "{n} rows: relative L2 error {err:e}");
        got
    };
    let at = |outs: &[(String, Tensor)]| match outs[0].1.elems() {
        Elems::F32(v) => v.as_ptr() as usize,
        e => panic!("{:?}", e.dtype()),
    };
    // 70 x 256 f32: large enough to keep.
    let first = call(70, 1);
    let before = at(&first);
    gm.recycle(first);
    let second = call(66, 2);
    assert_eq!(at(&second), before, "the handed-back buffer holds the next output");
    let third = call(70, 3);
    assert_ne!(at(&third), before, "taken once");
}

/// The instructions of a PTX kernel's body before its first
/// `griddepcontrol.wait` that touch memory (any but its parameters), or
/// `None` where it has none.
fn memory_before_wait(ptx: &str) -> Option<Vec<&str>> {
    let body = &ptx[ptx.find(".entry").expect("a kernel")..];
    let at = body.find("griddepcontrol.wait")?;
    Some(
        body[..at]
            .lines()
            .map(str::trim)
            .filter(|l| {
                ["ld.", "st.", "atom", "red.", "cp.", "bar.", "wgmma", "mbarrier", "ldmatrix"]
                    .iter()
                    .any(|p| l.starts_with(p))
                    && !l.starts_with("ld.param")
            })
            .collect(),
    )
}

/// A GPU artifact (`Model::gpu_artifact`: code for sm_90a and sm_80, the
/// plan, the weights) saved and loaded without the compiler: the same
/// kernels, cubins (ptxas from `ANYSHAPE_PTXAS`: every kernel of both
/// architectures assembled) and steps; the weight kept only as the GEMMs'
/// bf16 `[N, K]` (its f32 constant absent from the file); each
/// architecture's code run on the emulator (its kernels rebuilt from what the
/// artifact says each is) within the bf16 bound of the interpreter; a damaged
/// file is an error naming what is wrong; on a machine without a GPU,
/// opening it says so (the CLI's test does the same with the bundled BERT).
#[test]
fn a_gpu_artifact_round_trips() {
    let m = weight_model();
    let mut opts = anyshape::gpu::GpuArtifactOptions::new();
    let ptxas = std::env::var("ANYSHAPE_PTXAS").ok();
    if kernels::testing::require("ANYSHAPE_REQUIRE_PTXAS", ptxas.is_some(), "ptxas in ANYSHAPE_PTXAS") {
        opts = opts.ptxas(ptxas.clone().expect("ptxas"));
    }
    let a = m.gpu_artifact(&opts).expect("an artifact");
    let path = std::env::temp_dir().join(format!("anyshape-gpu-artifact-{}.anyshape", std::process::id()));
    a.save(&path).expect("saves");
    assert!(anyshape::gpu::is_gpu_artifact(&path) && !runtime::is_artifact(&path));
    let b = anyshape::gpu::GpuArtifact::load(&path).expect("loads");
    assert_eq!(b.archs(), ["sm_90a", "sm_80"]);
    for (x, y) in a.code.iter().zip(&b.code) {
        assert_eq!(x.kernels.len(), y.kernels.len());
        for ((x, rx), (y, ry)) in x.kernels.iter().zip(&y.kernels) {
            assert!(x.name == y.name && x.text == y.text && x.smem == y.smem && rx == ry, "{}", x.name);
            assert_eq!(x.cubin, y.cubin, "{}", x.name);
            if ptxas.is_some() {
                let cubin = y.cubin.as_deref().unwrap_or_else(|| panic!("{}: no cubin", y.name));
                assert_eq!(&cubin[..4], b"\x7fELF", "{}", y.name);
            }
        }
    }
    // The sm_90a code differs where a Hopper's GEMMs do.
    assert!(b.code[0].kernels.iter().zip(&b.code[1].kernels).any(|(x, y)| x.1 != y.1));
    // A Hopper's kernels are launched as programmatic dependents, each waiting
    // for the kernel before it as its first instruction; every GPU's in order.
    for (code, launch) in
        b.code.iter().zip([anyshape::gpu::KernelLaunch::Dependent, anyshape::gpu::KernelLaunch::Ordered])
    {
        for (k, _) in &code.kernels {
            assert_eq!(k.launch, launch, "{} {}", code.arch, k.name);
            let before = memory_before_wait(&k.text);
            match launch {
                anyshape::gpu::KernelLaunch::Dependent => {
                    assert_eq!(
                        before,
                        Some(vec![]),
                        "{} {}: memory touched before the wait",
                        code.arch,
                        k.name
                    )
                }
                anyshape::gpu::KernelLaunch::Ordered => assert_eq!(before, None, "{}", k.name),
            }
            assert_eq!(
                k.text.contains("griddepcontrol"),
                launch == anyshape::gpu::KernelLaunch::Dependent,
                "{}",
                k.name
            );
        }
    }
    let ordered = m
        .gpu_artifact(&anyshape::gpu::GpuArtifactOptions::new().ordered_launches(true))
        .expect("an artifact");
    assert!(
        ordered
            .code
            .iter()
            .flat_map(|c| &c.kernels)
            .all(|(k, _)| k.launch == anyshape::gpu::KernelLaunch::Ordered
                && !k.text.contains("griddepcontrol"))
    );
    // The 256 x 256 weight: bf16 for the GEMMs, no f32 copy in the file.
    assert_eq!(b.weights.len(), 1);
    assert_eq!(b.weights[0].bytes.len(), 2 * 256 * 256);
    assert_eq!(b.weights[0].bytes, a.weights[0].bytes);
    let w = b.plan.buffers.iter().find(|x| x.name == "w");
    assert!(
        w.is_some_and(|w| matches!(w.kind, plan::BufferKind::Packed)),
        "{:?}",
        b.plan.buffers.iter().map(|x| (&x.name, &x.kind)).collect::<Vec<_>>()
    );
    // The weights section's length, from the header.
    let file = std::fs::read(&path).expect("reads");
    let weights = u64::from_le_bytes(file[40..48].try_into().expect("a header"));
    assert!((2 * 256 * 256..4 * 256 * 256).contains(&weights), "{weights} bytes of weights");
    for arch in ["sm_90a", "sm_80"] {
        let gm = anyshape::gpu::host_model_of(b.clone(), Some(arch)).expect("runs on the emulator");
        for (i, n) in [1usize, 66].into_iter().enumerate() {
            compare_within(&m, &gm, &[("n", n)], i as u64, Some(BF16_L2));
        }
    }
    let e = anyshape::gpu::host_model_of(b.clone(), Some("sm_70")).err().expect("no such code").to_string();
    assert!(e.contains("no code for sm_70"), "{e}");
    // Only sm_80's code, no cubins: what a machine without ptxas writes.
    let c = m
        .gpu_artifact(&anyshape::gpu::GpuArtifactOptions::new().targets(&[anyshape::gpu::GpuTarget::Sm80]))
        .expect("an artifact");
    assert_eq!(c.archs(), ["sm_80"]);
    assert!(c.code[0].kernels.iter().all(|(k, _)| k.cubin.is_none()));
    match anyshape::gpu::GpuArtifact::load(&path).expect("loads").open(0) {
        Ok(_) => eprintln!("this machine has a GPU: the artifact opened"),
        Err(e) => {
            let e = e.to_string();
            assert!(e.contains("no NVIDIA driver") || e.contains("no CUDA device"), "{e}");
        }
    }
    // One byte of the code changed: the hash says so.
    let mut bytes = std::fs::read(&path).expect("reads");
    let at = bytes.len() / 3;
    bytes[at] ^= 1;
    std::fs::write(&path, &bytes).expect("writes");
    let e = anyshape::gpu::GpuArtifact::load(&path).expect_err("damaged").to_string();
    assert!(e.contains("corrupted"), "{e}");
    std::fs::write(&path, &bytes[..bytes.len() / 2]).expect("writes");
    let e = anyshape::gpu::GpuArtifact::load(&path).expect_err("truncated").to_string();
    assert!(e.contains("truncated"), "{e}");
    let _ = std::fs::remove_file(&path);
}

/// Through the driver where the machine has a GPU (the block against the
/// interpreter there, f32 loop kernels: the same tolerance); where it has
/// none, the error says so and the test says it skipped
/// (`ANYSHAPE_REQUIRE_GPU` makes that a failure: the device script sets it).
#[test]
fn the_driver_backend_runs_the_block_where_there_is_a_gpu() {
    let m = model(BLOCK);
    match m.compile_gpu(0) {
        Ok(gm) => {
            eprintln!("running on {}", anyshape::gpu::Device::name(gm.device()));
            for (i, (b, s)) in
                [(1usize, 1usize), (2, 7), (1, 33), (3, 32), (4, 129), (2, 7)].into_iter().enumerate()
            {
                compare(&m, &gm, &[("b", b), ("s", s)], i as u64);
            }
        }
        Err(e) => {
            let e = e.to_string();
            let none = e.contains("no NVIDIA driver") || e.contains("no CUDA device");
            assert!(none, "the GPU backend failed on a machine with a driver: {e}");
            kernels::testing::require("ANYSHAPE_REQUIRE_GPU", false, &format!("GPU ({e})"));
        }
    }
}

fn npy_files(dir: &std::path::Path) -> Vec<(String, std::path::PathBuf)> {
    let mut v: Vec<(String, std::path::PathBuf)> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "npy"))
        .map(|p| (p.file_stem().unwrap_or_default().to_string_lossy().into_owned(), p))
        .collect();
    v.sort();
    v
}

/// The shapes [`bundled_models_match_onnx_runtime_through_the_gpu_backend`]
/// runs fixture `name` at against the interpreter.
fn random_shapes(name: &str) -> Vec<Vec<(&'static str, usize)>> {
    let text = |b, s| vec![("batch", b), ("seq", s)];
    match name.rsplit('/').next() {
        Some("bert") => vec![text(1, 1), text(3, 11), text(5, 13), text(1, 64)],
        Some("gpt2") => vec![text(1, 1), text(3, 11), text(5, 13)],
        Some("vit") => vec![vec![("batch", 3)]],
        Some("resnet") => {
            vec![
                vec![("batch", 1), ("height", 29), ("width", 31)],
                vec![("batch", 2), ("height", 17), ("width", 8)],
            ]
        }
        Some("llama_step") => {
            let step = |b, s, past| vec![("batch", b), ("seq", s), ("past", past), ("total", past + s)];
            vec![step(1, 1, 0), step(2, 3, 13), step(1, 1, 65)]
        }
        _ => panic!("no shapes for {name}"),
    }
}

/// Fixture `name` at `dims`, inputs drawn at random (token ids inside every
/// fixture's vocabulary, masks of ones but a second row's last token, values
/// in [-2, 2)), through the GPU backend and the interpreter: each output
/// within [`MODEL_L2`]. Returns the inputs.
fn compare_fixture<D: anyshape::gpu::Device>(
    model: &Model,
    gm: &anyshape::gpu::GpuModel<D>,
    name: &str,
    dims: &[(&str, usize)],
) -> Vec<(String, Tensor)> {
    let mut rng = Lcg::new(dims.iter().map(|d| d.1 as u64).sum());
    let ins: Vec<(String, Tensor)> = model
        .inputs()
        .into_iter()
        .map(|info| {
            let shape = shape_at(&info.ty, dims);
            let n: usize = shape.iter().product();
            let elems = match (info.ty.dtype, info.name.as_str()) {
                (anyshape::DType::I64, "attention_mask") => {
                    let row = *shape.last().unwrap_or(&1);
                    // The second row's last token masked (a padded batch).
                    Elems::I64(
                        (0..n).map(|i| i64::from(!(i / row.max(1) == 1 && i % row == row - 1))).collect(),
                    )
                }
                (anyshape::DType::I64, "input_ids") => {
                    Elems::I64((0..n).map(|_| (rng.next() % 50 + 1) as i64).collect())
                }
                (anyshape::DType::I64, _) => Elems::I64(vec![0; n]),
                _ => Elems::F32((0..n).map(|_| rng.unit()).collect()),
            };
            (info.name, Tensor::new(shape, elems).expect("tensor"))
        })
        .collect();
    let named: Vec<(&str, Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let want = model.interpret(&named).unwrap_or_else(|e| panic!("{name} {dims:?}: interpreter: {e}"));
    let got = gm.run(&named).unwrap_or_else(|e| panic!("{name} {dims:?}: gpu: {e}"));
    assert_eq!(got.len(), want.len(), "{name} {dims:?}");
    for ((out, g), (_, w)) in got.iter().zip(&want) {
        assert_eq!(g.shape(), w.shape(), "{name} {dims:?}: {out}");
        let err = rel_l2(&g.to_f64_vec(), &w.to_f64_vec());
        eprintln!("{name} {dims:?}: {out} relative L2 error {err:.2e}");
        assert!(err < MODEL_L2, "{name} {dims:?}: {out} relative L2 error {err:e}");
    }
    ins
}

/// At one row, every product whose A is a row norm (`MatMulStep::a_norm`:
/// GPT-2's `ln_1`, `ln_2`) runs a normalizing GEMV
/// and its norm's step is not launched; past the 16 rows any GEMV takes,
/// every norm is.
fn check_norms_skipped<D: anyshape::gpu::Device>(
    gm: &anyshape::gpu::GpuModel<D>,
    name: &str,
    dims: &[(&str, usize)],
    ins: &[(String, Tensor)],
) {
    let named: Vec<(&str, Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let p = gm.plan();
    let norms: Vec<(usize, usize)> = p
        .steps
        .iter()
        .enumerate()
        .filter_map(|(i, st)| match &st.kind {
            plan::StepKind::MatMul(m) => m.a_norm.as_ref().map(|n| (i, n.step)),
            _ => None,
        })
        .collect();
    let rows = dims.iter().filter(|(d, _)| matches!(*d, "batch" | "seq")).map(|d| d.1).product::<usize>();
    let skipped = gm.skipped_at(&named).expect("plans");
    let used = gm.gemms_at(&named).expect("plans");
    if rows == 1 {
        assert!(norms.len() >= 4, "{name}: {norms:?}");
        for (product, norm) in &norms {
            let kernels = &used.iter().find(|(i, _)| i == product).expect("launched").1;
            assert!(kernels.iter().all(|k| k.contains("_ln") || k.contains("_rms")), "{name}: {kernels:?}");
            assert!(skipped.contains(norm), "{name} {dims:?}: step {norm} launched: {skipped:?}");
        }
        assert_eq!(skipped.len(), norms.len(), "{name} {dims:?}");
    } else if rows > 16 {
        assert!(skipped.is_empty(), "{name} {dims:?}: {skipped:?}");
    }
}

/// A whole model's outputs with bf16 contractions against f32 ones: each
/// layer's products are off by about [`BF16_L2`]'s 0.4% and the layers add
/// up (normalizations keep it from growing).
const MODEL_L2: f64 = 3e-2;

/// The bundled models (ONNX Runtime's outputs at the recorded shapes, and
/// the interpreter's at [`random_shapes`]) through the GPU backend on the
/// emulator: relative L2 error below [`MODEL_L2`] (bf16 contractions against
/// f32).
#[test]
fn bundled_models_match_onnx_runtime_through_the_gpu_backend() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests");
    // The Llama decoder's step: an empty and a filled KV cache (concatenated
    // onto), rotary positions, grouped-query attention.
    // Every recorded case (one row: GEMV; up to 8; more: the mma.sync tiles;
    // the taps of a convolution; an empty and a filled KV cache).
    let models =
        ["fixtures/resnet", "fixtures/vit", "fixtures/bert", "fixtures/gpt2", "fixtures-current/llama_step"];
    for name in models {
        let dir = root.join(name);
        let model = Model::load(dir.join("model.onnx"), &LoadOptions::new())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let gm = model.compile_host_gpu().unwrap_or_else(|e| panic!("{name}: {e}"));
        // Shapes no recorded case has, against the interpreter: one row and
        // one token, primes, one past a tile's rows (a product's M of 33 and 65:
        // past the 32- and 64-row tiles), images of prime sides, an empty and a
        // filled cache.
        for dims in random_shapes(name) {
            let start = std::time::Instant::now();
            let ins = compare_fixture(&model, &gm, name, &dims);
            if name.ends_with("gpt2") {
                check_norms_skipped(&gm, name, &dims, &ins);
            }
            eprintln!("{name} {dims:?}: {:.2} s", start.elapsed().as_secs_f64());
        }
        let mut cases: Vec<_> = std::fs::read_dir(&dir)
            .expect("fixture dir")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_dir())
            .collect();
        cases.sort();
        assert!(cases.len() >= 3, "{name}");
        for case in cases {
            let stem = case.file_name().unwrap_or_default().to_string_lossy().into_owned();
            let start = std::time::Instant::now();
            let inputs: Vec<(String, Tensor)> = npy_files(&case)
                .into_iter()
                .map(|(n, p)| (n, anyshape::npy::read(&p).expect("input npy")))
                .collect();
            let named: Vec<(&str, Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
            let got = gm.run(&named).unwrap_or_else(|e| panic!("{name}/{}: {e}", case.display()));
            if name.ends_with("bert") || name.ends_with("gpt2") {
                // Every contraction multiplies a packed weight; its f32 A is
                // read in place but by a tile, which reads the bf16 copy that
                // A's producer writes (a layer norm's), or A itself where its
                // producer stores only bf16 (the attention's output, FC1's).
                // So no copy launch of any A.
                let copies = gm.copies_at(&named).expect("plans");
                let used = gm.gemms_at(&named).expect("plans");
                let p = gm.plan();
                let bf16_a = |step: usize| match &p.steps[step].kind {
                    plan::StepKind::MatMul(m) => {
                        m.a_bf16.is_some() || p.buffers[m.a.buf].dtype == ir::DType::BF16
                    }
                    _ => false,
                };
                assert!(used.iter().all(|(i, _)| bf16_a(*i)), "{name}/{stem}: {used:?}");
                assert!(copies.iter().all(|(_, c)| *c == 0), "{name}/{stem}: {copies:?} {used:?}");
            }
            if name.ends_with("resnet") {
                // Implicit GEMM: a convolution over an image that its producer
                // stores in bf16 (a product whose output only products read,
                // or beside its f32 output: a residual sum's; its channels a
                // multiple of 8) reads its taps in place (a `_taps` kernel, no
                // copy launch). The stem's RGB image alone is copied as the
                // column matrix.
                let copies = gm.copies_at(&named).expect("plans");
                let used = gm.gemms_at(&named).expect("plans");
                let p = gm.plan();
                let image = |step: usize| match &p.steps[step].kind {
                    plan::StepKind::MatMul(m) if m.taps.is_some() => {
                        Some(m.a_bf16.is_some() || p.buffers[m.a.buf].dtype == ir::DType::BF16)
                    }
                    _ => None,
                };
                let (mut in_place, mut copied) = (0, 0);
                for (i, kernels) in &used {
                    match image(*i) {
                        Some(true) => {
                            assert!(
                                kernels.iter().all(|k| k.contains("_taps")),
                                "{name}/{stem}: step {i} {kernels:?}"
                            );
                            in_place += 1;
                        }
                        Some(false) => copied += 1,
                        None => {}
                    }
                }
                assert!(
                    in_place == 5 && copied == 1,
                    "{name}/{stem}: {in_place} in place, {copied} copied: {used:?}"
                );
                let launches: usize = copies.iter().map(|(_, c)| c).sum();
                assert_eq!(launches, copied, "{name}/{stem}: {copies:?} {used:?}");
            }
            for (out, path) in npy_files(&case.join("expected")) {
                let want = anyshape::npy::read(&path).expect("expected npy");
                let g = &got.iter().find(|(n, _)| *n == out).unwrap_or_else(|| panic!("{name}: no {out}")).1;
                assert_eq!(g.shape(), want.shape(), "{name}/{}: {out}", case.display());
                let err = rel_l2(&g.to_f64_vec(), &want.to_f64_vec());
                eprintln!("{name}/{}: {out} relative L2 error {err:.2e}", case.display());
                assert!(err < MODEL_L2, "{name}/{}: {out} relative L2 error {err:e}", case.display());
            }
            eprintln!("{name}/{}: {:.2} s", case.display(), start.elapsed().as_secs_f64());
        }
    }
}

/// Every kernel (loop programs, GEMMs) of every bundled model (both toolchains' exports:
/// BERT, GPT-2, ViT, ResNet, ALBERT, DistilBERT, the Llama decoder, ...)
/// compiles to PTX for the GPU (LLVM's NVPTX backend aborts the process on
/// what it cannot select, so this runs it on all of them), and with
/// `ANYSHAPE_PTXAS` ptxas assembles each for sm_90a without spills.
#[test]
fn every_bundled_model_compiles_to_ptx() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests");
    let mut dirs = Vec::new();
    for sub in ["fixtures", "fixtures-current"] {
        for e in std::fs::read_dir(root.join(sub)).expect("fixtures").flatten() {
            if e.path().join("model.onnx").is_file() {
                dirs.push(e.path());
            }
        }
    }
    dirs.sort();
    assert!(dirs.len() >= 25, "{dirs:?}");
    let ptxas = std::env::var("ANYSHAPE_PTXAS").ok();
    let tmp = std::env::temp_dir().join(format!("anyshape-model-ptx-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("temp dir");
    // The models are dealt out among threads (one ptxas at a time per core).
    let kernels = std::sync::atomic::AtomicUsize::new(0);
    let attentions = std::sync::atomic::AtomicUsize::new(0);
    let gemms = std::sync::Mutex::new(std::collections::HashSet::new());
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let one_model = |dir: &std::path::PathBuf| {
        let model = Model::load(dir.join("model.onnx"), &LoadOptions::new())
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let plan = model.lower_gpu().unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        // Every kernel the device would load: the loop programs, the operand
        // copy, the GEMMs its steps are given (each distinct GEMM once): every
        // GPU's lists, a Hopper's (wgmma too) for the BERTs.
        let hopper = dir.file_name().is_some_and(|n| n.to_string_lossy().starts_with("bert"));
        let target = if hopper { anyshape::gpu::GpuTarget::Sm90a } else { anyshape::gpu::GpuTarget::Sm80 };
        let mut texts = Vec::new();
        for (i, p) in plan.programs.iter().enumerate() {
            let ptx = codegen::nvptx::program_ptx(p, &format!("k{i}"))
                .unwrap_or_else(|e| panic!("{} program {i} ({}): {e}", dir.display(), p.name));
            texts.push((format!("k{i}"), p.name.clone(), ptx));
        }
        // Each fused attention's kernel (one per online program and head).
        let mut seen = std::collections::HashSet::new();
        for st in &plan.steps {
            let plan::StepKind::Attention(a) = &st.kind else { continue };
            let online = a.online.as_ref().expect("the GPU fuses only online softmax");
            let head = a.head(&plan.dims).expect("a constant head");
            let out_bf16 = plan.buffers[a.output.c.buf].dtype == ir::DType::BF16;
            if !seen.insert((online.program, head, out_bf16)) {
                continue;
            }
            // `mma.sync`'s, and Hopper's `wgmma` where it takes the head.
            let mut forms = vec![plan::gpu::AttentionMma::Sync];
            if plan::gpu::attention_wgmma_ok(head) {
                forms.push(plan::gpu::AttentionMma::Wgmma);
            }
            for mma in forms {
                let name = plan::gpu::attention_kernel_name(online.program, head, mma, out_bf16);
                let (sp, lp) = (a.scores_param as u32, online.logits_param as u32);
                let ptx = codegen::nvptx::attention_ptx(
                    &plan.programs[online.program],
                    (sp, lp),
                    (head, mma, out_bf16),
                    &name,
                )
                .unwrap_or_else(|e| panic!("{} {name}: {e}", dir.display()));
                texts.push((name.clone(), name, ptx));
                attentions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        if dir == &dirs[0] {
            let copy = codegen::nvptx::operand_copy_ptx().expect("the operand copy");
            texts.push(("copy".into(), "operand copy".into(), copy));
        }
        let gpu_gemms =
            anyshape::gpu::gemm_kernels(&plan, target).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for k in gpu_gemms {
            if gemms.lock().expect("gemms").insert(k.name()) {
                let ptx = codegen::nvptx::ptx(&k).unwrap_or_else(|e| panic!("{}: {k}: {e}", dir.display()));
                texts.push((k.name(), k.name(), ptx));
            }
        }
        for (name, what, ptx) in texts {
            kernels.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if let Some(ptxas) = &ptxas {
                // A folder a model (`fixtures/bert`, `fixtures-current/bert`): the
                // threads' kernels of one name stay apart.
                let folder =
                    tmp.join(dir.strip_prefix(&root).expect("a fixture").to_string_lossy().replace('/', "_"));
                std::fs::create_dir_all(&folder).expect("temp dir");
                let file = folder.join(format!("{name}.ptx"));
                std::fs::write(&file, &ptx).expect("write");
                let out = std::process::Command::new(ptxas)
                    .args(["-v", "-arch", "sm_90a", "-o", "/dev/null"])
                    .arg(&file)
                    .output()
                    .expect("ptxas runs");
                let log = String::from_utf8_lossy(&out.stderr);
                assert!(out.status.success(), "{} {what}: {log}", dir.display());
                assert!(
                    !log.contains("bytes spill stores") || log.contains(" 0 bytes spill stores"),
                    "{log}"
                );
            }
        }
    };
    std::thread::scope(|s| {
        for t in 0..threads {
            let (dirs, one_model) = (&dirs, &one_model);
            s.spawn(move || dirs.iter().skip(t).step_by(threads).for_each(one_model));
        }
    });
    let (kernels, attentions) = (kernels.into_inner(), attentions.into_inner());
    let gemms = gemms.into_inner().expect("gemms");
    let _ = std::fs::remove_dir_all(&tmp);
    eprintln!(
        "{kernels} kernels of {} models compiled to PTX ({} GEMMs, {attentions} attention kernels)",
        dirs.len(),
        gemms.len()
    );
    assert!(attentions > 0, "no model's attention was fused for the GPU");
}

/// A GPU artifact of the bundled BERT (loop kernels, its fused attention,
/// the GEMMs of a Hopper's lists, the operand copy): every sm_90a kernel is
/// launched as a programmatic dependent and touches no memory before its
/// `griddepcontrol.wait`; with `ANYSHAPE_PTXAS` each assembles for sm_90a.
#[test]
fn a_hoppers_kernels_wait_for_the_kernel_before() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/bert");
    let m = Model::load(root.join("model.onnx"), &LoadOptions::new()).expect("loads");
    let mut opts = anyshape::gpu::GpuArtifactOptions::new().targets(&[anyshape::gpu::GpuTarget::Sm90a]);
    let ptxas = std::env::var("ANYSHAPE_PTXAS").ok();
    if kernels::testing::require("ANYSHAPE_REQUIRE_PTXAS", ptxas.is_some(), "ptxas in ANYSHAPE_PTXAS") {
        opts = opts.ptxas(ptxas.clone().expect("ptxas"));
    }
    let a = m.gpu_artifact(&opts).expect("an artifact");
    let kernels = &a.code[0].kernels;
    assert!(kernels.iter().any(|(_, r)| matches!(r, anyshape::gpu::KernelRole::Attention { .. })));
    for (k, _) in kernels {
        assert_eq!(k.launch, anyshape::gpu::KernelLaunch::Dependent, "{}", k.name);
        assert_eq!(memory_before_wait(&k.text), Some(vec![]), "{}", k.name);
        if ptxas.is_some() {
            assert!(k.cubin.is_some(), "{}: not assembled", k.name);
        }
    }
}

/// A profiled call runs every launch alone and times it: its outputs are
/// a plain call's, each launch names its step and kernel (one per launch
/// the shape records), and the recording's graph is neither used nor
/// disturbed (the next plain calls capture and replay it as usual).
#[test]
fn a_profiled_call_times_each_launch_and_keeps_the_outputs() {
    let m = weight_model();
    let gm = m.compile_host_gpu().expect("compiles");
    let ins = inputs(&m, &[("n", 66)], 3);
    let named: Vec<(&str, Tensor)> = ins.iter().map(|(a, t)| (a.as_str(), t.clone())).collect();
    let plain = gm.run(&named).expect("runs");
    for _ in 0..2 {
        let (outs, p) = gm.run_profiled(&named).expect("profiles");
        assert_eq!(outs, plain, "a profiled call's outputs are a plain call's");
        assert!(!p.launches.is_empty());
        let steps = gm.plan().steps.len();
        for l in &p.launches {
            assert!(l.step < steps, "launch of step {} in a plan of {steps}", l.step);
            assert!(l.seconds > 0.0, "{l:?}");
            let known = ["gemm_", "operand_copy", "splitk_"].iter().any(|p| l.kernel.starts_with(p));
            assert!(known || l.kernel.starts_with('g'), "{l:?}");
        }
        assert!(p.launches.windows(2).all(|w| w[0].step <= w[1].step), "launches in step order");
        let sum: f64 = p.launches.iter().map(|l| l.seconds).sum();
        assert!(p.total.as_secs_f64() >= sum, "the call {:?} holds its launches {sum}", p.total);
    }
    assert_eq!(gm.device().graph_launches(), 0, "profiled calls run no graph");
    compare_within(&m, &gm, &[("n", 66)], 4, Some(BF16_L2));
    compare_within(&m, &gm, &[("n", 66)], 5, Some(BF16_L2));
    assert_eq!(gm.device().graph_launches(), 2, "plain calls 2 and 3 at the shape run its graph");
}

/// Calls on inputs and outputs held in device memory (`device_io`, what
/// `bench --on-device` times) give a host call's outputs, call after call
/// (from the second, read and written in place, with no copies; from the
/// third, nothing uploaded), a timed call says how long its graph took, and
/// the memory is freed with them.
#[test]
fn device_io_calls_give_the_host_calls_outputs() {
    let m = weight_model();
    let gm = m.compile_host_gpu().expect("compiles");
    for (seed, n) in [(1u64, 66usize), (2, 1), (3, 67)] {
        let ins = inputs(&m, &[("n", n)], seed);
        let named: Vec<(&str, Tensor)> = ins.iter().map(|(a, t)| (a.as_str(), t.clone())).collect();
        let want = gm.run(&named).expect("runs");
        let live = gm.device().bytes_live();
        let mut io = gm.device_io(&named).expect("allocates");
        for call in 0..4 {
            let (copies, uploads) = (gm.device().copies(), gm.device().uploads());
            io.run().expect("runs on the device");
            let uploaded = gm.device().uploads() - uploads;
            assert_eq!(io.outputs().expect("downloads"), want, "n = {n}");
            // The first call copies the tensors in and out (replaying the host
            // call's launches, their tables still in place); later calls on
            // the same tensors read and write them in place. The second's
            // launches (bound to them) are recorded anew, their tables
            // uploaded; from the third nothing comes from the host.
            let made = gm.device().copies() - copies;
            assert_eq!(made == 0, call > 0, "n = {n}, call {call}: {made} copies");
            assert_eq!(uploaded > 0, call == 1, "n = {n}, call {call}: {uploaded} uploads");
        }
        // Timed calls replay the shape's graph (recorded by now) and say
        // how long it took; their outputs are the same.
        let graphs = gm.device().graph_launches();
        let secs = io.run_timed().expect("runs on the device").expect("a graph ran");
        assert!(secs > 0.0 && secs.is_finite(), "{secs}");
        assert_eq!(gm.device().graph_launches(), graphs + 1);
        assert_eq!(io.outputs().expect("downloads"), want, "n = {n}");
        drop(io);
        assert_eq!(gm.device().bytes_live(), live, "the inputs' and outputs' memory is freed");
    }
}

/// `x · W + b + r` with a 2048×64 weight: a hundred rows or two against a
/// long K leave most SMs idle with one tile a block (GEMV takes fewer), and
/// the wave model picks a split-K kernel that folds its shares (each into
/// the call's scratch, the last block of a tile summing them with the bias
/// and the residual into the f32 output). Against the interpreter at rows
/// 97, a prime, and 200, on both targets, one launch for the product, each
/// shape twice (the tiles' counters set back to zero by the first call).
#[test]
fn few_rows_against_a_long_k_run_split_k_folding_its_shares() {
    let (w, b) = weight_and_bias(2048, 64, 8192.0);
    let m = with_constants(
        r#"graph {
  sym n param 1..
  input %x: f32[n, 2048]
  input %r: f32[n, 64]
  %w: f32[2048, 64] = constant @w
  %b: f32[64] = constant @b
  %y: f32[n, 64] = matmul %x, %w
  %b2: f32[1, 64] = reshape %b
  %bb: f32[n, 64] = broadcast %b2
  %z: f32[n, 64] = add %y, %bb
  %o: f32[n, 64] = add %z, %r
  output %o
}
"#,
        &[("w", vec![2048, 64], w), ("b", vec![64], b)],
    );
    for target in [anyshape::gpu::GpuTarget::Sm80, anyshape::gpu::GpuTarget::Sm90a] {
        let gm = m.compile_host_gpu_for(target).expect("compiles");
        for (i, n) in [97usize, 127, 200].into_iter().enumerate() {
            compare_within(&m, &gm, &[("n", n)], i as u64, Some(BF16_L2));
            let ins = inputs(&m, &[("n", n)], 5);
            let named: Vec<(&str, Tensor)> = ins.iter().map(|(a, t)| (a.as_str(), t.clone())).collect();
            let used = gm.gemms_at(&named).expect("plans");
            assert_eq!(used.len(), 1, "{used:?}");
            let k = &used[0].1[0];
            assert!(
                k.contains("_skf")
                    && k.rsplit_once('x').is_some_and(|(_, s)| s.parse::<usize>().is_ok_and(|s| s > 1)),
                "{target:?} {n} rows: {used:?}"
            );
            let (_, p) = gm.run_profiled(&named).expect("profiles");
            let names: Vec<&str> = p.launches.iter().map(|l| l.kernel.as_str()).collect();
            assert_eq!(names.iter().filter(|k| k.contains("_skf")).count(), 1, "{names:?}");
            assert!(names.iter().all(|k| !k.contains("reduce")), "{names:?}");
            compare_within(&m, &gm, &[("n", n)], 10 + i as u64, Some(BF16_L2));
        }
    }
}

/// `tanh(x · W1 + b1) · W2 + b2`: the first product's output is read only
/// by the second, as its A, so it is stored in bf16 (`lower::bf16_products`:
/// its bias a bf16 constant) and the second product's kernels read it in
/// place, no copy at any row count: GEMV at one row, a split-K kernel
/// folding its shares into bf16 at a hundred rows or two against the long
/// K, the tiles past them. Against the interpreter at rows 1, 7, 97, 200
/// and 257, on both targets.
#[test]
fn a_products_bf16_output_is_the_next_products_a() {
    let (w1, b1) = weight_and_bias(2048, 64, 8192.0);
    let (w2, b2) = weight_and_bias(64, 48, 1024.0);
    let m = with_constants(
        r#"graph {
  sym n param 1..
  input %x: f32[n, 2048]
  %w1: f32[2048, 64] = constant @w1
  %b1: f32[64] = constant @b1
  %w2: f32[64, 48] = constant @w2
  %b2: f32[48] = constant @b2
  %y: f32[n, 64] = matmul %x, %w1
  %b1r: f32[1, 64] = reshape %b1
  %b1b: f32[n, 64] = broadcast %b1r
  %z: f32[n, 64] = add %y, %b1b
  %h: f32[n, 64] = tanh %z
  %o: f32[n, 48] = matmul %h, %w2
  %b2r: f32[1, 48] = reshape %b2
  %b2b: f32[n, 48] = broadcast %b2r
  %ob: f32[n, 48] = add %o, %b2b
  output %ob
}
"#,
        &[("w1", vec![2048, 64], w1), ("b1", vec![64], b1), ("w2", vec![64, 48], w2), ("b2", vec![48], b2)],
    );
    for target in [anyshape::gpu::GpuTarget::Sm80, anyshape::gpu::GpuTarget::Sm90a] {
        let gm = m.compile_host_gpu_for(target).expect("compiles");
        let text = plan::print_plan(gm.plan());
        assert!(
            text.contains(": bf16[n, 64] \"h\" (temp")
                && text.contains("bf16[1, 64] \"b1r.bf16\" (constant)"),
            "{text}"
        );
        for (i, n) in [1usize, 7, 97, 200, 257].into_iter().enumerate() {
            compare_within(&m, &gm, &[("n", n)], i as u64, Some(BF16_L2));
            let ins = inputs(&m, &[("n", n)], 5);
            let named: Vec<(&str, Tensor)> = ins.iter().map(|(a, t)| (a.as_str(), t.clone())).collect();
            let used = gm.gemms_at(&named).expect("plans");
            assert_eq!(used.len(), 2, "{used:?}");
            // The first stores bf16 C, the second reads bf16 A.
            assert!(used[0].1.iter().all(|k| !k.contains("_c32")), "{target:?} {n}: {used:?}");
            assert!(used[1].1.iter().all(|k| !k.contains("_a32") && k.contains("_c32")), "{used:?}");
            let copies = gm.copies_at(&named).expect("plans");
            assert_eq!(copies[0].1, a_copies(&used)[0], "{target:?} {n}: {copies:?}");
            assert_eq!(copies[1].1, 0, "{target:?} {n}: {copies:?}");
            let (_, p) = gm.run_profiled(&named).expect("profiles");
            let names: Vec<&str> = p.launches.iter().map(|l| l.kernel.as_str()).collect();
            if let Some(sk) = names.iter().find(|k| k.contains("_sk")) {
                assert!(sk.contains("_skf") && !sk.contains("_c32"), "{names:?}");
                assert!(names.iter().all(|k| !k.contains("reduce")), "{names:?}");
            } else {
                assert!(!(97..=200).contains(&n), "{target:?} {n}: no split-K: {names:?}");
            }
        }
    }
}
