//! A pipeline stage: a contiguous run of layer-list entries with their gradient accumulators,
//! and the initialisation that makes every rank's stage equal to the same layers of the
//! single-worker model.

use autopp_models::TransformerSpec;
use autopp_profiler::device::{init_layer, Flow, Layer, Saved, Shard, Tensor, TpComm, WeightSaved};

use crate::error::RankError;

/// One stage's layers and their accumulated gradients.
#[derive(Debug, Clone, PartialEq)]
pub struct Stage {
    /// Index of the stage's first layer in the layer list.
    pub first_layer: usize,
    /// The layers.
    pub layers: Vec<Layer>,
    /// Gradients accumulated over micro-batches (in f32, in the order the rank runs them),
    /// one per layer.
    pub grads: Vec<Layer>,
}

/// What a stage's forward keeps for one micro-batch: each layer's saved tensors.
#[derive(Debug)]
pub struct StageSaved(Vec<Saved>);

/// What a stage's backward-input keeps for its backward-weight.
#[derive(Debug)]
pub struct StageWeightSaved(Vec<WeightSaved>);

impl StageSaved {
    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.0.iter().map(Saved::bytes).sum()
    }
}

impl StageWeightSaved {
    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.0.iter().map(WeightSaved::bytes).sum()
    }
}

impl Stage {
    /// Layer-list entries `range` of `spec`, initialised from `seed`: tensor-parallel rank
    /// `shard`'s slices of them ([`Shard::WHOLE`]: the whole layers), each layer initialised
    /// whole and then sliced, so the ranks' slices make up the single-worker model.
    pub fn new(
        spec: &TransformerSpec,
        seed: u64,
        range: std::ops::Range<usize>,
        shard: Shard,
    ) -> Self {
        let first_layer = range.start;
        let layers: Vec<Layer> = range
            .map(|i| init_layer(spec, seed, i).shard(shard))
            .collect();
        let grads = layers.iter().map(Layer::zeros_like).collect();
        Stage {
            first_layer,
            layers,
            grads,
        }
    }

    /// Forward of `sequences` sequences of `seq_len` tokens; the head (if the stage has it)
    /// takes `targets` and the stage then returns [`Flow::Loss`].
    pub(crate) fn forward(
        &self,
        input: Flow,
        mut targets: Option<Vec<u32>>,
        sequences: usize,
        seq_len: usize,
        tp: &mut dyn TpComm,
    ) -> Result<(Flow, StageSaved), RankError> {
        let mut flow = input;
        let mut saved = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let t = matches!(layer, Layer::Head(_))
                .then(|| targets.take())
                .flatten();
            let (out, s) = layer.forward_tp(flow, t, sequences, seq_len, tp)?;
            flow = out;
            saved.push(s);
        }
        Ok((flow, StageSaved(saved)))
    }

    /// Backward-input through the layers in reverse: from the gradient of the stage's output
    /// (`None` when the stage ends with the head) to the gradient of its input (`None` when it
    /// starts with the embedding).
    pub(crate) fn backward_input(
        &self,
        saved: StageSaved,
        d_out: Option<Tensor>,
        loss_scale: f32,
        tp: &mut dyn TpComm,
    ) -> Result<(Option<Tensor>, StageWeightSaved), RankError> {
        let mut grad = d_out;
        let mut kept = Vec::with_capacity(saved.0.len());
        for (layer, s) in self.layers.iter().zip(saved.0).rev() {
            let (dx, ws) = layer.backward_input_tp(s, grad, loss_scale, tp)?;
            grad = dx;
            kept.push(ws);
        }
        kept.reverse();
        Ok((grad, StageWeightSaved(kept)))
    }

    /// Backward-weight: adds the micro-batch's weight gradients into [`Stage::grads`].
    pub(crate) fn backward_weight(&mut self, ws: StageWeightSaved) -> Result<(), RankError> {
        for ((layer, grads), w) in self.layers.iter().zip(&mut self.grads).zip(ws.0) {
            layer.backward_weight(w, grads)?;
        }
        Ok(())
    }

    /// Backward-weight of layer `layer` (index within the stage) for the tokens `rows` of
    /// the micro-batch `ws` was kept for; `--check`'s single worker adds a whole batch's
    /// gradients this way, micro-batch by micro-batch in the pipelined run's order.
    pub(crate) fn backward_weight_rows(
        &mut self,
        ws: &StageWeightSaved,
        layer: usize,
        rows: std::ops::Range<usize>,
    ) -> Result<(), RankError> {
        Ok(self.layers[layer].backward_weight_rows(&ws.0[layer], &mut self.grads[layer], rows)?)
    }

    /// Every gradient element widened to f64, concatenated in layer and parameter order, into
    /// `flat` (cleared first; for the all-reduce, which sums in f64).
    pub fn flat_grads_into(&self, flat: &mut Vec<f64>) {
        flat.clear();
        for g in &self.grads {
            for (_, t) in g.params() {
                flat.extend(t.data().iter().map(|&x| f64::from(x)));
            }
        }
    }

    /// Every gradient element widened to f64 (see [`Stage::flat_grads_into`]).
    pub fn flat_grads(&self) -> Vec<f64> {
        let mut flat = Vec::new();
        self.flat_grads_into(&mut flat);
        flat
    }

    /// Writes back a buffer from [`Stage::flat_grads`], each sum rounded once to f32.
    pub fn set_flat_grads(&mut self, flat: &[f64]) {
        let mut at = 0;
        for g in &mut self.grads {
            for t in g.params_mut() {
                let n = t.len();
                for (x, &v) in t.data_mut().iter_mut().zip(&flat[at..at + n]) {
                    *x = v as f32;
                }
                at += n;
            }
        }
    }

    /// Every parameter element, concatenated in layer and parameter order (to gather a
    /// process's weights for `--check`).
    pub fn flat_params(&self) -> Vec<f64> {
        self.layers
            .iter()
            .flat_map(|l| {
                l.params()
                    .into_iter()
                    .flat_map(|(_, t)| t.data().iter().map(|&x| f64::from(x)))
            })
            .collect()
    }

    /// Writes back a buffer from [`Stage::flat_params`] (each value was an f32).
    pub fn set_flat_params(&mut self, flat: &[f64]) {
        let mut at = 0;
        for l in &mut self.layers {
            for t in l.params_mut() {
                let n = t.len();
                for (x, &v) in t.data_mut().iter_mut().zip(&flat[at..at + n]) {
                    *x = v as f32;
                }
                at += n;
            }
        }
    }

    /// Zeroes the accumulated gradients.
    pub fn zero_grads(&mut self) {
        for g in &mut self.grads {
            g.params_mut().into_iter().for_each(Tensor::fill_zero);
        }
    }

    /// The parameters as `("layer 3 qkv.weight", tensor)`, with layer-list indices.
    pub fn named_params(&self) -> Vec<(String, &Tensor)> {
        self.layers
            .iter()
            .enumerate()
            .flat_map(|(k, l)| {
                let i = self.first_layer + k;
                l.params()
                    .into_iter()
                    .map(move |(n, t)| (format!("layer {i} {n}"), t))
            })
            .collect()
    }
}
