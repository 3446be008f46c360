//! The scan's keys in ascending order of their lower bounds, ordered only as far as the scans
//! read them: a scan usually stops long before the end, and sorting every key of a large space
//! (hundreds of thousands) cost more than scoring the few thousand it reads. The keys wait in
//! a binary heap by bound (built in one linear pass); each bound taken from it brings every
//! key with that bound, sorted by key.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use rayon::prelude::*;

use super::heap::{HeapOrder, Smallest};
use super::Key;

/// (bound as [`ordered`] gives it, part, index in the part) of one key.
type Entry = (i64, u32, u32);

/// Entries wait smallest bound first (entries with equal bounds in any order: they are
/// sorted by key when taken).
impl HeapOrder for Entry {
    fn order(&self, other: &Self) -> Ordering {
        self.0.cmp(&other.0)
    }
}

/// Keys with their lower bounds, handed out in ascending order of (bound, key). Keys are
/// distinct, so the order is total: the keys handed out so far are the first of a full sort.
#[derive(Debug, Default)]
pub(super) struct Bounded {
    /// The keys in the parts the space was enumerated in (moved here, not copied).
    parts: Vec<Vec<Key>>,
    /// The entries in order so far (each bound's entries all at once).
    order: Vec<Entry>,
    /// The entries not yet in `order`, smallest bound first.
    rest: BinaryHeap<Smallest<Entry>>,
}

impl Bounded {
    /// The keys of `parts` with their lower bounds, which `bounds` gives for one part (`None`:
    /// the key is left out), one part per parallel task.
    pub fn new(parts: Vec<Vec<Key>>, bounds: impl Fn(&[Key]) -> Vec<Option<f64>> + Sync) -> Self {
        let per_part: Vec<Vec<Smallest<Entry>>> = parts
            .par_iter()
            .with_max_len(1)
            .enumerate()
            .map(|(p, keys)| {
                let entries = bounds(keys).into_iter().enumerate();
                entries
                    .filter_map(|(i, b)| Some(Smallest((ordered(b?), p as u32, i as u32))))
                    .collect()
            })
            .collect();
        let mut all: Vec<Smallest<Entry>> = Vec::with_capacity(per_part.iter().map(Vec::len).sum());
        all.extend(per_part.into_iter().flatten());
        Bounded {
            parts,
            order: Vec::new(),
            rest: BinaryHeap::from(all),
        }
    }

    /// Keys in all.
    pub fn len(&self) -> usize {
        self.order.len() + self.rest.len()
    }

    fn key(&self, e: &Entry) -> Key {
        self.parts[e.1 as usize][e.2 as usize]
    }

    /// The `i`-th key in ascending order with its bound, ordering further when needed.
    pub fn get(&mut self, i: usize) -> Option<(f64, Key)> {
        while i >= self.order.len() && self.take_bound() {}
        let e = *self.order.get(i)?;
        Some((bound_of(e.0), self.key(&e)))
    }

    /// Moves the entries with the smallest bound left from the heap to `order`, sorted by key;
    /// `false` when none is left.
    fn take_bound(&mut self) -> bool {
        let Some(Smallest(first)) = self.rest.pop() else {
            return false;
        };
        let from = self.order.len();
        self.order.push(first);
        while let Some(&Smallest(e)) = self.rest.peek().filter(|w| w.0 .0 == first.0) {
            self.rest.pop();
            self.order.push(e);
        }
        let parts = &self.parts;
        let key = |e: &Entry| &parts[e.1 as usize][e.2 as usize];
        self.order[from..].sort_unstable_by(|a, b| key(a).cmp(key(b)));
        true
    }
}

/// `x`'s bits as an integer that orders as [`f64::total_cmp`] orders the floats (its own
/// transformation), computed once per key instead of once per comparison.
fn ordered(x: f64) -> i64 {
    let bits = x.to_bits() as i64;
    bits ^ (((bits >> 63) as u64) >> 1) as i64
}

/// The float [`ordered`] was given (the transformation is its own inverse).
fn bound_of(o: i64) -> f64 {
    f64::from_bits((o ^ (((o >> 63) as u64) >> 1) as i64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The integers order as `total_cmp` orders the floats, and give them back bit for bit.
    #[test]
    fn ordered_bits_sort_as_total_cmp_and_round_trip() {
        let xs = [
            f64::NEG_INFINITY,
            -1e300,
            -1.5,
            -f64::MIN_POSITIVE,
            -0.0,
            0.0,
            f64::MIN_POSITIVE,
            1e-300,
            0.25,
            1.0,
            3.5,
            1e300,
            f64::INFINITY,
            f64::NAN,
        ];
        for a in xs {
            assert_eq!(bound_of(ordered(a)).to_bits(), a.to_bits(), "{a}");
            for b in xs {
                assert_eq!(ordered(a).cmp(&ordered(b)), a.total_cmp(&b), "{a} {b}");
            }
        }
    }

    /// Enough keys that a scan reads only part of them.
    const FIRST_SORTED: usize = 16384;

    /// `items` in parts of three keys, each with its bound.
    fn from_items(items: Vec<(f64, Key)>) -> Bounded {
        let bounds: std::collections::HashMap<Key, f64> =
            items.iter().map(|&(b, k)| (k, b)).collect();
        let parts = items
            .chunks(3)
            .map(|c| c.iter().map(|i| i.1).collect())
            .collect();
        Bounded::new(parts, |run| {
            run.iter().map(|k| bounds.get(k).copied()).collect()
        })
    }

    /// Read in any pattern, the keys come out as a full sort orders them.
    #[test]
    fn hands_out_a_full_sorts_order() {
        let model = autopp_models::load("tiny-gpt").expect("preset");
        let limits = super::super::SpaceLimits::new(crate::framework::Framework::Megatron, 8);
        let keys = super::super::space::enumerate(&model, 64, 512, &limits, &Default::default());
        // distinct keys, several per enumerated one, with few distinct bounds: most
        // comparisons fall to the keys
        let items: Vec<(f64, Key)> = (0..5 * FIRST_SORTED)
            .map(|i| {
                let k = keys[i % keys.len()];
                let key = Key {
                    micro_batch_size: k.micro_batch_size + 1000 * (i / keys.len()) as u64,
                    ..k
                };
                (((i * 7919) % 13) as f64, key)
            })
            .collect();
        let mut full = items.clone();
        full.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let n = full.len();
        let mut lazy = from_items(items);
        assert_eq!(lazy.len(), n);
        for i in [
            0,
            1,
            FIRST_SORTED - 1,
            FIRST_SORTED,
            3 * FIRST_SORTED,
            n - 1,
        ] {
            assert_eq!(lazy.get(i), Some(full[i]), "{i}");
        }
        let mut lazy = from_items(full.clone());
        let all: Vec<_> = (0..n).filter_map(|i| lazy.get(i)).collect();
        assert_eq!(all, full);
        assert_eq!(lazy.get(n), None);
    }

    /// With many distinct bounds (a prefix sort stops inside the rest) and keys without a
    /// bound (left out), the order is still a full sort's of the keys with one.
    #[test]
    fn leaves_out_unbounded_keys_and_sorts_past_many_bounds() {
        let model = autopp_models::load("tiny-gpt").expect("preset");
        let limits = super::super::SpaceLimits::new(crate::framework::Framework::Megatron, 8);
        let keys = super::super::space::enumerate(&model, 64, 512, &limits, &Default::default());
        let keys: Vec<Key> = (0..6 * FIRST_SORTED)
            .map(|i| Key {
                micro_batch_size: keys[i % keys.len()].micro_batch_size
                    + 1000 * (i / keys.len()) as u64,
                ..keys[i % keys.len()]
            })
            .collect();
        // a key's bound from its place: every seventh none, the others from 4,999 values
        let bound = |i: usize| (!i.is_multiple_of(7)).then(|| ((i * 7919) % 4999) as f64);
        let place: std::collections::HashMap<Key, usize> =
            keys.iter().enumerate().map(|(i, &k)| (k, i)).collect();
        let mut full: Vec<(f64, Key)> = (0..keys.len())
            .filter_map(|i| Some((bound(i)?, keys[i])))
            .collect();
        full.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let parts: Vec<Vec<Key>> = keys.chunks(1000).map(<[Key]>::to_vec).collect();
        let mut lazy = Bounded::new(parts, |run| run.iter().map(|k| bound(place[k])).collect());
        assert_eq!(lazy.len(), full.len());
        let all: Vec<_> = (0..full.len()).filter_map(|i| lazy.get(i)).collect();
        assert_eq!(all, full);
    }
}
