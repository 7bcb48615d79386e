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
}

/// An output pixel.
#[derive(Clone, Copy, Debug)]
struct Pixel {
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

/// The generated packing ABI over rows given by address: interleave `kc`
/// elements from each of `width` rows, row `i` starting at `rows[i]` (null:
/// a row of zeros), into `dst` as [`crate::PackFn`] does.
pub type RowsPackFn = unsafe extern "C" fn(rows: *const *const f32, kc: i64, dst: *mut u32);

/// A generated packing routine over rows given by address.
#[derive(Clone, Copy, Debug)]
pub struct RowsPacker {
    pub width: usize,
    pub elem: crate::ElemType,
    pub func: RowsPackFn,
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
    out: &mut Vec<u32>,
    gen: Option<RowsPacker>,
) {
    let panels = m.div_ceil(mr);
    let size = elem.words(kc) * mr;
    out.truncate(panels * size);
    out.resize(panels * size, 0);
    let g = elem.k_group();
    // A run of channels must start a word (a bf16 pair never spans two taps).
    let gen = gen.filter(|p| {
        p.width == mr
            && p.elem == elem
            && mr <= MAX_ROWS
            && t.channels.is_multiple_of(g)
            && p0.is_multiple_of(g)
    });
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
                        panel[w * mr + i] = elem.word(&vals[..depth]);
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
    for (pi, panel) in out.chunks_exact_mut(size).enumerate() {
        let rows = mr.min(m - pi * mr);
        for o in &mut origins[..rows] {
            *o = origin(px);
            px = px.next(t);
        }
        ptrs[rows..mr].fill(std::ptr::null());
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
