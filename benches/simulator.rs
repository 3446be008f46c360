//! Simulator speed: the planner calls `simulate` thousands of times per search, so one run of
//! interleaved 1F1B with p = 64, v = 4, m = 1024 (524,288 actions) must take under 20 ms.
//!
//! Run with `cargo bench --bench simulator`.

use autopp_schedule::{
    check, generate, simulate, simulate_metrics, ScheduleKind, ScheduleSpec, SimCosts,
};
use criterion::{black_box, criterion_group, criterion_main, Criterion};

fn bench_simulator(c: &mut Criterion) {
    let spec = ScheduleSpec::new(ScheduleKind::Interleaved1F1B, 64, 1024).with_virtual_stages(4);
    let s = generate(&spec).expect("a supported schedule");
    let costs = SimCosts::uniform(s.num_stages(), 1.0, 2.0, 1.0, 1.0, 0.1);
    let mut group = c.benchmark_group("interleaved-1f1b p=64 v=4 m=1024");
    group.sample_size(20);
    group.bench_function("simulate", |b| {
        b.iter(|| simulate(black_box(&s), black_box(&costs)).expect("simulates"))
    });
    group.bench_function("simulate_metrics", |b| {
        b.iter(|| simulate_metrics(black_box(&s), black_box(&costs)).expect("simulates"))
    });
    group.bench_function("check", |b| b.iter(|| check(black_box(&s)).expect("valid")));
    group.bench_function("generate", |b| {
        b.iter(|| generate(black_box(&spec)).expect("generates"))
    });
    group.finish();
}

criterion_group!(benches, bench_simulator);
criterion_main!(benches);
