//! Dispatch by a decision tree distilled from the analytical model: on held-out
//! shapes the tree's schedule computes the right product (plain, transposed and
//! pre-packed B, batches, pools of 1-3 threads) and is predicted to be nearly as
//! fast as the model's own choice; grown to full depth it is the model on its
//! samples; it survives a serde round trip and a dispatcher answers from it. The
//! machine model is fixed (not measured) so that the trees, and the regret
//! bounds asserted here, are the same on every machine.

use std::sync::OnceLock;

use anyshape_kernels::tree::{extents, sweep, Node};
use anyshape_kernels::{
    execute, ALayout, BLayout, BOperand, DecisionTree, Dispatcher, EpilogueArgs, MatMut, MatRef, PackedB,
    Problem, Schedule, ThreadPool, TreeOptions,
};
use proptest::prelude::*;

#[macro_use]
mod common;

/// A small target, so that the blocks split even tiny shapes, and a fixed machine.
fn dispatcher(threads: usize) -> Dispatcher {
    common::fixed_dispatcher(threads)
}

const PACKED: BLayout = BLayout::Packed { nr: 8, kc: 16 };
const LAYOUTS: [(ALayout, BLayout); 4] = [
    (ALayout::RowMajor, BLayout::NMajor),
    (ALayout::RowMajor, BLayout::Strided),
    (ALayout::RowMajor, PACKED),
    (ALayout::Strided, BLayout::NMajor),
];

/// The training sweep: geometric extents up to 64 (K to 96), batches 1-3.
fn training(a: ALayout, b: BLayout) -> Vec<Problem> {
    sweep(1..=64, 1..=64, 1..=96, &[1, 2, 3], a, b)
}

/// One dispatcher and its tree per pool size and layout, distilled once.
fn trained(threads: usize, layout: usize) -> &'static (Dispatcher, DecisionTree) {
    static TREES: [[OnceLock<(Dispatcher, DecisionTree)>; 4]; 3] =
        [const { [const { OnceLock::new() }; 4] }; 3];
    TREES[threads - 1][layout].get_or_init(|| {
        let d = dispatcher(threads);
        let (a, b) = LAYOUTS[layout];
        let tree = d.distill(&training(a, b), TreeOptions::default()).expect("a tree");
        (d, tree)
    })
}

/// Shapes of no training sample: a fixed pseudo-random draw (batch 1-3, M and N
/// to 64, K to 96) without the training grid's points.
fn held_out(a: ALayout, b: BLayout, count: usize) -> Vec<Problem> {
    let (ms, ks) = (extents(1..=64), extents(1..=96));
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |hi: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        1 + (x % hi) as usize
    };
    let mut out = Vec::new();
    while out.len() < count {
        let p = Problem { batch: next(3), m: next(64), n: next(64), k: next(96), a, b };
        let seen = ms.contains(&p.m) && ms.contains(&p.n) && ks.contains(&p.k);
        if !seen {
            out.push(p);
        }
    }
    out
}

/// Run `s` on `p` and check every entry against an f64 reference, with canaries
/// around each C.
fn check(d: &Dispatcher, pool: &ThreadPool, p: &Problem, s: &Schedule) -> Result<(), String> {
    let (m, n, k, batch) = (p.m, p.n, p.k, p.batch);
    let a: Vec<f32> = (0..batch * m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 4.0).collect();
    let b: Vec<f32> = (0..batch * k * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 3.0).collect();
    let (ldc, lead) = (n + 3, 2);
    let stride = m * ldc + 5;
    let mut c = vec![f32::NAN; batch * stride];
    // A is `k × m` when strided; B is stored `n × k` when strided.
    let a_at = |e: usize, i: usize, q: usize| match p.a {
        ALayout::RowMajor => a[e * m * k + i * k + q],
        ALayout::Strided => a[e * m * k + q * m + i],
        ALayout::Taps { .. } => unreachable!("taps are tested in codegen's implicit_gemm"),
    };
    let b_at = |e: usize, q: usize, j: usize| match p.b {
        BLayout::Strided | BLayout::KMajor => b[e * k * n + j * k + q],
        _ => b[e * k * n + q * n + j],
    };
    let entry = |v: &[f32], e: usize, len: usize| v[e * len..(e + 1) * len].to_vec();
    let mut packed = Vec::new();
    if let BLayout::Packed { nr, kc } = p.b {
        for e in 0..batch {
            let be = entry(&b, e, k * n);
            packed.push(PackedB::new(MatRef::row_major(&be, k, n).map_err(|e| e.to_string())?, nr, kc));
        }
    }
    let av: Vec<MatRef> = (0..batch)
        .map(|e| {
            let s = &a[e * m * k..(e + 1) * m * k];
            match p.a {
                ALayout::RowMajor => MatRef::row_major(s, m, k),
                ALayout::Strided => MatRef::row_major(s, k, m).map(|v| v.t()),
                ALayout::Taps { .. } => unreachable!("taps are tested in codegen's implicit_gemm"),
            }
        })
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let bv: Vec<BOperand> = (0..batch)
        .map(|e| {
            let s = &b[e * k * n..(e + 1) * k * n];
            match p.b {
                BLayout::Packed { .. } => Ok(BOperand::Packed(&packed[e])),
                BLayout::NMajor => MatRef::row_major(s, k, n).map(BOperand::Plain),
                BLayout::Strided | BLayout::KMajor => {
                    MatRef::row_major(s, n, k).map(|v| BOperand::Plain(v.t()))
                }
            }
        })
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let mut cv: Vec<MatMut> = c
        .chunks_mut(stride)
        .map(|ch| MatMut::new(&mut ch[lead..lead + (m - 1) * ldc + n], m, n, ldc))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let plan = d.plan(s).map_err(|e| e.to_string())?;
    execute(pool, &plan, &av, &bv, &mut cv, &EpilogueArgs::default()).map_err(|e| format!("{s}: {e}"))?;
    for e in 0..batch {
        let ce = &c[e * stride..(e + 1) * stride];
        for i in 0..m {
            for j in 0..n {
                let w = (0..k).map(|q| a_at(e, i, q) as f64 * b_at(e, q, j) as f64).sum::<f64>() as f32;
                let got = ce[lead + i * ldc + j];
                if (got - w).abs() > 1e-3 * (1.0 + w.abs()) {
                    return Err(format!("{s} on {p:?}: entry {e} C[{i},{j}] = {got}, want {w}"));
                }
            }
        }
        let inside = |x: usize| x >= lead && (x - lead) / ldc < m && (x - lead) % ldc < n;
        if let Some(x) = (0..stride).find(|&x| !inside(x) && !ce[x].is_nan()) {
            return Err(format!("{s} on {p:?}: wrote outside C at {x} of entry {e}"));
        }
    }
    Ok(())
}

fn dims() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(1usize),
        Just(2),
        Just(3),
        Just(5),
        Just(7),
        Just(9),
        Just(13),
        Just(17),
        Just(23),
        Just(33),
        Just(41),
        1usize..70
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn tree_schedules_on_held_out_shapes_are_correct(
        m in dims(), n in dims(), k in dims(), batch in 1usize..4, threads in 1usize..4, layout in 0usize..4,
    ) {
        let (d, tree) = trained(threads, layout);
        let (a, b) = LAYOUTS[layout];
        let p = Problem { batch, m, n, k, a, b };
        let s = tree.choose(&p);
        prop_assert!(s.grid.threads() <= threads);
        if let BLayout::Packed { nr, kc } = b {
            prop_assert!(s.nr == nr && s.blocking.kc == kc, "{} for {:?}", s, b);
        }
        check(d, &ThreadPool::new(threads), &p, &s).map_err(TestCaseError::fail)?;
    }
}

/// The bounds are what the fixed machine gives (worst of the twelve trees: mean
/// 1.027 on the samples and 1.044 on held-out shapes, 87% and 72% of them
/// within 5%; the worst single sample 2.399), with a little room. (With the
/// model pricing each direct call, its picks vary more across shapes, and the
/// trees of depth 8 follow them less closely than the 1.015 and 1.032 before.)
#[test]
fn tree_is_near_the_model_on_its_samples_and_held_out_shapes() {
    for threads in 1..=3 {
        for (layout, &(a, b)) in LAYOUTS.iter().enumerate() {
            let (d, tree) = trained(threads, layout);
            let train = tree.predicted_regret(d, &training(a, b)).expect("regret");
            let held = tree.predicted_regret(d, &held_out(a, b, 400)).expect("regret");
            eprintln!(
                "{threads} threads, A {a:?}, B {b:?}: {} leaves, depth {}; training mean {:.4} max {:.3} \
                 within 5% {:.3}; held out mean {:.4} max {:.3} within 5% {:.3}",
                tree.leaves(),
                tree.depth(),
                train.mean,
                train.max,
                train.within_5pct,
                held.mean,
                held.max,
                held.within_5pct
            );
            assert!(tree.depth() <= 8 && tree.leaves() <= 256);
            assert!(train.mean <= 1.03 && train.within_5pct >= 0.86, "{train:?}");
            assert!(held.mean <= 1.05 && held.within_5pct >= 0.70, "{held:?}");
            assert!(train.max < 2.5 && held.max < 2.0, "{train:?} {held:?}");
        }
    }
}

#[test]
fn a_full_depth_tree_is_the_model_on_its_samples() {
    for threads in [1, 3] {
        let d = dispatcher(threads);
        let samples = sweep(1..=17, 1..=9, 1..=24, &[1, 2], ALayout::RowMajor, BLayout::NMajor);
        let options = TreeOptions { max_depth: 64, min_samples: 1, min_gain: 0.0 };
        let tree = d.distill(&samples, options).unwrap();
        // The model's pick, or one it prices no higher: a leaf's schedule keeps its
        // own sample's row block and cover height, and (from a wider sample) may be
        // a tile the candidate generator left out for this one's padding, which the
        // model prices for its work alone.
        for p in &samples {
            let (mine, model) = (tree.choose(p), d.choose(p).unwrap());
            let cost = |s: &Schedule| d.model().cost(d.machine(), d.family(), p, s);
            let (c_mine, c_model) = (cost(&mine), cost(&model));
            assert!(
                mine == model || c_mine <= c_model * (1.0 + 1e-12),
                "{p:?}: {mine} ({c_mine:e} s) against {model} ({c_model:e} s)"
            );
        }
        let regret = tree.predicted_regret(&d, &samples).unwrap();
        assert!(regret.mean <= 1.0 + 1e-12 && regret.max <= 1.0 + 1e-12, "{regret:?}");
        assert_eq!(regret.within_5pct, 1.0);
    }
}

#[test]
fn a_tree_of_one_leaf_still_chooses() {
    let d = dispatcher(2);
    let p = Problem { batch: 1, m: 20, n: 30, k: 40, a: ALayout::RowMajor, b: BLayout::NMajor };
    let tree = d.distill(&[p], TreeOptions::default()).unwrap();
    assert_eq!((tree.leaves(), tree.depth()), (1, 0));
    assert_eq!(tree.choose(&p), d.choose(&p).unwrap());
    assert_eq!(tree.choose(&Problem { m: 1, ..p }), tree.choose(&p));
}

#[test]
fn mixed_layouts_and_empty_samples_are_errors() {
    let d = dispatcher(2);
    let p = Problem { batch: 1, m: 20, n: 30, k: 40, a: ALayout::RowMajor, b: BLayout::NMajor };
    let err = d.distill(&[], TreeOptions::default()).unwrap_err();
    assert!(err.to_string().contains("samples"), "{err}");
    for q in [
        Problem { b: BLayout::Strided, ..p },
        Problem { a: ALayout::Strided, ..p },
        Problem { b: PACKED, ..p },
    ] {
        let err = d.distill(&[p, q], TreeOptions::default()).unwrap_err();
        assert!(err.to_string().contains("layout"), "{err}");
    }
    let err = d.distill(&[p, Problem { k: 0, ..p }], TreeOptions::default()).unwrap_err();
    assert!(err.to_string().contains("empty"), "{err}");
    // Regret on another layout is an error, and on nothing.
    let tree = d.distill(&[p], TreeOptions::default()).unwrap();
    assert!(tree.predicted_regret(&d, &[Problem { b: BLayout::Strided, ..p }]).is_err());
    assert!(tree.predicted_regret(&d, &[]).is_err());
}

#[test]
fn serde_round_trip_preserves_choices() {
    let (_, tree) = trained(2, 0);
    let json = serde_json::to_string(tree).unwrap();
    let back: DecisionTree = serde_json::from_str(&json).unwrap();
    assert_eq!(&back, tree);
    let (a, b) = LAYOUTS[0];
    for p in held_out(a, b, 200).iter().chain(&training(a, b)) {
        assert_eq!(back.choose(p), tree.choose(p));
    }
    assert_eq!(back.to_string(), tree.to_string());
    // The round-tripped tree is accepted by a dispatcher of the same machine.
    assert!(dispatcher(2).with_tree(back).is_ok());
}

#[test]
fn malformed_stored_trees_are_rejected() {
    let (_, tree) = trained(2, 0);
    let mut v: serde_json::Value = serde_json::to_value(tree).unwrap();
    // A split that points backwards could loop.
    let nodes = v["nodes"].as_array_mut().unwrap();
    let split = nodes.iter_mut().find(|n| n.get("Split").is_some()).unwrap();
    split["Split"]["gt"] = serde_json::json!(0);
    assert!(serde_json::from_value::<DecisionTree>(v).unwrap_err().to_string().contains("malformed"));
    let mut v: serde_json::Value = serde_json::to_value(tree).unwrap();
    let leaf = v["nodes"].as_array_mut().unwrap().iter_mut().find(|n| n.get("Leaf").is_some()).unwrap();
    leaf["Leaf"]["mr"] = serde_json::json!(0);
    assert!(serde_json::from_value::<DecisionTree>(v).is_err());
    let mut v: serde_json::Value = serde_json::to_value(tree).unwrap();
    v["nodes"] = serde_json::json!([]);
    assert!(serde_json::from_value::<DecisionTree>(v).is_err());
}

#[test]
fn a_dispatcher_with_a_tree_answers_from_it_and_memoizes() {
    let (_, tree) = trained(2, 0);
    let (a, b) = LAYOUTS[0];
    // Memoized shapes of the tree's layout are forgotten when it arrives.
    let mut d = dispatcher(2);
    let p = Problem { batch: 2, m: 37, n: 21, k: 50, a, b };
    d.schedule(&p).unwrap();
    d.schedule(&Problem { b: BLayout::Strided, ..p }).unwrap();
    assert_eq!(d.memoized(), 2);
    d.set_tree(tree.clone()).unwrap();
    assert_eq!(d.memoized(), 1);
    assert!(d.tree(a, b).is_some() && d.tree(a, BLayout::Strided).is_none());
    for p in held_out(a, b, 50) {
        let s = d.schedule(&p).unwrap();
        assert_eq!(s, tree.choose(&p));
        assert_eq!(d.schedule(&p).unwrap(), s);
    }
    assert_eq!(d.memoized(), 51);
    // Other layouts still go to the model.
    let q = Problem { b: BLayout::Strided, m: 11, ..p };
    assert_eq!(d.schedule(&q).unwrap(), d.choose(&q).unwrap());
    // It runs through the dispatcher's own entry point.
    let (m, n, k) = (13, 9, 7);
    let av: Vec<f32> = (0..m * k).map(|i| (i % 5) as f32).collect();
    let bv: Vec<f32> = (0..k * n).map(|i| (i % 3) as f32).collect();
    let mut c = vec![0.0; m * n];
    let pool = ThreadPool::new(2);
    let s = d
        .matmul(
            &pool,
            MatRef::row_major(&av, m, k).unwrap(),
            BOperand::Plain(MatRef::row_major(&bv, k, n).unwrap()),
            MatMut::new(&mut c, m, n, n).unwrap(),
            &EpilogueArgs::default(),
        )
        .unwrap();
    assert_eq!(s, tree.choose(&Problem { batch: 1, m, n, k, a, b }));
    for i in 0..m {
        for j in 0..n {
            let want: f32 = (0..k).map(|q| av[i * k + q] * bv[q * n + j]).sum();
            assert_eq!(c[i * n + j], want);
        }
    }
}

#[test]
fn trees_that_do_not_fit_the_dispatcher_are_rejected() {
    let (_, tree) = trained(3, 0);
    let err = dispatcher(2).with_tree(tree.clone()).err().expect("an error");
    assert!(err.to_string().contains("threads"), "{err}");
    // A tree for B packed with another NR: its leaves do not fit that layout.
    let (_, packed) = trained(2, 2);
    let mut v: serde_json::Value = serde_json::to_value(packed).unwrap();
    v["b"] = serde_json::to_value(BLayout::Packed { nr: 4, kc: 16 }).unwrap();
    let moved: DecisionTree = serde_json::from_value(v).unwrap();
    let err = dispatcher(2).with_tree(moved).err().expect("an error");
    assert!(err.to_string().contains("packed"), "{err}");
}

#[test]
fn the_text_form_lists_every_leaf() {
    let (_, tree) = trained(2, 2);
    let text = tree.to_string();
    eprintln!("{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("# A RowMajor, B Packed"));
    // One line per side of each split; a leaf's schedule closes its line.
    let splits = tree.nodes().iter().filter(|n| matches!(n, Node::Split { .. })).count();
    assert_eq!(lines.len() - 1, 2 * splits.max(1) - usize::from(splits == 0));
    let with_schedule = lines.iter().filter(|l| l.contains(" threads ")).count();
    assert_eq!(with_schedule, tree.leaves());
    assert!(lines.iter().skip(1).all(|l| l.trim_start().starts_with(['m', 'n', 'k', 'b', 'w'])));
}
