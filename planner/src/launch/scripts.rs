//! The launcher scripts every framework shares: `launch.sh` (torchrun: one node as is, or
//! run on every node of a cluster) and `sbatch.sh` (Slurm: one torchrun per node, the
//! rendezvous from Slurm's variables).

use super::view::PlanView;
use super::Entry;
use crate::framework::Framework;

/// The rendezvous port both scripts default to.
const PORT: u16 = 29500;

/// `launch.sh`: torchrun on this node; with several nodes, run it on each with `NODE_RANK`
/// and `MASTER_ADDR` set.
pub(super) fn launch_sh(view: &PlanView, framework: Framework, entry: &Entry) -> String {
    let nodes = view.nodes();
    let mut s = header(view, framework, entry);
    if nodes == 1 {
        s.push_str("# One node: run it as is.\n");
    } else {
        s.push_str(&format!(
            "# {nodes} nodes: run it on every node with NODE_RANK=0..{} and MASTER_ADDR set to node 0's\n# address (sbatch.sh does this under Slurm).\n",
            nodes - 1
        ));
    }
    s.push_str("set -euo pipefail\n");
    s.push_str("PLAN_DIR=\"$(cd \"$(dirname \"${BASH_SOURCE[0]}\")\" && pwd)\"\n\n");
    s.push_str(&env_block(entry));
    let torchrun = if nodes == 1 {
        format!(
            "torchrun --standalone --nnodes 1 --nproc-per-node {}",
            view.gpus_on_each_node()
        )
    } else {
        s.push_str(&format!(
            "NODE_RANK=${{NODE_RANK:?set NODE_RANK to the index of this node, 0..{}}}\nMASTER_ADDR=${{MASTER_ADDR:?set MASTER_ADDR to the address of node 0}}\nMASTER_PORT=${{MASTER_PORT:-{PORT}}}\n\n",
            nodes - 1
        ));
        format!(
            "torchrun --nnodes {nodes} --nproc-per-node {} --node-rank \"$NODE_RANK\" \\\n    --master-addr \"$MASTER_ADDR\" --master-port \"$MASTER_PORT\"",
            view.gpus_on_each_node()
        )
    };
    s.push_str(&args_block(entry));
    s.push_str(&format!(
        "exec {torchrun} \\\n    {} \"${{ARGS[@]}}\" \"${{RUN[@]}}\"\n",
        entry.program.join(" ")
    ));
    s
}

/// `sbatch.sh`: one task per node, each a torchrun that starts the node's GPUs; the first node
/// of the allocation hosts the rendezvous.
pub(super) fn sbatch_sh(view: &PlanView, framework: Framework, entry: &Entry) -> String {
    let (nodes, per_node) = (view.nodes(), view.gpus_on_each_node());
    let mut s = String::from("#!/usr/bin/env bash\n");
    s.push_str(&format!(
        "#SBATCH --job-name=autopp-{}\n#SBATCH --nodes={nodes}\n#SBATCH --ntasks-per-node=1\n#SBATCH --gpus-per-node={per_node}\n#SBATCH --exclusive\n",
        view.model.name
    ));
    s.push_str(&header(view, framework, entry).replacen("#!/usr/bin/env bash\n", "", 1));
    s.push_str(
        "# Submit from the directory that holds these files: sbatch runs a copy of this script, so\n# the files are found through SLURM_SUBMIT_DIR. One task per node runs torchrun, which\n# starts that node's GPUs.\n",
    );
    s.push_str("set -euo pipefail\n");
    s.push_str("PLAN_DIR=${PLAN_DIR:-$SLURM_SUBMIT_DIR}\n\n");
    s.push_str(&env_block(entry));
    s.push_str(&format!(
        "# rendezvous: torchrun's c10d store on the allocation's first node\nMASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\nMASTER_PORT=${{MASTER_PORT:-{PORT}}}\n\n"
    ));
    s.push_str(&args_block(entry));
    s.push_str(&format!(
        "srun --kill-on-bad-exit=1 torchrun --nnodes \"$SLURM_NNODES\" --nproc-per-node {per_node} \\\n    --rdzv-id \"$SLURM_JOB_ID\" --rdzv-backend c10d --rdzv-endpoint \"$MASTER_ADDR:$MASTER_PORT\" \\\n    {} \"${{ARGS[@]}}\" \"${{RUN[@]}}\"\n",
        entry.program.join(" ")
    ));
    s
}

/// The comment block that says what the files are for.
fn header(view: &PlanView, framework: Framework, entry: &Entry) -> String {
    let mut s = String::from("#!/usr/bin/env bash\n");
    s.push_str(&format!(
        "# autopp launch --framework {framework}: {} on {} x {} ({} node{} x {})\n",
        view.model.name,
        view.gpus,
        view.gpu,
        view.nodes(),
        if view.nodes() == 1 { "" } else { "s" },
        view.gpus_on_each_node()
    ));
    let recompute = match &view.recompute {
        super::RecomputePlan::Uniform(r) => r.to_string(),
        super::RecomputePlan::Partial { base } => format!("{base} + partial"),
    };
    s.push_str(&format!(
        "# tp {} · pp {} · dp {} · cp {} · {} stage{} per rank · {} · {} micro-batches of {} · global batch {} · recompute {} · ZeRO {}\n",
        view.tp,
        view.pp,
        view.dp,
        view.cp,
        view.virtual_stages,
        if view.virtual_stages == 1 { "" } else { "s" },
        view.schedule,
        view.num_microbatches,
        view.micro_batch_size,
        view.global_batch_size,
        recompute,
        view.zero_stage
    ));
    for note in &entry.notes {
        s.push_str(&format!("# {note}\n"));
    }
    s
}

/// The environment variables set on purpose, each with why.
fn env_block(entry: &Entry) -> String {
    let mut s = String::new();
    for (name, value, why) in &entry.env {
        // values are the emitter's own shell words (they may expand $PLAN_DIR)
        s.push_str(&format!("# {why}\nexport {name}=\"{value}\"\n"));
    }
    if !entry.env.is_empty() {
        s.push('\n');
    }
    s
}

/// `ARGS=( … )` (the plan's arguments, files found in `PLAN_DIR`) and `RUN` (what the plan does
/// not decide, overridable through `RUN_ARGS`).
fn args_block(entry: &Entry) -> String {
    let mut s = String::from("# the plan's arguments\nARGS=(\n");
    let words: Vec<String> = entry
        .args
        .iter()
        .map(|a| {
            if entry.files.iter().any(|(name, _)| name == a) {
                format!("\"$PLAN_DIR/{a}\"")
            } else {
                quote(a)
            }
        })
        .collect();
    for line in arg_lines(&words) {
        s.push_str(&format!("  {line}\n"));
    }
    s.push_str(")\n");
    let run: Vec<String> = entry.run_args.iter().map(|a| quote(a)).collect();
    s.push_str(&format!(
        "# what the plan does not decide (data, tokenizer, steps): set RUN_ARGS to replace it\nread -r -a RUN <<< \"${{RUN_ARGS:-{}}}\"\n\n",
        run.join(" ")
    ));
    s
}

/// Arguments grouped one flag (with its values) per line; a flag with long values gets one
/// value per line.
pub(super) fn arg_lines(words: &[String]) -> Vec<String> {
    let mut groups: Vec<Vec<&String>> = Vec::new();
    for w in words {
        match groups.last_mut() {
            Some(g) if !w.starts_with("--") && !w.contains(':') => g.push(w),
            _ => groups.push(vec![w]),
        }
    }
    let mut lines = Vec::new();
    for g in groups {
        let joined = g.iter().map(|w| w.as_str()).collect::<Vec<_>>().join(" ");
        if joined.len() <= 96 || g.len() < 3 {
            lines.push(joined);
        } else {
            lines.push(g[0].to_string());
            lines.extend(g[1..].iter().map(|w| format!("  {w}")));
        }
    }
    lines
}

/// `word` as one shell word: as is when it holds only safe characters, else single-quoted.
pub(super) fn quote(word: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "_-./:=,+@%".contains(c);
    if !word.is_empty() && word.chars().all(safe) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_words() {
        assert_eq!(quote("--bf16"), "--bf16");
        assert_eq!(quote("Et*3|t*4L"), "'Et*3|t*4L'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote(""), "''");
        let words: Vec<String> = ["--a", "1", "--b", "--c", "x", "y"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(arg_lines(&words), ["--a 1", "--b", "--c x y"]);
    }
}
