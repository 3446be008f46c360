//! Helpers the end-to-end tests share: run the `autopp` binary as a user would.

// each test crate uses its own subset
#![allow(dead_code)]

use std::process::{Command, Output};

/// Runs `autopp ARGS…` and returns what it did.
pub fn autopp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_autopp"))
        .args(args)
        .output()
        .expect("the autopp binary runs")
}

/// Runs `autopp ARGS…`, asserts it succeeded and returns its standard output.
pub fn stdout(args: &[&str]) -> String {
    let out = autopp(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// Runs `autopp ARGS…` and asserts it failed as every bad input must: exit 2, one line on
/// stderr containing `needle`, no panic, nothing on stdout.
pub fn fails_one_line(args: &[&str], needle: &str) {
    let out = autopp(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "not one line: {stderr}"
    );
    assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
    assert!(out.stdout.is_empty(), "{args:?} printed on stdout");
}
