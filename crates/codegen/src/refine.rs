//! Measured dispatch of a model's weights at small row counts: the sample-driven
//! side of the hybrid analyzer (FTuner §IV, DietCode §5) at compile time.
//!
//! At a handful of rows a weight matmul streams its weight once and does little
//! else, and the analytical model's ranking of register tiles, operand access
//! and threads there is the least reliable: against exhaustive measurement it
//! misses by 24-80% on BERT's projections at M = 1. So for each weight class (its `k × n`,
//! packed layout and epilogue) the model's best few macro-kernels are measured at
//! [`ROWS`] with the weight streamed as it is in the model (copies enough to
//! overflow L3, taken in turn), and the winners become the dispatcher's tuned
//! table (`kernels::TunedSchedules`); from [`MODEL_FROM`] rows on the model
//! decides alone. Results are cached per machine beside the tile measurements,
//! so only a model's first compile on a machine measures.

use std::path::{Path, PathBuf};

use kernels::{
    execute, ALayout, BLayout, BOperand, Dispatcher, EpilogueArgs, KernelError, MacroKernel, MatMut, MatRef,
    Operands, PackedB, Problem, Schedule, TunedClass, TunedRow, TunedSchedules,
};
use plan::Epilogue;
use serde::{Deserialize, Serialize};

use crate::CodegenError;

/// The row counts measured.
pub const ROWS: [usize; 10] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512];
/// From here on the model's own choice (a table row that picks nothing). A row
/// count takes the nearest table row in log M (the 8-row pick serves 6-11 rows, the
/// 16-row pick 12-22, ..., the 512-row pick 363-724). Up to 64 rows the measured picks
/// (direct 8x48 or 4x48 tiles where the model takes packed ones) beat the model's
/// inside BERT-base and GPT-2: 8 tokens 3-21% faster, 12-16 tokens 10-17%, 24-32
/// tokens 6-10%, 48 tokens 4%, 64 level. (Session 10 found 32-row picks slower inside
/// BERT, measured one candidate after another; taking turns and the tie rule below
/// made them faster.) At 128-512 rows the model ranks direct tiles against packed
/// ones within its error: priced from a record of a slow phase it took packed 3x48
/// for BERT-base's weights at 200-512 rows where direct 8x48 or 9x48 measured 5-18%
/// faster (with a fresh record its picks there measured best), so those rows are
/// measured too. From about a thousand rows on the model's pick measured within 4%
/// of the best for three of four such products (the fourth, 1,024×768×3072, 21%
/// off, alone and with that record): left to the model for now.
pub const MODEL_FROM: usize = 725;
/// The largest product measured (floating-point operations of one call): past it
/// the row count is the model's, so that a weight as large as a 50k-word LM head
/// is measured at a few dozen rows (where the model misses most) in seconds, not
/// at hundreds of rows in half a minute.
const MAX_FLOPS: f64 = 4e9;
/// Macro-kernels measured per row count: the model's best ones.
const CANDIDATES: usize = 6;
/// Rounds each candidate is timed in, in turns (its best round counts).
const ROUNDS: usize = 5;
/// Candidates this close to the fastest count as tied (the fewest passes over the
/// weight win).
const TIE: f64 = 0.03;

/// A weight the model multiplies: `k × n`, packed in `layout`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightClass {
    pub k: usize,
    pub n: usize,
    pub layout: BLayout,
}

/// The cache file: every class measured on this machine, per epilogue.
#[derive(Default, Serialize, Deserialize)]
struct Refined {
    machine: String,
    threads: usize,
    entries: Vec<(String, TunedClass)>,
}

/// The cache file's name; version 2 measures the best of every thread count
/// too, version 6 at 8-64 rows too, in turns, ties to the fewest passes, version 7
/// with direct kernels that ask the next panel over their K loop, version 8 since
/// a debug build keeps a file of its own (`tuning::build_suffix`: a version 7 file
/// may hold a debug build's picks), version 9 at 128, 256 and 512 rows too, version 10
/// with weights packed whole read in either depth (ties to the L1 blocks), version 11
/// with a u8s8 family's A as codes, packed schedules only, version 12 with its
/// direct kernels reading those codes in place. An older
/// file is left alone and measured again; one file per element type.
pub fn path(dir: &Path, elem: kernels::ElemType, threads: usize) -> PathBuf {
    dir.join(format!("{}{threads}t{}.json", file_prefix(elem), crate::tuning::build_suffix()))
}

/// What every [`path`] of `elem` begins with (the thread count follows).
fn file_prefix(elem: kernels::ElemType) -> String {
    format!("refined-v12-{}-", elem.name())
}

/// Remove the measured dispatch of `elem` kernels (every thread count) from the
/// cache folder: its picks were measured beside a tile record that is being
/// replaced (`tuning::fresh_record`).
pub fn forget(dir: &Path, elem: kernels::ElemType) {
    // This build's files of `elem`: `path(dir, elem, threads)` for any thread count.
    let prefix = file_prefix(elem);
    let suffix = format!("t{}.json", crate::tuning::build_suffix());
    let stale = |name: &str| {
        name.strip_prefix(&prefix)
            .and_then(|rest| rest.strip_suffix(&suffix))
            .is_some_and(|threads| threads.parse::<usize>().is_ok())
    };
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        if e.file_name().to_str().is_some_and(stale) {
            if let Err(err) = std::fs::remove_file(e.path()) {
                tracing::warn!("cannot remove {}: {err}", e.path().display());
            }
        }
    }
}

fn key(e: &Epilogue) -> String {
    format!("{e:?}")
}

/// The tuned table of `d` (its family's epilogue `epilogue`) for `weights`: from
/// the cache in `dir` where it has them, measured on `pool` (and stored) otherwise.
pub fn refine(
    d: &Dispatcher,
    pool: &kernels::ThreadPool,
    epilogue: Epilogue,
    weights: &[WeightClass],
    dir: Option<&Path>,
) -> Result<TunedSchedules, CodegenError> {
    let threads = pool.threads();
    let machine = crate::tuning::machine_key(d.target());
    let mut cached: Refined = dir
        .and_then(|dir| std::fs::read(path(dir, d.family().elem(), threads)).ok())
        .and_then(|b| serde_json::from_slice(&b).ok())
        .filter(|r: &Refined| r.machine == machine && r.threads == threads)
        .unwrap_or_else(|| Refined { machine, threads, entries: Vec::new() });
    let k = key(&epilogue);
    let mut classes = Vec::new();
    let mut measured = false;
    for w in weights {
        let BLayout::Packed { .. } = w.layout else { continue };
        let at = cached.entries.iter().position(|(e, c)| *e == k && (c.k, c.n, c.b) == (w.k, w.n, w.layout));
        // A class measured for another family (the tiles measured again since,
        // with other kernels kept) is measured again for this one.
        let usable = |c: &TunedClass| {
            let one = TunedSchedules { threads, elem: d.family().elem(), classes: vec![c.clone()] };
            one.check(d).is_ok()
        };
        let class = match at {
            Some(i) if usable(&cached.entries[i].1) => cached.entries[i].1.clone(),
            _ => {
                let c = measure(d, pool, &epilogue, w)?;
                match at {
                    Some(i) => cached.entries[i] = (k.clone(), c.clone()),
                    None => cached.entries.push((k.clone(), c.clone())),
                }
                measured = true;
                c
            }
        };
        if !classes.iter().any(|c: &TunedClass| (c.k, c.n, c.b) == (class.k, class.n, class.b)) {
            classes.push(class);
        }
    }
    if let (true, Some(dir)) = (measured, dir) {
        crate::tuning::store_json(&path(dir, d.family().elem(), threads), &cached, "the measured dispatch");
    }
    Ok(TunedSchedules { threads, elem: d.family().elem(), classes })
}

/// Whether a `k × n` weight is measured at `m` rows (its product within
/// [`MAX_FLOPS`]); the model picks at the others.
fn measured_at(m: usize, k: usize, n: usize) -> bool {
    2.0 * (m * k * n) as f64 <= MAX_FLOPS
}

/// Add to `tried` the model's best schedule (in `ranked` order) of every value of
/// `key` that no schedule in `tried` has yet.
fn add_best_of_each<K: PartialEq>(
    d: &Dispatcher,
    p: &Problem,
    ranked: &[(f64, Schedule)],
    tried: &mut Vec<(MacroKernel, Schedule)>,
    key: impl Fn(&Schedule) -> K,
) {
    for (_, s) in ranked {
        if tried.iter().any(|(_, t)| key(t) == key(s)) {
            continue;
        }
        let mk = MacroKernel::pinned(s);
        if let Some(inst) = mk.instantiate(d, p) {
            tried.push((mk, inst));
        }
    }
}

/// Measure one weight class at [`ROWS`].
fn measure(
    d: &Dispatcher,
    pool: &kernels::ThreadPool,
    epilogue: &Epilogue,
    w: &WeightClass,
) -> Result<TunedClass, CodegenError> {
    let kerr = |e: KernelError| CodegenError::Kernel(e.to_string());
    let BLayout::Packed { nr, kc } = w.layout else {
        return Err(CodegenError::Kernel("measured dispatch is for packed weights".into()));
    };
    let (k, n) = (w.k, w.n);
    let b: Vec<f32> = (0..k * n).map(|i| ((i * 7919) % 97) as f32 / 97.0 - 0.5).collect();
    let bv = MatRef::row_major(&b, k, n).map_err(kerr)?;
    // As many copies as overflow L3 one and a half times: each call finds its
    // weight in memory, as a model's layer does.
    let bytes = (k * n * 4).max(1);
    let copies = (d.machine().l3 * 3 / 2 / bytes + 1).clamp(1, 16);
    let packed: Vec<PackedB> = (0..copies).map(|_| PackedB::of_elem(bv, nr, kc, d.family().elem())).collect();
    let rows = *ROWS.last().unwrap_or(&1);
    let a: Vec<f32> = (0..rows * k).map(|i| ((i * 31) % 17) as f32 / 17.0 - 0.5).collect();
    // A u8s8 product's A is a quantized activation's codes: measured so, since
    // AMX tiles copy codes' rows and convert floats, at different speeds. Its
    // direct schedules read them in place a word at a time
    // (`Dispatcher::schedule_of`), where they start on a word.
    let elem = d.family().elem();
    let codes: Vec<u8> = (0..rows * k).map(|i| ((i * 31) % 17) as u8).collect();
    let a_codes = elem == kernels::ElemType::U8S8;
    let words = (codes.as_ptr() as usize).is_multiple_of(4) && k.is_multiple_of(4);
    let measurable = |s: &Schedule| !a_codes || s.operands == Operands::Packed || words;
    let mut c = vec![0f32; rows * n];
    let bias = vec![0.25f32; n];
    let residual = vec![0.5f32; rows * n];
    let residual_codes = vec![3u8; rows * n];
    let mut kernels: Vec<MacroKernel> = Vec::new();
    let mut table = Vec::new();
    for &m in &ROWS {
        if !measured_at(m, k, n) {
            table.push(TunedRow { m, pick: None });
            continue;
        }
        let p = Problem { batch: 1, m, n, k, a: ALayout::RowMajor, b: w.layout };
        // The model's ranking, one schedule per macro-kernel, as the table would
        // instantiate it at run time.
        let mut ranked: Vec<(f64, Schedule)> = d
            .candidates(&p)
            .into_iter()
            .filter(measurable)
            .map(|s| (d.model().cost(d.machine(), d.family(), &p, &s), s))
            .collect();
        ranked.sort_by(|x, y| x.0.total_cmp(&y.0));
        let model = match (a_codes, ranked.first()) {
            (false, _) => d.choose(&p).map_err(kerr)?,
            (true, Some(r)) => r.1,
            // Nothing to measure: the model picks at run time.
            (true, None) => {
                table.push(TunedRow { m, pick: None });
                continue;
            }
        };
        let mut tried: Vec<(MacroKernel, Schedule)> = vec![(MacroKernel::pinned(&model), model)];
        for (_, s) in &ranked {
            if tried.len() >= CANDIDATES {
                break;
            }
            let mk = MacroKernel::pinned(s);
            if tried.iter().any(|(t, _)| *t == mk) {
                continue;
            }
            if let Some(inst) = mk.instantiate(d, &p) {
                tried.push((mk, inst));
            }
        }
        // And the best of every thread count the model's best few lack: the
        // fork-join cost and the share of bandwidth one thread gets are what the
        // model knows least about at a few rows, so both sides are measured.
        add_best_of_each(d, &p, &ranked, &mut tried, |s| s.grid.threads());
        // And the best of every register tile (with its operand access) still
        // missing: at a hundred rows and more the model's few best are often one
        // packed tile in several grids and blocks, while a taller direct tile, which
        // reads the weight fewer times, is what the model ranks worst against
        // measurement.
        add_best_of_each(d, &p, &ranked, &mut tried, |s| (s.operands, s.mr));
        // And the best of every K block depth a weight packed whole is read in
        // (`BLayout::serves`): the model prices the passes over C that its one
        // block saves, not its B panel's overflow of L1, which a few rows feel.
        add_best_of_each(d, &p, &ranked, &mut tried, |s| (s.operands, s.blocking.kc));
        let av = match a_codes {
            true => MatRef::of_codes(&codes[..m * k], m, k, k, 1).map_err(kerr)?,
            false => MatRef::row_major(&a[..m * k], m, k).map_err(kerr)?,
        };
        let rv = match epilogue.residual_codes {
            true => MatRef::of_codes(&residual_codes[..m * n], m, n, n, 1),
            false => MatRef::row_major(&residual[..m * n], m, n),
        }
        .map_err(kerr)?;
        let ep = EpilogueArgs {
            column_scale: epilogue.column_scale.then_some(&bias[..]),
            bias: epilogue.bias.then_some(&bias[..]),
            residual: epilogue.residual.then_some(rv),
            residuals: &[],
            params: &[1.0; plan::MAX_POINTWISE_PARAMS],
        };
        // The candidates take turns, a round each, and keep their best round: a slow
        // phase of the machine then falls on every candidate, not on one.
        let plans = tried.iter().map(|(_, s)| d.plan(s)).collect::<Result<Vec<_>, _>>().map_err(kerr)?;
        let mut secs = vec![f64::INFINITY; tried.len()];
        let mut turn = 0;
        for _ in 0..ROUNDS {
            for (plan, best) in plans.iter().zip(secs.iter_mut()) {
                let mut call = || -> Result<(), KernelError> {
                    turn += 1;
                    let cv = MatMut::new(&mut c[..m * n], m, n, n)?;
                    execute(pool, plan, &[av], &[BOperand::Packed(&packed[turn % copies])], &mut [cv], &ep)
                };
                *best = best.min(tune::calibrate::time_per_call(1, 0.002, &mut call).map_err(kerr)?);
            }
        }
        // Within `TIE` of the fastest, the fewest passes over the weight: in a model
        // (its other weights and activations beside it in the caches) a pass is worth
        // more than alone (BERT-base at 8 tokens: direct 8x48 6.7-6.9 ms, 4x48 8.1,
        // within a few percent of each other measured alone).
        let fastest = secs.iter().copied().fold(f64::INFINITY, f64::min);
        let passes = |mk: &MacroKernel| match mk.operands {
            Operands::Direct => m.div_ceil(mk.mr.max(1)),
            Operands::Packed => m.div_ceil(mk.mc.max(1)),
        };
        // Then the L1 blocks before a whole weight's one block: alone they
        // tie at a few dozen rows, inside a model the one block was slower
        // (BERT-base at 23 tokens: its 23x3072x768 products 6-12%).
        let one_block = |mk: &MacroKernel| {
            mk.kc >= k
                && !kernels::schedule::one_block_suffices(
                    k,
                    kernels::schedule::kc_for(d.target(), elem, mk.mr, mk.nr),
                )
        };
        let best = tried
            .iter()
            .zip(&secs)
            .filter(|(_, &t)| t <= fastest * (1.0 + TIE))
            .min_by(|a, b| {
                (passes(&a.0 .0), one_block(&a.0 .0))
                    .cmp(&(passes(&b.0 .0), one_block(&b.0 .0)))
                    .then(a.1.total_cmp(b.1))
            })
            .map(|((mk, _), &t)| (t, *mk));
        let pick = match best {
            Some((_, mk)) if mk != MacroKernel::pinned(&model) => {
                Some(kernels.iter().position(|k| *k == mk).unwrap_or_else(|| {
                    kernels.push(mk);
                    kernels.len() - 1
                }))
            }
            _ => None,
        };
        table.push(TunedRow { m, pick });
    }
    table.push(TunedRow { m: MODEL_FROM, pick: None });
    Ok(TunedClass { batch: 1, n, k, a: ALayout::RowMajor, b: w.layout, kernels, table })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// BERT-base's weights are measured at every row count; a 50k-word LM head
    /// only up to a few dozen rows.
    #[test]
    fn a_large_weight_is_measured_at_few_rows_only() {
        let rows = |k, n| ROWS.iter().copied().filter(|&m| measured_at(m, k, n)).collect::<Vec<_>>();
        assert_eq!(rows(3072, 768), ROWS.to_vec());
        assert_eq!(rows(768, 50257), vec![1, 2, 4, 8, 16, 32]);
        assert!(*ROWS.last().unwrap() < MODEL_FROM);
    }
}
