//! Tensor parallelism as PyTorch DTensor runs it (torchtitan's `TpCollectives::Dtensor`),
//! against hand-worked cases: exposed backward collectives, the `aten.cat` beside each
//! sequence-parallel collective (torchtitan PR #437), the all-gathers that per-op selective
//! checkpointing runs again (`_op_sac_save_list` saves reduce-scatters, not all-gathers),
//! async TP on the forward only, and float8 tensorwise's float8 all-gathers.

mod common;

use autopp_hardware::{hardware, AnalyticProfile, Cluster, Precision};
use autopp_models::{presets, CollectiveKind, LayerKind, Model, Recompute, ShardSpec};
use autopp_planner::runtime::{every_other_matmul_share, TpCollectives};
use autopp_planner::stages::{layout_copies_s, stage_costs, StageContext, StageCost};
use autopp_planner::Stack;

fn llama3_8b() -> Model {
    presets::preset("llama3-8b")
        .and_then(|p| p.load().ok())
        .expect("a bundled preset")
}

/// One node of Grand Teton H100s (torchtitan's 2025-06 async-TP benchmark).
fn profile(precision: Precision) -> AnalyticProfile {
    let gpu = hardware::gpu("h100-hbm2e-500w").unwrap();
    let c = Cluster::new(gpu, 8, 8, None).unwrap();
    AnalyticProfile::new(c, precision).unwrap()
}

/// The benchmark's block: tp 8 with sequence parallelism, local batch 12 of 8192 tokens.
fn shard() -> ShardSpec {
    ShardSpec {
        tp: 8,
        sequence_parallel: true,
        micro_batch_size: 12,
        ..ShardSpec::default()
    }
}

/// The first transformer block's costs under `dtensor` and `overlap` (async TP), per-op
/// selective checkpointing.
fn block(p: &AnalyticProfile, dtensor: bool, overlap: bool) -> StageCost {
    let m = llama3_8b();
    let layers = m.layers(&shard()).unwrap();
    let i = layers
        .iter()
        .position(|l| l.kind == LayerKind::Transformer)
        .unwrap();
    let link = p.cluster.group_link(8, 1);
    let ctx = StageContext {
        tp_comm_overlap: overlap,
        // the benchmark (June 2025) ran separate wq, wk, wv
        selective_linear_share: every_other_matmul_share(&m, false),
        dtensor_tp: dtensor,
        torch_native: true,
        ..common::plain_context(p, 8, link, Recompute::Selective)
    };
    stage_costs(&layers, &[[i, i]], &ctx).remove(0)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-12)
}

/// The whole activation of the block, `b·s·h` bf16 values: 12 · 8192 · 4096 · 2 B.
const S: u64 = 805_306_368;

/// One sequence-parallel collective over the 8 GPUs of the node and its copy. The copy reads
/// and writes the whole tensor: 2 · 805,306,368 B at 2.4 TB/s × `hbm` 0.9499 = 0.70648 ms.
#[test]
fn the_copy_beside_a_collective_hand_worked() {
    let p = profile(Precision::Bf16);
    let gather = autopp_models::Collective {
        kind: CollectiveKind::AllGather,
        bytes: S,
    };
    let reduce = autopp_models::Collective {
        kind: CollectiveKind::AllReduce,
        bytes: S,
    };
    let copy = layout_copies_s(&p, &[gather]);
    assert!(
        close(copy, 2.0 * S as f64 / (2.4e12 * p.efficiency.hbm)),
        "{copy}"
    );
    assert!((copy - 0.70648e-3).abs() < 1e-8, "{copy}");
    // an all-reduce needs no reshuffle
    assert_eq!(layout_copies_s(&p, &[reduce]), 0.0);
}

/// Forward: two all-gathers and two reduce-scatters of `S`, each with its copy. Backward: the
/// same four, all exposed (Megatron's layers hide part behind the weight-gradient GEMMs).
/// Recompute: the two all-gathers again, with their copies.
#[test]
fn dtensor_block_collectives_hand_worked() {
    let p = profile(Precision::Bf16);
    let link = p.cluster.group_link(8, 1);
    let one = |kind| p.collective_time_s(kind, S, 8, &link);
    let (ag, rs) = (
        one(CollectiveKind::AllGather),
        one(CollectiveKind::ReduceScatter),
    );
    let copy = 2.0 * S as f64 / (2.4e12 * p.efficiency.hbm);
    let dt = block(&p, true, false);
    assert!(close(dt.forward_comm_s, 2.0 * ag + 2.0 * rs + 4.0 * copy));
    assert!(close(dt.backward_comm_s, 2.0 * ag + 2.0 * rs + 4.0 * copy));
    assert!(close(dt.recompute_comm_s, 2.0 * (ag + copy)));
    // the recompute's compute part is the Megatron-layer block's (same GEMMs re-run)
    let mg = block(&p, false, false);
    assert!(close(mg.forward_comm_s, 2.0 * ag + 2.0 * rs));
    assert_eq!(mg.recompute_comm_s, 0.0);
    assert!(mg.backward_comm_s < 2.0 * ag + 2.0 * rs);
    assert!(close(
        dt.recompute_s - dt.recompute_comm_s,
        mg.recompute_s - mg.recompute_comm_s
    ));
    assert_eq!(dt.forward_compute_s, mg.forward_compute_s);
}

/// Async TP hides the forward's collectives behind the block's forward compute (the
/// profile's overlap rule) and leaves the backward's and the recomputed all-gathers as in
/// vanilla TP (PyTorch PR #149946: the backward's reduce-scatters take sums of matmuls).
#[test]
fn async_tp_overlaps_the_forward_only() {
    let p = profile(Precision::Bf16);
    let (vanilla, fused) = (block(&p, true, false), block(&p, true, true));
    let want = p
        .efficiency
        .exposed_comm_s(vanilla.forward_comm_s, vanilla.forward_compute_s);
    assert!(close(fused.forward_comm_s, want));
    assert!(fused.forward_comm_s < vanilla.forward_comm_s);
    assert_eq!(fused.backward_comm_s, vanilla.backward_comm_s);
    assert_eq!(fused.recompute_comm_s, vanilla.recompute_comm_s);
}

/// Float8 tensorwise gathers the module inputs in float8 (`Float8ColwiseParallel`): the two
/// forward all-gathers and their copies move `S/2`, in the forward and in the recompute; in
/// the backward the two all-gathers of the row-parallel outputs' gradients, cast to e5m2 first
/// (`Float8RowwiseParallel`), move `S/2` too, while the reduce-scatters stay bf16; rowwise
/// gathers in bf16 like bf16.
#[test]
fn float8_tensorwise_gathers_in_float8() {
    let link = profile(Precision::Bf16).cluster.group_link(8, 1);
    let gather = |p: &AnalyticProfile, bytes: u64| {
        p.collective_time_s(CollectiveKind::AllGather, bytes, 8, &link)
            + 2.0 * bytes as f64 / (2.4e12 * p.efficiency.hbm)
    };
    let (tw, rw, bf) = (
        profile(Precision::Fp8Tensorwise),
        profile(Precision::Fp8Rowwise),
        profile(Precision::Bf16),
    );
    let saved = 2.0 * (gather(&tw, S) - gather(&tw, S / 2));
    let (t, r, b) = (
        block(&tw, true, false),
        block(&rw, true, false),
        block(&bf, true, false),
    );
    assert!(close(b.forward_comm_s - t.forward_comm_s, saved));
    assert!(close(b.recompute_comm_s - t.recompute_comm_s, saved));
    assert!(close(b.backward_comm_s - t.backward_comm_s, saved));
    assert_eq!(r.forward_comm_s, b.forward_comm_s);
    assert_eq!(r.backward_comm_s, b.backward_comm_s);
    assert_eq!(r.recompute_comm_s, b.recompute_comm_s);
}

/// Only torchtitan's runtime runs DTensor's parallel styles.
#[test]
fn only_torchtitan_runs_dtensor() {
    for s in Stack::ALL {
        let want = if s == Stack::Torchtitan {
            TpCollectives::Dtensor
        } else {
            TpCollectives::Megatron
        };
        assert_eq!(s.runtime().tp_collectives, want, "{s}");
    }
}
