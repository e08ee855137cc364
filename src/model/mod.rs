//! The decoder-only transformer: token embedding, optional absolute positions, N pre-norm
//! blocks (mixer; optional MLP), final norm, LM head.
//!
//! A block's mixer is attention or one of the short convolutions of zoology/ReBased's hybrid
//! models, chosen per layer by the cyclic pattern `model.mixers`: `["short-conv", "attention"]`
//! on 2 layers is the ReBased paper's MQAR model; on 4 layers it alternates, like Based.
//!
//! `model.layout` chooses between two ways of building the same architecture ([`Layout`]):
//! attnlab's (PyTorch's module defaults, as the benchmark's PyTorch reference) and zoology's
//! MQAR model (what the Based, ReBased and zoology papers trained), so learning rates and
//! steps-to-99% transfer to and from the papers.

mod autoencoder;
mod conv;
mod layers;
mod mha;
mod stages;
mod transformer;

use serde::{Deserialize, Serialize};

pub use autoencoder::AutoEncoder;
pub use conv::{PrevToken, ShortConv};
pub use layers::{Embedding, Linear, LinearInit, Mlp, Norm};
pub use mha::{Ablation, HeadAblation, MultiHeadAttention};
pub use transformer::{Forward, Transformer};

use candle_core::Tensor;

use crate::ops::Precision;
use crate::params::{Init, Params};
use crate::{Error, Result};

/// How the layers of one model are built: `train.precision`, `model.layout`, and the depth
/// the zoology layout scales its residual outputs by.
#[derive(Clone, Copy, Debug)]
pub struct Build {
    pub precision: Precision,
    pub layout: Layout,
    pub n_layers: usize,
    /// Whether the model ends in MAD's auto-encoder, whose `_init_weights` starts every linear
    /// layer of the MAD layout N(0, 0.02) with a zero bias, the blocks' included.
    pub autoencoder: bool,
}

impl Build {
    /// zoology's (and GPT-2's) initialiser range.
    const ZOOLOGY_STD: f64 = 0.02;

    /// How a linear layer starts; `residual` for the output projections that write into the
    /// residual stream (attention's, the MLP's down projection).
    pub fn linear_init(&self, residual: bool) -> LinearInit {
        match self.layout {
            Layout::Attnlab => LinearInit::Torch,
            Layout::Mad if self.autoencoder => LinearInit::Normal(Self::ZOOLOGY_STD),
            Layout::Mad => LinearInit::TorchZeroBias,
            Layout::Zoology if residual => {
                LinearInit::Normal(Self::ZOOLOGY_STD / (2.0 * self.n_layers as f64).sqrt())
            }
            Layout::Zoology => LinearInit::Normal(Self::ZOOLOGY_STD),
        }
    }

    /// A linear layer with a bias (`nn.Linear`), started as the layout says.
    pub fn linear(&self, dims: (usize, usize), residual: bool, params: &Params) -> Result<Linear> {
        Linear::new(
            dims,
            true,
            self.linear_init(residual),
            self.precision,
            params,
        )
    }

    /// How the token embedding starts.
    pub fn embedding_init(&self) -> Init {
        Init::Normal(Self::embedding_std(self.layout))
    }

    /// The token embedding's initial std in `layout` (learned position tables follow it).
    pub fn embedding_std(layout: Layout) -> f64 {
        match layout {
            Layout::Attnlab => 1.0,
            // mad-lab's `LanguageModel._init_weights`: N(0, 0.02), as zoology's.
            Layout::Zoology | Layout::Mad => Self::ZOOLOGY_STD,
        }
    }
}

/// The rows of x (B, T, D) at the flat positions `rows` (b·T + t): (R, D).
fn gather_rows(x: &Tensor, rows: &Tensor) -> Result<Tensor> {
    let (b, t, d) = x.dims3()?;
    // Rows picked by index are an embedding lookup with x as the table: its backward sums in a
    // fixed order with no (B·T, d) zero fill, where index_select's index_add took a single
    // block on a GPU.
    crate::ops::embedding(&x.reshape((b * t, d))?, rows)
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
    /// The MLP's GELU: exact (`gelu`, PyTorch's `nn.GELU()`) or GPT-2's tanh approximation.
    pub activation: Activation,
    /// x + mixer(norm₁(x)) + mlp(norm₂(x)) in each block instead of the MLP after the mixer
    /// (GPT-NeoX's and Pythia's `use_parallel_residual`).
    pub parallel_residual: bool,
    /// Mixer of each layer, repeated cyclically over the layers.
    pub mixers: Vec<MixerKind>,
    /// Kernel size of `short-conv` mixers (3 in zoology's BaseConv).
    pub conv_kernel: usize,
    /// Share the token embedding with the LM head (the zoology layout always does).
    pub tie_embeddings: bool,
    /// How the architecture is built: `attnlab` or `zoology` (see [`Layout`]).
    pub layout: Layout,
    /// Dropout on the input embeddings while training; unset = the layout's (zoology's
    /// `embed_dropout` 0.1, attnlab 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub embed_dropout: Option<f64>,
    /// Dropout on softmax attention's weights while training (zoology's MHA `dropout`; other
    /// mechanisms have none, as in zoology); unset = the layout's (zoology 0.1, attnlab 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attention_dropout: Option<f64>,
    /// What turns the last block's output into logits ([`Head`]); `auto` = the task's.
    #[serde(skip_serializing_if = "Head::is_auto")]
    pub head: Head,
}

/// What turns the last block's output into logits at each position.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Head {
    /// The task's own: MAD's auto-encoder for its compression probe, the LM head otherwise
    /// (the preset resolves it; a model built with `auto` has the LM head).
    #[default]
    Auto,
    /// The final norm, then a linear layer at every position: a language model's.
    Lm,
    /// MAD's auto-encoder (mad-lab's `AutoEncoder`): the blocks encode the sequence, its last
    /// position is pooled, and a decoder MLP writes every position p from the pool plus a
    /// sinusoid of p, so the sequence must pass through one vector.
    Autoencoder,
}

impl Head {
    /// Every head, in the editor's order.
    pub const ALL: [Self; 3] = [Self::Auto, Self::Lm, Self::Autoencoder];

    /// As presets spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Lm => "lm",
            Self::Autoencoder => "autoencoder",
        }
    }

    fn is_auto(&self) -> bool {
        *self == Self::Auto
    }
}

/// How the model is built. attnlab's and zoology's have the same blocks and differ where the
/// papers' code and PyTorch's defaults differ; MAD's changes the norms and the channel mixer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layout {
    /// PyTorch's module defaults (what `attnlab bench`'s PyTorch reference builds): linear
    /// layers U(±1/√in), embeddings N(0, 1), an untied LM head with a bias unless
    /// `tie_embeddings`, no dropout, and nothing between mixers when `mlp_ratio = 0`.
    #[default]
    Attnlab,
    /// zoology's MQAR model (`zoology/model.py`): linear weights N(0, 0.02) with zero biases,
    /// the residual outputs (attention's output projection, the MLP's down projection)
    /// N(0, 0.02/√(2·layers)) (GPT-2's scheme); embeddings N(0, 0.02); the LM head tied to
    /// the embedding, without a bias; dropout 0.1 on the embeddings and on softmax attention's
    /// weights; and with `mlp_ratio = 0` its Identity state mixer, which still adds
    /// LayerNorm(x) to the residual stream after every mixer.
    Zoology,
    /// MAD's model (mad-lab's `LanguageModel`, Poli et al. 2024): RMSNorm (ε 1e-5) before every
    /// sub-layer and at the end, SwiGLU channel mixers w3(silu(w1 x) ⊙ w2 x) without biases
    /// ([`Self::mlp_hidden`]), linear weights U(±1/√in) with zero biases, embeddings
    /// N(0, 0.02), an untied LM head with a bias, no dropout. Positions come from the
    /// encoding (RoPE in MAD).
    Mad,
}

impl Layout {
    /// Every layout, in the editor's order.
    pub const ALL: [Self; 3] = [Self::Attnlab, Self::Zoology, Self::Mad];

    /// As presets spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Attnlab => "attnlab",
            Self::Zoology => "zoology",
            Self::Mad => "mad",
        }
    }

    /// One line on what sets it apart, for the editor.
    pub fn summary(self) -> &'static str {
        match self {
            Self::Attnlab => "PyTorch's module defaults (the benchmark's reference)",
            Self::Zoology => {
                "zoology's MQAR model: N(0, 0.02) init, tied head, dropout 0.1, LayerNorm between mixers"
            }
            Self::Mad => {
                "MAD's model (Poli et al. 2024): RMSNorm, SwiGLU, zero biases, N(0, 0.02) embeddings, untied head"
            }
        }
    }

    /// Dropout on the embeddings when the preset leaves it unset.
    pub fn embed_dropout(self) -> f64 {
        match self {
            Self::Attnlab | Self::Mad => 0.0,
            Self::Zoology => 0.1,
        }
    }

    /// Whether the block and final norms are RMSNorm (weight only) rather than LayerNorm.
    pub fn rms_norm(self) -> bool {
        self == Self::Mad
    }

    /// The channel mixer's hidden width for `model.mlp_ratio` r at width d: r·d, or for
    /// MAD's SwiGLU 16·⌈int(2·r·d/3)/16⌉ (mad-lab's `mlp.py`: 352 at d 128, r 4), two thirds
    /// of it because SwiGLU has three matrices instead of two.
    pub fn mlp_hidden(self, d: usize, ratio: usize) -> usize {
        match self {
            Self::Mad => (2 * ratio * d / 3).div_ceil(16) * 16,
            Self::Attnlab | Self::Zoology => ratio * d,
        }
    }

    /// Dropout on softmax attention's weights when the preset leaves it unset.
    pub fn attention_dropout(self) -> f64 {
        self.embed_dropout()
    }
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            d_model: 128,
            n_layers: 2,
            n_heads: 2,
            mlp_ratio: 4,
            activation: Activation::Gelu,
            parallel_residual: false,
            mixers: vec![MixerKind::Attention],
            conv_kernel: 3,
            tie_embeddings: false,
            layout: Layout::Attnlab,
            embed_dropout: None,
            attention_dropout: None,
            head: Head::Auto,
        }
    }
}

/// The MLP's nonlinearity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Activation {
    /// GELU, x·Φ(x) with the erf (PyTorch's `nn.GELU()`, Pythia's `gelu`).
    #[default]
    Gelu,
    /// GELU's tanh approximation, 0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³))): GPT-2's and
    /// GPT-Neo's `gelu_new`, which their checkpoints were trained with.
    GeluTanh,
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
    /// Each head's value channels, ⌊d_model / n_heads⌋: H·head_dim may fall short of d_model
    /// (the output projection maps it back).
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_heads.max(1)
    }

    /// The mixer of layer `layer`.
    pub fn mixer(&self, layer: usize) -> MixerKind {
        self.mixers[layer % self.mixers.len()]
    }

    /// The dropout on the embeddings while training: the preset's, or the layout's.
    pub fn embed_dropout(&self) -> f64 {
        self.embed_dropout
            .unwrap_or_else(|| self.layout.embed_dropout())
    }

    /// The dropout on softmax attention's weights while training: the preset's, or the layout's.
    pub fn attention_dropout(&self) -> f64 {
        self.attention_dropout
            .unwrap_or_else(|| self.layout.attention_dropout())
    }

    /// The channel mixer's hidden width ([`Layout::mlp_hidden`]).
    pub fn mlp_hidden(&self) -> usize {
        self.layout.mlp_hidden(self.d_model, self.mlp_ratio)
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
        for (key, p) in [
            ("embed_dropout", self.embed_dropout),
            ("attention_dropout", self.attention_dropout),
        ] {
            if let Some(p) = p.filter(|p| !(0.0..1.0).contains(p)) {
                return Err(Error::preset(
                    format!("model.{key}"),
                    crate::error::number(p),
                    "must be in [0, 1)",
                ));
            }
        }
        // Heads need not divide the width: each gets ⌊d_model / n_heads⌋ value channels, as
        // zoology's and the ReBased paper's models (12 heads at d 64: 5 each, 60 in all).
        if self.n_heads > self.d_model {
            return Err(Error::preset(
                "model.n_heads",
                self.n_heads,
                format!(
                    "must be at most model.d_model = {} (each head needs a channel)",
                    self.d_model
                ),
            ));
        }
        if self.parallel_residual && self.mlp_ratio == 0 {
            return Err(Error::preset(
                "model.parallel_residual",
                true,
                "runs the MLP beside the mixer, and model.mlp_ratio = 0 has no MLP",
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A parallel residual needs the MLP it runs beside the mixer.
    #[test]
    fn a_parallel_residual_without_an_mlp_is_refused() {
        let parallel = |mlp_ratio| ModelConfig {
            parallel_residual: true,
            mlp_ratio,
            ..ModelConfig::default()
        };
        assert!(parallel(4).validate().is_ok());
        let error = parallel(0).validate().unwrap_err().to_string();
        assert!(error.contains("model.parallel_residual"), "{error}");
    }
}
