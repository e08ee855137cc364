//! The desktop workbench (eframe/egui): configure an experiment, train it, watch it learn.
//!
//! Only this module imports egui, eframe, egui_plot and rfd. The shape follows rerun's viewer:
//! menus, shortcuts, views and background work push [`Command`]s; once per frame, before
//! anything is drawn, [`AttnlabApp::logic`] drains them, the run store's channels and every
//! view's finished jobs ([`View::logic`]), whichever view is shown; then the panels are drawn.
//! Training runs on the worker threads of [`crate::train::spawn`], everything else slow as named
//! jobs of one service ([`Jobs`]). The editor's preset, the run list and the open tab survive
//! a restart (eframe persistence).
//!
//! The shell is split as rerun's viewer is: the window's state and its construction here,
//! `logic.rs` (between frames), `execute.rs` (what each command does), `ui.rs` (the panels);
//! `shell.rs` hosts it in eframe.

mod command;
mod editor;
mod execute;
mod export;
mod jobs;
mod keys;
mod logic;
mod plot;
mod prompt;
mod runs;
mod shell;
mod status;
mod ui;
mod views;

use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;

use serde::{Deserialize, Serialize};

pub use command::{Command, Commands};
pub use editor::Editor;
pub use export::Exporter;
pub use jobs::{Job, Jobs};
pub use prompt::PathRequest;
pub use runs::{RunState, RunStore, RunView};
pub use shell::run_native;
pub use status::StatusLine;
pub use ui::SMALL_TEXT;
pub use views::{Tab, View, ViewContext, Views};

use crate::Preset;
use crate::experiments::{Analysis, shipped};

/// What survives a restart.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Persisted {
    pub preset_toml: Option<String>,
    pub preset_path: Option<PathBuf>,
    pub run_dirs: Vec<PathBuf>,
    pub recent: Vec<PathBuf>,
    /// Model folders the Pretrained view opened, newest first.
    pub model_dirs: Vec<PathBuf>,
    pub tab: Tab,
    pub runs_root: Option<PathBuf>,
}

/// The whole window's state.
pub struct AttnlabApp {
    pub editor: Editor,
    pub runs: RunStore,
    pub tab: Tab,
    pub exporter: Exporter,
    /// Where new runs are written.
    pub runs_root: PathBuf,
    pub recent: Vec<PathBuf>,
    /// The last message for the status bar (saved, exported, failed, …).
    pub status: StatusLine,
    pub views: Views,
    pub jobs: Jobs,
    pub commands: Commands,
    queue: Receiver<Command>,
    /// The native file dialog in flight (one at a time); its answer arrives as a command.
    dialog: Option<Job<()>>,
    /// The window asking for a path where no file dialog opens.
    prompt: Option<prompt::PathPrompt>,
    /// A preset waiting for "discard unsaved changes?" to be answered.
    confirm_replace: Option<(Preset, Option<PathBuf>)>,
    /// An experiment's analysis, started when its runs have ended.
    awaiting: Option<Awaiting>,
    /// Whether the keyboard shortcuts overlay is open.
    pub show_shortcuts: bool,
    /// The run being renamed in the run list: its id, the name typed so far, and whether its
    /// field has had the focus (given once, so other fields can still be typed into).
    renaming: Option<(u64, String, bool)>,
    /// Text for the clipboard, handed to egui in the next `logic()`.
    clipboard: Option<String>,
    /// For the screenshot demo: the view the last [`Command::PrepareDemoTab`] found ready.
    pub demo_ready: Option<Tab>,
}

/// The analysis an experiment started from the welcome page runs once its runs end.
struct Awaiting {
    analysis: Analysis,
    /// Ids of the experiment's runs in the run list.
    runs: Vec<u64>,
}

impl AttnlabApp {
    /// A window restored from `persisted` (the defaults on first start).
    pub fn new(persisted: Persisted) -> Self {
        let preset = persisted
            .preset_toml
            .as_deref()
            .and_then(|text| Preset::parse(text, &[], Path::new("(last session)")).ok())
            .unwrap_or_else(default_preset);
        let jobs = Jobs::default();
        let (commands, queue) = Commands::new(jobs.clone());
        let mut app = Self {
            editor: Editor::new(preset, persisted.preset_path),
            runs: RunStore::new(jobs.clone()),
            tab: persisted.tab,
            exporter: Exporter::new(jobs.clone(), commands.clone()),
            runs_root: persisted.runs_root.unwrap_or_else(|| PathBuf::from("runs")),
            recent: persisted.recent,
            status: StatusLine::default(),
            views: Views::default(),
            jobs,
            commands,
            queue,
            dialog: None,
            prompt: None,
            confirm_replace: None,
            awaiting: None,
            show_shortcuts: false,
            renaming: None,
            clipboard: None,
            demo_ready: None,
        };
        app.views.pretrained.recent = persisted.model_dirs;
        for dir in persisted.run_dirs {
            if dir.join("preset.toml").is_file() {
                app.runs.open(dir);
            }
        }
        app
    }

    /// What to save for the next start.
    pub fn persisted(&self) -> Persisted {
        Persisted {
            preset_toml: self.editor.preset.to_toml().ok(),
            preset_path: self.editor.path.clone(),
            run_dirs: self.runs.dirs(),
            recent: self.recent.clone(),
            model_dirs: self.views.pretrained.recent.clone(),
            tab: self.tab,
            runs_root: Some(self.runs_root.clone()),
        }
    }
}

/// The view that shows an analysis.
fn tab_of(analysis: Analysis) -> Tab {
    match analysis {
        Analysis::Encodings => Tab::Encodings,
        Analysis::Extrapolation => Tab::Extrapolation,
        Analysis::Iou => Tab::Iou,
        Analysis::Spectra => Tab::Spectra,
        Analysis::Sweep(_) => Tab::Sweep,
    }
}

/// The shipped preset a new window starts with: the softmax MQAR experiment.
const DEFAULT_PRESET: &str = "mqar_softmax";

/// The preset of a new window and of Preset > New.
pub(crate) fn default_preset() -> Preset {
    shipped(DEFAULT_PRESET)
        .and_then(|s| s.preset(&[]))
        .unwrap_or_default()
}
