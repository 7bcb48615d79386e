//! A loop program: one generated function. A loop nest over a symbolic space
//! whose body stores the values of one or more tensors, each an expression of
//! the loop variables over the program's buffers (its parameters).

use ir::DType;

use crate::expr::{Exprs, Node, E};

/// A buffer the program reads or writes: dense, row-major, of a symbolic shape.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Param {
    pub name: String,
    pub dtype: DType,
    /// Extents (each an integer constant or a dim of the model's dim table).
    pub shape: Vec<E>,
    pub written: bool,
}

/// `param[linear position of the nest] = value`: every store writes a dense
/// buffer with as many elements as the nest has points, at the nest's own
/// row-major position, so the innermost variable writes contiguous memory.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Store {
    pub param: u32,
    pub value: E,
}

/// A program whose stores need one reduction per point, long enough that
/// threads share one point's reduction (a row's sum when there is one row, the
/// sum of a whole tensor): each thread reduces a range of `var`, the last
/// reduced variable, into a partial, and the partials are combined before the
/// point's stores (BladeDISC §5.2.1, one long row split across threads).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SplitReduction {
    /// The reduction node.
    pub reduce: E,
    /// The variable whose range the threads split.
    pub var: u32,
    /// Its extent.
    pub extent: E,
}

/// What a program's schedules depend on, found once when it is built (the code
/// generator and the runtime's per-shape plan read it).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Schedules {
    /// Conditions of run-time dims the program is compiled in versions for
    /// (one nest per combination of their values, see [`lower::versions`]).
    pub guards: Vec<E>,
    /// The extent of the reduction that a row-at-a-time schedule vectorizes: a
    /// reduction computed per point of the nest whose last variable runs along
    /// contiguous memory (a sum over a row's last axis). Such a program has two
    /// schedules, picked per call by the extent (BladeDISC §5.2.1): the nest's
    /// points across the vector lanes (short reductions), or one point at a time
    /// with the reduction along the lanes (long ones, no per-lane gathers).
    pub row_reduction: Option<E>,
    /// Threads split the range of the innermost variable (not rows): the nest
    /// is that one loop, and nothing in it is computed once per row for the
    /// whole row. A one-dimensional program then runs on every thread.
    pub splits_inner: bool,
    /// The nest is one loop (or none) and its stores use exactly one
    /// reduction, per point: see [`SplitReduction`].
    pub split: Option<SplitReduction>,
    /// The points are computed one at a time, never across the lanes, and why.
    pub points_one_at_a_time: Option<OnePointWhy>,
    /// A row sum whose terms the stored value uses again (see [`RowScratch`]);
    /// taken where the target's vectors have more than one lane.
    pub row_scratch: Option<RowScratch>,
    /// The one stored value chooses among this many alternatives by conditions
    /// the same for the whole row (a concat along an outer axis: a conv's
    /// taps): the choice is made once per row, and the row's loop sees only
    /// the chosen expression (not on a row-scratch schedule).
    pub unswitched: Option<usize>,
    /// Load guards that are range checks affine along a vectorized variable
    /// (a pad's or a window's border), in node order.
    pub border_guards: Vec<BorderGuard>,
    /// On the CPU, the lanes run along the variable before the last, and the
    /// last is unrolled (see [`Interleave`]).
    pub interleaved: Option<Interleave>,
    /// On the CPU, the lanes run along this outer variable and each vector's
    /// values are stored apart (see [`Scatter`]).
    pub scattered: Option<Scatter>,
}

/// A CPU schedule for a transposing nest whose loads run contiguously along
/// an outer variable and nowhere along the last, more of them than its stores
/// (a channels-last tensor's sum written channels-first): a row of the nest
/// runs along that variable, the rows are every other variable (in the
/// nest's order), and each vector's values are stored apart (by the points
/// after that variable: a scatter, a store a lane). A few vectors of lanes
/// are taken over all of a thread's rows at a time, so that the lines of the
/// planes they store to stay in cache from one row to the next. The GPU's
/// schedules ignore it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Scatter {
    /// The variable the lanes run along.
    pub lanes: u32,
    /// Its position in the nest.
    pub at: u32,
}

/// A CPU schedule for a nest whose last variable has a few values and whose
/// loads run contiguously along the variable before it, not along the last (a
/// channels-last image of a few channels written from channels-first planes):
/// the lanes run along that variable, each vector computes the last
/// variable's values in turn, and they are stored interleaved, one contiguous
/// store of `unrolled` vectors. A row of the nest is then its last two
/// variables ([`LoopProgram::row_from`]); the GPU's schedules ignore it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Interleave {
    /// The variable the lanes run along (the nest's last but one).
    pub lanes: u32,
    /// The last variable's extent (a constant, 2 to [`INTERLEAVE_MAX`]).
    pub unrolled: u32,
}

/// The largest extent of a last variable [`Interleave`] unrolls.
pub const INTERLEAVE_MAX: u32 = 8;

/// A load's guard whose conjuncts, along each variable of `along`, are
/// comparisons of integer sides affine in that variable (in every version of
/// the program) or do not depend on it: where such a variable runs along a
/// vector's lanes, a guard true at the first and at the last lane is true on
/// every lane between, so the code generator tests the two ends once per
/// vector and takes a plain load inside the range, a masked one only at its
/// borders.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BorderGuard {
    pub guard: E,
    /// The variables, a bit each.
    pub along: u64,
}

/// A row sum whose terms the stored value uses again (Softmax's
/// `exp(x - max)`, summed, then divided by the sum): the sum's loop stores each
/// term at its place in the output row, and the store loop reads it back
/// instead of computing it a second time. The row stays in L1 between the two.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RowScratch {
    /// The sum's body, over the reduction variable.
    pub body: E,
    /// The same expression over the nest's innermost variable.
    pub twin: E,
    /// The output parameter (the program's only store).
    pub param: u32,
}

/// The deepest chain of row-uniform selects resolved per row
/// ([`Schedules::unswitched`]).
pub const UNSWITCH_DEPTH: usize = 64;

/// Why a program's points are computed one at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum OnePointWhy {
    /// A reduction's extent varies along the innermost variable (a cumulative
    /// sum along the last axis): each lane would need its own trip count.
    ExtentVaries,
    /// A reduction is recomputed inside another's body (softmax over pooled
    /// means): across the lanes each lane sums in order, one point at a time
    /// the sum runs along the vector; the two copies must add in one order.
    NestedReduction,
}

/// One generated function: `for vars in space: stores`.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct LoopProgram {
    pub name: String,
    pub exprs: Exprs,
    pub params: Vec<Param>,
    /// The nest's extents, outermost first.
    pub space: Vec<E>,
    /// The nest's variables (a variable of extent 1 is the constant 0).
    pub vars: Vec<E>,
    pub stores: Vec<Store>,
    /// The message of each error code a `Check` may record (code `c` is `checks[c - 1]`).
    pub checks: Vec<String>,
    /// Found by `lower` when it builds the program (`lower::analyze`).
    pub schedules: Schedules,
}

impl LoopProgram {
    /// The variable id of the innermost looping variable ([`LoopProgram::inner`]).
    pub fn inner_var(&self) -> Option<u32> {
        self.inner().and_then(|i| match self.exprs.node(self.vars[i]) {
            Node::Var(v) => Some(*v),
            _ => None,
        })
    }

    /// The innermost variable that really loops (extent not 1), if any: the
    /// axis the code generator vectorizes.
    pub fn inner(&self) -> Option<usize> {
        self.vars.iter().rposition(|v| matches!(self.exprs.node(*v), Node::Var(_)))
    }

    /// The first of the variables that one row of the CPU's nest runs through
    /// (the rows are the variables before it): the innermost that loops, or
    /// with an [`Interleave`] the one before it. (With a [`Scatter`] a row runs
    /// along its lanes' variable alone, the rows are all the others.)
    pub fn row_from(&self) -> Option<usize> {
        let inner = self.inner()?;
        Some(if self.schedules.interleaved.is_some() { inner - 1 } else { inner })
    }
}
