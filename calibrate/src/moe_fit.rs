//! The fit of the four mixture-of-experts knobs ([`Efficiency::grouped_gemm_half_dim`],
//! [`Efficiency::grouped_gemm_half_rows`], [`Efficiency::moe_layer_overhead_s`] and
//! [`Efficiency::grouped_gemm_host_s`]) on the mapped MoE rows' iteration times, in sample and
//! leaving out each GPU kind × precision × family group ([`crate::moe::group_of`]). The other
//! knobs stay at the shipped fit of the dense runs, so the dense rows' predictions do not move.

use std::collections::BTreeMap;

use autopp_hardware::Efficiency;
use serde::Serialize;

use crate::{evaluate_all, Calibration, Metric, PreparedRow};

/// One group's iteration-time MAPE under the shipped knobs, the fit on every group, and the fit
/// on the other groups.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupFit {
    /// `GPU precision family`.
    pub group: String,
    /// Rows compared.
    pub count: usize,
    /// MAPE with the knobs at the shipped values (0.05 is 5 %).
    pub shipped: f64,
    /// MAPE with the knobs fitted on every group.
    pub fitted: f64,
    /// MAPE with the knobs fitted on every other group.
    pub left_out: f64,
}

/// The MoE fit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MoeFit {
    /// Fitted [`Efficiency::grouped_gemm_half_dim`].
    pub grouped_gemm_half_dim: f64,
    /// Fitted [`Efficiency::grouped_gemm_half_rows`], rows per expert.
    pub grouped_gemm_half_rows: f64,
    /// Fitted [`Efficiency::moe_layer_overhead_s`], seconds.
    pub moe_layer_overhead_s: f64,
    /// Fitted [`Efficiency::grouped_gemm_host_s`], seconds per expert GEMM.
    pub grouped_gemm_host_s: f64,
    /// Per group.
    pub groups: Vec<GroupFit>,
    /// MAPE over every MoE row: shipped, fitted, and each row predicted by the fit that left
    /// its group out.
    pub overall: [f64; 3],
}

/// Rows per expert the grid tries for [`Efficiency::grouped_gemm_half_rows`].
const HALF_ROWS: [f64; 9] = [
    0.0, 128.0, 256.0, 384.0, 512.0, 768.0, 1024.0, 1536.0, 2048.0,
];

/// Host seconds per expert GEMM the grid tries for [`Efficiency::grouped_gemm_host_s`].
const HOST_S: [f64; 6] = [0.0, 25e-6, 50e-6, 75e-6, 100e-6, 150e-6];

/// One point of the grid: grouped-GEMM half size (elements), half rows (rows per expert),
/// overhead (seconds), host time per expert GEMM (seconds).
type Point = (f64, f64, f64, f64);

/// The grid the fit searches: grouped-GEMM half size 0–4096 elements by 512, half rows
/// [`HALF_ROWS`], overhead 0–2 ms by 0.25 ms, host time [`HOST_S`].
fn grid() -> Vec<Point> {
    let mut points = Vec::new();
    for g in 0..=8 {
        for &r in &HALF_ROWS {
            for o in 0..=8 {
                for &h in &HOST_S {
                    points.push((512.0 * g as f64, r, 0.25e-3 * o as f64, h));
                }
            }
        }
    }
    points
}

/// Absolute relative iteration-time errors of the MoE rows under `cal`, by row index.
fn errors(rows: &[PreparedRow], cal: &Calibration) -> Vec<Option<f64>> {
    evaluate_all(rows, cal)
        .iter()
        .map(|r| {
            r.comparisons
                .iter()
                .find(|c| c.metric == Metric::IterationTime)
                .map(|c| c.error().abs())
        })
        .collect()
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    if n == 0 {
        0.0
    } else {
        sum / n as f64
    }
}

/// Fits the MoE knobs on the MoE rows of `prepared` (the others are ignored); `None` when no
/// MoE row has a time to compare.
pub fn fit(prepared: &[PreparedRow]) -> Option<MoeFit> {
    let rows: Vec<PreparedRow> = prepared
        .iter()
        .filter(|r| r.moe_group.is_some())
        .cloned()
        .collect();
    let group_of: Vec<&str> = rows
        .iter()
        .map(|r| r.moe_group.as_deref().unwrap_or(""))
        .collect();
    let at = |(g, r, o, h): Point| Calibration {
        efficiency: Efficiency {
            grouped_gemm_half_dim: g,
            grouped_gemm_half_rows: r,
            moe_layer_overhead_s: o,
            grouped_gemm_host_s: h,
            ..Efficiency::default()
        },
        ..Calibration::default()
    };
    let points = grid();
    let table: Vec<Vec<Option<f64>>> = points.iter().map(|&p| errors(&rows, &at(p))).collect();
    let shipped = errors(&rows, &Calibration::default());
    if shipped.iter().all(Option::is_none) {
        return None;
    }
    // the grid point with the smallest MAPE over the rows `keep` selects
    let best = |keep: &dyn Fn(usize) -> bool| -> usize {
        let score = |errs: &Vec<Option<f64>>| {
            mean(
                errs.iter()
                    .enumerate()
                    .filter(|(i, _)| keep(*i))
                    .filter_map(|(_, e)| *e),
            )
        };
        (0..points.len())
            .min_by(|&a, &b| score(&table[a]).total_cmp(&score(&table[b])))
            .unwrap_or(0)
    };
    let all = best(&|_| true);
    let mut names: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, g) in group_of.iter().enumerate() {
        if shipped[i].is_some() {
            names.entry(g).or_default().push(i);
        }
    }
    let mut out_of_sample = vec![None; rows.len()];
    let groups = names
        .iter()
        .map(|(name, members)| {
            let left = best(&|i| group_of[i] != *name);
            for &i in members {
                out_of_sample[i] = table[left][i];
            }
            let over = |errs: &[Option<f64>]| mean(members.iter().filter_map(|&i| errs[i]));
            GroupFit {
                group: name.to_string(),
                count: members.len(),
                shipped: over(&shipped),
                fitted: over(&table[all]),
                left_out: over(&table[left]),
            }
        })
        .collect();
    Some(MoeFit {
        grouped_gemm_half_dim: points[all].0,
        grouped_gemm_half_rows: points[all].1,
        moe_layer_overhead_s: points[all].2,
        grouped_gemm_host_s: points[all].3,
        groups,
        overall: [
            mean(shipped.iter().filter_map(|e| *e)),
            mean(table[all].iter().filter_map(|e| *e)),
            mean(out_of_sample.iter().filter_map(|e| *e)),
        ],
    })
}

/// The fit as text.
pub fn text(f: &MoeFit) -> String {
    let mut o = format!(
        "\nmixture-of-experts knobs fitted on the MoE rows: grouped_gemm_half_dim {:.0}, grouped_gemm_half_rows {:.0}, moe_layer_overhead_s {:.2} ms, grouped_gemm_host_s {:.0} us\n{:<28} {:>5} {:>8} {:>8} {:>9}\n",
        f.grouped_gemm_half_dim,
        f.grouped_gemm_half_rows,
        f.moe_layer_overhead_s * 1e3,
        f.grouped_gemm_host_s * 1e6,
        "group",
        "n",
        "shipped",
        "fitted",
        "left out"
    );
    for g in &f.groups {
        o += &format!(
            "{:<28} {:>5} {:>7.1}% {:>7.1}% {:>8.1}%\n",
            g.group,
            g.count,
            100.0 * g.shipped,
            100.0 * g.fitted,
            100.0 * g.left_out
        );
    }
    o += &format!(
        "{:<28} {:>5} {:>7.1}% {:>7.1}% {:>8.1}%\n",
        "all",
        f.groups.iter().map(|g| g.count).sum::<usize>(),
        100.0 * f.overall[0],
        100.0 * f.overall[1],
        100.0 * f.overall[2]
    );
    o
}
