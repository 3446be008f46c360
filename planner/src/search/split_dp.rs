//! Choosing a configuration's layer split: dynamic programming over contiguous layer ranges.
//!
//! Stages are filled in pipeline order. `best[k][j]` is the smallest achievable *bottleneck*
//! (the largest per-micro-batch F+B time of any stage) when layers `0..=j` fill stages `0..=k`,
//! subject to every stage's memory budget:
//!
//! `best[k][j] = min over i of max(best[k−1][i], cost(i+1..=j))`, over the `i` whose range
//! `i+1..=j` fits stage `k`'s budget.
//!
//! `best[k−1][i]` never decreases as `i` grows (more layers in the same stages) and
//! `cost(i+1..=j)` never increases, so the minimum sits where the two cross. Memory needs grow
//! with the range, so the feasible `i` form an interval. As `j` grows, the interval's start and
//! the crossing point both move right only, so two pointers find them and the whole table costs
//! `O(S · n)` for `S` stages and `n` layers.

/// Per-layer figures the DP needs, with prefix sums for O(1) range queries.
#[derive(Debug, Clone)]
pub struct LayerSums {
    time_s: Vec<f64>,
    fixed_bytes: Vec<f64>,
    act_bytes: Vec<f64>,
    /// The smallest single layer's fixed and activation figures.
    min_fixed: f64,
    min_act: f64,
}

impl LayerSums {
    /// Builds prefix sums from per-layer F+B seconds, per-layer fixed bytes (model states) and
    /// per-layer activation bytes per in-flight micro-batch.
    pub fn new(time_s: &[f64], fixed_bytes: &[f64], act_bytes: &[f64]) -> Self {
        let prefix = |v: &[f64]| {
            let mut p = Vec::with_capacity(v.len() + 1);
            p.push(0.0);
            let mut acc = 0.0;
            for x in v {
                acc += x;
                p.push(acc);
            }
            p
        };
        LayerSums {
            time_s: prefix(time_s),
            fixed_bytes: prefix(fixed_bytes),
            act_bytes: prefix(act_bytes),
            min_fixed: fixed_bytes.iter().copied().fold(f64::INFINITY, f64::min),
            min_act: act_bytes.iter().copied().fold(f64::INFINITY, f64::min),
        }
    }

    /// These sums with `extra[i]` more fixed bytes on layer `i`.
    pub fn with_extra_fixed(&self, extra: &[f64]) -> Self {
        let per_layer = |p: &[f64]| -> Vec<f64> { p.windows(2).map(|w| w[1] - w[0]).collect() };
        let fixed: Vec<f64> = per_layer(&self.fixed_bytes)
            .iter()
            .zip(extra)
            .map(|(f, e)| f + e)
            .collect();
        let mut sums = LayerSums::new(&[], &fixed, &[]);
        sums.time_s.clone_from(&self.time_s);
        sums.act_bytes.clone_from(&self.act_bytes);
        sums.min_act = self.min_act;
        sums
    }

    /// Number of layers.
    pub fn len(&self) -> usize {
        self.time_s.len() - 1
    }

    /// Whether there are no layers.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// F+B seconds of layers `first..=last`.
    pub fn time_s(&self, first: usize, last: usize) -> f64 {
        self.time_s[last + 1] - self.time_s[first]
    }

    /// Memory of layers `first..=last` holding `inflight` micro-batches, bytes.
    pub fn mem_bytes(&self, first: usize, last: usize, inflight: f64) -> f64 {
        (self.fixed_bytes[last + 1] - self.fixed_bytes[first])
            + inflight * (self.act_bytes[last + 1] - self.act_bytes[first])
    }
}

/// What each stage may hold.
#[derive(Debug, Clone, Copy)]
pub struct StageBudget {
    /// Bytes available to the stage's layers.
    pub bytes: f64,
    /// Micro-batches of the stage in flight at the rank's peak.
    pub inflight: f64,
    /// Bytes the stage holds beyond its layers when it holds the last layer (a tied head copy).
    pub extra_if_last_bytes: f64,
}

/// Whether any split fits the budgets, in `O(S · n)`: stage `k` can end at layer `j` when
/// some `i` in the (contiguous) set of starts whose range `i+1..=j` fits stage `k` is a
/// possible end of stage `k − 1`. The smallest fitting start only grows with `j`, so a pointer
/// finds it, and prefix counts of the previous stage's possible ends answer each `j` in O(1).
/// [`best_split`] is `None` exactly when this is `false`; the search uses it to skip the full
/// dynamic program for configurations that cannot fit.
pub fn any_split_fits(sums: &LayerSums, budgets: &[StageBudget]) -> bool {
    // A necessary condition first, in O(S): every layer needs at least the smallest layer's
    // bytes on whatever stage holds it, so stage k holds at most ⌊budget / that⌋ layers, and
    // together the stages must hold all of them.
    let n = sums.len() as f64;
    let mut room = 0.0;
    for b in budgets {
        let least = sums.min_fixed + b.inflight * sums.min_act;
        if least <= 0.0 {
            room = f64::INFINITY;
            break;
        }
        room += (b.bytes / least).floor().max(0.0);
    }
    if room < n {
        return false;
    }
    any_fits_with(sums.len(), budgets.len(), |k, first, last| {
        budget_fits(sums, budgets, k, first, last)
    })
}

/// Whether layers `first..=last` fit stage `k`'s budget.
pub(crate) fn budget_fits(
    sums: &LayerSums,
    budgets: &[StageBudget],
    k: usize,
    first: usize,
    last: usize,
) -> bool {
    stage_need(sums, &budgets[k], first, last) <= budgets[k].bytes
}

/// What layers `first..=last` need on a stage of budget `b`, in its units: their states and
/// in-flight activations, and its extra when they end the model.
pub(crate) fn stage_need(sums: &LayerSums, b: &StageBudget, first: usize, last: usize) -> f64 {
    let extra = if last + 1 == sums.len() {
        b.extra_if_last_bytes
    } else {
        0.0
    };
    sums.mem_bytes(first, last, b.inflight) + extra
}

/// [`any_split_fits`] for any `fits(stage, first, last)` that stays true when a fitting range
/// shrinks.
///
/// Two greedy passes settle most cases in `O(S + n)` calls of `fits`; the exact `O(S · n)`
/// pass runs only when they disagree (see `greedy_reach`).
pub fn any_fits_with(n: usize, s: usize, fits: impl Fn(usize, usize, usize) -> bool) -> bool {
    if s == 0 || n < s {
        return false;
    }
    // Stages allowed to stay empty: a relaxation, so if even it cannot place every layer,
    // nothing can.
    if greedy_reach(n, s, false, &fits) < n {
        return false;
    }
    // Every stage non-empty: a split, so if it places every layer, one fits.
    if greedy_reach(n, s, true, &fits) == n {
        return true;
    }
    // prev[j + 1] = number of possible ends of the previous stage among layers 0..=j
    let mut prev = vec![0u32; n + 1];
    let mut next = vec![0u32; n + 1];
    for j in 0..n {
        prev[j + 1] = prev[j] + u32::from(j <= n - s && fits(0, 0, j));
    }
    for k in 1..s {
        next[..=k].fill(0);
        // the smallest start `first` with first..=j fitting, for the current j
        let mut first = k;
        for j in k..n {
            let reachable = j <= n - s + k && {
                while first <= j && !fits(k, first, j) {
                    first += 1;
                }
                // the previous stage ends at i = first−1 ..= j−1
                first <= j && prev[j] > prev[first - 1]
            };
            next[j + 1] = next[j] + u32::from(reachable);
        }
        std::mem::swap(&mut prev, &mut next);
    }
    prev[n] > prev[n - 1]
}

/// How many layers (a prefix) `s` stages place when each, in order, takes as many of the next
/// layers as fit it, in `O(S + n)` calls of `fits`.
///
/// - `non_empty = false`: stages may be empty. Because a fitting range's sub-ranges fit, no
///   placement (empty stages allowed) covers a longer prefix, so a result below `n` proves
///   that no split fits.
/// - `non_empty = true`: every stage takes at least one layer and leaves one for each stage
///   after it, stopping at the first stage that cannot; `n` means the greedy found a split
///   that fits (a smaller result proves nothing).
fn greedy_reach(
    n: usize,
    s: usize,
    non_empty: bool,
    fits: &impl Fn(usize, usize, usize) -> bool,
) -> usize {
    let mut next = 0;
    for k in 0..s {
        let cap = if non_empty { n - (s - 1 - k) } else { n };
        let mut end = next;
        while end < cap && fits(k, next, end) {
            end += 1;
        }
        if non_empty && end == next {
            return next;
        }
        next = end;
        if next == n {
            break;
        }
    }
    next
}

/// The split with the smallest bottleneck under the budgets: layer-list entries per stage, and
/// the bottleneck in seconds. `None` when no split fits.
pub fn best_split(sums: &LayerSums, budgets: &[StageBudget]) -> Option<(Vec<usize>, f64)> {
    best_split_with(
        sums.len(),
        budgets.len(),
        |k, first, last| budget_fits(sums, budgets, k, first, last),
        |_, first, last| sums.time_s(first, last),
    )
}

/// [`best_split`] for any `fits(stage, first, last)` that stays true when a fitting range
/// shrinks and any stage time `time_s(stage, first, last)` that does not grow when a range
/// shrinks (both only asked of ranges that fit).
pub fn best_split_with(
    n: usize,
    s: usize,
    fits: impl Fn(usize, usize, usize) -> bool,
    time_s: impl Fn(usize, usize, usize) -> f64,
) -> Option<(Vec<usize>, f64)> {
    if s == 0 || n < s {
        return None;
    }
    let inf = f64::INFINITY;
    // best[k][j], choice[k][j] = the i of stage k's range i+1..=j (usize::MAX for k = 0), one
    // row of n per stage in one vector each
    let mut best = vec![inf; s * n];
    let mut choice = vec![usize::MAX; s * n];
    for (j, slot) in best[..n].iter_mut().enumerate() {
        if fits(0, 0, j) {
            *slot = time_s(0, 0, j);
        }
    }
    for k in 1..s {
        let (done, rest) = best.split_at_mut(k * n);
        let (prev, row) = (&done[(k - 1) * n..], &mut rest[..n]);
        let choices = &mut choice[k * n..(k + 1) * n];
        // Stage k's range is i+1..=j. As j grows, both the smallest fitting i (memory grows
        // with the range) and the crossing point (the first i where best[k−1][i] reaches the
        // stage's time) only move right, so two pointers find them in O(n) per stage.
        let mut i_min = k - 1;
        let mut cross = k - 1;
        // stage k needs at least one layer, and the stages after it one each
        for j in k..=(n - s + k) {
            let hi = j - 1;
            while i_min <= hi && !fits(k, i_min + 1, j) {
                i_min += 1;
            }
            if i_min > hi {
                continue;
            }
            cross = cross.max(i_min);
            while cross <= hi && prev[cross] < time_s(k, cross + 1, j) {
                cross += 1;
            }
            let mut pick = (inf, usize::MAX);
            for i in [cross.saturating_sub(1), cross] {
                if i < i_min || i > hi {
                    continue;
                }
                let v = prev[i].max(time_s(k, i + 1, j));
                if v < pick.0 {
                    pick = (v, i);
                }
            }
            row[j] = pick.0;
            choices[j] = pick.1;
        }
    }
    let bottleneck = best[s * n - 1];
    if !bottleneck.is_finite() {
        return None;
    }
    let mut counts = vec![0; s];
    let mut j = n - 1;
    for k in (1..s).rev() {
        let i = choice[k * n + j];
        counts[k] = j - i;
        j = i;
    }
    counts[0] = j + 1;
    Some((counts, bottleneck))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budgets(s: usize, bytes: f64) -> Vec<StageBudget> {
        vec![
            StageBudget {
                bytes,
                inflight: 1.0,
                extra_if_last_bytes: 0.0,
            };
            s
        ]
    }

    fn brute(sums: &LayerSums, b: &[StageBudget]) -> Option<f64> {
        let n = sums.len();
        let mut best: Option<f64> = None;
        for split in crate::schedule::split::all_splits(n, b.len()) {
            let mut first = 0;
            let mut worst: f64 = 0.0;
            let mut ok = true;
            for (k, &c) in split.iter().enumerate() {
                let last = first + c - 1;
                let extra = if last == n - 1 {
                    b[k].extra_if_last_bytes
                } else {
                    0.0
                };
                ok &= sums.mem_bytes(first, last, b[k].inflight) + extra <= b[k].bytes;
                worst = worst.max(sums.time_s(first, last));
                first = last + 1;
            }
            if ok {
                best = Some(best.map_or(worst, |x: f64| x.min(worst)));
            }
        }
        best
    }

    #[test]
    fn matches_brute_force_on_small_cases() {
        // deterministic pseudo-random costs
        let mut seed = 12345u64;
        let mut rnd = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 33) % 1000) as f64 / 100.0 + 0.1
        };
        for n in 1..=10 {
            for s in 1..=n.min(5) {
                for trial in 0..12 {
                    let t: Vec<f64> = (0..n).map(|_| rnd()).collect();
                    let f: Vec<f64> = (0..n).map(|_| rnd()).collect();
                    let a: Vec<f64> = (0..n).map(|_| rnd()).collect();
                    let sums = LayerSums::new(&t, &f, &a);
                    let cap = if trial % 2 == 0 {
                        1e9
                    } else {
                        25.0 + 3.0 * trial as f64
                    };
                    let mut b = budgets(s, cap);
                    for (k, bk) in b.iter_mut().enumerate() {
                        bk.inflight = (s - k) as f64;
                    }
                    b[s - 1].extra_if_last_bytes = (trial as f64) * 2.0;
                    let dp = best_split(&sums, &b);
                    let bf = brute(&sums, &b);
                    assert_eq!(
                        any_split_fits(&sums, &b),
                        bf.is_some(),
                        "n {n} s {s} trial {trial}"
                    );
                    match (dp, bf) {
                        (None, None) => {}
                        (Some((counts, v)), Some(w)) => {
                            assert!((v - w).abs() < 1e-9, "n {n} s {s}: dp {v} brute {w}");
                            assert_eq!(counts.iter().sum::<usize>(), n);
                            assert!(counts.iter().all(|&c| c >= 1));
                        }
                        other => panic!("n {n} s {s} trial {trial}: {other:?}"),
                    }
                }
            }
        }
    }

    /// The greedy passes alone cannot decide this one: filling stage 0 as far as it goes leaves
    /// stage 1 a layer it cannot hold, while a smaller stage 0 fits; with stage 2 too small for
    /// the last two layers, nothing fits.
    #[test]
    fn the_exact_pass_decides_when_the_greedy_passes_disagree() {
        let sums = LayerSums::new(&[1.0; 4], &[1.0, 1.0, 3.0, 1.0], &[0.0; 4]);
        let mut b = budgets(3, 2.0);
        b[1].bytes = 1.0;
        b[2].bytes = 4.0;
        assert_eq!(
            greedy_reach(4, 3, false, &|k, f, l| budget_fits(&sums, &b, k, f, l)),
            4
        );
        assert!(greedy_reach(4, 3, true, &|k, f, l| budget_fits(&sums, &b, k, f, l)) < 4);
        assert!(any_split_fits(&sums, &b));
        assert_eq!(best_split(&sums, &b).map(|x| x.0), Some(vec![1, 1, 2]));
        b[2].bytes = 3.5;
        assert!(!any_split_fits(&sums, &b));
        assert_eq!(brute(&sums, &b), None);
    }

    #[test]
    fn uniform_layers_split_evenly() {
        let sums = LayerSums::new(&[1.0; 12], &[0.0; 12], &[0.0; 12]);
        let (counts, v) = best_split(&sums, &budgets(4, 1.0)).unwrap();
        assert_eq!(counts, vec![3, 3, 3, 3]);
        assert_eq!(v, 3.0);
    }
}
