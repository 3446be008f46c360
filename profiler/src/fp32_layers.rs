//! Bytes that autopp's own layer implementation — the fp32 CPU device layer the executor runs
//! (`autopp_profiler::device`) — keeps for backward, per layer and micro-batch.
//!
//! These are derived from that implementation's definitions (which tensors each layer's
//! forward saves, and which its backward-input hands to its backward-weight), not measured;
//! the executor measures the same quantity at run time and its tests require the two to
//! agree. For a micro-batch of `b` sequences of `s` tokens (`T = b·s`), hidden `h`, FFN `f`,
//! `a` heads and vocabulary `V`, at 4 bytes per element:
//!
//! | layer | kept from `F` to `B` (or `I`) | kept from `I` to `W` |
//! |---|---|---|
//! | embedding | the token ids: `T` (4-byte ids) | the ids and the output gradient: `T + T·h` |
//! | block | `T·(8h + 2f + 2) + b·a·s²` | `T·(12h + 2f)` |
//! | head | `T·(2h + V + 1)` floats and `T` target ids | `T·(3h + V)` |
//!
//! A block's forward keeps both LayerNorms' `x̂` (`T·h` each) and `1/σ` (`T` each), the inputs
//! of its four linear layers (`LN₁(x)`, the attention output, `LN₂(x₂)`: `T·h` each; the GeLU
//! output: `T·f`), the fused `[Q | K | V]` (`3·T·h`), the GeLU input (`T·f`) and the attention
//! probabilities (`b·a·s²`). Its backward-weight needs each linear layer's input and output
//! gradient (`T·h + 3T·h`, `T·h + T·h`, `T·h + T·f`, `T·f + T·h`) and each norm's `x̂` and output
//! gradient (`2·T·h` twice). The head keeps the final norm's `x̂` and `1/σ`, the LM head's input,
//! the softmax probabilities (`T·V`) and the targets; its backward-weight needs `x̂`, the norm's
//! output gradient, the LM head's input and `dlogits` (`T·V`).
//!
//! The executor implements multi-head attention (no grouped-query), LayerNorm and a plain GeLU
//! MLP only, so these counts are for that subset.

use serde::Serialize;

use autopp_models::TransformerSpec;

/// Bytes per element of the executor's tensors (fp32), and of its token ids (`u32`).
pub const FP32_BYTES: u64 = 4;

/// What one layer of the executor's fp32 implementation keeps for one micro-batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Fp32LayerBytes {
    /// Bytes its forward keeps for the backward (held from `F` to `B`, or to `I`).
    pub activation_bytes: u64,
    /// Bytes its backward-input keeps for its backward-weight (held from `I` to `W`).
    pub weight_grad_bytes: u64,
}

/// Per entry of the layer list of `spec` (embedding, each block, head), the bytes the
/// executor's fp32 layers keep for a micro-batch of `micro_batch_size` sequences of
/// `seq_length`.
pub fn fp32_layer_bytes(spec: &TransformerSpec, micro_batch_size: u64) -> Vec<Fp32LayerBytes> {
    fp32_layer_bytes_tp(spec, micro_batch_size, 1)
}

/// [`fp32_layer_bytes`] on tensor-parallel rank 0 of `tp` (the rank with the most: the
/// vocabulary splits in `⌈V/tp⌉` ids). A rank keeps the whole of what is replicated — the
/// norms' tensors, `LN(x)`, the residual-stream gradients — and `1/tp` of the rest: per block
/// `T·(4h + (4h + 2f)/tp + 2) + b·(a/tp)·s²` from `F`, `T·(8h + (4h + 2f)/tp)` from `I`; the
/// head's probabilities and `dlogits` are `T·⌈V/tp⌉`. `heads` and `ffn` divisible by `tp`.
pub fn fp32_layer_bytes_tp(
    spec: &TransformerSpec,
    micro_batch_size: u64,
    tp: u64,
) -> Vec<Fp32LayerBytes> {
    fp32_layer_bytes_sp(spec, micro_batch_size, tp, false)
}

/// [`fp32_layer_bytes_tp`], with sequence parallelism when `sp`: what a norm reads and writes
/// — its `x̂` and `rstd`, its output gradient — is the rank's `1/tp` of the tokens, while the
/// gathered norm outputs and the gathered gradients entering `proj`, `fc2` stay whole: per
/// block `T·(2h + 2(h + 1)/tp + (4h + 2f)/tp) + b·(a/tp)·s²` from `F` and
/// `T·(4h + 4h/tp + (4h + 2f)/tp)` from `I`; the head `T·((h + 1)/tp + h + ⌈V/tp⌉ + 1)` and
/// `T·(h + 2h/tp + ⌈V/tp⌉)`. The sequence length must be divisible by `tp`.
pub fn fp32_layer_bytes_sp(
    spec: &TransformerSpec,
    micro_batch_size: u64,
    tp: u64,
    sp: bool,
) -> Vec<Fp32LayerBytes> {
    if sp && tp > 1 {
        return sequence_parallel_bytes(spec, micro_batch_size, tp);
    }
    let e = FP32_BYTES;
    let tp = tp.max(1);
    let (b, s) = (micro_batch_size, spec.seq_length);
    let t = b * s;
    let (h, f, a, v) = (
        spec.hidden_size,
        spec.ffn(),
        spec.num_attention_heads,
        spec.vocab_size,
    );
    let embedding = Fp32LayerBytes {
        activation_bytes: e * t,
        weight_grad_bytes: e * (t + t * h),
    };
    let (split, v) = ((4 * h + 2 * f) / tp, v.div_ceil(tp));
    let block = Fp32LayerBytes {
        activation_bytes: e * (t * (4 * h + split + 2) + b * (a / tp) * s * s),
        weight_grad_bytes: e * t * (8 * h + split),
    };
    let head = Fp32LayerBytes {
        activation_bytes: e * (t * (2 * h + v + 1) + t),
        weight_grad_bytes: e * t * (3 * h + v),
    };
    let mut out = Vec::with_capacity(spec.num_layers as usize + 2);
    out.push(embedding);
    out.extend(std::iter::repeat_n(block, spec.num_layers as usize));
    out.push(head);
    out
}

fn sequence_parallel_bytes(
    spec: &TransformerSpec,
    micro_batch_size: u64,
    tp: u64,
) -> Vec<Fp32LayerBytes> {
    let e = FP32_BYTES;
    let (b, s) = (micro_batch_size, spec.seq_length);
    let t = b * s;
    let (h, f, a) = (spec.hidden_size, spec.ffn(), spec.num_attention_heads);
    let (split, v) = ((4 * h + 2 * f) / tp, spec.vocab_size.div_ceil(tp));
    let whole = fp32_layer_bytes_tp(spec, micro_batch_size, 1);
    let block = Fp32LayerBytes {
        activation_bytes: e * (t * 2 * h + t / tp * 2 * (h + 1) + t * split + b * (a / tp) * s * s),
        weight_grad_bytes: e * (t * 4 * h + t / tp * 4 * h + t * split),
    };
    let head = Fp32LayerBytes {
        activation_bytes: e * (t / tp * (h + 1) + t * (h + v) + t),
        weight_grad_bytes: e * (t * (h + v) + t / tp * 2 * h),
    };
    let mut out = Vec::with_capacity(whole.len());
    out.push(whole[0]);
    out.extend(std::iter::repeat_n(block, spec.num_layers as usize));
    out.push(head);
    out
}

#[cfg(test)]
mod tests {
    use super::fp32_layer_bytes;
    use autopp_models::{load, Model};

    #[test]
    fn tiny_gpt_hand_worked() {
        let Model::Transformer(t) = load("tiny-gpt").unwrap() else {
            panic!("tiny-gpt is a transformer")
        };
        let bytes = fp32_layer_bytes(&t, 1);
        assert_eq!(bytes.len(), 10);
        // T = 128, h = 128, f = 512, a = 4, V = 1024
        // embedding: 128 ids; 128 ids + 128·128 floats
        assert_eq!(bytes[0].activation_bytes, 512);
        assert_eq!(bytes[0].weight_grad_bytes, 4 * (128 + 16_384));
        // block: 128·(1024 + 1024 + 2) + 4·128² = 262,400 + 65,536 floats
        assert_eq!(bytes[1].activation_bytes, 4 * 327_936);
        // 128·(12·128 + 1024) = 327,680 floats
        assert_eq!(bytes[1].weight_grad_bytes, 4 * 327_680);
        // head: 128·(256 + 1024 + 1) floats + 128 ids
        assert_eq!(bytes[9].activation_bytes, 4 * (163_968 + 128));
        assert_eq!(bytes[9].weight_grad_bytes, 4 * 128 * (384 + 1024));
        // doubling the micro-batch doubles everything
        let two = fp32_layer_bytes(&t, 2);
        assert!(two
            .iter()
            .zip(&bytes)
            .all(|(x, y)| x.activation_bytes == 2 * y.activation_bytes
                && x.weight_grad_bytes == 2 * y.weight_grad_bytes));
    }
}
