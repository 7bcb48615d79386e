//! The packing-free path for small and thin products (attention's per-head `Q·Kᵀ`
//! and `P·V`): micro-kernels that read A where it lies (rows of stride `lda`,
//! unit stride along K) and B where it lies (rows of stride `ldb`, unit stride
//! along N), or from B's packed panels (`ldb = NR`). A product of 16×64 by 64×16
//! costs less than packing its operands, and when N is small (P·V's 64 columns)
//! packing A costs as much as the product at any M; here neither is packed.
//!
//! Edges need no padding at all (DietCode §4.2 taken one step further): the
//! kernel masks B's loads and C's loads and stores past `ncols`, and the rows
//! are covered exactly by kernels of several heights (FTuner's combination,
//! greedily: the main height, then the largest height that fits what is left).

use crate::gemm::{BOperand, BlockPanels, CPtr, EpilogueArgs, KeptB, MatRef, ThreadGrid, Workspace};
use crate::pack::{pack_b, Packers};
use crate::{ElemType, KernelError, ACCUMULATE, APPLY_EPILOGUE};
use plan::Epilogue;

pub use plan::abi::DirectKernelFn;

/// A direct micro-kernel, the tile it computes and the epilogue compiled into it.
/// An operand read in place is not converted: direct kernels multiply f32, or
/// u8s8 (A's 8-bit codes read a 4-byte word of four depths at a time, B a
/// u8s8 weight's packed panels; an epilogue that stores codes).
#[derive(Clone, Copy, Debug)]
pub struct DirectKernel {
    pub mr: usize,
    pub nr: usize,
    /// F32 or U8S8.
    pub elem: ElemType,
    pub func: DirectKernelFn,
    pub epilogue: Epilogue,
    /// Generated packs: `bt`, for a B stored transposed (A is read in place).
    pub packers: Packers,
}

/// What a direct schedule runs: the kernels of one width, highest first (the
/// first is the main height; the others cover the rows past the last full band,
/// and the lowest must be 1 so that every remainder is covered), the depth of a
/// K block, the rows of A a thread keeps in L2 across B's column panels (`mc`:
/// a block of `mc × kc` values, see [`direct_rows`]) and the thread grid.
#[derive(Clone, Copy, Debug)]
pub struct DirectPlan<'k> {
    pub kernels: &'k [crate::schedule::DirectVariant],
    pub kc: usize,
    pub mc: usize,
    pub grid: ThreadGrid,
}

/// The rows of A a direct schedule blocks for: `kc`-deep rows filling half of
/// `l2`, a multiple of the main height `mr`. Without the blocking, a thread
/// would sweep all its rows once per column panel and K block, reading A from
/// memory each time, and re-reading C's whole band per K block.
pub fn direct_rows(l2: usize, kc: usize, mr: usize) -> usize {
    let mr = mr.max(1);
    (l2 / 2 / (kc.max(1) * 4) / mr).max(1) * mr
}

impl DirectPlan<'_> {
    /// The main tile and the element type the kernels multiply.
    pub(crate) fn check(&self) -> Result<(usize, usize, ElemType), KernelError> {
        let ks = self.kernels;
        let (Some(main), Some(low)) = (ks.first(), ks.last()) else {
            return Err(KernelError::Shape("a direct plan needs kernels".into()));
        };
        let sorted = ks.windows(2).all(|w| w[0].kernel.mr > w[1].kernel.mr);
        let k0 = &main.kernel;
        let same = ks
            .iter()
            .all(|v| (v.kernel.nr, v.kernel.elem, v.kernel.epilogue) == (k0.nr, k0.elem, k0.epilogue));
        if !sorted || !same || low.kernel.mr != 1 || self.kc == 0 || self.mc == 0 {
            return Err(KernelError::Shape(
                "a direct plan takes kernels of one width, type and epilogue, highest first down to height 1"
                    .into(),
            ));
        }
        if !matches!(k0.elem, ElemType::F32 | ElemType::U8S8)
            || (k0.epilogue.codes && k0.elem != ElemType::U8S8)
        {
            return Err(KernelError::Shape(format!(
                "direct kernels multiply f32 (storing floats) or u8s8, not {}{}",
                k0.elem,
                if k0.epilogue.codes { " storing codes" } else { "" }
            )));
        }
        // u8s8 steps over words of four depths: K blocks of whole words.
        if k0.elem == ElemType::U8S8 && !self.kc.is_multiple_of(4) {
            return Err(KernelError::Shape(format!(
                "u8s8 direct kernels take K blocks of whole words, not {}",
                self.kc
            )));
        }
        k0.packers.check(k0.elem, None, k0.nr)?;
        Ok((k0.mr, k0.nr, k0.elem))
    }

    /// The kernel for the rows from `row` on, `left` of them: the main height while
    /// it fits, then the highest that fits.
    pub(crate) fn kernel_for(&self, left: usize) -> &DirectKernel {
        self.kernels.iter().map(|v| &v.kernel).find(|k| k.mr <= left).unwrap_or(&self.kernels[0].kernel)
    }
}

/// Where a thread's B panels for one K block come from.
enum BSource<'a> {
    /// In place: `b[k·ldb + j]`.
    InPlace(&'a [f32], usize),
    /// Packed f32 panels (a weight, or this thread's copy of a strided
    /// activation), the first panel being `first`.
    Panels(BlockPanels<'a>, usize),
    /// A quantized weight's panels, each dequantized as it is reached.
    Quantized(&'a crate::PackedB),
}

/// Rows `rows` × column panels `cols` of `C = A · B` (`C += A · B` with
/// `accumulate`) with direct kernels, on the calling thread: one thread's share
/// of a direct schedule. A's rows must be contiguous along K (checked by the
/// caller).
#[allow(clippy::too_many_arguments)]
pub(crate) fn direct_band(
    plan: &DirectPlan,
    a: &MatRef,
    b: &BOperand,
    cptr: CPtr,
    ldc: usize,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    ep: &EpilogueArgs,
    accumulate: bool,
    ws: &mut Workspace,
) {
    if rows.is_empty() || cols.is_empty() {
        return;
    }
    // u8s8 kernels read A's codes as words (`run_plan` checked that they can).
    let words;
    let a = match plan.kernels[0].kernel.elem {
        ElemType::U8S8 => {
            let Some(w) = code_words(a) else {
                debug_assert!(false, "u8s8 direct kernels over an A not in words");
                return;
            };
            words = w;
            &words
        }
        _ => a,
    };
    // Blocks of `mc` rows: each block's A stays in L2 across the column panels
    // and K blocks, and its C band across the K blocks. A convolution's blocks
    // are whole output rows (at least one), so that its edge pixels still go in
    // columns over several rows: without them a thread swept all its pixels once
    // per column panel and K block, from L3 once its share of the image outgrew
    // L2 (ResNet-50 at batch 8).
    let mc = match &a.taps {
        Some((t, _)) => {
            let w = t.out[1].max(1);
            (plan.mc / w).max(1) * w
        }
        None => plan.mc,
    };
    let mut block = rows.start;
    while block < rows.end {
        let band = block..(block + mc).min(rows.end);
        let first = block == rows.start;
        block = band.end;
        direct_block(plan, a, b, cptr, ldc, band, cols.clone(), ep, (accumulate, first), ws);
    }
}

/// [`direct_band`] over one block of rows.
#[allow(clippy::too_many_arguments)]
fn direct_block(
    plan: &DirectPlan,
    a: &MatRef,
    b: &BOperand,
    cptr: CPtr,
    ldc: usize,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    ep: &EpilogueArgs,
    (accumulate, first_band): (bool, bool),
    ws: &mut Workspace,
) {
    let main = &plan.kernels[0].kernel;
    let (nr, epilogue) = (main.nr, main.epilogue);
    let (k, n) = b.dims();
    // A's and the kernels' steps: depths, or u8s8's words of four (A is then
    // its words' view, [`code_words`]; B's panels are addressed in depths).
    let g = if main.elem == ElemType::U8S8 { 4 } else { 1 };
    let codes = epilogue.codes;
    let c_at = |row: usize, col: usize| cptr.at(codes, row * ldc + col);
    for pc in (0..k).step_by(plan.kc) {
        let kc = plan.kc.min(k - pc);
        let (pw, kw) = (pc / g, kc / g);
        let src = match b {
            BOperand::Packed(p) if p.codes.is_some() => BSource::Quantized(p),
            BOperand::Packed(p) => BSource::Panels(p.block(pc, kc), 0),
            BOperand::Plain(bm) if bm.cs == 1 || bm.cols == 1 => {
                BSource::InPlace(&bm.data[pc * bm.rs..], bm.rs)
            }
            BOperand::Plain(bm) => {
                let j0 = cols.start * nr;
                let width = (cols.end * nr).min(n) - j0;
                let key = KeptB {
                    data: bm.data.as_ptr() as usize,
                    rs: bm.rs,
                    cs: bm.cs,
                    k: (pc, kc),
                    cols: (j0, width),
                    nr,
                };
                // The caller's last call packed the same view (fused attention's
                // next block of queries against the same keys): its pack is here.
                if !(ws.keep_b && ws.b_kept == Some(key)) {
                    pack_b(bm, pc, kc, j0, width, nr, ElemType::F32, &mut ws.b, main.packers.bt);
                    ws.b_kept = ws.keep_b.then_some(key);
                }
                BSource::Panels(BlockPanels::packed(&ws.b, kc * nr, cols.len()), cols.start)
            }
        };
        let last = pc + kc == k && !epilogue.is_identity();
        let flags = if pc > 0 || accumulate { ACCUMULATE } else { 0 } | if last { APPLY_EPILOGUE } else { 0 };
        for jr in cols.clone() {
            let col = jr * nr;
            let ncols = nr.min(n - col);
            if let (BSource::Quantized(p), 1, None, 1) = (&src, rows.len(), a.taps, g) {
                let scratch = (&mut ws.dot_sums, &mut ws.dot_out);
                let one = plan.kernel_for(1);
                if code_dot_row(
                    p,
                    (pc, kc, jr),
                    (rows.start, col, ncols),
                    a,
                    (cptr, ldc),
                    flags,
                    ep,
                    one,
                    scratch,
                ) {
                    continue;
                }
            }
            let (bp, ldb) = match src {
                BSource::InPlace(d, ld) => (d[col..].as_ptr(), ld),
                // f32 words: the panel's bits are its values.
                BSource::Panels(d, first) => (d.at(jr - first).as_ptr().cast::<f32>(), nr),
                BSource::Quantized(p) => {
                    p.dequantize_panel((pc, kc, jr), &main.packers, &mut ws.deq);
                    (ws.deq.as_ptr().cast::<f32>(), nr)
                }
            };
            let bias = ep.bias.map_or(std::ptr::null(), |b| b[col..].as_ptr());
            let scale = ep.column_scale.map_or(std::ptr::null(), |s| s[col..].as_ptr());
            if let Some((t, _)) = a.taps {
                // A weight's next panel is asked into L2 by this one's tiles in the
                // thread's first band of rows, which reads each panel from memory
                // (the later bands find the thread's panels in L2): its first
                // tiles would wait for the panel's lines, a few tiles of compute
                // against a whole panel of weights.
                let ahead: &[u32] = match b {
                    BOperand::Packed(p) if p.codes.is_none() && first_band && jr + 1 < cols.end => {
                        p.panel(pc, kc, jr + 1).unwrap_or(&[])
                    }
                    _ => &[],
                };
                let ahead = crate::taps::Ahead::over(ahead, rows.len().div_ceil(main.mr));
                let panel = crate::taps::Panel { b: bp, ldb, c: cptr, ldc, codes, col, ncols, scale, bias };
                crate::taps::direct_taps(
                    plan,
                    &t,
                    a.data,
                    (pw, kw),
                    rows.clone(),
                    &panel,
                    ep,
                    accumulate,
                    ahead,
                );
                continue;
            }
            // The first column panel reads the block's rows from memory: each tile
            // asks for the next tile's rows ahead of its kernel, so that the kernel's
            // broadcasts, one per row and K step over up to 16 rows at once, find them
            // in cache (the hardware's stream prefetchers track fewer streams).
            let fetch = jr == cols.start;
            // A weight's next panel is asked into L2 while this one computes: with a
            // few rows each panel is read from memory once, and the hardware's
            // prefetcher stops at every page of it. Each main-height tile's kernel
            // asks a share of its lines over its K loop, at the rate it reads B (as
            // the packed kernels do); asked by the driver in a burst before each tile
            // instead, 16-32 rows ran 14-18% slower (`bench-matmul --cold`,
            // 3072×768). The lower tiles past the main ones, and a lone tile of 1-3
            // rows, run too short a K loop to spread a share, and the lines held
            // them up (BERT-base at one token: 4.8 -> 6.4 ms); a lone tile of 4-8
            // rows gains (8 tokens: 7.3 -> 6.2 ms). After the thread's last panel of
            // a K block comes its first panel of the next block (unasked, it was read
            // on demand: 64×768×3072, weights cold, ran 8-12% slower than warm).
            let tiles = (rows.len() / main.mr).max(1);
            let spread = rows.len() >= 4;
            let ahead: &[u32] = match b {
                // A quantized weight's next panel was asked for as this one was dequantized.
                BOperand::Packed(p) if p.codes.is_some() => None,
                BOperand::Packed(p) if spread && jr + 1 < cols.end => p.panel(pc, kc, jr + 1),
                BOperand::Packed(p) if spread && pc + kc < k => {
                    p.panel(pc + kc, plan.kc.min(k - pc - kc), cols.start)
                }
                _ => None,
            }
            .unwrap_or(&[]);
            // Each tile's share of those lines, asked by its kernel over its K loop.
            let lines = ahead.len().div_ceil(16);
            let per_tile = lines.div_ceil(tiles);
            let mut asked = 0;
            let mut row = rows.start;
            while row < rows.end {
                let kern = plan.kernel_for(rows.end - row);
                if fetch {
                    prefetch_rows(a, row + kern.mr..(row + 2 * kern.mr).min(rows.end), pw, kw);
                }
                let share =
                    if kern.mr == main.mr || rows.len() < main.mr { per_tile.min(lines - asked) } else { 0 };
                let next = ahead.get(asked * 16..).map_or(std::ptr::null(), |d| d.as_ptr().cast::<f32>());
                asked += share;
                let ap = a.data[row * a.rs + pw..].as_ptr();
                let (res, ldr) = match ep.residual {
                    Some(r) => (r.element_ptr(row, col), r.rs),
                    None => (std::ptr::null(), 0),
                };
                // SAFETY: the kernel reads A's rows row..row+MR (all < m: `kernel_for`
                // picks a height that fits) at depths pc..pc+kc (< k, unit stride,
                // checked; u8s8: words pw..pw+kw of the words' view, the same bytes),
                // B's rows pc..pc+kc at columns col..col+ncols (in place,
                // inside the checked view, or inside the packed panels), the column scales,
                // bias and residual at columns < ncols only (masked), and writes C's tile
                // (rows row..row+MR, columns col..col+ncols), which is inside C (checked
                // shapes; bytes for codes) and this thread's alone (disjoint entries,
                // rows or panels).
                unsafe {
                    (kern.func)(
                        kw as i64,
                        ap,
                        a.rs as i64,
                        bp,
                        ldb as i64,
                        c_at(row, col),
                        ldc as i64,
                        ncols as i64,
                        flags,
                        bias,
                        res,
                        ldr as i64,
                        1,
                        0,
                        0,
                        next,
                        share as i64,
                        scale,
                        ep.params_ptr(),
                    );
                }
                row += kern.mr;
            }
        }
    }
}

/// Zeros a kernel multiplies when it only applies its epilogue (the widest
/// direct tile's row, and one value of A).
static ZEROS: [f32; 128] = [0.0; 128];

/// One row of A times panel `jr` of a quantized weight's block at `pc`, from
/// the codes (no dequantized panel): the row's products into C's columns
/// `col..col + ncols` (`=` on the first K block unless accumulating, `+=`
/// after), then, with the last block, the epilogue applied in place by the
/// kernel multiplying zeros. False (nothing done) without the routine.
#[allow(clippy::too_many_arguments)]
fn code_dot_row(
    p: &crate::PackedB,
    (pc, kc, jr): (usize, usize, usize),
    (row, col, ncols): (usize, usize, usize),
    a: &MatRef,
    (cptr, ldc): (CPtr, usize),
    flags: i64,
    ep: &EpilogueArgs,
    main: &crate::DirectKernel,
    (sums, out): (&mut Vec<f32>, &mut Vec<f32>),
) -> bool {
    let nr = main.nr;
    // `main` writes as many rows of C as it is high: one.
    if nr > ZEROS.len() || main.mr != 1 {
        return false;
    }
    let Some(arow) = a.data.get(row * a.rs + pc..row * a.rs + pc + kc) else { return false };
    out.clear();
    out.resize(nr, 0.0);
    if !p.dot_panel((pc, kc, jr), &main.packers, arow, sums, out) {
        return false;
    }
    // SAFETY: row `row` and columns `col..col + ncols` are inside C (checked
    // shapes: `ncols` stops at N) and this thread's alone (disjoint rows or panels).
    unsafe {
        let c = cptr.get().add(row * ldc + col);
        for (j, v) in out[..ncols].iter().enumerate() {
            *c.add(j) = if flags & ACCUMULATE != 0 { *c.add(j) + v } else { *v };
        }
    }
    if flags & APPLY_EPILOGUE != 0 {
        let bias = ep.bias.map_or(std::ptr::null(), |b| b[col..].as_ptr());
        let scale = ep.column_scale.map_or(std::ptr::null(), |s| s[col..].as_ptr());
        let (res, ldr) = match ep.residual {
            Some(r) => (r.element_ptr(row, col), r.rs),
            None => (std::ptr::null(), 0),
        };
        // SAFETY: as a tile's call in `direct_block`: the kernel reads one value of
        // A and one row of B (`ZEROS`, at least `nr` wide), the scales, bias and residual at
        // columns < ncols only, and writes C's row `row` at columns `col..col +
        // ncols` (inside C, this thread's alone): the zero product added to C
        // (ACCUMULATE), then the epilogue.
        unsafe {
            (main.func)(
                1,
                ZEROS.as_ptr(),
                1,
                ZEROS.as_ptr(),
                nr as i64,
                cptr.get().add(row * ldc + col),
                ldc as i64,
                ncols as i64,
                ACCUMULATE | APPLY_EPILOGUE,
                bias,
                res,
                ldr as i64,
                1,
                0,
                0,
                std::ptr::null(),
                0,
                scale,
                ep.params_ptr(),
            );
        }
    }
    true
}

/// Ask for A's rows `rows` at depths `pc..pc + kc` to be brought into L1, one
/// cache line at a time.
fn prefetch_rows(a: &MatRef, rows: std::ops::Range<usize>, pc: usize, kc: usize) {
    for r in rows {
        let Some(run) = a.data.get(r * a.rs + pc..r * a.rs + pc + kc) else { return };
        for line in run.iter().step_by(16) {
            crate::prefetch::to_l1(line);
        }
    }
}

/// Whether direct kernels can read this convolution's taps where they lie
/// (see [`crate::ConvTaps::adjacent`]).
pub fn taps_in_place(a: &MatRef) -> bool {
    !a.is_codes() && adjacent_taps(a)
}

/// Whether `a` is a convolution's taps whose kernel rows are runs (codes or not).
pub(crate) fn adjacent_taps(a: &MatRef) -> bool {
    a.taps.is_some_and(|(t, transposed)| !transposed && t.adjacent())
}

/// Whether an f32 direct kernel can read this A where it lies (floats: codes
/// are packed, or read by u8s8 kernels: [`code_words_in_place`]).
pub fn a_in_place(a: &MatRef) -> bool {
    !a.is_codes() && row_major(a)
}

/// Whether a u8s8 direct kernel can read this A where it lies: 8-bit codes
/// whose 4-byte words each hold four depths of one row (the codes start on a
/// word, K is whole words; a row-major A's rows whole words apart, or a
/// convolution's adjacent taps over whole words of channels and pixels).
pub fn code_words_in_place(a: &MatRef) -> bool {
    let Some(codes) = a.codes else { return false };
    (codes.as_ptr() as usize).is_multiple_of(4)
        && whole_words(a.cols, a.rows, a.rs, a.taps.map(|(t, _)| t))
        && match a.taps {
            Some(_) => adjacent_taps(a),
            None => row_major(a),
        }
}

/// Whether the 8-bit codes of a `k`-deep A that start on a 4-byte word keep
/// four depths of one row in each word: K whole words, and its `rows` rows
/// whole words apart (`rs` bytes), or a convolution's channels and pixels.
pub fn whole_words(k: usize, rows: usize, rs: usize, taps: Option<crate::ConvTaps>) -> bool {
    k.is_multiple_of(4)
        && match taps {
            Some(t) => t.in_words().is_some(),
            None => rs.is_multiple_of(4) || rows == 1,
        }
}

/// `a`'s codes as the f32 words a u8s8 direct kernel reads (where
/// [`code_words_in_place`]): K, the row stride and the taps counted in words.
pub(crate) fn code_words<'a>(a: &MatRef<'a>) -> Option<MatRef<'a>> {
    let codes = a.codes.filter(|_| code_words_in_place(a))?;
    // SAFETY: `codes` starts on a 4-byte boundary (checked) and its first
    // `len / 4` words are initialized bytes, which any f32 bit pattern may
    // hold; the slice borrows `codes` for its lifetime. Every word a view
    // reads lies inside them: rows and taps end on whole words (checked).
    let words = unsafe { std::slice::from_raw_parts(codes.as_ptr().cast::<f32>(), codes.len() / 4) };
    let taps = a.taps.map(|(t, transposed)| (t.in_words().unwrap_or(t), transposed));
    Some(MatRef { data: words, codes: None, rows: a.rows, cols: a.cols / 4, rs: a.rs / 4, cs: 1, taps })
}

/// Whether `a` is a plain matrix with rows contiguous along K (codes or not).
pub(crate) fn row_major(a: &MatRef) -> bool {
    !a.is_taps() && crate::ALayout::of(a.cs, a.cols) == crate::ALayout::RowMajor
}

/// Whether a direct kernel can read this B where it lies (a pre-packed B is read
/// from its panels; a strided one is packed by each thread for its panels).
pub fn b_in_place(b: &BOperand) -> bool {
    match b {
        BOperand::Packed(_) => false,
        BOperand::Plain(m) => !m.is_taps() && crate::BLayout::of(m.cs, m.cols) == crate::BLayout::NMajor,
    }
}
