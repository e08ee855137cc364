//! Encodings as plain numbers, for the analyses that need no model (bias curves, convergence,
//! TRF) and for reading a trained encoding's parameters back out of a run.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A relative bias seen from one head: p(t), the term the encoding adds to the attention logit
/// of a key t positions before the query (t ≥ 0). `b(t) = exp(p(t))` is the paper's "exp(RPE)".
pub trait DistanceBias: Send + Sync {
    /// p(t) for a distance t ≥ 0 (a float so that tails can be probed far beyond any table);
    /// −∞ where the encoding never attends (a sliding window's outside).
    fn at(&self, t: f64) -> f64;

    /// p(0), p(1), …, p(n − 1) into `out`. Override where a recurrence beats calling `at`.
    fn fill(&self, out: &mut [f64]) {
        for (t, o) in out.iter_mut().enumerate() {
            *o = self.at(t as f64);
        }
    }

    /// Whether Σ exp(p(t)) converges when the family's closed form settles it, with the
    /// argument; `None` leaves it to the numerical test.
    fn known(&self) -> Option<(Verdict, &str)> {
        None
    }
}

/// A bias whose series is settled in closed form (a geometric series, a p-series, …).
pub struct Known<B> {
    pub bias: B,
    pub verdict: Verdict,
    pub reason: String,
}

impl<B: DistanceBias> DistanceBias for Known<B> {
    fn at(&self, t: f64) -> f64 {
        self.bias.at(t)
    }

    fn fill(&self, out: &mut [f64]) {
        self.bias.fill(out);
    }

    fn known(&self) -> Option<(Verdict, &str)> {
        Some((self.verdict, &self.reason))
    }
}

/// `bias` with its closed-form verdict, as the `Arc` the encodings hand out.
pub fn known(
    bias: impl DistanceBias + 'static,
    verdict: Verdict,
    reason: impl Into<String>,
) -> std::sync::Arc<dyn DistanceBias> {
    std::sync::Arc::new(Known {
        bias,
        verdict,
        reason: reason.into(),
    })
}

impl<F: Fn(f64) -> f64 + Send + Sync> DistanceBias for F {
    fn at(&self, t: f64) -> f64 {
        self(t)
    }
}

/// Whether Σ_t exp(p(t)) converges.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Converges,
    Diverges,
    /// The numbers do not decide it within t < 2^41 (shown in the evidence).
    Undetermined,
}

impl Verdict {
    /// The verdict for several heads together: converges when every head converges, diverges
    /// when any head diverges, undetermined otherwise (and for no heads at all).
    pub fn combine(verdicts: impl IntoIterator<Item = Verdict>) -> Verdict {
        let mut combined = None;
        for v in verdicts {
            combined = Some(match (combined, v) {
                (_, Verdict::Diverges) | (Some(Verdict::Diverges), _) => Verdict::Diverges,
                (None | Some(Verdict::Converges), Verdict::Converges) => Verdict::Converges,
                _ => Verdict::Undetermined,
            });
        }
        combined.unwrap_or(Verdict::Undetermined)
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Converges => "converges",
            Verdict::Diverges => "diverges",
            Verdict::Undetermined => "undetermined",
        })
    }
}
