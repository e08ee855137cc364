//! The rotary family, in the "rotate-half" layout (GPT-NeoX, candle's `rope_slow`): for a head
//! of width d, channel pairs (c, c + d/2) are rotated by the angle pos·θ_c, θ_c = base^(−2c/d).
//! Rotations go through [`crate::ops::rotary`] (one op with its gradient on the CPU, plain tensor
//! ops elsewhere), because candle's fused `rope` kernels have no backward pass. What each
//! variant changes is the relative position a pair of tokens t apart
//! is scored at:
//!
//! | name | relative position | source |
//! |---|---|---|
//! | `rope` | t | Su et al. 2021, arXiv 2104.09864 |
//! | `pi` | t / k | Chen et al. 2023, position interpolation |
//! | `ntk` | t, with base·α^(d/(d−2)) | "NTK-aware scaled RoPE" (bloc97, 2023) |
//! | `rerope` | min(t, w) | Su 2023, ReRoPE (spaces.ac.cn/archives/9708) |
//! | `leaky-rerope` | t below w, w + (t − w)/k beyond | same post |
//!
//! ReRoPE's positions are not linear in t, so no single rotation of q and k produces them: as
//! in the post, two score matrices are computed, standard RoPE (q at i, k at j) and a second
//! one (ReRoPE: q at w, k unrotated; Leaky: q at (i − w)/k + w, k at j/k), and merged by
//! distance (the first where i − j < w). The merge works for any score function: Based and
//! ReBased, whose kernels are functions of q·k, get exactly these relative positions; linear
//! attention applies elu + 1 after the rotation, so with it RoPE (and every variant) is not
//! purely relative, as in any RoPE + linear-attention model. All variants have no parameters,
//! so a model trained with `rope` runs with any of them at evaluation time.
//!
//! Every variant takes a `fraction` of each head's channels to rotate (GPT-NeoX's `rotary_pct`:
//! Pythia rotates 0.25): the first r = ⌊fraction·d⌋ (even) channels are rotated in the same
//! rotate-half layout within themselves, θ_c = base^(−2c/r), and the rest pass through as
//! without an encoding, as `GPTNeoXRotaryEmbedding` does.
//!
//! ReRoPE and Leaky ReRoPE also scale the queries as both of the post's patches do (log-n
//! scaling, `log_n = true` by default): the query at position i is multiplied by
//! max(1, ln(i + 1) / ln L), L the training length (`training_length`, by default the length
//! the model trained at), which sharpens attention past L.

use std::sync::Arc;

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use super::{
    Encoding, EncodingShape, EncodingSpec, Facts, Family, LengthCache, QueryBlock, ScoreFn, Variant,
};
use crate::ops;
use crate::params::Params;
use crate::settings::{Choices, Hyperparameter, Settings, Switch, real};
use crate::{Error, Result};

const DEFAULT_BASE: f64 = 10_000.0;

fn default_base() -> f64 {
    DEFAULT_BASE
}

/// `rope` settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RopeConfig {
    /// Base of the angle frequencies; 10000 in the paper.
    pub base: f64,
    /// Share of each head's channels rotated (1: all; Pythia 0.25).
    pub fraction: f64,
}

impl Default for RopeConfig {
    fn default() -> Self {
        Self {
            base: DEFAULT_BASE,
            fraction: all_channels(),
        }
    }
}

/// `pi` settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PiConfig {
    #[serde(default = "default_base")]
    pub base: f64,
    /// Share of each head's channels rotated (1: all; Pythia 0.25).
    #[serde(default = "all_channels")]
    pub fraction: f64,
    /// Interpolation factor k: positions are divided by it (k = target length / training length).
    #[serde(default = "default_scale")]
    pub scale: f64,
}

/// `ntk` settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NtkConfig {
    #[serde(default = "default_base")]
    pub base: f64,
    /// Share of each head's channels rotated (1: all; Pythia 0.25).
    #[serde(default = "all_channels")]
    pub fraction: f64,
    /// Length scale α: the base becomes base·α^(d/(d−2)).
    #[serde(default = "default_scale")]
    pub alpha: f64,
}

/// `rerope` settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReropeConfig {
    #[serde(default = "default_base")]
    pub base: f64,
    /// Share of each head's channels rotated (1: all; Pythia 0.25).
    #[serde(default = "all_channels")]
    pub fraction: f64,
    /// Window w: distances from w on are all scored at w.
    #[serde(default = "default_window")]
    pub window: usize,
    /// Scale the query at position i by max(1, ln(i + 1) / ln L), as the post's patches do.
    #[serde(default = "default_log_n")]
    pub log_n: bool,
    /// L of the log-n scaling; unset = the length the model trained at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training_length: Option<usize>,
}

/// `leaky-rerope` settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeakyReropeConfig {
    #[serde(default = "default_base")]
    pub base: f64,
    /// Share of each head's channels rotated (1: all; Pythia 0.25).
    #[serde(default = "all_channels")]
    pub fraction: f64,
    #[serde(default = "default_window")]
    pub window: usize,
    /// Beyond the window, positions grow with slope 1/k.
    #[serde(default = "default_leaky_scale")]
    pub scale: f64,
    /// Scale the query at position i by max(1, ln(i + 1) / ln L), as the post's patches do.
    #[serde(default = "default_log_n")]
    pub log_n: bool,
    /// L of the log-n scaling; unset = the length the model trained at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training_length: Option<usize>,
}

fn all_channels() -> f64 {
    1.0
}

fn default_log_n() -> bool {
    true
}

fn default_scale() -> f64 {
    4.0
}

/// ReRoPE's author finds w ≈ 1/4–1/2 of the training length best; 16 suits the 64-token MQAR
/// presets.
fn default_window() -> usize {
    16
}

fn default_leaky_scale() -> f64 {
    16.0
}

impl Default for PiConfig {
    fn default() -> Self {
        Self {
            base: DEFAULT_BASE,
            fraction: all_channels(),
            scale: default_scale(),
        }
    }
}

impl Default for NtkConfig {
    fn default() -> Self {
        Self {
            base: DEFAULT_BASE,
            fraction: all_channels(),
            alpha: default_scale(),
        }
    }
}

impl Default for ReropeConfig {
    fn default() -> Self {
        Self {
            base: DEFAULT_BASE,
            fraction: all_channels(),
            window: default_window(),
            log_n: default_log_n(),
            training_length: None,
        }
    }
}

impl Default for LeakyReropeConfig {
    fn default() -> Self {
        Self {
            base: DEFAULT_BASE,
            fraction: all_channels(),
            window: default_window(),
            scale: default_leaky_scale(),
            log_n: default_log_n(),
            training_length: None,
        }
    }
}

/// How positions are mapped before rotating.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Positions {
    /// Both q and k at position / scale (RoPE and NTK: scale 1; PI: k).
    Linear { scale: f64 },
    /// ReRoPE (`leak` = None) or Leaky ReRoPE (`leak` = Some(k)) with window w.
    Rectified { window: usize, leak: Option<f64> },
}

impl Positions {
    /// The relative position a pair of tokens `t` apart is scored at.
    pub fn effective(&self, t: f64) -> f64 {
        match *self {
            Self::Linear { scale } => t / scale,
            Self::Rectified { window, leak } => {
                let w = window as f64;
                match leak {
                    _ if t < w => t,
                    None => w,
                    Some(k) => w + (t - w) / k,
                }
            }
        }
    }
}

/// A rotary encoding as the analyses see it: the frequencies and the position map.
#[derive(Clone, Debug, PartialEq)]
pub struct RotaryProfile {
    /// θ_c = base^(−2c/r) for the r/2 rotated pairs, c = 0..r/2, then 0 for each pair of
    /// channels that passes through (a rotation by angle 0).
    pub thetas: Vec<f64>,
    pub positions: Positions,
    /// r, the channels rotated (the first r of each head).
    pub rotated: usize,
}

impl RotaryProfile {
    /// `base` for a head of width `dim`, every channel rotated.
    pub fn new(base: f64, dim: usize, positions: Positions) -> Self {
        Self::partial(base, (dim, dim), positions)
    }

    /// `base` for a head of width `dim` whose first `rotated` channels (even) are rotated.
    pub fn partial(base: f64, (dim, rotated): (usize, usize), positions: Positions) -> Self {
        let thetas = (0..rotated / 2)
            .map(|c| base.powf(-2.0 * c as f64 / rotated as f64))
            .chain(std::iter::repeat_n(0.0, (dim - rotated) / 2))
            .collect();
        Self {
            thetas,
            positions,
            rotated,
        }
    }

    /// The channels `fraction` of a head of width `dim` rotates: ⌊fraction·dim⌋ (GPT-NeoX's
    /// `int(head_size * rotary_pct)`), rounded down to even.
    pub fn rotated_channels(dim: usize, fraction: f64) -> usize {
        ((dim as f64 * fraction) as usize).min(dim) & !1
    }

    /// NTK-aware scaling's base for length scale α.
    pub fn ntk_base(base: f64, alpha: f64, dim: usize) -> f64 {
        base * alpha.powf(dim as f64 / (dim as f64 - 2.0))
    }
}

pub struct Rotary {
    profile: RotaryProfile,
    /// ReRoPE's log-n query scaling: the training length L, or `None` for no scaling.
    log_n: Option<usize>,
    device: Device,
    /// (cos, sin) for q and k at their own positions (mapped linearly), per length.
    own: LengthCache,
    /// (cos, sin) for the queries of the second score matrix, per length (one row for ReRoPE).
    second_q: LengthCache,
    /// (cos, sin) for the keys of the second score matrix (Leaky ReRoPE), per length.
    second_k: LengthCache,
    /// 1 where i − j < w (the first score matrix applies), per length.
    in_window: LengthCache,
}

impl Rotary {
    pub fn new(profile: RotaryProfile, device: &Device) -> Self {
        Self {
            profile,
            log_n: None,
            device: device.clone(),
            own: LengthCache::default(),
            second_q: LengthCache::default(),
            second_k: LengthCache::default(),
            in_window: LengthCache::default(),
        }
    }

    /// (cos, sin) tables, (2, n, r) for the r rotated channels, for the given positions.
    fn tables(&self, positions: impl Iterator<Item = f64>) -> Result<Tensor> {
        let dim = self.profile.rotated;
        let half = dim / 2;
        let positions: Vec<f64> = positions.collect();
        let n = positions.len();
        let mut data = vec![0f32; 2 * n * dim];
        for (row, pos) in positions.iter().enumerate() {
            for (c, theta) in self.profile.thetas[..half].iter().enumerate() {
                let (sin, cos) = (pos * theta).sin_cos();
                for offset in [c, c + half] {
                    data[row * dim + offset] = cos as f32;
                    data[(n + row) * dim + offset] = sin as f32;
                }
            }
        }
        Ok(Tensor::from_vec(data, (2, n, dim), &self.device)?)
    }

    /// Tables for q and k at positions 0..t under the linear map (RoPE, PI, NTK; the first
    /// score matrix of ReRoPE).
    fn own_tables(&self, t: usize) -> Result<Tensor> {
        let scale = match self.profile.positions {
            Positions::Linear { scale } => scale,
            Positions::Rectified { .. } => 1.0,
        };
        self.own
            .get_or(t, || self.tables((0..t).map(|i| i as f64 / scale)))
    }

    /// ReRoPE/Leaky ReRoPE: the scores where i − j ≥ w, for the block's queries.
    fn second_scores(
        &self,
        q: &Tensor,
        k: &Tensor,
        block: QueryBlock,
        (window, leak): (usize, Option<f64>),
        score: ScoreFn<'_>,
    ) -> Result<Tensor> {
        let t = block.total;
        let w = window as f64;
        match leak {
            None => {
                let at_w = self
                    .second_q
                    .get_or(1, || self.tables(std::iter::once(w)))?;
                score(&ops::rotary(q, &at_w)?, k)
            }
            Some(scale) => {
                let q_tables = self.second_q.get_or(t, || {
                    self.tables((0..t).map(|i| (i as f64 - w) / scale + w))
                })?;
                let k_tables = self
                    .second_k
                    .get_or(t, || self.tables((0..t).map(|j| j as f64 / scale)))?;
                score(
                    &ops::rotary(q, &query_rows(&q_tables, block)?)?,
                    &ops::rotary(k, &key_rows(&k_tables, block)?)?,
                )
            }
        }
    }

    /// The block's queries scaled by max(1, ln(i + 1) / ln L) at their positions i (log-n),
    /// or as they are without the scaling.
    fn scaled_queries(&self, q: &Tensor, block: QueryBlock) -> Result<Tensor> {
        let Some(train) = self.log_n else {
            return Ok(q.clone());
        };
        let ln_train = (train.max(2) as f64).ln();
        let factors: Vec<f32> = (block.start..block.start + block.len)
            .map(|i| ((i as f64 + 1.0).ln() / ln_train).max(1.0) as f32)
            .collect();
        if factors.iter().all(|&f| f == 1.0) {
            return Ok(q.clone());
        }
        let factors = Tensor::from_vec(factors, (block.len, 1), &self.device)?;
        Ok(q.broadcast_mul(&factors)?)
    }

    /// 1 where i − j < w (the first score matrix applies), (len, keys).
    fn window_mask(&self, block: QueryBlock, window: usize) -> Result<Tensor> {
        let make = || {
            let keys = block.keys();
            let data: Vec<f32> = (0..block.len * keys)
                .map(|rj| {
                    let i = block.start + rj / keys;
                    f32::from(u8::from(i.saturating_sub(rj % keys) < window))
                })
                .collect();
            Ok(Tensor::from_vec(data, (block.len, keys), &self.device)?)
        };
        if block == QueryBlock::whole(block.total) {
            self.in_window.get_or(block.total, make)
        } else {
            make()
        }
    }
}

/// The rows of (2, T, r) tables at the block's query positions.
fn query_rows(tables: &Tensor, block: QueryBlock) -> Result<Tensor> {
    Ok(tables.narrow(1, block.start, block.len)?)
}

/// The rows of (2, T, r) tables at the block's key positions.
fn key_rows(tables: &Tensor, block: QueryBlock) -> Result<Tensor> {
    Ok(tables.narrow(1, 0, block.keys())?)
}

impl Encoding for Rotary {
    fn scores(&self, q: &Tensor, k: &Tensor, score: ScoreFn<'_>) -> Result<Tensor> {
        self.block_scores(q, k, QueryBlock::whole(q.dim(2)?), score)
    }

    fn block_scores(
        &self,
        q: &Tensor,
        k: &Tensor,
        block: QueryBlock,
        score: ScoreFn<'_>,
    ) -> Result<Tensor> {
        let q = &self.scaled_queries(q, block)?;
        let own = self.own_tables(block.total)?;
        let first = score(
            &ops::rotary(q, &query_rows(&own, block)?)?,
            &ops::rotary(k, &key_rows(&own, block)?)?,
        )?;
        let Positions::Rectified { window, leak } = self.profile.positions else {
            return Ok(first);
        };
        let second = self.second_scores(q, k, block, (window, leak), score)?;
        let mask = self.window_mask(block, window)?;
        Ok((&second + (first - &second)?.broadcast_mul(&mask)?)?)
    }

    fn positioned(&self, q: &Tensor, k: &Tensor) -> Result<Option<(Tensor, Tensor)>> {
        if matches!(self.profile.positions, Positions::Rectified { .. }) {
            return Ok(None);
        }
        let own = self.own_tables(q.dim(2)?)?;
        Ok(Some((ops::rotary(q, &own)?, ops::rotary(k, &own)?)))
    }

    fn rotary_profile(&self) -> Option<RotaryProfile> {
        Some(self.profile.clone())
    }
}

/// The rotary encoding for a profile, shared behind an `Arc`.
pub fn rotary(profile: RotaryProfile, device: &Device) -> Arc<dyn Encoding> {
    Arc::new(Rotary::new(profile, device))
}

/// ReRoPE or Leaky ReRoPE (a rectified profile), with the log-n query scaling for training
/// length `log_n` when given.
pub fn rectified(
    profile: RotaryProfile,
    log_n: Option<usize>,
    device: &Device,
) -> Arc<dyn Encoding> {
    Arc::new(Rotary {
        log_n,
        ..Rotary::new(profile, device)
    })
}

const BASE: Hyperparameter =
    real("base", 2.0, 1e9, "RoPE frequency base (10000 in the paper)").log();
const FRACTION: Hyperparameter = real(
    "fraction",
    0.0,
    1.0,
    "share of each head's channels rotated, the first ones (GPT-NeoX's rotary_pct; Pythia \
     0.25); the rest pass through unencoded",
);
const REROPE_WINDOW: Hyperparameter = real(
    "window",
    1.0,
    1_048_576.0,
    "distances from w on are clipped",
)
.whole();
const TRAINING_LENGTH: Hyperparameter = real(
    "training_length",
    2.0,
    1_048_576.0,
    "L of the log-n query scaling max(1, ln(i+1)/ln L); unset = the length the model trained at",
)
.whole();
const LOG_N: &[Switch] = &[Switch {
    key: "log_n",
    label: "log-n: queries scaled by max(1, ln(i+1)/ln L) (the post's patches)",
    choices: Choices::Toggle,
}];

/// RoPE with `base` on `fraction` of each head's channels, at `positions`, for a model of
/// `shape`.
fn rotary_at(
    (base, fraction): (f64, f64),
    positions: Positions,
    shape: &EncodingShape,
    params: &Params,
) -> Arc<dyn Encoding> {
    rotary(
        profile_of(base, fraction, positions, shape),
        params.device(),
    )
}

/// The profile of RoPE with `base` on `fraction` of each head's channels.
fn profile_of(
    base: f64,
    fraction: f64,
    positions: Positions,
    shape: &EncodingShape,
) -> RotaryProfile {
    let rotated = RotaryProfile::rotated_channels(shape.qk_dim, fraction);
    RotaryProfile::partial(base, (shape.qk_dim, rotated), positions)
}

/// Refuses a `fraction` that rotates fewer than `least` channels of a head.
fn check_fraction(fraction: f64, least: usize, shape: &EncodingShape) -> Result<()> {
    let rotated = RotaryProfile::rotated_channels(shape.qk_dim, fraction);
    if rotated >= least {
        return Ok(());
    }
    Err(Error::preset(
        "encoding.fraction",
        fraction,
        format!(
            "rotates {rotated} of the head's {} channels; it needs at least {least}",
            shape.qk_dim
        ),
    ))
}

static ROPE_FACTS: Facts = Facts {
    name: "rope",
    family: Family::Rotary,
    learnable: false,
    formula: "q_i, k_j rotated by angle pos*base^(-2c/d); relative position t",
    summary: "Su et al. 2021: rotate q and k by position; relative by design.",
    settings: Settings::of(&[BASE, FRACTION]),
    default: || EncodingSpec::Rope(RopeConfig::default()),
};

impl Variant for RopeConfig {
    const FACTS: &'static Facts = &ROPE_FACTS;

    fn build(&self, shape: &EncodingShape, params: &Params) -> Result<Arc<dyn Encoding>> {
        Ok(rotary_at(
            (self.base, self.fraction),
            Positions::Linear { scale: 1.0 },
            shape,
            params,
        ))
    }

    fn parameters(&self, _shape: &EncodingShape) -> usize {
        0
    }

    fn validate(&self, shape: &EncodingShape) -> Result<()> {
        check_fraction(self.fraction, 2, shape)
    }
}

static PI_FACTS: Facts = Facts {
    name: "pi",
    family: Family::Rotary,
    learnable: false,
    formula: "RoPE at positions pos/k; relative position t/k",
    summary: "Chen et al. 2023: interpolate positions by k to reach k times longer.",
    settings: Settings::of(&[
        BASE,
        FRACTION,
        real("scale", 1.0, 1024.0, "positions are divided by k").log(),
    ]),
    default: || EncodingSpec::Pi(PiConfig::default()),
};

impl Variant for PiConfig {
    const FACTS: &'static Facts = &PI_FACTS;

    fn build(&self, shape: &EncodingShape, params: &Params) -> Result<Arc<dyn Encoding>> {
        let positions = Positions::Linear { scale: self.scale };
        Ok(rotary_at(
            (self.base, self.fraction),
            positions,
            shape,
            params,
        ))
    }

    fn parameters(&self, _shape: &EncodingShape) -> usize {
        0
    }

    fn validate(&self, shape: &EncodingShape) -> Result<()> {
        check_fraction(self.fraction, 2, shape)
    }
}

static NTK_FACTS: Facts = Facts {
    name: "ntk",
    family: Family::Rotary,
    learnable: false,
    formula: "RoPE with base*alpha^(d/(d-2)); relative position t",
    summary: "bloc97 2023: stretch RoPE's base instead of the positions.",
    settings: Settings::of(&[
        BASE,
        FRACTION,
        real("alpha", 1.0, 1024.0, "length scale alpha").log(),
    ]),
    default: || EncodingSpec::Ntk(NtkConfig::default()),
};

impl Variant for NtkConfig {
    const FACTS: &'static Facts = &NTK_FACTS;

    fn build(&self, shape: &EncodingShape, params: &Params) -> Result<Arc<dyn Encoding>> {
        // The rotated channels' width, as GPT-NeoX's scaled rotary embeddings take it.
        let rotated = RotaryProfile::rotated_channels(shape.qk_dim, self.fraction);
        let base = RotaryProfile::ntk_base(self.base, self.alpha, rotated);
        Ok(rotary_at(
            (base, self.fraction),
            Positions::Linear { scale: 1.0 },
            shape,
            params,
        ))
    }

    fn parameters(&self, _shape: &EncodingShape) -> usize {
        0
    }

    /// NTK scales the base by alpha^(r/(r−2)), r the rotated channels: at least 4.
    fn validate(&self, shape: &EncodingShape) -> Result<()> {
        check_fraction(self.fraction, 4, shape)
    }
}

/// ReRoPE or Leaky ReRoPE (`leak` = its k) for a model of `shape`.
fn rectified_at(
    ((base, fraction), window, leak): ((f64, f64), usize, Option<f64>),
    (log_n, training_length): (bool, Option<usize>),
    shape: &EncodingShape,
    params: &Params,
) -> Arc<dyn Encoding> {
    let profile = profile_of(base, fraction, Positions::Rectified { window, leak }, shape);
    let log_n = log_n.then(|| training_length.unwrap_or(shape.max_len));
    rectified(profile, log_n, params.device())
}

static REROPE_FACTS: Facts = Facts {
    name: "rerope",
    family: Family::Rotary,
    learnable: false,
    formula: "RoPE with relative position min(t, w)",
    summary: "Su 2023: clip relative positions at w at inference time.",
    settings: Settings {
        numbers: &[BASE, FRACTION, REROPE_WINDOW, TRAINING_LENGTH],
        switches: LOG_N,
    },
    default: || EncodingSpec::Rerope(ReropeConfig::default()),
};

impl Variant for ReropeConfig {
    const FACTS: &'static Facts = &REROPE_FACTS;

    fn build(&self, shape: &EncodingShape, params: &Params) -> Result<Arc<dyn Encoding>> {
        let log_n = (self.log_n, self.training_length);
        Ok(rectified_at(
            ((self.base, self.fraction), self.window, None),
            log_n,
            shape,
            params,
        ))
    }

    fn parameters(&self, _shape: &EncodingShape) -> usize {
        0
    }

    fn at_training_length(&mut self, len: usize) {
        self.training_length.get_or_insert(len);
    }

    fn validate(&self, shape: &EncodingShape) -> Result<()> {
        check_fraction(self.fraction, 2, shape)
    }
}

static LEAKY_REROPE_FACTS: Facts = Facts {
    name: "leaky-rerope",
    family: Family::Rotary,
    learnable: false,
    formula: "RoPE with relative position t below w, w + (t - w)/k beyond",
    summary: "Su 2023: compress relative positions beyond w by 1/k.",
    settings: Settings {
        numbers: &[
            BASE,
            FRACTION,
            REROPE_WINDOW,
            real("scale", 1.0, 1e6, "slope 1/k beyond the window").log(),
            TRAINING_LENGTH,
        ],
        switches: LOG_N,
    },
    default: || EncodingSpec::LeakyRerope(LeakyReropeConfig::default()),
};

impl Variant for LeakyReropeConfig {
    const FACTS: &'static Facts = &LEAKY_REROPE_FACTS;

    fn build(&self, shape: &EncodingShape, params: &Params) -> Result<Arc<dyn Encoding>> {
        let rectified = ((self.base, self.fraction), self.window, Some(self.scale));
        let log_n = (self.log_n, self.training_length);
        Ok(rectified_at(rectified, log_n, shape, params))
    }

    fn parameters(&self, _shape: &EncodingShape) -> usize {
        0
    }

    fn at_training_length(&mut self, len: usize) {
        self.training_length.get_or_insert(len);
    }

    fn validate(&self, shape: &EncodingShape) -> Result<()> {
        check_fraction(self.fraction, 2, shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::dot_scores;
    use crate::settings::Section;
    use candle_core::D;

    /// A query and a key vector that differ, so a rotation applied to the wrong side (or with
    /// the wrong sign) changes the score.
    fn q_and_k() -> (Tensor, Tensor) {
        let q = Tensor::new(&[0.3f32, -1.2, 0.7, 0.5], &Device::Cpu).unwrap();
        let k = Tensor::new(&[-0.4f32, 0.9, 1.1, -0.6], &Device::Cpu).unwrap();
        (
            q.reshape((1, 1, 1, 4)).unwrap(),
            k.reshape((1, 1, 1, 4)).unwrap(),
        )
    }

    /// Scores of the same q and k at every position, (T, T), for the given position map.
    fn constant_scores(positions: Positions, t: usize) -> Vec<Vec<f32>> {
        let rope = Rotary::new(RotaryProfile::new(10_000.0, 4, positions), &Device::Cpu);
        scores_of(&rope, t)
    }

    /// Scores of the same q and k at every position, (T, T), under `encoding`.
    fn scores_of(encoding: &dyn Encoding, t: usize) -> Vec<Vec<f32>> {
        let (q, k) = q_and_k();
        let q = q.repeat((1, 1, t, 1)).unwrap();
        let k = k.repeat((1, 1, t, 1)).unwrap();
        let s = encoding
            .scores(&q, &k, &|q, k| dot_scores(q, k, 1.0))
            .unwrap();
        s.squeeze(0)
            .unwrap()
            .squeeze(0)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap()
    }

    /// Log-n: the query at position i is scaled by max(1, ln(i + 1) / ln L), so every score
    /// of row i is that many times the unscaled one (both score matrices of ReRoPE are linear
    /// in q); rows before L are unchanged. L = 4 here, so row 15 is scaled by ln 16 / ln 4 = 2.
    #[test]
    fn log_n_scales_each_query_row_by_its_factor() {
        let profile = RotaryProfile::new(
            10_000.0,
            4,
            Positions::Rectified {
                window: 3,
                leak: None,
            },
        );
        let t = 20;
        let scores = |log_n| scores_of(rectified(profile.clone(), log_n, &Device::Cpu).as_ref(), t);
        let (plain, scaled) = (scores(None), scores(Some(4)));
        for i in 0..t {
            let factor = ((i as f64 + 1.0).ln() / 4f64.ln()).max(1.0) as f32;
            for j in 0..=i {
                assert!(
                    (scaled[i][j] - factor * plain[i][j]).abs() < 1e-5,
                    "row {i}, key {j}"
                );
            }
        }
        assert!((((16f64).ln() / 4f64.ln()) - 2.0).abs() < 1e-12);
        assert_eq!(scaled[3], plain[3], "positions before L are not scaled");
    }

    /// ReRoPE's training length defaults to the length the model trained at.
    #[test]
    fn rerope_takes_the_training_length_of_the_run() {
        let spec = crate::encodings::EncodingSpec::Rerope(ReropeConfig::default());
        let resolved = spec.at_training_length(64);
        let crate::encodings::EncodingSpec::Rerope(c) = resolved else {
            unreachable!()
        };
        assert_eq!((c.log_n, c.training_length), (true, Some(64)));
        let kept = crate::encodings::EncodingSpec::Rerope(c).at_training_length(256);
        assert_eq!(
            kept.value("training_length"),
            Some(64.0),
            "an explicit length stays"
        );
    }

    /// Plain RoPE's score of q at position `d` against k at position 0: relative position d.
    fn rope_score_at(d: f64) -> f32 {
        let rope = Rotary::new(
            RotaryProfile::new(10_000.0, 4, Positions::Linear { scale: 1.0 }),
            &Device::Cpu,
        );
        let (q, k) = q_and_k();
        let q = ops::rotary(&q, &rope.tables(std::iter::once(d)).unwrap()).unwrap();
        let k = ops::rotary(&k, &rope.tables(std::iter::once(0.0)).unwrap()).unwrap();
        dot_scores(&q, &k, 1.0)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()[0]
    }

    /// GPT-NeoX's partial rotary (`rotary_pct`): a head of 8 at fraction 0.5 rotates channels
    /// 0..4 in the rotate-half layout within them, θ_c = base^(−2c/4), pairs (c, c + 2), and
    /// leaves channels 4..8 as they are.
    #[test]
    fn a_fraction_rotates_the_first_channels_within_themselves() {
        let profile = RotaryProfile::partial(100.0, (8, 4), Positions::Linear { scale: 1.0 });
        assert_eq!(profile.thetas, [1.0, 0.1, 0.0, 0.0]);
        let rope = Rotary::new(profile, &Device::Cpu);
        let x: Vec<f32> = (1..=8).map(|i| i as f32 * 0.25).collect();
        let input = Tensor::from_vec(x.clone(), (1, 1, 1, 8), &Device::Cpu).unwrap();
        let position = 3.0;
        let tables = rope.tables(std::iter::once(position)).unwrap();
        let out = ops::rotary(&input, &tables).unwrap().flatten_all().unwrap();
        let out = out.to_vec1::<f32>().unwrap();
        let mut expected = x.clone();
        for (c, theta) in [1.0f64, 0.1].into_iter().enumerate() {
            let (sin, cos) = (position * theta).sin_cos();
            let (a, b) = (x[c] as f64, x[c + 2] as f64);
            expected[c] = (a * cos - b * sin) as f32;
            expected[c + 2] = (b * cos + a * sin) as f32;
        }
        for (o, e) in out.iter().zip(&expected) {
            assert!((o - e).abs() < 1e-6, "{out:?} against {expected:?}");
        }
    }

    /// ⌊fraction·d⌋ rounded down to even, as GPT-NeoX's int(head_size·rotary_pct): Pythia's
    /// heads of 64 at 0.25 rotate 16; a fraction that rotates fewer than 2 (4 for NTK) is
    /// refused in words.
    #[test]
    fn the_rotated_channels_follow_gpt_neox_and_too_few_are_refused() {
        assert_eq!(RotaryProfile::rotated_channels(64, 0.25), 16);
        assert_eq!(RotaryProfile::rotated_channels(6, 0.5), 2);
        assert_eq!(RotaryProfile::rotated_channels(8, 1.0), 8);
        let shape = EncodingShape {
            d_model: 32,
            n_heads: 4,
            qk_dim: 8,
            max_len: 16,
            embedding_std: 1.0,
        };
        let rope = |fraction| RopeConfig {
            fraction,
            ..RopeConfig::default()
        };
        assert!(rope(0.25).validate(&shape).is_ok());
        let error = rope(0.2).validate(&shape).unwrap_err().to_string();
        assert!(
            error.contains("encoding.fraction") && error.contains("at least 2"),
            "{error}"
        );
        let ntk = NtkConfig {
            fraction: 0.25,
            ..NtkConfig::default()
        };
        assert!(
            ntk.validate(&shape)
                .unwrap_err()
                .to_string()
                .contains("at least 4")
        );
    }

    #[test]
    fn distinct_q_and_k_tell_the_sign_of_the_relative_position() {
        assert!((rope_score_at(3.0) - rope_score_at(-3.0)).abs() > 1e-3);
    }

    #[test]
    fn rope_scores_depend_on_relative_position_only() {
        let s = constant_scores(Positions::Linear { scale: 1.0 }, 8);
        assert!((s[5][2] - s[3][0]).abs() < 1e-5);
        assert!((s[7][7] - s[0][0]).abs() < 1e-5);
        assert!((s[5][2] - rope_score_at(3.0)).abs() < 1e-5);
    }

    #[test]
    fn rerope_scores_distances_beyond_the_window_at_the_window() {
        let s = constant_scores(
            Positions::Rectified {
                window: 3,
                leak: None,
            },
            8,
        );
        for (i, j) in [(7usize, 0usize), (6, 1), (5, 3), (2, 0)] {
            let d = (i - j).min(3) as f64;
            assert!((s[i][j] - rope_score_at(d)).abs() < 1e-5, "({i}, {j})");
        }
    }

    #[test]
    fn leaky_rerope_grows_with_slope_one_over_k_beyond_the_window() {
        let positions = Positions::Rectified {
            window: 3,
            leak: Some(2.0),
        };
        let s = constant_scores(positions, 8);
        for (i, j) in [(7usize, 0usize), (6, 2), (4, 0), (2, 1)] {
            let t = (i - j) as f64;
            let want = if t < 3.0 { t } else { 3.0 + (t - 3.0) / 2.0 };
            assert_eq!(positions.effective(t), want);
            assert!((s[i][j] - rope_score_at(want)).abs() < 1e-5, "({i}, {j})");
        }
    }

    #[test]
    fn effective_positions_match_the_post() {
        // The reference's C2 table: L = 8, w = 3, k = 2.
        let leaky = Positions::Rectified {
            window: 3,
            leak: Some(2.0),
        };
        let rerope = Positions::Rectified {
            window: 3,
            leak: None,
        };
        let pi = Positions::Linear { scale: 2.0 };
        let at = |p: Positions| (0..8).map(|t| p.effective(t as f64)).collect::<Vec<_>>();
        assert_eq!(at(leaky), vec![0.0, 1.0, 2.0, 3.0, 3.5, 4.0, 4.5, 5.0]);
        assert_eq!(at(rerope), vec![0.0, 1.0, 2.0, 3.0, 3.0, 3.0, 3.0, 3.0]);
        assert_eq!(at(pi), vec![0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]);
    }

    #[test]
    fn ntk_base_grows_with_alpha() {
        let b = RotaryProfile::ntk_base(10_000.0, 4.0, 64);
        assert!((b - 10_000.0 * 4f64.powf(64.0 / 62.0)).abs() < 1e-6);
    }

    #[test]
    fn rotation_keeps_the_norm() {
        let rope = Rotary::new(
            RotaryProfile::new(10_000.0, 4, Positions::Linear { scale: 1.0 }),
            &Device::Cpu,
        );
        let x = Tensor::new(
            &[[[[1f32, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]]]],
            &Device::Cpu,
        )
        .unwrap();
        let q = ops::rotary(&x, &rope.own_tables(2).unwrap()).unwrap();
        let norms = q
            .sqr()
            .unwrap()
            .sum(D::Minus1)
            .unwrap()
            .flatten_all()
            .unwrap();
        assert!((norms.to_vec1::<f32>().unwrap()[1] - 30.0).abs() < 1e-4);
    }
}
