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

pub mod explain;
pub mod space;
pub mod split_dp;

use std::collections::HashMap;
use std::time::Instant;

use autopp_models::{LayerCost, Model, Recompute};
use autopp_profiler::{AnalyticProfile, Layout, Precision};
use rayon::prelude::*;

use crate::config::{ParallelConfig, PlanError};
use crate::estimate::{
    check_config, dp_comm_time_s, evaluate_layers, optimizer_time_s, shard_spec, Estimate,
};
use crate::memory::{self, NCCL_BUFFER_BYTES_PER_GROUP};
use crate::schedule::{self, ScheduleSpec};
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
        runtime: crate::config::Runtime::default(),
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

    // Each distinct schedule's in-flight counts, once.
    let mut shapes: Vec<ScheduleShape> = keys.iter().map(|k| shape_of(k, opts)).collect();
    shapes.sort_unstable();
    shapes.dedup();
    let inflight: HashMap<ScheduleShape, Option<Vec<u32>>> = shapes
        .par_iter()
        .map(|&(kind, pp, v, m)| {
            let counts = schedule::generate(&ScheduleSpec {
                kind,
                pp: pp as usize,
                virtual_stages: v as usize,
                num_microbatches: m as usize,
                group_size: None,
            })
            .ok()
            .map(|s| s.peak_inflight());
            ((kind, pp, v, m), counts)
        })
        .collect();

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
    // shortlist. Chunks are fixed, so the keys scored do not depend on the thread count.
    let shortlist = (4 * opts.top_k).max(24);
    let total = bounded.len();
    let mut scored: Vec<Scored> = Vec::new();
    let mut fit_times: Vec<f64> = Vec::new();
    for (i, chunk) in bounded.chunks(SCORE_CHUNK).enumerate() {
        if fit_times.len() >= shortlist {
            let cutoff = fit_times[shortlist - 1];
            if chunk[0].0 > cutoff {
                break;
            }
        }
        let part: Vec<Scored> = chunk
            .par_iter()
            .filter_map(|(_, key)| {
                let shape = shape_of(key, opts);
                let inflight = inflight.get(&shape)?.as_ref()?;
                check_config(model, profile, &config_of(key, opts, None)).ok()?;
                score(
                    profile,
                    opts,
                    key,
                    &tables[&group_of(key)],
                    inflight,
                    shape.3,
                )
            })
            .collect();
        fit_times.extend(part.iter().filter(|s| s.fits).map(|s| s.approx_s));
        fit_times.sort_by(f64::total_cmp);
        scored.extend(part);
        progress(((i + 1) * SCORE_CHUNK).min(total), total);
    }
    let mut fitting: Vec<&Scored> = scored.iter().filter(|s| s.fits).collect();
    fitting.sort_by(|a, b| a.approx_s.total_cmp(&b.approx_s).then(a.key.cmp(&b.key)));
    if fitting.is_empty() {
        return Err(nothing_fits(model, profile, opts, &scored));
    }

    // Simulate the best-ranked candidates exactly, with the DP split and the even split.
    let mut exact: Vec<Estimate> = fitting
        .par_iter()
        .take(shortlist)
        .map(|s| {
            let table = &tables[&group_of(&s.key)];
            let dp = evaluate_split(model, profile, opts, &s.key, table, Some(s.split.clone()));
            let even = evaluate_split(model, profile, opts, &s.key, table, None);
            let isolated = isolate_ends(&table.layers, &s.split)
                .and_then(|split| evaluate_split(model, profile, opts, &s.key, table, Some(split)));
            [dp, even, isolated]
                .into_iter()
                .flatten()
                .filter(|e| e.result.predicted.fits)
                .min_by(|a, b| time_of(a).total_cmp(&time_of(b)))
        })
        .collect::<Vec<Option<Estimate>>>()
        .into_iter()
        .flatten()
        .collect();
    let mut simulated = 3 * shortlist.min(fitting.len());
    exact.sort_by(|a, b| {
        time_of(a)
            .total_cmp(&time_of(b))
            .then(key_of(a).cmp(&key_of(b)))
    });
    if exact.is_empty() {
        return Err(nothing_fits(model, profile, opts, &scored));
    }

    // Refine the leaders' splits by moving layers across stage boundaries.
    let leaders = exact.len().min(REFINED_LEADERS);
    let refined: Vec<(Estimate, usize)> = exact[..leaders]
        .par_iter()
        .map(|est| refine(model, profile, opts, est, &tables[&group_of(&key_of(est))]))
        .collect();
    for (slot, (better, n)) in exact.iter_mut().zip(refined) {
        simulated += n;
        *slot = better;
    }
    exact.sort_by(|a, b| {
        time_of(a)
            .total_cmp(&time_of(b))
            .then(key_of(a).cmp(&key_of(b)))
    });

    let mut exact = exact.into_iter();
    let best = exact
        .next()
        .ok_or_else(|| nothing_fits(model, profile, opts, &scored))?;
    let alternatives: Vec<Estimate> = exact.take(opts.top_k).collect();

    // What more memory would buy: the fastest non-fitting candidate that beats the best.
    let best_time = time_of(&best);
    let fastest_unfit = scored
        .iter()
        .filter(|s| !s.fits && s.approx_s < best_time)
        .min_by(|a, b| a.approx_s.total_cmp(&b.approx_s).then(a.key.cmp(&b.key)))
        .and_then(|s| {
            let layers = model
                .layers(&shard_spec(&config_of(&s.key, opts, None)))
                .ok()?;
            let c = config_of(&s.key, opts, Some(s.split.clone()));
            evaluate_layers(model, profile, &c, &layers).ok()
        })
        .filter(|e| time_of(e) < best_time);

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

/// Keys scored per parallel chunk (see [`search`]).
const SCORE_CHUNK: usize = 256;

/// The schedule shape of a key.
fn shape_of(k: &Key, opts: &SearchOptions) -> ScheduleShape {
    let m = opts.global_batch_size / (k.dp * k.micro_batch_size);
    (k.schedule, k.pp, k.virtual_stages, m)
}

/// A lower bound on [`score`]'s closed-form time for any split: with `T` the F+B seconds of
/// all layers for one micro-batch, the busiest rank does at least `m·T/pp` and the fill takes
/// at least `(pp−1)·T/(pp·v)` (`v` times that for looped BFS).
fn lower_bound_s(k: &Key, table: &LayerTable, opts: &SearchOptions) -> f64 {
    let total: f64 = table.per_mode[mode_index(k.recompute)]
        .iter()
        .map(|c| c.forward_s() + c.backward_s())
        .sum();
    let (pp, v) = (k.pp as f64, k.virtual_stages as f64);
    let m = (opts.global_batch_size / (k.dp * k.micro_batch_size)) as f64;
    let fill = (pp - 1.0) * total / (pp * v);
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
    let act: Vec<f64> = costs.iter().map(|c| c.activation_bytes as f64).collect();
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
        zero3_gather = 2.0 * largest as f64 * memory::WEIGHT_BYTES_PER_PARAM as f64;
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
        None => {
            let open: Vec<StageBudget> = budgets
                .iter()
                .map(|b| StageBudget {
                    bytes: f64::INFINITY,
                    ..*b
                })
                .collect();
            (split_dp::best_split(&sums, &open)?.0, false)
        }
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
    evaluate_layers(model, profile, &c, &table.layers).ok()
}

/// Plans whose splits [`refine`] improves.
const REFINED_LEADERS: usize = 2;
/// Simulations [`refine`] may spend on one plan.
const REFINE_BUDGET: usize = 160;

/// Hill-climbs a plan's split: move one or two layers across one stage boundary at a time while
/// that makes the simulated iteration faster and still fits, within [`REFINE_BUDGET`]
/// simulations. Returns the plan and the simulations run.
fn refine(
    model: &Model,
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    est: &Estimate,
    table: &LayerTable,
) -> (Estimate, usize) {
    let key = key_of(est);
    let mut best = est.clone();
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
                    if runs >= REFINE_BUDGET {
                        break 'rounds;
                    }
                    let mut trial = counts.clone();
                    trial[from] -= size;
                    trial[to] += size;
                    runs += 1;
                    let split = Some(trial.clone());
                    if let Some(e) = evaluate_split(model, profile, opts, &key, table, split) {
                        if e.result.predicted.fits && time_of(&e) < time_of(&best) * (1.0 - 1e-9) {
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
    scored: &[Scored],
) -> PlanError {
    let capacity = profile.cluster.gpu.memory_bytes;
    // Evaluate the candidates with the most sharding and recomputation; report the leanest.
    let mut lean: Vec<&Scored> = scored.iter().collect();
    lean.sort_by_key(|s| {
        (
            std::cmp::Reverse(s.key.recompute),
            std::cmp::Reverse(s.key.zero_stage),
            std::cmp::Reverse(s.key.tp * s.key.pp),
            s.key.micro_batch_size,
            s.key,
        )
    });
    let leanest = lean
        .iter()
        .take(16)
        .filter_map(|s| {
            let c = config_of(&s.key, opts, Some(s.split.clone()));
            let layers = model.layers(&shard_spec(&c)).ok()?;
            evaluate_layers(model, profile, &c, &layers).ok()
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
