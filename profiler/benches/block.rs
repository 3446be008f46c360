//! A tiny-gpt block's forward and backward against the machine's single-thread fp32 GEMM rate.
//! Run with `cargo bench -p autopp-profiler --bench block`; `scripts/executor-docs.sh` puts the
//! figures in `docs/executor.md`.
//!
//! - `gemm-rate/faer 1024³`: one `1024 × 1024 · 1024 × 1024` fp32 product through faer on one
//!   thread — the machine's single-thread fp32 GEMM rate (large enough that packing and edges
//!   cost nothing).
//! - `block/fwd+bwd`: one block of tiny-gpt (h = 128, 4 heads, f = 512) on a micro-batch of 2
//!   sequences of 128 tokens: forward, backward-input and backward-weight, one thread, the
//!   buffers reused from the second iteration on as in a training step. Its throughput is
//!   counted in the block's GEMM FLOPs ([`block_gemm_flops`]: `2·m·n·k` of every product it
//!   runs), so the two rates compare directly; the issue asks for at least half.
//! - `block/forward`, `block/backward-input`, `block/backward-weight`: the passes alone, same
//!   count of their own products.

use autopp_profiler::device::{Block, Rng, Tensor};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

const H: usize = 128;
const HEADS: usize = 4;
const F: usize = 512;
const SEQ: usize = 128;
const SEQS: usize = 2;

/// GEMM FLOPs of one block on `SEQS` sequences: forward, backward-input, backward-weight.
/// The linear layers' products (`x·W`, `dy·Wᵀ`, `xᵀ·dy`: `2·T·in·out` each) and the attention
/// core's per-head products as they run (`Q·Kᵀ`, `P·V` forward; `dO·Vᵀ`, `Pᵀ·dO`, `dS·K`,
/// `dSᵀ·Q` backward: `2·s·s·d` each, the full `s × s`, masked half included).
fn block_gemm_flops() -> [u64; 3] {
    let t = (SEQS * SEQ) as u64;
    let (h, f) = (H as u64, F as u64);
    let linear = 2 * t * (h * 3 * h + h * h + h * f + f * h);
    let d = h / HEADS as u64;
    let core = 2 * (SEQ * SEQ) as u64 * d * (SEQS * HEADS) as u64;
    [linear + 2 * core, linear + 4 * core, linear]
}

fn random(rng: &mut Rng, rows: usize, cols: usize) -> Tensor {
    let v = (0..rows * cols).map(|_| rng.normal() as f32).collect();
    Tensor::from_vec(rows, cols, v)
}

fn gemm_rate(c: &mut Criterion) {
    let mut group = c.benchmark_group("gemm-rate");
    group.sample_size(10);
    group.warm_up_time(std::time::Duration::from_millis(500));
    group.measurement_time(std::time::Duration::from_secs(3));
    let n = 1024;
    let mut rng = Rng::new(1);
    let a = random(&mut rng, n, n);
    let b = random(&mut rng, n, n);
    let mut out = Tensor::zeros(n, n);
    group.throughput(Throughput::Elements(2 * (n * n * n) as u64));
    group.bench_function("faer 1024³", |bench| {
        bench.iter(|| autopp_profiler::device::matmul_into(&mut out, &a, false, &b, false, false))
    });
    group.finish();
}

fn block(c: &mut Criterion) {
    let mut group = c.benchmark_group("block");
    group.sample_size(20);
    group.warm_up_time(std::time::Duration::from_millis(500));
    group.measurement_time(std::time::Duration::from_secs(3));
    let mut rng = Rng::new(2);
    let block = Block::init(&mut rng, H, HEADS, F, 8, true, true);
    let x = random(&mut rng, SEQS * SEQ, H);
    let dy = random(&mut rng, SEQS * SEQ, H);
    let mut grads = block.zeros_like();
    let [fwd, bwd_in, bwd_w] = block_gemm_flops();
    let rows = SEQS * SEQ;
    group.throughput(Throughput::Elements(fwd + bwd_in + bwd_w));
    group.bench_function("fwd+bwd", |bench| {
        bench.iter(|| {
            let (y, saved) = block.forward(&x, SEQS);
            let (dx, ws) = block.backward_input(saved, dy.clone());
            block.backward_weight(&ws, &mut grads, 0..rows);
            (y, dx)
        })
    });
    group.throughput(Throughput::Elements(fwd));
    group.bench_function("forward", |bench| bench.iter(|| block.forward(&x, SEQS)));
    group.throughput(Throughput::Elements(bwd_in));
    group.bench_function("backward-input", |bench| {
        bench.iter_batched(
            || block.forward(&x, SEQS).1,
            |saved| block.backward_input(saved, dy.clone()),
            criterion::BatchSize::SmallInput,
        )
    });
    let (_, saved) = block.forward(&x, SEQS);
    let (_, ws) = block.backward_input(saved, dy.clone());
    group.throughput(Throughput::Elements(bwd_w));
    group.bench_function("backward-weight", |bench| {
        bench.iter(|| block.backward_weight(&ws, &mut grads, 0..rows))
    });
    group.finish();
}

criterion_group!(benches, gemm_rate, block);
criterion_main!(benches);
