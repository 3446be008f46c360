//! What one pipeline rank has for its layers: the per-sharding figures every key reads
//! ([`Extremes`]) and the bytes left for model states and activations once the reserve, the
//! CUDA context, communication buffers and the backward's working set are taken off
//! ([`rank_budget_bytes`]).

use autopp_hardware::AnalyticProfile;

use super::split_dp::{self, LayerSums, StageBudget};
use super::{Key, SearchOptions};
use crate::memory::{self, NCCL_BUFFER_BYTES_PER_GROUP};
use crate::stages::StageCost;

/// What every key of a layer sharding reads of one recompute mode's per-layer costs,
/// computed once per table ([`super::table::LayerTable::extremes`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Extremes {
    /// [`Extremes::transient_bytes`] with one pipeline rank, and with several.
    transient: [(f64, f64); 2],
    /// Tied parameters of all layers.
    pub tied_params: u64,
    /// The largest layer output sent to the next stage, bytes.
    pub max_output_bytes: u64,
    /// The most parameters of any one layer.
    pub max_layer_params: u64,
    /// Whether no layer holds routed experts.
    pub no_experts: bool,
}

impl Extremes {
    /// The figures of `costs`.
    pub(super) fn of(costs: &[StageCost]) -> Self {
        Extremes {
            transient: [transient_bytes(costs, 1), transient_bytes(costs, 2)],
            tied_params: costs.iter().map(|c| c.tied_params).sum(),
            max_output_bytes: costs.iter().map(|c| c.output_bytes).max().unwrap_or(0),
            max_layer_params: costs.iter().map(|c| c.max_layer_params).max().unwrap_or(0),
            no_experts: costs.iter().all(|c| c.expert_params == 0),
        }
    }

    /// The backward's working set every rank of `pp` holds, and the head's excess over it on
    /// the rank that holds the head, bytes (see [`transient_bytes`]).
    pub(super) fn transient_bytes(&self, pp: usize) -> (f64, f64) {
        self.transient[usize::from(pp > 1)]
    }
}

/// The backward's working set every rank of `pp` holds, and the head's excess over it on the
/// rank that holds the head, bytes. [`memory::rank_memory`] counts the largest of a rank's
/// stages; the head's can be far larger than a block's (PyTorch's unfused cross-entropy keeps
/// 8 B per logit, [`crate::stages::unfused_loss_bytes`]), so charging it to every rank would
/// make the budgets reject splits that fit (12 B per logit under DTensor's loss parallelism,
/// [`crate::stages::TorchLoss`]). With one rank, the largest of all layers.
fn transient_bytes(costs: &[StageCost], pp: usize) -> (f64, f64) {
    let largest = |cs: &[StageCost]| cs.iter().map(|c| c.transient_bytes).max().unwrap_or(0) as f64;
    let n = costs.len();
    if pp <= 1 || n < 3 {
        return (largest(costs), 0.0);
    }
    // the body's blocks (the embedding's working set is not larger than a block's)
    let body = largest(&costs[1..n - 1]);
    (body, (costs[n - 1].transient_bytes as f64 - body).max(0.0))
}

/// Bytes one rank has for its layers' model states and activations: the GPU's memory less the
/// reserve, the CUDA context, communication buffers and the backward's working set. `None`
/// when nothing is left. The memory margin is not taken off: these budgets are conservative
/// (in-flight bounds, whole-layer working sets), and the exact evaluation of every candidate
/// checks the margin.
pub(super) fn rank_budget_bytes(
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    key: &Key,
    ext: &Extremes,
) -> Option<f64> {
    let capacity = profile.cluster.gpu.memory_bytes as f64;
    let groups = key.degrees.num_comm_groups() as f64;
    let (transient, _) = ext.transient_bytes(key.degrees.pp as usize);
    let p2p = 4.0 * ext.max_output_bytes as f64;
    let stack = memory::StackMemory::of(opts.settings.runtime.stack);
    let mut zero3_gather = 0.0;
    if stack.pipelined_fsdp(key.zero_stage, key.degrees.pp) {
        // `memory::rank_memory`'s unsharded stage: the whole stage's states are the
        // per-parameter bytes'; the 16-bit gradient of the rank's largest layer beside them is
        // left to the exact check (the model's largest layer, the embedding or the head, is on
        // some ranks only, and taking it off every rank's budget would prune plans that fit)
    } else if key.zero_stage >= 3 {
        let largest = ext.max_layer_params;
        // `memory::rank_memory` keeps ranks holding routed experts out of FSDP's count: with
        // any, the smaller gather below keeps the budget an upper bound for every rank
        let fsdp = stack.fsdp && ext.no_experts;
        zero3_gather = if fsdp {
            // `memory::rank_memory`'s FSDP layers in flight: two gathered, one gradient
            (2 * largest * memory::WEIGHT_BYTES_PER_PARAM
                + largest * (memory::HALF_GRAD_BYTES_PER_PARAM + memory::GRAD_BYTES_PER_PARAM))
                as f64
        } else {
            (2 * largest).min(memory::ZERO3_MAX_LIVE_PARAMS) as f64
                * memory::WEIGHT_BYTES_PER_PARAM as f64
        };
    }
    // The fixed terms of `memory::rank_memory` (its fragmentation and the safety margin a plan
    // must leave, `estimate`'s `fits`, are the caller's).
    let budget = capacity
        - opts.settings.memory_reserve_bytes as f64
        - stack.context_bytes() as f64
        - groups * NCCL_BUFFER_BYTES_PER_GROUP as f64
        - transient
        - p2p
        - zero3_gather;
    (budget > 0.0).then_some(budget)
}

/// How a stage's budget counts the allocator's fragmentation and the safety margin, for `pp`
/// ranks of `v` stages each: the factor on in-flight activation bytes, and the bytes taken off
/// the rank's budget. With one stage per rank a stage's budget is its rank's, exactly: the
/// fragmentation of the dynamic memory (activations, the backward's working set) is counted as
/// evaluation counts it, and the margin is left free. With several, each stage gets an equal
/// share of the rank's budget (or a share by need when no split fits equal ones,
/// [`need_weighted`]) and both are left out as slack.
pub(super) fn stage_slack(opts: &SearchOptions, ext: &Extremes, pp: usize, v: usize) -> (f64, f64) {
    if v != 1 {
        return (1.0, 0.0);
    }
    let (transient, _) = ext.transient_bytes(pp);
    (
        1.0 + memory::FRAGMENTATION,
        transient * memory::FRAGMENTATION + opts.settings.memory_margin_bytes as f64,
    )
}

/// Each stage's share of its rank's budget `rank_budget` (bytes), in units of `per_param`
/// (a parameter's model-state bytes): an equal share of the rank's several stages
/// ([`stage_slack`]), or, when no split fits equal shares, a share by need
/// ([`need_weighted`]). Conservative either way: every candidate's memory is checked exactly
/// when simulated. `inflight[r]`: micro-batches in flight on rank `r` at its peak.
#[allow(clippy::too_many_arguments)]
pub(super) fn stage_budgets(
    opts: &SearchOptions,
    key: &Key,
    ext: &Extremes,
    kinds: &[autopp_models::LayerKind],
    sums: &LayerSums,
    rank_budget: f64,
    inflight: &[u32],
    per_param: f64,
) -> Vec<StageBudget> {
    let (pp, v) = (key.degrees.pp as usize, key.degrees.virtual_stages as usize);
    let placement = key.schedule.placement();
    let rank_of = |k: usize| placement.rank_of(k, pp);
    let (_, head_extra) = ext.transient_bytes(pp);
    let (dynamic, transient_frag) = stage_slack(opts, ext, pp, v);
    let equal: Vec<StageBudget> = (0..pp * v)
        .map(|k| StageBudget {
            bytes: (rank_budget - transient_frag) / v as f64 / per_param,
            inflight: inflight[rank_of(k)] as f64 * dynamic / v as f64 / per_param,
            extra_if_last_bytes: if pp > 1 {
                ext.tied_params as f64 + head_extra * dynamic / per_param
            } else {
                0.0
            },
        })
        .collect();
    if v == 1 || split_dp::any_split_fits(sums, &equal) {
        return equal;
    }
    crate::schedule::split::default_split(kinds, pp * v)
        .ok()
        .and_then(|even| need_weighted(&equal, sums, &even, rank_of))
        .unwrap_or(equal)
}

/// Stage budgets for ranks of several stages, shared by need rather than equally: each rank's
/// total (the sum of its stages' `budgets`) is split among its stages in proportion to what
/// each needs under the even split `even` (layer entries per stage), so that a rank holding the
/// head beside a block stage gives the head's stage the room its logits take. Sound as the
/// equal shares are: a split that fits every share fits its rank's total. `None` when the even
/// split needs nothing on some rank (no weights) or `even` does not match the budgets.
fn need_weighted(
    budgets: &[StageBudget],
    sums: &LayerSums,
    even: &[usize],
    rank_of: impl Fn(usize) -> usize,
) -> Option<Vec<StageBudget>> {
    let ranges = crate::schedule::split::stage_ranges(even);
    if ranges.len() != budgets.len() {
        return None;
    }
    let need: Vec<f64> = ranges
        .iter()
        .zip(budgets)
        .map(|(&[first, last], b)| split_dp::stage_need(sums, b, first, last))
        .collect();
    let ranks = (0..budgets.len()).map(&rank_of).max()? + 1;
    let (mut total, mut needed) = (vec![0.0; ranks], vec![0.0; ranks]);
    for (k, b) in budgets.iter().enumerate() {
        total[rank_of(k)] += b.bytes;
        needed[rank_of(k)] += need[k];
    }
    if needed.iter().any(|&n| n <= 0.0) {
        return None;
    }
    Some(
        budgets
            .iter()
            .enumerate()
            .map(|(k, b)| StageBudget {
                bytes: total[rank_of(k)] * need[k] / needed[rank_of(k)],
                ..*b
            })
            .collect(),
    )
}
