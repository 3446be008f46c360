//! Token embedding, plus learned positions when the model has them: row `t` of the output is
//! `E[id_t] (+ P[pos_t])`. Forward keeps the token ids (4 bytes each); backward-weight
//! scatters the output gradient back: `dE[id_t] += dy_t`, `dP[pos_t] += dy_t`. The embedding
//! is the first layer, so it has no input gradient.

use std::ops::Range;

use super::rng::Rng;
use super::tensor::Tensor;
use super::tp::{alone, TpComm};
use super::transport::TransportError;

/// Bytes of one saved token id (`u32`).
pub const TOKEN_ID_BYTES: u64 = 4;

/// The embedding tables — or, as a second `Embedding`, their gradients (f32).
#[derive(Debug, Clone, PartialEq)]
pub struct Embedding<T = Tensor> {
    /// Token table, `vocab × h`.
    pub tokens: T,
    /// Learned position table, `positions × h`, when the model has one (replicated over a
    /// tensor-parallel group).
    pub positions: Option<T>,
    /// The first token id of `tokens`' rows: 0, or a tensor-parallel rank's first id.
    pub first_id: usize,
    /// The whole vocabulary (`tokens` holds ids `first_id..first_id + tokens.rows()`).
    pub vocab: usize,
}

/// What backward-weight needs: the ids and the output gradient.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddingWeightSaved {
    ids: Vec<u32>,
    seq_len: usize,
    dy: Tensor,
}

impl EmbeddingWeightSaved {
    /// Tokens (rows) of the micro-batch.
    pub fn tokens(&self) -> usize {
        self.dy.rows()
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.ids.len() as u64 * TOKEN_ID_BYTES + self.dy.bytes()
    }
}

impl Embedding {
    /// Tables drawn from `N(0, 0.02²)` (GPT-2).
    pub fn init(rng: &mut Rng, vocab: usize, hidden: usize, positions: Option<usize>) -> Self {
        let mut table = |rows: usize| {
            let data = (0..rows * hidden)
                .map(|_| (rng.normal() * 0.02) as f32)
                .collect();
            Tensor::from_vec(rows, hidden, data)
        };
        let tokens = table(vocab);
        let positions = positions.map(table);
        Embedding {
            tokens,
            positions,
            first_id: 0,
            vocab,
        }
    }

    /// Vocabulary size (the whole vocabulary, also on a tensor-parallel rank).
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Row of `tokens` holding `id`, when this rank holds it.
    fn local_row(&self, id: u32) -> Option<usize> {
        (id as usize)
            .checked_sub(self.first_id)
            .filter(|&r| r < self.tokens.rows())
    }

    /// Looks up `ids` (sequences of `seq_len` tokens, concatenated).
    ///
    /// # Panics
    /// If an id is outside the vocabulary or a sequence is longer than the position table (the
    /// executor checks both before it runs).
    pub fn forward(&self, ids: &[u32], seq_len: usize) -> Tensor {
        alone(|tp| self.forward_tp(ids, seq_len, tp))
    }

    /// [`Embedding::forward`] on a tensor-parallel rank: the rows of the ids it holds (zero
    /// for the others), all-reduced over the group (exact: one non-zero term per element),
    /// then the positions added. With sequence parallelism reduce-scattered instead: the
    /// output is the rank's sequence shard.
    pub fn forward_tp(
        &self,
        ids: &[u32],
        seq_len: usize,
        tp: &mut dyn TpComm,
    ) -> Result<Tensor, TransportError> {
        let h = self.tokens.cols();
        // every row is written below
        let mut y = Tensor::scratch(ids.len(), h);
        for (t, &id) in ids.iter().enumerate() {
            match self.local_row(id) {
                Some(r) => y.row_mut(t).copy_from_slice(self.tokens.row(r)),
                None => y.row_mut(t).fill(0.0),
            }
        }
        let mut y = tp.reduce_rows(y, ids.len() / seq_len.max(1))?;
        // with sequence parallelism `y` is the rank's shard: `c` positions of each sequence
        let part = tp.seq_part();
        let c = seq_len.max(1) / part.size.max(1);
        if let Some(p) = &self.positions {
            for t in 0..y.rows() {
                for (v, pv) in y
                    .row_mut(t)
                    .iter_mut()
                    .zip(p.row(part.rank * c + t % c.max(1)))
                {
                    *v += pv;
                }
            }
        }
        Ok(y)
    }

    /// Backward-input: there is no input gradient; packs what backward-weight needs.
    pub fn backward_input(ids: Vec<u32>, seq_len: usize, dy: Tensor) -> EmbeddingWeightSaved {
        EmbeddingWeightSaved { ids, seq_len, dy }
    }

    /// Backward-weight: scatters the output gradient of the tokens `rows` into the tables'
    /// gradients, tokens in order.
    pub fn backward_weight(ws: &EmbeddingWeightSaved, grads: &mut Embedding, rows: Range<usize>) {
        for t in rows {
            let d = ws.dy.row(t);
            if let Some(r) = grads.local_row(ws.ids[t]) {
                for (g, &v) in grads.tokens.row_mut(r).iter_mut().zip(d) {
                    *g += v;
                }
            }
            if let Some(p) = &mut grads.positions {
                for (g, &v) in p.row_mut(t % ws.seq_len.max(1)).iter_mut().zip(d) {
                    *g += v;
                }
            }
        }
    }

    /// Zero gradients of the same shapes.
    pub fn zeros_like(&self) -> Embedding {
        Embedding {
            tokens: Tensor::zeros(self.tokens.rows(), self.tokens.cols()),
            positions: self
                .positions
                .as_ref()
                .map(|p| Tensor::zeros(p.rows(), p.cols())),
            first_id: self.first_id,
            vocab: self.vocab,
        }
    }
}
