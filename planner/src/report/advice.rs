//! `estimate`'s advice in words: the defaults it used, its gap to the best plan and the
//! cheapest fix.

use std::fmt::Write;

use autopp_models::units::secs;

use crate::advice::{Advice, FIX_RECOVERS, MAX_FIX_CHANGES, SAME_AS_BEST};

/// `defaults used: …` for the settings `estimate` chose itself (`used`, in words), or nothing.
pub fn defaults_line(used: &[String]) -> String {
    if used.is_empty() {
        return String::new();
    }
    format!(
        "  defaults used: {} (as plan's; flags override)\n",
        used.join(", ")
    )
}

/// The advice on a configuration whose iteration takes `own_s` seconds, a block that opens
/// with a blank line.
pub fn advice_text(a: &Advice, own_s: f64) -> String {
    let mut o = String::from("\nadvice\n");
    let Some(gap) = &a.gap else {
        o += "  best plan     the search found no plan that fits, so there is nothing to compare with\n";
        return o;
    };
    let b = &gap.best;
    let runs = match b.runs_on.is_empty() {
        true => "none".to_string(),
        false => b
            .runs_on
            .iter()
            .map(|f| f.to_string())
            .collect::<Vec<_>>()
            .join(", "),
    };
    let _ = writeln!(
        o,
        "  best plan     {} · {} (runs on {runs})",
        b.label,
        secs(b.iteration_time_s)
    );
    if !gap.fits {
        let _ = writeln!(
            o,
            "  gap           this configuration does not fit in memory; the best plan does"
        );
    } else if gap.slower_by <= SAME_AS_BEST {
        let _ = writeln!(
            o,
            "  gap           none: this configuration ({}) is as fast as the best plan{}",
            secs(own_s),
            if gap.slower_by < -SAME_AS_BEST {
                " or faster (the search keeps a memory margin free)"
            } else {
                ""
            }
        );
        return o;
    } else {
        let _ = writeln!(
            o,
            "  gap           this configuration ({}) is {:.0}% slower; the best plan is {:.0}% faster",
            secs(own_s),
            100.0 * gap.slower_by,
            100.0 * (1.0 - b.iteration_time_s / own_s)
        );
    }
    match &a.fix {
        Some(f) => {
            let gain = match gap.fits {
                true => format!("{:.0}% of the gap", 100.0 * f.recovered),
                false => format!(
                    "fits, {:.0}% slower than the best plan",
                    100.0 * (1.0 / f.recovered - 1.0)
                ),
            };
            let _ = writeln!(
                o,
                "  fix           {} → {}, {gain}{}",
                f.changes.join(" + "),
                secs(f.iteration_time_s),
                if f.enough {
                    String::new()
                } else {
                    format!(
                        " (no change of up to {MAX_FIX_CHANGES} settings recovers {:.0}%; take the best plan)",
                        100.0 * FIX_RECOVERS
                    )
                }
            );
        }
        None => {
            let _ = writeln!(o, "  fix           no change of up to {MAX_FIX_CHANGES} settings helps; take the best plan");
        }
    }
    o
}
