//! How sure a prediction is: uncertainty bands per GPU kind, from the validation errors of the
//! shipped calibration (`autopp-calibrate` computes them; `validation/bands.json` holds them).
//! `autopp estimate` prints them next to its figures and warns when a GPU kind has no rows
//! behind it.
//!
//! A band is the 90th percentile of the absolute relative errors of one metric over the rows on
//! one GPU kind (or over every row, the fallback for kinds without rows).

use serde::{Deserialize, Serialize};

/// The bands shipped with the binary: `validation/bands.json`, written by
/// `autopp validate validation/published-runs.json --bands validation/bands.json`.
pub const BUNDLED_BANDS: &str = include_str!("../../validation/bands.json");

/// What is compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Seconds per training iteration.
    IterationTime,
    /// Peak memory per GPU, GiB.
    PeakMemory,
    /// Forward time of one layer, seconds.
    LayerForward,
    /// Backward time of one layer (with any recomputation), seconds.
    LayerBackward,
}

impl Metric {
    /// Every metric, in report order.
    pub const ALL: [Metric; 4] = [
        Metric::IterationTime,
        Metric::PeakMemory,
        Metric::LayerForward,
        Metric::LayerBackward,
    ];
    /// A short name for tables.
    pub fn label(self) -> &'static str {
        match self {
            Metric::IterationTime => "iteration time",
            Metric::PeakMemory => "peak memory",
            Metric::LayerForward => "layer forward",
            Metric::LayerBackward => "layer backward",
        }
    }
    /// The metric's unit as printed.
    pub fn unit(self) -> &'static str {
        match self {
            Metric::PeakMemory => "GiB",
            _ => "s",
        }
    }
}

/// The spread of one metric's errors over the rows of one GPU kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Band {
    /// Catalog GPU kind, or `all`.
    pub gpu: String,
    /// The metric.
    pub metric: Metric,
    /// Comparisons behind the band.
    pub rows: usize,
    /// Mean absolute relative error.
    pub mape: f64,
    /// 90th percentile of the absolute relative error: the band is ±this.
    pub p90_abs_error: f64,
    /// Largest absolute relative error.
    pub max_abs_error: f64,
}

/// The bands file: one band per (GPU kind, metric) with rows, and the overall ones.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bands {
    /// The command that wrote the file.
    pub generated_by: String,
    /// Bands per GPU kind and metric, then the overall ones (`gpu: all`).
    pub bands: Vec<Band>,
}

impl Bands {
    /// The bands shipped with the binary ([`BUNDLED_BANDS`]); `None` if the file does not parse.
    pub fn bundled() -> Option<Bands> {
        Bands::from_json(BUNDLED_BANDS).ok()
    }

    /// Parses a bands file.
    pub fn from_json(text: &str) -> Result<Bands, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// The band of `metric` on `gpu`; `None` when no row on that kind measured it.
    pub fn for_gpu(&self, gpu: &str, metric: Metric) -> Option<&Band> {
        self.bands
            .iter()
            .find(|b| b.gpu == gpu && b.metric == metric)
    }

    /// The band of `metric` over every row.
    pub fn overall(&self, metric: Metric) -> Option<&Band> {
        self.for_gpu("all", metric)
    }

    /// Whether two band sets agree to `tolerance` in every figure (and have the same rows).
    pub fn agrees_with(&self, other: &Bands, tolerance: f64) -> bool {
        self.bands.len() == other.bands.len()
            && self.bands.iter().zip(&other.bands).all(|(a, b)| {
                a.gpu == b.gpu
                    && a.metric == b.metric
                    && a.rows == b.rows
                    && (a.mape - b.mape).abs() <= tolerance
                    && (a.p90_abs_error - b.p90_abs_error).abs() <= tolerance
                    && (a.max_abs_error - b.max_abs_error).abs() <= tolerance
            })
    }
}

/// What `estimate` says about how sure it is.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Uncertainty {
    /// The band line for the iteration time.
    pub time: Option<String>,
    /// The band line for peak memory.
    pub memory: Option<String>,
    /// A warning when the GPU kind has no validated rows behind it.
    pub warning: Option<String>,
}

/// The shipped bands' [`Uncertainty`] for `gpu`.
pub fn uncertainty(gpu: &str) -> Uncertainty {
    let Some(b) = Bands::bundled() else {
        return Uncertainty::default();
    };
    let describe = |metric: Metric, what: &str| {
        let (band, whose) = match b.for_gpu(gpu, metric) {
            Some(band) => (band, format!("on {gpu}")),
            None => (b.overall(metric)?, "on any GPU".to_string()),
        };
        Some(format!(
            "±{:.0}% ({what}: 90% of {} published runs {whose} were within it; mean error {:.1}%)",
            100.0 * band.p90_abs_error,
            band.rows,
            100.0 * band.mape
        ))
    };
    let warning = b.for_gpu(gpu, Metric::IterationTime).is_none().then(|| {
        format!(
            "no published run on {gpu} calibrates autopp (see docs/validation.md): its efficiency is extrapolated from other GPUs and the band is the one over every GPU"
        )
    });
    Uncertainty {
        time: describe(Metric::IterationTime, "time"),
        memory: describe(Metric::PeakMemory, "memory"),
        warning,
    }
}
