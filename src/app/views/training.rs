//! Loss, test accuracy and learning rate of the selected run, updated live.

use eframe::egui;
use egui_plot::{Legend, Line, Plot, PlotPoints};

use super::super::runs::RunView;
use super::{View, ViewContext};
use crate::figures::{Figure, LinePlot, Plot as FigPlot, Series};

/// One curve of a run as (x, y) points.
fn curve(run: &RunView, which: Curve) -> Vec<(f64, f64)> {
    match which {
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

#[derive(Clone, Copy)]
enum Curve {
    Loss,
    Accuracy,
    LearningRate,
}

impl Curve {
    fn label(self) -> &'static str {
        match self {
            Curve::Loss => "training loss",
            Curve::Accuracy => "test accuracy",
            Curve::LearningRate => "learning rate",
        }
    }
}

fn figure(run: &RunView, which: Curve) -> Figure {
    Figure {
        title: format!("{}: {}", run.name, which.label()),
        caption: Some(format!(
            "{} / {}, {} steps",
            run.preset.attention.name(),
            run.preset.encoding.name(),
            run.steps.last().map_or(0, |s| s.step)
        )),
        plot: FigPlot::Lines(LinePlot {
            x_label: "step".into(),
            y_label: which.label().into(),
            x_log: false,
            y_log: matches!(which, Curve::Loss),
            series: vec![Series {
                name: run.name.clone(),
                points: curve(run, which),
                dashed: false,
            }],
        }),
    }
}

/// The selected run's curves.
#[derive(Default)]
pub struct TrainingView;

impl View for TrainingView {
    fn ui(&mut self, ui: &mut egui::Ui, cx: &ViewContext) {
        match cx.runs.selected() {
            Some(run) => curves_ui(ui, run, cx),
            None => {
                ui.label("Start a run or open a run folder to see its curves.");
            }
        }
    }
}

fn curves_ui(ui: &mut egui::Ui, run: &RunView, cx: &ViewContext) {
    let exporter = cx.exporter;
    let height = (ui.available_height() / 3.0 - 30.0).max(80.0);
    for which in [Curve::Loss, Curve::Accuracy, Curve::LearningRate] {
        ui.horizontal(|ui| {
            ui.strong(which.label());
            exporter.buttons(ui, which.label().replace(' ', "-").as_str(), || {
                figure(run, which)
            });
        });
        let points: PlotPoints = curve(run, which).into_iter().map(|(x, y)| [x, y]).collect();
        Plot::new(which.label())
            .height(height)
            .legend(Legend::default())
            .show(ui, |plot| plot.line(Line::new(run.name.clone(), points)));
    }
}
