//! What ranks record as they run: every action's times, the bytes kept for backward, each
//! step's loss and ends ([`RankStep`], per rank [`RankTrace`]), and the per-step summary
//! ([`StepSummary`]) reported while the run goes on.

use autopp_schedule::Action;
use serde::Serialize;

use crate::config::ExecConfig;

/// One finished step, reported while the run goes on.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepSummary {
    /// Step number, 1-based.
    pub step: usize,
    /// Mean token loss over the global batch.
    pub loss: f64,
    /// Wall time of the step (first rank leaving the start barrier to the last rank's optimizer
    /// step), seconds.
    pub time_s: f64,
}

/// Everything one rank did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankTrace {
    /// World rank.
    pub rank: usize,
    /// Data-parallel replica.
    pub replica: usize,
    /// Pipeline rank.
    pub pp_rank: usize,
    /// Tensor-parallel rank.
    pub tp_rank: usize,
    /// Every step.
    pub steps: Vec<RankStep>,
}

/// One action as it ran on a rank. Times are seconds since the start of the run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ActionEvent {
    /// The action.
    #[serde(serialize_with = "as_text")]
    pub action: Action,
    /// When its inputs had arrived and compute began.
    pub start_s: f64,
    /// When its compute and sends were done.
    pub end_s: f64,
    /// How long it waited for its inputs before `start_s`.
    pub wait_s: f64,
    /// Seconds of `start_s..end_s` spent in tensor-parallel collectives (0 without tp).
    pub tp_comm_s: f64,
}

fn as_text<S: serde::Serializer>(a: &Action, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(a)
}

/// One step on one rank.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankStep {
    /// Summed token loss of the micro-batches this rank's head saw (0 without the head, and on
    /// tensor-parallel ranks other than 0, whose loss is the same).
    pub loss_sum: f64,
    /// Every action, in order.
    pub events: Vec<ActionEvent>,
    /// `(time, bytes kept for backward)` after each action.
    pub memory: Vec<(f64, u64)>,
    /// Largest bytes kept for backward after any action.
    pub peak_activation_bytes: u64,
    /// When the rank left the start-of-step barrier.
    pub start_s: f64,
    /// When it finished its list.
    pub pipeline_end_s: f64,
    /// When it finished the all-reduce and the optimizer step.
    pub end_s: f64,
}

impl RankStep {
    /// Seconds spent computing actions.
    pub fn busy_s(&self) -> f64 {
        self.events.iter().map(|e| e.end_s - e.start_s).sum()
    }
}

/// Loss and wall time of step `step` from every rank's report.
pub(crate) fn summarize(
    cfg: &ExecConfig,
    step: usize,
    reports: &[Option<RankStep>],
) -> StepSummary {
    let tokens = (cfg.global_batch_size() * cfg.seq_len()) as f64;
    let all: Vec<&RankStep> = reports.iter().flatten().collect();
    // in world-rank order, so replicas add up in a fixed order
    let loss = all.iter().map(|r| r.loss_sum).sum::<f64>() / tokens;
    let start = all.iter().map(|r| r.start_s).fold(f64::INFINITY, f64::min);
    let end = all.iter().map(|r| r.end_s).fold(0.0, f64::max);
    StepSummary {
        step: step + 1,
        loss,
        time_s: end - start,
    }
}
