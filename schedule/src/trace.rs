//! Chrome trace JSON (the Trace Event Format read by Perfetto and `chrome://tracing`) of a
//! simulated schedule: one process per rank with one complete event (`"ph": "X"`) per step,
//! and a counter track (`"ph": "C"`) of the activation bytes alive.

use serde_json::{json, Value};

use super::ir::{Schedule, Step};
use super::simulator::SimResult;

/// The trace of the simulated run `r` of `s` as a JSON value. `us_per_unit` converts the
/// simulation's time unit to the trace's microseconds (`1e6` when the costs are in seconds).
pub fn chrome_trace_value(s: &Schedule, r: &SimResult, us_per_unit: f64) -> Value {
    let mut events = Vec::with_capacity(s.num_actions() + 4 * s.pp + 16);
    for rank in 0..r.timeline.len() {
        events.push(json!({
            "name": "process_name", "ph": "M", "pid": rank, "tid": 0,
            "args": {"name": format!("rank {rank}")}
        }));
        events.push(json!({
            "name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0,
            "args": {"sort_index": rank}
        }));
        events.push(json!({
            "name": "thread_name", "ph": "M", "pid": rank, "tid": 0,
            "args": {"name": "compute"}
        }));
    }
    for (rank, steps) in r.timeline.iter().enumerate() {
        for t in steps {
            let (cat, args) = match t.step {
                Step::One(a) => (
                    a.kind.letter().to_string(),
                    json!({"stage": a.stage, "microbatch": a.microbatch, "kind": a.kind}),
                ),
                Step::Overlapped(a, b) => (
                    format!("{}+{}", a.kind.letter(), b.kind.letter()),
                    json!({"overlapped": [a.to_string(), b.to_string()]}),
                ),
            };
            events.push(json!({
                "name": t.step.to_string(),
                "cat": cat,
                "ph": "X",
                "pid": rank,
                "tid": 0,
                "ts": t.start_s * us_per_unit,
                "dur": (t.end_s - t.start_s) * us_per_unit,
                "args": args,
            }));
        }
        events.push(json!({
            "name": "activations", "ph": "C", "pid": rank, "ts": 0.0, "args": {"bytes": 0}
        }));
        for &(t, bytes) in &r.memory[rank] {
            events.push(json!({
                "name": "activations", "ph": "C", "pid": rank,
                "ts": t * us_per_unit, "args": {"bytes": bytes}
            }));
        }
    }
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "schedule": s.kind.as_str(),
            "pp": s.pp,
            "virtual_stages": s.virtual_stages,
            "num_microbatches": s.num_microbatches,
            "makespan": r.makespan_s,
            "bubble_fraction": r.bubble_fraction,
        }
    })
}

/// [`chrome_trace_value`] as a JSON string.
pub fn chrome_trace(s: &Schedule, r: &SimResult, us_per_unit: f64) -> String {
    chrome_trace_value(s, r, us_per_unit).to_string()
}
