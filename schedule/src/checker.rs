//! The schedule checker: a schedule is valid when
//!
//! 1. every action names a stage in `0..pp·v` held by the rank whose list it is in (under the
//!    schedule's placement) and a micro-batch in `0..m`;
//! 2. every (stage, micro-batch) runs `F` exactly once and then either `B` exactly once or `I`
//!    and `W` exactly once each;
//! 3. no action comes before one of its inputs ([`deps::inputs`]) on its own rank (`B`/`I`
//!    before its `F`, `W` before its `I`, or the two parts of an overlapped pair depending on
//!    each other);
//! 4. the ranks, each running its list in order with buffered sends (a send never waits for
//!    its receive), never deadlock — checked by running the simulator's dependency engine.

use super::deps::{self, Input, Output};
use super::ir::{Action, ActionKind, Schedule};
use super::simulator::{simulate_metrics, SimCosts, SimError};

/// Why a schedule is invalid. Every message names the rank and the action.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    /// The schedule's sizes do not fit together.
    #[error("invalid schedule: {0}")]
    Shape(String),
    /// An action names a stage or micro-batch outside the schedule, or a stage that another
    /// rank holds.
    #[error("rank {rank}, step {step_index}: {action} {reason}")]
    BadAction {
        /// The rank whose list holds it.
        rank: usize,
        /// Its position in that list.
        step_index: usize,
        /// The action, as text.
        action: String,
        /// What is wrong.
        reason: String,
    },
    /// An action appears twice.
    #[error(
        "rank {rank}, step {step_index}: {action} runs a second time (it already ran on rank \
         {first_rank} at step {first_step}); every action runs exactly once"
    )]
    Duplicate {
        /// The rank of the second occurrence.
        rank: usize,
        /// Its position.
        step_index: usize,
        /// The action, as text.
        action: String,
        /// The rank of the first occurrence.
        first_rank: usize,
        /// Its position.
        first_step: usize,
    },
    /// A required action is missing.
    #[error("rank {rank} never runs {action}: {rule}")]
    Missing {
        /// The rank that holds the stage.
        rank: usize,
        /// The missing action, as text.
        action: String,
        /// The rule it breaks.
        rule: String,
    },
    /// An action comes before its dependency on the same rank.
    #[error(
        "rank {rank}, step {step_index}: {action} runs before its dependency {dependency} \
         (step {dependency_step} of the same rank)"
    )]
    ReversedDependency {
        /// The rank.
        rank: usize,
        /// Position of the early action.
        step_index: usize,
        /// The early action, as text.
        action: String,
        /// The dependency, as text.
        dependency: String,
        /// Position of the dependency.
        dependency_step: usize,
    },
    /// The ranks wait on each other forever.
    #[error(
        "the schedule deadlocks: rank {rank} is stuck at step {step_index} ({step}) waiting for \
         {waits_for}{others}"
    )]
    Deadlock {
        /// The lowest stuck rank.
        rank: usize,
        /// The position of its stuck step.
        step_index: usize,
        /// The stuck step, as text.
        step: String,
        /// The input it waits for, as text.
        waits_for: String,
        /// The other stuck ranks, as text.
        others: String,
    },
}

const NONE: u32 = u32::MAX;

/// Where one action sits: (rank, step index).
#[derive(Clone, Copy)]
struct Loc {
    rank: u32,
    step: u32,
}

const ABSENT: Loc = Loc {
    rank: NONE,
    step: NONE,
};

/// Where each action of a schedule sits, by kind, stage and micro-batch.
struct Locations {
    loc: Vec<Loc>,
    /// Global stages times micro-batches.
    pairs: usize,
    m: usize,
}

impl Locations {
    fn index(&self, stage: usize, i: usize, kind: ActionKind) -> usize {
        kind.index() * self.pairs + stage * self.m + i
    }

    fn of(&self, a: Action) -> Loc {
        self.loc[self.index(a.stage as usize, a.microbatch as usize, a.kind)]
    }

    fn has(&self, stage: usize, i: usize, kind: ActionKind) -> bool {
        self.loc[self.index(stage, i, kind)].rank != NONE
    }

    /// Where `input` of micro-batch `i` was produced, and by which action (the backward-input
    /// part is `B`, or `I` where the backward is split).
    fn input(&self, input: Input, i: usize) -> (Loc, Action) {
        let kind = match input.output {
            Output::Forward => ActionKind::F,
            Output::Backward if self.has(input.stage, i, ActionKind::B) => ActionKind::B,
            Output::Backward => ActionKind::I,
        };
        let a = Action::new(input.stage, kind, i);
        (self.of(a), a)
    }
}

/// Checks that `s` is complete, respects its dependencies and cannot deadlock (see the
/// [module docs](self)).
///
/// ```
/// use autopp_schedule::{check, parse_steps, Placement, Schedule, ScheduleKind};
///
/// let s = Schedule {
///     kind: ScheduleKind::Gpipe,
///     pp: 2,
///     virtual_stages: 1,
///     num_microbatches: 1,
///     placement: Placement::Looped,
///     ranks: vec![parse_steps("0F0").unwrap(), parse_steps("1F0 1B0").unwrap()],
/// };
/// let err = check(&s).unwrap_err().to_string();
/// assert_eq!(err, "rank 0 never runs 0B0: every (stage, micro-batch) runs F, then B (or I then W)");
/// ```
pub fn check(s: &Schedule) -> Result<(), CheckError> {
    check_shape(s)?;
    let locations = locate(s)?;
    check_complete(s, &locations)?;
    check_order(s, &locations)?;
    check_deadlock(s)
}

/// Checks the sizes, and that the schedule lists at least one action per (stage, micro-batch).
fn check_shape(s: &Schedule) -> Result<(), CheckError> {
    let (pp, v, m) = (s.pp, s.virtual_stages, s.num_microbatches);
    if pp == 0 || v == 0 || m == 0 {
        return Err(CheckError::Shape(format!(
            "pp ({pp}), virtual_stages ({v}) and num_microbatches ({m}) must all be at least 1"
        )));
    }
    if s.ranks.len() != pp {
        return Err(CheckError::Shape(format!(
            "it has {} rank lists but pp = {pp}",
            s.ranks.len()
        )));
    }
    let declared = pp.checked_mul(v).and_then(|x| x.checked_mul(m));
    if declared.is_none_or(|pairs| pairs > s.num_actions()) {
        return Err(first_missing(s));
    }
    Ok(())
}

/// Step 1: every action in range, on the rank that holds its stage, and listed once; where
/// each one sits.
fn locate(s: &Schedule) -> Result<Locations, CheckError> {
    let (num_stages, m) = (s.num_stages(), s.num_microbatches);
    let pairs = num_stages * m;
    let mut at = Locations {
        loc: vec![ABSENT; 4 * pairs],
        pairs,
        m,
    };
    for (r, list) in s.ranks.iter().enumerate() {
        for (j, step) in list.iter().enumerate() {
            for a in step.actions() {
                let bad = |reason: String| CheckError::BadAction {
                    rank: r,
                    step_index: j,
                    action: a.to_string(),
                    reason,
                };
                if a.stage as usize >= num_stages {
                    return Err(bad(format!(
                        "names stage {}, outside 0..{num_stages} (pp x virtual_stages)",
                        a.stage
                    )));
                }
                if a.microbatch as usize >= m {
                    return Err(bad(format!(
                        "names micro-batch {}, outside 0..{m}",
                        a.microbatch
                    )));
                }
                let owner = s.rank_of(a.stage as usize);
                if owner != r {
                    return Err(bad(format!(
                        "is on the wrong rank: stage {} belongs to rank {owner} under {:?} \
                         placement",
                        a.stage, s.placement
                    )));
                }
                let k = at.index(a.stage as usize, a.microbatch as usize, a.kind);
                let slot = &mut at.loc[k];
                if slot.rank != NONE {
                    return Err(CheckError::Duplicate {
                        rank: r,
                        step_index: j,
                        action: a.to_string(),
                        first_rank: slot.rank as usize,
                        first_step: slot.step as usize,
                    });
                }
                *slot = Loc {
                    rank: r as u32,
                    step: j as u32,
                };
            }
        }
    }
    Ok(at)
}

/// Step 2: every (stage, micro-batch) runs `F`, then `B` or `I` and `W`.
fn check_complete(s: &Schedule, at: &Locations) -> Result<(), CheckError> {
    for stage in 0..s.num_stages() {
        for i in 0..s.num_microbatches {
            check_pair(s, at, stage, i)?;
        }
    }
    Ok(())
}

/// [`check_complete`] for one (stage, micro-batch).
fn check_pair(s: &Schedule, at: &Locations, stage: usize, i: usize) -> Result<(), CheckError> {
    let name = |k: ActionKind| Action::new(stage, k, i).to_string();
    let missing = |k: ActionKind, rule: String| CheckError::Missing {
        rank: s.rank_of(stage),
        action: name(k),
        rule,
    };
    let has = |k: ActionKind| at.has(stage, i, k);
    if !has(ActionKind::F) {
        return Err(missing(
            ActionKind::F,
            "every (stage, micro-batch) runs F exactly once".into(),
        ));
    }
    match (has(ActionKind::B), has(ActionKind::I), has(ActionKind::W)) {
        (true, false, false) | (false, true, true) => Ok(()),
        (false, false, false) => Err(missing(
            ActionKind::B,
            "every (stage, micro-batch) runs F, then B (or I then W)".into(),
        )),
        (false, true, false) => Err(missing(
            ActionKind::W,
            format!(
                "{} splits its backward, so it needs a W",
                name(ActionKind::I)
            ),
        )),
        (false, false, true) => Err(missing(
            ActionKind::I,
            format!(
                "{} needs the backward-input I before it",
                name(ActionKind::W)
            ),
        )),
        (true, ii, _) => {
            let other = if ii { ActionKind::I } else { ActionKind::W };
            let l = at.of(Action::new(stage, other, i));
            Err(CheckError::BadAction {
                rank: l.rank as usize,
                step_index: l.step as usize,
                action: name(other),
                reason: format!(
                    "splits a backward that {} already runs in full",
                    name(ActionKind::B)
                ),
            })
        }
    }
}

/// Step 3: no action comes before one of its inputs ([`deps::inputs`]) on its own rank.
fn check_order(s: &Schedule, at: &Locations) -> Result<(), CheckError> {
    let num_stages = s.num_stages();
    for (r, list) in s.ranks.iter().enumerate() {
        for (j, step) in list.iter().enumerate() {
            for a in step.actions() {
                let (st, i) = (a.stage as usize, a.microbatch as usize);
                for input in deps::inputs(a.kind, st, num_stages).into_iter().flatten() {
                    let (l, d) = at.input(input, i);
                    if l.rank as usize == r && l.step as usize >= j {
                        return Err(CheckError::ReversedDependency {
                            rank: r,
                            step_index: j,
                            action: if l.step as usize == j {
                                format!("{a} (in the overlapped pair {step})")
                            } else {
                                a.to_string()
                            },
                            dependency: d.to_string(),
                            dependency_step: l.step as usize,
                        });
                    }
                }
            }
        }
    }
    Ok(())
}

/// Step 4: no deadlock, by running the simulator's dependency engine with unit costs.
fn check_deadlock(s: &Schedule) -> Result<(), CheckError> {
    let costs = SimCosts::uniform(s.num_stages(), 1.0, 1.0, 1.0, 1.0, 0.0);
    match simulate_metrics(s, &costs) {
        Ok(_) => Ok(()),
        Err(SimError::Deadlock {
            rank,
            step_index,
            step,
            waits_for,
            others,
        }) => Err(CheckError::Deadlock {
            rank,
            step_index,
            step,
            waits_for,
            others,
        }),
        Err(e) => Err(CheckError::Shape(e.to_string())),
    }
}

/// The first missing `F` or backward of a schedule that lists fewer actions than it has
/// (stage, micro-batch) pairs — found without tables the size of the declared schedule.
fn first_missing(s: &Schedule) -> CheckError {
    let listed: std::collections::HashSet<(usize, usize, ActionKind)> = s
        .ranks
        .iter()
        .flatten()
        .flat_map(|step| step.actions())
        .map(|a| (a.stage as usize, a.microbatch as usize, a.kind))
        .collect();
    let has = |st: usize, i: usize, k: ActionKind| listed.contains(&(st, i, k));
    // Each pair visited with its F present uses up one listed F, so the loop ends within
    // |listed| + 1 pairs.
    for stage in 0..s.num_stages() {
        for i in 0..s.num_microbatches {
            let kind = if !has(stage, i, ActionKind::F) {
                ActionKind::F
            } else if !has(stage, i, ActionKind::B) && !has(stage, i, ActionKind::I) {
                ActionKind::B
            } else {
                continue;
            };
            return CheckError::Missing {
                rank: s.rank_of(stage),
                action: Action::new(stage, kind, i).to_string(),
                rule: "every (stage, micro-batch) runs F, then B (or I then W)".into(),
            };
        }
    }
    CheckError::Shape("the schedule lists fewer actions than it declares".into())
}
