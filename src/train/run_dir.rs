//! Run folders: `runs/<YYYYmmdd-HHMMSS>-<name>/` with everything needed to analyse a run.
//!
//! | file | written |
//! |---|---|
//! | `preset.toml` | at start: the fully resolved preset |
//! | `metrics.jsonl` | one line per step and per evaluation, appended and flushed |
//! | `summary.json` | at start, at every evaluation, at the end |
//! | `model.safetensors` | at every evaluation and at the end (never after a NaN loss) |
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

/// A run folder on disk.
#[derive(Clone, Debug)]
pub struct RunDir {
    path: PathBuf,
}

impl RunDir {
    /// Creates `root/<time>-<slug>` (with a numeric suffix if that exists already).
    pub fn create(root: &Path, preset: &Preset) -> Result<Self> {
        std::fs::create_dir_all(root)
            .map_err(|e| Error::io("cannot create runs folder", root, e))?;
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
                Ok(()) => {
                    std::fs::create_dir(path.join("attention")).map_err(|e| {
                        Error::io("cannot create folder", path.join("attention"), e)
                    })?;
                    return Ok(Self { path });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::io("cannot create run folder", path, e)),
            }
        }
        Err(Error::Other(format!(
            "too many runs named {base} in {}",
            root.display()
        )))
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
        let text = std::fs::read_to_string(&origin)
            .map_err(|e| Error::io("cannot read preset", &origin, e))?;
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
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io("cannot read metrics", path, e)),
        };
        Ok(text
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect())
    }

    pub fn write_summary(&self, summary: &Summary) -> Result<()> {
        io::write_json(&self.path.join("summary.json"), summary)
    }

    pub fn read_summary(&self) -> Result<Summary> {
        let path = self.path.join("summary.json");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| Error::io("cannot read summary", &path, e))?;
        serde_json::from_str(&text).map_err(|e| Error::RunDir {
            message: format!("malformed summary ({e})"),
            path,
        })
    }

    /// Writes each layer's attention as `.npy`, then the index that names them.
    pub fn write_attention(&self, index: &AttentionIndex, tensors: &[Tensor]) -> Result<()> {
        for (entry, tensor) in index.layers.iter().zip(tensors) {
            let path = self.path.join("attention").join(&entry.file);
            io::write_atomically(&path, |tmp| Ok(tensor.write_npy(tmp)?))?;
        }
        io::write_json(&self.path.join("attention").join("index.json"), index)
    }

    pub fn read_attention_index(&self) -> Result<AttentionIndex> {
        let path = self.path.join("attention").join("index.json");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| Error::io("cannot read attention index", &path, e))?;
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

    /// The saved attention of one layer, (B, H, Tq, Tk), on the CPU.
    pub fn read_attention(&self, entry: &AttentionLayerFile) -> Result<Tensor> {
        let path = self.path.join("attention").join(&entry.file);
        Tensor::read_npy(&path).map_err(|e| Error::RunDir {
            message: format!("cannot read attention matrix ({e})"),
            path,
        })
    }
}
