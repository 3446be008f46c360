//! A published row's software stack and the facts of its runtime, and the model a row names
//! without its sizes. Every row maps to a stack ([`stack_of`]): a framework autopp does not
//! recognise is modelled with the modern defaults and says so, so no run is refused for its
//! framework alone.

use autopp_models::{presets, Model};
use autopp_planner::config::Runtime;
use autopp_planner::runtime::{OptimizerStates, SelectiveRecompute};
use autopp_planner::Stack;

use super::rows::PublishedRow;

/// The stack a row's `framework` names, and an assumption when the mapping had to guess.
pub fn stack_of(row: &PublishedRow) -> (Stack, Option<String>) {
    let raw = row.framework.as_deref().unwrap_or("");
    let f = raw.to_ascii_lowercase();
    let stack = if f.contains("automodel") {
        // NeMo AutoModel runs PyTorch's FSDP2 and pipeline schedules, not Megatron-Core
        Stack::Torchtitan
    } else if f.contains("megatron-deepspeed") {
        Stack::MegatronDeepspeed
    } else if f.contains("nemo") {
        Stack::Nemo
    } else if f.contains("megatron") && (f.contains("2021") || f.contains("zero-3")) {
        Stack::MegatronLm2021
    } else if f.contains("megatron") {
        // Megatron-LM after 2022 (MegaScale's baseline commit, Megatron-Core): today's runtime
        Stack::MegatronCore
    } else if f.contains("torchtitan") {
        Stack::Torchtitan
    } else if f.contains("composer") || f.contains("llm-foundry") {
        Stack::Composer
    } else if f.contains("deepspeed") {
        Stack::Deepspeed
    } else {
        let shown = if raw.is_empty() {
            "(not reported)"
        } else {
            raw
        };
        return (
            Stack::Any,
            Some(format!(
                "framework '{shown}' not recognised: the modern defaults (every overlap on) assumed"
            )),
        );
    };
    (stack, None)
}

/// Whether the row's framework always shards weights (ZeRO-3): Megatron-LM driving DeepSpeed
/// ZeRO-3 (Narayanan et al. 2021, Table 2) and Composer's FSDP.
pub fn always_zero3(row: &PublishedRow, stack: Stack) -> bool {
    let f = row.framework.as_deref().unwrap_or("").to_ascii_lowercase();
    stack == Stack::Composer || (f.contains("megatron") && f.contains("zero-3"))
}

/// The stack's runtime with what the row states about its own run: PyTorch DDP's bucketed
/// all-reduce overlaps the backward in 2021 (`DDP impl 'torch'`); ZeRO-3 under Megatron-LM 2021
/// did not; Composer's DEFAULT mixed precision reduces in fp32 and PURE in bf16; torchtitan's
/// async TP (named in the row's notes) overlaps the tensor-parallel collectives; the expert
/// dispatcher ([`dedup_dispatcher`]) and an all-to-all overlap the notes name; BigScience's
/// runs wait on every launch ([`bigscience_launch_blocking`]).
pub fn runtime_of(row: &PublishedRow, stack: Stack) -> Runtime {
    let zero = row
        .zero_or_distributed_optimizer
        .as_deref()
        .unwrap_or("")
        .to_ascii_lowercase();
    let precision = row.precision.as_deref().unwrap_or("").to_ascii_lowercase();
    let notes = row.notes.as_deref().unwrap_or("").to_ascii_lowercase();
    let mut r = stack.runtime();
    match stack {
        Stack::MegatronLm2021 => {
            r.overlap_grad_reduce = zero.contains("'torch'") && !always_zero3(row, stack);
        }
        Stack::Composer => r.fp32_main_grads = !precision.contains("pure"),
        // BigScience's BF16 optimizer (DeepSpeed's `BF16_Optimizer`, from 2022-02-28)
        // accumulates the gradients in fp32 beside the bf16 ones, "4bytes x params and it's not
        // sharded" (tr11 `chronicles-prequel.md`, "Rebalancing layers"; the memory model's
        // `resident_half_grad_bytes_per_param`); the fp16 ZeRO-1 optimizer before it kept
        // 16-bit gradients only
        Stack::MegatronDeepspeed if precision.starts_with("bf16") => r.fp32_main_grads = true,
        Stack::Torchtitan => {
            r.tp_comm_overlap = notes.contains("asynctp");
            r.fused_elementwise = !ran_eager(row);
            let framework = row.framework.as_deref().unwrap_or("").to_ascii_lowercase();
            // from April 2025 torchtitan's `--training.compile` compiles the loss as well
            // (PR #1033, `build_loss_fn`); its benchmarks are named by the month they ran (NeMo
            // AutoModel, modelled with this stack, has its own loss)
            r.compiled_loss = r.fused_elementwise
                && framework.contains("torchtitan")
                && source_month(row).is_some_and(|m| m >= (2025, 4));
            // torchtitan's blocks project q, k and v in one `wqkv` GEMM from April 2026 (PR
            // #2878, `fuse_qkv=True` in every Llama 3 flavour); its runs published before (and
            // AutoModel's Hugging Face blocks) multiply `wq, wk, wv` apart, which moves what its
            // per-op checkpoint saves ([`SelectiveRecompute`]). An undated row is of before.
            let fused = framework.contains("torchtitan")
                && source_month(row).is_some_and(|m| m >= (2026, 4));
            if !fused {
                r.selective = SelectiveRecompute::EveryOtherMatmul;
            }
            // NeMo AutoModel runs FSDP2 with Transformer Engine's layers ("PyTorch FSDP2 +
            // TE"), whose attention is TE's cuDNN kernel, not SDPA's FlashAttention-2
            if framework.contains("automodel") || framework.contains("+ te") {
                r.attention_kernel = autopp_models::AttentionKernel::Native;
            }
        }
        _ => {}
    }
    r.host_serialized = bigscience_launch_blocking(row);
    r.optimizer_states = optimizer_states_of(&zero);
    // NeMo's `fp8_params` (the row's precision names it); NeMo then sets `store_params=True`
    // (`megatron_base_model.py`), so bf16 states come with a bf16 copy of the weights
    r.fp8_params = precision.contains("fp8_params");
    if r.fp8_params && r.optimizer_states == OptimizerStates::Bf16 {
        r.optimizer_states = OptimizerStates::Bf16StoredParams;
    }
    r.ep_dispatch_dedup = dedup_dispatcher(row);
    // a token-drop run pads every expert to its capacity: static shapes, no host sync in the
    // dispatcher, and the whole iteration replayed from a CUDA graph (Megatron-Bridge's 25.09-era
    // Qwen3 recipes, `configs/qwen3/workload_base_configs.py`: `cuda_graph_scope`
    // `full_iteration` on B200, GB200 and GB300), so the host never binds its MoE layers
    if row.routing == Some(crate::rows::Routing::TokenDrop) {
        r.expert_host_launches = false;
    }
    // the source says its expert all-to-alls overlap another micro-batch's compute
    // (Megatron-MoE-ModelZoo's "+1f1b overlap", Megatron-Bridge's `moe_a2a_overlap`)
    r.ep_a2a_overlap |= [
        "1f1b overlap",
        "moe_a2a_overlap",
        "overlap-moe-expert-parallel-comm",
    ]
    .iter()
    .any(|k| notes.contains(k));
    r
}

/// Whether the row is one of BigScience's tr11 benchmarks on Jean Zay
/// (`train/tr11-176B-ml/chronicles-prequel.md`), which ran with `CUDA_LAUNCH_BLOCKING=1`.
pub fn bigscience_launch_blocking(row: &PublishedRow) -> bool {
    row.source
        .as_ref()
        .and_then(|s| s.as_str())
        .is_some_and(crate::network::from_bigscience_chronicle)
}

/// The optimizer states the row's `zero_or_distributed_optimizer` phrase (lower case) names:
/// NeMo 1.x's Apex `distributed_fused_adam` keeps 16-bit remainders of fp32 master weights, or
/// with `optim.dtype bf16` bf16 states and no master copy, or a bf16 copy of the weights when
/// the phrase says `store_params` (FP8 parameters)
/// ([`autopp_planner::runtime::OptimizerStates`]); anything else fp32 master weights and moments.
pub fn optimizer_states_of(zero: &str) -> OptimizerStates {
    if !zero.contains("distributed_fused_adam") {
        OptimizerStates::Fp32
    } else if zero.contains("optim.dtype bf16") && zero.contains("store_params") {
        OptimizerStates::Bf16StoredParams
    } else if zero.contains("optim.dtype bf16") {
        OptimizerStates::Bf16
    } else if zero.contains("store_params") {
        // an fp32 optimizer that stores its own copy of the weights: a whole fp32 master
        OptimizerStates::Fp32
    } else {
        OptimizerStates::Fp32Remainders
    }
}

/// The (year, month) the row's `source` names first, as torchtitan's benchmark files are named
/// (`llama3_h100_202412_torchtitan.md`, `asyncTP_llama3_h100_2025-06_torchtitan.md`): `20YY`
/// and a month `MM` (or `-MM`), standing apart from letters and digits on both sides (a commit
/// hash's digits do not).
pub fn source_month(row: &PublishedRow) -> Option<(u32, u32)> {
    let text = match row.source.as_ref()? {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let b = text.as_bytes();
    let digits = |at: usize, n: usize| -> Option<u32> {
        let part = b.get(at..at + n)?;
        part.iter()
            .all(u8::is_ascii_digit)
            .then(|| part.iter().fold(0, |acc, d| acc * 10 + u32::from(d - b'0')))
    };
    (0..b.len()).find_map(|i| {
        let apart = i == 0 || !b[i - 1].is_ascii_alphanumeric();
        if !apart || b.get(i..i + 2) != Some(b"20".as_slice()) {
            return None;
        }
        let year = digits(i, 4)?;
        let at = if b.get(i + 4) == Some(&b'-') {
            i + 5
        } else {
            i + 4
        };
        let month = digits(at, 2)?;
        let ends = b.get(at + 2).is_none_or(|c| !c.is_ascii_digit());
        ((1..=12).contains(&month) && ends).then_some((year, month))
    })
}

/// Whether a torchtitan row ran in PyTorch eager mode, without `torch.compile`: its notes say
/// `eager`, or list the techniques it ran (torchtitan's 2024-12 benchmark table, "Techniques:
/// FSDP" against "FSDP + torch.compile") without compile. Otherwise compiled, as torchtitan's
/// benchmark commands run (`--training.compile`; async TP and float8 need it).
pub fn ran_eager(row: &PublishedRow) -> bool {
    let notes = row.notes.as_deref().unwrap_or("").to_ascii_lowercase();
    if notes.contains("eager") {
        return true;
    }
    notes.split_once("techniques:").is_some_and(|(_, rest)| {
        // the clause ends at a full stop and a space (`torch.compile` has a dot)
        let listed = rest.split(". ").next().unwrap_or("");
        !listed.contains("compile")
    })
}

/// Whether the row's expert all-to-alls send a token once per node
/// ([`Runtime::ep_dispatch_dedup`]): its dispatcher, framework or notes name DeepEP or HybridEP
/// (Megatron-Core's `flex` dispatcher), or it is a Megatron-Bridge performance run, whose
/// recipes select the flex dispatcher (`scripts/performance/configs/*/…_workload_base_configs.py`:
/// `moe_flex_dispatcher_backend` `deepep` or `hybridep`). A dispatcher named `alltoall` or
/// `A2A` wins over the rest. A token-drop run names none and sends every (token, expert) pair:
/// dropping pads each expert to its capacity, which the flex dispatcher refuses (Megatron-Core
/// `TransformerConfig.__post_init__`: "Flex token dispatcher does not support
/// moe_pad_expert_input_to_capacity"), and Megatron-Bridge's `apply_moe_token_drop` (capacity
/// factor 1.0, padded) asserts `moe_token_dispatcher_type` `alltoall` — the 25.09 tables'
/// "(tokendrop)" rows.
pub fn dedup_dispatcher(row: &PublishedRow) -> bool {
    let said = |t: &str| {
        let t = t.to_ascii_lowercase();
        if t.contains("alltoall") || t.contains("a2a") {
            Some(false)
        } else if t.contains("deepep") || t.contains("hybridep") || t.contains("flex") {
            Some(true)
        } else {
            None
        }
    };
    if let Some(d) = row
        .token_dispatcher
        .as_ref()
        .and_then(|v| v.as_str())
        .and_then(said)
    {
        return d;
    }
    if row.routing == Some(crate::rows::Routing::TokenDrop) {
        return false;
    }
    let framework = row.framework.as_deref().unwrap_or("");
    let notes = row.notes.as_deref().unwrap_or("").to_ascii_lowercase();
    framework.to_ascii_lowercase().contains("megatron-bridge")
        || notes.contains("deepep")
        || notes.contains("hybridep")
}

/// Whether the stack runs a fused attention kernel: not the 2021–22 Megatron-LM and
/// Megatron-DeepSpeed runs (FlashAttention appeared in 2022 and they predate its use).
pub fn flash_attention(stack: Stack) -> bool {
    !matches!(
        stack,
        Stack::MegatronLm2021 | Stack::MegatronDeepspeed | Stack::Deepspeed
    )
}

/// NeMo's names for its Nemotron models (letters and digits only) and the generation each is
/// (NeMo 2.0's `Nemotron3Config8B`, `Nemotron3Config22B`, `Nemotron4Config340B`).
const NEMOTRON_NAMES: [(&str, &str); 3] = [
    ("nemotron8b", "nemotron38b"),
    ("nemotron22b", "nemotron322b"),
    ("nemotron340b", "nemotron4340b"),
];

/// The preset a row's model name means, by its letters and digits alone (`LLAMA3-70B`,
/// `Llama 3.1 8B` → `llama3-70b`, `llama3-8b`: Llama 3.1 has Llama 3's architecture; NeMo's
/// `Nemotron-8B`, `-22B`, `-340B` → `nemotron3-8b`, `nemotron3-22b`, `nemotron4-340b`).
pub fn preset_named(name: &str) -> Option<&'static presets::Preset> {
    let key = |s: &str| -> String {
        let k = s
            .to_ascii_lowercase()
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .collect::<String>()
            .replace("llama31", "llama3");
        NEMOTRON_NAMES
            .iter()
            .find(|(short, _)| *short == k)
            .map_or(k, |(_, full)| full.to_string())
    };
    let wanted = key(name);
    presets::presets().iter().find(|p| key(p.name) == wanted)
}

/// The model of a row that names a preset but lacks some sizes, at the row's sequence length;
/// `None` when the name is no preset.
pub fn preset_model(row: &PublishedRow) -> Option<Result<Model, String>> {
    let p = preset_named(row.model_name.as_deref()?)?;
    Some(
        p.load()
            .map_err(|e| e.to_string())
            .and_then(|m| match row.seq_length {
                Some(s) => m.with_seq_length(s).map_err(|e| e.to_string()),
                None => Ok(m),
            }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(framework: &str) -> PublishedRow {
        let text = format!(
            r#"[{{"id": "r", "kind": "end_to_end_training_throughput", "source_group": "g",
                 "framework": "{framework}"}}]"#
        );
        crate::rows::parse_rows(&text, "test").unwrap().remove(0)
    }

    #[test]
    fn every_published_framework_has_a_stack() {
        for (text, stack) in [
            ("Megatron-LM (2021)", Stack::MegatronLm2021),
            ("Megatron-LM + DeepSpeed ZeRO-3", Stack::MegatronLm2021),
            (
                "Megatron-DeepSpeed (BigScience fork) + DeepSpeed",
                Stack::MegatronDeepspeed,
            ),
            ("NeMo 24.07 (Megatron-Core)", Stack::Nemo),
            ("Megatron-LM commit 285068c8", Stack::MegatronCore),
            ("torchtitan (FSDP2/DTensor)", Stack::Torchtitan),
            ("MosaicML Composer / llm-foundry", Stack::Composer),
        ] {
            assert_eq!(stack_of(&row(text)), (stack, None), "{text}");
        }
        let (any, why) = stack_of(&row("JAX/Pax"));
        assert_eq!(any, Stack::Any);
        assert!(why.unwrap().contains("JAX/Pax"));
        assert!(always_zero3(
            &row("Megatron-LM + DeepSpeed ZeRO-3"),
            Stack::MegatronLm2021
        ));
    }

    /// NeMo's FP8 parameters are read from the row's precision; no stack holds them otherwise.
    #[test]
    fn fp8_params_follow_the_precision() {
        for (precision, fp8_params) in [
            ("fp8 delayed scaling (fp8_hybrid; fp8_params)", true),
            ("fp8", false),
            ("bf16", false),
        ] {
            let mut r = row("NeMo 24.07 (Megatron-Core)");
            r.precision = Some(precision.to_string());
            assert_eq!(
                runtime_of(&r, Stack::Nemo).fp8_params,
                fp8_params,
                "{precision}"
            );
        }
        assert!(Stack::ALL.iter().all(|s| !s.runtime().fp8_params));
        // FP8 parameters make NeMo store a bf16 copy of the weights beside bf16 states
        let mut r = row("NeMo 24.07 (Megatron-Core)");
        r.precision = Some("fp8 (fp8_params)".to_string());
        r.zero_or_distributed_optimizer =
            Some("Apex distributed_fused_adam (optim.dtype bf16)".to_string());
        assert_eq!(
            runtime_of(&r, Stack::Nemo).optimizer_states,
            OptimizerStates::Bf16StoredParams
        );
    }

    /// The optimizer a row's recipe names: Apex's `distributed_fused_adam` keeps 16-bit master
    /// remainders, or bf16 states with `optim.dtype bf16` (and a bf16 weight copy with
    /// `store_params`; an fp32 optimizer storing its weights keeps a whole fp32 master); the
    /// distributed optimizer and unnamed ones fp32 master weights and moments.
    #[test]
    fn optimizer_states_follow_the_recipe() {
        for (text, states) in [
            (
                "apex distributed_fused_adam (nemo 1.x launcher config; fp32 optimizer dtype)",
                OptimizerStates::Fp32Remainders,
            ),
            (
                "apex distributed_fused_adam (optim.dtype bf16, grad_sync_dtype bf16)",
                OptimizerStates::Bf16,
            ),
            (
                "apex distributed_fused_adam (optim.dtype bf16, grad_sync_dtype bf16; fp8_params: store_params)",
                OptimizerStates::Bf16StoredParams,
            ),
            (
                "apex distributed_fused_adam (fp32 optimizer dtype; store_params)",
                OptimizerStates::Fp32,
            ),
            ("distributed optimizer", OptimizerStates::Fp32),
            ("", OptimizerStates::Fp32),
        ] {
            assert_eq!(optimizer_states_of(text), states, "{text}");
        }
    }

    /// The dispatcher a row names wins; a Megatron-Bridge run uses the flex dispatcher its
    /// recipes select, but for its token-drop runs; NeMo 2's recipes (dgxc-benchmarking) and
    /// unnamed stacks the all-to-all.
    /// The ModelZoo's "+1f1b overlap" turns the all-to-all overlap on.
    #[test]
    fn dispatchers_and_overlap() {
        let with = |framework: &str, extra: &str| {
            let text = format!(
                r#"[{{"id": "r", "kind": "end_to_end_training_throughput", "source_group": "g",
                     "framework": "{framework}"{extra}}}]"#
            );
            crate::rows::parse_rows(&text, "test").unwrap().remove(0)
        };
        let mbridge = "NeMo 26.02 container (Megatron-Bridge on Megatron-Core)";
        assert!(dedup_dispatcher(&row(mbridge)));
        assert!(!dedup_dispatcher(&row(
            "NeMo 2 / Megatron-Core (dgxc-benchmarking)"
        )));
        let core = "Megatron-Core moe_dev";
        assert!(dedup_dispatcher(&with(
            core,
            r#", "token_dispatcher": "DeepEP""#
        )));
        assert!(!dedup_dispatcher(&with(
            core,
            r#", "token_dispatcher": "A2A""#
        )));
        assert!(!dedup_dispatcher(&with(
            mbridge,
            r#", "token_dispatcher": "AlltoAll (NCCL)""#
        )));
        // the 25.09 tables' "(tokendrop)" runs pad each expert to its capacity: `alltoall`
        let tokendrop = r#", "num_experts": 128, "routing": "token-drop""#;
        assert!(!dedup_dispatcher(&with(mbridge, tokendrop)));
        let dropless = r#", "num_experts": 128, "routing": "forced-balanced""#;
        assert!(dedup_dispatcher(&with(mbridge, dropless)));
        // and they replay the iteration from a CUDA graph: the host never binds
        assert!(!runtime_of(&with(mbridge, tokendrop), Stack::Nemo).expert_host_launches);
        assert!(runtime_of(&with(mbridge, dropless), Stack::Nemo).expert_host_launches);
        assert!(dedup_dispatcher(&with(
            core,
            r#", "notes": "HybridEP on NVL72""#
        )));
        let overlap = with(core, r#", "notes": "step 17.6 s, +1f1b overlap""#);
        let r = runtime_of(&overlap, Stack::MegatronCore);
        assert!(r.ep_a2a_overlap && !r.ep_dispatch_dedup);
        assert!(!runtime_of(&row(core), Stack::MegatronCore).ep_a2a_overlap);
    }

    /// torchtitan's 2024-12 table lists "Techniques: FSDP" (eager) beside "FSDP +
    /// torch.compile"; rows that list nothing ran its benchmark commands, compiled.
    #[test]
    fn torchtitan_rows_say_when_they_ran_eager() {
        let with = |notes: &str| {
            let text = format!(
                r#"[{{"id": "r", "kind": "end_to_end_training_throughput", "source_group": "g",
                     "framework": "torchtitan (FSDP2/DTensor)", "notes": "{notes}"}}]"#
            );
            crate::rows::parse_rows(&text, "test").unwrap().remove(0)
        };
        let eager = with("Read at iteration 90. Techniques: FSDP. seq_length 8192");
        let compiled = with("Techniques: FSDP + torch.compile. batch 2");
        assert!(ran_eager(&eager) && !ran_eager(&compiled));
        assert!(!ran_eager(&with("vanillaTP, quantization bf16")));
        assert!(!runtime_of(&eager, Stack::Torchtitan).fused_elementwise);
        assert!(runtime_of(&compiled, Stack::Torchtitan).fused_elementwise);
        assert!(runtime_of(&eager, Stack::MegatronCore).fused_elementwise);
        // torchtitan compiles the loss from April 2025 on, with the blocks
        let dated = |source: &str, notes: &str| {
            let text = format!(
                r#"[{{"id": "r", "kind": "end_to_end_training_throughput", "source_group": "g",
                     "framework": "torchtitan", "source": "{source}", "notes": "{notes}"}}]"#
            );
            crate::rows::parse_rows(&text, "test").unwrap().remove(0)
        };
        let old = dated(
            "benchmarks/llama3_h100_202412_torchtitan.md (torchtitan 9dec370, 2024-12)",
            "",
        );
        let new = dated("benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md", "");
        let dashed = dated(
            "benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md (torchtitan 820504)",
            "",
        );
        let eager_new = dated("benchmarks/x_2025-06.md", "Techniques: FSDP. batch 2");
        assert_eq!(source_month(&old), Some((2024, 12)));
        assert_eq!(source_month(&new), Some((2025, 6)));
        assert_eq!(source_month(&dashed), Some((2025, 6)));
        assert_eq!(source_month(&dated("a 820504 b", "")), None);
        assert_eq!(source_month(&dated("run 202513.md", "")), None);
        assert!(!runtime_of(&old, Stack::Torchtitan).compiled_loss);
        assert!(runtime_of(&new, Stack::Torchtitan).compiled_loss);
        assert!(runtime_of(&dashed, Stack::Torchtitan).compiled_loss);
        assert!(!runtime_of(&eager_new, Stack::Torchtitan).compiled_loss);
        assert!(!runtime_of(&new, Stack::MegatronCore).compiled_loss);
        let mut automodel = with("NeMo AutoModel 2025-06");
        automodel.framework = Some("NeMo AutoModel (PyTorch FSDP2)".into());
        automodel.source = Some(serde_json::Value::String("docs/perf_2025-06.md".into()));
        assert!(!runtime_of(&automodel, Stack::Torchtitan).compiled_loss);
        // separate wq, wk, wv until April 2026, one wqkv GEMM from then (torchtitan PR #2878)
        let fused = dated("benchmarks/llama3_h100_2026-05_torchtitan.md", "");
        for (r, want) in [
            (&old, SelectiveRecompute::EveryOtherMatmul),
            (&new, SelectiveRecompute::EveryOtherMatmul),
            (&automodel, SelectiveRecompute::EveryOtherMatmul),
            (
                &dated("benchmarks/undated.md", ""),
                SelectiveRecompute::EveryOtherMatmul,
            ),
            (&fused, SelectiveRecompute::EveryOtherMatmulFusedQkv),
        ] {
            assert_eq!(runtime_of(r, Stack::Torchtitan).selective, want);
        }
        assert_eq!(
            Stack::Torchtitan.runtime().selective,
            SelectiveRecompute::EveryOtherMatmulFusedQkv
        );
        // torchtitan's SDPA is FlashAttention-2; NeMo AutoModel's TE layers are not
        use autopp_models::AttentionKernel;
        assert_eq!(
            runtime_of(&eager, Stack::Torchtitan).attention_kernel,
            AttentionKernel::Fa2
        );
        let auto = row("NeMo AutoModel (PyTorch FSDP2 + TE + DeepEP)");
        assert_eq!(
            runtime_of(&auto, stack_of(&auto).0).attention_kernel,
            AttentionKernel::Native
        );
    }

    #[test]
    fn model_names_find_presets() {
        assert_eq!(
            preset_named("LLAMA3-70B").map(|p| p.name),
            Some("llama3-70b")
        );
        assert_eq!(
            preset_named("Llama 3.1 8B").map(|p| p.name),
            Some("llama3-8b")
        );
        assert_eq!(preset_named("GPT3-175B").map(|p| p.name), Some("gpt3-175b"));
        assert_eq!(
            preset_named("LLAMA2-70B").map(|p| p.name),
            Some("llama2-70b")
        );
        // NeMo 24.07's performance summary names these (the rows of the calibration file)
        for (row, preset) in [
            ("GPT3-5B", "gpt3-5b"),
            ("GPT3-20B", "gpt3-20b"),
            ("LLAMA2-7B", "llama2-7b"),
            ("LLAMA2-13B", "llama2-13b"),
            ("Nemotron-8B", "nemotron3-8b"),
            ("Nemotron-22B", "nemotron3-22b"),
            ("Nemotron-340B", "nemotron4-340b"),
        ] {
            assert_eq!(preset_named(row).map(|p| p.name), Some(preset), "{row}");
        }
        assert!(preset_named("Nemotron-15B").is_none());
    }

    /// BigScience's tr11 benchmarks ran with `CUDA_LAUNCH_BLOCKING=1`: host-serialized; the
    /// same stack's other runs, and other stacks, keep a host that runs ahead.
    #[test]
    fn bigscience_runs_wait_on_every_launch() {
        let with_source = |source: &str| {
            let text = format!(
                r#"[{{"id": "r", "kind": "end_to_end_training_throughput", "source_group": "g",
                     "framework": "Megatron-DeepSpeed (BigScience fork) + DeepSpeed",
                     "source": "{source}"}}]"#
            );
            crate::rows::parse_rows(&text, "test").unwrap().remove(0)
        };
        let tr11 = with_source(
            "bigscience-workshop/bigscience train/tr11-176B-ml/chronicles-prequel.md (commit 59a90eec97)",
        );
        assert!(bigscience_launch_blocking(&tr11));
        assert!(runtime_of(&tr11, Stack::MegatronDeepspeed).host_serialized);
        let other = with_source("microsoft/Megatron-DeepSpeed examples");
        assert!(!runtime_of(&other, Stack::MegatronDeepspeed).host_serialized);
        assert!(!runtime_of(&row("Megatron-DeepSpeed"), Stack::MegatronDeepspeed).host_serialized);
        for stack in Stack::ALL {
            assert!(!stack.runtime().host_serialized, "{stack}");
        }
    }
}
