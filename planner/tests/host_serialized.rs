//! A host-serialized runtime (`CUDA_LAUNCH_BLOCKING=1`, as BigScience ran its 176B runs): the
//! GPU waits for the host to issue every kernel, so each transformer block's host time
//! (`Efficiency::host_block_s`) adds to its passes — once to the forward, once to each half of
//! the backward (twice the forward's kernels), once more to a full recompute. The embedding and
//! the head pay nothing; a runtime whose host runs ahead pays nothing.

mod common;

use autopp_hardware::{hardware, AnalyticProfile, Cluster, Precision};
use autopp_models::{presets, LayerKind, Model, Recompute, ShardSpec};
use autopp_planner::stages::{stage_costs, StageContext, StageCost};

fn gpt3() -> Model {
    presets::preset("gpt3-175b")
        .and_then(|p| p.load().ok())
        .expect("a bundled preset")
}

/// Eight A100s of one node, in fp16 as BigScience's February runs.
fn profile() -> AnalyticProfile {
    let c = Cluster::new(hardware::gpu("a100-80g").unwrap(), 8, 8, None).unwrap();
    AnalyticProfile::new(c, Precision::Fp16).unwrap()
}

/// Stage costs of the layers `range` of GPT-3 175B at tp 8, one sequence per micro-batch.
fn stage(p: &AnalyticProfile, range: [usize; 2], mode: Recompute, serialized: bool) -> StageCost {
    let shard = ShardSpec {
        tp: 8,
        ..ShardSpec::default()
    };
    let layers = gpt3().layers(&shard).unwrap();
    let link = p.cluster.group_link(8, 1);
    let ctx = StageContext {
        host_serialized: serialized,
        ..common::plain_context(p, 8, link, mode)
    };
    stage_costs(&layers, &[range], &ctx).remove(0)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-12)
}

/// Hand-worked: two blocks under full recompute add 2 · h to the forward, 2 · h to each half of
/// the backward and 2 · h to the recompute, 8 · h in all; without recompute 6 · h.
#[test]
fn each_block_pass_adds_its_host_time() {
    let p = profile();
    let h = p.efficiency.host_block_s;
    assert!(h > 0.0);
    let layers = gpt3().layers(&ShardSpec::default()).unwrap();
    let first = layers
        .iter()
        .position(|l| l.kind == LayerKind::Transformer)
        .unwrap();
    let two = [first, first + 1];
    for mode in [Recompute::None, Recompute::Full] {
        let async_host = stage(&p, two, mode, false);
        let waits = stage(&p, two, mode, true);
        assert!(close(
            waits.forward_compute_s,
            async_host.forward_compute_s + 2.0 * h
        ));
        assert!(close(
            waits.backward_input_compute_s,
            async_host.backward_input_compute_s + 2.0 * h
        ));
        assert!(close(
            waits.backward_weight_compute_s,
            async_host.backward_weight_compute_s + 2.0 * h
        ));
        let recompute = if mode == Recompute::Full {
            2.0 * h
        } else {
            0.0
        };
        assert!(close(waits.recompute_s, async_host.recompute_s + recompute));
        // communication is untouched
        assert!(close(waits.forward_comm_s, async_host.forward_comm_s));
        assert!(close(waits.backward_comm_s, async_host.backward_comm_s));
    }
}

/// The embedding (layer 0) is not a block: it pays no host time.
#[test]
fn the_embedding_pays_nothing() {
    let p = profile();
    let a = stage(&p, [0, 0], Recompute::Full, false);
    let b = stage(&p, [0, 0], Recompute::Full, true);
    assert_eq!(a.forward_compute_s, b.forward_compute_s);
    assert_eq!(a.recompute_s, b.recompute_s);
}
