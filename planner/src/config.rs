//! A full parallel configuration and the errors that reject impossible ones.

use autopp_hardware::{HardwareError, Precision};
use autopp_models::{ModelError, Recompute};
use serde::{Deserialize, Serialize};

use crate::schedule::{ScheduleError, ScheduleKind, SplitError};

/// Default headroom kept free per GPU, in bytes (2 GiB), on top of the modelled CUDA context,
/// NCCL, framework buffers and allocator fragmentation (`memory::CONTEXT_BYTES`,
/// `memory::FRAGMENTATION`).
pub const DEFAULT_MEMORY_RESERVE_BYTES: u64 = 1 << 30;

/// Everything that fixes how one iteration runs: degrees, batching, schedule, recompute,
/// sharding, and optionally the layer split.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParallelConfig {
    /// Tensor-parallel degree (`t`).
    pub tp: u64,
    /// Pipeline ranks (`p`).
    pub pp: u64,
    /// Data-parallel degree (`d`).
    pub dp: u64,
    /// Context-parallel degree.
    pub cp: u64,
    /// Stages per pipeline rank (`v`).
    pub virtual_stages: u64,
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
    /// Math precision.
    pub precision: Precision,
    /// Bytes kept free on every GPU as headroom, beyond the modelled CUDA context, NCCL, framework
    /// buffers and fragmentation.
    pub memory_reserve_bytes: u64,
    /// A fused attention kernel (FlashAttention).
    pub flash_attention: bool,
    /// How the framework runs data parallelism and mixed precision (default: Megatron-LM with
    /// fp32 main gradients and no overlapped gradient reduction).
    #[serde(default)]
    pub runtime: Runtime,
}

/// Framework behaviour that changes time or memory but not the parallel layout. The default is
/// Megatron-LM's: fp32 main gradients, gradient reduction after the backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Runtime {
    /// The data-parallel gradient reduction overlaps the last micro-batch's backward (PyTorch
    /// DDP's buckets, FSDP, Megatron's `--overlap-grad-reduce`). ZeRO-3 always overlaps its
    /// parameter gathers and gradient reduce-scatters with compute.
    pub overlap_grad_reduce: bool,
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
    /// The vocabulary is padded to a multiple of this times `tp` (Megatron-LM's
    /// `--make-vocab-size-divisible-by`, 128; 1 for frameworks that do not pad).
    pub vocab_pad_multiple: u64,
}

impl Default for Runtime {
    fn default() -> Self {
        Runtime {
            overlap_grad_reduce: false,
            fp32_main_grads: true,
            pp_scatter_gather: true,
            pp_blocking_sends: false,
            vocab_pad_multiple: 128,
        }
    }
}

impl ParallelConfig {
    /// Micro-batches per iteration per data-parallel replica: `B / (d · b)`.
    pub fn num_microbatches(&self) -> u64 {
        self.global_batch_size / (self.dp * self.micro_batch_size).max(1)
    }
    /// Number of stages: `pp · virtual_stages`.
    pub fn num_stages(&self) -> u64 {
        self.pp * self.virtual_stages
    }
    /// GPUs used: `tp · pp · dp · cp`.
    pub fn num_gpus(&self) -> u64 {
        self.tp * self.pp * self.dp * self.cp
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
