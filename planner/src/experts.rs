//! Expert parallelism: Megatron-Core's "parallel folding" (Liu et al. 2025, arXiv 2504.14960,
//! §3; `../shared/reference/megatron-lm.md`). The GPUs of one pipeline rank, `tp · cp · dp` of
//! them, run attention as `tp × cp × dp` and the MoE FFNs as `etp × ep × edp` (expert tensor,
//! expert and expert-data parallelism), so `ep · etp` must divide `tp · cp · dp` and
//! `edp = tp · cp · dp / (ep · etp)`. Expert groups are laid out etp fastest, then ep: the
//! expert-parallel group's members are `etp` ranks apart.

use autopp_models::Model;
use serde::{Deserialize, Serialize};

use crate::config::PlanError;
use crate::degrees::Degrees;

/// The expert degrees of a configuration and the routing load.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ExpertParallel {
    /// Expert-parallel degree: each GPU holds `E/ep` routed experts.
    pub ep: u64,
    /// Expert-tensor-parallel degree: each expert's FFN split `etp` ways.
    pub etp: u64,
    /// Busiest expert rank's tokens over the balanced share (1.0: forced balance).
    pub imbalance: f64,
}

impl Default for ExpertParallel {
    fn default() -> Self {
        ExpertParallel {
            ep: 1,
            etp: 1,
            imbalance: 1.0,
        }
    }
}

impl ExpertParallel {
    /// Whether this is the default (no expert parallelism, balanced).
    pub fn is_default(&self) -> bool {
        *self == ExpertParallel::default()
    }

    /// Expert-data-parallel degree: `tp · cp · dp / (ep · etp)` (at least 1).
    pub fn expert_dp(&self, d: &Degrees) -> u64 {
        (d.tp * d.cp * d.dp / (self.ep * self.etp).max(1)).max(1)
    }

    /// The imbalance in thousandths, as [`autopp_models::ShardSpec`] takes it.
    pub fn imbalance_milli(&self) -> u64 {
        (self.imbalance * 1000.0).round().max(1000.0) as u64
    }

    /// Checks the degrees against the model and the folding rule; errors name the flag.
    pub fn check(&self, model: &Model, d: &Degrees) -> Result<(), PlanError> {
        if self.ep == 0 || self.etp == 0 {
            return Err(PlanError::invalid(
                "--ep",
                "--ep and --etp must be at least 1",
            ));
        }
        check_imbalance(self.imbalance)?;
        let experts = match model {
            Model::Transformer(t) => t.moe.as_ref().map(|m| m.num_experts),
            Model::Layers(_) => None,
        };
        if experts.is_none() && (self.ep > 1 || self.etp > 1) {
            return Err(PlanError::invalid(
                "--ep",
                format!(
                    "{} (--etp {}): model '{}' has no experts; leave expert parallelism at 1",
                    self.ep,
                    self.etp,
                    model.name()
                ),
            ));
        }
        let folded = d.tp.saturating_mul(d.cp).saturating_mul(d.dp);
        let experts_gpus = self.ep.checked_mul(self.etp).filter(|&n| n <= folded);
        if !experts_gpus.is_some_and(|n| folded.is_multiple_of(n)) {
            return Err(PlanError::invalid(
                "--ep",
                format!(
                    "ep · etp = {} · {} does not divide tp · cp · dp = {folded}, the GPUs of a pipeline rank the experts fold onto: choose degrees whose product divides it",
                    self.ep, self.etp
                ),
            ));
        }
        Ok(())
    }
}

/// The model's MTP layers (0 for layer lists).
pub fn mtp_layers(model: &Model) -> u64 {
    match model {
        Model::Transformer(t) => t.mtp_num_layers,
        Model::Layers(_) => 0,
    }
}

/// The share of each expert all-to-all (dispatch and combine) that runs beside another
/// micro-batch's compute under Megatron-Core's `--overlap-moe-expert-parallel-comm`
/// ([`crate::config::Runtime::ep_a2a_overlap`]), for `c` with `mtp_layers` MTP layers; 0 where
/// the runtime lacks it or the configuration cannot use it.
///
/// Megatron-Core 0.16.1 (`transformer_config.py`, `__post_init__`; `schedules.py`) overlaps
/// only in the steady 1F1B phase (the "combined 1F1B" step: one micro-batch's forward beside
/// another's backward) and requires ep > 1, virtual stages when pp > 1, no full recompute and
/// no recompute method (so no partial recompute), at most one MTP layer and, with one, pp > 1.
/// Of the `m·v` forward chunks a rank runs, the warm-up ones run alone: rank 0 (the longest
/// warm-up) runs `2(pp − 1) + (v − 1)·pp` of them, plus the extra micro-batch the overlap
/// schedules into the warm-up (`schedules.py`: "we schedule one extra micro-batch"); the
/// backward chunks of the cool-down are as many. So the share is
/// `max(0, m·v − 2(pp − 1) − (v − 1)·pp − 1) / (m·v)`; without a pipeline `(m − 1)/m`.
pub fn a2a_hidden_share(c: &crate::ParallelConfig, mtp_layers: u64) -> f64 {
    use crate::schedule::ScheduleKind;
    let d = &c.degrees;
    let (pp, v, m) = (d.pp, d.virtual_stages, c.num_microbatches());
    let usable = c.settings.runtime.ep_a2a_overlap
        && c.experts.ep > 1
        && matches!(
            c.schedule,
            ScheduleKind::OneFOneB | ScheduleKind::Interleaved1F1B
        )
        && (pp == 1 || v > 1)
        && c.recompute != autopp_models::Recompute::Full
        && c.recompute_layers.is_none()
        && mtp_layers <= 1
        && (mtp_layers == 0 || pp > 1);
    if !usable {
        return 0.0;
    }
    let chunks = m * v;
    let warmup = 2 * (pp - 1) + (v - 1) * pp + 1;
    chunks.saturating_sub(warmup) as f64 / chunks.max(1) as f64
}

/// The share of the expert all-to-alls' cross-node volume that a node-deduplicating
/// dispatcher ([`crate::config::Runtime::ep_dispatch_dedup`]) still sends: 1.0 without one,
/// without experts, or with the ep group inside one node.
///
/// A token routed to `k` of `E` experts sends, per (token, expert) pair, `k·(N−1)/N` copies
/// across nodes on average when the ep group spans `N` nodes of `E/N` experts each. DeepEP
/// sends it once to each node that holds one of its experts (`deepseek-ai/DeepEP` README:
/// internode dispatch over RDMA, then NVLink forwarding; DeepSeek-V3 report, arXiv
/// 2412.19437, §3.2.2). If `p` is the chance that a given node holds one of a token's experts
/// (the same for every node, the token's own included, as forced balance draws the experts at
/// random), `(N−1)·p` copies cross, a share `N·p/k` of the per-pair volume
/// (`node_hit_chance` says what `p` is, with and without group-limited routing).
///
/// A dispatcher that sends every (token, expert) pair (NCCL's all-to-all) sends `(N−1)/N` of
/// the pairs across on average with or without a group limit, so the limit changes nothing
/// there.
pub fn node_dedup_share(model: &Model, c: &crate::ParallelConfig, gpus_per_node: u64) -> f64 {
    let Model::Transformer(t) = model else {
        return 1.0;
    };
    let (Some(m), true) = (t.moe.as_ref(), c.settings.runtime.ep_dispatch_dedup) else {
        return 1.0;
    };
    let ep = c.experts.ep.max(1);
    let nodes = ep.div_ceil(gpus_per_node.clamp(1, ep));
    dedup_share(m.num_experts, m.num_experts_per_tok, nodes, m.group_limit())
}

/// `N·p/k` of [`node_dedup_share`] for `experts` experts, top-`k`, over `nodes` nodes, with
/// the group limit `(groups, groups per token)` if any (at most 1.0; 1.0 for one node).
fn dedup_share(experts: u64, k: u64, nodes: u64, groups: Option<(u64, u64)>) -> f64 {
    if nodes <= 1 || k == 0 || k > experts || experts < nodes {
        return 1.0;
    }
    (nodes as f64 * node_hit_chance(experts, k, nodes, groups) / k as f64).min(1.0)
}

/// The chance `p` that a given one of `nodes` nodes (each holding `E/N` consecutive experts)
/// holds at least one of a token's top-`k` experts.
///
/// Unlimited routing, the `k` experts drawn uniformly: `p = 1 − C(E − E/N, k)/C(E, k)`.
///
/// Group-limited routing (DeepSeek-V3, arXiv 2412.19437 §2.1.2: the experts in `G` groups,
/// each token restricted to `M` of them, "each token will be sent to at most M nodes" with one
/// group a node, §3.2.2): the router ranks a group by the sum of its best `k/M` affinities
/// (Megatron-Core's `group_limited_topk`; the report's "sum of the highest K_r/M affinity
/// scores") and so picks groups for their strong experts, each chosen group gets at least one
/// of the token's experts, and the token reaches exactly the nodes that hold its `M` groups
/// (a simulation of the router on random logits, as forced balance runs it, reaches 3.97 of the
/// 4 nodes at 8 groups on 8 nodes). With the groups drawn uniformly:
/// - a node holding `g = G/N` whole groups (`N` divides `G`) is reached unless none of its
///   groups is chosen: `p = 1 − C(G − g, M)/C(G, M)`;
/// - a group spread over `r = N/G` nodes (`G` divides `N`) reaches a node of it when the group
///   is chosen and one of the experts drawn from the `M·E/G` experts of the chosen groups is
///   among the node's `E/N`: `p = M/G · (1 − C(M·E/G − E/N, k)/C(M·E/G, k))`;
/// - other layouts: unlimited.
///
/// Never above the unlimited chance.
fn node_hit_chance(experts: u64, k: u64, nodes: u64, groups: Option<(u64, u64)>) -> f64 {
    let per_node = experts / nodes;
    let unlimited = 1.0 - miss_chance(experts, per_node, k);
    let Some((g, m)) = groups else {
        return unlimited;
    };
    let limited = if g.is_multiple_of(nodes) {
        1.0 - miss_chance(g, g / nodes, m)
    } else if nodes.is_multiple_of(g) && experts.is_multiple_of(g) {
        let chosen = m * (experts / g);
        m as f64 / g as f64 * (1.0 - miss_chance(chosen, per_node, k))
    } else {
        unlimited
    };
    limited.min(unlimited)
}

/// `C(n − held, draws)/C(n, draws)`: the chance that `draws` picks without replacement from `n`
/// miss all `held` marked ones, as a product of `draws` ratios.
fn miss_chance(n: u64, held: u64, draws: u64) -> f64 {
    (0..draws)
        .map(|i| {
            n.saturating_sub(held).saturating_sub(i) as f64 / n.saturating_sub(i).max(1) as f64
        })
        .product()
}

/// `--moe-imbalance`: the busiest expert rank's tokens over the balanced share, from 1.0
/// (forced balance) to 64; an error naming the flag otherwise (NaN included).
pub fn check_imbalance(imbalance: f64) -> Result<f64, PlanError> {
    if !(1.0..=64.0).contains(&imbalance) {
        return Err(PlanError::invalid(
            "--moe-imbalance",
            format!(
                "{imbalance} is out of range: the busiest expert rank's load over the balanced one, from 1.0 to 64"
            ),
        ));
    }
    Ok(imbalance)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// DeepSeek-V3's published layout (arXiv 2412.19437, §3.2: 2048 H800, PP 16, EP 64,
    /// ZeRO-1 DP): tp 1, cp 1, dp 128 per pipeline rank; ep 64 leaves edp = 128 / 64 = 2.
    #[test]
    fn expert_dp_hand_worked() {
        let d = Degrees {
            tp: 1,
            pp: 16,
            dp: 128,
            cp: 1,
            virtual_stages: 1,
        };
        let e = ExpertParallel {
            ep: 64,
            ..ExpertParallel::default()
        };
        assert_eq!(e.expert_dp(&d), 2);
        // Mixtral at tp 2, dp 4, ep 8: 8 GPUs of a rank, edp 1
        let d = Degrees { tp: 2, dp: 4, ..d };
        let e = ExpertParallel { ep: 8, ..e };
        assert_eq!(e.expert_dp(&d), 1);
    }

    /// Hand-worked node deduplication: Qwen3-235B (128 experts, top 8) at ep 32 over 4 nodes of
    /// 8: a node holds 32 experts; q = C(96, 8)/C(128, 8) = Π (96 − i)/(128 − i), i < 8
    /// = 0.09275; share = 4 · (1 − 0.09275)/8 = 0.45363. DeepSeek-V3 (256, top 8) at ep 64 over
    /// 8 nodes: q = C(224, 8)/C(256, 8) = 0.33817, share = 8 · 0.66183/8 = 0.66183. One node, or
    /// top-1 over two nodes (q = 1/2, share 2 · 1/2 = 1): nothing saved.
    #[test]
    fn dedup_share_hand_worked() {
        let q: f64 = (0..8).map(|i| (96 - i) as f64 / (128 - i) as f64).product();
        assert!((q - 0.09275).abs() < 1e-5, "{q}");
        assert!((dedup_share(128, 8, 4, None) - 0.45363).abs() < 1e-5);
        let q: f64 = (0..8)
            .map(|i| (224 - i) as f64 / (256 - i) as f64)
            .product();
        assert!((q - 0.33817).abs() < 1e-5, "{q}");
        assert!((dedup_share(256, 8, 8, None) - 0.66183).abs() < 1e-5);
        assert_eq!(dedup_share(256, 8, 1, None), 1.0);
        assert_eq!(dedup_share(8, 1, 2, None), 1.0);
    }

    /// Hand-worked group-limited routing, DeepSeek-V3 (arXiv 2412.19437 §2.1.2, §3.2.2; HF
    /// config `n_group` 8, `topk_group` 4; 256 experts, top 8):
    /// - ep 64 over 8 nodes: one group a node, p = 1 − C(7, 4)/C(8, 4) = 1 − 35/70 = 0.5, a
    ///   token reaches 8 · 0.5 = 4 nodes ("at most 4 nodes"); share = 8 · 0.5/8 = 0.5, against
    ///   0.66183 unlimited.
    /// - ep 32 over 4 nodes: two groups a node, p = 1 − C(6, 4)/C(8, 4) = 1 − 15/70 = 0.78571;
    ///   share = 4 · 0.78571/8 = 0.39286. Unlimited: q = C(192, 8)/C(256, 8) = 0.09645,
    ///   share 4 · 0.90355/8 = 0.45178.
    /// - ep 128 over 16 nodes: a group over 2 nodes of 16 experts, the 8 experts drawn from the
    ///   128 of the 4 chosen groups: p = 4/8 · (1 − C(112, 8)/C(128, 8)) = 0.5 · (1 − 0.33258)
    ///   = 0.33371; share = 16 · 0.33371/8 = 0.66742 (unlimited: 16 · (1 − 0.59230)/8 = 0.81541).
    /// - 3 groups over 8 nodes divide neither way: unlimited.
    #[test]
    fn group_limited_share_hand_worked() {
        let limit = Some((8, 4));
        assert!((dedup_share(256, 8, 8, limit) - 0.5).abs() < 1e-12);
        assert!((dedup_share(256, 8, 4, limit) - 0.392857).abs() < 1e-6);
        let q: f64 = (0..8)
            .map(|i| (192 - i) as f64 / (256 - i) as f64)
            .product();
        assert!((q - 0.09645).abs() < 1e-5, "{q}");
        assert!((dedup_share(256, 8, 4, None) - 0.45178).abs() < 1e-5);
        let q: f64 = (0..8)
            .map(|i| (112 - i) as f64 / (128 - i) as f64)
            .product();
        assert!((q - 0.33258).abs() < 1e-5, "{q}");
        assert!((dedup_share(256, 8, 16, limit) - 0.66742).abs() < 1e-5);
        assert!((dedup_share(256, 8, 16, None) - 0.81541).abs() < 1e-5);
        assert_eq!(
            dedup_share(240, 8, 8, Some((3, 2))),
            dedup_share(240, 8, 8, None)
        );
        // one node: nothing crosses, limited or not
        assert_eq!(dedup_share(256, 8, 1, limit), 1.0);
    }

    /// The steady-1F1B share of `a2a_hidden_share`, by hand: DeepSeek-V3's layout in
    /// Megatron's docs (`pipeline_parallel_layout.md`: pp 16, vpp 2) with 64 micro-batches: rank
    /// 0 warms up with 2·15 + 1·16 = 46 chunks plus the overlap's extra one, so 128 − 47 = 81
    /// of its 128 chunks overlap. Without a pipeline, 8 micro-batches: 7 of 8.
    #[test]
    fn a2a_hidden_share_hand_worked() {
        use crate::runtime::Stack;
        use crate::schedule::ScheduleKind;
        let d = Degrees {
            tp: 1,
            pp: 16,
            dp: 8,
            cp: 1,
            virtual_stages: 2,
        };
        let on = crate::EvalSettings {
            runtime: Stack::MegatronCoreEpOverlap.runtime(),
            ..crate::EvalSettings::default()
        };
        let experts = ExpertParallel {
            ep: 8,
            ..ExpertParallel::default()
        };
        let c = crate::ParallelConfig::new(d, 1, 64 * 8)
            .with_schedule(ScheduleKind::Interleaved1F1B)
            .with_settings(on)
            .with_experts(experts);
        assert_eq!(a2a_hidden_share(&c, 1), 81.0 / 128.0);
        // Megatron-Core's own runtime has the flag off: nothing hidden
        let off = c.clone().with_settings(crate::EvalSettings::default());
        assert_eq!(a2a_hidden_share(&off, 1), 0.0);
        // refused by Megatron: full recompute, pp > 1 without virtual stages, two MTP layers
        let full = c.clone().with_recompute(autopp_models::Recompute::Full);
        assert_eq!(a2a_hidden_share(&full, 1), 0.0);
        assert_eq!(a2a_hidden_share(&c, 2), 0.0);
        let flat = crate::ParallelConfig::new(
            Degrees {
                virtual_stages: 1,
                ..d
            },
            1,
            512,
        )
        .with_settings(on)
        .with_experts(experts);
        assert_eq!(a2a_hidden_share(&flat, 0), 0.0);
        let one = Degrees {
            pp: 1,
            dp: 16,
            virtual_stages: 1,
            ..d
        };
        let single = crate::ParallelConfig::new(one, 1, 128)
            .with_settings(on)
            .with_experts(experts);
        assert_eq!(a2a_hidden_share(&single, 0), 7.0 / 8.0);
    }
}
