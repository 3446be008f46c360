//! The head: final LayerNorm, LM head (`h × V`, no bias) and cross-entropy against the
//! next-token targets. Forward returns the *sum* of the token losses `Σ_t −log P_t[y_t]`; the
//! caller scales: backward-input takes `loss_scale` (the objective's derivative with respect to
//! each token's loss, `1/N` for a mean over `N` tokens), and `dlogits = (P − onehot(y))·scale`.
//!
//! Forward keeps the norm's `x̂` and `rstd`, the LM head's input, the probabilities and the
//! targets: `T·(2h + V + 1)` floats and `T` ids. Backward-weight needs `x̂`, the norm's output
//! gradient, the LM head's input and `dlogits`: `T·(3h + V)` floats.

use std::ops::Range;

use super::embedding::TOKEN_ID_BYTES;
use super::gemm::{matmul, matmul_tn_acc};
use super::kernels;
use super::norm::{LayerNorm, NormSaved};
use super::rng::Rng;
use super::tensor::Tensor;

/// Final norm and LM head — or, as a second `Head`, their gradients (f32).
#[derive(Debug, Clone, PartialEq)]
pub struct Head<T = Tensor> {
    /// The final norm.
    pub norm: LayerNorm<T>,
    /// The LM head, `h × V`.
    pub lm_head: T,
}

/// What the head's forward keeps.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadSaved {
    norm: NormSaved,
    norm_out: Tensor,
    probs: Tensor,
    targets: Vec<u32>,
}

impl HeadSaved {
    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.norm.bytes()
            + self.norm_out.bytes()
            + self.probs.bytes()
            + self.targets.len() as u64 * TOKEN_ID_BYTES
    }
}

/// What the head's backward-weight needs.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadWeightSaved {
    xhat: Tensor,
    d_norm_out: Tensor,
    norm_out: Tensor,
    d_logits: Tensor,
}

impl HeadWeightSaved {
    /// Tokens (rows) of the micro-batch.
    pub fn tokens(&self) -> usize {
        self.d_logits.rows()
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.xhat.bytes() + self.d_norm_out.bytes() + self.norm_out.bytes() + self.d_logits.bytes()
    }
}

impl Head {
    /// Identity norm, LM head from `N(0, 0.02²)`.
    pub fn init(rng: &mut Rng, hidden: usize, vocab: usize) -> Self {
        let w = (0..hidden * vocab)
            .map(|_| (rng.normal() * 0.02) as f32)
            .collect();
        Head {
            norm: LayerNorm::new(hidden),
            lm_head: Tensor::from_vec(hidden, vocab, w),
        }
    }

    /// Forward: the summed cross-entropy of `targets` (one per row of `x`), accumulated in f64.
    ///
    /// # Panics
    /// If a target is outside the vocabulary or the lengths differ.
    pub fn forward(&self, x: &Tensor, targets: Vec<u32>) -> (f64, HeadSaved) {
        assert_eq!(targets.len(), x.rows(), "head: one target per token");
        let (norm_out, norm) = self.norm.forward(x);
        let mut probs = matmul(&norm_out, false, &self.lm_head, false);
        let v = probs.cols();
        if !probs.is_empty() {
            kernels::softmax_rows(probs.data_mut(), v);
        }
        let mut loss = 0.0f64;
        for (t, &y) in targets.iter().enumerate() {
            let row = probs.row(t);
            let y = y as usize;
            assert!(y < v, "target {y} outside the vocabulary of {v}");
            loss -= f64::from(row[y].max(f32::MIN_POSITIVE)).ln();
        }
        let saved = HeadSaved {
            norm,
            norm_out,
            probs,
            targets,
        };
        (loss, saved)
    }

    /// Backward-input from the loss: the gradient with respect to the head's input.
    pub fn backward_input(&self, saved: HeadSaved, loss_scale: f32) -> (Tensor, HeadWeightSaved) {
        let HeadSaved {
            norm,
            norm_out,
            probs,
            targets,
        } = saved;
        let mut d_logits = probs;
        for (t, &y) in targets.iter().enumerate() {
            d_logits.row_mut(t)[y as usize] -= 1.0;
        }
        kernels::scale(d_logits.data_mut(), loss_scale);
        let d_norm_out = matmul(&d_logits, false, &self.lm_head, true);
        let dx = self.norm.backward_input(&norm, &d_norm_out);
        let ws = HeadWeightSaved {
            xhat: norm.xhat,
            d_norm_out,
            norm_out,
            d_logits,
        };
        (dx, ws)
    }

    /// Backward-weight: adds the norm's and the LM head's gradients of the tokens `rows` into
    /// `grads`.
    pub fn backward_weight(ws: &HeadWeightSaved, grads: &mut Head, rows: Range<usize>) {
        LayerNorm::backward_weight(&ws.xhat, &ws.d_norm_out, &mut grads.norm, rows.clone());
        matmul_tn_acc(&mut grads.lm_head, &ws.norm_out, &ws.d_logits, rows);
    }

    /// Zero gradients of the same shapes.
    pub fn zeros_like(&self) -> Head {
        Head {
            norm: self.norm.zeros_like(),
            lm_head: Tensor::zeros(self.lm_head.rows(), self.lm_head.cols()),
        }
    }
}
