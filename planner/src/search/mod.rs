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

mod evaluator;
pub mod experts;
pub mod explain;
pub mod inflight;
mod partial;
mod refine;
pub mod space;
pub mod split_dp;

use std::collections::HashMap;
use std::time::Instant;

use autopp_models::{LayerCost, Model, Recompute};
use autopp_profiler::{AnalyticProfile, Layout, Precision};
use rayon::prelude::*;

use crate::config::{ParallelConfig, PlanError};
use crate::estimate::{
    check_config, dp_comm_time_s, evaluate_layers_with, optimizer_time_s, shard_spec, Detail,
    Estimate,
};
use crate::memory::{self, NCCL_BUFFER_BYTES_PER_GROUP};
use crate::schedule;
use crate::split;
use crate::stages::{self, StageContext, StageCost};

use evaluator::{Evaluator, ScheduleShape};
pub use partial::IlpSolver;
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
    free_bottleneck: std::sync::Mutex<HashMap<(usize, usize), Option<f64>>>,
}

impl LayerTable {
    /// The smallest per-micro-batch bottleneck of any split of the layers into `stages`
    /// stages under `mode` (index into `Recompute::ALL`), memory unlimited.
    fn free_bottleneck_s(&self, mode: usize, stages: usize) -> Option<f64> {
        if let Some(found) = self.free_bottleneck.lock().ok()?.get(&(mode, stages)) {
            return *found;
        }
        let sums = &self.sums[mode];
        let best = split_dp::best_split_with(
            sums.len(),
            stages,
            |_, _, _| true,
            |_, a, b| sums.time_s(a, b),
        )
        .map(|b| b.1);
        self.free_bottleneck
            .lock()
            .ok()?
            .insert((mode, stages), best);
        best
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
    let inflight: std::sync::Mutex<HashMap<ScheduleShape, Option<Vec<u32>>>> =
        std::sync::Mutex::new(HashMap::new());
    let generated: std::sync::Mutex<HashMap<ScheduleShape, Option<Vec<u32>>>> =
        std::sync::Mutex::new(HashMap::new());
    let inflight_of = |shape: ScheduleShape| -> Option<Vec<u32>> {
        if let Some(found) = inflight.lock().ok()?.get(&shape) {
            return found.clone();
        }
        let (kind, pp, v, m) = shape;
        // generated schedules by their (truncated) length: many m truncate to the same one
        let generate = |len: u64| -> Option<Vec<u32>> {
            let key = (kind, pp, v, len);
            if let Some(found) = generated.lock().ok()?.get(&key) {
                return found.clone();
            }
            let counts = inflight::generated(kind, pp, v, len);
            generated.lock().ok()?.insert(key, counts.clone());
            counts
        };
        let counts = inflight::peak_inflight_with(kind, pp, v, m, &generate);
        inflight.lock().ok()?.insert(shape, counts.clone());
        counts
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

    // Score in bound order, a fixed-size chunk at a time, until no later key can enter the
    // shortlist: the overall best few, and the best few of each schedule kind (the closed form's
    // error depends on the schedule, so kinds are compared by simulation, not by it). Kinds
    // whose candidates are all over GIVE_UP_FACTOR × the best do not hold the search up. Chunks are fixed,
    // so the keys scored do not depend on the thread count.
    let shortlist = (4 * opts.top_k).max(24);
    let total = bounded.len();
    let mut scored: Vec<Scored> = Vec::new();
    let mut fit_times: Vec<f64> = Vec::new();
    let mut kind_times: HashMap<schedule::ScheduleKind, Vec<f64>> = HashMap::new();
    for (i, chunk) in bounded.chunks(SCORE_CHUNK).enumerate() {
        if fit_times.len() >= shortlist {
            let overall = fit_times[shortlist - 1];
            let give_up = GIVE_UP_FACTOR * fit_times[0];
            let per_kind = opts
                .limits
                .schedules
                .iter()
                .map(|k| match kind_times.get(k) {
                    Some(t) if t.len() >= PER_KIND => t[PER_KIND - 1],
                    _ => give_up,
                })
                .fold(overall, f64::max)
                .min(give_up.max(overall));
            if chunk[0].0 > per_kind {
                break;
            }
        }
        let part: Vec<Scored> = chunk
            .par_iter()
            .filter_map(|(_, key)| {
                let shape = shape_of(key, opts);
                let table = &tables[&group_of(key)];
                if below_memory_floor(profile, opts, key, table) {
                    return None;
                }
                check_config(model, profile, &config_of(key, opts, None)).ok()?;
                let inflight = inflight_of(shape)?;
                Some(score(profile, opts, key, table, &inflight, shape.3))
            })
            .flatten()
            .collect();
        for s in part.iter().filter(|s| s.fits) {
            fit_times.push(s.approx_s);
            kind_times
                .entry(s.key.schedule)
                .or_default()
                .push(s.approx_s);
        }
        fit_times.sort_by(f64::total_cmp);
        for t in kind_times.values_mut() {
            t.sort_by(f64::total_cmp);
        }
        scored.extend(part);
        progress(((i + 1) * SCORE_CHUNK).min(total), total);
    }
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
    // the integer program for the fastest few partial-recompute candidates (by closed form)
    let solved: std::collections::HashSet<Key> = chosen
        .iter()
        .filter(|s| s.key.partial_recompute && s.key.pp <= PARTIAL_SOLVED_MAX_PP)
        .take(PARTIAL_SOLVED)
        .map(|s| s.key)
        .collect();
    let mut tiered: Vec<(Option<Estimate>, &Scored)> = chosen
        .par_iter()
        .map(|s| {
            let table = &tables[&group_of(&s.key)];
            let e = if solved.contains(&s.key) {
                // the split and the recompute counts, jointly, under each rank's whole budget
                let inflight = inflight_of(shape_of(&s.key, opts));
                let answer = inflight.and_then(|q| solve_partial(profile, opts, &s.key, table, &q));
                match answer {
                    Some((split, layers)) => {
                        eval.time_and_memory(&s.key, table, Some(split), Some(layers))
                    }
                    None => None,
                }
                .filter(|e| e.result.predicted.fits)
                .or_else(|| {
                    let layers = s.recompute_layers.clone();
                    eval.time_and_memory(&s.key, table, Some(s.split.clone()), layers)
                })
            } else if s.key.partial_recompute {
                let layers = s.recompute_layers.clone();
                eval.time_and_memory(&s.key, table, Some(s.split.clone()), layers)
            } else {
                eval.time_and_memory(&s.key, table, first_split(s), None)
            };
            let e = e.filter(|e| e.result.predicted.fits);
            (e, *s)
        })
        .collect();
    tiered.sort_by(|a, b| {
        let t = |x: &Option<Estimate>| x.as_ref().map_or(f64::INFINITY, time_of);
        t(&a.0).total_cmp(&t(&b.0)).then(a.1.key.cmp(&b.1.key))
    });
    let mut simulated = chosen.len();
    if !opts.even_split_only {
        let extra: Vec<Option<Estimate>> = tiered
            .par_iter()
            .take(SECOND_TIER)
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
    Ok(LayerTable {
        layers,
        per_mode,
        partial,
        sums,
        split_sums,
        free_bottleneck: Default::default(),
    })
}

/// A schedule kind whose closed-form times are all over this factor × the best does not get its
/// quota in the shortlist.
const GIVE_UP_FACTOR: f64 = 1.05;

/// Candidates of each schedule kind that the shortlist holds at least (see [`search`]).
const PER_KIND: usize = 6;

/// Shortlisted partial-recompute configurations whose split and recompute counts the integer
/// program chooses (the others keep the DP's); each solve takes up to tens of milliseconds.
const PARTIAL_SOLVED: usize = 4;
/// Pipelines longer than this keep the DP's partial recompute: the integer program's branch
/// and bound grows too slow for the planner's budget (`microlp` needs seconds at 32 ranks).
const PARTIAL_SOLVED_MAX_PP: u64 = 16;

/// Shortlisted configurations that also try the even and the end-isolating splits.
const SECOND_TIER: usize = 8;

/// Non-fitting candidates evaluated to say what more memory would buy.
const UNFIT_TRIED: usize = 8;

/// Keys scored per parallel chunk (see [`search`]).
const SCORE_CHUNK: usize = 256;

/// The schedule shape of a key.
fn shape_of(k: &Key, opts: &SearchOptions) -> ScheduleShape {
    let m = opts.global_batch_size / (k.dp * k.micro_batch_size);
    (k.schedule, k.pp, k.virtual_stages, m)
}

/// Whether a key cannot fit whatever its split: the model states of the busiest rank (at least
/// an even share of all layers' states) exceed the memory left after the reserve.
fn below_memory_floor(
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    key: &Key,
    table: &LayerTable,
) -> bool {
    let per_param = state_bytes_per_param(key.zero_stage, key.dp * key.cp);
    let params: u64 = table.per_mode[0].iter().map(|c| c.params).sum();
    let floor = params as f64 * per_param / key.pp as f64;
    let usable = profile.cluster.gpu.memory_bytes as f64 - opts.memory_reserve_bytes as f64;
    floor > usable
}

/// A lower bound on [`score`]'s closed-form time for any split: with `T` the F+B seconds of
/// all layers for one micro-batch, the busiest rank does at least `m·T/pp` and the fill takes
/// at least `(pp−1)·T/(pp·v)` (`v` times that for looped BFS; for the split-backward schedules,
/// whose `W`s fill the drain, `(pp−1)·T_F/(pp·v)` with `T_F` the forward seconds alone).
fn lower_bound_s(k: &Key, table: &LayerTable, opts: &SearchOptions) -> f64 {
    let costs = &table.per_mode[mode_index(k.recompute)];
    let total: f64 = costs.iter().map(|c| c.forward_s() + c.backward_s()).sum();
    let (pp, v) = (k.pp as f64, k.virtual_stages as f64);
    let m = (opts.global_batch_size / (k.dp * k.micro_batch_size)) as f64;
    let fill = if k.schedule.splits_backward() {
        (pp - 1.0) * costs.iter().map(|c| c.forward_s()).sum::<f64>() / (pp * v)
    } else {
        (pp - 1.0) * total / (pp * v)
    };
    let fill = if k.schedule == schedule::ScheduleKind::LoopedBfs {
        fill * v
    } else {
        fill
    };
    m * total / pp + fill
}

/// The DP split and closed-form time of one key, and — where the framework runs it and
/// memory binds the split — of the same key with partial recompute (see [`partial`]).
fn score(
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    key: &Key,
    table: &LayerTable,
    inflight: &[u32],
    m: u64,
) -> Vec<Scored> {
    score_family(profile, opts, key, table, inflight, m).unwrap_or_default()
}

fn score_family(
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    key: &Key,
    table: &LayerTable,
    inflight: &[u32],
    m: u64,
) -> Option<Vec<Scored>> {
    let mode = mode_index(key.recompute);
    let costs = &table.per_mode[mode];
    let n = costs.len();
    let pp = key.pp as usize;
    let v = key.virtual_stages as usize;
    let s = pp * v;
    if n < s {
        return None;
    }
    let shard = key.dp * key.cp;
    let per_param = state_bytes_per_param(key.zero_stage, shard);
    // A split backward holds a pair's activations until its I, then what its W needs until
    // the W: per in-flight pair, at most the larger of the two.
    let sums = if key.schedule.splits_backward() {
        &table.split_sums[mode]
    } else {
        &table.sums[mode]
    };
    let rank_budget = rank_budget_bytes(profile, opts, key, costs)?;
    let tied: u64 = costs.iter().map(|c| c.tied_params).sum();
    let placement = key.schedule.placement();
    // With one stage per rank a stage's budget is its rank's, exactly, and the allocator's
    // fragmentation of the dynamic memory (activations, the backward's working set) is
    // counted as evaluation counts it. With several, each stage gets an equal share of the
    // rank's budget — which can reject splits that fit — and the fragmentation is left out
    // as slack. Either way every candidate's memory is checked exactly when simulated.
    let (dynamic, transient_frag) = if v == 1 {
        let transient = costs.iter().map(|c| c.transient_bytes).max().unwrap_or(0) as f64;
        (
            1.0 + memory::FRAGMENTATION,
            transient * memory::FRAGMENTATION,
        )
    } else {
        (1.0, 0.0)
    };
    // The sums hold parameters, not model-state bytes: every term of a stage's memory
    // inequality is divided by the bytes per parameter.
    let budgets: Vec<StageBudget> = (0..s)
        .map(|k| {
            let r = placement.rank_of(k, pp);
            StageBudget {
                bytes: (rank_budget - transient_frag) / v as f64 / per_param,
                inflight: inflight[r] as f64 * dynamic / v as f64 / per_param,
                extra_if_last_bytes: if pp > 1 { tied as f64 } else { 0.0 },
            }
        })
        .collect();
    let base = if split_dp::any_split_fits(sums, &budgets) {
        split_dp::best_split(sums, &budgets)
    } else {
        None
    };

    // The closed form of a split: the busiest rank's work plus the pipeline fill and drain,
    // plus the tail (the same data-parallel and optimizer terms as `estimate`).
    let c = config_of(key, opts, None);
    let layout = Layout {
        tp: key.tp,
        cp: key.cp,
        dp: key.dp,
        pp: key.pp,
    };
    let dp_link = profile
        .cluster
        .group_link(key.dp * key.cp, layout.tp_stride() * key.tp);
    let closed_form = |split: &[usize], extra_s: &dyn Fn(usize, usize, usize) -> f64| -> f64 {
        let ranges = split::stage_ranges(split);
        let stage_time: Vec<f64> = ranges
            .iter()
            .enumerate()
            .map(|(k, &[a, b])| sums.time_s(a, b) + extra_s(k, a, b))
            .collect();
        let stages: Vec<StageCost> = ranges
            .iter()
            .map(|&[a, b]| stages::combine(&costs[a..=b]))
            .collect();
        let mut busy = vec![0.0; pp];
        let mut rank_stages: Vec<Vec<&StageCost>> = vec![Vec::new(); pp];
        for (k, st) in stages.iter().enumerate() {
            let r = placement.rank_of(k, pp);
            busy[r] += stage_time[k];
            rank_stages[r].push(st);
        }
        let busiest = busy.iter().cloned().fold(0.0, f64::max) * m as f64;
        let slowest_stage = stage_time.iter().cloned().fold(0.0, f64::max);
        let fill = match key.schedule {
            schedule::ScheduleKind::LoopedBfs => (pp - 1) as f64 * slowest_stage * v as f64,
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
                dp_comm_time_s(profile, &c, st, &dp_link, m)
                    + optimizer_time_s(profile, &c, memory::rank_params(st))
            })
            .fold(0.0, f64::max);
        busiest + fill + tail
    };

    let no_extra = |_: usize, _: usize, _: usize| 0.0;
    let (split, fits) = match &base {
        Some((split, _)) => (split.clone(), true),
        // Does not fit: kept (with the even split) only to say what more memory would buy.
        None => (
            split::default_split(&layer_kinds(&table.layers), s).ok()?,
            false,
        ),
    };
    let mut out = vec![Scored {
        key: *key,
        // a configuration that does not fit only says what more memory would buy: its lower
        // bound ranks it well enough, and costs far less than the closed form
        approx_s: if fits {
            closed_form(&split, &no_extra)
        } else {
            lower_bound_s(key, table, opts)
        },
        split,
        recompute_layers: None,
        fits,
    }];

    // Partial recompute, where the framework runs it and a pin does not forbid it.
    let fw = opts.limits.framework;
    let allowed = fw.partial_bases().contains(&key.recompute)
        && opts.fixed.recompute.is_none()
        && !key.schedule.splits_backward();
    let Some(part) = table.partial[mode].as_ref().filter(|_| allowed) else {
        return Some(out);
    };
    if let Some((_, bottleneck)) = base {
        // Partial recompute is for configurations memory binds: when the best split with no
        // layer recomputed is as good as the best split with memory unlimited, the
        // configuration without it covers it.
        let free = table.free_bottleneck_s(mode, s);
        if free.is_none_or(|f| bottleneck <= f * (1.0 + 1e-9)) {
            return Some(out);
        }
    }
    // every layer fully recomputed is the leanest a partial plan gets
    if !split_dp::any_split_fits(&table.sums[mode_index(Recompute::Full)], &budgets) {
        return Some(out);
    }
    // the fewest fully recomputed layers that make layers first..=last fit stage k
    let needed = |k: usize, first: usize, last: usize| -> Option<u64> {
        let b = &budgets[k];
        let extra = if last + 1 == n {
            b.extra_if_last_bytes
        } else {
            0.0
        };
        let over = sums.mem_bytes(first, last, b.inflight) + extra - b.bytes;
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
        return Some(out);
    }
    let Some((split, _)) =
        split_dp::best_split_with(n, s, fits, |k, a, b| sums.time_s(a, b) + extra_s(k, a, b))
    else {
        return Some(out);
    };
    let recompute_layers: Vec<u64> = split::stage_ranges(&split)
        .iter()
        .enumerate()
        .map(|(k, &[a, b])| needed(k, a, b).unwrap_or(0))
        .collect();
    if recompute_layers.iter().all(|&x| x == 0) {
        // nothing recomputed: the configuration without partial recompute is the same plan
        return Some(out);
    }
    out.push(Scored {
        key: Key {
            partial_recompute: true,
            ..*key
        },
        approx_s: closed_form(&split, &extra_s),
        split,
        recompute_layers: Some(recompute_layers),
        fits: true,
    });
    Some(out)
}

/// Bytes one rank has for its layers' model states and activations: the GPU's memory less the
/// reserve, the CUDA context, communication buffers and the backward's working set. `None`
/// when nothing is left.
fn rank_budget_bytes(
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    key: &Key,
    costs: &[StageCost],
) -> Option<f64> {
    let capacity = profile.cluster.gpu.memory_bytes as f64;
    let groups = [key.tp, key.cp, key.dp, key.pp]
        .iter()
        .filter(|&&d| d > 1)
        .count() as f64;
    let transient = costs.iter().map(|c| c.transient_bytes).max().unwrap_or(0) as f64;
    let p2p = 4.0 * costs.iter().map(|c| c.output_bytes).max().unwrap_or(0) as f64;
    let mut zero3_gather = 0.0;
    if key.zero_stage >= 3 {
        let largest = costs.iter().map(|c| c.max_layer_params).max().unwrap_or(0);
        zero3_gather = (2 * largest).min(memory::ZERO3_MAX_LIVE_PARAMS) as f64
            * memory::WEIGHT_BYTES_PER_PARAM as f64;
    }
    // The fixed terms of `memory::rank_memory` (its fragmentation is the caller's).
    let budget = capacity
        - opts.memory_reserve_bytes as f64
        - memory::CONTEXT_BYTES as f64
        - groups * NCCL_BUFFER_BYTES_PER_GROUP as f64
        - transient
        - p2p
        - zero3_gather;
    (budget > 0.0).then_some(budget)
}

/// The partial-recompute integer program for a shortlisted key (see [`partial::solve`]).
fn solve_partial(
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    key: &Key,
    table: &LayerTable,
    inflight: &[u32],
) -> Option<(Vec<usize>, Vec<u64>)> {
    let mode = mode_index(key.recompute);
    let part = table.partial[mode].as_ref()?;
    let costs = &table.per_mode[mode];
    let budget = rank_budget_bytes(profile, opts, key, costs)?;
    let per_param = state_bytes_per_param(key.zero_stage, key.dp * key.cp);
    let (pp, v) = (key.pp as usize, key.virtual_stages as usize);
    let placement = key.schedule.placement();
    let s = pp * v;
    let rank_of: Vec<usize> = (0..s).map(|k| placement.rank_of(k, pp)).collect();
    let n = costs.len();
    let time = |c: &StageCost| c.forward_s() + c.backward_s();
    let tied: u64 = costs.iter().map(|c| c.tied_params).sum();
    let mut ends = vec![(0.0, 0.0, 0.0); pp];
    for (k, c) in [(0, &costs[0]), (s - 1, &costs[n - 1])] {
        let e = &mut ends[rank_of[k]];
        e.0 += time(c);
        e.1 += c.params as f64 * per_param;
        e.2 += c.activation_bytes as f64;
    }
    if pp > 1 {
        ends[rank_of[s - 1]].1 += tied as f64 * per_param;
    }
    // Here the rank's whole budget binds exactly (no equal shares per stage), so the
    // allocator's fragmentation of the dynamic memory is counted: activations grow by it
    // through the in-flight counts, the backward's working set through the budget.
    let dynamic = 1.0 + memory::FRAGMENTATION;
    let inflight_per_stage: Vec<f64> = inflight
        .iter()
        .map(|&q| q as f64 * dynamic / v as f64)
        .collect();
    let transient = costs.iter().map(|c| c.transient_bytes).max().unwrap_or(0) as f64;
    let budgets = vec![budget - transient * memory::FRAGMENTATION; pp];
    let same_count = opts.limits.framework.partial_recompute()
        == crate::framework::PartialRecompute::SameCountPerStage;
    let answer = partial::solve(
        &partial::Problem {
            pp,
            virtual_stages: v,
            layer_time_s: time(&costs[1]),
            partial: part,
            layer_fixed_bytes: costs[1].params as f64 * per_param,
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

/// The kinds of a layer list.
fn layer_kinds(layers: &[LayerCost]) -> Vec<autopp_models::LayerKind> {
    layers.iter().map(|l| l.kind).collect()
}

/// The error when no configuration can even be formed: a batch too small for every
/// data-parallel degree, or pins and limits that exclude everything.
fn no_candidates(model: &Model, gpus: u64, opts: &SearchOptions) -> PlanError {
    // Every data-parallel degree divides the GPU count, so a batch of `gpus` sequences admits
    // all of them: the degrees possible with no batch constraint.
    let open = space::enumerate(model, gpus, gpus, &opts.limits, &opts.fixed);
    let mut dps: Vec<u64> = open.iter().map(|k| k.dp).collect();
    dps.sort_unstable();
    dps.dedup();
    match dps.first() {
        Some(&smallest) if opts.global_batch_size < smallest => PlanError::invalid(
            "--global-batch",
            format!(
                "{} sequences is smaller than the smallest data-parallel degree possible for {} on {gpus} GPUs ({smallest}): use a global batch of at least {smallest}, or fewer GPUs",
                opts.global_batch_size,
                model.name()
            ),
        ),
        Some(_) => PlanError::invalid(
            "--global-batch",
            format!(
                "{} is not divisible by any data-parallel degree possible here ({}): use a multiple of one of them",
                opts.global_batch_size,
                dps.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
            ),
        ),
        None => PlanError::invalid(
            "--fix",
            format!(
                "no configuration of {} on {gpus} GPUs satisfies the pins and limits: relax --fix, --schedules or --max-tp",
                model.name()
            ),
        ),
    }
}

/// The error when nothing fits: what the leanest configuration needs.
fn nothing_fits(
    model: &Model,
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    keys: &[Key],
) -> PlanError {
    let capacity = profile.cluster.gpu.memory_bytes;
    // Evaluate the configurations with the most sharding and recomputation; report the leanest.
    let mut lean: Vec<&Key> = keys.iter().collect();
    lean.sort_by_key(|k| {
        (
            std::cmp::Reverse(k.recompute),
            std::cmp::Reverse(k.zero_stage),
            std::cmp::Reverse(k.tp * k.pp),
            k.micro_batch_size,
            k.virtual_stages,
            **k,
        )
    });
    let leanest = lean
        .iter()
        .take(4)
        .filter_map(|k| {
            let c = config_of(k, opts, None);
            let layers = model.layers(&shard_spec(&c)).ok()?;
            evaluate_layers_with(model, profile, &c, &layers, Detail::TimeAndMemory).ok()
        })
        .min_by_key(|e| e.result.predicted.peak_memory_bytes);
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    match leanest {
        Some(e) => {
            let need = e.result.predicted.peak_memory_bytes;
            let p = &e.result.plan;
            let reserve = opts.memory_reserve_bytes;
            let usable = capacity.saturating_sub(reserve).max(1);
            let gpus = profile.cluster.num_gpus();
            let per_node = profile.cluster.gpus_per_node;
            let more = ((gpus as f64) * (need.saturating_sub(reserve)) as f64 / usable as f64)
                .ceil() as u64;
            let more = more.div_ceil(per_node) * per_node;
            PlanError::NothingFits(format!(
                "nothing fits: the leanest configuration (tp {} · pp {} · dp {}, micro-batch {}, recompute {}, ZeRO {}) needs {:.1} GiB per GPU but a {} has {:.1} GiB; use about {more} GPUs or more, GPUs with at least {:.0} GiB, or a smaller model",
                p.tp,
                p.pp,
                p.dp,
                p.micro_batch_size,
                p.recompute,
                p.zero_stage,
                gib(need),
                profile.cluster.gpu.name,
                gib(capacity),
                gib(need).ceil()
            ))
        }
        None => PlanError::NothingFits(format!(
            "nothing fits: no configuration of {} on {} GPUs can hold its model states; use more GPUs",
            model.name(),
            profile.cluster.num_gpus()
        )),
    }
}
