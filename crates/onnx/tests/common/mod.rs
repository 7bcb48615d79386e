//! A small builder of ONNX models for tests.
#![allow(dead_code)]

use anyshape_onnx::proto::*;

pub enum Dim {
    V(i64),
    P(&'static str),
}

pub fn value_info(name: &str, elem: i32, dims: &[Dim]) -> ValueInfoProto {
    use tensor_shape_proto::dimension::Value;
    let dim = dims
        .iter()
        .map(|d| tensor_shape_proto::Dimension {
            value: Some(match d {
                Dim::V(v) => Value::DimValue(*v),
                Dim::P(p) => Value::DimParam(p.to_string()),
            }),
        })
        .collect();
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(elem),
                shape: Some(TensorShapeProto { dim }),
            })),
        }),
    }
}

pub fn node(op: &str, inputs: &[&str], outputs: &[&str], attrs: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        name: Some(format!("{op}_{}", outputs.first().copied().unwrap_or_default())),
        op_type: Some(op.into()),
        attribute: attrs,
        ..Default::default()
    }
}

pub fn attr_int(name: &str, v: i64) -> AttributeProto {
    AttributeProto { name: Some(name.into()), r#type: Some(2), i: Some(v), ..Default::default() }
}

pub fn attr_ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto { name: Some(name.into()), r#type: Some(7), ints: v.to_vec(), ..Default::default() }
}

pub fn i64_tensor(name: &str, dims: &[i64], vals: &[i64]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(data_type::INT64),
        int64_data: vals.to_vec(),
        ..Default::default()
    }
}

pub fn f32_tensor(name: &str, dims: &[i64], vals: &[f32]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(data_type::FLOAT),
        raw_data: Some(vals.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>().into()),
        ..Default::default()
    }
}

pub fn model(
    nodes: Vec<NodeProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: &[&str],
    inits: Vec<TensorProto>,
    opset: i64,
) -> ModelProto {
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(opset) }],
        graph: Some(GraphProto {
            node: nodes,
            input: inputs,
            output: outputs
                .iter()
                .map(|o| ValueInfoProto { name: Some(o.to_string()), r#type: None })
                .collect(),
            initializer: inits,
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn encode(m: &ModelProto) -> Vec<u8> {
    prost::Message::encode_to_vec(m)
}

pub fn tmp_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("anyshape-onnx-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("tmp dir");
    d
}

pub fn attr_string(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(3),
        s: Some(v.as_bytes().to_vec()),
        ..Default::default()
    }
}

/// An 8-bit tensor (`data_type::INT8` or `UINT8`) of raw bytes.
pub fn byte_tensor(name: &str, elem: i32, dims: &[i64], vals: &[u8]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(elem),
        raw_data: Some(vals.to_vec().into()),
        ..Default::default()
    }
}
