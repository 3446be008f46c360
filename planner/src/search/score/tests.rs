use super::*;
use crate::estimate::check_config;
use crate::framework::Framework;
use crate::search::space;
use crate::search::table::{group_of, layer_tables};
use autopp_hardware::{hardware, Cluster, Precision};

/// Wherever the cheap test settles a key, it gives exactly what building the scorer and
/// scoring the key give (a MoE model, whose experts weigh the layer sums, and a dense
/// one, over every configuration the scan would score, partial recompute bounds included),
/// and it settles most of the keys that do not fit.
#[test]
fn unfit_base_matches_the_scorer_wherever_it_answers() {
    for (preset, gpus, batch) in [("mixtral-8x7b", 16, 64), ("llama2-13b", 8, 32)] {
        let model = autopp_models::load(preset).expect("preset");
        let gpu = hardware::gpu("h100-sxm").expect("gpu");
        let cluster = Cluster::new(gpu, gpus, 8, None).expect("cluster");
        let profile = AnalyticProfile::new(cluster, Precision::Bf16).expect("profile");
        let opts = SearchOptions::new(Framework::Megatron, batch, 8);
        let keys = space::enumerate(&model, gpus, batch, &opts.limits, &opts.fixed);
        let tables = layer_tables(&model, &profile, &opts, &keys).expect("tables");
        let (mut settled, mut unfit) = (0, 0);
        for key in &keys {
            let Some(table) = tables.get(&group_of(key)) else {
                continue;
            };
            if below_memory_floor(&profile, &opts, key, table.weight_params())
                || check_config(&model, &profile, &config_of(key, &opts, None)).is_err()
            {
                continue;
            }
            let (kind, pp, v, m) = super::super::shape_of(key, &opts);
            let generate = |len: u64| kind.generated_peak_inflight(pp, v, len);
            let Some(inflight) = kind.peak_inflight_with(pp, v, m, &generate) else {
                continue;
            };
            let full =
                KeyScorer::new(&profile, &opts, key, table, &inflight, m).and_then(|k| k.base());
            if full.as_ref().is_some_and(|(s, _)| !s.fits) {
                unfit += 1;
            }
            if let Some(cheap) = unfit_base(&profile, &opts, key, table, &inflight, m) {
                settled += 1;
                assert_eq!(format!("{cheap:?}"), format!("{full:?}"), "{key:?}");
            }
        }
        assert!(
            unfit > 0 && settled > unfit / 2,
            "{preset}: {settled} settled, {unfit} unfit"
        );
    }
}
