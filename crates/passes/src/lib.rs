//! Graph rewrites over the IR (DESIGN.md §2-3): canonicalization, broadcast
//! elimination (BladeDISC §3.2), and, in later stages, GEMM merging and the
//! fusion pipeline.
//!
//! Every pass keeps the IR valid: the [`Pipeline`] runs the verifier after each
//! pass when asked to (always in tests), and a pass that meets an op it does not
//! understand leaves it alone. Passes decide from `ShapeEnv` facts only, never
//! from example shapes.

mod affine;
mod broadcast;
mod bytes;
mod canonical;
mod conv;
mod fusion;
mod gemm;
mod integer;
mod layout;
mod offset;
mod pattern;
mod pool;

use std::time::{Duration, Instant};

use ir::Graph;

pub use affine::FoldAffineIntoMatMul;
pub use broadcast::{BroadcastGuard, EliminateBroadcasts};
pub use bytes::{QuantizedRoundTrip, SignedCodesAsBytes};
pub use canonical::{Cse, Dce, FoldConstants, HoistMatMulScale, SimplifyAlgebra, SimplifyShapes};
pub use conv::ConvAsMatMul;
pub use fusion::{fuse, print_plan, FusionGroup, FusionPlan, GroupKind};
pub use gemm::{BatchEqualShapes, MergeSharedOperand};
pub use integer::{value_range, IntegerMatMulAsFloat};
pub use layout::SinkTransposes;
pub use offset::MoveZeroPointOut;
pub use pool::ScaleOutOfMaxPool;

/// Errors from running passes.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    #[error("pass {pass} left an invalid graph: {err}")]
    Invalid { pass: &'static str, err: ir::IrError },
    #[error("pass {pass}: {msg}")]
    Failed { pass: &'static str, msg: String },
}

/// One rewrite of the graph.
pub trait Pass {
    fn name(&self) -> &'static str;
    /// Rewrite `g`; returns how many rewrites were made (0: nothing changed).
    fn run(&self, g: &mut Graph) -> Result<usize, PassError>;
}

/// What a pipeline run did.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// `(pass, rewrites, time)` in the order the passes ran.
    pub runs: Vec<(&'static str, usize, Duration)>,
    /// Nodes before and after.
    pub nodes_before: usize,
    pub nodes_after: usize,
    /// Broadcasts that stay, each with the condition under which it is a no-op.
    pub guarded_broadcasts: Vec<BroadcastGuard>,
}

impl Report {
    /// Total rewrites made by the pass named `name`.
    pub fn rewrites(&self, name: &str) -> usize {
        self.runs.iter().filter(|(n, _, _)| *n == name).map(|(_, k, _)| k).sum()
    }
    pub fn total_time(&self) -> Duration {
        self.runs.iter().map(|(_, _, t)| *t).sum()
    }
}

/// An ordered list of passes; a group of passes can be repeated to a fixpoint.
pub struct Pipeline {
    stages: Vec<Stage>,
    verify: bool,
}

enum Stage {
    Once(Box<dyn Pass>),
    /// Run the passes in turn until none rewrites anything (at most `limit` rounds).
    Fixpoint(Vec<Box<dyn Pass>>, usize),
}

impl Default for Pipeline {
    fn default() -> Self {
        Pipeline::standard()
    }
}

impl Pipeline {
    /// An empty pipeline; `verify` runs the IR verifier after every pass.
    pub fn new() -> Pipeline {
        Pipeline { stages: Vec::new(), verify: cfg!(debug_assertions) }
    }

    /// Canonicalization, broadcast elimination and GEMM merging, to a fixpoint.
    pub fn standard() -> Pipeline {
        let mut passes = canonicalization();
        passes.insert(passes.len() - 1, Box::new(EliminateBroadcasts));
        passes.insert(passes.len() - 1, Box::new(MergeSharedOperand));
        passes.insert(passes.len() - 1, Box::new(ConvAsMatMul));
        passes.insert(passes.len() - 1, Box::new(SinkTransposes));
        Pipeline::new().fixpoint(passes)
    }

    pub fn then(mut self, p: impl Pass + 'static) -> Pipeline {
        self.stages.push(Stage::Once(Box::new(p)));
        self
    }

    pub fn fixpoint(mut self, passes: Vec<Box<dyn Pass>>) -> Pipeline {
        self.stages.push(Stage::Fixpoint(passes, 16));
        self
    }

    /// Verify the IR after every pass (the default in debug builds).
    pub fn verify(mut self, on: bool) -> Pipeline {
        self.verify = on;
        self
    }

    pub fn run(&self, g: &mut Graph) -> Result<Report, PassError> {
        let mut report = Report { nodes_before: g.nodes.len(), ..Report::default() };
        for stage in &self.stages {
            match stage {
                Stage::Once(p) => {
                    self.run_one(p.as_ref(), g, &mut report)?;
                }
                Stage::Fixpoint(ps, limit) => {
                    for _ in 0..*limit {
                        let mut changed = 0;
                        for p in ps {
                            changed += self.run_one(p.as_ref(), g, &mut report)?;
                        }
                        if changed == 0 {
                            break;
                        }
                    }
                }
            }
        }
        report.nodes_after = g.nodes.len();
        report.guarded_broadcasts = broadcast::guards(g);
        Ok(report)
    }

    fn run_one(&self, p: &dyn Pass, g: &mut Graph, report: &mut Report) -> Result<usize, PassError> {
        let start = Instant::now();
        let n = p.run(g)?;
        report.runs.push((p.name(), n, start.elapsed()));
        if self.verify {
            ir::verify(g).map_err(|err| PassError::Invalid { pass: p.name(), err })?;
        }
        Ok(n)
    }
}

/// The canonicalization passes, in the order they run to a fixpoint.
pub fn canonicalization() -> Vec<Box<dyn Pass>> {
    vec![
        Box::new(SimplifyShapes),
        // Before folding: a dequantized weight's scale moves out of its product
        // while it is still a factor, so that the weight folds to integers.
        Box::new(HoistMatMulScale),
        Box::new(FoldConstants::default()),
        Box::new(SimplifyAlgebra),
        // Before the zero points move out of products: int8 activations are
        // their bytes by then.
        Box::new(SignedCodesAsBytes),
        Box::new(QuantizedRoundTrip),
        Box::new(FoldAffineIntoMatMul),
        Box::new(IntegerMatMulAsFloat),
        Box::new(MoveZeroPointOut),
        Box::new(ScaleOutOfMaxPool),
        Box::new(Cse),
        Box::new(Dce),
    ]
}
