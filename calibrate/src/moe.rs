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
        router_num_groups: 0,
        router_group_topk: 0,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::{map_row, Case};
    use autopp_planner::schedule::ScheduleKind;

    fn row(fields: serde_json::Value) -> PublishedRow {
        let mut r = serde_json::json!({"id": "r", "kind": "end_to_end_training_throughput",
            "source_group": "g", "framework": "NeMo 26.02 (Megatron-Bridge on Megatron-Core)",
            "seq_length": 4096, "global_batch_size": 4096, "micro_batch_size": 1, "tp": 1,
            "pp": 4, "dp": 64, "cp": 1, "virtual_pipeline_stages": 4, "num_gpus": 256,
            "seconds_per_iteration": 16.57, "result_status": "ok"});
        for (k, v) in fields.as_object().into_iter().flatten() {
            r[k] = v.clone();
        }
        let text = serde_json::Value::Array(vec![r]).to_string();
        crate::rows::parse_rows(&text, "test").unwrap().remove(0)
    }

    /// Hand-worked: Megatron-Bridge's DeepSeek-V3 on 256 GB200 (26.02, FP8-MX). The sizes agree
    /// with the preset (61 layers, 7168 hidden, 256 experts top-8 of width 2048, one shared, 3
    /// dense), so the preset is used with its MTP layer (not stated: an assumption); 256 GPUs
    /// in NVL72 racks of trays of 4 share NVLink 64 at a time (64 | 256, 68 and 72 do not), so
    /// the cluster is 4 "nodes" of 64; MXFP8; ep 64 with etp 1 assumed, so ep·etp = 64
    /// divides tp·dp = 64 (expert-dp 1); virtual stages 4 → interleaved 1F1B.
    #[test]
    fn deepseek_v3_on_gb200_hand_worked() {
        let r = row(
            serde_json::json!({"model_name": "DeepSeek-V3", "num_layers": 61,
            "hidden_size": 7168, "num_attention_heads": 128, "vocab_size": 129280,
            "num_experts": 256, "num_experts_per_tok": 8, "moe_ffn_hidden_size": 2048,
            "num_shared_experts": 1, "first_k_dense_layers": 3, "attention": "mla",
            "ep": 64, "routing": "forced-balanced", "gpus_per_node": 4,
            "nvlink_domain_size": 72, "gpu_type": "GB200 (DGX-GB200 NVL72)",
            "precision": "fp8 (MXFP8: 1x32 block scaling)"}),
        );
        let mapped = map_row(&r).unwrap();
        let Case::Iteration(it) = mapped.case else {
            panic!("an iteration case")
        };
        let autopp_models::Model::Transformer(t) = &it.model else {
            panic!("a transformer")
        };
        assert_eq!(t.name, "deepseek-v3");
        assert_eq!(t.mtp_num_layers, 1);
        assert!(t.mla.is_some());
        assert_eq!(it.cluster.gpu.name, "gb200");
        assert_eq!((it.cluster.gpus_per_node, it.cluster.nodes), (64, 4));
        let c = &it.config;
        assert_eq!(c.settings.precision, Precision::Mxfp8);
        assert_eq!(
            (c.experts.ep, c.experts.etp, c.experts.imbalance),
            (64, 1, 1.0)
        );
        assert_eq!(c.experts.expert_dp(&c.degrees), 1);
        assert_eq!(c.schedule, ScheduleKind::Interleaved1F1B);
        assert_eq!(it.time_s, Some(16.57));
        let said = mapped.assumptions.join(" | ");
        for needle in ["MTP", "etp not stated", "NVLink domain of 72"] {
            assert!(said.contains(needle), "{needle}: {said}");
        }
        assert_eq!(
            group_of(&r, &it.cluster.gpu.name, c.settings.precision),
            "gb200 fp8 deepseek-v3"
        );
    }

    /// A model autopp has no preset for is built from the row's keys; an H800 is the H100
    /// with NVLink at 400 GB/s (200 GB/s a direction); MLA without a preset and a MoE row
    /// without `ep` are refused with the reason.
    #[test]
    fn models_from_keys_h800_and_refusals() {
        let grok = serde_json::json!({"model_name": "Grok-1 (314B)", "num_layers": 64,
            "hidden_size": 6144, "num_attention_heads": 48, "num_kv_heads": 8,
            "vocab_size": 131072, "num_experts": 8, "num_experts_per_tok": 2,
            "moe_ffn_hidden_size": 32768, "ep": 8, "etp": 1, "tp": 4, "pp": 8, "dp": 8,
            "virtual_pipeline_stages": 1, "gpu_type": "H800-SXM5-80GB", "precision": "bf16"});
        let r = row(grok.clone());
        let mapped = map_row(&r).unwrap();
        let Case::Iteration(it) = mapped.case else {
            panic!("an iteration case")
        };
        let autopp_models::Model::Transformer(t) = &it.model else {
            panic!("a transformer")
        };
        let moe = t.moe.as_ref().unwrap();
        assert_eq!((moe.num_experts, moe.num_experts_per_tok), (8, 2));
        assert!(t.gated_mlp && !t.tied_embeddings && t.norm == Norm::Rmsnorm);
        assert_eq!(it.cluster.gpu.nvlink_bw_bytes_per_s, 200e9);
        assert_eq!(
            group_of(&r, &it.cluster.gpu.name, Precision::Bf16),
            "h800 bf16 grok-1"
        );
        let mut no_ep = grok.clone();
        no_ep["ep"] = serde_json::Value::Null;
        assert!(map_row(&row(no_ep))
            .unwrap_err()
            .contains("ep is not reported"));
        let mut mla = grok;
        mla["attention"] = "mla".into();
        assert!(map_row(&row(mla)).unwrap_err().contains("MLA ranks"));
    }

    /// 256 GPUs in trays of 4 within a 72-GPU domain: the multiples of 4 up to 72 that divide
    /// 256 are 4, 8, 16, 32, 64 → 64. 96 GPUs → 48 (72, 68, …, 52 do not divide 96). 8 GPUs
    /// fit one domain. Without a larger domain the tray is the node.
    #[test]
    fn nvlink_domains() {
        assert_eq!(domain_per_node(256, 4, Some(72)), 64);
        assert_eq!(domain_per_node(96, 4, Some(72)), 48);
        assert_eq!(domain_per_node(8, 4, Some(72)), 8);
        assert_eq!(domain_per_node(64, 8, Some(8)), 8);
        assert_eq!(domain_per_node(64, 8, None), 8);
    }
}
