//! Decoder-only transformers: the `model.json` description and its expansion into layers.
//!
//! Sources for every count here: parameters and FLOPs follow Narayanan et al. 2021 (SC21, §5.1,
//! the derivation of eq. 3); activation bytes follow Korthikanti et al. 2022 ("Reducing Activation
//! Recomputation in Large Transformer Models"), §4 and Table 2, generalised to grouped-query
//! attention, any FFN width and gated MLPs by counting the same stored tensors.

use serde::{Deserialize, Serialize};

use crate::layer::{
    ActivationBytes, Collective, CollectiveKind, LayerCost, LayerKind, Op, ShardSpec,
};
use crate::ModelError;

/// Which normalisation a transformer uses (LayerNorm has a weight and a bias, RMSNorm a weight).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Norm {
    /// LayerNorm: `2·h` parameters.
    #[default]
    Layernorm,
    /// RMSNorm: `h` parameters.
    Rmsnorm,
}

/// How positions enter the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum PositionEmbedding {
    /// No parameters (rotary, ALiBi, or none at all).
    #[default]
    None,
    /// A learned `seq_length × hidden_size` table (GPT-2, GPT-3, OPT).
    Learned,
}

fn default_true() -> bool {
    true
}

/// A decoder-only transformer as autopp's `model.json` describes it. Unknown keys are rejected.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransformerSpec {
    /// Model name, e.g. `gpt3-175b`.
    pub name: String,
    /// Transformer layers (`L`).
    pub num_layers: u64,
    /// Hidden size (`h`).
    pub hidden_size: u64,
    /// Attention heads (`a`).
    pub num_attention_heads: u64,
    /// Key/value heads (`g`); defaults to `num_attention_heads` (no grouped-query attention).
    #[serde(default)]
    pub num_kv_heads: Option<u64>,
    /// FFN hidden size (`f`); defaults to `4·hidden_size`.
    #[serde(default)]
    pub ffn_hidden_size: Option<u64>,
    /// Vocabulary size (`V`), unpadded.
    pub vocab_size: u64,
    /// Sequence length in tokens (`s`).
    pub seq_length: u64,
    /// Gated MLP (SwiGLU / GeGLU): three `h × f` matrices instead of two.
    #[serde(default)]
    pub gated_mlp: bool,
    /// The LM head shares the word-embedding matrix.
    #[serde(default = "default_true")]
    pub tied_embeddings: bool,
    /// Default global batch for planning, in sequences.
    #[serde(default)]
    pub global_batch_size: Option<u64>,
    /// Linear layers carry biases (GPT-2/3, OPT, BLOOM); Llama-style models have none.
    #[serde(default = "default_true")]
    pub bias: bool,
    /// Normalisation kind.
    #[serde(default)]
    pub norm: Norm,
    /// Position embedding kind.
    #[serde(default)]
    pub position_embedding: PositionEmbedding,
    /// Dropout is active in training, so its masks are stored (Korthikanti et al.'s counts
    /// assume it is).
    #[serde(default = "default_true")]
    pub dropout: bool,
}

impl TransformerSpec {
    /// Key/value heads (`g`).
    pub fn kv_heads(&self) -> u64 {
        self.num_kv_heads.unwrap_or(self.num_attention_heads)
    }

    /// FFN hidden size (`f`).
    pub fn ffn(&self) -> u64 {
        self.ffn_hidden_size.unwrap_or(4 * self.hidden_size)
    }

    /// Width of the key (or value) projection: `g·h/a`.
    pub fn kv_width(&self) -> u64 {
        self.kv_heads() * self.head_dim()
    }

    /// Hidden size per attention head: `h/a`.
    pub fn head_dim(&self) -> u64 {
        self.hidden_size / self.num_attention_heads.max(1)
    }

    /// Checks every size is positive and the shapes agree; errors name the key and the fix.
    pub fn validate(&self) -> Result<(), ModelError> {
        let positive = [
            ("num_layers", self.num_layers),
            ("hidden_size", self.hidden_size),
            ("num_attention_heads", self.num_attention_heads),
            ("vocab_size", self.vocab_size),
            ("seq_length", self.seq_length),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(ModelError::invalid(key, "must be at least 1"));
            }
        }
        if self.num_kv_heads == Some(0) {
            return Err(ModelError::invalid("num_kv_heads", "must be at least 1"));
        }
        if self.ffn_hidden_size == Some(0) {
            return Err(ModelError::invalid("ffn_hidden_size", "must be at least 1"));
        }
        if self.global_batch_size == Some(0) {
            return Err(ModelError::invalid("global_batch_size", "must be at least 1"));
        }
        if self.name.trim().is_empty() {
            return Err(ModelError::invalid("name", "must not be empty"));
        }
        if self.hidden_size % self.num_attention_heads != 0 {
            return Err(ModelError::invalid(
                "hidden_size",
                &format!(
                    "{} is not divisible by num_attention_heads = {}",
                    self.hidden_size, self.num_attention_heads
                ),
            ));
        }
        if self.num_attention_heads % self.kv_heads() != 0 {
            return Err(ModelError::invalid(
                "num_kv_heads",
                &format!(
                    "num_attention_heads = {} is not a multiple of num_kv_heads = {}",
                    self.num_attention_heads,
                    self.kv_heads()
                ),
            ));
        }
        Ok(())
    }

    /// Parameters of one norm: `2·h` (LayerNorm) or `h` (RMSNorm).
    fn norm_params(&self) -> u64 {
        match self.norm {
            Norm::Layernorm => 2 * self.hidden_size,
            Norm::Rmsnorm => self.hidden_size,
        }
    }

    /// Parameters of one transformer layer, unsharded: attention `h² + 2·h·(g·h/a) + h²`, MLP
    /// `2·h·f` (gated `3·h·f`), two norms, and biases when present.
    pub fn layer_params(&self) -> u64 {
        let h = self.hidden_size;
        let kv = self.kv_width();
        let f = self.ffn();
        let attn = h * h + 2 * h * kv + h * h;
        let mlp = if self.gated_mlp { 3 * h * f } else { 2 * h * f };
        let biases = if self.bias {
            let attn_bias = h + 2 * kv + h;
            let mlp_bias = if self.gated_mlp { 2 * f + h } else { f + h };
            attn_bias + mlp_bias
        } else {
            0
        };
        attn + mlp + biases + 2 * self.norm_params()
    }

    /// Parameters of the embedding layer: `V·h` (+ `s·h` for learned positions).
    pub fn embedding_params(&self) -> u64 {
        let pos = match self.position_embedding {
            PositionEmbedding::Learned => self.seq_length * self.hidden_size,
            PositionEmbedding::None => 0,
        };
        self.vocab_size * self.hidden_size + pos
    }

    /// Parameters of the head layer: the final norm, plus `V·h` when the head is untied.
    pub fn head_params(&self) -> u64 {
        let head = if self.tied_embeddings {
            0
        } else {
            self.vocab_size * self.hidden_size
        };
        self.norm_params() + head
    }

    /// Total parameters of the model (unpadded vocabulary, tied weights counted once).
    pub fn num_params(&self) -> u64 {
        self.embedding_params() + self.num_layers * self.layer_params() + self.head_params()
    }

    /// Expands the model into its ordered layers for one GPU: index 0 the embedding, then each
    /// transformer layer, then the head (final norm + LM head + loss).
    pub fn layers(&self, shard: &ShardSpec) -> Result<Vec<LayerCost>, ModelError> {
        self.validate()?;
        check_shard(shard)?;
        let t = shard.tp;
        if self.num_attention_heads % t != 0 {
            return Err(ModelError::Shard(format!(
                "--tp {t} does not divide num_attention_heads = {}: choose a tensor-parallel degree that divides the head count",
                self.num_attention_heads
            )));
        }
        if self.kv_heads() % t != 0 && t % self.kv_heads() != 0 {
            return Err(ModelError::Shard(format!(
                "--tp {t} and num_kv_heads = {} do not divide one another: choose a tensor-parallel degree that divides the key/value head count",
                self.kv_heads()
            )));
        }
        if self.ffn() % t != 0 {
            return Err(ModelError::Shard(format!(
                "--tp {t} does not divide ffn_hidden_size = {}",
                self.ffn()
            )));
        }
        if self.seq_length % shard.cp != 0 {
            return Err(ModelError::Shard(format!(
                "--cp {} does not divide seq_length = {}",
                shard.cp, self.seq_length
            )));
        }
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

    /// One transformer block on one GPU.
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
    fn transformer_layer(&self, shard: &ShardSpec) -> LayerCost {
        let d = self.dims(shard);
        let (b, s, tok, h, t, e) = (d.b, d.s, d.tokens, d.h, d.t, d.e);
        let a = self.num_attention_heads;
        let kv = self.kv_width();
        let f = self.ffn();
        let s_k = self.seq_length;
        let mlp_in_width = if self.gated_mlp { 2 * f } else { f };
        let sbh = s * b * h;

        // --- FLOPs, as GEMMs per GPU ---
        let gemms = [
            // QKV projection: [T × h]·[h × (h + 2kv)/t]
            (tok, (h + 2 * kv) / t, h),
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

        let mut forward_ops = gemm_ops.clone();
        forward_ops.insert(1, attn(false));
        forward_ops.push(Op::Elementwise {
            bytes: elementwise_fwd,
        });
        let mut backward_input_ops = gemm_ops.clone();
        backward_input_ops.insert(1, attn(true));
        backward_input_ops.push(Op::Elementwise {
            bytes: 2 * elementwise_fwd,
        });
        let backward_weight_ops = gemm_ops;
        let mut selective_recompute_ops = vec![attn(false)];
        if softmax_bytes > 0 {
            selective_recompute_ops.push(Op::Elementwise {
                bytes: softmax_bytes,
            });
        }

        // --- stored activations (bytes) ---
        let mask = u64::from(self.dropout);
        // norm inputs (2), QKV and MLP inputs (2) in `e` bytes; dropout masks (2) in 1 byte
        let replicated = 4 * sbh * e + 2 * mask * sbh;
        // Q, K, V; output-projection input; MLP activation input and output
        let sharded = (s * b * (h + 2 * kv) + sbh + s * b * (mlp_in_width + f)) / t * e;
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
        let none = replicated_local + sharded + core;
        let selective = replicated_local + sharded;
        let full = sbh * e / d.sp_div;

        // Weight-gradient working set (split backward): GEMM inputs and output gradients.
        let gemm_inputs = (2 * sbh / d.sp_div + sbh / t + s * b * f / t) * e;
        let out_grads =
            (s * b * (h + 2 * kv) / t + 2 * sbh / d.sp_div + s * b * mlp_in_width / t) * e;

        // Tensor-parallel collectives: 2 in forward, 2 in backward, each of a `2bsh` tensor
        // (all-reduce; sequence parallel: all-gather + reduce-scatter of the same volume).
        let act_bytes_full = tok * h * e;
        let (tp_forward, tp_backward) = tp_pairs(t, shard.sequence_parallel, act_bytes_full);

        let params = (self.layer_params() - 2 * self.norm_params()) / t + 2 * self.norm_params();
        LayerCost {
            name: String::from("layer"),
            kind: LayerKind::Transformer,
            params_total: self.layer_params(),
            params,
            tied_params: 0,
            forward_ops,
            backward_input_ops,
            backward_weight_ops,
            selective_recompute_ops,
            tp_forward,
            tp_backward,
            activation_bytes: ActivationBytes {
                none,
                selective,
                full,
            },
            weight_grad_bytes: gemm_inputs + out_grads,
            output_bytes: tok * h * e / t,
            recomputable: true,
        }
    }

    /// The embedding layer on one GPU: a vocabulary-parallel table (padded vocabulary over `t`),
    /// positions replicated. Keeps the token ids (int64) and the embedding dropout mask.
    fn embedding_layer(&self, shard: &ShardSpec) -> LayerCost {
        let d = self.dims(shard);
        let (tok, h, t, e) = (d.tokens, d.h, d.t, d.e);
        let v_pad = shard.padded_vocab(self.vocab_size);
        let pos = self.embedding_params() - self.vocab_size * h;
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
            params: self.norm_params() + if self.tied_embeddings { 0 } else { head_weights },
            tied_params: if self.tied_embeddings { head_weights } else { 0 },
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
        let ar = vec![pair(CollectiveKind::AllReduce), pair(CollectiveKind::AllReduce)];
        (ar.clone(), ar)
    }
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

/// Rejects a shard spec with zero sizes.
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
        return Err(ModelError::Shard("dtype must have at least one byte".into()));
    }
    Ok(())
}
