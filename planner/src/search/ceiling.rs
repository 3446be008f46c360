//! What a candidate must be able to beat to change the answer, from the plans found so far.
//!
//! The answer shows the fastest plan, the simplest within the tolerance of it, and the next
//! `top_k` that run differently. So once `top_k + 2` configurations that run differently are
//! known to take at most `t`, and `t` is past the tolerance of the fastest, no plan slower than
//! `t` can be shown. A candidate's iteration
//! time is at least its busiest rank's busy time, so at least the mean over the ranks of the
//! work of one iteration, `m · Σ(F + B) / pp` over its layers — whatever its split, and
//! whatever refining the split does ([`exact_lower_bound_s`]). Candidates whose bound is above
//! the [`Ceiling`] are not simulated: the answer is the same, faster.
//!
//! A search keeps its own ceiling (its own answers stay as they were); `--framework any`
//! also shares one across the frameworks' searches, fed with each framework's runnable
//! answers, so a framework whose plans are all slower than the others' best few is hardly
//! simulated at all.

use std::sync::{Arc, Mutex};

use super::table::{mode_index, LayerTable};
use super::{key_of, time_of, Key, SearchOptions};
use crate::estimate::Estimate;
use crate::schedule::Schedule;

/// The fastest exact time found per distinct run (configuration and schedule).
pub(crate) struct Ceiling {
    /// Configurations that must be known before the ceiling falls below infinity.
    keep: usize,
    /// Plans within this fraction of the fastest are never cut.
    tolerance: f64,
    /// (configuration, its schedule, fastest time seconds) per distinct run, fastest first.
    best: Mutex<Vec<(Key, Arc<Schedule>, f64)>>,
}

impl Ceiling {
    /// An empty ceiling for `opts`' answers: the best, the simplest within the tolerance and
    /// `top_k` alternatives.
    pub fn new(opts: &SearchOptions) -> Self {
        Ceiling {
            keep: opts.top_k + 2,
            tolerance: opts.tolerance.max(0.0),
            best: Mutex::new(Vec::new()),
        }
    }

    /// Records a fitting plan.
    pub fn offer(&self, e: &Estimate) {
        self.offer_run(key_of(e), &e.schedule, time_of(e));
    }

    /// Records a fitting configuration `key` that runs `schedule` in `time_s` seconds. Keys that
    /// differ only in their schedule's name and run the same action lists (GPipe and 1F1B with
    /// one micro-batch, say) are one run, as [`same_run`] counts them.
    fn offer_run(&self, key: Key, schedule: &Arc<Schedule>, time_s: f64) {
        let Ok(mut best) = self.best.lock() else {
            return;
        };
        let same = |(k, s, _): &(Key, Arc<Schedule>, f64)| {
            let named_alike = Key {
                schedule: key.schedule,
                ..*k
            } == key;
            named_alike && (k.schedule == key.schedule || same_actions(s, schedule))
        };
        match best.iter().position(same) {
            Some(i) if best[i].2 <= time_s => return,
            Some(i) => {
                best.remove(i);
            }
            None => {}
        }
        let at = best.partition_point(|(_, _, t)| *t <= time_s);
        best.insert(at, (key, Arc::clone(schedule), time_s));
    }

    /// The fastest plan's seconds, once one is known.
    pub fn fastest_s(&self) -> Option<f64> {
        let best = self.best.lock().ok()?;
        best.first().map(|b| b.2)
    }

    /// Seconds above which no plan changes the answer (infinite until enough are known).
    pub fn limit_s(&self) -> f64 {
        let Ok(best) = self.best.lock() else {
            return f64::INFINITY;
        };
        match (best.first(), best.get(self.keep - 1)) {
            (Some((_, _, fastest)), Some((_, _, kth))) => kth.max(fastest * (1.0 + self.tolerance)),
            _ => f64::INFINITY,
        }
    }
}

/// A lower bound on the iteration time of `k` with any split, seconds: the mean busy time of
/// its ranks, `m · Σ(F + B) / pp` over the layers in its recompute mode (partial recompute
/// recomputes some layers fully, which only adds).
pub(crate) fn exact_lower_bound_s(k: &Key, table: &LayerTable, opts: &SearchOptions) -> f64 {
    let (total, _, _) = table.total_s[mode_index(k.recompute)];
    let m = (opts.global_batch_size / (k.degrees.dp * k.micro_batch_size)) as f64;
    m * total / k.degrees.pp as f64
}

/// Whether two evaluated configurations run identically under different schedule names: the
/// same per-rank action lists and placement (gpipe and 1f1b with one micro-batch, interleaved
/// 1F1B with one stage per rank and 1f1b), and the same plan and prediction otherwise.
pub(crate) fn same_run(a: &Estimate, b: &Estimate) -> bool {
    if !same_actions(&a.schedule, &b.schedule) {
        return false;
    }
    let mut plan = b.result.plan.clone();
    plan.schedule = a.result.plan.schedule;
    plan == a.result.plan && a.result.predicted == b.result.predicted
}

/// Whether two schedules give every rank the same action list, with the same placement.
fn same_actions(a: &Arc<Schedule>, b: &Arc<Schedule>) -> bool {
    a.placement == b.placement && (Arc::ptr_eq(a, b) || a.ranks == b.ranks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::degrees::Degrees;
    use crate::schedule::{generate, ScheduleKind, ScheduleSpec};
    use autopp_models::Recompute;

    fn key(tp: u64, schedule: ScheduleKind) -> Key {
        Key {
            degrees: Degrees {
                tp,
                pp: 2,
                dp: 1,
                cp: 1,
                virtual_stages: 1,
            },
            micro_batch_size: 1,
            schedule,
            recompute: Recompute::None,
            partial_recompute: false,
            sequence_parallel: false,
            zero_stage: 1,
            ep: 1,
            etp: 1,
        }
    }

    fn schedule(kind: ScheduleKind, m: usize) -> Arc<Schedule> {
        Arc::new(generate(&ScheduleSpec::new(kind, 2, m)).expect("generates"))
    }

    fn ceiling(top_k: usize, tolerance: f64) -> Ceiling {
        Ceiling {
            keep: top_k + 2,
            tolerance,
            best: Mutex::new(Vec::new()),
        }
    }

    #[test]
    fn the_limit_is_the_time_of_the_last_run_the_answer_can_show() {
        // top_k 1: the best, the simplest within the tolerance, one alternative → 3 runs
        let c = ceiling(1, 0.01);
        let one_f = schedule(ScheduleKind::OneFOneB, 8);
        c.offer_run(key(1, ScheduleKind::OneFOneB), &one_f, 10.0);
        c.offer_run(key(2, ScheduleKind::OneFOneB), &one_f, 12.0);
        assert_eq!(
            c.limit_s(),
            f64::INFINITY,
            "two runs known: nothing can be cut"
        );
        c.offer_run(key(4, ScheduleKind::OneFOneB), &one_f, 11.0);
        assert_eq!(c.limit_s(), 12.0, "the third fastest of 10, 11, 12");
        // a faster time for a known run replaces it; a slower one is ignored
        c.offer_run(key(2, ScheduleKind::OneFOneB), &one_f, 10.5);
        c.offer_run(key(4, ScheduleKind::OneFOneB), &one_f, 30.0);
        assert_eq!(c.limit_s(), 11.0, "10, 10.5, 11");
    }

    #[test]
    fn plans_within_the_tolerance_of_the_fastest_are_never_cut() {
        // 5% tolerance: 10 s makes everything up to 10.5 s a possible simplest plan
        let c = ceiling(1, 0.05);
        let one_f = schedule(ScheduleKind::OneFOneB, 8);
        for (tp, t) in [(1, 10.0), (2, 10.1), (4, 10.2)] {
            c.offer_run(key(tp, ScheduleKind::OneFOneB), &one_f, t);
        }
        assert!((c.limit_s() - 10.5).abs() < 1e-12, "{}", c.limit_s());
    }

    #[test]
    fn schedules_that_run_alike_are_one_run() {
        let c = ceiling(1, 0.0);
        // one micro-batch: GPipe and 1F1B run the same actions, so they are one run
        let (gpipe, one_f) = (
            schedule(ScheduleKind::Gpipe, 1),
            schedule(ScheduleKind::OneFOneB, 1),
        );
        c.offer_run(key(1, ScheduleKind::Gpipe), &gpipe, 10.0);
        c.offer_run(key(1, ScheduleKind::OneFOneB), &one_f, 10.0);
        c.offer_run(key(2, ScheduleKind::OneFOneB), &one_f, 11.0);
        assert_eq!(c.limit_s(), f64::INFINITY, "two runs, not three");
        // eight micro-batches: they differ
        let (gpipe, one_f) = (
            schedule(ScheduleKind::Gpipe, 8),
            schedule(ScheduleKind::OneFOneB, 8),
        );
        let c = ceiling(1, 0.0);
        c.offer_run(key(1, ScheduleKind::Gpipe), &gpipe, 10.0);
        c.offer_run(key(1, ScheduleKind::OneFOneB), &one_f, 10.0);
        c.offer_run(key(2, ScheduleKind::OneFOneB), &one_f, 11.0);
        assert_eq!(c.limit_s(), 11.0);
    }
}
