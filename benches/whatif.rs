//! `autopp whatif`'s acceptance sweep: llama3-70b at 5 GPU counts × 5 GPU kinds × 2 NICs (50
//! points, each a full planner search) — `cargo bench --bench whatif`.

use autopp_hardware::{hardware, Cluster, Precision};
use autopp_models::load;
use autopp_planner::runtime::Stack;
use autopp_planner::whatif::{self, BatchPolicy, Point, Prices, Sweep};
use criterion::{criterion_group, criterion_main, Criterion};

/// The binary's allocator (see `src/main.rs`), so the bench measures what `autopp whatif` runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The GPU kinds and NICs (Gbit/s per GPU) of the 50-point sweep.
pub const KINDS: [&str; 5] = ["a100-40g", "a100-80g", "h100-sxm", "h200", "b200"];
const NICS: [f64; 2] = [200.0, 400.0];
const COUNTS: [u64; 5] = [64, 128, 256, 512, 1024];

fn fifty_points() -> Vec<Point> {
    let mut points = Vec::new();
    for kind in KINDS {
        let gpu = hardware::gpu(kind).expect("catalog kind");
        for nic in NICS {
            for n in COUNTS {
                let cluster = Cluster::new(gpu.clone(), n, 8, Some(nic)).expect("cluster");
                points.push(Point {
                    template: cluster,
                    gpus: n,
                });
            }
        }
    }
    points
}

fn bench(c: &mut Criterion) {
    let model = load("llama3-70b").expect("preset");
    let points = fifty_points();
    let sweep = Sweep {
        framework: Stack::Any,
        precision: Precision::Bf16,
        batch: BatchPolicy::Fixed { sequences: 512 },
        train_tokens: Some(15e12),
        prices: Prices::example(),
        calibration: None,
    };
    let mut group = c.benchmark_group("whatif");
    group.sample_size(10);
    group.bench_function("llama3-70b 50 points", |b| {
        b.iter(|| whatif::sweep(&model, &points, &sweep, &|_, _| {}).expect("sweep"))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
