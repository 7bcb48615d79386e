//! A contraction compiled once for every shape: its kernel family (the L0 level of
//! the schedule space: for each tile width the fastest height and the lower
//! heights that cover remainders), generated with the group's epilogue, and the
//! [`Dispatcher`] that picks the schedule per bound shape at run time.

use std::path::Path;

use kernels::{
    CostModel, DirectVariant, Dispatcher, ElemType, KernelFamily, KernelVariant, Packers, Target, ThreadPool,
};
use plan::Epilogue;
use tune::categorize::KernelId;

use crate::tuning::{machine_model, record};
use crate::{
    compile_direct_kernel_cached, compile_microkernel_cached, compile_packers_cached, CodegenError,
    JitDirectKernel, JitMicroKernel, JitPackers, ObjectCache, TileMeasurement,
};

/// The tiles of a family, from the measured register tiles: per width, the main
/// height (fastest, ties within 3% to the lower) and the heights 1, 2, 4 and half
/// the main one below it, the cover kernels of FTuner's two-height combination.
pub fn family_tiles(measured: &[TileMeasurement]) -> Vec<TileMeasurement> {
    pick_heights(measured, false)
}

/// The measured tiles as a family with `epilogue` ranks and prices them: one
/// storing codes by each tile's rate storing codes where that was measured (an
/// AMX u8s8 tile's, [`crate::time_codes_sweep`]), every other by its rate on
/// L1's panels.
pub fn rates_for(measured: &[TileMeasurement], epilogue: &Epilogue) -> Vec<TileMeasurement> {
    let codes = |t: &TileMeasurement| epilogue.codes && t.codes_gflops > 0.0;
    measured
        .iter()
        .map(|t| TileMeasurement { gflops: if codes(t) { t.codes_gflops } else { t.gflops }, ..*t })
        .collect()
}

/// The direct kernels of a family: per width, the main height is the highest
/// within [`kernels::DIRECT_TIE`] of the fastest (a direct kernel pads nothing,
/// and a higher tile covers small products in fewer calls and passes over B),
/// with the heights 1, 2, 4, 8 and half the main one below it: any remainder is
/// covered in a few calls.
pub fn direct_family_tiles(measured: &[TileMeasurement]) -> Vec<TileMeasurement> {
    pick_heights(measured, true)
}

fn pick_heights(measured: &[TileMeasurement], direct: bool) -> Vec<TileMeasurement> {
    let mut widths: Vec<usize> = measured.iter().map(|m| m.nr).collect();
    widths.sort_unstable();
    widths.dedup();
    let mut out = Vec::new();
    for nr in widths {
        let of_width: Vec<&TileMeasurement> = measured.iter().filter(|m| m.nr == nr).collect();
        let top = of_width.iter().map(|m| m.gflops).fold(0.0, f64::max);
        let tie = if direct { kernels::DIRECT_TIE } else { kernels::PACKED_TIE };
        let tied = of_width.iter().filter(|m| m.gflops >= (1.0 - tie) * top).map(|m| m.mr);
        let Some(main) = (if direct { tied.max() } else { tied.min() }) else {
            continue;
        };
        let mut heights = vec![1, 2, 4, main / 2, main];
        if direct {
            heights.push(8);
        }
        heights.retain(|&h| h >= 1 && h <= main);
        heights.sort_unstable();
        heights.dedup();
        out.extend(of_width.iter().filter(|m| heights.contains(&m.mr)).map(|m| **m));
    }
    out
}

/// One contraction, compiled: its machine code and its dispatcher. `Send + Sync`:
/// any number of threads may run it at once.
pub struct Contraction {
    dispatcher: Dispatcher,
    // Own the machine code the dispatcher's kernels point into: declared after the
    // dispatcher, so they are dropped after it.
    jit: Vec<JitMicroKernel>,
    direct: Vec<JitDirectKernel>,
    packers: Vec<JitPackers>,
}

/// How to compile a [`Contraction`]: the epilogue fused into its kernels, the
/// model that picks schedules, the tuning cache, and optionally a subset of the
/// family or the portable packing loops (to measure what generated packing gains).
#[derive(Clone, Copy)]
pub struct ContractionBuilder<'a> {
    target: &'a Target,
    pool: &'a ThreadPool,
    epilogue: Epilogue,
    model: CostModel,
    cache: Option<&'a Path>,
    keep: Option<&'a [KernelId]>,
    generated_packing: bool,
    elem: ElemType,
    progress: Option<crate::ProgressFn<'a>>,
    objects: Option<&'a ObjectCache>,
}

impl<'a> ContractionBuilder<'a> {
    /// Take and keep the kernels' objects in `objects` (default: compile all).
    pub fn objects(self, objects: &'a ObjectCache) -> Self {
        ContractionBuilder { objects: Some(objects), ..self }
    }
    /// Report each kernel compiled to `p` (after announcing how many there are).
    pub fn progress(self, p: crate::ProgressFn<'a>) -> Self {
        ContractionBuilder { progress: Some(p), ..self }
    }
    pub fn epilogue(self, epilogue: Epilogue) -> Self {
        ContractionBuilder { epilogue, ..self }
    }
    pub fn model(self, model: CostModel) -> Self {
        ContractionBuilder { model, ..self }
    }
    /// The tuning cache folder (none: measure everything now, store nothing).
    pub fn cache(self, cache: Option<&'a Path>) -> Self {
        ContractionBuilder { cache, ..self }
    }
    /// Only the kernels in `keep`: the family a shape distribution needs
    /// ([`tune::categorize`]), smaller and quicker to compile.
    pub fn keep(self, keep: Option<&'a [KernelId]>) -> Self {
        ContractionBuilder { keep, ..self }
    }
    /// The element type the kernels multiply (f32 by default; bf16 packs both
    /// operands to bf16 and accumulates in f32). Direct kernels are f32 only.
    pub fn elem(self, elem: ElemType) -> Self {
        ContractionBuilder { elem, ..self }
    }
    /// Pack with the generated routines (the default) or the portable loops.
    pub fn generated_packing(self, generated_packing: bool) -> Self {
        ContractionBuilder { generated_packing, ..self }
    }

    /// Compile the family from this machine's measured tiles (cached, measured now
    /// otherwise) and calibrate the analytical levels for the pool's threads.
    pub fn build(self) -> Result<Contraction, CodegenError> {
        let (target, epilogue, keep, elem) = (self.target, self.epilogue, self.keep, self.elem);
        let none = ObjectCache::none();
        let objects = self.objects.unwrap_or(&none);
        target.check_elem(elem).map_err(|e| CodegenError::Unsupported(e.to_string()))?;
        let (mut rec, _) = record(self.cache, target, elem)?;
        let machine = machine_model(self.cache, target, self.pool, &mut rec);
        let kept = |direct: bool, t: &TileMeasurement| {
            keep.is_none_or(|k| k.contains(&KernelId { direct, mr: t.mr, nr: t.nr }))
        };
        let mut tiles = family_tiles(&rates_for(&rec.tiles, &epilogue));
        tiles.retain(|t| kept(false, t));
        // The direct kernels: the same choice of heights per width, from their own rates.
        let mut direct_tiles = direct_family_tiles(&rec.direct);
        let delem = kernels::schedule::direct_elem(elem);
        // f32 direct kernels store floats: a family storing codes has them in u8s8 only.
        direct_tiles.retain(|t| kept(true, t) && (!epilogue.codes || delem == ElemType::U8S8));
        // One packing routine per panel width: A's heights, and B's widths, in the
        // family's type; the direct kernels' B panels are f32 in every family but
        // u8s8 (whose direct kernels read a packed weight's words: no pack).
        let (mut widths, mut f32_widths, mut rows_widths) = (Vec::new(), Vec::new(), Vec::new());
        // u8s8's A from 8-bit codes in memory: their 4-byte words copied as f32
        // lanes, by rows and by address.
        let mut f32_rows_widths = Vec::new();
        if self.generated_packing {
            // A's heights also read a convolution's taps (rows by address); an
            // AMX tile's A is packed a row at a time.
            let a_width = |t: &TileMeasurement| match target.amx_tile(elem, t.mr, t.nr) {
                true => 1,
                false => t.mr,
            };
            rows_widths.extend(tiles.iter().map(a_width));
            widths.extend(tiles.iter().map(a_width));
            // A transposed B's routine writes whole words (i16s8's B, a weight,
            // is packed once by the portable loop).
            if elem.b_word_bytes() == 4 {
                widths.extend(tiles.iter().map(|t| t.nr));
            }
            let direct_widths = direct_tiles.iter().map(|t| t.nr);
            match delem {
                ElemType::F32 if elem == ElemType::F32 => widths.extend(direct_widths),
                ElemType::F32 => f32_widths.extend(direct_widths),
                _ => {}
            }
            if elem == ElemType::U8S8 {
                // (AMX tiles copy their codes' rows themselves.)
                let vector = || tiles.iter().filter(|t| a_width(t) == t.mr).map(|t| t.mr);
                f32_widths.extend(vector());
                f32_rows_widths.extend(vector());
            }
        }
        let report = |p: crate::Progress| {
            if let Some(f) = self.progress {
                f(p)
            }
        };
        report(crate::Progress::Add(
            1 + usize::from(!f32_widths.is_empty()) + tiles.len() + direct_tiles.len(),
        ));
        let mut packers = vec![compile_packers_cached(target, elem, &widths, &rows_widths, objects)?];
        report(crate::Progress::Done);
        if !f32_widths.is_empty() {
            packers.push(compile_packers_cached(
                target,
                ElemType::F32,
                &f32_widths,
                &f32_rows_widths,
                objects,
            )?);
            report(crate::Progress::Done);
        }
        let find = |e: ElemType, w: usize| packers.iter().find_map(|p| p.get(w).filter(|q| q.elem == e));
        let find_rows =
            |e: ElemType, w: usize| packers.iter().find_map(|p| p.get_rows(w).filter(|q| q.elem == e));
        let find_dequant = |e: ElemType, w: usize, bits: u32| {
            packers.iter().filter(|_| e == ElemType::F32).find_map(|p| p.get_dequantizer(w, bits))
        };
        let find_dot = |e: ElemType, w: usize, bits: u32| {
            packers.iter().filter(|_| e == ElemType::F32).find_map(|p| p.get_code_dot(w, bits))
        };
        let packers_of = |e: ElemType, mr: Option<usize>, nr: usize| Packers {
            a: mr.and_then(|w| find(e, w)),
            bt: find(e, nr).filter(|_| e.b_word_bytes() == 4),
            a_rows: mr.and_then(|w| find_rows(e, w)),
            dequant: [find_dequant(e, nr, 4), find_dequant(e, nr, 8)],
            dots: [find_dot(e, nr, 4), find_dot(e, nr, 8)],
            a_words: mr.filter(|_| e == ElemType::U8S8).and_then(|w| find(ElemType::F32, w)),
            a_rows_words: mr.filter(|_| e == ElemType::U8S8).and_then(|w| find_rows(ElemType::F32, w)),
        };
        let mut jit = Vec::with_capacity(tiles.len());
        let mut variants = Vec::with_capacity(tiles.len());
        for t in &tiles {
            let k = compile_microkernel_cached(target, elem, t.mr, t.nr, epilogue, objects)?;
            let k0 = k.kernel();
            let kernel = kernels::MicroKernel { packers: packers_of(elem, Some(k0.a_width()), t.nr), ..k0 };
            variants.push(KernelVariant { kernel, gflops: t.gflops });
            jit.push(k);
            report(crate::Progress::Done);
        }
        let mut direct = Vec::with_capacity(direct_tiles.len());
        let mut direct_variants = Vec::with_capacity(direct_tiles.len());
        for t in &direct_tiles {
            let k = compile_direct_kernel_cached(target, delem, t.mr, t.nr, epilogue, objects)?;
            let packers = match delem {
                ElemType::F32 => packers_of(ElemType::F32, None, t.nr),
                _ => Packers::default(),
            };
            let kernel = kernels::DirectKernel { packers, ..k.kernel() };
            direct_variants.push(DirectVariant { kernel, gflops: t.gflops });
            direct.push(k);
            report(crate::Progress::Done);
        }
        let unsupported = |e: kernels::KernelError| CodegenError::Unsupported(e.to_string());
        let family =
            KernelFamily::new(variants).and_then(|f| f.with_direct(direct_variants)).map_err(unsupported)?;
        Ok(Contraction {
            dispatcher: Dispatcher::new(target.clone(), family, machine, self.model),
            jit,
            direct,
            packers,
        })
    }
}

impl Contraction {
    /// A builder with the defaults: no epilogue, the hierarchical model, no cache,
    /// the whole family, generated packing.
    pub fn builder<'a>(target: &'a Target, pool: &'a ThreadPool) -> ContractionBuilder<'a> {
        ContractionBuilder {
            target,
            pool,
            epilogue: Epilogue::default(),
            model: CostModel::default(),
            cache: None,
            keep: None,
            generated_packing: true,
            elem: ElemType::F32,
            progress: None,
            objects: None,
        }
    }

    /// Compile the whole family for `epilogue` with `model` (the builder's short form).
    pub fn compile(
        target: &Target,
        pool: &ThreadPool,
        epilogue: Epilogue,
        model: CostModel,
        cache: Option<&Path>,
    ) -> Result<Contraction, CodegenError> {
        Contraction::builder(target, pool).epilogue(epilogue).model(model).cache(cache).build()
    }

    /// This contraction with the macro-kernels a search tuned
    /// ([`Dispatcher::with_tuned`]).
    pub fn with_tuned(self, tuned: kernels::TunedSchedules) -> Result<Contraction, CodegenError> {
        let Contraction { dispatcher, jit, direct, packers } = self;
        let dispatcher =
            dispatcher.with_tuned(tuned).map_err(|e| CodegenError::Unsupported(e.to_string()))?;
        Ok(Contraction { dispatcher, jit, direct, packers })
    }

    pub fn dispatcher(&self) -> &Dispatcher {
        &self.dispatcher
    }

    /// The dispatcher, and the owner of the machine code its kernels point into
    /// (to be kept alive as long as the dispatcher runs: a runtime holds both
    /// without knowing about LLVM).
    pub fn into_parts(self) -> (Dispatcher, Vec<kernels::CodeImage>) {
        let Contraction { dispatcher, jit, direct, packers } = self;
        let mut images: Vec<kernels::CodeImage> = jit.into_iter().map(|k| k.into_image()).collect();
        images.extend(direct.into_iter().map(|k| k.into_image()));
        images.extend(packers.into_iter().map(|p| p.into_image()));
        (dispatcher, images)
    }

    /// The compiled packed-panel kernels (their IR and assembly, for `--dump-llvm`).
    pub fn kernels(&self) -> &[JitMicroKernel] {
        &self.jit
    }

    /// The compiled direct kernels.
    pub fn direct_kernels(&self) -> &[JitDirectKernel] {
        &self.direct
    }

    /// The compiled packing routines: the family's type's, and for a family of
    /// another type than f32, the f32 ones of its direct kernels.
    pub fn packers(&self) -> &[JitPackers] {
        &self.packers
    }
}

impl std::ops::Deref for Contraction {
    type Target = Dispatcher;
    fn deref(&self) -> &Dispatcher {
        &self.dispatcher
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tile(mr: usize, nr: usize, gflops: f64) -> TileMeasurement {
        TileMeasurement { mr, nr, gflops, codes_gflops: 0.0 }
    }

    /// The rates this Zen 5 measured for the 48-wide tiles: the direct family takes
    /// the tallest within `DIRECT_TIE` (9 rows, 3.6% below 4x48), the packed one the
    /// lowest within 3% (3 rows; the packed 9x48 tied with it).
    #[test]
    fn a_direct_family_keeps_the_tallest_tile_within_its_tie() {
        let direct: Vec<TileMeasurement> = [83.1, 145.3, 184.0, 208.9, 192.9, 189.6, 199.0, 202.6, 201.3]
            .iter()
            .enumerate()
            .map(|(i, &g)| tile(i + 1, 48, g))
            .collect();
        let heights = |tiles: Vec<TileMeasurement>| tiles.iter().map(|t| t.mr).collect::<Vec<_>>();
        assert_eq!(heights(direct_family_tiles(&direct)), vec![1, 2, 4, 8, 9]);
        let packed: Vec<TileMeasurement> = [82.0, 145.3, 211.3, 199.3, 207.7, 212.7, 211.0, 210.0, 211.2]
            .iter()
            .enumerate()
            .map(|(i, &g)| tile(i + 1, 48, g))
            .collect();
        assert_eq!(heights(family_tiles(&packed)), vec![1, 2, 3]);
        // A tile more than the tie below the fastest is no main height.
        let slow = vec![tile(1, 32, 80.0), tile(4, 32, 200.0), tile(12, 32, 185.0)];
        assert_eq!(heights(direct_family_tiles(&slow)), vec![1, 4]);
    }

    /// A family storing codes ranks and prices its tiles by their rates storing
    /// codes where measured (this Emerald Rapids' AMX tiles: 32×32 first on L1's
    /// panels, 16×64 and 16×32 ahead storing codes), every other family, and
    /// every tile without that rate, by the rate on L1's panels.
    #[test]
    fn a_family_storing_codes_ranks_tiles_by_their_rate_storing_codes() {
        let amx = |mr, nr, gflops, codes_gflops| TileMeasurement { mr, nr, gflops, codes_gflops };
        let measured = vec![
            tile(1, 32, 214.0),
            tile(8, 32, 737.0),
            amx(16, 32, 1626.0, 1870.0),
            amx(32, 32, 2075.0, 1806.0),
            tile(1, 64, 346.0),
            tile(5, 64, 734.0),
            amx(16, 64, 1435.0, 1989.0),
        ];
        let codes = Epilogue { codes: true, ..Epilogue::NONE };
        let main = |tiles: Vec<TileMeasurement>, nr: usize| {
            tiles
                .iter()
                .filter(|t| t.nr == nr)
                .max_by(|a, b| a.gflops.total_cmp(&b.gflops))
                .map(|t| (t.mr, t.gflops))
        };
        let by_codes = family_tiles(&rates_for(&measured, &codes));
        assert_eq!(main(by_codes.clone(), 32), Some((16, 1870.0)));
        assert_eq!(main(by_codes.clone(), 64), Some((16, 1989.0)));
        assert!(!by_codes.iter().any(|t| (t.mr, t.nr) == (32, 32)), "16x32 is the main height of 32");
        assert!(
            by_codes.iter().any(|t| (t.mr, t.nr, t.gflops) == (1, 32, 214.0)),
            "vector tiles keep their rate"
        );
        let plain = family_tiles(&rates_for(&measured, &Epilogue::NONE));
        assert_eq!(main(plain.clone(), 32), Some((32, 2075.0)));
        assert_eq!(main(plain, 64), Some((16, 1435.0)));
    }
}
