//! The device layers of a whole model: which models they implement, and each layer-list
//! entry built from its own seeded stream, so that any rank builds the same weights.

use autopp_models::{Norm, PositionEmbedding, TransformerSpec};

use super::{Block, DeviceError, Embedding, Head, Layer, Rng};

/// The most parameters the device layers accept: they run fp32 on the CPU and are meant for small
/// models such as tiny-gpt (1.9 M parameters).
pub const MAX_PARAMS: u64 = 100_000_000;

const INIT_STREAM: u64 = 0x1A17;

/// Layer-list entry `index` of `spec` (0 the embedding, then the blocks, then the head),
/// initialised from its own stream of `seed`, so the same entry gets the same weights on
/// whichever rank holds it.
pub fn init_layer(spec: &TransformerSpec, seed: u64, index: usize) -> Layer {
    let mut rng = Rng::derive(seed, &[INIT_STREAM, index as u64]);
    let (h, v) = (spec.hidden_size as usize, spec.vocab_size as usize);
    let last = spec.num_layers as usize + 1;
    if index == 0 {
        let positions = match spec.position_embedding {
            PositionEmbedding::Learned => Some(spec.position_table_rows() as usize),
            PositionEmbedding::None => None,
        };
        Layer::Embedding(Embedding::init(&mut rng, v, h, positions))
    } else if index == last {
        Layer::Head(Head::init(&mut rng, h, v))
    } else {
        Layer::Block(Box::new(Block::init(
            &mut rng,
            h,
            spec.num_attention_heads as usize,
            spec.ffn() as usize,
            spec.num_layers as usize,
            spec.bias,
            spec.has_qkv_bias(),
        )))
    }
}

/// Refuses models outside what the device layers implement, and models too large for the CPU.
pub fn check_model(m: &TransformerSpec) -> Result<(), DeviceError> {
    m.validate()
        .map_err(|e| DeviceError::Unsupported(e.to_string()))?;
    let name = &m.name;
    let unsupported = |what: &str| {
        Err(DeviceError::Unsupported(format!(
            "exec does not implement {what} (model '{name}'); it runs LayerNorm transformers with multi-head attention, a GeLU MLP, an untied LM head and no dropout, such as tiny-gpt"
        )))
    };
    if m.gated_mlp {
        return unsupported("gated MLPs (\"gated_mlp\": true)");
    }
    if m.norm != Norm::Layernorm {
        return unsupported("RMSNorm (\"norm\": \"rmsnorm\")");
    }
    if m.kv_heads() != m.num_attention_heads {
        return unsupported("grouped-query attention (\"num_kv_heads\")");
    }
    if m.tied_embeddings {
        return unsupported("tied embeddings (set \"tied_embeddings\": false)");
    }
    if m.dropout {
        return unsupported("dropout (set \"dropout\": false)");
    }
    let params = m.num_params();
    if params > MAX_PARAMS {
        return Err(DeviceError::Unsupported(format!(
            "exec trains in fp32 on the CPU and is meant for small models such as tiny-gpt (1.9 M parameters); '{name}' has {:.1} M parameters, above the limit of {} M",
            params as f64 / 1e6,
            MAX_PARAMS / 1_000_000
        )));
    }
    Ok(())
}
