//! Atomic file writes: a temp file beside the target, then a rename; bounded reads of small
//! text files.
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

/// The most bytes a preset, sweep or summary file may have (the largest preset is about 1 KiB).
pub const MAX_TEXT_FILE: u64 = 1 << 20;

/// Reads a text file (`what`, e.g. "preset") of at most `max` bytes: a FIFO or a device is
/// refused before it is opened (it would block, or `/dev/zero` would be read for gigabytes),
/// and so is a larger file.
pub fn read_text(path: &Path, what: &str, max: u64) -> Result<String> {
    use std::io::Read as _;
    let context = format!("cannot read {what}");
    let meta = std::fs::metadata(path).map_err(|e| Error::io(&context, path, e))?;
    let refuse = |why: String| Error::RunDir {
        message: format!("{context}: {why}"),
        path: path.to_path_buf(),
    };
    if !meta.is_file() {
        return Err(refuse("not a regular file".into()));
    }
    if meta.len() > max {
        return Err(refuse(format!("larger than {max} bytes")));
    }
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(max).read_to_string(&mut text))
        .map_err(|e| Error::io(&context, path, e))?;
    Ok(text)
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

    /// `check /dev/zero` read 4 GB before failing; a FIFO would block for ever.
    #[test]
    fn text_reads_refuse_devices_and_large_files() {
        let err = read_text(Path::new("/dev/zero"), "preset", MAX_TEXT_FILE)
            .unwrap_err()
            .to_string();
        assert_eq!(err, "cannot read preset: not a regular file: /dev/zero");
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.toml");
        std::fs::write(&big, vec![b'#'; MAX_TEXT_FILE as usize + 1]).unwrap();
        let err = read_text(&big, "preset", MAX_TEXT_FILE)
            .unwrap_err()
            .to_string();
        assert!(err.contains("larger than 1048576 bytes"), "{err}");
        std::fs::write(&big, "schema = 1\n").unwrap();
        assert_eq!(
            read_text(&big, "preset", MAX_TEXT_FILE).unwrap(),
            "schema = 1\n"
        );
    }

    #[test]
    fn failed_write_leaves_old_file_and_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.json");
        write_bytes(&path, b"old").unwrap();
        let err = write_atomically(&path, |tmp| {
            std::fs::write(tmp, b"half").unwrap();
            Err(Error::Cancelled)
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
