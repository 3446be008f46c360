//! Learnable synthetic data: token sequences walked on a fixed random Markov chain.
//!
//! Each token has [`SUCCESSORS`] possible next tokens with random probabilities, drawn once
//! from the seed; a sequence starts at a uniform token and follows the chain. The successors
//! are drawn from a Zipf distribution (exponent [`ZIPF_EXPONENT`]) over a random order of the
//! vocabulary, so a few tokens are frequent: a model first learns those (the unigram entropy
//! of Zipf(1.2) over 1024 tokens is 4.2 nats against the `ln 1024 = 6.9` it starts at), then
//! the transitions (at most `ln 4 ≈ 1.39` nats), so the loss falls within a few dozen steps.
//! Sequence `g` of step `k` is drawn from its own stream `(seed, k, g)`, so any rank can make
//! any sequence — the first stage its inputs, the last its targets — without talking.

use crate::device::Rng;

/// Possible next tokens per token.
pub const SUCCESSORS: usize = 4;

/// Exponent of the Zipf distribution successors are drawn from.
pub const ZIPF_EXPONENT: f64 = 1.2;

const CHAIN_STREAM: u64 = 0xC4A1;
const SEQUENCE_STREAM: u64 = 0x5E0;

/// The chain and the sequence length.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticData {
    seed: u64,
    seq_len: usize,
    /// Per token, its successors and their cumulative probabilities.
    table: Vec<[(u32, f64); SUCCESSORS]>,
}

impl SyntheticData {
    /// The chain over `vocab` tokens drawn from `seed`, for sequences of `seq_len` tokens.
    pub fn new(seed: u64, vocab: usize, seq_len: usize) -> Self {
        let mut rng = Rng::derive(seed, &[CHAIN_STREAM]);
        // a random order of the vocabulary (Fisher–Yates) and Zipf weights over it
        let mut order: Vec<u32> = (0..vocab as u32).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let mut zipf: Vec<f64> = (0..vocab)
            .map(|k| (k as f64 + 1.0).powf(-ZIPF_EXPONENT))
            .collect();
        let total: f64 = zipf.iter().sum();
        let mut acc = 0.0;
        zipf.iter_mut().for_each(|w| {
            acc += *w / total;
            *w = acc;
        });
        let draw = |rng: &mut Rng| {
            let u = rng.uniform();
            let k = zipf.partition_point(|&c| c <= u).min(vocab - 1);
            order[k]
        };
        let table = (0..vocab)
            .map(|_| {
                let next: Vec<u32> = (0..SUCCESSORS).map(|_| draw(&mut rng)).collect();
                let w: Vec<f64> = (0..SUCCESSORS).map(|_| 0.1 + rng.uniform()).collect();
                let total: f64 = w.iter().sum();
                let mut acc = 0.0;
                std::array::from_fn(|k| {
                    acc += w[k] / total;
                    (next[k], acc)
                })
            })
            .collect();
        SyntheticData {
            seed,
            seq_len,
            table,
        }
    }

    /// The `seq_len + 1` tokens of global sequence `sequence` at training step `step`.
    pub fn sequence(&self, step: usize, sequence: usize) -> Vec<u32> {
        let mut rng = Rng::derive(self.seed, &[SEQUENCE_STREAM, step as u64, sequence as u64]);
        let mut tok = rng.below(self.table.len() as u64) as u32;
        let mut out = Vec::with_capacity(self.seq_len + 1);
        out.push(tok);
        for _ in 0..self.seq_len {
            let u = rng.uniform();
            let row = &self.table[tok as usize];
            tok = row
                .iter()
                .find(|(_, c)| u < *c)
                .map_or(row[SUCCESSORS - 1].0, |(t, _)| *t);
            out.push(tok);
        }
        out
    }

    /// The input tokens (each sequence's first `seq_len`) of `sequences`, concatenated.
    pub fn inputs(&self, step: usize, sequences: std::ops::Range<usize>) -> Vec<u32> {
        sequences
            .flat_map(|g| {
                let mut s = self.sequence(step, g);
                s.pop();
                s
            })
            .collect()
    }

    /// The targets (each sequence shifted by one) of `sequences`, concatenated.
    pub fn targets(&self, step: usize, sequences: std::ops::Range<usize>) -> Vec<u32> {
        sequences
            .flat_map(|g| self.sequence(step, g).split_off(1))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_follow_the_chain_and_are_reproducible() {
        let d = SyntheticData::new(3, 50, 20);
        let s = d.sequence(1, 7);
        assert_eq!(s.len(), 21);
        assert_eq!(s, SyntheticData::new(3, 50, 20).sequence(1, 7));
        assert_ne!(s, d.sequence(2, 7));
        for w in s.windows(2) {
            assert!(d.table[w[0] as usize].iter().any(|(t, _)| *t == w[1]));
        }
        let (x, y) = (d.inputs(1, 7..9), d.targets(1, 7..9));
        assert_eq!((x.len(), y.len()), (40, 40));
        assert_eq!(&x[1..20], &y[..19]);
    }
}
