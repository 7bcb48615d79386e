//! A decision tree distilled from the wave model (BladeDISC §5.2.2): for one product
//! signature (batch, N, K and the layout fixed, as a model's weights fix them) the
//! model's cover as a function of M is a run of intervals; the tree is the binary
//! search over their bounds, so that dispatch costs a few comparisons (and a
//! two-size cover's rows a division). Past the distilled range the model itself
//! is asked.

use crate::cover::Cover;
use crate::kernel::Problem;
use crate::wave::WaveModel;
use serde::{Deserialize, Serialize};

/// Intervals of M, each with its cover: `bounds[i]` is the first M of leaf `i`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MTree {
    pub batch: usize,
    pub n: usize,
    pub k: usize,
    pub bounds: Vec<usize>,
    pub covers: Vec<Cover>,
    /// The largest M distilled; larger M asks the model.
    pub m_max: usize,
}

impl MTree {
    /// Distills `model` for every M in `1..=m_max`. `None` when no kernel accepts
    /// the signature.
    pub fn distill(model: &WaveModel, batch: usize, n: usize, k: usize, m_max: usize) -> Option<MTree> {
        let m_max = m_max.max(1);
        let at = |m: usize| Problem::new(batch, m, n, k);
        // The best two single choices at every M, once: a two-size cover's rest is one.
        let rests: Vec<_> = (1..=m_max).map(|m| model.best_two(&at(m))).collect();
        let mut bounds = Vec::new();
        let mut covers: Vec<Cover> = Vec::new();
        for m in 1..=m_max {
            let (c, _) = model.choose_cover_with(&at(m), &mut |q| rests[q.m - 1])?;
            if covers.last() != Some(&c) {
                bounds.push(m);
                covers.push(c);
            }
        }
        Some(MTree { batch, n, k, bounds, covers, m_max })
    }

    /// The cover for `m`: the leaf whose interval holds it (binary search), or the
    /// model's choice past the distilled range.
    pub fn choose(&self, model: &WaveModel, m: usize) -> Option<Cover> {
        if m == 0 {
            return None;
        }
        if m > self.m_max {
            return model.choose_cover(&Problem::new(self.batch, m, self.n, self.k)).map(|c| c.0);
        }
        let leaf = self.bounds.partition_point(|&b| b <= m) - 1;
        Some(self.covers[leaf])
    }

    /// Comparisons on the longest path: ⌈log2(leaves)⌉.
    pub fn depth(&self) -> usize {
        (usize::BITS - self.bounds.len().saturating_sub(1).leading_zeros()) as usize
    }

    /// A line a leaf: `M in [lo, hi]: cover`, a two-size cover as `main[rows at
    /// lo]+rest`.
    pub fn text(&self, model: &WaveModel) -> String {
        let mut s = format!(
            "tree {}x(Mx{}x{}), {} leaves, depth {}\n",
            self.batch,
            self.n,
            self.k,
            self.bounds.len(),
            self.depth()
        );
        for (j, (&lo, c)) in self.bounds.iter().zip(&self.covers).enumerate() {
            let hi = self.bounds.get(j + 1).map(|b| b - 1).unwrap_or(self.m_max);
            let p = Problem::new(self.batch, lo, self.n, self.k);
            s.push_str(&format!("  M in [{lo}, {hi}]: {}\n", model.describe_cover(c, &p)));
        }
        s
    }
}
