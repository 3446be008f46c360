//! GEMM crates on tiny-gpt's shapes, one thread each: `faer` (what the device layer uses),
//! `gemm` and `matrixmultiply`. Run with
//! `cargo bench -p autopp-profiler --features gemm-bench --bench gemm`; `docs/executor.md`
//! has the table (`scripts/executor-docs.sh` regenerates it).
//!
//! Shapes are tiny-gpt's (h = 128, f = 512, V = 1024, 4 heads of 32) for a micro-batch of 2
//! sequences of 128 tokens (T = 256 rows): `C[m × n] = op(A)[m × k] · op(B)[k × n]`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

/// (name, m, k, n, A transposed, B transposed).
const SHAPES: [(&str, usize, usize, usize, bool, bool); 7] = [
    ("qkv fwd T×h·h×3h", 256, 128, 384, false, false),
    ("fc1 fwd T×h·h×f", 256, 128, 512, false, false),
    ("fc2 fwd T×f·f×h", 256, 512, 128, false, false),
    ("lm-head fwd T×h·h×V", 256, 128, 1024, false, false),
    ("qkv dW hᵀ×T·T×3h", 128, 256, 384, true, false),
    ("qkv dX T×3h·(h×3h)ᵀ", 256, 384, 128, false, true),
    ("scores s×d·(s×d)ᵀ", 128, 32, 128, false, true),
];

fn fill(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect()
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("gemm");
    group.sample_size(20);
    group.warm_up_time(std::time::Duration::from_millis(300));
    group.measurement_time(std::time::Duration::from_secs(1));
    for (name, m, k, n, ta, tb) in SHAPES {
        let a = fill(m * k);
        let b = fill(k * n);
        let mut out = vec![0f32; m * n];
        // Strides of op(A) (m × k) and op(B) (k × n) over row-major storage.
        let (rsa, csa) = if ta {
            (1isize, m as isize)
        } else {
            (k as isize, 1)
        };
        let (rsb, csb) = if tb {
            (1isize, k as isize)
        } else {
            (n as isize, 1)
        };
        group.throughput(Throughput::Elements((2 * m * n * k) as u64));
        group.bench_function(BenchmarkId::new("faer", name), |bench| {
            bench.iter(|| {
                let av = faer::MatRef::from_row_major_slice(
                    &a,
                    if ta { k } else { m },
                    if ta { m } else { k },
                );
                let bv = faer::MatRef::from_row_major_slice(
                    &b,
                    if tb { n } else { k },
                    if tb { k } else { n },
                );
                let av = if ta { av.transpose() } else { av };
                let bv = if tb { bv.transpose() } else { bv };
                let cv = faer::MatMut::from_row_major_slice_mut(&mut out, m, n);
                faer::linalg::matmul::matmul(
                    cv,
                    faer::Accum::Replace,
                    av,
                    bv,
                    1.0f32,
                    faer::Par::Seq,
                );
            })
        });
        group.bench_function(BenchmarkId::new("gemm", name), |bench| {
            // SAFETY: the pointers and strides describe the live buffers `a`, `b` and `out`.
            bench.iter(|| unsafe {
                gemm::gemm(
                    m,
                    n,
                    k,
                    out.as_mut_ptr(),
                    1,
                    n as isize,
                    false,
                    a.as_ptr(),
                    csa,
                    rsa,
                    b.as_ptr(),
                    csb,
                    rsb,
                    0.0f32,
                    1.0f32,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                )
            })
        });
        group.bench_function(BenchmarkId::new("matrixmultiply", name), |bench| {
            // SAFETY: as above.
            bench.iter(|| unsafe {
                matrixmultiply::sgemm(
                    m,
                    k,
                    n,
                    1.0,
                    a.as_ptr(),
                    rsa,
                    csa,
                    b.as_ptr(),
                    rsb,
                    csb,
                    0.0,
                    out.as_mut_ptr(),
                    n as isize,
                    1,
                )
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
