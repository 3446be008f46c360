//! The search: the fastest configuration and layer split that fits, in well under a second.
//!
//! [`search`] runs these phases (module `phases`), each reading the previous one's answer:
//!
//! 1. **Enumerate** every discrete configuration ([`space::enumerate`]): degrees, micro-batch
//!    size, schedule, stages per rank, recompute, sequence parallelism, ZeRO; and tabulate the
//!    layer costs once per layer sharding (tp, cp, micro-batch size, sequence parallelism).
//! 2. **Scan**, in parallel (`rayon`), in lower-bound order: each configuration's split comes
//!    from the dynamic program of [`split_dp`] under every stage's memory budget (which depends
//!    on its rank's in-flight micro-batches in that schedule), and a closed-form time ranks it.
//! 3. **Shortlist** the best-ranked candidates, and each schedule kind's best.
//! 4. **Simulate** them with [`crate::estimate::evaluate_scheduled`] — the same code path as
//!    `autopp estimate` — with the DP split (and the integer program's, for partial recompute),
//! 5. then the fastest few with Megatron's even split and the split that isolates the ends,
//! 6. and **refine** the winners' splits by moving single layers across stage boundaries.
//! 7. **Answer**: the best and the alternatives in full detail, and what more memory would buy.
//!
//! The result is deterministic for any thread count: candidates are ranked by (time, [`Key`]).

mod bounded;
mod budget;
mod ceiling;
mod errors;
mod evaluator;
pub mod explain;
mod fp8_gemms;
mod heap;
mod memo;
mod partial;
mod phases;
mod prune;
mod refine;
pub mod runnable;
mod scan;
mod score;
pub mod space;
pub mod split_dp;
mod table;
mod tail_floor;

use std::time::Instant;

use autopp_hardware::AnalyticProfile;
use autopp_models::Model;

use crate::config::{EvalSettings, ParallelConfig, PlanError};
use crate::estimate::{Detail, Estimate};
use crate::framework::Framework;
use crate::memory;
use crate::schedule::ScheduleKind;

pub use crate::pins::Fixed;
use ceiling::Ceiling;
use evaluator::{ScheduleShape, Schedules};
pub use partial::IlpSolver;
use phases::Search;
pub use runnable::{plans, Answer, Plans};
pub use space::{Key, SpaceLimits, DEFAULT_MAX_MICRO_BATCH_SIZE, DEFAULT_MAX_VIRTUAL_STAGES};

/// Alternatives reported besides the best unless told otherwise (`--top`).
/// The most sequences per GPU in a global batch the search takes on: beyond it every candidate
/// simulates hundreds of thousands of micro-batches (minutes), and no training run comes near
/// (a 4M-token batch of 64-token sequences on one GPU is 65,536).
pub const MAX_SEQUENCES_PER_GPU: u64 = 65_536;

pub const DEFAULT_TOP_K: usize = 5;

/// Plans within this fraction of the fastest count as equally fast, and the simplest of them
/// wins (`--tolerance`, 1%): closer than the model's own uncertainty, a simpler plan is the
/// safer bet.
pub const DEFAULT_TOLERANCE: f64 = 0.01;

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
    /// Plans within this fraction of the fastest count as equally fast; the simplest wins.
    pub tolerance: f64,
    /// Precision, memory headroom, attention kernel and framework runtime every candidate is
    /// evaluated under.
    pub settings: EvalSettings,
    /// Only Megatron's default even split (no uneven layouts): for frameworks that cannot lay
    /// stages out unevenly, and to measure what uneven splits buy.
    pub even_split_only: bool,
    /// The routing load every candidate is evaluated under: the busiest expert rank's tokens
    /// over the balanced share (`--moe-imbalance`, 1.0: forced balance).
    pub moe_imbalance: f64,
    /// The solver of the partial-recompute integer program.
    pub ilp_solver: IlpSolver,
    /// No pruning (the reference search of the tests): every key is scored, every fitting one
    /// simulated with every split the search tries and refined. Minutes on large cases.
    pub exhaustive: bool,
}

impl SearchOptions {
    /// `autopp plan`'s defaults for a plan that `framework` runs with `global_batch_size`
    /// sequences per iteration on nodes of `gpus_per_node` GPUs: the framework's space
    /// ([`SpaceLimits::new`]), no pins, [`DEFAULT_TOP_K`] alternatives, the default settings
    /// with the framework's runtime, uneven splits where the framework lays stages out unevenly,
    /// and the build's integer-program solver.
    pub fn new(framework: Framework, global_batch_size: u64, gpus_per_node: u64) -> Self {
        SearchOptions {
            global_batch_size,
            limits: SpaceLimits::new(framework, gpus_per_node),
            fixed: Fixed::default(),
            top_k: DEFAULT_TOP_K,
            tolerance: DEFAULT_TOLERANCE,
            settings: EvalSettings {
                runtime: framework.runtime(),
                ..EvalSettings::default()
            },
            even_split_only: !framework.uneven_layouts(),
            moe_imbalance: 1.0,
            ilp_solver: IlpSolver::of_build(),
            exhaustive: false,
        }
    }
}

/// What the search found.
#[derive(Debug, Clone)]
pub struct SearchResult {
    /// The fastest plan that fits.
    pub best: Estimate,
    /// The next fastest distinct configurations that fit, fastest first.
    pub alternatives: Vec<Estimate>,
    /// The fastest plan, when a simpler one within the tolerance was chosen over it.
    pub passed_over: Option<Estimate>,
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

impl Scored {
    /// Candidates by closed form, then key: a total order (keys are distinct).
    fn by_closed_form(a: &&Scored, b: &&Scored) -> std::cmp::Ordering {
        a.approx_s.total_cmp(&b.approx_s).then(a.key.cmp(&b.key))
    }

    /// The first `n` of `list` by [`Scored::by_closed_form`], in that order: a partial
    /// selection, then a sort of those alone.
    fn first_by_closed_form(mut list: Vec<&Scored>, n: usize) -> Vec<&Scored> {
        if list.len() > n {
            list.select_nth_unstable_by(n, Scored::by_closed_form);
            list.truncate(n);
        }
        list.sort_unstable_by(Scored::by_closed_form);
        list
    }
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
    ParallelConfig::new(key.degrees, key.micro_batch_size, opts.global_batch_size)
        .with_schedule(key.schedule)
        .with_recompute(key.recompute)
        .with_recompute_layers(recompute_layers)
        .with_sequence_parallel(key.sequence_parallel)
        .with_zero_stage(key.zero_stage)
        .with_split(split)
        .with_settings(opts.settings)
        .with_experts(crate::ExpertParallel {
            ep: key.ep,
            etp: key.etp,
            imbalance: opts.moe_imbalance,
        })
}

/// Model-state bytes per parameter on one GPU under a ZeRO stage sharded `shard` ways, with
/// the runtime's gradient precision ([`memory::model_state_bytes_for`]), or FSDP's sharded
/// fp32 states ([`memory::fsdp_state_bytes`]) where the stack runs ZeRO-3 as FSDP and `fsdp`
/// (the dense parameters: [`memory::rank_memory`] keeps routed experts out of FSDP's count).
fn state_bytes_per_param(
    opts: &SearchOptions,
    zero_stage: u8,
    shard: u64,
    fsdp: bool,
    pipelined: bool,
) -> f64 {
    let (w, g, o) =
        if fsdp && zero_stage >= 3 && memory::StackMemory::of(opts.settings.runtime.stack).fsdp {
            memory::fsdp_state_bytes(1_000_000, shard)
        } else {
            let fp32_main_grads = opts.settings.runtime.fp32_main_grads;
            let (w, g, o) =
                memory::model_state_bytes_for(1_000_000, zero_stage, shard, fp32_main_grads);
            let stack = memory::StackMemory::of(opts.settings.runtime.stack);
            // 16-bit gradients beside the fp32 ones (DeepSpeed's BF16_Optimizer)
            let g = g + 1_000_000
                * memory::resident_half_grad_bytes_per_param(stack, zero_stage, fp32_main_grads);
            // the fp32 gradient copy some stacks hold only at the step is no resident state
            let at_step = !fp32_main_grads && stack.grad_copy_at_step;
            let copy = if at_step {
                memory::fp32_grad_copy_bytes(1_000_000, zero_stage, shard)
            } else {
                0
            };
            let states = memory::optimizer_states_saving_bytes(
                1_000_000,
                zero_stage,
                shard,
                opts.settings.runtime.optimizer_states,
            );
            (w, g, o.saturating_sub(copy + states))
        };
    // FSDP under a pipeline keeps the stage unsharded ([`memory::StackMemory::pipelined_fsdp`]):
    // fp32 gradients whole, and at ZeRO 3 the 16-bit weights beside the sharded fp32 ones
    let (w, g) = if pipelined {
        let unsharded = if zero_stage >= 3 {
            memory::WEIGHT_BYTES_PER_PARAM
        } else {
            0
        };
        (
            w + 1_000_000 * unsharded,
            1_000_000 * memory::GRAD_BYTES_PER_PARAM,
        )
    } else {
        (w, g)
    };
    (w + g + o) as f64 / 1e6
}

/// Model-state bytes per parameter of `key`: of the dense parameters, sharded over `dp · cp`,
/// and of the routed experts', sharded over the expert-data-parallel group `tp·cp·dp /
/// (ep·etp)` — as [`memory::rank_memory`] counts them.
fn state_bytes_per_param_of(opts: &SearchOptions, key: &Key) -> (f64, f64) {
    let d = &key.degrees;
    let experts = crate::ExpertParallel {
        ep: key.ep,
        etp: key.etp,
        imbalance: opts.moe_imbalance,
    };
    let expert_dp = experts.expert_dp(d);
    let pipelined =
        memory::StackMemory::of(opts.settings.runtime.stack).pipelined_fsdp(key.zero_stage, d.pp);
    (
        state_bytes_per_param(
            opts,
            key.zero_stage,
            d.data_parallel_gpus(),
            true,
            pipelined,
        ),
        state_bytes_per_param(opts, key.zero_stage, expert_dp, false, pipelined),
    )
}

/// Searches for the fastest configuration of `model` on `profile`'s cluster that fits.
/// `progress(done, total)` is called as groups of candidates finish.
pub fn search(
    model: &Model,
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<SearchResult, PlanError> {
    let answers = Some(Detail::Breakdown);
    let schedules = Schedules::default();
    let shared = Ceiling::new(opts);
    search_under(
        model,
        profile,
        opts,
        progress,
        (&shared, &schedules),
        answers,
    )
    .result
    .map_err(|e| errors::with_gpu_count(e, model, profile, opts))
}

/// [`search`] that skips candidates unable to beat `shared`, the plans other searches found
/// (see [`ceiling`]): its answers then hold only the plans that could matter beside theirs.
/// Its schedules come from `schedules`, which other searches may share. The answers are
/// evaluated again at `answer_detail` (`None`: left as the search simulated them, for a
/// caller that details the ones it shows).
fn search_under(
    model: &Model,
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    progress: &(dyn Fn(usize, usize) + Sync),
    (shared, schedules): (&Ceiling, &Schedules),
    answer_detail: Option<Detail>,
) -> Searched {
    let start = Instant::now();
    match Search::new(model, profile, opts, shared, schedules, answer_detail) {
        Ok(phases) => answer(phases, opts, progress, start),
        Err(e) => Searched {
            candidates: 0,
            unfit: None,
            result: Err(e),
        },
    }
}

/// What [`search_under`] found: besides the result, the configurations of the space and, when
/// none fits, what more memory would buy beside the other searches' plans (both counted where
/// no candidate could beat them).
struct Searched {
    /// Configurations enumerated.
    candidates: usize,
    /// With an error, the fastest candidate that does not fit but would beat the others' best.
    unfit: Option<Estimate>,
    result: Result<SearchResult, PlanError>,
}

/// The rest of [`search_under`] once the space is enumerated.
fn answer(
    mut phases: Search,
    opts: &SearchOptions,
    progress: &(dyn Fn(usize, usize) + Sync),
    start: Instant,
) -> Searched {
    let candidates = phases.candidates;
    let failed = |e, unfit| Searched {
        candidates,
        unfit,
        result: Err(e),
    };
    let (scored, exact) = match phases.exact_candidates(progress) {
        Ok(found) => found,
        Err((e, scored)) => {
            let unfit = phases.unfit_beside_others(&scored);
            phases.release();
            return failed(e, unfit);
        }
    };
    let exact = phases.refine(exact);
    let (exact, passed_over) = prefer_simple(exact, opts.tolerance);
    let (best, alternatives) = match phases.answers(exact) {
        Ok(answers) => answers,
        Err(e) => return failed(e, None),
    };
    let fastest_unfit = phases.fastest_unfit(&scored, time_of(&best));
    let simulated = phases.simulated;
    phases.release();
    Searched {
        candidates,
        unfit: None,
        result: Ok(SearchResult {
            best,
            alternatives,
            passed_over,
            fastest_unfit,
            candidates,
            simulated,
            elapsed_s: start.elapsed().as_secs_f64(),
        }),
    }
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

/// Peak memory above this share of the GPU's counts as tight when plans tie (see
/// [`complexity`]): of two plans alike in shape and as fast, the one with headroom is the
/// safer bet.
pub const TIGHT_MEMORY_SHARE: f64 = 0.9;

/// How much a plan asks of whoever runs it, least first: stages per rank, a schedule other
/// than plain 1F1B, a layer split that is not even (transformer layers per stage differing by
/// more than one), pipeline ranks, tensor parallelism, then memory above
/// [`TIGHT_MEMORY_SHARE`] of the GPU's. The shape comes first: every plan here keeps the
/// memory margin the search was given (`EvalSettings::memory_margin_bytes`; `plan` sets the
/// GPU kind's measured band, or `--memory-margin`), the calibrated guard against running out;
/// headroom beyond it decides only between plans of the same shape, so a pipeline is never
/// chosen over a plan without one for memory the margin already holds.
pub fn complexity(e: &Estimate) -> (u64, bool, bool, u64, u64, bool) {
    let (k, pr) = (key_of(e), &e.result.predicted);
    let d = k.degrees;
    let tight = pr.peak_memory_bytes as f64 > TIGHT_MEMORY_SHARE * pr.memory_capacity_bytes as f64;
    let fancy = d.pp > 1 && k.schedule != ScheduleKind::OneFOneB;
    (d.virtual_stages, fancy, !even_split(e), d.pp, d.tp, tight)
}

/// Whether every stage holds the same number of transformer layers, give or take one (the
/// embedding and the head not counted).
fn even_split(e: &Estimate) -> bool {
    let body = e.stages.iter().map(|s| {
        let [a, b] = s.layers;
        let ends = usize::from(s.has_embedding) + usize::from(s.has_head);
        (b + 1).saturating_sub(a).saturating_sub(ends)
    });
    let (lo, hi) = body.fold((usize::MAX, 0), |(lo, hi), n| (lo.min(n), hi.max(n)));
    hi <= lo.saturating_add(1)
}

/// `exact` (in rank order) with the simplest plan within `tolerance` of the fastest moved to
/// the front, and the fastest when it was passed over. On equal complexity the faster wins.
pub fn prefer_simple(
    mut exact: Vec<Estimate>,
    tolerance: f64,
) -> (Vec<Estimate>, Option<Estimate>) {
    let Some(fastest) = exact.first().map(time_of) else {
        return (exact, None);
    };
    let limit = fastest * (1.0 + tolerance.max(0.0));
    let simplest = exact
        .iter()
        .enumerate()
        .take_while(|(_, e)| time_of(e) <= limit)
        .min_by_key(|(i, e)| (complexity(e), *i))
        .map_or(0, |(i, _)| i);
    if simplest == 0 {
        return (exact, None);
    }
    let passed = exact[0].clone();
    let chosen = exact.remove(simplest);
    exact.insert(0, chosen);
    (exact, Some(passed))
}

/// The search key of an evaluated plan.
pub fn key_of(e: &Estimate) -> Key {
    let p = &e.result.plan;
    Key {
        degrees: p.degrees,
        micro_batch_size: p.micro_batch_size,
        schedule: p.schedule,
        recompute: p.recompute,
        partial_recompute: evaluator::choice_of(e).1.is_some(),
        sequence_parallel: p.sequence_parallel,
        zero_stage: p.zero_stage,
        ep: p.ep.unwrap_or(1),
        etp: p.etp.unwrap_or(1),
    }
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
pub(crate) const PARTIAL_SOLVED: usize = 4;
/// Pipelines longer than this keep the DP's partial recompute: the integer program's branch
/// and bound grows too slow for the planner's budget (`microlp` needs seconds at 32 ranks).
pub(crate) const PARTIAL_SOLVED_MAX_PP: u64 = 16;

/// Shortlisted configurations that also try the even and the end-isolating splits.
pub(crate) const SECOND_TIER: usize = 8;

/// Non-fitting candidates evaluated to say what more memory would buy.
pub(crate) const UNFIT_TRIED: usize = 8;

/// The schedule shape of a key.
fn shape_of(k: &Key, opts: &SearchOptions) -> ScheduleShape {
    let m = opts.global_batch_size / (k.degrees.dp * k.micro_batch_size);
    (k.schedule, k.degrees.pp, k.degrees.virtual_stages, m)
}
