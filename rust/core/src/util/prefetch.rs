//! A cache-line prefetch hint, used by the pool, the envs and the bindings.

/// Hints the CPU to start loading the cache line at `p`. Only an address is used: nothing
/// is read in the language's sense, so any pointer value is fine. A no-op off x86_64.
#[inline(always)]
pub fn prefetch<T: ?Sized>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` (SSE, part of the x86_64 baseline) never faults, whatever `p`.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
