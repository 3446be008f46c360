//! The search: the fastest configuration and layer split that fits, in well under a second.
//!
//! 1. **Enumerate** every discrete configuration ([`space::enumerate`]): degrees, micro-batch
//!    size, schedule, stages per rank, recompute, sequence parallelism, ZeRO.
//! 2. **Split and bound**, in parallel (`rayon`), one group of configurations per layer sharding
//!    (tp, cp, micro-batch size, sequence parallelism; their layer costs are computed once): each
//!    configuration's split comes from the dynamic program of [`split_dp`] under every stage's
//!    memory budget (which depends on its rank's in-flight micro-batches in that schedule), and
//!    a closed-form time ranks it.
//! 3. **Simulate** the best-ranked candidates with [`crate::estimate::evaluate_layers`] — the
//!    same code path as `autopp estimate` — with both the DP split and Megatron's even split,
//!    and refine the winners' splits by moving single layers across stage boundaries.
//!
//! The result is deterministic for any thread count: candidates are ranked by (time, [`Key`]).

mod errors;
mod evaluator;
pub mod explain;
mod memo;
mod partial;
mod refine;
mod scan;
mod score;
pub mod space;
pub mod split_dp;

use std::collections::HashMap;
use std::time::Instant;

use autopp_hardware::{AnalyticProfile, Layout, Precision};
use autopp_models::{LayerCost, Model, Recompute};
use rayon::prelude::*;

use crate::config::{ParallelConfig, PlanError};
use crate::estimate::{
    dp_comm_time_s, evaluate_layers_with, optimizer_time_s, shard_spec, Detail, Estimate,
};
use crate::memory::{self, NCCL_BUFFER_BYTES_PER_GROUP};
use crate::schedule;
use crate::schedule::split;
use crate::stages::{self, StageContext, StageCost};

use errors::{no_candidates, nothing_fits};
use evaluator::{Evaluator, ScheduleShape};
use memo::Memo;
pub use partial::IlpSolver;
use score::{lower_bound_s, solve_partial};
pub use space::{Fixed, Key, SpaceLimits};
use split_dp::{LayerSums, StageBudget};

/// What to search.
#[derive(Debug, Clone)]
pub struct SearchOptions {
    /// Sequences per iteration.
    pub global_batch_size: u64,
    /// Limits of the space.
    pub limits: SpaceLimits,
    /// Pinned fields.
    pub fixed: Fixed,
    /// Alternatives to report besides the best.
    pub top_k: usize,
    /// Math precision.
    pub precision: Precision,
    /// Bytes kept free per GPU.
    pub memory_reserve_bytes: u64,
    /// Model a fused attention kernel.
    pub flash_attention: bool,
    /// Only Megatron's default even split (no uneven layouts): for frameworks that cannot lay
    /// stages out unevenly, and to measure what uneven splits buy.
    pub even_split_only: bool,
    /// Framework behaviour (gradient dtype, overlap) every candidate runs with.
    pub runtime: crate::config::Runtime,
    /// The solver of the partial-recompute integer program.
    pub ilp_solver: IlpSolver,
}

/// What the search found.
#[derive(Debug, Clone)]
pub struct SearchResult {
    /// The fastest plan that fits.
    pub best: Estimate,
    /// The next fastest distinct configurations that fit, fastest first.
    pub alternatives: Vec<Estimate>,
    /// The fastest configuration found that does *not* fit, when it would beat the best (what
    /// more memory would buy).
    pub fastest_unfit: Option<Estimate>,
    /// Configurations enumerated.
    pub candidates: usize,
    /// Candidates simulated exactly.
    pub simulated: usize,
    /// Wall time of the search, seconds.
    pub elapsed_s: f64,
}

/// A configuration after the DP: its split and closed-form time.
#[derive(Debug, Clone)]
struct Scored {
    key: Key,
    split: Vec<usize>,
    /// Partial recompute: fully recomputed layers per stage.
    recompute_layers: Option<Vec<u64>>,
    approx_s: f64,
    fits: bool,
}

/// Per-layer costs for one layer sharding, under each recompute mode.
pub(crate) struct LayerTable {
    layers: Vec<LayerCost>,
    /// Per recompute mode (index as in `Recompute::ALL`): per-layer stage costs.
    per_mode: Vec<Vec<StageCost>>,
    /// Per recompute mode: what fully recomputing one layer changes from that mode (`None` for
    /// full recompute, and for layer lists that are not embedding, alike layers, head).
    partial: Vec<Option<partial::PartialModel>>,
    /// Per recompute mode: prefix sums of per-layer F+B seconds, parameters (the fixed part,
    /// in parameters: [`score`] scales the budgets by the bytes per parameter instead) and
    /// activation bytes per in-flight micro-batch.
    sums: Vec<LayerSums>,
    /// [`LayerTable::sums`] for schedules that split the backward: per in-flight pair the
    /// larger of the activation bytes (F to I) and the weight-gradient bytes (I to W).
    split_sums: Vec<LayerSums>,
    /// Per (recompute mode, stages): the smallest bottleneck of any split with memory
    /// unlimited, computed on first use.
    free_bottleneck: Memo<(usize, usize), Option<f64>>,
    /// Per recompute mode: seconds of all layers for one micro-batch, F+B and F alone.
    total_s: Vec<(f64, f64)>,
    /// Parameters of all layers.
    params: u64,
}

impl LayerTable {
    /// The smallest per-micro-batch bottleneck of any split of the layers into `stages`
    /// stages under `mode` (index into `Recompute::ALL`), memory unlimited.
    fn free_bottleneck_s(&self, mode: usize, stages: usize) -> Option<f64> {
        self.free_bottleneck.get_or((mode, stages), || {
            let sums = &self.sums[mode];
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

fn mode_index(mode: Recompute) -> usize {
    Recompute::ALL.iter().position(|&m| m == mode).unwrap_or(0)
}

/// The configuration a key describes.
pub fn config_of(key: &Key, opts: &SearchOptions, split: Option<Vec<usize>>) -> ParallelConfig {
    config_with(key, opts, split, None)
}

/// The exact configuration of an evaluated plan: its key, split and recompute counts.
pub fn exact_config(e: &Estimate, opts: &SearchOptions) -> ParallelConfig {
    let (split, recompute_layers) = evaluator::choice_of(e);
    config_with(&key_of(e), opts, Some(split), recompute_layers)
}

/// [`config_of`] with partial recompute's fully recomputed layers per stage.
pub fn config_with(
    key: &Key,
    opts: &SearchOptions,
    split: Option<Vec<usize>>,
    recompute_layers: Option<Vec<u64>>,
) -> ParallelConfig {
    ParallelConfig {
        tp: key.tp,
        pp: key.pp,
        dp: key.dp,
        cp: key.cp,
        virtual_stages: key.virtual_stages,
        micro_batch_size: key.micro_batch_size,
        global_batch_size: opts.global_batch_size,
        schedule: key.schedule,
        group_size: None,
        recompute: key.recompute,
        recompute_layers,
        sequence_parallel: key.sequence_parallel,
        zero_stage: key.zero_stage,
        split,
        precision: opts.precision,
        memory_reserve_bytes: opts.memory_reserve_bytes,
        flash_attention: opts.flash_attention,
        runtime: opts.runtime,
    }
}

/// Model-state bytes per parameter on one GPU under a ZeRO stage sharded `shard` ways.
fn state_bytes_per_param(zero_stage: u8, shard: u64) -> f64 {
    let (w, g, o) = memory::model_state_bytes(1_000_000, zero_stage, shard);
    (w + g + o) as f64 / 1e6
}

/// Searches for the fastest configuration of `model` on `profile`'s cluster that fits.
/// `progress(done, total)` is called as groups of candidates finish.
pub fn search(
    model: &Model,
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<SearchResult, PlanError> {
    let start = Instant::now();
    let eval = Evaluator::new(model, profile, opts);
    let gpus = profile.cluster.num_gpus();
    if opts.global_batch_size == 0 {
        return Err(PlanError::invalid("--global-batch", "must be at least 1"));
    }
    let keys = space::enumerate(
        model,
        gpus,
        opts.global_batch_size,
        &opts.limits,
        &opts.fixed,
    );
    if keys.is_empty() {
        return Err(no_candidates(model, gpus, opts));
    }

    // Layer tables, one per layer sharding (tp, cp, micro-batch size, sequence parallelism).
    let mut group_keys: Vec<GroupKey> = keys.iter().map(group_of).collect();
    group_keys.sort_unstable();
    group_keys.dedup();
    let tables: HashMap<GroupKey, LayerTable> = group_keys
        .par_iter()
        .filter_map(|&g| {
            let key = keys.iter().find(|k| group_of(k) == g)?;
            match layer_table(model, profile, opts, key) {
                Ok(t) => Some(Ok((g, t))),
                // a sharding the model cannot take (e.g. kv heads vs tp): no candidates there
                Err(PlanError::Model(_)) => None,
                Err(e) => Some(Err(e)),
            }
        })
        .collect::<Result<_, PlanError>>()?;

    // Each schedule shape's in-flight counts, computed once, when first needed.
    let inflight: Memo<ScheduleShape, Option<Vec<u32>>> = Memo::default();
    let generated: Memo<ScheduleShape, Option<Vec<u32>>> = Memo::default();
    let inflight_of = |shape: ScheduleShape| -> Option<Vec<u32>> {
        inflight.get_or(shape, || {
            let (kind, pp, v, m) = shape;
            // generated schedules by their (truncated) length: many m truncate to the same one
            let generate = |len: u64| {
                generated.get_or((kind, pp, v, len), || {
                    kind.generated_peak_inflight(pp, v, len)
                })
            };
            kind.peak_inflight_with(pp, v, m, &generate)
        })
    };

    // A lower bound on each key's closed-form time, whatever its split: the work spread
    // perfectly over the ranks, plus the fill of perfectly even stages.
    let mut bounded: Vec<(f64, Key)> = keys
        .iter()
        .filter_map(|k| {
            let table = tables.get(&group_of(k))?;
            Some((lower_bound_s(k, table, opts), *k))
        })
        .collect();
    bounded.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));

    // Score in bound order until no later key can enter the shortlist.
    let shortlist = (4 * opts.top_k).max(24);
    let inflight_of_key = |k: &Key| inflight_of(shape_of(k, opts));
    let scored = scan::Scan {
        model,
        profile,
        opts,
        tables: &tables,
        inflight_of: &inflight_of_key,
        shortlist,
    }
    .run(&bounded, progress);
    let mut fitting: Vec<&Scored> = scored.iter().filter(|s| s.fits).collect();
    fitting.sort_by(|a, b| a.approx_s.total_cmp(&b.approx_s).then(a.key.cmp(&b.key)));
    if fitting.is_empty() {
        return Err(nothing_fits(model, profile, opts, &keys));
    }
    // The shortlist: the overall best, then each kind's best not already in.
    let mut chosen: Vec<&Scored> = fitting.iter().take(shortlist).copied().collect();
    let mut per_kind_count: HashMap<schedule::ScheduleKind, usize> = HashMap::new();
    for s in &chosen {
        *per_kind_count.entry(s.key.schedule).or_default() += 1;
    }
    for s in fitting.iter().skip(shortlist) {
        let count = per_kind_count.entry(s.key.schedule).or_default();
        if *count < PER_KIND {
            *count += 1;
            chosen.push(s);
        }
    }

    // Simulate the shortlist exactly: first each configuration with its DP split (or the even
    // split when only that is allowed), then, for the fastest few, the even split and the split
    // that isolates embedding and head as well.
    let first_split = |s: &Scored| -> Option<Vec<usize>> {
        if opts.even_split_only {
            None
        } else {
            Some(s.split.clone())
        }
    };
    // The integer program, for the fastest few partial-recompute candidates near the front (by
    // closed form): their split and recompute counts chosen jointly, under each rank's whole
    // budget, replace the DP's when they simulate faster. Solves run beside the simulations.
    let front_s = chosen
        .iter()
        .map(|s| s.approx_s)
        .fold(f64::INFINITY, f64::min)
        * GIVE_UP_FACTOR;
    let to_solve: Vec<usize> = chosen
        .iter()
        .enumerate()
        .filter(|(_, s)| s.key.partial_recompute && s.key.pp <= PARTIAL_SOLVED_MAX_PP)
        .take(PARTIAL_SOLVED)
        .filter(|(_, s)| s.approx_s <= front_s)
        .map(|(i, _)| i)
        .collect();
    // (candidate, solve its integer program): the solves, which take longest, first
    let tasks: Vec<(usize, bool)> = to_solve
        .iter()
        .map(|&i| (i, true))
        .chain((0..chosen.len()).map(|i| (i, false)))
        .collect();
    let results: Vec<(usize, Option<Estimate>)> = tasks
        .par_iter()
        // one task per split: simulations and solves differ in length by 100×
        .with_max_len(1)
        .map(|&(i, solve)| {
            let s = chosen[i];
            let table = &tables[&group_of(&s.key)];
            let e = if solve {
                inflight_of(shape_of(&s.key, opts))
                    .and_then(|q| solve_partial(profile, opts, &s.key, table, &q))
                    .and_then(|(split, layers)| {
                        eval.time_and_memory(&s.key, table, Some(split), Some(layers))
                    })
            } else if s.key.partial_recompute {
                let layers = s.recompute_layers.clone();
                eval.time_and_memory(&s.key, table, Some(s.split.clone()), layers)
            } else {
                eval.time_and_memory(&s.key, table, first_split(s), None)
            };
            (i, e.filter(|e| e.result.predicted.fits))
        })
        .collect();
    let mut simulated = results.len();
    let mut tiered: Vec<(Option<Estimate>, &Scored)> = chosen.iter().map(|s| (None, *s)).collect();
    for (i, e) in results {
        let slot = &mut tiered[i].0;
        if e.as_ref()
            .is_some_and(|e| slot.as_ref().is_none_or(|d| time_of(e) < time_of(d)))
        {
            *slot = e;
        }
    }
    tiered.sort_by(|a, b| {
        let t = |x: &Option<Estimate>| x.as_ref().map_or(f64::INFINITY, time_of);
        t(&a.0).total_cmp(&t(&b.0)).then(a.1.key.cmp(&b.1.key))
    });
    if !opts.even_split_only {
        let extra: Vec<Option<Estimate>> = tiered
            .par_iter()
            .take(SECOND_TIER)
            .with_max_len(1)
            .map(|(first, s)| {
                let table = &tables[&group_of(&s.key)];
                if s.key.partial_recompute {
                    // its split goes with its recompute counts
                    return first.clone();
                }
                let even = split::default_split(&layer_kinds(&table.layers), s.split.len()).ok();
                let mut others: Vec<Vec<usize>> = even.into_iter().collect();
                if let Some(isolated) = refine::isolate_ends(&table.layers, &s.split) {
                    others.push(isolated);
                }
                others.retain(|o| *o != s.split);
                others.dedup();
                others
                    .into_iter()
                    .filter_map(|o| eval.time_and_memory(&s.key, table, Some(o), None))
                    .chain(first.clone())
                    .filter(|e| e.result.predicted.fits)
                    .min_by(|a, b| time_of(a).total_cmp(&time_of(b)))
            })
            .collect();
        simulated += 2 * extra.len();
        for (slot, better) in tiered.iter_mut().zip(extra) {
            slot.0 = better;
        }
    }
    let mut exact: Vec<Estimate> = tiered.into_iter().filter_map(|(e, _)| e).collect();
    exact.sort_by(rank_cmp);
    if exact.is_empty() {
        return Err(nothing_fits(model, profile, opts, &keys));
    }

    // Refine the leaders' splits by moving layers across stage boundaries.
    let leaders = if opts.even_split_only {
        0
    } else {
        exact.len().min(refine::REFINED_LEADERS)
    };
    // one leader per configuration: the fastest split of each
    let mut seen = std::collections::HashSet::new();
    exact.retain(|e| seen.insert(key_of(e)));
    let leaders = leaders.min(exact.len());
    let refined: Vec<(Estimate, usize)> = exact[..leaders]
        .par_iter()
        .with_max_len(1)
        .map(|est| refine::refine(&eval, est, &tables[&group_of(&key_of(est))]))
        .collect();
    for (slot, (better, n)) in exact.iter_mut().zip(refined) {
        simulated += n;
        *slot = better;
    }
    exact.sort_by(rank_cmp);

    let mut exact = exact.into_iter();
    let best = exact
        .next()
        .ok_or_else(|| nothing_fits(model, profile, opts, &keys))?;
    let alternatives: Vec<Estimate> = exact.take(opts.top_k).collect();
    // The answers in full detail (the breakdown separates sends from the bubble).
    let full = |e: &Estimate| -> Result<Estimate, PlanError> {
        let key = key_of(e);
        eval.again(e, &tables[&group_of(&key)], Detail::Breakdown)
            .ok_or_else(|| {
                PlanError::Schedule(format!("internal: the plan {key:?} no longer evaluates"))
            })
    };
    let mut answers = std::iter::once(&best)
        .chain(&alternatives)
        .collect::<Vec<_>>()
        .par_iter()
        .with_max_len(1)
        .map(|e| full(e))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter();
    let best = answers
        .next()
        .ok_or_else(|| PlanError::Schedule("internal: the best plan was lost".into()))?;
    let alternatives: Vec<Estimate> = answers.collect();

    // What more memory would buy: the fastest non-fitting candidate that beats the best.
    let best_time = time_of(&best);
    // Only configurations within twice the GPU's memory count: a bigger GPU, not a fantasy.
    let capacity = profile.cluster.gpu.memory_bytes;
    let mut unfit: Vec<&Scored> = scored
        .iter()
        .filter(|s| !s.fits && s.approx_s < best_time)
        .collect();
    unfit.sort_by(|a, b| a.approx_s.total_cmp(&b.approx_s).then(a.key.cmp(&b.key)));
    let tried: Vec<Option<Estimate>> = unfit
        .iter()
        .take(UNFIT_TRIED)
        .collect::<Vec<_>>()
        .par_iter()
        .with_max_len(1)
        .map(|s| {
            let table = tables.get(&group_of(&s.key))?;
            eval.time_and_memory(
                &s.key,
                table,
                Some(s.split.clone()),
                s.recompute_layers.clone(),
            )
        })
        .collect();
    let fastest_unfit = tried
        .into_iter()
        .flatten()
        .find(|e| time_of(e) < best_time && e.result.predicted.peak_memory_bytes <= 2 * capacity)
        .and_then(|e| eval.again(&e, &tables[&group_of(&key_of(&e))], Detail::Breakdown));
    Ok(SearchResult {
        best,
        alternatives,
        fastest_unfit,
        candidates: keys.len(),
        simulated,
        elapsed_s: start.elapsed().as_secs_f64(),
    })
}

fn time_of(e: &Estimate) -> f64 {
    e.result.predicted.iteration_time_s
}

/// The planner's order: faster first; on equal time, less peak memory; then the fixed order of
/// the configuration's fields.
fn rank_cmp(a: &Estimate, b: &Estimate) -> std::cmp::Ordering {
    time_of(a)
        .total_cmp(&time_of(b))
        .then(
            a.result
                .predicted
                .peak_memory_bytes
                .cmp(&b.result.predicted.peak_memory_bytes),
        )
        .then(key_of(a).cmp(&key_of(b)))
}

/// The search key of an evaluated plan.
pub fn key_of(e: &Estimate) -> Key {
    let p = &e.result.plan;
    Key {
        tp: p.tp,
        pp: p.pp,
        dp: p.dp,
        cp: p.cp,
        virtual_stages: p.virtual_stages,
        micro_batch_size: p.micro_batch_size,
        schedule: p
            .schedule
            .parse()
            .unwrap_or(schedule::ScheduleKind::OneFOneB),
        recompute: p.recompute.parse().unwrap_or(Recompute::None),
        partial_recompute: evaluator::choice_of(e).1.is_some(),
        sequence_parallel: p.sequence_parallel,
        zero_stage: p.zero_stage,
    }
}

type GroupKey = (u64, u64, u64, bool);

fn group_of(k: &Key) -> GroupKey {
    (k.tp, k.cp, k.micro_batch_size, k.sequence_parallel)
}

/// Per-layer costs for a key's sharding under every recompute mode.
fn layer_table(
    model: &Model,
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    key: &Key,
) -> Result<LayerTable, PlanError> {
    let c = config_of(key, opts, None);
    let layers = model.layers(&shard_spec(&c))?;
    let layout = Layout {
        tp: key.tp,
        cp: key.cp,
        dp: key.dp,
        pp: key.pp,
    };
    let cluster = &profile.cluster;
    let singles: Vec<[usize; 2]> = (0..layers.len()).map(|i| [i, i]).collect();
    let cp_kv_bytes = match model {
        Model::Transformer(t) if key.cp > 1 => {
            let tokens = key.micro_batch_size * t.seq_length / key.cp;
            2 * tokens * t.kv_width() * opts.precision.bytes() / key.tp
        }
        _ => 0,
    };
    let per_mode: Vec<Vec<StageCost>> = Recompute::ALL
        .iter()
        .map(|&mode| {
            let ctx = StageContext {
                profile,
                tp: key.tp,
                tp_link: cluster.group_link(key.tp, layout.tp_stride()),
                recompute: mode,
                cp: key.cp,
                cp_link: cluster.group_link(key.cp, layout.cp_stride()),
                cp_kv_bytes,
            };
            stages::stage_costs(&layers, &singles, &ctx)
        })
        .collect();
    let sums_with = |held: fn(&StageCost) -> u64| -> Vec<LayerSums> {
        per_mode
            .iter()
            .map(|costs: &Vec<StageCost>| {
                let time: Vec<f64> = costs
                    .iter()
                    .map(|c| c.forward_s() + c.backward_s())
                    .collect();
                let params: Vec<f64> = costs.iter().map(|c| c.params as f64).collect();
                let act: Vec<f64> = costs.iter().map(|c| held(c) as f64).collect();
                LayerSums::new(&time, &params, &act)
            })
            .collect()
    };
    let sums = sums_with(|c| c.activation_bytes);
    let split_sums = sums_with(|c| c.activation_bytes.max(c.weight_grad_bytes));
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
    let total_s = per_mode
        .iter()
        .map(|costs| {
            costs.iter().fold((0.0, 0.0), |(fb, f), c| {
                (fb + c.forward_s() + c.backward_s(), f + c.forward_s())
            })
        })
        .collect();
    let params = per_mode[0].iter().map(|c| c.params).sum();
    Ok(LayerTable {
        layers,
        per_mode,
        partial,
        sums,
        split_sums,
        free_bottleneck: Default::default(),
        total_s,
        params,
    })
}

/// A schedule kind whose closed-form times are all over this factor × the best does not get its
/// quota in the shortlist.
pub(crate) const GIVE_UP_FACTOR: f64 = 1.05;

/// Candidates of each schedule kind that the shortlist holds at least (see [`search`]).
pub(crate) const PER_KIND: usize = 6;

/// Shortlisted partial-recompute configurations (the fastest by closed form, and only those
/// within [`GIVE_UP_FACTOR`] of the shortlist's fastest closed form) whose split and recompute
/// counts the integer program chooses (the others keep the DP's); each solve takes up to a few
/// milliseconds, beside the simulations.
const PARTIAL_SOLVED: usize = 4;
/// Pipelines longer than this keep the DP's partial recompute: the integer program's branch
/// and bound grows too slow for the planner's budget (`microlp` needs seconds at 32 ranks).
const PARTIAL_SOLVED_MAX_PP: u64 = 16;

/// Shortlisted configurations that also try the even and the end-isolating splits.
const SECOND_TIER: usize = 8;

/// Non-fitting candidates evaluated to say what more memory would buy.
const UNFIT_TRIED: usize = 8;

/// The schedule shape of a key.
fn shape_of(k: &Key, opts: &SearchOptions) -> ScheduleShape {
    let m = opts.global_batch_size / (k.dp * k.micro_batch_size);
    (k.schedule, k.pp, k.virtual_stages, m)
}

/// The kinds of a layer list.
fn layer_kinds(layers: &[LayerCost]) -> Vec<autopp_models::LayerKind> {
    layers.iter().map(|l| l.kind).collect()
}
