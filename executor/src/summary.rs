//! The run as one JSON object: what `exec --json` prints (after the check, which is why it is
//! not in `report`).

use autopp_models::Model;
use serde_json::json;

use crate::check::CheckReport;
use crate::config::ExecConfig;
use crate::report::ExecReport;

impl ExecReport {
    /// The run as one JSON object (what `exec --json` prints): the configuration, the losses,
    /// the measured and predicted times, bubbles and bytes, and the check when there was one.
    /// `gpu` names the GPU of `--backend cuda`.
    pub fn to_json(
        &self,
        cfg: &ExecConfig,
        checked: Option<&CheckReport>,
        gpu: Option<&str>,
    ) -> serde_json::Value {
        let report = self;
        let flops = self.model_flops_per_s(cfg);
        let mut out = json!({
            "model": cfg.model.name,
            "schedule": cfg.schedule.kind,
            "pp": cfg.pp(),
            "dp": cfg.dp,
            "tp": cfg.tp,
            "sequence_parallel": cfg.sequence_parallel,
            "virtual_stages": cfg.schedule.virtual_stages,
            "num_microbatches": cfg.num_microbatches(),
            "micro_batch_size": cfg.micro_batch_size,
            "seq_len": cfg.seq_len(),
            "global_batch_size": cfg.global_batch_size(),
            "split": cfg.split,
            "backend": cfg.backend,
            "gpu": gpu,
            "losses": report.losses,
            "step_time_s": report.step_time_s,
            "iteration_time_s": report.iteration_time_s,
            "predicted_iteration_time_s": report.predicted_iteration_time_s,
            "measured_action_times_s": report.measured,
            "model_flops_per_s": flops,
            "bubble_fraction": report.bubble_fraction,
            "predicted_bubble_fraction": report.predicted_bubble_fraction,
            "peak_activation_bytes": report.peak_activation_bytes,
            "predicted_peak_activation_bytes": report.predicted_peak_activation_bytes,
        });
        if let Some(c) = checked {
            out["check"] = json!({
                "max_rel_err": c.max_rel_err,
                "passed": c.passed,
                "worst": c.worst,
                "tolerance": c.tolerance,
                "reference_losses": c.reference_losses,
            });
        }
        out
    }

    /// Model FLOPs per second over all ranks at the median iteration time.
    pub fn model_flops_per_s(&self, cfg: &ExecConfig) -> f64 {
        let r = self;
        let per_sequence = Model::Transformer(cfg.model.clone())
            .model_flops_per_sequence()
            .unwrap_or(0.0);
        per_sequence * cfg.global_batch_size() as f64 / r.iteration_time_s.max(1e-12)
    }
}
