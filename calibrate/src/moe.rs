//! Mixture-of-experts rows: the checks of their keys (`num_experts`, `ep`, `routing`, …), the
//! model they name (a preset when the sizes agree, else one built from the keys), their expert
//! parallelism, and the groups their errors are reported in (GPU kind × precision × family).
//!
//! Sources of the facts used: Megatron-Core's MoE arguments (`--expert-tensor-parallel-size`,
//! `--moe-router-force-load-balancing`, `--moe-expert-capacity-factor`), the NVIDIA H800
//! datasheet (NVLink 400 GB/s, against the H100's 900 GB/s) and the GB200 NVL72 system (72 GPUs
//! in one NVLink domain, 4 to a compute tray).

use autopp_hardware::Precision;
use autopp_models::{Model, MoeSpec, Norm, PositionEmbedding, TransformerSpec};
use autopp_planner::experts::ExpertParallel;

use crate::rows::{AttentionKind, PublishedRow, Routing};
use crate::stacks::preset_named;
use crate::{summarize, PreparedRow, RowResult, Summary};

/// Checks the MoE keys of one row; `Err` is `"field: what is wrong"`.
pub fn check_keys(row: &PublishedRow) -> Result<(), String> {
    let positive = [
        ("num_experts", row.num_experts),
        ("num_experts_per_tok", row.num_experts_per_tok),
        ("moe_ffn_hidden_size", row.moe_ffn_hidden_size),
        ("ep", row.ep),
        ("etp", row.etp),
        ("nvlink_domain_size", row.nvlink_domain_size),
        ("head_dim", row.head_dim),
    ];
    for (field, value) in positive {
        if value == Some(0) {
            return Err(format!("{field}: must be at least 1"));
        }
    }
    if let (Some(k), Some(e)) = (row.num_experts_per_tok, row.num_experts) {
        if k > e {
            return Err(format!(
                "num_experts_per_tok: {k} exceeds num_experts = {e}; a token goes to at most every expert"
            ));
        }
    }
    if let (Some(ep), Some(e)) = (row.ep, row.num_experts) {
        if !e.is_multiple_of(ep) {
            return Err(format!(
                "ep: {ep} does not divide num_experts = {e}; each expert-parallel rank holds num_experts/ep experts"
            ));
        }
    }
    if let (Some(k), Some(l)) = (row.first_k_dense_layers, row.num_layers) {
        if k > l {
            return Err(format!(
                "first_k_dense_layers: {k} exceeds num_layers = {l}"
            ));
        }
    }
    Ok(())
}

/// Whether the row is a mixture of experts (or uses latent attention, which only a preset
/// describes).
pub fn is_moe(row: &PublishedRow) -> bool {
    row.num_experts.is_some_and(|e| e > 1)
        || row.ep.is_some_and(|e| e > 1)
        || row.attention == Some(AttentionKind::Mla)
}

/// The MoE model of a row: the preset it names when every size the row gives agrees with it,
/// else a model built from the row's keys. `assumptions` gets what the row did not say.
pub fn model(row: &PublishedRow, assumptions: &mut Vec<String>) -> Result<Model, String> {
    let named = row.model_name.as_deref().and_then(preset_named);
    if let Some(p) = named {
        let Model::Transformer(mut t) = p.load().map_err(|e| e.to_string())? else {
            return Err(format!("preset '{}' is not a transformer", p.name));
        };
        match disagreement(row, &t) {
            None => {
                if let Some(s) = row.seq_length {
                    t = t.with_seq_length(s).map_err(|e| e.to_string())?;
                }
                match row.mtp_num_layers {
                    Some(m) => t.mtp_num_layers = m,
                    None if t.mtp_num_layers > 0 => assumptions.push(format!(
                        "mtp_num_layers not stated: the preset's {} MTP layer(s) assumed",
                        t.mtp_num_layers
                    )),
                    None => {}
                }
                t.validate().map_err(|e| e.to_string())?;
                return Ok(Model::Transformer(t));
            }
            Some(field) => assumptions.push(format!(
                "the row's {field} differs from preset '{}': model built from the row's keys",
                p.name
            )),
        }
    }
    from_keys(row, assumptions)
}

/// The first size the row gives that the preset does not have.
fn disagreement(row: &PublishedRow, t: &TransformerSpec) -> Option<&'static str> {
    let moe = t.moe.as_ref();
    let pairs = [
        ("num_layers", row.num_layers, Some(t.num_layers)),
        ("hidden_size", row.hidden_size, Some(t.hidden_size)),
        (
            "num_attention_heads",
            row.num_attention_heads,
            Some(t.num_attention_heads),
        ),
        ("vocab_size", row.vocab_size, Some(t.vocab_size)),
        ("num_experts", row.num_experts, moe.map(|m| m.num_experts)),
        (
            "num_experts_per_tok",
            row.num_experts_per_tok,
            moe.map(|m| m.num_experts_per_tok),
        ),
        (
            "moe_ffn_hidden_size",
            row.moe_ffn_hidden_size,
            moe.map(|m| m.moe_ffn_hidden_size),
        ),
        (
            "num_shared_experts",
            row.num_shared_experts,
            moe.map(|m| m.num_shared_experts),
        ),
        (
            "first_k_dense_layers",
            row.first_k_dense_layers,
            moe.map(|m| m.first_k_dense_layers),
        ),
    ];
    pairs
        .into_iter()
        .find(|(_, r, p)| r.is_some() && r != p)
        .map(|(f, _, _)| f)
}

/// A MoE transformer from the row's keys: gated (SwiGLU-style) experts, RMSNorm, rotary
/// positions, no biases, untied embeddings — what every MoE family in the published runs has.
fn from_keys(row: &PublishedRow, assumptions: &mut Vec<String>) -> Result<Model, String> {
    if row.attention == Some(AttentionKind::Mla) {
        return Err(
            "attention 'mla' needs the MLA ranks, which only a preset (deepseek-v3) carries".into(),
        );
    }
    let need = |v: Option<u64>, field: &str| v.ok_or_else(|| format!("{field} is not reported"));
    let mut t = TransformerSpec::new(
        row.model_name.as_deref().unwrap_or(&row.id),
        need(row.num_layers, "num_layers")?,
        need(row.hidden_size, "hidden_size")?,
        need(row.num_attention_heads, "num_attention_heads")?,
        need(row.vocab_size, "vocab_size")?,
        need(row.seq_length, "seq_length")?,
    );
    t.num_kv_heads = row.num_kv_heads;
    t.ffn_hidden_size = row.ffn_hidden_size;
    t.head_dim = row.head_dim;
    t.gated_mlp = true;
    t.tied_embeddings = false;
    t.bias = false;
    t.dropout = false;
    t.norm = Norm::Rmsnorm;
    t.position_embedding = PositionEmbedding::None;
    t.mtp_num_layers = row.mtp_num_layers.unwrap_or(0);
    t.moe = Some(MoeSpec {
        num_experts: need(row.num_experts, "num_experts")?,
        num_experts_per_tok: need(row.num_experts_per_tok, "num_experts_per_tok")?,
        moe_ffn_hidden_size: need(row.moe_ffn_hidden_size, "moe_ffn_hidden_size")?,
        num_shared_experts: row.num_shared_experts.unwrap_or(0),
        shared_expert_ffn_hidden_size: None,
        first_k_dense_layers: row.first_k_dense_layers.unwrap_or(0),
        expert_bias: false,
        router_bias: false,
    });
    assumptions
        .push("no preset: gated experts, RMSNorm, rotary positions, no biases assumed".to_string());
    t.validate().map_err(|e| e.to_string())?;
    Ok(Model::Transformer(t))
}

/// The row's expert parallelism: `ep` (a MoE row must state it; a dense row has none), `etp`
/// (unstated: 1, what the Megatron-Bridge MoE recipes set) and the routing load.
pub fn experts(
    row: &PublishedRow,
    assumptions: &mut Vec<String>,
) -> Result<ExpertParallel, String> {
    let ep = match row.ep {
        Some(ep) => ep,
        None if is_moe(row) => {
            return Err(
                "ep is not reported (a mixture of experts needs its expert-parallel degree)".into(),
            )
        }
        None => 1,
    };
    let etp = match row.etp {
        Some(e) => e,
        None => {
            if ep > 1 {
                assumptions.push("etp not stated: 1 (the MoE recipes' setting)".into());
            }
            1
        }
    };
    let note = match row.routing {
        Some(Routing::ForcedBalanced) => None,
        Some(Routing::TokenDrop) => {
            Some("token-drop routing: the capacity factor caps each expert at its share")
        }
        Some(Routing::Dropless) => {
            Some("dropless routing: its imbalance is not published; balanced load assumed")
        }
        None => Some("routing not stated: balanced load assumed (benchmarks force it)"),
    };
    if let Some(n) = note.filter(|_| row.num_experts.is_some()) {
        assumptions.push(n.to_string());
    }
    Ok(ExpertParallel {
        ep,
        etp,
        imbalance: 1.0,
    })
}

/// GPUs of one NVLink domain that the cluster model treats as a node: the row's
/// `nvlink_domain_size` when larger than its `gpus_per_node` (an NVL72 rack), cut to the largest
/// multiple of `gpus_per_node` that divides the run's `gpus` (256 GB200s run as 4 × 64).
pub fn domain_per_node(gpus: u64, gpus_per_node: u64, domain: Option<u64>) -> u64 {
    let Some(d) = domain.filter(|&d| d > gpus_per_node) else {
        return gpus_per_node;
    };
    if gpus <= d {
        return gpus;
    }
    (1..=d / gpus_per_node.max(1))
        .rev()
        .map(|k| k * gpus_per_node)
        .find(|&n| gpus.is_multiple_of(n))
        .unwrap_or(gpus_per_node)
}

/// NVLink bandwidth of an H800 per direction, bytes/s: 400 GB/s both ways (NVIDIA H800
/// datasheet), against the H100's 900 GB/s.
pub const H800_NVLINK_BYTES_PER_S: f64 = 200e9;

/// The group a MoE row's errors are reported in: `GPU precision family` (`h100 fp8
/// qwen3-moe`); H800 rows stay apart from H100 ones.
pub fn group_of(row: &PublishedRow, gpu: &str, precision: Precision) -> String {
    let name = row.gpu_type.as_deref().unwrap_or("").to_ascii_lowercase();
    let gpu = if name.contains("h800") {
        "h800"
    } else {
        gpu.trim_end_matches("-sxm")
    };
    let precision = match precision {
        Precision::Bf16 | Precision::Fp16 => "bf16",
        _ => "fp8",
    };
    let model = row.model_name.as_deref().unwrap_or("").to_ascii_lowercase();
    let family = [
        ("deepseek-v3", "deepseek-v3"),
        ("qwen3", "qwen3-moe"),
        ("gpt-oss", "gpt-oss"),
        ("mixtral", "mixtral"),
        ("grok", "grok-1"),
        ("llama-4", "llama-4"),
    ]
    .iter()
    .find(|(k, _)| model.starts_with(k))
    .map_or(model.as_str(), |(_, f)| f);
    format!("{gpu} {precision} {family}")
}

/// The errors of the mapped MoE rows by [`group_of`] (`None` when there are none).
pub fn summary(prepared: &[PreparedRow], results: &[RowResult]) -> Option<Summary> {
    let relabelled: Vec<RowResult> = prepared
        .iter()
        .zip(results)
        .filter_map(|(p, r)| {
            let group = p.moe_group.clone()?;
            Some(RowResult { group, ..r.clone() })
        })
        .collect();
    (!relabelled.is_empty()).then(|| summarize(&relabelled))
}
