//! The split in Megatron-LM's `--pipeline-model-parallel-layout` grammar.

use autopp_models::LayerKind;

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
    use autopp_schedule::split::stage_ranges;

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
