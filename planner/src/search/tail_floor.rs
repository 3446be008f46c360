//! A lower bound on the tail of a key's closed form (its data-parallel communication and
//! optimizer step, [`super::score`]'s `closed_form`), for any split: the scan orders keys by
//! their compute bound plus this, so that keys whose exchange alone puts them past the
//! shortlist are never scored. Without it a stack whose exchange is heavy (FSDP at ZeRO 2
//! reduce-scatters every micro-batch) read thousands of keys more, each costing a split DP.

use autopp_hardware::AnalyticProfile;
use rustc_hash::FxHashMap as HashMap;

use super::score::dp_link_of;
use super::table::LayerTable;
use super::{config_of, shape_of, Key, SearchOptions};
use crate::estimate::{dp_comm_time_s, optimizer_time_s};
use crate::memory;
use crate::stages::StageCost;

/// Compute seconds given the stand-in rank below: more than any exchange, so that every
/// overlap the runtime has hides all it can.
const UNBOUNDED_COMPUTE_S: f64 = 1e30;

/// What the floor depends on: the degrees but the virtual stages, the micro-batch size, the
/// expert degrees and the parameters of all layers with the routed experts' among them (with the
/// ZeRO stage, not the schedule, stages per rank nor recompute mode, which many keys share).
type FloorKey = ([u64; 4], u64, u64, u64, u64, u64);

/// [`tail_floor_s`] of many keys, each distinct floor computed once: a scan's hundreds of
/// thousands of keys share a few thousand. The space enumerates a configuration's schedules,
/// stages per rank, recompute modes and ZeRO stages together, ZeRO innermost: the last floor of
/// each ZeRO stage is checked before the map.
#[derive(Default)]
pub(super) struct TailFloors {
    last: [Option<(FloorKey, f64)>; 4],
    all: HashMap<(FloorKey, u8), f64>,
}

impl TailFloors {
    /// [`tail_floor_s`] of `key`.
    pub fn get(
        &mut self,
        profile: &AnalyticProfile,
        opts: &SearchOptions,
        key: &Key,
        table: &LayerTable,
    ) -> f64 {
        let (w, d) = (table.weight_params(), key.degrees);
        let k = (
            [d.tp, d.pp, d.dp, d.cp],
            key.micro_batch_size,
            key.ep,
            key.etp,
            w.all,
            w.experts,
        );
        let slot = (key.zero_stage as usize).min(3);
        if let Some((last, floor)) = self.last[slot] {
            if last == k {
                return floor;
            }
        }
        let floor = *self
            .all
            .entry((k, key.zero_stage))
            .or_insert_with(|| tail_floor_s(profile, opts, key, table));
        self.last[slot] = Some((k, floor));
        floor
    }
}

/// A lower bound on the closed form's tail of `key` with any split, seconds: the tail of a
/// stand-in rank holding the mean parameters of the pipeline ranks (the dense ones only under
/// ZeRO 0–2's bucketed exchange), as one layer, with compute enough to hide every
/// overlapped exchange.
///
/// Why it is a bound: the closed form takes the largest tail over the ranks. Each rank's tail
/// grows with its parameters (ring collectives are affine in bytes, with a latency term per
/// collective, Adam linear), so under ZeRO 0–2 the rank with the most dense parameters has at
/// least the mean's tail (its routed experts only add), and exchanged layer by layer (per
/// micro-batch, or once per step under a pipeline), where the tail is affine in all of a rank's
/// parameters, the largest tail is at least the mean rank's;
/// one collective per layer costs at least one collective of the same bytes (latencies add);
/// and exposed communication only falls as compute grows
/// ([`autopp_hardware::Efficiency::exposed_comm_s`]).
pub(super) fn tail_floor_s(
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    key: &Key,
    table: &LayerTable,
) -> f64 {
    let weights = table.weight_params();
    let d = key.degrees;
    let experts = weights.experts.min(weights.all);
    let dense = (weights.all - experts) / d.pp.max(1);
    // Exchanged layer by layer as ZeRO 3 is (ZeRO 3, and FSDP at ZeRO 2: per micro-batch, or
    // once per step under a pipeline), every parameter travels over the data-parallel group,
    // the routed experts' scaled by a constant: the tail is affine in the rank's parameters,
    // and the largest is at least the mean. Under ZeRO 0–2 the routed experts go over their
    // own group, which a rank without any skips (no latency): only the dense parameters are
    // counted.
    let layer_by_layer = key.zero_stage >= 3
        || (key.zero_stage == 2 && memory::StackMemory::of(opts.settings.runtime.stack).fsdp);
    let experts = if layer_by_layer {
        experts / d.pp.max(1)
    } else {
        0
    };
    let rank = StageCost {
        params: dense + experts,
        expert_params: experts,
        forward_compute_s: UNBOUNDED_COMPUTE_S,
        backward_input_compute_s: UNBOUNDED_COMPUTE_S,
        ..StageCost::default()
    };
    let config = config_of(key, opts, None);
    let link = dp_link_of(profile, opts, key);
    let m = shape_of(key, opts).3;
    dp_comm_time_s(profile, &config, &[&rank], &link, m)
        + optimizer_time_s(profile, &config, &[&rank], dense + experts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimate::evaluate;
    use crate::framework::Framework;
    use crate::search::space;
    use crate::search::table::{group_of, layer_tables};
    use autopp_hardware::{hardware, Cluster, Precision};
    use autopp_models::CollectiveKind::{AllGather, ReduceScatter};

    fn setup(preset: &str, gpus: u64) -> (autopp_models::Model, AnalyticProfile) {
        let model = autopp_models::load(preset).expect("preset");
        let gpu = hardware::gpu("h100-sxm").expect("gpu");
        let cluster = Cluster::new(gpu, gpus, 8, None).expect("cluster");
        let profile = AnalyticProfile::new(cluster, Precision::Bf16).expect("profile");
        (model, profile)
    }

    /// Under every framework's runtime, for every configuration of a dense and a MoE model
    /// that evaluates, the floor is at most the tail the estimate adds to the makespan (the
    /// slowest rank's data-parallel exchange and optimizer step, with the even split).
    #[test]
    fn floor_is_at_most_the_estimates_tail() {
        for (preset, gpus, batch) in [("llama2-13b", 16, 64), ("mixtral-8x7b", 16, 64)] {
            let (model, profile) = setup(preset, gpus);
            for fw in [
                Framework::Megatron,
                Framework::Torchtitan,
                Framework::Deepspeed,
            ] {
                let mut opts = SearchOptions::new(fw, batch, 8);
                opts.settings.runtime = fw.runtime();
                let keys = space::enumerate(&model, gpus, batch, &opts.limits, &opts.fixed);
                let tables = layer_tables(&model, &profile, &opts, &keys).expect("tables");
                let mut checked = 0;
                for key in keys.iter().step_by(7) {
                    let Some(table) = tables.get(&group_of(key)) else {
                        continue;
                    };
                    let Ok(e) = evaluate(&model, &profile, &config_of(key, &opts, None)) else {
                        continue;
                    };
                    let tail = (e.dp_comm_s.iter().zip(&e.optimizer_s))
                        .map(|(d, o)| d + o)
                        .fold(0.0, f64::max);
                    let floor = tail_floor_s(&profile, &opts, key, table);
                    assert!(
                        floor <= tail * (1.0 + 1e-9),
                        "{preset} {fw:?} {key:?}: floor {floor} s over the tail {tail} s"
                    );
                    checked += 1;
                }
                assert!(checked > 10, "{preset} {fw:?}: {checked} checked");
            }
        }
    }

    /// FSDP at ZeRO 2 without a pipeline (torchtitan: `reshard_after_forward=False`) gathers
    /// the weights and reduce-scatters the fp32 gradients every micro-batch; with compute
    /// hiding all it can, `m · (1 − overlap) · (AG(2 B·P) + RS(4 B·P))` plus Adam over the
    /// rank's `P / dp` (`estimate::dp_comm_time_s`, `estimate::optimizer_time_s`).
    #[test]
    fn fsdp_zero2_floor_hand_worked() {
        let (model, profile) = setup("llama2-13b", 8);
        let mut opts = SearchOptions::new(Framework::Torchtitan, 32, 8);
        opts.settings.runtime = Framework::Torchtitan.runtime();
        let keys = space::enumerate(&model, 8, 32, &opts.limits, &opts.fixed);
        let key = keys
            .iter()
            .find(|k| k.degrees.dp == 8 && k.zero_stage == 2 && k.micro_batch_size == 1)
            .expect("a dp-8 ZeRO-2 key");
        let tables = layer_tables(&model, &profile, &opts, &keys).expect("tables");
        let table = &tables[&group_of(key)];
        let p = table.weight_params().all;
        let link = opts.settings.runtime.ring_link(&profile.cluster, 8, 1);
        let comm = profile.collective_time_s(AllGather, 2 * p, 8, &link)
            + profile.collective_time_s(ReduceScatter, 4 * p, 8, &link);
        let exposed = (1.0 - profile.efficiency.comm_overlap) * comm;
        let m = 32.0 / 8.0;
        let adam =
            profile.memory_bound_time_s(crate::estimate::ADAM_BYTES_PER_PARAM * (p / 8) as f64);
        let floor = tail_floor_s(&profile, &opts, key, table);
        assert!(
            (floor - (m * exposed + adam)).abs() < 1e-12 * floor,
            "{floor}"
        );
    }
}
