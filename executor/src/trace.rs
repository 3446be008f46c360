//! A Chrome trace (the Trace Event Format read by Perfetto and `chrome://tracing`) of a run:
//! one process per rank, one complete event per action of every step, the tail of each step
//! (all-reduce and optimizer), and a counter track of the bytes kept for backward.

use serde_json::{json, Value};

use crate::report::ExecReport;

/// The trace of `report` as JSON; times in microseconds since the start of the run.
pub fn chrome_trace(report: &ExecReport) -> Value {
    let mut events = Vec::new();
    for r in &report.ranks {
        let pid = r.rank;
        events.push(
            json!({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
            "args": {"name": format!("replica {} · rank {}", r.replica, r.pp_rank)}}),
        );
        events.push(
            json!({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
            "args": {"sort_index": pid}}),
        );
        for (k, s) in r.steps.iter().enumerate() {
            for e in &s.events {
                events.push(json!({
                    "name": e.action.to_string(),
                    "cat": e.action.kind.letter().to_string(),
                    "ph": "X", "pid": pid, "tid": 0,
                    "ts": e.start_s * 1e6, "dur": (e.end_s - e.start_s) * 1e6,
                    "args": {"step": k + 1, "stage": e.action.stage,
                             "microbatch": e.action.microbatch, "wait_s": e.wait_s},
                }));
            }
            events.push(json!({
                "name": "all-reduce + AdamW", "cat": "optimizer", "ph": "X", "pid": pid, "tid": 0,
                "ts": s.pipeline_end_s * 1e6, "dur": (s.end_s - s.pipeline_end_s) * 1e6,
                "args": {"step": k + 1},
            }));
            for &(t, bytes) in &s.memory {
                events.push(json!({"name": "activations", "ph": "C", "pid": pid,
                    "ts": t * 1e6, "args": {"bytes": bytes}}));
            }
        }
    }
    json!({"traceEvents": events, "displayTimeUnit": "ms"})
}
