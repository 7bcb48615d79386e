//! `anyshape tune --samples FILE --search bayes`: trust-region Bayesian search
//! (TSCompiler §5.1, [`tune::bayes`]) over the macro-kernel parameters of each
//! class of samples (the samples that differ only in M), by measuring real runs.
//!
//! A point of the search is a [`MacroKernel`]: operand access, register tile,
//! `KC`, `MC` and loop order, within the hardware's hard constraints (a B
//! micro-panel fits L1, an A block fits L2). Its cost is the weighted mean, over
//! the class's row counts, of the log of its measured time over the untuned
//! dispatcher's, so that each row count weighs the same whatever its size. The
//! trust regions start at the model's own picks (hardware-aligned initial
//! populations). Afterwards a small collection of the best macro-kernels and the
//! model's choice are compared at each row count, and the table of winners is
//! written for `bench-matmul --tuned FILE` (and any dispatcher's `with_tuned`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use kernels::{
    execute, ALayout, BLayout, Dispatcher, ElemType, EpilogueArgs, LoopOrder, MacroKernel, MatRef, Operands,
    PackedB, Problem, Schedule, Target, ThreadPool, TunedClass, TunedRow, TunedSchedules,
};
use tune::bayes::{minimize, Axis, SearchSpace, TrustRegionOptions};
use tune::categorize::parse_samples;

use crate::UserError;

pub struct TuneSearch {
    pub samples: PathBuf,
    pub budget: usize,
    pub seed: u64,
    pub out: Option<PathBuf>,
    pub threads: Option<usize>,
    pub cache_dir: Option<PathBuf>,
    pub elem: ElemType,
}

/// Rows of A per block, in micro-panels: a geometric grid.
const MC_PANELS: [i64; 16] = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256];
/// How many macro-kernels a class keeps for its table.
const COLLECTION: usize = 3;

/// The samples of one class: (m, weight) at one (batch, n, k).
struct Class {
    batch: usize,
    n: usize,
    k: usize,
    rows: Vec<(usize, f64)>,
}

/// One class's operands, allocated once for its largest M, and its weight packed
/// in each layout the search asks for (a handful kept).
struct Bench<'a> {
    d: &'a Dispatcher,
    pool: &'a ThreadPool,
    class: &'a Class,
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
    packed: Vec<PackedB>,
}

impl Bench<'_> {
    fn weight(&self) -> bool {
        self.class.batch == 1
    }

    fn problem(&self, m: usize, b: BLayout) -> Problem {
        Problem { batch: self.class.batch, m, n: self.class.n, k: self.class.k, a: ALayout::RowMajor, b }
    }

    /// Seconds per call of `s` at `m` (best of 3 rounds of at least 5 ms each).
    fn time(&mut self, s: &Schedule, m: usize, layout: BLayout) -> Result<f64> {
        let (batch, n, k) = (self.class.batch, self.class.n, self.class.k);
        if let BLayout::Packed { nr, kc } = layout {
            if !self.packed.iter().any(|p| (p.nr, p.kc) == (nr, kc)) {
                if self.packed.len() >= 6 {
                    self.packed.remove(0);
                }
                let elem = self.d.family().elem();
                self.packed.push(PackedB::of_elem(MatRef::row_major(&self.b[..k * n], k, n)?, nr, kc, elem));
            }
        }
        let plan = self.d.plan(s)?;
        let packed = match layout {
            BLayout::Packed { nr, kc } => self.packed.iter().find(|p| (p.nr, p.kc) == (nr, kc)),
            _ => None,
        };
        let (a, b, c) = (&self.a, &self.b, &mut self.c[..batch * m * n]);
        let (av, bv, mut cv) = crate::bench::operand_views((a, b, c), packed, (batch, m, n, k), false)?;
        let pool = self.pool;
        let run = || -> Result<()> {
            execute(pool, &plan, &av, &bv, &mut cv, &EpilogueArgs::default())?;
            Ok(())
        };
        crate::bench::time_per_call(3, 0.005, run)
    }

    /// The layout B has under `mk` (a weight is packed for its tile width and depth).
    fn layout_for(&self, mk: &MacroKernel) -> BLayout {
        if self.weight() {
            BLayout::Packed { nr: mk.nr, kc: mk.kc }
        } else {
            BLayout::NMajor
        }
    }

    /// The schedule `mk` gives row count `m`: its own, or the model's where it has
    /// none for that M (as the dispatcher would fall back at run time).
    fn schedule(&self, mk: &MacroKernel, m: usize) -> Result<Schedule> {
        let p = self.problem(m, self.layout_for(mk));
        Ok(match mk.instantiate(self.d, &p) {
            Some(s) => s,
            None => self.d.choose(&p)?,
        })
    }
}

/// The search space of one class: every axis hardware-aligned, every point within
/// the hard constraints.
fn space(d: &Dispatcher, class: &Class) -> Result<SearchSpace> {
    let fam = d.family().clone();
    let t = d.target().clone();
    let widths: Vec<i64> = fam.widths().iter().map(|&w| w as i64).collect();
    let kmax = class.k.next_multiple_of(16).min(1024) as i64;
    let axes = vec![
        Axis::new("operands", vec![0, 1]),
        Axis::new("nr", widths),
        Axis::new("mr", (1..=16).collect()),
        Axis::new("kc", (1..=kmax / 16).map(|i| i * 16).collect()),
        Axis::new("mc_panels", MC_PANELS.to_vec()),
        Axis::new("order", vec![0, 1]),
    ];
    let valid = move |v: &[i64]| {
        let (direct, nr, mr, kc, panels, order) =
            (v[0] == 1, v[1] as usize, v[2] as usize, v[3] as usize, v[4] as usize, v[5]);
        let tile = if direct {
            fam.direct_of_width(nr).iter().any(|x| x.kernel.mr == mr) && panels == 1 && order == 0
        } else {
            fam.get(mr, nr).is_some() && fam.best_height(nr).is_some_and(|b| mr <= b)
        };
        // Hard constraints: a B micro-panel in L1; a block of A in L2.
        let fits = kc * nr * 4 <= t.l1d && (direct || panels * mr * kc * 4 <= t.l2);
        tile && fits
    };
    Ok(SearchSpace::new(axes, valid).map_err(|e| UserError(format!("search space: {e}")))?)
}

fn to_point(mk: &MacroKernel) -> Vec<i64> {
    let panels = (mk.mc / mk.mr.max(1)).max(1) as i64;
    let near = |x: i64, grid: &[i64]| *grid.iter().min_by_key(|&&g| (g - x).abs()).unwrap_or(&1);
    vec![
        i64::from(mk.operands == Operands::Direct),
        mk.nr as i64,
        mk.mr as i64,
        ((mk.kc as i64 + 8) / 16).max(1) * 16,
        if mk.operands == Operands::Direct { 1 } else { near(panels, &MC_PANELS) },
        i64::from(mk.order == LoopOrder::MOuter && mk.operands == Operands::Packed),
    ]
}

fn from_point(v: &[i64]) -> MacroKernel {
    let (mr, kc, panels) = (v[2] as usize, v[3] as usize, v[4] as usize);
    MacroKernel {
        operands: if v[0] == 1 { Operands::Direct } else { Operands::Packed },
        nr: v[1] as usize,
        mr,
        kc,
        mc: panels * mr,
        order: if v[5] == 1 { LoopOrder::MOuter } else { LoopOrder::KOuter },
        threads: None,
    }
}

/// Weighted mean of `ln(t / base)` over a class's rows.
fn log_ratio(times: &[f64], base: &[f64], rows: &[(usize, f64)]) -> f64 {
    let w: f64 = rows.iter().map(|r| r.1).sum();
    times.iter().zip(base).zip(rows).map(|((t, b), r)| r.1 * (t / b).ln()).sum::<f64>() / w.max(1e-12)
}

pub fn tune_search(args: TuneSearch) -> Result<()> {
    let text = std::fs::read_to_string(&args.samples)
        .map_err(|e| UserError(format!("--samples {}: {e}", args.samples.display())))?;
    let shapes =
        parse_samples(&text).map_err(|e| UserError(format!("--samples {}: {e}", args.samples.display())))?;
    if args.budget < 4 {
        return Err(UserError("--budget: at least 4 measurements per class".into()).into());
    }
    let target = Target::detect();
    if !target.supported() {
        return Err(UserError("the contraction engine needs x86-64 with AVX2 and FMA".into()).into());
    }
    let pool = ThreadPool::new(args.threads.unwrap_or(target.cores));
    let cache = args.cache_dir.clone().or_else(codegen::tuning::default_cache_dir);
    target.check_elem(args.elem).map_err(|e| UserError(format!("--dtype {}: {e}", args.elem)))?;
    let contraction =
        codegen::Contraction::builder(&target, &pool).cache(cache.as_deref()).elem(args.elem).build()?;
    let d: &Dispatcher = &contraction;
    // The classes: samples equal but for M.
    let mut classes: Vec<Class> = Vec::new();
    for s in &shapes {
        match classes.iter_mut().find(|c| (c.batch, c.n, c.k) == (s.batch, s.n, s.k)) {
            Some(c) => c.rows.push((s.m, s.weight)),
            None => classes.push(Class { batch: s.batch, n: s.n, k: s.k, rows: vec![(s.m, s.weight)] }),
        }
    }
    for c in &mut classes {
        c.rows.sort_by_key(|r| r.0);
        c.rows.dedup_by_key(|r| r.0);
    }
    say!(
        "# trust-region Bayesian search over macro-kernels: {} classes, budget {} measurements each, {} threads",
        classes.len(),
        args.budget,
        pool.threads()
    );
    let start = Instant::now();
    let mut tuned = TunedSchedules { threads: pool.threads(), elem: args.elem, classes: Vec::new() };
    let mut total = (0.0, 0.0);
    for class in &classes {
        let t0 = Instant::now();
        let mmax = class.rows.iter().map(|r| r.0).max().unwrap_or(1);
        let (batch, n, k) = (class.batch, class.n, class.k);
        let fill = |len: usize, p: usize| -> Vec<f32> { (0..len).map(|i| (i % p) as f32 * 0.01).collect() };
        let mut bench = Bench {
            d,
            pool: &pool,
            class,
            a: fill(batch * mmax * k, 17),
            b: fill(batch * k * n, 13),
            c: vec![0.0; batch * mmax * n],
            packed: Vec::new(),
        };
        // The untuned dispatcher: the model's layout for the weight and its choices.
        let ms: Vec<usize> = class.rows.iter().map(|r| r.0).collect();
        let base_layout = if bench.weight() { d.weight_layout(k, n, &ms)? } else { BLayout::NMajor };
        let mut base = Vec::with_capacity(ms.len());
        let mut initial = Vec::new();
        for &m in &ms {
            let s = d.choose(&bench.problem(m, base_layout))?;
            base.push(bench.time(&s, m, base_layout)?);
            let p = to_point(&MacroKernel::of(&s));
            if !initial.contains(&p) {
                initial.push(p);
            }
        }
        let space = space(d, class)?;
        initial.retain(|p| space.is_valid(p));
        let mut measured: HashMap<MacroKernel, Vec<f64>> = HashMap::new();
        let options = TrustRegionOptions { seed: args.seed, ..Default::default() };
        let outcome = minimize(space, initial, options, args.budget, |v| -> Result<f64> {
            let mk = from_point(v);
            let mut times = Vec::with_capacity(ms.len());
            for &m in &ms {
                let s = bench.schedule(&mk, m)?;
                times.push(bench.time(&s, m, bench.layout_for(&mk))?);
            }
            let cost = log_ratio(&times, &base, &class.rows);
            tracing::debug!("{mk}: {cost:+.4}");
            measured.insert(mk, times);
            Ok(cost)
        })
        .map_err(|e| match e {
            tune::bayes::MinimizeError::Search(e) => anyhow::anyhow!(UserError(format!("search: {e}"))),
            tune::bayes::MinimizeError::Cost(e) => e,
        })?;
        let Some((best_point, best_cost)) = outcome.best else {
            say!("{batch}x{n}x{k}: nothing measured");
            continue;
        };
        let best = from_point(&best_point);
        // The collection: the best macro-kernels (a weight's must share the best one's
        // layout, in which the weight is then packed), and the model's own choice.
        let mut ranked: Vec<(MacroKernel, f64)> = outcome
            .history
            .iter()
            .filter(|e| e.cost.is_finite())
            .map(|e| (from_point(&e.point), e.cost))
            .filter(|(mk, _)| !bench.weight() || bench.layout_for(mk) == bench.layout_for(&best))
            .collect();
        ranked.sort_by(|a, b| a.1.total_cmp(&b.1));
        ranked.dedup_by_key(|r| r.0);
        let kernels: Vec<MacroKernel> = ranked.iter().take(COLLECTION).map(|r| r.0).collect();
        let layout = if bench.weight() { bench.layout_for(&best) } else { BLayout::NMajor };
        // The model's choice under the tuned layout (for an activation, the baseline).
        let model_times = if bench.weight() {
            let mut v = Vec::with_capacity(ms.len());
            for &m in &ms {
                let s = d.choose(&bench.problem(m, layout))?;
                v.push(bench.time(&s, m, layout)?);
            }
            v
        } else {
            base.clone()
        };
        let mut table = Vec::with_capacity(ms.len());
        let mut chosen = Vec::with_capacity(ms.len());
        for (i, &m) in ms.iter().enumerate() {
            let (mut pick, mut t) = (None, model_times[i]);
            for (j, mk) in kernels.iter().enumerate() {
                let tj = measured.get(mk).map_or(f64::INFINITY, |v| v[i]);
                if tj < t {
                    (pick, t) = (Some(j), tj);
                }
            }
            table.push(TunedRow { m, pick });
            chosen.push(t);
        }
        let gain = log_ratio(&chosen, &base, &class.rows);
        say!(
            "{batch}x{n}x{k}: {} measurements in {:.1} s; best {best} ({:+.1}% time over the class); table {:+.1}%",
            outcome.history.len(),
            t0.elapsed().as_secs_f64(),
            (best_cost.exp() - 1.0) * 100.0,
            (gain.exp() - 1.0) * 100.0,
        );
        for (i, &m) in ms.iter().enumerate() {
            let p = bench.problem(m, base_layout);
            let pick = table[i].pick.map_or("model".to_string(), |j| kernels[j].to_string());
            say!(
                "    m {m:>5}: untuned {:>7.1} GFLOP/s, tuned {:>7.1} ({:.3}x) with {pick}",
                p.flops() / base[i] / 1e9,
                p.flops() / chosen[i] / 1e9,
                base[i] / chosen[i]
            );
        }
        let w: f64 = class.rows.iter().map(|r| r.1).sum();
        total = (total.0 + w * gain, total.1 + w);
        // A class is kept only where the table beats the untuned dispatcher.
        if gain < 0.0 {
            tuned.classes.push(TunedClass { batch, n, k, a: ALayout::RowMajor, b: layout, kernels, table });
        }
    }
    say!(
        "# {} of {} classes tuned in {:.1} s; measured time over all samples {:+.1}% (weighted geometric mean)",
        tuned.classes.len(),
        classes.len(),
        start.elapsed().as_secs_f64(),
        ((total.0 / total.1.max(1e-12)).exp() - 1.0) * 100.0
    );
    if let Some(out) = &args.out {
        std::fs::write(out, serde_json::to_string_pretty(&tuned)?)
            .map_err(|e| UserError(format!("--out {}: {e}", out.display())))?;
        say!("# written to {} (for bench-matmul --tuned)", out.display());
    }
    Ok(())
}

/// Read tuned schedules written by `tune --search bayes --out`.
pub fn load_tuned(path: &std::path::Path) -> Result<TunedSchedules> {
    let text =
        std::fs::read_to_string(path).map_err(|e| UserError(format!("--tuned {}: {e}", path.display())))?;
    Ok(serde_json::from_str(&text)
        .map_err(|e| UserError(format!("--tuned {}: not tuned schedules ({e})", path.display())))?)
}
