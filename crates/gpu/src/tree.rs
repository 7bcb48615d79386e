//! A decision tree distilled from the wave model (BladeDISC §5.2.2): for one product
//! signature (batch, N, K and the layout fixed, as a model's weights fix them) the
//! model's choice as a function of M is a run of intervals; the tree is the binary
//! search over their bounds, so that dispatch costs a few comparisons. Past the
//! distilled range the model itself is asked (a few multiply-adds per kernel).

use crate::kernel::Problem;
use crate::wave::{Choice, WaveModel};
use serde::{Deserialize, Serialize};

/// Intervals of M, each with its kernel: `bounds[i]` is the first M of leaf `i`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MTree {
    pub batch: usize,
    pub n: usize,
    pub k: usize,
    pub bounds: Vec<usize>,
    pub kernels: Vec<Choice>,
    /// The largest M distilled; larger M asks the model.
    pub m_max: usize,
}

impl MTree {
    /// Distills `model` for every M in `1..=m_max`. `None` when no kernel accepts
    /// the signature.
    pub fn distill(model: &WaveModel, batch: usize, n: usize, k: usize, m_max: usize) -> Option<MTree> {
        let mut bounds = Vec::new();
        let mut kernels: Vec<Choice> = Vec::new();
        for m in 1..=m_max.max(1) {
            let (i, _) = model.choose(&Problem::new(batch, m, n, k))?;
            if kernels.last() != Some(&i) {
                bounds.push(m);
                kernels.push(i);
            }
        }
        Some(MTree { batch, n, k, bounds, kernels, m_max: m_max.max(1) })
    }

    /// The kernel for `m`: the leaf whose interval holds it (binary search), or the
    /// model's choice past the distilled range.
    pub fn choose(&self, model: &WaveModel, m: usize) -> Option<Choice> {
        if m == 0 {
            return None;
        }
        if m > self.m_max {
            return model.choose(&Problem::new(self.batch, m, self.n, self.k)).map(|c| c.0);
        }
        let leaf = self.bounds.partition_point(|&b| b <= m) - 1;
        Some(self.kernels[leaf])
    }

    /// Comparisons on the longest path: ⌈log2(leaves)⌉.
    pub fn depth(&self) -> usize {
        (usize::BITS - self.bounds.len().saturating_sub(1).leading_zeros()) as usize
    }

    /// A line a leaf: `M in [lo, hi]: kernel`.
    pub fn text(&self, model: &WaveModel) -> String {
        let mut s = format!(
            "tree {}x(Mx{}x{}), {} leaves, depth {}\n",
            self.batch,
            self.n,
            self.k,
            self.bounds.len(),
            self.depth()
        );
        for (j, (&lo, &i)) in self.bounds.iter().zip(&self.kernels).enumerate() {
            let hi = self.bounds.get(j + 1).map(|b| b - 1).unwrap_or(self.m_max);
            s.push_str(&format!("  M in [{lo}, {hi}]: {}\n", model.describe(i)));
        }
        s
    }
}
