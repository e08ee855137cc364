//! The sweep's Figure 1 (ReBased paper): accuracy against d_model, one figure per sequence length.

use super::SweepSummary;
use crate::figures::{Figure, LinePlot, Plot, Series};

/// Axis titles (x, y) of every panel, which the window's plots of them show too.
pub const ACCURACY_AXES: [&str; 2] = ["d_model (model width)", "best test accuracy"];

/// One figure per (sequence length, pairs) panel, in increasing length: a solid line per
/// mechanism through the mean at the best lr, and dashed lines in the same colour at mean ± std
/// (clipped to [0, 1]) standing in for error bars.
pub fn accuracy_panels(summary: &SweepSummary) -> Vec<((usize, usize), Figure)> {
    let mut panels: Vec<(usize, usize)> = summary
        .points
        .iter()
        .map(|p| (p.seq_len, p.num_kv_pairs))
        .collect();
    panels.sort();
    panels.dedup();
    panels
        .into_iter()
        .map(|(seq_len, pairs)| {
            let points: Vec<_> = summary
                .points
                .iter()
                .filter(|p| (p.seq_len, p.num_kv_pairs) == (seq_len, pairs))
                .collect();
            let mut mechanisms: Vec<&str> = points.iter().map(|p| p.mechanism.as_str()).collect();
            mechanisms.dedup();
            let series = mechanisms
                .iter()
                .flat_map(|&m| {
                    let mine: Vec<_> = points.iter().filter(|p| p.mechanism == m).collect();
                    let line = |name: String, offset: f64, dashed: bool| Series {
                        name,
                        points: mine
                            .iter()
                            .map(|p| {
                                let y = (p.mean + offset * p.std).clamp(0.0, 1.0);
                                (p.d_model as f64, y)
                            })
                            .collect(),
                        dashed,
                    };
                    [
                        line(m.to_string(), 0.0, false),
                        line(String::new(), 1.0, true),
                        line(String::new(), -1.0, true),
                    ]
                })
                .collect();
            let figure = Figure {
                title: format!("MQAR accuracy, length {seq_len}, {pairs} pairs"),
                caption: Some(
                    "best test accuracy of each run; per point the lr with the highest mean over \
                     seeds, mean over seeds with ± sample std (dashed, clipped to [0, 1])"
                        .into(),
                ),
                plot: Plot::Lines(LinePlot {
                    x_label: ACCURACY_AXES[0].into(),
                    y_label: ACCURACY_AXES[1].into(),
                    x_log: true,
                    y_log: false,
                    series,
                }),
            };
            ((seq_len, pairs), figure)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::SummaryPoint;

    #[test]
    fn each_panel_names_its_axes() {
        let point = SummaryPoint {
            mechanism: "softmax".into(),
            seq_len: 64,
            num_kv_pairs: 4,
            d_model: 32,
            best_lr: 1e-3,
            mean: 0.9,
            std: 0.05,
            seeds: 2,
            state_zoology: None,
            by_lr: vec![(1e-3, 0.9, 2)],
        };
        let summary = SweepSummary {
            points: vec![point],
            ..SweepSummary::default()
        };
        let panels = accuracy_panels(&summary);
        assert_eq!(panels.len(), 1);
        assert_eq!(panels[0].1.axes(), ACCURACY_AXES);
    }
}
