//! Sandwich (Chi et al. 2023, arXiv 2212.10356), in the form the Rpe paper's appendix writes:
//! p(t) = k·(Σ_{j=1}^{d/2} cos(t / r^{2j/d}) − d/2), the inner product of two sinusoidal
//! embeddings t apart, shifted so p(0) = 0. It is fixed (nothing is learned).
//!
//! attnlab's defaults: k = 1, r = 10000 (the sinusoidal base), d = 128 (fairseq-evo's
//! d' = 2·head_dim for 64-wide heads), one k for every head as the Rpe paper writes it. With
//! `per_head = true`, head h of H uses k·H/(8h) as fairseq-evo's implementation does. The bias
//! is bounded below by −k·d, so strictly Σ exp(p) has a floor and diverges; with k·d/2 ≳ 30 the
//! floor only matters past ~10^12 tokens, and heads with small k show it much earlier.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::DistanceBias;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandwichConfig {
    /// Scale of the bias (the paper's k).
    pub k: f64,
    /// Base of the frequencies (the paper's r).
    pub r: f64,
    /// Width of the sinusoidal embeddings (the paper's d, even).
    pub dim: usize,
    /// Scale head h of H by H/(8h) (fairseq-evo) instead of sharing one k.
    pub per_head: bool,
}

impl Default for SandwichConfig {
    fn default() -> Self {
        Self {
            k: 1.0,
            r: 10_000.0,
            dim: 128,
            per_head: false,
        }
    }
}

/// One head's Sandwich bias.
pub struct Sandwich {
    k: f64,
    freqs: Vec<f64>,
}

impl Sandwich {
    fn new(k: f64, c: &SandwichConfig) -> Self {
        let half = c.dim / 2;
        let freqs = (1..=half)
            .map(|j| c.r.powf(-2.0 * j as f64 / c.dim as f64))
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

/// The per-head biases.
pub fn sandwich(c: &SandwichConfig, n_heads: usize) -> Vec<Arc<dyn DistanceBias>> {
    if !c.per_head {
        return vec![Arc::new(Sandwich::new(c.k, c))];
    }
    (1..=n_heads)
        .map(|h| {
            let k = c.k * n_heads as f64 / (8.0 * h as f64);
            Arc::new(Sandwich::new(k, c)) as Arc<dyn DistanceBias>
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bias_is_zero_at_the_diagonal_and_never_positive() {
        let s = Sandwich::new(1.0, &SandwichConfig::default());
        assert_eq!(s.at(0.0), 0.0);
        assert!((1..2000).all(|t| s.at(t as f64) <= 0.0));
        assert!(s.at(1.0) > s.at(10.0));
    }

    #[test]
    fn recurrence_matches_direct_evaluation() {
        let s = Sandwich::new(0.5, &SandwichConfig::default());
        let mut out = vec![0.0; 5000];
        s.fill(&mut out);
        for t in [0usize, 1, 7, 1023, 1024, 1025, 4999] {
            assert!((out[t] - s.at(t as f64)).abs() < 1e-9, "t = {t}");
        }
    }

    #[test]
    fn per_head_scaling_follows_fairseq_evo() {
        let c = SandwichConfig {
            per_head: true,
            ..Default::default()
        };
        let heads = sandwich(&c, 8);
        let one = Sandwich::new(1.0, &c).at(5.0);
        assert!((heads[0].at(5.0) - one).abs() < 1e-12);
        assert!((heads[7].at(5.0) - one / 8.0).abs() < 1e-12);
    }
}
