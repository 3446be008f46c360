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

    /// The rank's stages as transformer layer ranges (0-based, the embedding and the head not
    /// counted), with the embedding and the head marked: `embedding + layers 0–19`,
    /// `layers 60–79 + head`, `embedding + layers 0–4,…,60–64 (4 stages)`. `last` is the
    /// layer list's last entry (the head); entry 0 is the embedding.
    pub fn transformer_layers_text(&self, last: usize) -> String {
        let one = |&[a, b]: &[usize; 2]| -> Option<String> {
            let (a, b) = (a.max(1) - 1, b.min(last.saturating_sub(1)));
            if b == 0 || a + 1 > b {
                return None;
            }
            Some(if a + 1 == b {
                format!("{a}")
            } else {
                format!("{a}–{}", b - 1)
            })
        };
        let ranges: Vec<String> = self.stages.iter().filter_map(one).collect();
        let singles = self
            .stages
            .iter()
            .filter_map(one)
            .filter(|r| !r.contains('–'));
        let word = if ranges.len() == 1 && singles.count() == 1 {
            "layer"
        } else {
            "layers"
        };
        let body = match ranges.len() {
            0 => String::new(),
            1..=3 => format!("{word} {}", ranges.join(",")),
            n => format!(
                "{word} {},…,{} ({} stages)",
                ranges[0],
                ranges[n - 1],
                self.stages.len()
            ),
        };
        let embedding = self.stages.iter().any(|s| s[0] == 0);
        let head = self.stages.iter().any(|s| s[1] == last);
        let mut parts = Vec::new();
        if embedding {
            parts.push("embedding".to_string());
        }
        if !body.is_empty() {
            parts.push(body);
        }
        if head {
            parts.push("head".to_string());
        }
        parts.join(" + ")
    }
}

#[cfg(test)]
mod layer_text_tests {
    use crate::plan::{RankPlan, RankRecompute};

    fn rank(stages: Vec<[usize; 2]>) -> RankPlan {
        RankPlan {
            rank: 0,
            stages,
            recompute: RankRecompute::None,
            recompute_num_layers: 0,
            recompute_num_layers_per_stage: Vec::new(),
            memory_bytes: 0,
            compute_time_s: 0.0,
        }
    }

    /// 80 transformer layers: entries 1–80, the embedding 0 and the head 81.
    #[test]
    fn embedding_and_head_are_marked_and_layers_count_from_zero() {
        assert_eq!(
            rank(vec![[0, 20]]).transformer_layers_text(81),
            "embedding + layers 0–19"
        );
        assert_eq!(
            rank(vec![[61, 81]]).transformer_layers_text(81),
            "layers 60–79 + head"
        );
        assert_eq!(
            rank(vec![[21, 41]]).transformer_layers_text(81),
            "layers 20–40"
        );
        assert_eq!(rank(vec![[5, 5]]).transformer_layers_text(81), "layer 4");
        assert_eq!(
            rank(vec![[0, 5], [21, 25], [41, 45], [61, 65]]).transformer_layers_text(81),
            "embedding + layers 0–4,…,60–64 (4 stages)"
        );
        assert_eq!(
            rank(vec![[0, 0], [81, 81]]).transformer_layers_text(81),
            "embedding + head"
        );
    }
}
