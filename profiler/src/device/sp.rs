//! Megatron's sequence parallelism (Korthikanti et al. 2022) on top of [`super::tp`]: between
//! the tensor-parallel regions the hidden state is cut along the sequence — rank `r` of `T`
//! holds positions `r·s/T..(r+1)·s/T` of every sequence of `s` — so the norms and the residual
//! additions run on `1/T` of the tokens. The all-reduce after a row-parallel product becomes a
//! reduce-scatter to the rank's shard ([`TpComm::reduce_rows`]), and an all-gather of the
//! shards comes before each column-parallel product ([`TpComm::gather_rows`]); in backward the
//! two swap. Pipeline stages send each other the shards.
//!
//! **Exactness.** The reduce-scatter adds the partials in f64 in rank order and rounds once,
//! as the all-reduce does, and every kernel gives a row the same bits wherever it sits, so the
//! activations and input gradients are those of tensor parallelism without it. The norm
//! weights are the exception: a rank sums `dγ`, `dβ` over its own tokens, and those partial
//! sums are all-reduced (Megatron's all-reduce of the sequence-parallel parameters' gradients;
//! here once per micro-batch, in backward-input). A whole layer imitating the group
//! ([`Emulated`](super::Emulated) with `sequence_parallel`) sums them per shard the same way
//! ([`NormGrads::Split`]).

use std::ops::Range;

use super::norm::LayerNorm;
use super::tensor::Tensor;
use super::tp::TpComm;
use super::transport::{Transport, TransportError};

/// The rows of sequence shard `k` of `n` in a tensor of `sequences` whole sequences of
/// `seq_len` rows: `seq_len / n` rows of each sequence, sequence by sequence.
fn shard_ranges(
    sequences: usize,
    seq_len: usize,
    k: usize,
    n: usize,
) -> impl Iterator<Item = Range<usize>> {
    let c = seq_len / n.max(1);
    (0..sequences).map(move |b| b * seq_len + k * c..b * seq_len + (k + 1) * c)
}

/// Reduce-scatter of the partials `t` (`sequences` whole sequences) over `group`: this
/// rank's sequence shard of their sum (f64 in group order, rounded once).
pub(crate) fn reduce_scatter<T: Transport + ?Sized>(
    transport: &mut T,
    group: &[usize],
    buffer: &mut Vec<f64>,
    t: &Tensor,
    sequences: usize,
) -> Result<Tensor, TransportError> {
    let n = group.len();
    let (rows, h) = t.shape();
    let seq_len = rows / sequences.max(1);
    buffer.clear();
    for k in 0..n {
        for r in shard_ranges(sequences, seq_len, k, n) {
            buffer.extend(t.rows_slice(r).iter().map(|&x| f64::from(x)));
        }
    }
    let mut mine = vec![0.0f64; buffer.len() / n.max(1)];
    transport.reduce_scatter_sum(group, buffer, &mut mine)?;
    let mut out = Tensor::scratch(mine.len() / h.max(1), h);
    for (o, &v) in out.data_mut().iter_mut().zip(&mine) {
        *o = v as f32;
    }
    Ok(out)
}

/// All-gather over `group` of every rank's sequence shard `t` (`sequences` sequences): the
/// whole sequences.
pub(crate) fn all_gather<T: Transport + ?Sized>(
    transport: &mut T,
    group: &[usize],
    buffer: &mut Vec<f64>,
    t: &Tensor,
    sequences: usize,
) -> Result<Tensor, TransportError> {
    let n = group.len();
    let (rows, h) = t.shape();
    let mine: Vec<f64> = t.data().iter().map(|&x| f64::from(x)).collect();
    buffer.clear();
    buffer.resize(mine.len() * n, 0.0);
    transport.all_gather(group, &mine, buffer)?;
    let seq_len = rows / sequences.max(1) * n;
    let mut out = Tensor::scratch(rows * n, h);
    let mut from = buffer.iter();
    for k in 0..n {
        for r in shard_ranges(sequences, seq_len, k, n) {
            let dst = &mut out.data_mut()[r.start * h..r.end * h];
            for (o, &v) in dst.iter_mut().zip(from.by_ref()) {
                *o = v as f32;
            }
        }
    }
    Ok(out)
}

/// How a norm's weight gradients (`dγ`, `dβ`) reach the accumulators in backward-weight.
#[derive(Debug, Clone, PartialEq)]
pub enum NormGrads {
    /// From the saved rows, as without sequence parallelism.
    Rows,
    /// A whole layer imitating `n` sequence shards of sequences of `seq_len` tokens: per
    /// micro-batch, each shard's sums from zero, added in f64 in shard order and rounded
    /// once (what the ranks' all-reduce computes).
    Split {
        /// Tokens per sequence.
        seq_len: usize,
        /// Sequence shards.
        n: usize,
    },
    /// Summed over the group already (a rank with sequence parallelism): added as they are.
    Reduced(LayerNorm),
}

impl NormGrads {
    /// In backward-input: on a rank with sequence parallelism, its tokens' `dγ`, `dβ` (from
    /// the norm's `x̂` and output gradient `dy`, its shard) all-reduced over the group.
    pub(crate) fn in_backward_input(
        tp: &mut dyn TpComm,
        xhat: &Tensor,
        dy: &Tensor,
        seq_len: usize,
    ) -> Result<NormGrads, TransportError> {
        if tp.seq_part().size > 1 {
            let w = xhat.cols();
            let mut g = LayerNorm {
                gamma: Tensor::zeros(1, w),
                beta: Tensor::zeros(1, w),
            };
            LayerNorm::backward_weight(xhat, dy, &mut g, 0..dy.rows());
            let mut both: Vec<f32> = g.gamma.data().to_vec();
            both.extend_from_slice(g.beta.data());
            tp.all_reduce(&mut both)?;
            g.gamma.data_mut().copy_from_slice(&both[..w]);
            g.beta.data_mut().copy_from_slice(&both[w..]);
            return Ok(NormGrads::Reduced(g));
        }
        let n = tp.emulated_seq();
        Ok(if n > 1 {
            NormGrads::Split { seq_len, n }
        } else {
            NormGrads::Rows
        })
    }

    /// In backward-weight: adds the gradients of the tokens `rows` (whole sequences) into
    /// `grads`.
    pub(crate) fn add(
        &self,
        xhat: &Tensor,
        dy: &Tensor,
        grads: &mut LayerNorm,
        rows: Range<usize>,
    ) {
        match self {
            NormGrads::Rows => LayerNorm::backward_weight(xhat, dy, grads, rows),
            NormGrads::Reduced(g) => {
                grads.gamma.add_assign(&g.gamma);
                grads.beta.add_assign(&g.beta);
            }
            &NormGrads::Split { seq_len, n } => {
                let w = xhat.cols();
                let (mut gamma, mut beta) = (vec![0.0f64; w], vec![0.0f64; w]);
                let first = rows.start / seq_len.max(1);
                let sequences = rows.len() / seq_len.max(1);
                for k in 0..n {
                    let mut part = grads.zeros_like();
                    for r in shard_ranges(sequences, seq_len, k, n) {
                        let at = first * seq_len;
                        LayerNorm::backward_weight(xhat, dy, &mut part, at + r.start..at + r.end);
                    }
                    for (a, &v) in gamma.iter_mut().zip(part.gamma.data()) {
                        *a += f64::from(v);
                    }
                    for (a, &v) in beta.iter_mut().zip(part.beta.data()) {
                        *a += f64::from(v);
                    }
                }
                for (g, a) in grads.gamma.data_mut().iter_mut().zip(gamma) {
                    *g += a as f32;
                }
                for (g, a) in grads.beta.data_mut().iter_mut().zip(beta) {
                    *g += a as f32;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::InProcess;
    use std::time::Duration;

    /// On 4 threads, a reduce-scatter to the sequence shards then an all-gather gives every
    /// rank the all-reduce's bits, and the shards are the positions `r·s/4..(r+1)·s/4` of each
    /// sequence.
    #[test]
    fn reduce_scatter_then_all_gather_is_the_all_reduce() {
        let (n, sequences, seq_len, h) = (4, 2, 8, 3);
        let rows = sequences * seq_len;
        let world = InProcess::world(n, Duration::from_secs(10));
        let group: Vec<usize> = (0..n).collect();
        let results: Vec<_> = std::thread::scope(|sc| {
            let handles: Vec<_> = world
                .into_iter()
                .map(|mut t| {
                    let group = &group;
                    sc.spawn(move || {
                        let r = t.rank();
                        let data = (0..rows * h).map(|i| (i * (r + 1)) as f32 * 0.1).collect();
                        let x = Tensor::from_vec(rows, h, data);
                        let mut buf = Vec::new();
                        let shard = reduce_scatter(&mut t, group, &mut buf, &x, sequences)?;
                        let whole = all_gather(&mut t, group, &mut buf, &shard, sequences)?;
                        let mut wide: Vec<f64> = x.data().iter().map(|&v| f64::from(v)).collect();
                        t.all_reduce_sum(group, &mut wide)?;
                        Ok::<_, TransportError>((shard, whole, wide))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (r, res) in results.into_iter().enumerate() {
            let (shard, whole, wide) = res.unwrap();
            let reduced: Vec<f32> = wide.iter().map(|&v| v as f32).collect();
            assert_eq!(whole.data(), &reduced[..]);
            let c = seq_len / n;
            for b in 0..sequences {
                let at = (b * seq_len + r * c) * h;
                assert_eq!(
                    shard.rows_slice(b * c..(b + 1) * c),
                    &reduced[at..at + c * h]
                );
            }
        }
    }
}
