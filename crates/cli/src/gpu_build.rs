//! `anyshape gpu-kernels`: generates the GPU GEMM family's PTX (codegen::nvptx),
//! assembles each kernel with ptxas (registers, spills, warnings: a spill or a
//! warning fails the build), writes cubins for the target and the manifest the
//! runner (`anyshape-gpu`, no LLVM) loads on the GPU machine.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::Args;
use gpu::candidates;
use gpu::manifest::PtxasReport;
use gpu::{
    Activation, BLayout, ElemType, Epilogue, GemmKernel, Manifest, ManifestEntry, ReduceKernel, ReducerEntry,
};

#[derive(Args)]
pub struct GpuKernelsArgs {
    /// The folder to write (PTX, cubins, manifest.json).
    #[arg(long)]
    out: PathBuf,
    /// ptxas (from the PyPI wheel nvidia-cuda-nvcc or a CUDA install); without it
    /// only PTX is written.
    #[arg(long)]
    ptxas: Option<PathBuf>,
    /// The architectures ptxas checks every kernel for; cubins are written for the first.
    #[arg(long, value_delimiter = ',', default_value = "sm_90a,sm_80")]
    arch: Vec<String>,
    /// Write each kernel's LLVM IR (.ll) beside its PTX.
    #[arg(long)]
    dump_llvm: bool,
    /// Only kernels whose name contains this.
    #[arg(long)]
    filter: Option<String>,
}

/// The epilogues a transformer's projections fuse.
const EPILOGUES: [Epilogue; 5] = [
    Epilogue { bias: true, ..Epilogue::NONE },
    Epilogue { bias: true, activation: Activation::GeluTanh, ..Epilogue::NONE },
    Epilogue { bias: true, activation: Activation::Gelu, ..Epilogue::NONE },
    Epilogue { bias: true, residual: true, ..Epilogue::NONE },
    Epilogue { residual: true, activation: Activation::Gelu, ..Epilogue::NONE },
];

/// The split-K reductions: per element type, none and each of [`EPILOGUES`].
pub fn reducers() -> Vec<ReduceKernel> {
    let mut out = Vec::new();
    for elem in [ElemType::Bf16, ElemType::F16] {
        out.push(ReduceKernel { elem, epilogue: Epilogue::NONE, c_f32: false });
        out.extend(EPILOGUES.iter().map(|&epilogue| ReduceKernel { elem, epilogue, c_f32: false }));
    }
    out
}

/// The family that is built: for bf16 and f16, both B layouts, every block tile of
/// `candidates::family` (mma.sync) and the wgmma tiles (K-major B) without an
/// epilogue; and for bf16 with a K-major B (a pre-packed weight) the epilogues a
/// transformer's projections fuse, on two mma.sync tiles, the TMA tiles, the GEMV
/// kernels and the element-by-element mma.sync cover; the bf16 Stream-K
/// kernels without an epilogue (checked, and timed against their tiles).
pub fn family() -> Vec<GemmKernel> {
    let mut out = Vec::new();
    for elem in [ElemType::Bf16, ElemType::F16] {
        out.extend(candidates::plain_family(elem));
    }
    out.extend(candidates::stream_k_family(ElemType::Bf16, Epilogue::NONE));
    for epilogue in EPILOGUES {
        for k in candidates::family(ElemType::Bf16, BLayout::KMajor, epilogue) {
            if matches!((k.bm, k.bn), (16, 64) | (128, 128)) {
                out.push(k);
            }
        }
        for k in candidates::wgmma_family(ElemType::Bf16, epilogue) {
            if (k.bm, k.bn) == (128, 128) {
                out.push(k);
            }
        }
        for k in candidates::tma_family(ElemType::Bf16, epilogue) {
            if matches!((k.bm, k.bn), (128, 128) | (128, 256)) {
                out.push(k);
            }
        }
        out.extend(candidates::gemv_family(ElemType::Bf16, epilogue));
        out.extend(candidates::unaligned_family(ElemType::Bf16, epilogue));
    }
    out
}

pub fn gpu_kernels(args: GpuKernelsArgs) -> Result<()> {
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let kernels: Vec<GemmKernel> = family()
        .into_iter()
        .filter(|k| args.filter.as_ref().is_none_or(|f| k.name().contains(f.as_str())))
        .collect();
    if kernels.is_empty() {
        bail!("no kernel matches the filter");
    }
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<Result<ManifestEntry>>>> =
        kernels.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..threads.min(kernels.len()) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(k) = kernels.get(i) else { break };
                let r = build_one(k, &args);
                *results[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
            });
        }
    });
    let mut entries = Vec::new();
    let mut failures = Vec::new();
    for (k, r) in kernels.iter().zip(results) {
        match r.into_inner().unwrap_or_else(|e| e.into_inner()) {
            Some(Ok(e)) => entries.push(e),
            Some(Err(e)) => failures.push(format!("{k}: {e:#}")),
            None => failures.push(format!("{k}: not built")),
        }
    }
    for e in &entries {
        let regs: Vec<String> = e.ptxas.iter().map(|(a, r)| format!("{a} {} regs", r.registers)).collect();
        say!(
            "{:<44} {:>4} threads {:>6} B smem  {}",
            e.name,
            e.kernel.threads(),
            e.kernel.smem_bytes(),
            regs.join(", ")
        );
    }
    if !failures.is_empty() {
        bail!("{} of {} kernels failed:\n{}", failures.len(), kernels.len(), failures.join("\n"));
    }
    let mut reducer_entries = Vec::new();
    for r in reducers() {
        if args.filter.as_ref().is_some_and(|f| !r.name().contains(f.as_str())) {
            continue;
        }
        reducer_entries.push(build_reducer(&r, &args).with_context(|| r.name())?);
    }
    let manifest = Manifest {
        cubin_arch: args.ptxas.as_ref().map(|_| args.arch[0].clone()),
        entries,
        reducers: reducer_entries,
    };
    manifest.save(&args.out).map_err(anyhow::Error::msg)?;
    say!("{} kernels in {}", manifest.entries.len(), args.out.display());
    Ok(())
}

fn build_one(k: &GemmKernel, args: &GpuKernelsArgs) -> Result<ManifestEntry> {
    let name = k.name();
    let ir = codegen::nvptx::llvm_ir(k)?;
    if args.dump_llvm {
        std::fs::write(args.out.join(format!("{name}.ll")), &ir)?;
    }
    let ptx = codegen::nvptx::compile(&ir, &name, k.arch)?;
    let ptx_file = format!("{name}.ptx");
    let ptx_path = args.out.join(&ptx_file);
    std::fs::write(&ptx_path, &ptx)?;
    let mut reports = Vec::new();
    let mut cubin = None;
    if let Some(ptxas) = &args.ptxas {
        // A wgmma kernel exists for sm_90a alone.
        let arches: Vec<&String> =
            args.arch.iter().filter(|a| k.arch != gpu::Arch::Sm90a || a.as_str() == "sm_90a").collect();
        if arches.is_empty() {
            bail!("{name} needs sm_90a, which --arch does not list");
        }
        for (i, arch) in arches.into_iter().enumerate() {
            let cubin_file = format!("{name}.{arch}.cubin");
            let report = assemble(ptxas, &ptx_path, arch, &args.out.join(&cubin_file), &name)?;
            let problems = report.problems();
            if !problems.is_empty() {
                bail!("ptxas {arch}: {}", problems.join("; "));
            }
            reports.push((arch.clone(), report));
            if i == 0 {
                cubin = Some(cubin_file);
            } else {
                std::fs::remove_file(args.out.join(&cubin_file)).ok();
            }
        }
    }
    Ok(ManifestEntry { kernel: *k, name, ptx: ptx_file, cubin, ptxas: reports })
}

fn build_reducer(r: &ReduceKernel, args: &GpuKernelsArgs) -> Result<ReducerEntry> {
    let name = r.name();
    let ir = codegen::nvptx::reduce_ir(r)?;
    if args.dump_llvm {
        std::fs::write(args.out.join(format!("{name}.ll")), &ir)?;
    }
    let ptx = codegen::nvptx::compile(&ir, &name, gpu::Arch::Sm80)?;
    let ptx_file = format!("{name}.ptx");
    std::fs::write(args.out.join(&ptx_file), &ptx)?;
    let mut cubin = None;
    if let Some(ptxas) = &args.ptxas {
        for (i, arch) in args.arch.iter().enumerate() {
            let cubin_file = format!("{name}.{arch}.cubin");
            let report =
                assemble(ptxas, &args.out.join(&ptx_file), arch, &args.out.join(&cubin_file), &name)?;
            if !report.problems().is_empty() {
                bail!("ptxas {arch}: {}", report.problems().join("; "));
            }
            if i == 0 {
                cubin = Some(cubin_file);
            } else {
                std::fs::remove_file(args.out.join(&cubin_file)).ok();
            }
        }
    }
    Ok(ReducerEntry { kernel: *r, name, ptx: ptx_file, cubin })
}

/// `ptxas -v -arch ARCH PTX -o CUBIN`, its report parsed.
fn assemble(ptxas: &Path, ptx: &Path, arch: &str, cubin: &Path, name: &str) -> Result<PtxasReport> {
    let out = Command::new(ptxas)
        .args(["-v", "-O3", "-arch", arch])
        .arg(ptx)
        .arg("-o")
        .arg(cubin)
        .output()
        .with_context(|| format!("running {}", ptxas.display()))?;
    let text = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("ptxas {arch} failed:\n{text}");
    }
    PtxasReport::parse(&text, name).map_err(anyhow::Error::msg)
}
