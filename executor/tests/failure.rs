//! Failure handling: a rank that fails (an error or a panic) stops every other rank at once,
//! and the error names the rank, the step and the action.

use std::time::{Duration, Instant};

use autopp_executor::{run, ExecConfig, ExecError, FailureMode, InjectedFailure};
use autopp_schedule::{generate, ScheduleKind, ScheduleSpec};

fn config(kind: ScheduleKind, pp: usize, v: usize, dp: usize) -> ExecConfig {
    let model = autopp_models::load("tiny-gpt")
        .unwrap()
        .with_seq_length(16)
        .unwrap();
    let mut spec = ScheduleSpec::new(kind, pp, 4);
    spec.virtual_stages = v;
    let mut cfg = ExecConfig::new(&model, generate(&spec).unwrap(), dp, 1, None).unwrap();
    cfg.steps = 3;
    cfg.recv_timeout_s = 60.0;
    cfg
}

fn fails_fast(mut cfg: ExecConfig, failure: InjectedFailure) -> ExecError {
    cfg.inject_failure = Some(failure);
    let start = Instant::now();
    let e = run(&cfg, &mut |_| {}).unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    e
}

#[test]
fn every_rank_of_every_shape_stops_when_one_fails() {
    let cases = [
        (ScheduleKind::OneFOneB, 2, 1, 1),
        (ScheduleKind::OneFOneB, 4, 1, 1),
        (ScheduleKind::Interleaved1F1B, 2, 2, 2),
        (ScheduleKind::ZbH1, 2, 1, 1),
    ];
    for (kind, pp, v, dp) in cases {
        let cfg = config(kind, pp, v, dp);
        for rank in 0..pp * dp {
            for mode in [FailureMode::Error, FailureMode::Panic] {
                let failure = InjectedFailure {
                    rank,
                    step: 2,
                    mode,
                };
                match fails_fast(cfg.clone(), failure) {
                    ExecError::Rank {
                        rank: r,
                        step,
                        action,
                        message,
                        ..
                    } => {
                        assert_eq!((r, step), (rank, 2), "{kind} {failure}: {message}");
                        assert!(action.is_some(), "{kind} {failure}");
                        assert!(message.contains("injected failure"), "{message}");
                        assert_eq!(
                            message.starts_with("panicked"),
                            mode == FailureMode::Panic,
                            "{message}"
                        );
                    }
                    e => panic!("{kind} {failure}: {e}"),
                }
            }
        }
    }
}

/// A killed process would take every thread with it: the threaded run refuses `:kill` before
/// any rank starts.
#[test]
fn a_kill_is_refused_when_ranks_are_threads() {
    let mut cfg = config(ScheduleKind::OneFOneB, 2, 1, 1);
    let failure: InjectedFailure = "1:2:kill".parse().unwrap();
    assert_eq!(failure.mode, FailureMode::Kill);
    assert_eq!(failure.to_string(), "1:2:kill");
    cfg.inject_failure = Some(failure);
    let e = run(&cfg, &mut |_| {}).unwrap_err().to_string();
    assert!(
        e.starts_with("--inject-failure: 1:2:kill") && e.contains("only for --transport mpi"),
        "{e}"
    );
}
