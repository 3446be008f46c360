//! [`Layer`]: one entry of a transformer's layer list (embedding, block or head) behind one
//! interface — `forward`, `backward_input`, `backward_weight` — so a pipeline stage is a list of
//! layers and a full backward `B` is `backward_input` then `backward_weight`.

use super::block::{Block, BlockSaved, BlockWeightSaved};
use super::embedding::{Embedding, EmbeddingWeightSaved, TOKEN_ID_BYTES};
use super::head::{Head, HeadSaved, HeadWeightSaved};
use super::tensor::Tensor;
use super::tp::{Emulated, TpComm};
use super::DeviceError;

/// What flows between layers in the forward direction.
#[derive(Debug, Clone, PartialEq)]
pub enum Flow {
    /// Token ids, sequences concatenated (into the embedding).
    Tokens(Vec<u32>),
    /// The hidden state, `tokens × h`.
    Hidden(Tensor),
    /// The summed token loss (out of the head).
    Loss(f64),
}

impl Flow {
    fn name(&self) -> &'static str {
        match self {
            Flow::Tokens(_) => "token ids",
            Flow::Hidden(_) => "a hidden state",
            Flow::Loss(_) => "a loss",
        }
    }
}

/// One layer-list entry — or, as a second `Layer` (from [`Layer::zeros_like`]), its
/// gradients, accumulated in f32.
#[derive(Debug, Clone, PartialEq)]
pub enum Layer<T = Tensor> {
    /// Token (and position) embedding.
    Embedding(Embedding<T>),
    /// Transformer block.
    Block(Box<Block<T>>),
    /// Final norm, LM head and loss.
    Head(Head<T>),
}

/// What a layer's forward keeps for its backward.
#[derive(Debug, Clone, PartialEq)]
pub enum Saved {
    /// The embedding keeps its token ids.
    Embedding {
        /// Token ids.
        ids: Vec<u32>,
        /// Tokens per sequence.
        seq_len: usize,
    },
    /// A block's tensors.
    Block(Box<BlockSaved>),
    /// The head's tensors.
    Head(HeadSaved),
}

impl Saved {
    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        match self {
            Saved::Embedding { ids, .. } => ids.len() as u64 * TOKEN_ID_BYTES,
            Saved::Block(s) => s.bytes(),
            Saved::Head(s) => s.bytes(),
        }
    }
}

/// What a layer's backward-weight needs, held from backward-input to backward-weight.
#[derive(Debug, Clone, PartialEq)]
pub enum WeightSaved {
    /// The embedding's ids and output gradient.
    Embedding(EmbeddingWeightSaved),
    /// A block's weight inputs and output gradients.
    Block(Box<BlockWeightSaved>),
    /// The head's.
    Head(HeadWeightSaved),
}

impl WeightSaved {
    /// Tokens (rows) of the micro-batch.
    pub fn tokens(&self) -> usize {
        match self {
            WeightSaved::Embedding(s) => s.tokens(),
            WeightSaved::Block(s) => s.tokens(),
            WeightSaved::Head(s) => s.tokens(),
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        match self {
            WeightSaved::Embedding(s) => s.bytes(),
            WeightSaved::Block(s) => s.bytes(),
            WeightSaved::Head(s) => s.bytes(),
        }
    }
}

impl<T> Layer<T> {
    /// `embedding`, `block` or `head`.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Layer::Embedding(_) => "embedding",
            Layer::Block(_) => "block",
            Layer::Head(_) => "head",
        }
    }

    /// The parameters (or gradients) with their names, in a fixed order.
    pub fn params(&self) -> Vec<(&'static str, &T)> {
        match self {
            Layer::Embedding(e) => {
                let mut v = vec![("tokens", &e.tokens)];
                v.extend(e.positions.as_ref().map(|p| ("positions", p)));
                v
            }
            Layer::Block(b) => b.params(),
            Layer::Head(h) => vec![
                ("norm.gamma", &h.norm.gamma),
                ("norm.beta", &h.norm.beta),
                ("lm_head", &h.lm_head),
            ],
        }
    }

    /// The parameters (or gradients), mutable, in the order of [`Layer::params`].
    pub fn params_mut(&mut self) -> Vec<&mut T> {
        match self {
            Layer::Embedding(e) => {
                let mut v = vec![&mut e.tokens];
                v.extend(e.positions.as_mut());
                v
            }
            Layer::Block(b) => b.params_mut(),
            Layer::Head(h) => vec![&mut h.norm.gamma, &mut h.norm.beta, &mut h.lm_head],
        }
    }
}

impl Layer {
    /// Forward over `sequences` sequences of `seq_len` tokens. The head needs `targets` (one
    /// per token) and returns [`Flow::Loss`], the *sum* of the token losses.
    pub fn forward(
        &self,
        input: Flow,
        targets: Option<Vec<u32>>,
        sequences: usize,
        seq_len: usize,
    ) -> Result<(Flow, Saved), DeviceError> {
        self.forward_tp(input, targets, sequences, seq_len, &mut Emulated::tp(1))
    }

    /// [`Layer::forward`] on a tensor-parallel rank whose group's collective is `tp` (this
    /// layer a [`Layer::shard`] of the whole).
    pub fn forward_tp(
        &self,
        input: Flow,
        targets: Option<Vec<u32>>,
        sequences: usize,
        seq_len: usize,
        tp: &mut dyn TpComm,
    ) -> Result<(Flow, Saved), DeviceError> {
        match (self, input) {
            (Layer::Embedding(e), Flow::Tokens(ids)) => {
                if let Some(&bad) = ids.iter().find(|&&id| id as usize >= e.vocab()) {
                    return Err(DeviceError::Input(format!(
                        "token id {bad} is outside the vocabulary of {}",
                        e.vocab()
                    )));
                }
                let y = e.forward_tp(&ids, seq_len, tp)?;
                Ok((Flow::Hidden(y), Saved::Embedding { ids, seq_len }))
            }
            (Layer::Block(b), Flow::Hidden(x)) => {
                let (y, saved) = b.forward_tp(&x, sequences, tp)?;
                Ok((Flow::Hidden(y), Saved::Block(Box::new(saved))))
            }
            (Layer::Head(h), Flow::Hidden(x)) => {
                let targets = targets.ok_or_else(|| {
                    DeviceError::Input("the head needs the targets of its micro-batch".into())
                })?;
                // with sequence parallelism `x` is one shard of the tokens
                let tokens = x.rows() * tp.seq_part().size;
                if targets.len() != tokens {
                    return Err(DeviceError::Input(format!(
                        "the head got {} targets for {tokens} tokens",
                        targets.len(),
                    )));
                }
                let (loss, saved) = h.forward_tp(&x, targets, sequences, tp)?;
                Ok((Flow::Loss(loss), Saved::Head(saved)))
            }
            (layer, input) => Err(DeviceError::Input(format!(
                "the {} layer cannot take {} as input",
                layer.kind_name(),
                input.name()
            ))),
        }
    }

    /// Backward-input: from the gradient of the layer's output (`None` for the head, which
    /// starts from the loss scaled by `loss_scale`) to the gradient of its input (`None` for
    /// the embedding), plus what backward-weight needs.
    pub fn backward_input(
        &self,
        saved: Saved,
        d_out: Option<Tensor>,
        loss_scale: f32,
    ) -> Result<(Option<Tensor>, WeightSaved), DeviceError> {
        self.backward_input_tp(saved, d_out, loss_scale, &mut Emulated::tp(1))
    }

    /// [`Layer::backward_input`] on a tensor-parallel rank whose group's collective is `tp`.
    pub fn backward_input_tp(
        &self,
        saved: Saved,
        d_out: Option<Tensor>,
        loss_scale: f32,
        tp: &mut dyn TpComm,
    ) -> Result<(Option<Tensor>, WeightSaved), DeviceError> {
        match (self, saved, d_out) {
            (Layer::Embedding(_), Saved::Embedding { ids, seq_len }, Some(dy)) => {
                // with sequence parallelism the whole sequences' gradient from the shards
                let dy = tp
                    .gather_rows(&dy, ids.len() / seq_len.max(1))?
                    .unwrap_or(dy);
                Ok((
                    None,
                    WeightSaved::Embedding(Embedding::backward_input(ids, seq_len, dy)),
                ))
            }
            (Layer::Block(b), Saved::Block(s), Some(dy)) => {
                let (dx, ws) = b.backward_input_tp(*s, dy, tp)?;
                Ok((Some(dx), WeightSaved::Block(Box::new(ws))))
            }
            (Layer::Head(h), Saved::Head(s), None) => {
                let (dx, ws) = h.backward_input_tp(s, loss_scale, tp)?;
                Ok((Some(dx), WeightSaved::Head(ws)))
            }
            (layer, _, _) => Err(DeviceError::Input(format!(
                "backward of the {} layer got saved state or an output gradient of another kind",
                layer.kind_name()
            ))),
        }
    }

    /// Backward-weight: adds this micro-batch's weight gradients into `grads` (a layer of the
    /// same kind and shapes, e.g. from [`Layer::zeros_like`]).
    pub fn backward_weight(&self, ws: WeightSaved, grads: &mut Layer) -> Result<(), DeviceError> {
        let tokens = ws.tokens();
        self.backward_weight_rows(&ws, grads, 0..tokens)
    }

    /// Backward-weight of the tokens `rows` of the micro-batch only: adds their weight
    /// gradients into `grads`. Called on consecutive ranges it adds the same products, in the
    /// same order, as a pipelined run whose micro-batches are those ranges — how `--check`'s
    /// single worker sums each weight gradient in the pipelined run's order.
    ///
    /// # Errors
    /// [`DeviceError::Input`] if `ws` or `grads` is of another kind, or `rows` reaches past the
    /// micro-batch.
    pub fn backward_weight_rows(
        &self,
        ws: &WeightSaved,
        grads: &mut Layer,
        rows: std::ops::Range<usize>,
    ) -> Result<(), DeviceError> {
        if rows.end > ws.tokens() {
            return Err(DeviceError::Input(format!(
                "backward-weight of tokens {rows:?} of a micro-batch of {}",
                ws.tokens()
            )));
        }
        match (self, ws, grads) {
            (Layer::Embedding(_), WeightSaved::Embedding(ws), Layer::Embedding(g)) => {
                Embedding::backward_weight(ws, g, rows)
            }
            (Layer::Block(b), WeightSaved::Block(ws), Layer::Block(g)) => {
                b.backward_weight(ws, g, rows)
            }
            (Layer::Head(_), WeightSaved::Head(ws), Layer::Head(g)) => {
                Head::backward_weight(ws, g, rows)
            }
            (layer, _, _) => {
                return Err(DeviceError::Input(format!(
                    "backward-weight of the {} layer got state or gradients of another kind",
                    layer.kind_name()
                )))
            }
        }
        Ok(())
    }

    /// Zero gradients of the same kind and shapes.
    pub fn zeros_like(&self) -> Layer {
        match self {
            Layer::Embedding(e) => Layer::Embedding(e.zeros_like()),
            Layer::Block(b) => Layer::Block(Box::new(b.zeros_like())),
            Layer::Head(h) => Layer::Head(h.zeros_like()),
        }
    }

    /// Number of parameters.
    pub fn num_params(&self) -> usize {
        self.params().iter().map(|(_, t)| t.len()).sum()
    }
}
