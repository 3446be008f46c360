//! ASCII timelines in the style of the pipeline-parallelism literature: one row per rank,
//! time running to the right, one fixed-width cell per time unit.
//!
//! ```text
//! time   0     2     4     6     8     10    12    14    16
//! rank 0 F0 F1 F2 F3 ............B0    F4 B1    F5 B2    F6 B3    F7 B4    ...
//! rank 1 ...F0 F1 F2 .........B0    F3 B1    F4 B2    F5 B3    F6 B4    F7 B5 ...
//! ```
//!
//! A cell is one character wider than the longest action label: `F3` (kind and micro-batch)
//! when every rank holds one stage, the full text form `4F3` otherwise; an overlapped pair is
//! labelled `F7+B3`, cut to its span if it is shorter. An action fills as many cells as it lasts; `.` is idle.

use super::ir::{Action, ActionKind, Schedule, Step};
use super::simulator::SimResult;

/// At most this many cells per row; longer runs are rescaled.
pub const MAX_CELLS: usize = 600;

fn action_label(a: Action, with_stage: bool) -> String {
    if with_stage {
        a.to_string()
    } else {
        format!("{}{}", a.kind.letter(), a.microbatch)
    }
}

/// The label drawn for `step`.
pub fn step_label(step: &Step, with_stage: bool) -> String {
    match *step {
        Step::One(a) => action_label(a, with_stage),
        Step::Overlapped(a, b) => {
            format!(
                "{}+{}",
                action_label(a, with_stage),
                action_label(b, with_stage)
            )
        }
    }
}

/// Whether labels need the stage: when some rank holds more than one stage.
pub fn labels_need_stage(s: &Schedule) -> bool {
    s.virtual_stages > 1
}

/// The time one cell stands for: the shortest step, or `makespan / MAX_CELLS` if that is
/// coarser.
fn cell_time(r: &SimResult) -> f64 {
    let unit = r.shortest_step_s().unwrap_or(1.0);
    unit.max(r.makespan_s / MAX_CELLS as f64)
}

/// `x` with about four significant digits and no trailing zeros (`57`, `0.00123`, `1.5`).
pub fn fmt_time(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let decimals = (3 - x.abs().log10().floor() as i32).clamp(0, 12) as usize;
    let s = format!("{x:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// Draws the simulated run `r` of `s` as an ASCII timeline (a ruler, then one row per rank).
pub fn timeline(s: &Schedule, r: &SimResult) -> String {
    let with_stage = labels_need_stage(s);
    let unit = cell_time(r);
    // Cells fit single actions; a pair's longer label is cut to its span when it must be.
    let width = r
        .timeline
        .iter()
        .flatten()
        .flat_map(|t| t.step.actions())
        .map(|a| action_label(a, with_stage).len())
        .max()
        .unwrap_or(1)
        + 1;
    let cells = ((r.makespan_s / unit) - 1e-9).ceil().max(1.0) as usize;
    let col = |t: f64| ((t / unit) + 1e-9).round() as usize;
    let prefix = format!("rank {}", s.pp.saturating_sub(1)).len().max(4) + 1;

    let mut out = String::new();
    // Ruler: ticks at multiples of `tick` cells, far enough apart for their labels.
    let label_len = [1.0, 3.0, 7.0, cells as f64]
        .iter()
        .map(|&c| fmt_time(c * unit).len())
        .max()
        .unwrap_or(1);
    let mut tick = 1usize;
    for k in [1usize, 2, 3, 5, 10, 20, 25, 50, 100, 200, 500, 1000] {
        tick = k;
        if k * width >= (label_len + 2).max(6) {
            break;
        }
    }
    let mut ruler = vec![b' '; cells * width + 12];
    let mut c = 0;
    while c <= cells {
        let text = fmt_time(c as f64 * unit);
        let at = c * width;
        if at + text.len() <= ruler.len() {
            ruler[at..at + text.len()].copy_from_slice(text.as_bytes());
        }
        c += tick;
    }
    out.push_str(&format!("{:<prefix$}", "time"));
    out.push_str(String::from_utf8_lossy(&ruler).trim_end());
    out.push('\n');

    for (rank, steps) in r.timeline.iter().enumerate() {
        let mut row = vec![b'.'; cells * width];
        for t in steps {
            let c0 = col(t.start_s).min(cells.saturating_sub(1));
            let c1 = col(t.end_s).max(c0 + 1).min(cells);
            let span = &mut row[c0 * width..c1 * width];
            span.fill(b' ');
            let label = step_label(&t.step, with_stage);
            let n = label.len().min(span.len());
            span[..n].copy_from_slice(&label.as_bytes()[..n]);
        }
        out.push_str(&format!("{:<prefix$}", format!("rank {rank}")));
        out.push_str(String::from_utf8_lossy(&row).trim_end());
        out.push('\n');
    }
    let kinds: Vec<&str> = [
        (ActionKind::F, "F forward"),
        (ActionKind::B, "B backward"),
        (ActionKind::I, "I backward-input"),
        (ActionKind::W, "W backward-weight"),
    ]
    .into_iter()
    .filter(|(k, _)| {
        r.timeline
            .iter()
            .flatten()
            .any(|t| t.step.actions().any(|a| a.kind == *k))
    })
    .map(|(_, name)| name)
    .collect();
    out.push_str(&format!(
        "{}, . idle; labels {}; one cell = {} time unit{}\n",
        kinds.join(", "),
        if with_stage {
            "{stage}{kind}{micro-batch}"
        } else {
            "{kind}{micro-batch}"
        },
        fmt_time(unit),
        if (unit - 1.0).abs() < 1e-12 { "" } else { "s" },
    ));
    out
}
