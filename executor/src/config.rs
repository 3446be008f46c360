//! [`ExecConfig`]: what to run — the model, the schedule IR, the data-parallel degree, the
//! micro-batch size, the layer split, the steps, the seed and the optimizer — and the checks
//! that refuse what the executor cannot run.

use std::ops::Range;

use autopp_models::{LayerKind, Model, TransformerSpec};
use autopp_profiler::device::check_model;
use autopp_profiler::fp32_layers::fp32_layer_bytes;
use autopp_schedule::split::{check_split, default_split};
use autopp_schedule::{check, generate, PipelinePlan, Schedule};
use serde::Serialize;

use crate::backend::Backend;
use crate::error::ExecError;

/// The most bytes one step's single-worker check may keep for backward (the whole global batch
/// at once).
pub const MAX_BATCH_ACTIVATION_BYTES: u64 = 16 << 30;

/// AdamW's hyperparameters (Loshchilov & Hutter 2019): decoupled weight decay, applied to
/// matrices only (not to biases and norm parameters).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct AdamWConfig {
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay `β₁`.
    pub beta1: f64,
    /// Second-moment decay `β₂`.
    pub beta2: f64,
    /// `ε` added to `√v̂`.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            lr: 3e-3,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

/// How an injected failure fails (see [`InjectedFailure`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FailureMode {
    /// The rank's action returns an error (`RANK:STEP`).
    Error,
    /// The rank's action panics (`RANK:STEP:panic`).
    Panic,
    /// The rank's process dies at once, as if killed (`RANK:STEP:kill`): SIGKILL on Unix, an
    /// abort elsewhere, with no error line and no clean-up. Only for one process per rank
    /// (`--transport mpi`): the threaded runners refuse it, since it would end every rank.
    Kill,
}

/// A failure `--inject-failure RANK:STEP[:panic|:kill]` asks for, to test failure handling:
/// world rank `rank` fails in step `step` (1-based) at the middle action of its list — with an
/// error, a panic, or (`:kill`, one process per rank only) the death of its process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct InjectedFailure {
    /// World rank that fails.
    pub rank: usize,
    /// Step (1-based) in which it fails.
    pub step: usize,
    /// How it fails.
    pub mode: FailureMode,
}

impl std::fmt::Display for InjectedFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.rank, self.step)?;
        match self.mode {
            FailureMode::Error => Ok(()),
            FailureMode::Panic => write!(f, ":panic"),
            FailureMode::Kill => write!(f, ":kill"),
        }
    }
}

impl std::str::FromStr for InjectedFailure {
    type Err = String;

    /// Parses `RANK:STEP`, `RANK:STEP:panic` or `RANK:STEP:kill`.
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let bad =
            || format!("'{s}' is not RANK:STEP, RANK:STEP:panic or RANK:STEP:kill (e.g. 1:2)");
        let (rank, step, mode) = match parts.as_slice() {
            [r, k] => (r, k, FailureMode::Error),
            [r, k, "panic"] => (r, k, FailureMode::Panic),
            [r, k, "kill"] => (r, k, FailureMode::Kill),
            _ => return Err(bad()),
        };
        Ok(InjectedFailure {
            rank: rank.parse().map_err(|_| bad())?,
            step: step.parse().map_err(|_| bad())?,
            mode,
        })
    }
}

/// Everything a run needs. Make it with [`ExecConfig::new`], which checks it.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecConfig {
    /// The model (a transformer within the executor's subset; see [`ExecConfig::new`]).
    pub model: TransformerSpec,
    /// The schedule IR: the only description of order the executor is told.
    pub schedule: Schedule,
    /// Data-parallel replicas of the pipeline.
    pub dp: usize,
    /// Tensor-parallel ranks per pipeline rank (Megatron-style: heads, FFN columns and the
    /// vocabulary split over them; see `autopp_profiler::device::tp`). 1 unless set.
    pub tp: usize,
    /// Megatron's sequence parallelism within the tensor-parallel group (see
    /// `autopp_profiler::device::sp`): the hidden state between tensor-parallel regions is cut
    /// along the sequence. Needs the sequence length divisible by `tp`. Off unless set.
    pub sequence_parallel: bool,
    /// Sequences per micro-batch.
    pub micro_batch_size: usize,
    /// Layer-list entries (embedding, blocks, head) per global stage, in stage order.
    pub split: Vec<usize>,
    /// Training steps.
    pub steps: usize,
    /// Seed of the weights and the data.
    pub seed: u64,
    /// Optimizer.
    pub optimizer: AdamWConfig,
    /// How long a receive waits before it fails, seconds.
    pub recv_timeout_s: f64,
    /// A failure to inject on purpose (tests of failure handling); `None` runs normally.
    pub inject_failure: Option<InjectedFailure>,
    /// Where the GEMMs run (the CPU unless set).
    pub backend: Backend,
}

impl ExecConfig {
    /// A checked configuration: `model` must be a transformer the executor implements
    /// (LayerNorm, multi-head attention, plain GeLU MLP, untied LM head, no dropout) and at
    /// most [`MAX_PARAMS`](crate::MAX_PARAMS) parameters; `schedule` must pass the checker;
    /// `split` (default: Megatron's even split) must give each stage at least one layer-list
    /// entry.
    pub fn new(
        model: &Model,
        schedule: Schedule,
        dp: usize,
        micro_batch_size: usize,
        split: Option<Vec<usize>>,
    ) -> Result<ExecConfig, ExecError> {
        let Model::Transformer(spec) = model else {
            return Err(ExecError::Unsupported(format!(
                "exec runs transformers; '{}' is a layer list, whose layers have costs but no definition to execute",
                model.name()
            )));
        };
        let entries = spec.num_layers as usize + 2;
        let split = match split {
            Some(s) => s,
            None => {
                let mut kinds = vec![LayerKind::Embedding];
                kinds.extend(std::iter::repeat_n(LayerKind::Transformer, entries - 2));
                kinds.push(LayerKind::Head);
                default_split(&kinds, schedule.num_stages())?
            }
        };
        let cfg = ExecConfig {
            model: spec.clone(),
            schedule,
            dp,
            tp: 1,
            sequence_parallel: false,
            micro_batch_size,
            split,
            steps: 10,
            seed: 0,
            optimizer: AdamWConfig::default(),
            recv_timeout_s: 60.0,
            inject_failure: None,
            backend: Backend::Cpu,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// The checked configuration of `plan`'s pipeline for `model`: the schedule it specifies,
    /// generated, with its data-parallel degree, micro-batch size and split (see
    /// [`ExecConfig::new`]); the other fields keep their defaults.
    pub fn from_plan(model: &Model, plan: &PipelinePlan) -> Result<ExecConfig, ExecError> {
        let schedule = generate(&plan.spec)?;
        ExecConfig::new(
            model,
            schedule,
            plan.dp,
            plan.micro_batch_size,
            plan.split.clone(),
        )
    }

    /// Checks the configuration (also run by [`crate::run()`], since the fields are public).
    pub fn validate(&self) -> Result<(), ExecError> {
        check_model(&self.model).map_err(|e| ExecError::Unsupported(e.to_string()))?;
        if self.dp == 0 {
            return Err(ExecError::invalid("--dp", "must be at least 1"));
        }
        self.check_tp()?;
        if self.micro_batch_size == 0 {
            return Err(ExecError::invalid("--mbs", "must be at least 1"));
        }
        if self.steps == 0 {
            return Err(ExecError::invalid("--steps", "must be at least 1"));
        }
        // the products the run takes (ranks, sequences a step) must be numbers
        let ranks = self
            .pp()
            .checked_mul(self.dp)
            .and_then(|r| r.checked_mul(self.tp));
        if ranks.is_none() {
            return Err(ExecError::invalid(
                "--dp",
                format!(
                    "pp · dp · tp = {} · {} · {} ranks is more than any machine runs; use smaller degrees",
                    self.pp(),
                    self.dp,
                    self.tp
                ),
            ));
        }
        let batch = self
            .num_microbatches()
            .checked_mul(self.micro_batch_size)
            .and_then(|b| b.checked_mul(self.dp));
        if batch.is_none() {
            return Err(ExecError::invalid(
                "--mbs",
                format!(
                    "micro-batches · mbs · dp = {} · {} · {} sequences a step is more than any run takes; use a smaller micro-batch",
                    self.num_microbatches(),
                    self.micro_batch_size,
                    self.dp
                ),
            ));
        }
        if !(self.recv_timeout_s > 0.0 && self.recv_timeout_s.is_finite()) {
            return Err(ExecError::invalid(
                "--recv-timeout",
                "must be a positive number of seconds",
            ));
        }
        if let Some(f) = self.inject_failure {
            if f.rank >= self.world_size() || f.step == 0 || f.step > self.steps {
                return Err(ExecError::invalid(
                    "--inject-failure",
                    format!(
                        "{f} is outside the run: ranks are 0..{} and steps 1..={}",
                        self.world_size(),
                        self.steps
                    ),
                ));
            }
        }
        check(&self.schedule)?;
        check_split(
            &self.split,
            self.model.num_layers as usize + 2,
            self.num_stages(),
        )?;
        let batch = self.global_batch_size() as u64;
        let per_sequence: u64 = fp32_layer_bytes(&self.model, 1)
            .iter()
            .map(|b| b.activation_bytes)
            .sum();
        let bytes = per_sequence.saturating_mul(batch);
        if bytes > MAX_BATCH_ACTIVATION_BYTES {
            return Err(ExecError::Unsupported(format!(
                "one step keeps {:.1} GiB of activations for the whole batch of {batch} sequences of {} tokens (the single-worker check runs it at once), above the limit of {} GiB: use fewer or smaller micro-batches or a shorter --seq-len",
                bytes as f64 / (1u64 << 30) as f64,
                self.model.seq_length,
                MAX_BATCH_ACTIVATION_BYTES >> 30
            )));
        }
        Ok(())
    }

    /// Refuses a tensor-parallel degree the layers cannot split over: 0, or one that does not
    /// divide the heads, the FFN width and the vocabulary.
    fn check_tp(&self) -> Result<(), ExecError> {
        let m = &self.model;
        let tp = self.tp as u64;
        if tp == 0 {
            return Err(ExecError::invalid("--tp", "must be at least 1"));
        }
        for (what, n) in [
            ("attention heads", m.num_attention_heads),
            ("FFN width", m.ffn()),
            ("vocabulary", m.vocab_size),
        ] {
            if n % tp != 0 {
                return Err(ExecError::invalid(
                    "--tp",
                    format!(
                        "{tp} does not divide the {what} of '{}' ({n}); use a divisor of it",
                        m.name
                    ),
                ));
            }
        }
        let s = self.seq_len() as u64;
        if self.sequence_parallel && !s.is_multiple_of(tp) {
            return Err(ExecError::invalid(
                "--sequence-parallel",
                format!("needs the sequence length ({s}) divisible by --tp {tp}; use --seq-len a multiple of {tp}"),
            ));
        }
        Ok(())
    }

    /// Pipeline ranks.
    pub fn pp(&self) -> usize {
        self.schedule.pp
    }

    /// Global stages, `pp · v`.
    pub fn num_stages(&self) -> usize {
        self.schedule.num_stages()
    }

    /// Micro-batches per step per replica.
    pub fn num_microbatches(&self) -> usize {
        self.schedule.num_microbatches
    }

    /// Sequences per step over all replicas: `m · mbs · dp`.
    pub fn global_batch_size(&self) -> usize {
        self.num_microbatches() * self.micro_batch_size * self.dp
    }

    /// Ranks (threads): `pp · dp · tp`.
    pub fn world_size(&self) -> usize {
        self.pp() * self.dp * self.tp
    }

    /// Tokens per sequence.
    pub fn seq_len(&self) -> usize {
        self.model.seq_length as usize
    }

    /// The layer-list entries of each global stage.
    pub fn stage_ranges(&self) -> Vec<Range<usize>> {
        let mut first = 0;
        self.split
            .iter()
            .map(|&n| {
                let r = first..first + n;
                first += n;
                r
            })
            .collect()
    }

    /// The global sequence indices of micro-batch `microbatch` of replica `replica`: sequences
    /// are numbered replica-major, then micro-batch, then row, so the whole batch in order is
    /// what the single-worker check trains on.
    pub fn sequences_of(&self, replica: usize, microbatch: usize) -> Range<usize> {
        let first = (replica * self.num_microbatches() + microbatch) * self.micro_batch_size;
        first..first + self.micro_batch_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use autopp_schedule::{ScheduleKind, ScheduleSpec, SpecField};

    #[test]
    fn a_plan_runs_its_schedule_and_its_errors_name_the_field() {
        let model = autopp_models::load("tiny-gpt")
            .unwrap()
            .with_seq_length(8)
            .unwrap();
        let mut plan = PipelinePlan {
            spec: ScheduleSpec::new(ScheduleKind::ZbH1, 2, 4),
            dp: 2,
            micro_batch_size: 3,
            split: None,
        };
        let c = ExecConfig::from_plan(&model, &plan).unwrap();
        assert_eq!(c.schedule, generate(&plan.spec).unwrap());
        assert_eq!((c.dp, c.micro_batch_size, c.world_size()), (2, 3, 4));
        assert_eq!(
            c.split.iter().sum::<usize>(),
            c.model.num_layers as usize + 2
        );
        assert_eq!(c.pipeline_messages_per_step(), 2 * 4);
        let hidden = c.model.hidden_size as usize;
        assert_eq!(c.pipeline_message_bytes(), 3 * 8 * hidden * 4);

        plan.split = Some(vec![1, 2]);
        match ExecConfig::from_plan(&model, &plan) {
            Err(ExecError::Split(e)) => assert_eq!(e.field(), SpecField::Split),
            other => panic!("{other:?}"),
        }
        plan.spec.pp = 1;
        match ExecConfig::from_plan(&model, &plan) {
            Err(ExecError::ScheduleSpec(e)) => assert_eq!(e.field(), SpecField::Pp),
            other => panic!("{other:?}"),
        }
    }
}
