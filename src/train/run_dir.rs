//! Run folders: `runs/<YYYYmmdd-HHMMSS>-<name>/` with everything needed to analyse a run.
//!
//! | file | written |
//! |---|---|
//! | `preset.toml` | at start: the fully resolved preset |
//! | `metrics.jsonl` | one line per step and per evaluation, appended and flushed |
//! | `summary.json` | at start, at every evaluation, at the end |
//! | `model.safetensors` | at every evaluation, after each minute of training without one, and at the end (never with a NaN or infinite parameter) |
//! | `optimizer.safetensors` | with every checkpoint: AdamW's moments and the step, to resume the run |
//! | `attention/layer<L>.npy` | attention of a fixed batch of test rows, (B, H, Tq, Tk) f32 |
//! | `attention/index.json` | which layers, which rows (with MQAR ground truth), at which step |
//!
//! Every file but the append-only log is written atomically, so a killed run keeps everything
//! up to its last step.

use std::path::{Path, PathBuf};

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use super::{MetricRecord, Summary};
use crate::preset::Preset;
use crate::tasks::mqar::QueryTruth;
use crate::{Error, Result, io};

/// `attention/index.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttentionIndex {
    pub mechanism: String,
    pub encoding: String,
    /// Training step at which the matrices were captured.
    pub step: usize,
    pub layers: Vec<AttentionLayerFile>,
    pub examples: Vec<AttentionExample>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttentionLayerFile {
    pub layer: usize,
    pub file: String,
    /// (B, H, Tq, Tk)
    pub shape: Vec<usize>,
}

/// One captured test row.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttentionExample {
    /// Index of the row in the test split.
    pub row: usize,
    pub inputs: Vec<u32>,
    pub labels: Vec<i32>,
    pub queries: Vec<QueryTruth>,
}

/// The name of run folder `path` (`<time>-<name>`): the CLI names runs by it in legends and
/// tables, since unlike the preset's name it tells two runs of one preset apart (the window's
/// run list shows it while the folder is read).
pub fn folder_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |name| name.to_string_lossy().into_owned(),
    )
}

/// Whether `path` is hidden (its name starts with a dot): a run folder being filled
/// ([`RunDir::create`]), which scans for runs skip.
pub fn is_hidden(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|name| name.to_string_lossy().starts_with('.'))
}

/// A run folder on disk.
#[derive(Clone, Debug)]
pub struct RunDir {
    path: PathBuf,
}

impl RunDir {
    /// Creates `root/<time>-<slug>` (with a numeric suffix if that exists already), filled by
    /// `fill` (the preset and the first summary) under a temporary hidden name `.<name>.tmp`
    /// and then renamed into place: a folder that could not be filled (a full disk while
    /// writing `preset.toml`) is removed, not left behind for every command to reject. A
    /// process killed in between leaves the empty claimed folder and the hidden one; the sweep
    /// scans skip hidden folders.
    pub fn create(
        root: &Path,
        preset: &Preset,
        fill: impl FnOnce(&RunDir) -> Result<()>,
    ) -> Result<Self> {
        std::fs::create_dir_all(root)
            .map_err(|e| Error::io("cannot create runs folder", root, e))?;
        let path = Self::claim_name(root, preset)?;
        let temp = root.join(format!(".{}.tmp", folder_name(&path)));
        let dir = Self::create_folder(&temp).inspect_err(|_| {
            let _ = std::fs::remove_dir(&path);
        })?;
        let filled = fill(&dir).and_then(|()| {
            // Over the claimed folder, which is empty: POSIX rename replaces an empty one.
            std::fs::rename(&temp, &path)
                .map_err(|e| Error::io("cannot move run folder into place", &path, e))
        });
        if let Err(e) = filled {
            let _ = std::fs::remove_dir_all(&temp);
            let _ = std::fs::remove_dir(&path);
            return Err(e);
        }
        Ok(Self { path })
    }

    /// An empty folder `root/<time>-<slug>[-n]` that no other run has, created to hold the name.
    fn claim_name(root: &Path, preset: &Preset) -> Result<PathBuf> {
        let stamp = chrono::Local::now().format("%Y%m%d-%H%M%S");
        let base = format!("{stamp}-{}", preset.slug());
        for n in 0..1000 {
            let name = if n == 0 {
                base.clone()
            } else {
                format!("{base}-{n}")
            };
            let path = root.join(name);
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(path),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::io("cannot create run folder", path, e)),
            }
        }
        Err(Error::RunDir {
            message: format!("too many runs named {base}"),
            path: root.to_path_buf(),
        })
    }

    /// A new run folder at `path` with its `attention/` folder.
    fn create_folder(path: &Path) -> Result<Self> {
        std::fs::create_dir(path).map_err(|e| Error::io("cannot create run folder", path, e))?;
        let attention = path.join("attention");
        std::fs::create_dir(&attention)
            .map_err(|e| Error::io("cannot create folder", &attention, e))?;
        Ok(Self {
            path: path.to_path_buf(),
        })
    }

    /// An existing run folder (it must hold a `preset.toml`).
    pub fn open(path: &Path) -> Result<Self> {
        if !path.join("preset.toml").is_file() {
            return Err(Error::RunDir {
                message: "not a run folder (no preset.toml)".into(),
                path: path.to_path_buf(),
            });
        }
        Ok(Self {
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn checkpoint_path(&self) -> PathBuf {
        self.path.join("model.safetensors")
    }

    /// AdamW's state at the checkpoint, for resuming (see `Trainer::save_optimizer`).
    pub fn optimizer_path(&self) -> PathBuf {
        self.path.join("optimizer.safetensors")
    }

    /// Refuses a checkpoint that cannot continue the run exactly: one without optimiser state
    /// (killed before its first checkpoint, or saved by an attnlab that could not resume), or
    /// weights of another step than it (killed between the two writes). The steps are read
    /// from the files' headers; folders saved before they were recorded compare modification
    /// times (the optimiser state goes second), which a copy file by file can reorder. A file
    /// whose header does not read is refused with why.
    pub fn check_resumable_checkpoint(&self) -> Result<()> {
        let refuse = |why: &str| {
            Err(Error::RunDir {
                message: format!("cannot resume: {why}"),
                path: self.path.clone(),
            })
        };
        // A file that is there but does not read (not a regular file, a torn header) is that
        // error; a missing one is judged below.
        let step = |path: &Path| match crate::params::saved_step(path) {
            Err(Error::Io { cause, .. }) if cause.kind() == std::io::ErrorKind::NotFound => {
                Ok(None)
            }
            Err(e) => Err(Error::RunDir {
                message: format!("cannot resume: {}: {e}", folder_name(path)),
                path: self.path.clone(),
            }),
            other => other,
        };
        match (
            step(&self.checkpoint_path())?,
            step(&self.optimizer_path())?,
        ) {
            (Some(weights), Some(state)) if weights == state => return Ok(()),
            (Some(weights), Some(state)) => {
                return refuse(&format!(
                    "model.safetensors holds step {weights} and optimizer.safetensors step \
                     {state} (the run was killed between writing them)"
                ));
            }
            _ => {}
        }
        let modified = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified()).ok();
        match (
            modified(&self.checkpoint_path()),
            modified(&self.optimizer_path()),
        ) {
            (Some(weights), Some(state)) if weights <= state => Ok(()),
            (Some(_), Some(_)) => refuse(
                "model.safetensors is newer than optimizer.safetensors (the run was killed \
                 between writing them)",
            ),
            _ => refuse(
                "no checkpoint with optimizer state (model.safetensors and \
                 optimizer.safetensors); the run ended before its first one",
            ),
        }
    }

    /// Names the run `name` in its `preset.toml` and `summary.json` (each written atomically),
    /// which the run list, legends and `sweep collect` read. The folder keeps its name: sweeps
    /// and other tools find the run by its path. Refused when `name` is not one a preset may
    /// have ([`crate::preset::check_name`]).
    pub fn rename(&self, name: &str) -> Result<()> {
        crate::preset::check_name(name)?;
        let mut preset = self.read_preset()?;
        let mut summary = self.read_summary()?;
        preset.name = name.to_string();
        summary.name = name.to_string();
        self.write_preset(&preset)?;
        self.write_summary(&summary)
    }

    pub fn write_preset(&self, preset: &Preset) -> Result<()> {
        preset.save(&self.path.join("preset.toml"))
    }

    pub fn read_preset(&self) -> Result<Preset> {
        Preset::load(&self.path.join("preset.toml"), &[])
    }

    /// The run's preset with `overrides` applied as `--set` applies them (to evaluate the
    /// trained model otherwise, e.g. RoPE with ReRoPE). Settings that default to the training
    /// length (ReRoPE's log-n L, DIET-REL's table) keep the run's, whatever `task.seq_len` the
    /// overrides set.
    pub fn preset_with(&self, overrides: &[String]) -> Result<Preset> {
        let origin = self.path.join("preset.toml");
        let text = io::read_text(&origin, "preset", io::MAX_TEXT_FILE)?;
        let trained = Preset::parse(&text, &[], &origin)?;
        let mut preset = Preset::parse(&text, overrides, &origin)?;
        preset.encoding = preset.encoding.at_training_length(trained.task.seq_len());
        Ok(preset)
    }

    /// Loads the run's last checkpoint into `params`, on which a model of (a variant of) the
    /// run's preset was built: every analysis, evaluation and the window load runs this way.
    pub fn load_checkpoint(&self, params: &crate::params::Params) -> Result<()> {
        params.load(&self.checkpoint_path())
    }

    pub fn append_metric(&self, record: &MetricRecord) -> Result<()> {
        io::append_line(
            &self.path.join("metrics.jsonl"),
            &serde_json::to_string(record)?,
        )
    }

    /// Every complete line of `metrics.jsonl`; a torn last line (a crash mid-write) is skipped.
    pub fn read_metrics(&self) -> Result<Vec<MetricRecord>> {
        let path = self.path.join("metrics.jsonl");
        let text = match io::read_text(&path, "metrics", u64::MAX) {
            Ok(text) => text,
            Err(Error::Io { cause, .. }) if cause.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Vec::new());
            }
            Err(e) => return Err(e),
        };
        Ok(text
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect())
    }

    /// Drops the lines of `metrics.jsonl` logged after step `step` (and a torn last line):
    /// a run resumed from a checkpoint at `step` logs those steps again.
    pub fn truncate_metrics(&self, step: usize) -> Result<()> {
        let path = self.path.join("metrics.jsonl");
        let text = match io::read_text(&path, "metrics", u64::MAX) {
            Ok(text) => text,
            Err(Error::Io { cause, .. }) if cause.kind() == std::io::ErrorKind::NotFound => {
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let kept: String = text
            .lines()
            .filter(|line| {
                serde_json::from_str::<MetricRecord>(line).is_ok_and(|r| r.step() <= step)
            })
            .map(|line| format!("{line}\n"))
            .collect();
        io::write_bytes(&path, kept.as_bytes())
    }

    pub fn write_summary(&self, summary: &Summary) -> Result<()> {
        io::write_json(&self.path.join("summary.json"), summary)
    }

    pub fn read_summary(&self) -> Result<Summary> {
        let path = self.path.join("summary.json");
        let text = io::read_text(&path, "summary", io::MAX_TEXT_FILE)?;
        serde_json::from_str(&text).map_err(|e| Error::RunDir {
            message: format!("malformed summary ({e})"),
            path,
        })
    }

    /// Writes each layer's attention as `.npy`, then the index that names them.
    pub fn write_attention(&self, index: &AttentionIndex, tensors: &[Tensor]) -> Result<()> {
        for (entry, tensor) in index.layers.iter().zip(tensors) {
            let path = self.path.join("attention").join(&entry.file);
            io::write_bytes(&path, &npy_f32(tensor)?)?;
        }
        io::write_json(&self.path.join("attention").join("index.json"), index)
    }

    pub fn read_attention_index(&self) -> Result<AttentionIndex> {
        let path = self.path.join("attention").join("index.json");
        let text = io::read_text(&path, "attention index", MAX_INDEX_BYTES)?;
        serde_json::from_str(&text).map_err(|e| Error::RunDir {
            message: format!("malformed attention index ({e})"),
            path,
        })
    }

    /// The saved attention of one layer as plain numbers.
    pub fn read_attention_weights(
        &self,
        entry: &AttentionLayerFile,
    ) -> Result<crate::attention::AttentionWeights> {
        crate::attention::AttentionWeights::from_tensor(entry.layer, &self.read_attention(entry)?)
    }

    /// The saved attention of one layer, (B, H, Tq, Tk), on the CPU. The header is checked
    /// against the file's size first: candle allocates the shape a header claims before reading.
    pub fn read_attention(&self, entry: &AttentionLayerFile) -> Result<Tensor> {
        let path = self.path.join("attention").join(&entry.file);
        let bad = |message: String| Error::RunDir {
            message,
            path: path.clone(),
        };
        // The index names a file in the `attention` folder, never a path out of it.
        if Path::new(&entry.file).file_name() != Some(std::ffi::OsStr::new(&entry.file)) {
            return Err(bad(format!(
                "the attention index names {:?}, not a file of the attention folder",
                entry.file
            )));
        }
        check_npy_size(&path)
            .map_err(|why| bad(format!("cannot read attention matrix ({why})")))?;
        let weights = Tensor::read_npy(&path)
            .map_err(|e| bad(format!("cannot read attention matrix ({e})")))?;
        // 0·w is NaN exactly where w is not finite; the analyses would average it silently.
        let poisoned = weights
            .affine(0.0, 0.0)?
            .sum_all()?
            .to_dtype(candle_core::DType::F32)?
            .to_scalar::<f32>()?;
        if !poisoned.is_finite() {
            return Err(bad("the attention matrix holds NaN or infinity".into()));
        }
        Ok(weights)
    }
}

/// The largest `attention/index.json`: at most 256 rows of 65,536 tokens with labels and
/// ground truth, written as JSON.
const MAX_INDEX_BYTES: u64 = 1 << 30;

/// The longest `.npy` header read (numpy writes a few hundred bytes).
const MAX_NPY_HEADER: usize = 1 << 16;

/// Refuses an `.npy` file that is not a regular file (a FIFO would block the read) or whose
/// header claims more or fewer bytes of data than the file holds.
fn check_npy_size(path: &Path) -> std::result::Result<(), String> {
    use std::io::Read as _;
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    let mut head = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_NPY_HEADER as u64).read_to_end(&mut head))
        .map_err(|e| e.to_string())?;
    let claimed = npy_claimed_len(&head)?;
    if claimed != Some(meta.len()) {
        return Err(format!(
            "its header describes {} bytes but the file holds {}",
            claimed.map_or("more than 2^64".into(), |n| n.to_string()),
            meta.len()
        ));
    }
    Ok(())
}

/// The file size an `.npy` header describes (header plus shape × item size); `None` when that
/// overflows. `head` is the file's start, header included.
fn npy_claimed_len(head: &[u8]) -> std::result::Result<Option<u64>, String> {
    let malformed = || "malformed .npy header".to_string();
    if !head.starts_with(b"\x93NUMPY") || head.len() < 10 {
        return Err("not an .npy file".into());
    }
    let (len, start) = match head[6] {
        1 => (u16::from_le_bytes([head[8], head[9]]) as usize, 10),
        2 | 3 if head.len() >= 12 => {
            let len = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
            (len as usize, 12)
        }
        v => return Err(format!(".npy version {v} is not supported")),
    };
    let header = head.get(start..start + len).ok_or_else(malformed)?;
    let header = std::str::from_utf8(header).map_err(|_| malformed())?;
    let after = |key: &str| header.split_once(key).map(|(_, rest)| rest);
    let descr = after("'descr':")
        .and_then(|rest| rest.split('\'').nth(1))
        .ok_or_else(malformed)?;
    let item: u64 = descr
        .trim_start_matches(|c: char| !c.is_ascii_digit())
        .parse()
        .map_err(|_| malformed())?;
    let dims = after("'shape':")
        .and_then(|rest| rest.split_once('('))
        .and_then(|(_, rest)| rest.split_once(')'))
        .ok_or_else(malformed)?
        .0;
    let mut bytes = Some(item);
    for dim in dims.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let dim: u64 = dim.parse().map_err(|_| malformed())?;
        bytes = bytes.and_then(|b| b.checked_mul(dim));
    }
    Ok(bytes.and_then(|b| b.checked_add((start + len) as u64)))
}

/// An f32 tensor as the bytes of an `.npy` file, the bytes candle's `write_npy` writes (tested):
/// that writes one element per system call, which was a twentieth of a short sweep cell.
fn npy_f32(tensor: &Tensor) -> Result<Vec<u8>> {
    let shape: String = tensor.dims().iter().map(|d| format!("{d},")).collect();
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({shape}), }}");
    // Magic (6), version (2) and length (2), then the header padded to a multiple of 16.
    let pad = 16 - (6 + 5 + header.len()) % 16;
    header.extend(std::iter::repeat_n(' ', pad % 16));
    header.push('\n');
    let values = tensor
        .to_dtype(candle_core::DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    let mut bytes = Vec::with_capacity(10 + header.len() + 4 * values.len());
    bytes.extend_from_slice(b"\x93NUMPY\x01\x00");
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend(values.iter().flat_map(|v| v.to_le_bytes()));
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version 1 `.npy` file of f32s claiming `shape`, followed by `values` zeros.
    fn npy(shape: &str, values: usize) -> Vec<u8> {
        let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
        bytes.extend((header.len() as u16).to_le_bytes());
        bytes.extend(header.as_bytes());
        bytes.extend(vec![0u8; 4 * values]);
        bytes
    }

    fn entry(file: &str) -> AttentionLayerFile {
        AttentionLayerFile {
            layer: 0,
            file: file.into(),
            shape: vec![6],
        }
    }

    #[test]
    fn attention_files_hold_the_bytes_candle_writes() {
        let dir = tempfile::tempdir().unwrap();
        for dims in [vec![], vec![3], vec![2, 3, 4, 5], vec![1, 4, 64, 64]] {
            let n = dims.iter().product::<usize>();
            let values: Vec<f32> = (0..n).map(|i| (i as f32).sin() * 1e3).collect();
            let tensor =
                Tensor::from_vec(values, dims.as_slice(), &candle_core::Device::Cpu).unwrap();
            let path = dir.path().join("candle.npy");
            tensor.write_npy(&path).unwrap();
            assert_eq!(
                npy_f32(&tensor).unwrap(),
                std::fs::read(&path).unwrap(),
                "{dims:?}"
            );
        }
    }

    /// A full disk while writing `preset.toml` left a folder every command rejected: a run
    /// folder appears only once it is filled, and one that could not be is removed.
    #[test]
    fn a_run_folder_appears_only_once_filled() {
        let root = tempfile::tempdir().unwrap();
        let preset = Preset::default();
        let names = || -> Vec<String> {
            let mut names: Vec<String> = std::fs::read_dir(root.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        };
        let full = |_: &RunDir| Err(Error::Failed("no space left on device".into()));
        let err = RunDir::create(root.path(), &preset, full).unwrap_err();
        assert!(err.to_string().contains("no space left"), "{err}");
        assert!(names().is_empty(), "{:?}", names());
        let run = RunDir::create(root.path(), &preset, |dir| {
            assert!(folder_name(dir.path()).starts_with('.'));
            dir.write_preset(&preset)
        })
        .unwrap();
        assert_eq!(names(), [folder_name(run.path())]);
        assert!(run.read_preset().is_ok());
        assert!(run.path().join("attention").is_dir());
    }

    /// Headers claiming absurd shapes used to panic ("capacity overflow") or abort on the
    /// allocation; they are refused by comparing with the file's size.
    #[test]
    fn npy_headers_that_do_not_match_the_file_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("attention")).unwrap();
        let run = RunDir {
            path: dir.path().to_path_buf(),
        };
        let file = |name: &str, bytes: &[u8]| {
            std::fs::write(dir.path().join("attention").join(name), bytes).unwrap();
            run.read_attention(&entry(name))
        };
        let ok = file("ok.npy", &npy("(2, 3)", 6)).unwrap();
        assert_eq!(ok.dims(), &[2, 3]);
        let written = Tensor::new(&[1f32, 2.0, 3.0], &candle_core::Device::Cpu).unwrap();
        written
            .write_npy(dir.path().join("attention").join("candle.npy"))
            .unwrap();
        assert_eq!(
            run.read_attention(&entry("candle.npy")).unwrap().dims(),
            &[3]
        );
        for shape in ["(4611686018427387904,)", "(99999999999,)", "(4, 3)"] {
            let err = file("bad.npy", &npy(shape, 6)).unwrap_err().to_string();
            assert!(
                err.contains("header describes") && err.contains("bad.npy"),
                "{shape}: {err}"
            );
        }
        let err = file("short.npy", b"\x93NUM").unwrap_err().to_string();
        assert!(err.contains("not an .npy file"), "{err}");
        let mut nan = npy("(2,)", 1);
        nan.extend(f32::NAN.to_le_bytes());
        let err = file("nan.npy", &nan).unwrap_err().to_string();
        assert!(err.contains("holds NaN or infinity"), "{err}");
    }

    /// A FIFO in a run folder used to block every analysis reading it.
    #[cfg(unix)]
    #[test]
    fn fifos_in_a_run_folder_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("attention")).unwrap();
        let run = RunDir {
            path: dir.path().to_path_buf(),
        };
        assert!(run.read_metrics().unwrap().is_empty(), "no metrics yet");
        for file in [
            "summary.json",
            "metrics.jsonl",
            "attention/index.json",
            "attention/a.npy",
        ] {
            let status = std::process::Command::new("mkfifo")
                .arg(dir.path().join(file))
                .status()
                .unwrap();
            assert!(status.success());
        }
        let errors = [
            run.read_summary().unwrap_err(),
            run.read_metrics().unwrap_err(),
            run.read_attention_index().unwrap_err(),
            run.read_attention(&entry("a.npy")).unwrap_err(),
        ];
        for err in errors {
            assert!(err.to_string().contains("not a regular file"), "{err}");
        }
    }

    /// `index.json` entries like `/etc/passwd` or `../..` used to be opened.
    #[test]
    fn attention_files_outside_the_attention_folder_are_refused() {
        let run = RunDir {
            path: PathBuf::from("run"),
        };
        for file in ["/etc/passwd", "../preset.toml", "..", "a/b.npy", ""] {
            let err = run.read_attention(&entry(file)).unwrap_err().to_string();
            assert!(
                err.contains("not a file of the attention folder"),
                "{file}: {err}"
            );
        }
    }

    #[test]
    fn a_run_is_renamed_in_its_preset_and_summary_not_its_folder() {
        let root = tempfile::tempdir().unwrap();
        let preset = Preset::default();
        let summary = serde_json::json!({
            "name": preset.name, "status": "completed", "mechanism": "softmax",
            "encoding": "learned", "task": "mqar", "device": "cpu", "n_params": 1,
            "steps": 1, "total_steps": 1, "epoch": 1.0, "elapsed_secs": 1.0,
            "last_loss": null, "last_accuracy": null, "best_accuracy": null,
            "time_to_target_secs": null, "tokens_per_s": null, "error": null,
            "attnlab_version": "0"
        });
        let dir = RunDir::create(root.path(), &preset, |dir| {
            dir.write_preset(&preset)?;
            crate::io::write_json(&dir.path().join("summary.json"), &summary)
        })
        .unwrap();
        let folder = dir.path().to_path_buf();
        dir.rename("softmax, second seed").unwrap();
        assert_eq!(dir.read_preset().unwrap().name, "softmax, second seed");
        assert_eq!(dir.read_summary().unwrap().name, "softmax, second seed");
        assert!(folder.is_dir());
        let err = dir.rename("two\nlines").unwrap_err().to_string();
        assert!(err.contains("control characters"), "{err}");
        assert_eq!(dir.read_summary().unwrap().name, "softmax, second seed");
    }

    /// Resuming from step 2 drops the later lines and a torn last one, keeps the rest as written.
    #[test]
    fn truncating_metrics_keeps_the_steps_up_to_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir {
            path: dir.path().to_path_buf(),
        };
        let line = |kind: &str, step: usize| match kind {
            "step" => format!(
                r#"{{"kind":"step","step":{step},"epoch":0.1,"loss":1.5,"lr":0.001,"grad_norm":1.0,"tokens_per_s":10.0,"elapsed_secs":1.0}}"#
            ),
            _ => format!(
                r#"{{"kind":"eval","step":{step},"epoch":0.1,"accuracy":0.5,"loss":1.0,"elapsed_secs":1.0}}"#
            ),
        };
        let kept = [line("step", 1), line("step", 2), line("eval", 2)];
        let text = format!(
            "{}\n{}\n{}\n{{\"kind\":\"st",
            kept.join("\n"),
            line("step", 3),
            line("eval", 3)
        );
        std::fs::write(dir.path().join("metrics.jsonl"), text).unwrap();
        run.truncate_metrics(2).unwrap();
        let after = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
        assert_eq!(after, format!("{}\n", kept.join("\n")));
        assert_eq!(run.read_metrics().unwrap().len(), 3);
    }

    /// The optimiser state is written after the weights: weights newer than it mean a kill
    /// between the two writes, and no exact resume.
    #[test]
    fn a_checkpoint_is_resumable_only_with_older_weights_than_optimizer_state() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir {
            path: dir.path().to_path_buf(),
        };
        let refused = |run: &RunDir| run.check_resumable_checkpoint().unwrap_err().to_string();
        assert!(refused(&run).contains("no checkpoint with optimizer state"));
        // Files saved before the step was recorded: safetensors without it in the header.
        let tensors: std::collections::HashMap<String, Tensor> = [(
            "w".to_string(),
            Tensor::zeros(2, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap(),
        )]
        .into();
        crate::params::save_tensors(&tensors, &run.checkpoint_path(), None).unwrap();
        crate::params::save_tensors(&tensors, &run.optimizer_path(), None).unwrap();
        let set_time = |path: PathBuf, secs: u64| {
            let time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
            std::fs::File::options()
                .write(true)
                .open(path)
                .unwrap()
                .set_modified(time)
                .unwrap();
        };
        set_time(run.checkpoint_path(), 1000);
        set_time(run.optimizer_path(), 1001);
        run.check_resumable_checkpoint().unwrap();
        set_time(run.checkpoint_path(), 1002);
        assert!(refused(&run).contains("killed between writing them"));
        // A file that is there but whose header does not read is refused with why.
        std::fs::write(run.checkpoint_path(), b"w").unwrap();
        assert!(refused(&run).contains("cannot read"), "{}", refused(&run));
    }

    /// Files that record their step are compared by it, whatever their times (a folder copied
    /// file by file); different steps are refused, naming both.
    #[test]
    fn a_checkpoint_with_steps_is_resumable_when_the_steps_agree() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir {
            path: dir.path().to_path_buf(),
        };
        let tensors: std::collections::HashMap<String, Tensor> = [(
            "w".to_string(),
            Tensor::zeros(2, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap(),
        )]
        .into();
        let save = |path: PathBuf, step| crate::params::save_tensors(&tensors, &path, Some(step));
        save(run.optimizer_path(), 12).unwrap();
        save(run.checkpoint_path(), 12).unwrap();
        run.check_resumable_checkpoint().unwrap();
        save(run.optimizer_path(), 11).unwrap();
        let err = run.check_resumable_checkpoint().unwrap_err().to_string();
        assert!(err.contains("step 12") && err.contains("step 11"), "{err}");
    }
}
