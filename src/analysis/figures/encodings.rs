//! The figures of the encoding analyses ("Exploring Transformer Extrapolation", Figs. 5–8):
//! TRF/ERF curves on the paper's axes, exp(bias) by distance, the exp(bias) heatmap, and
//! RoPE's long-range decay for the rotary encodings.

use crate::figures::{Figure, HeatmapPlot, LinePlot, Plot, QUERY_KEY_AXES, Series};

/// Axis titles (x, y) of each figure, which the window's plots of them show too.
pub const TRF_AXES: [&str; 2] = ["ε", "receptive field / m"];
pub const EXP_BIAS_AXES: [&str; 2] = ["distance t (tokens)", "exp(bias)"];
pub const DECAY_AXES: [&str; 2] = ["distance t (tokens)", "relative upper bound of |q·k|"];

/// A named curve.
pub struct Curve<'a> {
    pub name: &'a str,
    pub points: Vec<(f64, f64)>,
    pub dashed: bool,
}

fn lines(
    title: String,
    caption: String,
    axes: [&str; 2],
    logs: [bool; 2],
    curves: Vec<Curve<'_>>,
) -> Figure {
    Figure {
        title,
        caption: Some(caption),
        plot: Plot::Lines(LinePlot {
            x_label: axes[0].into(),
            y_label: axes[1].into(),
            x_log: logs[0],
            y_log: logs[1],
            series: curves
                .into_iter()
                .map(|c| Series {
                    name: c.name.into(),
                    points: c.points,
                    dashed: c.dashed,
                    colour: None,
                })
                .collect(),
        }),
    }
}

/// TRF (and ERF) curves: ε against the receptive field normalised by the length, the axes of
/// the paper's draw() routine.
pub fn receptive_field(
    title: &str,
    length: usize,
    curves: Vec<Curve<'_>>,
    protocol: &str,
) -> Figure {
    lines(
        title.into(),
        format!(
            "m = {length}; draw(): smallest j with mass(t < j) >= (1 - eps) mass(t < m); {protocol}"
        ),
        TRF_AXES,
        [false, false],
        curves,
    )
}

/// exp(bias) against distance on log–log axes, where power laws are straight lines.
pub fn exp_bias(length: usize, curves: Vec<Curve<'_>>, heads: &str) -> Figure {
    lines(
        "exp(bias) by distance".into(),
        format!("distances 1..{length}; {heads}; distance 0 is off the log axis"),
        EXP_BIAS_AXES,
        [true, true],
        curves,
    )
}

/// RoPE's content-free decay bound against distance (RoFormer §3.4.3): what rotary
/// encodings show in place of a TRF, which the paper does not define for them.
pub fn rotary_decay(length: usize, curves: Vec<Curve<'_>>) -> Figure {
    lines(
        "Rotary long-range decay (content-free; not a TRF)".into(),
        format!(
            "(2/d) sum_j |sum_{{i<j}} exp(i t theta_i)| at the variant's relative position, t = 1..{length}"
        ),
        DECAY_AXES,
        [true, false],
        curves,
    )
}

/// The n×n exp(bias) heatmap (the paper's Figures 7–8), NaN above the diagonal.
pub fn exp_bias_heatmap(label: &str, n: usize, values: Vec<f64>, heads: &str) -> Figure {
    Figure {
        title: format!("exp(bias): {label}"),
        caption: Some(format!("{n} x {n}, {heads}, causal (upper triangle empty)")),
        plot: Plot::Heatmap(HeatmapPlot {
            rows: n,
            cols: n,
            values,
            x_label: QUERY_KEY_AXES[0].into(),
            y_label: QUERY_KEY_AXES[1].into(),
            value_label: "exp(bias)".into(),
            log_colour: true,
            signed: false,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receptive_field_figure_carries_the_protocol_and_the_points() {
        let fig = receptive_field(
            "TRF",
            64,
            vec![Curve {
                name: "alibi",
                points: vec![(1.0, 0.0), (0.0, 1.0)],
                dashed: false,
            }],
            "mean over heads",
        );
        assert!(fig.caption.as_deref().unwrap_or("").contains("m = 64"));
        let Plot::Lines(plot) = &fig.plot else {
            panic!("a line plot")
        };
        assert_eq!(plot.series[0].points, vec![(1.0, 0.0), (0.0, 1.0)]);
        assert_eq!(fig.axes(), TRF_AXES);
    }

    #[test]
    fn exp_bias_decay_and_heatmap_figures_name_their_axes() {
        let curve = || {
            vec![Curve {
                name: "alibi",
                points: vec![(1.0, 0.5)],
                dashed: false,
            }]
        };
        assert_eq!(exp_bias(8, curve(), "mean").axes(), EXP_BIAS_AXES);
        assert_eq!(rotary_decay(8, curve()).axes(), DECAY_AXES);
        let heatmap = exp_bias_heatmap("alibi", 2, vec![1.0, f64::NAN, 0.5, 1.0], "mean");
        assert_eq!(heatmap.axes(), QUERY_KEY_AXES);
        let Plot::Heatmap(plot) = heatmap.plot else {
            panic!("a heatmap")
        };
        assert_eq!(plot.value_label, "exp(bias)");
    }
}
