//! The sweep's figures: the ReBased paper's Figure 1 (accuracy against d_model, one figure
//! per sequence length), the Based paper's Figure 2 (accuracy against the recurrent state,
//! the recall-vs-state frontier) and MAD's per-task scores beside the published ones.

use super::mad::{AVERAGE, MadScore, published, rule};
use super::{SummaryPoint, SweepSummary};
use crate::figures::{BarPlot, BarSeries, Figure, LinePlot, Plot, Series};
use crate::tasks::mad::Probe;

/// Axis titles (x, y) of the MAD score figure.
pub const MAD_AXES: [&str; 2] = ["MAD task", "MAD score (last test accuracy)"];

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
                        colour: None,
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
                        colour: None,
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
                    colour: None,
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

/// MAD's score per probe (groups, in MAD's order, then the average over the six where a
/// mechanism has them) and mechanism (bars), each mechanism's published row beside it where
/// the DeltaNet paper's table has one; `None` without MAD runs.
/// The caption gives the epoch scale: below 1 the scores are not MAD's protocol.
pub fn mad_figure(summary: &SweepSummary) -> Option<Figure> {
    let scores = &summary.mad;
    let probes: Vec<&str> = (Probe::ALL.iter().map(|p| p.name()))
        .chain([AVERAGE])
        .filter(|p| scores.iter().any(|s| s.probe == *p))
        .collect();
    let mut mechanisms: Vec<&str> = scores.iter().map(|s| s.mechanism.as_str()).collect();
    mechanisms.sort_unstable();
    mechanisms.dedup();
    let score = |mechanism: &str, probe: &str| {
        scores
            .iter()
            .find(|s| s.mechanism == mechanism && s.probe == probe)
            .map_or(f64::NAN, |s| s.score)
    };
    let mut series = Vec::new();
    for mechanism in mechanisms {
        series.push(BarSeries {
            name: format!("{mechanism} (attnlab)"),
            values: probes.iter().map(|p| score(mechanism, p)).collect(),
            errors: None,
        });
        let rows: Vec<_> = probes.iter().map(|p| published(mechanism, p)).collect();
        if let Some((model, _)) = rows.iter().flatten().next() {
            series.push(BarSeries {
                name: format!("{model} (Yang et al. 2024)"),
                values: rows
                    .iter()
                    .map(|r| r.map_or(f64::NAN, |(_, s)| s))
                    .collect(),
                errors: None,
            });
        }
    }
    (!probes.is_empty()).then(|| Figure {
        title: "MAD score per task".into(),
        caption: Some(mad_caption(scores)),
        plot: Plot::Bars(BarPlot {
            x_label: MAD_AXES[0].into(),
            y_label: MAD_AXES[1].into(),
            groups: probes.iter().map(|p| p.to_string()).collect(),
            series,
        }),
    })
}

/// How the scores were made: MAD's rule over how many runs, the epoch scale and the metric.
fn mad_caption(scores: &[MadScore]) -> String {
    let scale = scores.iter().map(|s| s.epoch_scale).fold(0.0, f64::max);
    let metric = match scores.iter().all(|s| s.macro_metric) {
        true => "macro accuracy",
        false => "some runs scored micro accuracy, not MAD's macro",
    };
    format!(
        "{}, mean over settings; {metric}; EPOCH SCALE {scale} of MAD's 200 epochs{}; \
         published: DeltaNet paper's table",
        rule(scores),
        if scale < 1.0 {
            " (not MAD's protocol)"
        } else {
            ""
        }
    )
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

    fn mad_score(mechanism: &str, probe: &str, score: f64) -> MadScore {
        MadScore {
            mechanism: mechanism.into(),
            probe: probe.into(),
            score,
            settings: 1,
            runs: 6,
            fewest_runs: 6,
            epoch_scale: 0.05,
            macro_metric: true,
        }
    }

    /// Tasks in MAD's order, a bar per mechanism with its published row beside it where the
    /// table has one (none for ReBased), a missing score as NaN, the epoch scale in words.
    #[test]
    fn the_mad_figure_puts_the_published_rows_beside_ours() {
        assert!(mad_figure(&SweepSummary::default()).is_none());
        let summary = SweepSummary {
            mad: vec![
                mad_score("rebased", "memorization", 0.4),
                mad_score("softmax", "memorization", 0.8),
                mad_score("softmax", "in-context-recall", 0.9),
            ],
            ..SweepSummary::default()
        };
        let figure = mad_figure(&summary).unwrap();
        assert_eq!(figure.axes(), MAD_AXES);
        let caption = figure.caption.unwrap();
        assert!(caption.contains("EPOCH SCALE 0.05"), "{caption}");
        assert!(caption.starts_with(&rule(&summary.mad)), "{caption}");
        let Plot::Bars(bars) = figure.plot else {
            panic!("bars")
        };
        assert_eq!(bars.groups, ["in-context-recall", "memorization"]);
        let names: Vec<&str> = bars.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "rebased (attnlab)",
                "softmax (attnlab)",
                "Transformer (Yang et al. 2024)"
            ]
        );
        assert!(bars.series[0].values[0].is_nan());
        assert_eq!(bars.series[0].values[1], 0.4);
        assert_eq!(bars.series[2].values, [0.941, 0.852]);

        // A mechanism's average over the six is the last group, the published "Avg" beside it.
        let mut summary = summary;
        summary.mad.push(mad_score("softmax", AVERAGE, 0.5));
        let Plot::Bars(bars) = mad_figure(&summary).unwrap().plot else {
            panic!("bars")
        };
        assert_eq!(bars.groups, ["in-context-recall", "memorization", AVERAGE]);
        assert_eq!(bars.series[1].values[2], 0.5);
        assert_eq!(bars.series[2].values[2], 0.745);
    }
}
