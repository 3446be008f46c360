//! Megatron-style tensor parallelism (Shoeybi et al. 2019) of the device layers: which slice of
//! each weight a tensor-parallel rank holds ([`Shard`], [`Layer::shard`], [`Layer::unshard`]),
//! and the collective the layers call within their tensor-parallel group ([`TpComm`]).
//!
//! With `T` ranks, rank `r` holds:
//! - in a block, heads `r·a/T..(r+1)·a/T`: its columns of each of `Q`, `K` and `V` in `qkv`
//!   (column-parallel) and the matching rows of `proj` (row-parallel); columns
//!   `r·f/T..(r+1)·f/T` of `fc1` (column-parallel) and those rows of `fc2` (row-parallel). The
//!   norms and the biases of `proj` and `fc2` are replicated. Forward all-reduces the partial
//!   products of `proj` and `fc2`; backward-input those of `qkv` and `fc1` (the input
//!   gradients); backward-weight needs no collective.
//! - in the embedding, its range of token ids (rows of the token table; the position table is
//!   replicated): each rank looks up the ids it holds, zero for the others, and the all-reduce
//!   of those rows is exact (one non-zero term per element).
//! - in the head, its range of the vocabulary (columns of the LM head; the norm replicated):
//!   cross-entropy gathers the row maxima, all-reduces the sums of exponentials and the loss,
//!   and backward-input all-reduces the partial input gradient.
//!
//! Vocabulary ranges are `⌈V/T⌉` ids each, the last one shorter when `T` does not divide `V`.
//! A rank's weights are slices of the single-worker model's (each layer initialised whole from
//! its seeded stream, then sliced), so a tensor-parallel run trains the same model; its sums
//! are split over ranks and added in another order, so it matches single-worker training to
//! rounding, not bit for bit.

use std::ops::Range;

use super::block::Block;
use super::embedding::Embedding;
use super::gemm::matmul;
use super::head::Head;
use super::layer::Layer;
use super::linear::Linear;
use super::tensor::Tensor;
use super::transport::TransportError;

/// A rank's place in its tensor-parallel group: `rank` of `size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// This rank's index in the group, `0..size`.
    pub rank: usize,
    /// Ranks in the group (`T`).
    pub size: usize,
}

impl Shard {
    /// The whole layer: rank 0 of 1.
    pub const WHOLE: Shard = Shard { rank: 0, size: 1 };

    /// This rank's part of `n` items split evenly (`n` divisible by `size`).
    pub fn even(self, n: usize) -> Range<usize> {
        let k = n / self.size.max(1);
        self.rank * k..(self.rank + 1) * k
    }

    /// This rank's range of a vocabulary of `vocab` ids: `⌈V/T⌉` each, the last shorter.
    pub fn vocab(self, vocab: usize) -> Range<usize> {
        let k = vocab.div_ceil(self.size.max(1));
        (self.rank * k).min(vocab)..((self.rank + 1) * k).min(vocab)
    }
}

/// The collective of a tensor-parallel group, as the layers call it. Every member calls it
/// the same number of times in the same order (they run the same actions).
pub trait TpComm {
    /// This rank's place in the group.
    fn shard(&self) -> Shard;

    /// Sums `data` element-wise over the group; every member ends with the same bits.
    fn all_reduce(&mut self, data: &mut [f32]) -> Result<(), TransportError>;

    /// Sums `data` (f64) element-wise over the group (the loss).
    fn all_reduce_f64(&mut self, data: &mut [f64]) -> Result<(), TransportError>;

    /// The tensor-parallel degree a *whole* layer imitates ([`Emulated`]); 1 otherwise.
    fn emulated(&self) -> usize {
        1
    }

    /// With sequence parallelism on a tensor-parallel rank, its shard of every sequence's
    /// positions (rank `r` of `T` holds positions `r·s/T..(r+1)·s/T` of each sequence of `s`)
    /// between the tensor-parallel regions; [`Shard::WHOLE`] otherwise.
    fn seq_part(&self) -> Shard {
        Shard::WHOLE
    }

    /// The sequence shards a *whole* layer imitates ([`Emulated`] with sequence parallelism):
    /// its norm-weight gradients are summed per shard, as the ranks sum them; 1 otherwise.
    fn emulated_seq(&self) -> usize {
        1
    }

    /// Megatron's `g` after a row-parallel product: the partials `t` (`sequences` whole
    /// sequences in its rows) summed over the group — all-reduced, or with sequence
    /// parallelism reduce-scattered to this rank's [`TpComm::seq_part`].
    fn reduce_rows(&mut self, mut t: Tensor, sequences: usize) -> Result<Tensor, TransportError> {
        let _ = sequences;
        self.all_reduce(t.data_mut())?;
        Ok(t)
    }

    /// Megatron's `f` before a column-parallel product: with sequence parallelism the whole
    /// sequences gathered from every rank's shard `t`; `None` (use `t` itself) otherwise.
    fn gather_rows(
        &mut self,
        t: &Tensor,
        sequences: usize,
    ) -> Result<Option<Tensor>, TransportError> {
        let _ = (t, sequences);
        Ok(None)
    }
}

/// A group of one (every collective the identity) whose whole layers compute every sum a
/// tensor-parallel group of `n` ranks splits, split the same way (`Emulated::tp(1)`: the plain
/// whole layer): each rank's partial product on its slices, the partials added
/// in f64 from 0.0 in rank order and rounded once, as the all-reduce does. `--check`'s single
/// worker trains with it, so a tensor-parallel run matches it bit for bit.
/// With `sequence_parallel`, the norm-weight gradients are also summed per sequence shard, as
/// ranks with sequence parallelism sum them ([`super::sp`]).
#[derive(Debug, Clone, Copy)]
pub struct Emulated {
    /// The tensor-parallel degree imitated.
    pub tp: usize,
    /// Whether the group imitated runs sequence parallelism.
    pub sequence_parallel: bool,
}

impl Emulated {
    /// `tp` ranks without sequence parallelism (`Emulated::tp(1)`: the plain whole layer).
    pub const fn tp(tp: usize) -> Emulated {
        Emulated {
            tp,
            sequence_parallel: false,
        }
    }
}

impl TpComm for Emulated {
    fn shard(&self) -> Shard {
        Shard::WHOLE
    }

    fn all_reduce(&mut self, _: &mut [f32]) -> Result<(), TransportError> {
        Ok(())
    }

    fn all_reduce_f64(&mut self, _: &mut [f64]) -> Result<(), TransportError> {
        Ok(())
    }

    fn emulated(&self) -> usize {
        self.tp.max(1)
    }

    fn emulated_seq(&self) -> usize {
        if self.sequence_parallel {
            self.tp.max(1)
        } else {
            1
        }
    }
}

/// `f` with the group of one, whose collectives cannot fail.
pub(crate) fn alone<R>(f: impl FnOnce(&mut dyn TpComm) -> Result<R, TransportError>) -> R {
    match f(&mut Emulated::tp(1)) {
        Ok(r) => r,
        Err(e) => unreachable!("a group of one does not fail: {e}"),
    }
}

/// Cuts rank `s`'s slice of a tensor (a column or row range, its heads, its vocabulary).
pub(crate) type Pick = fn(&Tensor, Shard) -> Tensor;

/// The sum over a group's ranks of the partial products `x·W` (`wt`: `x·Wᵀ`) of their slices
/// (`pick_x`, `pick_w` cut rank `r`'s): on a tensor-parallel rank its own product summed by
/// [`TpComm::reduce_rows`] (`x` holds `sequences` whole sequences); on a whole layer imitating
/// `n` ranks, the `n` products added in f64 from 0.0 in rank order and rounded once (what the
/// all-reduce and the reduce-scatter compute).
pub(crate) fn split_product(
    x: &Tensor,
    w: &Tensor,
    wt: bool,
    picks: (Pick, Pick),
    sequences: usize,
    tp: &mut dyn TpComm,
) -> Result<Tensor, TransportError> {
    let (pick_x, pick_w) = picks;
    let n = tp.emulated();
    if n <= 1 {
        return tp.reduce_rows(matmul(x, false, w, wt), sequences);
    }
    let mut acc: Vec<f64> = Vec::new();
    let mut shape = (0, 0);
    for rank in 0..n {
        let s = Shard { rank, size: n };
        let p = matmul(&pick_x(x, s), false, &pick_w(w, s), wt);
        if rank == 0 {
            shape = p.shape();
            acc = vec![0.0; p.len()];
        }
        for (a, &v) in acc.iter_mut().zip(p.data()) {
            *a += f64::from(v);
        }
    }
    Ok(Tensor::from_vec(
        shape.0,
        shape.1,
        acc.into_iter().map(|v| v as f32).collect(),
    ))
}

/// Rank `s`'s even share of `t`'s columns.
pub(crate) fn even_cols(t: &Tensor, s: Shard) -> Tensor {
    cols(t, s.even(t.cols()))
}

/// Rank `s`'s even share of `t`'s rows.
pub(crate) fn even_rows(t: &Tensor, s: Shard) -> Tensor {
    rows(t, s.even(t.rows()))
}

/// Rank `s`'s heads of a fused `[Q | K | V]` (its share of each block's columns).
pub(crate) fn heads_cols(t: &Tensor, s: Shard) -> Tensor {
    qkv_cols(t, s.even(t.cols() / 3))
}

/// Rank `s`'s vocabulary columns.
pub(crate) fn vocab_cols(t: &Tensor, s: Shard) -> Tensor {
    cols(t, s.vocab(t.cols()))
}

/// Columns `cols` of `t`.
fn cols(t: &Tensor, cols: Range<usize>) -> Tensor {
    let n = cols.len();
    let data = (0..t.rows())
        .flat_map(|r| t.row(r)[cols.clone()].iter().copied())
        .collect();
    Tensor::from_vec(t.rows(), n, data)
}

/// Rows `rows` of `t`.
fn rows(t: &Tensor, rows: Range<usize>) -> Tensor {
    Tensor::from_vec(rows.len(), t.cols(), t.rows_slice(rows).to_vec())
}

/// The parts side by side (columns concatenated).
fn concat_cols(parts: &[&Tensor]) -> Tensor {
    let r = parts.first().map_or(0, |p| p.rows());
    let n = parts.iter().map(|p| p.cols()).sum();
    let data = (0..r)
        .flat_map(|i| parts.iter().flat_map(move |p| p.row(i).iter().copied()))
        .collect();
    Tensor::from_vec(r, n, data)
}

/// The parts one under the other (rows concatenated).
fn concat_rows(parts: &[&Tensor]) -> Tensor {
    let c = parts.first().map_or(0, |p| p.cols());
    let n = parts.iter().map(|p| p.rows()).sum();
    let data = parts
        .iter()
        .flat_map(|p| p.data().iter().copied())
        .collect();
    Tensor::from_vec(n, c, data)
}

/// `[Q | K | V]` columns of a fused projection (`3w` wide): rank's `cols` of each block.
fn qkv_cols(t: &Tensor, part: Range<usize>) -> Tensor {
    let w = t.cols() / 3;
    let blocks: Vec<Tensor> = (0..3)
        .map(|k| cols(t, k * w + part.start..k * w + part.end))
        .collect();
    concat_cols(&blocks.iter().collect::<Vec<_>>())
}

/// The inverse of [`qkv_cols`] over every rank's part.
fn qkv_concat(parts: &[&Tensor]) -> Tensor {
    let blocks: Vec<Tensor> = (0..3)
        .flat_map(|k| {
            parts.iter().map(move |p| {
                let w = p.cols() / 3;
                cols(p, k * w..(k + 1) * w)
            })
        })
        .collect();
    concat_cols(&blocks.iter().collect::<Vec<_>>())
}

impl Block {
    /// Rank `s.rank`'s slices (see the module's documentation). `heads` and `ffn` must be
    /// divisible by `s.size` (the executor checks).
    pub fn shard(&self, s: Shard) -> Block {
        // column-parallel: weight and bias cut by `pick`; row-parallel: rows, bias replicated
        let column = |lin: &Linear, pick: fn(&Tensor, Shard) -> Tensor| Linear {
            weight: pick(&lin.weight, s),
            bias: lin.bias.as_ref().map(|b| pick(b, s)),
        };
        let row = |lin: &Linear| Linear {
            weight: even_rows(&lin.weight, s),
            bias: lin.bias.clone(),
        };
        Block {
            heads: self.heads / s.size,
            ln1: self.ln1.clone(),
            qkv: column(&self.qkv, heads_cols),
            proj: row(&self.proj),
            ln2: self.ln2.clone(),
            fc1: column(&self.fc1, even_cols),
            fc2: row(&self.fc2),
        }
    }

    fn unshard(parts: &[&Block]) -> Block {
        let first = parts[0];
        let column = |f: fn(&Block) -> &Linear, join: fn(&[&Tensor]) -> Tensor| {
            let biases: Vec<&Tensor> = parts.iter().filter_map(|b| f(b).bias.as_ref()).collect();
            Linear {
                weight: join(&parts.iter().map(|b| &f(b).weight).collect::<Vec<_>>()),
                bias: f(first).bias.as_ref().map(|_| join(&biases)),
            }
        };
        let row = |f: fn(&Block) -> &Linear| Linear {
            weight: concat_rows(&parts.iter().map(|b| &f(b).weight).collect::<Vec<_>>()),
            bias: f(first).bias.clone(),
        };
        Block {
            heads: parts.iter().map(|b| b.heads).sum(),
            ln1: first.ln1.clone(),
            qkv: column(|b| &b.qkv, qkv_concat),
            proj: row(|b| &b.proj),
            ln2: first.ln2.clone(),
            fc1: column(|b| &b.fc1, concat_cols),
            fc2: row(|b| &b.fc2),
        }
    }
}

impl Layer {
    /// Rank `s.rank`'s part of this (whole) layer; the layer itself when `s.size` is 1.
    pub fn shard(&self, s: Shard) -> Layer {
        if s.size <= 1 {
            return self.clone();
        }
        match self {
            Layer::Embedding(e) => {
                let ids = s.vocab(e.vocab());
                Layer::Embedding(Embedding {
                    tokens: rows(&e.tokens, ids.clone()),
                    positions: e.positions.clone(),
                    first_id: ids.start,
                    vocab: e.vocab(),
                })
            }
            Layer::Block(b) => Layer::Block(Box::new(b.shard(s))),
            Layer::Head(h) => {
                let ids = s.vocab(h.vocab);
                Layer::Head(Head {
                    norm: h.norm.clone(),
                    lm_head: cols(&h.lm_head, ids.clone()),
                    first_id: ids.start,
                    vocab: h.vocab,
                })
            }
        }
    }

    /// The whole layer from every rank's part, in rank order (the inverse of
    /// [`Layer::shard`]; replicated parameters are taken from rank 0).
    ///
    /// # Panics
    /// If `parts` is empty or its layers are of different kinds.
    pub fn unshard(parts: &[&Layer]) -> Layer {
        assert!(!parts.is_empty(), "unshard: no parts");
        if parts.len() == 1 {
            return parts[0].clone();
        }
        // parameter `i` of every part (parts of one kind have the same parameter list)
        let nth = |i: usize| -> Vec<&Tensor> { parts.iter().map(|p| p.params()[i].1).collect() };
        match parts[0] {
            Layer::Embedding(e) => Layer::Embedding(Embedding {
                tokens: concat_rows(&nth(0)),
                positions: e.positions.clone(),
                first_id: 0,
                vocab: e.vocab,
            }),
            Layer::Block(_) => {
                let blocks: Vec<&Block> = parts
                    .iter()
                    .filter_map(|p| match p {
                        Layer::Block(b) => Some(&**b),
                        _ => None,
                    })
                    .collect();
                assert_eq!(blocks.len(), parts.len(), "unshard: mixed kinds");
                Layer::Block(Box::new(Block::unshard(&blocks)))
            }
            Layer::Head(h) => Layer::Head(Head {
                norm: h.norm.clone(),
                lm_head: concat_cols(&nth(2)),
                first_id: 0,
                vocab: h.vocab,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Rng;

    use crate::device::{Flow, GroupComm, InProcess, Transport};
    use std::time::Duration;

    /// Each layer's forward and backward-input on `size` tensor-parallel threads equal the
    /// whole layer's to rounding and an [`Emulated`] whole layer's bit for bit, and so do
    /// the weight gradients made whole again.
    #[test]
    fn sharded_layers_compute_what_the_whole_layer_computes() {
        let mut rng = Rng::new(9);
        let (h, v, s) = (16, 24, 6);
        let layers = [
            Layer::Embedding(Embedding::init(&mut rng, v, h, Some(s))),
            Layer::Block(Box::new(Block::init(&mut rng, h, 4, 32, 2, true, true))),
            Layer::Head(Head::init(&mut rng, h, v)),
        ];
        let ids: Vec<u32> = (0..2 * s as u32).map(|i| (i * 7) % v as u32).collect();
        let x = Tensor::from_vec(
            2 * s,
            h,
            (0..2 * s * h).map(|_| rng.normal() as f32).collect(),
        );
        let dy = Tensor::from_vec(
            2 * s,
            h,
            (0..2 * s * h).map(|_| rng.normal() as f32).collect(),
        );
        let run = |layer: &Layer, tp: &mut dyn TpComm| {
            let (input, targets, d) = match layer {
                Layer::Embedding(_) => (Flow::Tokens(ids.clone()), None, Some(dy.clone())),
                Layer::Block(_) => (Flow::Hidden(x.clone()), None, Some(dy.clone())),
                Layer::Head(_) => (Flow::Hidden(x.clone()), Some(ids.clone()), None),
            };
            let (out, saved) = layer.forward_tp(input, targets, 2, s, tp).unwrap();
            let (dx, ws) = layer.backward_input_tp(saved, d, 0.1, tp).unwrap();
            let mut g = layer.zeros_like();
            layer.backward_weight(ws, &mut g).unwrap();
            (out, dx, g)
        };
        for layer in &layers {
            let (out, dx, g) = run(layer, &mut Emulated::tp(1));
            for size in [2, 4] {
                let world = InProcess::world(size, Duration::from_secs(10));
                let group: Vec<usize> = (0..size).collect();
                let results: Vec<_> = std::thread::scope(|sc| {
                    let hs: Vec<_> = world
                        .into_iter()
                        .map(|mut t| {
                            let (group, run) = (&group, &run);
                            sc.spawn(move || {
                                let part = layer.shard(Shard {
                                    rank: t.rank(),
                                    size,
                                });
                                let mut buf = Vec::new();
                                let mut comm = GroupComm::new(&mut t, group, &mut buf);
                                run(&part, &mut comm)
                            })
                        })
                        .collect();
                    hs.into_iter().map(|h| h.join().unwrap()).collect()
                });
                let close = |a: &Tensor, b: &Tensor| a.distance(b) <= 1e-5 * b.norm().max(1e-6);
                // a whole layer imitating the group computes the same bits
                let (e_out, e_dx, e_g) = run(layer, &mut Emulated::tp(size));
                let parts: Vec<&Layer> = results.iter().map(|r| &r.2).collect();
                assert_eq!(
                    Layer::unshard(&parts),
                    e_g,
                    "{} over {size}",
                    layer.kind_name()
                );
                for (o, d, _) in &results {
                    assert_eq!((o, d), (&e_out, &e_dx), "{} over {size}", layer.kind_name());
                }
                for (o, d, _) in &results {
                    match (o, &out) {
                        (Flow::Hidden(a), Flow::Hidden(b)) => assert!(close(a, b)),
                        (Flow::Loss(a), Flow::Loss(b)) => assert!((a - b).abs() <= 1e-6 * b.abs()),
                        _ => panic!("flows differ"),
                    }
                    if let (Some(a), Some(b)) = (d, &dx) {
                        assert!(close(a, b), "{} dx over {size}", layer.kind_name());
                    }
                }
                let parts: Vec<&Layer> = results.iter().map(|r| &r.2).collect();
                let whole = Layer::unshard(&parts);
                for ((name, a), (_, b)) in whole.params().into_iter().zip(g.params()) {
                    assert!(close(a, b), "{} {name} over {size}", layer.kind_name());
                }
            }
        }
    }

    #[test]
    fn ranges_cover_the_whole() {
        let s = |rank| Shard { rank, size: 3 };
        assert_eq!(
            (0..3).map(|r| s(r).vocab(10)).collect::<Vec<_>>(),
            [0..4, 4..8, 8..10]
        );
        assert_eq!(s(2).even(12), 8..12);
    }

    #[test]
    fn sharding_then_unsharding_gives_the_layer_back() {
        let mut rng = Rng::new(5);
        let layers = [
            Layer::Block(Box::new(Block::init(&mut rng, 8, 4, 16, 2, true, true))),
            Layer::Embedding(Embedding::init(&mut rng, 10, 8, Some(4))),
            Layer::Head(Head::init(&mut rng, 8, 10)),
        ];
        for layer in layers {
            for size in [2, 4] {
                let parts: Vec<Layer> = (0..size)
                    .map(|rank| layer.shard(Shard { rank, size }))
                    .collect();
                let back = Layer::unshard(&parts.iter().collect::<Vec<_>>());
                assert_eq!(back, layer, "{} over {size}", layer.kind_name());
            }
        }
    }
}
