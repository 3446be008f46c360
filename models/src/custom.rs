//! Explicit layer lists (placeholder; filled in by the loaders work).
use serde::{Deserialize, Serialize};

use crate::{LayerCost, ModelError, ShardSpec};

/// A model given as an explicit list of layers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerListSpec {
    /// Model name.
    pub name: String,
    /// Sequence length in tokens.
    pub seq_length: u64,
    /// Default global batch, in sequences.
    pub global_batch_size: Option<u64>,
    /// The layers.
    pub layers: Vec<serde_json::Value>,
}

impl LayerListSpec {
    /// Total parameters.
    pub fn num_params(&self) -> u64 {
        0
    }
    /// The layer list for one GPU.
    pub fn layers(&self, _shard: &ShardSpec) -> Result<Vec<LayerCost>, ModelError> {
        Err(ModelError::Shard("layer lists are not implemented yet".into()))
    }
}
