//! A full parallel configuration and the errors that reject impossible ones.

use crate::experts::ExpertParallel;
use autopp_hardware::{HardwareError, Precision};
use autopp_models::{ModelError, Recompute};
use serde::{Deserialize, Serialize};

use crate::degrees::Degrees;
use crate::runtime::Stack;
use crate::schedule::{ScheduleError, ScheduleKind, SplitError};

/// Default headroom kept free per GPU, in bytes (1 GiB), on top of the modelled CUDA context,
/// NCCL, framework buffers and allocator fragmentation (`memory::CONTEXT_BYTES`,
/// `memory::FRAGMENTATION`).
pub const DEFAULT_MEMORY_RESERVE_BYTES: u64 = 1 << 30;

/// The largest memory reserve or margin a request or plan file may set, bytes (1 PiB): far
/// above any GPU's memory, and far below what a sum of a rank's bytes can hold.
pub const MAX_MEMORY_SETTING_BYTES: u64 = 1 << 50;

/// Everything that fixes how one iteration runs: degrees, batching, schedule, recompute,
/// sharding, optionally the layer split, and the settings it is evaluated under. Built with
/// [`ParallelConfig::new`] and the `with_*` methods.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParallelConfig {
    /// Tensor, pipeline, data and context parallelism and stages per rank.
    #[serde(flatten)]
    pub degrees: Degrees,
    /// Sequences per micro-batch (`b`).
    pub micro_batch_size: u64,
    /// Sequences per iteration over all data-parallel replicas (`B`).
    pub global_batch_size: u64,
    /// Pipeline schedule.
    pub schedule: ScheduleKind,
    /// Micro-batch group size of interleaved schedules (Megatron's default: `pp`).
    pub group_size: Option<u64>,
    /// Recompute mode of the transformer layers (those not counted in `recompute_layers`).
    pub recompute: Recompute,
    /// Partial recompute: per stage, in global stage order, how many of its transformer layers
    /// are fully recomputed — the first ones of the stage, as Megatron-LM's
    /// `--recompute-method block --recompute-num-layers N` — while the others use `recompute`.
    /// One entry applies to every stage, capped at the stage's layers (Megatron-LM's meaning).
    /// `None`: every transformer layer uses `recompute`.
    #[serde(default)]
    pub recompute_layers: Option<Vec<u64>>,
    /// Megatron sequence parallelism.
    pub sequence_parallel: bool,
    /// ZeRO stage 0–3 (1 is Megatron's distributed optimizer).
    pub zero_stage: u8,
    /// Explicit split: number of layer-list entries in each stage, in global stage order
    /// (`pp · virtual_stages` entries summing to the model's layer-list length). `None`: the
    /// default (Megatron's even split).
    pub split: Option<Vec<usize>>,
    /// Precision, memory headroom, attention kernel and framework runtime.
    #[serde(flatten)]
    pub settings: EvalSettings,
    /// Expert parallelism of a mixture of experts (default: none).
    #[serde(default, skip_serializing_if = "ExpertParallel::is_default")]
    pub experts: ExpertParallel,
}

/// What a configuration is evaluated under besides its layout: the same for every candidate
/// of a search ([`crate::search::SearchOptions`]) and recorded in plan files
/// ([`crate::planfile::Settings`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EvalSettings {
    /// Math precision.
    pub precision: Precision,
    /// Bytes kept free on every GPU as headroom, beyond the modelled CUDA context, NCCL, framework
    /// buffers and fragmentation.
    pub memory_reserve_bytes: u64,
    /// Bytes the predicted peak must stay below the GPU's memory for a configuration to fit:
    /// the uncertainty of the memory prediction (`plan` uses the memory band of the GPU kind,
    /// [`crate::bands::memory_band`], or `--memory-margin`; 0 elsewhere). Not part of the peak.
    #[serde(default)]
    pub memory_margin_bytes: u64,
    /// A fused attention kernel (FlashAttention).
    pub flash_attention: bool,
    /// How the framework runs data parallelism, tensor-parallel communication and mixed
    /// precision (default: Megatron-Core's runtime).
    #[serde(default)]
    pub runtime: Runtime,
}

impl Default for EvalSettings {
    /// `autopp`'s defaults: bf16, [`DEFAULT_MEMORY_RESERVE_BYTES`] of headroom, FlashAttention,
    /// Megatron-Core's runtime.
    fn default() -> Self {
        EvalSettings {
            precision: Precision::Bf16,
            memory_reserve_bytes: DEFAULT_MEMORY_RESERVE_BYTES,
            memory_margin_bytes: 0,
            flash_attention: true,
            runtime: Runtime::default(),
        }
    }
}

/// Framework behaviour that changes time or memory but not the parallel layout: the facts of
/// one software stack ([`Stack::runtime`]). The default is Megatron-Core's (`--framework
/// megatron`). Plan files written before a field existed read it as `false` (or `any`), the
/// behaviour they were predicted with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Runtime {
    /// The stack these facts are of.
    #[serde(default)]
    pub stack: Stack,
    /// The data-parallel gradient reduction overlaps the last micro-batch's backward (PyTorch
    /// DDP's buckets, FSDP, Megatron's `--overlap-grad-reduce`). ZeRO-3 always overlaps its
    /// parameter gathers and gradient reduce-scatters with compute.
    pub overlap_grad_reduce: bool,
    /// The all-gather of the updated weights after a sharded optimizer step (ZeRO 1–2) overlaps
    /// the next iteration's forward (Megatron's `--overlap-param-gather`, FSDP2's prefetch).
    #[serde(default)]
    pub overlap_param_gather: bool,
    /// Tensor-parallel collectives overlap the GEMMs of the forward and of the whole backward
    /// (Megatron's `--tp-comm-overlap`, torchtitan's async TP). `false`: only the backward's
    /// input-gradient collective overlaps the weight-gradient GEMMs (Megatron's default).
    #[serde(default)]
    pub tp_comm_overlap: bool,
    /// Gradients are kept and reduced in fp32 (Megatron's main gradients: 4 B/param). `false`:
    /// 16-bit gradients (2 B/param) reduced in 16 bits, and an fp32 copy made for the optimizer
    /// (4 B/param more, sharded like the optimizer states) — Megatron-LM 2021 in fp16 and
    /// DeepSpeed's fp16 optimizers.
    pub fp32_main_grads: bool,
    /// Pipeline sends use Megatron's scatter/gather optimisation: each tensor-parallel rank
    /// sends `1/t` of the boundary activation (Narayanan et al. 2021, §4.1). `false`: every rank
    /// sends the whole tensor (DeepSpeed's pipeline engine).
    pub pp_scatter_gather: bool,
    /// A pipeline send holds its sender until it completes (DeepSpeed's pipeline engine sends
    /// synchronously); `false`: sends run beside compute and only delay the receiver.
    pub pp_blocking_sends: bool,
    /// The expert-parallel all-to-alls (dispatch and combine) of one micro-batch run beside the
    /// compute of another in the steady 1F1B phase: Megatron-Core's
    /// `--overlap-moe-expert-parallel-comm` (`ModelParallelConfig.overlap_moe_expert_parallel_comm`,
    /// the combined-1F1B path of `pipeline_parallel/combined_1f1b.py`; in Megatron-Core 0.16.1,
    /// off by default). Where a configuration cannot use it (see
    /// [`crate::experts::a2a_hidden_share`]) the all-to-alls stay exposed. `false`: always
    /// exposed. DualPipe-V's overlap is the schedule's own (its overlapped pairs), not this.
    pub ep_a2a_overlap: bool,
    /// The expert all-to-alls send each token once per destination node, not once per
    /// (token, expert) pair, and forward it inside the node over NVLink: DeepEP's internode
    /// kernels (`deepseek-ai/DeepEP` README; DeepSeek-V3 report, arXiv 2412.19437, §3.2.2) and
    /// Megatron-Core's HybridEP, chosen by `--moe-token-dispatcher-type flex`
    /// (`--moe-flex-dispatcher-backend deepep|hybridep`). `false`: NCCL's all-to-all of every
    /// pair (`--moe-token-dispatcher-type alltoall`, Megatron-Core's default). See
    /// [`crate::experts::node_dedup_share`].
    #[serde(default)]
    pub ep_dispatch_dedup: bool,
    /// The routed experts' grouped GEMMs are issued from the host every micro-batch, one GEMM
    /// per local expert (Transformer Engine's `GroupedLinear` under Megatron-Core), behind the
    /// dropless dispatcher's host sync of each MoE layer: a MoE layer's pass lasts at least
    /// their host time ([`autopp_hardware::AnalyticProfile::expert_host_s`]). `false`: the
    /// host never binds (a single-launch grouped GEMM, or an iteration replayed from a CUDA
    /// graph, which static shapes allow: token drop padded to capacity). Plan files written
    /// before this field read `false`, as they were predicted.
    #[serde(default)]
    pub expert_host_launches: bool,
    /// The GPU waits for the host to issue every kernel (`CUDA_LAUNCH_BLOCKING=1`, which
    /// BigScience's 176B runs needed against hangs): each transformer block's host time
    /// ([`autopp_hardware::analytic::Efficiency::host_block_s`]) adds to its passes instead of
    /// running ahead of the GPU. Plan files written before this field read `false`.
    #[serde(default)]
    pub host_serialized: bool,
    /// The vocabulary is padded to a multiple of this times `tp` (Megatron-LM's
    /// `--make-vocab-size-divisible-by`, 128; 1 for frameworks that do not pad).
    pub vocab_pad_multiple: u64,
    /// Data- and tensor-parallel ring collectives that leave the node spread over the node's
    /// rails, one NIC per group member on the node ([`autopp_hardware::Cluster::ring_link`]).
    /// `false`: each GPU's collectives cross at its own NIC's bandwidth
    /// ([`autopp_hardware::Cluster::group_link`]), as plan files written before this field
    /// were predicted.
    #[serde(default)]
    pub multi_rail_rings: bool,
    /// What `selective` recompute re-runs in the backward.
    #[serde(default)]
    pub selective: crate::runtime::SelectiveRecompute,
    /// Under Megatron's selective recompute ([`crate::runtime::SelectiveRecompute::AttentionCore`]),
    /// the modules recomputed: Megatron-Core's `--recompute-modules`
    /// ([`autopp_models::RecomputeModules`]; default `core_attn`, the attention core). Plan
    /// files written before this field read the default.
    #[serde(
        default,
        skip_serializing_if = "autopp_models::RecomputeModules::is_default"
    )]
    pub recompute_modules: autopp_models::RecomputeModules,
    /// The class of fused attention kernel the stack runs
    /// ([`autopp_models::AttentionKernel`]): on Hopper, FlashAttention-2 (PyTorch SDPA's flash
    /// backend) is slower than Transformer Engine's cuDNN kernel. Plan files written before
    /// this field read it as `native`.
    #[serde(default)]
    pub attention_kernel: autopp_models::AttentionKernel,
    /// Norms, rotary embedding and gated activation run fused (Megatron-Core's and Transformer
    /// Engine's kernels, `torch.compile`); `false`: PyTorch eager, one kernel per op, each
    /// reading and writing the whole tensor ([`autopp_models::ShardSpec::fused_elementwise`]).
    /// Plan files written before this field read Megatron-Core's `true`.
    pub fused_elementwise: bool,
    /// How the stack's tensor-parallel layers run their collectives
    /// ([`crate::runtime::TpCollectives`]). Plan files written before this field read
    /// Megatron's.
    #[serde(default)]
    pub tp_collectives: crate::runtime::TpCollectives,
    /// What the optimizer keeps per parameter ([`crate::runtime::OptimizerStates`]): every
    /// stack's own is fp32 master weights and moments; a published run's recipe may say
    /// otherwise (NeMo 1.x's Apex optimizer). Plan files written before this field read fp32.
    #[serde(
        default,
        skip_serializing_if = "crate::runtime::OptimizerStates::is_default"
    )]
    pub optimizer_states: crate::runtime::OptimizerStates,
    /// Under Transformer Engine's FP8 the blocks' linear weights are FP8 parameters (NeMo's
    /// `fp8_params`: the model built inside `fp8_model_init`, whose modules "hold only FP8
    /// copies" of their weights): the FP8 weight and its cached transpose, 1 B each, replace
    /// the 16-bit weight and the two FP8 copies beside it. Plan files written before this
    /// field, and every stack's own runtime, read `false`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fp8_params: bool,
    /// torchtitan's loss runs under `torch.compile` as well as its blocks: `--training.compile`
    /// compiles the cross-entropy from torchtitan PR #1033 (April 2025, `build_loss_fn`: "the
    /// loss fn builder has only 1 responsibility of compiling the loss fn if
    /// `job_config.training.compile` is set"), later `--compile.components` lists `loss` by
    /// default. Inductor fuses the fp32 cast, log-softmax and NLL and their backward: the head
    /// keeps its 16-bit logits instead of fp32 log-probabilities, and the loss's backward
    /// writes one 16-bit gradient instead of fp32 ones ([`crate::stages::torch_loss_bytes`]).
    /// `autopp launch` compiles the model only (`--compile.components model`), as every
    /// stack's own runtime reads `false`; a published row of a torchtitan that compiled the
    /// loss sets it. Plan files written before this field read `false`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub compiled_loss: bool,
}

impl Default for Runtime {
    /// Megatron-Core's runtime, the default of `--framework megatron`.
    fn default() -> Self {
        Stack::MegatronCore.runtime()
    }
}

impl ParallelConfig {
    /// `degrees` with micro-batches of `micro_batch_size` sequences and `global_batch_size`
    /// sequences per iteration, run with 1F1B, no recompute, no sequence parallelism, ZeRO 0, the
    /// even split and [`EvalSettings::default`]; the `with_*` methods change the rest.
    pub fn new(degrees: Degrees, micro_batch_size: u64, global_batch_size: u64) -> Self {
        ParallelConfig {
            degrees,
            micro_batch_size,
            global_batch_size,
            schedule: ScheduleKind::OneFOneB,
            group_size: None,
            recompute: Recompute::None,
            recompute_layers: None,
            sequence_parallel: false,
            zero_stage: 0,
            split: None,
            settings: EvalSettings::default(),
            experts: ExpertParallel::default(),
        }
    }

    /// With expert parallelism `experts`.
    pub fn with_experts(mut self, experts: ExpertParallel) -> Self {
        self.experts = experts;
        self
    }

    /// With the pipeline schedule `schedule`.
    pub fn with_schedule(mut self, schedule: ScheduleKind) -> Self {
        self.schedule = schedule;
        self
    }

    /// With micro-batch groups of `group_size` in interleaved schedules (`None`: `pp`).
    pub fn with_group_size(mut self, group_size: Option<u64>) -> Self {
        self.group_size = group_size;
        self
    }

    /// With the recompute mode `recompute` for the transformer layers.
    pub fn with_recompute(mut self, recompute: Recompute) -> Self {
        self.recompute = recompute;
        self
    }

    /// With partial recompute's fully recomputed layers per stage (see
    /// [`ParallelConfig::recompute_layers`]).
    pub fn with_recompute_layers(mut self, recompute_layers: Option<Vec<u64>>) -> Self {
        self.recompute_layers = recompute_layers;
        self
    }

    /// With Megatron sequence parallelism on or off.
    pub fn with_sequence_parallel(mut self, sequence_parallel: bool) -> Self {
        self.sequence_parallel = sequence_parallel;
        self
    }

    /// With ZeRO stage `zero_stage`.
    pub fn with_zero_stage(mut self, zero_stage: u8) -> Self {
        self.zero_stage = zero_stage;
        self
    }

    /// With layer-list entries per stage `split` (`None`: the even split).
    pub fn with_split(mut self, split: Option<Vec<usize>>) -> Self {
        self.split = split;
        self
    }

    /// Evaluated under `settings`.
    pub fn with_settings(mut self, settings: EvalSettings) -> Self {
        self.settings = settings;
        self
    }

    /// The schedule and stages per rank when one or both are not given: `interleaved-1f1b`
    /// with more than one stage per rank, else `1f1b`; the schedule's own stage count where it
    /// fixes one (2 for `zb-v` and `dualpipe-v`), else 1.
    pub fn schedule_or_default(
        schedule: Option<ScheduleKind>,
        virtual_stages: Option<u64>,
    ) -> (ScheduleKind, u64) {
        let schedule = schedule.unwrap_or(if virtual_stages.is_some_and(|v| v > 1) {
            ScheduleKind::Interleaved1F1B
        } else {
            ScheduleKind::OneFOneB
        });
        let virtual_stages = virtual_stages.unwrap_or(schedule.default_virtual_stages() as u64);
        (schedule, virtual_stages)
    }

    /// Micro-batches per iteration per data-parallel replica: `B / (d · b)`.
    pub fn num_microbatches(&self) -> u64 {
        self.global_batch_size / (self.degrees.dp * self.micro_batch_size).max(1)
    }
    /// Number of stages: `pp · virtual_stages`.
    pub fn num_stages(&self) -> u64 {
        self.degrees.num_stages()
    }
    /// GPUs used: `tp · pp · dp · cp`.
    pub fn num_gpus(&self) -> u64 {
        self.degrees.num_gpus()
    }
}

/// Why a configuration cannot be evaluated. One line each, naming the flag and the fix.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A flag's value is impossible for this model and cluster.
    #[error("{flag}: {message}")]
    Invalid {
        /// The flag at fault, e.g. `--dp`.
        flag: String,
        /// What is wrong and what would be right.
        message: String,
    },
    /// The model cannot be loaded or sharded.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The cluster or profile cannot be built.
    #[error(transparent)]
    Hardware(#[from] HardwareError),
    /// The layer split cannot be made or used ([`SplitError::field`] names the input).
    #[error(transparent)]
    Split(#[from] SplitError),
    /// The schedule cannot be generated for these inputs ([`ScheduleError::field`] names the
    /// input).
    #[error(transparent)]
    ScheduleSpec(#[from] ScheduleError),
    /// The schedule could not be simulated, or an internal inconsistency.
    #[error("--schedule: {0}")]
    Schedule(String),
    /// No configuration fits in memory; the message says what the leanest one needs.
    #[error("{0}")]
    NothingFits(String),
}

impl PlanError {
    /// A [`PlanError::Invalid`] for `flag`.
    pub fn invalid(flag: &str, message: impl Into<String>) -> Self {
        PlanError::Invalid {
            flag: flag.to_string(),
            message: message.into(),
        }
    }
}
