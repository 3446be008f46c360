//! Writing a launch into a directory, all of its files or none: into a fresh sibling directory
//! first, then renamed into place.

use std::path::{Path, PathBuf};

use super::{shell_lines, Launch};

/// Names a launch may write into its directory (a directory holding only these is replaced).
pub const OURS: [&str; 7] = [
    "launch.sh",
    "autopp_torchtitan.py",
    "sbatch.sh",
    "ds_config.json",
    "autopp_pipeline.py",
    "pipeline_schedule.csv",
    "plan.json",
];

/// Why the launch files could not be written; the directory is then as it was.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The path names no directory.
    #[error("'{0}' is not a directory path")]
    NotADirectoryPath(String),
    /// The path is a file.
    #[error("'{0}' exists and is not a directory")]
    NotADirectory(String),
    /// The directory holds a file autopp did not write.
    #[error("'{dir}' holds {file} which autopp did not write; give a new or empty directory")]
    Foreign {
        /// The directory.
        dir: String,
        /// The file autopp did not write.
        file: String,
    },
    /// The file system refused.
    #[error("cannot {action} '{path}': {source}")]
    Io {
        /// `read`, `create` or `write`.
        action: &'static str,
        /// The path.
        path: String,
        /// What the file system said.
        source: std::io::Error,
    },
}

/// Wraps a file-system error on `path`.
fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> WriteError {
    let path = path.display().to_string();
    move |source| WriteError::Io {
        action,
        path,
        source,
    }
}

/// Writes `launch`'s files (and `plan.json` when given) into `dir`, so that `dir` ends with
/// all of them or is untouched. `dir` may be new, empty, or hold only files an earlier launch
/// wrote; a `plan.json` already there is kept.
pub fn write_dir(launch: &Launch, dir: &str, plan: Option<String>) -> Result<(), WriteError> {
    let target = PathBuf::from(dir);
    check_target(&target, dir)?;
    let parent = target
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or_else(|| Path::new("."));
    let name = target
        .file_name()
        .ok_or_else(|| WriteError::NotADirectoryPath(dir.to_string()))?;
    std::fs::create_dir_all(parent).map_err(io("create", parent))?;
    let pid = std::process::id();
    let tmp = parent.join(format!(".{}.tmp{pid}", name.to_string_lossy()));
    let old = parent.join(format!(".{}.old{pid}", name.to_string_lossy()));
    // a plan.json beside earlier launch files is the plan, not an output: keep it
    let kept = target.join("plan.json");
    let plan = match plan {
        None if kept.is_file() => Some(std::fs::read_to_string(&kept).map_err(io("read", &kept))?),
        plan => plan,
    };
    let written = fill(&tmp, launch, plan).and_then(|()| {
        if target.exists() {
            std::fs::rename(&target, &old)?;
        }
        std::fs::rename(&tmp, &target).inspect_err(|_| {
            let _ = std::fs::rename(&old, &target);
        })
    });
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(io("write", &target)(e));
    }
    let _ = std::fs::remove_dir_all(&old);
    Ok(())
}

/// `dir` may be new, empty, or hold only files an earlier launch wrote.
fn check_target(target: &Path, dir: &str) -> Result<(), WriteError> {
    if !target.exists() {
        return Ok(());
    }
    if !target.is_dir() {
        return Err(WriteError::NotADirectory(dir.to_string()));
    }
    for entry in std::fs::read_dir(target).map_err(io("read", target))? {
        let name = entry.map_err(io("read", target))?.file_name();
        if !OURS.iter().any(|o| name.to_str() == Some(*o)) {
            return Err(WriteError::Foreign {
                dir: dir.to_string(),
                file: name.to_string_lossy().into_owned(),
            });
        }
    }
    Ok(())
}

/// Writes every file into the new directory `tmp`; scripts are made executable.
fn fill(tmp: &Path, launch: &Launch, plan: Option<String>) -> std::io::Result<()> {
    std::fs::create_dir(tmp)?;
    let plan = plan.map(|text| ("plan.json".to_string(), text));
    for (name, text) in launch
        .files
        .iter()
        .map(|(n, t)| (n.clone(), t.clone()))
        .chain(plan)
    {
        let path = tmp.join(&name);
        std::fs::write(&path, text)?;
        #[cfg(unix)]
        if name.ends_with(".sh") {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        }
    }
    Ok(())
}

/// What was made, for a terminal: the framework, the arguments one per line, and the files
/// (written to `out`, or how to write them).
pub fn summary_text(launch: &Launch, out: Option<&str>) -> String {
    let mut o = format!(
        "{} ({})\n\narguments\n",
        launch.framework, launch.framework_version
    );
    for line in shell_lines(&launch.args) {
        o += &format!("  {line}\n");
    }
    let names: Vec<&str> = launch.files.keys().map(String::as_str).collect();
    match out {
        Some(dir) => o += &format!("\nwritten to {dir}: {}\n", names.join(", ")),
        None => {
            o += &format!(
                "\nfiles: {} (write them with --out DIR)\n",
                names.join(", ")
            )
        }
    }
    o
}
