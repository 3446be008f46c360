//! The engine's general loop: every kind of step (overlapped pairs included), the timeline and
//! memory curves when asked for, and the errors (actions out of range, deadlocks).

use super::{finish_result, Engine, RankState, State};
use crate::ir::{Action, ActionKind, Schedule, Step};
use crate::simulator::{SimError, SimResult, TimedStep};

/// Per rank, the timeline and the memory curve (left empty unless recording).
struct Curves {
    timeline: Vec<Vec<TimedStep>>,
    memory: Vec<Vec<(f64, u64)>>,
}

impl Curves {
    fn new<const RECORD: bool>(s: &Schedule) -> Self {
        if !RECORD {
            return Curves {
                timeline: Vec::new(),
                memory: Vec::new(),
            };
        }
        Curves {
            timeline: s
                .ranks
                .iter()
                .map(|l| Vec::with_capacity(l.len()))
                .collect(),
            memory: s
                .ranks
                .iter()
                .map(|l| Vec::with_capacity(l.len()))
                .collect(),
        }
    }
}

/// Records the bytes alive after a change at `t`; changes at the same instant (a backward
/// ending as the next forward starts) collapse into one point.
#[inline]
fn push_memory(curve: &mut Vec<(f64, u64)>, t: f64, bytes: u64) {
    match curve.last_mut() {
        Some(last) if last.0 == t => last.1 = bytes,
        _ => curve.push((t, bytes)),
    }
}

impl Engine<'_> {
    /// The general loop. `done` must be all NaN and `wait_head` all `NONE`.
    pub(super) fn run_with<const RECORD: bool>(
        &self,
        done: &mut [f64],
        wait_head: &mut [u32],
    ) -> Result<SimResult, SimError> {
        let pp = self.s.pp;
        let mut st = State::new(done, wait_head, pp);
        let mut rs = RankState::new(pp);
        let mut curves = Curves::new::<RECORD>(self.s);
        while let Some(r) = st.ready.pop() {
            self.advance::<RECORD>(r as usize, &mut st, &mut rs, &mut curves)?;
        }
        if let Some(e) = self.deadlock(&rs.pos, &st) {
            return Err(e);
        }
        Ok(finish_result(
            rs.free_s,
            rs.busy_s,
            &rs.peak_inflight,
            rs.peak_bytes,
            curves.timeline,
            curves.memory,
        ))
    }

    /// Runs rank `r`'s steps in order until its list ends or a step waits for an input (then
    /// `r` parks on the first input not yet done).
    fn advance<const RECORD: bool>(
        &self,
        r: usize,
        st: &mut State<'_>,
        rs: &mut RankState,
        curves: &mut Curves,
    ) -> Result<(), SimError> {
        let list = &self.s.ranks[r];
        let (mut free, mut busy, mut idx) = (rs.free_s[r], rs.busy_s[r], rs.pos[r]);
        while let Some(&step) = list.get(idx) {
            if !self.in_range(step) {
                return Err(self.out_of_range(step, r, idx));
            }
            let ready = match self.step_ready(step, st.done) {
                Ok(t) => t,
                Err(slot) => {
                    st.park(r, slot);
                    break;
                }
            };
            let d = self.step_s(step);
            let start = ready.max(free);
            busy += d;
            let end = start + d;
            free = end;
            idx += 1;
            self.account::<RECORD>(step, r, (start, end), st, rs, &mut curves.memory);
            if RECORD {
                curves.timeline[r].push(TimedStep {
                    step,
                    start_s: start,
                    end_s: end,
                });
            }
        }
        (rs.free_s[r], rs.busy_s[r], rs.pos[r]) = (free, busy, idx);
        Ok(())
    }

    /// When `step` can start on its inputs (both parts' for a pair), or the slot of the first
    /// input not yet done.
    #[inline(always)]
    fn step_ready(&self, step: Step, done: &[f64]) -> Result<f64, usize> {
        match step {
            Step::One(a) => self.ready_s(a, done),
            Step::Overlapped(a, b) => match (self.ready_s(a, done), self.ready_s(b, done)) {
                (Ok(x), Ok(y)) => Ok(x.max(y)),
                (Err(slot), _) | (_, Err(slot)) => Err(slot),
            },
        }
    }

    /// How long `step` lasts: a pair `a + b − overlap·min(a, b)`.
    #[inline(always)]
    fn step_s(&self, step: Step) -> f64 {
        let dur = |a: Action| self.dur[a.stage as usize][a.kind.index()];
        match step {
            Step::One(a) => dur(a),
            Step::Overlapped(a, b) => {
                let (da, db) = (dur(a), dur(b));
                da + db - self.overlap * da.min(db)
            }
        }
    }

    /// Rank `r`'s in-flight count and bytes for `step`, which ran over `(start, end)`:
    /// increments at the start, decrements at the end; then the step's results are done at
    /// `end`, waking the ranks that wait for them.
    #[inline(always)]
    fn account<const RECORD: bool>(
        &self,
        step: Step,
        r: usize,
        (start, end): (f64, f64),
        st: &mut State<'_>,
        rs: &mut RankState,
        memory: &mut [Vec<(f64, u64)>],
    ) {
        let mut grew = false;
        for x in step.actions().filter(|x| x.kind == ActionKind::F) {
            rs.inflight[r] += 1;
            rs.alive[r] += self.bytes[x.stage as usize].0;
            grew = true;
        }
        if grew {
            rs.peak_inflight[r] = rs.peak_inflight[r].max(rs.inflight[r]);
            rs.peak_bytes[r] = rs.peak_bytes[r].max(rs.alive[r]);
            if RECORD {
                push_memory(&mut memory[r], start, rs.alive[r]);
            }
        }
        let mut shrank = false;
        for x in step.actions() {
            let (act, wgb) = self.bytes[x.stage as usize];
            match x.kind {
                ActionKind::F => {}
                ActionKind::B => {
                    rs.inflight[r] -= 1;
                    rs.alive[r] = rs.alive[r].saturating_sub(act);
                }
                ActionKind::I => {
                    rs.alive[r] = (rs.alive[r] + wgb).saturating_sub(act);
                    rs.peak_bytes[r] = rs.peak_bytes[r].max(rs.alive[r]);
                }
                ActionKind::W => {
                    rs.inflight[r] -= 1;
                    rs.alive[r] = rs.alive[r].saturating_sub(wgb);
                }
            }
            shrank |= x.kind != ActionKind::F;
            let base = self.slot(x.stage as usize, x.microbatch as usize);
            if let Some(slot) = Self::output_slot(base, x.kind) {
                st.finish(slot, end);
            }
        }
        if RECORD && shrank {
            push_memory(&mut memory[r], end, rs.alive[r]);
        }
    }

    /// Whether the actions of `step` name stages and micro-batches of the schedule.
    #[inline(always)]
    fn in_range(&self, step: Step) -> bool {
        let ok =
            |a: Action| (a.stage as usize) < self.num_stages && (a.microbatch as usize) < self.m;
        match step {
            Step::One(a) => ok(a),
            Step::Overlapped(a, b) => ok(a) && ok(b),
        }
    }

    /// The error for `step`, at position `idx` of rank `rank`'s list, which names a stage or a
    /// micro-batch outside the schedule.
    #[cold]
    fn out_of_range(&self, step: Step, rank: usize, idx: usize) -> SimError {
        let a = step.actions().find(|&a| !self.in_range(Step::One(a)));
        let reason = match a {
            Some(a) if a.stage as usize >= self.num_stages => {
                format!("stage {} is outside 0..{}", a.stage, self.num_stages)
            }
            Some(a) => format!("micro-batch {} is outside 0..{}", a.microbatch, self.m),
            None => "is out of range".to_string(),
        };
        SimError::InvalidAction {
            rank,
            step_index: idx,
            step: step.to_string(),
            reason,
        }
    }

    fn slot_text(&self, slot: usize) -> String {
        let (pair, backward) = (slot / 2, slot % 2 == 1);
        let (i, s) = (pair / self.num_stages, pair % self.num_stages);
        if backward {
            format!("{s}B{i} (or {s}I{i})")
        } else {
            format!("{s}F{i}")
        }
    }

    /// The deadlock when ranks stopped before the ends of their lists (`pos`), naming the
    /// lowest stuck rank and what each stuck rank waits for; `None` when every list ended.
    fn deadlock(&self, pos: &[usize], st: &State<'_>) -> Option<SimError> {
        let s = self.s;
        let stuck: Vec<usize> = (0..s.pp).filter(|&r| pos[r] < s.ranks[r].len()).collect();
        let &first = stuck.first()?;
        let describe = |r: usize| {
            (
                pos[r],
                s.ranks[r][pos[r]].to_string(),
                self.slot_text(st.parked_on[r]),
            )
        };
        let (step_index, step, waits_for) = describe(first);
        let others: Vec<String> = stuck[1..]
            .iter()
            .map(|&r| {
                let (i, text, w) = describe(r);
                format!("; rank {r} at step {i} ({text}) waits for {w}")
            })
            .collect();
        Some(SimError::Deadlock {
            rank: first,
            step_index,
            step,
            waits_for,
            others: others.concat(),
        })
    }
}
