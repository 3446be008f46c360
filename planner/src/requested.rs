//! A configuration as `estimate`'s flags give it: the degrees, the batching and the settings
//! given, with `plan`'s choices for the settings left out (and said in words).

use autopp_hardware::Precision;
use autopp_models::Recompute;

use crate::config::{EvalSettings, ParallelConfig, PlanError};
use crate::degrees::Degrees;
use crate::experts::ExpertParallel;
use crate::runtime::Stack;
use crate::schedule::ScheduleKind;

/// The settings `estimate`'s flags gave (`None`: left out).
#[derive(Debug, Clone, Copy, Default)]
pub struct Given {
    /// `--sequence-parallel`.
    pub sequence_parallel: Option<bool>,
    /// `--zero`.
    pub zero_stage: Option<u8>,
    /// `--recompute`.
    pub recompute: Option<Recompute>,
    /// `--precision`.
    pub precision: Option<Precision>,
    /// `--framework`.
    pub framework: Option<Stack>,
}

/// The settings `estimate` uses: the given ones, and `plan`'s choices for the others.
#[derive(Debug, Clone)]
pub struct Chosen {
    /// Megatron sequence parallelism.
    pub sequence_parallel: bool,
    /// ZeRO stage.
    pub zero_stage: u8,
    /// Recompute mode.
    pub recompute: Recompute,
    /// Math precision.
    pub precision: Precision,
    /// The software stack whose runtime predicts it.
    pub framework: Stack,
    /// The settings chosen by default, in words (`sequence parallel on (tp ≥ 2)`).
    pub used: Vec<String>,
}

impl Given {
    /// Fills the settings left out as `plan`'s search almost always chooses them for a
    /// configuration of tensor-parallel degree `tp` and `replicas` (dp · cp) copies of the
    /// weights: sequence parallelism with tp ≥ 2 (it saves activation memory at the same
    /// communication volume), a sharded optimizer with more than one replica (ZeRO 1, Megatron's
    /// distributed optimizer, or the framework's first sharded stage), no recompute, bf16, and
    /// Megatron-Core's runtime.
    pub fn resolve(&self, tp: u64, replicas: u64) -> Chosen {
        let mut used = Vec::new();
        let framework = self.framework.unwrap_or_else(|| {
            used.push("megatron-core runtime".to_string());
            Stack::MegatronCore
        });
        let sequence_parallel = self.sequence_parallel.unwrap_or_else(|| {
            used.push(match tp > 1 {
                true => "sequence parallel on (tp ≥ 2)".to_string(),
                false => "sequence parallel off (tp 1)".to_string(),
            });
            tp > 1
        });
        let zero_stage = self.zero_stage.unwrap_or_else(|| {
            let sharded = framework
                .family()
                .zero_stages()
                .iter()
                .copied()
                .find(|&z| z > 0);
            let z = sharded.filter(|_| replicas > 1).unwrap_or(0);
            used.push(match z {
                0 => "ZeRO 0 (one replica)".to_string(),
                1 => "ZeRO 1 (distributed optimizer)".to_string(),
                z => format!("ZeRO {z}"),
            });
            z
        });
        let recompute = self.recompute.unwrap_or_else(|| {
            used.push("recompute none".to_string());
            Recompute::None
        });
        let precision = self.precision.unwrap_or_else(|| {
            used.push("bf16".to_string());
            Precision::Bf16
        });
        Chosen {
            sequence_parallel,
            zero_stage,
            recompute,
            precision,
            framework,
            used,
        }
    }
}

/// A configuration as flags give it, before the defaults.
#[derive(Debug, Clone, Default)]
pub struct Requested {
    /// Tensor-parallel degree.
    pub tp: u64,
    /// Pipeline-parallel degree.
    pub pp: u64,
    /// Data-parallel degree (`None`: GPUs / (tp · pp · cp)).
    pub dp: Option<u64>,
    /// Context-parallel degree.
    pub cp: u64,
    /// Sequences per micro-batch.
    pub micro_batch_size: u64,
    /// Stages per pipeline rank (`None`: the schedule's default).
    pub virtual_stages: Option<u64>,
    /// Pipeline schedule (`None`: 1F1B, or interleaved 1F1B with stages per rank > 1).
    pub schedule: Option<ScheduleKind>,
    /// Micro-batch group size of interleaved schedules.
    pub group_size: Option<u64>,
    /// Fully recomputed layers per stage (partial recompute).
    pub recompute_layers: Option<Vec<u64>>,
    /// Layer-list entries per stage.
    pub split: Option<Vec<usize>>,
    /// Expert parallelism.
    pub experts: ExpertParallel,
    /// Sequences per iteration.
    pub global_batch_size: u64,
    /// Headroom kept free per GPU, bytes.
    pub memory_reserve_bytes: u64,
    /// A fused attention kernel.
    pub flash_attention: bool,
    /// The settings given.
    pub given: Given,
}

impl Requested {
    /// The configuration on `gpus` GPUs, and the settings chosen by default in words.
    pub fn build(&self, gpus: u64) -> Result<(ParallelConfig, Vec<String>), PlanError> {
        for (flag, v) in [
            ("--tp", self.tp),
            ("--pp", self.pp),
            ("--cp", self.cp),
            ("--mbs", self.micro_batch_size),
            ("--virtual", self.virtual_stages.unwrap_or(1)),
        ] {
            if v == 0 {
                return Err(PlanError::invalid(flag, "must be at least 1"));
            }
        }
        let (schedule, virtual_stages) =
            ParallelConfig::schedule_or_default(self.schedule, self.virtual_stages);
        let degrees = match self.dp {
            Some(dp) => Degrees {
                tp: self.tp,
                pp: self.pp,
                dp,
                cp: self.cp,
                virtual_stages,
            },
            None => Degrees::filling(gpus, self.tp, self.pp, self.cp, virtual_stages)?,
        };
        let chosen = self.given.resolve(degrees.tp, degrees.dp * degrees.cp);
        let settings = EvalSettings {
            precision: chosen.precision,
            memory_reserve_bytes: self.memory_reserve_bytes,
            // a configuration given whole: fits means fits in the GPU's memory
            memory_margin_bytes: 0,
            flash_attention: self.flash_attention,
            runtime: chosen.framework.runtime(),
        };
        if let Some(stack) = self.given.framework.filter(|s| !s.family().runs(schedule)) {
            return Err(PlanError::invalid(
                "--schedule",
                format!("{stack} does not run {schedule}; name another --framework or schedule"),
            ));
        }
        let config = ParallelConfig::new(degrees, self.micro_batch_size, self.global_batch_size)
            .with_schedule(schedule)
            .with_group_size(self.group_size)
            .with_recompute(chosen.recompute)
            .with_recompute_layers(self.recompute_layers.clone())
            .with_sequence_parallel(chosen.sequence_parallel)
            .with_zero_stage(chosen.zero_stage)
            .with_split(self.split.clone())
            .with_settings(settings)
            .with_experts(self.experts);
        Ok((config, chosen.used))
    }
}
