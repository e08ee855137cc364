//! The decoder-only transformer: token embedding, optional absolute positions, N pre-norm
//! blocks (mixer; optional MLP), final norm, LM head.
//!
//! A block's mixer is attention or one of the short convolutions of zoology/ReBased's hybrid
//! models, chosen per layer by the cyclic pattern `model.mixers`: `["short-conv", "attention"]`
//! on 2 layers is the ReBased paper's MQAR model; on 4 layers it alternates, like Based.

mod conv;
mod layers;
mod mha;
mod transformer;

use serde::{Deserialize, Serialize};

pub use conv::{PrevToken, ShortConv};
pub use layers::{Embedding, LayerNorm, Linear, Mlp};
pub use mha::MultiHeadAttention;
pub use transformer::{Forward, Transformer};

use candle_core::Tensor;

use crate::{Error, Result};

/// The rows of x (B, T, D) at the flat positions `rows` (b·T + t): (R, D).
fn gather_rows(x: &Tensor, rows: &Tensor) -> Result<Tensor> {
    let (b, t, d) = x.dims3()?;
    Ok(x.reshape((b * t, d))?.index_select(rows, 0)?)
}

/// The `[model]` section of a preset.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    pub d_model: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    /// Hidden width of the GELU MLP as a multiple of d_model; 0 means no MLP (zoology's MQAR models).
    pub mlp_ratio: usize,
    /// Mixer of each layer, repeated cyclically over the layers.
    pub mixers: Vec<MixerKind>,
    /// Kernel size of `short-conv` mixers (3 in zoology's BaseConv).
    pub conv_kernel: usize,
    /// Share the token embedding with the LM head.
    pub tie_embeddings: bool,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            d_model: 128,
            n_layers: 2,
            n_heads: 2,
            mlp_ratio: 4,
            mixers: vec![MixerKind::Attention],
            conv_kernel: 3,
            tie_embeddings: false,
        }
    }
}

/// What mixes information across positions in a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MixerKind {
    /// The preset's attention mechanism and positional encoding.
    Attention,
    /// zoology's BaseConv: depthwise causal conv (kernel `conv_kernel`) ⊙ linear projection, + input.
    ShortConv,
    /// A fixed, parameter-free shift by one position: y_t = x_{t−1}. The ReBased paper's IoU
    /// protocol fixes layer 1 to attend to the previous token, so layer 2's attention can be
    /// compared with the ground-truth retrieval positions.
    PrevToken,
}

impl ModelConfig {
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_heads.max(1)
    }

    /// The mixer of layer `layer`.
    pub fn mixer(&self, layer: usize) -> MixerKind {
        self.mixers[layer % self.mixers.len()]
    }

    /// Layers whose mixer is attention, in order.
    pub fn attention_layers(&self) -> Vec<usize> {
        (0..self.n_layers)
            .filter(|&l| self.mixer(l) == MixerKind::Attention)
            .collect()
    }

    /// Checks the model's own fields; errors name `model.…`.
    pub fn validate(&self) -> Result<()> {
        let range = |key: &str, value: usize, lo: usize, hi: usize| {
            if (lo..=hi).contains(&value) {
                Ok(())
            } else {
                Err(Error::preset(
                    format!("model.{key}"),
                    value,
                    format!("must be in {lo}..={hi}"),
                ))
            }
        };
        range("d_model", self.d_model, 1, 8192)?;
        range("n_layers", self.n_layers, 1, 64)?;
        range("n_heads", self.n_heads, 1, 256)?;
        range("mlp_ratio", self.mlp_ratio, 0, 16)?;
        range("conv_kernel", self.conv_kernel, 1, 64)?;
        if !self.d_model.is_multiple_of(self.n_heads) {
            return Err(Error::preset(
                "model.d_model",
                self.d_model,
                format!("must be divisible by model.n_heads = {}", self.n_heads),
            ));
        }
        if self.mixers.is_empty() {
            return Err(Error::preset(
                "model.mixers",
                "[]",
                "needs at least one entry of attention, short-conv, prev-token",
            ));
        }
        if self.attention_layers().is_empty() {
            return Err(Error::preset(
                "model.mixers",
                format!("{:?}", self.mixers),
                format!("gives no attention layer in {} layers", self.n_layers),
            ));
        }
        Ok(())
    }
}
