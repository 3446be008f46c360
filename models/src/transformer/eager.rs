//! The extra HBM traffic of a block whose element-wise ops run unfused: PyTorch eager mode,
//! each op of a norm, the rotary embedding and the gated activation its own kernel that reads
//! and writes the whole tensor. `torch.compile` (and Megatron-Core's and Transformer Engine's
//! fused kernels) fuse each of them into one pass, which is what [`super::block`] counts.
//!
//! Per token, in bytes (`e`-byte activations, fp32 intermediates of 4 bytes):
//! * RMSNorm (`torch.nn.RMSNorm`, ATen's composite `rms_norm` in eager): upcast to fp32
//!   (`e + 4`), square (`4 + 4`), mean (`4`), scale by the reciprocal root (`4 + 4`), downcast
//!   (`4 + e`), weight (`e + e`): `36` bytes per element with `e = 2`, against the fused
//!   kernel's `2·e` — `32` more per element; LayerNorm likewise (its bias add in place of
//!   nothing). Two norms per block.
//! * Rotary embedding as torchtitan writes it (`apply_rotary_emb`: `float()`, complex
//!   multiply by `freqs_cis`, `type_as`): upcast (`e + 4`), multiply (`4 + 4`), downcast
//!   (`4 + e`) over the query and key columns: `20` bytes per element with `e = 2`.
//! * Gated activation (`silu(w1·x) * w3·x`): `silu` reads and writes `f` (`2·e`), the product
//!   reads two and writes one (`3·e`), against the fused kernel's `3·e`: `2·e` more per `f`.
//!
//! The backward runs the autograd of the same decompositions: [`super::block`] charges the
//! backward twice the forward's element-wise traffic, as it does for the fused kernels.

use super::TransformerSpec;

/// Bytes per element the eager RMSNorm (or LayerNorm) moves beyond the fused kernel's `2·e`.
const NORM_EXTRA_BYTES: u64 = 32;

/// Bytes per element the eager rotary embedding moves (a fused one is free inside the QKV
/// epilogue or the attention kernel's prologue).
const ROTARY_BYTES: u64 = 20;

impl TransformerSpec {
    /// Extra forward HBM bytes of one block on one GPU when its element-wise ops run unfused:
    /// `rows` tokens through the norms (the sequence-parallel share), `tokens` through the
    /// attention and the FFN, `t` the tensor-parallel degree, `gated_f` the FFN width of a
    /// gated activation (0 when the activation is not gated or the FFN is not dense).
    pub(super) fn eager_extra_bytes(&self, rows: u64, tokens: u64, t: u64, gated_f: u64) -> u64 {
        let h = self.hidden_size;
        let e = 2;
        let norms = 2 * NORM_EXTRA_BYTES * rows * h;
        // a model without a learned position table: rotary, as torchtitan's Llama models
        let rotary = match self.position_embedding {
            super::PositionEmbedding::None => {
                ROTARY_BYTES * tokens * (self.q_width() + self.kv_width()) / t.max(1)
            }
            _ => 0,
        };
        let act = 2 * e * tokens * gated_f / t.max(1);
        norms + rotary + act
    }
}

#[cfg(test)]
mod tests {
    /// Hand-worked Llama 3 8B block (h 4096, 32 query heads and 8 key/value heads of 128,
    /// gated FFN 14336), one micro-batch of 2 × 8192 tokens, tp 1: norms 2 · 32 · 16384 ·
    /// 4096 = 4.295 GB, rotary 20 · 16384 · (4096 + 1024) = 1.678 GB, activation 4 · 16384 ·
    /// 14336 = 0.940 GB: 6.912 GB, 2.88 ms at 2.4 TB/s, against the fused block's 43·h per
    /// token (2.89 GB).
    #[test]
    fn llama3_8b_eager_traffic_hand_worked() {
        let m = crate::load("llama3-8b").unwrap();
        let crate::Model::Transformer(t) = m else {
            panic!("llama3-8b is a transformer");
        };
        let tok = 16384;
        let bytes = t.eager_extra_bytes(tok, tok, 1, 14336);
        let norms = 2 * 32 * tok * 4096;
        let rotary = 20 * tok * (4096 + 1024);
        let act = 4 * tok * 14336;
        assert_eq!(bytes, norms + rotary + act);
        assert_eq!(bytes, 6_912_212_992);
    }
}
