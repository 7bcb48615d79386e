//! anyshape: compile a model with symbolic dims once, run any shape.
//!
//! ```no_run
//! use anyshape::{Model, LoadOptions, Tensor, Elems};
//! let model = Model::load("bert.onnx", &LoadOptions::new().dim("seq", 1, 512))?;
//! let ids = Tensor::new(vec![1, 3], Elems::I64(vec![101, 2023, 102]))?;
//! let compiled = model.compile(&anyshape::CompileOptions::new())?;
//! let outputs = compiled.run(&[("input_ids", ids.clone())])?;
//! let oracle = model.interpret(&[("input_ids", ids)])?;
//! # Ok::<(), anyshape::Error>(())
//! ```
//!
//! [`Model::compile`] turns a model into a [`CompiledModel`]: every fusion
//! group lowered to a tensor program and generated as machine code (or run on
//! the contraction engine), with its execution and buffer plans; its `run`
//! serves any shape the symbols allow. [`Model::interpret`] runs the reference
//! interpreter (the oracle). What the compiler made of a model at each stage
//! is in [`inspect`].
//!
//! A compiled model saves as an artifact ([`CompiledModel::save`]) that
//! [`CompiledModel::load`] reads back without compiling (weights mapped, code
//! relocated; the runtime crate alone does it, without LLVM):
//!
//! ```no_run
//! use anyshape::{ArtifactOptions, CompileOptions, CompiledModel, LoadOptions, Model};
//! let model = Model::load("bert.onnx", &LoadOptions::new().dim("seq", 1, 512))?;
//! model.compile(&CompileOptions::new())?.save("bert.anyshape")?;
//! let loaded = CompiledModel::load("bert.anyshape", &ArtifactOptions::new())?;
//! # Ok::<(), anyshape::Error>(())
//! ```

use std::path::Path;
use std::sync::Arc;

pub use ir::{DType, Elems, Tensor, TensorData, TensorType, TensorView, ViewElement};
/// A pool of threads that compiled models run on; one may be shared by several
/// models (`CompileOptions::pool`, `ArtifactOptions::pool`).
pub use kernels::ThreadPool;
pub use onnx::DIM_MAX;

/// What the compiler makes of a model at each stage, for inspection and tests
/// (`anyshape inspect`): the IR, the rewrites' report, the fusion groups and
/// the lowered plan with its text form. These are the compiler's own types;
/// they change as it does.
pub mod inspect {
    pub use ir::Graph;
    pub use passes::{FusionPlan, GroupKind, Report as RewriteReport};
    pub use plan::{print_plan, ModelPlan, StepKind};
}
use inspect::{FusionPlan, Graph};
pub use runtime::is_artifact;
pub use runtime::npy;
pub use runtime::{
    ArtifactError, ArtifactOptions, CodeStats, CompiledModel, KeyChunks, Profile, Recycler, RunError,
    FORMAT_VERSION,
};
pub use sym::{Range, SymExpr};

/// Everything that can go wrong, each with a message that says what and where.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Import(#[from] onnx::OnnxError),
    /// The reference interpreter failed (bad inputs, or a defect).
    #[error(transparent)]
    Interpret(#[from] reference::RefError),
    #[error(transparent)]
    Tensor(#[from] ir::IrError),
    #[error(transparent)]
    Rewrite(#[from] passes::PassError),
    #[error(transparent)]
    Lower(#[from] lower::LowerError),
    #[error("code generation: {0}")]
    Codegen(#[from] codegen::CodegenError),
    /// A compiled model's call, or loading an artifact, failed.
    #[error(transparent)]
    Run(#[from] runtime::RunError),
    #[error(transparent)]
    Npy(#[from] runtime::npy::NpyError),
    /// ptxas could not be run, or refused a kernel's PTX.
    #[error("ptxas: {0}")]
    Ptxas(String),
}

impl Error {
    /// Whether the error is the user's input (bad model, shapes, files) rather
    /// than a defect in anyshape.
    pub fn is_user_error(&self) -> bool {
        !matches!(self, Error::Interpret(e) if e.is_internal())
            && !matches!(self, Error::Import(onnx::OnnxError::Internal(_)))
            && !matches!(
                self,
                Error::Lower(lower::LowerError::Internal(_)) | Error::Codegen(_) | Error::Ptxas(_)
            )
            && !matches!(self, Error::Run(e) if !e.is_user_error())
    }

    /// Whether the model uses what anyshape does not support (an operator, an
    /// opset, an element type or a value kind): the model's limit, neither the
    /// caller's input to a call nor a defect. (`is_user_error` is true of it
    /// too: the CLI reports it as the user's to fix.)
    pub fn is_unsupported_model(&self) -> bool {
        use onnx::OnnxError as O;
        matches!(
            self,
            Error::Import(
                O::UnsupportedOp { .. }
                    | O::UnsupportedOpset { .. }
                    | O::UnsupportedType { .. }
                    | O::UnsupportedDType { .. }
            )
        )
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

/// The machine `opts` compile for: the host, or its AVX2 subset.
fn target_of(opts: &CompileOptions) -> Result<kernels::Target, codegen::CodegenError> {
    let host = kernels::Target::detect();
    match opts.isa {
        Isa::Host => Ok(host),
        Isa::Avx2 => host.avx2_only().ok_or_else(|| {
            codegen::CodegenError::Unsupported("AVX2 code needs a machine with AVX2 and FMA".into())
        }),
    }
}

impl Model {
    /// Load an ONNX model file.
    pub fn load(path: impl AsRef<Path>, opts: &LoadOptions) -> Result<Model, Error> {
        Model::from_graph(onnx::import_file(path.as_ref(), &opts.import)?, opts)
    }

    /// Load an ONNX model from bytes (no external data).
    pub fn from_bytes(bytes: &[u8], opts: &LoadOptions) -> Result<Model, Error> {
        Model::from_graph(onnx::import_bytes(bytes, &opts.import)?, opts)
    }

    /// A model from IR (its text form: `ir::parse_graph`); the IR is verified and,
    /// unless `opts` says otherwise, rewritten.
    pub fn from_ir(graph: Graph, opts: &LoadOptions) -> Result<Model, Error> {
        ir::verify(&graph)?;
        Model::from_graph(graph, opts)
    }

    fn from_graph(imported: Graph, opts: &LoadOptions) -> Result<Model, Error> {
        let mut graph = imported.clone();
        let report = if opts.rewrite {
            passes::Pipeline::standard().run(&mut graph)?
        } else {
            passes::Report::default()
        };
        release_folded(&imported, &graph);
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

    /// Run on the reference interpreter (the oracle), on named inputs of any
    /// shape the symbols allow; outputs in model order. Compiled code runs
    /// through [`Model::compile`] and [`CompiledModel::run`].
    pub fn interpret(&self, inputs: &[(&str, Tensor)]) -> Result<Vec<(String, Tensor)>, Error> {
        Ok(reference::run(&self.graph, inputs)?)
    }

    /// [`Model::interpret`], by its old name (`run` now means compiled code).
    #[deprecated(
        since = "0.2.0",
        note = "runs the interpreter: use `Model::interpret`, or `Model::compile` then `run`"
    )]
    pub fn run(&self, inputs: &[(&str, Tensor)]) -> Result<Vec<(String, Tensor)>, Error> {
        self.interpret(inputs)
    }

    /// The model lowered: tensor programs, execution and buffer plans
    /// (`anyshape inspect --stage programs`).
    pub fn lower(&self) -> Result<plan::ModelPlan, Error> {
        self.lower_with(&CompileOptions::default())
    }

    /// [`Model::lower`] as [`Model::compile`] lowers with `opts`.
    pub fn lower_with(&self, opts: &CompileOptions) -> Result<plan::ModelPlan, Error> {
        // Quantized activations are stored as u8 codes where the u8s8 kernels
        // multiply them (they pack their words as they lie); other families
        // would read them a byte at a time.
        // A weight's product stores them too where one cache block takes its K.
        let target = target_of(opts).ok();
        let u8_codes = target
            .as_ref()
            .and_then(|t| opts.int8.types(t).ok())
            .is_some_and(|types| types.first() == Some(&kernels::ElemType::U8S8));
        let codes_depth = match (&target, u8_codes) {
            (Some(t), true) => kernels::schedule::one_block_depth(t, kernels::ElemType::U8S8),
            _ => 0,
        };
        let lo = lower::LowerOptions {
            fuse_attention: opts.fuse_attention,
            u8_codes,
            codes_depth,
            ..Default::default()
        };
        Ok(lower::lower_with(&self.graph, &self.fusion_plan(), &lo)?)
    }

    /// Compile every fusion group to machine code: loop programs generated with
    /// LLVM, matmuls on the contraction engine (its tile measurements from the
    /// tuning cache, measured when absent). The result runs any shape.
    pub fn compile(&self, opts: &CompileOptions) -> Result<CompiledModel, Error> {
        let start = std::time::Instant::now();
        let plan = self.lower_with(opts)?;
        tracing::info!("lowered in {:.0} ms", start.elapsed().as_secs_f64() * 1e3);
        // Integer contractions that did not move to floats exactly
        // (`passes::IntegerMatMulAsFloat`) have no kernel family yet.
        let integer = (self.graph.nodes.iter())
            .filter(|n| matches!(n.op, ir::Op::MatMul { .. } | ir::Op::Conv(_)))
            .filter(|n| !self.graph.ty(n.output).dtype.is_float())
            .count();
        if integer > 0 {
            tracing::warn!(
                "{integer} integer contractions run as loop programs (exact, but far slower than the \
                 contraction engine): their operands are not known to be 8-bit values, or they are too deep \
                 for f32 sums to stay exact"
            );
        }
        let target = target_of(opts)?;
        let pool = match &opts.pool {
            Some(p) => p.clone(),
            None => {
                std::sync::Arc::new(kernels::ThreadPool::new(opts.threads.unwrap_or_else(default_threads)))
            }
        };
        let threads = pool.threads();
        let elem = opts.precision.elem();
        target.check_elem(elem).map_err(|e| {
            codegen::CodegenError::Unsupported(format!("precision {:?}: {e}", opts.precision))
        })?;
        // One kernel family per epilogue the matmuls fuse and type they multiply in:
        // Integer operands in the first of their integer types the options and
        // the target allow (`MatMulStep::integer_types`, which the runtime's
        // dispatcher follows too).
        let int8 = opts
            .int8
            .types(&target)
            .map_err(|e| codegen::CodegenError::Unsupported(format!("int8 kernels {:?}: {e}", opts.int8)))?;
        let family_of = |m: &plan::MatMulStep| {
            let of = m.integer_types().iter().copied().find(|t| int8.contains(t)).unwrap_or(elem);
            (m.epilogue.function(), of)
        };
        let mut families: Vec<(plan::Epilogue, kernels::ElemType)> = Vec::new();
        for s in &plan.steps {
            let f = match &s.kind {
                plan::StepKind::MatMul(m) => family_of(m),
                // Fused attention's products run on the plain family's direct kernels.
                plan::StepKind::Attention(_) => (plan::Epilogue::default(), elem),
                plan::StepKind::Loop { .. } => continue,
            };
            if !families.contains(&f) {
                families.push(f);
            }
        }
        let cache = opts.cache_dir.clone().or_else(codegen::tuning::default_cache_dir);
        let objects = match (&cache, opts.object_cache) {
            (Some(dir), true) => codegen::ObjectCache::in_dir(dir),
            _ => codegen::ObjectCache::none(),
        };
        // The tile measurements and the machine model, once and before the families
        // compile side by side: on a first compile each would otherwise measure
        // them at the same time, disturbing one another, and pick from its own
        // noisy figures.
        let mut elems: Vec<kernels::ElemType> = Vec::new();
        for &(_, e) in &families {
            if !elems.contains(&e) {
                elems.push(e);
            }
        }
        for &e in &elems {
            let (mut rec, _) = codegen::tuning::checked_record(cache.as_deref(), &target, e)?;
            codegen::tuning::machine_model(cache.as_deref(), &target, &pool, &mut rec);
        }
        let progress: Option<codegen::ProgressFn> =
            opts.progress.as_deref().map(|p| p as codegen::ProgressFn);
        // The loop programs and the contraction families compile at the same time.
        let (programs, compiled) = std::thread::scope(|s| {
            let compiled: Vec<_> = families
                .iter()
                .map(|&(e, elem)| {
                    let (target, pool, cache, objects) = (&target, &pool, &cache, &objects);
                    s.spawn(move || {
                        let mut b = codegen::Contraction::builder(target, pool)
                            .elem(elem)
                            .epilogue(e)
                            .cache(cache.as_deref())
                            .objects(objects);
                        if let Some(p) = progress {
                            b = b.progress(p);
                        }
                        b.build()
                    })
                })
                .collect();
            let programs = codegen::compile_programs_with(
                &target,
                &plan.programs,
                "model",
                threads,
                &objects,
                progress.unwrap_or(&|_| {}),
            );
            let compiled: Vec<_> = compiled
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(codegen::CodegenError::Llvm("panicked".into()))))
                .collect();
            (programs, compiled)
        });
        tracing::info!(
            "generated code in {:.0} ms: {} modules from the object cache, {} compiled",
            start.elapsed().as_secs_f64() * 1e3,
            objects.hits(),
            objects.misses()
        );
        let programs = programs?;
        let loops = (0..programs.len()).filter_map(|i| programs.get(i)).collect();
        let splits = (0..programs.len()).map(|i| programs.split(i)).collect();
        let mut code = programs.into_images();
        let mut dispatchers = Vec::with_capacity(families.len());
        for (family, c) in families.into_iter().zip(compiled) {
            let (d, images) = c?.into_parts();
            code.extend(images);
            let d = match opts.measured_dispatch {
                true => {
                    self.measured(d, &pool, family.0, |m| family_of(m) == family, &plan, cache.as_deref())?
                }
                false => d,
            };
            dispatchers.push((family.0, d));
        }
        let io = |v: &[IoInfo]| v.iter().map(|i| (i.name.clone(), i.ty.clone())).collect();
        let parts = runtime::ModelParts {
            plan,
            env: self.graph.env.clone(),
            inputs: io(&self.inputs()),
            outputs: io(&self.outputs()),
            loops,
            splits,
            dispatchers,
            pool,
            code,
            canaries: opts.canaries,
            code_stats: runtime::CodeStats {
                modules_from_cache: objects.hits(),
                modules_compiled: objects.misses(),
            },
            code_target: {
                let (cpu, features) = codegen::code_target(&target);
                let features = match elems.contains(&kernels::ElemType::U8S8) {
                    true => codegen::features_for(kernels::ElemType::U8S8, &features),
                    false => features,
                };
                runtime::CodeTarget::new(&cpu, &features)
            },
        };
        let compiled = CompiledModel::new(parts)?.with_key_chunks(opts.key_chunks);
        tracing::info!("compiled in {:.0} ms", start.elapsed().as_secs_f64() * 1e3);
        Ok(compiled)
    }
}

/// Give back the file-mapped pages of the imported constants that the rewrites
/// replaced (weights that GEMM merging concatenated, values constant folding
/// read): what runs is the rewritten graph, and the pages read back from the
/// file if the imported graph is ever run (see [`ir::MappedFile`]).
fn release_folded(imported: &Graph, rewritten: &Graph) {
    let constants = |g: &Graph| -> Vec<Arc<ir::ConstData>> {
        g.nodes
            .iter()
            .filter_map(|n| match &n.op {
                ir::Op::Constant(c) if c.is_mapped() => Some(c.clone()),
                _ => None,
            })
            .collect()
    };
    let kept: std::collections::HashSet<(usize, usize)> =
        constants(rewritten).iter().map(|c| (c.bytes().as_ptr() as usize, c.bytes().len())).collect();
    for c in constants(imported) {
        if !kept.contains(&(c.bytes().as_ptr() as usize, c.bytes().len())) {
            c.release_pages();
        }
    }
}

/// The weights measured for dispatch: those whose matmul's rows may be few
/// (below `codegen::refine::MODEL_FROM`) and whose size lets a copy be measured
/// (at most 256 MB: a tied LM head of 50k words, whose products at a few dozen
/// rows the model ranks as poorly as the layers').
const MEASURED_MAX_BYTES: usize = 256 << 20;

impl Model {
    /// `d` with a tuned table measured for the weights of `plan` it multiplies
    /// (`in_family`: its epilogue `e`, its type; see `codegen::refine`).
    fn measured(
        &self,
        d: kernels::Dispatcher,
        pool: &kernels::ThreadPool,
        e: plan::Epilogue,
        in_family: impl Fn(&plan::MatMulStep) -> bool,
        plan: &plan::ModelPlan,
        cache: Option<&Path>,
    ) -> Result<kernels::Dispatcher, Error> {
        // A family storing codes runs packed, in one K block: the model's
        // schedules, no measured table (its tuned layouts would cut K).
        if e.codes {
            return Ok(d);
        }
        let dims = plan.dims.exprs();
        let fixed = |s: u32| dims[s as usize].as_const().and_then(|v| usize::try_from(v).ok());
        let mut weights = Vec::new();
        for st in &plan.steps {
            let plan::StepKind::MatMul(mm) = &st.kind else { continue };
            // A convolution's taps are never a tuned class's row-major A.
            // The weights this family multiplies (with its epilogue, in its type).
            if !mm.weight || mm.taps.is_some() || !in_family(mm) {
                continue;
            }
            let (Some(k), Some(n)) = (fixed(mm.k), fixed(mm.n)) else { continue };
            let few_rows = self.graph.env.range(&dims[mm.m as usize]).lo < codegen::refine::MODEL_FROM as i64;
            if !few_rows || k.saturating_mul(n).saturating_mul(4) > MEASURED_MAX_BYTES {
                continue;
            }
            let layout = d.weight_layout(k, n, &runtime::PACK_ROWS).map_err(kernel)?;
            let w = codegen::refine::WeightClass { k, n, layout };
            if !weights.contains(&w) {
                weights.push(w);
            }
        }
        if weights.is_empty() {
            return Ok(d);
        }
        let tuned = codegen::refine::refine(&d, pool, e, &weights, cache)?;
        Ok(d.with_tuned(tuned).map_err(kernel)?)
    }
}

fn kernel(e: kernels::KernelError) -> codegen::CodegenError {
    codegen::CodegenError::Kernel(e.to_string())
}

fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

pub use codegen::Progress;

#[cfg(feature = "gpu")]
pub mod gpu;
pub mod ptxas;

/// The tuning cache folder a compile uses when `CompileOptions::cache_dir` is not
/// set: `$ANYSHAPE_CACHE_DIR`, else `$XDG_CACHE_HOME/anyshape`, else `~/.cache/anyshape`.
pub fn default_cache_dir() -> Option<std::path::PathBuf> {
    codegen::tuning::default_cache_dir()
}

/// What the contractions multiply in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    /// f32 everywhere: the model's own arithmetic.
    #[default]
    F32,
    /// Products of a weight (and the packed activation products) in bf16 with
    /// f32 accumulation (AVX-512 BF16's `vdpbf16ps`), the weights stored packed
    /// as bf16 (half the bytes); everything else f32, fused attention included.
    Bf16,
}

impl Precision {
    fn elem(self) -> kernels::ElemType {
        match self {
            Precision::F32 => kernels::ElemType::F32,
            Precision::Bf16 => kernels::ElemType::Bf16,
        }
    }
}

/// What a quantized model's integer contractions multiply in: those whose
/// operands the graph bounds to u8 and s8 values (a dynamic quantization's, a
/// static one's after a ReLU) in the chosen family; those of other integers
/// of at most 16 bits (a static quantization's signed activations) in i16,
/// unless `Float`. The integer families are exact.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Int8 {
    /// The fastest integer family of the target: u8s8 (VNNI's `vpdpbusd`, four
    /// products a lane) where it has VNNI, i16s8 (AVX2's `vpmaddwd`, two, on
    /// weights of one byte a value) otherwise.
    #[default]
    Auto,
    /// u8s8 (VNNI's `vpdpbusd`); compiling for a machine without VNNI is an error.
    U8S8,
    /// i16s8 on any target: `vpmaddwd` on int8 weights kept as bytes (widened
    /// as they load), i16 for weights that need more bits.
    I16S8,
    /// i16 (`vpmaddwd`, weights as 16-bit integers) on any target.
    I16,
    /// The [`Precision`]'s float family (f32 sums of exact chunks of K).
    Float,
}

impl Int8 {
    /// The integer types products may take on `target` (none: the float family).
    fn types(self, target: &kernels::Target) -> Result<&'static [kernels::ElemType], kernels::KernelError> {
        use kernels::ElemType::{I16, I16S8, U8S8};
        match self {
            Int8::Auto if target.check_elem(U8S8).is_ok() => Ok(&[U8S8, I16S8, I16]),
            Int8::Auto | Int8::I16S8 => Ok(&[I16S8, I16]),
            Int8::I16 => Ok(&[I16]),
            Int8::U8S8 => target.check_elem(U8S8).map(|()| &[U8S8, I16S8, I16][..]),
            Int8::Float => Ok(&[]),
        }
    }
}

impl std::str::FromStr for Int8 {
    type Err = String;
    fn from_str(s: &str) -> Result<Int8, String> {
        match s {
            "auto" => Ok(Int8::Auto),
            "u8s8" => Ok(Int8::U8S8),
            "i16s8" => Ok(Int8::I16S8),
            "i16" => Ok(Int8::I16),
            "float" => Ok(Int8::Float),
            _ => Err(format!("unknown int8 kernels `{s}` (auto, u8s8, i16s8, i16, float)")),
        }
    }
}

/// The instruction set generated code may use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Isa {
    /// Everything the compiling machine has (AVX-512 where it has it), tuned for
    /// its CPU: the fastest code here, and an artifact that loads only on
    /// machines with the same features.
    #[default]
    Host,
    /// AVX2 and FMA only (x86-64-v3): an artifact that runs on any x86-64 CPU
    /// of the last decade, at AVX2's speed.
    Avx2,
}

/// How to compile a model.
#[derive(Clone)]
pub struct CompileOptions {
    threads: Option<usize>,
    pool: Option<std::sync::Arc<kernels::ThreadPool>>,
    isa: Isa,
    precision: Precision,
    int8: Int8,
    cache_dir: Option<std::path::PathBuf>,
    fuse_attention: bool,
    key_chunks: KeyChunks,
    canaries: bool,
    object_cache: bool,
    measured_dispatch: bool,
    progress: Option<std::sync::Arc<dyn Fn(Progress) + Send + Sync>>,
}

impl std::fmt::Debug for CompileOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompileOptions")
            .field("threads", &self.threads)
            .field("pool", &self.pool.as_ref().map(|p| p.threads()))
            .field("isa", &self.isa)
            .field("precision", &self.precision)
            .field("int8", &self.int8)
            .field("cache_dir", &self.cache_dir)
            .field("fuse_attention", &self.fuse_attention)
            .field("key_chunks", &self.key_chunks)
            .field("canaries", &self.canaries)
            .field("object_cache", &self.object_cache)
            .field("measured_dispatch", &self.measured_dispatch)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            threads: None,
            pool: None,
            isa: Isa::Host,
            precision: Precision::F32,
            int8: Int8::Auto,
            cache_dir: None,
            fuse_attention: true,
            key_chunks: KeyChunks::Auto,
            canaries: false,
            object_cache: true,
            measured_dispatch: true,
            progress: None,
        }
    }
}

impl CompileOptions {
    pub fn new() -> CompileOptions {
        CompileOptions::default()
    }
    /// What the contractions multiply in (default f32). [`Precision::Bf16`]
    /// needs AVX-512 BF16; compiling for a machine without it is an error.
    pub fn precision(mut self, p: Precision) -> CompileOptions {
        self.precision = p;
        self
    }
    /// What a quantized model's 8-bit integer contractions multiply in
    /// (default [`Int8::Auto`]: u8s8 with VNNI, i16 without).
    pub fn int8(mut self, int8: Int8) -> CompileOptions {
        self.int8 = int8;
        self
    }
    /// Threads of the model's pool (default: the machine's).
    pub fn threads(mut self, n: usize) -> CompileOptions {
        self.threads = Some(n.max(1));
        self
    }
    /// Run the model on `pool`, which other models may share (as ONNX
    /// Runtime's global thread pool): their calls then take turns kernel by
    /// kernel on the same threads instead of crowding the cores with a pool
    /// each. Its thread count wins over [`Self::threads`]. By default each
    /// compiled model gets a pool of its own.
    pub fn pool(mut self, pool: std::sync::Arc<kernels::ThreadPool>) -> CompileOptions {
        self.pool = Some(pool);
        self
    }
    /// The instruction set of the generated code (default: the host's; `Avx2`
    /// for an artifact to run on other x86-64 machines).
    pub fn isa(mut self, isa: Isa) -> CompileOptions {
        self.isa = isa;
        self
    }
    /// Run attention as one fused kernel per block of query rows (on by
    /// default); off runs it as its three steps (the unfused path, to compare).
    pub fn fuse_attention(mut self, on: bool) -> CompileOptions {
        self.fuse_attention = on;
        self
    }
    /// How fused attention takes its keys: by default whole rows of scores while
    /// they stay in L2 and online softmax over chunks of keys beyond; `Never`
    /// keeps whole rows, `Every(n)` takes chunks of `n` keys at every length.
    pub fn key_chunks(mut self, k: KeyChunks) -> CompileOptions {
        self.key_chunks = k;
        self
    }
    /// Report compile progress to `f` (a progress bar): `Progress::Add(n)` as
    /// work is announced (kernels of each family, modules of loop programs),
    /// `Progress::Done` as each unit compiles, from the compiling threads.
    pub fn progress(mut self, f: impl Fn(Progress) + Send + Sync + 'static) -> CompileOptions {
        self.progress = Some(std::sync::Arc::new(f));
        self
    }
    /// Test mode (off by default): every temporary and output buffer gets a
    /// canary margin on each side, checked after every step, so that a kernel
    /// writing outside its buffers fails the call with an error naming the step
    /// and the buffer instead of corrupting another.
    pub fn canaries(mut self, on: bool) -> CompileOptions {
        self.canaries = on;
        self
    }
    /// Keep every compiled module's object in the cache folder's `objects/`
    /// and take it from there when the same module is compiled again (on by
    /// default): a second compile of a model skips LLVM. Off compiles every
    /// module.
    pub fn object_cache(mut self, on: bool) -> CompileOptions {
        self.object_cache = on;
        self
    }
    /// Measure the best few schedules of each weight matmul at small row counts
    /// (1, 2 and 4, where the analytical model is least reliable), with the
    /// best of each thread count among them, and dispatch by the measurements
    /// there (on by default: 9-10% off BERT-base's and GPT-2's calls at 1-4
    /// tokens on the 2-core development machine, where the model kept the
    /// 768×768 projection on one thread; cached per machine, so only a model's
    /// first compile on a machine measures). Off: the model alone decides.
    pub fn measured_dispatch(mut self, on: bool) -> CompileOptions {
        self.measured_dispatch = on;
        self
    }
    /// The tuning cache folder (default: `$ANYSHAPE_CACHE_DIR`, `$XDG_CACHE_HOME/anyshape`
    /// or `~/.cache/anyshape`).
    pub fn cache_dir(mut self, dir: impl Into<std::path::PathBuf>) -> CompileOptions {
        self.cache_dir = Some(dir.into());
        self
    }
}
