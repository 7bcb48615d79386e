//! The Rust `gemm` crate as a peer in the single-matmul benchmark.
//!
//!     gemm_peer --shape BATCH,M,N,K [--shape ...] [--threads N]
//!
//! C = A·B, f32, A row-major [M, K], B row-major [K, N], C row-major [M, N]. A batch
//! of BATCH > 1 is BATCH independent matmuls run one after another, each with its own
//! A and B (both operands are activations, as in attention). Timing follows
//! `anyshape bench-matmul` and `bench/matmul_peers.py`: one warm-up call, then the
//! best of five rounds, each round repeating until at least 40 ms have passed; the
//! time per call is the round's time divided by its repetitions.
//!
//! Prints one JSON object per shape per line. Before timing, checks sampled entries of
//! C against an f64 reference and exits with an error if one is off by 1e-3 or more.

use std::process::ExitCode;
use std::time::Duration;

use anyshape_bench::{best_time, Rng};
use clap::Parser;
use gemm::Parallelism;
use serde::Serialize;

#[derive(Parser)]
#[command(about = "Time the Rust `gemm` crate (f32) on matmul shapes")]
struct Args {
    /// BATCH,M,N,K (repeatable)
    #[arg(long = "shape", required = true, value_parser = parse_shape)]
    shapes: Vec<[usize; 4]>,
    /// Threads (1: `Parallelism::None`; more: `Parallelism::Rayon(N)` in a rayon pool of N threads)
    #[arg(long, default_value_t = std::thread::available_parallelism().map_or(1, |n| n.get()))]
    threads: usize,
}

fn parse_shape(s: &str) -> Result<[usize; 4], String> {
    let v: Vec<usize> = s
        .split(',')
        .map(|x| x.trim().parse::<usize>().map_err(|e| format!("{x:?}: {e}")))
        .collect::<Result<_, _>>()?;
    match v.as_slice() {
        &[b, m, n, k] if b > 0 && m > 0 && n > 0 && k > 0 => Ok([b, m, n, k]),
        _ => Err(format!("expected BATCH,M,N,K (all positive), got {s:?}")),
    }
}

#[derive(Serialize)]
struct Row {
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    gflops: f64,
    seconds: f64,
    threads: usize,
}

/// C[b] = A[b]·B[b] for every batch entry, one after another.
#[allow(clippy::too_many_arguments)]
fn run(a: &[f32], b: &[f32], c: &mut [f32], batch: usize, m: usize, n: usize, k: usize, par: Parallelism) {
    for i in 0..batch {
        let (ai, bi, ci) = (&a[i * m * k..][..m * k], &b[i * k * n..][..k * n], &mut c[i * m * n..][..m * n]);
        // SAFETY: the slices hold exactly m×k, k×n and m×n elements, and the strides
        // (column stride 1, row stride = row length) address them row-major in bounds.
        // `read_dst = false`: C is overwritten (dst = 0·dst + 1·A·B).
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                ci.as_mut_ptr(),
                1,
                n as isize,
                false,
                ai.as_ptr(),
                1,
                k as isize,
                bi.as_ptr(),
                1,
                n as isize,
                0.0f32,
                1.0f32,
                false,
                false,
                false,
                par,
            );
        }
    }
}

/// Compare 32 sampled entries of C (corners included) with an f64 dot product.
fn check(a: &[f32], b: &[f32], c: &[f32], batch: usize, m: usize, n: usize, k: usize) -> Result<(), String> {
    let mut rng = Rng::new(0x5eed);
    let mut samples: Vec<(usize, usize, usize)> =
        vec![(0, 0, 0), (batch - 1, m - 1, n - 1), (0, m - 1, 0), (batch - 1, 0, n - 1)];
    for _ in 0..28 {
        samples.push((rng.below(batch), rng.below(m), rng.below(n)));
    }
    for (bi, i, j) in samples {
        let reference: f64 =
            (0..k).map(|p| a[bi * m * k + i * k + p] as f64 * b[bi * k * n + p * n + j] as f64).sum();
        let got = c[bi * m * n + i * n + j] as f64;
        // Entries are sums of non-negative products: no cancellation to inflate the error.
        let rel = (got - reference).abs() / reference.abs().max(f64::MIN_POSITIVE);
        if rel.is_nan() || rel >= 1e-3 {
            return Err(format!(
                "wrong result at batch {bi}, row {i}, column {j}: got {got}, expected {reference} (relative error {rel:.2e})"
            ));
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let threads = args.threads.max(1);
    // gemm's `Parallelism::Rayon(n)` splits work into n tasks on the *current* rayon
    // pool; run it inside a pool of exactly `threads` so no more cores are used.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("gemm-peer-{i}"))
        .build()
        .expect("building the rayon pool");
    let par = if threads == 1 { Parallelism::None } else { Parallelism::Rayon(threads) };
    for [batch, m, n, k] in args.shapes {
        // Values in [0, 1): non-negative, so the check's relative error is well defined.
        let mut rng = Rng::new(42);
        let a: Vec<f32> = (0..batch * m * k).map(|_| rng.unit_f32()).collect();
        let b: Vec<f32> = (0..batch * k * n).map(|_| rng.unit_f32()).collect();
        let mut c = vec![f32::NAN; batch * m * n];
        let seconds = pool.install(|| -> Result<f64, String> {
            // The warm-up call doubles as the call whose result is checked.
            run(&a, &b, &mut c, batch, m, n, k, par);
            check(&a, &b, &c, batch, m, n, k)?;
            Ok(best_time(Duration::from_millis(40), 5, || run(&a, &b, &mut c, batch, m, n, k, par)))
        });
        let seconds = match seconds {
            Ok(s) => s,
            Err(e) => {
                eprintln!("gemm_peer: shape {batch},{m},{n},{k}: {e}");
                return ExitCode::FAILURE;
            }
        };
        let flops = 2.0 * (batch * m * n * k) as f64;
        let row = Row { batch, m, n, k, gflops: flops / seconds / 1e9, seconds, threads };
        println!("{}", serde_json::to_string(&row).expect("serialising a row"));
    }
    ExitCode::SUCCESS
}
