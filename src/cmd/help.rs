//! The examples each command's `--help` opens with, and `autopp completions` / `autopp man`.

use anyhow::Result;
use clap::CommandFactory;

/// `autopp plan`'s examples.
pub const PLAN: &str = "Examples:
  autopp plan gpt3-175b --gpus 1024 --gpu a100-80g --global-batch 1536 --train-tokens 300B --json
  autopp plan llama3-70b --gpus 64 --framework megatron --calibration my-cluster.json --out plan.json
  autopp plan config.json --gpus 32 --seq-len 4096 --fix pp=4,schedule=1f1b";

/// `autopp launch`'s examples.
pub const LAUNCH: &str = "Examples:
  autopp launch plan.json --framework megatron --out launch/
  autopp launch plan.json --framework torchtitan --out launch/";

/// `autopp estimate`'s examples.
pub const ESTIMATE: &str = "Examples:
  autopp estimate gpt3-175b --gpus 1024 --gpu a100-80g --tp 8 --pp 16 --global-batch 1536
  autopp estimate config.json --gpus 64 --tp 8 --pp 4 --seq-len 8192 --schedule zb-v
  autopp estimate --plan plan.json --set tp=4,recompute=full --json";

/// `autopp schedule`'s examples.
pub const SCHEDULE: &str = "Examples:
  autopp schedule 1f1b --pp 4 --microbatches 8
  autopp schedule interleaved-1f1b --pp 4 --microbatches 8 --virtual 2 --svg s.svg
  autopp schedule --plan plan.json --trace trace.json";

/// `autopp whatif`'s examples.
pub const WHATIF: &str = "Examples:
  autopp whatif llama3-70b --gpus 64..1024 --gpu a100-80g,h100-sxm,h200 --tokens 15T
  autopp whatif llama3-8b --gpus 8,16,32 --nic-gbps 200,400 --batch-per-gpu 64K --csv
  autopp whatif llama3-70b --gpus 128..2048 --global-batch-tokens 8M --tokens 2T --price h100-sxm=2.2";

/// `autopp validate`'s examples.
pub const VALIDATE: &str = "Examples:
  autopp validate validation/published-runs.json
  autopp validate validation/published-runs.json --fit --json";

/// `autopp calibrate`'s examples.
pub const CALIBRATE: &str = "Examples:
  autopp calibrate my-runs.json --out my-cluster.json";

/// `autopp exec`'s examples.
pub const EXEC: &str = "Examples:
  autopp exec tiny-gpt --pp 2 --microbatches 8 --mbs 2 --schedule 1f1b --check
  autopp exec tiny-gpt --pp 2 --microbatches 4 --mbs 1 --schedule zb-v --json
  autopp exec --plan plan.json --steps 5";

/// `autopp profile`'s examples.
pub const PROFILE: &str = "Examples:
  autopp profile tiny-gpt --mbs 2 --out tiny-gpt.profile.json
  autopp profile tiny-gpt --seq-len 64 --out p.json --json";

/// `autopp models`' and `autopp gpus`' examples.
pub const CATALOG: &str = "Examples:
  autopp models
  autopp gpus --json";

/// `autopp completions`' examples.
pub const COMPLETIONS: &str = "Examples:
  autopp completions bash > ~/.local/share/bash-completion/completions/autopp
  autopp completions zsh > ~/.zfunc/_autopp
  autopp completions fish > ~/.config/fish/completions/autopp.fish";

/// `autopp man`'s examples.
pub const MAN: &str = "Examples:
  autopp man > autopp.1 && man ./autopp.1
  autopp man --out man/";

/// Writes the completion script for `shell` to stdout.
pub fn completions<C: CommandFactory>(shell: clap_complete::Shell) -> Result<()> {
    let mut command = C::command();
    let name = command.get_name().to_string();
    clap_complete::generate(shell, &mut command, name, &mut std::io::stdout());
    Ok(())
}

/// Writes the man page (roff) to stdout, or with `out` one page per command into that
/// directory (`autopp.1`, `autopp-plan.1`, …), each written whole.
pub fn man<C: CommandFactory>(out: Option<&str>) -> Result<()> {
    let command = C::command();
    let Some(dir) = out else {
        let mut page = Vec::new();
        clap_mangen::Man::new(command).render(&mut page)?;
        use std::io::Write;
        std::io::stdout().write_all(&page)?;
        return Ok(());
    };
    std::fs::create_dir_all(dir)
        .map_err(|e| anyhow::anyhow!("--out: cannot create '{dir}': {e}"))?;
    let name = command.get_name().to_string();
    let mut pages = vec![(name.clone(), command.clone())];
    for sub in command.get_subcommands() {
        pages.push((format!("{name}-{}", sub.get_name()), sub.clone()));
    }
    for (file, cmd) in pages {
        let mut page = Vec::new();
        clap_mangen::Man::new(cmd)
            .title(file.clone())
            .render(&mut page)?;
        let path = std::path::Path::new(dir).join(format!("{file}.1"));
        super::common::write_atomic(&path.to_string_lossy(), &page)
            .map_err(|e| anyhow::anyhow!("--out: {e}"))?;
    }
    Ok(())
}
