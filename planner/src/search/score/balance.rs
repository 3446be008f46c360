//! A key's split with several stages per rank, balanced over the ranks by the closed form.

use super::KeyScorer;
use crate::schedule::split;
use crate::search::split_dp;

impl KeyScorer<'_> {
    /// A split at least as good as `split` (the DP's, which evens out the stages) by the closed
    /// form, with its closed form. With several stages per rank the iteration follows the
    /// busiest *rank*, which the DP does not see: while moving one layer out of one of the
    /// busiest rank's stages into a neighbouring stage of a rank it leaves less busy than the
    /// busiest was (within that stage's budget) lowers the closed form, the best such move is
    /// made, at most as many moves as stages.
    pub(super) fn balance_ranks(&self, mut split: Vec<usize>) -> (Vec<usize>, f64) {
        let no_extra = |_: usize, _: usize, _: usize| 0.0;
        let mut best_s = self.closed_form(&split, &no_extra);
        let (pp, s) = (self.key.degrees.pp as usize, split.len());
        if s <= pp {
            return (split, best_s);
        }
        let placement = self.key.schedule.placement();
        let rank_of = |k: usize| placement.rank_of(k, pp);
        for _ in 0..s {
            let ranges = split::stage_ranges(&split);
            let mut busy = vec![0.0; pp];
            for (k, &[a, b]) in ranges.iter().enumerate() {
                busy[rank_of(k)] += self.sums.time_s(a, b);
            }
            let busiest = (0..pp)
                .max_by(|&a, &b| busy[a].total_cmp(&busy[b]))
                .unwrap_or(0);
            let mut step: Option<(Vec<usize>, f64)> = None;
            for from in (0..s).filter(|&k| rank_of(k) == busiest && split[k] > 1) {
                for to in [from.wrapping_sub(1), from + 1] {
                    if to >= s || rank_of(to) == busiest {
                        continue;
                    }
                    // the layer that moves, the first or last of `from`, and the range `to`
                    // holds with it
                    let ([first, last], [a, b]) = (ranges[from], ranges[to]);
                    let (moved, grown) = if to < from {
                        (first, [a, b + 1])
                    } else {
                        (last, [a - 1, b])
                    };
                    if busy[rank_of(to)] + self.sums.time_s(moved, moved) >= busy[busiest] {
                        // the receiving rank would be as busy as the busiest was
                        continue;
                    }
                    if !split_dp::budget_fits(&self.sums, &self.budgets, to, grown[0], grown[1]) {
                        continue;
                    }
                    let mut trial = split.clone();
                    trial[from] -= 1;
                    trial[to] += 1;
                    let t = self.closed_form(&trial, &no_extra);
                    if t < step.as_ref().map_or(best_s, |x| x.1) * (1.0 - 1e-9) {
                        step = Some((trial, t));
                    }
                }
            }
            match step {
                Some((trial, t)) => {
                    split = trial;
                    best_s = t;
                }
                None => break,
            }
        }
        (split, best_s)
    }
}
