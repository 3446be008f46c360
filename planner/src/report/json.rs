//! `plan --json` and `estimate --json`: the best plan, the search's figures, the alternatives,
//! the memory margin, and what both say about their inputs ([`Inputs`]).

use autopp_models::SeqLenSource;

use crate::batch::TimeToTrain;
use crate::calibration::{calibration_json, CalibrationFile};
use crate::search::{Plans, SearchOptions};

/// What `plan --json` and `estimate --json` record about their inputs besides the plan.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// Global batch, sequences.
    pub global_batch: u64,
    /// Sequence length, tokens.
    pub seq_len: u64,
    /// Where the sequence length comes from.
    pub seq_len_source: SeqLenSource,
    /// The user's calibration (`--calibration`); `None`: the shipped knobs.
    pub calibration: Option<&'a CalibrationFile>,
    /// The time to train `--train-tokens`; `None` when not asked.
    pub train: Option<&'a TimeToTrain>,
}

impl Inputs<'_> {
    /// Adds `batch` (`global_batch` in sequences, `global_batch_tokens`, `seq_len` in tokens,
    /// `seq_len_source`, `seq_len_field`), `calibration` (`null`: the shipped knobs) and
    /// `time_to_train` (`null` without `--train-tokens`) to the object `v`.
    pub fn add_to(&self, v: &mut serde_json::Value) {
        v["batch"] = serde_json::json!({
            "global_batch": self.global_batch,
            "global_batch_tokens": self.global_batch.saturating_mul(self.seq_len),
            "seq_len": self.seq_len,
            "seq_len_source": self.seq_len_source.key(),
            "seq_len_field": self.seq_len_source.field(),
        });
        v["calibration"] = calibration_json(self.calibration);
        v["time_to_train"] = serde_json::json!(self.train);
    }
}

/// One JSON object: `plan`, `predicted`, `made_for`, `runs_on`, `search`, `alternatives` and
/// `memory_margin` of `plans`, searched with `opts`, and the [`Inputs`] keys.
pub fn plan_json(plans: &Plans, opts: &SearchOptions, inputs: &Inputs) -> serde_json::Value {
    let (result, answers) = (&plans.result, &plans.answers);
    let best = &result.best;
    let alternatives: Vec<_> = (result.alternatives.iter().zip(&answers[1..]))
        .map(|(e, a)| {
            serde_json::json!({
                "plan": e.result.plan,
                "predicted": e.result.predicted,
                "made_for": a.made_for,
                "runs_on": a.runs_on,
            })
        })
        .collect();
    let mut v = serde_json::json!({
        "plan": best.result.plan,
        "predicted": best.result.predicted,
        "made_for": answers[0].made_for,
        "runs_on": answers[0].runs_on,
        "search": {
            "elapsed_s": result.elapsed_s,
            "candidates": result.candidates,
            "simulated": result.simulated,
        },
        "alternatives": alternatives,
        "memory_margin": {
            "free_bytes": best.result.predicted.memory_capacity_bytes
                .saturating_sub(best.result.predicted.peak_memory_bytes),
            "required_bytes": opts.settings.memory_margin_bytes,
        },
    });
    inputs.add_to(&mut v);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_keys() {
        let t = crate::batch::time_to_train("1T", 1e6, 8, Some(2.0)).expect("valid");
        let inputs = Inputs {
            global_batch: 512,
            seq_len: 8192,
            seq_len_source: SeqLenSource::ModelFile {
                field: "max_position_embeddings",
            },
            calibration: None,
            train: Some(&t),
        };
        let mut v = serde_json::json!({"plan": 1});
        inputs.add_to(&mut v);
        // 512 × 8,192 = 4,194,304 tokens
        assert_eq!(v["batch"]["global_batch_tokens"], 4_194_304);
        assert_eq!(v["batch"]["seq_len_source"], "model_file");
        assert_eq!(v["batch"]["seq_len_field"], "max_position_embeddings");
        assert_eq!(v["calibration"], serde_json::Value::Null);
        // 1e12 tokens at 1e6 tokens/s on 8 GPUs: 1e6 s × 8 / 3,600 = 2,222.2 GPU-hours, $4,444.4
        let cost = v["time_to_train"]["cost_usd"].as_f64().expect("priced");
        assert!((cost - 4_444.444).abs() < 1e-2, "{cost}");
        assert_eq!(v["time_to_train"]["price_usd_per_gpu_hour"], 2.0);
        assert_eq!(v["plan"], 1);
    }
}
