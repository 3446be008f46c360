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

/// The memory band `plan` keeps free below the limit, as a fraction of the peak, with where it
/// comes from: the peak-memory band of `gpu`, or — for kinds without rows — the widest band of
/// any kind (and of all rows together). `None` when no band file is bundled.
pub fn memory_band(gpu: &str) -> Option<(f64, String)> {
    memory_band_in(&Bands::bundled()?, gpu)
}

/// [`memory_band`] over `bands`.
pub fn memory_band_in(bands: &Bands, gpu: &str) -> Option<(f64, String)> {
    let own = bands.for_gpu(gpu, Metric::PeakMemory);
    if let Some(b) = own.filter(|b| b.rows >= MIN_BAND_ROWS) {
        return Some((
            b.p90_abs_error,
            format!("the memory band on {gpu}, {} published runs", b.rows),
        ));
    }
    let widest = bands
        .bands
        .iter()
        .filter(|b| b.metric == Metric::PeakMemory && b.rows >= MIN_BAND_ROWS)
        .map(|b| b.p90_abs_error)
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))))?;
    let why = match own {
        Some(b) => format!(
            "{} published runs on {gpu} measured memory, fewer than {MIN_BAND_ROWS}: the widest memory band",
            b.rows
        ),
        None => format!("no published run on {gpu} measured memory: the widest memory band"),
    };
    Some((widest, why))
}

/// Rows a GPU kind's memory band needs before `plan` keeps it as the margin: the 90th
/// percentile of fewer runs is their largest error, so one odd run would set the margin for the
/// kind — and, as the widest band, for every kind without rows (the two H200 rows read 43% over
/// every prediction until the compiled loss of their torchtitan was modelled; a small set can
/// be that wrong, or that lucky, by one missing fact).
pub const MIN_BAND_ROWS: usize = 10;

/// Bytes of margin for a band `fraction` on a GPU of `capacity_bytes`: `fraction · capacity`.
/// A peak `p` with `p + fraction·capacity ≤ capacity` also has `p·(1 + fraction) ≤ capacity`
/// (as `p ≤ capacity`), so a plan that keeps this margin stays fitting when its peak is under-
/// predicted by up to the band.
pub fn margin_bytes(fraction: f64, capacity_bytes: u64) -> u64 {
    (fraction.max(0.0) * capacity_bytes as f64).ceil() as u64
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

#[cfg(test)]
mod tests {
    use super::*;

    /// a100-80g's band (7.6% in the shipped file): 0.076 × 80 GiB = 6.08 GiB of margin; a
    /// kind without memory rows takes the widest band.
    #[test]
    fn memory_margin_hand_worked() {
        let band = |gpu: &str, p90: f64| Band {
            gpu: gpu.into(),
            metric: Metric::PeakMemory,
            rows: MIN_BAND_ROWS,
            mape: 0.04,
            p90_abs_error: p90,
            max_abs_error: 0.3,
        };
        let bands = Bands {
            generated_by: "test".into(),
            bands: vec![band("a100-80g", 0.076), band("a100-40g", 0.12)],
        };
        let (f, why) = memory_band_in(&bands, "a100-80g").unwrap();
        assert_eq!(f, 0.076);
        assert!(why.contains("a100-80g"));
        let m = margin_bytes(f, 80 << 30);
        assert!((m as f64 / (1u64 << 30) as f64 - 6.08).abs() < 1e-6);
        let (widest, why) = memory_band_in(&bands, "b200").unwrap();
        assert_eq!(widest, 0.12);
        assert!(why.contains("widest"));
        // two rows 48% off on a kind: neither its margin nor the widest band
        let mut bands = bands;
        bands.bands.push(Band {
            rows: 2,
            ..band("h200", 0.487)
        });
        let (f, why) = memory_band_in(&bands, "h200").unwrap();
        assert_eq!(f, 0.12, "{why}");
        assert!(why.contains("2 published runs on h200"), "{why}");
        assert_eq!(memory_band_in(&bands, "h100-sxm").unwrap().0, 0.12);
    }
}
