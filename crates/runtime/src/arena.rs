//! A call's arena: the memory its temporaries live in.
//!
//! Left uninitialized: every temporary is written by its producing step before
//! any step reads it (a reused arena holds the previous call's data anyway, so
//! no kernel may count on zeros). Not zeroing matters for the first call at a
//! shape larger than every one before: the allocator may hand back memory the
//! compiler freed, already mapped, or else fresh pages the kernel zeroes as they
//! are first touched; an explicit zeroing pass would touch (and fault) all of it
//! up front, then the kernels would write it again. Measured on ResNet-50 (first
//! call against warm, each shape larger than the last): at 288 +11-14% with
//! `vec![0; n]`, level without; at batch 8 +9-11% and +6%.
//!
//! Huge pages were tried (`MADV_HUGEPAGE` on a 2 MiB-aligned mapping): warm
//! calls were level, first calls 25-45% slower (each 2 MiB fault zeroes and
//! compacts synchronously).

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

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The base: dangling (and never dereferenced, every buffer of a shape with
    /// an empty arena being empty) when the arena is empty.
    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
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
    fn an_absurd_arena_is_refused_not_a_crash() {
        assert!(Arena::new(isize::MAX as usize).is_none());
    }
}
