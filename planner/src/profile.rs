//! The profile a configuration is costed with: the cluster's analytic profile, with the
//! per-layer times of a measured profile file (`autopp profile`) where one is given.

use autopp_hardware::{AnalyticProfile, Cluster, MeasuredProfile, Precision};
use autopp_models::{Model, ShardSpec};

use crate::config::PlanError;

/// The analytic profile of `cluster` at `precision`; with `measured` (`--profile`, a path to a
/// measured profile file) its per-layer F / I / W times replace the roofline's, after checking
/// that the file covers every layer of `model`.
pub fn cost_profile(
    cluster: Cluster,
    precision: Precision,
    measured: Option<&str>,
    model: &Model,
) -> Result<AnalyticProfile, PlanError> {
    let profile = AnalyticProfile::new(cluster, precision)?;
    let Some(path) = measured else {
        return Ok(profile);
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| PlanError::invalid("--profile", format!("cannot read '{path}': {e}")))?;
    let measured = MeasuredProfile::from_json(&text, path)?;
    let layers = model.layers(&ShardSpec::default())?;
    measured.check_covers(model.name(), &layers)?;
    Ok(profile.with_measured(measured))
}
