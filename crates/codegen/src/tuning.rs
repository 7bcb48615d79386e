//! The per-machine tuning cache: the measured lowest level (every register
//! tile's throughput) and the measured peak, stored once per machine so that a
//! second run needs no measurement (Vortex's hybrid analyzer measures L0 once).
//!
//! The record is JSON, keyed by the CPU name and features LLVM sees and the
//! vector width in use; a record of another machine, or one that does not parse,
//! is measured again and replaced.

use std::path::{Path, PathBuf};

use kernels::{MachineModel, Target, ThreadPool};
use serde::{Deserialize, Serialize};

use kernels::Epilogue;

use crate::{
    compile_direct_kernel, compile_microkernel, pick_tile, register_tiles, time_direct_kernel,
    time_microkernel, CodegenError, JitMicroKernel, TileMeasurement,
};

/// What is stored for one machine and vector width.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TuningRecord {
    pub machine: String,
    pub tiles: Vec<TileMeasurement>,
    /// The same tiles as direct kernels (operands read in place).
    #[serde(default)]
    pub direct: Vec<TileMeasurement>,
    /// The calibrated analytical levels, one per thread count seen.
    #[serde(default)]
    pub models: Vec<MachineModel>,
}

/// The machine key: CPU name, features and lanes.
pub fn machine_key(t: &Target) -> String {
    use inkwell::targets::TargetMachine;
    format!(
        "{} {} lanes={}",
        TargetMachine::get_host_cpu_name().to_string(),
        TargetMachine::get_host_cpu_features().to_string(),
        t.f32_lanes
    )
}

/// Where the cache lives: `$ANYSHAPE_CACHE_DIR`, else `$XDG_CACHE_HOME/anyshape`,
/// else `~/.cache/anyshape`.
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("ANYSHAPE_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("anyshape"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("anyshape"))
}

fn record_path(dir: &Path, t: &Target) -> PathBuf {
    dir.join(format!("tiles-f32-{}lanes.json", t.f32_lanes))
}

/// The stored record for this machine, if there is a valid one.
pub fn load(dir: &Path, t: &Target) -> Option<TuningRecord> {
    let path = record_path(dir, t);
    let text = std::fs::read_to_string(&path).ok()?;
    match serde_json::from_str::<TuningRecord>(&text) {
        Ok(r) if r.machine == machine_key(t) && !r.tiles.is_empty() => Some(r),
        Ok(_) => {
            tracing::warn!("{}: recorded for another machine; measuring again", path.display());
            None
        }
        Err(e) => {
            tracing::warn!("{}: unreadable ({e}); measuring again", path.display());
            None
        }
    }
}

/// Measure every register tile of `t`, as a packed-panel kernel and as a direct
/// one (reporting progress: done, total), and store the record.
pub fn measure(
    dir: Option<&Path>,
    t: &Target,
    progress: &dyn Fn(usize, usize),
) -> Result<TuningRecord, CodegenError> {
    let tiles = register_tiles(t);
    let mut out = Vec::with_capacity(tiles.len());
    for (i, (mr, nr)) in tiles.iter().enumerate() {
        let jit = compile_microkernel(t, *mr, *nr)?;
        out.push(TileMeasurement { mr: *mr, nr: *nr, gflops: time_microkernel(&jit.kernel(), t) });
        progress(i + 1, 2 * tiles.len());
    }
    let direct = measure_direct(t, &|i, n| progress(n + i, 2 * n))?;
    let record = TuningRecord { machine: machine_key(t), tiles: out, direct, models: Vec::new() };
    if let Some(dir) = dir {
        store(dir, t, &record);
    }
    Ok(record)
}

/// Every register tile of `t` as a direct kernel, measured.
fn measure_direct(t: &Target, progress: &dyn Fn(usize, usize)) -> Result<Vec<TileMeasurement>, CodegenError> {
    let tiles = register_tiles(t);
    let mut out = Vec::with_capacity(tiles.len());
    for (i, (mr, nr)) in tiles.iter().enumerate() {
        let jit = compile_direct_kernel(t, *mr, *nr, Epilogue::default())?;
        out.push(TileMeasurement { mr: *mr, nr: *nr, gflops: time_direct_kernel(&jit.kernel(), t) });
        progress(i + 1, tiles.len());
    }
    Ok(out)
}

/// Write `record` (atomically: a temporary file renamed over the old one).
fn store(dir: &Path, t: &Target, record: &TuningRecord) {
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let tmp = record_path(dir, t).with_extension(format!("json.{}.tmp", std::process::id()));
        std::fs::write(&tmp, serde_json::to_string_pretty(record).unwrap_or_default())?;
        std::fs::rename(tmp, record_path(dir, t))
    };
    if let Err(e) = write() {
        tracing::warn!("cannot store the tuning record in {}: {e}", dir.display());
    }
}

/// This machine's tile measurements, from the cache when it has them (measured
/// and stored otherwise). Returns whether they were cached.
pub fn record(dir: Option<&Path>, t: &Target) -> Result<(TuningRecord, bool), CodegenError> {
    match dir.and_then(|d| load(d, t)) {
        Some(r) if !r.direct.is_empty() => Ok((r, true)),
        // A record from before direct kernels: measure those only.
        Some(mut r) => {
            r.direct = measure_direct(t, &|_, _| {})?;
            if let Some(dir) = dir {
                store(dir, t, &r);
            }
            Ok((r, false))
        }
        None => Ok((measure(dir, t, &|_, _| {})?, false)),
    }
}

/// The analytical levels' machine model for `pool`'s thread count: from the
/// record when it has one, calibrated (and stored) otherwise.
pub fn machine_model(
    dir: Option<&Path>,
    t: &Target,
    pool: &ThreadPool,
    record: &mut TuningRecord,
) -> MachineModel {
    if let Some(m) = record.models.iter().find(|m| m.threads == pool.threads()) {
        return *m;
    }
    let mut m = kernels::calibrate::measure(t, pool);
    m.peak_gflops = crate::peak::measure_peak_gflops(t, pool, 200).unwrap_or(0.0);
    record.models.push(m);
    if let Some(dir) = dir {
        store(dir, t, record);
    }
    m
}

/// The micro-kernel for `t` (rows ≥ `min_mr`), from the cache when it has this
/// machine, measuring (and storing) otherwise. Returns whether it was cached.
pub fn select_cached(
    dir: Option<&Path>,
    t: &Target,
    min_mr: usize,
) -> Result<(JitMicroKernel, bool), CodegenError> {
    let (record, cached) = record(dir, t)?;
    let (mr, nr) = pick_tile(&record.tiles, min_mr)?;
    Ok((compile_microkernel(t, mr, nr)?, cached))
}
