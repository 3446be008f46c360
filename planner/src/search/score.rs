//! Scoring one configuration without simulating it: the memory floor, the lower bound the scan
//! is ordered by, and the split DP with its closed-form time — plus, where memory binds, the
//! same configuration with partial recompute (its DP here, its integer program in
//! [`super::partial`]).

use std::sync::Arc;

use autopp_hardware::AnalyticProfile;
use autopp_models::Recompute;

use super::budget::{rank_budget_bytes, stage_budgets, stage_slack};
use super::split_dp::{self, LayerSums, StageBudget};
use super::table::{mode_index, LayerTable};
use super::{config_of, partial, state_bytes_per_param_of, Key, Scored, SearchOptions};
use crate::config::ParallelConfig;
use crate::estimate::{dp_comm_time_s, optimizer_time_s};
use crate::framework::PartialRecompute;
use crate::memory;
use crate::schedule::{split, ScheduleKind};
use crate::stages::{self, StageCost};

/// Whether a key cannot fit whatever its split: the model states of the busiest rank (at least
/// [`model_states_floor_bytes`]) exceed the memory left after the reserve and the margin.
pub(super) fn below_memory_floor(
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    key: &Key,
    params: WeightParams,
) -> bool {
    let usable = profile.cluster.gpu.memory_bytes as f64
        - opts.settings.memory_reserve_bytes as f64
        - opts.settings.memory_margin_bytes as f64;
    model_states_floor_bytes(opts, key, params) > usable
}

/// A lower bound on the busiest rank's model states (weights, gradients, optimizer), bytes: an
/// even share over the pipeline ranks of all layers' states (`params` in all:
/// [`LayerTable::weight_params`]), the routed experts' at their own bytes per parameter
/// (sharded over the expert-data-parallel group). Exact with one pipeline rank.
pub(super) fn model_states_floor_bytes(
    opts: &SearchOptions,
    key: &Key,
    params: WeightParams,
) -> f64 {
    let (per_param, per_expert_param) = state_bytes_per_param_of(opts, key);
    let dense = params.all - params.experts.min(params.all);
    (dense as f64 * per_param + params.experts as f64 * per_expert_param) / key.degrees.pp as f64
}

/// A weight sharding's parameters on one GPU of each pipeline rank, summed over the ranks:
/// all of them and the routed experts' among them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct WeightParams {
    /// All parameters.
    pub all: u64,
    /// The routed experts' parameters among them.
    pub experts: u64,
}

/// A lower bound on [`score`]'s closed-form time for any split: with `T` the F+B seconds of
/// all layers for one micro-batch, the busiest rank does at least `m·T/pp` and the fill takes
/// at least `(pp−1)·T/(pp·v)` (`v` times that for looped BFS; for the split-backward schedules,
/// whose `W`s fill the drain, `(pp−1)·T_F/(pp·v)` with `T_F` the forward seconds alone; for
/// ZB-H2 and ZB-V, whose fill is `(pp−1)` times the largest stage's `F + B − 3·W` (with `B`
/// the whole backward, `I + W`), at least `(pp−1)` times its mean over the stages, and never
/// below zero).
pub(super) fn lower_bound_s(k: &Key, table: &LayerTable, opts: &SearchOptions) -> f64 {
    let (total, forward, weight) = table.total_s[mode_index(k.recompute)];
    let (pp, v) = (k.degrees.pp as f64, k.degrees.virtual_stages as f64);
    let m = (opts.global_batch_size / (k.degrees.dp * k.micro_batch_size)) as f64;
    let fill = if matches!(k.schedule, ScheduleKind::ZbH2 | ScheduleKind::ZbV) {
        (pp - 1.0) * ((total - 3.0 * weight) / (pp * v)).max(0.0)
    } else if k.schedule.splits_backward() {
        (pp - 1.0) * forward / (pp * v)
    } else {
        (pp - 1.0) * total / (pp * v)
    };
    let fill = if k.schedule == ScheduleKind::LoopedBfs {
        fill * v
    } else {
        fill
    };
    m * total / pp + fill
}

/// The link of a key's data-parallel group (`dp · cp` GPUs, `tp` apart), which its ring
/// collectives run on.
pub(super) fn dp_link_of(
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    key: &Key,
) -> autopp_hardware::Link {
    let d = key.degrees;
    opts.settings.runtime.ring_link(
        &profile.cluster,
        d.data_parallel_gpus(),
        d.layout().tp_stride() * d.tp,
    )
}

/// One key's scoring context: its layer sums, every stage's memory budget and the closed form.
/// [`KeyScorer::base`] scores the key; [`KeyScorer::partial`] its partial-recompute variant,
/// which the scan reaches only when that variant's lower bound comes up.
pub(super) struct KeyScorer<'a> {
    profile: &'a AnalyticProfile,
    opts: &'a SearchOptions,
    key: &'a Key,
    table: &'a LayerTable,
    /// Micro-batches per iteration.
    m: u64,
    /// Index of the key's recompute mode in `Recompute::ALL`.
    mode: usize,
    costs: &'a [StageCost],
    /// What the DP sums: for split-backward schedules, per in-flight pair the larger of the
    /// activation and weight-gradient bytes.
    sums: Arc<LayerSums>,
    /// Per stage, in parameters (every term of a stage's memory inequality is divided by the
    /// bytes per parameter).
    budgets: Vec<StageBudget>,
    /// The configuration without a split (for the tail's terms).
    config: ParallelConfig,
    dp_link: autopp_hardware::Link,
}

impl<'a> KeyScorer<'a> {
    /// `None` when the key has fewer layers than stages or no memory left for layers.
    pub(super) fn new(
        profile: &'a AnalyticProfile,
        opts: &'a SearchOptions,
        key: &'a Key,
        table: &'a LayerTable,
        inflight: &[u32],
        m: u64,
    ) -> Option<Self> {
        let mode = mode_index(key.recompute);
        let costs = table.per_mode(mode);
        let (pp, v) = (key.degrees.pp as usize, key.degrees.virtual_stages as usize);
        let s = pp * v;
        if costs.len() < s {
            return None;
        }
        let (per_param, per_expert_param) = state_bytes_per_param_of(opts, key);
        // A split backward holds a pair's activations until its I, then what its W needs
        // until the W: per in-flight pair, at most the larger of the two.
        let sums = table.sums_for(
            mode,
            key.schedule.splits_backward(),
            per_expert_param / per_param,
        );
        let ext = table.extremes(mode);
        let rank_budget = rank_budget_bytes(profile, opts, key, ext)?;
        let budgets = stage_budgets(
            opts,
            key,
            ext,
            table.kinds(),
            &sums,
            rank_budget,
            inflight,
            per_param,
        );
        let dp_link = dp_link_of(profile, opts, key);
        Some(KeyScorer {
            profile,
            opts,
            key,
            table,
            m,
            mode,
            costs,
            sums,
            budgets,
            config: config_of(key, opts, None),
            dp_link,
        })
    }

    /// The closed form of a split: the busiest rank's work plus the pipeline fill and drain,
    /// plus the tail (the same data-parallel and optimizer terms as `estimate`).
    /// `extra_s(stage, first, last)` is what a stage's recomputed layers add per micro-batch.
    fn closed_form(&self, split: &[usize], extra_s: &dyn Fn(usize, usize, usize) -> f64) -> f64 {
        let key = self.key;
        let (pp, v) = (key.degrees.pp as usize, key.degrees.virtual_stages as usize);
        let placement = key.schedule.placement();
        let ranges = split::stage_ranges(split);
        let stage_time: Vec<f64> = ranges
            .iter()
            .enumerate()
            .map(|(k, &[a, b])| self.sums.time_s(a, b) + extra_s(k, a, b))
            .collect();
        let stages: Vec<StageCost> = ranges
            .iter()
            .map(|&[a, b]| stages::combine(&self.costs[a..=b]))
            .collect();
        let mut busy = vec![0.0; pp];
        let mut rank_stages: Vec<Vec<&StageCost>> = vec![Vec::new(); pp];
        for (k, st) in stages.iter().enumerate() {
            let r = placement.rank_of(k, pp);
            busy[r] += stage_time[k];
            rank_stages[r].push(st);
        }
        let busiest = busy.iter().cloned().fold(0.0, f64::max) * self.m as f64;
        let slowest_stage = stage_time.iter().cloned().fold(0.0, f64::max);
        let fill = match key.schedule {
            ScheduleKind::LoopedBfs => (pp - 1) as f64 * slowest_stage * v as f64,
            // ZB-H2 and ZB-V leave `(p − 1)·(T_F + T_B − 2·T_W)` idle, zero when the three
            // passes take the same time (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR
            // 2024, §2.2 and their ZB-V follow-up: bubble rate 0 for ZB-2P and ZB-V against
            // (p − 1)/3m for ZB-1P), with `T_B` the input gradient (recompute included)
            ScheduleKind::ZbH2 | ScheduleKind::ZbV => {
                let hop = stages
                    .iter()
                    .map(|s| s.forward_s() + s.backward_input_s() - 2.0 * s.backward_weight_s())
                    .fold(0.0, f64::max);
                (pp - 1) as f64 * hop
            }
            // the deferred W's fill the drain: about one forward per hop is left
            kind if kind.splits_backward() => {
                let slowest_forward = stages.iter().map(|s| s.forward_s()).fold(0.0, f64::max);
                (pp - 1) as f64 * slowest_forward
            }
            _ => (pp - 1) as f64 * slowest_stage,
        };
        let tail = rank_stages
            .iter()
            .map(|st| {
                dp_comm_time_s(self.profile, &self.config, st, &self.dp_link, self.m)
                    + optimizer_time_s(self.profile, &self.config, st, memory::rank_params(st))
            })
            .fold(0.0, f64::max);
        busiest + fill + tail
    }

    /// The key itself: its DP split and closed form, or — when no split fits — the even split
    /// ranked by its lower bound (kept only to say what more memory would buy). Also the lower
    /// bound of its partial-recompute variant, where that variant may pay.
    pub(super) fn base(&self) -> Option<(Scored, Option<f64>)> {
        let (key, table) = (self.key, self.table);
        let s = self.budgets.len();
        let base = if split_dp::any_split_fits(&self.sums, &self.budgets) {
            split_dp::best_split(&self.sums, &self.budgets)
        } else {
            None
        };
        let scored = match &base {
            Some((split, _)) => {
                let (split, approx_s) = self.balance_ranks(split.clone());
                Scored {
                    key: *key,
                    approx_s,
                    split,
                    recompute_layers: None,
                    fits: true,
                }
            }
            // a configuration that does not fit only says what more memory would buy: its
            // lower bound ranks it well enough, and costs far less than the closed form
            None => Scored {
                key: *key,
                approx_s: lower_bound_s(key, table, self.opts),
                split: split::default_split(table.kinds(), s).ok()?,
                recompute_layers: None,
                fits: false,
            },
        };
        let partial_bound = self.partial_bound_s(base.map(|b| b.1));
        Some((scored, partial_bound))
    }

    /// The partial-recompute model, where the framework runs it and no pin forbids it.
    fn partial_model(&self) -> Option<&'a partial::PartialModel> {
        partial_model_of(self.opts, self.key, self.table, self.mode)
    }

    /// A lower bound on the closed form of the key with partial recompute, or `None` when that
    /// variant cannot pay: partial recompute is for configurations memory binds, so when the
    /// best split with no layer recomputed (`bottleneck_s`) is as good as the best split with
    /// memory unlimited, the key without it covers it.
    ///
    /// The bound is the key's own plus the recomputed layers' time spread over the ranks. At
    /// least one layer is recomputed, and together the stages must shed what all layers need
    /// at the fewest in-flight micro-batches beyond all budgets, each recomputed layer
    /// shedding at most its share at the most.
    fn partial_bound_s(&self, bottleneck_s: Option<f64>) -> Option<f64> {
        let part = self.partial_model()?;
        if let Some(bottleneck) = bottleneck_s {
            let free = self.table.free_bottleneck_s(self.mode, self.budgets.len());
            if free.is_none_or(|f| bottleneck <= f * (1.0 + 1e-9)) {
                return None;
            }
        }
        let (least_inflight, most_inflight) = self
            .budgets
            .iter()
            .fold((f64::INFINITY, 0.0f64), |(lo, hi), b| {
                (lo.min(b.inflight), hi.max(b.inflight))
            });
        let n = self.costs.len();
        let over = self.sums.mem_bytes(0, n - 1, least_inflight)
            - self.budgets.iter().map(|b| b.bytes).sum::<f64>();
        Some(partial_bound_from(
            self.opts,
            self.key,
            self.table,
            part,
            self.m,
            (over, most_inflight),
        ))
    }

    /// The key with partial recompute: the split and per-stage counts of fully recomputed
    /// layers that the DP chooses, when some layer is recomputed and the result fits.
    pub(super) fn partial(&self) -> Option<Scored> {
        let part = self.partial_model()?;
        let budgets = &self.budgets;
        let (n, s) = (self.costs.len(), budgets.len());
        // every layer fully recomputed is the leanest a partial plan gets
        let full = self.table.sums(mode_index(Recompute::Full));
        if !split_dp::any_split_fits(full, budgets) {
            return None;
        }
        // the fewest fully recomputed layers that make layers first..=last fit stage k
        let needed = |k: usize, first: usize, last: usize| -> Option<u64> {
            let b = &budgets[k];
            let extra = if last + 1 == n {
                b.extra_if_last_bytes
            } else {
                0.0
            };
            let over = self.sums.mem_bytes(first, last, b.inflight) + extra - b.bytes;
            if over <= 0.0 {
                return Some(0);
            }
            let per = b.inflight * part.delta_act_bytes;
            // ⌈over / per⌉ without a libm call
            let floor = (over / per) as u64;
            let need = floor + u64::from(floor as f64 * per < over);
            (need <= part.count(first, last)).then_some(need)
        };
        let extra_s = |k: usize, first: usize, last: usize| {
            needed(k, first, last).unwrap_or(0) as f64 * part.delta_time_s
        };
        let fits = |k: usize, a: usize, b: usize| needed(k, a, b).is_some();
        if !split_dp::any_fits_with(n, s, fits) {
            return None;
        }
        let (split, _) = split_dp::best_split_with(n, s, fits, |k, a, b| {
            self.sums.time_s(a, b) + extra_s(k, a, b)
        })?;
        let ranges = split::stage_ranges(&split);
        let mut recompute_layers: Vec<u64> = ranges
            .iter()
            .enumerate()
            .map(|(k, &[a, b])| needed(k, a, b).unwrap_or(0))
            .collect();
        if recompute_layers.iter().all(|&x| x == 0) {
            // nothing recomputed: the configuration without partial recompute is the same plan
            return None;
        }
        let approx_s = if self.opts.limits.framework.partial_recompute()
            == PartialRecompute::SameCountPerStage
        {
            // one count for every stage (Megatron-LM's --recompute-num-layers): the largest
            // any stage needs, up to each stage's recomputable layers
            let most = recompute_layers.iter().copied().max().unwrap_or(0);
            for (x, &[a, b]) in recompute_layers.iter_mut().zip(&ranges) {
                *x = most.min(part.count(a, b));
            }
            let uniform = &recompute_layers;
            self.closed_form(&split, &|k, _, _| uniform[k] as f64 * part.delta_time_s)
        } else {
            self.closed_form(&split, &extra_s)
        };
        Some(Scored {
            key: Key {
                partial_recompute: true,
                ..*self.key
            },
            approx_s,
            split,
            recompute_layers: Some(recompute_layers),
            fits: true,
        })
    }
}

/// The partial-recompute model of `key`'s recompute mode (`mode`), where the framework runs
/// it and no pin forbids it.
fn partial_model_of<'t>(
    opts: &SearchOptions,
    key: &Key,
    table: &'t LayerTable,
    mode: usize,
) -> Option<&'t partial::PartialModel> {
    let allowed = opts
        .limits
        .framework
        .partial_bases()
        .contains(&key.recompute)
        && opts.fixed.recompute.is_none()
        && !key.schedule.splits_backward();
    table.partial(mode).filter(|_| allowed)
}

/// [`KeyScorer::partial_bound_s`]'s bound from `over` (what all layers need at the fewest
/// in-flight micro-batches beyond all budgets, in parameters) and the most in-flight
/// micro-batches of any stage (per byte per parameter).
fn partial_bound_from(
    opts: &SearchOptions,
    key: &Key,
    table: &LayerTable,
    part: &partial::PartialModel,
    m: u64,
    (over, most_inflight): (f64, f64),
) -> f64 {
    let shed_most = most_inflight * part.delta_act_bytes;
    let least_layers = if over > 0.0 && shed_most > 0.0 {
        (over / shed_most).ceil().max(1.0)
    } else {
        1.0
    };
    lower_bound_s(key, table, opts)
        + m as f64 * least_layers * part.delta_time_s / key.degrees.pp as f64
}

/// [`KeyScorer::new`] followed by [`KeyScorer::base`] for a key that no split can fit, without
/// building the scorer: `Some` with exactly what those give, or `None` when the key might fit
/// (or when this cheap test cannot tell).
///
/// Every stage's budget is the same, so with `s` stages whatever the split, the stages
/// together hold all layers' model states and activations — at least all layers' at the
/// fewest in-flight micro-batches of any stage — within `s` budgets. When that total exceeds
/// them (by more than any rounding of the per-stage sums), nothing fits.
pub(super) fn unfit_base(
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    key: &Key,
    table: &LayerTable,
    inflight: &[u32],
    m: u64,
) -> Option<Option<(Scored, Option<f64>)>> {
    let mode = mode_index(key.recompute);
    let n = table.per_mode(mode).len();
    let (pp, v) = (key.degrees.pp as usize, key.degrees.virtual_stages as usize);
    let s = pp * v;
    if n < s {
        return Some(None);
    }
    let (per_param, per_expert_param) = state_bytes_per_param_of(opts, key);
    let sums = table.sums_for(
        mode,
        key.schedule.splits_backward(),
        per_expert_param / per_param,
    );
    let ext = table.extremes(mode);
    let Some(rank_budget) = rank_budget_bytes(profile, opts, key, ext) else {
        return Some(None);
    };
    // the same figures as `KeyScorer::new`'s budgets
    let (dynamic, transient_frag) = stage_slack(opts, ext, pp, v);
    let bytes = (rank_budget - transient_frag) / v as f64 / per_param;
    // every rank holds a stage (stage k < pp sits on rank k or pp − 1 − k)
    let (least_inflight, most_inflight) = inflight[..pp]
        .iter()
        .map(|&q| q as f64 * dynamic / v as f64 / per_param)
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        });
    let need = sums.mem_bytes(0, n - 1, least_inflight);
    let room = std::iter::repeat_n(bytes, s).sum::<f64>();
    let over = need - room;
    // (false for NaN figures: then the scorer decides)
    let beyond_rounding = over > 1e-6 * (need.abs() + room.abs());
    if !beyond_rounding {
        return None;
    }
    let Ok(split) = split::default_split(table.kinds(), s) else {
        return Some(None);
    };
    let scored = Scored {
        key: *key,
        approx_s: lower_bound_s(key, table, opts),
        split,
        recompute_layers: None,
        fits: false,
    };
    let bound = partial_model_of(opts, key, table, mode)
        .map(|part| partial_bound_from(opts, key, table, part, m, (over, most_inflight)));
    Some(Some((scored, bound)))
}

/// The partial-recompute integer program for a shortlisted key (see [`partial::solve`]).
pub(super) fn solve_partial(
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    key: &Key,
    table: &LayerTable,
    inflight: &[u32],
) -> Option<(Vec<usize>, Vec<u64>)> {
    let mode = mode_index(key.recompute);
    let part = table.partial(mode)?;
    let costs = table.per_mode(mode);
    let ext = table.extremes(mode);
    let budget = rank_budget_bytes(profile, opts, key, ext)?;
    let (per_param, per_expert_param) = state_bytes_per_param_of(opts, key);
    // a layer's model states, the routed experts' at their own bytes per parameter
    let states = |c: &StageCost| {
        let experts = c.expert_params.min(c.params);
        (c.params - experts) as f64 * per_param + experts as f64 * per_expert_param
    };
    let (pp, v) = (key.degrees.pp as usize, key.degrees.virtual_stages as usize);
    let placement = key.schedule.placement();
    let s = pp * v;
    let rank_of: Vec<usize> = (0..s).map(|k| placement.rank_of(k, pp)).collect();
    let n = costs.len();
    let time = |c: &StageCost| c.forward_s() + c.backward_s();
    let tied = ext.tied_params;
    let mut ends = vec![(0.0, 0.0, 0.0); pp];
    for (k, c) in [(0, &costs[0]), (s - 1, &costs[n - 1])] {
        let e = &mut ends[rank_of[k]];
        e.0 += time(c);
        e.1 += states(c);
        e.2 += c.activation_bytes as f64;
    }
    let (transient, head_extra) = ext.transient_bytes(pp);
    if pp > 1 {
        ends[rank_of[s - 1]].1 +=
            tied as f64 * per_param + head_extra * (1.0 + memory::FRAGMENTATION);
    }
    // Here the rank's whole budget binds exactly (no equal shares per stage), so the
    // allocator's fragmentation of the dynamic memory is counted: activations grow by it
    // through the in-flight counts, the backward's working set through the budget.
    let dynamic = 1.0 + memory::FRAGMENTATION;
    let inflight_per_stage: Vec<f64> = inflight
        .iter()
        .map(|&q| q as f64 * dynamic / v as f64)
        .collect();
    let margin = opts.settings.memory_margin_bytes as f64;
    let budgets = vec![budget - transient * memory::FRAGMENTATION - margin; pp];
    let same_count =
        opts.limits.framework.partial_recompute() == PartialRecompute::SameCountPerStage;
    let answer = partial::solve(
        &partial::Problem {
            pp,
            virtual_stages: v,
            layer_time_s: time(&costs[1]),
            partial: part,
            layer_fixed_bytes: states(&costs[1]),
            layer_act_bytes: costs[1].activation_bytes as f64,
            ends: &ends,
            inflight_per_stage: &inflight_per_stage,
            budget_bytes: &budgets,
            same_count,
        },
        opts.ilp_solver,
    )?;
    // each rank's layers and recomputes spread over its stages, the later stages taking
    // the remainders
    let mut split = vec![0usize; s];
    let mut recompute = vec![0u64; s];
    for r in 0..pp {
        let stages: Vec<usize> = (0..s).filter(|&k| rank_of[k] == r).collect();
        let spread = |total: u64| -> Vec<u64> {
            let (base, rem) = (total / v as u64, (total % v as u64) as usize);
            (0..v).map(|i| base + u64::from(i >= v - rem)).collect()
        };
        let layers = spread(answer.layers[r]);
        let full = spread(answer.recompute_layers[r]);
        for (i, &k) in stages.iter().enumerate() {
            split[k] = layers[i] as usize;
            recompute[k] = if same_count {
                (answer.recompute_layers[r] / v as u64).min(layers[i])
            } else {
                full[i].min(layers[i])
            };
        }
    }
    split[0] += 1;
    split[s - 1] += 1;
    if split.contains(&0) {
        return None;
    }
    Some((split, recompute))
}

mod balance;
#[cfg(test)]
mod tests;
