//! Analyses: receptive fields, convergence, ERF on plain numbers; IoU and spectra of trained
//! runs (which [`trained`] loads with candle); and the [`figures`](mod@figures) of each, as data.
//!
//! After Qin, Zhong, Deng, "Exploring Transformer Extrapolation" (AAAI 2024), with the
//! choices the paper leaves open made explicit:
//! - [`receptive_field`](mod@receptive_field): the paper's `draw()` routine, ported exactly:
//!   the ε grid is `points` evenly spaced values from 1 down to 0 (the paper plots 50), the
//!   window is the smallest j with mass(t < j) ≥ (1 − ε)·mass(t < m) over the m distances,
//!   normalised by m, and the last point (ε = 0) is always 1, as the Python's loop makes it.
//!   The TRF feeds it the content-free attention row softmax(p(0..m)); several heads are
//!   combined by averaging their normalised rows, the rule the ERF uses too, so the two
//!   overlay on the same axes. [`n_the`] is Eq. 22's absolute TRF with the infinite sum B
//!   and the strict ">".
//! - [`convergence`](mod@convergence): Theorem 0.4's condition Σ_t exp(p(t)) < ∞, decided
//!   numerically from dyadic block sums up to t ≈ 2·10^12 and a fit of the tail exponent;
//!   that module documents the method and thresholds. Heads combine by [`Verdict::combine`].
//! - [`erf`](mod@erf): the measured attention mass by distance, averaged over examples, the
//!   chosen [`Heads`] (one, or the mean) and [`Rows`] (every query row, or only the last,
//!   which sees the whole context), fed to the same `draw()`.
//! - [`decay`]: RoFormer's long-range decay bound, the rotary encodings' counterpart of the
//!   TRF (they add no bias, so they have no TRF).

pub mod ablation;
pub mod convergence;
pub mod decay;
mod encoding;
pub mod erf;
pub mod figures;
pub mod heads;
pub mod iou;
pub mod reading;
pub mod receptive_field;
mod run_erf;
pub mod spectrum;
pub mod trained;

pub use convergence::{Convergence, Probe, Verdict, convergence, convergence_with};
pub use decay::rotary_decay;
pub use encoding::{StudiedEncoding, UNTRAINED_MAX_LEN, VerdictReport};
pub use erf::{Heads, Rows, erf, mass_by_distance};
pub use receptive_field::{
    ReceptiveField, content_free_mass_all_rows, content_free_row, draw, n_the, n_the_curve, trf,
    window_for,
};
pub use run_erf::{ErfProtocol, RunErf, mean_mass_by_distance, run_erf};
pub use trained::TrainedRun;
