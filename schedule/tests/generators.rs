//! The generators against the formulas of their sources, and their input rules.
//!
//! Sources: GPipe (Huang et al., 2019) and 1F1B (Narayanan et al., 2021, §2.2) bubble
//! `(p−1)/(m+p−1)`; interleaved 1F1B (Narayanan et al., 2021, §2.2) bubble
//! `(p−1)/(v·m+p−1)` with equal stage costs; Megatron-LM core's warm-up counts
//! (`get_pp_rank_microbatches`): `p − r − 1` without interleaving and
//! `2·(p − r − 1) + (v − 1)·G` with it, capped at `v·m`.

use autopp_schedule::{
    check, generate, parse_steps, resolve_group_size, simulate, Placement, Schedule, ScheduleError,
    ScheduleKind, ScheduleSpec, SimCosts, SpecField, Step,
};

fn spec(kind: ScheduleKind, p: usize, v: usize, m: usize) -> ScheduleSpec {
    ScheduleSpec::new(kind, p, m).with_virtual_stages(v)
}

fn text(s: &Schedule, rank: usize) -> String {
    s.ranks[rank]
        .iter()
        .map(Step::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Simulates with equal stage costs (`f`, `b`) and no communication.
fn bubble(s: &Schedule, f: f64, b: f64) -> f64 {
    simulate(s, &SimCosts::uniform(s.num_stages(), f, b, 1.0, 1.0, 0.0))
        .unwrap()
        .bubble_fraction
}

const P: [usize; 3] = [2, 4, 8];
const M_PER_P: [usize; 3] = [1, 2, 4];
const COSTS: [(f64, f64); 3] = [(1.0, 2.0), (1.0, 1.0), (2.0, 3.0)];

#[test]
fn gpipe_and_1f1b_bubble_is_p_minus_1_over_m_plus_p_minus_1() {
    for kind in [ScheduleKind::Gpipe, ScheduleKind::OneFOneB] {
        for p in P {
            for m in M_PER_P.map(|k| k * p) {
                let s = generate(&spec(kind, p, 1, m)).unwrap();
                check(&s).unwrap();
                let want = (p - 1) as f64 / (m + p - 1) as f64;
                for (f, b) in COSTS {
                    let got = bubble(&s, f, b);
                    assert!(
                        (got - want).abs() < 1e-12,
                        "{kind} p={p} m={m}: {got} vs {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn interleaved_bubble_is_p_minus_1_over_vm_plus_p_minus_1() {
    for p in P {
        for m in M_PER_P.map(|k| k * p) {
            for v in [1, 2, 4] {
                let s = generate(&spec(ScheduleKind::Interleaved1F1B, p, v, m)).unwrap();
                check(&s).unwrap();
                let want = (p - 1) as f64 / (v * m + p - 1) as f64;
                for (f, b) in COSTS {
                    let got = bubble(&s, f, b);
                    assert!(
                        (got - want).abs() < 1e-12,
                        "p={p} v={v} m={m}: {got} vs {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn peak_inflight_gpipe_is_m_on_every_rank() {
    for p in P {
        for m in M_PER_P.map(|k| k * p) {
            let s = generate(&spec(ScheduleKind::Gpipe, p, 1, m)).unwrap();
            let r = simulate(&s, &SimCosts::uniform(p, 1.0, 2.0, 1.0, 1.0, 0.0)).unwrap();
            assert_eq!(r.peak_inflight, vec![m as u32; p]);
            assert_eq!(s.peak_inflight(), r.peak_inflight);
        }
    }
}

#[test]
fn peak_inflight_1f1b_is_min_p_minus_r_m() {
    for p in P {
        for m in M_PER_P.map(|k| k * p).into_iter().chain([1, p - 1]) {
            let s = generate(&spec(ScheduleKind::OneFOneB, p, 1, m)).unwrap();
            let r = simulate(&s, &SimCosts::uniform(p, 1.0, 2.0, 1.0, 1.0, 0.0)).unwrap();
            let want: Vec<u32> = (0..p).map(|r| (p - r).min(m) as u32).collect();
            assert_eq!(r.peak_inflight, want, "p={p} m={m}");
        }
    }
}

#[test]
fn peak_inflight_interleaved_follows_megatron_warmup() {
    for p in P {
        for m in M_PER_P.map(|k| k * p) {
            for v in [1usize, 2, 4] {
                let s = generate(&spec(ScheduleKind::Interleaved1F1B, p, v, m)).unwrap();
                let r = simulate(
                    &s,
                    &SimCosts::uniform(s.num_stages(), 1.0, 2.0, 1.0, 1.0, 0.0),
                )
                .unwrap();
                let want: Vec<u32> = (0..p)
                    .map(|r| {
                        if v == 1 {
                            (p - r).min(m) as u32
                        } else {
                            // Megatron: warm-up = min(2·(p−r−1) + (v−1)·G, v·m), G = p.
                            let warmup = (2 * (p - r - 1) + (v - 1) * p).min(v * m);
                            (warmup + 1).min(v * m) as u32
                        }
                    })
                    .collect();
                assert_eq!(r.peak_inflight, want, "p={p} v={v} m={m}");
            }
        }
    }
}

#[test]
fn gpipe_order() {
    let s = generate(&spec(ScheduleKind::Gpipe, 2, 1, 3)).unwrap();
    assert_eq!(text(&s, 1), "1F0 1F1 1F2 1B0 1B1 1B2");
}

#[test]
fn one_f_one_b_order_follows_megatron() {
    let s = generate(&spec(ScheduleKind::OneFOneB, 4, 1, 6)).unwrap();
    assert_eq!(
        text(&s, 0),
        "0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0B3 0B4 0B5"
    );
    assert_eq!(
        text(&s, 2),
        "2F0 2F1 2B0 2F2 2B1 2F3 2B2 2F4 2B3 2F5 2B4 2B5"
    );
    assert_eq!(
        text(&s, 3),
        "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5"
    );
    // Fewer micro-batches than warm-up slots: all forwards, then all backwards.
    let s = generate(&spec(ScheduleKind::OneFOneB, 4, 1, 2)).unwrap();
    assert_eq!(text(&s, 0), "0F0 0F1 0B0 0B1");
}

#[test]
fn interleaved_order_follows_megatron() {
    // p = 2, v = 2, m = 4, G = 2. Rank 0 warms up 2·1 + 1·2 = 4 forward steps, rank 1 two.
    let s = generate(&spec(ScheduleKind::Interleaved1F1B, 2, 2, 4)).unwrap();
    assert_eq!(
        text(&s, 0),
        "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3"
    );
    assert_eq!(
        text(&s, 1),
        "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3"
    );
    // Group size 4 on the same pipeline: micro-batches 0..3 go through chunk 0, then chunk 1.
    let s = generate(&spec(ScheduleKind::Interleaved1F1B, 2, 2, 4).with_group_size(4)).unwrap();
    assert_eq!(
        text(&s, 1),
        "1F0 1F1 1F2 1F3 3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 1B0 1B1 1B2 1B3"
    );
    check(&s).unwrap();
}

#[test]
fn interleaved_with_one_stage_per_rank_is_1f1b() {
    for (p, m) in [(4, 8), (3, 5), (5, 2)] {
        let a = generate(&spec(ScheduleKind::Interleaved1F1B, p, 1, m)).unwrap();
        let b = generate(&spec(ScheduleKind::OneFOneB, p, 1, m)).unwrap();
        assert_eq!(a.ranks, b.ranks);
        assert_eq!(a.kind, ScheduleKind::Interleaved1F1B);
    }
}

#[test]
fn looped_bfs_order_follows_pytorch() {
    let s = generate(&spec(ScheduleKind::LoopedBfs, 2, 2, 2)).unwrap();
    assert_eq!(text(&s, 0), "0F0 0F1 2F0 2F1 2B1 2B0 0B1 0B0");
    assert_eq!(text(&s, 1), "1F0 1F1 3F0 3F1 3B1 3B0 1B1 1B0");
    check(&s).unwrap();
}

#[test]
fn placement_is_looped() {
    let s = generate(&spec(ScheduleKind::Interleaved1F1B, 4, 3, 8)).unwrap();
    assert_eq!(s.stages_of(1), [1, 5, 9]);
    assert_eq!(s.rank_of(9), 1);
    for (r, list) in s.ranks.iter().enumerate() {
        assert!(list
            .iter()
            .all(|st| s.rank_of(st.first().stage as usize) == r));
    }
}

#[test]
fn group_size_rules() {
    let g = |p, v, m, gs: Option<usize>| {
        let mut sp = spec(ScheduleKind::Interleaved1F1B, p, v, m);
        sp.group_size = gs;
        resolve_group_size(&sp)
    };
    assert_eq!(g(4, 2, 8, None), Ok(Some(4)));
    assert_eq!(g(4, 2, 8, Some(8)), Ok(Some(8)));
    // PyTorch's regrouping: m = 10, p = 4 → 2 rounds of 5.
    assert_eq!(g(4, 2, 10, None), Ok(Some(5)));
    assert_eq!(g(3, 2, 5, None), Ok(Some(5)));
    assert_eq!(g(3, 2, 8, None), Ok(Some(4)));
    assert_eq!(g(4, 1, 3, None), Ok(None));
    for (p, m, gs) in [
        (4, 8, Some(3)),
        (4, 8, Some(6)),
        (4, 8, Some(16)),
        (4, 11, None),
        (4, 3, None),
    ] {
        let e = g(p, 2, m, gs).unwrap_err();
        let field = match gs {
            Some(_) => SpecField::GroupSize,
            None => SpecField::NumMicrobatches,
        };
        assert_eq!(e.field(), field, "{e}");
        let e = e.to_string();
        assert!(e.contains("pp") && e.contains("num_microbatches"), "{e}");
        assert!(gs.is_none() || e.contains("group_size"), "{e}");
    }
    let e = g(4, 2, 11, None).unwrap_err().to_string();
    assert!(e.contains("valid group_size values: 11"), "{e}");
    // The regrouped schedule is valid and has the ideal bubble for its group size.
    let s = generate(&spec(ScheduleKind::Interleaved1F1B, 4, 2, 10)).unwrap();
    check(&s).unwrap();
    let s = generate(&spec(ScheduleKind::Interleaved1F1B, 4, 2, 12).with_group_size(6)).unwrap();
    check(&s).unwrap();
}

#[test]
fn rejections_name_the_field() {
    use SpecField::{GroupSize, NumMicrobatches, Pp, VirtualStages};
    let cases: [(ScheduleSpec, SpecField, &str); 9] = [
        (
            spec(ScheduleKind::Gpipe, 0, 1, 4),
            Pp,
            "pp must be at least 1",
        ),
        (
            spec(ScheduleKind::OneFOneB, 4, 1, 0),
            NumMicrobatches,
            "num_microbatches must be at least 1",
        ),
        (
            spec(ScheduleKind::LoopedBfs, 4, 0, 4),
            VirtualStages,
            "virtual_stages must be at least 1",
        ),
        (
            spec(ScheduleKind::Gpipe, 4, 2, 4),
            VirtualStages,
            "virtual_stages must be 1",
        ),
        (
            spec(ScheduleKind::OneFOneB, 4, 3, 4),
            VirtualStages,
            "virtual_stages must be 1",
        ),
        (
            spec(ScheduleKind::OneFOneB, 4, 1, 4).with_group_size(4),
            GroupSize,
            "group_size applies only to interleaved-1f1b",
        ),
        (
            spec(ScheduleKind::Interleaved1F1B, 4, 2, 6).with_group_size(4),
            GroupSize,
            "group_size",
        ),
        (
            spec(ScheduleKind::LoopedBfs, 1024, 64, 1024),
            NumMicrobatches,
            "above the limit",
        ),
        (
            spec(ScheduleKind::ZbV, 100_000, 2, 8),
            Pp,
            "pp must be at most 1024",
        ),
    ];
    for (sp, field, needle) in cases {
        let e = generate(&sp).unwrap_err();
        assert_eq!(e.field(), field, "{sp:?}: {e}");
        assert!(e.to_string().contains(needle), "{sp:?}: {e}");
        assert!(!e.to_string().contains("--"), "{sp:?}: a flag in {e}");
    }
    assert!(matches!(
        generate(&spec(ScheduleKind::Gpipe, 4, 2, 4)),
        Err(ScheduleError::VirtualNotSupported { .. })
    ));
}

#[test]
fn kind_names_round_trip() {
    for k in ScheduleKind::ALL {
        assert_eq!(k.as_str().parse::<ScheduleKind>(), Ok(k));
        assert_eq!(k.to_string(), k.as_str());
        assert_eq!(
            serde_json::to_string(&k).unwrap(),
            format!("\"{}\"", k.as_str())
        );
        let zero_bubble = k.as_str().contains("zb") || k.as_str().starts_with("dualpipe");
        assert_eq!(k.splits_backward(), zero_bubble, "{k}");
        let v_shaped = matches!(k, ScheduleKind::ZbV | ScheduleKind::DualPipeV);
        assert_eq!(k.placement() == Placement::V, v_shaped, "{k}");
        assert_eq!(k.default_virtual_stages(), if v_shaped { 2 } else { 1 });
    }
    let e = "zb-h9".parse::<ScheduleKind>().unwrap_err();
    assert!(
        e.contains("gpipe, 1f1b, interleaved-1f1b, looped-bfs"),
        "{e}"
    );
}

#[test]
fn schedules_round_trip_through_json() {
    let s = generate(&spec(ScheduleKind::Interleaved1F1B, 2, 2, 4)).unwrap();
    let j = serde_json::to_value(&s).unwrap();
    assert_eq!(j["kind"], "interleaved-1f1b");
    assert_eq!(j["placement"], "looped");
    assert_eq!(j["ranks"][0][0], "0F0");
    let back: Schedule = serde_json::from_value(j).unwrap();
    assert_eq!(back, s);
    assert_eq!(
        parse_steps("0F0 (0F7;7B3)").unwrap()[1].to_string(),
        "(0F7;7B3)"
    );
}
