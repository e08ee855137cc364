//! The one list of mechanisms. Each mechanism's file states everything about it: its config
//! (its `[attention]` settings), its [`Facts`] (name, formula, summary, what it combines with,
//! its settings' ranges), how to build a layer of it and what memory that layer takes, as an
//! implementation of [`Variant`]. The list below turns those files into [`MechanismSpec`] (the
//! preset section), [`CATALOGUE`] (what pickers, validation, `attnlab catalogue` and the tests
//! read) and the dispatch of every [`Variant`] method. A new mechanism is its file, its `mod`
//! line and one line here; [`Variant::memory`] has no default, so it does not compile until it
//! states its memory terms.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{
    BasedConfig, DeltaNetConfig, GatedDeltaNetConfig, GlaConfig, LinearConfig, LinformerConfig,
    Mamba2Config, Mechanism, MechanismShape, Mixing, RebasedConfig, RetentionConfig, SoftmaxConfig,
};
use crate::Result;
use crate::params::Params;
use crate::settings::{Section, Settings};

/// Writes [`MechanismSpec`], [`CATALOGUE`] and the dispatch of [`Variant`] from the list of
/// variants and their configs.
macro_rules! mechanisms {
    ($($(#[$doc:meta])* $variant:ident($config:ty),)+) => {
        /// The `[attention]` section of a preset: `kind` names the mechanism, the other keys
        /// are its config's.
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
        pub enum MechanismSpec {
            $($(#[$doc])* $variant($config),)+
        }

        /// Every mechanism, in the order pickers list them.
        pub static CATALOGUE: [&Facts; [$(stringify!($variant)),+].len()] =
            [$(<$config as Variant>::FACTS),+];

        impl MechanismSpec {
            /// This mechanism's entry of the [`CATALOGUE`].
            pub fn facts(&self) -> &'static Facts {
                match self {
                    $(Self::$variant(_) => <$config as Variant>::FACTS,)+
                }
            }

            /// Builds the mechanism of one layer; its parameters go under `params`.
            pub fn build(
                &self,
                shape: &MechanismShape,
                params: &Params,
            ) -> Result<Arc<dyn Mechanism>> {
                match self {
                    $(Self::$variant(c) => c.build(shape, params),)+
                }
            }

            /// What one layer adds to memory beyond the projections ([`Variant::memory`]).
            pub fn memory(&self, layer: &LayerSize) -> MemoryTerms {
                match self {
                    $(Self::$variant(c) => c.memory(layer),)+
                }
            }

            /// One layer's recurrent state ([`Variant::state`]).
            pub fn state(&self, layer: &StateShape) -> Option<StateSize> {
                match self {
                    $(Self::$variant(c) => c.state(layer),)+
                }
            }

            /// Its name with the settings that set it apart in a sweep ([`Variant::label`]).
            pub fn label(&self) -> String {
                match self {
                    $(Self::$variant(c) => c.label(),)+
                }
            }

            /// Per-head width of queries and keys; Based/ReBased use their feature dimension.
            pub fn qk_dim(&self, head_dim: usize) -> usize {
                match self {
                    $(Self::$variant(c) => c.qk_dim(head_dim),)+
                }
            }

            /// Whether training may skip the weights ([`Variant::trains_fused`]).
            pub fn trains_fused(&self) -> bool {
                match self {
                    $(Self::$variant(c) => c.trains_fused(),)+
                }
            }

            /// Checks the mechanism's own settings; errors name `attention.…`.
            pub fn validate(&self, seq_len: usize) -> Result<()> {
                self.validate_ranges()?;
                match self {
                    $(Self::$variant(c) => c.validate(seq_len),)+
                }
            }
        }
    };
}

mechanisms! {
    /// Causal softmax attention.
    Softmax(SoftmaxConfig),
    /// Linear attention with the elu(x) + 1 feature map.
    Linear(LinearConfig),
    /// Based: the 2nd-order Taylor kernel of exp.
    Based(BasedConfig),
    /// ReBased: learnable affine + normalisation, squared similarity.
    Rebased(RebasedConfig),
    /// Linformer: keys and values projected along the sequence to `proj_dim` rows (non-causal).
    Linformer(LinformerConfig),
    /// RetNet's retention: q·k decayed by γ_h per step, a signed matrix, head RMSNorm and gate.
    Retention(RetentionConfig),
    /// Gated linear attention: a data-dependent decay per key channel, a signed matrix.
    Gla(GlaConfig),
    /// DeltaNet: the delta rule over L2-normalised keys, a signed matrix.
    Deltanet(DeltaNetConfig),
    /// Gated DeltaNet: the delta rule with a decay gate per head.
    GatedDeltanet(GatedDeltaNetConfig),
    /// Mamba-2's SSD: a selective state space with a scalar decay per head.
    Mamba2(Mamba2Config),
}

impl Default for MechanismSpec {
    fn default() -> Self {
        Self::Softmax(SoftmaxConfig::default())
    }
}

/// What there is to know about one mechanism, apart from how to build it.
#[derive(Debug)]
pub struct Facts {
    /// The name used in presets, the CLI, the GUI and file names.
    pub name: &'static str,
    /// One-line formula of the weights A.
    pub formula: &'static str,
    /// Where the mechanism comes from and what it trades.
    pub summary: &'static str,
    /// Whether every position sees only itself and earlier positions, so tasks that need
    /// causality (language modelling) can use it.
    pub causal: bool,
    /// Whether each key keeps its position, so a bias or rotary encoding has a distance
    /// i − j to act on (Linformer's keys are mixed along the sequence).
    pub keys_have_positions: bool,
    /// Whether its weights are row-stochastic or signed.
    pub mixing: Mixing,
    /// Its recurrent state per layer as a formula (d_k, d_v per head, H heads, L tokens).
    pub state: &'static str,
    /// Its settings under `[attention]`.
    pub settings: Settings,
    /// The mechanism with its default settings.
    pub default: fn() -> MechanismSpec,
}

/// What a mechanism's config states about it: the rest of attnlab reaches a mechanism only
/// through these, dispatched by the list above.
pub trait Variant {
    /// Its entry of the [`CATALOGUE`].
    const FACTS: &'static Facts;

    /// The mechanism of one layer; its parameters go under `params`.
    fn build(&self, shape: &MechanismShape, params: &Params) -> Result<Arc<dyn Mechanism>>;

    /// What one layer of it adds to memory beyond the projections every mechanism has
    /// (`preset::estimate` sums it). No default: a new mechanism states its own.
    fn memory(&self, layer: &LayerSize) -> MemoryTerms;

    /// The recurrent state one layer carries from token to token at the end of a sequence
    /// (the recall-vs-state axis of the Based paper and zoology); `None` for a mechanism that
    /// has none (Linformer is not causal). No default: a new mechanism states its own.
    fn state(&self, layer: &StateShape) -> Option<StateSize>;

    /// Per-head width of queries and keys, given the model's head width.
    fn qk_dim(&self, head_dim: usize) -> usize {
        head_dim
    }

    /// Its name with the settings that make it another point of a sweep's plots (a window,
    /// an ablation, a projected length): what the sweep summary and its figures call it.
    fn label(&self) -> String {
        Self::FACTS.name.to_string()
    }

    /// Checks what its settings' ranges alone cannot (against the task's sequence length);
    /// errors name `attention.…`.
    fn validate(&self, _seq_len: usize) -> Result<()> {
        Ok(())
    }

    /// Whether training may take a fused path that never builds the weights
    /// ([`Mechanism::fused_output`], where the device and encoding allow it); the memory
    /// estimate counts the weights when not.
    fn trains_fused(&self) -> bool {
        true
    }
}

/// The sizes of one attention layer that memory terms depend on, as floats for the estimate.
#[derive(Clone, Copy, Debug)]
pub struct LayerSize {
    /// The model's width (what an output gate projects from).
    pub d_model: f64,
    pub heads: f64,
    /// Per-head width of queries and keys.
    pub qk: f64,
    /// Per-head width of values.
    pub head_dim: f64,
    /// The sequence length.
    pub len: f64,
}

/// The sizes of one layer that its recurrent state depends on.
#[derive(Clone, Copy, Debug)]
pub struct StateShape {
    pub heads: usize,
    /// Per-head width of queries and keys.
    pub qk_dim: usize,
    /// Per-head width of values.
    pub head_dim: usize,
    /// The longest sequence (zoology counts the state at the longest test length).
    pub len: usize,
}

/// One layer's recurrent state, in floats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateSize {
    /// What attnlab's recurrent form keeps: its exact count.
    pub floats: usize,
    /// zoology's `state_size` formula for the same mixer (which its plots multiply by 4), so
    /// points compare with the Based paper's and zoology's figures.
    pub zoology: usize,
}

impl StateSize {
    /// A state both counts agree on.
    pub fn same(floats: usize) -> Self {
        Self {
            floats,
            zoology: floats,
        }
    }
}

/// What a mechanism adds to one layer's memory beyond the projections every mechanism has.
#[derive(Clone, Copy, Debug)]
pub struct MemoryTerms {
    /// Its own parameters in one layer.
    pub parameters: f64,
    /// The keys each query is scored against (the sequence, or Linformer's projected rows).
    pub keys: f64,
    /// Floats per query or key of its feature maps (kernel mechanisms), per head.
    pub features: f64,
    /// Floats per token that normalising its features keeps.
    pub norms: f64,
}

impl MemoryTerms {
    /// A mechanism with no parameters or feature maps of its own that scores every key.
    pub fn plain(layer: &LayerSize) -> Self {
        Self {
            parameters: 0.0,
            keys: layer.len,
            features: 0.0,
            norms: 0.0,
        }
    }
}

impl Section for MechanismSpec {
    const SECTION: &'static str = "attention";

    fn kind(&self) -> &'static str {
        self.facts().name
    }

    fn settings(&self) -> &'static Settings {
        &self.facts().settings
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::settings::test_catalogue!(CATALOGUE);

    #[test]
    fn settings_are_read_and_written_by_key() {
        let rebased = MechanismSpec::Rebased(RebasedConfig::default());
        let x2 = rebased.with_setting("variant", "x2").unwrap();
        assert_eq!(x2.word("variant").as_deref(), Some("x2"));
        assert_eq!(x2.value("feature_dim"), Some(16.0));
        let err = rebased.with_value("feature_dim", 0.0).unwrap_err();
        assert!(
            err.to_string().contains("attention.feature_dim = 0"),
            "{err}"
        );
    }

    /// A sweep tells apart what makes another point of its plots.
    #[test]
    fn labels_name_what_sets_a_variant_apart() {
        let window = MechanismSpec::Softmax(SoftmaxConfig {
            window: Some(9),
            ..Default::default()
        });
        assert_eq!(window.label(), "softmax-w9");
        assert_eq!(MechanismSpec::default().label(), "softmax");
        let x2 = MechanismSpec::Rebased(RebasedConfig {
            variant: super::super::RebasedVariant::GammaBeta,
            ..RebasedConfig::default()
        });
        assert_eq!(x2.label(), "rebased-gammabeta");
        let linformer = MechanismSpec::Linformer(LinformerConfig::default());
        assert_eq!(linformer.label(), "linformer-k16");
    }
}
