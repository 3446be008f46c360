//! The bytes the device layer really keeps equal `autopp-models`' fp32 formulas, layer by
//! layer, for the forward's saved tensors and for what backward-input keeps for
//! backward-weight.

use autopp_models::{load, Model};
use autopp_profiler::device::{Block, Embedding, Flow, Head, Layer, Rng, Tensor};

#[test]
fn measured_bytes_equal_the_formulas() {
    let Model::Transformer(spec) = load("tiny-gpt").unwrap().with_seq_length(16).unwrap() else {
        panic!("tiny-gpt is a transformer")
    };
    let (h, f, a, v) = (128, 512, 4, 1024);
    let (b, s) = (3usize, 16usize);
    let t = b * s;
    let formulas = autopp_profiler::fp32_layers::fp32_layer_bytes(&spec, b as u64);
    let mut rng = Rng::new(5);
    let layers = [
        Layer::Embedding(Embedding::init(&mut rng, v, h, None)),
        Layer::Block(Box::new(Block::init(&mut rng, h, a, f, 8, true, true))),
        Layer::Head(Head::init(&mut rng, h, v)),
    ];
    let ids: Vec<u32> = (0..t).map(|i| (i * 37 % v) as u32).collect();
    let hidden = Tensor::full(t, h, 0.25);
    for (layer, expected) in layers.iter().zip([formulas[0], formulas[1], formulas[9]]) {
        let (input, targets, d_out) = match layer {
            Layer::Embedding(_) => (Flow::Tokens(ids.clone()), None, Some(hidden.clone())),
            Layer::Block(_) => (Flow::Hidden(hidden.clone()), None, Some(hidden.clone())),
            Layer::Head(_) => (Flow::Hidden(hidden.clone()), Some(ids.clone()), None),
        };
        let (_, saved) = layer.forward(input, targets, b, s).unwrap();
        assert_eq!(
            saved.bytes(),
            expected.activation_bytes,
            "{}",
            layer.kind_name()
        );
        let (_, ws) = layer.backward_input(saved, d_out, 1.0).unwrap();
        assert_eq!(
            ws.bytes(),
            expected.weight_grad_bytes,
            "{}",
            layer.kind_name()
        );
    }
}
