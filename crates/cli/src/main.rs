//! The `anyshape` command: run and inspect models with symbolic dims.
//!
//! Exit codes: 0 on success, 2 when the input is at fault (bad model, shapes,
//! files or flags: a one-line reason on stderr), 1 on an internal error.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context, Result};
use anyshape::{npy, DType, Elems, LoadOptions, Model, Range, Tensor};
use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(name = "anyshape", version, about = "Compile a model with symbolic dims once, run any shape.")]
#[command(long_about = "anyshape loads an ONNX model whose inputs have symbolic dims (batch, sequence \
length, image size) and runs it at any shape the dims allow.\n\nExamples:\n  \
anyshape run tests/fixtures/bert/model.onnx --input input_ids=7,42,11 --shape input_ids=1x3 \\\n      \
--input attention_mask=1,1,1 --shape attention_mask=1x3 --input token_type_ids=0,0,0 --shape token_type_ids=1x3\n  \
anyshape run model.onnx --input pixel_values=img.npy --output-dir out/\n  \
anyshape inspect model.onnx --stage shapes --dim seq=1..512")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Compile a model once into an artifact: one file with the machine code
    /// of every kernel, the execution, buffer and dispatch plans and the
    /// pre-packed weights, which `run`, `bench` and `anyshape-rt` (no
    /// compiler) load without compiling.
    Compile {
        /// The ONNX model file.
        model: PathBuf,
        /// The artifact to write (e.g. model.anyshape).
        #[arg(short, long)]
        output: PathBuf,
        /// Declare the range of a symbolic dim: NAME=LO..HI.
        #[arg(long = "dim", value_name = "NAME=LO..HI")]
        dims: Vec<String>,
        /// Threads the artifact runs on by default (default: every core).
        #[arg(long)]
        threads: Option<usize>,
        /// The instruction set of the code: this machine's (`host`, AVX-512 where
        /// it has it), or `avx2` for an artifact that runs on any AVX2 machine.
        #[arg(long, value_enum, default_value_t = IsaArg::Host)]
        isa: IsaArg,
        /// The device the artifact is for: this kind of CPU, or NVIDIA GPUs
        /// (`cuda`: PTX, the plan and the weights; runs with `anyshape-rt`
        /// where there is only the NVIDIA driver).
        #[arg(long, value_enum, default_value_t = devices::DeviceArg::Cpu)]
        device: devices::DeviceArg,
        /// With `--device cuda`: the GPUs the artifact holds kernels for (a
        /// Hopper runs sm_90a's, every other GPU from sm_80 on sm_80's).
        #[arg(long, value_enum, value_delimiter = ',', default_value = "sm_90a,sm_80")]
        gpu_arch: Vec<devices::GpuArchArg>,
        /// With `--device cuda`: the ptxas that assembles each kernel into a
        /// cubin (default: `ANYSHAPE_PTXAS`, else `ptxas` on PATH or in
        /// /usr/local/cuda; without one the artifact holds PTX only, which
        /// the driver assembles when the artifact is loaded).
        #[arg(long)]
        ptxas: Option<PathBuf>,
        /// With `--device cuda`: launch a Hopper's kernels each after the one
        /// before, not as programmatic dependents (to measure what those save).
        #[arg(long)]
        ordered_launches: bool,
        #[command(flatten)]
        precision: common::PrecisionArg,
    },
    /// Run a model on inputs from .npy files or inline values.
    Run {
        /// The ONNX model file, or an artifact from `anyshape compile`.
        model: PathBuf,
        /// An input: NAME=FILE.npy, or NAME=v1,v2,... inline (with --shape NAME=AxB for rank > 1).
        #[arg(long = "input", value_name = "NAME=FILE|VALUES")]
        inputs: Vec<String>,
        /// The shape of an inline input: NAME=2x3 (default: 1-D).
        #[arg(long = "shape", value_name = "NAME=DIMS")]
        shapes: Vec<String>,
        /// Write each output as DIR/<output name>.npy.
        #[arg(long, value_name = "DIR")]
        output_dir: Option<PathBuf>,
        /// Declare the range of a symbolic dim: NAME=LO..HI (HI may be omitted).
        #[arg(long = "dim", value_name = "NAME=LO..HI")]
        dims: Vec<String>,
        /// Run on the reference interpreter (the oracle) instead of compiling.
        #[arg(long)]
        interpret: bool,
        /// Threads of the compiled model (default: every core).
        #[arg(long)]
        threads: Option<usize>,
        #[command(flatten)]
        chunks: common::KeyChunksArg,
        #[command(flatten)]
        precision: common::PrecisionArg,
        /// Where the model runs: `cpu`, `cuda` (NVIDIA GPU 0), or `gpu-emulator`
        /// (the GPU's kernels on this machine's threads).
        #[arg(long, value_enum, default_value_t = devices::DeviceArg::Cpu)]
        device: devices::DeviceArg,
    },
    /// Compile a model once (or load an artifact), then time it at each shape:
    /// the first call (which plans the shape) and the median of warm calls.
    Bench(model_bench::BenchArgs),
    /// Benchmark the contraction engine on single and batched matmuls: GFLOP/s and
    /// the fraction of the measured peak, with the schedule the dispatcher chose
    /// (and, with --exhaustive, every candidate measured and each model's regret).
    BenchMatmul(Box<bench::BenchMatmulArgs>),
    /// Generate the GPU GEMM family (PTX through LLVM's NVPTX target), check every
    /// kernel with ptxas (spills and warnings fail), and write cubins and the
    /// manifest that `anyshape-gpu` runs on a machine with only the NVIDIA driver.
    GpuKernels(gpu_build::GpuKernelsArgs),
    /// Measure this machine's micro-kernels once and store them in the tuning cache
    /// (`$ANYSHAPE_CACHE_DIR`, `$XDG_CACHE_HOME/anyshape` or `~/.cache/anyshape`).
    ///
    /// With --samples FILE (lines `m,n,k[,batch[,weight]]`), categorize a known
    /// shape distribution instead (DietCode): print the trade-off between the
    /// micro-kernels kept and the predicted slowdown, choose the smallest family
    /// within --tolerance, and measure it against the whole family. With --search
    /// bayes as well, run a trust-region Bayesian search (TSCompiler) over each
    /// class's macro-kernels instead, measuring real runs, and write the table of
    /// winners (for bench-matmul --tuned).
    Tune {
        /// Tune the AVX2-only code path too (on an AVX-512 machine).
        #[arg(long)]
        avx2: bool,
        /// The cache folder (default: as above).
        #[arg(long)]
        cache_dir: Option<PathBuf>,
        /// The shape distribution to categorize.
        #[arg(long, value_name = "FILE")]
        samples: Option<PathBuf>,
        /// With --samples: the predicted mean slowdown allowed (0.02: 2%).
        #[arg(long, default_value_t = 0.02, requires = "samples")]
        tolerance: f64,
        /// With --samples: write the chosen kernels here (for bench-matmul --kernels).
        #[arg(long, value_name = "FILE", requires = "samples")]
        out: Option<PathBuf>,
        /// With --samples: threads (default: every core).
        #[arg(long, requires = "samples")]
        threads: Option<usize>,
        /// With --samples: search the macro-kernels by measuring (`bayes`).
        #[arg(long, value_parser = ["bayes"], requires = "samples")]
        search: Option<String>,
        /// With --search: measurements per class of samples.
        #[arg(long, default_value_t = 40, requires = "search")]
        budget: usize,
        /// With --search: the seed of the search's random draws.
        #[arg(long, default_value_t = 0, requires = "search")]
        seed: u64,
        /// With --samples: the element type of the family tuned (f32, bf16).
        #[arg(long, default_value = "f32", requires = "samples")]
        dtype: String,
    },
    /// Show what the compiler knows about a model at a stage (of an artifact:
    /// the stages it keeps, `programs`, `kernels` and `dispatch`).
    Inspect {
        /// The ONNX model file, or an artifact.
        model: PathBuf,
        /// Which stage to show.
        #[arg(long, value_enum, default_value_t = Stage::Shapes)]
        stage: Stage,
        /// Declare the range of a symbolic dim: NAME=LO..HI.
        #[arg(long = "dim", value_name = "NAME=LO..HI")]
        dims: Vec<String>,
        /// Also generate the loop programs and write their optimized LLVM IR and
        /// assembly to DIR/programs.ll and DIR/programs.s.
        #[arg(long, value_name = "DIR")]
        dump_llvm: Option<PathBuf>,
        /// With `--stage dispatch`: the shape to show, values of the model's
        /// symbols (e.g. batch=1,seq=17; repeatable).
        #[arg(long = "shape", value_name = "SYM=N,...")]
        shapes: Vec<String>,
        /// Threads of the compiled model (`kernels`, `dispatch`; default: every core).
        #[arg(long)]
        threads: Option<usize>,
        /// The plan for this device (`programs`; `cuda` and `gpu-emulator`: the
        /// GPU's, its contractions on the GEMM family); with `--dump-llvm`, a
        /// GPU device writes every kernel's PTX to DIR/programs.ptx.
        #[arg(long, value_enum, default_value_t = devices::DeviceArg::Cpu)]
        device: devices::DeviceArg,
    },
}

#[derive(Clone, Copy, PartialEq, ValueEnum)]
enum IsaArg {
    Host,
    Avx2,
}

#[derive(Clone, Copy, PartialEq, ValueEnum)]
enum Stage {
    /// The IR after import: every value with its symbolic shape, and the ShapeEnv facts.
    Shapes,
    /// The IR after the rewrites (constant folding, CSE, algebra, broadcast
    /// elimination), with what each pass did.
    Rewrites,
    /// The fusion groups (one future kernel each) of the rewritten IR.
    Fusion,
    /// The lowered model: the dim table, the buffers (sizes and lifetimes), the
    /// loop programs, and each group's steps (loops and matmuls).
    Programs,
    /// The compiled kernels: every contraction family (micro-kernels and direct
    /// kernels with their measured rates, the machine model) and the loop programs.
    Kernels,
    /// What a call at each `--shape` runs: per step, the kernel variant, schedule,
    /// thread split (and fused attention's query blocks) chosen for that shape.
    Dispatch,
    /// Every stage in order (up to `programs`).
    All,
}

fn stage_name(stage: Stage) -> &'static str {
    match stage {
        Stage::Shapes => "shapes",
        Stage::Rewrites => "rewrites",
        Stage::Fusion => "fusion",
        Stage::Programs => "programs",
        Stage::Kernels => "kernels",
        Stage::Dispatch => "dispatch",
        Stage::All => "all",
    }
}

/// `println!` that ends the program quietly when stdout is closed (`anyshape … | head`)
/// instead of panicking.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::common::say(format!($($arg)*))
    };
}

/// `print!` with the same handling.
macro_rules! say_raw {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = write!(std::io::stdout(), $($arg)*) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
        }
    }};
}

mod bench;
mod model_bench;
mod samples;
mod search;

mod common;
mod devices;
mod gpu_build;
pub(crate) use common::UserError;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        // Warnings (a damaged cache, code that runs slower than it could) show
        // unless RUST_LOG says otherwise.
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    common::main_with(dispatch, |e| e.downcast_ref::<anyshape::Error>().is_some_and(|e| e.is_user_error()))
}

fn dispatch(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Run {
            model,
            inputs,
            shapes,
            output_dir,
            dims,
            interpret,
            threads,
            chunks,
            precision,
            device,
        } => {
            let options = RunOptions { threads, key_chunks: chunks.key_chunks, precision, device };
            run(model, inputs, shapes, output_dir, dims, interpret, options)
        }
        Command::Bench(args) => model_bench::bench(args),
        Command::Compile {
            model,
            output,
            dims,
            device,
            gpu_arch,
            ptxas,
            ordered_launches,
            precision,
            ..
        } if device != devices::DeviceArg::Cpu => {
            if !precision.is_default() {
                bail!(UserError(
                    "--precision and --int8 apply to CPU code; the GPU's contractions are bf16".into()
                ));
            }
            compile_gpu(model, output, dims, &gpu_arch, ptxas, ordered_launches)
        }
        Command::Compile { model, output, dims, threads, isa, precision, .. } => {
            compile(model, output, dims, threads, isa, precision)
        }
        Command::Inspect { model, .. } if anyshape::gpu::is_gpu_artifact(&model) => {
            bail!(UserError(format!(
                "{}: a GPU artifact (`anyshape-rt info` lists it); inspect the ONNX model with --device cuda",
                model.display()
            )))
        }
        Command::Inspect { model, device, .. }
            if device != devices::DeviceArg::Cpu && runtime::is_artifact(&model) =>
        {
            bail!(UserError(format!(
                "{}: an artifact holds CPU code; --device applies to an ONNX model",
                model.display()
            )))
        }
        Command::Inspect { model, stage, dims, dump_llvm, device, .. }
            if device != devices::DeviceArg::Cpu =>
        {
            if !matches!(stage, Stage::Programs) {
                bail!(UserError("--device applies to --stage programs (the GPU's plan)".into()));
            }
            inspect_gpu(model, dims, dump_llvm)
        }
        Command::Inspect { model, stage, dims, dump_llvm, shapes, threads, .. }
            if runtime::is_artifact(&model) =>
        {
            model_bench::inspect_artifact(
                &model,
                stage_name(stage),
                &dims,
                &shapes,
                threads,
                dump_llvm.is_some(),
            )
        }
        Command::Inspect { model, stage, dims, dump_llvm, shapes, threads, .. } => match stage {
            Stage::Kernels | Stage::Dispatch => {
                model_bench::inspect_compiled(&model, stage == Stage::Dispatch, &dims, &shapes, threads)
            }
            _ => inspect(model, stage, dims, dump_llvm),
        },
        Command::Tune {
            avx2,
            cache_dir,
            samples: Some(samples),
            tolerance,
            out,
            threads,
            search,
            budget,
            seed,
            dtype,
        } => {
            if avx2 {
                bail!(UserError("--samples tunes the host's family: drop --avx2".into()));
            }
            let elem = dtype.parse().map_err(|e| UserError(format!("--dtype: {e}")))?;
            match search {
                Some(_) => search::tune_search(search::TuneSearch {
                    samples,
                    budget,
                    seed,
                    out,
                    threads,
                    cache_dir,
                    elem,
                }),
                None => samples::tune_samples(samples::TuneSamples {
                    samples,
                    tolerance,
                    out,
                    threads,
                    cache_dir,
                    elem,
                }),
            }
        }
        Command::Tune { avx2, cache_dir, .. } => tune(avx2, cache_dir),
        Command::BenchMatmul(args) => bench::bench_matmul(*args),
        Command::GpuKernels(args) => gpu_build::gpu_kernels(args),
    }
}

pub(crate) fn load(model: &PathBuf, dims: &[String]) -> Result<Model> {
    let mut opts = LoadOptions::new();
    for d in dims {
        let (name, range) = parse_dim(d)?;
        opts = opts.dim_range(&name, range);
    }
    Ok(Model::load(model, &opts)?)
}

/// `NAME=LO..HI`, `NAME=LO..`, `NAME=N`.
fn parse_dim(s: &str) -> Result<(String, Range)> {
    let bad = || UserError(format!("--dim `{s}`: expected NAME=LO..HI, NAME=LO.. or NAME=N"));
    let (name, r) = s.split_once('=').ok_or_else(bad)?;
    let range = if r.contains("..") {
        sym_range(r).ok_or_else(bad)?
    } else {
        let v: i64 = r.trim().parse().map_err(|_| bad())?;
        Range::point(v)
    };
    if range.lo < 0 || range.is_empty() {
        return Err(UserError(format!("--dim `{s}`: the range must be non-empty and non-negative")).into());
    }
    Ok((name.trim().to_string(), range))
}

fn sym_range(r: &str) -> Option<Range> {
    let (lo, hi) = r.split_once("..")?;
    let lo = if lo.trim().is_empty() { 0 } else { lo.trim().parse().ok()? };
    let hi = if hi.trim().is_empty() {
        anyshape::DIM_MAX
    } else {
        hi.trim().trim_start_matches('=').parse().ok()?
    };
    Some(Range::new(lo, hi))
}

#[allow(clippy::too_many_arguments)]
/// How `anyshape run` compiles and runs.
struct RunOptions {
    threads: Option<usize>,
    key_chunks: anyshape::KeyChunks,
    precision: common::PrecisionArg,
    device: devices::DeviceArg,
}

fn run(
    model_path: PathBuf,
    inputs: Vec<String>,
    shapes: Vec<String>,
    output_dir: Option<PathBuf>,
    dims: Vec<String>,
    interpret: bool,
    options: RunOptions,
) -> Result<()> {
    let RunOptions { threads, key_chunks, precision, device } = options;
    let compiles_here = !interpret && device == devices::DeviceArg::Cpu && !runtime::is_artifact(&model_path);
    if !precision.is_default() && !compiles_here {
        bail!(UserError(
            "--precision and --int8 apply when compiling an ONNX model for the CPU (not to an artifact, \
             --interpret or a GPU)"
                .into()
        ));
    }
    if anyshape::gpu::is_gpu_artifact(&model_path) {
        if interpret || !dims.is_empty() {
            bail!(UserError("a GPU artifact runs as compiled (no --interpret or --dim)".into()));
        }
        let gm = devices::open_gpu_artifact(&model_path, device)?;
        let infos: Vec<(String, DType)> = gm.inputs().iter().map(|(n, t)| (n.clone(), t.dtype)).collect();
        let tensors = cli_inputs(&inputs, &shapes, &infos)?;
        let named: Vec<(&str, Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        for line in common::write_outputs(&gm.run(&named)?, output_dir.as_deref())? {
            say!("{line}");
        }
        return Ok(());
    }
    if device != devices::DeviceArg::Cpu && (interpret || runtime::is_artifact(&model_path)) {
        bail!(UserError(
            "--device runs an ONNX model compiled here; an artifact holds CPU code, and --interpret runs \
             the interpreter"
                .into()
        ));
    }
    if runtime::is_artifact(&model_path) {
        return run_artifact(model_path, inputs, shapes, output_dir, dims, interpret, threads, key_chunks);
    }
    let model = load(&model_path, &dims)?;
    let infos: Vec<(String, DType)> = model.inputs().into_iter().map(|i| (i.name, i.ty.dtype)).collect();
    let tensors = cli_inputs(&inputs, &shapes, &infos)?;
    let named: Vec<(&str, Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let outputs = if interpret {
        model.interpret(&named)?
    } else if device != devices::DeviceArg::Cpu {
        let gm = devices::compile_gpu(&model, device)?;
        tracing::info!("running on {}", gm.device_name());
        gm.run(&named).map_err(anyshape::Error::from)?
    } else {
        let mut opts = precision.apply(anyshape::CompileOptions::new().key_chunks(key_chunks));
        if let Some(t) = threads {
            opts = opts.threads(t);
        }
        model_bench::compile(&model, opts)?.run(&named).map_err(anyshape::Error::from)?
    };
    for line in common::write_outputs(&outputs, output_dir.as_deref())? {
        say!("{line}");
    }
    Ok(())
}
/// `--input` values (`.npy` files or inline numbers, shaped by `--shape`)
/// for a model whose inputs are `infos` (name, element type).
fn cli_inputs(
    inputs: &[String],
    shapes: &[String],
    infos: &[(String, DType)],
) -> Result<Vec<(String, Tensor)>> {
    let mut shape_of = std::collections::HashMap::new();
    for s in shapes {
        let (name, dims) =
            s.split_once('=').ok_or_else(|| UserError(format!("--shape `{s}`: expected NAME=AxB")))?;
        let dims: Vec<usize> = if dims.trim().is_empty() {
            vec![]
        } else {
            dims.split('x')
                .map(|d| d.trim().parse())
                .collect::<Result<_, _>>()
                .map_err(|_| UserError(format!("--shape `{s}`: dims must be integers separated by `x`")))?
        };
        shape_of.insert(name.trim().to_string(), dims);
    }
    let mut tensors = Vec::new();
    for spec in inputs {
        let (name, value) = spec.split_once('=').ok_or_else(|| {
            UserError(format!("--input `{spec}`: expected NAME=FILE.npy or NAME=v1,v2,..."))
        })?;
        let name = name.trim();
        let t = if value.ends_with(".npy") || std::path::Path::new(value).is_file() {
            npy::read(std::path::Path::new(value)).with_context(|| format!("input '{name}'"))?
        } else {
            let dtype = infos.iter().find(|i| i.0 == name).map(|i| i.1).ok_or_else(|| {
                UserError(format!(
                    "the model has no input '{name}' (inputs: {})",
                    infos.iter().map(|i| i.0.as_str()).collect::<Vec<_>>().join(", ")
                ))
            })?;
            inline_tensor(name, value, shape_of.remove(name), dtype)?
        };
        tensors.push((name.to_string(), t));
    }
    if let Some(name) = shape_of.keys().next() {
        bail!(UserError(format!("--shape {name}=… is given but there is no inline --input {name}=…")));
    }
    Ok(tensors)
}

/// `run` on an artifact: inputs from .npy files.
#[allow(clippy::too_many_arguments)]
fn run_artifact(
    path: PathBuf,
    inputs: Vec<String>,
    shapes: Vec<String>,
    output_dir: Option<PathBuf>,
    dims: Vec<String>,
    interpret: bool,
    threads: Option<usize>,
    key_chunks: anyshape::KeyChunks,
) -> Result<()> {
    if interpret || !dims.is_empty() || !shapes.is_empty() {
        bail!(UserError(
            "--interpret, --dim and --shape apply to an ONNX model; an artifact runs compiled, on .npy inputs"
                .into()
        ));
    }
    let cm = common::load_artifact(&path, threads)?.with_key_chunks(key_chunks);
    for line in common::run_on_npy(&cm, &inputs, output_dir.as_deref())? {
        say!("{line}");
    }
    Ok(())
}

/// `anyshape compile MODEL -o OUT`.
fn compile(
    model_path: PathBuf,
    output: PathBuf,
    dims: Vec<String>,
    threads: Option<usize>,
    isa: IsaArg,
    precision: common::PrecisionArg,
) -> Result<()> {
    let start = std::time::Instant::now();
    let model = load(&model_path, &dims)?;
    let isa = match isa {
        IsaArg::Host => anyshape::Isa::Host,
        IsaArg::Avx2 => anyshape::Isa::Avx2,
    };
    let mut opts = precision.apply(anyshape::CompileOptions::new().isa(isa));
    if let Some(t) = threads {
        opts = opts.threads(t);
    }
    let cm = model_bench::compile(&model, opts)?;
    let compiled = start.elapsed();
    cm.save(&output)?;
    let size = std::fs::metadata(&output).map(|m| m.len()).unwrap_or(0);
    say!(
        "wrote {} ({:.1} MB): compiled in {:.1} s, saved in {:.2} s",
        output.display(),
        size as f64 / 1e6,
        compiled.as_secs_f64(),
        (start.elapsed() - compiled).as_secs_f64()
    );
    Ok(())
}

/// `compile --device cuda`: a GPU artifact (PTX and, with ptxas, cubins for
/// each of `archs`; the plan; the weights).
fn compile_gpu(
    model_path: PathBuf,
    output: PathBuf,
    dims: Vec<String>,
    archs: &[devices::GpuArchArg],
    ptxas: Option<PathBuf>,
    ordered_launches: bool,
) -> Result<()> {
    let start = std::time::Instant::now();
    let model = load(&model_path, &dims)?;
    let targets: Vec<_> = archs.iter().map(|a| a.target()).collect();
    let mut opts =
        anyshape::gpu::GpuArtifactOptions::new().targets(&targets).ordered_launches(ordered_launches);
    match ptxas.or_else(anyshape::ptxas::find_ptxas) {
        Some(p) => opts = opts.ptxas(p),
        None => eprintln!(
            "no ptxas (--ptxas, ANYSHAPE_PTXAS, PATH): the artifact holds PTX only, which the driver \
             assembles when it loads the artifact"
        ),
    }
    let a = model.gpu_artifact(&opts)?;
    let compiled = start.elapsed();
    a.save(&output).map_err(runtime::RunError::from)?;
    let size = std::fs::metadata(&output).map(|m| m.len()).unwrap_or(0);
    let code: Vec<String> = a
        .code
        .iter()
        .map(|c| format!("{} kernels for {} ({} cubins)", c.kernels.len(), c.arch, c.cubins()))
        .collect();
    say!(
        "wrote {} ({:.1} MB, {}): compiled in {:.1} s, saved in {:.2} s",
        output.display(),
        size as f64 / 1e6,
        code.join(", "),
        compiled.as_secs_f64(),
        (start.elapsed() - compiled).as_secs_f64()
    );
    Ok(())
}

fn inline_tensor(name: &str, values: &str, shape: Option<Vec<usize>>, dtype: DType) -> Result<Tensor> {
    let vals: Vec<f64> =
        values.split(',').map(|v| v.trim().parse::<f64>()).collect::<Result<_, _>>().map_err(|_| {
            UserError(format!(
                "--input {name}: `{values}` is neither a .npy file nor comma-separated numbers"
            ))
        })?;
    let shape = shape.unwrap_or_else(|| vec![vals.len()]);
    let elems = match dtype {
        DType::F32 => Elems::F32(vals.iter().map(|v| *v as f32).collect()),
        DType::F64 => Elems::F64(vals),
        DType::I64 => Elems::I64(vals.iter().map(|v| *v as i64).collect()),
        DType::I32 => Elems::I32(vals.iter().map(|v| *v as i32).collect()),
        DType::I8 => Elems::I8(vals.iter().map(|v| *v as i8).collect()),
        DType::U8 => Elems::U8(vals.iter().map(|v| *v as u8).collect()),
        DType::Bool => Elems::Bool(vals.iter().map(|v| *v != 0.0).collect()),
        DType::F16 => bail!(UserError(format!("input '{name}' is f16: give it as a .npy file"))),
        DType::BF16 => bail!(UserError(format!("input '{name}' is bf16, which is not taken as an input"))),
    };
    Tensor::new(shape, elems).map_err(|e| UserError(format!("input '{name}': {e}")).into())
}

fn inspect(model_path: PathBuf, stage: Stage, dims: Vec<String>, dump_llvm: Option<PathBuf>) -> Result<()> {
    let start = std::time::Instant::now();
    let model = load(&model_path, &dims).map_err(|e| anyhow!(e))?;
    let import_ms = start.elapsed().as_secs_f64() * 1e3;
    if matches!(stage, Stage::Shapes | Stage::All) {
        let g = model.imported();
        say!("# stage: shapes");
        say_raw!("{}", model.ir_text());
        // The symbols the values' shapes are written in (after every equality).
        let mut used = std::collections::BTreeSet::new();
        for v in g.values() {
            for d in &v.ty.shape {
                used.extend(g.env.normalize(d).symbols().into_iter().map(|s| s.to_string()));
            }
        }
        let used: Vec<String> = used.into_iter().collect();
        say!(
            "# {} nodes, {} values; {} symbols in shapes: {}; import + shape propagation {import_ms:.1} ms",
            g.nodes.len(),
            g.num_values(),
            used.len(),
            used.join(", ")
        );
    }
    if matches!(stage, Stage::Rewrites | Stage::All) {
        let r = model.rewrite_report();
        say!("# stage: rewrites");
        say_raw!("{}", model.ir_text_rewritten());
        let mut per_pass: Vec<(&str, usize, std::time::Duration)> = Vec::new();
        for (name, n, t) in &r.runs {
            match per_pass.iter_mut().find(|(p, _, _)| p == name) {
                Some(e) => (e.1, e.2) = (e.1 + n, e.2 + *t),
                None => per_pass.push((name, *n, *t)),
            }
        }
        let passes: Vec<String> =
            per_pass.iter().map(|(p, n, t)| format!("{p} {n} ({:.0} ms)", t.as_secs_f64() * 1e3)).collect();
        say!(
            "# {} nodes before, {} after; rewrites: {}; {:.1} ms",
            r.nodes_before,
            r.nodes_after,
            passes.join(", "),
            r.total_time().as_secs_f64() * 1e3
        );
        say!(
            "# broadcasts eliminated: {}; kept with a no-op guard: {}",
            r.rewrites("eliminate-broadcasts"),
            r.guarded_broadcasts.len()
        );
        for b in &r.guarded_broadcasts {
            let dims: Vec<String> = b.dims.iter().map(|d| format!("{d} == 1")).collect();
            say!("#   %{} is a no-op when {}", b.value, dims.join(" and "));
        }
    }
    if matches!(stage, Stage::Fusion | Stage::All) {
        let start = std::time::Instant::now();
        let plan = model.fusion_plan();
        let fuse_ms = start.elapsed().as_secs_f64() * 1e3;
        say!("# stage: fusion");
        say_raw!("{}", model.fusion_text(&plan));
        let r = model.rewrite_report();
        let kinds: Vec<String> = [
            anyshape::inspect::GroupKind::Contraction,
            anyshape::inspect::GroupKind::Attention,
            anyshape::inspect::GroupKind::Stitch,
            anyshape::inspect::GroupKind::Elementwise,
            anyshape::inspect::GroupKind::Window,
            anyshape::inspect::GroupKind::Opaque,
        ]
        .iter()
        .map(|k| format!("{k} {}", plan.count(*k)))
        .collect();
        say!(
            "# {} ops after import, {} after rewrites ({} constants), {} groups: {}; broadcasts eliminated {}; contractions merged {}; fusion {fuse_ms:.1} ms",
            r.nodes_before,
            r.nodes_after,
            plan.constants.len(),
            plan.groups.len(),
            kinds.join(", "),
            r.rewrites("eliminate-broadcasts"),
            r.rewrites("merge-gemms")
        );
    }
    if matches!(stage, Stage::Programs | Stage::All) {
        let start = std::time::Instant::now();
        let plan = model.lower()?;
        let lower_ms = start.elapsed().as_secs_f64() * 1e3;
        say!("# stage: programs");
        say_raw!("{}", anyshape::inspect::print_plan(&plan));
        let count = |k: &str| plan.steps.iter().filter(|s| s.kind.name() == k).count();
        say!(
            "# {} groups, {} steps ({} loops, {} matmuls, {} fused attention), {} distinct loop programs, {} buffers, {} dims; lowering {lower_ms:.1} ms",
            plan.groups.len(),
            plan.steps.len(),
            count("loop"),
            count("matmul"),
            count("attention"),
            plan.programs.len(),
            plan.buffers.len(),
            plan.dims.len()
        );
    }
    if let Some(dir) = dump_llvm {
        let plan = model.lower()?;
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let code = codegen::compile_programs(&kernels::Target::detect(), &plan.programs, "model", threads)?;
        std::fs::create_dir_all(&dir)
            .map_err(|e| UserError(format!("cannot create {}: {e}", dir.display())))?;
        std::fs::write(dir.join("programs.ll"), code.ir())?;
        std::fs::write(dir.join("programs.s"), code.asm())?;
        say!("# wrote {}/programs.ll and programs.s ({} programs)", dir.display(), code.len());
    }
    Ok(())
}

/// `inspect --stage programs --device cuda|gpu-emulator`: the GPU's plan
/// (loop programs with the schedule each kernel takes, contraction steps with
/// the GEMM kernels each is given), and with `--dump-llvm DIR` every kernel's
/// PTX in DIR/programs.ptx.
fn inspect_gpu(model_path: PathBuf, dims: Vec<String>, dump_llvm: Option<PathBuf>) -> Result<()> {
    let model = load(&model_path, &dims)?;
    let plan = model.lower_gpu()?;
    say!("# stage: programs (the GPU's plan: loop programs, contractions on the GEMM family)");
    say_raw!("{}", anyshape::inspect::print_plan(&plan));
    say!("# GEMM kernels of each contraction step, tried in order (bf16 operands, f32 C):");
    say_raw!("{}", anyshape::gpu::gemm_choices_text(&plan, anyshape::gpu::GpuTarget::Sm80)?);
    let attention = anyshape::gpu::attention_text(&plan, anyshape::gpu::GpuTarget::Sm80);
    if !attention.is_empty() {
        say!("# the attention kernel of each fused attention step (the others unfused):");
        say_raw!("{attention}");
        say!("# on a Hopper (sm_90a):");
        say_raw!("{}", anyshape::gpu::attention_text(&plan, anyshape::gpu::GpuTarget::Sm90a));
    }
    let warp = plan.programs.iter().filter(|p| p.gpu_warp_schedule().is_some()).count();
    let matmuls = plan.steps.iter().filter(|s| s.kind.name() == "matmul").count();
    let fused = plan.steps.iter().filter(|s| s.kind.name() == "attention").count();
    say!(
        "# {} steps ({matmuls} contractions, {fused} fused attentions), {} distinct loop programs ({warp} with a warp schedule for long rows), {} buffers",
        plan.steps.len(),
        plan.programs.len(),
        plan.buffers.len()
    );
    if let Some(dir) = dump_llvm {
        let kernels = anyshape::gpu::plan_ptx(&plan, anyshape::gpu::GpuTarget::Sm80)?;
        let mut ptx = String::new();
        for (_, text) in &kernels {
            ptx.push_str(text);
            ptx.push('\n');
        }
        std::fs::create_dir_all(&dir)
            .map_err(|e| UserError(format!("cannot create {}: {e}", dir.display())))?;
        std::fs::write(dir.join("programs.ptx"), ptx)?;
        say!("# wrote {}/programs.ptx ({} kernels)", dir.display(), kernels.len());
    }
    Ok(())
}

fn tune(avx2: bool, cache_dir: Option<PathBuf>) -> Result<()> {
    let dir = cache_dir
        .or_else(codegen::tuning::default_cache_dir)
        .ok_or_else(|| UserError("no cache folder: set ANYSHAPE_CACHE_DIR or give --cache-dir".into()))?;
    let host = kernels::Target::detect();
    if !host.supported() {
        bail!(UserError("the contraction engine needs x86-64 with AVX2 and FMA".into()));
    }
    let mut targets = vec![("host", host.clone())];
    if avx2 && host.isa.avx512f {
        targets.extend(host.avx2_only().map(|t| ("avx2", t)));
    }
    // Every element type the target multiplies in: one record each.
    let runs: Vec<_> = targets
        .iter()
        .flat_map(|(name, t)| {
            kernels::CPU_ELEM_TYPES
                .into_iter()
                .filter(|e| t.check_elem(*e).is_ok())
                .map(move |e| (*name, t.clone(), e))
        })
        .collect();
    for (name, t, elem) in runs {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} steps ({elapsed})")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.set_message(format!("measuring {name} {elem} micro-kernels"));
        let start = std::time::Instant::now();
        let record = codegen::tuning::measure(Some(&dir), &t, elem, &|i, n| {
            bar.set_length(n as u64);
            bar.set_position(i as u64)
        })?;
        bar.finish_and_clear();
        let (mr, nr) = codegen::pick_tile(&record.tiles, 4)?;
        let best = record.tiles.iter().map(|m| m.gflops).fold(0.0, f64::max);
        let direct = match record.direct.iter().map(|m| m.gflops).reduce(f64::max) {
            Some(g) => format!(", {g:.1} direct"),
            None => String::new(),
        };
        say!(
            "{name} {elem}: {} register tiles measured in {:.1} s; fastest {best:.1} GFLOP/s packed{direct} (1 thread), chosen {mr}x{nr}; stored in {}",
            record.tiles.len(),
            start.elapsed().as_secs_f64(),
            dir.display()
        );
    }
    Ok(())
}
