//! Every command's `--help` opens with examples; `autopp completions` and `autopp man` generate
//! shell completions and man pages.

mod common;

use common::{autopp, stdout};

const COMMANDS: [&str; 11] = [
    "plan",
    "launch",
    "estimate",
    "schedule",
    "validate",
    "exec",
    "profile",
    "models",
    "gpus",
    "completions",
    "man",
];

#[test]
fn every_help_opens_with_two_or_three_examples() {
    for command in COMMANDS {
        for flag in ["-h", "--help"] {
            let help = stdout(&[command, flag]);
            let mut lines = help.lines();
            assert_eq!(lines.next(), Some("Examples:"), "{command} {flag}: {help}");
            let examples = lines.take_while(|l| l.starts_with("  autopp ")).count();
            assert!((2..=3).contains(&examples), "{command} {flag}: {help}");
        }
    }
}

#[test]
fn completions_for_each_shell() {
    for (shell, needle) in [
        ("bash", "_autopp()"),
        ("zsh", "#compdef autopp"),
        ("fish", "complete -c autopp"),
        ("elvish", "autopp"),
        ("powershell", "autopp"),
    ] {
        let script = stdout(&["completions", shell]);
        assert!(script.contains(needle), "{shell}: {script}");
        assert!(script.contains("estimate"), "{shell}");
    }
    let out = autopp(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn man_pages_to_stdout_and_to_a_directory() {
    let page = stdout(&["man"]);
    assert!(page.contains(".TH autopp 1"), "{page}");
    assert!(page.contains("estimate"), "{page}");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("man");
    stdout(&["man", "--out", out.to_str().unwrap()]);
    for command in COMMANDS {
        let page = std::fs::read_to_string(out.join(format!("autopp-{command}.1"))).unwrap();
        assert!(page.contains(&format!(".TH autopp-{command} 1")), "{page}");
    }
}
