//! The pre-norm transformer block (GPT-2): `x₂ = x + Attn(LN₁(x))`, `y = x₂ + MLP(LN₂(x₂))`
//! with `Attn = proj ∘ core ∘ qkv` (causal, multi-head) and `MLP = fc2 ∘ GeLU ∘ fc1`.
//!
//! Forward keeps, per micro-batch of `T` tokens (`b` sequences of `s`, hidden `h`, FFN `f`,
//! `a` heads), in fp32: both norms' `x̂` and `rstd`, the inputs of the four linear layers
//! (`LN₁(x)`, `Attn` core output, `LN₂(x₂)`, `GeLU(u)`), the fused `qkv`, the GeLU input `u`
//! and the attention probabilities: `T·(8h + 2f + 2) + b·a·s²` elements.
//!
//! Backward-input hands backward-weight what the weight gradients need — each linear layer's
//! input and output gradient, each norm's `x̂` and output gradient: `T·(12h + 2f)` elements.

use std::ops::Range;

use super::attention::{self, AttentionShape};
use super::kernels;
use super::linear::Linear;
use super::norm::{LayerNorm, NormSaved};
use super::rng::Rng;
use super::sp::NormGrads;
use super::tensor::Tensor;
use super::tp::{alone, even_cols, even_rows, heads_cols, split_product, TpComm};
use super::transport::TransportError;

pub use super::kernels::{gelu, gelu_grad};

/// `residual + b + x·W` of a row-parallel projection: with a group of one in one pass
/// ([`Linear::forward_residual`]); otherwise the partial `x·W` all-reduced over the group (with
/// sequence parallelism reduce-scattered to the rank's shard, which `residual` is), then added
/// to `residual + b` (`b` replicated, added once).
fn row_parallel(
    lin: &Linear,
    x: &Tensor,
    residual: &Tensor,
    sequences: usize,
    tp: &mut dyn TpComm,
) -> Result<Tensor, TransportError> {
    if tp.shard().size == 1 && tp.emulated() == 1 {
        return Ok(lin.forward_residual(x, residual));
    }
    let partial = split_product(x, &lin.weight, false, (even_cols, even_rows), sequences, tp)?;
    let mut y = Tensor::scratch(residual.rows(), residual.cols());
    y.data_mut().copy_from_slice(residual.data());
    if let Some(b) = &lin.bias {
        kernels::add_bias(y.data_mut(), b.data());
    }
    y.add_assign(&partial);
    Ok(y)
}

/// One transformer block's parameters — or, as a second `Block`, their gradients (f32).
#[derive(Debug, Clone, PartialEq)]
pub struct Block<T = Tensor> {
    /// Attention heads.
    pub heads: usize,
    /// Norm before attention.
    pub ln1: LayerNorm<T>,
    /// Fused query/key/value projection, `h × 3h`.
    pub qkv: Linear<T>,
    /// Attention output projection, `h × h`.
    pub proj: Linear<T>,
    /// Norm before the MLP.
    pub ln2: LayerNorm<T>,
    /// MLP up-projection, `h × f`.
    pub fc1: Linear<T>,
    /// MLP down-projection, `f × h`.
    pub fc2: Linear<T>,
}

/// What a block's forward keeps for its backward.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockSaved {
    /// Sequences in the micro-batch.
    pub sequences: usize,
    /// LN₁'s `x̂` and `rstd`.
    pub ln1: NormSaved,
    /// `LN₁(x)`, the input of `qkv`.
    pub ln1_out: Tensor,
    /// The fused projection `[Q | K | V]`.
    pub qkv: Tensor,
    /// Attention probabilities, `b·a·s × s`.
    pub probs: Tensor,
    /// Attention core output, the input of `proj`.
    pub attn_out: Tensor,
    /// LN₂'s `x̂` and `rstd`.
    pub ln2: NormSaved,
    /// `LN₂(x₂)`, the input of `fc1`.
    pub ln2_out: Tensor,
    /// `fc1` output, the GeLU input.
    pub fc1_out: Tensor,
    /// GeLU output, the input of `fc2`.
    pub gelu_out: Tensor,
}

impl BlockSaved {
    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.ln1.bytes()
            + self.ln1_out.bytes()
            + self.qkv.bytes()
            + self.probs.bytes()
            + self.attn_out.bytes()
            + self.ln2.bytes()
            + self.ln2_out.bytes()
            + self.fc1_out.bytes()
            + self.gelu_out.bytes()
    }
}

/// What a block's backward-weight needs: each weight's input and output gradient.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockWeightSaved {
    ln1_xhat: Tensor,
    d_ln1_out: Tensor,
    ln1_out: Tensor,
    d_qkv: Tensor,
    attn_out: Tensor,
    d_x2: Tensor,
    ln2_xhat: Tensor,
    d_ln2_out: Tensor,
    ln2_out: Tensor,
    d_fc1_out: Tensor,
    gelu_out: Tensor,
    d_out: Tensor,
    ln1_grads: NormGrads,
    ln2_grads: NormGrads,
}

impl BlockWeightSaved {
    /// Tokens (rows) of the micro-batch.
    pub fn tokens(&self) -> usize {
        self.d_out.rows()
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        [
            &self.ln1_xhat,
            &self.d_ln1_out,
            &self.ln1_out,
            &self.d_qkv,
            &self.attn_out,
            &self.d_x2,
            &self.ln2_xhat,
            &self.d_ln2_out,
            &self.ln2_out,
            &self.d_fc1_out,
            &self.gelu_out,
            &self.d_out,
        ]
        .iter()
        .map(|t| t.bytes())
        .sum()
    }
}

impl Block {
    /// GPT-2's initialisation: linear weights `N(0, 0.02²)`, the two projections that write
    /// into the residual stream (`proj`, `fc2`) scaled by `1/√(2·num_layers)`, biases zero,
    /// norms identity.
    pub fn init(
        rng: &mut Rng,
        hidden: usize,
        heads: usize,
        ffn: usize,
        num_layers: usize,
        bias: bool,
        qkv_bias: bool,
    ) -> Self {
        let std = 0.02;
        let residual_std = std / (2.0 * num_layers.max(1) as f64).sqrt();
        Block {
            heads,
            ln1: LayerNorm::new(hidden),
            qkv: Linear::init(rng, hidden, 3 * hidden, std, qkv_bias),
            proj: Linear::init(rng, hidden, hidden, residual_std, bias),
            ln2: LayerNorm::new(hidden),
            fc1: Linear::init(rng, hidden, ffn, std, bias),
            fc2: Linear::init(rng, ffn, hidden, residual_std, bias),
        }
    }

    /// The attention shape of this block's heads (a tensor-parallel rank's: `heads` is its
    /// own, and `qkv` is `3 · heads · d` wide).
    fn shape(&self, tokens: usize, sequences: usize) -> AttentionShape {
        AttentionShape {
            sequences,
            seq_len: tokens / sequences.max(1),
            heads: self.heads,
            head_dim: self.qkv.weight.cols() / (3 * self.heads.max(1)),
        }
    }

    /// Forward over `sequences` sequences stacked in the rows of `x` (`tokens × h`).
    pub fn forward(&self, x: &Tensor, sequences: usize) -> (Tensor, BlockSaved) {
        alone(|tp| self.forward_tp(x, sequences, tp))
    }

    /// [`Block::forward`] on a tensor-parallel rank (see [`super::tp`]): the partial products
    /// of `proj` and `fc2` are all-reduced over the group. With sequence parallelism
    /// ([`super::sp`]) `x` and the output are the rank's sequence shard: the norms' outputs
    /// are all-gathered and the partial products reduce-scattered.
    pub fn forward_tp(
        &self,
        x: &Tensor,
        sequences: usize,
        tp: &mut dyn TpComm,
    ) -> Result<(Tensor, BlockSaved), TransportError> {
        let (ln1_out, ln1) = self.ln1.forward(x);
        let ln1_out = tp.gather_rows(&ln1_out, sequences)?.unwrap_or(ln1_out);
        let shape = self.shape(ln1_out.rows(), sequences);
        let qkv = self.qkv.forward(&ln1_out);
        let (attn_out, probs) = attention::forward(&qkv, shape);
        let x2 = row_parallel(&self.proj, &attn_out, x, sequences, tp)?;
        let (ln2_out, ln2) = self.ln2.forward(&x2);
        let ln2_out = tp.gather_rows(&ln2_out, sequences)?.unwrap_or(ln2_out);
        let fc1_out = self.fc1.forward(&ln2_out);
        let mut gelu_out = Tensor::scratch(fc1_out.rows(), fc1_out.cols());
        kernels::gelu_forward(fc1_out.data(), gelu_out.data_mut());
        let y = row_parallel(&self.fc2, &gelu_out, &x2, sequences, tp)?;
        let saved = BlockSaved {
            sequences,
            ln1,
            ln1_out,
            qkv,
            probs,
            attn_out,
            ln2,
            ln2_out,
            fc1_out,
            gelu_out,
        };
        Ok((y, saved))
    }

    /// Backward-input: the gradient with respect to the block's input, and what
    /// backward-weight needs. Consumes the forward's saved tensors.
    pub fn backward_input(&self, saved: BlockSaved, d_out: Tensor) -> (Tensor, BlockWeightSaved) {
        alone(|tp| self.backward_input_tp(saved, d_out, tp))
    }

    /// [`Block::backward_input`] on a tensor-parallel rank: the partial input gradients of
    /// `fc1` and `qkv` are all-reduced over the group. With sequence parallelism `d_out` and
    /// the input gradient are the rank's sequence shard: the gradients entering `fc2` and
    /// `proj` are all-gathered, the partial input gradients reduce-scattered, and the norms'
    /// weight gradients summed over the group ([`NormGrads`]).
    pub fn backward_input_tp(
        &self,
        saved: BlockSaved,
        d_out: Tensor,
        tp: &mut dyn TpComm,
    ) -> Result<(Tensor, BlockWeightSaved), TransportError> {
        let seqs = saved.sequences;
        let d_out_whole = tp.gather_rows(&d_out, seqs)?;
        let dy = d_out_whole.as_ref().unwrap_or(&d_out);
        let shape = self.shape(dy.rows(), seqs);
        let seq_len = dy.rows() / seqs.max(1);
        // the GeLU output's gradient becomes its input's in place
        let mut d_fc1_out = self.fc2.backward_input(dy);
        kernels::gelu_backward(d_fc1_out.data_mut(), saved.fc1_out.data());
        let (w1, wqkv) = (&self.fc1.weight, &self.qkv.weight);
        let d_ln2_out = split_product(&d_fc1_out, w1, true, (even_cols, even_cols), seqs, tp)?;
        let mut d_x2 = self.ln2.backward_input(&saved.ln2, &d_ln2_out);
        d_x2.add_assign(&d_out);
        let d_x2_whole = tp.gather_rows(&d_x2, seqs)?;
        let d_attn = self
            .proj
            .backward_input(d_x2_whole.as_ref().unwrap_or(&d_x2));
        let d_qkv = attention::backward(&saved.qkv, &saved.probs, &d_attn, shape);
        let d_ln1_out = split_product(&d_qkv, wqkv, true, (heads_cols, heads_cols), seqs, tp)?;
        let mut dx = self.ln1.backward_input(&saved.ln1, &d_ln1_out);
        dx.add_assign(&d_x2);
        let ln1_grads = NormGrads::in_backward_input(tp, &saved.ln1.xhat, &d_ln1_out, seq_len)?;
        let ln2_grads = NormGrads::in_backward_input(tp, &saved.ln2.xhat, &d_ln2_out, seq_len)?;
        let d_x2 = d_x2_whole.unwrap_or(d_x2);
        let d_out = d_out_whole.unwrap_or(d_out);
        let ws = BlockWeightSaved {
            ln1_xhat: saved.ln1.xhat,
            d_ln1_out,
            ln1_out: saved.ln1_out,
            d_qkv,
            attn_out: saved.attn_out,
            d_x2,
            ln2_xhat: saved.ln2.xhat,
            d_ln2_out,
            ln2_out: saved.ln2_out,
            d_fc1_out,
            gelu_out: saved.gelu_out,
            d_out,
            ln1_grads,
            ln2_grads,
        };
        Ok((dx, ws))
    }

    /// Backward-weight: adds the weight gradients of the tokens `rows` (rows of the
    /// micro-batch; all of them in a pipelined run) into `grads`.
    ///
    /// The key bias gets no gradient: adding a constant vector `c` to every key adds `q·c` to
    /// every score of a query, which the softmax cancels, so `∂L/∂b_K = Σ_j dK_j = 0` exactly
    /// (`Σ_j dS_ij = 0`). Leaving it at zero rather than at rounding noise keeps AdamW — which
    /// normalises a gradient's size away — from turning that noise into updates.
    pub fn backward_weight(&self, ws: &BlockWeightSaved, grads: &mut Block, rows: Range<usize>) {
        let norm =
            |g: &NormGrads, xhat, dy, acc: &mut LayerNorm| g.add(xhat, dy, acc, rows.clone());
        norm(&ws.ln1_grads, &ws.ln1_xhat, &ws.d_ln1_out, &mut grads.ln1);
        // this rank's width of each of Q, K and V
        let h = self.qkv.weight.cols() / 3;
        Linear::backward_weight(&ws.ln1_out, &ws.d_qkv, &mut grads.qkv, rows.clone());
        if let Some(b) = &mut grads.qkv.bias {
            b.data_mut()[h..2 * h].fill(0.0);
        }
        Linear::backward_weight(&ws.attn_out, &ws.d_x2, &mut grads.proj, rows.clone());
        norm(&ws.ln2_grads, &ws.ln2_xhat, &ws.d_ln2_out, &mut grads.ln2);
        Linear::backward_weight(&ws.ln2_out, &ws.d_fc1_out, &mut grads.fc1, rows.clone());
        Linear::backward_weight(&ws.gelu_out, &ws.d_out, &mut grads.fc2, rows);
    }

    /// Zero gradients of the same shapes.
    pub fn zeros_like(&self) -> Block {
        Block {
            heads: self.heads,
            ln1: self.ln1.zeros_like(),
            qkv: self.qkv.zeros_like(),
            proj: self.proj.zeros_like(),
            ln2: self.ln2.zeros_like(),
            fc1: self.fc1.zeros_like(),
            fc2: self.fc2.zeros_like(),
        }
    }
}

impl<T> Block<T> {
    /// The parameters (or gradients) with their names, in a fixed order.
    pub fn params(&self) -> Vec<(&'static str, &T)> {
        let mut out = vec![("ln1.gamma", &self.ln1.gamma), ("ln1.beta", &self.ln1.beta)];
        out.push(("qkv.weight", &self.qkv.weight));
        out.extend(self.qkv.bias.as_ref().map(|b| ("qkv.bias", b)));
        out.push(("proj.weight", &self.proj.weight));
        out.extend(self.proj.bias.as_ref().map(|b| ("proj.bias", b)));
        out.push(("ln2.gamma", &self.ln2.gamma));
        out.push(("ln2.beta", &self.ln2.beta));
        out.push(("fc1.weight", &self.fc1.weight));
        out.extend(self.fc1.bias.as_ref().map(|b| ("fc1.bias", b)));
        out.push(("fc2.weight", &self.fc2.weight));
        out.extend(self.fc2.bias.as_ref().map(|b| ("fc2.bias", b)));
        out
    }

    /// The parameters (or gradients), mutable, in the order of [`Block::params`].
    pub fn params_mut(&mut self) -> Vec<&mut T> {
        let mut out = vec![
            &mut self.ln1.gamma,
            &mut self.ln1.beta,
            &mut self.qkv.weight,
        ];
        out.extend(self.qkv.bias.as_mut());
        out.push(&mut self.proj.weight);
        out.extend(self.proj.bias.as_mut());
        out.push(&mut self.ln2.gamma);
        out.push(&mut self.ln2.beta);
        out.push(&mut self.fc1.weight);
        out.extend(self.fc1.bias.as_mut());
        out.push(&mut self.fc2.weight);
        out.extend(self.fc2.bias.as_mut());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The weight gradients of a micro-batch added by token ranges equal (to rounding) those
    /// added at once, and the key bias's stays exactly zero.
    #[test]
    fn weight_gradients_by_token_ranges() {
        let mut rng = Rng::new(3);
        let block = Block::init(&mut rng, 16, 2, 64, 2, true, true);
        let data: Vec<f32> = (0..2 * 8 * 16).map(|_| rng.normal() as f32).collect();
        let x = Tensor::from_vec(16, 16, data);
        let (_, saved) = block.forward(&x, 2);
        let (_, ws) = block.backward_input(saved, Tensor::full(16, 16, 0.1));
        let mut whole = block.zeros_like();
        block.backward_weight(&ws, &mut whole, 0..16);
        let mut parts = block.zeros_like();
        block.backward_weight(&ws, &mut parts, 0..8);
        block.backward_weight(&ws, &mut parts, 8..16);
        for ((name, a), (_, b)) in parts.params().into_iter().zip(whole.params()) {
            assert!(a.distance(b) <= 1e-5 * b.norm().max(1e-6), "{name}");
        }
        let kb = &whole.qkv.bias.as_ref().unwrap().data()[16..32];
        assert!(kb.iter().all(|&v| v == 0.0));
    }
}
