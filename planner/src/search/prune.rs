//! The space as the search keeps it: every configuration is counted, but only those whose
//! model states can fit ([`below_memory_floor`]) are kept, so that a space where little or
//! nothing fits costs a pass over it rather than layer tables and split DPs for all of it.

use rustc_hash::FxHashMap as HashMap;

use autopp_hardware::AnalyticProfile;
use autopp_models::Model;
use rayon::prelude::*;

use super::errors::{lean_order, LeanOrder, LEANEST};
use super::fp8_gemms::{self, Fp8Gemms};
use super::score::{below_memory_floor, model_states_floor_bytes, WeightParams};
use super::table::Firsts;
use super::{config_of, space, Key, SearchOptions};
use crate::degrees::Degrees;
use crate::estimate::shard_spec;

/// The configurations of a search.
pub(super) struct Space {
    /// Those that clear the memory floor, in the order of [`space::visit`], in parts of at most
    /// [`PART`] keys: a space of hundreds of thousands of keys is neither copied as one vector
    /// grows nor joined from the tensor-parallel degrees' enumerations.
    pub parts: Vec<Vec<Key>>,
    /// Every configuration enumerated, kept or not.
    pub candidates: usize,
    /// The first kept key of each layer sharding, in no particular order (found as the keys
    /// are kept: what the layer tables are built from, see [`super::table::tables_of`]).
    pub firsts: Vec<Key>,
}

impl Space {
    /// The kept configurations, in enumeration order.
    #[cfg(test)]
    pub fn keys(&self) -> impl Iterator<Item = &Key> {
        self.parts.iter().flatten()
    }
}

/// Keys per part of [`Space::parts`].
pub(super) const PART: usize = 8192;

/// The weight sharding of a key, (tp, ep, etp): all that a layer table's parameter count
/// depends on.
type WeightKey = (u64, u64, u64);

fn weights_of(k: &Key) -> WeightKey {
    (k.degrees.tp, k.ep, k.etp)
}

/// Enumerates the space of `opts` on `gpus` GPUs, keeping the configurations that can fit.
pub(super) fn enumerate(
    model: &Model,
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    gpus: u64,
) -> Space {
    let (limits, fixed) = (&opts.limits, &opts.fixed);
    // one task per tensor-parallel degree, each part in the visit's order (shardings differ
    // between degrees: each task's first keys are the space's)
    let per_tp: Vec<Enumerated> = space::tp_options(model, gpus, limits, fixed)
        .into_par_iter()
        .with_max_len(1)
        .map(|tp| enumerate_tp(model, profile, opts, gpus, tp))
        .collect();
    let mut space = Space {
        candidates: per_tp.iter().map(|p| p.candidates).sum(),
        parts: Vec::new(),
        firsts: Vec::new(),
    };
    for p in per_tp {
        space.parts.extend(p.parts);
        space.firsts.extend(p.firsts.into_keys());
    }
    space
}

/// The leanest [`LEANEST`] configurations of the space of `opts` on `gpus` GPUs, kept or not,
/// leanest first (see [`lean_order`]): what the error says when nothing fits. Only that error
/// needs them, so they are found by a second visit of the space then, not on every search.
pub(super) fn leanest(model: &Model, opts: &SearchOptions, gpus: u64) -> Vec<Key> {
    leanest_orders(model, opts, gpus)
        .into_iter()
        .map(|o| o.8)
        .collect()
}

/// [`leanest`]'s configurations with their places in the [`LeanOrder`].
pub(super) fn leanest_orders(model: &Model, opts: &SearchOptions, gpus: u64) -> Vec<LeanOrder> {
    let (gb, limits, fixed) = (opts.global_batch_size, &opts.limits, &opts.fixed);
    let mut params: HashMap<WeightKey, Option<WeightParams>> = HashMap::default();
    let mut leanest = Vec::with_capacity(LEANEST + 1);
    let gemms = Fp8Gemms::of(model, opts);
    space::visit(model, gpus, gb, limits, fixed, &mut |k| {
        if fp8_gemms::refused(gemms.as_ref(), &k) {
            return;
        }
        let p = *params
            .entry(weights_of(&k))
            .or_insert_with(|| weight_params(model, opts, &k));
        // a sharding the model cannot take is never the leanest
        if let Some(p) = p {
            offer_lean(
                &mut leanest,
                lean_order(&k, model_states_floor_bytes(opts, &k, p)),
            );
        }
    });
    leanest
}

/// The configurations of one tensor-parallel degree (see [`enumerate_tp`]).
struct Enumerated {
    /// Those kept, in parts of [`PART`].
    parts: Vec<Vec<Key>>,
    /// How many were enumerated.
    candidates: usize,
    /// The first kept key of each layer sharding.
    firsts: Firsts,
}

/// [`enumerate`]'s configurations with tensor-parallel degree `tp`.
fn enumerate_tp(
    model: &Model,
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    gpus: u64,
    tp: u64,
) -> Enumerated {
    let mut params: HashMap<WeightKey, Option<WeightParams>> = HashMap::default();
    let mut last: Option<(WeightKey, Option<WeightParams>)> = None;
    let (mut parts, mut candidates): (Vec<Vec<Key>>, usize) = (Vec::new(), 0);
    let mut firsts = Firsts::default();
    // The floor is a function of the floor key alone, and the space is visited one
    // (degrees, ep, etp) at a time with the ZeRO stage innermost: each stage's answer is kept
    // while the rest of the floor key stays.
    let mut floors: (Option<FloorKey>, [Option<bool>; 4]) = (None, [None; 4]);
    let (gb, limits, fixed) = (opts.global_batch_size, &opts.limits, &opts.fixed);
    // what the framework's FP8 GEMMs refuse is not in its space: neither counted nor kept
    let gemms = Fp8Gemms::of(model, opts);
    space::visit_tp(model, (gpus, gb), limits, fixed, tp, &mut |k| {
        if fp8_gemms::refused(gemms.as_ref(), &k) {
            return;
        }
        candidates += 1;
        let w = weights_of(&k);
        let p = match last {
            Some((lw, p)) if lw == w => p,
            _ => {
                let p = *params
                    .entry(w)
                    .or_insert_with(|| weight_params(model, opts, &k));
                last = Some((w, p));
                p
            }
        };
        let f = floor_key(&k);
        if floors.0 != Some(f) {
            floors = (Some(f), [None; 4]);
        }
        // a sharding the model cannot take keeps its keys: the layer tables drop them
        let below = p.is_some_and(|p| match floors.1.get_mut(usize::from(k.zero_stage)) {
            Some(known) => *known.get_or_insert_with(|| below_memory_floor(profile, opts, &k, p)),
            None => below_memory_floor(profile, opts, &k, p),
        });
        if !below {
            firsts.offer(&k);
            if parts.last().is_none_or(|p| p.len() == PART) {
                parts.push(Vec::with_capacity(PART));
            }
            if let Some(part) = parts.last_mut() {
                part.push(k);
            }
        }
    });
    Enumerated {
        parts,
        candidates,
        firsts,
    }
}

/// What [`below_memory_floor`] reads of a key besides its ZeRO stage: (tp, pp, dp, cp, ep,
/// etp), with the weight sharding (tp, ep, etp) its parameters.
type FloorKey = (u64, u64, u64, u64, u64, u64);

fn floor_key(k: &Key) -> FloorKey {
    let d = &k.degrees;
    (d.tp, d.pp, d.dp, d.cp, k.ep, k.etp)
}

/// Keeps `order` among the leanest if it is leaner than one of them, and than every other
/// key of its shape (see [`shape_of`]): the micro-batch sizes and schedules of one shape would
/// otherwise fill the list and hide other shapes, which the error weighs by their real need.
fn offer_lean(leanest: &mut Vec<LeanOrder>, order: LeanOrder) {
    let shape = shape_of(&order.8);
    if let Some(i) = leanest.iter().position(|l| shape_of(&l.8) == shape) {
        if leanest[i] <= order {
            return;
        }
        leanest.remove(i);
    }
    if leanest.len() == LEANEST && leanest.last().is_some_and(|l| *l <= order) {
        return;
    }
    let at = leanest.partition_point(|l| *l <= order);
    leanest.insert(at, order);
    leanest.truncate(LEANEST);
}

/// A key without what only its activations depend on: the micro-batch size, sequence
/// parallelism, the schedule and the stages per rank (the lean order takes the leanest of
/// those first).
fn shape_of(k: &Key) -> Key {
    Key {
        degrees: Degrees {
            virtual_stages: 1,
            ..k.degrees
        },
        micro_batch_size: 1,
        sequence_parallel: false,
        schedule: crate::schedule::ScheduleKind::OneFOneB,
        ..*k
    }
}

/// The layer table's parameter counts ([`super::table::LayerTable::weight_params`]) of `k`'s
/// weight sharding, from one expansion of the model's distinct layers (`None` where the model cannot take the
/// sharding). Parameters do not depend on cp, the micro-batch size or sequence parallelism:
/// the expansion takes the plainest of them.
fn weight_params(model: &Model, opts: &SearchOptions, k: &Key) -> Option<WeightParams> {
    let plain = Key {
        degrees: Degrees { cp: 1, ..k.degrees },
        micro_batch_size: 1,
        sequence_parallel: false,
        ..*k
    };
    // each distinct layer once, counted as often as the list holds it
    let (layers, slot) = model
        .distinct_layers(&shard_spec(&config_of(&plain, opts, None)))
        .ok()?;
    Some(WeightParams {
        all: slot.iter().map(|&j| layers[j].params).sum(),
        experts: slot.iter().map(|&j| layers[j].expert_params).sum(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::Framework;
    use crate::search::table::{group_of, layer_tables};
    use autopp_hardware::{hardware, Cluster, Precision};

    fn setup(gpus: u64) -> (Model, AnalyticProfile, SearchOptions) {
        let model = autopp_models::load("mixtral-8x7b").expect("preset");
        let gpu = hardware::gpu("h100-sxm").expect("gpu");
        let cluster = Cluster::new(gpu, gpus, 8, None).expect("cluster");
        let profile = AnalyticProfile::new(cluster, Precision::Bf16).expect("profile");
        (
            model,
            profile,
            SearchOptions::new(Framework::Megatron, 64, 8),
        )
    }

    /// The floor reads one parameter count per weight sharding: it must equal every layer
    /// table's own count (a MoE model with ep/etp, context parallelism and several micro-batch
    /// sizes), and the pruned space keeps exactly the keys that clear the floor.
    #[test]
    fn weight_params_match_every_table_and_pruning_keeps_what_can_fit() {
        let (model, profile, opts) = setup(16);
        let all = space::enumerate(&model, 16, 64, &opts.limits, &opts.fixed);
        let tables = layer_tables(&model, &profile, &opts, &all).expect("tables");
        assert!(tables.len() > 20, "{} shardings", tables.len());
        let pruned = enumerate(&model, &profile, &opts, 16);
        assert_eq!(pruned.candidates, all.len());
        let pruned_keys: std::collections::HashSet<&Key> = pruned.keys().collect();
        let mut kept = 0;
        for k in &all {
            let Some(table) = tables.get(&group_of(k)) else {
                continue;
            };
            assert_eq!(
                weight_params(&model, &opts, k),
                Some(table.weight_params()),
                "{k:?}"
            );
            if !below_memory_floor(&profile, &opts, k, table.weight_params()) {
                kept += 1;
                assert!(pruned_keys.contains(k), "{k:?} dropped");
            }
        }
        assert_eq!(kept, pruned.keys().count());
        assert!(kept > 0 && kept < all.len(), "{kept} of {}", all.len());
    }

    /// The floor counts model states as `estimate` does: for every configuration of a MoE model
    /// (ep, etp, dp, cp and ZeRO stages varied) on one pipeline rank it equals the exact
    /// weights + gradients + optimizer bytes, the routed experts' states sharded over the
    /// expert-data-parallel group `tp·cp·dp/(ep·etp)` (Megatron-Core's expert
    /// data parallelism), and on several ranks it stays at or below the busiest rank's.
    #[test]
    fn the_floor_is_the_exact_model_states_on_one_rank_and_below_on_several() {
        let (model, profile, opts) = setup(16);
        let all = space::enumerate(&model, 16, 64, &opts.limits, &opts.fixed);
        let (mut exact, mut below, mut experts_apart) = (0, 0, 0);
        for k in all
            .iter()
            .filter(|k| k.recompute == autopp_models::Recompute::Full)
        {
            let Some(params) = weight_params(&model, &opts, k) else {
                continue;
            };
            let c = config_of(k, &opts, None);
            let Ok(e) = crate::estimate::evaluate(&model, &profile, &c) else {
                continue;
            };
            let states = |m: &crate::memory::RankMemory| {
                (m.weights_bytes + m.grads_bytes + m.optimizer_bytes) as f64
            };
            let busiest = e.memory.iter().map(states).fold(0.0, f64::max);
            let floor = super::super::score::model_states_floor_bytes(&opts, k, params);
            if k.degrees.pp == 1 {
                assert!(
                    (floor - busiest).abs() <= 64.0,
                    "{k:?}: {floor} vs {busiest}"
                );
                exact += 1;
                experts_apart += usize::from(k.ep * k.etp != k.degrees.tp && k.zero_stage > 0);
            } else {
                assert!(floor <= busiest + 64.0, "{k:?}: {floor} over {busiest}");
                below += 1;
            }
        }
        assert!(
            exact > 10 && below > 10 && experts_apart > 5,
            "{exact} {below} {experts_apart}"
        );
    }

    /// The leanest configurations are those the sorted space starts with.
    #[test]
    fn leanest_are_the_first_of_the_sorted_space() {
        let (model, _, opts) = setup(8);
        let all = space::enumerate(&model, 8, 64, &opts.limits, &opts.fixed);
        let mut orders: Vec<LeanOrder> = all
            .iter()
            .filter_map(|k| {
                let p = weight_params(&model, &opts, k)?;
                Some(lean_order(k, model_states_floor_bytes(&opts, k, p)))
            })
            .collect();
        orders.sort();
        // the leanest schedule of each shape
        let mut want: Vec<Key> = Vec::new();
        for o in &orders {
            if want.len() < LEANEST && want.iter().all(|w| shape_of(w) != shape_of(&o.8)) {
                want.push(o.8);
            }
        }
        assert_eq!(leanest(&model, &opts, 8), want);
    }
}
