//! Plans in words: the recompute and the stages as `autopp estimate`, `autopp plan` and
//! [`crate::search::explain`] print them.

use autopp_models::Recompute;

use crate::plan::{Plan, RankPlan, RankRecompute};

impl Plan {
    /// The recompute column of the alternatives table: the plan's mode, `+part` when some
    /// ranks recompute some of their layers fully (`none+part`).
    pub fn recompute_label(&self) -> String {
        if self.has_partial_recompute() {
            format!("{}+part", self.recompute)
        } else {
            self.recompute.to_string()
        }
    }

    /// The recompute line of `estimate`: the mode, or for partial recompute the fully
    /// recomputed layers per rank and the mode of the others (`full on 3/2/1/0 layers of ranks
    /// 0–3, the others selective`).
    pub fn recompute_line(&self) -> String {
        if !self.has_partial_recompute() {
            return self
                .ranks
                .first()
                .map_or(self.recompute.to_string(), |r| r.recompute.to_string());
        }
        let per_rank: Vec<String> = self
            .ranks
            .iter()
            .map(|r| r.recompute_num_layers.to_string())
            .collect();
        format!(
            "full on {} layers of ranks 0–{}, the others {}",
            per_rank.join("/"),
            self.ranks.len() - 1,
            self.recompute
        )
    }

    /// The plan's recompute in words: `recompute selective`, or for partial recompute
    /// `full recompute of 3, 2 and 1 layers on ranks 0, 1, 2, the other layers not recomputed`.
    pub fn recompute_words(&self) -> String {
        let partial: Vec<&RankPlan> = self
            .ranks
            .iter()
            .filter(|r| {
                r.recompute == RankRecompute::Partial
                    || (r.recompute == RankRecompute::Full && self.recompute != Recompute::Full)
            })
            .collect();
        if partial.is_empty() {
            return format!("recompute {}", self.recompute);
        }
        let others = match self.recompute {
            Recompute::None => String::from("the other layers not recomputed"),
            Recompute::Selective => String::from("the other layers selectively recomputed"),
            Recompute::Full => String::from("the other layers full"),
        };
        let first = partial[0].recompute_num_layers;
        if partial.len() == self.ranks.len()
            && partial.iter().all(|r| r.recompute_num_layers == first)
        {
            let layers = if first == 1 { "layer" } else { "layers" };
            return format!("full recompute of {first} {layers} on every rank, {others}");
        }
        let counts: Vec<String> = partial
            .iter()
            .map(|r| r.recompute_num_layers.to_string())
            .collect();
        let ranks: Vec<String> = partial.iter().map(|r| r.rank.to_string()).collect();
        let (counts, ranks) = if counts.len() == 1 {
            (counts.join(""), format!("rank {}", ranks.join("")))
        } else {
            let last = counts.len() - 1;
            (
                format!("{} and {}", counts[..last].join(", "), counts[last]),
                format!("ranks {}", ranks.join(", ")),
            )
        };
        let layers = if counts == "1" { "layer" } else { "layers" };
        format!("full recompute of {counts} {layers} on {ranks}, {others}")
    }
}

impl RankPlan {
    /// The rank's stages as layer ranges, shortened when there are many: `0–6`, `3,19,35`,
    /// `0–1,17,…,81 (6 stages)`.
    pub fn stages_text(&self) -> String {
        let one = |&[a, b]: &[usize; 2]| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}–{b}")
            }
        };
        let stages = &self.stages;
        if stages.len() <= 3 {
            return stages.iter().map(one).collect::<Vec<_>>().join(",");
        }
        format!(
            "{},{},…,{} ({} stages)",
            one(&stages[0]),
            one(&stages[1]),
            one(&stages[stages.len() - 1]),
            stages.len()
        )
    }
}
