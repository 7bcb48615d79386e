//! The schedule space of a contraction and its sample-free, bottom-up candidate
//! generator (Vortex Alg. 2 with FTuner's filters).
//!
//! A [`Schedule`] is one point of the hierarchy: L0 the register tile (`MR × NR`,
//! plus an optional second height covering the rows past the last full band:
//! FTuner's `M = a·MR₁ + b·MR₂`), L1 the cache blocks (`KC`, `MC`, each a multiple
//! of the level below), L2 the thread grid. Candidates are built level by level
//! from the kernels that exist, each level a multiple of the one below, and
//! filtered by hardware alignment, the register budget (both already true of
//! every generated kernel), padding and occupancy. No sample shape is needed: the
//! generator runs for the bound shape at dispatch time, and the cost model in
//! [`crate::cost`] ranks what it yields.

use crate::direct::DirectKernel;
use crate::gemm::LoopOrder;
use crate::{Blocking, ElemType, KernelError, MicroKernel, Target, ThreadGrid};

pub use plan::{ALayout, BLayout, Problem};

/// A point of the schedule space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Schedule {
    pub mr: usize,
    pub nr: usize,
    /// The height of the kernel for the rows past the last full `MR` band.
    pub cover_mr: Option<usize>,
    pub blocking: Blocking,
    pub order: LoopOrder,
    pub grid: ThreadGrid,
    pub operands: Operands,
}

/// How the micro-kernels read the operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
pub enum Operands {
    /// From panels packed per cache block (A always; B unless pre-packed).
    #[default]
    Packed,
    /// Where they lie ([`crate::direct`]): A in place, B in place when row-major
    /// (else from its packed panels); the rows past the main height covered by
    /// every lower direct height, greedily.
    Direct,
}

impl std::fmt::Display for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.operands == Operands::Direct {
            write!(f, "direct ")?;
        }
        write!(f, "{}x{}", self.mr, self.nr)?;
        if let Some(h) = self.cover_mr {
            write!(f, "+{h}x{}", self.nr)?;
        }
        let g = self.grid;
        let order = if self.order == LoopOrder::MOuter { " m-outer" } else { "" };
        write!(
            f,
            " kc {} mc {}{order} threads {}x{}x{}",
            self.blocking.kc, self.blocking.mc, g.batch, g.rows, g.cols
        )
    }
}

/// The type the direct kernels of a family of `elem` multiply (an operand
/// read in place is not converted): a u8s8 family's read codes and their
/// weight's words; every other family's read floats (f32 kernels).
pub fn direct_elem(elem: ElemType) -> ElemType {
    match elem {
        ElemType::U8S8 => ElemType::U8S8,
        _ => ElemType::F32,
    }
}

/// A compiled micro-kernel and its measured L0 throughput (DietCode's `f_local`).
#[derive(Clone, Copy, Debug)]
pub struct KernelVariant {
    pub kernel: MicroKernel,
    /// Single-thread GFLOP/s on L1-resident panels.
    pub gflops: f64,
}

/// A compiled direct micro-kernel and its measured L0 throughput.
#[derive(Clone, Copy, Debug)]
pub struct DirectVariant {
    pub kernel: DirectKernel,
    /// Single-thread GFLOP/s on L1-resident operands, read in place.
    pub gflops: f64,
}

/// The micro-kernels a contraction may use at run time, all with the same
/// element type and epilogue: the L0 level of its schedule space. The direct kernels (optional)
/// are kept by width, highest first, so that a width's kernels from any height
/// down are one slice (what a [`crate::direct::DirectPlan`] takes).
#[derive(Clone, Debug)]
pub struct KernelFamily {
    variants: Vec<KernelVariant>,
    direct: Vec<DirectVariant>,
}

impl KernelFamily {
    pub fn new(variants: Vec<KernelVariant>) -> Result<KernelFamily, KernelError> {
        let Some(first) = variants.first() else {
            return Err(KernelError::Shape("a kernel family needs at least one micro-kernel".into()));
        };
        for v in &variants {
            if v.kernel.epilogue != first.kernel.epilogue || v.kernel.elem != first.kernel.elem {
                return Err(KernelError::Shape(
                    "the kernels of a family share one element type and epilogue".into(),
                ));
            }
            if v.kernel.mr == 0 || v.kernel.nr == 0 || v.gflops.is_nan() || v.gflops <= 0.0 {
                return Err(KernelError::Shape(format!(
                    "a {}x{} kernel at {} GFLOP/s cannot join a family",
                    v.kernel.mr, v.kernel.nr, v.gflops
                )));
            }
        }
        Ok(KernelFamily { variants, direct: Vec::new() })
    }

    /// This family with direct kernels too (same epilogue as the packed ones).
    /// An operand read in place is not converted: a u8s8 family's direct
    /// kernels multiply u8s8 (A's codes in place, B the weight packed for the
    /// family), every other family's f32: in a bf16 family they serve the
    /// small activation products (attention's) where converting both operands
    /// costs more than the product, at f32's accuracy; a weight packed as bf16
    /// they do not read.
    pub fn with_direct(mut self, mut direct: Vec<DirectVariant>) -> Result<KernelFamily, KernelError> {
        let ep = self.variants[0].kernel.epilogue;
        let elem = self.direct_elem();
        for v in &direct {
            if v.kernel.epilogue != ep {
                return Err(KernelError::Shape("the kernels of a family share one epilogue".into()));
            }
            if v.kernel.elem != elem {
                return Err(KernelError::Shape(format!(
                    "a {} family's direct kernels multiply {elem}, not {}",
                    self.elem(),
                    v.kernel.elem
                )));
            }
            if v.kernel.mr == 0 || v.kernel.nr == 0 || v.gflops.is_nan() || v.gflops <= 0.0 {
                return Err(KernelError::Shape(format!(
                    "a direct {}x{} kernel at {} GFLOP/s cannot join a family",
                    v.kernel.mr, v.kernel.nr, v.gflops
                )));
            }
        }
        direct.sort_by_key(|v| (v.kernel.nr, std::cmp::Reverse(v.kernel.mr)));
        direct.dedup_by_key(|v| (v.kernel.nr, v.kernel.mr));
        self.direct = direct;
        Ok(self)
    }
    /// The element type every kernel of the family multiplies.
    pub fn elem(&self) -> ElemType {
        self.variants[0].kernel.elem
    }
    /// The element type its direct kernels multiply ([`direct_elem`]).
    pub fn direct_elem(&self) -> ElemType {
        direct_elem(self.elem())
    }
    /// Whether its kernels store C as 8-bit codes ([`plan::Epilogue::codes`]):
    /// its products run in one K block (packed, or u8s8 direct).
    pub fn stores_codes(&self) -> bool {
        self.variants[0].kernel.epilogue.codes
    }
    pub fn direct_variants(&self) -> &[DirectVariant] {
        &self.direct
    }
    /// The direct kernels of width `nr`, highest first.
    pub fn direct_of_width(&self, nr: usize) -> &[DirectVariant] {
        let start = self.direct.iter().position(|v| v.kernel.nr == nr).unwrap_or(0);
        let len = self.direct.iter().filter(|v| v.kernel.nr == nr).count();
        &self.direct[start..start + len]
    }
    /// The direct kernels of width `nr` from height `mr` down (empty when there is
    /// no such kernel).
    pub fn direct_from(&self, mr: usize, nr: usize) -> &[DirectVariant] {
        let of_width = self.direct_of_width(nr);
        let start = of_width.iter().position(|v| v.kernel.mr == mr);
        start.map_or(&[], |s| &of_width[s..])
    }
    /// The direct rate of an `mr × nr` kernel.
    pub fn direct_gflops(&self, mr: usize, nr: usize) -> Option<f64> {
        self.direct.iter().find(|v| v.kernel.mr == mr && v.kernel.nr == nr).map(|v| v.gflops)
    }
    pub fn variants(&self) -> &[KernelVariant] {
        &self.variants
    }
    pub fn get(&self, mr: usize, nr: usize) -> Option<&KernelVariant> {
        self.variants.iter().find(|v| v.kernel.mr == mr && v.kernel.nr == nr)
    }
    /// The tile widths present, narrowest first.
    pub fn widths(&self) -> Vec<usize> {
        let mut w: Vec<usize> = self.variants.iter().map(|v| v.kernel.nr).collect();
        w.sort_unstable();
        w.dedup();
        w
    }
    /// The tile heights present for width `nr`, lowest first.
    pub fn heights(&self, nr: usize) -> Vec<usize> {
        let mut h: Vec<usize> =
            self.variants.iter().filter(|v| v.kernel.nr == nr).map(|v| v.kernel.mr).collect();
        h.sort_unstable();
        h.dedup();
        h
    }
    /// The main height for width `nr`: the fastest kernel of that width, ties within
    /// 3% (the measurement's noise) going to the lower tile, which pads less.
    pub fn best_height(&self, nr: usize) -> Option<usize> {
        let of_width = || self.variants.iter().filter(move |v| v.kernel.nr == nr);
        let top = of_width().map(|v| v.gflops).fold(0.0, f64::max);
        of_width().filter(|v| v.gflops >= (1.0 - PACKED_TIE) * top).map(|v| v.kernel.mr).min()
    }
}

/// How far below the fastest packed tile of a width another may measure and still
/// tie with it (the measurement's noise); ties go to the lower tile, which pads less.
pub const PACKED_TIE: f64 = 0.03;

/// How far below the fastest direct tile of a width a taller one may measure and
/// still be a main height. A direct tile's rate is measured with its B panel in L1,
/// where a taller tile gains nothing; in a product B comes from L2 or memory once
/// per band of rows, so a taller tile reads it fewer times. At 3%, with a record
/// measured in a slow phase, BERT-base's direct 8x48 (3.0% below 4x48) fell out of
/// the family and its products of 8-64 rows ran packed 3x48 or direct 4x48: the
/// model 10-16% slower than with 8x48 kept.
pub const DIRECT_TIE: f64 = 0.05;

/// The depth of a cache block for an `mr × nr` tile of `elem`: an A and a B
/// micro-panel fill about 80% of L1 (Vortex's utilization band), a multiple of 8.
pub fn kc_for(t: &Target, elem: ElemType, mr: usize, nr: usize) -> usize {
    Blocking::for_target(t, elem, mr, nr).kc
}

/// How deep a product storing codes ([`plan::Epilogue::codes`], which runs
/// in one K block) may be, whether A is a matrix or a convolution's taps: the
/// depth whose B panel of 2 vectors (the width a u8s8 weight is usually
/// packed in) fills a quarter of L2. Such a panel streams from L2
/// for every row tile, which tiles of 4 rows and more take in their stride
/// and lower ones do not ([`waits_on_panel`]); storing codes is worth it,
/// their reader takes a quarter of the bytes and reads them in place where
/// it would pack floats. On a target with AMX tiles of `elem`, both are at
/// least the depth whose B panel of a 32-wide tile fills an eighth of L2
/// (tile loads take B from L2 at the tiles' rate).
pub fn one_block_depth(t: &Target, elem: ElemType) -> usize {
    let deep = t.l2 / 4 / (2 * t.f32_lanes.max(1) * elem.bytes());
    let tile = 2 * crate::AMX_ROWS;
    let amx = match t.amx_tile(elem, tile, tile) {
        true => t.l2 / 8 / (tile * elem.bytes()),
        false => 0,
    };
    deep.max(amx)
}

/// The depth a `k`-deep weight of `elem` is packed in when packed whole (one
/// K block, [`plan::BLayout::serves`]), where its `nr`-wide panels are shallow
/// enough: within an eighth of L2, as [`taps_kc`]'s blocks (deeper, a panel
/// re-read for every row tile comes from farther than L2 keeps it). `None`
/// for a family storing codes, whose weights are packed whole anyway.
pub fn whole_depth(t: &Target, elem: ElemType, nr: usize, k: usize) -> Option<usize> {
    let budget = t.l2 / 16 / (nr.max(1) * elem.bytes());
    let float = matches!(elem, ElemType::F32 | ElemType::Bf16 | ElemType::F16);
    (float && k >= 1 && k <= budget).then_some(k)
}

/// The depth of the K blocks of a weight whose A is a convolution's overlapping
/// taps, `row` deep per kernel row (`kw · C`): whole kernel rows, as many as keep
/// the block's `nr`-wide B panel within an eighth of L2. A direct tile then sums
/// its kernel rows in registers in one call per block instead of cutting them at
/// the L1 depth (ResNet-50's 3×3 layers of 64-256 channels, `bench-matmul --conv
/// --kc`: 2-5% faster than blocks 256 deep; a whole 2304-deep K, its panel
/// 295 KB, was slower again). `None` when one row overflows the budget: ResNet-50's
/// 512-channel layers (rows 1536 deep) ran 12-15% slower in the model at 224 in
/// blocks of a row (their packed schedules re-read a 196 KB B panel from L2 for
/// every row tile), and level at 288 with the direct ones.
pub fn taps_kc(t: &Target, elem: ElemType, nr: usize, row: usize, k: usize) -> Option<usize> {
    let row = row.max(1);
    let budget = t.l2 / 8 / (nr.max(1) * elem.bytes());
    (row <= budget).then(|| ((budget / row) * row).min(k.max(1)))
}

/// The block for an `extent` cut in blocks of about `block`: blocks of equal size
/// (up to a multiple of `unit`), one block fewer when that enlarges each by at
/// most 1/16. For the row blocks of A (sized to half of L2, a soft budget), where
/// each block is one more pass over B: 1024 rows in blocks of 504 are three
/// passes, two of 518 are two. Not for `kc`: the B micro-panel's L1 budget is
/// hard (FFN-out at 128 rows lost 4% with blocks 148 deep instead of 144).
pub fn balanced_block(extent: usize, block: usize, unit: usize) -> usize {
    let (block, unit) = (block.max(1), unit.max(1));
    if extent <= block {
        return block;
    }
    let round = |x: usize| x.div_ceil(unit) * unit;
    let blocks = extent.div_ceil(block);
    let fewer = round(extent.div_ceil(blocks - 1));
    let equal = round(extent.div_ceil(blocks));
    if fewer <= block + block / 16 {
        fewer
    } else if equal <= block {
        equal
    } else {
        block
    }
}

/// Whether K is barely deeper than a tile's L1 blocks (`l1_kc`), at most
/// half a block more: one block then, not two with a short second one.
pub fn one_block_suffices(k: usize, l1_kc: usize) -> bool {
    k <= l1_kc * 3 / 2
}

/// Whether a weight packed `packed` deep is also read in the L1 blocks
/// (`l1_kc` deep) of a tile: when it is packed whole ([`BLayout::serves`]),
/// K is well deeper than those blocks, A is a matrix and C floats. One block
/// writes C once where the L1 blocks write it once per block, a pass over C
/// that outweighs the B panel's overflow of L1 when C is large (a vocabulary's
/// LM head at hundreds of rows); with a few rows the L1 blocks are faster, so
/// both are candidates and the shape picks.
fn shallower_blocks(fam: &KernelFamily, p: &Problem, nr: usize, packed: usize, l1_kc: usize) -> bool {
    packed >= p.k
        && !one_block_suffices(p.k, l1_kc)
        && !fam.stores_codes()
        && matches!(p.a, ALayout::RowMajor | ALayout::Strided)
        && p.b.serves(nr, l1_kc, p.k)
}

/// FTuner's padding threshold: a tile whose padded work exceeds the least padded
/// tile's by more than this fraction of the useful work is not a candidate.
const PAD_SLACK: f64 = 0.5;

/// Vortex Alg. 2 for one bound problem: L0 tiles from the family (filtered by
/// padding and by B's fixed layout), L1 blocks as multiples of the tile sized to
/// L1/L2, L2 thread grids over the pool's `threads` that leave no thread idle
/// (or one thread alone), and the FTuner cover heights.
pub fn candidates(t: &Target, threads: usize, fam: &KernelFamily, p: &Problem) -> Vec<Schedule> {
    let mut out = Vec::new();
    // L0: the main tiles. Each width's fastest height and every lower one.
    let mut tiles = Vec::new();
    for nr in fam.widths() {
        if let BLayout::Packed { nr: fixed, .. } = p.b {
            if nr != fixed {
                continue;
            }
        }
        let Some(best) = fam.best_height(nr) else { continue };
        for mr in fam.heights(nr).into_iter().filter(|&h| h <= best) {
            tiles.push((mr, nr));
        }
    }
    let padded = |mr: usize, nr: usize| {
        (p.m.div_ceil(mr) * mr * p.n.div_ceil(nr) * nr) as f64 / (p.m * p.n).max(1) as f64 - 1.0
    };
    let least = tiles.iter().map(|&(mr, nr)| padded(mr, nr)).fold(f64::INFINITY, f64::min);
    for (mr, nr) in tiles {
        // With a cover kernel, M's padding can be removed: judge M by the tile only when
        // there is no lower height to cover with.
        let can_cover = fam.heights(nr).iter().any(|&h| h < mr);
        let pad = if can_cover { padded(1, nr) } else { padded(mr, nr) };
        if pad > least + PAD_SLACK {
            continue;
        }
        // L1: KC from L1 (or fixed by the packed weight), one block when K is barely
        // deeper; MC a multiple of MR from L2.
        let base = Blocking::for_target(t, fam.elem(), mr, nr);
        let kcs: Vec<usize> = match p.b {
            BLayout::Packed { kc, .. } if shallower_blocks(fam, p, nr, kc, base.kc) => vec![kc, base.kc],
            BLayout::Packed { kc, .. } => vec![kc],
            _ if one_block_suffices(p.k, base.kc) => vec![p.k.max(1)],
            _ => vec![base.kc],
        };
        for kc in kcs {
            let mc = ((base.mc * base.kc / kc.max(1)) / mr).max(1) * mr;
            let blocking = Blocking { kc, mc, nc: base.nc };
            // FTuner's two heights: every lower height of the same width that covers
            // the remainder in fewer padded rows than one more full tile.
            let rem = p.m % mr;
            let mut covers = vec![None];
            if rem > 0 {
                covers.extend(fam.heights(nr).into_iter().filter(|&h| h < mr).map(Some));
            }
            for cover_mr in covers.iter().copied() {
                for grid in grids(threads, p, mr, nr) {
                    let packed = |blocking, order| Schedule {
                        mr,
                        nr,
                        cover_mr,
                        blocking,
                        order,
                        grid,
                        operands: Operands::Packed,
                    };
                    out.push(packed(blocking, LoopOrder::KOuter));
                    // Deep K: the row block whose C fits half of L2 keeps it there across
                    // the K loop.
                    let cols = p.n.div_ceil(nr).div_ceil(grid.cols) * nr;
                    let rows = p.m.div_ceil(mr).div_ceil(grid.rows) * mr;
                    let mc_c = (t.l2 / 2 / (cols * 4).max(1) / mr).max(1) * mr;
                    if p.k > kc && mc_c < rows {
                        out.push(packed(Blocking { mc: mc_c, ..blocking }, LoopOrder::MOuter));
                    }
                }
            }
        }
    }
    direct_candidates(t, threads, fam, p, least, &mut out);
    out
}

/// Whether `s` is a u8s8 packed tile of fewer than 4 rows whose K block's B
/// panel outgrows L1 (with rows for several tiles): it waits on the panel
/// streaming from L2 for every 2 rows, which the measured rates (panels in L1)
/// do not price. A model picks one only where nothing else fits (ResNet-50's
/// 3×3 products at 7×7 ran packed 2x32 well behind direct 5x32; a strided
/// 1×1's panel of L1's size did not: BENCHMARKS.md, session 62). It stays a
/// candidate for A that the direct kernels cannot read.
pub fn waits_on_panel(t: &Target, fam: &KernelFamily, p: &Problem, s: &Schedule) -> bool {
    fam.elem() == ElemType::U8S8
        && s.operands == Operands::Packed
        && s.mr < 4
        && panel_outgrows(p, s.blocking.kc, s.nr, t.l1d)
}

/// Whether a `kc`-deep K block's B panel, `nr` wide (a byte an element: u8s8),
/// is larger than `bytes`, over rows for several tiles: it streams from L2
/// again for every row tile.
fn panel_outgrows(p: &Problem, kc: usize, nr: usize, bytes: usize) -> bool {
    kc.min(p.k) * nr > bytes && p.m >= 8
}

/// The direct schedules (A read in place): per width whose direct heights go down
/// to 1, every main height up to the fastest (every height for a convolution); KC the whole of K when it is barely
/// deeper than a block (or the packed weight's); no MC (nothing is packed).
fn direct_candidates(
    t: &Target,
    threads: usize,
    fam: &KernelFamily,
    p: &Problem,
    least_pad: f64,
    out: &mut Vec<Schedule>,
) {
    if !matches!(p.a, ALayout::RowMajor | ALayout::Taps { .. }) {
        return;
    }
    // A u8s8 family's direct kernels read A's codes a word of four depths at a
    // time and B from a weight packed for them.
    let u8s8 = fam.direct_elem() == ElemType::U8S8;
    if u8s8 && (!matches!(p.b, BLayout::Packed { .. }) || !p.k.is_multiple_of(4)) {
        return;
    }
    let mut widths: Vec<usize> = fam.direct_variants().iter().map(|v| v.kernel.nr).collect();
    widths.dedup();
    for nr in widths {
        if let BLayout::Packed { nr: fixed, .. } = p.b {
            // A weight packed in another element type is not theirs to read.
            let theirs = if u8s8 { ElemType::U8S8 } else { ElemType::F32 };
            if nr != fixed || fam.elem() != theirs {
                continue;
            }
        }
        let of_width = fam.direct_of_width(nr);
        if of_width.last().is_none_or(|v| v.kernel.mr != 1) {
            continue;
        }
        // Masked lanes are the only padding: N's, to a multiple of NR.
        let pad = (p.n.div_ceil(nr) * nr) as f64 / p.n.max(1) as f64 - 1.0;
        if pad > least_pad + PAD_SLACK {
            continue;
        }
        // Every height up to the tallest of the fastest (within `DIRECT_TIE`), and for a
        // convolution every height: no direct height pads (the rows past the last
        // full band are covered by the lower ones), and a taller tile reads B once
        // for more rows. Ties went to the lowest before, and a 2-row tile measures
        // at the peak with its B panel in L1: BERT-base's 384×768×768 could then
        // take direct heights 2 and 1 only, and ran direct 2x48, 40-50% slower
        // (`bench-matmul --exhaustive`) than 4x48. A convolution's weights live in
        // L2, where a taller tile reads them less often per FMA (ResNet-50's 3×3
        // layers: 8x32 and 13x32 ran 3-5% ahead of 4x32).
        let top = of_width.iter().map(|v| v.gflops).fold(0.0, f64::max);
        let tallest = of_width
            .iter()
            .filter(|v| v.gflops >= (1.0 - DIRECT_TIE) * top)
            .map(|v| v.kernel.mr)
            .max()
            .unwrap_or(1);
        let tallest = if matches!(p.a, ALayout::Taps { .. }) { usize::MAX } else { tallest };
        for mr in of_width.iter().map(|v| v.kernel.mr).filter(|&h| h <= tallest) {
            let base = Blocking::for_target(t, fam.elem(), mr, nr);
            let mut kcs = match p.b {
                BLayout::Packed { kc, .. } if shallower_blocks(fam, p, nr, kc, base.kc) => vec![kc, base.kc],
                BLayout::Packed { kc, .. } => vec![kc],
                _ if one_block_suffices(p.k, base.kc) => vec![p.k.max(1)],
                _ => vec![base.kc],
            };
            // u8s8: blocks of whole words; storing codes, one block. A block's panel
            // larger than half of L1 streams from L2 again for every tile, which a
            // tile of fewer than 4 rows waits on (ResNet-50's 3×3 products of 256
            // channels, a 72 KB panel: direct 2x32 ran 20-45% slower than 12x32,
            // `bench-matmul --dtype u8s8 --conv --exhaustive`), and which the
            // measured rates (panels in L1) do not price: no such main height where
            // the rows make several tiles.
            kcs.retain(|&kc| {
                !u8s8
                    || (kc.is_multiple_of(4)
                        && (kc >= p.k || !fam.stores_codes())
                        && (mr >= 4 || !panel_outgrows(p, kc, nr, t.l1d / 2)))
            });
            let blockings = kcs.iter().map(|&kc| Blocking { kc, mc: mr, nc: base.nc });
            for (blocking, grid) in
                blockings.flat_map(|b| grids(threads, p, mr, nr).into_iter().map(move |g| (b, g)))
            {
                // Threads split a convolution's pixels, not its columns, unless its
                // weights outweigh its taps (N > M: the 7×7 and 14×14 layers of a
                // ResNet): a thread with a share of the columns reads all of the
                // image's taps, one with a share of the pixels all of the weights.
                let taps = matches!(p.a, ALayout::Taps { .. });
                if taps && grid.cols > 1 && p.m.div_ceil(mr) >= threads && p.n <= p.m {
                    continue;
                }
                let order = LoopOrder::KOuter;
                out.push(Schedule {
                    mr,
                    nr,
                    cover_mr: None,
                    blocking,
                    order,
                    grid,
                    operands: Operands::Direct,
                });
            }
        }
    }
}

/// L2: the thread grids that give every thread work (occupancy), plus one thread.
fn grids(threads: usize, p: &Problem, mr: usize, nr: usize) -> Vec<ThreadGrid> {
    let (bands, panels) = (p.m.div_ceil(mr), p.n.div_ceil(nr));
    let mut out = vec![ThreadGrid::SINGLE];
    if threads <= 1 {
        return out;
    }
    for b in divisors(threads) {
        for r in divisors(threads / b) {
            let c = threads / b / r;
            if b <= p.batch && r <= bands && c <= panels {
                out.push(ThreadGrid { batch: b, rows: r, cols: c });
            }
        }
    }
    out
}

fn divisors(n: usize) -> Vec<usize> {
    (1..=n).filter(|d| n.is_multiple_of(*d)).collect()
}
