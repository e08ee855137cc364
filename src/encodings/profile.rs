//! Encodings as plain numbers, for the analyses that need no model (bias curves, convergence,
//! TRF) and for reading a trained encoding's parameters back out of a run.

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
}

impl<F: Fn(f64) -> f64 + Send + Sync> DistanceBias for F {
    fn at(&self, t: f64) -> f64 {
        self(t)
    }
}
