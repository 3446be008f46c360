//! The split in Megatron-LM's `--pipeline-model-parallel-layout` grammar.

use autopp_models::LayerKind;

/// The split in Megatron-LM's `--pipeline-model-parallel-layout` grammar: per stage, in global
/// stage order, `E` for the embedding, `t` for a transformer layer (`t*N` for N of them), `m`
/// for a multi-token-prediction layer (`m*N`), `L` for the loss (final norm, LM head, loss);
/// stages separated by `|`, e.g. `Et*3|t*4|t*4|t*3L` or DeepSeek-V3's `…|t*2|mL`. The model's
/// `mtp_layers` MTP layers are the transformer-kind entries just before the head (autopp's layer
/// order, as Megatron numbers decoder layers before MTP ones).
///
/// `None` for a layer-list model, which Megatron cannot lay out, and where the MTP layers sit
/// where Megatron-Core refuses them ([`mtp_placement_error`]).
pub fn megatron_layout(
    kinds: &[LayerKind],
    ranges: &[[usize; 2]],
    mtp_layers: usize,
    pp: usize,
) -> Option<String> {
    if kinds.contains(&LayerKind::Custom) || mtp_placement_error(ranges, mtp_layers, pp).is_some() {
        return None;
    }
    // the MTP layers are the `mtp_layers` entries before the head (or the end)
    let end = kinds.len() - usize::from(kinds.last() == Some(&LayerKind::Head));
    let mtp_from = end.saturating_sub(mtp_layers);
    let stages: Vec<String> = ranges
        .iter()
        .map(|&[first, last]| {
            let mut s = String::new();
            let mut run = (' ', 0);
            let flush = |s: &mut String, run: &mut (char, usize)| {
                match run.1 {
                    0 => {}
                    1 => s.push(run.0),
                    n => s.push_str(&format!("{}*{n}", run.0)),
                }
                *run = (' ', 0);
            };
            for (i, kind) in kinds.iter().enumerate().take(last + 1).skip(first) {
                let c = match kind {
                    LayerKind::Transformer if i >= mtp_from => 'm',
                    LayerKind::Transformer => 't',
                    LayerKind::Embedding => 'E',
                    LayerKind::Head => 'L',
                    LayerKind::Custom => continue,
                };
                if c != run.0 {
                    flush(&mut s, &mut run);
                }
                run = (c, run.1 + 1);
                if matches!(c, 'E' | 'L') {
                    flush(&mut s, &mut run);
                }
            }
            flush(&mut s, &mut run);
            s
        })
        .collect();
    Some(stages.join("|"))
}

/// Why Megatron-Core refuses a split's MTP layers, or `None` when it takes them: they must all
/// sit in one stage, and that stage must be the last virtual stage of its pipeline rank
/// (`pipeline_parallel_layer_layout.py`, `validate_layer_layout`: "no `m` in any vpp stage
/// except a rank's last one", "All of the MTP layers must be in the same one virtual pipeline
/// stage"; `../shared/reference/megatron-lm.md`). Stage `k` of the global order is virtual
/// stage `k / pp` of rank `k % pp`, so a rank's last is one of the final `pp` stages. The MTP
/// layers are the `mtp_layers` entries before the head, the last entry of the last stage.
pub fn mtp_placement_error(ranges: &[[usize; 2]], mtp_layers: usize, pp: usize) -> Option<String> {
    let (Some(&[_, end]), true) = (ranges.last(), mtp_layers > 0) else {
        return None;
    };
    // entries end − mtp_layers .. end − 1 (the head is `end`)
    let (first_mtp, last_mtp) = (end.checked_sub(mtp_layers)?, end - 1);
    let stage_of = |i: usize| ranges.iter().position(|r| (r[0]..=r[1]).contains(&i));
    let (a, b) = (stage_of(first_mtp)?, stage_of(last_mtp)?);
    if a != b {
        return Some(format!(
            "the {mtp_layers} MTP layers are split over stages {a} and {b}; Megatron-Core needs them in one stage"
        ));
    }
    let last_round = ranges.len().saturating_sub(pp.max(1));
    (a < last_round).then(|| {
        format!("the MTP layers sit in stage {a}, not a pipeline rank's last virtual stage (stages {last_round} and later); Megatron-Core refuses that")
    })
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
            megatron_layout(&kinds, &ranges, 0, 4).unwrap(),
            "Et*3|t*4|t*4|t*3L"
        );
        let ranges = stage_ranges(&[1, 7, 7, 1]);
        assert_eq!(
            megatron_layout(&kinds, &ranges, 0, 4).unwrap(),
            "E|t*7|t*7|L"
        );
        let ranges = stage_ranges(&[2, 14]);
        assert_eq!(megatron_layout(&kinds, &ranges, 0, 2).unwrap(), "Et|t*13L");
        assert_eq!(megatron_layout(&[LayerKind::Custom], &[[0, 0]], 0, 1), None);
    }

    /// Megatron's own MTP layouts (`../shared/reference/megatron-lm.md`, "Test layouts"): the
    /// functional test `deepseekv3_proxy_flex_tp2pp2emp16etp1cp1` (14 layers, one MTP, pp 2)
    /// is `Et*7|t*7mL`; the unit tests with 8 layers, one MTP, pp 4, vpp 2 are
    /// `E|t*3|(t|)*5mL`, `E|t*3|(t|)*4tm|L` and `E|t*3|(t|)*3tt|m|L` (written here without the
    /// `(…)*n` shorthand). MTP layers split over two stages, or outside a rank's last virtual
    /// stage, get no layout.
    #[test]
    fn mtp_layers_are_written_m_where_megatron_takes_them() {
        // stage entry counts (embedding and head count as one each), MTP layers, pp
        let layout = |counts: &[usize], mtp: usize, pp: usize| {
            let transformer = counts.iter().sum::<usize>() - 2;
            let mut kinds = vec![LayerKind::Embedding];
            kinds.extend(std::iter::repeat_n(LayerKind::Transformer, transformer));
            kinds.push(LayerKind::Head);
            megatron_layout(&kinds, &stage_ranges(counts), mtp, pp)
        };
        let cases: [(&[usize], usize, &str); 4] = [
            (&[8, 9], 2, "Et*7|t*7mL"),
            (&[1, 3, 1, 1, 1, 1, 1, 2], 4, "E|t*3|t|t|t|t|t|mL"),
            (&[1, 3, 1, 1, 1, 1, 2, 1], 4, "E|t*3|t|t|t|t|tm|L"),
            (&[1, 3, 1, 1, 1, 2, 1, 1], 4, "E|t*3|t|t|t|t*2|m|L"),
        ];
        for (counts, pp, want) in cases {
            assert_eq!(layout(counts, 1, pp).as_deref(), Some(want), "{counts:?}");
        }
        // two MTP layers over stages 6 and 7
        let split = [1, 3, 1, 1, 1, 1, 2, 2];
        assert_eq!(layout(&split, 2, 4), None);
        let why = mtp_placement_error(&stage_ranges(&split), 2, 4).unwrap();
        assert!(why.contains("split over stages 6 and 7"), "{why}");
        let together = layout(&[1, 3, 1, 1, 1, 1, 2, 3], 2, 4);
        assert_eq!(together.as_deref(), Some("E|t*3|t|t|t|t|t*2|m*2L"));
        // one rank of 4 virtual stages: only stage 3 is its last; stage 2 is refused
        assert_eq!(layout(&[2, 2, 3, 1], 1, 1), None);
        assert!(mtp_placement_error(&stage_ranges(&[2, 2, 3, 1]), 1, 1)
            .unwrap()
            .contains("stage 2, not a pipeline rank's last virtual stage"));
        assert_eq!(
            layout(&[2, 2, 3, 1], 1, 2).as_deref(),
            Some("Et|t*2|t*2m|L")
        );
    }
}
