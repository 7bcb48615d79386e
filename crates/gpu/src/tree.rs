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
    /// The product the tree is for; its `m` is the tree's to choose (kept 0).
    pub signature: Problem,
    pub bounds: Vec<usize>,
    pub covers: Vec<Cover>,
    /// The largest M distilled; larger M asks the model.
    pub m_max: usize,
}

impl MTree {
    /// Distills `model` for `signature` (batch, N, K, layouts) at every M in
    /// `1..=m_max`. `None` when no kernel accepts the signature.
    pub fn distill(model: &WaveModel, signature: Problem, m_max: usize) -> Option<MTree> {
        let m_max = m_max.max(1);
        let signature = Problem { m: 0, ..signature };
        let at = |m: usize| Problem { m, ..signature };
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
        Some(MTree { signature, bounds, covers, m_max })
    }

    /// The cover for `m`: the leaf whose interval holds it (binary search), or the
    /// model's choice past the distilled range.
    pub fn choose(&self, model: &WaveModel, m: usize) -> Option<Cover> {
        if m == 0 {
            return None;
        }
        if m > self.m_max {
            return model.choose_cover(&Problem { m, ..self.signature }).map(|c| c.0);
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
            "tree {}x(Mx{}x{}) {}, {} leaves, depth {}\n",
            self.signature.batch,
            self.signature.n,
            self.signature.k,
            self.signature.b.tag(),
            self.bounds.len(),
            self.depth()
        );
        for (j, (&lo, c)) in self.bounds.iter().zip(&self.covers).enumerate() {
            let hi = self.bounds.get(j + 1).map(|b| b - 1).unwrap_or(self.m_max);
            let p = Problem { m: lo, ..self.signature };
            s.push_str(&format!("  M in [{lo}, {hi}]: {}\n", model.describe_cover(c, &p)));
        }
        s
    }
}
