//! The fixed-formula biases of "Exploring Transformer Extrapolation" (Qin, Zhong, Deng 2024,
//! arXiv 2307.10156): the paper writes each as b_n = exp(p_n) and needs n ≥ 1 at the diagonal,
//! so attnlab evaluates them at n = t + offset, with the offset a parameter (the paper's TRF
//! arithmetic, Σ_{i<j} 1/(i+1)², implies offset 1; 1/(n ln n) needs n > 1 and defaults to 3).
//!
//! | name | p(t) | Σ exp(p) |
//! |---|---|---|
//! | `type1` | −2 ln n | converges (p-series, p = 2) |
//! | `type2` | −ln² n | converges |
//! | `inv-n` | −ln n | diverges (harmonic) |
//! | `inv-n-log-n` | −ln n − ln ln n | diverges (like ln ln n) |
//! | `window` | 0 for t < w, −∞ beyond | finite sum |
//!
//! The paper writes one bias for every head and layer, and so does attnlab by default. The code
//! the paper ran (fairseq-evo `transformer_rpe.py`, `get_mask_k`) builds each from k_h·t with
//! ALiBi's per-head slopes k_h; `per_head = true` does that here: n = k_h·t + offset. For 1/n and
//! 1/(n ln n) (offsets 1 and 3) that is exactly fairseq-evo's rpe types 7 and 13; its Type 1 and
//! Type 2 are its rpe types 4 and 11, −ln(1 + (k t)²) and −ln²(3 + k t): type 11 is `type2` with
//! `per_head` and offset 3 exactly, type 4 has no exact counterpart here (`type1` keeps the
//! text's −2 ln n). The text does not say which of the two its tables used.

use std::marker::PhantomData;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::relative::fixed;
use super::{
    DistanceBias, Encoding, EncodingShape, EncodingSpec, Facts, Family, Variant, Verdict,
    alibi_slopes, known,
};
use crate::Result;
use crate::params::Params;
use crate::settings::{Choices, Settings, Switch, real};

/// The offset n = t + offset of `type1`, `type2` and `inv-n`, and their per-head scaling.
/// `S` names the series ([`Type1`], [`Type2`] or [`InvN`]), so each is a variant of its own
/// with the same settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, bound = "")]
pub struct SeriesConfig<S> {
    /// n at the diagonal (t = 0); 1 makes the diagonal bias 0.
    pub offset: f64,
    /// n = k_h·t + offset with ALiBi's slopes k_h per head (fairseq-evo), instead of one bias.
    pub per_head: bool,
    #[serde(skip)]
    series: PhantomData<S>,
}

impl<S> Default for SeriesConfig<S> {
    fn default() -> Self {
        Self {
            offset: 1.0,
            per_head: false,
            series: PhantomData,
        }
    }
}

/// The series 1/n² (the Rpe paper's Type 1).
#[derive(Clone, Debug, PartialEq)]
pub enum Type1 {}
/// The series exp(−ln² n) (the Rpe paper's Type 2).
#[derive(Clone, Debug, PartialEq)]
pub enum Type2 {}
/// The divergent series 1/n.
#[derive(Clone, Debug, PartialEq)]
pub enum InvN {}

/// The offset of `inv-n-log-n`, which needs n > 1 (ln 1 = 0), and its per-head scaling.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NLogNConfig {
    /// n at the diagonal; 3 is the smallest integer with ln ln n > 0, the start of the
    /// paper's divergence proof.
    pub offset: f64,
    /// n = k_h·t + offset with ALiBi's slopes k_h per head (fairseq-evo), instead of one bias.
    pub per_head: bool,
}

impl Default for NLogNConfig {
    fn default() -> Self {
        Self {
            offset: 3.0,
            per_head: false,
        }
    }
}

/// The sliding window of Eq. 7: the query sees its `width` most recent tokens (distances
/// 0..width − 1). Eq. 8's "i − j ≤ w" would keep one more; attnlab follows Eq. 7.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WindowConfig {
    pub width: usize,
}

impl Default for WindowConfig {
    fn default() -> Self {
        Self { width: 16 }
    }
}

/// One bias for every head, with its closed-form verdict.
fn shared(
    bias: impl DistanceBias + 'static,
    verdict: Verdict,
    reason: &str,
) -> Vec<Arc<dyn DistanceBias>> {
    vec![known(bias, verdict, reason)]
}

/// p(n) at n = k·t + offset: one bias with k = 1, or one per head with ALiBi's slopes as k
/// when `per_head`. Scaling t does not change whether Σ exp(p) converges.
fn series(
    p: fn(f64) -> f64,
    (offset, per_head): (f64, bool),
    n_heads: usize,
    verdict: Verdict,
    reason: &str,
) -> Vec<Arc<dyn DistanceBias>> {
    let slopes = if per_head {
        alibi_slopes(n_heads)
    } else {
        vec![1.0]
    };
    slopes
        .into_iter()
        .map(|k| known(move |t: f64| p(k * t + offset), verdict, reason))
        .collect()
}

/// Type 1: b = 1/n².
pub fn type1<S>(c: &SeriesConfig<S>, n_heads: usize) -> Vec<Arc<dyn DistanceBias>> {
    series(
        |n| -2.0 * n.ln(),
        (c.offset, c.per_head),
        n_heads,
        Verdict::Converges,
        "1/n^2 is a p-series with p = 2 > 1",
    )
}

/// Type 2: b = exp(−ln² n).
pub fn type2<S>(c: &SeriesConfig<S>, n_heads: usize) -> Vec<Arc<dyn DistanceBias>> {
    series(
        |n| -n.ln().powi(2),
        (c.offset, c.per_head),
        n_heads,
        Verdict::Converges,
        "exp(-ln^2 n) = n^(-ln n) decays faster than any power of n",
    )
}

/// The first divergent control: b = 1/n.
pub fn inv_n<S>(c: &SeriesConfig<S>, n_heads: usize) -> Vec<Arc<dyn DistanceBias>> {
    series(
        |n| -n.ln(),
        (c.offset, c.per_head),
        n_heads,
        Verdict::Diverges,
        "1/n is the harmonic series, whose partial sums grow like ln N",
    )
}

/// The second divergent control: b = 1/(n ln n).
pub fn inv_n_log_n(c: &NLogNConfig, n_heads: usize) -> Vec<Arc<dyn DistanceBias>> {
    series(
        |n| -n.ln() - n.ln().ln(),
        (c.offset, c.per_head),
        n_heads,
        Verdict::Diverges,
        "the partial sums of 1/(n ln n) grow like ln ln N (integral test)",
    )
}

/// The sliding window: 0 inside, −∞ outside.
pub fn window(c: &WindowConfig) -> Vec<Arc<dyn DistanceBias>> {
    let width = c.width as f64;
    shared(
        move |t: f64| if t < width { 0.0 } else { f64::NEG_INFINITY },
        Verdict::Converges,
        "a window has finitely many non-zero terms",
    )
}

const PER_HEAD: &[Switch] = &[Switch {
    key: "per_head",
    label: "per-head n = k_h t + offset, ALiBi slopes (fairseq-evo)",
    choices: Choices::Toggle,
}];
const SERIES: Settings = Settings {
    numbers: &[real("offset", 1.0, 1000.0, "n = t + offset at distance t")],
    switches: PER_HEAD,
};

/// What tells the series of [`SeriesConfig`] apart: their facts and their biases.
pub trait Series: Sized {
    const FACTS: &'static Facts;

    /// The biases of `c` for a model of `n_heads` heads.
    fn biases(c: &SeriesConfig<Self>, n_heads: usize) -> Vec<Arc<dyn DistanceBias>>;
}

impl<S: Series> Variant for SeriesConfig<S> {
    const FACTS: &'static Facts = S::FACTS;

    fn build(&self, shape: &EncodingShape, params: &Params) -> Result<Arc<dyn Encoding>> {
        fixed(S::biases(self, shape.n_heads), shape, params.device())
    }

    fn parameters(&self, _shape: &EncodingShape) -> usize {
        0
    }
}

static TYPE1_FACTS: Facts = Facts {
    name: "type1",
    family: Family::Bias,
    learnable: false,
    formula: "exp(bias) = 1/n^2",
    summary: "Qin et al. 2023: a converging series, 1/n^2 (extrapolates).",
    settings: SERIES,
    default: || EncodingSpec::Type1(SeriesConfig::default()),
};

impl Series for Type1 {
    const FACTS: &'static Facts = &TYPE1_FACTS;

    fn biases(c: &SeriesConfig<Self>, n_heads: usize) -> Vec<Arc<dyn DistanceBias>> {
        type1(c, n_heads)
    }
}

static TYPE2_FACTS: Facts = Facts {
    name: "type2",
    family: Family::Bias,
    learnable: false,
    formula: "exp(bias) = exp(-ln^2 n)",
    summary: "Qin et al. 2023: a faster converging series, exp(-ln^2 n).",
    settings: SERIES,
    default: || EncodingSpec::Type2(SeriesConfig::default()),
};

impl Series for Type2 {
    const FACTS: &'static Facts = &TYPE2_FACTS;

    fn biases(c: &SeriesConfig<Self>, n_heads: usize) -> Vec<Arc<dyn DistanceBias>> {
        type2(c, n_heads)
    }
}

static INV_N_FACTS: Facts = Facts {
    name: "inv-n",
    family: Family::Bias,
    learnable: false,
    formula: "exp(bias) = 1/n",
    summary: "Qin et al. 2023: a diverging control, 1/n (fails past ~4L).",
    settings: SERIES,
    default: || EncodingSpec::InvN(SeriesConfig::default()),
};

impl Series for InvN {
    const FACTS: &'static Facts = &INV_N_FACTS;

    fn biases(c: &SeriesConfig<Self>, n_heads: usize) -> Vec<Arc<dyn DistanceBias>> {
        inv_n(c, n_heads)
    }
}

static INV_N_LOG_N_FACTS: Facts = Facts {
    name: "inv-n-log-n",
    family: Family::Bias,
    learnable: false,
    formula: "exp(bias) = 1/(n ln n)",
    summary: "Qin et al. 2023: a slowly diverging control, 1/(n ln n).",
    settings: Settings {
        numbers: &[real("offset", 1.1, 1000.0, "n = t + offset; needs n > 1")],
        switches: PER_HEAD,
    },
    default: || EncodingSpec::InvNLogN(NLogNConfig::default()),
};

impl Variant for NLogNConfig {
    const FACTS: &'static Facts = &INV_N_LOG_N_FACTS;

    fn build(&self, shape: &EncodingShape, params: &Params) -> Result<Arc<dyn Encoding>> {
        fixed(inv_n_log_n(self, shape.n_heads), shape, params.device())
    }

    fn parameters(&self, _shape: &EncodingShape) -> usize {
        0
    }
}

static WINDOW_FACTS: Facts = Facts {
    name: "window",
    family: Family::Bias,
    learnable: false,
    formula: "bias = 0 for t < w, -inf beyond",
    summary: "Sliding-window attention: only the last w tokens are seen.",
    settings: Settings::of(&[real("width", 1.0, 1_048_576.0, "tokens a query sees").whole()]),
    default: || EncodingSpec::Window(WindowConfig::default()),
};

impl Variant for WindowConfig {
    const FACTS: &'static Facts = &WINDOW_FACTS;

    fn build(&self, shape: &EncodingShape, params: &Params) -> Result<Arc<dyn Encoding>> {
        fixed(window(self), shape, params.device())
    }

    fn parameters(&self, _shape: &EncodingShape) -> usize {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_follow_the_paper_at_n_equals_t_plus_offset() {
        let c = SeriesConfig::<Type1>::default();
        // t = 3 → n = 4
        assert!((type1(&c, 8)[0].at(3.0).exp() - 1.0 / 16.0).abs() < 1e-12);
        assert!((type2(&c, 8)[0].at(3.0) + 4f64.ln().powi(2)).abs() < 1e-12);
        assert!((inv_n(&c, 8)[0].at(3.0).exp() - 0.25).abs() < 1e-12);
        assert_eq!(type1(&c, 8)[0].at(0.0), 0.0);
        assert_eq!(type1(&c, 8).len(), 1, "one bias for every head");
        let nln = inv_n_log_n(&NLogNConfig::default(), 8)[0].at(2.0).exp(); // n = 5
        assert!((nln - 1.0 / (5.0 * 5f64.ln())).abs() < 1e-12);
    }

    /// Per head, n = k_h·t + offset with ALiBi's slopes: for 8 heads k_h = 2^-(h+1), so head 1
    /// (k = 1/4) at t = 8 has n = 3; 1/n and 1/(n ln n) are fairseq-evo's rpe types 7 and 13,
    /// and `type2` with offset 3 its type 11, −ln²(3 + k t).
    #[test]
    fn per_head_series_scale_the_distance_by_alibis_slopes() {
        let c = SeriesConfig::<Type1> {
            per_head: true,
            ..Default::default()
        };
        let heads = type1(&c, 8);
        assert_eq!(heads.len(), 8);
        assert!((heads[1].at(8.0).exp() - 1.0 / 9.0).abs() < 1e-12);
        let k = 0.5;
        let rpe7 = |t: f64| -(1.0 + k * t).ln();
        assert!((inv_n(&c, 8)[0].at(5.0) - rpe7(5.0)).abs() < 1e-12);
        let z = |t: f64| (3.0 + k * t).ln();
        let rpe13 = |t: f64| -(z(t) + z(t).ln());
        let n_log_n = NLogNConfig {
            per_head: true,
            ..Default::default()
        };
        assert!((inv_n_log_n(&n_log_n, 8)[0].at(5.0) - rpe13(5.0)).abs() < 1e-12);
        let type2_offset_3 = SeriesConfig::<Type2> {
            per_head: true,
            offset: 3.0,
            ..Default::default()
        };
        let rpe11 = |k: f64, t: f64| -(3.0 + k * t).ln().powi(2);
        for (h, bias) in type2(&type2_offset_3, 8).iter().enumerate() {
            let k = 0.5f64.powi(h as i32 + 1);
            for t in [0.0, 1.0, 5.0, 100.0] {
                assert!((bias.at(t) - rpe11(k, t)).abs() < 1e-12, "head {h} at {t}");
            }
        }
    }

    #[test]
    fn window_keeps_width_tokens() {
        let w = window(&WindowConfig { width: 3 });
        assert_eq!(w[0].at(2.0), 0.0);
        assert_eq!(w[0].at(3.0), f64::NEG_INFINITY);
    }
}
