//! One rank's runtime: it runs its list of the schedule IR in order — receive, compute, send —
//! keeps each (stage, micro-batch)'s saved tensors from `F` to `B` (or `I`, then what `W` needs
//! until `W`), accumulates gradients over micro-batches, all-reduces them across data-parallel
//! replicas and takes an AdamW step.
//!
//! An overlapped pair runs its two actions one after the other, forward first: the pair's
//! forward allocates before its backward frees, as the simulator counts it.

use std::collections::{BTreeMap, HashMap};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use autopp_profiler::device::{Abort, Direction, Flow, GroupComm, Shard, Tag, Tensor, Transport};
use autopp_schedule::deps::{self, Output};
use autopp_schedule::{Action, ActionKind, Step};

use crate::barrier::Barrier;
use crate::config::{ExecConfig, FailureMode};
use crate::error::{panic_text, ExecError, RankError};
use crate::optim::AdamState;
use crate::record::{ActionEvent, RankStep};
use crate::stage::{Stage, StageSaved, StageWeightSaved};
use crate::topology::Place;
use autopp_profiler::data::SyntheticData;

/// What a rank keeps for a (stage, micro-batch) between its actions.
enum Held {
    Activations(StageSaved),
    ForWeights(StageWeightSaved),
}

impl Held {
    fn bytes(&self) -> u64 {
        match self {
            Held::Activations(s) => s.bytes(),
            Held::ForWeights(w) => w.bytes(),
        }
    }
}

/// What every rank shares.
pub(crate) struct Shared<'a> {
    pub(crate) cfg: &'a ExecConfig,
    pub(crate) data: SyntheticData,
    pub(crate) barrier: Barrier,
    /// Set when any rank fails: blocked receives and the barrier give up.
    pub(crate) abort: Abort,
    /// Ranks are processes: meet at the start of a step through the transport (an all-reduce
    /// over the world) instead of [`Shared::barrier`].
    pub(crate) world_sync: bool,
    pub(crate) epoch: Instant,
}

impl Shared<'_> {
    /// Tells every rank to stop: wakes the barrier and every blocked receive.
    pub(crate) fn abort_all(&self) {
        self.abort.trigger();
        self.barrier.abort();
    }
}

/// One rank.
pub(crate) struct Worker<'a, T: Transport> {
    shared: &'a Shared<'a>,
    place: Place,
    stages: BTreeMap<usize, (Stage, AdamState)>,
    transport: T,
    held: HashMap<(u32, u32), Held>,
    held_bytes: u64,
    /// Tensors between two stages on this rank.
    local: HashMap<Tag, Tensor>,
    /// This rank's tensor-parallel group (world ranks, tensor-parallel rank order).
    tp_group: Vec<usize>,
    /// The f64 buffer the tensor-parallel all-reduces widen into (reused).
    tp_buffer: Vec<f64>,
    loss_scale: f32,
    /// The action running now, for the error message if it fails or panics.
    current: Option<Action>,
}

impl<'a, T: Transport> Worker<'a, T> {
    /// The rank `transport.rank()` (see [`ExecConfig::place`]).
    pub(crate) fn new(shared: &'a Shared<'a>, transport: T) -> Self {
        let cfg = shared.cfg;
        let place = cfg.place(transport.rank());
        let ranges = cfg.stage_ranges();
        let shard = Shard {
            rank: place.tp_rank,
            size: cfg.tp,
        };
        let stages = cfg
            .schedule
            .stages_of(place.pp_rank)
            .into_iter()
            .map(|s| {
                let stage = Stage::new(&cfg.model, cfg.seed, ranges[s].clone(), shard);
                let adam = AdamState::new(&stage);
                (s, (stage, adam))
            })
            .collect();
        let tokens = cfg.global_batch_size() * cfg.seq_len();
        Worker {
            shared,
            place,
            stages,
            transport,
            held: HashMap::new(),
            held_bytes: 0,
            local: HashMap::new(),
            tp_group: cfg.tensor_parallel_group(place.replica, place.pp_rank),
            tp_buffer: Vec::new(),
            loss_scale: 1.0 / tokens as f32,
            current: None,
        }
    }

    fn now_s(&self) -> f64 {
        self.shared.epoch.elapsed().as_secs_f64()
    }

    /// Runs training step `step` (0-based).
    pub(crate) fn run_step(
        &mut self,
        step: usize,
    ) -> Result<RankStep, (Option<Action>, RankError)> {
        let cfg = self.shared.cfg;
        let timeout = Duration::from_secs_f64(cfg.recv_timeout_s);
        self.current = None;
        if self.shared.world_sync {
            let world: Vec<usize> = (0..cfg.world_size()).collect();
            self.transport
                .all_reduce_sum(&world, &mut [0.0])
                .map_err(|e| (None, e.into()))?;
        } else {
            self.wait_at_barrier(timeout)?;
        }
        let start_s = self.now_s();
        let mut out = RankStep {
            loss_sum: 0.0,
            events: Vec::new(),
            memory: Vec::new(),
            peak_activation_bytes: 0,
            start_s,
            pipeline_end_s: start_s,
            end_s: start_s,
        };
        let list = &cfg.schedule.ranks[self.place.pp_rank];
        let actions: Vec<Action> = list
            .iter()
            .flat_map(|s| match *s {
                Step::One(a) => vec![a],
                Step::Overlapped(a, b) if b.kind == ActionKind::F && a.kind != ActionKind::F => {
                    vec![b, a]
                }
                Step::Overlapped(a, b) => vec![a, b],
            })
            .collect();
        let inject = cfg
            .inject_failure
            .filter(|f| f.rank == self.place.rank && f.step == step + 1);
        let middle = actions.len() / 2;
        for (index, a) in actions.into_iter().enumerate() {
            self.current = Some(a);
            if let Some(f) = inject.filter(|_| index == middle) {
                let what = format!("injected failure (--inject-failure {f})");
                match f.mode {
                    FailureMode::Error => return Err((Some(a), RankError::Injected(what))),
                    FailureMode::Panic => panic!("{what}"),
                    FailureMode::Kill => kill_this_process(),
                }
            }
            let event = self
                .run_action(a, step, &mut out.loss_sum)
                .map_err(|e| (Some(a), e))?;
            out.events.push(event);
            out.memory.push((event.end_s, self.held_bytes));
            out.peak_activation_bytes = out.peak_activation_bytes.max(self.held_bytes);
        }
        if !self.held.is_empty() || !self.local.is_empty() {
            return Err((
                None,
                RankError::Schedule(format!(
                    "the list ended with {} (stage, micro-batch) pairs still holding tensors and {} unconsumed local tensors",
                    self.held.len(),
                    self.local.len()
                )),
            ));
        }
        self.current = None;
        out.pipeline_end_s = self.now_s();
        self.reduce_and_step().map_err(|e| (None, e))?;
        out.end_s = self.now_s();
        Ok(out)
    }

    /// Waits for every thread at the start-of-step barrier.
    fn wait_at_barrier(&self, timeout: Duration) -> Result<(), (Option<Action>, RankError)> {
        self.shared.barrier.wait(timeout).map_err(|e| {
            let e = if self.shared.abort.is_set() {
                RankError::Aborted(e.to_string())
            } else {
                RankError::Schedule(e.to_string())
            };
            (None, e)
        })
    }

    /// The data-parallel all-reduce of each stage's gradients (one buffer per stage, stages in
    /// order), then AdamW and zeroed gradients.
    fn reduce_and_step(&mut self) -> Result<(), RankError> {
        let cfg = self.shared.cfg;
        let group = cfg.data_parallel_group(self.place.pp_rank, self.place.tp_rank);
        for (stage, adam) in self.stages.values_mut() {
            if group.len() > 1 {
                let mut flat = stage.flat_grads();
                self.transport.all_reduce_sum(&group, &mut flat)?;
                stage.set_flat_grads(&flat);
            }
            adam.step(&cfg.optimizer, stage);
            stage.zero_grads();
        }
        Ok(())
    }

    /// Hands `tensor` to the rank that holds `tag.stage`: locally when that is this rank.
    fn deliver(&mut self, tag: Tag, tensor: Tensor) -> Result<(), RankError> {
        let to = self.shared.cfg.schedule.rank_of(tag.stage as usize);
        if to == self.place.pp_rank {
            self.local.insert(tag, tensor);
            Ok(())
        } else {
            let peer = self
                .shared
                .cfg
                .world_rank(self.place.replica, to, self.place.tp_rank);
            Ok(self.transport.send(peer, tag, tensor)?)
        }
    }

    /// Takes the tensor for `tag`, sent by the rank that holds stage `from_stage`.
    fn fetch(&mut self, tag: Tag, from_stage: usize) -> Result<Tensor, RankError> {
        let from = self.shared.cfg.schedule.rank_of(from_stage);
        if from == self.place.pp_rank {
            self.local.remove(&tag).ok_or_else(|| {
                RankError::Schedule(format!(
                    "{tag} should come from stage {from_stage} on this rank, which has not produced it yet"
                ))
            })
        } else {
            let peer = self
                .shared
                .cfg
                .world_rank(self.place.replica, from, self.place.tp_rank);
            Ok(self.transport.recv(peer, tag)?)
        }
    }

    /// The tensor `a` receives from another stage ([`deps::received`]): the previous stage's
    /// activation for an `F`, the next stage's gradient for a `B` or `I`; `None` for the
    /// others (the first stage's `F` reads tokens, the last stage's backward starts from the
    /// loss).
    fn receive(&mut self, a: Action) -> Result<Option<Tensor>, RankError> {
        let num_stages = self.shared.cfg.num_stages();
        let Some(input) = deps::received(a.kind, a.stage as usize, num_stages) else {
            return Ok(None);
        };
        let tag = Tag {
            stage: a.stage,
            microbatch: a.microbatch,
            direction: direction(input.output),
        };
        self.fetch(tag, input.stage).map(Some)
    }

    /// Sends `tensor`, the result of `a`, to the stage that waits for it ([`deps::consumer`]);
    /// nothing when no other stage does (the first stage's input gradient).
    fn send(&mut self, a: Action, tensor: Tensor) -> Result<(), RankError> {
        let num_stages = self.shared.cfg.num_stages();
        let (Some(to), Some(output)) = (
            deps::consumer(a.kind, a.stage as usize, num_stages),
            deps::output(a.kind),
        ) else {
            return Ok(());
        };
        let tag = Tag {
            stage: to as u32,
            microbatch: a.microbatch,
            direction: direction(output),
        };
        self.deliver(tag, tensor)
    }

    fn hold(&mut self, key: (u32, u32), held: Held) {
        self.held_bytes += held.bytes();
        self.held.insert(key, held);
    }

    fn release(&mut self, key: (u32, u32)) -> Option<Held> {
        let h = self.held.remove(&key)?;
        self.held_bytes -= h.bytes();
        Some(h)
    }

    fn run_action(
        &mut self,
        a: Action,
        step: usize,
        loss_sum: &mut f64,
    ) -> Result<ActionEvent, RankError> {
        let cfg = self.shared.cfg;
        let (s, i) = (a.stage as usize, a.microbatch as usize);
        let last = cfg.num_stages() - 1;
        let key = (a.stage, a.microbatch);
        let sequences = cfg.sequences_of(self.place.replica, i);
        let missing = |what: &str| RankError::Schedule(format!("{a} runs before {what}"));
        if !self.stages.contains_key(&s) {
            return Err(RankError::Schedule(format!(
                "{a} names stage {s}, which this rank does not hold"
            )));
        }
        let t0 = self.now_s();
        let mut tp_comm_s = 0.0;
        let event = match a.kind {
            ActionKind::F => {
                let input = match self.receive(a)? {
                    Some(x) => Flow::Hidden(x),
                    None => Flow::Tokens(self.shared.data.inputs(step, sequences.clone())),
                };
                let targets =
                    (s == last).then(|| self.shared.data.targets(step, sequences.clone()));
                let start_s = self.now_s();
                let (stage, _) = &self.stages[&s];
                let mut tp =
                    GroupComm::new(&mut self.transport, &self.tp_group, &mut self.tp_buffer)
                        .sequence_parallel(cfg.sequence_parallel);
                let (out, saved) =
                    stage.forward(input, targets, sequences.len(), cfg.seq_len(), &mut tp)?;
                tp_comm_s = tp.spent_s;
                if self.held.contains_key(&key) {
                    return Err(RankError::Schedule(format!("{a} runs twice")));
                }
                self.hold(key, Held::Activations(saved));
                match out {
                    // every tensor-parallel rank has the loss; rank 0 reports it
                    Flow::Loss(l) if self.place.tp_rank == 0 => *loss_sum += l,
                    Flow::Loss(_) => {}
                    Flow::Hidden(y) => self.send(a, y)?,
                    Flow::Tokens(_) => return Err(missing("its stage produced tokens")),
                }
                (start_s, self.now_s())
            }
            ActionKind::B | ActionKind::I => {
                let d_out = self.receive(a)?;
                let start_s = self.now_s();
                let saved = match self.release(key) {
                    Some(Held::Activations(saved)) => saved,
                    Some(other) => {
                        self.hold(key, other);
                        return Err(missing("its forward (it was already backpropagated)"));
                    }
                    None => return Err(missing("its forward")),
                };
                let (stage, _) = self.stages.get_mut(&s).ok_or_else(|| missing("stage"))?;
                let mut tp =
                    GroupComm::new(&mut self.transport, &self.tp_group, &mut self.tp_buffer)
                        .sequence_parallel(cfg.sequence_parallel);
                let (dx, ws) = stage.backward_input(saved, d_out, self.loss_scale, &mut tp)?;
                tp_comm_s = tp.spent_s;
                if a.kind == ActionKind::B {
                    stage.backward_weight(ws)?;
                } else {
                    self.hold(key, Held::ForWeights(ws));
                }
                if let Some(dx) = dx {
                    self.send(a, dx)?;
                }
                (start_s, self.now_s())
            }
            ActionKind::W => {
                let start_s = self.now_s();
                let ws = match self.release(key) {
                    Some(Held::ForWeights(ws)) => ws,
                    Some(other) => {
                        self.hold(key, other);
                        return Err(missing("its backward-input"));
                    }
                    None => return Err(missing("its backward-input")),
                };
                let (stage, _) = self.stages.get_mut(&s).ok_or_else(|| missing("stage"))?;
                stage.backward_weight(ws)?;
                (start_s, self.now_s())
            }
        };
        Ok(ActionEvent {
            action: a,
            start_s: event.0,
            end_s: event.1,
            wait_s: event.0 - t0,
            tp_comm_s,
        })
    }

    /// The rank's stages after the last step.
    pub(crate) fn into_stages(self) -> Vec<Stage> {
        self.stages.into_values().map(|(s, _)| s).collect()
    }

    /// [`Worker::run_step`] with a panic caught as a failure of the running action: the step's
    /// record, or the failure as this rank's [`ExecError::Rank`] and whether it is secondary
    /// (a rank that gave up because another failed).
    pub(crate) fn run_step_caught(&mut self, step: usize) -> Result<RankStep, (ExecError, bool)> {
        let (action, message, secondary) =
            match catch_unwind(AssertUnwindSafe(|| self.run_step(step))) {
                Ok(Ok(s)) => return Ok(s),
                Ok(Err((action, e))) => (action, e.to_string(), e.is_secondary()),
                Err(payload) => (self.current, panic_text(payload.as_ref()), false),
            };
        let e = self
            .place
            .failure(step + 1, action.map(|a| a.to_string()), message);
        Err((e, secondary))
    }
}

/// How a result travels between ranks: a forward's as an activation, a backward's as a
/// gradient.
fn direction(output: Output) -> Direction {
    match output {
        Output::Forward => Direction::Activation,
        Output::Backward => Direction::Gradient,
    }
}

/// Ends this process at once, as if it were killed (`--inject-failure RANK:STEP:kill`):
/// SIGKILL on Unix, so nothing of this process runs after it — no error line, no unwinding,
/// no `MPI_Abort`; an abort elsewhere.
fn kill_this_process() -> ! {
    #[cfg(unix)]
    {
        // SAFETY: `raise` has no memory-safety preconditions; SIGKILL cannot be caught or
        // ignored, so the process ends here.
        unsafe {
            libc::raise(libc::SIGKILL);
        }
    }
    std::process::abort()
}
