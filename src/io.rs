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

/// The length of `path`, which must be a regular file of at most `max` bytes: a FIFO or a
/// device is refused before it is opened (opening a FIFO blocks until a writer comes, and
/// `/dev/zero` would be read until memory runs out). `context` starts each error.
pub(crate) fn regular_file_len(path: &Path, context: &str, max: u64) -> Result<u64> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(context, path, e))?;
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
    Ok(meta.len())
}

/// Reads a text file (`what`, e.g. "preset") of at most `max` bytes, a regular file only
/// ([`regular_file_len`]).
pub fn read_text(path: &Path, what: &str, max: u64) -> Result<String> {
    use std::io::Read as _;
    let context = format!("cannot read {what}");
    let len = regular_file_len(path, &context, max)?;
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(len).read_to_string(&mut text))
        .map_err(|e| Error::io(&context, path, e))?;
    Ok(text)
}

/// Reads a whole binary file (`what`, e.g. "checkpoint"), a regular file only
/// ([`regular_file_len`]), no more than the size it had when it was opened.
pub fn read_bytes(path: &Path, what: &str) -> Result<Vec<u8>> {
    use std::io::Read as _;
    let context = format!("cannot read {what}");
    let len = regular_file_len(path, &context, u64::MAX)?;
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    std::fs::File::open(path)
        .and_then(|f| f.take(len).read_to_end(&mut bytes))
        .map_err(|e| Error::io(&context, path, e))?;
    Ok(bytes)
}

/// Refuses `path` if it exists and is not a regular file: appending to a FIFO blocks until a
/// reader comes.
fn refuse_special_file(path: &Path, context: &str) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(meta) if !meta.is_file() => Err(Error::RunDir {
            message: format!("{context}: not a regular file"),
            path: path.to_path_buf(),
        }),
        _ => Ok(()),
    }
}

/// Serialises `value` as pretty JSON and writes it atomically.
pub fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<()> {
    let mut text = serde_json::to_string_pretty(value)?;
    text.push('\n');
    write_bytes(path, text.as_bytes())
}

/// Appends one line to `path` (created if missing) and flushes it: a crash loses at most that line.
pub fn append_line(path: &Path, line: &str) -> Result<()> {
    append_bytes(path, format!("{line}\n").as_bytes())
}

/// Appends `bytes` to `path` (created if missing) in one write, and flushes them.
pub fn append_bytes(path: &Path, bytes: &[u8]) -> Result<()> {
    refuse_special_file(path, "cannot append to")?;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| Error::io("cannot open for appending", path, e))?;
    file.write_all(bytes)
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

    /// A FIFO in place of a run's file hung `eval` and `train --resume` (the read, or the open
    /// for appending, waits for the other end); `/dev/zero` was read to the memory cap.
    #[test]
    #[cfg(unix)]
    fn binary_reads_and_appends_refuse_fifos_and_devices() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("metrics.jsonl");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success());
        let err = append_line(&fifo, "{}").unwrap_err().to_string();
        assert!(
            err.starts_with("cannot append to: not a regular file"),
            "{err}"
        );
        let err = read_bytes(&fifo, "checkpoint").unwrap_err().to_string();
        assert!(
            err.starts_with("cannot read checkpoint: not a regular file"),
            "{err}"
        );
        let err = read_bytes(Path::new("/dev/zero"), "checkpoint").unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
        let file = dir.path().join("model.safetensors");
        std::fs::write(&file, b"bytes").unwrap();
        assert_eq!(read_bytes(&file, "checkpoint").unwrap(), b"bytes");
        append_line(&dir.path().join("new.jsonl"), "{}").unwrap();
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
