//! Causal softmax attention: A = softmax(q kᵀ / √d + bias), keys after the query masked out.

use std::sync::Arc;

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use super::{
    Attention, Facts, LayerSize, Mechanism, MechanismShape, MechanismSpec, MemoryTerms, Variant,
};
use crate::Result;
use crate::encodings::{Encoding, QueryBlock};
use crate::ops::{
    Precision, RowFunction, WeightDropout, cpu_attention, cpu_attention_available, dot_scores,
    flash_attention, flash_available, flash_enabled, softmax_rows, softmax_rows_biased,
};
use crate::params::Params;
use crate::settings::Settings;

/// Softmax settings (none yet).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SoftmaxConfig {}

static FACTS: Facts = Facts {
    name: "softmax",
    formula: "A = softmax(q k^T / sqrt(d) + bias), causal",
    summary: "Vaswani et al. 2017: exact attention, O(n^2) time and memory.",
    causal: true,
    keys_have_positions: true,
    settings: Settings::NONE,
    default: || MechanismSpec::Softmax(SoftmaxConfig::default()),
};

impl Variant for SoftmaxConfig {
    const FACTS: &'static Facts = &FACTS;

    fn build(&self, shape: &MechanismShape, _params: &Params) -> Result<Arc<dyn Mechanism>> {
        Ok(Arc::new(SoftmaxAttention::new(shape)))
    }

    fn memory(&self, layer: &LayerSize) -> MemoryTerms {
        MemoryTerms::plain(layer)
    }
}

pub struct SoftmaxAttention {
    scale: f64,
    precision: Precision,
}

impl SoftmaxAttention {
    pub fn new(shape: &MechanismShape) -> Self {
        Self {
            scale: 1.0 / (shape.qk_dim as f64).sqrt(),
            precision: shape.precision,
        }
    }

    /// q·kᵀ/√d in the layer's precision, f32 out.
    fn scores(&self, q: &Tensor, k: &Tensor) -> Result<Tensor> {
        self.precision
            .product(q, k, |q, k| dot_scores(q, k, self.scale))
    }

    /// softmax(scores + bias) with the causal mask (offset for a block of queries).
    fn attention(scores: Tensor, bias: Option<Tensor>, v: &Tensor) -> Result<Attention> {
        let weights = match bias {
            Some(bias) => softmax_rows_biased(&scores, &bias, true)?,
            None => softmax_rows(&scores, true)?,
        };
        Ok(Attention {
            weights,
            values: v.clone(),
        })
    }
}

impl Mechanism for SoftmaxAttention {
    fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, pos: &dyn Encoding) -> Result<Attention> {
        let scores = pos.scores(q, k, &|q, k| self.scores(q, k))?; // (B, H, T, T)
        Self::attention(scores, pos.logit_bias(q.dim(2)?)?, v)
    }

    /// The output without the weights where a kernel runs it: flash attention on a CUDA GPU when
    /// `ATTNLAB_CUDA_FLASH=1` ([`flash_enabled`]: a constant bias goes into the kernel; no
    /// dropout; f32 whatever `train.precision` says),
    /// [`cpu_attention`] on the CPU (dropout, no bias; bf16 products take the explicit path).
    /// The rotary encodings rotate q and k first; ReRoPE's two score matrices need the explicit
    /// path.
    fn fused_output(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        pos: &dyn Encoding,
        dropout: Option<WeightDropout>,
    ) -> Result<Option<Tensor>> {
        if dropout.is_none() && flash_enabled() && flash_available(q, v, None) {
            let bias = pos.logit_bias(q.dim(2)?)?;
            if !flash_available(q, v, bias.as_ref()) {
                return Ok(None);
            }
            let Some((q, k)) = pos.positioned(q, k)? else {
                return Ok(None);
            };
            let output = flash_attention(&q, &k, v, bias.as_ref(), self.scale, true)?;
            return Ok(Some(output));
        }
        if !cpu_attention_available(q, v)
            || self.precision == Precision::Bf16
            || pos.has_logit_bias()
        {
            return Ok(None);
        }
        let Some((q, k)) = pos.positioned(q, k)? else {
            return Ok(None);
        };
        let row = RowFunction::Softmax;
        Ok(Some(cpu_attention(&q, &k, v, row, self.scale, dropout)?))
    }

    fn attend_block(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        pos: &dyn Encoding,
        block: QueryBlock,
    ) -> Result<Attention> {
        let scores = pos.block_scores(q, k, block, &|q, k| self.scores(q, k))?;
        Self::attention(scores, pos.block_bias(block)?, v)
    }
}
