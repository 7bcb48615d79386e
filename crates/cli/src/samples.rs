//! `anyshape tune --samples FILE`: DietCode's categorization for a known shape
//! distribution ([`tune::categorize`]). Prints the trade-off between the
//! kernels kept and the predicted slowdown, writes the chosen kernel list (for
//! `bench-matmul --kernels FILE`), and measures what the choice gains (compile
//! time) and costs (GFLOP/s on the samples) against the whole family.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Result;
use kernels::{
    ALayout, BLayout, CostModel, Dispatcher, ElemType, EpilogueArgs, MatRef, Problem, Target, ThreadPool,
};
use tune::categorize::{categorize, parse_samples, pick, restrict, KernelId, Sample, SampleShape};

use crate::UserError;

/// What `--out` holds: the kept kernels and where they came from.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct KernelList {
    /// The element type of the family the kernels were chosen from.
    #[serde(default)]
    pub elem: ElemType,
    pub kernels: Vec<KernelId>,
    pub samples: String,
    pub tolerance: f64,
    pub predicted_mean_slowdown: f64,
}

/// Read a kernel list written by `tune --samples --out` for a family of `elem`.
pub fn load_kernel_list(path: &Path, elem: ElemType) -> Result<Vec<KernelId>> {
    let text =
        std::fs::read_to_string(path).map_err(|e| UserError(format!("--kernels {}: {e}", path.display())))?;
    let list: KernelList = serde_json::from_str(&text)
        .map_err(|e| UserError(format!("--kernels {}: not a kernel list ({e})", path.display())))?;
    if list.kernels.is_empty() {
        return Err(UserError(format!("--kernels {}: the list is empty", path.display())).into());
    }
    if list.elem != elem {
        return Err(UserError(format!(
            "--kernels {}: a list of {} kernels, for a {elem} family",
            path.display(),
            list.elem
        ))
        .into());
    }
    Ok(list.kernels)
}

/// The problem of one sample as a compiled model meets it: one matmul has a weight
/// packed for the row counts its (n, k) meets among the samples; a batch has
/// row-major activations.
fn problem(d: &Dispatcher, s: &SampleShape, all: &[SampleShape]) -> Result<Problem> {
    let b = if s.batch == 1 {
        let rows: Vec<usize> =
            all.iter().filter(|o| (o.n, o.k, o.batch) == (s.n, s.k, 1)).map(|o| o.m).collect();
        d.weight_layout(s.k, s.n, &rows)?
    } else {
        BLayout::NMajor
    };
    Ok(Problem { batch: s.batch, m: s.m, n: s.n, k: s.k, a: ALayout::RowMajor, b })
}

/// Best GFLOP/s of `p` through `d` (memoized schedule), best of three rounds of 20 ms.
fn measure(d: &Dispatcher, pool: &ThreadPool, p: &Problem, rows: &[usize]) -> Result<f64> {
    let (batch, m, n, k) = (p.batch, p.m, p.n, p.k);
    let a: Vec<f32> = (0..batch * m * k).map(|i| (i % 17) as f32 * 0.01).collect();
    let b: Vec<f32> = (0..batch * k * n).map(|i| (i % 13) as f32 * 0.01).collect();
    let mut c = vec![0.0f32; batch * m * n];
    let packed = match p.b {
        BLayout::Packed { .. } => Some(d.pack_weight(MatRef::row_major(&b[..k * n], k, n)?, rows)?),
        _ => None,
    };
    // Launch arguments once per shape: the timed calls are dispatch and contraction.
    let (av, bv, mut cv) =
        crate::bench::operand_views((&a, &b, &mut c), packed.as_ref(), (batch, m, n, k), false)?;
    let mut run = || -> Result<()> {
        d.batched(pool, &av, &bv, &mut cv, &EpilogueArgs::default())?;
        Ok(())
    };
    let best = crate::bench::time_per_call(3, 0.02, &mut run)?;
    Ok(p.flops() / best / 1e9)
}

pub struct TuneSamples {
    pub samples: PathBuf,
    pub tolerance: f64,
    pub out: Option<PathBuf>,
    pub threads: Option<usize>,
    pub cache_dir: Option<PathBuf>,
    pub elem: ElemType,
}

pub fn tune_samples(args: TuneSamples) -> Result<()> {
    let text = std::fs::read_to_string(&args.samples)
        .map_err(|e| UserError(format!("--samples {}: {e}", args.samples.display())))?;
    let shapes =
        parse_samples(&text).map_err(|e| UserError(format!("--samples {}: {e}", args.samples.display())))?;
    if !(0.0..=10.0).contains(&args.tolerance) {
        return Err(UserError("--tolerance is a fraction, e.g. 0.02".into()).into());
    }
    let target = Target::detect();
    if !target.supported() {
        return Err(UserError("the contraction engine needs x86-64 with AVX2 and FMA".into()).into());
    }
    let pool = ThreadPool::new(args.threads.unwrap_or(target.cores));
    let cache = args.cache_dir.clone().or_else(codegen::tuning::default_cache_dir);
    let model = CostModel::Hierarchical;
    let t0 = Instant::now();
    target.check_elem(args.elem).map_err(|e| UserError(format!("--dtype {}: {e}", args.elem)))?;
    let whole = codegen::Contraction::builder(&target, &pool)
        .model(model)
        .cache(cache.as_deref())
        .elem(args.elem)
        .build()?;
    let whole_ms = t0.elapsed().as_secs_f64() * 1e3;
    let d: &Dispatcher = &whole;
    let samples = shapes
        .iter()
        .map(|s| Ok(Sample { problem: problem(d, s, &shapes)?, weight: s.weight }))
        .collect::<Result<Vec<_>>>()?;
    let t0 = Instant::now();
    let curve = categorize(&target, d.machine(), model, d.family(), &samples)?;
    let categorize_ms = t0.elapsed().as_secs_f64() * 1e3;
    say!(
        "# {} sample shapes from {}; categorized in {categorize_ms:.0} ms (model: {})",
        samples.len(),
        args.samples.display(),
        model.name()
    );
    say!("{:>8} {:>15} {:>14}  kernels", "kept", "mean slowdown", "max slowdown");
    for point in curve.iter().filter(|c| c.kernels.len() <= 8 || c.kernels.len() == curve[0].kernels.len()) {
        let names: Vec<String> = point.kernels.iter().map(|k| k.to_string()).collect();
        say!(
            "{:>8} {:>14.1}% {:>13.1}%  {}",
            point.kernels.len(),
            100.0 * (point.mean_slowdown - 1.0),
            100.0 * (point.max_slowdown - 1.0),
            if point.kernels.len() <= 8 { names.join(", ") } else { "(the whole family)".into() }
        );
    }
    let chosen = pick(&curve, args.tolerance)
        .ok_or_else(|| UserError(format!("no family within {:.1}%", 100.0 * args.tolerance)))?;
    // The chosen family must serve every sample (`categorize` guarantees it; restrict checks it).
    restrict(d.family(), &chosen.kernels)?;
    let names: Vec<String> = chosen.kernels.iter().map(|k| k.to_string()).collect();
    say!(
        "# chosen within {:.1}%: {} of {} kernels ({})",
        100.0 * args.tolerance,
        chosen.kernels.len(),
        curve[0].kernels.len(),
        names.join(", ")
    );
    if let Some(out) = &args.out {
        let list = KernelList {
            elem: args.elem,
            kernels: chosen.kernels.clone(),
            samples: args.samples.display().to_string(),
            tolerance: args.tolerance,
            predicted_mean_slowdown: chosen.mean_slowdown,
        };
        std::fs::write(out, serde_json::to_string_pretty(&list)?)
            .map_err(|e| UserError(format!("--out {}: {e}", out.display())))?;
        say!("# written to {}", out.display());
    }
    // What the choice gains and costs, measured.
    let t0 = Instant::now();
    let kept = codegen::Contraction::builder(&target, &pool)
        .model(model)
        .cache(cache.as_deref())
        .keep(Some(&chosen.kernels))
        .elem(args.elem)
        .build()?;
    let kept_ms = t0.elapsed().as_secs_f64() * 1e3;
    say!(
        "# compile: whole family {} kernels {whole_ms:.0} ms; kept {} kernels {kept_ms:.0} ms",
        whole.kernels().len() + whole.direct_kernels().len(),
        kept.kernels().len() + kept.direct_kernels().len()
    );
    say!("{:>5} {:>6} {:>6} {:>6} {:>10} {:>10} {:>7}", "batch", "m", "n", "k", "whole", "kept", "ratio");
    let (mut sum_w, mut sum_log) = (0.0, 0.0);
    for (s, shape) in samples.iter().zip(&shapes) {
        let rows: Vec<usize> =
            shapes.iter().filter(|o| (o.n, o.k, o.batch) == (shape.n, shape.k, 1)).map(|o| o.m).collect();
        let p = &s.problem;
        let (g_whole, g_kept) = (measure(&whole, &pool, p, &rows)?, measure(&kept, &pool, p, &rows)?);
        sum_w += s.weight;
        sum_log += s.weight * (g_kept / g_whole).ln();
        say!(
            "{:>5} {:>6} {:>6} {:>6} {g_whole:>10.1} {g_kept:>10.1} {:>6.2}x",
            p.batch,
            p.m,
            p.n,
            p.k,
            g_kept / g_whole
        );
    }
    say!(
        "# weighted geometric mean, kept / whole: {:.3}x (GFLOP/s, {} threads)",
        (sum_log / sum_w).exp(),
        pool.threads()
    );
    Ok(())
}
