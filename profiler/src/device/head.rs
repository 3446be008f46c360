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
use super::sp::NormGrads;
use super::tensor::Tensor;
use super::tp::{alone, split_product, vocab_cols, Pick, Shard, TpComm};
use super::transport::TransportError;

/// Final norm and LM head — or, as a second `Head`, their gradients (f32).
#[derive(Debug, Clone, PartialEq)]
pub struct Head<T = Tensor> {
    /// The final norm.
    pub norm: LayerNorm<T>,
    /// The LM head, `h × V` (a tensor-parallel rank: `h × |its ids|`).
    pub lm_head: T,
    /// The first token id of `lm_head`'s columns: 0, or a tensor-parallel rank's first id.
    pub first_id: usize,
    /// The whole vocabulary.
    pub vocab: usize,
}

/// What the head's forward keeps.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadSaved {
    sequences: usize,
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
    norm_grads: NormGrads,
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
            first_id: 0,
            vocab,
        }
    }

    /// Column of the local logits holding target `y`, when this rank holds it.
    fn local_col(&self, y: u32) -> Option<usize> {
        (y as usize)
            .checked_sub(self.first_id)
            .filter(|&c| c < self.lm_head.cols())
    }

    /// Forward: the summed cross-entropy of `targets` (one per row of `x`), accumulated in f64.
    ///
    /// # Panics
    /// If a target is outside the vocabulary or the lengths differ.
    pub fn forward(&self, x: &Tensor, targets: Vec<u32>) -> (f64, HeadSaved) {
        alone(|tp| self.forward_tp(x, targets, 1, tp))
    }

    /// [`Head::forward`] on a tensor-parallel rank holding a range of the vocabulary: the
    /// softmax's row maxima are gathered and its sums of exponentials all-reduced over the
    /// group, and each rank adds the losses of the targets it holds before the loss is
    /// all-reduced (Megatron's vocabulary-parallel cross-entropy). With sequence parallelism
    /// `x` is the rank's sequence shard of `sequences` sequences and the norm's output is
    /// all-gathered.
    pub fn forward_tp(
        &self,
        x: &Tensor,
        targets: Vec<u32>,
        sequences: usize,
        tp: &mut dyn TpComm,
    ) -> Result<(f64, HeadSaved), TransportError> {
        let (norm_out, norm) = self.norm.forward(x);
        let norm_out = tp.gather_rows(&norm_out, sequences)?.unwrap_or(norm_out);
        assert_eq!(targets.len(), norm_out.rows(), "head: one target per token");
        let mut probs = matmul(&norm_out, false, &self.lm_head, false);
        let v = probs.cols();
        let n = tp.emulated();
        if tp.shard().size == 1 && n == 1 {
            if !probs.is_empty() {
                kernels::softmax_rows(probs.data_mut(), v);
            }
        } else {
            vocab_parallel_softmax(&mut probs, tp)?;
        }
        // per rank (or imitated rank, `⌈v/n⌉` columns each) from 0.0, then in rank order
        let mut parts = vec![0.0f64; n];
        let width = v.div_ceil(n).max(1);
        for (t, &y) in targets.iter().enumerate() {
            assert!(
                (y as usize) < self.vocab,
                "target {y} outside the vocabulary of {}",
                self.vocab
            );
            if let Some(c) = self.local_col(y) {
                parts[c / width] -= f64::from(probs.row(t)[c].max(f32::MIN_POSITIVE)).ln();
            }
        }
        let mut loss = [parts.iter().fold(0.0f64, |a, p| a + p)];
        tp.all_reduce_f64(&mut loss)?;
        let saved = HeadSaved {
            sequences,
            norm,
            norm_out,
            probs,
            targets,
        };
        Ok((loss[0], saved))
    }

    /// Backward-input from the loss: the gradient with respect to the head's input.
    pub fn backward_input(&self, saved: HeadSaved, loss_scale: f32) -> (Tensor, HeadWeightSaved) {
        alone(|tp| self.backward_input_tp(saved, loss_scale, tp))
    }

    /// [`Head::backward_input`] on a tensor-parallel rank: `dlogits` of its columns, and the
    /// partial input gradient all-reduced over the group.
    pub fn backward_input_tp(
        &self,
        saved: HeadSaved,
        loss_scale: f32,
        tp: &mut dyn TpComm,
    ) -> Result<(Tensor, HeadWeightSaved), TransportError> {
        let HeadSaved {
            sequences,
            norm,
            norm_out,
            probs,
            targets,
        } = saved;
        let mut d_logits = probs;
        for (t, &y) in targets.iter().enumerate() {
            if let Some(c) = self.local_col(y) {
                d_logits.row_mut(t)[c] -= 1.0;
            }
        }
        kernels::scale(d_logits.data_mut(), loss_scale);
        let picks: (Pick, Pick) = (vocab_cols, vocab_cols);
        let d_norm_out = split_product(&d_logits, &self.lm_head, true, picks, sequences, tp)?;
        let dx = self.norm.backward_input(&norm, &d_norm_out);
        let seq_len = d_logits.rows() / sequences.max(1);
        let norm_grads = NormGrads::in_backward_input(tp, &norm.xhat, &d_norm_out, seq_len)?;
        let ws = HeadWeightSaved {
            xhat: norm.xhat,
            d_norm_out,
            norm_out,
            d_logits,
            norm_grads,
        };
        Ok((dx, ws))
    }

    /// Backward-weight: adds the norm's and the LM head's gradients of the tokens `rows` into
    /// `grads`.
    pub fn backward_weight(ws: &HeadWeightSaved, grads: &mut Head, rows: Range<usize>) {
        ws.norm_grads
            .add(&ws.xhat, &ws.d_norm_out, &mut grads.norm, rows.clone());
        matmul_tn_acc(&mut grads.lm_head, &ws.norm_out, &ws.d_logits, rows);
    }

    /// Zero gradients of the same shapes.
    pub fn zeros_like(&self) -> Head {
        Head {
            norm: self.norm.zeros_like(),
            lm_head: Tensor::zeros(self.lm_head.rows(), self.lm_head.cols()),
            first_id: self.first_id,
            vocab: self.vocab,
        }
    }
}

/// The softmax of each row of `logits` (this rank's columns of the vocabulary), in place:
/// the row maxima of every rank gathered (an all-reduce of a `rows × T` buffer in which each
/// rank fills its column: exact), `e^(l − max)` locally, each rank's sum gathered the same
/// way and the sums added in f64 from 0.0 in rank order (what an all-reduce computes), then
/// divided. A whole head imitating `n` ranks ([`TpComm::emulated`]) does the same per
/// vocabulary range.
fn vocab_parallel_softmax(logits: &mut Tensor, tp: &mut dyn TpComm) -> Result<(), TransportError> {
    let Shard { rank, size } = tp.shard();
    let n = tp.emulated();
    let (rows, v) = logits.shape();
    // the ranges this rank computes: its own columns, or every imitated rank's
    let ranges: Vec<std::ops::Range<usize>> = (0..n)
        .map(|r| Shard { rank: r, size: n }.vocab(v))
        .collect();
    let parts = size.max(n);
    let mut maxima = vec![0.0f32; rows * parts];
    let mut sums = vec![0.0f32; rows * parts];
    for r in 0..rows {
        for (k, cols) in ranges.iter().enumerate() {
            maxima[r * parts + rank + k] = logits.row(r)[cols.clone()]
                .iter()
                .copied()
                .fold(f32::MIN, f32::max);
        }
    }
    tp.all_reduce(&mut maxima)?;
    for r in 0..rows {
        let m = maxima[r * parts..(r + 1) * parts]
            .iter()
            .copied()
            .fold(f32::MIN, f32::max);
        let row = logits.row_mut(r);
        for (k, cols) in ranges.iter().enumerate() {
            let sum = &mut sums[r * parts + rank + k];
            for x in &mut row[cols.clone()] {
                *x = kernels::exp(*x - m);
                *sum += *x;
            }
        }
    }
    tp.all_reduce(&mut sums)?;
    for r in 0..rows {
        let total = sums[r * parts..(r + 1) * parts]
            .iter()
            .fold(0.0f64, |a, &s| a + f64::from(s)) as f32;
        let inv = 1.0 / total;
        logits.row_mut(r).iter_mut().for_each(|x| *x *= inv);
    }
    Ok(())
}
