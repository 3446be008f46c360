//! The run as `exec` prints it, in words or as one JSON object (after the check, which is why
//! this is not in `report`).

use autopp_models::units::{mib, secs, signed_pct};
use autopp_models::Model;
use serde_json::json;

use crate::check::CheckReport;
use crate::config::ExecConfig;
use crate::record::StepSummary;
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

    /// The run as `exec` prints it: the configuration, one line per step, the iteration time
    /// next to the simulator's prediction, the tensor-parallel share, bubble and peak
    /// activations per rank, and the check when there was one. `transport` names where the
    /// ranks ran (`threads`, `MPI processes`); `gpu` the GPU of `--backend cuda`.
    pub fn to_text(
        &self,
        cfg: &ExecConfig,
        steps: &[StepSummary],
        checked: Option<&CheckReport>,
        transport: &str,
        gpu: Option<&str>,
    ) -> String {
        let r = self;
        let flops = self.model_flops_per_s(cfg);
        let mut out = format!(
            "{} · {} · pp {} · dp {}{}{} · {} micro-batches of {} × {} tokens · {} {}{}\n\n",
            cfg.model.name,
            cfg.schedule.kind,
            cfg.pp(),
            cfg.dp,
            if cfg.tp > 1 {
                let sp = if cfg.sequence_parallel { " · sp" } else { "" };
                format!(" · tp {}{sp}", cfg.tp)
            } else {
                String::new()
            },
            if cfg.schedule.virtual_stages > 1 {
                format!(" · {} stages per rank", cfg.schedule.virtual_stages)
            } else {
                String::new()
            },
            cfg.num_microbatches(),
            cfg.micro_batch_size,
            cfg.seq_len(),
            cfg.world_size(),
            transport,
            match gpu {
                Some(name) => format!(" · GEMMs on cuBLAS ({name})"),
                None => String::new(),
            },
        );
        out.push_str("step   loss      time\n");
        for s in steps {
            out.push_str(&format!(
                "{:<6} {:<9.4} {}\n",
                s.step,
                s.loss,
                secs(s.time_s)
            ));
        }
        out.push_str(&format!(
            "\niteration time {} (median of the steps after the first) · {:.1} GFLOP/s of model FLOPs over all ranks\n",
            secs(r.iteration_time_s),
            flops / 1e9
        ));
        out.push_str(&format!(
            "predicted {} ({}): the simulator with the measured median time of each action and hop\n\n",
            secs(r.predicted_iteration_time_s),
            signed_pct(r.predicted_iteration_time_s / r.iteration_time_s.max(1e-12) - 1.0)
        ));
        if cfg.tp > 1 {
            let total = |v: &[[f64; 4]]| v.iter().flatten().sum::<f64>();
            let (comm, all) = (total(&r.measured.tp_comm_s), total(&r.measured.stage_s));
            out.push_str(&format!(
                "tensor-parallel collectives: {:.0}% of the median action times (in the prediction as part of each action)\n\n",
                100.0 * comm / all.max(1e-12)
            ));
        }
        out.push_str("rank   bubble  (simulated)   peak activations   (simulated)\n");
        for rank in 0..cfg.pp() {
            out.push_str(&format!(
                "{rank:<6} {:<7.3} ({:.3})       {:<18} ({})\n",
                r.bubble_fraction[rank],
                r.predicted_bubble_fraction[rank],
                mib(r.peak_activation_bytes[rank]),
                mib(r.predicted_peak_activation_bytes[rank]),
            ));
        }
        if let Some(c) = checked {
            out.push_str(&format!(
                "\ncheck against single-worker training: max_rel_err {:.2e} ({}) — {}\n",
                c.max_rel_err,
                c.worst,
                if c.passed { "PASSED" } else { "FAILED" }
            ));
        }
        out
    }
}
