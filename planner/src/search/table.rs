//! Per-layer costs under every recompute mode, one table per layer sharding (tp, cp,
//! micro-batch size, sequence parallelism): what every phase of the search reads instead of
//! expanding the model again.

use std::sync::{Arc, OnceLock};

use rustc_hash::FxHashMap as HashMap;

use autopp_hardware::{AnalyticProfile, LayerTimes};
use autopp_models::{LayerCost, LayerKind, Model, Recompute};
use rayon::prelude::*;

use super::budget::Extremes;
use super::memo::Memo;
use super::score::WeightParams;
use super::split_dp::{self, LayerSums};
use super::{config_of, partial, Key, SearchOptions};
use crate::config::PlanError;
use crate::estimate::{cp_kv_bytes, shard_spec, LayerList};
use crate::stages::{self, StageContext, StageCost};

/// The layer sharding of a key: (tp, cp, micro-batch size, sequence parallelism, ep, etp).
pub(crate) type GroupKey = (u64, u64, u64, bool, u64, u64);

/// The layer sharding of a key.
pub(crate) fn group_of(k: &Key) -> GroupKey {
    (
        k.degrees.tp,
        k.degrees.cp,
        k.micro_batch_size,
        k.sequence_parallel,
        k.ep,
        k.etp,
    )
}

/// One [`LayerTable`] per layer sharding of `keys`; shardings the model cannot take (e.g. kv
/// heads vs tp) have none, and their keys no candidates.
#[cfg(test)]
pub(super) fn layer_tables<'k>(
    model: &Model,
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    keys: impl IntoIterator<Item = &'k Key>,
) -> Result<HashMap<GroupKey, LayerTable>, PlanError> {
    let mut firsts = Firsts::default();
    for k in keys {
        firsts.offer(k);
    }
    tables_of(model, profile, opts, firsts.into_keys())
}

/// Each sharding's first key, found in one pass over keys in enumeration order (not one pass
/// over the keys per sharding). Keys come in runs of one sharding, alternating between two
/// (without and with sequence parallelism), so only a sharding other than the last two is
/// looked up.
#[derive(Default)]
pub(super) struct Firsts {
    firsts: HashMap<GroupKey, Key>,
    recent: [Option<GroupKey>; 2],
}

impl Firsts {
    /// Notes `k`, the next key in enumeration order.
    #[inline]
    pub(super) fn offer(&mut self, k: &Key) {
        let g = group_of(k);
        let seen = |r: &Option<GroupKey>| r.is_some_and(|r| r == g);
        if !seen(&self.recent[0]) && !seen(&self.recent[1]) {
            self.firsts.entry(g).or_insert(*k);
            self.recent = [Some(g), self.recent[0]];
        }
    }

    /// Each sharding's first key, in no particular order.
    pub(super) fn into_keys(self) -> Vec<Key> {
        self.firsts.into_values().collect()
    }
}

/// [`layer_tables`] from each sharding's first key (`firsts`: one key per sharding).
pub(super) fn tables_of(
    model: &Model,
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    firsts: Vec<Key>,
) -> Result<HashMap<GroupKey, LayerTable>, PlanError> {
    let mut group_keys: Vec<(GroupKey, Key)> =
        firsts.into_iter().map(|k| (group_of(&k), k)).collect();
    group_keys.sort_unstable_by_key(|&(g, _)| g);
    group_keys
        .par_iter()
        .filter_map(|(g, key)| {
            match layer_table(model, profile, opts, key) {
                Ok(t) => Some(Ok((*g, t))),
                // a sharding the model cannot take (e.g. kv heads vs tp): no candidates there
                Err(PlanError::Model(_)) => None,
                Err(e) => Some(Err(e)),
            }
        })
        .collect()
}

/// Per-layer costs for one layer sharding, under each recompute mode. What ranks the keys of
/// the sharding (their lower bounds, their weights) is computed up front; the per-layer
/// table only when a key of the sharding is first scored or evaluated, which many never are.
pub(crate) struct LayerTable {
    /// Per recompute mode: seconds of all layers for one micro-batch, F+B, F alone and the
    /// weight-gradient part W of B alone.
    pub(super) total_s: Vec<(f64, f64, f64)>,
    /// Parameters of all layers, and the routed experts' among them.
    weights: WeightParams,
    /// The distinct layers the table expands.
    distinct: Distinct,
    /// The kinds of the layer list, listed on first use.
    kinds: OnceLock<Vec<LayerKind>>,
    /// The per-layer table, expanded from `distinct` on first use.
    expanded: OnceLock<Expanded>,
    /// Per (recompute mode, stages): the smallest bottleneck of any split with memory
    /// unlimited, computed on first use.
    free_bottleneck: Memo<(usize, usize), Option<f64>>,
    /// [`LayerTable::sums_for`] with the routed experts weighed, per (recompute mode, split
    /// backward, weight's bits), computed on first use.
    weighted_sums: Memo<(usize, bool, u64), Arc<LayerSums>>,
}

/// A layer list as its distinct layers ([`Model::distinct_layers`]), each timed and costed
/// once.
struct Distinct {
    /// Each distinct layer, its operation lists dropped (see [`layer_table`]).
    layers: Vec<LayerCost>,
    /// Per layer of the list, its distinct layer.
    slot: Vec<usize>,
    /// Each distinct layer's compute times.
    timed: Vec<LayerTimes>,
    /// Per recompute mode (index as in `Recompute::ALL`): each distinct layer's stage cost.
    per_mode: Vec<Vec<StageCost>>,
}

/// The per-layer table of one sharding.
struct Expanded {
    /// The layers under this sharding.
    layers: Vec<LayerCost>,
    /// Per recompute mode (index as in `Recompute::ALL`): per-layer stage costs.
    per_mode: Vec<Vec<StageCost>>,
    /// Per recompute mode: what fully recomputing one layer changes from that mode (`None` for
    /// full recompute, and for layer lists that are not embedding, alike layers, head).
    partial: Vec<Option<partial::PartialModel>>,
    /// Per recompute mode: prefix sums of per-layer F+B seconds, parameters (the fixed part,
    /// in parameters: [`super::score`] scales the budgets by the bytes per parameter instead)
    /// and activation bytes per in-flight micro-batch.
    sums: Vec<Arc<LayerSums>>,
    /// `sums` for schedules that split the backward: per in-flight pair the larger of the
    /// activation bytes (F to I) and the weight-gradient bytes (I to W).
    split_sums: Vec<Arc<LayerSums>>,
    /// Each layer's routed-expert parameters (the same under every recompute mode), which
    /// [`LayerTable::sums_for`] weighs by their own bytes per parameter.
    expert_params: Vec<f64>,
    /// Each layer's compute times (the same under every recompute mode).
    timed: Vec<LayerTimes>,
    /// Per recompute mode: what every key reads of the per-layer costs.
    extremes: Vec<Extremes>,
}

impl LayerTable {
    /// The per-layer table, expanded on first use.
    fn expanded(&self) -> &Expanded {
        self.expanded.get_or_init(|| self.distinct.expand())
    }

    /// The layers under this sharding.
    pub(super) fn layers(&self) -> &[LayerCost] {
        &self.expanded().layers
    }

    /// Per-layer stage costs under `mode` (index as in `Recompute::ALL`).
    pub(super) fn per_mode(&self, mode: usize) -> &[StageCost] {
        &self.expanded().per_mode[mode]
    }

    /// What fully recomputing one layer changes from `mode` (`None` for full recompute, and
    /// for layer lists that are not embedding, alike layers, head).
    pub(super) fn partial(&self, mode: usize) -> Option<&partial::PartialModel> {
        self.expanded().partial[mode].as_ref()
    }

    /// What every key reads of the per-layer costs under `mode`.
    pub(super) fn extremes(&self, mode: usize) -> &Extremes {
        &self.expanded().extremes[mode]
    }

    /// Prefix sums of per-layer F+B seconds, parameters and activation bytes under `mode`.
    pub(super) fn sums(&self, mode: usize) -> &LayerSums {
        &self.expanded().sums[mode]
    }

    /// The layers with their compute times, for an evaluation.
    pub(super) fn list(&self) -> LayerList<'_> {
        let e = self.expanded();
        LayerList {
            layers: &e.layers,
            timed: Some(&e.timed),
        }
    }

    /// The prefix sums a key's split DP uses: [`LayerTable::sums`] (or `split_sums` for a
    /// schedule that splits the backward) under `mode`, with the routed experts' parameters
    /// counted `expert_weight` times (their bytes per parameter over the dense parameters',
    /// see [`super::state_bytes_per_param_of`]), so that the fixed part in parameters times
    /// the dense bytes per parameter is the stage's model states exactly.
    /// Computed once per (mode, split backward, weight): the keys of a sharding share a few.
    pub(super) fn sums_for(
        &self,
        mode: usize,
        splits_backward: bool,
        expert_weight: f64,
    ) -> Arc<LayerSums> {
        let e = self.expanded();
        let sums = match splits_backward {
            true => &e.split_sums[mode],
            false => &e.sums[mode],
        };
        if expert_weight == 1.0 || e.expert_params.iter().all(|&x| x == 0.0) {
            return Arc::clone(sums);
        }
        let weighted = (mode, splits_backward, expert_weight.to_bits());
        self.weighted_sums.get_or(weighted, || {
            let extra: Vec<f64> = e
                .expert_params
                .iter()
                .map(|x| x * (expert_weight - 1.0))
                .collect();
            Arc::new(sums.with_extra_fixed(&extra))
        })
    }

    /// Parameters of all layers, and the routed experts' among them.
    pub(super) fn weight_params(&self) -> WeightParams {
        self.weights
    }

    /// The kinds of the layer list.
    pub(super) fn kinds(&self) -> &[LayerKind] {
        self.kinds.get_or_init(|| {
            let kinds = &self.distinct.layers;
            self.distinct.slot.iter().map(|&j| kinds[j].kind).collect()
        })
    }

    /// The smallest per-micro-batch bottleneck of any split of the layers into `stages`
    /// stages under `mode` (index into `Recompute::ALL`), memory unlimited.
    pub(super) fn free_bottleneck_s(&self, mode: usize, stages: usize) -> Option<f64> {
        self.free_bottleneck.get_or((mode, stages), || {
            let sums = self.sums(mode);
            split_dp::best_split_with(
                sums.len(),
                stages,
                |_, _, _| true,
                |_, a, b| sums.time_s(a, b),
            )
            .map(|b| b.1)
        })
    }
}

impl Distinct {
    /// The per-layer table: each layer takes its distinct layer's times and costs.
    fn expand(&self) -> Expanded {
        let slot = &self.slot;
        let per_mode: Vec<Vec<StageCost>> = self
            .per_mode
            .iter()
            .map(|costs| {
                slot.iter()
                    .enumerate()
                    .map(|(i, &j)| StageCost {
                        layers: [i, i],
                        ..costs[j]
                    })
                    .collect()
            })
            .collect();
        let sums_with = |held: fn(&StageCost) -> u64| -> Vec<Arc<LayerSums>> {
            per_mode
                .iter()
                .map(|costs: &Vec<StageCost>| {
                    let time: Vec<f64> = costs
                        .iter()
                        .map(|c| c.forward_s() + c.backward_s())
                        .collect();
                    let params: Vec<f64> = costs.iter().map(|c| c.params as f64).collect();
                    let act: Vec<f64> = costs.iter().map(|c| held(c) as f64).collect();
                    Arc::new(LayerSums::new(&time, &params, &act))
                })
                .collect()
        };
        let sums = sums_with(|c| c.activation_bytes);
        let split_sums = sums_with(|c| c.activation_bytes.max(c.weight_grad_bytes));
        let layers: Vec<LayerCost> = slot.iter().map(|&j| self.layers[j].clone()).collect();
        let full = mode_index(Recompute::Full);
        let partial = Recompute::ALL
            .iter()
            .enumerate()
            .map(|(i, &mode)| {
                if mode == Recompute::Full {
                    None
                } else {
                    partial::PartialModel::new(&layers, &per_mode[i], &per_mode[full])
                }
            })
            .collect();
        let expert_params: Vec<f64> = per_mode[0].iter().map(|c| c.expert_params as f64).collect();
        Expanded {
            layers,
            partial,
            sums,
            split_sums,
            expert_params,
            timed: slot.iter().map(|&j| self.timed[j]).collect(),
            extremes: per_mode.iter().map(|c| Extremes::of(c)).collect(),
            per_mode,
        }
    }
}

/// The index of `mode` in `Recompute::ALL`.
pub(super) fn mode_index(mode: Recompute) -> usize {
    Recompute::ALL.iter().position(|&m| m == mode).unwrap_or(0)
}

/// Per-layer costs for a key's sharding under every recompute mode.
fn layer_table(
    model: &Model,
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    key: &Key,
) -> Result<LayerTable, PlanError> {
    let c = config_of(key, opts, None);
    // each distinct layer (a dense model's block, each kind of an alternating model's) is timed
    // and costed once: the times and costs are functions of the layer alone
    let (mut distinct, slot) = model.distinct_layers(&shard_spec(&c))?;
    let d = key.degrees;
    let layout = d.layout();
    let cluster = &profile.cluster;
    let cp_kv_bytes = cp_kv_bytes(model, &c);
    // compute times do not depend on the recompute mode: each distinct layer is timed once
    let distinct_timed: Vec<LayerTimes> = distinct.iter().map(|l| profile.layer_times(l)).collect();
    let firsts: Vec<[usize; 2]> = (0..distinct.len()).map(|j| [j, j]).collect();
    // the links and shares of the context are the same for every recompute mode
    let shared = StageContext {
        profile,
        tp: d.tp,
        tp_link: c
            .settings
            .runtime
            .ring_link(cluster, d.tp, layout.tp_stride()),
        recompute: Recompute::None,
        cp: d.cp,
        cp_link: cluster.group_link(d.cp, layout.cp_stride()),
        cp_kv_bytes,
        tp_comm_overlap: c.settings.runtime.tp_comm_overlap,
        ep: c.experts.ep,
        ep_link: cluster.group_link(c.experts.ep, c.experts.etp),
        ep_hidden_share: 0.0,
        ep_across_share: crate::experts::node_dedup_share(model, &c, cluster.gpus_per_node),
        selective_linear_share: StageContext::selective_share_of(&c.settings.runtime, model),
        dtensor_tp: c.settings.runtime.tp_collectives == crate::runtime::TpCollectives::Dtensor,
        torch_native: c.settings.runtime.stack == crate::Stack::Torchtitan,
        torch_compiled: c.settings.runtime.torch_compiled(),
        fused_qkv: c.settings.runtime.selective.fused_qkv(),
        compiled_loss: c.settings.runtime.compiled_loss,
        expert_host_launches: c.settings.runtime.expert_host_launches,
        host_serialized: c.settings.runtime.host_serialized,
    };
    let mtp_layers = crate::experts::mtp_layers(model);
    let per_mode: Vec<Vec<StageCost>> = Recompute::ALL
        .iter()
        .map(|&mode| {
            let ctx = StageContext {
                recompute: mode,
                ep_hidden_share: crate::experts::a2a_hidden_share(
                    &c.clone().with_recompute(mode),
                    mtp_layers,
                ),
                ..shared
            };
            stages::stage_costs_timed(&distinct, &distinct_timed, &firsts, &ctx, &[])
        })
        .collect();
    // Every evaluation of the table's layers passes their times (`list`), so the operation
    // lists they were timed from are not read again: dropped, they no longer hold memory for
    // every sharding of the space (thousands of tables on 1,024 GPUs), and the copies of each
    // distinct layer below are cheap. torchtitan's op-level checkpointing and unfused loss size a
    // layer's activations from its forward operations ([`stages::op_sac_bytes`],
    // [`stages::unfused_loss_bytes`]): kept there. Names are left empty: no evaluation reads
    // them.
    let keep_forward = c.settings.runtime.stack == crate::Stack::Torchtitan;
    for l in &mut distinct {
        if !keep_forward {
            l.forward_ops = Vec::new();
        }
        for ops in [
            &mut l.backward_input_ops,
            &mut l.backward_weight_ops,
            &mut l.selective_recompute_ops,
        ] {
            *ops = Vec::new();
        }
        l.name = String::new();
    }
    // the figures that rank the keys, summed layer by layer as the expanded table would
    let total_s = per_mode
        .iter()
        .map(|costs| {
            slot.iter().fold((0.0, 0.0, 0.0), |(fb, f, w), &j| {
                let c = &costs[j];
                (
                    fb + c.forward_s() + c.backward_s(),
                    f + c.forward_s(),
                    w + c.backward_weight_s(),
                )
            })
        })
        .collect();
    let weights = WeightParams {
        all: slot.iter().map(|&j| per_mode[0][j].params).sum(),
        experts: slot
            .iter()
            .map(|&j| per_mode[0][j].expert_params as f64)
            .sum::<f64>() as u64,
    };
    Ok(LayerTable {
        total_s,
        weights,
        distinct: Distinct {
            layers: distinct,
            slot,
            timed: distinct_timed,
            per_mode,
        },
        kinds: OnceLock::new(),
        expanded: OnceLock::new(),
        free_bottleneck: Default::default(),
        weighted_sums: Default::default(),
    })
}
