//! The acceptance bounds of issue 3, asserted through the same path as `autopp validate`: every
//! row of `validation/published-runs.json` evaluated under the shipped calibration.

use autopp_calibrate::band::{self, Bands};
use autopp_calibrate::fit::{self, FitOptions};
use autopp_calibrate::{rows::parse_rows, Calibration, Metric, PreparedRow};

fn path(rel: &str) -> String {
    format!("{}/../{rel}", env!("CARGO_MANIFEST_DIR"))
}

fn prepared() -> Vec<PreparedRow> {
    let file = path("validation/published-runs.json");
    let text = std::fs::read_to_string(&file).expect("the project's copy of the published runs");
    let rows = parse_rows(&text, &file).expect("the published-runs file parses");
    autopp_calibrate::prepare(&rows)
}

#[test]
fn shipped_calibration_meets_the_acceptance_bounds() {
    let rows = prepared();
    let results = autopp_calibrate::evaluate_all(&rows, &Calibration::default());
    let summary = autopp_calibrate::summarize(&results);
    for check in autopp_calibrate::acceptance(&summary) {
        assert!(
            check.passes(),
            "{}: {:?} exceeds {}",
            check.what,
            check.value,
            check.bound
        );
    }
    // no Narayanan row is skipped, and every skipped row says why
    for r in &results {
        if r.group == "Narayanan2021" {
            assert!(r.skipped.is_none(), "{} skipped: {:?}", r.id, r.skipped);
            assert_eq!(r.comparisons.len(), 1, "{}", r.id);
        }
        if let Some(why) = &r.skipped {
            assert!(why.len() > 10, "{}: reason too short: {why}", r.id);
        }
    }
    // every BLOOM row with layers and hidden size is compared (one is inconsistent)
    let bloom = results
        .iter()
        .filter(|r| r.group == "BLOOM-prelaunch-benchmarks");
    let compared = bloom.clone().filter(|r| !r.comparisons.is_empty()).count();
    assert!(compared >= 40, "{compared} BLOOM rows compared");
}

/// The iteration-time MAPE the project's rows reach under the shipped calibration, with a
/// margin of about one point, so a change that makes them worse fails. Achieved when set:
/// MosaicML-MPT 13.0% (31.8% before ring collectives used the node's rails), every row 10.2%;
/// 10.6% and 8.9% once llm-foundry's FlashAttention-2 runs at half the Hopper-native rate on
/// H100 (`Efficiency::attention_fa2_on_hopper`).
/// With the shared file's NeMo, torchtitan and MegaScale rows (MegaScale skipped: no
/// micro-batch size): NeMo 6.7%, torchtitan 15.8% (FlashAttention-2 on Hopper and eager
/// PyTorch; the 10% is not met), every row 9.5%.
#[test]
fn todays_stacks_keep_their_iteration_time_errors() {
    let rows = prepared();
    let results = autopp_calibrate::evaluate_all(&rows, &Calibration::default());
    let summary = autopp_calibrate::summarize(&results);
    for (group, rows, bound) in [
        ("MosaicML-MPT", 77, 0.12),
        ("NeMo", 12, 0.08),
        ("torchtitan", 18, 0.17),
        ("all", 170, 0.105),
    ] {
        let g = summary
            .get(group, Metric::IterationTime)
            .unwrap_or_else(|| panic!("{group} has iteration-time rows"));
        assert!(g.count >= rows, "{group}: {} rows compared", g.count);
        assert!(g.mape <= bound, "{group}: MAPE {} over {bound}", g.mape);
    }
}

/// The peak-memory errors of today's stacks under the shipped model, with a margin of about a
/// point. Achieved when set: torchtitan 3.9% over 12 rows, largest 7.0% (10.4% and 43.8% before
/// its compiled loss was modelled: the two H200 rows of June 2025, `Runtime::compiled_loss`),
/// every row 4.0%.
#[test]
fn todays_stacks_keep_their_memory_errors() {
    let rows = prepared();
    let results = autopp_calibrate::evaluate_all(&rows, &Calibration::default());
    let summary = autopp_calibrate::summarize(&results);
    for (group, rows, bound, worst) in [("torchtitan", 12, 0.05, 0.08), ("all", 41, 0.05, 0.31)] {
        let g = summary
            .get(group, Metric::PeakMemory)
            .unwrap_or_else(|| panic!("{group} has peak-memory rows"));
        assert!(g.count >= rows, "{group}: {} rows compared", g.count);
        assert!(g.mape <= bound, "{group}: MAPE {} over {bound}", g.mape);
        assert!(
            g.max_abs_error <= worst,
            "{group}: largest {} over {worst}",
            g.max_abs_error
        );
    }
}

#[test]
fn bundled_bands_match_the_model() {
    let rows = prepared();
    let results = autopp_calibrate::evaluate_all(&rows, &Calibration::default());
    let fresh = band::bands(&results, "test");
    let text = std::fs::read_to_string(path("validation/bands.json")).unwrap();
    let shipped = Bands::from_json(&text).expect("validation/bands.json parses");
    assert!(
        shipped.agrees_with(&fresh, 1e-6),
        "validation/bands.json is stale: run `bash validation/regenerate.sh`"
    );
    assert!(shipped.for_gpu("a100-80g", Metric::IterationTime).is_some());
    assert!(shipped.for_gpu("b200", Metric::IterationTime).is_none());
}

/// The fit is deterministic, and it improves on its starting point (a small subset, few steps).
#[test]
fn fit_is_deterministic_on_a_subset() {
    let rows = prepared();
    let subset: Vec<&PreparedRow> = rows
        .iter()
        .filter(|r| r.group == "Korthikanti2022" || r.id.starts_with("megatron2021_t2_PTD-P_174"))
        .collect();
    assert_eq!(subset.len(), 8);
    let opts = FitOptions {
        max_evaluations: 40,
        tolerance: 1e-9,
    };
    let a = fit::fit_time(&subset, &fit::PRIOR, opts);
    let b = fit::fit_time(&subset, &fit::PRIOR, opts);
    assert_eq!(a, b);
    let owned: Vec<PreparedRow> = subset.iter().map(|r| (*r).clone()).collect();
    let error = |e| {
        let cal = Calibration {
            efficiency: e,
            ..Calibration::default()
        };
        fit::time_objective(&autopp_calibrate::evaluate_all(&owned, &cal))
    };
    assert!(
        error(a) < error(fit::PRIOR),
        "{} vs {}",
        error(a),
        error(fit::PRIOR)
    );
}

/// The memory terms are fitted on half the rows and checked on the other half: the shipped
/// terms stay within the bound out of sample too.
#[test]
fn memory_terms_hold_out_of_sample() {
    let rows = prepared();
    let mem = fit::memory_rows(&rows);
    assert!(mem.len() >= 25, "{} memory rows", mem.len());
    let even: Vec<&fit::MemoryRow> = mem.iter().step_by(2).collect();
    let odd: Vec<&fit::MemoryRow> = mem.iter().skip(1).step_by(2).collect();
    let (f, c) = fit::fit_memory(&even);
    assert!(fit::memory_mape(&odd, f, c) < 0.10);
    let shipped = Calibration::default();
    assert!(fit::memory_mape(&odd, shipped.fragmentation, shipped.context_bytes) < 0.10);
}

/// Issue 15: the memory terms fitted on one half of BLOOM's pre-launch runs (a fixed split by
/// the parity of the row number, `bloom_prequel_NNN`) predict the other half within 7 %.
/// Figures of this split (29 rows with layers, hidden size and a peak: 13 even, 16 odd): fitted
/// on the even rows, 3.9 % on the odd ones; fitted on the odd rows, 5.8 % on the even ones.
#[test]
fn bloom_memory_halves_hold_out_of_sample() {
    let rows = prepared();
    let mem = fit::memory_rows(&rows);
    let bloom: Vec<&fit::MemoryRow> = mem
        .iter()
        .filter(|r| r.id.starts_with("bloom_prequel_"))
        .collect();
    assert_eq!(bloom.len(), 29);
    assert!(bloom.iter().all(|r| r.fitted()));
    for (parity, train_rows, bound) in [(0, 13, 0.045), (1, 16, 0.065)] {
        let (train, test) = fit::memory_halves(&bloom, parity);
        assert_eq!((train.len(), test.len()), (train_rows, 29 - train_rows));
        let (f, c) = fit::fit_memory(&train);
        let out = fit::memory_mape(&test, f, c);
        assert!(
            out <= bound,
            "fitted on parity {parity}: {out:.4} out of sample"
        );
        assert!(out <= 0.07);
    }
}
