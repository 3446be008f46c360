//! [`ExecReport`]: the result of a run, assembled from every rank's records — losses and
//! step times, the measured bubble and peak bytes per pipeline rank, and next to them what the
//! simulator predicts from the measured action times and the models' byte counts.

use autopp_profiler::device::{Layer, Tensor};
use autopp_profiler::median;

use crate::config::ExecConfig;
use crate::error::ExecError;
use crate::measure::{measure, Measured};
use crate::predict;
use crate::record::{summarize, RankStep, RankTrace, StepSummary};
use crate::stage::Stage;

/// The result of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecReport {
    /// Mean token loss per step.
    pub losses: Vec<f64>,
    /// Wall time per step, seconds.
    pub step_time_s: Vec<f64>,
    /// Median of the step times after the first (the first when there is one step), seconds.
    pub iteration_time_s: f64,
    /// Per pipeline rank, measured `1 − busy / makespan` of the pipeline phase, averaged over
    /// replicas and the steps after the first.
    pub bubble_fraction: Vec<f64>,
    /// Per pipeline rank, the simulator's bubble with the measured median action times.
    pub predicted_bubble_fraction: Vec<f64>,
    /// The simulator's iteration time with the measured median action and hop times, plus
    /// each rank's measured end-of-step work, seconds (see [`predict::from_measured`]).
    pub predicted_iteration_time_s: f64,
    /// The measured median times the prediction is made from.
    pub measured: Measured,
    /// Per pipeline rank, the most bytes kept for backward after any action of any step.
    pub peak_activation_bytes: Vec<u64>,
    /// Per pipeline rank, the simulator's peak from the models' fp32 byte counts.
    pub predicted_peak_activation_bytes: Vec<u64>,
    /// Per world rank, every action of every step.
    pub ranks: Vec<RankTrace>,
    /// Per world rank, its stages after the last step.
    pub final_stages: Vec<Vec<Stage>>,
}

impl ExecReport {
    /// The report of a run of `cfg` from every world rank's records (`ranks`, in world-rank
    /// order) and its stages after the last step.
    pub(crate) fn from_records(
        cfg: &ExecConfig,
        ranks: Vec<RankTrace>,
        final_stages: Vec<Vec<Stage>>,
    ) -> Result<ExecReport, ExecError> {
        let steps = cfg.steps;
        let by_step: Vec<Vec<Option<RankStep>>> = (0..steps)
            .map(|k| ranks.iter().map(|r| Some(r.steps[k].clone())).collect())
            .collect();
        let summaries: Vec<StepSummary> =
            (0..steps).map(|k| summarize(cfg, k, &by_step[k])).collect();
        let step_time_s: Vec<f64> = summaries.iter().map(|s| s.time_s).collect();
        // the steps after the first, or the first when there is one
        let measured: Vec<usize> = if steps > 1 {
            (1..steps).collect()
        } else {
            vec![0]
        };
        let iteration_time_s =
            median(&measured.iter().map(|&k| step_time_s[k]).collect::<Vec<_>>());
        let times = measure(cfg, &ranks, &measured);
        let prediction = predict::from_measured(cfg, &times)?;
        Ok(ExecReport {
            losses: summaries.iter().map(|s| s.loss).collect(),
            step_time_s,
            iteration_time_s,
            bubble_fraction: bubble_fraction(cfg, &ranks, &measured),
            predicted_bubble_fraction: prediction.bubble_fraction,
            predicted_iteration_time_s: prediction.iteration_time_s,
            measured: times,
            peak_activation_bytes: peak_activation_bytes(cfg, &ranks),
            predicted_peak_activation_bytes: predict::peak_activation_bytes(cfg)?,
            ranks,
            final_stages,
        })
    }

    /// The parameters of replica `replica` after the last step, as `("layer 3 qkv.weight",
    /// tensor)` in layer-list order: with tensor parallelism, each layer made whole again
    /// from its tensor-parallel ranks' slices ([`Layer::unshard`]).
    pub fn params_of_replica(&self, replica: usize) -> Vec<(String, Tensor)> {
        // per tensor-parallel rank, the replica's stages in layer order
        let mut by_tp: Vec<Vec<&Stage>> = Vec::new();
        for (r, stages) in self.ranks.iter().zip(&self.final_stages) {
            if r.replica == replica {
                if by_tp.len() <= r.tp_rank {
                    by_tp.resize(r.tp_rank + 1, Vec::new());
                }
                by_tp[r.tp_rank].extend(stages);
            }
        }
        by_tp
            .iter_mut()
            .for_each(|s| s.sort_by_key(|s| s.first_layer));
        let Some(first) = by_tp.first() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (k, stage) in first.iter().enumerate() {
            for (j, _) in stage.layers.iter().enumerate() {
                let parts: Vec<&Layer> = by_tp
                    .iter()
                    .filter_map(|s| s.get(k).and_then(|s| s.layers.get(j)))
                    .collect();
                let whole = Layer::unshard(&parts);
                let i = stage.first_layer + j;
                out.extend(
                    whole
                        .params()
                        .into_iter()
                        .map(|(n, t)| (format!("layer {i} {n}"), t.clone())),
                );
            }
        }
        out
    }
}

/// Per pipeline rank, `1 − busy / makespan` of each replica's pipeline phase, averaged over
/// replicas and the steps `measured`.
fn bubble_fraction(cfg: &ExecConfig, ranks: &[RankTrace], measured: &[usize]) -> Vec<f64> {
    let mut bubble = vec![0.0; cfg.pp()];
    for &k in measured {
        for d in 0..cfg.dp {
            let replica: Vec<&RankTrace> = ranks.iter().filter(|r| r.replica == d).collect();
            let start = replica
                .iter()
                .map(|r| r.steps[k].start_s)
                .fold(f64::INFINITY, f64::min);
            let end = replica
                .iter()
                .map(|r| r.steps[k].pipeline_end_s)
                .fold(0.0, f64::max);
            let makespan = (end - start).max(f64::MIN_POSITIVE);
            for r in &replica {
                bubble[r.pp_rank] += (1.0 - r.steps[k].busy_s() / makespan).max(0.0);
            }
        }
    }
    // every tensor-parallel rank of a pipeline rank adds its own
    let n = (measured.len() * cfg.dp * cfg.tp) as f64;
    bubble.iter_mut().for_each(|b| *b /= n);
    bubble
}

/// Per pipeline rank, the most bytes kept for backward after any action of any step.
fn peak_activation_bytes(cfg: &ExecConfig, ranks: &[RankTrace]) -> Vec<u64> {
    let mut peak = vec![0u64; cfg.pp()];
    for r in ranks {
        for s in &r.steps {
            peak[r.pp_rank] = peak[r.pp_rank].max(s.peak_activation_bytes);
        }
    }
    peak
}
