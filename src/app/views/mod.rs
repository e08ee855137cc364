//! The views of the central panel, one file each, behind one trait ([`View`]) and one registry
//! ([`views!`] below). Every view reads the run store and the editor through [`ViewContext`],
//! never owns training state, changes the window only by pushing commands, runs its work as
//! jobs, and exports its figures through the shared exporter. The shell reaches a view only
//! through the trait, by its [`Tab`].
//!
//! Adding a view: a file here with a type implementing [`View`] (and `Default`), and one line
//! in the registry: its tab, its file (module and field of [`Views`]), its type and its title.

mod colour;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use eframe::egui;
use serde::{Deserialize, Serialize};

use super::command::Commands;
use super::editor::Editor;
use super::export::Exporter;
use super::jobs::Jobs;
use super::runs::{RunStore, RunView};
use crate::analysis::TrainedRun;
use crate::experiments::Experiment;

/// What a view may read of the window, and where it sends what it wants done.
pub struct ViewContext<'a> {
    pub ctx: &'a egui::Context,
    pub runs: &'a RunStore,
    pub editor: &'a Editor,
    pub exporter: &'a Exporter,
    /// Where new runs are written.
    pub runs_root: &'a Path,
    pub commands: &'a Commands,
    pub jobs: &'a Jobs,
}

/// Runs to analyse, each by its name in the run list and its run folder.
pub type RunList = Vec<(String, PathBuf)>;

/// One view of the central panel.
pub trait View {
    /// Every frame, whichever view is shown: take in what this view's jobs finished.
    fn logic(&mut self, _cx: &ViewContext) {}

    /// Draws the view.
    fn ui(&mut self, ui: &mut egui::Ui, cx: &ViewContext);

    /// Whether the view's own computation is running (starting another would cancel it).
    fn is_busy(&self) -> bool {
        false
    }

    /// Analyses these finished runs, for a view that computes over run folders (an experiment
    /// of the welcome page hands it its runs once they end).
    fn analyse(&mut self, _tasks: &Jobs, _runs: RunList) {}

    /// Takes what an experiment started from the welcome page sets for this view.
    fn take_experiment(&mut self, _experiment: &Experiment) {}

    /// For the screenshot demo: sets up what the view shows by itself (a file to load, a
    /// comparison to tick); whether it is ready to be captured without a run analysed.
    fn prepare_demo(&mut self) -> bool {
        true
    }

    /// For the screenshot demo: analyses `runs` at the size a screenshot needs.
    fn start_demo(&mut self, jobs: &Jobs, runs: RunList) {
        self.analyse(jobs, runs);
    }
}

/// The registry of views, one line each: tab, file (its module, and its field of [`Views`]),
/// type, title. The first is the view of a first start. Declares each view's module and
/// generates [`Tab`] (which view is shown; saved by its variant's name), [`Tab::ALL`] in this
/// order, [`Tab::label`], and [`Views`] with [`Views::view_mut`].
macro_rules! views {
    ($first:ident, $first_field:ident: $first_view:ident, $first_title:literal;
     $($tab:ident, $field:ident: $view:ident, $title:literal;)*) => {
        pub mod $first_field;
        $(pub mod $field;)*

        /// Which view the central panel shows.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
        pub enum Tab {
            #[default]
            $first,
            $($tab,)*
        }

        impl Tab {
            pub const ALL: &[Tab] = &[Tab::$first, $(Tab::$tab,)*];

            pub fn label(self) -> &'static str {
                match self {
                    Tab::$first => $first_title,
                    $(Tab::$tab => $title,)*
                }
            }
        }

        /// One view per tab.
        #[derive(Default)]
        pub struct Views {
            pub $first_field: $first_field::$first_view,
            $(pub $field: $field::$view,)*
        }

        impl Views {
            /// The view shown under `tab`.
            pub fn view_mut(&mut self, tab: Tab) -> &mut dyn View {
                match tab {
                    Tab::$first => &mut self.$first_field,
                    $(Tab::$tab => &mut self.$field,)*
                }
            }
        }
    };
}

views! {
    Welcome, welcome: WelcomeView, "Welcome";
    Training, training: TrainingView, "Training";
    Attention, attention: AttentionView, "Attention maps";
    Encodings, encodings: EncodingsView, "Encodings";
    Iou, iou: IouView, "IoU";
    Spectra, spectra: SpectraView, "Spectra";
    Sweep, sweep: SweepView, "Sweep";
    Extrapolation, extrapolation: ExtrapolationView, "Extrapolation";
    Pretrained, pretrained: PretrainedView, "Pretrained model";
}

impl Views {
    /// Every view's [`View::logic`].
    pub fn logic(&mut self, cx: &ViewContext) {
        for &tab in Tab::ALL {
            self.view_mut(tab).logic(cx);
        }
    }
}

/// What stands in for a plot with nothing to draw yet: a sentence saying why, in the plot's
/// place (an empty grid reads as a broken plot).
pub fn empty_plot(ui: &mut egui::Ui, height: f32, why: impl Into<egui::WidgetText>) {
    let size = egui::vec2(ui.available_width(), height);
    ui.add_sized(size, egui::Label::new(why).wrap());
}

/// An analysis of one run folder.
pub struct PerRun<T> {
    pub dir: PathBuf,
    pub name: String,
    pub value: T,
}

/// What [`analyse_runs`] made of a list of runs: each result, and the runs it left out with
/// why (another task's run, an unreadable folder): a run that does not apply costs its own
/// result only, not those already computed.
pub struct Analysed<T> {
    pub done: Vec<PerRun<T>>,
    pub left_out: Vec<String>,
}

/// One line naming the runs left out and why, `None` when none was: what a view shows beside
/// the results it kept.
pub fn left_out_line(left_out: &[String]) -> Option<String> {
    (!left_out.is_empty()).then(|| format!("left out: {}", left_out.join("; ")))
}

/// Runs `analyse` on each run folder of `runs` (name, folder) in turn, reloading its
/// checkpoint; progress is spread evenly over the runs. A run whose analysis fails is left
/// out with the error, the others go on; when none is left, the errors are the error.
/// `Ok(None)` when cancelled.
pub fn analyse_runs<T>(
    runs: &[(String, PathBuf)],
    progress: &mut dyn FnMut(f32),
    cancel: &AtomicBool,
    analyse: impl Fn(&TrainedRun, &mut dyn FnMut(f32), &AtomicBool) -> crate::Result<Option<T>>,
) -> crate::Result<Option<Analysed<T>>> {
    let (mut done, mut left_out) = (Vec::new(), Vec::new());
    for (i, (name, dir)) in runs.iter().enumerate() {
        let mut part = |p: f32| progress((i as f32 + p) / runs.len() as f32);
        let value = match TrainedRun::open(dir).and_then(|run| analyse(&run, &mut part, cancel)) {
            Ok(Some(value)) => value,
            Ok(None) => return Ok(None),
            Err(e) => {
                left_out.push(format!("{name} ({e})"));
                continue;
            }
        };
        done.push(PerRun {
            dir: dir.clone(),
            name: name.clone(),
            value,
        });
    }
    if done.is_empty() && !left_out.is_empty() {
        return Err(crate::Error::argument(
            "runs",
            left_out.join("; "),
            "could not be analysed",
        ));
    }
    Ok(Some(Analysed { done, left_out }))
}

/// What stands where an analysis (`what`: "IoU table", "spectra") of the selected run would be:
/// that it is being computed, why it cannot be (a language model has no ground truth), or to
/// press Compute. "Press Compute" had shown while the welcome page's analysis ran, and for
/// runs it could only fail on.
pub fn missing_analysis_text(selected: Option<&RunView>, computing: bool, what: &str) -> String {
    if computing {
        return format!("Computing the {what}…");
    }
    match selected.and_then(|r| r.preset.task.lacks_ground_truth()) {
        Some(why) => format!("No {what} for the selected run: {why}."),
        None => format!("No {what} yet for the selected run: press Compute."),
    }
}

/// "Compute" buttons for the selected run, for it and the runs ticked to compare (when there
/// are any), and for every run of the list; returns the runs (name, folder) of the one
/// clicked. Runs still training or without a folder are left out. A button none of whose runs
/// the analysis applies to (`refusal` says why, from the run's preset: an LM run in IoU) is
/// disabled and says why on hover; otherwise the runs it does not apply to go along, for the
/// analysis to leave out by name.
pub fn run_buttons(
    ui: &mut egui::Ui,
    runs: &RunStore,
    refusal: impl Fn(&crate::Preset) -> Option<String>,
) -> Option<Vec<(String, PathBuf)>> {
    let analysable = |list: Vec<&RunView>| -> (Vec<(String, PathBuf)>, Option<String>) {
        let finished: Vec<&RunView> = list
            .into_iter()
            .filter(|r| r.dir.is_some() && !r.is_running())
            .collect();
        let refused: Vec<String> = finished.iter().filter_map(|r| refusal(&r.preset)).collect();
        if !finished.is_empty() && refused.len() == finished.len() {
            return (Vec::new(), refused.into_iter().next());
        }
        let chosen = finished
            .into_iter()
            .filter_map(|r| Some((r.name.clone(), r.dir.clone()?)))
            .collect();
        (chosen, None)
    };
    let shown = runs.shown();
    let mut buttons = vec![(
        "Compute for the selected run",
        analysable(runs.selected().into_iter().collect()),
    )];
    if shown.len() > 1 {
        buttons.push((
            "Compute for the selected and ticked runs",
            analysable(shown.clone()),
        ));
    }
    buttons.push((
        "Compute for every run",
        analysable(runs.runs.iter().collect()),
    ));
    let mut clicked = None;
    for (label, (list, why)) in buttons {
        let why =
            why.unwrap_or_else(|| "needs a finished run: train one or open a run folder".into());
        if ui
            .add_enabled(!list.is_empty(), egui::Button::new(label))
            .on_disabled_hover_text(why)
            .clicked()
        {
            clicked = Some(list);
        }
    }
    clicked
}
