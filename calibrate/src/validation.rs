//! One validation run, as `autopp validate` makes it: every row predicted with the shipped
//! calibration, the summary, the GPU kinds with rows behind them, and optionally the fit.

use serde::Serialize;

use crate::fit::{self, FitOptions, FitReport};
use crate::report::{acceptance_text, fit_text, markdown, rows_table, summary_table, targets_text};
use crate::rows::PublishedRow;
use crate::{calibrated_gpus, evaluate_all, prepare, summarize, Calibration, PreparedRow};
use crate::{RowResult, Summary};

/// Predictions against a published-runs file; serialises as `validate --json` prints it.
#[derive(Debug, Serialize)]
pub struct Validation {
    /// Each row's prediction next to its measurement.
    pub rows: Vec<RowResult>,
    /// Errors per group and metric.
    pub summary: Summary,
    /// GPU kinds with rows behind them.
    pub calibrated_gpus: Vec<String>,
    /// The mixture-of-experts rows' errors by GPU kind, precision and model family.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moe_groups: Option<Summary>,
    /// The fit of the global knobs, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fit: Option<FitReport>,
    /// The fit of the mixture-of-experts knobs, when asked for and the file has MoE rows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moe_fit: Option<crate::moe_fit::MoeFit>,
    /// The rows as the cost model sees them.
    #[serde(skip)]
    prepared: Vec<PreparedRow>,
}

impl Validation {
    /// Predicts every row of `runs` with the shipped calibration, and fits the knobs when
    /// `with_fit`.
    pub fn new(runs: &[PublishedRow], with_fit: bool) -> Validation {
        let prepared = prepare(runs);
        let rows = evaluate_all(&prepared, &Calibration::default());
        let summary = summarize(&rows);
        let fit = with_fit.then(|| fit::fit_all(&prepared, &fit::PRIOR, FitOptions::default()));
        Validation {
            calibrated_gpus: calibrated_gpus(&rows),
            moe_groups: crate::moe::summary(&prepared, &rows),
            moe_fit: if with_fit {
                crate::moe_fit::fit(&prepared)
            } else {
                None
            },
            rows,
            summary,
            fit,
            prepared,
        }
    }

    /// The tables `validate` prints: rows, summary, acceptance bounds, and the fit when made.
    pub fn text(&self) -> String {
        let mut o = rows_table(&self.rows);
        o += &summary_table(&self.summary);
        if let Some(m) = &self.moe_groups {
            o += "\nmixture-of-experts rows by GPU kind, precision and model family:";
            o += &summary_table(m);
        }
        // the bounds are those of the dense groups; a file without them (the MoE runs) has none
        if crate::acceptance(&self.summary)
            .iter()
            .any(|c| c.value.is_some())
        {
            o += &format!("\nacceptance bounds:\n{}", acceptance_text(&self.summary));
            o += &format!(
                "\niteration-time targets on today's stacks (issue 15):\n{}",
                targets_text(&self.summary)
            );
        }
        if let Some(f) = &self.fit {
            o += &fit_text(f);
        }
        if let Some(f) = &self.moe_fit {
            o += &crate::moe_fit::text(f);
        }
        o
    }

    /// The Markdown report (`docs/validation.md`) of the rows read from `file`.
    pub fn markdown(&self, file: &str) -> String {
        markdown(
            file,
            &self.prepared,
            &self.rows,
            &self.summary,
            self.fit.as_ref(),
        )
    }
}
