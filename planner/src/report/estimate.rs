//! `autopp estimate`'s report: the model and cluster, the configuration, the iteration time with
//! its band and breakdown, memory per rank and whether it fits.

use std::fmt::Write;

use autopp_hardware::AnalyticProfile;
use autopp_models::units::{gib, secs, thousands};
use autopp_models::Model;

use crate::bands::uncertainty;
use crate::config::ParallelConfig;
use crate::estimate::Estimate;
use crate::plan::{Plan, PlanAndPrediction};

/// The human-readable report of `e`, the estimate of configuration `c` of `model` on
/// `profile`'s cluster.
pub fn estimate_text(
    model: &Model,
    profile: &AnalyticProfile,
    c: &ParallelConfig,
    e: &Estimate,
) -> String {
    let mut o = header(model, profile, &e.result.plan);
    configuration(&mut o, model, c, &e.result.plan);
    time_lines(&mut o, &e.result, profile.calibration.as_deref());
    memory_table(&mut o, e);
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
fn configuration(o: &mut String, model: &Model, c: &ParallelConfig, plan: &Plan) {
    let d = &c.degrees;
    let _ = writeln!(
        o,
        "  parallelism   tp {} · pp {} · dp {} · cp {}{}    schedule {}, {} stage{} per rank",
        d.tp,
        d.pp,
        d.dp,
        d.cp,
        match (plan.ep, plan.etp) {
            (Some(ep), Some(etp)) => format!(" · ep {ep} · etp {etp}"),
            _ => String::new(),
        },
        plan.schedule,
        d.virtual_stages,
        if d.virtual_stages == 1 { "" } else { "s" }
    );
    let tokens = c.global_batch_size * model.seq_length();
    let _ = writeln!(
        o,
        "  batching      {} micro-batch{} of {} per replica → global batch {} ({} tokens)",
        plan.num_microbatches,
        if plan.num_microbatches == 1 { "" } else { "es" },
        c.micro_batch_size,
        c.global_batch_size,
        thousands(tokens as f64)
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
    for (name, v) in [
        ("compute", b.compute),
        ("bubble", b.bubble),
        ("tp comm", b.tp_comm),
        ("ep comm", b.ep_comm),
        ("pp comm", b.pp_comm),
        ("dp comm", b.dp_comm),
        ("optimizer", b.optimizer),
    ] {
        if name == "ep comm" && !moe {
            continue;
        }
        let share = if v.abs() < 5e-8 { 0.0 } else { 100.0 * v / t };
        let _ = writeln!(o, "    {name:<11} {:>10}  {share:>5.1}%", secs(v));
    }
    let _ = writeln!(
        o,
        "  throughput    {} tokens/s · {:.1} TFLOP/s per GPU · MFU {:.1}% · bubble {:.1}%\n",
        thousands(pred.tokens_per_s),
        pred.tflops_per_gpu,
        100.0 * pred.mfu,
        100.0 * pred.bubble_fraction
    );
}

/// Memory per GPU by kind, one line per rank (the first four, the last three and the fullest
/// when there are more than 16), then a blank line.
fn memory_table(o: &mut String, e: &Estimate) {
    let plan = &e.result.plan;
    let _ = writeln!(
        o,
        "  memory per GPU, GiB                 weights  grads  optim  activ  transient  buffers  runtime  reserve   total"
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
        let layers = plan.ranks[r].stages_text();
        let _ = writeln!(
            o,
            "    rank {r:<3} {layers:<24} {:>7} {:>6} {:>6} {:>6} {:>10} {:>8} {:>8} {:>8} {:>7}",
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
    let _ = writeln!(o);
}

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
