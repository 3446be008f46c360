//! The `Plan` (what to run) and `Predicted` (what it will do) types, serialised exactly as
//! `autopp estimate --json` prints them and as plan files store them.

use std::fmt;

use autopp_models::Recompute;
use serde::{Deserialize, Serialize};

use crate::config::PlanError;
use crate::degrees::Degrees;
use crate::schedule::ScheduleKind;

/// Version of the plan JSON format; bumped on any incompatible change.
pub const FORMAT_VERSION: u32 = 1;

/// One pipeline rank of a plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankPlan {
    /// Pipeline rank, 0..pp−1.
    pub rank: u64,
    /// Inclusive `[first_layer, last_layer]` of each stage the rank holds, in stage order
    /// (indices into the layer list: 0 is the embedding).
    pub stages: Vec<[usize; 2]>,
    /// Recompute of the rank's transformer layers: `none`, `selective` or `full` when all are
    /// alike; `partial` when `recompute_num_layers` of them are fully recomputed and the others
    /// use the plan's `recompute`.
    pub recompute: RankRecompute,
    /// Transformer layers on the rank that are fully recomputed.
    pub recompute_num_layers: u64,
    /// Of those, how many in each of the rank's stages (in the order of `stages`; the first
    /// layers of each stage).
    #[serde(default)]
    pub recompute_num_layers_per_stage: Vec<u64>,
    /// Peak memory per GPU of the rank, bytes.
    pub memory_bytes: u64,
    /// Busy time per iteration of one GPU of the rank (compute and tensor-parallel
    /// communication), seconds.
    pub compute_time_s: f64,
}

/// What to run: degrees, batching, schedule, recompute, sharding and the layer split.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// [`FORMAT_VERSION`].
    pub format_version: u32,
    /// Model name.
    pub model: String,
    /// GPUs used.
    pub gpus: u64,
    /// GPU kind.
    pub gpu: String,
    /// GPUs per node.
    pub gpus_per_node: u64,
    /// Tensor, pipeline, data and context parallelism and stages per rank (flattened in JSON:
    /// `tp`, `pp`, `dp`, `cp`, `virtual_stages`).
    #[serde(flatten)]
    pub degrees: Degrees,
    /// Sequences per micro-batch.
    pub micro_batch_size: u64,
    /// Micro-batches per iteration per data-parallel replica.
    pub num_microbatches: u64,
    /// Sequences per iteration.
    pub global_batch_size: u64,
    /// Schedule (its name in JSON: `1f1b`, `zb-v`, …).
    pub schedule: ScheduleKind,
    /// Recompute mode of the transformer layers that partial recompute leaves alone (see the
    /// ranks' `recompute`).
    pub recompute: Recompute,
    /// Megatron sequence parallelism.
    pub sequence_parallel: bool,
    /// ZeRO stage.
    pub zero_stage: u8,
    /// Expert-parallel degree (mixtures of experts only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ep: Option<u64>,
    /// Expert-tensor-parallel degree (mixtures of experts only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etp: Option<u64>,
    /// The routing load the plan was predicted under: the busiest expert rank's tokens over the
    /// balanced share (`--moe-imbalance`; mixtures of experts only; absent: 1.0, balanced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_imbalance: Option<f64>,
    /// The split in Megatron-LM's `--pipeline-model-parallel-layout` grammar (`Et*3|t*4|…|t*3L`);
    /// null for layer-list models.
    pub megatron_layout: Option<String>,
    /// The ranks, 0..pp−1.
    pub ranks: Vec<RankPlan>,
}

impl Plan {
    /// Every stage's layer range with its fully recomputed transformer layers, in global
    /// stage order (the ranks list their stages in their own order).
    pub fn stages_in_order(&self) -> Vec<([usize; 2], u64)> {
        let mut stages: Vec<([usize; 2], u64)> = self
            .ranks
            .iter()
            .flat_map(|r| {
                r.stages.iter().enumerate().map(|(i, &range)| {
                    let n = r.recompute_num_layers_per_stage.get(i).copied();
                    (range, n.unwrap_or(0))
                })
            })
            .collect();
        stages.sort_unstable();
        stages
    }

    /// Partial recompute's fully recomputed layers per stage, in global stage order; `None`
    /// when every layer uses the plan's `recompute`.
    pub fn recompute_layers(&self) -> Option<Vec<u64>> {
        let stages = self.stages_in_order();
        let partial = self.recompute != Recompute::Full && stages.iter().any(|s| s.1 > 0);
        partial.then(|| stages.iter().map(|s| s.1).collect())
    }

    /// Layer-list entries per stage, in global stage order; an error when the ranks' stages do
    /// not tile the layers in order.
    pub fn split(&self) -> Result<Vec<usize>, PlanError> {
        let ranges = self.stages_in_order();
        let mut next = 0;
        let mut split = Vec::with_capacity(ranges.len());
        for ([first, last], _) in ranges {
            if first != next || last < first || last == usize::MAX {
                return Err(PlanError::invalid(
                    "--plan",
                    format!("the ranks' stages do not tile the layers in order (a stage starts at layer {first}, expected {next})"),
                ));
            }
            split.push(last - first + 1);
            next = last + 1;
        }
        Ok(split)
    }

    /// Whether some rank recomputes only some of its transformer layers fully.
    pub fn has_partial_recompute(&self) -> bool {
        self.ranks
            .iter()
            .any(|r| r.recompute == RankRecompute::Partial)
    }

    /// The rank with the largest memory per GPU (the last of equals).
    pub fn peak_rank(&self) -> u64 {
        self.ranks
            .iter()
            .max_by_key(|r| r.memory_bytes)
            .map_or(0, |r| r.rank)
    }
}

/// How one rank recomputes its transformer layers; serialised as `none`, `selective`, `full`
/// or `partial`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RankRecompute {
    /// Every layer keeps every activation.
    None,
    /// Every layer recomputes its attention core.
    Selective,
    /// Every layer is fully recomputed.
    Full,
    /// Some layers are fully recomputed (`recompute_num_layers`), the others use the plan's
    /// `recompute`.
    Partial,
}

impl RankRecompute {
    /// The name used in JSON and text.
    pub fn as_str(self) -> &'static str {
        match self {
            RankRecompute::None => "none",
            RankRecompute::Selective => "selective",
            RankRecompute::Full => "full",
            RankRecompute::Partial => "partial",
        }
    }
}

impl From<Recompute> for RankRecompute {
    fn from(mode: Recompute) -> Self {
        match mode {
            Recompute::None => RankRecompute::None,
            Recompute::Selective => RankRecompute::Selective,
            Recompute::Full => RankRecompute::Full,
        }
    }
}

impl fmt::Display for RankRecompute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where the iteration time goes, seconds; the parts add up to the iteration time.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Breakdown {
    /// Compute (including recomputation) of the busiest rank.
    pub compute: f64,
    /// Pipeline idle time of the busiest rank not caused by sends.
    pub bubble: f64,
    /// Tensor- and context-parallel communication of the busiest rank.
    pub tp_comm: f64,
    /// Expert-parallel all-to-alls (dispatch and combine) of the busiest rank; absent (0) for
    /// dense models and `ep` 1.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ep_comm: f64,
    /// Expert-parallel all-to-all time of the busiest rank hidden behind another micro-batch's
    /// compute (Megatron-Core's `--overlap-moe-expert-parallel-comm`): not part of the
    /// iteration, so not in the sum; absent (0) without the overlap.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ep_comm_hidden: f64,
    /// Pipeline sends on the critical path.
    pub pp_comm: f64,
    /// Exposed data-parallel gradient (and ZeRO parameter) communication.
    pub dp_comm: f64,
    /// Optimizer step.
    pub optimizer: f64,
}

/// What a plan is predicted to do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Predicted {
    /// Seconds per iteration.
    pub iteration_time_s: f64,
    /// Tokens per second over the whole cluster.
    pub tokens_per_s: f64,
    /// Model FLOP/s per GPU (no recomputation counted), in TFLOP/s.
    pub tflops_per_gpu: f64,
    /// Model FLOPs utilisation: a fraction of the dense peak for the precision.
    pub mfu: f64,
    /// Pipeline idle time / (pp × pipeline makespan): every rank's idle, averaged. It is the
    /// busiest rank's idle (the bubble of the breakdown) plus [`Predicted::stage_imbalance`].
    pub bubble_fraction: f64,
    /// (busiest rank's busy time − the mean rank's) / pipeline makespan: what the lighter ranks
    /// idle beyond the busiest one because their stages hold less work.
    #[serde(default)]
    pub stage_imbalance: f64,
    /// Largest memory per GPU over ranks, bytes.
    pub peak_memory_bytes: u64,
    /// Memory per GPU, bytes.
    pub memory_capacity_bytes: u64,
    /// Every rank fits in memory.
    pub fits: bool,
    /// Where the time goes.
    pub breakdown_s: Breakdown,
}

/// `{"plan", "predicted"}`: what `estimate --json` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanAndPrediction {
    /// The plan.
    pub plan: Plan,
    /// Its prediction.
    pub predicted: Predicted,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}
