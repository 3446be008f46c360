//! The device layer's analytic gradients against central finite differences.
//!
//! Each check takes a scalar objective `L = Σ r ∘ y` over a layer's output `y` with fixed
//! random weights `r` (the head's own loss for the head), perturbs single entries of the input
//! and of every parameter by `±ε`, and compares `(L(+ε) − L(−ε)) / 2ε` with the gradient the
//! backward computed. Parameters are drawn at scale ~0.5 (not the tiny training init) so
//! every gradient is well above fp32 rounding; a wrong term shows as an O(1) relative error.

use autopp_profiler::device::{Block, Embedding, Flow, Head, Layer, Rng, Tensor};

const EPS: f32 = 1e-2;

fn random(rng: &mut Rng, rows: usize, cols: usize, std: f64) -> Tensor {
    Tensor::from_vec(
        rows,
        cols,
        (0..rows * cols)
            .map(|_| (rng.normal() * std) as f32)
            .collect(),
    )
}

/// Replaces every parameter with fresh values of scale ~0.5 (norm scales around 1).
fn randomise(layer: &mut Layer, rng: &mut Rng) {
    let names: Vec<&str> = layer.params().iter().map(|(n, _)| *n).collect();
    for (name, p) in names.into_iter().zip(layer.params_mut()) {
        for v in p.data_mut() {
            *v = (rng.normal() * 0.5) as f32 + if name.ends_with("gamma") { 1.0 } else { 0.0 };
        }
    }
}

/// Forward then the scalar objective, in f64.
fn objective(
    layer: &Layer,
    input: &Flow,
    targets: &Option<Vec<u32>>,
    r: &Tensor,
    seqs: usize,
    seq_len: usize,
) -> f64 {
    let (out, _) = layer
        .forward(input.clone(), targets.clone(), seqs, seq_len)
        .unwrap();
    match out {
        Flow::Hidden(y) => y
            .data()
            .iter()
            .zip(r.data())
            .map(|(&a, &b)| f64::from(a) * f64::from(b))
            .sum(),
        Flow::Loss(l) => l,
        Flow::Tokens(_) => unreachable!(),
    }
}

/// Compares analytic and numerical derivatives at `samples` entries of each tensor.
fn check_layer(
    mut layer: Layer,
    input: Flow,
    targets: Option<Vec<u32>>,
    seqs: usize,
    seq_len: usize,
    seed: u64,
) {
    let mut rng = Rng::new(seed);
    randomise(&mut layer, &mut rng);
    let (out, saved) = layer
        .forward(input.clone(), targets.clone(), seqs, seq_len)
        .unwrap();
    let (r, d_out) = match &out {
        Flow::Hidden(y) => {
            let r = random(&mut rng, y.rows(), y.cols(), 1.0);
            (r.clone(), Some(r))
        }
        _ => (Tensor::zeros(0, 0), None),
    };
    let (dx, ws) = layer.backward_input(saved, d_out, 1.0).unwrap();
    let mut grads = layer.zeros_like();
    layer.backward_weight(ws, &mut grads).unwrap();

    let mut worst = 0.0f64;
    let mut check = |what: String, analytic: f64, plus: f64, minus: f64| {
        let numeric = (plus - minus) / (2.0 * f64::from(EPS));
        let err = (numeric - analytic).abs() / (numeric.abs().max(analytic.abs()) + 2e-2);
        worst = worst.max(err);
        assert!(err < 2e-2, "{what}: analytic {analytic}, numeric {numeric}");
    };

    // The input.
    if let (Flow::Hidden(x), Some(dx)) = (&input, &dx) {
        for _ in 0..12 {
            let i = rng.below(x.len() as u64) as usize;
            let mut xp = x.clone();
            xp.data_mut()[i] += EPS;
            let plus = objective(
                &layer,
                &Flow::Hidden(xp.clone()),
                &targets,
                &r,
                seqs,
                seq_len,
            );
            xp.data_mut()[i] -= 2.0 * EPS;
            let minus = objective(&layer, &Flow::Hidden(xp), &targets, &r, seqs, seq_len);
            check(format!("input[{i}]"), f64::from(dx.data()[i]), plus, minus);
        }
    }
    // Every parameter.
    let names: Vec<&'static str> = layer.params().iter().map(|(n, _)| *n).collect();
    for (k, name) in names.iter().enumerate() {
        let n = layer.params()[k].1.len();
        let picks: Vec<usize> = (0..8).map(|_| rng.below(n as u64) as usize).collect();
        for i in picks {
            let mut lp = layer.clone();
            lp.params_mut()[k].data_mut()[i] += EPS;
            let plus = objective(&lp, &input, &targets, &r, seqs, seq_len);
            lp.params_mut()[k].data_mut()[i] -= 2.0 * EPS;
            let minus = objective(&lp, &input, &targets, &r, seqs, seq_len);
            check(
                format!("{name}[{i}]"),
                f64::from(grads.params()[k].1.data()[i]),
                plus,
                minus,
            );
        }
    }
    assert!(worst.is_finite());
}

#[test]
fn block_gradients_match_finite_differences() {
    let mut rng = Rng::new(11);
    // 2 sequences of 5 tokens, hidden 8, 2 heads, FFN 16
    let block = Block::init(&mut rng, 8, 2, 16, 2, true, true);
    let x = random(&mut rng, 10, 8, 1.0);
    check_layer(
        Layer::Block(Box::new(block)),
        Flow::Hidden(x),
        None,
        2,
        5,
        1,
    );
}

#[test]
fn block_without_biases_matches_finite_differences() {
    let mut rng = Rng::new(12);
    let block = Block::init(&mut rng, 8, 4, 12, 2, false, false);
    let x = random(&mut rng, 6, 8, 1.0);
    check_layer(
        Layer::Block(Box::new(block)),
        Flow::Hidden(x),
        None,
        1,
        6,
        2,
    );
}

#[test]
fn head_gradients_match_finite_differences() {
    let mut rng = Rng::new(13);
    let head = Head::init(&mut rng, 8, 11);
    let x = random(&mut rng, 6, 8, 1.0);
    let targets: Vec<u32> = (0..6).map(|_| rng.below(11) as u32).collect();
    check_layer(Layer::Head(head), Flow::Hidden(x), Some(targets), 2, 3, 3);
}

#[test]
fn embedding_gradients_match_finite_differences() {
    let mut rng = Rng::new(14);
    let emb = Embedding::init(&mut rng, 7, 4, Some(3));
    // repeated ids: their gradients add up
    let ids = vec![1, 6, 1, 2, 1, 0];
    check_layer(Layer::Embedding(emb), Flow::Tokens(ids), None, 2, 3, 4);
}

#[test]
fn the_key_bias_has_no_gradient_and_no_effect() {
    let mut rng = Rng::new(15);
    let mut block = Block::init(&mut rng, 8, 2, 16, 2, true, true);
    let x = random(&mut rng, 8, 8, 1.0);
    let (y0, saved) = block.forward(&x, 2);
    let (_, ws) = block.backward_input(saved, random(&mut rng, 8, 8, 1.0));
    let mut grads = block.zeros_like();
    block.backward_weight(&ws, &mut grads, 0..8);
    let db = grads.qkv.bias.as_ref().unwrap().data();
    assert!(db[8..16].iter().all(|&v| v == 0.0));
    assert!(db[..8].iter().chain(&db[16..]).any(|&v| v != 0.0));
    // shifting every key by the same vector leaves the output unchanged
    block.qkv.bias.as_mut().unwrap().data_mut()[8..16].fill(0.7);
    let (y1, _) = block.forward(&x, 2);
    assert!(y0.distance(&y1) < 1e-4 * y0.norm(), "{}", y0.distance(&y1));
}

#[test]
fn causal_attention_ignores_later_tokens() {
    let mut rng = Rng::new(16);
    let block = Block::init(&mut rng, 8, 2, 16, 2, true, true);
    let x = random(&mut rng, 6, 8, 1.0);
    let (y, _) = block.forward(&x, 1);
    let mut x2 = x.clone();
    x2.row_mut(5).iter_mut().for_each(|v| *v += 3.0);
    let (y2, _) = block.forward(&x2, 1);
    for t in 0..5 {
        assert_eq!(y.row(t), y2.row(t), "token {t} saw a later token");
    }
    assert_ne!(y.row(5), y2.row(5));
}
