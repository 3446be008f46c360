//! `autopp launch`: a plan file's launch files for Megatron-LM, torchtitan or DeepSpeed.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use autopp_planner::launch::{self, shell_lines, Launch};
use autopp_planner::{Framework, PlanFile, Stack};
use clap::Args;

/// Write the launch files of a plan: the training script's arguments, the framework's own
/// config files, a torchrun launch.sh and a Slurm sbatch.sh.
///
/// Example: autopp launch plan.json --framework megatron --out launch/
#[derive(Args, Debug)]
pub struct LaunchArgs {
    /// A plan file from `autopp plan --out`.
    #[arg(value_name = "PLAN")]
    pub plan: String,
    /// megatron, torchtitan or deepspeed [default: the framework the plan was made for].
    #[arg(long, value_name = "NAME")]
    pub framework: Option<Framework>,
    /// Write the files into this directory (created; a directory of earlier launch files is
    /// replaced), all of them or none.
    #[arg(long, value_name = "DIR")]
    pub out: Option<String>,
    /// Print one JSON object: framework, framework_version, args, files.
    #[arg(long)]
    pub json: bool,
}

/// Runs `autopp launch`.
pub fn run(args: &LaunchArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.plan)
        .with_context(|| format!("PLAN: cannot read '{}'", args.plan))?;
    let file = PlanFile::from_json(&text, &args.plan)
        .map_err(|e| anyhow!("{}", e.to_string().replacen("--plan", "PLAN", 1)))?;
    let framework = match args.framework {
        Some(f) => f,
        None if file.settings.framework != Framework::Any => file.settings.framework,
        None => bail!(
            "--framework: the plan was made for any framework; name one: megatron, torchtitan or deepspeed"
        ),
    };
    let launch = launch::emit(&file, framework)?;
    if let Some(dir) = &args.out {
        write_dir(&launch, dir, None)?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&launch)?);
        return Ok(());
    }
    print_summary(&launch, args.out.as_deref());
    Ok(())
}

/// `plan --emit FRAMEWORK`: the search made for FRAMEWORK's default stack unless
/// `--framework` names another.
pub fn plan_framework(stack: Stack, emit: Option<Framework>) -> Stack {
    match (stack, emit) {
        (Stack::Any, Some(f)) => f.default_stack(),
        _ => stack,
    }
}

/// `plan --emit FRAMEWORK --out DIR`: the plan file and its launch files in `dir`, all or none.
pub fn write_plan_and_launch(file: &PlanFile, framework: Framework, dir: &str) -> Result<()> {
    let launch = launch::emit(file, framework)?;
    let plan = serde_json::to_string_pretty(file)? + "\n";
    write_dir(&launch, dir, Some(plan))
}

/// Names a launch may write into its directory (a directory holding only these is replaced).
const OURS: [&str; 7] = [
    "launch.sh",
    "autopp_torchtitan.py",
    "sbatch.sh",
    "ds_config.json",
    "autopp_pipeline.py",
    "pipeline_schedule.csv",
    "plan.json",
];

/// Writes `launch`'s files (and `plan.json` when given) into `dir`: into a fresh sibling
/// directory first, then renamed into place, so `dir` ends with all of them or is untouched.
fn write_dir(launch: &Launch, dir: &str, plan: Option<String>) -> Result<()> {
    let target = PathBuf::from(dir);
    check_target(&target, dir)?;
    let parent = target
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or_else(|| Path::new("."));
    let name = target
        .file_name()
        .ok_or_else(|| anyhow!("--out: '{dir}' is not a directory path"))?;
    std::fs::create_dir_all(parent)
        .with_context(|| format!("--out: cannot create '{}'", parent.display()))?;
    let pid = std::process::id();
    let tmp = parent.join(format!(".{}.tmp{pid}", name.to_string_lossy()));
    let old = parent.join(format!(".{}.old{pid}", name.to_string_lossy()));
    // a plan.json beside earlier launch files is the plan, not an output: keep it
    let kept = target.join("plan.json");
    let plan = match plan {
        None if kept.is_file() => Some(
            std::fs::read_to_string(&kept)
                .with_context(|| format!("--out: cannot read '{}'", kept.display()))?,
        ),
        plan => plan,
    };
    let written = fill(&tmp, launch, plan).and_then(|()| {
        if target.exists() {
            std::fs::rename(&target, &old)?;
        }
        std::fs::rename(&tmp, &target).inspect_err(|_| {
            let _ = std::fs::rename(&old, &target);
        })
    });
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&tmp);
        bail!("--out: cannot write '{dir}': {e}");
    }
    let _ = std::fs::remove_dir_all(&old);
    Ok(())
}

/// `dir` may be new, empty, or hold only files an earlier launch wrote.
fn check_target(target: &Path, dir: &str) -> Result<()> {
    if !target.exists() {
        return Ok(());
    }
    if !target.is_dir() {
        bail!("--out: '{dir}' exists and is not a directory");
    }
    let entries =
        std::fs::read_dir(target).with_context(|| format!("--out: cannot read '{dir}'"))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("--out: cannot read '{dir}'"))?;
        let name = entry.file_name();
        if !OURS.iter().any(|o| name.to_str() == Some(*o)) {
            bail!(
                "--out: '{dir}' holds {} which autopp did not write; give a new or empty directory",
                name.to_string_lossy()
            );
        }
    }
    Ok(())
}

/// Writes every file into the new directory `tmp`; scripts are made executable.
fn fill(tmp: &Path, launch: &Launch, plan: Option<String>) -> std::io::Result<()> {
    std::fs::create_dir(tmp)?;
    let plan = plan.map(|text| ("plan.json".to_string(), text));
    for (name, text) in launch
        .files
        .iter()
        .map(|(n, t)| (n.clone(), t.clone()))
        .chain(plan)
    {
        let path = tmp.join(&name);
        std::fs::write(&path, text)?;
        #[cfg(unix)]
        if name.ends_with(".sh") {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        }
    }
    Ok(())
}

/// What was made, for a terminal.
fn print_summary(launch: &Launch, out: Option<&str>) {
    println!("{} ({})", launch.framework, launch.framework_version);
    println!("\narguments");
    for line in shell_lines(&launch.args) {
        println!("  {line}");
    }
    let names: Vec<&str> = launch.files.keys().map(String::as_str).collect();
    match out {
        Some(dir) => println!("\nwritten to {dir}: {}", names.join(", ")),
        None => println!("\nfiles: {} (write them with --out DIR)", names.join(", ")),
    }
}
