//! Weight-only quantized weights: a weight kept as 4- or 8-bit integer codes
//! with a scale and a zero point per group of `group` rows of K and per
//! column (ONNX's blocked `DequantizeLinear`, ONNX Runtime's `MatMulNBits`;
//! `group = k` is one scale per column), multiplied by f32 activations.
//! Packed once like an f32 weight (the same K blocks and column panels), each
//! panel holding its codes and its groups' scales; the drivers dequantize a
//! panel into an f32 panel in L1 when they reach it, and the f32 micro-kernels
//! multiply that. A weight is then read from memory at 4 or 8 bits a value
//! where a product streams its weights (a few rows: decoding), and the
//! dequantization is paid once per panel per row block where it does not.

use crate::KernelError;

/// Integer codes of a `k × n` weight, row-major, as ONNX holds them once
/// unpacked (int4 and uint4 in 8-bit integers).
#[derive(Clone, Copy, Debug)]
pub enum Codes<'a> {
    I8(&'a [i8]),
    U8(&'a [u8]),
}

impl Codes<'_> {
    fn len(&self) -> usize {
        match self {
            Codes::I8(v) => v.len(),
            Codes::U8(v) => v.len(),
        }
    }

    fn get(&self, i: usize) -> i32 {
        match self {
            Codes::I8(v) => i32::from(v[i]),
            Codes::U8(v) => i32::from(v[i]),
        }
    }

    /// The least value of `bits`-bit codes of this signedness.
    fn least(&self, bits: u32) -> i32 {
        match self {
            Codes::I8(_) => -(1 << (bits - 1)),
            Codes::U8(_) => 0,
        }
    }
}

/// A weight-only quantized `k × n` weight: `W[r, c] = (codes[r, c] −
/// zero_points[r / group, c]) · scales[r / group, c]`.
#[derive(Clone, Copy, Debug)]
pub struct QuantizedWeight<'a> {
    pub k: usize,
    pub n: usize,
    /// 4 or 8: the codes' width (their values must fit it).
    pub bits: u32,
    pub codes: Codes<'a>,
    /// Rows of K that share a scale and a zero point.
    pub group: usize,
    /// `[k.div_ceil(group), n]`, row-major.
    pub scales: &'a [f32],
    /// As `scales`, of the codes' type; none is zero.
    pub zero_points: Option<Codes<'a>>,
}

impl QuantizedWeight<'_> {
    /// The groups along K.
    pub fn groups(&self) -> usize {
        self.k.div_ceil(self.group.max(1))
    }

    /// Checks the parts' sizes and that every code fits `bits`.
    pub fn check(&self) -> Result<(), KernelError> {
        let bad =
            |why: String| Err(KernelError::Shape(format!("a quantized {}x{} weight: {why}", self.k, self.n)));
        if self.bits != 4 && self.bits != 8 {
            return bad(format!("{}-bit codes (4 or 8 only)", self.bits));
        }
        if self.group == 0 {
            return bad("groups of no rows".into());
        }
        let elems = self.k.checked_mul(self.n);
        if elems != Some(self.codes.len()) {
            return bad(format!("{} codes", self.codes.len()));
        }
        let params = self.groups() * self.n;
        if self.scales.len() != params {
            return bad(format!(
                "{} scales for {} groups of {} columns",
                self.scales.len(),
                self.groups(),
                self.n
            ));
        }
        if let Some(z) = &self.zero_points {
            if z.len() != params {
                return bad(format!("{} zero points for {params} scales", z.len()));
            }
            if std::mem::discriminant(z) != std::mem::discriminant(&self.codes) {
                return bad("zero points of another type than the codes".into());
            }
        }
        let least = self.codes.least(self.bits);
        let range = least..least + (1 << self.bits);
        for (what, codes) in [("code", Some(self.codes)), ("zero point", self.zero_points)] {
            let Some(c) = codes else { continue };
            if let Some(i) = (0..c.len()).find(|&i| !range.contains(&c.get(i))) {
                return bad(format!("{what} {} is not a {}-bit value", c.get(i), self.bits));
            }
        }
        Ok(())
    }
}

/// How a packed weight's words hold codes (see [`crate::PackedB::quantized`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeLayout {
    pub bits: u32,
    pub group: usize,
}

impl CodeLayout {
    /// The groups that rows `pc..pc + kcur` meet.
    pub(crate) fn groups_of(&self, pc: usize, kcur: usize) -> std::ops::Range<usize> {
        if kcur == 0 {
            return pc / self.group..pc / self.group;
        }
        pc / self.group..(pc + kcur - 1) / self.group + 1
    }

    /// Words of one panel `nr` wide of the block of rows `pc..pc + kcur`: the
    /// groups' scales, then their offsets (`(least − zero point) · scale`, so
    /// that a value is `code · scale + offset` of its unsigned code), `nr` of
    /// each a group, then the codes (`nr` a multiple of 8: whole words).
    pub(crate) fn panel_len(&self, pc: usize, kcur: usize, nr: usize) -> usize {
        2 * self.groups_of(pc, kcur).len() * nr + kcur * nr * self.bits as usize / 32
    }

    /// Fill `panel` (of [`CodeLayout::panel_len`] words) with columns
    /// `c0..c0 + nr` of `w`'s rows `pc..pc + kcur` (zero past `w.n`). A 4-bit
    /// row keeps column `c0 + p` in the low half of its byte `p` and
    /// `c0 + p + nr/2` in the high half: halves that widen to two runs of
    /// lanes.
    pub(crate) fn pack_panel(
        &self,
        w: &QuantizedWeight,
        pc: usize,
        kcur: usize,
        c0: usize,
        nr: usize,
        panel: &mut [u32],
    ) {
        let groups = self.groups_of(pc, kcur);
        let ng = groups.len();
        let least = w.codes.least(self.bits);
        panel.fill(0);
        let (params, codes) = panel.split_at_mut(2 * ng * nr);
        for (gi, g) in groups.enumerate() {
            for j in 0..nr.min(w.n.saturating_sub(c0)) {
                let at = g * w.n + c0 + j;
                let s = w.scales[at];
                let zp = w.zero_points.map_or(0, |z| z.get(at));
                params[gi * nr + j] = s.to_bits();
                params[(ng + gi) * nr + j] = ((least - zp) as f32 * s).to_bits();
            }
        }
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(codes);
        for r in 0..kcur {
            for j in 0..nr.min(w.n.saturating_sub(c0)) {
                let u = (w.codes.get((pc + r) * w.n + c0 + j) - least) as u8;
                if self.bits == 8 {
                    bytes[r * nr + j] = u;
                } else {
                    let (half, p) = (j / (nr / 2), j % (nr / 2));
                    bytes[r * nr / 2 + p] |= u << (4 * half);
                }
            }
        }
    }

    /// A packed panel's scales, offsets (`ng` groups of `nr` each) and codes.
    fn parts<'p>(&self, panel: &'p [u32], ng: usize, nr: usize) -> (&'p [f32], &'p [f32], &'p [u8]) {
        let (params, codes) = panel.split_at(2 * ng * nr);
        let params: &[f32] = bytemuck::cast_slice(params);
        let (scales, offsets) = params.split_at(ng * nr);
        (scales, offsets, bytemuck::cast_slice(codes))
    }

    /// The f32 panel (`kcur × nr`, row after row, as [`crate::pack::pack_b`]
    /// packs an f32 weight) of a packed panel of rows `pc..pc + kcur`.
    /// With `generated`, each group's rows go through that routine.
    pub(crate) fn dequantize(
        &self,
        panel: &[u32],
        (pc, kcur, nr): (usize, usize, usize),
        generated: Option<crate::Dequantizer>,
        out: &mut [f32],
    ) {
        let groups = self.groups_of(pc, kcur);
        let (scales, offsets, bytes) = self.parts(panel, groups.len(), nr);
        let half = nr / 2;
        let mut r = 0;
        for (gi, g) in groups.clone().enumerate() {
            let end = ((g + 1) * self.group).min(pc + kcur) - pc;
            let s = &scales[gi * nr..(gi + 1) * nr];
            let o = &offsets[gi * nr..(gi + 1) * nr];
            if let Some(d) = generated.filter(|d| d.width == nr && d.bits == self.bits) {
                let row_bytes = nr * self.bits as usize / 8;
                let codes = &bytes[r * row_bytes..end * row_bytes];
                let rows_out = &mut out[r * nr..end * nr];
                // SAFETY: the routine reads `end − r` rows of `nr` codes (`row_bytes`
                // each: exactly `codes`), `nr` scales and offsets (`s`, `o`), and
                // writes `(end − r) · nr` f32 (exactly `rows_out`), as its ABI says
                // and its width and bits (checked) make it.
                unsafe {
                    (d.func)(codes.as_ptr(), s.as_ptr(), o.as_ptr(), (end - r) as i64, rows_out.as_mut_ptr())
                };
                r = end;
                continue;
            }
            while r < end {
                let row = &mut out[r * nr..(r + 1) * nr];
                if self.bits == 8 {
                    let c = &bytes[r * nr..(r + 1) * nr];
                    for (((v, &c), &s), &o) in row.iter_mut().zip(c).zip(s).zip(o) {
                        *v = f32::from(c) * s + o;
                    }
                } else {
                    let c = &bytes[r * half..(r + 1) * half];
                    let (lo, hi) = row.split_at_mut(half);
                    for (((v, &c), &s), &o) in lo.iter_mut().zip(c).zip(&s[..half]).zip(&o[..half]) {
                        *v = f32::from(c & 15) * s + o;
                    }
                    for (((v, &c), &s), &o) in hi.iter_mut().zip(c).zip(&s[half..]).zip(&o[half..]) {
                        *v = f32::from(c >> 4) * s + o;
                    }
                }
                r += 1;
            }
        }
    }

    /// Adds to `out` (`nr` wide) one row of A (`a`: its depths `pc..pc +
    /// kcur`) times a packed panel of rows `pc..pc + kcur`: per group, `dot`
    /// sums the row by the unsigned codes, then `out[j] += scale[j] · sum[j]
    /// + offset[j] · Σ a` (the codes' value is `code · scale + offset`).
    pub(crate) fn dot_row(
        &self,
        panel: &[u32],
        (pc, kcur, nr): (usize, usize, usize),
        dot: crate::CodeDot,
        a: &[f32],
        sums: &mut [f32],
        out: &mut [f32],
    ) {
        let groups = self.groups_of(pc, kcur);
        let (scales, offsets, bytes) = self.parts(panel, groups.len(), nr);
        let row_bytes = nr * self.bits as usize / 8;
        let mut r = 0;
        for (gi, g) in groups.enumerate() {
            let end = ((g + 1) * self.group).min(pc + kcur) - pc;
            let sums = &mut sums[..nr];
            sums.fill(0.0);
            let codes = &bytes[r * row_bytes..end * row_bytes];
            let a = &a[r..end];
            // SAFETY: the routine reads `end − r` rows of `nr` codes (`row_bytes` each:
            // exactly `codes`) and as many values of A (exactly `a`), and adds into
            // `nr` f32 (exactly `sums`), as its ABI says and its width and bits
            // (checked by the caller) make it.
            unsafe { (dot.func)(codes.as_ptr(), a.as_ptr(), (end - r) as i64, sums.as_mut_ptr()) };
            let total: f32 = a.iter().sum();
            let (s, o) = (&scales[gi * nr..(gi + 1) * nr], &offsets[gi * nr..(gi + 1) * nr]);
            for (((v, &sum), &s), &o) in out.iter_mut().zip(sums.iter()).zip(s).zip(o) {
                *v += s * sum + o * total;
            }
            r = end;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every panel of a packed weight dequantizes (the portable loops) to the
    /// weight's values: 4 and 8 bits, signed and unsigned, zero points or
    /// none, groups that straddle K blocks, a last panel past the columns.
    #[test]
    fn panels_dequantize_to_the_weights_values() {
        let (k, n, nr, kc) = (23, 19, 16, 10);
        for (bits, signed, zero, group) in
            [(4, false, true, 4), (4, true, false, 7), (8, true, true, 23), (8, false, false, 3)]
        {
            let levels = 1i32 << bits;
            let least = if signed { -levels / 2 } else { 0 };
            let val = |i: usize, s: usize| ((i * 7919 + s * 104_729) % 1_000_003) as i32;
            let codes: Vec<i32> = (0..k * n).map(|i| val(i, 1) % levels + least).collect();
            let groups = k.div_ceil(group);
            let zps: Vec<i32> = (0..groups * n).map(|i| val(i, 2) % levels + least).collect();
            let scales: Vec<f32> = (0..groups * n).map(|i| (val(i, 3) % 9 + 1) as f32 / 8.0).collect();
            let (ci, cu): (Vec<i8>, Vec<u8>) =
                (codes.iter().map(|&c| c as i8).collect(), codes.iter().map(|&c| c as u8).collect());
            let (zi, zu): (Vec<i8>, Vec<u8>) =
                (zps.iter().map(|&c| c as i8).collect(), zps.iter().map(|&c| c as u8).collect());
            fn pick<'a>(signed: bool, i: &'a [i8], u: &'a [u8]) -> Codes<'a> {
                if signed {
                    Codes::I8(i)
                } else {
                    Codes::U8(u)
                }
            }
            let w = QuantizedWeight {
                k,
                n,
                bits,
                codes: pick(signed, &ci, &cu),
                group,
                scales: &scales,
                zero_points: zero.then(|| pick(signed, &zi, &zu)),
            };
            w.check().expect("valid");
            let layout = CodeLayout { bits, group };
            for pc in (0..k).step_by(kc) {
                let kcur = kc.min(k - pc);
                for j0 in (0..n).step_by(nr) {
                    let mut panel = vec![0u32; layout.panel_len(pc, kcur, nr)];
                    layout.pack_panel(&w, pc, kcur, j0, nr, &mut panel);
                    let mut out = vec![f32::NAN; kcur * nr];
                    layout.dequantize(&panel, (pc, kcur, nr), None, &mut out);
                    for r in 0..kcur {
                        for j in 0..nr {
                            let (row, col) = (pc + r, j0 + j);
                            let want = if col < n {
                                let g = row / group * n + col;
                                (codes[row * n + col] - if zero { zps[g] } else { 0 }) as f32 * scales[g]
                            } else {
                                0.0
                            };
                            let got = out[r * nr + j];
                            assert!(
                                (got - want).abs() <= 1e-6 * (1.0 + want.abs()),
                                "{bits}-bit [{row},{col}]: {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Codes or zero points out of their width, and parts of the wrong sizes,
    /// are errors that say what is wrong.
    #[test]
    fn bad_weights_are_errors() {
        let codes = [0u8, 16, 3, 4];
        let scales = [1.0f32; 2];
        let w = QuantizedWeight {
            k: 2,
            n: 2,
            bits: 4,
            codes: Codes::U8(&codes),
            group: 2,
            scales: &scales,
            zero_points: None,
        };
        assert!(w.check().unwrap_err().to_string().contains("code 16 is not a 4-bit value"));
        let ok = [0u8, 15, 3, 4];
        let w = QuantizedWeight { codes: Codes::U8(&ok), scales: &scales[..1], ..w };
        assert!(w.check().unwrap_err().to_string().contains("1 scales"));
        let w = QuantizedWeight { scales: &scales, bits: 3, ..w };
        assert!(w.check().unwrap_err().to_string().contains("3-bit codes"));
    }
}
