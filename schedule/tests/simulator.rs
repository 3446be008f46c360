//! The event simulator on hand-made lists whose times, idle and memory can be worked out by
//! hand: communication, split backwards, overlapped pairs, per-stage bytes.

use autopp_schedule::{
    parse_steps, simulate, simulate_metrics, Placement, Schedule, ScheduleKind, SimCosts, SimError,
    StageCosts,
};

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

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

#[test]
fn communication_is_charged_between_ranks() {
    let s = sched(2, 1, 1, Placement::Looped, &["0F0 0B0", "1F0 1B0"]);
    let r = simulate(&s, &SimCosts::uniform(2, 1.0, 2.0, 1.0, 1.0, 0.5)).unwrap();
    let times: Vec<Vec<(f64, f64)>> = r
        .timeline
        .iter()
        .map(|l| l.iter().map(|t| (t.start_s, t.end_s)).collect())
        .collect();
    // 0F0 [0,1] → +0.5 → 1F0 [1.5,2.5] → 1B0 [2.5,4.5] → +0.5 → 0B0 [5,7].
    assert_eq!(
        times,
        vec![vec![(0.0, 1.0), (5.0, 7.0)], vec![(1.5, 2.5), (2.5, 4.5)]]
    );
    assert_eq!(r.makespan_s, 7.0);
    assert_eq!(r.busy_s, [3.0, 3.0]);
    assert!(close(r.bubble_fraction, 8.0 / 14.0));
}

#[test]
fn no_communication_between_stages_on_one_rank() {
    // V placement with p = 1: stages 0 and 1 both on rank 0.
    let s = sched(1, 2, 1, Placement::V, &["0F0 1F0 1B0 0B0"]);
    let r = simulate(&s, &SimCosts::uniform(2, 1.0, 2.0, 1.0, 1.0, 10.0)).unwrap();
    assert_eq!(r.makespan_s, 6.0);
    assert_eq!(r.bubble_fraction, 0.0);
}

#[test]
fn split_backward_times_and_memory() {
    let mut costs = SimCosts::uniform(1, 1.0, 2.0, 1.5, 0.5, 0.0);
    costs.stages[0].activation_bytes = 10;
    costs.stages[0].weight_grad_bytes = 4;
    let s = sched(1, 1, 2, Placement::Looped, &["0F0 0F1 0I0 0I1 0W0 0W1"]);
    let r = simulate(&s, &costs).unwrap();
    // F0 [0,1] F1 [1,2] I0 [2,3.5] I1 [3.5,5] W0 [5,5.5] W1 [5.5,6]
    assert_eq!(r.makespan_s, 6.0);
    assert_eq!(
        r.memory[0],
        vec![
            (0.0, 10),
            (1.0, 20),
            (3.5, 14),
            (5.0, 8),
            (5.5, 4),
            (6.0, 0)
        ]
    );
    assert_eq!(r.peak_activation_bytes, [20]);
    // In-flight is freed at the W: the peak is 2.
    assert_eq!(r.peak_inflight, [2]);
}

#[test]
fn peak_inflight_counts_along_the_list() {
    let s = sched(1, 1, 3, Placement::Looped, &["0F0 0F1 0I0 0F2 0W0 0B1 0B2"]);
    let r = simulate(&s, &SimCosts::uniform(1, 1.0, 2.0, 1.0, 1.0, 0.0));
    // 0I0/0W0 split, 0B1 and 0B2 full: +1 +1 0 +1 −1 −1 −1 → peak 3.
    let r = r.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.peak_inflight, [3]);
    assert_eq!(s.peak_inflight(), [3]);
}

#[test]
fn overlapped_pair_lasts_sum_or_overlapped_time() {
    let s = sched(
        2,
        2,
        2,
        Placement::V,
        &[
            "0F0 0F1 3F0 3B0 (3F1;0B0) 3B1 0B1",
            "1F0 2F0 1F1 2F1 2B0 1B0 2B1 1B1",
        ],
    );
    let mut costs = SimCosts::uniform(4, 1.0, 2.0, 1.0, 1.0, 0.0);
    let r = simulate(&s, &costs).unwrap();
    let pair = r.timeline[0][4];
    assert!(close(pair.end_s - pair.start_s, 3.0));
    costs.overlap_factor = Some(1.0);
    let r = simulate(&s, &costs).unwrap();
    let pair = r.timeline[0][4];
    assert!(close(pair.end_s - pair.start_s, 2.0));
    costs.overlap_factor = Some(0.5);
    let r = simulate(&s, &costs).unwrap();
    let pair = r.timeline[0][4];
    assert!(close(pair.end_s - pair.start_s, 2.5));
    // The pair's F raises in-flight before its B lowers it.
    assert_eq!(r.peak_inflight[0], 3);
    costs.overlap_factor = Some(1.5);
    assert!(matches!(
        simulate(&s, &costs),
        Err(SimError::InvalidCost(_))
    ));
}

#[test]
fn per_stage_costs_and_bytes() {
    let stage = |f: f64, b: f64, bytes: u64| StageCosts {
        forward_s: f,
        backward_s: b,
        backward_input_s: b / 2.0,
        backward_weight_s: b / 2.0,
        activation_bytes: bytes,
        weight_grad_bytes: bytes / 2,
    };
    let costs = SimCosts {
        stages: vec![stage(1.0, 2.0, 100), stage(2.0, 4.0, 300)],
        p2p_s: vec![0.25],
        overlap_factor: None,
    };
    let s = sched(
        2,
        1,
        2,
        Placement::Looped,
        &["0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"],
    );
    let r = simulate(&s, &costs).unwrap();
    // 0F0 [0,1] 0F1 [1,2]; 1F0 [1.25,3.25] 1B0 [3.25,7.25] 1F1 [7.25,9.25] 1B1 [9.25,13.25];
    // 0B0 [7.5,9.5] 0B1 [13.5,15.5].
    assert_eq!(r.makespan_s, 15.5);
    assert_eq!(r.busy_s, [6.0, 12.0]);
    assert_eq!(r.peak_activation_bytes, [200, 300]);
    let m = simulate_metrics(&s, &costs).unwrap();
    assert_eq!(m, r.metrics());
}

#[test]
fn errors() {
    let s = sched(2, 1, 1, Placement::Looped, &["0F0 0B0", "1F0 1B0"]);
    let e = simulate(&s, &SimCosts::uniform(3, 1.0, 2.0, 1.0, 1.0, 0.0)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the costs give 3 entries for stages, but the schedule needs 2"
    );
    let mut c = SimCosts::uniform(2, 1.0, 2.0, 1.0, 1.0, 0.0);
    c.p2p_s.clear();
    assert!(matches!(
        simulate(&s, &c),
        Err(SimError::CostsLength { what: "p2p_s", .. })
    ));
    let c = SimCosts::uniform(2, -1.0, 2.0, 1.0, 1.0, 0.0);
    assert!(matches!(simulate(&s, &c), Err(SimError::InvalidCost(_))));
    let dead = sched(
        2,
        1,
        2,
        Placement::Looped,
        &["0F0 0B0 0F1 0B1", "1F1 1F0 1B0 1B1"],
    );
    let e = simulate(&dead, &SimCosts::uniform(2, 1.0, 2.0, 1.0, 1.0, 0.0)).unwrap_err();
    assert!(
        matches!(
            e,
            SimError::Deadlock {
                rank: 0,
                step_index: 1,
                ..
            }
        ),
        "{e}"
    );
    let bad = sched(1, 1, 1, Placement::Looped, &["0F0 0B0 0F5"]);
    let e = simulate(&bad, &SimCosts::uniform(1, 1.0, 2.0, 1.0, 1.0, 0.0)).unwrap_err();
    assert!(
        e.to_string().contains("micro-batch 5 is outside 0..1"),
        "{e}"
    );
}

/// The per-thread scratch of a run that deadlocked does not leak into the next run.
#[test]
fn runs_after_a_deadlock_are_unaffected() {
    let costs = SimCosts::uniform(2, 1.0, 2.0, 1.0, 1.0, 0.0);
    let good = sched(
        2,
        1,
        2,
        Placement::Looped,
        &["0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"],
    );
    let want = simulate(&good, &costs).unwrap();
    let dead = sched(
        2,
        1,
        2,
        Placement::Looped,
        &["0F0 0B0 0F1 0B1", "1F1 1F0 1B0 1B1"],
    );
    for _ in 0..3 {
        assert!(simulate(&dead, &costs).is_err());
        assert_eq!(simulate(&good, &costs).unwrap(), want);
        assert_eq!(simulate_metrics(&good, &costs).unwrap(), want.metrics());
    }
}
