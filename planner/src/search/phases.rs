//! The search's phases, one method each, in the order [`super::search`] runs them: enumerate
//! and tabulate, scan, shortlist, simulate, try other splits, refine, answer, and say what more
//! memory would buy.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::sync::Arc;

use autopp_hardware::AnalyticProfile;
use autopp_models::Model;
use rayon::prelude::*;

use super::bounded::Bounded;
use super::ceiling::{exact_lower_bound_s, same_run, Ceiling};
use super::errors::{no_candidates, nothing_fits};
use super::evaluator::{Evaluator, ScheduleShape, Schedules};
use super::memo::Memo;
use super::score::{lower_bound_s, solve_partial};
use super::table::{group_of, tables_of, GroupKey, LayerTable};
use super::tail_floor::{tail_floor_s, TailFloors};
use super::{
    key_of, prune, rank_cmp, refine, scan, shape_of, time_of, Key, Scored, SearchOptions,
    GIVE_UP_FACTOR, PARTIAL_SOLVED, PARTIAL_SOLVED_MAX_PP, PER_KIND, SECOND_TIER, UNFIT_TRIED,
};
use crate::config::PlanError;
use crate::estimate::{Detail, Estimate};
use crate::schedule::{split, ScheduleKind};

/// A shortlisted candidate with its fastest fitting simulation so far (`None`: none fits).
pub(super) type Simulated<'s> = (Option<Estimate>, &'s Scored);

/// One search: its inputs, the configurations, their layer tables and the caches every phase
/// shares.
pub(super) struct Search<'a> {
    model: &'a Model,
    profile: &'a AnalyticProfile,
    opts: &'a SearchOptions,
    eval: Evaluator<'a>,
    /// This search's own ceiling: plans known so far, and what a candidate must beat.
    own: Ceiling,
    /// The ceiling shared with the other frameworks' searches of `--framework any`.
    shared: &'a Ceiling,
    /// How the answers are evaluated again: in full detail, or left as simulated when the
    /// caller ranks them with other searches' and details only the ones it shows.
    answer_detail: Option<Detail>,
    /// The configurations of the space that clear the memory floor, in enumeration order (in
    /// parts, see [`prune::Space`]), until the scan takes them.
    parts: Vec<Vec<Key>>,
    /// Every configuration of the space, kept or not.
    pub candidates: usize,
    tables: HashMap<GroupKey, LayerTable>,
    /// In-flight micro-batches per rank of each schedule shape, computed when first needed.
    inflight: Memo<ScheduleShape, Option<Arc<[u32]>>>,
    /// The same from generated schedules, by their (truncated) length.
    generated: Memo<ScheduleShape, Option<Vec<u32>>>,
    /// Candidates the shortlist holds besides each kind's quota.
    shortlist: usize,
    /// Candidates simulated exactly so far.
    pub simulated: usize,
    /// Shortlisted keys that did not fit once simulated exactly, left out of the next scan.
    excluded: HashSet<Key>,
    /// What the scans scored, for the scans after the first.
    scores: scan::Scores,
}

/// A search none of whose candidates fits: the error, and the keys its last scan scored.
pub(super) type NothingFits = (PlanError, Vec<Scored>);

/// Scans again without the shortlist when none of it fits once simulated exactly (the closed
/// form's memory was optimistic for all of them), at most this many times. Mixtures of
/// experts need several: their memory floors count routed experts low on purpose (so that
/// they stay lower bounds), and with grouped GEMMs favouring large micro-batches a whole
/// shortlist can be over memory (qwen3-30b-a3b on 64 H100 under `--framework megatron`: the
/// seventh scan's shortlist holds the first plans that fit).
const RESCANS: usize = 16;

impl<'a> Search<'a> {
    /// Enumerates the space and builds one layer table per layer sharding.
    pub fn new(
        model: &'a Model,
        profile: &'a AnalyticProfile,
        opts: &'a SearchOptions,
        shared: &'a Ceiling,
        schedules: &'a Schedules,
        answer_detail: Option<Detail>,
    ) -> Result<Self, PlanError> {
        let eval = Evaluator::new(model, profile, opts, schedules);
        let gpus = profile.cluster.num_gpus();
        if opts.global_batch_size == 0 {
            return Err(PlanError::invalid("--global-batch", "must be at least 1"));
        }
        let space = prune::enumerate(model, profile, opts, gpus);
        if space.candidates == 0 {
            return Err(no_candidates(model, gpus, opts));
        }
        let tables = tables_of(model, profile, opts, space.firsts)?;
        Ok(Search {
            model,
            profile,
            opts,
            eval,
            own: Ceiling::new(opts),
            shared,
            answer_detail,
            parts: space.parts,
            candidates: space.candidates,
            tables,
            inflight: Memo::default(),
            generated: Memo::default(),
            shortlist: (4 * opts.top_k).max(24),
            simulated: 0,
            excluded: HashSet::default(),
            scores: Default::default(),
        })
    }

    /// The in-flight micro-batches per rank of a key's schedule (`None`: no such schedule),
    /// shared: the scan asks for it once per key.
    fn inflight_of(&self, key: &Key) -> Option<Arc<[u32]>> {
        let shape = shape_of(key, self.opts);
        self.inflight.get_or(shape, || {
            let (kind, pp, v, m) = shape;
            // generated schedules by their (truncated) length: many m truncate to the same one
            let generate = |len: u64| {
                self.generated.get_or((kind, pp, v, len), || {
                    kind.generated_peak_inflight(pp, v, len)
                })
            };
            kind.peak_inflight_with(pp, v, m, &generate).map(Arc::from)
        })
    }

    fn table(&self, key: &Key) -> &LayerTable {
        &self.tables[&group_of(key)]
    }

    /// Whether `key`, with any split, could still change the answer (see [`Ceiling`]); always
    /// in the exhaustive search.
    fn may_matter(&self, key: &Key) -> bool {
        if self.opts.exhaustive {
            return true;
        }
        self.iteration_bound_s(key) <= self.limit_s()
    }

    /// A lower bound on the iteration time of `key` with any split, seconds: the mean busy time
    /// of its ranks ([`exact_lower_bound_s`]) plus the least tail any split leaves
    /// ([`tail_floor_s`]: the estimate adds the slowest rank's tail to the makespan).
    fn iteration_bound_s(&self, key: &Key) -> f64 {
        let table = self.table(key);
        exact_lower_bound_s(key, table, self.opts)
            + tail_floor_s(self.profile, self.opts, key, table)
    }

    /// Seconds above which no plan changes this search's answer, nor `--framework any`'s.
    fn limit_s(&self) -> f64 {
        self.own.limit_s().min(self.shared.limit_s())
    }

    /// The keys to scan with their lower bounds on the closed form, in ascending order: the
    /// work spread perfectly over the ranks plus the fill of perfectly even stages, plus the
    /// least tail ([`tail_floor_s`]). Under `--framework any`, keys that cannot beat the other
    /// frameworks' answers ([`Ceiling`], [`Search::iteration_bound_s`]) are left out: their
    /// places in this framework's shortlist go to others, which changes this framework's own
    /// answers but not the merged ones, since none of them could be shown (a search of one
    /// framework has no other answers, and leaves nothing out).
    fn bounded(&mut self) -> Bounded {
        let limit_s = match self.opts.exhaustive {
            true => f64::INFINITY,
            false => self.shared.limit_s(),
        };
        let parts = std::mem::take(&mut self.parts);
        Bounded::new(parts, |run| {
            // keys come in runs of one sharding, alternating between two (without and with
            // sequence parallelism): one of the last two tables found is usually it (`None`: a
            // key without a table)
            let mut recent: [Option<(GroupKey, &LayerTable)>; 2] = [None, None];
            let mut floors = TailFloors::default();
            run.iter()
                .map(|k| {
                    let g = group_of(k);
                    let t = match recent {
                        [Some((tg, t)), _] | [_, Some((tg, t))] if tg == g => t,
                        _ => {
                            let t = self.tables.get(&g)?;
                            recent = [Some((g, t)), recent[0]];
                            t
                        }
                    };
                    let tail_s = floors.get(self.profile, self.opts, k, t);
                    let may_matter = !limit_s.is_finite()
                        || exact_lower_bound_s(k, t, self.opts) + tail_s <= limit_s;
                    may_matter.then(|| lower_bound_s(k, t, self.opts) + tail_s)
                })
                .collect()
        })
    }

    /// Scores `bounded` keys by the split DP and closed form, in that order, until no later
    /// key can enter the shortlist.
    pub fn scan(
        &self,
        bounded: &mut Bounded,
        progress: &(dyn Fn(usize, usize) + Sync),
    ) -> scan::Scanned {
        scan::Scan {
            model: self.model,
            profile: self.profile,
            opts: self.opts,
            tables: &self.tables,
            inflight_of: &|k: &Key| self.inflight_of(k),
            shortlist: self.shortlist,
            excluded: &self.excluded,
            scores: &self.scores,
        }
        .run(bounded, progress)
    }

    /// Scan, shortlist, simulate and try other splits: the scored keys and every candidate's
    /// fastest fitting split. When no shortlisted candidate fits once simulated exactly, the
    /// scan runs again without them (up to [`RESCANS`] times). When none fits, the error with
    /// the keys the last scan scored (what more memory would buy may be among them).
    pub fn exact_candidates(
        &mut self,
        progress: &(dyn Fn(usize, usize) + Sync),
    ) -> Result<(Vec<Scored>, Vec<Estimate>), NothingFits> {
        let mut round = 0;
        let mut bounded = self.bounded();
        loop {
            let scanned = self.scan(&mut bounded, progress);
            let chosen = match self.shortlist(&scanned.scored) {
                Ok(chosen) => chosen,
                Err(e) => return Err((e, scanned.scored)),
            };
            let keys: Vec<Key> = chosen.iter().map(|s| s.key).collect();
            let before = self.simulated;
            let simulated = self.simulate(&chosen);
            match self.other_splits(simulated) {
                Some(exact) => return Ok((scanned.scored, exact)),
                // nothing simulated: every candidate left could not beat the other answers
                None if round >= RESCANS || self.simulated == before => {
                    return Err((self.nothing_fits(), scanned.scored))
                }
                None => {
                    scanned.record(&mut self.scores);
                    self.excluded.extend(keys.iter().flat_map(|k| {
                        [false, true].map(|partial_recompute| Key {
                            partial_recompute,
                            ..*k
                        })
                    }));
                    round += 1;
                }
            }
        }
    }

    /// The candidates to simulate: the overall best by closed form, then each schedule kind's
    /// best not already in (the closed form's error depends on the kind).
    pub fn shortlist<'s>(&self, scored: &'s [Scored]) -> Result<Vec<&'s Scored>, PlanError> {
        let mut fitting: Vec<&Scored> = scored.iter().filter(|s| s.fits).collect();
        fitting.sort_by(Scored::by_closed_form);
        if fitting.is_empty() {
            return Err(self.nothing_fits());
        }
        let quota = if self.opts.exhaustive {
            usize::MAX
        } else {
            self.shortlist
        };
        let mut chosen: Vec<&Scored> = fitting.iter().take(quota).copied().collect();
        let mut per_kind_count: HashMap<ScheduleKind, usize> = HashMap::default();
        for s in &chosen {
            *per_kind_count.entry(s.key.schedule).or_default() += 1;
        }
        for s in fitting.iter().skip(self.shortlist) {
            let count = per_kind_count.entry(s.key.schedule).or_default();
            if *count < PER_KIND {
                *count += 1;
                chosen.push(s);
            }
        }
        Ok(chosen)
    }

    /// Simulates the shortlist exactly, each configuration with its DP split (or the even split
    /// when only that is allowed), fastest first. The fastest few partial-recompute candidates
    /// near the front (by closed form) also get the integer program: their split and recompute
    /// counts chosen jointly, under each rank's whole budget, replace the DP's when they
    /// simulate faster. Solves run beside the simulations.
    pub fn simulate<'s>(&mut self, chosen: &[&'s Scored]) -> Vec<Simulated<'s>> {
        let front_s = chosen
            .iter()
            .map(|s| s.approx_s)
            .fold(f64::INFINITY, f64::min)
            * GIVE_UP_FACTOR;
        let (solved, front_s) = match self.opts.exhaustive {
            true => (usize::MAX, f64::INFINITY),
            false => (PARTIAL_SOLVED, front_s),
        };
        let to_solve: Vec<usize> = chosen
            .iter()
            .enumerate()
            .filter(|(_, s)| s.key.partial_recompute && s.key.degrees.pp <= PARTIAL_SOLVED_MAX_PP)
            .take(solved)
            .filter(|(_, s)| s.approx_s <= front_s)
            .map(|(i, _)| i)
            .collect();
        // (candidate, solve its integer program): the solves, which take longest, first; then
        // the others in closed-form order, in two waves: the second simulates only what the
        // first (and the other frameworks' answers) leave able to change the answer
        let first_wave = (2 * (self.opts.top_k + 2)).min(chosen.len());
        let solves = to_solve.iter().map(|&i| (i, true));
        let wave: Vec<(usize, bool)> = solves
            .chain((0..first_wave).map(|i| (i, false)))
            .filter(|&(i, _)| self.may_matter(&chosen[i].key))
            .collect();
        let mut results = self.simulate_tasks(chosen, &wave);
        let later: Vec<(usize, bool)> = (first_wave..chosen.len())
            .filter(|&i| self.may_matter(&chosen[i].key))
            .map(|i| (i, false))
            .collect();
        results.extend(self.simulate_tasks(chosen, &later));
        self.simulated += results.len();
        let mut tiered: Vec<Simulated<'s>> = chosen.iter().map(|s| (None, *s)).collect();
        for (i, e) in results {
            let slot = &mut tiered[i].0;
            if e.as_ref()
                .is_some_and(|e| slot.as_ref().is_none_or(|d| time_of(e) < time_of(d)))
            {
                *slot = e;
            }
        }
        tiered.sort_by(|a, b| {
            let t = |x: &Option<Estimate>| x.as_ref().map_or(f64::INFINITY, time_of);
            t(&a.0).total_cmp(&t(&b.0)).then(a.1.key.cmp(&b.1.key))
        });
        tiered
    }

    /// Simulates `tasks` (candidate, solve its integer program) in parallel, and records the
    /// fitting plans in this search's ceiling.
    fn simulate_tasks(
        &self,
        chosen: &[&Scored],
        tasks: &[(usize, bool)],
    ) -> Vec<(usize, Option<Estimate>)> {
        let results: Vec<(usize, Option<Estimate>)> = tasks
            .par_iter()
            // one task per split: simulations and solves differ in length by 100×
            .with_max_len(1)
            .map(|&(i, solve)| (i, self.simulate_one(chosen[i], solve)))
            .collect();
        for e in results.iter().filter_map(|(_, e)| e.as_ref()) {
            self.own.offer(e);
        }
        results
    }

    /// One candidate simulated with its DP split, or with the integer program's split and
    /// recompute counts (`solve`); `None` when it does not fit.
    fn simulate_one(&self, s: &Scored, solve: bool) -> Option<Estimate> {
        let (eval, table) = (&self.eval, self.table(&s.key));
        let e = if solve {
            self.inflight_of(&s.key)
                .and_then(|q| solve_partial(self.profile, self.opts, &s.key, table, &q))
                .and_then(|(split, layers)| eval.fitting(&s.key, table, Some(split), Some(layers)))
        } else {
            let (split, layers) = match s.key.partial_recompute {
                true => (Some(s.split.clone()), s.recompute_layers.clone()),
                false => ((!self.opts.even_split_only).then(|| s.split.clone()), None),
            };
            // (a split's own bound does not decide: refining a split that cannot beat the
            // others may give one that does)
            let e = eval.fitting(&s.key, table, split.clone(), layers.clone());
            if let Some(e) = e.as_ref().filter(|_| cfg!(debug_assertions)) {
                // the bounds the search skips by are bounds (every test's searches check)
                let bound = eval
                    .lower_bound_s(&s.key, table, split, layers)
                    .unwrap_or(0.0);
                let whole = exact_lower_bound_s(&s.key, table, self.opts);
                let with_tail = self.iteration_bound_s(&s.key);
                debug_assert!(
                    time_of(e) >= bound * (1.0 - 1e-9)
                        && bound >= whole * (1.0 - 1e-9)
                        && time_of(e) >= with_tail * (1.0 - 1e-9),
                    "{:?}: simulated {} s, busiest rank {bound} s, any split {whole} s, with \
                     the least tail {with_tail} s",
                    s.key,
                    time_of(e)
                );
            }
            e
        };
        e.filter(|e| e.result.predicted.fits)
    }

    /// For the fastest few, the even split and the split that isolates embedding and head as
    /// well (unless only the even split is allowed); every candidate's fastest fitting split,
    /// in the planner's order; `None` when none fits (the caller scans again, or says that
    /// nothing fits).
    pub fn other_splits(&mut self, mut tiered: Vec<Simulated<'_>>) -> Option<Vec<Estimate>> {
        if !self.opts.even_split_only {
            let this = &*self;
            let tier = if self.opts.exhaustive {
                usize::MAX
            } else {
                SECOND_TIER
            };
            let extra: Vec<Option<Estimate>> = tiered
                .par_iter()
                .take(tier)
                .with_max_len(1)
                .map(|(first, s)| this.best_other_split(first, s))
                .collect();
            self.simulated += 2 * extra.len();
            for (slot, better) in tiered.iter_mut().zip(extra) {
                slot.0 = better;
            }
        }
        let mut exact: Vec<Estimate> = tiered.into_iter().filter_map(|(e, _)| e).collect();
        exact.sort_by(rank_cmp);
        (!exact.is_empty()).then_some(exact)
    }

    /// The fastest fitting of `first` and the candidate's even and end-isolating splits.
    fn best_other_split(&self, first: &Option<Estimate>, s: &Scored) -> Option<Estimate> {
        let table = self.table(&s.key);
        if s.key.partial_recompute || !self.may_matter(&s.key) {
            // its split goes with its recompute counts
            return first.clone();
        }
        let even = split::default_split(table.kinds(), s.split.len()).ok();
        let mut others: Vec<Vec<usize>> = even.into_iter().collect();
        if let Some(isolated) = refine::isolate_ends(table.layers(), &s.split) {
            others.push(isolated);
        }
        others.retain(|o| *o != s.split);
        others.dedup();
        // a split whose busiest rank alone is slower than the split in hand is not simulated
        let beat_s = first.as_ref().map_or(f64::INFINITY, time_of);
        others
            .into_iter()
            .filter(|o| {
                let bound = self
                    .eval
                    .lower_bound_s(&s.key, table, Some(o.clone()), None);
                bound.is_some_and(|b| b <= beat_s)
            })
            .filter_map(|o| self.eval.fitting(&s.key, table, Some(o), None))
            .chain(first.clone())
            .filter(|e| e.result.predicted.fits)
            .min_by(|a, b| time_of(a).total_cmp(&time_of(b)))
    }

    /// Keeps each configuration's fastest split and refines the leaders' splits by moving
    /// layers across stage boundaries.
    pub fn refine(&mut self, mut exact: Vec<Estimate>) -> Vec<Estimate> {
        // one leader per configuration: the fastest split of each
        let mut seen = HashSet::default();
        exact.retain(|e| seen.insert(key_of(e)));
        let mut leaders = self.leaders(&exact);
        leaders.retain(|&i| self.may_matter(&key_of(&exact[i])));
        let this = &*self;
        let refined: Vec<(usize, Estimate, usize)> = leaders
            .par_iter()
            .with_max_len(1)
            .map(|&i| {
                let est = &exact[i];
                let (better, n) = refine::refine(&this.eval, est, this.table(&key_of(est)));
                (i, better, n)
            })
            .collect();
        for (i, better, n) in refined {
            self.simulated += n;
            exact[i] = better;
        }
        exact.sort_by(rank_cmp);
        exact
    }

    /// Which of `exact` (distinct configurations, fastest first) to refine: the fastest
    /// [`refine::REFINED_LEADERS`], and each schedule kind's fastest within [`refine::REFINE_FACTOR`]
    /// of the best (a kind's split refines differently); every one when exhaustive.
    fn leaders(&self, exact: &[Estimate]) -> Vec<usize> {
        if self.opts.even_split_only {
            return Vec::new();
        }
        if self.opts.exhaustive {
            return (0..exact.len()).collect();
        }
        let limit = exact.first().map_or(0.0, time_of) * refine::REFINE_FACTOR;
        let mut kinds = HashSet::default();
        (0..exact.len())
            .filter(|&i| {
                let first_of_kind = kinds.insert(exact[i].result.plan.schedule);
                i < refine::REFINED_LEADERS || (first_of_kind && time_of(&exact[i]) <= limit)
            })
            .collect()
    }

    /// The best and the next `top_k` that run differently from every one before them (see
    /// [`same_run`]), evaluated again in full detail (the breakdown separates sends from the
    /// bubble).
    pub fn answers(&self, exact: Vec<Estimate>) -> Result<(Estimate, Vec<Estimate>), PlanError> {
        let mut exact = exact.into_iter();
        let best = exact.next().ok_or_else(|| self.nothing_fits())?;
        let mut alternatives: Vec<Estimate> = Vec::with_capacity(self.opts.top_k);
        for e in exact {
            if alternatives.len() == self.opts.top_k {
                break;
            }
            let shown = std::iter::once(&best).chain(&alternatives);
            if !shown.into_iter().any(|a| same_run(a, &e)) {
                alternatives.push(e);
            }
        }
        let Some(detail) = self.answer_detail else {
            return Ok((best, alternatives));
        };
        let full = |e: &Estimate| -> Result<Estimate, PlanError> {
            let key = key_of(e);
            self.eval.again(e, self.table(&key), detail).ok_or_else(|| {
                PlanError::Schedule(format!("internal: the plan {key:?} no longer evaluates"))
            })
        };
        let mut answers = std::iter::once(&best)
            .chain(&alternatives)
            .collect::<Vec<_>>()
            .par_iter()
            .with_max_len(1)
            .map(|e| full(e))
            .collect::<Result<Vec<_>, _>>()?
            .into_iter();
        let best = answers
            .next()
            .ok_or_else(|| PlanError::Schedule("internal: the best plan was lost".into()))?;
        Ok((best, answers.collect()))
    }

    /// What more memory would buy: the fastest candidate that does not fit but beats the best
    /// plan, `best_time` seconds, among those within twice the GPU's memory (a bigger GPU, not
    /// a fantasy). The first of the [`UNFIT_TRIED`] fastest by closed form that does, in that
    /// order: they are simulated a few at a time (as many as threads), until one does, each
    /// only when its memory and its busiest rank's work allow it ([`Evaluator::beating`]).
    pub fn fastest_unfit(&self, scored: &[Scored], best_time: f64) -> Option<Estimate> {
        let within = self.profile.cluster.gpu.memory_bytes.saturating_mul(2);
        let unfit = scored.iter().filter(|s| !s.fits && s.approx_s < best_time);
        let unfit = Scored::first_by_closed_form(unfit.collect(), UNFIT_TRIED);
        let at_once = rayon::current_num_threads().max(1);
        let beats =
            |e: &Estimate| time_of(e) < best_time && e.result.predicted.peak_memory_bytes <= within;
        let found = unfit.chunks(at_once).find_map(|few| {
            let tried: Vec<Option<Estimate>> = few
                .par_iter()
                .with_max_len(1)
                .map(|s| {
                    let table = self.tables.get(&group_of(&s.key))?;
                    let choice = (Some(s.split.clone()), s.recompute_layers.clone());
                    self.eval
                        .beating(&s.key, table, choice, (best_time, within))
                })
                .collect();
            tried.into_iter().flatten().find(beats)
        })?;
        self.eval
            .again(&found, self.table(&key_of(&found)), Detail::Breakdown)
    }

    /// Ends the search, its layer tables freed on a thread of the pool, out of the caller's
    /// way: thousands of small allocations, many made on other threads, whose freeing took
    /// milliseconds of the plan's wall time.
    pub fn release(mut self) {
        let tables = std::mem::take(&mut self.tables);
        rayon::spawn(move || drop(tables));
    }

    /// What more memory would buy beside the other frameworks' answers, for a search none of
    /// whose candidates fits (`scored`: what it scored): `None` without other answers.
    pub fn unfit_beside_others(&self, scored: &[Scored]) -> Option<Estimate> {
        let fastest = self.shared.fastest_s()?;
        self.fastest_unfit(scored, fastest)
    }

    /// The error when nothing fits: what the leanest configuration needs; or, when the other
    /// frameworks' answers left nothing to simulate, only that (the caller drops it).
    fn nothing_fits(&self) -> PlanError {
        if self.shared.limit_s().is_finite() {
            return PlanError::Schedule(
                "internal: no candidate can beat the other frameworks' answers".into(),
            );
        }
        let leanest = prune::leanest(self.model, self.opts, self.profile.cluster.num_gpus());
        nothing_fits(self.model, self.profile, self.opts, &leanest)
    }
}
