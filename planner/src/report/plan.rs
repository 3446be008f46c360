//! `autopp plan`'s report: the search's size, the best plan as `estimate` prints it, the memory
//! margin, the Megatron layout, why it won, and the alternatives.

use std::fmt::Write;

use autopp_hardware::AnalyticProfile;
use autopp_models::units::{gib, secs, thousands, wrap};
use autopp_models::{Model, SeqLenSource};

use super::estimate::estimate_text;
use super::margin::Margin;
use crate::config::ParallelConfig;
use crate::search::{explain, Answer, Plans, SearchResult};

/// The human-readable answer of a search: `plans` for `model` (its sequence length from `seq`)
/// on `profile`'s cluster, whose best plan is `config`, kept at least `margin` free.
pub fn plan_text(
    model: &Model,
    seq: SeqLenSource,
    profile: &AnalyticProfile,
    config: &ParallelConfig,
    plans: &Plans,
    margin: &Margin,
) -> String {
    let (result, answers) = (&plans.result, &plans.answers);
    let best = &result.best;
    let mut o = format!(
        "searched {} configurations in {} ({} simulated exactly)\n\n",
        thousands(result.candidates as f64),
        secs(result.elapsed_s),
        result.simulated
    );
    o += &estimate_text(model, seq, profile, config, best);
    let pr = &best.result.predicted;
    let free = pr
        .memory_capacity_bytes
        .saturating_sub(pr.peak_memory_bytes);
    let _ = writeln!(
        o,
        "  margin        {} GiB free ({:.1}% of {} GiB); kept at least {} GiB ({})",
        gib(free),
        100.0 * free as f64 / pr.memory_capacity_bytes.max(1) as f64,
        gib(pr.memory_capacity_bytes),
        gib(margin.mem_bytes),
        margin.source
    );
    let layout = best.result.plan.megatron_layout.as_ref();
    if let Some(layout) = layout.filter(|_| best.result.plan.degrees.pp > 1) {
        let _ = writeln!(o, "  layout        {layout}");
    }
    if let Some(a) = answers.first() {
        let _ = writeln!(
            o,
            "  runs on       {} (predicted with {}'s runtime)",
            a.runs_on_label(),
            a.config.settings.runtime.stack
        );
    }
    o += "\nwhy\n";
    for line in wrap(&explain::explain(result), 92) {
        let _ = writeln!(o, "  {line}");
    }
    if !result.alternatives.is_empty() {
        o += "\nalternatives\n";
        o += &alternatives_table(result, answers);
    }
    o
}

/// The best plan and the alternatives, one line each, with the frameworks that run each
/// (`answers`, in the same order).
pub fn alternatives_table(result: &SearchResult, answers: &[Answer]) -> String {
    let mut o = String::from(
        "   #   tp  pp   dp  v mbs  schedule          recompute   sp zero        time    MFU peak GiB  runs on\n",
    );
    for ((i, e), a) in std::iter::once(&result.best)
        .chain(&result.alternatives)
        .enumerate()
        .zip(answers)
    {
        let (p, pr) = (&e.result.plan, &e.result.predicted);
        let d = &p.degrees;
        let _ = writeln!(
            o,
            "  {:>2}  {:>3} {:>3} {:>4} {:>2} {:>3}  {:<17} {:<10} {:>3} {:>4}  {:>10} {:>5.1}% {:>8}  {}",
            i + 1,
            d.tp,
            d.pp,
            d.dp,
            d.virtual_stages,
            p.micro_batch_size,
            p.schedule.as_str(),
            p.recompute_label(),
            if p.sequence_parallel { "on" } else { "off" },
            p.zero_stage,
            secs(pr.iteration_time_s),
            100.0 * pr.mfu,
            gib(pr.peak_memory_bytes),
            a.runs_on_label()
        );
    }
    o
}
