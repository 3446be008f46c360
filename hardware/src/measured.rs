//! Measured profiles: per-layer seconds of the forward (`F`), backward-input (`I`) and
//! backward-weight (`W`) passes, timed on the GPU (the profiler crate's `device` module) by
//! `autopp profile`, and used by `estimate --profile` and `plan --profile` in place of the
//! analytic profile's layer times.
//!
//! The file (JSON, format `autopp-profile/1`):
//!
//! ```json
//! {
//!   "format": "autopp-profile/1",
//!   "backend": "cpu",
//!   "model": "tiny-gpt",
//!   "micro_batch_size": 2,
//!   "seq_length": 128,
//!   "repetitions": 5,
//!   "layers": [
//!     {"name": "embedding", "forward_s": 1.1e-5, "backward_input_s": 0.0,
//!      "backward_weight_s": 2.0e-5, "forward_work": 262144.0,
//!      "backward_input_work": 0.0, "backward_weight_work": 262144.0}
//!   ]
//! }
//! ```
//!
//! `layers` follows the model's layer list (`embedding`, `layer 0` … `layer N−1`, `head`);
//! times are medians over `repetitions`, seconds per micro-batch. `*_work` is the pass's work
//! at the measured shape as `autopp-models` counts it (FLOPs of GEMMs and attention plus bytes of
//! memory-bound ops, tp = 1): a plan with another micro-batch size or tensor-parallel degree
//! scales each time by its own work over the measured work.

use autopp_models::{LayerCost, Op};
use serde::{Deserialize, Serialize};

use crate::HardwareError;

/// The `format` value this version reads and writes.
pub const PROFILE_FORMAT: &str = "autopp-profile/1";

/// One layer's measured pass times and the work they did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasuredLayer {
    /// The layer's name in the model's layer list (`embedding`, `layer 3`, `head`).
    pub name: String,
    /// Median seconds of the forward pass of one micro-batch.
    pub forward_s: f64,
    /// Median seconds of the backward-input pass.
    pub backward_input_s: f64,
    /// Median seconds of the backward-weight pass.
    pub backward_weight_s: f64,
    /// Forward work at the measured shape (FLOPs plus memory-bound bytes; see [`work`]).
    pub forward_work: f64,
    /// Backward-input work at the measured shape.
    pub backward_input_work: f64,
    /// Backward-weight work at the measured shape.
    pub backward_weight_work: f64,
}

/// A measured profile file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasuredProfile {
    /// Always [`PROFILE_FORMAT`].
    pub format: String,
    /// What was timed (`cpu`: the fp32 device layer, one thread).
    pub backend: String,
    /// The model's name.
    pub model: String,
    /// Sequences per micro-batch at measurement.
    pub micro_batch_size: u64,
    /// Tokens per sequence at measurement.
    pub seq_length: u64,
    /// Timed repetitions per layer (the times are their medians).
    pub repetitions: usize,
    /// Per layer, in layer-list order.
    pub layers: Vec<MeasuredLayer>,
}

/// The work of a list of ops, the unit measured times scale by: FLOPs of GEMMs and attention,
/// plus bytes read and written by memory-bound ops.
pub fn work(ops: &[Op]) -> f64 {
    ops.iter()
        .map(|op| match *op {
            Op::Elementwise { bytes } => bytes as f64,
            ref other => other.flops(),
        })
        .sum::<f64>()
        + 0.0 // an empty list sums to −0
}

/// The longest pass time a profile may hold, seconds (a day).
const MAX_PASS_S: f64 = 86_400.0;

/// `measured_s · now / then`, or `measured_s` when the measured work is zero.
fn scaled(measured_s: f64, then: f64, now: f64) -> f64 {
    if then > 0.0 {
        measured_s * now / then
    } else {
        measured_s
    }
}

impl MeasuredProfile {
    /// Reads a profile file's text; `origin` names it in errors.
    pub fn from_json(text: &str, origin: &str) -> Result<Self, HardwareError> {
        let p: MeasuredProfile = serde_json::from_str(text).map_err(|e| HardwareError::Json {
            origin: origin.to_string(),
            message: e.to_string(),
        })?;
        let invalid = |message: String| HardwareError::Invalid {
            field: format!("--profile {origin}:"),
            message,
        };
        if p.format != PROFILE_FORMAT {
            return Err(invalid(format!(
                "format '{}' is not '{PROFILE_FORMAT}' (write it with `autopp profile`)",
                p.format
            )));
        }
        for l in &p.layers {
            let times = [l.forward_s, l.backward_input_s, l.backward_weight_s];
            let works = [
                l.forward_work,
                l.backward_input_work,
                l.backward_weight_work,
            ];
            if times
                .iter()
                .chain(&works)
                .any(|x| !(x.is_finite() && *x >= 0.0))
            {
                return Err(invalid(format!(
                    "layer '{}' has a negative or non-finite time or work",
                    l.name
                )));
            }
            // a pass of days is no measurement, nor a positive work below one FLOP or byte
            // (times scale by the work: a tiny one would scale them past any float)
            if times.iter().any(|&t| t > MAX_PASS_S) || works.iter().any(|&w| w > 0.0 && w < 1.0) {
                return Err(invalid(format!(
                    "layer '{}' has a time over {MAX_PASS_S} s or a work between 0 and 1: write the profile again with `autopp profile`",
                    l.name
                )));
            }
        }
        Ok(p)
    }

    /// The profile as pretty JSON.
    pub fn to_json(&self) -> String {
        // plain data with finite numbers: serialisation cannot fail
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Checks that the profile was measured for `model` and covers every layer of `layers`
    /// (its layer list), naming the first one it lacks.
    pub fn check_covers(&self, model: &str, layers: &[LayerCost]) -> Result<(), HardwareError> {
        if self.model != model {
            return Err(HardwareError::Invalid {
                field: "--profile".into(),
                message: format!(
                    "was measured for '{}', not '{model}': measure it with `autopp profile --backend cpu {model}`",
                    self.model
                ),
            });
        }
        match layers.iter().find(|l| self.layer(&l.name).is_none()) {
            None => Ok(()),
            Some(l) => Err(HardwareError::Invalid {
                field: "--profile".into(),
                message: format!(
                    "was measured for '{}' and has no layer '{}' of '{model}': measure this model with `autopp profile --backend cpu {model}`",
                    self.model, l.name
                ),
            }),
        }
    }

    /// The measured layer named `name`.
    pub fn layer(&self, name: &str) -> Option<&MeasuredLayer> {
        self.layers.iter().find(|l| l.name == name)
    }

    /// `layer`'s measured `(F, I, W)` seconds scaled to its shape, if the profile has it.
    pub fn times_of(&self, layer: &LayerCost) -> Option<[f64; 3]> {
        let m = self.layer(&layer.name)?;
        Some([
            scaled(m.forward_s, m.forward_work, work(&layer.forward_ops)),
            scaled(
                m.backward_input_s,
                m.backward_input_work,
                work(&layer.backward_input_ops),
            ),
            scaled(
                m.backward_weight_s,
                m.backward_weight_work,
                work(&layer.backward_weight_ops),
            ),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use autopp_models::ShardSpec;

    fn profile() -> (MeasuredProfile, Vec<LayerCost>) {
        let model = autopp_models::load("tiny-gpt").unwrap();
        let shard = ShardSpec {
            micro_batch_size: 1,
            ..ShardSpec::default()
        };
        let layers = model.layers(&shard).unwrap();
        let measured = layers
            .iter()
            .map(|l| MeasuredLayer {
                name: l.name.clone(),
                forward_s: 1.0,
                backward_input_s: 2.0,
                backward_weight_s: 3.0,
                forward_work: work(&l.forward_ops),
                backward_input_work: work(&l.backward_input_ops),
                backward_weight_work: work(&l.backward_weight_ops),
            })
            .collect();
        let p = MeasuredProfile {
            format: PROFILE_FORMAT.into(),
            backend: "cpu".into(),
            model: "tiny-gpt".into(),
            micro_batch_size: 1,
            seq_length: 128,
            repetitions: 1,
            layers: measured,
        };
        (p, layers)
    }

    #[test]
    fn times_scale_with_the_work_of_the_shape() {
        let (p, layers) = profile();
        assert_eq!(p.times_of(&layers[1]), Some([1.0, 2.0, 3.0]));
        let model = autopp_models::load("tiny-gpt").unwrap();
        let shard = ShardSpec {
            micro_batch_size: 2,
            ..ShardSpec::default()
        };
        let twice = model.layers(&shard).unwrap();
        let [f, i, w] = p.times_of(&twice[1]).unwrap();
        assert!((f - 2.0).abs() < 0.05 && (i - 4.0).abs() < 0.1 && (w - 6.0).abs() < 0.1);
    }

    #[test]
    fn the_file_round_trips_and_bad_files_are_refused() {
        let (p, layers) = profile();
        let back = MeasuredProfile::from_json(&p.to_json(), "p.json").unwrap();
        assert_eq!(back, p);
        assert!(back.check_covers("tiny-gpt", &layers).is_ok());
        let e = back.check_covers("other", &[]).unwrap_err();
        assert!(e.to_string().contains("not 'other'"), "{e}");
        let mut short = p.clone();
        short.layers.pop();
        let e = short.check_covers("tiny-gpt", &layers).unwrap_err();
        assert!(e.to_string().contains("no layer 'head'"), "{e}");
        let bad = p.to_json().replace(PROFILE_FORMAT, "x/0");
        assert!(MeasuredProfile::from_json(&bad, "p.json").is_err());
        assert!(MeasuredProfile::from_json("{", "p.json").is_err());
        // a time of days, or a work below one FLOP that scales times past any float
        for edit in [
            (|l: &mut MeasuredLayer| l.forward_s = 1e9) as fn(&mut MeasuredLayer),
            |l: &mut MeasuredLayer| l.backward_input_work = 1e-300,
        ] {
            let mut bad = p.clone();
            edit(&mut bad.layers[1]);
            let e = MeasuredProfile::from_json(&bad.to_json(), "p.json").unwrap_err();
            assert!(e.to_string().contains("or a work between 0 and 1"), "{e}");
        }
    }
}
