//! # autopp-models
//!
//! autopp's model IR: a model is an ordered list of layers, each knowing its parameters, the
//! FLOPs of its forward / backward-input / backward-weight passes, the activation bytes it keeps
//! for backward under each recompute mode, and how it shards under tensor parallelism.
//!
//! This crate knows nothing about GPUs, clusters or schedules.
//!
//! ```
//! use autopp_models::{load, ShardSpec};
//!
//! let model = load("gpt3-175b").unwrap();
//! assert_eq!(model.name(), "gpt3-175b");
//! // 174.6 billion parameters
//! assert_eq!(model.num_params() / 100_000_000, 1746);
//! let layers = model.layers(&ShardSpec { tp: 8, ..ShardSpec::default() }).unwrap();
//! assert_eq!(layers.len(), 96 + 2); // embedding, 96 transformer layers, head
//! ```
//!
//! Models come from a bundled preset ([`presets()`]), autopp's `model.json`
//! ([`TransformerSpec`]), a Hugging Face `config.json` ([`hf`]) or an explicit layer list
//! ([`LayerListSpec`]); [`load()`] tells them apart. Bad input is a [`ModelError`] whose message is
//! one line naming the key at fault and the fix:
//!
//! ```
//! use autopp_models::load_str;
//!
//! let err = load_str(r#"{"name": "m", "num_layers": 2, "hidden_size": -64}"#, "m.json");
//! assert_eq!(
//!     err.unwrap_err().to_string(),
//!     "model key 'hidden_size' must be a positive whole number, but is negative (-64)"
//! );
//! ```

#![warn(missing_docs)]

pub mod custom;
pub mod defaults;
pub mod describe;
pub mod hf;
mod hf_moe;
mod json;
pub mod layer;
pub mod load;
pub mod presets;
pub mod seqlen;
pub mod transformer;
pub mod units;

pub use custom::{CustomLayer, LayerListSpec};
pub use defaults::Defaulted;
pub use layer::{
    ActivationBytes, AttentionKernel, Collective, CollectiveKind, LayerCost, LayerKind, Op,
    Recompute, RecomputeModules, ShardSpec,
};
pub use load::{load, load_file, load_str};
pub use presets::{presets, Preset};
pub use seqlen::{load_with_source, SeqLenSource};
pub use transformer::{MlaSpec, MoeSpec, Norm, PositionEmbedding, TransformerSpec};

use serde::Serialize;

/// Why a model could not be loaded or expanded. Every message names the key or flag at fault
/// and, where there is one, the fix.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The file could not be read.
    #[error("cannot read model file '{path}': {source}")]
    Io {
        /// The path given.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The JSON is malformed or a key has the wrong type.
    #[error("{origin}: {message}")]
    Json {
        /// Where the JSON came from (a path or a preset name).
        origin: String,
        /// What is wrong, with line and column where known.
        message: String,
    },
    /// A key is missing, unknown, or has a value out of range.
    #[error("model key '{key}' {message}")]
    Invalid {
        /// The key at fault.
        key: String,
        /// What is wrong with it and what would be right.
        message: String,
    },
    /// Neither a preset name nor an existing file.
    #[error("unknown model '{name}': not a preset ({available}) and not a file")]
    UnknownModel {
        /// What was asked for.
        name: String,
        /// The preset names, comma-separated.
        available: String,
    },
    /// The model cannot be sharded as asked (e.g. heads not divisible by `--tp`).
    #[error("{0}")]
    Shard(String),
}

impl ModelError {
    /// An [`ModelError::Invalid`] for `key`.
    pub fn invalid(key: &str, message: &str) -> Self {
        ModelError::Invalid {
            key: key.to_string(),
            message: message.to_string(),
        }
    }
}

/// A model autopp can plan: a transformer described by its shape, or an explicit layer list.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
// one model per run: boxing the spec would buy nothing
#[allow(clippy::large_enum_variant)]
pub enum Model {
    /// A decoder-only transformer (`model.json` or a Hugging Face `config.json`).
    Transformer(TransformerSpec),
    /// An explicit list of layers with their costs (models that are not transformers).
    Layers(LayerListSpec),
}

impl Model {
    /// The model's name.
    pub fn name(&self) -> &str {
        match self {
            Model::Transformer(t) => &t.name,
            Model::Layers(l) => &l.name,
        }
    }

    /// Total parameters (unpadded vocabulary; tied weights counted once).
    pub fn num_params(&self) -> u64 {
        match self {
            Model::Transformer(t) => t.num_params(),
            Model::Layers(l) => l.num_params(),
        }
    }

    /// Parameters one token activates (the main model: MoE layers count their router, top-k
    /// and shared experts; MTP modules excluded). A layer list activates all of its parameters.
    pub fn active_params(&self) -> u64 {
        match self {
            Model::Transformer(t) => t.active_params(),
            Model::Layers(l) => l.num_params(),
        }
    }

    /// Sequence length in tokens.
    pub fn seq_length(&self) -> u64 {
        match self {
            Model::Transformer(t) => t.seq_length,
            Model::Layers(l) => l.seq_length,
        }
    }

    /// The default global batch for planning, in sequences, when the model names one.
    pub fn default_global_batch(&self) -> Option<u64> {
        match self {
            Model::Transformer(t) => t.global_batch_size,
            Model::Layers(l) => l.global_batch_size,
        }
    }

    /// Number of entries in the layer list (embedding + transformer layers + head for a
    /// transformer).
    pub fn num_layer_entries(&self) -> usize {
        match self {
            Model::Transformer(t) => (t.num_layers + t.mtp_num_layers) as usize + 2,
            Model::Layers(l) => l.num_layer_entries(),
        }
    }

    /// Attention heads, when the model has them (tensor parallelism must divide them).
    pub fn num_attention_heads(&self) -> Option<u64> {
        match self {
            Model::Transformer(t) => Some(t.num_attention_heads),
            Model::Layers(_) => None,
        }
    }

    /// The same model planned at sequence length `seq_length` (the CLI's `--seq-len`). A
    /// transformer keeps its learned position table, so it may not exceed its rows; a layer
    /// list's costs were given for one length, so it accepts only that one.
    pub fn with_seq_length(self, seq_length: u64) -> Result<Model, ModelError> {
        if seq_length == 0 {
            return Err(ModelError::invalid("seq_length", "must be at least 1"));
        }
        match self {
            Model::Transformer(t) => Ok(Model::Transformer(t.with_seq_length(seq_length)?)),
            Model::Layers(l) if l.seq_length == seq_length => Ok(Model::Layers(l)),
            Model::Layers(l) => Err(ModelError::invalid(
                "seq_length",
                &format!(
                    "of layer list '{}' is {}: its per-sequence costs hold for that length only; write a layer list for {seq_length}",
                    l.name, l.seq_length
                ),
            )),
        }
    }

    /// The same model with `global_batch_size` sequences as its default global batch.
    pub fn with_global_batch(self, global_batch_size: u64) -> Result<Model, ModelError> {
        if global_batch_size == 0 {
            return Err(ModelError::invalid(
                "global_batch_size",
                "must be at least 1",
            ));
        }
        let mut model = self;
        match &mut model {
            Model::Transformer(t) => {
                t.global_batch_size = Some(global_batch_size);
                t.validate()?;
            }
            Model::Layers(l) => {
                l.global_batch_size = Some(global_batch_size);
                l.validate()?;
            }
        }
        Ok(model)
    }

    /// The ordered layer list for one GPU under `shard`.
    pub fn layers(&self, shard: &ShardSpec) -> Result<Vec<LayerCost>, ModelError> {
        match self {
            Model::Transformer(t) => t.layers(shard),
            Model::Layers(l) => l.layers(shard),
        }
    }

    /// [`Model::layers`] with each distinct layer once, and per layer its index among them (see
    /// [`TransformerSpec::distinct_layers`]; a layer list's layers are all distinct).
    pub fn distinct_layers(
        &self,
        shard: &ShardSpec,
    ) -> Result<(Vec<LayerCost>, Vec<usize>), ModelError> {
        match self {
            Model::Transformer(t) => t.distinct_layers(shard),
            Model::Layers(l) => {
                let layers = l.layers(shard)?;
                let slot = (0..layers.len()).collect();
                Ok((layers, slot))
            }
        }
    }

    /// Model FLOPs of one sequence, forward + backward without recomputation, on one GPU-less
    /// unsharded model: for a transformer with `f = 4h`, `g = a` this is
    /// `72·s·L·h²·(1 + s/(6h) + V/(12·L·h))` (Korthikanti et al. 2022, the MFU convention).
    pub fn model_flops_per_sequence(&self) -> Result<f64, ModelError> {
        let shard = ShardSpec {
            vocab_pad_multiple: 1,
            ..ShardSpec::default()
        };
        Ok(self
            .layers(&shard)?
            .iter()
            .map(LayerCost::model_flops)
            .sum())
    }
}
