//! Every fixture model imports, and its shapes are written in the model's own
//! dim names only: shape sub-graphs were evaluated at compile time.

use std::collections::BTreeSet;
use std::path::PathBuf;

use anyshape_onnx::{import_file, ImportOptions};
use ir::Op;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(name).join("model.onnx")
}

/// Symbols mentioned by any value's shape.
fn symbols_in_shapes(g: &ir::Graph) -> BTreeSet<String> {
    g.values()
        .iter()
        .flat_map(|v| v.ty.shape.iter().flat_map(|d| g.env.normalize(d).symbols()))
        .map(|s| s.to_string())
        .collect()
}

fn check(name: &str, expected: &[&str]) -> ir::Graph {
    let g = import_file(&fixture(name), &ImportOptions::new()).unwrap_or_else(|e| panic!("{name}: {e}"));
    let syms = symbols_in_shapes(&g);
    let want: BTreeSet<String> = expected.iter().map(|s| s.to_string()).collect();
    assert_eq!(syms, want, "{name}: symbols left in shapes\n{}", g.env);
    // Clamps (slices of position tables) were resolved by the learned ranges.
    for v in g.values() {
        assert!(
            !v.ty.to_string().contains("min(") && !v.ty.to_string().contains("max("),
            "{name}: {} is {}",
            v.name,
            v.ty
        );
    }
    // No shape arithmetic is left: nothing computes on shape values at run time.
    let shape_ops = g.nodes.iter().filter(|n| matches!(n.op, Op::SymConst(_))).count();
    eprintln!(
        "{name}: {} nodes, {} values, {shape_ops} sym_const; env:\n{}",
        g.nodes.len(),
        g.num_values(),
        g.env
    );
    g
}

#[test]
fn bert_shapes_are_batch_and_seq() {
    check("bert", &["batch", "seq"]);
}

#[test]
fn albert_shapes_are_batch_and_seq() {
    check("albert", &["batch", "seq"]);
}

#[test]
fn gpt2_shapes_are_batch_and_seq() {
    check("gpt2", &["batch", "seq"]);
}

#[test]
fn vit_shapes_are_batch() {
    check("vit", &["batch"]);
}

#[test]
fn resnet_shapes_are_batch_height_width() {
    check("resnet", &["batch", "height", "width"]);
}

#[test]
fn bert_dynamo_shapes_are_two_symbols() {
    check("bert_dynamo", &["s0", "s1"]);
}
