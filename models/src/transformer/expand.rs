//! Expanding a [`TransformerSpec`] into per-GPU [`LayerCost`]s for one [`ShardSpec`].

use super::block::BlockKind;
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
        self.check_layers(shard)?;
        let mut out = Vec::with_capacity((self.num_layers + self.mtp_num_layers) as usize + 2);
        out.push(self.embedding_layer(shard));
        // at most four distinct blocks (dense or MoE, full or sliding): build each once
        let mut blocks: Vec<(BlockKind, LayerCost)> = Vec::new();
        for i in 0..self.num_layers {
            let mut layer = self.block_once(&mut blocks, shard, i);
            layer.name = format!("layer {i}");
            out.push(layer);
        }
        for j in 0..self.mtp_num_layers {
            let mut layer = self.mtp_layer(shard);
            layer.name = format!("mtp {j}");
            out.push(layer);
        }
        out.push(self.head_layer(shard));
        Ok(out)
    }

    /// [`TransformerSpec::layers`] with each distinct layer once: the embedding, one block per
    /// block kind (dense or MoE, full or sliding attention), the multi-token-prediction layer,
    /// the head, each named as its first place; and per layer of `layers`, its index among
    /// them. Every layer of `layers` is its distinct layer, its name apart. A caller that costs
    /// each distinct layer once skips expanding, cloning and comparing the others (gpt-oss
    /// alternates two kinds over 36 layers: 2 blocks, not 36).
    pub fn distinct_layers(
        &self,
        shard: &ShardSpec,
    ) -> Result<(Vec<LayerCost>, Vec<usize>), ModelError> {
        self.check_layers(shard)?;
        let mut distinct = vec![self.embedding_layer(shard)];
        let mut slot = Vec::with_capacity((self.num_layers + self.mtp_num_layers) as usize + 2);
        slot.push(0);
        let mut kinds: Vec<(BlockKind, usize)> = Vec::new();
        for i in 0..self.num_layers {
            let kind = self.block_kind(i);
            let j = match kinds.iter().find(|(k, _)| *k == kind) {
                Some(&(_, j)) => j,
                None => {
                    let mut layer = self.transformer_layer(shard, i, kind);
                    layer.name = format!("layer {i}");
                    distinct.push(layer);
                    kinds.push((kind, distinct.len() - 1));
                    distinct.len() - 1
                }
            };
            slot.push(j);
        }
        if self.mtp_num_layers > 0 {
            let mut layer = self.mtp_layer(shard);
            layer.name = "mtp 0".to_string();
            distinct.push(layer);
            let j = distinct.len() - 1;
            slot.extend(std::iter::repeat_n(j, self.mtp_num_layers as usize));
        }
        distinct.push(self.head_layer(shard));
        slot.push(distinct.len() - 1);
        Ok((distinct, slot))
    }

    /// Transformer layer `i`, built once per block kind: a copy of the block in `blocks` when
    /// one of its kind was built before (the name is the caller's to set).
    fn block_once(
        &self,
        blocks: &mut Vec<(BlockKind, LayerCost)>,
        shard: &ShardSpec,
        i: u64,
    ) -> LayerCost {
        let kind = self.block_kind(i);
        if let Some((_, block)) = blocks.iter().find(|(k, _)| *k == kind) {
            return block.clone();
        }
        let block = self.transformer_layer(shard, i, kind);
        blocks.push((kind, block.clone()));
        block
    }

    /// The block kind of transformer layer `i`.
    fn block_kind(&self, i: u64) -> BlockKind {
        BlockKind {
            moe: self.is_moe_layer(i),
            sliding: self.is_sliding_layer(i),
        }
    }

    /// Rejects a shard the model cannot take (and an invalid model) before expanding it.
    fn check_layers(&self, shard: &ShardSpec) -> Result<(), ModelError> {
        self.validate()?;
        check_shard(shard)?;
        let t = shard.tp;
        if !self.num_attention_heads.is_multiple_of(t) {
            return Err(ModelError::Shard(format!(
                "--tp {t} does not divide num_attention_heads = {}: choose a tensor-parallel degree that divides the head count",
                self.num_attention_heads
            )));
        }
        if self.mla.is_none()
            && !self.kv_heads().is_multiple_of(t)
            && !t.is_multiple_of(self.kv_heads())
        {
            return Err(ModelError::Shard(format!(
                "--tp {t} and num_kv_heads = {} do not divide one another: choose a tensor-parallel degree that divides the key/value head count",
                self.kv_heads()
            )));
        }
        let dense = self.moe.as_ref().is_none_or(|m| m.first_k_dense_layers > 0);
        if dense && !self.ffn().is_multiple_of(t) {
            return Err(ModelError::Shard(format!(
                "--tp {t} does not divide ffn_hidden_size = {}: choose a tensor-parallel degree that divides it",
                self.ffn()
            )));
        }
        self.check_experts(shard)?;
        if !self.seq_length.is_multiple_of(shard.cp) {
            return Err(ModelError::Shard(format!(
                "--cp {} does not divide seq_length = {}: choose a context-parallel degree that divides it",
                shard.cp, self.seq_length
            )));
        }
        self.check_magnitudes(shard)
    }

    /// Rejects expert degrees that do not divide the experts or their FFN; errors name the flag.
    fn check_experts(&self, shard: &ShardSpec) -> Result<(), ModelError> {
        let (ep, etp) = (shard.ep, shard.etp);
        let Some(m) = &self.moe else {
            if ep > 1 || etp > 1 {
                return Err(ModelError::Shard(format!(
                    "--ep {ep} / --etp {etp}: model '{}' has no experts; use 1",
                    self.name
                )));
            }
            return Ok(());
        };
        if ep == 0 || etp == 0 {
            return Err(ModelError::Shard(
                "--ep and --etp must be at least 1".into(),
            ));
        }
        if !m.num_experts.is_multiple_of(ep) {
            return Err(ModelError::Shard(format!(
                "--ep {ep} does not divide num_experts = {}: choose an expert-parallel degree that divides the expert count",
                m.num_experts
            )));
        }
        if !m.moe_ffn_hidden_size.is_multiple_of(etp) || !m.shared_ffn().is_multiple_of(shard.tp) {
            return Err(ModelError::Shard(format!(
                "--etp {etp} / --tp {} does not divide the expert FFN ({}) or shared-expert FFN ({}): choose degrees that divide them",
                shard.tp,
                m.moe_ffn_hidden_size,
                m.shared_ffn()
            )));
        }
        Ok(())
    }

    /// One multi-token-prediction module (DeepSeek-V3 §2.2) on one GPU: a block like the last
    /// layer, plus the projection `[T × 2h]·[2h × h/t]`, three norms, and the shared LM head's
    /// logits `[T × h]·[h × V/t]` with its fp32 logits kept for the loss.
    fn mtp_layer(&self, shard: &ShardSpec) -> LayerCost {
        let last = self.num_layers.saturating_sub(1);
        let kind = BlockKind {
            moe: self.is_moe_layer(last),
            sliding: self.is_sliding_layer(last),
        };
        let mut layer = self.transformer_layer(shard, last, kind);
        let d = self.dims(shard);
        let v_local = shard.padded_vocab(self.vocab_size) / d.t;
        let extra = [
            Op::Gemm {
                m: d.tokens,
                n: d.h / d.t,
                k: 2 * d.h,
                count: 1,
                linear: true,
            },
            Op::Gemm {
                m: d.tokens,
                n: v_local,
                k: d.h,
                count: 1,
                linear: false,
            },
        ];
        for ops in [
            &mut layer.forward_ops,
            &mut layer.backward_input_ops,
            &mut layer.backward_weight_ops,
        ] {
            ops.extend(extra);
        }
        let logits = 4 * d.tokens * v_local;
        layer.activation_bytes.none += logits;
        layer.activation_bytes.selective += logits;
        layer.activation_bytes.full += logits;
        layer.params_total = self.mtp_layer_params(1, 1, 1);
        layer.params = self.mtp_layer_params(d.t, shard.ep, shard.etp);
        layer
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
    pub(super) fn dims(&self, shard: &ShardSpec) -> Dims {
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
            expert_params: 0,
            ep_a2a_bytes: 0,
            largest_weight_params: (v_pad * h / t).max(pos),
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
            linear: false,
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
            expert_params: 0,
            ep_a2a_bytes: 0,
            // the projection, owned or the tied copy of the embedding
            largest_weight_params: head_weights,
        }
    }
}

/// Tensor-parallel collectives of one transformer block: forward and backward each have two of a
/// `bytes`-sized activation (all-reduce, or with sequence parallelism an all-gather and a
/// reduce-scatter per pair).
pub(super) fn tp_pairs(
    t: u64,
    sequence_parallel: bool,
    bytes: u64,
) -> (Vec<Collective>, Vec<Collective>) {
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

/// Local sizes shared by a model's layers.
pub(super) struct Dims {
    pub b: u64,
    pub s: u64,
    pub tokens: u64,
    pub h: u64,
    pub t: u64,
    pub sp_div: u64,
    pub e: u64,
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
