//! The bundled models (tests/fixtures, made by tools/fixtures/make_fixtures.py)
//! run on the reference interpreter at every recorded shape and match ONNX
//! Runtime's outputs: relative L2 error below 1e-4. The same models exported by
//! the current toolchain (tests/fixtures-current: torch 2.15, transformers 5.23,
//! onnx 1.23) do too, on the interpreter and compiled.

use std::path::{Path, PathBuf};

use anyshape::{npy, LoadOptions, Model, Tensor};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

fn fixtures_current() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures-current")
}

fn npy_files(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut v: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "npy"))
        .map(|p| (p.file_stem().unwrap_or_default().to_string_lossy().into_owned(), p))
        .collect();
    v.sort();
    v
}

/// The folders under `root` that hold a `model.onnx`, sorted.
fn models_in(root: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("model.onnx").is_file())
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    names.sort();
    names
}

fn rel_l2(got: &Tensor, want: &Tensor) -> f64 {
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let num: f64 = g.iter().zip(&w).map(|(a, b)| (a - b) * (a - b)).sum();
    let den: f64 = w.iter().map(|b| b * b).sum();
    (num / den.max(1e-30)).sqrt()
}

fn check_model(name: &str) {
    check_in(&fixtures(), name, false);
}

fn check_in(root: &Path, name: &str, compiled: bool) {
    check_within(root, name, compiled, &[("expected", 1e-4, 0.0)]);
}

/// The elements of `got` that differ from `want` by more than `tolerance`
/// relative to `want`'s largest magnitude.
fn strays(got: &Tensor, want: &Tensor, tolerance: f64) -> usize {
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let top = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    g.iter().zip(&w).filter(|(a, b)| (*a - *b).abs() > tolerance * top.max(1e-30)).count()
}

/// Every case of fixture `name` under `root` against ONNX Runtime's outputs, on
/// the interpreter, and compiled (canary margins on) when `compiled`: for each
/// `(folder, tolerance, strays)`, relative L2 error below `tolerance` from the
/// outputs in each case's folder `folder`, or else at most a fraction `strays`
/// of an output's elements off by more than `tolerance` of its largest value
/// (a quantized activation on the other side of a rounding boundary) and a
/// relative L2 error below 5e-2. Returns the largest error seen per folder.
fn check_within(root: &Path, name: &str, compiled: bool, against: &[(&str, f64, f64)]) -> Vec<f64> {
    let mut worst = vec![0.0f64; against.len()];
    let dir = root.join(name);
    let model =
        Model::load(dir.join("model.onnx"), &LoadOptions::new()).unwrap_or_else(|e| panic!("{name}: {e}"));
    let cm = compiled.then(|| {
        model
            .compile(&anyshape::CompileOptions::new().threads(2).canaries(true))
            .unwrap_or_else(|e| panic!("{name}: compile: {e}"))
    });
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("fixture dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    cases.sort();
    assert!(cases.len() >= 3, "{name}: expected at least 3 cases");
    for case in cases {
        let inputs: Vec<(String, Tensor)> =
            npy_files(&case).into_iter().map(|(n, p)| (n, npy::read(&p).expect("input npy"))).collect();
        let named: Vec<(&str, Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let mut runs = vec![(
            "interpreted",
            model.interpret(&named).unwrap_or_else(|e| panic!("{name}/{}: {e}", case.display())),
        )];
        if let Some(cm) = &cm {
            let got = cm.run(&named).unwrap_or_else(|e| panic!("{name}/{}: compiled: {e}", case.display()));
            runs.push(("compiled", got));
        }
        for (&(folder, tolerance, stray), worst) in against.iter().zip(&mut worst) {
            let expected = npy_files(&case.join(folder));
            assert!(!expected.is_empty(), "{name}/{}: no outputs in {folder}", case.display());
            for (how, outputs) in &runs {
                for (out, path) in &expected {
                    let want = npy::read(path).expect("expected npy");
                    let got = &outputs
                        .iter()
                        .find(|(n, _)| n == out)
                        .unwrap_or_else(|| panic!("{name}: no output {out}"))
                        .1;
                    assert_eq!(got.shape(), want.shape(), "{name}/{} ({how}): {out} shape", case.display());
                    let err = rel_l2(got, &want);
                    if err >= tolerance {
                        let off = strays(got, &want, tolerance);
                        let allowed = (stray * want.numel() as f64).floor() as usize;
                        assert!(
                            off <= allowed && err < 5e-2,
                            "{name}/{} ({how}): {out} relative L2 error {err:e} from {folder}, {off} of {} \
                             elements off (at most {allowed})",
                            case.display(),
                            want.numel()
                        );
                        println!(
                            "{name}/{} ({how}): {out}: {off} of {} elements off",
                            case.display(),
                            want.numel()
                        );
                    }
                    *worst = worst.max(err);
                }
            }
        }
    }
    worst
}

/// The models quantized by ONNX Runtime's tools (tests/fixtures-quantized:
/// dynamic int8 and static QDQ), interpreted and compiled, against ONNX
/// Runtime's outputs for the same quantized file. Run operator by operator
/// (graph optimizations off: the standard's arithmetic) ONNX Runtime gives the
/// outputs in `exact/`, which anyshape matches to float rounding (the integer
/// contractions are exact in both). With its optimizations ONNX Runtime fuses
/// the quantized operators into kernels that round the dequantizing scales'
/// products in another order; an activation that lands on the other side of a
/// rounding boundary then moves by one quantization step, so `expected/`
/// differs from `exact/` by up to 2.2e-2 relative L2 (bert_qdq at one token)
/// and 3.7e-2 (bert_qdq_pc's pooler output, a tanh of one token's features,
/// quantized per channel); anyshape must be within 5e-2 of it. Against the
/// operator-by-operator run, an activation may land on the other side of a
/// rounding boundary too (bert_qdq_pc's last output at batch 2 × 16 tokens:
/// one element of 1,024, by one step of its quantization): at most one
/// element in 500 may. int16 activations (bert_qdq_a16) have steps of 2^-16
/// of their range, and the compiled model multiplies the unscaled values of
/// an operand read once (its scale hoisted to the product's output) in
/// another f32 order than the operator-by-operator run, which moves an
/// activation near a rounding boundary by one such step (13 elements of
/// 1,024 in one case, 1.1e-5 relative L2): for them the bound is 1e-4.
#[test]
fn quantized_models_match_onnxruntime() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures-quantized");
    let names = models_in(&root);
    assert!(names.len() >= 10, "fixtures: {names:?}");
    for name in names {
        let exact = if name.ends_with("_a16") { 1e-4 } else { 1e-5 };
        let worst = check_within(&root, &name, true, &[("exact", exact, 2e-3), ("expected", 5e-2, 0.0)]);
        let (exact, fused) = (worst[0], worst[1]);
        println!("{name}: relative L2 {exact:.1e} from the operator-by-operator run, {fused:.1e} from the fused one");
    }
}

/// The statically quantized models' products multiply integers: the scales
/// of their dequantized operands move to the products' outputs, so every
/// weight product of bert_qdq (signed activations by int8 weights: i16·s8)
/// and every convolution of resnet_qdq (activations after a ReLU: u8·s8; the
/// RGB stem's signed image, its three channels a tap padded with a zero
/// fourth to fill the integer types' words: i16·s8) is marked for an integer
/// family; so are those of the same models quantized per channel (a weight
/// scale per output column, which moves to the product's columns).
#[test]
fn static_quantized_products_multiply_integers() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures-quantized");
    let models = [
        ("bert_qdq", 0, 9, 0),
        ("resnet_qdq", 0, 6, 0),
        ("bert_qdq_pc", 0, 9, 0),
        ("resnet_qdq_pc", 0, 6, 0),
    ];
    for (name, i16s8s, u8s8s, floats) in models {
        let m = Model::load(root.join(name).join("model.onnx"), &LoadOptions::new()).expect("loads");
        let plan = anyshape::inspect::print_plan(&m.lower().expect("lowers"));
        let weights: Vec<&str> = plan.lines().filter(|l| l.contains("(weight)")).collect();
        let count = |mark: &str| weights.iter().filter(|l| l.contains(mark)).count();
        let plain = weights.iter().filter(|l| !l.contains("(i16") && !l.contains("(u8·s8)")).count();
        let marks = (count("(i16·s8)"), count("(u8·s8)"), plain);
        assert_eq!(marks, (i16s8s, u8s8s, floats), "{name}:\n{plan}");
    }
}

/// A weight-only quantized model's weights (`MatMulNBitsQuantizer`'s QDQ
/// form: uint4 codes in groups of 32 rows) reach the plan with their codes,
/// merged ones too (the attention's Q, K and V weights side by side), so that
/// the f32 family multiplies them from their codes. The same quantizer's
/// default form, ONNX Runtime's `MatMulNBits` contrib operator (codes packed
/// two to a byte along K), likewise.
#[test]
fn weight_codes_reach_the_plan() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures-quantized");
    for name in ["bert_w4", "bert_nbits"] {
        let m = Model::load(root.join(name).join("model.onnx"), &LoadOptions::new()).expect("loads");
        let plan = anyshape::inspect::print_plan(&m.lower().expect("lowers"));
        let coded = plan.lines().filter(|l| l.contains("constant (4-bit codes, groups of 32)")).count();
        let weights = plan.lines().filter(|l| l.contains("(weight)")).count();
        // Every product but the pooler's `Gemm` (the quantizer takes `MatMul`s only).
        assert!(
            weights > 1 && coded == weights - 1,
            "{name}: {coded} coded constants, {weights} weight products:\n{plan}"
        );
        assert!(plan.contains("\"/model/pooler/dense/Gemm_output_0\" (constant)\n"), "{name}: {plan}");
    }
}

/// A dynamically quantized model's products write their dequantized output
/// themselves: `(acc − z·colsum)·s` (with the bias, GELU or residual after it)
/// is an epilogue with column scales, its column terms computed first, and no
/// loop program reads the product's output again. A merged product with
/// several outputs (BERT's QKV) is the exception.
#[test]
fn dynamic_quantized_products_dequantize_in_their_epilogue() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures-quantized");
    for (name, merged) in [("gpt2_int8", false), ("bert_int8", true), ("minilm_int8", true)] {
        let m = Model::load(root.join(name).join("model.onnx"), &LoadOptions::new()).expect("loads");
        let plan = anyshape::inspect::print_plan(&m.lower().expect("lowers"));
        let integer: Vec<&str> =
            plan.lines().filter(|l| l.contains("matmul") && l.contains("(u8·s8)")).collect();
        let scaled = integer.iter().filter(|l| l.contains("epilogue column scale b")).count();
        let want = if merged { integer.len() * 2 / 3 } else { integer.len() };
        assert!(
            !integer.is_empty() && scaled >= want,
            "{name}: {scaled} of {} integer products dequantize in their epilogue:\n{plan}",
            integer.len()
        );
        assert!(plan.contains("_columns\n"), "{name}: no program of column terms:\n{plan}");
    }
}

/// Every model of tests/fixtures-current (both exporters of the current
/// toolchain), interpreted and compiled.
#[test]
fn current_exports_match_onnxruntime() {
    let root = fixtures_current();
    let names = models_in(&root);
    assert!(names.len() >= 24, "fixtures: {names:?}");
    for name in names {
        check_in(&root, &name, true);
    }
}

#[test]
fn bert_matches_onnxruntime() {
    check_model("bert");
}

#[test]
fn bert_dynamo_matches_onnxruntime() {
    check_model("bert_dynamo");
}

#[test]
fn albert_matches_onnxruntime() {
    check_model("albert");
}

#[test]
fn gpt2_matches_onnxruntime() {
    check_model("gpt2");
}

#[test]
fn vit_matches_onnxruntime() {
    check_model("vit");
}

#[test]
fn resnet_matches_onnxruntime() {
    check_model("resnet");
}

/// A decoder's first generation step passes an empty KV cache (case0 of the
/// step fixtures: past 0): compiled with no `dims` option, the step takes it,
/// and its outputs match ONNX Runtime's.
#[test]
fn a_decoders_first_step_takes_an_empty_cache() {
    for name in ["llama_step", "llama_step_dynamo"] {
        let past = npy::read(&fixtures_current().join(name).join("case0/past_key_0.npy")).expect("npy");
        assert_eq!(past.shape()[2], 0, "{name}: case0 is a first step");
        check_in(&fixtures_current(), name, true);
    }
}

/// `bench --profile`'s bytes a step reads count a packed weight as packed:
/// an int8 model's weight products read a byte a weight value (not the four
/// of the f32 constant the plan names), so their GB/s are the codes' rate.
#[test]
fn a_packed_weight_counts_its_packed_bytes() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures-quantized");
    let m = Model::load(root.join("bert_int8").join("model.onnx"), &LoadOptions::new()).expect("loads");
    let cm = m.compile(&anyshape::CompileOptions::new().threads(2)).expect("compiles");
    let inputs: Vec<(String, Tensor)> = npy_files(&root.join("bert_int8").join("case0"))
        .into_iter()
        .map(|(n, p)| (n, npy::read(&p).expect("input npy")))
        .collect();
    let named: Vec<(&str, Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let bytes = cm.step_bytes(&named).expect("bytes");
    let plan = cm.plan();
    let mut products = 0;
    for (i, step) in plan.steps.iter().enumerate() {
        let plan::StepKind::MatMul(mm) = &step.kind else { continue };
        if !(mm.weight && mm.u8s8) {
            continue;
        }
        let b = &plan.buffers[mm.b.buf];
        let values: i64 =
            b.shape.iter().map(|d| d.as_const().expect("a weight's dims are constants")).product();
        let values = values as usize;
        // A and C are a few rows; the codes a byte each (panels padded to the tile).
        assert!(
            bytes[i] >= values && bytes[i] < 2 * values,
            "step {i}: {} bytes for {values} weights",
            bytes[i]
        );
        products += 1;
    }
    assert!(products > 0, "no int8 weight product in bert_int8");
}
