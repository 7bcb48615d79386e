//! The blocked driver with a plain-Rust micro-kernel of the same ABI: blocking,
//! packing with local padding and edge write-back are right at every shape,
//! including 1, primes, MR±1, NR±1 and KC±1, with strided (transposed) operands.

use anyshape_kernels::{gemm, BOperand, Blocking, ElemType, MatMut, MatRef, MicroKernel};
use proptest::prelude::*;

#[macro_use]
mod common;

rust_kernel!(rust_kernel_3x5, 3, 5);
rust_kernel!(rust_kernel_1x5, 1, 5);
rust_kernel!(bf16_kernel_3x5, 3, 5, bf16);
rust_kernel!(bf16_kernel_1x5, 1, 5, bf16);

fn naive(a: &[f32], b: &[f32], m: usize, k: usize, n: usize, ta: bool) -> Vec<f32> {
    let at = |i: usize, p: usize| if ta { a[p * m + i] } else { a[i * k + p] };
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| at(i, p) as f64 * b[p * n + j] as f64).sum::<f64>() as f32;
        }
    }
    c
}

fn dims() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(1usize),
        Just(2),
        Just(3),
        Just(4),
        Just(5),
        Just(6),
        Just(7),
        Just(13),
        Just(17),
        Just(31),
        1usize..40
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
    #[test]
    fn blocked_gemm_matches_naive(m in dims(), k in dims(), n in dims(), kc in 1usize..9, mcb in 1usize..4, ncb in 1usize..4, ta in any::<bool>()) {
        let uk = MicroKernel { mr: 3, nr: 5, elem: ElemType::F32, func: rust_kernel_3x5, epilogue: Default::default(), packers: Default::default(), amx: false };
        let blk = Blocking { kc, mc: 3 * mcb, nc: 5 * ncb };
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 4.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 3.0).collect();
        // Canaries around C catch writes outside it.
        let ldc = n + 2;
        let mut c = vec![f32::NAN; m * ldc + 8];
        let av = if ta { MatRef::row_major(&a, k, m).expect("a").t() } else { MatRef::row_major(&a, m, k).expect("a") };
        let bv = MatRef::row_major(&b, k, n).expect("b");
        let mut cv = MatMut::new(&mut c[..], m, n, ldc).expect("c");
        gemm(&uk, &blk, av, bv, &mut cv).expect("gemm");
        let want = naive(&a, &b, m, k, n, ta);
        for i in 0..m {
            for j in 0..n {
                let got = c[i * ldc + j];
                prop_assert!((got - want[i * n + j]).abs() <= 1e-3 * (1.0 + want[i * n + j].abs()), "({i},{j}) {got} vs {}", want[i * n + j]);
            }
            for j in n..ldc.min(c.len() - i * ldc) {
                prop_assert!(c[i * ldc + j].is_nan(), "wrote outside C at ({i},{j})");
            }
        }
        prop_assert!(c[m * ldc..].iter().all(|x| x.is_nan()));
    }
}

#[test]
fn bad_shapes_are_errors() {
    let uk = MicroKernel {
        mr: 3,
        nr: 5,
        elem: ElemType::F32,
        func: rust_kernel_3x5,
        epilogue: Default::default(),
        packers: Default::default(),
        amx: false,
    };
    let blk = Blocking { kc: 4, mc: 3, nc: 5 };
    let a = vec![0.0; 6];
    assert!(MatRef::row_major(&a, 3, 3).is_err(), "a view larger than its buffer");
    let (av, bv) = (MatRef::row_major(&a, 2, 3).expect("a"), MatRef::row_major(&a, 2, 3).expect("b"));
    let mut c = vec![0.0; 9];
    let mut cv = MatMut::new(&mut c, 2, 3, 3).expect("c");
    assert!(gemm(&uk, &blk, av, bv, &mut cv).unwrap_err().to_string().contains("cannot multiply"));
    let bad = Blocking { kc: 4, mc: 4, nc: 5 };
    let bv = MatRef::row_major(&a, 3, 2).expect("b");
    let mut c = vec![0.0; 4];
    let mut cv = MatMut::new(&mut c, 2, 2, 2).expect("c");
    assert!(gemm(&uk, &bad, av, bv, &mut cv).unwrap_err().to_string().contains("do not fit"));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 60, ..ProptestConfig::default() })]
    #[test]
    fn parallel_gemm_matches_naive(m in dims(), k in dims(), n in dims(), threads in 1usize..4) {
        let pool = anyshape_kernels::ThreadPool::new(threads);
        let uk = MicroKernel { mr: 3, nr: 5, elem: ElemType::F32, func: rust_kernel_3x5, epilogue: Default::default(), packers: Default::default(), amx: false };
        let blk = Blocking { kc: 4, mc: 6, nc: 10 };
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 4.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 3.0).collect();
        let mut c = vec![f32::NAN; m * n];
        let cv = MatMut::new(&mut c, m, n, n).expect("c");
        anyshape_kernels::gemm_parallel(&pool, &uk, &blk, MatRef::row_major(&a, m, k).unwrap(), MatRef::row_major(&b, k, n).unwrap(), cv).expect("gemm");
        let want = naive(&a, &b, m, k, n, false);
        for (g, w) in c.iter().zip(&want) {
            prop_assert!((g - w).abs() <= 1e-3 * (1.0 + w.abs()));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 120, ..ProptestConfig::default() })]
    #[test]
    fn prepacked_gemm_matches_naive(m in dims(), k in dims(), n in dims(), kc in 1usize..9, threads in 1usize..4, ta in any::<bool>(), cover in any::<bool>(), shared in any::<bool>()) {
        let pool = anyshape_kernels::ThreadPool::new(threads);
        let uk = MicroKernel { mr: 3, nr: 5, elem: ElemType::F32, func: rust_kernel_3x5, epilogue: Default::default(), packers: Default::default(), amx: false };
        let blk = Blocking { kc, mc: 6, nc: 10 };
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 4.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 3.0).collect();
        let mut packed = anyshape_kernels::PackedB::new(MatRef::row_major(&b, k, n).unwrap(), 5, kc);
        prop_assert_eq!(Some(packed.words().len()), anyshape_kernels::PackedB::len_of(k, n, 5, kc, ElemType::F32));
        if shared {
            // The same words read in place from a window of other bytes (an artifact's).
            let mut bytes = vec![0xEEu8; 64];
            bytes.extend(packed.words().iter().flat_map(|w| w.to_le_bytes()));
            let end = bytes.len();
            bytes.extend([0xEE; 64]);
            let owner: anyshape_kernels::SharedBytes = std::sync::Arc::new(bytes);
            packed = anyshape_kernels::PackedB::from_shared((k, n, 5, kc, ElemType::F32), owner.clone(), 64..end).expect("shared");
            // A window of the wrong length, misaligned, or outside the bytes: errors.
            prop_assert!(anyshape_kernels::PackedB::from_shared((k, n, 5, kc, ElemType::F32), owner.clone(), 60..end).is_err());
            prop_assert!(anyshape_kernels::PackedB::from_shared((k, n, 5, kc, ElemType::F32), owner.clone(), 65..end + 1).is_err());
            prop_assert!(anyshape_kernels::PackedB::from_shared((k, n, 5, kc, ElemType::F32), owner, 64..end + 4096).is_err());
        }
        let ldc = n + 1;
        let mut c = vec![f32::NAN; m * ldc];
        let cv = MatMut::new(&mut c, m, n, ldc).expect("c");
        let av = if ta { MatRef::row_major(&a, k, m).unwrap().t() } else { MatRef::row_major(&a, m, k).unwrap() };
        let small = MicroKernel { mr: 1, nr: 5, elem: ElemType::F32, func: rust_kernel_1x5, epilogue: Default::default(), packers: Default::default(), amx: false };
        anyshape_kernels::gemm_packed(&pool, &uk, cover.then_some(&small), &blk, av, &packed, cv, &Default::default()).expect("gemm");
        let want = naive(&a, &b, m, k, n, ta);
        for i in 0..m {
            for j in 0..n {
                let (g, w) = (c[i * ldc + j], want[i * n + j]);
                prop_assert!((g - w).abs() <= 1e-3 * (1.0 + w.abs()), "({i},{j}) {g} vs {w}");
            }
            if i + 1 < m {
                prop_assert!(c[i * ldc + n].is_nan(), "wrote into the row gap");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]
    #[test]
    fn batched_gemm_matches_naive(batch in 1usize..6, m in dims(), k in dims(), n in dims(), threads in 1usize..4) {
        let pool = anyshape_kernels::ThreadPool::new(threads);
        let uk = MicroKernel { mr: 3, nr: 5, elem: ElemType::F32, func: rust_kernel_3x5, epilogue: Default::default(), packers: Default::default(), amx: false };
        let blk = Blocking { kc: 4, mc: 6, nc: 10 };
        let a: Vec<f32> = (0..batch * m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 4.0).collect();
        let b: Vec<f32> = (0..batch * k * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 3.0).collect();
        let mut c = vec![f32::NAN; batch * m * n];
        let av: Vec<MatRef> = (0..batch).map(|e| MatRef::row_major(&a[e * m * k..(e + 1) * m * k], m, k).unwrap()).collect();
        // B transposed in memory, as attention's Kᵀ is.
        let bt: Vec<f32> = (0..batch).flat_map(|e| (0..n * k).map(move |x| (e, x))).map(|(e, x)| b[e * k * n + (x % k) * n + x / k]).collect();
        let bv: Vec<MatRef> = (0..batch).map(|e| MatRef::row_major(&bt[e * k * n..(e + 1) * k * n], n, k).unwrap().t()).collect();
        let mut cv: Vec<MatMut> = c.chunks_mut((m * n).max(1)).take(batch).map(|ch| MatMut::new(ch, m, n, n).unwrap()).collect();
        anyshape_kernels::gemm_batched(&pool, &uk, &blk, &av, &bv, &mut cv).expect("gemm");
        for e in 0..batch {
            let want = naive(&a[e * m * k..(e + 1) * m * k], &b[e * k * n..(e + 1) * k * n], m, k, n, false);
            for (g, w) in c[e * m * n..(e + 1) * m * n].iter().zip(&want) {
                prop_assert!((g - w).abs() <= 1e-3 * (1.0 + w.abs()));
            }
        }
    }
}

/// The product of the operands as bf16 represents them (what a bf16 kernel
/// multiplies), accumulated in f64.
fn naive_bf16(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let r = |x: f32| ElemType::Bf16.round(x);
    let a: Vec<f32> = a.iter().map(|&x| r(x)).collect();
    let b: Vec<f32> = b.iter().map(|&x| r(x)).collect();
    naive(&a, &b, m, k, n, false)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 150, ..ProptestConfig::default() })]
    /// bf16 words through the driver with the portable packing: odd depths (the
    /// last pair of each block padded with zero), blocks of odd depth, row-major,
    /// transposed and pre-packed B, transposed A, a cover kernel, threads.
    #[test]
    fn bf16_words_through_the_driver(m in dims(), k in dims(), n in dims(), kc in 1usize..9, threads in 1usize..4, ta in any::<bool>(), b_form in 0usize..3, cover in any::<bool>()) {
        let pool = anyshape_kernels::ThreadPool::new(threads);
        let kern = |mr, func| MicroKernel { mr, nr: 5, elem: ElemType::Bf16, func, epilogue: Default::default(), packers: Default::default(), amx: false };
        let (uk, small) = (kern(3, bf16_kernel_3x5), kern(1, bf16_kernel_1x5));
        let blk = Blocking { kc, mc: 6, nc: 10 };
        // Values bf16 cannot hold exactly: the rounding is part of what is checked.
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 3.7).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 2.9).collect();
        let at: Vec<f32> = (0..m * k).map(|x| a[(x % m) * k + x / m]).collect();
        let bt: Vec<f32> = (0..k * n).map(|x| b[(x % k) * n + x / k]).collect();
        let av = if ta { MatRef::row_major(&at, k, m).unwrap().t() } else { MatRef::row_major(&a, m, k).unwrap() };
        let packed = anyshape_kernels::PackedB::of_elem(MatRef::row_major(&b, k, n).unwrap(), 5, kc, ElemType::Bf16);
        prop_assert_eq!(Some(packed.words().len()), anyshape_kernels::PackedB::len_of(k, n, 5, kc, ElemType::Bf16));
        let bop = match b_form {
            0 => BOperand::Plain(MatRef::row_major(&b, k, n).unwrap()),
            1 => BOperand::Plain(MatRef::row_major(&bt, n, k).unwrap().t()),
            _ => BOperand::Packed(&packed),
        };
        let grid = anyshape_kernels::ThreadGrid::rule_of_thumb(threads, 1, m.div_ceil(3), n.div_ceil(5));
        let plan = anyshape_kernels::Plan::Packed(anyshape_kernels::PackedPlan {
            kernel: &uk,
            cover: (cover && m % 3 != 0).then_some(&small),
            blocking: blk,
            order: Default::default(),
            grid,
        });
        let mut c = vec![f32::NAN; m * n];
        let cv = MatMut::new(&mut c, m, n, n).unwrap();
        anyshape_kernels::execute(&pool, &plan, &[av], &[bop], &mut [cv], &Default::default()).expect("gemm");
        let want = naive_bf16(&a, &b, m, k, n);
        for (i, (g, w)) in c.iter().zip(&want).enumerate() {
            prop_assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "[{i}] {g} vs {w}");
        }
    }
}

/// A B packed as one element type cannot feed kernels of another.
#[test]
fn packed_b_of_another_type_is_an_error() {
    let pool = anyshape_kernels::ThreadPool::new(1);
    let uk = MicroKernel {
        mr: 3,
        nr: 5,
        elem: ElemType::Bf16,
        func: bf16_kernel_3x5,
        epilogue: Default::default(),
        packers: Default::default(),
        amx: false,
    };
    let b = vec![1.0f32; 8 * 5];
    let packed = anyshape_kernels::PackedB::new(MatRef::row_major(&b, 8, 5).unwrap(), 5, 4);
    let a = vec![1.0f32; 3 * 8];
    let mut c = vec![0.0f32; 3 * 5];
    let plan = anyshape_kernels::Plan::Packed(anyshape_kernels::PackedPlan {
        kernel: &uk,
        cover: None,
        blocking: Blocking { kc: 4, mc: 3, nc: 5 },
        order: Default::default(),
        grid: anyshape_kernels::ThreadGrid::SINGLE,
    });
    let cv = MatMut::new(&mut c, 3, 5, 5).unwrap();
    let av = MatRef::row_major(&a, 3, 8).unwrap();
    let e = anyshape_kernels::execute(
        &pool,
        &plan,
        &[av],
        &[BOperand::Packed(&packed)],
        &mut [cv],
        &Default::default(),
    );
    assert!(e.unwrap_err().to_string().contains("packed as f32"));
}

/// Packed weights start on a cache line, so that the kernels' vector loads of a
/// panel never straddle two lines (the allocator alone gives 16 bytes).
#[test]
fn packed_weights_start_a_cache_line() {
    for (k, n, nr, kc) in [(1usize, 1usize, 16usize, 8usize), (768, 3072, 48, 184), (33, 70, 32, 7)] {
        let data: Vec<f32> = (0..k * n).map(|i| i as f32).collect();
        let b = MatRef::row_major(&data, k, n).unwrap();
        for elem in [ElemType::F32, ElemType::Bf16] {
            let p = anyshape_kernels::PackedB::of_elem(b, nr, kc, elem);
            assert_eq!(p.words().as_ptr() as usize % 64, 0, "{k}x{n} nr {nr} kc {kc} {elem:?}");
            assert_eq!(Some(p.words().len()), anyshape_kernels::PackedB::len_of(k, n, nr, kc, elem));
        }
    }
}

/// i16s8's B panels hold byte pairs (depth `2w` low, `2w + 1` high, the values'
/// low bytes), two words to a 32-bit element, each panel
/// `ElemType::b_panel_len` long and zero past `n` and `k`: whatever B's strides
/// (row-major, transposed, a strided view), at odd widths and depths.
#[test]
fn i16s8_weights_pack_as_byte_pairs() {
    let elem = ElemType::I16S8;
    for (k, n, nr, kc) in [(1usize, 1usize, 8usize, 8usize), (7, 5, 5, 3), (33, 70, 16, 8), (64, 24, 24, 17)]
    {
        let value = |p: usize, j: usize| ((p * 31 + j * 17) % 256) as f32 - 128.0;
        let rows: Vec<f32> = (0..k * n).map(|i| value(i / n, i % n)).collect();
        let cols: Vec<f32> = (0..k * n).map(|i| value(i % k, i / k)).collect();
        let wide: Vec<f32> = (0..k * 2 * n).map(|i| value(i / (2 * n), (i % (2 * n)) / 2)).collect();
        let forms = [
            ("row-major", MatRef::row_major(&rows, k, n).unwrap()),
            ("transposed", MatRef::row_major(&cols, n, k).unwrap().t()),
            ("strided", MatRef::new(&wide, k, n, 2 * n, 2).unwrap()),
        ];
        for (what, b) in forms {
            let p = anyshape_kernels::PackedB::of_elem(b, nr, kc, elem);
            assert_eq!(Some(p.words().len()), anyshape_kernels::PackedB::len_of(k, n, nr, kc, elem));
            let halves: Vec<u16> = p.words().iter().flat_map(|w| [*w as u16, (*w >> 16) as u16]).collect();
            let mut at = 0;
            for pc in (0..k).step_by(kc) {
                let depth = kc.min(k - pc);
                let len = elem.b_panel_len(depth, nr) * 2;
                for panel in 0..n.div_ceil(nr) {
                    for w in 0..depth.div_ceil(2) {
                        for j in 0..nr {
                            let (col, p0) = (panel * nr + j, pc + 2 * w);
                            let byte = |p: usize| {
                                if col < n && p < pc + depth {
                                    value(p, col) as i8 as u8 as u16
                                } else {
                                    0
                                }
                            };
                            let want = byte(p0) | byte(p0 + 1) << 8;
                            assert_eq!(
                                halves[at + w * nr + j],
                                want,
                                "{what} {k}x{n} nr {nr} kc {kc}: word {w} col {col}"
                            );
                        }
                    }
                    assert!(halves[at + depth.div_ceil(2) * nr..at + len].iter().all(|h| *h == 0));
                    at += len;
                }
            }
            assert_eq!(at, halves.len());
        }
    }
}
