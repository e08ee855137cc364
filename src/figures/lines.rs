//! Line plots: curves on linear or log axes, with a legend.

use std::ops::Range;

use plotters::element::DashedPathElement;
use plotters::prelude::*;

use super::LinePlot;
use super::axis::Axis;
use super::svg::{AXIS_LABEL_SIZE, Area, FONT, TICK_SIZE, draw_error};
use crate::Result;

/// Matplotlib's tab10: ten colours that stay distinct from each other, cycled for more series.
const PALETTE: [RGBColor; 10] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x17, 0xbe, 0xcf),
];

/// Label areas under and left of the plot, in pixels.
pub(super) const X_LABEL_AREA: u32 = 56;
pub(super) const Y_LABEL_AREA: u32 = 86;

/// Dash and gap lengths of dashed series, in pixels.
const DASH: u32 = 9;
const GAP: u32 = 5;

/// Draws `plot` filling `area`.
pub(super) fn draw(area: &Area, plot: &LinePlot) -> Result<()> {
    let visible = visible_points(plot);
    let (x, y) = covering_axes(plot, &visible);
    draw_chart(area, plot, &visible, x, y)
}

/// The drawable points of each series of `plot`.
fn visible_points(plot: &LinePlot) -> Vec<Vec<(f64, f64)>> {
    plot.series
        .iter()
        .map(|s| drawable_points(&s.points, plot.x_log, plot.y_log))
        .collect()
}

/// The axes (x, y) covering the `visible` points of `plot`.
fn covering_axes(plot: &LinePlot, visible: &[Vec<(f64, f64)>]) -> (Axis, Axis) {
    let x = Axis::covering(visible.iter().flatten().map(|p| p.0), plot.x_log);
    let y = Axis::covering(visible.iter().flatten().map(|p| p.1), plot.y_log);
    (x, y)
}

/// The points of `points` that can be placed on the axes: finite, and positive on log axes.
/// Public so the window leaves out the same points the exports do.
pub fn drawable_points(points: &[(f64, f64)], x_log: bool, y_log: bool) -> Vec<(f64, f64)> {
    let fits = |v: f64, log: bool| v.is_finite() && (!log || v > 0.0);
    points
        .iter()
        .copied()
        .filter(|&(x, y)| fits(x, x_log) && fits(y, y_log))
        .collect()
}

/// Draws the axes, the series (already filtered to `visible` points) and the legend.
fn draw_chart(
    area: &Area,
    plot: &LinePlot,
    visible: &[Vec<(f64, f64)>],
    x: Axis,
    y: Axis,
) -> Result<()> {
    let titles = [plot.x_label.as_str(), plot.y_label.as_str()];
    let mut chart = axes_chart(area, (x, y), titles, X_LABEL_AREA, 8)?;
    for (series, (points, [r, g, b])) in plot
        .series
        .iter()
        .zip(visible.iter().zip(series_colours(plot)))
    {
        let style = RGBColor(r, g, b).stroke_width(2);
        let dashed = series.dashed && points.len() > 1;
        let annotation = if dashed {
            chart.draw_series(DashedLineSeries::new(
                points.iter().copied(),
                DASH,
                GAP,
                style,
            ))
        } else {
            // A lone point has no line: mark it with a dot instead.
            let (dot, style) = if points.len() == 1 {
                (4, style.filled())
            } else {
                (0, style)
            };
            chart.draw_series(LineSeries::new(points.iter().copied(), style).point_size(dot))
        }
        .map_err(draw_error)?;
        if !series.name.is_empty() {
            annotation.label(series.name.as_str());
            if series.dashed {
                annotation.legend(move |(x, y)| {
                    DashedPathElement::new([(x, y), (x + 24, y)], DASH, GAP, style)
                });
            } else {
                annotation.legend(move |(x, y)| PathElement::new([(x, y), (x + 24, y)], style));
            }
        }
    }
    let names = legend_names(plot);
    if !names.is_empty() {
        let paths: Vec<Vec<(i32, i32)>> = visible
            .iter()
            .map(|points| points.iter().map(|p| chart.backend_coord(p)).collect())
            .collect();
        draw_legend(&mut chart, &paths, &names)?;
    }
    Ok(())
}

/// The names in `plot`'s legend: its named series'.
fn legend_names(plot: &LinePlot) -> Vec<&str> {
    plot.series
        .iter()
        .map(|s| s.name.as_str())
        .filter(|name| !name.is_empty())
        .collect()
}

/// A corner of a plotting area.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Corner {
    UpperLeft,
    UpperRight,
    LowerLeft,
    LowerRight,
}

/// A line figure's plotting area in pixels, about as the exports lay it out.
const NOMINAL_AREA: (i32, i32) = (870, 450);

/// The corner where the exports put `plot`'s legend, the one hiding the least of its curves
/// (on a nominal plotting area): public so the window puts its legend there too.
pub fn legend_corner(plot: &LinePlot) -> Corner {
    let visible = visible_points(plot);
    let (x, y) = covering_axes(plot, &visible);
    let (width, height) = NOMINAL_AREA;
    let pixel = |(px, py): &(f64, f64)| (x.map(px, (0, width)), y.map(py, (height, 0)));
    let paths: Vec<Vec<(i32, i32)>> = visible
        .iter()
        .map(|points| points.iter().map(pixel).collect())
        .collect();
    let size = legend_size(&legend_names(plot));
    match least_covered_corner(&paths, (0..width, 0..height), size) {
        SeriesLabelPosition::UpperLeft => Corner::UpperLeft,
        SeriesLabelPosition::LowerLeft => Corner::LowerLeft,
        SeriesLabelPosition::LowerRight => Corner::LowerRight,
        _ => Corner::UpperRight,
    }
}

/// The chart line and bar plots are drawn on.
pub(super) type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<Axis, Axis>>;

/// A chart filling `area` with `axes` (x, y), their `titles` and grid drawn, and up to
/// `x_ticks` tick labels along x under the plot, in an area `x_label_area` pixels high. With no
/// x ticks there are no vertical grid lines either (bar groups are labelled by their caller).
pub(super) fn axes_chart<'a, 'b>(
    area: &'a Area<'b>,
    (x, y): (Axis, Axis),
    [x_title, y_title]: [&str; 2],
    x_label_area: u32,
    x_ticks: usize,
) -> Result<Chart<'a, 'b>> {
    let mut chart = ChartBuilder::on(area)
        .margin_left(12)
        .margin_right(30)
        .margin_top(8)
        .margin_bottom(4)
        .x_label_area_size(x_label_area)
        .y_label_area_size(Y_LABEL_AREA)
        .build_cartesian_2d(x, y)
        .map_err(draw_error)?;
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(x_title)
        .y_desc(y_title)
        .x_labels(x_ticks)
        .y_labels(8)
        .label_style((FONT, TICK_SIZE))
        .axis_desc_style((FONT, AXIS_LABEL_SIZE))
        .bold_line_style(RGBColor(215, 215, 215))
        .light_line_style(RGBColor(242, 242, 242));
    if x_ticks == 0 {
        mesh.disable_x_mesh();
    }
    mesh.draw().map_err(draw_error)?;
    Ok(chart)
}

/// Draws the legend of the series labelled on `chart` (named `names`) in the corner where it
/// hides the least of the data, given as polylines `paths` in pixels.
pub(super) fn draw_legend<'a, 'b: 'a>(
    chart: &mut Chart<'a, 'b>,
    paths: &[Vec<(i32, i32)>],
    names: &[&str],
) -> Result<()> {
    let corner = least_covered_corner(
        paths,
        chart.plotting_area().get_pixel_range(),
        legend_size(names),
    );
    chart
        .configure_series_labels()
        .position(corner)
        .label_font((FONT, TICK_SIZE))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(190, 190, 190))
        .draw()
        .map_err(draw_error)?;
    Ok(())
}

/// The legend entry each series belongs to: named series open the next, an unnamed one joins
/// the series before it (e.g. the second bound of an error band). Public so the window groups
/// series as the exports do; [`series_colours`] colours the entries.
pub fn series_groups(plot: &LinePlot) -> Vec<usize> {
    let mut next = 0;
    plot.series
        .iter()
        .map(|s| {
            if !s.name.is_empty() || next == 0 {
                next += 1;
            }
            next - 1
        })
        .collect()
}

/// The RGB colour each series of `plot` is drawn in: one assignment for the exports and the
/// window, so a curve has the same colour on screen as in its saved figure. A legend entry
/// takes the colour its first series fixes ([`super::Series::colour`]; a later series' is not
/// read), else its place; the unnamed series of the entry share it. Fixed colours are the
/// caller's to keep apart from each other and from the places of the entries without one.
pub fn series_colours(plot: &LinePlot) -> Vec<[u8; 3]> {
    let groups = series_groups(plot);
    let mut slots: Vec<usize> = Vec::new();
    for (series, &group) in plot.series.iter().zip(&groups) {
        if group == slots.len() {
            slots.push(series.colour.unwrap_or(group));
        }
    }
    groups
        .into_iter()
        .map(|group| palette_colour(slots[group]))
        .collect()
}

/// The colours of the palette before it cycles.
pub const PALETTE_SIZE: usize = PALETTE.len();

/// Colour `index` of the palette as RGB (cycled), for the window's bars and lines.
pub fn palette_colour(index: usize) -> [u8; 3] {
    let RGBColor(r, g, b) = palette(index);
    [r, g, b]
}

/// Colour `index` of the palette, cycled for more series than it has.
pub(super) fn palette(index: usize) -> RGBColor {
    PALETTE[index % PALETTE.len()]
}

/// The legend box's approximate size in pixels, as plotters lays it out: the longest name, the
/// 30-pixel sample and 10-pixel margins across; one line per name down.
fn legend_size(names: &[&str]) -> (i32, i32) {
    let longest = names.iter().map(|n| n.chars().count()).max().unwrap_or(0);
    let char_width = 0.7 * TICK_SIZE / 1.24 / 1.24;
    let width = (longest as f64 * char_width) as i32 + 50;
    let height = (names.len() as f64 * 1.25 * TICK_SIZE) as i32 + 20;
    (width, height)
}

/// The corner of the plotting area (`pixels`, absolute) where a legend of `size` hides the least
/// of the polylines `paths` (line series, bar outlines); upper right on ties, as readers expect it there.
fn least_covered_corner(
    paths: &[Vec<(i32, i32)>],
    pixels: (Range<i32>, Range<i32>),
    size: (i32, i32),
) -> SeriesLabelPosition {
    let (xs, ys) = pixels;
    // The box plotters draws, 5 pixels in from the corner, widened by a few pixels of clearance.
    let (w, h) = (size.0 + 10, size.1 + 10);
    let corners = [
        (
            SeriesLabelPosition::UpperRight,
            xs.end - w..xs.end,
            ys.start..ys.start + h,
        ),
        (
            SeriesLabelPosition::UpperLeft,
            xs.start..xs.start + w,
            ys.start..ys.start + h,
        ),
        (
            SeriesLabelPosition::LowerRight,
            xs.end - w..xs.end,
            ys.end - h..ys.end,
        ),
        (
            SeriesLabelPosition::LowerLeft,
            xs.start..xs.start + w,
            ys.end - h..ys.end,
        ),
    ];
    let mut best = (SeriesLabelPosition::UpperRight, usize::MAX);
    for (corner, bx, by) in corners {
        let covered = sampled_pixels(paths)
            .filter(|(x, y)| bx.contains(x) && by.contains(y))
            .count();
        if covered < best.1 {
            best = (corner, covered);
        }
    }
    best.0
}

/// Points along each polyline in `paths`, about every 4 pixels, so long straight segments count
/// as much as densely sampled curves.
fn sampled_pixels(paths: &[Vec<(i32, i32)>]) -> impl Iterator<Item = (i32, i32)> + '_ {
    let segments = paths.iter().flat_map(|path| {
        let ends = path.iter().skip(1);
        path.iter().zip(ends).chain(path.first().map(|p| (p, p)))
    });
    segments.flat_map(|(&(x0, y0), &(x1, y1))| {
        let length = f64::from(x1 - x0).hypot(f64::from(y1 - y0));
        let steps = (length / 4.0).ceil().max(1.0) as i32;
        (0..=steps).map(move |i| {
            let t = f64::from(i) / f64::from(steps);
            let along = |a: i32, b: i32| a + (f64::from(b - a) * t).round() as i32;
            (along(x0, x1), along(y0, y1))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::figures::tests::lines_figure;
    use crate::figures::{Figure, Plot, Series, render_png, render_svg};

    /// `fig` with its line plot changed by `edit`.
    fn edited(edit: impl FnOnce(&mut LinePlot)) -> Figure {
        let mut fig = lines_figure();
        let Plot::Lines(plot) = &mut fig.plot else {
            unreachable!()
        };
        edit(plot);
        fig
    }

    /// The line plot of `fig`.
    fn plot_of(fig: Figure) -> LinePlot {
        let Plot::Lines(plot) = fig.plot else {
            unreachable!()
        };
        plot
    }

    /// A series named `name` with one point.
    fn series(name: &str) -> Series {
        Series {
            name: name.into(),
            points: vec![(1.0, 1.0)],
            dashed: false,
            colour: None,
        }
    }

    #[test]
    fn a_fixed_colour_holds_for_its_legend_entry_and_the_others_keep_their_place() {
        let fixed = |name: &str, colour| Series {
            colour,
            ..series(name)
        };
        let plot = LinePlot {
            x_label: String::new(),
            y_label: String::new(),
            x_log: false,
            y_log: false,
            series: vec![fixed("a", Some(7)), fixed("", None), fixed("b", None)],
        };
        let [seven, one] = [7, 1].map(palette_colour);
        assert_eq!(series_colours(&plot), [seven, seven, one]);
    }

    #[test]
    fn unnamed_series_take_the_colour_of_the_named_one_before() {
        let fig = edited(|plot| {
            plot.series = ["", "mean a", "", "", "mean b", ""].map(series).to_vec();
        });
        let plot = plot_of(fig);
        assert_eq!(series_groups(&plot), [0, 1, 1, 1, 2, 2]);
        let [first, a, b] = [0, 1, 2].map(palette_colour);
        assert_eq!(series_colours(&plot), [first, a, a, a, b, b]);
        assert_ne!(a, b);
    }

    #[test]
    fn a_series_keeps_its_colour_whatever_its_points() {
        // Loss and accuracy plots of the same runs colour them alike, also before a run's
        // first evaluation, when its accuracy series is empty.
        let before = series_colours(&plot_of(lines_figure()));
        let emptied = edited(|plot| {
            plot.series[0].points.clear();
            plot.y_log = true;
        });
        assert_eq!(series_colours(&plot_of(emptied)), before);
        assert_eq!(before, [palette_colour(0), palette_colour(1)]);
        assert_eq!(palette_colour(PALETTE.len()), palette_colour(0));
    }

    #[test]
    fn the_legend_corner_avoids_the_curves() {
        // A rising line through lower left and upper right, as in `lines_figure`.
        assert_eq!(legend_corner(&plot_of(lines_figure())), Corner::UpperLeft);
        let falling = edited(|plot| {
            plot.series[0].points = vec![(0.0, 3.0), (1.0, 2.0), (2.0, 1.0)];
            plot.series[1].points.clear();
        });
        assert_eq!(legend_corner(&plot_of(falling)), Corner::UpperRight);
    }

    #[test]
    fn log_axes_drop_what_they_cannot_show() {
        let fig = edited(|plot| {
            plot.x_log = true;
            plot.y_log = true;
            plot.series[0].points = vec![(0.0, 1.0), (-1.0, 2.0), (1.0, 0.0), (2.0, 1e-3)];
            plot.series[1].points = vec![(10.0, 5.0), (100.0, f64::NAN), (1e3, 1e2)];
        });
        let svg = render_svg(&fig).unwrap();
        assert!(svg.contains("softmax"));
        render_png(&fig).unwrap();
    }

    #[test]
    fn degenerate_data_renders() {
        let cases: [Vec<Series>; 4] = [
            vec![],
            vec![Series {
                name: "one point".into(),
                points: vec![(3.0, 3.0)],
                dashed: true,
                colour: None,
            }],
            vec![Series {
                name: "flat".into(),
                points: vec![(1.0, 0.0), (1.0, 0.0)],
                dashed: false,
                colour: None,
            }],
            vec![Series {
                name: "bad".into(),
                points: vec![(f64::NAN, 1.0), (1.0, f64::INFINITY), (f64::MAX, -f64::MAX)],
                dashed: false,
                colour: None,
            }],
        ];
        for series in cases {
            for log in [false, true] {
                let fig = edited(|plot| {
                    plot.series = series.clone();
                    plot.x_log = log;
                    plot.y_log = log;
                });
                render_svg(&fig).unwrap();
            }
        }
    }

    #[test]
    fn empty_series_stays_in_the_legend() {
        let fig = edited(|plot| plot.series[1].points.clear());
        let svg = render_svg(&fig).unwrap();
        assert!(svg.contains("linear"));
    }

    #[test]
    fn legend_goes_where_the_lines_are_not() {
        let pixels = (0..500, 0..300);
        let size = (100, 50);
        // A line along the top: the legend moves to a lower corner.
        let top = vec![vec![(0, 10), (500, 10)]];
        assert_eq!(
            least_covered_corner(&top, pixels.clone(), size),
            SeriesLabelPosition::LowerRight
        );
        // A rising diagonal covers lower left and upper right.
        let rising = vec![vec![(0, 300), (500, 0)]];
        assert_eq!(
            least_covered_corner(&rising, pixels.clone(), size),
            SeriesLabelPosition::UpperLeft
        );
        assert_eq!(
            least_covered_corner(&[], pixels, size),
            SeriesLabelPosition::UpperRight
        );
    }
}
