//! Search time of `autopp plan` on the reference problems (`cargo bench --bench planner`).

use autopp_hardware::{hardware, AnalyticProfile, Cluster, Precision};
use autopp_models::load;
use autopp_planner::search::{plans, search, SearchOptions};
use autopp_planner::Framework;
use criterion::{criterion_group, criterion_main, Criterion};

/// The binary's allocator (see `src/main.rs`), so the bench measures what `autopp plan` runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn case(c: &mut Criterion, name: &str, model: &str, gpu: &str, gpus: u64, batch: Option<u64>) {
    let model = load(model).expect("preset");
    let cluster = Cluster::new(hardware::gpu(gpu).expect("gpu"), gpus, 8, None).expect("cluster");
    let profile = AnalyticProfile::new(cluster, Precision::Bf16).expect("profile");
    let global_batch = batch.or(model.default_global_batch()).expect("batch");
    let opts = SearchOptions::new(Framework::Any, global_batch, 8);
    // `autopp plan`'s default (`--framework any`): every framework's search, ranked together
    c.bench_function(name, |b| {
        b.iter(|| plans(&model, &profile, &opts, true, &|_, _| {}).expect("a plan"))
    });
    if name.starts_with("plan gpt3-175b") {
        // `--framework any-mix`: one search over everything autopp models
        c.bench_function(&format!("{name} any-mix"), |b| {
            b.iter(|| search(&model, &profile, &opts, &|_, _| {}).expect("a plan"))
        });
    }
}

fn planner(c: &mut Criterion) {
    case(
        c,
        "plan gpt3-175b 1024 a100-80g",
        "gpt3-175b",
        "a100-80g",
        1024,
        Some(1536),
    );
    case(
        c,
        "plan mt-nlg-530b 2240 a100-80g",
        "mt-nlg-530b",
        "a100-80g",
        2240,
        Some(2240),
    );
    case(
        c,
        "plan llama3-405b 16384 h100-sxm",
        "llama3-405b",
        "h100-sxm",
        16384,
        Some(2048),
    );
    // the 32-GPU presets that fit (the others exit at the memory floor)
    for model in ["llama2-70b", "llama3-8b", "llama3-70b"] {
        case(
            c,
            &format!("plan {model} 32 h100-sxm"),
            model,
            "h100-sxm",
            32,
            None,
        );
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = planner
}
criterion_main!(benches);
