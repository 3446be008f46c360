//! End-to-end tests of `autopp schedule` as a user runs it.

mod common;

use common::{autopp, stdout};

use std::collections::HashMap;

/// Asserts a run failed with exit 2 and one line naming `needle`.
fn fails_with(args: &[&str], needle: &str) -> String {
    let out = autopp(args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "args {args:?}: stderr {stderr}");
    assert!(!stderr.contains("panicked"), "panic for {args:?}: {stderr}");
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "not one line: {stderr}"
    );
    assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
    assert!(out.stdout.is_empty(), "stdout on error: {:?}", out.stdout);
    stderr
}

/// One element of a parsed XML document.
#[derive(Debug)]
struct Element {
    name: String,
    attrs: HashMap<String, String>,
    text: String,
}

/// A small strict XML reader: checks that tags nest and close, attributes are quoted, and
/// text holds no raw `<` or bare `&`; returns the elements in document order.
fn parse_xml(doc: &str) -> Result<Vec<Element>, String> {
    let mut elements: Vec<Element> = Vec::new();
    let mut open: Vec<(String, usize)> = Vec::new();
    let mut rest = doc.trim_start();
    if let Some(r) = rest.strip_prefix("<?xml") {
        rest = &r[r.find("?>").ok_or("unterminated XML declaration")? + 2..];
    }
    while !rest.is_empty() {
        let lt = rest.find('<').unwrap_or(rest.len());
        let text = &rest[..lt];
        for (k, _) in text.match_indices('&') {
            let ent = &text[k..];
            if !["&amp;", "&lt;", "&gt;", "&quot;", "&apos;", "&#"]
                .iter()
                .any(|e| ent.starts_with(e))
            {
                return Err(format!("bare & in text {text:?}"));
            }
        }
        if let Some(&(_, idx)) = open.last() {
            elements[idx].text.push_str(text);
        } else if !text.trim().is_empty() {
            return Err(format!("text outside the root: {text:?}"));
        }
        if lt == rest.len() {
            break;
        }
        rest = &rest[lt..];
        if let Some(r) = rest.strip_prefix("<!--") {
            rest = &r[r.find("-->").ok_or("unterminated comment")? + 3..];
            continue;
        }
        let gt = rest.find('>').ok_or("unterminated tag")?;
        let tag = &rest[1..gt];
        rest = &rest[gt + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            let (top, _) = open.pop().ok_or(format!("stray </{name}>"))?;
            if top != name.trim() {
                return Err(format!("</{name}> closes <{top}>"));
            }
            continue;
        }
        let self_closing = tag.ends_with('/');
        let tag = tag.trim_end_matches('/');
        let (name, mut attrs_text) = tag.split_once(char::is_whitespace).unwrap_or((tag, ""));
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(format!("bad tag name {name:?}"));
        }
        let mut attrs = HashMap::new();
        loop {
            attrs_text = attrs_text.trim_start();
            if attrs_text.is_empty() {
                break;
            }
            let eq = attrs_text
                .find('=')
                .ok_or(format!("attribute without value in <{name}>"))?;
            let key = attrs_text[..eq].trim().to_string();
            let after = &attrs_text[eq + 1..];
            let quote = after.chars().next().filter(|c| *c == '"' || *c == '\'');
            let quote = quote.ok_or(format!("unquoted attribute {key} in <{name}>"))?;
            let end = after[1..].find(quote).ok_or("unterminated attribute")?;
            let value = &after[1..1 + end];
            if value.contains('<') {
                return Err(format!("raw < in attribute {key}"));
            }
            if attrs.insert(key.clone(), value.to_string()).is_some() {
                return Err(format!("duplicate attribute {key}"));
            }
            attrs_text = &after[end + 2..];
        }
        elements.push(Element {
            name: name.to_string(),
            attrs,
            text: String::new(),
        });
        if !self_closing {
            open.push((name.to_string(), elements.len() - 1));
        }
        if open.is_empty() && !self_closing {
            return Err("element after the root closed".into());
        }
    }
    if let Some((name, _)) = open.pop() {
        return Err(format!("<{name}> is never closed"));
    }
    Ok(elements)
}

#[test]
fn ascii_timeline_and_metrics_of_1f1b() {
    let out = stdout(&["schedule", "1f1b", "--pp", "4", "--microbatches", "8"]);
    assert!(
        out.contains("rank 0 F0 F1 F2 F3 ..................B0    F4 B1"),
        "{out}"
    );
    assert!(out.contains("rank 3 .........F0 B0    F1 B1"), "{out}");
    assert!(
        out.contains("makespan 33   bubble fraction 0.2727"),
        "{out}"
    );
    let peaks: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("rank   busy"))
        .skip(1)
        .take(4)
        .map(|l| l.split_whitespace().last().unwrap())
        .collect();
    assert_eq!(peaks, ["4", "3", "2", "1"]);
}

#[test]
fn json_has_the_documented_shape() {
    let out = stdout(&[
        "schedule",
        "interleaved-1f1b",
        "--pp",
        "4",
        "--microbatches",
        "8",
        "--virtual",
        "2",
        "--json",
    ]);
    let j: serde_json::Value = serde_json::from_str(&out).expect("one JSON object");
    assert_eq!(j["schedule"], "interleaved-1f1b");
    assert_eq!(j["pp"], 4);
    assert_eq!(j["virtual_stages"], 2);
    assert_eq!(j["num_microbatches"], 8);
    let ranks = j["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 4);
    assert_eq!(ranks[0][0], "0F0");
    assert_eq!(ranks[3][5], "7B0");
    assert!(ranks.iter().all(|r| r.as_array().unwrap().len() == 32));
    let m = &j["metrics"];
    assert_eq!(m["makespan"], 57.0);
    let bubble = m["bubble_fraction"].as_f64().unwrap();
    assert!((bubble - 3.0 / 19.0).abs() < 1e-12);
    assert_eq!(m["busy"], serde_json::json!([48.0, 48.0, 48.0, 48.0]));
    assert_eq!(m["peak_inflight"], serde_json::json!([11, 9, 7, 5]));
}

#[test]
fn costs_and_comm_change_the_timing() {
    let out = stdout(&[
        "schedule",
        "gpipe",
        "--pp",
        "2",
        "--microbatches",
        "1",
        "--costs",
        "F=1,B=2",
        "--comm",
        "0.5",
        "--json",
    ]);
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["metrics"]["makespan"], 7.0);
}

#[test]
fn svg_of_interleaved_parses() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("s.svg");
    let trace = dir.path().join("t.json");
    let out = stdout(&[
        "schedule",
        "interleaved-1f1b",
        "--pp",
        "4",
        "--microbatches",
        "8",
        "--virtual",
        "2",
        "--svg",
        svg.to_str().unwrap(),
        "--trace",
        trace.to_str().unwrap(),
    ]);
    assert!(out.contains("wrote SVG to"), "{out}");
    let text = std::fs::read_to_string(&svg).unwrap();
    let elements = parse_xml(&text).unwrap_or_else(|e| panic!("SVG does not parse: {e}"));
    assert_eq!(elements[0].name, "svg");
    assert_eq!(
        elements[0].attrs.get("xmlns").map(String::as_str),
        Some("http://www.w3.org/2000/svg")
    );
    let class = |c: &str| {
        elements
            .iter()
            .filter(|e| e.attrs.get("class").map(String::as_str) == Some(c))
            .count()
    };
    assert_eq!(class("F"), 64);
    assert_eq!(class("B"), 64);
    assert_eq!(class("idle"), 4);
    assert_eq!(class("memory"), 4);
    let rank_labels = elements
        .iter()
        .filter(|e| e.name == "text" && e.text.starts_with("rank "))
        .count();
    assert_eq!(rank_labels, 4);
    let t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let complete = t["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .count();
    assert_eq!(complete, 128);
    // Nothing but the two outputs in the directory: no temporary files left.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
}

#[test]
fn failed_writes_leave_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-dir").join("s.svg");
    fails_with(
        &[
            "schedule",
            "1f1b",
            "--pp",
            "2",
            "--microbatches",
            "2",
            "--svg",
            missing.to_str().unwrap(),
        ],
        "--svg",
    );
    // A directory where the file should go: the rename fails, the temp file is removed.
    let target = dir.path().join("taken");
    std::fs::create_dir(&target).unwrap();
    std::fs::write(target.join("keep"), "x").unwrap();
    fails_with(
        &[
            "schedule",
            "1f1b",
            "--pp",
            "2",
            "--microbatches",
            "2",
            "--trace",
            target.to_str().unwrap(),
        ],
        "--trace",
    );
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(names, ["taken"], "left behind: {names:?}");
}

/// `--steps A..B` draws a window of the run: fewer cells, the axis from the window's start,
/// the header saying which part is shown; cells of interleaved ranks name their chunk; a bad
/// window is one line naming the flag (issue 22).
#[test]
fn svg_steps_window_draws_part_of_a_long_run() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("s.svg");
    let base = [
        "schedule",
        "interleaved-1f1b",
        "--pp",
        "4",
        "--microbatches",
        "64",
        "--virtual",
        "2",
        "--svg",
        svg.to_str().unwrap(),
    ];
    let cells = |text: &str| text.matches("<rect class=\"F\"").count();
    stdout(&base);
    let whole = std::fs::read_to_string(&svg).unwrap();
    assert_eq!(cells(&whole), 4 * 2 * 64);
    let mut args = base.to_vec();
    args.extend(["--steps", "10..20"]);
    stdout(&args);
    let part = std::fs::read_to_string(&svg).unwrap();
    parse_xml(&part).unwrap_or_else(|e| panic!("SVG does not parse: {e}"));
    assert!(cells(&part) < cells(&whole) / 4, "{} cells", cells(&part));
    assert!(part.contains("showing "), "no window in the header");
    assert!(part.contains("·c1<"), "no chunk label");
    let mut args = base.to_vec();
    args.extend(["--steps", "20..10"]);
    fails_with(&args, "--steps");
    let mut args = base.to_vec();
    args.extend(["--steps", "9999..10000"]);
    fails_with(&args, "--steps");
}

#[test]
fn bad_input_names_the_flag() {
    let base = ["schedule", "1f1b", "--pp", "4", "--microbatches", "8"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        base.iter().copied().chain(extra.iter().copied()).collect()
    };
    fails_with(&with(&["--virtual", "2"]), "error: --virtual: ");
    fails_with(&with(&["--group-size", "4"]), "error: --group-size: ");
    fails_with(&with(&["--costs", "X=1"]), "--costs");
    fails_with(&with(&["--costs", "F=-1"]), "--costs");
    fails_with(&with(&["--comm=-1"]), "--comm");
    fails_with(
        &["schedule", "gpipe", "--pp", "0", "--microbatches", "8"],
        "error: --pp: pp must be at least 1",
    );
    fails_with(
        &["schedule", "looped-bfs", "--pp", "2", "--microbatches", "0"],
        "error: --microbatches: num_microbatches must be at least 1",
    );
    fails_with(
        &[
            "schedule",
            "interleaved-1f1b",
            "--pp",
            "4",
            "--microbatches",
            "8",
            "--virtual",
            "2",
            "--group-size",
            "3",
        ],
        "error: --group-size: ",
    );
    // An unknown schedule is a usage error listing the valid names.
    let out = autopp(&["schedule", "zb-h9", "--pp", "4", "--microbatches", "8"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("gpipe, 1f1b, interleaved-1f1b, looped-bfs"),
        "{err}"
    );
}

#[test]
fn zero_bubble_kinds_run_with_their_default_virtual_stages() {
    // zb-v and dualpipe-v place two stages per rank without being told.
    for (kind, makespan) in [
        ("zb-h1", 27.0),
        ("zb-h2", 27.0),
        ("zb-v", 51.0),
        ("dualpipe-v", 54.0),
    ] {
        let out = stdout(&[
            "schedule",
            kind,
            "--pp",
            "4",
            "--microbatches",
            "8",
            "--json",
        ]);
        let j: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(j["schedule"], kind);
        assert_eq!(j["metrics"]["makespan"], makespan, "{kind}");
        let v = if kind.ends_with("-v") { 2 } else { 1 };
        assert_eq!(j["virtual_stages"], v, "{kind}");
    }
    let out = stdout(&["schedule", "zb-v", "--pp", "4", "--microbatches", "8"]);
    assert!(out.contains("I backward-input, W backward-weight"), "{out}");
    assert!(
        out.contains("rank 0 0F0 0F1 0F2 0F3 0F4 0F5 0F6 7F0 7I0 7W0"),
        "{out}"
    );
    // An overlapped pair is one cell with both labels.
    let out = stdout(&["schedule", "dualpipe-v", "--pp", "4", "--microbatches", "8"]);
    assert!(out.contains("0F7+7B3"), "{out}");
    fails_with(
        &[
            "schedule",
            "zb-v",
            "--pp",
            "4",
            "--microbatches",
            "8",
            "--virtual",
            "3",
        ],
        "error: --virtual: zb-v places exactly two stages",
    );
    fails_with(
        &["schedule", "dualpipe-v", "--pp", "4", "--microbatches", "7"],
        "error: --microbatches: ",
    );
    fails_with(
        &[
            "schedule",
            "interleaved-zb",
            "--pp",
            "4",
            "--microbatches",
            "8",
        ],
        "error: --virtual: ",
    );
    fails_with(
        &["schedule", "zb-h1", "--pp", "1", "--microbatches", "8"],
        "error: --pp: ",
    );
}

#[test]
fn svg_of_dualpipe_v_draws_pairs_and_split_backwards() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("d.svg");
    stdout(&[
        "schedule",
        "dualpipe-v",
        "--pp",
        "4",
        "--microbatches",
        "8",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    let text = std::fs::read_to_string(&svg).unwrap();
    let elements = parse_xml(&text).unwrap_or_else(|e| panic!("SVG does not parse: {e}"));
    let class = |c: &str| {
        elements
            .iter()
            .filter(|e| e.attrs.get("class").map(String::as_str) == Some(c))
            .count()
    };
    let j: serde_json::Value = serde_json::from_str(&stdout(&[
        "schedule",
        "dualpipe-v",
        "--pp",
        "4",
        "--microbatches",
        "8",
        "--json",
    ]))
    .unwrap();
    let steps: Vec<String> = j["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r.as_array().unwrap().iter())
        .map(|x| x.as_str().unwrap().to_string())
        .collect();
    let count = |f: &dyn Fn(&str) -> bool| steps.iter().filter(|x| f(x)).count();
    let pairs = count(&|x| x.starts_with('('));
    assert!(pairs > 0);
    assert_eq!(class("pair"), pairs);
    assert_eq!(
        class("I"),
        count(&|x| !x.starts_with('(') && x.contains('I'))
    );
    assert_eq!(class("W"), class("I"));
    assert!(class("I") > 0);
    // every pair's fill is a gradient defined in the document
    for e in elements
        .iter()
        .filter(|e| e.attrs.get("class").map(String::as_str) == Some("pair"))
    {
        let fill = &e.attrs["fill"];
        let id = fill.trim_start_matches("url(#").trim_end_matches(')');
        assert!(
            elements
                .iter()
                .any(|g| g.name == "linearGradient"
                    && g.attrs.get("id").map(String::as_str) == Some(id)),
            "{fill}"
        );
    }
}

#[test]
fn xml_reader_rejects_broken_documents() {
    assert!(parse_xml("<svg><rect></svg>").is_err());
    assert!(parse_xml("<svg a=1></svg>").is_err());
    assert!(parse_xml("<svg><text>a & b</text></svg>").is_err());
    assert!(parse_xml("<svg><text>a &amp; b</text></svg>").is_ok());
}
