//! The mixture-of-experts runs of `validation/moe/runs.json` against autopp: every row is
//! compared or listed with its reason, and the iteration-time MAPE stays at what the shipped
//! knobs achieve (14.7% over 86 rows with the host floor of the experts' GEMMs; 16.1% before
//! it, 20.1% before the rows-per-expert factor, 22.8% before the node-deduplicating
//! dispatcher) plus a small margin, so a regression of the MoE cost model fails here.

use autopp_calibrate::rows::parse_rows;
use autopp_calibrate::{evaluate_all, moe, prepare, Calibration, Metric};

/// The MoE MAPE the shipped knobs reach, and the margin a change may cost before it fails.
const MOE_MAPE: f64 = 0.147;
const MARGIN: f64 = 0.015;

#[test]
fn moe_rows_stay_within_their_mape() {
    let text = include_str!("../../validation/moe/runs.json");
    let rows = parse_rows(text, "validation/moe/runs.json").expect("the MoE rows parse");
    let prepared = prepare(&rows);
    let results = evaluate_all(&prepared, &Calibration::default());
    assert_eq!(results.len(), rows.len());
    for r in &results {
        assert!(
            !r.comparisons.is_empty() || r.skipped.as_deref().is_some_and(|s| !s.is_empty()),
            "{}: neither compared nor skipped with a reason",
            r.id
        );
    }
    let summary = moe::summary(&prepared, &results).expect("MoE rows mapped");
    let all = summary
        .get("all", Metric::IterationTime)
        .expect("MoE iteration times compared");
    assert!(all.count >= 86, "only {} MoE rows compared", all.count);
    assert!(
        all.mape <= MOE_MAPE + MARGIN,
        "MoE iteration-time MAPE {:.1}% above {:.1}% + {:.1}%",
        100.0 * all.mape,
        100.0 * MOE_MAPE,
        100.0 * MARGIN
    );
    // the groups named by the goal are reported
    for group in [
        "h100 fp8 qwen3-moe",
        "gb200 fp8 deepseek-v3",
        "b200 fp8 deepseek-v3",
    ] {
        assert!(
            summary.get(group, Metric::IterationTime).is_some(),
            "{group} missing"
        );
    }
}
