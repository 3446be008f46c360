//! The scan: scoring keys in lower-bound order, a fixed-size chunk at a time, until no later
//! key can enter the shortlist.
//!
//! The shortlist holds the overall best few and the best few of each schedule kind (the closed
//! form's error depends on the schedule, so kinds are compared by simulation, not by it). Kinds
//! whose candidates are all over [`GIVE_UP_FACTOR`] × the best do not hold the scan up.
//!
//! A key's partial-recompute variant costs a second, slower DP, so scoring the key only files
//! that variant under its own lower bound; the variant is scored when the scan reaches that
//! bound, which it often never does.
//!
//! Chunks are fixed and every decision uses only what earlier chunks found, so the keys scored
//! do not depend on the thread count.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::Arc;

use autopp_hardware::AnalyticProfile;
use autopp_models::Model;
use rayon::prelude::*;

use super::bounded::Bounded;
use super::heap::{HeapOrder, Smallest};
use super::score::{below_memory_floor, unfit_base, KeyScorer};
use super::table::{group_of, GroupKey, LayerTable};
use super::{config_of, shape_of, Key, Scored, SearchOptions, GIVE_UP_FACTOR, PER_KIND};
use crate::estimate::check_config;
use crate::schedule::ScheduleKind;

/// Keys scored per parallel chunk.
const SCORE_CHUNK: usize = 256;

/// What the scan scores next: a key, or a key's partial-recompute variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Variant {
    Base,
    Partial,
}

/// One item of the scan: a lower bound on its closed-form time, seconds, and what it is.
type Item = (f64, Key, Variant);

/// What scoring an item gave: the scored candidate, and the key's partial-recompute variant
/// to score later. A pure function of the item.
type Score = (Option<Scored>, Option<Item>);

/// What earlier scans of one search scored, by item (see `Search::exact_candidates`). Filled
/// only when a scan is followed by another: most searches scan once, and hashing and cloning
/// every score for nothing cost more than some scans.
pub(super) type Scores = HashMap<(Key, Variant), Score>;

fn item_cmp(a: &Item, b: &Item) -> Ordering {
    a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2))
}

impl HeapOrder for Item {
    fn order(&self, other: &Self) -> Ordering {
        item_cmp(self, other)
    }
}

/// What the scan needs from the search.
pub(super) struct Scan<'a> {
    pub model: &'a Model,
    pub profile: &'a AnalyticProfile,
    pub opts: &'a SearchOptions,
    pub tables: &'a HashMap<GroupKey, LayerTable>,
    /// In-flight micro-batches per rank of a key's schedule shape (`None`: no schedule).
    pub inflight_of: &'a (dyn Fn(&Key) -> Option<Arc<[u32]>> + Sync),
    /// Candidates the shortlist holds besides each kind's quota.
    pub shortlist: usize,
    /// Keys that did not fit once simulated exactly (see `Search::exact_candidates`).
    pub excluded: &'a HashSet<Key>,
    /// Items scored by earlier scans of the same search.
    pub scores: &'a Scores,
}

/// One item a scan scored, with its score: the candidate as an index into
/// [`Scanned::scored`], and the partial-recompute variant to score later.
type Logged = ((Key, Variant), Option<usize>, Option<Item>);

/// What a scan found: the candidates it scored, and each item it scored with its score, for
/// the scans after it.
#[derive(Default)]
pub(super) struct Scanned {
    pub scored: Vec<Scored>,
    /// One part per chunk scored: most scans are not followed by another, and one vector of
    /// every item grown by doubling copied them over and over for nothing.
    pub log: Vec<Vec<Logged>>,
}

impl Scanned {
    /// Adds the scores of this scan to `scores`.
    pub fn record(&self, scores: &mut Scores) {
        for &(item, at, later) in self.log.iter().flatten() {
            let scored = || at.and_then(|i| self.scored.get(i)).cloned();
            scores.entry(item).or_insert_with(|| (scored(), later));
        }
    }
}

impl Scan<'_> {
    /// Scores `bounded` (keys with their lower bounds, in ascending order) until no later item
    /// can enter the shortlist; `progress(done, total)` is called after each chunk.
    pub fn run(&self, bounded: &mut Bounded, progress: &(dyn Fn(usize, usize) + Sync)) -> Scanned {
        let total = bounded.len();
        let mut next_key = 0;
        // partial variants waiting for their bound to come up, smallest first
        let mut pending: BinaryHeap<Smallest<Item>> = BinaryHeap::new();
        let mut scanned = Scanned::default();
        // the fastest fitting closed forms, overall and per kind: as many as the cutoff reads
        let mut fit_times: Vec<f64> = Vec::new();
        let mut kind_times: HashMap<ScheduleKind, Vec<f64>> = HashMap::default();
        loop {
            let cutoff_s = self.cutoff_s(&fit_times, &kind_times);
            // the next chunk: the smallest items of both queues
            let mut chunk: Vec<Item> = Vec::with_capacity(SCORE_CHUNK);
            while chunk.len() < SCORE_CHUNK {
                let key = bounded
                    .get(next_key)
                    .map(|(bound, key)| (bound, key, Variant::Base));
                let item = match (key, pending.peek()) {
                    (Some(k), Some(p)) if item_cmp(&p.0, &k).is_lt() => pending.pop().map(|p| p.0),
                    (Some(k), _) => {
                        next_key += 1;
                        Some(k)
                    }
                    (None, Some(_)) => pending.pop().map(|p| p.0),
                    (None, None) => None,
                };
                // (an item over the cutoff is dropped: every later one is too)
                match item {
                    Some(item) if item.0 <= cutoff_s => chunk.push(item),
                    _ => break,
                }
            }
            if chunk.is_empty() {
                break;
            }
            let results: Vec<Score> = chunk
                .par_iter()
                .map(|&(_, key, variant)| self.score_item_once(&key, variant))
                .collect();
            let mut log = Vec::with_capacity(chunk.len());
            for (&(bound, key, variant), (s, later)) in chunk.iter().zip(results) {
                let at = s.as_ref().map(|_| scanned.scored.len());
                // the order the scan stops by is a bound (every test's searches check): a
                // fitting key's score is its closed form
                debug_assert!(
                    s.as_ref().is_none_or(|s| {
                        !s.fits || variant != Variant::Base || s.approx_s >= bound * (1.0 - 1e-9)
                    }),
                    "{key:?}: closed form {:?} s under its scan bound {bound} s",
                    s.as_ref().map(|s| s.approx_s)
                );
                log.push(((key, variant), at, later));
                if let Some(s) = s {
                    if s.fits {
                        fit_times.push(s.approx_s);
                        kind_times
                            .entry(s.key.schedule)
                            .or_default()
                            .push(s.approx_s);
                    }
                    scanned.scored.push(s);
                }
                pending.extend(later.map(Smallest));
            }
            scanned.log.push(log);
            fit_times.sort_by(f64::total_cmp);
            fit_times.truncate(self.shortlist);
            for t in kind_times.values_mut() {
                t.sort_by(f64::total_cmp);
                t.truncate(PER_KIND);
            }
            progress(next_key, total);
        }
        progress(total, total);
        scanned
    }

    /// What a candidate must beat to enter the shortlist, from what the scan has found so far
    /// (it only falls as the scan goes on); infinite until the shortlist is full.
    fn cutoff_s(&self, fit_times: &[f64], kind_times: &HashMap<ScheduleKind, Vec<f64>>) -> f64 {
        if self.opts.exhaustive || fit_times.len() < self.shortlist {
            return f64::INFINITY;
        }
        let overall = fit_times[self.shortlist - 1];
        let give_up = GIVE_UP_FACTOR * fit_times[0];
        self.opts
            .limits
            .schedules
            .iter()
            .map(|k| match kind_times.get(k) {
                Some(t) if t.len() >= PER_KIND => t[PER_KIND - 1],
                _ => give_up,
            })
            .fold(overall, f64::max)
            .min(give_up.max(overall))
    }

    /// [`Scan::score_item`], or what an earlier scan found for the item.
    fn score_item_once(&self, key: &Key, variant: Variant) -> Score {
        let partial = Key {
            partial_recompute: true,
            ..*key
        };
        if self.excluded.contains(key) && self.excluded.contains(&partial) {
            return (None, None);
        }
        match self.scores.get(&(*key, variant)) {
            Some(known) => known.clone(),
            None => self.score_item(key, variant),
        }
    }

    /// Scores one item: the key (and files its partial variant for later), or the variant.
    fn score_item(&self, key: &Key, variant: Variant) -> Score {
        let (profile, opts) = (self.profile, self.opts);
        let table = &self.tables[&group_of(key)];
        let m = shape_of(key, opts).3;
        if variant == Variant::Partial {
            let scored = self.inflight_of(key).and_then(|q| {
                KeyScorer::new(profile, opts, key, table, &q, m).and_then(|k| k.partial())
            });
            return (scored, None);
        }
        if below_memory_floor(profile, opts, key, table.weight_params())
            || check_config(self.model, profile, &config_of(key, opts, None)).is_err()
        {
            return (None, None);
        }
        let Some(inflight) = self.inflight_of(key) else {
            return (None, None);
        };
        let base = unfit_base(profile, opts, key, table, &inflight, m).unwrap_or_else(|| {
            KeyScorer::new(profile, opts, key, table, &inflight, m).and_then(|k| k.base())
        });
        match base {
            Some((s, bound)) => (Some(s), bound.map(|b| (b, *key, Variant::Partial))),
            None => (None, None),
        }
    }

    fn inflight_of(&self, key: &Key) -> Option<Arc<[u32]>> {
        (self.inflight_of)(key)
    }
}
