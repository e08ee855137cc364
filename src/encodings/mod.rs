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
mod catalogue;
mod decay;
mod diet_abs;
mod kerple;
mod none;
mod profile;
mod relative;
mod rope;
mod sandwich;
mod table;

use std::sync::Arc;

use candle_core::Tensor;

pub use absolute::{Learned, LearnedConfig, Sinusoidal, SinusoidalConfig, sinusoidal_table};
pub use alibi::{AlibiConfig, alibi_heads, alibi_slopes};
pub use catalogue::{CATALOGUE, EncodingSpec, Facts, Variant};
pub use decay::{InvN, NLogNConfig, SeriesConfig, Type1, Type2, WindowConfig};
pub use diet_abs::DietAbsConfig;
pub use kerple::{KerpleLogConfig, KerplePowerConfig};
pub use none::NoneConfig;
pub use profile::{DistanceBias, Known, Verdict, known};
pub use rope::{
    LeakyReropeConfig, NtkConfig, PiConfig, Positions, ReropeConfig, RopeConfig, RotaryProfile,
};
pub use sandwich::SandwichConfig;
pub use table::{DietRelConfig, DietSharing, T5Config, t5_bucket};

use crate::{Error, Result};

/// Where an encoding acts; decides where the model builds it and what it may combine with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// No positional information at all.
    None,
    /// Added to the token embeddings once, before the first block.
    Absolute,
    /// An additive term on the attention logits, per head.
    Bias,
    /// A rotation of queries and keys.
    Rotary,
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
    /// The token embedding's initial std: a learned position table starts at the same scale
    /// (N(0, 1) like `nn.Embedding` in the attnlab layout, N(0, 0.02) in zoology's), so
    /// neither drowns the other.
    pub embedding_std: f64,
}

/// How a mechanism turns (positioned) queries and keys into a score per pair, (B, H, Tq, Tk).
pub type ScoreFn<'a> = &'a dyn Fn(&Tensor, &Tensor) -> Result<Tensor>;

/// A block of query rows, for evaluating long sequences without an n×n matrix: the queries at
/// positions `start..start + len` of a length-`total` sequence, against the causal prefix of
/// keys `0..start + len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueryBlock {
    pub start: usize,
    pub len: usize,
    pub total: usize,
}

impl QueryBlock {
    /// Every query of a length-`t` sequence at once (the explicit-matrix path).
    pub fn whole(t: usize) -> Self {
        Self {
            start: 0,
            len: t,
            total: t,
        }
    }

    /// Number of keys the block sees.
    pub fn keys(&self) -> usize {
        self.start + self.len
    }

    /// The blocks of at most `chunk` queries covering a length-`total` sequence.
    pub fn cover(total: usize, chunk: usize) -> impl Iterator<Item = Self> {
        let chunk = chunk.max(1);
        (0..total).step_by(chunk).map(move |start| Self {
            start,
            len: chunk.min(total - start),
            total,
        })
    }
}

/// A positional encoding, built for one model. Every hook defaults to "does nothing".
pub trait Encoding: Send + Sync {
    /// Absolute encodings: x (B, T, D) → x + P[0..T].
    fn add_to_input(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.clone())
    }

    /// The score of every query–key pair, q, k (B, H, T, Dqk). Rotary encodings position q
    /// and k before calling `score` (ReRoPE calls it twice and merges); the others pass them
    /// through. Mechanisms always go through here, so every mechanism supports every rotary
    /// variant.
    fn scores(&self, q: &Tensor, k: &Tensor, score: ScoreFn<'_>) -> Result<Tensor> {
        score(q, k)
    }

    /// [`Encoding::scores`] for one block of queries: q holds the block's rows, k the keys
    /// `0..block.keys()`. Only rotary encodings depend on where the block starts.
    fn block_scores(
        &self,
        q: &Tensor,
        k: &Tensor,
        _block: QueryBlock,
        score: ScoreFn<'_>,
    ) -> Result<Tensor> {
        score(q, k)
    }

    /// q and k of a whole sequence positioned so that `scores(q, k, f) = f(q', k')` for every
    /// score function f, when the encoding acts that way: unchanged for encodings that do not
    /// rotate, rotated at their own positions for RoPE, PI and NTK. `None` for ReRoPE, which
    /// merges two score matrices. Kernel mechanisms use it for their recurrent form.
    fn positioned(&self, q: &Tensor, k: &Tensor) -> Result<Option<(Tensor, Tensor)>> {
        Ok(Some((q.clone(), k.clone())))
    }

    /// Whether [`Encoding::logit_bias`] gives a bias, without building it: the fused training
    /// paths ask every step and take the explicit path when it does.
    fn has_logit_bias(&self) -> bool {
        false
    }

    /// Logit-bias encodings: the additive term for a length-`t` sequence, (H, T, T) or
    /// (1, T, T), entry [h, i, j] for key j ≤ i. `None` when there is no bias.
    fn logit_bias(&self, _t: usize) -> Result<Option<Tensor>> {
        Ok(None)
    }

    /// The rows of the bias for one block of queries, (H|1, len, keys). The default cuts them
    /// out of the full matrix; encodings that can be used on long sequences compute only them.
    fn block_bias(&self, block: QueryBlock) -> Result<Option<Tensor>> {
        Ok(self
            .logit_bias(block.keys())?
            .map(|b| b.narrow(1, block.start, block.len))
            .transpose()?)
    }

    /// Relative biases: p_h(t) per head as plain numbers, with the current parameter values.
    fn distance_biases(&self) -> Result<Option<Vec<Arc<dyn DistanceBias>>>> {
        Ok(None)
    }

    /// Rotary encodings: frequencies and position map, for the long-range decay curve.
    fn rotary_profile(&self) -> Option<RotaryProfile> {
        None
    }
}

/// The encoding that changes nothing, used where position does not enter.
pub struct NoEncoding;
impl Encoding for NoEncoding {}

impl EncodingSpec {
    /// Every encoding with its default settings, for pickers and for tests that loop over all.
    pub fn all_defaults() -> Vec<Self> {
        CATALOGUE.iter().map(|facts| (facts.default)()).collect()
    }

    /// The encoding called `name`, with default settings; the error lists every name.
    pub fn from_name(name: &str) -> Result<Self> {
        Self::all_defaults()
            .into_iter()
            .find(|spec| spec.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::all_defaults().iter().map(|s| s.name()).collect();
                Error::Unknown {
                    what: "encoding",
                    name: name.into(),
                    expected: names.join(", "),
                }
            })
    }

    /// The name used in presets, the CLI, the GUI and file names.
    pub fn name(&self) -> &'static str {
        self.facts().name
    }

    /// One-line formula, shown in help and tooltips (t = i − j, n = t + offset).
    pub fn formula(&self) -> &'static str {
        self.facts().formula
    }

    /// Where the encoding comes from and why one would pick it, for tooltips and help.
    pub fn summary(&self) -> &'static str {
        self.facts().summary
    }

    pub fn family(&self) -> Family {
        self.facts().family
    }

    /// Whether the encoding acts on q and k alone: no logit bias and one score matrix (not
    /// ReRoPE's two). The fused, chunked and recurrent forms need that; with the others every
    /// mechanism takes its explicit T × T form ([`Encoding::has_logit_bias`] and
    /// [`Encoding::positioned`] say the same of the built encoding).
    pub fn positions_q_and_k_alone(&self) -> bool {
        self.family() != Family::Bias && !matches!(self, Self::Rerope(_) | Self::LeakyRerope(_))
    }

    /// Whether training changes the encoding.
    pub fn is_learnable(&self) -> bool {
        self.facts().learnable
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
