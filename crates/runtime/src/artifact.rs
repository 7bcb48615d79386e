//! Compiled artifacts (DESIGN.md §7): a [`CompiledModel`] saved to one file and
//! loaded again without the compiler, on a machine that has no LLVM.
//!
//! The file is a fixed header, the metadata (the plans, shape facts, dispatch
//! tables and trees, every kernel's entry by symbol), the relocatable objects
//! LLVM emitted (loaded by [`CodeImage::load`]), and the weights section: the
//! pre-packed weights and the constants the loop programs read, each aligned
//! to a cache line, the section to a page, so that loading maps the file and
//! reads them in place. Integrity: the header holds a BLAKE3 hash of header,
//! metadata and code (checked before any of it is used: the code is machine
//! code) and one of the weights; a file from another format version, for a CPU
//! that lacks a feature the code was compiled with, truncated or altered, is an
//! [`ArtifactError`], never a crash.
//!
//! ```text
//! 0    magic "ANYSHAPE"          8    format version (u32 LE), 0 (u32)
//! 16   metadata bytes (u64)      24   code bytes (u64)
//! 32   weights offset (u64)      40   weights bytes (u64)
//! 48   BLAKE3(header[0..48] ‖ metadata ‖ code)
//! 80   BLAKE3(weights)
//! 112  metadata (postcard) ‖ code ‖ zeros to the weights offset ‖ weights
//! ```

use std::collections::HashMap;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::Arc;

use ir::{ConstData, TensorType};
use kernels::{
    CodeImage, CostModel, DecisionTree, DirectKernel, DirectVariant, Dispatcher, ElemType, KernelFamily,
    KernelVariant, MachineModel, MicroKernel, PackedB, Packer, Packers, Target, TunedSchedules,
};
use plan::{AttentionStep, BufferKind, Epilogue, MatMulStep, ModelPlan, StepKind, View};
use serde::{Deserialize, Serialize};
use sym::{ShapeEnv, SymExpr};

use crate::{CompiledModel, ModelParts, RunError};

/// The version of the layout below, of the metadata's encoding and of the calling
/// convention of the code it holds (3: direct kernels take runs; 4: and the lines
/// they ask into L2; 5: matmul epilogues hold their program in the kernels' form;
/// 6: programs record their border guards; 7: a GPU artifact records its fused
/// attention kernels; 8: integer families, u8s8 and i16, and the products
/// marked for them; 9: and i16s8, whose weights are byte pairs; 10: a GPU
/// artifact holds code for several GPUs, cubins, and its GEMMs' weights in
/// bf16; 11: weight-only codes; 12: kernels read column scales; 13: and their
/// epilogue programs' parameters; 14: quantized activations stored as u8
/// codes, and A's word packers; 15: kernels storing C as codes; 16: a GPU
/// artifact's GEMMs reading an f32 A in place; 17: attention kernels by
/// wgmma and dependent launches; 18: split-K GEMMs and their reductions; 19:
/// bf16 buffers, a GPU plan's operands its producers write in bf16; 20:
/// split-K GEMMs that fold their shares themselves; 21: CPU weights packed
/// whole, read in shallower blocks too; 22: a GPU artifact's operand copy
/// taking taps four channels a thread, taps and views an element a thread
/// in 32-bit indices; 23: a GPU artifact's GEMMs reading a convolution's
/// taps from a bf16 image, their descriptor an argument, and storing a
/// bf16 copy of C, its buffer the last argument; 24: normalizing GEMVs, a
/// product naming the row norm that writes its A, online softmax of a
/// NaN-guarded softmax; 25: AMX micro-kernels, whose A panels are laid out
/// by rows; 26: a u8s8 family's direct kernels, reading A's codes in place;
/// 27: epilogue programs reading their residual, a residual of u8 codes; 28:
/// programs interleaving their last variable's values); a runtime reads only
/// its own.
pub const FORMAT_VERSION: u32 = 28;

const MAGIC: &[u8; 8] = b"ANYSHAPE";
const HEADER: usize = 112;
/// The most threads an artifact may ask for (a larger count is damage).
const MAX_THREADS: usize = 4096;
/// Alignment of each blob in the weights section (a cache line).
const BLOB_ALIGN: u64 = 64;
/// Alignment of the weights section in the file (a page).
const SECTION_ALIGN: u64 = 4096;

/// Why an artifact could not be written or read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ArtifactError {
    #[error("{0}")]
    Io(String),
    #[error("not an anyshape artifact (it does not start with \"ANYSHAPE\")")]
    NotAnArtifact,
    #[error("artifact format version {found}; this runtime reads version {FORMAT_VERSION} (compile the model again)")]
    Version { found: u32 },
    #[error("truncated: the header says {expected} bytes, the file has {found}")]
    Truncated { expected: u64, found: u64 },
    #[error("corrupted: the {0} do not match the hash the artifact was written with")]
    Corrupted(&'static str),
    #[error("malformed: {0}")]
    Malformed(String),
    #[error("the artifact's code was compiled for {cpu} and needs CPU features this machine lacks: {}", missing.join(", "))]
    Cpu { cpu: String, missing: Vec<String> },
    #[error("{0}")]
    Unsupported(String),
}

impl From<ArtifactError> for RunError {
    fn from(e: ArtifactError) -> RunError {
        RunError::Artifact(e)
    }
}

pub(crate) fn malformed(e: impl std::fmt::Display) -> ArtifactError {
    ArtifactError::Malformed(e.to_string())
}

/// The CPU the code of a compiled model was generated for: LLVM's CPU name and
/// the features it may use (LLVM's names, without the `+`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeTarget {
    pub cpu: String,
    pub features: Vec<String>,
}

impl CodeTarget {
    /// From LLVM's CPU name and feature string (`+avx2,+fma,-amx-tile,...`): the
    /// features turned on. The generic `x86-64-v3` level (no string) stands for
    /// its features.
    pub fn new(cpu: &str, features: &str) -> CodeTarget {
        let mut f: Vec<String> =
            features.split(',').filter_map(|f| f.strip_prefix('+')).map(str::to_string).collect();
        if cpu == "x86-64-v3" && f.is_empty() {
            f = X86_64_V3.iter().map(|s| s.to_string()).collect();
        }
        f.sort();
        f.dedup();
        CodeTarget { cpu: cpu.to_string(), features: f }
    }

    /// The features this machine lacks (those that can be detected at run
    /// time; the others, such as `prfchw` or `x87`, are modes and tuning
    /// flags that every x86-64 CPU LLVM would target has or ignores).
    pub fn missing(&self) -> Vec<String> {
        self.missing_on(detected)
    }

    fn missing_on(&self, has: impl Fn(&str) -> Option<bool>) -> Vec<String> {
        self.features.iter().filter(|f| has(f) == Some(false)).cloned().collect()
    }
}

const X86_64_V3: &[&str] = &[
    "avx", "avx2", "bmi", "bmi2", "cx16", "f16c", "fma", "lzcnt", "movbe", "popcnt", "sse3", "sse4.1",
    "sse4.2", "ssse3", "xsave",
];

/// Whether the CPU has the feature LLVM calls `name`; `None` for a feature
/// std cannot detect (modes and tuning flags such as `prfchw`, `sahf`, `x87`).
fn detected(name: &str) -> Option<bool> {
    macro_rules! features {
        ($($llvm:literal => $std:tt),* $(,)?) => {
            match name {
                $($llvm => Some(std::arch::is_x86_feature_detected!($std)),)*
                _ => None,
            }
        };
    }
    // AMX: the CPU's tiles and the OS's leave to use them (asked for here, as
    // its code faults without it).
    #[cfg(target_arch = "x86_64")]
    if matches!(name, "amx-tile" | "amx-int8" | "amx-bf16") {
        let (int8, bf16) = kernels::amx_usable();
        return Some(match name {
            "amx-int8" => int8,
            "amx-bf16" => bf16,
            _ => int8 || bf16,
        });
    }
    #[cfg(target_arch = "x86_64")]
    {
        features! {
            "sse3" => "sse3", "ssse3" => "ssse3", "sse4.1" => "sse4.1", "sse4.2" => "sse4.2",
            "sse4a" => "sse4a", "popcnt" => "popcnt", "avx" => "avx", "avx2" => "avx2", "fma" => "fma",
            "f16c" => "f16c", "bmi" => "bmi1", "bmi2" => "bmi2", "lzcnt" => "lzcnt", "movbe" => "movbe",
            "cx16" => "cmpxchg16b", "xsave" => "xsave", "xsaveopt" => "xsaveopt", "xsavec" => "xsavec",
            "xsaves" => "xsaves", "adx" => "adx", "aes" => "aes", "pclmul" => "pclmulqdq",
            "rdrnd" => "rdrand", "rdseed" => "rdseed", "sha" => "sha", "gfni" => "gfni", "vaes" => "vaes",
            "vpclmulqdq" => "vpclmulqdq", "avx512f" => "avx512f", "avx512cd" => "avx512cd",
            "avx512bw" => "avx512bw", "avx512dq" => "avx512dq", "avx512vl" => "avx512vl",
            "avx512ifma" => "avx512ifma", "avx512vbmi" => "avx512vbmi", "avx512vbmi2" => "avx512vbmi2",
            "avx512vnni" => "avx512vnni", "avx512bitalg" => "avx512bitalg",
            "avx512vpopcntdq" => "avx512vpopcntdq", "avx512bf16" => "avx512bf16",
            "avx512fp16" => "avx512fp16", "fxsr" => "fxsr", "ermsb" => "ermsb", "avxvnni" => "avxvnni",
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = name;
        Some(false)
    }
}

/// A function of the model's code: the image it is in and its symbol.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Entry {
    image: u32,
    name: String,
}

/// The loaded images, where the metadata's entries are found.
struct Entries<'a>(&'a [CodeImage]);

impl Entries<'_> {
    /// The function `e` names, as an entry of the executable ABI.
    ///
    /// # Safety
    /// `e` names a function generated with `F`'s signature: the artifact's
    /// metadata says which role each entry serves, and its hash matched the one
    /// the compiler wrote with that code. The result is called only while the
    /// images live (the compiled model keeps them).
    unsafe fn get<F: plan::EntryFn>(&self, e: &Entry) -> Result<F, ArtifactError> {
        let image = self.0.get(e.image as usize).ok_or_else(|| malformed(format!("no image {}", e.image)))?;
        // SAFETY: the caller's contract.
        unsafe { image.entry(&e.name) }.map_err(|err| malformed(format!("image {}: {err}", e.image)))
    }
}

/// A range of the weights section.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub(crate) struct Blob {
    pub offset: u64,
    pub len: u64,
}

#[derive(Serialize, Deserialize)]
enum KindMeta {
    Input(usize),
    Output(usize),
    /// Constant data in the weights section.
    Constant {
        shape: Vec<usize>,
        at: Blob,
    },
    /// A weight read only packed: its packed form is all the artifact keeps.
    Packed,
    Temp,
}

#[derive(Serialize, Deserialize)]
struct BufferMeta {
    name: String,
    dtype: ir::DType,
    shape: Vec<SymExpr>,
    numel: u32,
    kind: KindMeta,
    first: usize,
    last: usize,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct PlanMeta {
    dims: plan::DimTable,
    buffers: Vec<BufferMeta>,
    programs: Vec<plan::LoopProgram>,
    steps: Vec<plan::Step>,
    groups: Vec<plan::GroupSteps>,
    inputs: Vec<usize>,
    outputs: Vec<usize>,
}

#[derive(Serialize, Deserialize)]
struct PackerMeta {
    width: usize,
    elem: ElemType,
    func: Entry,
}

#[derive(Serialize, Deserialize)]
struct PackersMeta {
    a: Option<PackerMeta>,
    bt: Option<PackerMeta>,
    a_rows: Option<PackerMeta>,
    /// The dequantizers of weight codes: width, bits and entry.
    dequant: Vec<(usize, u32, Entry)>,
    /// The products of a row with weight codes: width, bits and entry.
    dots: Vec<(usize, u32, Entry)>,
    /// A's word packers (u8s8 from codes in memory), by rows and by address.
    #[serde(default)]
    a_words: Option<PackerMeta>,
    #[serde(default)]
    a_rows_words: Option<PackerMeta>,
}

#[derive(Serialize, Deserialize)]
struct KernelMeta {
    mr: usize,
    nr: usize,
    elem: ElemType,
    epilogue: Epilogue,
    func: Entry,
    packers: PackersMeta,
    gflops: f64,
    /// An AMX kernel, reading A's panels row by row.
    #[serde(default)]
    amx: bool,
}

#[derive(Serialize, Deserialize)]
struct DispatcherMeta {
    epilogue: Epilogue,
    target: Target,
    machine: MachineModel,
    model: CostModel,
    variants: Vec<KernelMeta>,
    direct: Vec<KernelMeta>,
    trees: Vec<DecisionTree>,
    tuned: Option<TunedSchedules>,
}

#[derive(Serialize, Deserialize)]
struct PackedMeta {
    k: usize,
    n: usize,
    nr: usize,
    kc: usize,
    elem: ElemType,
    /// A weight-only quantized weight's codes: their bits and group.
    codes: Option<(u32, usize)>,
    at: Blob,
}

/// Everything but the code and the weights.
#[derive(Serialize, Deserialize)]
struct Meta {
    code_target: CodeTarget,
    threads: usize,
    env: ShapeEnv,
    inputs: Vec<(String, TensorType)>,
    outputs: Vec<(String, TensorType)>,
    plan: PlanMeta,
    /// Each image's object: a range of the code section.
    objects: Vec<(u64, u64)>,
    loops: Vec<Entry>,
    splits: Vec<Option<(Entry, Entry)>>,
    dispatchers: Vec<DispatcherMeta>,
    /// Per step of the plan: its pre-packed weight.
    packed: Vec<Option<PackedMeta>>,
}

/// Whether the file at `path` is an artifact (starts with its magic), rather
/// than, say, an ONNX model.
pub fn is_artifact(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 8];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && &magic == MAGIC
}

/// How to load an artifact.
#[derive(Clone, Debug, Default)]
pub struct ArtifactOptions {
    threads: Option<usize>,
    pool: Option<std::sync::Arc<kernels::ThreadPool>>,
}

impl ArtifactOptions {
    pub fn new() -> ArtifactOptions {
        ArtifactOptions::default()
    }
    /// Threads of the model's pool (default: those it was compiled with).
    pub fn threads(mut self, n: usize) -> ArtifactOptions {
        self.threads = Some(n.max(1));
        self
    }
    /// Run the model on `pool`, shared with other models (see
    /// `anyshape::CompileOptions::pool`); its thread count wins over
    /// [`Self::threads`]. By default the model gets a pool of its own.
    pub fn pool(mut self, pool: std::sync::Arc<kernels::ThreadPool>) -> ArtifactOptions {
        self.pool = Some(pool);
        self
    }
}

/// Where each function of the model's code is, by address.
struct Symbols(HashMap<usize, Entry>);

impl Symbols {
    fn of(images: &[CodeImage]) -> Symbols {
        let mut map = HashMap::new();
        for (i, image) in images.iter().enumerate() {
            for (name, addr, _) in image.functions() {
                map.insert(addr, Entry { image: i as u32, name: name.to_string() });
            }
        }
        Symbols(map)
    }
    fn entry(&self, addr: usize, what: &str) -> Result<Entry, ArtifactError> {
        self.0.get(&addr).cloned().ok_or_else(|| {
            ArtifactError::Unsupported(format!(
                "the {what} at {addr:#x} is not in the model's generated code"
            ))
        })
    }
}

/// Writes the weights section, hashed as it goes: each blob at the offset
/// placed for it in the metadata, zeros between.
struct Weights<'w, W: Write> {
    out: &'w mut W,
    at: u64,
    hash: blake3::Hasher,
}

impl<W: Write> Weights<'_, W> {
    fn put(&mut self, blob: Blob, bytes: &[u8]) -> std::io::Result<()> {
        let pad =
            blob.offset.checked_sub(self.at).ok_or_else(|| std::io::Error::other("blobs out of order"))?;
        self.write(&vec![0u8; pad as usize])?;
        self.write(bytes)
    }
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.out.write_all(bytes)?;
        self.hash.update(bytes);
        self.at += bytes.len() as u64;
        Ok(())
    }
}

pub(crate) fn io(path: &Path) -> impl Fn(std::io::Error) -> ArtifactError + '_ {
    move |e| ArtifactError::Io(format!("{}: {e}", path.display()))
}

impl CompiledModel<crate::Cpu> {
    /// Save as an artifact at `path` (written to a temporary file beside it and
    /// renamed, so that a reader never sees half a file).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), RunError> {
        let path = path.as_ref();
        if self.canaries {
            return Err(
                ArtifactError::Unsupported("a model compiled with canaries is not saved".into()).into()
            );
        }
        let syms = Symbols::of(&self.backend.code);
        let mut code = Vec::new();
        let mut objects = Vec::with_capacity(self.backend.code.len());
        for image in &self.backend.code {
            objects.push((code.len() as u64, image.object().len() as u64));
            code.extend_from_slice(image.object());
        }
        let loops = self
            .backend
            .loops
            .iter()
            .map(|f| syms.entry(*f as usize, "loop program"))
            .collect::<Result<_, _>>()?;
        let splits = self
            .backend
            .splits
            .iter()
            .map(|s| {
                s.map(|(p, f)| Ok((syms.entry(p as usize, "partial")?, syms.entry(f as usize, "finish")?)))
                    .transpose()
            })
            .collect::<Result<_, ArtifactError>>()?;
        let dispatchers = self
            .backend
            .dispatchers
            .iter()
            .map(|(e, d)| dispatcher_meta(*e, d, &syms))
            .collect::<Result<_, _>>()?;

        let tmp =
            path.with_extension(format!("tmp.{}.{:?}", std::process::id(), std::thread::current().id()));
        let write = || -> Result<(), ArtifactError> {
            let file = std::fs::File::create(&tmp).map_err(io(&tmp))?;
            let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
            // Blob offsets are relative to the weights section, so they are placed
            // (and written into the metadata) before the section's own offset is
            // known: the first page boundary after header, metadata and code.
            let reads = crate::cpu::reads(&self.plan);
            let mut blobs: Vec<Option<Blob>> = vec![None; self.plan.buffers.len()];
            let mut packed: Vec<Option<PackedMeta>> = Vec::with_capacity(self.backend.packed.len());
            let mut at = 0u64;
            let mut place = |len: usize| {
                at = at.next_multiple_of(BLOB_ALIGN);
                let b = Blob { offset: at, len: len as u64 };
                at += len as u64;
                b
            };
            let mut order: Vec<(Blob, &[u8])> = Vec::new();
            for (i, b) in self.plan.buffers.iter().enumerate() {
                if let BufferKind::Constant(c) = &b.kind {
                    if !reads[i].packed_only() {
                        let blob = place(c.bytes().len());
                        blobs[i] = Some(blob);
                        order.push((blob, c.bytes()));
                    }
                }
            }
            for p in &self.backend.packed {
                packed.push(match p {
                    None => None,
                    Some(p) => {
                        let bytes: &[u8] = bytemuck::cast_slice(p.words());
                        let blob = place(bytes.len());
                        order.push((blob, bytes));
                        Some(PackedMeta {
                            k: p.k,
                            n: p.n,
                            nr: p.nr,
                            kc: p.kc,
                            elem: p.elem,
                            codes: p.codes.map(|c| (c.bits, c.group)),
                            at: blob,
                        })
                    }
                });
            }
            let meta = Meta {
                code_target: self.backend.code_target.clone(),
                threads: self.backend.pool.threads(),
                env: self.env.clone(),
                inputs: self.inputs.clone(),
                outputs: self.outputs.clone(),
                plan: plan_meta(&self.plan, &blobs),
                objects,
                loops,
                splits,
                dispatchers,
                packed,
            };
            let meta = postcard::to_stdvec(&meta).map_err(malformed)?;
            write_sections(&mut out, &tmp, MAGIC, &meta, &code, &order)?;
            std::fs::rename(&tmp, path).map_err(io(path))
        };
        write().inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })?;
        Ok(())
    }

    /// Load an artifact written by [`CompiledModel::save`]: no compilation; the
    /// weights stay in the file's mapping.
    pub fn load(path: impl AsRef<Path>, opts: &ArtifactOptions) -> Result<CompiledModel, RunError> {
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(io(path))?;
        // SAFETY: the mapping is read-only and private. A file changed under a live
        // mapping is outside the contract (as for a memory-mapped ONNX model): the
        // artifact is written once, to a temporary name, and renamed.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io(path))?;
        Ok(CompiledModel::from_artifact(Arc::new(MappedArtifact(map)), opts)?)
    }

    /// [`CompiledModel::load`] from bytes already in memory (any owner). The
    /// weights are read in place: the bytes must start on an 8-byte boundary,
    /// as a mapping or a `Vec` does (a pre-packed weight that lands unaligned is
    /// reported as malformed).
    pub fn from_artifact(
        bytes: Arc<dyn AsRef<[u8]> + Send + Sync>,
        opts: &ArtifactOptions,
    ) -> Result<CompiledModel, ArtifactError> {
        let file = (*bytes).as_ref();
        let parsed = Parsed::of(file, MAGIC)?;
        let meta: Meta = postcard::from_bytes(parsed.meta).map_err(malformed)?;
        let missing = meta.code_target.missing();
        if !missing.is_empty() {
            return Err(ArtifactError::Cpu { cpu: meta.code_target.cpu, missing });
        }
        let images = meta
            .objects
            .iter()
            .map(|&(at, len)| {
                let object = range(at, len, parsed.code.len()).map(|r| &parsed.code[r])?;
                CodeImage::load(object).map_err(malformed)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let entries = Entries(&images);
        let weights_at = parsed.weights_at;
        let window = |b: Blob| -> Result<std::ops::Range<usize>, ArtifactError> {
            let r = range(b.offset, b.len, parsed.weights_len)?;
            Ok(r.start + weights_at..r.end + weights_at)
        };
        if meta.threads == 0 || meta.threads > MAX_THREADS {
            return Err(malformed(format!("{} threads", meta.threads)));
        }
        let pool = match &opts.pool {
            Some(p) => p.clone(),
            None => {
                std::sync::Arc::new(kernels::ThreadPool::new(opts.threads.unwrap_or(meta.threads).max(1)))
            }
        };
        let threads = pool.threads();
        let plan = plan_of(meta.plan, &bytes, &window)?;
        validate(&plan, meta.inputs.len(), meta.outputs.len()).map_err(ArtifactError::Malformed)?;
        let mut dispatchers = Vec::with_capacity(meta.dispatchers.len());
        for d in meta.dispatchers {
            dispatchers.push((d.epilogue, dispatcher_of(d, threads, &entries)?));
        }
        // SAFETY (for the entries below): as in `Entries::get`, each is the
        // generated function the metadata names for that role.
        let loops = meta
            .loops
            .iter()
            .map(|e| unsafe { entries.get::<plan::LoopFn>(e) })
            .collect::<Result<Vec<_>, _>>()?;
        let splits = meta
            .splits
            .iter()
            .map(|s| {
                s.as_ref()
                    .map(|(p, f)| -> Result<_, ArtifactError> {
                        Ok(unsafe { (entries.get::<plan::PartFn>(p)?, entries.get::<plan::FinishFn>(f)?) })
                    })
                    .transpose()
            })
            .collect::<Result<Vec<_>, _>>()?;
        let packed = meta
            .packed
            .into_iter()
            .map(|p| {
                p.map(|p| {
                    match p.codes {
                        Some((bits, group)) => PackedB::quantized_from_shared(
                            (p.k, p.n, p.nr, p.kc),
                            kernels::CodeLayout { bits, group },
                            bytes.clone(),
                            window(p.at)?,
                        ),
                        None => {
                            PackedB::from_shared((p.k, p.n, p.nr, p.kc, p.elem), bytes.clone(), window(p.at)?)
                        }
                    }
                    .map_err(malformed)
                })
                .transpose()
            })
            .collect::<Result<Vec<_>, _>>()?;
        let parts = ModelParts {
            plan,
            env: meta.env,
            inputs: meta.inputs,
            outputs: meta.outputs,
            loops,
            splits,
            dispatchers,
            pool,
            code: images,
            canaries: false,
            code_stats: crate::CodeStats::default(),
            code_target: meta.code_target,
        };
        CompiledModel::assemble(parts, Some(packed)).map_err(|e| malformed(e.to_string()))
    }
}

/// Writes an artifact's sections to `out` (the file at `tmp`): the header
/// (`magic`, the format version, the sections' sizes and hashes), the
/// metadata, the code, and each weight blob at the offset placed for it, the
/// weights section's hash patched in last.
pub(crate) fn write_sections(
    out: &mut std::io::BufWriter<std::fs::File>,
    tmp: &Path,
    magic: &[u8; 8],
    meta: &[u8],
    code: &[u8],
    order: &[(Blob, &[u8])],
) -> Result<(), ArtifactError> {
    let weights_at = (HEADER as u64 + meta.len() as u64 + code.len() as u64).next_multiple_of(SECTION_ALIGN);
    let mut header = [0u8; HEADER];
    header[0..8].copy_from_slice(magic);
    header[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    header[16..24].copy_from_slice(&(meta.len() as u64).to_le_bytes());
    header[24..32].copy_from_slice(&(code.len() as u64).to_le_bytes());
    header[32..40].copy_from_slice(&weights_at.to_le_bytes());
    let weights_len = order.last().map_or(0, |(b, _)| b.offset + b.len);
    header[40..48].copy_from_slice(&weights_len.to_le_bytes());
    let mut h = blake3::Hasher::new();
    h.update(&header[0..48]);
    h.update(meta);
    h.update(code);
    header[48..80].copy_from_slice(h.finalize().as_bytes());
    out.write_all(&header).map_err(io(tmp))?;
    out.write_all(meta).map_err(io(tmp))?;
    out.write_all(code).map_err(io(tmp))?;
    let gap = weights_at - (HEADER + meta.len() + code.len()) as u64;
    out.write_all(&vec![0u8; gap as usize]).map_err(io(tmp))?;
    let mut w = Weights { out: &mut *out, at: 0, hash: blake3::Hasher::new() };
    for (blob, bytes) in order {
        w.put(*blob, bytes).map_err(io(tmp))?;
    }
    let weights_hash = w.hash.finalize();
    out.flush().map_err(io(tmp))?;
    let file = out.get_mut();
    file.seek(SeekFrom::Start(80)).map_err(io(tmp))?;
    file.write_all(weights_hash.as_bytes()).map_err(io(tmp))?;
    file.sync_all().map_err(io(tmp))?;
    Ok(())
}

/// An artifact's file, mapped.
pub(crate) struct MappedArtifact(pub memmap2::Mmap);

impl AsRef<[u8]> for MappedArtifact {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// A window of shared bytes, as `Bytes`' owner.
pub(crate) struct Window(pub Arc<dyn AsRef<[u8]> + Send + Sync>, pub std::ops::Range<usize>);

impl AsRef<[u8]> for Window {
    fn as_ref(&self) -> &[u8] {
        &(*self.0).as_ref()[self.1.clone()]
    }
}

/// `at..at + len` when it lies within `0..size`.
pub(crate) fn range(at: u64, len: u64, size: usize) -> Result<std::ops::Range<usize>, ArtifactError> {
    let end = at.checked_add(len).filter(|e| *e <= size as u64);
    match end {
        Some(end) => Ok(at as usize..end as usize),
        None => Err(malformed(format!("a range {at}+{len} past the end of its section ({size} bytes)"))),
    }
}

/// A checked artifact's sections.
pub(crate) struct Parsed<'a> {
    pub meta: &'a [u8],
    pub code: &'a [u8],
    pub weights_at: usize,
    pub weights_len: usize,
}

impl<'a> Parsed<'a> {
    /// The sections of `file`, an artifact that starts with `magic`, checked.
    pub(crate) fn of(file: &'a [u8], magic: &[u8; 8]) -> Result<Parsed<'a>, ArtifactError> {
        if file.len() < 8 || &file[..8] != magic {
            return Err(ArtifactError::NotAnArtifact);
        }
        let u32_at =
            |i: usize| file.get(i..i + 4).map(|b| u32::from_le_bytes(b.try_into().unwrap_or([0; 4])));
        let u64_at =
            |i: usize| file.get(i..i + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
        let found = file.len() as u64;
        let short = |expected: u64| ArtifactError::Truncated { expected, found };
        let version = u32_at(8).ok_or(short(HEADER as u64))?;
        if version != FORMAT_VERSION {
            return Err(ArtifactError::Version { found: version });
        }
        if file.len() < HEADER {
            return Err(short(HEADER as u64));
        }
        let [meta_len, code_len, weights_at, weights_len] = [16, 24, 32, 40].map(|i| u64_at(i).unwrap_or(0));
        let code_end = (HEADER as u64).checked_add(meta_len).and_then(|m| m.checked_add(code_len));
        let total = weights_at.checked_add(weights_len);
        let (Some(code_end), Some(total)) = (code_end, total) else {
            return Err(malformed("section sizes overflow"));
        };
        if code_end > weights_at || weights_at % SECTION_ALIGN != 0 {
            return Err(malformed("the weights section overlaps the code or is not page-aligned"));
        }
        if total != found {
            return Err(if total > found {
                short(total)
            } else {
                malformed(format!("{found} bytes, the header says {total}"))
            });
        }
        let (meta_end, code_end) = (HEADER + meta_len as usize, code_end as usize);
        let (front, weights) = section_hashes(file, code_end, weights_at as usize);
        if front.as_bytes() != &file[48..80] {
            return Err(ArtifactError::Corrupted("header, metadata and code"));
        }
        if weights.as_bytes() != &file[80..112] {
            return Err(ArtifactError::Corrupted("weights"));
        }
        Ok(Parsed {
            meta: &file[HEADER..meta_end],
            code: &file[meta_end..code_end],
            weights_at: weights_at as usize,
            weights_len: weights_len as usize,
        })
    }
}

pub(crate) fn plan_meta(plan: &ModelPlan, blobs: &[Option<Blob>]) -> PlanMeta {
    let buffers = plan
        .buffers
        .iter()
        .zip(blobs)
        .map(|(b, blob)| BufferMeta {
            name: b.name.clone(),
            dtype: b.dtype,
            shape: b.shape.clone(),
            numel: b.numel,
            kind: match &b.kind {
                BufferKind::Input(i) => KindMeta::Input(*i),
                BufferKind::Output(i) => KindMeta::Output(*i),
                BufferKind::Constant(c) => match blob {
                    Some(at) => KindMeta::Constant { shape: c.shape.clone(), at: *at },
                    None => KindMeta::Packed,
                },
                BufferKind::Packed => KindMeta::Packed,
                BufferKind::Temp => KindMeta::Temp,
            },
            first: b.first,
            last: b.last,
        })
        .collect();
    PlanMeta {
        dims: plan.dims.clone(),
        buffers,
        programs: plan.programs.clone(),
        steps: plan.steps.clone(),
        groups: plan.groups.clone(),
        inputs: plan.inputs.clone(),
        outputs: plan.outputs.clone(),
    }
}

pub(crate) fn plan_of(
    p: PlanMeta,
    bytes: &Arc<dyn AsRef<[u8]> + Send + Sync>,
    window: &dyn Fn(Blob) -> Result<std::ops::Range<usize>, ArtifactError>,
) -> Result<ModelPlan, ArtifactError> {
    let mut buffers = Vec::with_capacity(p.buffers.len());
    for b in p.buffers {
        let kind = match b.kind {
            KindMeta::Input(i) => BufferKind::Input(i),
            KindMeta::Output(i) => BufferKind::Output(i),
            KindMeta::Temp => BufferKind::Temp,
            KindMeta::Constant { shape, at } => {
                let data = bytes::Bytes::from_owner(Window(bytes.clone(), window(at)?));
                BufferKind::Constant(Arc::new(
                    ConstData::from_bytes(b.dtype, shape, data).map_err(malformed)?,
                ))
            }
            KindMeta::Packed => BufferKind::Packed,
        };
        buffers.push(plan::Buffer {
            name: b.name,
            dtype: b.dtype,
            shape: b.shape,
            numel: b.numel,
            kind,
            first: b.first,
            last: b.last,
        });
    }
    Ok(ModelPlan {
        dims: p.dims,
        buffers,
        programs: p.programs,
        steps: p.steps,
        groups: p.groups,
        inputs: p.inputs,
        outputs: p.outputs,
    })
}

fn dispatcher_meta(e: Epilogue, d: &Dispatcher, syms: &Symbols) -> Result<DispatcherMeta, ArtifactError> {
    let packer = |p: Option<Packer>| -> Result<Option<PackerMeta>, ArtifactError> {
        p.map(|p| {
            Ok(PackerMeta { width: p.width, elem: p.elem, func: syms.entry(p.func as usize, "packer")? })
        })
        .transpose()
    };
    let rows_packer = |p: Option<kernels::RowsPacker>| -> Result<Option<PackerMeta>, ArtifactError> {
        p.map(|r| {
            Ok(PackerMeta { width: r.width, elem: r.elem, func: syms.entry(r.func as usize, "taps packer")? })
        })
        .transpose()
    };
    let packers = |p: &Packers| -> Result<PackersMeta, ArtifactError> {
        Ok(PackersMeta {
            a: packer(p.a)?,
            bt: packer(p.bt)?,
            a_rows: rows_packer(p.a_rows)?,
            a_words: packer(p.a_words)?,
            a_rows_words: rows_packer(p.a_rows_words)?,
            dequant: p
                .dequant
                .iter()
                .flatten()
                .map(|d| Ok((d.width, d.bits, syms.entry(d.func as usize, "dequantizer")?)))
                .collect::<Result<_, ArtifactError>>()?,
            dots: p
                .dots
                .iter()
                .flatten()
                .map(|d| Ok((d.width, d.bits, syms.entry(d.func as usize, "code dot")?)))
                .collect::<Result<_, ArtifactError>>()?,
        })
    };
    let f = d.family();
    let variants = f
        .variants()
        .iter()
        .map(|v| {
            let k = &v.kernel;
            Ok(KernelMeta {
                mr: k.mr,
                nr: k.nr,
                elem: k.elem,
                epilogue: k.epilogue,
                func: syms.entry(k.func as usize, "micro-kernel")?,
                packers: packers(&k.packers)?,
                gflops: v.gflops,
                amx: k.amx,
            })
        })
        .collect::<Result<_, ArtifactError>>()?;
    let direct = f
        .direct_variants()
        .iter()
        .map(|v| {
            let k = &v.kernel;
            Ok(KernelMeta {
                mr: k.mr,
                nr: k.nr,
                elem: k.elem,
                epilogue: k.epilogue,
                func: syms.entry(k.func as usize, "direct kernel")?,
                amx: false,
                packers: packers(&k.packers)?,
                gflops: v.gflops,
            })
        })
        .collect::<Result<_, ArtifactError>>()?;
    Ok(DispatcherMeta {
        epilogue: e,
        target: d.target().clone(),
        machine: *d.machine(),
        model: d.model(),
        variants,
        direct,
        trees: d.trees().to_vec(),
        tuned: d.tuned().cloned(),
    })
}

fn dispatcher_of(d: DispatcherMeta, threads: usize, entries: &Entries) -> Result<Dispatcher, ArtifactError> {
    // SAFETY (for the entries below): as in `Entries::get`, each is the generated
    // function the metadata names for that role.
    let packer = |p: &Option<PackerMeta>| -> Result<Option<Packer>, ArtifactError> {
        p.as_ref()
            .map(|p| {
                let f = unsafe { entries.get(&p.func)? };
                Ok(Packer { width: p.width, elem: p.elem, func: f })
            })
            .transpose()
    };
    let packers = |p: &PackersMeta| -> Result<Packers, ArtifactError> {
        let a_rows = p
            .a_rows
            .as_ref()
            .map(|r| {
                let f = unsafe { entries.get(&r.func)? };
                Ok::<_, ArtifactError>(kernels::RowsPacker { width: r.width, elem: r.elem, func: f })
            })
            .transpose()?;
        let mut dequant = [None, None];
        for (slot, (width, bits, func)) in dequant.iter_mut().zip(&p.dequant) {
            let f = unsafe { entries.get(func)? };
            *slot = Some(kernels::Dequantizer { width: *width, bits: *bits, func: f });
        }
        let mut dots = [None, None];
        for (slot, (width, bits, func)) in dots.iter_mut().zip(&p.dots) {
            let f = unsafe { entries.get(func)? };
            *slot = Some(kernels::CodeDot { width: *width, bits: *bits, func: f });
        }
        let rows_packer = |r: &Option<PackerMeta>| {
            r.as_ref()
                .map(|r| {
                    let f = unsafe { entries.get(&r.func)? };
                    Ok::<_, ArtifactError>(kernels::RowsPacker { width: r.width, elem: r.elem, func: f })
                })
                .transpose()
        };
        Ok(Packers {
            a: packer(&p.a)?,
            bt: packer(&p.bt)?,
            a_rows,
            dequant,
            dots,
            a_words: packer(&p.a_words)?,
            a_rows_words: rows_packer(&p.a_rows_words)?,
        })
    };
    let variants = d
        .variants
        .iter()
        .map(|k| {
            let f = unsafe { entries.get(&k.func)? };
            let kernel = MicroKernel {
                mr: k.mr,
                nr: k.nr,
                elem: k.elem,
                func: f,
                epilogue: k.epilogue,
                packers: packers(&k.packers)?,
                amx: k.amx,
            };
            Ok(KernelVariant { kernel, gflops: k.gflops })
        })
        .collect::<Result<Vec<_>, ArtifactError>>()?;
    let direct = d
        .direct
        .iter()
        .map(|k| {
            let f = unsafe { entries.get(&k.func)? };
            let kernel = DirectKernel {
                mr: k.mr,
                nr: k.nr,
                elem: k.elem,
                func: f,
                epilogue: k.epilogue,
                packers: packers(&k.packers)?,
            };
            Ok(DirectVariant { kernel, gflops: k.gflops })
        })
        .collect::<Result<Vec<_>, ArtifactError>>()?;
    let mut family = KernelFamily::new(variants).map_err(malformed)?;
    if !direct.is_empty() {
        family = family.with_direct(direct).map_err(malformed)?;
    }
    let machine = MachineModel { threads, ..d.machine };
    let mut out = Dispatcher::new(d.target, family, machine, d.model);
    for tree in d.trees {
        // Trees are distilled for one thread count: another count dispatches by
        // the model.
        if tree.threads() == threads {
            out.set_tree(tree).map_err(malformed)?;
        }
    }
    // Tuned tables too are measured for one thread count.
    if let Some(t) = d.tuned.filter(|t| t.threads == threads) {
        out = out.with_tuned(t).map_err(malformed)?;
    }
    Ok(out)
}

/// Check every index the runtime follows (buffers, programs, dim slots,
/// parameters): a plan read from a file is not trusted to be consistent.
fn validate(plan: &ModelPlan, inputs: usize, outputs: usize) -> Result<(), String> {
    let (nb, nd, np) = (plan.buffers.len(), plan.dims.len(), plan.programs.len());
    let buf = |b: usize| if b < nb { Ok(()) } else { Err(format!("buffer {b} of {nb}")) };
    let slot = |s: u32| if (s as usize) < nd { Ok(()) } else { Err(format!("dim slot {s} of {nd}")) };
    let view = |v: &View| -> Result<(), String> {
        buf(v.buf)?;
        [v.offset, v.rs, v.cs].into_iter().chain(v.batch.iter().copied()).try_for_each(slot)
    };
    let matmul = |m: &MatMulStep| -> Result<(), String> {
        [m.m, m.n, m.k].into_iter().chain(m.batch.iter().copied()).try_for_each(slot)?;
        view(&m.a)?;
        view(&m.b)?;
        view(&m.c)?;
        m.a_bf16.into_iter().chain(m.c_bf16).try_for_each(buf)?;
        m.epilogue.buffers().try_for_each(buf)?;
        if let Some(t) = &m.taps {
            t.image.iter().chain(&t.strides).chain(&t.out).copied().try_for_each(slot)?;
        }
        Ok(())
    };
    for b in &plan.buffers {
        slot(b.numel)?;
    }
    for p in &plan.programs {
        let x = &p.exprs;
        let e = |e: plan::E| {
            if e.index() < x.len() {
                Ok(())
            } else {
                Err(format!("{}: node {}", p.name, e.index()))
            }
        };
        for i in 0..x.len() {
            match x.node(plan::E(i as u32)) {
                plan::Node::Dim(s) => slot(*s)?,
                plan::Node::Load { buf, .. } if *buf as usize >= p.params.len() => {
                    return Err(format!("{}: a load of parameter {buf}", p.name))
                }
                _ => {}
            }
        }
        p.params.iter().flat_map(|q| &q.shape).chain(&p.space).chain(&p.vars).copied().try_for_each(e)?;
        for s in &p.stores {
            e(s.value)?;
            if s.param as usize >= p.params.len() {
                return Err(format!("{}: a store to parameter {}", p.name, s.param));
            }
        }
        let sc = &p.schedules;
        sc.guards.iter().chain(&sc.row_reduction).copied().try_for_each(e)?;
        sc.border_guards.iter().try_for_each(|b| e(b.guard))?;
        if let Some(rs) = sc.row_scratch {
            e(rs.body)?;
            e(rs.twin)?;
            if rs.param as usize >= p.params.len() {
                return Err(format!("{}: a row scratch in parameter {}", p.name, rs.param));
            }
        }
        if let Some(s) = &sc.split {
            e(s.reduce)?;
            e(s.extent)?;
        }
    }
    for st in &plan.steps {
        match &st.kind {
            StepKind::Loop { program, args } => {
                let p = plan.programs.get(*program).ok_or(format!("program {program} of {np}"))?;
                if args.len() != p.params.len() {
                    return Err(format!(
                        "{}: {} arguments for {} parameters",
                        p.name,
                        args.len(),
                        p.params.len()
                    ));
                }
                args.iter().copied().try_for_each(buf)?;
            }
            StepKind::MatMul(m) => matmul(m)?,
            StepKind::Attention(a) => {
                let AttentionStep { scores, softmax, args, scores_param, probs_param, output, online } =
                    a.as_ref();
                matmul(scores)?;
                matmul(output)?;
                let p = plan.programs.get(*softmax).ok_or(format!("program {softmax} of {np}"))?;
                if args.len() != p.params.len() || *scores_param >= args.len() || *probs_param >= args.len() {
                    return Err(format!("{}: attention arguments do not match its parameters", p.name));
                }
                if let Some(o) = online {
                    let q = plan.programs.get(o.program).ok_or(format!("program {} of {np}", o.program))?;
                    let n = args.len();
                    if q.params.len() != n + 2 || o.max_param != n || o.logits_param != n + 1 {
                        return Err(format!("{}: online softmax parameters do not match", q.name));
                    }
                    slot(o.offset_slot)?;
                    slot(o.len_slot)?;
                }
                args.iter().copied().try_for_each(buf)?;
            }
        }
    }
    for g in &plan.groups {
        if g.steps.end > plan.steps.len() || g.steps.start > g.steps.end {
            return Err("a group's steps past the plan's".into());
        }
    }
    plan.inputs.iter().chain(&plan.outputs).copied().try_for_each(buf)?;
    for b in &plan.buffers {
        match b.kind {
            BufferKind::Input(i) if i >= inputs => {
                return Err(format!("buffer {} is input {i} of {inputs}", b.name))
            }
            BufferKind::Output(i) if i >= plan.outputs.len() => {
                return Err(format!("buffer {} is output {i} of {}", b.name, plan.outputs.len()))
            }
            _ => {}
        }
    }
    if plan.outputs.len() != outputs {
        return Err(format!("{} outputs planned for {outputs} outputs", plan.outputs.len()));
    }
    Ok(())
}

/// The two hashes the header holds, of `file`'s sections: the header's fields
/// (bytes 0..48), the metadata and the code (up to `code_end`); and the weights
/// section (from `weights_at`). Both bounds must lie inside `file`.
fn section_hashes(file: &[u8], code_end: usize, weights_at: usize) -> (blake3::Hash, blake3::Hash) {
    let mut h = blake3::Hasher::new();
    h.update(&file[0..48]);
    h.update(&file[HEADER..code_end]);
    (h.finalize(), blake3::hash(&file[weights_at..]))
}

/// Write into `bytes` the hashes of its sections as the header's sizes place
/// them, as the writer does; bytes too short, or sizes outside them, are left
/// alone. For the fuzzer (and its regression tests): a mutated artifact gets past
/// the hash check to the decoding and validation behind it.
#[doc(hidden)]
pub fn reseal(bytes: &mut [u8]) {
    if bytes.len() < HEADER {
        return;
    }
    let field = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or([0; 8]));
    let (meta, code, weights_at) = (field(16), field(24), field(32));
    let code_end = (HEADER as u64).saturating_add(meta).saturating_add(code);
    if code_end > bytes.len() as u64 || weights_at > bytes.len() as u64 {
        return;
    }
    let (front, weights) = section_hashes(bytes, code_end as usize, weights_at as usize);
    bytes[48..80].copy_from_slice(front.as_bytes());
    bytes[80..112].copy_from_slice(weights.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_targets_list_the_features_turned_on() {
        let t = CodeTarget::new("znver4", "+avx2,-amx-tile,+fma,+avx512f,+avx2");
        assert_eq!(t.features, ["avx2", "avx512f", "fma"]);
        let v3 = CodeTarget::new("x86-64-v3", "");
        assert!(v3.features.iter().any(|f| f == "avx2") && v3.features.iter().any(|f| f == "fma"));
    }

    /// A machine without AVX-512 is told which features the code needs; the
    /// features std cannot detect are not held against it.
    #[test]
    fn missing_features_are_named() {
        let t = CodeTarget::new("znver4", "+avx2,+avx512f,+avx512bw,+prfchw");
        let avx2_only = |f: &str| match f {
            "avx2" => Some(true),
            "avx512f" | "avx512bw" => Some(false),
            _ => None,
        };
        assert_eq!(t.missing_on(avx2_only), ["avx512bw", "avx512f"]);
        // Every feature the generic AVX2 level uses is one std detects.
        for f in X86_64_V3 {
            assert!(detected(f).is_some(), "{f}");
        }
        // This machine runs what it compiles.
        let host = CodeTarget::new("x86-64-v3", "");
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            assert!(host.missing().is_empty(), "{:?}", host.missing());
        }
    }

    #[test]
    fn headers_are_checked_before_anything_else() {
        assert_eq!(Parsed::of(b"", MAGIC).err(), Some(ArtifactError::NotAnArtifact));
        assert_eq!(Parsed::of(b"\x08\x01ONNX....", MAGIC).err(), Some(ArtifactError::NotAnArtifact));
        let mut h = vec![0u8; HEADER];
        h[..8].copy_from_slice(MAGIC);
        h[8..12].copy_from_slice(&(FORMAT_VERSION + 7).to_le_bytes());
        assert_eq!(Parsed::of(&h, MAGIC).err(), Some(ArtifactError::Version { found: FORMAT_VERSION + 7 }));
        h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        // Sizes whose sum overflows, or a weights section before the code.
        h[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(Parsed::of(&h, MAGIC), Err(ArtifactError::Malformed(_))));
        h[16..24].copy_from_slice(&8u64.to_le_bytes());
        h[32..40].copy_from_slice(&4096u64.to_le_bytes());
        h[40..48].copy_from_slice(&(1u64 << 40).to_le_bytes());
        assert!(matches!(Parsed::of(&h, MAGIC), Err(ArtifactError::Truncated { .. })));
    }
}
