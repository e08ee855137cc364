//! Every encoding's facts in one place: its name, family, whether training changes it, its
//! formula and summary (help text, tooltips, `attnlab encodings`), its numeric settings with
//! their ranges (validation, `--set`, the GUI's sliders) and its default. The pickers, the CLI,
//! validation and the tests all read this table; a new encoding adds its entry here, its
//! variant and config in `mod.rs`, and its arm of `EncodingSpec::build`.

use super::hyper::{Hyperparameter, int, log, real};
use super::{EncodingSpec, Family};

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
    /// The numeric settings under `[encoding]`.
    pub settings: &'static [Hyperparameter],
    /// The encoding with its default settings.
    pub default: fn() -> EncodingSpec,
}

/// Every encoding, in the order pickers and tables list them.
pub static CATALOGUE: [Facts; 20] = [
    Facts {
        name: "none",
        family: Family::None,
        learnable: false,
        formula: "no positional term",
        summary: "NoPE: causal masking alone carries order (a baseline).",
        settings: &[],
        default: || EncodingSpec::None,
    },
    Facts {
        name: "learned",
        family: Family::Absolute,
        learnable: true,
        formula: "x_t + p_t, p learned",
        summary: "GPT-style learned table; cannot go past its trained length.",
        settings: &[],
        default: || EncodingSpec::Learned,
    },
    Facts {
        name: "sinusoidal",
        family: Family::Absolute,
        learnable: false,
        formula: "x_t + [sin(t/10000^(2i/d)), cos(t/10000^(2i/d))]",
        summary: "Vaswani et al. 2017: fixed sinusoids added to the input.",
        settings: &[],
        default: || EncodingSpec::Sinusoidal,
    },
    Facts {
        name: "alibi",
        family: Family::Bias,
        learnable: false,
        formula: "bias = -m_h t, m_h = 2^(-8h/H) (or one k for all heads)",
        summary: "Press et al. 2022: linear distance penalty, extrapolates well.",
        settings: ALIBI,
        default: || EncodingSpec::Alibi(Default::default()),
    },
    Facts {
        name: "kerple-log",
        family: Family::Bias,
        learnable: true,
        formula: "bias = -r_h ln(1 + k_h t), r_h, k_h learned from U(0,2), U(0,1)",
        summary: "Chi et al. 2022: learned logarithmic kernel; converges iff r > 1.",
        settings: KERPLE_LOG,
        default: || EncodingSpec::KerpleLog(Default::default()),
    },
    Facts {
        name: "kerple-power",
        family: Family::Bias,
        learnable: true,
        formula: "bias = -k_h t^r_h, 0 < r_h <= 2, learned from U(0,2), U(0,1)",
        summary: "Chi et al. 2022: learned power kernel; always converges.",
        settings: KERPLE_POWER,
        default: || EncodingSpec::KerplePower(Default::default()),
    },
    Facts {
        name: "sandwich",
        family: Family::Bias,
        learnable: false,
        formula: "bias = k (sum_j cos(t / r^(2j/d)) - d/2)",
        summary: "Chi et al. 2023: the inner product of sinusoids as a bias.",
        settings: SANDWICH,
        default: || EncodingSpec::Sandwich(Default::default()),
    },
    Facts {
        name: "type1",
        family: Family::Bias,
        learnable: false,
        formula: "exp(bias) = 1/n^2",
        summary: "Qin et al. 2023: a converging series, 1/n^2 (extrapolates).",
        settings: SERIES,
        default: || EncodingSpec::Type1(Default::default()),
    },
    Facts {
        name: "type2",
        family: Family::Bias,
        learnable: false,
        formula: "exp(bias) = exp(-ln^2 n)",
        summary: "Qin et al. 2023: a faster converging series, exp(-ln^2 n).",
        settings: SERIES,
        default: || EncodingSpec::Type2(Default::default()),
    },
    Facts {
        name: "inv-n",
        family: Family::Bias,
        learnable: false,
        formula: "exp(bias) = 1/n",
        summary: "Qin et al. 2023: a diverging control, 1/n (fails past ~4L).",
        settings: SERIES,
        default: || EncodingSpec::InvN(Default::default()),
    },
    Facts {
        name: "inv-n-log-n",
        family: Family::Bias,
        learnable: false,
        formula: "exp(bias) = 1/(n ln n)",
        summary: "Qin et al. 2023: a slowly diverging control, 1/(n ln n).",
        settings: N_LOG_N,
        default: || EncodingSpec::InvNLogN(Default::default()),
    },
    Facts {
        name: "window",
        family: Family::Bias,
        learnable: false,
        formula: "bias = 0 for t < w, -inf beyond",
        summary: "Sliding-window attention: only the last w tokens are seen.",
        settings: WINDOW,
        default: || EncodingSpec::Window(Default::default()),
    },
    Facts {
        name: "t5",
        family: Family::Bias,
        learnable: true,
        formula: "bias = b_h[bucket(t)], log-spaced buckets, learned",
        summary: "Raffel et al. 2020: learned bias per log-spaced distance bucket.",
        settings: T5,
        default: || EncodingSpec::T5(Default::default()),
    },
    Facts {
        name: "diet-rel",
        family: Family::Bias,
        learnable: true,
        formula: "bias = b_h[min(t, max_distance)], learned",
        summary: "Chen et al. 2021 (DIET): learned bias per clipped distance.",
        settings: DIET_REL,
        default: || EncodingSpec::DietRel(Default::default()),
    },
    Facts {
        name: "diet-abs",
        family: Family::Bias,
        learnable: true,
        formula: "bias_ij = (P_Q P_K^T)_ij per head, learned",
        summary: "Chen et al. 2021 (DIET): decoupled absolute positions in the scores.",
        settings: DIET_ABS,
        default: || EncodingSpec::DietAbs(Default::default()),
    },
    Facts {
        name: "rope",
        family: Family::Rotary,
        learnable: false,
        formula: "q_i, k_j rotated by angle pos*base^(-2c/d); relative position t",
        summary: "Su et al. 2021: rotate q and k by position; relative by design.",
        settings: ROPE,
        default: || EncodingSpec::Rope(Default::default()),
    },
    Facts {
        name: "pi",
        family: Family::Rotary,
        learnable: false,
        formula: "RoPE at positions pos/k; relative position t/k",
        summary: "Chen et al. 2023: interpolate positions by k to reach k times longer.",
        settings: PI,
        default: || EncodingSpec::Pi(Default::default()),
    },
    Facts {
        name: "ntk",
        family: Family::Rotary,
        learnable: false,
        formula: "RoPE with base*alpha^(d/(d-2)); relative position t",
        summary: "bloc97 2023: stretch RoPE's base instead of the positions.",
        settings: NTK,
        default: || EncodingSpec::Ntk(Default::default()),
    },
    Facts {
        name: "rerope",
        family: Family::Rotary,
        learnable: false,
        formula: "RoPE with relative position min(t, w)",
        summary: "Su 2023: clip relative positions at w at inference time.",
        settings: REROPE,
        default: || EncodingSpec::Rerope(Default::default()),
    },
    Facts {
        name: "leaky-rerope",
        family: Family::Rotary,
        learnable: false,
        formula: "RoPE with relative position t below w, w + (t - w)/k beyond",
        summary: "Su 2023: compress relative positions beyond w by 1/k.",
        settings: LEAKY_REROPE,
        default: || EncodingSpec::LeakyRerope(Default::default()),
    },
];

impl EncodingSpec {
    /// This encoding's entry of the [`CATALOGUE`].
    pub fn facts(&self) -> &'static Facts {
        match self {
            Self::None => &CATALOGUE[0],
            Self::Learned => &CATALOGUE[1],
            Self::Sinusoidal => &CATALOGUE[2],
            Self::Alibi(_) => &CATALOGUE[3],
            Self::KerpleLog(_) => &CATALOGUE[4],
            Self::KerplePower(_) => &CATALOGUE[5],
            Self::Sandwich(_) => &CATALOGUE[6],
            Self::Type1(_) => &CATALOGUE[7],
            Self::Type2(_) => &CATALOGUE[8],
            Self::InvN(_) => &CATALOGUE[9],
            Self::InvNLogN(_) => &CATALOGUE[10],
            Self::Window(_) => &CATALOGUE[11],
            Self::T5(_) => &CATALOGUE[12],
            Self::DietRel(_) => &CATALOGUE[13],
            Self::DietAbs(_) => &CATALOGUE[14],
            Self::Rope(_) => &CATALOGUE[15],
            Self::Pi(_) => &CATALOGUE[16],
            Self::Ntk(_) => &CATALOGUE[17],
            Self::Rerope(_) => &CATALOGUE[18],
            Self::LeakyRerope(_) => &CATALOGUE[19],
        }
    }
}

const ALIBI: &[Hyperparameter] = &[log(
    "k",
    1e-4,
    10.0,
    "one slope for every head; unset = geometric per-head slopes",
)];
const KERPLE_LOG: &[Hyperparameter] = &[
    log(
        "r",
        0.01,
        10.0,
        "initial power r of every head; Σ exp(bias) converges for r > 1; unset = U(0, 2) per head",
    ),
    log(
        "k",
        0.01,
        10.0,
        "initial distance scale k of every head; unset = U(0, 1) per head",
    ),
];
const KERPLE_POWER: &[Hyperparameter] = &[
    real(
        "r",
        0.01,
        2.0,
        "initial exponent r of every head; unset = U(0, 2) per head",
    ),
    log(
        "k",
        0.01,
        10.0,
        "initial scale k of every head; unset = U(0, 1) per head",
    ),
];
const SANDWICH: &[Hyperparameter] = &[
    log("k", 0.001, 10.0, "scale of the bias"),
    log("r", 2.0, 1e9, "frequency base"),
    int(
        "dim",
        2.0,
        4096.0,
        "width d of the sinusoidal embeddings (even); unset = 2 x the head width (fairseq-evo)",
    ),
];
const SERIES: &[Hyperparameter] = &[real("offset", 1.0, 1000.0, "n = t + offset at distance t")];
const N_LOG_N: &[Hyperparameter] = &[real("offset", 1.1, 1000.0, "n = t + offset; needs n > 1")];
const WINDOW: &[Hyperparameter] = &[int("width", 1.0, 1_048_576.0, "tokens a query sees")];
const T5: &[Hyperparameter] = &[
    int("num_buckets", 2.0, 1024.0, "distance buckets per head"),
    int(
        "max_distance",
        1.0,
        1_048_576.0,
        "distances from here share the last bucket",
    ),
];
const DIET_REL: &[Hyperparameter] = &[int(
    "max_distance",
    1.0,
    65_536.0,
    "distances from here share one scalar; unset = unclipped (the paper), one per trained distance",
)];
const DIET_ABS: &[Hyperparameter] = &[int("rank", 1.0, 1024.0, "d_p, the rank of P_Q P_K^T")];
const BASE: Hyperparameter = log("base", 2.0, 1e9, "RoPE frequency base (10000 in the paper)");
const REROPE_WINDOW: Hyperparameter = int(
    "window",
    1.0,
    1_048_576.0,
    "distances from w on are clipped",
);
const TRAINING_LENGTH: Hyperparameter = int(
    "training_length",
    2.0,
    1_048_576.0,
    "L of the log-n query scaling max(1, ln(i+1)/ln L); unset = the length the model trained at",
);
const ROPE: &[Hyperparameter] = &[BASE];
const PI: &[Hyperparameter] = &[
    BASE,
    log("scale", 1.0, 1024.0, "positions are divided by k"),
];
const NTK: &[Hyperparameter] = &[BASE, log("alpha", 1.0, 1024.0, "length scale alpha")];
const REROPE: &[Hyperparameter] = &[BASE, REROPE_WINDOW, TRAINING_LENGTH];
const LEAKY_REROPE: &[Hyperparameter] = &[
    BASE,
    REROPE_WINDOW,
    log("scale", 1.0, 1e6, "slope 1/k beyond the window"),
    TRAINING_LENGTH,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_is_the_facts_of_its_own_default() {
        let mut names = std::collections::BTreeSet::new();
        for facts in &CATALOGUE {
            assert!(
                std::ptr::eq((facts.default)().facts(), facts),
                "{}",
                facts.name
            );
            assert!(names.insert(facts.name), "{} twice", facts.name);
            assert!(!facts.formula.is_empty() && !facts.summary.is_empty());
        }
    }
}
