//! The element-wise and per-row kernels of the layers — GeLU, softmax, LayerNorm, column sums —
//! written so that they vectorise, and compiled for AVX2 + FMA (x86-64) and NEON (AArch64)
//! next to the baseline, the best picked at run time by [`multiversion`](mod@multiversion) (the binary is built
//! for baseline x86-64, so without this the loops would use SSE2 and libm's scalar `expf`).
//!
//! **Same bits on every path.** Every multiply-add is an explicit [`f32::mul_add`] (one
//! rounding, on every target), and every reduction has a fixed order that does not depend on
//! the vector width: [`LANES`] running sums over the row, combined pairwise, then the tail. So
//! a kernel gives the same bits whichever version runs, for any row, wherever the row sits in
//! memory — and a row of a micro-batch gets the same bits as the same row inside the whole
//! batch, which is what lets `--check` compare a pipelined run with single-worker training
//! exactly.
//!
//! [`exp`] is Cephes' `expf` (range reduction by `ln 2` in two parts, a degree-6 polynomial,
//! the exponent put in by bit arithmetic): within 2 ulp of the correctly rounded value on
//! `[-87, 88]` (tested against the library's `exp`), branch-free so that loops over it
//! vectorise. `tanh` is `1 − 2/(e^{2x} + 1)` over it, within 1e-6 absolute.

use multiversion::multiversion;

/// Running sums per reduction: a row's elements `j ≡ l (mod LANES)` are added into sum `l`.
pub const LANES: usize = 8;

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` in two parts: `LN2_HI` has few enough bits that `n · LN2_HI` is exact.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// `1.5 · 2²³`: adding it rounds a float of magnitude below 2²² to an integer (ties to even).
const ROUND: f32 = 12_582_912.0;
/// Inputs are clamped to `[EXP_MIN, EXP_MAX]`: `e^x` stays a normal, finite float.
const EXP_MIN: f32 = -87.0;
const EXP_MAX: f32 = 88.0;

/// `e^x` (Cephes' polynomial; see the module's documentation), clamped to
/// `[e^-87, e^88]`.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let x = x.clamp(EXP_MIN, EXP_MAX);
    // n = round(x / ln 2), as a float and as the integer in the low bits of `t`
    let t = x.mul_add(LOG2E, ROUND);
    let n = t - ROUND;
    let r = n.mul_add(-LN2_HI, x);
    let r = n.mul_add(-LN2_LO, r);
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 0.5);
    let y = p.mul_add(r * r, r) + 1.0;
    // 2^n: n is in [-126, 127], so n + 127 is a valid biased exponent
    let bits = t.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127) << 23;
    y * f32::from_bits(bits)
}

/// `tanh(x) = 1 − 2/(e^{2x} + 1)` over [`exp`]: within 1e-6 of the library's `tanh`, ±1 where
/// `e^{2x}` saturates.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    1.0 - 2.0 / (exp(2.0 * x) + 1.0)
}

/// `√(2/π)`, GeLU's constant.
const GELU_C: f32 = 0.797_884_6;
const GELU_A: f32 = 0.044_715;

/// GeLU, tanh approximation (Hendrycks & Gimpel 2016; GPT-2):
/// `0.5·u·(1 + tanh(c·(u + 0.044715·u³)))`, `c = √(2/π)`.
#[inline(always)]
pub fn gelu(u: f32) -> f32 {
    let inner = GELU_C * (u * u * GELU_A).mul_add(u, u);
    let t = tanh(inner);
    0.5 * u * (1.0 + t)
}

/// The derivative of [`gelu`]:
/// `0.5·(1 + t) + 0.5·u·(1 − t²)·c·(1 + 3·0.044715·u²)` with `t = tanh(c·(u + 0.044715·u³))`.
#[inline(always)]
pub fn gelu_grad(u: f32) -> f32 {
    let u2 = u * u;
    let inner = GELU_C * (u2 * GELU_A).mul_add(u, u);
    let t = tanh(inner);
    let dinner = GELU_C * (3.0 * GELU_A).mul_add(u2, 1.0);
    let half_u = 0.5 * u;
    (half_u * (-t).mul_add(t, 1.0)).mul_add(dinner, 0.5 * (1.0 + t))
}

/// The sum of the [`LANES`] running sums, combined pairwise in a fixed order.
#[inline(always)]
fn combine(acc: [f32; LANES]) -> f32 {
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// `Σ x` in the fixed order of the module's documentation.
#[inline(always)]
fn sum(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for c in &mut chunks {
        for l in 0..LANES {
            acc[l] += c[l];
        }
    }
    chunks.remainder().iter().fold(combine(acc), |s, &v| s + v)
}

/// `Σ a·b` in the fixed order of the module's documentation.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut ca = a.chunks_exact(LANES);
    let mut cb = b.chunks_exact(LANES);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..LANES {
            acc[l] = x[l].mul_add(y[l], acc[l]);
        }
    }
    ca.remainder()
        .iter()
        .zip(cb.remainder())
        .fold(combine(acc), |s, (&x, &y)| x.mul_add(y, s))
}

/// `max x` (−∞ for an empty slice), in the fixed order of the module's documentation.
#[inline(always)]
fn max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for c in &mut chunks {
        for l in 0..LANES {
            acc[l] = acc[l].max(c[l]);
        }
    }
    let m = acc.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    chunks.remainder().iter().fold(m, |m, &v| m.max(v))
}

/// `out[i] = gelu(u[i])`.
///
/// # Panics
/// If the lengths differ.
#[multiversion(targets("x86_64+avx2+fma", "aarch64+neon"))]
pub fn gelu_forward(u: &[f32], out: &mut [f32]) {
    assert_eq!(u.len(), out.len(), "gelu: lengths differ");
    for (o, &x) in out.iter_mut().zip(u) {
        *o = gelu(x);
    }
}

/// `d[i] ← d[i] · gelu'(u[i])`: the gradient of GeLU's output in, of its input out.
///
/// # Panics
/// If the lengths differ.
#[multiversion(targets("x86_64+avx2+fma", "aarch64+neon"))]
pub fn gelu_backward(d: &mut [f32], u: &[f32]) {
    assert_eq!(u.len(), d.len(), "gelu backward: lengths differ");
    for (g, &x) in d.iter_mut().zip(u) {
        *g *= gelu_grad(x);
    }
}

/// Softmax of `row · scale` in place; returns nothing. Used by [`softmax_rows`] and
/// [`causal_softmax`].
#[inline(always)]
fn softmax_row(row: &mut [f32], scale: f32) {
    let m = max(row) * scale;
    let mut acc = [0.0f32; LANES];
    let mut chunks = row.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for l in 0..LANES {
            c[l] = exp(c[l].mul_add(scale, -m));
            acc[l] += c[l];
        }
    }
    let mut total = combine(acc);
    for x in chunks.into_remainder() {
        *x = exp(x.mul_add(scale, -m));
        total += *x;
    }
    let inv = 1.0 / total;
    for x in row.iter_mut() {
        *x *= inv;
    }
}

/// Softmax over each row of `data` (rows of `cols` elements), in place: the LM head's
/// probabilities.
///
/// # Panics
/// If `data` is not a whole number of rows.
#[multiversion(targets("x86_64+avx2+fma", "aarch64+neon"))]
pub fn softmax_rows(data: &mut [f32], cols: usize) {
    assert!(
        cols > 0 && data.len().is_multiple_of(cols),
        "softmax: {} elements are not rows of {cols}",
        data.len()
    );
    for row in data.chunks_exact_mut(cols) {
        softmax_row(row, 1.0);
    }
}

/// The causal softmax of one head's `s × s` scores (row-major), in place: row `i` becomes
/// `softmax(scale · S[i, 0..=i])`, and zero above the diagonal.
///
/// # Panics
/// If `scores` is not `s × s`.
#[multiversion(targets("x86_64+avx2+fma", "aarch64+neon"))]
pub fn causal_softmax(scores: &mut [f32], s: usize, scale: f32) {
    assert_eq!(scores.len(), s * s, "causal softmax: not {s} x {s}");
    for (i, row) in scores.chunks_exact_mut(s.max(1)).enumerate() {
        let (keep, masked) = row.split_at_mut(i + 1);
        softmax_row(keep, scale);
        masked.fill(0.0);
    }
}

/// The causal softmax's backward for one head, in place: `dS = P ∘ (dP − rowsum(dP ∘ P)) ·
/// scale` over `j ≤ i`, zero above the diagonal. `ds` holds `dP` on entry.
///
/// # Panics
/// If `ds` or `p` is not `s × s`.
#[multiversion(targets("x86_64+avx2+fma", "aarch64+neon"))]
pub fn causal_softmax_backward(ds: &mut [f32], p: &[f32], s: usize, scale: f32) {
    assert_eq!(ds.len(), s * s, "causal softmax backward: not {s} x {s}");
    assert_eq!(p.len(), s * s, "causal softmax backward: not {s} x {s}");
    let rows = ds.chunks_exact_mut(s.max(1)).zip(p.chunks_exact(s.max(1)));
    for (i, (drow, prow)) in rows.enumerate() {
        let (d, masked) = drow.split_at_mut(i + 1);
        let pr = &prow[..=i];
        let c = dot(pr, d);
        for (x, &pv) in d.iter_mut().zip(pr) {
            *x = pv * (*x - c) * scale;
        }
        masked.fill(0.0);
    }
}

/// LayerNorm's forward over rows of `n` features: per row `μ`, `σ²` (both `Σ/n` in the fixed
/// order), `rstd = 1/√(σ² + eps)`, `x̂ = (x − μ)·rstd`, `y = x̂ ∘ γ + β`.
///
/// # Panics
/// If the lengths do not match rows of `n`.
#[allow(clippy::too_many_arguments)]
#[multiversion(targets("x86_64+avx2+fma", "aarch64+neon"))]
pub fn layer_norm_forward(
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    eps: f32,
    xhat: &mut [f32],
    rstd: &mut [f32],
    y: &mut [f32],
) {
    let n = gamma.len();
    assert!(n > 0 && beta.len() == n, "layer norm: parameter widths");
    assert!(
        x.len() == rstd.len() * n && xhat.len() == x.len() && y.len() == x.len(),
        "layer norm: shapes"
    );
    let inv_n = 1.0 / n as f32;
    let rows = x
        .chunks_exact(n)
        .zip(xhat.chunks_exact_mut(n))
        .zip(y.chunks_exact_mut(n))
        .zip(rstd.iter_mut());
    for (((xr, hr), yr), r) in rows {
        let mean = sum(xr) * inv_n;
        let mut acc = [0.0f32; LANES];
        let mut chunks = xr.chunks_exact(LANES);
        for c in &mut chunks {
            for l in 0..LANES {
                let d = c[l] - mean;
                acc[l] = d.mul_add(d, acc[l]);
            }
        }
        let var = chunks.remainder().iter().fold(combine(acc), |s, &v| {
            let d = v - mean;
            d.mul_add(d, s)
        }) * inv_n;
        let rs = 1.0 / (var + eps).sqrt();
        *r = rs;
        for ((((h, yv), &v), &g), &b) in hr
            .iter_mut()
            .zip(yr.iter_mut())
            .zip(xr)
            .zip(gamma)
            .zip(beta)
        {
            let xh = (v - mean) * rs;
            *h = xh;
            *yv = xh.mul_add(g, b);
        }
    }
}

/// LayerNorm's backward-input over rows of `n` features: with `d = dy ∘ γ`,
/// `dx = rstd · (d − mean(d) − x̂ · mean(d ∘ x̂))`.
///
/// # Panics
/// If the lengths do not match rows of `n`.
#[multiversion(targets("x86_64+avx2+fma", "aarch64+neon"))]
pub fn layer_norm_backward(dy: &[f32], gamma: &[f32], xhat: &[f32], rstd: &[f32], dx: &mut [f32]) {
    let n = gamma.len();
    assert!(n > 0, "layer norm backward: no features");
    assert!(
        dy.len() == rstd.len() * n && xhat.len() == dy.len() && dx.len() == dy.len(),
        "layer norm backward: shapes"
    );
    let inv_n = 1.0 / n as f32;
    let rows = dy
        .chunks_exact(n)
        .zip(xhat.chunks_exact(n))
        .zip(dx.chunks_exact_mut(n))
        .zip(rstd);
    for (((dyr, xh), dxr), &r) in rows {
        // d = dy ∘ γ goes through dx, which is overwritten below
        for ((o, &a), &g) in dxr.iter_mut().zip(dyr).zip(gamma) {
            *o = a * g;
        }
        let mean_d = sum(dxr) * inv_n;
        let mean_dx = dot(dxr, xh) * inv_n;
        for (o, &h) in dxr.iter_mut().zip(xh) {
            *o = r * (*o - h.mul_add(mean_dx, mean_d));
        }
    }
}

/// `acc[j] += Σ_i x[i, j]` over the rows of `x` (rows of `acc.len()`), rows in order: a bias's
/// or a norm shift's gradient.
///
/// # Panics
/// If `x` is not a whole number of rows.
#[multiversion(targets("x86_64+avx2+fma", "aarch64+neon"))]
pub fn add_column_sums(x: &[f32], acc: &mut [f32]) {
    let n = acc.len();
    assert!(
        n > 0 && x.len().is_multiple_of(n),
        "column sums: width differs"
    );
    for row in x.chunks_exact(n) {
        for (a, &v) in acc.iter_mut().zip(row) {
            *a += v;
        }
    }
}

/// `acc[j] += Σ_i a[i, j] · b[i, j]` (one fused multiply-add each), rows in order: a norm
/// scale's gradient `Σ dy ∘ x̂`.
///
/// # Panics
/// If the shapes differ or are not whole rows.
#[multiversion(targets("x86_64+avx2+fma", "aarch64+neon"))]
pub fn add_column_dots(a: &[f32], b: &[f32], acc: &mut [f32]) {
    let n = acc.len();
    assert!(
        n > 0 && a.len().is_multiple_of(n) && a.len() == b.len(),
        "column dots: shapes"
    );
    for (ra, rb) in a.chunks_exact(n).zip(b.chunks_exact(n)) {
        for ((s, &x), &y) in acc.iter_mut().zip(ra).zip(rb) {
            *s = x.mul_add(y, *s);
        }
    }
}

/// `y[i, j] += bias[j]` for every row of `y` (rows of `bias.len()`).
///
/// # Panics
/// If `y` is not a whole number of rows.
#[multiversion(targets("x86_64+avx2+fma", "aarch64+neon"))]
pub fn add_bias(y: &mut [f32], bias: &[f32]) {
    let n = bias.len();
    assert!(n > 0 && y.len().is_multiple_of(n), "bias: width differs");
    for row in y.chunks_exact_mut(n) {
        for (v, &b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

/// `a[i] += b[i]`.
///
/// # Panics
/// If the lengths differ.
#[multiversion(targets("x86_64+avx2+fma", "aarch64+neon"))]
pub fn add_assign(a: &mut [f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "add: lengths differ");
    for (x, &y) in a.iter_mut().zip(b) {
        *x += y;
    }
}

/// `a[i] *= k`.
#[multiversion(targets("x86_64+avx2+fma", "aarch64+neon"))]
pub fn scale(a: &mut [f32], k: f32) {
    for x in a.iter_mut() {
        *x *= k;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in units in the last place between two finite positive floats.
    fn ulps(a: f32, b: f32) -> u32 {
        a.to_bits().abs_diff(b.to_bits())
    }

    #[test]
    fn exp_is_within_two_ulp_of_the_library() {
        let mut worst = 0;
        let mut x = -87.0f32;
        while x <= 88.0 {
            let want = (f64::from(x)).exp() as f32;
            worst = worst.max(ulps(exp(x), want));
            x += 0.001_37;
        }
        assert!(worst <= 2, "{worst} ulp");
        assert_eq!(exp(0.0), 1.0);
        // saturates instead of overflowing or flushing to zero
        assert!(exp(1000.0).is_finite() && exp(-1000.0) > 0.0);
    }

    #[test]
    fn tanh_and_gelu_match_the_library() {
        for i in -4000..=4000 {
            let x = i as f32 * 0.005;
            assert!((tanh(x) - x.tanh()).abs() < 1e-6, "tanh({x})");
            let exact = 0.5 * x * (1.0 + (GELU_C * (x + GELU_A * x * x * x)).tanh());
            assert!((gelu(x) - exact).abs() < 2e-6, "gelu({x})");
            // the derivative against a central difference in f64
            let g = |u: f64| {
                let c = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * u * (1.0 + (c * (u + 0.044715 * u * u * u)).tanh())
            };
            let (u, e) = (f64::from(x), 1e-6);
            let want = (g(u + e) - g(u - e)) / (2.0 * e);
            assert!((f64::from(gelu_grad(x)) - want).abs() < 1e-5, "gelu'({x})");
        }
        assert_eq!((tanh(30.0), tanh(-30.0)), (1.0, -1.0));
    }

    /// The vectorised versions and the scalar code give the same bits, for any length and any
    /// position of a row in memory (what makes micro-batches match the whole batch).
    #[test]
    fn kernels_do_not_depend_on_position_or_length() {
        let data: Vec<f32> = (0..1000)
            .map(|i| ((i * 37) % 101) as f32 * 0.07 - 3.5)
            .collect();
        let mut whole = vec![0.0; 1000];
        gelu_forward(&data, &mut whole);
        for start in [0, 1, 3, 7, 13] {
            let mut part = vec![0.0; 1000 - start];
            gelu_forward(&data[start..], &mut part);
            assert_eq!(part, whole[start..]);
            for (k, &u) in data[start..].iter().enumerate().step_by(97) {
                assert_eq!(gelu(u), part[k]);
            }
        }
        // a row softmax at offset 0 and at an odd offset
        let mut a = data[..130].to_vec();
        let mut b = data[3..].to_vec();
        b[..130].copy_from_slice(&data[..130]);
        softmax_rows(&mut a, 130);
        softmax_rows(&mut b[..130], 130);
        assert_eq!(a, b[..130]);
        let total: f32 = a.iter().sum();
        assert!((total - 1.0).abs() < 1e-5);
    }

    #[test]
    fn layer_norm_matches_the_definition() {
        let n = 21;
        let x: Vec<f32> = (0..3 * n)
            .map(|i| ((i * 13) % 17) as f32 * 0.3 - 2.0)
            .collect();
        let gamma: Vec<f32> = (0..n).map(|j| 0.5 + j as f32 * 0.1).collect();
        let beta: Vec<f32> = (0..n).map(|j| j as f32 * -0.05).collect();
        let (mut xhat, mut rstd, mut y) = (vec![0.0; 3 * n], vec![0.0; 3], vec![0.0; 3 * n]);
        layer_norm_forward(&x, &gamma, &beta, 1e-5, &mut xhat, &mut rstd, &mut y);
        for i in 0..3 {
            let row: Vec<f64> = x[i * n..(i + 1) * n]
                .iter()
                .map(|&v| f64::from(v))
                .collect();
            let mean = row.iter().sum::<f64>() / n as f64;
            let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
            let r = 1.0 / (var + 1e-5).sqrt();
            assert!((f64::from(rstd[i]) - r).abs() < 1e-5 * r);
            for j in 0..n {
                let want = (row[j] - mean) * r * f64::from(gamma[j]) + f64::from(beta[j]);
                assert!((f64::from(y[i * n + j]) - want).abs() < 1e-5, "y[{i}, {j}]");
            }
        }
        // backward: against a finite difference of Σ y·w
        let w: Vec<f32> = (0..3 * n).map(|i| ((i * 7) % 5) as f32 - 2.0).collect();
        let mut dx = vec![0.0; 3 * n];
        layer_norm_backward(&w, &gamma, &xhat, &rstd, &mut dx);
        let objective = |x: &[f32]| {
            let (mut h, mut r, mut y) = (vec![0.0; 3 * n], vec![0.0; 3], vec![0.0; 3 * n]);
            layer_norm_forward(x, &gamma, &beta, 1e-5, &mut h, &mut r, &mut y);
            y.iter()
                .zip(&w)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum::<f64>()
        };
        for k in [0, 5, 22, 40, 62] {
            let (mut up, mut down) = (x.clone(), x.clone());
            up[k] += 1e-2;
            down[k] -= 1e-2;
            let want = (objective(&up) - objective(&down)) / 2e-2;
            assert!(
                (f64::from(dx[k]) - want).abs() < 2e-3,
                "dx[{k}]: {} vs {want}",
                dx[k]
            );
        }
    }

    #[test]
    fn causal_softmax_and_its_backward() {
        let s = 11;
        let scores: Vec<f32> = (0..s * s).map(|i| ((i * 5) % 9) as f32 * 0.4).collect();
        let mut p = scores.clone();
        causal_softmax(&mut p, s, 0.5);
        for i in 0..s {
            let row = &p[i * s..(i + 1) * s];
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
            assert!(row[i + 1..].iter().all(|&v| v == 0.0));
        }
        // dS against a finite difference of Σ P·W through the scores
        let w: Vec<f32> = (0..s * s).map(|i| ((i * 3) % 7) as f32 - 3.0).collect();
        let mut ds = w.clone();
        causal_softmax_backward(&mut ds, &p, s, 0.5);
        let objective = |sc: &[f32]| {
            let mut q = sc.to_vec();
            causal_softmax(&mut q, s, 0.5);
            q.iter()
                .zip(&w)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum::<f64>()
        };
        for k in [0, s + 1, 3 * s + 2, s * s - 1] {
            let (mut up, mut down) = (scores.clone(), scores.clone());
            up[k] += 1e-2;
            down[k] -= 1e-2;
            let want = (objective(&up) - objective(&down)) / 2e-2;
            assert!((f64::from(ds[k]) - want).abs() < 1e-3, "dS[{k}]");
        }
        assert_eq!(ds[1], 0.0);
    }
}
