//! `autopp schedule`: generate, check, simulate and draw a pipeline schedule.

use anyhow::{bail, Context, Result};
use autopp_schedule::{
    self as schedule, check, generate, report, resolve_group_size, simulate, ScheduleKind,
    ScheduleSpec, SimCosts, UniformCosts,
};
use clap::Args;

use super::common::write_atomic;

/// Generate a pipeline schedule, check it, simulate it with uniform stage costs and draw it.
///
/// Example: autopp schedule interleaved-1f1b --pp 4 --microbatches 8 --virtual 2 --svg s.svg
#[derive(Args, Debug)]
pub struct ScheduleArgs {
    /// Schedule: gpipe, 1f1b, interleaved-1f1b, looped-bfs, zb-h1, zb-h2, zb-v, dualpipe-v,
    /// interleaved-zb.
    #[arg(value_name = "KIND", required_unless_present = "plan")]
    pub kind: Option<ScheduleKind>,
    /// Pipeline ranks.
    #[arg(long, value_name = "P", required_unless_present = "plan")]
    pub pp: Option<usize>,
    /// Micro-batches per iteration.
    #[arg(long, value_name = "M", required_unless_present = "plan")]
    pub microbatches: Option<usize>,
    /// A plan file from `autopp plan --out`: its schedule, simulated with the cost model's
    /// per-stage times in seconds (replaces KIND, --pp, --microbatches, --virtual,
    /// --group-size, --costs and --comm).
    #[arg(long, value_name = "FILE", conflicts_with_all = [
        "kind", "pp", "microbatches", "virtual_stages", "group_size", "costs", "comm",
    ])]
    pub plan: Option<String>,
    /// Stages per rank (interleaved-1f1b, looped-bfs, interleaved-zb; zb-v and dualpipe-v take
    /// exactly 2) [default: 2 for zb-v and dualpipe-v, 1 otherwise].
    #[arg(long = "virtual", value_name = "V")]
    pub virtual_stages: Option<usize>,
    /// Micro-batch group size of interleaved-1f1b: p <= G <= m, m a multiple of G
    /// [default: pp, or PyTorch's regrouping m / floor(m/p) when pp does not divide m].
    #[arg(long, value_name = "G")]
    pub group_size: Option<usize>,
    /// Per-stage durations of forward, backward, backward-input and backward-weight, in any
    /// one time unit.
    #[arg(
        long,
        default_value = "F=1,B=2,I=1,W=1",
        value_name = "F=..,B=..,I=..,W=.."
    )]
    pub costs: String,
    /// Time to send between two ranks, in the same unit.
    #[arg(long, default_value_t = 0.0, value_name = "C")]
    pub comm: f64,
    /// Print one JSON object instead of the timeline.
    #[arg(long)]
    pub json: bool,
    /// Write an SVG Gantt chart to FILE.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<String>,
    /// Draw only steps A..B of each rank in the SVG (0-based, B excluded), for long runs.
    #[arg(long, value_name = "A..B", requires = "svg")]
    pub steps: Option<String>,
    /// Write a Chrome trace (opens in Perfetto) to FILE: with --plan times are the plan's
    /// seconds; otherwise one cost unit is drawn as one millisecond.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<String>,
}

/// A schedule and its simulation, with how to describe them.
struct Simulated {
    s: schedule::Schedule,
    r: schedule::SimResult,
    title: String,
    /// The line under the title that says where the costs come from.
    costs_line: String,
    /// Microseconds per cost unit (for the Chrome trace).
    us_per_unit: f64,
}

/// Runs `autopp schedule`.
pub fn run(args: &ScheduleArgs) -> Result<()> {
    let sim = match &args.plan {
        Some(path) => {
            let (s, r, title) = autopp_planner::PlanFile::load(path)?.simulated()?;
            let costs_line = "costs per stage from the cost model, in seconds".to_string();
            Simulated {
                s,
                r,
                title,
                costs_line,
                us_per_unit: 1e6,
            }
        }
        None => from_flags(args)?,
    };
    let Simulated {
        s,
        r,
        title,
        costs_line,
        us_per_unit,
    } = sim;
    if let Some(path) = &args.svg {
        let window = match &args.steps {
            Some(t) => schedule::svg::parse_steps(t)
                .and_then(|(a, b)| schedule::svg::step_window(&r, a, b))
                .with_context(|| format!("--steps: '{t}' selects no step: write A..B with A < B and A below the {} steps of the longest rank", r.timeline.iter().map(Vec::len).max().unwrap_or(0)))?,
            None => (0.0, r.makespan_s),
        };
        let svg = schedule::svg::gantt_window(&s, &r, &title, window);
        write_atomic(path, svg.as_bytes()).context("--svg")?;
    }
    if let Some(path) = &args.trace {
        write_atomic(
            path,
            schedule::trace::chrome_trace(&s, &r, us_per_unit).as_bytes(),
        )
        .context("--trace")?;
    }

    if args.json {
        println!("{}", serde_json::to_string(&report::Summary::new(&s, &r))?);
        return Ok(());
    }
    let mut out = report::text(&s, &r, &title, &costs_line);
    if let Some(path) = &args.svg {
        out.push_str(&format!("wrote SVG to {path}\n"));
    }
    if let Some(path) = &args.trace {
        out.push_str(&format!("wrote Chrome trace to {path}\n"));
    }
    print!("{out}");
    Ok(())
}

/// The schedule the flags describe, simulated with uniform costs.
fn from_flags(args: &ScheduleArgs) -> Result<Simulated> {
    let (Some(kind), Some(pp), Some(microbatches)) = (args.kind, args.pp, args.microbatches) else {
        bail!("KIND, --pp and --microbatches: give all three, or --plan FILE");
    };
    let spec = ScheduleSpec {
        kind,
        pp,
        virtual_stages: args.virtual_stages.unwrap_or(kind.default_virtual_stages()),
        num_microbatches: microbatches,
        group_size: args.group_size,
    };
    let group_size = resolve_group_size(&spec)?;
    let s = generate(&spec)?;
    check(&s).context("internal error: the generated schedule fails the checker")?;
    let c: UniformCosts = args.costs.parse().context("--costs")?;
    if !args.comm.is_finite() || args.comm < 0.0 {
        bail!("--comm must be a finite time >= 0 (got {})", args.comm);
    }
    let costs = SimCosts::uniform(s.num_stages(), c.f, c.b, c.i, c.w, args.comm);
    let r = simulate(&s, &costs)?;
    let title = format!(
        "{}{}",
        report::title(&s),
        group_size
            .map(|g| format!(" · micro-batch groups of {g}"))
            .unwrap_or_default(),
    );
    Ok(Simulated {
        s,
        r,
        title,
        costs_line: format!(
            "costs per stage: F={} B={} I={} W={}, comm {}",
            c.f, c.b, c.i, c.w, args.comm
        ),
        us_per_unit: 1e3,
    })
}
