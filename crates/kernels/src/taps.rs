//! A convolution's taps read where they lie, as the A operand of its GEMM
//! (implicit GEMM, DESIGN.md §2): row `r` of A is an output pixel, depth `k` one
//! tap's channel, and no column matrix is ever written. The packing of A reads
//! the image instead: per panel and per tap, a pointer to each row's run of
//! channels, or none where the tap falls in the convolution's zero padding
//! (an indirection, as in XNNPACK's indirect convolution, computed per panel
//! rather than stored, so a new image size costs nothing to set up).

use crate::KernelError;

/// The geometry of a 2-D convolution over a channels-last image as the A of its
/// GEMM. Row `r = (b·oh + y)·ow + x` is output pixel `(b, y, x)`; depth
/// `k = (i·kw + j)·C + c` is channel `c` of tap `(i, j)`; element `(r, k)` is
/// the image's `(b, y·sh + i·dh − ph, x·sw + j·dw − pw, c)`, zero outside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConvTaps {
    pub batch: usize,
    pub height: usize,
    pub width: usize,
    pub channels: usize,
    /// Elements between images, image rows and pixels (channels are contiguous).
    pub strides: [usize; 3],
    /// The output's height and width.
    pub out: [usize; 2],
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub dilation: [usize; 2],
    /// Zero rows and columns before the image (past its end, the output's
    /// extent decides how many are read).
    pub pad: [usize; 2],
}

impl ConvTaps {
    /// The rows of A (output pixels) and its depth (taps × channels), when
    /// they fit a `usize`.
    pub fn dims(&self) -> Result<(usize, usize), KernelError> {
        let over = || KernelError::Shape(format!("the taps of {self:?} overflow"));
        let rows =
            self.batch.checked_mul(self.out[0]).and_then(|r| r.checked_mul(self.out[1])).ok_or_else(over)?;
        let depth = self.kernel[0]
            .checked_mul(self.kernel[1])
            .and_then(|t| t.checked_mul(self.channels))
            .ok_or_else(over)?;
        Ok((rows, depth))
    }

    /// Every pixel the taps read must be inside a buffer of `len` elements; the
    /// steps and kernel extents must be positive.
    pub fn check(&self, len: usize) -> Result<(), KernelError> {
        self.dims()?;
        if self.kernel.contains(&0) || self.stride.contains(&0) || self.dilation.contains(&0) {
            return Err(KernelError::Shape(format!(
                "taps {self:?} with a zero kernel extent, stride or dilation"
            )));
        }
        // The farthest coordinate a tap computes (in the padding or not) fits an isize.
        for d in 0..2 {
            let far = self.out[d]
                .saturating_sub(1)
                .checked_mul(self.stride[d])
                .and_then(|a| {
                    (self.kernel[d] - 1).checked_mul(self.dilation[d]).and_then(|b| a.checked_add(b))
                })
                .filter(|v| isize::try_from(*v).is_ok());
            if far.is_none() {
                return Err(KernelError::Shape(format!("the taps of {self:?} overflow")));
            }
        }
        if self.batch == 0 || self.height == 0 || self.width == 0 || self.channels == 0 {
            return Ok(());
        }
        let [sn, sy, sx] = self.strides;
        let last = (self.batch - 1)
            .checked_mul(sn)
            .and_then(|a| (self.height - 1).checked_mul(sy).and_then(|b| a.checked_add(b)))
            .and_then(|a| (self.width - 1).checked_mul(sx).and_then(|b| a.checked_add(b)))
            .and_then(|a| a.checked_add(self.channels - 1))
            .ok_or_else(|| KernelError::Shape(format!("the image of {self:?} overflows")))?;
        if last >= len {
            return Err(KernelError::Shape(format!(
                "the taps' image needs {} elements, the buffer has {len}",
                last + 1
            )));
        }
        Ok(())
    }

    /// Whether the taps along a kernel row are adjacent pixels (no dilation across
    /// the width, dense pixels), so that one output pixel's taps of one kernel row
    /// are one run of `kw · C` values, and the next pixel's run starts `sw · C`
    /// values further: rows of a matrix that direct kernels read in place.
    pub fn adjacent(&self) -> bool {
        self.dilation[1] == 1 && self.strides[2] == self.channels
    }

    /// The output coordinates along axis `d` (0: rows, 1: columns) whose taps all
    /// lie inside the image along it: `lo..hi`.
    pub(crate) fn interior_along(&self, d: usize) -> (usize, usize) {
        let (out, step, pad, extent) =
            (self.out[d], self.stride[d], self.pad[d], [self.height, self.width][d]);
        let span = (self.kernel[d] - 1) * self.dilation[d] + 1;
        let lo = pad.div_ceil(step).min(out);
        let hi = if extent + pad >= span { ((extent + pad - span) / step + 1).min(out) } else { 0 }.max(lo);
        (lo, hi)
    }

    /// How often the taps read each image value they touch: `kh·kw / (sh·sw)`,
    /// at least 1.
    pub fn reads(&self) -> usize {
        ((self.kernel[0] * self.kernel[1]) / (self.stride[0] * self.stride[1]).max(1)).max(1)
    }

    /// The layout the dispatcher sees for these taps as A.
    pub fn layout(&self) -> crate::ALayout {
        if self.adjacent() {
            let (x_lo, x_hi) = self.interior_along(1);
            crate::ALayout::Taps { width: self.out[1], interior: x_hi - x_lo, reads: self.reads() }
        } else {
            crate::ALayout::Strided
        }
    }

    /// The output pixel of row `r`.
    fn pixel(&self, r: usize) -> Pixel {
        let x = r % self.out[1];
        let rest = r / self.out[1];
        Pixel { b: rest / self.out[0], y: rest % self.out[0], x }
    }

    /// Where tap `(i, j)` of pixel `p` starts (its channel 0), or `None` in the padding.
    fn source(&self, p: Pixel, i: usize, j: usize) -> Option<usize> {
        let iy = (p.y * self.stride[0] + i * self.dilation[0]).checked_sub(self.pad[0])?;
        let ix = (p.x * self.stride[1] + j * self.dilation[1]).checked_sub(self.pad[1])?;
        (iy < self.height && ix < self.width)
            .then(|| p.b * self.strides[0] + iy * self.strides[1] + ix * self.strides[2])
    }

    /// Element `(r, k)` of A.
    pub(crate) fn at(&self, data: &[f32], r: usize, k: usize) -> f32 {
        tap_value(data, self, self.pixel(r), k)
    }

    /// Element `(r, k)` of A over an image of 8-bit codes.
    pub(crate) fn code_at(&self, codes: &[u8], r: usize, k: usize) -> f32 {
        let (tap, c) = (k / self.channels, k % self.channels);
        let p = self.pixel(r);
        self.source(p, tap / self.kernel[1], tap % self.kernel[1]).map_or(0.0, |s| f32::from(codes[s + c]))
    }

    /// Depths `p0..p0+kc` of row `r` as runs: `run(depths - p0, image index)`
    /// for each, the index of its first element, `None` in the padding.
    /// Adjacent taps of a kernel row that all lie inside the image are one run.
    pub(crate) fn runs(
        &self,
        r: usize,
        p0: usize,
        kc: usize,
        mut run: impl FnMut(std::ops::Range<usize>, Option<usize>),
    ) {
        let (c, kwidth, px) = (self.channels, self.kernel[1], self.pixel(r));
        let mut k = p0;
        while k < p0 + kc {
            let (tap, c0) = (k / c, k % c);
            let (i, j) = (tap / kwidth, tap % kwidth);
            let left = p0 + kc - k;
            let mut len = (c - c0).min(left);
            let at = self.source(px, i, j);
            // Through the last tap of this kernel row the run reaches, when that
            // one is inside the image too (so are all between).
            if at.is_some() && self.adjacent() && len < left {
                let wide = ((kwidth - j) * c - c0).min(left);
                if self.source(px, i, j + (c0 + wide - 1) / c).is_some() {
                    len = wide;
                }
            }
            run(k - p0..k - p0 + len, at.map(|s| s + c0));
            k += len;
        }
    }

    /// Depths `p0..p0+kc` of a pixel whose taps all lie inside the image, as
    /// runs: `(depths - p0, distance from the pixel's tap (0, 0))`, a kernel
    /// row's taps one run where they are adjacent. The same for every such pixel.
    pub(crate) fn interior_runs(
        &self,
        p0: usize,
        kc: usize,
    ) -> impl Iterator<Item = (std::ops::Range<usize>, usize)> + '_ {
        let (c, kwidth) = (self.channels, self.kernel[1]);
        let [_, sy, sx] = self.strides;
        let mut k = p0;
        std::iter::from_fn(move || {
            (k < p0 + kc).then(|| {
                let (tap, c0) = (k / c, k % c);
                let (i, j) = (tap / kwidth, tap % kwidth);
                let whole = if self.adjacent() { (kwidth - j) * c } else { c };
                let len = (whole - c0).min(p0 + kc - k);
                let run = (k - p0..k - p0 + len, i * self.dilation[0] * sy + j * self.dilation[1] * sx + c0);
                k += len;
                run
            })
        })
    }

    /// Rows `i0..i0+m`, depths `p0..p0+kc`, as runs: `run(row - i0, depths - p0,
    /// image index)` as [`ConvTaps::runs`] gives them, row after row. The runs
    /// of a pixel whose taps all lie inside the image are found once (they
    /// stand at the same distances from its tap `(0, 0)` for every such pixel),
    /// so most rows cost no division.
    pub(crate) fn rows_runs(
        &self,
        i0: usize,
        m: usize,
        p0: usize,
        kc: usize,
        mut run: impl FnMut(usize, std::ops::Range<usize>, Option<usize>),
    ) {
        let [sn, sy, sx] = self.strides;
        // The interior runs, on the stack (this runs as a call packs A): a
        // block of depths with more of them than fit goes pixel by pixel.
        let mut inner: [(std::ops::Range<usize>, usize); INTERIOR_RUNS] = std::array::from_fn(|_| (0..0, 0));
        let mut runs = self.interior_runs(p0, kc);
        let mut count = 0;
        for (slot, r) in inner.iter_mut().zip(&mut runs) {
            *slot = r;
            count += 1;
        }
        let ((ylo, yhi), (xlo, xhi)) = match runs.next().is_none() {
            true => (self.interior_along(0), self.interior_along(1)),
            false => ((0, 0), (0, 0)),
        };
        let mut px = self.pixel(i0);
        for r in 0..m {
            if (ylo..yhi).contains(&px.y) && (xlo..xhi).contains(&px.x) {
                // Inside along both axes: its tap (0, 0) is in the image.
                let origin = px.b * sn
                    + (px.y * self.stride[0] - self.pad[0]) * sy
                    + (px.x * self.stride[1] - self.pad[1]) * sx;
                for (dst, shift) in &inner[..count] {
                    run(r, dst.clone(), Some(origin + shift));
                }
            } else {
                self.runs(i0 + r, p0, kc, |dst, at| run(r, dst, at));
            }
            px = px.next(self);
        }
    }

    /// These taps counted in 4-byte words of an image of codes (channels and
    /// strides multiples of 4), when they are.
    pub fn in_words(&self) -> Option<ConvTaps> {
        let four = |v: usize| v.is_multiple_of(4);
        (four(self.channels) && self.strides.iter().all(|s| four(*s))).then(|| ConvTaps {
            channels: self.channels / 4,
            strides: self.strides.map(|s| s / 4),
            ..*self
        })
    }
}

/// The most runs of an interior pixel [`ConvTaps::rows_runs`] keeps (a 7×7
/// kernel over channels that are not adjacent in K has 49 runs in a block).
const INTERIOR_RUNS: usize = 64;

/// An output pixel.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pixel {
    b: usize,
    y: usize,
    x: usize,
}

impl Pixel {
    /// The next pixel in row order.
    fn next(self, t: &ConvTaps) -> Pixel {
        if self.x + 1 < t.out[1] {
            Pixel { x: self.x + 1, ..self }
        } else if self.y + 1 < t.out[0] {
            Pixel { y: self.y + 1, x: 0, ..self }
        } else {
            Pixel { b: self.b + 1, y: 0, x: 0 }
        }
    }
}

pub use plan::abi::RowsPackFn;

/// A generated packing routine over rows given by address.
#[derive(Clone, Copy, Debug)]
pub struct RowsPacker {
    pub width: usize,
    pub elem: crate::ElemType,
    pub func: RowsPackFn,
}

impl RowsPacker {
    /// Whether [`pack_taps`] packs depths from `p0` of taps `t` into `mr`-row
    /// panels of `elem` with this routine (else the portable loop): its width
    /// and type, and runs of channels that start a word (a bf16 pair never
    /// spans two taps).
    pub(crate) fn fits(&self, t: &ConvTaps, p0: usize, mr: usize, elem: crate::ElemType) -> bool {
        let g = elem.k_group();
        self.width == mr
            && self.elem == elem
            && mr <= MAX_ROWS
            && t.channels.is_multiple_of(g)
            && p0.is_multiple_of(g)
    }
}

/// The widest panel the indirection is built for (a register tile is at most 16 high).
const MAX_ROWS: usize = 32;

/// Pack rows `i0..i0+m`, depth `p0..p0+kc` of the taps of `data` into `MR`-row
/// micro-panels, as [`crate::pack`] packs a row-major A: one call of `gen` per
/// tap and panel, each row's pointer at its run of channels (null in the
/// padding and past `m`), or the portable loop.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pack_taps(
    data: &[f32],
    t: &ConvTaps,
    i0: usize,
    m: usize,
    p0: usize,
    kc: usize,
    mr: usize,
    elem: crate::ElemType,
    out: &mut crate::Lines<u32>,
    gen: Option<RowsPacker>,
) {
    let panels = m.div_ceil(mr);
    let size = elem.words(kc) * mr;
    out.resize(panels * size);
    let g = elem.k_group();
    let gen = gen.filter(|p| p.fits(t, p0, mr, elem));
    match gen {
        Some(gen) => pack_generated(data, t, i0, m, (p0, kc), (mr, size), g, out, gen),
        None => {
            let mut vals = [0.0f32; 4];
            for pi in 0..panels {
                let panel = &mut out[pi * size..(pi + 1) * size];
                let rows = mr.min(m - pi * mr);
                for i in 0..mr {
                    let px = (i < rows).then(|| t.pixel(i0 + pi * mr + i));
                    for w in 0..elem.words(kc) {
                        let depth = g.min(kc - w * g);
                        for (d, v) in vals[..depth].iter_mut().enumerate() {
                            *v = px.map_or(0.0, |px| tap_value(data, t, px, p0 + w * g + d));
                        }
                        panel[w * mr + i] = crate::elem::word(elem, &vals[..depth]);
                    }
                }
            }
        }
    }
}

/// Where a row's taps start: the image element of its pixel's tap `(0, 0)`
/// (channel 0) and that tap's coordinates, which may lie in the padding.
#[derive(Clone, Copy, Default)]
struct Origin {
    offset: isize,
    y: isize,
    x: isize,
}

/// [`pack_taps`] with the generated routine: per panel and run of taps, one
/// call over the rows' addresses.
#[allow(clippy::too_many_arguments)]
fn pack_generated(
    data: &[f32],
    t: &ConvTaps,
    i0: usize,
    m: usize,
    (p0, kc): (usize, usize),
    (mr, size): (usize, usize),
    g: usize,
    out: &mut [u32],
    gen: RowsPacker,
) {
    let (h, w) = (t.height as isize, t.width as isize);
    let [sn, sy, sx] = t.strides.map(|v| v as isize);
    let (dh, dw) = (t.dilation[0] as isize, t.dilation[1] as isize);
    // Taps of one kernel row are adjacent pixels when the dilation is 1 and pixels
    // are dense: one run of `kw · C` values (an RGB image's 3 channels alone would
    // be too short a run to vectorize).
    let adjacent = t.dilation[1] == 1 && t.strides[2] == t.channels;
    let origin = |p: Pixel| {
        let y = (p.y * t.stride[0]) as isize - t.pad[0] as isize;
        let x = (p.x * t.stride[1]) as isize - t.pad[1] as isize;
        Origin { offset: p.b as isize * sn + y * sy + x * sx, y, x }
    };
    let mut origins = [Origin::default(); MAX_ROWS];
    let mut ptrs = [std::ptr::null::<f32>(); MAX_ROWS];
    let mut px = t.pixel(i0);
    // The extent of a kernel's taps from its tap (0, 0), less one.
    let (span_y, span_x) = ((t.kernel[0] as isize - 1) * dh, (t.kernel[1] as isize - 1) * dw);
    for (pi, panel) in out.chunks_exact_mut(size).enumerate() {
        let rows = mr.min(m - pi * mr);
        for o in &mut origins[..rows] {
            *o = origin(px);
            px = px.next(t);
        }
        ptrs[rows..mr].fill(std::ptr::null());
        // A panel whose rows' taps all lie inside the image (every panel of an
        // image stored padded, as a quantized RGB stem's): each kernel row is
        // one run per row, addressed without the checks below.
        let inside = |o: &Origin| o.y >= 0 && o.y + span_y < h && o.x >= 0 && o.x + span_x < w;
        if adjacent && origins[..rows].iter().all(inside) {
            for (dst, shift) in t.interior_runs(p0, kc) {
                for (ptr, o) in ptrs.iter_mut().zip(&origins[..rows]) {
                    *ptr = data.as_ptr().wrapping_offset(o.offset + shift as isize);
                }
                let at = dst.start / g * mr;
                // SAFETY: as below, with every run inside the image: the row's taps
                // `j..kw` of a kernel row (their pixels checked inside above).
                unsafe { (gen.func)(ptrs.as_ptr(), dst.len() as i64, panel[at..].as_mut_ptr()) };
            }
            continue;
        }
        let mut k = p0;
        while k < p0 + kc {
            let (tap, c0) = (k / t.channels, k % t.channels);
            let (i, j) = (tap / t.kernel[1], tap % t.kernel[1]);
            let (dy, dx) = (i as isize * dh, j as isize * dw);
            // The taps `j..j + run` that every row reads alike: inside the image, or
            // in the padding.
            let mut run = if adjacent { t.kernel[1] - j } else { 1 };
            if run > 1 {
                for o in &origins[..rows] {
                    let (y, x) = (o.y + dy, o.x + dx);
                    let same = if y < 0 || y >= h || x >= w {
                        run as isize
                    } else if x < 0 {
                        -x
                    } else {
                        w - x
                    };
                    run = run.min(same.max(1) as usize);
                }
            }
            let len = (run * t.channels - c0).min(p0 + kc - k);
            let shift = dy * sy + dx * sx + c0 as isize;
            for (ptr, o) in ptrs.iter_mut().zip(&origins[..rows]) {
                let (y, x) = (o.y + dy, o.x + dx);
                let inside = y >= 0 && y < h && x >= 0 && x < w;
                *ptr =
                    if inside { data.as_ptr().wrapping_offset(o.offset + shift) } else { std::ptr::null() };
            }
            let at = (k - p0) / g * mr;
            // SAFETY: each non-null pointer starts a run of `len ≤ run·C − c0` values
            // inside `data`: channels `c0..` of an image pixel (`inside`) and the
            // channels of the `run − 1` pixels after it in its image row, inside the
            // image too (`run`), which `ConvTaps::check` bounded by `data` (every taps
            // view passed it); rows past `rows` are null (zeros). The routine writes
            // `words(len) · mr` words from `at`: the segment's words (`at` is a word
            // boundary: `k − p0` is a multiple of `g`), which end inside the panel
            // since `k + len ≤ p0 + kc`.
            unsafe { (gen.func)(ptrs.as_ptr(), len as i64, panel[at..].as_mut_ptr()) };
            k += len;
        }
    }
}

/// Depth `k` of pixel `p`'s row.
fn tap_value(data: &[f32], t: &ConvTaps, p: Pixel, k: usize) -> f32 {
    let (tap, c) = (k / t.channels, k % t.channels);
    t.source(p, tap / t.kernel[1], tap % t.kernel[1]).map_or(0.0, |s| data[s + c])
}

/// One column panel of a direct schedule's K block: B's rows of the block (from
/// its first depth, `ldb` apart) at the panel's columns, and where the panel's
/// tiles of C, the bias and the residual lie.
pub(crate) struct Panel {
    pub b: *const f32,
    pub ldb: usize,
    pub c: crate::gemm::CPtr,
    pub ldc: usize,
    /// C holds 8-bit codes (its rows `ldc` bytes apart), not floats.
    pub codes: bool,
    pub col: usize,
    pub ncols: usize,
    pub scale: *const f32,
    pub bias: *const f32,
}

/// Lines of the next B panel that [`direct_taps`]' tiles ask for while they
/// compute, `per_tile` a tile (its kernel spreads them over its K loop) until
/// all `lines` are asked.
pub(crate) struct Ahead {
    at: *const f32,
    lines: usize,
    per_tile: usize,
    asked: usize,
}

impl Ahead {
    /// The lines of `panel` (u32 words, 16 a line) over about `tiles` tiles.
    pub fn over(panel: &[u32], tiles: usize) -> Ahead {
        let lines = panel.len().div_ceil(16);
        Ahead { at: panel.as_ptr().cast(), lines, per_tile: lines.div_ceil(tiles.max(1)), asked: 0 }
    }

    /// The next tile's share: where its lines start, and how many.
    fn share(&mut self) -> (*const f32, usize) {
        let n = self.per_tile.min(self.lines - self.asked);
        if n == 0 {
            return (std::ptr::null(), 0);
        }
        let at = self.at.wrapping_add(self.asked * 16);
        self.asked += n;
        (at, n)
    }
}

impl Panel {
    /// Where C's row `row` meets the panel (in bytes for codes).
    fn c_at(&self, row: usize) -> *mut f32 {
        self.c.at(self.codes, row * self.ldc + self.col)
    }
}

/// The direct kernels over a convolution's adjacent taps (no packing, no column
/// matrix): for the output pixels `rows`, one column panel and the K block
/// `pc..pc + kc`. A tile is a run of pixels of one output row whose taps all lie
/// inside the image (read as rows `sw · C` apart, each kernel row one run of
/// `kw · C` values); the pixels at the image's left and right edges (some taps in
/// the padding) are tiles of one column over consecutive output rows whose
/// kernel rows all lie inside the image (rows `sh` image rows apart), else single
/// pixels; kernel rows in the vertical padding are skipped. Each tile's depth is
/// a few runs (one per kernel row), cut at the K block's ends: the first run
/// written sets the tile (adds to it with `accumulate`), the others add to it,
/// and the last applies the epilogue.
#[allow(clippy::too_many_arguments)]
pub(crate) fn direct_taps(
    plan: &crate::DirectPlan,
    t: &ConvTaps,
    data: &[f32],
    (pc, kc): (usize, usize),
    rows: std::ops::Range<usize>,
    panel: &Panel,
    ep: &crate::gemm::EpilogueArgs,
    accumulate: bool,
    mut ahead: Ahead,
) {
    let (hout, wout) = (t.out[0], t.out[1]);
    let (x_lo, x_hi) = t.interior_along(1);
    let (y_lo, y_hi) = t.interior_along(0);
    let Some(single) = plan.kernels.last().map(|v| &v.kernel) else { return };
    let mut tile = |kern: &crate::DirectKernel, r: usize, shape: TileShape| {
        direct_tile(t, data, (pc, kc), panel, ep, accumulate, kern, r, shape, ahead.share());
    };
    let mut r = rows.start;
    while r < rows.end {
        let px = t.pixel(r);
        // Whole output rows of one image from here, every kernel row inside the
        // image: their edge pixels go in columns, their interiors in runs.
        let band = if px.x == 0 && px.y >= y_lo && px.y < y_hi {
            ((rows.end - r) / wout).min(y_hi - px.y).min(hout - px.y)
        } else {
            0
        };
        if band > 1 {
            for x in (0..x_lo).chain(x_hi..wout) {
                let mut y = 0;
                while y < band {
                    let kern = plan.kernel_for(band - y);
                    tile(kern, r + y * wout + x, TileShape::Column);
                    y += kern.mr;
                }
            }
            for y in 0..band {
                let mut x = x_lo;
                while x < x_hi {
                    let kern = plan.kernel_for(x_hi - x);
                    tile(kern, r + y * wout + x, TileShape::Run);
                    x += kern.mr;
                }
            }
            r += band * wout;
            continue;
        }
        let left_in_row = (wout - px.x).min(rows.end - r);
        if px.x >= x_lo && px.x < x_hi {
            let kern = plan.kernel_for((x_hi - px.x).min(left_in_row));
            tile(kern, r, TileShape::Run);
            r += kern.mr;
        } else {
            tile(single, r, TileShape::Pixel);
            r += 1;
        }
    }
}

/// How a direct tile's rows lie among the output pixels.
#[derive(Clone, Copy, PartialEq)]
enum TileShape {
    /// Adjacent pixels of one output row, every tap inside the image's width.
    Run,
    /// One pixel (its taps inside the image only).
    Pixel,
    /// One column's pixels in consecutive output rows of one image, every kernel
    /// row inside the image's height (its taps inside the width only).
    Column,
}

/// One tile of [`direct_taps`]: `kern.mr` pixels from pixel row `r`, laid out as `shape`.
#[allow(clippy::too_many_arguments)]
fn direct_tile(
    t: &ConvTaps,
    data: &[f32],
    (pc, kc): (usize, usize),
    panel: &Panel,
    ep: &crate::gemm::EpilogueArgs,
    accumulate: bool,
    kern: &crate::DirectKernel,
    r: usize,
    shape: TileShape,
    (next, lines): (*const f32, usize),
) {
    let c = t.channels;
    let (kh, kw) = (t.kernel[0], t.kernel[1]);
    let (sw, pw, w) = (t.stride[1], t.pad[1], t.width);
    let run = kw * c;
    let px = t.pixel(r);
    // Between the tile's rows: in the image, and in C and the residual (pixels).
    let (lda, pixels) = match shape {
        TileShape::Column => (t.stride[0] * t.strides[1], t.out[1]),
        _ => (sw * t.strides[2], 1),
    };
    // The tile's runs: per kernel row inside the image, its taps inside it, as
    // (depths, where the first pixel's run starts in the image).
    let run_of = |i: usize| -> Option<(usize, usize, usize)> {
        let iy = (px.y * t.stride[0] + i * t.dilation[0]).checked_sub(t.pad[0])?;
        if iy >= t.height {
            return None;
        }
        let x0 = px.x * sw;
        let (j_lo, j_hi) = match shape {
            TileShape::Run => (0, kw),
            _ => (pw.saturating_sub(x0), kw.min((w + pw).saturating_sub(x0))),
        };
        (j_lo < j_hi).then(|| {
            let at = px.b * t.strides[0] + iy * t.strides[1] + (x0 + j_lo - pw) * t.strides[2];
            (i * run + j_lo * c, i * run + j_hi * c, at)
        })
    };
    let (res, ldr) = match ep.residual {
        Some(rm) => (rm.element_ptr(r, panel.col), rm.rs * pixels),
        None => (std::ptr::null(), 0),
    };
    let epilogue = !kern.epilogue.is_identity();
    let add = if accumulate { crate::ACCUMULATE } else { 0 };
    // A tile whose kernel rows take several calls (a K block cuts them) adds to C
    // after the first: a C that is not in cache (a large model's arena, evicted by
    // its weights) makes the second call wait for the first one's stores to reach
    // it, and the first call's stores wait for C's lines anyway. The next tile's C
    // lines are asked for now, while this tile computes.
    if pc == 0 && kh > 1 {
        prefetch_next_tile(t, panel, kern.mr, r, shape, pixels);
    }
    // Consecutive kernel rows are `a_run` apart in the image and `run` apart in K.
    let a_run = t.dilation[0] * t.strides[1];
    // The tile's share of the next panel's lines, asked by its first call.
    let asking = std::cell::Cell::new((next, lines));
    let call = |k0: usize, len: usize, runs: usize, a: *const f32, flags: i64| {
        let (next, lines) = asking.replace((std::ptr::null(), 0));
        // SAFETY: the kernel reads `runs` runs of `len` values from each of its MR
        // rows, `lda` apart, from `a` (run `q` from `a + q·a_run`): kernel rows' taps
        // of MR output pixels (adjacent ones of a run, or one column's in consecutive
        // output rows, whose kernel rows all lie inside the image) or of one pixel,
        // inside the image (the runs were cut to it, and `ConvTaps::check` bounded
        // the image by `data`); B's rows `k0 − pc + q·run..` (`len` of them) of the
        // block at the panel's columns (inside the block's panel or the in-place
        // view: the runs lie inside the K block); the next panel's lines only asked
        // for (a prefetch never faults); the bias, and the residual at the
        // tile's pixels, at columns below `ncols` (masked); and writes the tile of C
        // at those pixels' rows and the panel's columns, inside C (the pixels are
        // below the thread's end) and this thread's alone.
        unsafe {
            (kern.func)(
                len as i64,
                a,
                lda as i64,
                panel.b.add((k0 - pc) * panel.ldb),
                panel.ldb as i64,
                panel.c_at(r),
                (panel.ldc * pixels) as i64,
                panel.ncols as i64,
                flags,
                panel.bias,
                res,
                ldr as i64,
                runs as i64,
                a_run as i64,
                (run * panel.ldb) as i64,
                next,
                lines as i64,
                panel.scale,
                ep.params_ptr(),
            )
        }
    };
    // A run whose kernel rows all lie inside the image and the K block (a
    // convolution's interior, its taps in one block): one call of every row,
    // found without cutting each row to the image and the block.
    if shape == TileShape::Run && pc == 0 && kc == kh * run {
        let y0 = px.y * t.stride[0];
        if y0 >= t.pad[0] && y0 - t.pad[0] + (kh - 1) * t.dilation[0] < t.height && px.x * sw >= pw {
            let at = px.b * t.strides[0] + (y0 - t.pad[0]) * t.strides[1] + (px.x * sw - pw) * t.strides[2];
            call(0, run, kh, data[at..].as_ptr(), add | if epilogue { crate::APPLY_EPILOGUE } else { 0 });
            return;
        }
    }
    let first = (0..kh).find_map(run_of).map(|r| r.0);
    let end = (0..kh).rev().find_map(run_of).map(|r| r.1);
    let (Some(first), Some(end)) = (first, end) else {
        // Every tap in the padding: the tile is the epilogue of zero (of what it
        // holds, with `accumulate`), once.
        if pc == 0 {
            call(pc, 0, 1, data.as_ptr(), add | if epilogue { crate::APPLY_EPILOGUE } else { 0 });
        }
        return;
    };
    // The kernel rows inside the K block, as few calls as can be: whole rows that
    // follow each other in K and in the image are one call of several runs (the
    // stem's seven, in registers throughout); a row cut by the block's ends is a
    // call of its own.
    let flush = |g: Option<Group>| {
        if let Some(g) = g {
            let flags = if g.k0 > first { crate::ACCUMULATE } else { add }
                | if g.end(run) == end && epilogue { crate::APPLY_EPILOGUE } else { 0 };
            call(g.k0, g.len, g.runs, data[g.at..].as_ptr(), flags);
        }
    };
    let mut group: Option<Group> = None;
    for (k0, k1, at) in (0..kh).filter_map(run_of) {
        let (s, e) = (k0.max(pc), k1.min(pc + kc));
        if s >= e {
            continue;
        }
        let whole = s == k0 && e == k1;
        match &mut group {
            Some(g)
                if whole
                    && g.whole
                    && e - s == g.len
                    && k0 == g.k0 + g.runs * run
                    && at == g.at + g.runs * a_run =>
            {
                g.runs += 1;
            }
            _ => {
                flush(group.take());
                group = Some(Group { k0: s, len: e - s, at: at + (s - k0), runs: 1, whole });
            }
        }
    }
    flush(group);
}

/// Consecutive kernel rows of a tile read in one direct call: `runs` rows of `len`
/// taps, `run` apart in K from `k0` (where the first row's taps start), the first at
/// `at` in the image; `whole` when no K block end cuts them.
#[derive(Clone, Copy)]
struct Group {
    k0: usize,
    len: usize,
    at: usize,
    runs: usize,
    whole: bool,
}

impl Group {
    /// Where the last row's taps end in K.
    fn end(&self, run: usize) -> usize {
        self.k0 + (self.runs - 1) * run + self.len
    }
}

/// Ask for the C lines of the tile after the one at pixel row `r` (`mr` rows
/// `pixels` apart: the next run along the output row, or the next stretch of the
/// column) to be brought into cache.
fn prefetch_next_tile(t: &ConvTaps, panel: &Panel, mr: usize, r: usize, shape: TileShape, pixels: usize) {
    let total = t.batch * t.out[0] * t.out[1];
    let next = match shape {
        TileShape::Pixel => return,
        _ => r + mr * pixels,
    };
    for i in 0..mr {
        let row = next + i * pixels;
        if row >= total {
            break;
        }
        // C's own lines, only hinted.
        let (at, bytes) = (panel.c_at(row).cast::<u8>(), if panel.codes { 1 } else { 4 });
        for line in (0..panel.ncols * bytes).step_by(64) {
            crate::prefetch::to_l1(at.wrapping_add(line));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every row's runs as [`ConvTaps::runs`] gives them, pixel by pixel: the
    /// interior runs kept on the stack (a 3×3 kernel, adjacent channels or
    /// not) and a kernel with more of them than [`INTERIOR_RUNS`] (9×9 over
    /// channels that are not adjacent), at blocks of depths that start and
    /// end inside a tap.
    #[test]
    fn rows_runs_are_each_rows_runs() {
        for (kernel, channels, padded) in [(3, 8, false), (3, 5, true), (9, 3, true)] {
            let (h, w) = (11, 13);
            let pixel = if padded { channels + 1 } else { channels };
            let t = ConvTaps {
                batch: 2,
                height: h,
                width: w,
                channels,
                strides: [h * w * pixel, w * pixel, pixel],
                out: [h, w],
                kernel: [kernel, kernel],
                stride: [1, 1],
                dilation: [1, 1],
                pad: [kernel / 2, kernel / 2],
            };
            let depth = kernel * kernel * channels;
            for (p0, kc) in [(0, depth), (channels / 2 + 1, depth - channels), (1, 7)] {
                let (i0, m) = (5, 2 * h * w - 9);
                let mut got = Vec::new();
                t.rows_runs(i0, m, p0, kc, |r, dst, at| got.push((r, dst, at)));
                let mut want = Vec::new();
                for r in 0..m {
                    t.runs(i0 + r, p0, kc, |dst, at| want.push((r, dst, at)));
                }
                assert_eq!(got, want, "{kernel}x{kernel} over {channels} channels, depths {p0}+{kc}");
            }
        }
    }
}
