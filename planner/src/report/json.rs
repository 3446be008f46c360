//! `plan --json`: the best plan, the search's figures, the alternatives and the memory margin.

use crate::search::{Plans, SearchOptions};

/// One JSON object: `plan`, `predicted`, `made_for`, `runs_on`, `search`, `alternatives` and
/// `memory_margin` of `plans`, searched with `opts`.
pub fn plan_json(plans: &Plans, opts: &SearchOptions) -> serde_json::Value {
    let (result, answers) = (&plans.result, &plans.answers);
    let best = &result.best;
    let alternatives: Vec<_> = (result.alternatives.iter().zip(&answers[1..]))
        .map(|(e, a)| {
            serde_json::json!({
                "plan": e.result.plan,
                "predicted": e.result.predicted,
                "made_for": a.made_for,
                "runs_on": a.runs_on,
            })
        })
        .collect();
    serde_json::json!({
        "plan": best.result.plan,
        "predicted": best.result.predicted,
        "made_for": answers[0].made_for,
        "runs_on": answers[0].runs_on,
        "search": {
            "elapsed_s": result.elapsed_s,
            "candidates": result.candidates,
            "simulated": result.simulated,
        },
        "alternatives": alternatives,
        "memory_margin": {
            "free_bytes": best.result.predicted.memory_capacity_bytes
                .saturating_sub(best.result.predicted.peak_memory_bytes),
            "required_bytes": opts.settings.memory_margin_bytes,
        },
    })
}
