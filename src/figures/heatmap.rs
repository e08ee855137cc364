//! Heatmaps: a matrix as viridis cells (diverging ones around 0 for a signed matrix) with a
//! colour bar, row 0 at the top.
//!
//! Large matrices are block-averaged to at most [`MAX_CELLS`] per side first: a cell smaller than
//! a pixel shows nothing more, and one `<rect>` per cell of a 4096×4096 map would make the SVG
//! hundreds of megabytes.

use std::ops::Range;

use plotters::prelude::*;

use super::HeatmapPlot;
use super::axis::{Axis, extent, padded};
use super::colormap::{MISSING, diverging, viridis};
use super::svg::{AXIS_LABEL_SIZE, Area, FONT, TICK_SIZE, draw_error};
use crate::{Error, Result};

/// The most cells drawn along either side.
const MAX_CELLS: usize = 256;

/// Width of the colour bar's area (bar, ticks, labels and its title), in pixels.
const BAR_AREA_WIDTH: u32 = 150;

/// How many bands the colour bar is drawn with; enough to look continuous.
const BAR_STEPS: usize = 128;

/// Label areas and margin around the matrix, in pixels.
const X_LABEL_AREA: u32 = 56;
const Y_LABEL_AREA: u32 = 86;
const MARGIN: u32 = 10;

/// The cells actually drawn: `plot`'s matrix, block-averaged when it is larger than
/// [`MAX_CELLS`] on a side.
pub(super) struct Grid {
    rows: usize,
    cols: usize,
    /// Source rows and columns per drawn cell.
    block: (usize, usize),
    /// The source matrix's size.
    source: (usize, usize),
    /// Row-major `rows × cols`; NaN where a block has no finite value.
    values: Vec<f64>,
}

impl Grid {
    /// `plot`'s cells ready to draw, or an error when its values do not form a `rows × cols`
    /// matrix.
    pub(super) fn from_plot(plot: &HeatmapPlot) -> Result<Self> {
        let source = (plot.rows, plot.cols);
        let cells = plot.rows.checked_mul(plot.cols);
        if plot.rows == 0 || plot.cols == 0 || cells != Some(plot.values.len()) {
            return Err(Error::Figure(format!(
                "cannot draw heatmap: {} values do not form a non-empty {}×{} matrix",
                plot.values.len(),
                plot.rows,
                plot.cols
            )));
        }
        let block = (plot.rows.div_ceil(MAX_CELLS), plot.cols.div_ceil(MAX_CELLS));
        let (rows, cols) = (plot.rows.div_ceil(block.0), plot.cols.div_ceil(block.1));
        let values = (0..rows * cols)
            .map(|i| {
                let row_span = span(i / cols, block.0, plot.rows);
                let col_span = span(i % cols, block.1, plot.cols);
                block_mean(plot, row_span, col_span)
            })
            .collect();
        Ok(Self {
            rows,
            cols,
            block,
            source,
            values,
        })
    }

    /// The caption's note that cells were averaged, when they were.
    pub(super) fn downsampling_note(&self) -> Option<String> {
        (self.block != (1, 1))
            .then(|| format!("(downsampled from {}×{})", self.source.0, self.source.1))
    }

    /// The source rows covered by drawn row `row`.
    fn row_span(&self, row: usize) -> Range<usize> {
        span(row, self.block.0, self.source.0)
    }

    /// The source columns covered by drawn column `col`.
    fn col_span(&self, col: usize) -> Range<usize> {
        span(col, self.block.1, self.source.1)
    }
}

/// The source indices under drawn index `index` when blocks of `block` cover `len` indices.
fn span(index: usize, block: usize, len: usize) -> Range<usize> {
    index * block..((index + 1) * block).min(len)
}

/// The mean of the finite values of `plot` in `rows` × `cols`; NaN when there are none (an empty
/// region stays empty), except that a lone cell keeps its value (±inf still gets an end of the
/// colour scale).
fn block_mean(plot: &HeatmapPlot, rows: Range<usize>, cols: Range<usize>) -> f64 {
    if rows.len() * cols.len() == 1 {
        return plot.values[rows.start * plot.cols + cols.start];
    }
    let finite = rows
        .flat_map(|r| cols.clone().map(move |c| r * plot.cols + c))
        .map(|i| plot.values[i])
        .filter(|v| v.is_finite());
    let (sum, count) = finite.fold((0.0, 0usize), |(sum, count), v| (sum + v, count + 1));
    if count == 0 {
        f64::NAN
    } else {
        sum / count as f64
    }
}

/// Maps values to colours: viridis over the finite values' range, in log10 space for
/// `log_colour` heatmaps; for a signed one, the diverging map over −m..m, m the largest
/// magnitude, so 0 is white.
struct ColourScale {
    /// The range in scaled (possibly log10) space.
    range: Range<f64>,
    log: bool,
    signed: bool,
}

impl ColourScale {
    /// The scale of `plot`'s kind spanning the finite values of `values` (the positive ones
    /// when `log`).
    fn spanning(values: &[f64], plot: &HeatmapPlot) -> Self {
        if plot.signed {
            let m = values
                .iter()
                .filter(|v| v.is_finite())
                .fold(0.0f64, |m, v| m.max(v.abs()));
            let m = if m > 0.0 { m } else { 1.0 };
            return Self {
                range: -m..m,
                log: false,
                signed: true,
            };
        }
        let log = plot.log_colour;
        let scaled = values
            .iter()
            .filter(|v| v.is_finite() && (!log || **v > 0.0))
            .map(|&v| if log { v.log10() } else { v });
        let range = match extent(scaled) {
            None => 0.0..1.0,
            Some((lo, hi)) if lo < hi => lo..hi,
            Some((lo, hi)) => padded(lo, hi),
        };
        Self {
            range,
            log,
            signed: false,
        }
    }

    /// The map's colour at fraction `t` of the scale.
    fn map(&self, t: f64) -> [u8; 3] {
        match self.signed {
            true => diverging(t),
            false => viridis(t),
        }
    }

    /// The colour of `value`, None for NaN (left empty); values ≤ 0 on a log scale get the
    /// lowest colour.
    fn colour(&self, value: f64) -> Option<RGBColor> {
        if value.is_nan() {
            return None;
        }
        let t = if self.log && value <= 0.0 {
            0.0
        } else {
            let scaled = if self.log { value.log10() } else { value };
            (scaled - self.range.start) / (self.range.end - self.range.start)
        };
        let [r, g, b] = self.map(t);
        Some(RGBColor(r, g, b))
    }

    /// The value (not log10) at fraction `t` of the scale.
    fn value_at(&self, t: f64) -> f64 {
        let scaled = self.range.start + t * (self.range.end - self.range.start);
        if self.log { 10f64.powf(scaled) } else { scaled }
    }
}

/// `plot`'s matrix alone as RGB pixels (row 0 at the top), the cells a figure draws
/// (block-averaged past [`MAX_CELLS`] a side) in the figure's colours, each cell a square of
/// as many pixels as keep the longer side within `max_side` (at least one); NaN cells are
/// [`MISSING`]. Returns (width, height, RGB bytes): what an image dashboard shows.
pub fn heatmap_pixels(plot: &HeatmapPlot, max_side: usize) -> Result<(usize, usize, Vec<u8>)> {
    let grid = Grid::from_plot(plot)?;
    let scale = ColourScale::spanning(&grid.values, plot);
    let cell = (max_side / grid.rows.max(grid.cols)).max(1);
    let (width, height) = (grid.cols * cell, grid.rows * cell);
    let mut rgb = Vec::with_capacity(width * height * 3);
    for row in 0..grid.rows {
        let colours: Vec<[u8; 3]> = grid.values[row * grid.cols..][..grid.cols]
            .iter()
            .map(|&v| scale.colour(v).map_or(MISSING, |c| [c.0, c.1, c.2]))
            .collect();
        let line: Vec<u8> = colours
            .iter()
            .flat_map(|c| std::iter::repeat_n(c, cell).flatten().copied())
            .collect();
        for _ in 0..cell {
            rgb.extend_from_slice(&line);
        }
    }
    Ok((width, height, rgb))
}

/// Draws `grid` (the cells of `plot`) filling `area`: the matrix on the left, the colour bar on
/// the right.
pub(super) fn draw(area: &Area, plot: &HeatmapPlot, grid: &Grid) -> Result<()> {
    let scale = ColourScale::spanning(&grid.values, plot);
    let (width, height) = area.dim_in_pixel();
    let matrix_room = (width.saturating_sub(BAR_AREA_WIDTH), height);
    let (pad_x, pad_y) = aspect_padding(matrix_room, grid.source);
    // Centre matrix and bar together, the bar right beside the matrix.
    let centred = area.margin(0, 0, pad_x / 2, pad_x - pad_x / 2);
    let matrix_width = centred.dim_in_pixel().0.saturating_sub(BAR_AREA_WIDTH);
    let (matrix_area, bar_area) = centred.split_horizontally(matrix_width);
    let plot_rows = draw_matrix(&matrix_area, plot, grid, &scale, pad_y)?;
    draw_colour_bar(&bar_area, plot, &scale, plot_rows)
}

/// Draws the matrix with its axes, `pad_y` pixels shorter than `area` allows; returns the pixel
/// rows its plotting area spans, so the colour bar can line up with it.
fn draw_matrix(
    area: &Area,
    plot: &HeatmapPlot,
    grid: &Grid,
    scale: &ColourScale,
    pad_y: u32,
) -> Result<Range<i32>> {
    let (rows, cols) = (grid.source.0 as i32, grid.source.1 as i32);
    let mut chart = ChartBuilder::on(area)
        .margin_left(MARGIN)
        .margin_right(MARGIN)
        .margin_top(MARGIN + pad_y / 2)
        .margin_bottom(MARGIN + pad_y - pad_y / 2)
        .x_label_area_size(X_LABEL_AREA)
        .y_label_area_size(Y_LABEL_AREA)
        .build_cartesian_2d(0..cols, -rows..0)
        .map_err(draw_error)?;
    // Plot y grows upwards, so source row r is drawn at y = -r: row 0 at the top.
    let row_label = |v: &i32| (-v).to_string();
    chart
        .configure_mesh()
        .disable_mesh()
        .x_desc(plot.x_label.as_str())
        .y_desc(plot.y_label.as_str())
        .x_labels(8)
        .y_labels(8)
        .y_label_formatter(&row_label)
        .label_style((FONT, TICK_SIZE))
        .axis_desc_style((FONT, AXIS_LABEL_SIZE))
        .draw()
        .map_err(draw_error)?;
    // One rect per run of equal colour along a row: flat regions (the empty causal triangle, a
    // saturated block) then cost one element instead of hundreds.
    let cells = (0..grid.rows).flat_map(|row| {
        let colours = grid.values[row * grid.cols..(row + 1) * grid.cols]
            .iter()
            .map(|&v| scale.colour(v));
        let r = grid.row_span(row);
        colour_runs(colours).into_iter().map(move |(cols, colour)| {
            let top_left = (grid.col_span(cols.start).start as i32, -(r.start as i32));
            let bottom_right = (grid.col_span(cols.end - 1).end as i32, -(r.end as i32));
            Rectangle::new([top_left, bottom_right], colour.filled())
        })
    });
    chart.draw_series(cells).map_err(draw_error)?;
    Ok(chart.plotting_area().get_pixel_range().1)
}

/// The runs of consecutive equal colours in `colours`, as index ranges; empty cells (None) belong
/// to no run.
fn colour_runs(colours: impl Iterator<Item = Option<RGBColor>>) -> Vec<(Range<usize>, RGBColor)> {
    let mut runs: Vec<(Range<usize>, RGBColor)> = Vec::new();
    for (i, colour) in colours.enumerate() {
        let Some(colour) = colour else { continue };
        match runs.last_mut() {
            Some((run, last)) if run.end == i && *last == colour => run.end += 1,
            _ => runs.push((i..i + 1, colour)),
        }
    }
    runs
}

/// Extra horizontal and vertical margins that give the matrix's plotting area, drawn in an area
/// of `area` pixels, its aspect ratio (columns to rows, kept within 1:2 and 2:1 so a thin matrix
/// stays legible).
fn aspect_padding(area: (u32, u32), (rows, cols): (usize, usize)) -> (u32, u32) {
    let width = f64::from(area.0.saturating_sub(Y_LABEL_AREA + 2 * MARGIN));
    let height = f64::from(area.1.saturating_sub(X_LABEL_AREA + 2 * MARGIN));
    let aspect = (cols as f64 / rows as f64).clamp(0.5, 2.0);
    if width > height * aspect {
        ((width - height * aspect) as u32, 0)
    } else {
        (0, (height - width / aspect) as u32)
    }
}

/// Draws the colour bar beside the matrix, spanning the same pixel rows `plot_rows`, with a
/// linear or log axis matching the scale.
fn draw_colour_bar(
    area: &Area,
    plot: &HeatmapPlot,
    scale: &ColourScale,
    plot_rows: Range<i32>,
) -> Result<()> {
    let ends = scale.value_at(0.0)..scale.value_at(1.0);
    let y = if scale.log {
        Axis::log(ends)
    } else {
        Axis::linear(ends)
    };
    let (_, area_rows) = area.get_pixel_range();
    let margin_top = (plot_rows.start - area_rows.start).max(0);
    let margin_bottom = (area_rows.end - plot_rows.end).max(0);
    let mut chart = ChartBuilder::on(area)
        .margin_top(margin_top)
        .margin_bottom(margin_bottom)
        .margin_left(16)
        .margin_right(4)
        .right_y_label_area_size(BAR_AREA_WIDTH - 46)
        .build_cartesian_2d(0.0..1.0, y)
        .map_err(draw_error)?;
    chart
        .configure_mesh()
        .disable_mesh()
        .disable_x_axis()
        .set_tick_mark_size(LabelAreaPosition::Right, 5)
        .y_desc(plot.value_label.as_str())
        .y_labels(6)
        .label_style((FONT, TICK_SIZE))
        .axis_desc_style((FONT, AXIS_LABEL_SIZE))
        .draw()
        .map_err(draw_error)?;
    let bands = (0..BAR_STEPS).map(|i| {
        let (t0, t1) = (
            i as f64 / BAR_STEPS as f64,
            (i + 1) as f64 / BAR_STEPS as f64,
        );
        let [r, g, b] = scale.map((t0 + t1) / 2.0);
        let corners = [(0.0, scale.value_at(t0)), (1.0, scale.value_at(t1))];
        Rectangle::new(corners, RGBColor(r, g, b).filled())
    });
    chart.draw_series(bands).map_err(draw_error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::figures::tests::heatmap_figure;
    use crate::figures::{Plot, render_png, render_svg};

    /// The heatmap inside `heatmap_figure(n)`.
    fn plot(n: usize) -> HeatmapPlot {
        match heatmap_figure(n).plot {
            Plot::Heatmap(plot) => plot,
            Plot::Lines(_) | Plot::Bars(_) => unreachable!(),
        }
    }

    #[test]
    fn small_matrices_are_drawn_as_they_are() {
        let p = plot(5);
        let grid = Grid::from_plot(&p).unwrap();
        assert_eq!((grid.rows, grid.cols), (5, 5));
        assert!(grid.downsampling_note().is_none());
        for (a, b) in grid.values.iter().zip(&p.values) {
            assert!(a == b || (a.is_nan() && b.is_nan()));
        }
    }

    #[test]
    fn large_matrices_are_block_averaged() {
        let p = plot(300);
        let grid = Grid::from_plot(&p).unwrap();
        assert_eq!((grid.rows, grid.cols), (150, 150));
        assert_eq!(grid.block, (2, 2));
        // Rows 0–1 × cols 0–1: 1, NaN, 0.5, 0.5 → mean of the finite values.
        assert!((grid.values[0] - 2.0 / 3.0).abs() < 1e-12);
        // Rows 0–1 × cols 2–3 lie above the diagonal: empty.
        assert!(grid.values[1].is_nan());
    }

    #[test]
    fn equal_neighbours_share_a_rect() {
        let (a, b) = (RGBColor(1, 2, 3), RGBColor(4, 5, 6));
        let colours = [Some(a), Some(a), None, Some(a), Some(b), Some(b), Some(a)];
        assert_eq!(
            colour_runs(colours.into_iter()),
            [(0..2, a), (3..4, a), (4..6, b), (6..7, a)]
        );
    }

    #[test]
    fn large_heatmap_caption_says_it_was_downsampled() {
        let fig = heatmap_figure(300);
        let svg = render_svg(&fig).unwrap();
        assert!(svg.contains("(downsampled from 300×300)"));
        assert!(svg.contains("layer 0, head 0"));
        assert!(svg.len() < 2_000_000, "SVG is {} bytes", svg.len());
    }

    #[test]
    fn mismatched_values_are_an_error() {
        let mut p = plot(3);
        p.values.pop();
        let message = Grid::from_plot(&p).err().unwrap().to_string();
        assert!(
            message.contains("8 values") && message.contains("3×3"),
            "{message}"
        );
        p.rows = 0;
        assert!(Grid::from_plot(&p).is_err());
        p.rows = usize::MAX;
        assert!(Grid::from_plot(&p).is_err());
    }

    #[test]
    fn log_colour_handles_zeros_and_negatives() {
        let mut fig = heatmap_figure(4);
        let Plot::Heatmap(p) = &mut fig.plot else {
            unreachable!()
        };
        p.log_colour = true;
        p.values[0] = 0.0;
        p.values[5] = -1.0;
        let scale = ColourScale::spanning(&p.values, p);
        render_svg(&fig).unwrap();
        render_png(&fig).unwrap();
        assert_eq!(scale.colour(0.0), scale.colour(-1.0));
        assert_eq!(scale.colour(f64::NAN), None);
        let [r, g, b] = viridis(0.0);
        assert_eq!(scale.colour(-1.0), Some(RGBColor(r, g, b)));
    }

    #[test]
    fn constant_and_empty_matrices_render() {
        for value in [0.25, f64::NAN, f64::INFINITY] {
            let mut fig = heatmap_figure(3);
            let Plot::Heatmap(p) = &mut fig.plot else {
                unreachable!()
            };
            p.values = vec![value; 9];
            render_svg(&fig).unwrap();
        }
    }

    #[test]
    fn scale_spans_the_finite_values() {
        let mut p = plot(2);
        let scale = ColourScale::spanning(&[1.0, f64::NAN, 3.0, f64::INFINITY], &p);
        assert_eq!(scale.range, 1.0..3.0);
        assert_eq!(scale.colour(1.0), Some(RGBColor(0x44, 0x01, 0x54)));
        assert_eq!(scale.colour(3.0), Some(RGBColor(0xfd, 0xe7, 0x25)));
        p.log_colour = true;
        let log = ColourScale::spanning(&[0.01, 0.0, 1.0], &p);
        assert_eq!(log.range, -2.0..0.0);
        assert!((log.value_at(0.5) - 0.1).abs() < 1e-12);
    }

    /// A signed matrix spans −m..m, 0 white in the middle, whatever its own extremes.
    #[test]
    fn a_signed_scale_is_centred_on_zero() {
        let mut fig = heatmap_figure(3);
        let Plot::Heatmap(p) = &mut fig.plot else {
            unreachable!()
        };
        p.signed = true;
        p.log_colour = true; // ignored for a signed matrix
        p.values = vec![
            -0.5,
            f64::NAN,
            f64::NAN,
            0.25,
            2.0,
            f64::NAN,
            0.0,
            1.0,
            -1.0,
        ];
        let scale = ColourScale::spanning(&p.values, p);
        assert_eq!(scale.range, -2.0..2.0);
        let [r, g, b] = diverging(0.5);
        assert_eq!(scale.colour(0.0), Some(RGBColor(r, g, b)));
        let [r, g, b] = diverging(1.0);
        assert_eq!(scale.colour(2.0), Some(RGBColor(r, g, b)));
        render_svg(&fig).unwrap();
        render_png(&fig).unwrap();
    }
}
