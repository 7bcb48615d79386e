//! TSCompiler's wave/occupancy model (§6): the run-time choice among pre-compiled
//! kernels. A launch's thread blocks run in waves over the SMs, as many blocks an SM
//! at once as its registers, shared memory and thread slots allow; a kernel's time
//! is its waves times one block's time, which is linear in the block's K steps at
//! that occupancy (measured once per kernel on the device: the lowest level is
//! measured, the levels above are modeled, Vortex §5). A memory floor (operands and
//! result moved once at the device's bandwidth) and the launch cost bound it below.

use crate::kernel::{GemmKernel, Problem};
use serde::{Deserialize, Serialize};

/// What the model knows of the device (queried by the runner, or Hopper's figures).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceLimits {
    pub sms: usize,
    pub regs_per_sm: usize,
    pub smem_per_sm: usize,
    pub threads_per_sm: usize,
    pub blocks_per_sm: usize,
    /// Device memory bandwidth, bytes/s.
    pub bandwidth: f64,
    /// A launch's fixed cost, seconds.
    pub launch: f64,
}

impl DeviceLimits {
    /// H100/H200 SXM (compute capability 9.0): 132 SMs, 64K registers, 228 KB of
    /// shared memory (1 KB of it reserved a block), 2048 threads and 32 blocks an SM.
    pub fn hopper(bandwidth: f64) -> DeviceLimits {
        DeviceLimits {
            sms: 132,
            regs_per_sm: 65536,
            smem_per_sm: 228 * 1024,
            threads_per_sm: 2048,
            blocks_per_sm: 32,
            bandwidth,
            launch: 3e-6,
        }
    }
}

/// Blocks of `k` resident on one SM at once, given its real register count: registers
/// are allocated per warp in units of 256, shared memory with 1 KB reserved a block.
pub fn occupancy(k: &GemmKernel, regs_per_thread: usize, d: &DeviceLimits) -> usize {
    let warp_regs = (regs_per_thread.max(1) * 32).div_ceil(256) * 256;
    let by_regs = d.regs_per_sm / (warp_regs * k.warps());
    let by_smem = d.smem_per_sm / (k.smem_bytes() + 1024);
    let by_threads = d.threads_per_sm / k.threads();
    by_regs.min(by_smem).min(by_threads).min(d.blocks_per_sm)
}

/// One kernel's measured costs: a wave of blocks at full occupancy (every SM holding
/// `occupancy` of them) takes `fixed + per_kstep · steps`; one block alone on an SM
/// takes `fixed_alone + per_kstep_alone · steps` (its latency: a partial wave with
/// few blocks an SM runs at this, not at a share of the full wave's time).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelRate {
    pub name: String,
    pub regs: usize,
    pub occupancy: usize,
    pub fixed: f64,
    pub per_kstep: f64,
    pub fixed_alone: f64,
    pub per_kstep_alone: f64,
}

/// The model over a compiled family: its kernels and their measured rates.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WaveModel {
    pub device: DeviceLimits,
    pub kernels: Vec<GemmKernel>,
    pub rates: Vec<KernelRate>,
}

impl WaveModel {
    /// Predicted seconds of kernel `i` on `p`: the full waves, each at the full
    /// wave's time, then the last partial wave, whose `r` blocks an SM take the
    /// longer of one block's latency and `r/occupancy` of a full wave (the SM's
    /// throughput shared by fewer blocks). The SMs a partial wave leaves idle are
    /// the waste that makes a smaller tile win at some M (TSCompiler §6, FTuner).
    pub fn predict(&self, i: usize, p: &Problem) -> f64 {
        let k = &self.kernels[i];
        let r = &self.rates[i];
        let occ = r.occupancy.max(1);
        let slots = self.device.sms * occ;
        let blocks = k.blocks(p);
        let steps = p.k.div_ceil(k.bk()) as f64;
        let wave = r.fixed + r.per_kstep * steps;
        let mut t = (blocks / slots) as f64 * wave;
        let rest = blocks % slots;
        if rest > 0 {
            let per_sm = rest.div_ceil(self.device.sms) as f64;
            let alone = r.fixed_alone + r.per_kstep_alone * steps;
            t += alone.max(per_sm / occ as f64 * wave);
        }
        t.max(p.min_bytes() / self.device.bandwidth) + self.device.launch
    }

    /// The kernel the model picks for `p` among those that accept it, with its
    /// predicted time; `None` when none does.
    pub fn choose(&self, p: &Problem) -> Option<(usize, f64)> {
        (0..self.kernels.len())
            .filter(|&i| self.kernels[i].accepts(p).is_ok())
            .map(|i| (i, self.predict(i, p)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
    }
}
