//! Parameter counts of a [`TransformerSpec`]: per layer (dense or MoE, per GPU under tensor and
//! expert parallelism), total and activated per token.
//!
//! Dense layers follow Narayanan et al. 2021 (SC21, §5.1); MoE and MLA layers count the
//! Hugging Face modules (see the `moe` module for sources).

use super::{Norm, TransformerSpec};
use crate::ModelError;

impl TransformerSpec {
    /// Parameters of one norm: `2·h` (LayerNorm) or `h` (RMSNorm).
    pub fn norm_params(&self) -> u64 {
        match self.norm {
            Norm::Layernorm => 2 * self.hidden_size,
            Norm::Rmsnorm => self.hidden_size,
        }
    }

    /// Whether transformer layer `i` (0-based) has a mixture-of-experts FFN.
    pub fn is_moe_layer(&self, i: u64) -> bool {
        self.moe
            .as_ref()
            .is_some_and(|m| i >= m.first_k_dense_layers)
    }

    /// Whether transformer layer `i` (0-based) attends within the sliding window: all but the
    /// last of every `sliding_window_pattern` layers (gpt-oss: even layers).
    pub fn is_sliding_layer(&self, i: u64) -> bool {
        let Some(_) = self.sliding_window else {
            return false;
        };
        let p = self.sliding_window_pattern.unwrap_or(1).max(1);
        p == 1 || i % p != p - 1
    }

    /// Parameters of one transformer layer, unsharded: attention `h·a·d + 2·h·g·d + a·d·h` (or
    /// MLA's), the FFN (dense `2·h·f`, gated `3·h·f`; or every expert and the router), two norms,
    /// and biases when present. For a MoE model this is a MoE layer (the last one).
    pub fn layer_params(&self) -> u64 {
        self.layer_params_per_gpu(1)
    }

    /// Parameters of the last transformer layer held by one GPU at tensor-parallel degree `tp`
    /// (Megatron's sharding; experts unsharded): see [`TransformerSpec::layer_params_at`].
    pub fn layer_params_per_gpu(&self, tp: u64) -> u64 {
        self.layer_params_at(self.num_layers.saturating_sub(1), tp, 1, 1)
    }

    /// Parameters of transformer layer `i` held by one GPU at tensor-parallel degree `tp`,
    /// expert-parallel degree `ep` and expert-tensor-parallel degree `etp` (Megatron's
    /// sharding): the QKV and MLP-up weights and biases are split by columns, the
    /// output-projection and MLP-down weights by rows, and the row-parallel biases and the
    /// norms are replicated. When `tp` exceeds the key/value heads each GPU holds one
    /// (replicated) key/value head. A MoE layer holds the router, `E/ep` experts split `etp`
    /// ways and the shared experts split `tp` ways.
    pub fn layer_params_at(&self, i: u64, tp: u64, ep: u64, etp: u64) -> u64 {
        let t = tp.max(1);
        let ffn = match &self.moe {
            Some(m) if self.is_moe_layer(i) => {
                m.ffn_params_per_gpu(self.hidden_size, self.gated_mlp, t, ep.max(1), etp.max(1))
            }
            _ => self.dense_ffn_params_per_gpu(t),
        };
        self.attention_params_per_gpu(t) + ffn + 2 * self.norm_params()
    }

    /// Attention parameters of one layer on one GPU at tensor-parallel degree `tp` (no norms
    /// around it): MLA's ([`super::MlaSpec::params_per_gpu`]), or QKV `h·(a·d + 2·g·d)/t` and
    /// output `(a·d/t)·h`, with biases, qk-norms `2·d` and sinks `a/t` when present.
    pub fn attention_params_per_gpu(&self, tp: u64) -> u64 {
        let t = tp.max(1);
        let h = self.hidden_size;
        if let Some(mla) = &self.mla {
            return mla.params_per_gpu(h, self.num_attention_heads, t);
        }
        let q = self.q_width() / t;
        let kv = self.kv_width_per_gpu(t);
        let qkv_bias = if self.has_qkv_bias() { q + 2 * kv } else { 0 };
        let out_bias = if self.bias { h } else { 0 };
        let qk_norm = if self.qk_norm { 2 * self.head_dim() } else { 0 };
        let sinks = if self.attention_sinks {
            self.num_attention_heads / t
        } else {
            0
        };
        h * (q + 2 * kv) + q * h + qkv_bias + out_bias + qk_norm + sinks
    }

    /// Dense FFN parameters on one GPU: `h·f_in/t + (f/t)·h`, biases `f_in/t + h`.
    pub fn dense_ffn_params_per_gpu(&self, tp: u64) -> u64 {
        let t = tp.max(1);
        let h = self.hidden_size;
        let mlp_in = self.mlp_in_width() / t;
        let f = self.ffn() / t;
        h * mlp_in + f * h + if self.bias { mlp_in + h } else { 0 }
    }

    /// Width of the MLP's first projection: `f`, or `2·f` for a gated MLP (gate and up).
    pub fn mlp_in_width(&self) -> u64 {
        if self.gated_mlp {
            2 * self.ffn()
        } else {
            self.ffn()
        }
    }

    /// Key (or value) projection width on one GPU at tensor-parallel degree `tp`: `g·d/tp`
    /// when `tp` divides `g`, else one replicated head of `d`.
    pub fn kv_width_per_gpu(&self, tp: u64) -> u64 {
        let t = tp.max(1);
        let g = self.kv_heads();
        if g.is_multiple_of(t) {
            g / t * self.head_dim()
        } else {
            self.head_dim()
        }
    }

    /// Parameters of the embedding layer: `V·h` (+ `P·h` for a learned table of `P` positions).
    pub fn embedding_params(&self) -> u64 {
        (self.vocab_size + self.position_table_rows()) * self.hidden_size
    }

    /// Parameters of the head layer: the final norm, plus `V·h` when the head is untied.
    pub fn head_params(&self) -> u64 {
        let head = if self.tied_embeddings {
            0
        } else {
            self.vocab_size * self.hidden_size
        };
        self.norm_params() + head
    }

    /// Parameters of one multi-token-prediction module (DeepSeek-V3 §2.2) at tensor-parallel
    /// degree `tp`, expert degrees `ep`, `etp`: a layer like the last one, the projection
    /// `M = 2h × h` (split `tp` ways) and three norms (embedding, hidden, output). The embedding
    /// and LM head are shared with the main model and not counted.
    pub fn mtp_layer_params(&self, tp: u64, ep: u64, etp: u64) -> u64 {
        let h = self.hidden_size;
        self.layer_params_at(self.num_layers.saturating_sub(1), tp, ep, etp)
            + 2 * h * h / tp.max(1)
            + 3 * self.norm_params()
    }

    /// Parameters of all MTP modules (0 without them).
    pub fn mtp_params(&self) -> u64 {
        self.mtp_num_layers * self.mtp_layer_params(1, 1, 1)
    }

    /// Total parameters of the model (unpadded vocabulary, tied weights counted once), MTP
    /// modules included.
    pub fn num_params(&self) -> u64 {
        let layers: u64 = if self.moe.is_some() {
            (0..self.num_layers)
                .map(|i| self.layer_params_at(i, 1, 1, 1))
                .sum()
        } else {
            self.num_layers * self.layer_params()
        };
        self.embedding_params() + layers + self.head_params() + self.mtp_params()
    }

    /// Parameters one token activates in the main model (MTP modules excluded): embedding, head,
    /// attention and norms of every layer, dense FFNs, and in MoE layers the router, top-`k`
    /// routed experts and the shared experts. Equals [`TransformerSpec::num_params`] for a dense
    /// model without MTP.
    pub fn active_params(&self) -> u64 {
        let h = self.hidden_size;
        let layers: u64 = (0..self.num_layers)
            .map(|i| {
                let ffn = match &self.moe {
                    Some(m) if self.is_moe_layer(i) => m.active_ffn_params(h, self.gated_mlp),
                    _ => self.dense_ffn_params_per_gpu(1),
                };
                self.attention_params_per_gpu(1) + ffn + 2 * self.norm_params()
            })
            .sum();
        self.embedding_params() + layers + self.head_params()
    }

    /// Validates the keys of MoE, MLA, head size and sliding windows.
    pub(super) fn validate_extensions(&self) -> Result<(), ModelError> {
        if let Some(m) = &self.moe {
            m.validate(self.num_layers)?;
        }
        if let Some(mla) = &self.mla {
            mla.validate()?;
        }
        if self.sliding_window_pattern.is_some() && self.sliding_window.is_none() {
            return Err(ModelError::invalid(
                "sliding_window_pattern",
                "needs \"sliding_window\" (the window in tokens): add it or remove the pattern",
            ));
        }
        Ok(())
    }
}
