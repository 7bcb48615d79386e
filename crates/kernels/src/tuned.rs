//! Measured macro-kernels: the result of the optional trust-region Bayesian
//! search (TSCompiler §5.1, `tune::bayes`) over a contraction's macro-kernel
//! parameters, and how the dispatcher uses it at run time.
//!
//! TSCompiler tunes a GPU thread block's tiles with the wave count left to run
//! time; the CPU counterpart here is a [`MacroKernel`]: the operand access, the
//! register tile, the cache blocks `KC` and `MC` and the loop order, with the
//! thread grid and the cover height left to the model for each bound shape. The
//! search runs per class of problems that differ only in M (one layer's weight,
//! or one attention product, over a distribution of sequence lengths) and keeps a
//! small collection of macro-kernels; a table over the sampled M's says which one
//! measured fastest (or that the model's own choice did), and a shape between
//! samples takes the choice of the nearest sample (in log M).

use crate::gemm::LoopOrder;
use crate::schedule::{ALayout, BLayout, Operands, Problem, Schedule};
use crate::{Dispatcher, KernelError};

/// The tuned part of a schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct MacroKernel {
    pub operands: Operands,
    pub mr: usize,
    pub nr: usize,
    pub kc: usize,
    /// Rows of A packed per block (a multiple of `mr`; unused by direct kernels).
    pub mc: usize,
    pub order: LoopOrder,
    /// The threads it runs on, when measured at one row count (the measured
    /// dispatch of a weight at a few rows); `None`: the model's grid.
    /// (`default`: tables cached before it existed read as `None`; always
    /// written, so that fixed-layout encodings such as an artifact's read it back.)
    #[serde(default)]
    pub threads: Option<usize>,
}

impl MacroKernel {
    pub fn of(s: &Schedule) -> MacroKernel {
        MacroKernel {
            operands: s.operands,
            mr: s.mr,
            nr: s.nr,
            kc: s.blocking.kc,
            mc: s.blocking.mc,
            order: s.order,
            threads: None,
        }
    }

    /// [`MacroKernel::of`] with its thread count as well.
    pub fn pinned(s: &Schedule) -> MacroKernel {
        MacroKernel { threads: Some(s.grid.threads()), ..MacroKernel::of(s) }
    }

    /// The schedule this macro-kernel gives `p`: the model's best thread grid and
    /// cover among the candidates with this tile and operand access, with this
    /// one's blocks and loop order. `None` when no candidate has the tile (its
    /// padding was filtered out) or a pre-packed B cannot be read in its blocks
    /// ([`BLayout::serves`]).
    pub fn instantiate(&self, d: &Dispatcher, p: &Problem) -> Option<Schedule> {
        if self.mr == 0
            || self.kc == 0
            || (self.operands == Operands::Packed && !self.mc.is_multiple_of(self.mr))
        {
            return None;
        }
        if !p.b.serves(self.nr, self.kc, p.k) {
            return None;
        }
        let same = |s: &Schedule| {
            s.mr == self.mr
                && s.nr == self.nr
                && s.operands == self.operands
                && self.threads.is_none_or(|t| s.grid.threads() == t)
        };
        let mut s = d.choose_where(d.model(), p, same).ok()?;
        s.blocking.kc = self.kc;
        s.blocking.mc = self.mc;
        s.order = self.order;
        Some(s)
    }
}

impl std::fmt::Display for MacroKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.operands {
            Operands::Direct => write!(f, "direct {}x{} kc {}", self.mr, self.nr, self.kc)?,
            Operands::Packed => {
                let order = if self.order == LoopOrder::MOuter { " m-outer" } else { "" };
                write!(f, "{}x{} kc {} mc {}{order}", self.mr, self.nr, self.kc, self.mc)?
            }
        }
        match self.threads {
            Some(t) => write!(f, " on {t} threads"),
            None => Ok(()),
        }
    }
}

/// One sampled row count of a class and what measured fastest there: a
/// macro-kernel of the class (its index), or the model's own choice (`None`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TunedRow {
    pub m: usize,
    pub pick: Option<usize>,
}

/// The tuned macro-kernels of the problems that differ from this one only in M.
/// A weight's class names the layout it was tuned for (`b` is then
/// [`BLayout::Packed`]), which the weight must be packed in.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TunedClass {
    pub batch: usize,
    pub n: usize,
    pub k: usize,
    pub a: ALayout,
    pub b: BLayout,
    pub kernels: Vec<MacroKernel>,
    /// Sorted by `m`, at least one row.
    pub table: Vec<TunedRow>,
}

impl TunedClass {
    fn matches(&self, p: &Problem) -> bool {
        (self.batch, self.n, self.k, self.a, self.b) == (p.batch, p.n, p.k, p.a, p.b)
    }

    /// The choice for `m`: that of the nearest sampled row count in log M.
    pub fn pick(&self, m: usize) -> Option<MacroKernel> {
        let lm = (m.max(1) as f64).ln();
        let row = self.table.iter().min_by(|a, b| {
            let d = |r: &TunedRow| ((r.m.max(1) as f64).ln() - lm).abs();
            d(a).total_cmp(&d(b))
        })?;
        row.pick.and_then(|i| self.kernels.get(i).copied())
    }
}

/// Everything a search tuned, for one thread count and element type.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TunedSchedules {
    pub threads: usize,
    /// The element type of the family the search measured.
    #[serde(default)]
    pub elem: crate::ElemType,
    pub classes: Vec<TunedClass>,
}

impl TunedSchedules {
    /// The class `p` belongs to, if any.
    pub fn class(&self, p: &Problem) -> Option<&TunedClass> {
        self.classes.iter().find(|c| c.matches(p))
    }

    /// The tuned layout of a `k × n` weight, if one was tuned.
    pub fn weight_layout(&self, k: usize, n: usize) -> Option<BLayout> {
        self.classes
            .iter()
            .find(|c| c.batch == 1 && (c.k, c.n) == (k, n) && matches!(c.b, BLayout::Packed { .. }))
            .map(|c| c.b)
    }

    /// Every class must be usable by `d`: its thread count, non-empty sorted
    /// tables whose picks exist, kernels that are in the family, weight kernels
    /// that read the class's layout.
    pub fn check(&self, d: &Dispatcher) -> Result<(), KernelError> {
        let bad = |what: String| Err(KernelError::Shape(format!("tuned schedules: {what}")));
        if self.threads != d.machine().threads {
            return bad(format!(
                "tuned for {} threads, this dispatcher has {}",
                self.threads,
                d.machine().threads
            ));
        }
        if self.elem != d.family().elem() {
            return bad(format!(
                "tuned for {} kernels, this family multiplies {}",
                self.elem,
                d.family().elem()
            ));
        }
        for c in &self.classes {
            let sorted = c.table.windows(2).all(|w| w[0].m < w[1].m);
            if c.table.is_empty()
                || !sorted
                || c.table.iter().any(|r| r.pick.is_some_and(|i| i >= c.kernels.len()))
            {
                return bad(format!(
                    "the table of class {}x{}x{} is empty, unsorted or points past its kernels",
                    c.batch, c.n, c.k
                ));
            }
            for mk in &c.kernels {
                let in_family = match mk.operands {
                    Operands::Packed => d.family().get(mk.mr, mk.nr).is_some(),
                    Operands::Direct => !d.family().direct_from(mk.mr, mk.nr).is_empty(),
                };
                if !in_family {
                    return bad(format!("{mk} is not a kernel of this family"));
                }
                if let BLayout::Packed { nr, kc } = c.b {
                    if !c.b.serves(mk.nr, mk.kc, c.k) {
                        return bad(format!("{mk} does not read the class's weight layout {nr}x{kc}"));
                    }
                }
            }
        }
        Ok(())
    }
}
