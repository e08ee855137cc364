//! Atomic file writes: a temp file beside the target, then a rename.
//!
//! A crash or a kill mid-write leaves either the old file or the new one, never half of one.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// The temp path used while `path` is being written.
fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}.tmp", std::process::id()));
    path.with_file_name(name)
}

/// Calls `write` with a temp path, then renames it over `path`.
pub fn write_atomically(path: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let tmp = temp_path(path);
    let result = write(&tmp).and_then(|()| {
        std::fs::rename(&tmp, path).map_err(|e| Error::io("cannot move file into place", path, e))
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Writes `bytes` to `path` atomically.
pub fn write_bytes(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomically(path, |tmp| {
        let mut file =
            std::fs::File::create(tmp).map_err(|e| Error::io("cannot create file", tmp, e))?;
        file.write_all(bytes)
            .and_then(|()| file.sync_all())
            .map_err(|e| Error::io("cannot write file", tmp, e))
    })
}

/// Serialises `value` as pretty JSON and writes it atomically.
pub fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<()> {
    let mut text = serde_json::to_string_pretty(value)?;
    text.push('\n');
    write_bytes(path, text.as_bytes())
}

/// Appends one line to `path` (created if missing) and flushes it: a crash loses at most that line.
pub fn append_line(path: &Path, line: &str) -> Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| Error::io("cannot open for appending", path, e))?;
    file.write_all(format!("{line}\n").as_bytes())
        .and_then(|()| file.flush())
        .map_err(|e| Error::io("cannot append to", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_write_leaves_old_file_and_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.json");
        write_bytes(&path, b"old").unwrap();
        let err = write_atomically(&path, |tmp| {
            std::fs::write(tmp, b"half").unwrap();
            Err(Error::Other("boom".into()))
        });
        assert!(err.is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn append_adds_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.jsonl");
        append_line(&path, "1").unwrap();
        append_line(&path, "2").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "1\n2\n");
    }
}
