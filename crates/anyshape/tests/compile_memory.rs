//! Compiling a model again and again does not grow the process: every LLVM
//! context, module and loaded object of a compile is freed with it (a leaked
//! context per module once cost ~8 MB per compile of the bundled BERT). Alone
//! in its test binary, so that no other test allocates meanwhile.

use std::path::PathBuf;

use anyshape::{CompileOptions, LoadOptions, Model};

/// Resident set size in MB, from `/proc/self/statm` (Linux).
fn rss_mb() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: f64 = s.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096.0 / (1 << 20) as f64)
}

#[test]
fn repeated_compiles_do_not_grow_memory() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/bert/model.onnx");
    let model = Model::load(path, &LoadOptions::new()).expect("loads");
    let opts = CompileOptions::new().threads(2);
    // Two compiles to reach a steady state (caches, the allocator's arenas).
    for _ in 0..2 {
        drop(model.compile(&opts).expect("compiles"));
    }
    let Some(before) = rss_mb() else {
        eprintln!("skipped: no /proc/self/statm");
        return;
    };
    for _ in 0..8 {
        drop(model.compile(&opts).expect("compiles"));
    }
    let after = rss_mb().expect("statm");
    assert!(after - before < 16.0, "8 compiles grew the process from {before:.1} MB to {after:.1} MB");
}
