//! The GPU GEMM family's PTX (codegen::nvptx): every kernel of the family and of the
//! candidate space lowers and compiles; the PTX holds the instructions its schedule
//! implies, per loop iteration; a few kernels' PTX is golden text; and where ptxas
//! is available (`ANYSHAPE_PTXAS`, set by scripts/test.sh) every kernel assembles for
//! its targets without spills or warnings. Every kernel family also runs on the host
//! against the oracle, the device's operations emulated (`host`); their speed needs
//! a GPU: `scripts/gpu-dist.sh` and `bench/gpu/device.sh` (crates/gpu).
#![cfg(feature = "nvptx")]

use anyshape_codegen::nvptx;
use gpu::candidates;
use gpu::manifest::PtxasReport;
use gpu::{Activation, Arch, BLayout, ElemType, Epilogue, GemmKernel, ReduceKernel};
use std::path::PathBuf;

use anyshape_codegen::emulator as host;
mod programs;
use programs::{pointwise_programs, rounds};

fn all_epilogues() -> Vec<Epilogue> {
    vec![
        Epilogue::NONE,
        Epilogue { bias: true, ..Epilogue::NONE },
        Epilogue { bias: true, activation: Activation::GeluTanh, ..Epilogue::NONE },
        Epilogue { bias: true, residual: true, activation: Activation::Gelu, ..Epilogue::NONE },
    ]
}

/// The kernel's main loop: from its `loop` label to the branch back.
fn loop_body(ir: &str) -> &str {
    let start = ir.find("\nloop:").expect("a main loop");
    let end = ir[start..].find("\nepilogue:").expect("an epilogue") + start;
    &ir[start..end]
}

#[test]
fn every_family_kernel_compiles_and_its_loop_holds_its_schedule() {
    let mut n = 0;
    // Every kernel's IR; its PTX without an epilogue and with the largest (the two
    // between compile the same way, and ptxas below assembles more epilogues).
    let compiled = |e: &Epilogue| *e == Epilogue::NONE || e.residual;
    for elem in [ElemType::Bf16, ElemType::F16] {
        for epi in all_epilogues() {
            for b in [BLayout::KMajor, BLayout::NMajor] {
                for k in candidates::family(elem, b, epi) {
                    let ir = nvptx::llvm_ir(&k).unwrap();
                    let body = loop_body(&ir);
                    let (wm, wn) = k.warp_tile();
                    // Two k16 halves of a 32-wide step: A fragments, B fragment pairs, products.
                    assert_eq!(body.matches("ldmatrix").count(), 2 * (wm / 16 + wn / 16), "{k}");
                    assert_eq!(
                        body.matches("@llvm.nvvm.mma.m16n8k16").count(),
                        2 * (wm / 16) * (wn / 8),
                        "{k}"
                    );
                    let trans = body.matches(".trans.b16(").count();
                    assert_eq!(trans > 0, b == BLayout::NMajor, "{k}: ldmatrix.trans only for an N-major B");
                    if compiled(&epi) {
                        let ptx = nvptx::compile(&ir, &k.name(), k.arch).unwrap();
                        assert!(ptx.contains(".target sm_80"), "{k}");
                        assert!(ptx.contains(&format!(".entry {}(", k.name())), "{k}");
                    }
                    n += 1;
                }
            }
            for k in candidates::wgmma_family(elem, epi) {
                let ir = nvptx::llvm_ir(&k).unwrap();
                let body = loop_body(&ir);
                assert_eq!(body.matches("wgmma.mma_async").count(), 4, "{k}: four k16 steps a 64-wide step");
                let wait = if k.overlap {
                    "wgmma.wait_group.sync.aligned 1;"
                } else {
                    "wgmma.wait_group.sync.aligned 0;"
                };
                assert!(body.contains(wait), "{k}");
                let copies_ahead = if k.overlap { k.stages - 2 } else { k.stages - 1 };
                assert!(body.contains(&format!("add i32 %kt, {copies_ahead}")), "{k}");
                assert_eq!(body.matches(&format!("m64n{}k16", k.bn)).count(), 4, "{k}");
                assert!(body.contains("fence.proxy.async.shared::cta"), "{k}: copies made visible to wgmma");
                if compiled(&epi) {
                    let ptx = nvptx::compile(&ir, &k.name(), k.arch).unwrap();
                    assert!(ptx.contains(".target sm_90a"), "{k}");
                }
                n += 1;
            }
        }
    }
    assert!(n >= 80, "{n} kernels");
}

#[test]
fn split_k_kernels_write_f32_shares_and_reductions_apply_the_epilogue() {
    for elem in [ElemType::Bf16, ElemType::F16] {
        let family = candidates::split_k_family(elem);
        assert!(
            family.iter().any(|k| k.arch == Arch::Sm90a) && family.iter().any(|k| k.b == BLayout::NMajor)
        );
        for k in family {
            let ir = nvptx::llvm_ir(&k).unwrap();
            assert!(ir.contains("i64 %sc, i32 %kper"), "{k}: the split's steps are an argument");
            assert!(
                ir.contains("store <2 x float>") && !ir.contains("fptrunc"),
                "{k}: f32 partial sums, unrounded"
            );
            nvptx::compile(&ir, &k.name(), k.arch).unwrap();
        }
        for epilogue in all_epilogues() {
            let r = ReduceKernel { elem, epilogue, c_f32: false };
            let ir = nvptx::reduce_ir(&r).unwrap();
            assert!(ir.contains("phi float"), "{r}: sums the shares");
            assert_eq!(
                ir.contains("tanh.approx") || ir.contains("ex2.approx"),
                gpu::epilogue_approximate(&epilogue),
                "{r}"
            );
            assert_eq!(ir.contains("%bias, i64"), epilogue.bias, "{r}");
            nvptx::reduce_ptx(&r).unwrap();
        }
    }
}

/// The split-K kernels of the family that a model step takes (not TMA),
/// folding their shares themselves with `epilogue` into C (f32 where
/// `c_f32`, else bf16).
fn fold_family(epilogue: Epilogue, c_f32: bool) -> Vec<GemmKernel> {
    candidates::split_k_family(ElemType::Bf16)
        .into_iter()
        .filter(|k| !k.tma)
        .map(|k| GemmKernel { fold: true, epilogue, c_f32, ..k })
        .collect()
}

/// A folding split-K kernel takes its workspace and counters after `kper`,
/// counts its tiles' shares with an atomic add, sums them in a loop of
/// `<4 x float>` adds, and stores C of its own type through the epilogue;
/// LLVM's NVPTX target builds each form. A TMA kernel or an unsplit one
/// cannot fold.
#[test]
fn folding_split_k_kernels_count_and_sum_their_shares() {
    let e = Epilogue { bias: true, residual: true, activation: Activation::GeluTanh, ..Epilogue::NONE };
    for c_f32 in [true, false] {
        let family = fold_family(e, c_f32);
        assert!(family.iter().any(|k| k.arch == Arch::Sm90a) && family.iter().any(|k| k.arch == Arch::Sm80));
        for k in family {
            k.check().unwrap();
            assert!(k.name().contains("_skf"), "{k}");
            let ir = nvptx::llvm_ir(&k).unwrap();
            assert!(ir.contains("i32 %kper, ptr addrspace(1) align 16 %W, ptr addrspace(1) %cnt"), "{k}");
            assert!(ir.contains("atomicrmw add") && ir.contains("phi <4 x float>"), "{k}");
            assert_eq!(ir.contains("fptrunc float"), !c_f32, "{k}: C's type");
            nvptx::compile(&ir, &k.name(), k.arch).unwrap();
        }
    }
    let sk = candidates::split_k_family(ElemType::Bf16);
    let tma = sk.iter().find(|k| k.tma).expect("a TMA split-K kernel");
    assert!(GemmKernel { fold: true, ..*tma }.check().is_err());
    let whole = candidates::family(ElemType::Bf16, BLayout::KMajor, Epilogue::NONE)[0];
    assert!(GemmKernel { fold: true, ..whole }.check().is_err());
    assert!(
        GemmKernel { epilogue: e, ..sk[0] }.check().is_err(),
        "an unfolded split-K kernel has no epilogue"
    );
}

/// A Stream-K block's share index stays below `GemmKernel::stream_slots`:
/// over every block count up to the steps, each tile meets no more blocks
/// than the slots, and the block the kernel computes for a step
/// (`⌊((x+1)·G − 1)/I⌋`) is the one whose range holds it.
#[test]
fn stream_k_slots_hold_every_tiles_shares() {
    let k = candidates::stream_k_family(ElemType::Bf16, Epilogue::NONE)[0];
    for m in [1, 17, 100] {
        for depth in [32usize, 96, 1000] {
            let p = gpu::Problem::nt(1, m, 200, depth);
            let steps = depth.div_ceil(k.bk());
            let iters = k.blocks(&p) * steps;
            for blocks in 1..=iters {
                let slots = k.stream_slots(&p, blocks);
                let block_of = |x: usize| ((x + 1) * blocks - 1) / iters;
                for x in 0..iters {
                    let b = block_of(x);
                    assert!(b * iters / blocks <= x && x < (b + 1) * iters / blocks, "{p}: step {x}");
                }
                for t in 0..k.blocks(&p) {
                    let shares = block_of(t * steps + steps - 1) - block_of(t * steps) + 1;
                    assert!(
                        shares <= slots,
                        "{p} in {blocks} blocks: tile {t} in {shares} shares, {slots} slots"
                    );
                }
            }
            assert_eq!(k.stream_slots(&p, iters + 1), 0, "more blocks than steps");
        }
    }
}

#[test]
fn the_whole_candidate_space_lowers() {
    // The space is what the family is drawn from: every member must be buildable.
    let space = candidates::space(ElemType::Bf16, BLayout::KMajor, Epilogue::NONE);
    assert!(space.len() > 40, "{} candidates", space.len());
    for k in space.iter().step_by(3) {
        nvptx::ptx(k).unwrap_or_else(|e| panic!("{k}: {e}"));
    }
}

#[test]
fn an_invalid_kernel_is_an_error_not_a_panic() {
    let bad = GemmKernel {
        arch: Arch::Sm80,
        elem: ElemType::Bf16,
        b: BLayout::KMajor,
        bm: 48,
        bn: 64,
        warps_m: 2,
        warps_n: 2,
        stages: 3,
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
    };
    let e = nvptx::llvm_ir(&bad).unwrap_err().to_string();
    assert!(e.contains("warp tile 24x32"), "{e}");
    let pp = candidates::pingpong_family(ElemType::Bf16, Epilogue::NONE)[0];
    let pp_nn = GemmKernel { b: BLayout::NMajor, ..pp };
    assert!(nvptx::llvm_ir(&pp_nn).unwrap_err().to_string().contains("K-major"));
}

fn golden(name: &str, text: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name);
    if std::env::var("ANYSHAPE_BLESS").is_ok() {
        std::fs::write(&path, text).unwrap();
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (ANYSHAPE_BLESS=1 writes it)", path.display()));
    assert!(want == text, "{} differs from the generated PTX (ANYSHAPE_BLESS=1 rewrites it)", path.display());
}

#[test]
fn golden_ptx() {
    let small = GemmKernel {
        arch: Arch::Sm80,
        elem: ElemType::Bf16,
        b: BLayout::KMajor,
        bm: 16,
        bn: 64,
        warps_m: 1,
        warps_n: 4,
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
    };
    golden("gemm_bf16_nt_16x64_w1x4_s4.ptx", &nvptx::ptx(&small).unwrap());
    let nn = GemmKernel {
        b: BLayout::NMajor,
        epilogue: Epilogue { bias: true, activation: Activation::GeluTanh, ..Epilogue::NONE },
        ..small
    };
    golden("gemm_bf16_nn_16x64_w1x4_s4_bias_gelut.ptx", &nvptx::ptx(&nn).unwrap());
    let wg = GemmKernel { arch: Arch::Sm90a, bm: 64, bn: 128, warps_m: 4, warps_n: 1, ..small };
    golden("gemm_wg_bf16_nt_64x128_w4x1_s4.ptx", &nvptx::ptx(&wg).unwrap());
    let wgo = GemmKernel { overlap: true, ..wg };
    golden("gemm_wgo_bf16_nt_64x128_w4x1_s4.ptx", &nvptx::ptx(&wgo).unwrap());
    let wgt = GemmKernel { tma: true, ..wg };
    golden("gemm_wgt_bf16_nt_64x128_w4x1_s4.ptx", &nvptx::ptx(&wgt).unwrap());
    // A model's step reading its f32 A in place: A's chunks loaded, rounded
    // (`cvt.rn.bf16`) and stored to shared memory, B's still `cp.async`.
    let a32 = GemmKernel { a_f32: true, c_f32: true, ..small };
    let text = nvptx::ptx(&a32).unwrap();
    assert!(text.contains("cvt.rn.bf16") && text.contains("cp.async"), "{text}");
    golden("gemm_bf16_nt_16x64_w1x4_s4_a32_c32.ptx", &text);
}

/// The warp-specialized TMA kernels: the producer's loop holds one wait for an
/// empty stage, the byte count and the two tile copies; the consumers' loop one wait
/// for a full stage, four wgmma a step with one group left in flight, and the release
/// of the previous stage; registers move from the producer to two consumers.
#[test]
fn tma_kernels_split_producer_and_consumers() {
    let mut n = 0;
    for elem in [ElemType::Bf16, ElemType::F16] {
        for epi in all_epilogues() {
            let persistent = candidates::persistent_family(elem, epi);
            assert_eq!(persistent.len(), if epi.residual { 0 } else { 4 });
            for k in candidates::tma_family(elem, epi).into_iter().chain(persistent) {
                assert!(k.check().is_ok(), "{k}");
                let ir = nvptx::llvm_ir(&k).unwrap();
                let start = ir.find("\nproduce:").expect("a producer loop");
                let end = ir[start..].find("\ndone:").expect("the producer's exit") + start;
                let producer = &ir[start..end];
                assert_eq!(producer.matches("mbarrier.try_wait.parity").count(), 1, "{k}");
                assert_eq!(producer.matches("mbarrier.arrive.expect_tx").count(), 1, "{k}");
                let (a, b) = k.stage_bytes();
                assert!(producer.contains(&format!("i32 {})", a + b)), "{k}: the stage's bytes expected");
                assert_eq!(producer.matches("cp.async.bulk.tensor.3d").count(), 2, "{k}");
                assert!(!producer.contains("wgmma"), "{k}");
                let body = loop_body(&ir);
                assert_eq!(body.matches("mbarrier.try_wait.parity").count(), 1, "{k}");
                assert_eq!(body.matches(&format!("m64n{}k16", k.bn)).count(), 4, "{k}");
                assert!(body.contains("wgmma.wait_group.sync.aligned 1;"), "{k}");
                assert!(
                    body.contains("@p mbarrier.arrive.shared::cta.b64"),
                    "{k}: the previous stage released"
                );
                assert!(!body.contains("cp.async"), "{k}: consumers copy nothing");
                assert_eq!(
                    ir.matches("mbarrier.init").count(),
                    2 * k.stages,
                    "{k}: a full and an empty barrier a stage"
                );
                assert_eq!(ir.contains("setmaxnreg"), k.warpgroups() == 2, "{k}");
                assert!(ir.contains("\"minctasm\", i32 1"), "{k}");
                let ptx = nvptx::compile(&ir, &k.name(), k.arch).unwrap();
                assert!(ptx.contains(".target sm_90a") && ptx.contains(".minnctapersm 1"), "{k}");
                assert!(ptx.contains(&format!(".maxntid {}, 1, 1", k.threads())), "{k}");
                // A persistent kernel walks tiles `gridDim.x` apart, the batch an argument.
                assert_eq!(ir.contains("%tile.c.t1 = add i32 %tile.c.t"), k.persistent, "{k}");
                assert_eq!(ir.contains("%tile.p.t1 = add i32 %tile.p.t"), k.persistent, "{k}");
                assert_eq!(ir.contains("i32 %batch,"), k.persistent, "{k}");
                // Stores through shared memory in 16-byte chunks, but for a residual.
                assert_eq!(ir.contains("store <8 x i16>"), !epi.residual, "{k}");
                n += 1;
            }
        }
    }
    assert_eq!(n, 2 * (4 * 4 + 3 * 4));
}

/// The ping-pong kernels: two consumers, each over a 64-row tile of its own (its A
/// rows the stage's first, its warps' rows from 0), a stage read and released by
/// one of them; a consumer takes its turn before its tile's loop (a wait on its
/// own barrier) and gives it after (an arrival on the other's); tiles two apart.
#[test]
fn pingpong_kernels_take_turns() {
    let mut n = 0;
    for elem in [ElemType::Bf16, ElemType::F16] {
        for epi in all_epilogues() {
            let family = candidates::pingpong_family(elem, epi);
            assert_eq!(family.len(), if epi.residual { 0 } else { 2 });
            for k in family {
                assert!(k.check().is_ok() && k.pingpong && k.persistent && k.bm == 64, "{k}");
                assert!(k.name().starts_with("gemm_wgpp_"), "{k}");
                assert_eq!((k.warpgroups(), k.stage_readers(), k.threads()), (2, 1, 384), "{k}");
                assert_eq!(k.stages, if k.bn == 128 { 6 } else { 4 }, "{k}");
                let ir = nvptx::llvm_ir(&k).unwrap();
                // Two more barriers, each other consumer's 128 threads a phase; a
                // stage's empty barrier counts one consumer's 4 warps.
                let inits: Vec<&str> = ir.lines().filter(|l| l.contains("mbarrier.init")).collect();
                assert_eq!(inits.len(), 2 * k.stages + 2, "{k}");
                assert_eq!(inits.iter().filter(|l| l.ends_with("i32 128)")).count(), 2, "{k}");
                assert_eq!(inits.iter().filter(|l| l.ends_with("i32 4)")).count(), k.stages, "{k}");
                let start = ir.find("\nturn:").expect("a consumer's turn");
                let end = ir[start..].find("\nloop:").expect("the loop after the turn") + start;
                assert_eq!(ir[start..end].matches("mbarrier.try_wait.parity").count(), 1, "{k}");
                let epilogue = &ir[ir.find("\nepilogue:").unwrap()..];
                let give = epilogue.find("(i32 1, i32").expect("the turn given");
                assert!(give < epilogue.find("wgmma.wait_group.sync.aligned 0").unwrap(), "{k}");
                let body = loop_body(&ir);
                assert_eq!(body.matches("mbarrier.try_wait.parity").count(), 1, "{k}");
                assert_eq!(body.matches(&format!("m64n{}k16", k.bn)).count(), 4, "{k}");
                assert!(ir.contains("%tile.c.t1 = add i32 %tile.c.t, %"), "{k}");
                assert!(ir.contains("setmaxnreg"), "{k}");
                let ptx = nvptx::compile(&ir, &k.name(), k.arch).unwrap();
                assert!(ptx.contains(&format!(".maxntid {}, 1, 1", k.threads())), "{k}");
                n += 1;
            }
        }
    }
    assert_eq!(n, 2 * 3 * 2);
    // Not for a 128-row tile, nor a kernel that does not persist.
    let wide = candidates::persistent_family(ElemType::Bf16, Epilogue::NONE);
    let wide = wide.iter().find(|k| k.bm == 128).unwrap();
    assert!(GemmKernel { pingpong: true, ..*wide }.check().is_err());
    let tma = candidates::tma_family(ElemType::Bf16, Epilogue::NONE)[0];
    assert!(GemmKernel { pingpong: true, ..tma }.check().is_err());
}

/// With `ANYSHAPE_PTXAS` (scripts/test.sh sets it to the PyPI wheel's ptxas), every
/// family kernel assembles for sm_90a (and the mma.sync ones for sm_80) with no
/// spill and no warning. Without it the test says so and checks nothing else.
/// `k`'s PTX assembled by `ptxas` for its targets: no spills, no warnings.
fn assemble(k: &GemmKernel, dir: &std::path::Path, ptxas: &str) {
    let ptx_path = dir.join(format!("{}.ptx", k.name()));
    std::fs::write(&ptx_path, nvptx::ptx(k).unwrap()).unwrap();
    let arches: &[&str] = if k.arch == Arch::Sm90a { &["sm_90a"] } else { &["sm_90a", "sm_80"] };
    for arch in arches {
        let out = std::process::Command::new(ptxas)
            .args(["-v", "-arch", arch])
            .arg(&ptx_path)
            .arg("-o")
            .arg(dir.join(format!("{}.{arch}.cubin", k.name())))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{k} {arch}: {text}");
        let r = PtxasReport::parse(&text, &k.name()).unwrap();
        assert!(r.problems().is_empty(), "{k} {arch}: {:?}", r.problems());
        assert!(r.registers > 0 && r.registers <= 255, "{k} {arch}: {} registers", r.registers);
        if k.register_split().is_some() {
            // setmaxnreg moves registers within the block's allocation: it must
            // start at the most 384 threads get (65536 / 384, down to 8).
            assert_eq!(r.registers, 168, "{k}: setmaxnreg needs the full allocation");
        }
    }
}

#[test]
fn ptxas_accepts_every_family_kernel() {
    let ptxas = std::env::var("ANYSHAPE_PTXAS").ok();
    if !kernels::testing::require("ANYSHAPE_REQUIRE_PTXAS", ptxas.is_some(), "ptxas in ANYSHAPE_PTXAS") {
        return;
    }
    let ptxas = ptxas.unwrap_or_default();
    let dir = std::env::temp_dir().join(format!("anyshape-ptxas-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut kernels = candidates::family(ElemType::Bf16, BLayout::KMajor, Epilogue::NONE);
    kernels.extend(candidates::family(ElemType::F16, BLayout::NMajor, Epilogue::NONE));
    kernels.extend(candidates::wgmma_family(
        ElemType::Bf16,
        Epilogue { bias: true, residual: true, activation: Activation::Gelu, ..Epilogue::NONE },
    ));
    kernels.extend(candidates::wgmma_nn_family(
        ElemType::Bf16,
        Epilogue { bias: true, residual: true, activation: Activation::Gelu, ..Epilogue::NONE },
    ));
    kernels.extend(
        candidates::tma_nn_family(
            ElemType::Bf16,
            Epilogue { bias: true, activation: Activation::GeluTanh, ..Epilogue::NONE },
        )
        .into_iter()
        .filter(|k| k.bn == 256),
    );
    kernels.extend(candidates::tma_family(
        ElemType::Bf16,
        Epilogue { bias: true, residual: true, activation: Activation::Gelu, ..Epilogue::NONE },
    ));
    kernels.extend(candidates::tma_family(ElemType::F16, Epilogue::NONE));
    kernels.extend(candidates::persistent_family(ElemType::Bf16, Epilogue::NONE));
    kernels.extend(candidates::persistent_family(
        ElemType::Bf16,
        Epilogue { bias: true, activation: Activation::GeluTanh, ..Epilogue::NONE },
    ));
    kernels.extend(candidates::pingpong_family(ElemType::Bf16, Epilogue::NONE));
    kernels.extend(candidates::pingpong_family(
        ElemType::F16,
        Epilogue { bias: true, activation: Activation::GeluTanh, ..Epilogue::NONE },
    ));
    kernels.extend(candidates::split_k_family(ElemType::Bf16));
    kernels.extend(fold_family(Epilogue { bias: true, residual: true, ..Epilogue::NONE }, true));
    kernels
        .extend(fold_family(Epilogue { bias: true, activation: Activation::Gelu, ..Epilogue::NONE }, false));
    // Stream-K: the sweep's; the mma.sync and cp.async-fed ones with a bias, a
    // residual and GELU into f32 C (with an f32 A staged as well, ptxas spills
    // 4 bytes of the 16 × 64 tile for sm_80); the persistent TMA ones with a
    // bias and GELU into bf16 C (with a residual as well, 24-40 bytes). No
    // model step takes Stream-K yet.
    kernels.extend(candidates::stream_k_family(ElemType::Bf16, Epilogue::NONE));
    let e = Epilogue { bias: true, residual: true, activation: Activation::GeluTanh, ..Epilogue::NONE };
    let stream = candidates::stream_k_family(ElemType::Bf16, e).into_iter().filter(|k| !k.tma);
    kernels.extend(stream.map(|k| GemmKernel { c_f32: true, ..k }));
    let e = Epilogue { bias: true, activation: Activation::GeluTanh, ..Epilogue::NONE };
    kernels.extend(candidates::stream_k_family(ElemType::Bf16, e).into_iter().filter(|k| k.tma));
    kernels.extend(candidates::simt_family(ElemType::F16, Epilogue::NONE));
    kernels.extend(candidates::simt_family(
        ElemType::Bf16,
        Epilogue { bias: true, residual: true, activation: Activation::Gelu, ..Epilogue::NONE },
    ));
    kernels.extend(candidates::gemv_family(ElemType::F16, Epilogue::NONE));
    for p in pointwise_programs() {
        let e =
            Epilogue { bias: true, residual: true, activation: Activation::Pointwise(p), ..Epilogue::NONE };
        kernels.extend(candidates::tma_family(ElemType::Bf16, e).into_iter().take(1));
        kernels.extend(candidates::simt_family(ElemType::Bf16, e).into_iter().take(1));
    }
    // An f32 A read in place (a model's steps): every tile of the families a
    // model's plan launches, rounding A as it is staged.
    let e = Epilogue { bias: true, residual: true, ..Epilogue::NONE };
    let f32_a = |fam: Vec<GemmKernel>| fam.into_iter().map(|k| GemmKernel { a_f32: true, c_f32: true, ..k });
    kernels.extend(f32_a(candidates::family(ElemType::Bf16, BLayout::KMajor, e)));
    kernels.extend(f32_a(candidates::wgmma_family(ElemType::Bf16, e)));
    kernels.extend(f32_a(candidates::gemv_family(ElemType::Bf16, e)));
    kernels.extend(f32_a(candidates::unaligned_family(ElemType::Bf16, e)));
    kernels.extend(f32_a(candidates::simt_family(ElemType::Bf16, e)));
    // An f32 B read in place too (activations' products at few rows).
    let f32_b = |fam: Vec<GemmKernel>| {
        fam.into_iter().map(|k| GemmKernel { a_f32: true, b_f32: true, c_f32: true, ..k })
    };
    kernels.extend(f32_b(candidates::gemv_family(ElemType::Bf16, e)));
    kernels.extend(f32_b(candidates::simt_family(ElemType::Bf16, e)));
    // A convolution's taps read in place (implicit GEMM): every tile a model's
    // convolution may take, and the folding split-K forms.
    let taps = |k: GemmKernel| GemmKernel { a_taps: true, c_f32: true, ..k };
    kernels.extend(candidates::family(ElemType::Bf16, BLayout::KMajor, e).into_iter().map(taps));
    kernels.extend(candidates::wgmma_family(ElemType::Bf16, e).into_iter().filter(|k| !k.tma).map(taps));
    kernels.extend(fold_family(e, true).into_iter().map(taps));
    // A 16-bit copy of C stored beside it: every kind of kernel a step's list holds.
    let copy = |k: GemmKernel| GemmKernel { c16_copy: true, c_f32: true, ..k };
    kernels.extend(candidates::family(ElemType::Bf16, BLayout::KMajor, e).into_iter().take(2).map(copy));
    kernels
        .extend(candidates::wgmma_family(ElemType::Bf16, e).into_iter().filter(|k| !k.tma).take(2).map(copy));
    kernels.extend(fold_family(e, true).into_iter().take(2).map(copy));
    kernels.extend(candidates::unaligned_family(ElemType::Bf16, e).into_iter().take(1).map(copy));
    kernels.extend(candidates::gemv_family(ElemType::Bf16, e).into_iter().map(copy));
    kernels.extend(candidates::simt_family(ElemType::Bf16, e).into_iter().take(1).map(copy));
    // Normalizing GEMVs (a layer norm's rows, an RMS norm's).
    for norm in [
        gpu::RowNorm { centered: true, eps: 1e-5f32.to_bits() },
        gpu::RowNorm { centered: false, eps: 1e-6f32.to_bits() },
    ] {
        let normalizing = move |k: GemmKernel| GemmKernel { a_f32: true, c_f32: true, norm: Some(norm), ..k };
        kernels.extend(
            candidates::gemv_family(ElemType::Bf16, e).into_iter().filter(|k| k.bm <= 4).map(normalizing),
        );
    }
    kernels.extend(candidates::unaligned_family(ElemType::F16, Epilogue::NONE));
    kernels.extend(candidates::unaligned_family(
        ElemType::Bf16,
        Epilogue { bias: true, residual: true, activation: Activation::Gelu, ..Epilogue::NONE },
    ));
    kernels.extend(candidates::gemv_family(
        ElemType::Bf16,
        Epilogue { bias: true, residual: true, activation: Activation::GeluTanh, ..Epilogue::NONE },
    ));
    // f32 outputs (a model's plan): every family but the persistent one.
    let model_epi = Epilogue { bias: true, residual: true, activation: Activation::Gelu, ..Epilogue::NONE };
    let f32_c = [
        candidates::family(ElemType::Bf16, BLayout::KMajor, model_epi),
        candidates::unaligned_family(ElemType::Bf16, model_epi),
        candidates::gemv_family(ElemType::Bf16, model_epi),
        candidates::simt_family(ElemType::Bf16, model_epi),
        candidates::wgmma_family(ElemType::Bf16, model_epi),
        candidates::tma_family(ElemType::Bf16, Epilogue { residual: false, ..model_epi }),
    ];
    kernels.extend(
        f32_c.into_iter().flat_map(|f| f.into_iter().take(1)).map(|k| GemmKernel { c_f32: true, ..k }),
    );
    // One ptxas at a time per core: the kernels are dealt out among threads (each
    // name once: its files are the thread's alone).
    let mut names = std::collections::HashSet::new();
    kernels.retain(|k| names.insert(k.name()));
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|s| {
        for t in 0..threads {
            let (kernels, dir, ptxas) = (&kernels, &dir, &ptxas);
            s.spawn(move || {
                for k in kernels.iter().skip(t).step_by(threads) {
                    assemble(k, dir, ptxas);
                }
            });
        }
    });
    std::fs::remove_dir_all(&dir).ok();
}

/// With `ANYSHAPE_PTXAS`, the split-K reductions assemble for sm_90a and sm_80
/// with no spill and no warning: the family's (16-bit C) and a model step's
/// (f32 C, bias and residual), with the epilogues a model's steps carry.
#[test]
fn ptxas_accepts_the_reductions() {
    let ptxas = std::env::var("ANYSHAPE_PTXAS").ok();
    if !kernels::testing::require("ANYSHAPE_REQUIRE_PTXAS", ptxas.is_some(), "ptxas in ANYSHAPE_PTXAS") {
        return;
    }
    let ptxas = ptxas.unwrap_or_default();
    let dir = std::env::temp_dir().join(format!("anyshape-ptxas-reduce-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let epilogues = [
        Epilogue::NONE,
        Epilogue { bias: true, residual: true, ..Epilogue::NONE },
        Epilogue { bias: true, activation: Activation::Gelu, ..Epilogue::NONE },
        Epilogue { scale: Some(0.5), residual: true, ..Epilogue::NONE },
    ];
    for epilogue in epilogues {
        for c_f32 in [false, true] {
            let r = ReduceKernel { elem: ElemType::Bf16, epilogue, c_f32 };
            let ptx_path = dir.join(format!("{}.ptx", r.name()));
            std::fs::write(&ptx_path, nvptx::reduce_ptx(&r).unwrap()).unwrap();
            for arch in ["sm_90a", "sm_80"] {
                let out = std::process::Command::new(&ptxas)
                    .args(["-v", "-arch", arch])
                    .arg(&ptx_path)
                    .arg("-o")
                    .arg(dir.join(format!("{}.{arch}.cubin", r.name())))
                    .output()
                    .unwrap();
                let text = String::from_utf8_lossy(&out.stderr).to_string();
                assert!(out.status.success(), "{r} {arch}: {text}");
                let report = PtxasReport::parse(&text, &r.name()).unwrap();
                assert!(report.problems().is_empty(), "{r} {arch}: {:?}", report.problems());
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Kernels run on the host (`host`): the split-K reduction and the SIMT GEMMs a
/// thread at a time, the GEMV, mma.sync, wgmma and TMA GEMMs a block at a time with
/// the device's operations emulated.
mod on_the_host {
    use super::*;
    use gpu::reference::{self, Operands};
    use gpu::{Choice, Cover, Problem, Split};
    use inkwell::context::Context;
    use inkwell::execution_engine::ExecutionEngine;
    use plan::{Pointwise, PwBinary, PwOp, PwUnary};
    use proptest::prelude::*;

    /// The module of `ir` (a kernel named `name`), made for the host and compiled.
    fn engine<'c>(ctx: &'c Context, ir: &str, name: &str) -> Result<ExecutionEngine<'c>, TestCaseError> {
        host::engine(ctx, ir, name).map_err(TestCaseError::fail)
    }

    /// Seeded values in [-1, 1).
    fn values(seed: u64) -> impl FnMut() -> f32 {
        let mut state = seed;
        move || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
    }

    fn bf16(x: f32) -> u16 {
        reference::to_bits(ElemType::Bf16, x)
    }

    fn f32_of(h: u16) -> f32 {
        reference::from_bits(ElemType::Bf16, h)
    }

    const CANARY: u16 = 0x7fc1;

    /// `C[m, n] = act(Σ_s W[s, m, n] (+ bias[n]) (+ residual[m, n]))` through
    /// the generated reduction `r`, `C` (16-bit, or f32 with `r.c_f32`, as the
    /// bias and the residual) with a row stride `ldc` and canaries past each row.
    fn reduce(r: ReduceKernel, m: usize, n: usize, splits: usize, seed: u64) -> Result<(), TestCaseError> {
        let name = r.name();
        let ctx = Context::create();
        let ee = engine(&ctx, &nvptx::reduce_ir(&r).map_err(|e| TestCaseError::fail(e.to_string()))?, &name)?;
        // SAFETY: the signature is the kernel's parameter list (`reduce_ir`) plus the
        // four indices `for_host` appended: the emulator's `Reduce`.
        let f = unsafe { ee.get_function::<host::Reduce>(&name) }.unwrap();
        // C's type as bytes, and its values read back as f32.
        let store = |x: f32| -> Vec<u8> {
            if r.c_f32 {
                x.to_le_bytes().to_vec()
            } else {
                bf16(x).to_le_bytes().to_vec()
            }
        };
        let size = if r.c_f32 { 4 } else { 2 };
        let load = |b: &[u8], i: usize| -> f32 {
            let at = &b[i * size..(i + 1) * size];
            if r.c_f32 {
                f32::from_le_bytes([at[0], at[1], at[2], at[3]])
            } else {
                f32_of(u16::from_le_bytes([at[0], at[1]]))
            }
        };
        let mut rnd = values(seed);
        let ldc = n + 3;
        let sw = m * n + 5;
        let w: Vec<f32> = (0..splits.max(1) * sw).map(|_| rnd()).collect();
        let bias: Vec<u8> = (0..n).flat_map(|_| store(rnd())).collect();
        let res: Vec<u8> = (0..m * ldc).flat_map(|_| store(rnd())).collect();
        let canary = if r.c_f32 {
            f32::from_bits(0x7fc0_0321).to_le_bytes().to_vec()
        } else {
            CANARY.to_le_bytes().to_vec()
        };
        let mut c: Vec<u8> = (0..m * ldc).flat_map(|_| canary.clone()).collect();
        let threads = ReduceKernel::THREADS;
        for block in 0..(m * n).div_ceil(threads) {
            for t in 0..threads {
                // SAFETY: W holds `splits` shares of `sw ≥ m·n` values, C and the residual
                // `m` rows of `ldc ≥ n` elements of C's type, bias `n`: every index the
                // kernel forms for thread `block·THREADS + t` (nothing past `m·n`) is
                // inside them.
                unsafe {
                    f.call(
                        w.as_ptr(),
                        c.as_mut_ptr(),
                        bias.as_ptr(),
                        res.as_ptr(),
                        m as i32,
                        n as i32,
                        ldc as i32,
                        splits as i32,
                        sw as i64,
                        t as i32,
                        block as i32,
                        0,
                        0,
                    )
                };
            }
        }
        let tolerance = if r.c_f32 { 1e-5 } else { 1e-2 };
        for i in 0..m {
            for j in 0..n {
                let mut want: f64 = (0..splits).map(|s| f64::from(w[s * sw + i * n + j])).sum();
                if r.epilogue.bias {
                    want += f64::from(load(&bias, j));
                }
                if r.epilogue.residual {
                    want += f64::from(load(&res, i * ldc + j));
                }
                let want = reference::activation(r.epilogue.activation, want);
                let got = f64::from(load(&c, i * ldc + j));
                prop_assert!(
                    (got - want).abs() <= tolerance * (1.0 + want.abs()),
                    "{name} {m}x{n} splits {splits} at ({i}, {j}): {got} for {want}"
                );
            }
            let padding = &c[(i * ldc + n) * size..(i + 1) * ldc * size];
            prop_assert!(
                padding.chunks(size).all(|x| x == canary.as_slice()),
                "{name}: row {i}'s padding written"
            );
        }
        Ok(())
    }

    const EPILOGUES: [Epilogue; 3] = [
        Epilogue::NONE,
        Epilogue { bias: true, ..Epilogue::NONE },
        Epilogue { bias: true, residual: true, ..Epilogue::NONE },
    ];

    /// A model step's reduction (`c_f32`): f32 C, bias and residual, the sum
    /// and epilogue unrounded; C with a row stride and canaries past each row.
    #[test]
    fn a_model_steps_reduction_stores_f32() {
        let tanh = Epilogue { bias: true, residual: true, activation: Activation::Tanh, ..Epilogue::NONE };
        for e in EPILOGUES.into_iter().chain([tanh]) {
            for (m, n, splits) in [(1, 5, 2), (3, 37, 9), (17, 64, 3)] {
                let r = ReduceKernel { elem: ElemType::Bf16, epilogue: e, c_f32: true };
                assert!(r.check().is_ok() && r.name().contains("_c32"), "{r}");
                reduce(r, m, n, splits, m as u64 * 31 + splits as u64).unwrap();
            }
        }
    }

    #[test]
    fn the_reduction_at_every_split_count_of_the_bench_and_one_past_a_chunk() {
        for splits in [1, 2, 3, 7, 8, 9, 12, 16, 17] {
            for e in EPILOGUES {
                reduce(
                    ReduceKernel { elem: ElemType::Bf16, epilogue: e, c_f32: false },
                    3,
                    37,
                    splits,
                    splits as u64,
                )
                .unwrap();
            }
        }
    }

    /// A SIMT kernel on `p` with A's rows `lda = K + lda_pad` apart and C's `ldc = N +
    /// ldc_pad`, run over its whole grid, against the host oracle; canaries in C's
    /// padding and past its end.
    fn simt(
        k: &GemmKernel,
        p: Problem,
        lda_pad: usize,
        ldc_pad: usize,
        seed: u64,
    ) -> Result<(), TestCaseError> {
        host_cover(&[*k], &Cover::one(Choice { kernel: 0, splits: 1 }), p, (lda_pad, ldc_pad), seed)
    }

    /// Raw pointers a block's threads share: A, B, C, the bias, the residual.
    #[derive(Clone, Copy)]
    struct Ptrs(*const u16, *const u16, *mut u16, *const u16, *const u16);
    // SAFETY: they point into buffers that outlive the threads that use them (which
    // all return in `host::run_blocks`); the kernels' threads write disjoint elements of C.
    unsafe impl Send for Ptrs {}
    unsafe impl Sync for Ptrs {}

    impl Ptrs {
        /// The pointers (a closure calling this captures the whole `Ptrs`).
        fn get(self) -> (*const u16, *const u16, *mut u16, *const u16, *const u16) {
            (self.0, self.1, self.2, self.3, self.4)
        }
    }

    /// A cover of `p` by kernels of `kernels` that run on the host (SIMT, GEMV and
    /// mma.sync; one element type, B layout and epilogue), each piece run over its
    /// whole grid on A, C and the residual from its first row on, as the runner
    /// launches it (a SIMT kernel a thread at a time, the others a block at a time,
    /// its threads as coroutines); the whole product against the host oracle,
    /// canaries around C and in its rows' padding.
    fn host_cover(
        kernels: &[GemmKernel],
        cover: &Cover,
        p: Problem,
        (lda_pad, ldc_pad): (usize, usize),
        seed: u64,
    ) -> Result<(), TestCaseError> {
        let k = &kernels[cover.main.kernel];
        // The callers' shapes name dims; the B layout is the kernels'.
        let p = p.with_b(k.b);
        let name = cover.text(kernels, &p);
        let ctx = Context::create();
        let mut rnd = values(seed);
        let (lda, ldc) = (p.k + lda_pad, p.n + ldc_pad);
        let (sa, sb, sc) = (p.m * lda, p.n * p.k, p.m * ldc);
        let bits = |rnd: &mut dyn FnMut() -> f32, n: usize| -> Vec<u16> {
            (0..n).map(|_| reference::to_bits(k.elem, rnd())).collect()
        };
        let a = bits(&mut rnd, p.batch * sa);
        let b = bits(&mut rnd, p.batch * sb);
        let bias = bits(&mut rnd, p.n);
        let res = bits(&mut rnd, p.batch * sc);
        // An f32 C (`c_f32`) reads the same values as f32 (so the oracle holds) and
        // is stored as pairs of 16-bit words.
        let wide = |v: &[u16]| -> Vec<u16> {
            v.iter()
                .flat_map(|&x| {
                    let w = reference::from_bits(k.elem, x).to_bits();
                    [w as u16, (w >> 16) as u16]
                })
                .collect()
        };
        let (bias_in, res_in) = if k.c_f32 { (wide(&bias), wide(&res)) } else { (bias.clone(), res.clone()) };
        let cw = if k.c_f32 { 2 } else { 1 };
        // An f32 A (`a_f32`): each value's f32; for the tensor-core kernels, which
        // round it to bf16 as they stage it, with low bits (never a tie) that the
        // rounding to nearest must drop or carry: the oracle reads the rounded
        // values (GEMV and SIMT kernels multiply the f32 values as they are).
        let aw = if k.a_f32 { 2 } else { 1 };
        let noise = k.a_f32 && k.elem == ElemType::Bf16 && matches!(k.arch, Arch::Sm80 | Arch::Sm90a);
        let mut a = a;
        let a_in: Vec<u16> = if k.a_f32 {
            a.iter_mut()
                .enumerate()
                .flat_map(|(i, x)| {
                    let mut w = reference::from_bits(k.elem, *x).to_bits();
                    if noise {
                        let low = ((i as u32).wrapping_mul(2_654_435_761) >> 16) | 1;
                        w |= low;
                        // Past half an ulp the magnitude rounds up a step.
                        *x += u16::from(low > 0x8000);
                    }
                    [w as u16, (w >> 16) as u16]
                })
                .collect()
        } else {
            a.clone()
        };
        // An f32 B (`b_f32`, GEMV and SIMT kernels): each value's f32, multiplied as it is.
        let b_in = if k.b_f32 { wide(&b) } else { b.clone() };
        // C between two margins of canaries, 16-byte aligned where it starts.
        let margin = 16;
        let c_len = 2 * margin + p.batch * sc;
        let (a16, b16, mut c16) =
            (host::aligned(&a_in), host::aligned(&b_in), host::aligned(&vec![CANARY; cw * c_len]));
        let ldb = k.b.extent(&p).1;
        let pieces = cover.pieces(kernels, &p);
        let rows: usize = pieces.iter().map(|x| x.problem.m).sum();
        prop_assert_eq!(rows, p.m, "{}: the pieces cover every row once", &name);
        for piece in pieces {
            let (pk, q) = (&kernels[piece.choice.kernel], piece.problem);
            prop_assert!(!pk.split_k, "{}: host_split_k runs it", pk);
            prop_assert!(
                pk.elem == k.elem
                    && pk.b == k.b
                    && pk.epilogue == k.epilogue
                    && pk.a_f32 == k.a_f32
                    && pk.b_f32 == k.b_f32
            );
            let ee = engine(&ctx, &nvptx::llvm_ir(pk).unwrap(), &pk.name())?;
            // The piece's rows start `first_row` rows into A, C and the residual.
            let (ra, rc) = (piece.first_row * lda, piece.first_row * ldc);
            prop_assert!(ra < a.len() && rc < p.batch * sc && rc < res.len());
            if pk.tma {
                // A's and B's tensor maps as `Gpu::tensor_maps` encodes them.
                let map =
                    |base: usize, (cols, rows, ld, stride): (usize, usize, usize, usize), box_rows: usize| {
                        host::HostTensorMap {
                            base: base as u64,
                            dims: [cols as u64, rows as u64, q.batch as u64],
                            strides: [2 * ld as u64, 2 * stride as u64],
                            box_rows: box_rows as u64,
                            pad: [0; 9],
                        }
                    };
                // An N-major B: K rows of N, in boxes of a step's K rows.
                let b_map = match pk.b {
                    BLayout::NMajor => (q.n, q.k, ldb, sb),
                    _ => (q.k, q.n, ldb, sb),
                };
                let b_box = if pk.b == BLayout::NMajor { 64 } else { pk.bn };
                let maps = [
                    map(a16.as_ptr() as usize + 2 * ra, (q.k, q.m, lda, sa), pk.bm),
                    map(b16.as_ptr() as usize, b_map, b_box),
                ];
                let addr =
                    ee.get_function_address(&pk.name()).map_err(|e| TestCaseError::fail(e.to_string()))?;
                let c = (c16.as_mut_ptr() as usize) + 2 * cw * (margin + rc);
                let (res_at, bias_at) = (res_in.as_ptr() as usize + 2 * cw * rc, bias_in.as_ptr() as usize);
                let tiles = q.n.div_ceil(pk.bn) * q.m.div_ceil(pk.bm) * q.batch;
                let thread = |tid: usize, x: usize, y: usize, z: usize| {
                    let head = (maps[0].base as *const u16, maps[1].base as *const u16, c as *mut u16);
                    let (m, n, kk, la, lb, lc) =
                        (q.m as i32, q.n as i32, q.k as i32, lda as i32, ldb as i32, ldc as i32);
                    let (tm_a, tm_b) =
                        (&maps[0] as *const host::HostTensorMap, &maps[1] as *const host::HostTensorMap);
                    let (ix, iy, iz, it) = (x as i32, y as i32, z as i32, tid as i32);
                    // SAFETY: the JIT compiled the TMA ABI (`gpu::kernel::ABI`, the
                    // batch, the two maps as plain pointers on the host) plus the four
                    // indices (`host::TmaGemm`); the maps describe A and B inside
                    // their buffers, and the kernel stores C inside its M and N.
                    unsafe {
                        let f: host::TmaGemm = std::mem::transmute::<usize, host::TmaGemm>(addr);
                        f(
                            head.0,
                            head.1,
                            head.2,
                            bias_at as *const u16,
                            res_at as *const u16,
                            m,
                            n,
                            kk,
                            la,
                            lb,
                            lc,
                            sa as i64,
                            sb as i64,
                            sc as i64,
                            q.batch as i32,
                            tm_a,
                            tm_b,
                            it,
                            ix,
                            iy,
                            iz,
                        )
                    }
                };
                // A persistent kernel: fewer blocks than tiles, so that each walks several.
                let grid = if pk.persistent {
                    (tiles.min(3), 1, 1)
                } else {
                    (q.n.div_ceil(pk.bn), q.m.div_ceil(pk.bm), q.batch)
                };
                host::run_blocks(grid, pk.threads(), pk.smem_bytes(), thread);
                continue;
            }
            let f = host::gemm_entry(&ee, &pk.name()).map_err(TestCaseError::fail)?;
            // SAFETY: the offsets lie inside the buffers (checked above).
            let at = unsafe {
                Ptrs(
                    (a16.as_ptr() as *const u16).add(aw * ra),
                    b16.as_ptr() as *const u16,
                    (c16.as_mut_ptr() as *mut u16).add(cw * (margin + rc)),
                    bias_in.as_ptr(),
                    res_in.as_ptr().add(cw * rc),
                )
            };
            let thread = |tid: usize, x: usize, y: usize, z: usize| {
                let (a, b, c, bias, res) = at.get();
                // SAFETY: A holds `batch` entries of `m` rows of `lda ≥ K`, B `batch`
                // entries of its `[N, K]` or `[K, N]`, C and the residual `batch`
                // entries of `m` rows of `ldc ≥ N` (C between margins), bias `N`; the
                // piece's rows lie inside `m`, and the kernel reads inside its M, N and
                // K (clamped, or zero-filled past them) and stores inside its M and N.
                unsafe {
                    f(
                        a, b, c, bias, res, q.m as i32, q.n as i32, q.k as i32, lda as i32, ldb as i32,
                        ldc as i32, sa as i64, sb as i64, sc as i64, tid as i32, x as i32, y as i32,
                        z as i32,
                    )
                }
            };
            let grid = (q.n.div_ceil(pk.bn), q.m.div_ceil(pk.bm), q.batch);
            if pk.arch == Arch::Simt {
                // No warp-wide operation: a thread at a time.
                for z in 0..grid.2 {
                    for y in 0..grid.1 {
                        for x in 0..grid.0 {
                            for t in 0..pk.threads() {
                                thread(t, x, y, z);
                            }
                        }
                    }
                }
            } else {
                host::run_blocks(grid, pk.threads(), pk.smem_bytes(), thread);
            }
        }
        let c16 = host::as_u16(&c16, cw * c_len);
        let c: Vec<u32> = (0..c_len)
            .map(|i| {
                if k.c_f32 {
                    u32::from(c16[2 * i]) | u32::from(c16[2 * i + 1]) << 16
                } else {
                    c16[i].into()
                }
            })
            .collect();
        let canary = if k.c_f32 { u32::from(CANARY) << 16 | u32::from(CANARY) } else { CANARY.into() };
        let value = |x: u32| if k.c_f32 { f32::from_bits(x) } else { reference::from_bits(k.elem, x as u16) };
        let unpad = |v: &[u16], ld: usize, w: usize| -> Vec<u16> {
            (0..p.batch * p.m).flat_map(|r| v[r * ld..r * ld + w].iter().copied()).collect()
        };
        let (a0, r0) = (unpad(&a, lda, p.k), unpad(&res, ldc, p.n));
        let o = Operands { elem: k.elem, a: &a0, b: &b, bias: &bias, residual: &r0 };
        let want = reference::gemm(&p, &k.epilogue, &o);
        let scale = (p.k as f64 / 9.0).sqrt().max(1.0);
        prop_assert!(c[..margin].iter().all(|&x| x == canary), "{} {}: before C written", name, p);
        prop_assert!(
            c[margin + p.batch * sc..].iter().all(|&x| x == canary),
            "{} {}: past C's end written",
            name,
            p
        );
        for z in 0..p.batch {
            for i in 0..p.m {
                for j in 0..ldc {
                    let got = c[margin + z * sc + i * ldc + j];
                    if j >= p.n {
                        prop_assert_eq!(
                            got,
                            canary,
                            "{} {}: padding C[{}, {}, {}] written",
                            name,
                            p,
                            z,
                            i,
                            j
                        );
                        continue;
                    }
                    let w = want[(z * p.m + i) * p.n + j];
                    let g = value(got);
                    prop_assert!(
                        reference::close(k.c_type(), g, w, scale, gpu::epilogue_approximate(&k.epilogue)),
                        "{} {} lda+{} ldc+{}: C[{}, {}, {}] = {}, want {}",
                        name,
                        p,
                        lda_pad,
                        ldc_pad,
                        z,
                        i,
                        j,
                        g,
                        w
                    );
                }
            }
        }
        Ok(())
    }

    fn simt_kernels() -> Vec<GemmKernel> {
        let mut out = Vec::new();
        for e in EPILOGUES {
            out.extend(candidates::simt_family(ElemType::Bf16, e));
        }
        out
    }

    #[test]
    fn simt_kernels_at_the_edges() {
        let kernels = simt_kernels();
        assert_eq!(kernels.len(), 12, "two tiles, two layouts, three epilogues");
        for (x, k) in kernels.iter().enumerate() {
            // One element; one past a tile with an odd K; a batch with odd strides.
            simt(k, Problem::nt(1, 1, 1, 1), 0, 0, x as u64).unwrap();
            simt(k, Problem::nt(1, k.bm + 1, k.bn + 1, 13), 1, 2, x as u64).unwrap();
            simt(k, Problem::nt(2, 7, 19, 37), 3, 1, x as u64).unwrap();
        }
    }

    /// FTuner's two sizes along M: a main kernel over whole tiles of its height and
    /// another over the rows below, each launched on A, C and the residual offset
    /// by the main's rows (`Cover::pieces`), give the whole product.
    #[test]
    fn two_size_covers_give_the_whole_product() {
        let e = Epilogue { bias: true, residual: true, ..Epilogue::NONE };
        for b in [BLayout::KMajor, BLayout::NMajor] {
            let kernels: Vec<GemmKernel> =
                candidates::simt_family(ElemType::Bf16, e).into_iter().filter(|k| k.b == b).collect();
            assert_eq!(kernels.iter().map(|k| k.bm).collect::<Vec<_>>(), [32, 64]);
            let cover = |main: usize, max_tiles: usize| Cover {
                main: Choice { kernel: main, splits: 1 },
                split: Some(Split { max_tiles, rest: Choice { kernel: 1 - main, splits: 1 } }),
            };
            // Every whole 64-row tile, then five rows by the 32-row kernel.
            let p = Problem::nt(1, 2 * 64 + 5, 37, 29);
            assert_eq!(cover(1, usize::MAX).rows(&kernels, &p), 128);
            host_cover(&kernels, &cover(1, usize::MAX), p, (1, 2), 1).unwrap();
            // One 32-row tile in each of two batch entries, 71 rows by the other.
            let p = Problem::nt(2, 3 * 32 + 7, 19, 13);
            assert_eq!(cover(0, 1).rows(&kernels, &p), 32);
            host_cover(&kernels, &cover(0, 1), p, (3, 1), 2).unwrap();
        }
    }

    /// Every GEMV kernel of the family, without an epilogue and with a bias and a
    /// residual (GELU is inline PTX): one row, a block's rows and one past, K of one
    /// chunk, of one warp step and one past, odd N, a batch, and row strides past K
    /// and N. (A warp's lanes run as coroutines: a few warps a case.)
    #[test]
    fn gemv_kernels_at_the_edges() {
        for e in [EPILOGUES[0], EPILOGUES[2]] {
            let kernels = candidates::gemv_family(ElemType::Bf16, e);
            assert_eq!(kernels.iter().map(|k| k.bm).collect::<Vec<_>>(), [1, 4, 8]);
            for (x, k) in kernels.iter().enumerate() {
                let one = Cover::one(Choice { kernel: x, splits: 1 });
                host_cover(&kernels, &one, Problem::nt(1, 1, 1, 8), (0, 0), 1).unwrap();
                host_cover(&kernels, &one, Problem::nt(1, k.bm + 1, 5, 256), (8, 3), 2).unwrap();
                host_cover(&kernels, &one, Problem::nt(2, 3, 3, 1032), (16, 1), 3).unwrap();
                host_cover(&kernels, &one, Problem::nt(1, 2, 4, 776), (0, 0), 4).unwrap();
            }
        }
    }

    /// The mma.sync kernels (`Arch::Sm80`) whose products run on the host: bf16, both
    /// B layouts, and the epilogues of the built family on its two K-major tiles.
    fn mma_kernels() -> Vec<GemmKernel> {
        let mut out = candidates::family(ElemType::Bf16, BLayout::KMajor, Epilogue::NONE);
        out.extend(candidates::family(ElemType::Bf16, BLayout::NMajor, Epilogue::NONE));
        for e in &EPILOGUES[1..] {
            out.extend(
                candidates::family(ElemType::Bf16, BLayout::KMajor, *e)
                    .into_iter()
                    .filter(|k| matches!((k.bm, k.bn), (16, 64) | (128, 128))),
            );
        }
        out
    }

    /// Every mma.sync kernel above on the host, `cp.async`, `ldmatrix` and `mma`
    /// emulated: one past a tile in M and N with K a step and a half, a batch with K
    /// half a step, and a tile's rows less one with row strides past K and N.
    #[test]
    fn mma_sync_kernels_at_the_edges() {
        let kernels = mma_kernels();
        for (x, k) in kernels.iter().enumerate() {
            let n8 = |n: usize| if k.b == BLayout::NMajor { n.div_ceil(8) * 8 } else { n };
            let one = Cover::one(Choice { kernel: x, splits: 1 });
            host_cover(&kernels, &one, Problem::nt(1, k.bm + 1, n8(k.bn + 3), 48), (0, 0), 1).unwrap();
            host_cover(&kernels, &one, Problem::nt(2, 13, n8(19), 16), (8, 1), 2).unwrap();
            host_cover(&kernels, &one, Problem::nt(1, 2 * k.bm - 1, n8(k.bn + 9), 104), (8, 3), 3).unwrap();
        }
    }

    /// A split-K kernel's entry on the host (the emulator's).
    use host::SplitGemm;

    /// Split-K mma.sync kernel `k` on `p` (one product) in `splits` shares of K, as
    /// `Gpu::launch_split` launches it: each share's f32 partial product into its
    /// `[M, N]` slice of the workspace; the slices' sum against the oracle's product,
    /// and the floats past the last slice untouched.
    fn host_split_k(k: &GemmKernel, p: Problem, splits: usize, seed: u64) -> Result<(), TestCaseError> {
        let p = p.with_b(k.b);
        let name = k.name();
        let ctx = Context::create();
        let ee = engine(&ctx, &nvptx::llvm_ir(k).unwrap(), &name)?;
        let addr = ee.get_function_address(&name).map_err(|e| TestCaseError::fail(e.to_string()))?;
        // SAFETY: the JIT compiled the split-K ABI (with `kper`) plus the four indices
        // (`for_host`), which is `SplitGemm`; `ee` outlives every call below.
        let f: SplitGemm = unsafe { std::mem::transmute::<usize, SplitGemm>(addr) };
        let (per, splits) = k.split_plan(p.k, splits);
        let mut rnd = values(seed);
        let a: Vec<u16> = (0..p.m * p.k).map(|_| bf16(rnd())).collect();
        let b: Vec<u16> = (0..p.n * p.k).map(|_| bf16(rnd())).collect();
        let (a16, b16) = (host::aligned(&a), host::aligned(&b));
        let mn = p.m * p.n;
        let canary = f32::from_bits(0x7fc0_0123);
        let mut w = vec![canary; splits * mn + 8];
        let (ldb, zero) = (k.b.extent(&p).1, 0i64);
        let at = (a16.as_ptr() as usize, b16.as_ptr() as usize, w.as_mut_ptr() as usize);
        host::run_blocks(
            (p.n.div_ceil(k.bn), p.m.div_ceil(k.bm), splits),
            k.threads(),
            k.smem_bytes(),
            |t, x, y, z| {
                // SAFETY: A is `[M, K]`, B `[N, K]` or `[K, N]`, the workspace `splits`
                // slices of `M·N` floats (and 8 more): split `z` reads A and B inside M, N
                // and its share of K and writes its slice inside M and N.
                unsafe {
                    f(
                        at.0 as *const u16,
                        at.1 as *const u16,
                        at.2 as *mut f32,
                        std::ptr::null(),
                        std::ptr::null(),
                        p.m as i32,
                        p.n as i32,
                        p.k as i32,
                        p.k as i32,
                        ldb as i32,
                        p.n as i32,
                        zero,
                        zero,
                        mn as i64,
                        per as i32,
                        t as i32,
                        x as i32,
                        y as i32,
                        z as i32,
                    )
                }
            },
        );
        let o = Operands { elem: k.elem, a: &a, b: &b, bias: &[], residual: &[] };
        let want = reference::gemm(&p, &Epilogue::NONE, &o);
        for i in 0..mn {
            let got: f64 = (0..splits).map(|s| f64::from(w[s * mn + i])).sum();
            prop_assert!(
                (got - want[i]).abs() <= 1e-3 * (1.0 + want[i].abs()),
                "{} {} x{}: element {}: {} want {}",
                name,
                p,
                splits,
                i,
                got,
                want[i]
            );
        }
        prop_assert!(
            w[splits * mn..].iter().all(|x| x.to_bits() == canary.to_bits()),
            "{} {}: past the workspace written",
            name,
            p
        );
        Ok(())
    }

    /// The split-K mma.sync kernels of the family on the host: 1, 2, 3 and 5 splits of
    /// K (a share of a step and a half), one row and one past a tile.
    #[test]
    fn split_k_mma_sync_kernels_write_their_shares() {
        let kernels: Vec<GemmKernel> =
            candidates::split_k_family(ElemType::Bf16).into_iter().filter(|k| k.arch == Arch::Sm80).collect();
        assert_eq!(kernels.len(), 6, "three tiles, both B layouts");
        for (x, k) in kernels.iter().enumerate() {
            let n = if k.b == BLayout::NMajor { 72 } else { 67 };
            for (m, splits) in [(1, 1), (1, 3), (k.bm + 1, 2), (7, 5)] {
                host_split_k(k, Problem::nt(1, m, n, 240), splits, x as u64).unwrap();
            }
        }
    }

    /// Folding split-K kernel `k` on `p` (one product) in `splits` shares of
    /// K (a Stream-K kernel: in `splits` blocks), as the runtime launches it: C
    /// with rows `n + 3` apart (f32 or bf16, as the bias and the residual),
    /// canaries in its rows' padding, the workspace of `GemmKernel::fold_space`
    /// (Stream-K: in `stream_slots` shares a tile) and zeroed counters, each
    /// with a canary past it. Against the oracle; every counter zero again after.
    fn host_fold(k: &GemmKernel, p: Problem, splits: usize, seed: u64) -> Result<(), TestCaseError> {
        let p = p.with_b(k.b);
        let name = k.name_split(splits);
        let ctx = Context::create();
        let ee = engine(&ctx, &nvptx::llvm_ir(k).unwrap(), &k.name())?;
        let addr = ee.get_function_address(&k.name()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        // SAFETY: the JIT compiled the folding split-K ABI (`kper`, the
        // workspace and the counters last) plus the four indices (`for_host`),
        // which is `FoldGemm`; `ee` outlives every call below.
        let f: host::FoldGemm = unsafe { std::mem::transmute::<usize, host::FoldGemm>(addr) };
        let (per, grid, shares) = if k.stream_k {
            let slots = k.stream_slots(&p, splits);
            prop_assert!(slots > 0, "{name}: {splits} blocks on {p}");
            (slots, (splits, 1, 1), slots)
        } else {
            let (per, splits) = k.split_plan(p.k, splits);
            (per, (p.n.div_ceil(k.bn), p.m.div_ceil(k.bm), splits), splits)
        };
        let mut rnd = values(seed);
        let a: Vec<u16> = (0..p.m * p.k).map(|_| bf16(rnd())).collect();
        let b: Vec<u16> = (0..p.n * p.k).map(|_| bf16(rnd())).collect();
        let bias: Vec<u16> = (0..p.n).map(|_| bf16(rnd())).collect();
        let ldc = p.n + 3;
        // The residual at C's index; bf16 values, so that the f32 forms hold
        // what the oracle adds.
        let res: Vec<u16> = (0..p.m * ldc).map(|_| bf16(rnd())).collect();
        let dense: Vec<u16> = (0..p.m * p.n).map(|i| res[(i / p.n) * ldc + i % p.n]).collect();
        let size = k.c_type().bytes();
        let widen = |v: &[u16]| -> Vec<u8> {
            if size == 4 {
                v.iter().flat_map(|&h| f32_of(h).to_le_bytes()).collect()
            } else {
                v.iter().flat_map(|&h| h.to_le_bytes()).collect()
            }
        };
        let (bias_c, res_c) = (widen(&bias), widen(&res));
        let canary = [0xa5u8; 4];
        let mut c: Vec<u8> = canary.iter().copied().cycle().take(p.m * ldc * size).collect();
        let (floats, tiles) = k.fold_space(&p, shares);
        let w_canary = f32::from_bits(0x7fc0_0123);
        let mut w = vec![w_canary; floats + 4];
        let mut cnt = vec![0i64; tiles + 1];
        cnt[tiles] = 77;
        let (a16, b16) = (host::aligned(&a), host::aligned(&b));
        let (ldb, zero) = (k.b.extent(&p).1, 0i64);
        let at = [
            a16.as_ptr() as usize,
            b16.as_ptr() as usize,
            c.as_mut_ptr() as usize,
            bias_c.as_ptr() as usize,
            res_c.as_ptr() as usize,
            w.as_mut_ptr() as usize,
            cnt.as_mut_ptr() as usize,
        ];
        host::run_blocks(grid, k.threads(), k.smem_bytes(), |t, x, y, z| {
            // SAFETY: A is `[M, K]`, B `[N, K]` or `[K, N]`, C and the
            // residual `M` rows `ldc` apart of C's type, the bias `N`, the
            // workspace and counters as `fold_space` sizes them; each block
            // reads its share of K, writes its share's slice and its tile's
            // counter, and its tile's last block reads the tile's shares and
            // writes C inside M and N.
            unsafe {
                f(
                    at[0] as *const u16,
                    at[1] as *const u16,
                    at[2] as *mut u8,
                    at[3] as *const u8,
                    at[4] as *const u8,
                    p.m as i32,
                    p.n as i32,
                    p.k as i32,
                    p.k as i32,
                    ldb as i32,
                    ldc as i32,
                    zero,
                    zero,
                    zero,
                    per as i32,
                    at[5] as *mut f32,
                    at[6] as *mut i64,
                    t as i32,
                    x as i32,
                    y as i32,
                    z as i32,
                )
            }
        });
        let o = Operands { elem: k.elem, a: &a, b: &b, bias: &bias, residual: &dense };
        let want = reference::gemm(&p, &k.epilogue, &o);
        let approximate = gpu::epilogue_approximate(&k.epilogue);
        let elem = if size == 4 { ElemType::F32 } else { ElemType::Bf16 };
        for i in 0..p.m {
            for j in 0..p.n {
                let at = (i * ldc + j) * size;
                let got = if size == 4 {
                    f32::from_le_bytes(c[at..at + 4].try_into().unwrap())
                } else {
                    f32_of(u16::from_le_bytes([c[at], c[at + 1]]))
                };
                let want = want[i * p.n + j];
                prop_assert!(
                    reference::close(elem, got, want, 1.0, approximate),
                    "{name} {p}: ({i}, {j}) {got} for {want}"
                );
            }
            let pad = &c[(i * ldc + p.n) * size..(i + 1) * ldc * size];
            prop_assert!(pad.iter().all(|&x| x == 0xa5), "{name}: row {i}'s padding written");
        }
        prop_assert!(cnt[..tiles].iter().all(|&x| x == 0), "{name}: counters {:?}", &cnt[..tiles]);
        prop_assert!(cnt[tiles] == 77 && w[floats..].iter().all(|x| x.to_bits() == w_canary.to_bits()));
        Ok(())
    }

    /// The folding forms of the split-K kernels a model step takes (mma.sync
    /// and cp.async-fed wgmma tiles, both B layouts where built) on the host:
    /// one row, a prime and one past a tile, in 2 to 5 shares of K (a share
    /// of a step and a half) and in 11 (past a chunk of 8, and not a multiple
    /// of it), with a bias, a residual and GELU (tanh form) into f32 and into
    /// bf16 C.
    #[test]
    fn folding_split_k_kernels_sum_their_shares_into_c() {
        let e = Epilogue { bias: true, residual: true, activation: Activation::GeluTanh, ..Epilogue::NONE };
        for (x, k) in fold_family(e, true).into_iter().chain(fold_family(e, false)).enumerate() {
            let n = if k.b == BLayout::NMajor { 72 } else { 67 };
            for (m, depth, splits) in [(1, 240, 3), (k.bm + 1, 240, 2), (7, 240, 5), (3, 640, 11)] {
                host_fold(&k, Problem::nt(1, m, n, depth), splits, x as u64).unwrap();
            }
        }
    }

    /// The Stream-K forms of the folding kernels (mma.sync and cp.async-fed
    /// wgmma tiles, both B layouts where built) on the host, into f32 and bf16
    /// C through a bias, a residual and GELU: one block (every tile whole in
    /// it), a prime number of blocks (tiles split unevenly, a block's share
    /// ending inside a tile and the next starting there), a share of a step
    /// or two (a tile split between many blocks, past a fold chunk), and as
    /// many blocks as steps; one row, a prime and one past a tile.
    #[test]
    fn stream_k_kernels_share_every_tiles_steps_evenly() {
        let e = Epilogue { bias: true, residual: true, activation: Activation::GeluTanh, ..Epilogue::NONE };
        let family = || candidates::stream_k_family(ElemType::Bf16, e).into_iter().filter(|k| !k.tma);
        let kernels: Vec<GemmKernel> =
            family().map(|k| GemmKernel { c_f32: true, ..k }).chain(family().take(2)).collect();
        assert!(
            kernels.iter().any(|k| k.arch == Arch::Sm90a) && kernels.iter().any(|k| k.b == BLayout::NMajor)
        );
        for (x, k) in kernels.iter().enumerate() {
            k.check().unwrap_or_else(|e| panic!("{e}"));
            assert!(k.name().contains("_sks"), "{k}");
            let n = if k.b == BLayout::NMajor { 136 } else { 131 };
            let steps = |p: &Problem| p.k.div_ceil(k.bk()) * k.blocks(p);
            let one = Problem::nt(1, 1, n, 240);
            let tile = Problem::nt(1, k.bm + 1, n, 640);
            let prime = Problem::nt(1, 7, n, 1000);
            let runs =
                [(one, 1), (one, 3), (one, steps(&one)), (tile, 7), (tile, steps(&tile) / 2 + 1), (prime, 5)];
            for (p, blocks) in runs {
                host_fold(k, p, blocks, x as u64 + blocks as u64).unwrap();
            }
        }
    }

    /// The persistent TMA Stream-K kernels on the host (a bias and GELU into
    /// bf16 C through the staging tiles): the producer walking the same units
    /// as the consumers, which fold a shared tile's shares while the producer
    /// fills the next unit's stages. One tile in 1, 3 and as many blocks as
    /// steps; four tiles (one row, and one column, past two) in 1, 3, 7 and
    /// 40 blocks (a block per step); counters zero after, nothing written
    /// past C's rows.
    #[test]
    fn persistent_stream_k_kernels_fold_while_the_producer_runs_on() {
        let e = Epilogue { bias: true, activation: Activation::GeluTanh, ..Epilogue::NONE };
        let kernels: Vec<GemmKernel> =
            candidates::stream_k_family(ElemType::Bf16, e).into_iter().filter(|k| k.tma).collect();
        assert!(kernels.len() >= 3 && kernels.iter().all(|k| k.persistent && !k.pingpong));
        let compiled: Vec<(String, String, host::HostKernelKind)> = kernels
            .iter()
            .map(|k| {
                let ir = nvptx::llvm_ir(k).expect("generates");
                (k.name(), ir, host::HostKernelKind::Args { threads_apart: false })
            })
            .collect();
        let host = host::HostKernels::new(&compiled).expect("compiles for the host");
        for (x, k) in kernels.iter().enumerate() {
            let one = Problem::nt(1, 1, 72, 200);
            let four = Problem::nt(1, k.bm + 1, k.bn + 8, 640);
            let runs: &[(Problem, usize)] = if k.bn == 256 {
                &[(one, 4), (four, 7)]
            } else {
                &[(one, 1), (one, 3), (one, 4), (four, 1), (four, 3), (four, 7), (four, 40)]
            };
            for &(p, blocks) in runs {
                persistent_stream_k(&host, x, k, p, blocks, x as u64 + blocks as u64);
            }
        }
    }

    /// Persistent Stream-K kernel `k` (kernel `index` of `host`) on `p` in
    /// `blocks` blocks, against the oracle.
    fn persistent_stream_k(
        host: &host::HostKernels,
        index: usize,
        k: &GemmKernel,
        p: Problem,
        blocks: usize,
        seed: u64,
    ) {
        let name = format!("{k} on {p} in {blocks} blocks");
        let mut rnd = values(seed);
        let a: Vec<u16> = (0..p.m * p.k).map(|_| bf16(rnd())).collect();
        let b: Vec<u16> = (0..p.n * p.k).map(|_| bf16(rnd())).collect();
        let bias: Vec<u16> = (0..p.n).map(|_| bf16(rnd())).collect();
        let ldc = p.n + 3;
        let mut c = vec![0x7fc1u16; p.m * ldc + 8];
        let slots = k.stream_slots(&p, blocks);
        assert!(slots > 0, "{name}");
        let (floats, tiles) = k.fold_space(&p, slots);
        let mut w = vec![f32::NAN; floats + 4];
        let mut cnt = vec![0i64; tiles + 1];
        cnt[tiles] = 77;
        let (a16, b16) = (host::aligned(&a), host::aligned(&b));
        let map = |base: usize, rows: usize, box_rows: usize| host::HostTensorMap {
            base: base as u64,
            dims: [p.k as u64, rows as u64, 1],
            strides: [2 * p.k as u64, 2 * (rows * p.k) as u64],
            box_rows: box_rows as u64,
            pad: [0; 9],
        };
        let maps = [map(a16.as_ptr() as usize, p.m, k.bm), map(b16.as_ptr() as usize, p.n, k.bn)];
        let mut args: Vec<u64> =
            vec![a16.as_ptr() as u64, b16.as_ptr() as u64, c.as_mut_ptr() as u64, bias.as_ptr() as u64, 0];
        args.extend([p.m, p.n, p.k, p.k, p.k, ldc].map(|x| x as u64));
        args.extend([0, 0, 0, slots as u64, w.as_mut_ptr() as u64, cnt.as_mut_ptr() as u64, 1]);
        args.extend(maps.iter().map(|m| m as *const host::HostTensorMap as u64));
        // SAFETY: the persistent Stream-K ABI (`gpu::kernel::ABI`, the shares a
        // tile, the workspace and counters, the batch, the two maps as pointers
        // on the host): the maps describe A and B inside their buffers, C is
        // `M` rows `ldc` apart of bf16 with the bias `N`, the workspace and
        // counters as `fold_space` sizes them.
        unsafe { host.launch_args(index, (blocks, 1, 1), (k.threads(), k.smem_bytes()), &args) }
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let o = Operands { elem: k.elem, a: &a, b: &b, bias: &bias, residual: &[] };
        let want = reference::gemm(&p, &k.epilogue, &o);
        let approximate = gpu::epilogue_approximate(&k.epilogue);
        for i in 0..p.m {
            for j in 0..ldc {
                let got = c[i * ldc + j];
                if j >= p.n {
                    assert_eq!(got, 0x7fc1, "{name}: ({i}, {j}) written past C's columns");
                    continue;
                }
                let (got, want) = (f32_of(got), want[i * p.n + j]);
                assert!(
                    reference::close(ElemType::Bf16, got, want, 1.0, approximate),
                    "{name}: ({i}, {j}) {got} for {want}"
                );
            }
        }
        assert!(c[p.m * ldc..].iter().all(|&x| x == 0x7fc1), "{name}: written past C");
        assert!(cnt[..tiles].iter().all(|&x| x == 0) && cnt[tiles] == 77, "{name}: counters {cnt:?}");
    }

    /// The first bf16 SIMT, GEMV, mma.sync (K-major B) and TMA kernel built for
    /// epilogue `e`.
    fn one_of_each_family(e: Epilogue) -> [GemmKernel; 4] {
        let first = |fam: Vec<GemmKernel>| fam[0];
        [
            first(candidates::simt_family(ElemType::Bf16, e)),
            first(candidates::gemv_family(ElemType::Bf16, e)),
            first(candidates::family(ElemType::Bf16, BLayout::KMajor, e)),
            first(candidates::tma_family(ElemType::Bf16, e)),
        ]
    }

    /// The GELU epilogues (both forms, with a bias and a residual) on the host: the
    /// mma.sync, GEMV, SIMT and TMA kernels the family builds them for.
    #[test]
    fn gelu_epilogues_on_the_host() {
        for gelu in [Activation::GeluTanh, Activation::Gelu] {
            let e = Epilogue { bias: true, residual: true, activation: gelu, ..Epilogue::NONE };
            let kernels = one_of_each_family(e);
            for (x, k) in kernels.iter().enumerate() {
                let one = Cover::one(Choice { kernel: x, splits: 1 });
                host_cover(&kernels, &one, Problem::nt(1, k.bm + 1, 67, 72), (8, 1), x as u64).unwrap();
            }
        }
    }

    /// Every epilogue program through the split-K reduction with one share
    /// (`C = act(W)`, W in f32), on values that probe each formula's branches
    /// and edges (±0, ±inf, NaN, tanh's and erf's series against their closed
    /// forms at ±½, tanh's clamp at ±9, exp's overflow and underflow), against
    /// `Pointwise::eval` rounded to the output type: the GPU computes the
    /// CPU's formulas, NaNs and signed zeros included.
    #[test]
    fn pointwise_programs_compute_the_cpus_formulas() {
        let mut xs: Vec<f32> = vec![
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            0.5,
            -0.5,
            0.499_9,
            -0.500_1,
            9.0,
            -9.5,
            88.0,
            89.5,
            -104.0,
            -110.0,
            1e-20,
            -1e-20,
            1e-3,
            -3.0,
            6.0,
        ];
        xs.extend((-400..=400).map(|i| i as f32 / 37.0));
        let n = xs.len();
        let f16c = std::arch::is_x86_feature_detected!("f16c");
        let elems: &[ElemType] = if f16c { &[ElemType::Bf16, ElemType::F16] } else { &[ElemType::Bf16] };
        // Max and min at zeros of both signs (`-x` of the +0 the sum gives) and NaN.
        let signed_zeros = [PwBinary::Max, PwBinary::Min].map(|b| {
            let mut p = Pointwise::empty();
            let x = p.push(PwOp::Input).unwrap();
            let z = p.push(PwOp::Const(0f32.to_bits())).unwrap();
            let n = p.push(PwOp::Unary(PwUnary::Neg, x)).unwrap();
            let a = p.push(PwOp::Binary(b, n, z)).unwrap();
            let c = p.push(PwOp::Binary(b, z, n)).unwrap();
            p.push(PwOp::Binary(PwBinary::Add, a, c)).unwrap();
            p
        });
        for elem in elems.iter().copied() {
            for p in pointwise_programs().into_iter().chain(signed_zeros) {
                let r = ReduceKernel {
                    elem,
                    epilogue: Epilogue { activation: Activation::Pointwise(p), ..Epilogue::NONE },
                    c_f32: false,
                };
                let name = r.name();
                let ctx = Context::create();
                let ee = engine(&ctx, &nvptx::reduce_ir(&r).unwrap(), &name).unwrap();
                // SAFETY: the signature is the kernel's parameter list (`reduce_ir`) plus
                // the four indices `for_host` appended.
                let f = unsafe { ee.get_function::<host::Reduce>(&name) }.unwrap();
                let mut c = vec![CANARY; n + 1];
                let none: [u16; 1] = [0];
                for block in 0..n.div_ceil(ReduceKernel::THREADS) {
                    for t in 0..ReduceKernel::THREADS {
                        // SAFETY: one share of `n` values in W, one row of `n` in C (one
                        // more as a canary); the epilogue reads no bias or residual.
                        unsafe {
                            f.call(
                                xs.as_ptr(),
                                c.as_mut_ptr().cast::<u8>(),
                                none.as_ptr().cast::<u8>(),
                                none.as_ptr().cast::<u8>(),
                                1,
                                n as i32,
                                n as i32,
                                1,
                                n as i64,
                                t as i32,
                                block as i32,
                                0,
                                0,
                            )
                        };
                    }
                }
                assert_eq!(c[n], CANARY, "{name}: past the row");
                let ulp = if elem == ElemType::Bf16 { 2f32.powi(-8) } else { 2f32.powi(-11) };
                for (x, &bits) in xs.iter().zip(&c) {
                    // The reduction's sum starts at +0, so a -0 share sums to +0.
                    let want = p.eval(0.0 + *x);
                    let got = reference::from_bits(elem, bits);
                    let at = format!("{name} ({p}) at {x:e}: {got:e}, want {want:e}");
                    if want.is_nan() || got.is_nan() {
                        assert!(want.is_nan() && got.is_nan(), "{at}");
                    } else if want == 0.0 || want.is_infinite() {
                        assert_eq!(bits, reference::to_bits(elem, want), "{at}");
                    } else {
                        assert!((got - want).abs() <= 2.0 * ulp * want.abs() + 1e-5, "{at}");
                    }
                }
            }
        }
    }

    /// Epilogue programs in the store of each family's kernels (SIMT, GEMV,
    /// mma.sync, TMA) after a scale, the bias and a residual, one past a tile.
    #[test]
    fn pointwise_epilogues_on_the_host() {
        for (x, p) in pointwise_programs().into_iter().enumerate() {
            let e = Epilogue {
                scale: Some(0.75),
                bias: true,
                residual: x % 2 == 0,
                activation: Activation::Pointwise(p),
                ..Epilogue::NONE
            };
            if rounds(&e) {
                // Discontinuous: `pointwise_programs_compute_the_cpus_formulas` checks it on
                // exact values.
                continue;
            }
            let kernels = one_of_each_family(e);
            for (i, k) in kernels.iter().enumerate() {
                let one = Cover::one(Choice { kernel: i, splits: 1 });
                host_cover(&kernels, &one, Problem::nt(1, k.bm + 1, 67, 72), (8, 1), (x * 4 + i) as u64)
                    .unwrap();
            }
        }
    }

    /// Kernels storing an f32 C (`c_f32`: a model's activations), reading an f32
    /// bias and residual, in each family that a model's plan launches: SIMT, GEMV,
    /// mma.sync (both B layouts), element-by-element, wgmma and TMA (which then
    /// store from the fragments); one past a tile, a batch, odd row strides of C.
    #[test]
    fn f32_outputs_on_the_host() {
        let e = EPILOGUES[2];
        let first = |fam: Vec<GemmKernel>| GemmKernel { c_f32: true, ..fam[0] };
        let kernels = [
            first(candidates::simt_family(ElemType::Bf16, e)),
            first(candidates::gemv_family(ElemType::Bf16, e)),
            first(candidates::family(ElemType::Bf16, BLayout::KMajor, e)),
            first(candidates::family(ElemType::Bf16, BLayout::NMajor, e)),
            first(candidates::unaligned_family(ElemType::Bf16, e)),
            first(candidates::wgmma_family(ElemType::Bf16, e)),
            first(candidates::tma_family(ElemType::Bf16, Epilogue { residual: false, ..e })),
            first(candidates::family(ElemType::Bf16, BLayout::KMajor, Epilogue::NONE)),
        ];
        for (x, k) in kernels.iter().enumerate() {
            assert!(k.check().is_ok() && k.name().contains("_c32"), "{k}");
            let n = if k.b == BLayout::NMajor { 72 } else { 67 };
            let one = Cover::one(Choice { kernel: x, splits: 1 });
            host_cover(&kernels, &one, Problem::nt(2, k.bm + 1, n, 72), (8, 1), x as u64).unwrap();
        }
        let persistent = candidates::persistent_family(ElemType::Bf16, Epilogue::NONE)[0];
        assert!(
            GemmKernel { c_f32: true, ..persistent }.check().is_err(),
            "persistent kernels stage 16-bit C"
        );
    }

    /// Kernels reading an f32 A in place (`a_f32`: a model's activation, no copy
    /// launch), storing an f32 C, in each family a model's plan launches: SIMT,
    /// GEMV, mma.sync (both B layouts), element-by-element and wgmma; A's values
    /// carry low bits that rounding to bf16 drops; one past a tile, a batch, A's
    /// rows at a stride past K (odd for the covers), one row, K of one step.
    #[test]
    fn f32_a_on_the_host() {
        let e = EPILOGUES[2];
        let first = |fam: Vec<GemmKernel>| GemmKernel { c_f32: true, a_f32: true, ..fam[0] };
        let kernels = f32_a_kernels(e);
        for (x, k) in kernels.iter().enumerate() {
            assert!(k.check().is_ok() && k.name().contains("_a32_c32"), "{k}");
            let n = if k.b == BLayout::NMajor { 72 } else { 67 };
            let one = Cover::one(Choice { kernel: x, splits: 1 });
            host_cover(&kernels, &one, Problem::nt(2, k.bm + 1, n, 72), (8, 1), x as u64).unwrap();
            host_cover(&kernels, &one, Problem::nt(1, 1, n, 8), (4, 0), x as u64).unwrap();
            if k.is_cover() {
                host_cover(&kernels, &one, Problem::nt(2, 13, 19, 37), (3, 1), x as u64).unwrap();
            }
        }
        let tma = first(candidates::tma_family(ElemType::Bf16, Epilogue::NONE));
        assert!(tma.check().is_err(), "TMA copies 16-bit tiles");
    }

    /// Kernels reading an f32 B in place (`b_f32`: a model's activation, such
    /// as attention's keys or values at a decode step): GEMV (K-major) and
    /// SIMT (either layout), with an f32 A or a 16-bit one; one past a tile, a
    /// batch, one row, K of one step, and for SIMT odd extents. Other families
    /// (and an N-major GEMV) refuse an f32 B.
    #[test]
    fn f32_b_on_the_host() {
        let e = EPILOGUES[2];
        let with =
            |fam: Vec<GemmKernel>, a_f32: bool| GemmKernel { c_f32: true, a_f32, b_f32: true, ..fam[0] };
        let mut kernels = Vec::new();
        let simt_n = |a_f32| {
            let fam = candidates::simt_family(ElemType::Bf16, e);
            let k = fam.into_iter().find(|k| k.b == BLayout::NMajor).expect("an N-major SIMT kernel");
            GemmKernel { c_f32: true, a_f32, b_f32: true, ..k }
        };
        for a_f32 in [false, true] {
            kernels.push(with(candidates::gemv_family(ElemType::Bf16, e), a_f32));
            kernels.push(with(candidates::simt_family(ElemType::Bf16, e), a_f32));
            kernels.push(simt_n(a_f32));
        }
        for (x, k) in kernels.iter().enumerate() {
            assert!(k.check().is_ok() && k.name().contains("_b32_c32"), "{k}");
            let one = Cover::one(Choice { kernel: x, splits: 1 });
            host_cover(&kernels, &one, Problem::nt(2, k.bm + 1, 67, 72), (8, 1), x as u64).unwrap();
            host_cover(&kernels, &one, Problem::nt(1, 1, 67, 8), (4, 0), x as u64).unwrap();
            if k.is_cover() {
                host_cover(&kernels, &one, Problem::nt(2, 13, 19, 37), (3, 1), x as u64).unwrap();
            }
        }
        for fam in [
            candidates::family(ElemType::Bf16, BLayout::KMajor, e),
            candidates::unaligned_family(ElemType::Bf16, e),
            candidates::wgmma_family(ElemType::Bf16, e),
        ] {
            assert!(with(fam, true).check().is_err(), "only GEMV and SIMT kernels read an f32 B");
        }
        let n_gemv = candidates::gemv_family(ElemType::Bf16, e).into_iter().next().expect("a GEMV kernel");
        let n_gemv = GemmKernel { b: BLayout::NMajor, b_f32: true, ..n_gemv };
        assert!(n_gemv.check().is_err(), "a GEMV kernel's f32 B is K-major");
    }

    /// One kernel an f32 A of each family a model's plan launches.
    fn f32_a_kernels(e: Epilogue) -> Vec<GemmKernel> {
        let first = |fam: Vec<GemmKernel>| GemmKernel { c_f32: true, a_f32: true, ..fam[0] };
        vec![
            first(candidates::simt_family(ElemType::Bf16, e)),
            first(candidates::gemv_family(ElemType::Bf16, e)),
            first(candidates::family(ElemType::Bf16, BLayout::KMajor, e)),
            first(candidates::family(ElemType::Bf16, BLayout::NMajor, e)),
            first(candidates::unaligned_family(ElemType::Bf16, e)),
            first(candidates::wgmma_family(ElemType::Bf16, e)),
        ]
    }

    /// f16 kernels of each family on the host (where the CPU converts f16 with F16C):
    /// the SIMT, GEMV, mma.sync (both B layouts), element-by-element, wgmma and TMA
    /// kernels, one past a tile with a batch.
    #[test]
    fn f16_kernels_on_the_host() {
        if !kernels::testing::require(
            "ANYSHAPE_REQUIRE_F16C",
            std::arch::is_x86_feature_detected!("f16c"),
            "F16C",
        ) {
            return;
        }
        let first = |fam: Vec<GemmKernel>| fam[0];
        let kernels = [
            first(candidates::simt_family(ElemType::F16, Epilogue::NONE)),
            first(candidates::gemv_family(ElemType::F16, Epilogue::NONE)),
            first(candidates::family(ElemType::F16, BLayout::KMajor, Epilogue::NONE)),
            first(candidates::family(ElemType::F16, BLayout::NMajor, Epilogue::NONE)),
            first(candidates::unaligned_family(ElemType::F16, Epilogue::NONE)),
            first(candidates::wgmma_family(ElemType::F16, Epilogue::NONE)),
            first(candidates::tma_family(ElemType::F16, Epilogue::NONE)),
        ];
        for (x, k) in kernels.iter().enumerate() {
            let n = if k.b == BLayout::NMajor { 72 } else { 67 };
            let one = Cover::one(Choice { kernel: x, splits: 1 });
            host_cover(&kernels, &one, Problem::nt(2, k.bm + 1, n, 72), (8, 1), x as u64).unwrap();
        }
    }

    /// The wgmma kernels fed by `cp.async` (`Arch::Sm90a`, not TMA) on the host,
    /// `wgmma.mma_async` emulated through its descriptors and 128-byte swizzle: both
    /// pipelines (a group in flight or not), every tile, and the built epilogues on
    /// 128×128; one past a tile in M and N with K a step and a half, a batch, row
    /// strides past K and N.
    #[test]
    fn wgmma_kernels_at_the_edges() {
        let mut kernels = candidates::wgmma_family(ElemType::Bf16, Epilogue::NONE);
        for e in &EPILOGUES[1..] {
            kernels.extend(
                candidates::wgmma_family(ElemType::Bf16, *e)
                    .into_iter()
                    .filter(|k| (k.bm, k.bn) == (128, 128)),
            );
        }
        assert_eq!(kernels.len(), 12);
        for (x, k) in kernels.iter().enumerate() {
            let one = Cover::one(Choice { kernel: x, splits: 1 });
            host_cover(&kernels, &one, Problem::nt(1, k.bm + 1, k.bn + 3, 96), (0, 0), 1).unwrap();
            host_cover(&kernels, &one, Problem::nt(2, 13, 19, 64), (8, 1), 2).unwrap();
        }
    }

    /// The cp.async-fed wgmma kernels for an N-major B on the host (`wgmma`
    /// with `imm-trans-b`, B's 64-column blocks of K rows through the 128-byte
    /// swizzle): every tile, a group in flight on the 64-row ones, and a bias
    /// on 128×128 in both pipelines; one past
    /// a tile in M, N one 8-column chunk past a tile, K a step and a half, a
    /// batch, row strides past K and N.
    #[test]
    fn wgmma_kernels_read_an_n_major_b() {
        let mut kernels = candidates::wgmma_nn_family(ElemType::Bf16, Epilogue::NONE);
        kernels.extend(
            candidates::wgmma_nn_family(ElemType::Bf16, EPILOGUES[1])
                .into_iter()
                .filter(|k| (k.bm, k.bn) == (128, 128)),
        );
        assert_eq!(kernels.len(), 10);
        // Each tile once (the pipelines' difference is the K-major tests').
        kernels.retain(|k| k.overlap == (k.bm == 64) || k.epilogue != Epilogue::NONE);
        for (x, k) in kernels.iter().enumerate() {
            assert!(k.check().is_ok() && k.b == BLayout::NMajor && k.name().contains("_nn_"), "{k}");
            let ir = nvptx::llvm_ir(k).unwrap();
            assert!(ir.contains("p, 1, 1, 0, 1;"), "{k}: wgmma reads B transposed");
            let one = Cover::one(Choice { kernel: x, splits: 1 });
            host_cover(&kernels, &one, Problem::nt(1, k.bm + 1, k.bn + 8, 96), (0, 0), 1).unwrap();
            host_cover(&kernels, &one, Problem::nt(2, 13, 24, 64), (8, 1), 2).unwrap();
        }
    }

    /// The TMA and persistent kernels for an N-major B on the host: the
    /// producer's boxes of 64 columns by a step's K rows, one for each
    /// 64-column block of the tile, read by `wgmma` with `imm-trans-b`; one
    /// past a tile in M, N a chunk past a tile, K a step and a half, a batch,
    /// and (persistent: three blocks) several tiles a block.
    #[test]
    fn tma_kernels_read_an_n_major_b() {
        let nn = |k: GemmKernel| GemmKernel { b: BLayout::NMajor, ..k };
        let mut kernels = candidates::tma_nn_family(ElemType::Bf16, Epilogue::NONE);
        kernels.extend(
            candidates::tma_family(ElemType::Bf16, EPILOGUES[1])
                .into_iter()
                .filter(|k| (k.bm, k.bn) == (128, 128))
                .map(nn),
        );
        assert_eq!(kernels.len(), 9);
        for (x, k) in kernels.iter().enumerate() {
            assert!(k.check().is_ok(), "{k}: {:?}", k.check());
            let one = Cover::one(Choice { kernel: x, splits: 1 });
            host_cover(&kernels, &one, Problem::nt(1, k.bm + 1, k.bn + 8, 96), (0, 0), 1).unwrap();
            host_cover(&kernels, &one, Problem::nt(2, 2 * k.bm + 5, 24, 64), (8, 1), 2).unwrap();
        }
        let pp = candidates::pingpong_family(ElemType::Bf16, Epilogue::NONE)[0];
        assert!(nn(pp).check().is_err(), "ping-pong kernels read B K-major");
    }

    /// The warp-specialized TMA kernels and the persistent ones on the host: the
    /// producer's tensor copies (swizzled, zero-filled past the operand), the
    /// mbarriers' phases and byte counts, named barriers and wgmma emulated, the
    /// maps built as the runner builds them; one past a tile with K a step and a
    /// half, a batch, and (persistent: three blocks) several tiles a block.
    #[test]
    fn tma_kernels_at_the_edges() {
        let mut kernels = candidates::tma_family(ElemType::Bf16, Epilogue::NONE);
        kernels.extend(candidates::persistent_family(ElemType::Bf16, Epilogue::NONE));
        for e in &EPILOGUES[1..] {
            kernels.extend(
                candidates::tma_family(ElemType::Bf16, *e).into_iter().filter(|k| (k.bm, k.bn) == (128, 128)),
            );
        }
        assert_eq!(kernels.len(), 10);
        for (x, k) in kernels.iter().enumerate() {
            let one = Cover::one(Choice { kernel: x, splits: 1 });
            host_cover(&kernels, &one, Problem::nt(1, k.bm + 1, k.bn + 3, 96), (0, 0), 1).unwrap();
            host_cover(&kernels, &one, Problem::nt(2, 2 * k.bm + 5, 19, 64), (8, 1), 2).unwrap();
        }
    }

    /// The ping-pong kernels on the host, and the persistent 64-row ones beside
    /// them, three blocks: a block whose second consumer has no tile, two tiles
    /// a block (one each), and six a block (three each, K over four steps, so
    /// the stages' rounds run across tiles and consumers and every turn is
    /// waited for); one past a tile, a batch, a bias and GELU.
    #[test]
    fn pingpong_kernels_at_the_edges() {
        let mut kernels = candidates::pingpong_family(ElemType::Bf16, Epilogue::NONE);
        let gelu = Epilogue { bias: true, activation: Activation::GeluTanh, ..Epilogue::NONE };
        kernels.extend(candidates::pingpong_family(ElemType::Bf16, gelu).into_iter().take(1));
        let persistent = candidates::persistent_family(ElemType::Bf16, Epilogue::NONE);
        kernels.extend(persistent.into_iter().filter(|k| k.bm == 64));
        assert_eq!(kernels.len(), 5);
        for (x, k) in kernels.iter().enumerate() {
            let one = Cover::one(Choice { kernel: x, splits: 1 });
            host_cover(&kernels, &one, Problem::nt(1, k.bm + 1, k.bn + 3, 96), (0, 0), 1).unwrap();
            host_cover(&kernels, &one, Problem::nt(2, 2 * k.bm + 5, 19, 64), (8, 1), 2).unwrap();
            host_cover(&kernels, &one, Problem::nt(1, 5 * k.bm + 1, 2 * k.bn + 1, 200), (0, 8), 3).unwrap();
        }
    }

    /// Two-size covers of tensor-core kernels on the host: a TMA main over whole
    /// tiles and a GEMV below; a persistent main's first tile row in each of two
    /// batch entries and an mma.sync kernel below; an mma.sync main and a TMA kernel
    /// below (its tensor map starting at the rest's first row).
    #[test]
    fn two_size_covers_of_tensor_core_kernels() {
        let find = |fam: Vec<GemmKernel>, bm: usize, bn: usize| {
            fam.into_iter().find(|k| (k.bm, k.bn) == (bm, bn)).unwrap()
        };
        let kernels = [
            find(candidates::tma_family(ElemType::Bf16, Epilogue::NONE), 128, 128),
            find(candidates::persistent_family(ElemType::Bf16, Epilogue::NONE), 64, 128),
            find(candidates::family(ElemType::Bf16, BLayout::KMajor, Epilogue::NONE), 16, 64),
            candidates::gemv_family(ElemType::Bf16, Epilogue::NONE)[2],
        ];
        let cover = |main: usize, max_tiles: usize, rest: usize| Cover {
            main: Choice { kernel: main, splits: 1 },
            split: Some(Split { max_tiles, rest: Choice { kernel: rest, splits: 1 } }),
        };
        host_cover(&kernels, &cover(0, usize::MAX, 3), Problem::nt(1, 2 * 128 + 5, 70, 96), (8, 1), 1)
            .unwrap();
        host_cover(&kernels, &cover(1, 1, 2), Problem::nt(2, 3 * 64 + 7, 150, 64), (0, 3), 2).unwrap();
        host_cover(&kernels, &cover(2, 2, 0), Problem::nt(1, 2 * 16 + 130, 131, 72), (8, 0), 3).unwrap();
    }

    /// The tensor-core cover (mma.sync loading element by element) on the host at
    /// what the aligned kernels refuse: odd K, odd row strides of A and C, an N-major
    /// B with odd N; one element, one past a tile, a batch; with and without a bias
    /// and residual.
    #[test]
    fn unaligned_mma_sync_kernels_at_odd_shapes() {
        let mut kernels = candidates::unaligned_family(ElemType::Bf16, Epilogue::NONE);
        kernels.extend(candidates::unaligned_family(ElemType::Bf16, EPILOGUES[2]));
        assert_eq!(kernels.len(), 8);
        for (x, k) in kernels.iter().enumerate() {
            assert!(k.accepts(&Problem::nt(2, 5, 7, 13).with_b(k.b)).is_ok());
            let one = Cover::one(Choice { kernel: x, splits: 1 });
            host_cover(&kernels, &one, Problem::nt(1, 1, 1, 1), (0, 0), 1).unwrap();
            host_cover(&kernels, &one, Problem::nt(1, k.bm + 1, k.bn + 3, 37), (1, 2), 2).unwrap();
            host_cover(&kernels, &one, Problem::nt(2, 13, 19, 100), (3, 1), 3).unwrap();
            host_cover(&kernels, &one, Problem::nt(1, 2 * k.bm - 1, k.bn + 9, 75), (0, 0), 4).unwrap();
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(8))]
        #[test]
        fn unaligned_mma_sync_kernels_at_random_shapes(
            which in 0usize..4,
            batch in 1usize..3,
            m in 1usize..80,
            n in 1usize..140,
            k in 1usize..120,
            lda_pad in 0usize..3,
            ldc_pad in 0usize..3,
            seed: u64,
        ) {
            let kernels = candidates::unaligned_family(ElemType::Bf16, EPILOGUES[2]);
            let one = Cover::one(Choice { kernel: which, splits: 1 });
            host_cover(&kernels, &one, Problem::nt(batch, m, n, k), (lda_pad, ldc_pad), seed)?;
        }

        #[test]
        fn f32_a_kernels_at_random_shapes(
            which in 0usize..6,
            batch in 1usize..3,
            m in prop_oneof![1usize..20, 60usize..70, Just(129)],
            n in 1usize..140,
            k8 in 1usize..13,
            odd_k in 0usize..8,
            lda_pad4 in 0usize..3,
            ldc_pad in 0usize..3,
            seed: u64,
        ) {
            let kernels = f32_a_kernels(EPILOGUES[2]);
            let kk = &kernels[which];
            // The covers take any K and stride; the others K and lda in 8s and 4s.
            let (k, lda_pad) = if kk.is_cover() { (8 * k8 - odd_k, lda_pad4 + odd_k) } else { (8 * k8, 4 * lda_pad4) };
            let n = if kk.b == BLayout::NMajor { 8 * n.div_ceil(8) } else { n };
            let one = Cover::one(Choice { kernel: which, splits: 1 });
            host_cover(&kernels, &one, Problem::nt(batch, m, n, k.max(1)), (lda_pad, ldc_pad), seed)?;
        }

        #[test]
        fn mma_sync_kernels_at_random_shapes(
            which in 0usize..24,
            batch in 1usize..3,
            m in prop_oneof![1usize..20, 60usize..70, Just(127)],
            n in 1usize..150,
            k8 in 1usize..13,
            lda_pad8 in 0usize..2,
            ldc_pad in 0usize..3,
            seed: u64,
        ) {
            let kernels = mma_kernels();
            prop_assert_eq!(kernels.len(), 24);
            let k = kernels[which];
            let n = if k.b == BLayout::NMajor { n.div_ceil(8) * 8 } else { n };
            let one = Cover::one(Choice { kernel: which, splits: 1 });
            host_cover(&kernels, &one, Problem::nt(batch, m, n, 8 * k8), (8 * lda_pad8, ldc_pad), seed)?;
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn gemv_kernels_at_random_shapes(
            which in 0usize..3,
            batch in 1usize..3,
            m in 1usize..20,
            n in 1usize..9,
            k8 in 1usize..100,
            lda_pad8 in 0usize..2,
            ldc_pad in 0usize..3,
            seed: u64,
        ) {
            let kernels = candidates::gemv_family(ElemType::Bf16, Epilogue { bias: true, residual: true, ..Epilogue::NONE });
            let one = Cover::one(Choice { kernel: which, splits: 1 });
            host_cover(&kernels, &one, Problem::nt(batch, m, n, 8 * k8), (8 * lda_pad8, ldc_pad), seed)?;
        }

        /// Every epilogue form the GPU family generates, in the CPU's order
        /// (`act(scale·acc + bias + residual)`, `plan::Epilogue`), against the
        /// oracle at random shapes.
        #[test]
        fn every_epilogue_form_at_random_shapes(
            activation in prop::sample::select(
                [Activation::None, Activation::Relu, Activation::Tanh, Activation::Gelu, Activation::GeluTanh]
                    .into_iter()
                    .chain(pointwise_programs().map(Activation::Pointwise))
                    .filter(|&a| !rounds(&Epilogue { activation: a, ..Epilogue::NONE }))
                    .collect::<Vec<_>>(),
            ),
            scale in any::<bool>(),
            bias in any::<bool>(),
            residual in any::<bool>(),
            m in 1usize..12,
            n in 1usize..9,
            k8 in 1usize..40,
            seed: u64,
        ) {
            let e = Epilogue { scale: scale.then_some(-0.375), bias, residual, activation, ..Epilogue::NONE };
            let kernels = candidates::gemv_family(ElemType::Bf16, e);
            let one = Cover::one(Choice { kernel: 0, splits: 1 });
            host_cover(&kernels, &one, Problem::nt(1, m, n, 8 * k8), (0, 1), seed)?;
        }

        #[test]
        fn two_size_covers_at_random_shapes(
            main in 0usize..2,
            max_tiles in prop_oneof![1usize..4, Just(usize::MAX)],
            batch in 1usize..3,
            m in 1usize..200,
            n in 1usize..70,
            k in 1usize..40,
            seed: u64,
        ) {
            let kernels = candidates::simt_family(ElemType::Bf16, Epilogue { residual: true, ..Epilogue::NONE });
            let kernels: Vec<GemmKernel> = kernels.into_iter().filter(|k| k.b == BLayout::KMajor).collect();
            let cover = Cover {
                main: Choice { kernel: main, splits: 1 },
                split: Some(Split { max_tiles, rest: Choice { kernel: 1 - main, splits: 1 } }),
            };
            host_cover(&kernels, &cover, Problem::nt(batch, m, n, k), (seed as usize % 3, 1), seed)?;
        }

        #[test]
        fn the_reduction_at_random_shapes_and_splits(m in 1usize..20, n in 1usize..300, splits in 1usize..40, e in 0usize..3, seed: u64) {
            reduce(ReduceKernel { elem: ElemType::Bf16, epilogue: EPILOGUES[e], c_f32: false }, m, n, splits, seed)?;
        }

        #[test]
        fn simt_kernels_at_random_shapes(
            which in 0usize..12,
            batch in 1usize..3,
            m in prop_oneof![1usize..8, 60usize..70, Just(127)],
            n in prop_oneof![1usize..8, 30usize..70, Just(131)],
            k in 1usize..90,
            lda_pad in 0usize..3,
            ldc_pad in 0usize..3,
            seed: u64,
        ) {
            let kernel = simt_kernels()[which];
            simt(&kernel, Problem::nt(batch, m, n, k), lda_pad, ldc_pad, seed)?;
        }
    }
}
