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
use serde::{Deserialize, Serialize};

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

/// A split: the training rows, or the test rows (which a task may score differently, as
/// MAD's recall probes do, and seed differently).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    Train,
    Test,
}

/// One row: its tokens, per position what the model must output there ([`IGNORE`]: nothing),
/// and where each scored query must read in the row, for tasks that retrieve from context
/// (MQAR; MAD's in-context and noisy recall at test, selective copying; empty otherwise).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Row {
    pub inputs: Vec<u32>,
    pub labels: Vec<i32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queries: Vec<mqar::QueryTruth>,
}

impl Row {
    /// Its first `shown` positions as two aligned lines, the tokens over the labels scored
    /// there (`-`: none), the first saying how many positions it leaves out.
    pub fn text(&self, shown: usize) -> String {
        let tokens: Vec<String> = self.inputs.iter().take(shown).map(u32::to_string).collect();
        let labels: Vec<String> = (self.labels.iter().take(shown))
            .map(|&l| match l {
                IGNORE => "-".into(),
                l => l.to_string(),
            })
            .collect();
        let width = tokens.iter().chain(&labels).map(String::len).max();
        let line = |cells: &[String]| {
            let cells = cells
                .iter()
                .map(|c| format!("{c:>w$}", w = width.unwrap_or(1)));
            cells.collect::<Vec<_>>().join(" ")
        };
        let more = match self.inputs.len().saturating_sub(shown) {
            0 => String::new(),
            n => format!(" … ({n} more)"),
        };
        format!("inputs: {}{more}\nlabels: {}", line(&tokens), line(&labels))
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

    /// Its first `n` rows (all of them if it holds fewer), each with its ground truth.
    pub fn first_rows(&self, n: usize) -> Vec<Row> {
        (0..n.min(self.len()))
            .map(|i| Row {
                inputs: self.row(i).to_vec(),
                labels: self.row_labels(i).to_vec(),
                queries: self.queries.get(i).cloned().unwrap_or_default(),
            })
            .collect()
    }

    /// The dataset made of `rows`, each `seq_len` tokens.
    pub fn of_rows(seq_len: usize, rows: impl IntoIterator<Item = Row>) -> Self {
        let mut data = Self {
            seq_len,
            ..Self::default()
        };
        for row in rows {
            data.inputs.extend(row.inputs);
            data.labels.extend(row.labels);
            data.queries.push(row.queries);
        }
        data
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Tokens over their labels, a column as wide as its widest entry, `-` where nothing is
    /// scored, and the positions left out counted.
    #[test]
    fn a_row_as_text_aligns_tokens_over_labels() {
        let row = Row {
            inputs: vec![3, 12, 7, 5],
            labels: vec![IGNORE, 104, IGNORE, 9],
            queries: Vec::new(),
        };
        assert_eq!(
            row.text(usize::MAX),
            "inputs:   3  12   7   5\nlabels:   - 104   -   9"
        );
        assert_eq!(row.text(2), "inputs:   3  12 … (2 more)\nlabels:   - 104");
    }
}
