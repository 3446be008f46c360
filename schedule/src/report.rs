//! What `autopp schedule` prints about a simulated schedule: a title, the ASCII timeline when it
//! fits a terminal, the makespan and bubble, and busy, idle and peak in-flight per rank; or the
//! same as one JSON object ([`Summary`]).

use serde::Serialize;

use crate::ascii;
use crate::ir::{Schedule, ScheduleKind};
use crate::simulator::SimResult;

/// Ranks with more steps than this get no ASCII timeline.
pub const ASCII_MAX_STEPS: usize = 96;

/// The schedule and its simulation as `schedule --json` prints them, in this key order.
#[derive(Debug, Serialize)]
pub struct Summary<'a> {
    /// The schedule kind.
    pub schedule: ScheduleKind,
    /// Pipeline ranks.
    pub pp: usize,
    /// Stages per rank.
    pub virtual_stages: usize,
    /// Micro-batches per iteration.
    pub num_microbatches: usize,
    /// Each rank's steps as text (`F0.1`, `B1.3`, …).
    pub ranks: Vec<Vec<String>>,
    /// The simulation's figures.
    pub metrics: Metrics<'a>,
}

/// The `metrics` object of [`Summary`]; times in the simulation's unit.
#[derive(Debug, Serialize)]
pub struct Metrics<'a> {
    /// The time from the first step's start to the last step's end.
    pub makespan: f64,
    /// Idle share of the ranks' time over the makespan.
    pub bubble_fraction: f64,
    /// Busy time per rank.
    pub busy: &'a [f64],
    /// The most micro-batches whose activations a rank holds at once, per rank.
    pub peak_inflight: &'a [u32],
}

impl<'a> Summary<'a> {
    /// The summary of `s` simulated as `r`.
    pub fn new(s: &Schedule, r: &'a SimResult) -> Summary<'a> {
        Summary {
            schedule: s.kind,
            pp: s.pp,
            virtual_stages: s.virtual_stages,
            num_microbatches: s.num_microbatches,
            ranks: s.ranks_text(),
            metrics: Metrics {
                makespan: r.makespan_s,
                bubble_fraction: r.bubble_fraction,
                busy: &r.busy_s,
                peak_inflight: &r.peak_inflight,
            },
        }
    }
}

/// `kind · pp P · M micro-batches[ · V stages per rank]`, the title's common part.
pub fn title(s: &Schedule) -> String {
    format!(
        "{} · pp {} · {} micro-batches{}",
        s.kind,
        s.pp,
        s.num_microbatches,
        if s.virtual_stages > 1 {
            format!(" · {} stages per rank", s.virtual_stages)
        } else {
            String::new()
        }
    )
}

/// The text report of `s` simulated as `r`, under `title` and the line saying where the costs
/// come from.
pub fn text(s: &Schedule, r: &SimResult, title: &str, costs_line: &str) -> String {
    let mut out = format!("{title}\n{costs_line}\n\n");
    let longest = s.ranks.iter().map(Vec::len).max().unwrap_or(0);
    if longest <= ASCII_MAX_STEPS {
        out.push_str(&ascii::timeline(s, r));
    } else {
        out.push_str(&format!(
            "(the timeline has {longest} steps per rank: too long for a terminal; use --svg or --trace)\n"
        ));
    }
    out.push_str(&format!(
        "\nmakespan {}   bubble fraction {:.4}\n",
        fmt(r.makespan_s),
        r.bubble_fraction
    ));
    out.push_str("rank   busy      idle      peak in-flight\n");
    for (rank, busy) in r.busy_s.iter().enumerate() {
        out.push_str(&format!(
            "{rank:<6} {:<9} {:<9} {}\n",
            fmt(*busy),
            fmt(r.makespan_s - busy),
            r.peak_inflight[rank]
        ));
    }
    out
}

/// A time with at most three decimals and no trailing zeros.
fn fmt(t: f64) -> String {
    let s = format!("{t:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}
