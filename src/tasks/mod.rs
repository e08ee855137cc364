//! Tasks: what the model is trained on.
//!
//! A task turns its preset section into a [`Dataset`] of fixed-length token rows with labels
//! (`IGNORE` where a position is not scored). Training, evaluation and the views only see
//! datasets and batches; the tasks are listed once, in `catalogue.rs`, so a new task is its
//! file and one line there.

mod catalogue;
pub mod corpus;
pub mod lm;
pub mod mad;
pub mod mad_data;
pub mod mqar;
pub mod truth;

use candle_core::{Device, Tensor};

use catalogue::sizes_from_fields;
pub use catalogue::{Listed, TASKS, Task, TaskFacts, TaskSpec};

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
