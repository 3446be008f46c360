//! [`Tensor`]: a dense, row-major fp32 matrix — the one value type of the device layer.
//!
//! Activations are `tokens × features` matrices (a micro-batch of `b` sequences of `s` tokens is
//! `b·s` rows); weights are `in × out`; vectors (biases, norm scales) are `1 × n`. Weight
//! gradients are `Tensor`s too, accumulated in f32 over micro-batches (`--check` replays the
//! pipelined run's order, so it still compares bit for bit; see `autopp_executor::check`).
//!
//! **Buffers are reused.** A dropped tensor of at least [`POOL_MIN_LEN`] elements gives its
//! buffer to its thread's pool, and [`Tensor::zeros`], [`Tensor::full`] and [`Tensor::scratch`]
//! take a buffer of the same length from there before asking the allocator. A training step
//! makes the same tensors for every micro-batch and every step, so after the first step a rank
//! allocates none: the pool holds what the step loop frees (at most [`POOL_MAX_PER_LEN`]
//! buffers of each length, [`POOL_MAX_BYTES`] in all per thread). A tensor sent to another rank
//! is dropped, and pooled, there; the gradient coming back has the same shape, so each rank's
//! pool stays level.

use std::cell::RefCell;
use std::collections::HashMap;

/// Bytes per element of every tensor of the device layer (fp32).
pub const DTYPE_BYTES: u64 = 4;

/// Buffers shorter than this many elements go back to the allocator, not to the pool.
pub const POOL_MIN_LEN: usize = 1024;
/// The most free buffers of one length a thread's pool keeps.
pub const POOL_MAX_PER_LEN: usize = 4096;
/// The most bytes of free buffers a thread's pool keeps (1 GiB).
pub const POOL_MAX_BYTES: usize = 1 << 30;

/// A thread's free buffers by length.
#[derive(Default)]
struct Pool {
    free: HashMap<usize, Vec<Vec<f32>>>,
    bytes: usize,
}

thread_local! {
    static POOL: RefCell<Pool> = RefCell::new(Pool::default());
}

/// A buffer of exactly `len` elements with unspecified (but initialised) contents: a pooled
/// one when the calling thread has one, a new one of zeros otherwise.
fn take_buffer(len: usize) -> Vec<f32> {
    if len >= POOL_MIN_LEN {
        let pooled = POOL
            .try_with(|p| {
                let mut p = p.borrow_mut();
                let v = p.free.get_mut(&len)?.pop()?;
                p.bytes -= len * std::mem::size_of::<f32>();
                Some(v)
            })
            .ok()
            .flatten();
        if let Some(v) = pooled {
            return v;
        }
    }
    vec![0.0; len]
}

/// Gives `v` to the calling thread's pool when it is long enough and there is room.
fn give_buffer(v: Vec<f32>) {
    let len = v.len();
    if len < POOL_MIN_LEN || v.capacity() != len {
        return;
    }
    // during thread exit the pool may be gone: the buffer is then simply freed
    let _ = POOL.try_with(|p| {
        let mut p = p.borrow_mut();
        let bytes = len * std::mem::size_of::<f32>();
        if p.bytes + bytes > POOL_MAX_BYTES {
            return;
        }
        let list = p.free.entry(len).or_default();
        if list.len() < POOL_MAX_PER_LEN {
            list.push(v);
            p.bytes += bytes;
        }
    });
}

/// A dense row-major `rows × cols` matrix of `f32`.
#[derive(Debug, PartialEq, Default)]
pub struct Tensor {
    rows: usize,
    cols: usize,
    data: Vec<f32>,
}

impl Clone for Tensor {
    fn clone(&self) -> Self {
        let mut data = take_buffer(self.data.len());
        data.copy_from_slice(&self.data);
        Tensor {
            rows: self.rows,
            cols: self.cols,
            data,
        }
    }
}

impl Drop for Tensor {
    fn drop(&mut self) {
        give_buffer(std::mem::take(&mut self.data));
    }
}

impl Tensor {
    /// A `rows × cols` matrix of zeros.
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Tensor::full(rows, cols, 0.0)
    }

    /// A `rows × cols` matrix filled with `value`.
    pub fn full(rows: usize, cols: usize, value: f32) -> Self {
        let mut t = Tensor::scratch(rows, cols);
        t.data.fill(value);
        t
    }

    /// A `rows × cols` matrix whose elements are unspecified — a buffer reused from the
    /// thread's pool holds what its last tensor left — for outputs that are written whole
    /// before they are read (a GEMM that replaces, an element-wise kernel).
    pub fn scratch(rows: usize, cols: usize) -> Self {
        Tensor {
            rows,
            cols,
            data: take_buffer(rows * cols),
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
    pub fn into_vec(mut self) -> Vec<f32> {
        std::mem::take(&mut self.data)
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
        super::kernels::add_assign(&mut self.data, &other.data);
    }

    /// Sets every element to zero.
    pub fn fill_zero(&mut self) {
        self.data.fill(0.0);
    }

    /// Adds the rows together into a `1 × cols` accumulator: `acc[j] += Σ_i self[i, j]`.
    pub fn add_column_sums_into(&self, acc: &mut Tensor) {
        assert_eq!(acc.len(), self.cols, "column sums: width differs");
        if !self.data.is_empty() {
            super::kernels::add_column_sums(&self.data, &mut acc.data);
        }
    }

    /// Rows `rows` (`rows.len() · cols` elements).
    ///
    /// # Panics
    /// If the range reaches past the last row.
    pub fn rows_slice(&self, rows: std::ops::Range<usize>) -> &[f32] {
        &self.data[rows.start * self.cols..rows.end * self.cols]
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
        assert_eq!(t.rows_slice(1..2), [4.0, 5.0, 6.0]);
    }

    /// A dropped tensor's buffer comes back for the next tensor of its length, and
    /// `zeros` clears what it held.
    #[test]
    fn buffers_are_reused() {
        let t = Tensor::full(64, 32, 3.0);
        let at = t.data().as_ptr();
        drop(t);
        let u = Tensor::zeros(32, 64);
        assert_eq!(u.data().as_ptr(), at);
        assert!(u.data().iter().all(|&x| x == 0.0));
        let small = Tensor::full(1, 8, 1.0);
        assert_eq!(small.clone(), small);
        assert_eq!(u.clone().into_vec().len(), 2048);
    }
}
