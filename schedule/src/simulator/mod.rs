//! The event simulator: runs each rank's list strictly in order and times every step.
//!
//! A step starts at `max(rank free, end of each input + p2p time when the input's stage sits
//! on another rank)`, its inputs as [`deps`](crate::deps) gives them (`F(s,i) ← F(s−1,i)`;
//! `B/I(s,i) ← F(s,i), B-or-I(s+1,i)`; `W(s,i) ← I(s,i)`).
//!
//! Sends are buffered (a send never waits for its receive), so a rank only ever waits for its
//! own next step's inputs. An overlapped pair waits for the inputs of both its parts and lasts
//! `a + b − overlap·min(a, b)` (the sum of its parts when no overlap factor is given).
//!
//! The run is one pass over the actions (O(total actions)): a rank that cannot start its next
//! step parks on the one missing input and is woken when that input finishes.

use serde::Serialize;

mod engine;
mod uniform;

pub use uniform::{CostsError, UniformCosts};

use super::ir::{Schedule, Step};
use engine::Engine;

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
    /// Per rank, `(time, activation bytes alive)` after each change (changes at the same
    /// instant give one point).
    pub memory: Vec<Vec<(f64, u64)>>,
}

impl SimResult {
    /// The shortest positive step duration in the timeline, in cost units; `None` when no step
    /// takes time.
    pub fn shortest_step_s(&self) -> Option<f64> {
        let d = self
            .timeline
            .iter()
            .flatten()
            .map(|t| t.end_s - t.start_s)
            .filter(|&d| d > 0.0)
            .fold(f64::INFINITY, f64::min);
        d.is_finite().then_some(d)
    }

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

/// Simulates `s` under `costs`: per-step times, busy time, bubble, in-flight and memory.
///
/// ```
/// use autopp_schedule::{generate, simulate, ScheduleKind, ScheduleSpec, SimCosts};
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
    let r = Engine::new(s, costs)?.run::<false>()?;
    Ok(SimMetrics {
        makespan_s: r.makespan_s,
        busy_s: r.busy_s,
        bubble_fraction: r.bubble_fraction,
        peak_inflight: r.peak_inflight,
        peak_activation_bytes: r.peak_activation_bytes,
    })
}
