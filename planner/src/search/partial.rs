//! Partial recompute: fully recompute some transformer layers of each stage and keep the
//! others' activations, choosing the counts jointly with the layer split.
//!
//! Full recompute of a layer trades its activations (all but its input) for one more forward
//! in its backward. Rank 0 holds the most micro-batches in flight, so the best plans recompute
//! more layers on the early ranks and fewer (or move layers) on the late ones. Two solvers:
//!
//! * **Scoring** (thousands of configurations): the split DP with each stage's time raised by
//!   the fewest full recomputes that make the stage fit its share of the rank's budget.
//! * **The shortlist**: an integer program over the transformer layers per stage `c_k` and the
//!   recomputed layers per stage `n_k` (see [`solve`]), solved through `good_lp` with
//!   `microlp` (pure Rust, the default) or HiGHS (the `highs` cargo feature), under each
//!   *rank's* whole budget.
//!
//! Both need the model's layer list to be an embedding, identical transformer layers and a
//! head (every bundled preset); other layer lists get no partial recompute.

use autopp_models::{LayerCost, LayerKind};
use good_lp::{constraint, variable, Expression, ProblemVariables, Solution, SolverModel};

use crate::stages::StageCost;

/// What fully recomputing one transformer layer changes, for one base recompute mode.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PartialModel {
    /// Extra F+B seconds per micro-batch of a fully recomputed layer.
    pub delta_time_s: f64,
    /// Activation bytes per in-flight micro-batch a fully recomputed layer frees.
    pub delta_act_bytes: f64,
    /// Transformer layers in the list (all but the embedding and the head).
    pub num_layers: usize,
}

impl PartialModel {
    /// The per-layer change from `base` to `full` single-layer costs, when the layer list is
    /// an embedding, identical transformer layers and a head, and recomputing frees memory.
    pub fn new(layers: &[LayerCost], base: &[StageCost], full: &[StageCost]) -> Option<Self> {
        let n = layers.len();
        if n < 3
            || layers[0].kind != LayerKind::Embedding
            || layers[n - 1].kind != LayerKind::Head
            || layers[1..n - 1]
                .iter()
                .any(|l| l.kind != LayerKind::Transformer || !l.recomputable)
        {
            return None;
        }
        let time = |c: &StageCost| c.forward_s() + c.backward_s();
        let (b, f) = (&base[1], &full[1]);
        let same = |x: f64, y: f64| (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1e-30);
        let alike = (1..n - 1).all(|i| {
            same(time(&base[i]), time(b))
                && same(time(&full[i]), time(f))
                && base[i].activation_bytes == b.activation_bytes
                && full[i].activation_bytes == f.activation_bytes
                && base[i].params == b.params
        });
        let delta_act_bytes = b.activation_bytes as f64 - f.activation_bytes as f64;
        (alike && delta_act_bytes > 0.0).then(|| PartialModel {
            delta_time_s: (time(f) - time(b)).max(0.0),
            delta_act_bytes,
            num_layers: n - 2,
        })
    }

    /// Transformer layers among layer-list entries `first..=last`.
    pub fn count(&self, first: usize, last: usize) -> u64 {
        let hi = last.min(self.num_layers);
        let lo = first.max(1);
        (hi + 1).saturating_sub(lo) as u64
    }
}

/// The integer program's data, for one configuration (one base mode), per pipeline rank.
#[derive(Debug, Clone)]
pub(crate) struct Problem<'a> {
    /// Pipeline ranks.
    pub pp: usize,
    /// Stages per rank.
    pub virtual_stages: usize,
    /// F+B seconds of one transformer layer in the base mode.
    pub layer_time_s: f64,
    /// What recomputing one layer changes.
    pub partial: &'a PartialModel,
    /// Model-state bytes of one transformer layer.
    pub layer_fixed_bytes: f64,
    /// Activation bytes of one transformer layer per in-flight micro-batch (base mode).
    pub layer_act_bytes: f64,
    /// Per rank: F+B seconds, model-state bytes and activation bytes per in-flight
    /// micro-batch of what it holds besides transformer layers (embedding, head, tied copy).
    pub ends: &'a [(f64, f64, f64)],
    /// Per rank: in-flight micro-batches of each of its stages at its peak.
    pub inflight_per_stage: &'a [f64],
    /// Per rank: bytes for layers (capacity less everything else).
    pub budget_bytes: &'a [f64],
    /// One count for every stage (Megatron-LM).
    pub same_count: bool,
}

/// The program's answer, per rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answer {
    /// Transformer layers per rank.
    pub layers: Vec<u64>,
    /// Fully recomputed transformer layers per rank.
    pub recompute_layers: Vec<u64>,
}

impl Problem<'_> {
    /// The fewest fully recomputed layers that let rank `r` hold `c` transformer layers in
    /// memory, when it can.
    fn needed(&self, r: usize, c: u64) -> Option<u64> {
        let q = self.inflight_per_stage[r];
        let (_, end_fixed, end_act) = self.ends[r];
        let mem = c as f64 * (self.layer_fixed_bytes + q * self.layer_act_bytes)
            + end_fixed
            + q * end_act;
        let over = mem - self.budget_bytes[r];
        if over <= 0.0 {
            return Some(0);
        }
        let per = q * self.partial.delta_act_bytes;
        let n = (over / per).ceil();
        (per > 0.0 && n <= c as f64).then_some(n as u64)
    }

    /// Seconds per micro-batch of rank `r` with `c` layers, `n` of them fully recomputed.
    fn rank_time_s(&self, r: usize, c: u64, n: u64) -> f64 {
        c as f64 * self.layer_time_s + n as f64 * self.partial.delta_time_s + self.ends[r].0
    }

    /// The most layers rank `r` can take within `limit_s` per micro-batch (with `count`
    /// layers recomputed per stage when one count holds for all), and the recompute it needs.
    fn most_layers(&self, r: usize, limit_s: f64, count: Option<u64>) -> Option<(u64, u64)> {
        let v = self.virtual_stages as u64;
        let fits = |c: u64| -> Option<u64> {
            let n = match count {
                None => self.needed(r, c)?,
                Some(k) => {
                    let n = (k * v).min(c);
                    (n >= self.needed(r, c)?).then_some(n)?
                }
            };
            (self.rank_time_s(r, c, n) <= limit_s).then_some(n)
        };
        // fitting only gets harder with more layers: the largest c is found by bisection
        let (mut lo, mut hi) = (0u64, self.partial.num_layers as u64);
        fits(lo)?;
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if fits(mid).is_some() {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        Some((lo, fits(lo)?))
    }

    /// The canonical answer within `limit_s` per micro-batch: every rank takes the same
    /// number of layers where memory allows (the later ranks one more when they do not
    /// divide), the ones memory limits as many as fit; `None` when that leaves layers over.
    fn canonical(&self, limit_s: f64, count: Option<u64>) -> Option<Answer> {
        let v = self.virtual_stages as u64;
        let most: Vec<(u64, u64)> = (0..self.pp)
            .map(|r| self.most_layers(r, limit_s, count))
            .collect::<Option<_>>()?;
        let total = self.partial.num_layers as u64;
        if most.iter().map(|m| m.0).sum::<u64>() < total {
            return None;
        }
        // the smallest level such that min(most, level) covers all layers
        let covered = |level: u64| most.iter().map(|m| m.0.min(level)).sum::<u64>();
        let (mut lo, mut hi) = (0u64, total);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if covered(mid) >= total {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        let mut layers: Vec<u64> = most.iter().map(|m| m.0.min(lo)).collect();
        // take the surplus back from the earliest ranks at the level (they hold the most
        // micro-batches)
        let mut surplus = covered(lo) - total;
        for c in layers.iter_mut() {
            if surplus == 0 {
                break;
            }
            if *c == lo && lo > 0 {
                *c -= 1;
                surplus -= 1;
            }
        }
        // every stage needs a layer, except one that holds the embedding or the head alone
        let ends_only = |r: usize| u64::from(r == 0) + u64::from(r + 1 == self.pp);
        if layers
            .iter()
            .enumerate()
            .any(|(r, &c)| c + ends_only(r).min(v) < v)
        {
            return None;
        }
        let recompute_layers = layers
            .iter()
            .enumerate()
            .map(|(r, &c)| match count {
                None => self.needed(r, c),
                Some(k) => Some((k * v).min(c)),
            })
            .collect::<Option<Vec<u64>>>()?;
        Some(Answer {
            layers,
            recompute_layers,
        })
    }
}

/// Solves, for `c_r` transformer layers and `n_r` fully recomputed ones on rank `r`:
///
/// ```text
/// minimise   T
/// subject to Σ_r c_r = L;   0 ≤ n_r ≤ c_r;   Megatron-LM: n_r = v·N for one N
///            c_r·t + n_r·Δt + ends_r ≤ T                          (each rank, per micro-batch)
///            c_r·(w + q_r·a) − n_r·q_r·Δa + ends_r ≤ B_r          (each rank's memory)
/// ```
///
/// `T`, the busiest rank's seconds per micro-batch, sets both the steady state (`m·T`) and the
/// fill, so it is the objective. Many answers share the optimal `T`; the one returned is
/// canonical (see `canonical`), so every solver gives the same plan. `None` when nothing
/// fits or the solver fails.
pub(crate) fn solve(p: &Problem<'_>, which: IlpSolver) -> Option<Answer> {
    let l = p.partial.num_layers as f64;
    let v = p.virtual_stages as f64;
    if p.pp == 0 || p.layer_time_s <= 0.0 {
        return None;
    }
    // times in units of one layer's F+B, memory in units of the largest budget: coefficients
    // near 1 (solvers drop coefficients below ~1e-9)
    let t = p.layer_time_s;
    let mem_unit = p
        .budget_bytes
        .iter()
        .map(|b| b.abs())
        .fold(0.0, f64::max)
        .max(f64::MIN_POSITIVE);
    let mut vars = ProblemVariables::new();
    let c: Vec<_> = (0..p.pp)
        .map(|_| vars.add(variable().integer().min(0.0).max(l)))
        .collect();
    // Megatron-LM: one count N for every stage, so n_r = v·N on every rank
    let count = p
        .same_count
        .then(|| vars.add(variable().integer().min(0.0).max(l)));
    let per_rank: Vec<_> = match count {
        Some(_) => Vec::new(),
        None => (0..p.pp)
            .map(|_| vars.add(variable().integer().min(0.0).max(l)))
            .collect(),
    };
    let n = |r: usize| -> Expression {
        match count {
            Some(k) => v * k,
            None => per_rank[r].into(),
        }
    };
    let big_t = vars.add(variable().min(0.0));
    let problem = vars.minimise(big_t);
    let mut constraints = Vec::new();
    let total: Expression = c.iter().copied().sum();
    constraints.push(constraint!(total == l));
    let dt = p.partial.delta_time_s / t;
    for (r, &layers) in c.iter().enumerate() {
        let q = p.inflight_per_stage[r];
        let (end_s, end_fixed, end_act) = p.ends[r];
        constraints.push(constraint!(n(r) <= layers));
        constraints.push(constraint!(layers + dt * n(r) + end_s / t <= big_t));
        let per_layer = (p.layer_fixed_bytes + q * p.layer_act_bytes) / mem_unit;
        let freed = q * p.partial.delta_act_bytes / mem_unit;
        let fixed = (end_fixed + q * end_act) / mem_unit;
        constraints.push(constraint!(
            per_layer * layers - freed * n(r) <= p.budget_bytes[r] / mem_unit - fixed
        ));
    }
    let best_s = optimum(problem, constraints, big_t, which)? * t;
    // a hair of slack: the solvers' floating-point optimum, not another answer
    let limit_s = best_s * (1.0 + 1e-7) + 1e-12;
    match count {
        None => p.canonical(limit_s, None),
        // the smallest count that reaches the optimum
        Some(_) => (0..=p.partial.num_layers as u64).find_map(|k| p.canonical(limit_s, Some(k))),
    }
}

/// The integer-programming solver of the partial-recompute program (`partial::solve`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum IlpSolver {
    /// `microlp`, pure Rust (every build).
    #[default]
    Microlp,
    /// HiGHS (builds with the `highs` cargo feature only).
    Highs,
}

impl IlpSolver {
    /// The solver of this build: HiGHS with the `highs` feature, `microlp` otherwise.
    pub fn of_build() -> IlpSolver {
        if cfg!(feature = "highs") {
            IlpSolver::Highs
        } else {
            IlpSolver::Microlp
        }
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            IlpSolver::Microlp => "microlp",
            IlpSolver::Highs => "HiGHS",
        }
    }
}

/// Solves `problem` with `which` (HiGHS falls back to `microlp` in builds without it), to a
/// zero optimality gap so that the solvers agree; the optimum's `T`, or `None`.
fn optimum(
    problem: good_lp::variable::UnsolvedProblem,
    constraints: Vec<good_lp::Constraint>,
    big_t: good_lp::Variable,
    which: IlpSolver,
) -> Option<f64> {
    #[cfg(feature = "highs")]
    if which == IlpSolver::Highs {
        let mut model = good_lp::highs(problem);
        model.set_verbose(false);
        // The feasibility-jump heuristic costs more than these small programs' whole branch
        // and bound (about 10 ms a solve); the answer is the same optimum without it.
        let model = model
            .set_option("mip_heuristic_run_feasibility_jump", false)
            .set_threads(1)
            .set_mip_rel_gap(0.0)
            .ok()?
            .set_mip_abs_gap(1e-9)
            .ok()?;
        let solution = constraints
            .into_iter()
            .fold(model, |m, c| m.with(c))
            .solve()
            .ok()?;
        return Some(solution.value(big_t));
    }
    let _ = which;
    use good_lp::WithMipGap;
    let model = good_lp::microlp(problem).with_mip_gap(0.0).ok()?;
    let solution = constraints
        .into_iter()
        .fold(model, |m, c| m.with(c))
        .solve()
        .ok()?;
    Some(solution.value(big_t))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 8 ranks of a 96-layer model, rank r holding 8 − r micro-batches: brute force over
    /// every (layers, recompute) per rank agrees with the program's bottleneck.
    #[test]
    fn optimum_matches_brute_force_and_is_canonical() {
        let part = PartialModel {
            delta_time_s: 0.3,
            delta_act_bytes: 3.0,
            num_layers: 12,
        };
        let pp = 3;
        let q = [3.0, 2.0, 1.0];
        let ends = [(0.2, 1.0, 0.5), (0.0, 0.0, 0.0), (0.4, 1.0, 0.5)];
        for budget in [30.0, 40.0, 60.0, 200.0] {
            for same in [false, true] {
                let b = [budget; 3];
                let p = Problem {
                    pp,
                    virtual_stages: 1,
                    layer_time_s: 1.0,
                    partial: &part,
                    layer_fixed_bytes: 2.0,
                    layer_act_bytes: 4.0,
                    ends: &ends,
                    inflight_per_stage: &q,
                    budget_bytes: &b,
                    same_count: same,
                };
                // brute force: every split of 12 layers over 3 ranks and every recompute
                let mut best = f64::INFINITY;
                for c0 in 0..=12u64 {
                    for c1 in 0..=12 - c0 {
                        let cs = [c0, c1, 12 - c0 - c1];
                        let per_rank = |r: usize, n: u64| -> Option<f64> {
                            let c = cs[r];
                            let mem = c as f64 * (2.0 + q[r] * 4.0) - n as f64 * q[r] * 3.0
                                + ends[r].1
                                + q[r] * ends[r].2;
                            (n <= c && mem <= budget).then(|| p.rank_time_s(r, c, n))
                        };
                        if same {
                            for k in 0..=12u64 {
                                let t =
                                    (0..3).map(|r| per_rank(r, k)).collect::<Option<Vec<f64>>>();
                                if let Some(t) = t {
                                    best = best.min(t.into_iter().fold(0.0, f64::max));
                                }
                            }
                        } else {
                            let t = (0..3)
                                .map(|r| {
                                    (0..=cs[r]).filter_map(|n| per_rank(r, n)).reduce(f64::min)
                                })
                                .collect::<Option<Vec<f64>>>();
                            if let Some(t) = t {
                                best = best.min(t.into_iter().fold(0.0, f64::max));
                            }
                        }
                    }
                }
                let answer = solve(&p, IlpSolver::of_build());
                if best.is_infinite() {
                    assert_eq!(answer, None, "budget {budget} same {same}");
                    continue;
                }
                let a = answer.unwrap_or_else(|| panic!("budget {budget} same {same}: none"));
                assert_eq!(a.layers.iter().sum::<u64>(), 12);
                let got = (0..3)
                    .map(|r| p.rank_time_s(r, a.layers[r], a.recompute_layers[r]))
                    .fold(0.0, f64::max);
                assert!(
                    (got - best).abs() < 1e-9,
                    "budget {budget} same {same}: {got} vs brute force {best} ({a:?})"
                );
                if same {
                    let k = a.recompute_layers.iter().max().copied().unwrap_or(0);
                    assert!(a
                        .recompute_layers
                        .iter()
                        .zip(&a.layers)
                        .all(|(&n, &c)| n == k.min(c)));
                }
            }
        }
    }
}
