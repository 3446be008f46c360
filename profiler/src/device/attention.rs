//! The causal multi-head attention core, per sequence and head (Vaswani et al. 2017):
//! `S = QKᵀ/√d`, `P = softmax(S)` over keys `j ≤ i`, `O = P·V`.
//!
//! The input is the fused projection `qkv` (`tokens × 3h`, columns `[Q | K | V]`, head `n` at
//! columns `n·d..(n+1)·d` of each block, `d = h/heads`). Backward, per sequence and head:
//! `dP = dO·Vᵀ`, `dV = Pᵀ·dO`, `dS = P ∘ (dP − rowsum(dP ∘ P)) / √d`, `dQ = dS·K`,
//! `dK = dSᵀ·Q`. The core has no weights, so its backward is all backward-input.
//!
//! Each product runs for every head of a sequence in one [`gemm_batched`] call (head `n`'s
//! blocks are `n·d` columns or `n·s²` elements further on), so a GPU engine gets one call per
//! sequence instead of one per head.

use super::gemm::{gemm_batched, Operand};
use super::kernels;
use super::tensor::Tensor;

/// Shape of one attention call: `sequences` sequences of `seq_len` tokens, `heads` heads of
/// width `head_dim`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    /// Sequences in the micro-batch (`b`).
    pub sequences: usize,
    /// Tokens per sequence (`s`).
    pub seq_len: usize,
    /// Attention heads (`a`).
    pub heads: usize,
    /// Width of one head (`d = h / a`).
    pub head_dim: usize,
}

impl AttentionShape {
    fn hidden(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Elements of the saved probabilities: `b·a·s²`.
    pub fn probs_len(&self) -> usize {
        self.sequences * self.heads * self.seq_len * self.seq_len
    }
}

/// Head `n`'s `s × d` block of the `Q`, `K` or `V` columns (`which` = 0, 1, 2) of sequence
/// `b` in `qkv` (`tokens × 3h`), batched over heads.
fn qkv_block(b: usize, which: usize, s: usize, d: usize, h: usize) -> Operand {
    Operand::block(b * s * 3 * h + which * h, s, d, 3 * h).batched(d)
}

/// Sequence `b`'s Q, K and V blocks (see [`qkv_block`]).
fn qkv_blocks(b: usize, s: usize, d: usize, h: usize) -> (Operand, Operand, Operand) {
    (
        qkv_block(b, 0, s, d, h),
        qkv_block(b, 1, s, d, h),
        qkv_block(b, 2, s, d, h),
    )
}

/// Head `n`'s `s × s` block of a `heads·s × s` buffer from element `offset`, batched over heads.
fn square_block(offset: usize, s: usize) -> Operand {
    Operand::block(offset, s, s, s).batched(s * s)
}

/// Forward: returns `O` (`tokens × h`) and the probabilities `P` (`b·a·s × s`, zero above the
/// diagonal), which the backward needs.
pub fn forward(qkv: &Tensor, shape: AttentionShape) -> (Tensor, Tensor) {
    let AttentionShape {
        sequences,
        seq_len: s,
        heads,
        head_dim: d,
    } = shape;
    let h = shape.hidden();
    assert_eq!(qkv.shape(), (sequences * s, 3 * h), "attention: qkv shape");
    let scale = 1.0 / (d as f32).sqrt();
    // every element of both is written below: the products replace, the softmax masks
    let mut out = Tensor::scratch(sequences * s, h);
    let mut probs = Tensor::scratch(sequences * heads * s, s);
    for b in 0..sequences {
        let (q, k, v) = qkv_blocks(b, s, d, h);
        let p0 = b * heads * s * s;
        let p = square_block(p0, s);
        // S = Q·Kᵀ, every head
        gemm_batched(
            probs.data_mut(),
            p,
            qkv.data(),
            q,
            qkv.data(),
            k.t(),
            heads,
            false,
        );
        for pn in probs.data_mut()[p0..p0 + heads * s * s].chunks_exact_mut((s * s).max(1)) {
            kernels::causal_softmax(pn, s, scale);
        }
        // O = P·V into head n's columns of the sequence's rows
        let o = Operand::block(b * s * h, s, d, h).batched(d);
        gemm_batched(
            out.data_mut(),
            o,
            probs.data(),
            p,
            qkv.data(),
            v,
            heads,
            false,
        );
    }
    (out, probs)
}

/// Backward: the gradient with respect to `qkv` given `dO`.
pub fn backward(qkv: &Tensor, probs: &Tensor, dout: &Tensor, shape: AttentionShape) -> Tensor {
    let AttentionShape {
        sequences,
        seq_len: s,
        heads,
        head_dim: d,
    } = shape;
    let h = shape.hidden();
    let scale = 1.0 / (d as f32).sqrt();
    // every element is written by the dQ, dK and dV products below
    let mut dqkv = Tensor::scratch(sequences * s, 3 * h);
    // dP, then dS, of every head of one sequence
    let mut ds = Tensor::scratch(heads * s, s);
    let dsb = square_block(0, s);
    for b in 0..sequences {
        let (q, k, v) = qkv_blocks(b, s, d, h);
        let p0 = b * heads * s * s;
        let p = square_block(p0, s);
        let dout_b = Operand::block(b * s * h, s, d, h).batched(d);
        // dP = dO·Vᵀ, then dS in place
        gemm_batched(
            ds.data_mut(),
            dsb,
            dout.data(),
            dout_b,
            qkv.data(),
            v.t(),
            heads,
            false,
        );
        let heads_p = probs.data()[p0..p0 + heads * s * s].chunks_exact((s * s).max(1));
        for (dn, pn) in ds.data_mut().chunks_exact_mut((s * s).max(1)).zip(heads_p) {
            kernels::causal_softmax_backward(dn, pn, s, scale);
        }
        // dV = Pᵀ·dO, dQ = dS·K, dK = dSᵀ·Q
        let (dq, dk, dv) = (q, k, v);
        gemm_batched(
            dqkv.data_mut(),
            dv,
            probs.data(),
            p.t(),
            dout.data(),
            dout_b,
            heads,
            false,
        );
        gemm_batched(
            dqkv.data_mut(),
            dq,
            ds.data(),
            dsb,
            qkv.data(),
            k,
            heads,
            false,
        );
        gemm_batched(
            dqkv.data_mut(),
            dk,
            ds.data(),
            dsb.t(),
            qkv.data(),
            q,
            heads,
            false,
        );
    }
    dqkv
}
