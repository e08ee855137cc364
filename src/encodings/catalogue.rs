//! Every encoding's facts in one place: its name, family, whether training changes it, its
//! formula and summary (help text, tooltips, `attnlab encodings`), its numeric settings with
//! their ranges (validation, `--set`, the GUI's sliders), its switches (the GUI's checkboxes
//! and choices) and its default. The pickers, the CLI,
//! validation and the tests all read this table; a new encoding adds its facts here (a static,
//! listed in [`CATALOGUE`], which `facts()` names: no look-up by position), its variant and
//! config in `mod.rs`, and its arm of `EncodingSpec::build`.

use super::{EncodingSpec, Family};
use crate::settings::{Choices, Hyperparameter, Section, Settings, Switch, real};

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

/// Every encoding, in the order pickers and tables list them.
pub static CATALOGUE: [&Facts; 20] = [
    &NONE_FACTS,
    &LEARNED_FACTS,
    &SINUSOIDAL_FACTS,
    &ALIBI_FACTS,
    &KERPLE_LOG_FACTS,
    &KERPLE_POWER_FACTS,
    &SANDWICH_FACTS,
    &TYPE1_FACTS,
    &TYPE2_FACTS,
    &INV_N_FACTS,
    &INV_N_LOG_N_FACTS,
    &WINDOW_FACTS,
    &T5_FACTS,
    &DIET_REL_FACTS,
    &DIET_ABS_FACTS,
    &ROPE_FACTS,
    &PI_FACTS,
    &NTK_FACTS,
    &REROPE_FACTS,
    &LEAKY_REROPE_FACTS,
];

static NONE_FACTS: Facts = Facts {
    name: "none",
    family: Family::None,
    learnable: false,
    formula: "no positional term",
    summary: "NoPE: causal masking alone carries order (a baseline).",
    settings: Settings::NONE,
    default: || EncodingSpec::None,
};

static LEARNED_FACTS: Facts = Facts {
    name: "learned",
    family: Family::Absolute,
    learnable: true,
    formula: "x_t + p_t, p learned",
    summary: "GPT-style learned table; cannot go past its trained length.",
    settings: Settings::NONE,
    default: || EncodingSpec::Learned,
};

static SINUSOIDAL_FACTS: Facts = Facts {
    name: "sinusoidal",
    family: Family::Absolute,
    learnable: false,
    formula: "x_t + [sin(t/10000^(2i/d)), cos(t/10000^(2i/d))]",
    summary: "Vaswani et al. 2017: fixed sinusoids added to the input.",
    settings: Settings::NONE,
    default: || EncodingSpec::Sinusoidal,
};

static ALIBI_FACTS: Facts = Facts {
    name: "alibi",
    family: Family::Bias,
    learnable: false,
    formula: "bias = -m_h t, m_h = 2^(-8h/H) (or one k for all heads)",
    summary: "Press et al. 2022: linear distance penalty, extrapolates well.",
    settings: Settings::of(ALIBI),
    default: || EncodingSpec::Alibi(Default::default()),
};

static KERPLE_LOG_FACTS: Facts = Facts {
    name: "kerple-log",
    family: Family::Bias,
    learnable: true,
    formula: "bias = -r_h ln(1 + k_h t), r_h, k_h learned from U(0,2), U(0,1)",
    summary: "Chi et al. 2022: learned logarithmic kernel; converges iff r > 1.",
    settings: Settings::of(KERPLE_LOG),
    default: || EncodingSpec::KerpleLog(Default::default()),
};

static KERPLE_POWER_FACTS: Facts = Facts {
    name: "kerple-power",
    family: Family::Bias,
    learnable: true,
    formula: "bias = -k_h t^r_h, 0 < r_h <= 2, learned from U(0,2), U(0,1)",
    summary: "Chi et al. 2022: learned power kernel; always converges.",
    settings: Settings::of(KERPLE_POWER),
    default: || EncodingSpec::KerplePower(Default::default()),
};

static SANDWICH_FACTS: Facts = Facts {
    name: "sandwich",
    family: Family::Bias,
    learnable: false,
    formula: "bias = k (sum_j cos(t / r^(2j/d)) - d/2)",
    summary: "Chi et al. 2023: the inner product of sinusoids as a bias.",
    settings: Settings {
        numbers: SANDWICH,
        switches: SANDWICH_SWITCHES,
    },
    default: || EncodingSpec::Sandwich(Default::default()),
};

static TYPE1_FACTS: Facts = Facts {
    name: "type1",
    family: Family::Bias,
    learnable: false,
    formula: "exp(bias) = 1/n^2",
    summary: "Qin et al. 2023: a converging series, 1/n^2 (extrapolates).",
    settings: Settings {
        numbers: SERIES,
        switches: SERIES_SWITCHES,
    },
    default: || EncodingSpec::Type1(Default::default()),
};

static TYPE2_FACTS: Facts = Facts {
    name: "type2",
    family: Family::Bias,
    learnable: false,
    formula: "exp(bias) = exp(-ln^2 n)",
    summary: "Qin et al. 2023: a faster converging series, exp(-ln^2 n).",
    settings: Settings {
        numbers: SERIES,
        switches: SERIES_SWITCHES,
    },
    default: || EncodingSpec::Type2(Default::default()),
};

static INV_N_FACTS: Facts = Facts {
    name: "inv-n",
    family: Family::Bias,
    learnable: false,
    formula: "exp(bias) = 1/n",
    summary: "Qin et al. 2023: a diverging control, 1/n (fails past ~4L).",
    settings: Settings {
        numbers: SERIES,
        switches: SERIES_SWITCHES,
    },
    default: || EncodingSpec::InvN(Default::default()),
};

static INV_N_LOG_N_FACTS: Facts = Facts {
    name: "inv-n-log-n",
    family: Family::Bias,
    learnable: false,
    formula: "exp(bias) = 1/(n ln n)",
    summary: "Qin et al. 2023: a slowly diverging control, 1/(n ln n).",
    settings: Settings {
        numbers: N_LOG_N,
        switches: SERIES_SWITCHES,
    },
    default: || EncodingSpec::InvNLogN(Default::default()),
};

static WINDOW_FACTS: Facts = Facts {
    name: "window",
    family: Family::Bias,
    learnable: false,
    formula: "bias = 0 for t < w, -inf beyond",
    summary: "Sliding-window attention: only the last w tokens are seen.",
    settings: Settings::of(WINDOW),
    default: || EncodingSpec::Window(Default::default()),
};

static T5_FACTS: Facts = Facts {
    name: "t5",
    family: Family::Bias,
    learnable: true,
    formula: "bias = b_h[bucket(t)], log-spaced buckets, learned",
    summary: "Raffel et al. 2020: learned bias per log-spaced distance bucket.",
    settings: Settings::of(T5),
    default: || EncodingSpec::T5(Default::default()),
};

static DIET_REL_FACTS: Facts = Facts {
    name: "diet-rel",
    family: Family::Bias,
    learnable: true,
    formula: "bias = b_h[min(t, max_distance)], learned",
    summary: "Chen et al. 2021 (DIET): learned bias per clipped distance.",
    settings: Settings {
        numbers: DIET_REL,
        switches: DIET_SWITCHES,
    },
    default: || EncodingSpec::DietRel(Default::default()),
};

static DIET_ABS_FACTS: Facts = Facts {
    name: "diet-abs",
    family: Family::Bias,
    learnable: true,
    formula: "bias_ij = (P_Q P_K^T)_ij per head, learned",
    summary: "Chen et al. 2021 (DIET): decoupled absolute positions in the scores.",
    settings: Settings {
        numbers: DIET_ABS,
        switches: DIET_SWITCHES,
    },
    default: || EncodingSpec::DietAbs(Default::default()),
};

static ROPE_FACTS: Facts = Facts {
    name: "rope",
    family: Family::Rotary,
    learnable: false,
    formula: "q_i, k_j rotated by angle pos*base^(-2c/d); relative position t",
    summary: "Su et al. 2021: rotate q and k by position; relative by design.",
    settings: Settings::of(ROPE),
    default: || EncodingSpec::Rope(Default::default()),
};

static PI_FACTS: Facts = Facts {
    name: "pi",
    family: Family::Rotary,
    learnable: false,
    formula: "RoPE at positions pos/k; relative position t/k",
    summary: "Chen et al. 2023: interpolate positions by k to reach k times longer.",
    settings: Settings::of(PI),
    default: || EncodingSpec::Pi(Default::default()),
};

static NTK_FACTS: Facts = Facts {
    name: "ntk",
    family: Family::Rotary,
    learnable: false,
    formula: "RoPE with base*alpha^(d/(d-2)); relative position t",
    summary: "bloc97 2023: stretch RoPE's base instead of the positions.",
    settings: Settings::of(NTK),
    default: || EncodingSpec::Ntk(Default::default()),
};

static REROPE_FACTS: Facts = Facts {
    name: "rerope",
    family: Family::Rotary,
    learnable: false,
    formula: "RoPE with relative position min(t, w)",
    summary: "Su 2023: clip relative positions at w at inference time.",
    settings: Settings {
        numbers: REROPE,
        switches: REROPE_SWITCHES,
    },
    default: || EncodingSpec::Rerope(Default::default()),
};

static LEAKY_REROPE_FACTS: Facts = Facts {
    name: "leaky-rerope",
    family: Family::Rotary,
    learnable: false,
    formula: "RoPE with relative position t below w, w + (t - w)/k beyond",
    summary: "Su 2023: compress relative positions beyond w by 1/k.",
    settings: Settings {
        numbers: LEAKY_REROPE,
        switches: REROPE_SWITCHES,
    },
    default: || EncodingSpec::LeakyRerope(Default::default()),
};

impl Section for EncodingSpec {
    const SECTION: &'static str = "encoding";

    fn kind(&self) -> &'static str {
        self.name()
    }

    fn settings(&self) -> &'static Settings {
        &self.facts().settings
    }
}

impl EncodingSpec {
    /// This encoding's entry of the [`CATALOGUE`].
    pub fn facts(&self) -> &'static Facts {
        match self {
            Self::None => &NONE_FACTS,
            Self::Learned => &LEARNED_FACTS,
            Self::Sinusoidal => &SINUSOIDAL_FACTS,
            Self::Alibi(_) => &ALIBI_FACTS,
            Self::KerpleLog(_) => &KERPLE_LOG_FACTS,
            Self::KerplePower(_) => &KERPLE_POWER_FACTS,
            Self::Sandwich(_) => &SANDWICH_FACTS,
            Self::Type1(_) => &TYPE1_FACTS,
            Self::Type2(_) => &TYPE2_FACTS,
            Self::InvN(_) => &INV_N_FACTS,
            Self::InvNLogN(_) => &INV_N_LOG_N_FACTS,
            Self::Window(_) => &WINDOW_FACTS,
            Self::T5(_) => &T5_FACTS,
            Self::DietRel(_) => &DIET_REL_FACTS,
            Self::DietAbs(_) => &DIET_ABS_FACTS,
            Self::Rope(_) => &ROPE_FACTS,
            Self::Pi(_) => &PI_FACTS,
            Self::Ntk(_) => &NTK_FACTS,
            Self::Rerope(_) => &REROPE_FACTS,
            Self::LeakyRerope(_) => &LEAKY_REROPE_FACTS,
        }
    }
}

const ALIBI: &[Hyperparameter] = &[real(
    "k",
    1e-4,
    10.0,
    "one slope for every head; unset = geometric per-head slopes",
)
.log()];
const KERPLE_LOG: &[Hyperparameter] = &[
    real(
        "r",
        0.01,
        10.0,
        "initial power r of every head; Σ exp(bias) converges for r > 1; unset = U(0, 2) per head",
    )
    .log(),
    real(
        "k",
        0.01,
        10.0,
        "initial distance scale k of every head; unset = U(0, 1) per head",
    )
    .log(),
];
const KERPLE_POWER: &[Hyperparameter] = &[
    real(
        "r",
        0.01,
        2.0,
        "initial exponent r of every head; unset = U(0, 2) per head",
    ),
    real(
        "k",
        0.01,
        10.0,
        "initial scale k of every head; unset = U(0, 1) per head",
    )
    .log(),
];
const SANDWICH: &[Hyperparameter] = &[
    real("k", 0.001, 10.0, "scale of the bias").log(),
    real("r", 2.0, 1e9, "frequency base").log(),
    real(
        "dim",
        2.0,
        4096.0,
        "width d of the sinusoidal embeddings (even); unset = 2 x the head width (fairseq-evo)",
    )
    .whole(),
];
const SERIES: &[Hyperparameter] = &[real("offset", 1.0, 1000.0, "n = t + offset at distance t")];
const N_LOG_N: &[Hyperparameter] = &[real("offset", 1.1, 1000.0, "n = t + offset; needs n > 1")];
const WINDOW: &[Hyperparameter] = &[real("width", 1.0, 1_048_576.0, "tokens a query sees").whole()];
const T5: &[Hyperparameter] = &[
    real("num_buckets", 2.0, 1024.0, "distance buckets per head").whole(),
    real(
        "max_distance",
        1.0,
        1_048_576.0,
        "distances from here share the last bucket",
    )
    .whole(),
];
const DIET_REL: &[Hyperparameter] = &[real(
    "max_distance",
    1.0,
    65_536.0,
    "distances from here share one scalar; unset = unclipped (the paper), one per trained distance",
)
.whole()];
const DIET_ABS: &[Hyperparameter] =
    &[real("rank", 1.0, 1024.0, "d_p, the rank of P_Q P_K^T").whole()];
const BASE: Hyperparameter =
    real("base", 2.0, 1e9, "RoPE frequency base (10000 in the paper)").log();
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
const ROPE: &[Hyperparameter] = &[BASE];
const PI: &[Hyperparameter] = &[
    BASE,
    real("scale", 1.0, 1024.0, "positions are divided by k").log(),
];
const NTK: &[Hyperparameter] = &[BASE, real("alpha", 1.0, 1024.0, "length scale alpha").log()];
const REROPE: &[Hyperparameter] = &[BASE, REROPE_WINDOW, TRAINING_LENGTH];
const LEAKY_REROPE: &[Hyperparameter] = &[
    BASE,
    REROPE_WINDOW,
    real("scale", 1.0, 1e6, "slope 1/k beyond the window").log(),
    TRAINING_LENGTH,
];

const PER_HEAD: &str = "per_head";
const SANDWICH_SWITCHES: &[Switch] = &[Switch {
    key: PER_HEAD,
    label: "per-head scale k*H/(8h) (fairseq-evo)",
    choices: Choices::Toggle,
}];
const SERIES_SWITCHES: &[Switch] = &[Switch {
    key: PER_HEAD,
    label: "per-head n = k_h t + offset, ALiBi slopes (fairseq-evo)",
    choices: Choices::Toggle,
}];
const REROPE_SWITCHES: &[Switch] = &[Switch {
    key: "log_n",
    label: "log-n: queries scaled by max(1, ln(i+1)/ln L) (the post's patches)",
    choices: Choices::Toggle,
}];
const DIET_SWITCHES: &[Switch] = &[Switch {
    key: "sharing",
    label: "sharing",
    choices: Choices::Words(&["none", "layerwise"]),
}];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encodings::EncodingShape;
    use crate::params::Params;
    use candle_core::Device;

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
        }
        assert!(
            biased > 0,
            "no encoding with a bias: the flag is never tested"
        );
    }
}
