//! The window's drawing of a report's [`Figure`]: one function for every view, styled as the
//! exports are (each series' colour and dashes, log axes marked where the saved figure marks
//! them, the same points left out), so what a view shows is what its export buttons save, and
//! hiding a curve in the legend recolours nothing.

use std::ops::RangeInclusive;

use eframe::egui;
use egui_plot::{
    Bar, BarChart, Corner, GridInput, GridMark, HoverPosition, Legend, LegendGrouping, Line,
    LineStyle, PlotUi, Points,
};

use crate::figures::{
    self, BarPlot, Figure, LinePlot, Plot, axis_ticks, drawable_points, legend_corner,
    palette_colour, series_colours, series_groups, tick_label,
};

/// What a view chooses about its plot of a figure; the rest follows from the figure.
pub struct PlotOptions<'a> {
    /// The plot's id within its `Ui`, for a figure whose title changes with the data (the plot
    /// would forget its zoom); `None`: the title.
    pub id: Option<&'a str>,
    pub height: f32,
    /// A y range always in view, in the figure's values (e.g. 0..=1 for accuracy).
    pub y_range: Option<RangeInclusive<f64>>,
}

impl Default for PlotOptions<'_> {
    fn default() -> Self {
        Self {
            id: None,
            height: 260.0,
            y_range: None,
        }
    }
}

/// Draws `figure` as an egui plot: line plots with the exports' colours, dashes and log axes
/// and the nearest series' values on hover, bar plots as grouped bars in the palette's colours
/// with the groups along x. Heatmaps are left to the views that show them (attention maps,
/// encodings), which draw them as textures with hover texts of their own; here they get a note.
pub fn show_figure(ui: &mut egui::Ui, figure: &Figure, options: &PlotOptions) {
    let plot =
        titled_plot(options.id.unwrap_or(&figure.title), figure.axes()).height(options.height);
    match &figure.plot {
        Plot::Lines(lines) => {
            let legend = lines_legend(lines, options.height < COMPACT_LEGEND_BELOW);
            lines_axes(plot, lines, options.y_range.clone())
                .legend(legend)
                .show(ui, |p| add_lines(p, lines));
        }
        Plot::Bars(bars) => {
            let plot = include_y(plot, options.y_range.clone(), false);
            bars_axis(plot, bars).show(ui, |p| {
                for chart in bar_charts(bars) {
                    p.bar_chart(chart);
                }
            });
        }
        Plot::Heatmap(_) => {
            ui.label("(a heatmap: its view draws it)");
        }
    }
}

/// A plot with its axis titles, as the exported figure names them (a plot without them cannot
/// be read on its own). The mouse wheel scrolls the view the plot is in, as everywhere else:
/// in the plot it panned the curves out of sight. Ctrl + wheel zooms, dragging pans, a
/// double click shows everything again.
pub fn titled_plot<'a>(id: &str, [x, y]: [&str; 2]) -> egui_plot::Plot<'a> {
    egui_plot::Plot::new(id)
        .x_axis_label(x.to_string())
        .y_axis_label(y.to_string())
        .allow_scroll(false)
}

/// Plots lower than this get their legend in small text: in body text it covered 40 % of a
/// 220 px plot.
const COMPACT_LEGEND_BELOW: f32 = 300.0;

/// The legend of `lines`: where the export puts it (the corner hiding the least of the
/// curves), named series in the figure's order, each entry also hiding the unnamed series drawn
/// in its colour (its error band); in small text when `compact`.
fn lines_legend(lines: &LinePlot, compact: bool) -> Legend {
    let corner = match legend_corner(lines) {
        figures::Corner::UpperLeft => Corner::LeftTop,
        figures::Corner::UpperRight => Corner::RightTop,
        figures::Corner::LowerLeft => Corner::LeftBottom,
        figures::Corner::LowerRight => Corner::RightBottom,
    };
    let text = match compact {
        true => egui::TextStyle::Small,
        false => egui::TextStyle::Body,
    };
    Legend::default()
        .text_style(text)
        .position(corner)
        .grouping(LegendGrouping::ById)
        .follow_insertion_order(true)
}

/// `plot` with `range` (in the figure's values) always in view, on a log axis if `log`.
fn include_y<'a>(
    plot: egui_plot::Plot<'a>,
    range: Option<RangeInclusive<f64>>,
    log: bool,
) -> egui_plot::Plot<'a> {
    let ends = range.map(RangeInclusive::into_inner);
    ends.into_iter()
        .flat_map(|(start, end)| [start, end])
        .map(|y| on_axis(y, log))
        .filter(|y| y.is_finite())
        .fold(plot, egui_plot::Plot::include_y)
}

/// `plot` set up for `lines`: both axes ticked and labelled as the exports are (log axes read
/// back in values), the hover text naming the series and its point.
fn lines_axes<'a>(
    plot: egui_plot::Plot<'a>,
    lines: &'a LinePlot,
    y_range: Option<RangeInclusive<f64>>,
) -> egui_plot::Plot<'a> {
    let (x_log, y_log) = (lines.x_log, lines.y_log);
    // The labels are the exports' too: egui's own rounds to the decimals of a power-of-ten
    // step, so ticks half a unit apart read 4, 4, 5.
    include_y(plot, y_range, y_log)
        .label_formatter(move |position| Some(hover_text(position, lines)))
        .x_grid_spacer(move |input| grid_marks(input, x_log, X_TICK_POINTS))
        .y_grid_spacer(move |input| grid_marks(input, y_log, Y_TICK_POINTS))
        .x_axis_formatter(move |mark, _| tick_label(value_at(mark.value, x_log)))
        .y_axis_formatter(move |mark, _| tick_label(value_at(mark.value, y_log)))
}

/// Where a value lies along an axis: log10 of it on a log axis (egui_plot has none).
fn on_axis(value: f64, log: bool) -> f64 {
    if log { value.log10() } else { value }
}

/// The value at a position along an axis: undoes [`on_axis`].
fn value_at(position: f64, log: bool) -> f64 {
    if log { 10f64.powf(position) } else { position }
}

/// What the pointer shows: the nearest series' name and its point, or where the pointer is,
/// in the figure's values.
fn hover_text(position: &HoverPosition, lines: &LinePlot) -> String {
    let (name, point) = match position {
        HoverPosition::NearDataPoint {
            plot_name,
            position,
            ..
        } => (*plot_name, position),
        HoverPosition::Elsewhere { position } => ("", position),
    };
    let x = tick_label(value_at(point.x, lines.x_log));
    let y = tick_label(value_at(point.y, lines.y_log));
    let values = format!("{} = {x}\n{} = {y}", lines.x_label, lines.y_label);
    if name.is_empty() {
        values
    } else {
        format!("{name}\n{values}")
    }
}

/// Points between ticks along x: room for a label such as `1.5e4`, and above the 60 to 80
/// points below which egui fades x labels out (ticks at most this far apart can land closer).
const X_TICK_POINTS: f64 = 80.0;
/// Points between ticks along y, where a label needs only a line's height: a 130-point axis
/// gets up to four labels (egui's own grid, or x's spacing, left some such axes with one or
/// two).
const Y_TICK_POINTS: f64 = 30.0;

/// The grid of an axis (on a log axis, positions are log10 of values) at the ticks the exports
/// put there (1-2-5 steps), about one per `points`; each mark's step is its gap to its nearest
/// neighbour, so egui labels the ones with room, and a power of ten's on a log axis at least a
/// decade, so its label is the one kept where 9 and 10 crowd. A range narrower than a
/// billionth of its values gets egui's own grid (the ticks cannot resolve it); an empty or
/// infinite one none.
fn grid_marks(input: GridInput, log: bool, points: f64) -> Vec<GridMark> {
    let (lo, hi) = match log {
        // Beyond 1e±300 the values themselves overflow.
        true => (input.bounds.0.max(-300.0), input.bounds.1.min(300.0)),
        false => input.bounds,
    };
    let span = hi - lo;
    if !(span.is_finite() && span > 0.0) {
        // egui's grid overflows on these too.
        return Vec::new();
    }
    if span <= 1e-9 * lo.abs().max(hi.abs()) {
        return egui_plot::log_grid_spacer(10)(input);
    }
    // `base_step_size` spans the closest grid lines egui allows, 8 points by default.
    let max_ticks = ((hi - lo) / (points / 8.0 * input.base_step_size)).clamp(2.0, 100.0);
    let range = match log {
        true => 10f64.powf(lo)..10f64.powf(hi),
        false => lo..hi,
    };
    let ticks = axis_ticks(range, log, max_ticks as usize);
    let positions: Vec<f64> = ticks.iter().map(|&t| on_axis(t, log)).collect();
    let gap = |i: usize, j: Option<usize>| {
        j.and_then(|j| positions.get(j))
            .map_or(hi - lo, |p| (p - positions[i]).abs())
    };
    let decade = |p: f64| log && (p - p.round()).abs() < 1e-9;
    (0..positions.len())
        .map(|i| {
            let gap = gap(i, i.checked_sub(1)).min(gap(i, Some(i + 1)));
            GridMark {
                value: positions[i],
                step_size: if decade(positions[i]) {
                    gap.max(1.0)
                } else {
                    gap
                },
            }
        })
        .collect()
}

/// Every series of `lines` as the exports draw it: in its colour, dashed if it is, a lone
/// point as a dot, without the points its axes cannot show. An unnamed series shares its
/// colour's legend entry (its id), so hiding a curve hides its band too.
fn add_lines(plot: &mut PlotUi, lines: &LinePlot) {
    let styles = series_colours(lines).into_iter().zip(series_groups(lines));
    for (series, ([r, g, b], group)) in lines.series.iter().zip(styles) {
        let colour = egui::Color32::from_rgb(r, g, b);
        let points: Vec<[f64; 2]> = drawable_points(&series.points, lines.x_log, lines.y_log)
            .into_iter()
            .map(|(x, y)| [on_axis(x, lines.x_log), on_axis(y, lines.y_log)])
            .collect();
        let name = series.name.as_str();
        if let [point] = points[..] {
            plot.points(Points::new(name, point).radius(3.0).color(colour).id(group));
            continue;
        }
        let mut line = Line::new(name, points).color(colour).id(group);
        if series.dashed {
            line = line.style(LineStyle::dashed_loose());
        }
        plot.line(line);
    }
}

/// `plot` with the groups of `bars` named under their whole-number positions and the legend
/// in the series' order, as the export has them.
fn bars_axis<'a>(plot: egui_plot::Plot<'a>, bars: &'a BarPlot) -> egui_plot::Plot<'a> {
    let legend = Legend::default().follow_insertion_order(true);
    plot.legend(legend).x_axis_formatter(move |mark, _| {
        let i = mark.value.round();
        if (mark.value - i).abs() < 1e-6 && i >= 0.0 {
            bars.groups.get(i as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    })
}

/// One chart per series of `bars`, in the palette's colour of its place, its bars side by side
/// within each group around the group's whole-number position; missing (non-finite) values
/// get no bar.
fn bar_charts(bars: &BarPlot) -> Vec<BarChart> {
    let n = bars.series.len() as f64;
    let width = 0.7 / n;
    bars.series
        .iter()
        .enumerate()
        .map(|(s, series)| {
            let offset = (s as f64 - (n - 1.0) / 2.0) * width;
            let drawn = series.values.iter().zip(&bars.groups).enumerate();
            let bars = drawn
                .filter(|(_, (value, _))| value.is_finite())
                .map(|(i, (&value, group))| {
                    Bar::new(i as f64 + offset, value).width(width).name(group)
                })
                .collect();
            let [r, g, b] = palette_colour(s);
            BarChart::new(series.name.as_str(), bars).color(egui::Color32::from_rgb(r, g, b))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loss between 3.7 and 5.1 on a 150-point axis: three ticks half a unit apart, labelled
    /// as the exports label them (egui's own formatter had read them 4, 4, 5), each with room
    /// for its label (egui fades a y label out between 30 and 20 points).
    #[test]
    fn a_short_y_axis_gets_labels_at_least_30_points_apart() {
        let per_point = 1.4 / 150.0;
        let input = GridInput {
            bounds: (3.7, 5.1),
            base_step_size: 8.0 * per_point,
        };
        let marks = grid_marks(input, false, Y_TICK_POINTS);
        let labels: Vec<String> = marks.iter().map(|m| tick_label(m.value)).collect();
        assert_eq!(labels, ["4", "4.5", "5"]);
        assert!(marks.iter().all(|m| m.step_size / per_point > 30.0));
    }

    /// On a tall log axis with ticks 1…9 per decade, 10 and 100 keep a decade's step (their
    /// labels had been the ones hidden between 9 and 20), the others their nearest gap.
    #[test]
    fn powers_of_ten_keep_their_labels_among_crowded_log_ticks() {
        let input = GridInput {
            bounds: (0.0, 2.0),
            base_step_size: 8.0 * 2.0 / 600.0,
        };
        let marks = grid_marks(input, true, Y_TICK_POINTS);
        let step = |value: f64| {
            let mark = marks
                .iter()
                .find(|m| (m.value - value.log10()).abs() < 1e-9);
            mark.map(|m| m.step_size).unwrap()
        };
        assert_eq!((step(10.0), step(100.0)), (1.0, 1.0));
        assert!(step(9.0) < 0.1 && step(20.0) < 0.2);
    }

    /// A range too narrow for the exports' ticks gets egui's grid instead of one tick at its
    /// edge; an infinite one (egui's grid overflows on it) none.
    #[test]
    fn degenerate_ranges_get_egui_grid_or_none() {
        let input = |bounds, base_step_size| GridInput {
            bounds,
            base_step_size,
        };
        let narrow = || input((1.0, 1.0 + 1e-12), 1e-14);
        let ours = grid_marks(narrow(), false, Y_TICK_POINTS);
        assert!(ours.len() > 1);
        assert_eq!(ours.len(), egui_plot::log_grid_spacer(10)(narrow()).len());
        let infinite = input((-f64::MAX, f64::MAX), 1.0);
        assert!(grid_marks(infinite, false, Y_TICK_POINTS).is_empty());
    }

    /// On a log axis the marks are log10 of the exports' ticks: two decades over 600 points
    /// get 1-2-5.
    #[test]
    fn log_axis_marks_are_the_exports_ticks() {
        let input = GridInput {
            bounds: (0.0, 2.0),
            base_step_size: 8.0 * 2.0 / 600.0,
        };
        let values: Vec<f64> = grid_marks(input, true, X_TICK_POINTS)
            .iter()
            .map(|m| 10f64.powf(m.value))
            .collect();
        let expected = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0];
        assert_eq!(values.len(), expected.len(), "{values:?}");
        for (v, e) in values.iter().zip(expected) {
            assert!((v - e).abs() < 1e-9 * e, "{values:?}");
        }
    }
}
