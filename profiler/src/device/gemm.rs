//! Matrix multiplies on the engine the calling thread chose ([`set_thread_engine`]):
//! - [`Engine::Cpu`] (the default): `faer`, single-threaded — ranks already use the cores, one
//!   thread each (`docs/executor.md` has the benchmark of `faer`, `gemm` and `matrixmultiply`
//!   on tiny-gpt's shapes that chose `faer`);
//! - `Engine::Cuda` (feature `cuda`): cuBLAS on a GPU
//!   (`cuda_gemm::CudaGemm`), copying the operands to the GPU and the
//!   product back on every call.
//!
//! Every GEMM of the layers goes through [`gemm_batched`] (the attention core's per-head
//! products, one call per sequence for all its heads) or its dense forms [`matmul`],
//! [`matmul_into`] and [`matmul_tn_acc`].
//!
//! On the CPU a thread's products run on [`set_thread_gemm_threads`] threads (1 unless set:
//! ranks already use the cores, one thread each; the executor gives a rank more when there
//! are more cores than ranks). faer splits a product over its output's blocks, never over the
//! inner dimension, so every element is summed in the same order whatever the thread count:
//! the bits do not depend on it (tested).

use std::cell::{Cell, RefCell};
use std::ops::Range;

use faer::{Accum, MatMut, MatRef, Par};

use super::tensor::Tensor;

/// One operand of a (batched) GEMM over a row-major buffer of f32: matrix `i` of the batch is
/// the `rows × cols` block starting at element `offset + i·batch_stride`, with consecutive rows
/// `row_stride` elements apart (column stride 1); the product uses it transposed when
/// `transpose` is set. `rows` and `cols` are the stored shape, before any transpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operand {
    /// Element index of the first matrix's first element.
    pub offset: usize,
    /// Stored rows.
    pub rows: usize,
    /// Stored columns.
    pub cols: usize,
    /// Elements between the starts of consecutive rows (at least `cols` when `rows > 1`).
    pub row_stride: usize,
    /// Elements between the starts of consecutive matrices of the batch.
    pub batch_stride: usize,
    /// Use the matrix transposed.
    pub transpose: bool,
}

impl Operand {
    /// The `rows × cols` block at `offset` with rows `row_stride` apart, not transposed, the
    /// same block for every matrix of a batch (see [`Operand::batched`]).
    pub fn block(offset: usize, rows: usize, cols: usize, row_stride: usize) -> Self {
        Operand {
            offset,
            rows,
            cols,
            row_stride,
            batch_stride: 0,
            transpose: false,
        }
    }

    /// A whole dense row-major tensor.
    pub fn dense(t: &Tensor) -> Self {
        Operand::block(0, t.rows(), t.cols(), t.cols().max(1))
    }

    /// The same operand with matrix `i` of a batch `batch_stride · i` elements further on.
    pub fn batched(self, batch_stride: usize) -> Self {
        Operand {
            batch_stride,
            ..self
        }
    }

    /// The same operand, transposed (again, if it was).
    pub fn t(self) -> Self {
        Operand {
            transpose: !self.transpose,
            ..self
        }
    }

    /// `(rows, cols)` of the matrix the product uses (after the transpose).
    pub fn shape(&self) -> (usize, usize) {
        if self.transpose {
            (self.cols, self.rows)
        } else {
            (self.rows, self.cols)
        }
    }

    /// One past the last element any of `batch` matrices touches (`offset` when there are
    /// none).
    pub fn end(&self, batch: usize) -> usize {
        if batch == 0 || self.rows == 0 || self.cols == 0 {
            return self.offset;
        }
        self.offset
            + (batch - 1) * self.batch_stride
            + (self.rows - 1) * self.row_stride
            + self.cols
    }

    /// Leading dimension for a column-major library: the row stride, or the width when there
    /// is one row (its stride is never used).
    pub fn leading_dim(&self) -> usize {
        if self.rows > 1 {
            self.row_stride
        } else {
            self.cols.max(1)
        }
    }
}

/// The engine that runs the calling thread's GEMMs.
#[derive(Debug, Default)]
pub enum Engine {
    /// `faer` on the calling thread.
    #[default]
    Cpu,
    /// cuBLAS on a GPU (feature `cuda`).
    #[cfg(feature = "cuda")]
    Cuda(Box<super::cuda_gemm::CudaGemm>),
}

impl Engine {
    /// `cpu`, or `cuda:K` for GPU `K`.
    pub fn name(&self) -> String {
        match self {
            Engine::Cpu => "cpu".into(),
            #[cfg(feature = "cuda")]
            Engine::Cuda(g) => format!("cuda:{}", g.ordinal()),
        }
    }
}

thread_local! {
    static ENGINE: RefCell<Engine> = const { RefCell::new(Engine::Cpu) };
    static CPU_THREADS: Cell<usize> = const { Cell::new(1) };
}

/// Products with fewer multiply-adds (`m·n·k`) than this run on one thread whatever
/// [`set_thread_gemm_threads`] says: splitting them costs more than it saves.
pub const PARALLEL_MIN_MULTIPLY_ADDS: usize = 1 << 21;

/// Makes the calling thread's CPU products use up to `threads` threads (at least 1; faer's,
/// through rayon's global pool) from now on, and returns the previous count.
pub fn set_thread_gemm_threads(threads: usize) -> usize {
    CPU_THREADS.with(|t| t.replace(threads.max(1)))
}

/// The threads the calling thread's CPU products may use (see [`set_thread_gemm_threads`]).
pub fn thread_gemm_threads() -> usize {
    CPU_THREADS.with(Cell::get)
}

/// Makes `engine` run the calling thread's GEMMs from now on and returns the engine it
/// replaces (drop it to release a GPU). Threads start with [`Engine::Cpu`].
pub fn set_thread_engine(engine: Engine) -> Engine {
    ENGINE.with(|e| e.replace(engine))
}

/// The name of the calling thread's engine (see [`Engine::name`]).
pub fn thread_engine_name() -> String {
    ENGINE.with_borrow(Engine::name)
}

/// A read-only strided view of `rows × cols` elements of `data` starting at `offset`, with
/// consecutive rows `row_stride` elements apart (column stride 1).
fn view(
    data: &[f32],
    offset: usize,
    rows: usize,
    cols: usize,
    row_stride: usize,
) -> MatRef<'_, f32> {
    MatRef::from_row_major_slice_with_stride(&data[offset..], rows, cols, row_stride)
}

/// A mutable strided view (see [`view`]).
///
/// Built as the transpose of a column-major view: faer 0.24.4's
/// `MatMut::from_row_major_slice_with_stride_mut` swaps the two strides (it makes a
/// column-major view while checking row-major bounds) and writes out of bounds.
fn view_mut(
    data: &mut [f32],
    offset: usize,
    rows: usize,
    cols: usize,
    row_stride: usize,
) -> MatMut<'_, f32> {
    MatMut::from_column_major_slice_with_stride_mut(&mut data[offset..], cols, rows, row_stride)
        .transpose_mut()
}

/// Panics unless the operands chain, fit their buffers and `c` is not transposed.
fn check_operands(c: (usize, Operand), a: (usize, Operand), b: (usize, Operand), batch: usize) {
    let ((clen, cm), (alen, am), (blen, bm)) = (c, a, b);
    assert!(!cm.transpose, "gemm: the output cannot be transposed");
    let ((m, k), (k2, n)) = (am.shape(), bm.shape());
    assert_eq!(k, k2, "matmul: inner dimensions {k} and {k2} differ");
    assert_eq!(cm.shape(), (m, n), "matmul: output shape");
    for (name, len, x) in [("output", clen, cm), ("a", alen, am), ("b", blen, bm)] {
        assert!(
            x.rows <= 1 || x.row_stride >= x.cols,
            "gemm: {name} rows overlap (stride {} < {} columns)",
            x.row_stride,
            x.cols
        );
        assert!(
            x.end(batch) <= len,
            "gemm: {name} reaches element {} of {len}",
            x.end(batch)
        );
    }
}

/// The CPU engine: one faer product per matrix of the batch.
#[allow(clippy::too_many_arguments)]
fn cpu_batched(
    c: &mut [f32],
    cm: Operand,
    a: &[f32],
    am: Operand,
    b: &[f32],
    bm: Operand,
    batch: usize,
    accumulate: bool,
) {
    let accum = if accumulate {
        Accum::Add
    } else {
        Accum::Replace
    };
    let (m, k) = am.shape();
    let threads = thread_gemm_threads();
    let par = if threads > 1 && m * k * bm.shape().1 >= PARALLEL_MIN_MULTIPLY_ADDS {
        Par::rayon(threads)
    } else {
        Par::Seq
    };
    let cpu_view = |data, x: Operand, i: usize| {
        let v = view(
            data,
            x.offset + i * x.batch_stride,
            x.rows,
            x.cols,
            x.row_stride.max(1),
        );
        if x.transpose {
            v.transpose()
        } else {
            v
        }
    };
    for i in 0..batch {
        let cv = view_mut(
            c,
            cm.offset + i * cm.batch_stride,
            cm.rows,
            cm.cols,
            cm.row_stride.max(1),
        );
        faer::linalg::matmul::matmul(
            cv,
            accum,
            cpu_view(a, am, i),
            cpu_view(b, bm, i),
            1.0f32,
            par,
        );
    }
}

/// `c_i ← op(a_i)·op(b_i)` for the `batch` matrices the operands describe (or `c_i +=` with
/// `accumulate`), on the calling thread's engine. The output blocks of a batch must not
/// overlap.
///
/// # Panics
/// If the shapes do not chain or an operand reaches past its buffer; on the CUDA engine, if a
/// CUDA call fails (the message names the call and the GPU).
#[allow(clippy::too_many_arguments)]
pub fn gemm_batched(
    c: &mut [f32],
    cm: Operand,
    a: &[f32],
    am: Operand,
    b: &[f32],
    bm: Operand,
    batch: usize,
    accumulate: bool,
) {
    check_operands((c.len(), cm), (a.len(), am), (b.len(), bm), batch);
    ENGINE.with_borrow(|engine| match engine {
        Engine::Cpu => cpu_batched(c, cm, a, am, b, bm, batch, accumulate),
        #[cfg(feature = "cuda")]
        Engine::Cuda(g) => g
            .gemm_batched(c, cm, a, am, b, bm, batch, accumulate)
            .unwrap_or_else(|e| panic!("{e}")),
    })
}

/// `c ← op(a)·op(b)` (or `c += op(a)·op(b)` with `accumulate`), where `op(x)` is `xᵀ` when
/// its flag is set.
///
/// # Panics
/// If the shapes do not chain (and see [`gemm_batched`]).
pub fn matmul_into(c: &mut Tensor, a: &Tensor, ta: bool, b: &Tensor, tb: bool, accumulate: bool) {
    let op = |t: &Tensor, transpose: bool| {
        let x = Operand::dense(t);
        if transpose {
            x.t()
        } else {
            x
        }
    };
    let cm = Operand::dense(c);
    gemm_batched(
        c.data_mut(),
        cm,
        a.data(),
        op(a, ta),
        b.data(),
        op(b, tb),
        1,
        accumulate,
    );
}

/// `op(a)·op(b)` as a new tensor (its buffer from the thread's pool).
pub fn matmul(a: &Tensor, ta: bool, b: &Tensor, tb: bool) -> Tensor {
    let rows = if ta { a.cols() } else { a.rows() };
    let cols = if tb { b.rows() } else { b.cols() };
    let mut c = Tensor::scratch(rows, cols);
    matmul_into(&mut c, a, ta, b, tb, false);
    c
}

/// `c += a[rows]ᵀ·b[rows]`: the weight-gradient product `xᵀ·dy` over the tokens `rows` (rows
/// of `a` and `b`), summed in f32 into the accumulator `c`.
///
/// # Panics
/// If the shapes do not chain or `rows` reaches past `a` or `b` (and see [`gemm_batched`]).
pub fn matmul_tn_acc(c: &mut Tensor, a: &Tensor, b: &Tensor, rows: Range<usize>) {
    assert_eq!(a.rows(), b.rows(), "matmul_tn: inner dimensions differ");
    assert!(
        rows.end <= a.rows(),
        "matmul_tn: rows {rows:?} of {}",
        a.rows()
    );
    if rows.is_empty() {
        return;
    }
    let (ac, bc) = (a.cols(), b.cols());
    let am = Operand::block(rows.start * ac, rows.len(), ac, ac.max(1)).t();
    let bm = Operand::block(rows.start * bc, rows.len(), bc, bc.max(1));
    let cm = Operand::dense(c);
    gemm_batched(c.data_mut(), cm, a.data(), am, b.data(), bm, 1, true);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &Tensor, ta: bool, b: &Tensor, tb: bool) -> Tensor {
        let at = |i: usize, j: usize| if ta { a.row(j)[i] } else { a.row(i)[j] };
        let bt = |i: usize, j: usize| if tb { b.row(j)[i] } else { b.row(i)[j] };
        let (m, k) = if ta {
            (a.cols(), a.rows())
        } else {
            (a.rows(), a.cols())
        };
        let n = if tb { b.rows() } else { b.cols() };
        let mut c = Tensor::zeros(m, n);
        for i in 0..m {
            for j in 0..n {
                c.row_mut(i)[j] = (0..k).map(|l| at(i, l) * bt(l, j)).sum();
            }
        }
        c
    }

    #[test]
    fn every_transpose_matches_the_naive_product() {
        let a = Tensor::from_vec(3, 4, (0..12).map(|x| x as f32 * 0.5 - 2.0).collect());
        let b = Tensor::from_vec(4, 5, (0..20).map(|x| (x % 7) as f32 - 3.0).collect());
        let at = Tensor::from_vec(4, 3, (0..12).map(|x| (x % 5) as f32).collect());
        let bt = Tensor::from_vec(5, 4, (0..20).map(|x| (x % 3) as f32 + 1.0).collect());
        for (x, tx, y, ty) in [
            (&a, false, &b, false),
            (&at, true, &b, false),
            (&a, false, &bt, true),
            (&at, true, &bt, true),
        ] {
            assert_eq!(matmul(x, tx, y, ty), naive(x, tx, y, ty));
        }
        let mut c = matmul(&a, false, &b, false);
        matmul_into(&mut c, &a, false, &b, false, true);
        assert_eq!(c.data(), twice_of(&naive(&a, false, &b, false)).as_slice());
        let mut acc = Tensor::zeros(3, 5);
        matmul_tn_acc(&mut acc, &at, &b, 0..4);
        matmul_tn_acc(&mut acc, &at, &b, 0..4);
        assert_eq!(
            acc.data(),
            twice_of(&naive(&at, true, &b, false)).as_slice()
        );
        // by token ranges: rows 0..1 then 1..4
        let mut parts = Tensor::zeros(3, 5);
        matmul_tn_acc(&mut parts, &at, &b, 0..1);
        matmul_tn_acc(&mut parts, &at, &b, 1..4);
        let whole = naive(&at, true, &b, false);
        for (x, y) in parts.data().iter().zip(whole.data()) {
            assert!((x - y).abs() <= 1e-5 * y.abs().max(1.0));
        }
    }

    fn twice_of(t: &Tensor) -> Vec<f32> {
        t.data().iter().map(|x| 2.0 * x).collect()
    }

    /// faer on several threads gives the single thread's bits (it splits the output, not the
    /// inner dimension), on shapes large enough to be split.
    #[test]
    fn thread_count_does_not_change_the_bits() {
        let fill = |n: usize, s: usize| -> Vec<f32> {
            (0..n)
                .map(|i| (((i + s) * 7919) % 1000) as f32 / 1000.0 - 0.5)
                .collect()
        };
        let (m, k, n) = (256, 512, 384);
        let a = Tensor::from_vec(m, k, fill(m * k, 1));
        let b = Tensor::from_vec(k, n, fill(k * n, 2));
        let x = Tensor::from_vec(k, m, fill(m * k, 3));
        let one = (matmul(&a, false, &b, false), {
            let mut c = Tensor::zeros(m, n);
            matmul_tn_acc(&mut c, &x, &b, 0..k);
            c
        });
        let before = set_thread_gemm_threads(4);
        let four = (matmul(&a, false, &b, false), {
            let mut c = Tensor::zeros(m, n);
            matmul_tn_acc(&mut c, &x, &b, 0..k);
            c
        });
        set_thread_gemm_threads(before);
        assert_eq!(one, four);
    }

    /// Matrix `i` of operand `x` over `data`, as the product uses it (transposed if asked).
    pub(crate) fn extract(data: &[f32], x: Operand, i: usize) -> Tensor {
        let mut t = Tensor::zeros(x.rows, x.cols);
        for r in 0..x.rows {
            let at = x.offset + i * x.batch_stride + r * x.row_stride;
            t.row_mut(r).copy_from_slice(&data[at..at + x.cols]);
        }
        if x.transpose {
            let v = (0..x.rows * x.cols)
                .map(|j| t.row(j % x.rows)[j / x.rows])
                .collect();
            Tensor::from_vec(x.cols, x.rows, v)
        } else {
            t
        }
    }

    /// Strided, interleaved blocks (the attention core's per-head views): every product is
    /// the naive one, and elements of the output outside the blocks keep their values.
    #[test]
    fn batched_strided_blocks_match_the_naive_products() {
        let (s, d, heads) = (5, 3, 2);
        let h = heads * d;
        let qkv: Vec<f32> = (0..s * 3 * h)
            .map(|x| ((x * 7) % 11) as f32 - 5.0)
            .collect();
        let q = Operand::block(0, s, d, 3 * h).batched(d);
        let k = Operand::block(h, s, d, 3 * h).batched(d);
        let scores = Operand::block(0, s, s, s).batched(s * s);
        let mut probs = vec![0.0f32; heads * s * s];
        gemm_batched(&mut probs, scores, &qkv, q, &qkv, k.t(), heads, false);
        let mut out = vec![9.0f32; s * 3 * h];
        let dk = Operand::block(h, s, d, 3 * h).batched(d);
        gemm_batched(&mut out, dk, &probs, scores.t(), &qkv, q, heads, true);
        for n in 0..heads {
            let want = naive(&extract(&qkv, q, n), false, &extract(&qkv, k, n), true);
            assert_eq!(extract(&probs, scores, n), want);
            let mut acc = naive(
                &extract(&probs, scores, n),
                true,
                &extract(&qkv, q, n),
                false,
            );
            acc.data_mut().iter_mut().for_each(|x| *x += 9.0);
            assert_eq!(extract(&out, dk, n), acc);
        }
        // the Q and V columns of `out` were not written
        for r in 0..s {
            let row = &out[r * 3 * h..(r + 1) * 3 * h];
            assert!(row[..h].iter().chain(&row[2 * h..]).all(|&x| x == 9.0));
        }
        assert_eq!(thread_engine_name(), "cpu");
    }
}
