//! Text corpora for language modelling, read within a byte budget and split by file.
//!
//! A corpus is a UTF-8 file, a folder of text files, or one of the built-in sources that a
//! machine which built attnlab already holds, so nothing is downloaded and no text is copied into
//! the repository:
//! - `cargo-registry`: the Rust sources under `$CARGO_HOME/registry/src` (default
//!   `~/.cargo/registry/src`), the analogue of the Rpe paper's "Github" corpus;
//! - `rust-docs`: rustup's HTML documentation, `$(rustc --print sysroot)/share/doc/rust`;
//! - `generated`: seeded synthetic prose, the fallback where neither exists;
//! - `auto`: the first of those three that exists and holds text.
//!
//! Large corpora are never loaded whole. The files are listed (names only), put in a seeded
//! order, and read one by one until the split's budget is full (each file contributes at most
//! [`MAX_FILE_BYTES`]); a file goes to validation or training by a seeded hash of its path, so
//! validation text is unseen in training. Files that are not UTF-8 (or hold NUL bytes) are skipped.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use crate::rng::{self, Rng, SliceRandom};
use crate::{Error, Result};

/// At most this many bytes are taken from one file, so one huge file cannot fill a split.
pub const MAX_FILE_BYTES: usize = 64 * 1024;

/// Where the text comes from, resolved from the preset's `task.corpus` string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CorpusSource {
    /// A file or folder; in a folder, every file whose extension is in `extensions` (any file
    /// when empty).
    Path {
        path: PathBuf,
        extensions: Vec<&'static str>,
    },
    Generated,
}

/// Which split a read is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Train,
    Validation,
}

/// The cargo registry's source folder, if it exists.
pub fn cargo_registry() -> Option<PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))?;
    Some(home.join("registry").join("src")).filter(|p| p.is_dir())
}

/// rustup's HTML documentation folder, if `rustc` is on the path and the docs are installed.
pub fn rust_docs() -> Option<PathBuf> {
    let output = std::process::Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .ok()?;
    let sysroot = String::from_utf8(output.stdout).ok()?;
    Some(Path::new(sysroot.trim()).join("share/doc/rust")).filter(|p| p.is_dir())
}

impl CorpusSource {
    /// Resolves `name` (`auto`, `cargo-registry`, `rust-docs`, `generated`, or a path); a
    /// built-in source that is missing here is an error naming where it was looked for.
    pub fn resolve(name: &str) -> Result<Self> {
        let missing = |what: &str| {
            Error::preset(
                "task.corpus",
                name,
                format!("{what} was not found on this machine; use auto, generated or a path"),
            )
        };
        let registry = |path| Self::Path {
            path,
            extensions: vec!["rs"],
        };
        let docs = |path| Self::Path {
            path,
            extensions: vec!["html"],
        };
        let usable = |source: &Self| source.check().is_ok();
        let source = match name {
            "auto" => cargo_registry()
                .map(registry)
                .filter(usable)
                .or_else(|| rust_docs().map(docs).filter(usable))
                .unwrap_or(Self::Generated),
            "cargo-registry" => cargo_registry()
                .map(registry)
                .ok_or_else(|| missing("$CARGO_HOME/registry/src"))?,
            "rust-docs" => rust_docs()
                .map(docs)
                .ok_or_else(|| missing("$(rustc --print sysroot)/share/doc/rust"))?,
            "generated" => Self::Generated,
            path if Path::new(path).exists() => Self::Path {
                path: path.into(),
                extensions: Vec::new(),
            },
            path => {
                return Err(Error::preset(
                    "task.corpus",
                    path,
                    "is neither a built-in corpus (auto, cargo-registry, rust-docs, generated) \
                     nor an existing file or folder",
                ));
            }
        };
        source.check()?;
        Ok(source)
    }

    /// Refuses a file or folder that no text can be read from, so that `attnlab check` (and
    /// training, before it starts) says why: an empty file, a folder without a non-empty file
    /// of the kind read, or a FIFO or a device, which had passed `check` and then failed
    /// training with "cannot list corpus: Not a directory" (or would block it).
    fn check(&self) -> Result<()> {
        let Self::Path { path, extensions } = self else {
            return Ok(());
        };
        let refuse = |why: String| Err(Error::preset("task.corpus", path.display(), why));
        let meta = std::fs::metadata(path).map_err(|e| Error::io("cannot read corpus", path, e))?;
        if meta.is_file() && meta.len() == 0 {
            refuse("is an empty file".into())
        } else if meta.is_dir() && !has_text_to_read(path, extensions)? {
            let files = file_kinds(extensions);
            refuse(format!("is a folder with no non-empty {files} in it"))
        } else if !meta.is_file() && !meta.is_dir() {
            refuse(
                "is not a regular file or folder (a FIFO, a socket or a device): a corpus is \
                 a UTF-8 text file or a folder of them"
                    .into(),
            )
        } else {
            Ok(())
        }
    }

    /// What the text is, in words for a run's summary and the window: the folder or file and
    /// which files of it, or the generated prose (so a run of `auto` says what it found).
    pub fn describe(&self) -> String {
        match self {
            Self::Generated => "generated: seeded synthetic prose".into(),
            Self::Path { path, extensions } if extensions.is_empty() => path.display().to_string(),
            Self::Path { path, extensions } => {
                format!("{} ({})", path.display(), file_kinds(extensions))
            }
        }
    }

    /// Up to `budget` bytes of text of `part`, files in seeded order, joined by newlines.
    pub fn read(&self, part: Part, budget: usize, seed: u64, val_percent: u32) -> Result<String> {
        match self {
            Self::Generated => Ok(generated_text(part, budget, seed)),
            Self::Path { path, .. } if path.is_file() => {
                single_file_part(path, part, budget, val_percent)
            }
            Self::Path { path, extensions } => {
                let mut files = Vec::new();
                list_files(path, extensions, &mut files)?;
                let mut files: Vec<PathBuf> = files
                    .into_iter()
                    .filter(|f| file_part(path, f, seed, val_percent) == part)
                    .collect();
                files.sort();
                files.shuffle(&mut rng::stream(seed, "corpus-order"));
                let text = read_files(&files, budget);
                if text.is_empty() {
                    return Err(Error::Data(format!(
                        "the corpus has no readable UTF-8 text for the {part:?} split \
                         (task.val_percent = {val_percent}): {}",
                        path.display()
                    )));
                }
                Ok(text)
            }
        }
    }
}

/// A seeded hash of the path (relative to the corpus root) decides the split, so adding files
/// never moves another file between splits.
fn file_part(root: &Path, file: &Path, seed: u64, val_percent: u32) -> Part {
    let relative = file.strip_prefix(root).unwrap_or(file);
    let draw: u32 = rng::stream(seed, &relative.to_string_lossy()).random_range(0..100);
    if draw < val_percent {
        Part::Validation
    } else {
        Part::Train
    }
}

/// The files a folder corpus reads, in words: `*.rs files`, or `files` for any.
fn file_kinds(extensions: &[&str]) -> String {
    match extensions {
        [] => "files".into(),
        _ => {
            let kinds: Vec<String> = extensions.iter().map(|e| format!("*.{e}")).collect();
            format!("{} files", kinds.join(", "))
        }
    }
}

/// Every file under `dir` with one of `extensions`, recursively, without reading them.
fn list_files(dir: &Path, extensions: &[&str], out: &mut Vec<PathBuf>) -> Result<()> {
    visit_files(dir, extensions, &mut |file| {
        out.push(file);
        ControlFlow::Continue(())
    })
    .map(|_| ())
}

/// Whether `dir` holds a non-empty file with one of `extensions`; stops at the first (the
/// cargo registry holds tens of thousands).
fn has_text_to_read(dir: &Path, extensions: &[&str]) -> Result<bool> {
    let non_empty = |file: PathBuf| std::fs::metadata(file).is_ok_and(|m| m.len() > 0);
    let found = visit_files(dir, extensions, &mut |file| match non_empty(file) {
        true => ControlFlow::Break(()),
        false => ControlFlow::Continue(()),
    })?;
    Ok(found.is_break())
}

/// Calls `visit` on every file under `dir` with one of `extensions`, recursively, until it
/// breaks. The corpus folder itself must be readable; a subfolder that is not is skipped, as
/// files that are not text are, rather than failing the whole corpus.
fn visit_files(
    dir: &Path,
    extensions: &[&str],
    visit: &mut dyn FnMut(PathBuf) -> ControlFlow<()>,
) -> Result<ControlFlow<()>> {
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io("cannot list corpus", dir, e))?;
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let flow = if kind.is_dir() {
            visit_files(&path, extensions, visit).unwrap_or(ControlFlow::Continue(()))
        } else if kind.is_file() && has_extension(&path, extensions) {
            visit(path)
        } else {
            ControlFlow::Continue(())
        };
        if flow.is_break() {
            return Ok(flow);
        }
    }
    Ok(ControlFlow::Continue(()))
}

fn has_extension(path: &Path, extensions: &[&str]) -> bool {
    extensions.is_empty()
        || path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| extensions.contains(&e))
}

/// The UTF-8 text of the files, in order, until `budget` bytes (files that are not text are skipped).
fn read_files(files: &[PathBuf], budget: usize) -> String {
    let mut text = String::new();
    for file in files {
        if text.len() >= budget {
            break;
        }
        let want = (budget - text.len()).min(MAX_FILE_BYTES);
        if let Some(part) = read_prefix(file, want) {
            text.push_str(&part);
            text.push('\n');
        }
    }
    text
}

/// The first `max` bytes of `file` as text, cut at a character boundary; `None` when not text.
fn read_prefix(file: &Path, max: usize) -> Option<String> {
    use std::io::Read;
    let mut bytes = Vec::with_capacity(max);
    std::fs::File::open(file)
        .ok()?
        .take(max as u64)
        .read_to_end(&mut bytes)
        .ok()?;
    if bytes.contains(&0) {
        return None;
    }
    match String::from_utf8(bytes) {
        Ok(text) => Some(text),
        // A cut through a multi-byte character at the end is fine; anything else is not text.
        Err(e) if e.utf8_error().error_len().is_none() => {
            let valid = e.utf8_error().valid_up_to();
            let mut bytes = e.into_bytes();
            bytes.truncate(valid);
            String::from_utf8(bytes).ok()
        }
        Err(_) => None,
    }
}

/// A single file is split by position: its last `val_percent` per cent is validation.
fn single_file_part(path: &Path, part: Part, budget: usize, val_percent: u32) -> Result<String> {
    let size = std::fs::metadata(path)
        .map_err(|e| Error::io("cannot read corpus", path, e))?
        .len() as usize;
    let val_start = size - size * val_percent as usize / 100;
    let (start, end) = match part {
        Part::Train => (0, val_start),
        Part::Validation => (val_start, size),
    };
    use std::io::{Read, Seek, SeekFrom};
    let mut file =
        std::fs::File::open(path).map_err(|e| Error::io("cannot open corpus", path, e))?;
    file.seek(SeekFrom::Start(start as u64))
        .map_err(|e| Error::io("cannot read corpus", path, e))?;
    let mut bytes = Vec::new();
    file.take((end - start).min(budget) as u64)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io("cannot read corpus", path, e))?;
    // Cutting at a byte offset may split a character at either end: drop the partial ones.
    let text = String::from_utf8_lossy(&bytes);
    let text = text.trim_matches('\u{FFFD}');
    if bytes.contains(&0) || text.contains('\u{FFFD}') {
        let why = "not UTF-8 text (NUL bytes or invalid UTF-8)";
        let cause = std::io::Error::new(std::io::ErrorKind::InvalidData, why);
        return Err(Error::io("cannot read corpus", path, cause));
    }
    Ok(text.to_string())
}

/// Seeded synthetic prose: sentences of words from a Zipf-distributed lexicon, where each
/// paragraph reuses a few "topic" words, so both local and paragraph-range structure exist.
fn generated_text(part: Part, budget: usize, seed: u64) -> String {
    let mut lexicon_rng = rng::stream(seed, "corpus-lexicon");
    let letters = b"etaoinshrdlcumwfgypbvkjxqz";
    let lexicon: Vec<String> = (0..2000)
        .map(|_| {
            let len = lexicon_rng.random_range(2..9);
            (0..len)
                .map(|_| {
                    // The smaller of two uniform draws favours the frequent letters.
                    let a = lexicon_rng.random_range(0..letters.len());
                    let b = lexicon_rng.random_range(0..letters.len());
                    letters[a.min(b)] as char
                })
                .collect()
        })
        .collect();
    let mut r = rng::stream(seed, &format!("corpus-text-{part:?}"));
    let zipf = |r: &mut rng::AttnRng| {
        let u: f64 = r.random_range(0.0..1.0);
        ((lexicon.len() as f64).powf(u) as usize - 1).min(lexicon.len() - 1)
    };
    let mut text = String::with_capacity(budget + 64);
    while text.len() < budget {
        let topic: Vec<usize> = (0..4).map(|_| zipf(&mut r)).collect();
        for _ in 0..r.random_range(3..8) {
            for w in 0..r.random_range(4..14) {
                let word = if r.random_bool(0.2) {
                    topic[r.random_range(0..topic.len())]
                } else {
                    zipf(&mut r)
                };
                if w > 0 {
                    text.push(' ');
                }
                text.push_str(&lexicon[word]);
            }
            text.push_str(". ");
        }
        text.push('\n');
    }
    text.truncate(budget);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folder_split_is_by_file_and_deterministic() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..40 {
            std::fs::write(dir.path().join(format!("f{i}.txt")), format!("file {i}\n")).unwrap();
        }
        std::fs::write(dir.path().join("binary.txt"), [0u8, 1, 2]).unwrap();
        let source = CorpusSource::resolve(dir.path().to_str().unwrap()).unwrap();
        let train = source.read(Part::Train, 10_000, 1, 25).unwrap();
        let val = source.read(Part::Validation, 10_000, 1, 25).unwrap();
        assert_eq!(val, source.read(Part::Validation, 10_000, 1, 25).unwrap());
        let lines = |t: &str| {
            t.lines()
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect::<Vec<_>>()
        };
        let (train, val) = (lines(&train), lines(&val));
        assert_eq!(
            train.len() + val.len(),
            40,
            "every text file once, binary skipped"
        );
        assert!(
            val.iter().all(|l| !train.contains(l)),
            "no file in both splits"
        );
        assert!(!val.is_empty() && val.len() < 20);
    }

    #[test]
    fn budget_bounds_the_read() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..10 {
            std::fs::write(dir.path().join(format!("{i}.rs")), "x".repeat(1000)).unwrap();
        }
        let source = CorpusSource::resolve(dir.path().to_str().unwrap()).unwrap();
        let text = source.read(Part::Train, 2500, 0, 0).unwrap();
        assert!(text.len() <= 2500 + 1, "{}", text.len());
    }

    #[test]
    fn single_file_keeps_its_tail_for_validation() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("book.txt");
        std::fs::write(&file, "a".repeat(90) + &"b".repeat(10)).unwrap();
        let source = CorpusSource::resolve(file.to_str().unwrap()).unwrap();
        assert_eq!(
            source.read(Part::Validation, 100, 0, 10).unwrap(),
            "b".repeat(10)
        );
        assert_eq!(
            source.read(Part::Train, 100, 0, 10).unwrap(),
            "a".repeat(90)
        );
    }

    /// A run's summary names what `auto` found: the folder and which of its files.
    #[test]
    fn a_source_describes_itself() {
        assert_eq!(
            CorpusSource::Generated.describe(),
            "generated: seeded synthetic prose"
        );
        let registry = CorpusSource::Path {
            path: "/home/u/.cargo/registry/src".into(),
            extensions: vec!["rs"],
        };
        assert_eq!(
            registry.describe(),
            "/home/u/.cargo/registry/src (*.rs files)"
        );
        let file = CorpusSource::Path {
            path: "wiki.txt".into(),
            extensions: Vec::new(),
        };
        assert_eq!(file.describe(), "wiki.txt");
    }

    #[test]
    fn generated_text_is_seeded_and_fills_the_budget() {
        let a = generated_text(Part::Train, 5000, 3);
        assert_eq!(a, generated_text(Part::Train, 5000, 3));
        assert_ne!(a, generated_text(Part::Validation, 5000, 3));
        assert_eq!(a.len(), 5000);
    }

    #[test]
    fn a_binary_file_is_not_a_corpus() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.bin");
        std::fs::write(&path, [0u8, 159, 146, 150, 0, 1, 2, 255, 254].repeat(100)).unwrap();
        let err = single_file_part(&path, Part::Train, 1 << 20, 10)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("not UTF-8 text") && err.contains("model.bin"),
            "{err}"
        );
    }

    /// An empty file, a folder with nothing to read and a FIFO had passed `attnlab check`
    /// and failed only in training ("cannot list corpus: Not a directory" for the FIFO).
    #[test]
    fn a_corpus_without_text_is_refused_naming_why() {
        let dir = tempfile::tempdir().unwrap();
        let refusal = |path: &Path| {
            let name = path.to_str().unwrap();
            let err = CorpusSource::resolve(name).unwrap_err().to_string();
            assert!(err.contains("task.corpus") && err.contains(name), "{err}");
            err
        };
        let empty = dir.path().join("empty.txt");
        std::fs::write(&empty, "").unwrap();
        assert!(refusal(&empty).contains("is an empty file"));
        let folder = dir.path().join("texts");
        std::fs::create_dir_all(folder.join("sub")).unwrap();
        std::fs::write(folder.join("sub/empty.txt"), "").unwrap();
        let err = refusal(&folder);
        assert!(err.contains("a folder with no non-empty files"), "{err}");
        let registry = CorpusSource::Path {
            path: dir.path().into(),
            extensions: vec!["rs"],
        };
        std::fs::write(dir.path().join("notes.txt"), "text").unwrap();
        let err = registry.check().unwrap_err().to_string();
        assert!(err.contains("no non-empty *.rs files"), "{err}");
        std::fs::write(folder.join("sub/a.txt"), "text").unwrap();
        assert!(CorpusSource::resolve(folder.to_str().unwrap()).is_ok());
        #[cfg(unix)]
        {
            let fifo = dir.path().join("fifo");
            let made = std::process::Command::new("mkfifo").arg(&fifo).status();
            assert!(made.unwrap().success());
            assert!(refusal(&fifo).contains("not a regular file or folder"));
        }
    }

    #[test]
    fn unknown_corpus_names_the_key() {
        let err = CorpusSource::resolve("/no/such/corpus")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("task.corpus") && err.contains("/no/such/corpus"),
            "{err}"
        );
    }
}
