//! The dependency rule between actions, written once: what each action waits for.
//!
//! ```text
//! F(s,i)      ← F(s−1,i)                the previous stage's activation (none on stage 0)
//! B/I(s,i)    ← F(s,i), B-or-I(s+1,i)   its own forward; the next stage's input gradient
//!                                       (none on the last stage)
//! W(s,i)      ← I(s,i)                  its own backward-input
//! ```
//!
//! Every consumer reads the rule from here: the checker (same-rank order), the simulator's two
//! loops (when a step can start), and the executor (what a rank receives, and from which stage).
//! [`consumer`] is the same rule read the other way: which other stage waits for an action's
//! output.

use crate::ir::ActionKind;

/// Which result of a (stage, micro-batch) an action waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Output {
    /// The end of its forward `F`: the activation it passes on (and, on its own stage, what
    /// its backward reads).
    Forward,
    /// The end of its backward-input part — a full backward `B`, or `I` when the backward is
    /// split: the gradient with respect to the stage's input.
    Backward,
}

/// One input of an action: `output` of global stage `stage`, on the action's own micro-batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Input {
    /// The global stage whose action produces it (the action's own, or a neighbour).
    pub stage: usize,
    /// Which of that stage's results.
    pub output: Output,
}

/// The inputs of an action of `kind` on global stage `stage` of `num_stages` (see the
/// [module docs](self)): at most two, its own stage's first — the order in which a waiting
/// rank checks them.
///
/// ```
/// use autopp_schedule::deps::{inputs, Input, Output};
/// use autopp_schedule::ActionKind;
///
/// let [own, next] = inputs(ActionKind::B, 1, 4);
/// assert_eq!(own, Some(Input { stage: 1, output: Output::Forward }));
/// assert_eq!(next, Some(Input { stage: 2, output: Output::Backward }));
/// assert_eq!(inputs(ActionKind::F, 0, 4), [None, None]);
/// ```
#[inline(always)]
pub fn inputs(kind: ActionKind, stage: usize, num_stages: usize) -> [Option<Input>; 2] {
    let mut out = [None, None];
    let mut n = 0;
    let _ = try_for_each_input(kind, stage, num_stages, |input| {
        out[n] = Some(input);
        n += 1;
        Ok::<(), ()>(())
    });
    out
}

/// Calls `f` on each of the [`inputs`] of an action of `kind` on `stage`, in order, until it
/// fails. This is where the rule is written; each arm calls `f` with inputs known where it
/// stands, so a caller's loop over them compiles to straight-line code per kind.
#[inline(always)]
pub fn try_for_each_input<E>(
    kind: ActionKind,
    stage: usize,
    num_stages: usize,
    mut f: impl FnMut(Input) -> Result<(), E>,
) -> Result<(), E> {
    let input = |stage, output| Input { stage, output };
    match kind {
        ActionKind::F if stage == 0 => Ok(()),
        ActionKind::F => f(input(stage - 1, Output::Forward)),
        ActionKind::B | ActionKind::I => {
            f(input(stage, Output::Forward))?;
            if stage + 1 < num_stages {
                f(input(stage + 1, Output::Backward))?;
            }
            Ok(())
        }
        ActionKind::W => f(input(stage, Output::Backward)),
    }
}

/// The result an action of `kind` gives the actions that wait for it: `F` its forward, `B` and
/// `I` the backward-input part; `W` none (nothing waits for a `W`).
#[inline(always)]
pub fn output(kind: ActionKind) -> Option<Output> {
    match kind {
        ActionKind::F => Some(Output::Forward),
        ActionKind::B | ActionKind::I => Some(Output::Backward),
        ActionKind::W => None,
    }
}

/// The input an action of `kind` on `stage` receives from another stage (the previous stage's
/// activation for `F`, the next stage's gradient for `B`/`I`), if it has one.
#[inline]
pub fn received(kind: ActionKind, stage: usize, num_stages: usize) -> Option<Input> {
    inputs(kind, stage, num_stages)
        .into_iter()
        .flatten()
        .find(|x| x.stage != stage)
}

/// The other stage that waits for the output of an action of `kind` on `stage` (the next
/// stage for `F`, the previous one for `B`/`I`), if any: [`received`] read the other way.
#[inline]
pub fn consumer(kind: ActionKind, stage: usize, num_stages: usize) -> Option<usize> {
    match kind {
        ActionKind::F => Some(stage + 1).filter(|&s| s < num_stages),
        ActionKind::B | ActionKind::I => stage.checked_sub(1),
        ActionKind::W => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KINDS: [ActionKind; 4] = [ActionKind::F, ActionKind::B, ActionKind::I, ActionKind::W];

    /// Every stage's received input is some other stage's output sent to it, and back.
    #[test]
    fn consumer_reads_received_the_other_way() {
        for n in 1..6 {
            for s in 0..n {
                for k in KINDS {
                    if let Some(to) = consumer(k, s, n) {
                        let wanted = if k == ActionKind::F {
                            Output::Forward
                        } else {
                            Output::Backward
                        };
                        let back = KINDS
                            .into_iter()
                            .filter_map(|kk| received(kk, to, n))
                            .any(|x| x.stage == s && x.output == wanted);
                        assert!(back, "{k:?} on {s} of {n} feeds {to}");
                    }
                    if let Some(x) = received(k, s, n) {
                        let from = if x.output == Output::Forward {
                            ActionKind::F
                        } else {
                            ActionKind::I
                        };
                        assert_eq!(consumer(from, x.stage, n), Some(s), "{k:?} on {s} of {n}");
                    }
                }
            }
        }
    }
}
