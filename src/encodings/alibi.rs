//! ALiBi (Press, Smith, Lewis 2022, arXiv 2108.12409): logit bias b_h(n) = −m_h·n at distance
//! n = i − j, with the geometric slopes of the reference `get_slopes` (ofirpress/
//! attention_with_linear_biases): for H a power of two, m_h = 2^(−8h/H), h = 1..H; otherwise
//! the slopes of the closest smaller power of two, then every other slope of the next one.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::relative::fixed;
use super::{
    DistanceBias, Encoding, EncodingShape, EncodingSpec, Facts, Family, Variant, Verdict, known,
};
use crate::Result;
use crate::params::Params;
use crate::settings::{Settings, real};

/// ALiBi settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AlibiConfig {
    /// One slope k for every head (the Rpe paper analyses ALiBi with k = 1); absent = the
    /// per-head geometric slopes of Press et al., attnlab's default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub k: Option<f64>,
}

/// One bias per head: p_h(t) = −m_h·t.
pub fn alibi_heads(c: &AlibiConfig, n_heads: usize) -> Vec<Arc<dyn DistanceBias>> {
    let slopes = match c.k {
        Some(k) => vec![k; n_heads],
        None => alibi_slopes(n_heads),
    };
    slopes
        .into_iter()
        .map(|slope| {
            // 0 − m·t keeps the diagonal at +0 rather than −0.
            let reason =
                format!("exp(-{slope} t) is a geometric series with ratio exp(-{slope}) < 1");
            known(move |t: f64| 0.0 - slope * t, Verdict::Converges, reason)
        })
        .collect()
}

/// The reference `get_slopes(n)`.
pub fn alibi_slopes(n_heads: usize) -> Vec<f64> {
    fn power_of_two(n: usize) -> Vec<f64> {
        let start = 2f64.powf(-(2f64.powf(-((n as f64).log2() - 3.0))));
        (0..n).map(|i| start * start.powi(i as i32)).collect()
    }
    if n_heads == 0 {
        return Vec::new();
    }
    if n_heads.is_power_of_two() {
        return power_of_two(n_heads);
    }
    let closest = 1usize << n_heads.ilog2();
    let mut slopes = power_of_two(closest);
    slopes.extend(
        alibi_slopes(2 * closest)
            .into_iter()
            .step_by(2)
            .take(n_heads - closest),
    );
    slopes
}

static FACTS: Facts = Facts {
    name: "alibi",
    family: Family::Bias,
    learnable: false,
    formula: "bias = -m_h t, m_h = 2^(-8h/H) (or one k for all heads)",
    summary: "Press et al. 2022: linear distance penalty, extrapolates well.",
    settings: Settings::of(&[real(
        "k",
        1e-4,
        10.0,
        "one slope for every head; unset = geometric per-head slopes",
    )
    .log()]),
    default: || EncodingSpec::Alibi(AlibiConfig::default()),
};

impl Variant for AlibiConfig {
    const FACTS: &'static Facts = &FACTS;

    fn build(&self, shape: &EncodingShape, params: &Params) -> Result<Arc<dyn Encoding>> {
        fixed(alibi_heads(self, shape.n_heads), shape, params.device())
    }

    fn parameters(&self, _shape: &EncodingShape) -> usize {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slopes_for_eight_heads_are_powers_of_two() {
        let want: Vec<f64> = (1..=8).map(|i| 2f64.powi(-i)).collect();
        assert_eq!(alibi_slopes(8), want);
    }

    #[test]
    fn slopes_for_non_powers_of_two_follow_the_reference() {
        // get_slopes(6) = get_slopes(4) + get_slopes(8)[0::2][:2]
        let want = vec![0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125];
        let got = alibi_slopes(6);
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-12, "{got:?}");
        }
    }

    #[test]
    fn bias_is_minus_slope_times_distance() {
        let heads = alibi_heads(&AlibiConfig::default(), 2);
        // 2 heads: slopes 2^-4, 2^-8
        assert_eq!(heads[0].at(3.0), -3.0 / 16.0);
        assert_eq!(heads[1].at(1.0), -1.0 / 256.0);
        assert_eq!(heads[0].at(0.0), 0.0);
    }

    #[test]
    fn one_slope_for_every_head_when_k_is_set() {
        let heads = alibi_heads(&AlibiConfig { k: Some(1.0) }, 3);
        assert!(heads.iter().all(|h| h.at(2.0) == -2.0));
        assert_eq!(heads[0].known().map(|(v, _)| v), Some(Verdict::Converges));
    }
}
