//! The planner against brute force: every configuration of the search space and every
//! contiguous split, each evaluated through `estimate`'s code path; the planner's plan must be
//! within 0.5% of the best of them.

use autopp_hardware::{hardware, AnalyticProfile, Cluster, Efficiency, Precision};
use autopp_models::{load_str, Model};
use autopp_planner::estimate::{evaluate_layers, shard_spec};
use autopp_planner::search::{self, config_of, space, SearchOptions};
use autopp_planner::Framework;
use autopp_schedule::split;

fn options(global_batch: u64, precision: Precision) -> SearchOptions {
    let mut opts = SearchOptions::new(Framework::Any, global_batch, 8);
    opts.limits.max_micro_batch_size = 2;
    opts.limits.max_virtual_stages = 2;
    opts.top_k = 3;
    opts.settings.precision = precision;
    // the fastest, not the simplest within a tolerance: optimality is under test
    opts.tolerance = 0.0;
    opts
}

/// The fastest fitting (time, description) over the whole space, by brute force.
fn brute_force(
    model: &Model,
    profile: &AnalyticProfile,
    opts: &SearchOptions,
) -> (Option<(f64, String)>, usize, usize) {
    let keys = space::enumerate(
        model,
        profile.cluster.num_gpus(),
        opts.global_batch_size,
        &opts.limits,
        &opts.fixed,
    );
    let entries = model.num_layer_entries();
    let mut best: Option<(f64, String)> = None;
    let (mut evaluated, mut unfit) = (0, 0);
    for key in keys {
        let base = config_of(&key, opts, None);
        let Ok(layers) = model.layers(&shard_spec(&base)) else {
            continue;
        };
        let stages = key.degrees.num_stages() as usize;
        if stages > entries {
            continue;
        }
        for split in split::all_splits(entries, stages) {
            let c = config_of(&key, opts, Some(split.clone()));
            if autopp_planner::estimate::check_config(model, profile, &c).is_err() {
                continue;
            }
            let Ok(e) = evaluate_layers(model, profile, &c, &layers) else {
                continue;
            };
            evaluated += 1;
            if !e.result.predicted.fits {
                unfit += 1;
                continue;
            }
            let t = e.result.predicted.iteration_time_s;
            if best.as_ref().is_none_or(|(b, _)| t < *b) {
                best = Some((t, format!("{key:?} split {split:?}")));
            }
        }
    }
    (best, evaluated, unfit)
}

fn check(model_json: &str, gpu: &str, gpus: u64, global_batch: u64, precision: Precision) {
    check_with(model_json, gpu, gpus, global_batch, precision, None);
}

fn check_with(
    model_json: &str,
    gpu: &str,
    gpus: u64,
    global_batch: u64,
    precision: Precision,
    efficiency: Option<Efficiency>,
) {
    let model = load_str(model_json, "test").unwrap();
    let cluster = Cluster::new(hardware::gpu(gpu).unwrap(), gpus, 8, None).unwrap();
    let mut profile = AnalyticProfile::new(cluster, precision).unwrap();
    if let Some(e) = efficiency {
        profile.efficiency = e;
    }
    let opts = options(global_batch, precision);
    let (brute, evaluated, unfit) = brute_force(&model, &profile, &opts);
    // the case must be a real test: many candidates, some that do not fit
    assert!(
        evaluated > 1000,
        "{gpu} × {gpus}: only {evaluated} candidates"
    );
    assert!(unfit > 0, "{gpu} × {gpus}: memory never binds");
    let planned = search::search(&model, &profile, &opts, &|_, _| {});
    match (brute, planned) {
        (None, Err(_)) => {}
        (Some((t, what)), Ok(r)) => {
            let got = r.best.result.predicted.iteration_time_s;
            assert!(
                got <= t * 1.005,
                "{gpu} × {gpus}: planner {got} s ({:?} split {:?}) vs brute force {t} s ({what})",
                search::key_of(&r.best),
                r.best
                    .stages
                    .iter()
                    .map(|s| s.layers[1] - s.layers[0] + 1)
                    .collect::<Vec<_>>()
            );
            assert!(r.best.result.predicted.fits);
        }
        (b, p) => panic!(
            "{gpu} × {gpus}: brute force {b:?} but planner {:?}",
            p.map(|r| r.best.result.predicted.iteration_time_s)
        ),
    }
}

#[test]
fn planner_matches_brute_force_on_a100_40g() {
    // 6 transformer layers, big enough that memory binds on a few GPUs
    let model = r#"{"name": "small", "num_layers": 6, "hidden_size": 4096, "num_attention_heads": 32,
                    "vocab_size": 50000, "seq_length": 2048}"#;
    check(model, "a100-40g", 4, 16, Precision::Bf16);
}

#[test]
fn planner_matches_brute_force_with_ten_layers_on_eight_gpus() {
    let model = r#"{"name": "ten", "num_layers": 10, "hidden_size": 5120, "num_attention_heads": 40,
                    "vocab_size": 50000, "seq_length": 2048}"#;
    check(model, "a100-40g", 8, 16, Precision::Bf16);
}

#[test]
fn planner_matches_brute_force_on_v100() {
    let model = r#"{"name": "small-gqa", "num_layers": 8, "hidden_size": 4096, "num_attention_heads": 32,
                    "num_kv_heads": 8, "ffn_hidden_size": 11008, "gated_mlp": true, "tied_embeddings": false,
                    "vocab_size": 32000, "seq_length": 1024, "norm": "rmsnorm", "bias": false}"#;
    check(model, "v100-32g", 8, 32, Precision::Fp16);
    check(model, "v100-32g", 16, 32, Precision::Fp16);
}

/// The same V100 case under other efficiency knobs (a refit of the calibration file with every
/// knob moved on every row): there the best plan is zb-v with micro-batches of 2, four per
/// replica, and the closed form charged zb-v a forward per hop of fill that the exact
/// schedule does not have (it has none: ZB-V's bubble is `(p − 1)·(T_F + T_B − 2·T_W)`), so
/// the plan ranked behind six other zb-v plans and was never simulated (0.54% lost).
#[test]
fn planner_matches_brute_force_on_v100_under_other_knobs() {
    let model = r#"{"name": "small-gqa", "num_layers": 8, "hidden_size": 4096, "num_attention_heads": 32,
                    "num_kv_heads": 8, "ffn_hidden_size": 11008, "gated_mlp": true, "tied_embeddings": false,
                    "vocab_size": 32000, "seq_length": 1024, "norm": "rmsnorm", "bias": false}"#;
    let efficiency = Efficiency {
        gemm_max: 0.6147,
        gemm_half_dim: 4.643,
        attention_fused: 0.4039,
        hopper_compute: 0.9292,
        comm_intra: 0.9372,
        comm_inter: 0.758,
        comm_overlap: 0.7206,
        kernel_overhead_s: 2.054e-6,
        ..Efficiency::default()
    };
    check_with(model, "v100-32g", 16, 32, Precision::Fp16, Some(efficiency));
}

/// A mixture of experts (one dense layer, then 8 experts of which each token takes 2): the
/// space holds ep ∈ {1, 2, 4, 8} and etp ∈ {1, tp}, and memory binds where the experts are not
/// spread.
#[test]
fn planner_matches_brute_force_on_a_small_moe_with_expert_parallelism() {
    let model = r#"{"name": "small-moe", "num_layers": 6, "hidden_size": 2048, "num_attention_heads": 16,
                    "num_kv_heads": 4, "ffn_hidden_size": 8192, "gated_mlp": true, "tied_embeddings": false,
                    "vocab_size": 32000, "seq_length": 2048, "norm": "rmsnorm", "bias": false, "dropout": false,
                    "moe": {"num_experts": 8, "num_experts_per_tok": 2, "moe_ffn_hidden_size": 8192,
                            "first_k_dense_layers": 1}}"#;
    let parsed = load_str(model, "test").unwrap();
    let opts = options(16, Precision::Bf16);
    let keys = space::enumerate(&parsed, 8, 16, &opts.limits, &opts.fixed);
    assert!(keys.iter().any(|k| k.ep == 8) && keys.iter().any(|k| k.etp > 1));
    check(model, "a100-40g", 8, 16, Precision::Bf16);
}
