//! Positional encodings: where position enters the model.
//!
//! Three hooks cover every family in the papers, and each encoding overrides only its own:
//! - absolute encodings add a vector to the token embedding ([`Encoding::add_to_input`]);
//! - rotary encodings rotate queries and keys ([`Encoding::rotate`]);
//! - relative-bias encodings add `b(i − j)` to the attention logits ([`Encoding::logit_bias`]).
//!
//! The mechanism calls the hooks in a fixed order (rotate → scores → + bias → normalise), so
//! neither side knows about the other; combinations that make no sense are rejected by the
//! preset's validation, not at run time.

mod absolute;
mod alibi;
mod rope;

use std::sync::Arc;

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

pub use absolute::{Learned, Sinusoidal};
pub use alibi::{Alibi, alibi_slopes};
pub use rope::{Rope, RopeConfig};

use crate::Result;
use crate::params::Params;

/// Where an encoding acts; decides where the model builds it and what it may combine with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// No positional information at all.
    None,
    /// Added to the token embeddings once, before the first block.
    Absolute,
    /// An additive bias on the attention logits, per head and distance.
    Bias,
    /// A rotation of queries and keys.
    Rotary,
}

/// The `[encoding]` section of a preset. The names are the ones used everywhere (CLI, GUI, files).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum EncodingSpec {
    /// NoPE: no positional encoding (causal masking alone carries order).
    #[default]
    None,
    /// Learned absolute position embeddings, one vector per position (GPT-2, zoology).
    Learned,
    /// Fixed sinusoidal absolute embeddings (Vaswani et al. 2017).
    Sinusoidal,
    /// ALiBi: bias −m_h·(i − j) with geometric per-head slopes (Press et al. 2022).
    Alibi,
    /// RoPE: rotate q and k by position-dependent angles (Su et al. 2021).
    Rope(RopeConfig),
}

/// What the model needs to build an encoding.
#[derive(Clone, Copy, Debug)]
pub struct EncodingShape {
    pub d_model: usize,
    pub n_heads: usize,
    /// Per-head width of queries and keys (the width a rotary encoding rotates).
    pub qk_dim: usize,
    /// Longest sequence an absolute table must cover.
    pub max_len: usize,
}

/// A positional encoding, built for one model. Every hook defaults to "does nothing".
pub trait Encoding: Send + Sync {
    /// Absolute encodings: x (B, T, D) → x + P[0..T].
    fn add_to_input(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.clone())
    }

    /// Rotary encodings: rotate q, k (B, H, T, Dqk) by their positions 0..T.
    fn rotate(&self, q: &Tensor, k: &Tensor) -> Result<(Tensor, Tensor)> {
        Ok((q.clone(), k.clone()))
    }

    /// Relative encodings: the additive logit bias for a length-`t` sequence, (H, T, T) or
    /// (1, T, T), with entry [h, i, j] = b_h(i − j) for j ≤ i. `None` when there is no bias.
    fn logit_bias(&self, _t: usize) -> Result<Option<Tensor>> {
        Ok(None)
    }
}

/// The encoding that changes nothing, used where position does not enter.
pub struct NoEncoding;
impl Encoding for NoEncoding {}

impl EncodingSpec {
    /// Every encoding with its default settings, for pickers and for tests that loop over all.
    pub fn all_defaults() -> Vec<Self> {
        vec![
            Self::None,
            Self::Learned,
            Self::Sinusoidal,
            Self::Alibi,
            Self::Rope(RopeConfig::default()),
        ]
    }

    /// The name used in presets, the CLI, the GUI and file names.
    pub fn name(&self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Learned => "learned",
            Self::Sinusoidal => "sinusoidal",
            Self::Alibi => "alibi",
            Self::Rope(_) => "rope",
        }
    }

    /// One-line formula, shown in help and tooltips.
    pub fn formula(&self) -> &'static str {
        match self {
            Self::None => "no positional term",
            Self::Learned => "x_t + p_t, p learned",
            Self::Sinusoidal => "x_t + [sin(t/10000^(2i/d)), cos(t/10000^(2i/d))]",
            Self::Alibi => "logit + (-m_h (i - j)), m_h = 2^(-8h/H)",
            Self::Rope(_) => "q_i, k_j rotated by angle t*base^(-2i/d); score depends on i - j",
        }
    }

    pub fn family(&self) -> Family {
        match self {
            Self::None => Family::None,
            Self::Learned | Self::Sinusoidal => Family::Absolute,
            Self::Alibi => Family::Bias,
            Self::Rope(_) => Family::Rotary,
        }
    }

    /// Checks the encoding's own settings against the model shape; errors name `encoding.…`.
    pub fn validate(&self, shape: &EncodingShape) -> Result<()> {
        match self {
            Self::Rope(c) => c.validate(shape.qk_dim),
            _ => Ok(()),
        }
    }

    /// Builds the encoding; learned tables take their parameters from `params`.
    pub fn build(&self, shape: &EncodingShape, params: &Params) -> Result<Arc<dyn Encoding>> {
        Ok(match self {
            Self::None => Arc::new(NoEncoding),
            Self::Learned => Arc::new(Learned::new(shape, params)?),
            Self::Sinusoidal => Arc::new(Sinusoidal::new(shape, params.device())?),
            Self::Alibi => Arc::new(Alibi::new(shape.n_heads, params.device())),
            Self::Rope(c) => Arc::new(Rope::new(c, shape.qk_dim, params.device())),
        })
    }
}

/// A per-length cache for tables that only depend on the sequence length (masks, biases, angles).
#[derive(Default)]
pub(crate) struct LengthCache(std::sync::Mutex<std::collections::HashMap<usize, Tensor>>);

impl LengthCache {
    pub(crate) fn get_or(&self, t: usize, make: impl FnOnce() -> Result<Tensor>) -> Result<Tensor> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(hit) = map.get(&t) {
            return Ok(hit.clone());
        }
        let value = make()?;
        map.insert(t, value.clone());
        Ok(value)
    }
}
