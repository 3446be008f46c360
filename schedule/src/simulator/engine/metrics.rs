//! The engine's loop for metrics only (no timeline or memory curve), the planner's inner loop.
//!
//! One pass over the actions, as the general loop makes it, with what the general loop looks
//! up per action gathered per stage into one record (the four durations, the hops from both
//! neighbours, the bytes), a rank's state in one record, and each kind's inputs, in-flight and
//! byte accounting in one direct branch. It does exactly the general loop's arithmetic on the
//! same values in the same order, so the answers are the same bits (a test compares the two
//! on every generator). Overlapped pairs, out-of-range actions and deadlocks are left to the
//! general loop, which reports them.

use super::{finish_result, Engine, NONE};
use crate::ir::{ActionKind, Step};
use crate::simulator::SimResult;

/// What the loop reads of one stage.
#[derive(Clone, Copy)]
struct StageRow {
    /// Durations of `F`, `B`, `I`, `W`.
    dur: [f64; 4],
    /// The hop from the previous stage (0 on the same rank).
    prev_s: f64,
    /// The hop from the next stage (0 on the same rank).
    next_s: f64,
    /// Activation bytes.
    act: u64,
    /// Weight-gradient bytes.
    wgb: u64,
}

/// One rank's cursor, end (free) time, busy time, in-flight pairs and bytes with their peaks.
#[derive(Clone, Copy, Default)]
struct Rank {
    pos: usize,
    free: f64,
    busy: f64,
    held: i64,
    held_peak: i64,
    bytes: u64,
    bytes_peak: u64,
}

/// The later of two times. Every time here is a sum of non-negative, non-NaN durations and
/// hops starting from +0.0, so never NaN nor −0.0: on them this is [`f64::max`], bit for bit,
/// without its NaN handling.
#[inline(always)]
fn later(a: f64, b: f64) -> f64 {
    if b > a {
        b
    } else {
        a
    }
}

impl Engine<'_> {
    /// The run without a timeline, or `None` for what the general loop must handle (see the
    /// [module docs](self)); `done` and `wait_head` may then be left dirty.
    pub(super) fn run_metrics(&self, done: &mut [f64], wait_head: &mut [u32]) -> Option<SimResult> {
        let (pp, ns, m) = (self.s.pp, self.num_stages, self.m);
        let rows: Vec<StageRow> = (0..ns)
            .map(|k| StageRow {
                dur: self.dur[k],
                prev_s: self.comm_prev[k],
                next_s: self.comm_next[k],
                act: self.bytes[k].0,
                wgb: self.bytes[k].1,
            })
            .collect();
        let mut ranks = vec![Rank::default(); pp];
        let mut wait_next = vec![NONE; pp];
        let mut ready: Vec<u32> = (0..pp as u32).rev().collect();
        while let Some(r) = ready.pop() {
            let r = r as usize;
            let list = &self.s.ranks[r];
            let mut k = ranks[r];
            while let Some(&step) = list.get(k.pos) {
                let Step::One(a) = step else { return None };
                let (s, i) = (a.stage as usize, a.microbatch as usize);
                if s >= ns || i >= m {
                    return None;
                }
                let row = &rows[s];
                // the action's F slot; its B-or-I slot is one higher
                let base = 2 * (i * ns + s);
                // when its inputs are done (see `deps`), or the slot it waits for; and the
                // slot its end fills (none for a W)
                let (at, out) = match a.kind {
                    ActionKind::F if s == 0 => (Ok(0.0), base),
                    ActionKind::F => {
                        let t = done[base - 2];
                        let at = if t.is_nan() {
                            Err(base - 2)
                        } else {
                            Ok(t + row.prev_s)
                        };
                        (at, base)
                    }
                    ActionKind::B | ActionKind::I => {
                        let own = done[base];
                        let at = if own.is_nan() {
                            Err(base)
                        } else if s + 1 < ns {
                            let next = done[base + 3];
                            match next.is_nan() {
                                true => Err(base + 3),
                                false => Ok(later(own, next + row.next_s)),
                            }
                        } else {
                            Ok(own)
                        };
                        (at, base + 1)
                    }
                    ActionKind::W => {
                        let t = done[base + 1];
                        let at = if t.is_nan() { Err(base + 1) } else { Ok(t) };
                        (at, NONE as usize)
                    }
                };
                let at = match at {
                    Ok(t) => t,
                    Err(slot) => {
                        wait_next[r] = wait_head[slot];
                        wait_head[slot] = r as u32;
                        break;
                    }
                };
                let d = row.dur[a.kind.index()];
                k.busy += d;
                k.free = later(at, k.free) + d;
                k.pos += 1;
                match a.kind {
                    ActionKind::F => {
                        k.held += 1;
                        k.bytes += row.act;
                        k.held_peak = k.held_peak.max(k.held);
                        k.bytes_peak = k.bytes_peak.max(k.bytes);
                    }
                    ActionKind::B => {
                        k.held -= 1;
                        k.bytes = k.bytes.saturating_sub(row.act);
                    }
                    ActionKind::I => {
                        k.bytes = (k.bytes + row.wgb).saturating_sub(row.act);
                        k.bytes_peak = k.bytes_peak.max(k.bytes);
                    }
                    ActionKind::W => {
                        k.held -= 1;
                        k.bytes = k.bytes.saturating_sub(row.wgb);
                        continue;
                    }
                }
                done[out] = k.free;
                let mut w = wait_head[out];
                if w != NONE {
                    wait_head[out] = NONE;
                    while w != NONE {
                        ready.push(w);
                        w = std::mem::replace(&mut wait_next[w as usize], NONE);
                    }
                }
            }
            ranks[r] = k;
        }
        if (0..pp).any(|r| ranks[r].pos < self.s.ranks[r].len()) {
            return None;
        }
        let peak_inflight: Vec<i64> = ranks.iter().map(|k| k.held_peak).collect();
        Some(finish_result(
            ranks.iter().map(|k| k.free).collect(),
            ranks.iter().map(|k| k.busy).collect(),
            &peak_inflight,
            ranks.iter().map(|k| k.bytes_peak).collect(),
            Vec::new(),
            Vec::new(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use crate::ir::ScheduleKind;
    use crate::{generate, simulate, simulate_metrics, ScheduleSpec, SimCosts};

    /// The metrics loop gives the general loop's answers, bit for bit, on every generator
    /// (with uneven costs and sends, so that every input and every byte count matters).
    #[test]
    fn the_metrics_loop_matches_the_general_loop() {
        for kind in ScheduleKind::ALL {
            let shapes = [
                (2, 2, 4),
                (3, 2, 6),
                (4, 2, 8),
                (4, 3, 12),
                (1, 2, 3),
                (4, 4, 37),
            ];
            for (p, v, m) in shapes {
                let spec = ScheduleSpec::new(kind, p, m).with_virtual_stages(v);
                let Ok(s) = generate(&spec) else {
                    let spec = ScheduleSpec::new(kind, p, m);
                    let Ok(s) = generate(&spec) else { continue };
                    check(&s);
                    continue;
                };
                check(&s);
            }
        }
    }

    fn check(s: &crate::Schedule) {
        let n = s.num_stages();
        let mut costs = SimCosts::uniform(n, 1.0, 2.0, 1.1, 0.9, 0.05);
        for (k, c) in costs.stages.iter_mut().enumerate() {
            c.forward_s *= 1.0 + 0.13 * k as f64;
            c.backward_s *= 1.0 + 0.07 * k as f64;
            c.activation_bytes = 100 + 7 * k as u64;
            c.weight_grad_bytes = 30 + 3 * k as u64;
        }
        for (k, t) in costs.p2p_s.iter_mut().enumerate() {
            *t = 0.01 * (k + 1) as f64;
        }
        let general = simulate(s, &costs).expect("simulates");
        let fast = simulate_metrics(s, &costs).expect("simulates");
        let what = format!(
            "{} p {} v {} m {}",
            s.kind, s.pp, s.virtual_stages, s.num_microbatches
        );
        assert_eq!(
            general.makespan_s.to_bits(),
            fast.makespan_s.to_bits(),
            "{what}"
        );
        assert_eq!(general.busy_s, fast.busy_s, "{what}");
        assert_eq!(
            general.bubble_fraction.to_bits(),
            fast.bubble_fraction.to_bits(),
            "{what}"
        );
        assert_eq!(general.peak_inflight, fast.peak_inflight, "{what}");
        assert_eq!(
            general.peak_activation_bytes, fast.peak_activation_bytes,
            "{what}"
        );
    }
}
