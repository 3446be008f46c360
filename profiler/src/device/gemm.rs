//! Matrix multiplies through `faer`, single-threaded: ranks already use the cores, one thread
//! each (`docs/executor.md` has the benchmark of `faer`, `gemm` and `matrixmultiply` on
//! tiny-gpt's shapes that chose `faer`).

use faer::{Accum, MatMut, MatRef, Par};

use super::tensor::{Tensor, Tensor64};

/// A read-only strided view of `rows × cols` elements of `data` starting at `offset`, with
/// consecutive rows `row_stride` elements apart (column stride 1).
pub(crate) fn view(
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
pub(crate) fn view_mut(
    data: &mut [f32],
    offset: usize,
    rows: usize,
    cols: usize,
    row_stride: usize,
) -> MatMut<'_, f32> {
    MatMut::from_column_major_slice_with_stride_mut(&mut data[offset..], cols, rows, row_stride)
        .transpose_mut()
}

/// `c ← a·b`, or `c += a·b` with `accumulate`, on views.
pub(crate) fn gemm_views(
    c: MatMut<'_, f32>,
    a: MatRef<'_, f32>,
    b: MatRef<'_, f32>,
    accumulate: bool,
) {
    let accum = if accumulate {
        Accum::Add
    } else {
        Accum::Replace
    };
    faer::linalg::matmul::matmul(c, accum, a, b, 1.0f32, Par::Seq);
}

fn as_ref(t: &Tensor, transpose: bool) -> MatRef<'_, f32> {
    let v = view(t.data(), 0, t.rows(), t.cols(), t.cols().max(1));
    if transpose {
        v.transpose()
    } else {
        v
    }
}

/// `c ← op(a)·op(b)` (or `c += op(a)·op(b)` with `accumulate`), where `op(x)` is `xᵀ` when
/// its flag is set.
///
/// # Panics
/// If the shapes do not chain.
pub fn matmul_into(c: &mut Tensor, a: &Tensor, ta: bool, b: &Tensor, tb: bool, accumulate: bool) {
    let (ar, ac) = if ta {
        (a.cols(), a.rows())
    } else {
        (a.rows(), a.cols())
    };
    let (br, bc) = if tb {
        (b.cols(), b.rows())
    } else {
        (b.rows(), b.cols())
    };
    assert_eq!(ac, br, "matmul: inner dimensions {ac} and {br} differ");
    assert_eq!(c.shape(), (ar, bc), "matmul: output shape");
    let cols = c.cols().max(1);
    let rows = c.rows();
    let cv = view_mut(c.data_mut(), 0, rows, bc, cols);
    gemm_views(cv, as_ref(a, ta), as_ref(b, tb), accumulate);
}

/// `op(a)·op(b)` as a new tensor.
pub fn matmul(a: &Tensor, ta: bool, b: &Tensor, tb: bool) -> Tensor {
    let rows = if ta { a.cols() } else { a.rows() };
    let cols = if tb { b.rows() } else { b.cols() };
    let mut c = Tensor::zeros(rows, cols);
    matmul_into(&mut c, a, ta, b, tb, false);
    c
}

/// `c += aᵀ·b` in f64 (the weight-gradient product `xᵀ·dy`, a sum over tokens; see
/// [`Tensor64`] for why f64).
///
/// # Panics
/// If the shapes do not chain.
pub fn matmul_tn_acc_f64(c: &mut Tensor64, a: &Tensor, b: &Tensor) {
    assert_eq!(a.rows(), b.rows(), "matmul_tn: inner dimensions differ");
    assert_eq!(
        (c.rows(), c.cols()),
        (a.cols(), b.cols()),
        "matmul_tn: output shape"
    );
    let a64: Vec<f64> = a.data().iter().map(|&x| f64::from(x)).collect();
    let b64: Vec<f64> = b.data().iter().map(|&x| f64::from(x)).collect();
    let av = MatRef::from_row_major_slice(&a64, a.rows(), a.cols()).transpose();
    let bv = MatRef::from_row_major_slice(&b64, b.rows(), b.cols());
    let (rows, cols) = (c.rows(), c.cols());
    let cv = MatMut::from_column_major_slice_mut(c.data_mut(), cols, rows).transpose_mut();
    faer::linalg::matmul::matmul(cv, Accum::Add, av, bv, 1.0f64, Par::Seq);
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
        let twice: Vec<f32> = naive(&a, false, &b, false)
            .data()
            .iter()
            .map(|x| 2.0 * x)
            .collect();
        assert_eq!(c.data(), twice.as_slice());
        let mut acc = Tensor64::zeros(3, 5);
        matmul_tn_acc_f64(&mut acc, &at, &b);
        matmul_tn_acc_f64(&mut acc, &at, &b);
        let want = naive(&at, true, &b, false);
        for (x, y) in acc.data().iter().zip(want.data()) {
            assert_eq!(*x, 2.0 * f64::from(*y));
        }
    }
}
