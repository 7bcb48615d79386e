//! The element type a kernel family multiplies in, and the packed-panel word
//! that makes the family generic over it.
//!
//! Operands and results stay f32 in memory (activations, C, bias, residual); the
//! element type is what packing converts the operands to and what the
//! micro-kernel multiplies. Every packed panel is a sequence of 32-bit words, and
//! a word holds [`ElemType::k_group`] consecutive depths of one row of A (or one
//! column of B): one f32, or a pair of bf16 (AVX-512 BF16's `vdpbf16ps`
//! multiplies such pairs and adds both products into an f32 lane). A panel
//! `kc` deep is `kc.div_ceil(k_group)` words deep; the depths past `kc` in its
//! last word are zero, DietCode's local padding along K. The drivers, the thread
//! grid and the cost model only count words and bytes, so a new element type is a
//! new word format, packing conversion and micro-kernel body (int8 with VNNI's
//! `vpdpbusd` is a group of four), not a new driver.

use crate::{KernelError, Target};

/// The element type of a kernel family's products.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
pub enum ElemType {
    /// IEEE single precision: one depth per word, FMA.
    #[default]
    F32,
    /// bfloat16 operands (rounded to nearest even when packed), f32 accumulation:
    /// two depths per word, AVX-512 BF16.
    Bf16,
}

impl ElemType {
    pub const ALL: [ElemType; 2] = [ElemType::F32, ElemType::Bf16];

    /// Consecutive depths in one 32-bit panel word.
    pub fn k_group(self) -> usize {
        match self {
            ElemType::F32 => 1,
            ElemType::Bf16 => 2,
        }
    }

    /// Bytes of one packed element.
    pub fn bytes(self) -> usize {
        4 / self.k_group()
    }

    pub fn name(self) -> &'static str {
        match self {
            ElemType::F32 => "f32",
            ElemType::Bf16 => "bf16",
        }
    }

    /// Words in a panel row `kc` deep.
    pub fn words(self, kc: usize) -> usize {
        kc.div_ceil(self.k_group())
    }

    /// Whether `t` can run kernels of this type; the error says what it lacks.
    pub fn check(self, t: &Target) -> Result<(), KernelError> {
        match self {
            ElemType::F32 => Ok(()),
            ElemType::Bf16 if t.isa.avx512f && t.isa.avx512bf16 => Ok(()),
            ElemType::Bf16 => Err(KernelError::Shape(
                "bf16 kernels need AVX-512 BF16 (vdpbf16ps), which this target lacks".into(),
            )),
        }
    }

    /// `x` as this type represents it (what packing keeps of an operand).
    pub fn round(self, x: f32) -> f32 {
        match self {
            ElemType::F32 => x,
            ElemType::Bf16 => f32::from_bits(u32::from(bf16_bits(x)) << 16),
        }
    }

    /// The panel word of `vals` (the group's depths in order; missing depths are
    /// zero): the portable packing's conversion, bit for bit the generated one's.
    pub(crate) fn word(self, vals: &[f32]) -> u32 {
        match self {
            ElemType::F32 => vals.first().map_or(0, |v| v.to_bits()),
            ElemType::Bf16 => {
                let at = |i: usize| vals.get(i).map_or(0, |v| u32::from(bf16_bits(*v)));
                at(0) | at(1) << 16
            }
        }
    }
}

impl std::fmt::Display for ElemType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ElemType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" | "fp32" | "float" => Ok(ElemType::F32),
            "bf16" | "bfloat16" => Ok(ElemType::Bf16),
            _ => Err(format!("unknown element type `{s}` (f32, bf16)")),
        }
    }
}

/// The bfloat16 bits of `x`, rounded to nearest even as `vcvtneps2bf16` rounds
/// (NaN stays a quiet NaN of the same sign; the instruction treats denormal
/// inputs as zero, and so does this).
pub fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    // Denormals in, signed zero out (DAZ).
    let b = if b & 0x7f80_0000 == 0 { b & 0x8000_0000 } else { b };
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1));
    (rounded >> 16) as u16
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
        assert_eq!(ElemType::Bf16.word(&[1.0, -2.5]), 0xc020_3f80);
        assert_eq!(ElemType::Bf16.word(&[1.0]), 0x3f80, "a missing depth is zero");
        assert_eq!(ElemType::F32.word(&[1.5]), 1.5f32.to_bits());
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
    }
}
