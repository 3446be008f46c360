//! The planner's answers when there is no plan: what the request would need.

use std::cmp::Reverse;

use autopp_hardware::AnalyticProfile;
use autopp_models::{Model, Recompute};
use rayon::prelude::*;

use super::{config_of, prune, space, Key, SearchOptions};
use crate::config::PlanError;
use crate::estimate::{peak_memory_bytes, shard_spec};
use crate::schedule::ScheduleKind;

/// The error when no configuration can even be formed: a batch too small for every
/// data-parallel degree, or pins and limits that exclude everything.
pub(super) fn no_candidates(model: &Model, gpus: u64, opts: &SearchOptions) -> PlanError {
    // the space was there, and the framework's FP8 GEMMs refused all of it
    if let Some(e) = super::fp8_gemms::all_refused(model, gpus, opts) {
        return e;
    }
    // a pinned context-parallel degree the framework's load balancer cannot cut the sequence for
    let framework = opts.limits.framework;
    let chunks = framework.context_parallel_chunks();
    if let Some(cp) = opts.fixed.degrees.cp.filter(|&c| c > 1) {
        let seq = model.seq_length();
        if framework.context_parallel() && !framework.cp_cuts(seq, cp) {
            return PlanError::invalid(
                &format!("--fix cp={cp}"),
                format!(
                    "{framework} cuts each sequence into {} chunks for context parallelism of {cp}, and the sequence length {seq} is not a multiple of {}: pin another cp or use --seq-len",
                    cp * chunks,
                    cp * chunks
                ),
            );
        }
    }
    // Every data-parallel degree divides the GPU count, so a batch of `gpus` sequences admits
    // all of them: the degrees possible with no batch constraint.
    let open = space::enumerate(model, gpus, gpus, &opts.limits, &opts.fixed);
    let mut dps: Vec<u64> = open.iter().map(|k| k.degrees.dp).collect();
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

/// Configurations the error evaluates when nothing fits.
pub(super) const LEANEST: usize = 8;

/// The order in which configurations are lean (need little memory), leanest first: the most
/// recompute, then the smallest floor on the busiest rank's model states
/// ([`super::score::model_states_floor_bytes`], in whole MiB: what tp, pp, ep and the ZeRO
/// stage over the data-parallel group actually shard, so that a ZeRO stage over one replica
/// counts for nothing), then the smallest micro-batch, the most context parallelism, tensor
/// parallelism and sequence parallelism (which split the activations), 1F1B (whose ranks
/// hold the fewest micro-batches; GPipe holds them all, even on one rank) and the fewest
/// stages per rank.
pub(super) type LeanOrder = (
    Reverse<autopp_models::Recompute>,
    u64,
    u64,
    Reverse<u64>,
    Reverse<u64>,
    Reverse<bool>,
    bool,
    u64,
    Key,
);

/// A configuration's place in the [`LeanOrder`], with `states_floor_bytes` its model states'
/// floor.
pub(super) fn lean_order(k: &Key, states_floor_bytes: f64) -> LeanOrder {
    (
        Reverse(k.recompute),
        (states_floor_bytes.max(0.0) / (1u64 << 20) as f64).round() as u64,
        k.micro_batch_size,
        Reverse(k.degrees.cp),
        Reverse(k.degrees.tp),
        Reverse(k.sequence_parallel),
        k.schedule != ScheduleKind::OneFOneB,
        k.degrees.virtual_stages,
        *k,
    )
}

/// The error when nothing fits: what the leanest configuration needs (`leanest`: the leanest
/// configurations, leanest first).
pub(super) fn nothing_fits(
    model: &Model,
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    leanest: &[Key],
) -> PlanError {
    let capacity = profile.cluster.gpu.memory_bytes;
    let leanest = leanest_need(model, profile, opts, leanest);
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    match leanest {
        Some((ref p, need)) => {
            let margin = opts.settings.memory_margin_bytes;
            PlanError::NothingFits(format!(
                "nothing fits: the leanest configuration ({}, micro-batch {}, recompute {}, ZeRO {}) needs {:.1} GiB per GPU and a margin of {:.1} GiB but each {} has {:.1} GiB; {MORE_GPUS}GPUs with at least {:.0} GiB, or a smaller model",
                degrees_text(p),
                p.micro_batch_size,
                p.recompute,
                p.zero_stage,
                gib(need),
                gib(margin),
                profile.cluster.gpu.name,
                gib(capacity),
                gib(need.saturating_add(margin)).ceil()
            ))
        }
        None => PlanError::NothingFits(format!(
            "nothing fits: no configuration of {} on {} GPUs can hold its model states; use more GPUs",
            model.name(),
            profile.cluster.num_gpus()
        )),
    }
}

/// What [`nothing_fits`] advises before [`with_gpu_count`] finds how many GPUs.
const MORE_GPUS: &str = "use more GPUs, ";

/// `e` with the GPU count where the leanest configuration fits ([`gpus_that_fit`]) in its
/// advice, when `e` is [`nothing_fits`]'s; other errors as they are. A separate step so that
/// the search of GPU counts runs only for the error shown (several frameworks' searches may
/// each fail).
pub(super) fn with_gpu_count(
    e: PlanError,
    model: &Model,
    profile: &AnalyticProfile,
    opts: &SearchOptions,
) -> PlanError {
    match e {
        PlanError::NothingFits(message) if message.contains(MORE_GPUS) => {
            match gpus_that_fit(model, profile, opts) {
                Some(n) => PlanError::NothingFits(message.replacen(
                    MORE_GPUS,
                    &format!("use about {n} GPUs (where the leanest fits, split evenly), "),
                    1,
                )),
                None => PlanError::NothingFits(message),
            }
        }
        e => e,
    }
}

/// The most GPUs [`gpus_that_fit`] tries.
const MAX_GPUS: u64 = 1 << 16;

/// The fewest GPUs, whole nodes of the cluster's kind beyond its own, on which the leanest
/// configuration (of the space with the same batch, pins and limits) fits with the margin:
/// doubling the node count, then halving the interval between a node count where nothing
/// fits and one where something does. `None` when nothing fits on [`MAX_GPUS`] either (a
/// pinned degree or the batch may forbid any).
fn gpus_that_fit(model: &Model, profile: &AnalyticProfile, opts: &SearchOptions) -> Option<u64> {
    let per_node = profile.cluster.gpus_per_node.max(1);
    let usable = profile
        .cluster
        .gpu
        .memory_bytes
        .saturating_sub(opts.settings.memory_margin_bytes);
    let lean = lean_space(opts);
    let fits = |nodes: u64| -> bool {
        let Some(Ok(cluster)) = nodes
            .checked_mul(per_node)
            .map(|n| profile.cluster.resized(n))
        else {
            return false;
        };
        let gpus = cluster.num_gpus();
        let resized = AnalyticProfile {
            cluster,
            ..profile.clone()
        };
        // a configuration whose model states alone (their floor) exceed the memory cannot fit
        let floor_fits = |o: &&LeanOrder| o.1.saturating_mul(1 << 20) <= usable;
        let orders = prune::leanest_orders(model, &lean, gpus);
        let open: Vec<&LeanOrder> = orders.iter().filter(floor_fits).collect();
        open.par_iter().any(|o| {
            lean_need_bytes(model, &resized, &lean, &o.8).is_some_and(|need| need <= usable)
        })
    };
    let mut failing = profile.cluster.num_gpus().div_ceil(per_node).max(1);
    let mut fitting = failing;
    loop {
        fitting = fitting.checked_mul(2)?;
        if fitting.checked_mul(per_node)? > MAX_GPUS {
            return None;
        }
        if fits(fitting) {
            break;
        }
        failing = fitting;
    }
    while fitting - failing > 1 {
        let mid = failing + (fitting - failing) / 2;
        if fits(mid) {
            fitting = mid;
        } else {
            failing = mid;
        }
    }
    Some(fitting * per_node)
}

/// `opts` with the choices that only add memory pinned where the user left them free: one
/// sequence per micro-batch, full recompute and 1F1B where the framework has them. The leanest
/// configuration has them anyway (see [`LeanOrder`]), and [`gpus_that_fit`] visits a space a
/// few times, some of whose sizes hold millions of configurations. Under a framework's FP8
/// recipe the micro-batch stays free: its kernels may refuse one sequence's rows
/// ([`super::fp8_gemms`]), and the leanest is then the smallest micro-batch they take.
fn lean_space(opts: &SearchOptions) -> SearchOptions {
    let mut lean = opts.clone();
    let fw = opts.limits.framework;
    let fixed = &mut lean.fixed;
    if crate::launch::fp8_gemm_multiples(fw, opts.settings.precision).is_none() {
        fixed.micro_batch_size.get_or_insert(1);
    }
    if fw.recompute_modes().contains(&Recompute::Full) {
        fixed.recompute.get_or_insert(Recompute::Full);
    }
    if opts.limits.schedules.contains(&ScheduleKind::OneFOneB) {
        fixed.schedule.get_or_insert(ScheduleKind::OneFOneB);
    }
    lean
}

/// The configuration of `keys` (the first [`LEANEST`]) with the smallest peak memory, as
/// `estimate` predicts it (without simulating), with that peak in bytes.
fn leanest_need(
    model: &Model,
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    keys: &[Key],
) -> Option<(Key, u64)> {
    keys.iter()
        .take(LEANEST)
        .filter_map(|k| Some((*k, lean_need_bytes(model, profile, opts, k)?)))
        .min_by_key(|&(_, need)| need)
}

/// [`need_bytes`] of a 1F1B key with at most `pp` micro-batches per replica: a 1F1B rank
/// holds `min(pp − rank, m)` micro-batches at its peak, so more change nothing but the time
/// to walk the schedule (a batch of 15,360 sequences on a few replicas is thousands of
/// micro-batches). Other schedules keep their batch.
fn lean_need_bytes(
    model: &Model,
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    k: &Key,
) -> Option<u64> {
    let replica = k.degrees.dp * k.micro_batch_size;
    let m = opts.global_batch_size / replica.max(1);
    if k.schedule != ScheduleKind::OneFOneB || m <= k.degrees.pp {
        return need_bytes(model, profile, opts, k);
    }
    let capped = SearchOptions {
        global_batch_size: replica * k.degrees.pp,
        ..opts.clone()
    };
    need_bytes(model, profile, &capped, k)
}

/// `k`'s peak memory per GPU, bytes, as `estimate` predicts it (without simulating); `None`
/// where the model cannot take its sharding.
fn need_bytes(
    model: &Model,
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    k: &Key,
) -> Option<u64> {
    let c = config_of(k, opts, None);
    let layers = model.layers(&shard_spec(&c)).ok()?;
    peak_memory_bytes(model, profile, &c, &layers).ok()
}

/// `tp 1 · pp 16 · dp 1`, with `· cp C`, `· ep E` and `· etp T` where those are above 1.
fn degrees_text(k: &Key) -> String {
    let d = k.degrees;
    let mut text = format!("tp {} · pp {} · dp {}", d.tp, d.pp, d.dp);
    for (name, value) in [("cp", d.cp), ("ep", k.ep), ("etp", k.etp)] {
        if value > 1 {
            text.push_str(&format!(" · {name} {value}"));
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn degrees_text_names_cp_and_expert_degrees_above_one() {
        let mut k = space::enumerate(
            &autopp_models::load("tiny-gpt").expect("preset"),
            8,
            8,
            &space::SpaceLimits::new(crate::framework::Framework::Megatron, 8),
            &Default::default(),
        )[0];
        k.degrees.tp = 2;
        k.degrees.pp = 4;
        k.degrees.dp = 1;
        assert_eq!(degrees_text(&k), "tp 2 · pp 4 · dp 1");
        k.degrees.cp = 2;
        (k.ep, k.etp) = (8, 2);
        assert_eq!(degrees_text(&k), "tp 2 · pp 4 · dp 1 · cp 2 · ep 8 · etp 2");
    }

    /// Capping a 1F1B key's micro-batches at `pp` leaves its peak memory as it is, to the
    /// byte (what makes [`gpus_that_fit`] fast on large batches).
    #[test]
    fn a_1f1b_peak_is_the_same_with_pp_micro_batches() {
        use crate::framework::Framework;
        use autopp_hardware::{hardware, Cluster, Precision};
        for (name, gpus, framework) in [
            ("gpt3-175b", 64, Framework::Megatron),
            ("mixtral-8x7b", 32, Framework::Megatron),
            ("llama3-70b", 32, Framework::Torchtitan),
            ("llama3-8b", 16, Framework::Deepspeed),
        ] {
            let model = autopp_models::load(name).expect("preset");
            let gpu = hardware::gpu("h100-sxm").expect("gpu");
            let cluster = Cluster::new(gpu, gpus, 8, None).expect("cluster");
            let profile = AnalyticProfile::new(cluster, Precision::Bf16).expect("profile");
            let opts = SearchOptions::new(framework, 1024, 8);
            let all = space::enumerate(&model, gpus, 1024, &opts.limits, &opts.fixed);
            let capped: Vec<&Key> = all
                .iter()
                .filter(|k| {
                    k.schedule == ScheduleKind::OneFOneB
                        && k.degrees.pp > 1
                        && 1024 / (k.degrees.dp * k.micro_batch_size) > k.degrees.pp
                })
                .step_by(7)
                .collect();
            assert!(capped.len() > 10, "{name}: {}", capped.len());
            for k in capped {
                assert_eq!(
                    lean_need_bytes(&model, &profile, &opts, k),
                    need_bytes(&model, &profile, &opts, k),
                    "{name} {k:?}"
                );
            }
        }
    }

    /// The need the error reports is, within 1%, the smallest of the whole space (brute force:
    /// every configuration's predicted peak), for models and GPUs where nothing fits. It was
    /// not: the order put a ZeRO stage over a single replica first, and reported Llama 3 405B
    /// on 8 A100 40GB at 1147.9 GiB (tp 2 · pp 2 · cp 2) where tp 8 needs 859.7.
    #[test]
    fn the_leanest_reported_is_the_leanest_of_the_space() {
        use crate::framework::Framework;
        use autopp_hardware::{hardware, Cluster, Precision};
        for (name, gpus, gpu, framework) in [
            ("llama3-405b", 8, "a100-40g", Framework::Megatron),
            ("llama3-405b", 8, "a100-40g", Framework::Torchtitan),
            ("gpt3-175b", 16, "h100-sxm", Framework::Megatron),
            ("mixtral-8x22b", 8, "a100-40g", Framework::Megatron),
        ] {
            let model = autopp_models::load(name).expect("preset");
            let gpu = hardware::gpu(gpu).expect("gpu");
            let cluster = Cluster::new(gpu, gpus, 8, None).expect("cluster");
            let profile = AnalyticProfile::new(cluster, Precision::Bf16).expect("profile");
            let opts = SearchOptions::new(framework, 64, 8);
            let all = space::enumerate(&model, gpus, 64, &opts.limits, &opts.fixed);
            let smallest = all
                .iter()
                .filter_map(|k| need_bytes(&model, &profile, &opts, k))
                .min()
                .expect("some configuration");
            let keys = super::super::prune::leanest(&model, &opts, gpus);
            let (_, reported) = leanest_need(&model, &profile, &opts, &keys).expect("leanest");
            assert!(
                reported as f64 <= 1.01 * smallest as f64,
                "{name} on {gpus} {framework:?}: reported {reported} B, the space's smallest {smallest} B ({} keys)",
                all.len()
            );
        }
    }
}
