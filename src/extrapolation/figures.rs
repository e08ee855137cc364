//! Perplexity against evaluation length (the Rpe paper's Figures 3–4), one curve per run and
//! per inference-time variant (dashed), on a log-scale length axis; the protocol is in the title.

use super::Extrapolation;
use crate::figures::{Figure, LinePlot, Plot, Series};

/// Axis titles (x, y) of the figure, which the window's plot of it shows too.
pub const PERPLEXITY_AXES: [&str; 2] = ["evaluation length n (tokens)", "validation perplexity"];

/// The perplexity-vs-length figure of a sweep; `log_ppl` puts perplexity on a log axis too.
pub fn perplexity_vs_length(sweep: &Extrapolation, log_ppl: bool) -> Figure {
    let series = sweep
        .curves
        .iter()
        .map(|curve| Series {
            name: curve.name.clone(),
            points: curve
                .points
                .iter()
                .map(|p| (p.length as f64, p.ppl.unwrap_or(f64::NAN)))
                .collect(),
            dashed: curve.inference.is_some(),
            colour: None,
        })
        .collect();
    Figure {
        title: format!(
            "Validation perplexity vs length ({} protocol)",
            sweep.protocol.name()
        ),
        caption: Some(format!(
            "trained at L = {}; {}; dashed: encoding changed at inference",
            sweep.train_length, sweep.protocol_description
        )),
        plot: Plot::Lines(LinePlot {
            x_label: PERPLEXITY_AXES[0].into(),
            y_label: PERPLEXITY_AXES[1].into(),
            x_log: true,
            y_log: log_ppl,
            series,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extrapolation::{Curve, LengthPoint, Protocol};

    #[test]
    fn the_figure_names_its_axes_and_keeps_missing_lengths() {
        let point = |length, ppl| LengthPoint {
            length,
            ppl,
            tokens: 10,
            secs: 0.1,
            peak_bytes: None,
            attention_block_bytes: 0,
            note: None,
        };
        let sweep = Extrapolation {
            protocol: Protocol::NonOverlapping,
            protocol_description: "windows side by side".into(),
            train_length: 8,
            lengths: vec![8, 16],
            delta_threshold: 0.1,
            ppl: Default::default(),
            delta: Default::default(),
            curves: vec![Curve {
                name: "alibi".into(),
                run: "r".into(),
                encoding: "alibi".into(),
                inference: None,
                points: vec![point(8, Some(3.0)), point(16, None)],
                delta: vec![Some(0.0), None],
                extrapolates: None,
                theorem: "converges".into(),
                theorem_evidence: String::new(),
                device_notice: None,
            }],
            left_out: Vec::new(),
        };
        let fig = perplexity_vs_length(&sweep, false);
        assert_eq!(fig.axes(), PERPLEXITY_AXES);
        let Plot::Lines(plot) = fig.plot else {
            panic!("a line plot")
        };
        assert!(plot.x_log && plot.series[0].points[1].1.is_nan());
    }
}
