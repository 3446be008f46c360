//! What torchtitan's PyTorch-native layers hold and move beyond Megatron's: its loss (eager or
//! compiled), its op-level selective activation checkpointing, and DTensor's tensor-parallel
//! collectives (their layout copies, float8 all-gathers).

use autopp_hardware::{AnalyticProfile, Precision};
use autopp_models::{Collective, CollectiveKind, LayerCost};

/// The logits the head's vocabulary GEMM writes on one GPU (`tokens · V/t`).
fn head_logits(head: &LayerCost) -> u64 {
    use autopp_models::Op;
    head.forward_ops
        .iter()
        .map(|op| match *op {
            Op::Gemm {
                m,
                n,
                count,
                linear: false,
                ..
            } => m * n * count,
            _ => 0,
        })
        .max()
        .unwrap_or(0)
}

/// How torchtitan's cross-entropy runs, which sets what the head keeps and the loss's backward
/// working set ([`torch_loss_bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TorchLoss {
    /// Eager `F.cross_entropy` on the whole vocabulary (no tensor parallelism): ATen's fused
    /// `log_softmax` and `nll_loss` kernels ([`unfused_loss_bytes`]).
    Eager,
    /// Eager, under DTensor's `loss_parallel` over a vocabulary sharded by tensor parallelism
    /// (torchtitan's default whenever tp > 1: `loss_parallel_enabled = tp_enabled and not
    /// disable_loss_parallel`). `torch.distributed.tensor.parallel.loss` replaces the kernels
    /// by Python handlers: the backward (`_nll_loss_and_log_softmax_backward`) builds
    /// `zeros_like(x)`, scatters the targets into it and returns `(grad_input + exp(x)) *
    /// grad_output`, three fp32 tensors of the local logits at once — 12 B per logit beside the
    /// kept log-probabilities, where ATen's backward needs 8.
    LossParallel,
    /// Compiled by `torch.compile` with the blocks ([`crate::config::Runtime::compiled_loss`]):
    /// Inductor fuses the cast, log-softmax and NLL.
    Compiled,
}

impl TorchLoss {
    /// The loss of a torchtitan run: compiled when `compiled_loss`, else loss-parallel when the
    /// vocabulary is sharded over `tp > 1` GPUs, else eager. A compiled loss under tensor
    /// parallelism keeps the compiled figures (both read the sharded logits; no published run
    /// measures the pair).
    pub fn of(compiled_loss: bool, tp: u64) -> Self {
        match (compiled_loss, tp > 1) {
            (true, _) => Self::Compiled,
            (false, true) => Self::LossParallel,
            (false, false) => Self::Eager,
        }
    }
}

/// The backward's working set at the loss under PyTorch's unfused cross-entropy, bytes: 8 B per
/// logit on one GPU. torchtitan casts the logits to fp32 and calls `F.cross_entropy`
/// (`log_softmax` then `nll_loss`); `log_softmax` keeps its fp32 output (the 4 B per logit the
/// head already stores), and its backward holds the incoming fp32 gradient and writes an fp32
/// gradient of its input beside it. Megatron's fused vocabulary-parallel cross-entropy works in
/// place and needs none of this. Under DTensor's loss parallelism the working set is larger
/// ([`TorchLoss::LossParallel`], [`torch_loss_bytes`]).
pub fn unfused_loss_bytes(head: &LayerCost) -> u64 {
    8 * head_logits(head)
}

/// The head's activations and the loss's backward working set under torchtitan, bytes:
/// `(kept, transient)`, by [`TorchLoss`]. Eager: the head's own figures and
/// [`unfused_loss_bytes`]. Loss-parallel: the same kept figures and 12 B per local logit
/// (`zeros_like`, `exp` and their sum, then the sum and its product with the incoming
/// gradient). Compiled: Inductor fuses the fp32 cast, log-softmax and NLL into kernels that
/// read the 16-bit logits and keep only a per-token log-sum-exp; the backward recomputes the
/// softmax from the saved 16-bit logits and writes their 16-bit gradient in one kernel. The
/// head then keeps 2 B per logit where it kept the fp32 log-probabilities (4 B), and the loss's
/// working set is that one 16-bit gradient, 2 B per logit, where it was 8.
pub fn torch_loss_bytes(head: &LayerCost, kept: u64, loss: TorchLoss) -> (u64, u64) {
    let logits = head_logits(head);
    match loss {
        TorchLoss::Eager => (kept, unfused_loss_bytes(head)),
        TorchLoss::LossParallel => (kept, 12 * logits),
        TorchLoss::Compiled => (kept.saturating_sub(2 * logits), 2 * logits),
    }
}

/// The bytes a dense transformer block keeps under torchtitan's op-level selective activation
/// checkpointing (`selective_ac_option = "op"`, torchtitan
/// `models/llama3/infra/parallelize.py`, `_apply_ac_to_transformer_block`): the block's input
/// (the checkpoint's input, `full`), and the outputs of the ops on its save list — the
/// attention kernel's output (`b·s·h_q` 16-bit values and the fp32 log-sum-exp per head and
/// token) and the odd-numbered `aten.mm`s ("Saves output of all compute ops, except every
/// second mm"). The counter starts afresh at each block's forward (`selective_checkpointing_context_fn`
/// makes a new `meta = defaultdict(int)` per checkpoint call), and a Llama block multiplies `wq,
/// wk, wv, wo, w1, w3, w2` (a plain MLP `w1, w2`) in that order: the 1st, 3rd, 5th and 7th are
/// saved — `wq`, `wv`, `w1` and `w2` ([`op_sac_saved_widths`]). With one `wqkv` GEMM
/// (`fused_qkv`, torchtitan from April 2026, [`crate::runtime::SelectiveRecompute`]) the block
/// multiplies `wqkv, wo, w1, w3, w2`: `wqkv`, `w1` and `w2` are saved. Everything else is
/// recomputed in the backward. 16-bit outputs (bf16 autocast; float8 linears also return bf16).
///
/// Eager PyTorch keeps every saved output (`_CachingTorchDispatchMode` caches each `MUST_SAVE`
/// op's output whether the backward reads it or not). Under `torch.compile` (`compiled`) the
/// partitioner keeps only what the backward graph reads: `w2`'s output feeds the residual add
/// alone, whose gradient needs no tensor, so it is not kept.
pub fn op_sac_bytes(layer: &LayerCost, compiled: bool, fused_qkv: bool) -> u64 {
    use autopp_models::Op;
    let mut linear = Vec::new();
    let mut attention = 0;
    for op in &layer.forward_ops {
        match *op {
            Op::Gemm {
                m,
                n,
                k,
                count,
                linear: true,
            } => linear.push((m * count, n, k)),
            Op::Attention {
                batch_heads,
                seq_q,
                head_dim,
                ..
            } => attention += batch_heads * seq_q * (2 * head_dim + 4),
            _ => {}
        }
    }
    let saved = match op_sac_saved_widths(&linear, fused_qkv) {
        Some((rows, eager, unread)) => {
            let widths = if compiled { eager - unread } else { eager };
            2 * rows * widths
        }
        // a block of another shape (latent attention's six or seven projections): an
        // approximation, half of its GEMMs' outputs at 2 B each, compiled or not
        None => linear.iter().map(|&(m, n, _)| m * n).sum(),
    };
    layer.activation_bytes.full + saved + attention
}

/// For a dense block's four linear GEMMs `[(rows, n, k)]` in forward order — the fused QKV
/// projection, the output projection (whose `k` is the query width), the MLP's (gated: fused
/// gate and up) input and its output — the rows (tokens on the GPU), the per-token widths in
/// elements that torchtitan's op-level checkpoint saves (the odd-numbered matmuls: `wq`, `wv`,
/// `w1`, and `w2` when it is the 7th; with `fused_qkv`, `wqkv`, `w1`, and `w2` when it is the
/// 5th) and the width of those the backward never reads (`w2`'s output, when saved). `None`
/// for any other shape.
pub fn op_sac_saved_widths(linear: &[(u64, u64, u64)], fused_qkv: bool) -> Option<(u64, u64, u64)> {
    let &[(rows, qkv, _), (_, _, q), (_, mlp_in, _), (_, out, f)] = linear else {
        return None;
    };
    if rows == 0 || linear.iter().any(|l| l.0 != rows) || qkv < q {
        return None;
    }
    if !(qkv - q).is_multiple_of(2) {
        return None;
    }
    let kv = (qkv - q) / 2;
    // the matmuls' output widths in order: wq, wk, wv (or wqkv), wo, w1, (w3,) w2
    let mut widths = if fused_qkv {
        vec![qkv, out, f]
    } else {
        vec![q, kv, kv, out, f]
    };
    if mlp_in == 2 * f {
        widths.push(f);
    } else if mlp_in != f {
        return None;
    }
    widths.push(out);
    let saved: u64 = widths.iter().step_by(2).sum();
    let unread = if widths.len() % 2 == 1 { out } else { 0 };
    Some((rows, saved, unread))
}

/// Seconds of the copies DTensor adds beside the all-gathers and reduce-scatters of `list`
/// ([`crate::runtime::TpCollectives::Dtensor`]): sequence parallelism shards dimension 1 of
/// `[b, s, h]` while the collectives gather and scatter dimension 0, so each one is paired
/// with an `aten.cat` that reads and writes the whole (gathered) tensor, `2·S` bytes of HBM
/// traffic (torchtitan PR #437). All-reduces need no copy.
pub fn layout_copies_s(profile: &AnalyticProfile, list: &[Collective]) -> f64 {
    list.iter()
        .filter(|c| {
            matches!(
                c.kind,
                CollectiveKind::AllGather | CollectiveKind::ReduceScatter
            )
        })
        .map(|c| profile.memory_bound_time_s(2.0 * c.bytes as f64))
        .sum()
}

/// A layer's forward tensor-parallel collectives as DTensor runs them (`dtensor`: a
/// transformer block under [`crate::runtime::TpCollectives::Dtensor`]): under float8 with
/// tensorwise scaling torchtitan's blocks use torchao's `Float8ColwiseParallel` and
/// `PrepareFloat8ModuleInput`, which cast the sequence shard to float8 before gathering it,
/// so each forward all-gather moves 1 byte per element instead of 2; rowwise scaling keeps
/// DTensor's plain styles and gathers in bf16 (torchtitan `models/llama3/infra/parallelize.py`:
/// "float8 all-gather with TP is only supported for tensorwise float8 scaling recipes. For
/// rowwise recipes, we use regular TP and all-gather happens in high precision"). The
/// reduce-scatters (bf16 outputs) are unchanged.
pub fn dtensor_forward_collectives(
    layer: &LayerCost,
    precision: Precision,
    dtensor: bool,
) -> std::borrow::Cow<'_, [Collective]> {
    float8_gathers(&layer.tp_forward, precision, dtensor)
}

/// A layer's backward tensor-parallel collectives as DTensor runs them (`dtensor` as in
/// [`dtensor_forward_collectives`]). Under float8 with tensorwise scaling the row-parallel
/// linears (`attention.wo`, `feed_forward.w2`) are torchao's `Float8RowwiseParallel`, whose
/// output goes through `_NoopFwToFloat8BwDynamic` after its reduce-scatter: in the backward the
/// output gradient is cast to float8 (e5m2) first, so the all-gather that is the
/// reduce-scatter's backward moves 1 byte per element. The reduce-scatters of the backward
/// (the gradients of the gathered inputs, which leave the float8 linears in bf16) stay 2 bytes;
/// rowwise scaling gathers in bf16 (torchao `float8/float8_tensor_parallel.py`).
pub fn dtensor_backward_collectives(
    layer: &LayerCost,
    precision: Precision,
    dtensor: bool,
) -> std::borrow::Cow<'_, [Collective]> {
    float8_gathers(&layer.tp_backward, precision, dtensor)
}

/// `list` with each all-gather at 1 byte per element where DTensor gathers float8 (`dtensor`
/// under tensorwise float8), else `list` as it is.
fn float8_gathers(
    list: &[Collective],
    precision: Precision,
    dtensor: bool,
) -> std::borrow::Cow<'_, [Collective]> {
    if !(dtensor && precision == Precision::Fp8Tensorwise) {
        return std::borrow::Cow::Borrowed(list);
    }
    let fp8 = |c: &Collective| Collective {
        bytes: if c.kind == CollectiveKind::AllGather {
            c.bytes / precision.bytes()
        } else {
            c.bytes
        },
        ..*c
    };
    std::borrow::Cow::Owned(list.iter().map(fp8).collect())
}

/// The bytes a layer keeps beyond Megatron's figures because DTensor's sequence-parallel
/// linears save the gathered input, bytes: `forward` the layer's forward tensor-parallel
/// collectives as DTensor runs them ([`dtensor_forward_collectives`]), `original` the layer's
/// own (16-bit) ones. Megatron's column-parallel linear keeps its sequence shard and gathers
/// it again in the backward (`LinearWithGradAccumulationAndAsyncCommunication`), which the
/// layer's stored figures count (`2·s·b·h/t` per gathered input, Korthikanti et al. 2022,
/// Table 2). Under DTensor the all-gather is an op of its own before the linears
/// (`PrepareModuleInput` to `Replicate()`, `ColwiseParallel` over `SequenceParallel` norms in
/// torchtitan's plan), so autograd saves the gathered tensor the linears read: the attention's
/// and the MLP's inputs in a block, the final norm's output at the head — in 16 bits, or in
/// float8 where tensorwise scaling gathers float8 (`Float8ColwiseParallel`). Each gather then
/// keeps its whole size where the layer counted a `1/tp` share of the 16-bit tensor. 0 with no
/// all-gather (no sequence parallelism: the layer already counts its inputs whole).
pub fn dtensor_gathered_input_bytes(
    forward: &[Collective],
    original: &[Collective],
    tp: u64,
) -> u64 {
    let gathers = |list: &[Collective]| {
        list.iter()
            .filter(|c| c.kind == CollectiveKind::AllGather)
            .map(|c| c.bytes)
            .collect::<Vec<u64>>()
    };
    gathers(forward)
        .iter()
        .zip(gathers(original))
        .map(|(kept, whole)| kept.saturating_sub(whole / tp.max(1)))
        .sum()
}
