//! The one list of encodings. Each encoding's file states everything about it: its config
//! (its `[encoding]` settings), its [`Facts`] (name, family, formula, summary, its settings'
//! ranges and switches), how to build it and the parameters it holds, as an implementation of
//! [`Variant`]. The list below turns those files into [`EncodingSpec`] (the preset section),
//! [`CATALOGUE`] (what the pickers, the CLI, validation and the tests read) and the dispatch of
//! every [`Variant`] method. A new encoding is its file (or a section of its family's file),
//! its `mod` line and one line here; [`Variant::parameters`] has no default, so it does not
//! compile until it states what the memory estimate should count.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{
    AlibiConfig, DietAbsConfig, DietRelConfig, Encoding, EncodingShape, Family, InvN,
    KerpleLogConfig, KerplePowerConfig, LeakyReropeConfig, LearnedConfig, NLogNConfig, NoneConfig,
    NtkConfig, PiConfig, ReropeConfig, RopeConfig, SandwichConfig, SeriesConfig, SinusoidalConfig,
    T5Config, Type1, Type2, WindowConfig,
};
use crate::params::Params;
use crate::settings::{Section, Settings};
use crate::{Error, Result};

/// What there is to know about one encoding, apart from how to build it.
#[derive(Debug)]
pub struct Facts {
    /// The name used in presets, the CLI, the GUI and file names.
    pub name: &'static str,
    pub family: Family,
    /// Whether training changes the encoding.
    pub learnable: bool,
    /// One-line formula (t = i − j, n = t + offset).
    pub formula: &'static str,
    /// Where the encoding comes from and why one would pick it.
    pub summary: &'static str,
    /// Its settings under `[encoding]`.
    pub settings: Settings,
    /// The encoding with its default settings.
    pub default: fn() -> EncodingSpec,
}

/// What an encoding's config states about it: the rest of attnlab reaches an encoding only
/// through these, dispatched by the list below.
pub trait Variant {
    /// Its entry of the [`CATALOGUE`].
    const FACTS: &'static Facts;

    /// Builds the encoding; learned parameters come from `params` (the model passes
    /// `blocks.{l}.pos` for per-layer encodings, the root otherwise).
    fn build(&self, shape: &EncodingShape, params: &Params) -> Result<Arc<dyn Encoding>>;

    /// The parameters one copy holds (`preset::estimate` counts them). No default: a new
    /// encoding states its own.
    fn parameters(&self, shape: &EncodingShape) -> usize;

    /// Checks what its settings' ranges alone cannot, against the model's shape; errors
    /// name `encoding.…`.
    fn validate(&self, _shape: &EncodingShape) -> Result<()> {
        Ok(())
    }

    /// Whether every attention layer gets its own copy rather than one shared by all.
    fn is_per_layer(&self) -> bool {
        false
    }

    /// Fills in the settings whose default is the length the model trained at.
    fn at_training_length(&mut self, _len: usize) {}
}

/// Writes [`EncodingSpec`], [`CATALOGUE`] and the dispatch of [`Variant`] from the list of
/// variants and their configs.
macro_rules! encodings {
    ($($(#[$doc:meta])* $variant:ident($config:ty),)+) => {
        /// The `[encoding]` section of a preset: `kind` names the encoding, the other keys are
        /// its config's. [`EncodingSpec::formula`] and the module docs say what each computes.
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
        pub enum EncodingSpec {
            $($(#[$doc])* $variant($config),)+
        }

        /// Every encoding, in the order pickers and tables list them.
        pub static CATALOGUE: [&Facts; [$(stringify!($variant)),+].len()] =
            [$(<$config as Variant>::FACTS),+];

        impl EncodingSpec {
            /// This encoding's entry of the [`CATALOGUE`].
            pub fn facts(&self) -> &'static Facts {
                match self {
                    $(Self::$variant(_) => <$config as Variant>::FACTS,)+
                }
            }

            /// Builds the encoding ([`Variant::build`]).
            pub fn build(
                &self,
                shape: &EncodingShape,
                params: &Params,
            ) -> Result<Arc<dyn Encoding>> {
                match self {
                    $(Self::$variant(c) => c.build(shape, params),)+
                }
            }

            /// The parameters one copy holds ([`Variant::parameters`]).
            pub fn parameters(&self, shape: &EncodingShape) -> usize {
                match self {
                    $(Self::$variant(c) => c.parameters(shape),)+
                }
            }

            /// Whether every attention layer gets its own copy (DIET without sharing) rather
            /// than one encoding shared by all.
            pub fn is_per_layer(&self) -> bool {
                match self {
                    $(Self::$variant(c) => c.is_per_layer(),)+
                }
            }

            /// The settings whose default is the length the model trained at, filled in with
            /// `len`: ReRoPE's log-n `training_length`, and an unclipped DIET-REL's
            /// `max_distance` (one scalar per distance training saw; farther distances share
            /// the last). Model builders pass the training length, so a model evaluated at
            /// other lengths keeps its own.
            pub fn at_training_length(&self, len: usize) -> Self {
                let mut spec = self.clone();
                match &mut spec {
                    $(Self::$variant(c) => c.at_training_length(len),)+
                }
                spec
            }

            /// Checks the encoding's own settings against the model shape; errors name
            /// `encoding.…`.
            pub fn validate(&self, shape: &EncodingShape) -> Result<()> {
                self.validate_ranges()?;
                if self.family() == Family::Rotary && !shape.qk_dim.is_multiple_of(2) {
                    return Err(Error::preset(
                        "encoding.kind",
                        self.name(),
                        format!(
                            "rotates channel pairs, so the per-head query/key width must be even (it is {})",
                            shape.qk_dim
                        ),
                    ));
                }
                match self {
                    $(Self::$variant(c) => c.validate(shape),)+
                }
            }
        }
    };
}

encodings! {
    /// NoPE: no positional encoding (causal masking alone carries order).
    None(NoneConfig),
    /// Learned absolute position embeddings, one vector per position (GPT-2, zoology).
    Learned(LearnedConfig),
    /// Fixed sinusoidal absolute embeddings (Vaswani et al. 2017).
    Sinusoidal(SinusoidalConfig),
    /// ALiBi: bias −m_h·t with geometric per-head slopes (Press et al. 2022).
    Alibi(AlibiConfig),
    /// KERPLE log kernel −r·ln(1 + k·t), learnable per head.
    KerpleLog(KerpleLogConfig),
    /// KERPLE power kernel −k·t^r, learnable per head.
    KerplePower(KerplePowerConfig),
    /// Sandwich: inner product of sinusoidal embeddings t apart.
    Sandwich(SandwichConfig),
    /// The Rpe paper's Type 1: exp(bias) = 1/n².
    Type1(SeriesConfig<Type1>),
    /// The Rpe paper's Type 2: exp(bias) = exp(−ln² n).
    Type2(SeriesConfig<Type2>),
    /// Divergent control: exp(bias) = 1/n.
    InvN(SeriesConfig<InvN>),
    /// Divergent control: exp(bias) = 1/(n ln n).
    InvNLogN(NLogNConfig),
    /// Sliding window of `width` tokens.
    Window(WindowConfig),
    /// T5's learned bias per log-spaced distance bucket.
    T5(T5Config),
    /// DIET-REL: a learned scalar per (clipped) distance.
    DietRel(DietRelConfig),
    /// DIET-ABS: a learned low-rank positional term P_Q P_Kᵀ per head.
    DietAbs(DietAbsConfig),
    /// RoPE: rotate q and k by position-dependent angles (Su et al. 2021).
    Rope(RopeConfig),
    /// RoPE with position interpolation (positions / k).
    Pi(PiConfig),
    /// RoPE with NTK-aware base scaling.
    Ntk(NtkConfig),
    /// ReRoPE: relative positions clipped at the window.
    Rerope(ReropeConfig),
    /// Leaky ReRoPE: slope 1/k beyond the window.
    LeakyRerope(LeakyReropeConfig),
}

impl Default for EncodingSpec {
    fn default() -> Self {
        Self::None(NoneConfig::default())
    }
}

impl Section for EncodingSpec {
    const SECTION: &'static str = "encoding";

    fn kind(&self) -> &'static str {
        self.name()
    }

    fn settings(&self) -> &'static Settings {
        &self.facts().settings
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encodings::EncodingShape;
    use crate::params::Params;
    use candle_core::{Device, Tensor};

    crate::settings::test_catalogue!(CATALOGUE);

    #[test]
    fn values_are_read_and_written_through_serde() {
        let spec = EncodingSpec::from_name("leaky-rerope").unwrap();
        assert_eq!(spec.value("window"), Some(16.0));
        let wider = spec.with_value("window", 32.0).unwrap();
        assert_eq!(wider.value("window"), Some(32.0));
        assert_eq!(wider.value("scale"), Some(16.0));
    }

    #[test]
    fn non_numeric_settings_are_read_as_toml() {
        let spec = EncodingSpec::from_name("diet-rel").unwrap();
        let shared = spec.with_setting("sharing", "layerwise").unwrap();
        assert!(!shared.is_per_layer() && spec.is_per_layer());
        let sandwich = EncodingSpec::from_name("sandwich").unwrap();
        assert_eq!(
            sandwich
                .with_setting("per_head", "true")
                .unwrap()
                .value("k"),
            Some(1.0)
        );
        assert!(sandwich.with_setting("per_head", "maybe").is_err());
        assert!(sandwich.with_setting("k", "-1").is_err());
    }

    #[test]
    fn out_of_range_values_name_the_key_and_the_range() {
        let spec = EncodingSpec::from_name("kerple-power").unwrap();
        let err = spec.with_value("r", 3.0).unwrap_err().to_string();
        assert!(
            err.contains("encoding.r = 3") && err.contains("0.01..=2"),
            "{err}"
        );
        let err = spec.with_value("slope", 1.0).unwrap_err().to_string();
        assert!(err.contains("has no such setting (it has: k, r)"), "{err}");
        let window = EncodingSpec::from_name("window").unwrap();
        assert!(window.with_value("width", 2.5).is_err());
    }

    /// The cheap flag the fused training paths read says what building the bias would.
    #[test]
    fn every_encoding_says_whether_it_has_a_logit_bias() {
        let shape = EncodingShape {
            d_model: 16,
            n_heads: 2,
            qk_dim: 8,
            max_len: 16,
            embedding_std: 0.02,
        };
        let mut biased = 0;
        for spec in EncodingSpec::all_defaults() {
            let encoding = spec.build(&shape, &Params::new(0, &Device::Cpu)).unwrap();
            let has = encoding.logit_bias(8).unwrap().is_some();
            assert_eq!(encoding.has_logit_bias(), has, "{}", spec.name());
            biased += usize::from(has);
            // The preset's flag (memory estimate, recurrent state) says what the built
            // encoding tells the mechanisms' fused and chunked forms.
            let q = Tensor::zeros((1, 2, 8, 8), candle_core::DType::F32, &Device::Cpu).unwrap();
            let alone = !has && encoding.positioned(&q, &q).unwrap().is_some();
            assert_eq!(spec.positions_q_and_k_alone(), alone, "{}", spec.name());
        }
        assert!(
            biased > 0,
            "no encoding with a bias: the flag is never tested"
        );
    }
}
