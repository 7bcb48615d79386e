//! The operand copy kernel (`codegen::nvptx::operand_copy_ir`) on the host
//! emulator against a plain copy: strided views (row-major, transposed,
//! broadcast entries, a stride of 0) and a convolution's taps (padding,
//! stride, dilation, several images), written as bf16 (round to nearest
//! even) dense `[entries, rows, cols]` or `[entries, cols, rows]`, at shapes
//! of 1, primes and past a block, including the rows-of-four and
//! taps-of-four forms (four elements a thread); with ptxas where the wheel's
//! is at hand.
#![cfg(feature = "nvptx")]

use anyshape_codegen::emulator::{HostKernelKind, HostKernels};
use anyshape_codegen::nvptx;
use plan::gpu::{OperandCopy, OPERAND_COPY_KERNEL};
use proptest::prelude::*;
mod taps;

fn kernels() -> HostKernels {
    let k = (OPERAND_COPY_KERNEL.to_string(), nvptx::operand_copy_ir(), HostKernelKind::Pointers);
    HostKernels::new(&[k]).expect("the operand copy compiles for the host")
}

/// The copy by the kernel: `dst` of `elems` bf16 words, the grid `blocks`.
fn run(host: &HostKernels, src: &[f32], copy: &OperandCopy, offsets: &[usize], blocks: usize) -> Vec<u16> {
    run_words(host, src, copy, &copy.descriptor(offsets), blocks)
}

/// [`run`] of the descriptor `desc` (its form word perhaps changed).
fn run_words(host: &HostKernels, src: &[f32], copy: &OperandCopy, desc: &[i64], blocks: usize) -> Vec<u16> {
    let (rows, cols) = copy.extent();
    let elems = desc[1] as usize * rows * cols;
    let mut dst = vec![0xffffu16; elems.max(1) + 8];
    // SAFETY: the descriptor's offsets, rows, columns and strides stay inside
    // `src` (each case's `src` is sized for them), `dst` holds every element.
    unsafe {
        host.launch_loop(
            0,
            (blocks, plan::gpu::LOOP_THREADS as usize, 0),
            [src.as_ptr() as u64, dst.as_mut_ptr() as u64, desc.as_ptr() as u64],
        )
    }
    .expect("launches");
    assert!(dst[elems..].iter().all(|&x| x == 0xffff), "written past the destination");
    dst.truncate(elems);
    dst
}

/// A convolution's taps as the plain definition lays them out, in bf16
/// (`src` starts at the entry).
fn plain_taps(src: &[f32], copy: &OperandCopy) -> Vec<u16> {
    taps::column_matrix(src, 0, copy, 0.0).into_iter().map(plan::bf16_bits).collect()
}

/// The first element where `got` and `want` differ, with both values.
fn first_wrong(got: &[u16], want: &[u16]) -> Option<(usize, u16, u16)> {
    got.iter().zip(want).position(|(g, w)| g != w).map(|i| (i, got[i], want[i]))
}

/// [`value`]s `0..len` (at least) in 16-byte aligned groups of four, as the
/// device's buffers start.
fn aligned_values(len: usize) -> Vec<[f32; 4]> {
    (0..len.div_ceil(4)).map(|q| std::array::from_fn(|j| value(4 * q + j))).collect()
}

fn value(i: usize) -> f32 {
    ((i * 7919 % 1009) as f32 - 504.0) / 97.0
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn views(
        rows in prop::sample::select(vec![1usize, 2, 7, 31, 33]),
        cols in prop::sample::select(vec![1usize, 3, 8, 17, 65]),
        entries in 1usize..4,
        transposed in any::<bool>(),
        column_major in any::<bool>(),
        pad in 0usize..3,
        blocks in 1usize..4,
    ) {
        let host = kernels();
        // Row-major with padded rows, or column-major (a transposed view).
        let (rs, cs) = if column_major { (1, rows + pad) } else { (cols + pad, 1) };
        let span = (rows - 1) * rs + (cols - 1) * cs + 1;
        let offsets: Vec<usize> = (0..entries).map(|e| 3 + e * (span + pad)).collect();
        let src: Vec<f32> = (0..offsets[entries - 1] + span).map(value).collect();
        let copy = OperandCopy::View { rows, cols, rs, cs, transposed };
        // An element a thread in 32-bit indices (the descriptor's pick at
        // these sizes, but for the rows of four), and in 64-bit ones (its
        // pick past 2³¹ elements).
        let words = copy.descriptor(&offsets);
        let forms = match words[0] {
            OperandCopy::ROWS4 => vec![OperandCopy::ROWS4],
            form => {
                prop_assert_eq!(form, OperandCopy::VIEW32);
                vec![OperandCopy::VIEW32, transposed as i64]
            }
        };
        for form in forms {
            let mut words = words.clone();
            words[0] = form;
            let got = run_words(&host, &src, &copy, &words, blocks);
            for (e, off) in offsets.iter().enumerate() {
                for r in 0..rows {
                    for c in 0..cols {
                        let at = if transposed { (e * cols + c) * rows + r } else { (e * rows + r) * cols + c };
                        let want = plan::bf16_bits(src[off + r * rs + c * cs]);
                        prop_assert_eq!(got[at], want, "form {} entry {} ({}, {})", form, e, r, c);
                    }
                }
            }
        }
    }

    #[test]
    fn taps(
        images in 1usize..3,
        (h, w) in (1usize..9, 1usize..9),
        channels in prop::sample::select(vec![1usize, 3, 4]),
        (kh, kw) in (1usize..4, 1usize..4),
        (sh, sw) in (1usize..3, 1usize..3),
        (dh, dw) in (1usize..3, 1usize..3),
        (ph, pw) in (0usize..3, 0usize..3),
    ) {
        let (eh, ew) = ((kh - 1) * dh + 1, (kw - 1) * dw + 1);
        prop_assume!(h + 2 * ph >= eh && w + 2 * pw >= ew);
        let (oh, ow) = ((h + 2 * ph - eh) / sh + 1, (w + 2 * pw - ew) / sw + 1);
        let host = kernels();
        // Channels last, pixels and rows padded apart.
        let (s_pix, s_row) = (channels + 1, (channels + 1) * w + 2);
        let s_img = s_row * h + 5;
        let src: Vec<f32> = (0..images * s_img + 7).map(value).collect();
        let (rows, cols) = (images * oh * ow, kh * kw * channels);
        let copy = OperandCopy::Taps {
            rows,
            cols,
            out: [oh, ow],
            image: [h, w, channels],
            kernel_width: kw,
            stride: [sh, sw],
            dilation: [dh, dw],
            pad: [ph, pw],
            strides: [s_img, s_row, s_pix],
        };
        // An element a thread in 32-bit indices (the descriptor's pick at
        // these sizes), and in 64-bit ones (its pick past 2³¹ elements).
        let words = copy.descriptor(&[2]);
        prop_assert_eq!(words[0], OperandCopy::TAPS32);
        let want = plain_taps(&src[2..], &copy);
        for form in [OperandCopy::TAPS32, 2] {
            let mut words = words.clone();
            words[0] = form;
            let wrong = first_wrong(&run_words(&host, &src, &copy, &words, 2), &want);
            prop_assert!(wrong.is_none(), "form {}: (element, got, want) {:?} of {:?}", form, wrong, copy);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Row-major views whose columns, row stride and offsets are multiples
    /// of four take the rows-of-four form (16-byte loads from a 16-byte
    /// aligned source), with as many threads as groups of four or fewer.
    #[test]
    fn rows_of_four(
        rows in prop::sample::select(vec![1usize, 2, 7, 31, 33]),
        quads in prop::sample::select(vec![1usize, 3, 16, 17]),
        entries in 1usize..4,
        pad in 0usize..3,
        blocks in 1usize..4,
    ) {
        let host = kernels();
        let cols = 4 * quads;
        let rs = cols + 4 * pad;
        let span = (rows - 1) * rs + cols;
        let offsets: Vec<usize> = (0..entries).map(|e| 4 + e * (span + 4 * pad)).collect();
        let copy = OperandCopy::View { rows, cols, rs, cs: 1, transposed: false };
        prop_assert_eq!(copy.descriptor(&offsets)[0], OperandCopy::ROWS4);
        // The source's start 16-byte aligned, as the device's buffers are.
        let quad_words = aligned_values(offsets[entries - 1] + span);
        let src: &[f32] = quad_words.as_flattened();
        let got = run(&host, src, &copy, &offsets, blocks);
        for (e, off) in offsets.iter().enumerate() {
            for r in 0..rows {
                for c in 0..cols {
                    let want = plan::bf16_bits(src[off + r * rs + c]);
                    prop_assert_eq!(got[(e * rows + r) * cols + c], want, "entry {} ({}, {})", e, r, c);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Taps whose channels, image strides and offset come in fours take the
    /// taps-of-four form (a tap's four channels a thread, 16-byte loads from
    /// a 16-byte aligned source): padding, stride, dilation, several images,
    /// against the element-a-thread form's result and the plain definition.
    #[test]
    fn taps_of_four(
        images in 1usize..3,
        (h, w) in (1usize..8, 1usize..8),
        channels in prop::sample::select(vec![4usize, 8, 12]),
        (kh, kw) in (1usize..4, 1usize..4),
        (sh, sw) in (1usize..3, 1usize..3),
        (dh, dw) in (1usize..3, 1usize..3),
        (ph, pw) in (0usize..3, 0usize..3),
        pad in 0usize..2,
        blocks in 1usize..4,
    ) {
        let (eh, ew) = ((kh - 1) * dh + 1, (kw - 1) * dw + 1);
        prop_assume!(h + 2 * ph >= eh && w + 2 * pw >= ew);
        let (oh, ow) = ((h + 2 * ph - eh) / sh + 1, (w + 2 * pw - ew) / sw + 1);
        let host = kernels();
        // Channels last, pixels, rows and images apart by fours.
        let s_pix = channels + 4 * pad;
        let s_row = s_pix * w + 4 * pad;
        let s_img = s_row * h + 4;
        let quad_words = aligned_values(images * s_img + 8);
        let src: &[f32] = quad_words.as_flattened();
        let (rows, cols) = (images * oh * ow, kh * kw * channels);
        let copy = OperandCopy::Taps {
            rows,
            cols,
            out: [oh, ow],
            image: [h, w, channels],
            kernel_width: kw,
            stride: [sh, sw],
            dilation: [dh, dw],
            pad: [ph, pw],
            strides: [s_img, s_row, s_pix],
        };
        prop_assert_eq!(copy.descriptor(&[4])[0], OperandCopy::TAPS4);
        let wrong = first_wrong(&run(&host, src, &copy, &[4], blocks), &plain_taps(&src[4..], &copy));
        prop_assert!(wrong.is_none(), "(element, got, want) {:?} of {:?}", wrong, copy);
    }
}

/// Taps that break a condition of the taps-of-four form take the form that
/// reads an element a thread (in 32-bit indices below 2³¹ elements).
#[test]
fn taps_off_four_read_an_element_a_thread() {
    let taps = |channels, s_pix| OperandCopy::Taps {
        rows: 4,
        cols: 9 * channels,
        out: [2, 2],
        image: [2, 2, channels],
        kernel_width: 3,
        stride: [1, 1],
        dilation: [1, 1],
        pad: [1, 1],
        strides: [4 * s_pix, 2 * s_pix, s_pix],
    };
    assert_eq!(taps(8, 8).descriptor(&[0, 64])[0], OperandCopy::TAPS4);
    assert_eq!(taps(3, 4).descriptor(&[0])[0], OperandCopy::TAPS32, "channels");
    assert_eq!(taps(8, 10).descriptor(&[0])[0], OperandCopy::TAPS32, "a stride");
    assert_eq!(taps(8, 8).descriptor(&[2])[0], OperandCopy::TAPS32, "an offset");
    let words = taps(8, 8).descriptor(&[0, 64]);
    assert_eq!(OperandCopy::work_items(&words), 2 * 4 * 72 / 4);
    assert_eq!(OperandCopy::work_items(&taps(3, 4).descriptor(&[0])), 4 * 27);
}

/// Views that break a condition of the rows-of-four form take the form
/// that reads an element a thread (in 32-bit indices below 2³¹ elements).
#[test]
fn views_off_four_read_an_element_a_thread() {
    let view = |cols, rs, cs, transposed| OperandCopy::View { rows: 3, cols, rs, cs, transposed };
    assert_eq!(view(8, 8, 1, false).descriptor(&[0, 32])[0], OperandCopy::ROWS4);
    assert_eq!(view(6, 8, 1, false).descriptor(&[0])[0], OperandCopy::VIEW32, "columns");
    assert_eq!(view(8, 10, 1, false).descriptor(&[0])[0], OperandCopy::VIEW32, "row stride");
    assert_eq!(view(8, 8, 1, false).descriptor(&[0, 2])[0], OperandCopy::VIEW32, "an offset");
    assert_eq!(view(8, 1, 3, false).descriptor(&[0])[0], OperandCopy::VIEW32, "column stride");
    let transposed = view(8, 8, 1, true).descriptor(&[0]);
    assert_eq!((transposed[0], transposed[6]), (OperandCopy::VIEW32, 1), "transposed");
    let words = view(8, 8, 1, false).descriptor(&[0, 32]);
    assert_eq!(OperandCopy::work_items(&words), 2 * 3 * 8 / 4);
    assert_eq!(OperandCopy::work_items(&view(6, 8, 1, false).descriptor(&[0])), 3 * 6);
}

/// The kernel's PTX assembles for sm_90a and sm_80 without spills, where the
/// wheel's ptxas is at hand (`ANYSHAPE_PTXAS`).
#[test]
fn ptxas_accepts_the_operand_copy() {
    let ptxas = std::env::var("ANYSHAPE_PTXAS").ok();
    if !kernels::testing::require("ANYSHAPE_REQUIRE_PTXAS", ptxas.is_some(), "ptxas in ANYSHAPE_PTXAS") {
        return;
    }
    let ptx = nvptx::operand_copy_ptx().expect("PTX");
    assert!(ptx.contains(&format!(".entry {OPERAND_COPY_KERNEL}(")));
    let file = std::env::temp_dir().join(format!("anyshape-operand-copy-{}.ptx", std::process::id()));
    std::fs::write(&file, &ptx).expect("write");
    for arch in ["sm_90a", "sm_80"] {
        let out = std::process::Command::new(ptxas.as_deref().unwrap_or_default())
            .args(["-v", "-arch", arch, "-o", "/dev/null"])
            .arg(&file)
            .output()
            .expect("ptxas runs");
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{arch}: {log}");
        assert!(!log.contains("bytes spill stores") || log.contains(" 0 bytes spill stores"), "{log}");
    }
    let _ = std::fs::remove_file(&file);
}
