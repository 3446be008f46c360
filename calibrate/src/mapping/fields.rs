//! How a published row's fields read: GPU kind, recompute mode, ZeRO stage, precision, the
//! cluster, memory units — each a fact of the run, with what was assumed where the row is
//! silent.

use autopp_hardware::{hardware, Cluster, Precision};
use autopp_models::{Recompute, RecomputeModules};

use super::super::network::{before_jean_zay_pcie_fix, nic_gbps_per_gpu, JEAN_ZAY_BEFORE_PCIE_FIX};
use super::super::rows::{parse_gib, PublishedRow};
use super::super::stacks::always_zero3;
use autopp_planner::Stack;

/// Whether the row's `result_status` says the run ran out of memory (`oom`, `OOM`,
/// `out of memory`).
pub fn ran_out_of_memory(row: &PublishedRow) -> bool {
    row.result_status.as_deref().is_some_and(|s| {
        let s = s.to_ascii_lowercase();
        s.contains("oom") || s.contains("out of memory")
    })
}

pub(super) fn need(v: Option<u64>, field: &str) -> Result<u64, String> {
    match v {
        Some(0) => Err(format!("{field} is 0")),
        Some(x) => Ok(x),
        None => Err(format!("{field} is not reported")),
    }
}

/// The catalog GPU kind for a row's GPU name.
pub fn gpu_kind(name: &str) -> Option<&'static str> {
    let n = name.to_ascii_lowercase();
    if n.contains("pcie") {
        return None;
    }
    // the Grace-Blackwell kinds first: "gb200" contains "b200"
    for kind in ["gb300", "gb200", "b300", "b200"] {
        if n.contains(kind) {
            return Some(kind);
        }
    }
    if n.contains("a100") {
        Some(if n.contains("40") {
            "a100-40g"
        } else {
            "a100-80g"
        })
    } else if n.contains("h100") && (n.contains("hbm2e") || n.contains("500w")) {
        // Meta's Grand Teton H100: 96 GB of HBM2e, capped at 500 W (torchtitan's benchmarks)
        Some("h100-hbm2e-500w")
    } else if n.contains("h100") || n.contains("h800") {
        // the H800 is an H100 with less NVLink bandwidth (`row_cluster` sets it)
        Some("h100-sxm")
    } else if n.contains("h200") {
        Some("h200")
    } else if n.contains("v100") && n.contains("32") {
        Some("v100-32g")
    } else {
        None
    }
}

pub(super) fn recompute_of(text: Option<&str>) -> Option<Recompute> {
    let t = text?.trim().to_ascii_lowercase();
    if t.starts_with("full") {
        Some(Recompute::Full)
    } else if t.starts_with("selective") {
        Some(Recompute::Selective)
    } else if t.starts_with("none") {
        Some(Recompute::None)
    } else if ["norm", "act", "up_proj"].iter().any(|m| t.contains(m)) {
        // Megatron-Core's `--recompute-modules` (layernorm, moe_act, mla_up_proj, …): small
        // modules recomputed, the nearest of autopp's modes is selective
        Some(Recompute::Selective)
    } else {
        None
    }
}

/// The row's ZeRO stage; unstated, the stack's default: Megatron-Core and NeMo run the
/// distributed optimizer (NeMo's recipes and Megatron-Core's examples set it), the others none.
pub(super) fn zero_stage_of(
    row: &PublishedRow,
    stack: Stack,
    assumptions: &mut Vec<String>,
) -> Result<u8, String> {
    if always_zero3(row, stack) {
        return Ok(3);
    }
    let Some(text) = row.zero_or_distributed_optimizer.as_deref() else {
        if matches!(stack, Stack::MegatronCore | Stack::Nemo) {
            assumptions.push(format!(
                "optimizer not stated: {stack}'s distributed optimizer (ZeRO 1) assumed"
            ));
            return Ok(1);
        }
        return Ok(0);
    };
    let t = text.to_ascii_lowercase();
    if t.starts_with("none") {
        return Ok(0);
    }
    for (needle, stage) in [
        ("zero-0", 0),
        ("stage 0", 0),
        ("zero-1", 1),
        ("stage 1", 1),
        ("zero-2", 2),
        ("stage 2", 2),
        ("zero-3", 3),
        ("stage 3", 3),
        ("full_shard", 3),
        ("fsdp", 3),
        ("distributed optimizer", 1),
        // Apex's DistributedFusedAdam (NeMo 1.x's `distributed_fused_adam`) shards the
        // optimizer states over the data-parallel group, ZeRO-1 style
        ("distributed_fused_adam", 1),
    ] {
        if t.contains(needle) {
            return Ok(stage);
        }
    }
    Err(format!("ZeRO setting '{t}' is not one autopp knows"))
}

/// The row's math precision. FP8 rows name their recipe (`MXFP8`, torchao's `float8 rowwise`
/// or `tensorwise`, "current scaling"); one that does not is its framework's default:
/// torchao's tensorwise dynamic scaling under torchtitan (`docs/float8.md`: `recipe_name`
/// unset is tensorwise), else Transformer Engine's delayed scaling (Megatron-Core's and NeMo's
/// `fp8` without a recipe).
pub(super) fn precision_of(
    row: &PublishedRow,
    stack: Stack,
    assumptions: &mut Vec<String>,
) -> Result<Precision, String> {
    let p = row.precision.as_deref().unwrap_or("").to_ascii_lowercase();
    if p.starts_with("bf16") || p.starts_with("amp_bf16") {
        Ok(Precision::Bf16)
    } else if p.starts_with("fp16") {
        Ok(Precision::Fp16)
    } else if p.contains("fp8") || p.contains("float8") {
        Ok(if p.contains("mxfp8") {
            Precision::Mxfp8
        } else if p.contains("rowwise") {
            Precision::Fp8Rowwise
        } else if p.contains("tensorwise") || p.contains("current scaling") {
            Precision::Fp8Tensorwise
        } else if stack == Stack::Torchtitan {
            assumptions.push("float8 recipe not stated: torchao's tensorwise assumed".into());
            Precision::Fp8Tensorwise
        } else {
            if !p.contains("delayed") {
                assumptions.push("FP8 recipe not stated: delayed scaling assumed".into());
            }
            Precision::Fp8Delayed
        })
    } else {
        assumptions.push("precision not stated: fp16 assumed (same tensor-core peak)".into());
        Ok(Precision::Fp16)
    }
}

/// The error for a missing size, naming the model when it is not a preset.
pub(super) fn named_model(row: &PublishedRow, missing: String) -> String {
    match row.model_name.as_deref() {
        Some(name) => format!("{missing} and '{name}' is not a model autopp knows by name"),
        None => missing,
    }
}

/// The row's machine: its GPU kind from the catalog, GPUs per node (8 when not stated) and
/// network; what it assumes goes to `assumptions`.
pub(super) fn row_cluster(
    row: &PublishedRow,
    gpus: u64,
    assumptions: &mut Vec<String>,
) -> Result<Cluster, String> {
    let gpu_name = row.gpu_type.as_deref().unwrap_or("");
    let kind =
        gpu_kind(gpu_name).ok_or_else(|| format!("GPU '{gpu_name}' is not in autopp's catalog"))?;
    if gpu_name.contains("96GB") || gpu_name.to_ascii_lowercase().contains("ampere") {
        assumptions.push(format!("GPU '{gpu_name}' modelled as the catalog's {kind}"));
    }
    let tray = row.gpus_per_node.unwrap_or(8);
    let per_node = crate::moe::domain_per_node(gpus, tray, row.nvlink_domain_size);
    if per_node != tray {
        assumptions.push(format!(
            "NVLink domain of {}: {per_node} GPUs share NVLink",
            row.nvlink_domain_size.unwrap_or(per_node)
        ));
    }
    let nic = row
        .inter_node_interconnect
        .as_deref()
        .and_then(|t| nic_gbps_per_gpu(t, tray));
    if nic.is_none() && gpus > per_node {
        assumptions.push(format!("network not stated: {kind}'s usual NIC assumed"));
    }
    let source = row.source.as_ref().and_then(|v| v.as_str()).unwrap_or("");
    let nic = match nic {
        Some(gbps)
            if before_jean_zay_pcie_fix(source, row.notes.as_deref().unwrap_or(""))
                && gpus > per_node =>
        {
            assumptions.push(format!(
                "measured before Jean Zay's PCIe/NUMA fix of 2022-02-25: the network between \
                 nodes at {JEAN_ZAY_BEFORE_PCIE_FIX} of its rate"
            ));
            Some(gbps * JEAN_ZAY_BEFORE_PCIE_FIX)
        }
        other => other,
    };
    let mut gpu = hardware::gpu(kind).map_err(|e| e.to_string())?;
    if let Some(bytes) = stated_memory_bytes(row, gpu.memory_bytes) {
        assumptions.push(format!(
            "{kind} with the row's {} GiB of memory",
            units_gib(bytes)
        ));
        gpu.memory_bytes = bytes;
    }
    if gpu_name.to_ascii_lowercase().contains("h800") {
        gpu.nvlink_bw_bytes_per_s = crate::moe::H800_NVLINK_BYTES_PER_S;
        assumptions.push("H800: the h100-sxm with NVLink at 400 GB/s".into());
    }
    Cluster::new(gpu, gpus, per_node, nic).map_err(|e| e.to_string())
}

/// The memory of the row's GPU when it states a size (`gpu_memory_gb`) more than 5 % away from
/// the catalog kind's (the 96 GB H100 of Meta's Grand Teton nodes beside the 80 GB
/// `h100-sxm`): the catalog's usable bytes scaled by the ratio of the nominal sizes (the same
/// HBM stacks, more of them), so the fit verdict uses the run's own capacity.
pub(super) fn stated_memory_bytes(row: &PublishedRow, catalog_bytes: u64) -> Option<u64> {
    let stated = match row.gpu_memory_gb.as_ref()? {
        serde_json::Value::Number(n) => n.as_f64()?,
        serde_json::Value::String(t) => parse_gib(t)?,
        _ => return None,
    };
    let nominal = (catalog_bytes as f64 / (1u64 << 30) as f64).round();
    let ratio = stated / nominal;
    (stated > 0.0 && (ratio - 1.0).abs() > 0.05).then_some((catalog_bytes as f64 * ratio) as u64)
}

pub(super) fn units_gib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1u64 << 30) as f64)
}

/// Megatron-Core's recompute modules a row names: its `recompute_modules` list (a recipe's
/// `recompute_modules`), else the modules its `activation_recomputation` phrase lists —
/// `norm` (RMSNorm, layernorm) → `layernorm`, `act` → `moe_act`, `up_proj` or
/// `up-projection` → `mla_up_proj`, `mlp` → `mlp`, `core_attn` → `core_attn` (the
/// Megatron-MoE-ModelZoo's "norm, act", the Megatron-Core GB200 blog's "selective: mlp
/// moe_act", the DeepSeek-V3 report's "RMSNorm and MLA up-projection recomputed in
/// backward"). `None`: no module named (plain `selective` keeps the attention core).
pub fn recompute_modules_of(row: &PublishedRow) -> Result<Option<RecomputeModules>, String> {
    if let Some(list) = &row.recompute_modules {
        return RecomputeModules::from_names(list)
            .map(Some)
            .map_err(|e| format!("recompute_modules: {e}"));
    }
    let Some(text) = row.activation_recomputation.as_deref() else {
        return Ok(None);
    };
    let t = text.to_ascii_lowercase();
    let words: Vec<&str> = t
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
        .filter(|w| !w.is_empty())
        .collect();
    let has = |w: &str| words.contains(&w);
    let mut m = RecomputeModules::none();
    m.layernorm = words.iter().any(|w| w.ends_with("norm"));
    m.moe_act = has("act") || has("moe_act");
    m.mla_up_proj = has("up_proj") || has("up-projection") || has("mla_up_proj");
    m.mlp = has("mlp");
    m.core_attn = has("core_attn");
    Ok((m != RecomputeModules::none()).then_some(m))
}

/// The row's recompute mode; unstated, Megatron-Core's and NeMo's default (none, the mode
/// their performance recipes use), else an error naming the field. A row's
/// `recompute_modules` list is Megatron-Core's selective recompute of those modules (an empty
/// list: none).
pub(super) fn recompute_or_default(
    row: &PublishedRow,
    stack: Stack,
    assumptions: &mut Vec<String>,
) -> Result<Recompute, String> {
    if let Some(list) = &row.recompute_modules {
        let modules = recompute_modules_of(row)?.unwrap_or_else(RecomputeModules::none);
        if list.is_empty() {
            assumptions.push("recompute_modules [] (the recipe's): no recompute".into());
            return Ok(Recompute::None);
        }
        assumptions.push(format!(
            "recompute_modules {} (the recipe's): selective recompute of those modules",
            modules.names().join(", ")
        ));
        return Ok(Recompute::Selective);
    }
    match (row.activation_recomputation.as_deref(), stack) {
        (Some(text), _) => recompute_of(Some(text))
            .ok_or_else(|| format!("activation_recomputation '{text}' is not one autopp knows")),
        (None, Stack::MegatronCore | Stack::Nemo) => {
            assumptions.push(format!("recompute not stated: none ({stack}'s default)"));
            Ok(Recompute::None)
        }
        // the MoE performance tables list recompute when they use it (ModelZoo, DeepSeek)
        (None, _) if crate::moe::is_moe(row) => {
            assumptions
                .push("recompute not stated: none (the MoE tables name it when used)".into());
            Ok(Recompute::None)
        }
        (None, _) => Err("activation_recomputation is not reported".to_string()),
    }
}
