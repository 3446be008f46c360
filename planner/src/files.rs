//! Writing the files the commands produce: atomically, so that a failure never leaves a
//! partial file behind.

use std::path::Path;

/// A file that could not be written: its path and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot write '{path}': {reason}")]
pub struct WriteError {
    /// The path asked for.
    pub path: String,
    /// Why not (the operating system's words).
    pub reason: String,
}

/// Writes `bytes` to `path` atomically: a temporary file in the same directory, then a rename.
pub fn write_atomic(path: &str, bytes: &[u8]) -> Result<(), WriteError> {
    let fail = |reason: String| WriteError {
        path: path.to_string(),
        reason,
    };
    let target = Path::new(path);
    let dir = target
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or_else(|| Path::new("."));
    let name = target
        .file_name()
        .ok_or_else(|| fail("not a file path".to_string()))?;
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    std::fs::write(&tmp, bytes).map_err(|e| fail(e.to_string()))?;
    std::fs::rename(&tmp, target).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        fail(e.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_whole_files_and_names_the_path_it_cannot_write() {
        let dir = std::env::temp_dir().join(format!("autopp-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let path = dir.join("a.txt");
        let path = path.to_string_lossy();
        write_atomic(&path, b"abc").expect("written");
        assert_eq!(std::fs::read(&*path).expect("read"), b"abc");
        let bad = dir.join("missing").join("b.txt");
        let e = write_atomic(&bad.to_string_lossy(), b"x").expect_err("no such directory");
        assert!(e.to_string().starts_with("cannot write '"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
