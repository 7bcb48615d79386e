//! ONNX conformance: runs the backend node test cases shipped in the `onnx`
//! Python package (`onnx/backend/test/data/node/*`) through anyshape and prints
//! passed / failed / skipped per operator.
//!
//! A case is *skipped* when its model uses something anyshape does not import
//! (an operator, an element type, an opset): the reason is printed. Every other
//! case must pass — outputs equal to the expected ones within the ONNX backend's
//! tolerance (rtol 1e-3, atol 1e-7; exact for integers and bools) — unless it is
//! listed with a reason in the expected-failures file. A listed case that passes
//! is reported too, so the list cannot go stale. Exit code 1 on any surprise.
//! With `--node-compiled` each case also runs compiled (canary margins on), and
//! its compiled outputs must pass the same comparison.
//!
//! Usage: `anyshape-conformance NODE_DIR [--expected FILE] [--filter SUBSTR] [--node-compiled] [-v]`

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use anyhow::{Context, Result};
use anyshape::{LoadOptions, Model, Tensor};
use clap::Parser;
use prost::Message;

#[derive(Parser)]
struct Args {
    /// The folder of node tests (…/site-packages/onnx/backend/test/data/node).
    node_dir: PathBuf,
    /// Cases expected to fail: one `test_name  # reason` a line.
    #[arg(long)]
    expected: Option<PathBuf>,
    /// Only cases whose name contains this.
    #[arg(long)]
    filter: Option<String>,
    /// Print every failing case's message (they are always printed for surprises).
    #[arg(short, long)]
    verbose: bool,
    /// Also run the `light_*.onnx` CNN models of this folder (…/onnx/backend/test/data/light).
    #[arg(long)]
    light: Option<PathBuf>,
    /// With --light: run only these models (comma-separated, e.g. `squeezenet,shufflenet`);
    /// the others are imported and their output shapes checked. Default: run all.
    #[arg(long, value_delimiter = ',')]
    light_run: Option<Vec<String>>,
    /// With --light: also compile every model (the ones only imported too) and
    /// compare the compiled output with the expected one, canary margins on.
    #[arg(long)]
    light_compiled: bool,
    /// Also compile every node test that the interpreter passes and compare the
    /// compiled outputs (canary margins on) with the expected ones.
    #[arg(long)]
    node_compiled: bool,
}

enum Outcome {
    Pass,
    Fail(String),
    Skip(String),
}

#[derive(Default)]
struct Tally {
    passed: usize,
    failed: usize,
    expected_fail: usize,
    skipped: usize,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let expected = match &args.expected {
        Some(p) => read_expected(p)?,
        None => HashMap::new(),
    };
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&args.node_dir)
        .with_context(|| format!("cannot list {}", args.node_dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("model.onnx").is_file())
        .filter(|p| {
            args.filter
                .as_ref()
                .is_none_or(|f| p.file_name().is_some_and(|n| n.to_string_lossy().contains(f.as_str())))
        })
        .collect();
    cases.sort();
    let mut light_failed = 0;
    if let Some(dir) = &args.light {
        light_failed = run_light(dir, args.light_run.as_deref(), args.light_compiled)?;
    }
    let mut per_op: BTreeMap<String, Tally> = BTreeMap::new();
    let mut surprises = Vec::new();
    let mut skip_reasons: BTreeMap<String, usize> = BTreeMap::new();
    // The cases run on every core (each mostly LLVM compiling it), their outcomes
    // tallied in order.
    let outcomes: Vec<Mutex<Option<Outcome>>> = cases.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(dir) = cases.get(i) else { break };
                let outcome =
                    std::panic::catch_unwind(|| run_case(dir, args.node_compiled)).unwrap_or_else(|p| {
                        let msg = p
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default();
                        Outcome::Fail(format!("PANIC: {msg}"))
                    });
                *outcomes[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome);
            });
        }
    });
    for (dir, outcome) in cases.iter().zip(outcomes) {
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let op = operator_of(&args.node_dir, &name);
        let outcome = outcome
            .into_inner()
            .unwrap_or_else(|e| e.into_inner())
            .unwrap_or_else(|| Outcome::Fail("not run".into()));
        let t = per_op.entry(op).or_default();
        match outcome {
            Outcome::Pass => {
                t.passed += 1;
                if let Some(why) = expected.get(&name) {
                    surprises.push(format!("{name}: passes but is listed as an expected failure ({why}); remove it from the list"));
                }
            }
            Outcome::Fail(msg) => {
                if expected.contains_key(&name) {
                    t.expected_fail += 1;
                    if args.verbose {
                        println!("expected failure {name}: {msg}");
                    }
                } else {
                    t.failed += 1;
                    surprises.push(format!("{name}: {msg}"));
                }
            }
            Outcome::Skip(why) => {
                t.skipped += 1;
                *skip_reasons.entry(why).or_default() += 1;
            }
        }
    }
    // Operators with at least one case that ran.
    println!("{:<28} {:>6} {:>6} {:>9} {:>7}", "operator", "passed", "failed", "exp.fail", "skipped");
    let mut total = Tally::default();
    for (op, t) in &per_op {
        total.passed += t.passed;
        total.failed += t.failed;
        total.expected_fail += t.expected_fail;
        total.skipped += t.skipped;
        if t.passed + t.failed + t.expected_fail > 0 {
            println!("{op:<28} {:>6} {:>6} {:>9} {:>7}", t.passed, t.failed, t.expected_fail, t.skipped);
        }
    }
    let unsupported: Vec<&String> =
        per_op.iter().filter(|(_, t)| t.passed + t.failed + t.expected_fail == 0).map(|(op, _)| op).collect();
    println!("\noperators with no runnable case (not imported or unsupported types): {}", unsupported.len());
    println!("skip reasons:");
    for (why, n) in &skip_reasons {
        println!("  {n:>4}  {why}");
    }
    for s in &surprises {
        println!("UNEXPECTED {s}");
    }
    let failed = total.failed + surprises.iter().filter(|s| s.contains("passes but")).count() + light_failed;
    println!(
        "\nconformance: {} passed, {} failed, {} skipped ({} expected failures)",
        total.passed, failed, total.skipped, total.expected_fail
    );
    if failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}

/// The CNN models of onnx's `light` folder: weights are `ConstantOfShape` nodes,
/// the input is `arange(n) / n` (as onnx's own runner feeds it), the expected
/// output is `<model>_output_0.pb`. Returns the number of failures.
fn run_light(dir: &Path, run_only: Option<&[String]>, compiled: bool) -> Result<usize> {
    let mut models: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "onnx"))
        .collect();
    models.sort();
    let mut failed = 0;
    for path in models {
        let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let import_only = run_only.is_some_and(|names| !names.iter().any(|n| name.ends_with(n.as_str())));
        let start = std::time::Instant::now();
        let result = (|| -> Result<String, String> {
            let model = Model::load(&path, &LoadOptions::new()).map_err(|e| format!("import: {e}"))?;
            let want = read_tensor(&dir.join(format!("{name}_output_0.pb")))?;
            let out = model.outputs();
            let out_ty = &out.first().ok_or("no output")?.ty;
            let shape: Vec<i64> = want.shape().iter().map(|d| *d as i64).collect();
            if out_ty.const_shape().as_deref() != Some(&shape[..]) {
                return Err(format!("output type {out_ty}, expected shape {shape:?}"));
            }
            if import_only && !compiled {
                return Ok(format!("imported, output {out_ty}"));
            }
            let mut inputs = Vec::new();
            for i in model.inputs() {
                let dims: Vec<usize> =
                    i.ty.shape.iter().map(|d| d.as_const().unwrap_or(1).max(0) as usize).collect();
                let n: usize = dims.iter().product();
                let t = Tensor::new(
                    dims,
                    anyshape::Elems::F32((0..n).map(|k| (k as f64 / n as f64) as f32).collect()),
                )
                .map_err(|e| e.to_string())?;
                inputs.push((i.name, t));
            }
            let named: Vec<(&str, Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
            let mut how = Vec::new();
            if !import_only {
                let got = model.interpret(&named).map_err(|e| format!("run: {e}"))?;
                compare(&got[0].1, &want)?;
                how.push("interpreted");
            }
            if compiled {
                let opts = anyshape::CompileOptions::new().threads(2).canaries(true);
                let cm = model.compile(&opts).map_err(|e| format!("compile: {e}"))?;
                let got = cm.run(&named).map_err(|e| format!("compiled run: {e}"))?;
                compare(&got[0].1, &want).map_err(|e| format!("compiled: {e}"))?;
                how.push("compiled");
            }
            Ok(format!("matches ({})", how.join(", ")))
        })();
        let secs = start.elapsed().as_secs_f64();
        match result {
            Ok(msg) => println!("light {name:<24} ok   {msg} ({secs:.1} s)"),
            Err(msg) => {
                failed += 1;
                println!("light {name:<24} FAIL {msg}");
            }
        }
    }
    Ok(failed)
}

fn read_expected(path: &Path) -> Result<HashMap<String, String>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut m = HashMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, why) = line.split_once('#').map(|(a, b)| (a.trim(), b.trim())).unwrap_or((line, ""));
        anyhow::ensure!(!why.is_empty(), "{}: `{name}` needs a reason after `#`", path.display());
        m.insert(name.to_string(), why.to_string());
    }
    Ok(m)
}

/// The operator a case tests: its model's first node, or for `*_expanded`
/// cases (the op's function body), the op of the case it expands.
fn operator_of(node_dir: &Path, name: &str) -> String {
    let base = name.find("_expanded").map(|i| &name[..i]).unwrap_or(name);
    let model = node_dir.join(base).join("model.onnx");
    let model = if model.is_file() { model } else { node_dir.join(name).join("model.onnx") };
    std::fs::read(&model)
        .ok()
        .and_then(|b| onnx::proto::ModelProto::decode(&b[..]).ok())
        .and_then(|m| m.graph)
        .and_then(|g| g.node.first().and_then(|n| n.op_type.clone()))
        .unwrap_or_else(|| "?".into())
}

fn read_tensor(path: &Path) -> Result<Tensor, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let t = onnx::proto::TensorProto::decode(bytes::Bytes::from(bytes))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let data = onnx::tensor_data(&t, &mut onnx::ExternalData::new(None)).map_err(|e| e.to_string())?;
    Ok(data.to_tensor())
}

/// Import a case; when a shape parameter (axes, pads, a target shape) comes from
/// an input, try again with the small (rank <= 1) inputs frozen to their test
/// values, as a user would freeze them. Returns the model and its inputs.
fn load_case(dir: &Path, data: &Path) -> Result<(Model, Vec<(String, Tensor)>), Outcome> {
    let classify = |e: anyshape::Error| match e {
        anyshape::Error::Import(e) => match &e {
            onnx::OnnxError::UnsupportedOp { op, domain, .. } => {
                Outcome::Skip(format!("operator {domain}::{op}"))
            }
            onnx::OnnxError::UnsupportedDType { dtype, .. } => Outcome::Skip(format!("element type {dtype}")),
            onnx::OnnxError::UnsupportedOpset { version } => Outcome::Skip(format!("opset {version}")),
            onnx::OnnxError::UnsupportedType { kind, .. } => Outcome::Skip(format!("{kind} value")),
            _ => Outcome::Fail(format!("import: {e}")),
        },
        e => Outcome::Fail(format!("load: {e}")),
    };
    let read_inputs = |names: &[String]| -> Result<Vec<(String, Tensor)>, Outcome> {
        let mut values = Vec::new();
        for (i, n) in names.iter().enumerate() {
            let t = read_tensor(&data.join(format!("input_{i}.pb")))
                .map_err(|e| Outcome::Fail(format!("reading input {i}: {e}")))?;
            values.push((n.clone(), t));
        }
        Ok(values)
    };
    match Model::load(dir.join("model.onnx"), &LoadOptions::new()) {
        Ok(m) => {
            let names: Vec<String> = m.inputs().into_iter().map(|i| i.name).collect();
            let values = read_inputs(&names)?;
            Ok((m, values))
        }
        Err(anyshape::Error::Import(onnx::OnnxError::Node { msg, .. }))
            if msg.contains("depends on tensor data")
                || msg.contains("needs constant")
                || msg.contains("must be a constant") =>
        {
            let proto =
                onnx::read_model(&dir.join("model.onnx")).map_err(|e| Outcome::Fail(format!("read: {e}")))?;
            let graph = proto.graph.unwrap_or_default();
            let inits: Vec<String> = graph.initializer.iter().filter_map(|t| t.name.clone()).collect();
            let names: Vec<String> =
                graph.input.iter().filter_map(|i| i.name.clone()).filter(|n| !inits.contains(n)).collect();
            let values = read_inputs(&names)?;
            let mut opts = LoadOptions::new();
            let (frozen, rest): (Vec<_>, Vec<_>) =
                values.into_iter().partition(|(_, t)| t.shape().len() <= 1);
            for (n, t) in &frozen {
                opts = opts.freeze(n, t);
            }
            Model::load(dir.join("model.onnx"), &opts).map(|m| (m, rest)).map_err(classify)
        }
        Err(e) => Err(classify(e)),
    }
}

fn run_case(dir: &Path, compiled: bool) -> Outcome {
    let data = dir.join("test_data_set_0");
    let (model, values) = match load_case(dir, &data) {
        Ok(x) => x,
        Err(o) => return o,
    };
    let inputs: Vec<(&str, Tensor)> = values.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let outputs = match model.interpret(&inputs) {
        Ok(o) => o,
        Err(e) => return Outcome::Fail(format!("run: {e}")),
    };
    if let Some(fail) = check_outputs(&data, &outputs, "") {
        return fail;
    }
    if compiled {
        let opts = anyshape::CompileOptions::new().threads(2).canaries(true);
        let cm = match model.compile(&opts) {
            Ok(cm) => cm,
            Err(e) => return Outcome::Fail(format!("compile: {e}")),
        };
        let outputs = match cm.run(&inputs) {
            Ok(o) => o,
            Err(e) => return Outcome::Fail(format!("compiled run: {e}")),
        };
        if let Some(fail) = check_outputs(&data, &outputs, "compiled ") {
            return fail;
        }
    }
    Outcome::Pass
}

/// The first output that differs from the case's `output_<i>.pb`, as a failure.
fn check_outputs(data: &Path, outputs: &[(String, Tensor)], how: &str) -> Option<Outcome> {
    for (i, (name, got)) in outputs.iter().enumerate() {
        let want = match read_tensor(&data.join(format!("output_{i}.pb"))) {
            Ok(t) => t,
            Err(e) => return Some(Outcome::Fail(format!("reading output {i}: {e}"))),
        };
        if let Err(msg) = compare(got, &want) {
            return Some(Outcome::Fail(format!("{how}output '{name}': {msg}")));
        }
    }
    None
}

fn compare(got: &Tensor, want: &Tensor) -> Result<(), String> {
    if got.shape() != want.shape() {
        return Err(format!("shape {:?}, expected {:?}", got.shape(), want.shape()));
    }
    if got.dtype() != want.dtype() {
        return Err(format!("dtype {}, expected {}", got.dtype(), want.dtype()));
    }
    let exact = !want.dtype().is_float();
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let ok = if exact {
            a == b
        } else if b.is_nan() {
            a.is_nan()
        } else if b.is_infinite() {
            a == b
        } else {
            (a - b).abs() <= 1e-7 + 1e-3 * b.abs()
        };
        if !ok {
            return Err(format!("element {i} is {a}, expected {b}"));
        }
    }
    Ok(())
}
