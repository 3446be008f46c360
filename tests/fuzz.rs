//! The fuzzer (issue #21): every fixture we have — model presets, real Hugging Face configs,
//! layer lists, cluster.json, a plan file, a measured profile, published runs — mutated (a value
//! made zero, negative, huge, NaN, a string or null; a key removed or added; the file truncated,
//! made binary, empty or nested deeply) and every command's flags given bad values (zero,
//! negative, huge, NaN, not dividing), fed to the built binary.
//!
//! Success: exit 0, or exit 2 with one line on stderr; never a panic, another exit status, a run
//! over 10 s, a partial output file or a temporary file left behind. A fixed seed
//! (`AUTOPP_FUZZ_SEED`, default 21) makes a run repeatable; `AUTOPP_FUZZ_CASES` (default
//! 5,000) sets its size. A failing case's command and files are kept in
//! `target/fuzz-failures/`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A small, seeded generator (SplitMix64): the same seed gives the same cases everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// Bad values for a flag: zero, negative, huge, NaN, infinite, not dividing, not a number.
const FLAG_VALUES: [&str; 18] = [
    "0",
    "-1",
    "1e30",
    "1e308",
    "18446744073709551615",
    "NaN",
    "inf",
    "18446744073709551616",
    "4294967297",
    "1000000",
    "3",
    "7",
    "2.5",
    "abc",
    "",
    "1",
    "2",
    "-0",
];

/// Bad values for a JSON field.
fn json_values() -> Vec<Value> {
    vec![
        Value::from(0),
        Value::from(-1),
        Value::from(1e300),
        Value::from(1e-300),
        Value::from(u64::MAX),
        Value::from(3),
        Value::from(2.5),
        Value::from("NaN"),
        Value::from("abc"),
        Value::from(""),
        Value::from("82.4"),
        Value::Null,
        Value::from(true),
        Value::Array(vec![]),
        serde_json::json!({}),
        serde_json::json!([1, 2]),
    ]
}

/// Every path to a value in `v`, as object keys and array indices.
fn paths(v: &Value, here: &mut Vec<Seg>, out: &mut Vec<Vec<Seg>>) {
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                here.push(Seg::Key(k.clone()));
                out.push(here.clone());
                paths(child, here, out);
                here.pop();
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                here.push(Seg::Index(i));
                out.push(here.clone());
                paths(child, here, out);
                here.pop();
            }
        }
        _ => {}
    }
}

#[derive(Clone, Debug)]
enum Seg {
    Key(String),
    Index(usize),
}

/// The value at `path` (its parent must exist).
fn at<'a>(v: &'a mut Value, path: &[Seg]) -> Option<&'a mut Value> {
    let mut cur = v;
    for seg in path {
        cur = match seg {
            Seg::Key(k) => cur.get_mut(k.as_str())?,
            Seg::Index(i) => cur.get_mut(*i)?,
        };
    }
    Some(cur)
}

/// A mutation of the JSON text `text` (or the text itself, one time in ten).
fn mutate(rng: &mut Rng, text: &str) -> Vec<u8> {
    let mut value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(_) => return text.as_bytes().to_vec(),
    };
    match rng.below(20) {
        0 => return text.as_bytes().to_vec(),
        1 => return Vec::new(),
        2 => {
            let cut = rng.below(text.len());
            return text.as_bytes()[..cut].to_vec();
        }
        3 => {
            let mut bytes = text.as_bytes().to_vec();
            for _ in 0..8 {
                let i = rng.below(bytes.len());
                bytes[i] = rng.next() as u8;
            }
            return bytes;
        }
        4 => return "[".repeat(1 << 16).into_bytes(),
        5 => return format!("{}{}", "{\"a\":".repeat(5000), "1").into_bytes(),
        _ => {}
    }
    let mut all = Vec::new();
    paths(&value, &mut Vec::new(), &mut all);
    let edits = 1 + rng.below(2);
    for _ in 0..edits {
        if all.is_empty() {
            break;
        }
        let path = rng.pick(&all).clone();
        match rng.below(10) {
            0 => {
                // remove the key (or element)
                let (last, parent) = path.split_last().expect("non-empty path");
                if let Some(p) = at(&mut value, parent) {
                    match (p, last) {
                        (Value::Object(m), Seg::Key(k)) => {
                            m.remove(k);
                        }
                        (Value::Array(a), Seg::Index(i)) if *i < a.len() => {
                            a.remove(*i);
                        }
                        _ => {}
                    }
                }
            }
            1 => {
                // an unknown key beside it
                let (_, parent) = path.split_last().expect("non-empty path");
                if let Some(Value::Object(m)) = at(&mut value, parent) {
                    m.insert("zz_unknown".into(), Value::from(1));
                }
            }
            _ => {
                let new = rng.pick(&json_values()).clone();
                if let Some(slot) = at(&mut value, &path) {
                    *slot = new;
                }
            }
        }
    }
    let mut bytes = serde_json::to_vec_pretty(&value).expect("JSON");
    // numbers JSON cannot hold, spelt as people write them
    if rng.chance(10) {
        let s = String::from_utf8_lossy(&bytes).replacen("1e300", "1e999", 1);
        bytes = s.replacen(": 3", ": NaN", 1).into_bytes();
    }
    bytes
}

/// The fixtures: (kind, path) for every file we mutate.
fn fixtures(root: &Path) -> Vec<(&'static str, PathBuf)> {
    let mut out = Vec::new();
    let mut add = |kind: &'static str, dir: &str| {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            return;
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        files.sort();
        for f in files {
            out.push((kind, f));
        }
    };
    add("model", "models/presets");
    add("model", "tests/fixtures/hf-configs");
    add("model", "models/tests/fixtures/hf");
    out.push(("model", root.join("models/tests/fixtures/layer-list.json")));
    let fuzz = root.join("tests/fixtures/fuzz");
    out.push(("cluster", fuzz.join("cluster.json")));
    out.push(("cluster", fuzz.join("cluster-custom-gpu.json")));
    out.push(("plan", fuzz.join("plan.json")));
    out.push(("profile", fuzz.join("profile.json")));
    out.push(("runs", fuzz.join("published-runs.json")));
    out.push(("my-runs", fuzz.join("my-runs.json")));
    out.push(("calibration", fuzz.join("calibration.json")));
    out
}

/// One case: the arguments, and the output path the command may write.
struct Case {
    args: Vec<String>,
    out: Option<PathBuf>,
}

/// Builds case `n` in `dir`.
fn case(rng: &mut Rng, fixtures: &[(&'static str, PathBuf)], dir: &Path) -> Case {
    let of = |kind: &str| -> Vec<&PathBuf> {
        fixtures
            .iter()
            .filter(|(k, _)| *k == kind)
            .map(|(_, p)| p)
            .collect()
    };
    let write = |rng: &mut Rng, kind: &str, name: &str| -> String {
        let files = of(kind);
        let src = rng.pick(&files);
        let text = std::fs::read_to_string(src).expect("fixture");
        let path = dir.join(name);
        std::fs::write(&path, mutate(rng, &text)).expect("write");
        path.to_string_lossy().into_owned()
    };
    let model = |rng: &mut Rng| -> String {
        if rng.chance(15) {
            rng.pick(&["tiny-gpt", "gpt3-175b", "llama3-8b", "no-such-model"])
                .to_string()
        } else {
            write(rng, "model", "model.json")
        }
    };
    let out_file = dir.join("out").join("result.json");
    let out = out_file.to_string_lossy().into_owned();
    let line: String = match rng.below(16) {
        0 | 1 => format!(
            "estimate {} --gpus 8 --tp 1 --pp 2 --mbs 1 --global-batch 16 --seq-len 128 --json",
            model(rng)
        ),
        2 => format!(
            "estimate {} --cluster {} --pp 2 --global-batch 16 --schedule zb-v",
            model(rng),
            write(rng, "cluster", "cluster.json")
        ),
        3 if rng.chance(30) => format!(
            "estimate tiny-gpt --gpus 8 --pp 2 --global-batch 16 --calibration {}",
            write(rng, "calibration", "calibration.json")
        ),
        3 => format!("estimate --plan {}", write(rng, "plan", "plan.json")),
        4 => format!(
            "estimate tiny-gpt --gpus 8 --pp 2 --global-batch 16 --profile {}",
            write(rng, "profile", "profile.json")
        ),
        5 | 6 => format!(
            "plan {} --gpus 8 --global-batch 16 --seq-len 256 --max-virtual 2 --out {out}",
            model(rng)
        ),
        7 => format!(
            "schedule {} --pp 4 --microbatches 8 --virtual 2",
            rng.pick(&[
                "1f1b",
                "interleaved-1f1b",
                "zb-v",
                "dualpipe-v",
                "interleaved-zb",
                "looped-bfs",
                "gpipe",
                "zb-h2"
            ])
        ),
        8 => format!("schedule --plan {} --json", write(rng, "plan", "plan.json")),
        9 if rng.chance(50) => format!(
            "calibrate {} --out {out}",
            write(rng, "my-runs", "my-runs.json")
        ),
        9 => format!("validate {}", write(rng, "runs", "runs.json")),
        10 => format!(
            "launch {} --framework {} --out {}",
            write(rng, "plan", "plan.json"),
            rng.pick(&["megatron", "torchtitan", "deepspeed"]),
            dir.join("out").join("launch").to_string_lossy()
        ),
        11 => format!(
            "exec tiny-gpt --pp 2 --microbatches 2 --mbs 1 --schedule {} --steps 1 --seq-len 16",
            rng.pick(&["1f1b", "gpipe", "zb-v", "interleaved-zb"])
        ),
        12 => format!("profile tiny-gpt --seq-len 16 --repetitions 1 --warmup 0 --out {out}"),
        // issue #22's flags: --set, batch units and time to train, compare
        13 => format!(
            "estimate --plan {} --set tp=2,pp=1,mbs=2,zero=1,sp=on,recompute=full --train-tokens 1T --price 2",
            write(rng, "plan", "plan.json")
        ),
        14 => format!(
            "estimate {} --gpus 8 --pp 2 --seq-len 128 --global-batch-tokens 4096 --train-tokens 1B --price 2.5 --zero 1 --sequence-parallel off",
            model(rng)
        ),
        _ => format!(
            "compare {} {}",
            write(rng, "plan", "a.json"),
            write(rng, "plan", "b.json")
        ),
    };
    let mut args: Vec<String> = line.split(' ').map(str::to_string).collect();
    // bad flag values: one in two cases changes one or two of them
    if rng.chance(50) {
        for _ in 0..1 + rng.below(2) {
            let flags: Vec<usize> = (1..args.len())
                .filter(|&i| {
                    args[i].starts_with("--")
                        && i + 1 < args.len()
                        && !args[i + 1].starts_with("--")
                        // files are mutated on their own; a million training steps is a long
                        // run, not a hang
                        && !["--out", "--plan", "--cluster", "--profile", "--steps", "--calibration"]
                            .contains(&args[i].as_str())
                })
                .collect();
            if flags.is_empty() {
                break;
            }
            let i = *rng.pick(&flags);
            args[i + 1] = rng.pick(&FLAG_VALUES).to_string();
        }
    }
    let writes = args.iter().any(|a| a == "--out");
    Case {
        args,
        out: writes.then(|| dir.join("out")),
    }
}

/// What went wrong with one run, if anything.
fn judge(c: &Case, status: Option<i32>, stderr: &str, elapsed: Duration) -> Option<String> {
    if elapsed > Duration::from_secs(10) {
        return Some(format!("ran {elapsed:?} (over 10 s)"));
    }
    if stderr.contains("panicked") {
        return Some("panicked".into());
    }
    match status {
        Some(0) => {}
        Some(2) => {
            let lines = stderr.trim_end().lines().count();
            if lines != 1 || !stderr.starts_with("error: ") {
                return Some(format!("exit 2 with {lines} lines"));
            }
        }
        other => return Some(format!("exit {other:?}")),
    }
    if let Some(dir) = &c.out {
        for entry in walk(dir) {
            let name = entry.file_name().map(|n| n.to_string_lossy().into_owned());
            if name
                .as_deref()
                .is_some_and(|n| n.starts_with('.') && n.contains(".tmp"))
            {
                return Some(format!("temporary file left: {}", entry.display()));
            }
            if status != Some(0) && entry.is_file() {
                return Some(format!("failed but wrote {}", entry.display()));
            }
            if entry.extension().is_some_and(|x| x == "json") {
                let text = std::fs::read_to_string(&entry).unwrap_or_default();
                if serde_json::from_str::<Value>(&text).is_err() {
                    return Some(format!("partial file {}", entry.display()));
                }
            }
        }
    }
    None
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// Runs one case with a 10 s limit (plus slack for a loaded machine): status, stderr, time.
fn run(c: &Case, cwd: &Path) -> (Option<i32>, String, Duration) {
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_autopp"))
        .args(&c.args)
        .current_dir(cwd)
        .env("RAYON_NUM_THREADS", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the autopp binary runs");
    let stderr_pipe = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut p) = stderr_pipe {
            use std::io::Read;
            let mut bytes = Vec::new();
            let _ = p.read_to_end(&mut bytes);
            s = String::from_utf8_lossy(&bytes).into_owned();
        }
        s
    });
    let limit = Duration::from_secs(20);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status.code(),
            Ok(None) if started.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(2)),
            Err(_) => break None,
        }
    };
    let elapsed = started.elapsed();
    (status, reader.join().unwrap_or_default(), elapsed)
}

#[test]
fn no_input_panics_hangs_or_leaves_a_partial_file() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fixtures = fixtures(root);
    assert!(fixtures.len() >= 30, "fixtures: {}", fixtures.len());
    let seed: u64 = std::env::var("AUTOPP_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(21);
    let cases: usize = std::env::var("AUTOPP_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5000);
    let workers = 2;
    let started = Instant::now();
    let failures: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let fixtures = &fixtures;
                scope.spawn(move || {
                    let mut failures = Vec::new();
                    for n in (w..cases).step_by(workers) {
                        let mut rng = Rng(seed ^ (n as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
                        let dir = tempfile::tempdir().expect("temp dir");
                        let c = case(&mut rng, fixtures, dir.path());
                        let (status, stderr, elapsed) = run(&c, dir.path());
                        if let Some(why) = judge(&c, status, &stderr, elapsed) {
                            let keep = root.join("target/fuzz-failures").join(n.to_string());
                            let _ = std::fs::create_dir_all(&keep);
                            for f in walk(dir.path()) {
                                if let Some(name) = f.file_name() {
                                    let _ = std::fs::copy(&f, keep.join(name));
                                }
                            }
                            failures.push(format!(
                                "case {n}: {why}: autopp {}\n    {}",
                                c.args.join(" "),
                                stderr.trim_end().replace('\n', "\n    ")
                            ));
                        }
                    }
                    failures
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("worker"))
            .collect()
    });
    eprintln!(
        "fuzz: {cases} cases (seed {seed}) in {:.1} s, {} failures",
        started.elapsed().as_secs_f64(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {cases} cases failed:\n{}",
        failures.len(),
        failures
            .iter()
            .take(30)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}
