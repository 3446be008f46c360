//! Hugging Face `config.json` loading for decoder-only families: Llama, Mistral, Qwen2, Qwen3,
//! GPT-2, GPT-NeoX, OPT and BLOOM, and the mixtures of experts Mixtral, Qwen3-MoE, DeepSeek-V2/V3
//! and gpt-oss (their keys: the `hf_moe` module).
//!
//! The family comes from `model_type`, else from `architectures[0]`, else from the key names.
//! Each family's keys map onto a [`TransformerSpec`]:
//!
//! | family | layers / hidden / heads / KV heads / FFN | positions | MLP, norm, bias | LM head |
//! |---|---|---|---|---|
//! | `llama`, `mistral`, `qwen2` | `num_hidden_layers`, `hidden_size`, `num_attention_heads`, `num_key_value_heads`, `intermediate_size` | rotary (none) | SwiGLU, RMSNorm, no bias (Qwen2: QKV bias; Llama: QKV bias when `attention_bias`) | `tie_word_embeddings`, default false |
//! | `gpt2` | `n_layer`, `n_embd`, `n_head`, —, `n_inner` (null → `4h`) | learned, `n_positions` | GeLU, LayerNorm, bias | tied |
//! | `gpt_neox` | `num_hidden_layers`, `hidden_size`, `num_attention_heads`, —, `intermediate_size` | rotary (none) | GeLU, LayerNorm, bias | `tie_word_embeddings`, default false |
//! | `opt` | `num_hidden_layers`, `hidden_size`, `num_attention_heads`, —, `ffn_dim` | learned, `max_position_embeddings` + 2 rows | ReLU, LayerNorm, bias (`enable_bias`) | tied |
//! | `bloom` | `n_layer`, `hidden_size` / `n_embed`, `n_head`, —, `4h` | ALiBi (none) | GeLU, LayerNorm, bias | tied |
//!
//! **Sequence length** (the config says how long a sequence *may* be, not what it was trained
//! at), first of: a `seq_length` key; `rope_scaling.original_max_position_embeddings` (the
//! pre-training context before long-context extension: 8192 for Llama 3.1, whose
//! `max_position_embeddings` is 131072); `max_position_embeddings` (`n_positions`, then `n_ctx`,
//! for GPT-2); for BLOOM, which has none, [`DEFAULT_BLOOM_SEQ_LENGTH`]. Plan at another length
//! with [`Model::with_seq_length`](crate::Model::with_seq_length) (the CLI's `--seq-len`).
//!
//! **Dropout** is on when the family's dropout probabilities (`resid_pdrop`, `dropout`,
//! `hidden_dropout`, `attention_dropout`, …) are above zero, with the library's defaults.
//!
//! **Not modelled** (documented approximations): Mistral's and Qwen2's sliding-window attention
//! (attention FLOPs and bytes are counted over the whole sequence); Llama's `o_proj` and MLP
//! biases when `attention_bias` / `mlp_bias` are set (`h` and `2f + h` parameters per layer);
//! BLOOM's LayerNorm after the word embedding (`2h` parameters). Configs whose shapes autopp
//! cannot represent are rejected with the key at fault: OPT's `word_embed_proj_dim` other than
//! `hidden_size` (OPT-350m's projected embeddings). A `head_dim` other than
//! `hidden_size / num_attention_heads` becomes the spec's `head_dim` (query width `a·head_dim`).

use serde_json::{Map, Value};

use crate::json::{kind, short};
use crate::transformer::{Norm, PositionEmbedding};
use crate::{ModelError, TransformerSpec};

/// Sequence length for a BLOOM config, which records none: BLOOM was trained at 2048.
pub const DEFAULT_BLOOM_SEQ_LENGTH: u64 = 2048;

/// A Hugging Face model family autopp reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HfFamily {
    /// `model_type: "llama"`.
    Llama,
    /// `model_type: "mistral"`.
    Mistral,
    /// `model_type: "qwen2"`.
    Qwen2,
    /// `model_type: "gpt2"`.
    Gpt2,
    /// `model_type: "gpt_neox"`.
    GptNeox,
    /// `model_type: "opt"`.
    Opt,
    /// `model_type: "bloom"`.
    Bloom,
    /// `model_type: "qwen3"` (qk-norm, `head_dim`).
    Qwen3,
    /// `model_type: "qwen3_moe"`.
    Qwen3Moe,
    /// `model_type: "mixtral"`.
    Mixtral,
    /// `model_type: "deepseek_v2"` (MLA, shared experts).
    DeepseekV2,
    /// `model_type: "deepseek_v3"` (MLA, shared experts, MTP).
    DeepseekV3,
    /// `model_type: "gpt_oss"` (alternating sliding windows, attention sinks).
    GptOss,
}

impl HfFamily {
    /// Every family, in the order messages list them.
    pub const ALL: [HfFamily; 13] = [
        HfFamily::Llama,
        HfFamily::Mistral,
        HfFamily::Qwen2,
        HfFamily::Gpt2,
        HfFamily::GptNeox,
        HfFamily::Opt,
        HfFamily::Bloom,
        HfFamily::Qwen3,
        HfFamily::Qwen3Moe,
        HfFamily::Mixtral,
        HfFamily::DeepseekV2,
        HfFamily::DeepseekV3,
        HfFamily::GptOss,
    ];

    /// The `model_type` value of this family.
    pub fn model_type(self) -> &'static str {
        match self {
            HfFamily::Llama => "llama",
            HfFamily::Mistral => "mistral",
            HfFamily::Qwen2 => "qwen2",
            HfFamily::Gpt2 => "gpt2",
            HfFamily::GptNeox => "gpt_neox",
            HfFamily::Opt => "opt",
            HfFamily::Bloom => "bloom",
            HfFamily::Qwen3 => "qwen3",
            HfFamily::Qwen3Moe => "qwen3_moe",
            HfFamily::Mixtral => "mixtral",
            HfFamily::DeepseekV2 => "deepseek_v2",
            HfFamily::DeepseekV3 => "deepseek_v3",
            HfFamily::GptOss => "gpt_oss",
        }
    }

    /// The prefix of this family's `architectures` class names.
    fn architecture_prefix(self) -> &'static str {
        match self {
            HfFamily::Llama => "Llama",
            HfFamily::Mistral => "Mistral",
            HfFamily::Qwen2 => "Qwen2For",
            HfFamily::Gpt2 => "GPT2",
            HfFamily::GptNeox => "GPTNeoX",
            HfFamily::Opt => "OPT",
            HfFamily::Bloom => "Bloom",
            HfFamily::Qwen3 => "Qwen3For",
            HfFamily::Qwen3Moe => "Qwen3MoeFor",
            HfFamily::Mixtral => "Mixtral",
            HfFamily::DeepseekV2 => "DeepseekV2",
            HfFamily::DeepseekV3 => "DeepseekV3",
            HfFamily::GptOss => "GptOss",
        }
    }
}

/// Keys whose presence marks a JSON object as a Hugging Face config.
pub const HF_MARKER_KEYS: [&str; 6] = [
    "model_type",
    "architectures",
    "num_hidden_layers",
    "n_layer",
    "n_embd",
    "n_head",
];

/// Whether a JSON object looks like a Hugging Face config.
pub fn is_hf_config(config: &Map<String, Value>) -> bool {
    HF_MARKER_KEYS.iter().any(|k| config.contains_key(*k))
}

fn supported() -> String {
    HfFamily::ALL
        .iter()
        .map(|f| f.model_type())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The family of a Hugging Face config.
pub fn family(config: &Map<String, Value>) -> Result<HfFamily, ModelError> {
    if let Some(value) = config.get("model_type") {
        let Some(name) = value.as_str() else {
            return Err(ModelError::invalid(
                "model_type",
                &format!("must be a string (got {})", short(value)),
            ));
        };
        return HfFamily::ALL
            .into_iter()
            .find(|f| f.model_type() == name)
            .ok_or_else(|| {
                ModelError::invalid(
                    "model_type",
                    &format!(
                        "= \"{name}\" is not supported: autopp reads {} configs; describe other models in an autopp model.json",
                        supported()
                    ),
                )
            });
    }
    let first_architecture = config
        .get("architectures")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(Value::as_str);
    if let Some(arch) = first_architecture {
        return HfFamily::ALL
            .into_iter()
            .find(|f| arch.starts_with(f.architecture_prefix()))
            .ok_or_else(|| {
                ModelError::invalid(
                    "architectures",
                    &format!(
                        "= [\"{arch}\"] is not supported: autopp reads {} configs",
                        supported()
                    ),
                )
            });
    }
    let has = |k: &str| config.contains_key(k);
    if has("n_layer") && has("n_embd") {
        Ok(HfFamily::Gpt2)
    } else if has("n_layer") {
        Ok(HfFamily::Bloom)
    } else if has("num_hidden_layers") && has("ffn_dim") {
        Ok(HfFamily::Opt)
    } else {
        Err(ModelError::invalid(
            "model_type",
            &format!(
                "is missing and the family cannot be told from the keys: add \"model_type\" (one of {})",
                supported()
            ),
        ))
    }
}

/// Reads typed values from a config, naming the Hugging Face key in every error.
pub(crate) struct Config<'a> {
    pub(crate) map: &'a Map<String, Value>,
    pub(crate) family: HfFamily,
}

impl Config<'_> {
    /// The first of `keys` present and not null.
    pub(crate) fn get(&self, keys: &[&'static str]) -> Option<(&'static str, &Value)> {
        keys.iter()
            .find_map(|&k| self.map.get(k).filter(|v| !v.is_null()).map(|v| (k, v)))
    }

    /// A positive integer under the first of `keys` present, if any.
    pub(crate) fn uint(&self, keys: &[&'static str]) -> Result<Option<u64>, ModelError> {
        let Some((key, value)) = self.get(keys) else {
            return Ok(None);
        };
        let what = match value {
            Value::Number(n) => match n.as_u64() {
                Some(0) => return Err(ModelError::invalid(key, "must be at least 1")),
                Some(v) => return Ok(Some(v)),
                None if n.as_f64().is_some_and(|v| v < 0.0) => "is negative",
                None if n.as_f64().is_some_and(|v| v >= 1.8e19) => "is too large",
                None => "is not a whole number",
            },
            other => kind(other),
        };
        let what = if what.starts_with("is ") {
            what.to_string()
        } else {
            format!("is {what}")
        };
        Err(ModelError::invalid(
            key,
            &format!(
                "must be a positive whole number, but {what} ({})",
                short(value)
            ),
        ))
    }

    /// A positive integer that must be present.
    pub(crate) fn required(&self, keys: &[&'static str]) -> Result<u64, ModelError> {
        self.uint(keys)?.ok_or_else(|| {
            let also = if keys.len() > 1 {
                format!(" (or {})", keys[1..].join(", "))
            } else {
                String::new()
            };
            ModelError::invalid(
                keys[0],
                &format!(
                    "is missing from this Hugging Face {} config{also}: add it",
                    self.family.model_type()
                ),
            )
        })
    }

    /// A boolean under `key`, or `default`.
    pub(crate) fn boolean(&self, key: &'static str, default: bool) -> Result<bool, ModelError> {
        match self.get(&[key]) {
            None => Ok(default),
            Some((_, Value::Bool(b))) => Ok(*b),
            Some((_, other)) => Err(ModelError::invalid(
                key,
                &format!("must be true or false (got {})", short(other)),
            )),
        }
    }

    /// Whether any of the dropout probabilities `keys` (each defaulting to `default`) is above 0.
    pub(crate) fn dropout(&self, keys: &[&'static str], default: f64) -> Result<bool, ModelError> {
        for &key in keys {
            let p = match self.get(&[key]) {
                None => default,
                Some((_, Value::Number(n))) => n.as_f64().unwrap_or(0.0),
                Some((_, other)) => {
                    return Err(ModelError::invalid(
                        key,
                        &format!("must be a probability (got {})", short(other)),
                    ))
                }
            };
            if p > 0.0 {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The sequence length by the module's rule, from `position_keys` when no better key exists.
    pub(crate) fn seq_length(
        &self,
        position_keys: &[&'static str],
    ) -> Result<Option<u64>, ModelError> {
        if let Some(s) = self.uint(&["seq_length"])? {
            return Ok(Some(s));
        }
        if let Some(Value::Object(scaling)) = self.map.get("rope_scaling") {
            if let Some(v) = scaling.get("original_max_position_embeddings") {
                return match v.as_u64() {
                    Some(s) if s > 0 => Ok(Some(s)),
                    _ => Err(ModelError::invalid(
                        "rope_scaling.original_max_position_embeddings",
                        &format!("must be a positive whole number (got {})", short(v)),
                    )),
                };
            }
        }
        self.uint(position_keys)
    }
}

/// Maps a Hugging Face config onto a [`TransformerSpec`] called `name` (see the module
/// documentation for the rules). The result is validated.
pub fn spec_from_config(
    config: &Map<String, Value>,
    name: &str,
) -> Result<TransformerSpec, ModelError> {
    let family = family(config)?;
    let c = Config {
        map: config,
        family,
    };
    let spec = match family {
        HfFamily::Llama | HfFamily::Mistral | HfFamily::Qwen2 => llama_like(&c, name)?,
        HfFamily::Gpt2 => gpt2(&c, name)?,
        HfFamily::GptNeox => gpt_neox(&c, name)?,
        HfFamily::Opt => opt(&c, name)?,
        HfFamily::Bloom => bloom(&c, name)?,
        HfFamily::Qwen3 | HfFamily::Qwen3Moe | HfFamily::Mixtral | HfFamily::GptOss => {
            crate::hf_moe::llama_moe(&c, name)?
        }
        HfFamily::DeepseekV2 | HfFamily::DeepseekV3 => crate::hf_moe::deepseek(&c, name)?,
    };
    let mut spec = spec;
    if let Some(head_dim) = c.uint(&["head_dim"])? {
        if head_dim != spec.hidden_size / spec.num_attention_heads.max(1)
            || !spec.hidden_size.is_multiple_of(spec.num_attention_heads)
        {
            spec.head_dim = Some(head_dim);
        }
    }
    spec.validate()?;
    Ok(spec)
}

/// The common shape keys of the Llama-style and GPT-NeoX families.
pub(crate) fn base(c: &Config, name: &str, seq: u64) -> Result<TransformerSpec, ModelError> {
    Ok(TransformerSpec::new(
        name,
        c.required(&["num_hidden_layers"])?,
        c.required(&["hidden_size"])?,
        c.required(&["num_attention_heads"])?,
        c.required(&["vocab_size"])?,
        seq,
    ))
}

/// Llama, Mistral and Qwen2: SwiGLU, RMSNorm, rotary positions, no biases except QKV ones.
pub(crate) fn llama_like(c: &Config, name: &str) -> Result<TransformerSpec, ModelError> {
    let seq = c.seq_length(&["max_position_embeddings"])?;
    let seq = seq.ok_or_else(|| missing_seq(c))?;
    let mut spec = base(c, name, seq)?;
    spec.num_kv_heads = c.uint(&["num_key_value_heads"])?;
    spec.ffn_hidden_size = Some(c.required(&["intermediate_size"])?);
    spec.gated_mlp = true;
    spec.tied_embeddings = c.boolean("tie_word_embeddings", false)?;
    spec.bias = false;
    spec.qkv_bias = match c.family {
        HfFamily::Qwen2 => Some(true),
        _ if c.boolean("attention_bias", false)? => Some(true),
        _ => None,
    };
    spec.norm = Norm::Rmsnorm;
    spec.position_embedding = PositionEmbedding::None;
    spec.dropout = c.dropout(&["attention_dropout"], 0.0)?;
    Ok(spec)
}

/// GPT-2: learned positions, GeLU MLP of `n_inner` (null → `4h`), LayerNorm, biases, tied.
fn gpt2(c: &Config, name: &str) -> Result<TransformerSpec, ModelError> {
    let rows = c.required(&["n_positions", "n_ctx"])?;
    let seq = c.uint(&["seq_length"])?.unwrap_or(rows);
    let mut spec = TransformerSpec::new(
        name,
        c.required(&["n_layer", "num_hidden_layers"])?,
        c.required(&["n_embd", "hidden_size"])?,
        c.required(&["n_head", "num_attention_heads"])?,
        c.required(&["vocab_size"])?,
        seq,
    );
    spec.ffn_hidden_size = c.uint(&["n_inner"])?;
    spec.tied_embeddings = c.boolean("tie_word_embeddings", true)?;
    spec.position_embedding = PositionEmbedding::Learned;
    spec.max_position_embeddings = Some(rows);
    spec.dropout = c.dropout(&["resid_pdrop", "embd_pdrop", "attn_pdrop"], 0.1)?;
    Ok(spec)
}

/// GPT-NeoX: rotary positions, GeLU MLP, LayerNorm, biases, untied by default.
fn gpt_neox(c: &Config, name: &str) -> Result<TransformerSpec, ModelError> {
    let seq = c.seq_length(&["max_position_embeddings"])?;
    let mut spec = base(c, name, seq.ok_or_else(|| missing_seq(c))?)?;
    spec.ffn_hidden_size = c.uint(&["intermediate_size"])?;
    spec.tied_embeddings = c.boolean("tie_word_embeddings", false)?;
    spec.bias = c.boolean("attention_bias", true)?;
    spec.dropout = c.dropout(&["hidden_dropout", "attention_dropout"], 0.0)?;
    Ok(spec)
}

/// OPT: learned positions with 2 extra rows, ReLU MLP of `ffn_dim`, LayerNorm, biases, tied.
fn opt(c: &Config, name: &str) -> Result<TransformerSpec, ModelError> {
    let positions = c.required(&["max_position_embeddings"])?;
    let seq = c.uint(&["seq_length"])?.unwrap_or(positions);
    let mut spec = base(c, name, seq)?;
    if let Some(proj) = c.uint(&["word_embed_proj_dim"])? {
        if proj != spec.hidden_size {
            return Err(ModelError::invalid(
                "word_embed_proj_dim",
                &format!(
                    "= {proj} differs from hidden_size = {}: OPT's projected embeddings (OPT-350m) are not supported; describe this model with an explicit layer list",
                    spec.hidden_size
                ),
            ));
        }
    }
    spec.ffn_hidden_size = Some(c.required(&["ffn_dim"])?);
    spec.tied_embeddings = c.boolean("tie_word_embeddings", true)?;
    spec.bias = c.boolean("enable_bias", true)?;
    spec.position_embedding = PositionEmbedding::Learned;
    // OPTLearnedPositionalEmbedding offsets positions by 2.
    spec.max_position_embeddings = Some(positions.checked_add(2).ok_or_else(|| {
        ModelError::invalid(
            "max_position_embeddings",
            "is too large: give the positions the model learns",
        )
    })?);
    spec.dropout = c.dropout(&["dropout", "attention_dropout"], 0.1)?;
    Ok(spec)
}

/// BLOOM: ALiBi (no position parameters), GeLU MLP of `4h`, LayerNorm, biases, tied.
fn bloom(c: &Config, name: &str) -> Result<TransformerSpec, ModelError> {
    let seq = c.uint(&["seq_length"])?.unwrap_or(DEFAULT_BLOOM_SEQ_LENGTH);
    let mut spec = TransformerSpec::new(
        name,
        c.required(&["n_layer", "num_hidden_layers"])?,
        c.required(&["hidden_size", "n_embed"])?,
        c.required(&["n_head", "num_attention_heads"])?,
        c.required(&["vocab_size"])?,
        seq,
    );
    spec.tied_embeddings = c.boolean("tie_word_embeddings", true)?;
    spec.dropout = c.dropout(&["hidden_dropout", "attention_dropout"], 0.0)?;
    Ok(spec)
}

pub(crate) fn missing_seq(c: &Config) -> ModelError {
    ModelError::invalid(
        "max_position_embeddings",
        &format!(
            "is missing from this Hugging Face {} config: add it (or a \"seq_length\" key) to give the sequence length",
            c.family.model_type()
        ),
    )
}
