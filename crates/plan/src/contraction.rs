//! One vocabulary for contractions, shared by the CPU and GPU kernel families:
//! the [`Problem`] (`batch` products `C[m×n] = A[m×k] · B[k×n]`), how its
//! operands lie ([`ALayout`], [`BLayout`]) and the [`ElemType`] the products are
//! taken in. Each backend says which of these it takes (`kernels::Target`'s
//! element check, `gpu::GemmKernel::accepts`); the words are the same.

use std::fmt;

/// The element type a contraction multiplies in; the result is f32.
///
/// Packed operands are sequences of words, and a word holds
/// [`ElemType::k_group`] consecutive depths of one row of A (or one column of
/// B): one f32, a pair of 16-bit values (what AVX-512 BF16's `vdpbf16ps` and
/// the tensor cores' `mma` take in one register, or AVX2's `vpmaddwd` as
/// 16-bit integers), or four bytes (VNNI's `vpdpbusd`). A's words are 32 bits;
/// B's are too except for [`ElemType::I16S8`], whose B words are byte pairs
/// ([`ElemType::b_word_bytes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
pub enum ElemType {
    /// IEEE single precision: one depth per word.
    #[default]
    F32,
    /// bfloat16 (rounded to nearest even), two depths per word.
    Bf16,
    /// IEEE half precision (rounded to nearest even), two depths per word.
    F16,
    /// 8-bit integers, four depths per word: A's unsigned (0..=255), B's signed
    /// (-128..=127), products summed in i32 and converted to f32 at the store.
    /// Exact for operands that hold such integers (a quantized model's), which
    /// is the only use: packing keeps the low byte of an integral value.
    U8S8,
    /// 16-bit integers, two depths per word, products summed in i32
    /// (`vpmaddwd`) and converted to f32 at the store: the 8-bit operands of a
    /// quantized model on a machine without VNNI (u8 and s8 values both fit),
    /// exact as u8s8 is. Packing keeps the low 16 bits of an integral value.
    I16,
    /// i16's products with B's pairs stored as bytes (-128..=127, the low
    /// byte of an integral value) and widened to 16 bits as the kernel loads
    /// them (`vpmovsxbw`): an int8 weight streamed at one byte a value, half
    /// of i16's, on a machine without VNNI. A's words are i16's.
    I16S8,
}

impl ElemType {
    pub const ALL: [ElemType; 6] =
        [ElemType::F32, ElemType::Bf16, ElemType::F16, ElemType::U8S8, ElemType::I16, ElemType::I16S8];

    /// Whether products are summed in i32 (the integer types: exact for
    /// integral operands in their range).
    pub fn is_integer(self) -> bool {
        matches!(self, ElemType::U8S8 | ElemType::I16 | ElemType::I16S8)
    }

    /// Consecutive depths in one 32-bit panel word.
    pub fn k_group(self) -> usize {
        match self {
            ElemType::F32 => 1,
            ElemType::Bf16 | ElemType::F16 | ElemType::I16 | ElemType::I16S8 => 2,
            ElemType::U8S8 => 4,
        }
    }

    /// Bytes of one element of A.
    pub fn bytes(self) -> usize {
        4 / self.k_group()
    }

    /// Bytes of one word of a B panel: 4, or 2 for i16s8's byte pairs.
    pub fn b_word_bytes(self) -> usize {
        match self {
            ElemType::I16S8 => 2,
            _ => 4,
        }
    }

    /// Bytes of one element of B.
    pub fn b_bytes(self) -> usize {
        self.b_word_bytes() / self.k_group()
    }

    /// The 32-bit words a B panel `nr` columns wide and `kc` deep takes (its
    /// last word zero-filled where its byte pairs end halfway).
    pub fn b_panel_len(self, kc: usize, nr: usize) -> usize {
        (self.words(kc) * nr * self.b_word_bytes()).div_ceil(4)
    }

    pub fn name(self) -> &'static str {
        match self {
            ElemType::F32 => "f32",
            ElemType::Bf16 => "bf16",
            ElemType::F16 => "f16",
            ElemType::U8S8 => "u8s8",
            ElemType::I16 => "i16",
            ElemType::I16S8 => "i16s8",
        }
    }

    /// Words in a panel row `kc` deep.
    pub fn words(self, kc: usize) -> usize {
        kc.div_ceil(self.k_group())
    }

    /// `x` as this type represents it (what packing keeps of an operand; for
    /// the integer types, of an integral operand in their range).
    pub fn round(self, x: f32) -> f32 {
        match self {
            ElemType::F32 | ElemType::U8S8 | ElemType::I16 | ElemType::I16S8 => x,
            ElemType::Bf16 => f32::from_bits(u32::from(bf16_bits(x)) << 16),
            ElemType::F16 => half::f16::from_f32(x).to_f32(),
        }
    }

    /// The 16-bit pattern of `x` in this type: an integral value's low 16 bits
    /// for i16 and i16s8's A (the low half of the f32 bits for f32 and u8s8, which no caller
    /// packs as a half word).
    pub fn half_bits(self, x: f32) -> u16 {
        match self {
            ElemType::I16 | ElemType::I16S8 => x as i32 as u16,
            ElemType::F32 | ElemType::U8S8 => x.to_bits() as u16,
            ElemType::Bf16 => bf16_bits(x),
            ElemType::F16 => half::f16::from_f32(x).to_bits(),
        }
    }
}

impl fmt::Display for ElemType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ElemType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" | "fp32" | "float" => Ok(ElemType::F32),
            "bf16" | "bfloat16" => Ok(ElemType::Bf16),
            "f16" | "fp16" | "half" => Ok(ElemType::F16),
            "u8s8" => Ok(ElemType::U8S8),
            "i16" => Ok(ElemType::I16),
            "i16s8" => Ok(ElemType::I16S8),
            _ => Err(format!("unknown element type `{s}` (f32, bf16, f16, u8s8, i16, i16s8)")),
        }
    }
}

/// The bfloat16 bits of `x`, rounded to nearest even as `vcvtneps2bf16` rounds
/// (NaN stays a quiet NaN of the same sign; the instruction treats denormal
/// inputs as zero, and so does this).
pub fn bf16_bits(x: f32) -> u16 {
    // Denormals in, signed zero out (DAZ).
    let b = x.to_bits();
    let daz = if b & 0x7f80_0000 == 0 { f32::from_bits(b & 0x8000_0000) } else { x };
    ir::f32_to_bf16(daz)
}

/// One contraction instance: `batch` independent `C[m×n] = A[m×k] · B[k×n]`,
/// and what is fixed about its operands' layouts (a CPU weight is packed once,
/// for one `NR` and `KC`; direct kernels read A in place only when its rows are
/// contiguous; a GPU kernel is built for one B layout).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Problem {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: ALayout,
    pub b: BLayout,
}

/// A's layout as a kernel must take it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ALayout {
    /// Rows contiguous along K (`[M, K]`): packed, or read in place.
    RowMajor,
    /// Any other strides (a transposed A): packed.
    Strided,
    /// A convolution's taps over a channels-last image whose taps along a kernel
    /// row are adjacent pixels: packed, or read in place by direct kernels, one
    /// output row and one kernel row at a time. Direct kernels cover the
    /// `interior` pixels of each output row of `width` (all taps inside the
    /// image's width) in runs along the row and the others in columns across
    /// output rows, which is what a cost model needs to know of the geometry;
    /// and how often its taps read each image value they touch
    /// (`kh·kw / (sh·sw)`, at least 1: 9 for a 3×3, 1 for a strided 1×1), which
    /// decides whether A's first fetch is the image's size or all of A's.
    Taps { width: usize, interior: usize, reads: usize },
}

/// B's layout as a kernel must take it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum BLayout {
    /// Stored `[K, N]`, rows contiguous along N: an ONNX MatMul weight as
    /// exported, V in P·V (BLAS `nn`). (Tuned tables written before the
    /// vocabulary was shared call it `RowMajor`.)
    #[serde(alias = "RowMajor")]
    NMajor,
    /// Stored `[N, K]`, contiguous along K: a GPU's pre-packed weight, Kᵀ in
    /// Q·Kᵀ (BLAS `nt`). CPU kernels take it as [`BLayout::Strided`].
    KMajor,
    /// Any other strides: packed by the threads that read it.
    Strided,
    /// Pre-packed into CPU panels for this `NR` and `KC`.
    Packed { nr: usize, kc: usize },
}

impl ALayout {
    /// The layout of an A whose elements along K are `cs` apart, `k` of them.
    pub fn of(cs: usize, k: usize) -> ALayout {
        if cs == 1 || k == 1 {
            ALayout::RowMajor
        } else {
            ALayout::Strided
        }
    }

    /// How often A's elements are read per value fetched from where A lies: a
    /// convolution's taps' `reads`, 1 for a matrix.
    pub fn reads(&self) -> usize {
        match self {
            ALayout::Taps { reads, .. } => (*reads).max(1),
            _ => 1,
        }
    }
}

impl BLayout {
    /// The layout of an activation B whose elements along N are `cs` apart, `n`
    /// of them: N-major when they are adjacent, else strided.
    pub fn of(cs: usize, n: usize) -> BLayout {
        if cs == 1 || n == 1 {
            BLayout::NMajor
        } else {
            BLayout::Strided
        }
    }

    /// An activation, packed (or read) by the threads of every call.
    pub fn is_activation(&self) -> bool {
        !matches!(self, BLayout::Packed { .. })
    }

    /// Whether a `k`-deep B in this layout can be read by kernels of width `nr`
    /// in K blocks `kc` deep: an activation by any (its threads pack it); a
    /// packed weight by its own width and depth, and, when packed whole (one
    /// block as deep as K, each panel contiguous along K), in shallower blocks
    /// too, each a window of every panel: the depth a call runs in is then the
    /// schedule's, chosen per shape, not the weight's. The shallower blocks start
    /// at multiples of 8, whole words of every element type's K groups.
    pub fn serves(self, nr: usize, kc: usize, k: usize) -> bool {
        match self {
            BLayout::Packed { nr: width, kc: depth } => {
                width == nr && (depth == kc || (depth >= k && (kc >= k || (kc > 0 && kc.is_multiple_of(8)))))
            }
            _ => true,
        }
    }

    /// Whether this is a weight packed whole: one K block as deep as `k`
    /// ([`BLayout::serves`] shallower blocks).
    pub fn packed_whole(self, k: usize) -> bool {
        matches!(self, BLayout::Packed { kc, .. } if kc >= k)
    }

    /// The BLAS-style name used in kernel names: `nt` (B K-major), `nn`
    /// (N-major), `ns` (strided), `np` (packed panels).
    pub fn tag(self) -> &'static str {
        match self {
            BLayout::KMajor => "nt",
            BLayout::NMajor => "nn",
            BLayout::Strided => "ns",
            BLayout::Packed { .. } => "np",
        }
    }

    /// B's rows and columns as stored for `p` when it is contiguous: `[N, K]`
    /// K-major, `[K, N]` otherwise (a contiguous B's row stride is the columns).
    pub fn extent(self, p: &Problem) -> (usize, usize) {
        match self {
            BLayout::KMajor => (p.n, p.k),
            _ => (p.k, p.n),
        }
    }
}

impl Problem {
    /// `batch × ([m, k] · [k, n])`, both operands row-major (BLAS `nn`).
    pub fn nn(batch: usize, m: usize, n: usize, k: usize) -> Problem {
        Problem { batch, m, n, k, a: ALayout::RowMajor, b: BLayout::NMajor }
    }

    /// `batch × ([m, k] · [n, k]ᵀ)`: B K-major (BLAS `nt`).
    pub fn nt(batch: usize, m: usize, n: usize, k: usize) -> Problem {
        Problem { batch, m, n, k, a: ALayout::RowMajor, b: BLayout::KMajor }
    }

    /// The same product with B laid out as `b`.
    pub fn with_b(self, b: BLayout) -> Problem {
        Problem { b, ..self }
    }

    pub fn flops(&self) -> f64 {
        2.0 * self.batch as f64 * self.m as f64 * self.n as f64 * self.k as f64
    }

    /// Bytes a call must move at least: A, B and C once, in elements of `elem`.
    pub fn min_bytes(&self, elem: ElemType) -> f64 {
        let elems = self.batch as f64 * (self.m * self.k + self.k * self.n + self.m * self.n) as f64;
        elem.bytes() as f64 * elems
    }
}

/// `MxNxK`, or `Bx(MxNxK)` when batched; the layouts are the kernel's to say.
impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.batch == 1 {
            write!(f, "{}x{}x{}", self.m, self.n, self.k)
        } else {
            write!(f, "{}x({}x{}x{})", self.batch, self.m, self.n, self.k)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(bf16_bits(1.0), 0x3f80);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: even (1) wins.
        assert_eq!(bf16_bits(1.0 + 1.0 / 256.0), 0x3f80);
        // 1 + 3·2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: even (1 + 2^-6) wins.
        assert_eq!(bf16_bits(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(bf16_bits(-2.5), 0xc020);
        assert_eq!(bf16_bits(f32::INFINITY), 0x7f80);
        assert_eq!(bf16_bits(f32::MAX), 0x7f80, "overflows to infinity");
        assert!(f32::from_bits(u32::from(bf16_bits(f32::NAN)) << 16).is_nan());
        assert_eq!(bf16_bits(f32::from_bits(1)), 0, "denormals are zero");
        assert_eq!(ElemType::Bf16.round(3.0), 3.0);
        assert_eq!(ElemType::Bf16.half_bits(-2.5), 0xc020);
    }

    #[test]
    fn f16_rounds_to_nearest_even() {
        // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: even (1) wins.
        assert_eq!(ElemType::F16.round(1.0 + 1.0 / 2048.0), 1.0);
        assert_eq!(ElemType::F16.round(1.0 + 3.0 / 2048.0), 1.0 + 2.0 / 1024.0);
        assert_eq!(ElemType::F16.half_bits(1.0), 0x3c00);
        assert_eq!(ElemType::F16.round(70000.0), f32::INFINITY, "past f16's range");
    }

    /// A packed weight serves its own blocks; packed whole, shallower ones too,
    /// in multiples of 8; an activation any.
    #[test]
    fn a_weight_packed_whole_serves_shallower_blocks() {
        let whole = BLayout::Packed { nr: 16, kc: 768 };
        assert!(whole.serves(16, 768, 768) && whole.serves(16, 320, 768) && whole.serves(16, 8, 768));
        assert!(whole.serves(16, 1024, 768), "a block deeper than K is the whole");
        assert!(!whole.serves(16, 324, 768), "blocks start at multiples of 8");
        assert!(!whole.serves(32, 320, 768), "another width");
        assert!(!whole.serves(16, 0, 768));
        let blocked = BLayout::Packed { nr: 16, kc: 320 };
        assert!(
            blocked.serves(16, 320, 768) && !blocked.serves(16, 160, 768) && !blocked.serves(16, 768, 768)
        );
        assert!(blocked.packed_whole(320) && !blocked.packed_whole(768) && whole.packed_whole(768));
        assert!(BLayout::NMajor.serves(48, 7, 5) && !BLayout::NMajor.packed_whole(5));
    }

    #[test]
    fn words_and_names() {
        assert_eq!(ElemType::Bf16.words(7), 4);
        assert_eq!(ElemType::F32.words(7), 7);
        for e in ElemType::ALL {
            assert_eq!(e.name().parse::<ElemType>(), Ok(e));
            assert_eq!(e.bytes() * e.k_group(), 4);
        }
        assert!("int4".parse::<ElemType>().is_err());
        assert_eq!(ElemType::I16.words(7), 4);
        assert_eq!(ElemType::I16.half_bits(-128.0), 0xff80);
        assert_eq!(ElemType::I16.half_bits(255.0), 0x00ff);
        assert!(ElemType::I16.is_integer() && ElemType::U8S8.is_integer() && !ElemType::Bf16.is_integer());
    }

    #[test]
    fn problems_print_and_lay_out_b() {
        let p = Problem::nt(12, 128, 128, 64);
        assert_eq!(p.to_string(), "12x(128x128x64)");
        assert_eq!(p.b.extent(&p), (128, 64));
        assert_eq!(Problem::nn(1, 7, 768, 3072).b.extent(&Problem::nn(1, 7, 768, 3072)), (3072, 768));
        assert_eq!(Problem::nn(1, 7, 768, 3072).to_string(), "7x768x3072");
        assert_eq!(p.with_b(BLayout::NMajor).b.tag(), "nn");
        assert_eq!(BLayout::of(1, 5), BLayout::NMajor);
        assert_eq!(BLayout::of(3, 5), BLayout::Strided);
        assert_eq!(Problem::nn(2, 3, 4, 5).min_bytes(ElemType::Bf16), 2.0 * 2.0 * (15 + 20 + 12) as f64);
    }
}
