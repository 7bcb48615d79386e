//! The kernels a model's contraction steps are given, and which of them runs
//! each shape. A step multiplies bf16 operands (its weight packed K-major
//! once, an activation B copied so, or at few rows read in place as f32
//! where its K is adjacent: [`reading_f32_b`]) into an f32 C with its epilogue
//! (`GemmKernel::c_f32`); an A whose view has adjacent columns is read in
//! place as f32 and rounded as it is staged ([`reading_f32_a`]), others (a
//! convolution's taps, a transposed view) are copied too. Its choices are a
//! list tried in order, each kernel with the most rows (M) it is taken for:
//! the runtime takes the first that accepts the product, so the list is a
//! decision tree over M that costs a few comparisons a call (BladeDISC
//! §5.2.2).
//!
//! For a weight (N and K fixed by the model) the list is TSCompiler's wave
//! model distilled over M (§6): the model, built from a device profile (the
//! lowest level measured on the device: each kernel's block costs, `wave`),
//! picks the fastest kernel at every M up to [`M_DISTILLED`], and the runs of
//! equal picks become the list's intervals. For a product of two activations
//! (attention's scores without fusion), whose N and K vary, the list is fixed
//! bounds. Both end with the covers: the element-by-element mma.sync kernel
//! (any K) and the SIMT kernel (any start of C, whose stores are single).
//! For any GPU the kernels are sm_80 code (mma.sync, GEMV); for a Hopper
//! ([`StepTarget::Sm90a`]) the weights' lists also take the wgmma kernels.

use crate::candidates::{family, gemv_family, plain_family, simt_family, unaligned_family};
use crate::kernel::{Arch, BLayout, ElemType, Epilogue, GemmKernel, Problem, RowNorm};
use crate::replay::{Record, ReplayError};
use crate::wave::WaveModel;

/// The rows up to which a weight's list is the wave model's pick at every M;
/// larger M take the last pick (a large M fills every SM with any tile).
pub const M_DISTILLED: usize = 4096;

/// The device profile the kernels are chosen by: an H200's calibration
/// (`anyshape-gpu bench --json` on 2026-11-27, the device, the reduction and
/// each kernel's measured block costs; its products dropped).
pub const H200_PROFILE: &str = include_str!("../profiles/h200.jsonl");

/// The GPUs a model's kernels are built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum StepTarget {
    /// Every supported GPU (sm_80 and later): mma.sync and GEMV kernels.
    #[default]
    Sm80,
    /// Hopper (sm_90a) only: the wgmma kernels too (cp.async-fed; TMA ones
    /// need tensor maps the runtime does not make yet).
    Sm90a,
}

/// A device profile: the wave model's measured lowest level.
pub fn profile(text: &str) -> Result<Record, ReplayError> {
    Record::parse(text)
}

/// An entry of a step's list: a kernel, the shares of K it runs in (1: the
/// whole product; more: a split-K kernel whose last block of each tile sums
/// the tile's f32 shares into C through the step's epilogue,
/// `GemmKernel::fold`), and the most rows (M) it is taken for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepKernel {
    pub kernel: GemmKernel,
    pub splits: usize,
    pub most: usize,
}

impl StepKernel {
    /// A whole-product kernel's entry.
    pub fn whole(kernel: GemmKernel, most: usize) -> StepKernel {
        StepKernel { kernel, splits: 1, most }
    }
}

/// A kernel of the family, made a model step's: its epilogue, f32 C.
fn for_step(k: GemmKernel, epilogue: Epilogue) -> GemmKernel {
    GemmKernel { epilogue, c_f32: true, ..k }
}

/// A step's list made to read an f32 A in place (`GemmKernel::a_f32`)
/// where that pays: the GEMV and SIMT kernels (which multiply its f32
/// values as they load them) and the covers. The tensor-core tiles keep a
/// bf16 A, copied first: in place, each stage's A goes through registers
/// (no `cp.async` converts), and waiting for those loads made them several
/// times slower than over a copy (BENCHMARKS.md, GPU profile).
pub fn reading_f32_a(list: Vec<StepKernel>) -> Vec<StepKernel> {
    list.into_iter()
        .map(|e| {
            let in_place = matches!(e.kernel.arch, Arch::Gemv | Arch::Simt) || e.kernel.is_cover();
            StepKernel { kernel: GemmKernel { a_f32: in_place, ..e.kernel }, ..e }
        })
        .collect()
}

/// A step's list made to read a convolution's taps in place (implicit
/// GEMM, `GemmKernel::a_taps`) from a bf16 image (one that its producer
/// stores in bf16, or beside its f32 copy): each tensor-core tile of the
/// list preceded by its taps twin (the same rows), which the runtime takes
/// where the image's geometry allows (else the tile after it, over the
/// column matrix that the operand copy writes). The twins read each tap
/// with `cp.async` as the tiles read a copied A, so the column matrix (nine
/// times a 3×3 convolution's image, in bf16) is never written.
pub fn reading_taps(list: Vec<StepKernel>) -> Vec<StepKernel> {
    let mut out = Vec::with_capacity(2 * list.len());
    for e in list {
        let k = e.kernel;
        let tile = matches!(k.arch, Arch::Sm80 | Arch::Sm90a) && !k.is_cover() && !k.tma && !k.a_f32;
        if tile {
            out.push(StepKernel { kernel: GemmKernel { a_taps: true, ..k }, ..e });
        }
        out.push(e);
    }
    out
}

/// A step's list made to store a 16-bit copy of its f32 C beside it
/// (`GemmKernel::c16_copy`: a product whose output other products read as
/// their A while the rest of the model reads it in f32): every kernel of
/// the list, so that whichever runs writes the copy its readers take.
pub fn storing_c16_copy(list: Vec<StepKernel>) -> Vec<StepKernel> {
    list.into_iter().map(|e| StepKernel { kernel: GemmKernel { c16_copy: true, ..e.kernel }, ..e }).collect()
}

/// A row norm's product's list (`plan::MatMulStep::a_norm`): its GEMVs of
/// at most 4 rows over an f32 A normalize the norm's input as they multiply
/// it (`GemmKernel::norm`), so the runtime skips the norm's launch at the
/// rows they take; the other kernels read the norm's output.
pub fn normalizing(list: Vec<StepKernel>, norm: RowNorm) -> Vec<StepKernel> {
    list.into_iter()
        .map(|e| {
            let k = e.kernel;
            let takes = k.arch == Arch::Gemv && k.a_f32 && k.bm <= 4;
            if takes {
                StepKernel { kernel: GemmKernel { norm: Some(norm), ..k }, ..e }
            } else {
                e
            }
        })
        .collect()
}

/// A step's list made to store its C in bf16 (a product whose output only
/// other products read, as their bf16 A): each kernel's C, bias and
/// residual of the operands' type.
pub fn storing_bf16_c(list: Vec<StepKernel>) -> Vec<StepKernel> {
    list.into_iter().map(|e| StepKernel { kernel: GemmKernel { c_f32: false, ..e.kernel }, ..e }).collect()
}

/// A step's list made to read an f32 B in place where it can (a product
/// of activations whose B has its K adjacent: attention's keys): each GEMV
/// kernel of the list preceded by its f32-B twin (the same rows), which the
/// runtime takes where B's view allows (else the twin after it, over a
/// bf16 copy). The few rows GEMV takes are where the copy costs most
/// against the product (a decode step: the whole cache rewritten a token).
/// An N-major B (attention's values) is still copied: the SIMT kernel that
/// could read it in place walks K in one thread, which a long cache makes
/// slower than the copy and a GEMV, and no measurement says where it pays.
pub fn reading_f32_b(list: Vec<StepKernel>) -> Vec<StepKernel> {
    let mut out = Vec::with_capacity(list.len() + 2);
    for e in list {
        if e.kernel.arch == Arch::Gemv && e.kernel.b == BLayout::KMajor {
            out.push(StepKernel { kernel: GemmKernel { b_f32: true, ..e.kernel }, ..e });
        }
        out.push(e);
    }
    out
}

/// The covers every list ends with: any K, then any start of C.
fn covers(epilogue: Epilogue) -> Vec<StepKernel> {
    let tile = |fam: Vec<GemmKernel>, bm, bn| {
        fam.into_iter().find(|k| (k.bm, k.bn) == (bm, bn) && k.b == BLayout::KMajor)
    };
    let mut out = Vec::new();
    out.extend(tile(unaligned_family(ElemType::Bf16, epilogue), 64, 128));
    out.extend(tile(simt_family(ElemType::Bf16, epilogue), 64, 64));
    out.into_iter().map(|k| StepKernel::whole(for_step(k, epilogue), usize::MAX)).collect()
}

/// A product of activations: GEMV kernels for one row and up to 8,
/// mma.sync tiles of 32×64 up to 64 rows and 64×128 beyond, the covers.
pub fn fixed_step_kernels(epilogue: Epilogue) -> Vec<StepKernel> {
    let gemv = gemv_family(ElemType::Bf16, epilogue);
    let mut out = Vec::new();
    for (bm, most) in [(1, 1), (8, 8)] {
        out.extend(gemv.iter().find(|k| k.bm == bm).map(|k| StepKernel::whole(for_step(*k, epilogue), most)));
    }
    let mma = || family(ElemType::Bf16, BLayout::KMajor, epilogue);
    let tile = |bm, bn| mma().into_iter().find(|k| (k.bm, k.bn) == (bm, bn));
    out.extend(tile(32, 64).map(|k| StepKernel::whole(for_step(k, epilogue), 64)));
    out.extend(tile(64, 128).map(|k| StepKernel::whole(for_step(k, epilogue), usize::MAX)));
    out.extend(covers(epilogue));
    out
}

/// The wave model of `profile` over the kernels a step may take on
/// `target`: the mma.sync tiles, their split-K forms and the GEMV kernels
/// it calibrated for a K-major B (and on sm_90a the cp.async-fed wgmma
/// kernels and theirs). A step's split-K kernels fold their shares
/// themselves (`GemmKernel::fold`: no reduction launch), at the rates the
/// calibration measured for their shares.
pub fn step_model(profile: &Record, target: StepTarget) -> Result<WaveModel, ReplayError> {
    let all = plain_family(ElemType::Bf16);
    let m = profile.model(BLayout::KMajor, &all)?;
    let keep: Vec<usize> = (0..m.kernels.len())
        .filter(|&i| {
            let k = &m.kernels[i];
            let arch = match k.arch {
                Arch::Sm80 | Arch::Gemv => true,
                Arch::Sm90a => target == StepTarget::Sm90a && !k.tma,
                Arch::Simt => false,
            };
            arch && !k.is_cover()
        })
        .collect();
    Ok(WaveModel {
        device: m.device,
        kernels: keep.iter().map(|&i| GemmKernel { fold: m.kernels[i].split_k, ..m.kernels[i] }).collect(),
        rates: keep.iter().map(|&i| m.rates[i].clone()).collect(),
        reduce: m.reduce,
    })
}

/// A weight's list: the model's pick at every M of `1..=M_DISTILLED` for
/// `batch × (M × n × k)`, runs of equal picks as one entry, then the covers.
/// `None` where no kernel of the model takes the product (K not a multiple
/// of 8: the covers alone).
pub fn weight_step_kernels(
    model: &WaveModel,
    epilogue: Epilogue,
    (batch, n, k): (usize, usize, usize),
) -> Vec<StepKernel> {
    let mut out: Vec<StepKernel> = Vec::new();
    for m in 1..=M_DISTILLED {
        let Some((c, _)) = model.choose(&Problem::nt(batch, m, n, k)) else { break };
        let kernel = for_step(model.kernels[c.kernel], epilogue);
        match out.last_mut() {
            Some(last) if last.kernel == kernel && last.splits == c.splits => last.most = m,
            _ => out.push(StepKernel { kernel, splits: c.splits, most: m }),
        }
    }
    if let Some(last) = out.last_mut() {
        last.most = usize::MAX;
    }
    out.extend(covers(epilogue));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The H200 profile parses into a model of mma.sync tiles and GEMV
    /// kernels; BERT-base's weights get GEMV at one row, tensor-core tiles at
    /// 128 and 4096 rows, smaller tiles at mid M for a narrow N than at large
    /// M; every list ends with the covers and takes any M.
    #[test]
    fn weights_get_the_wave_models_pick() {
        let model = step_model(&profile(H200_PROFILE).expect("the profile parses"), StepTarget::Sm80)
            .expect("a model");
        assert!(model.kernels.iter().any(|k| k.arch == Arch::Gemv));
        assert!(model.kernels.iter().all(|k| matches!(k.arch, Arch::Sm80 | Arch::Gemv)));
        assert!(model.kernels.iter().any(|k| k.split_k));
        let e = Epilogue { bias: true, ..Epilogue::NONE };
        for (n, k) in [(768, 768), (2304, 768), (3072, 768), (768, 3072)] {
            let list = weight_step_kernels(&model, e, (1, n, k));
            let pick = |m: usize| {
                list.iter()
                    .find(|e| m <= e.most && e.kernel.accepts(&Problem::nt(1, m, n, k)).is_ok())
                    .map(|x| x.kernel)
            };
            let one = pick(1).expect("one row");
            assert_eq!(one.arch, Arch::Gemv, "{n}x{k}: {one}");
            assert!(one.c_f32 && one.epilogue == e, "{one}");
            let big = pick(4096).expect("4096 rows");
            assert_eq!(big.arch, Arch::Sm80, "{n}x{k}: {big}");
            assert!(pick(100_000).is_some());
            let bounds: Vec<usize> = list.iter().map(|x| x.most).collect();
            assert!(bounds.windows(2).take(list.len() - 3).all(|w| w[0] < w[1]), "{bounds:?}");
            assert!(list[list.len() - 2].kernel.unaligned && list[list.len() - 1].kernel.arch == Arch::Simt);
            // Split-K entries fold their shares themselves, with the step's
            // epilogue into its f32 C.
            for x in list.iter().filter(|x| x.kernel.split_k) {
                assert!(x.splits > 1 && x.kernel.fold && x.kernel.epilogue == e && x.kernel.c_f32, "{x:?}");
                assert!(x.kernel.check().is_ok());
            }
        }
        // K not a multiple of 8: only the covers.
        let odd = weight_step_kernels(&model, e, (1, 64, 37));
        assert_eq!(odd.len(), 2, "{odd:?}");
    }

    /// On a Hopper the large products of BERT-base's weights take wgmma tiles.
    #[test]
    fn hopper_weights_take_wgmma_at_large_m() {
        let model = step_model(&profile(H200_PROFILE).expect("parses"), StepTarget::Sm90a).expect("a model");
        assert!(model.kernels.iter().any(|k| k.arch == Arch::Sm90a) && model.kernels.iter().all(|k| !k.tma));
        for (n, k) in [(2304, 768), (3072, 768), (768, 3072)] {
            let list = weight_step_kernels(&model, Epilogue::NONE, (1, n, k));
            let at = |m: usize| {
                list.iter()
                    .find(|e| m <= e.most && e.kernel.accepts(&Problem::nt(1, m, n, k)).is_ok())
                    .map(|x| x.kernel)
            };
            assert_eq!(at(1).map(|k| k.arch), Some(Arch::Gemv));
            assert_eq!(at(4096).map(|k| k.arch), Some(Arch::Sm90a), "{n}x{k}: {list:?}");
        }
    }

    /// A few rows against a long K (BERT-base's second feed-forward product
    /// at 8 to 128 rows): one tile a block leaves most SMs idle, and the
    /// model picks a split-K kernel, as the H200 sweep measured best there.
    #[test]
    fn few_rows_against_a_long_k_split_k() {
        for target in [StepTarget::Sm80, StepTarget::Sm90a] {
            let model = step_model(&profile(H200_PROFILE).expect("parses"), target).expect("a model");
            let list =
                weight_step_kernels(&model, Epilogue { residual: true, ..Epilogue::NONE }, (1, 768, 3072));
            for m in [16, 64, 127] {
                let e = list.iter().find(|e| m <= e.most).expect("an entry");
                assert!(e.kernel.split_k && e.splits > 1, "{target:?} {m} rows: {e:?}");
            }
            let e = list.iter().find(|e| 4096 <= e.most).expect("an entry");
            assert!(!e.kernel.split_k && e.splits == 1, "{target:?} 4096 rows: {e:?}");
        }
    }

    /// A convolution's list: each tensor-core tile preceded by its taps
    /// twin, GEMV and the covers left as they are; every twin is a valid
    /// kernel that takes the taps and only them.
    #[test]
    fn convolutions_get_taps_twins_of_their_tiles() {
        let model = step_model(&profile(H200_PROFILE).expect("parses"), StepTarget::Sm90a).expect("a model");
        let e = Epilogue { bias: true, activation: crate::kernel::Activation::Relu, ..Epilogue::NONE };
        let plain = weight_step_kernels(&model, e, (1, 64, 576));
        let list = reading_taps(plain.clone());
        let twins: Vec<&StepKernel> = list.iter().filter(|x| x.kernel.a_taps).collect();
        let tiles = plain
            .iter()
            .filter(|x| matches!(x.kernel.arch, Arch::Sm80 | Arch::Sm90a) && !x.kernel.is_cover());
        assert_eq!(twins.len(), tiles.count());
        assert!(!twins.is_empty());
        for (i, x) in list.iter().enumerate() {
            if x.kernel.a_taps {
                let next = list[i + 1];
                assert_eq!(GemmKernel { a_taps: true, ..next.kernel }, x.kernel);
                assert_eq!((x.most, x.splits), (next.most, next.splits));
                assert!(x.kernel.check().is_ok(), "{}", x.kernel);
                let taps = Problem {
                    a: crate::kernel::ALayout::Taps { width: 8, interior: 6, reads: 9 },
                    ..Problem::nt(1, 640, 64, 576)
                };
                assert!(x.kernel.accepts(&taps).is_ok() && next.kernel.accepts(&taps).is_err());
            }
        }
        // The last twin takes any M, so a bf16 image always has a kernel.
        assert_eq!(twins.last().map(|x| x.most), Some(usize::MAX));
        assert_eq!(list.len(), plain.len() + twins.len());
    }

    #[test]
    fn activations_get_fixed_bounds() {
        let list = fixed_step_kernels(Epilogue::NONE);
        assert_eq!(
            list.iter().map(|x| x.most).collect::<Vec<_>>(),
            [1, 8, 64, usize::MAX, usize::MAX, usize::MAX]
        );
        assert!(list.iter().all(|x| x.kernel.c_f32 && x.kernel.check().is_ok() && x.splits == 1));
    }
}
