//! The default answer (`--framework any`): the best plan that some framework runs.
//!
//! [`plans`] searches each framework of [`Framework::RUNNABLE`] in its own space and with its
//! own runtime (the searches of `--framework megatron`, `torchtitan`, `deepspeed`, with the
//! same flags), and ranks their answers together, so that the default is never slower than any
//! of them. Every answer carries the frameworks that run it ([`launch::runs_on`], the rules of
//! `autopp launch`). Plans that mix features of different frameworks come only from the
//! `any-mix` space, which is a single search.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use autopp_hardware::AnalyticProfile;
use autopp_models::Model;
use rayon::prelude::*;

use super::ceiling::Ceiling;
use super::evaluator::Schedules;
use super::{
    exact_config, prefer_simple, rank_cmp, search, search_under, time_of, SearchOptions,
    SearchResult,
};
use crate::config::{ParallelConfig, PlanError};
use crate::estimate::{
    evaluate_scheduled_again, schedule_for, shard_spec, Detail, Estimate, LayerList,
};
use crate::framework::Framework;
use crate::launch;
use crate::planfile::PlanFile;

/// One answer of a search (the best or an alternative) beside its plan.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The framework whose space and runtime the plan was found in and predicted with (`any`
    /// for the `any-mix` space).
    pub made_for: Framework,
    /// Its exact configuration (split, recompute counts, settings): what its plan file holds.
    pub config: ParallelConfig,
    /// The frameworks that run it ([`launch::runs_on`]), in [`Framework::RUNNABLE`] order.
    pub runs_on: Vec<Framework>,
}

impl Answer {
    /// `megatron, torchtitan`, or `none` when no framework runs the plan.
    pub fn runs_on_label(&self) -> String {
        if self.runs_on.is_empty() {
            return "none".to_string();
        }
        let names: Vec<&str> = self.runs_on.iter().map(|f| f.as_str()).collect();
        names.join(", ")
    }
}

/// What [`plans`] found: the search's result and, for the best and each alternative in order,
/// its [`Answer`].
#[derive(Debug, Clone)]
pub struct Plans {
    /// The best plan, the alternatives and the search's figures (summed over the frameworks).
    pub result: SearchResult,
    /// `answers[0]` is the best's, then one per alternative.
    pub answers: Vec<Answer>,
}

/// The search `--framework` asks for: with `runnable` (`--framework any`), the best plan some
/// framework runs, from the union of the frameworks' spaces; otherwise `opts`' own space (a
/// framework's, or everything autopp models under `any-mix`). When no framework can run the
/// model or the pins at all (a layer list, a pin every framework refuses), the runnable search
/// is the `opts` space, and its answers say that no framework runs them.
pub fn plans(
    model: &Model,
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    runnable: bool,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<Plans, PlanError> {
    let per: Vec<SearchOptions> = match runnable {
        // each framework's search answers one alternative more than is shown: with its best
        // and the tolerance's simplest that makes the `top_k + 2` runs the shared ceiling
        // needs (see [`Ceiling`]), so that the frameworks searched after the first skip what
        // cannot beat its answers; the merge still shows `top_k`, the fastest of all answers
        true => Framework::RUNNABLE
            .into_iter()
            .filter_map(|fw| framework_options(model, opts, fw))
            .map(|o| SearchOptions {
                top_k: o.top_k + 1,
                ..o
            })
            .collect(),
        false => Vec::new(),
    };
    if per.is_empty() {
        let result = search(model, profile, opts, progress)?;
        let all: Vec<&Estimate> = std::iter::once(&result.best)
            .chain(&result.alternatives)
            .collect();
        let answers = all
            .into_iter()
            .map(|e| answer(model, profile, opts, e))
            .collect::<Result<_, _>>()?;
        return Ok(Plans { result, answers });
    }
    united(model, profile, opts, &per, progress)
}

/// `opts` restricted to `framework`'s space and runtime (what `plan --framework NAME` with the
/// same flags searches), or `None` when the framework cannot run the model, a pin or any of the
/// schedules asked for.
pub fn framework_options(
    model: &Model,
    opts: &SearchOptions,
    framework: Framework,
) -> Option<SearchOptions> {
    launch::check_model(model, opts.settings.precision, framework).ok()?;
    framework.check_pins(&opts.fixed).ok()?;
    // a pinned cp whose 2·cp chunks do not cut the sequence: the framework runs none of it
    if let Some(cp) = opts.fixed.degrees.cp.filter(|&c| c > 1) {
        if !framework.cp_cuts(model.seq_length(), cp) {
            return None;
        }
    }
    let schedules: Vec<_> = opts
        .limits
        .schedules
        .iter()
        .copied()
        .filter(|&k| framework.runs(k))
        .collect();
    if schedules.is_empty() {
        return None;
    }
    let mut o = opts.clone();
    o.limits.framework = framework;
    o.limits.schedules = schedules;
    o.settings.runtime = framework.runtime();
    o.even_split_only |= !framework.uneven_layouts();
    Some(o)
}

/// The frameworks' searches, one after the other (each in parallel inside), their answers
/// ranked together. Each search skips what cannot beat the runnable answers of those before it
/// (see [`Ceiling`]), which leaves the ranked answers as they would be without skipping.
fn united(
    model: &Model,
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    per: &[SearchOptions],
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<Plans, PlanError> {
    let start = Instant::now();
    let done: Vec<AtomicUsize> = per.iter().map(|_| AtomicUsize::new(0)).collect();
    let total: Vec<AtomicUsize> = per.iter().map(|_| AtomicUsize::new(0)).collect();
    let sum = |v: &[AtomicUsize]| v.iter().map(|a| a.load(Ordering::Relaxed)).sum::<usize>();
    let shared = Ceiling::new(opts);
    // a shape's schedule is the same whatever the framework: generated once for all
    let schedules = Schedules::default();
    let mut results: Vec<Result<Found, PlanError>> = Vec::with_capacity(per.len());
    // every framework's space counts, searched or skipped as unable to beat the others
    let mut candidates = 0;
    // and what more memory would buy, from searches none of whose candidates fits
    let mut unfit: Vec<Estimate> = Vec::new();
    for (i, o) in per.iter().enumerate() {
        let progress = |d, t| {
            done[i].store(d, Ordering::Relaxed);
            total[i].store(t, Ordering::Relaxed);
            progress(sum(&done), sum(&total));
        };
        // the answers are detailed after the ranking, only those shown
        let searched = search_under(model, profile, o, &progress, (&shared, &schedules), None);
        candidates += searched.candidates;
        unfit.extend(searched.unfit);
        let found = match searched.result {
            Ok(r) => {
                let answers = offer_runnable(model, profile, o, &r, &shared)?;
                Ok((r, o, answers))
            }
            Err(e) => Err(e),
        };
        results.push(found);
    }
    let mut first_error = None;
    let mut found: Vec<Found> = Vec::new();
    for (r, o) in results.into_iter().zip(per) {
        match r {
            Ok(r) => found.push(r),
            Err(e) => {
                first_error.get_or_insert((e, o));
            }
        }
    }
    if found.is_empty() {
        return Err(match first_error {
            // the error shown, with the GPU count its framework needs
            Some((e, o)) => super::errors::with_gpu_count(e, model, profile, o),
            None => PlanError::Schedule("internal: no framework was searched".into()),
        });
    }
    merge(model, profile, opts, found, (start, candidates), unfit)
}

/// One ranking of every framework's answers (each framework's fastest included when its
/// tolerance passed it over), plans that no framework runs left out unless nothing else is
/// left; the simplest within the tolerance first, then `top_k` alternatives.
fn merge(
    model: &Model,
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    found: Vec<Found>,
    (start, candidates): (Instant, usize),
    mut unfit: Vec<Estimate>,
) -> Result<Plans, PlanError> {
    let simulated = found.iter().map(|(r, _, _)| r.simulated).sum();
    let mut pool: Vec<(Estimate, Answer)> = Vec::new();
    for (r, _, answers) in found {
        let all = std::iter::once(r.best)
            .chain(r.alternatives)
            .chain(r.passed_over);
        pool.extend(all.zip(answers));
        unfit.extend(r.fastest_unfit);
    }
    pool.sort_by(|a, b| rank_cmp(&a.0, &b.0));
    // the same plan found by two frameworks: the faster prediction stands for it
    let mut answered: Vec<(Estimate, Answer)> = Vec::new();
    for (e, a) in pool {
        if !answered.iter().any(|(k, _)| k.result.plan == e.result.plan) {
            answered.push((e, a));
        }
    }
    if answered.iter().any(|(_, a)| !a.runs_on.is_empty()) {
        answered.retain(|(_, a)| !a.runs_on.is_empty());
    }
    let (estimates, answers): (Vec<Estimate>, Vec<Answer>) = answered.into_iter().unzip();
    let plans: Vec<_> = estimates.iter().map(|e| e.result.plan.clone()).collect();
    let (ranked, passed_over) = prefer_simple(estimates, opts.tolerance);
    let mut ranked = ranked.into_iter().take(opts.top_k + 1);
    let best = ranked.next().ok_or_else(|| {
        PlanError::Schedule("internal: the frameworks' searches found no plan".into())
    })?;
    let alternatives: Vec<Estimate> = ranked.collect();
    // plans are distinct (see above): each answer is found again by its plan
    let found: Vec<(&Estimate, Answer)> = std::iter::once(&best)
        .chain(&alternatives)
        .filter_map(|e| {
            let i = plans.iter().position(|p| *p == e.result.plan)?;
            Some((e, answers[i].clone()))
        })
        .collect();
    // the shown plans in full detail (the searches left them as simulated)
    let shown = found
        .par_iter()
        .with_max_len(1)
        .map(|(e, a)| detailed(model, profile, &a.config, e))
        .collect::<Result<Vec<_>, _>>()?;
    let answers: Vec<Answer> = found.into_iter().map(|(_, a)| a).collect();
    let mut shown = shown.into_iter();
    let best = shown.next().unwrap_or(best);
    let alternatives: Vec<Estimate> = shown.collect();
    let fastest_unfit = unfit
        .into_iter()
        .filter(|u| time_of(u) < time_of(&best))
        .min_by(|a, b| time_of(a).total_cmp(&time_of(b)));
    let result = SearchResult {
        best,
        alternatives,
        passed_over,
        fastest_unfit,
        candidates,
        simulated,
        elapsed_s: start.elapsed().as_secs_f64(),
    };
    Ok(Plans { result, answers })
}

/// A framework's search: its result, its options, and the [`Answer`]s of its best, its
/// alternatives and the plan it passed over, in that order.
type Found<'o> = (SearchResult, &'o SearchOptions, Vec<Answer>);

/// Records in `shared` the answers of `r` (found under `opts`) that some framework runs: only
/// those are ranked by [`merge`]. Returns the answers of its best, its alternatives and the
/// plan it passed over, in that order.
fn offer_runnable(
    model: &Model,
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    r: &SearchResult,
    shared: &Ceiling,
) -> Result<Vec<Answer>, PlanError> {
    let all = std::iter::once(&r.best)
        .chain(&r.alternatives)
        .chain(&r.passed_over);
    let mut answers = Vec::new();
    for e in all {
        let a = answer(model, profile, opts, e)?;
        if !a.runs_on.is_empty() {
            shared.offer(e);
        }
        answers.push(a);
    }
    Ok(answers)
}

/// `config` evaluated with the breakdown (pipeline sends apart from the bubble): what the
/// search's own answers get, for a plan of a framework's search. `before` is the search's
/// evaluation of it: its schedule is not generated again, nor its simulation with sends run
/// again when the stages cost the same ([`evaluate_scheduled_again`]).
fn detailed(
    model: &Model,
    profile: &AnalyticProfile,
    config: &ParallelConfig,
    before: &Estimate,
) -> Result<Estimate, PlanError> {
    let layers = model.layers(&shard_spec(config))?;
    let s = &before.schedule;
    let d = &config.degrees;
    let same_shape = config.group_size.is_none()
        && (s.kind, s.pp, s.virtual_stages, s.num_microbatches)
            == (
                config.schedule,
                d.pp as usize,
                d.virtual_stages as usize,
                config.num_microbatches() as usize,
            );
    let sched = match same_shape {
        true => Arc::clone(s),
        false => Arc::new(schedule_for(config)?),
    };
    let args = (Detail::Breakdown, sched, model.model_flops_per_sequence()?);
    let layers = LayerList {
        layers: &layers,
        timed: None,
    };
    evaluate_scheduled_again(model, profile, config, layers, args, before)
}

/// The answer of `e`, found under `opts`: its configuration and the frameworks that run it.
fn answer(
    model: &Model,
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    e: &Estimate,
) -> Result<Answer, PlanError> {
    let config = exact_config(e, opts);
    let file = PlanFile::new(e, model, &profile.cluster, &config)?;
    Ok(Answer {
        made_for: opts.limits.framework,
        runs_on: launch::runs_on(&file),
        config,
    })
}
