//! GPU artifacts: a model compiled for NVIDIA GPUs saved to one file and run
//! without the compiler (`anyshape compile --device cuda`, `anyshape-rt`).
//! The CPU artifact's container (`crate::artifact`: header, hashed metadata
//! and code, page-aligned weights) with its own magic, `ANYSHGPU`. The
//! metadata holds the plan and, for each GPU architecture the model was
//! compiled for (sm_90a: Hopper's wgmma kernels; sm_80: every supported GPU),
//! its kernels (each its symbol, its shared memory and what it is: a loop
//! program's, the operand copy, a GEMM of the family, an attention kernel,
//! so that a host emulator can rebuild it) and which runs each step. The code
//! is each kernel's PTX and, where ptxas was at hand when it was compiled,
//! its cubin (the driver loads it without assembling anything). The weights
//! are what the GPU reads: the GEMMs' weights as bf16 `[N, K]`, the other
//! constants as they are; a constant only contractions read is not kept f32.

use std::path::Path;
use std::sync::Arc;

use ir::TensorType;
use plan::gemm::{Arch, GemmKernel};
use plan::gpu::{AttentionMma, KernelLaunch};
use plan::{BufferKind, ModelPlan};
use serde::{Deserialize, Serialize};
use sym::ShapeEnv;

use super::{read_unpacked, GpuKernels, GpuWeight, KernelCode};
use crate::artifact::ArtifactError;
use crate::artifact::{
    io, malformed, plan_meta, plan_of, range, write_sections, Blob, MappedArtifact, Parsed, PlanMeta, Window,
};

/// The magic a GPU artifact starts with.
pub const GPU_MAGIC: &[u8; 8] = b"ANYSHGPU";

/// The architectures a GPU artifact's code may be for.
pub const GPU_ARCHS: [&str; 2] = [HOPPER, EVERY_GPU];

/// The code a Hopper (9.0) runs, and the code every supported GPU runs.
const HOPPER: &str = Arch::Sm90a.sm();
const EVERY_GPU: &str = Arch::Sm80.sm();

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
    /// `logits` from its scores (parameter `scores`), multiplying by `mma`.
    Attention {
        program: usize,
        scores: u32,
        logits: u32,
        head: usize,
        mma: AttentionMma,
        /// The output is stored in bf16.
        #[serde(default)]
        out_bf16: bool,
    },
}

/// A model compiled for NVIDIA GPUs, as an artifact holds it.
#[derive(Clone, Debug)]
pub struct GpuArtifact {
    pub plan: ModelPlan,
    pub env: ShapeEnv,
    pub inputs: Vec<(String, TensorType)>,
    pub outputs: Vec<(String, TensorType)>,
    /// The GEMMs' weights ([`super::pack_weights`]).
    pub weights: Vec<GpuWeight>,
    /// The code for each architecture, the most specific first.
    pub code: Vec<GpuCode>,
}

/// A model's code for one GPU architecture.
#[derive(Clone, Debug)]
pub struct GpuCode {
    /// `"sm_90a"` (Hopper) or `"sm_80"` (every supported GPU).
    pub arch: String,
    /// Every kernel, in the device's order, and what it is.
    pub kernels: Vec<(KernelCode, KernelRole)>,
    pub steps: GpuKernels,
}

impl GpuCode {
    /// How many of its kernels have a cubin.
    pub fn cubins(&self) -> usize {
        self.kernels.iter().filter(|(k, _)| k.cubin.is_some()).count()
    }
}

#[derive(Serialize, Deserialize)]
struct KernelMeta {
    name: String,
    smem: usize,
    role: KernelRole,
    launch: KernelLaunch,
    /// Its PTX: a range of the code section.
    code: (u64, u64),
    /// Its cubin, if any: a range of the code section.
    cubin: Option<(u64, u64)>,
}

#[derive(Serialize, Deserialize)]
struct CodeMeta {
    arch: String,
    kernels: Vec<KernelMeta>,
    steps: GpuKernels,
}

#[derive(Serialize, Deserialize)]
struct GpuMeta {
    env: ShapeEnv,
    inputs: Vec<(String, TensorType)>,
    outputs: Vec<(String, TensorType)>,
    plan: PlanMeta,
    /// Each packed weight: the step that reads it first, its bytes.
    weights: Vec<(usize, Blob)>,
    code: Vec<CodeMeta>,
}

/// Which of `archs` (an artifact's, most specific first) a GPU of compute
/// capability `cc` runs, and whether their cubins are for it: sm_90a's
/// only on a Hopper (9.0); sm_80's on any GPU from 8.0 on, its cubins on
/// 8.x (newer GPUs have the driver assemble its PTX).
pub fn code_for(archs: &[&str], cc: (i32, i32)) -> Result<(usize, bool), String> {
    if cc == (9, 0) {
        if let Some(i) = archs.iter().position(|a| *a == HOPPER) {
            return Ok((i, true));
        }
    }
    if cc >= (8, 0) {
        if let Some(i) = archs.iter().position(|a| *a == EVERY_GPU) {
            return Ok((i, cc.0 == 8));
        }
    }
    Err(format!(
        "the artifact's kernels are for {}; this GPU is sm_{}{}: compile it for {}",
        archs.join(" and "),
        cc.0,
        cc.1,
        if cc == (9, 0) { GPU_ARCHS.join(" or ") } else { EVERY_GPU.to_string() }
    ))
}

/// Whether the file at `path` is a GPU artifact.
pub fn is_gpu_artifact(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 8];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && &magic == GPU_MAGIC
}

impl GpuArtifact {
    /// The architectures it holds code for, most specific first.
    pub fn archs(&self) -> Vec<&str> {
        self.code.iter().map(|c| c.arch.as_str()).collect()
    }

    /// Save at `path` (written to a temporary file beside it and renamed).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), ArtifactError> {
        let path = path.as_ref();
        let mut bytes = Vec::new();
        let mut put = |b: &[u8]| {
            let at = (bytes.len() as u64, b.len() as u64);
            bytes.extend_from_slice(b);
            at
        };
        let mut code = Vec::with_capacity(self.code.len());
        for c in &self.code {
            let mut kernels = Vec::with_capacity(c.kernels.len());
            for (k, role) in &c.kernels {
                kernels.push(KernelMeta {
                    name: k.name.clone(),
                    smem: k.smem,
                    role: *role,
                    launch: k.launch,
                    code: put(k.text.as_bytes()),
                    cubin: k.cubin.as_deref().map(&mut put),
                });
            }
            code.push(CodeMeta { arch: c.arch.clone(), kernels, steps: c.steps.clone() });
        }
        let read = read_unpacked(&self.plan);
        let mut blobs: Vec<Option<Blob>> = vec![None; self.plan.buffers.len()];
        let mut order: Vec<(Blob, &[u8])> = Vec::new();
        let mut at = 0u64;
        let mut blob = |b: &[u8]| {
            at = at.next_multiple_of(64);
            let blob = Blob { offset: at, len: b.len() as u64 };
            at += blob.len;
            blob
        };
        let mut weights = Vec::with_capacity(self.weights.len());
        for w in &self.weights {
            let b = blob(&w.bytes);
            weights.push((w.step, b));
            order.push((b, &w.bytes));
        }
        for (i, b) in self.plan.buffers.iter().enumerate() {
            match &b.kind {
                BufferKind::Constant(c) if read[i] => {
                    let at = blob(c.bytes());
                    blobs[i] = Some(at);
                    order.push((at, c.bytes()));
                }
                BufferKind::Packed if read[i] => {
                    return Err(ArtifactError::Unsupported(format!(
                        "weight '{}' is kept only packed for the CPU",
                        b.name
                    )))
                }
                _ => {}
            }
        }
        let meta = GpuMeta {
            env: self.env.clone(),
            inputs: self.inputs.clone(),
            outputs: self.outputs.clone(),
            plan: plan_meta(&self.plan, &blobs),
            weights,
            code,
        };
        let meta = postcard::to_stdvec(&meta).map_err(malformed)?;
        let tmp =
            path.with_extension(format!("tmp.{}.{:?}", std::process::id(), std::thread::current().id()));
        let write = || -> Result<(), ArtifactError> {
            let file = std::fs::File::create(&tmp).map_err(io(&tmp))?;
            let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
            write_sections(&mut out, &tmp, GPU_MAGIC, &meta, &bytes, &order)?;
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
        let mut weights = Vec::with_capacity(meta.weights.len());
        for (step, b) in meta.weights {
            if step >= plan.steps.len() {
                return Err(malformed(format!("a weight of step {step} of {}", plan.steps.len())));
            }
            let data = bytes::Bytes::from_owner(Window(bytes.clone(), window(b)?));
            weights.push(GpuWeight { step, bytes: data });
        }
        if meta.code.is_empty() {
            return Err(malformed("no code for any GPU"));
        }
        let mut code = Vec::with_capacity(meta.code.len());
        for c in meta.code {
            if !GPU_ARCHS.contains(&c.arch.as_str()) || code.iter().any(|d: &GpuCode| d.arch == c.arch) {
                return Err(malformed(format!("code for {}", c.arch)));
            }
            let kernels = kernels_of(c.kernels, parsed.code, &plan)?;
            check_steps(&c.steps, &kernels, &plan)?;
            code.push(GpuCode { arch: c.arch, kernels, steps: c.steps });
        }
        Ok(GpuArtifact { plan, env: meta.env, inputs: meta.inputs, outputs: meta.outputs, weights, code })
    }
}

/// The kernels `list` describes, their PTX and cubins read from `code`.
fn kernels_of(
    list: Vec<KernelMeta>,
    code: &[u8],
    plan: &ModelPlan,
) -> Result<Vec<(KernelCode, KernelRole)>, ArtifactError> {
    let mut kernels = Vec::with_capacity(list.len());
    for k in list {
        let r = range(k.code.0, k.code.1, code.len())?;
        let text = std::str::from_utf8(&code[r]).map_err(malformed)?.to_string();
        let cubin = match k.cubin {
            Some((at, len)) => Some(code[range(at, len, code.len())?].to_vec()),
            None => None,
        };
        if let KernelRole::Loop(i) | KernelRole::Attention { program: i, .. } = k.role {
            if i >= plan.programs.len() {
                return Err(malformed(format!(
                    "kernel {} is loop program {i} of {}",
                    k.name,
                    plan.programs.len()
                )));
            }
        }
        kernels.push((KernelCode { name: k.name, text, smem: k.smem, cubin, launch: k.launch }, k.role));
    }
    Ok(kernels)
}

/// That `s`'s indices are of `kernels`, of the kinds its steps need.
fn check_steps(
    s: &GpuKernels,
    kernels: &[(KernelCode, KernelRole)],
    plan: &ModelPlan,
) -> Result<(), ArtifactError> {
    let n = kernels.len();
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
        // A split-K choice folds its shares itself in at least two; a
        // whole-product one runs in one.
        let fits = if c.kernel.split_k { c.kernel.fold && c.splits >= 2 } else { c.splits == 1 };
        if !fits {
            return Err(malformed(format!("GEMM {} cannot run in {} shares of K", c.kernel, c.splits)));
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
    Ok(())
}

#[cfg(feature = "cuda")]
impl GpuArtifact {
    /// The model on NVIDIA GPU `ordinal`: the code for its architecture
    /// ([`code_for`]) loaded (cubins where they are for it, else the PTX,
    /// which the driver assembles), its weights uploaded. A GPU none of the
    /// code is for is an error saying which to compile for.
    pub fn open(
        mut self,
        ordinal: usize,
    ) -> Result<super::GpuModel<super::cuda::CudaDevice>, crate::RunError> {
        let cc = super::cuda::CudaDevice::compute_capability(ordinal)?;
        let (at, cubins) = code_for(&self.archs(), cc).map_err(crate::RunError::Device)?;
        let c = self.code.swap_remove(at);
        let code: Vec<KernelCode> = c
            .kernels
            .into_iter()
            .map(|(k, _)| KernelCode { cubin: k.cubin.filter(|_| cubins), ..k })
            .collect();
        let device = super::cuda::CudaDevice::open(ordinal, &code)?;
        super::GpuModel::with_weights(
            self.plan,
            self.env,
            self.inputs,
            self.outputs,
            c.steps,
            self.weights,
            device,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::code_for;

    #[test]
    fn each_gpu_gets_the_code_for_it() {
        let both = ["sm_90a", "sm_80"];
        assert_eq!(code_for(&both, (9, 0)), Ok((0, true)));
        assert_eq!(code_for(&both, (8, 0)), Ok((1, true)));
        assert_eq!(code_for(&both, (8, 9)), Ok((1, true)));
        // A newer GPU than the cubins: the sm_80 PTX, assembled by the driver.
        assert_eq!(code_for(&both, (10, 0)), Ok((1, false)));
        assert_eq!(code_for(&["sm_80"], (9, 0)), Ok((0, false)));
        let e = code_for(&["sm_90a"], (8, 6)).unwrap_err();
        assert!(e.contains("sm_90a") && e.contains("sm_86") && e.contains("compile it for sm_80"), "{e}");
        let e = code_for(&["sm_90a"], (12, 0)).unwrap_err();
        assert!(e.contains("sm_120"), "{e}");
        assert!(code_for(&both, (7, 5)).is_err());
    }
}
