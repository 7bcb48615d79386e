//! A compiled contraction (generated kernel family + dispatcher) against a plain
//! reference, on both ISA paths, at random shapes, with every cost model's choice
//! and with a pre-packed weight and an epilogue.

mod programs;

use anyshape_codegen::Contraction;
use kernels::{BOperand, CostModel, EpilogueArgs, MatMut, MatRef, Target, ThreadPool};
use plan::{Activation, Epilogue};

fn targets() -> Vec<Target> {
    let host = Target::detect();
    if !kernels::testing::require("ANYSHAPE_REQUIRE_AVX2", host.supported(), "AVX2 + FMA") {
        return Vec::new();
    }
    let mut v = vec![host.clone()];
    if host.isa.avx512f {
        v.extend(host.avx2_only());
    }
    v
}

fn gelu(x: f64) -> f64 {
    // erf by its series, to 1e-12 on the range used here; past 5 it is ±1 to
    // within 2e-12 (where the series would lose its digits to cancellation)
    let erf = |z: f64| {
        if z.abs() > 5.0 {
            return z.signum();
        }
        let (mut term, mut sum, mut n) = (z, z, 0.0);
        while term.abs() > 1e-15 {
            n += 1.0;
            term *= -z * z / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    };
    0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2))
}

#[test]
fn compiled_contractions_match_the_reference() {
    let dir = std::env::temp_dir().join(format!("anyshape-contraction-{}", std::process::id()));
    let pool = ThreadPool::new(2);
    let shapes =
        [(1, 1, 1), (1, 97, 33), (7, 50, 64), (13, 129, 17), (17, 31, 300), (64, 48, 64), (33, 65, 31)];
    for t in targets() {
        for model in CostModel::ALL {
            let plain =
                Contraction::compile(&t, &pool, Epilogue::default(), model, Some(&dir)).expect("compile");
            let ep = Epilogue { bias: true, activation: Activation::Gelu, ..Default::default() };
            let fused = Contraction::compile(&t, &pool, ep, model, Some(&dir)).expect("compile");
            for &(m, n, k) in &shapes {
                let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0).collect();
                let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 6.0).collect();
                let bias: Vec<f32> = (0..n).map(|j| (j % 7) as f32 * 0.1 - 0.3).collect();
                let am = MatRef::row_major(&a, m, k).unwrap();
                let bm = MatRef::row_major(&b, k, n).unwrap();
                let want = |i: usize, j: usize| {
                    (0..k).map(|p| a[i * k + p] as f64 * b[p * n + j] as f64).sum::<f64>()
                };
                // An activation B, and a batch of two equal entries of it.
                let mut c = vec![0.0f32; 2 * m * n];
                let (c0, c1) = c.split_at_mut(m * n);
                let mut cv = [MatMut::new(c0, m, n, n).unwrap(), MatMut::new(c1, m, n, n).unwrap()];
                let s = plain
                    .batched(
                        &pool,
                        &[am, am],
                        &[BOperand::Plain(bm), BOperand::Plain(bm)],
                        &mut cv,
                        &EpilogueArgs::default(),
                    )
                    .expect("run");
                for i in 0..m {
                    for j in 0..n {
                        for e in 0..2 {
                            let got = c[e * m * n + i * n + j] as f64;
                            assert!(
                                (got - want(i, j)).abs() < 1e-3 * (1.0 + want(i, j).abs()),
                                "{model:?} {s} {m}x{n}x{k} [{i},{j}]"
                            );
                        }
                    }
                }
                // B stored transposed (attention's Kᵀ): packed by the generated routine.
                let bt: Vec<f32> = (0..n * k).map(|x| b[(x % k) * n + x / k]).collect();
                let btm = MatRef::row_major(&bt, n, k).unwrap().t();
                let mut c = vec![0.0f32; m * n];
                let s = plain
                    .matmul(
                        &pool,
                        am,
                        BOperand::Plain(btm),
                        MatMut::new(&mut c, m, n, n).unwrap(),
                        &EpilogueArgs::default(),
                    )
                    .expect("run");
                for i in 0..m {
                    for j in 0..n {
                        let got = c[i * n + j] as f64;
                        assert!(
                            (got - want(i, j)).abs() < 1e-3 * (1.0 + want(i, j).abs()),
                            "{model:?} Bt {s} {m}x{n}x{k} [{i},{j}]"
                        );
                    }
                }
                // A pre-packed weight with bias and GELU applied in the kernels.
                let packed = fused.pack_weight(bm, &[1, 16, 128]).expect("pack");
                let mut c = vec![0.0f32; m * n];
                let args = EpilogueArgs { bias: Some(&bias), ..EpilogueArgs::default() };
                let s = fused
                    .matmul(
                        &pool,
                        am,
                        BOperand::Packed(&packed),
                        MatMut::new(&mut c, m, n, n).unwrap(),
                        &args,
                    )
                    .expect("run");
                for i in 0..m {
                    for j in 0..n {
                        let w = gelu(want(i, j) + bias[j] as f64);
                        assert!(
                            (c[i * n + j] as f64 - w).abs() < 1e-3 * (1.0 + w.abs()),
                            "{model:?} {s} {m}x{n}x{k} [{i},{j}]"
                        );
                    }
                }
            }
            assert!(plain.memoized() == 2 * shapes.len() && fused.memoized() == shapes.len());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every element of C (`m × n`) within `tol(i, j)` of `want(i, j)`.
fn all_close(
    c: &[f32],
    (m, n, k): (usize, usize, usize),
    what: &str,
    want: impl Fn(usize, usize) -> f64,
    tol: impl Fn(usize, usize) -> f64,
) -> Result<(), proptest::test_runner::TestCaseError> {
    for i in 0..m {
        for j in 0..n {
            let (got, w) = (c[i * n + j] as f64, want(i, j));
            proptest::prop_assert!(
                (got - w).abs() <= tol(i, j),
                "{} {}x{}x{} [{},{}]: {} vs {}",
                what,
                m,
                n,
                k,
                i,
                j,
                got,
                w
            );
        }
    }
    Ok(())
}

/// Awkward extents: 1, primes, odd depths, one past a block of `kc`.
fn awkward_shapes(kc: usize) -> [(usize, usize, usize); 7] {
    [(1, 1, 1), (1, 97, 33), (7, 50, 3), (13, 129, 17), (17, 31, 301), (3, 17, kc + 1), (33, 65, 2 * kc - 1)]
}

/// `plain`'s product of `a` (`m × k`) and `b` (`k × n`) with B an activation
/// (row-major, then transposed), A transposed, and as a batch of two equal
/// entries: `check` judges each result (its form, the schedule that ran, C).
#[allow(clippy::too_many_arguments)]
fn every_operand_form(
    plain: &Contraction,
    pool: &ThreadPool,
    a: &[f32],
    b: &[f32],
    (m, n, k): (usize, usize, usize),
    mut check: impl FnMut(&str, &kernels::Schedule, &[f32]) -> Result<(), proptest::test_runner::TestCaseError>,
) -> Result<(), proptest::test_runner::TestCaseError> {
    let am = MatRef::row_major(a, m, k).unwrap();
    let at: Vec<f32> = (0..m * k).map(|x| a[(x % m) * k + x / m]).collect();
    let atm = MatRef::row_major(&at, k, m).unwrap().t();
    let bm = MatRef::row_major(b, k, n).unwrap();
    let bt: Vec<f32> = (0..n * k).map(|x| b[(x % k) * n + x / k]).collect();
    let btm = MatRef::row_major(&bt, n, k).unwrap().t();
    for (what, av, bv) in [("A·B", am, bm), ("A·Bt", am, btm), ("At·B", atm, bm)] {
        let mut c = vec![f32::NAN; m * n];
        let cv = MatMut::new(&mut c, m, n, n).unwrap();
        let s = plain.matmul(pool, av, BOperand::Plain(bv), cv, &EpilogueArgs::default()).expect("run");
        check(what, &s, &c)?;
    }
    let mut c = vec![f32::NAN; 2 * m * n];
    let (c0, c1) = c.split_at_mut(m * n);
    let mut cv = [MatMut::new(c0, m, n, n).unwrap(), MatMut::new(c1, m, n, n).unwrap()];
    let args = EpilogueArgs::default();
    let s = plain
        .batched(pool, &[am, am], &[BOperand::Plain(btm), BOperand::Plain(btm)], &mut cv, &args)
        .expect("run");
    check("batch 0", &s, &c[..m * n])?;
    check("batch 1", &s, &c[m * n..])
}

/// The bf16 family (AVX-512 BF16) against the product of the operands rounded to
/// bf16, accumulated in f64: random shapes with 1, primes, odd depths (a zero
/// padded into the last pair), depths past a block, activation and transposed B,
/// transposed A, a batch, and a pre-packed weight with bias, residual and GELU in
/// the kernels. The results must also differ from the f32 product where bf16
/// rounding shows: a family that multiplied in f32 would fail.
#[test]
fn bf16_contractions_match_the_rounded_reference() {
    if kernels::testing::bf16() {
        bf16_contractions(None);
    }
}

/// The bf16 family's AMX kernels alone (`tdpbf16ps`; the tiles of 16 and 32
/// rows and columns, and 16×64), as [`bf16_contractions_match_the_rounded_reference`].
#[test]
fn amx_bf16_contractions_match_the_rounded_reference() {
    if !kernels::testing::amx() {
        return;
    }
    bf16_contractions(Some(&amx_kernels()));
}

fn bf16_contractions(keep: Option<&[tune::categorize::KernelId]>) {
    use kernels::ElemType;
    use proptest::prelude::*;
    let t = Target::detect();
    let dir = std::env::temp_dir().join(format!("anyshape-bf16-{}-{}", keep.is_some(), std::process::id()));
    let pool = ThreadPool::new(2);
    let build = |ep: Epilogue| {
        Contraction::builder(&t, &pool).elem(ElemType::Bf16).epilogue(ep).cache(Some(&dir)).keep(keep).build()
    };
    let plain = build(Epilogue::default()).expect("compile");
    let ep = Epilogue { bias: true, residual: true, activation: Activation::Gelu, ..Default::default() };
    let fused = build(ep).expect("compile");
    assert_eq!(plain.family().elem(), ElemType::Bf16);
    if keep.is_some() {
        for k in plain.kernels() {
            assert!(k.kernel().amx && k.asm().contains("tdpbf16ps"), "{}x{}", k.kernel().mr, k.kernel().nr);
        }
    }
    // Direct kernels (f32, for small activation products) are part of the family.
    assert!(keep.is_some() || !plain.family().direct_variants().is_empty());
    let kc = plain.dispatcher().schedule(&kernels::Problem {
        batch: 1,
        m: 64,
        n: 64,
        k: 4096,
        a: kernels::ALayout::RowMajor,
        b: kernels::BLayout::NMajor,
    });
    let kc = kc.expect("schedule").blocking.kc;
    let r = |x: f32| ElemType::Bf16.round(x) as f64;
    let differs = std::cell::Cell::new(false);
    let case = |m: usize, n: usize, k: usize, seed: usize| -> Result<(), TestCaseError> {
        // Sums of order 1 whatever K (the reference GELU's series holds for |x| < 5).
        let norm = 1.0 / (977.0 * (k as f32).sqrt());
        let val = |i: usize, s: usize| (((i * 7919 + s * 104_729) % 2003) as f32 - 1001.0) * norm;
        let a: Vec<f32> = (0..m * k).map(|i| val(i, seed)).collect();
        let b: Vec<f32> = (0..k * n).map(|i| val(i, seed + 1)).collect();
        let bias: Vec<f32> = (0..n).map(|j| (j % 7) as f32 * 0.1 - 0.3).collect();
        let res: Vec<f32> = (0..m * n).map(|i| (i % 5) as f32 * 0.2 - 0.4).collect();
        let want = |i: usize, j: usize| (0..k).map(|p| r(a[i * k + p]) * r(b[p * n + j])).sum::<f64>();
        let exact =
            |i: usize, j: usize| (0..k).map(|p| a[i * k + p] as f64 * b[p * n + j] as f64).sum::<f64>();
        let scale =
            |i: usize, j: usize| (0..k).map(|p| (a[i * k + p] * b[p * n + j]).abs() as f64).sum::<f64>();
        let tol = |i: usize, j: usize| 1e-5 * (1.0 + scale(i, j));
        // Packed schedules multiply in bf16; direct ones (f32 kernels, small
        // activation products) in f32.
        let reference = |s: &kernels::Schedule, i: usize, j: usize| match s.operands {
            kernels::Operands::Direct => exact(i, j),
            kernels::Operands::Packed => want(i, j),
        };
        every_operand_form(&plain, &pool, &a, &b, (m, n, k), |what, s, c| {
            for i in 0..m {
                for j in 0..n {
                    differs.set(differs.get() || (c[i * n + j] as f64 - exact(i, j)).abs() > tol(i, j));
                }
            }
            all_close(c, (m, n, k), &format!("{what} {s}"), |i, j| reference(s, i, j), tol)
        })?;
        let (am, bm) = (MatRef::row_major(&a, m, k).unwrap(), MatRef::row_major(&b, k, n).unwrap());
        // A weight pre-packed as bf16, with the epilogue fused.
        let packed = fused.pack_weight(bm, &[1, 16, 128]).expect("pack");
        prop_assert_eq!(packed.elem, ElemType::Bf16);
        let direct_weight = fused.candidates(&kernels::Problem {
            batch: 1,
            m,
            n,
            k,
            a: kernels::ALayout::RowMajor,
            b: kernels::BLayout::Packed { nr: packed.nr, kc: packed.kc },
        });
        prop_assert!(direct_weight.iter().all(|s| s.operands == kernels::Operands::Packed));
        let mut c = vec![f32::NAN; m * n];
        let args = EpilogueArgs {
            bias: Some(&bias),
            residual: Some(MatRef::row_major(&res, m, n).unwrap()),
            ..EpilogueArgs::default()
        };
        let cv = MatMut::new(&mut c, m, n, n).unwrap();
        let s = fused.matmul(&pool, am, BOperand::Packed(&packed), cv, &args).expect("run");
        let w = |i: usize, j: usize| gelu(want(i, j) + bias[j] as f64 + res[i * n + j] as f64);
        all_close(&c, (m, n, k), &format!("fused {s}"), w, |i, j| 2.0 * tol(i, j))?;
        Ok(())
    };
    for (m, n, k) in awkward_shapes(kc) {
        case(m, n, k, 0).unwrap_or_else(|e| panic!("{e}"));
    }
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(24));
    runner
        .run(&(1usize..70, 1usize..140, 1usize..(2 * kc + 3), 0usize..1000), |(m, n, k, seed)| {
            case(m, n, k, seed)
        })
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(differs.get(), "every result equals the f32 product: the kernels did not multiply in bf16");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The u8s8 family (VNNI) on operands that hold 8-bit integers (A 0..=255, B
/// -128..=127, a quantized model's): see [`integer_contractions_are_exact`]. The
/// kernels must be VNNI's: their code holds `vpdpbusd`.
#[test]
fn u8s8_contractions_are_exact_on_8_bit_integers() {
    if !kernels::testing::vnni() {
        return;
    }
    integer_contractions_are_exact(kernels::ElemType::U8S8, "vpdpbusd", None);
}

/// The u8s8 family's AMX kernels alone (the tiles of 16 and 32 rows and
/// columns, and 16×64), on the same operands and shapes: their tile loops take K's whole
/// 64-byte steps, the vector loop the rest (odd depths, one past a step), and
/// rows past a tile are padded in their A panels. Their code must hold `tdpbusd`.
#[test]
fn amx_u8s8_contractions_are_exact_on_8_bit_integers() {
    if !kernels::testing::amx() {
        return;
    }
    integer_contractions_are_exact(kernels::ElemType::U8S8, "tdpbusd", Some(&amx_kernels()));
}

/// The 16×64 AMX tile alone (four sums, each column's B tile loaded just
/// before its products; a row's 64 codes one cache line), in both AMX
/// families, as the two tests above: whichever widths the dispatcher would
/// pick, every product runs on it.
#[test]
fn amx_16x64_tile_alone_is_exact() {
    if !kernels::testing::amx() {
        return;
    }
    let only = [tune::categorize::KernelId { direct: false, mr: 16, nr: 64 }];
    integer_contractions_are_exact(kernels::ElemType::U8S8, "tdpbusd", Some(&only));
    bf16_contractions(Some(&only));
}

/// The kernels of the AMX tiles, for a family of them alone.
fn amx_kernels() -> Vec<tune::categorize::KernelId> {
    kernels::AMX_TILES.iter().map(|&(mr, nr)| tune::categorize::KernelId { direct: false, mr, nr }).collect()
}

/// The i16 family (AVX2's `vpmaddwd`, what a machine without VNNI runs a
/// quantized model's products on) on the same 8-bit operands.
#[test]
fn i16_contractions_are_exact_on_8_bit_integers() {
    integer_contractions_are_exact(kernels::ElemType::I16, "vpmaddwd", None);
}

/// The i16s8 family (B's bytes widened by `vpmovsxbw` as they load, then
/// `vpmaddwd`) on the same 8-bit operands: B's panels, packed weights and
/// activations alike, are byte pairs.
#[test]
fn i16s8_contractions_are_exact_on_8_bit_integers() {
    integer_contractions_are_exact(kernels::ElemType::I16S8, "vpmovsxbw", None);
}

/// A family of integer type `elem` on operands that hold 8-bit integers: exact
/// against the integer product wherever the sums stay below 2^24 (within two f32
/// roundings of it otherwise: blocks of K meet in f32), on both ISA paths the
/// machine has, at shapes with 1, primes, odd depths (zero padded into the last
/// word), one past a block, B as an activation (row-major, transposed),
/// transposed A, A as 8-bit codes in memory (aligned rows, odd rows, an odd
/// offset, transposed), a batch, and a weight pre-packed in the type with bias,
/// residual and GELU fused. The kernels' code must hold `instruction`; `keep`
/// restricts the family to those kernels.
fn integer_contractions_are_exact(
    elem: kernels::ElemType,
    instruction: &str,
    keep: Option<&[tune::categorize::KernelId]>,
) {
    use proptest::prelude::*;
    let dir = std::env::temp_dir().join(format!("anyshape-{elem}-{}", std::process::id()));
    let pool = ThreadPool::new(2);
    // AMX kernels exist on the host target only.
    let amx = keep.is_some_and(|k| k.iter().any(|k| k.mr >= kernels::AMX_ROWS));
    for t in targets().into_iter().filter(|t| t.check_elem(elem).is_ok() && (!amx || t.isa.amx_int8)) {
        let build = |ep: Epilogue| {
            Contraction::builder(&t, &pool).elem(elem).epilogue(ep).cache(Some(&dir)).keep(keep).build()
        };
        let plain = build(Epilogue::default()).expect("compile");
        // Scaled down: the reference GELU's series holds for moderate arguments.
        let scale = 2f32.powi(-20);
        let ep = Epilogue {
            scale: Some(scale),
            bias: true,
            residual: true,
            activation: Activation::Gelu,
            ..Default::default()
        };
        let fused = build(ep).expect("compile");
        // A static quantization's store: the product scaled, divided by the
        // output's scale, rounded, its zero point added, clamped to u8; the
        // two scales given when it runs.
        let (requantize, params) = requantizing_program();
        let requantized =
            build(Epilogue { activation: Activation::Pointwise(requantize), ..Default::default() })
                .expect("compile");
        // The same, its C stored as 8-bit codes.
        let to_codes = build(Epilogue {
            activation: Activation::Pointwise(requantize),
            codes: true,
            ..Default::default()
        })
        .expect("compile");
        // A quantized residual block's sum stored as codes: the program reads
        // the shortcut's codes as its residual.
        let (block_sum, block_params) = programs::residual_block();
        let block = build(Epilogue {
            residual: true,
            residual_codes: true,
            activation: Activation::Pointwise(block_sum),
            codes: true,
            ..Default::default()
        })
        .expect("compile");
        assert_eq!(plain.family().elem(), elem);
        for k in plain.kernels() {
            let asm = k.asm();
            assert!(asm.contains(instruction), "no {instruction} in the {elem} kernel:\n{asm}");
            assert!(k.kernel().amx || !amx, "{}x{} is no AMX kernel", k.kernel().mr, k.kernel().nr);
        }
        let kc = plain
            .dispatcher()
            .schedule(&kernels::Problem {
                batch: 1,
                m: 64,
                n: 64,
                k: 4096,
                a: kernels::ALayout::RowMajor,
                b: kernels::BLayout::NMajor,
            })
            .expect("schedule")
            .blocking
            .kc;
        let case = |m: usize, n: usize, k: usize, seed: usize| -> Result<(), TestCaseError> {
            let val = |i: usize, s: usize| (i * 7919 + s * 104_729) % 1_000_003;
            let a: Vec<f32> = (0..m * k).map(|i| (val(i, seed) % 256) as f32).collect();
            let b: Vec<f32> = (0..k * n).map(|i| (val(i, seed + 1) % 256) as f32 - 128.0).collect();
            let bias: Vec<f32> = (0..n).map(|j| (j % 7) as f32 * 0.1 - 0.3).collect();
            let res: Vec<f32> = (0..m * n).map(|i| (i % 5) as f32 * 0.2 - 0.4).collect();
            let exact = |i: usize, j: usize| {
                (0..k).map(|p| a[i * k + p] as i64 * b[p * n + j] as i64).sum::<i64>() as f64
            };
            let tol = |i: usize, j: usize| {
                let size = (0..k).map(|p| (a[i * k + p] * b[p * n + j]).abs() as f64).sum::<f64>();
                if size < (1u64 << 24) as f64 {
                    0.0
                } else {
                    size * 2f64.powi(-23)
                }
            };
            every_operand_form(&plain, &pool, &a, &b, (m, n, k), |what, s, c| {
                all_close(c, (m, n, k), &format!("{what} {s}"), exact, tol)
            })?;
            let (am, bm) = (MatRef::row_major(&a, m, k).unwrap(), MatRef::row_major(&b, k, n).unwrap());
            // A as 8-bit codes in memory (a quantized model's stored activations):
            // rows a multiple of 4 bytes apart (u8s8 copies their words), one
            // byte past that (byte by byte), a view at an odd offset, transposed.
            for (what, pad, offset, transposed) in
                [("codes", 0, 0, false), ("codes rs+4", 4, 0, false), ("codes rs+1", 1, 0, false)]
                    .into_iter()
                    .chain([("codes at 3", 0, 3, false), ("codes transposed", 0, 0, true)])
            {
                let (rows, cols) = if transposed { (k, m) } else { (m, k) };
                let rs = cols + pad;
                let mut bytes = vec![0xa5u8; offset + rows * rs];
                for i in 0..m {
                    for p in 0..k {
                        let (r, c) = if transposed { (p, i) } else { (i, p) };
                        bytes[offset + r * rs + c] = a[i * k + p] as u8;
                    }
                }
                let codes = MatRef::of_codes(&bytes[offset..], rows, cols, rs, 1).unwrap();
                let codes = if transposed { codes.t() } else { codes };
                let mut c = vec![f32::NAN; m * n];
                let cv = MatMut::new(&mut c, m, n, n).unwrap();
                let s = plain
                    .matmul(&pool, codes, BOperand::Plain(bm), cv, &EpilogueArgs::default())
                    .expect("run");
                all_close(&c, (m, n, k), &format!("{what} {s}"), exact, tol)?;
            }
            // A weight pre-packed as bytes, with the epilogue fused.
            let packed = fused.pack_weight(bm, &[1, 16, 128]).expect("pack");
            prop_assert_eq!(packed.elem, elem);
            let mut c = vec![f32::NAN; m * n];
            let args = EpilogueArgs {
                bias: Some(&bias),
                residual: Some(MatRef::row_major(&res, m, n).unwrap()),
                ..EpilogueArgs::default()
            };
            let cv = MatMut::new(&mut c, m, n, n).unwrap();
            let s = fused.matmul(&pool, am, BOperand::Packed(&packed), cv, &args).expect("run");
            let w = |i: usize, j: usize| {
                gelu(scale as f64 * exact(i, j) + bias[j] as f64 + res[i * n + j] as f64)
            };
            let t = |i: usize, j: usize| 1e-5 * (1.0 + w(i, j).abs()) + scale as f64 * tol(i, j);
            all_close(&c, (m, n, k), &format!("fused {s}"), w, t)?;
            // Exactly the program's value where the product is exact in f32
            // (anything in 0..=255 past that).
            let packed = requantized.pack_weight(bm, &[1, 16, 128]).expect("pack");
            let args = EpilogueArgs { params: &params, ..EpilogueArgs::default() };
            let cv = MatMut::new(&mut c, m, n, n).unwrap();
            let s = requantized.matmul(&pool, am, BOperand::Packed(&packed), cv, &args).expect("run");
            let w = |i: usize, j: usize| requantize.eval_with(exact(i, j) as f32, &params) as f64;
            let t = |i: usize, j: usize| if tol(i, j) == 0.0 { 0.0 } else { 256.0 };
            all_close(&c, (m, n, k), &format!("requantized {s}"), w, t)?;
            // Stored as codes: a weight packed in one K block, A as floats and as
            // codes; every byte the program's value (the edge tiles' too, and
            // nothing written past C's columns: rows are `n + 3` bytes apart).
            let packed = to_codes.pack_weight(bm, &[1, 16, 128]).expect("pack");
            prop_assert_eq!(packed.kc, k.max(1));
            let bytes: Vec<u8> = a.iter().map(|v| *v as u8).collect();
            for (what, a_in) in [("floats", am), ("codes", MatRef::of_codes(&bytes, m, k, k, 1).unwrap())] {
                let mut out = vec![0xa5u8; m * (n + 3)];
                let cv = MatMut::of_codes(&mut out, m, n, n + 3).unwrap();
                let s = to_codes.matmul(&pool, a_in, BOperand::Packed(&packed), cv, &args).expect("run");
                let got: Vec<f32> = (0..m * n).map(|x| out[x / n * (n + 3) + x % n] as f32).collect();
                all_close(&got, (m, n, k), &format!("stored as codes, A {what}: {s}"), w, t)?;
                prop_assert!((0..m).all(|i| out[i * (n + 3) + n..(i + 1) * (n + 3)] == [0xa5; 3]));
            }
            // The residual block's sum: the shortcut's codes `n + 5` bytes a row
            // (no row on a word), read as they lie by every tile, edges too.
            let packed = block.pack_weight(bm, &[1, 16, 128]).expect("pack");
            let ldr = n + 5;
            let shortcut: Vec<u8> = (0..m * ldr).map(|x| (val(x, seed + 2) % 256) as u8).collect();
            let args = EpilogueArgs {
                residual: Some(MatRef::of_codes(&shortcut, m, n, ldr, 1).unwrap()),
                params: &block_params,
                ..EpilogueArgs::default()
            };
            let w = |i: usize, j: usize| {
                block_sum.eval_at(exact(i, j) as f32, f32::from(shortcut[i * ldr + j]), &block_params) as f64
            };
            for (what, a_in) in [("floats", am), ("codes", MatRef::of_codes(&bytes, m, k, k, 1).unwrap())] {
                let mut out = vec![0xa5u8; m * (n + 3)];
                let cv = MatMut::of_codes(&mut out, m, n, n + 3).unwrap();
                let s = block.matmul(&pool, a_in, BOperand::Packed(&packed), cv, &args).expect("run");
                let got: Vec<f32> = (0..m * n).map(|x| out[x / n * (n + 3) + x % n] as f32).collect();
                all_close(&got, (m, n, k), &format!("residual block, A {what}: {s}"), w, t)?;
                prop_assert!((0..m).all(|i| out[i * (n + 3) + n..(i + 1) * (n + 3)] == [0xa5; 3]));
            }
            // A residual of floats for kernels that read codes is refused.
            let floats = vec![0.0f32; m * n];
            let wrong = EpilogueArgs { residual: Some(MatRef::row_major(&floats, m, n).unwrap()), ..args };
            let mut out = vec![0u8; m * n];
            let cv = MatMut::of_codes(&mut out, m, n, n).unwrap();
            let e =
                block.matmul(&pool, am, BOperand::Packed(&packed), cv, &wrong).expect_err("float residual");
            prop_assert!(e.to_string().contains("does not match"), "{}", e);
            Ok(())
        };
        // Codes keep no partial sums: a product deeper than its K block (an
        // activation B, packed in blocks of at most 1024) is an error, not a
        // wrong result.
        {
            let (m, n, k) = (9, 20, 2000);
            let (a, b) = (vec![1.0f32; m * k], vec![1.0f32; k * n]);
            let mut out = vec![0u8; m * n];
            let cv = MatMut::of_codes(&mut out, m, n, n).unwrap();
            let args = EpilogueArgs { params: &params, ..EpilogueArgs::default() };
            let am = MatRef::row_major(&a, m, k).unwrap();
            let e = to_codes
                .matmul(&pool, am, BOperand::Plain(MatRef::row_major(&b, k, n).unwrap()), cv, &args)
                .expect_err("a deep product storing codes is refused");
            assert!(e.to_string().contains("one K block"), "{e}");
            // And a float C for kernels that store codes, or codes for float kernels.
            let mut c = vec![0.0f32; m * n];
            let cv = MatMut::new(&mut c, m, n, n).unwrap();
            let packed = to_codes.pack_weight(MatRef::row_major(&b, k, n).unwrap(), &[16]).expect("pack");
            let e = to_codes.matmul(&pool, am, BOperand::Packed(&packed), cv, &args).expect_err("floats");
            assert!(e.to_string().contains("C is floats"), "{e}");
        }
        for (m, n, k) in awkward_shapes(kc).into_iter().chain([(5, 33, 4 * kc + 5)]) {
            case(m, n, k, 0).unwrap_or_else(|e| panic!("{e}"));
        }
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(24));
        runner
            .run(&(1usize..70, 1usize..140, 1usize..(2 * kc + 3), 0usize..1000), |(m, n, k, seed)| {
                case(m, n, k, seed)
            })
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `integer(round(x·p0 / p1), 3, 0..=255)` and values of its parameters that
/// put the products of 8-bit integers across the u8 range.
fn requantizing_program() -> (plan::Pointwise, [f32; 2]) {
    use plan::{PwBinary, PwOp, PwUnary};
    let mut p = plan::Pointwise::empty();
    let x = p.push(PwOp::Input).unwrap();
    let (p0, p1) = (p.push(PwOp::Param(0)).unwrap(), p.push(PwOp::Param(1)).unwrap());
    let scaled = p.push(PwOp::Binary(PwBinary::Mul, x, p0)).unwrap();
    let q = p.push(PwOp::Binary(PwBinary::Div, scaled, p1)).unwrap();
    let r = p.push(PwOp::Unary(PwUnary::Round, q)).unwrap();
    p.push(PwOp::Integer { x: r, offset: 3, lo: 0, hi: 255 }).unwrap();
    (p, [2f32.powi(-12), 0.37])
}

/// Weight-only quantized weights (4- and 8-bit codes, signed and unsigned,
/// with and without zero points, groups of 32 rows, of 7, and one per column)
/// multiplied by f32 activations through the f32 family, with bias and GELU
/// fused: against the product of the dequantized weight in f64, at shapes with
/// 1, primes, odd depths, one past a K block and groups that straddle blocks;
/// both drivers (direct, for a few rows, and packed panels) must take part.
#[test]
fn quantized_weights_match_their_dequantized_product() {
    use kernels::{Codes, Operands, QuantizedWeight};
    use proptest::prelude::*;
    let dir = std::env::temp_dir().join(format!("anyshape-quantized-{}", std::process::id()));
    let pool = ThreadPool::new(2);
    for t in targets() {
        let ep = Epilogue { bias: true, activation: Activation::Gelu, ..Default::default() };
        let fused = Contraction::builder(&t, &pool).epilogue(ep).cache(Some(&dir)).build().expect("compile");
        let seen = std::cell::RefCell::new(std::collections::HashSet::new());
        let kc = std::cell::Cell::new(0);
        let case = |m: usize, n: usize, k: usize, form: usize, seed: usize| -> Result<(), TestCaseError> {
            let (bits, signed, zero, group) =
                ([4, 8][form % 2], form / 2 % 2 == 1, form / 4 % 2 == 1, [32, 7, k][form / 8 % 3]);
            let val = |i: usize, s: usize| (i * 7919 + s * 104_729) % 1_000_003;
            let levels = 1usize << bits;
            let least = if signed { -(levels as i32 / 2) } else { 0 };
            let groups = k.div_ceil(group);
            let codes: Vec<i32> = (0..k * n).map(|i| (val(i, seed) % levels) as i32 + least).collect();
            let zps: Vec<i32> = (0..groups * n).map(|i| (val(i, seed + 2) % levels) as i32 + least).collect();
            // Weights within ±1/4.
            let unit = 1.0 / (64 * levels) as f32;
            let scales: Vec<f32> =
                (0..groups * n).map(|i| ((val(i, seed + 3) % 17) as f32 + 1.0) * unit).collect();
            let a: Vec<f32> = (0..m * k).map(|i| ((val(i, seed + 1) % 13) as f32 - 6.0) / 8.0).collect();
            let bias: Vec<f32> = (0..n).map(|j| (j % 7) as f32 * 0.1 - 0.3).collect();
            let ((ci, cu), (zi, zu)) = (i8s_u8s(&codes), i8s_u8s(&zps));
            fn pick<'a>(signed: bool, i: &'a [i8], u: &'a [u8]) -> Codes<'a> {
                if signed {
                    Codes::I8(i)
                } else {
                    Codes::U8(u)
                }
            }
            let w = QuantizedWeight {
                k,
                n,
                bits,
                codes: pick(signed, &ci, &cu),
                group,
                scales: &scales,
                zero_points: zero.then(|| pick(signed, &zi, &zu)),
            };
            let packed = fused.pack_quantized_weight(&w, &[1, 16, 128]).expect("pack");
            kc.set(packed.kc);
            let weight = |p: usize, j: usize| {
                let g = (p / group) * n + j;
                (codes[p * n + j] - if zero { zps[g] } else { 0 }) as f64 * scales[g] as f64
            };
            let want = |i: usize, j: usize| {
                gelu((0..k).map(|p| a[i * k + p] as f64 * weight(p, j)).sum::<f64>() + bias[j] as f64)
            };
            let mut c = vec![f32::NAN; m * n];
            let args = EpilogueArgs { bias: Some(&bias), ..EpilogueArgs::default() };
            let cv = MatMut::new(&mut c, m, n, n).unwrap();
            let am = MatRef::row_major(&a, m, k).unwrap();
            let s = fused.matmul(&pool, am, BOperand::Packed(&packed), cv, &args).expect("run");
            seen.borrow_mut().insert(s.operands == Operands::Direct);
            let what = format!("{bits}-bit signed {signed} zero points {zero} groups of {group}: {s}");
            all_close(&c, (m, n, k), &what, want, |i, j| 1e-4 * (1.0 + want(i, j).abs()))?;
            // The direct driver too, whatever the model picks (one row: its product
            // with the codes, no dequantized panel).
            let problem = kernels::Problem {
                batch: 1,
                m,
                n,
                k,
                a: kernels::ALayout::RowMajor,
                b: kernels::BLayout::Packed { nr: packed.nr, kc: packed.kc },
            };
            let direct = fused.choose_where(fused.model(), &problem, |s| s.operands == Operands::Direct);
            if let Ok(d) = direct {
                let plan = fused.plan(&d).expect("plan");
                let mut c = vec![f32::NAN; m * n];
                let cv = MatMut::new(&mut c, m, n, n).unwrap();
                kernels::execute(&pool, &plan, &[am], &[BOperand::Packed(&packed)], &mut [cv], &args)
                    .expect("run");
                all_close(&c, (m, n, k), &format!("{what}, {d}"), want, |i, j| {
                    1e-4 * (1.0 + want(i, j).abs())
                })?;
            }
            Ok(())
        };
        case(1, 8, 8, 0, 0).unwrap_or_else(|e| panic!("{e}"));
        let kc = kc.get();
        let shapes = awkward_shapes(kc).into_iter().chain([
            (64, 40, 2 * kc + 40),
            (200, 24, 3 * kc + 1),
            (1, 300, 2 * kc + 5),
            (1, 100, 3 * kc),
        ]);
        for (x, (m, n, k)) in shapes.enumerate() {
            for form in 0..24 {
                case(m, n, k, form, x).unwrap_or_else(|e| panic!("{e}"));
            }
        }
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(32));
        runner
            .run(
                &(1usize..70, 1usize..70, 1usize..(2 * kc + 3), 0usize..24, 0usize..1000),
                |(m, n, k, f, s)| case(m, n, k, f, s),
            )
            .unwrap_or_else(|e| panic!("{e}"));
        let seen = seen.into_inner();
        assert_eq!(seen.len(), 2, "both drivers: {seen:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn i8s_u8s(v: &[i32]) -> (Vec<i8>, Vec<u8>) {
    (v.iter().map(|&x| x as i8).collect(), v.iter().map(|&x| x as u8).collect())
}

/// A weight packed whole (one K block, each panel contiguous along K) is read
/// by every candidate schedule of its problem, packed and direct: in its one
/// block, and in the shallower L1 blocks as windows of its panels, with bias,
/// residual and GELU in the kernels. f32 on both ISA paths and bf16 where the
/// CPU has it, every tile width of the family, at odd depths just past one and
/// a half blocks and past two (a last block of 7 or 53 rows, a padded pair in
/// bf16); 1 to 33 rows, odd widths. The shallower blocks must be among the
/// schedules run, or the test proves nothing.
#[test]
fn a_weight_packed_whole_is_read_in_blocks_of_any_depth() {
    use kernels::{ElemType, PackedB, Problem};
    let dir = std::env::temp_dir().join(format!("anyshape-whole-{}", std::process::id()));
    let pool = ThreadPool::new(2);
    let ep = Epilogue { bias: true, residual: true, activation: Activation::Gelu, ..Default::default() };
    let mut families = Vec::new();
    for t in targets() {
        families
            .push(Contraction::builder(&t, &pool).epilogue(ep).cache(Some(&dir)).build().expect("compile"));
    }
    if kernels::testing::bf16() {
        let t = Target::detect();
        let bf16 = Contraction::builder(&t, &pool).elem(ElemType::Bf16).epilogue(ep).cache(Some(&dir));
        families.push(bf16.build().expect("compile"));
    }
    for fused in &families {
        let d = fused.dispatcher();
        let elem = d.family().elem();
        let r = |x: f32| elem.round(x) as f64;
        let (mut shallow, mut whole) = (0, 0);
        for nr in d.family().widths() {
            let mr = d.family().best_height(nr).expect("a height");
            let kc = kernels::schedule::kc_for(d.target(), elem, mr, nr);
            for k in [kc * 3 / 2 + 1, 2 * kc + 7, 2 * kc + 53] {
                for (m, n) in [(1, 2 * nr + 3), (7, 50), (13, nr + 1), (33, 17)] {
                    let norm = 1.0 / (977.0 * (k as f32).sqrt());
                    let val = |i: usize, s: usize| (((i * 7919 + s * 104_729) % 2003) as f32 - 1001.0) * norm;
                    let a: Vec<f32> = (0..m * k).map(|i| val(i, m)).collect();
                    let b: Vec<f32> = (0..k * n).map(|i| val(i, n + 1)).collect();
                    let bias: Vec<f32> = (0..n).map(|j| (j % 7) as f32 * 0.1 - 0.3).collect();
                    let res: Vec<f32> = (0..m * n).map(|i| (i % 5) as f32 * 0.2 - 0.4).collect();
                    let (am, bm) =
                        (MatRef::row_major(&a, m, k).unwrap(), MatRef::row_major(&b, k, n).unwrap());
                    let packed = PackedB::of_elem(bm, nr, k, elem);
                    let p = Problem {
                        batch: 1,
                        m,
                        n,
                        k,
                        a: kernels::ALayout::RowMajor,
                        b: kernels::BLayout::Packed { nr, kc: k },
                    };
                    let args = EpilogueArgs {
                        bias: Some(&bias),
                        residual: Some(MatRef::row_major(&res, m, n).unwrap()),
                        ..EpilogueArgs::default()
                    };
                    // Each element's value and tolerance (a bf16 weight has no
                    // direct kernels: every schedule multiplies in the family's type).
                    let want: Vec<(f64, f64)> = (0..m * n)
                        .map(|x| {
                            let (i, j) = (x / n, x % n);
                            let dot = (0..k).map(|q| r(a[i * k + q]) * r(b[q * n + j])).sum::<f64>();
                            let scale =
                                (0..k).map(|q| (a[i * k + q] * b[q * n + j]).abs() as f64).sum::<f64>();
                            (gelu(dot + bias[j] as f64 + res[x] as f64), 2e-5 * (1.0 + scale))
                        })
                        .collect();
                    for s in d.candidates(&p) {
                        if s.blocking.kc < k {
                            shallow += 1;
                        } else {
                            whole += 1;
                        }
                        let mut c = vec![f32::NAN; m * n];
                        let cv = MatMut::new(&mut c, m, n, n).unwrap();
                        let plan = d.plan(&s).expect("plan");
                        kernels::execute(&pool, &plan, &[am], &[BOperand::Packed(&packed)], &mut [cv], &args)
                            .unwrap_or_else(|e| panic!("{elem} {s} {m}x{n}x{k}: {e}"));
                        for i in 0..m {
                            for j in 0..n {
                                let (got, w) = (c[i * n + j] as f64, want[i * n + j]);
                                assert!(
                                    (got - w.0).abs() <= w.1,
                                    "{elem} {s} {m}x{n}x{k} [{i},{j}]: {got} vs {}",
                                    w.0
                                );
                            }
                        }
                    }
                }
            }
        }
        assert!(shallow > 0 && whole > 0, "{elem}: {shallow} schedules in shallower blocks, {whole} whole");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
