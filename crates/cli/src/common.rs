//! What `anyshape` and `anyshape-rt` share: shapes from the command line,
//! synthetic inputs, timed calls and `.npy` inputs. Only the runtime's types:
//! `anyshape-rt` links no compiler.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use ir::{DType, Elems, Tensor, TensorType};
use runtime::CompiledModel;

/// An error in what the user gave us (exit code 2).
#[derive(Debug)]
pub struct UserError(pub String);
impl std::fmt::Display for UserError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for UserError {}

/// Parse the command line with clap, run it, and map the outcome to an exit
/// code: 0, 2 when the input is at fault (`UserError`, the runtime's user
/// errors, a bad .npy file, or what `also_user` says is the user's), 1
/// otherwise; an error is one line on stderr, its chain of contexts joined.
pub fn main_with<C: clap::Parser>(
    dispatch: impl FnOnce(C) -> Result<()>,
    also_user: impl Fn(&anyhow::Error) -> bool,
) -> ExitCode {
    let cli = match C::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match dispatch(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let user = e.downcast_ref::<UserError>().is_some()
                || e.downcast_ref::<runtime::RunError>().is_some_and(|e| e.is_user_error())
                || e.downcast_ref::<runtime::npy::NpyError>().is_some()
                || also_user(&e);
            let msg: Vec<String> = e.chain().map(|c| c.to_string()).collect();
            eprintln!("error: {}", msg.join(": ").replace('\n', " "));
            ExitCode::from(if user { 2 } else { 1 })
        }
    }
}

/// Every shape a list of `--shape` arguments names ([`parse_shapes`] each).
pub fn parse_shape_args(args: &[String]) -> Result<Vec<Vec<(String, usize)>>> {
    Ok(args.iter().map(|s| parse_shapes(s)).collect::<Result<Vec<_>>>()?.concat())
}

/// `SYM=N,SYM=LO..HI`: every shape it names (a range: each value from LO
/// to HI, the last symbol's fastest), as a benchmark's `--shape` takes.
pub fn parse_shapes(s: &str) -> Result<Vec<Vec<(String, usize)>>> {
    let mut shapes: Vec<Vec<(String, usize)>> = vec![Vec::new()];
    for kv in s.split(',') {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| UserError(format!("--shape `{s}`: expected SYM=N,SYM=LO..HI")))?;
        let size = |x: &str| {
            x.trim().parse::<usize>().map_err(|_| UserError(format!("--shape `{s}`: `{x}` is not a size")))
        };
        let values: Vec<usize> = match v.split_once("..") {
            Some((lo, hi)) => {
                let (lo, hi) = (size(lo)?, size(hi)?);
                if lo > hi || hi - lo >= 100_000 {
                    bail!(UserError(format!(
                        "--shape `{s}`: {lo}..{hi} is no range of at most 100000 sizes"
                    )));
                }
                (lo..=hi).collect()
            }
            None => vec![size(v)?],
        };
        shapes = shapes
            .into_iter()
            .flat_map(|sh| {
                values.iter().map(move |&x| {
                    let mut sh = sh.clone();
                    sh.push((k.trim().to_string(), x));
                    sh
                })
            })
            .collect();
    }
    Ok(shapes)
}

/// Inputs for a benchmark at `shape` (values of the model's symbols): token
/// ids below 90, masks of ones, zeros for other integer inputs, a fixed
/// pseudo-random pattern for floats.
pub fn synthetic_inputs(
    inputs: &[(String, TensorType)],
    shape: &[(String, usize)],
) -> Result<Vec<(String, Tensor)>> {
    let mut out = Vec::new();
    for (name, ty) in inputs {
        let mut dims = Vec::new();
        for d in &ty.shape {
            // A dim is a symbol, or an expression of them (a mask's `past + seq`).
            let value = |s: &str| shape.iter().find(|(n, _)| n == s).map(|(_, v)| *v as i64);
            if let Some(sym) = d.symbols().into_iter().find(|s| value(s).is_none()) {
                bail!(UserError(format!("--shape gives no value for `{sym}` (input '{name}')")));
            }
            match d.eval(&value) {
                Ok(v) if v >= 0 => dims.push(v as usize),
                Ok(v) => bail!(UserError(format!("--shape makes input '{name}''s dim {d} {v}"))),
                Err(e) => bail!(UserError(format!("input '{name}' has dim {d}: {e}"))),
            }
        }
        // An absurd --shape is an error that says so, not an abort in the allocator.
        let too_big = || {
            UserError(format!(
                "--shape: input '{name}' would be {dims:?} ({} values): more than can be allocated",
                dims.iter().map(|&d| d as u128).product::<u128>()
            ))
        };
        let n = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or_else(too_big)?;
        fn values<T>(n: usize, f: impl Fn(usize) -> T) -> Option<Vec<T>> {
            let mut v = Vec::new();
            v.try_reserve_exact(n).ok()?;
            v.extend((0..n).map(f));
            Some(v)
        }
        let elems = match ty.dtype {
            DType::I64 => Elems::I64(
                match name.as_str() {
                    n2 if n2.contains("mask") => values(n, |_| 1),
                    n2 if n2.contains("ids") && !n2.contains("type") && !n2.contains("position") => {
                        values(n, |i| (i * 7 % 90) as i64)
                    }
                    _ => values(n, |_| 0),
                }
                .ok_or_else(too_big)?,
            ),
            DType::F32 => {
                Elems::F32(values(n, |i| ((i * 37 % 101) as f32 - 50.0) / 50.0).ok_or_else(too_big)?)
            }
            dt => bail!(UserError(format!("input '{name}': bench makes no {dt} inputs"))),
        };
        out.push((name.clone(), Tensor::new(dims, elems)?));
    }
    Ok(out)
}

/// Print a line to stdout; end the program quietly when stdout is closed
/// (`anyshape-rt … | head`) instead of panicking.
pub fn say(line: impl std::fmt::Display) {
    use std::io::Write as _;
    if let Err(e) = writeln!(std::io::stdout(), "{line}") {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
    }
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The first call at a shape, the median of warm calls and, when asked for,
/// the median of calls that each follow an idle pause (a server between
/// sporadic requests).
pub struct Timing {
    /// Planning the shape (its first call's part before running).
    pub plan_ms: f64,
    /// The first call at the shape, its planning included.
    pub first_ms: f64,
    pub median_ms: f64,
    pub runs: usize,
    pub after_pause: Option<(Duration, f64)>,
}

impl Timing {
    /// One line of text, or one JSON object (`ready_ms`: compile or load time).
    pub fn report(&self, shape: &[(String, usize)], json: bool, ready_ms: f64) -> String {
        let Timing { plan_ms, first_ms, median_ms, runs, after_pause } = self;
        if json {
            let fields: Vec<String> = shape.iter().map(|(k, v)| format!("\"{k}\": {v}")).collect();
            let pause = after_pause.map_or(String::new(), |(p, t)| {
                format!(", \"pause_ms\": {:.1}, \"after_pause_ms\": {t:.4}", ms(p))
            });
            format!(
                "{{\"shape\": {{{}}}, \"plan_ms\": {plan_ms:.4}, \"first_call_ms\": {first_ms:.4}, \"median_ms\": {median_ms:.4}{pause}, \"compile_ms\": {ready_ms:.1}}}",
                fields.join(", ")
            )
        } else {
            let s: Vec<String> = shape.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let pause = after_pause.map_or(String::new(), |(p, t)| {
                format!(", after a {:.0} ms pause {t:.3} ms (median)", ms(p))
            });
            format!(
                "{}: first call {first_ms:.3} ms (planning {plan_ms:.3} ms), median {median_ms:.3} ms over {runs} runs{pause}",
                s.join(",")
            )
        }
    }
}

/// A GPU shape's `report` with the device memory its model holds after the
/// shape's calls (`peak`: the most so far, shapes before it included).
pub fn with_device_memory(report: String, json: bool, m: runtime::gpu::DeviceMemory) -> String {
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    match (json, report.strip_suffix('}')) {
        (true, Some(head)) => format!(
            "{head}, \"device_peak_mib\": {:.1}, \"device_weights_mib\": {:.1}, \"device_calls_mib\": {:.1}}}",
            mib(m.peak),
            mib(m.weights),
            mib(m.calls)
        ),
        _ => format!(
            "{report}; device memory {:.1} MiB at most (weights {:.1} MiB, calls {:.1} MiB)",
            mib(m.peak),
            mib(m.weights),
            mib(m.calls)
        ),
    }
}

/// Time planning `named`'s shape, the first call on it, then `runs` warm
/// calls, then (with `pause`) `runs` calls each made after sleeping that long.
pub fn time_calls(
    cm: &CompiledModel,
    named: &[(&str, Tensor)],
    runs: usize,
    pause: Option<Duration>,
) -> Result<Timing> {
    // Each call's outputs handed back, as a caller that is done with them does
    // (the Python package's arrays do when freed).
    let plan = || cm.plan_shape(named).map_err(Into::into);
    time_runs(&plan, &|| cm.run(named).map(|outs| cm.recycle(outs)).map_err(Into::into), runs, pause)
}

/// A model run on named inputs.
pub type RunOn<'a> = dyn Fn(&[(&str, Tensor)]) -> Result<()> + 'a;

/// Each of `shapes` called once, in order, each call the first at its shape
/// (a decoder's steps, each at a longer cache): `run` runs the model on the
/// shape's synthetic inputs (each made before its call's clock starts). A
/// line per shape, then the median call.
pub fn time_once(
    inputs: &[(String, TensorType)],
    shapes: &[Vec<(String, usize)>],
    run: &RunOn<'_>,
) -> Result<()> {
    let mut times = Vec::with_capacity(shapes.len());
    for shape in shapes {
        let feed = synthetic_inputs(inputs, shape)?;
        let named: Vec<(&str, Tensor)> = feed.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let t = Instant::now();
        run(&named)?;
        let t = ms(t.elapsed());
        let s: Vec<String> = shape.iter().map(|(k, v)| format!("{k}={v}")).collect();
        say(format!("{}: one call {t:.3} ms", s.join(",")));
        times.push(t);
    }
    times.sort_by(f64::total_cmp);
    if let Some(m) = times.get(times.len() / 2) {
        say(format!("{} shapes called once each, in order: median {m:.3} ms a call", times.len()));
    }
    Ok(())
}

/// [`time_calls`] of any model: `plan` plans the shape, `call` runs it once
/// on the shape's inputs.
pub fn time_runs(
    plan: &dyn Fn() -> Result<()>,
    call: &dyn Fn() -> Result<()>,
    runs: usize,
    pause: Option<Duration>,
) -> Result<Timing> {
    let t0 = Instant::now();
    plan()?;
    let plan_ms = ms(t0.elapsed());
    call()?;
    let first_ms = ms(t0.elapsed());
    let timed = |before: &dyn Fn()| -> Result<f64> {
        let mut times = Vec::with_capacity(runs.max(1));
        for _ in 0..runs.max(1) {
            before();
            let t = Instant::now();
            call()?;
            times.push(ms(t.elapsed()));
        }
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2])
    };
    let median_ms = timed(&|| ())?;
    let after_pause = match pause {
        Some(p) => Some((p, timed(&|| std::thread::sleep(p))?)),
        None => None,
    };
    Ok(Timing { plan_ms, first_ms, median_ms, runs: runs.max(1), after_pause })
}

/// `--pause MS`, checked.
pub fn pause_arg(ms: Option<f64>) -> Result<Option<Duration>> {
    match ms {
        None => Ok(None),
        Some(v) if v.is_finite() && (0.0..=60_000.0).contains(&v) => {
            Ok(Some(Duration::from_secs_f64(v / 1e3)))
        }
        Some(v) => Err(UserError(format!("--pause {v}: give milliseconds from 0 to 60000")).into()),
    }
}

/// Load the artifact at `path` (on `threads`, or those it was compiled with).
pub fn load_artifact(path: &std::path::Path, threads: Option<usize>) -> Result<CompiledModel> {
    let mut opts = runtime::ArtifactOptions::new();
    if let Some(t) = threads {
        opts = opts.threads(t);
    }
    Ok(CompiledModel::load(path, &opts)?)
}

/// Run `cm` on `NAME=FILE.npy` inputs; each output's line (see
/// [`write_outputs`]), written to `dir` as well when given.
pub fn run_on_npy(
    cm: &CompiledModel,
    inputs: &[String],
    dir: Option<&std::path::Path>,
) -> Result<Vec<String>> {
    let tensors = npy_inputs(inputs)?;
    let named: Vec<(&str, Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    write_outputs(&cm.run(&named)?, dir)
}

/// `NAME=FILE.npy` inputs, read.
pub fn npy_inputs(specs: &[String]) -> Result<Vec<(String, Tensor)>> {
    let mut out = Vec::new();
    for spec in specs {
        let Some((name, file)) = spec.split_once('=') else {
            bail!(UserError(format!("--input `{spec}`: expected NAME=FILE.npy")));
        };
        let t = runtime::npy::read(std::path::Path::new(file))
            .map_err(|e| UserError(format!("input '{}': {e}", name.trim())))?;
        out.push((name.trim().to_string(), t));
    }
    Ok(out)
}

/// Print each output (dtype, shape, first values) and write it as
/// `DIR/<name>.npy` when a folder is given.
pub fn write_outputs(outputs: &[(String, Tensor)], dir: Option<&std::path::Path>) -> Result<Vec<String>> {
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| UserError(format!("cannot create {}: {e}", dir.display())))?;
    }
    let mut lines = Vec::new();
    for (name, t) in outputs {
        lines.push(format!("{name}: {} {:?} {}", t.dtype(), t.shape(), preview(t)));
        if let Some(dir) = dir {
            runtime::npy::write(&dir.join(format!("{}.npy", sanitize(name))), t)?;
        }
    }
    Ok(lines)
}

/// A file name for an output name (ONNX names may hold `/` or `:`).
fn sanitize(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect()
}

fn preview(t: &Tensor) -> String {
    let v = t.to_f64_vec();
    let head: Vec<String> = v.iter().take(6).map(|x| format!("{x:.6}")).collect();
    format!("[{}{}]", head.join(", "), if v.len() > 6 { ", …" } else { "" })
}

/// `--precision`, for every command that compiles a model for the CPU.
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct PrecisionArg {
    /// What the contractions multiply in: `f32`, or `bf16` (weights stored as
    /// bf16, products with AVX-512 BF16 and f32 accumulation; everything else
    /// f32).
    #[arg(long, value_enum, default_value_t = PrecisionName::F32)]
    pub precision: PrecisionName,
    /// What a quantized model's 8-bit contractions multiply in: `auto` (u8s8
    /// with VNNI, i16s8 without), `u8s8` (VNNI's vpdpbusd), `i16s8` (AVX2's
    /// vpmaddwd on int8 weights kept as bytes), `i16` (vpmaddwd, weights as
    /// 16-bit integers), or `float` (the precision's family): all exact.
    #[arg(long, value_enum, default_value_t = Int8Name::Auto)]
    pub int8: Int8Name,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Int8Name {
    Auto,
    U8s8,
    I16s8,
    I16,
    Float,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrecisionName {
    F32,
    Bf16,
}

impl PrecisionArg {
    // `anyshape-rt` shares this file and compiles no model.
    #[allow(dead_code)]
    pub fn get(self) -> anyshape::Precision {
        match self.precision {
            PrecisionName::F32 => anyshape::Precision::F32,
            PrecisionName::Bf16 => anyshape::Precision::Bf16,
        }
    }

    /// Whether these are the defaults (f32, the target's integer kernels).
    #[allow(dead_code)]
    pub fn is_default(self) -> bool {
        self.precision == PrecisionName::F32 && self.int8 == Int8Name::Auto
    }

    /// `opts` with this precision and choice of 8-bit kernels.
    #[allow(dead_code)]
    pub fn apply(self, opts: anyshape::CompileOptions) -> anyshape::CompileOptions {
        let int8 = match self.int8 {
            Int8Name::Auto => anyshape::Int8::Auto,
            Int8Name::U8s8 => anyshape::Int8::U8S8,
            Int8Name::I16s8 => anyshape::Int8::I16S8,
            Int8Name::I16 => anyshape::Int8::I16,
            Int8Name::Float => anyshape::Int8::Float,
        };
        opts.precision(self.get()).int8(int8)
    }
}

/// `--key-chunks`, for every command that runs a model or an artifact.
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct KeyChunksArg {
    /// How fused attention takes its keys: `auto` (whole rows of scores while
    /// they stay in L2, online softmax over chunks beyond), `never` (whole
    /// rows), `always` (chunks), or N (chunks of N keys).
    #[arg(long, value_name = "auto|never|always|N", value_parser = parse_key_chunks, default_value = "auto")]
    pub key_chunks: runtime::KeyChunks,
}

/// `--key-chunks`: how fused attention takes its keys (`auto`, `never`,
/// `always`, or a number of keys per chunk).
pub fn parse_key_chunks(s: &str) -> std::result::Result<runtime::KeyChunks, String> {
    match s {
        "auto" => Ok(runtime::KeyChunks::Auto),
        "never" => Ok(runtime::KeyChunks::Never),
        "always" => Ok(runtime::KeyChunks::Always),
        n => match n.parse::<usize>() {
            Ok(k) if k > 0 => Ok(runtime::KeyChunks::Every(k)),
            _ => Err(format!("`{n}`: expected auto, never, always or a number of keys above 0")),
        },
    }
}

/// `bench --profile` on a GPU, from `profiles` (one per call): each
/// kernel's median device time a call (its launches summed), the launches'
/// sum and the host's time for the profiled call, then the `top` slowest
/// launches with the step each runs.
pub fn gpu_profile_lines(
    plan: &plan::ModelPlan,
    profiles: &[runtime::gpu::GpuProfile],
    top: usize,
) -> Vec<String> {
    let Some(first) = profiles.first() else { return Vec::new() };
    let ms = |s: f64| s * 1e3;
    let med = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    // Each kernel's total a call, and each launch's time (the launches are
    // the same in every call at one shape).
    let mut kernels: Vec<(&str, usize)> = Vec::new();
    for l in &first.launches {
        match kernels.iter_mut().find(|(k, _)| *k == l.kernel) {
            Some((_, n)) => *n += 1,
            None => kernels.push((&l.kernel, 1)),
        }
    }
    let per_kernel: Vec<f64> = kernels
        .iter()
        .map(|(k, _)| {
            med(profiles
                .iter()
                .map(|p| p.launches.iter().filter(|l| l.kernel == *k).map(|l| ms(l.seconds)).sum())
                .collect())
        })
        .collect();
    let sum = med(profiles.iter().map(|p| p.launches.iter().map(|l| ms(l.seconds)).sum()).collect());
    let host = med(profiles.iter().map(|p| ms(p.total.as_secs_f64())).collect());
    let mut order: Vec<usize> = (0..kernels.len()).collect();
    order.sort_by(|&a, &b| per_kernel[b].total_cmp(&per_kernel[a]));
    let mut lines = vec![format!("  {:<60} {:>8} {:>10} {:>6}", "kernel", "launches", "ms a call", "share")];
    for k in order {
        lines.push(format!(
            "  {:<60} {:>8} {:>10.4} {:>5.1}%",
            kernels[k].0,
            kernels[k].1,
            per_kernel[k],
            100.0 * per_kernel[k] / sum.max(1e-12)
        ));
    }
    lines.push(format!(
        "  {} launches, each alone: {sum:.4} ms on the device; the profiled call {host:.4} ms on the host",
        first.launches.len()
    ));
    if top > 0 {
        let mut launches: Vec<(f64, usize)> = (0..first.launches.len())
            .map(|i| {
                (med(profiles.iter().filter_map(|p| p.launches.get(i)).map(|l| ms(l.seconds)).collect()), i)
            })
            .collect();
        launches.sort_by(|a, b| b.0.total_cmp(&a.0));
        lines.push("  slowest launches:".into());
        for (t, i) in launches.into_iter().take(top) {
            let l = &first.launches[i];
            lines.push(format!(
                "  {t:9.4} ms  step {:<4} {:<40} {}",
                l.step,
                step_text(plan, l.step),
                l.kernel
            ));
        }
    }
    lines
}

/// Step `i` of `plan` in a few words: its loop program's name, or its
/// contraction's extents, or "attention".
pub fn step_text(plan: &plan::ModelPlan, i: usize) -> String {
    match plan.steps.get(i).map(|s| &s.kind) {
        Some(plan::StepKind::Loop { program, .. }) => {
            plan.programs.get(*program).map_or_else(|| "?".into(), |p| p.name.clone())
        }
        Some(plan::StepKind::MatMul(m)) => {
            let d = |slot: u32| plan.dims.exprs().get(slot as usize).map_or("?".into(), |e| e.to_string());
            format!("matmul m={} n={} k={} (batch {})", d(m.m), d(m.n), d(m.k), m.batch.len())
        }
        Some(plan::StepKind::Attention(_)) => "attention".into(),
        None => "?".into(),
    }
}

/// `bench --on-device`: [`time_runs`] over calls whose inputs (uploaded
/// once) and outputs stay in device memory, as a server holding its
/// tensors on the GPU calls the model (nothing copied through the host);
/// with the median of the calls' graphs timed on the device (ms; `None`
/// where no call ran a graph).
pub fn time_on_device<D: runtime::gpu::Device>(
    gm: &runtime::gpu::GpuModel<D>,
    named: &[(&str, Tensor)],
    runs: usize,
) -> Result<(Timing, Option<f64>)> {
    let io = std::cell::RefCell::new(gm.device_io(named)?);
    let graphs = std::cell::RefCell::new(Vec::with_capacity(runs));
    let plan = || gm.plan_shape(named).map_err(Into::into);
    let call = || {
        let secs = io.borrow_mut().run_timed()?;
        graphs.borrow_mut().extend(secs);
        Ok(())
    };
    let t = time_runs(&plan, &call, runs, None)?;
    let mut g = graphs.into_inner();
    g.sort_by(f64::total_cmp);
    Ok((t, g.get(g.len() / 2).map(|s| s * 1e3)))
}

/// A timing report marked as made with `--on-device`, with the median
/// graph's device time where there is one.
pub fn on_device_report(report: String, json: bool, graph_ms: Option<f64>) -> String {
    match (json, report.strip_suffix('}'), graph_ms) {
        (true, Some(head), Some(g)) => format!("{head}, \"io\": \"device\", \"graph_device_ms\": {g:.4}}}"),
        (true, Some(head), None) => format!("{head}, \"io\": \"device\"}}"),
        (_, _, Some(g)) => {
            format!("{report}; inputs and outputs on the device; the graph {g:.4} ms on the device")
        }
        _ => format!("{report}; inputs and outputs on the device"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runtime::gpu::{GpuProfile, LaunchTime};

    /// Each kernel's launches summed a call, the median over calls, the
    /// kernels by time, the launches' sum beside the host's time, and the
    /// slowest launches with their steps.
    #[test]
    fn a_gpu_profile_sums_each_kernels_launches_and_lists_the_slowest() {
        let call = |scale: f64| GpuProfile {
            launches: vec![
                LaunchTime { step: 0, kernel: "k_a".into(), seconds: 1e-3 * scale },
                LaunchTime { step: 1, kernel: "k_b".into(), seconds: 3e-3 * scale },
                LaunchTime { step: 2, kernel: "k_a".into(), seconds: 2.5e-3 * scale },
            ],
            total: Duration::from_secs_f64(7e-3 * scale),
        };
        let lines = gpu_profile_lines(&plan::ModelPlan::default(), &[call(1.0), call(2.0), call(1.5)], 2);
        let words = |l: &str| l.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        assert_eq!(words(&lines[1])[..3], ["k_a", "2", "5.2500"], "{lines:?}");
        assert_eq!(words(&lines[2])[..3], ["k_b", "1", "4.5000"], "{lines:?}");
        assert!(
            lines[3].contains("3 launches, each alone: 9.7500 ms") && lines[3].contains("10.5000 ms"),
            "{lines:?}"
        );
        assert_eq!(lines[4].trim(), "slowest launches:");
        assert_eq!(words(&lines[5])[..4], ["4.5000", "ms", "step", "1"], "{lines:?}");
        assert_eq!(words(&lines[6])[..4], ["3.7500", "ms", "step", "2"], "{lines:?}");
        assert_eq!(lines.len(), 7);
        assert!(gpu_profile_lines(&plan::ModelPlan::default(), &[], 3).is_empty());
    }
}
