//! The report of training runs: loss, test accuracy and learning rate against the step, one
//! series per run, read from the runs' records without copying them (the window builds it
//! every frame while a run trains).

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::json;

use super::{Report, Table};
use crate::encodings::EncodingSpec;
use crate::figures::Figure;
use crate::train::figures::{Curve, RunCurves};
use crate::train::run_dir::{RunDir, folder_name};
use crate::train::{EvalRecord, MetricRecord, StepRecord};
use crate::{Preset, Result};

/// Mechanism and encoding of `preset` as a run's caption names them: `softmax / rope`.
pub fn setup(preset: &Preset) -> String {
    format!("{} / {}", preset.attention.name(), preset.encoding.name())
}

/// A run folder's records, read for a [`TrainingReport`] (`attnlab curves`).
pub struct RecordedRun {
    /// The folder's name, which tells two runs of one preset apart.
    name: String,
    setup: String,
    steps: Vec<StepRecord>,
    evals: Vec<EvalRecord>,
}

impl RecordedRun {
    /// The records of run folder `dir`: its preset and `metrics.jsonl`.
    pub fn read(dir: &Path) -> Result<Self> {
        let run = RunDir::open(dir)?;
        let (steps, evals) = MetricRecord::split(run.read_metrics()?);
        Ok(Self {
            name: folder_name(dir),
            setup: setup(&run.read_preset()?),
            steps,
            evals,
        })
    }

    /// The run as a report's series.
    pub fn as_run(&self) -> TrainingRun<'_> {
        TrainingRun {
            curves: RunCurves {
                name: &self.name,
                steps: &self.steps,
                evals: &self.evals,
                colour: None,
            },
            setup: self.setup.clone(),
        }
    }
}

/// One run's records with what its caption says of it.
#[derive(Clone, Debug, Serialize)]
pub struct TrainingRun<'a> {
    #[serde(flatten)]
    pub curves: RunCurves<'a>,
    /// Mechanism and encoding, as `softmax / rope`.
    pub setup: String,
}

impl TrainingRun<'_> {
    fn last_step(&self) -> usize {
        self.curves.steps.last().map_or(0, |s| s.step)
    }

    fn best_accuracy(&self) -> Option<f64> {
        self.curves
            .evals
            .iter()
            .map(|e| e.accuracy)
            .reduce(f64::max)
    }
}

/// Training curves of several runs: the Training view's (the selected run and those ticked to
/// compare) and `attnlab curves`'s.
#[derive(Clone, Debug, Serialize)]
pub struct TrainingReport<'a> {
    pub runs: Vec<TrainingRun<'a>>,
}

impl TrainingReport<'_> {
    /// One curve of every run, titled by the run (or how many there are), the caption naming
    /// each run's setup and steps.
    pub fn figure(&self, which: Curve) -> Figure {
        let title = match self.runs.as_slice() {
            [one] => format!("{}: {}", one.curves.name, which.label()),
            many => format!("{}: {} runs", which.label(), many.len()),
        };
        let caption: Vec<String> = self
            .runs
            .iter()
            .map(|r| format!("{}: {}, {} steps", r.curves.name, r.setup, r.last_step()))
            .collect();
        let curves: Vec<RunCurves> = self.runs.iter().map(|r| r.curves).collect();
        which.figure(title, caption.join("; "), &curves)
    }
}

/// A curve's short name: its figure's suffix and its CSV key.
fn key(curve: Curve) -> &'static str {
    match curve {
        Curve::Loss => "loss",
        Curve::Accuracy => "accuracy",
        Curve::LearningRate => "lr",
    }
}

impl Report for TrainingReport<'_> {
    /// A line per run: its setup, steps, last training loss and best test accuracy.
    fn text(&self) -> Vec<String> {
        self.runs
            .iter()
            .map(|r| {
                let loss = r
                    .curves
                    .steps
                    .last()
                    .map_or("-".into(), |s| format!("{:.4}", s.loss));
                let best = r.best_accuracy().map_or("-".into(), |a| format!("{a:.4}"));
                format!(
                    "{}: {}, {} steps, last loss {loss}, best test accuracy {best}",
                    r.curves.name,
                    r.setup,
                    r.last_step()
                )
            })
            .collect()
    }

    /// The loss, then test accuracy as `NAME-accuracy` and learning rate as `NAME-lr`.
    fn figures(&self) -> Vec<(String, Figure)> {
        Curve::ALL
            .into_iter()
            .map(|curve| {
                let suffix = if curve == Curve::Loss { "" } else { key(curve) };
                (suffix.to_string(), self.figure(curve))
            })
            .collect()
    }

    /// One line per run, curve and point.
    fn csv(&self) -> String {
        let mut csv = String::from("run,curve,step,value\n");
        for r in &self.runs {
            for curve in Curve::ALL {
                for (step, value) in curve.points(&r.curves) {
                    csv.push_str(&format!(
                        "{},{},{step},{value}\n",
                        r.curves.name,
                        key(curve)
                    ));
                }
            }
        }
        csv
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Format, render};
    use crate::train::{EvalRecord, StepRecord};

    fn step(step: usize, loss: f32) -> StepRecord {
        StepRecord {
            step,
            epoch: 0.1,
            loss,
            lr: 1e-3,
            grad_norm: 1.0,
            tokens_per_s: 10.0,
            elapsed_secs: 0.1,
        }
    }

    #[test]
    fn a_run_has_a_line_three_figures_and_every_point_in_its_csv() {
        let steps = [step(1, 2.0), step(2, 1.5)];
        let evals = [EvalRecord {
            step: 2,
            epoch: 0.2,
            accuracy: 0.25,
            macro_accuracy: None,
            loss: 1.0,
            elapsed_secs: 0.2,
        }];
        let run = |name| TrainingRun {
            curves: RunCurves {
                name,
                steps: &steps,
                evals: &evals,
                colour: None,
            },
            setup: "softmax / rope".into(),
        };
        let report = TrainingReport {
            runs: vec![run("a")],
        };
        assert_eq!(
            report.text(),
            ["a: softmax / rope, 2 steps, last loss 1.5000, best test accuracy 0.2500"]
        );
        let figures = report.figures();
        let suffixes: Vec<&str> = figures.iter().map(|(s, _)| s.as_str()).collect();
        assert_eq!(suffixes, ["", "accuracy", "lr"]);
        assert_eq!(figures[0].1.title, "a: training loss");
        // 2 losses, 1 accuracy, 2 learning rates, and the header.
        assert_eq!(report.csv().lines().count(), 6);
        assert!(report.csv().contains("a,accuracy,2,0.25\n"));
        let json = render(&report, Format::Json).unwrap();
        assert!(json.contains("\"setup\": \"softmax / rope\""), "{json}");
        let two = TrainingReport {
            runs: vec![run("a"), run("b")],
        };
        assert_eq!(two.figure(Curve::Accuracy).title, "test accuracy: 2 runs");
    }
}

/// A run's checkpoint scored on its test split (`attnlab eval`), with the preset keys changed
/// for the evaluation.
#[derive(Clone, Debug, Serialize)]
pub struct EvalReport {
    pub run: PathBuf,
    /// The encoding evaluated (the run's, or what the overrides made it).
    pub encoding: EncodingSpec,
    pub overrides: Vec<String>,
    pub accuracy: f64,
    pub loss: f64,
}

impl EvalReport {
    fn table(&self) -> Table {
        let mut table = Table::new(&["run", "encoding", "overrides", "accuracy", "loss"]);
        table.push(vec![
            json!(self.run.display().to_string()),
            json!(self.encoding.name()),
            json!(self.overrides.join(" ")),
            json!(self.accuracy),
            json!(self.loss),
        ]);
        table
    }
}

impl Report for EvalReport {
    fn text(&self) -> Vec<String> {
        vec![format!(
            "{} with {}: test accuracy {:.2}%, loss {:.4}",
            self.run.display(),
            self.encoding.name(),
            100.0 * self.accuracy,
            self.loss
        )]
    }

    fn figures(&self) -> Vec<(String, Figure)> {
        Vec::new()
    }

    fn csv(&self) -> String {
        self.table().csv()
    }
}
