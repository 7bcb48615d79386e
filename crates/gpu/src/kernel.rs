//! The GEMM family's kernel descriptions live in the plan (`plan::gemm`), the
//! contract the runtime reads to launch them; this module keeps their old path.

pub use plan::gemm::*;
