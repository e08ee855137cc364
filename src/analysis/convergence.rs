//! Does Σ_t exp(p(t)) converge? Theorem 0.4's sufficient condition for length extrapolation,
//! decided numerically, since closed forms exist only for some families.
//!
//! Method (all in the log domain, so biases of −1000 or −∞ neither underflow nor give NaNs):
//! 1. Block sums over dyadic blocks: C_0 = b_0 and C_k = Σ_{t∈[2^{k−1}, 2^k)} b_t for
//!    k = 1..=41, so the blocks cover t < 2^41 ≈ 2.2·10^12. Blocks inside the exact prefix
//!    (2^16 terms by default, [`Probe`]) are exact log-sum-exps of `DistanceBias::fill`;
//!    larger blocks are estimated from 512 stratified points with deterministic golden-ratio
//!    jitter (so oscillating biases such as Sandwich are not aliased), scaled by the stratum
//!    width. Partial sums S(2^k) = Σ_{i≤k} C_i.
//! 2. Local exponents p_k = 1 − log2(C_{k+1}/C_k): for b_t ~ t^−p (ln t)^−q,
//!    p_k ≈ p + (q/ln 2)/k. A least-squares fit p_k = p_∞ + c/k over the last 15 finite
//!    exponents (t ≈ 3·10^7 to 2·10^12) gives the tail exponent p_∞; with p_∞ = 1 fixed, the
//!    one-parameter fit gives the logarithmic exponent q = c·ln 2 (1/(n ln n) has q = 1).
//!    When the exponents scatter (rms residual above 0.1: a sampled oscillating bias such as
//!    Sandwich, whose block estimates are heavy-tailed), the fit is not trusted and the
//!    window's average exponent 1 − log2(C_41/C_26)/15 stands in for p_∞.
//! 3. Rules, in order:
//!    - (a) finite support (every block past some k is exactly 0), or the mass at
//!      t ∈ [2^20, 2^41) below 10^−6 of the sum → converges; if the tail exponent is ≤ 1
//!      (a floor: Sandwich is bounded below by −k·d), the evidence adds that the series
//!      strictly diverges and after roughly how many terms the floor's mass would match the
//!      head's;
//!    - (b) the window's mean local exponent above 20 (faster than any power that matters),
//!      or p_∞ > 1.05 → converges;
//!    - (c) p_∞ < 0.98 → diverges;
//!    - (d) 0.98 ≤ p_∞ ≤ 1.02, a clean fit (a Bertrand series 1/(t ln^q t)): q ≤ 1.1 →
//!      diverges, q ≥ 1.5 → converges, otherwise undetermined;
//!    - otherwise (1.02 < p_∞ ≤ 1.05, a scattered fit near 1, or too few finite blocks to
//!      fit) → undetermined.
//!
//! Two departures from a plain "p_∞ > 1" test, both deliberate:
//! - rule (a)'s 10^−6 rather than 10^−9: Sandwich's floor (mean b ≈ 6·10^−22 for k = 1,
//!   d = 128) holds about 10^−9 of the sum by t = 2·10^12, so a 10^−9 threshold would flip
//!   its verdict with the sampling noise; 10^−6 is also below any ε the TRF is read at;
//! - rule (d): 1/(t ln² t) converges although its p_∞ is 1. A q between 1 and 1.1 converges
//!   mathematically, but so slowly (10/ln^0.1 N of the sum is still to come at any N) that no
//!   model could reach its limit; it is called diverges.
//!
//! Cost (release build, default [`Probe::FAST`]): 1–2 ms for closed-form biases; about
//! 35 ms for Sandwich with d = 128 (its `fill` uses a rotation recurrence, but the 25 × 512
//! sampled points go through `at`, 64 cosines of arguments up to 10^12 each). n_the's
//! [`Probe::PRECISE`] costs about 10 ms for closed forms and 0.3 s for Sandwich.

use std::f64::consts::LN_2;

use serde::Serialize;

use crate::encodings::DistanceBias;
pub use crate::encodings::Verdict;

/// The convergence verdict for one head's bias, with what it rests on.
#[derive(Clone, Debug, Serialize)]
pub struct Convergence {
    pub verdict: Verdict,
    /// One or two sentences a researcher can check: the rule that decided and its numbers.
    pub evidence: String,
    /// (N, S(N) = Σ_{t<N} b_t) for N = 2^k, k = 0..=41; exact up to the probe's exact prefix,
    /// estimated beyond.
    pub partial_sums: Vec<(f64, f64)>,
    /// The fitted asymptotic exponent p_∞ of b_t ~ t^−p; `None` for finite support, for decay
    /// faster than any power, when the local exponents scatter (an oscillating bias), or when
    /// too few blocks are finite to fit.
    pub tail_exponent: Option<f64>,
}

/// How the tail is probed: how many terms are summed exactly, and how many points estimate
/// each larger block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    /// The first 2^exact_log2 terms are summed exactly (clamped to 2^28).
    pub exact_log2: u32,
    /// Stratified points per block beyond the exact prefix.
    pub samples_per_block: usize,
}

impl Probe {
    /// For the verdict: 2^16 exact terms and 512 points per block keep a Sandwich bias
    /// (d/2 cosines of large arguments per sampled point) near 35 ms.
    pub const FAST: Probe = Probe {
        exact_log2: 16,
        samples_per_block: 512,
    };
    /// For n_the: 2^20 exact terms, so receptive fields below 10^6 are exact, and 1024 points
    /// per block for the interpolation beyond.
    pub const PRECISE: Probe = Probe {
        exact_log2: 20,
        samples_per_block: 1024,
    };
}

impl Default for Probe {
    fn default() -> Self {
        Probe::FAST
    }
}

/// The last dyadic block: the blocks cover t < 2^41 ≈ 2.2·10^12.
const LAST_BLOCK: usize = 41;
/// Rule (a) measures the mass from this block on (t ≥ 2^20 ≈ 10^6).
const FAR_BLOCK: usize = 21;
const NEGLIGIBLE_FAR_MASS: f64 = 1e-6;
/// Local exponents used in the fit (t ≈ 3·10^7 to 2·10^12).
const FIT_BLOCKS: usize = 15;
const P_CONVERGES: f64 = 1.05;
const P_DIVERGES: f64 = 0.98;
const P_NEAR_ONE: f64 = 1.02;
const Q_DIVERGES: f64 = 1.1;
const Q_CONVERGES: f64 = 1.5;
/// A mean local exponent above this means "faster than any power that matters".
const SUPER_POWER: f64 = 20.0;
/// A rise of the local exponent across the fitted window above this means the decay is still
/// speeding up, so a small exponent is no evidence of divergence.
const RISING: f64 = 0.02;
/// Above this rms residual the local exponents scatter too much for the fit.
const SCATTERED: f64 = 0.1;
/// The extrapolated tail (for n_the's B) is summed up to t = 2^EXTRAPOLATE_TO.
const EXTRAPOLATE_TO: usize = 1000;
/// The largest exact prefix, 2^28 terms (2 GiB of f64).
const MAX_EXACT_LOG2: u32 = 28;

/// Decides whether Σ_t exp(p(t)) converges, with the default [`Probe`] (see the module docs
/// for the method and thresholds).
pub fn convergence(bias: &dyn DistanceBias) -> Convergence {
    convergence_with(bias, Probe::default())
}

/// [`convergence`] with a chosen exact prefix and sampling density.
pub fn convergence_with(bias: &dyn DistanceBias, probe: Probe) -> Convergence {
    let tail = tail_analysis(bias, probe);
    Convergence {
        verdict: tail.decision.verdict,
        evidence: tail.decision.evidence.clone(),
        partial_sums: tail.partial_sums(),
        tail_exponent: tail.decision.tail_exponent,
    }
}

/// The block sums of one bias and what they decide; kept so that n_the can walk them.
pub(super) struct TailAnalysis {
    /// p(t) for t below 2^exact_log2.
    exact: Vec<f64>,
    /// ln C_k for k = 0..=LAST_BLOCK.
    log_blocks: Vec<f64>,
    samples_per_block: usize,
    decision: Decision,
}

struct Decision {
    verdict: Verdict,
    evidence: String,
    tail_exponent: Option<f64>,
    /// Model for blocks past LAST_BLOCK, when the verdict rests on the fit: ln C_{k+1} − ln C_k.
    extrapolation: Option<Fit>,
}

/// p_k ≈ p_inf + c/k, and q from the fit with p fixed to 1.
#[derive(Clone, Copy, Debug)]
struct Fit {
    p_inf: f64,
    c: f64,
    q: f64,
    /// The mean local exponent over the fitted window (telescoped, so robust to noise).
    mean_local: f64,
    /// Root-mean-square residual of the two-parameter fit.
    rms: f64,
    /// How much the fitted local exponent grows across the window (> 0: the decay is still
    /// speeding up, as for exp(−k·t^r) with small r, which converges far beyond 2·10^12).
    rise: f64,
}

impl Fit {
    fn scattered(&self) -> bool {
        self.rms > SCATTERED
    }

    /// Decays faster than any power that matters (ALiBi, Kerple-power, Type 2): judged on the
    /// mean exponent, since such local exponents grow with k and never fit c/k.
    fn super_power(&self) -> bool {
        self.mean_local > SUPER_POWER
    }

    /// The local exponent is still climbing at the end of the probed range.
    fn still_rising(&self) -> bool {
        !self.scattered() && self.rise > RISING
    }

    /// The exponent the rules read: p_∞, or the window's mean when the fit scatters.
    fn exponent(&self) -> f64 {
        if self.scattered() {
            self.mean_local
        } else {
            self.p_inf
        }
    }

    /// ln C_{k+1} − ln C_k by the fitted model, to extrapolate past the last block.
    fn log_growth(&self, k: usize) -> f64 {
        let c = if self.scattered() { 0.0 } else { self.c };
        LN_2 * (1.0 - self.exponent() - c / k as f64)
    }

    /// The tail exponent worth reporting: `None` past any power or when the fit scatters.
    fn reported(&self) -> Option<f64> {
        (!self.super_power() && !self.scattered()).then_some(self.p_inf)
    }
}

/// Block sums, partial sums and the verdict for `bias`.
pub(super) fn tail_analysis(bias: &dyn DistanceBias, probe: Probe) -> TailAnalysis {
    let exact_log2 = probe.exact_log2.min(MAX_EXACT_LOG2) as usize;
    let mut exact = vec![0.0; 1 << exact_log2];
    bias.fill(&mut exact);
    let samples = probe.samples_per_block.max(1);
    let log_blocks: Vec<f64> = (0..=LAST_BLOCK)
        .map(|k| match block_range(k) {
            (start, end) if k <= exact_log2 => {
                log_sum_exp(exact[start as usize..end as usize].iter().copied())
            }
            _ => sampled_log_block(bias, k, samples),
        })
        .collect();
    let decision = decide(&log_blocks);
    TailAnalysis {
        exact,
        log_blocks,
        samples_per_block: samples,
        decision,
    }
}

/// Distances [start, end) of block k: {0} for k = 0, [2^{k−1}, 2^k) after.
fn block_range(k: usize) -> (u64, u64) {
    if k == 0 {
        (0, 1)
    } else {
        (1 << (k - 1), 1 << k)
    }
}

/// ln Σ exp(x) in one pass, rescaling as the maximum grows; −∞ terms add nothing, a NaN
/// anywhere gives NaN, +∞ gives +∞.
fn log_sum_exp(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut max = f64::NEG_INFINITY;
    let mut sum = 0.0;
    for x in values {
        if x.is_nan() {
            return f64::NAN;
        }
        if x == f64::NEG_INFINITY {
            continue;
        }
        if x <= max {
            sum += (x - max).exp();
        } else {
            sum = sum * (max - x).exp() + 1.0;
            max = x;
        }
    }
    if max.is_infinite() {
        max
    } else {
        max + sum.ln()
    }
}

/// The i-th of `samples` stratified points in [start, start + samples·width): the stratum's
/// start plus a golden-ratio jitter, so periodic biases are not sampled in phase.
fn stratum_point(start: u64, width: f64, i: usize) -> f64 {
    let jitter = (0.5 + i as f64 * 0.618_033_988_749_894_9).fract();
    start as f64 + ((i as f64 + jitter) * width).floor()
}

/// The strata of block k: (width, points), every distance when the block has no more than
/// `samples` of them.
fn block_points(k: usize, samples: usize) -> (f64, Vec<f64>) {
    let (start, end) = block_range(k);
    let size = end - start;
    if size <= samples as u64 {
        return (1.0, (start..end).map(|t| t as f64).collect());
    }
    let width = size as f64 / samples as f64;
    (
        width,
        (0..samples)
            .map(|i| stratum_point(start, width, i))
            .collect(),
    )
}

/// ln C_k estimated from the block's strata.
fn sampled_log_block(bias: &dyn DistanceBias, k: usize, samples: usize) -> f64 {
    let (width, points) = block_points(k, samples);
    width.ln() + log_sum_exp(points.iter().map(|&t| bias.at(t)))
}

/// Applies the rules of the module docs to the block sums.
fn decide(log_blocks: &[f64]) -> Decision {
    let sums = PartialSums::new(log_blocks);
    if log_blocks.iter().any(|c| c.is_nan() || *c == f64::INFINITY) {
        return undecided(
            "p(t) is NaN or +inf at some distance below 2.2e12: no verdict.".into(),
            None,
        );
    }
    let last_finite = log_blocks.iter().rposition(|c| c.is_finite());
    let Some(last_finite) = last_finite else {
        return decided(
            Verdict::Converges,
            "b_t = 0 at every probed distance.".into(),
            None,
        );
    };
    if last_finite < LAST_BLOCK {
        let beyond = block_range(last_finite).1 as f64;
        let text = format!(
            "Finite support: b_t = 0 (p = -inf) at every probed t >= {}, so the sum is finite (S = {}).",
            num(beyond),
            num(sums.total())
        );
        return decided(Verdict::Converges, text, None);
    }
    let fit = fit_local_exponents(log_blocks);
    let exponent = fit.and_then(|f| f.reported());
    let far_share = sums.far_share();
    if far_share < NEGLIGIBLE_FAR_MASS {
        let shape = exponent.filter(|p| *p > 1.0).map_or(String::new(), |p| {
            format!(" b_t decays like t^-p with p = {p:.3}.")
        });
        let text = format!(
            "The tail from t = 2^20 (about 10^6) to 2.2e12 holds {} of the sum (< 1e-6; S(2^20) = {}).{}{}",
            num(far_share),
            num(sums.at(20)),
            shape,
            fit.map_or(String::new(), |f| floor_note(f, log_blocks, sums.total()))
        );
        return decided(Verdict::Converges, text, exponent);
    }
    let Some(fit) = fit else {
        return undecided(
            format!(
                "Too few finite block sums to fit a decay. {}",
                sums.growth()
            ),
            None,
        );
    };
    verdict_from_fit(fit, &sums, exponent)
}

/// Rules (b) to (d).
fn verdict_from_fit(fit: Fit, sums: &PartialSums, exponent: Option<f64>) -> Decision {
    let mut decision = if fit.super_power() {
        decided(
            Verdict::Converges,
            format!(
                "b_t decays faster than any power of t (mean local exponent {} over t = 3e7..2e12): \
                 converges (S = {}).",
                num(fit.mean_local),
                num(sums.total())
            ),
            None,
        )
    } else if fit.exponent() > P_CONVERGES {
        decided(
            Verdict::Converges,
            format!(
                "b_t decays like t^-p with p = {:.3} > 1{}: converges (S(2.2e12) = {}).",
                fit.exponent(),
                scatter_note(fit),
                num(sums.total())
            ),
            exponent,
        )
    } else if fit.exponent() < P_DIVERGES && fit.still_rising() {
        undecided(
            format!(
                "b_t decays ever faster (local exponent rising by {} over t = 3e7..2e12, now {:.3}): \
                 too slow to decide below t = 2.2e12. {}",
                num(fit.rise),
                fit.mean_local + fit.rise / 2.0,
                sums.growth()
            ),
            exponent,
        )
    } else if fit.exponent() < P_DIVERGES {
        decided(
            Verdict::Diverges,
            format!(
                "b_t decays no faster than 1/t (p = {:.3}{}), so the partial sums keep growing: {}",
                fit.exponent(),
                scatter_note(fit),
                sums.growth()
            ),
            exponent,
        )
    } else if fit.exponent() <= P_NEAR_ONE && !fit.scattered() {
        bertrand_verdict(fit, sums, exponent)
    } else {
        undecided(
            format!(
                "b_t decays like t^-p with p = {:.3}{}, too close to 1 to decide below t = 2.2e12: {}",
                fit.exponent(),
                scatter_note(fit),
                sums.growth()
            ),
            exponent,
        )
    };
    if decision.verdict == Verdict::Converges {
        decision.extrapolation = Some(fit);
    }
    decision
}

/// Rule (d): b_t ~ 1/(t ln^q t).
fn bertrand_verdict(fit: Fit, sums: &PartialSums, exponent: Option<f64>) -> Decision {
    let shape = format!(
        "b_t decays like 1/(t ln^q t) with q = {} (p = {:.3})",
        num((fit.q * 100.0).round() / 100.0),
        fit.p_inf
    );
    if fit.q <= Q_DIVERGES {
        // 1/t (q = 0) grows like ln N, 1/(t ln t) (q = 1) like ln ln N.
        let growth = if fit.q < 0.5 { "ln N" } else { "ln ln N" };
        let text = format!(
            "{shape}: q <= 1, partial sums keep growing like {growth}: {}",
            sums.growth()
        );
        decided(Verdict::Diverges, text, exponent)
    } else if fit.q >= Q_CONVERGES {
        let text = format!(
            "{shape}: q > 1, converges, but slowly (S(2.2e12) = {}).",
            num(sums.total())
        );
        decided(Verdict::Converges, text, exponent)
    } else {
        undecided(
            format!("{shape}: too close to q = 1 to decide. {}", sums.growth()),
            exponent,
        )
    }
}

/// For rule (a) when b_t decays no faster than 1/t: the floor that makes the series strictly
/// diverge.
fn floor_note(fit: Fit, log_blocks: &[f64], total: f64) -> String {
    if fit.exponent() > 1.0 {
        return String::new();
    }
    let (start, end) = block_range(LAST_BLOCK);
    let floor = (log_blocks[LAST_BLOCK] - ((end - start) as f64).ln()).exp();
    format!(
        " But b_t no longer decays like a convergent series (tail exponent {:.2}{}, mean b = {} near \
         t = 2e12): strictly the series diverges, a floor that high matching the head's mass after \
         about {} terms.",
        fit.exponent(),
        scatter_note(fit),
        num(floor),
        num(total / floor)
    )
}

/// ", averaged: the local exponents scatter" when the fit is not trusted.
fn scatter_note(fit: Fit) -> &'static str {
    if fit.scattered() {
        ", the window's average: the local exponents scatter"
    } else {
        ""
    }
}

fn decided(verdict: Verdict, evidence: String, tail_exponent: Option<f64>) -> Decision {
    Decision {
        verdict,
        evidence,
        tail_exponent,
        extrapolation: None,
    }
}

fn undecided(evidence: String, tail_exponent: Option<f64>) -> Decision {
    decided(Verdict::Undetermined, evidence, tail_exponent)
}

/// Least-squares fit of the last FIT_BLOCKS finite local exponents, `None` with fewer than 3.
fn fit_local_exponents(log_blocks: &[f64]) -> Option<Fit> {
    let locals: Vec<(f64, f64)> = (1..LAST_BLOCK)
        .rev()
        .filter(|&k| log_blocks[k].is_finite() && log_blocks[k + 1].is_finite())
        .take(FIT_BLOCKS)
        .map(|k| {
            (
                1.0 / k as f64,
                1.0 - (log_blocks[k + 1] - log_blocks[k]) / LN_2,
            )
        })
        .collect();
    if locals.len() < 3 {
        return None;
    }
    let n = locals.len() as f64;
    let mean_x = locals.iter().map(|(x, _)| x).sum::<f64>() / n;
    let mean_y = locals.iter().map(|(_, y)| y).sum::<f64>() / n;
    let sxy: f64 = locals
        .iter()
        .map(|(x, y)| (x - mean_x) * (y - mean_y))
        .sum();
    let sxx: f64 = locals.iter().map(|(x, _)| (x - mean_x).powi(2)).sum();
    let c = sxy / sxx;
    let p_inf = mean_y - c * mean_x;
    let (x_min, x_max) = locals
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), (x, _)| {
            (lo.min(*x), hi.max(*x))
        });
    let c_at_one = locals.iter().map(|(x, y)| x * (y - 1.0)).sum::<f64>()
        / locals.iter().map(|(x, _)| x * x).sum::<f64>();
    let rms = (locals
        .iter()
        .map(|(x, y)| (y - p_inf - c * x).powi(2))
        .sum::<f64>()
        / n)
        .sqrt();
    Some(Fit {
        p_inf,
        c,
        q: c_at_one * LN_2,
        mean_local: mean_y,
        rms,
        rise: -c * (x_max - x_min),
    })
}

/// Cumulative sums of the blocks, S(2^k) = Σ_{i≤k} C_i, in real units.
struct PartialSums {
    log_cumulative: Vec<f64>,
}

impl PartialSums {
    fn new(log_blocks: &[f64]) -> Self {
        let log_cumulative = log_blocks
            .iter()
            .scan(f64::NEG_INFINITY, |acc, &c| {
                *acc = log_sum_exp([*acc, c]);
                Some(*acc)
            })
            .collect();
        Self { log_cumulative }
    }

    /// S(2^k).
    fn at(&self, k: usize) -> f64 {
        self.log_cumulative.get(k).map_or(f64::NAN, |l| l.exp())
    }

    /// S(2^41).
    fn total(&self) -> f64 {
        self.at(LAST_BLOCK)
    }

    /// The share of S(2^41) at t ≥ 2^20.
    fn far_share(&self) -> f64 {
        let (near, all) = (
            self.log_cumulative[FAR_BLOCK - 1],
            self.log_cumulative[LAST_BLOCK],
        );
        (-(near - all).exp_m1()).max(0.0)
    }

    /// "S(1024) = …, S(1.05e6) = …, S(2.2e12) = …".
    fn growth(&self) -> String {
        format!(
            "S(1024) = {}, S(1.05e6) = {}, S(2.2e12) = {}.",
            num(self.at(10)),
            num(self.at(20)),
            num(self.total())
        )
    }
}

impl TailAnalysis {
    pub(super) fn verdict(&self) -> Verdict {
        self.decision.verdict
    }

    fn partial_sums(&self) -> Vec<(f64, f64)> {
        let sums = PartialSums::new(&self.log_blocks);
        (0..=LAST_BLOCK)
            .map(|k| ((1u64 << k) as f64, sums.at(k)))
            .collect()
    }

    /// ln C_k for the fitted model's blocks past LAST_BLOCK, up to t = 2^EXTRAPOLATE_TO.
    fn extrapolated_log_blocks(&self) -> Vec<f64> {
        let Some(fit) = self.decision.extrapolation else {
            return Vec::new();
        };
        let mut log_c = self.log_blocks[LAST_BLOCK];
        (LAST_BLOCK..EXTRAPOLATE_TO)
            .map(|k| {
                log_c += fit.log_growth(k);
                log_c
            })
            .collect()
    }

    /// For each fraction f, the smallest j with Σ_{t<j} b_t > f·B, B the (estimated)
    /// infinite sum: exact inside the exact prefix, interpolated in a sampled block,
    /// extrapolated beyond t = 2^41.
    ///
    /// Sums run in units of the largest exact term, and the exact prefix enters B term by
    /// term, as the scan adds it, so ties (a sliding window's integer sums) come out exact.
    /// `None` where no window does (f ≥ 1, or so close to 1 that f·B rounds to B).
    pub(super) fn windows_above(
        &self,
        bias: &dyn DistanceBias,
        fractions: &[f64],
    ) -> Vec<Option<f64>> {
        let shift = self.unit_log();
        let mass = |log_c: f64| (log_c - shift).exp();
        let beyond: Vec<f64> = self
            .extrapolated_log_blocks()
            .into_iter()
            .map(mass)
            .collect();
        let sampled: Vec<f64> = self.log_blocks[self.first_sampled_block()..]
            .iter()
            .map(|&c| mass(c))
            .collect();
        let exact_total: f64 = self.exact.iter().map(|&p| mass(p)).sum();
        let total = exact_total + sampled.iter().sum::<f64>() + beyond.iter().sum::<f64>();
        fractions
            .iter()
            .map(|f| self.window_above(bias, f * total, shift, &sampled, &beyond))
            .collect()
    }

    /// ln of the unit the sums run in: the largest exact term, else the largest block.
    fn unit_log(&self) -> f64 {
        let largest = |values: &[f64]| {
            values
                .iter()
                .copied()
                .filter(|c| c.is_finite())
                .reduce(f64::max)
        };
        largest(&self.exact)
            .or_else(|| largest(&self.log_blocks))
            .unwrap_or(0.0)
    }

    fn first_sampled_block(&self) -> usize {
        self.exact.len().trailing_zeros() as usize + 1
    }

    /// The smallest j with Σ_{t<j} b_t > target (in units of e^shift), walking the exact
    /// terms, then the sampled blocks' masses, then the extrapolated ones.
    fn window_above(
        &self,
        bias: &dyn DistanceBias,
        target: f64,
        shift: f64,
        sampled: &[f64],
        beyond: &[f64],
    ) -> Option<f64> {
        let mut before = 0.0;
        for (j, &p) in self.exact.iter().enumerate() {
            if before > target {
                return Some(j as f64);
            }
            before += (p - shift).exp();
        }
        if before > target {
            return Some(self.exact.len() as f64);
        }
        for (k, &block) in (self.first_sampled_block()..).zip(sampled) {
            if before + block > target {
                return Some(self.crossing_in_block(bias, k, target - before, shift));
            }
            before += block;
        }
        for (k, &block) in (LAST_BLOCK + 1..).zip(beyond) {
            if before + block > target {
                let start = 2f64.powi(k as i32 - 1);
                return Some(start * (1.0 + (target - before) / block));
            }
            before += block;
        }
        None
    }

    /// Where, inside sampled block k, the cumulative sum passes `remaining` (shifted units),
    /// taking each stratum's mass as spread evenly over it.
    fn crossing_in_block(
        &self,
        bias: &dyn DistanceBias,
        k: usize,
        remaining: f64,
        shift: f64,
    ) -> f64 {
        let (width, points) = block_points(k, self.samples_per_block);
        let start = block_range(k).0 as f64;
        let mut before = 0.0;
        for (i, &t) in points.iter().enumerate() {
            let stratum = width * (bias.at(t) - shift).exp();
            if before + stratum > remaining {
                return start + i as f64 * width + ((remaining - before) / stratum * width).ceil();
            }
            before += stratum;
        }
        block_range(k).1 as f64
    }
}

/// A number for the evidence: 4 significant digits, scientific when large or small.
fn num(x: f64) -> String {
    if x != 0.0 && !(1e-3..1e5).contains(&x.abs()) {
        format!("{x:.3e}")
    } else {
        // + 0.0 turns a -0 into 0.
        format!("{}", (x * 1e4).round() / 1e4 + 0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(bias: impl Fn(f64) -> f64 + Send + Sync) -> Convergence {
        convergence(&bias)
    }

    fn assert_verdict(name: &str, bias: impl Fn(f64) -> f64 + Send + Sync, expected: Verdict) {
        let c = verdict(bias);
        assert_eq!(c.verdict, expected, "{name}: {}", c.evidence);
        assert!(!c.evidence.contains("NaN"), "{name}: {}", c.evidence);
    }

    fn sandwich(k: f64, d: usize, r: f64) -> impl Fn(f64) -> f64 + Send + Sync {
        let thetas: Vec<f64> = (1..=d / 2)
            .map(|j| r.powf(-2.0 * j as f64 / d as f64))
            .collect();
        move |t| k * (thetas.iter().map(|th| (t * th).cos()).sum::<f64>() - (d / 2) as f64)
    }

    #[test]
    fn divergent_series() {
        assert_verdict("1/n", |t| -(t + 1.0).ln(), Verdict::Diverges);
        let n_log_n = |offset: f64| move |t: f64| -(t + offset).ln() - (t + offset).ln().ln();
        assert_verdict("1/(n ln n), n = t+3", n_log_n(3.0), Verdict::Diverges);
        assert_verdict("1/(n ln n), n = t+2", n_log_n(2.0), Verdict::Diverges);
        assert_verdict("kerple-log r=1", |t| -(1.0 + t).ln(), Verdict::Diverges);
        assert_verdict("NoPE", |_| 0.0, Verdict::Diverges);
        let t5 = |t: f64| -0.05 * t.min(128.0);
        assert_verdict("T5-like table", t5, Verdict::Diverges);
        assert_verdict("t^-0.5", |t| -0.5 * (t + 1.0).ln(), Verdict::Diverges);
    }

    #[test]
    fn convergent_series() {
        for k in [1.0, 0.125, 2f64.powi(-8)] {
            assert_verdict("alibi", move |t| -k * t, Verdict::Converges);
        }
        assert_verdict(
            "kerple-log r=2 k=1",
            |t| -2.0 * (1.0 + t).ln(),
            Verdict::Converges,
        );
        assert_verdict(
            "kerple-log r=1.5 k=0.5",
            |t| -1.5 * (1.0 + 0.5 * t).ln(),
            Verdict::Converges,
        );
        for r in [0.5, 1.0, 2.0] {
            assert_verdict("kerple-power", move |t: f64| -t.powf(r), Verdict::Converges);
        }
        assert_verdict("type 1", |t| -2.0 * (t + 1.0).ln(), Verdict::Converges);
        assert_verdict("type 2", |t| -(t + 1.0).ln().powi(2), Verdict::Converges);
        assert_verdict(
            "1/(n ln^2 n)",
            |t| -(t + 3.0).ln() - 2.0 * (t + 3.0).ln().ln(),
            Verdict::Converges,
        );
        assert_verdict("exp(-e^t)", |t: f64| -t.exp(), Verdict::Converges);
    }

    #[test]
    fn sliding_window_has_finite_support() {
        for w in [64.0, 100_000.0] {
            let c = verdict(move |t| if t < w { 0.0 } else { f64::NEG_INFINITY });
            assert_eq!(c.verdict, Verdict::Converges);
            assert!(c.evidence.contains("Finite support"), "{}", c.evidence);
            assert_eq!(c.tail_exponent, None);
        }
        let c = verdict(|t| if t < 64.0 { 0.0 } else { f64::NEG_INFINITY });
        assert!((c.partial_sums[41].1 - 64.0).abs() < 1e-12);
    }

    #[test]
    fn sandwich_converges_with_a_floor_note() {
        let c = convergence(&sandwich(1.0, 128, 10_000.0));
        assert_eq!(c.verdict, Verdict::Converges, "{}", c.evidence);
        assert!(
            c.evidence.contains("strictly the series diverges"),
            "{}",
            c.evidence
        );
        // Sampled block sums of an oscillating bias scatter: no exponent is reported.
        assert_eq!(c.tail_exponent, None);
        assert!(c.evidence.contains("scatter"), "{}", c.evidence);
    }

    #[test]
    fn tail_exponents_are_recovered() {
        let p = |bias: &dyn DistanceBias| convergence(bias).tail_exponent.unwrap();
        assert!((p(&|t: f64| -2.0 * (t + 1.0).ln()) - 2.0).abs() < 0.01);
        assert!((p(&|t: f64| -1.5 * (1.0 + 0.5 * t).ln()) - 1.5).abs() < 0.01);
        assert!((p(&|t: f64| -(t + 1.0).ln()) - 1.0).abs() < 0.01);
        assert!(p(&|_: f64| 0.0).abs() < 0.01);
        assert_eq!(convergence(&|t: f64| -t).tail_exponent, None);
    }

    #[test]
    fn borderline_between_p_one_and_p_converges_is_undetermined() {
        assert_verdict("t^-1.04", |t| -1.04 * (t + 1.0).ln(), Verdict::Undetermined);
    }

    #[test]
    fn nan_bias_is_undetermined() {
        let c = verdict(|t| if t > 5000.0 { f64::NAN } else { -t });
        assert_eq!(c.verdict, Verdict::Undetermined);
        assert!(c.evidence.contains("NaN"), "{}", c.evidence);
    }

    #[test]
    fn partial_sums_are_non_decreasing_from_b0() {
        for bias in [
            &(|t: f64| -(t + 1.0).ln()) as &dyn DistanceBias,
            &|t: f64| 0.3 - t,
            &sandwich(1.0, 64, 1e4),
        ] {
            let sums = convergence(bias).partial_sums;
            assert_eq!(sums.len(), 42);
            assert_eq!(sums[0], (1.0, bias.at(0.0).exp()));
            assert_eq!(sums[41].0, 2f64.powi(41));
            assert!(sums.windows(2).all(|w| w[1].1 >= w[0].1), "{sums:?}");
        }
    }

    #[test]
    fn harmonic_partial_sums_match_ln_n() {
        let sums = convergence(&|t: f64| -(t + 1.0).ln()).partial_sums;
        for &(n, s) in &sums[10..] {
            let expected = n.ln() + 0.577_215_664_901_532_9;
            assert!(
                (s / expected - 1.0).abs() < 1e-3,
                "S({n}) = {s}, expected {expected}"
            );
        }
    }

    #[test]
    fn combine_verdicts() {
        use Verdict::*;
        assert_eq!(Verdict::combine([Converges, Converges]), Converges);
        assert_eq!(Verdict::combine([Converges, Undetermined]), Undetermined);
        assert_eq!(
            Verdict::combine([Undetermined, Diverges, Converges]),
            Diverges
        );
        assert_eq!(Verdict::combine([]), Undetermined);
    }

    #[test]
    fn verdict_serialises_and_displays_lowercase() {
        assert_eq!(
            serde_json::to_string(&Verdict::Converges).unwrap(),
            "\"converges\""
        );
        assert_eq!(Verdict::Undetermined.to_string(), "undetermined");
        assert_eq!(
            serde_json::from_str::<Verdict>("\"diverges\"").unwrap(),
            Verdict::Diverges
        );
    }

    #[test]
    fn log_sum_exp_handles_infinities() {
        assert_eq!(
            log_sum_exp([f64::NEG_INFINITY, f64::NEG_INFINITY]),
            f64::NEG_INFINITY
        );
        assert!((log_sum_exp([0.0, 0.0]) - LN_2).abs() < 1e-15);
        assert!((log_sum_exp([-1000.0, -1000.0]) - (-1000.0 + LN_2)).abs() < 1e-12);
        assert!(log_sum_exp([0.0, f64::NAN]).is_nan());
    }
}
