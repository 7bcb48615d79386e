//! Cubins for a GPU artifact: each kernel's PTX assembled by NVIDIA's
//! `ptxas` (the PyPI wheel `nvidia-cuda-nvcc` or a CUDA install; it runs
//! without a GPU), so that the GPU machine's driver loads machine code
//! instead of assembling PTX at load.

use std::path::{Path, PathBuf};
use std::process::Command;

use runtime::gpu::KernelCode;

use crate::Error;

/// ptxas where a user has it: `ANYSHAPE_PTXAS` (unless empty), else `ptxas` on `PATH`,
/// else a CUDA install's (`/usr/local/cuda/bin/ptxas`).
pub fn find_ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ANYSHAPE_PTXAS").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("ptxas"));
    on_path.chain([PathBuf::from("/usr/local/cuda/bin/ptxas")]).find(|p| p.is_file())
}

/// Each of `kernels`' PTX assembled for `arch` (`sm_90a`, `sm_80`) into its
/// cubin, a ptxas process per kernel, as many at once as there are cores.
pub fn assemble_all(ptxas: &Path, arch: &str, kernels: &mut [KernelCode]) -> Result<(), Error> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(kernels.len().max(1));
    let per = kernels.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let jobs: Vec<_> = kernels
            .chunks_mut(per)
            .map(|chunk| {
                s.spawn(move || -> Result<(), Error> {
                    for k in chunk {
                        k.cubin = Some(assemble(ptxas, arch, k)?);
                    }
                    Ok(())
                })
            })
            .collect();
        jobs.into_iter()
            .try_for_each(|h| h.join().unwrap_or_else(|_| Err(ptxas_error("a ptxas thread panicked"))))
    })
}

fn ptxas_error(why: impl Into<String>) -> Error {
    Error::Ptxas(why.into())
}

/// `ptxas -O3 -arch ARCH K.ptx -o K.cubin` in a temporary folder of the
/// calling thread's own.
fn assemble(ptxas: &Path, arch: &str, k: &KernelCode) -> Result<Vec<u8>, Error> {
    let thread =
        format!("{:?}", std::thread::current().id()).replace(|c: char| !c.is_ascii_alphanumeric(), "");
    let dir = std::env::temp_dir().join(format!("anyshape-ptxas-{}-{thread}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| ptxas_error(format!("{}: {e}", dir.display())))?;
    let (ptx, cubin) = (dir.join("kernel.ptx"), dir.join("kernel.cubin"));
    let run = || -> Result<Vec<u8>, Error> {
        std::fs::write(&ptx, &k.text).map_err(|e| ptxas_error(format!("{}: {e}", ptx.display())))?;
        let out = Command::new(ptxas)
            .args(["-O3", "-arch", arch])
            .arg(&ptx)
            .arg("-o")
            .arg(&cubin)
            .output()
            .map_err(|e| ptxas_error(format!("running {}: {e}", ptxas.display())))?;
        if !out.status.success() {
            let text = String::from_utf8_lossy(&out.stderr);
            return Err(ptxas_error(format!("{} for {arch} failed: {}", k.name, text.trim())));
        }
        std::fs::read(&cubin).map_err(|e| ptxas_error(format!("{}: {e}", cubin.display())))
    };
    let result = run();
    let _ = std::fs::remove_dir_all(&dir);
    result
}
