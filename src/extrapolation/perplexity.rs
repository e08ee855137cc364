//! Perplexity of a model on a token stream at one evaluation length, in either protocol.
//!
//! - Non-overlapping: the stream is cut into windows of n tokens; every token is scored, with
//!   0..n−1 tokens of context (the Rpe paper's cheap protocol, fairseq's `--context-window 0`).
//! - Sliding: windows of n tokens advance by a stride s (default n/2) and score only their last
//!   s tokens, so every scored token has n−s..n−1 tokens of context (fairseq's
//!   `--context-window` with stride s; s = 1 is the paper's expensive variant).
//!
//! Both score tokens within the same span of the stream (a multiple of the longest length, so
//! non-overlapping windows score exactly the same tokens at every length); perplexity =
//! exp(mean negative log-likelihood of the scored tokens).

use std::sync::atomic::{AtomicBool, Ordering};

use candle_core::{D, Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::model::Transformer;
use crate::{Error, Result};

/// How a long stream is cut into evaluation windows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    /// Windows of n tokens side by side; every token scored.
    #[default]
    NonOverlapping,
    /// Windows of n tokens every `stride` tokens; only the last `stride` tokens of each scored.
    Sliding,
}

impl Protocol {
    pub fn name(&self) -> &'static str {
        match self {
            Self::NonOverlapping => "non-overlapping",
            Self::Sliding => "sliding",
        }
    }

    /// One line saying what is scored, for figure captions and tables.
    pub fn describe(&self, stride: Option<usize>) -> String {
        match self {
            Self::NonOverlapping => {
                "non-overlapping windows of n tokens, every token scored".into()
            }
            Self::Sliding => format!(
                "sliding windows of n tokens, stride {}, only the last stride tokens scored",
                stride.map_or("n/2".to_string(), |s| s.to_string())
            ),
        }
    }
}

/// One forward window: tokens `start..start + len` (+1 for the targets), positions
/// `score_from..len` of it scored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub start: usize,
    pub score_from: usize,
}

/// The windows of length `n` over a span of `span` tokens (targets need one more token).
pub fn windows(span: usize, n: usize, protocol: Protocol, stride: Option<usize>) -> Vec<Window> {
    match protocol {
        Protocol::NonOverlapping => (0..span / n)
            .map(|k| Window {
                start: k * n,
                score_from: 0,
            })
            .collect(),
        Protocol::Sliding => {
            let s = stride.unwrap_or(n / 2).clamp(1, n);
            if span < n {
                return Vec::new();
            }
            (0..=(span - n) / s)
                .map(|k| Window {
                    start: k * s,
                    score_from: n - s,
                })
                .collect()
        }
    }
}

/// Total negative log-likelihood and number of scored tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Scored {
    pub nll: f64,
    pub tokens: usize,
}

impl Scored {
    pub fn perplexity(&self) -> f64 {
        (self.nll / self.tokens.max(1) as f64).exp()
    }
}

/// What one evaluation at one length needs besides the model.
pub struct Pass<'a> {
    pub tokens: &'a [u32],
    /// Tokens of the stream scored (a multiple of the longest length).
    pub span: usize,
    pub protocol: Protocol,
    pub stride: Option<usize>,
    /// Queries per attention block.
    pub chunk: usize,
    /// Tokens per forward pass (several windows are batched when they are short).
    pub batch_tokens: usize,
}

/// Scores `model` at length `n`; `tick(done, total)` after each batch of windows. A set
/// `cancel` stops between batches with an error saying so.
pub fn score(
    model: &Transformer,
    device: &Device,
    pass: &Pass<'_>,
    n: usize,
    tick: &mut dyn FnMut(usize, usize),
    cancel: &AtomicBool,
) -> Result<Scored> {
    if pass.span + 1 > pass.tokens.len() {
        return Err(Error::Data(format!(
            "the validation stream has {} tokens, fewer than the {} needed",
            pass.tokens.len(),
            pass.span + 1
        )));
    }
    let windows = windows(pass.span, n, pass.protocol, pass.stride);
    let per_batch = (pass.batch_tokens / n).max(1);
    let mut total = Scored::default();
    let mut done = 0;
    for batch in windows.chunks(per_batch) {
        if cancel.load(Ordering::Relaxed) {
            return Err(Error::Cancelled);
        }
        let part = score_batch(model, device, pass.tokens, batch, n, pass.chunk)?;
        total.nll += part.nll;
        total.tokens += part.tokens;
        done += batch.len();
        tick(done, windows.len());
    }
    Ok(total)
}

/// Negative log-likelihood of the scored positions of a batch of equal-length windows.
fn score_batch(
    model: &Transformer,
    device: &Device,
    tokens: &[u32],
    batch: &[Window],
    n: usize,
    chunk: usize,
) -> Result<Scored> {
    let mut inputs = Vec::with_capacity(batch.len() * n);
    let mut rows = Vec::new();
    let mut targets = Vec::new();
    for (b, w) in batch.iter().enumerate() {
        inputs.extend_from_slice(&tokens[w.start..w.start + n]);
        for pos in w.score_from..n {
            rows.push((b * n + pos) as u32);
            targets.push(tokens[w.start + pos + 1]);
        }
    }
    let ids = Tensor::from_vec(inputs, (batch.len(), n), device)?;
    let logits = model.logits_blocks(&ids, chunk)?; // (B, n, V)
    let vocab = logits.dim(D::Minus1)?;
    let scored = logits
        .reshape((batch.len() * n, vocab))?
        .index_select(&Tensor::from_vec(rows, targets.len(), device)?, 0)?;
    let log_probs = candle_nn::ops::log_softmax(&scored, D::Minus1)?;
    let count = targets.len();
    let picked = log_probs
        .gather(&Tensor::from_vec(targets, (count, 1), device)?, 1)?
        .to_dtype(candle_core::DType::F64)?
        .sum_all()?
        .to_scalar::<f64>()?;
    Ok(Scored {
        nll: -picked,
        tokens: count,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_overlapping_windows_tile_the_span() {
        let w = windows(12, 4, Protocol::NonOverlapping, None);
        assert_eq!(w.iter().map(|w| w.start).collect::<Vec<_>>(), vec![0, 4, 8]);
        assert!(w.iter().all(|w| w.score_from == 0));
    }

    #[test]
    fn sliding_windows_score_only_their_tail() {
        let w = windows(16, 8, Protocol::Sliding, None);
        assert_eq!(w.iter().map(|w| w.start).collect::<Vec<_>>(), vec![0, 4, 8]);
        assert!(w.iter().all(|w| w.score_from == 4));
        // Scored positions: 4..8, 8..12, 12..16: each token once, each with ≥ 4 tokens before it.
        let w = windows(16, 8, Protocol::Sliding, Some(1));
        assert_eq!(w.len(), 9);
        assert_eq!(w[0].score_from, 7);
    }

    #[test]
    fn perplexity_is_exp_of_mean_nll() {
        let s = Scored {
            nll: 2.0 * 4f64.ln(),
            tokens: 2,
        };
        assert!((s.perplexity() - 4.0).abs() < 1e-12);
    }
}
