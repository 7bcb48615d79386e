//! TSCompiler's wave/occupancy model (§6): the run-time choice among pre-compiled
//! kernels. A launch's thread blocks run in waves over the SMs, as many blocks an SM
//! at once as its registers, shared memory and thread slots allow; a kernel's time
//! is its waves times one block's time, which is linear in the block's K steps at
//! that occupancy past a few steps, and interpolated from a short product's time
//! below (measured once per kernel on the device: the lowest level is measured,
//! the levels above are modeled, Vortex §5). A memory floor (operands and
//! result moved once at the device's bandwidth) and the launch cost bound it below.

use crate::kernel::{GemmKernel, Problem};
use serde::{Deserialize, Serialize};

/// What the model knows of the device (queried by the runner, or Hopper's figures).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceLimits {
    pub sms: usize,
    pub regs_per_sm: usize,
    pub smem_per_sm: usize,
    pub threads_per_sm: usize,
    pub blocks_per_sm: usize,
    /// Device memory bandwidth, bytes/s.
    pub bandwidth: f64,
    /// A launch's fixed cost, seconds (in a CUDA graph: about a microsecond).
    pub launch: f64,
    /// The L2 cache's bytes (50 MB on the H100 and H200 SXM; records from before
    /// it was kept read as that).
    #[serde(default = "hopper_l2")]
    pub l2_bytes: usize,
}

fn hopper_l2() -> usize {
    50 * 1024 * 1024
}

impl DeviceLimits {
    /// H100/H200 SXM (compute capability 9.0): 132 SMs, 64K registers, 228 KB of
    /// shared memory (1 KB of it reserved a block), 2048 threads and 32 blocks an SM.
    pub fn hopper(bandwidth: f64) -> DeviceLimits {
        DeviceLimits {
            sms: 132,
            regs_per_sm: 65536,
            smem_per_sm: 228 * 1024,
            threads_per_sm: 2048,
            blocks_per_sm: 32,
            bandwidth,
            launch: 1e-6,
            l2_bytes: hopper_l2(),
        }
    }

    /// How much slower than the launch's first wave each later one runs when a
    /// wave's operands ([`GemmKernel::raster_bytes`]) take `bytes`: nothing up to a
    /// quarter of L2, then [`L2_DRIFT`] more per doubling, up to twice L2.
    pub fn drift(&self, bytes: f64) -> f64 {
        let quarters = (4.0 * bytes / self.l2_bytes.max(1) as f64).clamp(1.0, 8.0);
        L2_DRIFT * quarters.log2()
    }
}

/// A launch's later waves, against its first, for each doubling of a wave's
/// operands past a quarter of L2 ([`DeviceLimits::drift`]). The first wave's
/// blocks start together and read each K step's panels while their neighbours
/// do; the later ones start as earlier blocks finish, apart in K, and once a
/// wave's panels no longer fit in L2 beside each other they are read again from
/// memory. In the H100 and H200 records, single launches of several waves ran
/// slower than the wave model's price by a share that grew with a wave's
/// operands (BENCHMARKS.md, session 68), while launches of one wave did not.
pub const L2_DRIFT: f64 = 0.1;

/// Blocks of `k` resident on one SM at once, given its real register count: registers
/// are allocated per warp in units of 256, shared memory with 1 KB reserved a block.
pub fn occupancy(k: &GemmKernel, regs_per_thread: usize, d: &DeviceLimits) -> usize {
    let warp_regs = (regs_per_thread.max(1) * 32).div_ceil(256) * 256;
    let by_regs = d.regs_per_sm / (warp_regs * k.warps());
    let by_smem = d.smem_per_sm / (k.smem_bytes() + 1024);
    let by_threads = d.threads_per_sm / k.threads();
    by_regs.min(by_smem).min(by_threads).min(d.blocks_per_sm)
}

/// One kernel's measured costs: a wave of blocks at full occupancy (every SM holding
/// `occupancy` of them) takes `fixed + per_kstep · steps`; one block alone on an SM
/// takes `fixed_alone + per_kstep_alone · steps` (its latency: a partial wave with
/// few blocks an SM runs at this, not at a share of the full wave's time).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelRate {
    pub name: String,
    pub regs: usize,
    pub occupancy: usize,
    pub fixed: f64,
    pub per_kstep: f64,
    pub fixed_alone: f64,
    pub per_kstep_alone: f64,
    /// The line above is fitted from two long products (`fit_from` steps and four
    /// times as many); at a step or two it misprices a product (on an H100 the
    /// mma.sync 16×128 tile's full wave took 4.3 µs at two steps, the line said 2.6). `short` and `short_alone` are a full wave's and a
    /// lone block's time measured at `short_steps` (K = 64), and below `fit_from`
    /// steps the model interpolates between them and the line. 0: not measured.
    #[serde(default)]
    pub fit_from: f64,
    #[serde(default)]
    pub short_steps: f64,
    #[serde(default)]
    pub short: f64,
    #[serde(default)]
    pub short_alone: f64,
    /// One block on each of [`FEW_BLOCKS`] SMs, the rest idle: the line and the short
    /// product as above (0: not measured). With few SMs busy a block runs faster than
    /// with one on every SM (the L2 and memory bandwidth are shared by fewer): in the
    /// H100 and H200 records, occupancy-1 kernels on partial waves under a tenth of
    /// the SMs took 0.80 and 0.82 of the one-block-an-SM prediction (geometric means
    /// over 303 and 193 timings), rising to 1.0 with every SM busy.
    #[serde(default)]
    pub fixed_few: f64,
    #[serde(default)]
    pub per_kstep_few: f64,
    #[serde(default)]
    pub short_few: f64,
    /// The line's second point (`fit_to` steps, K = 2048) is as far as it was
    /// measured; products run to K = 8192. `long`, `long_alone` and `long_few` are
    /// a full wave's, a lone block's and a few-SM block's time at `long_steps` (K =
    /// 8192), and past `fit_to` the model runs from the line's second point to them
    /// instead of extending the line (in session 14's H100 record the TMA 128×256
    /// kernels took 1.13x and the persistent ones 1.29-1.58x the line's price at K =
    /// 4096). 0: not measured.
    #[serde(default)]
    pub fit_to: f64,
    #[serde(default)]
    pub long_steps: f64,
    #[serde(default)]
    pub long: f64,
    #[serde(default)]
    pub long_alone: f64,
    #[serde(default)]
    pub long_few: f64,
}

impl KernelRate {
    /// A full wave's time at `steps` K steps.
    pub fn wave(&self, steps: f64) -> f64 {
        self.between([self.short, self.fixed, self.per_kstep, self.long], steps)
    }

    /// One block's time alone on an SM at `steps` K steps, with a block on every SM.
    pub fn alone(&self, steps: f64) -> f64 {
        self.between([self.short_alone, self.fixed_alone, self.per_kstep_alone, self.long_alone], steps)
    }

    /// One block's time alone on an SM at `steps` K steps with [`FEW_BLOCKS`] SMs busy;
    /// `None` where the calibration did not measure it.
    pub fn few(&self, steps: f64) -> Option<f64> {
        (self.fixed_few > 0.0 || self.per_kstep_few > 0.0)
            .then(|| self.between([self.short_few, self.fixed_few, self.per_kstep_few, self.long_few], steps))
    }

    /// One level's time at `steps` from its measurements `[short, fixed, per step,
    /// long]`: below `fit_from` between the short product and the line, on the line
    /// up to `fit_to`, then towards the long product (each where measured).
    fn between(&self, [short, fixed, per, long]: [f64; 4], steps: f64) -> f64 {
        let line = fixed + per * steps;
        if long > 0.0 && self.fit_to > 0.0 && self.long_steps > self.fit_to && steps > self.fit_to {
            let end = fixed + per * self.fit_to;
            return end + (steps - self.fit_to) * (long - end) / (self.long_steps - self.fit_to);
        }
        if short <= 0.0 || steps >= self.fit_from || self.fit_from <= self.short_steps {
            return line;
        }
        let end = fixed + per * self.fit_from;
        let f = (steps - self.short_steps) / (self.fit_from - self.short_steps);
        (short + f * (end - short)).max(0.0)
    }
}

/// A grid of the calibration: tile rows and tile columns of one product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid {
    pub rows: usize,
    pub cols: usize,
}

impl Grid {
    /// Waves of blocks the grid runs at `occupancy` blocks an SM on `sms` SMs.
    pub fn waves(&self, occupancy: usize, sms: usize) -> f64 {
        (self.rows * self.cols).div_ceil(sms * occupancy.max(1)) as f64
    }
}

/// SMs busy in the calibration's grid of few blocks (a twelfth of an H100's).
pub const FEW_BLOCKS: usize = 11;

/// The calibration's three grids for `k` at `occupancy` on `sms` SMs (`anyshape-gpu
/// bench` times each kernel on them): four full waves (columns spanning 2048, rows
/// enough for the waves), one block an SM (11 columns), and [`FEW_BLOCKS`] blocks
/// (one row).
pub fn calibration_grids(k: &GemmKernel, occupancy: usize, sms: usize) -> [Grid; 3] {
    let cols = (2048 / k.bn).max(1);
    [
        Grid { rows: (4 * sms * occupancy.max(1)).div_ceil(cols), cols },
        Grid { rows: sms.div_ceil(11), cols: 11 },
        Grid { rows: 1, cols: FEW_BLOCKS },
    ]
}

/// A choice for one product: a kernel of the model and, for a split-K kernel, the
/// splits it runs with (1 otherwise).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Choice {
    pub kernel: usize,
    pub splits: usize,
}

impl Choice {
    /// The choice as text: its kernel's name (of `kernels`, which it indexes), with
    /// `xS` for S splits.
    pub fn name(&self, kernels: &[GemmKernel]) -> String {
        kernels[self.kernel].name_split(self.splits)
    }
}

/// The splits a split-K kernel is tried with.
pub const SPLITS: [usize; 7] = [2, 3, 4, 6, 8, 12, 16];

/// The split-K reduction's measured cost (`ReduceKernel`): a thread loads its
/// shares [`REDUCE_CHUNK`] at a time, so that past the bytes it moves a reduction
/// costs `fixed` (its launch in a graph, one thread's latency) and `per_chunk` for
/// each further memory latency a chunk of shares waits.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReduceRate {
    pub fixed: f64,
    pub per_chunk: f64,
}

/// Shares a reduction thread loads at once (`codegen::nvptx::reduce_ir` reads them so).
pub const REDUCE_CHUNK: usize = 8;

/// The model over a compiled family: its kernels and their measured rates, and the
/// split-K reduction's (`None`: a record from before it was measured, where the
/// reduction is priced as a launch and its bytes).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WaveModel {
    pub device: DeviceLimits,
    pub kernels: Vec<GemmKernel>,
    pub rates: Vec<KernelRate>,
    #[serde(default)]
    pub reduce: Option<ReduceRate>,
}

impl WaveModel {
    /// Predicted seconds of `c` on `p`: the full waves, each at the full wave's time,
    /// then the last partial wave, whose `r` blocks an SM take between one block's
    /// latency (`r = 1`) and a full wave (`r = occupancy`), linearly in `r`: a
    /// partial wave of few blocks an SM runs at their latency, not at their share of
    /// the SM's throughput. With fewer blocks than SMs, a lone block's latency lies
    /// between the few-SM one ([`KernelRate::few`], where measured) and the all-SM
    /// one, linearly in the SMs busy. The waves after a launch's first pay for
    /// their drift apart in K where a wave's operands crowd L2
    /// ([`DeviceLimits::drift`]), against the drift the calibration's own later
    /// waves had. The SMs a partial wave leaves idle are the waste that
    /// makes a smaller tile win at some M (TSCompiler §6, FTuner). A split-K choice
    /// runs `splits` times the blocks on a share of K's steps, then the reduction,
    /// which reads the f32 partial sums once, and costs its launch and a latency a
    /// chunk of shares ([`ReduceRate`]); a folding one (`GemmKernel::fold`) no
    /// launch, but a latency for its count and for each chunk of shares its
    /// last blocks read. The calibration timed whole launches, so
    /// its rates hold a launch's share of their grid's waves ([`calibration_grids`]):
    /// that is taken out, and the product's own launch added once (one partial wave
    /// was priced two launches before; on session 14's H100 record the regret went
    /// from 2.6% to 1.6% mean, 41.6% to 23.6% at worst, `anyshape-gpu replay`).
    pub fn predict(&self, c: Choice, p: &Problem) -> f64 {
        let k = &self.kernels[c.kernel];
        let r = &self.rates[c.kernel];
        let occ = r.occupancy.max(1);
        let slots = self.device.sms * occ;
        let (steps, splits) = if k.split_k { k.split_plan(p.k, c.splits) } else { (p.k.div_ceil(k.bk()), 1) };
        let blocks = k.blocks(p) * splits;
        // A calibration times whole launches: take out the launch's share of each
        // grid's waves, which the product pays once below.
        let grids = calibration_grids(k, occ, self.device.sms);
        let [full, lone, few] = grids.map(|g| g.waves(occ, self.device.sms));
        let wave = (r.wave(steps as f64) - self.device.launch / full).max(0.0);
        // Waves after the launch's first drift apart in K: at the product's
        // operands a wave, against the calibration's full grid (whose waves after
        // its first drifted at its own operands).
        let depth = steps * k.bk();
        let cal = Problem { m: grids[0].rows * k.bm, n: grids[0].cols * k.bn, k: depth, batch: 1, ..*p };
        let drift_cal = self.device.drift(k.raster_bytes(&cal, slots));
        let drift = self.device.drift(k.raster_bytes(&Problem { k: depth, ..*p }, slots));
        let first = wave / (1.0 + (full - 1.0) / full * drift_cal);
        let later = first * (1.0 + drift);
        let whole = blocks / slots;
        let mut t = if whole == 0 { 0.0 } else { first + (whole - 1) as f64 * later };
        let rest = blocks % slots;
        if rest > 0 {
            let per_sm = rest.div_ceil(self.device.sms);
            let mut alone = (r.alone(steps as f64) - self.device.launch / lone).max(0.0);
            // Fewer blocks than SMs: between the few-SM latency and the all-SM one.
            if let Some(f) = r.few(steps as f64).filter(|_| rest < self.device.sms) {
                let f = (f - self.device.launch / few).max(0.0);
                let span = self.device.sms.saturating_sub(FEW_BLOCKS).max(1) as f64;
                let x = (rest.saturating_sub(FEW_BLOCKS) as f64 / span).min(1.0);
                alone = f + x * (alone - f);
            }
            let last = if occ == 1 {
                alone
            } else {
                alone + (per_sm - 1) as f64 / (occ - 1) as f64 * (wave - alone)
            };
            t += if whole == 0 { last } else { last * (1.0 + drift) };
        }
        let mut t = t.max(p.min_bytes(k.elem) / self.device.bandwidth) + self.device.launch;
        if k.split_k {
            let partials = (splits * p.m * p.n * 4 + p.m * p.n * 2) as f64;
            t += partials / self.device.bandwidth
                + match (k.fold, self.reduce) {
                    // A folding kernel's last block of a tile waits for its
                    // count and then for each chunk of shares it loads: a
                    // memory latency each (the reduction's measured latency
                    // a chunk), no launch; a record from before the
                    // reduction was measured prices its bytes alone.
                    (true, Some(r)) => r.per_chunk * (1 + splits.div_ceil(k.fold_chunk())) as f64,
                    (true, None) => 0.0,
                    (false, Some(r)) => r.fixed + r.per_chunk * (splits.div_ceil(REDUCE_CHUNK) - 1) as f64,
                    (false, None) => self.device.launch,
                };
        }
        t
    }

    /// Stream-K kernel `k` on `p` in `blocks` blocks, priced from the rates of
    /// its own tile unsplit (kernel `tile` of the model): the busiest block's
    /// steps (`⌈I/G⌉` of all the tiles' `I`) as a wave's at the tile's
    /// occupancy (more steps than a tile's as that many waves of whole tiles,
    /// the later ones drifting), a wave for each `slots` blocks; the line's fixed cost again
    /// for each further unit of that block (a tile boundary inside its
    /// steps); and the fold as a folding split-K kernel's: every unit of a
    /// shared tile written and read back as an f32 tile at the device's
    /// bandwidth, a memory latency a chunk of a tile's shares. `None` where the
    /// launch cannot run (more blocks than steps). Not among [`Self::choices`]:
    /// `bench` prints it beside the measured time until a device run has
    /// checked it.
    pub fn predict_stream_k(&self, tile: usize, k: &GemmKernel, p: &Problem, blocks: usize) -> Option<f64> {
        let r = self.rates.get(tile)?;
        let slots_cap = k.stream_slots(p, blocks);
        if slots_cap == 0 {
            return None;
        }
        let occ = r.occupancy.max(1);
        let slots = self.device.sms * occ;
        let steps = p.k.div_ceil(k.bk()).max(1);
        let (tiles, iters) = (k.blocks(p), k.stream_steps(p));
        // The busiest block's steps and units; the units that share a tile.
        let range = |b: usize| (b * iters / blocks, (b + 1) * iters / blocks);
        let (mut q, mut units) = (0, 0);
        for b in 0..blocks {
            let (s, e) = range(b);
            q = q.max(e - s);
            units = units.max((e - 1) / steps - s / steps + 1);
        }
        let block_of = |x: usize| ((x + 1) * blocks - 1) / iters;
        let shared: usize = (0..tiles)
            .map(|t| block_of(t * steps + steps - 1) - block_of(t * steps) + 1)
            .filter(|&n| n > 1)
            .sum();
        // A wave's price as `predict` takes it: the calibration's launch share
        // and its own later waves' drift taken out.
        let own = &self.kernels[tile];
        let grids = calibration_grids(own, occ, self.device.sms);
        let full = grids[0].waves(occ, self.device.sms);
        // A block of more steps than a tile's runs as that many waves of whole
        // tiles would: the first at its price, the rest drifting apart in K
        // as a launch's later waves do (`DeviceLimits::drift`).
        let run = q.min(steps);
        let cal =
            Problem { m: grids[0].rows * own.bm, n: grids[0].cols * own.bn, k: run * k.bk(), batch: 1, ..*p };
        let calm = 1.0 + (full - 1.0) / full * self.device.drift(own.raster_bytes(&cal, slots));
        let launch_share = self.device.launch / full;
        let wave = (r.wave(run as f64) - launch_share).max(0.0) / calm;
        let fixed = (r.fixed - launch_share).max(0.0) / calm;
        let drift = self.device.drift(own.raster_bytes(&Problem { k: steps * k.bk(), ..*p }, slots));
        let waves = q as f64 / run as f64;
        let busiest = wave * (1.0 + (waves - 1.0) * (1.0 + drift)) + (units - 1) as f64 * fixed;
        let t = blocks.div_ceil(slots) as f64 * busiest;
        let fold = if shared == 0 {
            0.0
        } else {
            let bytes = 2.0 * (shared * k.bm * k.bn * 4) as f64;
            bytes / self.device.bandwidth
                + self.reduce.map_or(0.0, |r| r.per_chunk * (1 + slots_cap.div_ceil(k.fold_chunk())) as f64)
        };
        Some(t.max(p.min_bytes(k.elem) / self.device.bandwidth) + self.device.launch + fold)
    }

    /// Every choice for `p`: each kernel that accepts it (a SIMT kernel only where no
    /// tensor-core kernel does); a split-K kernel where its
    /// tiles alone would leave SMs idle (fewer blocks than SMs), with each of
    /// [`SPLITS`] that leaves at least two splits with work (once per distinct
    /// number of working splits).
    pub fn choices(&self, p: &Problem) -> Vec<Choice> {
        let mut out = Vec::new();
        // The cover kernels (SIMT, element-by-element mma.sync) only where no other
        // kernel takes the product.
        let aligned = self.kernels.iter().any(|k| !k.is_cover() && k.accepts(p).is_ok());
        for (i, k) in self.kernels.iter().enumerate() {
            if k.accepts(p).is_err() || (aligned && k.is_cover()) {
                continue;
            }
            if !k.split_k {
                out.push(Choice { kernel: i, splits: 1 });
                continue;
            }
            if k.blocks(p) >= self.device.sms {
                continue;
            }
            let mut seen = Vec::new();
            for s in SPLITS {
                let (_, working) = k.split_plan(p.k, s);
                if working >= 2 && !seen.contains(&working) {
                    seen.push(working);
                    out.push(Choice { kernel: i, splits: working });
                }
            }
        }
        out
    }

    /// The choice the model picks for `p`, with its predicted time; `None` when no
    /// kernel accepts it.
    pub fn choose(&self, p: &Problem) -> Option<(Choice, f64)> {
        self.choices(p).into_iter().map(|c| (c, self.predict(c, p))).min_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// A choice as text: the kernel's name, with `xS` for S splits.
    pub fn describe(&self, c: Choice) -> String {
        c.name(&self.kernels)
    }
}
