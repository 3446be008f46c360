//! Published runs that are not rows of the calibration set (`validation/held-out/`), which no
//! fit has seen: their peak memory and iteration time stay at what the shipped model predicts
//! for them plus a margin, and every fit verdict is right.
//!
//! BigScience's pre-launch benchmarks, read from the tables of `chronicles-prequel.md`:
//!
//! - `bloom-bf16-optimizer.json`, the 02-28 "Rebalancing layers" runs under DeepSpeed's
//!   `BF16_Optimizer`: memory 2.9% (7.7% before the optimizer's fp32 cast of the largest
//!   gradient was counted, 19.1% before its bf16 gradients beside the fp32 ones), time 4.9%.
//! - `bloom-fp16.json`, the 02-25 to 02-27 runs under the fp16 ZeRO-1 optimizer: memory 4.8%
//!   (one configuration read twice, 44 and 38 GB, costs 1 point), time 7.7% (the pipelines of 2
//!   and 4 stages at data-parallel 12 and 24 run 15–27% slower than predicted).
//!
//! torchtitan's 2024-12 benchmark beyond the 8B rows the calibration set holds
//! (`torchtitan-70b-405b.json`: Llama 3.1 70B on 256 GPUs with FSDP and TP, 405B on 512 with
//! FSDP, TP, PP and CP, all compiled with Float8 and full recompute): memory 9.6% (42.0% before
//! FSDP2's unsharded stage under PyTorch's pipeline stages was counted, 14.0% before DTensor's
//! loss parallelism and gathered linear inputs were; the 405B rows still under-predicted,
//! `validation/README.md`), time 10.9% (12.4% before float8 tensorwise's backward all-gathers
//! moved float8 gradients, 15.9% before the pipelined stage's once-per-step gather and
//! reduce-scatter replaced FSDP's per-micro-batch exchange). The
//! model's known gap at this scale, pinned so that it only closes.

use autopp_calibrate::rows::parse_rows;
use autopp_calibrate::{evaluate_all, prepare, summarize, Calibration, Metric};

/// A margin a change may cost on a MAPE before the test fails.
const MARGIN: f64 = 0.01;

/// Evaluates `text` (the file at `path`, `rows` rows) with the shipped knobs and checks the
/// verdicts and the two MAPEs against `memory_mape` and `time_mape`.
fn check(path: &str, text: &str, rows: usize, memory_mape: f64, time_mape: f64) {
    let parsed = parse_rows(text, path).expect("the held-out rows parse");
    let results = evaluate_all(&prepare(&parsed), &Calibration::default());
    assert_eq!(results.len(), rows, "{path}");
    for r in &results {
        let verdict = r.fit.unwrap_or_else(|| panic!("{}: no fit verdict", r.id));
        assert!(verdict.right(), "{}: wrong fit verdict", r.id);
    }
    let summary = summarize(&results);
    for (metric, bound) in [
        (Metric::PeakMemory, memory_mape),
        (Metric::IterationTime, time_mape),
    ] {
        let all = summary.get("all", metric).expect("compared");
        assert_eq!(
            all.count, rows,
            "{path} {metric:?}: {} rows compared",
            all.count
        );
        assert!(
            all.mape <= bound + MARGIN,
            "{path} {metric:?} MAPE {:.1}% above {:.1}% + {:.1}%",
            100.0 * all.mape,
            100.0 * bound,
            100.0 * MARGIN
        );
    }
}

#[test]
fn bf16_optimizer_rows_stay_within_their_mape() {
    check(
        "validation/held-out/bloom-bf16-optimizer.json",
        include_str!("../../validation/held-out/bloom-bf16-optimizer.json"),
        17,
        0.029,
        0.049,
    );
}

#[test]
fn fp16_rows_stay_within_their_mape() {
    check(
        "validation/held-out/bloom-fp16.json",
        include_str!("../../validation/held-out/bloom-fp16.json"),
        23,
        0.048,
        0.077,
    );
}

#[test]
fn torchtitan_large_rows_stay_within_their_mape() {
    check(
        "validation/held-out/torchtitan-70b-405b.json",
        include_str!("../../validation/held-out/torchtitan-70b-405b.json"),
        8,
        0.096,
        0.109,
    );
}
