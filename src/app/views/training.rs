//! Loss, test accuracy and learning rate of the selected run, updated live.

use eframe::egui;
use egui_plot::{Legend, Line, PlotPoints};

use super::super::runs::RunView;
use super::{View, ViewContext, empty_plot, titled_plot};
use crate::figures::Figure;
use crate::train::figures::{Curve, RunCurves, STEP_AXIS};

/// A run's metrics as the curve builders read them.
fn curves_of(run: &RunView) -> RunCurves<'_> {
    RunCurves {
        name: &run.name,
        steps: &run.steps,
        evals: &run.evals,
    }
}

fn figure(run: &RunView, which: Curve) -> Figure {
    which.figure(
        format!("{}: {}", run.name, which.label()),
        format!(
            "{} / {}, {} steps",
            run.preset.attention.name(),
            run.preset.encoding.name(),
            run.steps.last().map_or(0, |s| s.step)
        ),
        &[curves_of(run)],
    )
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
    for which in Curve::ALL {
        ui.horizontal(|ui| {
            ui.strong(which.label());
            exporter.buttons(ui, which.label().replace(' ', "-").as_str(), || {
                figure(run, which)
            });
        });
        let points = which.points(&curves_of(run));
        if points.is_empty() && which == Curve::Accuracy {
            // An empty grid reads as broken; say when the first point comes instead.
            empty_plot(ui, height, first_eval_note(run));
            continue;
        }
        let points: PlotPoints = points.into_iter().map(|(x, y)| [x, y]).collect();
        titled_plot(which.label(), [STEP_AXIS, which.y_axis()])
            .height(height)
            .legend(Legend::default())
            .show(ui, |plot| plot.line(Line::new(run.name.clone(), points)));
    }
}

/// When a run's first test accuracy comes: the step of its first evaluation and, while it
/// trains, about how long until then at its current pace.
fn first_eval_note(run: &RunView) -> String {
    let train = &run.preset.train;
    let at = train.eval_interval(run.preset.task.train_examples());
    let when = if train.eval_every == 0 {
        format!("after epoch 1 (step {at})")
    } else {
        format!("at step {at}")
    };
    if !run.is_running() {
        return format!("No test accuracy: the run ended before its first evaluation, {when}.");
    }
    let mut note = format!("No test accuracy yet: the first evaluation is {when}");
    if let Some(last) = run.steps.last()
        && last.step > 0
    {
        let left = last.elapsed_secs / last.step as f64 * at.saturating_sub(last.step) as f64;
        note.push_str(&format!(", in about {left:.0} s"));
    }
    note.push('.');
    note
}
