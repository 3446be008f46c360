//! The published-runs file: one JSON array of measured training runs, in the format of the
//! project's `validation/published-runs.json` (a copy of `shared/data/published-runs`).
//!
//! Every field is declared: those validation reads with their types, the others (sources,
//! verification notes, derived figures) kept for people as any JSON. Numbers may be written as
//! numbers or strings ([`crate::lenient`]). An unknown field or a field of the wrong type is an
//! error that names the file and the field's path (`runs[12].tp`).

use serde::Deserialize;

use crate::lenient::{opt_f64, opt_memory, opt_u64};

use super::ValidateError;

/// What a row measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RowKind {
    /// A whole training iteration: seconds per iteration (and often peak memory).
    EndToEndTrainingThroughput,
    /// The forward and backward time of one transformer layer (times in the row's `notes`).
    PerLayerTimeMs,
}

/// A row's attention (`attention`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttentionKind {
    /// Multi-head attention: as many key/value heads as query heads.
    Mha,
    /// Grouped-query attention: `num_kv_heads` key/value heads.
    Gqa,
    /// DeepSeek's multi-head latent attention.
    Mla,
}

/// How a mixture of experts routed its tokens (`routing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Routing {
    /// The benchmark forces every expert the same number of tokens.
    ForcedBalanced,
    /// The learned router, no token dropped: the busiest expert may get more than its share.
    Dropless,
    /// The learned router with a capacity factor: tokens over an expert's capacity are dropped.
    TokenDrop,
}

/// One published, measured run. Sizes are the model's; degrees are the run's.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishedRow {
    /// Unique row id, e.g. `megatron2021_t1_1.7B`.
    pub id: String,
    /// What the row measured.
    pub kind: RowKind,
    /// The source the row belongs to (`Narayanan2021`, `BLOOM-prelaunch-benchmarks`, …): the
    /// unit of leave-one-group-out calibration.
    pub source_group: String,
    /// The model's name in the source.
    #[serde(default)]
    pub model_name: Option<String>,
    /// Transformer layers.
    #[serde(default, deserialize_with = "opt_u64")]
    pub num_layers: Option<u64>,
    /// Hidden size.
    #[serde(default, deserialize_with = "opt_u64")]
    pub hidden_size: Option<u64>,
    /// Attention heads.
    #[serde(default, deserialize_with = "opt_u64")]
    pub num_attention_heads: Option<u64>,
    /// Key/value heads (`null`: as many as attention heads).
    #[serde(default, deserialize_with = "opt_u64")]
    pub num_kv_heads: Option<u64>,
    /// FFN hidden size (`null`: `4·hidden_size`).
    #[serde(default, deserialize_with = "opt_u64")]
    pub ffn_hidden_size: Option<u64>,
    /// Sequence length in tokens.
    #[serde(default, deserialize_with = "opt_u64")]
    pub seq_length: Option<u64>,
    /// Vocabulary size (unpadded).
    #[serde(default, deserialize_with = "opt_u64")]
    pub vocab_size: Option<u64>,
    /// Global batch in sequences.
    #[serde(default, deserialize_with = "opt_u64")]
    pub global_batch_size: Option<u64>,
    /// Micro-batch size in sequences.
    #[serde(default, deserialize_with = "opt_u64")]
    pub micro_batch_size: Option<u64>,
    /// Tensor-parallel degree.
    #[serde(default, deserialize_with = "opt_u64")]
    pub tp: Option<u64>,
    /// Pipeline-parallel degree.
    #[serde(default, deserialize_with = "opt_u64")]
    pub pp: Option<u64>,
    /// Data-parallel degree.
    #[serde(default, deserialize_with = "opt_u64")]
    pub dp: Option<u64>,
    /// Context-parallel degree.
    #[serde(default, deserialize_with = "opt_u64")]
    pub cp: Option<u64>,
    /// Virtual pipeline stages (model chunks) per rank.
    #[serde(default, deserialize_with = "opt_u64")]
    pub virtual_pipeline_stages: Option<u64>,
    /// Pipeline schedule as the source names it.
    #[serde(default)]
    pub pipeline_schedule: Option<String>,
    /// Recompute as the source names it (`full`, `selective`, `none`, or a longer phrase).
    #[serde(default)]
    pub activation_recomputation: Option<String>,
    /// Megatron-Core's `recompute_modules` as the run's recipe sets them (`["layernorm",
    /// "moe_act"]`; `[]`: no recompute), with `recipe_source` naming the recipe. Read by
    /// `mapping::fields::recompute_modules_of`; wins over `activation_recomputation`.
    #[serde(default)]
    pub recompute_modules: Option<Vec<String>>,
    /// Where the row's recipe settings (`recompute_modules`) are stated: file, preset and the
    /// release they match. Kept for people; not read.
    #[serde(default)]
    pub recipe_source: Option<serde_json::Value>,
    /// Megatron sequence parallelism.
    #[serde(default)]
    pub sequence_parallel: Option<bool>,
    /// ZeRO stage or distributed optimizer, as the source names it.
    #[serde(default)]
    pub zero_or_distributed_optimizer: Option<String>,
    /// Training framework, as the source names it.
    #[serde(default)]
    pub framework: Option<String>,
    /// GPU model, e.g. `A100-SXM4-80GB`.
    #[serde(default)]
    pub gpu_type: Option<String>,
    /// GPUs in the run.
    #[serde(default, deserialize_with = "opt_u64")]
    pub num_gpus: Option<u64>,
    /// GPUs per node.
    #[serde(default, deserialize_with = "opt_u64")]
    pub gpus_per_node: Option<u64>,
    /// Network between nodes, as the source describes it.
    #[serde(default)]
    pub inter_node_interconnect: Option<String>,
    /// Precision, as the source names it.
    #[serde(default)]
    pub precision: Option<String>,
    /// Whether the run succeeded (`ok`).
    #[serde(default)]
    pub result_status: Option<String>,
    /// Reported TFLOP/s per GPU under `tflops_definition`.
    #[serde(default, deserialize_with = "opt_f64")]
    pub tflops_per_gpu: Option<f64>,
    /// How the source counts FLOPs.
    #[serde(default)]
    pub tflops_definition: Option<String>,
    /// Seconds per iteration (measured or derived; see `derived_fields`).
    #[serde(default, deserialize_with = "opt_f64")]
    pub seconds_per_iteration: Option<f64>,
    /// Peak memory per GPU as the source prints it, e.g. `"47GB"` (PyTorch's peak / 2^30), or
    /// a number of GiB (`82.4`).
    #[serde(default, deserialize_with = "opt_memory")]
    pub peak_memory_per_gpu_gb: Option<String>,
    /// `high`, `medium` or `low`.
    #[serde(default)]
    pub confidence: Option<String>,
    /// Fields computed from other read values.
    #[serde(default)]
    pub derived_fields: Vec<String>,
    /// Fields set to framework defaults the source did not state.
    #[serde(default)]
    pub unverified_fields: Vec<String>,
    /// Free text; per-layer rows carry their times here.
    #[serde(default)]
    pub notes: Option<String>,
    /// Mixture of experts: routed experts per MoE layer.
    #[serde(default, deserialize_with = "opt_u64")]
    pub num_experts: Option<u64>,
    /// Mixture of experts: experts each token is routed to (top-k).
    #[serde(default, deserialize_with = "opt_u64")]
    pub num_experts_per_tok: Option<u64>,
    /// Mixture of experts: FFN hidden size of one routed expert.
    #[serde(default, deserialize_with = "opt_u64")]
    pub moe_ffn_hidden_size: Option<u64>,
    /// Mixture of experts: shared (always active) experts per MoE layer.
    #[serde(default, deserialize_with = "opt_u64")]
    pub num_shared_experts: Option<u64>,
    /// Mixture of experts: leading layers with a dense FFN (`first_k_dense_replace`).
    #[serde(default, deserialize_with = "opt_u64")]
    pub first_k_dense_layers: Option<u64>,
    /// Attention kind (`mha`, `gqa` or `mla`).
    #[serde(default)]
    pub attention: Option<AttentionKind>,
    /// Multi-token-prediction modules (`null`: not stated).
    #[serde(default, deserialize_with = "opt_u64")]
    pub mtp_num_layers: Option<u64>,
    /// Per-head size when it is not `hidden_size / num_attention_heads` (Qwen3).
    #[serde(default, deserialize_with = "opt_u64")]
    pub head_dim: Option<u64>,
    /// Expert-parallel degree.
    #[serde(default, deserialize_with = "opt_u64")]
    pub ep: Option<u64>,
    /// Expert-tensor-parallel degree (`null`: not stated).
    #[serde(default, deserialize_with = "opt_u64")]
    pub etp: Option<u64>,
    /// How tokens were routed to experts.
    #[serde(default)]
    pub routing: Option<Routing>,
    /// GPUs that share one NVLink domain (8 in a DGX, 72 in an NVL72 rack).
    #[serde(default, deserialize_with = "opt_u64")]
    pub nvlink_domain_size: Option<u64>,
    // The fields below document the row for people; validation does not read them, but they
    // are declared so that a misspelt field is an error rather than silently ignored.
    /// Kept for people (`aggregate_pflops`); not read.
    #[serde(default)]
    pub aggregate_pflops: Option<serde_json::Value>,
    /// Kept for people (`global_batch_tokens`); not read.
    #[serde(default)]
    pub global_batch_tokens: Option<serde_json::Value>,
    /// Kept for people (`gpu_memory_gb`); not read.
    #[serde(default)]
    pub gpu_memory_gb: Option<serde_json::Value>,
    /// Kept for people (`hfu_percent`); not read.
    #[serde(default)]
    pub hfu_percent: Option<serde_json::Value>,
    /// Kept for people (`intra_node_interconnect`); not read.
    #[serde(default)]
    pub intra_node_interconnect: Option<serde_json::Value>,
    /// Kept for people (`mfu_percent`); not read.
    #[serde(default)]
    pub mfu_percent: Option<serde_json::Value>,
    /// Kept for people (`num_parameters`); not read.
    #[serde(default)]
    pub num_parameters: Option<serde_json::Value>,
    /// Kept for people (`peak_tflops_per_gpu_assumed`); not read.
    #[serde(default)]
    pub peak_tflops_per_gpu_assumed: Option<serde_json::Value>,
    /// Kept for people (`percent_of_peak`); not read.
    #[serde(default)]
    pub percent_of_peak: Option<serde_json::Value>,
    /// Kept for people (`samples_per_sec`); not read.
    #[serde(default)]
    pub samples_per_sec: Option<serde_json::Value>,
    /// Where the row was read (`source`): kept for people, and read for the month a run names
    /// (`calibrate::stacks::source_month`).
    #[serde(default)]
    pub source: Option<serde_json::Value>,
    /// Kept for people (`source_locator`); not read.
    #[serde(default)]
    pub source_locator: Option<serde_json::Value>,
    /// Kept for people (`tokens_per_sec_per_gpu`); not read.
    #[serde(default)]
    pub tokens_per_sec_per_gpu: Option<serde_json::Value>,
    /// Kept for people (`tokens_per_sec_total`); not read.
    #[serde(default)]
    pub tokens_per_sec_total: Option<serde_json::Value>,
    /// Kept for people (`verification`); not read.
    #[serde(default)]
    pub verification: Option<serde_json::Value>,
    /// Kept for people (`expert_data_parallel`); not read.
    #[serde(default)]
    pub expert_data_parallel: Option<serde_json::Value>,
    /// Kept for people (`fsdp`); not read.
    #[serde(default)]
    pub fsdp: Option<serde_json::Value>,
    /// Kept for people (`gradient_accumulation_steps_reported`); not read.
    #[serde(default)]
    pub gradient_accumulation_steps_reported: Option<serde_json::Value>,
    /// Kept for people (`local_batch_size`); not read.
    #[serde(default)]
    pub local_batch_size: Option<serde_json::Value>,
    /// Kept for people (`model_gflop_per_token_implied`); not read.
    #[serde(default)]
    pub model_gflop_per_token_implied: Option<serde_json::Value>,
    /// Kept for people (`precision_label_in_source`); not read.
    #[serde(default)]
    pub precision_label_in_source: Option<serde_json::Value>,
    /// The token dispatcher the source names (`DeepEP`, `HybridEP`, `alltoall`): read when the
    /// row is mapped (`stacks::dedup_dispatcher`).
    #[serde(default)]
    pub token_dispatcher: Option<serde_json::Value>,
}

/// Parses a published-runs file; `origin` names it in errors (with line and column).
pub fn parse_rows(text: &str, origin: &str) -> Result<Vec<PublishedRow>, ValidateError> {
    let de = &mut serde_json::Deserializer::from_str(text);
    let rows: Vec<PublishedRow> = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        // serde lists every field after an unknown one; the path and the name are enough
        let inner = e.into_inner().to_string();
        let inner = match inner.split_once(", expected one of") {
            Some((head, _)) if head.starts_with("unknown field") => {
                format!("{head}: not a field of a published run")
            }
            Some((head, values)) => format!("{head}: use one of {}", values.trim_start()),
            None => inner,
        };
        let message = if path == "." || path.is_empty() {
            format!("{inner} (a published-runs file is a JSON array of runs)")
        } else {
            format!("runs{path}: {inner}{}", row_named(text, &path))
        };
        ValidateError::Json {
            origin: origin.to_string(),
            message,
        }
    })?;
    if rows.is_empty() {
        return Err(ValidateError::Json {
            origin: origin.to_string(),
            message: "the file holds no runs: a published-runs file is a JSON array of at least \
                      one run (as validation/published-runs.json)"
                .to_string(),
        });
    }
    let mut seen = std::collections::HashSet::new();
    for (i, r) in rows.iter().enumerate() {
        if !seen.insert(r.id.as_str()) {
            return Err(ValidateError::Json {
                origin: origin.to_string(),
                message: format!("row {i}: id '{}' appears twice; ids must be unique", r.id),
            });
        }
        crate::moe::check_keys(r).map_err(|message| ValidateError::Json {
            origin: origin.to_string(),
            message: format!("runs[{i}].{message} (row '{}')", r.id),
        })?;
    }
    Ok(rows)
}

/// ` (row 'ID')` for an error at `path` (`[3].routing`) when row 3 of `text` has an id.
fn row_named(text: &str, path: &str) -> String {
    let index = path
        .strip_prefix('[')
        .and_then(|p| p.split_once(']'))
        .and_then(|(i, _)| i.parse::<usize>().ok());
    let id = index.and_then(|i| {
        let rows: Vec<serde_json::Value> = serde_json::from_str(text).ok()?;
        rows.get(i)?.get("id")?.as_str().map(str::to_string)
    });
    id.map_or_else(String::new, |id| format!(" (row '{id}')"))
}

/// Peak memory in GiB from a string such as `"47GB"` or `"47.5 GiB"` (sources print PyTorch's
/// figure divided by 2^30 and call it GB). `None` when it is not a number of GB / GiB.
pub fn parse_gib(text: &str) -> Option<f64> {
    let t = text.trim();
    let lower = t.to_ascii_lowercase();
    let number = ["gib", "gb", "g"]
        .iter()
        .find_map(|unit| lower.strip_suffix(unit))?
        .trim();
    let v: f64 = number.parse().ok()?;
    (v.is_finite() && v > 0.0).then_some(v)
}

/// A number of milliseconds that follows `label` in `text` (`"forward 7.7 ms"` → 7.7).
pub fn ms_after(text: &str, label: &str) -> Option<f64> {
    let lower = text.to_ascii_lowercase();
    let start = lower.find(&format!("{label} "))? + label.len() + 1;
    let rest = lower[start..].trim_start();
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let v: f64 = rest[..end].parse().ok()?;
    rest[end..].trim_start().starts_with("ms").then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_field_path() {
        let two = r#"[{"id": "a", "kind": "per_layer_time_ms", "source_group": "g"},
                      {"id": "b", "kind": "per_layer_time_ms", "source_group": "g", "tp": "x"}]"#;
        let e = parse_rows(two, "f.json").unwrap_err().to_string();
        assert!(
            e.starts_with("f.json: runs[1].tp: must be a whole number"),
            "{e}"
        );
        let typo = r#"[{"id": "a", "kind": "per_layer_time_ms", "source_group": "g", "tpp": 2}]"#;
        let e = parse_rows(typo, "f.json").unwrap_err().to_string();
        assert!(e.contains("runs[0].tpp: unknown field `tpp`"), "{e}");
        let e = parse_rows("{}", "f.json").unwrap_err().to_string();
        assert!(e.contains("a JSON array of runs"), "{e}");
        let memory = r#"[{"id": "a", "kind": "per_layer_time_ms", "source_group": "g",
                          "peak_memory_per_gpu_gb": 82.4}]"#;
        let rows = parse_rows(memory, "f.json").unwrap();
        assert_eq!(
            rows[0]
                .peak_memory_per_gpu_gb
                .as_deref()
                .and_then(parse_gib),
            Some(82.4)
        );
    }

    /// The MoE keys parse typed; a bad value is one error naming the row's position, its id
    /// and the field.
    #[test]
    fn moe_keys() {
        let row = |key: &str, value: serde_json::Value| {
            let mut r = serde_json::json!({"id": "m", "kind": "end_to_end_training_throughput",
                "source_group": "g", "num_layers": 4, "num_experts": 8, "num_experts_per_tok": 2,
                "moe_ffn_hidden_size": 512, "num_shared_experts": 0, "first_k_dense_layers": 1,
                "attention": "gqa", "mtp_num_layers": 0, "ep": "4", "etp": 1,
                "routing": "forced-balanced", "nvlink_domain_size": 72});
            r[key] = value;
            serde_json::Value::Array(vec![r]).to_string()
        };
        let rows = parse_rows(&row("id", "m".into()), "f.json").unwrap();
        let r = &rows[0];
        assert_eq!(
            (r.num_experts, r.num_experts_per_tok, r.moe_ffn_hidden_size),
            (Some(8), Some(2), Some(512))
        );
        assert_eq!(
            (r.ep, r.etp, r.nvlink_domain_size),
            (Some(4), Some(1), Some(72))
        );
        assert_eq!(r.attention, Some(AttentionKind::Gqa));
        assert_eq!(r.routing, Some(Routing::ForcedBalanced));
        assert_eq!(r.first_k_dense_layers, Some(1));
        use serde_json::json;
        for (key, value, want) in [
            (
                "routing",
                json!("random"),
                "runs[0].routing: unknown variant `random`: use one of `forced-balanced`",
            ),
            (
                "attention",
                json!("MLA"),
                "runs[0].attention: unknown variant `MLA`",
            ),
            (
                "ep",
                json!(3),
                "runs[0].ep: 3 does not divide num_experts = 8",
            ),
            ("ep", json!(0), "runs[0].ep: must be at least 1"),
            ("ep", json!("four"), "runs[0].ep: must be a whole number"),
            (
                "num_experts_per_tok",
                json!(9),
                "runs[0].num_experts_per_tok: 9 exceeds num_experts = 8",
            ),
            (
                "first_k_dense_layers",
                json!(5),
                "runs[0].first_k_dense_layers: 5 exceeds num_layers = 4",
            ),
        ] {
            let e = parse_rows(&row(key, value), "f.json")
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("f.json: ") && e.contains(want), "{key}: {e}");
            assert!(e.contains("(row 'm')"), "{e}");
        }
    }

    #[test]
    fn gib_strings() {
        assert_eq!(parse_gib("47GB"), Some(47.0));
        assert_eq!(parse_gib(" 47.5 GiB"), Some(47.5));
        assert_eq!(parse_gib("OOM"), None);
        assert_eq!(parse_gib("-3GB"), None);
    }

    #[test]
    fn per_layer_times_from_notes() {
        let n =
            "Baseline no recompute: forward 7.7 ms, backward 11.9 ms, combined 19.6 ms per layer.";
        assert_eq!(ms_after(n, "forward"), Some(7.7));
        assert_eq!(ms_after(n, "backward"), Some(11.9));
        assert_eq!(ms_after(n, "sideways"), None);
    }

    #[test]
    fn malformed_file_names_the_position() {
        let err = parse_rows("[{\"id\": 3}]", "runs.json")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("runs.json: "), "{err}");
        assert!(err.contains("line 1"), "{err}");
        let dup = r#"[{"id": "a", "kind": "per_layer_time_ms", "source_group": "g"},
                     {"id": "a", "kind": "per_layer_time_ms", "source_group": "g"}]"#;
        let err = parse_rows(dup, "runs.json").unwrap_err().to_string();
        assert!(err.contains("appears twice"), "{err}");
        let err = parse_rows(" [ ] ", "runs.json").unwrap_err().to_string();
        assert!(
            err.starts_with("runs.json: the file holds no runs"),
            "{err}"
        );
    }
}
