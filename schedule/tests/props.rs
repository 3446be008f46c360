//! Property tests: every generator, over its supported inputs with p ∈ 1..16, v ∈ 1..4,
//! m ∈ 1..64, yields a schedule the checker accepts and the simulator can time, with
//! consistent metrics; unsupported inputs are rejected with the flag named.
//!
//! Busy time per rank is `v·m·(F + B)` for every schedule: the costs have `I + W = B`, and an
//! overlapped pair lasts the sum of its parts.

use autopp_schedule::{
    check, generate, simulate, simulate_metrics, ActionKind, Schedule, ScheduleKind, ScheduleSpec,
    SimCosts, SpecField, Step,
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
    // with bytes that differ by stage (and I trading activations for fewer or more
    // weight-gradient bytes), the list walk equals the simulated peaks, both simulators'
    let mut costs = SimCosts::uniform(s.num_stages(), f, b, 1.0, 1.0, 0.25);
    for (k, st) in costs.stages.iter_mut().enumerate() {
        st.activation_bytes = 3 + 7 * k as u64;
        st.weight_grad_bytes = 1 + 11 * (k as u64 % 3);
    }
    let walked = s.peak_activation_bytes(
        &costs
            .stages
            .iter()
            .map(|c| (c.activation_bytes, c.weight_grad_bytes))
            .collect::<Vec<_>>(),
    );
    let full = simulate(s, &costs).map_err(|e| TestCaseError::fail(format!("{e}")))?;
    let fast = simulate_metrics(s, &costs).map_err(|e| TestCaseError::fail(format!("{e}")))?;
    prop_assert_eq!(&walked, &full.peak_activation_bytes);
    prop_assert_eq!(&walked, &fast.peak_activation_bytes);
    // the metrics-only loop's answers are the general loop's, bit for bit
    prop_assert_eq!(full.makespan_s.to_bits(), fast.makespan_s.to_bits());
    prop_assert_eq!(&full.busy_s, &fast.busy_s);
    prop_assert_eq!(&full.peak_inflight, &fast.peak_inflight);
    for (rank, list) in r.timeline.iter().enumerate() {
        prop_assert_eq!(list.len(), s.ranks[rank].len());
        for w in list.windows(2) {
            prop_assert!(w[0].end_s <= w[1].start_s + 1e-12);
        }
        prop_assert_eq!(r.memory[rank].last().map(|x| x.1), Some(0));
    }
    // Only the split-backward schedules run I and W; only DualPipe-V overlaps pairs.
    let splits = r
        .timeline
        .iter()
        .flatten()
        .flat_map(|t| t.step.actions())
        .any(|a| matches!(a.kind, ActionKind::I | ActionKind::W));
    prop_assert!(!splits || s.kind.splits_backward(), "{} runs I/W", s.kind);
    let pairs = s
        .ranks
        .iter()
        .flatten()
        .any(|st| matches!(st, Step::Overlapped(..)));
    prop_assert!(
        !pairs || s.kind == ScheduleKind::DualPipeV,
        "{} overlaps",
        s.kind
    );
    prop_assert_eq!(s.placement, s.kind.placement());
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
                prop_assert_eq!(e.field(), SpecField::NumMicrobatches);
                prop_assert!(e.to_string().contains("num_microbatches"));
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
            Err(e) => {
                prop_assert!(!ok);
                prop_assert_eq!(e.field(), SpecField::GroupSize);
                prop_assert!(e.to_string().contains("group_size"));
            }
        }
    }

    #[test]
    fn one_stage_zero_bubble_is_valid(p in 1usize..=16, m in 1usize..=64, h2: bool) {
        let kind = if h2 { ScheduleKind::ZbH2 } else { ScheduleKind::ZbH1 };
        match generate(&ScheduleSpec::new(kind, p, m)) {
            Ok(s) => {
                prop_assert!(p >= 2);
                valid(&s)?;
                let bound = if h2 { 2 * p - 1 } else { p };
                prop_assert!(s.peak_inflight().iter().all(|&x| x as usize <= bound.min(m)));
                // Rank 0 holds what 1F1B's rank 0 holds (ZB-H1) or up to 2p − 1 (ZB-H2).
                if !h2 {
                    prop_assert_eq!(s.peak_inflight()[0] as usize, p.min(m));
                }
            }
            Err(e) => {
                prop_assert!(p < 2);
                prop_assert_eq!(e.field(), SpecField::Pp);
                prop_assert!(e.to_string().contains("pp of at least 2"), "{}", e);
            }
        }
    }

    #[test]
    fn v_schedules_are_valid(p in 1usize..=16, m in 1usize..=64, dualpipe: bool) {
        let kind = if dualpipe { ScheduleKind::DualPipeV } else { ScheduleKind::ZbV };
        // --virtual defaults to 2 for the V schedules, and nothing else is accepted.
        prop_assert_eq!(kind.default_virtual_stages(), 2);
        let spec = ScheduleSpec::new(kind, p, m).with_virtual_stages(2);
        let ok = if dualpipe { m >= 2 * p } else { p >= 2 };
        match generate(&spec) {
            Ok(s) => {
                prop_assert!(ok);
                valid(&s)?;
                let bound = if dualpipe { 2 * p + 1 } else { 2 * p };
                prop_assert!(s.peak_inflight().iter().all(|&x| x as usize <= bound));
            }
            Err(e) => {
                prop_assert!(!ok);
                let field = if dualpipe { SpecField::NumMicrobatches } else { SpecField::Pp };
                prop_assert_eq!(e.field(), field, "{}", e);
            }
        }
        for v in [1usize, 3, 4] {
            let e = generate(&spec.with_virtual_stages(v)).unwrap_err();
            prop_assert_eq!(e.field(), SpecField::VirtualStages);
            prop_assert!(e.to_string().contains("virtual_stages must be 2"), "{}", e);
        }
    }

    #[test]
    fn interleaved_zb_is_valid(p in 1usize..=16, v in 2usize..=4, m in 1usize..=64) {
        // every m PyTorch accepts: a multiple of R = max(1, m / p) rounds of G = m / R
        let rounds = (m / p).max(1);
        prop_assume!(m.is_multiple_of(rounds));
        let g = m / rounds;
        let spec = ScheduleSpec::new(ScheduleKind::InterleavedZb, p, m).with_virtual_stages(v);
        let s = generate(&spec).unwrap();
        valid(&s)?;
        prop_assert!(s.peak_inflight().iter().all(|&x| x as usize <= (v - 1) * g + p));
    }

    #[test]
    fn interleaved_zb_rejects_what_it_cannot_run(p in 1usize..=16, v in 1usize..=4, m in 1usize..=64) {
        let spec = ScheduleSpec::new(ScheduleKind::InterleavedZb, p, m).with_virtual_stages(v);
        let ok = v >= 2 && m.is_multiple_of((m / p).max(1));
        match generate(&spec) {
            Ok(s) => { prop_assert!(ok); check(&s).unwrap(); }
            Err(e) => {
                prop_assert!(!ok);
                let field = if v < 2 { SpecField::VirtualStages } else { SpecField::NumMicrobatches };
                prop_assert_eq!(e.field(), field, "{}", e);
            }
        }
    }
}
