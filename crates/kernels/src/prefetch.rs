//! Cache hints the drivers give ahead of the kernels: one place for the
//! architecture's intrinsic and the argument for its soundness.

/// Ask for the cache line holding `at` to be brought into L1.
pub(crate) fn to_l1<T>(at: *const T) {
    #[cfg(target_arch = "x86_64")]
    hint::<{ std::arch::x86_64::_MM_HINT_T0 }, T>(at);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

#[cfg(target_arch = "x86_64")]
fn hint<const LEVEL: i32, T>(at: *const T) {
    // SAFETY: a prefetch only hints the cache and never faults, whatever the address.
    unsafe { std::arch::x86_64::_mm_prefetch::<LEVEL>(at.cast::<i8>()) };
}
