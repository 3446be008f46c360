//! The scan's keys in ascending order of their lower bounds, sorted only as far as the scans
//! read them: a scan usually stops long before the end, and sorting every key of a large space
//! (hundreds of thousands) cost more than scoring the few thousand it reads.

use std::cmp::Ordering;

use super::Key;

/// The smallest prefix sorted at once.
const FIRST_SORTED: usize = 4096;

/// Keys with their lower bounds, handed out in ascending order of (bound, key). Keys are
/// distinct, so the order is total: the prefix sorted so far is the same as a full sort's.
#[derive(Debug, Default)]
pub(super) struct Bounded {
    keys: Vec<Key>,
    /// (bound as [`ordered`] gives it, index into `keys`): `order[..sorted]` in ascending
    /// order, and no later entry before any of them.
    order: Vec<(i64, usize)>,
    sorted: usize,
}

impl Bounded {
    /// `keys` with their lower bounds, in any order.
    pub fn new(bounded: impl IntoIterator<Item = (f64, Key)>) -> Self {
        let (order, keys): (Vec<(i64, usize)>, Vec<Key>) = bounded
            .into_iter()
            .enumerate()
            .map(|(i, (bound, key))| ((ordered(bound), i), key))
            .unzip();
        Bounded {
            keys,
            order,
            sorted: 0,
        }
    }

    /// Keys in all.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// The `i`-th key in ascending order with its bound, sorting further when needed.
    pub fn get(&mut self, i: usize) -> Option<(f64, Key)> {
        if i >= self.order.len() {
            return None;
        }
        if i >= self.sorted {
            self.sort_past(i);
        }
        let (bound, k) = self.order[i];
        Some((bound_of(bound), self.keys[k]))
    }

    /// Sorts a prefix that holds index `i`: at least twice the prefix sorted so far.
    fn sort_past(&mut self, i: usize) {
        let keys = &self.keys;
        let cmp = |a: &(i64, usize), b: &(i64, usize)| -> Ordering {
            a.0.cmp(&b.0).then_with(|| keys[a.1].cmp(&keys[b.1]))
        };
        let end = (i + 1)
            .max(2 * self.sorted)
            .max(FIRST_SORTED)
            .min(self.order.len());
        let rest = &mut self.order[self.sorted..];
        let take = end - self.sorted;
        if take < rest.len() {
            // the `take` smallest of the rest first, in any order
            rest.select_nth_unstable_by(take - 1, cmp);
        }
        rest[..take].sort_unstable_by(cmp);
        self.sorted = end;
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
        let mut lazy = Bounded::new(items);
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
        let mut lazy = Bounded::new(full.clone());
        let all: Vec<_> = (0..n).filter_map(|i| lazy.get(i)).collect();
        assert_eq!(all, full);
        assert_eq!(lazy.get(n), None);
    }
}
