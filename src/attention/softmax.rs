//! Causal softmax attention: A = softmax(q kᵀ / √d + bias + mask).

use candle_core::Tensor;

use super::{Attention, CausalMask, Mechanism, MechanismShape};
use crate::Result;
use crate::encodings::Encoding;
use crate::ops::{dot_scores, softmax_last};

pub struct SoftmaxAttention {
    scale: f64,
    mask: CausalMask,
}

impl SoftmaxAttention {
    pub fn new(shape: &MechanismShape) -> Self {
        Self {
            scale: 1.0 / (shape.qk_dim as f64).sqrt(),
            mask: CausalMask::default(),
        }
    }
}

impl Mechanism for SoftmaxAttention {
    fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, pos: &dyn Encoding) -> Result<Attention> {
        let (q, k) = pos.rotate(q, k)?;
        let t = q.dim(2)?;
        let mut scores = dot_scores(&q, &k, self.scale)?; // (B, H, T, T)
        if let Some(bias) = pos.logit_bias(t)? {
            scores = scores.broadcast_add(&bias)?;
        }
        let scores = scores.broadcast_add(&self.mask.additive(t, q.device())?)?;
        Ok(Attention {
            weights: softmax_last(&scores)?,
            values: v.clone(),
        })
    }
}
