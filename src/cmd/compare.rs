//! `autopp compare`: two plan files side by side (rendering in `planner::report`).

use anyhow::Result;
use autopp_planner::report::{compare_files, compare_text};
use clap::Args;

/// `autopp compare`'s examples.
pub const HELP: &str = "Examples:
  autopp compare a.json b.json
  autopp compare a.json b.json --json";

/// Two plans side by side, each evaluated with this build's cost model: compute, bubble, each
/// communication, optimizer, iteration time and peak memory per GPU, with B − A.
#[derive(Args, Debug)]
pub struct CompareArgs {
    /// Plan A: a plan file from `autopp plan --out`.
    #[arg(value_name = "A.json")]
    pub a: String,
    /// Plan B: another plan file.
    #[arg(value_name = "B.json")]
    pub b: String,
    /// Print one JSON object {"a", "b", "terms_s", "b_over_a"}.
    #[arg(long)]
    pub json: bool,
}

/// Runs `autopp compare`.
pub fn run(args: &CompareArgs) -> Result<()> {
    let c = compare_files(&args.a, &args.b)?;
    match args.json {
        true => println!("{}", serde_json::to_string_pretty(&c)?),
        false => print!("{}", compare_text(&c)),
    }
    Ok(())
}
