//! Causal softmax attention: A = softmax(q kᵀ / √d + bias), keys after the query masked out,
//! optionally within a sliding window.
//!
//! The window counts keys: `window = w` lets query i see keys j with i − j < w, itself
//! included (w keys; the `window` encoding's convention). zoology's sliding-window attention
//! with window b sees b + 1 keys (w = b + 1), and MAD's window of 32 is 33 keys here. The window
//! is a mask added after whichever encoding, so RoPE, ALiBi or NoPE combine with it.
//! `window_layers` puts it on every layer or on every other one (GPT-Neo's alternating global
//! and local layers), and `unscaled` drops the 1/√d of the scores (GPT-Neo's too).

use std::sync::Arc;

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use super::{
    Attention, Facts, LayerSize, Mechanism, MechanismShape, MechanismSpec, MemoryTerms, Mixing,
    StateShape, StateSize, Variant,
};
use crate::Result;
use crate::encodings::{Encoding, EncodingShape, EncodingSpec, QueryBlock, WindowConfig};
use crate::ops::{
    Precision, RowFunction, WeightDropout, cpu_attention, cpu_attention_available, dot_scores,
    flash_attention, flash_available, flash_enabled, softmax_rows, softmax_rows_biased,
};
use crate::params::Params;
use crate::settings::{Choices, Settings, Switch, real};

/// Softmax settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SoftmaxConfig {
    /// Keys each query sees, itself included (sliding-window attention); unset: every
    /// earlier key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<usize>,
    /// The model layers the window applies to.
    pub window_layers: WindowLayers,
    /// Raw q·k scores, without the 1/√d_head (GPT-Neo).
    pub unscaled: bool,
}

/// Which model layers (block indices, from 0) a softmax window applies to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WindowLayers {
    #[default]
    All,
    /// Layers 1, 3, 5…: GPT-Neo's [global, local] pattern.
    Odd,
    /// Layers 0, 2, 4….
    Even,
}

impl WindowLayers {
    fn is_all(&self) -> bool {
        *self == Self::All
    }

    /// Whether model layer `layer` is windowed.
    fn includes(self, layer: usize) -> bool {
        match self {
            Self::All => true,
            Self::Odd => layer % 2 == 1,
            Self::Even => layer.is_multiple_of(2),
        }
    }
}

impl SoftmaxConfig {
    /// The settings of model layer `layer`: without the window where `window_layers` leaves
    /// the layer out.
    pub fn at_layer(&self, layer: usize) -> Self {
        Self {
            window: self.window.filter(|_| self.window_layers.includes(layer)),
            window_layers: WindowLayers::All,
            ..self.clone()
        }
    }
}

const SWITCHES: &[Switch] = &[
    Switch {
        key: "window_layers",
        label: "layers with the window (GPT-Neo: odd)",
        choices: Choices::Words(&["all", "odd", "even"]),
    },
    Switch {
        key: "unscaled",
        label: "raw q·k scores, no 1/√d (GPT-Neo)",
        choices: Choices::Toggle,
    },
];

static FACTS: Facts = Facts {
    name: "softmax",
    formula: "A = softmax(q k^T / sqrt(d) + bias), causal (within the last w keys with a window)",
    summary: "Vaswani et al. 2017: exact attention, O(n^2) time and memory; with a window, \
              sliding-window attention (Longformer, Mistral; zoology, MAD).",
    causal: true,
    keys_have_positions: true,
    mixing: Mixing::RowStochastic,
    state: "the keys and values seen: H (d_k + d_v) L, or H (d_k + d_v) w with a window \
            (zoology: 2 d L, and 2 d b with b = w - 1)",
    settings: Settings {
        numbers: &[real(
            "window",
            1.0,
            1_048_576.0,
            "keys each query sees, itself included (zoology's window b = w - 1; MAD's 32 = 33 \
             keys); unset = every earlier key",
        )
        .whole()],
        switches: SWITCHES,
    },
    default: || MechanismSpec::Softmax(SoftmaxConfig::default()),
};

impl Variant for SoftmaxConfig {
    const FACTS: &'static Facts = &FACTS;

    fn build(&self, shape: &MechanismShape, params: &Params) -> Result<Arc<dyn Mechanism>> {
        let scale = match self.unscaled {
            true => 1.0,
            false => 1.0 / (shape.qk_dim as f64).sqrt(),
        };
        Ok(Arc::new(SoftmaxAttention::new(
            shape,
            (self.window, scale),
            params,
        )?))
    }

    fn memory(&self, layer: &LayerSize) -> MemoryTerms {
        MemoryTerms::plain(layer)
    }

    /// The key-value cache: the whole sequence, or the window's last w tokens (the whole
    /// sequence where some layers have no window: the largest layer's).
    fn state(&self, layer: &StateShape) -> Option<StateSize> {
        let window = self.window.filter(|_| self.window_layers.is_all());
        let kept = window.map_or(layer.len, |w| w.min(layer.len));
        let per_token = layer.heads * (layer.qk_dim + layer.head_dim);
        // zoology's sliding window of b counts b tokens though it attends b + 1; one wider
        // than the sequence keeps the sequence.
        let zoology_tokens = window.map_or(layer.len, |w| w.saturating_sub(1).min(layer.len));
        Some(StateSize {
            floats: per_token * kept,
            zoology: 2 * layer.heads * layer.head_dim * zoology_tokens,
        })
    }

    /// `softmax-w<w>` with a window (`-odd`, `-even` on those layers), `-unscaled`.
    fn label(&self) -> String {
        let mut label = FACTS.name.to_string();
        if let Some(w) = self.window {
            label.push_str(&format!("-w{w}"));
            match self.window_layers {
                WindowLayers::All => {}
                WindowLayers::Odd => label.push_str("-odd"),
                WindowLayers::Even => label.push_str("-even"),
            }
        }
        if self.unscaled {
            label.push_str("-unscaled");
        }
        label
    }

    /// A choice of layers needs a window to choose them for.
    fn validate(&self, _seq_len: usize) -> Result<()> {
        if self.window.is_none() && !self.window_layers.is_all() {
            return Err(crate::Error::preset(
                "attention.window_layers",
                format!("{:?}", self.window_layers).to_lowercase(),
                "names the layers a window applies to: set attention.window",
            ));
        }
        Ok(())
    }
}

pub struct SoftmaxAttention {
    scale: f64,
    precision: Precision,
    /// The sliding window: its width, and as a 0 / −∞ bias over distances (cached per length
    /// and block) for the weights.
    window: Option<(usize, Arc<dyn Encoding>)>,
}

impl SoftmaxAttention {
    /// Softmax attention of a layer of `shape`, within the last `window` keys when given, its
    /// scores q·k times `scale`.
    pub fn new(
        shape: &MechanismShape,
        (window, scale): (Option<usize>, f64),
        params: &Params,
    ) -> Result<Self> {
        let window = window
            .map(|width| {
                let spec = EncodingSpec::Window(WindowConfig { width });
                let encoding = EncodingShape {
                    d_model: shape.n_heads * shape.head_dim,
                    n_heads: shape.n_heads,
                    qk_dim: shape.qk_dim,
                    max_len: shape.max_len,
                    embedding_std: 0.0,
                };
                Ok::<_, crate::Error>((width, spec.build(&encoding, params)?))
            })
            .transpose()?;
        Ok(Self {
            scale,
            precision: shape.precision,
            window,
        })
    }

    /// The encoding's bias plus the window's, whichever exist, for one block of queries.
    fn bias(&self, pos: &dyn Encoding, block: QueryBlock) -> Result<Option<Tensor>> {
        let window = match &self.window {
            Some((_, window)) => window.block_bias(block)?,
            None => None,
        };
        Ok(match (pos.block_bias(block)?, window) {
            (Some(bias), Some(window)) => Some(bias.broadcast_add(&window)?),
            (bias, window) => bias.or(window),
        })
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
        Self::attention(scores, self.bias(pos, QueryBlock::whole(q.dim(2)?))?, v)
    }

    /// The output without the weights where a kernel runs it: flash attention on a CUDA GPU when
    /// `ATTNLAB_CUDA_FLASH=1` ([`flash_enabled`]: a constant bias goes into the kernel; no
    /// dropout, no window; f32 whatever `train.precision` says),
    /// [`cpu_attention`] on the CPU (dropout, a window, no bias; bf16 products take the explicit
    /// path).
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
        let window = self.window.as_ref().map(|(width, _)| *width);
        if window.is_none() && dropout.is_none() && flash_enabled() && flash_available(q, v, None) {
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
        let row = (RowFunction::Softmax, window);
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
        Self::attention(scores, self.bias(pos, block)?, v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GPT-Neo's layers: the window on the odd ones only, named in the label; a choice of
    /// layers without a window refused.
    #[test]
    fn a_window_on_odd_layers_skips_the_even_ones() {
        let config = SoftmaxConfig {
            window: Some(8),
            window_layers: WindowLayers::Odd,
            unscaled: true,
        };
        assert_eq!(config.at_layer(0).window, None);
        assert_eq!(config.at_layer(3).window, Some(8));
        assert_eq!(config.label(), "softmax-w8-odd-unscaled");
        let lonely = SoftmaxConfig {
            window_layers: WindowLayers::Even,
            ..SoftmaxConfig::default()
        };
        let error = lonely.validate(64).unwrap_err().to_string();
        assert!(error.contains("attention.window_layers"), "{error}");
    }
}
