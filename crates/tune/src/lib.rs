//! Tuning at compile time (DESIGN.md §5): what measures and searches, so that
//! the run path only looks results up.
//!
//! - [`calibrate`]: the machine model's memory and thread figures, measured
//!   once per machine (Vortex's hybrid analyzer: the levels above L0 modelled
//!   from them).
//! - [`categorize`]: DietCode's categorization of a known shape distribution,
//!   trading kernels kept against performance.
//! - [`bayes`]: TSCompiler's trust-region Bayesian search over macro-kernel
//!   parameters (its results are `kernels::TunedSchedules`, which dispatch reads).
//!
//! The micro-kernel measurements need generated code and live in `codegen`.

pub mod bayes;
pub mod calibrate;
pub mod categorize;
