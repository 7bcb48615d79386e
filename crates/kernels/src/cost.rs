//! The analytical levels of the hybrid analyzer (Vortex §5.2): L0 is measured
//! (each kernel's single-thread throughput, [`crate::KernelVariant::gflops`]);
//! everything above is predicted from the machine's measured bandwidths.
//!
//! Three models rank the candidates of [`crate::schedule::candidates`]:
//! - [`CostModel::Hierarchical`], Vortex Eq. 2-4 on a CPU. For each thread, the
//!   temporal cost of its serial loops (Eq. 2) overlaps the micro-kernels'
//!   compute with the B stream from wherever B lives, and adds what cannot
//!   overlap: packing A (and B when it is an activation), C's write-backs and
//!   edge tiles; the parallel factor (Eq. 3) is the slowest thread of the grid
//!   times the batch entries each group runs in turn; Eq. 4 multiplies them and
//!   adds the fork-join.
//! - [`CostModel::DietCode`], `f_local · f_spatial · f_pad` (DietCode Eq. 3): the
//!   padded work at the tile's measured throughput, over the balance of tiles
//!   across threads (`f_spatial`, a thread standing in for an SM). It ranks tiles
//!   only; the thread grid follows the rule of thumb.
//! - [`CostModel::Sia`], FTuner's synthesis index `CMR + (1 − Pad) + Occ`
//!   (weights 1), averaged over the two tiles of a cover; tiles only, too.

use crate::gemm::LoopOrder;
use crate::schedule::{ALayout, BLayout, KernelFamily, Operands, Problem, Schedule};
use crate::{ElemType, ThreadGrid};

/// What the analytical levels know about the machine, measured by
/// `tune::calibrate` and cached with the tuning record.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MachineModel {
    pub threads: usize,
    pub l1d: usize,
    pub l2: usize,
    pub l3: usize,
    /// Bytes per second from memory, all threads together.
    pub dram_bw: f64,
    /// Bytes per second one thread reads from L3 (its share when all read).
    pub l3_bw: f64,
    /// Bytes per second one thread reads from its L2.
    pub l2_bw: f64,
    /// Bytes per second of A one thread packs into micro-panels (L2-resident source).
    pub pack_a_bw: f64,
    /// Bytes per second of a row-major B one thread packs into micro-panels.
    pub pack_b_bw: f64,
    /// The same for a B stored transposed (its pack interleaves rows, as A's does).
    pub pack_bt_bw: f64,
    /// Seconds of one fork-join of the pool, all threads.
    pub fork_join: f64,
    /// The measured FMA peak of all threads, GFLOP/s (0 when not measured).
    #[serde(default)]
    pub peak_gflops: f64,
}

/// Which analytical model ranks the candidates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
pub enum CostModel {
    #[default]
    Hierarchical,
    DietCode,
    Sia,
}

impl std::str::FromStr for CostModel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "hierarchical" | "vortex" => Ok(CostModel::Hierarchical),
            "dietcode" => Ok(CostModel::DietCode),
            "sia" | "ftuner" => Ok(CostModel::Sia),
            _ => Err(format!("unknown cost model `{s}` (hierarchical, dietcode, sia)")),
        }
    }
}

impl CostModel {
    pub const ALL: [CostModel; 3] = [CostModel::Hierarchical, CostModel::DietCode, CostModel::Sia];

    pub fn name(&self) -> &'static str {
        match self {
            CostModel::Hierarchical => "hierarchical",
            CostModel::DietCode => "dietcode",
            CostModel::Sia => "sia",
        }
    }

    /// Whether this model ranks thread grids (the others take the rule of thumb's).
    pub fn ranks_grids(&self) -> bool {
        matches!(self, CostModel::Hierarchical)
    }

    /// The model's cost of `s` for `p`: lower is better (SIA's score is negated).
    pub fn cost(&self, m: &MachineModel, fam: &KernelFamily, p: &Problem, s: &Schedule) -> f64 {
        match self {
            CostModel::Hierarchical => m.predict(fam, p, s),
            CostModel::DietCode => dietcode(m, fam, p, s),
            CostModel::Sia => -sia(m, fam, p, s),
        }
    }
}

/// The part of the shorter of compute and B's stream that does not hide behind the
/// longer (Eq. 2 takes their max, which assumes perfect overlap; the first touch of
/// each B panel stalls the micro-kernel). Fitted on the regret sweep in BENCHMARKS.md.
const OVERLAP_LOSS: f64 = 0.5;

/// What one direct kernel call costs beyond its tile's FMAs (the call, C's load
/// and store, the loop's setup), which the measured rates (long runs of calls on
/// one tile) leave out: without it, tiles of one width whose rates tie go to the
/// lowest, which makes the most calls (BERT-base's 384×768×768 ran direct 2x48,
/// its rate measured 0.1% over direct 4x48's, 40-50% slower than 4x48).
const DIRECT_CALL_S: f64 = 20e-9;

/// The rows and panels the threads of one group get, as `execute` splits them.
fn split(len: usize, unit: usize, parts: usize, index: usize) -> usize {
    let per = len.div_ceil(unit).div_ceil(parts) * unit;
    ((index + 1) * per).min(len) - (index * per).min(len)
}

impl MachineModel {
    /// The bandwidth one of `active` threads reads `bytes` with: from L2 when they
    /// fit half of it, else from L3 when they fit half of that, else its share of DRAM.
    fn level_bw(&self, bytes: f64, active: f64) -> f64 {
        if bytes <= self.l2 as f64 / 2.0 {
            self.l2_bw
        } else if bytes <= self.l3 as f64 / 2.0 {
            self.l3_bw
        } else {
            self.dram_bw / active
        }
    }

    /// Predicted seconds of `s` on `p` (Vortex Eq. 2-4; see the module docs).
    pub fn predict(&self, fam: &KernelFamily, p: &Problem, s: &Schedule) -> f64 {
        if s.operands == Operands::Direct {
            return self.predict_direct(fam, p, s);
        }
        let (mr, nr, kc) = (s.mr, s.nr, s.blocking.kc.max(1));
        // f32 in memory (operands, C); B's panels in the family's element type.
        let f = std::mem::size_of::<f32>() as f64;
        let fb = fam.elem().b_bytes() as f64;
        let rate = |h: usize| fam.get(h, nr).map_or(1e9, |v| v.gflops * 1e9);
        let tile = |h: usize| 2.0 * (h * nr * p.k) as f64 / rate(h);
        let g = s.grid;
        let active = g.threads().max(1) as f64;
        let panels = p.n.div_ceil(nr);
        let kblocks = p.k.div_ceil(kc) as f64;
        // Where B is read from: its whole packed size against the caches.
        let b_total = (p.k * panels * nr) as f64 * fb;
        // An activation B is packed by each thread into its L2: the reads are packing's.
        let b_src = if p.b.is_activation() { self.l2_bw } else { self.level_bw(b_total, active) };
        let mut slowest: f64 = 0.0;
        for lr in 0..g.rows {
            let rows = split(p.m, mr, g.rows, lr);
            for lc in 0..g.cols {
                let cols = split(panels, 1, g.cols, lc);
                if rows == 0 || cols == 0 {
                    continue;
                }
                let (full, rem) = (rows / mr, rows % mr);
                let edge_rows = match (rem, s.cover_mr) {
                    (0, _) => 0.0,
                    (_, Some(h)) => rem.div_ceil(h) as f64 * tile(h) / tile(mr),
                    (_, None) => 1.0,
                };
                let compute = cols as f64 * (full as f64 + edge_rows) * tile(mr);
                let b_bytes = (cols * nr * p.k) as f64 * fb;
                // An activation B's packing reads its f32 source.
                let b_src_bytes = (cols * nr * p.k) as f64 * f;
                let mc = crate::schedule::balanced_block(rows, s.blocking.mc.max(mr), mr);
                // The rows past the last full band, under a cover height, are a block
                // of their own (`band`): one more pass over the thread's B. At 17 rows
                // of BERT-base's 17×3072×768, 4x48+1x48 read B's 9.4 MB twice, the
                // second time for one row.
                let cover_block = s.cover_mr.is_some() && rem > 0;
                let mblocks = (rows - if cover_block { rem } else { 0 }).div_ceil(mc) as f64
                    + if cover_block { 1.0 } else { 0.0 };
                let l2_half = self.l2 as f64 / 2.0;
                let c_block = |r: usize| (r * cols * nr) as f64 * f;
                // Where C comes back from between K blocks: L2 when the thread's
                // block fits half of it, L3 when every thread's does half of that,
                // else memory (a vocabulary's LM head at hundreds of rows: 62 MB).
                let c_level = |bytes: f64| {
                    if bytes <= l2_half {
                        self.l2_bw
                    } else if bytes * active <= self.l3 as f64 / 2.0 {
                        self.l3_bw
                    } else {
                        self.dram_bw / active
                    }
                };
                let (load_b, pack_b, c_bw) = match s.order {
                    LoopOrder::KOuter => {
                        // A slice of B is read (or packed) once per thread, then re-read
                        // per row block from L2 if it fits; C comes back every slice.
                        let b_block_fits = (kc * cols * nr) as f64 * fb <= l2_half;
                        let reread = if b_block_fits { self.l2_bw } else { b_src };
                        let load = b_bytes / b_src + (mblocks - 1.0) * b_bytes / reread;
                        (load, b_src_bytes, c_level(c_block(rows)))
                    }
                    LoopOrder::MOuter => {
                        // All of the thread's B per row block; C stays in L2.
                        let b_fits = b_bytes <= l2_half;
                        let reread = if b_fits { self.l2_bw } else { b_src };
                        let load = b_bytes / b_src + (mblocks - 1.0) * b_bytes / reread;
                        (load, mblocks * b_src_bytes, c_level(c_block(mc)))
                    }
                };
                // Packing reads A where it lies: at packing's rate from the caches,
                // at memory's when what A reads is larger than the caches hold (a
                // convolution's taps read each image value `reads` times, all but
                // the first from cache).
                let a_total = (p.batch * p.m * p.k) as f64 * f / p.a.reads() as f64;
                let a_src = self.pack_a_bw.min(self.level_bw(a_total, active));
                let pack_a = (rows.div_ceil(mr) * mr * p.k) as f64 * f / a_src;
                let pack_b = match p.b {
                    BLayout::NMajor => pack_b / self.pack_b_bw,
                    BLayout::Strided | BLayout::KMajor => pack_b / self.pack_bt_bw,
                    BLayout::Packed { .. } => 0.0,
                };
                let c_bytes = (rows * cols * nr) as f64 * f * (2.0 * kblocks - 1.0);
                let last_partial = lc + 1 == g.cols && !p.n.is_multiple_of(nr);
                let edge_tiles = (if rem > 0 && s.cover_mr.is_none() { cols } else { 0 }
                    + if last_partial { full } else { 0 }) as f64;
                let edges = edge_tiles * kblocks * (mr * nr) as f64 * f * 4.0 / self.l2_bw;
                let t = compute.max(load_b)
                    + OVERLAP_LOSS * compute.min(load_b)
                    + pack_a
                    + pack_b
                    + c_bytes / c_bw
                    + edges;
                slowest = slowest.max(t);
            }
        }
        let entries = p.batch.div_ceil(g.batch) as f64;
        entries * slowest + if g.threads() > 1 { self.fork_join } else { 0.0 }
    }
}

impl MachineModel {
    /// Predicted seconds of a direct schedule: the same Eq. 2-4 with nothing packed
    /// (but a strided B), A re-read from L2 for every column panel, B read
    /// once per thread from where it lies and then from L1, the rows past the main
    /// height covered greedily by the lower heights.
    fn predict_direct(&self, fam: &KernelFamily, p: &Problem, s: &Schedule) -> f64 {
        let (mr, nr, kc) = (s.mr, s.nr, s.blocking.kc.max(1));
        let f = std::mem::size_of::<f32>() as f64;
        // Bytes an element: u8s8 reads codes and a weight's bytes, and may
        // store codes.
        let u8s8 = fam.direct_elem() == ElemType::U8S8;
        let (fa, fc) = (if u8s8 { 1.0 } else { f }, if fam.stores_codes() { 1.0 } else { f });
        let kernels = fam.direct_from(mr, nr);
        let tile = |h: usize| {
            let rate = fam.direct_gflops(h, nr).unwrap_or(1.0) * 1e9;
            2.0 * (h * nr * p.k) as f64 / rate
        };
        let g = s.grid;
        let panels = p.n.div_ceil(nr);
        let kblocks = p.k.div_ceil(kc) as f64;
        // Where the operands come from on first touch: the whole batch's A, B and C
        // against the caches (a batch larger than L2 streams each entry from L3). A
        // convolution's A is the part of its image the taps touch: each value read
        // `reads` times, all but the first from cache.
        let reads = p.a.reads() as f64;
        let a_first = (p.m * p.k) as f64 / reads;
        let total = p.batch as f64 * ((a_first + (p.k * p.n) as f64) * fa + (p.m * p.n) as f64 * fc);
        let src = self.level_bw(total, g.threads().max(1) as f64);
        let mut slowest: f64 = 0.0;
        let unit = crate::gemm::row_split_unit(matches!(p.a, ALayout::Taps { .. }), mr);
        for lr in 0..g.rows {
            let rows = split(p.m, unit, g.rows, lr);
            for lc in 0..g.cols {
                let cols = split(panels, 1, g.cols, lc);
                if rows == 0 || cols == 0 {
                    continue;
                }
                // The row cover: full bands, then the highest kernels that fit.
                // (Greedy: as many of each height as fit, highest first; a time per
                // height, not per row, so that a pick at a large M costs what one at a
                // small M does.)
                let cover = |rows: usize| {
                    let (mut left, mut band) = (rows, 0.0);
                    for h in kernels.iter().map(|v| v.kernel.mr) {
                        let count = left / h.max(1);
                        band += count as f64 * (tile(h) + DIRECT_CALL_S);
                        left -= count * h.max(1);
                    }
                    band + if left > 0 { tile(left) + DIRECT_CALL_S } else { 0.0 }
                };
                // A convolution's interior pixels are covered per output row, its
                // edge pixels per column over the thread's output rows. A thread's
                // share may end mid-row: counting whole rows only, ResNet-50's
                // 9×9 layers (42 pixels a thread: 4 rows and 6 more) were priced
                // 14% under their work, and split by pixels where splitting by
                // columns measured 23% faster.
                let band = match p.a {
                    ALayout::Taps { width, interior, .. } if width > 0 => {
                        let out_rows = rows as f64 / width as f64;
                        let edges = width - interior.min(width);
                        out_rows * cover(interior) + edges as f64 * cover(rows.div_ceil(width))
                    }
                    _ => cover(rows),
                };
                let compute = cols as f64 * band;
                // A: fetched once, then re-read from L2 for every further panel (the
                // driver blocks the rows so that a block's A fits half of L2). A
                // convolution's taps fetch the image values they touch; those its
                // kernel rows and next output rows read again come from L1.
                let a_bytes = (rows * p.k) as f64 * fa / reads;
                let b_bytes = (cols * nr * p.k) as f64 * fa;
                let load = (a_bytes + b_bytes) / src + (cols as f64 - 1.0) * a_bytes / self.l2_bw;
                let pack_b = if matches!(p.b, BLayout::Strided | BLayout::KMajor) {
                    b_bytes / self.pack_bt_bw
                } else {
                    0.0
                };
                let c_bytes = (rows * cols * nr) as f64 * fc;
                let c_time = c_bytes / src + c_bytes * 2.0 * (kblocks - 1.0) / self.l2_bw;
                let t = compute.max(load) + OVERLAP_LOSS * compute.min(load) + pack_b + c_time;
                slowest = slowest.max(t);
            }
        }
        let entries = p.batch.div_ceil(g.batch) as f64;
        entries * slowest + if g.threads() > 1 { self.fork_join } else { 0.0 }
    }
}

/// The measured rate of `s`'s main kernel, GFLOP/s.
fn rate(fam: &KernelFamily, s: &Schedule) -> Option<f64> {
    match s.operands {
        Operands::Packed => fam.get(s.mr, s.nr).map(|v| v.gflops),
        Operands::Direct => fam.direct_gflops(s.mr, s.nr),
    }
}

/// The padded work of `s` on `p`, and its tiles (row bands × panels × entries).
fn padded_work(p: &Problem, s: &Schedule) -> (f64, usize) {
    let rem = p.m % s.mr;
    let rows = match s.cover_mr {
        _ if s.operands == Operands::Direct => p.m,
        Some(h) if rem > 0 => p.m - rem + rem.div_ceil(h) * h,
        _ => p.m.div_ceil(s.mr) * s.mr,
    };
    let panels = p.n.div_ceil(s.nr);
    let work = 2.0 * (p.batch * rows * panels * s.nr * p.k) as f64;
    (work, p.batch * p.m.div_ceil(s.mr) * panels)
}

/// DietCode's `f_local · f_spatial · f_pad`, as seconds: the padded work at the
/// tile's measured rate spread over the threads, stretched by the imbalance of
/// tiles over threads (`pad(W/M, threads) / (W/M)`, with DietCode's k = 1 for
/// CPU threads that cannot overlap waves).
fn dietcode(m: &MachineModel, fam: &KernelFamily, p: &Problem, s: &Schedule) -> f64 {
    let rate = rate(fam, s).map_or(1e9, |r| r * 1e9);
    let (work, tiles) = padded_work(p, s);
    let t = m.threads.max(1);
    let spatial = (tiles.div_ceil(t) * t) as f64 / tiles.max(1) as f64;
    work / rate / t as f64 * spatial
}

/// FTuner's SIA score (higher is better): compute-to-memory ratio of the tile
/// (normalized by the family's best), one minus the padding fraction, and the
/// occupancy of the threads; a two-height cover averages its two tiles.
fn sia(m: &MachineModel, fam: &KernelFamily, p: &Problem, s: &Schedule) -> f64 {
    let cmr = |mr: usize, nr: usize| (mr * nr) as f64 / (mr + nr) as f64;
    let best = fam.variants().iter().map(|v| cmr(v.kernel.mr, v.kernel.nr)).fold(0.0, f64::max);
    let useful = 2.0 * (p.batch * p.m * p.n * p.k) as f64;
    let (work, tiles) = padded_work(p, s);
    let pad = 1.0 - useful / work.max(1.0);
    let t = m.threads.max(1);
    let occ = tiles as f64 / (tiles.div_ceil(t) * t) as f64;
    let score = |mr: usize| cmr(mr, s.nr) / best + (1.0 - pad) + occ;
    match s.cover_mr {
        Some(h) if !p.m.is_multiple_of(s.mr) => (score(s.mr) + score(h)) / 2.0,
        _ => score(s.mr),
    }
}

/// The grid the tile-only models take: the rule of thumb for this tile.
pub fn rule_grid(threads: usize, p: &Problem, mr: usize, nr: usize) -> ThreadGrid {
    ThreadGrid::rule_of_thumb(threads, p.batch, p.m.div_ceil(mr), p.n.div_ceil(nr))
}
