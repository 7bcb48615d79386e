//! A growable buffer whose first element starts a cache line.
//!
//! The kernels load panels, tiles and packed weights a vector at a time; a
//! 64-byte load from an address that is not a multiple of 64 touches two
//! cache lines. The system allocator aligns a `Vec<f32>` to 16 bytes (an
//! allocation large enough to be mapped starts 16 bytes into its page), so
//! every AVX-512 load of a panel would straddle two lines. `Lines` keeps its
//! elements at the first cache-line boundary of a slightly larger `Vec`.

use std::ops::{Deref, DerefMut};

/// The alignment kept: a cache line.
pub const LINE: usize = 64;

/// Elements of `T` starting at a cache-line boundary; grows like a `Vec` (new
/// elements are `T::default()`, the old ones kept). A clone starts a line too.
#[derive(Default)]
pub struct Lines<T> {
    store: Vec<T>,
    /// Where the elements start in `store`.
    at: usize,
    len: usize,
}

impl<T: Copy + Default> Lines<T> {
    /// `len` elements of `T::default()`.
    pub fn with_len(len: usize) -> Lines<T> {
        let mut l = Lines { store: Vec::new(), at: 0, len: 0 };
        l.resize(len);
        l
    }

    /// `len` elements: the first `min(len, old len)` kept, the rest `T::default()`.
    pub fn resize(&mut self, len: usize) {
        let kept = self.len.min(len);
        self.resize_to_overwrite(len);
        self.store[self.at + kept..self.at + len].fill(T::default());
    }

    /// `len` elements for a caller that writes every one of them: as
    /// [`Self::resize`], but the elements past the old length keep whatever
    /// values the storage holds (stale, never uninitialized), so that a large
    /// buffer rewritten per call is not filled first.
    pub fn resize_to_overwrite(&mut self, len: usize) {
        let slack = LINE / std::mem::size_of::<T>().max(1);
        let kept = self.len.min(len);
        if self.store.len() < len + slack {
            self.store.resize(len + slack, T::default());
        }
        // Elements to skip to reach a line: a `Vec` of `T` is aligned to `T`, so
        // the offset is below `slack` (`align_offset` reports when it cannot be met).
        let at = self.store.as_ptr().align_offset(LINE);
        let at = if at < slack { at } else { 0 };
        if at != self.at {
            self.store.copy_within(self.at..self.at + kept, at);
        }
        self.at = at;
        self.len = len;
    }

    /// Empty, keeping the storage.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Appends `values`.
    pub fn extend_from_slice(&mut self, values: &[T]) {
        let old = self.len;
        self.resize(old + values.len());
        self[old..].copy_from_slice(values);
    }
}

impl<T: Copy + Default> Clone for Lines<T> {
    fn clone(&self) -> Lines<T> {
        let mut c = Lines::default();
        c.extend_from_slice(self);
        c
    }
}

impl<T> Deref for Lines<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.store[self.at..self.at + self.len]
    }
}

impl<T> DerefMut for Lines<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.store[self.at..self.at + self.len]
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Lines<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_start_a_line_and_survive_growth() {
        let mut l: Lines<u32> = Lines::default();
        let mut model: Vec<u32> = Vec::new();
        for (step, len) in [1usize, 17, 3, 1000, 65_536, 5, 300_000, 0, 40].into_iter().enumerate() {
            l.resize(len);
            model.resize(len, 0);
            assert_eq!(l.len(), len);
            assert_eq!(&l[..], &model[..], "step {step}");
            if len > 0 {
                assert_eq!(l.as_ptr() as usize % LINE, 0, "step {step}: {len} elements");
            }
            for (i, (a, b)) in l.iter_mut().zip(model.iter_mut()).enumerate() {
                *a = (step * 1_000_003 + i) as u32;
                *b = *a;
            }
        }
        l.clear();
        l.extend_from_slice(&[7, 8, 9]);
        assert_eq!(&l[..], &[7, 8, 9]);
        // A buffer to overwrite keeps its first elements and starts a line.
        l.resize(10);
        l.iter_mut().for_each(|v| *v = 5);
        l.resize_to_overwrite(70_000);
        assert_eq!((l.len(), &l[..10]), (70_000, &[5; 10][..]));
        assert_eq!(l.as_ptr() as usize % LINE, 0);
        let big: Lines<u32> = Lines::with_len(100_000);
        let copy = big.clone();
        assert_eq!(&copy[..], &big[..]);
        assert_eq!(copy.as_ptr() as usize % LINE, 0, "a clone starts a line");
    }
}
