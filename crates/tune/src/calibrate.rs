//! A short calibration of what the analytical cost model needs: memory and cache
//! bandwidths, packing throughput and the pool's fork-join time, measured on this
//! machine (about a third of a second) and cached with the tuning record.

use std::time::Instant;

use kernels::pack::{pack_a, pack_b, Packers};
use kernels::MachineModel;
use kernels::{ElemType, MatRef, Target, ThreadPool};

/// Sum `data` with 16 independent lanes (vectorizable), so reads, not the adds'
/// latency, bound the loop.
fn stream_sum(data: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    for ch in data.chunks_exact(16) {
        for (a, x) in acc.iter_mut().zip(ch) {
            *a += *x;
        }
    }
    acc.iter().sum()
}

/// Seconds per call of `f`: after one warm-up call, the best over `rounds`
/// rounds of at least `min_s` seconds each (the measurement every sampled
/// choice of a schedule uses).
pub fn time_per_call<E>(rounds: usize, min_s: f64, mut f: impl FnMut() -> Result<(), E>) -> Result<f64, E> {
    f()?;
    let mut best = f64::INFINITY;
    for _ in 0..rounds {
        let (mut reps, t0) = (0usize, Instant::now());
        while reps == 0 || t0.elapsed().as_secs_f64() < min_s {
            f()?;
            reps += 1;
        }
        best = best.min(t0.elapsed().as_secs_f64() / reps as f64);
    }
    Ok(best)
}

/// Best seconds of `f` over `rounds`.
fn best_of(rounds: usize, mut f: impl FnMut()) -> f64 {
    (0..rounds)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// Bytes per second that each of the pool's threads reads from its own `per_thread`
/// bytes, `passes` times over (all threads at once), and the total.
fn read_bw(pool: &ThreadPool, per_thread: usize, passes: usize) -> (f64, f64) {
    let t = pool.threads();
    let floats = (per_thread / 4).max(16) / 16 * 16;
    let data = vec![1.0f32; floats * t];
    let sink = std::sync::atomic::AtomicU32::new(0);
    let run = || {
        pool.run(&|i| {
            let mine = &data[i * floats..(i + 1) * floats];
            let mut s = 0.0;
            for _ in 0..passes {
                s += stream_sum(std::hint::black_box(mine));
            }
            sink.fetch_add(s as u32 & 1, std::sync::atomic::Ordering::Relaxed);
        })
    };
    run();
    let secs = best_of(3, run);
    let bytes = (floats * 4 * passes) as f64;
    (bytes / secs, bytes * t as f64 / secs)
}

/// Bytes per second of `pack`, which packs `floats` elements: best of 5 rounds of 8.
fn pack_rate(mut pack: impl FnMut(), floats: usize) -> f64 {
    pack();
    (floats * 4 * 8) as f64
        / best_of(5, || {
            for _ in 0..8 {
                pack();
            }
        })
}

/// Measure the machine model for `target` with `pool`'s threads; packing into
/// `elem` panels is timed with the generated routines in `packers` where given
/// (their widths are the panels packed), with the portable loops otherwise.
pub fn measure(target: &Target, pool: &ThreadPool, packers: Packers, elem: ElemType) -> MachineModel {
    let threads = pool.threads();
    let (_, dram_bw) = read_bw(pool, (64 << 20) / threads.max(1), 1);
    let (l3_bw, _) = read_bw(pool, (target.l3 / 2 / threads.max(1)).max(target.l2 * 2), 4);
    let (l2_bw, _) = read_bw(pool, target.l2 / 2, 16);
    // Packing, from an L2-resident source into micro-panels: A row-major, B row-major
    // and B stored transposed (the source read as its transpose).
    let (m, k) = (96, 256);
    let mr = packers.a.map_or(8, |p| p.width);
    let nr = packers.bt.map_or(32, |p| p.width);
    let src: Vec<f32> = (0..m * k).map(|i| i as f32).collect();
    let mut out = kernels::Lines::default();
    // `src` holds `m·k` values: every view below is in bounds.
    let view = |rows, cols, rs, cs| MatRef::new(&src, rows, cols, rs, cs).expect("in bounds by construction");
    let av = view(m, k, k, 1);
    let pack_a_bw = pack_rate(
        || pack_a(&av, 0, m, 0, k, mr, elem, &mut out, &Packers { a: packers.a, ..Packers::default() }),
        m * k,
    );
    let bv = view(m, k, k, 1);
    let pack_b_bw = pack_rate(|| pack_b(&bv, 0, m, 0, k, nr, elem, &mut out, None), m * k);
    let bt = view(k, m, 1, k);
    let pack_bt_bw = pack_rate(|| pack_b(&bt, 0, k, 0, m, nr, elem, &mut out, packers.bt), m * k);
    std::hint::black_box(&out);
    // The fork-join as a contraction pays it: a small job (a sum over an L1-resident
    // buffer, about a microsecond) on every thread, against the same job on one: the
    // difference holds the wake-up of the workers and the wait for the last one,
    // which an empty job understates.
    let calls = 2000;
    let job: Vec<Vec<f32>> = (0..threads).map(|i| vec![i as f32; 4096]).collect();
    let work = |i: usize| {
        std::hint::black_box(stream_sum(std::hint::black_box(&job[i])));
    };
    pool.run(&|_| {});
    let parallel = best_of(3, || {
        for _ in 0..calls {
            pool.run(&|i| work(i));
        }
    }) / calls as f64;
    let alone = best_of(3, || {
        for _ in 0..calls {
            work(0);
        }
    }) / calls as f64;
    let fork_join = if threads > 1 { (parallel - alone).max(0.0) } else { 0.0 };
    MachineModel {
        threads,
        l1d: target.l1d,
        l2: target.l2,
        l3: target.l3,
        dram_bw,
        l3_bw,
        l2_bw,
        pack_a_bw,
        pack_b_bw,
        pack_bt_bw,
        fork_join,
        peak_gflops: 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_is_plausible() {
        let t = Target::detect();
        let pool = ThreadPool::new(2);
        let m = measure(&t, &pool, Packers::default(), ElemType::F32);
        // Orders of magnitude only: any machine reads its L2 faster than 1 GB/s and
        // packs faster than 100 MB/s; a fork-join takes less than 10 ms.
        assert!(m.l2_bw > 1e9 && m.dram_bw > 1e8, "{m:?}");
        assert!(m.pack_a_bw > 1e8 && m.pack_b_bw > 1e8 && m.pack_bt_bw > 1e8, "{m:?}");
        // The fork-join is a difference of two timings (clamped at 0): on a loaded
        // machine the single-thread one can come out slower.
        assert!(m.fork_join >= 0.0 && m.fork_join < 1e-2, "{m:?}");
        assert_eq!(m.threads, 2);
    }
}
