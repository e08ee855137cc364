//! Numeric axes, linear or logarithmic: their ranges, tick positions and tick labels.
//!
//! plotters' own log axis only puts ticks on powers of ten, so a range inside one decade (a loss
//! between 2 and 5) gets no labels at all; [`Axis`] picks 1-2-5 or 1…9 ticks per decade instead,
//! and linear ticks when even those would be too sparse.

use std::ops::Range;

use plotters::coord::ranged1d::{KeyPointHint, NoDefaultFormatting, Ranged, ValueFormatter};
use plotters::coord::types::RangedCoordf64;

/// A numeric axis over `range`, optionally logarithmic (then `range` is positive).
pub(super) struct Axis {
    range: Range<f64>,
    log: bool,
}

impl Axis {
    /// A linear axis over `range`.
    pub(super) fn linear(range: Range<f64>) -> Self {
        Self { range, log: false }
    }

    /// A logarithmic axis over `range`, whose ends must be positive.
    pub(super) fn log(range: Range<f64>) -> Self {
        Self { range, log: true }
    }

    /// The axis covering `values` with a margin (multiplicative on log axes, where only positive
    /// values count); a unit range (or one decade) when there are none.
    pub(super) fn covering(values: impl Iterator<Item = f64>, log: bool) -> Self {
        let finite = values.filter(|v| v.is_finite() && (!log || *v > 0.0));
        match (extent(finite), log) {
            (None, false) => Self::linear(0.0..1.0),
            (None, true) => Self::log(1.0..10.0),
            (Some((lo, hi)), false) => Self::linear(padded(lo, hi)),
            (Some((lo, hi)), true) => {
                let decades = padded(lo.log10(), hi.log10());
                Self::log(10f64.powf(decades.start)..10f64.powf(decades.end))
            }
        }
    }

    /// Where `value` lies along the axis, 0 at the start and 1 at the end.
    fn fraction(&self, value: f64) -> f64 {
        let (start, end, value) = if self.log {
            (self.range.start.ln(), self.range.end.ln(), value.ln())
        } else {
            (self.range.start, self.range.end, value)
        };
        (value - start) / (end - start)
    }
}

impl Ranged for Axis {
    type FormatOption = NoDefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let pixels = f64::from(limit.1 - limit.0) * self.fraction(*value);
        // `as` saturates, so far-off values land off-canvas instead of wrapping.
        limit.0 + pixels.round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        let max_points = hint.max_num_points();
        let linear = || RangedCoordf64::from(self.range.clone()).key_points(max_points);
        if self.log {
            log_ticks(&self.range, max_points).unwrap_or_else(linear)
        } else {
            linear()
        }
    }

    fn range(&self) -> Range<f64> {
        self.range.clone()
    }
}

impl ValueFormatter<f64> for Axis {
    fn format(value: &f64) -> String {
        tick_label(*value)
    }
}

/// The exports' tick positions for an axis over `range` (positive ends when `log`), at most
/// about `max_ticks` of them: public so the window's axes are ticked where the saved figure's
/// are.
pub fn axis_ticks(range: Range<f64>, log: bool, max_ticks: usize) -> Vec<f64> {
    Axis { range, log }.key_points(max_ticks)
}

/// Mantissas per decade for log ticks, finest first.
const MANTISSAS: [&[f64]; 3] = [
    &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0],
    &[1.0, 2.0, 5.0],
    &[1.0],
];

/// Decade steps tried once one tick per decade is still too many.
const DECADE_STEPS: [i32; 8] = [2, 5, 10, 20, 50, 100, 200, 500];

/// The finest log ticks in `range` (1…9 per decade, 1-2-5, every power of ten, every few powers)
/// that number at most `max_points`; None when that leaves fewer than two ticks in view, where
/// linear ticks label the axis better.
fn log_ticks(range: &Range<f64>, max_points: usize) -> Option<Vec<f64>> {
    let candidates = MANTISSAS
        .iter()
        .map(|m| (*m, 1))
        .chain(DECADE_STEPS.iter().map(|&step| (&[1.0][..], step)));
    for (mantissas, step) in candidates {
        let ticks = decade_ticks(range, mantissas, step);
        if ticks.len() <= max_points {
            return (ticks.len() >= 2).then_some(ticks);
        }
    }
    Some(Vec::new())
}

/// Every `mantissa × 10^e` inside `range` with `e` a multiple of `step`.
fn decade_ticks(range: &Range<f64>, mantissas: &[f64], step: i32) -> Vec<f64> {
    let first = range.start.log10().floor() as i32;
    let last = range.end.log10().ceil() as i32;
    // A little slack so a tick exactly on an end is not lost to rounding.
    let inside = |v: &f64| *v >= range.start * (1.0 - 1e-9) && *v <= range.end * (1.0 + 1e-9);
    (first..=last)
        .filter(|e| e.rem_euclid(step) == 0)
        .flat_map(|e| mantissas.iter().map(move |m| m * 10f64.powi(e)))
        .filter(inside)
        .collect()
}

/// A short tick label: plain decimals for ordinary magnitudes, `1.5e-4` style otherwise.
pub fn tick_label(value: f64) -> String {
    let magnitude = value.abs();
    if magnitude != 0.0 && !(1e-3..1e5).contains(&magnitude) {
        let text = format!("{value:.2e}");
        let (mantissa, exponent) = text.split_once('e').unwrap_or((&text, "0"));
        format!("{}e{exponent}", trimmed_decimal(mantissa))
    } else {
        trimmed_decimal(&format!("{value:.6}"))
    }
}

/// A fixed-point decimal without trailing zeros (and without "-0").
fn trimmed_decimal(text: &str) -> String {
    let trimmed = if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.')
    } else {
        text
    };
    if trimmed == "-0" { "0" } else { trimmed }.to_owned()
}

/// `lo..hi` widened so it has room around the data and is never empty: by 5% of the span, or
/// by 10% of the value (1 around zero) when all values are equal.
pub(super) fn padded(lo: f64, hi: f64) -> Range<f64> {
    let pad = if hi > lo {
        0.05 * hi - 0.05 * lo
    } else if lo != 0.0 {
        0.1 * lo.abs()
    } else {
        1.0
    };
    let range = (lo - pad)..(hi + pad);
    if range.start.is_finite() && range.end.is_finite() {
        range
    } else {
        lo..hi
    }
}

/// The smallest and largest of `values`, or None when there are none.
pub(super) fn extent(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values.fold(None, |acc, v| match acc {
        None => Some((v, v)),
        Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_labels_are_short() {
        assert_eq!(tick_label(0.30000000000000004), "0.3");
        assert_eq!(tick_label(200.0), "200");
        assert_eq!(tick_label(0.0), "0");
        assert_eq!(tick_label(-0.0), "0");
        assert_eq!(tick_label(1e-4), "1e-4");
        assert_eq!(tick_label(2.5e6), "2.5e6");
        assert_eq!(tick_label(-1.25e-7), "-1.25e-7");
    }

    #[test]
    fn padded_ranges_are_never_empty() {
        assert_eq!(padded(0.0, 10.0), -0.5..10.5);
        assert_eq!(padded(10.0, 10.0), 9.0..11.0);
        assert_eq!(padded(0.0, 0.0), -1.0..1.0);
        assert_eq!(padded(-f64::MAX, f64::MAX), -f64::MAX..f64::MAX);
    }

    #[test]
    fn covering_ranges_have_margins_and_log_ranges_stay_positive() {
        let linear = Axis::covering([0.0, 10.0, f64::NAN].into_iter(), false);
        assert_eq!(linear.range(), -0.5..10.5);
        let log = Axis::covering([0.0, -1.0, 1.0, 1e4].into_iter(), true).range();
        assert!(
            log.start > 0.0 && log.start < 1.0 && log.end > 1e4,
            "{log:?}"
        );
        assert_eq!(Axis::covering(std::iter::empty(), true).range(), 1.0..10.0);
    }

    #[test]
    fn log_ticks_get_finer_on_short_ranges() {
        assert_eq!(
            log_ticks(&(1.0..1e4), 8),
            Some(vec![1.0, 10.0, 100.0, 1e3, 1e4])
        );
        let ticks = log_ticks(&(0.013..3.0), 8).unwrap();
        let labels: Vec<String> = ticks.into_iter().map(tick_label).collect();
        assert_eq!(labels, ["0.02", "0.05", "0.1", "0.2", "0.5", "1", "2"]);
        assert_eq!(log_ticks(&(1.9..5.1), 8), Some(vec![2.0, 3.0, 4.0, 5.0]));
        assert_eq!(log_ticks(&(1e-30..1e30), 8).map(|t| t.len()), Some(7));
        // Inside one step of 1…9: linear ticks instead.
        assert_eq!(log_ticks(&(2.1..2.9), 8), None);
        assert!(!Axis::log(2.1..2.9).key_points(8).is_empty());
    }

    #[test]
    fn log_axis_maps_decades_evenly() {
        let axis = Axis::log(1.0..100.0);
        assert_eq!(axis.map(&1.0, (0, 200)), 0);
        assert_eq!(axis.map(&10.0, (0, 200)), 100);
        assert_eq!(axis.map(&100.0, (200, 0)), 0);
    }
}
