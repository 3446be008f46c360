//! `autopp launch`: a plan file's launch files for Megatron-LM, torchtitan or DeepSpeed.

use anyhow::{anyhow, bail, Context, Result};
use autopp_planner::launch::{self, summary_text, write_dir};
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
        write_dir(&launch, dir, None).map_err(|e| anyhow!("--out: {e}"))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&launch)?);
        return Ok(());
    }
    print!("{}", summary_text(&launch, args.out.as_deref()));
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
    write_dir(&launch, dir, Some(plan)).map_err(|e| anyhow!("--out: {e}"))
}
