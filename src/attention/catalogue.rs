//! Every mechanism's facts in one place: its name, formula and summary (help text, tooltips),
//! what it can be combined with (validation), its settings with their ranges and choices
//! (validation, `--set`, the GUI's widgets) and its default. The picker, validation and the
//! tests read this table; a new mechanism adds its facts here (a static, listed in
//! [`CATALOGUE`], which `facts()` names: no look-up by position), its variant and config in
//! `mod.rs`, and its arm of `MechanismSpec::build`.

use super::{BasedConfig, LinformerConfig, MechanismSpec, RebasedConfig};
use crate::settings::{Choices, Hyperparameter, Section, Settings, Switch, real};

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
    /// Its settings under `[attention]`.
    pub settings: Settings,
    /// The mechanism with its default settings.
    pub default: fn() -> MechanismSpec,
}

/// Every mechanism, in the order pickers list them.
pub static CATALOGUE: [&Facts; 5] = [
    &SOFTMAX_FACTS,
    &LINEAR_FACTS,
    &BASED_FACTS,
    &REBASED_FACTS,
    &LINFORMER_FACTS,
];

static SOFTMAX_FACTS: Facts = Facts {
    name: "softmax",
    formula: "A = softmax(q k^T / sqrt(d) + bias), causal",
    summary: "Vaswani et al. 2017: exact attention, O(n^2) time and memory.",
    causal: true,
    keys_have_positions: true,
    settings: Settings::NONE,
    default: || MechanismSpec::Softmax,
};

static LINEAR_FACTS: Facts = Facts {
    name: "linear",
    formula: "A_ij = phi(q_i).phi(k_j) / sum_n phi(q_i).phi(k_n), phi = elu + 1",
    summary: "Katharopoulos et al. 2020: a kernel feature map, O(n) recurrent form.",
    causal: true,
    keys_have_positions: true,
    settings: Settings::NONE,
    default: || MechanismSpec::Linear,
};

static BASED_FACTS: Facts = Facts {
    name: "based",
    formula: "A_ij ~ 1 + s + s^2/2, s = q_i.k_j / sqrt(d_f)",
    summary: "Arora et al. 2024: Taylor kernel; better recall than linear.",
    causal: true,
    keys_have_positions: true,
    settings: Settings::of(&[FEATURE_DIM]),
    default: || MechanismSpec::Based(BasedConfig::default()),
};

static REBASED_FACTS: Facts = Facts {
    name: "rebased",
    formula: "A_ij ~ (q'_i.k'_j / sqrt(d_f))^2, q' = gamma*norm(q) + beta",
    summary: "Aksenov et al. 2024: learnable kernel; better recall than Based.",
    causal: true,
    keys_have_positions: true,
    settings: Settings {
        numbers: &[FEATURE_DIM],
        switches: &[Switch {
            key: "variant",
            label: "variant",
            choices: Choices::Words(&["rebased", "x2", "norm", "gamma", "gamma-beta"]),
        }],
    },
    default: || MechanismSpec::Rebased(RebasedConfig::default()),
};

static LINFORMER_FACTS: Facts = Facts {
    name: "linformer",
    formula: "A = softmax(q (E k)^T / sqrt(d)), n x k, non-causal",
    summary: "Wang et al. 2020: keys and values projected to k rows, O(nk).",
    causal: false,
    keys_have_positions: false,
    settings: Settings {
        numbers: &[real(
            "proj_dim",
            1.0,
            65_536.0,
            "projected length k; at most the task's sequence length",
        )
        .whole()],
        switches: &[Switch {
            key: "sharing",
            label: "sharing",
            choices: Choices::Words(&["none", "headwise", "kv", "layerwise"]),
        }],
    },
    default: || MechanismSpec::Linformer(LinformerConfig::default()),
};

const FEATURE_DIM: Hyperparameter = real(
    "feature_dim",
    1.0,
    256.0,
    "width d_f of q and k per head (zoology's configs use 8, 16, 24)",
)
.whole();

impl MechanismSpec {
    /// This mechanism's entry of the [`CATALOGUE`].
    pub fn facts(&self) -> &'static Facts {
        match self {
            Self::Softmax => &SOFTMAX_FACTS,
            Self::Linear => &LINEAR_FACTS,
            Self::Based(_) => &BASED_FACTS,
            Self::Rebased(_) => &REBASED_FACTS,
            Self::Linformer(_) => &LINFORMER_FACTS,
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
}
