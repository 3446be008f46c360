//! Prints a planner-versus-published table of `docs/planner.md` (markdown) for the rows of
//! `validation/published-runs.json` of one source group: `Narayanan2021` (the default; plans
//! of `--framework any`) or `NeMo` (plans with Megatron's rules, the GPU's memory raised to what
//! a published configuration predicted over capacity needs). Run by `scripts/planner-docs.sh`.

use autopp_calibrate::experts::{compare, compare_with_room, describe};
use autopp_calibrate::rows::parse_rows;
use autopp_planner::framework::Framework;

fn main() {
    let text = include_str!("../../validation/published-runs.json");
    let rows = match parse_rows(text, "validation/published-runs.json") {
        Ok(rows) => rows,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    println!("| row | published configuration | its predicted time | fits | plan | plan's time | ratio |");
    println!("|---|---|---:|---|---|---:|---:|");
    let group = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "Narayanan2021".to_string());
    for row in rows.iter().filter(|r| r.source_group == group) {
        let compared = match group.as_str() {
            "NeMo" => compare_with_room(row, Framework::Megatron),
            _ => compare(row),
        };
        match compared {
            Ok(c) => {
                let d = |e: &autopp_planner::Estimate| describe(&e.result.plan);
                println!(
                    "| {} | {} | {:.2} s | {} | {} | {:.2} s | {:.3} |",
                    c.id,
                    d(&c.published),
                    c.published.result.predicted.iteration_time_s,
                    if c.published.result.predicted.fits {
                        "yes"
                    } else {
                        "**no**"
                    },
                    d(&c.planned),
                    c.planned.result.predicted.iteration_time_s,
                    c.ratio()
                );
            }
            Err(e) => println!("| {} | not compared: {e} | | | | | |", row.id),
        }
    }
}
