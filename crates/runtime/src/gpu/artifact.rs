//! GPU artifacts: a model compiled for NVIDIA GPUs saved to one file and run
//! without the compiler (`anyshape compile --device cuda`, `anyshape-rt`).
//! The CPU artifact's container (`crate::artifact`: header, hashed metadata
//! and code, page-aligned weights) with its own magic, `ANYSHGPU`; the
//! metadata holds the plan, the kernels (each its symbol, its shared memory
//! and what it is: a loop program's, the operand copy, a GEMM of the family,
//! so that a host emulator can rebuild it), which runs each step, and the
//! GPUs the code is for; the code is each kernel's PTX (the driver assembles
//! it for the device at load); the weights are the plan's constants, made
//! bf16 for the GEMMs when the model is loaded.

use std::path::Path;
use std::sync::Arc;

use ir::TensorType;
use plan::gemm::GemmKernel;
use plan::{BufferKind, ModelPlan};
use serde::{Deserialize, Serialize};
use sym::ShapeEnv;

use super::{GpuKernels, KernelCode};
use crate::artifact::ArtifactError;
use crate::artifact::{
    io, malformed, plan_meta, plan_of, range, write_sections, Blob, MappedArtifact, Parsed, PlanMeta,
};

/// The magic a GPU artifact starts with.
pub const GPU_MAGIC: &[u8; 8] = b"ANYSHGPU";

/// What a kernel of a GPU model is.
// A model has a few dozen kernels: a boxed GEMM would save nothing worth a
// pointer chase.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum KernelRole {
    /// Loop program `i` of the plan.
    Loop(usize),
    /// The operand copy (`plan::gpu::OPERAND_COPY_KERNEL`).
    OperandCopy,
    /// A kernel of the GEMM family.
    Gemm(GemmKernel),
    /// The fused attention kernel of head dimension `head` whose logits are
    /// what online softmax program `program` stores in its parameter
    /// `logits` from its scores (parameter `scores`).
    Attention { program: usize, scores: u32, logits: u32, head: usize },
}

/// A model compiled for NVIDIA GPUs, as an artifact holds it.
#[derive(Clone, Debug)]
pub struct GpuArtifact {
    pub plan: ModelPlan,
    pub env: ShapeEnv,
    pub inputs: Vec<(String, TensorType)>,
    pub outputs: Vec<(String, TensorType)>,
    /// Every kernel, in the device's order, and what it is.
    pub kernels: Vec<(KernelCode, KernelRole)>,
    pub steps: GpuKernels,
    /// The GPUs the code is for: `"sm_80"` (every supported GPU) or `"sm_90a"` (Hopper).
    pub arch: String,
}

#[derive(Serialize, Deserialize)]
struct KernelMeta {
    name: String,
    smem: usize,
    role: KernelRole,
    /// Its PTX: a range of the code section.
    code: (u64, u64),
}

#[derive(Serialize, Deserialize)]
struct GpuMeta {
    arch: String,
    env: ShapeEnv,
    inputs: Vec<(String, TensorType)>,
    outputs: Vec<(String, TensorType)>,
    plan: PlanMeta,
    kernels: Vec<KernelMeta>,
    steps: GpuKernels,
}

/// Whether the file at `path` is a GPU artifact.
pub fn is_gpu_artifact(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 8];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && &magic == GPU_MAGIC
}

impl GpuArtifact {
    /// Save at `path` (written to a temporary file beside it and renamed).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), ArtifactError> {
        let path = path.as_ref();
        let mut code = Vec::new();
        let mut kernels = Vec::with_capacity(self.kernels.len());
        for (k, role) in &self.kernels {
            kernels.push(KernelMeta {
                name: k.name.clone(),
                smem: k.smem,
                role: *role,
                code: (code.len() as u64, k.text.len() as u64),
            });
            code.extend_from_slice(k.text.as_bytes());
        }
        let mut blobs: Vec<Option<Blob>> = vec![None; self.plan.buffers.len()];
        let mut order: Vec<(Blob, &[u8])> = Vec::new();
        let mut at = 0u64;
        for (i, b) in self.plan.buffers.iter().enumerate() {
            match &b.kind {
                BufferKind::Constant(c) => {
                    at = at.next_multiple_of(64);
                    let blob = Blob { offset: at, len: c.bytes().len() as u64 };
                    at += blob.len;
                    blobs[i] = Some(blob);
                    order.push((blob, c.bytes()));
                }
                BufferKind::Packed => {
                    return Err(ArtifactError::Unsupported(format!(
                        "weight '{}' is kept only packed for the CPU",
                        b.name
                    )))
                }
                _ => {}
            }
        }
        let meta = GpuMeta {
            arch: self.arch.clone(),
            env: self.env.clone(),
            inputs: self.inputs.clone(),
            outputs: self.outputs.clone(),
            plan: plan_meta(&self.plan, &blobs),
            kernels,
            steps: self.steps.clone(),
        };
        let meta = postcard::to_stdvec(&meta).map_err(malformed)?;
        let tmp =
            path.with_extension(format!("tmp.{}.{:?}", std::process::id(), std::thread::current().id()));
        let write = || -> Result<(), ArtifactError> {
            let file = std::fs::File::create(&tmp).map_err(io(&tmp))?;
            let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
            write_sections(&mut out, &tmp, GPU_MAGIC, &meta, &code, &order)?;
            drop(out);
            std::fs::rename(&tmp, path).map_err(io(path))
        };
        write().inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    }

    /// Load a GPU artifact: its sections checked against their hashes, every
    /// index of its metadata against what it indexes; the weights stay in the
    /// file's mapping until the model uploads them.
    pub fn load(path: impl AsRef<Path>) -> Result<GpuArtifact, ArtifactError> {
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(io(path))?;
        // SAFETY: the mapping is read-only and private; the artifact is written
        // once, to a temporary name, and renamed (as for a CPU artifact).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io(path))?;
        let bytes: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(MappedArtifact(map));
        let file = (*bytes).as_ref();
        let parsed = Parsed::of(file, GPU_MAGIC).map_err(|e| match e {
            ArtifactError::NotAnArtifact => ArtifactError::Malformed("not a GPU artifact".into()),
            e => e,
        })?;
        let meta: GpuMeta = postcard::from_bytes(parsed.meta).map_err(malformed)?;
        let window = |b: Blob| -> Result<std::ops::Range<usize>, ArtifactError> {
            let r = range(b.offset, b.len, parsed.weights_len)?;
            Ok(r.start + parsed.weights_at..r.end + parsed.weights_at)
        };
        let plan = plan_of(meta.plan, &bytes, &window)?;
        let mut kernels = Vec::with_capacity(meta.kernels.len());
        for k in meta.kernels {
            let r = range(k.code.0, k.code.1, parsed.code.len())?;
            let text = std::str::from_utf8(&parsed.code[r]).map_err(malformed)?.to_string();
            if let KernelRole::Loop(i) | KernelRole::Attention { program: i, .. } = k.role {
                if i >= plan.programs.len() {
                    return Err(malformed(format!(
                        "kernel {} is loop program {i} of {}",
                        k.name,
                        plan.programs.len()
                    )));
                }
            }
            kernels.push((KernelCode { name: k.name, text, smem: k.smem }, k.role));
        }
        let n = kernels.len();
        let s = &meta.steps;
        let bad_index = s
            .loops
            .iter()
            .chain([&s.operand_copy])
            .chain(s.matmuls.iter().flatten().map(|c| &c.index))
            .chain(s.attentions.iter().flatten().map(|c| &c.index))
            .any(|&i| i >= n);
        if bad_index
            || s.loops.len() != plan.programs.len()
            || s.matmuls.len() != plan.steps.len()
            || s.attentions.len() != plan.steps.len()
        {
            return Err(malformed("the steps' kernels do not match the kernels and the plan"));
        }
        for c in s.matmuls.iter().flatten() {
            if kernels[c.index].1 != KernelRole::Gemm(c.kernel) {
                return Err(malformed(format!("kernel {} is not the GEMM {}", c.index, c.kernel)));
            }
        }
        for c in s.attentions.iter().flatten() {
            if !matches!(kernels[c.index].1, KernelRole::Attention { head, .. } if head == c.head) {
                return Err(malformed(format!(
                    "kernel {} is not an attention kernel of head {}",
                    c.index, c.head
                )));
            }
        }
        if meta.arch != "sm_80" && meta.arch != "sm_90a" {
            return Err(malformed(format!("code for {}", meta.arch)));
        }
        Ok(GpuArtifact {
            plan,
            env: meta.env,
            inputs: meta.inputs,
            outputs: meta.outputs,
            kernels,
            steps: meta.steps,
            arch: meta.arch,
        })
    }
}

#[cfg(feature = "cuda")]
impl GpuArtifact {
    /// The model on NVIDIA GPU `ordinal`: its kernels loaded (the driver
    /// assembles the PTX), its weights uploaded. Code for sm_90a on another
    /// GPU is an error saying so.
    pub fn open(self, ordinal: usize) -> Result<super::GpuModel<super::cuda::CudaDevice>, crate::RunError> {
        let cc = super::cuda::CudaDevice::compute_capability(ordinal)?;
        if self.arch == "sm_90a" && cc != (9, 0) {
            return Err(crate::RunError::Device(format!(
                "the artifact's kernels are for sm_90a (Hopper); GPU {ordinal} is sm_{}{}: compile it for sm_80",
                cc.0, cc.1
            )));
        }
        let code: Vec<KernelCode> = self.kernels.into_iter().map(|(c, _)| c).collect();
        let device = super::cuda::CudaDevice::open(ordinal, &code)?;
        super::GpuModel::new(self.plan, self.env, self.inputs, self.outputs, self.steps, device)
    }
}
