//! The evaluator against hand-worked cases.

use autopp_hardware::{hardware, AnalyticProfile, Cluster, Precision};
use autopp_models::{load_str, Model, Recompute};
use autopp_planner::{evaluate, Degrees, ParallelConfig, RankRecompute};
use autopp_schedule::ScheduleKind;

fn model() -> Model {
    load_str(
        r#"{"name": "m", "num_layers": 8, "hidden_size": 1024, "num_attention_heads": 16,
            "vocab_size": 32000, "seq_length": 1024, "global_batch_size": 64}"#,
        "test",
    )
    .unwrap()
}

fn profile(gpus: u64) -> AnalyticProfile {
    let c = Cluster::new(hardware::gpu("a100-80g").unwrap(), gpus, 8, None).unwrap();
    AnalyticProfile::new(c, Precision::Bf16).unwrap()
}

fn config(tp: u64, pp: u64, dp: u64) -> ParallelConfig {
    let degrees = Degrees {
        tp,
        pp,
        dp,
        cp: 1,
        virtual_stages: 1,
    };
    ParallelConfig::new(degrees, 1, 64)
}

#[test]
fn one_f_one_b_rank0_holds_p_microbatches() {
    let (m, p) = (model(), profile(4));
    let c = config(1, 4, 1);
    let e = evaluate(&m, &p, &c).unwrap();
    assert_eq!(e.result.plan.num_microbatches, 64);
    assert_eq!(e.simulation.peak_inflight, vec![4, 3, 2, 1]);
    // rank 0's activation peak is p micro-batches of its stage
    assert_eq!(
        e.memory[0].activations_bytes,
        4 * e.stages[0].activation_bytes
    );
}

#[test]
fn model_states_are_18_bytes_per_param_and_6_plus_12_over_d() {
    let (m, p) = (model(), profile(8));
    let mut c = config(1, 1, 8);
    c.global_batch_size = 64;
    let e = evaluate(&m, &p, &c).unwrap();
    let params = m.num_params() - 32000 * 1024 + 32000 * 1024; // vocab 32000 pads to 32000
    let mem = &e.memory[0];
    assert_eq!(
        mem.weights_bytes + mem.grads_bytes + mem.optimizer_bytes,
        18 * params
    );
    c.zero_stage = 1;
    let e = evaluate(&m, &p, &c).unwrap();
    let mem = &e.memory[0];
    assert_eq!(
        mem.weights_bytes + mem.grads_bytes + mem.optimizer_bytes,
        6 * params + (12 * params).div_ceil(8)
    );
}

#[test]
fn breakdown_adds_up_and_throughput_is_consistent() {
    let (m, p) = (model(), profile(16));
    for (tp, pp, dp) in [(1, 1, 16), (2, 4, 2), (4, 2, 2), (8, 2, 1)] {
        let mut c = config(tp, pp, dp);
        c.recompute = Recompute::Selective;
        let e = evaluate(&m, &p, &c).unwrap();
        let pr = &e.result.predicted;
        let b = &pr.breakdown_s;
        let sum = b.compute + b.bubble + b.tp_comm + b.pp_comm + b.dp_comm + b.optimizer;
        assert!((sum - pr.iteration_time_s).abs() < 1e-9 * pr.iteration_time_s);
        assert!(b.compute > 0.0 && b.bubble >= 0.0 && b.pp_comm >= 0.0);
        let tokens = 64.0 * 1024.0;
        assert!((pr.tokens_per_s * pr.iteration_time_s - tokens).abs() < 1e-6 * tokens);
        // model FLOPs: 72·B·s·L·h²·(1 + s/(6h) + V/(12·L·h)) over the cluster
        let (bb, s, l, h, v) = (64.0, 1024.0, 8.0, 1024.0, 32000.0);
        let flops = 72.0 * bb * s * l * h * h * (1.0 + s / (6.0 * h) + v / (12.0 * l * h));
        let tflops = flops / (pr.iteration_time_s * 16.0) / 1e12;
        assert!((pr.tflops_per_gpu - tflops).abs() < 1e-9 * tflops);
        assert!((pr.mfu - tflops / 312.0).abs() < 1e-12);
        if tp == 1 {
            assert_eq!(b.tp_comm, 0.0);
        }
        if pp == 1 {
            assert_eq!(b.bubble, 0.0);
            assert_eq!(b.pp_comm, 0.0);
        }
    }
}

#[test]
fn recompute_trades_time_for_memory() {
    let (m, p) = (model(), profile(4));
    let mut last: Option<(f64, u64)> = None;
    for mode in Recompute::ALL {
        let mut c = config(1, 4, 1);
        c.recompute = mode;
        let e = evaluate(&m, &p, &c).unwrap();
        let t = e.result.predicted.iteration_time_s;
        let act = e.memory[0].activations_bytes;
        if let Some((t0, a0)) = last {
            assert!(t >= t0, "{mode}: {t} < {t0}");
            assert!(act <= a0, "{mode}: {act} > {a0}");
        }
        last = Some((t, act));
    }
}

#[test]
fn interleaving_shrinks_the_bubble() {
    let (m, p) = (model(), profile(4));
    let plain = evaluate(&m, &p, &config(1, 4, 1)).unwrap();
    let mut c = config(1, 4, 1);
    c.degrees.virtual_stages = 2;
    c.schedule = ScheduleKind::Interleaved1F1B;
    let inter = evaluate(&m, &p, &c).unwrap();
    assert!(inter.result.predicted.bubble_fraction < plain.result.predicted.bubble_fraction);
    assert_eq!(inter.result.plan.ranks[0].stages.len(), 2);
}

#[test]
fn explicit_split_is_used_and_checked() {
    let (m, p) = (model(), profile(2));
    let mut c = config(1, 2, 1);
    c.split = Some(vec![4, 6]);
    let e = evaluate(&m, &p, &c).unwrap();
    assert_eq!(e.result.plan.ranks[0].stages, vec![[0, 3]]);
    assert_eq!(e.result.plan.ranks[1].stages, vec![[4, 9]]);
    c.split = Some(vec![4, 5]);
    let err = evaluate(&m, &p, &c).unwrap_err();
    assert!(
        matches!(&err, autopp_planner::PlanError::Split(e) if e.field() == autopp_schedule::SpecField::Split),
        "{err}"
    );
}

#[test]
fn zero_three_shards_everything() {
    let (m, p) = (model(), profile(8));
    let mut c = config(1, 1, 8);
    let base = evaluate(&m, &p, &c).unwrap();
    c.zero_stage = 3;
    let z3 = evaluate(&m, &p, &c).unwrap();
    assert!(z3.memory[0].weights_bytes < base.memory[0].weights_bytes);
    assert!(z3.memory[0].grads_bytes * 8 <= base.memory[0].grads_bytes + 8);
    assert!(z3.result.predicted.breakdown_s.dp_comm > base.result.predicted.breakdown_s.dp_comm);
}

/// Partial recompute, hand-worked on 2 stages of 4 transformer layers (stage 0 also holds the
/// embedding, stage 1 the head): fully recomputing N layers of a stage takes N · (selective −
/// full) activation bytes off it and adds N forwards (with their tensor-parallel collectives)
/// to its backward; one number means that N for every stage.
#[test]
fn partial_recompute_trades_n_forwards_for_n_layers_of_activations() {
    let (m, p) = (model(), profile(4));
    let mut base = config(2, 2, 1);
    base.recompute = Recompute::Selective;
    let sel = evaluate(&m, &p, &base).unwrap();
    let mut all_full = base.clone();
    all_full.recompute = Recompute::Full;
    let full = evaluate(&m, &p, &all_full).unwrap();
    let layers = 4.0;
    for n in [1u64, 3] {
        let mut c = base.clone();
        c.recompute_layers = Some(vec![n]);
        let e = evaluate(&m, &p, &c).unwrap();
        for k in 0..2 {
            let per_layer_saved =
                (sel.stages[k].activation_bytes - full.stages[k].activation_bytes) / 4;
            assert_eq!(
                e.stages[k].activation_bytes,
                sel.stages[k].activation_bytes - n * per_layer_saved,
                "stage {k}, N = {n}"
            );
            // the recompute grows by n/4 of the all-full stage's extra forwards over selective
            let extra = (full.stages[k].recompute_s - sel.stages[k].recompute_s) / layers;
            let got = e.stages[k].recompute_s - sel.stages[k].recompute_s;
            assert!(
                (got - n as f64 * extra).abs() < 1e-12,
                "stage {k}, N = {n}: {got} vs {}",
                n as f64 * extra
            );
        }
        let rank = &e.result.plan.ranks[0];
        assert_eq!(rank.recompute, RankRecompute::Partial);
        assert_eq!(rank.recompute_num_layers, n);
        assert_eq!(rank.recompute_num_layers_per_stage, vec![n]);
    }
    // per-stage counts, and a count above a stage's layers is an error naming the flag
    let mut c = base.clone();
    c.recompute_layers = Some(vec![4, 0]);
    let e = evaluate(&m, &p, &c).unwrap();
    assert_eq!(e.result.plan.ranks[0].recompute, RankRecompute::Full);
    assert_eq!(e.result.plan.ranks[1].recompute, RankRecompute::Selective);
    c.recompute_layers = Some(vec![5, 0]);
    let err = evaluate(&m, &p, &c).unwrap_err().to_string();
    assert!(err.contains("--recompute-num-layers"), "{err}");
}
