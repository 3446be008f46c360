//! Error statistics: mean absolute percentage error and the largest error, per source group and
//! metric, and over all groups.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{Metric, RowResult};

/// The errors of one metric over one group of rows (or all of them).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupSummary {
    /// Source group, or `all`.
    pub group: String,
    /// What was compared.
    pub metric: Metric,
    /// Comparisons made.
    pub count: usize,
    /// Mean absolute relative error (0.05 is 5 %).
    pub mape: f64,
    /// Mean signed relative error: positive when autopp predicts too much.
    pub bias: f64,
    /// Largest absolute relative error.
    pub max_abs_error: f64,
    /// The row with the largest error.
    pub worst_row: String,
}

/// Every group's errors, the overall errors, and the row counts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// Per source group and metric, groups in name order.
    pub groups: Vec<GroupSummary>,
    /// Per metric over every group.
    pub overall: Vec<GroupSummary>,
    /// Rows with at least one comparison.
    pub rows_compared: usize,
    /// Rows skipped as a whole.
    pub rows_skipped: usize,
}

impl Summary {
    /// The summary of `metric` in `group` (`all` for the overall one).
    pub fn get(&self, group: &str, metric: Metric) -> Option<&GroupSummary> {
        self.groups
            .iter()
            .chain(&self.overall)
            .find(|g| g.group == group && g.metric == metric)
    }
}

fn stats(group: &str, metric: Metric, errors: &[(String, f64)]) -> Option<GroupSummary> {
    if errors.is_empty() {
        return None;
    }
    let n = errors.len() as f64;
    let mape = errors.iter().map(|(_, e)| e.abs()).sum::<f64>() / n;
    let bias = errors.iter().map(|(_, e)| e).sum::<f64>() / n;
    let (worst, max) = errors
        .iter()
        .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
        .map(|(id, e)| (id.clone(), e.abs()))
        .unwrap_or_default();
    Some(GroupSummary {
        group: group.to_string(),
        metric,
        count: errors.len(),
        mape,
        bias,
        max_abs_error: max,
        worst_row: worst,
    })
}

/// MAPE, bias and the largest error per group and metric, and overall.
pub fn summarize(results: &[RowResult]) -> Summary {
    let mut by_group: BTreeMap<(&str, Metric), Vec<(String, f64)>> = BTreeMap::new();
    let mut all: BTreeMap<Metric, Vec<(String, f64)>> = BTreeMap::new();
    for r in results {
        for c in &r.comparisons {
            let e = (r.id.clone(), c.error());
            by_group
                .entry((r.group.as_str(), c.metric))
                .or_default()
                .push(e.clone());
            all.entry(c.metric).or_default().push(e);
        }
    }
    Summary {
        groups: by_group
            .iter()
            .filter_map(|((g, m), errs)| stats(g, *m, errs))
            .collect(),
        overall: all
            .iter()
            .filter_map(|(m, errs)| stats("all", *m, errs))
            .collect(),
        rows_compared: results.iter().filter(|r| !r.comparisons.is_empty()).count(),
        rows_skipped: results.iter().filter(|r| r.skipped.is_some()).count(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Comparison;

    fn row(id: &str, group: &str, pairs: &[(f64, f64)]) -> RowResult {
        RowResult {
            id: id.into(),
            group: group.into(),
            gpu: None,
            comparisons: pairs
                .iter()
                .map(|&(p, q)| Comparison {
                    metric: Metric::IterationTime,
                    predicted: p,
                    published: q,
                })
                .collect(),
            skipped: None,
            notes: Vec::new(),
            breakdown_s: None,
            fit: None,
        }
    }

    /// Hand-worked: errors +10 % and −20 % → MAPE 15 %, bias −5 %, max 20 % on row b.
    #[test]
    fn mape_hand_worked() {
        let s = summarize(&[row("a", "g", &[(1.1, 1.0)]), row("b", "g", &[(0.8, 1.0)])]);
        let g = s.get("g", Metric::IterationTime).unwrap();
        assert_eq!(g.count, 2);
        assert!((g.mape - 0.15).abs() < 1e-12);
        assert!((g.bias + 0.05).abs() < 1e-12);
        assert!((g.max_abs_error - 0.2).abs() < 1e-12);
        assert_eq!(g.worst_row, "b");
        assert_eq!(s.get("all", Metric::IterationTime).unwrap().count, 2);
        assert!(s.get("g", Metric::PeakMemory).is_none());
    }
}
