//! [`Tensor`]: a dense, row-major fp32 matrix — the one value type of the device layer.
//!
//! Activations are `tokens × features` matrices (a micro-batch of `b` sequences of `s` tokens is
//! `b·s` rows); weights are `in × out`; vectors (biases, norm scales) are `1 × n`.

/// Bytes per element of every tensor of the device layer (fp32).
pub const DTYPE_BYTES: u64 = 4;

/// A dense row-major `rows × cols` matrix of `f32`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Tensor {
    rows: usize,
    cols: usize,
    data: Vec<f32>,
}

impl Tensor {
    /// A `rows × cols` matrix of zeros.
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Tensor {
            rows,
            cols,
            data: vec![0.0; rows * cols],
        }
    }

    /// A `rows × cols` matrix filled with `value`.
    pub fn full(rows: usize, cols: usize, value: f32) -> Self {
        Tensor {
            rows,
            cols,
            data: vec![value; rows * cols],
        }
    }

    /// Wraps `data` (row-major) as a `rows × cols` matrix.
    ///
    /// # Panics
    /// If `data.len() != rows · cols` (a programming error inside the device layer).
    pub fn from_vec(rows: usize, cols: usize, data: Vec<f32>) -> Self {
        assert_eq!(
            data.len(),
            rows * cols,
            "a {rows} x {cols} tensor needs {} elements",
            rows * cols
        );
        Tensor { rows, cols, data }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// `(rows, cols)`.
    pub fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Bytes of the elements (`len · 4`).
    pub fn bytes(&self) -> u64 {
        self.data.len() as u64 * DTYPE_BYTES
    }

    /// The elements, row-major.
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// The elements, row-major, mutable.
    pub fn data_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }

    /// The elements, consuming the tensor.
    pub fn into_vec(self) -> Vec<f32> {
        self.data
    }

    /// Row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.cols..(i + 1) * self.cols]
    }

    /// Row `i`, mutable.
    pub fn row_mut(&mut self, i: usize) -> &mut [f32] {
        let c = self.cols;
        &mut self.data[i * c..(i + 1) * c]
    }

    /// `self += other`, element-wise.
    ///
    /// # Panics
    /// If the shapes differ.
    pub fn add_assign(&mut self, other: &Tensor) {
        assert_eq!(self.shape(), other.shape(), "add_assign: shapes differ");
        for (a, b) in self.data.iter_mut().zip(&other.data) {
            *a += b;
        }
    }

    /// Sets every element to zero.
    pub fn fill_zero(&mut self) {
        self.data.fill(0.0);
    }

    /// Adds the rows together into a `1 × cols` accumulator: `acc[j] += Σ_i self[i, j]`.
    pub fn add_column_sums_into(&self, acc: &mut Tensor) {
        assert_eq!(acc.len(), self.cols, "column sums: width differs");
        for row in self.data.chunks_exact(self.cols.max(1)) {
            for (a, x) in acc.data.iter_mut().zip(row) {
                *a += x;
            }
        }
    }

    /// The Euclidean norm `‖self‖`, accumulated in f64.
    pub fn norm(&self) -> f64 {
        self.data
            .iter()
            .map(|&x| f64::from(x) * f64::from(x))
            .sum::<f64>()
            .sqrt()
    }

    /// `‖self − other‖`, accumulated in f64.
    ///
    /// # Panics
    /// If the shapes differ.
    pub fn distance(&self, other: &Tensor) -> f64 {
        assert_eq!(self.shape(), other.shape(), "distance: shapes differ");
        self.data
            .iter()
            .zip(&other.data)
            .map(|(&a, &b)| {
                let d = f64::from(a) - f64::from(b);
                d * d
            })
            .sum::<f64>()
            .sqrt()
    }
}

/// A dense row-major `rows × cols` matrix of `f64`: the accumulator of a weight gradient.
///
/// Weight gradients are sums over every token of the batch (`dW = Σ_t x_tᵀ·dy_t`). Summed in
/// f64 they do not depend, to within 1e-16, on how the batch is cut into micro-batches and
/// replicas or in which order the pieces arrive; rounded once to f32 for the optimizer they are
/// the same bits as the single-worker sum almost always. In f32 the cut would change the
/// rounding, and AdamW — which divides a gradient by its own running size — would magnify that
/// on near-zero gradients.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Tensor64 {
    rows: usize,
    cols: usize,
    data: Vec<f64>,
}

impl Tensor64 {
    /// A `rows × cols` matrix of zeros.
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Tensor64 {
            rows,
            cols,
            data: vec![0.0; rows * cols],
        }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The elements, row-major.
    pub fn data(&self) -> &[f64] {
        &self.data
    }

    /// The elements, row-major, mutable.
    pub fn data_mut(&mut self) -> &mut [f64] {
        &mut self.data
    }

    /// Row `i`, mutable.
    pub fn row_mut(&mut self, i: usize) -> &mut [f64] {
        let c = self.cols;
        &mut self.data[i * c..(i + 1) * c]
    }

    /// Sets every element to zero.
    pub fn fill_zero(&mut self) {
        self.data.fill(0.0);
    }

    /// Adds the column sums of `x` (`rows × cols` with `cols == self.len()`):
    /// `self[j] += Σ_i x[i, j]`, in f64.
    pub fn add_column_sums(&mut self, x: &Tensor) {
        assert_eq!(self.len(), x.cols(), "column sums: width differs");
        for row in x.data().chunks_exact(x.cols().max(1)) {
            for (a, &v) in self.data.iter_mut().zip(row) {
                *a += f64::from(v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_norms_and_sums() {
        let t = Tensor::from_vec(2, 3, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(t.row(1), [4.0, 5.0, 6.0]);
        assert_eq!(t.bytes(), 24);
        let mut acc = Tensor::zeros(1, 3);
        t.add_column_sums_into(&mut acc);
        assert_eq!(acc.data(), [5.0, 7.0, 9.0]);
        assert!((Tensor::from_vec(1, 2, vec![3.0, 4.0]).norm() - 5.0).abs() < 1e-12);
        assert!((t.distance(&Tensor::zeros(2, 3)) - 91f64.sqrt()).abs() < 1e-9);
    }
}
