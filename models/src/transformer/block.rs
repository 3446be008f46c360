//! One transformer block on one GPU: its GEMMs, attention core, element-wise traffic, stored
//! activations and collectives, for dense or mixture-of-experts FFNs and for grouped-query or
//! multi-head latent attention.
//!
//! Dense blocks follow Narayanan et al. 2021 (SC21, §5.1) and Korthikanti et al. 2022 (§4,
//! Table 2). MoE blocks follow Megatron-Core's "parallel folding" (Liu et al. 2025, arXiv
//! 2504.14960, §3): attention over `tp × cp × dp`, experts over `etp × ep × edp` on the same
//! GPUs. With `T` tokens of a micro-batch on one tensor-parallel group, one GPU dispatches
//! `T·k/tp` (token, expert) pairs and, balanced, computes as many: `(E/ep)` experts each of
//! `T·k·etp·ep/(tp·E)` rows and `f_e/etp` columns.

use super::expand::tp_pairs;
use crate::layer::{ActivationBytes, LayerCost, LayerKind, Op, ShardSpec};
use crate::TransformerSpec;

/// What sets one transformer block apart from another of the same model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct BlockKind {
    /// A mixture-of-experts FFN.
    pub moe: bool,
    /// Sliding-window attention.
    pub sliding: bool,
}

/// A GEMM `[m × k]·[k × n]`, `count` times: `(m, n, k, count)`.
type Gemm = (u64, u64, u64, u64);

/// One block's shapes on one GPU, in elements.
struct Parts {
    /// GEMMs before the attention core (QKV, or MLA's down and up projections).
    attn_in: Vec<Gemm>,
    /// MLA's up projections (queries from their latent, keys and values from theirs): what
    /// `mla_up_proj` recompute re-runs. Empty without MLA.
    mla_up: Vec<Gemm>,
    /// The output projection.
    attn_out: Gemm,
    /// FFN GEMMs: dense up and down, or routed experts and shared experts.
    ffn: Vec<Gemm>,
    /// The MoE router `[T × h]·[h × E]` (kept in bf16 under FP8 recipes).
    router: Option<Gemm>,
    /// Stored per token, sharded: Q, K, V (MLA: and its latents) and the output-projection input.
    attn_stored: u64,
    /// Stored per micro-batch, sharded: the FFN's activation inputs and outputs.
    ffn_stored: u64,
    /// FFN GEMM inputs beyond the block input, per micro-batch (weight-gradient working set).
    ffn_inputs: u64,
    /// Of `ffn_stored`, the elements that are linear-layer inputs (the down projections' and
    /// the routed experts'), which Transformer Engine saves in FP8 under an FP8 recipe.
    ffn_stored_linear_inputs: u64,
    /// FP8 copies Transformer Engine saves beside 16-bit tensors another op keeps, elements
    /// per micro-batch: the output projection's input (the attention core keeps its 16-bit
    /// output) and the shared experts' input (the router keeps the 16-bit norm output).
    fp8_extra_copies: u64,
    /// FFN GEMM outputs, per micro-batch (weight-gradient working set).
    ffn_outputs: u64,
    /// FFN activation-function and permutation traffic per micro-batch, in elements.
    ffn_traffic: u64,
    /// The routed experts' activation function per micro-batch, in elements: its input
    /// (the first grouped GEMM's output) and its output (the second's input). `(0, 0)` for a
    /// dense FFN.
    moe_act: (u64, u64),
    /// Head size the attention core's FLOPs use.
    core_head_dim: u64,
    /// Keys each query sees, and whether the mask is causal.
    keys: (u64, bool),
    /// Bytes sent per forward in the expert-parallel all-to-alls.
    a2a_bytes: u64,
    /// Routed-expert parameters on this GPU.
    expert_params: u64,
}

impl Parts {
    /// Elements of the largest weight matrix among the block's GEMMs (`n · k` of a `[m × k]·[k ×
    /// n]` product; an expert's own matrix when `count` experts share the shape).
    fn largest_weight_params(&self) -> u64 {
        self.attn_in
            .iter()
            .chain(&self.mla_up)
            .chain(&self.ffn)
            .chain(std::iter::once(&self.attn_out))
            .map(|&(_, n, k, _)| n * k)
            .max()
            .unwrap_or(0)
    }
}

impl TransformerSpec {
    /// One transformer block (layer `i` of kind `kind`) on one GPU.
    pub(super) fn transformer_layer(
        &self,
        shard: &ShardSpec,
        i: u64,
        kind: BlockKind,
    ) -> LayerCost {
        let d = self.dims(shard);
        let parts = self.parts(shard, kind);
        let ops = self.transformer_ops(shard, &parts);
        let (activation_bytes, weight_grad_bytes) = self.transformer_activations(shard, &parts);
        // Tensor-parallel collectives: 2 in forward, 2 in backward, each of a `2bsh` tensor
        // (all-reduce; sequence parallel: all-gather + reduce-scatter of the same volume).
        let act_bytes_full = d.tokens * d.h * d.e;
        let (tp_forward, tp_backward) = tp_pairs(d.t, shard.sequence_parallel, act_bytes_full);
        LayerCost {
            name: String::from("layer"),
            kind: LayerKind::Transformer,
            params_total: self.layer_params_at(i, 1, 1, 1),
            params: self.layer_params_at(i, d.t, shard.ep, shard.etp),
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
            expert_params: parts.expert_params,
            ep_a2a_bytes: parts.a2a_bytes,
            largest_weight_params: parts.largest_weight_params(),
        }
    }

    /// The shapes of one block on one GPU.
    fn parts(&self, shard: &ShardSpec, kind: BlockKind) -> Parts {
        let d = self.dims(shard);
        let (tok, h, t) = (d.tokens, d.h, d.t);
        let a = self.num_attention_heads;
        let mut p = Parts {
            attn_in: Vec::new(),
            mla_up: Vec::new(),
            attn_out: (tok, h, self.q_width() / t, 1),
            ffn: Vec::new(),
            router: None,
            attn_stored: 0,
            ffn_stored: 0,
            ffn_inputs: 0,
            ffn_stored_linear_inputs: 0,
            fp8_extra_copies: tok * self.q_width() / t,
            ffn_outputs: 0,
            ffn_traffic: 0,
            moe_act: (0, 0),
            core_head_dim: self.head_dim(),
            keys: (self.seq_length, true),
            a2a_bytes: 0,
            expert_params: 0,
        };
        if let Some(mla) = &self.mla {
            let (dqk, dv) = (mla.qk_head_dim(), mla.v_head_dim);
            let (rkv, dr) = (mla.kv_lora_rank, mla.qk_rope_head_dim);
            let heads = a / t;
            match mla.q_lora_rank {
                Some(rq) => {
                    p.attn_in.push((tok, rq, h, 1));
                    p.attn_in.push((tok, heads * dqk, rq, 1));
                    p.mla_up.push((tok, heads * dqk, rq, 1));
                    p.attn_stored += rq;
                }
                None => {
                    p.attn_in.push((tok, heads * dqk, h, 1));
                    p.mla_up.push((tok, heads * dqk, h, 1));
                }
            }
            p.attn_in.push((tok, rkv + dr, h, 1));
            let kv_up = (tok, heads * (mla.qk_nope_head_dim + dv), rkv, 1);
            p.attn_in.push(kv_up);
            p.mla_up.push(kv_up);
            p.attn_out = (tok, h, heads * dv, 1);
            p.fp8_extra_copies = tok * heads * dv;
            p.attn_stored += rkv + dr + heads * (2 * dqk + dv) + heads * dv;
            // the core's two GEMMs: QKᵀ over d_qk, PV over d_v
            p.core_head_dim = (dqk + dv) / 2;
        } else {
            let qkv_local = self.q_width() / t + 2 * self.kv_width_per_gpu(t);
            p.attn_in.push((tok, qkv_local, h, 1));
            p.attn_stored = qkv_local + self.q_width() / t;
        }
        if kind.sliding {
            if let Some(w) = self.sliding_window.filter(|&w| w < self.seq_length) {
                p.keys = (w, false);
            }
        }
        match &self.moe {
            Some(m) if kind.moe => self.moe_parts(shard, m, &mut p),
            _ => {
                let (f, f_in) = (self.ffn(), self.mlp_in_width());
                p.ffn = vec![(tok, f_in / t, h, 1), (tok, h, f / t, 1)];
                p.ffn_stored = tok * (f_in + f) / t;
                p.ffn_stored_linear_inputs = tok * f / t;
                p.ffn_inputs = tok * h / d.sp_div + tok * f / t;
                p.ffn_outputs = tok * f_in / t + tok * h / d.sp_div;
                p.ffn_traffic = (f_in + f) / t * tok;
            }
        }
        p
    }

    /// The MoE FFN's shapes: router `[T × h]·[h × E]`, `E/ep` experts of `R_e` rows, and the
    /// shared experts split `tp` ways; the dispatch and combine all-to-alls each send `R·h`
    /// elements, `R = T·k/tp` pairs per GPU.
    fn moe_parts(&self, shard: &ShardSpec, m: &super::MoeSpec, p: &mut Parts) {
        let d = self.dims(shard);
        let (tok, h, t, e) = (d.tokens, d.h, d.t, d.e);
        let (ep, etp) = (shard.ep.max(1), shard.etp.max(1));
        let gated = self.gated_mlp;
        let fe = m.moe_ffn_hidden_size;
        let fe_in = if gated { 2 * fe } else { fe };
        let pairs = tok * m.num_experts_per_tok / t;
        let rows_total = pairs * etp;
        let local_experts = m.num_experts / ep;
        // the busiest rank's rows: balanced × the imbalance factor
        let busiest = (rows_total * shard.moe_imbalance_milli.max(1)).div_ceil(1000);
        let rows = busiest.div_ceil(local_experts.max(1));
        p.router = Some((tok / d.sp_div, m.num_experts, h, 1));
        p.ffn.push((rows, fe_in / etp, h, local_experts));
        p.ffn.push((rows, h, fe / etp, local_experts));
        let sh = m.shared_ffn();
        let sh_in = if gated { 2 * sh } else { sh };
        if sh > 0 {
            p.ffn.push((tok, sh_in / t, h, 1));
            p.ffn.push((tok, h, sh / t, 1));
        }
        // router probabilities in fp32; routed inputs, activations; shared activations
        p.ffn_stored = 2 * tok * m.num_experts / d.sp_div
            + rows_total * (h + (fe_in + fe) / etp)
            + tok * (sh_in + sh) / t;
        p.ffn_stored_linear_inputs = rows_total * (h + fe / etp) + tok * sh / t;
        if sh > 0 {
            p.fp8_extra_copies += tok * h / d.sp_div;
        }
        p.ffn_inputs = tok * h / d.sp_div + rows_total * (h + fe / etp) + tok * sh / t;
        p.ffn_outputs = tok * m.num_experts / d.sp_div
            + rows_total * (fe_in / etp + h)
            + tok * (sh_in / t + h / d.sp_div);
        // activation function, and permute + unpermute (read and write) of every pair
        p.ffn_traffic = rows_total * (fe_in + fe) / etp + tok * (sh_in + sh) / t + 4 * pairs * h;
        p.moe_act = (rows_total * fe_in / etp, rows_total * fe / etp);
        p.a2a_bytes = 2 * pairs * h * e;
        p.expert_params =
            local_experts * super::MoeSpec::expert_params(h, fe, gated, m.expert_bias, etp);
    }

    /// The ops of one block on one GPU: its GEMMs, the attention core and the element-wise
    /// traffic of the forward, backward-input and backward-weight passes, and what selective
    /// recompute reruns.
    fn transformer_ops(&self, shard: &ShardSpec, p: &Parts) -> BlockOps {
        let d = self.dims(shard);
        let (b, s, tok, h, t, e) = (d.b, d.s, d.tokens, d.h, d.t, d.e);
        let a = self.num_attention_heads;
        let (s_k, causal) = p.keys;
        let gemm = |&(m, n, k, count): &Gemm| Op::Gemm {
            m,
            n,
            k,
            count,
            linear: true,
        };
        let attn = |backward: bool| Op::Attention {
            batch_heads: b * a / t,
            seq_q: s,
            seq_k: s_k,
            head_dim: p.core_head_dim,
            causal,
            backward,
            fused: shard.flash_attention,
            kernel: shard.attention_kernel,
        };
        // Element-wise traffic (bytes read + written): two norms, two bias-dropout-adds, the
        // activation function; unfused softmax traffic when the attention core is not fused.
        let rows = tok / d.sp_div;
        let norm_bytes = 2 * (2 * rows * h * e);
        let residual_bytes = 2 * (3 * rows * h * e + rows * h);
        let act_bytes = p.ffn_traffic * e;
        let softmax_bytes = if shard.flash_attention {
            0
        } else {
            // read scores, write probabilities, dropout mask and output
            (b * a / t) * s * s_k * (2 * e + 1 + e)
        };
        let eager_bytes = if shard.fused_elementwise {
            0
        } else {
            let gated_f = if self.gated_mlp && p.expert_params == 0 {
                self.ffn()
            } else {
                0
            };
            self.eager_extra_bytes(rows, tok, t, gated_f)
        };
        let elementwise_fwd = norm_bytes + residual_bytes + act_bytes + softmax_bytes + eager_bytes;
        let attn_in: Vec<Op> = p.attn_in.iter().map(gemm).collect();
        let router = p.router.iter().map(|&(m, n, k, count)| Op::Gemm {
            m,
            n,
            k,
            count,
            linear: false,
        });
        // the router first, where the FFN's GEMMs begin
        let rest: Vec<Op> = std::iter::once(gemm(&p.attn_out))
            .chain(router)
            .chain(p.ffn.iter().map(gemm))
            .collect();
        let gemm_ops: Vec<Op> = attn_in.iter().chain(&rest).cloned().collect();
        let pass = |backward: bool, bytes: u64| {
            let mut ops = attn_in.clone();
            ops.push(attn(backward));
            ops.extend(rest.iter().cloned());
            ops.push(Op::Elementwise { bytes });
            ops
        };
        // what selective recompute re-runs, module by module (`ShardSpec::recompute_modules`)
        let modules = shard.recompute_modules;
        let mut selective_recompute = Vec::new();
        if modules.core_attn {
            selective_recompute.push(attn(false));
            if softmax_bytes > 0 {
                selective_recompute.push(Op::Elementwise {
                    bytes: softmax_bytes,
                });
            }
        }
        let mut rerun_bytes = 0;
        if modules.layernorm {
            // each stand-alone norm reads its input and writes its output again
            rerun_bytes += self.standalone_norms(p) * 2 * rows * h * e;
        }
        if modules.moe_act {
            rerun_bytes += (p.moe_act.0 + p.moe_act.1) * e;
        }
        if modules.mla_up_proj && !p.mla_up.is_empty() {
            selective_recompute.extend(p.mla_up.iter().map(gemm));
            // the rotary embedding and the assembly of Q and K: written again
            rerun_bytes += tok * self.mla_qkv_width(t) * e;
        }
        if modules.mlp && p.router.is_none() {
            // the dense MLP's forward: its GEMMs, activation and (fused) norm
            selective_recompute.extend(p.ffn.iter().map(gemm));
            rerun_bytes += p.ffn_traffic * e + 2 * rows * h * e;
        }
        if rerun_bytes > 0 {
            selective_recompute.push(Op::Elementwise { bytes: rerun_bytes });
        }
        BlockOps {
            forward: pass(false, elementwise_fwd),
            backward_input: pass(true, 2 * elementwise_fwd),
            backward_weight: gemm_ops,
            selective_recompute,
        }
    }

    /// The bytes one block stores for its backward under each recompute mode, and the
    /// weight-gradient working set a split backward keeps from `I` to `W` (GEMM inputs and output
    /// gradients).
    ///
    /// Stored activations (Korthikanti et al. 2022, §4.1, per micro-batch, `e`-byte elements):
    /// * replicated over `t` (sharded only with sequence parallelism): both norm inputs `2·2sbh`,
    ///   the QKV and MLP inputs `2·2sbh`, and the two dropout masks `2·sbh` (1 byte each) — the
    ///   `10·sbh` of Table 2;
    /// * sharded over `t`: Q, K, V `2·sb·(h + 2·g·h/a)`, the output-projection input `2sbh`, the
    ///   MLP activation input and output `2·2sbf` (gated: `3·2sbf`) — the `24·sbh/t` of Table 2
    ///   when `g = a`, `f = 4h`; a MoE FFN keeps its routed inputs and activations
    ///   (`R·(h + 3f_e/etp)`, not shrunk by `ep`) and fp32 router probabilities;
    /// * the attention core, sharded over `t`: softmax output `2as²b`, its dropout mask `as²b` and
    ///   dropout output `2as²b` — the `5as²b/t` term; a fused kernel stores none of it (only the
    ///   fp32 softmax statistics `4·a·s·b`), and selective recompute drops it.
    ///
    /// Full recompute keeps only the layer input `2sbh` (`/t` with sequence parallelism).
    ///
    /// When `t` exceeds the key/value heads `g`, each GPU computes and keeps one replicated
    /// key/value head (width `h/a`) instead of `g·(h/a)/t`.
    fn transformer_activations(&self, shard: &ShardSpec, p: &Parts) -> (ActivationBytes, u64) {
        let d = self.dims(shard);
        let (b, s, h, t, e) = (d.b, d.s, d.h, d.t, d.e);
        let a = self.num_attention_heads;
        let s_k = p.keys.0;
        let sbh = s * b * h;
        let mask = u64::from(self.dropout);
        // Under Transformer Engine's FP8 recipes the linear layers save FP8 inputs: the QKV
        // input (`LayerNormLinear`'s normed output; MLA's two down projections each save
        // their own copy, 2 bytes in all), the dense MLP input (`LayerNormMLP`; a MoE's
        // router keeps it in 16 bits), the down projections' and routed experts' inputs; the
        // output projection and shared experts save an FP8 copy beside a 16-bit tensor kept
        // by another op.
        let fp8 = shard.fp8_saved_inputs;
        let qkv_in = if fp8 && self.mla.is_none() { 1 } else { e };
        let mlp_in = if fp8 && p.router.is_none() { 1 } else { e };
        // norm inputs (2) in `e` bytes, QKV and MLP inputs; dropout masks (2) in 1 byte
        let replicated = 2 * sbh * e + sbh * (qkv_in + mlp_in) + 2 * mask * sbh;
        // Q, K, V; output-projection input; FFN activation inputs and outputs
        let sharded = (s * b * p.attn_stored + p.ffn_stored) * e;
        let sharded = if fp8 {
            sharded - p.ffn_stored_linear_inputs * (e - 1) + p.fp8_extra_copies
        } else {
            sharded
        };
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
        let activations = ActivationBytes {
            none,
            selective: none - self.selective_dropped(shard, p, core, mlp_in),
            full: sbh * e / d.sp_div,
        };
        // Weight-gradient working set (split backward): GEMM inputs and output gradients.
        let attn_in_outputs: u64 = p.attn_in.iter().map(|g| g.0 * g.1 * g.3).sum();
        let latents: u64 = p.attn_in.iter().skip(1).map(|g| g.0 * g.2 * g.3).sum();
        let latents = if self.mla.is_some() { latents } else { 0 };
        let out_in = p.attn_out.0 * p.attn_out.2;
        let gemm_inputs = (sbh / d.sp_div + latents + out_in + p.ffn_inputs) * e;
        let out_grads = (attn_in_outputs + sbh / d.sp_div + p.ffn_outputs) * e;
        (activations, gemm_inputs + out_grads)
    }
}

impl TransformerSpec {
    /// The block's stand-alone norms, whose outputs Megatron-Core's `layernorm` recompute
    /// drops: a MoE layer's pre-MLP norm (the router and the dispatcher take the normed
    /// tokens) and MLA's input norm (its down projections are plain linears). A dense MLP's
    /// and a grouped-query attention's norms are fused into Transformer Engine's
    /// `LayerNormMLP` and `LayerNormLinear` (`IdentityOp` norms, not recomputed).
    fn standalone_norms(&self, p: &Parts) -> u64 {
        u64::from(self.mla.is_some()) + u64::from(p.router.is_some())
    }

    /// MLA's Q, K and V per token on one GPU, elements: `(a/t)·(2·d_qk + d_v)`; 0 without MLA.
    fn mla_qkv_width(&self, t: u64) -> u64 {
        self.mla.as_ref().map_or(0, |m| {
            self.num_attention_heads / t * (2 * m.qk_head_dim() + m.v_head_dim)
        })
    }

    /// The bytes [`crate::Recompute::Selective`] does not keep, module by module
    /// ([`crate::RecomputeModules`]), of the recompute-none bytes: `core` the attention
    /// core's, `mlp_in` the bytes per element of the MLP input as kept.
    /// - `core_attn`: the attention core's stored tensors (`core`); under an FP8 recipe with a
    ///   fused kernel also the attention output's 16-bit copy, `s·b·w·e` (`w` the output
    ///   projection's input width per GPU): the kernel keeps it for its own backward (cuDNN's
    ///   and FlashAttention's backward read `O` for `rowsum(dO∘O)`) while the output
    ///   projection keeps its FP8 copy; checkpointed, the core's outputs are not saved
    ///   (Megatron-Core `TEDotProductAttention` under `--recompute-granularity selective`
    ///   runs the core in `te.distributed.checkpoint`), so only the FP8 copy stays. Without
    ///   FP8 the projection keeps the 16-bit output itself and nothing more goes;
    /// - `layernorm`: each stand-alone norm's 16-bit output, `s·b·h·e` (`/t` with sequence
    ///   parallelism) — under an FP8 recipe MLA's down projections keep their own FP8 copies,
    ///   so only the MoE norm's (kept by the 16-bit router) goes;
    /// - `moe_act`: the routed experts' activation output as kept (`R·f_e/etp` elements, in
    ///   `e` bytes, or the 1-byte FP8 copy the second grouped GEMM saves under FP8);
    /// - `mla_up_proj`: MLA's Q, K and V, `s·b·(a/t)·(2·d_qk + d_v)·e`;
    /// - `mlp` (dense blocks): the MLP's input and activations, its checkpoint keeping the
    ///   block's residual stream (the fused norm's input, already counted).
    fn selective_dropped(&self, shard: &ShardSpec, p: &Parts, core: u64, mlp_in: u64) -> u64 {
        let d = self.dims(shard);
        let (sb, h, t, e) = (d.s * d.b, d.h, d.t, d.e);
        let m = shard.recompute_modules;
        let fp8 = shard.fp8_saved_inputs;
        let mut dropped = 0;
        if m.core_attn {
            dropped += core;
            if fp8 && shard.flash_attention {
                dropped += p.attn_out.0 * p.attn_out.2 * e;
            }
        }
        if m.layernorm {
            let norms = u64::from(p.router.is_some()) + u64::from(self.mla.is_some() && !fp8);
            dropped += norms * sb * h * e / d.sp_div;
        }
        if m.moe_act {
            dropped += p.moe_act.1 * if fp8 { 1 } else { e };
        }
        if m.mla_up_proj {
            dropped += sb * self.mla_qkv_width(t) * e;
        }
        if m.mlp && p.router.is_none() && p.expert_params == 0 {
            let stored = p.ffn_stored * e;
            let stored = if fp8 {
                stored - p.ffn_stored_linear_inputs * (e - 1)
            } else {
                stored
            };
            dropped += sb * h * mlp_in / d.sp_div + stored;
        }
        dropped
    }
}

/// The ops of one transformer block's passes (see [`TransformerSpec::transformer_ops`]).
struct BlockOps {
    forward: Vec<Op>,
    backward_input: Vec<Op>,
    backward_weight: Vec<Op>,
    selective_recompute: Vec<Op>,
}
