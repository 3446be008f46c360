//! Peak in-flight micro-batches per rank without generating a schedule of every length.
//!
//! Most kinds have a closed form (`closed_form`). For the others (ZB-V and DualPipe-V)
//! the counts *saturate*: the schedules hold at most about `2p + 1` micro-batches, a count that
//! stops growing once `m` exceeds it. So the counts at `m` follow from a schedule of about
//! `4·p·v` micro-batches (with `m`'s remainder modulo `p`): taken as they are when they
//! saturated, scaled by `m / m_small` when some rank held every one of its `v·m_small`
//! (stage, micro-batch) pairs. A test checks both against full generation, for every kind.

use crate::schedule::{self, ScheduleKind, ScheduleSpec};

/// Peak in-flight per rank in closed form, for the kinds whose generator documents it
/// (`None` for the others, and when the schedule rejects the inputs):
/// GPipe `m`; 1F1B `min(p − r, m)`; looped BFS `v·m`; interleaved 1F1B `min(w + 1, v·m)` with
/// `w = min(2·(p − r − 1) + (v − 1)·G, v·m)` warm-up forwards; and the split-backward ranks of
/// ZB-H1, ZB-H2 and interleaved zero bubble, whose count (`F` to `W`) peaks at
/// `min(w + d + 1, n)` for `w` warm-up forwards, a `W` delay of `d` and `n` steps (see
/// [`split_backward_peak`]).
fn closed_form(kind: ScheduleKind, pp: u64, v: u64, m: u64) -> Option<Option<Vec<u32>>> {
    let spec = ScheduleSpec {
        kind,
        pp: pp as usize,
        virtual_stages: v as usize,
        num_microbatches: m as usize,
        group_size: None,
    };
    let group = match schedule::check_spec(&spec) {
        Ok(g) => g.map(|g| g as u64),
        Err(_) => return Some(None),
    };
    let one_f_one_b = |r: u64| (pp - r).min(m);
    let per_rank: Box<dyn Fn(u64) -> u64> = match (kind, group) {
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
            Box::new(|r| split_backward_peak(v * m, (v - 1) * pp + pp - r - 1, r))
        }
        #[allow(unreachable_patterns)]
        _ => return None,
    };
    Some(Some((0..pp).map(|r| per_rank(r) as u32).collect()))
}

/// Peak in-flight (`+1` at an `F`, `−1` at a `W`) of a rank that runs `warmup` forwards, then
/// for each of its `n` steps the next forward, an `I` and — from step `delay` on — the oldest
/// pending `W`. After step `j`'s forward it holds `min(w + j + 1, n) − max(0, j − d)`, which
/// grows until `j = d` and never grows after, so the peak is `min(w + d + 1, n)` (with
/// `w = min(warmup, n)`).
fn split_backward_peak(n: u64, warmup: u64, delay: u64) -> u64 {
    (warmup.min(n) + delay + 1).min(n)
}

/// Peak in-flight (stage, micro-batch) activations per rank of `kind` with `pp` ranks, `v`
/// stages per rank and `m` micro-batches (`group_size` of interleaved schedules: `pp`); `None`
/// when the schedule does not accept these inputs.
pub fn peak_inflight(kind: ScheduleKind, pp: u64, v: u64, m: u64) -> Option<Vec<u32>> {
    peak_inflight_with(kind, pp, v, m, &|m| generated(kind, pp, v, m))
}

/// The per-rank peak in-flight counts of a generated schedule of `m` micro-batches.
pub fn generated(kind: ScheduleKind, pp: u64, v: u64, m: u64) -> Option<Vec<u32>> {
    schedule::generate(&ScheduleSpec {
        kind,
        pp: pp as usize,
        virtual_stages: v as usize,
        num_microbatches: m as usize,
        group_size: None,
    })
    .ok()
    .map(|s| s.peak_inflight())
}

/// [`peak_inflight`] with the counts of generated schedules from `generate(m)` (a caller
/// that asks for many `m` can cache them: the truncated lengths repeat).
pub fn peak_inflight_with(
    kind: ScheduleKind,
    pp: u64,
    v: u64,
    m: u64,
    generate: &dyn Fn(u64) -> Option<Vec<u32>>,
) -> Option<Vec<u32>> {
    if let Some(known) = closed_form(kind, pp, v, m) {
        return known;
    }
    let cap = 4 * pp * v;
    if m <= cap {
        return generate(m);
    }
    // the truncated length keeps m's remainder modulo pp, so divisibility rules (m a multiple
    // of the group size pp) accept and reject it alike (cap is a multiple of pp)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncated_counts_equal_full_generation() {
        for kind in ScheduleKind::ALL {
            for pp in [1u64, 2, 3, 4, 5, 8] {
                for v in [1u64, 2, 3, 4] {
                    for m in 1..=60u64 {
                        let full = generated(kind, pp, v, m);
                        assert_eq!(
                            peak_inflight(kind, pp, v, m),
                            full,
                            "{kind} pp {pp} v {v} m {m}"
                        );
                    }
                }
            }
        }
    }
}
