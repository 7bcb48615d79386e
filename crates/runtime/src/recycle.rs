//! Output buffers handed back by the caller ([`crate::CompiledModel::recycle`],
//! or a Python array's last reference going) and reused by a later call. A
//! decoder's step returns its whole KV cache: fresh memory for it every call
//! costs a page fault per page (the system zeroes each on first touch), and the
//! allocator gives large freed blocks straight back to the system. A reused
//! buffer is truncated, or extended by zeros over its new elements only; a new
//! one is made with room to grow (a cache gains a row a step), so that the
//! next calls' outputs fit in it.

use std::sync::{Arc, Mutex, Weak};

use ir::{DType, Elems, Tensor};

/// Outputs smaller than this are not kept: the allocator reuses small blocks
/// itself.
pub(crate) const KEEP_BYTES: usize = 64 << 10;

/// The most buffers kept, per output of the model (a decoder's step's outputs
/// are fed to the next as its inputs: two steps' outputs are alive at once).
const KEPT_PER_OUTPUT: usize = 2;

/// The buffers handed back, for any dtype.
#[derive(Default)]
pub(crate) struct Pool {
    free: Mutex<Vec<Elems>>,
    limit: usize,
}

/// A handle that gives a model's outputs back to it (a weak one: a buffer given
/// after the model is gone is freed).
#[derive(Clone, Default)]
pub struct Recycler(Weak<Pool>);

impl Recycler {
    /// Whether a tensor like `t` is worth handing back (small ones the allocator
    /// reuses itself).
    pub fn keeps(t: &Tensor) -> bool {
        t.elems().capacity_bytes() >= KEEP_BYTES
    }

    /// Keep `t`'s elements for a later call's output of the same dtype.
    pub fn give(&self, t: Tensor) {
        if let Some(pool) = self.0.upgrade() {
            pool.give(t.into_elems());
        }
    }
}

impl Pool {
    pub(crate) fn new(outputs: usize) -> Arc<Pool> {
        Arc::new(Pool { free: Mutex::new(Vec::new()), limit: KEPT_PER_OUTPUT * outputs.max(1) })
    }

    pub(crate) fn recycler(self: &Arc<Pool>) -> Recycler {
        Recycler(Arc::downgrade(self))
    }

    fn give(&self, e: Elems) {
        if e.capacity_bytes() < KEEP_BYTES {
            return;
        }
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        free.push(e);
        if free.len() > self.limit {
            // The smallest goes: the outputs only grow from call to call of a decoder.
            if let Some(i) = (0..free.len()).min_by_key(|i| free[*i].capacity_bytes()) {
                free.swap_remove(i);
            }
        }
    }

    /// `n` elements of `dt` from a buffer handed back (the smallest that holds
    /// them), zero past what the buffer held; `None` when none fits.
    pub(crate) fn take(&self, dt: DType, n: usize) -> Option<Elems> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let i = (0..free.len())
            .filter(|i| free[*i].dtype() == dt && free[*i].capacity() >= n)
            .min_by_key(|i| free[*i].capacity())?;
        let mut e = free.swap_remove(i);
        drop(free);
        macro_rules! fit {
            ($v:expr, $zero:expr) => {
                $v.resize(n, $zero)
            };
        }
        match &mut e {
            Elems::F32(v) => fit!(v, 0.0),
            Elems::F64(v) => fit!(v, 0.0),
            Elems::F16(v) | Elems::BF16(v) => fit!(v, 0),
            Elems::I8(v) => fit!(v, 0),
            Elems::U8(v) => fit!(v, 0),
            Elems::I32(v) => fit!(v, 0),
            Elems::I64(v) => fit!(v, 0),
            Elems::Bool(v) => fit!(v, false),
        }
        Some(e)
    }
}

impl Pool {
    /// An output of `n` elements of `dt`, and whether its memory is new: a
    /// large one (when `reuse`) from a buffer handed back, or made with
    /// room to grow; `None` when it cannot be allocated.
    pub(crate) fn output(&self, dt: DType, n: usize, reuse: bool) -> Option<(Elems, bool)> {
        let large = reuse && n.saturating_mul(dt.size()) >= KEEP_BYTES;
        if let Some(e) = large.then(|| self.take(dt, n)).flatten() {
            return Some((e, false));
        }
        let roomy = large.then(|| crate::zeros(dt, room(n))).flatten().map(|mut e| {
            e.truncate(n);
            e
        });
        roomy.or_else(|| crate::zeros(dt, n)).map(|e| (e, true))
    }
}

/// Elements a new output of `n` elements is made with room for: an eighth more,
/// for the outputs that grow from call to call.
pub(crate) fn room(n: usize) -> usize {
    n.saturating_add(n / 8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_handed_back_serves_a_later_output_that_fits() {
        let pool = Pool::new(1);
        let r = pool.recycler();
        let n = KEEP_BYTES / 4;
        let mut v = Vec::with_capacity(room(n));
        v.resize(n, 7.0f32);
        let ptr = v.as_ptr();
        r.give(Tensor::new(vec![n], Elems::F32(v)).unwrap());
        // Another dtype, or more than the room: nothing.
        assert!(pool.take(DType::I32, n).is_none());
        assert!(pool.take(DType::F32, room(n) + 1).is_none());
        // Grown by three: the same memory, the old values kept, the new ones zero.
        let Some(Elems::F32(got)) = pool.take(DType::F32, n + 3) else { panic!("no buffer") };
        assert_eq!(got.as_ptr(), ptr);
        assert_eq!(got.len(), n + 3);
        assert_eq!((got[0], got[n - 1], got[n], got[n + 2]), (7.0, 7.0, 0.0, 0.0));
        assert!(pool.take(DType::F32, 1).is_none(), "taken once");
    }

    #[test]
    fn small_buffers_and_buffers_past_the_limit_are_not_kept() {
        let pool = Pool::new(1);
        let r = pool.recycler();
        r.give(Tensor::new(vec![4], Elems::F32(vec![0.0; 4])).unwrap());
        assert!(pool.take(DType::F32, 4).is_none());
        let n = KEEP_BYTES;
        for k in 1..=3 {
            r.give(Tensor::new(vec![k * n], Elems::U8(vec![0; k * n])).unwrap());
        }
        // Two kept (the limit for one output): the largest two.
        assert!(pool.take(DType::U8, 3 * n).is_some());
        assert!(pool.take(DType::U8, 2 * n).is_some());
        assert!(pool.take(DType::U8, n).is_none());
        // A handle outliving its pool frees what it is given.
        drop(pool);
        r.give(Tensor::new(vec![n], Elems::U8(vec![0; n])).unwrap());
    }
}
