//! Decoder-only transformers: the `model.json` description, its validation and its parameter
//! counts. The expansion into per-GPU layers ([`TransformerSpec::layers`]) lives in the private
//! `expand` submodule.
//!
//! Sources for every count here: parameters and FLOPs follow Narayanan et al. 2021 (SC21, §5.1,
//! the derivation of eq. 3); activation bytes follow Korthikanti et al. 2022 ("Reducing Activation
//! Recomputation in Large Transformer Models"), §4 and Table 2, generalised to grouped-query
//! attention, any FFN width and gated MLPs by counting the same stored tensors.

mod block;
mod eager;
mod expand;
mod moe;
mod params;

pub(crate) use expand::check_shard;
pub use moe::{MlaSpec, MoeSpec};

use serde::{Deserialize, Serialize};

use crate::ModelError;

/// Which normalisation a transformer uses (LayerNorm has a weight and a bias, RMSNorm a weight).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Norm {
    /// LayerNorm: `2·h` parameters.
    #[default]
    Layernorm,
    /// RMSNorm: `h` parameters.
    Rmsnorm,
}

/// How positions enter the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum PositionEmbedding {
    /// No parameters (rotary, ALiBi, or none at all).
    #[default]
    None,
    /// A learned `max_position_embeddings × hidden_size` table (GPT-2, GPT-3, OPT).
    Learned,
}

fn default_true() -> bool {
    true
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Upper bounds on `model.json` sizes. They are far above any real model and keep every count
/// this crate makes inside 64 bits.
pub mod limits {
    /// Most transformer layers.
    pub const MAX_NUM_LAYERS: u64 = 100_000;
    /// Largest hidden size (also bounds heads and key/value heads).
    pub const MAX_HIDDEN_SIZE: u64 = 1 << 20;
    /// Largest FFN hidden size.
    pub const MAX_FFN_HIDDEN_SIZE: u64 = 1 << 22;
    /// Largest vocabulary.
    pub const MAX_VOCAB_SIZE: u64 = 1 << 28;
    /// Longest sequence (and learned position table), in tokens.
    pub const MAX_SEQ_LENGTH: u64 = 1 << 26;
    /// Largest global batch, in sequences.
    pub const MAX_GLOBAL_BATCH_SIZE: u64 = 1 << 40;
}

/// A decoder-only transformer as autopp's `model.json` describes it. Unknown keys are rejected.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransformerSpec {
    /// Model name, e.g. `gpt3-175b`.
    pub name: String,
    /// Transformer layers (`L`).
    pub num_layers: u64,
    /// Hidden size (`h`).
    pub hidden_size: u64,
    /// Attention heads (`a`).
    pub num_attention_heads: u64,
    /// Key/value heads (`g`); defaults to `num_attention_heads` (no grouped-query attention).
    #[serde(default)]
    pub num_kv_heads: Option<u64>,
    /// FFN hidden size (`f`); defaults to `4·hidden_size`.
    #[serde(default)]
    pub ffn_hidden_size: Option<u64>,
    /// Vocabulary size (`V`), unpadded.
    pub vocab_size: u64,
    /// Sequence length in tokens (`s`).
    pub seq_length: u64,
    /// Gated MLP (SwiGLU / GeGLU): three `h × f` matrices instead of two.
    #[serde(default)]
    pub gated_mlp: bool,
    /// The LM head shares the word-embedding matrix.
    #[serde(default = "default_true")]
    pub tied_embeddings: bool,
    /// Default global batch for planning, in sequences.
    #[serde(default)]
    pub global_batch_size: Option<u64>,
    /// Linear layers carry biases (GPT-2/3, OPT, BLOOM); Llama-style models have none.
    #[serde(default = "default_true")]
    pub bias: bool,
    /// Normalisation kind.
    #[serde(default)]
    pub norm: Norm,
    /// Position embedding kind.
    #[serde(default)]
    pub position_embedding: PositionEmbedding,
    /// Dropout is active in training, so its masks are stored (Korthikanti et al.'s counts
    /// assume it is).
    #[serde(default = "default_true")]
    pub dropout: bool,
    /// Rows of the learned position table (`position_embedding: learned` only); defaults to
    /// `seq_length`. Larger when a model is planned at a shorter sequence than its table holds
    /// (GPT-2's 1024 positions; OPT's table has 2 extra rows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_position_embeddings: Option<u64>,
    /// The QKV projection carries a bias (`h + 2·g·h/a` parameters); defaults to `bias`. Qwen2
    /// has QKV biases and no others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qkv_bias: Option<bool>,
    /// Size of one attention head; defaults to `hidden_size / num_attention_heads` (Qwen3 and
    /// gpt-oss set it apart: the query width is then `num_attention_heads · head_dim`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<u64>,
    /// RMSNorm of each query and key head (Qwen3): `2·head_dim` parameters per layer.
    #[serde(default, skip_serializing_if = "is_false")]
    pub qk_norm: bool,
    /// One learned attention-sink logit per head (gpt-oss): `num_attention_heads` parameters.
    #[serde(default, skip_serializing_if = "is_false")]
    pub attention_sinks: bool,
    /// Sliding-window size in tokens of the windowed layers (see `sliding_window_pattern`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<u64>,
    /// Of every `sliding_window_pattern` layers all but the last attend within the window
    /// (gpt-oss alternates: 2); defaults to 1 with a window, every layer windowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window_pattern: Option<u64>,
    /// Mixture-of-experts FFNs (absent: every FFN dense).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeSpec>,
    /// DeepSeek's multi-head latent attention in place of (grouped-query) attention.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mla: Option<MlaSpec>,
    /// Multi-token-prediction modules after the last layer (DeepSeek-V3: 1), each a transformer
    /// layer with its own projection `2h × h` and norms; embedding and LM head shared.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub mtp_num_layers: u64,
}

impl TransformerSpec {
    /// A transformer with the `model.json` defaults for every optional key: no grouped-query
    /// attention, `f = 4h`, plain GeLU MLP, tied embeddings, biases, LayerNorm, no position
    /// parameters, dropout on, no default batch.
    pub fn new(
        name: &str,
        num_layers: u64,
        hidden_size: u64,
        num_attention_heads: u64,
        vocab_size: u64,
        seq_length: u64,
    ) -> Self {
        TransformerSpec {
            name: name.to_string(),
            num_layers,
            hidden_size,
            num_attention_heads,
            num_kv_heads: None,
            ffn_hidden_size: None,
            vocab_size,
            seq_length,
            gated_mlp: false,
            tied_embeddings: true,
            global_batch_size: None,
            bias: true,
            norm: Norm::Layernorm,
            position_embedding: PositionEmbedding::None,
            dropout: true,
            max_position_embeddings: None,
            qkv_bias: None,
            head_dim: None,
            qk_norm: false,
            attention_sinks: false,
            sliding_window: None,
            sliding_window_pattern: None,
            moe: None,
            mla: None,
            mtp_num_layers: 0,
        }
    }

    /// Key/value heads (`g`).
    pub fn kv_heads(&self) -> u64 {
        self.num_kv_heads.unwrap_or(self.num_attention_heads)
    }

    /// FFN hidden size (`f`).
    pub fn ffn(&self) -> u64 {
        self.ffn_hidden_size.unwrap_or(4 * self.hidden_size)
    }

    /// Width of the key (or value) projection: `g·d` (`d = h/a` unless `head_dim` is set).
    pub fn kv_width(&self) -> u64 {
        self.kv_heads() * self.head_dim()
    }

    /// Width of the query projection (and output-projection input): `a·d`, `h` unless
    /// `head_dim` is set.
    pub fn q_width(&self) -> u64 {
        self.num_attention_heads * self.head_dim()
    }

    /// Size of one attention head (`d`): `head_dim`, else `h/a`.
    pub fn head_dim(&self) -> u64 {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Whether the QKV projection has a bias.
    pub fn has_qkv_bias(&self) -> bool {
        self.qkv_bias.unwrap_or(self.bias)
    }

    /// Rows of the learned position table (0 without learned positions).
    pub fn position_table_rows(&self) -> u64 {
        match self.position_embedding {
            PositionEmbedding::Learned => self.max_position_embeddings.unwrap_or(self.seq_length),
            PositionEmbedding::None => 0,
        }
    }

    /// Checks every size is positive and within [`limits`], and the shapes agree; errors name
    /// the key and the fix.
    pub fn validate(&self) -> Result<(), ModelError> {
        use limits::*;
        if self.name.trim().is_empty() {
            return Err(ModelError::invalid("name", "must not be empty"));
        }
        let sizes = [
            ("num_layers", Some(self.num_layers), MAX_NUM_LAYERS),
            ("hidden_size", Some(self.hidden_size), MAX_HIDDEN_SIZE),
            (
                "num_attention_heads",
                Some(self.num_attention_heads),
                MAX_HIDDEN_SIZE,
            ),
            ("num_kv_heads", self.num_kv_heads, MAX_HIDDEN_SIZE),
            ("ffn_hidden_size", self.ffn_hidden_size, MAX_FFN_HIDDEN_SIZE),
            ("vocab_size", Some(self.vocab_size), MAX_VOCAB_SIZE),
            ("seq_length", Some(self.seq_length), MAX_SEQ_LENGTH),
            (
                "global_batch_size",
                self.global_batch_size,
                MAX_GLOBAL_BATCH_SIZE,
            ),
            (
                "max_position_embeddings",
                self.max_position_embeddings,
                MAX_SEQ_LENGTH,
            ),
            ("head_dim", self.head_dim, MAX_HIDDEN_SIZE / 64),
            ("sliding_window", self.sliding_window, MAX_SEQ_LENGTH),
            (
                "sliding_window_pattern",
                self.sliding_window_pattern,
                MAX_NUM_LAYERS,
            ),
            (
                "mtp_num_layers",
                Some(self.mtp_num_layers).filter(|&n| n > 0),
                16,
            ),
        ];
        for (key, value, max) in sizes {
            match value {
                Some(0) => return Err(ModelError::invalid(key, "must be at least 1")),
                Some(v) if v > max => {
                    return Err(ModelError::invalid(
                        key,
                        &format!("= {v} is too large: autopp accepts at most {max}"),
                    ))
                }
                _ => {}
            }
        }
        if self.head_dim.is_none() && !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(ModelError::invalid(
                "hidden_size",
                &format!(
                    "= {} is not divisible by num_attention_heads = {}: choose a head count that divides the hidden size",
                    self.hidden_size, self.num_attention_heads
                ),
            ));
        }
        if !self.num_attention_heads.is_multiple_of(self.kv_heads()) {
            return Err(ModelError::invalid(
                "num_kv_heads",
                &format!(
                    "= {} does not divide num_attention_heads = {}: choose a key/value head count that divides the head count",
                    self.kv_heads(),
                    self.num_attention_heads
                ),
            ));
        }
        self.validate_extensions()?;
        if let Some(rows) = self.max_position_embeddings {
            if self.position_embedding != PositionEmbedding::Learned {
                return Err(ModelError::invalid(
                    "max_position_embeddings",
                    "only applies with \"position_embedding\": \"learned\": remove it",
                ));
            }
            if rows < self.seq_length {
                return Err(ModelError::invalid(
                    "seq_length",
                    &format!(
                        "= {} exceeds the {rows} learned positions (max_position_embeddings): shorten the sequence",
                        self.seq_length
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The same model planned at another sequence length. A learned position table keeps its
    /// rows, so `seq_length` may not exceed them.
    pub fn with_seq_length(mut self, seq_length: u64) -> Result<Self, ModelError> {
        if self.position_embedding == PositionEmbedding::Learned {
            let rows = self.position_table_rows();
            if seq_length > rows {
                return Err(ModelError::invalid(
                    "seq_length",
                    &format!(
                        "= {seq_length} exceeds the {rows} learned positions of model '{}': choose at most {rows}",
                        self.name
                    ),
                ));
            }
            self.max_position_embeddings = Some(rows);
        }
        self.seq_length = seq_length;
        self.validate()?;
        Ok(self)
    }
}
