//! The runner itself, as `scripts/test.sh` runs it on onnx's node tests: a
//! case that matches passes, interpreted and compiled; a wrong expected output
//! is a failure and a failing exit; a folder that is not there is an error
//! naming it. (Running these also builds the runner with the workspace's
//! features, which `scripts/test.sh` then runs.)

use std::path::Path;
use std::process::Command;

use onnx::proto::{
    tensor_shape_proto, type_proto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    TensorShapeProto, TypeProto, ValueInfoProto,
};
use prost::Message;

const FLOAT: i32 = 1;

fn value_info(name: &str) -> ValueInfoProto {
    let dim = vec![tensor_shape_proto::Dimension {
        value: Some(tensor_shape_proto::dimension::Value::DimValue(3)),
    }];
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(FLOAT),
                shape: Some(TensorShapeProto { dim }),
            })),
        }),
    }
}

fn tensor(name: &str, vals: &[f32]) -> Vec<u8> {
    TensorProto {
        dims: vec![vals.len() as i64],
        data_type: Some(FLOAT),
        float_data: vals.to_vec(),
        name: Some(name.into()),
        ..Default::default()
    }
    .encode_to_vec()
}

/// A node test case in onnx's layout: `z = x + y` on three floats, with `z`'s
/// expected values.
fn add_case(dir: &Path, z: &[f32]) {
    let model = ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(17) }],
        graph: Some(GraphProto {
            node: vec![NodeProto {
                input: vec!["x".into(), "y".into()],
                output: vec!["z".into()],
                op_type: Some("Add".into()),
                ..Default::default()
            }],
            input: vec![value_info("x"), value_info("y")],
            output: vec![value_info("z")],
            ..Default::default()
        }),
        ..Default::default()
    };
    let data = dir.join("test_data_set_0");
    std::fs::create_dir_all(&data).expect("case folder");
    std::fs::write(dir.join("model.onnx"), model.encode_to_vec()).expect("model");
    std::fs::write(data.join("input_0.pb"), tensor("x", &[1.0, 2.0, 3.0])).expect("x");
    std::fs::write(data.join("input_1.pb"), tensor("y", &[0.5, -2.0, 4.0])).expect("y");
    std::fs::write(data.join("output_0.pb"), tensor("z", z)).expect("z");
}

fn run(node_dir: &Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_anyshape-conformance"))
        .arg(node_dir)
        .arg("--node-compiled")
        .output()
        .expect("the runner starts");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[test]
fn the_runner_passes_fails_and_reports() {
    let root = std::env::temp_dir().join(format!("anyshape-conformance-{}", std::process::id()));
    let (good, bad) = (root.join("good"), root.join("bad"));
    add_case(&good.join("test_add_small"), &[1.5, 0.0, 7.0]);
    add_case(&bad.join("test_add_small"), &[1.5, 0.0, 8.0]);

    let (ok, text) = run(&good);
    assert!(ok, "{text}");
    assert!(text.contains("conformance: 1 passed, 0 failed"), "{text}");
    let (ok, text) = run(&bad);
    assert!(!ok, "a wrong expected output must fail the run:\n{text}");
    assert!(text.contains("0 passed, 1 failed"), "{text}");
    let missing = root.join("missing");
    let (ok, text) = run(&missing);
    assert!(!ok && text.contains("cannot list") && text.contains("missing"), "{text}");
    std::fs::remove_dir_all(&root).ok();
}
