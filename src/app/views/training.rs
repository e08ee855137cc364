//! Loss, test accuracy and learning rate of the selected run, updated live, with the curves of
//! every run ticked in the run list beside it (one legend).

use eframe::egui;
use egui_plot::{Legend, Line, PlotPoints};

use super::super::runs::RunView;
use super::{View, ViewContext, empty_plot, titled_plot};
use crate::figures::Figure;
use crate::train::figures::{Curve, RunCurves, STEP_AXIS};

/// The runs' metrics as the curve builders read them, each under its legend name.
fn curves_of<'a>(runs: &[&'a RunView], names: &'a [String]) -> Vec<RunCurves<'a>> {
    runs.iter()
        .zip(names)
        .map(|(run, name)| RunCurves {
            name,
            steps: &run.steps,
            evals: &run.evals,
        })
        .collect()
}

/// Legend names: a run's name, with its place in the list where two shown runs share it.
fn legend_names(runs: &[&RunView]) -> Vec<String> {
    runs.iter()
        .map(|run| {
            let twins = runs.iter().filter(|r| r.name == run.name).count();
            if twins > 1 {
                format!("{} (run {})", run.name, run.id)
            } else {
                run.name.clone()
            }
        })
        .collect()
}

fn figure(runs: &[&RunView], names: &[String], which: Curve) -> Figure {
    let title = match names {
        [one] => format!("{one}: {}", which.label()),
        many => format!("{}: {} runs", which.label(), many.len()),
    };
    let settings: Vec<String> = runs
        .iter()
        .zip(names)
        .map(|(run, name)| {
            format!(
                "{name}: {} / {}, {} steps",
                run.preset.attention.name(),
                run.preset.encoding.name(),
                run.steps.last().map_or(0, |s| s.step)
            )
        })
        .collect();
    which.figure(title, settings.join("; "), &curves_of(runs, names))
}

/// The selected run's curves, and those of the runs ticked to compare.
#[derive(Default)]
pub struct TrainingView;

impl View for TrainingView {
    fn ui(&mut self, ui: &mut egui::Ui, cx: &ViewContext) {
        let runs = cx.runs.shown();
        if runs.is_empty() {
            ui.label("Start a run or open a run folder to see its curves.");
            return;
        }
        curves_ui(ui, &runs, cx);
    }
}

fn curves_ui(ui: &mut egui::Ui, runs: &[&RunView], cx: &ViewContext) {
    let exporter = cx.exporter;
    let names = legend_names(runs);
    let curves = curves_of(runs, &names);
    let height = (ui.available_height() / 3.0 - 30.0).max(80.0);
    if runs.len() == 1 {
        ui.label(
            egui::RichText::new("tick runs in the run list to compare their curves here")
                .small()
                .weak(),
        );
    }
    for which in Curve::ALL {
        ui.horizontal(|ui| {
            ui.strong(which.label());
            exporter.buttons(ui, which.label().replace(' ', "-").as_str(), || {
                figure(runs, &names, which)
            });
        });
        let lines: Vec<(&str, Vec<(f64, f64)>)> =
            curves.iter().map(|c| (c.name, which.points(c))).collect();
        if which == Curve::Accuracy && lines.iter().all(|(_, points)| points.is_empty()) {
            // An empty grid reads as broken; say when the first point comes instead.
            empty_plot(ui, height, first_eval_note(runs[0]));
            continue;
        }
        titled_plot(which.label(), [STEP_AXIS, which.y_axis()])
            .height(height)
            .legend(Legend::default())
            .show(ui, |plot| {
                for (name, points) in lines {
                    let points: PlotPoints = points.into_iter().map(|(x, y)| [x, y]).collect();
                    plot.line(Line::new(name, points));
                }
            });
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
