//! Tasks: what the model is trained on.
//!
//! A task turns its preset section into a [`Dataset`] of fixed-length token rows with labels
//! (`IGNORE` where a position is not scored). Training, evaluation and the views only see
//! datasets and batches, so a new task needs no change elsewhere.

pub mod corpus;
pub mod lm;
pub mod mad;
pub mod mad_data;
pub mod mqar;

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::Result;

/// Label value of positions that are not scored (zoology's and PyTorch's `-100`).
pub const IGNORE: i32 = -100;

/// The most tokens one split may hold: 2^28 tokens are 2 GiB of inputs and labels, 400 times
/// the reference MQAR training split, while a typo (`train_examples = 1e12`) would ask for
/// terabytes.
pub const MAX_SPLIT_TOKENS: usize = 1 << 28;

/// Checks that `examples` rows of `seq_len` tokens fit in [`MAX_SPLIT_TOKENS`], with the
/// product overflow-checked; the error names `task.{key}`.
pub fn check_split_size(key: &str, examples: usize, seq_len: usize) -> Result<()> {
    match examples.checked_mul(seq_len) {
        Some(tokens) if tokens <= MAX_SPLIT_TOKENS => Ok(()),
        _ => Err(crate::Error::preset(
            format!("task.{key}"),
            examples,
            format!(
                "is too many rows of task.seq_len = {seq_len} tokens: at most {} \
                 ({MAX_SPLIT_TOKENS} tokens per split)",
                MAX_SPLIT_TOKENS / seq_len.max(1)
            ),
        )),
    }
}

/// The task section of a preset.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum TaskSpec {
    /// Multi-query associative recall (zoology's `multiquery_ar`).
    Mqar(mqar::MqarConfig),
    /// Next-token language modelling on a text corpus.
    Lm(lm::LmConfig),
    /// One of MAD's six synthetic probes (Poli et al. 2024).
    Mad(mad::MadConfig),
}

impl Default for TaskSpec {
    fn default() -> Self {
        Self::Mqar(mqar::MqarConfig::default())
    }
}

impl TaskSpec {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Mqar(_) => "mqar",
            Self::Lm(_) => "lm",
            Self::Mad(_) => "mad",
        }
    }

    pub fn vocab_size(&self) -> usize {
        match self {
            Self::Mqar(c) => c.vocab_size,
            Self::Lm(c) => c.vocab_size,
            Self::Mad(c) => c.resolved().vocab_size,
        }
    }

    /// Length of the rows the model is trained on.
    pub fn seq_len(&self) -> usize {
        match self {
            Self::Mqar(c) => c.seq_len,
            Self::Lm(c) => c.seq_len,
            Self::Mad(c) => c.resolved().row_len(),
        }
    }

    /// The MQAR settings, when this is the MQAR task.
    pub fn mqar(&self) -> Option<&mqar::MqarConfig> {
        match self {
            Self::Mqar(c) => Some(c),
            Self::Lm(_) | Self::Mad(_) => None,
        }
    }

    pub fn train_examples(&self) -> usize {
        match self {
            Self::Mqar(c) => c.train_examples,
            Self::Lm(c) => c.train_examples,
            Self::Mad(c) => c.resolved().train_examples,
        }
    }

    pub fn test_examples(&self) -> usize {
        match self {
            Self::Mqar(c) => c.test_examples,
            Self::Lm(c) => c.test_examples,
            Self::Mad(c) => c.resolved().test_examples,
        }
    }

    /// Whether the task's inputs exist on this machine: a language model's corpus, a MAD
    /// probe's published data (which training reads only when it starts; `attnlab check` asks
    /// here first).
    pub fn check_inputs_here(&self) -> Result<()> {
        match self {
            Self::Lm(c) => c.check_corpus(),
            Self::Mad(c) => c.check_data(),
            Self::Mqar(_) => Ok(()),
        }
    }

    /// The language-modelling settings, when this is the LM task.
    pub fn lm(&self) -> Option<&lm::LmConfig> {
        match self {
            Self::Lm(c) => Some(c),
            Self::Mqar(_) | Self::Mad(_) => None,
        }
    }

    /// Whether every position is scored against its own input token (MAD's compression), which
    /// a causal language model copies: the model must decode the row from a pooled state
    /// (`model.head = "autoencoder"`, what `auto` picks for it).
    pub fn scores_its_inputs(&self) -> bool {
        matches!(self, Self::Mad(c) if c.probe == mad::Probe::Compression)
    }

    /// Whether a position may not look at later positions. MQAR's targets never appear after
    /// their query, so non-causal mixers (Linformer) are allowed there; language modelling and
    /// MAD's probes (the next token, the data to copy, the value after a key) would be seen by
    /// a non-causal mixer.
    pub fn requires_causal(&self) -> bool {
        match self {
            Self::Mqar(_) => false,
            Self::Lm(_) | Self::Mad(_) => true,
        }
    }

    /// Checks the task's own fields; errors name the preset key (`task.…`).
    pub fn validate(&self) -> Result<()> {
        match self {
            Self::Mqar(c) => c.validate(),
            Self::Lm(c) => c.validate(),
            Self::Mad(c) => c.validate(),
        }
    }

    /// The training and test datasets.
    pub fn datasets(&self) -> Result<(Dataset, Dataset)> {
        match self {
            Self::Mqar(c) => Ok((
                c.generate(mqar::Split::Train),
                c.generate(mqar::Split::Test),
            )),
            Self::Lm(c) => c.datasets(),
            Self::Mad(c) => c.datasets(),
        }
    }
}

/// Rows of `seq_len` tokens with per-position labels, stored flat (row-major).
#[derive(Clone, Debug, Default)]
pub struct Dataset {
    pub seq_len: usize,
    pub inputs: Vec<u32>,
    pub labels: Vec<i32>,
    /// MQAR ground truth per row (empty for tasks that have none).
    pub queries: Vec<Vec<mqar::QueryTruth>>,
}

/// One batch on the device: inputs and the scored positions with their targets.
pub struct Batch {
    /// Token ids, (B, T) u32.
    pub inputs: Tensor,
    /// Flat indices `b·T + t` of the scored positions, (R,) u32, in row-major order.
    pub rows: Tensor,
    /// Target token at each scored position, (R,) u32.
    pub targets: Tensor,
    /// Number of scored positions R.
    pub n_scored: usize,
}

impl Dataset {
    pub fn len(&self) -> usize {
        self.inputs.len() / self.seq_len.max(1)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tokens of row `i`.
    pub fn row(&self, i: usize) -> &[u32] {
        &self.inputs[i * self.seq_len..(i + 1) * self.seq_len]
    }

    /// Labels of row `i`.
    pub fn row_labels(&self, i: usize) -> &[i32] {
        &self.labels[i * self.seq_len..(i + 1) * self.seq_len]
    }

    /// The batch made of rows `indices`, uploaded to `device`.
    pub fn batch(&self, indices: &[usize], device: &Device) -> Result<Batch> {
        let t = self.seq_len;
        let mut inputs = Vec::with_capacity(indices.len() * t);
        let mut rows = Vec::new();
        let mut targets = Vec::new();
        for (b, &i) in indices.iter().enumerate() {
            inputs.extend_from_slice(self.row(i));
            for (pos, &label) in self.row_labels(i).iter().enumerate() {
                if label != IGNORE {
                    rows.push((b * t + pos) as u32);
                    targets.push(label as u32);
                }
            }
        }
        let n_scored = rows.len();
        Ok(Batch {
            inputs: Tensor::from_vec(inputs, (indices.len(), t), device)?,
            rows: Tensor::from_vec(rows, n_scored, device)?,
            targets: Tensor::from_vec(targets, n_scored, device)?,
            n_scored,
        })
    }
}
