//! A calibration made from a user's own measured runs (`autopp calibrate runs.json --out
//! my-cluster.json`), read back by `plan`, `estimate` and `whatif --calibration`: the analytic
//! profile's efficiency knobs, with which runs fitted them. The memory terms stay shipped.
//!
//! The file is small, versioned JSON; a field missing, unknown, of the wrong type or out of
//! range is one error naming the field.

use autopp_hardware::{AnalyticProfile, Efficiency};
use serde::{Deserialize, Serialize};

use crate::config::PlanError;

/// `format` of a calibration file.
pub const CALIBRATION_FORMAT: &str = "autopp-calibration";
/// The version of the calibration file this autopp writes and reads.
pub const CALIBRATION_VERSION: u32 = 1;

/// A calibration file: the fitted efficiency knobs and where they come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalibrationFile {
    /// Always [`CALIBRATION_FORMAT`].
    pub format: String,
    /// [`CALIBRATION_VERSION`].
    pub version: u32,
    /// The autopp version that wrote the file.
    pub autopp_version: String,
    /// When it was written, `YYYY-MM-DD` (UTC).
    pub created: String,
    /// The runs file it was fitted on.
    pub source: String,
    /// Ids of the runs the fit used.
    pub runs: Vec<String>,
    /// The knobs the fit moved (the others keep the shipped values).
    pub fitted: Vec<String>,
    /// Every efficiency knob, fitted or shipped.
    pub efficiency: Efficiency,
}

/// `v` as a user reads it: `1e-300` rather than three hundred zeros.
fn shown(v: f64) -> String {
    if v != 0.0 && !(1e-3..1e6).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

/// The smallest fraction of a peak a calibration knob may hold: below a thousandth no kernel
/// runs, and times scale past any float.
pub const MIN_FRACTION: f64 = 1e-3;
/// The largest half size, in elements, a calibration knob may hold.
pub const MAX_HALF_DIM: f64 = 1e6;

impl CalibrationFile {
    /// Parses and checks a calibration file read from `path`; an error names `--calibration`,
    /// the file and the field.
    pub fn from_json(text: &str, path: &str) -> Result<CalibrationFile, PlanError> {
        let bad = |m: String| PlanError::invalid("--calibration", format!("'{path}': {m}"));
        let file: CalibrationFile = serde_json::from_str(text)
            .map_err(|e| bad(format!("{e} (write it with autopp calibrate)")))?;
        if file.format != CALIBRATION_FORMAT {
            return Err(bad(format!("format: expected \"{CALIBRATION_FORMAT}\"")));
        }
        if file.version != CALIBRATION_VERSION {
            return Err(bad(format!(
                "version: {} is not {CALIBRATION_VERSION}; refit with autopp calibrate",
                file.version
            )));
        }
        if file.runs.is_empty() {
            return Err(bad(
                "runs: empty; a calibration needs at least one run".into()
            ));
        }
        let e = &file.efficiency;
        // (name, value, (low, high, unit)): a fraction of a peak below MIN_FRACTION or a half
        // size past MAX_HALF_DIM is no measurement, and scales times past any float
        let frac = (MIN_FRACTION, 1.0, "");
        let size = (0.0, MAX_HALF_DIM, " elements");
        let secs = (0.0, 1.0, " seconds");
        let knobs = [
            ("gemm_max", e.gemm_max, frac),
            ("gemm_misaligned", e.gemm_misaligned, frac),
            ("attention_fused", e.attention_fused, frac),
            ("attention_fa2_on_hopper", e.attention_fa2_on_hopper, frac),
            ("hopper_compute", e.hopper_compute, frac),
            ("fp8_gemm", e.fp8_gemm, frac),
            ("hbm", e.hbm, frac),
            ("comm_intra", e.comm_intra, frac),
            ("comm_inter", e.comm_inter, frac),
            ("comm_overlap", e.comm_overlap, (0.0, 1.0, "")),
            ("gemm_half_dim", e.gemm_half_dim, size),
            ("fp8_rowwise_half_dim", e.fp8_rowwise_half_dim, size),
            ("grouped_gemm_half_dim", e.grouped_gemm_half_dim, size),
            ("grouped_gemm_half_rows", e.grouped_gemm_half_rows, size),
            ("kernel_overhead_s", e.kernel_overhead_s, secs),
            ("moe_layer_overhead_s", e.moe_layer_overhead_s, secs),
            ("grouped_gemm_host_s", e.grouped_gemm_host_s, secs),
            ("host_block_s", e.host_block_s, secs),
        ];
        for (name, v, (lo, hi, unit)) in knobs {
            if !(v.is_finite() && (lo..=hi).contains(&v)) {
                return Err(bad(format!(
                    "efficiency.{name}: {} is out of range [{lo}, {hi}]{unit}",
                    shown(v)
                )));
            }
        }
        Ok(file)
    }

    /// Reads `path` (`--calibration`).
    pub fn load(path: &str) -> Result<CalibrationFile, PlanError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            PlanError::invalid("--calibration", format!("cannot read '{path}': {e}"))
        })?;
        let mut file = CalibrationFile::from_json(&text, path)?;
        // the label names the file as the user typed it
        file.source = path.to_string();
        Ok(file)
    }

    /// What the reports print next to the band: `calibrated on N runs from FILE`.
    pub fn label(&self) -> String {
        let n = self.runs.len();
        format!(
            "calibrated on {n} run{} from {}",
            if n == 1 { "" } else { "s" },
            self.source
        )
    }

    /// `profile` with these knobs in place of the shipped ones, labelled.
    pub fn apply(&self, mut profile: AnalyticProfile) -> AnalyticProfile {
        profile.efficiency = self.efficiency;
        profile.calibration = Some(self.label());
        profile
    }
}

/// `profile` calibrated with the file at `path`, when one is given (`--calibration`), and the
/// file.
pub fn calibrated(
    profile: AnalyticProfile,
    path: Option<&str>,
) -> Result<(AnalyticProfile, Option<CalibrationFile>), PlanError> {
    Ok(match path {
        Some(p) => {
            let file = CalibrationFile::load(p)?;
            (file.apply(profile), Some(file))
        }
        None => (profile, None),
    })
}

/// `--json`'s `calibration`: `null` for the shipped knobs, else the file, its run count, the
/// runs' ids, the knobs it fitted, when it was written and every efficiency knob.
pub fn calibration_json(file: Option<&CalibrationFile>) -> serde_json::Value {
    match file {
        None => serde_json::Value::Null,
        Some(f) => serde_json::json!({
            "file": f.source,
            "runs": f.runs.len(),
            "run_ids": f.runs,
            "fitted": f.fitted,
            "created": f.created,
            "efficiency": f.efficiency,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> CalibrationFile {
        CalibrationFile {
            format: CALIBRATION_FORMAT.into(),
            version: CALIBRATION_VERSION,
            autopp_version: "0.1.0".into(),
            created: "2026-11-24".into(),
            source: "runs.json".into(),
            runs: vec!["a".into(), "b".into()],
            fitted: vec!["gemm_max".into()],
            efficiency: Efficiency {
                gemm_max: 0.5,
                ..Efficiency::default()
            },
        }
    }

    #[test]
    fn round_trip_and_label() {
        let text = serde_json::to_string(&file()).unwrap();
        let back = CalibrationFile::from_json(&text, "my.json").unwrap();
        assert_eq!(back, file());
        assert_eq!(back.label(), "calibrated on 2 runs from runs.json");
    }

    #[test]
    fn json_names_the_file_and_its_runs() {
        assert_eq!(calibration_json(None), serde_json::Value::Null);
        let v = calibration_json(Some(&file()));
        assert_eq!(v["file"], "runs.json");
        assert_eq!(v["runs"], 2);
        assert_eq!(v["run_ids"], serde_json::json!(["a", "b"]));
        assert_eq!(v["fitted"], serde_json::json!(["gemm_max"]));
        assert_eq!(v["efficiency"]["gemm_max"], 0.5);
    }

    /// Each bad file is refused with the field named.
    #[test]
    fn bad_files_name_the_field() {
        let mut f = file();
        f.efficiency.gemm_max = 1.5;
        let text = serde_json::to_string(&f).unwrap();
        let e = CalibrationFile::from_json(&text, "c.json")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--calibration: 'c.json': efficiency.gemm_max"),
            "{e}"
        );
        let mut f = file();
        f.version = 7;
        let e = CalibrationFile::from_json(&serde_json::to_string(&f).unwrap(), "c.json")
            .unwrap_err()
            .to_string();
        assert!(e.contains("version"), "{e}");
        let e = CalibrationFile::from_json(r#"{"format": "autopp-calibration"}"#, "c.json")
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing field `version`"), "{e}");
        let e = CalibrationFile::from_json("[1]", "c.json")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--calibration: 'c.json'"), "{e}");
    }

    /// Knobs that scaled times past any float (the fuzzer's `comm_intra: 1e-300`, a debug
    /// build's assertion) are refused, each naming itself and its range.
    #[test]
    fn knobs_out_of_their_ranges_are_refused() {
        type Edit = fn(&mut Efficiency);
        for (edit, want) in [
            (
                (|e: &mut Efficiency| e.comm_intra = 1e-300) as Edit,
                "efficiency.comm_intra: 1e-300 is out of range [0.001, 1]",
            ),
            (
                |e: &mut Efficiency| e.fp8_gemm = 0.0,
                "efficiency.fp8_gemm: 0 is out of range [0.001, 1]",
            ),
            (
                |e: &mut Efficiency| e.gemm_half_dim = 1e300,
                "efficiency.gemm_half_dim: 1e300 is out of range [0, 1000000] elements",
            ),
            (
                |e: &mut Efficiency| e.grouped_gemm_host_s = 5.0,
                "efficiency.grouped_gemm_host_s: 5 is out of range [0, 1] seconds",
            ),
        ] {
            let mut f = file();
            edit(&mut f.efficiency);
            let e = CalibrationFile::from_json(&serde_json::to_string(&f).unwrap(), "c.json")
                .unwrap_err()
                .to_string();
            assert!(e.ends_with(want), "{e}");
        }
    }
}
