//! `estimate`'s advice: how far one configuration is from the best plan `plan` finds for the
//! same model, cluster and global batch, and the fewest changes to it that close most of that
//! gap, each evaluated with the same cost model.

use autopp_hardware::AnalyticProfile;
use autopp_models::{Model, Recompute};
use serde::Serialize;

use crate::plan::PlanAndPrediction;

use crate::config::{ParallelConfig, PlanError};
use crate::estimate::{evaluate, Estimate};
use crate::framework::Framework;
use crate::report::{Inputs, Margin};
use crate::runtime::Stack;
use crate::schedule::ScheduleKind;
use crate::search::{self, SearchOptions};

/// Share of the gap a fix must recover to be offered (0.7: most of it).
pub const FIX_RECOVERS: f64 = 0.7;

/// Most settings a fix changes at once.
pub const MAX_FIX_CHANGES: usize = 3;

/// A configuration within this fraction of the best plan's time counts as already best (the
/// search's own tie tolerance, 1%).
pub const SAME_AS_BEST: f64 = search::DEFAULT_TOLERANCE;

/// The best plan a search found, as `estimate` quotes it.
#[derive(Debug, Clone, Serialize)]
pub struct BestPlan {
    /// Its configuration in one line (`tp 2 · pp 1 · dp 16 · mbs 2 · 1f1b · sp · ZeRO 2`).
    pub label: String,
    /// Its iteration time, seconds.
    pub iteration_time_s: f64,
    /// The frameworks that run it (empty: none).
    pub runs_on: Vec<Framework>,
}

/// How far the configuration is from the best plan.
#[derive(Debug, Clone, Serialize)]
pub struct Gap {
    /// The best plan of `plan`'s search (framework `any`) for the same model, cluster and batch.
    pub best: BestPlan,
    /// The configuration's iteration time over the best's, minus 1 (0.39: 39% slower; negative
    /// when the configuration is faster, e.g. because it keeps no memory margin).
    pub slower_by: f64,
    /// The configuration fits in memory; when it does not, a fix must make it fit.
    pub fits: bool,
}

/// The fewest changes to the configuration that recover most of the gap.
#[derive(Debug, Clone, Serialize)]
pub struct Fix {
    /// The changes, in words (`recompute none`, `sequence parallel on`, `ZeRO 1`).
    pub changes: Vec<String>,
    /// The changed configuration's iteration time, seconds.
    pub iteration_time_s: f64,
    /// Share of the gap it recovers (1: all of it); for a configuration that does not fit, the
    /// best plan's time over the fix's (1: as fast as the best plan).
    pub recovered: f64,
    /// It recovers at least [`FIX_RECOVERS`] of the gap; `false`: no change of up to
    /// [`MAX_FIX_CHANGES`] settings does, and this is the best of them.
    pub enough: bool,
}

/// The advice on one configuration.
#[derive(Debug, Clone, Serialize)]
pub struct Advice {
    /// Its gap to the best plan; `None` when the search found no plan that fits.
    pub gap: Option<Gap>,
    /// The cheapest fix; `None` when there is no gap to close or nothing helps.
    pub fix: Option<Fix>,
}

/// `estimate --json`: `{"plan", "predicted"}` with `defaults_used`, the [`Inputs`] keys and,
/// when advice was asked for, `gap` and `fix`.
pub fn json(
    r: &PlanAndPrediction,
    used: &[String],
    advice: Option<&Advice>,
    inputs: &Inputs,
) -> serde_json::Value {
    let mut v =
        serde_json::json!({ "plan": r.plan, "predicted": r.predicted, "defaults_used": used });
    if let Some(a) = advice {
        v["gap"] = serde_json::json!(a.gap);
        v["fix"] = serde_json::json!(a.fix);
    }
    inputs.add_to(&mut v);
    v
}

/// `plan`'s search options for the runnable default (`--framework any`) with `c`'s global batch,
/// precision, reserve and attention kernel, on nodes of `gpus_per_node` GPUs of `gpu` with
/// `capacity_bytes` each, keeping the GPU kind's memory margin.
pub fn plan_options(
    c: &ParallelConfig,
    gpus_per_node: u64,
    gpu: &str,
    capacity_bytes: u64,
) -> SearchOptions {
    let mut opts = SearchOptions::new(Stack::Any.family(), c.global_batch_size, gpus_per_node);
    opts.settings.runtime = Stack::Any.runtime();
    opts.settings.precision = c.settings.precision;
    opts.settings.memory_reserve_bytes = c.settings.memory_reserve_bytes;
    opts.settings.flash_attention = c.settings.flash_attention;
    opts.settings.memory_margin_bytes = Margin::new(None, gpu, capacity_bytes)
        .map(|m| m.mem_bytes)
        .unwrap_or(0);
    opts
}

/// The advice on configuration `c` of `model`, estimated as `own`: `plan`'s search for the same
/// model, cluster and batch, then every change of up to [`MAX_FIX_CHANGES`] settings.
pub fn advise(
    model: &Model,
    profile: &AnalyticProfile,
    c: &ParallelConfig,
    own: &Estimate,
) -> Result<Advice, PlanError> {
    let cl = &profile.cluster;
    let opts = plan_options(c, cl.gpus_per_node, &cl.gpu.name, cl.gpu.memory_bytes);
    if crate::requested::check_batch(c.global_batch_size, cl.num_gpus()).is_err() {
        return Ok(Advice {
            gap: None,
            fix: None,
        });
    }
    let plans = match search::plans(model, profile, &opts, true, &|_, _| {}) {
        Ok(p) => p,
        Err(_) => {
            return Ok(Advice {
                gap: None,
                fix: None,
            })
        }
    };
    let best = &plans.answers[0].config;
    let best_s = plans.result.best.result.predicted.iteration_time_s;
    let own_s = own.result.predicted.iteration_time_s;
    let gap = Gap {
        best: BestPlan {
            label: label(best),
            iteration_time_s: best_s,
            runs_on: plans.answers[0].runs_on.clone(),
        },
        slower_by: own_s / best_s - 1.0,
        fits: own.result.predicted.fits,
    };
    let fix = if gap.slower_by > SAME_AS_BEST || !gap.fits {
        let own_s = if gap.fits { own_s } else { f64::INFINITY };
        cheapest_fix(model, profile, c, best, own_s, best_s)
    } else {
        None
    };
    Ok(Advice {
        gap: Some(gap),
        fix,
    })
}

/// One configuration in a line: `tp 2 · pp 1 · dp 16 · mbs 2 · 1f1b · recompute none · sp · ZeRO 2`.
pub fn label(c: &ParallelConfig) -> String {
    let d = &c.degrees;
    let mut o = format!("tp {} · pp {} · dp {}", d.tp, d.pp, d.dp);
    if d.cp > 1 {
        o += &format!(" · cp {}", d.cp);
    }
    if c.experts.ep > 1 || c.experts.etp > 1 {
        o += &format!(" · ep {} · etp {}", c.experts.ep, c.experts.etp);
    }
    o += &format!(" · mbs {}", c.micro_batch_size);
    if d.pp > 1 {
        o += &format!(" · {}", c.schedule.as_str());
        if d.virtual_stages > 1 {
            o += &format!(" v {}", d.virtual_stages);
        }
    }
    o += &format!(" · recompute {}", recompute_name(c.recompute));
    if c.recompute_layers.is_some() {
        o += " (partial)";
    }
    if c.sequence_parallel {
        o += " · sp";
    }
    o + &format!(" · ZeRO {}", c.zero_stage)
}

fn recompute_name(r: Recompute) -> &'static str {
    match r {
        Recompute::None => "none",
        Recompute::Selective => "selective",
        Recompute::Full => "full",
    }
}

/// One change to one setting of a configuration.
#[derive(Debug, Clone, PartialEq)]
enum Change {
    Recompute(Recompute),
    SequenceParallel(bool),
    Zero(u8),
    MicroBatch(u64),
    Schedule(ScheduleKind, u64),
    /// The best plan's tp, pp, dp, cp and experts.
    Degrees(Box<ParallelConfig>),
}

impl Change {
    /// Which setting it changes: two changes of one setting never combine.
    fn knob(&self) -> u8 {
        match self {
            Change::Recompute(_) => 0,
            Change::SequenceParallel(_) => 1,
            Change::Zero(_) => 2,
            Change::MicroBatch(_) => 3,
            Change::Schedule(..) => 4,
            Change::Degrees(_) => 5,
        }
    }

    fn words(&self) -> String {
        match self {
            Change::Recompute(r) => format!("recompute {}", recompute_name(*r)),
            Change::SequenceParallel(on) => {
                format!("sequence parallel {}", if *on { "on" } else { "off" })
            }
            Change::Zero(z) => format!("ZeRO {z}"),
            Change::MicroBatch(b) => format!("micro-batch {b}"),
            Change::Schedule(k, v) if *v > 1 => {
                format!("schedule {} with {v} stages per rank", k.as_str())
            }
            Change::Schedule(k, _) => format!("schedule {}", k.as_str()),
            Change::Degrees(b) => {
                let d = &b.degrees;
                let mut o = format!("tp {} · pp {} · dp {}", d.tp, d.pp, d.dp);
                if d.cp > 1 {
                    o += &format!(" · cp {}", d.cp);
                }
                o
            }
        }
    }

    fn apply(&self, c: &mut ParallelConfig) {
        match self {
            Change::Recompute(r) => {
                c.recompute = *r;
                c.recompute_layers = None;
            }
            Change::SequenceParallel(on) => c.sequence_parallel = *on,
            Change::Zero(z) => c.zero_stage = *z,
            Change::MicroBatch(b) => c.micro_batch_size = *b,
            Change::Schedule(k, v) => {
                c.schedule = *k;
                c.degrees.virtual_stages = *v;
                c.group_size = None;
                c.split = None;
                c.recompute_layers = None;
            }
            Change::Degrees(b) => {
                let v = c.degrees.virtual_stages;
                c.degrees = b.degrees;
                c.degrees.virtual_stages = if b.degrees.pp == 1 { 1 } else { v };
                c.experts = b.experts;
                c.split = None;
                c.recompute_layers = None;
                c.sequence_parallel &= b.degrees.tp > 1;
                if b.degrees.pp == 1 {
                    c.schedule = ScheduleKind::OneFOneB;
                    c.group_size = None;
                }
            }
        }
    }
}

/// The single changes worth trying on `c`, given the best plan `best`.
fn changes(c: &ParallelConfig, best: &ParallelConfig) -> Vec<Change> {
    let fw = c.settings.runtime.stack.family();
    let mut out: Vec<Change> = Recompute::ALL
        .into_iter()
        .filter(|&r| r != c.recompute || c.recompute_layers.is_some())
        .map(Change::Recompute)
        .collect();
    if c.degrees.tp > 1 || best.degrees.tp > 1 {
        out.push(Change::SequenceParallel(!c.sequence_parallel));
    }
    let stages = fw.zero_stages().iter().copied();
    out.extend(stages.filter(|&z| z != c.zero_stage).map(Change::Zero));
    let mut mbs = vec![1, 2, 4, 8, best.micro_batch_size];
    mbs.sort_unstable();
    mbs.dedup();
    let other_mbs = mbs.into_iter().filter(|&b| b != c.micro_batch_size);
    out.extend(other_mbs.map(Change::MicroBatch));
    let mut schedules = vec![(ScheduleKind::OneFOneB, 1)];
    if c.degrees.pp > 1 {
        schedules.push((ScheduleKind::Interleaved1F1B, 2));
    }
    if best.degrees.pp > 1 {
        schedules.push((best.schedule, best.degrees.virtual_stages));
    }
    schedules.dedup();
    let current = (c.schedule, c.degrees.virtual_stages);
    let schedules = schedules.into_iter().filter(|&s| s != current);
    out.extend(
        schedules
            .filter(|&(k, _)| fw.runs(k))
            .map(|(k, v)| Change::Schedule(k, v)),
    );
    let (d, b) = (&c.degrees, &best.degrees);
    if (d.tp, d.pp, d.dp, d.cp) != (b.tp, b.pp, b.dp, b.cp) || c.experts != best.experts {
        out.push(Change::Degrees(Box::new(best.clone())));
    }
    out
}

/// The fewest changes (up to [`MAX_FIX_CHANGES`]) to `c` whose configuration fits and recovers
/// [`FIX_RECOVERS`] of the gap from `own_s` (infinite: `c` does not fit) to `best_s`, the fastest of those; else the fastest
/// change set of any size that helps at all.
fn cheapest_fix(
    model: &Model,
    profile: &AnalyticProfile,
    c: &ParallelConfig,
    best: &ParallelConfig,
    own_s: f64,
    best_s: f64,
) -> Option<Fix> {
    let all = changes(c, best);
    let time = |set: &[&Change]| -> Option<f64> {
        let mut changed = c.clone();
        set.iter().for_each(|ch| ch.apply(&mut changed));
        let e = evaluate(model, profile, &changed).ok()?;
        let p = &e.result.predicted;
        p.fits.then_some(p.iteration_time_s)
    };
    // a configuration that does not fit is as slow as can be: any change that makes it fit
    // helps, and one within 1 − FIX_RECOVERS of the best plan's time is enough
    let fits = own_s.is_finite();
    let target = match fits {
        true => own_s - FIX_RECOVERS * (own_s - best_s),
        false => best_s * (2.0 - FIX_RECOVERS),
    };
    let mut fallback: Option<(Vec<&Change>, f64)> = None;
    for size in 1..=MAX_FIX_CHANGES {
        let mut found: Option<(Vec<&Change>, f64)> = None;
        for set in combinations(&all, size) {
            let Some(t) = time(&set) else { continue };
            if t >= own_s {
                continue;
            }
            let better = |f: &Option<(Vec<&Change>, f64)>| f.as_ref().is_none_or(|(_, ft)| t < *ft);
            if t <= target && better(&found) {
                found = Some((set.clone(), t));
            }
            if better(&fallback) {
                fallback = Some((set, t));
            }
        }
        if let Some((set, t)) = found {
            return Some(fix(&set, t, own_s, best_s, true));
        }
    }
    fallback.map(|(set, t)| fix(&set, t, own_s, best_s, false))
}

fn fix(set: &[&Change], t: f64, own_s: f64, best_s: f64, enough: bool) -> Fix {
    Fix {
        changes: set.iter().map(|c| c.words()).collect(),
        iteration_time_s: t,
        recovered: match own_s.is_finite() {
            true => (own_s - t) / (own_s - best_s),
            false => best_s / t,
        },
        enough,
    }
}

/// Every set of `size` changes of different settings, in the order of `all`.
fn combinations(all: &[Change], size: usize) -> Vec<Vec<&Change>> {
    let mut out = Vec::new();
    let mut stack: Vec<(usize, Vec<&Change>)> = vec![(0, Vec::new())];
    while let Some((start, set)) = stack.pop() {
        if set.len() == size {
            out.push(set);
            continue;
        }
        for (i, ch) in all.iter().enumerate().skip(start) {
            if set.iter().all(|s| s.knob() != ch.knob()) {
                let mut next = set.clone();
                next.push(ch);
                stack.push((i + 1, next));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combinations_never_change_one_setting_twice() {
        let all = [
            Change::Recompute(Recompute::None),
            Change::Recompute(Recompute::Full),
            Change::Zero(1),
            Change::MicroBatch(2),
        ];
        // pairs: 2 recompute × zero, 2 recompute × mbs, zero × mbs = 5
        assert_eq!(combinations(&all, 2).len(), 5);
        // triples: 2 recompute × zero × mbs = 2
        assert_eq!(combinations(&all, 3).len(), 2);
        assert_eq!(combinations(&all, 1).len(), 4);
    }

    #[test]
    fn a_fix_says_how_much_of_the_gap_it_recovers() {
        let z = Change::Zero(1);
        // own 90 s, best 60 s, the fix 66 s: 24 of the 30 s gap, 80%
        let f = fix(&[&z], 66.0, 90.0, 60.0, true);
        assert!((f.recovered - 0.8).abs() < 1e-12);
        assert_eq!(f.changes, vec!["ZeRO 1".to_string()]);
    }
}
