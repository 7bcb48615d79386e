//! The GPU engine's host side: kernel descriptions and their rules, the candidate
//! space, the wave/occupancy model, the decision tree distilled from it, ptxas
//! reports, the manifest and the host oracle. (The kernels themselves run on a GPU:
//! bench/gpu/device.sh.)

use gpu::candidates;
use gpu::manifest::PtxasReport;
use gpu::reference::{self, Operands};
use gpu::wave::{calibration_grids, occupancy, FEW_BLOCKS, L2_DRIFT};
use gpu::{
    Activation, Arch, BLayout, Choice, Cover, DeviceLimits, ElemType, Epilogue, GemmKernel, KernelRate,
    MTree, Manifest, ManifestEntry, Piece, Problem, Split, WaveModel,
};
use proptest::prelude::*;

fn mma(bm: usize, bn: usize, warps_m: usize, warps_n: usize) -> GemmKernel {
    GemmKernel {
        arch: Arch::Sm80,
        elem: ElemType::Bf16,
        b: BLayout::KMajor,
        bm,
        bn,
        warps_m,
        warps_n,
        stages: 4,
        epilogue: Epilogue::NONE,
        overlap: false,
        split_k: false,
        fold: false,
        stream_k: false,
        tma: false,
        persistent: false,
        pingpong: false,
        unaligned: false,
        c_f32: false,
        a_f32: false,
        b_f32: false,
        a_taps: false,
        c16_copy: false,
        norm: None,
    }
}

#[test]
fn kernel_rules() {
    assert!(mma(128, 128, 2, 2).check().is_ok());
    assert_eq!(mma(128, 128, 2, 2).accumulators(), 128);
    assert_eq!(mma(128, 128, 2, 2).smem_bytes(), 4 * (128 + 128) * 32 * 2);
    // Warp tiles must be whole m16 × (2 × n8) products.
    assert!(mma(48, 64, 2, 2).check().unwrap_err().to_string().contains("multiples of 16"));
    // Too many accumulators for the registers.
    assert!(mma(256, 256, 2, 2).check().is_err());
    // An N-major B needs rows of at least 128 bytes for its swizzle.
    let nn = GemmKernel { b: BLayout::NMajor, ..mma(64, 32, 2, 1) };
    assert!(nn.check().unwrap_err().to_string().contains("multiple of 64"));
    let wg = GemmKernel { arch: Arch::Sm90a, warps_m: 8, warps_n: 1, ..mma(128, 256, 2, 2) };
    assert!(wg.check().is_ok(), "{:?}", wg.check());
    assert_eq!(wg.accumulators(), 128);
    assert_eq!(wg.bk(), 64);
    assert_eq!(wg.name(), "gemm_wg_bf16_nt_128x256_w8x1_s4");
    // Launch rules: 16-byte copies.
    let k = mma(64, 64, 2, 2);
    assert!(k.accepts(&Problem::nt(1, 1, 1, 8)).is_ok());
    assert!(k.accepts(&Problem::nt(1, 5, 7, 12)).unwrap_err().contains("K = 12"));
    assert!(nn_ok().accepts(&Problem::nn(1, 5, 12, 8)).unwrap_err().contains("N = 12"));
    // A problem's layouts are the kernel's: this one reads B K-major and A row-major.
    assert!(k.accepts(&Problem::nn(1, 1, 8, 8)).unwrap_err().contains("B is nn, this kernel reads it nt"));
    let strided_a = Problem { a: gpu::ALayout::Strided, ..Problem::nt(1, 1, 8, 8) };
    assert!(k.accepts(&strided_a).unwrap_err().contains("A row-major"));
    // Element types and layouts the family has no form for are refused by name.
    assert!(GemmKernel { elem: ElemType::F32, ..k }.check().unwrap_err().to_string().contains("not f32"));
    assert!(GemmKernel { b: BLayout::Strided, ..k }
        .check()
        .unwrap_err()
        .to_string()
        .contains("contiguous B"));
    assert!(k.accepts(&Problem::nt(0, 5, 8, 8)).is_err());
}

/// GEMV kernels: a warp a column of a K-major B, 1-16 rows a block, steps of a
/// warp's 16-byte chunks times the unroll; K in whole chunks.
#[test]
fn gemv_kernel_rules() {
    let fam = candidates::gemv_family(ElemType::Bf16, Epilogue::NONE);
    assert_eq!(fam.len(), 3);
    for k in &fam {
        assert!(k.check().is_ok(), "{k}");
        assert_eq!(
            (k.arch, k.b, k.bn, k.warps(), k.threads(), k.smem_bytes()),
            (Arch::Gemv, BLayout::KMajor, 4, 4, 128, 0)
        );
        assert_eq!(k.bk(), 256 * k.gemv_unroll());
        assert!(k.accepts(&Problem::nt(2, 3, 5, 8)).is_ok());
        assert!(k.accepts(&Problem::nt(1, 3, 5, 12)).unwrap_err().contains("K = 12"));
    }
    assert_eq!(fam[0].name(), "gemm_gemv_bf16_nt_1x4_w1x4_s1");
    assert_eq!(fam.iter().map(|k| k.gemv_unroll()).collect::<Vec<_>>(), [4, 4, 2]);
    let k = fam[2];
    let bad = [
        GemmKernel { b: BLayout::NMajor, ..k },
        GemmKernel { bn: 8, ..k },
        GemmKernel { bm: 17, ..k },
        GemmKernel { stages: 2, ..k },
        GemmKernel { split_k: true, ..k },
    ];
    for b in bad {
        assert!(b.check().is_err(), "{b:?}");
    }
}

fn nn_ok() -> GemmKernel {
    GemmKernel { b: BLayout::NMajor, ..mma(64, 64, 2, 2) }
}

#[test]
fn the_candidate_space_is_valid_and_the_family_spans_small_to_large_tiles() {
    for b in [BLayout::KMajor, BLayout::NMajor] {
        let space = candidates::space(ElemType::Bf16, b, Epilogue::NONE);
        assert!(!space.is_empty());
        for k in &space {
            assert!(k.check().is_ok(), "{k}");
        }
        let fam = candidates::family(ElemType::Bf16, b, Epilogue::NONE);
        let mut names: Vec<String> = fam.iter().map(|k| k.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), fam.len(), "names are unique");
        assert!(fam.iter().any(|k| k.bm == 16), "a tile for a handful of rows");
        assert!(fam.iter().any(|k| k.bm * k.bn >= 128 * 256), "a large-M workhorse");
    }
    let wg = candidates::wgmma_family(ElemType::F16, Epilogue::NONE);
    assert_eq!(wg.len(), 8);
    assert_eq!(wg.iter().filter(|k| k.overlap).count(), 4);
    assert!(wg.iter().any(|k| k.name() == "gemm_wgo_f16_nt_128x256_w8x1_s4"));
    // A group in flight needs a buffer of its own: 3 stages or more, wgmma only.
    let two = GemmKernel { stages: 2, ..wg[7] };
    assert!(two.overlap && two.check().is_err());
    assert!(GemmKernel { overlap: true, ..mma(64, 64, 2, 2) }.check().is_err());
    assert!(wg.iter().all(|k| k.check().is_ok() && k.arch == Arch::Sm90a));
    // The TMA family: a producer warpgroup beside one or two consumers, the deepest
    // pipeline that fits, and registers moved to two consumers.
    let tma = candidates::tma_family(ElemType::Bf16, Epilogue::NONE);
    assert_eq!(tma.len(), 4);
    for k in &tma {
        assert!(k.check().is_ok() && k.tma && !k.overlap, "{k}");
        assert_eq!(k.threads(), 128 * (1 + k.bm / 64), "{k}");
        assert!(k.smem_bytes() <= gpu::kernel::MAX_SMEM_PER_BLOCK_SM90, "{k}");
        assert!(GemmKernel { stages: k.stages + 1, ..*k }.check().is_err() || k.stages == 6, "{k}");
        let (a, b) = k.stage_bytes();
        assert_eq!(k.smem_bytes(), k.stages * (a + b + 16), "{k}: tiles and two barriers a stage");
        match k.register_split() {
            Some((p, c)) => {
                assert_eq!(k.bm, 128, "{k}");
                // Within the 64K the block started with (168 a thread).
                assert!(128 * p + 256 * c <= 384 * 168, "{k}");
            }
            None => assert_eq!(k.bm, 64, "{k}"),
        }
    }
    assert!(tma.iter().any(|k| k.name() == "gemm_wgt_bf16_nt_128x256_w8x1_s4"));
    // Persistent: the epilogue's region beside the stages (fewer of them), inside
    // Hopper's shared memory; none with a residual.
    let persistent = candidates::persistent_family(ElemType::Bf16, Epilogue::NONE);
    assert_eq!(persistent.len(), 4);
    for k in &persistent {
        assert!(k.check().is_ok() && k.persistent && k.tma, "{k}");
        let (at, bytes) = k.epilogue_region();
        let (a, b) = k.stage_bytes();
        assert!(at >= k.stages * (a + b + 16) && at % 128 == 0, "{k}");
        assert_eq!(bytes, k.warpgroups() * 64 * (2 * k.bn + 16), "{k}");
        assert_eq!(k.smem_bytes(), at + bytes, "{k}");
        assert!(k.smem_bytes() <= gpu::kernel::MAX_SMEM_PER_BLOCK_SM90, "{k}");
    }
    assert!(persistent.iter().any(|k| k.name() == "gemm_wgp_bf16_nt_128x256_w8x1_s3"));
    let residual = Epilogue { bias: true, residual: true, ..Epilogue::NONE };
    assert!(candidates::persistent_family(ElemType::Bf16, residual).is_empty());
    assert!(GemmKernel { persistent: true, ..mma(64, 64, 2, 2) }.check().is_err());
    assert!(GemmKernel { split_k: true, ..persistent[0] }.check().is_err());
    assert!(GemmKernel { tma: true, ..mma(64, 64, 2, 2) }.check().is_err(), "TMA is a wgmma pipeline");
    assert!(GemmKernel { overlap: true, ..tma[0] }.check().is_err());
}

#[test]
fn occupancy_is_limited_by_registers_shared_memory_and_threads() {
    let d = DeviceLimits::hopper(4e12);
    let k = mma(128, 128, 2, 2); // 128 threads, 64 KB
    assert_eq!(occupancy(&k, 240, &d), 2, "240 registers × 128 threads: 2 blocks in 64K");
    assert_eq!(occupancy(&k, 64, &d), 3, "then shared memory: 3 × 65 KB in 228 KB");
    let small = mma(16, 64, 1, 4); // 20 KB
    assert_eq!(occupancy(&small, 40, &d), 10, "40 registers: 10 blocks of 4 warps");
    assert_eq!(occupancy(&small, 16, &d), 10, "shared memory: 228 / 21");
}

/// A rate without a short product's measurement (the long fit alone).
fn unmeasured_short() -> KernelRate {
    KernelRate {
        name: String::new(),
        regs: 0,
        occupancy: 1,
        fixed: 0.0,
        per_kstep: 0.0,
        fixed_alone: 0.0,
        per_kstep_alone: 0.0,
        fit_from: 0.0,
        short_steps: 0.0,
        short: 0.0,
        short_alone: 0.0,
        fixed_few: 0.0,
        per_kstep_few: 0.0,
        short_few: 0.0,
        fit_to: 0.0,
        long_steps: 0.0,
        long: 0.0,
        long_alone: 0.0,
        long_few: 0.0,
    }
}

/// Below the long fit's first point a rate interpolates to the short product's
/// measured time: continuous at the fit's first point, exact at the short one, the
/// line itself past it and when nothing short was measured.
#[test]
fn a_short_product_is_priced_between_its_measurement_and_the_fit() {
    // A TMA tile as measured on an H100: the line's intercept says 3.8 us, one step took 2.9.
    let r = KernelRate {
        fixed: 3.82e-6,
        per_kstep: 0.649e-6,
        fixed_alone: 4.84e-6,
        per_kstep_alone: 0.609e-6,
        fit_from: 8.0,
        short_steps: 1.0,
        short: 2.9e-6,
        short_alone: 3.1e-6,
        ..unmeasured_short()
    };
    let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
    assert!(close(r.wave(1.0), 2.9e-6) && close(r.alone(1.0), 3.1e-6));
    assert!(close(r.wave(8.0), 3.82e-6 + 8.0 * 0.649e-6));
    assert!((r.wave(8.0 - 1e-6) - r.wave(8.0)).abs() < 1e-11, "continuous where the line takes over");
    assert!(close(r.wave(20.0), 3.82e-6 + 20.0 * 0.649e-6));
    let mut last = 0.0;
    for s in 1..40 {
        let t = r.wave(s as f64);
        assert!(t > last, "more steps never take less time ({s})");
        last = t;
    }
    let plain = KernelRate { short: 0.0, short_alone: 0.0, ..r.clone() };
    assert!(close(plain.wave(1.0), 3.82e-6 + 0.649e-6));
    // Past the line's second point (32 steps), towards the long product (128 steps):
    // continuous there, exact at 128, linear between; without it, the line.
    let long = KernelRate { fit_to: 32.0, long_steps: 128.0, long: 100e-6, long_alone: 90e-6, ..r.clone() };
    let at32 = 3.82e-6 + 32.0 * 0.649e-6;
    assert!(close(long.wave(32.0), at32) && (long.wave(32.0 + 1e-6) - at32).abs() < 1e-11);
    assert!(close(long.wave(128.0), 100e-6) && close(long.alone(128.0), 90e-6));
    assert!(close(long.wave(80.0), at32 + 0.5 * (100e-6 - at32)));
    assert!(close(r.wave(80.0), 3.82e-6 + 80.0 * 0.649e-6));
}

fn model() -> WaveModel {
    let kernels = vec![mma(16, 64, 1, 4), mma(128, 128, 2, 2)];
    let rates = vec![
        KernelRate {
            name: kernels[0].name(),
            regs: 40,
            occupancy: 10,
            fixed: 1.7e-6,
            per_kstep: 0.64e-6,
            fixed_alone: 1.9e-6,
            per_kstep_alone: 0.145e-6,
            ..unmeasured_short()
        },
        KernelRate {
            name: kernels[1].name(),
            regs: 235,
            occupancy: 2,
            fixed: 7.9e-6,
            per_kstep: 0.63e-6,
            fixed_alone: 5.9e-6,
            per_kstep_alone: 0.45e-6,
            ..unmeasured_short()
        },
    ];
    WaveModel { device: DeviceLimits::hopper(4e12), kernels, rates, reduce: None }
}

#[test]
fn the_wave_model_prices_waves_and_partial_waves() {
    let m = model();
    // The calibration's rates hold their launch's share: all of it on the grid of
    // one wave, a quarter on the grid of four, which the model takes out.
    let launch = m.device.launch;
    for (k, r) in m.kernels.iter().zip(&m.rates) {
        let [full, lone, few] =
            calibration_grids(k, r.occupancy, m.device.sms).map(|g| g.waves(r.occupancy, 132));
        assert_eq!((full, lone, few), (4.0, 1.0, 1.0), "{k}");
    }
    // One block: latency alone (its launch paid once), no share of a full wave.
    let plain = |kernel| Choice { kernel, splits: 1 };
    let one = m.predict(plain(0), &Problem::nt(1, 1, 64, 768));
    let want = 1.9e-6 + 0.145e-6 * 24.0;
    assert!((one - want).abs() < 1e-12, "{one} vs {want}");
    // Exactly one full wave of the large tile: 264 blocks.
    let p = Problem::nt(1, 128 * 12, 128 * 22, 1024);
    assert_eq!(m.kernels[1].blocks(&p), 264);
    let full = m.predict(plain(1), &p);
    assert!((full - (7.9e-6 + 0.63e-6 * 32.0 - launch / 4.0 + launch)).abs() < 1e-12);
    // One block more starts a second, partial wave.
    let p2 = Problem::nt(1, 128 * 12 + 1, 128 * 22, 1024);
    assert!(m.predict(plain(1), &p2) > full * 1.3);
    // Five blocks an SM of a tile that fits ten: four ninths of the way from one
    // block's latency to a full wave.
    let five = Problem::nt(1, 16 * 55, 64 * 12, 768);
    assert_eq!(m.kernels[0].blocks(&five), 5 * 132);
    let (alone, wave) = (1.9e-6 + 0.145e-6 * 24.0 - launch, 1.7e-6 + 0.64e-6 * 24.0 - launch / 4.0);
    let want = alone + 4.0 / 9.0 * (wave - alone) + launch;
    assert!((m.predict(plain(0), &five) - want).abs() < 1e-12);
    // Small M picks the small tile, large M the large one.
    assert_eq!(m.choose(&Problem::nt(1, 7, 768, 768)).unwrap().0, plain(0));
    assert_eq!(m.choose(&Problem::nt(1, 8192, 4096, 4096)).unwrap().0, plain(1));
    // A product no kernel accepts has no choice.
    assert!(m.choose(&Problem::nt(1, 7, 768, 13)).is_none());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// The tree gives the model's own choice at every M it was distilled for, and the
    /// model's past that range.
    #[test]
    fn the_tree_agrees_with_the_model(n in 1usize..4096, k8 in 1usize..512, m in 1usize..6000) {
        let model = model();
        let k = 8 * k8;
        let tree = MTree::distill(&model, Problem::nt(1, 0, n, k), 4096).unwrap();
        let want = model.choose_cover(&Problem::nt(1, m, n, k)).unwrap().0;
        prop_assert_eq!(want.main.splits, 1);
        prop_assert_eq!(tree.choose(&model, m), Some(want));
        prop_assert!(tree.bounds[0] == 1 && tree.bounds.windows(2).all(|w| w[0] < w[1]));
        prop_assert!(tree.depth() <= 13);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// The model's two-size covers: the pieces cover every row once, the main over
    /// whole tiles of its height, each piece a choice its kernel takes; a cover is
    /// taken only past the margin, and priced as its two launches.
    #[test]
    fn covers_split_rows_into_whole_main_tiles_and_a_rest(
        batch in 1usize..3,
        m in 1usize..5000,
        n in 1usize..4096,
        k8 in 1usize..256,
    ) {
        let model = model();
        let p = Problem::nt(batch, m, n, 8 * k8);
        let single = model.choose(&p).unwrap();
        let (pick, t) = model.choose_cover(&p).unwrap();
        prop_assert!(model.covers(&p).contains(&pick));
        prop_assert!((model.predict_cover(&pick, &p) - t).abs() <= 1e-12 * t);
        match pick.split {
            None => prop_assert_eq!((pick.main, t), single),
            Some(_) => prop_assert!(t < single.1 * (1.0 - gpu::cover::COVER_MARGIN)),
        }
        for c in model.covers(&p) {
            let pieces = c.pieces(&model.kernels, &p);
            prop_assert_eq!(pieces[0].first_row, 0);
            prop_assert!(pieces.windows(2).all(|w| w[0].first_row + w[0].problem.m == w[1].first_row));
            prop_assert_eq!(pieces.iter().map(|x| x.problem.m).sum::<usize>(), m);
            for x in &pieces {
                prop_assert!(model.choices(&x.problem).contains(&x.choice), "{:?}", x);
            }
            if let Some(s) = c.split {
                let main = &model.kernels[c.main.kernel];
                prop_assert_eq!(pieces.len(), 2);
                prop_assert!(pieces[0].problem.m % main.bm == 0 && s.rest.kernel != c.main.kernel);
            }
        }
    }
}

#[test]
fn a_last_tile_row_that_spills_a_wave_goes_to_a_second_size() {
    let m = model();
    let plain = |kernel| Choice { kernel, splits: 1 };
    // 128×128 tiles, two an SM: 22 columns × 12 tile rows fill one wave (264
    // blocks); five rows more would start a second wave for 22 blocks. The
    // 16×64 kernel takes those five rows instead.
    let p = Problem::nt(1, 12 * 128 + 5, 128 * 22, 1024);
    let (single, ts) = m.choose(&p).unwrap();
    assert_eq!(single, plain(1));
    let (c, t) = m.choose_cover(&p).unwrap();
    let want = Cover { main: plain(1), split: Some(Split { max_tiles: usize::MAX, rest: plain(0) }) };
    assert_eq!(c, want);
    assert_eq!(
        c.pieces(&m.kernels, &p),
        [
            Piece { choice: plain(1), first_row: 0, problem: Problem::nt(1, 1536, 2816, 1024) },
            Piece { choice: plain(0), first_row: 1536, problem: Problem::nt(1, 5, 2816, 1024) },
        ]
    );
    let parts = m.predict(plain(1), &Problem::nt(1, 1536, 2816, 1024))
        + m.predict(plain(0), &Problem::nt(1, 5, 2816, 1024));
    assert!((t - parts).abs() < 1e-15 && t < 0.8 * ts, "{t} vs {ts}");
    assert_eq!(m.describe_cover(&c, &p), "gemm_bf16_nt_128x128_w2x2_s4[1536]+gemm_bf16_nt_16x64_w1x4_s4");
    // Whole tiles: nothing left over, one choice.
    assert_eq!(m.choose_cover(&Problem::nt(1, 12 * 128, 128 * 22, 1024)).unwrap().0.split, None);
    // 25 tile rows and five rows: whole tiles would leave a third wave of 22
    // blocks; the main takes the 24 tile rows that fill two waves, and the other
    // kernel the 133 rows below.
    let p = Problem::nt(1, 25 * 128 + 5, 128 * 22, 1024);
    let (c, _) = m.choose_cover(&p).unwrap();
    assert_eq!(c, Cover { main: plain(1), split: Some(Split { max_tiles: 24, rest: plain(0) }) });
    assert_eq!(c.rows(&m.kernels, &p), 3072);
    // Where the main's own kernel is the best for the rows left over, the rest is
    // the best of another: 1413 rows below one wave of 128×128.
    let p = Problem::nt(1, 23 * 128 + 5, 128 * 22, 1024);
    assert_eq!(m.best_two(&Problem::nt(1, 1413, 128 * 22, 1024)).map(|x| x.unwrap().0), [plain(1), plain(0)]);
    assert!(m
        .covers(&p)
        .contains(&Cover { main: plain(1), split: Some(Split { max_tiles: 12, rest: plain(0) }) }));
}

/// With fewer blocks than SMs, a measured few-SM latency prices the partial wave:
/// at most `FEW_BLOCKS` blocks at it, every SM busy at the one-block-an-SM latency,
/// linearly in between; unmeasured, the one-block-an-SM latency throughout.
#[test]
fn a_partial_wave_on_few_sms_runs_at_the_few_sm_latency() {
    let plain = Choice { kernel: 1, splits: 1 };
    let before = model();
    let mut m = model();
    m.rates[1].fixed_few = 4.4e-6;
    m.rates[1].per_kstep_few = 0.36e-6;
    let at = |model: &WaveModel, tiles: usize| model.predict(plain, &Problem::nt(1, 128, 128 * tiles, 1024));
    // 32 K steps; the few-SM grid's launch share (one wave) taken out, the product's added.
    let few = 4.4e-6 + 0.36e-6 * 32.0;
    assert!((at(&m, 3) - few).abs() < 1e-12 && (at(&m, FEW_BLOCKS) - few).abs() < 1e-12);
    let all = at(&before, 132);
    assert!((at(&m, 132) - all).abs() < 1e-12, "every SM busy: as before");
    let mid = FEW_BLOCKS + (132 - FEW_BLOCKS) / 2;
    let want = few + (mid - FEW_BLOCKS) as f64 / (132 - FEW_BLOCKS) as f64 * (all - few);
    assert!((at(&m, mid) - want).abs() < 1e-12);
    assert!((1..132).all(|t| at(&m, t) <= at(&m, t + 1) && at(&m, t) < at(&before, t)));
    // Past the SMs (a partial wave of two blocks an SM), the all-SM latency as before.
    assert_eq!(at(&m, 200), at(&before, 200));
}

#[test]
fn the_tree_text_lists_its_leaves() {
    let model = model();
    let tree = MTree::distill(&model, Problem::nt(1, 0, 4096, 4096), 8192).unwrap();
    let text = tree.text(&model);
    assert!(text.starts_with("tree 1x(Mx4096x4096) nt"), "{text}");
    assert!(text.contains("M in [1, "), "{text}");
    assert!(
        text.contains("gemm_bf16_nt_16x64_w1x4_s4") && text.contains("gemm_bf16_nt_128x128_w2x2_s4"),
        "{text}"
    );
    assert_eq!(tree.choose(&model, 0), None);
}

#[test]
fn ptxas_reports_are_read() {
    let out = "ptxas info    : 0 bytes gmem\n\
ptxas info    : Compiling entry function 'gemm_x' for 'sm_90a'\n\
ptxas info    : Function properties for gemm_x\n\
    0 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n\
ptxas info    : Used 237 registers, used 1 barriers, 460 bytes cmem[0]\n\
ptxas warning : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized\n";
    let r = PtxasReport::parse(out, "gemm_x").unwrap();
    assert_eq!((r.registers, r.spill_stores, r.spill_loads), (237, 8, 4));
    assert_eq!(r.problems().len(), 2, "{:?}", r.problems());
    assert!(PtxasReport::parse("ptxas info : nothing", "gemm_x").is_err());
}

#[test]
fn a_manifest_round_trips_and_a_bad_one_is_an_error() {
    let dir = std::env::temp_dir().join(format!("anyshape-manifest-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let k = mma(64, 64, 2, 2);
    let m = Manifest {
        cubin_arch: Some("sm_90a".into()),
        entries: vec![ManifestEntry {
            kernel: k,
            name: k.name(),
            ptx: "a.ptx".into(),
            cubin: None,
            ptxas: vec![],
        }],
        reducers: vec![],
    };
    m.save(&dir).unwrap();
    assert_eq!(Manifest::load(&dir).unwrap(), m);
    std::fs::write(dir.join(Manifest::FILE), "{\"entries\": [").unwrap();
    assert!(Manifest::load(&dir).unwrap_err().contains("manifest.json"));
    let wrong =
        Manifest { entries: vec![ManifestEntry { name: "other".into(), ..m.entries[0].clone() }], ..m };
    wrong.save(&dir).unwrap();
    assert!(Manifest::load(&dir).unwrap_err().contains("describes kernel"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_oracle_multiplies_in_both_layouts_with_the_epilogue() {
    let e = ElemType::Bf16;
    let bits = |v: &[f32]| v.iter().map(|&x| reference::to_bits(e, x)).collect::<Vec<u16>>();
    // A [2, 3]; B as [N=2, K=3] and as [K=3, N=2].
    let a = bits(&[1.0, 2.0, 3.0, -1.0, 0.5, 0.25]);
    let b_nk = bits(&[1.0, 0.0, 2.0, 0.0, 1.0, -1.0]);
    let b_kn = bits(&[1.0, 0.0, 0.0, 1.0, 2.0, -1.0]);
    let bias = bits(&[0.5, -0.5]);
    let res = bits(&[1.0, 1.0, 1.0, 1.0]);
    let p = Problem::nt(1, 2, 2, 3);
    let epi = Epilogue { bias: true, residual: true, ..Epilogue::NONE };
    let want = [1.0 + 6.0 + 0.5 + 1.0, 2.0 - 3.0 - 0.5 + 1.0, -1.0 + 0.5 + 0.5 + 1.0, 0.5 - 0.25 - 0.5 + 1.0];
    for (layout, b) in [(BLayout::KMajor, &b_nk), (BLayout::NMajor, &b_kn)] {
        let o = Operands { elem: e, a: &a, b, bias: &bias, residual: &res };
        let c = reference::gemm(&p.with_b(layout), &epi, &o);
        for (x, w) in c.iter().zip(want) {
            assert!((x - w).abs() < 1e-12, "{layout:?}: {c:?}");
        }
    }
    // GELU's two forms agree to ~1e-3 and erf is accurate.
    for x in [-3.0, -0.5, 0.0, 0.7, 2.5] {
        assert!(
            (reference::activation(Activation::GeluTanh, x) - reference::activation(Activation::Gelu, x))
                .abs()
                < 2e-3
        );
    }
    assert!((reference::erf(0.5) - 0.520_499_877_813_046_5).abs() < 2e-7);
    // The tolerance: a bf16 rounding passes, a few units in the last place do not.
    let w = 3.0f64;
    assert!(reference::close(e, reference::from_bits(e, reference::to_bits(e, 3.01)), 3.01, 1.0, false));
    assert!(!reference::close(e, (w * (1.0 + 4.0 * 2f64.powi(-8))) as f32, w, 1.0, false));
    assert!(!reference::close(e, f32::NAN, w, 1.0, false));
}

#[test]
fn split_k_plans_leave_no_split_without_work() {
    let k = GemmKernel { split_k: true, ..mma(16, 64, 1, 4) };
    assert!(k.check().is_ok());
    assert!(k.name().ends_with("_sk"));
    // 3072 / 32 = 96 steps.
    assert_eq!(k.split_plan(3072, 4), (24, 4));
    assert_eq!(k.split_plan(3072, 7), (14, 7));
    // 6 steps over 4 splits: 2 each leaves the 4th empty, so 3 run.
    assert_eq!(k.split_plan(192, 4), (2, 3));
    assert_eq!(k.split_plan(8, 16), (1, 1));
    for steps in 1..200 {
        for splits in 1..20 {
            let (per, working) = k.split_plan(steps * 32, splits);
            assert!(per * working >= steps && per * (working - 1) < steps, "{steps} steps, {splits} splits");
        }
    }
    // A split-K kernel takes no batch and no epilogue of its own.
    assert!(k.accepts(&Problem::nt(2, 4, 64, 64)).is_err());
    assert!(GemmKernel { epilogue: Epilogue { bias: true, ..Epilogue::NONE }, ..k }.check().is_err());
}

/// The GPU family builds every epilogue of the shared vocabulary, element-wise
/// programs included, and a kernel's name tells its epilogues apart (programs
/// by their fingerprint).
#[test]
fn every_epilogue_has_a_gpu_form_and_a_name_of_its_own() {
    use plan::{Pointwise, PwBinary, PwOp};
    let k = candidates::gemv_family(ElemType::Bf16, Epilogue::NONE)[0];
    let clip = |hi: f32| {
        let mut p = Pointwise::empty();
        let x = p.push(PwOp::Input).unwrap();
        let c = p.push(PwOp::Const(hi.to_bits())).unwrap();
        p.push(PwOp::Binary(PwBinary::Min, x, c)).unwrap();
        Activation::Pointwise(p)
    };
    let forms = [
        Epilogue::NONE,
        Epilogue { scale: Some(0.5), ..Epilogue::NONE },
        Epilogue { scale: Some(0.25), ..Epilogue::NONE },
        Epilogue { bias: true, activation: Activation::Relu, ..Epilogue::NONE },
        Epilogue { bias: true, activation: Activation::Gelu, ..Epilogue::NONE },
        Epilogue { bias: true, activation: Activation::GeluTanh, ..Epilogue::NONE },
        Epilogue { residual: true, activation: Activation::Tanh, ..Epilogue::NONE },
        Epilogue { bias: true, activation: clip(6.0), ..Epilogue::NONE },
        Epilogue { bias: true, activation: clip(1.0), ..Epilogue::NONE },
    ];
    let names: std::collections::HashSet<String> =
        forms.iter().map(|&epilogue| GemmKernel { epilogue, ..k }.name()).collect();
    assert_eq!(names.len(), forms.len(), "{names:?}");
    for epilogue in forms {
        GemmKernel { epilogue, ..k }.check().expect("a GPU form");
        gpu::ReduceKernel { elem: ElemType::Bf16, epilogue, c_f32: false }.check().expect("a GPU form");
    }
}

/// [`model`] with a split-K 16×64 kernel (index 2) at the plain 16×64's rates.
fn model_with_split_k() -> (WaveModel, GemmKernel) {
    let mut m = model();
    let sk = GemmKernel { split_k: true, ..mma(16, 64, 1, 4) };
    m.kernels.push(sk);
    m.rates.push(KernelRate { name: sk.name(), ..m.rates[0].clone() });
    (m, sk)
}

#[test]
fn the_model_splits_k_only_where_tiles_leave_sms_idle() {
    let (m, _) = model_with_split_k();
    // One row against a long K: 12 blocks on 132 SMs; splitting K pays.
    let decode = Problem::nt(1, 1, 768, 4096);
    let choices = m.choices(&decode);
    assert!(choices.iter().any(|c| c.kernel == 2 && c.splits > 1), "{choices:?}");
    let (best, t) = m.choose(&decode).unwrap();
    assert_eq!(best.kernel, 2, "split-K for a decode step");
    assert!(best.splits >= 4 && t < m.predict(Choice { kernel: 0, splits: 1 }, &decode) / 2.0);
    // Enough tiles to fill the SMs: no split offered.
    let wide = Problem::nt(1, 1024, 4096, 4096);
    assert!(m.choices(&wide).iter().all(|c| c.splits == 1));
    assert!(m.describe(best).ends_with(&format!("_skx{}", best.splits)));
}

#[test]
fn a_measured_reduction_prices_each_further_chunk_of_shares() {
    let (mut m, sk) = model_with_split_k();
    let p = Problem::nt(1, 1, 768, 4096);
    let at = |m: &WaveModel, splits| m.predict(Choice { kernel: 2, splits }, &p);
    let unmeasured: Vec<f64> = [8, 12, 16, 24].iter().map(|&s| at(&m, s)).collect();
    m.reduce = Some(gpu::ReduceRate { fixed: 2.0e-6, per_chunk: 0.5e-6 });
    let measured: Vec<f64> = [8, 12, 16, 24].iter().map(|&s| at(&m, s)).collect();
    // One chunk (8 shares): the launch priced at `fixed` instead of the device's launch.
    let d = m.device.launch;
    assert!((measured[0] - (unmeasured[0] - d + 2.0e-6)).abs() < 1e-12);
    // 12 and 16 shares: two chunks; 24 asked over 128 K steps: 22 working, three.
    assert_eq!(sk.split_plan(4096, 24), (6, 22));
    for (i, chunks) in [(1, 2.0), (2, 2.0), (3, 3.0)] {
        let want = unmeasured[i] - d + 2.0e-6 + (chunks - 1.0) * 0.5e-6;
        assert!((measured[i] - want).abs() < 1e-12, "{} shares", [8, 12, 16, 24][i]);
    }
}

/// A folding split-K kernel (`GemmKernel::fold`) is priced without the
/// reduction's launch: its bytes, then a measured latency for its count and
/// for each chunk of shares its last blocks load (`fold_chunk` of them: 8 for
/// the 16×64 tile's 8 accumulators a thread).
#[test]
fn a_folding_split_k_kernel_pays_a_latency_a_chunk_and_no_launch() {
    let (mut m, sk) = model_with_split_k();
    let fold = GemmKernel { fold: true, ..sk };
    assert_eq!(fold.fold_chunk(), 8);
    m.kernels[2] = fold;
    let p = Problem::nt(1, 1, 768, 4096);
    let at = |m: &WaveModel, splits| m.predict(Choice { kernel: 2, splits }, &p);
    let bytes: Vec<f64> = [8, 12, 16].iter().map(|&s| at(&m, s)).collect();
    m.reduce = Some(gpu::ReduceRate { fixed: 2.0e-6, per_chunk: 0.5e-6 });
    for (i, chunks) in [(0, 1.0), (1, 2.0), (2, 2.0)] {
        let want = bytes[i] + (1.0 + chunks) * 0.5e-6;
        assert!((at(&m, [8, 12, 16][i]) - want).abs() < 1e-12, "{} shares", [8, 12, 16][i]);
    }
    // Against the same kernel unfolded: the reduction's `fixed` less a latency.
    let unfolded = WaveModel { kernels: vec![m.kernels[0], m.kernels[1], sk], ..m.clone() };
    let gap = unfolded.predict(Choice { kernel: 2, splits: 8 }, &p) - at(&m, 8);
    assert!((gap - (2.0e-6 - 2.0 * 0.5e-6)).abs() < 1e-12, "{gap}");
    assert!(m.describe(Choice { kernel: 2, splits: 8 }).ends_with("_skfx8"));
}

#[test]
fn simt_kernels_take_any_k_and_are_offered_only_where_no_tensor_core_kernel_is() {
    let simt = candidates::simt_family(ElemType::Bf16, Epilogue::NONE);
    assert_eq!(simt.len(), 4, "two tiles, two layouts");
    for k in &simt {
        assert!(k.check().is_ok(), "{k}");
        assert_eq!((k.smem_bytes(), k.threads(), k.arch.sm()), (0, 256, "sm_80"), "{k}");
        assert!(k.name().starts_with("gemm_simt_"), "{k}");
        // No alignment rule: odd K, and an N-major B with odd N.
        assert!(k.accepts(&Problem::nt(2, 5, 7, 13).with_b(k.b)).is_ok(), "{k}");
        assert!(k.accepts(&Problem::nt(1, 1, 1, 1).with_b(k.b)).is_ok(), "{k}");
        assert!(k.accepts(&Problem::nt(1, 0, 1, 1).with_b(k.b)).is_err(), "{k}");
    }
    // Its rules: one stage, 8x1 warps, tiles of whole 16 x 16 thread grids up to 128.
    let k = simt[1];
    assert!(GemmKernel { stages: 2, ..k }.check().is_err());
    assert!(GemmKernel { bm: 40, ..k }.check().is_err());
    assert!(GemmKernel { bn: 256, ..k }.check().is_err());
    assert!(GemmKernel { split_k: true, ..k }.check().is_err());
    // In the model: only where the tensor-core kernels refuse the product.
    let mut m = model();
    m.kernels.push(k);
    m.rates.push(KernelRate { name: k.name(), ..m.rates[0].clone() });
    let aligned = Problem::nt(1, 64, 768, 768);
    assert!(m.choices(&aligned).iter().all(|c| m.kernels[c.kernel].arch != Arch::Simt));
    let odd = Problem::nt(1, 64, 768, 100);
    let choices = m.choices(&odd);
    assert_eq!(choices, vec![Choice { kernel: 2, splits: 1 }]);
    assert_eq!(m.choose(&odd).unwrap().0.kernel, 2);
}

/// The tensor-core cover: mma.sync tiles that load element by element take any
/// operand, and the model offers them (beside the SIMT cover) only where the aligned
/// kernels refuse the product.
#[test]
fn unaligned_mma_kernels_take_any_operand_and_are_offered_only_as_a_cover() {
    let ua = candidates::unaligned_family(ElemType::Bf16, Epilogue::NONE);
    assert_eq!(ua.len(), 4, "two tiles, two layouts");
    for k in &ua {
        assert!(k.check().is_ok() && k.is_cover() && k.unaligned, "{k}");
        assert!(k.name().starts_with("gemm_ua_bf16_"), "{k}");
        assert!(k.accepts(&Problem::nt(2, 5, 7, 13).with_b(k.b)).is_ok(), "{k}");
        assert!(k.accepts(&Problem::nt(1, 0, 1, 1).with_b(k.b)).is_err(), "{k}");
    }
    let k = ua[0];
    assert!(GemmKernel { split_k: true, ..k }.check().is_err());
    assert!(GemmKernel { arch: Arch::Sm90a, warps_m: k.bm / 16, warps_n: 1, ..k }.check().is_err());
    let mut m = model();
    m.kernels.push(k);
    m.rates.push(KernelRate { name: k.name(), ..m.rates[0].clone() });
    let simt = candidates::simt_family(ElemType::Bf16, Epilogue::NONE)[0];
    m.kernels.push(simt);
    m.rates.push(KernelRate { name: simt.name(), ..m.rates[0].clone() });
    assert!(m.choices(&Problem::nt(1, 64, 768, 768)).iter().all(|c| !m.kernels[c.kernel].is_cover()));
    let kernels: Vec<usize> = m.choices(&Problem::nt(1, 64, 768, 100)).iter().map(|c| c.kernel).collect();
    assert_eq!(kernels, [2, 3]);
}

/// A wave's operands in the raster order: the row panels of A and the column
/// panels of B its tiles span, over all of K.
#[test]
fn a_waves_operands_follow_the_raster_groups() {
    let k = mma(128, 128, 2, 2);
    let bytes = |m, n, kk, tiles| k.raster_bytes(&Problem::nt(1, m, n, kk), tiles);
    // 132 of 64 × 64 tiles: a group's 8 tile rows by 17 tile columns.
    assert_eq!(bytes(8192, 8192, 1024, 132), ((8 * 128 + 17 * 128) * 1024 * 2) as f64);
    // Four tile columns: 132 tiles fill four groups and a fifth's first tiles.
    assert_eq!(bytes(8192, 512, 1024, 132), ((40 * 128 + 512) * 1024 * 2) as f64);
    // Fewer tiles than a wave: the whole product, ragged edges as they are.
    assert_eq!(bytes(200, 300, 64, 132), ((200 + 300) * 64 * 2) as f64);
    assert_eq!(bytes(8192, 8192, 1024, 1), ((128 + 128) * 1024 * 2) as f64);
}

/// A launch's waves after its first drift apart in K: priced higher once a
/// wave's operands pass a quarter of L2, by [`L2_DRIFT`] a doubling; a launch
/// of one wave is not.
#[test]
fn later_waves_pay_for_operands_past_a_quarter_of_l2() {
    let d = DeviceLimits::hopper(4e12);
    let l2 = d.l2_bytes as f64;
    assert_eq!(d.drift(0.1 * l2), 0.0);
    assert_eq!(d.drift(0.25 * l2), 0.0);
    assert!((d.drift(0.5 * l2) - L2_DRIFT).abs() < 1e-12);
    assert!((d.drift(l2) - 2.0 * L2_DRIFT).abs() < 1e-12);
    assert!((d.drift(100.0 * l2) - 3.0 * L2_DRIFT).abs() < 1e-12);
    let m = model();
    let plain = Choice { kernel: 1, splits: 1 };
    let huge = WaveModel { device: DeviceLimits { l2_bytes: 1 << 40, ..m.device }, ..m.clone() };
    // One tile column: a wave of 264 tiles (two an SM) spans 264 row panels,
    // 69 MB at K = 1024, where the calibration's wave spans 10 MB.
    let one = Problem::nt(1, 128 * 264, 128, 1024);
    assert_eq!(m.predict(plain, &one), huge.predict(plain, &one), "one wave");
    let four = Problem::nt(1, 4 * 128 * 264, 128, 1024);
    let (t, flat) = (m.predict(plain, &four), huge.predict(plain, &four));
    assert!(t > flat * 1.15 && t < flat * 1.25, "four waves: {t} vs {flat}");
}

/// The Stream-K price (`WaveModel::predict_stream_k`, from its tile's rates):
/// where the tiles leave most of a wave's slots idle, a wave of Stream-K
/// blocks is priced faster than the tile alone; where the tiles fill the
/// wave exactly, each block takes one whole tile and the price is the
/// tile's own (no unit more, nothing folded); more blocks than steps cannot
/// run.
#[test]
fn stream_k_is_priced_from_its_tiles_rates() {
    let m = model();
    let tile = mma(128, 128, 2, 2);
    assert_eq!(m.kernels[1], tile);
    let sk = GemmKernel { split_k: true, fold: true, stream_k: true, ..tile };
    sk.check().unwrap();
    let slots = m.device.sms * m.rates[1].occupancy;
    // 96 tiles of 128 steps on 264 slots.
    let partial = Problem::nt(1, 1000, 1536, 4096);
    let plain = m.predict(Choice { kernel: 1, splits: 1 }, &partial);
    let stream = m.predict_stream_k(1, &sk, &partial, slots).unwrap();
    assert!(stream < 0.9 * plain, "{stream} against {plain}");
    // 264 tiles on 264 slots.
    let exact = Problem::nt(1, 128 * 22, 128 * 12, 4096);
    assert_eq!(sk.blocks(&exact), slots);
    let plain = m.predict(Choice { kernel: 1, splits: 1 }, &exact);
    let stream = m.predict_stream_k(1, &sk, &exact, slots).unwrap();
    assert!((stream / plain - 1.0).abs() < 0.02, "{stream} against {plain}");
    // Fewer blocks than slots take more steps each.
    assert!(
        m.predict_stream_k(1, &sk, &partial, slots / 2).unwrap()
            > m.predict_stream_k(1, &sk, &partial, slots).unwrap()
    );
    assert_eq!(m.predict_stream_k(1, &sk, &Problem::nt(1, 1, 8, 64), 3), None, "3 blocks, 2 steps");
}
