//! `autopp compare`: two plan files evaluated with the same cost model, side by side, with the
//! difference of every term of the iteration time and of the peak memory per GPU.

use std::fmt::Write;

use autopp_models::units::{gib, secs};
use serde::Serialize;

use crate::advice::label;
use crate::config::PlanError;
use crate::estimate::evaluate;
use crate::plan::Predicted;
use crate::planfile::PlanFile;
use crate::profile::cost_profile;

/// One plan of a comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Side {
    /// Where it came from (the plan file's path).
    pub name: String,
    /// Its model, GPU count and kind, in words (`llama2-13b on 32 × a100-80g`).
    pub setup: String,
    /// Its configuration in one line.
    pub label: String,
    /// Its prediction, re-evaluated now.
    pub predicted: Predicted,
}

/// Two plans and how they differ.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// The first plan.
    pub a: Side,
    /// The second plan.
    pub b: Side,
    /// Per term, `(name, a seconds, b seconds, b − a seconds)`, then the iteration time.
    pub terms_s: Vec<(String, f64, f64, f64)>,
    /// B's iteration time over A's, minus 1 (−0.2: B is 20% faster).
    pub b_over_a: f64,
}

/// Evaluates the plan file at `path` with the cost model of this build; errors reading it
/// name `tag` (`A.json`, `B.json`).
fn side(tag: &str, path: &str) -> Result<Side, PlanError> {
    let file = PlanFile::load(path).map_err(|e| match e {
        PlanError::Invalid { message, .. } => PlanError::invalid(tag, message),
        e => e,
    })?;
    let model = file.model()?;
    let config = file.config()?;
    let profile = cost_profile(
        file.cluster.clone(),
        config.settings.precision,
        None,
        &model,
    )?;
    let e = evaluate(&model, &profile, &config)?;
    let p = &e.result.plan;
    Ok(Side {
        name: path.to_string(),
        setup: format!("{} on {} × {}", p.model, p.gpus, p.gpu),
        label: label(&config),
        predicted: e.result.predicted,
    })
}

/// The plan files at `a` and `b`, compared.
pub fn compare_files(a: &str, b: &str) -> Result<Comparison, PlanError> {
    let (a, b) = (side("A.json", a)?, side("B.json", b)?);
    let (x, y) = (&a.predicted.breakdown_s, &b.predicted.breakdown_s);
    let mut terms = vec![
        ("compute", x.compute, y.compute),
        ("bubble", x.bubble, y.bubble),
        ("tp/cp comm", x.tp_comm, y.tp_comm),
        ("ep all-to-all", x.ep_comm, y.ep_comm),
        ("pp p2p", x.pp_comm, y.pp_comm),
        ("dp comm", x.dp_comm, y.dp_comm),
        ("optimizer", x.optimizer, y.optimizer),
    ];
    // the expert all-to-all only where one side has experts
    terms.retain(|t| t.0 != "ep all-to-all" || t.1 + t.2 > 0.0);
    let (ta, tb) = (a.predicted.iteration_time_s, b.predicted.iteration_time_s);
    terms.push(("iteration", ta, tb));
    Ok(Comparison {
        terms_s: terms
            .into_iter()
            .map(|(n, p, q)| (n.to_string(), p, q, q - p))
            .collect(),
        b_over_a: tb / ta - 1.0,
        a,
        b,
    })
}

fn signed_secs(t_s: f64) -> String {
    match t_s {
        t if t.abs() < 5e-8 => "0 s".to_string(),
        t if t < 0.0 => format!("−{}", secs(-t)),
        t => format!("+{}", secs(t)),
    }
}

/// The comparison as a table: the two configurations, every term with B − A, peak memory, and
/// which is faster by how much.
pub fn compare_text(c: &Comparison) -> String {
    let mut o = String::new();
    for (tag, s) in [("A", &c.a), ("B", &c.b)] {
        let _ = writeln!(o, "{tag}  {}: {}\n     {}", s.name, s.setup, s.label);
    }
    let _ = writeln!(o, "\n  {:<15} {:>12} {:>12} {:>12}", "", "A", "B", "B − A");
    for (name, a, b, d) in &c.terms_s {
        let _ = writeln!(
            o,
            "  {name:<15} {:>12} {:>12} {:>12}",
            secs(*a),
            secs(*b),
            signed_secs(*d)
        );
    }
    let (pa, pb) = (&c.a.predicted, &c.b.predicted);
    let (ma, mb) = (pa.peak_memory_bytes, pb.peak_memory_bytes);
    let dm = match mb >= ma {
        true => format!("+{}", gib(mb - ma)),
        false => format!("−{}", gib(ma - mb)),
    };
    let _ = writeln!(
        o,
        "  {:<15} {:>12} {:>12} {:>12}",
        "peak GiB/GPU",
        gib(ma),
        gib(mb),
        dm
    );
    let fits = |p: &Predicted| if p.fits { "yes" } else { "NO" };
    let _ = writeln!(o, "  {:<15} {:>12} {:>12}", "fits", fits(pa), fits(pb));
    let _ = writeln!(
        o,
        "  {:<15} {:>11.1}% {:>11.1}%",
        "MFU",
        100.0 * pa.mfu,
        100.0 * pb.mfu
    );
    let (ta, tb) = (pa.iteration_time_s, pb.iteration_time_s);
    o += &match c.b_over_a {
        r if r.abs() < 5e-4 => "\nA and B take the same time\n".to_string(),
        r if r < 0.0 => format!(
            "\nB is {:.1}% faster than A ({} less per iteration)\n",
            100.0 * (1.0 - tb / ta),
            secs(ta - tb)
        ),
        _ => format!(
            "\nA is {:.1}% faster than B ({} less per iteration)\n",
            100.0 * (1.0 - ta / tb),
            secs(tb - ta)
        ),
    };
    o
}
