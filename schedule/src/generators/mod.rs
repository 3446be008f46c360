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
//! | `interleaved-zb` | any `p ≥ 1`, `v ≥ 2`, `m` a multiple of `p` |
//!
//! For `interleaved-1f1b` without `--group-size` the group size is `G = p` when `p` divides
//! `m`; otherwise PyTorch's regrouping rule applies: `G = m / max(1, ⌊m/p⌋)` when that
//! divides `m` exactly (so `G ≥ p` whenever `m ≥ p`); anything else is rejected with the
//! group sizes that would work.

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

/// The most (stage, micro-batch) pairs a generated schedule may have (`p·v·m`).
pub const MAX_STAGE_MICROBATCHES: usize = 1 << 24;

/// Parameters for [`generate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleSpec {
    /// Which schedule.
    pub kind: ScheduleKind,
    /// Pipeline ranks `p` (`--pp`).
    pub pp: usize,
    /// Stages per rank `v` (`--virtual`).
    pub virtual_stages: usize,
    /// Micro-batches per iteration `m` (`--microbatches`).
    pub num_microbatches: usize,
    /// Interleaved 1F1B's micro-batch group size `G` (`--group-size`); `None` for the default.
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

/// Why a schedule cannot be generated. Each message states the rule and names the flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// `pp` is zero.
    #[error("--pp must be at least 1 (got 0)")]
    ZeroPp,
    /// `m` is zero.
    #[error("--microbatches must be at least 1 (got 0)")]
    ZeroMicrobatches,
    /// `v` is zero.
    #[error("--virtual must be at least 1 (got 0)")]
    ZeroVirtual,
    /// A one-stage-per-rank schedule was asked for several stages per rank.
    #[error(
        "{kind} places one stage on each rank, so --virtual must be 1 (got {virtual_stages}); \
         use interleaved-1f1b, looped-bfs or interleaved-zb for several stages per rank, or \
         zb-v or dualpipe-v for two"
    )]
    VirtualNotSupported {
        /// The schedule.
        kind: ScheduleKind,
        /// The `--virtual` given.
        virtual_stages: usize,
    },
    /// A V schedule was asked for other than two stages per rank.
    #[error(
        "{kind} places exactly two stages on each rank, in a V (rank r holds stages r and \
         2·pp−1−r), so --virtual must be 2 (got {virtual_stages}); leave --virtual out to get 2"
    )]
    VirtualMustBeTwo {
        /// The schedule.
        kind: ScheduleKind,
        /// The `--virtual` given.
        virtual_stages: usize,
    },
    /// A schedule of several stages per rank was asked for one.
    #[error(
        "{kind} interleaves several stages on each rank, so --virtual must be at least 2 (got \
         {virtual_stages}); with one stage per rank use zb-h1 or zb-h2"
    )]
    NeedsVirtual {
        /// The schedule.
        kind: ScheduleKind,
        /// The `--virtual` given.
        virtual_stages: usize,
    },
    /// A zero-bubble schedule was asked for a single rank.
    #[error(
        "{kind} needs --pp of at least 2 (got {pp}): it moves backward-weight work into the \
         idle time between ranks, and one rank has none; use 1f1b or gpipe"
    )]
    NeedsTwoRanks {
        /// The schedule.
        kind: ScheduleKind,
        /// The `--pp` given.
        pp: usize,
    },
    /// DualPipe-V was asked for fewer than two micro-batches per stage.
    #[error(
        "{kind} needs --microbatches of at least 2 x --pp = {min} (got {num_microbatches}): \
         its steady state pairs a forward with a backward on each of the 2 x --pp stages"
    )]
    TooFewMicrobatches {
        /// The schedule.
        kind: ScheduleKind,
        /// The `--microbatches` given.
        num_microbatches: usize,
        /// The least it accepts.
        min: usize,
    },
    /// Interleaved zero bubble was asked for a micro-batch count that is not a multiple of `p`.
    #[error(
        "{kind} runs micro-batches in groups of --pp, so --microbatches must be a multiple of \
         --pp (got --microbatches {num_microbatches} with --pp {pp}); try --microbatches \
         {suggestion}"
    )]
    MicrobatchesNotMultiple {
        /// The schedule.
        kind: ScheduleKind,
        /// `p`.
        pp: usize,
        /// `m`.
        num_microbatches: usize,
        /// The nearest multiple of `p` above `m`.
        suggestion: usize,
    },
    /// `--group-size` was given to a schedule that has no micro-batch groups.
    #[error("--group-size applies only to interleaved-1f1b; {kind} does not take one")]
    GroupSizeNotUsed {
        /// The schedule.
        kind: ScheduleKind,
    },
    /// An explicit group size breaks interleaved 1F1B's rule.
    #[error(
        "interleaved-1f1b needs --pp <= --group-size <= --microbatches and --microbatches a \
         multiple of --group-size (got --pp {pp}, --group-size {group_size}, --microbatches \
         {num_microbatches}){hint}"
    )]
    BadGroupSize {
        /// `p`.
        pp: usize,
        /// The `--group-size` given.
        group_size: usize,
        /// `m`.
        num_microbatches: usize,
        /// Group sizes that would work, as text.
        hint: String,
    },
    /// No group size was given and neither the default nor PyTorch's regrouping fits.
    #[error(
        "interleaved-1f1b runs micro-batches in groups of G with --pp <= G <= --microbatches and \
         --microbatches a multiple of G; with --pp {pp} and --microbatches {num_microbatches} \
         {why}{hint}"
    )]
    NoGroupSize {
        /// `p`.
        pp: usize,
        /// `m`.
        num_microbatches: usize,
        /// Why neither default applies.
        why: String,
        /// Group sizes that would work, as text.
        hint: String,
    },
    /// The schedule would be too large to hold.
    #[error(
        "--pp x --virtual x --microbatches = {stage_microbatches} (stage, micro-batch) pairs is \
         above the limit of {max}"
    )]
    TooLarge {
        /// `p·v·m`.
        stage_microbatches: u128,
        /// [`MAX_STAGE_MICROBATCHES`].
        max: usize,
    },
}

/// Group sizes `G` with `p ≤ G ≤ m` and `m mod G = 0`, as a hint for an error message.
fn group_size_hint(pp: usize, m: usize) -> String {
    let ok: Vec<String> = (pp.max(1)..=m)
        .filter(|&g| m.is_multiple_of(g))
        .take(8)
        .map(|g| g.to_string())
        .collect();
    if ok.is_empty() {
        format!("; no group size fits, so use --microbatches >= --pp ({pp})")
    } else {
        format!("; valid --group-size values: {}", ok.join(", "))
    }
}

/// The group size interleaved 1F1B will use for `spec` (`None` for other schedules, and for
/// `v = 1`, where interleaved 1F1B is 1F1B): the explicit `--group-size`, or `p` when it
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
                hint: group_size_hint(p, m),
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
    let why = if m < p {
        format!("there are fewer micro-batches than ranks ({m} < {p})")
    } else {
        format!(
            "--pp does not divide --microbatches, and neither does PyTorch's regrouping \
             into floor(m/p) = {rounds} rounds"
        )
    };
    Err(ScheduleError::NoGroupSize {
        pp: p,
        num_microbatches: m,
        why,
        hint: group_size_hint(p, m),
    })
}

/// Checks the rules every schedule shares, and each kind's `v` rule.
fn validate_common(spec: &ScheduleSpec) -> Result<(), ScheduleError> {
    let (p, v, m) = (spec.pp, spec.virtual_stages, spec.num_microbatches);
    if p == 0 {
        return Err(ScheduleError::ZeroPp);
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
        ScheduleKind::InterleavedZb if !m.is_multiple_of(p) => {
            Err(ScheduleError::MicrobatchesNotMultiple {
                kind,
                pp: p,
                num_microbatches: m,
                suggestion: m.next_multiple_of(p),
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
        (ScheduleKind::InterleavedZb, _) => interleaved_zb::interleaved_zb(p, v, m),
        (ScheduleKind::Interleaved1F1B, Some(g)) => interleaved::interleaved_1f1b(p, v, m, g),
        (ScheduleKind::Interleaved1F1B, None) => Schedule {
            kind: ScheduleKind::Interleaved1F1B,
            ..one_f_one_b::one_f_one_b(p, m)
        },
    })
}
