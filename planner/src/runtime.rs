//! Framework runtimes as data: which software stack runs a plan, with the version where its
//! behaviour changed, and the time and memory facts of that stack ([`Runtime`]).
//!
//! `--framework` names a stack; its [`Stack::family`] fixes what the search may try
//! ([`Framework`]) and [`Stack::runtime`] how each candidate runs. `validate` maps every
//! published row's `framework` to a stack the same way, so that a row's predictions use the
//! facts of the software that produced it.
//!
//! Sources of the facts (each stack's arm quotes the flag or default it encodes):
//! Megatron-LM `megatron/training/arguments.py` and `docs/source/api-guide/dist_optimizer.md`
//! (Megatron-Core 0.13), NeMo 2.0 performance recipes (`nemo/collections/llm/recipes/*`,
//! `tp_comm_overlap=True`), torchtitan `docs/fsdp.md` and `docs/float8.md`, DeepSpeed's pipeline
//! engine (`deepspeed/runtime/pipe/engine.py`), and `../shared/reference/megatron-lm.md`,
//! `torchtitan-deepspeed.md`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use autopp_hardware::{Cluster, Link};
use autopp_models::{AttentionKernel, Model};

use crate::config::Runtime;
use crate::framework::Framework;

/// A software stack (framework and version) a plan runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stack {
    /// No framework named: the best plan that some framework runs, each framework searched
    /// with its own stack (`search::plans`). As a runtime of its own (what-if sweeps, `estimate`):
    /// the modern defaults, every overlap on.
    #[default]
    Any,
    /// Everything autopp models, features of different frameworks mixed in one plan (per-rank
    /// partial recompute, ZeRO 2 beside a pipeline with 1F1B, …), with every overlap on: plans
    /// no single framework may run. Opt-in (`--framework any-mix`).
    AnyMix,
    /// Megatron-Core (0.13, 2025) as its examples run it: distributed optimizer with
    /// `--overlap-grad-reduce --overlap-param-gather`, no `--tp-comm-overlap`.
    MegatronCore,
    /// Megatron-Core with `--overlap-moe-expert-parallel-comm` (0.16.1: the combined-1F1B
    /// path): Megatron-Core's runtime with the expert all-to-alls of one micro-batch hidden
    /// behind another's compute in the steady 1F1B phase.
    MegatronCoreEpOverlap,
    /// Megatron-LM as of 2021 (Narayanan et al.): fp16 gradients reduced in 16 bits after the
    /// pipeline flush, no overlap.
    MegatronLm2021,
    /// NeMo (24.07 and 2.0) on Megatron-Core: Megatron-Core plus the userbuffers tensor-parallel
    /// overlap its performance recipes turn on (`tp_comm_overlap=True`).
    Nemo,
    /// torchtitan (2025): FSDP2 with prefetched all-gathers and overlapped reduce-scatters,
    /// whole activations between pipeline stages, no vocabulary padding.
    Torchtitan,
    /// DeepSpeed's pipeline engine (0.16): whole activations sent synchronously, gradients
    /// reduced after the flush.
    Deepspeed,
    /// BigScience's Megatron-DeepSpeed (2022): DeepSpeed's pipeline engine with Megatron's
    /// layers, fp16 ZeRO-1 optimizer with 16-bit gradients.
    MegatronDeepspeed,
    /// MosaicML Composer / llm-foundry (2023): PyTorch FSDP (ZeRO-3) with prefetch and
    /// FlashAttention.
    Composer,
}

impl Stack {
    /// Every stack, in the order they are documented.
    pub const ALL: [Stack; 10] = [
        Stack::Any,
        Stack::AnyMix,
        Stack::MegatronCore,
        Stack::MegatronCoreEpOverlap,
        Stack::MegatronLm2021,
        Stack::Nemo,
        Stack::Torchtitan,
        Stack::Deepspeed,
        Stack::MegatronDeepspeed,
        Stack::Composer,
    ];

    /// The name used on the command line and in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Stack::Any => "any",
            Stack::AnyMix => "any-mix",
            Stack::MegatronCore => "megatron-core",
            Stack::MegatronCoreEpOverlap => "megatron-core-ep-overlap",
            Stack::MegatronLm2021 => "megatron-lm-2021",
            Stack::Nemo => "nemo",
            Stack::Torchtitan => "torchtitan",
            Stack::Deepspeed => "deepspeed",
            Stack::MegatronDeepspeed => "megatron-deepspeed",
            Stack::Composer => "composer",
        }
    }

    /// The framework whose search space the stack has: NeMo and every Megatron-LM version run
    /// Megatron's schedules; Megatron-DeepSpeed runs DeepSpeed's pipeline engine; Composer has
    /// no pipeline of its own and is not restricted.
    pub fn family(self) -> Framework {
        match self {
            Stack::Any | Stack::AnyMix | Stack::Composer => Framework::Any,
            Stack::MegatronCore
            | Stack::MegatronCoreEpOverlap
            | Stack::MegatronLm2021
            | Stack::Nemo => Framework::Megatron,
            Stack::Torchtitan => Framework::Torchtitan,
            Stack::Deepspeed | Stack::MegatronDeepspeed => Framework::Deepspeed,
        }
    }

    /// The stack's time and memory facts.
    pub fn runtime(self) -> Runtime {
        let modern = Runtime {
            stack: self,
            overlap_grad_reduce: true,
            overlap_param_gather: true,
            tp_comm_overlap: false,
            fp32_main_grads: true,
            pp_scatter_gather: true,
            pp_blocking_sends: false,
            ep_a2a_overlap: false,
            ep_dispatch_dedup: false,
            expert_host_launches: true,
            host_serialized: false,
            vocab_pad_multiple: 128,
            multi_rail_rings: true,
            selective: SelectiveRecompute::AttentionCore,
            recompute_modules: autopp_models::RecomputeModules::default(),
            attention_kernel: AttentionKernel::Native,
            fused_elementwise: true,
            tp_collectives: TpCollectives::Megatron,
            optimizer_states: OptimizerStates::Fp32,
            fp8_params: false,
            compiled_loss: false,
        };
        match self {
            // every overlap any framework offers, but the expert all-to-all overlap (opt-in in
            // Megatron-Core, and it forbids full recompute: kept as before it was modelled)
            Stack::Any | Stack::AnyMix => Runtime {
                tp_comm_overlap: true,
                ..modern
            },
            // `--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather`
            // (Megatron-Core's dist_optimizer guide); `--tp-comm-overlap` is opt-in.
            Stack::MegatronCore => modern,
            // `--overlap-moe-expert-parallel-comm` (Megatron-Core 0.16.1
            // `model_parallel_config.py`, default False): the expert all-to-alls of one
            // micro-batch overlap another's compute in the steady 1F1B phase.
            Stack::MegatronCoreEpOverlap => Runtime {
                ep_a2a_overlap: true,
                ..modern
            },
            // NeMo's performance recipes set `tp_comm_overlap=True` (userbuffers overlap of
            // the tensor-parallel all-gather/reduce-scatter with the GEMMs) and reduce the
            // gradients in bf16 (`+training.model.optim.grad_sync_dtype=bf16` in every H100
            // example of NeMo-Framework-Launcher, e.g. `examples/training/gpt/h100/
            // 175b_fp8_16node.sh`): a 16-bit gradient buffer, the distributed optimizer's fp32
            // copy of its shard.
            Stack::Nemo => Runtime {
                tp_comm_overlap: true,
                fp32_main_grads: false,
                ..modern
            },
            // PyTorch or local DDP of 2021 reduced fp16 gradients after the flush (the row
            // mapping turns the overlap on for `DDP impl 'torch'`). Collectives across nodes
            // ran at one NIC per GPU: the ZeRO-3 runs of Narayanan et al. 2021 (Table 2) take
            // 66.75 s for 174.6B on both 768 and 1536 A100s, about 1.2 TB of fp16 gathers and
            // reduce-scatters per GPU at one 200 Gb/s HDR NIC's rate; the node's eight rails
            // would have made them 8× faster and the runs compute-bound.
            Stack::MegatronLm2021 => Runtime {
                overlap_grad_reduce: false,
                overlap_param_gather: false,
                fp32_main_grads: false,
                multi_rail_rings: false,
                ..modern
            },
            // FSDP2: reduce-scatter in fp32 during the backward, all-gathers prefetched one
            // layer ahead; async TP is opt-in (`enable_async_tensor_parallel`); pipeline
            // stages send whole activations; the vocabulary is not padded; `selective` is its
            // per-op checkpointing, on the fused `wqkv` of today's torchtitan (the row
            // mapping gives published runs of before April 2026 the separate projections).
            // Attention is PyTorch's `scaled_dot_product_attention`
            // (torchtitan `models/llama/model.py`, `F.scaled_dot_product_attention`; context
            // parallel runs it per ring step), whose flash backend on H100 is
            // FlashAttention-2 (PyTorch 2.2 release notes: "FlashAttention-2 ... for
            // scaled_dot_product_attention"), not a Hopper kernel. Element-wise ops are
            // fused: torchtitan's published benchmarks run `--training.compile` (the
            // mapping of a published row turns it off where the source ran eager).
            // Its tensor parallelism is PyTorch DTensor's parallel styles
            // (`ColwiseParallel`, `RowwiseParallel`, `SequenceParallel`; torchtitan
            // `models/llama3/infra/parallelize.py`, `apply_tp`).
            // Its MoE experts run `torch._grouped_mm`, one kernel for every local expert
            // (torchtitan's `GroupedExperts`, `_run_experts_grouped_mm`): no per-expert host
            // work.
            Stack::Torchtitan => Runtime {
                expert_host_launches: false,
                tp_collectives: TpCollectives::Dtensor,
                pp_scatter_gather: false,
                vocab_pad_multiple: 1,
                selective: SelectiveRecompute::EveryOtherMatmulFusedQkv,
                attention_kernel: AttentionKernel::Fa2,
                ..modern
            },
            // The pipeline engine reduces after the flush and sends whole activations
            // synchronously (`engine.py`: `_exec_send_activations` blocks).
            Stack::Deepspeed => Runtime {
                overlap_grad_reduce: false,
                overlap_param_gather: false,
                pp_scatter_gather: false,
                pp_blocking_sends: true,
                ..modern
            },
            // DeepSpeed's pipeline engine and its fp16 ZeRO-1 optimizer (16-bit gradients,
            // an fp32 copy for the optimizer).
            Stack::MegatronDeepspeed => Runtime {
                fp32_main_grads: false,
                ..Stack::Deepspeed.runtime()
            },
            // PyTorch FSDP: backward prefetch and overlapped reduce-scatter; llm-foundry's
            // attention (`attn_impl: flash` or `triton`) is FlashAttention-2 or OpenAI's
            // Triton flash kernel, both written for Ampere.
            Stack::Composer => Runtime {
                attention_kernel: AttentionKernel::Fa2,
                ..modern
            },
        }
        .named(self)
    }
}

impl Runtime {
    /// These facts, recorded as `stack`'s.
    fn named(self, stack: Stack) -> Runtime {
        Runtime { stack, ..self }
    }

    /// torchtitan's transformer blocks run under `torch.compile`: the torchtitan stack with
    /// fused element-wise kernels ([`Runtime::fused_elementwise`]; its benchmarks and `autopp
    /// launch` compile the model, eager rows say so). The scan and the evaluation both read it,
    /// so their memory agrees ([`crate::stages::op_sac_bytes`]).
    pub fn torch_compiled(&self) -> bool {
        self.stack == Stack::Torchtitan && self.fused_elementwise
    }

    /// The link the ring collectives of a group of `size` GPUs `stride` apart run over: over
    /// the node's rails ([`Cluster::ring_link`]) where [`Runtime::multi_rail_rings`], else one
    /// NIC per GPU ([`Cluster::group_link`]).
    pub fn ring_link(&self, cluster: &Cluster, size: u64, stride: u64) -> Link {
        if self.multi_rail_rings {
            cluster.ring_link(size, stride)
        } else {
            cluster.group_link(size, stride)
        }
    }
}

/// What the optimizer keeps per parameter beside the 16-bit weights and the gradients (ZeRO
/// shards it from stage 1 on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OptimizerStates {
    /// fp32 master weights and Adam's two fp32 moments, 12 B/param: Megatron-Core's
    /// distributed optimizer, DeepSpeed's ZeRO, PyTorch's AdamW over fp32 FSDP shards.
    #[default]
    Fp32,
    /// Apex's `DistributedFusedAdam` as NeMo 1.x runs it under bf16 O2 with an fp32 optimizer
    /// (`optim.name: distributed_fused_adam`, the optimizer of NeMo-Framework-Launcher's
    /// training configs): `store_params=False, store_param_remainders=True`
    /// (`megatron_base_model.py` `setup_optimization`), so the fp32 master weight is the bf16
    /// weight plus a 16-bit remainder shard, beside fp32 `exp_avg` and `exp_avg_sq`:
    /// 2 + 4 + 4 = 10 B/param.
    Fp32Remainders,
    /// The same optimizer with `optim.dtype: bf16`: optimizer dtype equal to the model's, so
    /// no master copy (`store_params=False`; the bf16 weights are updated in place) and the
    /// two Adam moments in bf16: 4 B/param.
    Bf16,
    /// `optim.dtype: bf16` with FP8 parameters (`fp8_params`): NeMo sets `store_params=True`
    /// (`megatron_base_model.py`), so the optimizer keeps its own bf16 copy of the weights —
    /// the model holds only FP8 ones — beside the two bf16 moments: 6 B/param.
    Bf16StoredParams,
}

impl OptimizerStates {
    /// Bytes per parameter of the states, before sharding.
    pub fn bytes_per_param(self) -> u64 {
        match self {
            OptimizerStates::Fp32 => crate::memory::OPTIMIZER_BYTES_PER_PARAM,
            OptimizerStates::Fp32Remainders => 10,
            OptimizerStates::Bf16 => 4,
            OptimizerStates::Bf16StoredParams => 6,
        }
    }

    /// Whether these are the default states (plan files leave them out).
    pub fn is_default(&self) -> bool {
        *self == OptimizerStates::Fp32
    }
}

/// What a stack's `selective` activation checkpointing recomputes in the backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SelectiveRecompute {
    /// Megatron's `--recompute-granularity selective`: the attention core (Korthikanti et al.
    /// 2022, §5), the model's own selective-recompute ops.
    #[default]
    AttentionCore,
    /// torchtitan's per-op selective checkpointing (`selective_ac_option = "op"`, the default
    /// of its Llama train configs; `torchtitan/distributed/activation_checkpoint.py`): every
    /// op of the save list (matmuls, SDPA, reduce-scatters) is saved "except every second
    /// mm", counted per block in forward order, so the 2nd, 4th and 6th matmuls are re-run
    /// (with the cheap element-wise ops between) and the attention core is not. A block
    /// multiplies `wq, wk, wv` separately (torchtitan until April 2026), so `wk`, `wo` and
    /// `w3` are re-run and `wq`, `wv`, `w1`, `w2` saved: the runs it published in 2024–25.
    EveryOtherMatmul,
    /// The same policy on blocks that project queries, keys and values in one GEMM, `wqkv`
    /// (torchtitan PR #2878, April 2026: `FusedQKVLinear`, `fuse_qkv=True` in every Llama 3 and
    /// Qwen3 flavour of 0.3.0, which `autopp launch` writes for — the separate projections stay
    /// an option there, `fuse_qkv=False` — and the only projection from PR #4546):
    /// the matmuls are `wqkv, wo, w1, w3, w2`, so `wqkv`, `w1` and `w2` are saved — the keys
    /// too, which the separate projections re-ran — and `wo`, `w3` re-run.
    EveryOtherMatmulFusedQkv,
}

impl SelectiveRecompute {
    /// Whether this is torchtitan's per-op checkpointing on blocks with one `wqkv` GEMM.
    pub fn fused_qkv(self) -> bool {
        self == SelectiveRecompute::EveryOtherMatmulFusedQkv
    }
}

/// How a stack's tensor-parallel layers run their collectives: what overlaps them and what
/// they cost besides the transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TpCollectives {
    /// Megatron's layers (`tensor_parallel/layers.py`,
    /// `LinearWithGradAccumulationAndAsyncCommunication`): the backward launches the
    /// input-gradient all-reduce (with sequence parallelism the all-gather and reduce-scatter)
    /// asynchronously and runs the weight-gradient GEMM meanwhile; sequence-parallel
    /// collectives run on the leading (sequence) dimension of `[s, b, h]`, in place.
    #[default]
    Megatron,
    /// PyTorch DTensor's parallel styles (torchtitan's tensor parallelism). Three facts:
    /// - each collective is waited on where its output is first used (functional
    ///   collectives), and in the backward that is the very next op: the reduce-scatter of
    ///   the input gradient follows the sum of the block's input-gradient GEMMs, which run
    ///   after their weight gradients, and the all-gather of an output gradient feeds the
    ///   GEMM that needs it. Nothing hides them unless async TP is on.
    ///   Async TP (`enable_async_tensor_parallel`, Inductor's micro-pipeline pass) fuses
    ///   the forward's all-gather→matmul and matmul→reduce-scatter pairs and leaves the
    ///   backward as it was: there the reduce-scatters take the sum of several matmuls, a
    ///   pattern it does not match (PyTorch PR #149946: valid matmul-reduce-scatter
    ///   patterns "only ... in the forward graph, but not in the backward graph"), and its
    ///   announcement measured "~29% forward pass speedup and ~8% E2E speedup" on Llama3
    ///   8B (PyTorch forum, "Introducing Async Tensor Parallelism in PyTorch", 2024).
    /// - activations are `[b, s, h]` and sequence parallelism shards dimension 1, so every
    ///   all-gather and reduce-scatter, which work on dimension 0, adds an `aten.cat` that
    ///   copies the whole tensor (torchtitan PR #437, "incurs an extra `aten.cat` after each
    ///   collective"; on H100 at sequence 8192 the two cats of an FFN take 6% of its compute).
    /// - torchtitan's per-op selective checkpointing saves the reduce-scatters' outputs but
    ///   not the all-gathers' (`_op_sac_save_list` lists
    ///   `_c10d_functional.reduce_scatter_tensor`, no all-gather), and the backward needs the
    ///   gathered inputs of the column-parallel GEMMs for their weight gradients: both
    ///   all-gathers of a block run again in the backward.
    Dtensor,
}

/// The share of a transformer block's forward linear FLOPs that torchtitan's per-op
/// checkpointing runs again (every second matmul of the block, [`SelectiveRecompute`]).
/// Separate projections (`fused_qkv` false): a Llama block multiplies `wq, wk, wv, wo` and then
/// `w1, w3, w2` (SwiGLU: `w2(silu(w1(x)) · w3(x))`), so `wk`, `wo` and `w3` are recomputed:
/// `(g·d + a·d + f) / (2·a·d + 2·g·d + 3·f)` per unit of `h` (`d` the head size, `a` the query
/// and `g` the key/value heads); a plain MLP (`w1, w2`) re-runs `w2` instead, the same `f`.
/// Llama 3 8B: `(1024 + 4096 + 14336) / (4096 + 2048 + 4096 + 43008)` = 0.3654. One `wqkv`
/// GEMM (`fused_qkv`): the matmuls are `wqkv, wo, w1, w3, w2` (plain MLP `wqkv, wo, w1, w2`),
/// so `wo` and `w3` (`w2`) are recomputed, `(a·d + f) / …`: Llama 3 8B
/// `(4096 + 14336) / 53248` = 0.3462. 0 for models given as layer lists (no blocks to count).
pub fn every_other_matmul_share(model: &Model, fused_qkv: bool) -> f64 {
    let Model::Transformer(t) = model else {
        return 0.0;
    };
    let d = t.head_dim() as f64;
    let (a, g, f) = (
        t.num_attention_heads as f64,
        t.kv_heads() as f64,
        t.ffn() as f64,
    );
    let mlp = if t.gated_mlp { 3.0 * f } else { 2.0 * f };
    let keys = if fused_qkv { 0.0 } else { g * d };
    (keys + a * d + f) / (2.0 * a * d + 2.0 * g * d + mlp)
}

impl FromStr for Stack {
    type Err = String;

    /// A stack by name; `megatron` is Megatron-Core, today's Megatron-LM.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim().to_ascii_lowercase();
        if wanted == "megatron" || wanted == "megatron-lm" {
            return Ok(Stack::MegatronCore);
        }
        Stack::ALL
            .into_iter()
            .find(|f| f.as_str() == wanted)
            .ok_or_else(|| {
                let names: Vec<&str> = Stack::ALL.iter().map(|s| s.as_str()).collect();
                format!(
                    "unknown framework `{s}`; valid frameworks are: megatron, {}",
                    names.join(", ")
                )
            })
    }
}

impl fmt::Display for Stack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_megatron_is_megatron_core() {
        for s in Stack::ALL {
            assert_eq!(s.as_str().parse::<Stack>(), Ok(s));
            assert_eq!(s.runtime().stack, s);
        }
        assert_eq!("Megatron".parse::<Stack>(), Ok(Stack::MegatronCore));
        assert!("pytorch".parse::<Stack>().is_err());
        assert_eq!(Stack::Nemo.family(), Framework::Megatron);
        assert_eq!(Stack::MegatronDeepspeed.family(), Framework::Deepspeed);
    }

    /// The facts each stack is documented with (module doc, sources there).
    #[test]
    fn facts_of_each_stack() {
        let any = Stack::Any.runtime();
        assert!(any.overlap_grad_reduce && any.overlap_param_gather && any.tp_comm_overlap);
        let core = Stack::MegatronCore.runtime();
        assert!(core.overlap_grad_reduce && core.overlap_param_gather && !core.tp_comm_overlap);
        assert!(core.fp32_main_grads && core.pp_scatter_gather);
        assert!(Stack::Nemo.runtime().tp_comm_overlap);
        assert!(!Stack::Nemo.runtime().fp32_main_grads);
        // the expert all-to-all overlap is opt-in: only its own stack has it
        for s in Stack::ALL {
            let on = s == Stack::MegatronCoreEpOverlap;
            assert_eq!(s.runtime().ep_a2a_overlap, on, "{s}");
        }
        assert_eq!(Stack::MegatronCoreEpOverlap.family(), Framework::Megatron);
        let old = Stack::MegatronLm2021.runtime();
        assert!(!old.overlap_grad_reduce && !old.fp32_main_grads && !old.multi_rail_rings);
        // every other stack's rings use the node's rails
        for s in Stack::ALL {
            assert_eq!(
                s.runtime().multi_rail_rings,
                s != Stack::MegatronLm2021,
                "{s}"
            );
        }
        let titan = Stack::Torchtitan.runtime();
        assert!(titan.overlap_grad_reduce && !titan.pp_scatter_gather);
        assert_eq!(
            titan.selective,
            SelectiveRecompute::EveryOtherMatmulFusedQkv
        );
        assert_eq!(core.selective, SelectiveRecompute::AttentionCore);
        assert_eq!(titan.vocab_pad_multiple, 1);
        // SDPA's and llm-foundry's FlashAttention-2; Transformer Engine's cuDNN kernel elsewhere
        for s in Stack::ALL {
            let fa2 = matches!(s, Stack::Torchtitan | Stack::Composer);
            let want = if fa2 {
                AttentionKernel::Fa2
            } else {
                AttentionKernel::Native
            };
            assert_eq!(s.runtime().attention_kernel, want, "{s}");
            // fused element-wise kernels (TE/Megatron, torchtitan's compiled benchmarks)
            assert!(s.runtime().fused_elementwise, "{s}");
        }
        let ds = Stack::MegatronDeepspeed.runtime();
        assert!(ds.pp_blocking_sends && !ds.fp32_main_grads && !ds.overlap_grad_reduce);
        assert_eq!(ds.stack, Stack::MegatronDeepspeed);
    }

    /// `every_other_matmul_share`'s hand-worked Llama 3 8B figure (h 4096, 32 heads of 128,
    /// 8 key/value heads, SwiGLU f 14336): wk 1024 + wo 4096 + w3 14336 = 19456 of
    /// 4096 + 1024 + 1024 + 4096 + 3 · 14336 = 53248 columns, 0.36538.
    #[test]
    fn torchtitan_op_sac_reruns_wk_wo_and_w3() {
        let m = autopp_models::load("llama3-8b").unwrap();
        let share = every_other_matmul_share(&m, false);
        assert!((share - 19456.0 / 53248.0).abs() < 1e-12, "{share}");
        // one wqkv GEMM: wo 4096 + w3 14336 = 18432 of the same 53248
        let fused = every_other_matmul_share(&m, true);
        assert!((fused - 18432.0 / 53248.0).abs() < 1e-12, "{fused}");
        // a plain MLP (GPT-3 175B: 96 heads of 128, f 4h = 49152): separate projections re-run
        // wk, wo, w2 = 12288 + 12288 + 49152, one wqkv GEMM wo and w2 = 61440, of 2·12288 +
        // 2·12288 + 2·49152 = 147456 columns
        let gpt = autopp_models::load("gpt3-175b").unwrap();
        let plain = every_other_matmul_share(&gpt, false);
        assert!((plain - 73728.0 / 147456.0).abs() < 1e-12, "{plain}");
        let plain_fused = every_other_matmul_share(&gpt, true);
        assert!(
            (plain_fused - 61440.0 / 147456.0).abs() < 1e-12,
            "{plain_fused}"
        );
    }

    /// A published recipe's FP8 parameters and bf16 states with a weight copy travel through a
    /// plan file's runtime and back; the defaults are left out, so older files read them.
    #[test]
    fn fp8_params_and_stored_bf16_states_round_trip() {
        let r = Runtime {
            fp8_params: true,
            optimizer_states: OptimizerStates::Bf16StoredParams,
            ..Stack::Nemo.runtime()
        };
        let text = serde_json::to_string(&r).unwrap();
        assert!(text.contains(r#""fp8_params":true"#), "{text}");
        assert!(
            text.contains(r#""optimizer_states":"bf16-stored-params""#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<Runtime>(&text).unwrap(), r);
        let plain = serde_json::to_string(&Stack::Nemo.runtime()).unwrap();
        assert!(!plain.contains("fp8_params") && !plain.contains("optimizer_states"));
        assert_eq!(
            serde_json::from_str::<Runtime>(&plain).unwrap(),
            Stack::Nemo.runtime()
        );
    }
}
