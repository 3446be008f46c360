//! The layer IR: what one layer costs on one GPU for one micro-batch.
//!
//! A [`LayerCost`] is produced by a model for a given [`ShardSpec`] (micro-batch size, tensor /
//! sequence / context parallelism, dtype). Everything in it is *per GPU* and *per micro-batch*:
//! FLOPs already divided by the tensor-parallel degree, bytes already sharded where the
//! parallelism shards them. The profiler turns its [`Op`] lists into seconds; the planner adds up
//! memory from its byte counts.

use serde::{Deserialize, Serialize};

/// What role a layer plays in the pipeline; used for layouts (`E`, `t`, `L`) and placement rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerKind {
    /// Token (and position) embedding; always the first layer of a transformer.
    Embedding,
    /// One transformer block (attention + MLP with their norms and residuals).
    Transformer,
    /// Final norm, LM head and loss; always the last layer of a transformer.
    Head,
    /// A layer of an explicit layer list (a model that is not a transformer).
    Custom,
}

/// Activation recomputation mode (Korthikanti et al. 2022, §4–5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Recompute {
    /// Keep every activation the backward needs.
    None,
    /// Recompute only the attention core (softmax, dropout, scores × V).
    Selective,
    /// Keep only the layer input; rerun the whole forward during backward.
    Full,
}

impl Recompute {
    /// All modes, in order of increasing recomputation.
    pub const ALL: [Recompute; 3] = [Recompute::None, Recompute::Selective, Recompute::Full];

    /// The name used on the command line and in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Recompute::None => "none",
            Recompute::Selective => "selective",
            Recompute::Full => "full",
        }
    }
}

impl std::fmt::Display for Recompute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Recompute {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(Recompute::None),
            "selective" => Ok(Recompute::Selective),
            "full" => Ok(Recompute::Full),
            other => Err(format!(
                "unknown recompute mode '{other}': use none, selective or full"
            )),
        }
    }
}

/// What [`Recompute::Selective`] recomputes in a transformer block: Megatron-Core's
/// `--recompute-modules` under `--recompute-granularity selective`
/// (`TransformerConfig.recompute_modules`, Megatron-Core 0.13+: "choices: core_attn, moe_act,
/// layernorm, mla_up_proj, mlp, moe, shared_experts; default: `[core_attn]`"). The default is
/// Megatron's `[core_attn]`, the selective recompute of Korthikanti et al. 2022.
///
/// `moe_act`, `layernorm` and `mla_up_proj` use Megatron-Core's output-discarding checkpoint
/// (`tensor_parallel.CheckpointWithoutOutput`): the module's output is freed once its consumer
/// has saved it, and recomputed from the module's kept input before the consumer's backward.
/// `core_attn` and `mlp` use the ordinary checkpoint (input kept, the module re-run).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RecomputeModules {
    /// `core_attn`: the attention core (its stored scores, or with a fused kernel its
    /// statistics) is dropped and its forward re-run.
    pub core_attn: bool,
    /// `layernorm`: the outputs of the block's stand-alone norms are dropped and recomputed
    /// (`transformer_layer.py`: `input_layernorm` and `pre_mlp_layernorm` when they are not
    /// `IdentityOp`, i.e. not fused into Transformer Engine's `LayerNormLinear`/`LayerNormMLP`):
    /// the MoE layer's pre-MLP norm (its router and dispatcher need the normed tokens) and
    /// MLA's input norm (its down projections are plain linears).
    pub layernorm: bool,
    /// `moe_act`: the routed experts' activation output (the input of their second grouped
    /// GEMM) is dropped and recomputed from the first GEMM's output (`experts.py`,
    /// `TEGroupedMLP`).
    pub moe_act: bool,
    /// `mla_up_proj`: MLA's query and key/value up projections and the rotary embedding are
    /// re-run from the latents, the Q, K and V the attention core keeps dropped
    /// (`multi_latent_attention.py`, `qkv_up_proj_and_rope_apply`).
    pub mla_up_proj: bool,
    /// `mlp`: a dense block's MLP (not a MoE layer's: "recompute the dense MLP submodule") is
    /// checkpointed: its input kept, its activations dropped and its forward re-run.
    pub mlp: bool,
}

impl Default for RecomputeModules {
    /// Megatron-Core's default `recompute_modules = ["core_attn"]`.
    fn default() -> Self {
        RecomputeModules {
            core_attn: true,
            layernorm: false,
            moe_act: false,
            mla_up_proj: false,
            mlp: false,
        }
    }
}

impl RecomputeModules {
    /// Megatron-Core's module names, in its order.
    pub const NAMES: [&'static str; 5] =
        ["core_attn", "layernorm", "moe_act", "mla_up_proj", "mlp"];

    /// Whether these are Megatron-Core's default modules (serde's `skip_serializing_if`).
    pub fn is_default(&self) -> bool {
        *self == RecomputeModules::default()
    }

    /// No module: what a list without any of Megatron's names starts from.
    pub fn none() -> Self {
        RecomputeModules {
            core_attn: false,
            ..RecomputeModules::default()
        }
    }

    /// The modules of a list of Megatron-Core names (`["layernorm", "moe_act"]`); an unknown
    /// name (or `moe`, `shared_experts`, which autopp does not model) is an error naming it.
    pub fn from_names<S: AsRef<str>>(names: &[S]) -> Result<Self, String> {
        let mut m = RecomputeModules::none();
        for n in names {
            match n.as_ref().trim() {
                "core_attn" => m.core_attn = true,
                "layernorm" => m.layernorm = true,
                "moe_act" => m.moe_act = true,
                "mla_up_proj" => m.mla_up_proj = true,
                "mlp" => m.mlp = true,
                other => {
                    return Err(format!(
                        "recompute module '{other}' is not one autopp models: use {}",
                        Self::NAMES.join(", ")
                    ))
                }
            }
        }
        Ok(m)
    }

    /// The names of the modules on, in Megatron-Core's order.
    pub fn names(&self) -> Vec<&'static str> {
        let on = [
            self.core_attn,
            self.layernorm,
            self.moe_act,
            self.mla_up_proj,
            self.mlp,
        ];
        Self::NAMES
            .iter()
            .zip(on)
            .filter(|(_, on)| *on)
            .map(|(n, _)| *n)
            .collect()
    }
}

/// The class of fused attention kernel a stack runs: what fraction of the tensor-core peak
/// it can reach depends on whether it was written for the GPU's generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttentionKernel {
    /// A kernel written for the GPU it runs on: FlashAttention-2 on Ampere; on Hopper
    /// cuDNN's fused attention or FlashAttention-3 (Transformer Engine's backends under
    /// Megatron-Core and NeMo), which use the Hopper tensor-core instructions (WGMMA, TMA).
    #[default]
    Native,
    /// FlashAttention-2 or a kernel of its generation whatever the GPU: PyTorch's
    /// `scaled_dot_product_attention` flash backend (FlashAttention-2, what torchtitan's
    /// SDPA runs on H100) and llm-foundry's `flash`/`triton` kernels. Written for Ampere's
    /// `mma.sync`, it reaches a smaller share of a Hopper GPU's peak (Shah et al. 2024,
    /// FlashAttention-3, §1: "FlashAttention-2 achieving only 35% utilization on H100").
    Fa2,
}

/// How a layer is sharded and fed: the inputs to a model's layer expansion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ShardSpec {
    /// Sequences per micro-batch (`b`).
    pub micro_batch_size: u64,
    /// Tensor-parallel degree (`t`).
    pub tp: u64,
    /// Megatron sequence parallelism: norms, dropout and residual activations are sharded over `t`.
    pub sequence_parallel: bool,
    /// Context-parallel degree: the sequence is split over `cp` GPUs (attention sees all keys).
    pub cp: u64,
    /// Bytes per element of weights and activations (2 for bf16 / fp16).
    pub dtype_bytes: u64,
    /// A fused attention kernel (FlashAttention) that stores no `a·s²` score matrix and skips
    /// masked blocks of a causal mask.
    pub flash_attention: bool,
    /// The vocabulary is padded to a multiple of `vocab_pad_multiple · tp` (Megatron:
    /// `--make-vocab-size-divisible-by 128`).
    pub vocab_pad_multiple: u64,
    /// Which fused attention kernel runs the attention core (when `flash_attention`).
    #[serde(default)]
    pub attention_kernel: AttentionKernel,
    /// Norms, rotary embedding and gated activation run as fused kernels (Megatron-Core's and
    /// Transformer Engine's, or `torch.compile`'s); `false`: PyTorch eager, one kernel per op
    /// (`transformer::eager` counts the extra traffic).
    #[serde(default = "yes")]
    pub fused_elementwise: bool,
    /// Expert-parallel degree: each GPU holds `E/ep` routed experts of a MoE layer (1 for a
    /// dense model).
    #[serde(default = "one")]
    pub ep: u64,
    /// Expert-tensor-parallel degree: each routed expert's FFN is split `etp` ways.
    #[serde(default = "one")]
    pub etp: u64,
    /// Load of the busiest expert-parallel rank over the balanced load, in thousandths (1000:
    /// forced balance; `--moe-imbalance 1.2` is 1200): its routed rows scale by it.
    #[serde(default = "thousand")]
    pub moe_imbalance_milli: u64,
    /// The linear layers save their FP8-cast inputs (1 byte per element) for the backward
    /// instead of the `dtype_bytes` ones: Transformer Engine under an FP8 recipe (`Linear`,
    /// `LayerNormLinear`, `LayerNormMLP` and `GroupedLinear` keep the quantized input their
    /// weight-gradient GEMM reads). False for bf16 and for FP8 cast per use (torchao).
    #[serde(default)]
    pub fp8_saved_inputs: bool,
    /// What [`Recompute::Selective`] recomputes (default: the attention core).
    #[serde(default, skip_serializing_if = "RecomputeModules::is_default")]
    pub recompute_modules: RecomputeModules,
}

fn thousand() -> u64 {
    1000
}

fn one() -> u64 {
    1
}

fn yes() -> bool {
    true
}

impl Default for ShardSpec {
    fn default() -> Self {
        ShardSpec {
            micro_batch_size: 1,
            tp: 1,
            sequence_parallel: false,
            cp: 1,
            dtype_bytes: 2,
            flash_attention: true,
            vocab_pad_multiple: 128,
            attention_kernel: AttentionKernel::Native,
            fused_elementwise: true,
            ep: 1,
            etp: 1,
            moe_imbalance_milli: 1000,
            fp8_saved_inputs: false,
            recompute_modules: RecomputeModules::default(),
        }
    }
}

impl ShardSpec {
    /// The padded vocabulary size Megatron uses: `vocab` rounded up to a multiple of
    /// `vocab_pad_multiple · tp`.
    pub fn padded_vocab(&self, vocab: u64) -> u64 {
        let multiple = (self.vocab_pad_multiple.max(1)) * self.tp.max(1);
        vocab.div_ceil(multiple) * multiple
    }
}

/// One unit of work a profiler turns into seconds. All sizes are per GPU.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// A matrix multiply `[m × k] · [k × n]`, run `count` times: `2·m·n·k·count` FLOPs.
    Gemm {
        /// Rows of the output.
        m: u64,
        /// Columns of the output.
        n: u64,
        /// The reduction dimension.
        k: u64,
        /// How many such GEMMs (e.g. batched heads).
        count: u64,
        /// A linear layer's GEMM (attention projections, MLP and expert FFNs): what the FP8
        /// recipes run on the FP8 tensor cores. The LM head, the router and the attention core
        /// stay in bf16.
        linear: bool,
    },
    /// The attention core (scores, softmax, scores × V) over `batch_heads` independent heads.
    /// Forward FLOPs `4·batch_heads·seq_q·seq_k·head_dim`; the backward pass is twice that.
    Attention {
        /// Micro-batch size × attention heads on this GPU.
        batch_heads: u64,
        /// Query positions on this GPU (the sequence length over `cp`).
        seq_q: u64,
        /// Key positions each query attends over (the full sequence).
        seq_k: u64,
        /// Hidden size per head.
        head_dim: u64,
        /// A causal mask: a fused kernel skips about half of the blocks.
        causal: bool,
        /// This is the backward of the attention core (twice the forward FLOPs).
        backward: bool,
        /// Run by a fused kernel (FlashAttention) rather than separate GEMMs and softmax.
        fused: bool,
        /// Which fused kernel (when `fused`).
        kernel: AttentionKernel,
    },
    /// A memory-bound op (norm, activation, dropout, residual add, cross-entropy, embedding
    /// gather) that moves `bytes` of HBM traffic and does negligible FLOPs.
    Elementwise {
        /// Bytes read plus bytes written.
        bytes: u64,
    },
}

impl Op {
    /// FLOPs of this op as model-FLOP conventions count them (a causal mask is *not* discounted).
    pub fn flops(&self) -> f64 {
        match *self {
            Op::Gemm { m, n, k, count, .. } => 2.0 * m as f64 * n as f64 * k as f64 * count as f64,
            Op::Attention {
                batch_heads,
                seq_q,
                seq_k,
                head_dim,
                backward,
                ..
            } => {
                let fwd = 4.0 * batch_heads as f64 * seq_q as f64 * seq_k as f64 * head_dim as f64;
                if backward {
                    2.0 * fwd
                } else {
                    fwd
                }
            }
            Op::Elementwise { .. } => 0.0,
        }
    }
}

/// The kind of a tensor-parallel collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveKind {
    /// Sum over the group; every member gets the whole result.
    AllReduce,
    /// Every member contributes a shard; every member gets the whole tensor.
    AllGather,
    /// Sum over the group; every member gets one shard of the result.
    ReduceScatter,
}

/// One collective over the tensor-parallel group.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Collective {
    /// What it does.
    pub kind: CollectiveKind,
    /// Size of the *whole* (unsharded) tensor in bytes.
    pub bytes: u64,
}

/// Bytes of activations one layer keeps for its backward, per GPU, per micro-batch, for each
/// recompute mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ActivationBytes {
    /// Recompute none.
    pub none: u64,
    /// Selective recompute (attention core recomputed).
    pub selective: u64,
    /// Full recompute (only the layer input kept).
    pub full: u64,
}

impl ActivationBytes {
    /// The bytes for one mode.
    pub fn get(&self, mode: Recompute) -> u64 {
        match mode {
            Recompute::None => self.none,
            Recompute::Selective => self.selective,
            Recompute::Full => self.full,
        }
    }
}

/// What one layer costs on one GPU for one micro-batch under a [`ShardSpec`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerCost {
    /// Human-readable name, e.g. `layer 3`, `embedding`, `head`.
    pub name: String,
    /// The layer's role.
    pub kind: LayerKind,
    /// Parameters this layer owns in the whole model (unsharded, unpadded vocabulary).
    pub params_total: u64,
    /// Parameters this layer holds on one GPU (sharded over `tp`, padded vocabulary).
    pub params: u64,
    /// Parameters this layer *uses* but does not own, held as a copy when its owner sits on
    /// another pipeline rank (the tied word embedding on the last stage), per GPU.
    pub tied_params: u64,
    /// Forward ops, per GPU.
    pub forward_ops: Vec<Op>,
    /// Backward ops that compute the gradient with respect to the layer's input (`I`).
    pub backward_input_ops: Vec<Op>,
    /// Backward ops that compute the gradients of the layer's weights (`W`).
    pub backward_weight_ops: Vec<Op>,
    /// Ops rerun during backward under selective recompute (the attention core's forward).
    pub selective_recompute_ops: Vec<Op>,
    /// Tensor-parallel collectives in the forward pass (rerun under full recompute).
    pub tp_forward: Vec<Collective>,
    /// Tensor-parallel collectives in the backward pass.
    pub tp_backward: Vec<Collective>,
    /// Activation bytes kept from F to B, per recompute mode.
    pub activation_bytes: ActivationBytes,
    /// Bytes still held from `I` to `W` when the backward is split: the GEMM inputs and output
    /// gradients the weight gradients need.
    pub weight_grad_bytes: u64,
    /// Bytes of the layer's output sent to the next stage per micro-batch from this GPU (with
    /// Megatron's scatter/gather over `tp`: the whole output over `tp`).
    pub output_bytes: u64,
    /// Whether this layer's activations follow the recompute mode. Embedding and head layers keep
    /// theirs whatever the mode (Megatron recomputes transformer layers only).
    pub recomputable: bool,
    /// Of `params`, those of routed experts: sharded over `ep·etp`, their gradients reduced
    /// over the expert-data-parallel group. 0 for a dense layer.
    #[serde(default)]
    pub expert_params: u64,
    /// Bytes this GPU sends in the expert-parallel all-to-alls of one forward pass, dispatch
    /// and combine together (`2·T·k·h·e/tp`; the backward sends as many). 0 for a dense layer.
    #[serde(default)]
    pub ep_a2a_bytes: u64,
    /// Parameters of the largest single weight tensor this layer holds on one GPU: the word
    /// embedding or LM-head table (`V/t · h`), else the largest weight matrix of the block (the
    /// fused QKV or MLP input projection; one expert's under MoE). Optimizers that cast
    /// gradients one tensor at a time hold this many elements at once
    /// (`autopp_planner::memory::hp_grad_cast_bytes`). 0 where unknown (custom layer lists).
    #[serde(default)]
    pub largest_weight_params: u64,
}

impl LayerCost {
    /// Forward FLOPs per GPU per micro-batch.
    pub fn forward_flops(&self) -> f64 {
        self.forward_ops.iter().map(Op::flops).sum()
    }
    /// Backward-input FLOPs per GPU per micro-batch.
    pub fn backward_input_flops(&self) -> f64 {
        self.backward_input_ops.iter().map(Op::flops).sum()
    }
    /// Backward-weight FLOPs per GPU per micro-batch.
    pub fn backward_weight_flops(&self) -> f64 {
        self.backward_weight_ops.iter().map(Op::flops).sum()
    }
    /// Model FLOPs (forward + backward, no recomputation) per GPU per micro-batch.
    pub fn model_flops(&self) -> f64 {
        self.forward_flops() + self.backward_input_flops() + self.backward_weight_flops()
    }
    /// Activation bytes kept for backward in a recompute mode (embedding and head ignore it).
    pub fn activation_bytes_for(&self, mode: Recompute) -> u64 {
        if self.recomputable {
            self.activation_bytes.get(mode)
        } else {
            self.activation_bytes.none
        }
    }
}
