//! The kinds of fusion group: what the passes form and the plan runs (a
//! profile's time is grouped by them).

use std::fmt;

/// What a group computes; the kind picks its code generation later.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum GroupKind {
    /// Element-wise and data-movement ops over one iteration space.
    Elementwise,
    /// A contraction (matmul, conv) with its prologue and epilogue.
    Contraction,
    /// A pooling window with its epilogue.
    Window,
    /// Reductions stitched with the element-wise ops around them (LayerNorm, Softmax).
    Stitch,
    /// `softmax(Q·Kᵀ)·V` in one group.
    Attention,
    /// An op no fusion rule covers (a scan), alone.
    Opaque,
}

impl fmt::Display for GroupKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GroupKind::Elementwise => "elementwise",
            GroupKind::Contraction => "contraction",
            GroupKind::Window => "window",
            GroupKind::Stitch => "stitch",
            GroupKind::Attention => "attention",
            GroupKind::Opaque => "opaque",
        })
    }
}
