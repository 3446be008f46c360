//! Calibration from a user's own measured runs: `autopp calibrate runs.json --out
//! my-cluster.json`.
//!
//! The runs file has the published-runs format ([`crate::rows`]), as few as one run. The fit
//! moves the same global time knobs as `validate --fit` ([`fit::fit_named`]), starting from the
//! shipped values, but never more knobs than there are runs: the first `n` of [`KNOB_ORDER`]
//! (one run determines the overall compute efficiency `gemm_max` only). With at least
//! [`MIN_HELD_OUT_RUNS`] runs it also reports an out-of-sample error: leave-one-out up to
//! [`MAX_LEAVE_ONE_OUT`] runs, else fit on one half and test on the other, both ways. The
//! memory terms are not fitted. The result is a [`CalibrationFile`] for `--calibration`.

use std::fmt::Write;

use autopp_hardware::Efficiency;
use autopp_planner::calibration::{CalibrationFile, CALIBRATION_FORMAT, CALIBRATION_VERSION};
use serde::Serialize;

use crate::fit::{self, FitOptions};
use crate::rows::PublishedRow;
use crate::{evaluate_all, prepare, Calibration, Metric, PreparedRow, RowResult};

/// The knobs in the order runs earn them: the first `n` are fitted on `n` runs.
pub const KNOB_ORDER: [&str; 10] = [
    "gemm_max",
    "comm_inter",
    "comm_overlap",
    "kernel_overhead_s",
    "gemm_half_dim",
    "hbm",
    "comm_intra",
    "attention_fused",
    "hopper_compute",
    "gemm_misaligned",
];

/// Runs needed before an out-of-sample error is reported.
pub const MIN_HELD_OUT_RUNS: usize = 4;
/// Up to this many runs the out-of-sample error is leave-one-out; above, two halves.
pub const MAX_LEAVE_ONE_OUT: usize = 10;

/// Why a runs file cannot calibrate anything.
#[derive(Debug, thiserror::Error)]
pub enum UserCalibrationError {
    /// No run of the file can be modelled with a time to compare.
    #[error(
        "{file}: no run can be modelled ({why}); see autopp validate {file} for each run's reason"
    )]
    NoUsableRun {
        /// The runs file.
        file: String,
        /// The first run's reason.
        why: String,
    },
}

/// One knob: its shipped and its fitted value.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KnobChange {
    /// The `Efficiency` field.
    pub name: &'static str,
    /// The shipped value.
    pub shipped: f64,
    /// The calibrated value (the shipped one when not fitted).
    pub fitted: f64,
    /// Whether the fit moved this knob.
    pub was_fitted: bool,
    /// Whether the fitted value sits on the knob's bound (the runs want more than it allows).
    pub on_bound: bool,
}

/// An out-of-sample check: iteration-time MAPE on runs the fit did not see.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct HeldOut {
    /// `leave-one-out` or `halves`.
    pub method: &'static str,
    /// Runs tested.
    pub runs: usize,
    /// MAPE of the shipped knobs on them.
    pub shipped_mape: f64,
    /// MAPE of the knobs fitted without them.
    pub calibrated_mape: f64,
}

/// The result of `autopp calibrate`.
#[derive(Debug, Clone, Serialize)]
pub struct UserFit {
    /// The file to write.
    pub file: CalibrationFile,
    /// Every knob, shipped → fitted.
    pub knobs: Vec<KnobChange>,
    /// Runs in the file.
    pub runs_in_file: usize,
    /// Runs not used, with the reason.
    pub skipped: Vec<(String, String)>,
    /// In-sample iteration-time MAPE with the shipped knobs.
    pub shipped_mape: f64,
    /// In-sample iteration-time MAPE with the fitted knobs.
    pub calibrated_mape: f64,
    /// The out-of-sample check, with enough runs.
    pub held_out: Option<HeldOut>,
}

/// Mean absolute relative error of the time comparisons (iteration and per-layer) of
/// `results`; 0 with none.
pub fn time_mape(results: &[RowResult]) -> f64 {
    let errs: Vec<f64> = results
        .iter()
        .flat_map(|r| &r.comparisons)
        .filter(|c| c.metric != Metric::PeakMemory)
        .map(|c| c.error().abs())
        .collect();
    if errs.is_empty() {
        0.0
    } else {
        errs.iter().sum::<f64>() / errs.len() as f64
    }
}

fn mape_with(rows: &[PreparedRow], e: &Efficiency) -> f64 {
    let cal = Calibration {
        efficiency: *e,
        ..Calibration::default()
    };
    time_mape(&evaluate_all(rows, &cal))
}

/// The knobs `n` runs may fit: the first `n` of [`KNOB_ORDER`].
pub fn knobs_for(n: usize) -> &'static [&'static str] {
    &KNOB_ORDER[..n.min(KNOB_ORDER.len())]
}

/// Fits [`knobs_for`]`(rows.len())` on `rows` from the shipped knobs.
pub fn fit_rows(rows: &[PreparedRow]) -> Efficiency {
    fit::fit_named(
        rows,
        knobs_for(rows.len()),
        &Efficiency::default(),
        FitOptions::default(),
    )
}

/// Fits on `train` and tests on `test`: (shipped MAPE, calibrated MAPE) on `test`.
pub fn held_out_error(train: &[PreparedRow], test: &[PreparedRow]) -> (f64, f64) {
    let e = fit_rows(train);
    (mape_with(test, &Efficiency::default()), mape_with(test, &e))
}

/// The out-of-sample check of a fit on `rows` (`None` under [`MIN_HELD_OUT_RUNS`]).
fn out_of_sample(rows: &[PreparedRow]) -> Option<HeldOut> {
    let n = rows.len();
    if n < MIN_HELD_OUT_RUNS {
        return None;
    }
    let split = |keep: &dyn Fn(usize) -> bool| -> Vec<PreparedRow> {
        rows.iter()
            .enumerate()
            .filter(|(i, _)| keep(*i))
            .map(|(_, r)| r.clone())
            .collect()
    };
    let folds: Vec<(Vec<PreparedRow>, Vec<PreparedRow>)> = if n <= MAX_LEAVE_ONE_OUT {
        (0..n)
            .map(|k| (split(&|i| i != k), split(&|i| i == k)))
            .collect()
    } else {
        (0..2)
            .map(|p| (split(&|i| i % 2 == p), split(&|i| i % 2 != p)))
            .collect()
    };
    let (mut shipped, mut calibrated) = (0.0, 0.0);
    for (train, test) in &folds {
        let (s, c) = held_out_error(train, test);
        shipped += s * test.len() as f64;
        calibrated += c * test.len() as f64;
    }
    Some(HeldOut {
        method: if n <= MAX_LEAVE_ONE_OUT {
            "leave-one-out"
        } else {
            "halves"
        },
        runs: n,
        shipped_mape: shipped / n as f64,
        calibrated_mape: calibrated / n as f64,
    })
}

/// Calibrates on `runs`, read from `source`: the runs that can be modelled with a time to
/// compare are fitted; `created` is the date written into the file.
pub fn calibrate(
    runs: &[PublishedRow],
    source: &str,
    created: &str,
) -> Result<UserFit, UserCalibrationError> {
    let prepared = prepare(runs);
    let shipped_results = evaluate_all(&prepared, &Calibration::default());
    let mut usable = Vec::new();
    let mut skipped = Vec::new();
    for (row, result) in prepared.into_iter().zip(&shipped_results) {
        let timed = result
            .comparisons
            .iter()
            .any(|c| c.metric != Metric::PeakMemory);
        if timed {
            usable.push(row);
        } else {
            let why = result
                .skipped
                .clone()
                .unwrap_or_else(|| "no iteration or layer time to compare".to_string());
            skipped.push((row.id, why));
        }
    }
    if usable.is_empty() {
        return Err(UserCalibrationError::NoUsableRun {
            file: source.to_string(),
            why: skipped
                .first()
                .map_or_else(|| "the file has no runs".to_string(), |s| s.1.clone()),
        });
    }
    let fitted_names = knobs_for(usable.len());
    let efficiency = fit_rows(&usable);
    let shipped = Efficiency::default();
    let knobs = fit::knob_values(&efficiency)
        .into_iter()
        .zip(fit::knob_values(&shipped))
        .map(|(f, s)| KnobChange {
            name: f.name,
            shipped: s.value,
            fitted: f.value,
            was_fitted: fitted_names.contains(&f.name),
            on_bound: f.on_bound(),
        })
        .collect();
    Ok(UserFit {
        file: CalibrationFile {
            format: CALIBRATION_FORMAT.to_string(),
            version: CALIBRATION_VERSION,
            autopp_version: env!("CARGO_PKG_VERSION").to_string(),
            created: created.to_string(),
            source: source.to_string(),
            runs: usable.iter().map(|r| r.id.clone()).collect(),
            fitted: fitted_names.iter().map(|s| s.to_string()).collect(),
            efficiency,
        },
        knobs,
        runs_in_file: runs.len(),
        skipped,
        shipped_mape: mape_with(&usable, &shipped),
        calibrated_mape: mape_with(&usable, &efficiency),
        held_out: out_of_sample(&usable),
    })
}

/// A knob's value to four significant figures.
fn knob(v: f64) -> String {
    if v != 0.0 && v.abs() < 1e-2 {
        format!("{v:.3e}")
    } else {
        format!("{v:.4}")
    }
}

impl UserFit {
    /// What `autopp calibrate` prints: the runs used, each knob shipped → fitted, the errors.
    pub fn text(&self) -> String {
        let used = self.file.runs.len();
        let mut o = format!(
            "calibrating on {used} of {} run{} in {}\n",
            self.runs_in_file,
            if self.runs_in_file == 1 { "" } else { "s" },
            self.file.source
        );
        for (id, why) in &self.skipped {
            let _ = writeln!(o, "  skipped {id}: {why}");
        }
        let _ = writeln!(
            o,
            "\n  {:<18} {:>10}    {:>10}",
            "knob", "shipped", "fitted"
        );
        for k in self.knobs.iter().filter(|k| k.was_fitted) {
            let _ = writeln!(
                o,
                "  {:<18} {:>10} →  {:>10}{}",
                k.name,
                knob(k.shipped),
                knob(k.fitted),
                if k.on_bound { "  (on its bound)" } else { "" }
            );
        }
        let kept = self.knobs.iter().filter(|k| !k.was_fitted).count();
        if kept > 0 {
            let _ = writeln!(
                o,
                "  ({kept} other knobs keep their shipped values: {used} run{} determine{} at most {} knob{})",
                if used == 1 { "" } else { "s" },
                if used == 1 { "s" } else { "" },
                used,
                if used == 1 { "" } else { "s" }
            );
        }
        let _ = writeln!(
            o,
            "\n  time error on these runs (MAPE): shipped {:.1}% → calibrated {:.1}%",
            100.0 * self.shipped_mape,
            100.0 * self.calibrated_mape
        );
        match &self.held_out {
            Some(h) => {
                let _ = writeln!(
                    o,
                    "  out of sample ({}, {} runs): shipped {:.1}% → calibrated {:.1}%",
                    h.method,
                    h.runs,
                    100.0 * h.shipped_mape,
                    100.0 * h.calibrated_mape
                );
            }
            None => {
                let _ = writeln!(
                    o,
                    "  no out-of-sample error: it needs at least {MIN_HELD_OUT_RUNS} runs"
                );
            }
        }
        o += "  memory terms (fragmentation, context) are not fitted: they stay shipped\n";
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_earn_knobs_in_order() {
        assert_eq!(knobs_for(1), ["gemm_max"]);
        assert_eq!(knobs_for(3), ["gemm_max", "comm_inter", "comm_overlap"]);
        assert_eq!(knobs_for(40).len(), 10);
        // every name is a knob the fit knows
        for name in KNOB_ORDER {
            assert!(fit::knob_names().contains(&name), "{name}");
        }
    }
}
