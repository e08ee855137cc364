//! Colouring matrices for textures, and the colour bar that says what the colours mean.

use eframe::egui;

use crate::figures::{diverging, viridis};

/// The range of values that viridis spans, on a linear or log10 axis; or, for a signed
/// matrix, the range −m..m that the diverging map spans (0 white).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ColourScale {
    /// Ends of the range, in axis units (log10 of the value when `log`).
    lo: f64,
    hi: f64,
    log: bool,
    signed: bool,
}

/// Values below this are drawn as this on a log axis (attention weights can be exactly 0).
const LOG_FLOOR: f64 = 1e-9;

impl ColourScale {
    /// The range of `values` (NaNs ignored); an empty or constant matrix gets a unit span.
    pub fn of(values: &[f32], log: bool) -> Self {
        let axis = |v: f64| if log { v.max(LOG_FLOOR).log10() } else { v };
        let (lo, hi) = values
            .iter()
            .filter(|v| !v.is_nan())
            .map(|&v| axis(f64::from(v)))
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(v), hi.max(v))
            });
        if lo.is_finite() && hi > lo {
            Self {
                lo,
                hi,
                log,
                signed: false,
            }
        } else {
            let lo = if lo.is_finite() { lo } else { 0.0 };
            Self {
                lo,
                hi: lo + 1.0,
                log,
                signed: false,
            }
        }
    }

    /// The diverging scale −m..m of a signed matrix, m its largest magnitude (NaNs ignored;
    /// an empty or all-zero matrix gets −1..1).
    pub fn signed(values: &[f32]) -> Self {
        let m = values
            .iter()
            .filter(|v| v.is_finite())
            .fold(0.0f64, |m, &v| m.max(f64::from(v).abs()));
        let m = if m > 0.0 { m } else { 1.0 };
        Self {
            lo: -m,
            hi: m,
            log: false,
            signed: true,
        }
    }

    /// The smallest scale that covers both (still centred on 0 for signed ones).
    pub fn union(self, other: Self) -> Self {
        Self {
            lo: self.lo.min(other.lo),
            hi: self.hi.max(other.hi),
            ..self
        }
    }

    /// The colour at `fraction` of the scale.
    fn colour_at(&self, fraction: f64) -> [u8; 3] {
        colour_map(self.signed)(fraction)
    }

    /// Position of `value` on the scale, clamped to [0, 1].
    fn fraction(&self, value: f32) -> f64 {
        let v = f64::from(value);
        let v = if self.log {
            v.max(LOG_FLOOR).log10()
        } else {
            v
        };
        ((v - self.lo) / (self.hi - self.lo)).clamp(0.0, 1.0)
    }

    /// The value at `fraction` of the scale.
    fn value_at(&self, fraction: f64) -> f64 {
        let v = self.lo + fraction * (self.hi - self.lo);
        if self.log { 10f64.powf(v) } else { v }
    }

    /// A row-major `rows × cols` matrix as an image; NaN cells are black.
    pub fn image(&self, values: &[f32], rows: usize, cols: usize) -> egui::ColorImage {
        let pixels = values
            .iter()
            .map(|&v| {
                if v.is_nan() {
                    return egui::Color32::BLACK;
                }
                let [r, g, b] = self.colour_at(self.fraction(v));
                egui::Color32::from_rgb(r, g, b)
            })
            .collect();
        egui::ColorImage::new([cols, rows], pixels)
    }

    /// A horizontal colour bar with the values at its ends.
    pub fn legend(&self, ui: &mut egui::Ui, label: &str) {
        let ends = [self.value_at(0.0), self.value_at(1.0)].map(format_value);
        let scale = match (self.log, self.signed) {
            (true, _) => "(log scale)",
            (_, true) => "(signed: 0 is white)",
            _ => "",
        };
        colour_bar(ui, label, ends, scale, self.signed);
    }
}

/// The colour map of a signed matrix (diverging) or of any other (viridis).
fn colour_map(signed: bool) -> fn(f64) -> [u8; 3] {
    match signed {
        true => diverging,
        false => viridis,
    }
}

/// The colour bar of maps that each span their own range: what the colours mean without
/// one set of numbers (each map's are on hover); signed maps span ± their largest magnitude.
pub fn own_range_legend(ui: &mut egui::Ui, label: &str, signed: bool) {
    let ends = match signed {
        true => [
            "−(each map's largest |value|)",
            "+(its largest |value|), 0 white",
        ],
        false => ["each map's lowest", "its highest"],
    };
    let ends = ends.map(str::to_string);
    colour_bar(ui, label, ends, "(click a map for its numbers)", signed);
}

/// A horizontal colour bar (viridis, or the diverging map when `signed`) between `ends`,
/// `label` before it and `note` after.
fn colour_bar(ui: &mut egui::Ui, label: &str, [low, high]: [String; 2], note: &str, signed: bool) {
    ui.horizontal(|ui| {
        ui.label(egui::RichText::new(format!("{label}:")).small());
        ui.label(egui::RichText::new(low).small());
        let (rect, _) = ui.allocate_exact_size(egui::vec2(160.0, 12.0), egui::Sense::hover());
        const STEPS: usize = 64;
        let width = rect.width() / STEPS as f32;
        for i in 0..STEPS {
            let [r, g, b] = colour_map(signed)(i as f64 / (STEPS - 1) as f64);
            let min = rect.min + egui::vec2(i as f32 * width, 0.0);
            let cell = egui::Rect::from_min_size(min, egui::vec2(width + 0.5, rect.height()));
            ui.painter()
                .rect_filled(cell, 0.0, egui::Color32::from_rgb(r, g, b));
        }
        ui.label(egui::RichText::new(high).small());
        if !note.is_empty() {
            ui.label(egui::RichText::new(note).small().weak());
        }
    });
}

/// The axis titles of a matrix drawn as an image (an image has no axes of its own): which
/// positions run across and which run down.
pub fn axes_note(ui: &mut egui::Ui, [x, y]: [&str; 2]) {
    ui.label(
        egui::RichText::new(format!("across: {x}; down: {y}"))
            .small()
            .weak(),
    );
}

/// Short, readable numbers for the colour bar.
fn format_value(v: f64) -> String {
    if v != 0.0 && (v.abs() < 1e-3 || v.abs() >= 1e4) {
        format!("{v:.1e}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scale_spans_the_values_and_ignores_nan() {
        let scale = ColourScale::of(&[0.25, f32::NAN, 0.75, 0.5], false);
        assert_eq!(scale.fraction(0.25), 0.0);
        assert_eq!(scale.fraction(0.75), 1.0);
        assert_eq!(scale.fraction(0.5), 0.5);
        assert_eq!(scale.value_at(1.0), 0.75);
    }

    #[test]
    fn log_scale_maps_decades_evenly_and_floors_zero() {
        let scale = ColourScale::of(&[1e-3, 1e-2, 1e-1], true);
        assert!((scale.fraction(1e-2) - 0.5).abs() < 1e-6);
        assert!((scale.value_at(1.0) - 0.1).abs() < 1e-6);
        assert_eq!(scale.fraction(0.0), 0.0);
    }

    #[test]
    fn constant_and_empty_matrices_get_a_unit_span() {
        let constant = ColourScale::of(&[2.0, 2.0], false);
        assert_eq!((constant.lo, constant.hi), (2.0, 3.0));
        let empty = ColourScale::of(&[], false);
        assert_eq!((empty.lo, empty.hi), (0.0, 1.0));
    }

    #[test]
    fn a_signed_scale_puts_zero_in_the_middle() {
        let scale = ColourScale::signed(&[-0.5, 2.0, f32::NAN]);
        assert_eq!((scale.lo, scale.hi), (-2.0, 2.0));
        assert_eq!(scale.fraction(0.0), 0.5);
        assert_eq!(scale.colour_at(0.5), diverging(0.5));
        let both = scale.union(ColourScale::signed(&[3.0]));
        assert_eq!((both.lo, both.hi, both.signed), (-3.0, 3.0, true));
    }

    #[test]
    fn union_covers_both_ranges() {
        let a = ColourScale::of(&[0.0, 0.5], false);
        let b = ColourScale::of(&[0.25, 1.0], false);
        let both = a.union(b);
        assert_eq!((both.lo, both.hi), (0.0, 1.0));
    }

    #[test]
    fn images_have_the_matrix_shape_and_ends_of_viridis() {
        let scale = ColourScale::of(&[0.0, 1.0], false);
        let image = scale.image(&[0.0, 1.0, f32::NAN, 0.5, 0.5, 0.5], 2, 3);
        assert_eq!(image.size, [3, 2]);
        let [r, g, b] = viridis(0.0);
        assert_eq!(image.pixels[0], egui::Color32::from_rgb(r, g, b));
        let [r, g, b] = viridis(1.0);
        assert_eq!(image.pixels[1], egui::Color32::from_rgb(r, g, b));
        assert_eq!(image.pixels[2], egui::Color32::BLACK);
    }
}
