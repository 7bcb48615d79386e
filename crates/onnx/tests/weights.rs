//! Weights are windows into the memory-mapped model (or external-data file),
//! never copies; external data resolves relative to the model; bad references
//! are errors.

mod common;

use std::path::Path;

use anyshape_onnx::proto::{StringStringEntryProto, TensorProto};
use anyshape_onnx::{import_file, proto::data_type, ImportOptions};
use common::*;
use ir::{Elems, Op, Tensor};

/// The address ranges of this process's mappings of `path` (Linux).
fn mapped_ranges(path: &Path) -> Vec<(usize, usize)> {
    let canon = std::fs::canonicalize(path).expect("canonical path");
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    maps.lines()
        .filter(|l| l.ends_with(canon.to_str().unwrap_or("?")))
        .filter_map(|l| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            Some((usize::from_str_radix(a, 16).ok()?, usize::from_str_radix(b, 16).ok()?))
        })
        .collect()
}

fn constant_ptr(g: &ir::Graph, name: &str) -> usize {
    let v = g.find(name).unwrap_or_else(|| panic!("no value {name}"));
    let n = g.nodes.iter().find(|n| n.output == v).expect("producer");
    match &n.op {
        Op::Constant(c) => c.bytes().as_ptr() as usize,
        other => panic!("{name} is {other:?}"),
    }
}

fn add_model(w: TensorProto) -> anyshape_onnx::proto::ModelProto {
    model(
        vec![node("Add", &["x", "w"], &["y"], vec![])],
        vec![value_info("x", data_type::FLOAT, &[Dim::P("n"), Dim::V(256)])],
        &["y"],
        vec![w],
        17,
    )
}

#[test]
fn inline_weights_are_not_copied() {
    let dir = tmp_dir("inline");
    let path = dir.join("model.onnx");
    let vals: Vec<f32> = (0..256).map(|i| i as f32).collect();
    std::fs::write(&path, encode(&add_model(f32_tensor("w", &[256], &vals)))).expect("write");
    let g = import_file(&path, &ImportOptions::new()).expect("import");
    let ptr = constant_ptr(&g, "w");
    let ranges = mapped_ranges(&path);
    assert!(!ranges.is_empty(), "model file is not mapped");
    assert!(
        ranges.iter().any(|(a, b)| *a <= ptr && ptr < *b),
        "weight bytes at {ptr:#x} are not in the model's mapping {ranges:x?}"
    );
}

fn external(name: &str, location: &str, offset: usize, length: usize) -> TensorProto {
    let kv = |k: &str, v: String| StringStringEntryProto { key: Some(k.into()), value: Some(v) };
    TensorProto {
        name: Some(name.into()),
        dims: vec![256],
        data_type: Some(data_type::FLOAT),
        data_location: Some(1),
        external_data: vec![
            kv("location", location.into()),
            kv("offset", offset.to_string()),
            kv("length", length.to_string()),
        ],
        ..Default::default()
    }
}

#[test]
fn external_data_is_mapped_and_correct() {
    let dir = tmp_dir("external");
    let vals: Vec<f32> = (0..256).map(|i| i as f32 * 0.5).collect();
    let mut blob = vec![0u8; 64]; // the tensor starts at offset 64
    blob.extend(vals.iter().flat_map(|v| v.to_le_bytes()));
    std::fs::write(dir.join("weights.bin"), &blob).expect("write blob");
    let path = dir.join("model.onnx");
    std::fs::write(&path, encode(&add_model(external("w", "weights.bin", 64, 1024)))).expect("write");
    let g = import_file(&path, &ImportOptions::new()).expect("import");
    let ptr = constant_ptr(&g, "w");
    let ranges = mapped_ranges(&dir.join("weights.bin"));
    assert!(
        ranges.iter().any(|(a, b)| *a <= ptr && ptr < *b),
        "external weight not in the data file's mapping"
    );
    let x = Tensor::new(vec![2, 256], Elems::F32(vec![1.0; 512])).expect("x");
    let out = reference::run(&g, &[("x", x)]).expect("run");
    let Elems::F32(y) = out[0].1.elems() else { panic!("dtype") };
    assert_eq!(y[0], 1.0);
    assert_eq!(y[257], 1.5);
    assert_eq!(y[511], 128.5);
}

#[test]
fn bad_external_references_are_errors() {
    let dir = tmp_dir("badext");
    std::fs::write(dir.join("small.bin"), [0u8; 100]).expect("write");
    let cases = [
        (external("w", "../escape.bin", 0, 1024), "relative path inside the model's folder"),
        (external("w", "/etc/passwd", 0, 1024), "relative path inside the model's folder"),
        (external("w", "small.bin", 0, 1024), "outside"),
        (external("w", "small.bin", usize::MAX - 4, 1024), "outside"),
        (external("w", "missing.bin", 0, 1024), "cannot read"),
    ];
    for (i, (w, want)) in cases.into_iter().enumerate() {
        let path = dir.join(format!("m{i}.onnx"));
        std::fs::write(&path, encode(&add_model(w))).expect("write");
        let e = import_file(&path, &ImportOptions::new()).expect_err("must fail").to_string();
        assert!(e.contains(want), "case {i}: `{want}` not in: {e}");
    }
}

#[test]
fn raw_data_of_wrong_length_is_an_error() {
    let dir = tmp_dir("badraw");
    let mut w = f32_tensor("w", &[256], &[1.0; 255]);
    w.name = Some("w".into());
    let path = dir.join("m.onnx");
    std::fs::write(&path, encode(&add_model(w))).expect("write");
    let e = import_file(&path, &ImportOptions::new()).expect_err("must fail").to_string();
    assert!(e.contains("tensor 'w'") && e.contains("1024 bytes"), "{e}");
}

/// Resident KiB of this process's mappings of `path` (Linux's smaps).
fn resident_kib(path: &Path) -> usize {
    let canon = std::fs::canonicalize(path).expect("canonical path");
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("/proc/self/smaps");
    let mut ours = false;
    let mut kib = 0;
    for l in smaps.lines() {
        if l.split_whitespace().next().is_some_and(|f| f.contains('-') && !f.ends_with(':')) {
            ours = l.ends_with(canon.to_str().unwrap_or("?"));
        } else if let (true, Some(v)) = (ours, l.strip_prefix("Rss:")) {
            kib += v.trim().trim_end_matches("kB").trim().parse::<usize>().unwrap_or(0);
        }
    }
    kib
}

fn constant<'g>(g: &'g ir::Graph, name: &str) -> &'g ir::ConstData {
    let v = g.find(name).unwrap_or_else(|| panic!("no value {name}"));
    match &g.nodes.iter().find(|n| n.output == v).expect("producer").op {
        Op::Constant(c) => c,
        other => panic!("{name} is {other:?}"),
    }
}

/// A file-mapped weight gives its pages back (the packed copy is what runs),
/// and still reads the same afterwards: the pages come back from the file.
#[test]
fn mapped_weights_give_their_pages_back_and_read_the_same() {
    let dir = tmp_dir("release");
    let path = dir.join("model.onnx");
    let vals: Vec<f32> = (0..(1 << 20)).map(|i| (i % 1000) as f32 * 0.25).collect();
    let m = model(
        vec![node("Add", &["x", "w"], &["y"], vec![])],
        vec![value_info("x", data_type::FLOAT, &[Dim::P("n"), Dim::V(1 << 20)])],
        &["y"],
        vec![f32_tensor("w", &[1 << 20], &vals)],
        17,
    );
    std::fs::write(&path, encode(&m)).expect("write");
    let g = import_file(&path, &ImportOptions::new()).expect("import");
    let w = constant(&g, "w");
    assert!(w.is_mapped(), "raw data in the model file is a window into its mapping");
    let sum = |c: &ir::ConstData| c.bytes().iter().map(|b| *b as u64).sum::<u64>();
    let before = sum(w);
    let touched = resident_kib(&path);
    assert!(touched >= 4000, "reading the 4 MiB weight made only {touched} KiB resident");
    w.release_pages();
    let released = resident_kib(&path);
    assert!(released <= 64, "{released} KiB of the model file still resident after release (was {touched})");
    assert_eq!(sum(w), before, "the weight reads differently after its pages were given back");
    let y = reference::run(
        &g,
        &[("x", Tensor::new(vec![1, 1 << 20], Elems::F32(vec![1.0; 1 << 20])).expect("x"))],
    )
    .expect("run");
    let Elems::F32(y) = y[0].1.elems() else { panic!("dtype") };
    assert!(y.iter().zip(&vals).all(|(a, b)| *a == b + 1.0), "wrong values after release");
    // A constant with memory of its own is not mapped; releasing it does nothing.
    let own = ir::ConstData::from_tensor(&Tensor::new(vec![2], Elems::F32(vec![1.0, 2.0])).expect("t"));
    assert!(!own.is_mapped());
    own.release_pages();
    assert_eq!(own.to_tensor().to_f64_vec(), vec![1.0, 2.0]);
}
