//! Why a plan won: what binds it and what would buy the next step, in a few sentences.

use crate::estimate::Estimate;
use crate::search::{key_of, SearchResult};

fn pct(x: f64) -> String {
    format!("{:.0}%", 100.0 * x)
}

fn gib(b: u64) -> String {
    format!("{} GiB", autopp_models::units::gib(b))
}

/// A short paragraph: what the time goes to, what binds, how the runner-up differs, and what
/// would make it faster.
pub fn explain(result: &SearchResult) -> String {
    let mut out = vec![time_sentence(&result.best), memory_sentence(&result.best)];
    out.extend(runner_up_sentences(result));
    out.extend(next_step_sentence(result));
    out.join(" ")
}

/// Where the time goes: compute's share and every overhead of at least 3%.
fn time_sentence(best: &Estimate) -> String {
    let p = &best.result.predicted;
    let t = p.iteration_time_s;
    let b = &p.breakdown_s;
    let mut parts = [
        ("compute", b.compute),
        ("the pipeline bubble", b.bubble),
        ("tensor-parallel communication", b.tp_comm),
        ("pipeline sends", b.pp_comm),
        ("the data-parallel gradient reduction", b.dp_comm),
        ("the optimizer step", b.optimizer),
    ];
    parts.sort_by(|a, c| c.1.total_cmp(&a.1));
    let overheads: Vec<String> = parts
        .iter()
        .filter(|(name, v)| *name != "compute" && *v / t >= 0.03)
        .map(|(name, v)| format!("{name} {}", pct(v / t)))
        .collect();
    format!(
        "Compute is {} of the iteration{}.",
        pct(b.compute / t),
        if overheads.is_empty() {
            String::from("; no overhead reaches 3%")
        } else {
            format!("; the rest is {}", overheads.join(", "))
        }
    )
}

/// Whether memory binds (the fullest rank above [`super::TIGHT_MEMORY_SHARE`] of the GPU's),
/// and what it costs if so.
fn memory_sentence(best: &Estimate) -> String {
    let p = &best.result.predicted;
    let plan = &best.result.plan;
    let headroom = 1.0 - p.peak_memory_bytes as f64 / p.memory_capacity_bytes as f64;
    let peak_rank = plan.peak_rank();
    if headroom < 1.0 - super::TIGHT_MEMORY_SHARE {
        format!(
            "Memory binds: rank {peak_rank} needs {} of {}, which is why it uses {}{}{}.",
            gib(p.peak_memory_bytes),
            gib(p.memory_capacity_bytes),
            plan.recompute_words(),
            if plan.zero_stage > 0 {
                format!(", ZeRO {}", plan.zero_stage)
            } else {
                String::new()
            },
            if plan.micro_batch_size == 1 {
                " and micro-batches of 1"
            } else {
                ""
            }
        )
    } else {
        format!(
            "Memory does not bind: the fullest rank ({peak_rank}) uses {} of {}.",
            gib(p.peak_memory_bytes),
            gib(p.memory_capacity_bytes)
        )
    }
}

/// A plan's shape (the fields of [`super::complexity`] before memory) and whether its memory is
/// tight.
fn shape_and_tightness(e: &Estimate) -> ((u64, bool, bool, u64, u64), bool) {
    let (v, fancy, uneven, pp, tp, tight) = super::complexity(e);
    ((v, fancy, uneven, pp, tp), tight)
}

/// The faster but more complex (or fuller) plan passed over within the tolerance, and the
/// runner-up.
fn runner_up_sentences(result: &SearchResult) -> Vec<String> {
    let best = &result.best;
    let t = best.result.predicted.iteration_time_s;
    let mut out = Vec::new();
    if let Some(fast) = &result.passed_over {
        let gain = 100.0 * (1.0 - fast.result.predicted.iteration_time_s / t);
        let (shape, _) = shape_and_tightness(best);
        out.push(if shape_and_tightness(fast).0 == shape {
            let pf = &fast.result.predicted;
            format!(
                "A plan of the same shape ({}) is {gain:.1}% faster but fills {} of {}: within the tolerance, the one with headroom is chosen.",
                differences(best, fast),
                gib(pf.peak_memory_bytes),
                gib(pf.memory_capacity_bytes)
            )
        } else {
            format!(
                "A more complex plan ({}) is {gain:.1}% faster, within the tolerance: the simpler one is chosen.",
                differences(best, fast)
            )
        });
    }
    let passed = result.passed_over.as_ref().map(key_of);
    if let Some(next) = result
        .alternatives
        .iter()
        .find(|n| Some(key_of(n)) != passed)
    {
        let d = next.result.predicted.iteration_time_s / t - 1.0;
        out.push(if d >= 0.0 {
            format!(
                "The runner-up ({}) is {:.1}% slower.",
                differences(best, next),
                100.0 * d
            )
        } else if shape_and_tightness(next).0 == shape_and_tightness(best).0 {
            let pn = &next.result.predicted;
            format!(
                "The runner-up ({}) is {:.1}% faster but fills {} of {}.",
                differences(best, next),
                -100.0 * d,
                gib(pn.peak_memory_bytes),
                gib(pn.memory_capacity_bytes)
            )
        } else {
            format!(
                "The runner-up ({}) is {:.1}% faster but more complex.",
                differences(best, next),
                -100.0 * d
            )
        });
    }
    out
}

/// What would buy the next step: more memory, a larger batch, or a faster network.
fn next_step_sentence(result: &SearchResult) -> Option<String> {
    let p = &result.best.result.predicted;
    let t = p.iteration_time_s;
    let b = &p.breakdown_s;
    if let Some(u) = &result.fastest_unfit {
        let gain = 1.0 - u.result.predicted.iteration_time_s / t;
        let up = &u.result.plan;
        Some(format!(
            "More memory would buy the next step: {} (recompute {}, micro-batch {}) would be {:.1}% faster but needs {} per GPU.",
            degrees(up),
            up.recompute,
            up.micro_batch_size,
            100.0 * gain,
            gib(u.result.predicted.peak_memory_bytes)
        ))
    } else if b.bubble / t >= 0.05 {
        Some(format!(
            "A larger global batch (more micro-batches per pipeline) would shrink the bubble: it is {} of the pipeline now.",
            pct(p.bubble_fraction)
        ))
    } else if b.dp_comm / t >= 0.05 {
        Some(String::from(
            "A faster network between nodes would cut the data-parallel reduction, which this plan cannot hide.",
        ))
    } else {
        None
    }
}

fn degrees(p: &crate::plan::Plan) -> String {
    let d = &p.degrees;
    let cp = if d.cp > 1 {
        format!(" · cp {}", d.cp)
    } else {
        String::new()
    };
    format!("tp {} · pp {} · dp {}{cp}", d.tp, d.pp, d.dp)
}

/// How two plans differ, in a few words.
fn differences(a: &Estimate, b: &Estimate) -> String {
    let (ka, kb) = (key_of(a), key_of(b));
    let mut d = Vec::new();
    let (da, db) = (ka.degrees, kb.degrees);
    if (da.tp, da.pp, da.dp, da.cp) != (db.tp, db.pp, db.dp, db.cp) {
        d.push(degrees(&b.result.plan));
    }
    if da.virtual_stages != db.virtual_stages || ka.schedule != kb.schedule {
        let stages = db.virtual_stages;
        let noun = if stages == 1 { "stage" } else { "stages" };
        d.push(format!("{} with {stages} {noun} per rank", kb.schedule));
    }
    if ka.micro_batch_size != kb.micro_batch_size {
        d.push(format!("micro-batch {}", kb.micro_batch_size));
    }
    if (ka.recompute, ka.partial_recompute) != (kb.recompute, kb.partial_recompute) {
        d.push(b.result.plan.recompute_words());
    }
    if ka.sequence_parallel != kb.sequence_parallel {
        d.push(format!(
            "sequence parallel {}",
            if kb.sequence_parallel { "on" } else { "off" }
        ));
    }
    if ka.zero_stage != kb.zero_stage {
        d.push(format!("ZeRO {}", kb.zero_stage));
    }
    if d.is_empty() {
        d.push(String::from("the same configuration with another split"));
    }
    d.join(", ")
}
