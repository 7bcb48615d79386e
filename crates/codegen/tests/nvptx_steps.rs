//! The GEMM forms a model's steps take on the GPU, run on the host emulator
//! against the oracle.
//!
//! Implicit GEMM (`GemmKernel::a_taps`): the tensor-core kernels reading a
//! convolution's taps straight from a bf16 channels-last image (`cp.async`
//! from each tap, zero-filled in the padding), against the oracle over the
//! column matrix the plain definition writes. Geometries of 1, primes and
//! one past a tile: padding, strides, dilation, two images, padded pixels,
//! an image that starts inside its buffer; an mma.sync, a wgmma and a
//! folding split-K kernel. (ptxas assembles the taps tiles in `nvptx.rs`'s
//! `ptxas_accepts_every_family_kernel`.)
//!
//! A 16-bit copy of C beside the f32 one (`GemmKernel::c16_copy`): every
//! kind of kernel a step's list holds stores both, the copy each value of C
//! rounded, nothing past C's columns.
//!
//! Normalizing GEMVs (`GemmKernel::norm`): a layer norm's or an RMS norm's
//! rows multiplied from the norm's input, against the norm then the product
//! in f64, at rows whose mean is far from zero.
#![cfg(feature = "nvptx")]

use anyshape_codegen::emulator::{self as host, HostKernelKind, HostKernels};
use anyshape_codegen::nvptx;
use gpu::reference::{self, Operands};
use gpu::{candidates, ALayout, Activation, Arch, BLayout, ElemType, Epilogue, GemmKernel, Problem, RowNorm};
use plan::gpu::OperandCopy;
mod taps;

/// One convolution: images, height, width, channels, kernel, stride,
/// dilation, padding (the same along both axes), outputs N, and the pixel
/// stride's padding past the channels (elements).
#[derive(Clone, Copy, Debug)]
struct Conv {
    batch: usize,
    h: usize,
    w: usize,
    c: usize,
    kernel: [usize; 2],
    stride: usize,
    dilation: usize,
    pad: usize,
    n: usize,
    pixel_pad: usize,
}

impl Conv {
    fn out(&self) -> [usize; 2] {
        let o = |x: usize, k: usize| (x + 2 * self.pad - self.dilation * (k - 1) - 1) / self.stride + 1;
        [o(self.h, self.kernel[0]), o(self.w, self.kernel[1])]
    }

    fn taps(&self) -> OperandCopy {
        let [oh, ow] = self.out();
        let s_pix = self.c + self.pixel_pad;
        OperandCopy::Taps {
            rows: self.batch * oh * ow,
            cols: self.kernel[0] * self.kernel[1] * self.c,
            out: [oh, ow],
            image: [self.h, self.w, self.c],
            kernel_width: self.kernel[1],
            stride: [self.stride; 2],
            dilation: [self.dilation; 2],
            pad: [self.pad; 2],
            strides: [self.h * self.w * s_pix, self.w * s_pix, s_pix],
        }
    }
}

fn bf16(x: f32) -> u16 {
    plan::bf16_bits(x)
}

fn value(i: usize) -> f32 {
    ((i * 7919 % 1009) as f32 - 504.0) / 397.0
}

/// The family's `bm × bn` mma.sync tile (K-major B) with epilogue `epi`.
fn mma_tile(epi: Epilogue, bm: usize, bn: usize) -> GemmKernel {
    let fam = candidates::family(ElemType::Bf16, BLayout::KMajor, epi);
    fam.into_iter().find(|k| (k.bm, k.bn) == (bm, bn)).expect("a tile")
}

/// The family's cp.async-fed 64 × 128 wgmma tile with epilogue `epi`.
fn wgmma_tile(epi: Epilogue) -> GemmKernel {
    let fam = candidates::wgmma_family(ElemType::Bf16, epi);
    fam.into_iter().find(|k| !k.tma && k.bm == 64 && k.bn == 128).expect("a wgmma tile")
}

/// A kernel's shares of K as the runtime launches it: a folding split-K
/// kernel's steps a share, workspace and zeroed counters
/// (`GemmKernel::fold_space`); one share and nothing else for another.
struct Shares {
    per: usize,
    count: usize,
    workspace: Vec<f32>,
    counters: Vec<i64>,
}

impl Shares {
    fn new(k: &GemmKernel, p: &Problem, splits: usize) -> Shares {
        let (per, count) = if k.split_k { k.split_plan(p.k, splits) } else { (0, 1) };
        let (floats, tiles) = if k.split_k { k.fold_space(p, count) } else { (0, 0) };
        Shares { per, count, workspace: vec![0.0; floats + 1], counters: vec![0; tiles + 1] }
    }

    /// The kernel's words: A, B, C, the bias and the residual (`ptrs`); M,
    /// N, K, lda, ldb, ldc (`ints`); batch strides of zero; a folding
    /// kernel's `kper`, workspace and counters; then `last` (a taps
    /// kernel's descriptor, a copy's C).
    fn words(&mut self, k: &GemmKernel, ptrs: [u64; 5], ints: [usize; 6], last: u64) -> Vec<u64> {
        let mut args = ptrs.to_vec();
        args.extend(ints.map(|x| x as u64));
        args.extend([0, 0, 0]);
        if k.split_k {
            args.extend([
                self.per as u64,
                self.workspace.as_mut_ptr() as u64,
                self.counters.as_mut_ptr() as u64,
            ]);
        }
        args.push(last);
        args
    }
}

/// Kernel `k` (a taps kernel, f32 C) on convolution `conv` against the
/// oracle; `splits` shares of K for a folding split-K kernel.
fn check(host: &HostKernels, index: usize, k: &GemmKernel, conv: Conv, splits: usize) {
    let copy = conv.taps();
    let (m, kk) = copy.extent();
    let n = conv.n;
    let p = Problem {
        a: ALayout::Taps { width: conv.out()[1], interior: 0, reads: 1 },
        ..Problem::nt(1, m, n, kk)
    };
    k.accepts(&p).unwrap_or_else(|e| panic!("{k}: {e}"));
    // The image starts 8 elements into its buffer (16 bytes, as the runner
    // requires), its pixels `pixel_pad` apart past their channels; NaN bits
    // in the padding, which the kernel must never read.
    let start = 8;
    let OperandCopy::Taps { strides: [s_img, ..], .. } = copy else { unreachable!() };
    let len = start + conv.batch * s_img + 8;
    let image: Vec<u16> = (0..len).map(|i| bf16(value(i))).collect();
    let mut image = image;
    for (i, x) in image.iter_mut().enumerate() {
        let at = i.wrapping_sub(start);
        if i < start || at >= conv.batch * s_img || at % (conv.c + conv.pixel_pad) >= conv.c {
            *x = 0x7fc1;
        }
    }
    let b: Vec<u16> = (0..n * kk).map(|i| bf16(value(3 * i + 1))).collect();
    let bias: Vec<f32> = (0..n).map(|j| value(j + 5)).collect();
    let bias16: Vec<u16> = bias.iter().map(|&x| bf16(x)).collect();
    let bias: Vec<f32> = bias16.iter().map(|&x| f32::from_bits((x as u32) << 16)).collect();
    let desc = copy.descriptor(&[0]);
    let (image16, b16) = (host::aligned(&image), host::aligned(&b));
    let mut c = vec![f32::NAN; m * n + 4];
    let mut shares = Shares::new(k, &p, splits);
    let a = image16.as_ptr() as u64 + 2 * start as u64;
    let ptrs = [a, b16.as_ptr() as u64, c.as_mut_ptr() as u64, bias.as_ptr() as u64, 0];
    let args = shares.words(k, ptrs, [m, n, kk, 0, kk, n], desc.as_ptr() as u64);
    let grid = (n.div_ceil(k.bn), m.div_ceil(k.bm), shares.count);
    // SAFETY: A is the image the descriptor's geometry stays inside, B
    // `[N, K]`, C `M × N` f32 (rows `n` apart) with the bias `N` f32; a
    // folding kernel's workspace and zeroed counters as `fold_space` sizes
    // them.
    unsafe { host.launch_args(index, grid, (k.threads(), k.smem_bytes()), &args) }
        .unwrap_or_else(|e| panic!("{k}: {e}"));
    assert!(shares.counters.iter().all(|&x| x == 0), "{k}: the tiles' counters are left zero");
    let a = taps::column_matrix(&image, start, &copy, 0);
    let o = Operands { elem: ElemType::Bf16, a: &a, b: &b, bias: &bias16, residual: &[] };
    let want = reference::gemm(&Problem::nt(1, m, n, kk), &k.epilogue, &o);
    let scale = (kk as f64).sqrt();
    for i in 0..m {
        for j in 0..n {
            let (got, want) = (c[i * n + j], want[i * n + j]);
            assert!(
                reference::close(ElemType::F32, got, want, scale, false),
                "{k} {conv:?}: ({i}, {j}) {got} for {want}"
            );
        }
    }
    assert!(c[m * n..].iter().all(|x| x.is_nan()), "{k}: written past C");
}

#[test]
fn taps_kernels_read_a_convolutions_taps_in_place() {
    let epi = Epilogue { bias: true, activation: Activation::Relu, ..Epilogue::NONE };
    let taps = |k: GemmKernel| GemmKernel { a_taps: true, c_f32: true, ..k };
    let tile = |bm, bn| mma_tile(epi, bm, bn);
    let wgmma = wgmma_tile(epi);
    let split = GemmKernel { split_k: true, fold: true, ..tile(32, 64) };
    let kernels: Vec<GemmKernel> = [tile(64, 64), tile(16, 64), wgmma, split].into_iter().map(taps).collect();
    for k in &kernels {
        k.check().unwrap_or_else(|e| panic!("{e}"));
        assert!(k.name().contains("_taps"), "{k}");
        // The main loop divides by multiplications (`Gen::divisor`), never by
        // a division routine.
        let ir = nvptx::llvm_ir(k).expect("generates");
        let start = ir.find("\nloop:").expect("a main loop");
        let end = ir[start..].find("\nepilogue:").map_or(ir.len(), |e| start + e);
        assert!(
            !ir[start..end].contains("udiv") && !ir[start..end].contains("urem"),
            "{k}: a division in the loop"
        );
    }
    let compiled: Vec<(String, String, HostKernelKind)> = kernels
        .iter()
        .map(|k| {
            (k.name(), nvptx::llvm_ir(k).expect("generates"), HostKernelKind::Args { threads_apart: false })
        })
        .collect();
    let host = HostKernels::new(&compiled).expect("compiles for the host");
    let conv = |batch, h, w, c, kernel, stride, dilation, pad, n, pixel_pad| Conv {
        batch,
        h,
        w,
        c,
        kernel,
        stride,
        dilation,
        pad,
        n,
        pixel_pad,
    };
    let cases = [
        conv(1, 1, 1, 8, [1, 1], 1, 1, 0, 8, 0),
        conv(2, 7, 5, 16, [3, 3], 1, 1, 1, 24, 0),
        conv(1, 9, 11, 8, [3, 3], 2, 1, 1, 72, 8),
        conv(1, 7, 7, 24, [3, 3], 1, 2, 2, 16, 0),
        conv(2, 8, 8, 64, [1, 1], 2, 1, 0, 40, 0),
        conv(1, 13, 13, 32, [3, 3], 1, 1, 1, 66, 8),
        conv(1, 5, 3, 8, [1, 3], 1, 1, 1, 8, 0),
        // Divisors that are no powers of two (the channels, the kernel's width).
        conv(1, 11, 13, 40, [5, 5], 1, 1, 2, 16, 8),
        conv(1, 9, 9, 8, [7, 7], 2, 1, 3, 8, 0),
    ];
    for (i, k) in kernels.iter().enumerate() {
        for case in cases {
            check(&host, i, k, case, 3);
        }
    }
}

/// A taps kernel refuses a row-major A, and a plain one the taps.
#[test]
fn taps_kernels_take_only_taps() {
    let k = candidates::family(ElemType::Bf16, BLayout::KMajor, Epilogue::NONE)[0];
    let taps = GemmKernel { a_taps: true, ..k };
    let rows = Problem::nt(1, 64, 64, 64);
    let conv = Problem { a: ALayout::Taps { width: 8, interior: 6, reads: 9 }, ..rows };
    assert!(k.accepts(&rows).is_ok() && k.accepts(&conv).is_err());
    assert!(taps.accepts(&conv).is_ok() && taps.accepts(&rows).is_err());
    // Not the cover's, nor a TMA kernel's, nor with an f32 A.
    assert!(GemmKernel { unaligned: true, ..taps }.check().is_err());
    assert!(GemmKernel { a_f32: true, ..taps }.check().is_err());
    let tma = candidates::tma_family(ElemType::Bf16, Epilogue::NONE)[0];
    assert!(GemmKernel { a_taps: true, ..tma }.check().is_err());
    assert!(GemmKernel { a_taps: true, arch: Arch::Simt, ..k }.check().is_err());
}

/// Every kind of kernel a model step's list holds, storing f32 C through a
/// bias and a residual and its 16-bit copy beside it (`c16_copy`): C against
/// the oracle, the copy each value of C rounded to bf16, the rows' padding
/// in both untouched.
#[test]
fn kernels_store_a_16_bit_copy_of_c_beside_it() {
    let epi = Epilogue { bias: true, residual: true, activation: Activation::Relu, ..Epilogue::NONE };
    let tile = |bm, bn| mma_tile(epi, bm, bn);
    let wgmma = wgmma_tile(epi);
    let first = |fam: Vec<GemmKernel>| fam[0];
    let kernels: Vec<GemmKernel> = [
        tile(64, 64),
        wgmma,
        GemmKernel { split_k: true, fold: true, ..tile(32, 64) },
        first(candidates::unaligned_family(ElemType::Bf16, epi)),
        candidates::gemv_family(ElemType::Bf16, epi).into_iter().find(|k| k.bm == 8).expect("GEMV"),
        first(candidates::simt_family(ElemType::Bf16, epi)),
    ]
    .into_iter()
    .map(|k| GemmKernel { c_f32: true, c16_copy: true, ..k })
    .collect();
    let compiled: Vec<(String, String, HostKernelKind)> = kernels
        .iter()
        .map(|k| {
            k.check().unwrap_or_else(|e| panic!("{e}"));
            assert!(k.name().ends_with("_c32_c16_bias_res_relu"), "{k}");
            let kind = HostKernelKind::Args { threads_apart: k.arch == Arch::Simt };
            (k.name(), nvptx::llvm_ir(k).expect("generates"), kind)
        })
        .collect();
    let host = HostKernels::new(&compiled).expect("compiles for the host");
    for (index, k) in kernels.iter().enumerate() {
        let (m, n, kk) = if k.arch == Arch::Gemv { (7, 72, 96) } else { (37, 72, 96) };
        let p = Problem::nt(1, m, n, kk);
        k.accepts(&p).unwrap_or_else(|e| panic!("{k}: {e}"));
        let ldc = n + 3;
        let a: Vec<u16> = (0..m * kk).map(|i| bf16(value(i))).collect();
        let b: Vec<u16> = (0..n * kk).map(|i| bf16(value(3 * i + 1))).collect();
        let bias16: Vec<u16> = (0..n).map(|j| bf16(value(j + 5))).collect();
        let res16: Vec<u16> = (0..m * ldc).map(|i| bf16(value(7 * i + 2))).collect();
        let widen = |v: &[u16]| -> Vec<f32> { v.iter().map(|&x| f32::from_bits((x as u32) << 16)).collect() };
        let (bias, res) = (widen(&bias16), widen(&res16));
        let dense: Vec<u16> = (0..m * n).map(|i| res16[(i / n) * ldc + i % n]).collect();
        let mut c = vec![f32::NAN; m * ldc + 4];
        let mut c16 = vec![0x7fc1u16; m * ldc + 4];
        let mut shares = Shares::new(k, &p, 3);
        let (a16, b16) = (host::aligned(&a), host::aligned(&b));
        let ptrs = [
            a16.as_ptr() as u64,
            b16.as_ptr() as u64,
            c.as_mut_ptr() as u64,
            bias.as_ptr() as u64,
            res.as_ptr() as u64,
        ];
        let args = shares.words(k, ptrs, [m, n, kk, kk, kk, ldc], c16.as_mut_ptr() as u64);
        let grid = (n.div_ceil(k.bn), m.div_ceil(k.bm), shares.count);
        // SAFETY: A `[M, K]`, B `[N, K]` (bf16), C, the residual and the copy
        // `M` rows `ldc` apart, the bias `N` (f32); a folding kernel's
        // workspace and zeroed counters as `fold_space` sizes them.
        unsafe { host.launch_args(index, grid, (k.threads(), k.smem_bytes()), &args) }
            .unwrap_or_else(|e| panic!("{k}: {e}"));
        let o = Operands { elem: ElemType::Bf16, a: &a, b: &b, bias: &bias16, residual: &dense };
        let want = reference::gemm(&p, &k.epilogue, &o);
        let scale = (kk as f64).sqrt();
        for i in 0..m {
            for j in 0..ldc {
                let (got, copy) = (c[i * ldc + j], c16[i * ldc + j]);
                if j >= n {
                    assert!(got.is_nan() && copy == 0x7fc1, "{k}: ({i}, {j}) written past C's columns");
                    continue;
                }
                let want = want[i * n + j];
                assert!(
                    reference::close(ElemType::F32, got, want, scale, false),
                    "{k}: ({i}, {j}) {got} for {want}"
                );
                assert_eq!(copy, bf16(got), "{k}: ({i}, {j}) the copy of {got}");
            }
        }
    }
}

/// The taps kernels divide a column by the channels and a tap by the kernel's
/// width as `(x·m) >> p`, `p = 31 + ⌈log₂ d⌉`, `m = ⌈2^p / d⌉` (`Gen::divisor`):
/// exact for every `x` below 2³¹, as these columns and taps are (K < 2³¹).
#[test]
fn the_taps_divisions_by_multiplication_are_exact_below_2_31() {
    // As the kernel computes them: `ctlz` of `d - 1` in 32 bits (32 for 0).
    let divide = |x: u64, d: u64| {
        let p = 31 + 32 - ((d - 1) as u32).leading_zeros() as u64;
        let m = (1u64 << p).div_ceil(d);
        assert!(m < 1 << 32, "{d}: multiplier {m}");
        (x * m) >> p
    };
    let mut x = 0x1234_5678u64;
    for d in (1..=5000).chain([65_535, 1 << 20, (1 << 31) - 1]) {
        for edge in [0, 1, d - 1, d, d + 1, (1 << 31) - 1, (1 << 31) - d] {
            assert_eq!(divide(edge, d), edge / d, "{edge} / {d}");
        }
        for _ in 0..64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let v = (x >> 33) & ((1 << 31) - 1);
            assert_eq!(divide(v, d), v / d, "{v} / {d}");
        }
    }
}

/// Every GEMV of the family up to 4 rows (8 would spill), normalizing its f32 A's rows as a layer norm
/// (ε 1e-5) and as an RMS norm (ε 1e-6), through a bias and a residual: C
/// against the norm computed in f64 (two passes) then the product, at M of
/// 1, a prime and one past a block's rows, K of 8 (one chunk) to 1000 (a
/// partial step), and rows around 100 with a spread of a few units, where
/// a sum of squares less the squared mean would lose the variance in f32.
#[test]
fn gemv_kernels_normalize_their_rows() {
    let epi = Epilogue { bias: true, residual: true, ..Epilogue::NONE };
    let norms = [
        RowNorm { centered: true, eps: 1e-5f32.to_bits() },
        RowNorm { centered: false, eps: 1e-6f32.to_bits() },
    ];
    let kernels: Vec<GemmKernel> = norms
        .iter()
        .flat_map(|&norm| {
            candidates::gemv_family(ElemType::Bf16, epi)
                .into_iter()
                .filter(|k| k.bm <= 4)
                .map(move |k| GemmKernel { a_f32: true, c_f32: true, norm: Some(norm), ..k })
        })
        .collect();
    let compiled: Vec<(String, String, HostKernelKind)> = kernels
        .iter()
        .map(|k| {
            k.check().unwrap_or_else(|e| panic!("{e}"));
            let kind = HostKernelKind::Args { threads_apart: false };
            (k.name(), nvptx::llvm_ir(k).expect("generates"), kind)
        })
        .collect();
    assert!(compiled[0].0.contains("_a32_ln3727c5ac"), "{}", compiled[0].0);
    let host = HostKernels::new(&compiled).expect("compiles for the host");
    for (index, k) in kernels.iter().enumerate() {
        let norm = k.norm.expect("normalizing");
        let eps = f32::from_bits(norm.eps) as f64;
        for (m, n, kk) in [(1, 72, 8), (k.bm + 1, 37, 96), (5, 64, 1000)] {
            let p = Problem::nt(1, m, n, kk);
            k.accepts(&p).unwrap_or_else(|e| panic!("{k}: {e}"));
            let (lda, ldc) = (kk + 8, n + 3);
            let offset = if norm.centered { 100.0 } else { 0.0 };
            let a: Vec<f32> = (0..m * lda).map(|i| offset + 3.0 * value(i)).collect();
            let b: Vec<u16> = (0..n * kk).map(|i| bf16(value(3 * i + 1))).collect();
            let bias: Vec<f32> = (0..n).map(|j| value(j + 5)).collect();
            let res: Vec<f32> = (0..m * ldc).map(|i| value(7 * i + 2)).collect();
            let mut c = vec![f32::NAN; m * ldc + 4];
            let mut shares = Shares::new(k, &p, 1);
            let (a32, b16) = (aligned_f32(&a), host::aligned(&b));
            let ptrs = [
                a32.as_ptr() as u64,
                b16.as_ptr() as u64,
                c.as_mut_ptr() as u64,
                bias.as_ptr() as u64,
                res.as_ptr() as u64,
            ];
            let args = shares.words(k, ptrs, [m, n, kk, lda, kk, ldc], 0);
            let grid = (n.div_ceil(k.bn), m.div_ceil(k.bm), 1);
            // SAFETY: A `M` f32 rows `lda` apart, B `[N, K]` bf16, C and the
            // residual `M` rows `ldc` apart, the bias `N` (f32).
            unsafe { host.launch_args(index, grid, (k.threads(), k.smem_bytes()), &args) }
                .unwrap_or_else(|e| panic!("{k}: {e}"));
            for i in 0..m {
                let row: Vec<f64> = a[i * lda..i * lda + kk].iter().map(|&x| x as f64).collect();
                let mean = if norm.centered { row.iter().sum::<f64>() / kk as f64 } else { 0.0 };
                let var = row.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / kk as f64;
                let rstd = 1.0 / (var + eps).sqrt();
                for j in 0..ldc {
                    let got = c[i * ldc + j];
                    if j >= n {
                        assert!(got.is_nan(), "{k}: ({i}, {j}) written past C's columns");
                        continue;
                    }
                    let dot: f64 = (0..kk)
                        .map(|l| (row[l] - mean) * rstd * f32::from_bits((b[j * kk + l] as u32) << 16) as f64)
                        .sum();
                    let want = dot + bias[j] as f64 + res[i * ldc + j] as f64;
                    let tol = 2e-4 * (kk as f64).sqrt() + 1e-5 * want.abs();
                    assert!(
                        (got as f64 - want).abs() <= tol,
                        "{k} at {m}x{n}x{kk}: ({i}, {j}) {got} for {want}"
                    );
                }
            }
        }
    }
    let plain = candidates::gemv_family(ElemType::Bf16, epi)[0];
    let norm = Some(norms[0]);
    assert!(GemmKernel { norm, ..plain }.check().is_err(), "a normalizing GEMV reads an f32 A");
    assert!(GemmKernel { norm, a_f32: true, ..mma_tile(epi, 64, 64) }.check().is_err(), "GEMV only");
    let eight = candidates::gemv_family(ElemType::Bf16, epi).into_iter().find(|k| k.bm == 8).expect("8 rows");
    assert!(GemmKernel { norm, a_f32: true, ..eight }.check().is_err(), "at most 4 rows");
}

/// `v`'s values in 16-byte aligned storage (four a word, little-endian), as
/// the kernels' vector loads need.
fn aligned_f32(v: &[f32]) -> Vec<u128> {
    v.chunks(4)
        .map(|c| c.iter().enumerate().fold(0u128, |w, (i, x)| w | (x.to_bits() as u128) << (32 * i)))
        .collect()
}
