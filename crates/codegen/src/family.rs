//! A contraction compiled once for every shape: its kernel family (the L0 level of
//! the schedule space: for each tile width the fastest height and the lower
//! heights that cover remainders), generated with the group's epilogue, and the
//! [`Dispatcher`] that picks the schedule per bound shape at run time.

use std::path::Path;

use kernels::categorize::KernelId;
use kernels::{
    CostModel, DirectVariant, Dispatcher, Epilogue, KernelFamily, KernelVariant, Target, ThreadPool,
};

use crate::tuning::{machine_model, record};
use crate::{
    compile_direct_kernel, compile_microkernel_with, CodegenError, JitDirectKernel, JitMicroKernel,
    TileMeasurement,
};

/// The tiles of a family, from the measured register tiles: per width, the main
/// height (fastest, ties within 3% to the lower) and the heights 1, 2, 4 and half
/// the main one below it, the cover kernels of FTuner's two-height combination.
pub fn family_tiles(measured: &[TileMeasurement]) -> Vec<TileMeasurement> {
    pick_heights(measured, false)
}

/// The direct kernels of a family: per width, the main height is the highest
/// within 3% of the fastest (a direct kernel pads nothing, and a higher tile
/// covers small products in fewer calls), with the heights 1, 2, 4, 8 and half
/// the main one below it: any remainder is covered in a few calls.
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
        let tied = of_width.iter().filter(|m| m.gflops >= 0.97 * top).map(|m| m.mr);
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
}

impl Contraction {
    /// Compile the family for `epilogue` from this machine's measured tiles (cached in
    /// `cache`, measured now otherwise) and calibrate the analytical levels for
    /// `pool`'s threads (cached too).
    pub fn compile(
        target: &Target,
        pool: &ThreadPool,
        epilogue: Epilogue,
        model: CostModel,
        cache: Option<&Path>,
    ) -> Result<Contraction, CodegenError> {
        Contraction::compile_kernels(target, pool, epilogue, model, cache, None)
    }

    /// [`Contraction::compile`] with only the kernels in `keep` (when given): the
    /// family a shape distribution needs ([`kernels::categorize`]), smaller and
    /// quicker to compile.
    pub fn compile_kernels(
        target: &Target,
        pool: &ThreadPool,
        epilogue: Epilogue,
        model: CostModel,
        cache: Option<&Path>,
        keep: Option<&[KernelId]>,
    ) -> Result<Contraction, CodegenError> {
        let (mut rec, _) = record(cache, target)?;
        let machine = machine_model(cache, target, pool, &mut rec);
        let kept = |direct: bool, t: &TileMeasurement| {
            keep.is_none_or(|k| k.contains(&KernelId { direct, mr: t.mr, nr: t.nr }))
        };
        let mut tiles = family_tiles(&rec.tiles);
        tiles.retain(|t| kept(false, t));
        let mut jit = Vec::with_capacity(tiles.len());
        let mut variants = Vec::with_capacity(tiles.len());
        for t in &tiles {
            let k = compile_microkernel_with(target, t.mr, t.nr, epilogue)?;
            variants.push(KernelVariant { kernel: k.kernel(), gflops: t.gflops });
            jit.push(k);
        }
        // The direct kernels: the same choice of heights per width, from their own rates.
        let mut tiles = direct_family_tiles(&rec.direct);
        tiles.retain(|t| kept(true, t));
        let mut direct = Vec::with_capacity(tiles.len());
        let mut direct_variants = Vec::with_capacity(tiles.len());
        for t in &tiles {
            let k = compile_direct_kernel(target, t.mr, t.nr, epilogue)?;
            direct_variants.push(DirectVariant { kernel: k.kernel(), gflops: t.gflops });
            direct.push(k);
        }
        let unsupported = |e: kernels::KernelError| CodegenError::Unsupported(e.to_string());
        let family =
            KernelFamily::new(variants).and_then(|f| f.with_direct(direct_variants)).map_err(unsupported)?;
        Ok(Contraction { dispatcher: Dispatcher::new(target.clone(), family, machine, model), jit, direct })
    }

    pub fn dispatcher(&self) -> &Dispatcher {
        &self.dispatcher
    }

    /// The compiled packed-panel kernels (their IR and assembly, for `--dump-llvm`).
    pub fn kernels(&self) -> &[JitMicroKernel] {
        &self.jit
    }

    /// The compiled direct kernels.
    pub fn direct_kernels(&self) -> &[JitDirectKernel] {
        &self.direct
    }
}

impl std::ops::Deref for Contraction {
    type Target = Dispatcher;
    fn deref(&self) -> &Dispatcher {
        &self.dispatcher
    }
}
