//! Expanding a [`TransformerSpec`] into per-GPU [`LayerCost`]s for one [`ShardSpec`].

use crate::layer::{
    ActivationBytes, Collective, CollectiveKind, LayerCost, LayerKind, Op, ShardSpec,
};
use crate::{ModelError, TransformerSpec};

/// Byte and element counts above this are rejected before they are computed, so that no count
/// overflows 64 bits.
const MAX_COUNT: u128 = 1 << 62;

impl TransformerSpec {
    /// Expands the model into its ordered layers for one GPU: index 0 the embedding, then each
    /// transformer layer, then the head (final norm + LM head + loss).
    pub fn layers(&self, shard: &ShardSpec) -> Result<Vec<LayerCost>, ModelError> {
        self.validate()?;
        check_shard(shard)?;
        let t = shard.tp;
        if !self.num_attention_heads.is_multiple_of(t) {
            return Err(ModelError::Shard(format!(
                "--tp {t} does not divide num_attention_heads = {}: choose a tensor-parallel degree that divides the head count",
                self.num_attention_heads
            )));
        }
        if !self.kv_heads().is_multiple_of(t) && !t.is_multiple_of(self.kv_heads()) {
            return Err(ModelError::Shard(format!(
                "--tp {t} and num_kv_heads = {} do not divide one another: choose a tensor-parallel degree that divides the key/value head count",
                self.kv_heads()
            )));
        }
        if !self.ffn().is_multiple_of(t) {
            return Err(ModelError::Shard(format!(
                "--tp {t} does not divide ffn_hidden_size = {}: choose a tensor-parallel degree that divides it",
                self.ffn()
            )));
        }
        if !self.seq_length.is_multiple_of(shard.cp) {
            return Err(ModelError::Shard(format!(
                "--cp {} does not divide seq_length = {}: choose a context-parallel degree that divides it",
                shard.cp, self.seq_length
            )));
        }
        self.check_magnitudes(shard)?;
        let mut out = Vec::with_capacity(self.num_layers as usize + 2);
        out.push(self.embedding_layer(shard));
        let block = self.transformer_layer(shard);
        for i in 0..self.num_layers {
            let mut layer = block.clone();
            layer.name = format!("layer {i}");
            out.push(layer);
        }
        out.push(self.head_layer(shard));
        Ok(out)
    }

    /// Rejects a micro-batch whose largest byte counts (the `a·s²` score matrices, the fp32
    /// logits, the stored activations) would not fit in 64 bits.
    fn check_magnitudes(&self, shard: &ShardSpec) -> Result<(), ModelError> {
        let w = |x: u64| u128::from(x);
        let tokens = w(shard.micro_batch_size) * w(self.seq_length / shard.cp);
        let e = w(shard.dtype_bytes);
        let v_pad = w(self.vocab_size).div_ceil(w(shard.vocab_pad_multiple.max(1)) * w(shard.tp))
            * w(shard.vocab_pad_multiple.max(1))
            * w(shard.tp);
        let scores = tokens * w(self.num_attention_heads) * w(self.seq_length) * (3 * e + 1);
        let logits = tokens * v_pad * (16 + e);
        let widths = 16 * w(self.hidden_size) + 2 * w(self.kv_width()) + 2 * w(self.ffn()) * 2;
        let activations = tokens * widths * e;
        if scores.max(logits).max(activations) > MAX_COUNT {
            return Err(ModelError::Shard(format!(
                "--mbs {} with seq_length = {} is too large to count in 64-bit bytes: use a smaller micro-batch or sequence",
                shard.micro_batch_size, self.seq_length
            )));
        }
        Ok(())
    }

    /// The sizes every layer shares: local tokens and sharding.
    fn dims(&self, shard: &ShardSpec) -> Dims {
        let t = shard.tp;
        let s_local = self.seq_length / shard.cp;
        Dims {
            b: shard.micro_batch_size,
            s: s_local,
            tokens: shard.micro_batch_size * s_local,
            h: self.hidden_size,
            t,
            sp_div: if shard.sequence_parallel { t } else { 1 },
            e: shard.dtype_bytes,
        }
    }

    /// One transformer block on one GPU: its ops ([`TransformerSpec::transformer_ops`]), the
    /// activations it stores ([`TransformerSpec::transformer_activations`]), its
    /// tensor-parallel collectives and what it sends to the next stage.
    fn transformer_layer(&self, shard: &ShardSpec) -> LayerCost {
        let d = self.dims(shard);
        let ops = self.transformer_ops(shard);
        let (activation_bytes, weight_grad_bytes) = self.transformer_activations(shard);
        // Tensor-parallel collectives: 2 in forward, 2 in backward, each of a `2bsh` tensor
        // (all-reduce; sequence parallel: all-gather + reduce-scatter of the same volume).
        let act_bytes_full = d.tokens * d.h * d.e;
        let (tp_forward, tp_backward) = tp_pairs(d.t, shard.sequence_parallel, act_bytes_full);
        LayerCost {
            name: String::from("layer"),
            kind: LayerKind::Transformer,
            params_total: self.layer_params(),
            params: self.layer_params_per_gpu(d.t),
            tied_params: 0,
            forward_ops: ops.forward,
            backward_input_ops: ops.backward_input,
            backward_weight_ops: ops.backward_weight,
            selective_recompute_ops: ops.selective_recompute,
            tp_forward,
            tp_backward,
            activation_bytes,
            weight_grad_bytes,
            output_bytes: d.tokens * d.h * d.e / d.t,
            recomputable: true,
        }
    }

    /// The ops of one transformer block on one GPU: its four GEMMs (QKV, output projection, MLP
    /// up with the gate, MLP down), the attention core and the element-wise traffic of the
    /// forward, backward-input and backward-weight passes, and what selective recompute reruns.
    fn transformer_ops(&self, shard: &ShardSpec) -> BlockOps {
        let d = self.dims(shard);
        let (b, s, tok, h, t, e) = (d.b, d.s, d.tokens, d.h, d.t, d.e);
        let a = self.num_attention_heads;
        let s_k = self.seq_length;
        let f = self.ffn();
        let mlp_in_width = self.mlp_in_width();
        let qkv_local = h / t + 2 * self.kv_width_per_gpu(t);
        let gemms = [
            // QKV projection: [T × h]·[h × (h/t + 2·kv_local)]
            (tok, qkv_local, h),
            // output projection: [T × h/t]·[h/t × h]
            (tok, h, h / t),
            // MLP up (and gate): [T × h]·[h × f_in/t]
            (tok, mlp_in_width / t, h),
            // MLP down: [T × f/t]·[f/t × h]
            (tok, h, f / t),
        ];
        let gemm_ops: Vec<Op> = gemms
            .iter()
            .map(|&(m, n, k)| Op::Gemm { m, n, k, count: 1 })
            .collect();
        let attn = |backward: bool| Op::Attention {
            batch_heads: b * a / t,
            seq_q: s,
            seq_k: s_k,
            head_dim: h / a,
            causal: true,
            backward,
            fused: shard.flash_attention,
        };
        // Element-wise traffic (bytes read + written): two norms, two bias-dropout-adds, the
        // activation function; unfused softmax traffic when the attention core is not fused.
        let rows = tok / d.sp_div;
        let norm_bytes = 2 * (2 * rows * h * e);
        let residual_bytes = 2 * (3 * rows * h * e + rows * h);
        let act_bytes = (mlp_in_width + f) / t * tok * e;
        let softmax_bytes = if shard.flash_attention {
            0
        } else {
            // read scores, write probabilities, dropout mask and output
            (b * a / t) * s * s_k * (2 * e + 1 + e)
        };
        let elementwise_fwd = norm_bytes + residual_bytes + act_bytes + softmax_bytes;

        let mut forward = gemm_ops.clone();
        forward.insert(1, attn(false));
        forward.push(Op::Elementwise {
            bytes: elementwise_fwd,
        });
        let mut backward_input = gemm_ops.clone();
        backward_input.insert(1, attn(true));
        backward_input.push(Op::Elementwise {
            bytes: 2 * elementwise_fwd,
        });
        let mut selective_recompute = vec![attn(false)];
        if softmax_bytes > 0 {
            selective_recompute.push(Op::Elementwise {
                bytes: softmax_bytes,
            });
        }
        BlockOps {
            forward,
            backward_input,
            backward_weight: gemm_ops,
            selective_recompute,
        }
    }

    /// The bytes one transformer block stores for its backward under each recompute mode, and
    /// the weight-gradient working set a split backward keeps from `I` to `W` (GEMM inputs and
    /// output gradients).
    ///
    /// Stored activations (Korthikanti et al. 2022, §4.1, per micro-batch, `e`-byte elements):
    /// * replicated over `t` (sharded only with sequence parallelism): both norm inputs `2·2sbh`,
    ///   the QKV and MLP inputs `2·2sbh`, and the two dropout masks `2·sbh` (1 byte each) — the
    ///   `10·sbh` of Table 2;
    /// * sharded over `t`: Q, K, V `2·sb·(h + 2·g·h/a)`, the output-projection input `2sbh`, the
    ///   MLP activation input and output `2·2sbf` (gated: `3·2sbf`) — the `24·sbh/t` of Table 2
    ///   when `g = a`, `f = 4h`;
    /// * the attention core, sharded over `t`: softmax output `2as²b`, its dropout mask `as²b` and
    ///   dropout output `2as²b` — the `5as²b/t` term; a fused kernel stores none of it (only the
    ///   fp32 softmax statistics `4·a·s·b`), and selective recompute drops it.
    ///
    /// Full recompute keeps only the layer input `2sbh` (`/t` with sequence parallelism).
    ///
    /// When `t` exceeds the key/value heads `g`, each GPU computes and keeps one replicated
    /// key/value head (width `h/a`) instead of `g·(h/a)/t`.
    fn transformer_activations(&self, shard: &ShardSpec) -> (ActivationBytes, u64) {
        let d = self.dims(shard);
        let (b, s, h, t, e) = (d.b, d.s, d.h, d.t, d.e);
        let a = self.num_attention_heads;
        let s_k = self.seq_length;
        let f = self.ffn();
        let mlp_in_width = self.mlp_in_width();
        let sbh = s * b * h;
        let qkv_local = h / t + 2 * self.kv_width_per_gpu(t);
        let mask = u64::from(self.dropout);
        // norm inputs (2), QKV and MLP inputs (2) in `e` bytes; dropout masks (2) in 1 byte
        let replicated = 4 * sbh * e + 2 * mask * sbh;
        // Q, K, V; output-projection input; MLP activation input and output
        let sharded = (s * b * qkv_local + sbh / t + s * b * (mlp_in_width + f) / t) * e;
        let scores = a * s * s_k * b / t;
        let core = if shard.flash_attention {
            4 * a * s * b / t
        } else if self.dropout {
            // softmax output, dropout mask (1 byte), dropout output
            scores * (2 * e + 1)
        } else {
            scores * e
        };
        let replicated_local = replicated / d.sp_div;
        let activations = ActivationBytes {
            none: replicated_local + sharded + core,
            selective: replicated_local + sharded,
            full: sbh * e / d.sp_div,
        };
        // Weight-gradient working set (split backward): GEMM inputs and output gradients.
        let gemm_inputs = (2 * sbh / d.sp_div + sbh / t + s * b * f / t) * e;
        let out_grads = (s * b * qkv_local + 2 * sbh / d.sp_div + s * b * mlp_in_width / t) * e;
        (activations, gemm_inputs + out_grads)
    }

    /// The embedding layer on one GPU: a vocabulary-parallel table (padded vocabulary over `t`),
    /// positions replicated. Keeps the token ids (int64) and the embedding dropout mask.
    fn embedding_layer(&self, shard: &ShardSpec) -> LayerCost {
        let d = self.dims(shard);
        let (tok, h, t, e) = (d.tokens, d.h, d.t, d.e);
        let v_pad = shard.padded_vocab(self.vocab_size);
        let pos = self.position_table_rows() * h;
        let out_bytes = tok * h * e;
        let kept = 8 * tok + if self.dropout { tok * h / d.sp_div } else { 0 };
        let tp_forward = if t > 1 {
            vec![Collective {
                kind: if shard.sequence_parallel {
                    CollectiveKind::ReduceScatter
                } else {
                    CollectiveKind::AllReduce
                },
                bytes: out_bytes,
            }]
        } else {
            Vec::new()
        };
        LayerCost {
            name: String::from("embedding"),
            kind: LayerKind::Embedding,
            params_total: self.embedding_params(),
            params: v_pad * h / t + pos,
            tied_params: 0,
            forward_ops: vec![Op::Elementwise {
                bytes: 2 * out_bytes,
            }],
            backward_input_ops: Vec::new(),
            backward_weight_ops: vec![Op::Elementwise {
                bytes: 3 * out_bytes,
            }],
            selective_recompute_ops: Vec::new(),
            tp_forward,
            tp_backward: Vec::new(),
            activation_bytes: ActivationBytes {
                none: kept,
                selective: kept,
                full: kept,
            },
            weight_grad_bytes: 8 * tok + out_bytes / d.sp_div,
            output_bytes: out_bytes / t,
            recomputable: false,
        }
    }

    /// The head on one GPU: final norm, vocabulary-parallel LM head `[T × h]·[h × V/t]`, and the
    /// cross-entropy in fp32. Keeps the norm input, the head input and the fp32 logits
    /// `4·s·b·V/t` (Korthikanti et al. 2022, §4.3).
    fn head_layer(&self, shard: &ShardSpec) -> LayerCost {
        let d = self.dims(shard);
        let (tok, h, t, e) = (d.tokens, d.h, d.t, d.e);
        let v_pad = shard.padded_vocab(self.vocab_size);
        let v_local = v_pad / t;
        let logits_fp32 = 4 * tok * v_local;
        let gemm = Op::Gemm {
            m: tok,
            n: v_local,
            k: h,
            count: 1,
        };
        let norm_bytes = 2 * tok * h * e / d.sp_div;
        // cross-entropy: cast logits to fp32, max, exp-sum, and the gradient write
        let ce_bytes = tok * v_local * e + 3 * logits_fp32;
        // final-norm input and head input (sharded with sequence parallelism), fp32 logits
        let kept = 2 * (tok * h * e / d.sp_div) + logits_fp32;
        let head_input = tok * h * e;
        let mut tp_forward = Vec::new();
        let mut tp_backward = Vec::new();
        if t > 1 {
            if shard.sequence_parallel {
                tp_forward.push(Collective {
                    kind: CollectiveKind::AllGather,
                    bytes: head_input,
                });
                tp_backward.push(Collective {
                    kind: CollectiveKind::ReduceScatter,
                    bytes: head_input,
                });
            } else {
                tp_backward.push(Collective {
                    kind: CollectiveKind::AllReduce,
                    bytes: head_input,
                });
            }
            // cross-entropy: max, sum of exponentials, target logit (fp32 per token)
            for _ in 0..3 {
                tp_forward.push(Collective {
                    kind: CollectiveKind::AllReduce,
                    bytes: 4 * tok,
                });
            }
        }
        let head_weights = v_pad * h / t;
        LayerCost {
            name: String::from("head"),
            kind: LayerKind::Head,
            params_total: self.head_params(),
            params: self.norm_params()
                + if self.tied_embeddings {
                    0
                } else {
                    head_weights
                },
            tied_params: if self.tied_embeddings {
                head_weights
            } else {
                0
            },
            forward_ops: vec![
                Op::Elementwise { bytes: norm_bytes },
                gemm,
                Op::Elementwise { bytes: ce_bytes },
            ],
            backward_input_ops: vec![
                Op::Elementwise {
                    bytes: 2 * logits_fp32,
                },
                gemm,
                Op::Elementwise {
                    bytes: 2 * norm_bytes,
                },
            ],
            backward_weight_ops: vec![gemm],
            selective_recompute_ops: Vec::new(),
            tp_forward,
            tp_backward,
            activation_bytes: ActivationBytes {
                none: kept,
                selective: kept,
                full: kept,
            },
            weight_grad_bytes: head_input / d.sp_div + tok * v_local * e,
            output_bytes: 0,
            recomputable: false,
        }
    }
}

/// Tensor-parallel collectives of one transformer block: forward and backward each have two of a
/// `bytes`-sized activation (all-reduce, or with sequence parallelism an all-gather and a
/// reduce-scatter per pair).
fn tp_pairs(t: u64, sequence_parallel: bool, bytes: u64) -> (Vec<Collective>, Vec<Collective>) {
    if t <= 1 {
        return (Vec::new(), Vec::new());
    }
    let pair = |kind| Collective { kind, bytes };
    if sequence_parallel {
        let both = vec![
            pair(CollectiveKind::AllGather),
            pair(CollectiveKind::ReduceScatter),
            pair(CollectiveKind::AllGather),
            pair(CollectiveKind::ReduceScatter),
        ];
        (both.clone(), both)
    } else {
        let ar = vec![
            pair(CollectiveKind::AllReduce),
            pair(CollectiveKind::AllReduce),
        ];
        (ar.clone(), ar)
    }
}

/// The ops of one transformer block's passes (see [`TransformerSpec::transformer_ops`]).
struct BlockOps {
    forward: Vec<Op>,
    backward_input: Vec<Op>,
    backward_weight: Vec<Op>,
    selective_recompute: Vec<Op>,
}

/// Local sizes shared by a model's layers.
struct Dims {
    b: u64,
    s: u64,
    tokens: u64,
    h: u64,
    t: u64,
    sp_div: u64,
    e: u64,
}

/// Largest tensor-parallel / context-parallel degree, vocabulary padding multiple and dtype
/// width a [`ShardSpec`] may ask for.
const MAX_SHARD_VALUE: u64 = 1 << 20;

/// Rejects a shard spec with zero or absurdly large sizes; errors name the flag.
pub(crate) fn check_shard(shard: &ShardSpec) -> Result<(), ModelError> {
    for (flag, v) in [
        ("--mbs", shard.micro_batch_size),
        ("--tp", shard.tp),
        ("--cp", shard.cp),
    ] {
        if v == 0 {
            return Err(ModelError::Shard(format!("{flag} must be at least 1")));
        }
    }
    if shard.dtype_bytes == 0 {
        return Err(ModelError::Shard(
            "dtype must have at least one byte".into(),
        ));
    }
    for (flag, v) in [
        ("--mbs", shard.micro_batch_size),
        ("--tp", shard.tp),
        ("--cp", shard.cp),
        ("the vocabulary padding multiple", shard.vocab_pad_multiple),
        ("the dtype width in bytes", shard.dtype_bytes),
    ] {
        if v > MAX_SHARD_VALUE {
            return Err(ModelError::Shard(format!(
                "{flag} = {v} is too large: at most {MAX_SHARD_VALUE}"
            )));
        }
    }
    Ok(())
}
