//! Bad input gets a one-line error and exit code 2, never a panic: truncated or
//! garbage models, unsupported ops, wrong inputs, bad .npy files, contradictory
//! dim declarations.

use std::path::PathBuf;
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn bert() -> PathBuf {
    root().join("tests/fixtures/bert/model.onnx")
}

fn anyshape(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_anyshape")).args(args).output().expect("run anyshape")
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("anyshape-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    dir.join(name)
}

/// Exit code 2 and a single stderr line containing every fragment.
fn assert_user_error(out: &Output, fragments: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {err}");
    // (warnings the compile logs are not part of the error)
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty() && !l.contains(" WARN ")).collect();
    assert_eq!(lines.len(), 1, "expected one line, got: {err}");
    for f in fragments {
        assert!(lines[0].contains(f), "`{f}` not in: {}", lines[0]);
    }
}

fn bert_inputs(seq: usize) -> Vec<String> {
    let ids: Vec<String> = (0..seq).map(|i| (i % 90 + 1).to_string()).collect();
    let ones = vec!["1"; seq].join(",");
    let zeros = vec!["0"; seq].join(",");
    vec![
        format!("--input=input_ids={}", ids.join(",")),
        format!("--shape=input_ids=1x{seq}"),
        format!("--input=attention_mask={ones}"),
        format!("--shape=attention_mask=1x{seq}"),
        format!("--input=token_type_ids={zeros}"),
        format!("--shape=token_type_ids=1x{seq}"),
    ]
}

fn run_bert(extra: &[&str], inputs: &[String]) -> Output {
    let b = bert();
    let mut args = vec!["run", b.to_str().unwrap_or_default()];
    args.extend(extra);
    args.extend(inputs.iter().map(String::as_str));
    anyshape(&args)
}

#[test]
fn good_run_succeeds_and_writes_outputs() {
    let dir = tmp("outs");
    let out = run_bert(&["--output-dir", dir.to_str().unwrap_or_default()], &bert_inputs(5));
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("last_hidden_state: f32 [1, 5, 32]"), "{stdout}");
    assert!(dir.join("last_hidden_state.npy").is_file());
    assert!(dir.join("pooler_output.npy").is_file());
}

#[test]
fn garbage_model() {
    let p = tmp("garbage.onnx");
    std::fs::write(&p, b"this is not a protobuf at all \xff\xff\xff\xff").expect("write");
    let out = anyshape(&["inspect", p.to_str().unwrap_or_default()]);
    assert_user_error(&out, &["not a valid ONNX model"]);
}

#[test]
fn truncated_model() {
    let bytes = std::fs::read(bert()).expect("bert");
    for cut in [1, 10, 100, bytes.len() / 3, bytes.len() - 7] {
        let p = tmp(&format!("trunc{cut}.onnx"));
        std::fs::write(&p, &bytes[..cut]).expect("write");
        let out = anyshape(&["inspect", p.to_str().unwrap_or_default()]);
        assert_user_error(&out, &["not a valid ONNX model"]);
    }
}

#[test]
fn empty_and_missing_model_files() {
    let p = tmp("empty.onnx");
    std::fs::write(&p, b"").expect("write");
    assert_user_error(&anyshape(&["inspect", p.to_str().unwrap_or_default()]), &["empty"]);
    assert_user_error(
        &anyshape(&["inspect", "/no/such/model.onnx"]),
        &["cannot read", "/no/such/model.onnx"],
    );
}

/// A model with one node of an op anyshape does not import.
fn model_with_op(op: &str) -> Vec<u8> {
    use anyshape_onnx_proto::*;
    let tensor_type = |name: &str| ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(1),
                shape: Some(TensorShapeProto {
                    dim: vec![tensor_shape_proto::Dimension {
                        value: Some(tensor_shape_proto::dimension::Value::DimParam("n".into())),
                    }],
                }),
            })),
        }),
    };
    let model = ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(17) }],
        graph: Some(GraphProto {
            node: vec![NodeProto {
                input: vec!["x".into()],
                output: vec!["y".into()],
                name: Some("my_node".into()),
                op_type: Some(op.into()),
                ..Default::default()
            }],
            input: vec![tensor_type("x")],
            output: vec![tensor_type("y")],
            ..Default::default()
        }),
        ..Default::default()
    };
    prost::Message::encode_to_vec(&model)
}

mod anyshape_onnx_proto {
    pub use anyshape_onnx::proto::*;
}

#[test]
fn unsupported_operator_names_op_node_and_opset() {
    let p = tmp("unsupported.onnx");
    std::fs::write(&p, model_with_op("NonMaxSuppression")).expect("write");
    let out = anyshape(&["inspect", p.to_str().unwrap_or_default()]);
    assert_user_error(&out, &["unsupported operator", "NonMaxSuppression", "my_node", "opset 17"]);
}

#[test]
fn missing_and_extra_inputs() {
    let inputs = bert_inputs(3);
    let out = run_bert(&[], &inputs[..4]);
    assert_user_error(&out, &["missing input 'token_type_ids'"]);
    let mut more = inputs.clone();
    more.push("--input=bogus=1,2".into());
    // An inline input for a name the model lacks is refused before running.
    assert_user_error(&run_bert(&[], &more), &["no input 'bogus'"]);
}

#[test]
fn wrong_rank_dtype_and_shape() {
    let mut inputs = bert_inputs(3);
    inputs[1] = "--shape=input_ids=3".into();
    assert_user_error(&run_bert(&[], &inputs), &["input 'input_ids'", "rank 2"]);

    // attention_mask with a different seq than input_ids: names the input, dim and rule.
    let mut inputs = bert_inputs(3);
    inputs[2] = "--input=attention_mask=1,1,1,1".into();
    inputs[3] = "--shape=attention_mask=1x4".into();
    assert_user_error(&run_bert(&[], &inputs), &["input 'attention_mask' dim 1", "seq"]);

    // A float .npy where the model wants int64.
    let f = tmp("float_ids.npy");
    let t = anyshape::Tensor::new(vec![1, 3], anyshape::Elems::F32(vec![1.0, 2.0, 3.0])).expect("tensor");
    anyshape::npy::write(&f, &t).expect("npy");
    let mut inputs = bert_inputs(3);
    inputs[0] = format!("--input=input_ids={}", f.display());
    inputs.remove(1);
    assert_user_error(&run_bert(&[], &inputs), &["input 'input_ids' must be i64", "got f32"]);
}

#[test]
fn bad_npy_files() {
    let bad_header = tmp("bad_header.npy");
    std::fs::write(&bad_header, b"\x93NUMPY\x01\x00\x10\x00{'descr': <broken").expect("write");
    let trunc = tmp("truncated.npy");
    let good = tmp("good.npy");
    let t = anyshape::Tensor::new(vec![1, 64], anyshape::Elems::I64((0..64).collect())).expect("tensor");
    anyshape::npy::write(&good, &t).expect("npy");
    let bytes = std::fs::read(&good).expect("read");
    std::fs::write(&trunc, &bytes[..bytes.len() - 100]).expect("write");
    for (file, what) in [(bad_header, "not a valid .npy"), (trunc, "truncated.npy")] {
        let mut inputs = bert_inputs(3);
        inputs[0] = format!("--input=input_ids={}", file.display());
        inputs.remove(1);
        assert_user_error(&run_bert(&[], &inputs), &[what]);
    }
}

#[test]
fn dim_declarations() {
    let b = bert();
    let b = b.to_str().unwrap_or_default();
    // A range the fixture's position table cannot serve contradicts the model.
    assert_user_error(&anyshape(&["inspect", b, "--dim", "seq=100..200"]), &["seq"]);
    assert_user_error(&anyshape(&["inspect", b, "--dim", "nosuchdim=1..4"]), &["nosuchdim", "no dim named"]);
    assert_user_error(&anyshape(&["inspect", b, "--dim", "seq=9..3"]), &["seq=9..3"]);
    assert_user_error(&anyshape(&["inspect", b, "--dim", "seq"]), &["NAME=LO..HI"]);
    // A run outside a declared range names the symbol and the range.
    let out = run_bert(&["--dim", "seq=1..4"], &bert_inputs(5));
    assert_user_error(&out, &["seq", "1..4"]);
    // A good declaration shows in the facts.
    let out = anyshape(&["inspect", b, "--dim", "seq=1..32"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("sym seq user 1..32"));
}

#[test]
fn absurd_bench_shapes_are_errors_not_aborts() {
    let model = bert();
    let model = model.to_string_lossy();
    // Past what an allocation can hold at all (and past what a usize can count).
    for shape in ["batch=1,seq=2000000000000000000", "batch=3000000000000,seq=4000000000"] {
        let out = anyshape(&["bench", &model, "--shape", shape, "--runs", "1"]);
        assert_user_error(&out, &["--shape", "input 'input_ids'", "more than can be allocated"]);
    }
    // Within what can be allocated, the model's own range says no.
    let out = anyshape(&["bench", &model, "--shape", "batch=1,seq=1000", "--runs", "1"]);
    assert_user_error(&out, &["input 'input_ids'", "seq = 1000", "range"]);
}

#[test]
fn bad_flags() {
    assert_user_error(&anyshape(&["run", "x.onnx", "--input", "noequals"]), &["cannot read"]);
    let out = anyshape(&["frobnicate"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn inspect_shows_symbolic_shapes() {
    let b = bert();
    let out = anyshape(&["inspect", b.to_str().unwrap_or_default(), "--stage", "shapes"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("input %input_ids: i64[batch, seq]"), "{text}");
    assert!(text.contains("f32[batch, seq, 32]"));
    assert!(text.contains("sym batch param"));
}

/// A decoder step named as optimum names it: the cache's `past_sequence_length`,
/// the new tokens' `sequence_length`, and the mask's `past_sequence_length +
/// sequence_length`, an expression of the two.
fn decoder_step() -> Vec<u8> {
    use anyshape_onnx_proto::*;
    use tensor_shape_proto::dimension::Value;
    let tensor = |name: &str, elem: i32, dims: &[&str]| ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(elem),
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|d| tensor_shape_proto::Dimension {
                            value: Some(match d.parse::<i64>() {
                                Ok(v) => Value::DimValue(v),
                                Err(_) => Value::DimParam(d.to_string()),
                            }),
                        })
                        .collect(),
                }),
            })),
        }),
    };
    let node = |op: &str, inputs: &[&str], output: &str, attribute: Vec<AttributeProto>| NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        name: Some(output.into()),
        op_type: Some(op.into()),
        attribute,
        ..Default::default()
    };
    let int = |name: &str, i: i64| AttributeProto {
        name: Some(name.into()),
        r#type: Some(2),
        i: Some(i),
        ..Default::default()
    };
    let mask = "past_sequence_length + sequence_length";
    let model = ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(17) }],
        graph: Some(GraphProto {
            node: vec![
                node("Relu", &["new"], "key", vec![]),
                node("Concat", &["past_key", "key"], "present", vec![int("axis", 1)]),
                node("Cast", &["attention_mask"], "m", vec![int("to", 1)]),
                node("ReduceSum", &["m"], "mask_sum", vec![int("keepdims", 0)]),
            ],
            input: vec![
                tensor("new", 1, &["batch_size", "sequence_length", "4"]),
                tensor("past_key", 1, &["batch_size", "past_sequence_length", "4"]),
                tensor("attention_mask", 7, &["batch_size", mask]),
            ],
            output: vec![tensor("present", 1, &["batch_size", mask, "4"]), tensor("mask_sum", 1, &[])],
            ..Default::default()
        }),
        ..Default::default()
    };
    prost::Message::encode_to_vec(&model)
}

/// The CLI asks for the model's own symbols only (the mask's length is their
/// sum), the first step's empty cache runs with no `--dim`, and a mask of the
/// wrong length is an error that names it.
#[test]
fn a_decoder_step_as_optimum_exports_it() {
    let p = tmp("decoder_step.onnx");
    std::fs::write(&p, decoder_step()).expect("write");
    let model = p.to_str().unwrap_or_default();
    let shape = "batch_size=2,sequence_length=3,past_sequence_length=0";
    let out = anyshape(&["bench", model, "--shape", shape, "--runs", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let out = anyshape(&["bench", model, "--shape", "batch_size=2,sequence_length=3", "--runs", "2"]);
    assert_user_error(&out, &["no value for `past_sequence_length`"]);
    let empty = tmp("empty_cache.npy");
    let t = anyshape::Tensor::new(vec![1, 0, 4], anyshape::Elems::F32(vec![])).expect("tensor");
    anyshape::npy::write(&empty, &t).expect("npy");
    let run = |mask: &str| {
        let n = mask.split(',').count();
        anyshape(&[
            "run",
            model,
            "--input=new=1,2,3,4",
            "--shape=new=1x1x4",
            &format!("--input=past_key={}", empty.display()),
            &format!("--input=attention_mask={mask}"),
            &format!("--shape=attention_mask=1x{n}"),
        ])
    };
    let out = run("1");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_user_error(&run("1,1"), &["input 'attention_mask' dim 1", "past_sequence_length+sequence_length"]);
}

/// `--device cuda` where there is no NVIDIA driver (or device): exit 2 and
/// one line saying so. Where there is one, the run succeeds.
#[test]
fn a_gpu_run_without_a_gpu_says_so() {
    let out = run_bert(&["--device", "cuda"], &bert_inputs(3));
    if out.status.success() {
        eprintln!("this machine has a GPU: the run succeeded");
        return;
    }
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "stderr: {err}");
    assert_eq!(err.lines().filter(|l| !l.trim().is_empty()).count(), 1, "{err}");
    assert!(err.contains("no NVIDIA driver") || err.contains("no CUDA device"), "{err}");
}

/// `--device gpu-emulator` runs the GPU's kernels on this machine and writes
/// the CPU's outputs (to the GPU's bf16 contractions: relative L2 error under
/// 3e-2, as the GPU backend's model tests); an artifact or `--interpret` with
/// a GPU device is refused.
#[test]
fn the_gpu_emulator_writes_the_cpus_outputs() {
    let (cpu, gpu) = (tmp("dev-cpu"), tmp("dev-gpu"));
    for (dir, device) in [(&cpu, "cpu"), (&gpu, "gpu-emulator")] {
        let d = dir.to_string_lossy().to_string();
        let out = run_bert(&["--device", device, "--output-dir", &d], &bert_inputs(5));
        assert!(out.status.success(), "{device}: {}", String::from_utf8_lossy(&out.stderr));
    }
    for name in ["last_hidden_state", "pooler_output"] {
        let read =
            |dir: &PathBuf| anyshape::npy::read(&dir.join(format!("{name}.npy"))).expect("npy").to_f64_vec();
        let (a, b) = (read(&cpu), read(&gpu));
        assert_eq!(a.len(), b.len(), "{name}");
        let num: f64 = a.iter().zip(&b).map(|(x, y)| (x - y) * (x - y)).sum();
        let den: f64 = a.iter().map(|x| x * x).sum();
        let err = (num / den.max(1e-30)).sqrt();
        assert!(err < 3e-2, "{name}: relative L2 error {err:e} between the CPU and the GPU emulator");
    }
    let out = run_bert(&["--device", "gpu-emulator", "--interpret"], &bert_inputs(2));
    assert_user_error(&out, &["--device"]);
}

/// `compile --device cuda` writes a GPU artifact (PTX, plan, weights):
/// `anyshape run` with `--device gpu-emulator` runs it and writes the CPU's
/// outputs (to the GPU's bf16 contractions); `anyshape-rt info` names its
/// GPUs; `anyshape-rt run` where there is no NVIDIA driver says so (exit 2,
/// one line); a CPU-only flag on it is refused.
#[test]
fn a_gpu_artifact_compiles_and_runs_without_the_compiler() {
    let dir = tmp("gpu-artifact");
    std::fs::create_dir_all(&dir).expect("dir");
    let art = dir.join("bert.anyshape").display().to_string();
    let b = bert().display().to_string();
    let out = anyshape(&["compile", &b, "--device", "cuda", "-o", &art]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("for sm_80"), "{out:?}");
    let (cpu, gpu) = (dir.join("cpu"), dir.join("gpu"));
    let mut args = vec!["run".to_string(), b.clone(), "--output-dir".into(), cpu.display().to_string()];
    args.extend(bert_inputs(4));
    let out = anyshape(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut args = vec!["run".to_string(), art.clone(), "--device".into(), "gpu-emulator".into()];
    args.extend(["--output-dir".to_string(), gpu.display().to_string()]);
    args.extend(bert_inputs(4));
    let out = anyshape(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for name in ["last_hidden_state", "pooler_output"] {
        let read =
            |d: &PathBuf| anyshape::npy::read(&d.join(format!("{name}.npy"))).expect("npy").to_f64_vec();
        let (a, g) = (read(&cpu), read(&gpu));
        let num: f64 = a.iter().zip(&g).map(|(x, y)| (x - y) * (x - y)).sum();
        let den: f64 = a.iter().map(|x| x * x).sum();
        assert!((num / den).sqrt() < 3e-2, "{name}: relative L2 error {}", (num / den).sqrt());
    }
    let rt =
        |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_anyshape-rt")).args(args).output().expect("runs");
    let info = rt(&["info", &art]);
    assert!(info.status.success(), "{info:?}");
    let text = String::from_utf8_lossy(&info.stdout);
    assert!(text.contains("code for NVIDIA GPUs (sm_80)") && text.contains("input input_ids"), "{text}");
    let case = root().join("tests/fixtures/bert/case3");
    let npy = |n: &str| format!("--input={n}={}", case.join(format!("{n}.npy")).display());
    let out = rt(&["run", &art, &npy("input_ids"), &npy("attention_mask"), &npy("token_type_ids")]);
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(2), "stderr: {err}");
        assert_eq!(err.lines().filter(|l| !l.trim().is_empty()).count(), 1, "{err}");
        assert!(err.contains("no NVIDIA driver") || err.contains("no CUDA device"), "{err}");
    }
    assert_user_error(&anyshape(&["run", &art, "--interpret"]), &["GPU artifact"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A quantized model runs (its 8-bit contractions on the f32 engine, exactly)
/// with nothing on stderr; an int32 product of unbounded operands runs as a
/// loop program, and the compile says so on stderr (no terminal colours when
/// stderr is not a terminal).
#[test]
fn integer_contractions_that_stay_loops_are_a_warning() {
    let case = root().join("tests/fixtures-quantized/bert_int8/case1");
    let input = |n: &str| format!("{n}={}", case.join(format!("{n}.npy")).display());
    let model = root().join("tests/fixtures-quantized/bert_int8/model.onnx");
    let (ids, mask, types) = (input("input_ids"), input("attention_mask"), input("token_type_ids"));
    let model = model.to_str().expect("path");
    let out = anyshape(&["run", model, "--input", &ids, "--input", &mask, "--input", &types]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stderr: {err}");
    assert!(!err.contains("WARN"), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("last_hidden_state: f32 [1, 7, 32]"));
    let model = root().join("tests/fixtures-quantized/int32_matmul.onnx");
    let args = ["--input", "a=1,2,3,4", "--shape", "a=2x2", "--input", "b=5,6,7,8", "--shape", "b=2x2"];
    let out = anyshape(&[&["run", model.to_str().expect("path")][..], &args].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stderr: {err}");
    assert!(err.contains("WARN") && err.contains("1 integer contractions run as loop programs"), "{err}");
    assert!(!err.contains('\u{1b}'), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout)
        .contains("y: i32 [2, 2] [19.000000, 22.000000, 43.000000, 50.000000]"));
}
