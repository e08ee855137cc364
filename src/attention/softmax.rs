//! Causal softmax attention: A = softmax(q kᵀ / √d + bias), keys after the query masked out.

use candle_core::Tensor;

use super::{Attention, Mechanism, MechanismShape};
use crate::Result;
use crate::encodings::Encoding;
use crate::ops::{dot_scores, softmax_rows};

pub struct SoftmaxAttention {
    scale: f64,
}

impl SoftmaxAttention {
    pub fn new(shape: &MechanismShape) -> Self {
        Self {
            scale: 1.0 / (shape.qk_dim as f64).sqrt(),
        }
    }
}

impl Mechanism for SoftmaxAttention {
    fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, pos: &dyn Encoding) -> Result<Attention> {
        let t = q.dim(2)?;
        let mut scores = pos.scores(q, k, &|q, k| dot_scores(q, k, self.scale))?; // (B, H, T, T)
        if let Some(bias) = pos.logit_bias(t)? {
            scores = scores.broadcast_add(&bias)?;
        }
        Ok(Attention {
            weights: softmax_rows(&scores, true)?,
            values: v.clone(),
        })
    }
}
