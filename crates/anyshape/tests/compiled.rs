//! Every bundled model, compiled (generated loop programs and the contraction
//! engine, no interpreter), matches the reference interpreter at random shapes
//! drawn from the symbols' ranges (1, primes, one past a tile, the range's end)
//! and ONNX Runtime at the recorded cases. Inputs are random; attention masks
//! have padded positions.

use std::path::PathBuf;
use std::sync::OnceLock;

use anyshape::{CompileOptions, CompiledModel, Elems, LoadOptions, Model, Tensor};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(name)
}

/// A small deterministic generator (xorshift).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn normal(&mut self) -> f32 {
        let u = (self.below(1 << 24) as f32 + 0.5) / (1u64 << 24) as f32;
        let v = (self.below(1 << 24) as f32 + 0.5) / (1u64 << 24) as f32;
        (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
    }
}

fn inputs_for(model: &Model, dims: &[(&str, usize)], rng: &mut Rng) -> Vec<(String, Tensor)> {
    model
        .inputs()
        .into_iter()
        .map(|info| {
            let shape: Vec<usize> = info
                .ty
                .shape
                .iter()
                .map(|d| match d.as_const() {
                    Some(c) => c as usize,
                    None => dims.iter().find(|(n, _)| Some(*n) == d.as_symbol()).map_or(1, |x| x.1),
                })
                .collect();
            let n: usize = shape.iter().product();
            let last = *shape.last().unwrap_or(&1);
            let elems = match info.ty.dtype {
                anyshape::DType::I64 => Elems::I64(
                    (0..n)
                        .map(|i| match info.name.as_str() {
                            // The first position is always attended to; others at random.
                            "attention_mask" => i64::from(i % last == 0 || rng.below(4) != 0),
                            "token_type_ids" => rng.below(2) as i64,
                            _ => rng.below(99) as i64,
                        })
                        .collect(),
                ),
                _ => Elems::F32((0..n).map(|_| rng.normal()).collect()),
            };
            (info.name.clone(), Tensor::new(shape, elems).expect("tensor"))
        })
        .collect()
}

fn max_rel_err(got: &Tensor, want: &Tensor) -> f64 {
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let scale = w.iter().map(|x| x.abs()).fold(1e-6, f64::max);
    g.iter().zip(&w).map(|(a, b)| (a - b).abs() / scale).fold(0.0, f64::max)
}

/// Each fixture compiled once for the whole test binary.
type Compiled = &'static (Model, CompiledModel);

fn compiled(name: &str) -> Compiled {
    static CACHE: OnceLock<std::sync::Mutex<Vec<(&'static str, Compiled)>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut c = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, m)) = c.iter().find(|(n, _)| *n == name) {
        return m;
    }
    let model = Model::load(fixture(name).join("model.onnx"), &LoadOptions::new()).expect("loads");
    let cm = model
        .compile(&CompileOptions::new().threads(2).canaries(true))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let leaked: Compiled = Box::leak(Box::new((model, cm)));
    let key: &'static str = Box::leak(name.to_string().into_boxed_str());
    c.push((key, leaked));
    leaked
}

fn check(name: &str, dims: &[(&str, usize)], seed: u64) {
    let (model, cm) = compiled(name);
    let mut rng = Rng(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1);
    let inputs = inputs_for(model, dims, &mut rng);
    let named: Vec<(&str, Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let want = model.interpret(&named).unwrap_or_else(|e| panic!("{name} {dims:?}: interpreter: {e}"));
    let got = cm.run(&named).unwrap_or_else(|e| panic!("{name} {dims:?}: compiled: {e}"));
    assert_eq!(got.len(), want.len());
    for ((gn, g), (wn, w)) in got.iter().zip(&want) {
        assert_eq!(gn, wn);
        assert_eq!(g.shape(), w.shape(), "{name} {dims:?}: {gn}");
        let err = max_rel_err(g, w);
        assert!(
            err < 1e-4,
            "{name} {dims:?}: {gn} differs from the interpreter by {err:e} (relative to its largest value)"
        );
    }
}

/// Sizes of a symbol: 1, primes, one past a tile (8, 16), the range's end.
const SEQS: [usize; 8] = [1, 2, 7, 13, 17, 33, 63, 64];

#[test]
fn bert_compiled_matches_interpreter() {
    for (i, s) in SEQS.iter().enumerate() {
        check("bert", &[("batch", 1 + i % 3), ("seq", *s)], i as u64);
    }
}

#[test]
fn bert_dynamo_compiled_matches_interpreter() {
    for (i, s) in SEQS.iter().enumerate() {
        check("bert_dynamo", &[("s0", 1 + i % 2), ("s1", *s)], 10 + i as u64);
    }
}

#[test]
fn albert_compiled_matches_interpreter() {
    for (i, s) in SEQS.iter().enumerate() {
        check("albert", &[("batch", 1 + (i + 1) % 3), ("seq", *s)], 20 + i as u64);
    }
}

#[test]
fn gpt2_compiled_matches_interpreter() {
    for (i, s) in SEQS.iter().enumerate() {
        check("gpt2", &[("batch", 1 + i % 2), ("seq", *s)], 30 + i as u64);
    }
}

#[test]
fn vit_compiled_matches_interpreter() {
    for b in [1, 2, 3, 5] {
        check("vit", &[("batch", b)], 40 + b as u64);
    }
}

#[test]
fn resnet_compiled_matches_interpreter() {
    // Image sizes: the stride chain's edges (odd, prime, one past a power of two).
    for (i, (h, w)) in [(32, 32), (17, 23), (9, 33), (1, 1), (40, 7)].iter().enumerate() {
        check("resnet", &[("batch", 1 + i % 2), ("height", *h), ("width", *w)], 50 + i as u64);
    }
}

/// `CompiledModel` is shared between threads: concurrent calls at mixed shapes
/// (each with an arena of its own) all give the interpreter's answers, and
/// every shape is planned once.
#[test]
fn concurrent_calls_at_mixed_shapes() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<CompiledModel>();
    // A model of its own: the other tests plan shapes of the shared ones meanwhile.
    let model = Model::load(fixture("gpt2").join("model.onnx"), &LoadOptions::new()).expect("loads");
    let cm = &model.compile(&CompileOptions::new().threads(2).canaries(true)).expect("compiles");
    let model = &model;
    let shapes = [(1usize, 1usize), (2, 7), (1, 17), (3, 64), (2, 33)];
    type Named = Vec<(String, Tensor)>;
    let cases: Vec<(Named, Named)> = shapes
        .iter()
        .enumerate()
        .map(|(i, (b, s))| {
            let mut rng = Rng(1000 + i as u64);
            let ins = inputs_for(model, &[("batch", *b), ("seq", *s)], &mut rng);
            let named: Vec<(&str, Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
            let want = model.interpret(&named).expect("interpreter");
            (ins, want)
        })
        .collect();
    std::thread::scope(|scope| {
        for t in 0..8 {
            let cases = &cases;
            scope.spawn(move || {
                for call in 0..40 {
                    let (ins, want) = &cases[(t + call) % cases.len()];
                    let named: Vec<(&str, Tensor)> =
                        ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
                    let got = cm.run(&named).expect("compiled");
                    for ((_, g), (_, w)) in got.iter().zip(want) {
                        assert!(max_rel_err(g, w) < 1e-4, "thread {t} call {call}");
                    }
                }
            });
        }
    });
    assert_eq!(cm.shapes_planned(), shapes.len(), "each shape planned once");
}

/// Two models on one shared pool (`CompileOptions::pool`), called at once
/// from several threads: their fork-joins take turns on the pool's threads and
/// every call gives the interpreter's answer.
#[test]
fn models_sharing_a_pool_run_at_once() {
    let pool = std::sync::Arc::new(anyshape::ThreadPool::new(2));
    let names = ["bert", "gpt2"];
    let models: Vec<Model> = names
        .iter()
        .map(|n| Model::load(fixture(n).join("model.onnx"), &LoadOptions::new()).expect("loads"))
        .collect();
    let opts = CompileOptions::new().threads(5).pool(pool.clone()).canaries(true);
    let compiled: Vec<CompiledModel> = models.iter().map(|m| m.compile(&opts).expect("compiles")).collect();
    assert_eq!(pool.threads(), 2, "the pool's threads win over `threads`");
    type Named = Vec<(String, Tensor)>;
    let cases: Vec<(usize, Named, Named)> = (0..6)
        .map(|i| {
            let m = i % 2;
            let mut rng = Rng(2000 + i as u64);
            let ins = inputs_for(&models[m], &[("batch", 1 + i % 3), ("seq", [1, 7, 17][i % 3])], &mut rng);
            let named: Vec<(&str, Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
            let want = models[m].interpret(&named).expect("interpreter");
            (m, ins, want)
        })
        .collect();
    std::thread::scope(|scope| {
        for t in 0..4 {
            let (cases, compiled) = (&cases, &compiled);
            scope.spawn(move || {
                for call in 0..12 {
                    let (m, ins, want) = &cases[(t + call) % cases.len()];
                    let named: Vec<(&str, Tensor)> =
                        ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
                    let got = compiled[*m].run(&named).expect("compiled");
                    for ((_, g), (_, w)) in got.iter().zip(want) {
                        assert!(max_rel_err(g, w) < 1e-4, "{} on thread {t}, call {call}", names[*m]);
                    }
                }
            });
        }
    });
}

/// Bad inputs to a compiled model are errors naming what is wrong, never a
/// crash: a shape outside the model's facts, a wrong dtype or rank, a token id
/// out of the embedding table's range (caught by the generated gather).
#[test]
fn bad_inputs_are_errors() {
    let (model, cm) = compiled("bert");
    let mut rng = Rng(7);
    let ok = inputs_for(model, &[("batch", 1), ("seq", 5)], &mut rng);
    let run = |ins: &[(String, Tensor)]| {
        let named: Vec<(&str, Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        cm.run(&named).map(|_| ()).map_err(|e| e.to_string())
    };
    assert!(run(&ok).is_ok());
    // seq is at most 64 (the position table).
    let long = inputs_for(model, &[("batch", 1), ("seq", 65)], &mut rng);
    let e = run(&long).expect_err("seq 65");
    assert!(e.contains("input_ids") && e.contains("dim 1"), "{e}");
    // Mismatched dims between inputs.
    let mut mixed = ok.clone();
    mixed[1] = (mixed[1].0.clone(), Tensor::new(vec![1, 6], Elems::I64(vec![1; 6])).expect("t"));
    let e = run(&mixed).expect_err("mixed seq");
    assert!(e.contains("attention_mask"), "{e}");
    // Wrong dtype and rank.
    let mut f = ok.clone();
    f[0] = (f[0].0.clone(), Tensor::new(vec![1, 5], Elems::F32(vec![0.0; 5])).expect("t"));
    assert!(run(&f).expect_err("dtype").contains("input_ids"));
    let mut r = ok.clone();
    r[0] = (r[0].0.clone(), Tensor::new(vec![5], Elems::I64(vec![0; 5])).expect("t"));
    assert!(run(&r).expect_err("rank").contains("rank"));
    // A token id past the vocabulary: the gather reports it, nothing is read out of bounds.
    let mut bad = ok.clone();
    bad[0] = (bad[0].0.clone(), Tensor::new(vec![1, 5], Elems::I64(vec![1, 2, 1000, 3, 4])).expect("t"));
    let e = run(&bad).expect_err("id out of range");
    assert!(e.contains("gather") && e.contains("out of range"), "{e}");
    // The model still answers after errors.
    assert!(run(&ok).is_ok());
}

/// A second compile of a model takes every module's object from the on-disk
/// object cache (no LLVM), and the model it makes gives the same answers.
#[test]
fn second_compile_takes_every_object_from_the_cache() {
    let model = Model::load(fixture("bert").join("model.onnx"), &LoadOptions::new()).expect("loads");
    let opts = CompileOptions::new().threads(2).canaries(true);
    let first = model.compile(&opts).expect("compiles");
    let second = model.compile(&opts).expect("compiles again");
    let (a, b) = (first.code_stats(), second.code_stats());
    let modules = a.modules_from_cache + a.modules_compiled;
    assert!(modules > 10, "{a:?}");
    assert_eq!(b, anyshape::CodeStats { modules_from_cache: modules, modules_compiled: 0 });
    // Without the cache, every module is compiled.
    let cold = model.compile(&opts.clone().object_cache(false)).expect("compiles cold");
    assert_eq!(cold.code_stats(), anyshape::CodeStats { modules_from_cache: 0, modules_compiled: modules });
    let mut rng = Rng(77);
    let inputs = inputs_for(&model, &[("batch", 2), ("seq", 13)], &mut rng);
    let named: Vec<(&str, Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let want = model.interpret(&named).expect("interpreter");
    for cm in [&first, &second, &cold] {
        for ((_, g), (_, w)) in cm.run(&named).expect("runs").iter().zip(&want) {
            assert!(max_rel_err(g, w) < 1e-4);
        }
    }
}

/// With measured dispatch, each weight's best schedules at 1 to 64 rows are
/// measured once per machine (kept in the cache folder's `refined-*.json`), and
/// the model runs on them with the same answers.
#[test]
fn measured_dispatch_is_cached_and_matches_the_interpreter() {
    let model = Model::load(fixture("bert").join("model.onnx"), &LoadOptions::new()).expect("loads");
    let opts = CompileOptions::new().threads(2).canaries(true).measured_dispatch(true);
    let cm = model.compile(&opts).expect("compiles");
    let dir = anyshape::default_cache_dir().expect("a cache folder");
    let file = codegen::refine::path(&dir, kernels::ElemType::F32, 2);
    let text = std::fs::read_to_string(&file).expect("the measurements are cached");
    assert!(text.contains("\"table\""), "{text}");
    let mut rng = Rng(5);
    for (batch, seq) in [(1, 1), (1, 2), (2, 2), (1, 5), (1, 8), (1, 13), (1, 29), (3, 7)] {
        let inputs = inputs_for(&model, &[("batch", batch), ("seq", seq)], &mut rng);
        let named: Vec<(&str, Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let want = model.interpret(&named).expect("interpreter");
        for ((_, g), (_, w)) in cm.run(&named).expect("runs").iter().zip(&want) {
            let e = max_rel_err(g, w);
            assert!(e < 1e-4, "batch {batch} seq {seq}: {e}");
        }
    }
}

/// Inputs read in place (`run_views`, what the Python package passes numpy
/// arrays as) give what owned inputs give; a view of the wrong element count
/// is refused when it is made.
#[test]
fn views_of_borrowed_inputs_run_like_owned_ones() {
    let (model, cm) = compiled("bert");
    let mut rng = Rng(0x5eed);
    let inputs = inputs_for(model, &[("batch", 2), ("seq", 13)], &mut rng);
    let named: Vec<(&str, Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let want = cm.run(&named).expect("owned inputs");
    let views: Vec<(&str, anyshape::TensorView)> = inputs
        .iter()
        .map(|(n, t)| {
            let Elems::I64(v) = t.elems() else { panic!("bert's inputs are i64") };
            (n.as_str(), anyshape::TensorView::of(t.shape(), v).expect("view"))
        })
        .collect();
    let got = cm.run_views(&views).expect("borrowed inputs");
    assert_eq!(got, want);
    assert!(anyshape::TensorView::of(&[2, 3], &[1i64; 5]).is_err());
}

/// A decoder's step returns its cache grown by a row; its caller hands the
/// outputs back (`CompiledModel::recycle`) and the next step's outputs reuse
/// their memory (made with room to grow), truncated or grown, every element
/// written anew: equal to the interpreter's at every step, stale values never
/// seen, and a small output not kept.
#[test]
fn outputs_handed_back_serve_the_next_calls() {
    let text = r#"graph {
  sym p param 0..4096
  sym t param 1..64
  input %past: f32[p, 256]
  input %new: f32[t, 256]
  %two: f32[1, 1] = constant [2.0]
  %twob: f32[t, 256] = broadcast %two
  %scaled: f32[t, 256] = mul %new, %twob
  %present: f32[p+t, 256] = concat[axis=0] %past, %scaled
  %last: f32[1, 256] = slice[0: t-1 step 1] %scaled
  output %present, %last
}
"#;
    let g = ir::parse_graph(text, &|_| None).unwrap_or_else(|e| panic!("{e}"));
    let model = Model::from_ir(g, &LoadOptions::new()).expect("model");
    let cm = model.compile(&CompileOptions::new().threads(2)).expect("compile");
    let mut rng = Rng(7);
    let mut past =
        Tensor::new(vec![100, 256], Elems::F32((0..25600).map(|_| rng.normal()).collect())).unwrap();
    let mut last_ptr = None;
    // Grow a row at a time, then by a prompt of 9, then back to a short cache.
    for (step, (p, t)) in
        [(100, 1), (101, 1), (102, 1), (103, 9), (112, 1), (3, 1), (4, 1)].into_iter().enumerate()
    {
        if past.shape()[0] != p {
            past =
                Tensor::new(vec![p, 256], Elems::F32((0..p * 256).map(|_| rng.normal()).collect())).unwrap();
        }
        let new =
            Tensor::new(vec![t, 256], Elems::F32((0..t * 256).map(|_| rng.normal()).collect())).unwrap();
        let feeds = [("past", past.clone()), ("new", new)];
        let want = model.interpret(&feeds).expect("interpreter");
        let got = cm.run(&feeds).expect("run");
        for ((name, g), (_, w)) in got.iter().zip(&want) {
            assert_eq!(g.shape(), w.shape(), "step {step}: {name}");
            assert_eq!(g.to_f64_vec(), w.to_f64_vec(), "step {step}: {name}");
        }
        let Elems::F32(v) = got[0].1.elems() else { panic!("f32") };
        let ptr = v.as_ptr();
        // Growing within the room of the first output reuses its memory.
        if (1..=2).contains(&step) {
            assert_eq!(Some(ptr), last_ptr, "step {step}: a fresh allocation");
        }
        last_ptr = Some(ptr);
        past = got[0].1.clone();
        cm.recycle(got);
    }
}

/// `Precision::Bf16`: the contraction families multiply in bf16 (weights packed
/// as bf16 once, f32 accumulation) and the rest stays f32. Against the f32
/// interpreter at random shapes, BERT and ResNet stay within what bf16's 8-bit
/// significand explains (each product's operands rounded by up to 2^-9,
/// relative); the answers differ from the f32 model's, so bf16 really ran. A
/// machine without AVX-512 BF16 gets an error saying so.
#[test]
fn bf16_precision_stays_near_the_f32_model() {
    let opts = CompileOptions::new().threads(2).canaries(true).precision(anyshape::Precision::Bf16);
    let bert = Model::load(fixture("bert").join("model.onnx"), &LoadOptions::new()).expect("loads");
    if !kernels::testing::bf16() {
        let Err(err) = bert.compile(&opts) else { panic!("bf16 compiled without AVX-512 BF16") };
        let err = err.to_string();
        assert!(err.contains("BF16"), "{err}");
        return;
    }
    let f32_model = &compiled("bert").1;
    let cm = bert.compile(&opts).expect("compiles");
    assert!(cm.kernels_text().contains("micro-kernels in bf16"), "{}", cm.kernels_text());
    let mut worst = 0.0f64;
    let mut differs = false;
    for (i, (batch, seq)) in
        [(1, 1), (1, 2), (2, 7), (1, 13), (3, 17), (1, 33), (2, 64)].into_iter().enumerate()
    {
        let mut rng = Rng(900 + i as u64);
        let inputs = inputs_for(&bert, &[("batch", batch), ("seq", seq)], &mut rng);
        let named: Vec<(&str, Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let want = bert.interpret(&named).expect("interpreter");
        let plain = f32_model.run(&named).expect("f32 runs");
        for (((_, g), (_, w)), (_, p)) in cm.run(&named).expect("runs").iter().zip(&want).zip(&plain) {
            let e = max_rel_err(g, w);
            assert!(e < 1e-2, "batch {batch} seq {seq}: {e}");
            worst = worst.max(e);
            differs |= max_rel_err(g, p) > 1e-4;
        }
    }
    assert!(differs, "the bf16 model gives the f32 model's answers: it did not multiply in bf16");
    println!("bert bf16: largest error relative to the output's largest value {worst:.1e}");
    // Its artifact keeps the bf16 kernels and weights: the same answers, loaded.
    let path = std::env::temp_dir().join(format!("anyshape-bf16-{}.anyshape", std::process::id()));
    let cm = bert.compile(&opts.clone().canaries(false)).expect("compiles");
    cm.save(&path).expect("saves");
    let loaded = CompiledModel::load(&path, &anyshape::ArtifactOptions::new().threads(2)).expect("loads");
    let _ = std::fs::remove_file(&path);
    assert!(loaded.kernels_text().contains("micro-kernels in bf16"));
    let mut rng = Rng(999);
    let inputs = inputs_for(&bert, &[("batch", 2), ("seq", 19)], &mut rng);
    let named: Vec<(&str, Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let (a, b) = (cm.run(&named).expect("runs"), loaded.run(&named).expect("the artifact runs"));
    for ((_, x), (_, y)) in a.iter().zip(&b) {
        assert_eq!(x.elems(), y.elems(), "the artifact answers differently");
    }
    let resnet = Model::load(fixture("resnet").join("model.onnx"), &LoadOptions::new()).expect("loads");
    let cm = resnet.compile(&opts).expect("compiles");
    for (i, (h, w)) in [(17, 23), (1, 1), (32, 32)].into_iter().enumerate() {
        let mut rng = Rng(950 + i as u64);
        let inputs = inputs_for(&resnet, &[("batch", 1 + i % 2), ("height", h), ("width", w)], &mut rng);
        let named: Vec<(&str, Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let want = resnet.interpret(&named).expect("interpreter");
        for ((_, got), (_, want)) in cm.run(&named).expect("runs").iter().zip(&want) {
            let e = max_rel_err(got, want);
            assert!(e < 1e-2, "resnet {h}x{w}: {e}");
        }
    }
}
