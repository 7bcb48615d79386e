//! Every schedule the candidate generator yields computes the right product, at
//! random shapes (1, primes, one past a tile) with plain and pre-packed B, batches
//! and thread grids; the dispatcher's choice is one of the candidates, is
//! memoized, and is safe to use from several threads at once. The micro-kernels
//! are plain Rust of the generated kernels' ABI, so this runs without LLVM.

use std::sync::Arc;

use anyshape_kernels::{
    execute, ALayout, BLayout, BOperand, CostModel, Dispatcher, EpilogueArgs, LoopOrder, MatMut, MatRef,
    Operands, PackedB, Problem, ThreadPool,
};
use proptest::prelude::*;

#[macro_use]
mod common;

fn dispatcher(threads: usize) -> Dispatcher {
    common::fixed_dispatcher(threads)
}

fn naive(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| a[i * k + p] as f64 * b[p * n + j] as f64).sum::<f64>() as f32;
        }
    }
    c
}

fn dims() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(1usize),
        Just(2),
        Just(3),
        Just(5),
        Just(6),
        Just(7),
        Just(9),
        Just(11),
        Just(13),
        1usize..40
    ]
}

/// Run schedule `s` (as the driver would) and check every entry, with canaries
/// around each C.
fn check(
    d: &Dispatcher,
    pool: &ThreadPool,
    p: &Problem,
    s: &anyshape_kernels::Schedule,
) -> Result<(), String> {
    let (m, n, k, batch) = (p.m, p.n, p.k, p.batch);
    let a: Vec<f32> = (0..batch * m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 4.0).collect();
    let b: Vec<f32> = (0..batch * k * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 3.0).collect();
    let ldc = n + 3;
    let stride = m * ldc + 5;
    let mut c = vec![f32::NAN; batch * stride + 5];
    // B is `k × n` row-major, or stored transposed (`n × k`) when the layout is
    // strided; A likewise (`k × m` when strided).
    let a_at = |e: usize, i: usize, q: usize| match p.a {
        ALayout::RowMajor => a[e * m * k + i * k + q],
        ALayout::Strided => a[e * m * k + q * m + i],
        ALayout::Taps { .. } => unreachable!("taps are tested in codegen's implicit_gemm"),
    };
    let b_at = |e: usize, q: usize, j: usize| match p.b {
        BLayout::Strided | BLayout::KMajor => b[e * k * n + j * k + q],
        _ => b[e * k * n + q * n + j],
    };
    let packed: Vec<PackedB> = match p.b {
        BLayout::Packed { nr, kc } => (0..batch)
            .map(|e| PackedB::new(MatRef::row_major(&b[e * k * n..(e + 1) * k * n], k, n).unwrap(), nr, kc))
            .collect(),
        _ => Vec::new(),
    };
    let av: Vec<MatRef> = (0..batch)
        .map(|e| {
            let s = &a[e * m * k..(e + 1) * m * k];
            match p.a {
                ALayout::RowMajor => MatRef::row_major(s, m, k).unwrap(),
                ALayout::Strided => MatRef::row_major(s, k, m).unwrap().t(),
                ALayout::Taps { .. } => unreachable!("taps are tested in codegen's implicit_gemm"),
            }
        })
        .collect();
    let bv: Vec<BOperand> = (0..batch)
        .map(|e| {
            let s = &b[e * k * n..(e + 1) * k * n];
            match p.b {
                BLayout::Packed { .. } => BOperand::Packed(&packed[e]),
                BLayout::NMajor => BOperand::Plain(MatRef::row_major(s, k, n).unwrap()),
                BLayout::Strided | BLayout::KMajor => {
                    BOperand::Plain(MatRef::row_major(s, n, k).unwrap().t())
                }
            }
        })
        .collect();
    let mut cv: Vec<MatMut> = c
        .chunks_mut(stride)
        .take(batch)
        .map(|ch| MatMut::new(&mut ch[2..2 + (m - 1) * ldc + n], m, n, ldc).unwrap())
        .collect();
    execute(pool, &d.plan(s).map_err(|e| e.to_string())?, &av, &bv, &mut cv, &EpilogueArgs::default())
        .map_err(|e| format!("{s}: {e}"))?;
    for e in 0..batch {
        let ce = &c[e * stride..(e + 1) * stride];
        for i in 0..m {
            for j in 0..n {
                let w = (0..k).map(|q| a_at(e, i, q) as f64 * b_at(e, q, j) as f64).sum::<f64>() as f32;
                let got = ce[2 + i * ldc + j];
                if (got - w).abs() > 1e-3 * (1.0 + w.abs()) {
                    return Err(format!("{s} on {p:?}: entry {e} C[{i},{j}] = {got}, want {w}"));
                }
            }
        }
        // Canaries: before C, the row gaps, and after it.
        let outside =
            (0..2).chain((0..m).flat_map(|i| (n..ldc).map(move |j| 2 + i * ldc + j)).filter(|&x| x < stride));
        if let Some(x) = outside.into_iter().find(|&x| !ce[x].is_nan()) {
            return Err(format!("{s} on {p:?}: wrote outside C at {x} of entry {e}"));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 60, ..ProptestConfig::default() })]
    #[test]
    fn every_candidate_schedule_is_correct(
        m in dims(), n in dims(), k in dims(), batch in 1usize..4, b_form in 0usize..3, threads in 1usize..4,
        width in prop_oneof![Just(4usize), Just(8)], kc in 1usize..12, a_strided in any::<bool>(),
    ) {
        let d = dispatcher(threads);
        let pool = ThreadPool::new(threads);
        let layout = match b_form {
            0 => BLayout::Packed { nr: width, kc },
            1 => BLayout::NMajor,
            _ => BLayout::Strided,
        };
        let a = if a_strided { ALayout::Strided } else { ALayout::RowMajor };
        let p = Problem { batch, m, n, k, a, b: layout };
        let cands = d.candidates(&p);
        prop_assert!(!cands.is_empty(), "no candidate for {:?}", p);
        let direct = cands.iter().any(|s| s.operands == Operands::Direct);
        prop_assert_eq!(direct, p.a == ALayout::RowMajor, "direct candidates for {:?}", p);
        for s in &cands {
            prop_assert!(s.grid.threads() <= threads);
            prop_assert!(s.operands == Operands::Packed || p.a == ALayout::RowMajor, "direct with a strided A");
            if let BLayout::Packed { nr, kc } = p.b {
                prop_assert!(s.nr == nr && s.blocking.kc == kc);
            }
            check(&d, &pool, &p, s).map_err(TestCaseError::fail)?;
        }
        // Each model picks a candidate.
        for model in CostModel::ALL {
            let s = d.choose_with(model, &p).expect("a choice");
            prop_assert!(cands.contains(&s), "{:?} picked {} outside the candidates", model, s);
        }
        let rule = d.rule_of_thumb(&p).expect("the rule");
        check(&d, &pool, &p, &rule).map_err(TestCaseError::fail)?;
    }
}

#[test]
fn deep_k_yields_row_block_outer_candidates() {
    let d = dispatcher(2);
    // C of 64 × 64 floats (16 KiB) is more than half the 8 KiB L2: a row block is kept there.
    let p = Problem {
        batch: 1,
        m: 64,
        n: 64,
        k: 300,
        a: ALayout::RowMajor,
        b: BLayout::Packed { nr: 8, kc: 16 },
    };
    let outer: Vec<_> = d.candidates(&p).into_iter().filter(|s| s.order == LoopOrder::MOuter).collect();
    assert!(!outer.is_empty());
    let pool = ThreadPool::new(2);
    for s in &outer {
        assert!(s.blocking.mc < 64);
        check(&d, &pool, &p, s).unwrap();
    }
}

#[test]
fn dispatch_is_memoized_per_shape() {
    let d = dispatcher(2);
    let p = Problem { batch: 1, m: 37, n: 20, k: 9, a: ALayout::RowMajor, b: BLayout::NMajor };
    assert_eq!(d.memoized(), 0);
    let s = d.schedule(&p).unwrap();
    assert_eq!(d.schedule(&p).unwrap(), s);
    assert_eq!(d.memoized(), 1);
    assert_eq!(s, d.choose(&p).unwrap());
    d.schedule(&Problem { m: 38, ..p }).unwrap();
    assert_eq!(d.memoized(), 2);
}

#[test]
fn one_dispatcher_serves_several_threads_at_once() {
    let d = Arc::new(dispatcher(2));
    let pool = Arc::new(ThreadPool::new(2));
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let (d, pool) = (d.clone(), pool.clone());
            std::thread::spawn(move || {
                for r in 0..20 {
                    let (m, n, k) = (1 + (t * 7 + r) % 23, 1 + (t + r * 3) % 17, 1 + r % 13);
                    let a: Vec<f32> = (0..m * k).map(|i| (i % 5) as f32).collect();
                    let b: Vec<f32> = (0..k * n).map(|i| (i % 3) as f32).collect();
                    let mut c = vec![0.0; m * n];
                    let bm = MatRef::row_major(&b, k, n).unwrap();
                    let packed = d.pack_weight(bm, &[1, 8, 32]).unwrap();
                    let cv = MatMut::new(&mut c, m, n, n).unwrap();
                    let am = MatRef::row_major(&a, m, k).unwrap();
                    d.matmul(&pool, am, BOperand::Packed(&packed), cv, &EpilogueArgs::default()).unwrap();
                    assert_eq!(c, naive(&a, &b, m, k, n), "thread {t} round {r}");
                }
            })
        })
        .collect();
    handles.into_iter().for_each(|h| h.join().expect("caller"));
    assert!(d.memoized() > 0);
}

#[test]
fn mismatched_batches_and_pools_are_errors() {
    let d = dispatcher(2);
    let (a, b) = (vec![1.0f32; 12], vec![1.0f32; 12]);
    let mut c1 = vec![0.0f32; 9];
    let mut c2 = vec![0.0f32; 16];
    let a1 = MatRef::row_major(&a, 3, 4).unwrap();
    let a2 = MatRef::row_major(&a, 4, 3).unwrap();
    let b1 = MatRef::row_major(&b, 4, 3).unwrap();
    let b2 = MatRef::row_major(&b, 3, 4).unwrap();
    let pool = ThreadPool::new(2);
    let mut cv = [MatMut::new(&mut c1, 3, 3, 3).unwrap(), MatMut::new(&mut c2, 4, 4, 4).unwrap()];
    let err = d.batched(
        &pool,
        &[a1, a2],
        &[BOperand::Plain(b1), BOperand::Plain(b2)],
        &mut cv,
        &Default::default(),
    );
    assert!(err.unwrap_err().to_string().contains("differ"));
    // Schedules for two threads cannot run on a pool of one.
    let cv = MatMut::new(&mut c1, 3, 3, 3).unwrap();
    let err = d.matmul(&ThreadPool::new(1), a1, BOperand::Plain(b1), cv, &Default::default());
    assert!(err.unwrap_err().to_string().contains("threads"));
}

/// Balanced row blocks: never more blocks than blocks of `block`, never more than
/// a sixteenth (and a unit) larger, and larger only to save a block; whole units
/// (register tiles); no sliver left for the last block when one fewer would do.
#[test]
fn row_blocks_are_balanced() {
    use anyshape_kernels::schedule::balanced_block;
    for unit in [1, 3, 4, 7, 16] {
        for block in (unit..=600).step_by(unit * 5) {
            for extent in 1..=4 * block + 7 {
                let r = balanced_block(extent, block, unit);
                let (blocks, before) = (extent.div_ceil(r), extent.div_ceil(block));
                let at = format!("extent {extent} block {block} unit {unit}: {r}");
                assert!(blocks <= before, "{at} makes {blocks} blocks, not {before}");
                assert!(r <= block || blocks < before, "{at} is larger for nothing");
                assert!(r <= block + block / 16, "{at} is too large");
                if extent > block {
                    assert_eq!(r % unit, 0, "{at}");
                    let (last, last_before) = (extent - (blocks - 1) * r, extent - (before - 1) * block);
                    assert!(last >= last_before.min(r / 2), "{at}: last block {last}");
                }
            }
        }
    }
    // Two row blocks of A for 1024 rows of 7-row tiles in L2 blocks of 504.
    assert_eq!(balanced_block(1024, 504, 7), 518);
    assert_eq!(balanced_block(100, 504, 7), 504);
}

/// A convolution whose taps read each image value once (a strided 1×1) fetches all
/// of A from where it lies; one whose taps read each value nine times (a 3×3)
/// fetches a ninth of it. The model charges direct schedules (A read in place)
/// and packed ones (A packed from where it lies) for that fetch: the same
/// geometry costs no less when its taps read less often, and a direct schedule
/// strictly more.
#[test]
fn taps_read_once_are_charged_their_whole_fetch() {
    let d = dispatcher(2);
    let taps = |reads| ALayout::Taps { width: 56, interior: 56, reads };
    let problem = |m, reads| Problem { batch: 1, m, n: 64, k: 256, a: taps(reads), b: BLayout::NMajor };
    for m in [56 * 8, 56 * 56, 8 * 56 * 56] {
        let (once, nine) = (problem(m, 1), problem(m, 9));
        let mut direct = 0;
        for s in d.candidates(&once) {
            let (c1, c9) = (
                d.model().cost(d.machine(), d.family(), &once, &s),
                d.model().cost(d.machine(), d.family(), &nine, &s),
            );
            assert!(c1 >= c9, "{s} at m = {m}: taps read once {c1} s, nine times {c9} s");
            if s.operands == Operands::Direct {
                assert!(c1 > c9, "{s} at m = {m}: a direct schedule's A fetch is not charged");
                direct += 1;
            }
        }
        assert!(direct > 0, "no direct candidate at m = {m}");
    }
    // A matrix reads each element once: as taps read once.
    assert_eq!(ALayout::RowMajor.reads(), 1);
    assert_eq!(taps(0).reads(), 1);
}

/// A convolution weight's K blocks are whole kernel rows: as many as keep the
/// block's B panel within an eighth of L2, never deeper than K, and none when one
/// row is deeper than that (the weight keeps its plain blocks); the dispatcher
/// packs a conv weight so.
#[test]
fn conv_weight_blocks_are_whole_kernel_rows() {
    use anyshape_kernels::schedule::taps_kc;
    let d = dispatcher(1);
    let t = d.target().clone();
    let f32 = anyshape_kernels::ElemType::F32;
    for nr in [8, 16, 32, 48] {
        let budget = t.l2 / 8 / (nr * 4);
        for row in (1..3 * budget).step_by(37) {
            for rows in 1..=9 {
                let k = row * rows;
                let at = format!("NR {nr}, kernel rows {row} deep, K {k}");
                let Some(kc) = taps_kc(&t, f32, nr, row, k) else {
                    assert!(row > budget, "{at}: no blocks");
                    continue;
                };
                assert!(kc == k || kc.is_multiple_of(row), "{at}: KC {kc} cuts a kernel row");
                assert!(kc <= k && kc >= row.min(k), "{at}: KC {kc}");
                assert!(kc <= budget, "{at}: KC {kc} overflows the budget");
                assert!(kc == k || kc + row > budget, "{at}: KC {kc} could hold one more row");
            }
        }
    }
    // ResNet-50's 3x3 layers, 32 columns, 1 MiB of L2: 64, 128 and 256 channels
    // in whole rows, 512 not.
    let mib = anyshape_kernels::Target { l2: 1 << 20, ..t };
    assert_eq!(taps_kc(&mib, f32, 32, 3 * 64, 9 * 64), Some(576));
    assert_eq!(taps_kc(&mib, f32, 32, 3 * 128, 9 * 128), Some(768));
    assert_eq!(taps_kc(&mib, f32, 32, 3 * 256, 9 * 256), Some(768));
    assert_eq!(taps_kc(&mib, f32, 32, 3 * 512, 9 * 512), None);
    let w: Vec<f32> = (0..90 * 24).map(|i| i as f32).collect();
    let packed = d.pack_conv_weight(MatRef::row_major(&w, 90, 24).unwrap(), &[1, 64], 30).unwrap();
    assert_eq!(packed.kc % 30, 0);
    let layout = BLayout::Packed { nr: packed.nr, kc: packed.kc };
    assert_eq!(d.conv_weight_layout(90, 24, &[1, 64], 30).unwrap(), layout);
    // Rows too deep for the blocks: the plain layout.
    let deep = 2 * t.l2;
    assert_eq!(
        d.conv_weight_layout(2 * deep, 24, &[1, 64], deep).unwrap(),
        d.weight_layout(2 * deep, 24, &[1, 64]).unwrap()
    );
}

/// The rows past the last full band, under a cover height, are a row block of
/// their own and so one more pass over B: with a B far larger than L2, one row
/// more under a cover costs more than a whole band more without one (the model
/// counted the cover's rows in the first block, and picked 4x48+1x48 for
/// BERT-base's 17×3072×768, which read the weight twice).
#[test]
fn a_cover_block_is_one_more_pass_over_b() {
    use anyshape_kernels::{Blocking, LoopOrder, Schedule, ThreadGrid};
    let d = dispatcher(1);
    let (n, k) = (512, 384);
    let layout = BLayout::Packed { nr: 8, kc: 16 };
    let problem = |m| Problem { batch: 1, m, n, k, a: ALayout::RowMajor, b: layout };
    let schedule = |cover_mr| Schedule {
        mr: 3,
        nr: 8,
        cover_mr,
        blocking: Blocking { kc: 16, mc: 300, nc: 512 },
        order: LoopOrder::KOuter,
        grid: ThreadGrid::SINGLE,
        operands: Operands::Packed,
    };
    let cost = |m, s: &Schedule| d.model().cost(d.machine(), d.family(), &problem(m), s);
    let (bands, one_more_row, one_more_band) =
        (cost(12, &schedule(None)), cost(13, &schedule(Some(1))), cost(15, &schedule(None)));
    assert!(one_more_band > bands, "{bands} {one_more_band}");
    assert!(
        one_more_row - bands > one_more_band - bands,
        "a cover row {one_more_row} against a band {one_more_band} over {bands}"
    );
}

/// A weight whose C outgrows the caches (a vocabulary's LM head) is packed whole
/// where its panels are shallow enough, and its products run in its one block
/// at many rows (one pass over C) and may run in the L1 blocks at a few; a
/// weight whose panels would be too deep keeps the L1 blocks. Every candidate
/// over a weight packed whole computes the product.
#[test]
fn a_weight_whose_c_outgrows_the_caches_is_packed_whole() {
    use anyshape_kernels::schedule::{kc_for, whole_depth};
    let f32 = anyshape_kernels::ElemType::F32;
    let target = anyshape_kernels::Target { l2: 64 << 10, l3: 256 << 10, ..common::small_target() };
    let machine = anyshape_kernels::MachineModel { l2: target.l2, l3: target.l3, ..common::fixed_machine(2) };
    let d = Dispatcher::new(target.clone(), common::test_family(), machine, CostModel::Hierarchical);
    let k = 96;
    let kc = kc_for(&target, f32, d.family().best_height(8).unwrap(), 8);
    assert!(kc * 3 / 2 < k && whole_depth(&target, f32, 8, k) == Some(k), "KC {kc}: K {k} must be deeper");
    let rows = [1, 8, 64, 512];
    let wide = d.weight_layout(k, 20_000, &rows).unwrap();
    assert!(wide.packed_whole(k), "{wide:?}");
    // Panels too deep for the budget: the L1 blocks, however wide.
    let too_deep = 4 * target.l2 / 16 / 4;
    assert!(
        whole_depth(&target, f32, 4, too_deep).is_none() && whole_depth(&target, f32, 8, too_deep).is_none()
    );
    let blocked = d.weight_layout(too_deep, 20_000, &rows).unwrap();
    assert!(!blocked.packed_whole(too_deep), "{blocked:?}");
    let at =
        |m: usize| d.choose(&Problem { batch: 1, m, n: 20_000, k, a: ALayout::RowMajor, b: wide }).unwrap();
    assert_eq!(at(512).blocking.kc, k, "{}", at(512));
    let (m, n) = (13, 37);
    let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
    let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 13) as f32 - 6.0).collect();
    let BLayout::Packed { nr, .. } = wide else { unreachable!() };
    let packed = PackedB::new(MatRef::row_major(&b, k, n).unwrap(), nr, k);
    let p = Problem { batch: 1, m, n, k, a: ALayout::RowMajor, b: BLayout::Packed { nr, kc: k } };
    let want = naive(&a, &b, m, k, n);
    let pool = ThreadPool::new(2);
    let mut depths = Vec::new();
    for s in d.candidates(&p) {
        depths.push(s.blocking.kc);
        let mut c = vec![f32::NAN; m * n];
        let cv = MatMut::new(&mut c, m, n, n).unwrap();
        let plan = d.plan(&s).unwrap();
        let a = MatRef::row_major(&a, m, k).unwrap();
        execute(&pool, &plan, &[a], &[BOperand::Packed(&packed)], &mut [cv], &EpilogueArgs::default())
            .unwrap();
        assert_eq!(c, want, "{s}");
    }
    assert!(depths.contains(&k) && depths.iter().any(|&d| d < k), "{depths:?}");
}

/// A weight's tile width is the one closest to each row count's best, every
/// row count weighing the same: a width whose one-row tile is 1.7x faster does
/// not win over one whose tall tile is 1.5x faster at every larger count (as a
/// vector tile against AMX tiles: a sum of costs per flop let the one-row
/// count, the dearest per flop, decide).
#[test]
fn a_weight_takes_the_width_nearest_the_best_at_each_row_count() {
    rust_kernel!(t1x4, 1, 4);
    rust_kernel!(t5x4, 5, 4);
    rust_kernel!(t1x8, 1, 8);
    rust_kernel!(t3x8, 3, 8);
    let v = common::variant;
    let family = anyshape_kernels::KernelFamily::new(vec![
        v(1, 4, t1x4 as anyshape_kernels::MicroKernelFn, 10.0),
        v(5, 4, t5x4, 60.0),
        v(1, 8, t1x8, 17.0),
        v(3, 8, t3x8, 40.0),
    ])
    .unwrap();
    let d =
        Dispatcher::new(common::small_target(), family, common::fixed_machine(1), CostModel::Hierarchical);
    let (k, n) = (64, 64);
    let rows = [1, 64, 512, 4096];
    let cost = |m: usize, nr: usize| {
        let layout = BLayout::Packed { nr, kc: k };
        let p = Problem { batch: 1, m, n, k, a: ALayout::RowMajor, b: layout };
        let s = d.choose(&p).unwrap();
        CostModel::Hierarchical.cost(d.machine(), d.family(), &p, &s)
    };
    // The premise: width 8 wins at one row only.
    assert!(cost(1, 8) < cost(1, 4), "one row: {} against {}", cost(1, 8), cost(1, 4));
    for m in &rows[1..] {
        assert!(cost(*m, 4) < cost(*m, 8), "{m} rows: {} against {}", cost(*m, 4), cost(*m, 8));
    }
    let BLayout::Packed { nr, .. } = d.weight_layout(k, n, &rows).unwrap() else { panic!("not packed") };
    assert_eq!(nr, 4);
}
