//! `anyshape bench MODEL.onnx --shape batch=1,seq=17 ...`: compile once, then per
//! shape the first call (binding, planning the shape, running) and the median of
//! warm calls. Inputs are synthetic: token ids below 90, masks of ones, zeros
//! for other integer inputs, a fixed pseudo-random pattern for floats.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use anyshape::{CompileOptions, Tensor};

use crate::common::{ms, parse_shape_args, pause_arg, synthetic_inputs, time_calls, time_once, time_runs};
use crate::UserError;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// The ONNX model file, or an artifact from `anyshape compile`.
    model: PathBuf,
    /// A shape to time: values of the model's symbols, e.g. batch=1,seq=17
    /// (repeatable); a range (seq=100..131) stands for each of its values.
    #[arg(long = "shape", value_name = "SYM=N,...", required = true)]
    shapes: Vec<String>,
    /// Call each shape once, in the order given, with no warm calls: each
    /// call the first at its shape, its input made before the clock starts
    /// (a decoder's steps, each at a longer cache). Reports each call and
    /// the median.
    #[arg(long)]
    once: bool,
    /// Declare the range of a symbolic dim: NAME=LO..HI.
    #[arg(long = "dim", value_name = "NAME=LO..HI")]
    dims: Vec<String>,
    /// Threads of the compiled model (default: every core).
    #[arg(long)]
    threads: Option<usize>,
    /// Warm calls timed per shape (the median is reported).
    #[arg(long, default_value_t = 20)]
    runs: usize,
    /// Print one JSON object per shape.
    #[arg(long)]
    json: bool,
    /// Also time every step over the warm calls and print the time per kind of
    /// group (contraction, attention, stitch, element-wise, ...), split into
    /// matmuls, loops and fused attention kernels, and the time outside kernels.
    #[arg(long)]
    profile: bool,
    /// Run attention as its three steps (matmul, softmax, matmul) instead of the
    /// fused kernel: the unfused path, to compare.
    #[arg(long)]
    unfused_attention: bool,
    #[command(flatten)]
    chunks: crate::common::KeyChunksArg,
    #[command(flatten)]
    precision: crate::common::PrecisionArg,
    /// Compile every module with LLVM instead of taking its object from the
    /// object cache (a cold compile; the objects are not stored either)
    #[arg(long)]
    no_object_cache: bool,
    /// Dispatch by the analytical model alone, without measuring each weight
    /// matmul's best schedules at 1, 2, 4, ..., 64 rows at compile time (which is on
    /// by default and cached per machine)
    #[arg(long)]
    no_measured_dispatch: bool,
    /// With --profile, also list the N steps that take longest (median ms,
    /// the step's kind, its program or matmul, its group)
    #[arg(long, default_value_t = 0)]
    top: usize,
    /// Also time --runs calls that each follow this many milliseconds of idle
    /// sleep (how a server between sporadic requests sees the model), and report
    /// their median.
    #[arg(long, value_name = "MS")]
    pause: Option<f64>,
    /// On a GPU: time calls whose inputs (uploaded once) and outputs stay in
    /// device memory, as a server holding its tensors there (a decoder's KV
    /// cache) calls the model, instead of copies through the host.
    #[arg(long)]
    on_device: bool,
    /// Where the model runs: `cpu`, `cuda` (NVIDIA GPU 0), or `gpu-emulator`
    /// (the GPU's kernels on this machine's threads: correct, not fast).
    #[arg(long, value_enum, default_value_t = crate::devices::DeviceArg::Cpu)]
    device: crate::devices::DeviceArg,
}

/// Per kind of group, the median over `runs` calls of its matmul and loop time.
fn profile(cm: &anyshape::CompiledModel, named: &[(&str, Tensor)], runs: usize, top: usize) -> Result<()> {
    let plan = cm.plan();
    let mut kind_of = vec![String::new(); plan.steps.len()];
    for g in &plan.groups {
        for s in g.steps.clone() {
            kind_of[s] = g.kind.to_string();
        }
    }
    let mut rows: Vec<(String, &str)> = Vec::new();
    for (i, st) in plan.steps.iter().enumerate() {
        let what = st.kind.name();
        if !rows.iter().any(|(k, w)| *k == kind_of[i] && *w == what) {
            rows.push((kind_of[i].clone(), what));
        }
    }
    let mut per: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    let mut per_step: Vec<Vec<f64>> = vec![Vec::new(); plan.steps.len()];
    let mut outside = Vec::new();
    let mut totals = Vec::new();
    for _ in 0..runs {
        let (outs, p) = cm.run_profiled(named).map_err(anyshape::Error::from)?;
        cm.recycle(outs);
        let mut sums = vec![0.0; rows.len()];
        for (i, d) in p.steps.iter().enumerate() {
            per_step[i].push(ms(*d));
            let what = plan.steps[i].kind.name();
            let r = rows.iter().position(|(k, w)| *k == kind_of[i] && *w == what).unwrap_or(0);
            sums[r] += ms(*d);
        }
        let total = ms(p.total);
        outside.push(total - sums.iter().sum::<f64>());
        totals.push(total);
        for (r, v) in sums.into_iter().enumerate() {
            per[r].push(v);
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let total = med(&mut totals);
    for ((kind, what), v) in rows.iter().zip(per.iter_mut()) {
        let m = med(v);
        say!("  {kind:<12} {what:<7} {m:9.3} ms  {:5.1}%", 100.0 * m / total);
    }
    let o = med(&mut outside);
    say!(
        "  {:<20} {o:9.3} ms  {:5.1}%  (binding, planning lookup, outputs, between steps)",
        "outside kernels",
        100.0 * o / total
    );
    if top > 0 {
        let bytes = cm.step_bytes(named).map_err(anyshape::Error::from)?;
        let mut steps: Vec<(f64, usize)> = per_step.iter_mut().map(med).zip(0..).collect();
        steps.sort_by(|a, b| b.0.total_cmp(&a.0));
        say!("  slowest steps (GB/s: the bytes of the step's buffers over its time):");
        for (m, i) in steps.into_iter().take(top) {
            let what = crate::common::step_text(plan, i);
            // Bytes per ns = GB/s.
            let gbs = bytes[i] as f64 / (m * 1e6);
            say!(
                "  {m:9.3} ms {:5.1}% {gbs:6.1} GB/s  step {i:<4} {:<12} {what}",
                100.0 * m / total,
                kind_of[i]
            );
        }
    }
    Ok(())
}

pub fn bench(a: BenchArgs) -> Result<()> {
    let shapes = parse_shape_args(&a.shapes)?;
    let pause = pause_arg(a.pause)?;
    if a.once && (a.profile || a.json || a.pause.is_some() || a.on_device) {
        bail!(UserError(
            "--once times single calls: no --profile, --json, --pause or --on-device with it".into()
        ));
    }
    if a.device != crate::devices::DeviceArg::Cpu || anyshape::gpu::is_gpu_artifact(&a.model) {
        return bench_gpu(&a, &shapes);
    }
    if a.on_device {
        bail!(UserError("--on-device is for a GPU (--device cuda or gpu-emulator)".into()));
    }
    let start = Instant::now();
    let (cm, what) = if runtime::is_artifact(&a.model) {
        let precision = !a.precision.is_default();
        if !a.dims.is_empty()
            || a.unfused_attention
            || a.no_object_cache
            || a.no_measured_dispatch
            || precision
        {
            bail!(UserError(
                "--dim, --unfused-attention, --no-object-cache, --no-measured-dispatch, --precision and \
                 --int8 apply when compiling an ONNX model; an artifact is compiled already"
                    .into()
            ));
        }
        (
            crate::common::load_artifact(&a.model, a.threads)?.with_key_chunks(a.chunks.key_chunks),
            "loaded the artifact",
        )
    } else {
        let model = crate::load(&a.model, &a.dims)?;
        let mut opts = a.precision.apply(
            CompileOptions::new()
                .fuse_attention(!a.unfused_attention)
                .key_chunks(a.chunks.key_chunks)
                .object_cache(!a.no_object_cache)
                .measured_dispatch(!a.no_measured_dispatch),
        );
        if let Some(t) = a.threads {
            opts = opts.threads(t);
        }
        (compile(&model, opts)?, "compiled")
    };
    let ready_ms = ms(start.elapsed());
    if !a.json {
        let c = cm.code_stats();
        let cache = match what {
            "compiled" => format!(
                "; {} of {} modules from the object cache",
                c.modules_from_cache,
                c.modules_from_cache + c.modules_compiled
            ),
            _ => String::new(),
        };
        say!("{what} in {ready_ms:.0} ms ({} threads{cache})", cm.threads());
    }
    if a.once {
        let run = |named: &[(&str, Tensor)]| -> Result<()> {
            cm.run(named).map(|outs| cm.recycle(outs)).map_err(|e| anyshape::Error::from(e).into())
        };
        return time_once(cm.inputs(), &shapes, &run);
    }
    for shape in &shapes {
        let data = synthetic_inputs(cm.inputs(), shape)?;
        let named: Vec<(&str, Tensor)> = data.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let t = time_calls(&cm, &named, a.runs, pause)?;
        if a.profile {
            profile(&cm, &named, a.runs.max(1), a.top)?;
        }
        say!("{}", t.report(shape, a.json, ready_ms));
    }
    Ok(())
}

/// `bench --device cuda|gpu-emulator`: the first call at each shape (which
/// plans it) and the median of the warm calls, each call host to host
/// (inputs copied in, outputs copied out).
fn bench_gpu(a: &BenchArgs, shapes: &[Vec<(String, usize)>]) -> Result<()> {
    if runtime::is_artifact(&a.model) {
        bail!(UserError("--device runs an ONNX model compiled here; an artifact holds CPU code".into()));
    }
    if a.pause.is_some() || a.unfused_attention || a.json {
        bail!(UserError("--pause, --unfused-attention and --json are for --device cpu so far".into()));
    }
    let start = Instant::now();
    let gm = if anyshape::gpu::is_gpu_artifact(&a.model) {
        let gm = crate::devices::open_gpu_artifact(&a.model, a.device)?;
        say!("loaded the artifact on {} in {:.0} ms", gm.device_name(), ms(start.elapsed()));
        gm
    } else {
        let model = crate::load(&a.model, &a.dims)?;
        let gm = crate::devices::compile_gpu(&model, a.device)?;
        say!("compiled for {} in {:.0} ms", gm.device_name(), ms(start.elapsed()));
        gm
    };
    if a.once {
        let run = |named: &[(&str, Tensor)]| -> Result<()> {
            gm.run(named).map(|_| ()).map_err(|e| anyshape::Error::from(e).into())
        };
        return time_once(gm.inputs(), shapes, &run);
    }
    for shape in shapes {
        let data = synthetic_inputs(gm.inputs(), shape)?;
        let named: Vec<(&str, Tensor)> = data.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let plan = || gm.plan_shape(&named).map_err(|e| anyshape::Error::from(e).into());
        let call = || gm.run(&named).map(|_| ()).map_err(|e| anyshape::Error::from(e).into());
        let report = if a.on_device {
            let (t, graph_ms) = gm.time_on_device(&named, a.runs)?;
            crate::common::on_device_report(t.report(shape, false, 0.0), false, graph_ms)
        } else {
            time_runs(&plan, &call, a.runs, None)?.report(shape, false, 0.0)
        };
        if a.profile {
            let profiles = (0..a.runs.max(1))
                .map(|_| gm.run_profiled(&named).map(|(_, p)| p))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(anyshape::Error::from)?;
            for line in crate::common::gpu_profile_lines(gm.plan(), &profiles, a.top) {
                say!("{line}");
            }
        }
        say!("{}", crate::common::with_device_memory(report, false, gm.device_memory()));
    }
    Ok(())
}

/// `inspect --stage kernels` (`dispatch` false) or `--stage dispatch --shape ...`:
/// compile, then print the kernels, or for each shape what a call runs.
pub fn inspect_compiled(
    model: &PathBuf,
    dispatch: bool,
    dims: &[String],
    shapes: &[String],
    threads: Option<usize>,
) -> Result<()> {
    let shapes = parse_shape_args(shapes)?;
    if dispatch && shapes.is_empty() {
        bail!(UserError("--stage dispatch needs --shape SYM=N,... (the shape to show)".into()));
    }
    let m = crate::load(model, dims)?;
    let mut opts = CompileOptions::new();
    if let Some(t) = threads {
        opts = opts.threads(t);
    }
    let cm = compile(&m, opts)?;
    if !dispatch {
        say!("# stage: kernels");
        say_raw!("{}", cm.kernels_text());
        return Ok(());
    }
    for shape in &shapes {
        let data = synthetic_inputs(cm.inputs(), shape)?;
        let named: Vec<(&str, Tensor)> = data.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let s: Vec<String> = shape.iter().map(|(k, v)| format!("{k}={v}")).collect();
        say!("# stage: dispatch at {}", s.join(","));
        say_raw!("{}", cm.dispatch_text(&named).map_err(anyshape::Error::from)?);
    }
    Ok(())
}

/// `inspect` on an artifact: what it keeps of the compiler's stages (the
/// lowered plan, the kernels, the dispatch at each `--shape`), without compiling.
pub fn inspect_artifact(
    path: &std::path::Path,
    stage: &str,
    dims: &[String],
    shapes: &[String],
    threads: Option<usize>,
    dump_llvm: bool,
) -> Result<()> {
    if !dims.is_empty() || dump_llvm {
        bail!(UserError(
            "--dim and --dump-llvm apply to an ONNX model; an artifact is compiled already".into()
        ));
    }
    if !matches!(stage, "programs" | "kernels" | "dispatch") {
        bail!(UserError(format!(
            "an artifact keeps the stages programs, kernels and dispatch, not {stage} (inspect the ONNX model)"
        )));
    }
    let shapes = parse_shape_args(shapes)?;
    if stage == "dispatch" && shapes.is_empty() {
        bail!(UserError("--stage dispatch needs --shape SYM=N,... (the shape to show)".into()));
    }
    let cm = crate::common::load_artifact(path, threads)?;
    match stage {
        "programs" => {
            say!("# stage: programs");
            say_raw!("{}", anyshape::inspect::print_plan(cm.plan()));
        }
        "kernels" => {
            say!("# stage: kernels");
            say_raw!("{}", cm.kernels_text());
        }
        _ => {
            for shape in &shapes {
                let data = synthetic_inputs(cm.inputs(), shape)?;
                let named: Vec<(&str, Tensor)> = data.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
                let s: Vec<String> = shape.iter().map(|(k, v)| format!("{k}={v}")).collect();
                say!("# stage: dispatch at {}", s.join(","));
                say_raw!("{}", cm.dispatch_text(&named)?);
            }
        }
    }
    Ok(())
}

/// Compile with a progress bar on stderr (drawn only when stderr is a terminal).
pub fn compile(model: &anyshape::Model, opts: CompileOptions) -> Result<anyshape::CompiledModel> {
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "compiling [{bar:30}] {pos}/{len} kernels and modules ({elapsed})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let b = bar.clone();
    let opts = opts.progress(move |p| match p {
        anyshape::Progress::Add(n) => b.inc_length(n as u64),
        anyshape::Progress::Done => b.inc(1),
    });
    let cm = model.compile(&opts);
    bar.finish_and_clear();
    Ok(cm?)
}
