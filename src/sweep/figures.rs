//! The sweep's figures: the ReBased paper's Figure 1 (accuracy against d_model, one figure
//! per sequence length) and the Based paper's Figure 2 (accuracy against the recurrent state,
//! the recall-vs-state frontier).

use super::{SummaryPoint, SweepSummary};
use crate::figures::{Figure, LinePlot, Plot, Series};

/// Axis titles (x, y) of every panel, which the window's plots of them show too.
pub const ACCURACY_AXES: [&str; 2] = ["d_model (model width)", "best test accuracy"];

/// Axis titles (x, y) of the frontier.
pub const FRONTIER_AXES: [&str; 2] = [
    "recurrent state (zoology units: 4 x floats)",
    "best test accuracy",
];

/// The accuracy a mixer must reach to count as recalling (zoology's and the Based paper's
/// 99 %).
const RECALLS: f64 = 0.99;

/// The points of each (sequence length, pairs) panel, in increasing length.
fn panels(summary: &SweepSummary) -> Vec<((usize, usize), Vec<&SummaryPoint>)> {
    let mut panels: Vec<(usize, usize)> = summary
        .points
        .iter()
        .map(|p| (p.seq_len, p.num_kv_pairs))
        .collect();
    panels.sort();
    panels.dedup();
    panels
        .into_iter()
        .map(|panel| {
            let points = summary
                .points
                .iter()
                .filter(|p| (p.seq_len, p.num_kv_pairs) == panel)
                .collect();
            (panel, points)
        })
        .collect()
}

/// The mechanisms of `points`, in their order.
fn mechanisms<'a>(points: &[&'a SummaryPoint]) -> Vec<&'a str> {
    let mut mechanisms: Vec<&str> = points.iter().map(|p| p.mechanism.as_str()).collect();
    mechanisms.dedup();
    mechanisms
}

/// One figure per (sequence length, pairs) panel, in increasing length: a solid line per
/// mechanism through the mean at the best lr, and dashed lines in the same colour at mean ± std
/// (clipped to [0, 1]) standing in for error bars.
pub fn accuracy_panels(summary: &SweepSummary) -> Vec<((usize, usize), Figure)> {
    panels(summary)
        .into_iter()
        .map(|((seq_len, pairs), points)| {
            let series = mechanisms(&points)
                .into_iter()
                .flat_map(|m| {
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

/// The recall-vs-state frontier of each (sequence length, pairs) panel with a state to plot
/// (the Based paper's Figure 2): per mechanism its points' best-lr mean accuracy against the
/// model's recurrent state on a log axis, and a dashed vertical line at the smallest state
/// that reaches 99 %. Points without a state (Linformer) are left out.
pub fn frontier_panels(summary: &SweepSummary) -> Vec<((usize, usize), Figure)> {
    panels(summary)
        .into_iter()
        .filter_map(|((seq_len, pairs), points)| {
            let points: Vec<&SummaryPoint> = points
                .into_iter()
                .filter(|p| p.state_zoology.is_some())
                .collect();
            let state = |p: &SummaryPoint| p.state_zoology.unwrap_or(0) as f64;
            let mut series: Vec<Series> = mechanisms(&points)
                .into_iter()
                .map(|m| {
                    let mut mine: Vec<(f64, f64)> = points
                        .iter()
                        .filter(|p| p.mechanism == m)
                        .map(|p| (state(p), p.mean))
                        .collect();
                    mine.sort_by(|a, b| a.0.total_cmp(&b.0));
                    Series {
                        name: m.to_string(),
                        points: mine,
                        dashed: false,
                    }
                })
                .collect();
            if series.is_empty() {
                return None;
            }
            let smallest = points
                .iter()
                .filter(|p| p.mean >= RECALLS)
                .map(|p| state(p))
                .min_by(f64::total_cmp);
            if let Some(x) = smallest {
                series.push(Series {
                    name: format!("smallest state at 99 %: {x}"),
                    points: vec![(x, 0.0), (x, 1.0)],
                    dashed: true,
                });
            }
            let figure = Figure {
                title: format!("Recall against state, length {seq_len}, {pairs} pairs"),
                caption: Some(
                    "best-lr mean test accuracy over seeds against the model's recurrent state \
                     at the task's length, in zoology's units (4 x the sum of its per-mixer \
                     formulas); dashed: the smallest state reaching 99 %"
                        .into(),
                ),
                plot: Plot::Lines(LinePlot {
                    x_label: FRONTIER_AXES[0].into(),
                    y_label: FRONTIER_AXES[1].into(),
                    x_log: true,
                    y_log: false,
                    series,
                }),
            };
            Some(((seq_len, pairs), figure))
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

    fn point(mechanism: &str, d_model: usize, mean: f64, state: Option<usize>) -> SummaryPoint {
        SummaryPoint {
            mechanism: mechanism.into(),
            seq_len: 64,
            num_kv_pairs: 4,
            d_model,
            best_lr: 1e-3,
            mean,
            std: 0.0,
            seeds: 1,
            state_zoology: state,
            by_lr: vec![(1e-3, mean, 1)],
        }
    }

    /// Accuracy against state on a log axis, a line per mechanism in increasing state, the
    /// smallest state at 99 % marked, points without a state left out.
    #[test]
    fn the_frontier_marks_the_smallest_state_that_recalls() {
        let summary = SweepSummary {
            points: vec![
                point("based", 64, 0.995, Some(40_000)),
                point("based", 32, 0.6, Some(20_000)),
                point("softmax", 32, 0.999, Some(90_000)),
                point("linformer-k16", 32, 1.0, None),
            ],
            ..SweepSummary::default()
        };
        let panels = frontier_panels(&summary);
        assert_eq!(panels.len(), 1);
        let Plot::Lines(lines) = &panels[0].1.plot else {
            panic!("a line plot")
        };
        assert!(lines.x_log && !lines.y_log);
        let names: Vec<&str> = lines.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names[..2], ["based", "softmax"]);
        assert_eq!(lines.series[0].points, [(20_000.0, 0.6), (40_000.0, 0.995)]);
        let marker = &lines.series[2];
        assert!(marker.dashed && marker.name.contains("40000"), "{marker:?}");
        assert_eq!(marker.points, [(40_000.0, 0.0), (40_000.0, 1.0)]);
    }
}
