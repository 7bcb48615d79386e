//! ONNX import: the model file is memory-mapped and decoded with `prost`,
//! operators are converted to the IR's primitives (compound ops split), and
//! every value gets a symbolic shape by worklist propagation, with the
//! constraints learned on the way recorded in the `ShapeEnv`.

mod import;
mod load;
pub mod proto;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use import::{import_model, symbol_name, ImportOptions, DIM_MAX, OPSETS};
pub use load::{
    decode_model, dtype_of, held_dtype_of, read_model, read_model_mapped, tensor_data, ExternalData, FileMap,
    Narrow,
};

/// Errors from loading and importing a model. Each names what is wrong and where.
#[derive(Debug, Clone, thiserror::Error)]
pub enum OnnxError {
    #[error("cannot read {}: {source}", path.display())]
    Io { path: PathBuf, source: Arc<std::io::Error> },
    #[error("not a valid ONNX model: {0}")]
    Malformed(String),
    #[error("unsupported operator {domain}::{op} (node '{node}', opset {opset})")]
    UnsupportedOp { op: String, domain: String, node: String, opset: i64 },
    #[error("unsupported opset {version} of the default ONNX domain (supported: {}..={})", OPSETS.start(), OPSETS.end())]
    UnsupportedOpset { version: i64 },
    #[error("{what} is {kind}; only tensors are supported")]
    UnsupportedType { what: String, kind: String },
    #[error("{what} has unsupported element type {dtype}")]
    UnsupportedDType { what: String, dtype: String },
    #[error("node '{node}' ({op}): {msg}")]
    Node { node: String, op: String, msg: String },
    #[error("dim `{name}`: {msg}")]
    BadDim { name: String, msg: String },
    /// A defect in anyshape, not in the model.
    #[error("internal error: {0}")]
    Internal(String),
}

/// Load and import a model file (external-data files are resolved next to it).
pub fn import_file(path: &Path, opts: &ImportOptions) -> Result<ir::Graph, OnnxError> {
    let (model, map) = read_model_mapped(path)?;
    let dir =
        path.parent().map(|p| if p.as_os_str().is_empty() { PathBuf::from(".") } else { p.to_path_buf() });
    import::import_model_with(&model, ExternalData::new(dir).with_model_file(map), opts)
}

/// Import a model held in memory (no external data).
pub fn import_bytes(bytes: &[u8], opts: &ImportOptions) -> Result<ir::Graph, OnnxError> {
    let model = decode_model(bytes::Bytes::copy_from_slice(bytes))?;
    import_model(&model, None, opts)
}
