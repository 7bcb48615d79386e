//! The hardware-aligned, sample-free candidate space (Vortex Alg. 2, FTuner's filter,
//! TSCompiler §5): built bottom-up with no example shape. Warp tiles (the level of
//! the m16n8k16 instruction) are kept when their accumulators and fragments fit the
//! register budget; block tiles are whole multiples of a warp tile within 1-8 warps;
//! stages are as many as shared memory holds for latency hiding (3-4), at least 2.

use crate::kernel::{Arch, BLayout, ElemType, Epilogue, GemmKernel, MAX_SMEM_PER_BLOCK_SM90};

/// Warp tiles: multiples of the instruction's 16 rows and of 16 columns (one
/// `ldmatrix.x4` loads two 8-column B fragments), up to 64×64: a 64×64 tile holds
/// 128 accumulators, the most that leave room for fragments and addresses.
pub fn warp_tiles() -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for wm in [16, 32, 64] {
        for wn in [16, 32, 64] {
            // A thread's accumulators: a quarter of 255 registers at least for the rest.
            if (wm / 16) * (wn / 8) * 4 <= 128 {
                out.push((wm, wn));
            }
        }
    }
    out
}

/// Every kernel of the space for one element type, B layout and epilogue.
pub fn space(elem: ElemType, b: BLayout, epilogue: Epilogue) -> Vec<GemmKernel> {
    let mut out = Vec::new();
    for (wm, wn) in warp_tiles() {
        for warps_m in [1, 2, 4] {
            for warps_n in [1, 2, 4] {
                let (bm, bn) = (wm * warps_m, wn * warps_n);
                if bm > 256 || bn > 256 {
                    continue;
                }
                for stages in [2, 3, 4] {
                    let k = plain(Arch::Sm80, elem, b, (bm, bn), (warps_m, warps_n), stages, epilogue);
                    if k.check().is_ok() {
                        out.push(k);
                    }
                }
            }
        }
    }
    out
}

/// The family that is compiled: from the space, per block tile the most stages that
/// fit (deeper pipelines only ever help a block that fits), per block tile the warp
/// split with the largest warp tile that still gives 4 warps or more (fewer, larger
/// warp tiles read less shared memory per FMA), and block tiles from 16×64 (a
/// handful of rows against a weight, spread over many blocks) up to 128×256 (the
/// large-M workhorses). The run-time model chooses among these per shape.
pub fn family(elem: ElemType, b: BLayout, epilogue: Epilogue) -> Vec<GemmKernel> {
    let tiles: &[(usize, usize)] = &[
        (16, 64),
        (16, 128),
        (32, 64),
        (32, 128),
        (64, 64),
        (64, 128),
        (128, 64),
        (128, 128),
        (128, 256),
        (256, 128),
    ];
    let space = space(elem, b, epilogue);
    let mut out = Vec::new();
    for &(bm, bn) in tiles {
        let best = space
            .iter()
            .filter(|k| k.bm == bm && k.bn == bn)
            .max_by_key(|k| {
                let (wm, wn) = k.warp_tile();
                // Prefer: at least 4 warps, then larger warp tiles, then more stages.
                ((k.warps() >= 4) as usize, (k.warps() <= 8) as usize, wm * wn, k.stages)
            })
            .copied();
        if let Some(k) = best {
            out.push(k);
        }
    }
    out
}

/// The wgmma family (sm_90a, B K-major): one or two warpgroups of `m64n{bn}k16`,
/// `bn` 128 or 256 (the instruction's N: 64 or 128 accumulators a thread), with as
/// many stages (at most 4) as Hopper's shared memory holds; each tile twice: its
/// products waited for every step, and one group kept in flight (`overlap`).
pub fn wgmma_family(elem: ElemType, epilogue: Epilogue) -> Vec<GemmKernel> {
    let mut out = Vec::new();
    for overlap in [false, true] {
        for (bm, bn) in [(64, 128), (64, 256), (128, 128), (128, 256)] {
            let kernel = |stages| GemmKernel { overlap, ..wgmma(elem, epilogue, bm, bn, stages) };
            out.extend(deepest(kernel, 2..=4));
        }
    }
    out
}

/// The cp.async-fed wgmma tiles of [`wgmma_family`] for an N-major B (`[K, N]`
/// rows: an activation's, or a weight as ONNX stores it), read by `wgmma`
/// with `imm-trans-b` through the same 128-byte swizzle.
pub fn wgmma_nn_family(elem: ElemType, epilogue: Epilogue) -> Vec<GemmKernel> {
    wgmma_family(elem, epilogue).into_iter().map(|k| GemmKernel { b: BLayout::NMajor, ..k }).collect()
}

/// The TMA and persistent (not ping-pong) wgmma tiles for an N-major B: the
/// producer's boxes of 64 columns by a step's K rows, one for each
/// 64-column block of the tile (wgmma's N-major atoms).
pub fn tma_nn_family(elem: ElemType, epilogue: Epilogue) -> Vec<GemmKernel> {
    tma_family(elem, epilogue)
        .into_iter()
        .chain(persistent_family(elem, epilogue))
        .map(|k| GemmKernel { b: BLayout::NMajor, ..k })
        .collect()
}

/// A wgmma kernel of tile `bm × bn` (B K-major, `bm/16` warps), cp.async-fed.
fn wgmma(elem: ElemType, epilogue: Epilogue, bm: usize, bn: usize, stages: usize) -> GemmKernel {
    plain(Arch::Sm90a, elem, BLayout::KMajor, (bm, bn), (bm / 16, 1), stages, epilogue)
}

/// A kernel with none of the pipeline's options (cp.async-fed, whole K, no group in
/// flight).
fn plain(
    arch: Arch,
    elem: ElemType,
    b: BLayout,
    (bm, bn): (usize, usize),
    (warps_m, warps_n): (usize, usize),
    stages: usize,
    epilogue: Epilogue,
) -> GemmKernel {
    GemmKernel {
        arch,
        elem,
        b,
        bm,
        bn,
        warps_m,
        warps_n,
        stages,
        epilogue,
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

/// `kernel` with the most stages in `stages` whose shared memory fits a Hopper
/// block, if that kernel is valid.
fn deepest(
    kernel: impl Fn(usize) -> GemmKernel,
    stages: std::ops::RangeInclusive<usize>,
) -> Option<GemmKernel> {
    let s = stages.rev().find(|&s| kernel(s).smem_bytes() <= MAX_SMEM_PER_BLOCK_SM90)?;
    Some(kernel(s)).filter(|k| k.check().is_ok())
}

/// The warp-specialized TMA family (sm_90a, B K-major): one or two consumer
/// warpgroups of `m64n{bn}k16` (`bm` 64 or 128) fed by a producer warpgroup, with
/// as many stages (at most 6) as Hopper's shared memory holds: a deeper pipeline
/// costs the producer nothing, and with one block an SM (the register file bounds
/// a 384-thread block to one) the shared memory has no other use.
pub fn tma_family(elem: ElemType, epilogue: Epilogue) -> Vec<GemmKernel> {
    let mut out = Vec::new();
    for (bm, bn) in [(64, 128), (64, 256), (128, 128), (128, 256)] {
        out.extend(deepest(
            |stages| GemmKernel { tma: true, ..wgmma(elem, epilogue, bm, bn, stages) },
            3..=6,
        ));
    }
    out
}

/// The persistent TMA kernels: the same tiles, each with its epilogue's region of
/// shared memory beside as many stages as still fit (3 for 128×256), one block an
/// SM walking the tiles, so that a tile's stores overlap the next tile's copies.
/// Epilogues without a residual (a residual's loads beside the accumulators spill
/// the staged store).
pub fn persistent_family(elem: ElemType, epilogue: Epilogue) -> Vec<GemmKernel> {
    let mut out = Vec::new();
    if epilogue.residual {
        return out;
    }
    for (bm, bn) in [(64, 128), (64, 256), (128, 128), (128, 256)] {
        let kernel =
            |stages| GemmKernel { tma: true, persistent: true, ..wgmma(elem, epilogue, bm, bn, stages) };
        out.extend(deepest(kernel, 3..=6));
    }
    out
}

/// The ping-pong kernels (`GemmKernel::pingpong`): persistent, two consumer
/// warpgroups each over a 64-row tile of its own, taking the block's tiles in
/// turns, so that one's epilogue overlaps the other's products; as many stages
/// as fit beside both consumers' epilogue regions (6 for 64×128, 4 for 64×256).
pub fn pingpong_family(elem: ElemType, epilogue: Epilogue) -> Vec<GemmKernel> {
    persistent_family(elem, epilogue)
        .into_iter()
        .filter(|k| k.bm == 64)
        .filter_map(|k| deepest(|stages| GemmKernel { pingpong: true, stages, ..k }, 3..=6))
        .collect()
}

/// Every kernel without an epilogue for one element type: the mma.sync tiles for
/// both B layouts, the cp.async-fed, TMA and persistent wgmma tiles for both, the ping-pong ones,
/// and the split-K kernels. The benchmark's sweep runs on these.
pub fn plain_family(elem: ElemType) -> Vec<GemmKernel> {
    let mut out = Vec::new();
    for b in [BLayout::KMajor, BLayout::NMajor] {
        out.extend(family(elem, b, Epilogue::NONE));
    }
    out.extend(wgmma_family(elem, Epilogue::NONE));
    out.extend(wgmma_nn_family(elem, Epilogue::NONE));
    out.extend(tma_nn_family(elem, Epilogue::NONE));
    out.extend(tma_family(elem, Epilogue::NONE));
    out.extend(persistent_family(elem, Epilogue::NONE));
    out.extend(pingpong_family(elem, Epilogue::NONE));
    out.extend(split_k_family(elem));
    out.extend(simt_family(elem, Epilogue::NONE));
    out.extend(gemv_family(elem, Epilogue::NONE));
    out.extend(unaligned_family(elem, Epilogue::NONE));
    out
}

/// The tensor-core cover (`GemmKernel::unaligned`) for both B layouts: mma.sync
/// tiles 32×64 and 64×128 loading their operands element by element, for what the
/// aligned kernels refuse (K not a multiple of 8, unaligned leading dimensions, an
/// N-major B with N not a multiple of 8).
pub fn unaligned_family(elem: ElemType, epilogue: Epilogue) -> Vec<GemmKernel> {
    let mut out = Vec::new();
    for b in [BLayout::KMajor, BLayout::NMajor] {
        for k in family(elem, b, epilogue) {
            if matches!((k.bm, k.bn), (32, 64) | (64, 128)) {
                out.push(GemmKernel { unaligned: true, ..k });
            }
        }
    }
    out
}

/// The GEMV kernels (`Arch::Gemv`) for a K-major B: decode-sized rows (1, up to 4,
/// up to 8 a block), four warps a block, a column each.
pub fn gemv_family(elem: ElemType, epilogue: Epilogue) -> Vec<GemmKernel> {
    [1, 4, 8]
        .into_iter()
        .map(|bm| plain(Arch::Gemv, elem, BLayout::KMajor, (bm, 4), (1, 4), 1, epilogue))
        .filter(|k| k.check().is_ok())
        .collect()
}

/// The SIMT kernels (`Arch::Simt`) for both B layouts: the cover for products no
/// tensor-core kernel accepts (K not a multiple of 8, an N-major B with N not a
/// multiple of 8), a 32 × 32 tile for few rows and a 64 × 64 one.
pub fn simt_family(elem: ElemType, epilogue: Epilogue) -> Vec<GemmKernel> {
    let mut out = Vec::new();
    for b in [BLayout::KMajor, BLayout::NMajor] {
        for tile in [(32, 32), (64, 64)] {
            let k = plain(Arch::Simt, elem, b, tile, (8, 1), 1, epilogue);
            if k.check().is_ok() {
                out.push(k);
            }
        }
    }
    out
}

/// The Stream-K kernels (`GemmKernel::stream_k`): the folding forms of the
/// split-K family's mma.sync and cp.async-fed wgmma tiles and of the
/// persistent TMA tiles, each block of a launch an even share of all the
/// tiles' K steps, with `epilogue`. Not the
/// 64 × 128 mma.sync tile: the loop over units keeps a few more registers
/// live than its 64 accumulators a thread leave, and ptxas spills.
pub fn stream_k_family(elem: ElemType, epilogue: Epilogue) -> Vec<GemmKernel> {
    let split = split_k_family(elem).into_iter().filter(|k| !(k.tma || (k.arch == Arch::Sm80 && k.bm == 64)));
    let persistent =
        persistent_family(elem, Epilogue::NONE).into_iter().map(|k| GemmKernel { split_k: true, ..k });
    split
        .chain(persistent)
        .map(|k| GemmKernel { fold: true, stream_k: true, epilogue, ..k })
        .filter(|k| k.check().is_ok())
        .collect()
}

/// The split-K kernels: for a few rows against a long K (a decoder's projections),
/// where one block a tile leaves most SMs idle. Small mma.sync tiles for either B
/// layout and the smaller wgmma tile (each of its pipelines) for a K-major B; the
/// splits are chosen per product by the wave model.
pub fn split_k_family(elem: ElemType) -> Vec<GemmKernel> {
    let mut out = Vec::new();
    for b in [BLayout::KMajor, BLayout::NMajor] {
        for k in family(elem, b, Epilogue::NONE) {
            if matches!((k.bm, k.bn), (16, 64) | (32, 64) | (64, 128)) {
                out.push(GemmKernel { split_k: true, ..k });
            }
        }
    }
    for k in wgmma_family(elem, Epilogue::NONE).into_iter().chain(tma_family(elem, Epilogue::NONE)) {
        if (k.bm, k.bn) == (64, 128) {
            out.push(GemmKernel { split_k: true, ..k });
        }
    }
    out
}
