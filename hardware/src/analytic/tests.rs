//! Hand-worked tests of the analytic profile.
use super::*;
use crate::hardware;

fn profile() -> AnalyticProfile {
    let c = Cluster::new(hardware::gpu("a100-80g").unwrap(), 16, 8, None).unwrap();
    AnalyticProfile::new(c, Precision::Bf16).unwrap()
}

#[test]
fn ring_all_reduce_hand_worked() {
    // 1 GB over 8 GPUs inside a node: 2·7/8·1e9 / (300e9·comm_intra) + 2·7·6µs
    let p = profile();
    let link = p.cluster.group_link(8, 1);
    let t = p.collective_time_s(CollectiveKind::AllReduce, 1_000_000_000, 8, &link);
    let expect = 2.0 * 7.0 / 8.0 * 1e9 / (300e9 * p.efficiency.comm_intra) + 14.0 * 6e-6;
    assert!((t - expect).abs() < 1e-12, "{t} vs {expect}");
    let ag = p.collective_time_s(CollectiveKind::AllGather, 1_000_000_000, 8, &link);
    assert!((2.0 * ag - t).abs() < 1e-12);
    assert_eq!(
        p.collective_time_s(CollectiveKind::AllReduce, 10, 1, &link),
        0.0
    );
}

#[test]
fn gemm_efficiency_grows_with_shape() {
    let e = Efficiency::default();
    assert!(e.gemm(8192, 8192, 8192) > e.gemm(8192, 1536, 8192));
    assert!(e.gemm(8192, 8192, 8192) < e.gemm_max);
    assert!(e.gemm(8192, 8192, 8192) > 0.95 * e.gemm_max * 0.98);
}

#[test]
fn misaligned_gemms_are_slower() {
    let e = Efficiency::default();
    // a head size of 225 (BLOOM's 14400/64) is not a multiple of 8 elements
    let ratio = e.gemm(2048, 2048, 225) / e.gemm(2048, 2048, 224);
    let expect = e.gemm_misaligned * (225.0 / (225.0 + e.gemm_half_dim))
        / (224.0 / (224.0 + e.gemm_half_dim));
    assert!((ratio - expect).abs() < 1e-12, "{ratio} vs {expect}");
    // 4,100 rows (a sequence of 4,100 tokens) are no stride: only the size term changes
    let rows = e.gemm(4100, 4096, 4096) / e.gemm(4096, 4096, 4096);
    let expect = (4100.0 / (4100.0 + e.gemm_half_dim)) / (4096.0 / (4096.0 + e.gemm_half_dim));
    assert!((rows - expect).abs() < 1e-12, "{rows} vs {expect}");
    assert!(e.gemm(4096, 4100, 4096) < 0.2 * e.gemm(4096, 4096, 4096));
}

/// Hand-worked grouped GEMM: 16 experts of `[2048 × 2048]·[2048 × 1536]` (compute-bound
/// on an H100 in bf16): with the half size 1024 the factor is min(1536, 2048) / (1536 +
/// 1024) = 0.6, so the time over the kernel overhead is 1/0.6 of the same grouped op with
/// no penalty (half size 0); a single GEMM (`count` 1) and a non-linear op get none.
#[test]
fn grouped_gemm_hand_worked() {
    let c = Cluster::new(hardware::gpu("h100-sxm").unwrap(), 8, 8, None).unwrap();
    let mut p = AnalyticProfile::new(c, Precision::Bf16).unwrap();
    let op = |count, linear| Op::Gemm {
        m: 2048,
        n: 1536,
        k: 2048,
        count,
        linear,
    };
    let ko = p.efficiency.kernel_overhead_s;
    p.efficiency.grouped_gemm_half_dim = 0.0;
    let free = p.op_time_s(&op(16, true)) - ko;
    let single = p.op_time_s(&op(1, true));
    let core = p.op_time_s(&op(16, false));
    p.efficiency.grouped_gemm_half_dim = 1024.0;
    let grouped = p.op_time_s(&op(16, true)) - ko;
    assert!(
        (grouped / free - 1.0 / 0.6).abs() < 1e-9,
        "{}",
        grouped / free
    );
    assert_eq!(p.op_time_s(&op(1, true)), single);
    assert_eq!(p.op_time_s(&op(16, false)), core);
}

/// Hand-worked rows per expert: 16 experts of `[1024 × 2048]·[2048 × 1536]` on an H100 in
/// bf16 (compute-bound: 103 GFLOP against 218 MB). With the half size 1024 and half rows 768
/// the factors are 1536 / (1536 + 1024) = 0.6 and 1024 / (1024 + 768) = 4/7, so the time
/// over the kernel overhead is 1.75 times the same op's with half rows 0 and 1 / (0.6 · 4/7)
/// = 2.9167 times the unpenalized one's; 8192 rows per expert lose only 768/8192 = 9.4% to
/// the rows factor. A single GEMM (`count` 1) gets neither factor.
#[test]
fn grouped_gemm_rows_per_expert_hand_worked() {
    let c = Cluster::new(hardware::gpu("h100-sxm").unwrap(), 8, 8, None).unwrap();
    let mut p = AnalyticProfile::new(c, Precision::Bf16).unwrap();
    let op = |m, count| Op::Gemm {
        m,
        n: 1536,
        k: 2048,
        count,
        linear: true,
    };
    let ko = p.efficiency.kernel_overhead_s;
    p.efficiency.grouped_gemm_half_dim = 0.0;
    p.efficiency.grouped_gemm_half_rows = 0.0;
    let free = p.op_time_s(&op(1024, 16)) - ko;
    let free_long = p.op_time_s(&op(8192, 16)) - ko;
    let single = p.op_time_s(&op(1024, 1));
    p.efficiency.grouped_gemm_half_dim = 1024.0;
    let dims_only = p.op_time_s(&op(1024, 16)) - ko;
    p.efficiency.grouped_gemm_half_rows = 768.0;
    let both = p.op_time_s(&op(1024, 16)) - ko;
    assert!(
        (both / dims_only - 1.75).abs() < 1e-9,
        "{}",
        both / dims_only
    );
    assert!(
        (both / free - 1.0 / (0.6 * 4.0 / 7.0)).abs() < 1e-9,
        "{}",
        both / free
    );
    let long = p.op_time_s(&op(8192, 16)) - ko;
    let want = (8192.0 + 768.0) / 8192.0 / 0.6;
    assert!(
        (long / free_long - want).abs() < 1e-9,
        "{} vs {want}",
        long / free_long
    );
    assert_eq!(p.op_time_s(&op(1024, 1)), single);
}

/// Hand-worked all-to-all: 64 MB from each of 8 GPUs of one H100 node (NVLink 450 GB/s,
/// `comm_intra` 0.8242): 7/8 · 64e6 / (450e9 · 0.8242) = 151.0 µs + 6 µs. The same over 32
/// GPUs of 4 nodes (NIC 400 Gbit/s = 50 GB/s, `comm_inter` 0.8130): 24/32 · 64e6 / (50e9 ·
/// 0.8130) = 1180.8 µs beside 7/32 · 64e6 / 370.9e9 = 37.7 µs on NVLink, + 12 µs.
#[test]
fn all_to_all_hand_worked() {
    let h100 = hardware::gpu("h100-sxm").unwrap();
    let node = AnalyticProfile::new(
        Cluster::new(h100.clone(), 8, 8, None).unwrap(),
        Precision::Bf16,
    )
    .unwrap();
    let link = node.cluster.group_link(8, 1);
    let t = node.all_to_all_time_s(64_000_000, 8, &link);
    let want = 7.0 / 8.0 * 64e6 / (450e9 * node.efficiency.comm_intra) + 6e-6;
    assert!((t - want).abs() < 1e-12, "{t} vs {want}");
    assert!((t - 157.0e-6).abs() < 0.1e-6, "{t}");
    let four =
        AnalyticProfile::new(Cluster::new(h100, 32, 8, None).unwrap(), Precision::Bf16).unwrap();
    let link = four.cluster.group_link(32, 1);
    assert!(link.inter_node);
    let t = four.all_to_all_time_s(64_000_000, 32, &link);
    let want = 24.0 / 32.0 * 64e6 / (50e9 * four.efficiency.comm_inter) + 12e-6;
    assert!((t - want).abs() < 1e-12, "{t} vs {want}");
    assert!((t - 1192.8e-6).abs() < 0.1e-6, "{t}");
    assert_eq!(four.all_to_all_time_s(64_000_000, 1, &link), 0.0);
}

/// Hand-worked deduplicated all-to-all: the 32 GPUs of 4 H100 nodes above with 45% of the
/// cross-node volume left (a token sent once per node): 0.45 · 24/32 · 64e6 / (50e9 ·
/// 0.8130) = 531.4 µs; NVLink forwards every pair not kept, 31/32 · 64e6 / 370.9e9 = 167.2 µs,
/// hidden beside it; + 12 µs. A share of 1 is the plain all-to-all.
#[test]
fn dedup_all_to_all_hand_worked() {
    let h100 = hardware::gpu("h100-sxm").unwrap();
    let four =
        AnalyticProfile::new(Cluster::new(h100, 32, 8, None).unwrap(), Precision::Bf16).unwrap();
    let link = four.cluster.group_link(32, 1);
    let t = four.all_to_all_dedup_time_s(64_000_000, 32, &link, 0.45);
    let want = 0.45 * 24.0 / 32.0 * 64e6 / (50e9 * four.efficiency.comm_inter) + 12e-6;
    assert!((t - want).abs() < 1e-12, "{t} vs {want}");
    assert!((t - 543.4e-6).abs() < 0.5e-6, "{t}");
    let plain = four.all_to_all_time_s(64_000_000, 32, &link);
    assert_eq!(
        four.all_to_all_dedup_time_s(64_000_000, 32, &link, 1.0),
        plain
    );
}

/// Hand-worked: 3 s of communication beside 10 s of compute with comm_overlap 0.8 leaves
/// 0.2·3 = 0.6 s; 10 s beside 4 s leaves 6 + 0.2·4 = 6.8 s.
#[test]
fn exposed_communication_hand_worked() {
    let e = Efficiency {
        comm_overlap: 0.8,
        ..Efficiency::default()
    };
    assert!((e.exposed_comm_s(3.0, 10.0) - 0.6).abs() < 1e-12);
    assert!((e.exposed_comm_s(10.0, 4.0) - 6.8).abs() < 1e-12);
    assert_eq!(e.exposed_comm_s(2.0, 0.0), 2.0);
}

#[test]
fn hopper_factor_only_on_fp8_gpus() {
    let mut a100 = profile();
    a100.efficiency.hopper_compute = 0.5;
    assert_eq!(a100.generation_factor(), 1.0);
    let c = Cluster::new(hardware::gpu("h100-sxm").unwrap(), 8, 8, None).unwrap();
    let mut h100 = AnalyticProfile::new(c, Precision::Bf16).unwrap();
    h100.efficiency.hopper_compute = 0.5;
    assert_eq!(h100.generation_factor(), 0.5);
    let op = Op::Gemm {
        m: 8192,
        n: 8192,
        k: 8192,
        count: 1,
        linear: true,
    };
    let slow = h100.op_time_s(&op);
    h100.efficiency.hopper_compute = 1.0;
    assert!(slow > 1.9 * h100.op_time_s(&op));
}

#[test]
fn large_gemm_is_compute_bound_hand_worked() {
    let p = profile();
    let (m, n, k) = (8192u64, 12288u64, 12288u64);
    let t = p.op_time_s(&Op::Gemm {
        m,
        n,
        k,
        count: 1,
        linear: true,
    });
    let flops = 2.0 * (m * n * k) as f64;
    let expect = flops / (312e12 * p.efficiency.gemm(m, n, k)) + p.efficiency.kernel_overhead_s;
    assert!((t - expect).abs() / expect < 1e-12);
}

/// Hand-worked FP8 linear GEMM on an H100 (1,979 TFLOP/s dense FP8, 3.35 TB/s):
/// `[8192 × 8192]·[8192 × 28672]` is 2·8192·8192·28672 = 3.848e15 FLOP at
/// 1,979e12 · gemm(·) · fp8_gemm · hopper_compute; the delayed-scaling cast reads 2 and writes 1 byte of
/// each of the 8192·8192 input elements: 201 MB at 0.95 · 3.35 TB/s = 63.2 µs; two kernels.
/// The LM head's GEMM (not a linear layer's) keeps the bf16 peak.
#[test]
fn fp8_linear_gemm_hand_worked() {
    let c = Cluster::new(hardware::gpu("h100-sxm").unwrap(), 8, 8, None).unwrap();
    let p = AnalyticProfile::new(c.clone(), Precision::Fp8Delayed).unwrap();
    assert_eq!((p.peak_flops, p.linear_peak_flops), (989e12, 1979e12));
    let (m, n, k) = (8192u64, 28672u64, 8192u64);
    let op = |linear| Op::Gemm {
        m,
        n,
        k,
        count: 1,
        linear,
    };
    let eff = p.efficiency;
    let flops = 2.0 * (m * n * k) as f64;
    let cast = 3.0 * (m * k) as f64 / (3.35e12 * eff.hbm);
    assert!((cast - 63.25e-6).abs() < 0.1e-6, "{cast}");
    let rate = 1979e12 * eff.gemm(m, n, k) * eff.fp8_gemm * eff.hopper_compute;
    let expect = flops / rate + cast + 2.0 * eff.kernel_overhead_s;
    assert!((p.op_time_s(&op(true)) - expect).abs() / expect < 1e-12);
    let bf16 = AnalyticProfile::new(c, Precision::Bf16).unwrap();
    assert_eq!(p.op_time_s(&op(false)), bf16.op_time_s(&op(false)));
    // current scaling reads the operand once more for its amax: 5 bytes per element
    let mut tw = p.clone();
    tw.precision = Precision::Fp8Tensorwise;
    let extra = 2.0 * (m * k) as f64 / (3.35e12 * eff.hbm);
    assert!((tw.op_time_s(&op(true)) - p.op_time_s(&op(true)) - extra).abs() < 1e-12);
}

/// Hand-worked rowwise FP8 (`FP8_ROWWISE_HALF_DIM` 1024, its source torchao's float8 README
/// and pytorch/pytorch#147971): the weight gradient of a Llama 3 8B `w2` sharded 8 ways,
/// `Xᵀ·dY` = `[1792 × 98304]·[98304 × 4096]` (k the 98,304 tokens of 12 sequences of 8192),
/// on an H100. `min(n, k)` = 4096: the GEMM runs at 4096 / 5120 = 0.8 of tensorwise's
/// efficiency, and both operands are cast (`dY` scaled per column cannot reuse the per-row
/// copy): 5 bytes of HBM traffic per element of 1792·98304 + 98304·4096 = 578,813,952
/// elements, 2.894 GB at 0.95 · 3.35 TB/s = 0.9094 ms, against tensorwise's 1792·98304
/// (0.2768 ms). A narrow shard, `min(n, k)` = 512 (the `wo` forward, `k` 512), runs at
/// 512 / 1536 = 1/3.
#[test]
fn fp8_rowwise_gemm_hand_worked() {
    let c = Cluster::new(hardware::gpu("h100-sxm").unwrap(), 8, 8, None).unwrap();
    let rw = AnalyticProfile::new(c.clone(), Precision::Fp8Rowwise).unwrap();
    let tw = AnalyticProfile::new(c, Precision::Fp8Tensorwise).unwrap();
    assert_eq!(rw.efficiency.fp8_rowwise_half_dim, 1024.0);
    let (m, n, k) = (1792u64, 4096u64, 98_304u64);
    assert!((rw.rowwise_factor(n, k) - 0.8).abs() < 1e-12);
    assert_eq!(tw.rowwise_factor(n, k), 1.0);
    assert!((rw.rowwise_factor(4096, 512) - 1.0 / 3.0).abs() < 1e-12);
    assert_eq!(Precision::Fp8Rowwise.cast_elements(m, n, k), 578_813_952);
    assert_eq!(Precision::Fp8Tensorwise.cast_elements(m, n, k), m * k);
    assert_eq!(Precision::Bf16.cast_elements(m, n, k), 0);
    let op = Op::Gemm {
        m,
        n,
        k,
        count: 1,
        linear: true,
    };
    let eff = rw.efficiency;
    let hbm = 3.35e12 * eff.hbm;
    let cast_rw = 5.0 * 578_813_952.0 / hbm;
    assert!((cast_rw - 0.9094e-3).abs() < 0.1e-6, "{cast_rw}");
    let cast_tw = 5.0 * (m * k) as f64 / hbm;
    assert!((cast_tw - 0.2768e-3).abs() < 0.1e-6, "{cast_tw}");
    let rate = 1979e12 * eff.gemm(m, n, k) * eff.fp8_gemm * eff.hopper_compute;
    let compute = 2.0 * (m * n * k) as f64 / rate;
    let bytes = ((m * k + k * n) as f64 + 2.0 * (m * n) as f64) / hbm;
    let launch = 2.0 * eff.kernel_overhead_s;
    let want_rw = (compute / 0.8).max(bytes) + cast_rw + launch;
    let want_tw = compute.max(bytes) + cast_tw + launch;
    assert!((rw.op_time_s(&op) - want_rw).abs() / want_rw < 1e-12);
    assert!((tw.op_time_s(&op) - want_tw).abs() / want_tw < 1e-12);
}

#[test]
fn fp8_needs_fp8_tensor_cores_and_mxfp8_blackwell() {
    let a100 = Cluster::new(hardware::gpu("a100-80g").unwrap(), 8, 8, None).unwrap();
    let err = AnalyticProfile::new(a100, Precision::Fp8Delayed).unwrap_err();
    assert!(err.to_string().contains("no FP8 tensor cores"), "{err}");
    let h100 = Cluster::new(hardware::gpu("h100-sxm").unwrap(), 8, 8, None).unwrap();
    let err = AnalyticProfile::new(h100, Precision::Mxfp8).unwrap_err();
    assert!(err.to_string().contains("use --precision fp8"), "{err}");
    let b200 = Cluster::new(hardware::gpu("b200").unwrap(), 8, 8, None).unwrap();
    let p = AnalyticProfile::new(b200, Precision::Mxfp8).unwrap();
    assert_eq!((p.peak_flops, p.linear_peak_flops), (2250e12, 4500e12));
}

#[test]
fn skinny_gemm_is_memory_bound() {
    let p = profile();
    // 8 rows (aligned): the 12288 × 12288 weight's 302 MB dominate, far above the GEMM's FLOPs
    let (m, n, k) = (8u64, 12288u64, 12288u64);
    let t = p.op_time_s(&Op::Gemm {
        m,
        n,
        k,
        count: 1,
        linear: true,
    });
    let bytes = 2.0 * (m * k + k * n + m * n) as f64;
    let eff = p.efficiency;
    let expect = bytes / (2039e9 * eff.hbm) + eff.kernel_overhead_s;
    assert!((t - expect).abs() / expect < 1e-12);
}

/// Hand-worked FlashAttention-2 on Hopper (`ATTENTION_FA2_ON_HOPPER`, from the
/// FlashAttention-3 paper's 35% utilization of FA2 on H100 against 75% for FA3, and its
/// "1.5-2.0×" speedup): the causal forward of 32 heads of 128 over 8192 × 8192 is
/// `0.5 · 4 · 32 · 8192² · 128` = 5.50e11 FLOPs; on an H100 SXM (989 TFLOP/s) a native
/// kernel takes `work / (989e12 · attention_fused · hopper_compute · sat)` and FA2 twice that, over the
/// kernel overhead; on an A100 FA2 is the native kernel and takes the same time.
#[test]
fn flash_attention_2_on_hopper_runs_at_half_the_native_rate() {
    let attn = |kernel| Op::Attention {
        batch_heads: 32,
        seq_q: 8192,
        seq_k: 8192,
        head_dim: 128,
        causal: true,
        backward: false,
        fused: true,
        kernel,
    };
    let h100 = Cluster::new(hardware::gpu("h100-sxm").unwrap(), 8, 8, None).unwrap();
    let p = AnalyticProfile::new(h100, Precision::Bf16).unwrap();
    let e = p.efficiency;
    let work = 0.5 * 4.0 * 32.0 * 8192.0 * 8192.0 * 128.0;
    let sat = 8192.0 / (8192.0 + 2.0 * e.gemm_half_dim);
    let native = work / (989e12 * e.attention_fused * e.hopper_compute * sat);
    let t = p.op_time_s(&attn(AttentionKernel::Native)) - e.kernel_overhead_s;
    assert!((t - native).abs() < 1e-12, "{t} vs {native}");
    let fa2 = p.op_time_s(&attn(AttentionKernel::Fa2)) - e.kernel_overhead_s;
    assert_eq!(ATTENTION_FA2_ON_HOPPER, 0.5);
    assert!((fa2 - native / 0.5).abs() < 1e-12, "{fa2}");
    let a100 = profile();
    assert_eq!(
        a100.op_time_s(&attn(AttentionKernel::Fa2)),
        a100.op_time_s(&attn(AttentionKernel::Native))
    );
}

/// Hand-worked host time of the grouped GEMMs: Qwen3-30B-A3B (128 experts, top-8) at ep 8
/// holds 16 experts a GPU, and each pass of a block runs two grouped GEMMs of 16 (fc1 and fc2
/// in the forward; their input gradients in `I`, their weight gradients in `W`): 32 expert
/// GEMMs, so at 100 µs each every pass takes the host 3.2 ms. The router (one GEMM, not a
/// linear layer's) and the attention GEMMs add nothing; a dense block has no grouped GEMM.
#[test]
fn expert_host_time_hand_worked() {
    let load = |name: &str| {
        autopp_models::presets::preset(name)
            .and_then(|p| p.load().ok())
            .expect("a bundled preset")
    };
    let block = |name: &str, ep: u64| {
        let shard = autopp_models::ShardSpec {
            ep,
            ..autopp_models::ShardSpec::default()
        };
        load(name)
            .layers(&shard)
            .unwrap()
            .into_iter()
            .find(|l| l.kind == autopp_models::LayerKind::Transformer)
            .expect("a block")
    };
    let c = Cluster::new(hardware::gpu("b200").unwrap(), 8, 8, None).unwrap();
    let mut p = AnalyticProfile::new(c, Precision::Bf16).unwrap();
    p.efficiency.grouped_gemm_host_s = 100e-6;
    let moe = block("qwen3-30b-a3b", 8);
    for host in p.expert_host_s(&moe) {
        assert!((host - 32.0 * 100e-6).abs() < 1e-15, "{host}");
    }
    assert_eq!(p.expert_host_s(&block("llama3-8b", 1)), [0.0; 3]);
    p.efficiency.grouped_gemm_host_s = 0.0;
    assert_eq!(p.expert_host_s(&moe), [0.0; 3]);
}
