//! The planner's answers when there is no plan: what the request would need.

use std::cmp::Reverse;

use autopp_hardware::AnalyticProfile;
use autopp_models::Model;

use super::{config_of, space, Key, SearchOptions};
use crate::config::PlanError;
use crate::estimate::{peak_memory_bytes, shard_spec};

/// The error when no configuration can even be formed: a batch too small for every
/// data-parallel degree, or pins and limits that exclude everything.
pub(super) fn no_candidates(model: &Model, gpus: u64, opts: &SearchOptions) -> PlanError {
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
pub(super) const LEANEST: usize = 4;

/// The order in which configurations are lean (need little memory), leanest first: the most
/// recompute, ZeRO and tp · pp, then the smallest micro-batch and fewest stages per rank.
pub(super) type LeanOrder = (
    Reverse<autopp_models::Recompute>,
    Reverse<u8>,
    Reverse<u64>,
    u64,
    u64,
    Key,
);

/// A configuration's place in the [`LeanOrder`].
pub(super) fn lean_order(k: &Key) -> LeanOrder {
    (
        Reverse(k.recompute),
        Reverse(k.zero_stage),
        Reverse(k.degrees.tp * k.degrees.pp),
        k.micro_batch_size,
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
    // The peak memory of the configurations with the most sharding and recomputation (as
    // `estimate` predicts it, without simulating); report the leanest.
    let leanest = leanest
        .iter()
        .take(LEANEST)
        .filter_map(|k| {
            let c = config_of(k, opts, None);
            let layers = model.layers(&shard_spec(&c)).ok()?;
            let need = peak_memory_bytes(model, profile, &c, &layers).ok()?;
            Some((k, need))
        })
        .min_by_key(|&(_, need)| need);
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    match leanest {
        Some((p, need)) => {
            let reserve = opts.settings.memory_reserve_bytes;
            let margin = opts.settings.memory_margin_bytes;
            let usable = capacity.saturating_sub(reserve + margin).max(1);
            let gpus = profile.cluster.num_gpus();
            let per_node = profile.cluster.gpus_per_node;
            let more = ((gpus as f64) * (need.saturating_sub(reserve)) as f64 / usable as f64)
                .ceil() as u64;
            let more = more.div_ceil(per_node) * per_node;
            PlanError::NothingFits(format!(
                "nothing fits: the leanest configuration ({}, micro-batch {}, recompute {}, ZeRO {}) needs {:.1} GiB per GPU and a margin of {:.1} GiB but a {} has {:.1} GiB; use about {more} GPUs or more, GPUs with at least {:.0} GiB, or a smaller model",
                degrees_text(p),
                p.micro_batch_size,
                p.recompute,
                p.zero_stage,
                gib(need),
                gib(margin),
                profile.cluster.gpu.name,
                gib(capacity),
                gib(need + margin).ceil()
            ))
        }
        None => PlanError::NothingFits(format!(
            "nothing fits: no configuration of {} on {} GPUs can hold its model states; use more GPUs",
            model.name(),
            profile.cluster.num_gpus()
        )),
    }
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
}
