//! anyshape: compile a model with symbolic dims once, run any shape.
//!
//! ```no_run
//! use anyshape::{Model, LoadOptions, Tensor, Elems};
//! let model = Model::load("bert.onnx", &LoadOptions::new().dim("seq", 1, 512))?;
//! let ids = Tensor::new(vec![1, 3], Elems::I64(vec![101, 2023, 102]))?;
//! let outputs = model.run(&[("input_ids", ids)])?;
//! # Ok::<(), anyshape::Error>(())
//! ```
//!
//! Today `run` executes on the reference interpreter; the compiled pipeline of
//! DESIGN.md (fusion, generated kernels, dispatch) replaces it stage by stage.

pub mod npy;

use std::path::Path;

pub use ir::{DType, Elems, Graph, Tensor, TensorType};
pub use onnx::DIM_MAX;
pub use passes::{FusionPlan, GroupKind, Report as RewriteReport};
pub use sym::{Range, SymExpr};

/// Everything that can go wrong, each with a message that says what and where.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Import(#[from] onnx::OnnxError),
    #[error(transparent)]
    Run(#[from] reference::RefError),
    #[error(transparent)]
    Tensor(#[from] ir::IrError),
    #[error(transparent)]
    Rewrite(#[from] passes::PassError),
    #[error("{0}")]
    Npy(String),
}

impl Error {
    /// Whether the error is the user's input (bad model, shapes, files) rather
    /// than a defect in anyshape.
    pub fn is_user_error(&self) -> bool {
        !matches!(self, Error::Run(e) if e.is_internal())
            && !matches!(self, Error::Import(onnx::OnnxError::Internal(_)))
    }
}

/// How to load a model.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    import: onnx::ImportOptions,
    rewrite: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { import: onnx::ImportOptions::default(), rewrite: true }
    }
}

impl LoadOptions {
    pub fn new() -> LoadOptions {
        LoadOptions::default()
    }
    /// Declare the symbol `name` (an ONNX `dim_param`) to take values in `lo..=hi`.
    pub fn dim(mut self, name: &str, lo: i64, hi: i64) -> LoadOptions {
        self.import = self.import.dim(name, lo, hi);
        self
    }
    /// Make the input `name` a constant with this value: shapes, axes or pads
    /// computed from it become known at compile time, and `run` no longer takes it.
    pub fn freeze(mut self, name: &str, value: &Tensor) -> LoadOptions {
        self.import = self.import.freeze(name, ir::ConstData::from_tensor(value));
        self
    }

    /// Run the graph rewrites after import (on by default); off runs the graph
    /// exactly as imported.
    pub fn rewrite(mut self, on: bool) -> LoadOptions {
        self.rewrite = on;
        self
    }

    /// Declare a symbol with a `Range`.
    pub fn dim_range(mut self, name: &str, range: Range) -> LoadOptions {
        self.import.dims.push((name.to_string(), range));
        self
    }
}

/// A loaded model: the IR with symbolic shapes, ready to run any shape its
/// symbols allow.
#[derive(Debug)]
pub struct Model {
    /// The graph as imported.
    imported: Graph,
    /// The graph after the rewrites (what runs).
    graph: Graph,
    report: passes::Report,
}

/// A model input or output as the user sees it.
#[derive(Clone, Debug)]
pub struct IoInfo {
    pub name: String,
    pub ty: TensorType,
}

impl Model {
    /// Load an ONNX model file.
    pub fn load(path: impl AsRef<Path>, opts: &LoadOptions) -> Result<Model, Error> {
        Model::compile(onnx::import_file(path.as_ref(), &opts.import)?, opts)
    }

    /// Load an ONNX model from bytes (no external data).
    pub fn from_bytes(bytes: &[u8], opts: &LoadOptions) -> Result<Model, Error> {
        Model::compile(onnx::import_bytes(bytes, &opts.import)?, opts)
    }

    fn compile(imported: Graph, opts: &LoadOptions) -> Result<Model, Error> {
        let mut graph = imported.clone();
        let report = if opts.rewrite {
            passes::Pipeline::standard().run(&mut graph)?
        } else {
            passes::Report::default()
        };
        Ok(Model { imported, graph, report })
    }

    /// The IR that runs, with symbolic shapes and the `ShapeEnv`.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The IR as imported, before any rewrite.
    pub fn imported(&self) -> &Graph {
        &self.imported
    }

    /// What the rewrites did.
    pub fn rewrite_report(&self) -> &passes::Report {
        &self.report
    }

    /// The rewritten graph cut into fusion groups (one future kernel each).
    pub fn fusion_plan(&self) -> FusionPlan {
        passes::fuse(&self.graph)
    }

    /// A fusion plan as text (`anyshape inspect --stage fusion`).
    pub fn fusion_text(&self, plan: &FusionPlan) -> String {
        passes::print_plan(&self.graph, plan)
    }

    /// The imported IR in its text form (what `anyshape inspect --stage shapes` prints).
    pub fn ir_text(&self) -> String {
        ir::print_graph(&self.imported)
    }

    pub fn inputs(&self) -> Vec<IoInfo> {
        self.io(&self.graph.inputs)
    }

    /// The rewritten IR in its text form (`anyshape inspect --stage rewrites`).
    pub fn ir_text_rewritten(&self) -> String {
        ir::print_graph(&self.graph)
    }

    pub fn outputs(&self) -> Vec<IoInfo> {
        self.io(&self.graph.outputs)
    }

    fn io(&self, vs: &[ir::ValueId]) -> Vec<IoInfo> {
        vs.iter()
            .map(|v| IoInfo { name: self.graph.name(*v).to_string(), ty: self.graph.ty(*v).clone() })
            .collect()
    }

    /// Run on named inputs of any shape the symbols allow; outputs in model order.
    pub fn run(&self, inputs: &[(&str, Tensor)]) -> Result<Vec<(String, Tensor)>, Error> {
        Ok(reference::run(&self.graph, inputs)?)
    }
}
