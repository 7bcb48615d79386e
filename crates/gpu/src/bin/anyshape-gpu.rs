//! `anyshape-gpu`: the GPU machine's runner. It links cudarc and nothing of LLVM,
//! loads the family that `anyshape gpu-kernels` built, and
//! - `info`: prints the device and its limits;
//! - `check`: runs every kernel against the host oracle at random shapes (1, primes,
//!   one past a tile, odd row strides, batches) with canaries around and between C's rows;
//! - `bench`: measures every kernel's block rate once (the wave model's calibration),
//!   then times every kernel on every product of the sweep (exhaustive), and reports
//!   the model's and the distilled tree's picks against the best measured (regret),
//!   with TFLOP/s; `--dump` writes a few products' operands and results for the
//!   cuBLAS comparison (bench/gpu/cublas.py);
//! - `replay`: the model's choices taken again on a `bench --json` record, no device.

use clap::{Parser, Subcommand};
use gpu::reference::{self, Operands};
use gpu::replay::{self, Record, Regret};
use gpu::runner::{DeviceOperands, Gpu, GpuError, Loaded, LoadedReducer, Workspace};
use gpu::wave::{calibration_grids, occupancy, KernelRate, ReduceRate, WaveModel, FEW_BLOCKS, REDUCE_CHUNK};
use gpu::{BLayout, Choice, Cover, ElemType, Epilogue, GemmKernel, MTree, Manifest, Problem, Split};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "anyshape-gpu",
    about = "Run anyshape's GPU GEMM family: check it, time it, choose among it."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// The device and its limits.
    Info,
    /// Every kernel against the host oracle at random shapes, with canaries.
    Check {
        /// The folder `anyshape gpu-kernels` wrote.
        #[arg(long)]
        dir: PathBuf,
        /// Random shapes per kernel, beside the fixed edge cases.
        #[arg(long, default_value_t = 6)]
        cases: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Only kernels whose name contains this.
        #[arg(long)]
        filter: Option<String>,
        /// Leave out kernels whose name contains this (repeatable).
        #[arg(long)]
        exclude: Vec<String>,
        /// A JSON report.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Calibrate the wave model, time every kernel on the sweep, report regret.
    Bench {
        #[arg(long)]
        dir: PathBuf,
        /// Timed replays per measurement at most (median): fewer, at least 3,
        /// once they have taken 4 ms of device time (a long product's).
        #[arg(long, default_value_t = 15)]
        reps: usize,
        /// Device memory bandwidth for the model's floor, GB/s.
        #[arg(long, default_value_t = 4000.0)]
        bandwidth: f64,
        /// A JSON line per product.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Write a few products' operands and results here (for bench/gpu/cublas.py).
        #[arg(long)]
        dump: Option<PathBuf>,
        /// Only the first N products of the sweep.
        #[arg(long)]
        limit: Option<usize>,
        /// A `check --json` report: kernels it found wrong are left out.
        #[arg(long)]
        skip_failed: Vec<PathBuf>,
        /// Leave out kernels whose name contains this (repeatable).
        #[arg(long)]
        exclude: Vec<String>,
        /// Only kernels whose name contains this.
        #[arg(long)]
        filter: Option<String>,
    },
    /// The wave model's choices taken again, by this build's model, on a `bench
    /// --json` record: its regret against the record's measured times, without a
    /// device.
    Replay {
        /// The record `bench --json` wrote.
        record: PathBuf,
        /// Only the products where the model's regret exceeds this, in percent.
        #[arg(long, default_value_t = 0.0)]
        above: f64,
        /// Under each product shown, every choice's predicted and measured time.
        #[arg(long)]
        detail: bool,
        /// Then, for each signature of the sweep, where the model covers M = 1-8192
        /// with two kernel sizes and its predicted gain there.
        #[arg(long)]
        covers: bool,
        /// Then the model's misses by regime (partial waves by the SMs they keep
        /// busy, full waves by their count): measured over predicted, every single
        /// choice of 8 us or more.
        #[arg(long)]
        residuals: bool,
        /// Then, for each single product, the Stream-K kernels' price (from
        /// their tiles' calibration; not yet checked on a device) against the
        /// best measured.
        #[arg(long)]
        stream_k: bool,
    },
}

/// `println!` that ends the program quietly when stdout is closed
/// (`anyshape-gpu bench … | head`) instead of panicking.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout(), $($arg)*) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
        }
    }};
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Info => info(),
        Cmd::Check { dir, cases, seed, filter, exclude, json } => {
            check(&dir, cases, seed, filter.as_deref(), &exclude, json.as_deref())
        }
        Cmd::Bench { dir, reps, bandwidth, json, dump, limit, skip_failed, exclude, filter } => {
            let skip = Skip { reports: skip_failed, exclude, filter };
            bench(&dir, reps, bandwidth * 1e9, json.as_deref(), dump.as_deref(), limit, &skip)
        }
        Cmd::Replay { record, above, detail, covers, residuals, stream_k } => {
            replay_record(&record, above, detail, (covers, residuals, stream_k))
        }
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// The device and the family in `dir` (kernels and split-K reductions).
struct Opened {
    gpu: Gpu,
    kernels: Vec<Loaded>,
    reducers: Vec<LoadedReducer>,
}

fn open(dir: Option<&Path>, bandwidth: f64) -> Result<Opened, GpuError> {
    let gpu = Gpu::open(bandwidth)?;
    let (kernels, reducers) = match dir {
        Some(d) => {
            let m = Manifest::load(d).map_err(GpuError::Plan)?;
            gpu.load(d, &m)?
        }
        None => (Vec::new(), Vec::new()),
    };
    Ok(Opened { gpu, kernels, reducers })
}

/// Runs a choice on `p`, whose rows start `first_row` rows into the operands: one
/// launch, or a split-K launch into the workspace `w` and its reduction `r` (none:
/// the shares alone).
fn run_choice(
    gpu: &Gpu,
    l: &Loaded,
    r: Option<&LoadedReducer>,
    (p, first_row): (&Problem, usize),
    splits: usize,
    ops: &mut DeviceOperands,
    w: &mut Workspace,
) -> Result<(), GpuError> {
    if l.kernel.split_k {
        gpu.launch_split(l, r, (p, first_row), splits, ops, w)?;
        Ok(())
    } else {
        gpu.launch(l, (p, first_row), ops)
    }
}

/// Runs Stream-K kernel `l` on `p` in `blocks` blocks (no more than the
/// product's K steps), its workspace and counters allocated for the launch.
fn run_stream_k(
    gpu: &Gpu,
    l: &Loaded,
    p: &Problem,
    blocks: usize,
    ops: &mut DeviceOperands,
) -> Result<(), GpuError> {
    let k = &l.kernel;
    let blocks = blocks.min(k.stream_steps(p));
    let (floats, tiles) = k.fold_space(p, k.stream_slots(p, blocks));
    let (mut w, mut cnt) = (gpu.alloc_f32(floats)?, gpu.alloc_counters(tiles)?);
    gpu.launch_stream_k(l, (p, 0), blocks, ops, (&mut w, &mut cnt))
}

/// Runs a cover of `p` (FTuner's two sizes along M): its pieces one after the
/// other, each a choice among `kernels`, loaded as `fam`.
fn run_cover(
    gpu: &Gpu,
    (kernels, fam): (&[GemmKernel], &[&Loaded]),
    r: Option<&LoadedReducer>,
    c: &Cover,
    p: &Problem,
    ops: &mut DeviceOperands,
    w: &mut Workspace,
) -> Result<(), GpuError> {
    for x in c.pieces(kernels, p) {
        run_choice(gpu, fam[x.choice.kernel], r, (&x.problem, x.first_row), x.choice.splits, ops, w)?;
    }
    Ok(())
}

/// f32s the split-K pieces of cover `c` on `p` need (at least 1).
fn workspace_len(kernels: &[GemmKernel], c: &Cover, p: &Problem) -> usize {
    c.pieces(kernels, p)
        .iter()
        .filter(|x| kernels[x.choice.kernel].split_k)
        .map(|x| x.choice.splits * x.problem.m * x.problem.n)
        .max()
        .unwrap_or(1)
}

fn info() -> Result<bool, GpuError> {
    let Opened { gpu, .. } = open(None, 4e12)?;
    say!("{} (sm_{}{}): {:?}", gpu.name, gpu.cc.0, gpu.cc.1, gpu.limits);
    Ok(true)
}

/// The canary: a NaN whose payload no kernel produces.
const CANARY: u16 = 0x7fc1;
const MARGIN: usize = 64;

/// One product's host operands and the device copies, with C (and the residual)
/// `ldc` apart (≥ N: the columns between are canaries) and a margin around.
struct Case {
    p: Problem,
    a: Vec<u16>,
    b: Vec<u16>,
    bias: Vec<u16>,
    residual: Vec<u16>,
    lda: usize,
    ldc: usize,
}

fn random_bits(rng: &mut StdRng, elem: ElemType, n: usize) -> Vec<u16> {
    (0..n).map(|_| reference::to_bits(elem, rng.random_range(-1.0f32..1.0))).collect()
}

impl Case {
    fn new(rng: &mut StdRng, k: &GemmKernel, p: Problem, lda_pad: usize, ldc_pad: usize) -> Case {
        let lda = p.k + lda_pad;
        let ldc = p.n + ldc_pad;
        let a = random_bits(rng, k.elem, p.batch * p.m * lda);
        let b = random_bits(rng, k.elem, p.batch * p.n * p.k);
        let bias = random_bits(rng, k.elem, p.n);
        let residual = random_bits(rng, k.elem, p.batch * p.m * ldc);
        Case { p, a, b, bias, residual, lda, ldc }
    }

    fn upload(&self, gpu: &Gpu, k: &GemmKernel) -> Result<DeviceOperands, GpuError> {
        let p = &self.p;
        let sc = p.m * self.ldc;
        let c = vec![CANARY; 2 * MARGIN + p.batch * sc];
        Ok(DeviceOperands {
            a: gpu.upload(&self.a)?,
            b: gpu.upload(&self.b)?,
            c: gpu.upload(&c)?,
            bias: gpu.upload(&self.bias)?,
            residual: gpu.upload(&self.residual)?,
            c_off: MARGIN,
            lda: self.lda,
            ldb: k.b.extent(p).1,
            ldc: self.ldc,
            sa: p.m * self.lda,
            sb: p.n * p.k,
            sc,
            maps: Vec::new(),
        })
    }

    /// The oracle's C, `[batch, m, n]`, from A without its row padding.
    fn reference(&self, k: &GemmKernel) -> Vec<f64> {
        let p = &self.p;
        let a: Vec<u16> = (0..p.batch * p.m)
            .flat_map(|r| self.a[r * self.lda..r * self.lda + p.k].iter().copied())
            .collect();
        let residual: Vec<u16> = (0..p.batch * p.m)
            .flat_map(|r| self.residual[r * self.ldc..r * self.ldc + p.n].iter().copied())
            .collect();
        let o = Operands { elem: k.elem, a: &a, b: &self.b, bias: &self.bias, residual: &residual };
        // Rows in parallel: the oracle is the slow part of a check.
        let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(p.m.max(1));
        if threads <= 1 || p.m * p.n * p.k < 1 << 20 {
            return reference::gemm(p, &k.epilogue, &o);
        }
        let mut out = vec![0.0; p.batch * p.m * p.n];
        for z in 0..p.batch {
            let rows = p.m.div_ceil(threads);
            let parts: Vec<Vec<f64>> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..threads)
                    .map(|t| {
                        let (lo, hi) = ((t * rows).min(p.m), ((t + 1) * rows).min(p.m));
                        let o = &o;
                        let a = &a;
                        let residual = &residual;
                        s.spawn(move || {
                            if lo == hi {
                                return Vec::new();
                            }
                            let sub = Problem { batch: 1, m: hi - lo, ..*p };
                            let base = z * p.m + lo;
                            let oz = Operands {
                                elem: o.elem,
                                a: &a[base * p.k..(base + hi - lo) * p.k],
                                b: &o.b[z * p.n * p.k..(z + 1) * p.n * p.k],
                                bias: o.bias,
                                residual: &residual[base * p.n..(base + hi - lo) * p.n],
                            };
                            reference::gemm(&sub, &k.epilogue, &oz)
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap_or_default()).collect()
            });
            let mut at = z * p.m * p.n;
            for part in parts {
                out[at..at + part.len()].copy_from_slice(&part);
                at += part.len();
            }
        }
        out
    }
}

/// Compares a launch's C buffer with the oracle; the first problems found.
fn verify(k: &GemmKernel, case: &Case, got: &[u16], want: &[f64]) -> Vec<String> {
    let p = &case.p;
    let scale = (p.k as f64 / 9.0).sqrt().max(1.0);
    let mut bad = Vec::new();
    let sc = p.m * case.ldc;
    for (i, &x) in got[..MARGIN].iter().chain(&got[MARGIN + p.batch * sc..]).enumerate() {
        if x != CANARY {
            bad.push(format!("margin element {i} overwritten ({x:#06x})"));
            break;
        }
    }
    'rows: for z in 0..p.batch {
        for i in 0..p.m {
            for j in 0..case.ldc {
                let x = got[MARGIN + z * sc + i * case.ldc + j];
                if j >= p.n {
                    if x != CANARY {
                        bad.push(format!("padding C[{z}, {i}, {j}] overwritten"));
                        break 'rows;
                    }
                    continue;
                }
                let w = want[(z * p.m + i) * p.n + j];
                let g = reference::from_bits(k.elem, x);
                if !reference::close(k.elem, g, w, scale, gpu::epilogue_approximate(&k.epilogue)) {
                    bad.push(format!("C[{z}, {i}, {j}] = {g}, want {w}"));
                    if bad.len() >= 4 {
                        break 'rows;
                    }
                }
            }
        }
    }
    bad
}

/// Shapes a kernel is checked at: edges (1, one past a tile, primes, K of one
/// copy, more tiles than SMs), then random draws; N a multiple of 8 for an N-major B,
/// one product for a split-K kernel. A SIMT kernel, which has no alignment rule, gets
/// odd K, leading dimensions and N-major N instead.
fn shapes(k: &GemmKernel, rng: &mut StdRng, random: usize) -> Vec<(Problem, usize, usize)> {
    let any = k.is_cover();
    let n8 = |n: usize| if k.b == BLayout::NMajor && !any { n.div_ceil(8) * 8 } else { n };
    let k8 = |kk: usize| if any { kk + 3 } else { kk };
    let pad = |p: usize| if any { p + 1 } else { p };
    let batch = |b: usize| if k.split_k { 1 } else { b };
    let product = |b: usize, m: usize, n: usize, kk: usize| Problem::nt(b, m, n, kk).with_b(k.b);
    let mut out = vec![
        (product(1, 1, n8(1), k8(8)), 0, 0),
        (product(1, k.bm + 1, n8(k.bn + 1), k8(40)), pad(0), 1),
        (product(batch(3), 97, n8(67), k8(264)), pad(8), 0),
        (product(1, 2 * k.bm - 1, n8(2 * k.bn + 3), k8(32)), 0, 3),
        (product(batch(2), 13, n8(131), k8(768)), pad(0), 0),
        // More tiles than an H100 has SMs (216 in 2 batch entries; 108 split), so
        // that a persistent block walks several, its steps' phases running on.
        (product(batch(2), 17 * k.bm + 5, n8(5 * k.bn + 3), k8(200)), 0, 0),
    ];
    let primes = [1, 2, 3, 5, 7, 13, 31, 61, 127, 251];
    for _ in 0..random {
        let m = if rng.random_range(0..2) == 0 {
            primes[rng.random_range(0..primes.len())]
        } else {
            rng.random_range(1..300)
        };
        let n = n8(rng.random_range(1..320));
        let kk = if any { rng.random_range(1..800) } else { 8 * rng.random_range(1..100) };
        let b = batch(rng.random_range(1..4));
        let lda_pad = if any { rng.random_range(0..3) } else { 8 * rng.random_range(0..2) };
        let ldc_pad = rng.random_range(0..3);
        out.push((product(b, m, n, kk), lda_pad, ldc_pad));
    }
    out
}

/// Two-size covers that check kernel `main` of `kernels` as the main of (it is not
/// split-K): on one product of whole tiles and five rows, a split-K partner of the
/// same element type over the rows below where one and a reduction with the main's
/// epilogue are loaded (a plain one otherwise); on a batch of two, one tile row
/// and a plain partner over the other two and seven rows (A, C and the residual
/// offset within each batch entry).
fn cover_cases(main: usize, kernels: &[GemmKernel], reducers: &[LoadedReducer]) -> Vec<(Cover, Problem)> {
    let k = &kernels[main];
    if k.split_k {
        return Vec::new();
    }
    // Odd K for a cover main (SIMT, element by element), which the other kernels refuse.
    let kk = if k.is_cover() { 75 } else { 72 };
    let n = if k.b == BLayout::NMajor { (k.bn + 9).div_ceil(8) * 8 } else { k.bn + 9 };
    let partners = |p: &Problem, split_k: bool| -> Vec<usize> {
        (0..kernels.len())
            .filter(|&j| {
                let x = &kernels[j];
                j != main
                    && x.elem == k.elem
                    && x.b == k.b
                    && x.split_k == split_k
                    && !x.fold
                    && x.accepts(p).is_ok()
                    && if split_k {
                        reducers.iter().any(|r| r.kernel.elem == k.elem && r.kernel.epilogue == k.epilogue)
                    } else {
                        x.epilogue == k.epilogue
                    }
            })
            .collect()
    };
    let mut out = Vec::new();
    let one = Problem::nt(1, 2 * k.bm + 5, n, kk).with_b(k.b);
    let split = partners(&one, true);
    let plain = partners(&one, false);
    let rest = match (split.first(), plain.get(main % plain.len().max(1))) {
        (Some(&j), _) => Some(Choice { kernel: j, splits: 3 }),
        (None, Some(&j)) => Some(Choice { kernel: j, splits: 1 }),
        _ => None,
    };
    if let Some(rest) = rest {
        out.push((
            Cover {
                main: Choice { kernel: main, splits: 1 },
                split: Some(Split { max_tiles: usize::MAX, rest }),
            },
            one,
        ));
    }
    let batch = Problem::nt(2, 3 * k.bm + 7, n, kk).with_b(k.b);
    let plain = partners(&batch, false);
    if let Some(&j) = plain.get((main + 1) % plain.len().max(1)) {
        let rest = Choice { kernel: j, splits: 1 };
        out.push((
            Cover { main: Choice { kernel: main, splits: 1 }, split: Some(Split { max_tiles: 1, rest }) },
            batch,
        ));
    }
    out
}

fn check(
    dir: &Path,
    cases: usize,
    seed: u64,
    filter: Option<&str>,
    exclude: &[String],
    json: Option<&Path>,
) -> Result<bool, GpuError> {
    let Opened { gpu, kernels: loaded, reducers } = open(Some(dir), 4e12)?;
    say!("check on {} (sm_{}{})", gpu.name, gpu.cc.0, gpu.cc.1);
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut runs, mut failed) = (0, 0);
    let mut report = Vec::new();
    let chosen = |l: &&Loaded| {
        let name = l.kernel.name();
        filter.is_none_or(|f| name.contains(f)) && !exclude.iter().any(|x| name.contains(x.as_str()))
    };
    let kernels: Vec<GemmKernel> = loaded.iter().map(|l| l.kernel).collect();
    let fam: Vec<&Loaded> = loaded.iter().collect();
    for (i, l) in loaded.iter().enumerate().filter(|(_, l)| chosen(l)) {
        let k = &l.kernel;
        let mut problems = Vec::new();
        // A split-K kernel is checked with each reduction of its element type (the
        // epilogue is the reduction's), at 2, 3 and 5 splits in turn.
        let reductions: Vec<&LoadedReducer> = if k.split_k && !k.fold {
            reducers.iter().filter(|r| r.kernel.elem == k.elem).collect()
        } else {
            Vec::new()
        };
        if k.split_k && !k.fold && reductions.is_empty() {
            problems.push("no split-K reduction in the manifest".to_string());
        }
        for (x, (p, lda_pad, ldc_pad)) in shapes(k, &mut rng, cases).into_iter().enumerate() {
            let red = (!reductions.is_empty()).then(|| reductions[x % reductions.len()]);
            let splits = [2, 3, 5][x % 3];
            let as_run = GemmKernel { epilogue: red.map_or(k.epilogue, |r| r.kernel.epilogue), ..*k };
            let case = Case::new(&mut rng, &as_run, p, lda_pad, ldc_pad);
            // A launch that fails is a failure of this kernel, recorded like a wrong
            // value (a fault also poisons the context: later kernels fail too, and
            // the report says so rather than stopping short).
            let got = case.upload(&gpu, k).and_then(|mut ops| {
                if k.stream_k {
                    // One block, a few, and a resident wave of them, in turn.
                    let wave = gpu.limits.sms * gpu::wave::occupancy(k, l.regs, &gpu.limits).max(1);
                    run_stream_k(&gpu, l, &p, [1, 7, wave][x % 3], &mut ops)?;
                } else {
                    let mut w = gpu.alloc_f32(if k.split_k { 5 * p.m * p.n } else { 1 })?;
                    run_choice(&gpu, l, red, (&p, 0), splits, &mut ops, &mut w)?;
                }
                gpu.download(&ops.c)
            });
            let bad = match got {
                Ok(got) => verify(&as_run, &case, &got, &case.reference(&as_run)),
                Err(e) => vec![e.to_string()],
            };
            runs += 1;
            if !bad.is_empty() {
                failed += 1;
                problems.push(format!("{p} lda+{lda_pad} ldc+{ldc_pad}: {}", bad.join("; ")));
            }
        }
        // The kernel as a two-size cover's main, a partner taking the rows below.
        for (cover, p) in cover_cases(i, &kernels, &reducers) {
            let red = kernels[cover.split.map_or(i, |s| s.rest.kernel)]
                .split_k
                .then(|| reducers.iter().find(|r| r.kernel.elem == k.elem && r.kernel.epilogue == k.epilogue))
                .flatten();
            let (lda_pad, ldc_pad) = (if k.is_cover() { 1 } else { 8 }, 3);
            let case = Case::new(&mut rng, k, p, lda_pad, ldc_pad);
            let got = case.upload(&gpu, k).and_then(|mut ops| {
                let mut w = gpu.alloc_f32(workspace_len(&kernels, &cover, &p))?;
                run_cover(&gpu, (&kernels, &fam), red, &cover, &p, &mut ops, &mut w)?;
                gpu.download(&ops.c)
            });
            let bad = match got {
                Ok(got) => verify(k, &case, &got, &case.reference(k)),
                Err(e) => vec![e.to_string()],
            };
            runs += 1;
            if !bad.is_empty() {
                failed += 1;
                let what = cover.text(&kernels, &p);
                problems.push(format!("{p} as {what}: {}", bad.join("; ")));
            }
        }
        say!(
            "{:<44} regs {:>3}  {}",
            k.name(),
            l.regs,
            if problems.is_empty() { "ok".to_string() } else { problems.join(" | ") }
        );
        report.push(json!({"kernel": k.name(), "regs": l.regs, "failures": problems}));
    }
    say!("{runs} runs, {failed} failed");
    if let Some(path) = json {
        let doc = json!({"device": gpu.name, "runs": runs, "failed": failed, "kernels": report});
        std::fs::write(path, serde_json::to_string_pretty(&doc).unwrap_or_default())
            .map_err(|e| GpuError::Plan(format!("{}: {e}", path.display())))?;
    }
    Ok(failed == 0 && runs > 0)
}

/// The sweep: BERT-base's and BERT-large's projections at M from 1 to 8192
/// (B K-major: pre-packed weights; one ragged M past a wave, for two-size covers),
/// 8192³, the attention batch-matmuls of 12 heads at T from 16 to 512 (Q·Kᵀ K-major,
/// P·V N-major), and three products with K = 100, which only the SIMT kernels take.
fn sweep() -> Vec<Problem> {
    let mut out = Vec::new();
    // The short products first (attention's, both B layouts; K not a multiple
    // of 8, which only the SIMT kernels take), so that a run cut short by its
    // time limit still covers every layout.
    for t in [16, 64, 128, 384, 512] {
        out.push(Problem::nt(12, t, t, 64));
        out.push(Problem::nn(12, t, 64, t));
    }
    for m in [1, 383, 2048] {
        out.push(Problem::nt(1, m, 768, 100));
    }
    let nk = [
        (768, 768),
        (2304, 768),
        (3072, 768),
        (768, 3072),
        (1024, 1024),
        (3072, 1024),
        (4096, 1024),
        (1024, 4096),
    ];
    // 2821 = 22·128 + 5: whole 128-row tiles spill into one more wave, where the
    // model covers M with two kernel sizes (FTuner).
    for m in [1, 7, 64, 127, 383, 1000, 2048, 2821, 4096, 8192] {
        for &(n, k) in &nk {
            out.push(Problem::nt(1, m, n, k));
        }
    }
    out.push(Problem::nt(1, 8192, 8192, 8192));
    out
}

/// Two-size covers of a product the bench times beside every single choice: the
/// model's best few (an exhaustive search over every main kernel and rest is
/// several times the sweep's time).
const TIMED_COVERS: usize = 4;

/// What the bench times on `p`: every single choice, then the [`TIMED_COVERS`]
/// two-size covers the model predicts fastest.
fn measured_covers(model: &WaveModel, p: &Problem) -> Vec<Cover> {
    let (mut out, mut two): (Vec<Cover>, Vec<Cover>) =
        model.covers(p).into_iter().partition(|c| c.split.is_none());
    two.sort_by(|a, b| model.predict_cover(a, p).total_cmp(&model.predict_cover(b, p)));
    out.extend(two.into_iter().take(TIMED_COVERS));
    out
}

/// Device operands for a timed product: random values (never zeros: tensor cores
/// run faster on them), contiguous.
fn timed_operands(gpu: &Gpu, pool: &mut RandomPool, p: &Problem) -> Result<DeviceOperands, GpuError> {
    let a = pool.take(p.batch * p.m * p.k);
    let bb = pool.take(p.batch * p.n * p.k);
    let c = vec![0u16; p.batch * p.m * p.n];
    let bias = pool.take(p.n);
    Ok(DeviceOperands {
        a: gpu.upload(&a)?,
        b: gpu.upload(&bb)?,
        c: gpu.upload(&c)?,
        bias: gpu.upload(&bias)?,
        residual: gpu.upload(&c)?,
        c_off: 0,
        lda: p.k,
        ldb: p.b.extent(p).1,
        ldc: p.n,
        sa: p.m * p.k,
        sb: p.n * p.k,
        sc: p.m * p.n,
        maps: Vec::new(),
    })
}

/// Random bf16 values for the timed operands, made once and handed out in
/// turn (cycling): the times do not depend on the values, and drawing each
/// product's operands anew (hundreds of millions of values over the
/// calibration and the sweep) took a large share of the bench's time.
struct RandomPool {
    values: Vec<u16>,
    next: usize,
}

impl RandomPool {
    /// Values a pool holds (prime, so that operands do not repeat in step).
    const LEN: usize = (1 << 22) + 15;

    fn new(rng: &mut StdRng) -> RandomPool {
        RandomPool { values: random_bits(rng, ElemType::Bf16, Self::LEN), next: 0 }
    }

    /// The next `n` values.
    fn take(&mut self, n: usize) -> Vec<u16> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let run = (n - out.len()).min(self.values.len() - self.next);
            out.extend_from_slice(&self.values[self.next..self.next + run]);
            self.next = (self.next + run) % self.values.len();
        }
        out
    }
}

/// The wave model's calibration of one kernel (the measured lowest level): its
/// time at four K (short, two long whose difference gives the cost of a K step and
/// the rest the fixed cost, and the longest) on a grid of exactly four full waves,
/// on a grid of one block an SM, and on a grid of a few blocks (most SMs idle).
fn calibrate(gpu: &Gpu, l: &Loaded, pool: &mut RandomPool, reps: usize) -> Result<KernelRate, GpuError> {
    let k = &l.kernel;
    let occ = occupancy(k, l.regs, &gpu.limits).max(1);
    let sms = gpu.limits.sms;
    // A short product (one wgmma step, two mma.sync steps), two long ones whose
    // difference gives a K step's cost, and the longest K the sweep runs.
    let (k0, k1, k2, k3) = (64usize, 512usize, 2048usize, 8192usize);
    let steps = |kk: usize| kk.div_ceil(k.bk()) as f64;
    // Each grid: four full waves; one block an SM; a few blocks. A split-K kernel is
    // measured unsplit and without its reduction, which the model adds.
    let grids = calibration_grids(k, occ, sms);
    let mut fit = [(0.0, 0.0, 0.0, 0.0); 3];
    for (g, grid) in grids.iter().enumerate() {
        let (mt, nt) = (grid.rows, grid.cols);
        let waves = grid.waves(occ, sms);
        let mut t = [0.0; 4];
        for (x, &kk) in [k0, k1, k2, k3].iter().enumerate() {
            let p = Problem::nt(1, mt * k.bm, nt * k.bn, kk).with_b(k.b);
            let mut ops = timed_operands(gpu, pool, &p)?;
            let mut w = gpu.alloc_f32(if k.split_k { p.m * p.n } else { 1 })?;
            t[x] = gpu.time(reps, 10, || run_choice(gpu, l, None, (&p, 0), 1, &mut ops, &mut w))?.0;
        }
        let per = ((t[2] - t[1]) / (waves * (steps(k2) - steps(k1)))).max(1e-9);
        let fixed = (t[1] / waves - per * steps(k1)).max(0.0);
        fit[g] = (fixed, per, t[0] / waves, t[3] / waves);
    }
    Ok(KernelRate {
        name: k.name(),
        regs: l.regs,
        occupancy: occ,
        fixed: fit[0].0,
        per_kstep: fit[0].1,
        fixed_alone: fit[1].0,
        per_kstep_alone: fit[1].1,
        fit_from: steps(k1),
        short_steps: steps(k0),
        short: fit[0].2,
        short_alone: fit[1].2,
        fixed_few: fit[2].0,
        per_kstep_few: fit[2].1,
        short_few: fit[2].2,
        fit_to: steps(k2),
        long_steps: steps(k3),
        long: fit[0].3,
        long_alone: fit[1].3,
        long_few: fit[2].3,
    })
}

/// The split-K reduction's calibration: alone, on one row of 8192 columns (its
/// bytes a small share of its time), with one chunk of shares and with two; the
/// bytes at the device's bandwidth, which the model adds apart, are taken out.
fn calibrate_reduce(
    gpu: &Gpu,
    r: &LoadedReducer,
    pool: &mut RandomPool,
    reps: usize,
) -> Result<ReduceRate, GpuError> {
    let p = Problem::nt(1, 1, 8192, 64);
    let mut ops = timed_operands(gpu, pool, &p)?;
    let mut t = [0.0; 2];
    for (x, splits) in [REDUCE_CHUNK, 2 * REDUCE_CHUNK].into_iter().enumerate() {
        let w = gpu.alloc_f32(splits * p.m * p.n)?;
        let bytes = (splits * p.m * p.n * 4 + p.m * p.n * 2) as f64;
        t[x] = gpu.time(reps, 20, || gpu.launch_reduce(r, (&p, 0), splits, &mut ops, &w))?.0
            - bytes / gpu.limits.bandwidth;
    }
    Ok(ReduceRate { fixed: t[0].max(0.0), per_chunk: (t[1] - t[0]).max(0.0) })
}

/// Kernels the benchmark leaves out: those `check` reports found wrong, those whose
/// name contains any of `exclude`, and with `filter` those whose name lacks it.
struct Skip {
    reports: Vec<PathBuf>,
    exclude: Vec<String>,
    filter: Option<String>,
}

/// Kernels a `check --json` report found wrong.
fn failed_kernels(reports: &[PathBuf]) -> Result<Vec<String>, GpuError> {
    let mut out = Vec::new();
    for path in reports {
        let text =
            std::fs::read_to_string(path).map_err(|e| GpuError::Plan(format!("{}: {e}", path.display())))?;
        let doc: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| GpuError::Plan(format!("{}: {e}", path.display())))?;
        for k in doc["kernels"].as_array().into_iter().flatten() {
            if k["failures"].as_array().is_none_or(|f| !f.is_empty()) {
                out.push(k["kernel"].as_str().unwrap_or_default().to_string());
            }
        }
    }
    Ok(out)
}

fn bench(
    dir: &Path,
    reps: usize,
    bandwidth: f64,
    json: Option<&Path>,
    dump: Option<&Path>,
    limit: Option<usize>,
    skip: &Skip,
) -> Result<bool, GpuError> {
    let Opened { gpu, kernels: mut loaded, reducers } = open(Some(dir), bandwidth)?;
    // The sweep's reduction: bf16 without an epilogue.
    let reducer =
        reducers.iter().find(|r| r.kernel.elem == ElemType::Bf16 && r.kernel.epilogue == Epilogue::NONE);
    let failed = failed_kernels(&skip.reports)?;
    if !failed.is_empty() {
        say!("left out (wrong in check): {}", failed.join(", "));
    }
    loaded.retain(|l| {
        let name = l.kernel.name();
        !failed.contains(&name)
            && !skip.exclude.iter().any(|x| name.contains(x.as_str()))
            && skip.filter.as_ref().is_none_or(|f| name.contains(f.as_str()))
    });
    say!("bench on {} (sm_{}{}), {} SMs", gpu.name, gpu.cc.0, gpu.cc.1, gpu.limits.sms);
    let mut rng = StdRng::seed_from_u64(7);
    let mut pool = RandomPool::new(&mut rng);
    let started = std::time::Instant::now();
    let at = || format!("[{:.1} s]", started.elapsed().as_secs_f64());
    let mut out = json
        .map(|p| std::fs::File::create(p).map_err(|e| GpuError::Plan(format!("{}: {e}", p.display()))))
        .transpose()?;
    if let Some(f) = out.as_mut() {
        // The limits the model used, for `replay`.
        let _ = writeln!(f, "{}", json!({"device": gpu.limits}));
    }
    let reduce = reducer.map(|r| calibrate_reduce(&gpu, r, &mut pool, reps)).transpose()?;
    if let Some(r) = reduce {
        say!(
            "calibrated the split-K reduction: {:.2} us + {:.2} us a further chunk of {REDUCE_CHUNK} shares",
            r.fixed * 1e6,
            r.per_chunk * 1e6
        );
        if let Some(f) = out.as_mut() {
            let _ = writeln!(f, "{}", json!({"reduction": r}));
        }
    }
    // The sweep's families: bf16 without an epilogue, per B layout.
    let mut models = Vec::new();
    for layout in [BLayout::KMajor, BLayout::NMajor] {
        let fam: Vec<&Loaded> = loaded
            .iter()
            .filter(|l| {
                // Split-K kernels only with their reduction at hand.
                // (Stream-K kernels are not calibrated: the model does not
                // price them yet.)
                l.kernel.elem == ElemType::Bf16
                    && l.kernel.b == layout
                    && l.kernel.epilogue == Epilogue::NONE
                    && !l.kernel.fold
                    && (!l.kernel.split_k || reducer.is_some())
            })
            .collect();
        let mut rates = Vec::new();
        for l in &fam {
            let r = calibrate(&gpu, l, &mut pool, reps)?;
            say!(
                "{} calibrated {:<40} regs {:>3} occupancy {:>2}: a wave {:.2} us + {:.3} us a K step ({:.2} us at {} steps); alone {:.2} us + {:.3} us ({:.2} us); {FEW_BLOCKS} SMs busy {:.2} us + {:.3} us ({:.2} us)",
                at(),
                r.name,
                r.regs,
                r.occupancy,
                r.fixed * 1e6,
                r.per_kstep * 1e6,
                r.short * 1e6,
                r.short_steps,
                r.fixed_alone * 1e6,
                r.per_kstep_alone * 1e6,
                r.short_alone * 1e6,
                r.fixed_few * 1e6,
                r.per_kstep_few * 1e6,
                r.short_few * 1e6
            );
            if let Some(f) = out.as_mut() {
                let _ = writeln!(f, "{}", json!({"calibration": r}));
            }
            rates.push(r);
        }
        let model =
            WaveModel { device: gpu.limits, kernels: fam.iter().map(|l| l.kernel).collect(), rates, reduce };
        models.push((layout, fam, model));
    }
    let mut bests: Vec<(Problem, f64)> = Vec::new();
    let mut regrets_model = Vec::new();
    let mut regrets_tree = Vec::new();
    let mut trees: Vec<MTree> = Vec::new();
    let problems: Vec<_> = sweep().into_iter().take(limit.unwrap_or(usize::MAX)).collect();
    let mut used_graph = true;
    for p in problems {
        let layout = p.b;
        let Some((_, fam, model)) = models.iter().find(|(l, _, _)| *l == layout) else { continue };
        let mut ops = timed_operands(&gpu, &mut pool, &p)?;
        let covers = measured_covers(model, &p);
        let most = covers.iter().map(|c| workspace_len(&model.kernels, c, &p)).max().unwrap_or(1);
        let mut w = gpu.alloc_f32(most)?;
        // Every single choice measured (the exhaustive search the model's regret is
        // taken against), and the two-size covers the model ranks first.
        let mut times = Vec::new();
        for c in covers {
            let (t, graph) = gpu.time(reps, 20, || {
                run_cover(&gpu, (&model.kernels, fam), reducer, &c, &p, &mut ops, &mut w)
            })?;
            used_graph &= graph;
            times.push((c, t));
        }
        let Some(&(best, best_t)) = times.iter().min_by(|a, b| a.1.total_cmp(&b.1)) else { continue };
        let time_of = |c: Cover| times.iter().find(|x| x.0 == c).map(|x| x.1).unwrap_or(f64::INFINITY);
        let (pick, predicted) = model.choose_cover(&p).unwrap_or((best, f64::NAN));
        let tree = match trees.iter().find(|t| t.signature == Problem { m: 0, ..p }) {
            Some(t) => t.clone(),
            None => {
                let t = MTree::distill(model, p, 8192)
                    .ok_or_else(|| GpuError::Plan(format!("no kernel for {p}")))?;
                say!("{}", t.text(model));
                trees.push(t.clone());
                t
            }
        };
        bests.push((p, best_t));
        let tree_pick = tree.choose(model, p.m).unwrap_or(pick);
        let (tm, tt) = (time_of(pick), time_of(tree_pick));
        regrets_model.push(tm / best_t - 1.0);
        regrets_tree.push(tt / best_t - 1.0);
        let tf = |t: f64| p.flops() / t / 1e12;
        say!(
            "{} {:<4} {:<18} best {:<36} {:>9.2} us {:>7.1} TF/s | model {:<36} {:>9.2} us (predicted {:>9.2}) regret {:>5.1}% | tree regret {:>5.1}%",
            at(),
            layout.tag(),
            p.to_string(),
            model.describe_cover(&best, &p),
            best_t * 1e6,
            tf(best_t),
            model.describe_cover(&pick, &p),
            tm * 1e6,
            predicted * 1e6,
            (tm / best_t - 1.0) * 100.0,
            (tt / best_t - 1.0) * 100.0
        );
        if let Some(f) = out.as_mut() {
            let all: serde_json::Map<String, serde_json::Value> =
                times.iter().map(|(c, t)| (model.describe_cover(c, &p), json!(t))).collect();
            let _ = writeln!(
                f,
                "{}",
                json!({
                    "layout": layout.tag(),
                    "batch": p.batch, "m": p.m, "n": p.n, "k": p.k,
                    "best": model.describe_cover(&best, &p), "best_s": best_t, "best_tflops": tf(best_t),
                    "model": model.describe_cover(&pick, &p), "model_s": tm, "model_predicted_s": predicted, "model_tflops": tf(tm),
                    "tree": model.describe_cover(&tree_pick, &p), "tree_s": tt,
                    "all": all,
                })
            );
        }
        if let Some(d) = dump {
            if p.batch * p.m * p.n <= 1 << 22 && [1, 127, 383, 64, 16, 2821].contains(&p.m) {
                dump_case(&gpu, d, (model, fam, reducer), &pick, layout, &p, &mut rng)?;
            }
        }
    }
    let priced: Vec<&WaveModel> = models.iter().map(|(_, _, m)| m).collect();
    stream_k_against_tiles(&gpu, (&loaded, &priced), &bests, &mut pool, reps, out.as_mut())?;
    let Regret { mean: mm, median: md, max: mx } = Regret::of(&regrets_model);
    let Regret { mean: tm, median: td, max: tx } = Regret::of(&regrets_tree);
    say!("model regret: mean {mm:.1}%, median {md:.1}%, max {mx:.1}%; tree regret: mean {tm:.1}%, median {td:.1}%, max {tx:.1}%");
    say!(
        "timing: {}",
        if used_graph {
            "CUDA graphs of 20 launches"
        } else {
            "back-to-back launches (a graph capture failed)"
        }
    );
    if let Some(f) = out.as_mut() {
        let _ = writeln!(
            f,
            "{}",
            json!({"regret": {"model_mean": mm, "model_median": md, "model_max": mx, "tree_mean": tm, "tree_median": td, "tree_max": tx}, "graphs": used_graph})
        );
    }
    Ok(true)
}

/// Each Stream-K kernel of the family (bf16, no epilogue) on the sweep's
/// single products it takes, in a resident wave of blocks (`occupancy` a
/// SM), against its own tile as an unsplit kernel and against the sweep's
/// best, with the wave model's price from its tile's calibration
/// (`WaveModel::predict_stream_k`, which no choice takes until a run like
/// this one has checked it). Products whose tiles fill whole waves are left
/// out (Stream-K's blocks then take whole tiles), and the section stops after
/// [`STREAM_K_SECONDS`], saying how many timings it left.
fn stream_k_against_tiles(
    gpu: &Gpu,
    (loaded, models): (&[Loaded], &[&WaveModel]),
    bests: &[(Problem, f64)],
    pool: &mut RandomPool,
    reps: usize,
    mut out: Option<&mut std::fs::File>,
) -> Result<(), GpuError> {
    let started = std::time::Instant::now();
    let mut left = 0;
    for l in loaded.iter().filter(|l| l.kernel.stream_k && l.kernel.epilogue == Epilogue::NONE) {
        let k = &l.kernel;
        let plain = k.unsplit();
        let tile = loaded.iter().find(|x| x.kernel == plain);
        let wave = gpu.limits.sms * occupancy(k, l.regs, &gpu.limits).max(1);
        let priced = models.iter().find_map(|m| m.kernels.iter().position(|x| *x == plain).map(|i| (*m, i)));
        let takes =
            |p: &Problem| p.batch == 1 && p.b == k.b && k.accepts(p).is_ok() && k.blocks(p) % wave != 0;
        for &(p, best) in bests.iter().filter(|(p, _)| takes(p)) {
            if started.elapsed().as_secs_f64() > STREAM_K_SECONDS {
                left += 1;
                continue;
            }
            let blocks = wave.min(k.stream_steps(&p));
            let (floats, tiles) = k.fold_space(&p, k.stream_slots(&p, blocks));
            let (mut w, mut cnt) = (gpu.alloc_f32(floats)?, gpu.alloc_counters(tiles)?);
            let mut ops = timed_operands(gpu, pool, &p)?;
            let (t, _) =
                gpu.time(reps, 20, || gpu.launch_stream_k(l, (&p, 0), blocks, &mut ops, (&mut w, &mut cnt)))?;
            let own = match tile {
                Some(x) if x.kernel.accepts(&p).is_ok() => {
                    Some(gpu.time(reps, 20, || gpu.launch(x, (&p, 0), &mut ops))?.0)
                }
                _ => None,
            };
            let predicted = priced.and_then(|(m, i)| m.predict_stream_k(i, k, &p, blocks));
            say!(
                "stream-K {:<40} {:<18} {blocks:>4} blocks {:>9.2} us (predicted {}) | its tile {} | the sweep's best {:>9.2} us ({:.2}x)",
                k.name(),
                p.to_string(),
                t * 1e6,
                predicted.map_or("-".to_string(), |x| format!("{:.2} us", x * 1e6)),
                own.map_or("-".to_string(), |o| format!("{:.2} us ({:.2}x)", o * 1e6, o / t)),
                best * 1e6,
                best / t
            );
            if let Some(f) = out.as_mut() {
                let _ = writeln!(
                    f,
                    "{}",
                    json!({"stream_k": k.name(), "layout": k.b.tag(), "m": p.m, "n": p.n, "k": p.k,
                           "blocks": blocks, "s": t, "predicted_s": predicted, "tile_s": own, "best_s": best})
                );
            }
        }
    }
    if left > 0 {
        say!("stream-K: {left} timings left out past {STREAM_K_SECONDS} s");
    }
    Ok(())
}

/// Seconds the bench's Stream-K section runs at most.
const STREAM_K_SECONDS: f64 = 45.0;

/// Writes one product's operands and this family's result (raw little-endian
/// 16-bit) and a line of JSON describing them, for the cuBLAS comparison.
fn dump_case(
    gpu: &Gpu,
    dir: &Path,
    (model, fam, r): (&WaveModel, &[&Loaded], Option<&LoadedReducer>),
    cover: &Cover,
    layout: BLayout,
    p: &Problem,
    rng: &mut StdRng,
) -> Result<(), GpuError> {
    std::fs::create_dir_all(dir).map_err(|e| GpuError::Plan(e.to_string()))?;
    let name = model.describe_cover(cover, p);
    let k = &fam[cover.main.kernel].kernel;
    let case = Case::new(rng, k, *p, 0, 0);
    let mut ops = case.upload(gpu, k)?;
    let mut w = gpu.alloc_f32(workspace_len(&model.kernels, cover, p))?;
    run_cover(gpu, (&model.kernels, fam), r, cover, p, &mut ops, &mut w)?;
    let got = gpu.download(&ops.c)?;
    let c = &got[MARGIN..MARGIN + p.batch * p.m * p.n];
    let stem = format!("{}_{}x{}x{}x{}", layout.tag(), p.batch, p.m, p.n, p.k);
    let write = |suffix: &str, x: &[u16]| {
        let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(dir.join(format!("{stem}.{suffix}.bin")), bytes)
            .map_err(|e| GpuError::Plan(e.to_string()))
    };
    write("a", &case.a)?;
    write("b", &case.b)?;
    write("c", c)?;
    let mut index = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("index.jsonl"))
        .map_err(|e| GpuError::Plan(e.to_string()))?;
    let _ = writeln!(
        index,
        "{}",
        json!({"stem": stem, "layout": layout.tag(), "batch": p.batch, "m": p.m, "n": p.n, "k": p.k, "kernel": name})
    );
    Ok(())
}

/// `replay`: every product of a record through this build's wave model, the model's
/// pick against the best measured, and the regret over the sweep.
fn replay_record(
    path: &Path,
    above: f64,
    detail: bool,
    (covers, residuals, stream_k): (bool, bool, bool),
) -> Result<bool, GpuError> {
    let text =
        std::fs::read_to_string(path).map_err(|e| GpuError::Plan(format!("{}: {e}", path.display())))?;
    let record = Record::parse(&text).map_err(|e| GpuError::Plan(format!("{}: {e}", path.display())))?;
    let family: Vec<GemmKernel> =
        [ElemType::Bf16, ElemType::F16].into_iter().flat_map(gpu::candidates::plain_family).collect();
    let rows =
        replay::replay(&record, &family).map_err(|e| GpuError::Plan(format!("{}: {e}", path.display())))?;
    let mut regrets = Vec::new();
    let mut unmeasured = 0;
    for r in &rows {
        let regret = r.regret();
        match regret {
            Some(x) => regrets.push(x),
            None => unmeasured += 1,
        }
        if regret.is_some_and(|x| x * 100.0 <= above) {
            continue;
        }
        say!(
            "{:<4} {:<18} best {:<36} {:>9.2} us | model {:<36} {} (predicted {:>9.2}) regret {}",
            r.layout.tag(),
            r.problem.to_string(),
            r.best,
            r.best_s * 1e6,
            r.pick,
            r.pick_s.map_or("not measured".to_string(), |t| format!("{:>9.2} us", t * 1e6)),
            r.predicted_s * 1e6,
            regret.map_or("-".to_string(), |x| format!("{:>5.1}%", x * 100.0))
        );
        if detail {
            let mut choices = r.choices.clone();
            choices.sort_by(|a, b| a.2.unwrap_or(f64::INFINITY).total_cmp(&b.2.unwrap_or(f64::INFINITY)));
            for (name, predicted, measured) in choices {
                say!(
                    "       {name:<44} measured {} predicted {:>9.2} us",
                    measured.map_or("        -".to_string(), |t| format!("{:>9.2} us", t * 1e6)),
                    predicted * 1e6
                );
            }
        }
    }
    // Where the model would rather take a cover the run did not time (a two-size
    // cover, on a record from before the bench timed them).
    let rather: Vec<&replay::Replayed> = rows.iter().filter(|r| r.unmeasured.is_some()).collect();
    for r in &rather {
        if let Some((name, t)) = &r.unmeasured {
            say!(
                "{:<4} {:<18} the model would take {name} (predicted {:.2} us, {:.1}% under its measured pick's prediction); not in the record",
                r.layout.tag(),
                r.problem.to_string(),
                t * 1e6,
                (1.0 - t / r.predicted_s) * 100.0
            );
        }
    }
    let Regret { mean, median, max } = Regret::of(&regrets);
    say!(
        "model regret over {} products: mean {mean:.1}%, median {median:.1}%, max {max:.1}%{}",
        regrets.len(),
        if unmeasured > 0 {
            format!("; {unmeasured} picks the record did not measure")
        } else {
            String::new()
        }
    );
    // Stream-K timings: this build's price against the measured time.
    let stream: Vec<GemmKernel> = gpu::candidates::stream_k_family(ElemType::Bf16, Epilogue::NONE);
    let with_stream: Vec<GemmKernel> = family.iter().chain(&stream).copied().collect();
    let mut misses = Vec::new();
    for x in &record.stream_k {
        let predicted = x.predicted(&record, &with_stream);
        if let Some(t) = predicted {
            misses.push((x.s / t - 1.0).abs());
        }
        say!(
            "stream-K {:<40} {:<4} {}x{}x{} {:>4} blocks measured {:>9.2} us predicted {}",
            x.kernel,
            x.layout,
            x.m,
            x.n,
            x.k,
            x.blocks,
            x.s * 1e6,
            predicted.map_or("-".to_string(), |t| format!("{:.2} us", t * 1e6))
        );
    }
    if !misses.is_empty() {
        let Regret { mean, max, .. } = Regret::of(&misses);
        say!("Stream-K price over {} timings: off by {mean:.1}% on average, {max:.1}% at most", misses.len());
    }
    if stream_k {
        let rows = replay::stream_study(&record, &family, &stream)
            .map_err(|e| GpuError::Plan(format!("{}: {e}", path.display())))?;
        let mut ahead = 0;
        for r in &rows {
            let gain = r.best_s / r.predicted;
            ahead += usize::from(gain > 1.03);
            say!(
                "{:<4} {:<18} Stream-K {:<40} {:>4} blocks predicted {:>9.2} us | best measured {:<44} {:>9.2} us ({gain:.2}x)",
                r.layout.tag(),
                r.problem.to_string(),
                r.kernel,
                r.blocks,
                r.predicted * 1e6,
                r.best,
                r.best_s * 1e6
            );
        }
        say!(
            "Stream-K predicted more than 3% under the best measured on {ahead} of {} products (a prediction: not yet timed on a device)",
            rows.len()
        );
    }
    if residuals {
        let bins = replay::residuals(&record, &family, 8e-6)
            .map_err(|e| GpuError::Plan(format!("{}: {e}", path.display())))?;
        for b in bins {
            say!("{:<58} {:>5} timings  measured / predicted {:.3}", b.regime, b.timings, b.ratio);
        }
    }
    if covers {
        let study = replay::cover_study(&record, &family, 8192)
            .map_err(|e| GpuError::Plan(format!("{}: {e}", path.display())))?;
        for s in study {
            say!(
                "{:<4} Mx{}x{}: tree of {} leaves (depth {}); two sizes at {} of M = 1-{} ({:.0}%), predicted {:.1}% faster there on average, {:.1}% at most",
                s.layout.tag(),
                s.n,
                s.k,
                s.leaves,
                s.depth,
                s.covered,
                s.m_max,
                100.0 * s.covered as f64 / s.m_max as f64,
                100.0 * s.gain_mean,
                100.0 * s.gain_max
            );
        }
    }
    Ok(unmeasured == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pool hands out its values in turn, cycling past its end, at any length.
    #[test]
    fn the_random_pool_cycles_through_its_values() {
        let mut pool = RandomPool::new(&mut StdRng::seed_from_u64(1));
        let len = RandomPool::LEN;
        let first = pool.take(10);
        assert_eq!(first, pool.values[..10]);
        let long = pool.take(len + 5);
        assert_eq!(long.len(), len + 5);
        assert_eq!(long[..len - 10], pool.values[10..]);
        assert_eq!(long[len - 10..], pool.values[..15]);
        assert_eq!(pool.take(0), Vec::<u16>::new());
        assert_eq!(pool.take(3), pool.values[15..18]);
    }
}
