//! Helpers shared by the benchmark binaries (`src/bin/`).

use std::time::{Duration, Instant};

/// The best time per call of `f` over `rounds` rounds, each repeating `f` until at
/// least `min_round` has passed (time per call = round time / repetitions). The
/// caller makes the warm-up call first: this is the protocol of
/// `anyshape bench-matmul` and `bench/matmul_peers.py` (one warm-up, best of five
/// rounds of at least 40 ms).
pub fn best_time(min_round: Duration, rounds: usize, mut f: impl FnMut()) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..rounds {
        let (mut reps, t0) = (0u64, Instant::now());
        while reps == 0 || t0.elapsed() < min_round {
            f();
            reps += 1;
        }
        best = best.min(t0.elapsed().as_secs_f64() / reps as f64);
    }
    best
}

/// A small deterministic generator (SplitMix64), so runs are reproducible without
/// another dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in 0..n (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Median of `v` (sorted in place); NaN when empty.
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}
