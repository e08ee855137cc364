//! Figures as SVG, drawn with plotters: the title on top, the plot, the caption underneath.
//!
//! Text stays `<text>` in DejaVu Sans (with a sans-serif fallback for browsers); the PNG renderer
//! embeds that font, so both outputs set text the same way.

use plotters::coord::Shift;
use plotters::prelude::*;

use super::heatmap::Grid;
use super::{Figure, Plot, bars, heatmap, lines};
use crate::{Error, Result};

/// The font family of all text; the PNG renderer embeds DejaVu Sans.
pub(super) const FONT: &str = "DejaVu Sans, sans-serif";

/// Font sizes in plotters units (the SVG's font-size is these / 1.24).
pub(super) const TITLE_SIZE: f64 = 26.0;
pub(super) const AXIS_LABEL_SIZE: f64 = 20.0;
pub(super) const TICK_SIZE: f64 = 17.0;
const CAPTION_SIZE: f64 = 17.0;

/// Line and bar plots are landscape; heatmaps are close to square so their cells are.
const LINES_SIZE: (u32, u32) = (1000, 650);
const HEATMAP_SIZE: (u32, u32) = (860, 760);

/// Height of one caption line, and the caption's padding above and below, in pixels.
const CAPTION_LINE: u32 = 20;
const CAPTION_PAD: u32 = 10;

/// The most caption lines shown; a longer caption is cut with "…" so the plot keeps its room.
const MAX_CAPTION_LINES: usize = 5;

/// The drawing area every part of a figure is drawn on.
pub(super) type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// `fig` as an SVG document.
pub fn render_svg(fig: &Figure) -> Result<String> {
    let mut svg = String::new();
    match &fig.plot {
        Plot::Lines(plot) => {
            let area = framed_area(&mut svg, LINES_SIZE, fig, None)?;
            lines::draw(&area, plot)?;
            area.present().map_err(draw_error)?;
        }
        Plot::Heatmap(plot) => {
            let grid = Grid::from_plot(plot)?;
            let area = framed_area(&mut svg, HEATMAP_SIZE, fig, grid.downsampling_note())?;
            heatmap::draw(&area, plot, &grid)?;
            area.present().map_err(draw_error)?;
        }
        Plot::Bars(plot) => {
            bars::validate(plot)?;
            let area = framed_area(&mut svg, LINES_SIZE, fig, None)?;
            bars::draw(&area, plot)?;
            area.present().map_err(draw_error)?;
        }
    }
    Ok(svg)
}

/// A white canvas of `size` with `fig`'s title and caption (plus `note`, if any) drawn, and the
/// area between them returned for the plot.
fn framed_area<'a>(
    svg: &'a mut String,
    size: (u32, u32),
    fig: &Figure,
    note: Option<String>,
) -> Result<Area<'a>> {
    let root = SVGBackend::with_string(svg, size).into_drawing_area();
    root.fill(&WHITE).map_err(draw_error)?;
    let body = root
        .titled(&fig.title, (FONT, TITLE_SIZE))
        .map_err(draw_error)?;
    let caption = [fig.caption.clone(), note]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(" ");
    let caption_lines = shortened(
        wrapped(&caption, max_caption_chars(size.0)),
        MAX_CAPTION_LINES,
    );
    if caption_lines.is_empty() {
        return Ok(body);
    }
    let caption_height = caption_lines.len() as u32 * CAPTION_LINE + 2 * CAPTION_PAD;
    let (plot, caption_area) = body.split_vertically(body.dim_in_pixel().1 - caption_height);
    let style = TextStyle::from((FONT, CAPTION_SIZE)).color(&RGBColor(60, 60, 60));
    for (i, line) in caption_lines.iter().enumerate() {
        let y = (CAPTION_PAD + i as u32 * CAPTION_LINE) as i32;
        caption_area
            .draw_text(line, &style, (CAPTION_PAD as i32 + 6, y))
            .map_err(draw_error)?;
    }
    Ok(plot)
}

/// How many caption characters fit on a line of a figure `width` pixels wide.
fn max_caption_chars(width: u32) -> usize {
    // DejaVu Sans averages about 0.55 em per character; the caption's em is CAPTION_SIZE / 1.24.
    let char_width = 0.55 * CAPTION_SIZE / 1.24;
    ((f64::from(width) - 4.0 * f64::from(CAPTION_PAD)) / char_width) as usize
}

/// `text` broken into lines of at most `max_chars` characters at spaces (a longer word gets a line
/// of its own).
fn wrapped(text: &str, max_chars: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in text.split_whitespace() {
        match lines.last_mut() {
            Some(line) if line.chars().count() + 1 + word.chars().count() <= max_chars => {
                line.push(' ');
                line.push_str(word);
            }
            _ => lines.push(word.to_owned()),
        }
    }
    lines
}

/// The first `max_lines` of `lines`, the last of them marked "…" when some were cut.
fn shortened(mut lines: Vec<String>, max_lines: usize) -> Vec<String> {
    if lines.len() > max_lines {
        lines.truncate(max_lines);
        if let Some(last) = lines.last_mut() {
            last.push_str(" …");
        }
    }
    lines
}

/// A plotters error as ours.
pub(super) fn draw_error(e: impl std::fmt::Display) -> Error {
    Error::Figure(format!("cannot draw figure: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::figures::tests::{heatmap_figure, lines_figure};

    #[test]
    fn lines_svg_has_title_names_caption_and_paths() {
        let svg = render_svg(&lines_figure()).unwrap();
        for text in [
            "Test accuracy",
            "softmax",
            "linear",
            "MQAR, 4 KV pairs",
            "step",
        ] {
            assert!(svg.contains(text), "missing {text}");
        }
        assert!(svg.contains("<polyline") || svg.contains("<path"));
        assert!(svg.contains("DejaVu Sans"));
    }

    #[test]
    fn heatmap_svg_has_cells_and_labels() {
        let svg = render_svg(&heatmap_figure(4)).unwrap();
        for text in [
            "Attention weights",
            "key position",
            "query position",
            "weight",
        ] {
            assert!(svg.contains(text), "missing {text}");
        }
        assert!(!svg.contains("downsampled"));
    }

    #[test]
    fn long_captions_wrap_at_spaces() {
        let lines = wrapped("aa bb cc dddddd e", 5);
        assert_eq!(lines, ["aa bb", "cc", "dddddd", "e"]);
        assert!(wrapped("  ", 5).is_empty());
        let cut = shortened(lines, 2);
        assert_eq!(cut, ["aa bb", "cc …"]);
    }

    #[test]
    fn very_long_captions_are_cut() {
        let mut fig = lines_figure();
        fig.caption = Some("word ".repeat(2000));
        let svg = render_svg(&fig).unwrap();
        assert_eq!(svg.matches(" …").count(), 1);
        assert!(svg.len() < 100_000);
    }
}
