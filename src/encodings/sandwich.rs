//! Sandwich (Chi et al. 2023, arXiv 2212.10356), in the form the Rpe paper's appendix writes:
//! p(t) = k·(Σ_{j=1}^{d/2} cos(t / r^{2j/d}) − d/2), the inner product of two sinusoidal
//! embeddings t apart, shifted so p(0) = 0. It is fixed (nothing is learned).
//!
//! attnlab's defaults are the code the Rpe paper ran (fairseq-evo `transformer_rpe.py`,
//! `buffered_future_mask_sandwich`): head h of H scaled by k·H/(8h) with k = 1, r = 10000 (the
//! sinusoidal base), and d = 2 × the head width (`dim = embed_dim // heads * 2`). The paper's
//! text writes one k for every head: `per_head = false` gives that, and `dim = 128` the old
//! fixed width. The bias is bounded below by −k·d/… (each cosine term is ≥ −2), so strictly
//! Σ exp(p) has a floor and diverges; with k·d/2 ≳ 30 the floor only matters past ~10^12
//! tokens, and the small-k heads of the per-head scaling show it much earlier.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::relative::fixed;
use super::{DistanceBias, Encoding, EncodingShape, EncodingSpec, Facts, Family, Variant};
use crate::params::Params;
use crate::settings::{Choices, Settings, Switch, real};
use crate::{Error, Result};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandwichConfig {
    /// Scale of the bias (the paper's k).
    pub k: f64,
    /// Base of the frequencies (the paper's r).
    pub r: f64,
    /// Width of the sinusoidal embeddings (the paper's d, even); unset = 2 × the head width,
    /// as fairseq-evo.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dim: Option<usize>,
    /// Scale head h of H by H/(8h), as fairseq-evo; `false` shares one k, as the paper writes.
    pub per_head: bool,
}

impl Default for SandwichConfig {
    fn default() -> Self {
        Self {
            k: 1.0,
            r: 10_000.0,
            dim: None,
            per_head: true,
        }
    }
}

/// One head's Sandwich bias.
pub struct Sandwich {
    k: f64,
    freqs: Vec<f64>,
}

impl Sandwich {
    /// One head with scale `k`, sinusoids of width `dim`.
    fn new(k: f64, r: f64, dim: usize) -> Self {
        let half = dim / 2;
        let freqs = (1..=half)
            .map(|j| r.powf(-2.0 * j as f64 / dim as f64))
            .collect();
        Self { k, freqs }
    }
}

/// Steps between exact re-evaluations in [`Sandwich::fill`]'s rotation recurrence; keeps
/// the accumulated rounding error near 1e-13.
const RESYNC: usize = 1024;

impl DistanceBias for Sandwich {
    fn at(&self, t: f64) -> f64 {
        let sum: f64 = self.freqs.iter().map(|w| (t * w).cos() - 1.0).sum();
        self.k * sum
    }

    /// cos((t+1)ω) from cos(tω) and sin(tω) by one rotation: 4 multiplications per frequency
    /// instead of a cosine, which makes 10^6 distances × 64 frequencies cheap enough for the GUI.
    fn fill(&self, out: &mut [f64]) {
        for (chunk_index, chunk) in out.chunks_mut(RESYNC).enumerate() {
            let start = (chunk_index * RESYNC) as f64;
            chunk.fill(0.0);
            for &w in &self.freqs {
                let (step_sin, step_cos) = w.sin_cos();
                let (mut s, mut c) = (start * w).sin_cos();
                for o in chunk.iter_mut() {
                    *o += c - 1.0;
                    (s, c) = (s * step_cos + c * step_sin, c * step_cos - s * step_sin);
                }
            }
            chunk.iter_mut().for_each(|o| *o *= self.k);
        }
    }
}

/// The per-head biases, for heads `head_width` wide.
pub fn sandwich(
    c: &SandwichConfig,
    n_heads: usize,
    head_width: usize,
) -> Vec<Arc<dyn DistanceBias>> {
    let dim = c.dim.unwrap_or(2 * head_width);
    if !c.per_head {
        return vec![Arc::new(Sandwich::new(c.k, c.r, dim))];
    }
    (1..=n_heads)
        .map(|h| {
            let k = c.k * n_heads as f64 / (8.0 * h as f64);
            Arc::new(Sandwich::new(k, c.r, dim)) as Arc<dyn DistanceBias>
        })
        .collect()
}

static FACTS: Facts = Facts {
    name: "sandwich",
    family: Family::Bias,
    learnable: false,
    formula: "bias = k (sum_j cos(t / r^(2j/d)) - d/2)",
    summary: "Chi et al. 2023: the inner product of sinusoids as a bias.",
    settings: Settings {
        numbers: &[
            real("k", 0.001, 10.0, "scale of the bias").log(),
            real("r", 2.0, 1e9, "frequency base").log(),
            real(
                "dim",
                2.0,
                4096.0,
                "width d of the sinusoidal embeddings (even); unset = 2 x the head width (fairseq-evo)",
            )
            .whole(),
        ],
        switches: &[Switch {
            key: "per_head",
            label: "per-head scale k*H/(8h) (fairseq-evo)",
            choices: Choices::Toggle,
        }],
    },
    default: || EncodingSpec::Sandwich(SandwichConfig::default()),
};

impl Variant for SandwichConfig {
    const FACTS: &'static Facts = &FACTS;

    fn build(&self, shape: &EncodingShape, params: &Params) -> Result<Arc<dyn Encoding>> {
        let h = shape.n_heads;
        fixed(
            sandwich(self, h, shape.d_model / h.max(1)),
            shape,
            params.device(),
        )
    }

    fn parameters(&self, _shape: &EncodingShape) -> usize {
        0
    }

    fn validate(&self, _shape: &EncodingShape) -> Result<()> {
        match self.dim {
            Some(d) if !d.is_multiple_of(2) => {
                Err(Error::preset("encoding.dim", d, "must be even"))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bias_is_zero_at_the_diagonal_and_never_positive() {
        let s = Sandwich::new(1.0, 10_000.0, 128);
        assert_eq!(s.at(0.0), 0.0);
        assert!((1..2000).all(|t| s.at(t as f64) <= 0.0));
        assert!(s.at(1.0) > s.at(10.0));
    }

    #[test]
    fn recurrence_matches_direct_evaluation() {
        let s = Sandwich::new(0.5, 10_000.0, 128);
        let mut out = vec![0.0; 5000];
        s.fill(&mut out);
        for t in [0usize, 1, 7, 1023, 1024, 1025, 4999] {
            assert!((out[t] - s.at(t as f64)).abs() < 1e-9, "t = {t}");
        }
    }

    /// fairseq-evo's `buffered_future_mask_sandwich`: slope H/(8h) for head h = 1..H and
    /// d' = 2 × the head width, by default.
    #[test]
    fn defaults_follow_fairseq_evo() {
        let heads = sandwich(&SandwichConfig::default(), 8, 64);
        let one = Sandwich::new(1.0, 10_000.0, 128).at(5.0);
        assert!((heads[0].at(5.0) - one).abs() < 1e-12);
        assert!((heads[7].at(5.0) - one / 8.0).abs() < 1e-12);
        // 4 heads of 16: d' = 32, slopes 1/2, 1/4, 1/6, 1/8.
        let lm = sandwich(&SandwichConfig::default(), 4, 16);
        let narrow = Sandwich::new(1.0, 10_000.0, 32).at(3.0);
        assert!((lm[0].at(3.0) - narrow / 2.0).abs() < 1e-12);
        assert!((lm[3].at(3.0) - narrow / 8.0).abs() < 1e-12);
    }

    #[test]
    fn the_papers_text_shares_one_k_at_a_fixed_width() {
        let c = SandwichConfig {
            per_head: false,
            dim: Some(128),
            ..Default::default()
        };
        let heads = sandwich(&c, 4, 16);
        assert_eq!(heads.len(), 1);
        assert!((heads[0].at(5.0) - Sandwich::new(1.0, 10_000.0, 128).at(5.0)).abs() < 1e-12);
    }
}
