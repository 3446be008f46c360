//! Mixture-of-experts FFNs and DeepSeek's multi-head latent attention (MLA): their `model.json`
//! keys and parameter counts.
//!
//! Sources: DeepSeek-V3 technical report (arXiv 2412.19437, §2.1.1 MLA, §2.1.2 DeepSeekMoE, §2.2
//! MTP) and its `modeling_deepseek.py`; Mixtral (arXiv 2401.04088, §2); Qwen3 technical report
//! (arXiv 2505.09388, Table 1–2); gpt-oss model card (OpenAI 2025, Table 1). Parameter counts
//! are those of the Hugging Face modules (`q_a_proj`, `kv_a_proj_with_mqa`, `experts.*`, …).

use serde::{Deserialize, Serialize};

use crate::ModelError;

/// A mixture-of-experts FFN: `num_experts` routed experts of width `moe_ffn_hidden_size`, each
/// token sent to `num_experts_per_tok` of them by a linear router, plus always-active shared
/// experts. The first `first_k_dense_layers` layers keep the dense FFN (`ffn_hidden_size`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoeSpec {
    /// Routed experts per MoE layer (`E`).
    pub num_experts: u64,
    /// Experts each token is routed to (top-`k`).
    pub num_experts_per_tok: u64,
    /// FFN hidden size of one routed expert (`f_e`).
    pub moe_ffn_hidden_size: u64,
    /// Shared (always active) experts per MoE layer.
    #[serde(default)]
    pub num_shared_experts: u64,
    /// Total FFN hidden size of the shared experts; defaults to
    /// `num_shared_experts · moe_ffn_hidden_size`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_expert_ffn_hidden_size: Option<u64>,
    /// Leading layers with a dense FFN instead (DeepSeek's `first_k_dense_replace`).
    #[serde(default)]
    pub first_k_dense_layers: u64,
    /// Expert projections carry biases (gpt-oss).
    #[serde(default)]
    pub expert_bias: bool,
    /// The router carries a bias (gpt-oss; DeepSeek-V3's `e_score_correction_bias`).
    #[serde(default)]
    pub router_bias: bool,
    /// Group-limited ("node-limited") routing: the routed experts form this many equal groups
    /// of consecutive experts, and each token's experts come from its best
    /// [`MoeSpec::router_group_topk`] groups (Hugging Face `n_group`; Megatron-Core
    /// `--moe-router-num-groups`); 0: unlimited. It changes no parameter or FLOP count, only
    /// how many nodes a token's all-to-all reaches.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub router_num_groups: u64,
    /// Groups each token's experts are drawn from (Hugging Face `topk_group`; Megatron-Core
    /// `--moe-router-group-topk`): DeepSeek-V3's 4 of 8, "each token will be sent to at most 4
    /// nodes" (arXiv 2412.19437, §2.1.2 and §3.2.2). 0 with `router_num_groups` 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub router_group_topk: u64,
}

/// serde's `skip_serializing_if` for the optional counts.
fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl MoeSpec {
    /// FFN hidden size of all shared experts together.
    pub fn shared_ffn(&self) -> u64 {
        self.shared_expert_ffn_hidden_size
            .unwrap_or(self.num_shared_experts * self.moe_ffn_hidden_size)
    }

    /// Parameters of one expert of width `f` (gated: `3·h·f`, else `2·h·f`), with biases
    /// (`gated ? 2f : f` + `h`) when `bias`, the FFN split `etp` ways (biases of the down
    /// projection replicated).
    pub fn expert_params(h: u64, f: u64, gated: bool, bias: bool, etp: u64) -> u64 {
        let f_in = if gated { 2 * f } else { f };
        let w = h * f_in / etp + f / etp * h;
        w + if bias { f_in / etp + h } else { 0 }
    }

    /// Router parameters: `h·E` (+ `E` with a bias), replicated on every GPU.
    pub fn router_params(&self, h: u64) -> u64 {
        h * self.num_experts
            + if self.router_bias {
                self.num_experts
            } else {
                0
            }
    }

    /// Parameters of one MoE FFN held by one GPU: the router, `E/ep` routed experts split `etp`
    /// ways, and the shared experts split `tp` ways. `ep` must divide `E`.
    pub fn ffn_params_per_gpu(&self, h: u64, gated: bool, tp: u64, ep: u64, etp: u64) -> u64 {
        let routed = self.num_experts / ep.max(1)
            * Self::expert_params(h, self.moe_ffn_hidden_size, gated, self.expert_bias, etp);
        let shared = if self.shared_ffn() > 0 {
            Self::expert_params(h, self.shared_ffn(), gated, false, tp)
        } else {
            0
        };
        self.router_params(h) + routed + shared
    }

    /// Parameters one token activates in one MoE FFN (unsharded): router, top-`k` experts and
    /// the shared experts.
    pub fn active_ffn_params(&self, h: u64, gated: bool) -> u64 {
        let one = Self::expert_params(h, self.moe_ffn_hidden_size, gated, self.expert_bias, 1);
        let shared = if self.shared_ffn() > 0 {
            Self::expert_params(h, self.shared_ffn(), gated, false, 1)
        } else {
            0
        };
        self.router_params(h) + self.num_experts_per_tok * one + shared
    }

    /// Checks the sizes; errors name the key (`moe.…`).
    pub fn validate(&self, num_layers: u64) -> Result<(), ModelError> {
        check_sizes(
            &[
                ("moe.num_experts", self.num_experts),
                ("moe.num_experts_per_tok", self.num_experts_per_tok),
                ("moe.moe_ffn_hidden_size", self.moe_ffn_hidden_size),
            ],
            1 << 22,
        )?;
        if self.num_experts_per_tok > self.num_experts {
            return Err(ModelError::invalid(
                "moe.num_experts_per_tok",
                &format!(
                    "= {} exceeds num_experts = {}: route each token to at most every expert",
                    self.num_experts_per_tok, self.num_experts
                ),
            ));
        }
        if self.num_shared_experts > 1 << 10 || self.shared_ffn() > 1 << 22 {
            return Err(ModelError::invalid(
                "moe.num_shared_experts",
                "is too large: shared experts may total at most 4194304 FFN columns",
            ));
        }
        self.validate_groups()?;
        if self.first_k_dense_layers > num_layers {
            return Err(ModelError::invalid(
                "moe.first_k_dense_layers",
                &format!(
                    "= {} exceeds num_layers = {num_layers}: at most every layer is dense",
                    self.first_k_dense_layers
                ),
            ));
        }
        Ok(())
    }
}

impl MoeSpec {
    /// Checks group-limited routing: both counts 0 (unlimited), or groups that divide the
    /// experts, `1 ≤ router_group_topk ≤ router_num_groups`, and enough experts in the chosen
    /// groups for the top-`k` (`topk_group · E/n_group ≥ k`, as Megatron-Core's router needs).
    fn validate_groups(&self) -> Result<(), ModelError> {
        let (g, m) = (self.router_num_groups, self.router_group_topk);
        if g == 0 && m == 0 {
            return Ok(());
        }
        if g == 0 || !self.num_experts.is_multiple_of(g) {
            return Err(ModelError::invalid(
                "moe.router_num_groups",
                &format!(
                    "= {g} must divide num_experts = {} into equal groups (0 with router_group_topk 0: unlimited routing)",
                    self.num_experts
                ),
            ));
        }
        if m == 0 || m > g || m * (self.num_experts / g) < self.num_experts_per_tok {
            return Err(ModelError::invalid(
                "moe.router_group_topk",
                &format!(
                    "= {m} must be from 1 to router_num_groups = {g} and its groups must hold the num_experts_per_tok = {} experts",
                    self.num_experts_per_tok
                ),
            ));
        }
        Ok(())
    }

    /// The group limit as `(groups, groups per token)` when it limits anything (fewer groups
    /// per token than groups), else `None`.
    pub fn group_limit(&self) -> Option<(u64, u64)> {
        let (g, m) = (self.router_num_groups, self.router_group_topk);
        (g > 1 && m >= 1 && m < g).then_some((g, m))
    }
}

/// DeepSeek's multi-head latent attention: queries through a rank-`q_lora_rank` bottleneck (or
/// a full projection when absent), keys and values from a shared rank-`kv_lora_rank` latent,
/// each head with `qk_nope_head_dim + qk_rope_head_dim` query/key and `v_head_dim` value sizes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MlaSpec {
    /// Query compression rank (`d_c'`); `None`: a full `h × a·d_qk` query projection (V2-Lite).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub q_lora_rank: Option<u64>,
    /// Key/value compression rank (`d_c`).
    pub kv_lora_rank: u64,
    /// Per-head query/key size without rotary embedding (`d_h`).
    pub qk_nope_head_dim: u64,
    /// Per-head rotary query/key size, the key part shared by all heads (`d_h^R`).
    pub qk_rope_head_dim: u64,
    /// Per-head value size.
    pub v_head_dim: u64,
}

impl MlaSpec {
    /// Query/key size per head: `qk_nope_head_dim + qk_rope_head_dim`.
    pub fn qk_head_dim(&self) -> u64 {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// Attention parameters (no norms of the layer) held by one GPU with the `a` heads split
    /// `tp` ways; the down projections and their norms are replicated (Megatron's MLA):
    /// `h·r_q + r_q + r_q·(a/t)·d_qk` (or `h·(a/t)·d_qk`), `h·(r_kv + d_r) + r_kv`,
    /// `r_kv·(a/t)·(d_h + d_v)` and `(a/t)·d_v·h`.
    pub fn params_per_gpu(&self, h: u64, heads: u64, tp: u64) -> u64 {
        let a = heads / tp.max(1);
        let q = match self.q_lora_rank {
            Some(r) => h * r + r + r * a * self.qk_head_dim(),
            None => h * a * self.qk_head_dim(),
        };
        let kv_down = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank;
        let kv_up = self.kv_lora_rank * a * (self.qk_nope_head_dim + self.v_head_dim);
        q + kv_down + kv_up + a * self.v_head_dim * h
    }

    /// Checks the sizes; errors name the key (`mla.…`).
    pub fn validate(&self) -> Result<(), ModelError> {
        check_sizes(
            &[
                ("mla.q_lora_rank", self.q_lora_rank.unwrap_or(1)),
                ("mla.kv_lora_rank", self.kv_lora_rank),
                ("mla.qk_nope_head_dim", self.qk_nope_head_dim),
                ("mla.qk_rope_head_dim", self.qk_rope_head_dim),
                ("mla.v_head_dim", self.v_head_dim),
            ],
            1 << 20,
        )
    }
}

/// Each size at least 1 and at most `max`; the error names the key.
fn check_sizes(sizes: &[(&str, u64)], max: u64) -> Result<(), ModelError> {
    for &(key, v) in sizes {
        if v == 0 {
            return Err(ModelError::invalid(key, "must be at least 1"));
        }
        if v > max {
            return Err(ModelError::invalid(
                key,
                &format!("= {v} is too large: autopp accepts at most {max}"),
            ));
        }
    }
    Ok(())
}
