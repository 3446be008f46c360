//! Peak in-flight micro-batches per rank of each schedule kind without generating a schedule
//! of every length, and the stages per rank each kind runs with.
//!
//! Most kinds have a closed form. For the others (ZB-V and DualPipe-V) the counts *saturate*:
//! the schedules hold at most about `2p + 1` micro-batches, a count that stops growing once
//! `m` exceeds it. So the counts at `m` follow from a schedule of about `4·p·v` micro-batches
//! (with `m`'s remainder modulo `p`): taken as they are when they saturated, scaled by
//! `m / m_small` when some rank held every one of its `v·m_small` (stage, micro-batch) pairs.
//! A test checks both against full generation, for every kind.

use crate::generators::{check_spec, generate, rounds_group_size, ScheduleSpec};
use crate::ir::ScheduleKind;

impl ScheduleKind {
    /// Peak in-flight (stage, micro-batch) activations per rank of this kind with `pp` ranks,
    /// `v` stages per rank and `m` micro-batches (the default group size); `None` when the
    /// schedule does not accept these inputs.
    ///
    /// ```
    /// use autopp_schedule::ScheduleKind;
    ///
    /// assert_eq!(ScheduleKind::OneFOneB.peak_inflight(4, 1, 8), Some(vec![4, 3, 2, 1]));
    /// assert_eq!(ScheduleKind::ZbV.peak_inflight(1, 2, 8), None);
    /// ```
    pub fn peak_inflight(self, pp: u64, v: u64, m: u64) -> Option<Vec<u32>> {
        self.peak_inflight_with(pp, v, m, &|m| self.generated_peak_inflight(pp, v, m))
    }

    /// The per-rank peak in-flight counts of the generated schedule of `m` micro-batches
    /// ([`Schedule::peak_inflight`](crate::Schedule::peak_inflight)); `None` when the schedule
    /// does not accept these inputs.
    pub fn generated_peak_inflight(self, pp: u64, v: u64, m: u64) -> Option<Vec<u32>> {
        generate(&spec(self, pp, v, m))
            .ok()
            .map(|s| s.peak_inflight())
    }

    /// [`ScheduleKind::peak_inflight`] with the counts of generated schedules from
    /// `generate(m)` (a caller that asks for many `m` can cache them: the truncated lengths
    /// repeat).
    pub fn peak_inflight_with(
        self,
        pp: u64,
        v: u64,
        m: u64,
        generate: &dyn Fn(u64) -> Option<Vec<u32>>,
    ) -> Option<Vec<u32>> {
        if let Some(known) = self.closed_form_peak_inflight(pp, v, m) {
            return known;
        }
        let cap = 4 * pp * v;
        if m <= cap {
            return generate(m);
        }
        // the truncated length keeps m's remainder modulo pp, so divisibility rules (m a
        // multiple of the group size pp) accept and reject it alike (cap is a multiple of pp)
        let small = cap + m % pp;
        if small >= m {
            return generate(m);
        }
        let counts = generate(small)?;
        let holds_all = counts.iter().any(|&c| u64::from(c) == v * small);
        Some(if holds_all {
            counts
                .iter()
                .map(|&c| (u64::from(c) * m / small) as u32)
                .collect()
        } else {
            counts
        })
    }

    /// Peak in-flight per rank in closed form, for the kinds whose generator documents it
    /// (`None` for the others; `Some(None)` when the schedule rejects the inputs):
    /// GPipe `m`; 1F1B `min(p − r, m)`; looped BFS `v·m`; interleaved 1F1B `min(w + 1, v·m)`
    /// with `w = min(2·(p − r − 1) + (v − 1)·G, v·m)` warm-up forwards; and the split-backward
    /// ranks of ZB-H1, ZB-H2 and interleaved zero bubble, whose count (`F` to `W`) peaks at
    /// `min(w + d + 1, n)` for `w` warm-up forwards, a `W` delay of `d` and `n` steps (see
    /// [`split_backward_peak`]).
    fn closed_form_peak_inflight(self, pp: u64, v: u64, m: u64) -> Option<Option<Vec<u32>>> {
        let group = match check_spec(&spec(self, pp, v, m)) {
            Ok(g) => g.map(|g| g as u64),
            Err(_) => return Some(None),
        };
        let one_f_one_b = |r: u64| (pp - r).min(m);
        let per_rank: Box<dyn Fn(u64) -> u64> = match (self, group) {
            (ScheduleKind::Gpipe, _) => Box::new(|_| m),
            (ScheduleKind::OneFOneB, _) | (ScheduleKind::Interleaved1F1B, None) => {
                Box::new(one_f_one_b)
            }
            (ScheduleKind::LoopedBfs, _) => Box::new(|_| v * m),
            (ScheduleKind::Interleaved1F1B, Some(g)) => Box::new(move |r| {
                let warmup = (2 * (pp - r - 1) + (v - 1) * g).min(v * m);
                (warmup + 1).min(v * m)
            }),
            // the generators' warm-ups and delays (zero_bubble.rs, interleaved_zb.rs)
            (ScheduleKind::ZbH1, _) => Box::new(|r| split_backward_peak(m, pp - r - 1, r)),
            (ScheduleKind::ZbH2, _) => Box::new(|r| {
                let extra = m.saturating_sub(pp);
                let warmup = (pp - r - 1) + (pp - r - 1).min(extra);
                split_backward_peak(m, warmup, r + r.min(extra))
            }),
            (ScheduleKind::InterleavedZb, _) => {
                let g = rounds_group_size(pp as usize, m as usize).unwrap_or(pp as usize) as u64;
                Box::new(move |r| split_backward_peak(v * m, (v - 1) * g + pp - r - 1, r))
            }
            (ScheduleKind::ZbV | ScheduleKind::DualPipeV, _) => return None,
        };
        Some(Some((0..pp).map(|r| per_rank(r) as u32).collect()))
    }

    /// The stages per rank `v` worth running this kind with on `pp` ranks and `m`
    /// micro-batches, at most `max_v`, with interleaved 1F1B's group size left at its default
    /// `G = p`: the fixed count where the kind has one (1 for `gpipe`, `1f1b`, `zb-h1`,
    /// `zb-h2`; 2 for `zb-v` and `dualpipe-v`), otherwise `2..=max_v` (with one stage per rank
    /// they are `1f1b`); none where the kind rejects `pp` and `m` — the zero-bubble kinds and
    /// any interleaving need `pp ≥ 2`, `dualpipe-v` `m ≥ 2·pp`, `interleaved-1f1b` and
    /// `interleaved-1f1b` `m` a multiple of `pp` and `m ≥ pp`, `interleaved-zb` `m` a multiple
    /// of PyTorch's `max(1, ⌊m/pp⌋)` rounds.
    ///
    /// ```
    /// use autopp_schedule::ScheduleKind;
    ///
    /// assert_eq!(ScheduleKind::LoopedBfs.virtual_stage_options(4, 8, 3), [2, 3]);
    /// assert_eq!(ScheduleKind::InterleavedZb.virtual_stage_options(4, 6, 3), [2, 3]);
    /// assert_eq!(ScheduleKind::InterleavedZb.virtual_stage_options(4, 9, 3), Vec::<u64>::new());
    /// assert_eq!(ScheduleKind::ZbV.virtual_stage_options(4, 8, 3), [2]);
    /// ```
    pub fn virtual_stage_options(self, pp: u64, m: u64, max_v: u64) -> Vec<u64> {
        let several = |ok: bool| {
            if ok {
                (2..=max_v).collect()
            } else {
                Vec::new()
            }
        };
        let fixed = |v: u64, ok: bool| if ok { vec![v] } else { Vec::new() };
        match self {
            ScheduleKind::Gpipe | ScheduleKind::OneFOneB => vec![1],
            ScheduleKind::ZbH1 | ScheduleKind::ZbH2 => fixed(1, pp >= 2),
            ScheduleKind::ZbV => fixed(2, pp >= 2),
            ScheduleKind::DualPipeV => fixed(2, pp >= 2 && m >= 2 * pp),
            ScheduleKind::Interleaved1F1B => several(pp >= 2 && m.is_multiple_of(pp) && m >= pp),
            ScheduleKind::LoopedBfs => several(pp >= 2),
            ScheduleKind::InterleavedZb => {
                several(pp >= 2 && rounds_group_size(pp as usize, m as usize).is_some())
            }
        }
    }
}

/// A spec of `kind` with the default group size.
fn spec(kind: ScheduleKind, pp: u64, v: u64, m: u64) -> ScheduleSpec {
    ScheduleSpec::new(kind, pp as usize, m as usize).with_virtual_stages(v as usize)
}

/// Peak in-flight (`+1` at an `F`, `−1` at a `W`) of a rank that runs `warmup` forwards, then
/// for each of its `n` steps the next forward, an `I` and — from step `delay` on — the oldest
/// pending `W`. After step `j`'s forward it holds `min(w + j + 1, n) − max(0, j − d)`, which
/// grows until `j = d` and never grows after, so the peak is `min(w + d + 1, n)` (with
/// `w = min(warmup, n)`).
fn split_backward_peak(n: u64, warmup: u64, delay: u64) -> u64 {
    (warmup.min(n) + delay + 1).min(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncated_counts_equal_full_generation() {
        for kind in ScheduleKind::ALL {
            for pp in [1u64, 2, 3, 4, 5, 8] {
                for v in [1u64, 2, 3, 4] {
                    for m in 1..=60u64 {
                        let full = kind.generated_peak_inflight(pp, v, m);
                        assert_eq!(
                            kind.peak_inflight(pp, v, m),
                            full,
                            "{kind} pp {pp} v {v} m {m}"
                        );
                    }
                }
            }
        }
    }

    /// Every stage count a kind offers generates, with the default group size.
    #[test]
    fn virtual_stage_options_generate() {
        for kind in ScheduleKind::ALL {
            for pp in 1u64..=6 {
                for m in 1..=24u64 {
                    for v in kind.virtual_stage_options(pp, m, 4) {
                        assert!(
                            kind.generated_peak_inflight(pp, v, m).is_some(),
                            "{kind} pp {pp} v {v} m {m}"
                        );
                    }
                }
            }
        }
    }
}
