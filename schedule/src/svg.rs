//! An SVG Gantt chart of a simulated schedule: one lane per rank with time running to the
//! right; `F`, `B`, `I`, `W` and idle in distinct colours (later stages of a rank in lighter
//! shades of the same colour), the micro-batch number in each cell, and under each lane a
//! strip showing the activation bytes alive over time. An overlapped pair is one cell split
//! diagonally between its two actions' colours, labelled with both micro-batches (`7+3`). On
//! ranks with several stages a cell that is wide enough also names its chunk (`7·c1`: chunk 1
//! of the rank). Cells narrower than [`OUTLINE_MIN_PX`] have no outline, so that long runs stay
//! readable, and [`gantt_window`] draws a window of steps of a long run.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::ascii::fmt_time;
use super::ir::{Action, ActionKind, Schedule, Step};
use super::simulator::SimResult;

/// Fill colour of each action kind, and of idle time.
pub const COLOR_F: &str = "#4e79a7";
/// Fill colour of a full backward.
pub const COLOR_B: &str = "#59a14f";
/// Fill colour of a backward-input.
pub const COLOR_I: &str = "#f28e2b";
/// Fill colour of a backward-weight.
pub const COLOR_W: &str = "#b07aa1";
/// Fill colour of idle time.
pub const COLOR_IDLE: &str = "#e4e4e4";
/// Fill colour of the memory strip.
pub const COLOR_MEMORY: &str = "#e15759";

/// The legend's swatch for an overlapped pair (defined in the document's `<defs>`).
const PAIR_LEGEND_FILL: &str = "url(#pair-legend)";

const LEFT_PX: f64 = 64.0;
const RIGHT_PX: f64 = 70.0;
const TOP_PX: f64 = 58.0;
const LANE_PX: f64 = 26.0;
const MEM_PX: f64 = 16.0;
const GAP_PX: f64 = 10.0;
const AXIS_PX: f64 = 34.0;
/// Cells narrower than this many pixels are drawn without an outline.
pub const OUTLINE_MIN_PX: f64 = 4.0;

/// Escapes text for XML.
pub fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// The base colour of `kind`.
pub fn kind_color(kind: ActionKind) -> &'static str {
    match kind {
        ActionKind::F => COLOR_F,
        ActionKind::B => COLOR_B,
        ActionKind::I => COLOR_I,
        ActionKind::W => COLOR_W,
    }
}

/// `hex` mixed with white by `t` in `[0, 1)`.
fn lighten(hex: &str, t: f64) -> String {
    let channel =
        |i: usize| u8::from_str_radix(hex.get(i..i + 2).unwrap_or("80"), 16).unwrap_or(128);
    let mix = |c: u8| (c as f64 + (255.0 - c as f64) * t).round() as u8;
    format!(
        "#{:02x}{:02x}{:02x}",
        mix(channel(1)),
        mix(channel(3)),
        mix(channel(5))
    )
}

/// Colour of `a` on a rank holding `v` stages: later chunks are lighter.
fn action_color(s: &Schedule, a: Action) -> String {
    let chunk = a.stage as usize / s.pp.max(1);
    let v = s.virtual_stages.max(1);
    if v == 1 {
        kind_color(a.kind).to_string()
    } else {
        lighten(kind_color(a.kind), 0.5 * chunk as f64 / v as f64)
    }
}

fn fmt_num(x: f64) -> String {
    let s = format!("{x:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Bytes in a short human form (plain below 1 KiB: uniform costs count activations).
fn fmt_bytes(b: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if b < 1024 {
        return b.to_string();
    }
    let mut x = b as f64;
    let mut unit = "B";
    for u in UNITS {
        if x < 1024.0 {
            break;
        }
        x /= 1024.0;
        unit = u;
    }
    format!("{x:.1} {unit}")
}

/// A "nice" tick step near `span / 10`.
fn tick_step(span: f64) -> f64 {
    if span <= 0.0 {
        return 1.0;
    }
    let raw = span / 10.0;
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|k| k * mag)
        .find(|&x| x >= raw)
        .unwrap_or(10.0 * mag)
}

/// Sizes and scales of one chart, in pixels.
struct Frame {
    /// The first time drawn, in the run's unit.
    t0: f64,
    /// The span drawn from `t0` (1 when the run takes no time).
    makespan: f64,
    /// Width of the time axis.
    chart_px: f64,
    /// Height of one rank's lane, memory strip and gap.
    row_px: f64,
    width: f64,
    height: f64,
    /// The largest peak of activation bytes over ranks (at least 1), the memory strips' top.
    peak_bytes: u64,
    /// Whether some step is an overlapped pair.
    has_pairs: bool,
}

impl Frame {
    fn new(s: &Schedule, r: &SimResult, (t0, t1): (f64, f64)) -> Self {
        let makespan = if t1 > t0 { t1 - t0 } else { 1.0 };
        let has_pairs = r
            .timeline
            .iter()
            .flatten()
            .any(|t| matches!(t.step, Step::Overlapped(..)));
        let legend_px = 560.0
            + if s.virtual_stages > 1 { 250.0 } else { 0.0 }
            + if has_pairs { 150.0 } else { 0.0 };
        let chart_px =
            (makespan / r.shortest_step_s().unwrap_or(makespan) * 22.0).clamp(legend_px, 1800.0);
        let row_px = LANE_PX + MEM_PX + GAP_PX;
        Frame {
            t0,
            makespan,
            chart_px,
            row_px,
            width: LEFT_PX + chart_px + RIGHT_PX,
            height: TOP_PX + row_px * r.timeline.len() as f64 + AXIS_PX,
            peak_bytes: r
                .peak_activation_bytes
                .iter()
                .copied()
                .max()
                .unwrap_or(0)
                .max(1),
            has_pairs,
        }
    }

    /// The x of time `t`, clamped to the window.
    fn x_of(&self, t: f64) -> f64 {
        LEFT_PX + ((t - self.t0) / self.makespan).clamp(0.0, 1.0) * self.chart_px
    }

    /// Whether `[a, b]` shows in the window.
    fn shows(&self, a: f64, b: f64) -> bool {
        b > self.t0 && a < self.t0 + self.makespan
    }
}

/// Draws the simulated run `r` of `s` as a standalone SVG document titled `title`.
pub fn gantt(s: &Schedule, r: &SimResult, title: &str) -> String {
    gantt_window(s, r, title, (0.0, r.makespan_s))
}

/// The time window, in the run's unit, of steps `from..to` (0-based, `to` excluded) of every
/// rank: from the earliest start of a rank's step `from` to the latest end of a rank's step
/// `to − 1` (or its last step). `None` when no rank has step `from`, or `from ≥ to`.
pub fn step_window(r: &SimResult, from: usize, to: usize) -> Option<(f64, f64)> {
    if from >= to {
        return None;
    }
    let starts = r
        .timeline
        .iter()
        .filter_map(|l| l.get(from))
        .map(|t| t.start_s);
    let t0 = starts.fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.min(x))))?;
    let ends = r
        .timeline
        .iter()
        .filter(|l| l.len() > from)
        .filter_map(|l| l.get(to.min(l.len()) - 1))
        .map(|t| t.end_s);
    let t1 = ends.fold(t0, f64::max);
    Some((t0, t1))
}

/// Parses `--steps A..B` (0-based steps, `B` excluded, `A < B`).
pub fn parse_steps(text: &str) -> Option<(usize, usize)> {
    let (a, b) = text.split_once("..")?;
    let (a, b) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
    (a < b).then_some((a, b))
}

/// [`gantt`] of the time window `(from, to)` only (the run's unit): cells that cross its edges
/// are cut, the axis starts at `from`, and the header says which part of the run is shown.
pub fn gantt_window(s: &Schedule, r: &SimResult, title: &str, window: (f64, f64)) -> String {
    let f = Frame::new(s, r, window);
    let mut o = String::new();
    header(&mut o, r, title, &f);
    legend(&mut o, s, r, f.has_pairs);
    // Fills of overlapped pairs: one diagonal two-colour gradient per pair of colours.
    let mut pair_fills: BTreeMap<(String, String), String> = BTreeMap::new();
    for rank in 0..r.timeline.len() {
        lane(&mut o, s, r, rank, &f, &mut pair_fills);
        memory_strip(&mut o, r, rank, &f);
    }
    time_axis(&mut o, r, &f);
    defs(&mut o, &pair_fills);
    o.push_str("</svg>\n");
    o
}

/// The document's opening tag, background, title and headline numbers.
fn header(o: &mut String, r: &SimResult, title: &str, f: &Frame) {
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="Helvetica, Arial, sans-serif" font-size="11">"#,
        w = fmt_num(f.width),
        h = fmt_num(f.height)
    );
    let _ = writeln!(
        o,
        r#"<rect x="0" y="0" width="{}" height="{}" fill="white"/>"#,
        fmt_num(f.width),
        fmt_num(f.height)
    );
    let _ = writeln!(
        o,
        r#"<text x="{}" y="18" font-size="14" font-weight="bold">{}</text>"#,
        LEFT_PX,
        xml_escape(title)
    );
    let whole = f.t0 <= 0.0 && f.makespan >= r.makespan_s;
    let shown = if whole {
        String::new()
    } else {
        format!(
            "showing {}–{} of ",
            fmt_time(f.t0),
            fmt_time(f.t0 + f.makespan)
        )
    };
    let _ = writeln!(
        o,
        r#"<text x="{}" y="18" text-anchor="end">{shown}makespan {} · idle {:.1}% (bubble and imbalance, mean over ranks)</text>"#,
        fmt_num(LEFT_PX + f.chart_px),
        fmt_time(r.makespan_s),
        r.bubble_fraction * 100.0
    );
}

/// The legend: the action kinds the run uses, pairs, idle, memory, and the shading of later
/// stages.
fn legend(o: &mut String, s: &Schedule, r: &SimResult, has_pairs: bool) {
    let used = |k: ActionKind| {
        r.timeline
            .iter()
            .flatten()
            .any(|t| t.step.actions().any(|a| a.kind == k))
    };
    let mut lx = LEFT_PX;
    let mut legend: Vec<(&str, &str)> = [
        (ActionKind::F, "F forward"),
        (ActionKind::B, "B backward"),
        (ActionKind::I, "I backward-input"),
        (ActionKind::W, "W backward-weight"),
    ]
    .into_iter()
    .filter(|(k, _)| used(*k))
    .map(|(k, name)| (kind_color(k), name))
    .collect();
    if has_pairs {
        legend.push((PAIR_LEGEND_FILL, "F+B overlapped pair"));
    }
    legend.push((COLOR_IDLE, "idle"));
    legend.push((COLOR_MEMORY, "activations alive"));
    if s.virtual_stages > 1 {
        legend.push(("#ffffff", "lighter shade, ·cN: the rank's chunk N (from 0)"));
    }
    for (color, name) in legend {
        let _ = writeln!(
            o,
            r#"<rect x="{}" y="28" width="12" height="12" fill="{color}"/><text x="{}" y="38">{}</text>"#,
            fmt_num(lx),
            fmt_num(lx + 16.0),
            xml_escape(name)
        );
        lx += 24.0 + 6.5 * name.len() as f64;
    }
}

/// Rank `rank`'s lane: its label, the idle background and one cell per step (a pair's fill
/// named in `pair_fills`).
fn lane(
    o: &mut String,
    s: &Schedule,
    r: &SimResult,
    rank: usize,
    f: &Frame,
    pair_fills: &mut BTreeMap<(String, String), String>,
) {
    let y = TOP_PX + rank as f64 * f.row_px;
    let _ = writeln!(
        o,
        r#"<text x="{}" y="{}" text-anchor="end">rank {rank}</text>"#,
        LEFT_PX - 8.0,
        fmt_num(y + LANE_PX / 2.0 + 4.0)
    );
    let _ = writeln!(
        o,
        r#"<rect class="idle" x="{}" y="{}" width="{}" height="{}" fill="{COLOR_IDLE}"/>"#,
        LEFT_PX,
        fmt_num(y),
        fmt_num(f.chart_px),
        LANE_PX
    );
    for t in r.timeline[rank]
        .iter()
        .filter(|t| f.shows(t.start_s, t.end_s))
    {
        let (x0, x1) = (f.x_of(t.start_s), f.x_of(t.end_s));
        let (class, fill, label) = match t.step {
            Step::One(a) => (
                a.kind.letter().to_string(),
                action_color(s, a),
                cell_label(s, a, x1 - x0),
            ),
            Step::Overlapped(a, b) => {
                let colors = (action_color(s, a), action_color(s, b));
                let next = pair_fills.len();
                let id = pair_fills
                    .entry(colors)
                    .or_insert_with(|| format!("pair{next}"));
                (
                    "pair".to_string(),
                    format!("url(#{id})"),
                    format!("{}+{}", a.microbatch, b.microbatch),
                )
            }
        };
        let _ = writeln!(
            o,
            r#"<rect class="{class}" x="{}" y="{}" width="{}" height="{}" fill="{fill}"{}><title>{} [{}, {}]</title></rect>"#,
            fmt_num(x0),
            fmt_num(y),
            fmt_num((x1 - x0).max(0.0)),
            LANE_PX,
            if x1 - x0 >= OUTLINE_MIN_PX {
                r#" stroke="white" stroke-width="0.5""#
            } else {
                ""
            },
            xml_escape(&t.step.to_string()),
            fmt_time(t.start_s),
            fmt_time(t.end_s),
        );
        if x1 - x0 >= 6.5 * label.len() as f64 + 2.0 {
            let _ = writeln!(
                o,
                r#"<text x="{}" y="{}" text-anchor="middle" fill="white" font-size="11">{label}</text>"#,
                fmt_num((x0 + x1) / 2.0),
                fmt_num(y + LANE_PX / 2.0 + 4.0),
            );
        }
    }
}

/// The label of a cell of `a` that is `width_px` wide: the micro-batch, with the chunk of the
/// rank (`7·c1`) on ranks with several stages when that fits; the micro-batch alone otherwise.
fn cell_label(s: &Schedule, a: Action, width_px: f64) -> String {
    let mb = a.microbatch.to_string();
    if s.virtual_stages <= 1 {
        return mb;
    }
    let chunked = format!("{mb}·c{}", a.stage as usize / s.pp.max(1));
    if width_px >= 6.5 * chunked.chars().count() as f64 + 2.0 {
        chunked
    } else {
        mb
    }
}

/// Under rank `rank`'s lane, a step area of the bytes alive, and its peak.
fn memory_strip(o: &mut String, r: &SimResult, rank: usize, f: &Frame) {
    let y = TOP_PX + rank as f64 * f.row_px;
    let base = y + LANE_PX + MEM_PX;
    let scale = |b: u64| base - (b as f64 / f.peak_bytes as f64) * (MEM_PX - 2.0);
    let mut d = format!("M{} {}", fmt_num(f.x_of(f.t0)), fmt_num(base));
    let mut last = 0u64;
    for &(t, b) in &r.memory[rank] {
        let x = fmt_num(f.x_of(t));
        let _ = write!(
            d,
            " L{x} {} L{x} {}",
            fmt_num(scale(last)),
            fmt_num(scale(b))
        );
        last = b;
    }
    let _ = write!(
        d,
        " L{} {} L{} {} Z",
        fmt_num(f.x_of(r.makespan_s)),
        fmt_num(scale(last)),
        fmt_num(f.x_of(r.makespan_s)),
        fmt_num(base)
    );
    let _ = writeln!(
        o,
        r##"<rect x="{}" y="{}" width="{}" height="{}" fill="#fbeaea"/><path class="memory" d="{d}" fill="{COLOR_MEMORY}" fill-opacity="0.75"/>"##,
        LEFT_PX,
        fmt_num(base - MEM_PX + 2.0),
        fmt_num(f.chart_px),
        fmt_num(MEM_PX - 2.0)
    );
    let _ = writeln!(
        o,
        r#"<text x="{}" y="{}" font-size="9">peak {}</text>"#,
        fmt_num(LEFT_PX + f.chart_px + 6.0),
        fmt_num(base - 2.0),
        fmt_bytes(r.peak_activation_bytes[rank])
    );
}

/// The time axis under the lanes, with ticks at a round step.
fn time_axis(o: &mut String, r: &SimResult, f: &Frame) {
    let axis_y = TOP_PX + f.row_px * r.timeline.len() as f64;
    let _ = writeln!(
        o,
        r##"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#333"/>"##,
        LEFT_PX,
        fmt_num(axis_y),
        fmt_num(LEFT_PX + f.chart_px),
        fmt_num(axis_y)
    );
    let step = tick_step(f.makespan);
    let first = (f.t0 / step - 1e-9).ceil().max(0.0) as usize;
    let last = ((f.t0 + f.makespan) / step + 1e-9).floor() as usize;
    for k in first..=last {
        let t = k as f64 * step;
        let x = fmt_num(f.x_of(t));
        let _ = writeln!(
            o,
            r##"<line x1="{x}" y1="{}" x2="{x}" y2="{}" stroke="#333"/><text x="{x}" y="{}" text-anchor="middle">{}</text>"##,
            fmt_num(axis_y),
            fmt_num(axis_y + 4.0),
            fmt_num(axis_y + 16.0),
            fmt_time(t)
        );
    }
    let _ = writeln!(
        o,
        r#"<text x="{}" y="{}" text-anchor="end">time</text>"#,
        fmt_num(LEFT_PX + f.chart_px),
        fmt_num(axis_y + 30.0)
    );
}

/// The gradients of overlapped pairs' cells and of the legend's pair swatch (none without
/// pairs).
fn defs(o: &mut String, pair_fills: &BTreeMap<(String, String), String>) {
    if pair_fills.is_empty() {
        return;
    }
    o.push_str("<defs>\n");
    let _ = writeln!(
        o,
        r#"<linearGradient id="pair-legend" x1="0" y1="0" x2="1" y2="1"><stop offset="0.5" stop-color="{COLOR_F}"/><stop offset="0.5" stop-color="{COLOR_B}"/></linearGradient>"#
    );
    for ((a, b), id) in pair_fills {
        let _ = writeln!(
            o,
            r#"<linearGradient id="{id}" x1="0" y1="0" x2="1" y2="1"><stop offset="0.5" stop-color="{a}"/><stop offset="0.5" stop-color="{b}"/></linearGradient>"#
        );
    }
    o.push_str("</defs>\n");
}
