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
//! The paper uses one bias for every head and layer, and so does attnlab.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{DistanceBias, Verdict, known};

/// The offset n = t + offset of `type1`, `type2` and `inv-n`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SeriesConfig {
    /// n at the diagonal (t = 0); 1 makes the diagonal bias 0.
    pub offset: f64,
}

impl Default for SeriesConfig {
    fn default() -> Self {
        Self { offset: 1.0 }
    }
}

/// The offset of `inv-n-log-n`, which needs n > 1 (ln 1 = 0).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NLogNConfig {
    /// n at the diagonal; 3 is the smallest integer with ln ln n > 0, the start of the
    /// paper's divergence proof.
    pub offset: f64,
}

impl Default for NLogNConfig {
    fn default() -> Self {
        Self { offset: 3.0 }
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

/// Type 1: b = 1/n².
pub fn type1(c: &SeriesConfig) -> Vec<Arc<dyn DistanceBias>> {
    let offset = c.offset;
    shared(
        move |t: f64| -2.0 * (t + offset).ln(),
        Verdict::Converges,
        "1/n^2 is a p-series with p = 2 > 1",
    )
}

/// Type 2: b = exp(−ln² n).
pub fn type2(c: &SeriesConfig) -> Vec<Arc<dyn DistanceBias>> {
    let offset = c.offset;
    shared(
        move |t: f64| -(t + offset).ln().powi(2),
        Verdict::Converges,
        "exp(-ln^2 n) = n^(-ln n) decays faster than any power of n",
    )
}

/// The first divergent control: b = 1/n.
pub fn inv_n(c: &SeriesConfig) -> Vec<Arc<dyn DistanceBias>> {
    let offset = c.offset;
    shared(
        move |t: f64| -(t + offset).ln(),
        Verdict::Diverges,
        "1/n is the harmonic series, whose partial sums grow like ln N",
    )
}

/// The second divergent control: b = 1/(n ln n).
pub fn inv_n_log_n(c: &NLogNConfig) -> Vec<Arc<dyn DistanceBias>> {
    let offset = c.offset;
    shared(
        move |t: f64| {
            let ln = (t + offset).ln();
            -ln - ln.ln()
        },
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_follow_the_paper_at_n_equals_t_plus_offset() {
        let c = SeriesConfig::default();
        // t = 3 → n = 4
        assert!((type1(&c)[0].at(3.0).exp() - 1.0 / 16.0).abs() < 1e-12);
        assert!((type2(&c)[0].at(3.0) + 4f64.ln().powi(2)).abs() < 1e-12);
        assert!((inv_n(&c)[0].at(3.0).exp() - 0.25).abs() < 1e-12);
        assert_eq!(type1(&c)[0].at(0.0), 0.0);
        let nln = inv_n_log_n(&NLogNConfig::default())[0].at(2.0).exp(); // n = 5
        assert!((nln - 1.0 / (5.0 * 5f64.ln())).abs() < 1e-12);
    }

    #[test]
    fn window_keeps_width_tokens() {
        let w = window(&WindowConfig { width: 3 });
        assert_eq!(w[0].at(2.0), 0.0);
        assert_eq!(w[0].at(3.0), f64::NEG_INFINITY);
    }
}
