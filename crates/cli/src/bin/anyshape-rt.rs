//! `anyshape-rt`: run and benchmark compiled artifacts (`anyshape compile -o`)
//! with the runtime alone. It links no compiler (no LLVM): what a machine that
//! only serves a model needs. A GPU artifact (`anyshape compile --device
//! cuda`) runs on NVIDIA GPU 0 through the driver.
//!
//! Exit codes: 0 on success, 2 when the input is at fault (a bad artifact,
//! shapes, files or flags: a one-line reason on stderr), 1 on an internal error.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Result;
use clap::{Parser, Subcommand};
use ir::Tensor;

#[path = "../common.rs"]
mod common;

use common::{load_artifact, ms, parse_shape_args, say, synthetic_inputs, time_calls, time_once, time_runs};
use runtime::gpu::artifact::is_gpu_artifact;

#[derive(Parser)]
#[command(name = "anyshape-rt", version, about = "Run compiled anyshape artifacts (no compiler).")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run an artifact on inputs from .npy files.
    Run {
        /// The artifact (from `anyshape compile -o`).
        artifact: PathBuf,
        /// An input: NAME=FILE.npy (repeatable).
        #[arg(long = "input", value_name = "NAME=FILE.npy")]
        inputs: Vec<String>,
        /// Write each output as DIR/<output name>.npy.
        #[arg(long)]
        output_dir: Option<PathBuf>,
        /// Threads (default: those the artifact was compiled with).
        #[arg(long)]
        threads: Option<usize>,
        #[command(flatten)]
        chunks: common::KeyChunksArg,
    },
    /// Load an artifact, then time it at each shape: the first call and the
    /// median of warm calls, on synthetic inputs.
    Bench {
        artifact: PathBuf,
        /// A shape to time: values of the model's symbols, e.g. batch=1,seq=17
        /// (repeatable); a range (seq=100..131) stands for each of its values.
        #[arg(long = "shape", value_name = "SYM=N,...", required = true)]
        shapes: Vec<String>,
        /// Threads (default: those the artifact was compiled with).
        #[arg(long)]
        threads: Option<usize>,
        /// Warm calls timed per shape (the median is reported).
        #[arg(long, default_value_t = 20)]
        runs: usize,
        /// Call each shape once, in the order given, with no warm calls (a
        /// decoder's steps, each the first call at its shape): each call's
        /// time and the median.
        #[arg(long)]
        once: bool,
        /// Print one JSON object per shape.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        chunks: common::KeyChunksArg,
        /// Also time --runs calls that each follow this many milliseconds of idle sleep.
        #[arg(long, value_name = "MS")]
        pause: Option<f64>,
        /// A GPU artifact: also run --runs calls with each launch timed alone on
        /// the device, and print each kernel's share.
        #[arg(long)]
        profile: bool,
        /// With --profile, also list the N slowest launches and their steps.
        #[arg(long, default_value_t = 0)]
        top: usize,
        /// A GPU artifact: time calls whose inputs (uploaded once) and outputs
        /// stay in device memory (a server holding its tensors on the GPU).
        #[arg(long)]
        on_device: bool,
    },
    /// The artifact's inputs and outputs with their symbolic shapes.
    Info { artifact: PathBuf },
}

fn main() -> ExitCode {
    common::main_with(dispatch, |_| false)
}

fn dispatch(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Run { artifact, inputs, output_dir, .. } if is_gpu_artifact(&artifact) => {
            let gm = open_gpu_artifact(&artifact)?;
            for line in run_gpu_on_npy(&gm, &inputs, output_dir.as_deref())? {
                say(line);
            }
        }
        Command::Bench { artifact, shapes, runs, json, once, pause, profile, top, on_device, .. }
            if is_gpu_artifact(&artifact) =>
        {
            let shapes = bench_shapes(&shapes, once, json || pause.is_some() || profile || on_device)?;
            if on_device && pause.is_some() {
                anyhow::bail!(common::UserError("--on-device times warm calls: no --pause with it".into()));
            }
            if profile && json {
                anyhow::bail!(common::UserError("--profile prints a table: no --json with it".into()));
            }
            let start = Instant::now();
            let gm = open_gpu_artifact(&artifact)?;
            let load_ms = ms(start.elapsed());
            if !json {
                say(format!(
                    "loaded the artifact on {} in {load_ms:.0} ms",
                    runtime::gpu::Device::name(gm.device())
                ));
            }
            if once {
                let run = |named: &[(&str, Tensor)]| gm.run(named).map(|_| ()).map_err(Into::into);
                return time_once(gm.inputs(), &shapes, &run);
            }
            for shape in &shapes {
                let data = synthetic_inputs(gm.inputs(), shape)?;
                let named: Vec<(&str, Tensor)> = data.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
                let plan = || gm.plan_shape(&named).map_err(Into::into);
                let call = || gm.run(&named).map(|_| ()).map_err(Into::into);
                let report = if on_device {
                    let (t, graph_ms) = common::time_on_device(&gm, &named, runs)?;
                    common::on_device_report(t.report(shape, json, load_ms), json, graph_ms)
                } else {
                    time_runs(&plan, &call, runs, None)?.report(shape, json, load_ms)
                };
                if profile {
                    let profiles = (0..runs.max(1))
                        .map(|_| gm.run_profiled(&named).map(|(_, p)| p))
                        .collect::<std::result::Result<Vec<_>, _>>()?;
                    for line in common::gpu_profile_lines(gm.plan(), &profiles, top) {
                        say(line);
                    }
                }
                say(common::with_device_memory(report, json, gm.device_memory()));
            }
        }
        Command::Info { artifact } if is_gpu_artifact(&artifact) => {
            let a = runtime::gpu::artifact::GpuArtifact::load(&artifact).map_err(runtime::RunError::from)?;
            for (kind, list) in [("input", &a.inputs), ("output", &a.outputs)] {
                for (name, ty) in list {
                    let dims: Vec<String> = ty.shape.iter().map(|d| d.to_string()).collect();
                    say(format!("{kind} {name}: {} [{}]", ty.dtype, dims.join(", ")));
                }
            }
            for c in &a.code {
                let dependent =
                    c.kernels.iter().filter(|(k, _)| k.launch == plan::gpu::KernelLaunch::Dependent).count();
                say(format!(
                    "code for NVIDIA GPUs ({}): {} kernels, {} of them with a cubin, {}",
                    c.arch,
                    c.kernels.len(),
                    c.cubins(),
                    match dependent {
                        0 => "each launched after the one before".to_string(),
                        n if n == c.kernels.len() => "launched as programmatic dependents".to_string(),
                        n => format!("{n} launched as programmatic dependents"),
                    }
                ));
            }
            let bytes: usize = a.weights.iter().map(|w| w.bytes.len()).sum();
            say(format!("{} weights in bf16 for the GEMMs: {:.1} MB", a.weights.len(), bytes as f64 / 1e6));
        }
        Command::Run { artifact, inputs, output_dir, threads, chunks } => {
            let cm = load_artifact(&artifact, threads)?.with_key_chunks(chunks.key_chunks);
            for line in common::run_on_npy(&cm, &inputs, output_dir.as_deref())? {
                say(line);
            }
        }
        Command::Bench {
            artifact,
            shapes,
            threads,
            runs,
            json,
            chunks,
            pause,
            once,
            profile,
            on_device,
            ..
        } => {
            if profile || on_device {
                anyhow::bail!(common::UserError(
                    "anyshape-rt bench --profile and --on-device are for GPU artifacts; `anyshape bench --profile` profiles a CPU artifact"
                        .into()
                ));
            }
            let shapes = bench_shapes(&shapes, once, json || pause.is_some())?;
            let pause = common::pause_arg(pause)?;
            let start = Instant::now();
            let cm = load_artifact(&artifact, threads)?.with_key_chunks(chunks.key_chunks);
            let load_ms = ms(start.elapsed());
            if !json {
                say(format!("loaded the artifact in {load_ms:.0} ms ({} threads)", cm.threads()));
            }
            if once {
                let run = |named: &[(&str, Tensor)]| cm.run(named).map(|o| cm.recycle(o)).map_err(Into::into);
                return time_once(cm.inputs(), &shapes, &run);
            }
            for shape in &shapes {
                let data = synthetic_inputs(cm.inputs(), shape)?;
                let named: Vec<(&str, Tensor)> = data.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
                say(time_calls(&cm, &named, runs, pause)?.report(shape, json, load_ms));
            }
        }
        Command::Info { artifact } => {
            let cm = load_artifact(&artifact, None)?;
            for (kind, list) in [("input", cm.inputs()), ("output", cm.outputs())] {
                for (name, ty) in list {
                    let dims: Vec<String> = ty.shape.iter().map(|d| d.to_string()).collect();
                    say(format!("{kind} {name}: {} [{}]", ty.dtype, dims.join(", ")));
                }
            }
            let t = cm.code_target();
            say(format!("code for {} ({} features); {} threads", t.cpu, t.features.len(), cm.threads()));
        }
    }
    Ok(())
}

/// A GPU artifact (`anyshape compile --device cuda`) opened on GPU 0: its
/// kernels loaded by the driver, its weights uploaded.
fn open_gpu_artifact(
    path: &std::path::Path,
) -> Result<runtime::gpu::GpuModel<runtime::gpu::cuda::CudaDevice>> {
    Ok(runtime::gpu::artifact::GpuArtifact::load(path).map_err(runtime::RunError::from)?.open(0)?)
}

/// `common::run_on_npy` for a model on a GPU.
fn run_gpu_on_npy<D: runtime::gpu::Device>(
    gm: &runtime::gpu::GpuModel<D>,
    inputs: &[String],
    dir: Option<&std::path::Path>,
) -> Result<Vec<String>> {
    let tensors = common::npy_inputs(inputs)?;
    let named: Vec<(&str, Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    common::write_outputs(&gm.run(&named)?, dir)
}

/// `bench`'s `--shape`s, ranges expanded; `--once` times single calls
/// (`other`: an option it does not take was given).
fn bench_shapes(shapes: &[String], once: bool, other: bool) -> Result<Vec<Vec<(String, usize)>>> {
    if once && other {
        anyhow::bail!(common::UserError(
            "--once times single calls: no --json, --pause, --profile or --on-device with it".into()
        ));
    }
    parse_shape_args(shapes)
}
