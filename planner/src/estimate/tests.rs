use super::*;
use crate::config::EvalSettings;
use crate::degrees::Degrees;
use autopp_hardware::{hardware, Cluster, Precision};
use autopp_models::Recompute;

fn setup(gpus: u64, tp: u64, pp: u64) -> (Model, AnalyticProfile, ParallelConfig) {
    let model = autopp_models::load_str(
        r#"{"name": "m", "num_layers": 8, "hidden_size": 2048, "num_attention_heads": 16,
            "vocab_size": 32000, "seq_length": 2048}"#,
        "test",
    )
    .unwrap();
    let c = Cluster::new(hardware::gpu("a100-80g").unwrap(), gpus, 8, Some(50.0)).unwrap();
    let profile = AnalyticProfile::new(c, Precision::Fp16).unwrap();
    let degrees = Degrees {
        tp,
        pp,
        dp: gpus / (tp * pp),
        cp: 1,
        virtual_stages: 1,
    };
    let config = ParallelConfig::new(degrees, 1, 64)
        .with_recompute(Recompute::Full)
        .with_settings(EvalSettings {
            precision: Precision::Fp16,
            memory_reserve_bytes: 0,
            flash_attention: false,
            // Megatron-Core's facts with no data-parallel overlap: each test turns on
            // what it measures
            runtime: crate::config::Runtime {
                overlap_grad_reduce: false,
                overlap_param_gather: false,
                ..Default::default()
            },
            ..EvalSettings::default()
        });
    (model, profile, config)
}

fn time(m: &Model, p: &AnalyticProfile, c: &ParallelConfig) -> Estimate {
    evaluate(m, p, c).unwrap()
}

#[test]
fn overlapped_gradient_reduction_hides_behind_the_backward() {
    let (m, p, mut c) = setup(32, 1, 1);
    let plain = time(&m, &p, &c).dp_comm_s[0];
    c.settings.runtime.overlap_grad_reduce = true;
    let hidden = time(&m, &p, &c).dp_comm_s[0];
    assert!(hidden < plain, "{hidden} vs {plain}");
    // 16-bit gradients halve the traffic
    c.settings.runtime.overlap_grad_reduce = false;
    c.settings.runtime.fp32_main_grads = false;
    let half = time(&m, &p, &c).dp_comm_s[0];
    assert!(
        (half - plain / 2.0).abs() < 0.05 * plain,
        "{half} vs {plain}"
    );
}

#[test]
fn deepspeed_pipeline_sends_cost_more() {
    let (m, p, mut c) = setup(32, 8, 4);
    let megatron = time(&m, &p, &c).result.predicted;
    c.settings.runtime.pp_scatter_gather = false;
    c.settings.runtime.pp_blocking_sends = true;
    let deepspeed = time(&m, &p, &c).result.predicted;
    assert!(deepspeed.iteration_time_s > megatron.iteration_time_s);
    assert!(deepspeed.breakdown_s.pp_comm > megatron.breakdown_s.pp_comm);
    let b = deepspeed.breakdown_s;
    let sum = b.compute + b.bubble + b.tp_comm + b.pp_comm + b.dp_comm + b.optimizer;
    assert!((sum - deepspeed.iteration_time_s).abs() < 1e-9 * sum);
}

/// Megatron-Core's `--overlap-param-gather`: the ZeRO-1 weight all-gather (2 B/param)
/// hides behind the next iteration's first forward, exposing
/// `max(g − f, 0) + (1 − overlap)·min(g, f)` (`Efficiency::exposed_comm_s`).
#[test]
fn param_gather_overlaps_the_next_forward() {
    let (m, mut p, mut c) = setup(32, 1, 1);
    c.zero_stage = 1;
    c.settings.runtime.overlap_grad_reduce = false;
    c.settings.runtime.overlap_param_gather = false;
    p.efficiency.comm_overlap = 0.75;
    let e = time(&m, &p, &c);
    let plain = e.dp_comm_s[0];
    let stages: Vec<&StageCost> = e.stages.iter().collect();
    let params = crate::memory::rank_params(&stages);
    let link = c.settings.runtime.ring_link(
        &p.cluster,
        32,
        c.degrees.layout().tp_stride() * c.degrees.tp,
    );
    let gather = p.collective_time_s(
        autopp_models::CollectiveKind::AllGather,
        params * 2,
        32,
        &link,
    );
    let fwd: f64 = e.stages.iter().map(|s| s.forward_s()).sum();
    c.settings.runtime.overlap_param_gather = true;
    let hidden = time(&m, &p, &c).dp_comm_s[0];
    let expect = plain - gather + (gather - fwd).max(0.0) + 0.25 * gather.min(fwd);
    assert!(gather > 0.0 && hidden < plain);
    assert!(
        (hidden - expect).abs() < 1e-9 * plain,
        "{hidden} vs {expect}"
    );
}

/// `--tp-comm-overlap` / async TP: a block's forward collectives hide behind its forward
/// compute. With full overlap each block exposes only `max(c − f, 0)` (its collectives `c`
/// beyond its compute `f`) and the embedding's and head's collectives stay whole; with no
/// overlap nothing changes.
#[test]
fn tensor_parallel_overlap_hides_block_collectives() {
    let (m, mut p, mut c) = setup(8, 8, 1);
    c.settings.runtime.tp_comm_overlap = false;
    let off = time(&m, &p, &c).stages[0].forward_comm_s;
    let layers = m.layers(&shard_spec(&c)).unwrap();
    let link = p.cluster.group_link(8, c.degrees.layout().tp_stride());
    let (mut blocks, mut left) = (0.0, 0.0);
    for l in layers
        .iter()
        .filter(|l| l.kind == autopp_models::LayerKind::Transformer)
    {
        let comm = p.collectives_time_s(&l.tp_forward, 8, &link);
        blocks += comm;
        left += (comm - p.layer_times(l).forward_s).max(0.0);
    }
    assert!(blocks > 0.0);
    c.settings.runtime.tp_comm_overlap = true;
    p.efficiency.comm_overlap = 0.0;
    let none = time(&m, &p, &c).stages[0].forward_comm_s;
    assert!((none - off).abs() < 1e-12 * off);
    p.efficiency.comm_overlap = 1.0;
    let full = time(&m, &p, &c).stages[0].forward_comm_s;
    let expect = off - blocks + left;
    assert!(
        full < off && (full - expect).abs() < 1e-9 * off,
        "{full} vs {expect}"
    );
}

/// ZeRO-3 gathers each layer's weights twice and reduce-scatters its gradients every
/// micro-batch (1.5× an all-reduce); with the compute fully hidden behind it, the exposed
/// time is at most that traffic.
#[test]
fn zero3_traffic_overlaps_compute() {
    let (m, mut p, mut c) = setup(32, 1, 1);
    c.zero_stage = 3;
    p.efficiency.comm_overlap = 0.0;
    let serial = time(&m, &p, &c).dp_comm_s[0];
    p.efficiency.comm_overlap = 1.0;
    let overlapped = time(&m, &p, &c).dp_comm_s[0];
    assert!(overlapped < serial);
    let m_count = c.num_microbatches() as f64;
    assert!(serial > m_count * 1e-3);
}

/// FSDP at ZeRO 2 (torchtitan's `reshard_after_forward=False`) gathers each layer once
/// and reduce-scatters its gradients every micro-batch: with nothing overlapped the exposed
/// time is linear in the micro-batches, where Megatron-Core's distributed optimizer
/// exchanges once per iteration.
#[test]
fn fsdp_zero2_exchanges_every_micro_batch() {
    let (m, mut p, mut c) = setup(32, 1, 1);
    c.zero_stage = 2;
    c.settings.runtime = crate::Stack::Torchtitan.runtime();
    p.efficiency.comm_overlap = 0.0;
    let one = time(&m, &p, &c).dp_comm_s[0];
    c.global_batch_size *= 4;
    let four = time(&m, &p, &c).dp_comm_s[0];
    assert!((four - 4.0 * one).abs() < 1e-9 * four, "{four} vs {one}");
    c.settings.runtime = crate::Stack::MegatronCore.runtime();
    let core = time(&m, &p, &c).dp_comm_s[0];
    assert!(four > 2.0 * core, "{four} vs {core}");
}

/// FSDP under a pipeline (torchtitan, ZeRO 2 or 3) exchanges once per step, as PyTorch's
/// pipeline stages run it (`_PipelineStageBase.backward_maybe_with_nosync`: the stage stays
/// unsharded until the last backward, whose `post_backward`s reduce-scatter every layer):
/// with nothing overlapped, each rank pays one all-gather of each layer's 16-bit weights and
/// one reduce-scatter of its gradients, whatever the number of micro-batches.
#[test]
fn pipelined_fsdp_exchanges_once_per_step() {
    let (m, mut p, mut c) = setup(32, 1, 2);
    c.settings.runtime = crate::Stack::Torchtitan.runtime();
    p.efficiency.comm_overlap = 0.0;
    let n = c.degrees.data_parallel_gpus();
    let link =
        c.settings
            .runtime
            .ring_link(&p.cluster, n, c.degrees.layout().tp_stride() * c.degrees.tp);
    let grad_bytes = if c.settings.runtime.fp32_main_grads {
        crate::memory::GRAD_BYTES_PER_PARAM
    } else {
        crate::memory::HALF_GRAD_BYTES_PER_PARAM
    };
    for zero in [2, 3] {
        c.zero_stage = zero;
        let e = time(&m, &p, &c);
        // the first and last ranks also all-reduce the tied embedding's gradient
        let tied: u64 = e.stages.iter().map(|s| s.tied_params).sum();
        let ends = p.cluster.link_between(0, c.degrees.layout().pp_stride());
        let tied_s = p.collective_time_s(
            autopp_models::CollectiveKind::AllReduce,
            tied * grad_bytes,
            2,
            &ends,
        );
        for (rank, s) in e.stages.iter().enumerate() {
            let pieces = (s.layers[1] + 1 - s.layers[0]) as u64;
            // a rank's parameters: its own, and the tied head's copy away from the embedding
            let params = crate::memory::rank_params(&[s]);
            let one = |kind, bytes: u64| {
                pieces as f64 * p.collective_time_s(kind, bytes.div_ceil(pieces), n, &link)
            };
            let expect = one(
                autopp_models::CollectiveKind::AllGather,
                params * crate::memory::WEIGHT_BYTES_PER_PARAM,
            ) + one(
                autopp_models::CollectiveKind::ReduceScatter,
                params * grad_bytes,
            ) + tied_s;
            let got = e.dp_comm_s[rank];
            assert!(
                (got - expect).abs() < 1e-9 * expect,
                "ZeRO {zero}, rank {rank}: {got} vs {expect}"
            );
        }
        let mut more = c.clone();
        more.global_batch_size *= 4;
        let four = time(&m, &p, &more).dp_comm_s[0];
        assert!((four - e.dp_comm_s[0]).abs() < 1e-12 * four);
    }
}
