//! `autopp calibrate` on published runs: a fit on half of a group predicts the other half
//! better than the shipped knobs, and one run fits one knob.

use autopp_calibrate::rows::{parse_rows, PublishedRow};
use autopp_calibrate::user::{calibrate, held_out_error};
use autopp_calibrate::{evaluate_all, prepare, Calibration, Metric};

fn group(name: &str, gpu: &str) -> Vec<PublishedRow> {
    let text = include_str!("../../validation/published-runs.json");
    let rows = parse_rows(text, "published-runs.json").expect("parses");
    rows.into_iter()
        .filter(|r| r.source_group == name && r.gpu_type.as_deref() == Some(gpu))
        .collect()
}

/// The acceptance test of issue 22: MosaicML's MPT runs on H100 (one cluster, 34 iteration
/// rows), even rows fitted, odd rows tested. Measured when written: the shipped knobs' time
/// MAPE on the odd half was 57.6% (multi-node FSDP gathers costed at one NIC per GPU), a fit on
/// the even half (10 knobs) 30.6%; since ring collectives use the node's rails
/// (`Cluster::ring_link`) the shipped knobs give 10.2% and the fit 3.9%; since llm-foundry's
/// FlashAttention-2-class kernels run at half the Hopper-native rate
/// (`Efficiency::attention_fa2_on_hopper`) the shipped knobs give 5.5% and the fit 3.5%; since
/// the refit with BigScience's host-serialized runs (`Efficiency::host_block_s`) 4.1% and 1.9%.
#[test]
fn a_fit_on_half_a_group_improves_the_other_half() {
    let rows = prepare(&group("MosaicML-MPT", "H100-80GB"));
    let results = evaluate_all(&rows, &Calibration::default());
    let timed: Vec<_> = rows
        .iter()
        .zip(&results)
        .filter(|(_, r)| {
            r.comparisons
                .iter()
                .any(|c| c.metric == Metric::IterationTime)
        })
        .map(|(p, _)| p.clone())
        .collect();
    assert!(timed.len() >= 20, "{} rows", timed.len());
    let half = |parity| -> Vec<_> {
        timed
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 2 == parity)
            .map(|(_, r)| r.clone())
            .collect()
    };
    let (shipped, calibrated) = held_out_error(&half(0), &half(1));
    eprintln!("held-out half: shipped {shipped:.4}, calibrated {calibrated:.4}");
    assert!((shipped - 0.0408).abs() < 0.01, "shipped {shipped}");
    assert!(calibrated < 0.7 * shipped, "{calibrated} vs {shipped}");
}

/// One run fits `gemm_max` only, and the fitted knob brings that run's error near zero.
#[test]
fn one_run_fits_one_knob() {
    let rows = group("Narayanan2021", "A100-SXM4-80GB");
    let fit = calibrate(&rows[..1], "one.json", "2026-11-24").expect("fits");
    assert_eq!(fit.file.fitted, ["gemm_max"]);
    assert_eq!(fit.file.runs, [rows[0].id.clone()]);
    assert!(fit.held_out.is_none());
    let moved: Vec<_> = fit.knobs.iter().filter(|k| k.shipped != k.fitted).collect();
    assert!(moved.iter().all(|k| k.name == "gemm_max"), "{moved:?}");
    assert!(fit.calibrated_mape < 0.01 && fit.calibrated_mape < fit.shipped_mape);
    let text = fit.text();
    assert!(
        text.contains("10 other knobs keep their shipped values: 1 run determines at most 1 knob"),
        "{text}"
    );
}
