//! cuBLAS GEMMs (feature `cuda`): [`CudaGemm`], the GPU engine of [`gemm`](super::gemm).
//!
//! What runs where: the layers keep their tensors in host memory and do their element-wise work
//! (norms, softmax, GeLU, the loss, AdamW) on the CPU; each GEMM copies its operands to the GPU,
//! multiplies there and copies the product back before it returns. The copies are per call
//! (stream-ordered allocations from the driver's memory pool, freed when the call ends), which
//! is simple and keeps every tensor where the CPU layers expect it, at the price of PCIe
//! traffic that a device-resident layer would not pay.
//!
//! Numerics: fp32 products use SGEMM in cuBLAS's default math mode, set explicitly, which does
//! not use TF32 (products and sums stay fp32, as on the CPU; only their order differs). The
//! weight-gradient product `c += aᵀ·b` is an SGEMM with `β = 1` into the f32 accumulator, as
//! on the CPU.
//!
//! Row-major to column-major: a row-major `r × c` block with row stride `ld` is, to cuBLAS, the
//! column-major `c × r` matrix with leading dimension `ld` — its transpose. So `C = op(A)·op(B)`
//! runs as `Cᵀ = op(B)ᵀ·op(A)ᵀ`: cuBLAS's first operand is our `B`, its second our `A`, and
//! a transpose flag of ours is the same flag there.

use std::sync::Arc;

use cudarc::cublas::sys::{cublasMath_t, cublasOperation_t};
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, StridedBatchedConfig};
use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};

use super::cuda::{call_failed, open, require, CudaError, Library};
use super::gemm::Operand;

/// A cuBLAS handle on its own stream of one GPU. Each rank's thread makes its own, so ranks
/// that share a GPU each have their own stream and handle.
#[derive(Debug)]
pub struct CudaGemm {
    /// Dropped before the stream it uses.
    blas: CudaBlas,
    stream: Arc<CudaStream>,
    ordinal: usize,
}

/// `x` as cuBLAS's `int`.
fn int(x: usize, ordinal: usize) -> Result<i32, CudaError> {
    i32::try_from(x).map_err(|_| CudaError::Call {
        what: "cuBLAS GEMM".into(),
        ordinal,
        message: format!("dimension {x} does not fit cuBLAS's 32-bit int"),
    })
}

fn op(transpose: bool) -> cublasOperation_t {
    if transpose {
        cublasOperation_t::CUBLAS_OP_T
    } else {
        cublasOperation_t::CUBLAS_OP_N
    }
}

impl CudaGemm {
    /// Opens GPU `ordinal` (its primary context, shared by the process), a new stream on it
    /// and a cuBLAS handle on that stream, in the default (non-TF32) math mode.
    ///
    /// # Errors
    /// [`CudaError::NoDriver`] without a driver, [`CudaError::NoDevice`] if the GPU cannot be
    /// opened, [`CudaError::NoLibrary`] without cuBLAS, [`CudaError::Call`] if the stream or
    /// handle cannot be made.
    pub fn new(ordinal: usize) -> Result<CudaGemm, CudaError> {
        let ctx = open(ordinal)?;
        require(Library::Cublas)?;
        let stream = ctx
            .new_stream()
            .map_err(call_failed("creating a stream", ordinal))?;
        let blas = CudaBlas::new(stream.clone())
            .map_err(call_failed("creating a cuBLAS handle", ordinal))?;
        // SAFETY: the handle is live; the mode is one of cuBLAS's.
        unsafe {
            cudarc::cublas::sys::cublasSetMathMode(
                *blas.handle(),
                cublasMath_t::CUBLAS_DEFAULT_MATH,
            )
        }
        .result()
        .map_err(call_failed("setting cuBLAS's math mode", ordinal))?;
        Ok(CudaGemm {
            blas,
            stream,
            ordinal,
        })
    }

    /// The GPU.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>, CudaError> {
        self.stream
            .clone_htod(host)
            .map_err(call_failed("copying to the GPU", self.ordinal))
    }

    /// Copies `dev` into `host` and waits for the copy.
    fn download<T: DeviceRepr>(&self, dev: &CudaSlice<T>, host: &mut [T]) -> Result<(), CudaError> {
        let failed = call_failed("copying from the GPU", self.ordinal);
        self.stream.memcpy_dtoh(dev, host).map_err(&failed)?;
        self.stream.synchronize().map_err(failed)
    }

    /// [`gemm_batched`](super::gemm::gemm_batched) on the GPU: uploads the span of each
    /// operand (the output's too, so elements between its blocks come back unchanged), runs
    /// one SGEMM (or one strided-batched SGEMM) and copies the output span back. The operands
    /// must already be checked (shapes chain, spans inside the buffers).
    ///
    /// # Errors
    /// [`CudaError::Call`] when a copy or cuBLAS fails, or a dimension exceeds cuBLAS's `int`.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_batched(
        &self,
        c: &mut [f32],
        cm: Operand,
        a: &[f32],
        am: Operand,
        b: &[f32],
        bm: Operand,
        batch: usize,
        accumulate: bool,
    ) -> Result<(), CudaError> {
        let ((m, k), (_, n)) = (am.shape(), bm.shape());
        if batch == 0 || m == 0 || n == 0 {
            return Ok(());
        }
        if k == 0 {
            // an empty sum: the product is zero
            if !accumulate {
                for i in 0..batch {
                    for r in 0..cm.rows {
                        let at = cm.offset + i * cm.batch_stride + r * cm.row_stride;
                        c[at..at + cm.cols].fill(0.0);
                    }
                }
            }
            return Ok(());
        }
        self.stream
            .context()
            .bind_to_thread()
            .map_err(call_failed("binding the GPU's context", self.ordinal))?;
        let a_dev = self.upload(&a[am.offset..am.end(batch)])?;
        let b_dev = self.upload(&b[bm.offset..bm.end(batch)])?;
        let span = cm.offset..cm.end(batch);
        let mut c_dev = self.upload(&c[span.clone()])?;
        let i = |x| int(x, self.ordinal);
        let gemm = GemmConfig {
            transa: op(bm.transpose),
            transb: op(am.transpose),
            m: i(n)?,
            n: i(m)?,
            k: i(k)?,
            alpha: 1.0f32,
            lda: i(bm.leading_dim())?,
            ldb: i(am.leading_dim())?,
            beta: if accumulate { 1.0 } else { 0.0 },
            ldc: i(cm.leading_dim())?,
        };
        let failed = call_failed("cuBLAS SGEMM", self.ordinal);
        // SAFETY: every matrix of the batch lies inside the uploaded span of its operand (the
        // spans end where `Operand::end` says the last element is), and cuBLAS reads and
        // writes only within the dimensions and strides given.
        unsafe {
            if batch == 1 {
                self.blas.gemm(gemm, &b_dev, &a_dev, &mut c_dev)
            } else {
                let stride = |x: usize| i64::try_from(x).unwrap_or(i64::MAX);
                let cfg = StridedBatchedConfig {
                    gemm,
                    batch_size: i(batch)?,
                    stride_a: stride(bm.batch_stride),
                    stride_b: stride(am.batch_stride),
                    stride_c: stride(cm.batch_stride),
                };
                self.blas
                    .gemm_strided_batched(cfg, &b_dev, &a_dev, &mut c_dev)
            }
        }
        .map_err(failed)?;
        self.download(&c_dev, &mut c[span])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::gemm::{gemm_batched, matmul, matmul_into, matmul_tn_acc};
    use crate::device::{set_thread_engine, Engine, Tensor};

    fn fill(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| (((i + seed) * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect()
    }

    fn rel_err(got: &[f32], want: &[f32]) -> f64 {
        let (mut d, mut w) = (0.0f64, 0.0f64);
        for (&g, &x) in got.iter().zip(want) {
            d += (f64::from(g) - f64::from(x)).powi(2);
            w += f64::from(x).powi(2);
        }
        (d / w.max(1e-300)).sqrt()
    }

    /// Every product the layers use — dense in every transpose, accumulating, strided batched
    /// (the attention core's) and the weight-gradient product by token range — on the CPU engine and then
    /// on the GPU engine, within 1e-5 of each other: fp32 sums in another order, while a layout
    /// bug or TF32 would miss by far more.
    fn cpu_then_gpu(ordinal: usize) {
        let shapes = [(7, 5, 3), (64, 128, 96), (33, 1, 17), (256, 128, 384)];
        let mut results: Vec<Vec<Vec<f32>>> = Vec::new();
        for engine in ["cpu", "gpu"] {
            if engine == "gpu" {
                let g = CudaGemm::new(ordinal).expect("the GPU opened a moment ago");
                set_thread_engine(Engine::Cuda(Box::new(g)));
            }
            let mut out = Vec::new();
            for (s, &(m, k, n)) in shapes.iter().enumerate() {
                let a = Tensor::from_vec(m, k, fill(m * k, s));
                let at = Tensor::from_vec(k, m, fill(m * k, s + 1));
                let b = Tensor::from_vec(k, n, fill(k * n, s + 2));
                let bt = Tensor::from_vec(n, k, fill(k * n, s + 3));
                out.push(matmul(&a, false, &b, false).into_vec());
                out.push(matmul(&at, true, &b, false).into_vec());
                out.push(matmul(&a, false, &bt, true).into_vec());
                out.push(matmul(&at, true, &bt, true).into_vec());
                let mut c = Tensor::from_vec(m, n, fill(m * n, s + 4));
                matmul_into(&mut c, &a, false, &b, false, true);
                out.push(c.into_vec());
            }
            // two heads of 3 columns over 5 tokens, interleaved in a 5 × 18 buffer
            let (t, d, heads) = (5, 3, 2);
            let qkv = fill(t * 3 * heads * d, 9);
            let q = Operand::block(0, t, d, 3 * heads * d).batched(d);
            let k = Operand::block(heads * d, t, d, 3 * heads * d).batched(d);
            let sq = Operand::block(0, t, t, t).batched(t * t);
            let mut scores = vec![0.0f32; heads * t * t];
            gemm_batched(&mut scores, sq, &qkv, q, &qkv, k.t(), heads, false);
            let mut grad = vec![0.25f32; qkv.len()];
            gemm_batched(&mut grad, k, &scores, sq.t(), &qkv, q, heads, false);
            out.push(scores);
            out.push(grad);
            let x = Tensor::from_vec(40, 6, fill(240, 11));
            let dy = Tensor::from_vec(40, 4, fill(160, 12));
            let mut acc = Tensor::full(6, 4, 0.5);
            matmul_tn_acc(&mut acc, &x, &dy, 0..25);
            matmul_tn_acc(&mut acc, &x, &dy, 25..40);
            out.push(acc.into_vec());
            results.push(out);
            assert_eq!(
                set_thread_engine(Engine::Cpu).name(),
                engine_name(engine, ordinal)
            );
        }
        for (i, (g, c)) in results[1].iter().zip(&results[0]).enumerate() {
            assert!(
                rel_err(g, c) < 1e-5,
                "product {i}: relative error {}",
                rel_err(g, c)
            );
        }
    }

    fn engine_name(engine: &str, ordinal: usize) -> String {
        if engine == "cpu" {
            "cpu".into()
        } else {
            format!("cuda:{ordinal}")
        }
    }

    /// cuBLAS agrees with faer on every kind of product; without a driver (or cuBLAS) the
    /// engine refuses in one line.
    #[test]
    fn cublas_matches_faer_or_says_why_not() {
        match CudaGemm::new(0) {
            Ok(g) => {
                drop(g);
                cpu_then_gpu(0);
            }
            Err(CudaError::NoDriver) => {
                let e = CudaError::NoDriver.to_string();
                assert!(e.starts_with("no CUDA driver (libcuda.so)"), "{e}");
                eprintln!("no CUDA driver: the cuBLAS comparison did not run");
            }
            Err(e @ CudaError::NoLibrary { .. }) => {
                assert!(e.to_string().contains("cuBLAS (libcublas.so)"), "{e}");
                eprintln!("{e}: the cuBLAS comparison did not run");
            }
            Err(e) => panic!("a driver is present but GPU 0 failed: {e}"),
        }
    }
}
