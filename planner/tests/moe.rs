//! Mixtures of experts in the planner, against hand-worked cases: the routing imbalance
//! (`--moe-imbalance`) and the expert all-to-all overlap of Megatron-Core's
//! `--overlap-moe-expert-parallel-comm` (the `megatron-core-ep-overlap` runtime).

mod common;

use autopp_hardware::{hardware, AnalyticProfile, Cluster, Precision};
use autopp_models::{presets, LayerKind, Model, Recompute, ShardSpec};
use autopp_planner::stages::{stage_costs, StageContext};
use autopp_planner::{evaluate, Degrees, EvalSettings, ExpertParallel, ParallelConfig, Stack};

fn preset(name: &str) -> Model {
    presets::preset(name)
        .and_then(|p| p.load().ok())
        .expect("a bundled preset")
}

fn profile(gpus: u64) -> AnalyticProfile {
    let c = Cluster::new(hardware::gpu("h100-sxm").unwrap(), gpus, 8, None).unwrap();
    AnalyticProfile::new(c, Precision::Bf16).unwrap()
}

/// tp 1, cp 1, `pp` ranks of `v` stages, `dp` replicas.
fn degrees(pp: u64, dp: u64, v: u64) -> Degrees {
    Degrees {
        tp: 1,
        pp,
        dp,
        cp: 1,
        virtual_stages: v,
    }
}

/// Qwen3-30B-A3B at tp 1, pp 2, dp 8, ep 8 on 16 H100, 1F1B, ZeRO 1, full recompute.
fn qwen_config(imbalance: f64) -> ParallelConfig {
    ParallelConfig::new(degrees(2, 8, 1), 1, 64)
        .with_zero_stage(1)
        .with_recompute(autopp_models::Recompute::Full)
        .with_experts(ExpertParallel {
            ep: 8,
            etp: 1,
            imbalance,
        })
}

/// The busiest expert rank computes `imbalance ×` the balanced share of routed rows
/// (`models/src/transformer/block.rs`, `moe_parts`: rows = ⌈R·etp·F⌉ over the `E/ep` local
/// experts, `R = T·k/tp` token-expert pairs). Qwen3-30B-A3B (h 2048, expert FFN 768, gated,
/// top-8, 128 experts) at ep 8, one 4096-token sequence: R = 4096 · 8 = 32,768 pairs, 16 local
/// experts of 2,048 rows each when balanced. Each row costs 2·h·(2·768) + 2·768·h = 2 · 2048 ·
/// 2304 = 9,437,184 forward FLOPs, so F = 1.5 adds 16,384 rows: 154,618,822,656 FLOPs per
/// MoE layer's forward.
#[test]
fn imbalance_adds_the_busiest_ranks_rows_hand_worked() {
    let m = preset("qwen3-30b-a3b");
    let layer_flops = |milli: u64| {
        let shard = ShardSpec {
            ep: 8,
            moe_imbalance_milli: milli,
            ..ShardSpec::default()
        };
        let layers = m.layers(&shard).unwrap();
        let block = layers
            .iter()
            .find(|l| l.kind == LayerKind::Transformer)
            .expect("a block");
        block.forward_flops()
    };
    let extra = layer_flops(1500) - layer_flops(1000);
    assert_eq!(extra, 16_384.0 * 2.0 * 2048.0 * 2304.0);
    assert_eq!(extra, 154_618_822_656.0);
}

/// A larger imbalance gives a slower iteration through a larger compute term, and nothing
/// else changes (the all-to-all volume is the balanced one: every token still goes out).
#[test]
fn larger_imbalance_is_slower_expert_time() {
    let (m, p) = (preset("qwen3-30b-a3b"), profile(16));
    let run = |f: f64| evaluate(&m, &p, &qwen_config(f)).unwrap().result.predicted;
    let (a, b, c) = (run(1.0), run(1.25), run(2.0));
    assert!(a.breakdown_s.compute < b.breakdown_s.compute);
    assert!(b.breakdown_s.compute < c.breakdown_s.compute);
    assert!(a.iteration_time_s < b.iteration_time_s && b.iteration_time_s < c.iteration_time_s);
    assert_eq!(a.breakdown_s.ep_comm, c.breakdown_s.ep_comm);
}

/// One Qwen3-30B-A3B block's stage context on one node's `link` at ep 8, no recompute: `share`
/// of each all-to-all run beside another micro-batch, `launches` the host floor of the experts.
fn ep8_ctx(
    p: &AnalyticProfile,
    link: autopp_hardware::Link,
    share: f64,
    launches: bool,
) -> StageContext<'_> {
    StageContext {
        ep: 8,
        ep_hidden_share: share,
        expert_host_launches: launches,
        ..common::plain_context(p, 1, link, Recompute::None)
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * a.abs().max(b.abs()).max(1e-12)
}

/// One Qwen3-30B-A3B block at ep 8 with a quarter of each all-to-all exposed: `(1 − s)·a2a +
/// s·exposed(a2a, other pass)` per direction, `exposed(c, x) = max(c − x, 0) + (1 −
/// comm_overlap)·min(c, x)` (the profile's overlap rule, `hardware/src/analytic.rs`). The
/// forward's all-to-alls run beside the other micro-batch's backward (I + W), the backward's
/// beside its forward; `s = 3/4` is 4 micro-batches without a pipeline, `(m − 1)/m`
/// (`experts::a2a_hidden_share`). What is hidden and what is exposed add up to the all-to-all
/// time without the overlap.
#[test]
fn hidden_all_to_all_hand_worked() {
    let m = preset("qwen3-30b-a3b");
    let p = profile(16);
    let shard = ShardSpec {
        ep: 8,
        ..ShardSpec::default()
    };
    let layers = m.layers(&shard).unwrap();
    let i = layers
        .iter()
        .position(|l| l.kind == LayerKind::Transformer)
        .unwrap();
    let link = p.cluster.group_link(8, 1);
    let ctx = |share: f64| ep8_ctx(&p, link, share, false);
    let t = p.layer_times(&layers[i]);
    // one dispatch (or combine) all-to-all over the 8 expert ranks of one node
    let a2a = p.all_to_all_time_s(layers[i].ep_a2a_bytes, 8, &link);
    assert!(a2a > 0.0);
    let k = p.efficiency.comm_overlap;
    let hidden_f = k * a2a.min(t.backward_input_s + t.backward_weight_s);
    let hidden_b = k * a2a.min(t.forward_s);
    let exposed = stage_costs(&layers, &[[i, i]], &ctx(0.0)).remove(0);
    let overlapped = stage_costs(&layers, &[[i, i]], &ctx(0.75)).remove(0);
    assert!(close(exposed.ep_comm_s, 2.0 * a2a));
    assert_eq!(exposed.ep_comm_hidden_s, 0.0);
    assert!(close(
        overlapped.ep_comm_hidden_s,
        0.75 * (hidden_f + hidden_b)
    ));
    assert!(close(
        overlapped.ep_comm_s + overlapped.ep_comm_hidden_s,
        2.0 * a2a
    ));
    assert!(close(
        overlapped.forward_s(),
        exposed.forward_s() - 0.75 * hidden_f
    ));
    assert_eq!(overlapped.forward_compute_s, exposed.forward_compute_s);
}

/// DeepSeek-V3's published layout (arXiv 2412.19437 §3.2; Megatron's
/// `pipeline_parallel_layout.md`: pp 16 with 2 virtual stages) at ep 64 on 1024 H100: under
/// `megatron-core-ep-overlap` part of the busiest rank's all-to-all is hidden, less is
/// exposed than under Megatron-Core (flag off), compute is unchanged and the iteration is
/// faster; with full recompute Megatron refuses the overlap, and the prediction equals
/// Megatron-Core's.
#[test]
fn overlap_hides_deepseek_v3_all_to_alls() {
    let m = preset("deepseek-v3");
    let (p, d) = (profile(1024), degrees(16, 64, 2));
    let run = |stack: Stack, recompute: Recompute| {
        let settings = EvalSettings {
            runtime: stack.runtime(),
            ..EvalSettings::default()
        };
        let c = ParallelConfig::new(d, 1, 8192)
            .with_schedule(autopp_schedule::ScheduleKind::Interleaved1F1B)
            .with_zero_stage(1)
            .with_recompute(recompute)
            .with_settings(settings)
            .with_experts(ExpertParallel {
                ep: 64,
                ..ExpertParallel::default()
            });
        evaluate(&m, &p, &c).unwrap().result.predicted
    };
    let off = run(Stack::MegatronCore, Recompute::None);
    let on = run(Stack::MegatronCoreEpOverlap, Recompute::None);
    let (a, b) = (off.breakdown_s, on.breakdown_s);
    assert_eq!(a.ep_comm_hidden, 0.0);
    assert!(b.ep_comm_hidden > 0.0 && b.ep_comm < a.ep_comm);
    assert!((a.compute - b.compute).abs() < 1e-9 * a.compute);
    assert!(on.iteration_time_s < off.iteration_time_s);
    let full_off = run(Stack::MegatronCore, Recompute::Full);
    let full_on = run(Stack::MegatronCoreEpOverlap, Recompute::Full);
    assert_eq!(full_on.iteration_time_s, full_off.iteration_time_s);
    assert_eq!(full_on.breakdown_s.ep_comm_hidden, 0.0);
}

/// DeepSeek-V3 (61 layers and one MTP layer, `mtp_num_layers` 1) at pp 16 with 2 virtual
/// stages: Megatron's even split puts the 62 transformer-kind entries 2 per stage with the
/// leftover stages 0 and 31 holding one (`split::default_split`), so the MTP layer shares the
/// last stage with the loss. The layout has 61 `t`, one `m`, and the `m` on rank 15's last
/// virtual stage, as `validate_layer_layout` requires (`../shared/reference/megatron-lm.md`;
/// Megatron's own DeepSeek-V3 example, `Et*3|(tt|)*29,m|L`, puts it on rank 14's).
#[test]
fn deepseek_v3_layout_writes_its_mtp_layer() {
    let m = preset("deepseek-v3");
    let c = ParallelConfig::new(degrees(16, 64, 2), 1, 8192)
        .with_schedule(autopp_schedule::ScheduleKind::Interleaved1F1B)
        .with_experts(ExpertParallel {
            ep: 64,
            ..ExpertParallel::default()
        });
    let plan = evaluate(&m, &profile(1024), &c).unwrap().result.plan;
    let layout = plan.megatron_layout.expect("a layout");
    let want = format!("Et|{}mL", "t*2|".repeat(30));
    assert_eq!(layout, want);
    let stages: Vec<&str> = layout.split('|').collect();
    assert_eq!(stages.len(), 32);
    let t: usize = stages
        .iter()
        .map(|s| match s.trim_matches(['E', 'L', 'm']) {
            "" => 0,
            "t" => 1,
            r => r[2..].parse::<usize>().unwrap(),
        })
        .sum();
    assert_eq!(t, 61);
    assert_eq!(layout.matches('m').count(), 1);
    assert!(stages[16..].iter().any(|s| s.contains('m')));
}

/// The routed experts' gradients reduce over the expert-data-parallel group, not the
/// data-parallel one (Megatron-Core's `expert_parallel_buffers`). Qwen3-30B-A3B at tp 1, pp 1,
/// dp 16, ep 8 on two 8-GPU H100 nodes, ZeRO 1, no overlap: each GPU holds 16 of the 128
/// experts of every one of the 48 layers, 48 · 16 · 3 · 2048 · 768 = 3,623,878,656 parameters,
/// and its expert-data-parallel group is edp = 16 / 8 = 2 GPUs 8 apart, one a node, so a ring
/// over it crosses one 400 Gb/s NIC (50 GB/s) per GPU where the data-parallel group (8 members
/// a node) uses eight. The reduce-scatter of the fp32 gradients takes
/// `(2 − 1)/2 · 3,623,878,656 · 4 B / (50 GB/s · comm_inter) + α`, the all-gather of the 16-bit
/// weights half the bytes, each with one inter-node latency α; the rest of the parameters
/// reduce and gather over the 16 GPUs' rails.
#[test]
fn expert_gradients_reduce_over_the_expert_data_parallel_link_hand_worked() {
    use autopp_models::CollectiveKind::{AllGather, ReduceScatter};
    let (m, p) = (preset("qwen3-30b-a3b"), profile(16));
    let settings = EvalSettings {
        runtime: autopp_planner::config::Runtime {
            overlap_grad_reduce: false,
            overlap_param_gather: false,
            ..Default::default()
        },
        ..EvalSettings::default()
    };
    let c = ParallelConfig::new(degrees(1, 16, 1), 1, 64)
        .with_zero_stage(1)
        .with_recompute(Recompute::Full)
        .with_settings(settings)
        .with_experts(ExpertParallel {
            ep: 8,
            etp: 1,
            imbalance: 1.0,
        });
    let e = evaluate(&m, &p, &c).unwrap();
    let experts: u64 = e.stages.iter().map(|s| s.expert_params).sum();
    assert_eq!(experts, 48 * 16 * 3 * 2048 * 768);
    assert_eq!(experts, 3_623_878_656);
    let all: u64 = e.stages.iter().map(|s| s.params).sum();
    let dense = all - experts;
    let edp = p.cluster.ring_link(2, 8);
    assert!(edp.inter_node);
    assert_eq!(edp.bw_bytes_per_s, 50e9);
    let bw = 50e9 * p.efficiency.comm_inter;
    let expert_s = 0.5 * 3_623_878_656.0 * 4.0 / bw + edp.latency_s // reduce-scatter
        + 0.5 * 3_623_878_656.0 * 2.0 / bw + edp.latency_s; // all-gather
    let rails = p.cluster.ring_link(16, 1);
    let dense_s = p.collective_time_s(ReduceScatter, dense * 4, 16, &rails)
        + p.collective_time_s(AllGather, dense * 2, 16, &rails);
    let got = e.dp_comm_s[0];
    assert!(
        close(got, dense_s + expert_s),
        "{got} vs {}",
        dense_s + expert_s
    );
    // over the data-parallel group's eight rails the same bytes would take a sixth as long
    let on_rails = p.collective_time_s(ReduceScatter, experts * 4, 2, &rails)
        + p.collective_time_s(AllGather, experts * 2, 2, &rails);
    assert!(expert_s > 5.0 * on_rails, "{expert_s} vs {on_rails}");
}

/// The host floor of a MoE layer's passes (`Runtime::expert_host_launches`): one Qwen3-30B-A3B
/// block at ep 8 on an H100 node, micro-batch 1, with 100 µs of host work per expert GEMM. Each
/// pass issues 32 expert GEMMs (`AnalyticProfile::expert_host_s`), 3.2 ms of host time; a pass
/// whose GPU time (its compute and, in F and I, its exposed all-to-all) is shorter waits for the
/// host: `compute' = compute + max(host − compute − a2a, 0)`. Without the flag (a CUDA-graph
/// replay, a single-launch grouped GEMM) nothing changes, and nothing else moves with it.
#[test]
fn host_floor_of_expert_passes_hand_worked() {
    let m = preset("qwen3-30b-a3b");
    let mut p = profile(8);
    p.efficiency.grouped_gemm_host_s = 100e-6;
    let shard = ShardSpec {
        ep: 8,
        ..ShardSpec::default()
    };
    let layers = m.layers(&shard).unwrap();
    let i = layers
        .iter()
        .position(|l| l.kind == LayerKind::Transformer)
        .unwrap();
    let link = p.cluster.group_link(8, 1);
    let ctx = |launches: bool| ep8_ctx(&p, link, 0.0, launches);
    let t = p.layer_times(&layers[i]);
    let a2a = p.all_to_all_time_s(layers[i].ep_a2a_bytes, 8, &link);
    let host = 32.0 * 100e-6;
    assert_eq!(p.expert_host_s(&layers[i]), [host; 3]);
    let off = stage_costs(&layers, &[[i, i]], &ctx(false)).remove(0);
    let on = stage_costs(&layers, &[[i, i]], &ctx(true)).remove(0);
    let floor = |gpu: f64, comm: f64| gpu + (host - gpu - comm).max(0.0);
    assert!(close(off.forward_compute_s, t.forward_s));
    assert!(close(on.forward_compute_s, floor(t.forward_s, a2a)));
    assert!(close(
        on.backward_input_compute_s,
        floor(t.backward_input_s, a2a)
    ));
    assert!(close(
        on.backward_weight_compute_s,
        floor(t.backward_weight_s, 0.0)
    ));
    // at 4,096 tokens the weight gradients take the GPU less than the host's 3.2 ms
    assert!(t.backward_weight_s < host && on.backward_weight_compute_s == host);
    assert_eq!(on.ep_comm_s, off.ep_comm_s);
    assert_eq!(on.activation_bytes, off.activation_bytes);
}
