//! From a published row to what autopp evaluates: a model, a cluster and a parallel
//! configuration (whole iterations), or one transformer layer (per-layer rows).
//!
//! Everything taken from a row is a *fact of that run*: its sizes and degrees, its GPU and
//! network, its framework's behaviour (fp16 gradients, overlapped reduction, no fused attention
//! before 2022). No row gets its own constant: the efficiency knobs are global.

use autopp_hardware::{hardware, Cluster, Precision};
use autopp_models::{Model, PositionEmbedding, TransformerSpec};

pub use super::network::nic_gbps_per_gpu;
pub use fields::{gpu_kind, ran_out_of_memory};

mod fields;
use super::rows::{ms_after, parse_gib, PublishedRow, RowKind};
use super::stacks::{flash_attention, preset_model, runtime_of, stack_of};
use autopp_planner::config::{EvalSettings, ParallelConfig, Runtime};
use autopp_planner::schedule::ScheduleKind;
use autopp_planner::Degrees;
use autopp_planner::Stack;
use fields::{
    named_model, need, precision_of, recompute_modules_of, recompute_of, recompute_or_default,
    row_cluster, zero_stage_of,
};

/// A whole iteration to evaluate with [`autopp_planner::estimate::evaluate`].
#[derive(Debug, Clone)]
pub struct IterationCase {
    /// The model.
    pub model: Model,
    /// The cluster, exactly the run's GPUs.
    pub cluster: Cluster,
    /// The run's configuration.
    pub config: ParallelConfig,
    /// Published seconds per iteration, when the row's time can be compared.
    pub time_s: Option<f64>,
    /// Why the row's time is not compared (it has one but it is inconsistent).
    pub time_skip: Option<String>,
    /// Published peak memory per GPU, GiB (PyTorch's peak over the first and last rank).
    pub memory_gib: Option<f64>,
    /// The run ran out of memory (`result_status` says OOM): only its fit is compared.
    pub ran_out_of_memory: bool,
    /// The published peak is the caching allocator's maximum reserved bytes, without the CUDA
    /// context and NCCL's own buffers: torchtitan logs `torch.cuda.max_memory_reserved`
    /// (`DeviceMemoryMonitor`, `torchtitan/components/metrics.py`, `max_reserved_gib`). The
    /// others publish what `nvidia-smi` shows (BLOOM's tables) — the whole GPU's use.
    pub memory_allocator_only: bool,
}

/// One transformer layer timed on its own (Korthikanti et al. 2022, Table 4).
#[derive(Debug, Clone)]
pub struct LayerCase {
    /// A one-layer model with the row's sizes.
    pub model: Model,
    /// The GPUs of one tensor-parallel group.
    pub cluster: Cluster,
    /// The layer's configuration (tp, micro-batch, recompute, sequence parallelism).
    pub config: ParallelConfig,
    /// Published forward time of the layer, seconds.
    pub forward_s: f64,
    /// Published backward time of the layer (with any recomputation), seconds.
    pub backward_s: f64,
}

/// What a row becomes.
#[derive(Debug, Clone)]
pub enum Case {
    /// A whole training iteration.
    Iteration(Box<IterationCase>),
    /// One layer's forward and backward.
    Layer(Box<LayerCase>),
}

/// A row mapped to a case, with the assumptions the mapping made (framework defaults the row
/// does not state).
#[derive(Debug, Clone)]
pub struct Mapped {
    /// The case.
    pub case: Case,
    /// Assumptions, one short sentence each.
    pub assumptions: Vec<String>,
}

/// Maps a row; `Err` is the reason it cannot be modelled.
pub fn map_row(row: &PublishedRow) -> Result<Mapped, String> {
    if let Some(status) = &row.result_status {
        if status != "ok" && !ran_out_of_memory(row) {
            return Err(format!(
                "the run did not succeed (result_status '{status}')"
            ));
        }
    }
    match row.kind {
        RowKind::EndToEndTrainingThroughput => map_iteration(row),
        RowKind::PerLayerTimeMs => map_layer(row),
    }
}

/// The architecture a framework's models have: GPT (Megatron: learned positions, biases,
/// dropout), BLOOM (ALiBi, biases, dropout 0.1 — Megatron's default, which tr11 inherits), MPT
/// (ALiBi, no biases, no dropout).
/// A row that lacks a size but names a preset (`LLAMA3-70B`, `GPT3-175B`) takes the preset's
/// architecture at the row's sequence length.
fn transformer(row: &PublishedRow, stack: Stack, layers: Option<u64>) -> Result<Model, String> {
    let complete = [
        row.num_layers.or(layers),
        row.hidden_size,
        row.num_attention_heads,
        row.vocab_size,
    ]
    .iter()
    .all(|x| x.is_some_and(|v| v > 0));
    // torchtitan trains its own Llama definition (RoPE, RMSNorm, SwiGLU, untied head, no
    // biases or dropout): a row naming a Llama preset takes the preset's architecture even
    // when it states the sizes, which must then agree with the preset's
    if !complete || stack == Stack::Torchtitan {
        if let Some(model) = preset_model(row) {
            return model.and_then(|m| agrees(row, m));
        }
    }
    let layers = need(layers.or(row.num_layers), "num_layers").map_err(|e| named_model(row, e))?;
    let h = need(row.hidden_size, "hidden_size").map_err(|e| named_model(row, e))?;
    let a = need(row.num_attention_heads, "num_attention_heads")?;
    let s = need(row.seq_length, "seq_length")?;
    let v = need(row.vocab_size, "vocab_size")?;
    let mut t = TransformerSpec::new(
        row.model_name.as_deref().unwrap_or(&row.id),
        layers,
        h,
        a,
        v,
        s,
    );
    t.num_kv_heads = row.num_kv_heads;
    t.ffn_hidden_size = row.ffn_hidden_size;
    match stack {
        // BLOOM's runs keep Megatron's default dropout (0.1) and use ALiBi.
        Stack::MegatronDeepspeed | Stack::Deepspeed => {}
        Stack::Composer => {
            t.dropout = false;
            t.bias = false;
        }
        // GPT models of Megatron-LM, NeMo and MegaScale: learned positions
        _ => t.position_embedding = PositionEmbedding::Learned,
    }
    t.validate().map_err(|e| e.to_string())?;
    Ok(Model::Transformer(t))
}

/// `model` when the sizes the row states are the model's; else an error naming the first that
/// differs.
fn agrees(row: &PublishedRow, model: Model) -> Result<Model, String> {
    let Model::Transformer(t) = &model else {
        return Ok(model);
    };
    for (field, stated, preset) in [
        ("num_layers", row.num_layers, t.num_layers),
        ("hidden_size", row.hidden_size, t.hidden_size),
        (
            "num_attention_heads",
            row.num_attention_heads,
            t.num_attention_heads,
        ),
        ("vocab_size", row.vocab_size, t.vocab_size),
    ] {
        if stated.is_some_and(|v| v != preset) {
            return Err(format!(
                "{field} {} differs from the preset '{}' the row names ({preset})",
                stated.unwrap_or(0),
                t.name
            ));
        }
    }
    Ok(model)
}

fn map_iteration(row: &PublishedRow) -> Result<Mapped, String> {
    let (stack, guess) = stack_of(row);
    let mut assumptions: Vec<String> = guess.into_iter().collect();
    let model = if crate::moe::is_moe(row) {
        crate::moe::model(row, &mut assumptions)?
    } else {
        transformer(row, stack, None)?
    };
    let gpus = need(row.num_gpus, "num_gpus")?;
    let cluster = row_cluster(row, gpus, &mut assumptions)?;

    let tp = need(row.tp, "tp")?;
    let pp = need(row.pp, "pp")?;
    let cp = row.cp.unwrap_or(1).max(1);
    let dp = need(row.dp, "dp")?;
    let product = [tp, pp, dp, cp]
        .iter()
        .try_fold(1u64, |a, &b| a.checked_mul(b));
    if product != Some(gpus) {
        return Err(format!(
            "inconsistent degrees: tp·pp·dp·cp = {}·{}·{}·{} = {} but num_gpus = {gpus}",
            tp,
            pp,
            dp,
            cp,
            product.map_or_else(|| "too many".to_string(), |p| p.to_string())
        ));
    }
    let mbs = need(row.micro_batch_size, "micro_batch_size")?;
    let gbs = need(row.global_batch_size, "global_batch_size")?;
    let recompute = recompute_or_default(row, stack, &mut assumptions)?;
    let modules = recompute_modules_of(row)?;
    if let (Some(m), None) = (modules, &row.recompute_modules) {
        assumptions.push(format!(
            "recompute modules as the source names them: {} (Megatron-Core's --recompute-modules)",
            m.names().join(", ")
        ));
    }
    let virtual_stages = row.virtual_pipeline_stages.unwrap_or(1).max(1);
    let schedule = if virtual_stages > 1 {
        ScheduleKind::Interleaved1F1B
    } else {
        ScheduleKind::OneFOneB
    };
    let degrees = Degrees {
        tp,
        pp,
        dp,
        cp,
        virtual_stages,
    };
    let zero_stage = zero_stage_of(row, stack, &mut assumptions)?;
    let sequence_parallel = match row.sequence_parallel {
        Some(sp) => sp,
        // NeMo's recipes and Megatron-Core's examples pair tensor parallelism with it;
        // torchtitan's tensor-parallel plan always shards the norms' activations over the
        // sequence (`SequenceParallel` on `attention_norm`/`ffn_norm`, `parallelize.py`)
        None if tp > 1
            && matches!(stack, Stack::MegatronCore | Stack::Nemo | Stack::Torchtitan) =>
        {
            assumptions.push(format!(
                "sequence parallelism not stated: on with tp {tp} ({stack}'s recipes)"
            ));
            true
        }
        None => false,
    };
    let config = ParallelConfig::new(degrees, mbs, gbs)
        .with_experts(crate::moe::experts(row, &mut assumptions)?)
        .with_schedule(schedule)
        .with_recompute(recompute)
        .with_sequence_parallel(sequence_parallel)
        .with_zero_stage(zero_stage)
        .with_settings(EvalSettings {
            precision: precision_of(row, stack, &mut assumptions)?,
            // a measured peak has no headroom in it
            memory_reserve_bytes: 0,
            memory_margin_bytes: 0,
            flash_attention: flash_attention(stack),
            runtime: Runtime {
                recompute_modules: modules.unwrap_or_default(),
                ..runtime_of(row, stack)
            },
        });
    let oom = ran_out_of_memory(row);
    let (time_s, time_skip) = if oom {
        (None, None)
    } else {
        published_time(row, &model, gpus)
    };
    let memory_gib = row.peak_memory_per_gpu_gb.as_deref().and_then(parse_gib);
    if !oom && time_s.is_none() && time_skip.is_none() && memory_gib.is_none() {
        return Err("the row publishes neither a time nor a memory figure".into());
    }
    Ok(Mapped {
        case: Case::Iteration(Box::new(IterationCase {
            model,
            cluster,
            config,
            time_s,
            time_skip,
            memory_gib,
            ran_out_of_memory: oom,
            memory_allocator_only: stack == Stack::Torchtitan,
        })),
        assumptions,
    })
}

/// The row's seconds per iteration, or why it is not compared. A row whose own TFLOP/s (under
/// Megatron's eq. 3, which counts the recompute forward) disagrees with its seconds by more
/// than 15 % has a wrong time or batch; its time is not used.
fn published_time(row: &PublishedRow, model: &Model, gpus: u64) -> (Option<f64>, Option<String>) {
    let Some(t) = row
        .seconds_per_iteration
        .filter(|t| t.is_finite() && *t > 0.0)
    else {
        return (None, None);
    };
    let def = row
        .tflops_definition
        .as_deref()
        .unwrap_or("")
        .to_ascii_lowercase();
    let eq3 = def.contains("recompute");
    if let (true, Some(tflops), Model::Transformer(m), Some(b)) =
        (eq3, row.tflops_per_gpu, model, row.global_batch_size)
    {
        let (bb, s, l, h, v) = (
            b as f64,
            m.seq_length as f64,
            m.num_layers as f64,
            m.hidden_size as f64,
            m.vocab_size as f64,
        );
        // Narayanan et al. 2021, eq. 3.
        let flops = 96.0 * bb * s * l * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * l * h));
        let implied_s = flops / (gpus as f64 * tflops * 1e12);
        let ratio = t / implied_s;
        if !(0.85..=1.15).contains(&ratio) {
            return (
                None,
                Some(format!(
                    "time not compared: the row's {tflops} TFLOP/s imply {implied_s:.1} s per iteration, not its {t} s (its batch or time is wrong)"
                )),
            );
        }
    }
    (Some(t), None)
}

fn map_layer(row: &PublishedRow) -> Result<Mapped, String> {
    let (stack, guess) = stack_of(row);
    let notes = row.notes.as_deref().unwrap_or("");
    let forward_ms = ms_after(notes, "forward")
        .ok_or_else(|| "no 'forward N ms' in the row's notes".to_string())?;
    let backward_ms = ms_after(notes, "backward")
        .ok_or_else(|| "no 'backward N ms' in the row's notes".to_string())?;
    let mut assumptions: Vec<String> = guess.into_iter().collect();
    if row.vocab_size.is_none() {
        assumptions.push("vocabulary irrelevant to one layer: 51200 used".into());
    }
    let mut r = row.clone();
    r.vocab_size = Some(row.vocab_size.unwrap_or(51200));
    let model = transformer(&r, stack, Some(1))?;
    let tp = need(row.tp, "tp")?;
    let gpu_name = row.gpu_type.as_deref().unwrap_or("");
    let kind =
        gpu_kind(gpu_name).ok_or_else(|| format!("GPU '{gpu_name}' is not in autopp's catalog"))?;
    let gpu = hardware::gpu(kind).map_err(|e| e.to_string())?;
    let cluster =
        Cluster::new(gpu, tp, row.gpus_per_node.unwrap_or(8), None).map_err(|e| e.to_string())?;
    let recompute = recompute_of(row.activation_recomputation.as_deref())
        .ok_or_else(|| "activation_recomputation is not reported".to_string())?;
    let mbs = need(row.micro_batch_size, "micro_batch_size")?;
    let degrees = Degrees {
        tp,
        pp: 1,
        dp: 1,
        cp: 1,
        virtual_stages: 1,
    };
    let config = ParallelConfig::new(degrees, mbs, mbs)
        .with_recompute(recompute)
        .with_sequence_parallel(row.sequence_parallel.unwrap_or(false))
        .with_settings(EvalSettings {
            precision: Precision::Fp16,
            // a measured peak has no headroom in it
            memory_reserve_bytes: 0,
            memory_margin_bytes: 0,
            flash_attention: flash_attention(stack),
            runtime: runtime_of(row, stack),
        });
    Ok(Mapped {
        case: Case::Layer(Box::new(LayerCase {
            model,
            cluster,
            config,
            forward_s: forward_ms * 1e-3,
            backward_s: backward_ms * 1e-3,
        })),
        assumptions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_names() {
        assert_eq!(gpu_kind("A100-SXM4-80GB"), Some("a100-80g"));
        assert_eq!(gpu_kind("A100-40GB"), Some("a100-40g"));
        assert_eq!(gpu_kind("H100-80GB"), Some("h100-sxm"));
        assert_eq!(
            gpu_kind("H100 96GB HBM2e, 500W power limit (Grand Teton)"),
            Some("h100-hbm2e-500w")
        );
        assert_eq!(gpu_kind("H100 PCIe"), None);
        assert_eq!(gpu_kind("MI250X"), None);
    }

    /// A run that ran out of memory is mapped for its fit verdict alone: no time is compared.
    #[test]
    fn out_of_memory_runs_are_mapped_for_their_fit() {
        let text = r#"[{"id": "oom", "kind": "end_to_end_training_throughput",
            "source_group": "g", "framework": "Megatron-LM (2021)", "result_status": "OOM",
            "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 16,
            "seq_length": 2048, "vocab_size": 51200, "global_batch_size": 8,
            "micro_batch_size": 1, "tp": 1, "pp": 1, "dp": 8, "num_gpus": 8,
            "gpu_type": "A100-SXM4-80GB", "activation_recomputation": "none",
            "seconds_per_iteration": 1.0}]"#;
        let row = crate::rows::parse_rows(text, "test").unwrap().remove(0);
        assert!(ran_out_of_memory(&row));
        let Case::Iteration(it) = map_row(&row).unwrap().case else {
            panic!("an iteration case")
        };
        assert!(it.ran_out_of_memory && it.time_s.is_none());
        let mut failed = row.clone();
        failed.result_status = Some("diverged".into());
        assert!(map_row(&failed).unwrap_err().contains("did not succeed"));
    }

    /// Megatron-Core's recompute modules, from a recipe's list or from the phrases the MoE
    /// sources print; a row's list wins and maps to selective recompute (an empty list: none)
    /// with those modules in the runtime.
    #[test]
    fn recompute_modules_of_lists_and_phrases() {
        use autopp_models::{Recompute, RecomputeModules};
        let text = r#"[{"id": "m", "kind": "end_to_end_training_throughput",
            "source_group": "g", "framework": "NeMo 26.02 container (Megatron-Bridge)",
            "model_name": "Qwen3-30B-A3B", "num_experts": 128, "ep": 8,
            "seq_length": 4096, "global_batch_size": 512, "micro_batch_size": 1,
            "tp": 1, "pp": 1, "dp": 8, "num_gpus": 8, "gpu_type": "B200",
            "precision": "bf16", "seconds_per_iteration": 1.0}]"#;
        let base = crate::rows::parse_rows(text, "test").unwrap().remove(0);
        let phrase = |p: &str| {
            let mut r = base.clone();
            r.activation_recomputation = Some(p.into());
            recompute_modules_of(&r).unwrap().map(|m| m.names())
        };
        assert_eq!(phrase("norm, act"), Some(vec!["layernorm", "moe_act"]));
        assert_eq!(
            phrase("selective: mlp up_proj"),
            Some(vec!["mla_up_proj", "mlp"])
        );
        assert_eq!(
            phrase("selective: mlp moe_act"),
            Some(vec!["moe_act", "mlp"])
        );
        assert_eq!(
            phrase("RMSNorm and MLA up-projection recomputed in backward"),
            Some(vec!["layernorm", "mla_up_proj"])
        );
        for plain in ["selective", "full", "none", "selective (per-op SAC)"] {
            assert_eq!(phrase(plain), None, "{plain}");
        }
        let listed = |list: &[&str]| {
            let mut r = base.clone();
            r.activation_recomputation = Some("full".into());
            r.recompute_modules = Some(list.iter().map(|s| s.to_string()).collect());
            r
        };
        let row = listed(&["layernorm", "moe_act"]);
        let Case::Iteration(it) = map_row(&row).unwrap().case else {
            panic!("an iteration case")
        };
        assert_eq!(it.config.recompute, Recompute::Selective);
        assert_eq!(
            it.config.settings.runtime.recompute_modules,
            RecomputeModules::from_names(&["layernorm", "moe_act"]).unwrap()
        );
        let Case::Iteration(it) = map_row(&listed(&[])).unwrap().case else {
            panic!("an iteration case")
        };
        assert_eq!(it.config.recompute, Recompute::None);
        let err = map_row(&listed(&["moe"])).unwrap_err();
        assert!(
            err.contains("recompute_modules") && err.contains("'moe'"),
            "{err}"
        );
        // no module named: Megatron's default, the attention core
        let Case::Iteration(it) = map_row(&base).unwrap().case else {
            panic!("an iteration case")
        };
        assert!(it.config.settings.runtime.recompute_modules.is_default());
    }
}
