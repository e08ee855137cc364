//! Receptive fields: the paper's `draw()` routine (shared by TRF and ERF), the content-free
//! attention row a bias alone produces, and the absolute TRF n_the(ε) of Eq. 22.

use rayon::prelude::*;
use serde::Serialize;

use super::convergence::{Probe, Verdict, tail_analysis};
use crate::encodings::DistanceBias;

/// A receptive-field curve on the paper's axes: for each ε, the smallest window holding a
/// (1 − ε) share of the mass, divided by the row length m.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReceptiveField {
    /// The tolerances, evenly spaced from 1.0 down to 0.0 (draw()'s `epsilon`).
    pub eps: Vec<f64>,
    /// The window for each ε, divided by m (draw()'s `index / m`), in [0, 1].
    pub index: Vec<f64>,
}

/// The paper's `draw(array, n)` (appendix, "Pseudo code for TRF and ERF visualization").
///
/// `array[t]` is the (non-negative) mass at distance t, diagonal first; m = `array.len()`.
/// `eps` holds `points` values evenly spaced from 1.0 down to 0.0, and for every ε but the
/// last, `index` is [`window_for`]`(array, ε) / m`: the smallest j with
/// Σ_{t<j} `array[t]` ≥ (1 − ε)·Σ_{t<m} `array[t]` (j = 0 qualifies for ε = 1), or m when none.
///
/// The last point (ε = 0) is always 1: in the Python loop, `i` never passes n − 1 (the
/// `break`), so the closing `while i < n` loop overwrites `index[n − 1]` with m whatever the
/// array holds, even when trailing zeros let the sum reach the total before the last element.
///
/// Edge cases, kept as the Python behaves where it is defined:
/// - `points == 0`: both vectors are empty; `points == 1`: `torch.linspace(0, 1, 1)` is
///   `[0]`, so the curve is the single point (ε = 0, 1);
/// - an empty array (m = 0, where Python divides 0 by 0): every index is 1, "no window
///   smaller than the whole row";
/// - an all-zero array: every threshold is 0, so every index but the last is 0.
///
/// The Python runs in float32; this runs in f64, so a threshold that float32 rounding puts
/// on the other side of a partial sum may differ by one window. O(m + points).
pub fn draw(array: &[f64], points: usize) -> ReceptiveField {
    let eps = eps_grid(points);
    let m = array.len();
    if m == 0 {
        return ReceptiveField {
            index: vec![1.0; points],
            eps,
        };
    }
    let reached = eps.split_last().map_or(&[][..], |(_, rest)| rest);
    let fractions: Vec<f64> = reached.iter().map(|e| 1.0 - e).collect();
    let mut index: Vec<f64> = windows_reaching(array, &fractions)
        .into_iter()
        .map(|j| j as f64 / m as f64)
        .collect();
    if points > 0 {
        index.push(1.0);
    }
    ReceptiveField { eps, index }
}

/// `points` values evenly spaced from 1.0 down to 0.0 (`torch.flip(torch.linspace(0, 1, n))`).
fn eps_grid(points: usize) -> Vec<f64> {
    match points {
        0 => Vec::new(),
        1 => vec![0.0],
        _ => {
            let last = (points - 1) as f64;
            (0..points)
                .map(|k| (points - 1 - k) as f64 / last)
                .collect()
        }
    }
}

/// The smallest window j ∈ 0..m whose mass Σ_{t<j} `array[t]` reaches (1 − ε) of the row's total
/// Σ_{t<m} `array[t]` ("≥", as draw() compares), or m when no j < m does.
///
/// This is draw()'s absolute receptive field for one ε. Unlike draw()'s last point, ε = 0
/// here can give j < m when the row ends in zeros.
pub fn window_for(array: &[f64], eps: f64) -> usize {
    windows_reaching(array, &[1.0 - eps])
        .first()
        .copied()
        .unwrap_or(array.len())
}

/// For each fraction f (non-decreasing), the smallest j < m with Σ_{t<j} ≥ f·total, or m.
/// One pass over the array, as draw() walks it, stopping once every fraction is reached.
fn windows_reaching(array: &[f64], fractions: &[f64]) -> Vec<usize> {
    let total: f64 = array.iter().sum();
    let mut windows = Vec::with_capacity(fractions.len());
    let mut before = 0.0;
    for (j, &mass) in array.iter().enumerate() {
        if windows.len() == fractions.len() {
            break;
        }
        while let Some(&f) = fractions.get(windows.len()) {
            // As the Python's `s >= cusum * (1 - eps)`, so a NaN total reaches nothing.
            if before >= total * f {
                windows.push(j);
            } else {
                break;
            }
        }
        before += mass;
    }
    windows.resize(fractions.len(), array.len());
    windows
}

/// The attention row a query gives its m most recent keys (distances 0..m−1) from the bias
/// alone, all content logits being equal: softmax(p(0), …, p(m − 1)).
///
/// Computed stably (the maximum is subtracted, −∞ gives 0). A row where every key has
/// p = −∞ attends nowhere and is all zeros. This is the `array` the TRF feeds to [`draw`];
/// draw() only depends on it up to scale, so it is the paper's [b_0, …, b_{m−1}].
pub fn content_free_row(bias: &dyn DistanceBias, m: usize) -> Vec<f64> {
    let mut row = vec![0.0; m];
    let total = fill_unnormalised_row(bias, &mut row);
    if total != 0.0 {
        let scale = 1.0 / total;
        row.iter_mut().for_each(|x| *x *= scale);
    }
    row
}

/// The content-free attention mass by distance averaged over *every* query row of a length-m
/// sequence, where row i sees distances 0..=i: mass_t = b_t · (1/m)·Σ_{i=t}^{m−1} 1/S_i with
/// S_i = Σ_{u≤i} b_u. It is what an ERF over all rows ([`super::Rows::All`]) measures on a model
/// whose content logits are all equal, so the TRF overlaid on such an ERF uses it.
pub fn content_free_mass_all_rows(bias: &dyn DistanceBias, m: usize) -> Vec<f64> {
    let mut row = vec![0.0; m];
    fill_unnormalised_row(bias, &mut row);
    let mut prefix = 0.0;
    let inverse_sums: Vec<f64> = row
        .iter()
        .map(|b| {
            prefix += b;
            if prefix > 0.0 { 1.0 / prefix } else { 0.0 }
        })
        .collect();
    let mut suffix = 0.0;
    let mut mass = vec![0.0; m];
    for t in (0..m).rev() {
        suffix += inverse_sums[t];
        mass[t] = row[t] * suffix / m as f64;
    }
    mass
}

/// Writes exp(p(t) − max p) into `row` (its length is m) and returns the row's sum, 0 when
/// every p is −∞ (the row is then all zeros).
fn fill_unnormalised_row(bias: &dyn DistanceBias, row: &mut [f64]) -> f64 {
    bias.fill(row);
    let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        row.fill(0.0);
        return 0.0;
    }
    let mut total = 0.0;
    for x in row.iter_mut() {
        *x = exp_or_zero(*x - max);
        total += *x;
    }
    total
}

/// e^x, skipping the call where it underflows to 0 anyway (most of a fast-decaying row).
fn exp_or_zero(x: f64) -> f64 {
    if x < -746.0 { 0.0 } else { x.exp() }
}

/// The theoretical receptive field of a layer: the mean over `heads` of their content-free
/// rows of length m, fed to [`draw`].
///
/// The paper does not say how heads are combined; attnlab averages the per-head attention
/// rows (each normalised), the same rule the ERF uses for measured attention, so TRF and ERF
/// overlay on the same axes. No heads gives the empty row's curve (every index 1). A single
/// head's row is passed to draw() unnormalised (draw() only depends on it up to scale), and
/// several heads are computed in parallel (rayon). Cost: one `fill`, one exp and a few
/// passes over m per head (about 20–30 ms per head at m = 10^6 in release builds).
pub fn trf(heads: &[&dyn DistanceBias], m: usize, points: usize) -> ReceptiveField {
    match heads {
        [] => draw(&[], points),
        [head] => {
            let mut row = vec![0.0; m];
            fill_unnormalised_row(*head, &mut row);
            draw(&row, points)
        }
        _ => draw(&mean_row(heads, m), points),
    }
}

/// The mean of the heads' normalised content-free rows, one row buffer per rayon task.
fn mean_row(heads: &[&dyn DistanceBias], m: usize) -> Vec<f64> {
    let share = 1.0 / heads.len() as f64;
    heads
        .par_iter()
        .fold(
            || (vec![0.0; m], vec![0.0; m]),
            |(mut mean, mut row), head| {
                let total = fill_unnormalised_row(*head, &mut row);
                // A NaN total (a NaN bias) is kept, so the curve shows it.
                if total != 0.0 {
                    let weight = share / total;
                    mean.iter_mut()
                        .zip(&row)
                        .for_each(|(acc, x)| *acc += weight * x);
                }
                (mean, row)
            },
        )
        .map(|(mean, _)| mean)
        .reduce(
            || vec![0.0; m],
            |mut a, b| {
                a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
                a
            },
        )
}

/// The absolute theoretical receptive field of Eq. 22: the smallest j with
/// Σ_{t<j} b_t > B(1 − ε), where B = Σ_{t≥0} b_t is the infinite sum (strict ">", as the
/// paper writes it; compare [`window_for`], which uses draw()'s "≥" and a finite sum).
///
/// `None` unless the series converges by [`convergence`](fn@super::convergence)'s numerical test (run here
/// with an exact prefix of 2^20 terms, [`super::Probe::PRECISE`]), and for ε ≤ 0, where no
/// window holds more than the whole sum.
///
/// B is the exact prefix plus the estimated tail. A j inside the first 2^20 distances is
/// exact (an integer); beyond, it is an estimate interpolated inside the sampled block where
/// the cumulative sum crosses B(1 − ε), good to the block's sampling resolution (2^k / 1024
/// at t ≈ 2^k); past t = 2^41 it follows the fitted decay, summed up to t = 2^1000 (so for a
/// series as slow as 1/(t ln² t) both B and j are underestimates).
pub fn n_the(bias: &dyn DistanceBias, eps: f64) -> Option<f64> {
    n_the_curve(bias, &[eps]).first().copied().flatten()
}

/// [`n_the`] for several ε from one tail analysis (the costly part), in the order given.
pub fn n_the_curve(bias: &dyn DistanceBias, eps: &[f64]) -> Vec<Option<f64>> {
    let tail = tail_analysis(bias, Probe::PRECISE);
    if tail.verdict() != Verdict::Converges {
        return vec![None; eps.len()];
    }
    let fractions: Vec<f64> = eps.iter().map(|e| 1.0 - e).collect();
    tail.windows_above(bias, &fractions)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alibi(k: f64) -> impl Fn(f64) -> f64 {
        move |t| -k * t
    }

    fn type1(t: f64) -> f64 {
        -2.0 * (t + 1.0).ln()
    }

    fn type2(t: f64) -> f64 {
        -(t + 1.0).ln().powi(2)
    }

    fn inv_n(t: f64) -> f64 {
        -(t + 1.0).ln()
    }

    fn inv_n_log_n(t: f64) -> f64 {
        -(t + 3.0).ln() - (t + 3.0).ln().ln()
    }

    const C1_EPS: [f64; 5] = [0.5, 0.2, 0.1, 0.05, 0.01];

    fn windows(bias: &dyn DistanceBias, m: usize) -> Vec<usize> {
        let row = content_free_row(bias, m);
        C1_EPS.iter().map(|&e| window_for(&row, e)).collect()
    }

    /// The closed form agrees with averaging the rows one by one.
    #[test]
    fn all_rows_mass_is_the_mean_of_the_truncated_rows() {
        let m = 7;
        let got = content_free_mass_all_rows(&type1, m);
        let mut want = vec![0.0; m];
        for i in 0..m {
            let row = content_free_row(&type1, i + 1);
            for (t, w) in row.iter().enumerate() {
                want[t] += w / m as f64;
            }
        }
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-12, "{got:?} vs {want:?}");
        }
        assert!((got.iter().sum::<f64>() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn eps_grid_runs_from_one_to_zero() {
        let rf = draw(&[1.0; 4], 5);
        assert_eq!(rf.eps, vec![1.0, 0.75, 0.5, 0.25, 0.0]);
    }

    #[test]
    fn draw_matches_hand_computed_curves() {
        // Total 8; thresholds for eps 1, .75, .5, .25, 0: 0, 2, 4, 6, 8.
        // Sums before j = 0,1,2,3: 0, 4, 6, 7.
        let rf = draw(&[4.0, 2.0, 1.0, 1.0], 5);
        assert_eq!(rf.index, vec![0.0, 0.25, 0.25, 0.5, 1.0]);
    }

    #[test]
    fn draw_last_point_is_one_even_when_trailing_zeros_reach_the_total() {
        // The total is reached before j = 1, but the Python overwrites index[n-1] with m.
        let array = [1.0, 0.0, 0.0, 0.0];
        let rf = draw(&array, 3);
        assert_eq!(rf.index, vec![0.0, 0.25, 1.0]);
        assert_eq!(window_for(&array, 0.0), 1);
    }

    #[test]
    fn draw_uniform_row_is_the_diagonal() {
        // Eighths are exact in binary, so no threshold lands a rounding error off a sum.
        let rf = draw(&[1.0; 8], 9);
        for (e, i) in rf.eps.iter().zip(&rf.index) {
            assert!((1.0 - e - i).abs() < 1e-12, "eps {e} index {i}");
        }
    }

    #[test]
    fn draw_agrees_with_window_for_on_every_point_but_the_last() {
        let array: Vec<f64> = (0..37).map(|t| ((t * 7) % 5) as f64 + 0.5).collect();
        let rf = draw(&array, 50);
        for (e, i) in rf.eps[..49].iter().zip(&rf.index) {
            assert_eq!(*i, window_for(&array, *e) as f64 / 37.0);
        }
        assert_eq!(rf.index[49], 1.0);
    }

    #[test]
    fn draw_edge_cases() {
        assert_eq!(
            draw(&[1.0, 2.0], 0),
            ReceptiveField {
                eps: vec![],
                index: vec![]
            }
        );
        assert_eq!(
            draw(&[1.0, 2.0], 1),
            ReceptiveField {
                eps: vec![0.0],
                index: vec![1.0]
            }
        );
        assert_eq!(draw(&[], 3).index, vec![1.0, 1.0, 1.0]);
        assert_eq!(draw(&[0.0, 0.0], 3).index, vec![0.0, 0.0, 1.0]);
    }

    #[test]
    fn window_for_eps_one_is_zero_and_beyond_total_is_m() {
        assert_eq!(window_for(&[1.0, 1.0], 1.0), 0);
        assert_eq!(window_for(&[1.0, 1.0], 0.0), 2);
        assert_eq!(window_for(&[], 0.5), 0);
    }

    #[test]
    fn content_free_row_is_a_stable_softmax() {
        let row = content_free_row(
            &|t: f64| if t < 2.0 { 1000.0 } else { f64::NEG_INFINITY },
            4,
        );
        assert_eq!(row, vec![0.5, 0.5, 0.0, 0.0]);
        assert_eq!(
            content_free_row(&|_: f64| f64::NEG_INFINITY, 2),
            vec![0.0, 0.0]
        );
        let row = content_free_row(&alibi(1.0), 3);
        let z = 1.0 + (-1.0f64).exp() + (-2.0f64).exp();
        assert!((row[1] - (-1.0f64).exp() / z).abs() < 1e-15);
    }

    #[test]
    fn c1_table_windows() {
        let cases: [(&dyn DistanceBias, [[usize; 5]; 2]); 7] = [
            (&alibi(1.0), [[1, 2, 3, 3, 5], [1, 2, 3, 3, 5]]),
            (&alibi(0.125), [[6, 13, 19, 24, 37], [6, 13, 19, 24, 37]]),
            (&type1, [[1, 3, 6, 12, 54], [1, 3, 6, 12, 60]]),
            (&type2, [[2, 3, 4, 5, 9], [2, 3, 4, 5, 9]]),
            (
                &|t: f64| -2.0 * (1.0 + t).ln(),
                [[1, 3, 6, 12, 54], [1, 3, 6, 12, 60]],
            ),
            (
                &inv_n,
                [[17, 131, 259, 364, 479], [48, 692, 1683, 2626, 3748]],
            ),
            (
                &inv_n_log_n,
                [[9, 69, 172, 290, 455], [14, 212, 795, 1726, 3420]],
            ),
        ];
        for (i, (bias, expected)) in cases.iter().enumerate() {
            assert_eq!(
                windows(*bias, 512),
                expected[0].to_vec(),
                "case {i}, m = 512"
            );
            assert_eq!(
                windows(*bias, 4096),
                expected[1].to_vec(),
                "case {i}, m = 4096"
            );
        }
    }

    #[test]
    fn trf_of_one_head_is_draw_of_its_row() {
        let rf = trf(&[&type1], 512, 50);
        assert_eq!(rf, draw(&content_free_row(&type1, 512), 50));
        assert_eq!(rf.index.len(), 50);
    }

    #[test]
    fn trf_averages_the_heads_rows() {
        let local = |t: f64| if t < 1.0 { 0.0 } else { f64::NEG_INFINITY };
        let flat = |_: f64| 0.0;
        // Mean row over m = 4: [1/2 + 1/8, 1/8, 1/8, 1/8].
        let rf = trf(&[&local, &flat], 4, 5);
        assert_eq!(rf.index, vec![0.0, 0.25, 0.25, 0.5, 1.0]);
        assert_eq!(trf(&[], 4, 3).index, vec![1.0; 3]);
    }

    #[test]
    fn convergent_trf_shrinks_with_m_and_divergent_does_not() {
        let at = |bias: &dyn DistanceBias, m| trf(&[bias], m, 11).index[9]; // eps = 0.1
        assert!(at(&type2, 4096) < at(&type2, 512) / 4.0);
        assert!(at(&inv_n, 4096) > at(&inv_n, 512) / 2.0);
    }

    #[test]
    fn n_the_matches_part_c_with_the_infinite_sum() {
        let abs = |bias: &dyn DistanceBias| n_the_curve(bias, &C1_EPS);
        let some = |v: [f64; 5]| v.map(Some).to_vec();
        assert_eq!(abs(&type1), some([1.0, 3.0, 6.0, 12.0, 61.0]));
        assert_eq!(abs(&alibi(1.0)), some([1.0, 2.0, 3.0, 3.0, 5.0]));
        assert_eq!(n_the(&type1, 0.01), Some(61.0));
    }

    #[test]
    fn n_the_is_none_for_divergent_series() {
        assert_eq!(n_the(&inv_n, 0.1), None);
        assert_eq!(n_the(&|_: f64| 0.0, 0.1), None);
    }

    #[test]
    fn n_the_alibi_grows_like_minus_log_eps() {
        for e in [1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8] {
            let ratio = n_the(&alibi(1.0), e).unwrap() / -e.ln();
            assert!((0.9..1.4).contains(&ratio), "eps {e}: ratio {ratio}");
        }
    }

    #[test]
    fn n_the_type1_grows_like_one_over_eps() {
        let eps = [1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7];
        let n = n_the_curve(&type1, &eps);
        for (e, n) in eps.iter().zip(&n) {
            // Σ_{t≥j} 1/(t+1)² ≈ 1/j < Bε  ⇒  j ≈ 1/(Bε), B = π²/6.
            let scaled = n.unwrap() * e * std::f64::consts::PI.powi(2) / 6.0;
            assert!((0.95..1.1).contains(&scaled), "eps {e}: n·B·eps = {scaled}");
        }
        for pair in n.windows(2) {
            let ratio = pair[1].unwrap() / pair[0].unwrap();
            assert!((9.0..11.0).contains(&ratio), "n(eps/10)/n(eps) = {ratio}");
        }
    }

    #[test]
    fn n_the_of_a_sliding_window_is_exact_at_ties() {
        let window = |t: f64| if t < 512.0 { 0.0 } else { f64::NEG_INFINITY };
        // B = 512: Σ_{t<j} = j > 256 first at j = 257 (strict ">").
        let n = n_the_curve(&window, &[0.5, 0.25, 0.01, 0.0]);
        assert_eq!(n, vec![Some(257.0), Some(385.0), Some(507.0), None]);
    }

    #[test]
    fn n_the_grows_with_smaller_eps_far_beyond_the_exact_prefix() {
        // 1/(n ln² n) converges, but its receptive field passes 2^41 and is extrapolated.
        let slow = |t: f64| -(t + 3.0).ln() - 2.0 * (t + 3.0).ln().ln();
        let n: Vec<f64> = n_the_curve(&slow, &[0.3, 0.1, 0.05, 0.01, 1e-3])
            .into_iter()
            .map(Option::unwrap)
            .collect();
        assert!(n.windows(2).all(|w| w[1] > w[0]), "{n:?}");
        assert!(n[3] > 2f64.powi(41), "{n:?}");
    }

    #[test]
    fn type2_has_the_smaller_absolute_trf_at_small_eps() {
        for e in [0.1, 0.05, 0.01, 1e-3, 1e-4] {
            assert!(
                n_the(&type2, e).unwrap() < n_the(&type1, e).unwrap(),
                "eps {e}"
            );
        }
    }
}
