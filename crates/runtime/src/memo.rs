//! Per-shape plans, memoized per input-shape signature up to a bound: past
//! it the least recently used one goes, so a server that meets ever new
//! shapes (a decoder's growing cache, every batch × length) keeps bounded
//! memory, and a shape planned again costs one planning.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// The plans a model keeps (BERT-base's: about 140 KiB a shape).
pub const SHAPES_KEPT: usize = 512;

/// A plan and when it was last asked for.
struct Entry<V> {
    plan: Arc<V>,
    used: AtomicU64,
}

pub(crate) struct ShapeMemo<V> {
    plans: RwLock<HashMap<Vec<i64>, Entry<V>>>,
    clock: AtomicU64,
    kept: usize,
}

impl<V> ShapeMemo<V> {
    pub(crate) fn new(kept: usize) -> ShapeMemo<V> {
        ShapeMemo { plans: RwLock::new(HashMap::new()), clock: AtomicU64::new(0), kept: kept.max(1) }
    }

    /// The plan of signature `key`, if kept (a shared lock: concurrent calls
    /// at planned shapes do not wait on each other).
    pub(crate) fn get(&self, key: &[i64]) -> Option<Arc<V>> {
        let plans = self.plans.read().unwrap_or_else(|e| e.into_inner());
        let e = plans.get(key)?;
        e.used.store(self.clock.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
        Some(e.plan.clone())
    }

    /// Keep `plan` for `key`, the least recently used one going where the
    /// bound is reached.
    pub(crate) fn insert(&self, key: Vec<i64>, plan: Arc<V>) {
        let mut plans = self.plans.write().unwrap_or_else(|e| e.into_inner());
        if plans.len() >= self.kept && !plans.contains_key(&key) {
            let oldest =
                plans.iter().min_by_key(|(_, e)| e.used.load(Ordering::Relaxed)).map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                plans.remove(&k);
            }
        }
        let used = AtomicU64::new(self.clock.fetch_add(1, Ordering::Relaxed));
        plans.insert(key, Entry { plan, used });
    }

    pub(crate) fn len(&self) -> usize {
        self.plans.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub(crate) fn clear(&mut self) {
        self.plans.get_mut().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_plan_goes_past_the_bound() {
        let m = ShapeMemo::new(3);
        for k in 0..3i64 {
            m.insert(vec![k], Arc::new(k));
        }
        // 0 asked for again: 1 is the least recently used.
        assert_eq!(m.get(&[0]).as_deref(), Some(&0));
        m.insert(vec![3], Arc::new(3));
        assert_eq!(m.len(), 3);
        assert!(m.get(&[1]).is_none());
        for k in [0, 2, 3] {
            assert_eq!(m.get(&[k]).as_deref(), Some(&k));
        }
        // A key kept again replaces its plan without evicting another.
        m.insert(vec![2], Arc::new(20));
        assert_eq!(m.len(), 3);
        assert_eq!(m.get(&[2]).as_deref(), Some(&20));
        assert_eq!(m.get(&[0]).as_deref(), Some(&0));
    }
}
