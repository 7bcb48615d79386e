//! FTuner's combination of two kernel sizes along M (Alg. 2), on the GPU: a
//! product's rows are covered by one choice, or by a `main` kernel over whole tiles
//! of its height and a `rest` choice over the rows below, launched one after the
//! other on the same operands (A and C offset by the main's rows).
//!
//! The kernels pad their ragged edges locally, so a second size does not remove
//! padding copies here; what it removes is the waste of whole tiles and waves. A
//! main kernel whose last tile row spills into one more wave (138 blocks of
//! 128×128 on 132 SMs: a second wave for six blocks) covers the rows that fill its
//! waves, and a small kernel (a split-K GEMV for a few rows) the rest, at the
//! price of a second launch. The wave model prices both launches and keeps the
//! cover only where it predicts a gain ([`WaveModel::choose_cover`]).

use crate::kernel::{GemmKernel, Problem};
use crate::wave::{Choice, WaveModel};
use serde::{Deserialize, Serialize};

/// How much faster than the best single choice the model must predict a two-size
/// cover before it takes it: the model's misses on single launches run to a few
/// percent (`anyshape-gpu replay`), and a cover stakes a second launch on them.
pub const COVER_MARGIN: f64 = 0.03;

/// The second size of a two-size cover: `main` takes at most `max_tiles` of its tile
/// rows (`usize::MAX`: every whole tile row), `rest` the rows below them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Split {
    pub max_tiles: usize,
    pub rest: Choice,
}

/// How a product's rows are covered: `main` over all of them, or over the first
/// [`Cover::rows`] and `split.rest` over the others.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Cover {
    pub main: Choice,
    pub split: Option<Split>,
}

/// One launch of a cover: `choice` on `problem`, whose rows start at `first_row` of
/// the whole product (A and C, and the residual, offset by that many rows; B, the
/// bias and the batch strides as they are).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub choice: Choice,
    pub first_row: usize,
    pub problem: Problem,
}

impl Cover {
    /// One choice over every row.
    pub fn one(main: Choice) -> Cover {
        Cover { main, split: None }
    }

    /// Rows the main choice covers on `p` (all of them without a split): whole tiles
    /// of its height, at most `max_tiles`. `kernels`: those the choices index.
    pub fn rows(&self, kernels: &[GemmKernel], p: &Problem) -> usize {
        match self.split {
            None => p.m,
            Some(s) => {
                let bm = kernels[self.main.kernel].bm;
                (p.m / bm).min(s.max_tiles) * bm
            }
        }
    }

    /// The cover as text on `p`: the single choice's name, or `main[rows]+rest`
    /// (choices named as [`Choice::name`]).
    pub fn text(&self, kernels: &[GemmKernel], p: &Problem) -> String {
        let rows = self.rows(kernels, p);
        match self.split {
            Some(s) if rows < p.m => format!("{}[{rows}]+{}", self.main.name(kernels), s.rest.name(kernels)),
            _ => self.main.name(kernels),
        }
    }

    /// The launches of this cover on `p`, in order: the main choice's rows, then the
    /// rest's (left out where the main covers every row).
    pub fn pieces(&self, kernels: &[GemmKernel], p: &Problem) -> Vec<Piece> {
        let rows = self.rows(kernels, p);
        let mut out = Vec::with_capacity(2);
        if rows > 0 {
            out.push(Piece { choice: self.main, first_row: 0, problem: Problem { m: rows, ..*p } });
        }
        if let Some(s) = self.split.filter(|_| rows < p.m) {
            out.push(Piece { choice: s.rest, first_row: rows, problem: Problem { m: p.m - rows, ..*p } });
        }
        out
    }
}

impl WaveModel {
    /// Predicted seconds of cover `c` on `p`: its launches one after the other.
    pub fn predict_cover(&self, c: &Cover, p: &Problem) -> f64 {
        c.pieces(&self.kernels, p).iter().map(|x| self.predict(x.choice, &x.problem)).sum()
    }

    /// The main choices of two-size covers of `p` and the tile rows each may take:
    /// every whole-tile kernel that accepts `p` (not split-K) whose tiles leave rows
    /// over, taking every whole tile row, or only those that fill its last full wave
    /// where that leaves rows over too. Each with the rows it covers.
    fn two_size_mains(&self, p: &Problem) -> Vec<(Choice, usize, usize)> {
        let mut out = Vec::new();
        for c in self.choices(p) {
            let k = &self.kernels[c.kernel];
            if k.split_k {
                continue;
            }
            let whole = p.m / k.bm;
            if whole == 0 {
                continue;
            }
            if whole * k.bm < p.m {
                out.push((c, usize::MAX, whole * k.bm));
            }
            // The tile rows that fill the full waves alone: the rest takes the blocks
            // that would have run as the last, partial wave.
            let per_row = p.n.div_ceil(k.bn) * p.batch;
            let slots = self.device.sms * self.rates[c.kernel].occupancy.max(1);
            let waves = whole * per_row / slots;
            let tiles = waves * slots / per_row;
            if waves >= 1 && tiles >= 1 && tiles < whole {
                out.push((c, tiles, tiles * k.bm));
            }
        }
        out
    }

    /// The two-size covers of `p` with their predicted times: for each main of
    /// [`two_size_mains`](Self::two_size_mains), the best single choice of another
    /// kernel for the rows left over (the same kernel twice is one launch too many).
    /// `rests` gives the best two single choices of distinct kernels for those rows.
    fn two_sizes(&self, p: &Problem, rests: &mut dyn FnMut(&Problem) -> Rests) -> Vec<(Cover, f64)> {
        let mut out = Vec::new();
        for (main, max_tiles, rows) in self.two_size_mains(p) {
            let [first, second] = rests(&Problem { m: p.m - rows, ..*p });
            let rest = match first {
                Some((r, _)) if r.kernel == main.kernel => second,
                _ => first,
            };
            if let Some((r, tr)) = rest {
                let t = self.predict(main, &Problem { m: rows, ..*p }) + tr;
                out.push((Cover { main, split: Some(Split { max_tiles, rest: r }) }, t));
            }
        }
        out
    }

    /// Every cover of `p` the model weighs: each single choice, and each two-size
    /// cover ([`two_sizes`](Self::two_sizes)).
    pub fn covers(&self, p: &Problem) -> Vec<Cover> {
        let mut memo = Memo::default();
        let mut out: Vec<Cover> = self.choices(p).into_iter().map(Cover::one).collect();
        out.extend(self.two_sizes(p, &mut |q| memo.rests(self, q)).into_iter().map(|c| c.0));
        out
    }

    /// The cover the model picks for `p`, with its predicted time; `None` when no
    /// kernel accepts it. A two-size cover is taken only where it is predicted
    /// [`COVER_MARGIN`] faster than every single choice.
    pub fn choose_cover(&self, p: &Problem) -> Option<(Cover, f64)> {
        let mut memo = Memo::default();
        self.choose_cover_with(p, &mut |q| memo.rests(self, q))
    }

    /// [`choose_cover`](Self::choose_cover) with the best two single choices for the
    /// rows a main kernel leaves given by `rests` (a table, where many M are asked).
    pub(crate) fn choose_cover_with(
        &self,
        p: &Problem,
        rests: &mut dyn FnMut(&Problem) -> Rests,
    ) -> Option<(Cover, f64)> {
        let single = self.choose(p)?;
        let two = self.two_sizes(p, rests).into_iter().min_by(|a, b| a.1.total_cmp(&b.1));
        match two {
            Some(two) if two.1 < single.1 * (1.0 - COVER_MARGIN) => Some(two),
            _ => Some((Cover::one(single.0), single.1)),
        }
    }

    /// The best single choice for `p` and the best of another kernel, with their
    /// predicted times.
    pub fn best_two(&self, p: &Problem) -> Rests {
        let mut priced: Vec<(Choice, f64)> =
            self.choices(p).into_iter().map(|c| (c, self.predict(c, p))).collect();
        priced.sort_by(|a, b| a.1.total_cmp(&b.1));
        let first = priced.first().copied();
        let second = first.and_then(|(f, _)| priced.iter().copied().find(|(c, _)| c.kernel != f.kernel));
        [first, second]
    }

    /// A cover as text on `p` ([`Cover::text`]).
    pub fn describe_cover(&self, c: &Cover, p: &Problem) -> String {
        c.text(&self.kernels, p)
    }
}

/// The best single choice for some rows and the best of another kernel
/// ([`WaveModel::best_two`]).
pub type Rests = [Option<(Choice, f64)>; 2];

/// [`WaveModel::best_two`] for the rows the mains of one product leave,
/// remembered by their count (a few distinct counts a product).
#[derive(Default)]
struct Memo(Vec<(usize, Rests)>);

impl Memo {
    fn rests(&mut self, model: &WaveModel, q: &Problem) -> Rests {
        if let Some((_, r)) = self.0.iter().find(|(m, _)| *m == q.m) {
            return *r;
        }
        let r = model.best_two(q);
        self.0.push((q.m, r));
        r
    }
}
