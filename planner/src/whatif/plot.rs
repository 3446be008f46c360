//! The sweep's pictures, each as SVG and PNG (plotters; text in the bundled DejaVu Sans, so
//! nothing is needed from the system): throughput and MFU against GPUs, time to train against
//! GPUs (one line per series), cost against time with the Pareto front marked, and a stacked
//! breakdown bar per point.
//!
//! Pictures are rendered in memory and returned as bytes; the caller writes them whole.

use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::{Outcome, Row};

/// Width and height of every picture, pixels.
pub const SIZE_PX: (u32, u32) = (960, 600);

/// DejaVu Sans (Bitstream Vera licence, `planner/data/fonts/DejaVuSans-LICENSE.txt`).
static FONT: &[u8] = include_bytes!("../../data/fonts/DejaVuSans.ttf");
const FAMILY: &str = "sans-serif";

/// One rendered picture: a file stem and its SVG text and PNG bytes.
#[derive(Debug, Clone)]
pub struct Picture {
    /// File name without extension, e.g. `throughput`.
    pub stem: &'static str,
    /// The SVG document.
    pub svg: String,
    /// The PNG file's bytes.
    pub png: Vec<u8>,
}

type DrawResult = Result<(), Box<dyn std::error::Error>>;

/// Why a picture could not be drawn.
#[derive(Debug, thiserror::Error)]
#[error("whatif pictures: {0}")]
pub struct PlotError(String);

fn register_font() -> Result<(), PlotError> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE
        .get_or_init(|| plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_ok());
    if ok {
        Ok(())
    } else {
        Err(PlotError("the bundled font could not be read".into()))
    }
}

/// The charts a sweep draws.
enum Chart {
    /// A value against GPUs, one line per series.
    Line {
        title: String,
        y_label: &'static str,
        value: fn(&super::PointPlan) -> f64,
        log_y: bool,
    },
    /// Cost against time to train, the Pareto front marked.
    Cost { title: String },
    /// Each point's iteration split into terms, as shares.
    Breakdown { title: String },
}

/// Every picture the rows allow: throughput and MFU always; time to train and cost against
/// time when the rows have them; the breakdown bars. `title` names the model.
pub fn pictures(rows: &[Row], title: &str) -> Result<Vec<Picture>, PlotError> {
    register_font()?;
    let line = |what: &str, y_label, value, log_y| Chart::Line {
        title: format!("{title}: {what}"),
        y_label,
        value,
        log_y,
    };
    let mut charts = vec![
        (
            "throughput",
            line("throughput", "tokens/s", |p| p.tokens_per_s, true),
        ),
        ("mfu", line("MFU", "MFU %", |p| 100.0 * p.mfu, false)),
    ];
    if rows
        .iter()
        .any(|r| r.plan().is_some_and(|p| p.train_time_s.is_some()))
    {
        charts.push((
            "time-to-train",
            line(
                "time to train",
                "days",
                |p| p.train_time_s.unwrap_or(f64::NAN) / 86_400.0,
                true,
            ),
        ));
    }
    if rows
        .iter()
        .any(|r| r.plan().is_some_and(|p| p.cost_usd.is_some()))
    {
        charts.push((
            "cost-vs-time",
            Chart::Cost {
                title: format!("{title}: cost against time to train"),
            },
        ));
    }
    charts.push((
        "breakdown",
        Chart::Breakdown {
            title: format!("{title}: where the iteration goes"),
        },
    ));
    charts
        .into_iter()
        .map(|(stem, chart)| render(stem, &chart, rows))
        .collect()
}

/// Draws `chart` once into an SVG string and once into an RGB buffer encoded as PNG.
fn render(stem: &'static str, chart: &Chart, rows: &[Row]) -> Result<Picture, PlotError> {
    let err = |e: Box<dyn std::error::Error>| PlotError(format!("{stem}: {e}"));
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE_PX).into_drawing_area();
        chart.draw(&root, rows).map_err(err)?;
        root.present().map_err(|e| err(e.into()))?;
    }
    let (w, h) = SIZE_PX;
    let mut rgb = vec![0u8; (w * h * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, SIZE_PX).into_drawing_area();
        chart.draw(&root, rows).map_err(err)?;
        root.present().map_err(|e| err(e.into()))?;
    }
    let png = encode_png(&rgb, w, h).map_err(|e| err(e.into()))?;
    Ok(Picture { stem, svg, png })
}

fn encode_png(rgb: &[u8], w: u32, h: u32) -> Result<Vec<u8>, png::EncodingError> {
    let mut bytes = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut bytes, w, h);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut writer = enc.write_header()?;
        writer.write_image_data(rgb)?;
    }
    Ok(bytes)
}

/// The plans of one series, by GPU count.
fn series(rows: &[Row]) -> Vec<(String, Vec<(u64, &super::PointPlan)>)> {
    let mut out: Vec<(String, Vec<(u64, &super::PointPlan)>)> = Vec::new();
    for r in rows {
        let Outcome::Plan(p) = &r.outcome else {
            continue;
        };
        match out.iter_mut().find(|(s, _)| *s == r.series) {
            Some((_, v)) => v.push((r.gpus, p)),
            None => out.push((r.series.clone(), vec![(r.gpus, p)])),
        }
    }
    for (_, v) in &mut out {
        v.sort_by_key(|(g, _)| *g);
    }
    out
}

/// A range around `lo..hi` with room on both sides (multiplicative on a log axis).
fn padded(lo: f64, hi: f64, log: bool) -> (f64, f64) {
    if log {
        let (lo, hi) = (lo.max(1e-12), hi.max(lo.max(1e-12)));
        (lo / 1.5, hi * 1.5)
    } else {
        let span = (hi - lo).max(hi.abs() * 0.1).max(1e-9);
        (
            (lo - 0.1 * span).min(0.0).max(lo - 0.1 * span),
            hi + 0.1 * span,
        )
    }
}

/// The padded x range (log: GPUs or days) and y range (`log_y` or linear) around `points`.
fn ranges(points: &[(f64, f64)], log_y: bool) -> ((f64, f64), (f64, f64)) {
    let span = |pick: fn(&(f64, f64)) -> f64| {
        let lo = points.iter().map(pick).fold(f64::MAX, f64::min);
        let hi = points.iter().map(pick).fold(f64::MIN, f64::max);
        (lo, hi)
    };
    let ((xl, xh), (yl, yh)) = (span(|p| p.0), span(|p| p.1));
    (padded(xl, xh, true), padded(yl, yh, log_y))
}

fn color(i: usize) -> RGBColor {
    let (r, g, b) = Palette99::pick(i).to_rgba().rgb();
    RGBColor(r, g, b)
}

impl Chart {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>, rows: &[Row]) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        root.fill(&WHITE)?;
        match self {
            Chart::Line {
                title,
                y_label,
                value,
                log_y,
            } => line_chart(root, title, y_label, rows, *value, *log_y),
            Chart::Cost { title } => cost_chart(root, title, rows),
            Chart::Breakdown { title } => breakdown_chart(root, title, rows),
        }
    }
}

fn no_data<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, title: &str) -> DrawResult
where
    DB::ErrorType: 'static,
{
    root.draw(&Text::new(
        format!("{title}: no point has a plan"),
        (40, 40),
        (FAMILY, 20).into_font(),
    ))?;
    Ok(())
}

fn line_chart<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    y_label: &str,
    rows: &[Row],
    value: fn(&super::PointPlan) -> f64,
    log_y: bool,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let lines: Vec<(String, Vec<(f64, f64)>)> = series(rows)
        .into_iter()
        .map(|(s, v)| {
            let pts = v
                .into_iter()
                .map(|(g, p)| (g as f64, value(p)))
                .filter(|(_, y)| y.is_finite() && (!log_y || *y > 0.0))
                .collect();
            (s, pts)
        })
        .collect();
    let all: Vec<(f64, f64)> = lines.iter().flat_map(|(_, v)| v.iter().copied()).collect();
    if all.is_empty() {
        return no_data(root, title);
    }
    let ((x0, x1), (y0, y1)) = ranges(&all, log_y);
    let mut b = ChartBuilder::on(root);
    b.caption(title, (FAMILY, 24))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(80);
    macro_rules! body {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc("GPUs")
                .y_desc(y_label)
                .x_labels(8)
                .y_labels(8)
                .x_label_formatter(&|x| format!("{x:.0}"))
                .y_label_formatter(&|y| short(*y))
                .label_style((FAMILY, 14))
                .draw()?;
            for (i, (name, pts)) in lines.iter().enumerate() {
                let c = color(i);
                chart
                    .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))?
                    .label(name.as_str())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                    });
                chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, c.filled())))?;
            }
            legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
        }};
    }
    if log_y {
        body!(b.build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())?);
    } else {
        body!(b.build_cartesian_2d((x0..x1).log_scale(), y0..y1)?);
    }
    Ok(())
}

/// Draws the chart's legend at `position`, in the pictures' one style.
fn legend<'a, DB, CT>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
) -> DrawResult
where
    DB: DrawingBackend + 'a,
    DB::ErrorType: 'static,
    CT: CoordTranslate,
{
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font((FAMILY, 14))
        .position(position)
        .draw()?;
    Ok(())
}

/// Points on the Pareto front of (time, cost): no other point is both faster and cheaper.
pub fn pareto_front(points: &[(f64, f64)]) -> Vec<usize> {
    let mut front: Vec<usize> = (0..points.len())
        .filter(|&i| {
            let (t, c) = points[i];
            !points
                .iter()
                .any(|&(t2, c2)| t2 <= t && c2 <= c && (t2 < t || c2 < c))
        })
        .collect();
    front.sort_by(|&a, &b| points[a].0.total_cmp(&points[b].0));
    front
}

fn cost_chart<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    rows: &[Row],
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let all = series(rows);
    let per_series: Vec<(&str, Vec<(f64, f64)>)> = all
        .iter()
        .map(|(name, v)| {
            let pts = v
                .iter()
                .filter_map(|(_, p)| match (p.train_time_s, p.cost_usd) {
                    (Some(t), Some(c)) => Some((t / 86_400.0, c)),
                    _ => None,
                })
                .collect();
            (name.as_str(), pts)
        })
        .collect();
    let tc: Vec<(f64, f64)> = per_series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .collect();
    if tc.is_empty() {
        return no_data(root, title);
    }
    let front = pareto_front(&tc);
    let ((x0, x1), (y0, y1)) = ranges(&tc, false);
    let mut chart = ChartBuilder::on(root)
        .caption(title, (FAMILY, 24))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(90)
        .build_cartesian_2d((x0..x1).log_scale(), y0..y1)?;
    chart
        .configure_mesh()
        .x_desc("days to train")
        .y_desc("cost, USD")
        .x_labels(8)
        .y_labels(8)
        .x_label_formatter(&|x| short(*x))
        .y_label_formatter(&|y| short(*y))
        .label_style((FAMILY, 14))
        .draw()?;
    chart
        .draw_series(LineSeries::new(
            front.iter().map(|&i| tc[i]),
            BLACK.stroke_width(2),
        ))?
        .label("Pareto front (circled)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(2)));
    chart.draw_series(
        front
            .iter()
            .map(|&i| Circle::new(tc[i], 9, BLACK.stroke_width(2))),
    )?;
    for (i, (name, pts)) in per_series.iter().enumerate() {
        let c = color(i);
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 5, c.filled())))?
            .label(*name)
            .legend(move |(x, y)| Circle::new((x + 10, y), 5, c.filled()));
    }
    legend(&mut chart, SeriesLabelPosition::MiddleRight)?;
    Ok(())
}

fn breakdown_chart<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    rows: &[Row],
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let bars: Vec<(String, [f64; 6])> = rows
        .iter()
        .filter_map(|r| {
            let p = r.plan()?;
            let b = &p.breakdown_s;
            let terms = [
                b.compute,
                b.bubble,
                b.tp_comm,
                b.pp_comm,
                b.dp_comm,
                b.optimizer,
            ];
            let total: f64 = terms.iter().sum();
            (total > 0.0).then(|| {
                (
                    format!("{} {}", r.gpus, r.gpu.split('-').next().unwrap_or(&r.gpu)),
                    terms.map(|t| 100.0 * t / total),
                )
            })
        })
        .collect();
    if bars.is_empty() {
        return no_data(root, title);
    }
    const NAMES: [&str; 6] = [
        "compute",
        "bubble",
        "tp comm",
        "pp comm",
        "dp comm",
        "optimizer",
    ];
    let n = bars.len() as i32;
    let mut chart = ChartBuilder::on(root)
        .caption(title, (FAMILY, 24))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((0..n).into_segmented(), 0f64..135f64)?;
    let labels: Vec<String> = bars.iter().map(|(l, _)| l.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(bars.len())
        .x_label_formatter(&|x| match x {
            SegmentValue::CenterOf(i) => labels.get(*i as usize).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .y_labels(8)
        .y_label_formatter(&|y| {
            if *y <= 100.0 {
                format!("{y:.0}")
            } else {
                String::new()
            }
        })
        .y_desc("share of the summed terms, %")
        .label_style((FAMILY, 11))
        .draw()?;
    for (k, name) in NAMES.iter().enumerate() {
        let c = color(k);
        chart
            .draw_series(bars.iter().enumerate().map(|(i, (_, shares))| {
                let lo: f64 = shares[..k].iter().sum();
                let i = i as i32;
                let mut r = Rectangle::new(
                    [
                        (SegmentValue::Exact(i), lo),
                        (SegmentValue::Exact(i + 1), lo + shares[k]),
                    ],
                    c.filled(),
                );
                r.set_margin(0, 0, 4, 4);
                r
            }))?
            .label(*name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
    }
    legend(&mut chart, SeriesLabelPosition::UpperMiddle)?;
    Ok(())
}

/// An axis value with an SI suffix: 1.5k, 2.3M, 12G.
fn short(v: f64) -> String {
    let (v, unit) = match v.abs() {
        a if a >= 1e9 => (v / 1e9, "G"),
        a if a >= 1e6 => (v / 1e6, "M"),
        a if a >= 1e3 => (v / 1e3, "k"),
        _ => (v, ""),
    };
    let text = if v.abs() >= 100.0 || v == v.round() {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    };
    format!("{text}{unit}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pareto_front_keeps_only_undominated_points() {
        // (days, USD): (1, 10) and (2, 5) and (4, 4) are undominated; (3, 6) is beaten by (2, 5)
        let pts = [(3.0, 6.0), (1.0, 10.0), (4.0, 4.0), (2.0, 5.0)];
        assert_eq!(pareto_front(&pts), vec![1, 3, 2]);
    }
}
