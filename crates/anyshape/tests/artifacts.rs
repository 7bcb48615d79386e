//! Compiled artifacts: a model saved and loaded again (no compilation) gives
//! the compiled model's outputs bit for bit at random shapes, the reference
//! interpreter's within tolerance, and saves to the same bytes; a damaged,
//! truncated or foreign file is a clear error, never a crash.

mod common;

use std::path::PathBuf;

use anyshape::{
    ArtifactError, ArtifactOptions, CompileOptions, CompiledModel, Elems, LoadOptions, Model, RunError,
    Tensor,
};
use common::{shape_at, Lcg};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(name).join("model.onnx")
}

/// A folder of this test process's own.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("anyshape-artifacts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch folder");
    dir.join(name)
}

fn inputs(model: &Model, dims: &[(&str, usize)], seed: u64) -> Vec<(String, Tensor)> {
    let mut rng = Lcg::new(seed);
    model
        .inputs()
        .into_iter()
        .map(|i| {
            let shape = shape_at(&i.ty, dims);
            let n: usize = shape.iter().product();
            let last = *shape.last().unwrap_or(&1);
            let elems = match i.ty.dtype {
                anyshape::DType::I64 => Elems::I64(
                    (0..n)
                        .map(|k| match i.name.as_str() {
                            "attention_mask" => i64::from(k % last == 0 || !rng.next().is_multiple_of(4)),
                            "token_type_ids" => i64::from(rng.next() % 2),
                            _ => i64::from(rng.next() % 99),
                        })
                        .collect(),
                ),
                _ => Elems::F32((0..n).map(|_| rng.unit()).collect()),
            };
            (i.name.clone(), Tensor::new(shape, elems).expect("tensor"))
        })
        .collect()
}

fn run(cm: &CompiledModel, ins: &[(String, Tensor)]) -> Vec<(String, Tensor)> {
    let named: Vec<(&str, Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    cm.run(&named).expect("runs")
}

/// Compile the fixture `name`, save it, load it back; every shape of `shapes`
/// gives the same bits from both and the interpreter's values.
fn round_trip(name: &str, shapes: &[Vec<(&str, usize)>]) -> (CompiledModel, PathBuf) {
    round_trip_of(fixture(name), name, shapes)
}

fn round_trip_of(file: PathBuf, name: &str, shapes: &[Vec<(&str, usize)>]) -> (CompiledModel, PathBuf) {
    let model = Model::load(file, &LoadOptions::new()).expect("loads");
    let cm = model.compile(&CompileOptions::new().threads(2)).expect("compiles");
    let path = scratch(&format!("{name}.anyshape"));
    cm.save(&path).expect("saves");
    let loaded = CompiledModel::load(&path, &ArtifactOptions::new()).expect("loads the artifact");
    assert_eq!(loaded.threads(), 2);
    assert_eq!(loaded.inputs(), cm.inputs());
    assert_eq!(loaded.outputs(), cm.outputs());
    for (k, dims) in shapes.iter().enumerate() {
        let ins = inputs(&model, dims, 7 + k as u64);
        let (want, got) = (run(&cm, &ins), run(&loaded, &ins));
        let named: Vec<(&str, Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let oracle = model.interpret(&named).expect("interpreter");
        for (((wn, w), (gn, g)), (_, o)) in want.iter().zip(&got).zip(&oracle) {
            assert_eq!(wn, gn);
            assert_eq!(w, g, "{name} {dims:?}: {gn} differs between the compiled model and its artifact");
            let (g, o) = (g.to_f64_vec(), o.to_f64_vec());
            let scale = o.iter().map(|x| x.abs()).fold(1e-6, f64::max);
            let err = g.iter().zip(&o).map(|(a, b)| (a - b).abs() / scale).fold(0.0, f64::max);
            assert!(err < 1e-4, "{name} {dims:?}: {gn} differs from the interpreter by {err:e}");
        }
    }
    // Saved again, the loaded model writes the same bytes.
    let again = scratch(&format!("{name}.again.anyshape"));
    loaded.save(&again).expect("saves the loaded model");
    assert!(
        std::fs::read(&path).expect("read") == std::fs::read(&again).expect("read"),
        "{name}: not the same bytes"
    );
    std::fs::remove_file(&again).ok();
    (loaded, path)
}

#[test]
fn bert_artifact_round_trips() {
    let shapes: Vec<Vec<(&str, usize)>> = [(1, 1), (2, 7), (1, 17), (3, 64), (1, 33)]
        .iter()
        .map(|&(b, s)| vec![("batch", b), ("seq", s)])
        .collect();
    let (_, path) = round_trip("bert", &shapes);
    std::fs::remove_file(path).ok();
}

/// A dynamically quantized BERT: its integer family (u8s8 where the machine has
/// VNNI, i16s8 otherwise) and its weights packed in that type travel in the artifact.
#[test]
fn quantized_bert_artifact_round_trips() {
    let file =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures-quantized/bert_int8/model.onnx");
    let shapes: Vec<Vec<(&str, usize)>> =
        [(1, 1), (2, 7), (1, 17), (3, 33)].iter().map(|&(b, s)| vec![("batch", b), ("seq", s)]).collect();
    let (loaded, path) = round_trip_of(file, "bert_int8", &shapes);
    let vnni = kernels::Target::detect().check_elem(kernels::ElemType::U8S8).is_ok();
    let family = if vnni { "micro-kernels in u8s8 " } else { "micro-kernels in i16s8 " };
    assert!(loaded.kernels_text().contains(family), "{}", loaded.kernels_text());
    std::fs::remove_file(path).ok();
}

/// A weight-only quantized BERT (uint4 codes in groups of 32 rows): its
/// weights packed from their codes, and so they travel in the artifact.
#[test]
fn weight_coded_bert_artifact_round_trips() {
    let file =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures-quantized/bert_w4/model.onnx");
    let shapes: Vec<Vec<(&str, usize)>> =
        [(1, 1), (2, 7), (1, 17), (3, 33)].iter().map(|&(b, s)| vec![("batch", b), ("seq", s)]).collect();
    let (loaded, path) = round_trip_of(file, "bert_w4", &shapes);
    let text = loaded.kernels_text();
    let line = text.lines().find(|l| l.starts_with("packed weights:")).unwrap_or_default().to_string();
    let counts: Vec<usize> =
        line.split(|c: char| !c.is_ascii_digit()).filter_map(|w| w.parse().ok()).collect();
    // All but the pooler's (a `Gemm`, which the quantizer leaves in f32).
    assert!(counts.len() == 2 && counts[0] > 1 && counts[1] == counts[0] - 1, "{text}");
    std::fs::remove_file(path).ok();
}

#[test]
fn gpt2_artifact_round_trips() {
    let shapes: Vec<Vec<(&str, usize)>> =
        [(1, 1), (2, 13), (1, 64)].iter().map(|&(b, s)| vec![("batch", b), ("seq", s)]).collect();
    let (_, path) = round_trip("gpt2", &shapes);
    std::fs::remove_file(path).ok();
}

#[test]
fn resnet_artifact_round_trips() {
    let shapes: Vec<Vec<(&str, usize)>> = [(1, 32, 32), (2, 17, 23), (1, 1, 1)]
        .iter()
        .map(|&(b, h, w)| vec![("batch", b), ("height", h), ("width", w)])
        .collect();
    let (_, path) = round_trip("resnet", &shapes);
    std::fs::remove_file(path).ok();
}

/// Another thread count than the one compiled for: the same values (the
/// trees distilled for two threads are dropped; the model dispatches).
#[test]
fn loads_with_another_thread_count() {
    let model = Model::load(fixture("vit"), &LoadOptions::new()).expect("loads");
    let cm = model.compile(&CompileOptions::new().threads(2)).expect("compiles");
    let path = scratch("vit.anyshape");
    cm.save(&path).expect("saves");
    let one = CompiledModel::load(&path, &ArtifactOptions::new().threads(1)).expect("loads");
    assert_eq!(one.threads(), 1);
    for b in [1, 3] {
        let ins = inputs(&model, &[("batch", b)], b as u64);
        for ((_, w), (_, g)) in run(&cm, &ins).iter().zip(&run(&one, &ins)) {
            let (w, g) = (w.to_f64_vec(), g.to_f64_vec());
            let scale = w.iter().map(|x| x.abs()).fold(1e-6, f64::max);
            assert!(w.iter().zip(&g).all(|(a, b)| (a - b).abs() <= 1e-5 * scale));
        }
    }
    std::fs::remove_file(path).ok();
}

fn load_bytes(bytes: Vec<u8>) -> Result<CompiledModel, ArtifactError> {
    CompiledModel::from_artifact(std::sync::Arc::new(bytes), &ArtifactOptions::new())
}

/// Damage anywhere is found before anything runs: every byte position class
/// (header fields, metadata, code, weights), truncation at every section,
/// bytes appended, another version, another kind of file.
#[test]
fn damaged_artifacts_are_errors() {
    let model = Model::load(fixture("bert"), &LoadOptions::new()).expect("loads");
    let cm = model.compile(&CompileOptions::new().threads(2)).expect("compiles");
    let path = scratch("damaged.anyshape");
    cm.save(&path).expect("saves");
    let good = std::fs::read(&path).expect("read");
    std::fs::remove_file(&path).ok();
    assert!(load_bytes(good.clone()).is_ok());
    let field = |at: usize| u64::from_le_bytes(good[at..at + 8].try_into().expect("8 bytes")) as usize;
    let (meta_len, code_len, weights_at, weights_len) = (field(16), field(24), field(32), field(40));
    assert_eq!(weights_at + weights_len, good.len());
    assert!(meta_len > 0 && code_len > 0 && weights_len > 0);

    // One flipped bit: in the header's sizes, the hashes, the metadata, the code
    // and the weights.
    let code_at = 112 + meta_len;
    let mut positions =
        vec![17, 25, 33, 41, 50, 90, 112, 112 + meta_len / 2, code_at, code_at + code_len / 2];
    positions.extend([weights_at, weights_at + weights_len / 2, good.len() - 1]);
    for at in positions {
        let mut bad = good.clone();
        bad[at] ^= 0x10;
        match load_bytes(bad) {
            Err(
                ArtifactError::Corrupted(_) | ArtifactError::Malformed(_) | ArtifactError::Truncated { .. },
            ) => {}
            Err(e) => panic!("byte {at}: unexpected error {e}"),
            Ok(_) => panic!("byte {at} flipped: loaded"),
        }
    }
    // Truncated anywhere.
    for len in [0, 7, 8, 11, 60, 112, code_at, weights_at - 1, weights_at + 1, good.len() - 1] {
        let e = load_bytes(good[..len].to_vec()).err().unwrap_or_else(|| panic!("{len} bytes loaded"));
        assert!(
            matches!(e, ArtifactError::Truncated { .. } | ArtifactError::NotAnArtifact),
            "{len} bytes: {e}"
        );
    }
    // Appended bytes.
    let mut long = good.clone();
    long.extend_from_slice(&[0; 100]);
    assert!(matches!(load_bytes(long), Err(ArtifactError::Malformed(_))));
    // Another format version: named.
    let mut other = good.clone();
    other[8..12].copy_from_slice(&(anyshape::FORMAT_VERSION + 1).to_le_bytes());
    let e = load_bytes(other).err().expect("another version");
    assert!(matches!(e, ArtifactError::Version { .. }), "{e}");
    assert!(e.to_string().contains("compile the model again"), "{e}");
    // An ONNX model is not an artifact.
    let onnx = std::fs::read(fixture("bert")).expect("read");
    assert!(matches!(load_bytes(onnx), Err(ArtifactError::NotAnArtifact)));
}

/// Through the file API, errors name the file and are the user's.
#[test]
fn missing_and_foreign_files() {
    let e = CompiledModel::load(scratch("absent.anyshape"), &ArtifactOptions::new()).err().expect("absent");
    assert!(e.to_string().contains("absent.anyshape"), "{e}");
    let e = CompiledModel::load(fixture("bert"), &ArtifactOptions::new()).err().expect("onnx");
    assert!(matches!(e, RunError::Artifact(ArtifactError::NotAnArtifact)), "{e}");
    assert!(e.is_user_error());
}

/// Compiled for AVX2 only: the artifact asks for no AVX-512 feature (it loads on
/// any AVX2 machine) and gives the interpreter's values.
#[test]
fn avx2_artifacts_need_no_avx512() {
    let model = Model::load(fixture("bert"), &LoadOptions::new()).expect("loads");
    let cm = model.compile(&CompileOptions::new().threads(2).isa(anyshape::Isa::Avx2)).expect("compiles");
    let path = scratch("bert-avx2.anyshape");
    cm.save(&path).expect("saves");
    let loaded = CompiledModel::load(&path, &ArtifactOptions::new()).expect("loads");
    let t = loaded.code_target();
    assert_eq!(t.cpu, "x86-64-v3");
    assert!(t.features.iter().all(|f| !f.starts_with("avx512")), "{:?}", t.features);
    assert!(t.features.iter().any(|f| f == "avx2") && t.features.iter().any(|f| f == "fma"));
    for (k, seq) in [1usize, 9, 33].iter().enumerate() {
        let ins = inputs(&model, &[("batch", 1 + k), ("seq", *seq)], 50 + k as u64);
        let named: Vec<(&str, Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let oracle = model.interpret(&named).expect("interpreter");
        for ((_, g), (_, o)) in run(&loaded, &ins).iter().zip(&oracle) {
            let (g, o) = (g.to_f64_vec(), o.to_f64_vec());
            let scale = o.iter().map(|x| x.abs()).fold(1e-6, f64::max);
            assert!(g.iter().zip(&o).all(|(a, b)| (a - b).abs() <= 1e-4 * scale));
        }
    }
    std::fs::remove_file(path).ok();
}
