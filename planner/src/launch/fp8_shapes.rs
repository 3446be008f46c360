//! The GEMM shapes the FP8 kernels of the frameworks autopp launches take.
//!
//! Transformer Engine (Megatron-LM; `assert_dim_for_fp8_exec`) wants a GEMM's rows in multiples
//! of 8 and its columns in multiples of 16. torchao's float8 (torchtitan) multiplies with
//! `torch._scaled_mm`, which wants both dimensions of the second operand and the inner
//! dimension in multiples of 16: the weight gradient `dYᵀ·X` has the tokens as its inner
//! dimension, so rows and columns must be multiples of 16. MXFP8 scales blocks of 32 elements
//! along every GEMM's inner dimension, so both must be multiples of 32 in either framework. A
//! linear's input has `s/cp · b` rows (with sequence parallelism, after its all-gather) and the
//! hidden size, the attention width over tp or the FFN width over tp as columns. `autopp
//! launch` refuses a plan that breaks this (it would stop at its first FP8 GEMM), and the
//! search made for the framework never offers one.

use autopp_hardware::Precision;
use autopp_models::TransformerSpec;

use crate::framework::Framework;

/// Why a framework's FP8 GEMMs refuse a shape: what [`fp8_gemm_fault`] finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fp8GemmFault {
    /// The framework whose kernels refuse it.
    pub framework: Framework,
    /// The precision whose kernels refuse it.
    pub precision: Precision,
    /// Rows must be a multiple of this (8, or 32 for MXFP8).
    pub row_multiple: u64,
    /// Columns must be a multiple of this (16, or 32 for MXFP8).
    pub col_multiple: u64,
    /// `seq_length`, the sequence length in tokens.
    pub seq_length: u64,
    /// Context-parallel degree.
    pub cp: u64,
    /// Micro-batch size in sequences.
    pub micro_batch_size: u64,
    /// A column count that is not a multiple, with what it is; `None` when only the rows are.
    pub bad_width: Option<(&'static str, u64)>,
}

impl Fp8GemmFault {
    /// Rows of a linear's input: `s/cp · b`.
    pub fn rows(&self) -> u64 {
        self.seq_length / self.cp.max(1) * self.micro_batch_size
    }

    /// One sentence with the sizes and the fix (no framework name: the caller's message has it).
    pub fn message(&self) -> String {
        let (row, col) = (self.row_multiple, self.col_multiple);
        let (why, fix) = match self.bad_width {
            Some((what, w)) => (
                format!("{what} is {w}, not a multiple of {col}"),
                "another tensor-parallel degree".to_string(),
            ),
            None => (
                format!(
                    "a linear's input has s/cp · micro-batch = {} / {} · {} = {} rows, not a multiple of {row}",
                    self.seq_length,
                    self.cp,
                    self.micro_batch_size,
                    self.rows()
                ),
                format!("a micro-batch size or sequence length that makes the rows a multiple of {row}"),
            ),
        };
        let kernels = match self.framework {
            Framework::Torchtitan => "torchao's",
            _ => "Transformer Engine's",
        };
        format!(
            "{kernels} {} GEMMs need rows in multiples of {row} and columns in multiples of {col}, and {why}; re-plan with --precision bf16 or {fix}",
            self.precision
        )
    }
}

/// The row and column multiples `precision`'s GEMMs need under `framework`, or `None` when
/// they take any shape (bf16, fp16) or the framework has no such recipe (its launch refuses the
/// precision itself).
pub fn fp8_gemm_multiples(framework: Framework, precision: Precision) -> Option<(u64, u64)> {
    match (framework, precision) {
        (Framework::Megatron, Precision::Fp8Delayed | Precision::Fp8Tensorwise) => Some((8, 16)),
        (Framework::Torchtitan, Precision::Fp8Rowwise) => Some((16, 16)),
        (Framework::Megatron | Framework::Torchtitan, Precision::Mxfp8) => Some((32, 32)),
        _ => None,
    }
}

/// Why `framework`'s `precision` GEMMs refuse `model` at tensor-parallel degree `tp`,
/// context-parallel degree `cp` and `micro_batch_size` sequences per micro-batch, or `None`
/// when they run it. A width fault is reported before a row fault only when the rows are fine
/// (the rows are the usual culprit, and the one a micro-batch size fixes).
pub fn fp8_gemm_fault(
    framework: Framework,
    model: &TransformerSpec,
    precision: Precision,
    (tp, cp, micro_batch_size): (u64, u64, u64),
) -> Option<Fp8GemmFault> {
    let (row, col) = fp8_gemm_multiples(framework, precision)?;
    let tp = tp.max(1);
    let widths = [
        ("the hidden size", model.hidden_size),
        (
            "the attention width over tp",
            model.num_attention_heads * model.head_dim() / tp,
        ),
        ("the FFN width over tp", model.ffn() / tp),
    ];
    let bad_width = widths.into_iter().find(|(_, w)| !w.is_multiple_of(col));
    let fault = Fp8GemmFault {
        framework,
        precision,
        row_multiple: row,
        col_multiple: col,
        seq_length: model.seq_length,
        cp: cp.max(1),
        micro_batch_size,
        bad_width: None,
    };
    if !fault.rows().is_multiple_of(row) {
        return Some(fault);
    }
    bad_width.map(|b| Fp8GemmFault {
        bad_width: Some(b),
        ..fault
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEG: Framework = Framework::Megatron;

    fn llama3_8b() -> TransformerSpec {
        match autopp_models::load("llama3-8b").expect("preset") {
            autopp_models::Model::Transformer(t) => t,
            autopp_models::Model::Layers(_) => panic!("llama3-8b is a transformer preset"),
        }
    }

    /// Llama 3 8B (hidden 4096, 32 heads of 128, FFN 14336), by hand: at s = 4100 one sequence
    /// is 4100 rows (4100 mod 8 = 4), two are 8200 = 8 · 1025; for MXFP8 8200 mod 32 = 8 and
    /// 16400 mod 32 = 16, eight sequences are 32800 = 32 · 1025. At tp 8 the FFN width is
    /// 14336 / 8 = 1792 = 16 · 112 = 32 · 56.
    #[test]
    fn rows_and_widths_by_hand() {
        let mut m = llama3_8b();
        m.seq_length = 4100;
        let f = fp8_gemm_fault(MEG, &m, Precision::Fp8Delayed, (1, 1, 1)).expect("4100 rows");
        assert_eq!((f.rows(), f.bad_width), (4100, None));
        assert!(f
            .message()
            .contains("4100 / 1 · 1 = 4100 rows, not a multiple of 8"));
        assert_eq!(
            fp8_gemm_fault(MEG, &m, Precision::Fp8Delayed, (1, 1, 2)),
            None
        );
        // cp 2 halves the rows: 2 · 4100 / 2 = 4100 again
        assert!(fp8_gemm_fault(MEG, &m, Precision::Fp8Delayed, (1, 2, 2)).is_some());
        // bf16 takes any shape; Transformer Engine has no rowwise float8 (its launch refuses it)
        assert_eq!(fp8_gemm_fault(MEG, &m, Precision::Bf16, (1, 1, 1)), None);
        assert_eq!(
            fp8_gemm_fault(MEG, &m, Precision::Fp8Rowwise, (1, 1, 1)),
            None
        );
        // torchao's rowwise float8: 8200 rows are not a multiple of 16 (8200 mod 16 = 8)
        let titan = Framework::Torchtitan;
        let f = fp8_gemm_fault(titan, &m, Precision::Fp8Rowwise, (1, 1, 2)).expect("8200 rows");
        assert!(f
            .message()
            .starts_with("torchao's fp8-rowwise GEMMs need rows in multiples of 16"));
        assert_eq!(
            fp8_gemm_fault(titan, &m, Precision::Fp8Rowwise, (1, 1, 4)),
            None
        );
        assert_eq!(
            fp8_gemm_fault(titan, &m, Precision::Fp8Delayed, (1, 1, 1)),
            None
        );
        // MXFP8: 8200 and 16400 rows are not multiples of 32; 32800 are
        assert!(fp8_gemm_fault(MEG, &m, Precision::Mxfp8, (1, 1, 2)).is_some());
        assert!(fp8_gemm_fault(MEG, &m, Precision::Mxfp8, (1, 1, 4)).is_some());
        assert_eq!(fp8_gemm_fault(MEG, &m, Precision::Mxfp8, (1, 1, 8)), None);
        // FFN 14336 / 8 = 1792, a multiple of 16 and of 32
        m.seq_length = 4096;
        assert_eq!(fp8_gemm_fault(MEG, &m, Precision::Mxfp8, (8, 1, 1)), None);
        // an FFN of 14344 (= 8 · 1793): 1793 columns at tp 8
        m.ffn_hidden_size = Some(14344);
        let f = fp8_gemm_fault(MEG, &m, Precision::Fp8Delayed, (8, 1, 1)).expect("1793 columns");
        assert_eq!(f.bad_width, Some(("the FFN width over tp", 1793)));
        assert!(f
            .message()
            .contains("the FFN width over tp is 1793, not a multiple of 16"));
    }
}
