//! `autopp gpus` and `autopp models`: what the catalogs hold.

use anyhow::Result;
use autopp_hardware::hardware;
use autopp_models::describe::{self, Described};

/// Prints the GPU catalog.
pub fn gpus(json: bool) -> Result<()> {
    let all = hardware::catalog();
    if json {
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(());
    }
    print!("{}", hardware::catalog_table());
    Ok(())
}

/// Prints the bundled model presets, or the one model `model` names, with their key figures.
pub fn models(model: Option<&str>, json: bool) -> Result<()> {
    let rows = match model {
        Some(name) => vec![Described::one(name)?],
        None => Described::presets()?,
    };
    if !json {
        print!("{}", describe::table(&rows));
        return Ok(());
    }
    let list: Vec<serde_json::Value> = rows.iter().map(Described::to_json).collect();
    let out = match (model, list.as_slice()) {
        (Some(_), [one]) => serde_json::to_string_pretty(one)?,
        _ => serde_json::to_string_pretty(&list)?,
    };
    println!("{out}");
    Ok(())
}
