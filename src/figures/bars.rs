//! Grouped bar charts: one group of bars per category along x, one bar (and colour) per series,
//! with optional ± error whiskers.

use std::ops::Range;

use plotters::prelude::*;
use plotters::style::FontTransform;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::BarPlot;
use super::axis::{Axis, extent, padded};
use super::lines::{X_LABEL_AREA, Y_LABEL_AREA, axes_chart, draw_legend, palette};
use super::svg::{Area, FONT, TICK_SIZE, draw_error};
use crate::{Error, Result};

/// The share of a group's width left empty on each side, so neighbouring groups stay apart.
const GROUP_GAP: f64 = 0.12;

/// Whisker caps as a share of the bar's width.
const CAP: f64 = 0.35;

/// Width of one character of a tick label, in pixels (DejaVu Sans, about 0.55 em).
const TICK_CHAR_WIDTH: f64 = 0.55 * TICK_SIZE / 1.24;

/// Checks that every series has one value (and one error, if any) per group, and that errors are
/// not negative, naming the series and group at fault.
pub(super) fn validate(plot: &BarPlot) -> Result<()> {
    let groups = plot.groups.len();
    for series in &plot.series {
        let bad = |what: String| {
            Error::Figure(format!(
                "cannot draw bar series \"{}\": {what}",
                series.name
            ))
        };
        if series.values.len() != groups {
            return Err(bad(format!(
                "{} values for {groups} groups",
                series.values.len()
            )));
        }
        let Some(errors) = &series.errors else {
            continue;
        };
        if errors.len() != groups {
            return Err(bad(format!("{} errors for {groups} groups", errors.len())));
        }
        if let Some(i) = errors.iter().position(|e| *e < 0.0) {
            return Err(bad(format!(
                "negative error {} in group \"{}\"",
                errors[i], plot.groups[i]
            )));
        }
    }
    Ok(())
}

/// Draws `plot` (already [`validate`]d) filling `area`.
pub(super) fn draw(area: &Area, plot: &BarPlot) -> Result<()> {
    let bars = bars(plot);
    let y = value_axis(&bars);
    let across = labels_fit(area.dim_in_pixel().0, plot);
    let label_area = if across {
        X_LABEL_AREA
    } else {
        let longest = plot.groups.iter().map(|g| g.chars().count()).max();
        let height = (longest.unwrap_or(0) as f64 * TICK_CHAR_WIDTH) as u32 + 40;
        height.clamp(X_LABEL_AREA, area.dim_in_pixel().1 / 3)
    };
    // Group g spans g..g + 1; no ticks, the group labels are drawn below.
    let groups = Axis::linear(0.0..plot.groups.len().max(1) as f64);
    let titles = [plot.x_label.as_str(), plot.y_label.as_str()];
    let mut chart = axes_chart(area, (groups, y), titles, label_area, 0)?;
    let y_start = chart.y_range().start;
    for (g, name) in plot.groups.iter().enumerate() {
        draw_group_label(
            area,
            chart.backend_coord(&(g as f64 + 0.5, y_start)),
            name,
            across,
        )?;
    }
    for (s, series) in plot.series.iter().enumerate() {
        let colour = palette(s);
        let mine = bars.iter().filter(|b| b.series == s);
        let annotation =
            chart
                .draw_series(mine.clone().map(|b| {
                    Rectangle::new([(b.x.start, 0.0), (b.x.end, b.value)], colour.filled())
                }))
                .map_err(draw_error)?;
        annotation
            .label(series.name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 24, y + 6)], colour.filled()));
        chart
            .draw_series(mine.filter_map(Bar::whisker).flatten())
            .map_err(draw_error)?;
    }
    if !plot.series.is_empty() {
        let outlines: Vec<Vec<(i32, i32)>> = bars
            .iter()
            .map(|b| {
                let corners = [(b.x.start, 0.0), (b.x.start, b.value), (b.x.end, b.value)];
                let mut path: Vec<_> = corners.iter().map(|p| chart.backend_coord(p)).collect();
                path.push(chart.backend_coord(&(b.x.end, 0.0)));
                path
            })
            .collect();
        let names: Vec<&str> = plot.series.iter().map(|s| s.name.as_str()).collect();
        draw_legend(&mut chart, &outlines, &names)?;
    }
    Ok(())
}

/// One drawable bar: finite value, its place along x, and its error if it has a finite one.
struct Bar {
    series: usize,
    x: Range<f64>,
    value: f64,
    error: Option<f64>,
}

impl Bar {
    /// The whisker from value − error to value + error with a cap at each end, when there is an
    /// error to show.
    fn whisker(&self) -> Option<[PathElement<(f64, f64)>; 3]> {
        let error = self.error.filter(|e| *e > 0.0)?;
        let style = RGBColor(40, 40, 40).stroke_width(2);
        let centre = (self.x.start + self.x.end) / 2.0;
        let half_cap = CAP * (self.x.end - self.x.start) / 2.0;
        let (low, high) = (self.value - error, self.value + error);
        let cap =
            |y: f64| PathElement::new([(centre - half_cap, y), (centre + half_cap, y)], style);
        Some([
            PathElement::new([(centre, low), (centre, high)], style),
            cap(low),
            cap(high),
        ])
    }
}

/// The bars of `plot` that can be drawn (finite values), group by group. Group `g` spans
/// `g..g + 1` on the x axis; its series share the middle part of it in series order.
fn bars(plot: &BarPlot) -> Vec<Bar> {
    let width = (1.0 - 2.0 * GROUP_GAP) / plot.series.len().max(1) as f64;
    let slot = |g: usize, s: usize| {
        let start = g as f64 + GROUP_GAP + s as f64 * width;
        start..start + width
    };
    plot.series
        .iter()
        .enumerate()
        .flat_map(|(s, series)| {
            let errors = |g: usize| series.errors.as_ref().map(|e| e[g]);
            series
                .values
                .iter()
                .enumerate()
                .filter(|(_, v)| v.is_finite())
                .map(move |(g, &value)| Bar {
                    series: s,
                    x: slot(g, s),
                    value,
                    error: errors(g).filter(|e| e.is_finite()),
                })
        })
        .collect()
}

/// The y axis: from 0 (or below, for negative bars or whiskers) to the highest bar or whisker,
/// with a margin away from 0 only.
fn value_axis(bars: &[Bar]) -> Axis {
    let ends = bars.iter().flat_map(|b| {
        let e = b.error.unwrap_or(0.0);
        [b.value - e, b.value + e]
    });
    let (lo, hi) = extent(ends.chain([0.0])).unwrap_or((0.0, 0.0));
    if lo == hi {
        return Axis::linear(0.0..1.0);
    }
    let range = padded(lo, hi);
    let start = if lo < 0.0 { range.start } else { 0.0 };
    let end = if hi > 0.0 { range.end } else { 0.0 };
    Axis::linear(start..end)
}

/// Whether every group label fits across its group's width when written horizontally.
fn labels_fit(width: u32, plot: &BarPlot) -> bool {
    // The chart's left and right margins (see `axes_chart`) take 42 pixels.
    let plot_width = f64::from(width.saturating_sub(Y_LABEL_AREA + 42));
    let group_width = plot_width / plot.groups.len().max(1) as f64;
    let longest = plot.groups.iter().map(|g| g.chars().count()).max();
    longest.unwrap_or(0) as f64 * TICK_CHAR_WIDTH <= group_width * 0.95
}

/// Writes `name` under the x axis at `axis_point` (absolute pixels): across, or, when the labels
/// would overlap, downwards from the axis (plotters' own tick labels are centred on the tick even
/// when turned, so half of each would hide behind the bars).
fn draw_group_label(area: &Area, axis_point: (i32, i32), name: &str, across: bool) -> Result<()> {
    let base = area.get_base_pixel();
    let at = (axis_point.0 - base.0, axis_point.1 - base.1 + 8);
    let style = TextStyle::from((FONT, TICK_SIZE));
    let style = if across {
        style.pos(Pos::new(HPos::Center, VPos::Top))
    } else {
        style
            .transform(FontTransform::Rotate90)
            .pos(Pos::new(HPos::Left, VPos::Center))
    };
    area.draw_text(name, &style, at).map_err(draw_error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::figures::BarSeries;
    use crate::figures::tests::bars_figure;
    use crate::figures::{Figure, Plot, render_png, render_svg};

    /// `bars_figure()` with its bar plot changed by `edit`.
    fn edited(edit: impl FnOnce(&mut BarPlot)) -> Figure {
        let fig = bars_figure();
        let Plot::Bars(mut plot) = fig.plot else {
            unreachable!()
        };
        edit(&mut plot);
        Figure {
            plot: Plot::Bars(plot),
            ..fig
        }
    }

    /// How many elements filled with the colour of series `s` the SVG holds.
    fn filled_with(svg: &str, s: usize) -> usize {
        let RGBColor(r, g, b) = palette(s);
        svg.matches(&format!("fill=\"#{r:02X}{g:02X}{b:02X}\""))
            .count()
    }

    /// Whether the SVG has a `<text>` element saying exactly `text`.
    fn has_text(svg: &str, text: &str) -> bool {
        svg.contains(&format!(">\n{text}\n</text>"))
    }

    #[test]
    fn svg_has_a_rect_per_bar_group_labels_and_legend() {
        let svg = render_svg(&bars_figure()).unwrap();
        // Three bars per series plus the legend's sample.
        assert_eq!(filled_with(&svg, 0), 4);
        assert_eq!(filled_with(&svg, 1), 4);
        for text in ["softmax", "linear", "based", "hard IoU", "soft IoU", "run"] {
            assert!(has_text(&svg, text), "missing {text}");
        }
    }

    #[test]
    fn errors_draw_whiskers_with_caps() {
        let without = render_svg(&edited(|p| p.series[0].errors = None)).unwrap();
        let with = render_svg(&bars_figure()).unwrap();
        // Two non-zero errors on series 0 (the third is zero: no whisker): a stem and two caps
        // each.
        let count = |svg: &str| svg.matches("<polyline").count();
        assert_eq!(count(&with) - count(&without), 2 * 3);
    }

    #[test]
    fn nan_values_are_skipped_in_the_picture() {
        let fig = edited(|p| p.series[1].values[2] = f64::NAN);
        let svg = render_svg(&fig).unwrap();
        assert_eq!(filled_with(&svg, 1), 3);
        assert_eq!(filled_with(&svg, 0), 4);
    }

    #[test]
    fn y_axis_starts_at_zero_and_covers_whiskers() {
        let bars = bars(&BarPlot {
            series: vec![BarSeries {
                name: "a".into(),
                values: vec![0.5, 0.9],
                errors: Some(vec![0.1, 0.2]),
            }],
            ..bar_plot(2)
        });
        let range = value_axis(&bars).range();
        assert_eq!(range.start, 0.0);
        assert!((range.end - 1.1 * 1.05).abs() < 1e-12, "{range:?}");
        let negative = bars_of(vec![-2.0, 1.0]);
        assert!((value_axis(&negative).range().start - -2.15).abs() < 1e-12);
        assert_eq!(value_axis(&bars_of(vec![0.0])).range(), 0.0..1.0);
        assert_eq!(value_axis(&[]).range(), 0.0..1.0);
    }

    fn bar_plot(groups: usize) -> BarPlot {
        BarPlot {
            x_label: String::new(),
            y_label: String::new(),
            groups: (0..groups).map(|g| g.to_string()).collect(),
            series: Vec::new(),
        }
    }

    fn bars_of(values: Vec<f64>) -> Vec<Bar> {
        bars(&BarPlot {
            series: vec![BarSeries {
                name: "a".into(),
                values: values.clone(),
                errors: None,
            }],
            ..bar_plot(values.len())
        })
    }

    #[test]
    fn bad_lengths_and_negative_errors_name_the_series() {
        let short = edited(|p| p.series[1].values.truncate(2));
        let message = render_svg(&short).unwrap_err().to_string();
        assert!(
            message.contains("\"soft IoU\": 2 values for 3 groups"),
            "{message}"
        );
        let negative = edited(|p| p.series[0].errors = Some(vec![0.1, -0.1, 0.0]));
        let message = render_svg(&negative).unwrap_err().to_string();
        assert!(
            message.contains("negative error -0.1 in group \"linear\""),
            "{message}"
        );
    }

    #[test]
    fn many_groups_get_upright_labels_and_render() {
        let groups = 24;
        let fig = edited(|p| {
            p.groups = (0..groups).map(|g| format!("softmax L{g} H{g}")).collect();
            for series in &mut p.series {
                series.values = vec![0.5; groups];
                series.errors = None;
            }
        });
        let svg = render_svg(&fig).unwrap();
        let upright = |svg: &str| svg.matches("rotate(90").count();
        assert_eq!(upright(&svg), groups);
        assert!(has_text(&svg, "softmax L23 H23"));
        assert_eq!(upright(&render_svg(&bars_figure()).unwrap()), 0);
    }

    #[test]
    fn degenerate_plots_render() {
        for edit in [
            (|p: &mut BarPlot| p.series.clear()) as fn(&mut BarPlot),
            |p| {
                p.groups.clear();
                p.series.iter_mut().for_each(|s| {
                    s.values.clear();
                    s.errors = None;
                });
            },
            |p| p.series.iter_mut().for_each(|s| s.values.fill(f64::NAN)),
        ] {
            render_svg(&edited(edit)).unwrap();
        }
    }

    #[test]
    fn png_renders() {
        let bytes = render_png(&bars_figure()).unwrap();
        let image = resvg::tiny_skia::Pixmap::decode_png(&bytes).unwrap();
        assert_eq!((image.width(), image.height()), (1000, 650));
        // Some pixels carry the first series' blue.
        let blue = image
            .data()
            .chunks(4)
            .filter(|p| p[..3] == [0x1f, 0x77, 0xb4])
            .count();
        assert!(blue > 1000, "{blue} blue pixels");
    }
}
