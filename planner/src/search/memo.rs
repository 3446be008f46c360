//! A map of values computed once, on first use, and shared by the search's threads.

use rustc_hash::FxHashMap as HashMap;
use std::hash::Hash;
use std::sync::Mutex;

/// Values by key, each computed on first use. The computation runs outside the lock, so two
/// threads may both compute a key; both get the same value (every use here is a pure
/// function of the key).
pub(crate) struct Memo<K, V>(Mutex<HashMap<K, V>>);

impl<K, V> Default for Memo<K, V> {
    fn default() -> Self {
        Memo(Mutex::new(HashMap::default()))
    }
}

impl<K: Eq + Hash, V: Clone> Memo<K, V> {
    /// The value of `key`, computed by `make` the first time.
    pub fn get_or(&self, key: K, make: impl FnOnce() -> V) -> V {
        if let Some(found) = self.0.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return found;
        }
        let made = make();
        if let Ok(mut m) = self.0.lock() {
            m.insert(key, made.clone());
        }
        made
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn computes_once_per_key() {
        let memo: Memo<u32, u32> = Memo::default();
        let calls = std::cell::Cell::new(0);
        let square = |k: u32| {
            memo.get_or(k, || {
                calls.set(calls.get() + 1);
                k * k
            })
        };
        assert_eq!((square(3), square(3), square(4)), (9, 9, 16));
        assert_eq!(calls.get(), 2);
    }
}
