//! The causal multi-head attention core, per sequence and head (Vaswani et al. 2017):
//! `S = QKᵀ/√d`, `P = softmax(S)` over keys `j ≤ i`, `O = P·V`.
//!
//! The input is the fused projection `qkv` (`tokens × 3h`, columns `[Q | K | V]`, head `n` at
//! columns `n·d..(n+1)·d` of each block, `d = h/heads`). Backward, per sequence and head:
//! `dP = dO·Vᵀ`, `dV = Pᵀ·dO`, `dS = P ∘ (dP − rowsum(dP ∘ P)) / √d`, `dQ = dS·K`,
//! `dK = dSᵀ·Q`. The core has no weights, so its backward is all backward-input.

use super::gemm::{gemm_views, view, view_mut};
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
    let mut out = Tensor::zeros(sequences * s, h);
    let mut probs = Tensor::zeros(sequences * heads * s, s);
    for b in 0..sequences {
        let base = b * s * 3 * h;
        for n in 0..heads {
            let q = view(qkv.data(), base + n * d, s, d, 3 * h);
            let k = view(qkv.data(), base + h + n * d, s, d, 3 * h);
            let p_off = (b * heads + n) * s * s;
            gemm_views(
                view_mut(probs.data_mut(), p_off, s, s, s),
                q,
                k.transpose(),
                false,
            );
            let p = &mut probs.data_mut()[p_off..p_off + s * s];
            for i in 0..s {
                let row = &mut p[i * s..(i + 1) * s];
                let max = row[..=i]
                    .iter()
                    .fold(f32::NEG_INFINITY, |m, &x| m.max(x * scale));
                let mut sum = 0.0f32;
                for x in row[..=i].iter_mut() {
                    *x = (*x * scale - max).exp();
                    sum += *x;
                }
                let inv = 1.0 / sum;
                row[..=i].iter_mut().for_each(|x| *x *= inv);
                row[i + 1..].fill(0.0);
            }
            let v = view(qkv.data(), base + 2 * h + n * d, s, d, 3 * h);
            let pv = view(probs.data(), p_off, s, s, s);
            gemm_views(
                view_mut(out.data_mut(), b * s * h + n * d, s, d, h),
                pv,
                v,
                false,
            );
        }
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
    let mut dqkv = Tensor::zeros(sequences * s, 3 * h);
    let mut ds = Tensor::zeros(s, s);
    for b in 0..sequences {
        let base = b * s * 3 * h;
        for n in 0..heads {
            let q = view(qkv.data(), base + n * d, s, d, 3 * h);
            let k = view(qkv.data(), base + h + n * d, s, d, 3 * h);
            let v = view(qkv.data(), base + 2 * h + n * d, s, d, 3 * h);
            let p_off = (b * heads + n) * s * s;
            let p = view(probs.data(), p_off, s, s, s);
            let dout_v = view(dout.data(), b * s * h + n * d, s, d, h);
            // dP = dO·Vᵀ, then dS in place
            gemm_views(
                view_mut(ds.data_mut(), 0, s, s, s),
                dout_v,
                v.transpose(),
                false,
            );
            let pd = &probs.data()[p_off..p_off + s * s];
            for i in 0..s {
                let prow = &pd[i * s..(i + 1) * s];
                let drow = ds.row_mut(i);
                let dot: f32 = prow[..=i].iter().zip(&drow[..=i]).map(|(a, b)| a * b).sum();
                for (x, &pv) in drow[..=i].iter_mut().zip(&prow[..=i]) {
                    *x = pv * (*x - dot) * scale;
                }
                drow[i + 1..].fill(0.0);
            }
            let dsv = view(ds.data(), 0, s, s, s);
            // dV = Pᵀ·dO, dQ = dS·K, dK = dSᵀ·Q
            gemm_views(
                view_mut(dqkv.data_mut(), base + 2 * h + n * d, s, d, 3 * h),
                p.transpose(),
                dout_v,
                false,
            );
            gemm_views(
                view_mut(dqkv.data_mut(), base + n * d, s, d, 3 * h),
                dsv,
                k,
                false,
            );
            gemm_views(
                view_mut(dqkv.data_mut(), base + h + n * d, s, d, 3 * h),
                dsv.transpose(),
                q,
                false,
            );
        }
    }
    dqkv
}
