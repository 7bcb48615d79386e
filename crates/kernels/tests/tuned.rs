//! Tuned macro-kernels (the Bayesian search's result) in the dispatcher: a table
//! picks by the nearest sampled M, an instantiated macro-kernel keeps its blocks
//! and loop order and computes the right product (plain and pre-packed B, every
//! row count up to past the samples), the weight of a tuned class is packed in
//! its tuned layout, and tables that do not fit the family are errors.

use anyshape_kernels::{
    execute, ALayout, BLayout, BOperand, Dispatcher, ElemType, EpilogueArgs, LoopOrder, MacroKernel, MatMut,
    MatRef, Operands, Problem, ThreadPool, TunedClass, TunedRow, TunedSchedules,
};

#[macro_use]
mod common;

fn dispatcher(threads: usize) -> Dispatcher {
    common::fixed_dispatcher(threads)
}

const PACKED: MacroKernel = MacroKernel {
    operands: Operands::Packed,
    mr: 3,
    nr: 8,
    kc: 24,
    mc: 9,
    order: LoopOrder::MOuter,
    threads: None,
};
const DIRECT: MacroKernel = MacroKernel {
    operands: Operands::Direct,
    mr: 2,
    nr: 8,
    kc: 16,
    mc: 2,
    order: LoopOrder::KOuter,
    threads: None,
};

fn class(b: BLayout, kernels: Vec<MacroKernel>, table: Vec<TunedRow>) -> TunedClass {
    TunedClass { batch: 1, n: 19, k: 37, a: ALayout::RowMajor, b, kernels, table }
}

fn run(d: &Dispatcher, pool: &ThreadPool, m: usize, b: &BOperand, a: &[f32], n: usize, k: usize) -> Vec<f32> {
    let p = d.problem(&[MatRef::row_major(&a[..m * k], m, k).unwrap()], &[*b]).unwrap();
    let s = d.schedule(&p).unwrap();
    let mut c = vec![f32::NAN; m * n];
    let plan = d.plan(&s).unwrap();
    execute(
        pool,
        &plan,
        &[MatRef::row_major(&a[..m * k], m, k).unwrap()],
        &[*b],
        &mut [MatMut::new(&mut c, m, n, n).unwrap()],
        &EpilogueArgs::default(),
    )
    .unwrap();
    c
}

#[test]
fn the_nearest_sample_in_log_m_picks() {
    let c = class(
        BLayout::NMajor,
        vec![PACKED, DIRECT],
        vec![
            TunedRow { m: 4, pick: Some(1) },
            TunedRow { m: 16, pick: None },
            TunedRow { m: 64, pick: Some(0) },
        ],
    );
    // ln 7 is nearer ln 4 than ln 16 (7 < √64 = 8); 9 is nearer 16.
    assert_eq!(c.pick(1), Some(DIRECT));
    assert_eq!(c.pick(7), Some(DIRECT));
    assert_eq!(c.pick(9), None);
    assert_eq!(c.pick(31), None);
    assert_eq!(c.pick(33), Some(PACKED));
    assert_eq!(c.pick(100_000), Some(PACKED));
}

#[test]
fn tuned_macro_kernels_choose_and_compute_correctly() {
    let (n, k) = (19, 37);
    let a: Vec<f32> = (0..64 * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0).collect();
    let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 6.0).collect();
    let want = |m: usize| -> Vec<f64> {
        (0..m * n)
            .map(|x| (0..k).map(|p| a[(x / n) * k + p] as f64 * b[p * n + x % n] as f64).sum())
            .collect()
    };
    let table = vec![
        TunedRow { m: 2, pick: Some(1) },
        TunedRow { m: 8, pick: None },
        TunedRow { m: 40, pick: Some(0) },
    ];
    for threads in [1, 2] {
        let pool = ThreadPool::new(threads);
        // An activation B, and a weight packed in the tuned layout (8 wide, 24 deep).
        for weight in [false, true] {
            let layout = if weight { BLayout::Packed { nr: 8, kc: 24 } } else { BLayout::NMajor };
            let kernels =
                if weight { vec![PACKED, MacroKernel { kc: 24, ..DIRECT }] } else { vec![PACKED, DIRECT] };
            let tuned = TunedSchedules {
                threads,
                elem: ElemType::F32,
                classes: vec![class(layout, kernels.clone(), table.clone())],
            };
            let d = dispatcher(threads).with_tuned(tuned).expect("tuned");
            let packed;
            let bop = if weight {
                assert_eq!(d.weight_layout(k, n, &[1, 64]).unwrap(), layout, "the tuned layout");
                packed = d.pack_weight(MatRef::row_major(&b, k, n).unwrap(), &[1, 64]).unwrap();
                BOperand::Packed(&packed)
            } else {
                BOperand::Plain(MatRef::row_major(&b, k, n).unwrap())
            };
            for m in [1, 2, 3, 5, 8, 13, 29, 40, 64] {
                let p = Problem { batch: 1, m, n, k, a: ALayout::RowMajor, b: layout };
                let s = d.schedule(&p).unwrap();
                match d.tuned().unwrap().classes[0].pick(m) {
                    Some(mk) => assert_eq!(MacroKernel::of(&s), mk, "m {m}: {s}"),
                    None => assert_eq!(s, d.choose(&p).unwrap(), "m {m}: the model's choice"),
                }
                let got = run(&d, &pool, m, &bop, &a, n, k);
                for (x, (g, w)) in got.iter().zip(want(m)).enumerate() {
                    assert!(
                        (*g as f64 - w).abs() < 1e-4 * (1.0 + w.abs()),
                        "{threads} threads m {m} [{x}] {s}"
                    );
                }
            }
            // Another shape class is not affected.
            let other = Problem { batch: 1, m: 40, n: 20, k, a: ALayout::RowMajor, b: BLayout::NMajor };
            assert_eq!(d.schedule(&other).unwrap(), d.choose(&other).unwrap());
        }
    }
}

#[test]
fn tables_that_do_not_fit_are_errors() {
    let ok = vec![TunedRow { m: 4, pick: Some(0) }];
    let cases = [
        (2, ElemType::F32, class(BLayout::NMajor, vec![PACKED], ok.clone()), "threads"),
        (1, ElemType::Bf16, class(BLayout::NMajor, vec![PACKED], ok.clone()), "tuned for bf16"),
        (1, ElemType::F32, class(BLayout::NMajor, vec![PACKED], vec![]), "empty"),
        (
            1,
            ElemType::F32,
            class(
                BLayout::NMajor,
                vec![PACKED],
                vec![TunedRow { m: 8, pick: None }, TunedRow { m: 4, pick: None }],
            ),
            "unsorted",
        ),
        (
            1,
            ElemType::F32,
            class(BLayout::NMajor, vec![PACKED], vec![TunedRow { m: 4, pick: Some(1) }]),
            "past its kernels",
        ),
        (
            1,
            ElemType::F32,
            class(BLayout::NMajor, vec![MacroKernel { mr: 4, ..PACKED }], ok.clone()),
            "not a kernel",
        ),
        (
            1,
            ElemType::F32,
            class(BLayout::NMajor, vec![MacroKernel { mr: 3, ..DIRECT }], ok.clone()),
            "not a kernel",
        ),
        (1, ElemType::F32, class(BLayout::Packed { nr: 8, kc: 32 }, vec![PACKED], ok.clone()), "layout"),
    ];
    for (threads, elem, c, what) in cases {
        let e = dispatcher(1)
            .with_tuned(TunedSchedules { threads, elem, classes: vec![c] })
            .err()
            .expect("an error");
        assert!(e.to_string().contains(what), "{what}: {e}");
    }
    // A macro-kernel whose blocks do not fit its tile, or a weight packed for another
    // depth, gives no schedule (the dispatcher falls back to the model).
    let d = dispatcher(1);
    let p =
        Problem { batch: 1, m: 10, n: 19, k: 37, a: ALayout::RowMajor, b: BLayout::Packed { nr: 8, kc: 16 } };
    assert!(PACKED.instantiate(&d, &p).is_none());
    let p = Problem { b: BLayout::NMajor, ..p };
    assert!(MacroKernel { mc: 10, ..PACKED }.instantiate(&d, &p).is_none());
    assert!(PACKED.instantiate(&d, &p).is_some());
}

/// A macro-kernel measured on a given thread count (what the measured dispatch
/// keeps) instantiates on that count; a count the candidates lack gives no
/// schedule (the dispatcher then falls back to the model).
#[test]
fn pinned_thread_counts_are_kept() {
    let d = dispatcher(2);
    let p = Problem { batch: 1, m: 4, n: 64, k: 37, a: ALayout::RowMajor, b: BLayout::NMajor };
    for t in [1, 2] {
        let s = MacroKernel { threads: Some(t), ..PACKED }.instantiate(&d, &p).expect("a schedule");
        assert_eq!(s.grid.threads(), t);
        let pinned = MacroKernel::pinned(&s);
        assert_eq!(pinned.threads, Some(t));
        assert!(pinned.to_string().ends_with(&format!("on {t} threads")), "{pinned}");
    }
    assert!(MacroKernel { threads: Some(3), ..PACKED }.instantiate(&d, &p).is_none());
}
