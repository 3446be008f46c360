//! Memory per GPU of one pipeline rank: model states, activations, buffers and a reserve.
//!
//! Model states follow Megatron-LM's mixed-precision Adam (Narayanan et al. 2021; Rajbhandari et
//! al. 2020, ZeRO): 16-bit weights 2 B, fp32 main gradients 4 B, fp32 master weights and the two
//! Adam moments 12 B — 18 B per parameter. The distributed optimizer (ZeRO-1) shards the 12 B
//! over the data-parallel group (`6 + 12/d`), ZeRO-2 also the gradients (`2 + 16/d`), ZeRO-3 also
//! the weights (`18/d`, plus the layers gathered in flight). Frameworks that keep 16-bit
//! gradients (Megatron-LM 2021 in fp16, DeepSpeed's fp16 optimizers) hold 2 B of gradients and
//! make a 4 B fp32 copy for the optimizer, sharded with it: `4 + 16/d` under ZeRO-1. The
//! `BF16_Optimizer` BigScience's Megatron-DeepSpeed ran keeps both: 2 B of bf16 gradients
//! beside 4 B of fp32 ones, unsharded ([`resident_half_grad_bytes_per_param`]).
//!
//! PyTorch FSDP (torchtitan's FSDP2, Composer's FSDP) is different at ZeRO-3: the sharded
//! parameters *are* the fp32 master weights (`MixedPrecisionPolicy(param_dtype=bf16)` casts them
//! when it all-gathers), so a rank keeps fp32 parameters, fp32 gradients and Adam's two moments,
//! `16/d` B per parameter, and no resident 16-bit copy ([`fsdp_state_bytes`]).
//!
//! Above the tensors the model accounts for, the caching allocator keeps freed blocks it cannot
//! reuse (fragmentation, a fraction of the dynamic memory: activations and the backward's
//! working set), and the CUDA context, cuBLAS, NCCL and the framework's own buffers take a
//! fixed amount. Fragmentation is calibrated on BLOOM's peaks as `nvidia-smi` reported them
//! (`autopp validate --fit`, `docs/validation.md`) and applies to every stack; the fixed amount
//! fitted there ([`CONTEXT_BYTES`]) is that of DeepSpeed's ZeRO optimizer under Megatron-DeepSpeed
//! and is used for the DeepSpeed stacks only ([`StackMemory::fitted_context`]); the others get the
//! measured CUDA context ([`CUDA_CONTEXT_BYTES`]). The configured reserve is headroom on top.

use serde::Serialize;

use crate::stages::StageCost;

/// Bytes per parameter of the 16-bit weights.
pub const WEIGHT_BYTES_PER_PARAM: u64 = 2;
/// Bytes per parameter of the fp32 main gradients.
pub const GRAD_BYTES_PER_PARAM: u64 = 4;
/// Bytes per parameter of the fp32 master weights and Adam's two moments.
pub const OPTIMIZER_BYTES_PER_PARAM: u64 = 12;
/// Bytes per parameter of 16-bit gradients (frameworks without fp32 main gradients).
pub const HALF_GRAD_BYTES_PER_PARAM: u64 = 2;
/// Bytes per parameter of the fp32 gradient copy the optimizer makes from 16-bit gradients.
pub const FP32_GRAD_COPY_BYTES_PER_PARAM: u64 = 4;
/// Fraction of the dynamic memory (activations and the backward's working set) the caching
/// allocator holds on top as fragmentation; calibrated on BLOOM's peaks.
pub const FRAGMENTATION: f64 = 0.185;
/// CUDA context, cuBLAS workspaces, NCCL and framework buffers per GPU, bytes, beyond the
/// tensors counted here, of the stacks built on DeepSpeed's ZeRO optimizer (its reduce and
/// all-gather buckets, 5e8 elements each by default, its flattened fp16 and fp32 groups and
/// their allocator cache, as `nvidia-smi` sees them); calibrated on BLOOM's peaks
/// (Megatron-DeepSpeed, `autopp validate --fit`).
pub const CONTEXT_BYTES: u64 = 126 << 26; // 7.875 GiB
/// The CUDA context, cuBLAS workspaces and NCCL's own buffers per GPU, bytes, for the stacks
/// without DeepSpeed's buffers: 1.5 GiB. BigScience measured the context of a bare
/// `torch.ones(1).cuda()` at 1,573 MiB on an A100 (`train/tr11-176B-ml/chronicles-prequel.md`,
/// "40GB A100 takes 1573MiB for cuda kernels"); NCCL's per-communicator buffers are counted
/// apart ([`NCCL_BUFFER_BYTES_PER_GROUP`]).
pub const CUDA_CONTEXT_BYTES: u64 = 3 << 29; // 1.5 GiB
/// Parameters ZeRO-3 keeps gathered at once: DeepSpeed's `stage3_max_live_parameters` default
/// (1e9; DeepSpeed configuration documentation, ZeRO section). Two whole transformer layers are
/// gathered when they are smaller than that.
pub const ZERO3_MAX_LIVE_PARAMS: u64 = 1_000_000_000;

/// The memory facts of a software stack (see the module doc and [`crate::Stack`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StackMemory {
    /// ZeRO-3 is PyTorch FSDP: sharded fp32 parameters are the master weights
    /// ([`fsdp_state_bytes`]); the gathered layers are the current one and the next, prefetched
    /// (FSDP2's `reshard_after_forward=True` with implicit prefetch, torchtitan
    /// `parallelize.py`; FSDP1's `BACKWARD_PRE` prefetch under Composer), with no live-parameter
    /// cap; the backward also holds one layer's unsharded gradient, in 16 bits and, reduced in
    /// fp32 (`reduce_dtype=float32`), its fp32 copy.
    pub fsdp: bool,
    /// FP8 weights are cast per use, no FP8 copy persists between micro-batches: torchao's
    /// float8 training (torchtitan `docs/float8.md`: dynamic tensorwise or rowwise scaling
    /// converts `nn.Linear` to `Float8Linear`, which keeps the bf16 weight and casts it each
    /// forward). Transformer Engine (Megatron-Core, NeMo) caches the FP8 weight and its
    /// transpose across micro-batches instead.
    pub fp8_cast_per_use: bool,
    /// The fixed overhead per GPU is DeepSpeed's, fitted on BLOOM ([`CONTEXT_BYTES`]); else
    /// [`CUDA_CONTEXT_BYTES`].
    pub fitted_context: bool,
    /// The optimizer's fp32 copy of 16-bit gradients lives only at the optimizer step, when the
    /// backward has freed the activations ([`RankMemory::step_bytes`]): Megatron-Core's
    /// optimizers make it in `step()` (`distrib_optimizer.py`
    /// `_copy_model_grads_to_main_grads`: `shard_main_param.grad = shard_model_grad.float()`,
    /// a copy when the gradient buffer is bf16) and drop it at the next iteration's
    /// `optimizer.zero_grad()` (`set_to_none=True`) before the forward; NeMo's Apex
    /// `distributed_fused_adam` steps on the bf16 shards directly. Where it is false the copy
    /// is held with the activations (the 2021 fp16 optimizer, DeepSpeed's as fitted on BLOOM).
    pub grad_copy_at_step: bool,
    /// With fp32 gradient accumulation at ZeRO 0–1 the optimizer is DeepSpeed's
    /// `BF16_Optimizer` as BigScience ran it (Megatron-DeepSpeed, 2022), which keeps the 16-bit
    /// gradients beside the fp32 ones ([`resident_half_grad_bytes_per_param`]). Not DeepSpeed
    /// 0.16's: its `BF16_Optimizer` may add each gradient from a per-parameter hook and free it
    /// at once (`immediate_grad_update`: `accumulate_hp_grads_and_remove_lp` calls
    /// `_update_hp_grad(…, clear_lp_grads=True)`), so that stack is left as it was.
    pub half_grads_beside_fp32: bool,
    /// Under a pipeline, FSDP keeps a rank's whole stage unsharded for the iteration: PyTorch's
    /// pipeline stages (`torch.distributed.pipelining`, `_PipelineStageBase.
    /// backward_maybe_with_nosync`) run every micro-batch's backward of an FSDP module with
    /// `set_reshard_after_backward(False)` and `set_requires_gradient_sync(False)` and
    /// reduce-scatter once, after the last backward (`post_backward` called by hand), and
    /// torchtitan does not reshard after the forward when pipelining (`apply_fsdp`:
    /// `reshard_after_forward = not pp_enabled`, "to avoid per-microbatch all-gathers"). FSDP2
    /// accumulates the unsharded gradients in `reduce_dtype`, fp32 under torchtitan
    /// (`FSDPParam.to_accumulated_grad_if_needed`). So each rank holds its parameters in 16
    /// bits and their gradients in fp32, unsharded, beside the sharded states
    /// ([`StackMemory::pipelined_fsdp`]). The same code gathers and reduces once per step
    /// ([`crate::estimate::dp_comm_time_s`]).
    pub pipeline_fsdp_unsharded: bool,
}

impl StackMemory {
    /// The memory facts of `stack`.
    pub fn of(stack: crate::Stack) -> StackMemory {
        use crate::Stack;
        match stack {
            Stack::Torchtitan => StackMemory {
                fsdp: true,
                fp8_cast_per_use: true,
                pipeline_fsdp_unsharded: true,
                ..StackMemory::default()
            },
            Stack::Composer => StackMemory {
                fsdp: true,
                ..StackMemory::default()
            },
            Stack::Deepspeed => StackMemory {
                fitted_context: true,
                ..StackMemory::default()
            },
            Stack::MegatronDeepspeed => StackMemory {
                fitted_context: true,
                half_grads_beside_fp32: true,
                ..StackMemory::default()
            },
            Stack::MegatronCore | Stack::MegatronCoreEpOverlap | Stack::Nemo => StackMemory {
                grad_copy_at_step: true,
                ..StackMemory::default()
            },
            _ => StackMemory::default(),
        }
    }

    /// Whether a rank of `pp` pipeline ranks at `zero_stage` keeps its stage unsharded for the
    /// iteration ([`StackMemory::pipeline_fsdp_unsharded`]): FSDP (ZeRO 2 or 3) under a
    /// pipeline on such a stack.
    pub fn pipelined_fsdp(self, zero_stage: u8, pp: u64) -> bool {
        self.pipeline_fsdp_unsharded && zero_stage >= 2 && pp > 1
    }

    /// The fixed overhead per GPU of the stack, bytes.
    pub fn context_bytes(self) -> u64 {
        if self.fitted_context {
            CONTEXT_BYTES
        } else {
            CUDA_CONTEXT_BYTES
        }
    }
}

/// Model-state bytes per GPU under PyTorch FSDP's full sharding over `shard` members: fp32
/// parameters 4 B, fp32 gradients 4 B (FSDP casts the reduced gradient back to the parameter's
/// dtype) and Adam's two fp32 moments 8 B, all sharded — `16/d` B per parameter (PyTorch FSDP
/// `MixedPrecision` / FSDP2 `MixedPrecisionPolicy` docs: parameters stay in their original
/// dtype, `param_dtype` applies to the all-gathered copy). `(weights, grads, optimizer)`.
pub fn fsdp_state_bytes(params: u64, shard: u64) -> (u64, u64, u64) {
    let sharded = |bytes: u64| (params * bytes).div_ceil(shard.max(1));
    (sharded(4), sharded(4), sharded(8))
}

/// NCCL buffers and workspaces per communicator a rank uses, bytes (an estimate: NCCL's default
/// 4 MiB buffer × up to 32 channels).
pub const NCCL_BUFFER_BYTES_PER_GROUP: u64 = 128 << 20;

/// One rank's memory per GPU, by kind, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct RankMemory {
    /// 16-bit weights (sharded under ZeRO-3, plus the gathered layers).
    pub weights_bytes: u64,
    /// fp32 main gradients (sharded under ZeRO-2 and -3).
    pub grads_bytes: u64,
    /// fp32 master weights and Adam moments (sharded under ZeRO-1 and up).
    pub optimizer_bytes: u64,
    /// Activations of all (stage, micro-batch) pairs in flight at the peak.
    pub activations_bytes: u64,
    /// The backward's transient working set (recomputed layer, gradient buffers).
    pub transient_bytes: u64,
    /// Communication buffers: pipeline send/receive buffers and NCCL workspaces.
    pub buffers_bytes: u64,
    /// The optimizer's fp32 copy of 16-bit gradients, alive only at the optimizer step, after
    /// the activations are freed ([`StackMemory::grad_copy_at_step`]): the peak holds the
    /// larger of it and the dynamic memory with its fragmentation, not both.
    pub step_bytes: u64,
    /// The configured reserve: headroom kept free.
    pub reserve_bytes: u64,
    /// Freed blocks the caching allocator cannot reuse: [`FRAGMENTATION`] of the dynamic memory.
    pub fragmentation_bytes: u64,
    /// CUDA context, cuBLAS, NCCL and framework buffers: [`StackMemory::context_bytes`].
    pub context_bytes: u64,
    /// The context is the fitted one ([`CONTEXT_BYTES`]), which calibration may replace.
    #[serde(skip)]
    pub context_fitted: bool,
}

impl RankMemory {
    /// The peak total, bytes: the larger of the forward-backward peak and the optimizer
    /// step's ([`RankMemory::step_bytes`]).
    pub fn total_bytes(&self) -> u64 {
        self.total_with_terms(self.fragmentation_bytes, self.context_bytes)
    }

    /// The peak with `fragmentation` and `context` bytes, bytes.
    fn total_with_terms(&self, fragmentation: u64, context: u64) -> u64 {
        // saturating: a total past u64::MAX bytes (absurd inputs) fits nowhere all the same
        let sum = |terms: &[u64]| terms.iter().fold(0u64, |a, &b| a.saturating_add(b));
        let dynamic = sum(&[self.activations_bytes, self.transient_bytes, fragmentation]);
        sum(&[
            self.weights_bytes,
            self.grads_bytes,
            self.optimizer_bytes,
            self.buffers_bytes,
            self.reserve_bytes,
            context,
            dynamic.max(self.step_bytes),
        ])
    }

    /// Memory that comes and goes during the iteration: activations and the backward's
    /// working set, bytes.
    pub fn dynamic_bytes(&self) -> u64 {
        self.activations_bytes.saturating_add(self.transient_bytes)
    }

    /// The total with another fragmentation fraction and fitted context size (what
    /// calibration tries); a rank whose context is not the fitted one keeps its own.
    pub fn total_bytes_with(&self, fragmentation: f64, context_bytes: u64) -> u64 {
        let context = if self.context_fitted {
            context_bytes
        } else {
            self.context_bytes
        };
        self.total_with_terms(
            fragmentation_bytes(self.dynamic_bytes(), fragmentation),
            context,
        )
    }
}

/// Fragmentation held on top of `dynamic_bytes` at `fraction`, bytes.
pub fn fragmentation_bytes(dynamic_bytes: u64, fraction: f64) -> u64 {
    (dynamic_bytes as f64 * fraction.max(0.0)).round() as u64
}

/// Parameters (per GPU) a rank keeps model states for: its stages' own parameters, plus the
/// tied LM-head copy when the embedding that owns it sits on another rank.
pub fn rank_params(stages: &[&StageCost]) -> u64 {
    let own: u64 = stages.iter().map(|s| s.params).sum();
    let holds_embedding = stages.iter().any(|s| s.has_embedding);
    let tied: u64 = if holds_embedding {
        0
    } else {
        stages.iter().map(|s| s.tied_params).sum()
    };
    own + tied
}

/// Model-state bytes per GPU for `params` parameters under a ZeRO stage with `shard` data-parallel
/// members (weights, gradients, optimizer), with fp32 main gradients.
pub fn model_state_bytes(params: u64, zero_stage: u8, shard: u64) -> (u64, u64, u64) {
    model_state_bytes_for(params, zero_stage, shard, true)
}

/// [`model_state_bytes`] for a framework with (`fp32_main_grads`) or without fp32 main
/// gradients: without, 2 B of 16-bit gradients (sharded from ZeRO-2) and 16 B of optimizer
/// states with the fp32 gradient copy (sharded from ZeRO-1).
pub fn model_state_bytes_for(
    params: u64,
    zero_stage: u8,
    shard: u64,
    fp32_main_grads: bool,
) -> (u64, u64, u64) {
    let shard = shard.max(1);
    let (grad_bytes, optimizer_bytes) = if fp32_main_grads {
        (GRAD_BYTES_PER_PARAM, OPTIMIZER_BYTES_PER_PARAM)
    } else {
        (
            HALF_GRAD_BYTES_PER_PARAM,
            OPTIMIZER_BYTES_PER_PARAM + FP32_GRAD_COPY_BYTES_PER_PARAM,
        )
    };
    let sharded = |bytes: u64| (params * bytes).div_ceil(shard);
    let weights = if zero_stage >= 3 {
        sharded(WEIGHT_BYTES_PER_PARAM)
    } else {
        params * WEIGHT_BYTES_PER_PARAM
    };
    let grads = if zero_stage >= 2 {
        sharded(grad_bytes)
    } else {
        params * grad_bytes
    };
    let optimizer = if zero_stage >= 1 {
        sharded(optimizer_bytes)
    } else {
        params * optimizer_bytes
    };
    (weights, grads, optimizer)
}

/// Bytes the optimizer's `states` save against fp32 master weights and moments
/// ([`OPTIMIZER_BYTES_PER_PARAM`]) for `params` parameters under a ZeRO stage with `shard`
/// data-parallel members (sharded from ZeRO-1, as the states are): 2 B/param for NeMo 1.x's
/// 16-bit master remainders, 8 B/param for bf16 states, 6 B/param for bf16 states beside a
/// bf16 weight copy (FP8 parameters).
pub fn optimizer_states_saving_bytes(
    params: u64,
    zero_stage: u8,
    shard: u64,
    states: crate::runtime::OptimizerStates,
) -> u64 {
    let bytes = params * OPTIMIZER_BYTES_PER_PARAM.saturating_sub(states.bytes_per_param());
    if zero_stage >= 1 {
        bytes.div_ceil(shard.max(1))
    } else {
        bytes
    }
}

/// Bytes of the optimizer's fp32 copy of 16-bit gradients for `params` parameters under a ZeRO
/// stage with `shard` data-parallel members (sharded from ZeRO-1): the part of
/// [`model_state_bytes_for`]'s optimizer bytes without fp32 main gradients that a stack with
/// [`StackMemory::grad_copy_at_step`] holds only at the step.
pub fn fp32_grad_copy_bytes(params: u64, zero_stage: u8, shard: u64) -> u64 {
    let bytes = params * FP32_GRAD_COPY_BYTES_PER_PARAM;
    if zero_stage >= 1 {
        bytes.div_ceil(shard.max(1))
    } else {
        bytes
    }
}

/// Bytes per parameter of 16-bit gradients a stack keeps beside its fp32 gradients, unsharded:
/// 2 under the `BF16_Optimizer` of BigScience's DeepSpeed ([`StackMemory::half_grads_beside_fp32`];
/// DeepSpeed's engine picks it for bf16 with fp32 gradient accumulation at ZeRO 0–1,
/// `DeepSpeedEngine._do_optimizer_sanity_check`), else 0.
///
/// `BF16_Optimizer._setup_for_real_optimizer` (`deepspeed/runtime/bf16_optimizer.py`)
/// allocates the fp32 gradients whole on every rank (`fp32_groups_gradients_flat =
/// torch.zeros_like(bf16_groups_flat, dtype=torch.float32)`; only the fp32 master weights
/// and Adam's moments are partitioned over the data-parallel group). The pipeline engine
/// (`deepspeed/runtime/pipe/engine.py`, `PipelineEngine._exec_backward_pass`) frees the bf16
/// `param.grad` tensors only before each backward (`optimizer.clear_lp_grads()`) and adds them
/// to the fp32 ones after it with `update_hp_grads(clear_lp_grads=False)`, so a whole stage's
/// bf16 gradients stay allocated beside its fp32 gradients from one backward to the next.
/// Against DeepSpeed's fp16 ZeRO-1 optimizer (2 + 2 + 16/d B/param) that is `4 − 4/d` B/param
/// more, BigScience's "additional memory usage is 4bytes x params and it's not sharded"
/// (`bigscience` `train/tr11-176B-ml/chronicles-prequel.md`, "Rebalancing layers", 2022-02-28).
pub fn resident_half_grad_bytes_per_param(
    stack: StackMemory,
    zero_stage: u8,
    fp32_main_grads: bool,
) -> u64 {
    if stack.half_grads_beside_fp32 && fp32_main_grads && zero_stage <= 1 {
        HALF_GRAD_BYTES_PER_PARAM
    } else {
        0
    }
}

/// Bytes of the fp32 cast of one 16-bit gradient tensor that DeepSpeed's `BF16_Optimizer` holds
/// while it adds the gradients of a micro-batch into its fp32 accumulators, for a rank whose
/// largest weight tensor has `largest_params` elements on one GPU; 0 where
/// [`resident_half_grad_bytes_per_param`] is 0 (another optimizer).
///
/// `BF16_Optimizer.update_hp_grads` (`deepspeed/runtime/bf16_optimizer.py`), called by the
/// pipeline engine after every micro-batch's backward, runs
/// `hp_grad.data.add_(lp.grad.data.to(hp_grad.dtype).view(hp_grad.shape))` for each parameter
/// in turn: `.to(torch.float32)` materialises an fp32 copy of that gradient before the add, so
/// the largest one (the 250,880-row word embedding of BLOOM's first and last stages, `V/t · h`)
/// is held whole, 4 B per element ([`FP32_GRAD_COPY_BYTES_PER_PARAM`]). It comes while the other micro-batches' activations are
/// alive, and no block the caching allocator freed from the backward's working set is that
/// large, so it is counted on top of the working set ([`RankMemory::transient_bytes`]).
pub fn hp_grad_cast_bytes(
    stack: StackMemory,
    zero_stage: u8,
    fp32_main_grads: bool,
    largest_params: u64,
) -> u64 {
    if resident_half_grad_bytes_per_param(stack, zero_stage, fp32_main_grads) > 0 {
        largest_params * FP32_GRAD_COPY_BYTES_PER_PARAM
    } else {
        0
    }
}

/// Everything besides the stages that decides a rank's memory.
#[derive(Debug, Clone, Copy)]
pub struct MemoryContext {
    /// ZeRO stage.
    pub zero_stage: u8,
    /// Members the ZeRO states are sharded over (`dp · cp`).
    pub zero_shard: u64,
    /// Members the routed experts' ZeRO states are sharded over: the expert-data-parallel
    /// degree `tp · cp · dp / (ep · etp)` ([`crate::ExpertParallel::expert_dp`]).
    pub expert_zero_shard: u64,
    /// Number of communicator groups of size > 1 this rank is in (tp, cp, dp, pp).
    pub comm_groups: u64,
    /// The reserve, bytes.
    pub reserve_bytes: u64,
    /// Gradients are kept in fp32 (see [`model_state_bytes_for`]).
    pub fp32_main_grads: bool,
    /// Bytes per transformer-block parameter of the FP8 weight copies the precision keeps
    /// ([`autopp_hardware::Precision::fp8_weight_copy_bytes_per_param`]; 0 outside FP8, and 0
    /// with FP8 parameters, whose FP8 weight and transpose take the 16-bit weight's 2 B:
    /// [`crate::config::Runtime::fp8_params`]).
    pub fp8_copy_bytes_per_param: u64,
    /// The stack's memory facts.
    pub stack: StackMemory,
    /// What the optimizer keeps per parameter ([`crate::runtime::OptimizerStates`]).
    pub optimizer_states: crate::runtime::OptimizerStates,
    /// Pipeline ranks (`pp`): under a pipeline some stacks keep FSDP's stage unsharded
    /// ([`StackMemory::pipelined_fsdp`]).
    pub pp: u64,
}

/// One rank's memory given its stages and the simulated peak of its in-flight activations.
pub fn rank_memory(
    stages: &[&StageCost],
    peak_activation_bytes: u64,
    ctx: &MemoryContext,
) -> RankMemory {
    let params = rank_params(stages);
    let experts: u64 = stages.iter().map(|s| s.expert_params).sum();
    let fsdp = ctx.stack.fsdp && ctx.zero_stage >= 3 && experts == 0;
    let (mut weights, mut grads, optimizer) = if fsdp {
        fsdp_state_bytes(params, ctx.zero_shard)
    } else {
        model_state_bytes_for(
            params - experts.min(params),
            ctx.zero_stage,
            ctx.zero_shard,
            ctx.fp32_main_grads,
        )
    };
    let (ew, eg, eo) = model_state_bytes_for(
        experts,
        ctx.zero_stage,
        ctx.expert_zero_shard.max(1),
        ctx.fp32_main_grads,
    );
    weights += ew;
    // FP8 copies of the blocks' weights (and their transposes), beside the 16-bit weights
    if !ctx.stack.fp8_cast_per_use {
        weights +=
            ctx.fp8_copy_bytes_per_param * stages.iter().map(|s| s.block_params).sum::<u64>();
    }
    let mut optimizer = optimizer + eo;
    // states lighter than fp32 master weights and moments (NeMo 1.x's Apex optimizer); FSDP's
    // sharded fp32 parameters are their own master weights
    let dense_states = if fsdp {
        0
    } else {
        params - experts.min(params)
    };
    optimizer = optimizer.saturating_sub(
        optimizer_states_saving_bytes(
            dense_states,
            ctx.zero_stage,
            ctx.zero_shard,
            ctx.optimizer_states,
        ) + optimizer_states_saving_bytes(
            experts,
            ctx.zero_stage,
            ctx.expert_zero_shard,
            ctx.optimizer_states,
        ),
    );
    grads += eg;
    // 16-bit gradients kept beside the fp32 ones (DeepSpeed's BF16_Optimizer)
    grads +=
        params * resident_half_grad_bytes_per_param(ctx.stack, ctx.zero_stage, ctx.fp32_main_grads);
    // the fp32 gradient copy of 16-bit gradients, made at the step (see StackMemory)
    let step = if ctx.stack.grad_copy_at_step && !ctx.fp32_main_grads && !fsdp {
        let copy = |params: u64, shard: u64| fp32_grad_copy_bytes(params, ctx.zero_stage, shard);
        copy(params - experts.min(params), ctx.zero_shard) + copy(experts, ctx.expert_zero_shard)
    } else {
        0
    };
    optimizer = optimizer.saturating_sub(step);
    let largest = stages.iter().map(|s| s.max_layer_params).max().unwrap_or(0);
    if ctx.stack.pipelined_fsdp(ctx.zero_stage, ctx.pp) {
        // the whole stage (routed experts included) unsharded for the iteration: its gradients
        // accumulated in fp32 in place of the sharded ones, beside the layer's 16-bit gradient
        // being added in; at ZeRO 3 its 16-bit weights too (ZeRO 2 counts them whole already)
        grads = params * GRAD_BYTES_PER_PARAM + largest * HALF_GRAD_BYTES_PER_PARAM;
        if ctx.zero_stage >= 3 {
            weights += params * WEIGHT_BYTES_PER_PARAM;
        }
    } else if fsdp {
        // the layer computed and the next, prefetched, unsharded in 16 bits; in the backward
        // one layer's unsharded gradient in 16 bits and its fp32 copy for the reduce-scatter
        weights += 2 * largest * WEIGHT_BYTES_PER_PARAM;
        grads += largest * (HALF_GRAD_BYTES_PER_PARAM + GRAD_BYTES_PER_PARAM);
    } else if ctx.zero_stage >= 3 {
        // The layer being computed and the next one, prefetched — at most the engine's limit
        // on live gathered parameters (DeepSpeed gathers per submodule and caps them).
        weights += (2 * largest).min(ZERO3_MAX_LIVE_PARAMS) * WEIGHT_BYTES_PER_PARAM;
    }
    let largest_tensor = stages
        .iter()
        .map(|s| s.largest_weight_params)
        .max()
        .unwrap_or(0);
    let transient = stages.iter().map(|s| s.transient_bytes).max().unwrap_or(0)
        + hp_grad_cast_bytes(
            ctx.stack,
            ctx.zero_stage,
            ctx.fp32_main_grads,
            largest_tensor,
        );
    // a send and a receive buffer in each direction for the largest boundary tensor
    let p2p = 4 * stages.iter().map(|s| s.output_bytes).max().unwrap_or(0);
    RankMemory {
        weights_bytes: weights,
        grads_bytes: grads,
        optimizer_bytes: optimizer,
        activations_bytes: peak_activation_bytes,
        transient_bytes: transient,
        buffers_bytes: p2p + ctx.comm_groups * NCCL_BUFFER_BYTES_PER_GROUP,
        step_bytes: step,
        reserve_bytes: ctx.reserve_bytes,
        fragmentation_bytes: fragmentation_bytes(peak_activation_bytes + transient, FRAGMENTATION),
        context_bytes: ctx.stack.context_bytes(),
        context_fitted: ctx.stack.fitted_context,
    }
}

#[cfg(test)]
mod tests;
