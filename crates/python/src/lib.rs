//! `anyshape._anyshape`: the extension module under the Python package
//! (`python/anyshape`). A `Session` compiles an ONNX model once and runs it on
//! numpy arrays (read in place) at any shape its symbols allow, with the GIL
//! released while it runs; the Python layer (`anyshape.InferenceSession`)
//! gives it ONNX Runtime's interface. Errors become Python exceptions:
//! `InvalidArgument` (a `ValueError`) for the user's input, naming the input,
//! the dim and the rule as the CLI does; `UnsupportedModel` (an
//! `AnyshapeError`) for a model that uses what anyshape does not support (an
//! operator, naming it and its node); `AnyshapeError` for the rest.

use std::collections::HashMap;

use anyshape::{
    ArtifactOptions, CompileOptions, CompiledModel, Elems, LoadOptions, Model, Tensor, TensorType, TensorView,
};
use ir::DType;
use numpy::{
    PyArray1, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

create_exception!(_anyshape, AnyshapeError, PyException, "An error of anyshape's.");
create_exception!(
    _anyshape,
    InvalidArgument,
    PyValueError,
    "The user's input is wrong: a model file, a feed's name, dtype or shape."
);

create_exception!(
    _anyshape,
    UnsupportedModel,
    AnyshapeError,
    "The model uses what anyshape does not support: an operator (named with its node), an opset, an element type."
);

/// The exception for `e`: the model's limit (unsupported), the user's (bad
/// model file, feeds, shapes) or anyshape's own.
fn to_py(e: impl Into<anyshape::Error>) -> PyErr {
    let e = e.into();
    if matches!(e, anyshape::Error::Run(anyshape::RunError::Device(_))) {
        // No driver or device, out of device memory, a fault: not the caller's argument.
        AnyshapeError::new_err(e.to_string())
    } else if e.is_unsupported_model() {
        UnsupportedModel::new_err(e.to_string())
    } else if e.is_user_error() {
        InvalidArgument::new_err(e.to_string())
    } else {
        AnyshapeError::new_err(e.to_string())
    }
}

fn invalid(msg: String) -> PyErr {
    InvalidArgument::new_err(msg)
}

/// A model: compiled (or loaded from an artifact), or run on the reference
/// interpreter (the oracle, for tests).
#[pyclass(frozen, module = "anyshape._anyshape")]
struct Session {
    engine: Engine,
    inputs: Vec<(String, TensorType)>,
    outputs: Vec<(String, TensorType)>,
}

enum Engine {
    Compiled(Box<CompiledModel>),
    Interpreted(Box<Model>),
    /// On NVIDIA GPU 0, through the driver.
    Cuda(Box<anyshape::gpu::GpuModel<anyshape::gpu::CudaDevice>>, GpuSource),
    /// The GPU's kernels on the host emulator (tests).
    GpuEmulator(Box<anyshape::gpu::GpuModel<anyshape::gpu::HostDevice>>, GpuSource),
}

/// What a GPU session saves: the model (an artifact for Hopper and every
/// other supported GPU built when saved, with cubins where ptxas is found),
/// or the artifact it was loaded from.
enum GpuSource {
    Model(Box<Model>),
    Artifact(Box<anyshape::gpu::GpuArtifact>),
}

impl Session {
    fn compiled(model: CompiledModel) -> Session {
        let (inputs, outputs) = (model.inputs().to_vec(), model.outputs().to_vec());
        Session { engine: Engine::Compiled(Box::new(model)), inputs, outputs }
    }
}

fn io_list(io: Vec<anyshape::IoInfo>) -> Vec<(String, TensorType)> {
    io.into_iter().map(|i| (i.name, i.ty)).collect()
}

/// `(name, shape, dtype)` with each dim an `int` or the symbol's expression.
type Described = (String, Vec<Py<PyAny>>, String);

fn describe(py: Python<'_>, io: &[(String, TensorType)]) -> PyResult<Vec<Described>> {
    io.iter()
        .map(|(name, ty)| {
            let dims = ty
                .shape
                .iter()
                .map(|d| -> PyResult<Py<PyAny>> {
                    Ok(match d.as_const() {
                        Some(v) => v.into_pyobject(py)?.into_any().unbind(),
                        None => d.to_string().into_pyobject(py)?.into_any().unbind(),
                    })
                })
                .collect::<PyResult<_>>()?;
            Ok((name.clone(), dims, numpy_name(ty.dtype).to_string()))
        })
        .collect()
}

/// numpy's name for a dtype.
fn numpy_name(dt: DType) -> &'static str {
    match dt {
        DType::F32 => "float32",
        DType::F64 => "float64",
        DType::F16 => "float16",
        // (numpy has none; no model's input or output is one.)
        DType::BF16 => "bfloat16",
        DType::I8 => "int8",
        DType::U8 => "uint8",
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::Bool => "bool",
    }
}

/// A feed borrowed for a run: numpy's read-only borrow of the array, which
/// keeps it alive and refuses writable borrows from Rust meanwhile.
enum Held<'py> {
    F32(PyReadonlyArrayDyn<'py, f32>),
    F64(PyReadonlyArrayDyn<'py, f64>),
    /// float16, viewed as its bits.
    F16(PyReadonlyArrayDyn<'py, u16>),
    I8(PyReadonlyArrayDyn<'py, i8>),
    U8(PyReadonlyArrayDyn<'py, u8>),
    I32(PyReadonlyArrayDyn<'py, i32>),
    I64(PyReadonlyArrayDyn<'py, i64>),
    Bool(PyReadonlyArrayDyn<'py, bool>),
}

impl Held<'_> {
    /// The elements in place, as the runtime reads them.
    fn view<'a>(&'a self, name: &str, shape: &'a [usize]) -> PyResult<TensorView<'a>> {
        let bad = |e: &dyn std::fmt::Display| invalid(format!("input '{name}': {e}"));
        macro_rules! of {
            ($a:expr) => {{
                let s = $a.as_slice().map_err(|e| bad(&e))?;
                TensorView::of(shape, s).map_err(|e| bad(&e))
            }};
        }
        match self {
            Held::F32(a) => of!(a),
            Held::F64(a) => of!(a),
            Held::F16(a) => of!(a),
            Held::I8(a) => of!(a),
            Held::U8(a) => of!(a),
            Held::I32(a) => of!(a),
            Held::I64(a) => of!(a),
            Held::Bool(a) => of!(a),
        }
    }
}

/// A feed checked against the model's input (`want`): a C-contiguous numpy
/// array of its dtype, to be read in place.
fn hold<'py>(name: &str, value: &Bound<'py, PyAny>, want: DType) -> PyResult<(Vec<usize>, Held<'py>)> {
    let arr = value
        .cast::<PyUntypedArray>()
        .map_err(|_| invalid(format!("input '{name}': expected a numpy array, got {}", type_name(value))))?;
    let got = arr.dtype().to_string();
    if got != numpy_name(want) {
        return Err(invalid(format!("input '{name}': expected dtype {}, got {got}", numpy_name(want))));
    }
    if !arr.is_c_contiguous() {
        return Err(invalid(format!(
            "input '{name}' is not C-contiguous: pass numpy.ascontiguousarray(...) of it"
        )));
    }
    let shape = arr.shape().to_vec();
    let bad = |e: &dyn std::fmt::Display| invalid(format!("input '{name}': {e}"));
    macro_rules! borrow {
        ($v:expr, $t:ty) => {
            $v.cast::<PyArrayDyn<$t>>().map_err(|e| bad(&e))?.try_readonly().map_err(|e| bad(&e))?
        };
    }
    let held = match want {
        DType::F32 => Held::F32(borrow!(value, f32)),
        DType::F64 => Held::F64(borrow!(value, f64)),
        DType::F16 => {
            // The same memory as 16-bit integers (numpy's view: no copy).
            let bits = value.call_method1("view", ("uint16",))?;
            Held::F16(borrow!(bits, u16))
        }
        DType::BF16 => return Err(invalid(format!("input '{name}' is bf16, which numpy has no type for"))),
        DType::I8 => Held::I8(borrow!(value, i8)),
        DType::U8 => Held::U8(borrow!(value, u8)),
        DType::I32 => Held::I32(borrow!(value, i32)),
        DType::I64 => Held::I64(borrow!(value, i64)),
        DType::Bool => Held::Bool(borrow!(value, bool)),
    };
    Ok((shape, held))
}

fn type_name(v: &Bound<'_, PyAny>) -> String {
    v.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "an object".into())
}

/// A compiled model's large output, owned by its numpy array (its base): when
/// the array's last reference goes, the elements go back to the model for a
/// later call's outputs (`CompiledModel::recycle`).
#[pyclass(frozen, module = "anyshape._anyshape")]
struct OutputMemory {
    tensor: Tensor,
    recycler: anyshape::Recycler,
}

impl Drop for OutputMemory {
    fn drop(&mut self) {
        let t = std::mem::replace(&mut self.tensor, Tensor::scalar_f32(0.0));
        self.recycler.give(t);
    }
}

/// A compiled model's output as a numpy array, its elements handed back to the
/// model when the array is freed (when the model keeps such outputs).
fn recycled_array_of(py: Python<'_>, t: Tensor, recycler: &anyshape::Recycler) -> PyResult<Py<PyAny>> {
    if !anyshape::Recycler::keeps(&t) || t.dtype() == DType::BF16 {
        return array_of(py, t);
    }
    let shape = numpy::ndarray::IxDyn(t.shape());
    let memory = Bound::new(py, OutputMemory { tensor: t, recycler: recycler.clone() })?;
    let owner = memory.clone().into_any();
    let held = &memory.get().tensor;
    macro_rules! lend {
        ($v:expr) => {{
            let view = numpy::ndarray::ArrayViewD::from_shape(shape, $v.as_slice())
                .map_err(|e| AnyshapeError::new_err(e.to_string()))?;
            // SAFETY: the elements are `memory`'s tensor's, which nothing changes or
            // moves while `memory` lives (frozen); the array holds `memory` as its base.
            unsafe { numpy::PyArrayDyn::borrow_from_array(&view, owner) }.into_any()
        }};
    }
    Ok(match held.elems() {
        Elems::F32(v) => lend!(v),
        Elems::F64(v) => lend!(v),
        Elems::F16(v) => lend!(v).call_method1("view", ("float16",))?,
        Elems::BF16(_) => return Err(AnyshapeError::new_err("internal error: a bf16 output lent as it is")),
        Elems::I8(v) => lend!(v),
        Elems::U8(v) => lend!(v),
        Elems::I32(v) => lend!(v),
        Elems::I64(v) => lend!(v),
        Elems::Bool(v) => lend!(v),
    }
    .unbind())
}

/// An output as a numpy array that owns the tensor's elements (no copy).
fn array_of(py: Python<'_>, t: Tensor) -> PyResult<Py<PyAny>> {
    let shape = t.shape().to_vec();
    macro_rules! give {
        ($v:expr) => {
            PyArray1::from_vec(py, $v).reshape(shape)?.into_any().unbind()
        };
    }
    Ok(match t.into_elems() {
        Elems::F32(v) => give!(v),
        Elems::F64(v) => give!(v),
        Elems::F16(v) => {
            // Half floats: the bits, viewed as float16.
            let a = PyArray1::from_vec(py, v).reshape(shape)?;
            a.call_method1("view", ("float16",))?.unbind()
        }
        // numpy has no bfloat16: the f32 values they are.
        Elems::BF16(v) => give!(v.iter().map(|x| ir::bf16_to_f32(*x)).collect::<Vec<f32>>()),
        Elems::I8(v) => give!(v),
        Elems::U8(v) => give!(v),
        Elems::I32(v) => give!(v),
        Elems::I64(v) => give!(v),
        Elems::Bool(v) => give!(v),
    })
}

#[pymethods]
impl Session {
    /// Compile the ONNX model at `path`, or load the compiled artifact there
    /// (written by `save` or `anyshape compile`). `dims` bounds symbols (`{"seq":
    /// (1, 512)}`; an artifact's are fixed), `threads` the threads that run it
    /// (default: every core; an artifact's: those it was compiled with).
    /// `interpret`: run on the reference interpreter instead (slow; the oracle
    /// tests compare with). `device`: `"cpu"`, `"cuda"` (NVIDIA GPU 0) or
    /// `"gpu-emulator"` (the GPU's kernels on this machine's threads).
    /// `precision`: what a CPU model's contractions multiply in, `"f32"` or
    /// `"bf16"` (weights stored as bf16, AVX-512 BF16 products, f32 sums).
    /// `int8`: what a quantized model's 8-bit products multiply in, `"auto"`
    /// (u8s8 with VNNI, i16s8 without), `"u8s8"`, `"i16s8"`, `"i16"` or `"float"`
    /// (`precision`'s family); all exact.
    #[new]
    #[pyo3(signature = (path, dims = None, threads = None, interpret = false, pool = None, device = "cpu", precision = "f32", int8 = "auto"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: std::path::PathBuf,
        dims: Option<HashMap<String, (i64, i64)>>,
        threads: Option<usize>,
        interpret: bool,
        pool: Option<Bound<'_, ThreadPool>>,
        device: &str,
        precision: &str,
        int8: &str,
    ) -> PyResult<Self> {
        if !matches!(device, "cpu" | "cuda" | "gpu-emulator") {
            return Err(invalid(format!("device='{device}': expected 'cpu', 'cuda' or 'gpu-emulator'")));
        }
        let precision = match precision {
            "f32" => anyshape::Precision::F32,
            "bf16" => anyshape::Precision::Bf16,
            other => return Err(invalid(format!("precision='{other}': expected 'f32' or 'bf16'"))),
        };
        let int8: anyshape::Int8 = int8.parse().map_err(invalid)?;
        if (precision != anyshape::Precision::F32 || int8 != anyshape::Int8::Auto)
            && (device != "cpu" || interpret || anyshape::is_artifact(&path))
        {
            return Err(invalid(
                "precision and int8 apply when compiling an ONNX model for the CPU (not to an artifact, \
                 interpret or a GPU)"
                    .into(),
            ));
        }
        if device != "cpu"
            && (interpret || threads.is_some() || pool.is_some() || anyshape::is_artifact(&path))
        {
            return Err(invalid(format!(
                "device='{device}' runs on the GPU: interpret, threads, pool and CPU artifacts are for \
                 device='cpu'"
            )));
        }
        if anyshape::gpu::is_gpu_artifact(&path) {
            if device == "cpu" || dims.is_some() {
                return Err(invalid(format!(
                    "{}: a GPU artifact runs with device='cuda' (or 'gpu-emulator'), its dims as compiled",
                    path.display()
                )));
            }
            return py.detach(|| {
                let a = anyshape::gpu::GpuArtifact::load(&path).map_err(|e| to_py(runtime_error(e)))?;
                let (inputs, outputs) = (a.inputs.clone(), a.outputs.clone());
                let source = GpuSource::Artifact(Box::new(a.clone()));
                let engine = if device == "cuda" {
                    Engine::Cuda(Box::new(a.open(0).map_err(to_py)?), source)
                } else {
                    Engine::GpuEmulator(
                        Box::new(anyshape::gpu::host_model_of(a, None).map_err(to_py)?),
                        source,
                    )
                };
                Ok(Session { engine, inputs, outputs })
            });
        }
        if threads == Some(0) {
            return Err(invalid("threads must be at least 1".into()));
        }
        let pool = pool.map(|p| p.get().pool.clone());
        if let (Some(p), Some(t)) = (&pool, threads) {
            if p.threads() != t {
                return Err(invalid(format!("threads={t} but the pool has {} threads", p.threads())));
            }
        }
        if anyshape::is_artifact(&path) {
            if interpret {
                return Err(invalid(format!(
                    "{}: a compiled artifact has no graph to interpret",
                    path.display()
                )));
            }
            if dims.is_some() {
                return Err(invalid(format!(
                    "{}: a compiled artifact's dims are fixed; dims apply to an ONNX model",
                    path.display()
                )));
            }
            let mut opts = ArtifactOptions::new();
            if let Some(t) = threads {
                opts = opts.threads(t);
            }
            if let Some(p) = pool {
                opts = opts.pool(p);
            }
            return py.detach(|| {
                let model = CompiledModel::load(&path, &opts).map_err(to_py)?;
                Ok(Session::compiled(model))
            });
        }
        let mut load = LoadOptions::new();
        for (name, (lo, hi)) in dims.unwrap_or_default() {
            if lo < 0 || hi < lo {
                return Err(invalid(format!("dims['{name}'] = ({lo}, {hi}): expected 0 <= lo <= hi")));
            }
            load = load.dim(&name, lo, hi);
        }
        let mut opts = CompileOptions::new().precision(precision).int8(int8);
        if let Some(t) = threads {
            opts = opts.threads(t);
        }
        if let Some(p) = pool {
            opts = opts.pool(p);
        }
        // Compiling takes seconds: other Python threads run meanwhile.
        py.detach(|| {
            let model = Model::load(&path, &load).map_err(to_py)?;
            let io = |m: &Model| (io_list(m.inputs()), io_list(m.outputs()));
            if device == "cuda" {
                let (inputs, outputs) = io(&model);
                let gm = model.compile_gpu(0).map_err(to_py)?;
                let engine = Engine::Cuda(Box::new(gm), GpuSource::Model(Box::new(model)));
                return Ok(Session { engine, inputs, outputs });
            }
            if device == "gpu-emulator" {
                let (inputs, outputs) = io(&model);
                let gm = model.compile_host_gpu().map_err(to_py)?;
                let source = GpuSource::Model(Box::new(model));
                let engine = Engine::GpuEmulator(Box::new(gm), source);
                return Ok(Session { engine, inputs, outputs });
            }
            if interpret {
                let (inputs, outputs) = (io_list(model.inputs()), io_list(model.outputs()));
                return Ok(Session { engine: Engine::Interpreted(Box::new(model)), inputs, outputs });
            }
            Ok(Session::compiled(model.compile(&opts).map_err(to_py)?))
        })
    }

    /// Save the compiled model as an artifact at `path`: loading it again
    /// (`Session(path)`, `anyshape-rt`) compiles nothing.
    fn save(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
        match &self.engine {
            Engine::Compiled(m) => py.detach(|| m.save(&path).map_err(to_py)),
            Engine::Interpreted(_) => {
                Err(invalid("an interpreting session has no compiled code to save".into()))
            }
            Engine::Cuda(_, source) | Engine::GpuEmulator(_, source) => py.detach(|| {
                let saved = match source {
                    GpuSource::Model(m) => {
                        let mut opts = anyshape::gpu::GpuArtifactOptions::new();
                        if let Some(p) = anyshape::ptxas::find_ptxas() {
                            opts = opts.ptxas(p);
                        }
                        m.gpu_artifact(&opts).map_err(to_py)?.save(&path)
                    }
                    GpuSource::Artifact(a) => a.save(&path),
                };
                saved.map_err(|e| to_py(runtime_error(e)))
            }),
        }
    }

    /// `(name, shape, dtype)` of each input.
    fn inputs(&self, py: Python<'_>) -> PyResult<Vec<Described>> {
        describe(py, &self.inputs)
    }

    /// `(name, shape, dtype)` of each output.
    fn outputs(&self, py: Python<'_>) -> PyResult<Vec<Described>> {
        describe(py, &self.outputs)
    }

    /// Run on `feeds` (input name → numpy array); the outputs named in
    /// `output_names` (all when `None`), in that order.
    #[pyo3(signature = (output_names, feeds))]
    fn run(
        &self,
        py: Python<'_>,
        output_names: Option<Vec<String>>,
        feeds: &Bound<'_, PyDict>,
    ) -> PyResult<Vec<Py<PyAny>>> {
        let mut named = Vec::with_capacity(self.inputs.len());
        for (key, value) in feeds.iter() {
            let name: String = key.extract().map_err(|_| invalid("feed names must be strings".into()))?;
            let (input, ty) = &self.inputs[position_in(&self.inputs, &name, "input")?];
            let (shape, held) = hold(&name, &value, ty.dtype)?;
            named.push((input.clone(), shape, held));
        }
        all_fed(&self.inputs, |i| named.iter().any(|(n, _, _)| n == i))?;
        let wanted: Vec<usize> = match &output_names {
            None => (0..self.outputs.len()).collect(),
            Some(names) => {
                names.iter().map(|n| position_in(&self.outputs, n, "output")).collect::<PyResult<_>>()?
            }
        };
        // The model runs without the GIL: other Python threads (and other runs of
        // this session, each with its own arena) go on meanwhile.
        // The arrays are read in place: numpy's borrows keep them alive for the run
        // (as in ONNX Runtime, Python code must not write to them meanwhile).
        let views = named
            .iter()
            .map(|(n, shape, held)| Ok((n.as_str(), held.view(n, shape)?)))
            .collect::<PyResult<Vec<_>>>()?;
        let outs = match &self.engine {
            Engine::Compiled(m) => py.detach(|| m.run_views(&views).map_err(to_py))?,
            Engine::Cuda(m, _) => py.detach(|| m.run(&views).map_err(to_py))?,
            Engine::GpuEmulator(m, _) => py.detach(|| m.run(&views).map_err(to_py))?,
            Engine::Interpreted(m) => {
                let owned: Vec<(&str, Tensor)> = views.iter().map(|(n, v)| (*n, v.to_tensor())).collect();
                py.detach(|| m.interpret(&owned).map_err(to_py))?
            }
        };
        let mut outs: Vec<Option<Tensor>> = outs.into_iter().map(|(_, t)| Some(t)).collect();
        let mut arrays = Vec::with_capacity(wanted.len());
        for (k, &i) in wanted.iter().enumerate() {
            // An output asked for again later gets an array of its own.
            let again = wanted[k + 1..].contains(&i);
            let t = match outs.get_mut(i) {
                Some(slot) if again => slot.clone(),
                Some(slot) => slot.take(),
                None => None,
            };
            let t = t.ok_or_else(|| AnyshapeError::new_err(format!("output {i} is missing")))?;
            arrays.push(match &self.engine {
                Engine::Compiled(m) => recycled_array_of(py, t, &m.recycler())?,
                Engine::Cuda(m, _) => recycled_array_of(py, t, &m.recycler())?,
                Engine::GpuEmulator(m, _) => recycled_array_of(py, t, &m.recycler())?,
                Engine::Interpreted(_) => array_of(py, t)?,
            });
        }
        Ok(arrays)
    }

    /// The outputs' `(name, shape, dtype)` for feeds of device tensors (a
    /// GPU session's `run_device`), planning the shape if it is new.
    #[pyo3(signature = (feeds))]
    fn output_shapes(&self, feeds: &Bound<'_, PyDict>) -> PyResult<Vec<(String, Vec<usize>, String)>> {
        match &self.engine {
            Engine::Cuda(m, _) => output_shapes_on(m, &self.inputs, feeds, CUDA_INTERFACE),
            Engine::GpuEmulator(m, _) => output_shapes_on(m, &self.inputs, feeds, HOST_INTERFACE),
            _ => Err(not_a_gpu_session("device tensors")),
        }
    }

    /// The device memory a GPU session holds, in bytes: `{"weights": …,
    /// "calls": …, "peak": …}` (weights and constants uploaded once, the
    /// calls' memory now, the most both have held at once).
    fn device_memory(&self) -> PyResult<std::collections::HashMap<&'static str, usize>> {
        let m = match &self.engine {
            Engine::Cuda(m, _) => m.device_memory(),
            Engine::GpuEmulator(m, _) => m.device_memory(),
            _ => return Err(not_a_gpu_session("device memory figures")),
        };
        Ok([("weights", m.weights), ("calls", m.calls), ("peak", m.peak)].into_iter().collect())
    }

    /// Run on device tensors (`feeds`: input name → tensor) into device
    /// tensors (`outputs`: output name → tensor, every output once, of the
    /// shape `output_shapes` says): no copy through the host.
    #[pyo3(signature = (feeds, outputs))]
    fn run_device(
        &self,
        py: Python<'_>,
        feeds: &Bound<'_, PyDict>,
        outputs: &Bound<'_, PyDict>,
    ) -> PyResult<()> {
        let io = (self.inputs.as_slice(), self.outputs.as_slice());
        match &self.engine {
            Engine::Cuda(m, _) => run_device_on(py, m, io, feeds, outputs, CUDA_INTERFACE),
            Engine::GpuEmulator(m, _) => run_device_on(py, m, io, feeds, outputs, HOST_INTERFACE),
            _ => Err(not_a_gpu_session("device tensors")),
        }
    }
}

/// A model input's or output's name and type.
type Io = (String, TensorType);

/// Where `name` is among the model's inputs or outputs (`kind`), or an
/// error listing them.
fn position_in(io: &[Io], name: &str, kind: &str) -> PyResult<usize> {
    io.iter().position(|(n, _)| n == name).ok_or_else(|| {
        let known: Vec<&str> = io.iter().map(|(n, _)| n.as_str()).collect();
        invalid(format!("'{name}' is not an {kind} of the model (its {kind}s: {known:?})"))
    })
}

/// An error naming the first of `inputs` that is not `fed`.
fn all_fed(inputs: &[Io], fed: impl Fn(&str) -> bool) -> PyResult<()> {
    match inputs.iter().find(|(i, _)| !fed(i)) {
        Some((missing, _)) => Err(invalid(format!("input '{missing}' is missing from the feeds"))),
        None => Ok(()),
    }
}

/// The array interface a GPU session reads device tensors by: CUDA's
/// (`__cuda_array_interface__`: PyTorch, CuPy, Numba) on a GPU, numpy's on
/// the emulator, whose device memory is this process's.
const CUDA_INTERFACE: &str = "__cuda_array_interface__";
const HOST_INTERFACE: &str = "__array_interface__";

/// A tensor a caller hands in by its array interface: where its bytes are,
/// the stream that writes them (CUDA's interface, version 3), and whether
/// it may be written.
struct Foreign {
    tensor: anyshape::gpu::DeviceTensor,
    stream: Option<u64>,
    readonly: bool,
}

/// The element type of an array interface's `typestr` (little-endian or
/// one byte).
fn dtype_of(typestr: &str) -> Option<DType> {
    let (order, code) = typestr.split_at_checked(1)?;
    if !matches!(order, "<" | "|" | "=") || (order == "=" && cfg!(target_endian = "big")) {
        return None;
    }
    Some(match code {
        "f4" => DType::F32,
        "f8" => DType::F64,
        "f2" => DType::F16,
        "i1" => DType::I8,
        "u1" => DType::U8,
        "i4" => DType::I32,
        "i8" => DType::I64,
        "b1" => DType::Bool,
        _ => return None,
    })
}

/// `value`'s tensor by its array interface `key` (`what` names it in errors:
/// `input 'x'`): C-contiguous, unmasked, of a type the runtime knows.
fn foreign(what: &str, value: &Bound<'_, PyAny>, key: &str) -> PyResult<Foreign> {
    let bad = |why: String| invalid(format!("{what}: {why}"));
    let iface = value.getattr(key).map_err(|_| {
        let device = if key == CUDA_INTERFACE { "a CUDA tensor (PyTorch, CuPy)" } else { "a numpy array" };
        bad(format!("expected {device} with {key}, got {}", type_name(value)))
    })?;
    let d = iface.cast::<PyDict>().map_err(|_| bad(format!("{key} is not a dict")))?;
    let item =
        |k: &str| -> PyResult<Option<Bound<'_, PyAny>>> { Ok(d.get_item(k)?.filter(|v| !v.is_none())) };
    let need = |k: &str| item(k)?.ok_or_else(|| bad(format!("{key} has no '{k}'")));
    let shape: Vec<usize> =
        need("shape")?.extract().map_err(|_| bad("its shape is not a tuple of sizes".into()))?;
    let typestr: String =
        need("typestr")?.extract().map_err(|_| bad("its typestr is not a string".into()))?;
    let dtype = dtype_of(&typestr)
        .ok_or_else(|| bad(format!("its element type {typestr} is not one anyshape takes")))?;
    let (ptr, readonly): (u64, bool) =
        need("data")?.extract().map_err(|_| bad("its data is not (address, read-only)".into()))?;
    if let Some(strides) = item("strides")? {
        let strides: Vec<i64> = strides.extract().map_err(|_| bad("its strides are not integers".into()))?;
        let mut want = vec![0i64; shape.len()];
        let mut step = dtype.size() as i64;
        for (w, &n) in want.iter_mut().zip(&shape).rev() {
            *w = step;
            step = step.saturating_mul(n as i64);
        }
        // A dim of one element may have any stride.
        if strides.iter().zip(&want).zip(&shape).any(|((s, w), &n)| s != w && n > 1) {
            return Err(bad(format!("not C-contiguous (strides {strides:?}): pass a contiguous copy")));
        }
    }
    if item("mask")?.is_some() {
        return Err(bad("masked arrays are not taken".into()));
    }
    let stream = match item("stream")? {
        Some(s) => Some(s.extract::<u64>().map_err(|_| bad("its stream is not a stream handle".into()))?),
        None => None,
    };
    Ok(Foreign { tensor: anyshape::gpu::DeviceTensor { ptr, dtype, shape }, stream, readonly })
}

/// The feeds as device tensors of the model's inputs: each input once, of
/// its element type.
fn foreign_feeds(
    inputs: &[(String, TensorType)],
    feeds: &Bound<'_, PyDict>,
    key: &str,
) -> PyResult<Vec<(String, Foreign)>> {
    let mut out = Vec::with_capacity(inputs.len());
    for (k, v) in feeds.iter() {
        let name: String = k.extract().map_err(|_| invalid("feed names must be strings".into()))?;
        let (_, ty) = &inputs[position_in(inputs, &name, "input")?];
        let f = foreign(&format!("input '{name}'"), &v, key)?;
        if f.tensor.dtype != ty.dtype {
            return Err(invalid(format!(
                "input '{name}': expected dtype {}, got {}",
                numpy_name(ty.dtype),
                numpy_name(f.tensor.dtype)
            )));
        }
        out.push((name, f));
    }
    all_fed(inputs, |i| out.iter().any(|(n, _)| n == i))?;
    Ok(out)
}

fn not_a_gpu_session(what: &str) -> PyErr {
    invalid(format!("{what} need a GPU session: device=\"cuda\" (or \"gpu-emulator\", with numpy arrays)"))
}

/// The outputs' `(name, shape, dtype)` for the device-tensor feeds.
fn output_shapes_on<D: anyshape::gpu::Device>(
    m: &anyshape::gpu::GpuModel<D>,
    inputs: &[(String, TensorType)],
    feeds: &Bound<'_, PyDict>,
    key: &str,
) -> PyResult<Vec<(String, Vec<usize>, String)>> {
    let ins = foreign_feeds(inputs, feeds, key)?;
    let ins: Vec<(&str, anyshape::gpu::DeviceTensor)> =
        ins.iter().map(|(n, f)| (n.as_str(), f.tensor.clone())).collect();
    let shapes = m.output_shapes(&ins).map_err(to_py)?;
    Ok(shapes.into_iter().map(|(n, dt, shape)| (n, shape, numpy_name(dt).to_string())).collect())
}

/// A call on device tensors: checked (the device's memory, no output
/// overlapping another tensor, outputs writable), the writers' streams
/// waited for, then `GpuModel::run_device` without the GIL.
fn run_device_on<D: anyshape::gpu::Device + Sync>(
    py: Python<'_>,
    m: &anyshape::gpu::GpuModel<D>,
    io: (&[Io], &[Io]),
    feeds: &Bound<'_, PyDict>,
    outputs: &Bound<'_, PyDict>,
    key: &str,
) -> PyResult<()> {
    let ins = foreign_feeds(io.0, feeds, key)?;
    let mut outs = Vec::with_capacity(outputs.len());
    for (k, v) in outputs.iter() {
        let name: String = k.extract().map_err(|_| invalid("output names must be strings".into()))?;
        position_in(io.1, &name, "output")?;
        let f = foreign(&format!("output '{name}'"), &v, key)?;
        if f.readonly {
            return Err(invalid(format!("output '{name}' is read-only")));
        }
        outs.push((name, f));
    }
    let all: Vec<(String, &Foreign)> = ins
        .iter()
        .map(|(n, f)| (format!("input '{n}'"), f))
        .chain(outs.iter().map(|(n, f)| (format!("output '{n}'"), f)))
        .collect();
    let mut ranges = Vec::with_capacity(all.len());
    for (what, f) in &all {
        let bytes = f.tensor.bytes().ok_or_else(|| invalid(format!("{what} overflows the address space")))?;
        m.device().check_foreign(what, f.tensor.ptr, bytes).map_err(to_py)?;
        ranges.push((f.tensor.ptr, f.tensor.ptr.saturating_add(bytes as u64)));
    }
    // An output shares no byte with any other tensor given.
    for (i, (what, _)) in all.iter().enumerate().skip(ins.len()) {
        let (lo, hi) = ranges[i];
        let overlaps = |j: usize| j != i && lo < hi && lo < ranges[j].1 && ranges[j].0 < hi;
        if let Some(j) = (0..all.len()).find(|&j| overlaps(j)) {
            return Err(invalid(format!("{what} overlaps {}", all[j].0)));
        }
    }
    let mut streams: Vec<u64> = all.iter().filter_map(|(_, f)| f.stream).collect();
    streams.sort_unstable();
    streams.dedup();
    let ins: Vec<(&str, anyshape::gpu::DeviceTensor)> =
        ins.iter().map(|(n, f)| (n.as_str(), f.tensor.clone())).collect();
    let outs: Vec<(&str, anyshape::gpu::DeviceTensor)> =
        outs.iter().map(|(n, f)| (n.as_str(), f.tensor.clone())).collect();
    py.detach(|| {
        for s in &streams {
            // SAFETY: the stream is what the tensor's array interface names as
            // the one its writes are queued on (a stream of its framework's
            // context on this device, or a default stream's handle).
            unsafe { m.device().wait_foreign(*s) }?;
        }
        // SAFETY: each tensor's address, type and shape come from its array
        // interface, whose object the feeds and outputs dicts keep alive for
        // the call; each was found in this device's memory, the outputs are
        // writable and overlap no other tensor given, and the work that wrote
        // them is done. That no other work uses the outputs meanwhile is the
        // caller's part (documented in `InferenceSession.run_device`).
        unsafe { m.run_device(&ins, &outs) }
    })
    .map_err(to_py)
}

/// A pool of threads that sessions may share (`InferenceSession(..., pool=p)`):
/// their calls take turns kernel by kernel on its threads instead of each
/// session's own pool crowding the cores.
#[pyclass(frozen, module = "anyshape._anyshape")]
struct ThreadPool {
    pool: std::sync::Arc<anyshape::ThreadPool>,
}

#[pymethods]
impl ThreadPool {
    #[new]
    fn new(threads: usize) -> PyResult<Self> {
        if threads == 0 {
            return Err(invalid("threads must be at least 1".into()));
        }
        Ok(ThreadPool { pool: std::sync::Arc::new(anyshape::ThreadPool::new(threads)) })
    }

    /// Its threads, the calling thread counted.
    #[getter]
    fn threads(&self) -> usize {
        self.pool.threads()
    }
}

#[pymodule]
fn _anyshape(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Session>()?;
    m.add_class::<ThreadPool>()?;
    m.add("AnyshapeError", m.py().get_type::<AnyshapeError>())?;
    m.add("InvalidArgument", m.py().get_type::<InvalidArgument>())?;
    m.add("UnsupportedModel", m.py().get_type::<UnsupportedModel>())?;
    Ok(())
}

/// An artifact's error as the runtime's (what `to_py` maps to Python's).
fn runtime_error(e: anyshape::ArtifactError) -> anyshape::Error {
    anyshape::Error::Run(e.into())
}
