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

pub mod experts;
pub mod explain;
pub mod inflight;
pub mod space;
pub mod split_dp;

use std::collections::HashMap;
use std::time::Instant;

use autopp_models::{LayerCost, Model, Recompute};
use autopp_profiler::{AnalyticProfile, Layout, Precision};
use rayon::prelude::*;

use crate::config::{ParallelConfig, PlanError};
use crate::estimate::{
    check_config, dp_comm_time_s, evaluate_layers, evaluate_layers_with, optimizer_time_s,
    shard_spec, Detail, Estimate,
};
use crate::memory::{self, NCCL_BUFFER_BYTES_PER_GROUP};
use crate::schedule;
use crate::split;
use crate::stages::{self, StageContext, StageCost};

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
    approx_s: f64,
    fits: bool,
}

/// Per-layer costs for one layer sharding, under each recompute mode.
struct LayerTable {
    layers: Vec<LayerCost>,
    /// Per recompute mode (index as in `Recompute::ALL`): per-layer stage costs.
    per_mode: Vec<Vec<StageCost>>,
}

fn mode_index(mode: Recompute) -> usize {
    Recompute::ALL.iter().position(|&m| m == mode).unwrap_or(0)
}

/// The configuration a key describes.
pub fn config_of(key: &Key, opts: &SearchOptions, split: Option<Vec<usize>>) -> ParallelConfig {
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
    let inflight_of = |shape: ScheduleShape| -> Option<Vec<u32>> {
        if let Some(found) = inflight.lock().ok()?.get(&shape) {
            return found.clone();
        }
        let (kind, pp, v, m) = shape;
        let counts = inflight::peak_inflight(kind, pp, v, m);
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
                score(profile, opts, key, table, &inflight, shape.3)
            })
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
    let mut tiered: Vec<(Option<Estimate>, &Scored)> = chosen
        .par_iter()
        .map(|s| {
            let table = &tables[&group_of(&s.key)];
            let e = evaluate_split(model, profile, opts, &s.key, table, first_split(s))
                .filter(|e| e.result.predicted.fits);
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
                let even = split::default_split(&layer_kinds(&table.layers), s.split.len()).ok();
                let mut others: Vec<Vec<usize>> = even.into_iter().collect();
                if let Some(isolated) = isolate_ends(&table.layers, &s.split) {
                    others.push(isolated);
                }
                others.retain(|o| *o != s.split);
                others.dedup();
                others
                    .into_iter()
                    .filter_map(|o| evaluate_split(model, profile, opts, &s.key, table, Some(o)))
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
        exact.len().min(REFINED_LEADERS)
    };
    // one leader per configuration: the fastest split of each
    let mut seen = std::collections::HashSet::new();
    exact.retain(|e| seen.insert(key_of(e)));
    let leaders = leaders.min(exact.len());
    let refined: Vec<(Estimate, usize)> = exact[..leaders]
        .par_iter()
        .map(|est| refine(model, profile, opts, est, &tables[&group_of(&key_of(est))]))
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
        let split = e
            .stages
            .iter()
            .map(|s| s.layers[1] - s.layers[0] + 1)
            .collect();
        let table = &tables[&group_of(&key)];
        evaluate_layers(
            model,
            profile,
            &config_of(&key, opts, Some(split)),
            &table.layers,
        )
    };
    let best = full(&best)?;
    let alternatives = alternatives
        .par_iter()
        .map(full)
        .collect::<Result<Vec<_>, _>>()?;

    // What more memory would buy: the fastest non-fitting candidate that beats the best.
    let best_time = time_of(&best);
    // Only configurations within twice the GPU's memory count: a bigger GPU, not a fantasy.
    let capacity = profile.cluster.gpu.memory_bytes;
    let mut unfit: Vec<&Scored> = scored
        .iter()
        .filter(|s| !s.fits && s.approx_s < best_time)
        .collect();
    unfit.sort_by(|a, b| a.approx_s.total_cmp(&b.approx_s).then(a.key.cmp(&b.key)));
    let fastest_unfit = unfit
        .iter()
        .take(UNFIT_TRIED)
        .filter_map(|s| {
            let table = tables.get(&group_of(&s.key))?;
            let c = config_of(&s.key, opts, Some(s.split.clone()));
            evaluate_layers(model, profile, &c, &table.layers).ok()
        })
        .find(|e| time_of(e) < best_time && e.result.predicted.peak_memory_bytes <= 2 * capacity);

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
        sequence_parallel: p.sequence_parallel,
        zero_stage: p.zero_stage,
    }
}

type GroupKey = (u64, u64, u64, bool);

/// A schedule's shape: kind, pipeline ranks, stages per rank, micro-batches.
type ScheduleShape = (schedule::ScheduleKind, u64, u64, u64);

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
    let per_mode = Recompute::ALL
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
    Ok(LayerTable { layers, per_mode })
}

/// A schedule kind whose closed-form times are all over this factor × the best does not get its
/// quota in the shortlist.
const GIVE_UP_FACTOR: f64 = 1.3;

/// Candidates of each schedule kind that the shortlist holds at least (see [`search`]).
const PER_KIND: usize = 6;

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

/// The DP split and closed-form time of one key.
fn score(
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    key: &Key,
    table: &LayerTable,
    inflight: &[u32],
    m: u64,
) -> Option<Scored> {
    let costs = &table.per_mode[mode_index(key.recompute)];
    let n = costs.len();
    let pp = key.pp as usize;
    let v = key.virtual_stages as usize;
    let s = pp * v;
    if n < s {
        return None;
    }
    let shard = key.dp * key.cp;
    let per_param = state_bytes_per_param(key.zero_stage, shard);
    let time: Vec<f64> = costs
        .iter()
        .map(|c| c.forward_s() + c.backward_s())
        .collect();
    let fixed: Vec<f64> = costs.iter().map(|c| c.params as f64 * per_param).collect();
    // A split backward holds a pair's activations until its I, then what its W needs until the
    // W: per in-flight pair, at most the larger of the two.
    let act: Vec<f64> = costs
        .iter()
        .map(|c| {
            if key.schedule.splits_backward() {
                c.activation_bytes.max(c.weight_grad_bytes) as f64
            } else {
                c.activation_bytes as f64
            }
        })
        .collect();
    let sums = LayerSums::new(&time, &fixed, &act);
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
    let rank_budget = capacity
        - opts.memory_reserve_bytes as f64
        - groups * NCCL_BUFFER_BYTES_PER_GROUP as f64
        - transient
        - p2p
        - zero3_gather;
    if rank_budget <= 0.0 {
        return None;
    }
    let tied: u64 = costs.iter().map(|c| c.tied_params).sum();
    let placement = key.schedule.placement();
    let budgets: Vec<StageBudget> = (0..s)
        .map(|k| {
            let r = placement.rank_of(k, pp);
            StageBudget {
                bytes: rank_budget / v as f64,
                inflight: inflight[r] as f64 / v as f64,
                extra_if_last_bytes: if pp > 1 { tied as f64 * per_param } else { 0.0 },
            }
        })
        .collect();
    let (split, fits) = match split_dp::best_split(&sums, &budgets) {
        Some((split, _)) => (split, true),
        // Does not fit: kept (with the even split) only to say what more memory would buy.
        None => (
            split::default_split(&layer_kinds(&table.layers), s).ok()?,
            false,
        ),
    };
    // Closed form: the busiest rank's work plus the pipeline fill and drain, plus the tail
    // (the same data-parallel and optimizer terms as `estimate`).
    let ranges = split::stage_ranges(&split);
    let stage_time: Vec<f64> = ranges.iter().map(|&[a, b]| sums.time_s(a, b)).collect();
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
    let layout = Layout {
        tp: key.tp,
        cp: key.cp,
        dp: key.dp,
        pp: key.pp,
    };
    let dp_link = profile
        .cluster
        .group_link(key.dp * key.cp, layout.tp_stride() * key.tp);
    let c = config_of(key, opts, None);
    let tail = rank_stages
        .iter()
        .map(|st| {
            dp_comm_time_s(profile, &c, st, &dp_link, m)
                + optimizer_time_s(profile, &c, memory::rank_params(st))
        })
        .fold(0.0, f64::max);
    Some(Scored {
        key: *key,
        split,
        approx_s: busiest + fill + tail,
        fits,
    })
}

/// The kinds of a layer list.
fn layer_kinds(layers: &[LayerCost]) -> Vec<autopp_models::LayerKind> {
    layers.iter().map(|l| l.kind).collect()
}

/// Evaluates a key with a split (`None`: the even split) through `estimate`'s code path.
fn evaluate_split(
    model: &Model,
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    key: &Key,
    table: &LayerTable,
    split: Option<Vec<usize>>,
) -> Option<Estimate> {
    let c = config_of(key, opts, split);
    evaluate_layers_with(model, profile, &c, &table.layers, Detail::TimeAndMemory).ok()
}

/// Plans (distinct configurations, fastest first) whose splits [`refine`] improves.
const REFINED_LEADERS: usize = 4;
/// A leader with at most this many possible splits has every one simulated.
const EXHAUSTIVE_SPLITS: u64 = 512;
/// Simulations [`refine`] may spend hill-climbing one plan.
const REFINE_BUDGET: usize = 160;
/// Schedule actions [`refine`] may simulate for one plan (bounds its time on long pipelines).
const REFINE_ACTION_BUDGET: u64 = 400_000;

/// `C(n, k)`, saturating.
fn binomial(n: u64, k: u64) -> u64 {
    let k = k.min(n - k.min(n));
    (0..k).fold(1u64, |acc, i| acc.saturating_mul(n - i) / (i + 1))
}

/// Improves a plan's split: when it has at most [`EXHAUSTIVE_SPLITS`] possible splits, the best
/// of all of them; otherwise hill-climbing — move one or two layers across one stage boundary at
/// a time while that makes the simulated iteration faster and still fits — within
/// [`REFINE_BUDGET`] simulations and [`REFINE_ACTION_BUDGET`] simulated actions. Returns the plan
/// and the simulations run.
fn refine(
    model: &Model,
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    est: &Estimate,
    table: &LayerTable,
) -> (Estimate, usize) {
    let key = key_of(est);
    let mut best = est.clone();
    let n = table.layers.len();
    let s = best.stages.len();
    let better = |e: &Estimate, than: &Estimate| {
        e.result.predicted.fits && time_of(e) < time_of(than) * (1.0 - 1e-9)
    };
    if binomial(n as u64 - 1, s as u64 - 1) <= EXHAUSTIVE_SPLITS {
        let splits = split::all_splits(n, s);
        let runs = splits.len();
        for split in splits {
            if let Some(e) = evaluate_split(model, profile, opts, &key, table, Some(split)) {
                if better(&e, &best) {
                    best = e;
                }
            }
        }
        return (best, runs);
    }
    let actions_per_run = 2 * est.schedule.num_actions().max(1) as u64;
    let budget = REFINE_BUDGET.min((REFINE_ACTION_BUDGET / actions_per_run) as usize);
    let mut counts: Vec<usize> = best
        .stages
        .iter()
        .map(|s| s.layers[1] - s.layers[0] + 1)
        .collect();
    let mut runs = 0;
    'rounds: loop {
        let mut improved = false;
        for boundary in 0..counts.len().saturating_sub(1) {
            for (from, to) in [(boundary, boundary + 1), (boundary + 1, boundary)] {
                for size in 1..=2 {
                    if counts[from] <= size {
                        continue;
                    }
                    if runs >= budget {
                        break 'rounds;
                    }
                    let mut trial = counts.clone();
                    trial[from] -= size;
                    trial[to] += size;
                    runs += 1;
                    let split = Some(trial.clone());
                    if let Some(e) = evaluate_split(model, profile, opts, &key, table, split) {
                        if better(&e, &best) {
                            best = e;
                            counts = trial;
                            improved = true;
                        }
                    }
                }
            }
        }
        if !improved {
            break;
        }
    }
    (best, runs)
}

/// A split with the embedding alone in the first stage and the head alone in the last, the
/// transformer layers spread evenly over the stages between (`E|t*4|t*4|L`): with several
/// stages per rank this often balances the ranks best. `None` when there are too few stages.
fn isolate_ends(layers: &[LayerCost], split: &[usize]) -> Option<Vec<usize>> {
    use autopp_models::LayerKind;
    let s = split.len();
    let n = layers.len();
    let ends =
        layers.first()?.kind == LayerKind::Embedding && layers.last()?.kind == LayerKind::Head;
    if !ends || s < 3 || n - 2 < s - 2 {
        return None;
    }
    let body = n - 2;
    let middle = s - 2;
    let mut out = vec![1; s];
    for (i, c) in out.iter_mut().enumerate().skip(1).take(middle) {
        *c = body / middle + usize::from(i - 1 < body % middle);
    }
    Some(out)
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
