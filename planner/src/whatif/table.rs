//! The sweep's rows as a text table and as CSV.

use super::{Outcome, PointPlan, Row};

fn days(s: f64) -> String {
    let d = s / 86_400.0;
    if d >= 10.0 {
        format!("{d:.0} d")
    } else {
        format!("{d:.1} d")
    }
}

fn si(v: f64) -> String {
    let (v, unit) = match v {
        v if v >= 1e9 => (v / 1e9, "G"),
        v if v >= 1e6 => (v / 1e6, "M"),
        v if v >= 1e3 => (v / 1e3, "k"),
        v => (v, ""),
    };
    format!("{v:.2}{unit}")
}

/// The frameworks that run `p`, joined by `sep`; `none` when none does.
fn runs_on(p: &PointPlan, sep: &str) -> String {
    let names: Vec<&str> = p.runs_on.iter().map(|f| f.as_str()).collect();
    match names.is_empty() {
        true => "none".to_string(),
        false => names.join(sep),
    }
}

/// One line per point: the plan's degrees and schedule, iteration time, tokens/s, MFU, scaling
/// efficiency, time / GPU-hours / cost of the token budget, what binds and the frameworks that
/// run the plan; a point where nothing fits gives the planner's reason.
pub fn to_table(rows: &[Row]) -> String {
    let mut o = format!(
        "{:<10} {:>6} {:>5} {:>7}  {:<24} {:>9} {:>9} {:>6} {:>6} {:>8} {:>9} {:>9}  {:<14} {}\n",
        "gpu",
        "gpus",
        "nic",
        "batch",
        "tp·pp·dp·cp·v schedule",
        "iter",
        "tokens/s",
        "MFU",
        "scale",
        "train",
        "GPU-h",
        "cost $",
        "binds",
        "runs on"
    );
    for r in rows {
        let head = format!(
            "{:<10} {:>6} {:>5} {:>7}  ",
            r.gpu, r.gpus, r.nic_gbps, r.global_batch
        );
        match &r.outcome {
            Outcome::Plan(p) => {
                let d = &p.degrees;
                let shape = format!(
                    "{}·{}·{}·{}·{} {}",
                    d.tp, d.pp, d.dp, d.cp, d.virtual_stages, p.schedule
                );
                o += &format!(
                    "{head}{:<24} {:>8.2}s {:>9} {:>5.1}% {:>5.0}% {:>8} {:>9} {:>9}  {:<14} {}\n",
                    shape,
                    p.iteration_time_s,
                    si(p.tokens_per_s),
                    100.0 * p.mfu,
                    100.0 * p.scaling_efficiency,
                    p.train_time_s.map_or("—".into(), days),
                    p.gpu_hours.map_or("—".into(), si),
                    p.cost_usd.map_or("—".into(), si),
                    p.binds
                        .as_ref()
                        .map_or("compute".to_string(), |b| b.to_string()),
                    runs_on(p, ", "),
                );
            }
            Outcome::NoPlan(why) => o += &format!("{head}no plan: {why}\n"),
        }
    }
    o
}

/// The rows as CSV with a header; empty cells where a point has no plan or no budget.
pub fn to_csv(rows: &[Row]) -> String {
    let mut o = String::from(
        "gpu,gpus,gpus_per_node,nic_gbps,global_batch,tp,pp,dp,cp,virtual_stages,micro_batch_size,schedule,iteration_time_s,tokens_per_s,mfu,scaling_efficiency,train_time_s,gpu_hours,cost_usd,binds,no_plan,runs_on\n",
    );
    let opt = |v: Option<f64>| v.map_or(String::new(), |v| v.to_string());
    for r in rows {
        o += &format!(
            "{},{},{},{},{},",
            r.gpu, r.gpus, r.gpus_per_node, r.nic_gbps, r.global_batch
        );
        match &r.outcome {
            Outcome::Plan(p) => {
                o += &format!(
                    "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},,{}\n",
                    p.degrees.tp,
                    p.degrees.pp,
                    p.degrees.dp,
                    p.degrees.cp,
                    p.degrees.virtual_stages,
                    p.micro_batch_size,
                    p.schedule,
                    p.iteration_time_s,
                    p.tokens_per_s,
                    p.mfu,
                    p.scaling_efficiency,
                    opt(p.train_time_s),
                    opt(p.gpu_hours),
                    opt(p.cost_usd),
                    p.binds
                        .as_ref()
                        .map_or(String::new(), |b| b.term.to_string()),
                    runs_on(p, ";"),
                );
            }
            Outcome::NoPlan(why) => {
                o += &format!(",,,,,,,,,,,,,,,\"{}\",\n", why.replace('"', "'"));
            }
        }
    }
    o
}
