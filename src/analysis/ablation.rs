//! Head ablation, as TransformerLens does it on `hook_z`: a head's output replaced by zeros or
//! by its mean over the input, and how much the model's next-token loss on that input rises.

use std::sync::atomic::{AtomicBool, Ordering};

use candle_core::{D, Tensor};
use serde::Serialize;

use crate::Result;
use crate::model::{Ablation, HeadAblation, Transformer};

/// One head's ablation: the loss change per predicted token and on average.
#[derive(Clone, Debug, Serialize)]
pub struct HeadAblationResult {
    pub layer: usize,
    pub head: usize,
    /// Mean over the predicted tokens of ablated − clean loss, in nats.
    pub change: f64,
    /// Per predicted token (position t predicting token t + 1).
    pub per_token: Vec<f64>,
}

/// Every head's ablation on one input.
#[derive(Clone, Debug, Serialize)]
pub struct AblationGrid {
    pub mode: Ablation,
    /// The clean model's mean next-token loss, nats.
    pub clean_loss: f64,
    /// Its loss at each predicted token.
    pub clean: Vec<f64>,
    pub heads: Vec<HeadAblationResult>,
}

/// Next-token losses (nats) of `logits` (1, T, V) on `ids`: position t against token t + 1,
/// T − 1 values.
pub fn token_losses(logits: &Tensor, ids: &[u32]) -> Result<Vec<f64>> {
    let predicted = ids.len().saturating_sub(1);
    let log_p =
        candle_nn::ops::log_softmax(&logits.squeeze(0)?.narrow(0, 0, predicted)?, D::Minus1)?;
    // The targets' log-probabilities gathered on the tensor: only T numbers leave it.
    let targets = Tensor::from_vec(ids[1..].to_vec(), (predicted, 1), log_p.device())?;
    let picked = log_p.gather(&targets, 1)?.flatten_all()?;
    let picked = picked.to_dtype(candle_core::DType::F64)?.to_vec1::<f64>()?;
    Ok(picked.into_iter().map(|l| -l).collect())
}

/// Each head of `layers` (each with `heads` heads) ablated in turn on `ids` (1, T).
/// A forward pass per head, so the window shows its progress (0..1) and may cancel it between
/// heads: `Ok(None)` when cancelled.
pub fn ablation_grid(
    model: &Transformer,
    ids: &Tensor,
    (layers, heads): (&[usize], usize),
    mode: Ablation,
    progress: &mut dyn FnMut(f32),
    cancel: &AtomicBool,
) -> Result<Option<AblationGrid>> {
    let tokens = ids.flatten_all()?.to_vec1::<u32>()?;
    let clean = token_losses(&model.forward(ids)?.logits, &tokens)?;
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let mut results = Vec::new();
    let total = (layers.len() * heads).max(1) as f32;
    for &layer in layers {
        for head in 0..heads {
            if cancel.load(Ordering::Relaxed) {
                return Ok(None);
            }
            progress(results.len() as f32 / total);
            let ablation = HeadAblation { layer, head, mode };
            let ablated = token_losses(&model.logits_ablated(ids, ablation)?, &tokens)?;
            let per_token: Vec<f64> = ablated.iter().zip(&clean).map(|(a, c)| a - c).collect();
            results.push(HeadAblationResult {
                layer,
                head,
                change: mean(&per_token),
                per_token,
            });
        }
    }
    Ok(Some(AblationGrid {
        mode,
        clean_loss: mean(&clean),
        clean,
        heads: results,
    }))
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    /// Uniform logits over V lose ln V at every token; a confident right answer loses ~0.
    #[test]
    fn token_losses_are_the_next_tokens_negative_log_probabilities() {
        let v = 4;
        let mut logits = vec![0f32; 3 * v];
        logits[v + 2] = 30.0; // position 1 sure of token 2
        let logits = Tensor::from_vec(logits, (1, 3, v), &Device::Cpu).unwrap();
        let losses = token_losses(&logits, &[0, 1, 2]).unwrap();
        assert_eq!(losses.len(), 2);
        assert!((losses[0] - (v as f64).ln()).abs() < 1e-6);
        assert!(losses[1] < 1e-6);
    }
}
