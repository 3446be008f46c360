//! Explicit layer lists: models that are not transformers, given layer by layer.
//!
//! ```json
//! {
//!   "name": "my-net",
//!   "seq_length": 1024,
//!   "global_batch_size": 256,
//!   "layers": [
//!     {"name": "stem", "params": 1.0e6, "forward_flops": 4.0e9,
//!      "activation_bytes": 8388608, "output_bytes": 2097152},
//!     {"name": "block", "count": 12, "params": 7.1e6, "forward_flops": 2.9e10,
//!      "backward_weight_flops": 2.9e10, "activation_bytes": 3.4e7,
//!      "activation_bytes_full": 2097152, "output_bytes": 2097152}
//!   ]
//! }
//! ```
//!
//! Every value is **per sequence** (micro-batch size 1) and **unsharded** (tensor-parallel
//! degree 1); counts may be written as integers or in exponent notation. Expanding for a
//! [`ShardSpec`]:
//!
//! * micro-batch size `b` multiplies FLOPs and bytes;
//! * tensor parallelism is *idealised*: each layer is taken to be a Megatron-style
//!   column-then-row-parallel pair, so parameters, FLOPs, activation bytes and output bytes all
//!   divide by `tp` (rounded up), and the layer adds one all-reduce of its whole output
//!   (`b · output_bytes`) to the forward and one to the backward (with sequence parallelism an
//!   all-gather and a reduce-scatter of the same size instead);
//! * context parallelism is rejected (a layer list has no attention to split);
//! * a layer's FLOPs become one GEMM `[b·s × n]·[n × k]` with `2·b·s·n·k` equal to the FLOPs
//!   (rounded down to an even count) and `n ≈ k` — the square GEMM of the same work — so that a
//!   profiler's shape-dependent efficiency sees a plausible shape; a small remainder GEMM
//!   carries what does not divide. There are no memory-bound ops: write their work as FLOPs if
//!   it matters.
//!
//! Defaults: `backward_input_flops` and `backward_weight_flops` equal `forward_flops` (backward ≈
//! 2 × forward); `activation_bytes_full` (what full recompute keeps) is the layer's input, i.e.
//! the previous layer's `output_bytes` (its own `activation_bytes` for the first layer), capped
//! at `activation_bytes`; `count` is 1. Selective recompute keeps what no recompute keeps.

use serde::{Deserialize, Serialize};

use crate::json::{opt_whole_number, whole_number};
use crate::layer::{ActivationBytes, Collective, CollectiveKind, LayerCost, LayerKind, Op};
use crate::transformer::limits::{MAX_GLOBAL_BATCH_SIZE, MAX_SEQ_LENGTH};
use crate::{ModelError, ShardSpec};

/// Most entries a layer list may expand to (after `count`).
pub const MAX_LAYER_ENTRIES: u64 = 1_000_000;

/// Largest per-sequence count (parameters, FLOPs, bytes) one layer may give: 2^53, the largest
/// integer a JSON float holds exactly.
pub const MAX_LAYER_VALUE: u64 = 1 << 53;

fn is_none<T>(value: &Option<T>) -> bool {
    value.is_none()
}

/// One entry of a layer list, per sequence and unsharded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustomLayer {
    /// Layer name (a repeated layer gets ` 0`, ` 1`, … appended).
    pub name: String,
    /// Parameters of the layer.
    #[serde(deserialize_with = "whole_number")]
    pub params: u64,
    /// Forward FLOPs per sequence.
    #[serde(deserialize_with = "whole_number")]
    pub forward_flops: u64,
    /// Backward-input FLOPs per sequence; defaults to `forward_flops`.
    #[serde(
        default,
        deserialize_with = "opt_whole_number",
        skip_serializing_if = "is_none"
    )]
    pub backward_input_flops: Option<u64>,
    /// Backward-weight FLOPs per sequence; defaults to `forward_flops` (0 for a layer without
    /// weights).
    #[serde(
        default,
        deserialize_with = "opt_whole_number",
        skip_serializing_if = "is_none"
    )]
    pub backward_weight_flops: Option<u64>,
    /// Bytes kept from forward to backward per sequence without recomputation.
    #[serde(deserialize_with = "whole_number")]
    pub activation_bytes: u64,
    /// Bytes kept per sequence under full recompute; defaults to the layer's input (the previous
    /// layer's `output_bytes`), capped at `activation_bytes`.
    #[serde(
        default,
        deserialize_with = "opt_whole_number",
        skip_serializing_if = "is_none"
    )]
    pub activation_bytes_full: Option<u64>,
    /// Bytes of the layer's output per sequence (what the next pipeline stage receives).
    #[serde(deserialize_with = "whole_number")]
    pub output_bytes: u64,
    /// How many identical copies of this layer follow one another; defaults to 1.
    #[serde(default, skip_serializing_if = "is_none")]
    pub count: Option<u64>,
}

impl CustomLayer {
    /// Copies of this layer.
    pub fn repeat(&self) -> u64 {
        self.count.unwrap_or(1)
    }
}

/// A model given as an explicit list of layers. Unknown keys are rejected.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerListSpec {
    /// Model name.
    pub name: String,
    /// Sequence length in tokens, the one the per-sequence costs were computed for.
    pub seq_length: u64,
    /// Default global batch, in sequences.
    #[serde(default)]
    pub global_batch_size: Option<u64>,
    /// The layers, in pipeline order.
    pub layers: Vec<CustomLayer>,
}

impl LayerListSpec {
    /// Checks the list; errors name the key (`layers[3].count`) and the fix.
    pub fn validate(&self) -> Result<(), ModelError> {
        if self.name.trim().is_empty() {
            return Err(ModelError::invalid("name", "must not be empty"));
        }
        for (key, value, max) in [
            ("seq_length", Some(self.seq_length), MAX_SEQ_LENGTH),
            (
                "global_batch_size",
                self.global_batch_size,
                MAX_GLOBAL_BATCH_SIZE,
            ),
        ] {
            match value {
                Some(0) => return Err(ModelError::invalid(key, "must be at least 1")),
                Some(v) if v > max => {
                    return Err(ModelError::invalid(
                        key,
                        &format!("= {v} is too large: autopp accepts at most {max}"),
                    ))
                }
                _ => {}
            }
        }
        if self.layers.is_empty() {
            return Err(ModelError::invalid(
                "layers",
                "is empty: list at least one layer",
            ));
        }
        let mut entries: u64 = 0;
        let mut params: u128 = 0;
        for (i, layer) in self.layers.iter().enumerate() {
            let key = |k: &str| format!("layers[{i}].{k}");
            if layer.name.trim().is_empty() {
                return Err(ModelError::invalid(&key("name"), "must not be empty"));
            }
            if layer.count == Some(0) {
                return Err(ModelError::invalid(&key("count"), "must be at least 1"));
            }
            let values = [
                ("params", Some(layer.params)),
                ("forward_flops", Some(layer.forward_flops)),
                ("backward_input_flops", layer.backward_input_flops),
                ("backward_weight_flops", layer.backward_weight_flops),
                ("activation_bytes", Some(layer.activation_bytes)),
                ("activation_bytes_full", layer.activation_bytes_full),
                ("output_bytes", Some(layer.output_bytes)),
            ];
            for (k, value) in values {
                if let Some(v) = value.filter(|&v| v > MAX_LAYER_VALUE) {
                    return Err(ModelError::invalid(
                        &key(k),
                        &format!("= {v} is too large: at most {MAX_LAYER_VALUE} per sequence"),
                    ));
                }
            }
            if let Some(full) = layer.activation_bytes_full {
                if full > layer.activation_bytes {
                    return Err(ModelError::invalid(
                        &key("activation_bytes_full"),
                        &format!(
                            "= {full} exceeds activation_bytes = {}: full recompute keeps at most what no recompute keeps",
                            layer.activation_bytes
                        ),
                    ));
                }
            }
            entries = entries.saturating_add(layer.repeat());
            params += u128::from(layer.params) * u128::from(layer.repeat());
        }
        if entries > MAX_LAYER_ENTRIES {
            return Err(ModelError::invalid(
                "layers",
                &format!("expand to {entries} entries (with count): at most {MAX_LAYER_ENTRIES}"),
            ));
        }
        if params > u128::from(u64::MAX >> 2) {
            return Err(ModelError::invalid(
                "layers",
                "hold more parameters than autopp can count: check the params values",
            ));
        }
        Ok(())
    }

    /// Total parameters: the sum of `params · count`.
    pub fn num_params(&self) -> u64 {
        self.layers
            .iter()
            .map(|l| l.params.saturating_mul(l.repeat()))
            .fold(0, u64::saturating_add)
    }

    /// Entries in the expanded layer list: the sum of `count`.
    pub fn num_layer_entries(&self) -> usize {
        self.layers
            .iter()
            .map(|l| usize::try_from(l.repeat()).unwrap_or(usize::MAX))
            .fold(0, usize::saturating_add)
    }

    /// The layer list for one GPU (see the module documentation for how `b` and `tp` apply).
    pub fn layers(&self, shard: &ShardSpec) -> Result<Vec<LayerCost>, ModelError> {
        self.validate()?;
        crate::transformer::check_shard(shard)?;
        if shard.cp > 1 {
            return Err(ModelError::Shard(format!(
                "--cp {} cannot split a layer list (it has no attention to split): use --cp 1 for model '{}'",
                shard.cp, self.name
            )));
        }
        let b = u128::from(shard.micro_batch_size);
        let t = u128::from(shard.tp);
        // per-GPU value of a per-sequence count: b·v/t rounded up
        let scale = |v: u64| -> Result<u64, ModelError> {
            let x = (b * u128::from(v)).div_ceil(t);
            u64::try_from(x)
                .ok()
                .filter(|&x| x <= u64::MAX >> 2)
                .ok_or_else(|| {
                    ModelError::Shard(format!(
                        "--mbs {} makes the byte and FLOP counts of model '{}' too large to count: use a smaller micro-batch",
                        shard.micro_batch_size, self.name
                    ))
                })
        };
        let tokens = shard.micro_batch_size * self.seq_length;
        let mut out = Vec::with_capacity(self.num_layer_entries());
        let mut previous_output: Option<u64> = None;
        for layer in &self.layers {
            let fwd = layer.forward_flops;
            let flops = |v: u64| -> Result<Vec<Op>, ModelError> { Ok(gemm_ops(scale(v)?, tokens)) };
            let forward_ops = flops(fwd)?;
            let backward_input_ops = flops(layer.backward_input_flops.unwrap_or(fwd))?;
            let bw = layer.backward_weight_flops.unwrap_or(fwd);
            let backward_weight_ops = flops(bw)?;
            let none = scale(layer.activation_bytes)?;
            let output_whole = u64::try_from(b * u128::from(layer.output_bytes))
                .map_err(|_| ModelError::Shard("output bytes overflow".into()))?;
            let (tp_forward, tp_backward) = collectives(shard, output_whole);
            for j in 0..layer.repeat() {
                let full_seq = layer.activation_bytes_full.unwrap_or_else(|| {
                    previous_output
                        .unwrap_or(layer.activation_bytes)
                        .min(layer.activation_bytes)
                });
                let full = scale(full_seq)?;
                out.push(LayerCost {
                    name: if layer.repeat() > 1 {
                        format!("{} {j}", layer.name)
                    } else {
                        layer.name.clone()
                    },
                    kind: LayerKind::Custom,
                    params_total: layer.params,
                    params: layer.params.div_ceil(shard.tp),
                    tied_params: 0,
                    forward_ops: forward_ops.clone(),
                    backward_input_ops: backward_input_ops.clone(),
                    backward_weight_ops: backward_weight_ops.clone(),
                    selective_recompute_ops: Vec::new(),
                    tp_forward: tp_forward.clone(),
                    tp_backward: tp_backward.clone(),
                    activation_bytes: ActivationBytes {
                        none,
                        selective: none,
                        full,
                    },
                    weight_grad_bytes: if bw > 0 { none } else { 0 },
                    output_bytes: scale(layer.output_bytes)?,
                    recomputable: true,
                    expert_params: 0,
                    ep_a2a_bytes: 0,
                    largest_weight_params: 0,
                });
                previous_output = Some(layer.output_bytes);
            }
        }
        Ok(out)
    }
}

/// The tensor-parallel collectives of one layer-list layer whose whole output is `bytes`.
fn collectives(shard: &ShardSpec, bytes: u64) -> (Vec<Collective>, Vec<Collective>) {
    if shard.tp <= 1 {
        return (Vec::new(), Vec::new());
    }
    let c = |kind| Collective { kind, bytes };
    if shard.sequence_parallel {
        let pair = vec![
            c(CollectiveKind::AllGather),
            c(CollectiveKind::ReduceScatter),
        ];
        (pair.clone(), pair)
    } else {
        (
            vec![c(CollectiveKind::AllReduce)],
            vec![c(CollectiveKind::AllReduce)],
        )
    }
}

/// Most candidate divisors tried when shaping a GEMM.
const DIVISOR_SEARCH: u64 = 4096;

/// `flops` of work as GEMMs over `tokens` rows: one `[tokens × n]·[n × k]` GEMM with `n ≈ k`
/// and `2·tokens·n·k` as close to `flops` as a divisor allows, plus remainder GEMMs so that the
/// total is exactly `flops` rounded down to an even number. They count as linear layers' GEMMs
/// (FP8 recipes run them in FP8): a layer list's work is its layers' matrix multiplies.
pub(crate) fn gemm_ops(flops: u64, tokens: u64) -> Vec<Op> {
    let half = flops / 2;
    let m = tokens.max(1);
    let q = half / m;
    let r0 = half - q * m;
    let mut ops = Vec::new();
    if q > 0 {
        let root = isqrt(q);
        let lowest = root.saturating_sub(DIVISOR_SEARCH).max(root / 2).max(1);
        let n = (lowest..=root)
            .rev()
            .find(|d| q.is_multiple_of(*d))
            .unwrap_or(root);
        let k = q / n;
        ops.push(Op::Gemm {
            m,
            n,
            k,
            count: 1,
            linear: true,
        });
        let r1 = q - n * k;
        if r1 > 0 {
            ops.push(Op::Gemm {
                m,
                n: r1,
                k: 1,
                count: 1,
                linear: true,
            });
        }
    }
    if r0 > 0 {
        ops.push(Op::Gemm {
            m: r0,
            n: 1,
            k: 1,
            count: 1,
            linear: true,
        });
    }
    ops
}

/// The integer square root `⌊√x⌋`.
fn isqrt(x: u64) -> u64 {
    let mut r = (x as f64).sqrt() as u64;
    while r.checked_mul(r).is_none_or(|sq| sq > x) {
        r -= 1;
    }
    while (r + 1).checked_mul(r + 1).is_some_and(|sq| sq <= x) {
        r += 1;
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn total(ops: &[Op]) -> f64 {
        ops.iter().map(Op::flops).sum()
    }

    #[test]
    fn square_gemm_for_a_dense_layer() {
        // a 4096 × 4096 linear layer over 2048 tokens
        let flops = 2 * 2048 * 4096 * 4096;
        let ops = gemm_ops(flops, 2048);
        assert_eq!(
            ops,
            vec![Op::Gemm {
                m: 2048,
                n: 4096,
                k: 4096,
                count: 1,
                linear: true,
            }]
        );
    }

    #[test]
    fn awkward_counts_sum_exactly() {
        for flops in [
            0,
            1,
            2,
            3,
            999_999_999_999,
            2 * 2048 * 7919 * 7907 + 10,
            1 << 53,
        ] {
            let ops = gemm_ops(flops, 2048);
            assert_eq!(total(&ops), (flops / 2 * 2) as f64, "{flops}");
        }
    }
}
