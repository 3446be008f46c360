//! Mixtures of experts in the planner, against hand-worked cases: the routing imbalance
//! (`--moe-imbalance`).

use autopp_hardware::{hardware, AnalyticProfile, Cluster, Precision};
use autopp_models::{presets, LayerKind, Model, ShardSpec};
use autopp_planner::{evaluate, Degrees, ExpertParallel, ParallelConfig};

fn preset(name: &str) -> Model {
    presets::preset(name)
        .and_then(|p| p.load().ok())
        .expect("a bundled preset")
}

fn profile(gpus: u64) -> AnalyticProfile {
    let c = Cluster::new(hardware::gpu("h100-sxm").unwrap(), gpus, 8, None).unwrap();
    AnalyticProfile::new(c, Precision::Bf16).unwrap()
}

/// Qwen3-30B-A3B at tp 1, pp 2, dp 8, ep 8 on 16 H100, 1F1B, ZeRO 1, full recompute.
fn qwen_config(imbalance: f64) -> ParallelConfig {
    let d = Degrees {
        tp: 1,
        pp: 2,
        dp: 8,
        cp: 1,
        virtual_stages: 1,
    };
    ParallelConfig::new(d, 1, 64)
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
