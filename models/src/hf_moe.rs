//! Hugging Face keys of Qwen3, Qwen3-MoE, Mixtral, gpt-oss and DeepSeek-V2/V3.
//!
//! | family | attention | FFN | extras |
//! |---|---|---|---|
//! | `qwen3` | GQA, `head_dim`, qk-norm | SwiGLU `intermediate_size` | — |
//! | `qwen3_moe` | as `qwen3` | `num_experts` × `moe_intermediate_size`, top `num_experts_per_tok` | `decoder_sparse_step` 1, `mlp_only_layers` empty |
//! | `mixtral` | GQA | `num_local_experts` × `intermediate_size`, top `num_experts_per_tok` | — |
//! | `gpt_oss` | GQA, `head_dim`, biases (`attention_bias`), sinks | `num_local_experts` × `intermediate_size` with biases, router bias, top `num_experts_per_tok` (`experts_per_token`) | `sliding_window`, `layer_types` |
//! | `deepseek_v2`, `deepseek_v3` | MLA: `q_lora_rank` (null: full), `kv_lora_rank`, `qk_nope_head_dim`, `qk_rope_head_dim`, `v_head_dim` | `n_routed_experts` × `moe_intermediate_size`, top `num_experts_per_tok`, `n_shared_experts`, `first_k_dense_replace` dense layers of `intermediate_size` (`moe_layer_freq` 1), group-limited routing `n_group`/`topk_group` (not with `topk_method` `greedy`) | V3: `num_nextn_predict_layers` MTP modules, router bias (`e_score_correction_bias`) |
//!
//! Not modelled: Qwen3-MoE's `norm_topk_prob` and gpt-oss's clamped SwiGLU change no parameter
//! or FLOP count. DeepSeek's group-limited routing changes none either; it is kept
//! (`MoeSpec::router_num_groups`) for the nodes a token's all-to-all reaches.

use serde_json::Value;

use crate::hf::{base, llama_like, missing_seq, Config, HfFamily};
use crate::json::short;
use crate::transformer::{MlaSpec, MoeSpec, Norm, PositionEmbedding};
use crate::{ModelError, TransformerSpec};

/// Qwen3, Qwen3-MoE, Mixtral and gpt-oss: Llama-style blocks with their additions.
pub(crate) fn llama_moe(c: &Config, name: &str) -> Result<TransformerSpec, ModelError> {
    let mut spec = llama_like(c, name)?;
    spec.qkv_bias = c.boolean("attention_bias", false)?.then_some(true);
    match c.family {
        HfFamily::Qwen3 => spec.qk_norm = true,
        HfFamily::Qwen3Moe => {
            spec.qk_norm = true;
            if let Some(step) = c.uint(&["decoder_sparse_step"])?.filter(|&s| s != 1) {
                return Err(ModelError::invalid(
                    "decoder_sparse_step",
                    &format!("= {step}: autopp models MoE FFNs in every layer (1) only"),
                ));
            }
            if let Some(Value::Array(a)) = c.map.get("mlp_only_layers") {
                if !a.is_empty() {
                    return Err(ModelError::invalid(
                        "mlp_only_layers",
                        "must be empty: autopp models dense layers only at the start (first_k_dense_layers)",
                    ));
                }
            }
            spec.moe = Some(moe(c, &["num_experts"], &["moe_intermediate_size"])?);
        }
        HfFamily::Mixtral => {
            spec.moe = Some(moe(c, &["num_local_experts"], &["intermediate_size"])?);
        }
        _ => gpt_oss(c, &mut spec)?,
    }
    Ok(spec)
}

/// gpt-oss: biases on attention and experts, a router bias, attention sinks, and sliding
/// windows on the layers `layer_types` names `sliding_attention`.
fn gpt_oss(c: &Config, spec: &mut TransformerSpec) -> Result<(), ModelError> {
    let bias = c.boolean("attention_bias", true)?;
    spec.bias = bias;
    spec.qkv_bias = Some(bias);
    spec.attention_sinks = true;
    let mut m = moe(c, &["num_local_experts"], &["intermediate_size"])?;
    m.expert_bias = true;
    m.router_bias = true;
    spec.moe = Some(m);
    spec.sliding_window = c.uint(&["sliding_window"])?;
    let Some(Value::Array(types)) = c.map.get("layer_types") else {
        return Ok(());
    };
    let sliding: Vec<bool> = types
        .iter()
        .map(|t| match t.as_str() {
            Some("sliding_attention") => Ok(true),
            Some("full_attention") => Ok(false),
            _ => Err(ModelError::invalid(
                "layer_types",
                &format!(
                    "has {}: each entry must be \"sliding_attention\" or \"full_attention\"",
                    short(t)
                ),
            )),
        })
        .collect::<Result<_, _>>()?;
    let period = sliding.iter().position(|s| !s).map_or(1, |i| i as u64 + 1);
    spec.sliding_window_pattern = Some(period);
    if spec.sliding_window.is_none() && sliding.iter().any(|&s| s) {
        return Err(ModelError::invalid(
            "sliding_window",
            "is missing but layer_types names sliding_attention layers: add the window size",
        ));
    }
    if !sliding.iter().any(|&s| s) {
        spec.sliding_window = None;
        spec.sliding_window_pattern = None;
        return Ok(());
    }
    let fits = sliding.len() as u64 == spec.num_layers
        && sliding
            .iter()
            .enumerate()
            .all(|(i, &s)| s == spec.is_sliding_layer(i as u64));
    if !fits {
        return Err(ModelError::invalid(
            "layer_types",
            "is not a repeating pattern of sliding layers closed by one full layer, with one entry per layer: autopp cannot represent it",
        ));
    }
    Ok(())
}

/// The routed experts: count under `count_keys`, FFN size under `ffn_keys`, top-k.
fn moe(
    c: &Config,
    count_keys: &[&'static str],
    ffn_keys: &[&'static str],
) -> Result<MoeSpec, ModelError> {
    Ok(MoeSpec {
        num_experts: c.required(count_keys)?,
        num_experts_per_tok: c.required(&["num_experts_per_tok", "experts_per_token"])?,
        moe_ffn_hidden_size: c.required(ffn_keys)?,
        num_shared_experts: 0,
        shared_expert_ffn_hidden_size: None,
        first_k_dense_layers: 0,
        expert_bias: false,
        router_bias: false,
        router_num_groups: 0,
        router_group_topk: 0,
    })
}

/// DeepSeek-V2 and V3: MLA attention, shared experts, leading dense layers, V3's MTP modules.
pub(crate) fn deepseek(c: &Config, name: &str) -> Result<TransformerSpec, ModelError> {
    let seq = c.seq_length(&["max_position_embeddings"])?;
    let mut spec = base(c, name, seq.ok_or_else(|| missing_seq(c))?)?;
    spec.ffn_hidden_size = Some(c.required(&["intermediate_size"])?);
    spec.gated_mlp = true;
    spec.tied_embeddings = c.boolean("tie_word_embeddings", false)?;
    spec.bias = false;
    spec.norm = Norm::Rmsnorm;
    spec.position_embedding = PositionEmbedding::None;
    spec.dropout = c.dropout(&["attention_dropout"], 0.0)?;
    if let Some(freq) = c.uint(&["moe_layer_freq"])?.filter(|&f| f != 1) {
        return Err(ModelError::invalid(
            "moe_layer_freq",
            &format!(
                "= {freq}: autopp models MoE FFNs in every layer after the dense ones (1) only"
            ),
        ));
    }
    let mut m = moe(c, &["n_routed_experts"], &["moe_intermediate_size"])?;
    m.num_shared_experts = count(c, "n_shared_experts");
    m.first_k_dense_layers = c.uint(&["first_k_dense_replace"])?.unwrap_or(0);
    m.router_bias = c.family == HfFamily::DeepseekV3;
    // group-limited routing (`modeling_deepseek.py`'s MoEGate: `group_limited_greedy` in V2,
    // `noaux_tc` in V3; `greedy` ignores the groups, as DeepSeek-V2-Lite's config says)
    let greedy = c
        .get(&["topk_method"])
        .is_some_and(|(_, v)| v.as_str() == Some("greedy"));
    if let (Some(g), Some(t), false) = (c.uint(&["n_group"])?, c.uint(&["topk_group"])?, greedy) {
        if g > 1 && t < g {
            m.router_num_groups = g;
            m.router_group_topk = t;
        }
    }
    spec.moe = Some(m);
    spec.mla = Some(MlaSpec {
        q_lora_rank: c.uint(&["q_lora_rank"])?,
        kv_lora_rank: c.required(&["kv_lora_rank"])?,
        qk_nope_head_dim: c.required(&["qk_nope_head_dim"])?,
        qk_rope_head_dim: c.required(&["qk_rope_head_dim"])?,
        v_head_dim: c.required(&["v_head_dim"])?,
    });
    if c.family == HfFamily::DeepseekV3 {
        spec.mtp_num_layers = count(c, "num_nextn_predict_layers");
    }
    Ok(spec)
}

/// A count that may be 0 or absent (0); a value that is not a whole number is left to
/// `TransformerSpec::validate`'s limits by reading as 0 only when absent or null.
fn count(c: &Config, key: &'static str) -> u64 {
    c.map.get(key).and_then(Value::as_u64).unwrap_or(0)
}
