//! `Target`: what the code generator and the cost models know about the machine,
//! detected on it (CPUID through `std`, cache sizes from sysfs), never hard-coded.

use std::path::Path;

use crate::ElemType;

/// Instruction-set features that change the kernels we generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Isa {
    pub avx2: bool,
    pub fma: bool,
    pub avx512f: bool,
    pub avx512bf16: bool,
    pub avx512vnni: bool,
    /// VEX-encoded VNNI (`vpdpbusd` on 256-bit vectors without AVX-512).
    #[serde(default)]
    pub avxvnni: bool,
    /// AMX with its int8 products (`tdpbusd`), and the operating system's leave
    /// to use its tile registers (on Linux a process asks for it once).
    #[serde(default)]
    pub amx_int8: bool,
    /// AMX's bf16 products (`tdpbf16ps`), with the same leave.
    #[serde(default)]
    pub amx_bf16: bool,
}

/// The machine, as the kernels see it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Target {
    pub isa: Isa,
    /// f32 lanes in one vector register (16 with AVX-512, 8 with AVX2).
    pub f32_lanes: usize,
    /// Architectural vector registers (32 with AVX-512, 16 with AVX2).
    pub vector_registers: usize,
    /// Data cache sizes in bytes (per core for L1/L2, shared L3).
    pub l1d: usize,
    pub l2: usize,
    pub l3: usize,
    pub cores: usize,
}

impl Target {
    /// The host, with every feature it has.
    pub fn detect() -> Target {
        let isa = detect_isa();
        let wide = isa.avx512f;
        let cache = |level: u32, default: usize| cache_size(level).unwrap_or(default);
        Target {
            isa,
            f32_lanes: if wide { 16 } else { 8 },
            vector_registers: if wide { 32 } else { 16 },
            l1d: cache(1, 32 << 10),
            l2: cache(2, 1 << 20),
            l3: cache(3, 8 << 20),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }

    /// This target restricted to AVX2 + FMA (so both code paths can be exercised
    /// on an AVX-512 machine). `None` when the host lacks AVX2 or FMA.
    pub fn avx2_only(&self) -> Option<Target> {
        if !(self.isa.avx2 && self.isa.fma) {
            return None;
        }
        Some(Target {
            isa: Isa {
                avx512f: false,
                avx512bf16: false,
                avx512vnni: false,
                amx_int8: false,
                amx_bf16: false,
                ..self.isa
            },
            f32_lanes: 8,
            vector_registers: 16,
            ..self.clone()
        })
    }

    /// Whether kernels can be generated for this target at all (x86-64 with AVX2 + FMA).
    pub fn supported(&self) -> bool {
        self.isa.avx2 && self.isa.fma
    }

    /// Whether an `mr × nr` kernel multiplying `elem` on this target multiplies
    /// with AMX tiles: u8s8 on an AMX-INT8 machine, bf16 on an AMX-BF16 one
    /// (with AVX-512 and its BF16 for the depths past the tiles' steps), `mr`
    /// and `nr` multiples of a tile's 16 rows and 16 columns of 32-bit sums,
    /// its accumulator tiles, an A tile per row of them and a B tile within
    /// the eight tile registers (where a B tile per column would not fit, the
    /// kernel loads each column's just before its products). Such a kernel
    /// reads its A panels row by row ([`crate::MicroKernel::amx`]).
    pub fn amx_tile(&self, elem: ElemType, mr: usize, nr: usize) -> bool {
        let (tm, tn) = (mr / AMX_ROWS, nr / AMX_ROWS);
        let isa = match elem {
            ElemType::U8S8 => self.isa.amx_int8 && self.isa.avx512vnni,
            ElemType::Bf16 => self.isa.amx_bf16 && self.isa.avx512bf16,
            _ => false,
        };
        isa && self.isa.avx512f
            && mr.is_multiple_of(AMX_ROWS)
            && nr.is_multiple_of(AMX_ROWS)
            && tm >= 1
            && tn >= 1
            && tm * tn + tm < AMX_TILE_REGISTERS
    }
}

/// The rows of an AMX tile (and its columns of 32-bit values: 64 bytes a row).
pub const AMX_ROWS: usize = 16;

/// The tile registers an AMX kernel's sums and operand tiles share.
pub const AMX_TILE_REGISTERS: usize = 8;

/// The tiles AMX kernels are generated in on an AMX target (`(mr, nr)`):
/// 16×64 stores a row's 64 codes as one cache line.
pub const AMX_TILES: [(usize, usize); 5] = [(16, 16), (32, 16), (16, 32), (32, 32), (16, 64)];

#[cfg(target_arch = "x86_64")]
fn detect_isa() -> Isa {
    let (amx_int8, amx_bf16) = amx_usable();
    Isa {
        avx2: std::arch::is_x86_feature_detected!("avx2"),
        fma: std::arch::is_x86_feature_detected!("fma"),
        avx512f: std::arch::is_x86_feature_detected!("avx512f"),
        avx512bf16: std::arch::is_x86_feature_detected!("avx512bf16"),
        avx512vnni: std::arch::is_x86_feature_detected!("avx512vnni"),
        avxvnni: std::arch::is_x86_feature_detected!("avxvnni"),
        amx_int8,
        amx_bf16,
    }
}

/// Whether AMX's int8 and bf16 products can run here: the CPU has AMX-TILE
/// (CPUID leaf 7, EDX bit 24) and AMX-INT8 (bit 25) or AMX-BF16 (bit 22), the
/// OS saves the tile state (XCR0 bits 17 and 18), and, on Linux, the process
/// has leave to use it: asked for here (`ARCH_REQ_XCOMP_PERM` for the tile
/// data; granting it again is a no-op), since a tile instruction without it
/// faults (SIGILL).
#[cfg(target_arch = "x86_64")]
pub fn amx_usable() -> (bool, bool) {
    // Leaf 7 counts only where the maximum leaf (leaf 0's EAX) reaches it.
    let max_leaf = std::arch::x86_64::__cpuid(0).eax;
    let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
    let bit = |b: u32| max_leaf >= 7 && edx & (1 << b) != 0;
    let (int8, bf16) = (bit(25), bit(22));
    if !bit(24) || !(int8 || bf16) || !std::arch::is_x86_feature_detected!("xsave") {
        return (false, false);
    }
    // SAFETY: `xgetbv` needs OSXSAVE, which `xsave` detection implies (std
    // checks that the OS enabled it); XCR0 is register 0.
    let xcr0 = unsafe { std::arch::x86_64::_xgetbv(0) };
    if xcr0 & (0b11 << 17) != 0b11 << 17 || !os_grants_tile_data() {
        return (false, false);
    }
    (int8, bf16)
}

#[cfg(not(target_arch = "x86_64"))]
pub fn amx_usable() -> (bool, bool) {
    (false, false)
}

/// Linux's leave for this process to use the AMX tile data (feature 18).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn os_grants_tile_data() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: `arch_prctl` with this request only changes which extended states
    // the process may use; it reads and writes no memory of ours.
    unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
}

#[cfg(all(target_arch = "x86_64", not(target_os = "linux")))]
fn os_grants_tile_data() -> bool {
    false
}

#[cfg(not(target_arch = "x86_64"))]
fn detect_isa() -> Isa {
    Isa {
        avx2: false,
        fma: false,
        avx512f: false,
        avx512bf16: false,
        avx512vnni: false,
        avxvnni: false,
        amx_int8: false,
        amx_bf16: false,
    }
}

/// Size of the data (or unified) cache of `level` of CPU 0, from sysfs.
fn cache_size(level: u32) -> Option<usize> {
    let base = Path::new("/sys/devices/system/cpu/cpu0/cache");
    for i in 0..8 {
        let dir = base.join(format!("index{i}"));
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok().map(|s| s.trim().to_string());
        if read("level")?.parse::<u32>().ok()? != level {
            continue;
        }
        if read("type").is_some_and(|t| t == "Instruction") {
            continue;
        }
        return parse_size(&read("size")?);
    }
    None
}

/// `48K`, `2048K`, `32M` → bytes.
fn parse_size(s: &str) -> Option<usize> {
    let (num, mult) = match s.chars().last()? {
        'K' => (&s[..s.len() - 1], 1 << 10),
        'M' => (&s[..s.len() - 1], 1 << 20),
        'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().ok().map(|n| n * mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("48K"), Some(48 << 10));
        assert_eq!(parse_size("2M"), Some(2 << 20));
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("x"), None);
    }

    #[test]
    fn detected_target_is_consistent() {
        let t = Target::detect();
        assert!(t.cores >= 1 && t.l1d > 0 && t.l2 >= t.l1d);
        assert_eq!(t.f32_lanes, if t.isa.avx512f { 16 } else { 8 });
        if let Some(a) = t.avx2_only() {
            assert!(!a.isa.avx512f && a.f32_lanes == 8 && a.vector_registers == 16);
        }
    }
}
