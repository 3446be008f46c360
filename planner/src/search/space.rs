//! The discrete search space: every configuration the planner considers, in a fixed order.

use autopp_models::{Model, Recompute};
use serde::{Deserialize, Serialize};

use crate::degrees::Degrees;
use crate::framework::Framework;
use crate::pins::Fixed;
use crate::schedule::ScheduleKind;

/// One discrete configuration (everything but the layer split). Field order is the tie-break
/// order: equal predicted times go to the configuration that sorts first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Key {
    /// Tensor, pipeline, data and context parallelism and stages per rank.
    #[serde(flatten)]
    pub degrees: Degrees,
    /// Sequences per micro-batch.
    pub micro_batch_size: u64,
    /// Schedule.
    pub schedule: ScheduleKind,
    /// Recompute mode (of the layers not fully recomputed, with `partial_recompute`).
    pub recompute: Recompute,
    /// Some transformer layers are fully recomputed, how many on each stage chosen with the
    /// split (see `search::partial`); the others use `recompute`.
    pub partial_recompute: bool,
    /// Sequence parallelism.
    pub sequence_parallel: bool,
    /// ZeRO stage.
    pub zero_stage: u8,
    /// Expert-parallel degree (1 for dense models).
    #[serde(default = "one")]
    pub ep: u64,
    /// Expert-tensor-parallel degree (1 for dense models).
    #[serde(default = "one")]
    pub etp: u64,
}

fn one() -> u64 {
    1
}

/// Limits of the space.
#[derive(Debug, Clone, PartialEq)]
pub struct SpaceLimits {
    /// Largest tensor-parallel degree (default: GPUs per node).
    pub max_tp: u64,
    /// GPUs per node: tensor-parallel degrees must divide it or be multiples of it.
    pub gpus_per_node: u64,
    /// Largest micro-batch size tried.
    pub max_micro_batch_size: u64,
    /// Largest number of stages per rank tried.
    pub max_virtual_stages: u64,
    /// Schedules allowed.
    pub schedules: Vec<ScheduleKind>,
    /// The framework the plan must run on: its recompute options, ZeRO stages and context
    /// parallelism bound the space (its schedules are for the caller to put in `schedules`).
    pub framework: Framework,
}

/// Largest micro-batch size the search tries unless told otherwise (`--max-mbs`).
pub const DEFAULT_MAX_MICRO_BATCH_SIZE: u64 = 16;

/// Largest number of stages per rank the search tries unless told otherwise (`--max-virtual`).
pub const DEFAULT_MAX_VIRTUAL_STAGES: u64 = 8;

impl SpaceLimits {
    /// The default space for `framework` on nodes of `gpus_per_node` GPUs: tensor parallelism
    /// up to a node, micro-batches up to [`DEFAULT_MAX_MICRO_BATCH_SIZE`], up to
    /// [`DEFAULT_MAX_VIRTUAL_STAGES`] stages per rank, every schedule the framework runs.
    pub fn new(framework: Framework, gpus_per_node: u64) -> SpaceLimits {
        SpaceLimits {
            max_tp: gpus_per_node,
            gpus_per_node,
            max_micro_batch_size: DEFAULT_MAX_MICRO_BATCH_SIZE,
            max_virtual_stages: DEFAULT_MAX_VIRTUAL_STAGES,
            schedules: framework.schedules(),
            framework,
        }
    }
}

fn divisors(n: u64) -> Vec<u64> {
    // trial division up to √n: a global batch of 2^32 + 1 sequences takes 65,536 steps, not 2^32
    let mut small = Vec::new();
    let mut large = Vec::new();
    let mut d = 1u64;
    while d.saturating_mul(d) <= n {
        if n.is_multiple_of(d) {
            small.push(d);
            if d != n / d {
                large.push(n / d);
            }
        }
        d += 1;
    }
    small.extend(large.into_iter().rev());
    small
}

/// The pinned value of `all`, or all of them.
fn pick(fixed: Option<u64>, all: Vec<u64>) -> Vec<u64> {
    match fixed {
        Some(v) => all.into_iter().filter(|&x| x == v).collect(),
        None => all,
    }
}

/// The tensor-parallel degrees to try on `gpus` GPUs: divisors within the limit that tile nodes
/// and split the attention heads (and, where the framework splits whole key/value heads, those).
fn tp_degrees(model: &Model, gpus: u64, limits: &SpaceLimits, fixed: &Fixed) -> Vec<u64> {
    let heads = model.num_attention_heads();
    // a framework whose tensor parallelism splits whole key/value heads needs tp to divide them
    let kv_heads = match model {
        Model::Transformer(t) if limits.framework.tp_splits_whole_kv_heads() => Some(t.kv_heads()),
        _ => None,
    };
    pick(
        fixed.degrees.tp,
        divisors(gpus)
            .into_iter()
            .filter(|&t| {
                (t <= limits.max_tp || fixed.degrees.tp == Some(t))
                    // tensor-parallel groups tile nodes: t divides the node size or fills nodes
                    && (limits.gpus_per_node.is_multiple_of(t) || t.is_multiple_of(limits.gpus_per_node))
                    && heads.is_none_or(|h| h % t == 0)
                    && kv_heads.is_none_or(|g| g % t == 0)
                    && (heads.is_some() || t == 1)
            })
            .collect(),
    )
}

/// The context-parallel degrees to try on `gpus` GPUs (those left by tp): every degree that
/// splits the sequence evenly (into the framework's
/// [`Framework::context_parallel_chunks`] per rank), at every sequence length; the scan's
/// lower bound prunes the hopeless ones (no threshold on the length).
fn cp_degrees(model: &Model, gpus: u64, limits: &SpaceLimits, fixed: &Fixed) -> Vec<u64> {
    let transformer = model.num_attention_heads().is_some();
    pick(
        fixed.degrees.cp,
        divisors(gpus)
            .into_iter()
            .filter(|&c| {
                c == 1
                    || (transformer
                        && limits.framework.context_parallel()
                        && limits.framework.cp_cuts(model.seq_length(), c))
            })
            .collect(),
    )
}

/// Every configuration of `model` on `gpus` GPUs with `global_batch` sequences that the limits
/// and pins allow, in [`Key`] order.
pub fn enumerate(
    model: &Model,
    gpus: u64,
    global_batch: u64,
    limits: &SpaceLimits,
    fixed: &Fixed,
) -> Vec<Key> {
    let mut out = Vec::new();
    visit(model, gpus, global_batch, limits, fixed, &mut |k| {
        out.push(k)
    });
    out
}

/// [`enumerate`], handing each configuration to `sink` in [`Key`] order instead of collecting
/// them (the search keeps only those that can fit).
pub fn visit(
    model: &Model,
    gpus: u64,
    global_batch: u64,
    limits: &SpaceLimits,
    fixed: &Fixed,
    sink: &mut impl FnMut(Key),
) {
    for tp in tp_options(model, gpus, limits, fixed) {
        visit_tp(model, (gpus, global_batch), limits, fixed, tp, sink);
    }
}

/// The tensor-parallel degrees [`visit`] goes through, in its order.
pub fn tp_options(model: &Model, gpus: u64, limits: &SpaceLimits, fixed: &Fixed) -> Vec<u64> {
    tp_degrees(model, gpus, limits, fixed)
}

/// [`visit`]'s configurations with tensor-parallel degree `tp` (one of [`tp_options`]), in
/// its order, on `gpus` GPUs with `global_batch` sequences. (`sink` is a type parameter, not a
/// trait object: called for each of hundreds of thousands of keys, it is inlined.)
pub fn visit_tp(
    model: &Model,
    (gpus, global_batch): (u64, u64),
    limits: &SpaceLimits,
    fixed: &Fixed,
    tp: u64,
    sink: &mut impl FnMut(Key),
) {
    let body_layers = match model {
        Model::Transformer(t) => t.num_layers,
        Model::Layers(l) => l.layers.len() as u64,
    };
    for cp in cp_degrees(model, gpus / tp, limits, fixed) {
        let pps = pick(
            fixed.degrees.pp,
            divisors(gpus / (tp * cp))
                .into_iter()
                .filter(|&p| p <= body_layers)
                .collect(),
        );
        for pp in pps {
            let dp = gpus / (tp * cp * pp);
            if fixed.degrees.dp.is_some_and(|d| d != dp) || !global_batch.is_multiple_of(dp) {
                continue;
            }
            let per_replica = global_batch / dp;
            let mbss = pick(
                fixed.micro_batch_size,
                divisors(per_replica)
                    .into_iter()
                    .filter(|&b| {
                        b <= limits.max_micro_batch_size || fixed.micro_batch_size == Some(b)
                    })
                    .collect(),
            );
            for mbs in mbss {
                let m = per_replica / mbs;
                let base = Key {
                    degrees: Degrees {
                        tp,
                        pp,
                        dp,
                        cp,
                        virtual_stages: 1,
                    },
                    micro_batch_size: mbs,
                    schedule: ScheduleKind::OneFOneB,
                    recompute: Recompute::None,
                    partial_recompute: false,
                    sequence_parallel: false,
                    zero_stage: 0,
                    ep: 1,
                    etp: 1,
                };
                let pairs = expert_degrees(model, &base.degrees, limits.framework);
                for (ep, etp) in fixed.expert_pairs(pairs) {
                    let base = Key { ep, etp, ..base };
                    push_schedules(sink, base, m, body_layers, limits, fixed);
                }
            }
        }
    }
}

/// The (ep, etp) pairs the search tries for a model on `d` (`(1, 1)` without experts): ep a
/// power of two dividing the expert count, etp 1 or tp (torchtitan's rule, and the layouts
/// Megatron-Core's MoE recipes use), and `ep · etp` dividing the GPUs a pipeline rank folds its
/// experts onto, `tp · cp · dp` (Megatron's parallel folding; torchtitan's
/// `(dp_shard·cp·tp) % ep == 0`). DeepSpeed-MoE folds experts onto data parallelism only:
/// `ep | dp`, etp 1. Powers of two keep the space small (DeepSeek-V3's 256 experts: 9 values).
pub fn expert_degrees(model: &Model, d: &Degrees, framework: Framework) -> Vec<(u64, u64)> {
    let experts = match model {
        Model::Transformer(t) => t
            .moe
            .as_ref()
            .map(|m| (m.num_experts, m.moe_ffn_hidden_size)),
        Model::Layers(_) => None,
    };
    let Some((e, ffn)) = experts else {
        return vec![(1, 1)];
    };
    let folded = d.tp * d.cp * d.dp;
    let etps: Vec<u64> = if d.tp > 1 && framework != Framework::Deepspeed {
        vec![1, d.tp]
    } else {
        vec![1]
    };
    let mut out = Vec::new();
    for etp in etps.into_iter().filter(|&t| ffn.is_multiple_of(t)) {
        let mut ep = 1;
        while ep <= e {
            let room = if framework == Framework::Deepspeed {
                d.dp
            } else {
                folded / etp
            };
            if e.is_multiple_of(ep) && room.is_multiple_of(ep) {
                out.push((ep, etp));
            }
            ep *= 2;
        }
    }
    out
}

/// Adds every schedule, stage count, recompute mode, sequence-parallel and ZeRO choice for the
/// degrees and micro-batching in `base` (whose other fields are ignored).
fn push_schedules(
    out: &mut impl FnMut(Key),
    base: Key,
    m: u64,
    body_layers: u64,
    limits: &SpaceLimits,
    fixed: &Fixed,
) {
    let Degrees { tp, pp, dp, cp, .. } = base.degrees;
    for &schedule in &limits.schedules {
        if fixed.schedule.is_some_and(|s| s != schedule) {
            continue;
        }
        // the kind's own rules (see `ScheduleKind::virtual_stage_options`); v stages per rank
        // need pp · v body layers to spread over
        // no more stages per rank than body layers per rank (a huge --max-virtual is not a
        // huge loop)
        let max_v = limits
            .max_virtual_stages
            .min(body_layers / pp.max(1))
            .max(1);
        let vs = schedule
            .virtual_stage_options(pp, m, max_v)
            .into_iter()
            .filter(|&v| v == 1 || pp * v <= body_layers);
        for v in vs {
            if fixed.degrees.virtual_stages.is_some_and(|f| f != v) {
                continue;
            }
            // every layer alike (the search adds partial recompute where memory binds)
            let fw = limits.framework;
            let uniform = fw.recompute_modes().iter().map(|&r| (r, false));
            for (recompute, partial_recompute) in uniform {
                if fixed.recompute.is_some_and(|r| r != recompute) {
                    continue;
                }
                let sps: &[bool] = if tp > 1 { &[false, true] } else { &[false] };
                for &sequence_parallel in sps {
                    if fixed
                        .sequence_parallel
                        .is_some_and(|s| s != sequence_parallel)
                    {
                        continue;
                    }
                    // Pipeline engines pair with ZeRO ≤ 1 (Megatron-LM, DeepSpeed); without a
                    // pipeline every stage is open. A pinned stage is always tried.
                    let zeros: &[u8] = match &fixed.zero_stage {
                        Some(z) => std::slice::from_ref(z),
                        None if dp == 1 && cp == 1 => &[0],
                        None if pp == 1 => &[0, 1, 2, 3],
                        // FSDP2 inside a pipeline keeps the parameters gathered (stage 2)
                        None if fw == Framework::Torchtitan => &[0, 2],
                        None => &[0, 1],
                    };
                    let zeros = zeros.iter().filter(|z| fw.zero_stages().contains(z));
                    for &zero_stage in zeros {
                        out(Key {
                            degrees: Degrees {
                                virtual_stages: v,
                                ..base.degrees
                            },
                            schedule,
                            recompute,
                            partial_recompute,
                            sequence_parallel,
                            zero_stage,
                            ..base
                        });
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn divisors_in_order() {
        assert_eq!(divisors(12), [1, 2, 3, 4, 6, 12]);
        assert_eq!(divisors(16), [1, 2, 4, 8, 16]);
        assert_eq!(divisors(1), [1]);
        assert_eq!(divisors(0), Vec::<u64>::new());
        assert_eq!(divisors((1 << 32) + 1), [1, 641, 6_700_417, (1 << 32) + 1]);
    }
}
