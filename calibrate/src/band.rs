//! Uncertainty bands per GPU kind, derived from the validation errors of the shipped
//! calibration (the file format and its lookups are the planner's: `autopp_planner::bands`).
//!
//! A band is the 90th percentile of the absolute relative errors of one metric over the rows on
//! one GPU kind (or over every row, the fallback for kinds without rows). The bands are
//! written to `validation/bands.json` by `autopp validate … --bands`, and a test checks that the
//! file still matches what the model predicts.

pub use autopp_planner::bands::{Band, Bands};

use crate::{Metric, RowResult};

/// The `q`-quantile (0–1) of `values` by the nearest-rank method.
fn quantile(values: &mut [f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let rank = (q * values.len() as f64).ceil().max(1.0) as usize;
    values[rank.min(values.len()) - 1]
}

fn band(gpu: &str, metric: Metric, mut errors: Vec<f64>) -> Option<Band> {
    if errors.is_empty() {
        return None;
    }
    let n = errors.len();
    let mape = errors.iter().sum::<f64>() / n as f64;
    let max = errors.iter().copied().fold(0.0, f64::max);
    Some(Band {
        gpu: gpu.to_string(),
        metric,
        rows: n,
        mape,
        p90_abs_error: quantile(&mut errors, 0.9),
        max_abs_error: max,
    })
}

/// [`bands`] as the pretty JSON of `validation/bands.json`, ending in a newline.
pub fn bands_json(results: &[RowResult], generated_by: &str) -> Result<String, serde_json::Error> {
    Ok(serde_json::to_string_pretty(&bands(results, generated_by))? + "\n")
}

/// Bands of iteration time and peak memory per GPU kind, then over every row.
pub fn bands(results: &[RowResult], generated_by: &str) -> Bands {
    let mut kinds: Vec<&str> = results.iter().filter_map(|r| r.gpu.as_deref()).collect();
    kinds.sort_unstable();
    kinds.dedup();
    let errors = |gpu: Option<&str>, metric: Metric| -> Vec<f64> {
        results
            .iter()
            .filter(|r| gpu.is_none() || r.gpu.as_deref() == gpu)
            .flat_map(|r| &r.comparisons)
            .filter(|c| c.metric == metric)
            .map(|c| c.error().abs())
            .collect()
    };
    let mut out = Vec::new();
    for metric in [Metric::IterationTime, Metric::PeakMemory] {
        for k in &kinds {
            out.extend(band(k, metric, errors(Some(k), metric)));
        }
    }
    for metric in [Metric::IterationTime, Metric::PeakMemory] {
        out.extend(band("all", metric, errors(None, metric)));
    }
    Bands {
        generated_by: generated_by.to_string(),
        bands: out,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Comparison;

    fn row(gpu: &str, errs: &[f64]) -> RowResult {
        RowResult {
            id: format!("{gpu}-{}", errs.len()),
            group: "g".into(),
            gpu: Some(gpu.into()),
            comparisons: errs
                .iter()
                .map(|e| Comparison {
                    metric: Metric::IterationTime,
                    predicted: 1.0 + e,
                    published: 1.0,
                })
                .collect(),
            skipped: None,
            notes: Vec::new(),
            breakdown_s: None,
            fit: None,
        }
    }

    /// Hand-worked: errors 1 %, 2 %, …, 10 % → the nearest-rank 90th percentile is 9 %.
    #[test]
    fn p90_hand_worked() {
        let errs: Vec<f64> = (1..=10).map(|i| i as f64 / 100.0).collect();
        let b = bands(&[row("a100-80g", &errs)], "test");
        let a = b.for_gpu("a100-80g", Metric::IterationTime).unwrap();
        assert_eq!(a.rows, 10);
        assert!((a.p90_abs_error - 0.09).abs() < 1e-12);
        assert!((a.max_abs_error - 0.10).abs() < 1e-12);
        assert!((a.mape - 0.055).abs() < 1e-12);
        assert!(b.for_gpu("h200", Metric::IterationTime).is_none());
        assert_eq!(b.overall(Metric::IterationTime).unwrap().rows, 10);
        let text = serde_json::to_string(&b).unwrap();
        // serde_json reads floats to within an ulp or so
        assert!(Bands::from_json(&text).unwrap().agrees_with(&b, 1e-12));
    }
}
