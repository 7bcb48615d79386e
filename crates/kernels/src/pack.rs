//! Packing operands into micro-panels, with DietCode's local padding: only the
//! rows or columns missing from a panel are zero-filled, never a padded copy of
//! the tensor.
//!
//! Two packs transpose: a row-major A into `MR`-row panels (`panel[k·MR + i]`),
//! and a B stored transposed (attention's Kᵀ, a `Gemm` with `transB`) into
//! `NR`-column panels. Both read rows that are contiguous along K and interleave
//! them, so one routine of a given width does either; `codegen` generates it
//! with vector loads and in-register transposes ([`Packer`]), and the scalar
//! loops here are the portable path (kernels written in Rust, odd strides).
//!
//! Panels are words ([`ElemType`]): packing converts the f32 operands to the
//! family's element type, `k_group` depths to a word, and zero-fills the depths
//! past `kc` in a panel's last word. Panels are stored as 32-bit elements; a B
//! panel of i16s8 holds two of its 16-bit words in each.

use crate::{ElemType, Lines, MatRef};

pub use plan::abi::{CodeDotFn, DequantFn, PackFn};

/// A generated packing routine, the width of the panels it writes and the
/// element type it converts to.
#[derive(Clone, Copy, Debug)]
pub struct Packer {
    pub width: usize,
    pub elem: ElemType,
    pub func: PackFn,
}

/// A generated dequantizing routine ([`DequantFn`]): the width of the rows
/// it writes and the bits of the codes it reads.
#[derive(Clone, Copy, Debug)]
pub struct Dequantizer {
    pub width: usize,
    pub bits: u32,
    pub func: DequantFn,
}

/// A generated routine multiplying a row of A by codes ([`CodeDotFn`]): the
/// width of the rows and the bits of the codes it reads.
#[derive(Clone, Copy, Debug)]
pub struct CodeDot {
    pub width: usize,
    pub bits: u32,
    pub func: CodeDotFn,
}

/// The generated packs a kernel's driver uses, when it has them: `a` (width
/// `MR`) for a row-major A, `bt` (width `NR`) for a B stored transposed. Direct
/// kernels read A in place and use `bt` only.
#[derive(Clone, Copy, Debug, Default)]
pub struct Packers {
    pub a: Option<Packer>,
    pub bt: Option<Packer>,
    /// A's routine over rows given by address (a convolution's taps).
    pub a_rows: Option<crate::taps::RowsPacker>,
    /// The dequantizers of 4- and 8-bit weight codes (width `NR`, f32
    /// kernels): without them a quantized weight's panels are dequantized
    /// by portable loops.
    pub dequant: [Option<Dequantizer>; 2],
    /// Their products with one row of A (4 and 8 bits): a product of one row
    /// multiplies the codes directly, no dequantized panel.
    pub dots: [Option<CodeDot>; 2],
    /// A's routines over 32-bit words as they lie (f32 panels, `MR` wide), by
    /// rows and by address: the u8s8 kernels' A words from 8-bit codes in
    /// memory (four consecutive depths' bytes, one word).
    pub a_words: Option<Packer>,
    pub a_rows_words: Option<crate::taps::RowsPacker>,
}

impl Packers {
    /// The dequantizer of `bits`-bit codes `width` wide, if generated.
    pub fn dequantizer(&self, width: usize, bits: u32) -> Option<Dequantizer> {
        self.dequant.iter().flatten().copied().find(|d| d.width == width && d.bits == bits)
    }

    /// The product of a row with `bits`-bit codes `width` wide, if generated.
    pub fn code_dot(&self, width: usize, bits: u32) -> Option<CodeDot> {
        self.dots.iter().flatten().copied().find(|d| d.width == width && d.bits == bits)
    }
}

impl Packers {
    /// Each routine the driver will call must write panels of the width the
    /// kernel reads (`mr`: none for a kernel that packs no A).
    pub(crate) fn check(
        &self,
        elem: ElemType,
        mr: Option<usize>,
        nr: usize,
    ) -> Result<(), crate::KernelError> {
        let of = |p: Option<Packer>| p.map(|p| (p.width, p.elem));
        let rows = self.a_rows.map(|p| (p.width, p.elem));
        for (what, p, w) in
            [("A", of(self.a), mr), ("transposed B", of(self.bt), Some(nr)), ("taps", rows, mr)]
        {
            if let (Some((width, pelem)), Some(w)) = (p, w) {
                if pelem != elem {
                    return Err(crate::KernelError::Shape(format!(
                        "the {what} packer writes {pelem} panels, the kernel reads {elem}"
                    )));
                }
                if width != w {
                    return Err(crate::KernelError::Shape(format!(
                        "the {what} packer writes panels {width} wide, the kernel reads {w}"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// Interleave `rows` source rows (`kc` deep from `first`, stride `ld`) into one
/// `width`-wide panel of `elem` words, with `gen` when given (it writes the whole
/// panel); otherwise the rows past `rows` are left as they are.
#[allow(clippy::too_many_arguments)]
fn interleave(
    data: &[f32],
    first: usize,
    ld: usize,
    rows: usize,
    kc: usize,
    width: usize,
    elem: ElemType,
    panel: &mut [u32],
    gen: Option<Packer>,
) {
    debug_assert!(rows <= width && panel.len() == elem.words(kc) * width);
    debug_assert!(rows == 0 || first + (rows - 1) * ld + kc <= data.len());
    match gen {
        Some(p) if p.width == width && p.elem == elem && rows > 0 => {
            // SAFETY: the routine reads `kc` elements from each of `rows` rows starting
            // at `first + i·ld`, all inside `data` (the caller's view was checked against
            // its buffer: the asserts above restate it), and writes exactly
            // `words(kc) · width` words, the whole of `panel`.
            unsafe {
                (p.func)(data[first..].as_ptr(), ld as i64, rows as i64, kc as i64, panel.as_mut_ptr());
            }
        }
        _ => {
            let g = elem.k_group();
            for i in 0..rows {
                let start = first + i * ld;
                for (w, vals) in data[start..start + kc].chunks(g).enumerate() {
                    panel[w * width + i] = crate::elem::word(elem, vals);
                }
            }
        }
    }
}

/// Which operand a panel is of: B's words may differ from A's
/// ([`ElemType::b_word_bytes`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    A,
    B,
}

/// The word of depths `w·g ..` of line `i` (a row of A, a column of B) for the
/// lines `0..count` of a panel, from `at(i, k)`: the portable loop for operands
/// of any strides.
fn gather(
    panel: &mut [u32],
    (width, count, kc): (usize, usize, usize),
    elem: ElemType,
    side: Side,
    at: impl Fn(usize, usize) -> f32,
) {
    let g = elem.k_group();
    let mut vals = [0.0f32; 4];
    for w in 0..elem.words(kc) {
        let depth = g.min(kc - w * g);
        for i in 0..count {
            for (r, v) in vals[..depth].iter_mut().enumerate() {
                *v = at(i, w * g + r);
            }
            match side {
                Side::A => panel[w * width + i] = crate::elem::word(elem, &vals[..depth]),
                Side::B => crate::elem::put_b_word(elem, panel, w * width + i, &vals[..depth]),
            }
        }
    }
}

/// Pack rows `i0..i0+m` and depth `p0..p0+kc` of A into `MR`-row micro-panels of
/// `elem` words, `out[panel][w·MR + i]`; rows past `m` are zero (local padding). A
/// row-major A goes through the generated routines of `packers` when given.
#[allow(clippy::too_many_arguments)]
pub fn pack_a(
    a: &MatRef,
    i0: usize,
    m: usize,
    p0: usize,
    kc: usize,
    mr: usize,
    elem: ElemType,
    out: &mut Lines<u32>,
    packers: &Packers,
) {
    let (gen, gen_rows) = (packers.a, packers.a_rows);
    if let Some(codes) = a.codes {
        return pack_codes(a, codes, (i0, m, p0, kc), mr, elem, out, packers);
    }
    if let Some((t, false)) = a.taps {
        return crate::taps::pack_taps(a.data, &t, i0, m, p0, kc, mr, elem, out, gen_rows);
    }
    let panels = m.div_ceil(mr);
    let size = elem.words(kc) * mr;
    out.resize(panels * size);
    let generated = a.cs == 1 && gen.is_some_and(|p| p.width == mr && p.elem == elem);
    for pi in 0..panels {
        let panel = &mut out[pi * size..(pi + 1) * size];
        let rows = mr.min(m - pi * mr);
        let r0 = i0 + pi * mr;
        if rows < mr && !generated {
            panel.fill(0);
        }
        if a.cs == 1 {
            // Row-major A: each row is contiguous along k.
            interleave(a.data, r0 * a.rs + p0, a.rs, rows, kc, mr, elem, panel, gen);
        } else if a.rs == 1 && elem == ElemType::F32 {
            // Column-major (transposed) A: each k is a contiguous run of rows.
            for k in 0..kc {
                let start = (p0 + k) * a.cs + r0;
                for (d, v) in panel[k * mr..k * mr + rows].iter_mut().zip(&a.data[start..start + rows]) {
                    *d = v.to_bits();
                }
            }
        } else {
            gather(panel, (mr, rows, kc), elem, Side::A, |i, k| a.at(r0 + i, p0 + k));
        }
    }
}

/// `panels` (A's panels of `kw` words, a word of each of `mr` rows at a
/// time: `[kw][mr]`) laid out row by row into `out` (`[mr][kw]`, each row's
/// words contiguous), as AMX tiles load A.
pub fn panels_by_rows(panels: &[u32], kw: usize, mr: usize, out: &mut Lines<u32>) {
    out.resize(panels.len());
    let size = kw * mr;
    if size == 0 {
        return;
    }
    for (src, dst) in panels.chunks_exact(size).zip(out.chunks_exact_mut(size)) {
        for (k, words) in src.chunks_exact(mr).enumerate() {
            for (i, &w) in words.iter().enumerate() {
                dst[i * kw + k] = w;
            }
        }
    }
}

/// [`pack_a`] for AMX kernels, which load A's `mr`-row panels row by row
/// (as [`panels_by_rows`] lays out [`pack_a`]'s panels): rows `i0..i0+m`,
/// depths `p0..p0+kc` of a row-major A or a convolution's taps, zeros in the
/// padding, past `kc` in a row's last word and in the rows past `m`. Codes are
/// copied in runs; f32 values go through `packers`' routines one row wide
/// where it has them (as [`pack_a`] converts them: u8s8's low byte, bf16
/// rounded), else through runs converted here. False, writing nothing, for
/// another A (transposed, strided) or element type.
pub fn pack_a_rows(
    a: &MatRef,
    (i0, m, p0, kc): (usize, usize, usize, usize),
    mr: usize,
    elem: ElemType,
    out: &mut Lines<u32>,
    packers: &Packers,
) -> bool {
    let taps = match a.taps {
        Some((t, false)) => Some(t),
        None if a.cs == 1 => None,
        _ => return false,
    };
    if mr == 0
        || !matches!(elem, ElemType::U8S8 | ElemType::Bf16)
        || (a.codes.is_some() && elem != ElemType::U8S8)
    {
        return false;
    }
    let kw = elem.words(kc);
    let len = m.div_ceil(mr) * mr * kw;
    let generated = a.codes.is_none()
        && match taps {
            Some(t) => packers.a_rows.is_some_and(|p| p.fits(&t, p0, 1, elem)),
            None => packers.a.is_some_and(|p| (p.width, p.elem) == (1, elem)),
        };
    if generated {
        // Panels one row high are rows; the rows past `m` are zeros.
        pack_a(a, i0, m, p0, kc, 1, elem, out, packers);
        out.resize(len);
        return true;
    }
    // `rows_of` writes every element (the rows past `m`, and past `kc` in a
    // row, as zeros).
    out.resize_to_overwrite(len);
    // Element `k` of a row is at `k` of the row's `kw` words viewed as `T`s:
    // the first depth of a word in its low bits, as packed words hold them on
    // this little-endian target.
    let range = (i0, m, p0, kc);
    match (elem, a.codes) {
        (ElemType::U8S8, Some(codes)) => {
            rows_of(codes, taps, a.rs, range, kw * 4, bytemuck::cast_slice_mut(&mut out[..]), copy_codes)
        }
        (ElemType::U8S8, None) => {
            let low_byte =
                |s: &[f32], d: &mut [u8]| d.iter_mut().zip(s).for_each(|(d, v)| *d = *v as i32 as u8);
            rows_of(a.data, taps, a.rs, range, kw * 4, bytemuck::cast_slice_mut(&mut out[..]), low_byte)
        }
        _ => {
            let bf16 =
                |s: &[f32], d: &mut [u16]| d.iter_mut().zip(s).for_each(|(d, v)| *d = elem.half_bits(*v));
            rows_of(a.data, taps, a.rs, range, kw * 2, bytemuck::cast_slice_mut(&mut out[..]), bf16)
        }
    }
    true
}

/// The rows of [`pack_a_rows`], `row_len` elements apart in `out` (whose
/// length is a whole number of them): `copy` converts each run of source
/// elements into its place.
fn rows_of<S: Copy, T: Copy + Default>(
    src: &[S],
    taps: Option<crate::taps::ConvTaps>,
    rs: usize,
    (i0, m, p0, kc): (usize, usize, usize, usize),
    row_len: usize,
    out: &mut [T],
    copy: impl Fn(&[S], &mut [T]),
) {
    let (filled, rest) = out.split_at_mut(m * row_len);
    rest.fill(T::default());
    for row in filled.chunks_exact_mut(row_len) {
        row[kc..].fill(T::default());
    }
    match &taps {
        Some(t) => t.rows_runs(i0, m, p0, kc, |r, dst, at| {
            let row = &mut filled[r * row_len..r * row_len + kc];
            match at {
                Some(s) => copy(&src[s..s + dst.len()], &mut row[dst]),
                None => row[dst].fill(T::default()),
            }
        }),
        None => {
            for (r, row) in filled.chunks_exact_mut(row_len).enumerate() {
                let start = (i0 + r) * rs + p0;
                copy(&src[start..start + kc], &mut row[..kc]);
            }
        }
    }
}

/// `d = s` for the short runs of codes a convolution's rows are made of: in
/// 64-, 16-, 8- and 4-byte pieces (the last overlapping the one before), where
/// a `memcpy` call would cost more than the copy. A 3×3 kernel row of 64
/// channels or more is a run of 192 bytes or more, copied with a bounds check
/// and a branch a line, not four (BENCHMARKS.md, session 58).
fn copy_codes(s: &[u8], d: &mut [u8]) {
    fn pieces<const W: usize>(s: &[u8], d: &mut [u8]) {
        let n = d.len();
        let mut i = 0;
        while i + W < n {
            d[i..i + W].copy_from_slice(&s[i..i + W]);
            i += W;
        }
        d[n - W..].copy_from_slice(&s[n - W..n]);
    }
    match d.len() {
        n if n >= 64 => pieces::<64>(s, d),
        n if n >= 16 => pieces::<16>(s, d),
        n if n >= 8 => pieces::<8>(s, d),
        n if n >= 4 => pieces::<4>(s, d),
        _ => d.copy_from_slice(s),
    }
}

/// [`pack_a`] of a view of 8-bit codes. For the u8s8 kernels, whose A words
/// are four consecutive depths' bytes, a row-major A (or a convolution's taps
/// over whole words of channels) is copied a word at a time as it lies; any
/// other view, or type, goes element by element.
fn pack_codes(
    a: &MatRef,
    codes: &[u8],
    (i0, m, p0, kc): (usize, usize, usize, usize),
    mr: usize,
    elem: ElemType,
    out: &mut Lines<u32>,
    packers: &Packers,
) {
    let panels = m.div_ceil(mr);
    let size = elem.words(kc) * mr;
    out.resize(panels * size);
    let words = elem == ElemType::U8S8 && p0.is_multiple_of(4) && kc.is_multiple_of(4);
    match a.taps {
        Some((t, false))
            if words && (codes.as_ptr() as usize).is_multiple_of(4) && t.in_words().is_some() =>
        {
            // The image's 4-byte words as the f32 lanes they are packed as: its
            // taps over words (a quarter of the channels and strides) packed as
            // an f32 A's, bits copied as they lie (runs of adjacent taps merged).
            let wt = t.in_words().unwrap_or(t);
            // SAFETY: `codes` starts 4-byte aligned (checked) and its first
            // `len / 4` words are initialized bytes, which any f32 bit pattern
            // may hold; the slice borrows `codes` for its lifetime.
            let words = unsafe { std::slice::from_raw_parts(codes.as_ptr().cast::<f32>(), codes.len() / 4) };
            let gen = packers.a_rows_words.filter(|p| p.width == mr && p.elem == ElemType::F32);
            crate::taps::pack_taps(words, &wt, i0, m, p0 / 4, kc / 4, mr, ElemType::F32, out, gen);
        }
        None if words && a.cs == 1 && mr <= MAX_CODE_ROWS => {
            let gen = packers.a_words.filter(|p| p.width == mr && p.elem == ElemType::F32);
            let aligned = a.rs.is_multiple_of(4) && (codes.as_ptr() as usize).is_multiple_of(4);
            let mut rows_at = [std::ptr::null::<u8>(); MAX_CODE_ROWS];
            for pi in 0..panels {
                let rows = mr.min(m - pi * mr);
                let r0 = i0 + pi * mr;
                let panel = &mut out[pi * size..(pi + 1) * size];
                match gen {
                    Some(p) if aligned && rows > 0 => {
                        let start = r0 * a.rs + p0;
                        let last = (r0 + rows - 1) * a.rs + p0 + kc;
                        assert!(last <= codes.len() && panel.len() == kc / 4 * mr);
                        // SAFETY: the routine reads `kc / 4` words from each of `rows`
                        // rows starting at `start + i·rs` bytes, all inside `codes`
                        // (asserted), 4-byte aligned (the buffer, `rs` and `p0` are),
                        // and writes exactly `kc / 4 · mr` words, the whole of `panel`.
                        unsafe {
                            (p.func)(
                                codes.as_ptr().add(start).cast::<f32>(),
                                (a.rs / 4) as i64,
                                rows as i64,
                                (kc / 4) as i64,
                                panel.as_mut_ptr(),
                            );
                        }
                    }
                    _ => {
                        for (i, at) in rows_at[..rows].iter_mut().enumerate() {
                            let start = (r0 + i) * a.rs + p0;
                            *at = codes[start..start + kc].as_ptr();
                        }
                        copy_words(&rows_at[..rows], kc / 4, mr, panel);
                    }
                }
            }
        }
        _ => {
            for pi in 0..panels {
                let panel = &mut out[pi * size..(pi + 1) * size];
                let rows = mr.min(m - pi * mr);
                if rows < mr {
                    panel.fill(0);
                }
                let r0 = i0 + pi * mr;
                gather(panel, (mr, rows, kc), elem, Side::A, |i, k| a.at(r0 + i, p0 + k));
            }
        }
    }
}

/// The most rows of a panel of codes copied a word at a time (a register
/// tile is at most 16 high).
pub(crate) const MAX_CODE_ROWS: usize = 32;

/// `panel[w·mr + i]` = word `w` of row `i` (its bytes `4w..4w + 4` from
/// `rows[i]`, null: zeros), for `words` words; rows past `rows.len()` are zero.
pub(crate) fn copy_words(rows: &[*const u8], words: usize, mr: usize, panel: &mut [u32]) {
    assert!(rows.len() <= mr && panel.len() >= words * mr);
    for w in 0..words {
        let out = &mut panel[w * mr..(w + 1) * mr];
        for (i, o) in out.iter_mut().enumerate() {
            *o = match rows.get(i) {
                // SAFETY: every non-null row pointer starts `4·words` readable bytes
                // (the callers take it from a slice of that length, or a checked
                // taps run), and `4w + 4 ≤ 4·words`; the read is unaligned.
                Some(r) if !r.is_null() => unsafe { r.add(4 * w).cast::<u32>().read_unaligned() },
                _ => 0,
            };
        }
    }
}

/// Pack depth `p0..p0+kc` and columns `j0..j0+n` of B into `NR`-column
/// micro-panels of `elem`'s B words, `out[panel][w·NR + j]` (each panel
/// [`ElemType::b_panel_len`] 32-bit elements); columns past `n` are zero. A B
/// stored transposed goes through `gen` when given (B words of 32 bits).
#[allow(clippy::too_many_arguments)]
pub fn pack_b(
    b: &MatRef,
    p0: usize,
    kc: usize,
    j0: usize,
    n: usize,
    nr: usize,
    elem: ElemType,
    out: &mut Lines<u32>,
    gen: Option<Packer>,
) {
    let panels = n.div_ceil(nr);
    let size = elem.b_panel_len(kc, nr);
    out.resize(panels * size);
    let whole_words = elem.b_word_bytes() == 4;
    let generated =
        whole_words && b.cs != 1 && b.rs == 1 && gen.is_some_and(|p| p.width == nr && p.elem == elem);
    for pj in 0..panels {
        let panel = &mut out[pj * size..(pj + 1) * size];
        let cols = nr.min(n - pj * nr);
        let c0 = j0 + pj * nr;
        // Half words are merged into what is there (and an odd count leaves the
        // panel's last half): all of it starts at zero.
        if (cols < nr && !generated) || !whole_words {
            panel.fill(0);
        }
        if b.cs == 1 && elem == ElemType::F32 {
            // Row-major B: each k row of the panel is a contiguous run.
            for k in 0..kc {
                let start = (p0 + k) * b.rs + c0;
                for (d, v) in panel[k * nr..k * nr + cols].iter_mut().zip(&b.data[start..start + cols]) {
                    *d = v.to_bits();
                }
            }
        } else if b.cs == 1 {
            // Row-major B in words of several depths: pair up consecutive rows (row
            // offsets hoisted out of the column loop: 10% of a bf16 P·V at T = 384
            // over `gather`'s per-element strides).
            let g = elem.k_group();
            let mut vals = [0.0f32; 4];
            for w in 0..elem.words(kc) {
                let depth = g.min(kc - w * g);
                let rows: [usize; 4] = std::array::from_fn(|r| (p0 + w * g + r.min(depth - 1)) * b.rs + c0);
                for j in 0..cols {
                    for (r, v) in vals[..depth].iter_mut().enumerate() {
                        *v = b.data[rows[r] + j];
                    }
                    crate::elem::put_b_word(elem, panel, w * nr + j, &vals[..depth]);
                }
            }
        } else if b.rs == 1 && whole_words {
            // Transposed B (attention's Kᵀ): each column is contiguous along k.
            interleave(b.data, c0 * b.cs + p0, b.cs, cols, kc, nr, elem, panel, gen);
        } else {
            gather(panel, (nr, cols, kc), elem, Side::B, |j, k| b.at(p0 + k, c0 + j));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `pack_a_rows` against `pack_a` then `panels_by_rows`, into a buffer
    /// that held other values.
    fn rows_match(a: &MatRef, (i0, m, p0, kc): (usize, usize, usize, usize), mr: usize, elem: ElemType) {
        let (mut packed, mut by_rows, mut direct) = (Lines::default(), Lines::default(), Lines::default());
        pack_a(a, i0, m, p0, kc, mr, elem, &mut packed, &Packers::default());
        panels_by_rows(&packed, elem.words(kc), mr, &mut by_rows);
        direct.resize(by_rows.len() + 7);
        direct.iter_mut().for_each(|w| *w = 0xdead_beef);
        assert!(pack_a_rows(a, (i0, m, p0, kc), mr, elem, &mut direct, &Packers::default()));
        assert_eq!(&by_rows[..], &direct[..], "{elem}: rows {i0}+{m}, depths {p0}+{kc}, MR {mr}");
    }

    #[test]
    fn rows_of_a_row_major_a_lay_out_what_packing_then_by_rows_does() {
        for (m, kc, mr, p0) in
            [(1, 1, 16, 0), (17, 67, 16, 4), (33, 64, 32, 0), (5, 130, 16, 8), (3, 7, 16, 3)]
        {
            let (rows, cols) = (m + 3, kc + p0 + 5);
            let codes: Vec<u8> = (0..rows * cols).map(|i| (i * 37 % 251) as u8).collect();
            let a = MatRef::of_codes(&codes, rows, cols, cols, 1).unwrap();
            rows_match(&a, (2, m, p0, kc), mr, ElemType::U8S8);
            let mut direct = Lines::default();
            assert!(pack_a_rows(&a, (2, m, p0, kc), mr, ElemType::U8S8, &mut direct, &Packers::default()));
            assert_eq!(direct[0] & 0xff, u32::from(codes[2 * cols + p0]), "depth 0 in the low byte");
            let values: Vec<f32> = codes.iter().map(|&c| f32::from(c)).collect();
            let a = MatRef::row_major(&values, rows, cols).unwrap();
            rows_match(&a, (2, m, p0, kc), mr, ElemType::U8S8);
            let values: Vec<f32> = (0..rows * cols).map(|i| (i as f32 * 0.37).sin() * 3.1).collect();
            let a = MatRef::row_major(&values, rows, cols).unwrap();
            rows_match(&a, (2, m, p0, kc), mr, ElemType::Bf16);
            assert!(
                !pack_a_rows(&a, (2, m, p0, kc), mr, ElemType::F32, &mut direct, &Packers::default()),
                "no f32 rows"
            );
        }
        let f = [0.0f32; 4];
        let a = MatRef::new(&f, 2, 2, 1, 2).unwrap();
        assert!(
            !pack_a_rows(&a, (0, 2, 0, 2), 16, ElemType::U8S8, &mut Lines::default(), &Packers::default()),
            "transposed A"
        );
    }

    #[test]
    fn rows_of_taps_lay_out_what_packing_then_by_rows_does() {
        use crate::taps::ConvTaps;
        // Channels of 3 and 4 (runs shorter than a word, and whole words), strides,
        // dilation, padding on both sides; depth blocks that start mid-tap; rows
        // at the border and inside.
        let cases = [
            (7, 9, 3, [3, 3], [1, 1], [1, 1], [1, 1], (0, 27)),
            (11, 6, 4, [7, 7], [2, 2], [1, 1], [3, 3], (4, 67)),
            (5, 5, 64, [3, 3], [1, 1], [2, 1], [2, 1], (64, 320)),
            (6, 8, 5, [1, 3], [1, 2], [1, 1], [0, 1], (2, 13)),
            // Pixels whose taps all lie inside (their runs found once): a stem's
            // 7×7 over 4 channels, taps a column apart (dilated: not adjacent).
            (20, 19, 4, [7, 7], [2, 2], [1, 1], [3, 3], (0, 196)),
            (9, 10, 4, [3, 3], [1, 1], [1, 2], [1, 2], (8, 28)),
        ];
        for (h, w, ch, kernel, stride, dilation, pad, (p0, kc)) in cases {
            let out = [0, 1].map(|d| {
                let span = (kernel[d] - 1) * dilation[d] + 1;
                ([h, w][d] + 2 * pad[d] - span) / stride[d] + 1
            });
            let t = ConvTaps {
                batch: 2,
                height: h,
                width: w,
                channels: ch,
                strides: [h * w * ch, w * ch, ch],
                out,
                kernel,
                stride,
                dilation,
                pad,
            };
            let codes: Vec<u8> = (0..2 * h * w * ch).map(|i| (i * 37 % 251 + 1) as u8).collect();
            let values: Vec<f32> = codes.iter().map(|&c| f32::from(c) * 0.75 - 9.0).collect();
            let (rows, depth) = t.dims().unwrap();
            let kc = kc.min(depth - p0);
            for (i0, m, mr) in [(0, rows, 16), (3, rows - 3, 32), (rows - 1, 1, 16)] {
                rows_match(&MatRef::taps_of_codes(&codes, t).unwrap(), (i0, m, p0, kc), mr, ElemType::U8S8);
                let a = MatRef::taps(&values, t).unwrap();
                rows_match(&a, (i0, m, p0, kc), mr, ElemType::U8S8);
                rows_match(&a, (i0, m, p0, kc), mr, ElemType::Bf16);
            }
        }
    }
}
