//! `Target`: what the code generator and the cost models know about the machine,
//! detected on it (CPUID through `std`, cache sizes from sysfs), never hard-coded.

use std::path::Path;

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
            isa: Isa { avx512f: false, avx512bf16: false, avx512vnni: false, ..self.isa },
            f32_lanes: 8,
            vector_registers: 16,
            ..self.clone()
        })
    }

    /// Whether kernels can be generated for this target at all (x86-64 with AVX2 + FMA).
    pub fn supported(&self) -> bool {
        self.isa.avx2 && self.isa.fma
    }
}

#[cfg(target_arch = "x86_64")]
fn detect_isa() -> Isa {
    Isa {
        avx2: std::arch::is_x86_feature_detected!("avx2"),
        fma: std::arch::is_x86_feature_detected!("fma"),
        avx512f: std::arch::is_x86_feature_detected!("avx512f"),
        avx512bf16: std::arch::is_x86_feature_detected!("avx512bf16"),
        avx512vnni: std::arch::is_x86_feature_detected!("avx512vnni"),
        avxvnni: std::arch::is_x86_feature_detected!("avxvnni"),
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect_isa() -> Isa {
    Isa { avx2: false, fma: false, avx512f: false, avx512bf16: false, avx512vnni: false, avxvnni: false }
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
