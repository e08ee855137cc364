//! Figures as tidy CSV: one observation per row, ready for pandas, R or a spreadsheet.
//!
//! The CSV holds the figure's full data (heatmaps are not downsampled, points the picture leaves
//! out are kept), so nothing is lost by exporting it.

use std::fmt::Write;

use super::{BarPlot, Figure, HeatmapPlot, LinePlot, Plot};

/// `fig`'s data as CSV: `series,x,y` for line plots, `row,col,value` for heatmaps (empty NaN
/// cells are left out), `group,series,value,error` for bars (missing values kept as NaN, the
/// error empty when the series has none).
pub fn render_csv(fig: &Figure) -> String {
    match &fig.plot {
        Plot::Lines(plot) => lines_csv(plot),
        Plot::Heatmap(plot) => heatmap_csv(plot),
        Plot::Bars(plot) => bars_csv(plot),
    }
}

/// One `series,x,y` row per point, in series order.
fn lines_csv(plot: &LinePlot) -> String {
    let mut out = String::from("series,x,y\n");
    for series in &plot.series {
        let name = quoted(&series.name);
        for (x, y) in &series.points {
            // Writing to a String cannot fail.
            let _ = writeln!(out, "{name},{x},{y}");
        }
    }
    out
}

/// One `row,col,value` row per non-NaN cell, row-major.
fn heatmap_csv(plot: &HeatmapPlot) -> String {
    let mut out = String::from("row,col,value\n");
    let cells = plot
        .values
        .iter()
        .take(plot.rows.saturating_mul(plot.cols))
        .enumerate();
    for (i, value) in cells.filter(|(_, v)| !v.is_nan()) {
        let _ = writeln!(out, "{},{},{value}", i / plot.cols, i % plot.cols);
    }
    out
}

/// One `group,series,value,error` row per group and series, group by group.
fn bars_csv(plot: &BarPlot) -> String {
    let mut out = String::from("group,series,value,error\n");
    for (g, group) in plot.groups.iter().enumerate() {
        let group = quoted(group);
        for series in &plot.series {
            let value = series.values.get(g).map_or(f64::NAN, |v| *v);
            let error = series.errors.as_ref().and_then(|e| e.get(g));
            let error = error.map_or(String::new(), f64::to_string);
            let _ = writeln!(out, "{group},{},{value},{error}", quoted(&series.name));
        }
    }
    out
}

/// `field` as a CSV field: quoted (with quotes doubled) when it holds a comma, quote or newline.
fn quoted(field: &str) -> String {
    if field.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", field.replace('"', "\"\""))
    } else {
        field.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::figures::tests::{bars_figure, heatmap_figure, lines_figure};

    #[test]
    fn lines_are_tidy_rows() {
        assert_eq!(
            render_csv(&lines_figure()),
            "series,x,y\n\
             softmax,0,0.1\nsoftmax,100,0.5\nsoftmax,200,0.9\n\
             linear,0,0.1\nlinear,200,0.4\n"
        );
    }

    #[test]
    fn heatmap_skips_empty_cells() {
        assert_eq!(
            render_csv(&heatmap_figure(2)),
            "row,col,value\n0,0,1\n1,0,0.5\n1,1,0.5\n"
        );
    }

    #[test]
    fn bars_are_a_row_per_group_and_series_with_missing_values_kept() {
        let mut fig = bars_figure();
        let Plot::Bars(plot) = &mut fig.plot else {
            unreachable!()
        };
        plot.series[1].values[2] = f64::NAN;
        assert_eq!(
            render_csv(&fig),
            "group,series,value,error\n\
             softmax,hard IoU,0.9,0.05\nsoftmax,soft IoU,0.6,\n\
             linear,hard IoU,0.5,0.1\nlinear,soft IoU,0.4,\n\
             based,hard IoU,0.7,0\nbased,soft IoU,NaN,\n"
        );
    }

    #[test]
    fn awkward_names_are_quoted_and_non_finite_values_kept() {
        let mut fig = lines_figure();
        let Plot::Lines(plot) = &mut fig.plot else {
            unreachable!()
        };
        plot.series.truncate(1);
        plot.series[0].name = "rope, \"base\" 10k".into();
        plot.series[0].points = vec![(1.0, f64::NAN), (2.0, f64::INFINITY)];
        assert_eq!(
            render_csv(&fig),
            "series,x,y\n\"rope, \"\"base\"\" 10k\",1,NaN\n\"rope, \"\"base\"\" 10k\",2,inf\n"
        );
    }
}
