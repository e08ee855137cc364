//! The desktop workbench (eframe/egui): configure an experiment, train it, watch it learn.
//!
//! Only this module imports egui, eframe, egui_plot and rfd. The shape follows rerun's viewer:
//! menus, shortcuts, views and background work push [`Command`]s; once per frame, before
//! anything is drawn, [`AttnlabApp::logic`] drains them, the run store's channels and every
//! view's finished jobs ([`View::logic`]), whichever view is shown; then the panels are drawn.
//! Training runs on the worker threads of [`crate::train::spawn`], everything else slow as named
//! jobs of one service ([`Jobs`]). The editor's preset, the run list and the open tab survive
//! a restart (eframe persistence).

mod command;
mod editor;
mod export;
mod jobs;
mod keys;
mod runs;
mod shell;
mod views;

use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;

use eframe::egui;
use serde::{Deserialize, Serialize};

pub use command::{Command, Commands};
pub use editor::Editor;
pub use export::Exporter;
pub use jobs::{Job, Jobs};
pub use runs::{RunState, RunStore, RunView};
pub use shell::run_native;
pub use views::{Tab, View, ViewContext, Views};

use crate::Preset;
use crate::experiments::{Analysis, EXPERIMENTS, Experiment, shipped};

/// What survives a restart.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Persisted {
    pub preset_toml: Option<String>,
    pub preset_path: Option<PathBuf>,
    pub run_dirs: Vec<PathBuf>,
    pub recent: Vec<PathBuf>,
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
    pub status: String,
    pub views: Views,
    pub jobs: Jobs,
    pub commands: Commands,
    queue: Receiver<Command>,
    /// The native file dialog in flight (one at a time); its answer arrives as a command.
    dialog: Option<Job<()>>,
    /// A preset waiting for "discard unsaved changes?" to be answered.
    confirm_replace: Option<(Preset, Option<PathBuf>)>,
    /// An experiment's analysis, started when its runs have ended.
    awaiting: Option<Awaiting>,
    /// Whether the keyboard shortcuts overlay is open.
    pub show_shortcuts: bool,
    /// Text for the clipboard, handed to egui in the next `logic()`.
    clipboard: Option<String>,
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
            status: String::new(),
            views: Views::default(),
            jobs,
            commands,
            queue,
            dialog: None,
            confirm_replace: None,
            awaiting: None,
            show_shortcuts: false,
            clipboard: None,
        };
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
            tab: self.tab,
            runs_root: Some(self.runs_root.clone()),
        }
    }

    /// Starts the editor's preset, unless it is invalid.
    pub fn start(&mut self) {
        self.editor.refresh();
        if let Some(problem) = self.editor.problem() {
            self.status = problem.to_string();
            return;
        }
        self.runs
            .start(self.editor.preset.clone(), self.runs_root.clone());
        self.status = format!("started {}", self.editor.preset.name);
    }

    /// Starts an experiment of the welcome page: its first preset into the editor (asking
    /// about unsaved changes), every preset training, its view shown, and its analysis
    /// awaited when it needs finished runs.
    fn run_experiment(&mut self, experiment: &Experiment) {
        let presets = match experiment.presets() {
            Ok(presets) => presets,
            Err(e) => {
                self.status = e.to_string();
                return;
            }
        };
        // The editor shows the experiment's first preset, unless it holds unsaved changes: the
        // experiment trains its own presets either way, so nothing needs asking.
        self.editor.refresh();
        let keep_edits = self.editor.is_dirty();
        if let Some(first) = presets.first().filter(|_| !keep_edits) {
            self.editor = Editor::new(first.clone(), None);
        }
        let runs = presets
            .into_iter()
            .map(|preset| self.runs.start(preset, self.runs_root.clone()))
            .collect();
        self.tab = tab_of(experiment.analysis);
        self.views.view_mut(self.tab).take_experiment(experiment);
        self.awaiting = experiment
            .analysis
            .needs_finished_runs()
            .then_some(Awaiting {
                analysis: experiment.analysis,
                runs,
            });
        self.status = match keep_edits {
            true => format!(
                "started {} (the editor keeps your unsaved preset)",
                experiment.title
            ),
            false => format!("started {}", experiment.title),
        };
    }

    /// Starts the awaited analysis once all of its runs have ended, on those that have a run
    /// folder and did not fail; forgets it if one of them left the list.
    fn start_awaited_analysis(&mut self) {
        let Some(awaiting) = &self.awaiting else {
            return;
        };
        let runs: Option<Vec<&RunView>> = awaiting
            .runs
            .iter()
            .map(|id| self.runs.runs.iter().find(|r| r.id == *id))
            .collect();
        let Some(runs) = runs else {
            self.awaiting = None;
            return;
        };
        if runs.iter().any(|r| r.is_running()) {
            return;
        }
        let list: Vec<(String, PathBuf)> = runs
            .iter()
            .filter(|r| r.status != RunState::Trainer(crate::train::RunStatus::Failed))
            .filter_map(|r| Some((r.name.clone(), r.dir.clone()?)))
            .collect();
        let view = self.views.view_mut(tab_of(awaiting.analysis));
        if view.is_busy() {
            // Starting now would drop, so cancel, the view's own computation: wait for it.
            return;
        }
        self.awaiting = None;
        if list.is_empty() {
            self.status = "the experiment's runs failed: nothing to analyse".into();
            return;
        }
        view.analyse(&self.jobs, list);
    }

    /// For the screenshot demo: gets `tab` ready to be captured (the analysis views need the
    /// run stopped and their analysis computed); true once it is.
    fn prepare_demo_tab(&mut self, tab: Tab) -> bool {
        if self.views.view_mut(tab).prepare_demo() {
            return true;
        }
        let Some(run) = self.runs.selected() else {
            return false;
        };
        if run.is_running() {
            self.stop();
            return false;
        }
        // The views pick the results up when they are drawn, so show the tab while computing.
        self.tab = tab;
        let Some(dir) = run.dir.clone() else {
            return false;
        };
        let list = vec![(run.name.clone(), dir)];
        let view = self.views.view_mut(tab);
        if !view.is_busy() {
            view.start_demo(&self.jobs, list);
        }
        false
    }

    /// Stops the selected run after its current step.
    pub fn stop(&mut self) {
        if let Some(run) = self.runs.selected() {
            run.stop();
            self.status = format!("stopping {}", run.name);
        }
    }

    /// Loads a preset file into the editor (asking first if there are unsaved changes).
    pub fn open_preset(&mut self, path: &Path) {
        match Preset::load(path, &[]) {
            Ok(preset) => self.replace_preset(preset, Some(path.to_path_buf())),
            Err(e) => self.status = e.to_string(),
        }
    }

    fn replace_preset(&mut self, preset: Preset, path: Option<PathBuf>) {
        self.editor.refresh();
        if self.editor.is_dirty() {
            self.confirm_replace = Some((preset, path));
            return;
        }
        if let Some(path) = &path {
            self.remember(path.clone());
        }
        self.editor = Editor::new(preset, path);
    }

    fn remember(&mut self, path: PathBuf) {
        self.recent.retain(|p| p != &path);
        self.recent.insert(0, path);
        self.recent.truncate(8);
    }

    /// Writes the editor's preset to `path` (atomically).
    pub fn save_preset(&mut self, path: &Path) {
        match self.editor.preset.save(path) {
            Ok(()) => {
                self.editor.mark_saved(path.to_path_buf());
                self.remember(path.to_path_buf());
                self.status = format!("saved {}", path.display());
            }
            Err(e) => self.status = e.to_string(),
        }
    }

    /// Opens a native file dialog as a job; `answer` turns the chosen path into the command
    /// to run (nothing when the dialog is cancelled).
    fn ask(
        &mut self,
        pick: impl FnOnce() -> Option<PathBuf> + Send + 'static,
        answer: fn(PathBuf) -> Command,
    ) {
        if self.dialog.is_some() {
            self.status = "a file dialog is already open".into();
            return;
        }
        let commands = self.commands.clone();
        self.dialog = Some(self.jobs.run("file dialog", move || {
            if let Some(path) = pick() {
                commands.push(answer(path));
            }
        }));
    }

    fn ask_open_preset(&mut self) {
        self.ask(
            || {
                rfd::FileDialog::new()
                    .add_filter("attnlab preset", &["toml"])
                    .set_directory("presets")
                    .pick_file()
            },
            Command::OpenPreset,
        );
    }

    fn ask_save_preset(&mut self) {
        let name = format!("{}.toml", self.editor.preset.slug());
        self.ask(
            move || {
                rfd::FileDialog::new()
                    .add_filter("attnlab preset", &["toml"])
                    .set_file_name(name)
                    .save_file()
            },
            Command::SavePreset,
        );
    }

    fn ask_open_run(&mut self) {
        let root = self.runs_root.clone();
        self.ask(
            move || rfd::FileDialog::new().set_directory(root).pick_folder(),
            Command::OpenRun,
        );
    }

    /// Does what `command` asks.
    pub fn execute(&mut self, command: Command) {
        match command {
            Command::Start => self.start(),
            Command::Stop => self.stop(),
            Command::NewPreset => self.replace_preset(default_preset(), None),
            Command::AskOpenPreset => self.ask_open_preset(),
            Command::OpenPreset(path) => self.open_preset(&path),
            Command::OpenShipped(name) => match shipped(name).and_then(|s| s.preset(&[])) {
                Ok(preset) => self.replace_preset(preset, None),
                Err(e) => self.status = e.to_string(),
            },
            Command::RunExperiment(i) => match EXPERIMENTS.get(i) {
                Some(experiment) => self.run_experiment(experiment),
                None => self.status = format!("no experiment {i}"),
            },
            Command::Save => match self.editor.path.clone() {
                Some(path) => self.save_preset(&path),
                None => self.ask_save_preset(),
            },
            Command::AskSavePreset => self.ask_save_preset(),
            Command::SavePreset(path) => self.save_preset(&path),
            Command::AskOpenRun => self.ask_open_run(),
            Command::OpenRun(dir) => self.runs.open(dir),
            Command::Show(tab) => self.tab = tab,
            Command::ToggleShortcuts => self.show_shortcuts = !self.show_shortcuts,
            Command::CopyCliCommand => match self.cli_command() {
                Ok(line) => {
                    self.status = format!("copied: {line}");
                    self.clipboard = Some(line);
                }
                Err(e) => self.status = e.to_string(),
            },
            Command::Status(message) => self.status = message,
        }
    }

    /// Everything that happens between frames, before anything is drawn: shortcuts, queued
    /// commands, worker events, and every view's finished jobs (whichever view is shown).
    pub fn logic(&mut self, ctx: &egui::Context) {
        self.jobs.attach(ctx);
        self.editor.refresh();
        self.shortcuts(ctx);
        let commands: Vec<Command> = self.queue.try_iter().collect();
        for command in commands {
            self.execute(command);
        }
        if let Some(text) = self.clipboard.take() {
            ctx.copy_text(text);
        }
        if let Some(Err(e)) = jobs::take_finished(&mut self.dialog) {
            self.status = e.to_string();
        }
        self.runs.drain();
        self.start_awaited_analysis();
        let (views, cx) = self.split(ctx);
        views.logic(&cx);
    }

    /// The views, and the context they read (borrowed from the rest of the app).
    fn split<'a>(&'a mut self, ctx: &'a egui::Context) -> (&'a mut Views, ViewContext<'a>) {
        let cx = ViewContext {
            ctx,
            runs: &self.runs,
            editor: &self.editor,
            exporter: &self.exporter,
            runs_root: &self.runs_root,
            commands: &self.commands,
            jobs: &self.jobs,
        };
        (&mut self.views, cx)
    }

    fn shortcuts(&mut self, ctx: &egui::Context) {
        for command in keys::pressed(ctx) {
            self.commands.push(command);
        }
    }

    /// The editor's preset as an `attnlab train` line, over the file it is closest to.
    fn cli_command(&self) -> crate::Result<String> {
        let (file, base) = self.cli_base()?;
        crate::preset::train_command(&self.editor.preset, &file, &base)
    }

    /// What the command line starts from: the preset's own file while it still loads, else
    /// the shipped preset of the same name (a shipped preset opened from the menu has no
    /// file of its own), else the default one.
    fn cli_base(&self) -> crate::Result<(String, Preset)> {
        if let Some(path) = &self.editor.path
            && let Ok(base) = Preset::load(path, &[])
        {
            return Ok((path.display().to_string(), base));
        }
        let same_name = self.editor.preset.name.replace('-', "_");
        let base = shipped(&same_name).or_else(|_| shipped(DEFAULT_PRESET))?;
        Ok((base.file.to_string(), base.preset(&[])?))
    }

    /// The whole window (the same function runs under eframe and under egui_kittest).
    pub fn show(&mut self, ui: &mut egui::Ui) {
        self.logic(&ui.ctx().clone());
        egui::Panel::top("menu").show(ui, |ui| self.top_bar(ui));
        egui::Panel::bottom("status").show(ui, |ui| {
            ui.horizontal(|ui| {
                ui.label(&self.status);
                for (name, progress) in self.jobs.live() {
                    ui.separator();
                    ui.weak(format!("{name} {:.0}%", 100.0 * progress));
                }
            });
        });
        egui::Panel::left("editor")
            .resizable(true)
            .default_size(320.0)
            .show(ui, |ui| {
                egui::ScrollArea::vertical().show(ui, |ui| {
                    self.editor.ui(ui);
                    ui.separator();
                    self.runs_ui(ui);
                });
            });
        egui::CentralPanel::default().show(ui, |ui| {
            ui.horizontal(|ui| {
                for &tab in Tab::ALL {
                    ui.selectable_value(&mut self.tab, tab, tab.label());
                }
            });
            ui.separator();
            let ctx = ui.ctx().clone();
            let tab = self.tab;
            let (views, cx) = self.split(&ctx);
            views.view_mut(tab).ui(ui, &cx);
        });
        self.confirm_ui(ui.ctx());
        keys::overlay_ui(ui.ctx(), &mut self.show_shortcuts);
    }

    fn top_bar(&mut self, ui: &mut egui::Ui) {
        let commands = self.commands.clone();
        let push = |response: egui::Response, command: Command| {
            if response.clicked() {
                commands.push(command);
            }
        };
        ui.horizontal(|ui| {
            ui.menu_button("Preset", |ui| {
                push(ui.button("New"), Command::NewPreset);
                push(ui.button("Open... (Ctrl+O)"), Command::AskOpenPreset);
                push(ui.button("Save (Ctrl+S)"), Command::Save);
                push(ui.button("Save as..."), Command::AskSavePreset);
                let copy = ui
                    .button("Copy as CLI command")
                    .on_hover_text("an attnlab train line with a --set per change (Ctrl+Shift+C)");
                push(copy, Command::CopyCliCommand);
                ui.separator();
                ui.label("Shipped");
                for shipped in crate::experiments::PRESETS {
                    let button = ui.button(shipped.name).on_hover_text(shipped.file);
                    push(button, Command::OpenShipped(shipped.name));
                }
                if !self.recent.is_empty() {
                    ui.separator();
                    ui.label("Recent");
                    for path in &self.recent {
                        let button = ui.button(path.display().to_string());
                        push(button, Command::OpenPreset(path.clone()));
                    }
                }
            });
            ui.menu_button("Help", |ui| {
                push(ui.button("Welcome page"), Command::Show(Tab::Welcome));
                push(
                    ui.button("Keyboard shortcuts (F1)"),
                    Command::ToggleShortcuts,
                );
            });
            push(ui.button("Open run..."), Command::AskOpenRun);
            ui.separator();
            let problem = self.editor.problem().map(str::to_string);
            let start = ui
                .add_enabled(problem.is_none(), egui::Button::new("Start"))
                .on_hover_text("train the preset (Ctrl+Enter)")
                .on_disabled_hover_text(problem.unwrap_or_default());
            push(start, Command::Start);
            if let Some(memory) = self.editor.memory() {
                let total = crate::preset::bytes(memory.total());
                ui.weak(format!("≈ {total}"))
                    .on_hover_text(format!("memory a run of this preset needs: {memory}"));
            }
            let running = self.runs.selected().is_some_and(RunView::is_running);
            let stop = ui
                .add_enabled(running, egui::Button::new("Stop"))
                .on_hover_text("Ctrl+.");
            push(stop, Command::Stop);
            if let Some(run) = self.runs.selected() {
                progress_ui(ui, run);
            }
            let title = match (&self.editor.path, self.editor.is_dirty()) {
                (Some(path), dirty) => {
                    format!("{}{}", path.display(), if dirty { " *" } else { "" })
                }
                (None, _) => "unsaved preset".into(),
            };
            ui.label(egui::RichText::new(title).weak());
        });
    }

    fn runs_ui(&mut self, ui: &mut egui::Ui) {
        ui.strong("Runs");
        if self.runs.runs.is_empty() {
            ui.label("none yet: press Start, or open a run folder");
        }
        let mut clicked = None;
        let mut removed = None;
        let selected = self.runs.selected;
        for (i, run) in self.runs.runs.iter_mut().enumerate() {
            ui.horizontal(|ui| {
                ui.add(egui::Checkbox::without_text(&mut run.compare))
                    .on_hover_text("compare: draw this run's curves beside the selected run's");
                let remove = ui
                    .add_enabled(!run.is_running(), egui::Button::new("x").small())
                    .on_hover_text("remove from the list (the run folder stays)");
                if remove.clicked() {
                    removed = Some(i);
                }
                // A failure's reason can be long: the entry is cut at the panel's edge and
                // the whole of it, with the folder, is on hover.
                let text = format!("{} ({})", run.name, run.status_text());
                let button = egui::Button::selectable(selected == Some(i), text.as_str());
                let response = ui.add(button.truncate());
                let hover = match &run.dir {
                    Some(dir) => format!("{text}\n{}", dir.display()),
                    None => text,
                };
                if response.on_hover_text(hover).clicked() {
                    clicked = Some(i);
                }
            });
        }
        if let Some(i) = clicked {
            self.runs.selected = Some(i);
        }
        if let Some(i) = removed {
            self.runs.remove(i);
        }
        if let Some(run) = self.runs.selected() {
            if let Some(notice) = &run.notice {
                ui.colored_label(ui.visuals().warn_fg_color, notice);
            }
            if let Some(error) = &run.error {
                ui.colored_label(ui.visuals().error_fg_color, error);
            }
        }
    }

    fn confirm_ui(&mut self, ctx: &egui::Context) {
        let Some((_, path)) = &self.confirm_replace else {
            return;
        };
        let target = path
            .as_ref()
            .map_or("a new preset".into(), |p| p.display().to_string());
        let mut answer = None;
        egui::Window::new("Unsaved changes")
            .collapsible(false)
            .resizable(false)
            .show(ctx, |ui| {
                ui.label(format!(
                    "The preset has unsaved changes. Discard them and open {target}?"
                ));
                ui.horizontal(|ui| {
                    if ui.button("Discard").clicked() {
                        answer = Some(true);
                    }
                    if ui.button("Cancel").clicked() {
                        answer = Some(false);
                    }
                });
            });
        if let Some(discard) = answer
            && let Some((preset, path)) = self.confirm_replace.take()
            && discard
        {
            if let Some(path) = &path {
                self.remember(path.clone());
            }
            self.editor = Editor::new(preset, path);
        }
    }
}

/// The state, steps, ETA and throughput of a run: a live run's percentage and ETA, an ended
/// one's state and where it ended (a run that reached its target ends early, so "12%" alone
/// would read as unfinished).
fn progress_ui(ui: &mut egui::Ui, run: &RunView) {
    let progress = run.progress();
    let mut text = run.status_text();
    if let Some(last) = run.steps.last() {
        if run.is_running() {
            text.push_str(&format!(" {:.0}%", 100.0 * progress));
            if progress > 0.0 {
                let eta = last.elapsed_secs * (1.0 / f64::from(progress) - 1.0);
                text.push_str(&format!(", eta {eta:.0} s"));
            }
        } else {
            text.push_str(&format!(" at step {} of {}", last.step, run.total_steps));
        }
        text.push_str(&format!(", {:.0} tokens/s", last.tokens_per_s));
    }
    ui.add(
        egui::ProgressBar::new(progress)
            .desired_width(280.0)
            .text(text),
    );
}

/// The view that shows an analysis.
fn tab_of(analysis: Analysis) -> Tab {
    match analysis {
        Analysis::Encodings => Tab::Encodings,
        Analysis::Extrapolation => Tab::Extrapolation,
        Analysis::Iou => Tab::Iou,
        Analysis::Spectra => Tab::Spectra,
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
