//! Helpers of the launch tests (`cli_launch.rs`, `cli_launch_out.rs`): plan files made and
//! edited, and refusals asserted as a user sees them.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{autopp, stdout};

/// `autopp plan ARGS --memory-margin 0 --out DIR/NAME.json`; returns the plan file's path.
/// No margin: the pinned configurations here were chosen before plans kept one and some fill
/// memory; the launch files, not the margin, are under test.
pub fn plan(dir: &Path, name: &str, args: &str) -> PathBuf {
    let path = dir.join(format!("{name}.json"));
    let mut argv: Vec<&str> = vec!["plan"];
    argv.extend(args.split_whitespace());
    argv.extend(["--memory-margin", "0"]);
    argv.extend(["--out", path.to_str().expect("UTF-8")]);
    stdout(&argv);
    path
}

/// A copy of the plan file at `path` as NAME.json, changed by `edit`.
pub fn edited(path: &Path, name: &str, edit: impl FnOnce(&mut Value)) -> PathBuf {
    let mut file: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("read")).expect("JSON");
    edit(&mut file);
    let out = path.with_file_name(format!("{name}.json"));
    std::fs::write(&out, file.to_string()).expect("write");
    out
}

/// Runs `autopp launch PLAN ARGS… --out DIR/out`, asserts exit 2 with one line of stderr that
/// contains every `needle`, and that no output directory was made.
pub fn fails(plan: &Path, args: &[&str], needles: &[&str]) {
    let out_dir = plan.with_file_name("out");
    let mut argv = vec!["launch", plan.to_str().expect("UTF-8")];
    argv.extend(args);
    argv.extend(["--out", out_dir.to_str().expect("UTF-8")]);
    let out = autopp(&argv);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{argv:?}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    for needle in needles {
        assert!(
            err.contains(needle),
            "{argv:?}: expected `{needle}` in: {err}"
        );
    }
    assert!(!out_dir.exists(), "no partial output directory");
    assert!(out.stdout.is_empty(), "nothing on stdout");
}

pub const ZB_H2: &str = "llama3-70b --gpus 64 --fix tp=8,pp=4,dp=2,schedule=zb-h2,zero_stage=2";
pub const ZB_V: &str = "llama3-70b --gpus 128 --framework torchtitan --fix tp=8,pp=4,dp=4,virtual_stages=2,micro_batch_size=1,schedule=zb-v,zero_stage=2";
pub const EVEN_1F1B: &str = "llama3-8b --gpus 8 --framework megatron --fix tp=2,pp=4,dp=1,virtual_stages=1,micro_batch_size=1,schedule=1f1b,recompute=none,zero_stage=1 --even-split";
pub const CP2: &str = "llama2-70b --gpus 128 --framework megatron --fix tp=8,pp=4,dp=2,cp=2,virtual_stages=1,schedule=1f1b,zero_stage=1";

/// A layer-list model file `DIR/net.json` named my-net.
pub fn layer_list_model(dir: &Path) -> PathBuf {
    let model = dir.join("net.json");
    std::fs::write(
        &model,
        r#"{"name": "my-net", "seq_length": 1024, "global_batch_size": 64, "layers": [
            {"name": "block", "count": 8, "params": 1.0e7, "forward_flops": 2.0e10,
             "activation_bytes": 3.0e7, "output_bytes": 2097152}]}"#,
    )
    .expect("write");
    model
}

/// `autopp plan ARGS` (whitespace-separated) exits 2 with one line of stderr containing `needle`.
pub fn plan_refused(args: &str, needle: &str) {
    let mut argv = vec!["plan"];
    argv.extend(args.split_whitespace());
    let out = autopp(&argv);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{args}: {err}");
    assert!(
        err.contains(needle),
        "{args}: expected `{needle}` in: {err}"
    );
}

/// `autopp launch PLAN --framework FRAMEWORK --json`: its arguments and its files' texts.
pub fn launched(plan: &Path, framework: &str) -> (Vec<String>, Value) {
    let text = stdout(&[
        "launch",
        plan.to_str().expect("UTF-8"),
        "--framework",
        framework,
        "--json",
    ]);
    let v: Value = serde_json::from_str(&text).expect("launch --json");
    let args = v["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string").to_string())
        .collect();
    (args, v["files"].clone())
}

/// Asserts that `want` appears in `args` as consecutive arguments.
pub fn has(args: &[String], want: &[&str]) {
    assert!(
        args.windows(want.len()).any(|w| w == want),
        "{want:?} not in {args:?}"
    )
}
