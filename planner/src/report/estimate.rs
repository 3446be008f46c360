//! `autopp estimate`'s report: the model and cluster, the configuration, the iteration time with
//! its band and breakdown, memory per rank and whether it fits.

use std::fmt::Write;

use autopp_hardware::AnalyticProfile;
use autopp_models::units::{gib, secs, thousands, wrap};
use autopp_models::{Model, SeqLenSource};

use crate::bands::uncertainty;
use crate::config::ParallelConfig;
use crate::estimate::Estimate;
use crate::plan::{Plan, PlanAndPrediction};

/// The human-readable report of `e`, the estimate of configuration `c` of `model` on
/// `profile`'s cluster; the batching line says where the sequence length comes from (`seq`).
pub fn estimate_text(
    model: &Model,
    seq: SeqLenSource,
    profile: &AnalyticProfile,
    c: &ParallelConfig,
    e: &Estimate,
) -> String {
    let mut o = header(model, profile, &e.result.plan);
    configuration(&mut o, model, seq, c, &e.result.plan);
    time_lines(&mut o, &e.result, profile.calibration.as_deref());
    memory_table(&mut o, model, e);
    fit_lines(&mut o, &e.result);
    o
}

/// The model and the cluster, then a blank line.
fn header(model: &Model, profile: &AnalyticProfile, plan: &Plan) -> String {
    let cl = &profile.cluster;
    format!(
        "{} ({:.1} B parameters) on {} × {} ({} node{} × {}, NIC {:.0} Gb/s per GPU)\n\n",
        model.name(),
        model.num_params() as f64 / 1e9,
        plan.gpus,
        plan.gpu,
        cl.nodes,
        if cl.nodes == 1 { "" } else { "s" },
        cl.gpus_per_node,
        cl.nic_bw_bytes_per_s * 8.0 / 1e9,
    )
}

/// Parallelism, batching and the memory-saving choices, then a blank line.
fn configuration(
    o: &mut String,
    model: &Model,
    seq: SeqLenSource,
    c: &ParallelConfig,
    plan: &Plan,
) {
    let d = &c.degrees;
    let _ = writeln!(
        o,
        "  parallelism   tp {} · pp {} · dp {} · cp {}{}{}",
        d.tp,
        d.pp,
        d.dp,
        d.cp,
        match (plan.ep, plan.etp) {
            (Some(ep), Some(etp)) => format!(" · ep {ep} · etp {etp}"),
            _ => String::new(),
        },
        schedule_text(plan)
    );
    let tokens = c.global_batch_size * model.seq_length();
    let _ = writeln!(
        o,
        "  batching      {} micro-batch{} of {} per replica → global batch {} ({} tokens of {} per sequence, from {})",
        plan.num_microbatches,
        if plan.num_microbatches == 1 { "" } else { "es" },
        c.micro_batch_size,
        c.global_batch_size,
        thousands(tokens as f64),
        thousands(model.seq_length() as f64),
        seq.describe()
    );
    let _ = writeln!(
        o,
        "  memory        recompute {} · sequence parallel {} · ZeRO {} · {}{}\n",
        plan.recompute_line(),
        if c.sequence_parallel { "on" } else { "off" },
        c.zero_stage,
        c.settings.precision,
        if c.settings.flash_attention {
            " · flash attention"
        } else {
            ""
        }
    );
}

/// The iteration time with its uncertainty and breakdown, and the throughput, then a blank
/// line. `calibration` names the user's calibration when one replaced the shipped knobs.
fn time_lines(o: &mut String, result: &PlanAndPrediction, calibration: Option<&str>) {
    let pred = &result.predicted;
    let t = pred.iteration_time_s;
    let b = &pred.breakdown_s;
    let _ = writeln!(o, "  iteration     {}", secs(t));
    if let Some(band) = &uncertainty(&result.plan.gpu).time {
        let _ = writeln!(o, "    uncertainty {band}");
    }
    if let Some(c) = calibration {
        let _ = writeln!(
            o,
            "    knobs       {c} (the band above is the shipped calibration's)"
        );
    }
    let moe = result.plan.ep.is_some();
    let pipelined = result.plan.degrees.pp > 1;
    for (name, v) in [
        ("compute", b.compute),
        ("bubble", b.bubble),
        ("tp comm", b.tp_comm),
        ("ep comm", b.ep_comm),
        ("pp comm", b.pp_comm),
        ("dp comm", b.dp_comm),
        ("optimizer", b.optimizer),
    ] {
        if (name == "ep comm" && !moe) || (matches!(name, "bubble" | "pp comm") && !pipelined) {
            continue;
        }
        let share = if v.abs() < 5e-8 { 0.0 } else { 100.0 * v / t };
        let _ = writeln!(o, "    {name:<11} {:>10}  {share:>5.1}%", secs(v));
        if name == "ep comm" && b.ep_comm_hidden > 0.0 {
            let hidden = secs(b.ep_comm_hidden);
            let _ = writeln!(o, "      + {hidden} hidden behind other micro-batches' compute (--overlap-moe-expert-parallel-comm)");
        }
    }
    let _ = writeln!(
        o,
        "  throughput    {} tokens/s · {:.1} TFLOP/s per GPU · MFU {:.1}%",
        thousands(pred.tokens_per_s),
        pred.tflops_per_gpu,
        100.0 * pred.mfu,
    );
    if pipelined {
        let _ = writeln!(
            o,
            "  pipeline      bubble {:.1}% of the iteration (the busiest rank's idle) · stage imbalance {:.1}% (the lighter ranks' extra idle)",
            100.0 * b.bubble / t.max(f64::MIN_POSITIVE),
            100.0 * pred.stage_imbalance
        );
    }
    o.push('\n');
}

/// `    schedule 1f1b, 1 stage per rank` for a pipeline; nothing when pp is 1.
fn schedule_text(plan: &Plan) -> String {
    let (pp, v) = (plan.degrees.pp, plan.degrees.virtual_stages);
    if pp <= 1 {
        return String::new();
    }
    format!(
        "    schedule {}, {v} stage{} per rank",
        plan.schedule,
        if v == 1 { "" } else { "s" }
    )
}

/// Memory per GPU by kind, one line per rank (the first four, the last three and the fullest
/// when there are more than 16), then a blank line.
fn memory_table(o: &mut String, model: &Model, e: &Estimate) {
    let plan = &e.result.plan;
    // a transformer's layer list is the embedding, the layers and the head: ranges count the
    // transformer layers only
    let last_entry = matches!(model, Model::Transformer(_))
        .then(|| {
            plan.ranks
                .iter()
                .flat_map(|r| &r.stages)
                .map(|s| s[1])
                .max()
        })
        .flatten();
    let _ = writeln!(
        o,
        "  memory per GPU, GiB                               weights  grads  optim  activ  transient  buffers  runtime  reserve   total"
    );
    let pp = plan.ranks.len();
    let peak_rank = plan.peak_rank() as usize;
    let shown: Vec<usize> = if pp <= 16 {
        (0..pp).collect()
    } else {
        let mut v: Vec<usize> = (0..4).chain(pp - 3..pp).collect();
        if !v.contains(&peak_rank) {
            v.push(peak_rank);
            v.sort_unstable();
        }
        v
    };
    let mut last = None;
    for r in shown {
        if last.is_some_and(|l| r != l + 1) {
            let _ = writeln!(o, "    …");
        }
        last = Some(r);
        let m = &e.memory[r];
        let layers = match last_entry {
            Some(last) => plan.ranks[r].transformer_layers_text(last),
            None => plan.ranks[r].stages_text(),
        };
        let _ = writeln!(
            o,
            "    rank {r:<3} {layers:<38} {:>7} {:>6} {:>6} {:>6} {:>10} {:>8} {:>8} {:>8} {:>7}",
            gib(m.weights_bytes),
            gib(m.grads_bytes),
            gib(m.optimizer_bytes),
            gib(m.activations_bytes),
            gib(m.transient_bytes),
            gib(m.buffers_bytes),
            gib(m.context_bytes + m.fragmentation_bytes),
            gib(m.reserve_bytes),
            gib(m.total_bytes()),
        );
    }
    for line in wrap(MEMORY_LEGEND, 100) {
        let _ = writeln!(o, "    {line}");
    }
    let _ = writeln!(o);
}

/// What the memory columns hold, printed under the table.
const MEMORY_LEGEND: &str = "weights, grads, optim: 16-bit weights, fp32 gradients, fp32 master weights and Adam moments (each sharded by ZeRO) · activ: activations of the micro-batches in flight at the peak · transient: the backward's working set · buffers: pipeline sends and NCCL workspaces · runtime: CUDA context, NCCL, framework buffers and allocator fragmentation · reserve: headroom kept free (--memory-reserve-gib)";

/// Whether the plan fits, with the memory's uncertainty.
fn fit_lines(o: &mut String, result: &PlanAndPrediction) {
    let pred = &result.predicted;
    let peak_rank = result.plan.peak_rank();
    if pred.fits {
        let _ = writeln!(
            o,
            "  FITS: peak {} GiB of {} GiB per GPU (rank {peak_rank})",
            gib(pred.peak_memory_bytes),
            gib(pred.memory_capacity_bytes)
        );
    } else {
        let _ = writeln!(
            o,
            "  DOES NOT FIT (rank {peak_rank} needs {} GiB of {} GiB)",
            gib(pred.peak_memory_bytes),
            gib(pred.memory_capacity_bytes)
        );
    }
    if let Some(band) = &uncertainty(&result.plan.gpu).memory {
        let _ = writeln!(o, "    uncertainty {band}");
    }
}
