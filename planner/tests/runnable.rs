//! The default search (`--framework any`, issue #22): the best plan some framework runs, never
//! slower than any single framework's search, equal to the exhaustive search's best on medium
//! cases, and every answer says which frameworks run it.
//!
//! The full grid (every preset × 8/32/128/1024 GPUs × H100 and A100) runs in release:
//! `cargo test --release -p autopp-planner --test runnable -- --ignored` (in `.ci/run`).

use autopp_hardware::{hardware, AnalyticProfile, Cluster, Precision};
use autopp_models::{load, Model};
use autopp_planner::search::{self, runnable::framework_options, SearchOptions};
use autopp_planner::{Estimate, Framework};

const PRESETS: [&str; 10] = [
    "tiny-gpt",
    "llama3-8b",
    "llama3-70b",
    "llama2-70b",
    "llama3-405b",
    "gpt3-175b",
    "opt-175b",
    "bloom-176b",
    "mt-nlg-530b",
    "megatron-1t",
];
const GPUS: [u64; 4] = [8, 32, 128, 1024];
const KINDS: [&str; 2] = ["h100-sxm", "a100-80g"];

fn setup(model: &str, gpu: &str, gpus: u64) -> (Model, AnalyticProfile) {
    let m = load(model).expect("preset");
    let c = Cluster::new(hardware::gpu(gpu).expect("gpu"), gpus, 8, None).expect("cluster");
    (
        m,
        AnalyticProfile::new(c, Precision::Bf16).expect("profile"),
    )
}

/// `plan`'s options for the default framework, the fastest plan rather than the simplest.
fn options(model: &Model, global_batch: Option<u64>) -> SearchOptions {
    let gb = global_batch.or(model.default_global_batch()).unwrap_or(512);
    let mut opts = SearchOptions::new(Framework::Any, gb, 8);
    opts.tolerance = 0.0;
    opts
}

/// A plan's key and split, for a failure message.
fn describe(e: &Estimate) -> String {
    let split: Vec<usize> = e
        .stages
        .iter()
        .map(|s| s.layers[1] + 1 - s.layers[0])
        .collect();
    format!("{:?} split {split:?}", search::key_of(e))
}

/// The fastest plan's time of `framework`'s own search (`plan --framework NAME`), if one fits.
fn framework_best(
    m: &Model,
    p: &AnalyticProfile,
    opts: &SearchOptions,
    fw: Framework,
) -> Option<f64> {
    let o = framework_options(m, opts, fw)?;
    let r = search::search(m, p, &o, &|_, _| {}).ok()?;
    Some(r.best.result.predicted.iteration_time_s)
}

/// One grid point: the default's best is at least as fast as every framework's, and runnable.
fn check_point(model: &str, gpu: &str, gpus: u64) {
    let (m, p) = setup(model, gpu, gpus);
    let opts = options(&m, None);
    let singles: Vec<(Framework, f64)> = Framework::RUNNABLE
        .into_iter()
        .filter_map(|fw| Some((fw, framework_best(&m, &p, &opts, fw)?)))
        .collect();
    let any = search::plans(&m, &p, &opts, true, &|_, _| {});
    let Some(&(_, fastest)) = singles.iter().min_by(|a, b| a.1.total_cmp(&b.1)) else {
        assert!(
            any.is_err(),
            "{model} × {gpus} {gpu}: any found a plan no framework did"
        );
        return;
    };
    let any = any.unwrap_or_else(|e| panic!("{model} × {gpus} {gpu}: {e}"));
    let t = any.result.best.result.predicted.iteration_time_s;
    assert!(
        t <= fastest * (1.0 + 1e-9),
        "{model} × {gpus} {gpu}: any {t} s, frameworks {singles:?}"
    );
    assert!(
        !any.answers[0].runs_on.is_empty(),
        "{model} × {gpus} {gpu}: no framework runs the default's plan"
    );
    assert_eq!(any.answers.len(), 1 + any.result.alternatives.len());
    assert!(any.answers.iter().all(|a| !a.runs_on.is_empty()));
}

/// A trimmed grid in the debug build (the full one is `full_grid_any_is_never_slower`).
#[test]
fn any_is_never_slower_than_a_framework() {
    for (model, gpus) in [("llama3-8b", 8), ("llama3-8b", 32), ("llama3-70b", 32)] {
        for gpu in KINDS {
            check_point(model, gpu, gpus);
        }
    }
}

#[test]
#[ignore = "the full grid: minutes in a debug build; run with --release (.ci/run)"]
fn full_grid_any_is_never_slower() {
    for model in PRESETS {
        for gpus in GPUS {
            for gpu in KINDS {
                check_point(model, gpu, gpus);
            }
        }
    }
}

/// The case: `plan llama3-70b --gpus 128 --global-batch 512` on H100 is at least as
/// fast as each framework's search and as `--fix cp=2`, and says which frameworks run it.
#[test]
#[ignore = "three 128-GPU searches: slow in a debug build; run with --release (.ci/run)"]
fn llama3_70b_on_128_h100_beats_every_framework_and_cp2() {
    let (m, p) = setup("llama3-70b", "h100-sxm", 128);
    let opts = options(&m, Some(512));
    let any = search::plans(&m, &p, &opts, true, &|_, _| {}).expect("a plan");
    let t = any.result.best.result.predicted.iteration_time_s;
    let mut others: Vec<(String, f64)> = Framework::RUNNABLE
        .into_iter()
        .filter_map(|fw| Some((fw.to_string(), framework_best(&m, &p, &opts, fw)?)))
        .collect();
    let mut cp2 = opts.clone();
    cp2.fixed.degrees.cp = Some(2);
    let pinned = search::plans(&m, &p, &cp2, true, &|_, _| {}).expect("a cp 2 plan");
    others.push((
        "--fix cp=2".into(),
        pinned.result.best.result.predicted.iteration_time_s,
    ));
    for (what, other) in &others {
        assert!(t <= other * (1.0 + 1e-9), "any {t} s, {what} {other} s");
    }
    assert!(!any.answers[0].runs_on.is_empty());
}

/// The pruned default search finds the exhaustive search's best (every key scored, simulated
/// with every split the search tries and refined, in every framework's space) on medium cases:
/// the same plan, or one at least as fast.
#[test]
fn any_equals_the_exhaustive_search_on_medium_cases() {
    for (model, gpu, gpus, gb) in [
        ("llama3-8b", "a100-80g", 8, 64),
        ("llama3-8b", "h100-sxm", 16, 128),
    ] {
        let (m, p) = setup(model, gpu, gpus);
        let mut opts = options(&m, Some(gb));
        opts.limits.max_micro_batch_size = 2;
        opts.limits.max_virtual_stages = 2;
        let any = search::plans(&m, &p, &opts, true, &|_, _| {}).expect("a plan");
        // the fastest plan each found: the one shown may be a simpler one within the
        // tolerance, chosen by shape, then memory headroom (which differs between stacks)
        let fastest =
            |r: &search::SearchResult| r.passed_over.clone().unwrap_or_else(|| r.best.clone());
        let any_fastest = fastest(&any.result);
        let t = any_fastest.result.predicted.iteration_time_s;
        let mut exhaustive = opts.clone();
        exhaustive.exhaustive = true;
        let reference: (f64, String) = Framework::RUNNABLE
            .into_iter()
            .filter_map(|fw| {
                let o = framework_options(&m, &exhaustive, fw)?;
                let r = search::search(&m, &p, &o, &|_, _| {}).ok()?;
                let f = fastest(&r);
                Some((f.result.predicted.iteration_time_s, describe(&f)))
            })
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .expect("the exhaustive search finds a plan");
        eprintln!(
            "{model} × {gpus} {gpu}: any {t} s, exhaustive {} s",
            reference.0
        );
        // the reference hill-climbs splits with more than a few hundred choices, as the search
        // does, from other starting points: the search must miss nothing it finds
        assert!(
            t <= reference.0 * (1.0 + 1e-9),
            "{model} × {gpus} {gpu}: any {t} s ({}), exhaustive {reference:?}",
            describe(&any_fastest)
        );
    }
}
