//! The training curves as figures: loss, test accuracy and learning rate against the step, one
//! series per run, so the window's plots and their exports say the same thing.

use serde::Serialize;

use super::{EvalRecord, StepRecord};
use crate::figures::{Figure, LinePlot, Plot, Series};

/// The x axis of every training curve.
pub const STEP_AXIS: &str = "step (optimiser updates)";

/// One curve of a run's metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Curve {
    Loss,
    Accuracy,
    LearningRate,
}

/// One run's metrics, as a curve's series reads them.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct RunCurves<'a> {
    pub name: &'a str,
    pub steps: &'a [StepRecord],
    pub evals: &'a [EvalRecord],
    /// The palette colour of the run's curves where the caller fixes one (the window: the
    /// run's place in its list, kept as other runs are ticked); `None`: its place here.
    #[serde(skip)]
    pub colour: Option<usize>,
}

impl Curve {
    pub const ALL: [Curve; 3] = [Curve::Loss, Curve::Accuracy, Curve::LearningRate];

    /// The curve's name, also its plot's heading.
    pub fn label(self) -> &'static str {
        match self {
            Curve::Loss => "training loss",
            Curve::Accuracy => "test accuracy",
            Curve::LearningRate => "learning rate",
        }
    }

    /// The y axis title, with the unit: what a number on the axis means.
    pub fn y_axis(self) -> &'static str {
        match self {
            Curve::Loss => "training loss (cross-entropy, nats)",
            Curve::Accuracy => "test accuracy (fraction exact)",
            Curve::LearningRate => "learning rate",
        }
    }

    /// The run's points of this curve, (step, value).
    pub fn points(self, run: &RunCurves) -> Vec<(f64, f64)> {
        match self {
            Curve::Loss => run
                .steps
                .iter()
                .map(|s| (s.step as f64, f64::from(s.loss)))
                .collect(),
            Curve::Accuracy => run
                .evals
                .iter()
                .map(|e| (e.step as f64, e.accuracy))
                .collect(),
            Curve::LearningRate => run.steps.iter().map(|s| (s.step as f64, s.lr)).collect(),
        }
    }

    /// This curve of every run in `runs`, one series each; loss on a log axis, where its
    /// early fall and late plateau both show.
    pub fn figure(self, title: String, caption: String, runs: &[RunCurves]) -> Figure {
        Figure {
            title,
            caption: Some(caption),
            plot: Plot::Lines(LinePlot {
                x_label: STEP_AXIS.into(),
                y_label: self.y_axis().into(),
                x_log: false,
                y_log: self == Curve::Loss,
                series: runs
                    .iter()
                    .map(|run| Series {
                        name: run.name.to_string(),
                        points: self.points(run),
                        dashed: false,
                        colour: run.colour,
                    })
                    .collect(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_curve_names_its_axes_and_keeps_each_runs_points() {
        let steps = [StepRecord {
            step: 1,
            epoch: 0.1,
            loss: 2.0,
            lr: 1e-3,
            grad_norm: 1.0,
            tokens_per_s: 10.0,
            elapsed_secs: 0.1,
        }];
        let evals = [EvalRecord {
            step: 1,
            epoch: 0.1,
            accuracy: 0.5,
            macro_accuracy: None,
            loss: 1.0,
            elapsed_secs: 0.2,
        }];
        let run = RunCurves {
            name: "a",
            steps: &steps,
            evals: &evals,
            colour: None,
        };
        for (curve, y) in Curve::ALL.into_iter().zip([2.0, 0.5, 1e-3]) {
            let fig = curve.figure("t".into(), "c".into(), &[run, run]);
            let Plot::Lines(plot) = fig.plot else {
                panic!("a line plot")
            };
            assert_eq!(plot.x_label, STEP_AXIS);
            assert_eq!(plot.y_label, curve.y_axis());
            assert!(plot.y_label.starts_with(curve.label()));
            assert_eq!(plot.series.len(), 2);
            assert_eq!(plot.series[1].points, vec![(1.0, y)]);
        }
    }
}
