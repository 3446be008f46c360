//! The event simulator: runs each rank's list strictly in order and times every step.
//!
//! A step starts at `max(rank free, end of each dependency + p2p time when the dependency's
//! stage sits on another rank)`. Dependencies:
//!
//! ```text
//! F(s,i)      ← F(s−1,i)
//! B/I(s,i)    ← F(s,i), B-or-I(s+1,i)
//! W(s,i)      ← I(s,i)
//! ```
//!
//! Sends are buffered (a send never waits for its receive), so a rank only ever waits for its
//! own next step's inputs. An overlapped pair waits for the inputs of both its parts and lasts
//! `a + b − overlap·min(a, b)` (the sum of its parts when no overlap factor is given).
//!
//! The run is one pass over the actions (O(total actions)): a rank that cannot start its next
//! step parks on the one missing input and is woken when that input finishes.

use serde::Serialize;

use super::ir::{Action, ActionKind, Schedule, Step};

/// Costs of one stage, used by the simulator. Times in seconds (or any one unit), bytes in
/// bytes (or any one unit).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
pub struct StageCosts {
    /// Duration of a forward `F`.
    pub forward_s: f64,
    /// Duration of a full backward `B`.
    pub backward_s: f64,
    /// Duration of a backward-input `I`.
    pub backward_input_s: f64,
    /// Duration of a backward-weight `W`.
    pub backward_weight_s: f64,
    /// Activation bytes one micro-batch keeps on this stage from its `F` to its `B` (or `I`).
    pub activation_bytes: u64,
    /// Bytes still held from `I` to `W` when the backward is split (what `W` needs).
    pub weight_grad_bytes: u64,
}

/// Everything the simulator needs to time a schedule.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct SimCosts {
    /// Per global stage (length `pp · v`).
    pub stages: Vec<StageCosts>,
    /// Time to send between stage `k` and `k+1`, either direction (length `pp · v − 1`);
    /// charged only when the two stages sit on different ranks.
    pub p2p_s: Vec<f64>,
    /// How much of the shorter part of an overlapped pair is hidden, in `[0, 1]`: the pair
    /// lasts `a + b − overlap·min(a, b)`. `None` is `0`: the pair lasts the sum of its parts.
    pub overlap_factor: Option<f64>,
}

impl SimCosts {
    /// The same costs on every stage: `f`, `b`, `i`, `w` per action and `comm` per hop between
    /// ranks; one unit of activation per (stage, micro-batch) (`activation_bytes = 1`,
    /// `weight_grad_bytes = 1`), so bytes count activations.
    pub fn uniform(num_stages: usize, f: f64, b: f64, i: f64, w: f64, comm: f64) -> Self {
        SimCosts {
            stages: vec![
                StageCosts {
                    forward_s: f,
                    backward_s: b,
                    backward_input_s: i,
                    backward_weight_s: w,
                    activation_bytes: 1,
                    weight_grad_bytes: 1,
                };
                num_stages
            ],
            p2p_s: vec![comm; num_stages.saturating_sub(1)],
            overlap_factor: None,
        }
    }

    /// Duration of `action` on its stage (the stage index must be in range).
    fn duration_s(&self, a: Action) -> f64 {
        let c = &self.stages[a.stage as usize];
        match a.kind {
            ActionKind::F => c.forward_s,
            ActionKind::B => c.backward_s,
            ActionKind::I => c.backward_input_s,
            ActionKind::W => c.backward_weight_s,
        }
    }
}

/// One step with its simulated start and end.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TimedStep {
    /// The step.
    pub step: Step,
    /// When it starts.
    pub start_s: f64,
    /// When it ends.
    pub end_s: f64,
}

/// The headline numbers of a simulation, without the per-step timeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimMetrics {
    /// End of the last step (the run starts at 0).
    pub makespan_s: f64,
    /// Per rank, the time spent running steps.
    pub busy_s: Vec<f64>,
    /// Total idle time over `pp × makespan`.
    pub bubble_fraction: f64,
    /// Per rank, peak in-flight (stage, micro-batch) activations, counted along its list
    /// (see [`Schedule::peak_inflight`]).
    pub peak_inflight: Vec<u32>,
    /// Per rank, peak activation bytes alive (from the stage costs).
    pub peak_activation_bytes: Vec<u64>,
}

/// The full result of a simulation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimResult {
    /// End of the last step (the run starts at 0).
    pub makespan_s: f64,
    /// Per rank, the time spent running steps.
    pub busy_s: Vec<f64>,
    /// Total idle time over `pp × makespan`.
    pub bubble_fraction: f64,
    /// Per rank, peak in-flight (stage, micro-batch) activations, counted along its list: +1 at
    /// each `F`, −1 at each `B` (at the `W` for a split backward).
    pub peak_inflight: Vec<u32>,
    /// Per rank, peak activation bytes alive: a stage's `activation_bytes` from the start of its
    /// `F` to the end of its `B`, or to the end of its `I`, after which `weight_grad_bytes` stay
    /// until the end of its `W`.
    pub peak_activation_bytes: Vec<u64>,
    /// Per rank, every step with its start and end.
    pub timeline: Vec<Vec<TimedStep>>,
    /// Per rank, `(time, activation bytes alive)` after each change.
    pub memory: Vec<Vec<(f64, u64)>>,
}

impl SimResult {
    /// The headline numbers alone.
    pub fn metrics(&self) -> SimMetrics {
        SimMetrics {
            makespan_s: self.makespan_s,
            busy_s: self.busy_s.clone(),
            bubble_fraction: self.bubble_fraction,
            peak_inflight: self.peak_inflight.clone(),
            peak_activation_bytes: self.peak_activation_bytes.clone(),
        }
    }
}

/// Why a schedule could not be simulated.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SimError {
    /// A cost vector has the wrong length.
    #[error("the costs give {got} entries for {what}, but the schedule needs {expected}")]
    CostsLength {
        /// Which vector (`stages`, `p2p_s`).
        what: &'static str,
        /// Its required length.
        expected: usize,
        /// Its length.
        got: usize,
    },
    /// A cost is negative, infinite or NaN, or the overlap factor is outside `[0, 1]`.
    #[error("invalid cost: {0}")]
    InvalidCost(String),
    /// The schedule's shape is unusable (`ranks.len() != pp`, zero sizes).
    #[error("invalid schedule: {0}")]
    InvalidSchedule(String),
    /// An action names a stage or micro-batch outside the schedule.
    #[error("rank {rank}, step {step_index} ({step}): {reason}")]
    InvalidAction {
        /// The rank.
        rank: usize,
        /// Position in the rank's list.
        step_index: usize,
        /// The step, as text.
        step: String,
        /// What is wrong.
        reason: String,
    },
    /// Some ranks wait forever.
    #[error(
        "the schedule deadlocks: rank {rank} is stuck at step {step_index} ({step}) waiting for \
         {waits_for}{others}"
    )]
    Deadlock {
        /// The lowest stuck rank.
        rank: usize,
        /// The position of its stuck step.
        step_index: usize,
        /// The stuck step, as text.
        step: String,
        /// The input it waits for, as text.
        waits_for: String,
        /// The other stuck ranks, as text (empty if none).
        others: String,
    },
}

const NONE: u32 = u32::MAX;

/// Simulates `s` under `costs`: per-step times, busy time, bubble, in-flight and memory.
///
/// ```
/// use autopp_planner::schedule::{generate, simulate, ScheduleKind, ScheduleSpec, SimCosts};
///
/// let s = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 4, 8)).unwrap();
/// let r = simulate(&s, &SimCosts::uniform(4, 1.0, 2.0, 1.0, 1.0, 0.0)).unwrap();
/// assert_eq!(r.makespan_s, 33.0); // (m + p − 1)·(f + b)
/// assert!((r.bubble_fraction - 3.0 / 11.0).abs() < 1e-12); // (p − 1)/(m + p − 1)
/// assert_eq!(r.peak_inflight, [4, 3, 2, 1]);
/// ```
pub fn simulate(s: &Schedule, costs: &SimCosts) -> Result<SimResult, SimError> {
    Engine::new(s, costs)?.run::<true>()
}

/// Like [`simulate`], without recording the timeline and memory curves (for search loops).
pub fn simulate_metrics(s: &Schedule, costs: &SimCosts) -> Result<SimMetrics, SimError> {
    Engine::new(s, costs)?.run::<false>().map(|r| r.metrics())
}

struct Engine<'a> {
    s: &'a Schedule,
    costs: &'a SimCosts,
    m: usize,
    num_stages: usize,
    stage_rank: Vec<u32>,
    /// End time of F(s,i) at `s·m + i`, and of B-or-I(s,i) at `S·m + s·m + i`; NaN until done.
    done: Vec<f64>,
    /// Per input slot, the first rank parked on it.
    wait_head: Vec<u32>,
    /// Per rank, the next rank parked on the same slot.
    wait_next: Vec<u32>,
}

/// An input a step needs: the slot that records its end, plus the hop time.
#[derive(Clone, Copy)]
struct Input {
    slot: usize,
    comm_s: f64,
}

impl<'a> Engine<'a> {
    fn new(s: &'a Schedule, costs: &'a SimCosts) -> Result<Self, SimError> {
        let num_stages = s.num_stages();
        if s.pp == 0 || s.virtual_stages == 0 {
            return Err(SimError::InvalidSchedule(
                "pp and virtual_stages must be at least 1".into(),
            ));
        }
        if s.ranks.len() != s.pp {
            return Err(SimError::InvalidSchedule(format!(
                "it has {} rank lists but pp = {}",
                s.ranks.len(),
                s.pp
            )));
        }
        if costs.stages.len() != num_stages {
            return Err(SimError::CostsLength {
                what: "stages",
                expected: num_stages,
                got: costs.stages.len(),
            });
        }
        if costs.p2p_s.len() != num_stages - 1 {
            return Err(SimError::CostsLength {
                what: "p2p_s",
                expected: num_stages - 1,
                got: costs.p2p_s.len(),
            });
        }
        let bad = |x: f64| !x.is_finite() || x < 0.0;
        for (k, c) in costs.stages.iter().enumerate() {
            let times = [
                c.forward_s,
                c.backward_s,
                c.backward_input_s,
                c.backward_weight_s,
            ];
            if times.into_iter().any(bad) {
                return Err(SimError::InvalidCost(format!(
                    "stage {k} has a negative or non-finite time ({c:?})"
                )));
            }
        }
        if let Some(k) = costs.p2p_s.iter().position(|&x| bad(x)) {
            return Err(SimError::InvalidCost(format!(
                "p2p time between stages {k} and {} is {}",
                k + 1,
                costs.p2p_s[k]
            )));
        }
        if let Some(o) = costs.overlap_factor {
            if !(0.0..=1.0).contains(&o) {
                return Err(SimError::InvalidCost(format!(
                    "overlap factor {o} is outside [0, 1]"
                )));
            }
        }
        let m = s.num_microbatches;
        let stage_rank = (0..num_stages).map(|k| s.rank_of(k) as u32).collect();
        Ok(Engine {
            s,
            costs,
            m,
            num_stages,
            stage_rank,
            done: vec![f64::NAN; 2 * num_stages * m],
            wait_head: vec![NONE; 2 * num_stages * m],
            wait_next: vec![NONE; s.pp],
        })
    }

    fn f_slot(&self, stage: usize, mb: usize) -> usize {
        stage * self.m + mb
    }

    fn bi_slot(&self, stage: usize, mb: usize) -> usize {
        (self.num_stages + stage) * self.m + mb
    }

    /// The inputs of `a` run on `rank` (at most two).
    fn inputs(&self, a: Action, rank: usize) -> [Option<Input>; 2] {
        let (s, i) = (a.stage as usize, a.microbatch as usize);
        let hop = |other: usize, link: usize| {
            if self.stage_rank[other] as usize != rank {
                self.costs.p2p_s[link]
            } else {
                0.0
            }
        };
        match a.kind {
            ActionKind::F if s == 0 => [None, None],
            ActionKind::F => [
                Some(Input {
                    slot: self.f_slot(s - 1, i),
                    comm_s: hop(s - 1, s - 1),
                }),
                None,
            ],
            ActionKind::B | ActionKind::I => [
                Some(Input {
                    slot: self.f_slot(s, i),
                    comm_s: 0.0,
                }),
                (s + 1 < self.num_stages).then(|| Input {
                    slot: self.bi_slot(s + 1, i),
                    comm_s: hop(s + 1, s),
                }),
            ],
            ActionKind::W => [
                Some(Input {
                    slot: self.bi_slot(s, i),
                    comm_s: 0.0,
                }),
                None,
            ],
        }
    }

    /// When `a` could start given its inputs, or the slot it still waits for.
    fn ready_s(&self, a: Action, rank: usize) -> Result<f64, usize> {
        let mut t = 0.0f64;
        for inp in self.inputs(a, rank).into_iter().flatten() {
            let end = self.done[inp.slot];
            if end.is_nan() {
                return Err(inp.slot);
            }
            t = t.max(end + inp.comm_s);
        }
        Ok(t)
    }

    fn check_action(
        &self,
        a: Action,
        rank: usize,
        idx: usize,
        step: &Step,
    ) -> Result<(), SimError> {
        let reason = if a.stage as usize >= self.num_stages {
            format!("stage {} is outside 0..{}", a.stage, self.num_stages)
        } else if a.microbatch as usize >= self.m {
            format!("micro-batch {} is outside 0..{}", a.microbatch, self.m)
        } else {
            return Ok(());
        };
        Err(SimError::InvalidAction {
            rank,
            step_index: idx,
            step: step.to_string(),
            reason,
        })
    }

    /// Marks `a` finished at `end` and wakes the ranks parked on it.
    fn finish(&mut self, a: Action, end: f64, ready: &mut Vec<u32>) {
        let (s, i) = (a.stage as usize, a.microbatch as usize);
        let slot = match a.kind {
            ActionKind::F => self.f_slot(s, i),
            ActionKind::B | ActionKind::I => self.bi_slot(s, i),
            ActionKind::W => return,
        };
        self.done[slot] = end;
        let mut r = std::mem::replace(&mut self.wait_head[slot], NONE);
        while r != NONE {
            ready.push(r);
            r = std::mem::replace(&mut self.wait_next[r as usize], NONE);
        }
    }

    fn slot_text(&self, slot: usize) -> String {
        let sm = self.num_stages * self.m;
        let (backward, rest) = (slot >= sm, slot % sm);
        let (s, i) = (rest / self.m, rest % self.m);
        if backward {
            format!("{s}B{i} (or {s}I{i})")
        } else {
            format!("{s}F{i}")
        }
    }

    fn run<const RECORD: bool>(mut self) -> Result<SimResult, SimError> {
        let s = self.s;
        let pp = s.pp;
        let mut pos = vec![0usize; pp];
        let mut free_s = vec![0.0f64; pp];
        let mut busy_s = vec![0.0f64; pp];
        let mut inflight = vec![0i64; pp];
        let mut peak_inflight = vec![0i64; pp];
        let mut alive = vec![0u64; pp];
        let mut peak_bytes = vec![0u64; pp];
        let mut timeline: Vec<Vec<TimedStep>> = Vec::new();
        let mut memory: Vec<Vec<(f64, u64)>> = Vec::new();
        if RECORD {
            timeline = s
                .ranks
                .iter()
                .map(|l| Vec::with_capacity(l.len()))
                .collect();
            memory = s
                .ranks
                .iter()
                .map(|l| Vec::with_capacity(l.len() + 1))
                .collect();
        }
        let overlap = self.costs.overlap_factor.unwrap_or(0.0);
        let mut ready: Vec<u32> = (0..pp as u32).rev().collect();
        // Parked waiting for a slot (used to find the waited-for slot on deadlock).
        let mut parked_on = vec![NONE as usize; pp];

        while let Some(r) = ready.pop() {
            let r = r as usize;
            let list = &s.ranks[r];
            while pos[r] < list.len() {
                let idx = pos[r];
                let step = list[idx];
                let (a, b) = match step {
                    Step::One(a) => (a, None),
                    Step::Overlapped(a, b) => (a, Some(b)),
                };
                self.check_action(a, r, idx, &step)?;
                let mut start = match self.ready_s(a, r) {
                    Ok(t) => t,
                    Err(slot) => {
                        self.park(r, slot, &mut parked_on);
                        break;
                    }
                };
                let mut dur = self.costs.duration_s(a);
                if let Some(b) = b {
                    self.check_action(b, r, idx, &step)?;
                    match self.ready_s(b, r) {
                        Ok(t) => start = start.max(t),
                        Err(slot) => {
                            self.park(r, slot, &mut parked_on);
                            break;
                        }
                    }
                    let db = self.costs.duration_s(b);
                    dur = dur + db - overlap * dur.min(db);
                }
                let start = start.max(free_s[r]);
                let end = start + dur;
                free_s[r] = end;
                busy_s[r] += dur;
                pos[r] += 1;

                // In-flight and bytes: increments at the start, decrements at the end.
                for x in step.actions() {
                    if x.kind == ActionKind::F {
                        inflight[r] += 1;
                        alive[r] += self.costs.stages[x.stage as usize].activation_bytes;
                    }
                }
                peak_inflight[r] = peak_inflight[r].max(inflight[r]);
                peak_bytes[r] = peak_bytes[r].max(alive[r]);
                let has_f = a.kind == ActionKind::F || b.is_some_and(|b| b.kind == ActionKind::F);
                if RECORD && has_f {
                    memory[r].push((start, alive[r]));
                }
                let mut freed = false;
                for x in step.actions() {
                    let c = &self.costs.stages[x.stage as usize];
                    match x.kind {
                        ActionKind::F => {}
                        ActionKind::B => {
                            inflight[r] -= 1;
                            alive[r] = alive[r].saturating_sub(c.activation_bytes);
                            freed = true;
                        }
                        ActionKind::I => {
                            alive[r] =
                                (alive[r] + c.weight_grad_bytes).saturating_sub(c.activation_bytes);
                            freed = true;
                        }
                        ActionKind::W => {
                            inflight[r] -= 1;
                            alive[r] = alive[r].saturating_sub(c.weight_grad_bytes);
                            freed = true;
                        }
                    }
                }
                peak_bytes[r] = peak_bytes[r].max(alive[r]);
                if RECORD {
                    if freed {
                        memory[r].push((end, alive[r]));
                    }
                    timeline[r].push(TimedStep {
                        step,
                        start_s: start,
                        end_s: end,
                    });
                }
                self.finish(a, end, &mut ready);
                if let Some(b) = b {
                    self.finish(b, end, &mut ready);
                }
            }
        }

        let stuck: Vec<usize> = (0..pp).filter(|&r| pos[r] < s.ranks[r].len()).collect();
        if let Some(&first) = stuck.first() {
            let describe = |r: usize| {
                (
                    pos[r],
                    s.ranks[r][pos[r]].to_string(),
                    self.slot_text(parked_on[r]),
                )
            };
            let (step_index, step, waits_for) = describe(first);
            let others: Vec<String> = stuck[1..]
                .iter()
                .map(|&r| {
                    let (i, st, w) = describe(r);
                    format!("rank {r} at step {i} ({st}) waits for {w}")
                })
                .collect();
            return Err(SimError::Deadlock {
                rank: first,
                step_index,
                step,
                waits_for,
                others: if others.is_empty() {
                    String::new()
                } else {
                    format!("; {}", others.join("; "))
                },
            });
        }

        let makespan_s = free_s.iter().copied().fold(0.0, f64::max);
        let total_busy: f64 = busy_s.iter().sum();
        let bubble_fraction = if makespan_s > 0.0 {
            ((pp as f64 * makespan_s - total_busy) / (pp as f64 * makespan_s)).max(0.0)
        } else {
            0.0
        };
        Ok(SimResult {
            makespan_s,
            busy_s,
            bubble_fraction,
            peak_inflight: peak_inflight.iter().map(|&x| x.max(0) as u32).collect(),
            peak_activation_bytes: peak_bytes,
            timeline,
            memory,
        })
    }

    fn park(&mut self, r: usize, slot: usize, parked_on: &mut [usize]) {
        self.wait_next[r] = self.wait_head[slot];
        self.wait_head[slot] = r as u32;
        parked_on[r] = slot;
    }
}
