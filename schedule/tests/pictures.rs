//! The pictures: the SVG parses as XML and has one cell per action, the Chrome trace has one
//! complete event per step, the ASCII timeline has one row per rank.

use autopp_schedule::{
    ascii, generate, parse_steps, simulate, svg, trace, Placement, Schedule, ScheduleKind,
    ScheduleSpec, SimCosts,
};

fn interleaved() -> (Schedule, autopp_schedule::SimResult) {
    let s =
        generate(&ScheduleSpec::new(ScheduleKind::Interleaved1F1B, 4, 8).with_virtual_stages(2))
            .unwrap();
    let r = simulate(&s, &SimCosts::uniform(8, 1.0, 2.0, 1.0, 1.0, 0.0)).unwrap();
    (s, r)
}

#[test]
fn svg_parses_with_one_cell_per_action() {
    let (s, r) = interleaved();
    let text = svg::gantt(&s, &r, "interleaved <1f1b> & co");
    let doc = roxmltree::Document::parse(&text).expect("well-formed SVG");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    let count = |class: &str| {
        doc.descendants()
            .filter(|n| n.attribute("class") == Some(class))
            .count()
    };
    assert_eq!(count("F"), 4 * 2 * 8);
    assert_eq!(count("B"), 4 * 2 * 8);
    assert_eq!(count("idle"), 4);
    assert_eq!(count("memory"), 4);
    // Micro-batch numbers in the cells, with the rank's chunk where it fits (`7·c1`).
    let numbers = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter(|n| {
            n.text().is_some_and(|t| {
                let mb = t.split('·').next().unwrap_or(t);
                mb.parse::<u32>().is_ok_and(|x| x < 8)
            })
        })
        .count();
    assert!(numbers >= 2 * 4 * 2 * 8, "{numbers}");
    assert!(text.contains("interleaved &lt;1f1b&gt; &amp; co"));
}

#[test]
fn svg_draws_split_backwards_and_overlapped_pairs() {
    let s = Schedule {
        kind: ScheduleKind::OneFOneB,
        pp: 2,
        virtual_stages: 2,
        num_microbatches: 2,
        placement: Placement::V,
        ranks: vec![
            parse_steps("0F0 0F1 3F0 3B0 (3F1;0B0) 3B1 0B1").unwrap(),
            parse_steps("1F0 2F0 1F1 2F1 2B0 1I0 2B1 1B1 1W0").unwrap(),
        ],
    };
    let r = simulate(&s, &SimCosts::uniform(4, 1.0, 2.0, 1.0, 1.0, 0.0)).unwrap();
    let text = svg::gantt(&s, &r, "hand-made");
    let doc = roxmltree::Document::parse(&text).expect("well-formed SVG");
    let class = |c: &str| {
        doc.descendants()
            .filter(|n| n.attribute("class") == Some(c))
            .count()
    };
    assert_eq!(class("I"), 1);
    assert_eq!(class("W"), 1);
    // The pair (3F1;0B0) is one cell, not an F cell and a B cell.
    assert_eq!(class("F"), 7);
    assert_eq!(class("B"), 6);
    assert_eq!(class("pair"), 1);
    assert!(text.contains(svg::COLOR_I) && text.contains(svg::COLOR_W));
    // The pair's cell is split between the F and B colours of its stages and carries both
    // micro-batch numbers.
    let pair = doc
        .descendants()
        .find(|n| n.attribute("class") == Some("pair"))
        .unwrap();
    let fill = pair.attribute("fill").unwrap();
    let id = fill
        .strip_prefix("url(#")
        .and_then(|f| f.strip_suffix(')'))
        .unwrap();
    let gradient = doc
        .descendants()
        .find(|n| n.has_tag_name("linearGradient") && n.attribute("id") == Some(id))
        .expect("the pair's gradient is defined");
    let stops: Vec<&str> = gradient
        .children()
        .filter_map(|n| n.attribute("stop-color"))
        .collect();
    assert_eq!(stops.len(), 2);
    assert_ne!(stops[0], stops[1]);
    assert!(doc
        .descendants()
        .any(|n| n.has_tag_name("text") && n.text() == Some("1+0")));
    let t = ascii::timeline(&s, &r);
    assert!(t.contains("3F1+0B0"), "{t}");
    assert!(t.contains("1I0") && t.contains("1W0"), "{t}");
    let j: serde_json::Value = serde_json::from_str(&trace::chrome_trace(&s, &r, 1.0)).unwrap();
    let names: Vec<&str> = j["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"(3F1;0B0)") && names.contains(&"1W0"));
}

#[test]
fn chrome_trace_has_one_event_per_step() {
    let (s, r) = interleaved();
    let j: serde_json::Value = serde_json::from_str(&trace::chrome_trace(&s, &r, 1e3)).unwrap();
    let events = j["traceEvents"].as_array().unwrap();
    let complete: Vec<&serde_json::Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(complete.len(), s.num_actions());
    for e in &complete {
        assert!(e["ts"].as_f64().unwrap() >= 0.0);
        assert!(e["dur"].as_f64().unwrap() > 0.0);
        assert!(e["pid"].as_u64().unwrap() < 4);
    }
    let last_end = complete
        .iter()
        .map(|e| e["ts"].as_f64().unwrap() + e["dur"].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert_eq!(last_end, r.makespan_s * 1e3);
    assert!(events.iter().any(|e| e["ph"] == "C"));
    assert_eq!(
        events
            .iter()
            .filter(|e| e["name"] == "process_name")
            .count(),
        4
    );
}

#[test]
fn ascii_timeline_of_1f1b() {
    let s = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 4, 8)).unwrap();
    let r = simulate(&s, &SimCosts::uniform(4, 1.0, 2.0, 1.0, 1.0, 0.0)).unwrap();
    let t = ascii::timeline(&s, &r);
    let rows: Vec<&str> = t.lines().filter(|l| l.starts_with("rank ")).collect();
    assert_eq!(rows.len(), 4);
    // 33 time units of 3 characters each; trailing blanks are trimmed, idle is not.
    assert!(
        rows.iter().all(|row| row.len() <= "rank 0 ".len() + 33 * 3),
        "{t}"
    );
    assert!(rows[3].ends_with("F7 B7    .................."), "{t}");
    assert!(rows[3].starts_with("rank 3 .........F0 B0    F1 B1"), "{t}");
    assert!(
        rows[0].starts_with("rank 0 F0 F1 F2 F3 ..................B0    F4 B1"),
        "{t}"
    );
}

/// Costs in seconds (milliseconds apart) keep readable labels in both pictures.
#[test]
fn small_times_in_seconds_keep_their_digits() {
    let s = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 2)).unwrap();
    let r = simulate(&s, &SimCosts::uniform(2, 0.0012, 0.0024, 0.0, 0.0, 0.0001)).unwrap();
    let t = ascii::timeline(&s, &r);
    assert!(t.contains("0.0012"), "{t}");
    assert!(t.lines().next().unwrap().starts_with("time   0"), "{t}");
    let text = svg::gantt(&s, &r, "seconds");
    roxmltree::Document::parse(&text).expect("well-formed SVG");
    assert!(text.contains(&format!("makespan {}", ascii::fmt_time(r.makespan_s))));
    assert!(r.makespan_s < 0.02 && ascii::fmt_time(r.makespan_s).len() > 3);
}

/// Cells narrower than the outline threshold have no outline: a long 1f1b run drawn into a
/// capped width has thin cells, a short one none.
#[test]
fn thin_cells_have_no_outline() {
    let svg_of = |m: usize| {
        let s = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 8, m)).unwrap();
        let r = simulate(&s, &SimCosts::uniform(8, 1.0, 2.0, 1.0, 1.0, 0.0)).unwrap();
        svg::gantt(&s, &r, "t")
    };
    let outlined = |t: &str| t.matches(r#"stroke="white""#).count();
    let short = svg_of(8);
    assert_eq!(
        outlined(&short),
        short.matches(r#"<rect class="F""#).count() * 2
    );
    let long = svg_of(2000);
    assert_eq!(outlined(&long), 0, "thin cells outlined");
}
