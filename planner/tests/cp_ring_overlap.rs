//! Context parallelism's ring exchange of K and V runs beside the attention core: Transformer
//! Engine's `AttnFuncWithCPAndKVP2P` (Megatron-Core, NeMo) and PyTorch's
//! `_templated_ring_attention` (torchtitan) send the next block while the current one is
//! attended, so the forward exchange is exposed only beyond the attention core's time, by the
//! overlap rule `max(c − a, 0) + (1 − comm_overlap)·min(c, a)`.

mod common;

use autopp_hardware::{hardware, AnalyticProfile, Cluster, Precision};
use autopp_models::{presets, LayerKind, Model, Op, Recompute, ShardSpec};
use autopp_planner::stages::{stage_costs, StageContext, StageCost};

fn llama3_8b() -> Model {
    presets::preset("llama3-8b")
        .and_then(|p| p.load().ok())
        .expect("a bundled preset")
}

/// Eight H100s of one node.
fn profile() -> AnalyticProfile {
    let c = Cluster::new(hardware::gpu("h100-sxm").unwrap(), 8, 8, None).unwrap();
    AnalyticProfile::new(c, Precision::Bf16).unwrap()
}

/// The first block of Llama 3 8B at cp 2 (tp 1, one sequence of 8192 tokens split in two), its
/// K and V exchanged as `kv_bytes` per GPU, under `mode`.
fn block(p: &AnalyticProfile, kv_bytes: u64, mode: Recompute) -> (StageCost, f64) {
    let shard = ShardSpec {
        cp: 2,
        ..ShardSpec::default()
    };
    let layers = llama3_8b().layers(&shard).unwrap();
    let i = layers
        .iter()
        .position(|l| l.kind == LayerKind::Transformer)
        .unwrap();
    let attention: f64 = layers[i]
        .forward_ops
        .iter()
        .filter(|op| matches!(op, Op::Attention { .. }))
        .map(|op| p.op_time_s(op))
        .sum();
    let link = p.cluster.group_link(2, 1);
    let ctx = StageContext {
        cp: 2,
        cp_kv_bytes: kv_bytes,
        ..common::plain_context(p, 1, link, mode)
    };
    (stage_costs(&layers, &[[i, i]], &ctx).remove(0), attention)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-12)
}

/// The exchange is the all-gather of both GPUs' K and V (`cp_kv_bytes · cp` over the pair).
/// Llama 3 8B's K and V of 4096 tokens: 2 · 4096 · 8 KV heads · 128 · 2 B = 16.8 MB per GPU.
#[test]
fn the_ring_exchange_hides_behind_the_attention_core() {
    let p = profile();
    let kv = 2 * 4096 * 8 * 128 * 2;
    let link = p.cluster.group_link(2, 1);
    let exchange = p.collective_time_s(autopp_models::CollectiveKind::AllGather, kv * 2, 2, &link);
    let (st, attention) = block(&p, kv, Recompute::None);
    assert!(attention > 0.0);
    let o = p.efficiency.comm_overlap;
    let hidden = exchange.min(attention);
    let want = exchange - hidden + (1.0 - o) * hidden;
    // no tensor parallelism: the forward's exposed communication is the exchange's remainder
    assert!(
        close(st.forward_comm_s, want),
        "{} vs {want}",
        st.forward_comm_s
    );
    assert!(st.forward_comm_s < exchange);
    // a full recompute runs the forward again, its exchange hidden the same way
    let (full, _) = block(&p, kv, Recompute::Full);
    assert!(
        close(full.recompute_comm_s, want),
        "{}",
        full.recompute_comm_s
    );
    // an exchange far longer than the attention core is exposed beyond it
    let big = 1000 * kv;
    let long = p.collective_time_s(autopp_models::CollectiveKind::AllGather, big * 2, 2, &link);
    let (st, attention) = block(&p, big, Recompute::None);
    assert!(close(
        st.forward_comm_s,
        long - attention + (1.0 - o) * attention
    ));
}
