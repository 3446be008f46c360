//! Schedule generators: one function per schedule, each stating its rules as formulas.
//!
//! [`generate`] validates a [`ScheduleSpec`] against the inputs each schedule supports and
//! dispatches to the generator:
//!
//! | schedule | supported inputs |
//! |---|---|
//! | `gpipe`, `1f1b` | any `p ≥ 1`, `m ≥ 1`; `v = 1` |
//! | `looped-bfs` | any `p ≥ 1`, `v ≥ 1`, `m ≥ 1` |
//! | `interleaved-1f1b` | `v = 1` (it is then `1f1b`), or `v ≥ 2` with `p ≤ G ≤ m` and `m mod G = 0` |
//! | `zb-h1`, `zb-h2` | any `p ≥ 2`, `m ≥ 1`; `v = 1` |
//! | `zb-v` | any `p ≥ 2`, `m ≥ 1`; `v = 2` |
//! | `dualpipe-v` | any `p ≥ 1`, `m ≥ 2p`; `v = 2` |
//! | `interleaved-zb` | any `p ≥ 1`, `v ≥ 2`, `m` a multiple of `R = max(1, ⌊m/p⌋)` (PyTorch's rule) |
//!
//! For `interleaved-1f1b` without a `group_size` the group size is `G = p` when `p` divides
//! `m`; otherwise PyTorch's regrouping rule applies: `G = m / max(1, ⌊m/p⌋)` when that
//! divides `m` exactly (so `G ≥ p` whenever `m ≥ p`); anything else is rejected with the
//! group sizes that would work. `interleaved-zb` takes PyTorch's `ScheduleInterleavedZeroBubble`
//! rule: `R = max(1, ⌊m/p⌋)` rounds of `G = m/R` micro-batches, so `m` must be a multiple of `R`
//! (any `m ≤ 2p − 1`, any multiple of `p`; `p = 4`: `m = 9` is refused, 10 runs as two rounds of 5).

mod dualpipe_v;
mod gpipe;
mod interleaved;
mod interleaved_zb;
mod looped_bfs;
mod one_f_one_b;
mod zb_v;
mod zero_bubble;

use serde::{Deserialize, Serialize};

use super::ir::{Schedule, ScheduleKind};
use crate::SpecField;

/// The most (stage, micro-batch) pairs a generated schedule may have (`p·v·m`): 4,194,304,
/// four times pp 64 · v 8 · m 2,048, beyond any published run; a schedule that size is
/// generated, checked and simulated in seconds (above it, tens of seconds).
pub const MAX_STAGE_MICROBATCHES: usize = 1 << 22;

/// The most pipeline ranks a schedule may have: the simulator and the pictures hold per-rank
/// state for every pair of ranks, and no model has more layers to spread (GPT-3: 96).
pub const MAX_PP: usize = 1024;

/// Parameters for [`generate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleSpec {
    /// Which schedule.
    pub kind: ScheduleKind,
    /// Pipeline ranks `p`.
    pub pp: usize,
    /// Stages per rank `v`.
    pub virtual_stages: usize,
    /// Micro-batches per iteration `m`.
    pub num_microbatches: usize,
    /// Interleaved 1F1B's micro-batch group size `G`; `None` for the default.
    pub group_size: Option<usize>,
}

impl ScheduleSpec {
    /// A spec with one stage per rank and the default group size.
    pub fn new(kind: ScheduleKind, pp: usize, num_microbatches: usize) -> Self {
        ScheduleSpec {
            kind,
            pp,
            virtual_stages: 1,
            num_microbatches,
            group_size: None,
        }
    }

    /// The same spec with `v` stages per rank.
    pub fn with_virtual_stages(mut self, virtual_stages: usize) -> Self {
        self.virtual_stages = virtual_stages;
        self
    }

    /// The same spec with an explicit group size.
    pub fn with_group_size(mut self, group_size: usize) -> Self {
        self.group_size = Some(group_size);
        self
    }
}

/// Why a schedule cannot be generated. Each message states the rule in the IR's names (`pp`,
/// `virtual_stages`, `num_microbatches`, `group_size`); [`ScheduleError::field`] says which
/// input is at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// `pp` is zero.
    #[error("pp must be at least 1 (got 0)")]
    ZeroPp,
    /// `m` is zero.
    #[error("num_microbatches must be at least 1 (got 0)")]
    ZeroMicrobatches,
    /// `v` is zero.
    #[error("virtual_stages must be at least 1 (got 0)")]
    ZeroVirtual,
    /// A one-stage-per-rank schedule was asked for several stages per rank.
    #[error(
        "{kind} places one stage on each rank, so virtual_stages must be 1 (got \
         {virtual_stages}); use interleaved-1f1b, looped-bfs or interleaved-zb for several \
         stages per rank, or zb-v or dualpipe-v for two"
    )]
    VirtualNotSupported {
        /// The schedule.
        kind: ScheduleKind,
        /// The `v` given.
        virtual_stages: usize,
    },
    /// A V schedule was asked for other than two stages per rank.
    #[error(
        "{kind} places exactly two stages on each rank, in a V (rank r holds stages r and \
         2·pp−1−r), so virtual_stages must be 2 (got {virtual_stages}); leave it unset to get 2"
    )]
    VirtualMustBeTwo {
        /// The schedule.
        kind: ScheduleKind,
        /// The `v` given.
        virtual_stages: usize,
    },
    /// A schedule of several stages per rank was asked for one.
    #[error(
        "{kind} interleaves several stages on each rank, so virtual_stages must be at least 2 \
         (got {virtual_stages}); with one stage per rank use zb-h1 or zb-h2"
    )]
    NeedsVirtual {
        /// The schedule.
        kind: ScheduleKind,
        /// The `v` given.
        virtual_stages: usize,
    },
    /// A zero-bubble schedule was asked for a single rank.
    #[error(
        "{kind} needs pp of at least 2 (got {pp}): it moves backward-weight work into the idle \
         time between ranks, and one rank has none; use 1f1b or gpipe"
    )]
    NeedsTwoRanks {
        /// The schedule.
        kind: ScheduleKind,
        /// The `pp` given.
        pp: usize,
    },
    /// DualPipe-V was asked for fewer than two micro-batches per stage.
    #[error(
        "{kind} needs num_microbatches of at least 2·pp = {min} (got {num_microbatches}): its \
         steady state pairs a forward with a backward on each of the 2·pp stages"
    )]
    TooFewMicrobatches {
        /// The schedule.
        kind: ScheduleKind,
        /// The `m` given.
        num_microbatches: usize,
        /// The least it accepts.
        min: usize,
    },
    /// Interleaved zero bubble was asked for a micro-batch count that PyTorch's rounds do not
    /// divide: `m` must be a multiple of `max(1, ⌊m/p⌋)`.
    #[error(
        "{kind} runs micro-batches in max(1, floor(num_microbatches / pp)) equal rounds, as \
         PyTorch does, so num_microbatches must be a multiple of that (got {num_microbatches} \
         with pp {pp}); try {suggestion}"
    )]
    MicrobatchesNotMultiple {
        /// The schedule.
        kind: ScheduleKind,
        /// `p`.
        pp: usize,
        /// `m`.
        num_microbatches: usize,
        /// The nearest count above `m` that the rule accepts.
        suggestion: usize,
    },
    /// A group size was given to a schedule that has no micro-batch groups.
    #[error("group_size applies only to interleaved-1f1b; {kind} does not take one")]
    GroupSizeNotUsed {
        /// The schedule.
        kind: ScheduleKind,
    },
    /// An explicit group size breaks interleaved 1F1B's rule.
    #[error(
        "interleaved-1f1b needs pp <= group_size <= num_microbatches and num_microbatches a \
         multiple of group_size (got pp {pp}, group_size {group_size}, num_microbatches \
         {num_microbatches}){}",
        group_size_hint(*.pp, .valid)
    )]
    BadGroupSize {
        /// `p`.
        pp: usize,
        /// The group size given.
        group_size: usize,
        /// `m`.
        num_microbatches: usize,
        /// Group sizes that would work (at most 8 of them).
        valid: Vec<usize>,
    },
    /// No group size was given and neither the default nor PyTorch's regrouping fits.
    #[error(
        "interleaved-1f1b runs micro-batches in groups of G with pp <= G <= num_microbatches \
         and num_microbatches a multiple of G; with pp {pp} and num_microbatches \
         {num_microbatches} {}{}",
        no_group_why(*.pp, *.num_microbatches),
        group_size_hint(*.pp, .valid)
    )]
    NoGroupSize {
        /// `p`.
        pp: usize,
        /// `m`.
        num_microbatches: usize,
        /// Group sizes that would work (at most 8 of them).
        valid: Vec<usize>,
    },
    /// The schedule would be too large to hold.
    #[error(
        "pp x virtual_stages x num_microbatches = {stage_microbatches} (stage, micro-batch) \
         pairs is above the limit of {max}"
    )]
    TooLarge {
        /// `p·v·m`.
        stage_microbatches: u128,
        /// [`MAX_STAGE_MICROBATCHES`].
        max: usize,
    },
    /// More ranks than [`MAX_PP`].
    #[error("pp must be at most {max} (got {pp})")]
    TooManyRanks {
        /// `p`.
        pp: usize,
        /// [`MAX_PP`].
        max: usize,
    },
}

impl ScheduleError {
    /// The input at fault (the CLI names it by its flag).
    pub fn field(&self) -> SpecField {
        match self {
            ScheduleError::ZeroPp
            | ScheduleError::NeedsTwoRanks { .. }
            | ScheduleError::TooManyRanks { .. } => SpecField::Pp,
            ScheduleError::ZeroVirtual
            | ScheduleError::VirtualNotSupported { .. }
            | ScheduleError::VirtualMustBeTwo { .. }
            | ScheduleError::NeedsVirtual { .. } => SpecField::VirtualStages,
            ScheduleError::GroupSizeNotUsed { .. } | ScheduleError::BadGroupSize { .. } => {
                SpecField::GroupSize
            }
            ScheduleError::ZeroMicrobatches
            | ScheduleError::TooFewMicrobatches { .. }
            | ScheduleError::MicrobatchesNotMultiple { .. }
            | ScheduleError::NoGroupSize { .. }
            | ScheduleError::TooLarge { .. } => SpecField::NumMicrobatches,
        }
    }
}

/// Group sizes `G` with `p ≤ G ≤ m` and `m mod G = 0`, at most 8 of them.
fn valid_group_sizes(pp: usize, m: usize) -> Vec<usize> {
    (pp.max(1)..=m)
        .filter(|&g| m.is_multiple_of(g))
        .take(8)
        .collect()
}

/// The hint of a group-size error: the group sizes that would work, or that none does.
fn group_size_hint(pp: usize, valid: &[usize]) -> String {
    if valid.is_empty() {
        format!("; no group size fits, so use num_microbatches >= pp ({pp})")
    } else {
        let list: Vec<String> = valid.iter().map(usize::to_string).collect();
        format!("; valid group_size values: {}", list.join(", "))
    }
}

/// Why neither interleaved 1F1B's default group size nor PyTorch's regrouping applies.
fn no_group_why(p: usize, m: usize) -> String {
    if m < p {
        format!("there are fewer micro-batches than ranks ({m} < {p})")
    } else {
        format!(
            "pp does not divide num_microbatches, and neither does PyTorch's regrouping into \
             floor(m/p) = {} rounds",
            (m / p.max(1)).max(1)
        )
    }
}

/// The group size interleaved 1F1B will use for `spec` (`None` for other schedules, and for
/// `v = 1`, where interleaved 1F1B is 1F1B): the explicit `group_size`, or `p` when it
/// divides `m`, or PyTorch's regrouping `G = m / max(1, ⌊m/p⌋)` when that divides `m`.
pub fn resolve_group_size(spec: &ScheduleSpec) -> Result<Option<usize>, ScheduleError> {
    validate_common(spec)?;
    let (p, v, m) = (spec.pp, spec.virtual_stages, spec.num_microbatches);
    if spec.kind != ScheduleKind::Interleaved1F1B {
        return Ok(None);
    }
    if v == 1 {
        return Ok(None);
    }
    if let Some(g) = spec.group_size {
        if g < p || g > m || !m.is_multiple_of(g) {
            return Err(ScheduleError::BadGroupSize {
                pp: p,
                group_size: g,
                num_microbatches: m,
                valid: valid_group_sizes(p, m),
            });
        }
        return Ok(Some(g));
    }
    if m.is_multiple_of(p) {
        return Ok(Some(p));
    }
    let rounds = (m / p).max(1);
    if m >= p && m.is_multiple_of(rounds) {
        return Ok(Some(m / rounds));
    }
    Err(ScheduleError::NoGroupSize {
        pp: p,
        num_microbatches: m,
        valid: valid_group_sizes(p, m),
    })
}

/// Checks the rules every schedule shares, and each kind's `v` rule.
fn validate_common(spec: &ScheduleSpec) -> Result<(), ScheduleError> {
    let (p, v, m) = (spec.pp, spec.virtual_stages, spec.num_microbatches);
    if p == 0 {
        return Err(ScheduleError::ZeroPp);
    }
    if p > MAX_PP {
        return Err(ScheduleError::TooManyRanks { pp: p, max: MAX_PP });
    }
    if m == 0 {
        return Err(ScheduleError::ZeroMicrobatches);
    }
    if v == 0 {
        return Err(ScheduleError::ZeroVirtual);
    }
    let size = p as u128 * v as u128 * m as u128;
    if size > MAX_STAGE_MICROBATCHES as u128 {
        return Err(ScheduleError::TooLarge {
            stage_microbatches: size,
            max: MAX_STAGE_MICROBATCHES,
        });
    }
    let kind = spec.kind;
    match kind.fixed_virtual_stages() {
        Some(1) if v != 1 => {
            return Err(ScheduleError::VirtualNotSupported {
                kind,
                virtual_stages: v,
            })
        }
        Some(2) if v != 2 => {
            return Err(ScheduleError::VirtualMustBeTwo {
                kind,
                virtual_stages: v,
            })
        }
        _ => {}
    }
    if kind != ScheduleKind::Interleaved1F1B && spec.group_size.is_some() {
        return Err(ScheduleError::GroupSizeNotUsed { kind });
    }
    Ok(())
}

/// PyTorch's round size for `p` ranks and `m` micro-batches: `R = max(1, ⌊m/p⌋)` rounds of
/// `G = m/R` micro-batches when `R` divides `m`, `None` otherwise (`p = 4`: `m = 6` → 6,
/// `m = 10` → 5, `m = 9` → none). Interleaved zero bubble groups by it.
pub fn rounds_group_size(p: usize, m: usize) -> Option<usize> {
    let rounds = (m / p.max(1)).max(1);
    m.is_multiple_of(rounds).then_some(m / rounds)
}

/// Checks the input rules of the split-backward schedules (see the [module docs](self)).
fn validate_split_backward(spec: &ScheduleSpec) -> Result<(), ScheduleError> {
    let (kind, p, v, m) = (
        spec.kind,
        spec.pp,
        spec.virtual_stages,
        spec.num_microbatches,
    );
    match kind {
        ScheduleKind::ZbH1 | ScheduleKind::ZbH2 | ScheduleKind::ZbV if p < 2 => {
            Err(ScheduleError::NeedsTwoRanks { kind, pp: p })
        }
        ScheduleKind::DualPipeV if m < 2 * p => Err(ScheduleError::TooFewMicrobatches {
            kind,
            num_microbatches: m,
            min: 2 * p,
        }),
        ScheduleKind::InterleavedZb if v < 2 => Err(ScheduleError::NeedsVirtual {
            kind,
            virtual_stages: v,
        }),
        ScheduleKind::InterleavedZb if rounds_group_size(p, m).is_none() => {
            Err(ScheduleError::MicrobatchesNotMultiple {
                kind,
                pp: p,
                num_microbatches: m,
                suggestion: (m + 1..)
                    .find(|&n| rounds_group_size(p, n).is_some())
                    .unwrap_or(m.next_multiple_of(p)),
            })
        }
        _ => Ok(()),
    }
}

/// Checks, without generating it, that `spec.kind` supports `spec`'s inputs (the rules of the
/// [module docs](self)); the group size of interleaved 1F1B as [`resolve_group_size`] gives it.
pub fn check_spec(spec: &ScheduleSpec) -> Result<Option<usize>, ScheduleError> {
    let group_size = resolve_group_size(spec)?;
    validate_split_backward(spec)?;
    Ok(group_size)
}

/// Generates the per-rank lists of `spec.kind`, after checking that the schedule supports
/// `spec`'s inputs (see the [module docs](self) for the rules).
///
/// ```
/// use autopp_schedule::{generate, ScheduleKind, ScheduleSpec};
///
/// let s = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 3)).unwrap();
/// let text: Vec<String> = s.ranks[1].iter().map(|x| x.to_string()).collect();
/// assert_eq!(text, ["1F0", "1B0", "1F1", "1B1", "1F2", "1B2"]);
/// ```
pub fn generate(spec: &ScheduleSpec) -> Result<Schedule, ScheduleError> {
    let group_size = check_spec(spec)?;
    let (p, v, m) = (spec.pp, spec.virtual_stages, spec.num_microbatches);
    Ok(match (spec.kind, group_size) {
        (ScheduleKind::Gpipe, _) => gpipe::gpipe(p, m),
        (ScheduleKind::OneFOneB, _) => one_f_one_b::one_f_one_b(p, m),
        (ScheduleKind::LoopedBfs, _) => looped_bfs::looped_bfs(p, v, m),
        (ScheduleKind::ZbH1, _) => zero_bubble::zb_h1(p, m),
        (ScheduleKind::ZbH2, _) => zero_bubble::zb_h2(p, m),
        (ScheduleKind::ZbV, _) => zb_v::zb_v(p, m),
        (ScheduleKind::DualPipeV, _) => dualpipe_v::dualpipe_v(p, m),
        (ScheduleKind::InterleavedZb, _) => {
            let g = rounds_group_size(p, m).unwrap_or(p);
            interleaved_zb::interleaved_zb(p, v, m, g)
        }
        (ScheduleKind::Interleaved1F1B, Some(g)) => interleaved::interleaved_1f1b(p, v, m, g),
        (ScheduleKind::Interleaved1F1B, None) => Schedule {
            kind: ScheduleKind::Interleaved1F1B,
            ..one_f_one_b::one_f_one_b(p, m)
        },
    })
}
