//! The GEMM shapes the FP8 kernels of the frameworks autopp launches take.
//!
//! Transformer Engine (Megatron-LM; `assert_dim_for_fp8_exec`) wants a GEMM's rows in multiples
//! of 8 and its columns in multiples of 16. torchao's float8 (torchtitan) multiplies with
//! `torch._scaled_mm`, which wants both dimensions of the second operand and the inner
//! dimension in multiples of 16: the weight gradient `dYᵀ·X` has the tokens as its inner
//! dimension, so rows and columns must be multiples of 16. MXFP8 scales blocks of 32 elements
//! along every GEMM's inner dimension, so both must be multiples of 32 in either framework. A
//! linear's input has `s/cp · b` rows and the hidden size, the attention width over tp or the
//! FFN width over tp as columns. Under Megatron-LM's sequence parallelism Transformer Engine
//! checks the rows of its own slice, `s/(cp·tp) · b`, before the all-gather (which it runs in
//! FP8); torchtitan all-gathers in bf16, through DTensor, before the float8 linear sees the
//! input. `autopp launch` refuses a plan that breaks this (it would stop at its first FP8
//! GEMM), and the search made for the framework never offers one.

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
    /// The sequence-parallel split of the rows the kernels check: tp under Megatron-LM's
    /// sequence parallelism, else 1.
    pub sp_split: u64,
    /// Micro-batch size in sequences.
    pub micro_batch_size: u64,
    /// A column count that is not a multiple, with what it is; `None` when only the rows are.
    pub bad_width: Option<(&'static str, u64)>,
}

impl Fp8GemmFault {
    /// Rows of a linear's input as the kernels check them: `s/cp · b`, or `s/(cp·tp) · b` for
    /// Transformer Engine under sequence parallelism (rounded down where the split is not
    /// whole: see [`Self::whole`]).
    pub fn rows(&self) -> u64 {
        self.seq_length / self.split() * self.micro_batch_size
    }

    /// Whether the sequence splits into whole rows over `cp` (and tp under sequence
    /// parallelism).
    pub fn whole(&self) -> bool {
        self.seq_length.is_multiple_of(self.split())
    }

    /// `cp`, times tp under Transformer Engine's sequence parallelism.
    fn split(&self) -> u64 {
        self.cp.max(1) * self.sp_split.max(1)
    }

    /// One sentence with the sizes and the fix (no framework name: the caller's message has it).
    pub fn message(&self) -> String {
        let (row, col) = (self.row_multiple, self.col_multiple);
        let (why, fix) = match self.bad_width {
            Some((what, w)) => (
                format!("{what} is {w}, not a multiple of {col}"),
                "another tensor-parallel degree".to_string(),
            ),
            None if !self.whole() => (
                format!(
                    "the sequence of {} tokens does not split into whole rows over cp {} and tp {} (sequence parallelism)",
                    self.seq_length, self.cp, self.sp_split
                ),
                "a sequence length that cp·tp divides".to_string(),
            ),
            None if self.sp_split > 1 => (
                format!(
                    "a linear's input has s/(cp·tp) · micro-batch = {} / ({} · {}) · {} = {} rows under sequence parallelism, not a multiple of {row}",
                    self.seq_length,
                    self.cp,
                    self.sp_split,
                    self.micro_batch_size,
                    self.rows()
                ),
                format!("a micro-batch size, sequence length or tensor-parallel degree that makes the rows a multiple of {row}"),
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

/// A plan's shape as the FP8 kernels see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmShape {
    /// Tensor-parallel degree.
    pub tp: u64,
    /// Context-parallel degree.
    pub cp: u64,
    /// Micro-batch size in sequences.
    pub micro_batch_size: u64,
    /// Whether sequence parallelism splits the rows over tp between the linears.
    pub sequence_parallel: bool,
}

/// Why `framework`'s `precision` GEMMs refuse `model` at `shape`, or `None` when they run it.
/// A width fault is reported before a row fault only when the rows are fine (the rows are the
/// usual culprit, and the one a micro-batch size fixes).
pub fn fp8_gemm_fault(
    framework: Framework,
    model: &TransformerSpec,
    precision: Precision,
    shape: GemmShape,
) -> Option<Fp8GemmFault> {
    let (row, col) = fp8_gemm_multiples(framework, precision)?;
    let GemmShape {
        tp,
        cp,
        micro_batch_size,
        sequence_parallel,
    } = shape;
    let tp = tp.max(1);
    // Transformer Engine checks (and all-gathers in FP8) the sequence-parallel slice
    let sp_split = match framework {
        Framework::Megatron if sequence_parallel => tp,
        _ => 1,
    };
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
        sp_split,
        micro_batch_size,
        bad_width: None,
    };
    if !fault.whole() || !fault.rows().is_multiple_of(row) {
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
    const TITAN: Framework = Framework::Torchtitan;

    fn llama3_8b() -> TransformerSpec {
        match autopp_models::load("llama3-8b").expect("preset") {
            autopp_models::Model::Transformer(t) => t,
            autopp_models::Model::Layers(_) => panic!("llama3-8b is a transformer preset"),
        }
    }

    /// tp, cp and micro-batch size, with or without sequence parallelism.
    fn at(tp: u64, cp: u64, micro_batch_size: u64, sequence_parallel: bool) -> GemmShape {
        GemmShape {
            tp,
            cp,
            micro_batch_size,
            sequence_parallel,
        }
    }

    /// Llama 3 8B (hidden 4096, 32 heads of 128, FFN 14336), by hand: at s = 4100 one sequence
    /// is 4100 rows (4100 mod 8 = 4), two are 8200 = 8 · 1025 (8200 mod 16 = 8, 8200 mod 32 =
    /// 8), four are 16400 (mod 32 = 16), eight are 32800 = 32 · 1025. At tp 8 the FFN width is
    /// 14336 / 8 = 1792 = 16 · 112 = 32 · 56.
    #[test]
    fn rows_and_widths_by_hand() {
        let mut m = llama3_8b();
        m.seq_length = 4100;
        let fault = |fw, p, s| fp8_gemm_fault(fw, &m, p, s);
        let f = fault(MEG, Precision::Fp8Delayed, at(1, 1, 1, false)).expect("4100 rows");
        assert_eq!((f.rows(), f.bad_width), (4100, None));
        assert!(f
            .message()
            .contains("4100 / 1 · 1 = 4100 rows, not a multiple of 8"));
        assert_eq!(fault(MEG, Precision::Fp8Delayed, at(1, 1, 2, false)), None);
        // cp 2 halves the rows: 2 · 4100 / 2 = 4100 again
        assert!(fault(MEG, Precision::Fp8Delayed, at(1, 2, 2, false)).is_some());
        // bf16 takes any shape; Transformer Engine has no rowwise float8 (its launch refuses it)
        assert_eq!(fault(MEG, Precision::Bf16, at(1, 1, 1, false)), None);
        assert_eq!(fault(MEG, Precision::Fp8Rowwise, at(1, 1, 1, false)), None);
        // torchao's rowwise float8: 8200 rows are not a multiple of 16
        let f = fault(TITAN, Precision::Fp8Rowwise, at(1, 1, 2, false)).expect("8200 rows");
        assert!(f
            .message()
            .starts_with("torchao's fp8-rowwise GEMMs need rows in multiples of 16"));
        assert_eq!(
            fault(TITAN, Precision::Fp8Rowwise, at(1, 1, 4, false)),
            None
        );
        assert_eq!(
            fault(TITAN, Precision::Fp8Delayed, at(1, 1, 1, false)),
            None
        );
        // MXFP8: 8200 and 16400 rows are not multiples of 32; 32800 are
        assert!(fault(MEG, Precision::Mxfp8, at(1, 1, 2, false)).is_some());
        assert!(fault(MEG, Precision::Mxfp8, at(1, 1, 4, false)).is_some());
        assert_eq!(fault(MEG, Precision::Mxfp8, at(1, 1, 8, false)), None);
        // FFN 14336 / 8 = 1792, a multiple of 16 and of 32
        m.seq_length = 4096;
        let fault = |fw, p, s| fp8_gemm_fault(fw, &m, p, s);
        assert_eq!(fault(MEG, Precision::Mxfp8, at(8, 1, 1, false)), None);
        // an FFN of 14344 (= 8 · 1793): 1793 columns at tp 8
        m.ffn_hidden_size = Some(14344);
        let f = fp8_gemm_fault(MEG, &m, Precision::Fp8Delayed, at(8, 1, 1, false))
            .expect("1793 columns");
        assert_eq!(f.bad_width, Some(("the FFN width over tp", 1793)));
        assert!(f
            .message()
            .contains("the FFN width over tp is 1793, not a multiple of 16"));
    }

    /// Megatron-LM's sequence parallelism: Transformer Engine checks its slice, s/(cp·tp) · b;
    /// at s = 4104 (= 8 · 513) and tp 8 that is 513 rows, while 4104 rows without it are fine.
    /// torchtitan all-gathers first: 4104 rows (4104 mod 16 = 8) either way.
    #[test]
    fn sequence_parallel_rows_by_hand() {
        let mut m = llama3_8b();
        m.seq_length = 4104;
        let fault = |fw, p, s| fp8_gemm_fault(fw, &m, p, s);
        assert_eq!(fault(MEG, Precision::Fp8Delayed, at(8, 1, 1, false)), None);
        let f = fault(MEG, Precision::Fp8Delayed, at(8, 1, 1, true)).expect("513 rows");
        assert_eq!(f.rows(), 513);
        assert!(f
            .message()
            .contains("4104 / (1 · 8) · 1 = 513 rows under sequence parallelism"));
        assert_eq!(fault(MEG, Precision::Fp8Delayed, at(8, 1, 8, true)), None);
        let f = fault(TITAN, Precision::Fp8Rowwise, at(8, 1, 1, true)).expect("4104 rows");
        assert_eq!(f.rows(), 4104);
        // 4100 tokens over tp 8 are 512.5 rows each: no micro-batch makes that whole
        m.seq_length = 4100;
        let f =
            fp8_gemm_fault(MEG, &m, Precision::Fp8Delayed, at(8, 1, 8, true)).expect("512.5 rows");
        assert!(!f.whole());
        assert!(f
            .message()
            .contains("does not split into whole rows over cp 1 and tp 8"));
    }
}
