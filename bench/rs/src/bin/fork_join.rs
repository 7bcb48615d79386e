//! Fork-join overhead: anyshape's persistent pool (`kernels::ThreadPool`) against rayon.
//!
//!     fork_join [--threads 2] [--calls 20000] [--cold-calls 200] [--json]
//!
//! One fork-join runs a job once per thread index 0..threads and returns when all are
//! done. Systems:
//! - `anyshape-pool`: `pool.run(&job)`, the caller is index 0;
//! - `rayon-install`: `pool.install(|| (0..threads).into_par_iter().for_each(job))`
//!   from outside the pool (the caller blocks while the pool's threads run it);
//! - `rayon-scope`: `pool.scope(|s| ...)` with `threads` spawns;
//! - `rayon-in-pool`: the same `par_iter` issued by a thread already inside the pool
//!   (the whole measurement loop runs under one `install`), rayon's best case.
//!
//! Cases:
//! - `empty`: an empty job, `--calls` fork-joins back to back (after 1,000 warm-up);
//! - `sum4096`: each thread sums 4,096 f32 of its own slice, `--calls` back to back;
//!   `serial` is the caller summing all the slices alone, for scale;
//! - `cold`: an empty job after a 1 ms sleep before every call (workers have gone to
//!   sleep: the wake-up cost), `--cold-calls` calls.
//!
//! Every call is timed on its own; the table gives mean, median and 90th percentile in
//! µs, and `spread`: the share of fork-joins (from a separate, untimed pass of up to
//! 1,000 calls) whose job indices ran on more than one OS thread. rayon may run every
//! index on one thread when no other worker steals in time, so a rayon figure with a
//! low spread times a round trip, not a fork-join across threads. With `--json`, one
//! JSON object per case and system goes to stdout and the table to stderr.

use std::hint::black_box;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyshape_bench::median;
use clap::Parser;
use rayon::prelude::*;
use serde::Serialize;

#[derive(Parser)]
#[command(about = "Fork-join overhead of anyshape's thread pool against rayon")]
struct Args {
    /// Threads in each pool (the caller counts as one in anyshape's)
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Fork-joins per system for the back-to-back cases
    #[arg(long, default_value_t = 20_000)]
    calls: usize,
    /// Fork-joins per system for the cold (1 ms sleep) case
    #[arg(long, default_value_t = 200)]
    cold_calls: usize,
    /// JSON lines on stdout (the table goes to stderr)
    #[arg(long)]
    json: bool,
}

const SLICE: usize = 4096;
const WARMUP: usize = 1000;

#[derive(Serialize)]
struct Stats {
    case: &'static str,
    system: &'static str,
    threads: usize,
    calls: usize,
    mean_us: f64,
    median_us: f64,
    p90_us: f64,
    /// Share of fork-joins whose job indices ran on more than one OS thread (from a
    /// separate, untimed pass); 1 for a true fork-join, 0 for `serial`.
    spread: f64,
}

/// Time `calls` calls of `f` one by one (after `warmup` untimed ones), sleeping
/// `sleep` before each if given; the per-call times in µs.
fn sample(calls: usize, warmup: usize, sleep: Option<Duration>, mut f: impl FnMut()) -> Vec<f64> {
    for _ in 0..warmup {
        f();
    }
    let mut t = Vec::with_capacity(calls);
    for _ in 0..calls {
        if let Some(d) = sleep {
            std::thread::sleep(d);
        }
        let t0 = Instant::now();
        f();
        t.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    t
}

fn stats(case: &'static str, system: &'static str, threads: usize, mut t: Vec<f64>, spread: f64) -> Stats {
    let calls = t.len();
    let mean_us = t.iter().sum::<f64>() / calls.max(1) as f64;
    let median_us = median(&mut t);
    // `median` sorted `t`.
    let p90_us =
        t.get(((calls as f64 * 0.9) as usize).min(calls.saturating_sub(1))).copied().unwrap_or(f64::NAN);
    Stats { case, system, threads, calls, mean_us, median_us, p90_us, spread }
}

static NEXT_THREAD: AtomicUsize = AtomicUsize::new(1);
thread_local! {
    /// A small id per OS thread, to see which thread ran which job index.
    static THREAD: usize = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
}

#[derive(Clone, Copy, PartialEq)]
enum System {
    Ours,
    RayonInstall,
    RayonScope,
    /// `par_iter` from a thread inside the rayon pool (the caller wraps the loop in `install`).
    RayonInPool,
}

const SYSTEMS: [(System, &str); 4] = [
    (System::Ours, "anyshape-pool"),
    (System::RayonInstall, "rayon-install"),
    (System::RayonScope, "rayon-scope"),
    (System::RayonInPool, "rayon-in-pool"),
];

struct Pools {
    threads: usize,
    ours: kernels::ThreadPool,
    rayon: rayon::ThreadPool,
}

impl Pools {
    /// One fork-join of `job` on `system`.
    fn fork_join(&self, system: System, job: &(dyn Fn(usize) + Sync)) {
        let t = self.threads;
        match system {
            System::Ours => self.ours.run(job),
            System::RayonInstall => self.rayon.install(|| (0..t).into_par_iter().for_each(job)),
            System::RayonScope => self.rayon.scope(|s| {
                for i in 0..t {
                    s.spawn(move |_| job(i));
                }
            }),
            System::RayonInPool => (0..t).into_par_iter().for_each(job),
        }
    }

    /// Every system on one case: `job(i)` for i in 0..threads per fork-join.
    fn measure(
        &self,
        case: &'static str,
        calls: usize,
        warmup: usize,
        sleep: Option<Duration>,
        job: &(dyn Fn(usize) + Sync),
    ) -> Vec<Stats> {
        let t = self.threads;
        let ran: Vec<AtomicUsize> = (0..t).map(|_| AtomicUsize::new(0)).collect();
        let record = |i: usize| {
            job(i);
            ran[i].store(THREAD.with(|id| *id), Ordering::Relaxed);
        };
        SYSTEMS
            .iter()
            .map(|&(system, name)| {
                let body = || {
                    let times = sample(calls, warmup, sleep, || self.fork_join(system, job));
                    // Untimed: on how many threads did the indices run?
                    let checks = calls.min(1000);
                    let mut spread = 0;
                    for _ in 0..checks {
                        if let Some(d) = sleep {
                            std::thread::sleep(d);
                        }
                        self.fork_join(system, &record);
                        let first = ran[0].load(Ordering::Relaxed);
                        spread += ran.iter().any(|r| r.load(Ordering::Relaxed) != first) as usize;
                    }
                    (times, spread as f64 / checks.max(1) as f64)
                };
                let (times, spread) =
                    if system == System::RayonInPool { self.rayon.install(body) } else { body() };
                stats(case, name, t, times, spread)
            })
            .collect()
    }
}

fn main() {
    let args = Args::parse();
    let threads = args.threads.max(1);
    let pools = Pools {
        threads,
        ours: kernels::ThreadPool::new(threads),
        rayon: rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("building the rayon pool"),
    };

    let mut rows = Vec::new();
    // (a) empty job, back to back.
    rows.extend(pools.measure("empty", args.calls, WARMUP, None, &|i| {
        black_box(i);
    }));
    // (b) each thread sums its own 4096 f32.
    let data: Vec<f32> = (0..threads * SLICE).map(|i| (i % 251) as f32 * 0.5).collect();
    let sums: Vec<AtomicU32> = (0..threads).map(|_| AtomicU32::new(0)).collect();
    let sum_job = |i: usize| {
        let s: f32 = black_box(&data[i * SLICE..(i + 1) * SLICE]).iter().sum();
        sums[i].store(s.to_bits(), Ordering::Relaxed);
    };
    rows.push(stats(
        "sum4096",
        "serial",
        threads,
        sample(args.calls, WARMUP, None, || (0..threads).for_each(sum_job)),
        0.0,
    ));
    rows.extend(pools.measure("sum4096", args.calls, WARMUP, None, &sum_job));
    let expected: f32 = data[..SLICE].iter().sum();
    assert_eq!(
        f32::from_bits(sums[0].load(Ordering::Relaxed)),
        expected,
        "the sum job computed the wrong sum"
    );
    // (c) cold wake-up: 1 ms sleep before every call.
    rows.extend(pools.measure("cold", args.cold_calls, 10, Some(Duration::from_millis(1)), &|i| {
        black_box(i);
    }));

    let mut table = format!(
        "# fork-join, {threads} threads (µs per fork-join; every call timed on its own; spread: share of calls run on >1 thread)\n{:<8} {:<14} {:>6} {:>9} {:>9} {:>9} {:>7}\n",
        "case", "system", "calls", "mean", "median", "p90", "spread"
    );
    for r in &rows {
        table += &format!(
            "{:<8} {:<14} {:>6} {:>9.2} {:>9.2} {:>9.2} {:>6.0}%\n",
            r.case,
            r.system,
            r.calls,
            r.mean_us,
            r.median_us,
            r.p90_us,
            r.spread * 100.0
        );
    }
    if args.json {
        eprint!("{table}");
        for r in &rows {
            println!("{}", serde_json::to_string(r).expect("serialising a row"));
        }
    } else {
        print!("{table}");
    }
}
