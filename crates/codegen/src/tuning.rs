//! The per-machine tuning cache: the measured lowest level (every register
//! tile's throughput) and the measured peak, stored once per machine so that a
//! second run needs no measurement (Vortex's hybrid analyzer measures L0 once).
//!
//! The record is JSON, one file per element type, keyed by the CPU name and
//! features LLVM sees and the vector width in use; a record of another machine,
//! or one that does not parse, is measured again and replaced.

use std::path::{Path, PathBuf};

use kernels::{ElemType, MachineModel, Packers, Target, ThreadPool, AMX_TILES};
use serde::{Deserialize, Serialize};

use plan::{Activation, Epilogue, Pointwise, PwOp, PwUnary};

use crate::{
    compile_microkernel, compile_microkernel_with, pick_tile, register_tiles, time_codes_sweep,
    time_direct_kernel, time_microkernel, CodegenError, JitMicroKernel, TileMeasurement, CODES_DEPTH,
};

/// What is stored for one machine and vector width.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TuningRecord {
    pub machine: String,
    /// The element type the kernels multiply.
    #[serde(default)]
    pub elem: ElemType,
    /// The kernel generator's version the rates were measured with ([`GENERATOR`]).
    #[serde(default)]
    pub generator: u32,
    pub tiles: Vec<TileMeasurement>,
    /// The same tiles as direct kernels (operands read in place; f32 in every
    /// family but u8s8, [`kernels::schedule::direct_elem`]).
    #[serde(default)]
    pub direct: Vec<TileMeasurement>,
    /// The calibrated analytical levels, one per thread count seen.
    #[serde(default)]
    pub models: Vec<MachineModel>,
    /// Thread counts whose model stayed implausible (see [`plausible`]) and when it
    /// was measured (seconds since the Unix epoch): it is used, and measured again
    /// once [`RETRY_SUSPECT_AFTER`] has passed.
    #[serde(default)]
    pub suspect: Vec<(usize, u64)>,
}

impl TuningRecord {
    /// What one thread reaches: the higher of the one-thread model's peak and the
    /// fastest measured tile (0 when the record has neither).
    pub fn single_peak(&self) -> f64 {
        let model = self.models.iter().find(|m| m.threads == 1).map_or(0.0, |m| m.peak_gflops);
        self.tiles.iter().map(|t| t.gflops).fold(model, f64::max)
    }
}

/// How long an implausible machine model is used before it is measured again: long
/// enough that a loaded machine (a test suite compiling hundreds of models) measures
/// it a few times at most, short enough that the next session on a quiet machine
/// replaces it.
pub const RETRY_SUSPECT_AFTER: u64 = 600;

/// The version of the kernel generator: a record measured with another version is
/// measured again (changed kernels have changed rates).
pub const GENERATOR: u32 = 15;

/// Timing passes over the whole family in [`measure`].
pub const PASSES: usize = 3;

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

/// What ends the names of a build's measurement files: `-debug` for a build with
/// debug assertions (the test suite's), nothing for a release build. A debug
/// build's bandwidth probes and contraction drivers are unoptimized code: what it
/// measures is not what a release build runs at, and when both wrote the same
/// files, the test suite's compiles left a release build a machine model of 3 GB/s
/// L2 reads and a measured dispatch that ran BERT-base's feed-forward products at
/// 23 to 64 rows on one thread.
pub fn build_suffix() -> &'static str {
    if cfg!(debug_assertions) {
        "-debug"
    } else {
        ""
    }
}

fn record_path(dir: &Path, t: &Target, elem: ElemType) -> PathBuf {
    dir.join(format!("tiles-{elem}-{}lanes{}.json", t.f32_lanes, build_suffix()))
}

/// The stored record of `elem` kernels for this machine, if there is a valid one.
pub fn load(dir: &Path, t: &Target, elem: ElemType) -> Option<TuningRecord> {
    let path = record_path(dir, t, elem);
    let text = std::fs::read_to_string(&path).ok()?;
    match serde_json::from_str::<TuningRecord>(&text) {
        Ok(r) if r.elem != elem => {
            tracing::warn!("{}: a record of {} kernels; measuring again", path.display(), r.elem);
            None
        }
        Ok(r) if r.machine == machine_key(t) && r.generator == GENERATOR && !r.tiles.is_empty() => Some(r),
        Ok(r) if r.machine == machine_key(t) && !r.tiles.is_empty() => {
            tracing::info!("{}: measured with older kernels; measuring again", path.display());
            None
        }
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

/// Measure every register tile of `t` multiplying `elem`, as a packed-panel
/// kernel and as a direct one (f32, or u8s8 in that family), and an AMX u8s8 tile also storing codes
/// ([`time_codes_sweep`]) (reporting progress: steps done, total), and
/// store the record. Every kernel is compiled first, then timed once per pass over
/// all of them, [`PASSES`] passes, each keeping its best: this machine has phases
/// of a second or more in which a core runs slower, and a tile timed only inside
/// one (three rounds back to back) was ranked below its peers and dropped from the
/// family. Passes a second apart see different phases.
pub fn measure(
    dir: Option<&Path>,
    t: &Target,
    elem: ElemType,
    progress: &dyn Fn(usize, usize),
) -> Result<TuningRecord, CodegenError> {
    let tiles = register_tiles(t);
    // The packed kernels' tiles: the register tiles, and AMX's where the
    // target multiplies `elem` in tiles (no direct form: those are f32).
    let mut packed_tiles = tiles.clone();
    packed_tiles
        .extend(AMX_TILES.iter().filter(|&&(mr, nr)| t.amx_tile(elem, mr, nr) && !tiles.contains(&(mr, nr))));
    let total = packed_tiles.len() * (1 + PASSES);
    let mut kernels = Vec::with_capacity(packed_tiles.len());
    for (i, &(mr, nr)) in packed_tiles.iter().enumerate() {
        let p = compile_microkernel_with(t, elem, mr, nr, Epilogue::default())?;
        let d = match i < tiles.len() {
            true => Some(crate::compile_direct_kernel_cached(
                t,
                kernels::schedule::direct_elem(elem),
                mr,
                nr,
                Epilogue::default(),
                &crate::ObjectCache::none(),
            )?),
            false => None,
        };
        // An AMX u8s8 tile also as a static quantization's products run it: storing codes.
        let codes = match elem == ElemType::U8S8 && t.amx_tile(elem, mr, nr) {
            true => Some(compile_microkernel_with(t, elem, mr, nr, codes_epilogue())?),
            false => None,
        };
        kernels.push((p, d, codes));
        progress(i + 1, total);
    }
    let n = packed_tiles.len();
    let (mut gp, mut gd, mut gc) = (vec![0.0f64; n], vec![0.0f64; tiles.len()], vec![0.0f64; n]);
    for pass in 0..PASSES {
        for (i, (p, d, codes)) in kernels.iter().enumerate() {
            // The forms of a tile in alternation, so that they share a phase.
            gp[i] = gp[i].max(time_microkernel(&p.kernel(), t));
            if let Some(d) = d {
                gd[i] = gd[i].max(time_direct_kernel(&d.kernel(), t));
            }
            if let Some(c) = codes {
                gc[i] = gc[i].max(time_codes_sweep(&c.kernel(), CODES_DEPTH));
            }
            progress(n * (1 + pass) + i + 1, total);
        }
    }
    let at = |tiles: &[(usize, usize)], g: &[f64], codes: &[f64]| -> Vec<TileMeasurement> {
        let codes = codes.iter().copied().chain(std::iter::repeat(0.0));
        tiles
            .iter()
            .zip(g)
            .zip(codes)
            .map(|((&(mr, nr), &gflops), codes_gflops)| TileMeasurement { mr, nr, gflops, codes_gflops })
            .collect()
    };
    let (packed, direct) = (at(&packed_tiles, &gp, &gc), at(&tiles, &gd, &[]));
    let record = TuningRecord {
        machine: machine_key(t),
        elem,
        generator: GENERATOR,
        tiles: packed,
        direct,
        models: Vec::new(),
        suspect: Vec::new(),
    };
    if let Some(dir) = dir {
        store(dir, t, &record);
    }
    Ok(record)
}

/// The epilogue [`time_codes_sweep`] times an AMX u8s8 tile with: a static
/// quantization's store (a scale per column, rounded, clamped to u8's codes).
pub fn codes_epilogue() -> Epilogue {
    let mut p = Pointwise::empty();
    // Three operations: well inside `MAX_POINTWISE_OPS`.
    let quantized = p
        .push(PwOp::Input)
        .and_then(|x| p.push(PwOp::Unary(PwUnary::Round, x)))
        .and_then(|r| p.push(PwOp::Integer { x: r, offset: 0, lo: 0, hi: 255 }));
    debug_assert!(quantized.is_some());
    Epilogue { column_scale: true, activation: Activation::Pointwise(p), codes: true, ..Epilogue::NONE }
}

/// Write `record` into the cache folder.
fn store(dir: &Path, t: &Target, record: &TuningRecord) {
    store_json(&record_path(dir, t, record.elem), record, "the tuning record");
}

/// Write `value` as JSON at `path` in the cache folder, atomically (a temporary
/// file renamed over the old one); a failure is a warning naming `what`.
pub(crate) fn store_json(path: &Path, value: &impl Serialize, what: &str) {
    let write = || -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        // Per process and thread: compiles on several threads may store at once.
        let tmp =
            path.with_extension(format!("json.{}.{:?}.tmp", std::process::id(), std::thread::current().id()));
        std::fs::write(&tmp, serde_json::to_string_pretty(value).unwrap_or_default())?;
        std::fs::rename(tmp, path)
    };
    if let Err(e) = write() {
        tracing::warn!("cannot store {what} in {}: {e}", path.display());
    }
}

/// This machine's tile measurements for `elem`, from the cache when it has them
/// (measured and stored otherwise). Returns whether they were cached.
pub fn record(dir: Option<&Path>, t: &Target, elem: ElemType) -> Result<(TuningRecord, bool), CodegenError> {
    match dir.and_then(|d| load(d, t, elem)) {
        Some(r) if !r.direct.is_empty() => Ok((r, true)),
        _ => Ok((measure(dir, t, elem, &|_, _| {})?, false)),
    }
}

/// How much faster than recorded this machine may run the record's fastest tile
/// before [`fresh_record`] measures the record again.
pub const OUTRUN: f64 = 1.10;

/// This machine's record for `elem`, as [`record`] gives it, measured again (its
/// machine models and the measured dispatch too, `refine::forget`) when the
/// record's fastest tile now runs more than [`OUTRUN`] times its recorded rate:
/// the record was taken in a slow phase of the machine or on another machine of
/// the same CPU and features (a home folder carried over, a shared cache). Such a
/// record had BERT-base at 23 tokens run 19-22 ms instead of 14-15: tiles recorded
/// at 200-213 GFLOP/s that now ran at 240-264, memory at 38 GB/s that now read 67,
/// so the model priced every product's compute too high against its loads. A
/// machine slower than its record keeps it (the record is the best of its passes;
/// a slow moment now is not the machine). Called once per compile, before the
/// families read the record side by side.
pub fn fresh_record(
    dir: Option<&Path>,
    t: &Target,
    elem: ElemType,
) -> Result<(TuningRecord, bool), CodegenError> {
    let (rec, cached) = record(dir, t, elem)?;
    let top = rec.tiles.iter().copied().max_by(|a, b| a.gflops.total_cmp(&b.gflops));
    let (true, Some(top)) = (cached, top) else {
        return Ok((rec, cached));
    };
    // From the object cache where the folder has one (an LLVM compile of the tile
    // costs more than timing it); its own, so the model's module counts are unchanged.
    let objects = dir.map_or_else(crate::ObjectCache::none, crate::ObjectCache::in_dir);
    let jit = crate::compile_microkernel_cached(t, elem, top.mr, top.nr, Epilogue::default(), &objects)?;
    let now = time_microkernel(&jit.kernel(), t);
    if now <= OUTRUN * top.gflops {
        return Ok((rec, true));
    }
    tracing::info!(
        "the {}x{} {elem} tile runs at {now:.0} GFLOP/s, recorded at {:.0}: measuring this machine again",
        top.mr,
        top.nr,
        top.gflops
    );
    if let Some(dir) = dir {
        crate::refine::forget(dir, elem);
    }
    // Each tile keeps the best of its passes, the old record's included: a record
    // only rises, so a machine whose phases differ measures again a few times at
    // most.
    let mut fresh = measure(None, t, elem, &|_, _| {})?;
    for (new, old) in [(&mut fresh.tiles, &rec.tiles), (&mut fresh.direct, &rec.direct)] {
        for m in new.iter_mut() {
            if let Some(o) = old.iter().find(|o| (o.mr, o.nr) == (m.mr, m.nr)) {
                m.gflops = m.gflops.max(o.gflops);
            }
        }
    }
    if let Some(dir) = dir {
        store(dir, t, &fresh);
    }
    Ok((fresh, false))
}

/// The record a compile (or a benchmark) starts from: [`fresh_record`] in a release
/// build; in a debug build (the test suite: hundreds of compiles at once on a loaded
/// machine, timing nothing) [`record`] as it is, since checking it would measure
/// again at every faster moment and remove measured dispatch files other compiles
/// are reading.
pub fn checked_record(
    dir: Option<&Path>,
    t: &Target,
    elem: ElemType,
) -> Result<(TuningRecord, bool), CodegenError> {
    if cfg!(debug_assertions) {
        record(dir, t, elem)
    } else {
        fresh_record(dir, t, elem)
    }
}

/// Whether a model's peak is what its threads can give, at least 3/4 of the threads
/// times one thread's peak (`single_peak`: the fastest measured tile at least),
/// and whether its L2 reads are at least a quarter of its packing's rate (packing
/// reads and writes the same caches). A model measured while another process held
/// a core fails the first, and so do the bandwidths measured beside its peak: such
/// a model misprices every schedule (a 2-thread peak of 179 GFLOP/s beside a
/// 1-thread one of 274 was cached while a build ran, and steered a whole model's
/// dispatch; a 1-thread peak of 116 beside tiles measured at 219 priced every
/// one-thread schedule at twice its time). A debug build's probes fail the second
/// by construction (unoptimized loops) and are not checked.
pub fn plausible(m: &MachineModel, single_peak: f64) -> bool {
    let peak = single_peak <= 0.0 || m.peak_gflops >= 0.75 * single_peak * m.threads.max(1) as f64;
    peak && (cfg!(debug_assertions) || plausible_reads(m))
}

/// Whether `m`'s L2 reads are at least a quarter of its packing's rate.
pub fn plausible_reads(m: &MachineModel) -> bool {
    m.l2_bw >= 0.25 * m.pack_a_bw
}

/// The record's model for `threads` if it can be used at time `now` (Unix seconds):
/// present, and plausible next to the record's one-thread model (when the record has
/// one), or implausible but measured less than [`RETRY_SUSPECT_AFTER`] ago.
pub fn cached_model(record: &TuningRecord, threads: usize, now: u64) -> Option<MachineModel> {
    let m = record.models.iter().find(|m| m.threads == threads)?;
    if plausible(m, record.single_peak()) {
        return Some(*m);
    }
    let since = record.suspect.iter().find(|s| s.0 == threads)?.1;
    (now.saturating_sub(since) < RETRY_SUSPECT_AFTER).then_some(*m)
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The analytical levels' machine model for `pool`'s thread count: from the
/// record when it has a usable one ([`cached_model`]), calibrated otherwise, with the
/// packing and the peak of the record's element type. A calibration that stays
/// implausible after a few tries (a core taken by another process throughout) is
/// stored as suspect: used, and measured again after [`RETRY_SUSPECT_AFTER`].
pub fn machine_model(
    dir: Option<&Path>,
    t: &Target,
    pool: &ThreadPool,
    record: &mut TuningRecord,
) -> MachineModel {
    let threads = pool.threads();
    if let Some(m) = cached_model(record, threads, unix_now()) {
        return m;
    }
    // A missing entry is measured; a suspect one past its time, again.
    record.models.retain(|m| m.threads != threads);
    record.suspect.retain(|s| s.0 != threads);
    // A shared machine may take a core away for seconds: a peak of all threads under
    // 3/4 of the threads times one thread's peak was measured in such a phase, and so
    // were the bandwidths beside it. Measure again, a few times, after a pause.
    let elem = record.elem;
    let peak = |pool: &ThreadPool, ms| crate::peak::measure_peak_gflops_of(t, elem, pool, ms).unwrap_or(0.0);
    // One thread's peak: measured now, or the record's (a quiet moment's) if higher:
    // a load on every core lowers both, and the ratio alone would not show it.
    let single = peak(&ThreadPool::new(1), 100).max(record.single_peak());
    // Packing is timed with the generated routines (the portable loops if those fail
    // to compile, as they would run then too).
    let jit = crate::compile_packers(t, elem, &[8, 2 * t.f32_lanes], &[]).ok();
    let packers = Packers {
        a: jit.as_ref().and_then(|j| j.get(8)),
        bt: jit.as_ref().and_then(|j| j.get(2 * t.f32_lanes)),
        a_rows: None,
        dequant: [None, None],
        dots: [None, None],
        a_words: None,
        a_rows_words: None,
    };
    let mut m = tune::calibrate::measure(t, pool, packers, elem);
    m.peak_gflops = peak(pool, 200);
    for _ in 0..4 {
        if plausible(&m, single) {
            break;
        }
        tracing::info!(
            "peak {:.0} GFLOP/s of {} threads is low; measuring again",
            m.peak_gflops,
            pool.threads()
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
        m = tune::calibrate::measure(t, pool, packers, elem);
        m.peak_gflops = peak(pool, 200);
    }
    if !plausible(&m, single) {
        tracing::warn!(
            "the machine model of {threads} threads stays implausible (peak {:.0} GFLOP/s against {:.0} for one \
             thread): another process holds a core; used, and measured again in {RETRY_SUSPECT_AFTER} s",
            m.peak_gflops,
            single
        );
        record.suspect.push((threads, unix_now()));
    }
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
    let (record, cached) = record(dir, t, ElemType::F32)?;
    let (mr, nr) = pick_tile(&record.tiles, min_mr)?;
    Ok((compile_microkernel(t, mr, nr)?, cached))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(threads: usize, peak: f64) -> MachineModel {
        MachineModel {
            threads,
            l1d: 48 << 10,
            l2: 1 << 20,
            l3: 32 << 20,
            dram_bw: 3e10,
            l3_bw: 3e10,
            l2_bw: 3e10,
            pack_a_bw: 5e10,
            pack_b_bw: 1.5e10,
            pack_bt_bw: 6e10,
            fork_join: 2e-7,
            peak_gflops: peak,
        }
    }

    fn record(models: Vec<MachineModel>, suspect: Vec<(usize, u64)>) -> TuningRecord {
        TuningRecord {
            machine: "test".into(),
            elem: ElemType::F32,
            generator: GENERATOR,
            tiles: vec![],
            direct: vec![],
            models,
            suspect,
        }
    }

    /// A debug build keeps its measurements in files of its own.
    #[test]
    fn a_debug_build_measures_into_its_own_files() {
        let t = Target::detect();
        let name = record_path(Path::new("/c"), &t, ElemType::F32);
        let refined = crate::refine::path(Path::new("/c"), ElemType::F32, 2);
        for p in [name, refined] {
            let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
            assert_eq!(stem.ends_with("-debug"), cfg!(debug_assertions), "{stem}");
        }
    }

    /// The cache this machine held: a 2-thread peak of 179 GFLOP/s beside a 1-thread
    /// peak of 274, calibrated while a build held a core. Without a suspect mark (a
    /// cache written before it existed) it is measured again; marked, it is used
    /// until its time has passed, so that a loaded machine does not measure at every
    /// compile. A plausible model is used, and so is one with nothing to check it
    /// against.
    #[test]
    fn an_implausible_cached_model_is_measured_again_in_time() {
        let contended = vec![model(2, 178.7), model(1, 273.8)];
        assert_eq!(cached_model(&record(contended.clone(), vec![]), 2, 1000), None);
        assert_eq!(cached_model(&record(contended.clone(), vec![]), 1, 1000), Some(contended[1]));
        let marked = record(contended.clone(), vec![(2, 1000)]);
        assert_eq!(cached_model(&marked, 2, 1000 + RETRY_SUSPECT_AFTER - 1), Some(contended[0]));
        assert_eq!(cached_model(&marked, 2, 1000 + RETRY_SUSPECT_AFTER), None);
        let quiet = record(vec![model(2, 546.0), model(1, 273.8)], vec![]);
        assert_eq!(cached_model(&quiet, 2, 0), Some(model(2, 546.0)));
        assert_eq!(cached_model(&quiet, 4, 0), None);
        assert_eq!(cached_model(&record(vec![model(2, 178.7)], vec![]), 2, 0), Some(model(2, 178.7)));
        assert!(plausible(&model(2, 0.75 * 2.0 * 273.8), 273.8));
        assert!(!plausible(&model(2, 0.74 * 2.0 * 273.8), 273.8));
        // A one-thread peak under 3/4 of the fastest tile the record measured (116
        // GFLOP/s beside tiles of 219 on a Zen 5) is measured again too.
        let mut slow_single = record(vec![model(2, 447.0), model(1, 115.7)], vec![]);
        slow_single.tiles = vec![TileMeasurement { mr: 9, nr: 32, gflops: 218.7, codes_gflops: 0.0 }];
        assert_eq!(cached_model(&slow_single, 1, 0), None);
        assert_eq!(cached_model(&slow_single, 2, 0), Some(model(2, 447.0)));
        assert!(!plausible(&model(2, 0.74 * 2.0 * 218.7), slow_single.single_peak()));
        // L2 read at 3.7 GB/s beside packing at 45 GB/s: the probes of a debug build
        // (or a stolen core), never a release build's on a quiet machine.
        let starved = MachineModel { l2_bw: 3.7e9, pack_a_bw: 4.5e10, ..model(1, 219.0) };
        assert!(!plausible_reads(&starved));
        assert!(plausible_reads(&model(1, 219.0)));
        assert_eq!(plausible(&starved, 219.0), cfg!(debug_assertions));
        // Old caches (no `suspect` field) still load.
        let json = r#"{"machine": "m", "tiles": [], "models": []}"#;
        assert!(serde_json::from_str::<TuningRecord>(json).unwrap().suspect.is_empty());
    }
}
