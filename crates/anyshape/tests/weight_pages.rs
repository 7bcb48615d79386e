//! A compiled model does not keep its weights resident twice: once a weight is
//! packed, the pages of the model file that held it are given back (they read
//! back from the file if the interpreter runs the graph again). Alone in its
//! test binary: it reads this process's mappings of a file it writes.

use std::path::Path;

use anyshape::{CompileOptions, Elems, LoadOptions, Model, Tensor};
use onnx::proto::{
    data_type, tensor_shape_proto, type_proto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto,
    TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
};

/// Resident KiB of this process's mappings of `path` (Linux's smaps; None elsewhere).
fn resident_kib(path: &Path) -> Option<usize> {
    let canon = std::fs::canonicalize(path).ok()?;
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let (mut ours, mut kib) = (false, 0);
    for l in smaps.lines() {
        if l.split_whitespace().next().is_some_and(|f| f.contains('-') && !f.ends_with(':')) {
            ours = l.ends_with(canon.to_str()?);
        } else if let (true, Some(v)) = (ours, l.strip_prefix("Rss:")) {
            kib += v.trim().trim_end_matches("kB").trim().parse::<usize>().ok()?;
        }
    }
    Some(kib)
}

fn f32_input(name: &str, dims: &[Result<i64, &str>]) -> ValueInfoProto {
    use tensor_shape_proto::dimension::Value;
    let dim = dims
        .iter()
        .map(|d| tensor_shape_proto::Dimension {
            value: Some(match d {
                Ok(v) => Value::DimValue(*v),
                Err(p) => Value::DimParam(p.to_string()),
            }),
        })
        .collect();
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(data_type::FLOAT),
                shape: Some(TensorShapeProto { dim }),
            })),
        }),
    }
}

fn weight(name: &str, dims: &[i64], seed: u32) -> TensorProto {
    let n: i64 = dims.iter().product();
    let vals = (0..n as u32).map(|i| ((i.wrapping_mul(2654435761) ^ seed) % 2001) as f32 / 1000.0 - 1.0);
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(data_type::FLOAT),
        raw_data: Some(vals.flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>().into()),
        ..Default::default()
    }
}

fn node(op: &str, inputs: &[&str], output: &str) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        name: Some(format!("{op}_{output}")),
        op_type: Some(op.into()),
        ..Default::default()
    }
}

#[test]
fn packed_weights_leave_the_model_file_pages() {
    // y = relu(x·W1 + b)·W2: two 4 MiB weights, a bias read by the epilogue.
    let (k, n) = (1024, 1024);
    let m = ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(17) }],
        graph: Some(GraphProto {
            node: vec![
                node("MatMul", &["x", "w1"], "h"),
                node("Add", &["h", "b"], "hb"),
                node("Relu", &["hb"], "r"),
                node("MatMul", &["r", "w2"], "y"),
            ],
            input: vec![f32_input("x", &[Err("rows"), Ok(k)])],
            output: vec![ValueInfoProto { name: Some("y".into()), r#type: None }],
            initializer: vec![weight("w1", &[k, n], 1), weight("b", &[n], 2), weight("w2", &[n, k], 3)],
            ..Default::default()
        }),
        ..Default::default()
    };
    let dir = std::env::temp_dir().join(format!("anyshape-weight-pages-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let path = dir.join("model.onnx");
    std::fs::write(&path, prost::Message::encode_to_vec(&m)).expect("write");
    let file_kib = std::fs::metadata(&path).expect("size").len() as usize / 1024;

    let model = Model::load(&path, &LoadOptions::new().dim("rows", 1, 64)).expect("loads");
    let compiled = model.compile(&CompileOptions::new().threads(2)).expect("compiles");
    let Some(resident) = resident_kib(&path) else {
        eprintln!("skipped: no /proc/self/smaps");
        return;
    };
    // The weights were read to pack them; what stays is at most the pages of the
    // protobuf's headers and the bias (4 KiB), not the 8 MiB of weights.
    assert!(
        resident <= 64,
        "{resident} KiB of the {file_kib} KiB model file resident after compiling (the weights twice)"
    );

    // The packed copies compute what the graph (reading the file again) computes.
    for rows in [1usize, 7, 64] {
        let x: Vec<f32> = (0..rows * k as usize).map(|i| ((i * 7919) % 211) as f32 / 105.0 - 1.0).collect();
        let x = Tensor::new(vec![rows, k as usize], Elems::F32(x)).expect("x");
        let got = compiled.run(&[("x", x.clone())]).expect("runs");
        let want = model.interpret(&[("x", x)]).expect("interprets");
        let (Elems::F32(g), Elems::F32(w)) = (got[0].1.elems(), want[0].1.elems()) else { panic!("dtype") };
        let err = g.iter().zip(w).map(|(a, b)| (a - b).abs() as f64).fold(0.0, f64::max);
        let scale = w.iter().map(|v| v.abs() as f64).fold(1.0, f64::max);
        assert!(err <= 1e-4 * scale, "rows={rows}: max error {err} (scale {scale})");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
