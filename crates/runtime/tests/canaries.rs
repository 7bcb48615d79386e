//! Canary margins (test mode): a step that writes outside its buffer fails the
//! call with an error naming the step and the buffer, and a step that stays
//! inside passes. The steps here are hand-written stand-ins for generated code
//! with the loop programs' ABI, two of them deliberately writing out of bounds.

use std::sync::atomic::{AtomicUsize, Ordering};

use ir::{Elems, Tensor};
use runtime::{CompiledModel, ModelParts};

const GRAPH: &str = r#"graph {
  sym n param 1..100
  input %x: f32[n]
  %y: f32[n] = neg %x
  output %y
}
"#;

/// The parameter index of the program's output, and of its input.
static OUT: AtomicUsize = AtomicUsize::new(0);
static IN: AtomicUsize = AtomicUsize::new(0);
/// The dim-table slot of `n`.
static N: AtomicUsize = AtomicUsize::new(0);

/// `y = -x` (a one-row nest: the row range is ignored).
unsafe extern "C" fn negate(bufs: *const *mut u8, dims: *const i64, _: i64, _: i64) -> i64 {
    // SAFETY: the runtime passes the program's buffers and the evaluated dim table.
    unsafe {
        let n = *dims.add(N.load(Ordering::SeqCst)) as usize;
        let x = *bufs.add(IN.load(Ordering::SeqCst)) as *const f32;
        let y = *bufs.add(OUT.load(Ordering::SeqCst)) as *mut f32;
        for i in 0..n {
            *y.add(i) = -*x.add(i);
        }
    }
    0
}

/// [`negate`], then one element more past the end: into the canary margin.
unsafe extern "C" fn overrun(bufs: *const *mut u8, dims: *const i64, b: i64, e: i64) -> i64 {
    // SAFETY: as for `negate`; the element past the end lies in the margin the
    // runtime put there (the test compiles with canaries).
    unsafe {
        negate(bufs, dims, b, e);
        let n = *dims.add(N.load(Ordering::SeqCst)) as usize;
        *(*bufs.add(OUT.load(Ordering::SeqCst)) as *mut f32).add(n) = 1.0;
    }
    0
}

/// [`negate`], then one element before the start.
unsafe extern "C" fn underrun(bufs: *const *mut u8, dims: *const i64, b: i64, e: i64) -> i64 {
    // SAFETY: as for `overrun`, in the margin before the buffer.
    unsafe {
        negate(bufs, dims, b, e);
        *(*bufs.add(OUT.load(Ordering::SeqCst)) as *mut f32).sub(1) = 1.0;
    }
    0
}

fn model(f: plan::LoopFn) -> CompiledModel {
    let g = ir::parse_graph(GRAPH, &|_| None).expect("graph");
    let plan = lower::lower(&g, &passes::fuse(&g)).expect("lowers");
    assert_eq!(plan.programs.len(), 1, "{}", plan::print_plan(&plan));
    let p = &plan.programs[0];
    OUT.store(p.params.iter().position(|q| q.written).expect("an output"), Ordering::SeqCst);
    IN.store(p.params.iter().position(|q| !q.written).expect("an input"), Ordering::SeqCst);
    let n = plan.dims.exprs().iter().position(|e| e.as_symbol() == Some("n")).expect("n in the dim table");
    N.store(n, Ordering::SeqCst);
    let io = |vs: &[ir::ValueId]| vs.iter().map(|v| (g.name(*v).to_string(), g.ty(*v).clone())).collect();
    CompiledModel::new(ModelParts {
        env: g.env.clone(),
        inputs: io(&g.inputs),
        outputs: io(&g.outputs),
        plan,
        loops: vec![f],
        splits: vec![None],
        dispatchers: Vec::new(),
        pool: std::sync::Arc::new(kernels::ThreadPool::new(1)),
        code: Vec::new(),
        canaries: true,
        code_stats: Default::default(),
        code_target: Default::default(),
    })
    .expect("model")
}

fn run(m: &CompiledModel, n: usize) -> Result<Vec<f32>, runtime::RunError> {
    let x = Tensor::new(vec![n], Elems::F32((0..n).map(|i| i as f32).collect())).expect("tensor");
    let out = m.run(&[("x", x)])?;
    match out[0].1.elems() {
        Elems::F32(v) => Ok(v.clone()),
        e => panic!("{e:?}"),
    }
}

#[test]
fn canaries_catch_writes_outside_a_buffer() {
    // One test: the statics describe one plan at a time.
    for n in [1, 7, 16, 17, 100] {
        let want: Vec<f32> = (0..n).map(|i| -(i as f32)).collect();
        assert_eq!(run(&model(negate), n).expect("in bounds"), want, "n = {n}");
        let e = run(&model(overrun), n).expect_err("an overrun").to_string();
        assert!(e.contains("wrote outside 'y'") && e.contains("0 bytes past its end"), "n = {n}: {e}");
        let e = run(&model(underrun), n).expect_err("an underrun").to_string();
        assert!(e.contains("step 0") && e.contains("4 bytes before it"), "n = {n}: {e}");
    }
}
