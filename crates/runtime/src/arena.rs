//! A call's arena: the memory its temporaries live in.
//!
//! Left uninitialized: every temporary is written by its producing step before
//! any step reads it (a reused arena holds the previous call's data anyway, so
//! no kernel may count on zeros). An explicit zeroing pass would only touch the
//! pages a second time (measured on ResNet-50 at 288: first call +11-14% with
//! `vec![0; n]`).
//!
//! A fresh arena (the first call at a shape larger than every one before) is
//! an anonymous mapping whose pages the system zeroes as they are first
//! touched. Faulted one by one inside the kernels, each fault a trap, that
//! cost about 15 ms of ResNet-50's 145 ms at batch 8 on this project's
//! machine; the run asks for them all at once, a slice per thread
//! (`MADV_POPULATE_WRITE`), which took 4-8 ms off that first call.
//!
//! Huge pages were tried twice (`MADV_HUGEPAGE`): warm calls level, first
//! calls anywhere from 8 ms faster to 60 ms slower (a 2 MiB fault compacts
//! memory synchronously when no huge page is free).

use std::alloc::Layout;
use std::ptr::NonNull;

/// The arena's alignment: a cache line, the most any buffer asks.
const ALIGN: usize = std::mem::align_of::<Line>();

/// [`Arena::len`] bytes of uninitialized memory, 64-byte aligned, owned by one
/// call at a time. Only raw pointers into it ever exist.
pub(crate) struct Arena {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the arena owns its allocation outright (no aliasing handle exists), so
// moving it to, or sharing it with, another thread is as sound as for a `Vec<u8>`.
unsafe impl Send for Arena {}
// SAFETY: as above; `&Arena` gives no access to the memory.
unsafe impl Sync for Arena {}

/// A type of the arena's alignment, for the empty arena's dangling base.
#[repr(C, align(64))]
struct Line;

impl Default for Arena {
    fn default() -> Arena {
        Arena { ptr: NonNull::<Line>::dangling().cast(), len: 0 }
    }
}

impl Arena {
    /// An arena of `bytes` bytes (no allocation for 0); `None` when the
    /// allocator refuses it.
    pub(crate) fn new(bytes: usize) -> Option<Arena> {
        if bytes == 0 {
            return Some(Arena::default());
        }
        let layout = Layout::from_size_align(bytes, ALIGN).ok()?;
        // SAFETY: the layout's size is not zero.
        let ptr = NonNull::new(unsafe { std::alloc::alloc(layout) })?;
        Some(Arena { ptr, len: bytes })
    }

    /// Fault in the whole pages of slice `slice` of `threads` (call it for each
    /// slice from as many threads), so that the kernels do not take a trap per
    /// page as they first touch a fresh arena. Pages already present (memory
    /// the allocator handed back) are only looked up. Only a hint: where the
    /// system cannot (before Linux 5.14, other systems), pages fault on first
    /// touch as before.
    pub(crate) fn populate_slice(&self, slice: usize, threads: usize) {
        // SAFETY: this arena's own allocation, which the call owns.
        unsafe { populate(self.ptr.as_ptr(), self.len, slice, threads) }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The base: dangling (and never dereferenced, every buffer of a shape with
    /// an empty arena being empty) when the arena is empty.
    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

/// Fault in the whole pages of slice `slice` of `threads` of the `len` bytes
/// at `ptr` ([`Arena::populate_slice`]; the outputs of a call too, which are
/// fresh zero pages as large allocations are).
///
/// # Safety
/// `ptr..ptr + len` is one allocation the caller owns (its contents are not
/// changed).
pub(crate) unsafe fn populate(ptr: *mut u8, len: usize, slice: usize, threads: usize) {
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        let (base, end) = (ptr as usize, ptr as usize + len);
        let (first, last) = (base.div_ceil(PAGE), end / PAGE);
        let per = last.saturating_sub(first).div_ceil(threads.max(1));
        let lo = (first + slice * per).min(last);
        let hi = (lo + per).min(last);
        if hi > lo {
            // SAFETY: whole pages inside the caller's allocation (the function's
            // contract); MADV_POPULATE_WRITE faults them in writable and never
            // changes their contents.
            unsafe {
                libc::madvise((lo * PAGE) as *mut libc::c_void, (hi - lo) * PAGE, libc::MADV_POPULATE_WRITE)
            };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, len, slice, threads);
}

impl Drop for Arena {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: allocated in `new` with this very layout (it was valid then).
            unsafe {
                std::alloc::dealloc(self.ptr.as_ptr(), Layout::from_size_align_unchecked(self.len, ALIGN))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arenas_are_aligned_and_writable() {
        for bytes in [0, 1, 64, 4097, (2 << 20) + 5] {
            let mut a = Arena::new(bytes).unwrap();
            assert_eq!(a.len(), bytes);
            let p = a.as_mut_ptr();
            assert_eq!(p as usize % ALIGN, 0, "{bytes}");
            if bytes > 0 {
                // SAFETY: the arena's `bytes` bytes, written before they are read.
                unsafe {
                    std::ptr::write_bytes(p, 7, bytes);
                    assert_eq!(*p.add(bytes - 1), 7);
                }
            }
        }
    }

    #[test]
    fn populated_arenas_are_whole_and_writable() {
        for (bytes, threads) in [(1, 1), (4096, 3), (4097, 2), (3 * 4096 + 5, 8), ((1 << 20) + 1, 2)] {
            let mut a = Arena::new(bytes).unwrap();
            for slice in 0..threads {
                a.populate_slice(slice, threads);
            }
            // SAFETY: the arena's `bytes` bytes, written before they are read.
            let all = unsafe {
                std::ptr::write_bytes(a.as_mut_ptr(), 3, bytes);
                std::slice::from_raw_parts(a.as_mut_ptr(), bytes)
            };
            assert!(all.iter().all(|&b| b == 3), "{bytes} bytes over {threads} threads");
        }
        Arena::default().populate_slice(0, 2);
    }

    #[test]
    fn an_absurd_arena_is_refused_not_a_crash() {
        assert!(Arena::new(isize::MAX as usize).is_none());
    }
}
