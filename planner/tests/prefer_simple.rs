//! `search::prefer_simple`: within the tolerance of the fastest plan, the simplest shape wins
//! (stages per rank, schedule, even split, pipeline ranks, tp), memory headroom deciding last;
//! and `explain` says which of the two passed the fastest over.

use autopp_hardware::{hardware, AnalyticProfile, Cluster, Precision};
use autopp_models::{presets, Model};
use autopp_planner::search::{self, explain::explain, SearchResult};
use autopp_planner::{evaluate, Degrees, Estimate, ParallelConfig};

/// The 8-layer tiny GPT preset.
fn model() -> Model {
    presets::preset("tiny-gpt").unwrap().load().unwrap()
}

/// A plan of `pp` pipeline ranks (tp 1, dp `8/pp`, 1F1B, micro-batches of 1) on 8 H100s whose
/// prediction is set to `time_s` seconds and a peak of `fill` of the GPU's memory.
fn est(pp: u64, time_s: f64, fill: f64) -> Estimate {
    est_mbs(pp, 1, time_s, fill)
}

/// [`est`] with micro-batches of `mbs`.
fn est_mbs(pp: u64, mbs: u64, time_s: f64, fill: f64) -> Estimate {
    let c = Cluster::new(hardware::gpu("h100-sxm").unwrap(), 8, 8, None).unwrap();
    let p = AnalyticProfile::new(c, Precision::Bf16).unwrap();
    let degrees = Degrees {
        tp: 1,
        pp,
        dp: 8 / pp,
        cp: 1,
        virtual_stages: 1,
    };
    let mut e = evaluate(&model(), &p, &ParallelConfig::new(degrees, mbs, 32)).unwrap();
    let pr = &mut e.result.predicted;
    pr.iteration_time_s = time_s;
    pr.peak_memory_bytes = (fill * pr.memory_capacity_bytes as f64) as u64;
    e
}

fn pp_of(e: &Estimate) -> u64 {
    e.result.plan.degrees.pp
}

fn fill_of(e: &Estimate) -> f64 {
    let pr = &e.result.predicted;
    pr.peak_memory_bytes as f64 / pr.memory_capacity_bytes as f64
}

#[test]
fn a_tight_plan_of_simpler_shape_beats_a_roomy_pipeline_within_the_tolerance() {
    let (ranked, passed) =
        search::prefer_simple(vec![est(2, 10.0, 0.5), est(1, 10.05, 0.95)], 0.01);
    assert_eq!(pp_of(&ranked[0]), 1);
    assert_eq!(passed.map(|e| pp_of(&e)), Some(2));
}

#[test]
fn headroom_decides_between_plans_of_the_same_shape() {
    let (ranked, passed) =
        search::prefer_simple(vec![est(1, 10.0, 0.95), est(1, 10.05, 0.5)], 0.01);
    assert!(fill_of(&ranked[0]) < 0.9, "the roomy plan is chosen");
    assert!(passed.is_some_and(|e| fill_of(&e) > 0.9));
}

#[test]
fn the_window_is_measured_from_the_fastest_even_when_it_is_tight() {
    // pp 4 is roomy but 3% slower than the fastest: outside the window, whatever the fullness
    // of the plans in it (an earlier rule measured the window from the fastest roomy plan)
    let plans = vec![est(2, 10.0, 0.95), est(1, 10.05, 0.95), est(4, 10.3, 0.5)];
    let (ranked, passed) = search::prefer_simple(plans, 0.01);
    assert_eq!(pp_of(&ranked[0]), 1);
    assert_eq!(passed.map(|e| pp_of(&e)), Some(2));
}

#[test]
fn a_simpler_plan_outside_the_tolerance_is_not_chosen() {
    let (ranked, passed) = search::prefer_simple(vec![est(2, 10.0, 0.5), est(1, 10.2, 0.95)], 0.01);
    assert_eq!(pp_of(&ranked[0]), 2);
    assert!(passed.is_none());
}

fn result(best: Estimate, passed_over: Estimate, runner_up: Estimate) -> SearchResult {
    SearchResult {
        best,
        alternatives: vec![passed_over.clone(), runner_up],
        passed_over: Some(passed_over),
        fastest_unfit: None,
        candidates: 3,
        simulated: 3,
        elapsed_s: 0.0,
    }
}

#[test]
fn explain_names_why_the_fastest_was_passed_over() {
    // passed over for its shape
    let text = explain(&result(
        est(1, 10.05, 0.5),
        est(2, 10.0, 0.5),
        est(4, 10.5, 0.5),
    ));
    assert!(text.contains("A more complex plan"), "{text}");
    // passed over for its memory: the same shape, fuller; and a runner-up of the same shape
    // (another micro-batch size), faster and fuller too
    let text = explain(&result(
        est(1, 10.05, 0.5),
        est(1, 10.0, 0.95),
        est_mbs(1, 2, 10.01, 0.95),
    ));
    assert!(text.contains("A plan of the same shape"), "{text}");
    assert!(text.contains("faster but fills"), "{text}");
    assert!(!text.contains("more complex"), "{text}");
}
