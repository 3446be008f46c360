//! What each training framework can run: the planner's `--framework` restricts its search to
//! it, and models its runtime. `docs/frameworks.md` is the table this encodes, with the
//! framework versions it describes.

use std::fmt;
use std::str::FromStr;

use autopp_models::Recompute;
use serde::{Deserialize, Serialize};

use crate::config::{PlanError, Runtime};
use crate::pins::Fixed;
use crate::runtime::Stack;
use crate::schedule::ScheduleKind;

/// A training framework a plan must run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Framework {
    /// No restriction: everything autopp models (per-rank partial recompute included).
    #[default]
    Any,
    /// Megatron-LM (Megatron-Core 0.13, 2025).
    Megatron,
    /// torchtitan (2025, PyTorch 2.8 `torch.distributed.pipelining` with FSDP2; schedules
    /// PyTorch does not name run from a CSV action table).
    Torchtitan,
    /// DeepSpeed's pipeline engine (`deepspeed.pipe`, DeepSpeed 0.16).
    Deepspeed,
}

/// How a framework recomputes only some layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartialRecompute {
    /// Not at all: one recompute mode for every layer.
    Unsupported,
    /// One count for every stage (Megatron-LM's `--recompute-num-layers N` with
    /// `--recompute-method block`), the other layers not recomputed.
    SameCountPerStage,
    /// Any count per rank (spread over its stages), the other layers selective or none.
    PerRank,
}

impl Framework {
    /// Every framework, in the order they are documented.
    pub const ALL: [Framework; 4] = [
        Framework::Any,
        Framework::Megatron,
        Framework::Torchtitan,
        Framework::Deepspeed,
    ];

    /// The frameworks that launch plans (`autopp launch`), in the order they are documented:
    /// the default search (`--framework any`) unites their spaces.
    pub const RUNNABLE: [Framework; 3] = [
        Framework::Megatron,
        Framework::Torchtitan,
        Framework::Deepspeed,
    ];

    /// The name used on the command line and in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Framework::Any => "any",
            Framework::Megatron => "megatron",
            Framework::Torchtitan => "torchtitan",
            Framework::Deepspeed => "deepspeed",
        }
    }

    /// Whether the framework runs `kind`. Named by text so that kinds autopp does not model
    /// yet simply do not appear.
    pub fn runs(self, kind: ScheduleKind) -> bool {
        let names: &[&str] = match self {
            Framework::Any => return true,
            Framework::Megatron => &["1f1b", "interleaved-1f1b"],
            Framework::Torchtitan => &[
                "gpipe",
                "1f1b",
                "interleaved-1f1b",
                "looped-bfs",
                "interleaved-zb",
                "zb-v",
                "dualpipe-v",
                // PyTorch names no ZB-H1/ZB-H2 class; torchtitan runs autopp's action table
                // through `pipeline_parallel_schedule_csv` (`_PipelineScheduleRuntime`)
                "zb-h1",
                "zb-h2",
            ],
            Framework::Deepspeed => &["1f1b"],
        };
        names.contains(&kind.as_str())
    }

    /// The schedules of `ScheduleKind::ALL` the framework runs.
    pub fn schedules(self) -> Vec<ScheduleKind> {
        ScheduleKind::ALL
            .into_iter()
            .filter(|&k| self.runs(k))
            .collect()
    }

    /// The schedules to search: `asked` (`--schedules`), each of which the framework must run,
    /// or every schedule it runs.
    pub fn schedules_to_search(
        self,
        asked: Option<&[ScheduleKind]>,
    ) -> Result<Vec<ScheduleKind>, PlanError> {
        let runs = self.schedules();
        match asked {
            None => Ok(runs),
            Some(asked) => match asked.iter().find(|k| !self.runs(**k)) {
                Some(k) => Err(PlanError::invalid(
                    "--schedules",
                    format!("{self} does not run {k}; it runs {}", names(&runs)),
                )),
                None => Ok(asked.to_vec()),
            },
        }
    }

    /// Pins (`--fix`) the framework cannot run are errors, not empty searches.
    pub fn check_pins(self, fixed: &Fixed) -> Result<(), PlanError> {
        let refuse = |pin: String, runs: String| {
            Err(PlanError::invalid(
                &format!("--fix {pin}"),
                format!("{self} does not run it; it runs {runs}"),
            ))
        };
        if let Some(k) = fixed.schedule.filter(|&k| !self.runs(k)) {
            return refuse(format!("schedule={k}"), names(&self.schedules()));
        }
        if let Some(r) = fixed
            .recompute
            .filter(|r| !self.recompute_modes().contains(r))
        {
            return refuse(format!("recompute={r}"), names(self.recompute_modes()));
        }
        if let Some(z) = fixed.zero_stage.filter(|z| !self.zero_stages().contains(z)) {
            return Err(PlanError::invalid(
                &format!("--fix zero_stage={z}"),
                format!(
                    "{self} does not run it with a pipeline; it runs ZeRO {}",
                    names(self.zero_stages())
                ),
            ));
        }
        if fixed.degrees.cp.is_some_and(|c| c > 1) && !self.context_parallel() {
            return Err(PlanError::invalid(
                "--fix cp",
                format!("{self} does not run context parallelism beside a pipeline"),
            ));
        }
        Ok(())
    }

    /// Recompute modes the framework applies to all layers alike.
    pub fn recompute_modes(self) -> &'static [Recompute] {
        match self {
            // DeepSpeed's pipeline engine checkpoints whole layers (`activation_checkpoint_interval`)
            Framework::Deepspeed => &[Recompute::None, Recompute::Full],
            _ => &Recompute::ALL,
        }
    }

    /// How the framework recomputes only some layers.
    pub fn partial_recompute(self) -> PartialRecompute {
        match self {
            Framework::Any => PartialRecompute::PerRank,
            Framework::Megatron => PartialRecompute::SameCountPerStage,
            Framework::Torchtitan | Framework::Deepspeed => PartialRecompute::Unsupported,
        }
    }

    /// The base recompute modes that partial recompute can pair with its fully recomputed
    /// layers (Megatron-LM's granularity is one of full or selective, so its other layers are
    /// not recomputed).
    pub fn partial_bases(self) -> &'static [Recompute] {
        match self.partial_recompute() {
            PartialRecompute::Unsupported => &[],
            PartialRecompute::SameCountPerStage => &[Recompute::None],
            PartialRecompute::PerRank => &[Recompute::None, Recompute::Selective],
        }
    }

    /// ZeRO stages the framework combines with pipeline parallelism: Megatron-LM's distributed
    /// optimizer is stage 1; torchtitan shards with FSDP2 (stage 2 inside a pipeline, where it
    /// keeps parameters gathered between micro-batches, 3 otherwise); DeepSpeed's pipeline
    /// engine supports stage ≤ 1.
    pub fn zero_stages(self) -> &'static [u8] {
        match self {
            Framework::Any => &[0, 1, 2, 3],
            Framework::Megatron | Framework::Deepspeed => &[0, 1],
            Framework::Torchtitan => &[0, 2, 3],
        }
    }

    /// Whether stages may hold different numbers of layers (Megatron-LM's
    /// `--pipeline-model-parallel-layout`; torchtitan's per-stage module lists). DeepSpeed's
    /// `PipelineModule` partitions uniformly or by parameter count.
    pub fn uneven_layouts(self) -> bool {
        !matches!(self, Framework::Deepspeed)
    }

    /// Whether the framework's tensor parallelism splits whole key/value heads, so that tp must
    /// divide them (torchtitan's `Decoder.Config.update_from_config` raises otherwise), rather
    /// than replicating a key/value head on several GPUs as autopp models it.
    pub fn tp_splits_whole_kv_heads(self) -> bool {
        matches!(self, Framework::Torchtitan)
    }

    /// Whether the framework runs context parallelism beside pipeline parallelism.
    pub fn context_parallel(self) -> bool {
        !matches!(self, Framework::Deepspeed)
    }

    /// Chunks of each sequence per context-parallel rank: the sequence length must be a
    /// multiple of `cp` times this. Megatron-Core and torchtitan balance causal attention by
    /// cutting each sequence into `2·cp` chunks, each rank taking one from either end (what
    /// `autopp launch` checks); autopp's own model (`any`) only needs `cp` to divide it.
    pub fn context_parallel_chunks(self) -> u64 {
        match self {
            Framework::Megatron | Framework::Torchtitan => 2,
            Framework::Any | Framework::Deepspeed => 1,
        }
    }

    /// Whether context parallelism of `cp` cuts a sequence of `seq_length` tokens into its
    /// [`Self::context_parallel_chunks`] equal pieces per rank.
    pub fn cp_cuts(self, seq_length: u64, cp: u64) -> bool {
        seq_length.is_multiple_of(cp.max(1) * self.context_parallel_chunks())
    }

    /// The stack `--framework NAME` means for this family: Megatron-Core for `megatron`, the
    /// modern defaults (every overlap on) for `any`.
    pub fn default_stack(self) -> Stack {
        match self {
            Framework::Any => Stack::Any,
            Framework::Megatron => Stack::MegatronCore,
            Framework::Torchtitan => Stack::Torchtitan,
            Framework::Deepspeed => Stack::Deepspeed,
        }
    }

    /// How the framework runs: its default stack's runtime.
    pub fn runtime(self) -> Runtime {
        self.default_stack().runtime()
    }
}

/// A list for an error message: `1f1b, interleaved-1f1b`.
fn names<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

impl FromStr for Framework {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim().to_ascii_lowercase();
        Framework::ALL
            .into_iter()
            .find(|f| f.as_str() == wanted)
            .ok_or_else(|| {
                format!("unknown framework `{s}`; valid frameworks are: any, megatron, torchtitan, deepspeed")
            })
    }
}

impl fmt::Display for Framework {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_restrictions_hold() {
        for f in Framework::ALL {
            assert_eq!(f.as_str().parse::<Framework>(), Ok(f));
        }
        assert!("pytorch".parse::<Framework>().is_err());
        assert_eq!(
            Framework::Megatron.schedules(),
            [ScheduleKind::OneFOneB, ScheduleKind::Interleaved1F1B]
        );
        assert_eq!(Framework::Deepspeed.schedules(), [ScheduleKind::OneFOneB]);
        // torchtitan runs every schedule autopp generates: PyTorch's classes, or the CSV table
        assert_eq!(
            Framework::Torchtitan.schedules(),
            ScheduleKind::ALL.to_vec()
        );
        assert_eq!(Framework::Any.schedules(), ScheduleKind::ALL.to_vec());
        assert!(Framework::Deepspeed.zero_stages().iter().all(|&z| z <= 1));
        assert!(!Framework::Deepspeed.uneven_layouts());
        assert_eq!(Framework::Torchtitan.runtime().vocab_pad_multiple, 1);
    }
}
