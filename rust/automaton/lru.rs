//! The LRU queue of evictable nodes: a min-queue of `(tick, node)` keys with lazy deletion.
//!
//! Almost every key pushed is at least the newest one held (a node is pushed when it is used,
//! at the newest tick), so those go to the back of a sorted FIFO, O(1) both ways, instead of
//! paying a binary heap's sift on every push and eviction. The few others (a node that
//! became evictable when its last child went keeps its old tick) wait in a binary heap
//! beside it, small as they are old and so evicted soon; a pop takes the least of the two
//! fronts, so the order is exactly a single heap's: by tick, then node index.
#![forbid(unsafe_code)]

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

fn key(tick: u64, node: u32) -> u128 {
    (u128::from(tick) << 32) | u128::from(node)
}

fn split(key: u128) -> (u64, u32) {
    ((key >> 32) as u64, key as u32)
}

/// A min-queue of `(tick, node)` pairs (duplicates allowed).
#[derive(Debug, Clone, Default)]
pub(crate) struct LruQueue {
    /// Keys in ascending order.
    sorted: VecDeque<u128>,
    /// Keys that were below the back of `sorted` when pushed.
    early: BinaryHeap<Reverse<u128>>,
}

impl LruQueue {
    pub(crate) fn len(&self) -> usize {
        self.sorted.len() + self.early.len()
    }

    /// Heap bytes held (capacities).
    pub(crate) fn memory_bytes(&self) -> usize {
        (self.sorted.capacity() + self.early.capacity()) * size_of::<u128>()
    }

    /// Forget every key (memory is kept for reuse).
    pub(crate) fn clear(&mut self) {
        self.sorted.clear();
        self.early.clear();
    }

    /// Push `(tick, node)`; false (and nothing pushed) when memory for it cannot be had.
    #[must_use]
    #[inline]
    pub(crate) fn push(&mut self, tick: u64, node: u32) -> bool {
        let k = key(tick, node);
        if self.sorted.back().is_none_or(|&b| b <= k) {
            if self.sorted.len() == self.sorted.capacity() && self.sorted.try_reserve(1).is_err() {
                return false;
            }
            self.sorted.push_back(k);
        } else {
            if self.early.try_reserve(1).is_err() {
                return false;
            }
            self.early.push(Reverse(k));
        }
        true
    }

    /// Replace the contents with `entries` (any order); false if memory for them cannot be
    /// had (the queue is left empty then).
    #[must_use]
    pub(crate) fn rebuild(&mut self, mut entries: Vec<(u64, u32)>) -> bool {
        self.clear();
        entries.sort_unstable();
        if self.sorted.try_reserve(entries.len()).is_err() {
            return false;
        }
        self.sorted
            .extend(entries.into_iter().map(|(t, v)| key(t, v)));
        true
    }

    /// Pop the least `(tick, node)`.
    #[inline]
    pub(crate) fn pop(&mut self) -> Option<(u64, u32)> {
        let k = match (self.sorted.front(), self.early.peek()) {
            (Some(&s), Some(e)) if e.0 < s => self.early.pop().map(|e| e.0),
            (Some(_), _) => self.sorted.pop_front(),
            (None, _) => self.early.pop().map(|e| e.0),
        };
        k.map(split)
    }

    /// Every `(tick, node)` held, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.sorted
            .iter()
            .copied()
            .chain(self.early.iter().map(|e| e.0))
            .map(split)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_in_the_order_of_a_binary_heap() {
        let mut seed = 7u64;
        let mut rand = |n: u64| {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) % n
        };
        let mut q = LruQueue::default();
        let mut reference = BinaryHeap::new();
        let mut tick = 0u64;
        for _ in 0..20_000 {
            match rand(10) {
                0..=4 => {
                    tick += rand(3);
                    let (t, v) = (tick.saturating_sub(rand(4) * rand(2)), rand(50) as u32);
                    assert!(q.push(t, v));
                    reference.push(Reverse((t, v)));
                }
                5..=8 => assert_eq!(q.pop(), reference.pop().map(|r| r.0)),
                _ => {
                    let t = tick.saturating_sub(rand(1000)); // older than the last pop
                    assert!(q.push(t, 3));
                    reference.push(Reverse((t, 3)));
                }
            }
            assert_eq!(q.len(), reference.len());
        }
        let mut all: Vec<_> = q.iter().collect();
        all.sort_unstable();
        let mut want: Vec<_> = reference.into_iter().map(|r| r.0).collect();
        want.sort_unstable();
        assert_eq!(all, want);
        q.clear();
        assert_eq!((q.len(), q.pop()), (0, None));
        assert!(q.push(u64::MAX, u32::MAX) && q.push(0, 0));
        assert_eq!(q.pop(), Some((0, 0)));
        assert_eq!(q.pop(), Some((u64::MAX, u32::MAX)));
        assert!(q.rebuild(vec![(5, 1), (2, 9), (5, 0)]) && q.push(1, 1));
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, vec![(1, 1), (2, 9), (5, 0), (5, 1)]);
    }
}
