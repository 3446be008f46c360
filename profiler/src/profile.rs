//! Measured profiles: times each layer's forward, backward-input and backward-weight on the
//! device layer (one thread, fp32), the layers the executor runs, and writes them as the
//! profiler's [`MeasuredProfile`] for `estimate --profile` and `plan --profile`.

use std::time::Instant;

use autopp_hardware::measured::{work, MeasuredLayer, MeasuredProfile, PROFILE_FORMAT};
use autopp_models::{Model, ShardSpec};

use crate::data::SyntheticData;
use crate::device::{check_model, init_layer, DeviceError, Flow, Layer};

/// Why a model could not be profiled. One line each, naming the flag at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProfileError {
    /// A flag's value cannot run.
    #[error("{flag}: {message}")]
    Invalid {
        /// The flag at fault.
        flag: String,
        /// What is wrong and what would be right.
        message: String,
    },
    /// The model uses something the device layers do not implement, or is too large.
    #[error("{0}")]
    Unsupported(String),
}

impl ProfileError {
    fn invalid(flag: &str, message: &str) -> Self {
        ProfileError::Invalid {
            flag: flag.to_string(),
            message: message.to_string(),
        }
    }
}

impl From<DeviceError> for ProfileError {
    fn from(e: DeviceError) -> Self {
        ProfileError::Unsupported(e.to_string())
    }
}

/// Times every layer of `model` (a transformer the executor implements) on micro-batches of
/// `micro_batch_size` sequences at the model's sequence length: one warm-up pass, then
/// `repetitions` timed passes (forward through every layer, then backward-input and
/// backward-weight of each in reverse); each time is the median over the repetitions.
pub fn profile_layers(
    model: &Model,
    micro_batch_size: usize,
    repetitions: usize,
    seed: u64,
) -> Result<MeasuredProfile, ProfileError> {
    let Model::Transformer(spec) = model else {
        return Err(ProfileError::Unsupported(format!(
            "profile times transformers; '{}' is a layer list, whose layers have no definition to run",
            model.name()
        )));
    };
    check_model(spec)?;
    if micro_batch_size == 0 {
        return Err(ProfileError::invalid("--mbs", "must be at least 1"));
    }
    if repetitions == 0 {
        return Err(ProfileError::invalid("--repetitions", "must be at least 1"));
    }
    let shard = ShardSpec {
        micro_batch_size: micro_batch_size as u64,
        ..ShardSpec::default()
    };
    let costs = model
        .layers(&shard)
        .map_err(|e| ProfileError::Unsupported(e.to_string()))?;
    let entries = spec.num_layers as usize + 2;
    if costs.len() != entries {
        return Err(ProfileError::Unsupported(format!(
            "'{}' expands into {} layers, the executor into {entries}",
            spec.name,
            costs.len()
        )));
    }
    let layers: Vec<Layer> = (0..entries).map(|i| init_layer(spec, seed, i)).collect();
    let mut grads: Vec<_> = layers.iter().map(Layer::zeros_like).collect();
    let seq_len = spec.seq_length as usize;
    let data = SyntheticData::new(seed, spec.vocab_size as usize, seq_len);
    let scale = 1.0 / (micro_batch_size * seq_len) as f32;
    let fail = |e: DeviceError| ProfileError::Unsupported(e.to_string());
    // samples[layer][pass]
    let mut samples = vec![[Vec::new(), Vec::new(), Vec::new()]; entries];
    for rep in 0..=repetitions {
        let mut flow = Flow::Tokens(data.inputs(rep, 0..micro_batch_size));
        let mut targets = Some(data.targets(rep, 0..micro_batch_size));
        let mut saved = Vec::with_capacity(entries);
        let mut times = vec![[0.0f64; 3]; entries];
        for (k, layer) in layers.iter().enumerate() {
            let t = matches!(layer, Layer::Head(_))
                .then(|| targets.take())
                .flatten();
            let start = Instant::now();
            let (out, s) = layer
                .forward(flow, t, micro_batch_size, seq_len)
                .map_err(fail)?;
            times[k][0] = start.elapsed().as_secs_f64();
            flow = out;
            saved.push(s);
        }
        let mut grad = None;
        for (k, s) in saved.into_iter().enumerate().rev() {
            let start = Instant::now();
            let (dx, ws) = layers[k].backward_input(s, grad, scale).map_err(fail)?;
            times[k][1] = start.elapsed().as_secs_f64();
            let start = Instant::now();
            layers[k].backward_weight(ws, &mut grads[k]).map_err(fail)?;
            times[k][2] = start.elapsed().as_secs_f64();
            grad = dx;
        }
        if rep > 0 {
            for (s, t) in samples.iter_mut().zip(&times) {
                for pass in 0..3 {
                    s[pass].push(t[pass]);
                }
            }
        }
    }
    let layers = costs
        .iter()
        .zip(&samples)
        .map(|(c, s)| MeasuredLayer {
            name: c.name.clone(),
            forward_s: median(&s[0]),
            backward_input_s: median(&s[1]),
            backward_weight_s: median(&s[2]),
            forward_work: work(&c.forward_ops),
            backward_input_work: work(&c.backward_input_ops),
            backward_weight_work: work(&c.backward_weight_ops),
        })
        .collect();
    Ok(MeasuredProfile {
        format: PROFILE_FORMAT.into(),
        backend: "cpu".into(),
        model: spec.name.clone(),
        micro_batch_size: micro_batch_size as u64,
        seq_length: spec.seq_length,
        repetitions,
        layers,
    })
}

/// The median of `xs` (0 for none).
pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => 0.5 * (v[n / 2 - 1] + v[n / 2]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }

    #[test]
    fn every_layer_is_timed_and_blocks_cost_more_than_the_embedding() {
        let model = autopp_models::load("tiny-gpt")
            .unwrap()
            .with_seq_length(32)
            .unwrap();
        let p = profile_layers(&model, 1, 2, 0).unwrap();
        assert_eq!(p.layers.len(), 10);
        assert_eq!(p.layers[0].name, "embedding");
        assert_eq!(p.layers[1].name, "layer 0");
        assert_eq!(p.layers[9].name, "head");
        for l in &p.layers[1..] {
            assert!(l.forward_s > 0.0 && l.backward_input_s > 0.0, "{l:?}");
            assert!(l.backward_weight_s > 0.0, "{l:?}");
        }
        assert!(p.layers[1].forward_work > p.layers[0].forward_work);
        let layer_list = autopp_models::load("tiny-gpt").unwrap();
        assert!(profile_layers(&layer_list, 0, 1, 0).is_err());
        assert!(profile_layers(&layer_list, 1, 0, 0).is_err());
    }
}
