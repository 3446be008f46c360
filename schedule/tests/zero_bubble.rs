//! The zero-bubble and DualPipe schedules against the claims of their sources, with the
//! simulator and uniform costs `F = 1, I = 1, W = 1 (B = 2)` and no communication unless said.
//!
//! Sources: Qi, Wan, Huang and Lin, 2023, "Zero Bubble Pipeline Parallelism" — ZB-H1's bubble
//! `(p−1)(T_F + T_B − T_W)` (their `T_B` is our `I`) at 1F1B's peak memory, ZB-H2's memory
//! bound of `2p` micro-batches, ZB-V's zero bubble when `T_F = T_B = T_W`; DeepSeek-AI, 2024,
//! DeepSeek-V3 technical report, Table 2 — DualPipe's bubble `(PP/2 − 1)(F&B + B − 3W)` with
//! `PP/2 = p` ranks for DualPipe-V.

use autopp_schedule::{
    check, generate, simulate, Schedule, ScheduleKind, ScheduleSpec, SimCosts, SimResult,
    SpecField, Step,
};

fn schedule(kind: ScheduleKind, p: usize, v: usize, m: usize) -> Schedule {
    let s = generate(&ScheduleSpec::new(kind, p, m).with_virtual_stages(v))
        .unwrap_or_else(|e| panic!("{kind} p={p} v={v} m={m}: {e}"));
    check(&s).unwrap_or_else(|e| panic!("{kind} p={p} v={v} m={m}: {e}"));
    s
}

/// Simulates with per-action times `f`, `b`, `i`, `w` and no communication.
fn run(s: &Schedule, f: f64, b: f64, i: f64, w: f64) -> SimResult {
    simulate(s, &SimCosts::uniform(s.num_stages(), f, b, i, w, 0.0)).unwrap()
}

/// Simulates with `F = 1, B = 2, I = 1, W = 1`.
fn unit(s: &Schedule) -> SimResult {
    run(s, 1.0, 2.0, 1.0, 1.0)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// Idle time of `rank` between the start of its first step and the end of its last.
fn inner_idle(r: &SimResult, rank: usize) -> f64 {
    r.timeline[rank]
        .windows(2)
        .map(|w| w[1].start_s - w[0].end_s)
        .sum()
}

#[test]
fn zb_h1_beats_1f1b_at_the_same_rank_0_memory() {
    for p in 4..=8 {
        for m in [2 * p, 2 * p + 1, 3 * p, 4 * p] {
            let zb = unit(&schedule(ScheduleKind::ZbH1, p, 1, m));
            let base = unit(&schedule(ScheduleKind::OneFOneB, p, 1, m));
            assert!(
                zb.makespan_s < base.makespan_s,
                "p={p} m={m}: zb-h1 {} vs 1f1b {}",
                zb.makespan_s,
                base.makespan_s
            );
            assert_eq!(zb.peak_inflight[0], base.peak_inflight[0], "p={p} m={m}");
            assert_eq!(zb.peak_inflight[0] as usize, p);
            // No rank holds more than 1F1B's rank 0.
            assert!(zb.peak_inflight.iter().all(|&x| x as usize <= p));
        }
    }
}

/// The paper's ZB-H1 bubble `(p−1)(F + I − W)` per rank, against 1F1B's `(p−1)(F + B)`, for
/// costs where the backward-input is at least the backward-weight.
#[test]
fn zb_h1_idle_is_p_minus_1_times_f_plus_i_minus_w() {
    for (f, i, w) in [
        (1.0, 1.0, 1.0),
        (1.0, 2.0, 1.0),
        (1.0, 1.5, 0.5),
        (2.0, 3.0, 1.0),
    ] {
        for p in [2, 4, 8] {
            let m = 3 * p;
            let r = run(&schedule(ScheduleKind::ZbH1, p, 1, m), f, i + w, i, w);
            let want = (p - 1) as f64 * (f + i - w);
            for (rank, busy) in r.busy_s.iter().enumerate() {
                let idle = r.makespan_s - busy;
                assert!(
                    close(idle, want),
                    "F={f} I={i} W={w} p={p} rank {rank}: idle {idle} vs {want}"
                );
            }
        }
    }
}

#[test]
fn zb_h2_holds_at_most_2p_micro_batches() {
    for p in 2..=8 {
        for m in (1..=5 * p).step_by(3) {
            let s = schedule(ScheduleKind::ZbH2, p, 1, m);
            // Bytes: 3 per pair from F to I, 2 from I to W.
            let mut costs = SimCosts::uniform(p, 1.0, 2.0, 1.0, 1.0, 0.0);
            for c in &mut costs.stages {
                c.activation_bytes = 3;
                c.weight_grad_bytes = 2;
            }
            let r = simulate(&s, &costs).unwrap();
            for rank in 0..p {
                assert!(r.peak_inflight[rank] as usize <= 2 * p, "p={p} m={m}");
                assert!(
                    r.peak_activation_bytes[rank] <= 3 * 2 * p as u64,
                    "p={p} m={m}"
                );
            }
            if m >= 2 * p {
                // ZB-H2 does fill the warm-up with forwards: rank 0 holds more than ZB-H1's p.
                assert_eq!(r.peak_inflight[0] as usize, 2 * p - 1, "p={p} m={m}");
            }
        }
    }
}

/// ZB-H2 is never slower than ZB-H1, and with `I = 2W` it reaches the bound every schedule of
/// one stage per rank obeys: the last rank cannot start before `(p − 1)·F`.
#[test]
fn zb_h2_fills_what_zb_h1_leaves() {
    for (f, i, w) in [(1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (1.0, 1.5, 0.5)] {
        for p in [2, 4, 8] {
            for m in [2 * p, 4 * p] {
                let h1 = run(&schedule(ScheduleKind::ZbH1, p, 1, m), f, i + w, i, w);
                let h2 = run(&schedule(ScheduleKind::ZbH2, p, 1, m), f, i + w, i, w);
                assert!(h2.makespan_s <= h1.makespan_s + 1e-9, "p={p} m={m}");
                let bound = (p - 1) as f64 * f + m as f64 * (f + i + w);
                assert!(h2.makespan_s >= bound - 1e-9);
                if close(i, 2.0 * w) {
                    assert!(
                        close(h2.makespan_s, bound),
                        "p={p} m={m}: {}",
                        h2.makespan_s
                    );
                    assert!(h2.makespan_s < h1.makespan_s, "p={p} m={m}");
                }
            }
        }
    }
}

#[test]
fn zb_v_never_idles_between_its_first_f_and_last_w() {
    for p in 2..=8 {
        for m in [2 * p, 2 * p + 1, 3 * p, 4 * p] {
            let s = schedule(ScheduleKind::ZbV, p, 2, m);
            let r = unit(&s);
            for rank in 0..p {
                let first = r.timeline[rank].first().unwrap().step.first();
                let last = r.timeline[rank].last().unwrap().step.first();
                assert_eq!(first.kind.letter(), 'F');
                assert_eq!(last.kind.letter(), 'W');
                assert!(
                    close(inner_idle(&r, rank), 0.0),
                    "p={p} m={m} rank {rank}: idles {}",
                    inner_idle(&r, rank)
                );
            }
            // Only the start of the V is idle: rank r waits r forwards.
            assert!(close(r.makespan_s, 6.0 * m as f64 + (p - 1) as f64));
            assert!(r.peak_inflight.iter().all(|&x| x as usize == 2 * p));
        }
    }
}

#[test]
fn dualpipe_v_idles_p_minus_1_times_fb_plus_b_minus_3w() {
    // (F, I, W): the paper's formula holds exactly when F = I = W.
    for (f, iw) in [(1.0, 1.0), (2.0, 2.0)] {
        let (b, w) = (2.0 * iw, iw);
        let fb = f + b; // an overlapped pair lasts F + B (no overlap factor)
        for p in 1..=8 {
            for m in [2 * p, 2 * p + 1, 3 * p, 4 * p] {
                let s = schedule(ScheduleKind::DualPipeV, p, 2, m);
                let r = run(&s, f, b, iw, w);
                let want = (p - 1) as f64 * (fb + b - 3.0 * w);
                for (rank, busy) in r.busy_s.iter().enumerate() {
                    let idle = r.makespan_s - busy;
                    assert!(
                        close(idle, want),
                        "F={f} p={p} m={m} rank {rank}: idle {idle} vs {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn dualpipe_v_overlaps_a_forward_with_a_backward() {
    let s = schedule(ScheduleKind::DualPipeV, 4, 2, 10);
    for (rank, list) in s.ranks.iter().enumerate() {
        let pairs: Vec<(char, char)> = list
            .iter()
            .filter_map(|st| match st {
                Step::Overlapped(a, b) => Some((a.kind.letter(), b.kind.letter())),
                Step::One(_) => None,
            })
            .collect();
        // 2·(m − 2p + r + 1) − [last rank] pairs in the steady state, p − r − 1 in the cool-down
        let want = 2 * (10 - 8 + rank + 1) - usize::from(rank == 3) + (4 - rank - 1);
        assert_eq!(pairs.len(), want, "rank {rank}");
        assert!(pairs.iter().all(|&p| p == ('F', 'B')));
    }
    // An overlap factor shortens exactly the pairs.
    let mut costs = SimCosts::uniform(8, 1.0, 2.0, 1.0, 1.0, 0.0);
    let plain = simulate(&s, &costs).unwrap();
    costs.overlap_factor = Some(1.0);
    let hidden = simulate(&s, &costs).unwrap();
    assert!(hidden.makespan_s < plain.makespan_s);
}

#[test]
fn interleaved_zb_beats_interleaved_1f1b() {
    for p in [2, 4, 8] {
        for v in [2, 3, 4] {
            for m in [p, 2 * p, 4 * p] {
                let zb = unit(&schedule(ScheduleKind::InterleavedZb, p, v, m));
                let base = unit(&schedule(ScheduleKind::Interleaved1F1B, p, v, m));
                assert!(zb.makespan_s < base.makespan_s, "p={p} v={v} m={m}");
                // (p − 1)·F of bubble per rank
                let want = 3.0 * (v * m) as f64 + (p - 1) as f64;
                assert!(
                    close(zb.makespan_s, want),
                    "p={p} v={v} m={m}: {}",
                    zb.makespan_s
                );
                assert!(zb.peak_inflight.iter().all(|&x| x as usize <= v * p));
            }
        }
    }
}

/// The simulator holds a pair's activations from its F to its I, then what its W needs until
/// the W. ZB-H1, p = 4, m = 8, 10 bytes F→I and 4 bytes I→W: rank 0 (no deferred W) peaks at
/// its 4 warm-up forwards, 4·10 = 40; rank 3 (W's 3 behind its I's) runs
/// F0 I0 F1 I1 F2 I2 F3 I3 W0 F4 …, peaking during F3 with three I's done: 10 + 3·4 = 22.
#[test]
fn split_backward_memory_by_hand() {
    let s = schedule(ScheduleKind::ZbH1, 4, 1, 8);
    let mut costs = SimCosts::uniform(4, 1.0, 2.0, 1.0, 1.0, 0.0);
    for c in &mut costs.stages {
        c.activation_bytes = 10;
        c.weight_grad_bytes = 4;
    }
    let r = simulate(&s, &costs).unwrap();
    assert_eq!(r.peak_activation_bytes[0], 40);
    assert_eq!(r.peak_activation_bytes[3], 22);
    assert_eq!(r.peak_inflight, [4, 4, 4, 4]);
    for curve in &r.memory {
        assert_eq!(curve.last().map(|x| x.1), Some(0));
    }
    // Holding more for W than from F to I (full recompute keeps only the layer inputs) moves
    // rank 3's peak to the end of I3, when all four pairs wait for their W: 4·8 = 32 (during
    // F3 it is only 2 + 3·8 = 26).
    for c in &mut costs.stages {
        c.activation_bytes = 2;
        c.weight_grad_bytes = 8;
    }
    let r = simulate(&s, &costs).unwrap();
    assert_eq!(r.peak_activation_bytes[3], 4 * 8);
}

#[test]
fn rejections_state_the_rule() {
    use SpecField::{NumMicrobatches, Pp, VirtualStages};
    let cases = [
        (ScheduleKind::ZbH1, 1, 1, 4, Pp, "pp of at least 2"),
        (ScheduleKind::ZbH2, 1, 1, 4, Pp, "pp of at least 2"),
        (ScheduleKind::ZbV, 1, 2, 4, Pp, "pp of at least 2"),
        (
            ScheduleKind::ZbH1,
            4,
            2,
            8,
            VirtualStages,
            "virtual_stages must be 1",
        ),
        (
            ScheduleKind::ZbV,
            4,
            1,
            8,
            VirtualStages,
            "virtual_stages must be 2",
        ),
        (
            ScheduleKind::DualPipeV,
            4,
            3,
            8,
            VirtualStages,
            "virtual_stages must be 2",
        ),
        (
            ScheduleKind::DualPipeV,
            4,
            2,
            7,
            NumMicrobatches,
            "at least 2·pp = 8",
        ),
        (
            ScheduleKind::InterleavedZb,
            4,
            1,
            8,
            VirtualStages,
            "virtual_stages must be at least 2",
        ),
        (
            ScheduleKind::InterleavedZb,
            4,
            2,
            9,
            NumMicrobatches,
            "max(1, floor(num_microbatches / pp)) equal rounds",
        ),
    ];
    for (kind, p, v, m, field, needle) in cases {
        let e = generate(&ScheduleSpec::new(kind, p, m).with_virtual_stages(v)).unwrap_err();
        assert_eq!(e.field(), field, "{kind} p={p} v={v} m={m}: {e}");
        let e = e.to_string();
        assert!(e.contains(needle), "{kind} p={p} v={v} m={m}: {e}");
    }
    let e = generate(&ScheduleSpec::new(ScheduleKind::InterleavedZb, 4, 9).with_virtual_stages(2))
        .unwrap_err()
        .to_string();
    assert!(e.contains("try 10"), "{e}");
    // what PyTorch's ScheduleInterleavedZeroBubble accepts runs: fewer micro-batches than
    // ranks, and counts that are not multiples of pp
    for m in [1, 3, 5, 6, 7, 10] {
        schedule(ScheduleKind::InterleavedZb, 4, 2, m);
    }
    // and every accepted count on small pipelines passes the checker
    for p in 1..=6 {
        for v in 2..=3 {
            for m in (1..=24).filter(|&m| m % (m / p).max(1) == 0) {
                schedule(ScheduleKind::InterleavedZb, p, v, m);
            }
        }
    }
    // The smallest accepted inputs run.
    schedule(ScheduleKind::DualPipeV, 4, 2, 8);
    schedule(ScheduleKind::ZbV, 2, 2, 1);
    schedule(ScheduleKind::ZbH1, 2, 1, 1);
}
