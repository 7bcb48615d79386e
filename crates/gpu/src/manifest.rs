//! The compiled family's manifest: which kernels a folder holds (PTX, cubin), what
//! ptxas said of each (registers, spills, warnings), written by the build on the
//! compiler's machine and read by the runner on the GPU machine.

use crate::kernel::{GemmKernel, ReduceKernel};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// What `ptxas -v` reported for one kernel.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtxasReport {
    pub registers: usize,
    pub spill_stores: usize,
    pub spill_loads: usize,
    pub stack_frame: usize,
    /// Warning lines, verbatim (a wgmma serialization warning is C7510-C7520).
    pub warnings: Vec<String>,
}

impl PtxasReport {
    /// Parses ptxas's `-v` output (its stderr) for the function `name`.
    pub fn parse(output: &str, name: &str) -> Result<PtxasReport, String> {
        let mut r = PtxasReport::default();
        let mut in_fn = false;
        let mut seen = false;
        let number_before = |line: &str, word: &str| -> Option<usize> {
            let at = line.find(word)?;
            line[..at].split_whitespace().last()?.parse().ok()
        };
        for line in output.lines() {
            if line.contains("warning") {
                r.warnings.push(line.trim().to_string());
            }
            if line.contains("Function properties for") || line.contains("Compiling entry function") {
                in_fn = line.contains(&format!("'{name}'")) || line.trim_end().ends_with(name);
                continue;
            }
            if !in_fn {
                continue;
            }
            if line.contains("bytes stack frame") {
                r.stack_frame = number_before(line, "bytes stack frame").unwrap_or(0);
                r.spill_stores = number_before(line, "bytes spill stores").unwrap_or(0);
                r.spill_loads = number_before(line, "bytes spill loads").unwrap_or(0);
            }
            if line.contains("Used") && line.contains("registers") {
                let at = line.find("Used").unwrap_or(0);
                r.registers = number_before(&line[at..], "registers")
                    .ok_or_else(|| format!("unreadable ptxas line: {line}"))?;
                seen = true;
            }
        }
        if !seen {
            return Err(format!("ptxas reported no register count for {name}"));
        }
        Ok(r)
    }

    /// Spills or serialization warnings: what the build refuses.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.spill_stores > 0 || self.spill_loads > 0 {
            p.push(format!("spills: {} bytes stored, {} loaded", self.spill_stores, self.spill_loads));
        }
        for w in &self.warnings {
            p.push(format!("warning: {w}"));
        }
        p
    }
}

/// One kernel of the folder.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    pub kernel: GemmKernel,
    pub name: String,
    /// File names inside the folder.
    pub ptx: String,
    pub cubin: Option<String>,
    /// Per ptxas target (`sm_80`, `sm_90a`).
    pub ptxas: Vec<(String, PtxasReport)>,
}

/// A split-K reduction kernel of the folder.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReducerEntry {
    pub kernel: ReduceKernel,
    pub name: String,
    pub ptx: String,
    pub cubin: Option<String>,
}

/// A compiled family.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The ptxas target the cubins were assembled for.
    pub cubin_arch: Option<String>,
    pub entries: Vec<ManifestEntry>,
    #[serde(default)]
    pub reducers: Vec<ReducerEntry>,
}

impl Manifest {
    pub const FILE: &'static str = "manifest.json";

    pub fn load(dir: &Path) -> Result<Manifest, String> {
        let path = dir.join(Self::FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let m: Manifest = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        // An entry's name is its kernel's: the name is what the PTX is found by.
        let named = |entry: &str, kernel: String| -> Result<(), String> {
            if entry == kernel {
                Ok(())
            } else {
                Err(format!("{}: entry {entry} describes kernel {kernel}", path.display()))
            }
        };
        for e in &m.entries {
            e.kernel.check().map_err(|err| format!("{}: {err}", path.display()))?;
            named(&e.name, e.kernel.name())?;
        }
        for r in &m.reducers {
            named(&r.name, r.kernel.name())?;
        }
        Ok(m)
    }

    pub fn save(&self, dir: &Path) -> Result<(), String> {
        let path = dir.join(Self::FILE);
        let text = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
    }
}
