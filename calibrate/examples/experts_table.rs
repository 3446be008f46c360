//! Prints the planner-versus-published table of `docs/planner.md` (markdown) for the Narayanan
//! et al. 2021 rows of `validation/published-runs.json`. Run by `scripts/planner-docs.sh`.

use autopp_calibrate::experts::compare;
use autopp_calibrate::rows::parse_rows;

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
    for row in rows.iter().filter(|r| r.source_group == "Narayanan2021") {
        match compare(row) {
            Ok(c) => {
                let d = |e: &autopp_planner::Estimate| {
                    let p = &e.result.plan;
                    format!(
                        "tp {} · pp {} · dp {}, v {}, mbs {}, {}, recompute {}",
                        p.degrees.tp,
                        p.degrees.pp,
                        p.degrees.dp,
                        p.degrees.virtual_stages,
                        p.micro_batch_size,
                        p.schedule,
                        p.recompute
                    )
                };
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
