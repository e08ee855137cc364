//! Figures as data, rendered to SVG, PNG and CSV without a GPU.
//!
//! A [`Figure`] says *what* to plot (series, a matrix, labels, the protocol in the caption); the
//! renderers here decide *how*, once, so an exported SVG and an exported PNG always look the
//! same, and the window, which draws the same figures with egui, takes its series' colours, log
//! ticks, legend corner and drawable points from here ([`series_colours`], [`axis_ticks`],
//! [`legend_corner`], [`drawable_points`]) to look like them. The PNG is rasterised from the SVG (with an embedded font, so no system
//! fonts are needed), and the CSV holds the same numbers in tidy form for other tools.

mod axis;
mod bars;
mod colormap;
mod csv;
mod heatmap;
mod lines;
mod png;
mod svg;

use std::path::Path;

pub use axis::{axis_ticks, tick_label};
pub use colormap::{MISSING, diverging, viridis};
pub use csv::render_csv;
pub use lines::{
    Corner, PALETTE_SIZE, drawable_points, legend_corner, palette_colour, series_colours,
    series_groups,
};
pub use png::{heatmap_png, render_png};
pub use svg::render_svg;

use crate::{Error, Result};

/// The axes (x, y) of every query × key matrix: attention maps and exp(bias) heatmaps.
pub const QUERY_KEY_AXES: [&str; 2] = ["key position j", "query position i"];

/// A figure as data: what the GUI shows and what the CLI exports, rendered the same way everywhere.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    pub title: String,
    /// The protocol or settings behind the plot, printed under it so an exported figure carries
    /// how it was made.
    pub caption: Option<String>,
    pub plot: Plot,
}

impl Figure {
    /// The axis titles (x, y), whatever the plot: what the window's plot of the same data is
    /// titled with, and what tests check every figure has.
    pub fn axes(&self) -> [&str; 2] {
        let (x, y) = match &self.plot {
            Plot::Lines(p) => (&p.x_label, &p.y_label),
            Plot::Heatmap(p) => (&p.x_label, &p.y_label),
            Plot::Bars(p) => (&p.x_label, &p.y_label),
        };
        [x.as_str(), y.as_str()]
    }
}

/// What a figure draws.
#[derive(Debug, Clone, PartialEq)]
pub enum Plot {
    Lines(LinePlot),
    Heatmap(HeatmapPlot),
    Bars(BarPlot),
}

/// Curves over a shared pair of axes, each optionally logarithmic.
#[derive(Debug, Clone, PartialEq)]
pub struct LinePlot {
    pub x_label: String,
    pub y_label: String,
    pub x_log: bool,
    pub y_log: bool,
    pub series: Vec<Series>,
}

/// One named curve (an unnamed one is left out of the legend and drawn in the colour of the
/// series before it). Points that cannot be drawn (non-finite, or non-positive on a log axis) are
/// left out of the picture but kept in the CSV.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// Drawn dashed, e.g. for a reference or baseline curve.
    pub dashed: bool,
    /// The palette colour the caller fixes for this legend entry (read on its first series),
    /// e.g. the colour a run keeps in the window's run list, so that a curve keeps its colour
    /// when others are shown or hidden; `None`: the entry's place in the legend.
    pub colour: Option<usize>,
}

/// A matrix drawn as coloured cells, row 0 at the top (query rows down, key columns across).
#[derive(Debug, Clone, PartialEq)]
pub struct HeatmapPlot {
    pub rows: usize,
    pub cols: usize,
    /// Row-major, `rows × cols`; NaN marks an empty cell (e.g. above the causal diagonal).
    pub values: Vec<f64>,
    pub x_label: String,
    pub y_label: String,
    /// What the colour encodes, written beside the colour bar.
    pub value_label: String,
    /// Colour by log10 of the values, for matrices spanning orders of magnitude; values ≤ 0
    /// get the lowest colour.
    pub log_colour: bool,
    /// A signed matrix: the diverging map over a range centred on 0 (blue < 0 < red), which
    /// `log_colour` does not apply to.
    pub signed: bool,
}

/// Grouped bars: along x one group per category (e.g. a run), in each group one bar per series
/// (e.g. a measure), in the series' colour. The y axis starts at 0 (lower only for negative
/// values) so bar lengths compare.
#[derive(Debug, Clone, PartialEq)]
pub struct BarPlot {
    pub x_label: String,
    pub y_label: String,
    /// The categories along x, labelled under their groups.
    pub groups: Vec<String>,
    pub series: Vec<BarSeries>,
}

/// One measure across the groups. A NaN (or infinite) value is missing: no bar is drawn, but the
/// CSV keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct BarSeries {
    pub name: String,
    /// One per group.
    pub values: Vec<f64>,
    /// Half-lengths of ± error whiskers, one per group (NaN or 0: no whisker; never negative).
    pub errors: Option<Vec<f64>>,
}

/// A file format a figure can be saved in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Svg,
    Png,
    Csv,
}

impl Format {
    /// The format named by `path`'s extension (case-insensitive), so a user only has to name the
    /// output file.
    pub fn from_path(path: &Path) -> Result<Self> {
        let extension = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match extension.as_deref() {
            Some("svg") => Ok(Self::Svg),
            Some("png") => Ok(Self::Png),
            Some("csv") => Ok(Self::Csv),
            _ => Err(Error::Figure(format!(
                "cannot save a figure in this format: the file name must end in .svg, .png or .csv: {}",
                path.display()
            ))),
        }
    }
}

/// Renders `fig` in the format named by `path`'s extension and writes it atomically.
pub fn save(fig: &Figure, path: &Path) -> Result<()> {
    let bytes = match Format::from_path(path)? {
        Format::Svg => render_svg(fig)?.into_bytes(),
        Format::Png => render_png(fig)?,
        Format::Csv => render_csv(fig).into_bytes(),
    };
    crate::io::write_bytes(path, &bytes)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A two-series line figure, one series dashed.
    pub(crate) fn lines_figure() -> Figure {
        Figure {
            title: "Test accuracy".into(),
            caption: Some("MQAR, 4 KV pairs, seed 0".into()),
            plot: Plot::Lines(LinePlot {
                x_label: "step".into(),
                y_label: "accuracy".into(),
                x_log: false,
                y_log: false,
                series: vec![
                    Series {
                        name: "softmax".into(),
                        points: vec![(0.0, 0.1), (100.0, 0.5), (200.0, 0.9)],
                        dashed: false,
                        colour: None,
                    },
                    Series {
                        name: "linear".into(),
                        points: vec![(0.0, 0.1), (200.0, 0.4)],
                        dashed: true,
                        colour: None,
                    },
                ],
            }),
        }
    }

    /// A heatmap figure of a causal `n × n` pattern: NaN above the diagonal.
    pub(crate) fn heatmap_figure(n: usize) -> Figure {
        let values = (0..n * n)
            .map(|i| {
                let (r, c) = (i / n, i % n);
                if c > r {
                    f64::NAN
                } else {
                    1.0 / (r + 1) as f64
                }
            })
            .collect();
        Figure {
            title: "Attention weights".into(),
            caption: Some("layer 0, head 0".into()),
            plot: Plot::Heatmap(HeatmapPlot {
                rows: n,
                cols: n,
                values,
                x_label: "key position".into(),
                y_label: "query position".into(),
                value_label: "weight".into(),
                log_colour: false,
                signed: false,
            }),
        }
    }

    /// Hard and soft IoU of three runs, errors on the hard one only (the last one zero).
    pub(crate) fn bars_figure() -> Figure {
        Figure {
            title: "IoU".into(),
            caption: Some("argmax, 100 test rows".into()),
            plot: Plot::Bars(BarPlot {
                x_label: "run".into(),
                y_label: "IoU".into(),
                groups: vec!["softmax".into(), "linear".into(), "based".into()],
                series: vec![
                    BarSeries {
                        name: "hard IoU".into(),
                        values: vec![0.9, 0.5, 0.7],
                        errors: Some(vec![0.05, 0.1, 0.0]),
                    },
                    BarSeries {
                        name: "soft IoU".into(),
                        values: vec![0.6, 0.4, 0.55],
                        errors: None,
                    },
                ],
            }),
        }
    }

    #[test]
    fn format_follows_the_extension() {
        assert_eq!(
            Format::from_path(Path::new("a/b.svg")).unwrap(),
            Format::Svg
        );
        assert_eq!(Format::from_path(Path::new("b.PNG")).unwrap(), Format::Png);
        assert_eq!(Format::from_path(Path::new("b.csv")).unwrap(), Format::Csv);
    }

    #[test]
    fn unknown_extension_names_the_allowed_ones() {
        for name in ["fig.jpg", "fig"] {
            let message = Format::from_path(Path::new(name)).unwrap_err().to_string();
            assert!(message.contains(".svg, .png or .csv"), "{message}");
            assert!(message.ends_with(name), "{message}");
        }
    }

    #[test]
    fn save_writes_each_format() {
        let dir = tempfile::tempdir().unwrap();
        let fig = lines_figure();
        for name in ["f.svg", "f.png", "f.csv"] {
            let path = dir.path().join(name);
            save(&fig, &path).unwrap();
            assert!(std::fs::metadata(&path).unwrap().len() > 0, "{name}");
        }
        assert!(save(&fig, &dir.path().join("f.jpg")).is_err());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 3);
    }
}
