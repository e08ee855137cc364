//! A task's ground truth as the attention it asks for: for each scored query of a test row,
//! the positions it should read ([`QueryTruth`]), laid out as a crop of the row's attention
//! matrix. The IoU analysis ([`crate::analysis::iou`], which adds the hard IoU and the
//! protocol) and training's TensorBoard sink (soft IoU at each evaluation) both score
//! attention against it.

use serde::{Deserialize, Serialize};

use super::mqar::QueryTruth;

/// Which token of the pair a query should attend to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    /// The value token after the key (what the previous-token layer makes hold the key).
    #[default]
    Value,
    /// The key token.
    Key,
}

impl Target {
    /// The name used in the CLI and in tables.
    pub fn name(self) -> &'static str {
        match self {
            Self::Value => "value",
            Self::Key => "key",
        }
    }

    /// The positions `query` should read.
    pub fn positions(self, query: &QueryTruth) -> &[usize] {
        match self {
            Self::Value => &query.value_positions,
            Self::Key => &query.key_positions,
        }
    }
}

/// The cropped matrices of one example: rows are the queries, columns the context.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Crop {
    /// Position of each query, in order (the crop's rows).
    pub query_positions: Vec<usize>,
    /// Context length: the crop's columns are positions `0..context`.
    pub context: usize,
    /// The ground truth, row-major `queries × context`, 0 or 1.
    pub truth: Vec<f64>,
}

impl Crop {
    /// The crop of an example with these queries and this context length.
    pub fn new(queries: &[QueryTruth], context: usize, target: Target) -> Self {
        let mut truth = vec![0.0; queries.len() * context];
        for (r, query) in queries.iter().enumerate() {
            for &c in target.positions(query).iter().filter(|&&c| c < context) {
                truth[r * context + c] = 1.0;
            }
        }
        Self {
            query_positions: queries.iter().map(|q| q.position).collect(),
            context,
            truth,
        }
    }

    /// The crop of a `Tq × Tk` attention matrix.
    pub fn of(&self, matrix: &[f32], tk: usize) -> Vec<f64> {
        self.query_positions
            .iter()
            .flat_map(|&p| {
                matrix[p * tk..p * tk + self.context]
                    .iter()
                    .map(|&a| a as f64)
            })
            .collect()
    }

    /// Soft IoU of cropped attention `a`: `Σ min(A, G) / Σ max(A, G)`.
    pub fn soft_iou(&self, a: &[f64]) -> f64 {
        let (low, high) = a
            .iter()
            .zip(&self.truth)
            .fold((0.0, 0.0), |(l, h), (&a, &g)| (l + a.min(g), h + a.max(g)));
        if high > 0.0 { low / high } else { 0.0 }
    }
}
