//! `autopp validate`: predictions against published, measured runs; `autopp calibrate`: the
//! efficiency knobs fitted on your own runs.

use anyhow::{Context, Result};
use autopp_calibrate::validation::Validation;
use autopp_calibrate::{band, report::today, rows::parse_rows, user};
use clap::Args;

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

/// Runs `autopp validate`.
pub fn run(args: &ValidateArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read published-runs file '{}'", args.file))?;
    let rows = parse_rows(&text, &args.file)?;
    let v = Validation::new(&rows, args.fit || args.docs.is_some());
    if let Some(path) = &args.bands {
        let command = format!("autopp validate {} --bands {path}", args.file);
        write_atomic(path, band::bands_json(&v.rows, &command)?.as_bytes())?;
    }
    if let Some(path) = &args.docs {
        write_atomic(path, v.markdown(&args.file).as_bytes())?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", v.text());
    }
    Ok(())
}

/// Fit the efficiency knobs on your own measured runs, for `plan`, `estimate` and `whatif
/// --calibration`.
#[derive(Args, Debug)]
pub struct CalibrateArgs {
    /// Your runs, in the published-runs format (as validation/published-runs.json); one is enough.
    pub file: String,
    /// Where to write the calibration file (JSON).
    #[arg(long, value_name = "PATH")]
    pub out: String,
}

/// Runs `autopp calibrate`.
pub fn calibrate(args: &CalibrateArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read runs file '{}'", args.file))?;
    let fit = user::calibrate(&parse_rows(&text, &args.file)?, &args.file, &today())?;
    let json = serde_json::to_string_pretty(&fit.file)? + "\n";
    write_atomic(&args.out, json.as_bytes())?;
    print!("{}", fit.text());
    let out = &args.out;
    println!("\nwrote {out}: use it with plan, estimate or whatif --calibration {out}");
    Ok(())
}
