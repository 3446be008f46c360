//! How the layer list is cut into stages: Megatron's default even split, explicit splits, and
//! their checks.

use autopp_models::LayerKind;

use crate::SpecField;

/// Why a split cannot be made or used. [`SplitError::field`] says which input is at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SplitError {
    /// No stages were asked for.
    #[error("must be at least 1")]
    NoStages,
    /// More stages than layers to put in them.
    #[error(
        "{stages} stages (pp · virtual stages) but the model has only {layers} {what}: use fewer \
         pipeline ranks or virtual stages"
    )]
    TooManyStages {
        /// `pp · v`.
        stages: usize,
        /// Layers between the embedding and the head.
        layers: usize,
        /// What those layers are called.
        what: &'static str,
    },
    /// An explicit split with the wrong number of stages.
    #[error(
        "gives {given} stages but pp · virtual stages = {stages}: give one layer count per stage"
    )]
    WrongStageCount {
        /// Counts given.
        given: usize,
        /// `pp · v`.
        stages: usize,
    },
    /// An explicit split with an empty stage.
    #[error("stage {stage} has no layers: every stage needs at least one")]
    EmptyStage {
        /// The empty stage.
        stage: usize,
    },
    /// An explicit split whose counts do not cover the layer list.
    #[error(
        "counts sum to {total} but the model has {entries} layer entries (embedding and head \
         count as one each)"
    )]
    WrongTotal {
        /// Sum of the counts.
        total: usize,
        /// Length of the layer list.
        entries: usize,
    },
}

impl SplitError {
    /// The input at fault.
    pub fn field(&self) -> SpecField {
        match self {
            SplitError::NoStages | SplitError::TooManyStages { .. } => SpecField::Pp,
            _ => SpecField::Split,
        }
    }
}

/// Megatron's default split: the transformer layers evenly over `num_stages` stages, the
/// embedding on the first stage, the head on the last. Returns the number of layer-list entries
/// per stage.
///
/// When the layer count does not divide evenly (Megatron rejects that case) the `L mod S`
/// leftover layers go one each to stages 1, 2, … (skipping the first stage, which holds the
/// embedding, and the last, which holds the head, while others remain). A model without
/// embedding/head entries (a layer list) is split evenly the same way.
pub fn default_split(kinds: &[LayerKind], num_stages: usize) -> Result<Vec<usize>, SplitError> {
    let has_embedding = kinds.first() == Some(&LayerKind::Embedding);
    let has_head = kinds.len() > 1 && kinds.last() == Some(&LayerKind::Head);
    let body = kinds.len() - usize::from(has_embedding) - usize::from(has_head);
    if num_stages == 0 {
        return Err(SplitError::NoStages);
    }
    if body < num_stages {
        return Err(SplitError::TooManyStages {
            stages: num_stages,
            layers: body,
            what: if has_embedding {
                "transformer layers"
            } else {
                "layers"
            },
        });
    }
    let base = body / num_stages;
    let leftover = body % num_stages;
    let mut counts = vec![base; num_stages];
    let order = (1..num_stages.saturating_sub(1))
        .chain(std::iter::once(0))
        .chain(std::iter::once(num_stages - 1));
    for stage in order.take(leftover) {
        counts[stage] += 1;
    }
    if has_embedding {
        counts[0] += 1;
    }
    if has_head {
        counts[num_stages - 1] += 1;
    }
    Ok(counts)
}

/// Checks an explicit split: one positive count per stage, summing to the layer-list length.
pub fn check_split(
    counts: &[usize],
    num_entries: usize,
    num_stages: usize,
) -> Result<(), SplitError> {
    if counts.len() != num_stages {
        return Err(SplitError::WrongStageCount {
            given: counts.len(),
            stages: num_stages,
        });
    }
    if let Some(stage) = counts.iter().position(|&c| c == 0) {
        return Err(SplitError::EmptyStage { stage });
    }
    let total: usize = counts.iter().sum();
    if total != num_entries {
        return Err(SplitError::WrongTotal {
            total,
            entries: num_entries,
        });
    }
    Ok(())
}

/// Every cut of `n` layer-list entries into `s` non-empty contiguous stages (there are
/// `C(n−1, s−1)` of them: use on small cases only).
pub fn all_splits(n: usize, s: usize) -> Vec<Vec<usize>> {
    if s == 0 || n < s {
        return Vec::new();
    }
    if s == 1 {
        return vec![vec![n]];
    }
    let mut out = Vec::new();
    for first in 1..=(n - (s - 1)) {
        for mut rest in all_splits(n - first, s - 1) {
            rest.insert(0, first);
            out.push(rest);
        }
    }
    out
}

/// Inclusive `[first, last]` layer indices of each stage for per-stage counts.
pub fn stage_ranges(counts: &[usize]) -> Vec<[usize; 2]> {
    let mut first = 0;
    counts
        .iter()
        .map(|&c| {
            let range = [first, first + c - 1];
            first += c;
            range
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transformer(layers: usize) -> Vec<LayerKind> {
        let mut v = vec![LayerKind::Embedding];
        v.extend(std::iter::repeat_n(LayerKind::Transformer, layers));
        v.push(LayerKind::Head);
        v
    }

    #[test]
    fn megatron_even_split() {
        assert_eq!(
            default_split(&transformer(96), 16).unwrap(),
            [vec![7], vec![6; 14], vec![7]].concat()
        );
        assert_eq!(
            stage_ranges(&default_split(&transformer(4), 2).unwrap()),
            vec![[0, 2], [3, 5]]
        );
    }

    #[test]
    fn leftover_layers_go_to_middle_stages() {
        assert_eq!(
            default_split(&transformer(10), 4).unwrap(),
            vec![3, 3, 3, 3]
        );
        assert_eq!(
            default_split(&transformer(11), 4).unwrap(),
            vec![4, 3, 3, 3]
        );
    }

    #[test]
    fn too_many_stages() {
        let err = default_split(&transformer(4), 8).unwrap_err().to_string();
        let e = default_split(&transformer(4), 8).unwrap_err();
        assert_eq!(e.field(), SpecField::Pp);
        assert!(err.contains("4 transformer layers"), "{err}");
    }

    #[test]
    fn explicit_split_checks() {
        assert!(check_split(&[3, 3], 6, 2).is_ok());
        assert_eq!(
            check_split(&[3, 3], 6, 3).unwrap_err().field(),
            SpecField::Split
        );
        assert!(check_split(&[6, 0], 6, 2)
            .unwrap_err()
            .to_string()
            .contains("stage 1"));
        assert!(check_split(&[3, 2], 6, 2)
            .unwrap_err()
            .to_string()
            .contains("sum to 5"));
    }
}
