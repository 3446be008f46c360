//! `autopp validate`: predictions against published, measured runs.

use anyhow::{Context, Result};
use autopp_calibrate::fit::{self, FitOptions, FitReport};
use autopp_calibrate::report::{acceptance_text, fit_text, markdown, rows_table, summary_table};
use autopp_calibrate::{
    self as validate, band, rows::parse_rows, summarize, Calibration, RowResult, Summary,
};
use clap::Args;
use serde::Serialize;

use super::common::write_atomic;

/// Compare autopp's predictions with published training runs.
///
/// Example: autopp validate validation/published-runs.json
#[derive(Args, Debug)]
pub struct ValidateArgs {
    /// A published-runs file (a JSON array of runs, as validation/published-runs.json).
    pub file: String,
    /// Print one JSON object {"rows", "summary"} (with --fit also "fit") instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Also fit the efficiency knobs and memory terms (all groups, leave-one-group-out, memory
    /// halves) and print the fitted values; the shipped defaults are the all-groups fit.
    #[arg(long)]
    pub fit: bool,
    /// Write the validation report (tables, fit, out-of-sample errors, date) as Markdown to PATH
    /// (docs/validation.md); implies --fit.
    #[arg(long, value_name = "PATH")]
    pub docs: Option<String>,
    /// Write the uncertainty bands `autopp estimate` prints (validation/bands.json) to PATH.
    #[arg(long, value_name = "PATH")]
    pub bands: Option<String>,
}

/// Everything `validate --json` prints.
#[derive(Serialize)]
struct JsonReport<'a> {
    rows: &'a [RowResult],
    summary: &'a Summary,
    calibrated_gpus: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fit: Option<&'a FitReport>,
}

/// Runs `autopp validate`.
pub fn run(args: &ValidateArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read published-runs file '{}'", args.file))?;
    let rows = parse_rows(&text, &args.file)?;
    let prepared = validate::prepare(&rows);
    let results = validate::evaluate_all(&prepared, &Calibration::default());
    let summary = summarize(&results);
    let fit = if args.fit || args.docs.is_some() {
        Some(fit::fit_all(&prepared, &fit::PRIOR, FitOptions::default()))
    } else {
        None
    };
    if let Some(path) = &args.bands {
        let bands = band::bands(
            &results,
            &format!("autopp validate {} --bands {path}", args.file),
        );
        let mut text = serde_json::to_string_pretty(&bands)?;
        text.push('\n');
        write_atomic(path, text.as_bytes())?;
    }
    if let Some(path) = &args.docs {
        let doc = markdown(&args.file, &prepared, &results, &summary, fit.as_ref());
        write_atomic(path, doc.as_bytes())?;
    }
    if args.json {
        let report = JsonReport {
            rows: &results,
            summary: &summary,
            calibrated_gpus: validate::calibrated_gpus(&results),
            fit: fit.as_ref(),
        };
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", rows_table(&results));
        print!("{}", summary_table(&summary));
        print!("\nacceptance bounds:\n{}", acceptance_text(&summary));
        if let Some(f) = &fit {
            print!("{}", fit_text(f));
        }
    }
    Ok(())
}
