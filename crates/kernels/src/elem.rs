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
//! `vpdpbusd` is a group of four; without VNNI, the same 8-bit values as 16-bit
//! pairs for AVX2's `vpmaddwd`), not a new driver. The type itself is
//! `plan`'s, shared with the GPU family; what is here is the CPU's part.

use crate::{KernelError, Target};
pub use plan::{bf16_bits, ElemType};

/// The element types the CPU families multiply in (f16 is the GPU's only).
pub const CPU_ELEM_TYPES: [ElemType; 5] =
    [ElemType::F32, ElemType::Bf16, ElemType::U8S8, ElemType::I16, ElemType::I16S8];

impl Target {
    /// Whether this target can run kernels of type `e`; the error says what it lacks.
    pub fn check_elem(&self, e: ElemType) -> Result<(), KernelError> {
        match e {
            ElemType::F32 => Ok(()),
            ElemType::Bf16 if self.isa.avx512f && self.isa.avx512bf16 => Ok(()),
            ElemType::Bf16 => Err(KernelError::Shape(
                "bf16 kernels need AVX-512 BF16 (vdpbf16ps), which this target lacks".into(),
            )),
            // 512-bit `vpdpbusd` with AVX-512, the VEX form on 256-bit vectors without.
            ElemType::U8S8 if self.isa.avx512f && self.isa.avx512vnni => Ok(()),
            ElemType::U8S8 if !self.isa.avx512f && self.isa.avxvnni => Ok(()),
            ElemType::U8S8 => Err(KernelError::Shape(
                "u8s8 kernels need VNNI (vpdpbusd: AVX512-VNNI, or AVX-VNNI on an AVX2 target), which this \
                 target lacks"
                    .into(),
            )),
            // `vpmaddwd` and `vpmovsxbw`: AVX2 (and AVX-512BW, which every AVX-512
            // target here has).
            ElemType::I16 | ElemType::I16S8 => Ok(()),
            ElemType::F16 => Err(KernelError::Shape(
                "the CPU kernel families have no f16 form (f32, bf16, u8s8, i16, i16s8)".into(),
            )),
        }
    }
}

/// The panel word of `vals` (the group's depths in order; missing depths are
/// zero): the portable packing's conversion, bit for bit the generated one's
/// (for i16s8, A's word: B's is [`put_b_word`]'s).
pub(crate) fn word(e: ElemType, vals: &[f32]) -> u32 {
    match e {
        ElemType::F32 => vals.first().map_or(0, |v| v.to_bits()),
        ElemType::Bf16 | ElemType::F16 | ElemType::I16 | ElemType::I16S8 => {
            let at = |i: usize| vals.get(i).map_or(0, |v| u32::from(e.half_bits(*v)));
            at(0) | at(1) << 16
        }
        // The low byte of each integral value: u8 and s8 alike (as the generated
        // packing's `fptosi` then truncation).
        ElemType::U8S8 => {
            let at = |i: usize| vals.get(i).map_or(0, |v| (*v as i32 as u32) & 0xff);
            at(0) | at(1) << 8 | at(2) << 16 | at(3) << 24
        }
    }
}

/// Store B's panel word of `vals` as word `index` of a panel of `e`: A's
/// word, except i16s8's pair of low bytes (s8 values), two to a 32-bit element.
pub(crate) fn put_b_word(e: ElemType, panel: &mut [u32], index: usize, vals: &[f32]) {
    match e {
        ElemType::I16S8 => {
            let at = |i: usize| vals.get(i).map_or(0, |v| (*v as i32 as u32) & 0xff);
            let (slot, shift) = (index / 2, 16 * (index % 2));
            panel[slot] = (panel[slot] & !(0xffff << shift)) | (at(0) | at(1) << 8) << shift;
        }
        _ => panel[index] = word(e, vals),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_pack_depths_low_first() {
        assert_eq!(word(ElemType::Bf16, &[1.0, -2.5]), 0xc020_3f80);
        assert_eq!(word(ElemType::Bf16, &[1.0]), 0x3f80, "a missing depth is zero");
        assert_eq!(word(ElemType::F32, &[1.5]), 1.5f32.to_bits());
        assert_eq!(word(ElemType::F16, &[1.0, 1.0]), 0x3c00_3c00);
        assert_eq!(word(ElemType::U8S8, &[255.0, -1.0, 7.0]), 0x0007_ffff);
        assert_eq!(word(ElemType::U8S8, &[-128.0, 0.0, 0.0, 200.0]), 0xc800_0080);
        assert_eq!(word(ElemType::I16, &[255.0, -128.0]), 0xff80_00ff);
        assert_eq!(word(ElemType::I16, &[-1.0]), 0xffff);
        assert_eq!(word(ElemType::I16S8, &[255.0, -128.0]), 0xff80_00ff, "A's words are i16's");
        let mut panel = [0u32; 2];
        for (i, vals) in [&[-1.0, 127.0][..], &[-128.0], &[52.0, 18.0]].into_iter().enumerate() {
            put_b_word(ElemType::I16S8, &mut panel, i, vals);
        }
        assert_eq!(panel, [0x0080_7fff, 0x1234], "byte pairs, low half first");
    }

    #[test]
    fn the_cpu_refuses_f16_by_name() {
        let err = Target::detect().check_elem(ElemType::F16).unwrap_err().to_string();
        assert!(err.contains("f16"), "{err}");
        assert!(Target::detect().check_elem(ElemType::F32).is_ok());
    }
}
