//! A [`BinaryHeap`](std::collections::BinaryHeap) entry with the smallest on top, by an order
//! of its own.

use std::cmp::Ordering;

/// How entries of a min-heap compare ([`Smallest`]).
pub(super) trait HeapOrder {
    /// The order the heap hands entries out in, smallest first.
    fn order(&self, other: &Self) -> Ordering;
}

/// An entry of a [`BinaryHeap`](std::collections::BinaryHeap) that puts the smallest by
/// [`HeapOrder::order`] on top.
#[derive(Debug, Clone, Copy)]
pub(super) struct Smallest<T>(pub T);

impl<T: HeapOrder> PartialEq for Smallest<T> {
    fn eq(&self, other: &Self) -> bool {
        self.0.order(&other.0).is_eq()
    }
}

impl<T: HeapOrder> Eq for Smallest<T> {}

impl<T: HeapOrder> PartialOrd for Smallest<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<T: HeapOrder> Ord for Smallest<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        other.0.order(&self.0)
    }
}
