//! Where a compiled model's steps run. The model itself (binding the inputs,
//! the per-shape plans, the temporaries' arena, canaries, the outputs) is the
//! same for every device; a [`Backend`] holds what the compiler generated for
//! one device and runs the plan's steps there: [`Cpu`](crate::Cpu) today, a
//! GPU's kernels and streams next (tract's `Runtime`, IREE's HAL).

use kernels::ThreadPool;
use plan::ModelPlan;

use crate::shape::{AttentionTasks, MatMulShape, ShapePlan};
use crate::RunError;

/// A device's half of a compiled model.
pub trait Backend: Send + Sync {
    /// The host threads that place and first-touch a call's buffers (and, on
    /// the CPU, run its steps).
    fn pool(&self) -> &ThreadPool;

    /// Constant buffer `b` of `plan` as the steps read it (a copy aligned for
    /// the contraction engine where its bytes are not), or `None` when no step
    /// reads its bytes (a weight read only through its packed form).
    fn constant(&self, plan: &ModelPlan, b: usize) -> Option<*const u8>;

    /// Fused attention's query blocks and the schedules of its two products at
    /// a shape, chosen once when the shape is planned.
    fn attention_tasks(
        &self,
        scores: &MatMulShape,
        output: &MatMulShape,
        online: bool,
    ) -> Result<AttentionTasks, RunError>;

    /// Run step `step` of `plan` at shape `sp`.
    ///
    /// # Safety
    /// `ptrs` holds, for every buffer of `plan`, a pointer to a live allocation
    /// of the size `sp` gives it (inputs, outputs, constants from
    /// [`Backend::constant`], temporaries at their arena offsets), aligned for
    /// its element type, and no other code touches them during the call.
    unsafe fn run_step(
        &self,
        plan: &ModelPlan,
        step: usize,
        sp: &ShapePlan,
        ptrs: &[*mut u8],
    ) -> Result<(), RunError>;
}
