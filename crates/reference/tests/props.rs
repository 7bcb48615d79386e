//! Property tests: the interpreter against independently written naive loops, on
//! random shapes (including empty dims) and geometries.

mod common;

use common::*;
use ir::{ConvAttrs, DType, Op, TensorType};
use proptest::prelude::*;

/// Deterministic small integers in -4..=4 (exact in every float type).
fn vals(seed: u64, n: usize) -> Vec<f64> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) % 9) as f64 - 4.0
        })
        .collect()
}

fn conv_attrs(s: [i64; 2], d: [i64; 2], pb: [i64; 2], pe: [i64; 2], group: i64) -> ConvAttrs {
    ConvAttrs {
        strides: s.to_vec(),
        dilations: d.to_vec(),
        pads_begin: pb.to_vec(),
        pads_end: pe.to_vec(),
        group,
    }
}

proptest! {
    #[test]
    fn matmul_matches_a_triple_loop(
        batch in prop::collection::vec(0usize..3, 0..3),
        (m, k, n) in (0usize..5, 0usize..5, 0usize..5),
        seed in any::<u64>(),
    ) {
        let nb: usize = batch.iter().product();
        let (sa, sb) = ([&batch[..], &[m, k]].concat(), [&batch[..], &[k, n]].concat());
        let (a, b) = (vals(seed, nb * m * k), vals(seed ^ 0xabc, nb * k * n));
        let mut want = vec![0.0; nb * m * n];
        for t in 0..nb {
            for i in 0..m {
                for j in 0..n {
                    for p in 0..k {
                        want[(t * m + i) * n + j] += a[t * m * k + i * k + p] * b[t * k * n + p * n + j];
                    }
                }
            }
        }
        let got = eval(Op::MATMUL, &[f64t(&sa, &a), f64t(&sb, &b)]);
        prop_assert_eq!(got.shape(), &[&batch[..], &[m, n]].concat()[..]);
        prop_assert_eq!(got.to_f64_vec(), want.clone());
        // The same in i64 and f32.
        let ints = |v: &[f64]| v.iter().map(|x| *x as i64).collect::<Vec<_>>();
        let got = eval(Op::MATMUL, &[i64t(&sa, &ints(&a)), i64t(&sb, &ints(&b))]);
        prop_assert_eq!(got.to_f64_vec(), want.clone());
        let f32s = |v: &[f64]| v.iter().map(|x| *x as f32).collect::<Vec<_>>();
        let got = eval(Op::MATMUL, &[f32t(&sa, &f32s(&a)), f32t(&sb, &f32s(&b))]);
        prop_assert_eq!(got.to_f64_vec(), want);
    }

    #[test]
    fn transpose_then_inverse_is_identity(
        shape in prop::collection::vec(0usize..4, 0..5),
        perm_seed in any::<u64>(),
        seed in any::<u64>(),
    ) {
        // A random permutation by Fisher-Yates over the seed's digits.
        let r = shape.len();
        let mut perm: Vec<usize> = (0..r).collect();
        let mut s = perm_seed;
        for i in (1..r).rev() {
            perm.swap(i, (s % (i as u64 + 1)) as usize);
            s /= i as u64 + 1;
        }
        let mut inv = vec![0; r];
        for (i, p) in perm.iter().enumerate() {
            inv[*p] = i;
        }
        let n: usize = shape.iter().product();
        let x = i64t(&shape, &vals(seed, n).iter().map(|v| *v as i64).collect::<Vec<_>>());
        let t = eval(Op::Transpose { perm: perm.clone() }, &[&x]);
        let want: Vec<usize> = perm.iter().map(|p| shape[*p]).collect();
        prop_assert_eq!(t.shape(), &want[..]);
        prop_assert_eq!(eval(Op::Transpose { perm: inv }, &[t]), x);
    }

    /// Strided, dilated, padded, grouped 2-D convolution against a loop over an
    /// explicitly zero-padded copy of the input. The output type comes from
    /// `ir::infer`, so this also cross-checks its shape formula.
    #[test]
    fn conv2d_matches_padded_loop(
        (n, g, cg, mg) in (1usize..3, 1usize..3, 1usize..3, 1usize..3),
        (h, w) in (1usize..7, 1usize..7),
        (kh, kw) in (1usize..4, 1usize..4),
        s in [1usize..4, 1usize..4],
        d in [1usize..3, 1usize..3],
        pb in [0usize..3, 0usize..3],
        pe in [0usize..3, 0usize..3],
        seed in any::<u64>(),
    ) {
        let (hp, wp) = (h + pb[0] + pe[0], w + pb[1] + pe[1]);
        prop_assume!(hp > d[0] * (kh - 1) && wp > d[1] * (kw - 1));
        let (c, m) = (g * cg, g * mg);
        let x = vals(seed, n * c * h * w);
        let wt = vals(seed ^ 77, m * cg * kh * kw);
        let mut xp = vec![0.0; n * c * hp * wp];
        for i in 0..n * c {
            for y in 0..h {
                for xx in 0..w {
                    xp[(i * hp + y + pb[0]) * wp + xx + pb[1]] = x[(i * h + y) * w + xx];
                }
            }
        }
        let (oh, ow) = ((hp - d[0] * (kh - 1) - 1) / s[0] + 1, (wp - d[1] * (kw - 1) - 1) / s[1] + 1);
        let mut want = Vec::new();
        for ni in 0..n {
            for mi in 0..m {
                let gi = mi / mg;
                for oy in 0..oh {
                    for ox in 0..ow {
                        let mut acc = 0.0;
                        for ci in 0..cg {
                            for ky in 0..kh {
                                for kx in 0..kw {
                                    let (y, xx) = (oy * s[0] + ky * d[0], ox * s[1] + kx * d[1]);
                                    acc += xp[((ni * c + gi * cg + ci) * hp + y) * wp + xx]
                                        * wt[((mi * cg + ci) * kh + ky) * kw + kx];
                                }
                            }
                        }
                        want.push(acc);
                    }
                }
            }
        }
        let i = |v: [usize; 2]| v.map(|e| e as i64);
        let op = Op::Conv(conv_attrs(i(s), i(d), i(pb), i(pe), g as i64));
        let got = eval(op, &[f64t(&[n, c, h, w], &x), f64t(&[m, cg, kh, kw], &wt)]);
        prop_assert_eq!(got.shape(), &[n, m, oh, ow][..]);
        prop_assert_eq!(got.to_f64_vec(), want);
    }

    /// ConvTranspose against its definition read backwards: each output sums the
    /// inputs `i` and taps `k` with `i·s + k·d − pb = o`.
    #[test]
    fn conv_transpose2d_matches_definition(
        (n, g, cg, mg) in (1usize..3, 1usize..3, 1usize..3, 1usize..3),
        (h, w) in (1usize..5, 1usize..5),
        (kh, kw) in (1usize..4, 1usize..4),
        s in [1usize..4, 1usize..4],
        d in [1usize..3, 1usize..3],
        pb in [0usize..3, 0usize..3],
        pe in [0usize..3, 0usize..3],
        extra in [0usize..2, 0usize..2],
        seed in any::<u64>(),
    ) {
        let full = |i: usize, k: usize, j: usize| (i - 1) * s[j] + d[j] * (k - 1) + 1 + extra[j];
        let (fh, fw) = (full(h, kh, 0), full(w, kw, 1));
        prop_assume!(fh > pb[0] + pe[0] && fw > pb[1] + pe[1]);
        let (oh, ow) = (fh - pb[0] - pe[0], fw - pb[1] - pe[1]);
        let (c, m) = (g * cg, g * mg);
        let x = vals(seed, n * c * h * w);
        let wt = vals(seed ^ 99, c * mg * kh * kw);
        // Input index along one dim feeding output `o` through tap `k`, if any.
        let src = |o: usize, k: usize, j: usize, extent: usize| {
            let num = o as i64 + pb[j] as i64 - (k * d[j]) as i64;
            (num >= 0 && num % s[j] as i64 == 0 && ((num / s[j] as i64) as usize) < extent)
                .then(|| (num / s[j] as i64) as usize)
        };
        let mut want = Vec::new();
        for ni in 0..n {
            for mo in 0..m {
                let (gi, mi) = (mo / mg, mo % mg);
                for oy in 0..oh {
                    for ox in 0..ow {
                        let mut acc = 0.0;
                        for ci in gi * cg..(gi + 1) * cg {
                            for ky in 0..kh {
                                for kx in 0..kw {
                                    if let (Some(iy), Some(ix)) = (src(oy, ky, 0, h), src(ox, kx, 1, w)) {
                                        acc += x[((ni * c + ci) * h + iy) * w + ix]
                                            * wt[((ci * mg + mi) * kh + ky) * kw + kx];
                                    }
                                }
                            }
                        }
                        want.push(acc);
                    }
                }
            }
        }
        let i = |v: [usize; 2]| v.map(|e| e as i64);
        let op = Op::ConvTranspose(conv_attrs(i(s), i(d), i(pb), i(pe), g as i64));
        let out = TensorType::fixed(DType::F64, &[n as i64, m as i64, oh as i64, ow as i64]);
        let got = try_eval(op, &[f64t(&[n, c, h, w], &x), f64t(&[c, mg, kh, kw], &wt)], Some(out)).unwrap();
        prop_assert_eq!(got.to_f64_vec(), want);
    }
}
