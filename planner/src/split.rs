//! How the layer list is cut into stages: Megatron's default even split, explicit splits, and
//! their checks.

use autopp_models::LayerKind;

use crate::config::PlanError;

/// Megatron's default split: the transformer layers evenly over `num_stages` stages, the
/// embedding on the first stage, the head on the last. Returns the number of layer-list entries
/// per stage.
///
/// When the layer count does not divide evenly (Megatron rejects that case) the `L mod S`
/// leftover layers go one each to stages 1, 2, … (skipping the first stage, which holds the
/// embedding, and the last, which holds the head, while others remain). A model without
/// embedding/head entries (a layer list) is split evenly the same way.
pub fn default_split(kinds: &[LayerKind], num_stages: usize) -> Result<Vec<usize>, PlanError> {
    let has_embedding = kinds.first() == Some(&LayerKind::Embedding);
    let has_head = kinds.len() > 1 && kinds.last() == Some(&LayerKind::Head);
    let body = kinds.len() - usize::from(has_embedding) - usize::from(has_head);
    if num_stages == 0 {
        return Err(PlanError::invalid("--pp", "must be at least 1"));
    }
    if body < num_stages {
        return Err(PlanError::invalid(
            "--pp",
            format!(
                "{num_stages} stages (pp · virtual stages) but the model has only {body} {} layers: use fewer pipeline ranks or virtual stages",
                if has_embedding { "transformer" } else { "" }
            )
            .replace("  ", " "),
        ));
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
) -> Result<(), PlanError> {
    if counts.len() != num_stages {
        return Err(PlanError::invalid(
            "--split",
            format!(
                "gives {} stages but pp · virtual stages = {num_stages}: give one layer count per stage",
                counts.len()
            ),
        ));
    }
    if let Some(stage) = counts.iter().position(|&c| c == 0) {
        return Err(PlanError::invalid(
            "--split",
            format!("stage {stage} has no layers: every stage needs at least one"),
        ));
    }
    let total: usize = counts.iter().sum();
    if total != num_entries {
        return Err(PlanError::invalid(
            "--split",
            format!(
                "counts sum to {total} but the model has {num_entries} layer entries (embedding and head count as one each)"
            ),
        ));
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
        assert!(
            err.contains("--pp") && err.contains("4 transformer layers"),
            "{err}"
        );
    }

    #[test]
    fn explicit_split_checks() {
        assert!(check_split(&[3, 3], 6, 2).is_ok());
        assert!(check_split(&[3, 3], 6, 3)
            .unwrap_err()
            .to_string()
            .contains("--split"));
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

/// The split in Megatron-LM's `--pipeline-model-parallel-layout` grammar: per stage, in global
/// stage order, `E` for the embedding, `t` for a transformer layer (`t*N` for N of them), `L`
/// for the loss (final norm, LM head, loss); stages separated by `|`, e.g. `Et*3|t*4|t*4|t*3L`.
/// `None` for a layer-list model, which Megatron cannot lay out.
pub fn megatron_layout(kinds: &[LayerKind], ranges: &[[usize; 2]]) -> Option<String> {
    if kinds.contains(&LayerKind::Custom) {
        return None;
    }
    let stages: Vec<String> = ranges
        .iter()
        .map(|&[first, last]| {
            let mut s = String::new();
            let mut run = 0;
            let flush = |s: &mut String, run: &mut usize| {
                match *run {
                    0 => {}
                    1 => s.push('t'),
                    n => s.push_str(&format!("t*{n}")),
                }
                *run = 0;
            };
            for kind in &kinds[first..=last] {
                match kind {
                    LayerKind::Transformer => run += 1,
                    LayerKind::Embedding => {
                        flush(&mut s, &mut run);
                        s.push('E');
                    }
                    LayerKind::Head => {
                        flush(&mut s, &mut run);
                        s.push('L');
                    }
                    LayerKind::Custom => {}
                }
            }
            flush(&mut s, &mut run);
            s
        })
        .collect();
    Some(stages.join("|"))
}

#[cfg(test)]
mod layout_tests {
    use super::*;

    #[test]
    fn megatron_layout_grammar() {
        let mut kinds = vec![LayerKind::Embedding];
        kinds.extend(std::iter::repeat_n(LayerKind::Transformer, 14));
        kinds.push(LayerKind::Head);
        let ranges = stage_ranges(&[4, 4, 4, 4]);
        assert_eq!(
            megatron_layout(&kinds, &ranges).unwrap(),
            "Et*3|t*4|t*4|t*3L"
        );
        let ranges = stage_ranges(&[1, 7, 7, 1]);
        assert_eq!(megatron_layout(&kinds, &ranges).unwrap(), "E|t*7|t*7|L");
        let ranges = stage_ranges(&[2, 14]);
        assert_eq!(megatron_layout(&kinds, &ranges).unwrap(), "Et|t*13L");
        assert_eq!(megatron_layout(&[LayerKind::Custom], &[[0, 0]]), None);
    }
}
