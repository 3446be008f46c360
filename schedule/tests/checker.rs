//! The checker against hand-made lists: broken ones are rejected with a message naming the
//! rank and the action; valid ones with split backwards, overlapped pairs and V placement
//! (what the zero-bubble and DualPipe schedules need) pass.

use autopp_schedule::{check, parse_steps, CheckError, Placement, Schedule, ScheduleKind};

fn sched(pp: usize, v: usize, m: usize, placement: Placement, lists: &[&str]) -> Schedule {
    Schedule {
        kind: ScheduleKind::OneFOneB,
        pp,
        virtual_stages: v,
        num_microbatches: m,
        placement,
        ranks: lists.iter().map(|l| parse_steps(l).unwrap()).collect(),
    }
}

fn err(s: &Schedule) -> String {
    check(s).unwrap_err().to_string()
}

#[test]
fn missing_backward_names_rank_and_action() {
    let s = sched(
        2,
        1,
        2,
        Placement::Looped,
        &["0F0 0F1 0B0", "1F0 1B0 1F1 1B1"],
    );
    let e = err(&s);
    assert!(e.contains("rank 0") && e.contains("0B1"), "{e}");
    assert!(matches!(
        check(&s),
        Err(CheckError::Missing { rank: 0, .. })
    ));
}

#[test]
fn missing_forward_names_rank_and_action() {
    let s = sched(2, 1, 1, Placement::Looped, &["0F0 0B0", "1B0"]);
    let e = err(&s);
    assert!(e.contains("rank 1 never runs 1F0"), "{e}");
}

#[test]
fn reversed_dependency_names_rank_and_action() {
    let s = sched(
        2,
        1,
        2,
        Placement::Looped,
        &["0F0 0F1 0B1 0B0", "1F0 1B1 1F1 1B0"],
    );
    let e = err(&s);
    assert!(
        e.contains("rank 1, step 1: 1B1 runs before its dependency 1F1"),
        "{e}"
    );
    assert!(matches!(
        check(&s),
        Err(CheckError::ReversedDependency {
            rank: 1,
            step_index: 1,
            ..
        })
    ));
    // W before its I.
    let s = sched(1, 1, 1, Placement::Looped, &["0F0 0W0 0I0"]);
    let e = err(&s);
    assert!(
        e.contains("rank 0, step 1: 0W0 runs before its dependency 0I0"),
        "{e}"
    );
}

#[test]
fn deadlocking_order_names_the_stuck_ranks() {
    // Rank 1 wants micro-batch 1 first, but rank 0 only sends it after the backward of
    // micro-batch 0, which rank 1 runs later.
    let s = sched(
        2,
        1,
        2,
        Placement::Looped,
        &["0F0 0B0 0F1 0B1", "1F1 1F0 1B0 1B1"],
    );
    let e = err(&s);
    assert!(e.contains("deadlocks"), "{e}");
    assert!(
        e.contains("rank 0 is stuck at step 1 (0B0) waiting for 1B0"),
        "{e}"
    );
    assert!(e.contains("rank 1 at step 0 (1F1) waits for 0F1"), "{e}");
}

#[test]
fn duplicates_ranges_and_placement() {
    let s = sched(1, 1, 1, Placement::Looped, &["0F0 0F0 0B0"]);
    assert!(err(&s).contains("rank 0, step 1: 0F0 runs a second time"));
    let s = sched(1, 1, 1, Placement::Looped, &["0F0 0B0 1F0"]);
    assert!(err(&s).contains("rank 0, step 2: 1F0 names stage 1"));
    let s = sched(1, 1, 1, Placement::Looped, &["0F0 0B0 0F1"]);
    assert!(err(&s).contains("rank 0, step 2: 0F1 names micro-batch 1"));
    let s = sched(2, 1, 1, Placement::Looped, &["0F0 1F0 1B0 0B0", ""]);
    assert!(err(&s).contains("rank 0, step 1: 1F0 is on the wrong rank"));
    let s = sched(2, 1, 1, Placement::Looped, &["0F0 0B0"]);
    assert!(err(&s).contains("1 rank lists but pp = 2"));
}

#[test]
fn split_and_full_backward_rules() {
    let s = sched(1, 1, 1, Placement::Looped, &["0F0 0I0"]);
    assert!(err(&s).contains("rank 0 never runs 0W0"), "{}", err(&s));
    let s = sched(1, 1, 1, Placement::Looped, &["0F0 0W0"]);
    assert!(err(&s).contains("rank 0 never runs 0I0"), "{}", err(&s));
    let s = sched(1, 1, 1, Placement::Looped, &["0F0 0B0 0I0 0W0"]);
    assert!(
        err(&s).contains("0I0 splits a backward that 0B0 already runs"),
        "{}",
        err(&s)
    );
}

#[test]
fn overlapped_pair_cannot_depend_on_itself() {
    let s = sched(1, 1, 1, Placement::Looped, &["(0F0;0B0)"]);
    let e = err(&s);
    assert!(
        e.contains("rank 0, step 0: 0B0 (in the overlapped pair (0F0;0B0))"),
        "{e}"
    );
}

/// A ZB-H1-like list (Qi et al., 2024): backward split into I and W, W deferred.
#[test]
fn split_backward_schedule_passes() {
    let s = sched(
        2,
        1,
        3,
        Placement::Looped,
        &[
            "0F0 0F1 0I0 0F2 0I1 0W0 0I2 0W1 0W2",
            "1F0 1I0 1F1 1I1 1W0 1F2 1I2 1W1 1W2",
        ],
    );
    check(&s).unwrap();
    assert_eq!(s.peak_inflight(), [3, 2]);
}

/// V placement (rank r holds stages r and 2p−1−r) with an overlapped forward/backward pair,
/// as in DualPipe-V, and one split backward.
#[test]
fn v_placement_with_overlapped_pair_passes() {
    let s = sched(
        2,
        2,
        2,
        Placement::V,
        &[
            "0F0 0F1 3F0 3B0 (3F1;0B0) 3B1 0B1",
            "1F0 2F0 1F1 2F1 2B0 1I0 2B1 1B1 1W0",
        ],
    );
    assert_eq!(s.stages_of(0), [0, 3]);
    assert_eq!(s.stages_of(1), [1, 2]);
    check(&s).unwrap();
    // Looped placement would put stage 3 on rank 1.
    let looped = Schedule {
        placement: Placement::Looped,
        ..s
    };
    assert!(err(&looped).contains("rank 0, step 2: 3F0 is on the wrong rank"));
}

/// A schedule that declares far more micro-batches than it lists is rejected without
/// allocating tables for all of them.
#[test]
fn huge_declared_sizes_are_rejected_cheaply() {
    let s = sched(2, 1, 1 << 40, Placement::Looped, &["0F0 0B0", "1F0 1B0"]);
    assert!(err(&s).contains("rank 0 never runs 0F1"), "{}", err(&s));
    let s = sched(
        2,
        usize::MAX,
        usize::MAX,
        Placement::Looped,
        &["0F0", "1F0"],
    );
    assert!(check(&s).is_err());
    let e = autopp_schedule::simulate(
        &sched(2, 1, 1 << 40, Placement::Looped, &["0F0 0B0", "1F0 1B0"]),
        &autopp_schedule::SimCosts::uniform(2, 1.0, 2.0, 1.0, 1.0, 0.0),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("fewer than the pp x virtual_stages"),
        "{e}"
    );
}
