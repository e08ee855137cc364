//! Loss, test accuracy and learning rate of the selected run, updated live, with the curves of
//! every run ticked in the run list beside it (one legend): each plot drawn from the figure of
//! a [`TrainingReport`] that its export saves.

use eframe::egui;

use super::super::plot::{PlotOptions, show_figure};
use super::super::runs::RunView;
use super::{View, ViewContext, empty_plot};
use crate::figures::{PALETTE_SIZE, Plot};
use crate::report::training::{TrainingReport, TrainingRun, setup};
use crate::train::figures::{Curve, RunCurves};

/// The report of `runs`, each under its legend name and in its own colour ([`shown_colours`]),
/// so that ticking or selecting another run recolours none: what the plots draw and export.
fn report<'a>(runs: &[&'a RunView], names: &'a [String]) -> TrainingReport<'a> {
    let colours = shown_colours(runs);
    let runs = runs
        .iter()
        .zip(names)
        .zip(colours)
        .map(|((run, name), colour)| TrainingRun {
            curves: RunCurves {
                name,
                steps: &run.steps,
                evals: &run.evals,
                colour: Some(colour),
            },
            setup: setup(&run.preset),
        })
        .collect();
    TrainingReport { runs }
}

/// The colour of each shown run: its own ([`RunView::colour`]), unless a run before it (the
/// selected one first) already shows in it, as two of a list longer than the palette can; then
/// the first colour no shown run holds.
fn shown_colours(runs: &[&RunView]) -> Vec<usize> {
    let mut taken: Vec<usize> = Vec::with_capacity(runs.len());
    for (i, run) in runs.iter().enumerate() {
        let held = |c: usize| taken.contains(&c) || runs[i + 1..].iter().any(|r| r.colour == c);
        let colour = match taken.contains(&run.colour) {
            false => run.colour,
            true => (0..PALETTE_SIZE).find(|&c| !held(c)).unwrap_or(run.colour),
        };
        taken.push(colour);
    }
    taken
}

/// Legend names: a run's name, with its id in the list where two shown runs share it.
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
    let report = report(runs, &names);
    let height = (ui.available_height() / 3.0 - 30.0).max(80.0);
    if runs.len() == 1 {
        ui.label(
            egui::RichText::new("tick runs in the run list to compare their curves here")
                .small()
                .weak(),
        );
    }
    for which in Curve::ALL {
        let figure = report.figure(which);
        let name = which.label().replace(' ', "-");
        exporter.titled(ui, which.label(), &name, || figure.clone());
        let Plot::Lines(lines) = &figure.plot else {
            continue;
        };
        if which == Curve::Accuracy && lines.series.iter().all(|s| s.points.is_empty()) {
            // An empty grid reads as broken; say when the first point comes instead.
            empty_plot(ui, height, first_eval_note(runs[0]));
            continue;
        }
        show_figure(ui, &figure, &plot_options(which, height));
    }
}

/// How `which` is drawn: accuracy on its whole range, 0 to 1, where early evaluations near
/// chance (0.016–0.026 on MQAR) would otherwise fill the plot and read as progress.
fn plot_options(which: Curve, height: f32) -> PlotOptions<'static> {
    PlotOptions {
        id: Some(which.label()),
        height,
        y_range: (which == Curve::Accuracy).then_some(0.0..=1.0),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::jobs::Jobs;
    use crate::app::runs::RunStore;
    use crate::figures::{palette_colour, series_colours};

    /// The colours the training plots draw the shown runs in.
    fn colours(store: &RunStore) -> Vec<[u8; 3]> {
        let shown = store.shown();
        let names = legend_names(&shown);
        let figure = report(&shown, &names).figure(Curve::Loss);
        let Plot::Lines(lines) = figure.plot else {
            panic!("the loss is a line plot");
        };
        series_colours(&lines)
    }

    fn store_of(runs: usize) -> RunStore {
        let mut store = RunStore::new(Jobs::default());
        for i in 0..runs {
            store.open(std::path::PathBuf::from(format!("/nonexistent/{i}")));
        }
        store
    }

    /// A run keeps its colour when another is selected, ticked or removed.
    #[test]
    fn a_runs_curves_keep_their_colour_whatever_else_is_shown() {
        let mut store = store_of(3);
        store.selected = Some(2);
        assert_eq!(colours(&store), [palette_colour(2)]);
        store.runs[0].compare = true;
        let [c, a] = [2, 0].map(palette_colour);
        assert_eq!(colours(&store), [c, a], "c keeps its colour, a takes its own");
        store.selected = Some(0);
        store.runs[2].compare = true;
        assert_eq!(colours(&store), [a, c]);
        store.remove(1);
        assert_eq!(colours(&store), [a, c], "removing b recolours no other run");
    }

    /// Past the palette's size two runs of the list share a colour; shown together, the second
    /// takes a free one.
    #[test]
    fn two_shown_runs_never_share_a_colour() {
        let mut store = store_of(PALETTE_SIZE + 1);
        assert_eq!(store.runs[PALETTE_SIZE].colour, store.runs[0].colour);
        store.selected = Some(0);
        store.runs[PALETTE_SIZE].compare = true;
        assert_eq!(colours(&store), [0, 1].map(palette_colour));
        // A removed run's colour goes to the next run that joins.
        store.remove(3);
        store.open("/nonexistent/new".into());
        assert_eq!(store.runs.last().unwrap().colour, 3);
    }

    #[test]
    fn accuracy_is_drawn_on_its_whole_range_and_the_other_curves_on_theirs() {
        assert_eq!(
            plot_options(Curve::Accuracy, 100.0).y_range,
            Some(0.0..=1.0)
        );
        assert_eq!(plot_options(Curve::Loss, 100.0).y_range, None);
        assert_eq!(plot_options(Curve::LearningRate, 100.0).y_range, None);
    }
}
