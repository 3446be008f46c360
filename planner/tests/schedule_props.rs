//! Property tests: every generator, over its supported inputs with p ∈ 1..16, v ∈ 1..4,
//! m ∈ 1..64, yields a schedule the checker accepts and the simulator can time, with
//! consistent metrics; unsupported inputs are rejected with the flag named.

use autopp_planner::schedule::{
    check, generate, simulate, ActionKind, Schedule, ScheduleKind, ScheduleSpec, SimCosts,
};
use proptest::prelude::*;

/// Checks `s` and the invariants of its simulation under uniform costs.
fn valid(s: &Schedule) -> Result<(), TestCaseError> {
    check(s).map_err(|e| TestCaseError::fail(format!("{e}")))?;
    let (f, b) = (1.0, 2.0);
    let r = simulate(s, &SimCosts::uniform(s.num_stages(), f, b, 1.0, 1.0, 0.25))
        .map_err(|e| TestCaseError::fail(format!("{e}")))?;
    let per_rank = (s.virtual_stages * s.num_microbatches) as f64 * (f + b);
    for busy in &r.busy_s {
        prop_assert!((busy - per_rank).abs() < 1e-9);
    }
    prop_assert!((0.0..1.0).contains(&r.bubble_fraction));
    prop_assert_eq!(&r.peak_inflight, &s.peak_inflight());
    prop_assert_eq!(
        r.peak_activation_bytes.clone(),
        r.peak_inflight
            .iter()
            .map(|&x| x as u64)
            .collect::<Vec<_>>()
    );
    for (rank, list) in r.timeline.iter().enumerate() {
        prop_assert_eq!(list.len(), s.ranks[rank].len());
        for w in list.windows(2) {
            prop_assert!(w[0].end_s <= w[1].start_s + 1e-12);
        }
        prop_assert_eq!(r.memory[rank].last().map(|x| x.1), Some(0));
    }
    prop_assert!(r.timeline.iter().flatten().all(|t| t
        .step
        .actions()
        .all(|a| a.kind == ActionKind::F || a.kind == ActionKind::B)));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn gpipe_and_1f1b_are_valid(p in 1usize..=16, m in 1usize..=64, one_f_one_b: bool) {
        let kind = if one_f_one_b { ScheduleKind::OneFOneB } else { ScheduleKind::Gpipe };
        let s = generate(&ScheduleSpec::new(kind, p, m)).unwrap();
        valid(&s)?;
        // Equal costs, no communication: bubble (p−1)/(m+p−1).
        let r = simulate(&s, &SimCosts::uniform(p, 1.0, 2.0, 1.0, 1.0, 0.0)).unwrap();
        prop_assert!((r.bubble_fraction - (p - 1) as f64 / (m + p - 1) as f64).abs() < 1e-9);
    }

    #[test]
    fn looped_bfs_is_valid(p in 1usize..=16, v in 1usize..=4, m in 1usize..=64) {
        let s = generate(&ScheduleSpec::new(ScheduleKind::LoopedBfs, p, m).with_virtual_stages(v)).unwrap();
        valid(&s)?;
        prop_assert!(s.peak_inflight().iter().all(|&x| x as usize == v * m));
    }

    #[test]
    fn interleaved_is_valid_for_every_group_size(
        p in 1usize..=16,
        v in 2usize..=4,
        extra in 0usize..=48,
        groups in 1usize..=4,
    ) {
        // G in p..=64 and m = k·G ≤ 64.
        let g = (p + extra).min(64);
        let m = (g * groups).min(64 / g * g);
        let spec = ScheduleSpec::new(ScheduleKind::Interleaved1F1B, p, m)
            .with_virtual_stages(v)
            .with_group_size(g);
        let s = generate(&spec).unwrap();
        valid(&s)?;
        let peak = s.peak_inflight();
        for (r, &x) in peak.iter().enumerate() {
            let warmup = (2 * (p - r - 1) + (v - 1) * g).min(v * m);
            prop_assert_eq!(x as usize, (warmup + 1).min(v * m));
        }
    }

    #[test]
    fn interleaved_default_group_size(p in 1usize..=16, v in 1usize..=4, m in 1usize..=64) {
        let spec = ScheduleSpec::new(ScheduleKind::Interleaved1F1B, p, m).with_virtual_stages(v);
        match generate(&spec) {
            Ok(s) => valid(&s)?,
            Err(e) => {
                // Only v ≥ 2 can be rejected: m < p, or neither p nor PyTorch's regrouping
                // divides m.
                prop_assert!(v >= 2);
                let rounds = (m / p).max(1);
                prop_assert!(m < p || (!m.is_multiple_of(p) && !m.is_multiple_of(rounds)), "{}", e);
                prop_assert!(e.to_string().contains("--microbatches"));
            }
        }
    }

    #[test]
    fn interleaved_rejects_bad_group_sizes(p in 1usize..=16, v in 2usize..=4, m in 1usize..=64, g in 1usize..=80) {
        let spec = ScheduleSpec::new(ScheduleKind::Interleaved1F1B, p, m)
            .with_virtual_stages(v)
            .with_group_size(g);
        let ok = p <= g && g <= m && m.is_multiple_of(g);
        match generate(&spec) {
            Ok(s) => { prop_assert!(ok); check(&s).unwrap(); }
            Err(e) => { prop_assert!(!ok); prop_assert!(e.to_string().contains("--group-size")); }
        }
    }
}
