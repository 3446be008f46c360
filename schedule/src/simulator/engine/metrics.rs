//! The engine's loop for metrics only (no timeline or memory curve), the planner's inner loop.
//!
//! Each rank's list is first compiled into fixed-size records — the action's kind, stage and
//! end-time slot, checked in range once — so the loop neither re-checks nor re-derives them,
//! and each kind's in-flight and byte accounting is one direct branch. It does exactly the
//! general loop's arithmetic, in the same order, so the answers are the same bits (a test
//! compares the two on every generator). Overlapped pairs, out-of-range actions and
//! deadlocks are left to the general loop, which reports them.

use super::{finish_result, Engine, RankState, State};
use crate::ir::{ActionKind, Step};
use crate::simulator::SimResult;

/// One compiled action: its `F` end-time slot (the `B`-or-`I` slot is one higher), stage and
/// kind.
#[derive(Clone, Copy)]
struct Op {
    base: u32,
    stage: u32,
    kind: ActionKind,
}

impl Engine<'_> {
    /// Each rank's list compiled; `None` when a step is an overlapped pair, an action is out of
    /// range, or the slots do not fit 32 bits.
    fn compile(&self) -> Option<Vec<Vec<Op>>> {
        if 2 * self.num_stages * self.m > u32::MAX as usize {
            return None;
        }
        let mut ranks = Vec::with_capacity(self.s.ranks.len());
        for list in &self.s.ranks {
            let mut ops = Vec::with_capacity(list.len());
            for step in list {
                match *step {
                    Step::One(a)
                        if (a.stage as usize) < self.num_stages
                            && (a.microbatch as usize) < self.m =>
                    {
                        ops.push(Op {
                            base: self.slot(a.stage as usize, a.microbatch as usize) as u32,
                            stage: a.stage,
                            kind: a.kind,
                        })
                    }
                    _ => return None,
                }
            }
            ranks.push(ops);
        }
        Some(ranks)
    }

    /// The run without a timeline, or `None` for what the general loop must handle (see the
    /// [module docs](self)); `done` and `wait_head` may then be left dirty.
    pub(super) fn run_metrics(&self, done: &mut [f64], wait_head: &mut [u32]) -> Option<SimResult> {
        let ops = self.compile()?;
        let pp = self.s.pp;
        let mut st = State::new(done, wait_head, pp);
        let mut rs = RankState::new(pp);

        while let Some(r) = st.ready.pop() {
            let r = r as usize;
            let list = &ops[r];
            // the rank's state in locals while it runs
            let (mut free, mut busy, mut idx) = (rs.free_s[r], rs.busy_s[r], rs.pos[r]);
            let (mut held, mut held_peak) = (rs.inflight[r], rs.peak_inflight[r]);
            let (mut bytes, mut bytes_peak) = (rs.alive[r], rs.peak_bytes[r]);
            while let Some(&op) = list.get(idx) {
                let (stage, base) = (op.stage as usize, op.base as usize);
                let ready = match self.ready_at(op.kind, stage, base, st.done) {
                    Ok(t) => t,
                    Err(slot) => {
                        st.park(r, slot);
                        break;
                    }
                };
                let d = self.dur[stage][op.kind.index()];
                let start = ready.max(free);
                busy += d;
                let end = start + d;
                free = end;
                idx += 1;
                let (act, wgb) = self.bytes[stage];
                match op.kind {
                    ActionKind::F => {
                        held += 1;
                        bytes += act;
                        held_peak = held_peak.max(held);
                        bytes_peak = bytes_peak.max(bytes);
                    }
                    ActionKind::B => {
                        held -= 1;
                        bytes = bytes.saturating_sub(act);
                    }
                    ActionKind::I => {
                        bytes = (bytes + wgb).saturating_sub(act);
                        bytes_peak = bytes_peak.max(bytes);
                    }
                    ActionKind::W => {
                        held -= 1;
                        bytes = bytes.saturating_sub(wgb);
                    }
                }
                if let Some(slot) = Self::output_slot(base, op.kind) {
                    st.finish(slot, end);
                }
            }
            (rs.pos[r], rs.free_s[r], rs.busy_s[r]) = (idx, free, busy);
            (rs.inflight[r], rs.peak_inflight[r]) = (held, held_peak);
            (rs.alive[r], rs.peak_bytes[r]) = (bytes, bytes_peak);
        }
        if (0..pp).any(|r| rs.pos[r] < ops[r].len()) {
            return None;
        }
        Some(finish_result(
            rs.free_s,
            rs.busy_s,
            &rs.peak_inflight,
            rs.peak_bytes,
            Vec::new(),
            Vec::new(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use crate::ir::ScheduleKind;
    use crate::{generate, simulate, simulate_metrics, ScheduleSpec, SimCosts};

    /// The compiled loop gives the general loop's answers, bit for bit, on every generator
    /// (with uneven costs and sends, so that every input and every byte count matters).
    #[test]
    fn the_compiled_loop_matches_the_general_loop() {
        for kind in ScheduleKind::ALL {
            for (p, v, m) in [(2, 2, 4), (3, 2, 6), (4, 2, 8), (4, 3, 12), (1, 2, 3)] {
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
